"""The task-side flow against a real OpenBao: wrap -> unwrap -> login -> read -> renew -> revoke."""

from __future__ import annotations

import threading
import time

import hvac
import hvac.exceptions
import pytest

from clusters.errors import UserError
from tests.openbao_fixture import VaultHandle
from vault_policies.client import PossibleInterception, TaskConfig, TokenRenewalError, VaultClientError, parse_secrets, start_task
from vault_policies.layout import MAX_WRAP_TTL_SECONDS, MIN_WRAP_TTL_SECONDS
from vault_policies.orchestrator import issue_wrapped_secret_id, wrap_ttl_for_queue

FINETUNE_SECRETS = "HF_TOKEN=ml-api-keys/huggingface#token,WANDB_API_KEY=ml-api-keys/wandb#api_key"


def _lookup_fails(vault: VaultHandle, token: str) -> bool:
    try:
        vault.client(token).auth.token.lookup_self()
    except hvac.exceptions.Forbidden:
        return True
    return False


def test_full_flow_reads_keys_and_revokes(vault: VaultHandle) -> None:
    config = TaskConfig.from_env(vault.task_env("finetune", FINETUNE_SECRETS))
    with start_task(config) as task:
        token = task.client.token
        assert task.secrets == {"HF_TOKEN": "fake-hf-test-0000", "WANDB_API_KEY": "fake-wandb-test-0000"}
        assert "ml-keys-finetune" in task.policies
        assert vault.client(token).auth.token.lookup_self()["data"]["meta"] == {"role_name": "finetune"}
    assert _lookup_fails(vault, token)


@pytest.mark.parametrize(("role", "ttl_seconds"), [("finetune", 300), ("eval", 300)])
def test_token_ttl_as_configured(vault: VaultHandle, role: str, ttl_seconds: int) -> None:
    secrets = "OPENAI_API_KEY=ml-api-keys/openai#api_key" if role == "eval" else FINETUNE_SECRETS
    with start_task(TaskConfig.from_env(vault.task_env(role, secrets))) as task:
        data = task.client.auth.token.lookup_self()["data"]
        assert task.lease_seconds == ttl_seconds == data["creation_ttl"]
        assert data["renewable"] is True and data["num_uses"] == 0


def test_fails_when_wrapping_token_is_reused(vault: VaultHandle) -> None:
    env = vault.task_env("finetune", FINETUNE_SECRETS)
    start_task(TaskConfig.from_env(env)).close()
    with pytest.raises(PossibleInterception, match="POSSIBLE INTERCEPTION: the wrapping token in GPUFLEET_VAULT_WRAPPED_SECRET_ID is unknown to Vault: someone else already unwrapped it"):
        start_task(TaskConfig.from_env(env))


def test_fails_when_secret_id_is_used_twice(vault: VaultHandle) -> None:
    wrapped = issue_wrapped_secret_id(vault.orchestrator, "finetune", wrap_ttl_seconds=120)
    secret_id = vault.client(wrapped.wrapping_token).sys.unwrap()["data"]["secret_id"]
    first = vault.client().auth.approle.login(wrapped.role_id, secret_id)["auth"]["client_token"]
    vault.client(first).auth.token.revoke_self()
    with pytest.raises(hvac.exceptions.InvalidRequest, match="invalid role or secret ID"):
        vault.client().auth.approle.login(wrapped.role_id, secret_id)
    rewrapped = vault.root.sys.wrap(payload={"secret_id": secret_id}, ttl="60s")["wrap_info"]["token"]
    env = {**vault.task_env("finetune", FINETUNE_SECRETS), "GPUFLEET_VAULT_WRAPPED_SECRET_ID": rewrapped}
    with pytest.raises(PossibleInterception, match="created by 'sys/wrapping/wrap', not 'auth/approle/role/<role>/secret-id'"):
        start_task(TaskConfig.from_env(env))


def test_fails_as_interception_when_login_is_refused_after_unwrap(vault: VaultHandle) -> None:
    """Point 9: a genuine wrap, but the role_id beside it was swapped: the login after the
    unwrap is refused, which the task reports as a possible interception."""
    env = vault.task_env("finetune", FINETUNE_SECRETS)
    env["GPUFLEET_VAULT_ROLE_ID"] = vault.orchestrator.auth.approle.read_role_id("eval")["data"]["role_id"]
    with pytest.raises(PossibleInterception, match="POSSIBLE INTERCEPTION: AppRole login refused right after unwrapping"):
        start_task(TaskConfig.from_env(env))


