"""The diff core on JSON pairs: hand-written ones for the rules, and edits of the real fleet output.

The fleet cases start from the session's synthesized example fleet (``stack_json``) and
change exactly what a cluster-file edit would change, so they check the rules against the
JSON cdktf really writes (nested blocks as objects, block lists, maps with dotted keys).
"""

from __future__ import annotations

import copy

import pytest

from preview.diff import AllowError, ExitCode, Kind, attribute_changes, preview
from preview.forcenew import Rule, Tables, Table, load_tables

TABLES = load_tables()


def rules(**paths: str) -> dict[str, Rule]:
    return {p.replace("__", "."): Rule(p.replace("__", "."), kind, False, "test") for p, kind in paths.items()}


def stack(**resources: dict) -> dict:
    out: dict = {"resource": {}}
    for address, body in resources.items():
        rtype, name = address.split("__")
        out["resource"].setdefault(rtype, {})[name] = body
    return out


HAND = Tables({"test": Table("test", "1", {"t_pool": rules(name="attribute", cfg="block", cfg__zone="attribute", tags="attribute",
                                                         nets="block", nets__net="attribute")})})


def test_nested_attribute_change_forces_replacement_through_its_own_flag():
    changes = attribute_changes({"cfg": {"zone": "a", "size": 1}}, {"cfg": {"zone": "b", "size": 2}}, HAND.rules("t_pool"))
    assert [(c.path, c.old, c.new, c.forces_replacement) for c in changes] == [("cfg.size", 1, 2, False), ("cfg.zone", "a", "b", True)]


def test_adding_a_forcenew_block_forces_replacement_but_changing_inside_it_follows_nested_flags():
    added = attribute_changes({}, {"nets": [{"net": "n1"}]}, HAND.rules("t_pool"))
    assert [(c.path, c.forces_replacement) for c in added] == [("nets.#", True), ("nets[0].net", True)]
    grown = attribute_changes({"nets": [{"net": "n1", "x": 1}]}, {"nets": [{"net": "n1", "x": 2}]}, HAND.rules("t_pool"))
    assert [(c.path, c.forces_replacement) for c in grown] == [("nets[0].x", False)]


def test_forcenew_list_of_values_forces_replacement_on_any_element():
    changes = attribute_changes({"tags": ["a", "b"]}, {"tags": ["a", "c"]}, HAND.rules("t_pool"))
    assert [(c.path, c.old, c.new, c.forces_replacement) for c in changes] == [("tags", ["a", "b"], ["a", "c"], True)]


def test_ignore_changes_and_meta_arguments_are_not_changes():
    base = {"name": "p", "cfg": {"zone": "a"}, "lifecycle": {"prevent_destroy": True}, "//": {"metadata": {"path": "x"}}}
    head = {"name": "p", "cfg": {"zone": "b"}, "lifecycle": {"ignore_changes": ["cfg"]}, "//": {"metadata": {"path": "y"}}}
    assert attribute_changes(base, head, HAND.rules("t_pool"), ["cfg"]) == ()


def test_empty_list_and_absent_block_are_the_same():
    assert attribute_changes({"nets": []}, {}, HAND.rules("t_pool")) == ()


def test_secret_looking_values_are_masked():
    changes = attribute_changes({"api_token": "a"}, {"api_token": "hvs.CAESIJ0123456789abcdefghijklmnopqrstuv"}, {})
    assert changes[0].new.startswith("(masked") and "hvs.CAESIJ" not in str(changes)


def test_fails_when_a_protected_resource_is_destroyed_and_allow_destroy_keeps_it():
    base = {"s": stack(t_pool__a={"name": "a"}, t_other__b={"name": "b"})}
    head = {"s": stack()}
    result = preview(base, head, HAND, protected_types=frozenset({"t_pool"}))
    assert [(f.kind, f.qualified, f.protected, f.blocking) for f in result.findings] == [
        (Kind.DESTROYED, "s/t_other.b", False, False), (Kind.DESTROYED, "s/t_pool.a", True, True)]
    assert result.exit_code == ExitCode.BLOCKED
    allowed = preview(base, head, HAND, protected_types=frozenset({"t_pool"}), allow_destroy=["s/t_pool.a"])
    assert allowed.exit_code == ExitCode.CHANGES and allowed.findings[1].allowed


def test_allow_destroy_that_is_bare_or_matches_nothing_is_a_user_error():
    """A bare address is refused even when only one stack destroys it (it was a "fleet-unique" match)."""
    base = {"s1": stack(t_pool__a={"name": "a"}), "s2": stack(t_pool__a={"name": "a"})}
    head = {"s1": stack(), "s2": stack()}
    with pytest.raises(AllowError, match=r"bare address is refused .*name its stack: --allow-destroy s1/t_pool.a, s2/t_pool.a$"):
        preview(base, head, HAND, protected_types=frozenset({"t_pool"}), allow_destroy=["t_pool.a"])
    with pytest.raises(AllowError, match=r"name its stack: --allow-destroy s1/t_pool.a$"):
        preview(base, {"s1": stack(), "s2": base["s2"]}, HAND, protected_types=frozenset({"t_pool"}), allow_destroy=["t_pool.a"])
    with pytest.raises(AllowError, match="matches no destroyed"):
        preview(base, head, HAND, protected_types=frozenset({"t_pool"}), allow_destroy=["s1/t_pool.typo"])


