"""The plan gate: classify every change in a terraform plan and refuse destroying protected resources.

A reserved H100 pool or a pinned static IP cannot be recreated by re-applying: the reservation
or the address is gone. So a plan that deletes or replaces a resource of a protected type (or a
reviewed import) is refused unless the operator names that exact address, scoped to its stack,
with ``--allow-destroy <stack>/<address>``: a bare address would allow the same address in every
stack planned with the same flags (issue 22), so it is refused with the form to use. The gate reads the JSON of ``terraform show -json <planfile>``, so it works
the same for plans made here, in CI or in Terraform Cloud.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any

from clusters.errors import UserError
from clusters.source import did_you_mean

DEFAULT_PROTECTED_TYPES: frozenset[str] = frozenset(
    {
        "google_container_cluster",
        "google_container_node_pool",
        "google_compute_region_instance_group_manager",
        "google_compute_instance_group_manager",
        "google_compute_address",
        "google_compute_global_address",
        "google_storage_bucket",
        "nomad_node_pool",
        "tfe_workspace",
    }
)
"""The one list of protected resource types. Extend it per run with ``--protected-type``; shrinking
it is a reviewed change to this constant, never a command-line flag."""


class Action(StrEnum):
    NO_OP = "no-op"
    READ = "read"
    CREATE = "create"
    UPDATE = "update"
    REPLACE = "replace"
    DELETE = "delete"
    FORGET = "forget"


DESTRUCTIVE = frozenset({Action.DELETE, Action.REPLACE})
COUNTED = (Action.CREATE, Action.UPDATE, Action.REPLACE, Action.DELETE, Action.FORGET)

_ACTIONS: dict[tuple[str, ...], Action] = {
    ("no-op",): Action.NO_OP,
    ("read",): Action.READ,
    ("create",): Action.CREATE,
    ("update",): Action.UPDATE,
    ("delete",): Action.DELETE,
    ("forget",): Action.FORGET,
    ("delete", "create"): Action.REPLACE,
    ("create", "delete"): Action.REPLACE,
}


class Status(StrEnum):
    NO_CHANGES = "no_changes"
    CHANGES = "changes"
    BLOCKED = "blocked"
    ERROR = "error"


class ExitCode(IntEnum):
    """Distinct per outcome so CI can branch on them; 2 is the CLI's code for any user error."""

    NO_CHANGES = 0
    TERRAFORM_FAILED = 1
    USER_ERROR = 2
    CHANGES = 3
    BLOCKED = 4


@dataclass(frozen=True)
class Change:
    address: str
    type: str
    action: Action
    protected: bool
    allowed: bool
    importing: bool
    reason: str | None

    @property
    def blocked(self) -> bool:
        return self.protected and self.action in DESTRUCTIVE and not self.allowed

    @property
    def is_change(self) -> bool:
        return self.importing or self.action not in (Action.NO_OP, Action.READ)


@dataclass(frozen=True)
class GateResult:
    changes: tuple[Change, ...]
    outputs_changed: int
    stopped_by_terraform: bool = False
    """terraform refused the plan on ``prevent_destroy``: only the blocked destroys are known, not the other changes."""

    @property
    def blocked(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.blocked)

    @property
    def status(self) -> Status:
        if self.blocked:
            return Status.BLOCKED
        if self.outputs_changed or any(c.is_change for c in self.changes):
            return Status.CHANGES
        return Status.NO_CHANGES

    @property
    def exit_code(self) -> ExitCode:
        return {Status.NO_CHANGES: ExitCode.NO_CHANGES, Status.CHANGES: ExitCode.CHANGES, Status.BLOCKED: ExitCode.BLOCKED}[
            self.status
        ]

    def counts(self) -> dict[str, dict[str, int]]:
        """Per resource type: how many of each counted action (and imports); types without changes left out."""
        table: dict[str, dict[str, int]] = {}
        for change in sorted(self.changes, key=lambda c: c.type):
            if not change.is_change:
                continue
            row = table.setdefault(change.type, {a.value: 0 for a in COUNTED} | {"import": 0, "blocked": 0})
            if change.action in COUNTED:
                row[change.action.value] += 1
            row["import"] += int(change.importing)
            row["blocked"] += int(change.blocked)
        return table


