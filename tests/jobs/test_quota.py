"""Tenant GPU quotas at dispatch: Nomad Community Edition enforces none (quotas and node-pool
restrictions are Enterprise), so gpufleet refuses a dispatch that would exceed the tenant's
quota on the pool, counting what Nomad (here the API double) says the tenant holds."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from clusters.derive.tenants import TenantSpec
from gpufleet.cli import main
from jobs.nomad.client import NomadClient
from jobs.loader import find, load
from jobs.quota import check_tenant_quota, gpus_held, requested_gpus
from jobs.nomad.render import placement_probe, render
from tests.jobs.nomad_double import NomadDouble

TENANT = TenantSpec(name="eval", namespace="eval", groups=(), gpu_quota=(("a100", 4), ("l4", 2)), gcp_account_id=None, gcp_roles=())
META = ["--meta", "dataset_uri=hf://datasets/demo/tiny@v1", "--meta", "run_id=demo-1"]


def test_quota_allows_up_to_the_limit_and_not_one_gpu_more() -> None:
    assert check_tenant_quota(TENANT, pool="a100", requested_gpus=2, in_use_gpus=2).allowed
    refused = check_tenant_quota(TENANT, pool="a100", requested_gpus=1, in_use_gpus=4)
    assert not refused.allowed and refused.free == 0
    assert refused.reason == ("tenant eval holds 4 of its 4 GPUs on pool a100 (queued or running); 1 more would exceed the quota;"
                              " wait for a run to finish, stop one, or raise the quota")


def test_fails_when_the_tenant_has_no_quota_on_the_pool() -> None:
    refused = check_tenant_quota(TENANT, pool="h100", requested_gpus=1, in_use_gpus=0)
    assert not refused.allowed
    assert refused.reason.startswith("tenant eval has no GPU quota on pool h100 (its quotas: a100=4, l4=2)")
    zero = TenantSpec(name="t", namespace="t", groups=(), gpu_quota=(("l4", 0),), gcp_account_id=None, gcp_roles=())
    assert not check_tenant_quota(zero, pool="l4", requested_gpus=1, in_use_gpus=0).allowed


def test_held_gpus_count_queued_and_running_allocations_of_the_pool_only() -> None:
    job = placement_probe(render(load(find("finetune-llama"))))["Job"]
    assert requested_gpus(job) == {"gpu-a100-x1": 1}
    summary = {"Summary": {"gpu-a100-x1": {"Queued": 1, "Starting": 1, "Running": 1, "Unknown": 1, "Complete": 5, "Failed": 2, "Lost": 1}}}
    parent = {**job, "ParameterizedJob": {"MetaRequired": []}}
    other_pool = {**job, "NodePool": "l4"}
    assert gpus_held([(job, summary), (parent, summary), (other_pool, summary)], pool="a100") == 4


def test_dispatch_is_refused_before_minting_when_the_tenant_is_at_quota(
    monkeypatch: pytest.MonkeyPatch, nomad: NomadDouble, client_for: Callable[..., NomadClient], capsys: pytest.CaptureFixture[str],
) -> None:
    spec = load(find("finetune-llama"))
    quota = dict(spec.tenant.gpu_quota)["a100"]
    client = client_for(nomad)
    client.register(spec)
    for i in range(quota):  # the double has 4 A100s: the rest of the runs queue, and still count
        client.dispatch(spec, {"dataset_uri": "hf://d/x@v1", "run_id": f"r{i}"}, role_id="r", wrapping_token="w", idempotency_token=f"t{i}")
    assert client.tenant_gpus_in_use("finetune", "a100") == quota
    for name in ("NOMAD_NAMESPACE", "NOMAD_REGION", "NOMAD_CACERT", "VAULT_ADDR", "VAULT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NOMAD_ADDR", nomad.address)
    monkeypatch.setenv("NOMAD_TOKEN", nomad.acl_token or "")
    assert main(["jobs", "dispatch", "finetune-llama", *META]) == 2
    err = capsys.readouterr().err
    assert f"not dispatching finetune-llama: tenant finetune holds {quota} of its {quota} GPUs on pool a100" in err
    assert len(nomad.calls("POST", "dispatch")) == quota
