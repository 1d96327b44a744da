"""Real terraform plans of the built-in ``terraform_data`` resource, made once per session.

terraform_data needs no provider download, so these are genuine ``terraform show -json``
plans: the gate is exercised on exactly the JSON terraform writes, not on a hand-made copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

BASE = {
    "pool": {"input": "v1", "triggers_replace": ["t1"]},
    "ip": {"input": "10.0.0.1"},
}


def config(resources: dict) -> dict:
    return {"resource": {"terraform_data": resources}}


VARIANTS = {
    "noop": BASE,
    "replace": BASE | {"pool": {"input": "v1", "triggers_replace": ["t2"]}},
    "delete": {"pool": BASE["pool"]},
    "update": BASE | {"pool": {"input": "v2", "triggers_replace": ["t1"]}},
    "create": BASE | {"new": {"input": "n"}},
}


def _terraform() -> str:
    found = shutil.which("terraform")
    if found is None:
        pytest.fail("terraform is not on PATH; the plan gate tests need terraform 1.11 (no provider download)")
    return found


def tf(directory: Path, *args: str) -> str:
    env = dict(os.environ, TF_IN_AUTOMATION="1", TF_INPUT="0")
    done = subprocess.run([_terraform(), *args, "-no-color"], cwd=directory, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def applied_dir(directory: Path) -> Path:
    """A working dir whose local state holds the BASE resources."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cdk.tf.json").write_text(json.dumps(config(BASE)))
    tf(directory, "init", "-input=false")
    tf(directory, "apply", "-auto-approve", "-input=false")
    return directory


@pytest.fixture(scope="session")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """variant name -> plan JSON path, all planned against the same applied state."""
    work = applied_dir(tmp_path_factory.mktemp("tfwork"))
    out: dict[str, Path] = {}
    for name, resources in VARIANTS.items():
        (work / "cdk.tf.json").write_text(json.dumps(config(resources)))
        tf(work, "plan", "-input=false", f"-out={name}.tfplan")
        target = work / f"{name}.plan.json"
        target.write_text(tf(work, "show", "-json", f"{name}.tfplan"))
        out[name] = target
    return out


@pytest.fixture(scope="session")
def stack_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthesized-looking out dir: stacks/demo/cdk.tf.json applied, then edited to replace terraform_data.pool."""
    out = tmp_path_factory.mktemp("cdktf.out")
    demo = applied_dir(out / "stacks" / "demo")
    (demo / "cdk.tf.json").write_text(json.dumps(config(VARIANTS["replace"])))
    return out
