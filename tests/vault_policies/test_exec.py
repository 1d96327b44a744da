"""``gpufleet-exec`` as a real process: keys reach the child only, exit codes and signals pass
through, and the task token is revoked when the run ends, SIGTERM included."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import hvac.exceptions
import pytest

from tests.openbao_fixture import VaultHandle, live_role_tokens
from vault_policies.devserver import free_port

EXEC = str(Path(sys.executable).parent / "gpufleet-exec")
FINETUNE_SECRETS = "HF_TOKEN=ml-api-keys/huggingface#token,WANDB_API_KEY=ml-api-keys/wandb#api_key"


def _run(vault: VaultHandle, command: list[str], secrets: str = FINETUNE_SECRETS) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **vault.task_env("finetune", secrets)}
    return subprocess.run([EXEC, "--", *command], env=env, capture_output=True, text=True, timeout=60)


def test_child_gets_keys_as_env_and_its_exit_code_returns(vault: VaultHandle) -> None:
    script = 'test "$HF_TOKEN" = fake-hf-test-0000 && test "$WANDB_API_KEY" = fake-wandb-test-0000 && test -z "$GPUFLEET_VAULT_WRAPPED_SECRET_ID" && exit 7'
    before = live_role_tokens(vault, "finetune")
    result = _run(vault, ["sh", "-c", script])
    assert result.returncode == 7, result.stderr
    assert "passing HF_TOKEN, WANDB_API_KEY to sh" in result.stderr and "token revoked" in result.stderr
    assert "fake-" not in result.stdout + result.stderr
    assert live_role_tokens(vault, "finetune") == before


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
    before = live_role_tokens(vault, "finetune")
    proc = subprocess.Popen([EXEC, "--", "sh", "-c", f'touch {ready}; trap "exit 42" TERM; while :; do sleep 0.1; done'], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the child never started"
        during = live_role_tokens(vault, "finetune") - before
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
    before = live_role_tokens(vault, "finetune")
    result = _run(vault, ["/nonexistent/train"])
    assert result.returncode == 127
    assert "cannot start '/nonexistent/train'" in result.stderr
    assert live_role_tokens(vault, "finetune") == before


def test_fails_when_wrapping_token_already_used(vault: VaultHandle) -> None:
    env = {**os.environ, **vault.task_env("finetune", FINETUNE_SECRETS)}
    vault.client(env["GPUFLEET_VAULT_WRAPPED_SECRET_ID"]).sys.unwrap()
    result = subprocess.run([EXEC, "--", "true"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 79
    assert "POSSIBLE INTERCEPTION: the wrapping token in GPUFLEET_VAULT_WRAPPED_SECRET_ID is unknown to Vault: someone else already unwrapped it" in result.stderr


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
        assert result.returncode == 81, result.stderr
        assert "reaches the role's token_max_ttl" in result.stderr and "stopping the command" in result.stderr
    finally:
        vault.root.auth.approle.delete_role("short-exec")


def _limited(vault: VaultHandle, max_run: str, grace: str) -> dict[str, str]:
    return {**os.environ, **vault.task_env("finetune", FINETUNE_SECRETS), "GPUFLEET_MAX_RUN_SECONDS": max_run, "GPUFLEET_KILL_GRACE_SECONDS": grace}


def test_child_stopped_when_it_outruns_max_run_seconds(vault: VaultHandle) -> None:
    """Nomad 1.10 ignores MaxRunDuration and the finetune token lives 24h: gpufleet-exec stops it."""
    before = live_role_tokens(vault, "finetune")
    started = time.monotonic()
    result = subprocess.run([EXEC, "--", "sleep", "120"], env=_limited(vault, "2", "30"), capture_output=True, text=True, timeout=150)
    elapsed = time.monotonic() - started
    assert result.returncode == 124, result.stderr
    assert "ran longer than its run limit (2s: the smaller of GPUFLEET_MAX_RUN_SECONDS and GPUFLEET_RUN_DEADLINE_SECONDS); sending SIGTERM" in result.stderr
    assert "ignored SIGTERM" not in result.stderr and "token revoked" in result.stderr
    assert 2 <= elapsed < 60, f"stopped after {elapsed:.1f}s"
    assert live_role_tokens(vault, "finetune") == before


def test_child_stopped_at_the_experiment_deadline_when_it_is_the_smaller_bound(vault: VaultHandle) -> None:
    """The experiment's remaining deadline (dispatch meta, GPUFLEET_RUN_DEADLINE_SECONDS) binds when it is
    shorter than the job's max_run_hours: admission priced the run at the deadline, not at max_run."""
    started = time.monotonic()
    env = {**_limited(vault, "100", "30"), "GPUFLEET_RUN_DEADLINE_SECONDS": "2"}
    result = subprocess.run([EXEC, "--", "sleep", "120"], env=env, capture_output=True, text=True, timeout=150)
    elapsed = time.monotonic() - started
    assert result.returncode == 124, result.stderr
    assert "ran longer than its run limit (2s:" in result.stderr and "token revoked" in result.stderr
    assert 2 <= elapsed < 60, f"stopped after {elapsed:.1f}s"


