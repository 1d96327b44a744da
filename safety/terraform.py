"""Run terraform init / plan / show in a synthesized stack directory.

The gate only trusts ``terraform show -json`` of a saved planfile: that is exactly what an apply
of the same planfile would do, unlike parsing the human plan output.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from clusters.errors import UserError
from clusters.source import did_you_mean
from clusters.termination import run_to_end

PLANFILE = "gpufleet.tfplan"
PLAN_JSON = "gpufleet.plan.json"
STACK_FILE = "cdk.tf.json"
LIFTED_PREFIX = ".gpufleet-allow-destroy-"
"""Prefix of the short-lived copy planned with ``prevent_destroy`` lifted (see ``lifted_copy``)."""

_BOX = " │╷╵\t"
_PREVENTED_ERROR = "Error: Instance cannot be destroyed"
_PREVENTED = re.compile(r"Resource (\S+) has lifecycle\.prevent_destroy set, but the plan calls for this resource to be destroyed")
_HUMAN_ACTION = re.compile(r"^\s*# (\S+) (must be replaced|will be destroyed)", re.MULTILINE)


class TerraformFailed(Exception):
    """terraform itself failed (provider, backend, config); carries its stderr for the operator."""

    def __init__(self, step: str, stderr: str, stdout: str = "") -> None:
        self.step = step
        self.stderr = stderr
        self.stdout = stdout
        super().__init__(f"terraform {step} failed: {headline(stderr or stdout)}")


@dataclass(frozen=True)
class PreventedDestroy:
    """A destroy terraform itself refused at plan time because the resource has ``lifecycle.prevent_destroy``."""

    address: str
    replace: bool


class DestroyPrevented(Exception):
    """terraform stopped the plan on ``prevent_destroy``: a blocked destroy, not a broken stack.

    Every protected resource in a synthesized stack carries ``prevent_destroy``, so for them
    terraform fails before a planfile exists; the gate still has to report *which* addresses
    would be destroyed (exit 4) instead of a generic terraform error (exit 1).
    """

    def __init__(self, prevented: tuple[PreventedDestroy, ...], output: str) -> None:
        self.prevented = prevented
        self.output = output
        super().__init__(f"terraform refused to destroy {', '.join(p.address for p in prevented)} (lifecycle.prevent_destroy)")


def prevented_destroys(stderr: str, stdout: str = "") -> tuple[PreventedDestroy, ...]:
    """The addresses of a plan that failed *only* on prevent_destroy; empty if any other error is present.

    terraform wraps the diagnostic text at ~78 columns, so lines are joined before matching; the
    action comes from the human plan terraform prints before the error (replace or delete).
    """
    lines = [line.strip(_BOX) for line in stderr.splitlines()]
    errors = [line for line in lines if line.startswith("Error:")]
    if not errors or any(line != _PREVENTED_ERROR for line in errors):
        return ()
    addresses = sorted(set(_PREVENTED.findall(" ".join(" ".join(lines).split()))))
    if len(addresses) != len(errors):
        return ()
    replaced = {address for address, action in _HUMAN_ACTION.findall(stdout) if action == "must be replaced"}
    return tuple(PreventedDestroy(address, address in replaced) for address in addresses)


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
    if not (directory / STACK_FILE).is_file():
        found = stacks_root.glob("*") if stacks_root.is_dir() else ()
        known = sorted(p.name for p in found if (p / STACK_FILE).is_file() and not p.name.startswith(LIFTED_PREFIX))
        listing = ", ".join(known) if known else "none"
        raise UserError(f"unknown stack {stack!r}{did_you_mean(stack, known)}; synthesized stacks in {stacks_root}: {listing}"
                        " (a cluster file added or renamed since: run `gpufleet synth` or `gpufleet check` first)")
    return directory


def _run(args: list[str], cwd: Path, step: str) -> str:
    env = dict(os.environ, TF_IN_AUTOMATION="1", TF_INPUT="0")
    # Not subprocess.run: a SIGTERM would SIGKILL terraform mid-plan and leave its state lock (termination.run_to_end).
    done = run_to_end(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise TerraformFailed(step, done.stderr, done.stdout)
    return done.stdout


def plan_json(directory: Path, *, lock: bool = True) -> Path:
    """init + plan -out + show -json in ``directory``; returns the written plan JSON path."""
    tf = terraform_binary()
    target = directory / PLAN_JSON
    target.unlink(missing_ok=True)
    _run([tf, "init", "-input=false", "-no-color"], directory, "init")
    try:
        _run([tf, "plan", "-input=false", "-no-color", f"-lock={str(lock).lower()}", f"-out={PLANFILE}"], directory, "plan")
    except TerraformFailed as exc:
        prevented = prevented_destroys(exc.stderr, exc.stdout)
        if prevented:
            raise DestroyPrevented(prevented, exc.stderr) from None
        raise
    shown = _run([tf, "show", "-json", "-no-color", PLANFILE], directory, "show")
    target.write_text(shown, encoding="utf-8")
    return target


def _resource_key(address: str) -> tuple[str, str] | None:
    """(type, name) of a root-module managed resource address, instance key dropped; None for modules and data."""
    parts = re.sub(r"\[[^\]]*\]$", "", address).split(".")
    if len(parts) != 2 or parts[0] in ("data", "module"):
        return None
    return parts[0], parts[1]


def prevent_destroy_addresses(directory: Path) -> frozenset[str]:
    """Addresses whose synthesized config sets ``lifecycle.prevent_destroy``: protected whatever their type."""
    data = json.loads((Path(directory) / STACK_FILE).read_text(encoding="utf-8"))
    return frozenset(
        f"{kind}.{name}"
        for kind, by_name in data.get("resource", {}).items()
        for name, body in by_name.items()
        if isinstance(body, dict) and (body.get("lifecycle") or {}).get("prevent_destroy") is True
    )


@contextmanager
def lifted_copy(directory: Path, addresses: Iterable[str]) -> Iterator[tuple[Path, frozenset[str]]]:
    """A copy of the stack dir with ``prevent_destroy`` set to false for exactly ``addresses``; yields (copy, lifted).

    The copy sits beside the original (same depth), so relative paths in the stack (a local
    backend, ``terraform_remote_state`` of a local state, assets) resolve the same; it shares
    the original's installed providers and is removed afterwards. The synthesized stack itself
    is never edited: applying the destroy still needs a reviewed change to the cluster file.
    When no address carries ``prevent_destroy`` the original directory is yielded unchanged.
    """
    directory = Path(directory)
    data = json.loads((directory / STACK_FILE).read_text(encoding="utf-8"))
    lifted: set[str] = set()
    for address in addresses:
        key = _resource_key(address)
        body = data.get("resource", {}).get(key[0], {}).get(key[1]) if key else None
        if isinstance(body, dict) and (body.get("lifecycle") or {}).get("prevent_destroy") is True:
            body["lifecycle"]["prevent_destroy"] = False
            lifted.add(address)
    if not lifted:
        yield directory, frozenset()
        return
    copy = Path(tempfile.mkdtemp(prefix=f"{LIFTED_PREFIX}{directory.name}-", dir=directory.parent))
    try:
        shutil.copytree(directory, copy, ignore=shutil.ignore_patterns(".terraform", PLANFILE, PLAN_JSON), symlinks=True, dirs_exist_ok=True)
        providers = directory / ".terraform" / "providers"
        if providers.is_dir():
            (copy / ".terraform").mkdir()
            (copy / ".terraform" / "providers").symlink_to(providers.resolve(), target_is_directory=True)
        (copy / STACK_FILE).write_text(json.dumps(data, indent=2), encoding="utf-8")
        yield copy, frozenset(lifted)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
