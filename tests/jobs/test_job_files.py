"""Bad job files: one Problem per mistake, at the right line and field, with the fix.

Each case writes the shipped example with one change, so a case tests exactly one rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clusters.errors import ConfigError
from jobs.loader import find, load, load_all

FAKE_HF = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2"
FAKE_OPENAI = "sk-" + "proj" + "a" * 20


def _set(path: tuple[Any, ...], value: Any) -> Callable[[Any], None]:
    def change(data: Any) -> None:
        node = data
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value

    return change


def _delete(path: tuple[Any, ...]) -> Callable[[Any], None]:
    def change(data: Any) -> None:
        node = data
        for part in path[:-1]:
            node = node[part]
        del node[path[-1]]

    return change


# (id, change, field shown in the message, regex the message must match)
BAD = [
    ("unknown-field", _set(("gpus",), 1), "gpus", r"unknown field \(did you mean 'gpu'\?\); allowed: .*remove or rename it"),
    ("missing-required", _delete(("max_run_hours",)), "max_run_hours", r"required field is missing; add it"),
    ("retries-negative", _set(("retries",), {"max_attempts": -1}), "retries.max_attempts", r"-1: too small; allowed: >= 0; raise the value"),
    ("retries-exit-code-0", _set(("retries",), {"on_exit_codes": [0]}), "retries.on_exit_codes[0]", r"0: too small; allowed: >= 1"),
    # gpufleet-exec's security exits (vault_policies/exec.py EXIT_INTERCEPTED 79, EXIT_REVOKED 80): a retry
    # would hand a fresh secret_id to a run whose wrap was intercepted or whose token an operator revoked.
    ("retries-interception-exit", _set(("retries",), {"on_exit_codes": [3, 79]}), "retries.on_exit_codes[1]",
     r"79 is gpufleet-exec's possible-interception exit.*allowed: any other code 1-255; remove it"),
    ("retries-revoked-exit", _set(("retries",), {"on_exit_codes": [80]}), "retries.on_exit_codes[0]",
     r"80 is gpufleet-exec's token-revoked exit.*allowed: any other code 1-255; remove it"),
    ("retries-typo", _set(("retries",), {"on_exit": [3]}), "retries.on_exit", r"unknown field \(did you mean 'on_exit_codes'\?\); allowed: max_attempts, on_exit_codes"),
    ("cluster-typo", _set(("cluster",), "prod-nomd"), "cluster", r"'prod-nomd' does not exist \(did you mean 'prod-nomad'\?\); allowed: dev-gke, prod-gke, prod-nomad"),
    ("gke-cluster-other-tenants", _set(("cluster",), "prod-gke"), "tenant", r"tenant 'finetune' does not exist in cluster prod-gke; allowed: applied, research"),
    ("multi-node-on-nomad", _set(("nodes",), 2), "nodes", r"2 nodes: multi-node runs are built on GKE only .* not on Nomad yet; set nodes: 1 or pick a GKE cluster: dev-gke, prod-gke"),
    ("cpu-cores-on-nomad", _set(("cpu_cores",), 8), "cpu_cores", r"cpu_cores is read on GKE only; Nomad reserves CPU in MHz"),
    ("image-unpinned", _set(("image",), "ghcr.io/acme/gpufleet-train"), "image", r"is not pinned: a rerun could train with another image; add a version tag or a digest"),
    ("image-latest", _set(("image",), "ghcr.io/acme/gpufleet-train:latest"), "image", r"is not pinned"),
    ("tenant-typo", _set(("tenant",), "fintune"), "tenant", r"tenant 'fintune' does not exist in cluster prod-nomad \(did you mean 'finetune'\?\); allowed: eval, finetune"),
    ("pool-missing", _set(("gpu", "pool"), "h100"), "gpu.pool", r"GPU pool 'h100' does not exist in cluster prod-nomad \(did you mean 'a100'\?\); allowed: a100, l4; pick one"),
    ("count-over-node", _set(("gpu", "count"), 4), "gpu.count", r"4 GPUs do not fit one node of pool a100 \(a2-highgpu-2g has 2\); allowed: 1..2"),
    ("memory-over-gpu", _set(("gpu", "min_memory_gib"), 80), "gpu.min_memory_gib", r"80 GiB is more than pool a100's GPU has: NVIDIA A100-SXM4-40GB reports 40960 MiB = 40.00 GiB to Nomad .*; allowed: <= 40"),
    ("model-mismatch", _set(("gpu", "model"), "H100"), "gpu.model", r"pattern 'H100' does not match pool a100's GPU model as NVML names it \('NVIDIA A100-SXM4-40GB'\).*e\.g\. 'A100-SXM4-40GB'"),
    ("model-bad-regex", _set(("gpu", "model"), "A100("), "gpu.model", r"is not a regular expression"),
    ("role-typo", _set(("secrets", "role"), "finetuning"), "secrets.role", r"Vault role 'finetuning' does not exist in vault_policies/roles.yaml \(did you mean 'finetune'\?\); allowed: eval, eval-dev, finetune"),
    ("path-not-readable", _set(("secrets", "env", "HF_TOKEN"), "ml-api-keys/openai#api_key"), "secrets.env.HF_TOKEN", r"ml-api-keys/openai is not readable by role finetune \(policies ml-keys-finetune\); readable: ml-api-keys/huggingface, ml-api-keys/wandb"),
    ("ref-without-key", _set(("secrets", "env", "HF_TOKEN"), "ml-api-keys/huggingface"), "secrets.env.HF_TOKEN", r"not a Vault reference \('ml-api-keys/huggingface'\); write <path under the secret/ mount>#<key>"),
    ("secret-literal-in-secrets", _set(("secrets", "env", "HF_TOKEN"), FAKE_HF), "secrets.env.HF_TOKEN", r"looks like the secret itself \(not shown\)"),
    ("secret-literal-in-env", _set(("env", "HF_HOME"), FAKE_OPENAI), "env.HF_HOME", r"looks like a credential \(not shown\); delete it from this file, rotate it"),
    ("secret-literal-in-args", _set(("args",), ["train.py", FAKE_HF]), "args[1]", r"looks like a credential \(not shown\)"),
    ("secret-name-in-env", _set(("env", "WANDB_API_KEY"), "x"), "env.WANDB_API_KEY", r"looks like a secret name; move it to secrets.env"),
    ("env-collides-with-secret", _set(("env", "HF_TOKEN"), "x"), "secrets.env.HF_TOKEN", r"HF_TOKEN is also set under env; a variable has one source"),
    ("env-shadows-platform", _set(("env", "NOMAD_JOB_ID"), "x"), "env.NOMAD_JOB_ID", r"is set by the platform"),
    ("env-proxy-for-the-wrapper", _set(("env", "HTTPS_PROXY"), "http://attacker.example:3128"), "env.HTTPS_PROXY", r"would be honoured by gpufleet-exec itself before its Vault login"),
    ("env-ca-bundle-for-the-wrapper", _set(("env", "REQUESTS_CA_BUNDLE"), "/tmp/attacker.pem"), "env.REQUESTS_CA_BUNDLE", r"would be honoured by gpufleet-exec itself"),
    ("env-pythonpath-for-the-wrapper", _set(("env", "PYTHONPATH"), "/tmp/evil"), "env.PYTHONPATH", r"would be honoured by gpufleet-exec itself"),
    ("env-ld-preload-for-the-wrapper", _set(("env", "LD_PRELOAD"), "/tmp/evil.so"), "env.LD_PRELOAD", r"would be honoured by gpufleet-exec itself"),
    ("secret-into-wrapper-variable", _set(("secrets", "env", "PYTHONSTARTUP"), "ml-api-keys/huggingface#token"), "secrets.env.PYTHONSTARTUP", r"secret env name 'PYTHONSTARTUP' is not allowed"),
    ("run-outlives-token", _set(("max_run_hours",), 30), "max_run_hours", r"30h outlives role finetune's token_max_ttl \(24h\).*allowed: <= 24"),
    ("duration-without-units", _set(("restart", "delay"), "30"), "restart.delay", r"'30' is not a duration; write seconds \(30\) or a string with units"),
    ("restart-mode", _set(("restart", "mode"), "retry"), "restart.mode", r"'retry' is not allowed; allowed: 'fail' or 'delay'"),
    ("meta-key-shape", _set(("meta_required",), ["Dataset-URI", "run_id"]), "meta_required[0]", r"meta key 'Dataset-URI' is not allowed"),
    ("meta-both-lists", _set(("meta_optional",), ["run_id"]), "meta_optional", r"'run_id' is also in meta_required"),
    ("meta-platform-prefix", _set(("meta_optional",), ["gpufleet_vault_role_id"]), "meta_optional[0]", r"uses the platform prefix 'gpufleet_'"),
    ("priority-range", _set(("priority",), 101), "priority", r"101: too large; allowed: <= 100; lower the value"),
    ("kill-timeout-too-long", _set(("kill_timeout",), "13h"), "kill_timeout", r"46800s is not shorter than max_run_hours \(12h\)"),
    ("restart-retries", _set(("restart", "attempts"), 1), "restart.attempts", r"^1 is not allowed; allowed: 0; a retried task would reuse the spent single-use secret_id; set attempts: 0 and re-dispatch a failed run with gpufleet jobs dispatch$"),
    ("restart-delay-mode", _set(("restart", "mode"), "delay"), "restart.mode", r"'delay' restarts the task after each interval; allowed: 'fail'; a retried task would reuse the spent single-use secret_id; set mode: fail"),
    ("reschedule-retries", _set(("reschedule", "attempts"), 2), "reschedule.attempts", r"^2 is not allowed; allowed: 0; a retried task would reuse the spent single-use secret_id; set attempts: 0 and re-dispatch"),
    ("reschedule-unlimited", _set(("reschedule", "unlimited"), True), "reschedule.unlimited", r"true is not allowed; allowed: false; .*set unlimited: false"),
    ("image-shape", _set(("image",), "Not An Image"), "image", r"'Not An Image' is not an image reference: a lowercase registry/path"),
]


@pytest.mark.parametrize(("change", "field", "message"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_fails_when_job_file_is_wrong(job_file: Callable[..., Path], cluster_configs: Any, vault_view: Any, change: Callable[[Any], None], field: str, message: str) -> None:
    path = job_file(change)
    with pytest.raises(ConfigError) as caught:
        load(path, cluster_configs=cluster_configs, vault=vault_view)
    matching = [p for p in caught.value.problems if p.field == field]
    assert matching, f"no problem at {field}: {[str(p) for p in caught.value.problems]}"
    problem = matching[0]
    assert problem.file == str(path)
    assert problem.line is not None and problem.line > 1 or field in ("max_run_hours", "gpus")
    assert len(str(problem).splitlines()) == 1
    assert str(problem).startswith(f"{path}:{problem.line}: {field}: ")
    assert re.search(message, problem.message), problem.message
    for literal in (FAKE_HF, FAKE_OPENAI):
        assert literal not in str(caught.value)


def test_fails_when_file_name_differs_from_job_name(job_file: Callable[..., Path], cluster_configs: Any, vault_view: Any) -> None:
    path = job_file(file_name="llama")
    with pytest.raises(ConfigError, match=r"llama.yaml:\d+: name: 'finetune-llama' must equal the file name 'llama'"):
        load(path, cluster_configs=cluster_configs, vault=vault_view)


def test_fails_when_yaml_is_broken(job_file: Callable[..., Path], cluster_configs: Any, vault_view: Any) -> None:
    path = job_file(text="name: x\ngpu: [unclosed\n")
    with pytest.raises(ConfigError, match=r"invalid YAML: .*; fix the syntax"):
        load(path, cluster_configs=cluster_configs, vault=vault_view)


def test_every_problem_of_a_file_is_reported_at_once(job_file: Callable[..., Path], cluster_configs: Any, vault_view: Any) -> None:
    def two_mistakes(data: Any) -> None:
        data["tenant"] = "nobody"
        data["secrets"]["role"] = "nobody"

    with pytest.raises(ConfigError) as caught:
        load(job_file(two_mistakes), cluster_configs=cluster_configs, vault=vault_view)
    assert {p.field for p in caught.value.problems} == {"tenant", "secrets.role"}


def test_fails_when_role_is_not_bound_to_the_jobs_cluster(job_file: Callable[..., Path], cluster_configs: Any, vault_view: Any) -> None:
    """A job on a cluster its role is not bound to would dispatch, then fail the Vault login
    (the role's secret_id/token CIDRs are the clusters' task ranges): refused at review."""
    import dataclasses

    roles = {**vault_view.roles, "finetune": dataclasses.replace(vault_view.roles["finetune"], clusters=("prod-gke",))}
    with pytest.raises(ConfigError, match=r"secrets\.role: role finetune is bound to the task addresses of clusters prod-gke, not prod-nomad: its tasks could not log in to Vault"):
        load(job_file(), cluster_configs=cluster_configs, vault=dataclasses.replace(vault_view, roles=roles))


def test_shipped_examples_load(cluster_configs: Any, vault_view: Any) -> None:
    specs = {s.name: s for s in load_all(cluster_configs=cluster_configs, vault=vault_view)}
    assert set(specs) == {"eval-judge", "eval-judge-flex", "finetune-llama", "finetune-llama-gke", "nccl-test-a3high", "nccl-test-a3mega"}
    llama = specs["finetune-llama"]
    assert (llama.cluster, llama.namespace, llama.pool.name, llama.gpu.count, llama.gpu.min_memory_gib, llama.vault_role) == ("prod-nomad", "finetune", "a100", 1, 40, "finetune")
    assert llama.secrets == (("HF_TOKEN", "ml-api-keys/huggingface#token"),)
    assert specs["eval-judge"].vault_role == "eval"


def test_retries_are_off_when_the_file_says_nothing(job_file: Callable[..., Path], cluster_configs: Any, vault_view: Any) -> None:
    def no_retry_sections(data: Any) -> None:
        del data["restart"], data["reschedule"]

    spec = load(job_file(no_retry_sections), cluster_configs=cluster_configs, vault=vault_view)
    assert (spec.restart.attempts, spec.restart.mode.value, spec.reschedule.attempts, spec.reschedule.unlimited) == (0, "fail", 0, False)


def test_fails_when_job_name_is_unknown() -> None:
    from clusters.errors import UserError

    with pytest.raises(UserError, match=r"no job 'finetune-lama' \(did you mean 'finetune-llama'\?\); allowed: eval-judge-flex, eval-judge, finetune-llama"):
        find("finetune-lama")
