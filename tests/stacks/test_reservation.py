"""Reserved pools name their reservation in full and check it before apply (review C7, B10).

The precondition is proven with real terraform 1.11: the synthesized condition is planned on a
``terraform_data`` stand-in (the only resource that can plan here, no provider download), with
the data source's address swapped for a local holding what ``google_compute_reservation`` reads
(attribute names of provider v6.50.0, resource_compute_reservation.go). A missing reservation
reads as empty attributes, not as an error (see clusters.reservation), so that case is covered too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from clusters.reservation import PRECONDITION_SHAPE, ReservationSpec, derive_reservation
from stacks.interpolation import allowed

DATA = "data.google_compute_reservation.reservation_h100"


def h100(stack: dict) -> dict:
    return stack["resource"]["google_container_node_pool"]["pool_h100"]


@pytest.mark.parametrize(("written", "expected"), [
    ("h100-res", ReservationSpec("ml-train-prod", "h100-res", None, "us-central1-a")),
    ("projects/shared-res/reservations/h100-res", ReservationSpec("shared-res", "h100-res", None, "us-central1-a")),
    ("h100-res/reservationBlocks/block-1", ReservationSpec("ml-train-prod", "h100-res", "block-1", "us-central1-a")),
    ("projects/shared-res/reservations/h100-res/reservationBlocks/b1", ReservationSpec("shared-res", "h100-res", "b1", "us-central1-a")),
])
def test_reservation_parts_and_the_full_affinity_value(written, expected):
    spec = derive_reservation(written, "ml-train-prod", "us-central1-a")
    assert spec == expected
    block = f"/reservationBlocks/{expected.block}" if expected.block else ""
    assert spec.affinity_value == f"projects/{expected.project}/reservations/{expected.name}{block}"


def test_reserved_pool_uses_the_full_name_and_reads_the_reservation_in_its_zone(stack_json):
    """Review C7: a bare name matches only a same-project reservation; the toolkit writes projects/<p>/reservations/<name>."""
    stack = stack_json("prod-gke")
    affinity = h100(stack)["node_config"]["reservation_affinity"]
    assert affinity["values"] == ["projects/ml-train-prod/reservations/h100-reservation-2026"]
    data = stack["data"]["google_compute_reservation"]["reservation_h100"]
    assert (data["name"], data["zone"], data["project"]) == ("h100-reservation-2026", "us-central1-a", "ml-train-prod")
    (pre,) = h100(stack)["lifecycle"]["precondition"]
    assert pre["condition"].startswith("${") and DATA in pre["condition"]
    assert PRECONDITION_SHAPE.fullmatch(pre["condition"][2:-1]) and allowed(pre["condition"][2:-1])
    assert "l4_spot" not in stack["data"]["google_compute_reservation"]
    assert "precondition" not in stack["resource"]["google_container_node_pool"]["pool_l4_spot"]["lifecycle"]


def test_the_precondition_shape_admits_no_other_literal():
    bad = PRECONDITION_SHAPE.pattern  # the shape is anchored by fullmatch; a payload in a literal breaks it
    assert not PRECONDITION_SHAPE.fullmatch(
        f'try({DATA}.specific_reservation[0].instance_properties[0], null) != null && file("/etc/passwd") == ""')
    assert "file" not in bad


@pytest.fixture(scope="module")
def shared_block_stack(example_configs):
    """prod-gke whose H100 pool targets a block of a reservation shared from another project, with the reservation's own compact policy."""
    from cdktf import Testing

    from stacks.infra import ClusterStack

    prod = {c.name: c for c in example_configs}["prod-gke"]
    pool = prod.gpu_pools[0].model_copy(update={"reservation": "projects/shared-res/reservations/h100-res/reservationBlocks/block-1",
                                                "placement": "COMPACT", "placement_policy_name": "h100-res-compact"})
    return json.loads(Testing.synth(ClusterStack(Testing.app(), prod.model_copy(update={"gpu_pools": (pool, prod.gpu_pools[1])}))))


def test_a_block_is_targeted_in_full_but_the_reservation_is_read_by_name(shared_block_stack):
    pool = h100(shared_block_stack)
    assert pool["node_config"]["reservation_affinity"]["values"] == ["projects/shared-res/reservations/h100-res/reservationBlocks/block-1"]
    data = shared_block_stack["data"]["google_compute_reservation"]["reservation_h100"]
    assert (data["name"], data["project"]) == ("h100-res", "shared-res")


def test_a_reserved_compact_pool_names_the_existing_policy(shared_block_stack):
    """Review B10: GKE must not create its own compact policy on top of reserved capacity; a named one is passed through."""
    assert h100(shared_block_stack)["placement_policy"] == {"type": "COMPACT", "policy_name": "h100-res-compact"}


