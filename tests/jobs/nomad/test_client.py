"""The Nomad client against the local API double (no Nomad binary exists here): the exact
requests it sends, and what it does when Nomad is slow, flaky, strict or absent."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from clusters.errors import UserError
from jobs.nomad.client import NomadClient, NomadError, NomadSettings
from jobs.loader import find, load
from jobs.nomad.render import placement_probe, render
from jobs.spec import FinetuneSpec
from jobs.nomad.status import RunState
from tests.jobs.conftest import a100_nodes
from tests.jobs.nomad_double import Fault, NomadDouble

META = {"dataset_uri": "hf://datasets/demo/tiny@v1", "run_id": "demo-1"}
WRAP = "s.fakewrappingtoken0000"

ClientFor = Callable[..., NomadClient]


@pytest.fixture(scope="module")
def llama() -> FinetuneSpec:
    return load(find("finetune-llama"))


def _dispatch(client: NomadClient, spec: FinetuneSpec, token: str = "idem-1"):
    return client.dispatch(spec, META, role_id="role-id-1", wrapping_token=WRAP, idempotency_token=token)


def test_plan_register_dispatch_send_exactly_these_requests(nomad: NomadDouble, client_for: ClientFor, llama: FinetuneSpec) -> None:
    client = client_for(nomad)
    assert client.plan(llama).placeable
    client.register(llama)
    result = _dispatch(client, llama)

    plan, register, dispatch = nomad.requests
    assert (plan.method, plan.path, plan.query) == ("POST", "/v1/job/finetune-llama/plan", {"namespace": ["finetune"]})
    assert plan.body == {**placement_probe(render(llama)), "Diff": True, "PolicyOverride": False}
    assert (register.method, register.path, register.query, register.body) == ("POST", "/v1/jobs", {"namespace": ["finetune"]}, render(llama))
    assert (dispatch.method, dispatch.path) == ("POST", "/v1/job/finetune-llama/dispatch")
    assert dispatch.query == {"idempotency_token": ["idem-1"], "namespace": ["finetune"]}
    # gpufleet_experiment: the dispatch's own token when the caller names no experiment (an operator dispatch).
    assert dispatch.body == {"Meta": {**META, "gpufleet_experiment": "idem-1", "gpufleet_vault_role_id": "role-id-1", "gpufleet_vault_wrapped_secret_id": WRAP,
                                      "gpufleet_attempt": "1"}}
    for request in nomad.requests:
        assert request.headers["X-Nomad-Token"] == "nomad-acl-test-token"
        assert request.headers["User-Agent"] == "gpufleet-jobs/0.1"
    assert result.dispatched_job_id == nomad.dispatched("finetune-llama")[0]


def test_region_from_settings_goes_in_the_query(nomad: NomadDouble, client_for: ClientFor, llama: FinetuneSpec) -> None:
    client_for(nomad, region="europe").plan(llama)
    assert nomad.requests[0].query == {"namespace": ["finetune"], "region": ["europe"]}


def test_a_503_then_success_gives_exactly_one_dispatch(nomad: NomadDouble, client_for: ClientFor, llama: FinetuneSpec) -> None:
    client = client_for(nomad)
    client.register(llama)
    nomad.inject("POST", "dispatch", Fault(status=503))
    result = _dispatch(client, llama, token="idem-503")
    attempts = nomad.calls("POST", "dispatch")
    assert len(attempts) == 2
    assert [a.query["idempotency_token"] for a in attempts] == [["idem-503"], ["idem-503"]]
    assert nomad.dispatched("finetune-llama") == [result.dispatched_job_id]


def test_a_timeout_is_retried_with_the_same_token_and_dispatches_once(nomad: NomadDouble, client_for: ClientFor, llama: FinetuneSpec) -> None:
    """The slow answer arrives after the client gave up, but the dispatch happened: only the
    idempotency token in the query string stops the retry from starting a second run.
    The delay is 3x the timeout so the first attempt times out even on a loaded host."""
    client = client_for(nomad, timeout_seconds=1.0)
    client.register(llama)
    nomad.inject("POST", "dispatch", Fault(delay_seconds=3.0))
    result = _dispatch(client, llama, token="idem-timeout")
    attempts = nomad.calls("POST", "dispatch")
    assert len(attempts) >= 2, "the timed-out dispatch was not retried"
    assert all(a.query["idempotency_token"] == ["idem-timeout"] for a in attempts)
    assert attempts[0].body == attempts[1].body
    assert nomad.dispatched("finetune-llama") == [result.dispatched_job_id]


def test_fails_when_nomad_keeps_answering_503(nomad: NomadDouble, client_for: ClientFor, llama: FinetuneSpec) -> None:
    nomad.inject("POST", "register", *[Fault(status=503)] * 3)
    with pytest.raises(NomadError, match=r"submit: Nomad at http://127\.0\.0\.1:\d+ answered 503 after 3 attempts"):
        client_for(nomad).register(llama)
    assert len(nomad.calls("POST", "register")) == 3


def test_fails_when_nomad_is_unreachable(client_for: ClientFor, llama: FinetuneSpec) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = NomadClient(NomadSettings(address=f"http://127.0.0.1:{port}", retries=1, backoff_seconds=0.01, timeout_seconds=0.3))
    with pytest.raises(NomadError, match=rf"plan: cannot reach Nomad at http://127\.0\.0\.1:{port} after 2 attempts \(ConnectionError\); check NOMAD_ADDR"):
        client.plan(llama)


def test_fails_when_token_is_refused(nomad: NomadDouble, client_for: ClientFor, llama: FinetuneSpec) -> None:
    with pytest.raises(NomadError, match=r"submit: Nomad refused the token \(403\) for namespace finetune; set NOMAD_TOKEN"):
        client_for(nomad, token="wrong").register(llama)


def test_fails_when_dispatching_an_unregistered_job(nomad: NomadDouble, client_for: ClientFor, llama: FinetuneSpec) -> None:
    with pytest.raises(NomadError, match=r"dispatch: Nomad has no job 'finetune-llama' in namespace finetune \(404: parameterized job not found\); register it first: gpufleet jobs register finetune-llama") as caught:
        _dispatch(client_for(nomad), llama)
    assert WRAP not in str(caught.value)


def test_fails_when_nomad_rejects_the_meta_and_never_echoes_the_wrapping_token(nomad: NomadDouble, client_for: ClientFor, llama: FinetuneSpec) -> None:
    client = client_for(nomad)
    client.register(llama)
    with pytest.raises(NomadError, match=r"dispatch: Nomad rejected the request \(400: Dispatch did not provide required meta keys: \['run_id'\]\)") as caught:
        client.dispatch(llama, {"dataset_uri": "hf://d/x@v1"}, role_id="r", wrapping_token=WRAP, idempotency_token="t")
    assert WRAP not in str(caught.value)


def test_plan_explains_busy_gpus(client_for: ClientFor, llama: FinetuneSpec) -> None:
    double = NomadDouble(a100_nodes(count=3, used=2)).start()
    try:
        result = client_for(double, token=None).plan(llama)
    finally:
        double.stop()
    assert not result.placeable
    assert result.reason == "no client in pool a100 has 1 free GPU with >= 40 GiB matching model 'A100' (3 clients busy); wait for running jobs to finish or ask for fewer GPUs"
    assert "X-Nomad-Token" not in double.requests[0].headers


def test_status_follows_a_run_to_its_failing_event_then_stop_purges(nomad: NomadDouble, client_for: ClientFor, llama: FinetuneSpec) -> None:
    client = client_for(nomad)
    client.register(llama)
    run = _dispatch(client, llama).dispatched_job_id
    assert client.status(run, "finetune", llama).state == RunState.PENDING
    nomad.finish(run, client_status="running")
    assert client.status(run, "finetune", llama).state == RunState.RUNNING
    nomad.finish(run, client_status="failed", failed=True, events=[{"Type": "Terminated", "DisplayMessage": "Exit Code: 78"}])
    status = client.status(run, "finetune", llama)
    assert (status.state, status.detail) == (RunState.FAILED, "task train: Terminated: Exit Code: 78")
    paths = [r.path for r in nomad.calls("GET", "evaluations")]
    assert paths and all(p == f"/v1/job/{run}/evaluations" for p in paths)
    assert all(r.query["namespace"] == ["finetune"] for r in nomad.requests if r.method == "GET")

    client.stop(run, "finetune", purge=True)
    delete = nomad.calls("DELETE", "job")[-1]
    assert delete.query == {"purge": ["true"], "namespace": ["finetune"]}
    with pytest.raises(NomadError, match=r"status: Nomad has no job .* in namespace finetune \(404: job not found\)"):
        client.status(run, "finetune", llama)


def test_settings_come_from_nomad_env_and_tls_uses_nomad_cacert(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    env = {"NOMAD_ADDR": "https://nomad.example.com:4646", "NOMAD_TOKEN": "t", "NOMAD_NAMESPACE": "eval", "NOMAD_REGION": "eu", "NOMAD_CACERT": str(ca)}
    settings = NomadSettings.from_env(env)
    assert (settings.address, settings.token, settings.namespace, settings.region, settings.cacert) == ("https://nomad.example.com:4646", "t", "eval", "eu", str(ca))
    api = NomadClient(settings)._api(None)
    assert api.job.verify == str(ca)
    assert NomadClient(NomadSettings(address="https://n:4646"))._api(None).job.verify is True


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NOMAD_ADDR": "nomad:4646"}, r"NOMAD_ADDR 'nomad:4646' is not an http\(s\) address"),
        ({"NOMAD_ADDR": "https://n:4646", "NOMAD_CACERT": "/nonexistent/ca.pem"}, r"NOMAD_CACERT '/nonexistent/ca.pem' is not a file"),
    ],
)
def test_fails_when_nomad_env_is_wrong(env: dict[str, str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        NomadSettings.from_env(env)


def test_find_dispatch_reads_only_the_children_whose_meta_can_be_that_dispatchs(nomad: NomadDouble, client_for: ClientFor,
                                                                                llama: FinetuneSpec) -> None:
    """A worker that takes over a claim asks which child, if any, the dead worker's dispatch made. With a
    parent of thousands of runs, reading every child (one GET each) made each takeover that many GETs:
    only children whose ``gpufleet_experiment`` meta is the token, or the experiment id of an attempt key,
    are read, and each is still confirmed by its DispatchIdempotencyToken."""
    client = client_for(nomad)
    client.register(llama)
    others = [client.dispatch(llama, {**META, "gpufleet_experiment": f"exp-{i}"}, role_id="role-id-1", wrapping_token=WRAP,
                              idempotency_token=f"exp-{i}").dispatched_job_id for i in range(6)]
    second = client.dispatch(llama, {**META, "gpufleet_experiment": "exp-7"}, role_id="role-id-1", wrapping_token=WRAP,
                             idempotency_token="exp-7.attempt-2", attempt=2).dispatched_job_id
    bare = _dispatch(client, llama, token="bare-token").dispatched_job_id
    before = len(nomad.calls("GET", "job"))
    assert client.find_dispatch("finetune", llama.name, "exp-7.attempt-2") == second
    assert client.find_dispatch("finetune", llama.name, "exp-3") == others[3]
    assert client.find_dispatch("finetune", llama.name, "bare-token") == bare
    assert client.find_dispatch("finetune", llama.name, "exp-7") is None  # attempt 1 of exp-7 never reached Nomad
    assert client.find_dispatch("finetune", llama.name, "exp-3.attempt-2") is None
    assert len(nomad.calls("GET", "job")) - before == 5  # one child each, plus exp-7's and exp-3's children read and refused


def test_finds_that_wait_on_one_listing_share_it_and_a_later_find_lists_again(nomad: NomadDouble, client_for: ClientFor,
                                                                               llama: FinetuneSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """A takeover finds up to 12 claims at once, each listing every child of the parent: finds that arrive
    while a listing is in flight use it; a find that starts after a listing completed lists again, so it
    sees a child made since (freshness is never traded for the saving)."""
    import threading

    import jobs.nomad.client as client_module

    client = client_for(nomad)
    client.register(llama)
    made = [client.dispatch(llama, {**META, "gpufleet_experiment": f"exp-{i}"}, role_id="role-id-1", wrapping_token=WRAP,
                            idempotency_token=f"exp-{i}").dispatched_job_id for i in range(4)]
    asked, release, real_list = [], threading.Event(), client._list_jobs_with_meta
    real_monotonic = client_module.time.monotonic

    def counted_monotonic() -> float:
        asked.append(1)
        return real_monotonic()

    listed: list[str] = []

    def held_list(namespace: str, prefix: str):  # type: ignore[no-untyped-def]
        release.wait(timeout=60)
        listed.append(prefix)
        return real_list(namespace, prefix)

    monkeypatch.setattr(client_module.time, "monotonic", counted_monotonic)
    monkeypatch.setattr(client, "_list_jobs_with_meta", held_list)
    found: dict[int, str | None] = {}
    threads = [threading.Thread(target=lambda i=i: found.__setitem__(i, client.find_dispatch("finetune", llama.name, f"exp-{i}"))) for i in range(4)]
    for thread in threads:
        thread.start()
    while len(asked) < 4:  # every find has asked (its start time) before the listing may finish
        threading.Event().wait(0.01)
    release.set()
    for thread in threads:
        thread.join(timeout=60)
    assert found == dict(enumerate(made))
    assert len(listed) == 1
    later = client.dispatch(llama, {**META, "gpufleet_experiment": "exp-9"}, role_id="role-id-1", wrapping_token=WRAP, idempotency_token="exp-9")
    assert client.find_dispatch("finetune", llama.name, "exp-9") == later.dispatched_job_id
    assert len(listed) == 2


def test_a_child_made_while_a_shared_listing_was_in_flight_is_never_made_twice(nomad: NomadDouble, client_for: ClientFor,
                                                                               llama: FinetuneSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """A find may read a listing that began before it asked (one it waited on), so a child made in between
    is not found. The submit that follows sends the same idempotency token, and Nomad answers with that
    child instead of making a second (nomad/job_endpoint.go at v1.10.5, Job.Dispatch lines 2049-2083: the
    children of the parent are scanned for DispatchIdempotencyToken before a new one is derived); the
    double does the same."""
    import threading

    client = client_for(nomad)
    client.register(llama)
    client.dispatch(llama, {**META, "gpufleet_experiment": "exp-0"}, role_id="role-id-1", wrapping_token=WRAP, idempotency_token="exp-0")
    listed, made, real_list = threading.Event(), threading.Event(), client._list_jobs_with_meta

    def listing_then_a_child(namespace: str, prefix: str):  # type: ignore[no-untyped-def]
        stubs = real_list(namespace, prefix)  # the listing's answer is in: exp-5's child comes after it
        listed.set()
        assert made.wait(timeout=60)
        return stubs

    import types

    import jobs.nomad.client as client_module

    asks: list[float] = []  # the client module's clock readings: each find's start, then each listing's end
    monkeypatch.setattr(client_module, "time", types.SimpleNamespace(monotonic=lambda: asks.append(time.monotonic()) or asks[-1]))
    monkeypatch.setattr(client, "_list_jobs_with_meta", listing_then_a_child)
    first = threading.Thread(target=lambda: client.find_dispatch("finetune", llama.name, "exp-0"))
    first.start()
    assert listed.wait(timeout=60)
    child = client.dispatch(llama, {**META, "gpufleet_experiment": "exp-5"}, role_id="role-id-1", wrapping_token=WRAP,
                            idempotency_token="exp-5").dispatched_job_id
    found: list[str | None] = []
    second = threading.Thread(target=lambda: found.append(client.find_dispatch("finetune", llama.name, "exp-5")))
    second.start()
    while len(asks) < 2:  # the second find has asked, and waits on the first one's listing
        assert second.is_alive()
        threading.Event().wait(0.01)
    made.set()
    first.join(timeout=60)
    second.join(timeout=60)
    assert found == [None]  # the shared listing began before exp-5's child was made
    again = client.dispatch(llama, {**META, "gpufleet_experiment": "exp-5"}, role_id="role-id-1", wrapping_token=WRAP, idempotency_token="exp-5")
    assert again.dispatched_job_id == child
    assert len([t for t in nomad.calls("POST", "dispatch") if t.query["idempotency_token"][0] == "exp-5"]) == 2
    assert len({j for (_, j), job in nomad.state.jobs.items() if job.get("DispatchIdempotencyToken") == "exp-5"}) == 1
