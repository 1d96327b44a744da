"""Compare two synthesized fleets offline: what a plan would destroy, replace or rename.

Pure functions over the parsed ``cdk.tf.json`` of each stack, so tests feed them JSON pairs
directly. A resource is *protected* when its type is one the plan gate protects, its base
configuration sets ``lifecycle.prevent_destroy``, or it is a reviewed import at the base.
Replacement follows the vendored ForceNew tables (``forcenew.py``): an attribute marked
``attribute`` forces replacement on any change (maps and lists of values included), a
``block`` when blocks are added or removed. Paths under the head's ``lifecycle.ignore_changes``
are not changes, as in terraform. Not modelled: a provider's CustomizeDiff and
DiffSuppressFunc, and values only known at apply time (a reference to a replaced resource).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any

from preview.forcenew import Rule, Tables
from safety import secret_scan
from safety.plan_gate import DEFAULT_PROTECTED_TYPES, bare_allow_message, split_allow

META_KEYS = frozenset({"//", "lifecycle", "depends_on", "provider", "count", "for_each", "provisioner", "connection"})
_MISSING: Any = object()


class Kind(StrEnum):
    DESTROYED = "destroyed"
    REPLACED = "replaced"
    RENAMED = "renamed"
    IMPORT_DROPPED = "import-dropped"


class ExitCode(IntEnum):
    """The plan gate's codes: 0 nothing changes, 3 changes none of them blocked, 4 blocked, 2 user error."""

    NO_CHANGES = 0
    USER_ERROR = 2
    CHANGES = 3
    BLOCKED = 4


@dataclass(frozen=True)
class AttrChange:
    path: str
    old: Any
    new: Any
    forces_replacement: bool
    rule: str = ""
    """Where the ForceNew flag was read (provider@tag:file:line), when it forces replacement."""


@dataclass(frozen=True)
class Finding:
    stack: str
    kind: Kind
    address: str
    type: str
    protected: bool
    why_protected: str
    allowed: bool = False
    changes: tuple[AttrChange, ...] = ()
    new_address: str | None = None
    advice: str = ""

    @property
    def blocking(self) -> bool:
        return self.protected and not self.allowed and self.kind in (Kind.DESTROYED, Kind.REPLACED, Kind.RENAMED)

    @property
    def qualified(self) -> str:
        return f"{self.stack}/{self.address}"


@dataclass(frozen=True)
class StackPreview:
    stack: str
    status: str
    """``added``, ``removed``, ``changed`` or ``unchanged``."""
    findings: tuple[Finding, ...] = ()
    created: int = 0
    updated_in_place: int = 0
    replaced: int = 0
    destroyed: int = 0
    no_table: tuple[str, ...] = ()
    """Types with in-place changes the ForceNew tables do not cover: replacement unknown."""


@dataclass(frozen=True)
class PreviewResult:
    stacks: tuple[StackPreview, ...]

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for s in self.stacks for f in s.findings)

    @property
    def blocking(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.blocking)

    @property
    def exit_code(self) -> ExitCode:
        if self.blocking:
            return ExitCode.BLOCKED
        if any(s.status != "unchanged" for s in self.stacks):
            return ExitCode.CHANGES
        return ExitCode.NO_CHANGES


# -- attribute diff ---------------------------------------------------------------------------

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _join(prefix: str, key: str) -> str:
    """``node_config.labels["gpufleet.dev/gpu-pool"]``: map keys that are not identifiers are quoted."""
    if _KEY.fullmatch(key):
        return f"{prefix}.{key}" if prefix else key
    return f"{prefix}[{json.dumps(key)}]"


def _norm(path: str) -> str:
    """The table's form of a path: list indexes and quoted map keys dropped."""
    return re.sub(r"\[(?:\d+|\"(?:[^\"\\]|\\.)*\")\]", "", path)


def _rule_for(rules: dict[str, Rule], path: str) -> Rule | None:
    """The rule forcing replacement for a value change at ``path``: its own, or a ForceNew map/list of values above it."""
    parts = _norm(path).split(".")
    for end in range(len(parts), 0, -1):
        rule = rules.get(".".join(parts[:end]))
        if rule is not None and rule.kind == "attribute":
            return rule
    return None


