"""``gpufleet plan`` and ``gpufleet gate`` below the CLI: plan one synthesized stack with
terraform and gate the plan, or gate a plan made elsewhere.

A plan with ``--allow-destroy`` runs in a copy of the stack with ``prevent_destroy`` lifted for
exactly those addresses (``terraform.lifted_copy``); its plan JSON is copied back beside the
synthesized stack, which keeps ``prevent_destroy``. When terraform itself refuses the plan on a
protected resource, the refused addresses become a blocked result instead of an error.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from safety import imports, plan_gate, terraform


@dataclass(frozen=True)
class PlannedStack:
    result: plan_gate.GateResult
    note: str | None  # what --allow-destroy lifted, for the report and the summary


def gate(plan_path: Path, stack: str, allow: Iterable[str], extra_types: Iterable[str], extra_addresses: frozenset[str] = frozenset()) -> plan_gate.GateResult:
    """Classify a plan JSON; the stack's reviewed imports and ``extra_addresses`` are protected too."""
    protected_addresses = (frozenset(imports.load_imports(stack)) if stack else frozenset()) | extra_addresses
    return plan_gate.classify(
        plan_gate.load_plan(plan_path),
        path=plan_path,
        protected=plan_gate.protected_types(extra_types),
        protected_addresses=protected_addresses,
        stack=stack,
        allow_destroy=allow,
    )


def plan_stack(out_dir: Path, stack: str, *, allow_destroy: list[str], extra_types: list[str], lock: bool) -> PlannedStack:
    """terraform init + plan + show -json in the synthesized stack, then gate the plan.

    Raises terraform.TerraformFailed when terraform fails for another reason, UserError for an
    unknown stack.
    """
    directory = terraform.stack_dir(out_dir, stack)
    (directory / terraform.PLAN_JSON).unlink(missing_ok=True)
    addresses = plan_gate.scoped_allows(stack, allow_destroy)
    with terraform.lifted_copy(directory, addresses) as (planned, lifted):
        note = plan_gate.LIFTED_NOTE.format(addresses=", ".join(sorted(f"{stack}/{a}" for a in lifted))) if lifted else None
        try:
            plan_path = terraform.plan_json(planned, lock=lock)
        except terraform.DestroyPrevented as exc:
            return PlannedStack(plan_gate.prevented((p.address, p.replace) for p in exc.prevented), note)
        if planned != directory:
            plan_path = Path(shutil.copyfile(plan_path, directory / terraform.PLAN_JSON))
        return PlannedStack(gate(plan_path, stack, allow_destroy, extra_types, terraform.prevent_destroy_addresses(directory)), note)