GOOD = {"specific_reservation_required": True, "specific_reservation": [{"count": 4, "instance_properties": [{
    "machine_type": "a3-highgpu-8g", "min_cpu_platform": "",
    "guest_accelerators": [{"accelerator_type": "nvidia-h100-80gb", "accelerator_count": 8}]}]}]}


def _variant(**changes: object) -> dict:
    reservation = json.loads(json.dumps(GOOD))
    props = reservation["specific_reservation"][0]["instance_properties"][0]
    for key, value in changes.items():
        if key in reservation:
            reservation[key] = value
        else:
            props[key] = value
    return reservation


CASES = {
    "matches": (GOOD, True),
    "matches_with_a_partial_url": (_variant(guest_accelerators=[
        {"accelerator_type": "projects/ml-train-prod/zones/us-central1-a/acceleratorTypes/nvidia-h100-80gb", "accelerator_count": 8}]), True),
    "missing_in_the_zone": ({"specific_reservation_required": None, "specific_reservation": [], "self_link": None}, False),
    "not_specific_only": (_variant(specific_reservation_required=False), False),
    "other_machine_type": (_variant(machine_type="a3-megagpu-8g"), False),
    "fewer_gpus": (_variant(guest_accelerators=[{"accelerator_type": "nvidia-h100-80gb", "accelerator_count": 4}]), False),
    "other_accelerator": (_variant(guest_accelerators=[{"accelerator_type": "nvidia-h100-mega-80gb", "accelerator_count": 8}]), False),
    "no_accelerators": (_variant(guest_accelerators=[]), False),
    "fewer_vms_than_the_pool_can_grow_to": (_variant(specific_reservation=[{**GOOD["specific_reservation"][0], "count": 3}]), False),
    "more_vms_than_the_pool": (_variant(specific_reservation=[{**GOOD["specific_reservation"][0], "count": 6}]), True),
}


def test_real_terraform_plan_enforces_the_synthesized_precondition(stack_json, tmp_path: Path):
    binary = shutil.which("terraform")
    if binary is None:
        pytest.fail("terraform is not on PATH; this test needs terraform 1.11 (built-in terraform_data only)")
    (pre,) = h100(stack_json("prod-gke"))["lifecycle"]["precondition"]
    resources = {f"pool_{case}": {"input": case, "lifecycle": {"precondition": [
        {"condition": pre["condition"].replace(DATA, f"local.reservation_{case}"), "error_message": pre["error_message"]}]}}
        for case in CASES}
    (tmp_path / "main.tf.json").write_text(json.dumps({
        "locals": {f"reservation_{case}": value for case, (value, _) in CASES.items()},
        "resource": {"terraform_data": resources}}))
    env = dict(os.environ, TF_IN_AUTOMATION="1", TF_INPUT="0")
    run = lambda *args: subprocess.run([binary, *args, "-no-color"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)  # noqa: E731
    assert run("init", "-input=false").returncode == 0
    plan = run("plan", "-input=false")
    output = plan.stdout + plan.stderr
    assert plan.returncode != 0
    for case, (_, passes) in CASES.items():
        failed = f"in resource.terraform_data.pool_{case}.lifecycle.precondition[0]" in output
        assert failed != passes, (case, output[-3000:])
    assert "Reservation h100-reservation-2026 in project ml-train-prod, zone us-central1-a must exist there" in output


def test_the_attributes_the_precondition_reads_exist_in_the_pinned_provider_schema():
    """Read-side names of google_compute_reservation at 6.50.0, from the pinned bindings' output classes
    (cross-checked with resource_compute_reservation.go at v6.50.0: specific_reservation.instance_properties.
    {machine_type, guest_accelerators.{accelerator_type, accelerator_count}}, specific_reservation_required)."""
    from constructs_lib.providers import google

    m = google.data_google_compute_reservation
    reads = {
        m.DataGoogleComputeReservation: ("specific_reservation", "specific_reservation_required"),
        m.DataGoogleComputeReservationSpecificReservationOutputReference: ("instance_properties", "count"),
        m.DataGoogleComputeReservationSpecificReservationInstancePropertiesOutputReference: ("machine_type", "guest_accelerators"),
        m.DataGoogleComputeReservationSpecificReservationInstancePropertiesGuestAcceleratorsOutputReference: ("accelerator_type", "accelerator_count"),
    }
    from clusters.reservation import precondition

    condition = precondition(DATA, "a3-highgpu-8g", "nvidia-h100-80gb", 8, 4)
    for cls, names in reads.items():
        for name in names:
            assert isinstance(getattr(cls, name, None), property), f"{cls.__name__}.{name}"
            assert name in condition