def test_fails_when_reading_outside_role_paths(vault: VaultHandle) -> None:
    env = vault.task_env("finetune", "OPENAI_API_KEY=ml-api-keys/openai#api_key")
    with pytest.raises(VaultClientError, match=r"this role may not read secret/data/ml-api-keys/openai \(wanted for OPENAI_API_KEY\)"):
        start_task(TaskConfig.from_env(env))


def test_fails_when_key_missing_in_secret(vault: VaultHandle) -> None:
    env = vault.task_env("finetune", "HF_TOKEN=ml-api-keys/huggingface#api_key")
    with pytest.raises(VaultClientError, match=r"has no key 'api_key' \(wanted for HF_TOKEN\); keys there: token"):
        start_task(TaskConfig.from_env(env))


def test_job_token_cannot_write_or_mint(vault: VaultHandle) -> None:
    with start_task(TaskConfig.from_env(vault.task_env("finetune", FINETUNE_SECRETS))) as task:
        with pytest.raises(hvac.exceptions.Forbidden):
            task.client.secrets.kv.v2.create_or_update_secret("ml-api-keys/huggingface", secret={"token": "x"}, mount_point="secret")
        with pytest.raises(hvac.exceptions.Forbidden):
            task.client.auth.approle.generate_secret_id("finetune", wrap_ttl="60s")


def test_fails_when_orchestrator_asks_for_unwrapped_secret_id(vault: VaultHandle) -> None:
    with pytest.raises(hvac.exceptions.Forbidden):
        vault.orchestrator.auth.approle.generate_secret_id("finetune")
    with pytest.raises(hvac.exceptions.Forbidden):
        vault.orchestrator.auth.approle.generate_secret_id("finetune", wrap_ttl=f"{MAX_WRAP_TTL_SECONDS + 60}s")
    with pytest.raises(hvac.exceptions.Forbidden):
        vault.orchestrator.secrets.kv.v2.read_secret_version("ml-api-keys/openai", mount_point="secret", raise_on_deleted_version=True)


def test_fails_when_wrap_ttl_out_of_bounds(vault: VaultHandle) -> None:
    with pytest.raises(UserError, match=f"wrap_ttl_seconds 30 is outside {MIN_WRAP_TTL_SECONDS}..{MAX_WRAP_TTL_SECONDS}"):
        issue_wrapped_secret_id(vault.orchestrator, "finetune", wrap_ttl_seconds=30)
    with pytest.raises(UserError, match="exceeds the maximum wrap TTL"):
        wrap_ttl_for_queue(MAX_WRAP_TTL_SECONDS + 1)
    assert wrap_ttl_for_queue(0) == 60
    assert wrap_ttl_for_queue(1200) == 1500
    assert wrap_ttl_for_queue(MAX_WRAP_TTL_SECONDS) == MAX_WRAP_TTL_SECONDS


def test_fails_when_role_unknown_to_vault(vault: VaultHandle) -> None:
    with pytest.raises(UserError, match="role 'nope' does not exist in Vault"):
        issue_wrapped_secret_id(vault.root, "nope", wrap_ttl_seconds=120)


def test_wrapped_secret_id_hides_token_in_repr(vault: VaultHandle) -> None:
    wrapped = issue_wrapped_secret_id(vault.orchestrator, "eval", wrap_ttl_seconds=90)
    assert wrapped.wrap_ttl_seconds == 90
    assert wrapped.wrapping_token not in repr(wrapped)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("HF_TOKEN=ml-api-keys/huggingface", "entry 'HF_TOKEN=ml-api-keys/huggingface' is malformed"),
        ("1BAD=ml-api-keys/x#k", "entry '1BAD=ml-api-keys/x#k' is malformed"),
        ("A=/abs/path#k", "is malformed"),
        ("A=ml-api-keys/x#k,A=ml-api-keys/y#k", "names A twice"),
    ],
)
def test_fails_when_secrets_spec_malformed(spec: str, message: str) -> None:
    with pytest.raises(VaultClientError, match=message):
        parse_secrets(spec)