STOPPED_NOTE = (
    "terraform stopped this plan because it would destroy resources that set lifecycle.prevent_destroy; "
    "its other changes are unknown until it plans again (with --allow-destroy for addresses you mean to destroy)."
)
LIFTED_NOTE = (
    "planned with lifecycle.prevent_destroy lifted for {addresses} (--allow-destroy); the synthesized stack keeps "
    "prevent_destroy, so applying needs a reviewed change too (e.g. `protected: false` in the cluster file)."
)


_STACK = re.compile(r"^([a-z0-9][a-z0-9-]*)/(.+)$")


def split_allow(allow: str) -> tuple[str, str] | None:
    """(stack, address) of an ``--allow-destroy <stack>/<address>``; None for a bare address.

    Stack names are cluster names (lowercase letters, digits, hyphens), so the part before the
    first ``/`` of a bare address (``type.name["a/b"]``: it holds a dot) never reads as a stack.
    """
    match = _STACK.match(allow)
    return (match.group(1), match.group(2)) if match else None


def bare_allow_message(allow: str, stacks: Iterable[str] = ()) -> str:
    """The one refusal of a bare address, with the qualified form(s) to use instead."""
    forms = ", ".join(f"{s}/{allow}" for s in sorted(set(stacks))) or f"<stack>/{allow}"
    return (f"--allow-destroy {allow}: a bare address is refused (it would allow that address in every stack); "
            f"name its stack: --allow-destroy {forms}")


def scoped_allows(stack: str, allows: Iterable[str]) -> frozenset[str]:
    """The addresses of one stack's plan that ``--allow-destroy <stack>/<address>`` entries name.

    A bare address, an entry for another stack, or entries without a known stack (``gpufleet
    gate`` without ``--stack``) are user errors: the gate never guesses which stack is meant.
    """
    addresses: set[str] = set()
    for allow in allows:
        split = split_allow(allow)
        if split is None:
            raise UserError(bare_allow_message(allow, [stack] if stack else []))
        if not stack:
            raise UserError(f"--allow-destroy {allow}: the plan's stack is unknown; pass --stack {split[0]} so the gate "
                            "can check the entry names this plan's stack")
        if split[0] != stack:
            raise UserError(f"--allow-destroy {allow}: names stack {split[0]!r}, but this plan is of stack {stack!r}; "
                            f"pass {stack}/{split[1]} if that is meant, or drop the entry")
        addresses.add(split[1])
    return frozenset(addresses)


def protected_types(extra: Iterable[str] = ()) -> frozenset[str]:
    return DEFAULT_PROTECTED_TYPES | frozenset(extra)


def load_plan(path: Path) -> dict[str, Any]:
    """Read plan JSON; anything that is not a ``terraform show -json`` plan is a one-line user error."""
    path = Path(path)
    fix = "produce it with `terraform show -json <planfile> > plan.json`"
    if not path.is_file():
        raise UserError(f"{path}: plan JSON not found; {fix}")
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); {fix}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file (a binary planfile?); {fix}") from None
    if not isinstance(plan, dict) or "format_version" not in plan:
        raise UserError(f"{path}: not a terraform plan (no format_version); {fix}")
    if "planned_values" not in plan and "values" in plan:
        raise UserError(f"{path}: this is state JSON, not a plan; {fix}")
    if plan.get("errored"):
        raise UserError(f"{path}: terraform reported this plan as errored (incomplete); fix the plan errors and plan again")
    return plan


def _actions(path: Path, index: int, entry: Any) -> tuple[str, Action]:
    address = entry.get("address") if isinstance(entry, dict) else None
    change = entry.get("change") if isinstance(entry, dict) else None
    actions = change.get("actions") if isinstance(change, dict) else None
    if not isinstance(address, str) or not isinstance(actions, list) or not isinstance(entry.get("type"), str):
        raise UserError(f"{path}: resource_changes[{index}] lacks address/type/change.actions; {path.name} is not plan JSON")
    action = _ACTIONS.get(tuple(actions))
    if action is None:
        known = ", ".join(str(list(k)) for k in _ACTIONS)
        raise UserError(f"{path}: {address} has unknown actions {actions}; the gate knows {known}; upgrade gpufleet")
    return address, action


