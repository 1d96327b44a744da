"""Rendered Nomad JSON: byte-stable goldens, only fields Nomad's API knows, no key material.

Goldens live in tests/jobs/golden/. After an intended change, regenerate them with
``.venv/bin/python -c "import jobs.loader as l, jobs.nomad.render as r; from pathlib import Path;
[Path(f'tests/jobs/golden/{s.name}.json').write_text(r.to_json(r.render(s))) for s in l.load_all()]"``
and review the diff.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobs.loader import load_all
from jobs.local import task_environment
from jobs.nomad.render import ENV_ROLE_ID, ENV_SECRETS, ENV_WRAPPED_SECRET_ID, placement_probe, render, to_json, write_job
from jobs.spec import FinetuneSpec

GOLDEN = Path(__file__).parent.parent / "golden"

# Field names per object, from Nomad's documented job JSON (api/jobs.go, api/tasks.go,
# api/resources.go, api/constraint.go; developer.hashicorp.com/nomad/api-docs/json-jobs).
# Values: the object kind a field holds ("str", "int", "bool", "strs", "map" = string map,
# "config" = driver config), or another object's name; "[X]" is a list of X.
NOMAD_FIELDS: dict[str, dict[str, str]] = {
    "Root": {"Job": "Job"},
    "Job": {
        "Region": "str", "Namespace": "str", "ID": "str", "Name": "str", "Type": "str", "Priority": "int", "AllAtOnce": "bool",
        "Datacenters": "strs", "NodePool": "str", "Constraints": "[Constraint]", "Affinities": "[Affinity]", "TaskGroups": "[TaskGroup]",
        "Update": "obj", "Multiregion": "obj", "Spreads": "obj", "Periodic": "obj", "ParameterizedJob": "ParameterizedJob",
        "Reschedule": "ReschedulePolicy", "Migrate": "obj", "Meta": "map", "UI": "obj", "ConsulToken": "str", "VaultToken": "str",
    },
    "ParameterizedJob": {"Payload": "str", "MetaRequired": "strs", "MetaOptional": "strs"},
    "TaskGroup": {
        "Name": "str", "Count": "int", "Constraints": "[Constraint]", "Affinities": "[Affinity]", "Tasks": "[Task]", "Spreads": "obj",
        "Volumes": "obj", "RestartPolicy": "RestartPolicy", "Disconnect": "obj", "ReschedulePolicy": "ReschedulePolicy",
        "EphemeralDisk": "EphemeralDisk", "Update": "obj", "Migrate": "obj", "Networks": "obj", "Meta": "map", "Services": "obj",
        "ShutdownDelay": "int", "MaxRunDuration": "int", "StopAfterClientDisconnect": "int", "MaxClientDisconnect": "int",
        "Scaling": "obj", "Consul": "obj", "PreventRescheduleOnLost": "bool",
    },
    "Task": {
        "Name": "str", "Driver": "str", "User": "str", "Lifecycle": "obj", "Config": "DockerConfig", "Constraints": "[Constraint]",
        "Affinities": "[Affinity]", "Env": "map", "Services": "obj", "Resources": "Resources", "RestartPolicy": "RestartPolicy",
        "Meta": "map", "KillTimeout": "int", "LogConfig": "obj", "Artifacts": "obj", "Vault": "obj", "Consul": "obj", "Templates": "obj",
        "DispatchPayload": "obj", "VolumeMounts": "obj", "Leader": "bool", "ShutdownDelay": "int", "KillSignal": "str", "Kind": "str",
        "ScalingPolicies": "obj", "Identity": "obj", "Identities": "obj", "Actions": "obj", "Schedule": "obj",
    },
    "Resources": {"CPU": "int", "Cores": "int", "MemoryMB": "int", "MemoryMaxMB": "int", "DiskMB": "int", "Networks": "obj", "Devices": "[RequestedDevice]", "NUMA": "obj", "SecretsMB": "int"},
    "RequestedDevice": {"Name": "str", "Count": "int", "Constraints": "[Constraint]", "Affinities": "[Affinity]"},
    "Constraint": {"LTarget": "str", "RTarget": "str", "Operand": "str"},
    "Affinity": {"LTarget": "str", "RTarget": "str", "Operand": "str", "Weight": "int"},
    "RestartPolicy": {"Interval": "int", "Attempts": "int", "Delay": "int", "Mode": "str", "RenderTemplates": "bool"},
    "ReschedulePolicy": {"Attempts": "int", "Interval": "int", "Delay": "int", "DelayFunction": "str", "MaxDelay": "int", "Unlimited": "bool"},
    "EphemeralDisk": {"Sticky": "bool", "Migrate": "bool", "SizeMB": "int"},
    # The docker driver's task config (lower-case keys, documented by the driver).
    "DockerConfig": {"image": "str", "command": "str", "args": "strs", "entrypoint": "strs", "work_dir": "str", "auth_soft_fail": "bool"},
}
# Nomad reads every duration as integer nanoseconds.
DURATION_FIELDS = {"Delay", "Interval", "MaxDelay", "KillTimeout", "MaxRunDuration", "ShutdownDelay"}


def _check(value: Any, kind: str, where: str, errors: list[str]) -> None:
    if kind.startswith("["):
        if not isinstance(value, list):
            errors.append(f"{where}: expected a list")
            return
        for i, item in enumerate(value):
            _check(item, kind[1:-1], f"{where}[{i}]", errors)
        return
    if kind in NOMAD_FIELDS:
        if not isinstance(value, dict):
            errors.append(f"{where}: expected an object")
            return
        for key, item in value.items():
            if key not in NOMAD_FIELDS[kind]:
                errors.append(f"{where}.{key}: not a field of Nomad's {kind}")
            else:
                _check(item, NOMAD_FIELDS[kind][key], f"{where}.{key}", errors)
                if key in DURATION_FIELDS and not (isinstance(item, int) and item >= 1_000_000):
                    errors.append(f"{where}.{key}: durations are integer nanoseconds, got {item!r}")
        return
    ok = {
        "str": lambda v: isinstance(v, str),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "strs": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        "map": lambda v: isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()),
    }.get(kind)
    if ok is None:
        errors.append(f"{where}: the renderer emits {kind!r}, which this test has no field list for; add one from Nomad's docs")
    elif not ok(value):
        errors.append(f"{where}: expected {kind}, got {value!r}")


def nomad_field_errors(job: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    _check(job, "Root", "", errors)
    return errors


@pytest.fixture(scope="module")
def specs() -> dict[str, FinetuneSpec]:
    return {s.name: s for s in load_all()}


@pytest.mark.parametrize("name", ["finetune-llama", "eval-judge"])
def test_rendered_job_matches_golden(specs: dict[str, FinetuneSpec], name: str) -> None:
    assert to_json(render(specs[name])) == (GOLDEN / f"{name}.json").read_text()


@pytest.mark.parametrize("name", ["finetune-llama", "eval-judge"])
def test_every_rendered_key_is_a_nomad_api_field(specs: dict[str, FinetuneSpec], name: str) -> None:
    job = render(specs[name])
    assert nomad_field_errors(job) == []
    assert nomad_field_errors(placement_probe(job)) == []


def test_fails_when_renderer_emits_a_field_nomad_does_not_know() -> None:
    """The allow-list check itself must catch typos (e.g. 'MaxRunDurations') and wrong units."""
    bad = {"Job": {"ID": "x", "TaskGroups": [{"Name": "g", "MaxRunDurations": 1, "RestartPolicy": {"Delay": 30}}]}}
    assert nomad_field_errors(bad) == [
        ".Job.TaskGroups[0].MaxRunDurations: not a field of Nomad's TaskGroup",
        ".Job.TaskGroups[0].RestartPolicy.Delay: durations are integer nanoseconds, got 30",
    ]


def test_job_is_parameterized_batch_pinned_to_the_pool(specs: dict[str, FinetuneSpec]) -> None:
    job = render(specs["finetune-llama"])["Job"]
    group = job["TaskGroups"][0]
    task = group["Tasks"][0]
    assert (job["Type"], job["NodePool"], job["Namespace"]) == ("batch", "a100", "finetune")
    assert group["Constraints"] == [{"LTarget": "${node.class}", "Operand": "=", "RTarget": "a100"}]
    assert task["Resources"]["Devices"] == [{
        "Name": "nvidia/gpu",
        "Count": 1,
        "Constraints": [
            {"LTarget": "${device.model}", "Operand": "regexp", "RTarget": "A100-SXM4-40GB$"},
            {"LTarget": "${device.attr.memory}", "Operand": ">=", "RTarget": "40960 MiB"},
            {"LTarget": "${device.model}", "Operand": "regexp", "RTarget": "A100"},
        ],
    }]
    assert job["ParameterizedJob"]["MetaRequired"] == ["dataset_uri", "gpufleet_attempt", "gpufleet_experiment", "gpufleet_vault_role_id",
                                                       "gpufleet_vault_wrapped_secret_id", "run_id"]
    assert job["Meta"]["gpufleet_vault_role"] == "finetune"
    assert task["Config"]["command"] == "gpufleet-exec" and task["Config"]["args"][:2] == ["--", "python"]
    assert task["Env"][ENV_ROLE_ID] == "${NOMAD_META_gpufleet_vault_role_id}"
    assert task["Env"][ENV_WRAPPED_SECRET_ID] == "${NOMAD_META_gpufleet_vault_wrapped_secret_id}"
    assert task["Env"]["GPUFLEET_ATTEMPT"] == "${NOMAD_META_gpufleet_attempt}"  # dispatch meta: which attempt of the experiment
    assert task["Env"][ENV_SECRETS] == "HF_TOKEN=ml-api-keys/huggingface#token"
    assert "MaxRunDuration" not in group  # api.TaskGroup has it only from Nomad 2.0.3; the fleet runs 1.10
    assert task["KillTimeout"] == 120 * 10**9
    assert (task["Env"]["GPUFLEET_MAX_RUN_SECONDS"], task["Env"]["GPUFLEET_KILL_GRACE_SECONDS"]) == ("43200", "120")


def test_rendered_env_is_what_gpufleet_exec_reads(specs: dict[str, FinetuneSpec], tmp_path: Path) -> None:
    """The task env, interpolated as a Nomad client would, parses on the gpufleet-exec side."""
    from vault_policies.client import TaskConfig
    from vault_policies.exec import run_limits

    meta = {"dataset_uri": "hf://d/x@v1", "run_id": "r1", "gpufleet_vault_role_id": "rid", "gpufleet_vault_wrapped_secret_id": "wrap"}
    env = task_environment(specs["eval-judge"], meta, job_id="eval-judge/dispatch-1-ab", alloc_id="0123456789ab", alloc_root=tmp_path, environ={"VAULT_ADDR": "http://127.0.0.1:8200"})
    config = TaskConfig.from_env(env)
    assert (config.role_id, config.wrapping_token, [r.env_name for r in config.secrets]) == ("rid", "wrap", ["OPENAI_API_KEY"])
    assert run_limits(env) == (2 * 3600, 30)


def test_rendered_json_holds_no_key_material(specs: dict[str, FinetuneSpec]) -> None:
    from tests.openbao_fixture import FAKE_KEYS

    text = "".join(to_json(render(s)) for s in specs.values())
    for data in FAKE_KEYS.values():
        for value in data.values():
            assert value not in text
    assert "HF_TOKEN=" in text and "VAULT_TOKEN" not in text


def test_write_is_atomic_and_deterministic(specs: dict[str, FinetuneSpec], tmp_path: Path) -> None:
    spec = specs["finetune-llama"]
    first = write_job(spec, tmp_path).read_bytes()
    second = write_job(spec, tmp_path).read_bytes()
    assert first == second == to_json(render(spec)).encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".gpufleet-output", "finetune-llama.json"]
    assert json.loads(first)["Job"]["ID"] == "finetune-llama"


def test_fails_when_write_is_interrupted_and_keeps_the_old_file(specs: dict[str, FinetuneSpec], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = specs["finetune-llama"]
    target = write_job(spec, tmp_path)
    old = target.read_bytes()

    def broken(_: Any) -> str:
        raise OSError("disk full")

    monkeypatch.setattr("jobs.nomad.render.to_json", broken)
    with pytest.raises(OSError, match="disk full"):
        write_job(spec, tmp_path)
    assert target.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == [".gpufleet-output", "finetune-llama.json"]


def test_placement_probe_is_the_same_job_without_parameters(specs: dict[str, FinetuneSpec]) -> None:
    job = render(specs["finetune-llama"])
    probe = placement_probe(job)
    assert "ParameterizedJob" not in probe["Job"]
    assert {k: v for k, v in job["Job"].items() if k != "ParameterizedJob"} == probe["Job"]