def test_address_change_of_an_unchanged_resource_is_a_free_rename_and_a_moved_block_resolves_it():
    base = {"s": stack(t_pool__old={"name": "p", "cfg": {"zone": "a"}})}
    head = {"s": stack(t_pool__new={"name": "p", "cfg": {"zone": "a"}})}
    (finding,) = preview(base, head, HAND, protected_types=frozenset({"t_pool"})).findings
    assert (finding.kind, finding.address, finding.new_address, finding.changes) == (Kind.RENAMED, "t_pool.old", "t_pool.new", ())
    assert "moved" in finding.advice and "terraform state mv t_pool.old t_pool.new" in finding.advice
    head["s"]["moved"] = [{"from": "t_pool.old", "to": "t_pool.new"}]
    assert preview(base, head, HAND, protected_types=frozenset({"t_pool"})).findings == ()


def test_a_changed_name_is_a_costly_rename_and_other_changes_make_it_destroy_plus_create():
    base = {"s": stack(t_pool__pool_a={"name": "a", "label": "pool-a", "cfg": {"zone": "z"}})}
    renamed = {"s": stack(t_pool__pool_b={"name": "b", "label": "pool-b", "cfg": {"zone": "z"}})}
    (finding,) = preview(base, renamed, HAND, protected_types=frozenset({"t_pool"})).findings
    assert finding.kind == Kind.RENAMED and "keep the old name" in finding.advice and "(name cannot change in place)" in finding.advice
    different = {"s": stack(t_pool__pool_b={"name": "b", "label": "pool-b", "cfg": {"zone": "y"}})}
    assert [f.kind for f in preview(base, different, HAND, protected_types=frozenset({"t_pool"})).findings] == [Kind.DESTROYED]


def test_resources_of_unknown_types_update_in_place_with_a_note():
    result = preview({"s": stack(x_thing__a={"v": 1})}, {"s": stack(x_thing__a={"v": 2})}, HAND)
    assert result.findings == () and result.stacks[0].no_table == ("x_thing",) and result.exit_code == ExitCode.CHANGES


# -- edits of the real example fleet -------------------------------------------------------------

def _edit(stack_json, name, edit) -> tuple[dict, dict]:
    base = stack_json(name)
    head = copy.deepcopy(base)
    edit(head["resource"])
    return {name: base}, {name: head}


def _summary(result) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(f.kind.value, f.qualified, tuple(c.path for c in f.changes)) for f in result.findings]


def test_static_ip_description_reworded_replaces_the_address(stack_json):
    base, head = _edit(stack_json, "prod-gke", lambda r: r["google_compute_global_address"]["ip_ingress"].update(description="reworded"))
    result = preview(base, head, TABLES)
    assert _summary(result) == [("replaced", "prod-gke/google_compute_global_address.ip_ingress", ("description",))]
    assert result.exit_code == ExitCode.BLOCKED and "google/services/compute/resource_compute_global_address.go" in result.findings[0].changes[0].rule


def test_driver_version_on_a_reserved_pool_replaces_it(stack_json):
    def edit(r):
        r["google_container_node_pool"]["pool_h100"]["node_config"]["guest_accelerator"][0]["gpu_driver_installation_config"] = {
            "gpu_driver_version": "LATEST"}
    result = preview(*_edit(stack_json, "prod-gke", edit), TABLES)
    assert _summary(result) == [("replaced", "prod-gke/google_container_node_pool.pool_h100",
                                 ("node_config.guest_accelerator[0].gpu_driver_installation_config.gpu_driver_version",))]


def test_node_network_added_to_a_pool_replaces_it(stack_json):
    def edit(r):
        r["google_container_node_pool"]["pool_h100"]["network_config"] = {
            "additional_node_network_configs": [{"network": "gpu-net-1", "subnetwork": "gpu-sub-1"}]}
    base, head = _edit(stack_json, "prod-gke", edit)
    # The example H100 pool already has its derived GPUDirect NICs: the base is that pool without them.
    base = copy.deepcopy(base)
    del base["prod-gke"]["resource"]["google_container_node_pool"]["pool_h100"]["network_config"]
    result = preview(base, head, TABLES)
    assert _summary(result) == [("replaced", "prod-gke/google_container_node_pool.pool_h100", (
        "network_config.additional_node_network_configs.#", "network_config.additional_node_network_configs[0].network",
        "network_config.additional_node_network_configs[0].subnetwork"))]