def classify(
    plan: dict[str, Any],
    *,
    path: Path,
    protected: frozenset[str] = DEFAULT_PROTECTED_TYPES,
    protected_addresses: frozenset[str] = frozenset(),
    stack: str = "",
    allow_destroy: Iterable[str] = (),
) -> GateResult:
    """Classify every resource change of ``stack``'s plan; ``allow_destroy`` holds ``<stack>/<address>``
    entries (``scoped_allows``), and one that matches no destroy is a user error (likely a typo)."""
    allows = scoped_allows(stack, allow_destroy)
    entries = plan.get("resource_changes", [])
    if not isinstance(entries, list):
        raise UserError(f"{path}: resource_changes is not a list; {path.name} is not plan JSON")
    changes: list[Change] = []
    for index, entry in enumerate(entries):
        address, action = _actions(path, index, entry)
        kind = entry["type"]
        is_protected = entry.get("mode", "managed") == "managed" and (kind in protected or address in protected_addresses)
        changes.append(
            Change(
                address=address,
                type=kind,
                action=action,
                protected=is_protected,
                allowed=address in allows,
                importing=bool(entry["change"].get("importing")),
                reason=entry.get("action_reason"),
            )
        )
    destroyable = {c.address for c in changes if c.protected and c.action in DESTRUCTIVE}
    unused = sorted(allows - destroyable)
    if unused:
        raise UserError(
            f"--allow-destroy {stack}/{unused[0]} matches no delete or replace of a protected resource in {path}"
            f"{did_you_mean(f'{stack}/{unused[0]}', {f'{stack}/{a}' for a in destroyable})}; pass the exact address from the plan "
            "or drop the flag"
        )
    outputs = plan.get("output_changes") or {}
    outputs_changed = sum(1 for o in outputs.values() if isinstance(o, dict) and o.get("actions") not in (["no-op"], None))
    return GateResult(changes=tuple(sorted(changes, key=lambda c: c.address)), outputs_changed=outputs_changed)


def _type_of(address: str) -> str:
    """Resource type of an address such as ``module.a.google_compute_address.ip["k"]``."""
    parts = [p for p in re.sub(r"\[[^\]]*\]", "", address).split(".") if p]
    return parts[-2] if len(parts) >= 2 else address


def prevented(destroys: Iterable[tuple[str, bool]]) -> GateResult:
    """The result for a plan terraform stopped on ``prevent_destroy``: each (address, is_replace) is blocked.

    terraform writes no planfile then, so the gate cannot see the rest of the plan; the
    operator learns which addresses to review (and may name with ``--allow-destroy``).
    """
    changes = tuple(
        Change(address=a, type=_type_of(a), action=Action.REPLACE if replace else Action.DELETE, protected=True, allowed=False, importing=False,
               reason="lifecycle.prevent_destroy")
        for a, replace in sorted(destroys)
    )
    return GateResult(changes=changes, outputs_changed=0, stopped_by_terraform=True)


def summary(stack: str, result: GateResult, *, note: str | None = None) -> dict[str, Any]:
    """The per-stack artifact CI collects; ``gpufleet ci comment`` reads exactly these keys (``note`` only when set)."""
    notes = [n for n in (STOPPED_NOTE if result.stopped_by_terraform else None, note) if n]
    return ({"note": " ".join(notes)} if notes else {}) | {
        "stack": stack,
        "status": result.status.value,
        "counts": result.counts(),
        "outputs_changed": result.outputs_changed,
        "blocked": [c.address for c in result.blocked],
        "changes": [
            {"address": c.address, "type": c.type, "action": c.action.value, "importing": c.importing, "blocked": c.blocked, "allowed": c.allowed}
            for c in result.changes
            if c.is_change
        ],
    }


def error_summary(stack: str, message: str) -> dict[str, Any]:
    return {"stack": stack, "status": Status.ERROR.value, "error": message}


def write_summary(path: Path, data: dict[str, Any]) -> None:
    from clusters import outputs

    outputs.write_file(path, json.dumps(data, indent=2, sort_keys=True) + "\n", option="--summary-out",
                       owned=outputs.json_with_keys("stack", "status"))
