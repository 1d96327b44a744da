"""ACL bootstrap automated (issue 23): once, idempotent, the management token only in OpenBao KV.

Against the Nomad ACL double (``nomad_acl_double``: bootstrap and token-self as hashicorp/nomad v1.10.5
answers them) and a real OpenBao (KV v2 write with check-and-set)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import hvac
import pytest

from clusters.errors import UserError
from gpufleet import nomad_acl
from clusters.derive.nomad import management_token_path as token_path
from gpufleet.nomad_acl import NomadApi, bootstrap
from tests.gpufleet.nomad_acl_double import NomadAclDouble
from vault_policies.layout import KV_MOUNT

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def nomad() -> Iterator[NomadAclDouble]:
    double = NomadAclDouble().start()
    yield double
    double.stop()


@pytest.fixture
def bao(openbao) -> Iterator[hvac.Client]:
    client = hvac.Client(url=openbao.addr, token=openbao.root_token)
    yield client
    for cluster in ("acl-a", "acl-b", "acl-c", "acl-d", "prod-nomad"):
        try:
            client.secrets.kv.v2.delete_metadata_and_all_versions(path=token_path(cluster), mount_point=KV_MOUNT)
        except hvac.exceptions.InvalidPath:
            pass


def stored(bao: hvac.Client, cluster: str) -> tuple[str, int] | None:
    try:
        answer = bao.secrets.kv.v2.read_secret_version(path=token_path(cluster), mount_point=KV_MOUNT, raise_on_deleted_version=True)
    except hvac.exceptions.InvalidPath:
        return None
    return answer["data"]["data"]["secret_id"], answer["data"]["metadata"]["version"]


def run(nomad: NomadAclDouble, bao: hvac.Client, cluster: str, said: list[str], wait: float = 0) -> str:
    return bootstrap(cluster=cluster, api=NomadApi(nomad.address, None, None, None), vault=bao, wait_seconds=wait, say=said.append)


def test_bootstraps_once_with_the_token_it_stored_first_and_a_rerun_only_confirms_it(nomad, bao, caplog):
    caplog.set_level(logging.DEBUG)
    said: list[str] = []
    assert run(nomad, bao, "acl-a", said) == "bootstrapped"
    token, version = stored(bao, "acl-a")
    (first,) = [body for method, path, _, body in nomad.requests if path == "/v1/acl/bootstrap"]
    assert first == {"BootstrapSecret": token}, "the stored token is the one Nomad made the management token"
    assert nomad.tokens[token]["Type"] == "management"
    assert run(nomad, bao, "acl-a", said) == "already bootstrapped"
    assert stored(bao, "acl-a") == (token, version), "a re-run writes nothing"
    assert [(m, p) for m, p, _, _ in nomad.requests] == [("POST", "/v1/acl/bootstrap"), ("POST", "/v1/acl/bootstrap"), ("GET", "/v1/acl/token/self")]
    assert any("stored at secret/gpufleet/nomad/acl-a/management-token" in line for line in said)
    assert token not in "\n".join(said) and token not in caplog.text


def test_fails_when_the_cluster_was_bootstrapped_by_hand_and_leaves_no_stale_token(nomad, bao):
    nomad.bootstrap_by_hand()
    said: list[str] = []
    with pytest.raises(UserError, match=r"bootstrapped with another token, which is not at secret/gpufleet/nomad/acl-b/management-token;"
                                        r" store that management token there"):
        run(nomad, bao, "acl-b", said)
    assert stored(bao, "acl-b") is None, "the token this run stored is removed: it is not the cluster's"


def test_waits_for_a_leader_then_bootstraps(nomad, bao, monkeypatch):
    monkeypatch.setattr(nomad_acl, "RETRY_SECONDS", 0.01)
    nomad.no_leader = 2
    said: list[str] = []
    assert run(nomad, bao, "acl-c", said, wait=30) == "bootstrapped"
    assert sum(1 for line in said if line.startswith("waiting for the Nomad servers")) == 2
    assert stored(bao, "acl-c")[0] in nomad.tokens


def test_fails_when_no_leader_answers_in_time_and_keeps_the_stored_token_for_the_rerun(nomad, bao, monkeypatch):
    monkeypatch.setattr(nomad_acl, "RETRY_SECONDS", 0.01)
    nomad.no_leader = 10_000
    with pytest.raises(UserError, match="did not answer POST /v1/acl/bootstrap within 0 s"):
        run(nomad, bao, "acl-d", [])
    token, _ = stored(bao, "acl-d")
    nomad.no_leader = 0
    assert run(nomad, bao, "acl-d", []) == "bootstrapped" and token in nomad.tokens, "the rerun sends the same stored token"


def test_the_cli_never_prints_the_token(nomad, openbao, bao):
    env = {**os.environ, "NOMAD_ADDR": nomad.address, "VAULT_ADDR": openbao.addr, "VAULT_TOKEN": openbao.root_token}
    for key in ("NOMAD_CACERT", "NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY"):
        env.pop(key, None)
    gpufleet = Path(sys.executable).parent / "gpufleet"
    results = [subprocess.run([str(gpufleet), "nomad", "acl-bootstrap", "prod-nomad", "--wait-seconds", "0"], env=env, cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=120, check=False) for _ in range(2)]
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    token, _ = stored(bao, "prod-nomad")
    assert all(token not in r.stdout + r.stderr for r in results)
    assert "already bootstrapped" in results[1].stdout


def test_a_lost_bootstrap_answer_then_a_leader_election_keeps_the_token_that_is_the_clusters(nomad, bao, monkeypatch):
    """The bootstrap committed but its answer was lost, so the rerun of the POST hears "already done"; the
    token-self check then meets a leader election (500). Only a definitive 403 "ACL token not found" proves
    the stored token is not the cluster's: deleting it on a 500 would lose the only management token."""
    monkeypatch.setattr(nomad_acl, "RETRY_SECONDS", 0.01)
    nomad.lose_bootstrap_answers = 1
    nomad.self_no_leader = 2
    said: list[str] = []
    assert run(nomad, bao, "acl-a", said, wait=30) == "already bootstrapped"
    token, _ = stored(bao, "acl-a")
    assert nomad.tokens[token]["Type"] == "management", "the stored token is the cluster's management token"
