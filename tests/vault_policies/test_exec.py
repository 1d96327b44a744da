"""``gpufleet-exec`` as a real process: keys reach the child only, exit codes and signals pass
through, and the task token is revoked when the run ends, SIGTERM included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import hvac.exceptions

from tests.openbao_fixture import VaultHandle

EXEC = str(Path(sys.executable).parent / "gpufleet-exec")
FINETUNE_SECRETS = "HF_TOKEN=ml-api-keys/huggingface#token,WANDB_API_KEY=ml-api-keys/wandb#api_key"


def _live_role_tokens(vault: VaultHandle, role: str) -> set[str]:
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


def _run(vault: VaultHandle, command: list[str], secrets: str = FINETUNE_SECRETS) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **vault.task_env("finetune", secrets)}
    return subprocess.run([EXEC, "--", *command], env=env, capture_output=True, text=True, timeout=60)


def test_child_gets_keys_as_env_and_its_exit_code_returns(vault: VaultHandle) -> None:
    script = 'test "$HF_TOKEN" = fake-hf-test-0000 && test "$WANDB_API_KEY" = fake-wandb-test-0000 && test -z "$GPUFLEET_VAULT_WRAPPED_SECRET_ID" && exit 7'
    before = _live_role_tokens(vault, "finetune")
    result = _run(vault, ["sh", "-c", script])
    assert result.returncode == 7, result.stderr
    assert "passing HF_TOKEN, WANDB_API_KEY to sh" in result.stderr and "token revoked" in result.stderr
    assert "fake-" not in result.stdout + result.stderr
    assert _live_role_tokens(vault, "finetune") == before


def test_child_never_sees_the_wrapping_token_under_its_nomad_meta_names(vault: VaultHandle) -> None:
    env = {**os.environ, **vault.task_env("finetune", FINETUNE_SECRETS)}
    spent = env["GPUFLEET_VAULT_WRAPPED_SECRET_ID"]
    env["NOMAD_META_gpufleet_vault_wrapped_secret_id"] = spent
    env["NOMAD_META_GPUFLEET_VAULT_WRAPPED_SECRET_ID"] = spent
    result = subprocess.run([EXEC, "--", sys.executable, "-c", "import os; print(sorted(os.environ))"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "WRAPPED_SECRET_ID" not in result.stdout.upper()
    assert spent not in result.stdout + result.stderr


def test_sigterm_reaches_child_and_token_is_revoked(vault: VaultHandle, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    env = {**os.environ, **vault.task_env("finetune", FINETUNE_SECRETS)}
    before = _live_role_tokens(vault, "finetune")
    proc = subprocess.Popen([EXEC, "--", "sh", "-c", f'touch {ready}; trap "exit 42" TERM; while :; do sleep 0.1; done'], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the child never started"
        during = _live_role_tokens(vault, "finetune") - before
        assert len(during) == 1, "the run should hold exactly one live token"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 42, stderr
    assert "token revoked" in stderr
    for accessor in during:
        try:
            vault.root.auth.token.lookup_accessor(accessor)
        except hvac.exceptions.InvalidRequest:
            continue
        raise AssertionError("the token is still alive after SIGTERM")


def test_fails_when_child_command_missing(vault: VaultHandle) -> None:
    before = _live_role_tokens(vault, "finetune")
    result = _run(vault, ["/nonexistent/train"])
    assert result.returncode == 127
    assert "cannot start '/nonexistent/train'" in result.stderr
    assert _live_role_tokens(vault, "finetune") == before


def test_fails_when_wrapping_token_already_used(vault: VaultHandle) -> None:
    env = {**os.environ, **vault.task_env("finetune", FINETUNE_SECRETS)}
    vault.client(env["GPUFLEET_VAULT_WRAPPED_SECRET_ID"]).sys.unwrap()
    result = subprocess.run([EXEC, "--", "true"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 78
    assert "someone else may have unwrapped it" in result.stderr


def test_fails_when_no_command_given() -> None:
    result = subprocess.run([EXEC, "--"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "usage: gpufleet-exec -- <command>" in result.stderr


def test_child_stopped_before_token_max_ttl(vault: VaultHandle) -> None:
    vault.root.auth.approle.create_or_update_approle("short-exec", token_policies=["ml-keys-eval"], token_ttl=4, token_max_ttl=10, secret_id_ttl=60, secret_id_num_uses=1)
    try:
        env = {**os.environ, **vault.task_env("short-exec", "OPENAI_API_KEY=ml-api-keys/openai#api_key", minter=vault.root)}
        started = time.monotonic()
        result = subprocess.run([EXEC, "--", "sleep", "120"], env=env, capture_output=True, text=True, timeout=150)
        assert time.monotonic() - started < 60, "the child should stop near token_max_ttl (10 s), not run to its end"
        assert result.returncode == 128 + signal.SIGTERM, result.stderr
        assert "reaches the role's token_max_ttl" in result.stderr and "stopping the command" in result.stderr
    finally:
        vault.root.auth.approle.delete_role("short-exec")


def _limited(vault: VaultHandle, max_run: str, grace: str) -> dict[str, str]:
    return {**os.environ, **vault.task_env("finetune", FINETUNE_SECRETS), "GPUFLEET_MAX_RUN_SECONDS": max_run, "GPUFLEET_KILL_GRACE_SECONDS": grace}


def test_child_stopped_when_it_outruns_max_run_seconds(vault: VaultHandle) -> None:
    """Nomad 1.10 ignores MaxRunDuration and the finetune token lives 24h: gpufleet-exec stops it."""
    before = _live_role_tokens(vault, "finetune")
    started = time.monotonic()
    result = subprocess.run([EXEC, "--", "sleep", "120"], env=_limited(vault, "2", "30"), capture_output=True, text=True, timeout=150)
    elapsed = time.monotonic() - started
    assert result.returncode == 124, result.stderr
    assert "ran longer than max_run_hours (GPUFLEET_MAX_RUN_SECONDS=2); sending SIGTERM" in result.stderr
    assert "ignored SIGTERM" not in result.stderr and "token revoked" in result.stderr
    assert 2 <= elapsed < 60, f"stopped after {elapsed:.1f}s"
    assert _live_role_tokens(vault, "finetune") == before


def test_child_killed_when_it_ignores_sigterm_past_max_run(vault: VaultHandle, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    before = _live_role_tokens(vault, "finetune")
    started = time.monotonic()
    command = ["sh", "-c", f'trap "" TERM; touch {ready}; exec sleep 120']
    result = subprocess.run([EXEC, "--", *command], env=_limited(vault, "2", "1"), capture_output=True, text=True, timeout=150)
    assert ready.exists(), "the child was stopped before it could ignore SIGTERM"
    assert result.returncode == 124, result.stderr
    assert "ignored SIGTERM for 1s (GPUFLEET_KILL_GRACE_SECONDS); sending SIGKILL" in result.stderr and "token revoked" in result.stderr
    assert time.monotonic() - started < 60
    assert _live_role_tokens(vault, "finetune") == before


def test_fails_when_max_run_seconds_is_malformed(vault: VaultHandle) -> None:
    env = _limited(vault, "12h", "30")
    result = subprocess.run([EXEC, "--", "true"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "GPUFLEET_MAX_RUN_SECONDS='12h' is not a whole number of seconds >= 1" in result.stderr
    assert vault.client(env["GPUFLEET_VAULT_WRAPPED_SECRET_ID"]).sys.unwrap()["data"]["secret_id"], "the refusal must not spend the wrapping token"


def test_library_revokes_on_sigterm(vault: VaultHandle, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    program = (
        "import os, pathlib, time\n"
        "from vault_policies.client import TaskConfig, start_task\n"
        "with start_task(TaskConfig.from_env(os.environ)) as task:\n"
        f"    pathlib.Path({str(ready)!r}).touch()\n"
        "    time.sleep(30)\n"
    )
    env = {**os.environ, **vault.task_env("finetune", FINETUNE_SECRETS)}
    before = _live_role_tokens(vault, "finetune")
    proc = subprocess.Popen([sys.executable, "-c", program], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the task never logged in"
        assert len(_live_role_tokens(vault, "finetune") - before) == 1
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert _live_role_tokens(vault, "finetune") == before
