"""Device constraints compare against what the NVIDIA device plugin reports (NVML names, memory
in MiB), per GPU family in the machine table; ``check`` refuses what no GPU of the pool can meet.

The satisfiability check evaluates the rendered constraints with the Nomad API double's
feasibility code (regexp on ``${device.model}``, unit-aware ``>=`` on ``${device.attr.memory}``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from clusters.errors import ConfigError
from clusters.machines import NVML_GPUS
from jobs.nomad.client import NomadClient
from jobs.loader import find, load
from jobs.nomad.render import render
from jobs.spec import FinetuneSpec, GpuRequest
from tests.jobs.nomad_double import FakeNode, NomadDouble, _device_ok


@pytest.fixture(scope="module")
def llama() -> FinetuneSpec:
    return load(find("finetune-llama"))


def on_family(spec: FinetuneSpec, accelerator: str, gpu: GpuRequest) -> FinetuneSpec:
    pool = dataclasses.replace(spec.pool, accelerator=accelerator, nvml=NVML_GPUS[accelerator])
    return dataclasses.replace(spec, pool=pool, gpu=gpu)


def device_constraints(spec: FinetuneSpec) -> list[dict[str, str]]:
    (device,) = render(spec)["Job"]["TaskGroups"][0]["Tasks"][0]["Resources"]["Devices"]
    return device["Constraints"]


@pytest.mark.parametrize("accelerator", sorted(NVML_GPUS))
def test_each_family_satisfies_its_own_constraints_and_no_other_model_does(llama: FinetuneSpec, accelerator: str) -> None:
    nvml = NVML_GPUS[accelerator]
    spec = on_family(llama, accelerator, GpuRequest(1, nvml.memory_mib // 1024, None, None))
    node = FakeNode("n", "p", "p", nvml.nvml_name, nvml.memory_mib, 8)
    assert all(_device_ok(node, c) for c in device_constraints(spec)), device_constraints(spec)
    for other, other_gpu in NVML_GPUS.items():
        if other_gpu.nvml_name != nvml.nvml_name:
            assert not nvml.matches(other_gpu.nvml_name), f"{accelerator}'s pattern also selects {other}"
    # A vendor prefix change between driver releases does not unselect the pool.
    assert nvml.matches("NVIDIA " + nvml.nvml_name.split(" ", 1)[-1]) or nvml.matches(nvml.nvml_name)


def test_memory_is_rendered_in_mib(llama: FinetuneSpec) -> None:
    (model, memory, user_model) = device_constraints(llama)
    assert model == {"LTarget": "${device.model}", "Operand": "regexp", "RTarget": "A100-SXM4-40GB$"}
    assert memory == {"LTarget": "${device.attr.memory}", "Operand": ">=", "RTarget": "40960 MiB"}
    assert user_model["RTarget"] == "A100"


def test_fails_when_the_old_24_gib_l4_constraint_is_asked(job_file: Callable[..., Path]) -> None:
    def l4_24(data):
        data["tenant"] = "eval"
        data["secrets"] = {"role": "eval", "env": {"OPENAI_API_KEY": "ml-api-keys/openai#api_key"}}
        data["gpu"] = {"pool": "l4", "count": 1, "min_memory_gib": 24}

    with pytest.raises(ConfigError) as err:
        load(job_file(l4_24))
    (problem,) = [p for p in err.value.problems if p.field == "gpu.min_memory_gib"]
    assert "24 GiB is more than pool l4's GPU has: NVIDIA L4 reports 23034 MiB = 22.49 GiB to Nomad (marketed as 24 GB)" in str(problem)
    assert "allowed: <= 22" in str(problem)


def test_fails_when_memory_is_constrained_on_a_model_whose_nvml_value_is_unconfirmed(llama: FinetuneSpec) -> None:
    from jobs.checks import _gpu_fit
    from jobs.schema import JobFile

    b200 = dataclasses.replace(llama.pool, accelerator="nvidia-b200", gpus_per_node=8, nvml=NVML_GPUS["nvidia-b200"])
    job = JobFile.model_validate({**_job_dict(), "gpu": {"pool": "a100", "count": 1, "min_memory_gib": 100}})
    ((field, message),) = list(_gpu_fit(job, b200))
    assert field == ("gpu", "min_memory_gib") and "memory as NVML reports it is not confirmed" in message


def _job_dict() -> dict:
    from ruamel.yaml import YAML

    return YAML(typ="safe").load(find("finetune-llama").read_text())


def test_plan_places_eval_judge_on_an_l4_and_explains_the_old_constraint(client_for: Callable[..., NomadClient]) -> None:
    eval_judge = load(find("eval-judge"))
    nvml = NVML_GPUS["nvidia-l4"]
    double = NomadDouble([FakeNode("l4-0", "l4", "l4", nvml.nvml_name, nvml.memory_mib, 1)], acl_token="t").start()
    try:
        client = client_for(double)
        assert client.plan(eval_judge).placeable
        old = dataclasses.replace(eval_judge, gpu=dataclasses.replace(eval_judge.gpu, min_memory_gib=24))
        result = client.plan(old)
        assert not result.placeable
        assert result.reason == ("1 client in pool l4 cannot offer 1 GPU with >= 24 GiB at all (missing, unhealthy or not matching);"
                                 " check the clients' GPUs or the job's gpu section")
    finally:
        double.stop()


def test_every_gpu_of_the_machine_table_has_its_nvml_facts_and_source() -> None:
    from clusters.machines import MACHINE_GPUS, N1_ACCELERATOR

    for accelerator in {m.accelerator for m in MACHINE_GPUS.values()} | {N1_ACCELERATOR}:
        nvml = NVML_GPUS[accelerator]
        assert nvml.source and nvml.model_pattern and nvml.matches(nvml.nvml_name), accelerator
        assert nvml.memory_mib < 1024 * {m.accelerator: m.gpu_memory_gib for m in MACHINE_GPUS.values()}.get(accelerator, 16) * 1.1