def test_reservation_changed_replaces_the_pool(stack_json):
    def edit(r):
        r["google_container_node_pool"]["pool_h100"]["node_config"]["reservation_affinity"]["values"] = ["h100-reservation-2027"]
    result = preview(*_edit(stack_json, "prod-gke", edit), TABLES)
    assert _summary(result) == [("replaced", "prod-gke/google_container_node_pool.pool_h100", ("node_config.reservation_affinity.values",))]
    assert result.findings[0].changes[0].old == ["projects/ml-train-prod/reservations/h100-reservation-2026"]


def test_max_nodes_raised_and_initial_count_ignored_are_in_place(stack_json):
    def edit(r):
        pool = r["google_container_node_pool"]["pool_h100"]
        pool["autoscaling"]["total_max_node_count"] = 8
        pool["initial_node_count"] = 3  # ForceNew, but the construct ignores it (lifecycle.ignore_changes)
    result = preview(*_edit(stack_json, "prod-gke", edit), TABLES)
    assert result.findings == () and result.stacks[0].updated_in_place == 1 and result.exit_code == ExitCode.CHANGES


def test_non_protected_resource_replaced_is_reported_not_blocking(stack_json):
    result = preview(*_edit(stack_json, "prod-gke", lambda r: r["google_service_account"]["node_sa"].update(account_id="prod-gke-nodes-2")),
                     TABLES)
    (finding,) = result.findings
    assert (finding.kind, finding.protected, finding.blocking) == (Kind.REPLACED, False, False)
    assert result.exit_code == ExitCode.CHANGES


def test_rename_pairs_use_whole_name_tokens():
    """pool_h100 -> pool_h200 substitutes h100 -> h200, never the digit alone ("nvidia-h100-80gb" stays equal)."""
    body = {"label": "pool-h100", "accel": "nvidia-h100-80gb", "zone": "a-1"}
    base = {"s": stack(t_pool__pool_h100=body)}
    head = {"s": stack(t_pool__pool_h200={**body, "label": "pool-h200", "zone": "a-2"})}
    assert [f.kind for f in preview(base, head, HAND, protected_types=frozenset({"t_pool"})).findings] == [Kind.DESTROYED]
    head = {"s": stack(t_pool__pool_h200={**body, "label": "pool-h200"})}
    assert [f.kind for f in preview(base, head, HAND, protected_types=frozenset({"t_pool"})).findings] == [Kind.RENAMED]


def test_changing_a_static_ips_use_is_a_blocked_destroy_not_a_silent_swap(stack_json):
    """Review C11: `use: ingress` -> `load_balancer` turns the global address into a regional one; the
    pinned global IP would be released, so the preview blocks it like any protected destroy."""
    def edit(r):
        ip = r.pop("google_compute_global_address")["ip_ingress"]
        ip = {k: v for k, v in ip.items() if k != "ip_version"}
        r["google_compute_address"] = {"ip_ingress": {**ip, "region": "us-central1", "network_tier": "PREMIUM"}}
    result = preview(*_edit(stack_json, "prod-gke", edit), TABLES)
    assert result.exit_code == ExitCode.BLOCKED
    assert "prod-gke/google_compute_global_address.ip_ingress" in {f.qualified for f in result.blocking}


FOLLOW = Tables({"test": Table("test", "1", {"t_pool": rules(name="attribute", tags="attribute"), "t_secret": rules(secret_id="attribute")})})


def test_a_resource_referencing_a_purely_moved_one_does_not_change():
    base = {"s": stack(t_secret__old={"secret_id": "a"}, t_pool__p={"name": "${t_secret.old.id}"})}
    head = {"s": {**stack(t_secret__new={"secret_id": "a"}, t_pool__p={"name": "${t_secret.new.id}"}),
                  "moved": [{"from": "t_secret.old", "to": "t_secret.new"}]}}
    assert preview(base, head, FOLLOW, protected_types=frozenset({"t_pool"})).findings == ()


def test_a_protected_resource_referencing_a_moved_one_that_is_replaced_still_counts_as_replaced():
    """The moved secret is itself replaced (its secret_id forces it), so its id is new and the protected pool
    whose name interpolates it is replaced too: the move must not make that reference look unchanged."""
    base = {"s": stack(t_secret__old={"secret_id": "a"}, t_pool__p={"name": "${t_secret.old.id}"})}
    head = {"s": {**stack(t_secret__new={"secret_id": "b"}, t_pool__p={"name": "${t_secret.new.id}"}),
                  "moved": [{"from": "t_secret.old", "to": "t_secret.new"}]}}
    result = preview(base, head, FOLLOW, protected_types=frozenset({"t_pool"}))
    blocked = [(f.kind, f.address) for f in result.findings if f.protected]
    assert blocked == [(Kind.REPLACED, "t_pool.p")], result.findings
    assert (Kind.REPLACED, "t_secret.old") in [(f.kind, f.address) for f in result.findings], "the moved secret's own replacement"