def _mask(path: str, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    field_name = _norm(path).rsplit(".", 1)[-1]
    if secret_scan.is_sensitive_field(field_name) and not secret_scan.is_reference(value):
        return f"(masked, {len(value)} chars)"
    found = secret_scan.check_string(value, field_name)
    return f"(masked: {found[1]})" if found else value


def _ignored(path: str, ignore: tuple[str, ...]) -> bool:
    norm = _norm(path)
    return any(norm == i or norm.startswith(i + ".") for i in ignore)


def attribute_changes(base: dict[str, Any], head: dict[str, Any], rules: dict[str, Rule] | None,
                      ignore: Iterable[str] = ()) -> tuple[AttrChange, ...]:
    """Every changed leaf between two resource configurations, with whether it forces replacement."""
    out: list[AttrChange] = []
    ignore_t = tuple(ignore)
    table = rules or {}

    def change(path: str, old: Any, new: Any, rule: Rule | None) -> None:
        if rule is not None and rule.optional_computed and new is _MISSING:
            rule = None  # optional+computed: dropped from the configuration, the provider keeps the prior value
        out.append(AttrChange(path, _mask(path, None if old is _MISSING else old), _mask(path, None if new is _MISSING else new),
                              rule is not None, rule.source if rule else ""))

    def is_block_list(value: Any) -> bool:
        return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)

    def walk(old: Any, new: Any, path: str) -> None:
        if path and _ignored(path, ignore_t):
            return
        old = _MISSING if old is None or old == [] or old == {} else old  # terraform: an empty block list or map is unset
        new = _MISSING if new is None or new == [] or new == {} else new
        block_rule = table.get(_norm(path))
        if isinstance(old, dict) or isinstance(new, dict) or is_block_list(old) or is_block_list(new):
            olds = [] if old is _MISSING or old is None else (old if isinstance(old, list) else [old])
            news = [] if new is _MISSING or new is None else (new if isinstance(new, list) else [new])
            if all(isinstance(v, dict) for v in [*olds, *news]):
                if len(olds) != len(news) and block_rule is not None and block_rule.kind == "block":
                    change(f"{path}.#", len(olds), len(news), block_rule)
                for index in range(max(len(olds), len(news))):
                    o = olds[index] if index < len(olds) else _MISSING
                    n = news[index] if index < len(news) else _MISSING
                    prefix = f"{path}[{index}]" if isinstance(old, list) or isinstance(new, list) else path
                    for key in sorted({*(o if o is not _MISSING else {}), *(n if n is not _MISSING else {})}):
                        walk(o.get(key, _MISSING) if o is not _MISSING else _MISSING,
                             n.get(key, _MISSING) if n is not _MISSING else _MISSING, _join(prefix, key))
                return
        if old != new:
            change(path, old, new, _rule_for(table, path))

    walk({k: v for k, v in base.items() if k not in META_KEYS}, {k: v for k, v in head.items() if k not in META_KEYS}, "")
    return tuple(out)


# -- per stack --------------------------------------------------------------------------------

