"""``gpufleet nomad acl-bootstrap <cluster>``: bootstrap a Nomad cluster's ACLs once, the management
token going straight into OpenBao/Vault KV, never to a terminal, a file, Terraform state or a log.

Nomad's bootstrap accepts a caller-chosen secret (hashicorp/nomad v1.10.5 ``nomad/acl_endpoint.go:490``
``providedTokenID := args.BootstrapSecret``, a UUID or 400 "invalid acl token" at ``:538-544``). So the
token is made here and stored first (KV v2 check-and-set 0: only if nothing is stored yet), then sent:
if the answer is lost, the stored token is already the cluster's. A second bootstrap answers 400
"ACL bootstrap already done (reset index: N)" (``:520-522``, HTTP code from ``NewErrRPCCodedf(400, ...)``);
then the stored token is checked with ``GET /v1/acl/token/self`` (an unknown token answers 403
"ACL token not found", ``command/agent/http.go:704-706``): valid means done, that 403 is a cluster someone
bootstrapped by hand (the token stored by this run is removed again); any other answer (a 5xx of a leader
election after a bootstrap whose answer was lost) keeps the stored token, which may be the cluster's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import hvac
import hvac.exceptions
import requests

from clusters.derive.nomad import management_token_path as token_path
from clusters.errors import UserError
from vault_policies.layout import KV_MOUNT

ALREADY_DONE = "ACL bootstrap already done"
RETRY_SECONDS = 5.0


@dataclass(frozen=True)
class NomadApi:
    """Where and how to reach the cluster's API: the CLI certificate the bootstrap script made (the servers'
    certificate carries the load balancer's IP, so the address verifies as it is)."""

    address: str
    ca_file: str | None
    cert_file: str | None
    key_file: str | None

    def request(self, method: str, path: str, *, token: str | None = None, body: dict | None = None) -> requests.Response:
        headers = {"X-Nomad-Token": token} if token else {}
        cert = (self.cert_file, self.key_file) if self.cert_file and self.key_file else None
        return requests.request(method, f"{self.address.rstrip('/')}{path}", json=body, headers=headers, cert=cert,
                               verify=self.ca_file or True, timeout=10)


def _stored(vault: hvac.Client, cluster: str) -> str | None:
    try:
        answer = vault.secrets.kv.v2.read_secret_version(path=token_path(cluster), mount_point=KV_MOUNT, raise_on_deleted_version=True)
    except hvac.exceptions.InvalidPath:
        return None
    return answer["data"]["data"].get("secret_id")


def _store_new(vault: hvac.Client, cluster: str) -> tuple[str, bool]:
    """The stored token, or a new one stored now (check-and-set 0, so two runs cannot both store)."""
    existing = _stored(vault, cluster)
    if existing:
        return existing, False
    token = str(uuid.uuid4())
    try:
        vault.secrets.kv.v2.create_or_update_secret(path=token_path(cluster), secret={"secret_id": token}, cas=0, mount_point=KV_MOUNT)
    except hvac.exceptions.InvalidRequest:
        again = _stored(vault, cluster)
        if again:
            return again, False
        raise
    return token, True


def _answered(api: NomadApi, method: str, path: str, deadline: float, wait_seconds: float, say: Callable[[str], None],
              **request: object) -> requests.Response:
    """The first answer below 500, retrying a connection error or a 5xx (no leader yet, an election) until the deadline."""
    while True:
        try:
            answer = api.request(method, path, **request)
        except requests.RequestException as exc:
            answer, error = None, type(exc).__name__
        else:
            error = f"HTTP {answer.status_code}"
        if answer is not None and answer.status_code < 500:
            return answer
        if time.monotonic() >= deadline:
            raise UserError(f"the Nomad API at {api.address} did not answer {method} {path} within {wait_seconds:.0f} s ({error});"
                            " check NOMAD_ADDR and that the servers have a leader, then run it again (it is safe to repeat)")
        say(f"waiting for the Nomad servers at {api.address} ({error})")
        time.sleep(RETRY_SECONDS)


def bootstrap(*, cluster: str, api: NomadApi, vault: hvac.Client, wait_seconds: float, say: Callable[[str], None]) -> str:
    """Bootstrap or confirm; returns what happened ("bootstrapped" or "already bootstrapped")."""
    where = f"{KV_MOUNT}/{token_path(cluster)}"
    try:
        token, created = _store_new(vault, cluster)
    except hvac.exceptions.Forbidden:
        raise UserError(f"OpenBao/Vault refused to read or write {where}; use a token that may (an operator token)") from None
    deadline = time.monotonic() + wait_seconds
    answer = _answered(api, "POST", "/v1/acl/bootstrap", deadline, wait_seconds, say, body={"BootstrapSecret": token})
    if answer.status_code == 200:
        say(f"bootstrapped the ACLs of {cluster}; management token (accessor {answer.json().get('AccessorID')}) stored at {where}")
        return "bootstrapped"
    if answer.status_code == 400 and ALREADY_DONE in answer.text:
        check = _answered(api, "GET", "/v1/acl/token/self", deadline, wait_seconds, say, token=token)
        if check.status_code == 200 and check.json().get("Type") == "management":
            say(f"the ACLs of {cluster} are already bootstrapped; the management token at {where} is valid (accessor {check.json().get('AccessorID')})")
            return "already bootstrapped"
        if check.status_code != 403 or "ACL token not found" not in check.text:
            # Not a definitive "ACL token not found": the stored token may well be the cluster's (a bootstrap whose
            # answer was lost), so it stays where it is.
            raise UserError(f"the Nomad API at {api.address} could not confirm the management token at {where}: HTTP {check.status_code}"
                            f" {check.text.strip()[:200]!r}; run this again (it is safe to repeat), the stored token is kept")
        if created:
            vault.secrets.kv.v2.delete_metadata_and_all_versions(path=token_path(cluster), mount_point=KV_MOUNT)
        raise UserError(f"the ACLs of {cluster} were bootstrapped with another token, which is not at {where};"
                        f" store that management token there (key secret_id), or reset the bootstrap (Nomad: acl-bootstrap-reset) and run this again")
    raise UserError(f"the Nomad API at {api.address} refused the ACL bootstrap: HTTP {answer.status_code} {answer.text.strip()[:200]!r}")
