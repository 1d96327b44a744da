"""Run terraform init / plan / show in a synthesized stack directory.

The gate only trusts ``terraform show -json`` of a saved planfile: that is exactly what an apply
of the same planfile would do, unlike parsing the human plan output.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from clusters.errors import UserError
from clusters.source import did_you_mean

PLANFILE = "gpufleet.tfplan"
PLAN_JSON = "gpufleet.plan.json"


class TerraformFailed(Exception):
    """terraform itself failed (provider, backend, config); carries its stderr for the operator."""

    def __init__(self, step: str, stderr: str) -> None:
        self.step = step
        self.stderr = stderr
        super().__init__(f"terraform {step} failed: {headline(stderr)}")


def headline(output: str) -> str:
    """terraform's first ``Error:`` line without its box drawing (the summary and PR comment show one line)."""
    lines = [line.strip(" │╷╵\t") for line in output.splitlines()]
    errors = [line for line in lines if line.startswith("Error:")]
    return errors[0] if errors else next((line for line in reversed(lines) if line), "no output")


def terraform_binary() -> str:
    found = shutil.which("terraform")
    if found is None:
        raise UserError("terraform not found on PATH; install terraform 1.11 (https://developer.hashicorp.com/terraform/install)")
    return found


def stack_dir(out_dir: Path, stack: str) -> Path:
    """The synthesized directory of one stack; an unknown stack names the ones that exist."""
    stacks_root = Path(out_dir) / "stacks"
    directory = stacks_root / stack
    if not (directory / "cdk.tf.json").is_file():
        known = sorted(p.name for p in stacks_root.glob("*") if (p / "cdk.tf.json").is_file()) if stacks_root.is_dir() else []
        listing = ", ".join(known) if known else "none (run `gpufleet synth` first)"
        raise UserError(f"unknown stack {stack!r}{did_you_mean(stack, known)}; synthesized stacks in {stacks_root}: {listing}")
    return directory


def _run(args: list[str], cwd: Path, step: str) -> str:
    env = dict(os.environ, TF_IN_AUTOMATION="1", TF_INPUT="0")
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise TerraformFailed(step, done.stderr or done.stdout)
    return done.stdout


def plan_json(directory: Path, *, lock: bool = True) -> Path:
    """init + plan -out + show -json in ``directory``; returns the written plan JSON path."""
    tf = terraform_binary()
    _run([tf, "init", "-input=false", "-no-color"], directory, "init")
    _run([tf, "plan", "-input=false", "-no-color", f"-lock={str(lock).lower()}", f"-out={PLANFILE}"], directory, "plan")
    shown = _run([tf, "show", "-json", "-no-color", PLANFILE], directory, "show")
    target = directory / PLAN_JSON
    target.write_text(shown, encoding="utf-8")
    return target