def resources(stack: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """address -> (type, configuration) of every managed resource of a synthesized stack."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for rtype, by_name in sorted((stack.get("resource") or {}).items()):
        for name, body in sorted(by_name.items()):
            out[f"{rtype}.{name}"] = (rtype, body if isinstance(body, dict) else {})
    return out


def imports(stack: dict[str, Any]) -> frozenset[str]:
    return frozenset(i["to"] for i in stack.get("import") or () if isinstance(i, dict) and isinstance(i.get("to"), str))


def moves(stack: dict[str, Any]) -> dict[str, str]:
    """``moved`` blocks of the head: terraform renames the state entry, nothing is destroyed."""
    return {m["from"]: m["to"] for m in stack.get("moved") or () if isinstance(m, dict) and "from" in m and "to" in m}


def unmoved(value: Any, moved: dict[str, str]) -> Any:
    """``value`` with references to a moved resource spelled with its old address: after a ``moved``
    block, ``${<new address>.id}`` is the very value ``${<old address>.id}`` was, so a resource that
    only follows the move (an IAM member naming a moved secret) does not change."""
    if not moved:
        return value
    if isinstance(value, str):
        if "${" not in value:
            return value
        for old, new in moved.items():
            value = value.replace(f"{new}.", f"{old}.")
        return value
    if isinstance(value, dict):
        return {k: unmoved(v, moved) for k, v in value.items()}
    if isinstance(value, list):
        return [unmoved(v, moved) for v in value]
    return value


def _kept_moves(old: dict[str, tuple[str, dict[str, Any]]], new: dict[str, tuple[str, dict[str, Any]]], moved: dict[str, str],
                tables: Tables) -> dict[str, str]:
    """The moves whose resource keeps its identity. A moved resource that is also replaced gets a new id, so a
    resource referencing it really changes (a protected one naming it in a forcing attribute is replaced):
    its references keep their new spelling and the diff sees that change. Repeated until no move drops, as a
    move's own body may reference another, replaced one."""
    kept = dict(moved)
    while True:
        replaced = {
            source for source, target in kept.items() if source in old and target in new and any(
                c.forces_replacement for c in attribute_changes(old[source][1], unmoved(new[target][1], kept), tables.rules(old[source][0]),
                                                                _ignore_changes(new[target][1])))
        }
        if not replaced:
            return kept
        kept = {source: target for source, target in kept.items() if source not in replaced}


def _protection(address: str, rtype: str, body: dict[str, Any], imported: frozenset[str], protected_types: frozenset[str]) -> str:
    if address in imported:
        return "reviewed import"
    if rtype in protected_types:
        return "protected type"
    if (body.get("lifecycle") or {}).get("prevent_destroy") is True:
        return "prevent_destroy"
    return ""


def _ignore_changes(body: dict[str, Any]) -> tuple[str, ...]:
    value = (body.get("lifecycle") or {}).get("ignore_changes") or ()
    if value == "all" or value == ["all"]:
        return ("",)
    return tuple(str(v) for v in value)


def _name_pairs(old_address: str, new_address: str, old: dict[str, Any], new: dict[str, Any]) -> Iterator[tuple[str, str]]:
    if isinstance(old.get("name"), str) and isinstance(new.get("name"), str) and old["name"] != new["name"]:
        yield old["name"], new["name"]
    # the differing tokens of the two resource names (pool_h100 / pool_h200 -> h100 / h200), never a partial token
    a, b = (re.split(r"([_-])", x.split(".", 1)[1]) for x in (old_address, new_address))
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    old_part, new_part = "".join(a[start:len(a) - end]), "".join(b[start:len(b) - end])
    if old_part and new_part:
        yield old_part, new_part
        if "_" in old_part or "_" in new_part:  # construct IDs turn a name's hyphens into underscores
            yield old_part.replace("_", "-"), new_part.replace("_", "-")


def _is_rename(changes: tuple[AttrChange, ...], pairs: list[tuple[str, str]]) -> bool:
    """Every differing value is the old value with the old name replaced by the new one."""
    for old_name, new_name in pairs:
        if all(isinstance(c.old, str) and isinstance(c.new, str) and c.old.replace(old_name, new_name) == c.new for c in changes):
            return True
    return False


RENAME_FREE = ("nothing immutable changes (only the address{also}): add `moved {{ from = {old} to = {new} }}` (cdktf: `move_to`/`move_from`), or run "
               "`terraform state mv {old} {new}` before applying, and nothing is destroyed")
RENAME_COSTLY = ("the resource's own name changes too ({attrs} cannot change in place): terraform destroys {old} and creates "
                 "{new}; keep the old name to avoid it")


def preview_stack(name: str, base: dict[str, Any] | None, head: dict[str, Any] | None, tables: Tables,
                  protected_types: frozenset[str] = DEFAULT_PROTECTED_TYPES) -> StackPreview:
    """The findings of one stack; ``base`` None: the stack is new; ``head`` None: it was removed."""
    old = resources(base or {})
    new = resources(head or {})
    imported = imports(base or {})
    moved = moves(head or {})
    kept = _kept_moves(old, new, moved, tables)
    new = {address: (rtype, unmoved(body, kept)) for address, (rtype, body) in new.items()}
    findings: list[Finding] = []
    counts = {"created": 0, "updated_in_place": 0, "replaced": 0, "destroyed": 0}
    no_table: set[str] = set()

    def protection(address: str) -> str:
        rtype, body = old[address]
        return _protection(address, rtype, body, imported, protected_types)

    gone = [a for a in old if a not in new and moved.get(a) not in new]
    added = [a for a in new if a not in old and a not in moved.values()]
    for address in sorted(old):
        target = address if address in new else moved.get(address)
        if target not in new:
            continue
        rtype, body = old[address]
        head_body = new[target][1]
        rules = tables.rules(rtype)
        changes = attribute_changes(body, head_body, rules, _ignore_changes(head_body))
        if address in imported and target not in imports(head or {}):
            findings.append(Finding(name, Kind.IMPORT_DROPPED, address, rtype, False, "reviewed import",
                                    advice="the import record was removed while the resource stays: harmless once the import "
                                           "was applied; if it never was, the next plan creates a second resource"))
        if not changes:
            continue
        forcing = tuple(c for c in changes if c.forces_replacement)
        if forcing:
            counts["replaced"] += 1
            why = protection(address)
            findings.append(Finding(name, Kind.REPLACED, address, rtype, bool(why), why, changes=forcing,
                                    advice="keep the old value(s) of " + ", ".join(sorted({_norm(c.path) for c in forcing}))
                                           + " to update in place"))
        else:
            counts["updated_in_place"] += 1
            if rules is None:
                no_table.add(rtype)
    renamed: set[str] = set()
    for address in sorted(gone):
        rtype, body = old[address]
        for candidate in sorted(added):
            if candidate in renamed or new[candidate][0] != rtype:
                continue
            changes = attribute_changes(body, new[candidate][1], tables.rules(rtype), _ignore_changes(new[candidate][1]))
            if changes and not _is_rename(changes, list(_name_pairs(address, candidate, body, new[candidate][1]))):
                continue
            renamed.add(candidate)
            why = protection(address)
            forcing = sorted({_norm(c.path) for c in changes if c.forces_replacement})
            in_place = sorted({_norm(c.path) for c in changes if not c.forces_replacement})
            also = f"; {', '.join(in_place)} update in place" if in_place else ""
            advice = (RENAME_FREE if not forcing else RENAME_COSTLY).format(old=address, new=candidate, attrs=", ".join(forcing), also=also)
            findings.append(Finding(name, Kind.RENAMED, address, rtype, bool(why), why, changes=changes, new_address=candidate,
                                    advice=advice))
            break
        else:
            why = protection(address)
            findings.append(Finding(name, Kind.DESTROYED, address, rtype, bool(why), why,
                                    advice="stack removed: its resources stay in the cloud but leave CI; destroy or adopt them "
                                           "deliberately" if head is None else "restore it, or name it with --allow-destroy"))
        counts["destroyed"] += 1
    counts["created"] = len([a for a in added if a not in renamed]) + len(renamed)
    status = "added" if base is None else "removed" if head is None else (
        "changed" if findings or any(counts.values()) else "unchanged")
    return StackPreview(name, status, tuple(findings), no_table=tuple(sorted(no_table)), **counts)


def preview(base: dict[str, dict[str, Any]], head: dict[str, dict[str, Any]], tables: Tables, *,
            allow_destroy: Iterable[str] = (), protected_types: frozenset[str] = DEFAULT_PROTECTED_TYPES) -> PreviewResult:
    """Compare ``{stack: cdk.tf.json}`` maps; ``allow_destroy`` entries are ``<stack>/<address>``, as the plan gate's."""
    stacks = [preview_stack(s, base.get(s), head.get(s), tables, protected_types) for s in sorted({*base, *head})]
    allowed = _resolve_allows(tuple(allow_destroy), [f for s in stacks for f in s.findings if f.protected])
    result = []
    for s in stacks:
        findings = tuple(
            Finding(**{**f.__dict__, "allowed": True}) if f.qualified in allowed else f for f in s.findings
        )
        result.append(StackPreview(**{**s.__dict__, "findings": findings}))
    return PreviewResult(tuple(result))


class AllowError(ValueError):
    """An ``--allow-destroy`` without its stack, or one that names nothing destructive."""


def _resolve_allows(allows: tuple[str, ...], protected: list[Finding]) -> frozenset[str]:
    """The qualified findings the entries allow: each entry must be ``<stack>/<address>``.

    A bare address once matched a "fleet-unique" address; one flag then allowed whatever
    destroy of that address appeared in any stack later, so it is refused with the forms to use
    (the plan gate refuses it the same way).
    """
    destructive = [f for f in protected if f.kind in (Kind.DESTROYED, Kind.REPLACED, Kind.RENAMED)]
    resolved: set[str] = set()
    for allow in allows:
        if split_allow(allow) is None:
            raise AllowError(bare_allow_message(allow, [f.stack for f in destructive if f.address == allow]))
        matches = [f for f in destructive if f.qualified == allow]
        if not matches:
            known = ", ".join(sorted(f.qualified for f in destructive)) or "none"
            raise AllowError(f"--allow-destroy {allow} matches no destroyed, replaced or renamed protected resource "
                             f"(destructive findings: {known}); pass one of those or drop the flag")
        resolved.update(f.qualified for f in matches)
    return frozenset(resolved)