@pytest.mark.parametrize("absent", ["", "${NOMAD_META_gpufleet_run_deadline_seconds}"])
def test_without_a_deadline_the_job_max_run_still_binds(vault: VaultHandle, absent: str) -> None:
    """A dispatch without the optional meta key: Nomad leaves ``${NOMAD_META_...}`` as written (helper/args/args.go
    ReplaceEnv at v1.10.5), and an operator's run has no experiment deadline; the job's own bound applies, never none."""
    env = {**_limited(vault, "2", "30"), "GPUFLEET_RUN_DEADLINE_SECONDS": absent}
    result = subprocess.run([EXEC, "--", "sleep", "120"], env=env, capture_output=True, text=True, timeout=150)
    assert result.returncode == 124, result.stderr
    assert "ran longer than its run limit (2s:" in result.stderr


def test_a_larger_deadline_never_extends_max_run(vault: VaultHandle) -> None:
    env = {**_limited(vault, "2", "30"), "GPUFLEET_RUN_DEADLINE_SECONDS": "3600"}
    result = subprocess.run([EXEC, "--", "sleep", "120"], env=env, capture_output=True, text=True, timeout=150)
    assert result.returncode == 124, result.stderr
    assert "ran longer than its run limit (2s:" in result.stderr


@pytest.mark.parametrize("bad", ["0", "1.5", "-3"])
def test_fails_when_the_run_deadline_is_malformed(vault: VaultHandle, bad: str) -> None:
    env = {**_limited(vault, "100", "30"), "GPUFLEET_RUN_DEADLINE_SECONDS": bad}
    result = subprocess.run([EXEC, "--", "true"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"GPUFLEET_RUN_DEADLINE_SECONDS={bad!r} is not a whole number of seconds >= 1" in result.stderr
    assert vault.client(env["GPUFLEET_VAULT_WRAPPED_SECRET_ID"]).sys.unwrap()["data"]["secret_id"], "the refusal must not spend the wrapping token"


def test_child_killed_when_it_ignores_sigterm_past_max_run(vault: VaultHandle, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    before = live_role_tokens(vault, "finetune")
    started = time.monotonic()
    command = ["sh", "-c", f'trap "" TERM; touch {ready}; exec sleep 120']
    result = subprocess.run([EXEC, "--", *command], env=_limited(vault, "2", "1"), capture_output=True, text=True, timeout=150)
    assert ready.exists(), "the child was stopped before it could ignore SIGTERM"
    assert result.returncode == 124, result.stderr
    assert "ignored SIGTERM for 1s (GPUFLEET_KILL_GRACE_SECONDS); sending SIGKILL" in result.stderr and "token revoked" in result.stderr
    assert time.monotonic() - started < 60
    assert live_role_tokens(vault, "finetune") == before


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
    before = live_role_tokens(vault, "finetune")
    proc = subprocess.Popen([sys.executable, "-c", program], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the task never logged in"
        assert len(live_role_tokens(vault, "finetune") - before) == 1
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert live_role_tokens(vault, "finetune") == before


# --- issue 16 points 9-12 and 16 -------------------------------------------------------------


def _exec(env: dict[str, str], *command: str, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXEC, "--", *command], env=env, capture_output=True, text=True, timeout=timeout)


def _unspent(vault: VaultHandle, wrapping_token: str) -> bool:
    try:
        vault.client().adapter.post("/v1/sys/wrapping/lookup", json={"token": wrapping_token})
    except hvac.exceptions.InvalidRequest:
        return False
    return True


@pytest.mark.parametrize("data", [{"secret_id": "attacker-chosen"}, {"anything": "else"}], ids=["secret-id-rewrap", "other-data"])
def test_fails_as_interception_when_wrap_was_swapped(vault: VaultHandle, data: dict[str, str]) -> None:
    """Point 9: a re-wrap (sys/wrapping/wrap) is refused before unwrapping, by its creation
    path, with the interception code, no traceback, and the token left as evidence."""
    env = {**os.environ, **vault.task_env("finetune", FINETUNE_SECRETS)}
    swapped = vault.root.write_data("sys/wrapping/wrap", data=data, wrap_ttl="120s")["wrap_info"]["token"]
    env["GPUFLEET_VAULT_WRAPPED_SECRET_ID"] = swapped
    result = _exec(env, "true")
    assert result.returncode == 79, result.stderr
    assert "POSSIBLE INTERCEPTION: the wrapping token in GPUFLEET_VAULT_WRAPPED_SECRET_ID was created by 'sys/wrapping/wrap', not 'auth/approle/role/<role>/secret-id'" in result.stderr
    assert "Traceback" not in result.stderr and swapped not in result.stderr
    assert _unspent(vault, swapped)


def _case_env(vault: VaultHandle, case: str) -> dict[str, str]:
    env = {**os.environ, **vault.task_env("finetune", FINETUNE_SECRETS), "GPUFLEET_VAULT_ROLE": "finetune"}
    if case == "vault-down":
        env["VAULT_ADDR"] = f"http://127.0.0.1:{free_port()}"
    elif case == "malformed-secrets":
        env["GPUFLEET_SECRETS"] = "HF_TOKEN=ml-api-keys/huggingface"
    elif case == "missing-vault-addr":
        del env["VAULT_ADDR"]
    elif case == "denied-path":
        env["GPUFLEET_SECRETS"] = "OPENAI_API_KEY=ml-api-keys/openai#api_key"
    elif case == "wrap-of-another-role":
        env["GPUFLEET_VAULT_ROLE"] = "eval"
    return env


EXIT_CASES = [
    ("vault-down", 69, "cannot reach Vault at http://127.0.0.1:", True),
    ("malformed-secrets", 2, "GPUFLEET_SECRETS entry 'HF_TOKEN=ml-api-keys/huggingface' is malformed", True),
    ("missing-vault-addr", 2, "missing environment variable(s) VAULT_ADDR", True),
    ("denied-path", 78, "this role may not read secret/data/ml-api-keys/openai", False),
    ("wrap-of-another-role", 79, "POSSIBLE INTERCEPTION: the wrapping token in GPUFLEET_VAULT_WRAPPED_SECRET_ID was created by 'auth/approle/role/finetune/secret-id', not 'auth/approle/role/eval/secret-id'", True),
]


@pytest.mark.parametrize(("case", "code", "message", "unspent"), EXIT_CASES, ids=[c[0] for c in EXIT_CASES])
def test_exit_codes_tell_the_causes_apart(vault: VaultHandle, case: str, code: int, message: str, unspent: bool) -> None:
    """Point 9: Vault down, malformed environment, denied path and interception each have
    their own exit code and message (all were 78); only Vault's answer spends the wrap."""
    env = _case_env(vault, case)
    result = _exec(env, "true")
    assert result.returncode == code, result.stderr
    assert message in result.stderr and f"(exit {code})" in result.stderr
    assert "Traceback" not in result.stderr
    assert _unspent(vault, env["GPUFLEET_VAULT_WRAPPED_SECRET_ID"]) is unspent


@pytest.fixture
def short_role(vault: VaultHandle) -> Iterator[str]:
    """A role whose tokens live 4 s (renewed every 2 s) and at most 10 min."""
    vault.root.auth.approle.create_or_update_approle("short-exec", token_policies=["ml-keys-eval"], token_ttl=4, token_max_ttl=600, secret_id_ttl=60, secret_id_num_uses=1)
    yield "short-exec"
    vault.root.auth.approle.delete_role("short-exec")


def _wait_for(path: Path, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path.name} never appeared"


def test_revoked_token_stops_the_run_at_once(vault: VaultHandle, short_role: str, tmp_path: Path) -> None:
    """Point 11: renewal answered 403 (an operator revoked the token) stops the run now:
    SIGTERM, SIGKILL after the grace for a child that ignores it, exit 80 (it ran on before)."""
    ready = tmp_path / "ready"
    env = {**os.environ, **vault.task_env(short_role, "OPENAI_API_KEY=ml-api-keys/openai#api_key", minter=vault.root), "GPUFLEET_KILL_GRACE_SECONDS": "1"}
    before = live_role_tokens(vault, short_role)
    proc = subprocess.Popen([EXEC, "--", "sh", "-c", f'trap "" TERM; touch {ready}; while :; do sleep 0.1; done'], env=env, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(ready)
        (accessor,) = live_role_tokens(vault, short_role) - before
        vault.root.auth.token.revoke_accessor(accessor)
        revoked_at = time.monotonic()
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 80, stderr
    assert "Vault refused to renew the task token (403): it was revoked" in stderr and "ignored SIGTERM for 1s" in stderr
    assert time.monotonic() - revoked_at < 15


def test_child_ignoring_sigterm_is_killed_at_token_max_ttl(vault: VaultHandle) -> None:
    """Point 11: at token_max_ttl a child that ignores SIGTERM is killed and the wrapper
    exits non-zero (it exited with the child's 0 before)."""
    vault.root.auth.approle.create_or_update_approle("short-exec", token_policies=["ml-keys-eval"], token_ttl=4, token_max_ttl=10, secret_id_ttl=60, secret_id_num_uses=1)
    try:
        env = {**os.environ, **vault.task_env("short-exec", "OPENAI_API_KEY=ml-api-keys/openai#api_key", minter=vault.root), "GPUFLEET_KILL_GRACE_SECONDS": "1"}
        started = time.monotonic()
        result = _exec(env, "sh", "-c", 'trap "" TERM; sleep 60; exit 0', timeout=90)
        assert result.returncode == 81, result.stderr
        assert "ignored SIGTERM for 1s" in result.stderr and time.monotonic() - started < 40
    finally:
        vault.root.auth.approle.delete_role("short-exec")


def test_sigkill_of_the_wrapper_takes_the_child_and_leaves_a_short_lived_token(vault: VaultHandle, tmp_path: Path) -> None:
    """Point 10: SIGKILL of gpufleet-exec cannot revoke the token, so the child (holding the
    keys) dies with it (PR_SET_PDEATHSIG) and the orphaned token expires within 5 minutes."""
    pid_file = tmp_path / "child.pid"
    env = {**os.environ, **vault.task_env("finetune", FINETUNE_SECRETS)}
    before = live_role_tokens(vault, "finetune")
    proc = subprocess.Popen([EXEC, "--", "sh", "-c", f'echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}; exec sleep 120'], env=env, stderr=subprocess.DEVNULL)
    try:
        _wait_for(pid_file)
        child = int(pid_file.read_text())
        (accessor,) = live_role_tokens(vault, "finetune") - before
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}").exists() and "zombie" not in Path(f"/proc/{child}/status").read_text(errors="replace") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{child}").exists() or "zombie" in Path(f"/proc/{child}/status").read_text(errors="replace"), "the child outlived the killed wrapper"
        ttl = vault.root.auth.token.lookup_accessor(accessor)["data"]["ttl"]
        assert 0 < ttl <= 300
        vault.root.auth.token.revoke_accessor(accessor)
    finally:
        if proc.poll() is None:
            proc.kill()


SETPRIV = shutil.which("setpriv")
PEEK = (
    "import os\n"
    "try:\n"
    "    with open(f'/proc/{os.getppid()}/mem', 'rb'):\n"
    "        print('PARENT MEMORY READABLE')\n"
    "except OSError as exc:\n"
    "    print(f'denied errno {exc.errno}')\n"
)


def test_child_cannot_read_the_wrappers_memory(vault: VaultHandle) -> None:
    """Point 12: same uid (an unprivileged one: root could read anything), the child cannot
    open /proc/<ppid>/mem of the token holder: the wrapper is not dumpable."""
    assert SETPRIV, "setpriv (util-linux) is needed to run the wrapper as an unprivileged user"
    env = {**os.environ, **vault.task_env("finetune", FINETUNE_SECRETS)}
    result = subprocess.run([SETPRIV, "--reuid", "65534", "--regid", "65534", "--clear-groups", EXEC, "--", "/proc/self/exe", "-I", "-S", "-c", PEEK], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "denied errno 13"


def test_wrapper_ignores_proxy_and_ca_variables(vault: VaultHandle) -> None:
    """Point 16: proxy variables in the task environment do not route the wrapper's Vault
    traffic (here they point at a dead port; before, the login went there and failed)."""
    dead = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, **vault.task_env("finetune", FINETUNE_SECRETS), "HTTP_PROXY": dead, "http_proxy": dead, "ALL_PROXY": dead, "REQUESTS_CA_BUNDLE": "/nonexistent.pem"}
    result = _exec(env, "true")
    assert result.returncode == 0, result.stderr