def test_fails_when_environment_incomplete() -> None:
    with pytest.raises(VaultClientError, match="missing environment variable.*GPUFLEET_VAULT_WRAPPED_SECRET_ID"):
        TaskConfig.from_env({"VAULT_ADDR": "http://127.0.0.1:1", "GPUFLEET_VAULT_ROLE_ID": "x"})


def test_fails_when_vault_unreachable_after_retries() -> None:
    config = TaskConfig.from_env({"VAULT_ADDR": "http://127.0.0.1:9", "GPUFLEET_VAULT_ROLE_ID": "r", "GPUFLEET_VAULT_WRAPPED_SECRET_ID": "w"})
    started = time.monotonic()
    with pytest.raises(VaultClientError, match=r"cannot reach Vault at http://127.0.0.1:9 after retries"):
        start_task(config)
    assert time.monotonic() - started >= 0.25 * (1 + 2 + 4) * 0.9


def test_renewal_keeps_token_alive_then_fails_before_max_ttl(vault: VaultHandle) -> None:
    """Token TTL 6 s, max 14 s: renewed at 3 s, 6 s, 9 s (capped), reported ~2 s before 14 s.
    Margins are seconds wide so a loaded 2-core host does not flake; no fixed sleeps."""
    vault.root.auth.approle.create_or_update_approle("short-run", token_policies=["ml-keys-eval"], token_ttl=6, token_max_ttl=14, secret_id_ttl=60, secret_id_num_uses=1)
    try:
        failed = threading.Event()
        failures: list[tuple[TokenRenewalError, bool]] = []

        def on_failure(exc: TokenRenewalError) -> None:
            failures.append((exc, not _lookup_fails(vault, token)))
            failed.set()

        env = vault.task_env("short-run", "OPENAI_API_KEY=ml-api-keys/openai#api_key", minter=vault.root)
        with start_task(TaskConfig.from_env(env), on_renewal_failure=on_failure) as task:
            token = task.client.token
            past_first_ttl = time.monotonic() + task.lease_seconds + 1
            while time.monotonic() < past_first_ttl and not failed.is_set():
                time.sleep(0.2)
            assert not failed.is_set(), "the failure came before the first TTL ran out"
            assert not _lookup_fails(vault, token), "renewal should keep the 6 s token alive past 6 s"
            assert failed.wait(timeout=60), "no failure was reported before token_max_ttl"
        exc, alive_when_reported = failures[0]
        assert "reaches the role's token_max_ttl" in str(exc) and "set token_period" in str(exc)
        assert alive_when_reported, "the failure must be reported while the token still works"
        assert _lookup_fails(vault, token)
    finally:
        vault.root.auth.approle.delete_role("short-run")


def test_wrapping_token_from_a_file_as_kubernetes_mounts_it(vault: VaultHandle, tmp_path) -> None:
    """GKE pods get the token as a file of the run's Secret, never as a pod-spec variable."""
    env = vault.task_env("finetune", FINETUNE_SECRETS)
    token_file = tmp_path / "wrapped-secret-id-0"
    token_file.write_text(env.pop("GPUFLEET_VAULT_WRAPPED_SECRET_ID") + "\n")
    env["GPUFLEET_VAULT_WRAPPED_SECRET_ID_FILE"] = str(token_file)
    with start_task(TaskConfig.from_env(env)) as task:
        assert task.secrets["HF_TOKEN"] == "fake-hf-test-0000"


def test_fails_when_the_wrapping_token_file_is_missing(tmp_path) -> None:
    env = {"VAULT_ADDR": "http://127.0.0.1:1", "GPUFLEET_VAULT_ROLE_ID": "r", "GPUFLEET_VAULT_WRAPPED_SECRET_ID_FILE": str(tmp_path / "wrapped-secret-id-3")}
    with pytest.raises(VaultClientError, match=r"GPUFLEET_VAULT_WRAPPED_SECRET_ID_FILE '.*wrapped-secret-id-3' cannot be read .*re-dispatch"):
        TaskConfig.from_env(env)
    del env["GPUFLEET_VAULT_WRAPPED_SECRET_ID_FILE"]
    with pytest.raises(VaultClientError, match=r"missing environment variable\(s\) GPUFLEET_VAULT_WRAPPED_SECRET_ID"):
        TaskConfig.from_env(env)
