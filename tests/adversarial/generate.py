"""Generate bad-input cases by walking the pydantic schemas of cluster, job and role files.

For every field of the shipped examples (and every schema field the example leaves at its
default, where its parent section exists) five mutations: a wrong type, an out-of-range value,
a near-miss key, an empty value and an injection string. Each case says whether it must be
rejected or may be accepted (an optional field left empty, free text holding odd characters).
"""

from __future__ import annotations

import copy
import enum
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from ruamel.yaml import YAML

from clusters.schema import ClusterConfig
from clusters.source import format_path
from jobs.schema import JobFile
from vault_policies.roles import RoleModel

REPO = Path(__file__).resolve().parents[2]
CLASSES = ("wrong_type", "out_of_range", "near_miss_key", "empty", "injection")
INJECTION = 'x"; $(id) `id` ../../etc/passwd <script>'
# Fields whose values are free text for people (descriptions, reasons, commands): odd characters are
# data there, not a mistake; injection and over-long values may be accepted (issue 16 still refuses
# Terraform template sequences everywhere).
FREE_TEXT = {"description", "reason", "command", "args", "env", "zone_name", "display_name"}


@dataclass(frozen=True)
class Case:
    kind: str  # cluster | job | role
    klass: str
    path: tuple[str | int, ...]
    new_key: str | None  # near-miss: the key is renamed to this
    value: Any
    must_reject: bool

    @property
    def field(self) -> str:
        path = (*self.path[:-1], self.new_key) if self.new_key else self.path
        return format_path(path)

    @property
    def id(self) -> str:
        return f"{self.kind}:{self.klass}:{format_path(self.path)}"

    def apply(self, data: Any) -> Any:
        data = copy.deepcopy(data)
        node = data
        for part in self.path[:-1]:
            node = node[part]
        last = self.path[-1]
        if self.new_key is not None:
            node[self.new_key] = node.pop(last)
        else:
            node[last] = self.value
        return data


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(base type, optional?) of an annotation: Optional, Annotated and unions of one model peeled."""
    optional = False
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            optional = optional or len(args) < len(typing.get_args(annotation))
            if len(args) == 1:
                annotation = args[0]
            else:
                return annotation, optional
        else:
            return annotation, optional


def _metadata(field: FieldInfo) -> list[Any]:
    found = list(field.metadata)
    annotation = field.annotation
    while annotation is not None:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            found += list(typing.get_args(annotation)[1:])
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = args[0] if len(args) == 1 else None
        else:
            break
    for item in list(found):
        if isinstance(item, FieldInfo):
            found += list(item.metadata)
    return found


def _kind(base: Any) -> str:
    origin = typing.get_origin(base)
    if isinstance(base, type) and issubclass(base, BaseModel):
        return "model"
    if isinstance(base, type) and issubclass(base, enum.Enum) or origin is typing.Literal:
        return "choice"
    if origin in (tuple, list) or base in (tuple, list):
        return "list"
    if origin is dict or base is dict:
        return "dict"
    if base is bool:
        return "bool"
    if base is int:
        return "int"
    if base is float:
        return "float"
    if base is str:
        return "str"
    return "other"


def _wrong_type(kind: str) -> Any:
    return {"str": 12345, "int": "many", "float": "fast", "bool": "maybe", "list": "just-text", "dict": ["a", "b"],
            "model": "just-text", "choice": 7, "other": {"a": 1}}[kind]


def _out_of_range(kind: str, meta: list[Any], free: bool) -> tuple[Any, bool]:
    """(value, must_reject): past a declared bound, else a value no API takes (an over-long string)."""
    for item in meta:
        if isinstance(item, Le):
            return item.le + 1, True
        if isinstance(item, Lt):
            return item.lt, True
    for item in meta:
        if isinstance(item, Ge):
            return item.ge - 1, True
        if isinstance(item, Gt):
            return item.gt, True
    if kind == "str":
        limit = next((m.max_length for m in meta if isinstance(m, MaxLen)), None)
        return "x" * ((limit or 300) + 1), not free
    if kind in ("int", "float"):
        return -1, True
    if kind == "choice":
        return "not-a-choice", True
    if kind == "list":
        return ["x"] * 200, False
    return None, False


def _empty(kind: str) -> Any:
    return {"str": "", "list": [], "dict": {}}.get(kind)


def _near_miss(key: str) -> str:
    """The last two letters swapped (a typo); a doubled last letter ('access') loses one instead."""
    if len(key) <= 2:
        return key + "s"
    swapped = key[:-2] + key[-1] + key[-2]
    return swapped if swapped != key else key[:-1]


def _walk(model: type[BaseModel], data: Any, path: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], FieldInfo, Any]]:
    if not isinstance(data, dict):
        return
    for name, field in model.model_fields.items():
        yield (*path, name), field, data.get(name)
        base, _ = _unwrap(field.annotation)
        value = data.get(name)
        if _kind(base) == "model" and isinstance(value, dict):
            yield from _walk(base, value, (*path, name))
        elif _kind(base) == "list" and isinstance(value, list) and value:
            item, _ = _unwrap((typing.get_args(base) or (None,))[0])
            if _kind(item) == "model":
                yield from _walk(item, value[0], (*path, name, 0))
        elif _kind(base) == "other" and isinstance(value, dict):  # discriminated unions (state)
            for option in typing.get_args(base):
                option, _ = _unwrap(option)
                literal = option.model_fields.get("backend") if isinstance(option, type) and issubclass(option, BaseModel) else None
                if literal is not None and value.get("backend") in typing.get_args(_unwrap(literal.annotation)[0]):
                    yield from _walk(option, value, (*path, name))


def cases_for(kind: str, model: type[BaseModel], data: dict[str, Any], root: tuple[str | int, ...] = ()) -> list[Case]:
    out: list[Case] = []
    sub = data
    for part in root:
        sub = sub[part]
    for path, field, value in _walk(model, sub, root):
        base, optional = _unwrap(field.annotation)
        k = _kind(base)
        meta = _metadata(field)
        required = field.is_required()
        free = str(path[-1]) in FREE_TEXT
        present = value is not None or str(path[-1]) in _parent(sub, path, root)
        out.append(Case(kind, "wrong_type", path, None, _wrong_type(k), True))
        bad, reject = _out_of_range(k, meta, free)
        if bad is not None:
            out.append(Case(kind, "out_of_range", path, None, bad, reject))
        if present:
            out.append(Case(kind, "near_miss_key", path, _near_miss(str(path[-1])), None, True))
        empty = _empty(k)
        if empty is not None or required:
            empty_ok = not required and (optional or field.default in ("", (), [], {}, None) or free or k in ("list", "dict"))
            out.append(Case(kind, "empty", path, None, empty, not empty_ok))
        if k == "str" or (k == "choice" and not free):
            out.append(Case(kind, "injection", path, None, INJECTION, not free))
    return out


def _parent(data: Any, path: tuple[str | int, ...], root: tuple[str | int, ...]) -> dict[str, Any]:
    node = data
    for part in path[len(root):-1]:
        node = node[part]
    return node if isinstance(node, dict) else {}


def _example(path: Path) -> dict[str, Any]:
    return YAML(typ="safe").load(path.read_text())


def all_cases() -> list[tuple[str, dict[str, Any], Case]]:
    """(base file name, its example data, case) for every generated case."""
    out: list[tuple[str, dict[str, Any], Case]] = []
    for name in ("prod-gke", "prod-nomad", "dev-gke"):
        data = _example(REPO / "clusters" / f"{name}.yaml")
        out += [(name, data, c) for c in cases_for("cluster", ClusterConfig, data)]
    job = _example(REPO / "jobs" / "finetune-llama.yaml")
    out += [("finetune-llama", job, c) for c in cases_for("job", JobFile, job)]
    roles = _example(REPO / "vault_policies" / "roles.yaml")
    role = {**roles["roles"]["finetune"], "reason": "a reason long enough", "secret_id_bound_cidrs": ["10.0.0.0/16"], "token_period": "30m"}
    roles = {"roles": {**roles["roles"], "finetune": role}}
    out += [("roles", roles, c) for c in cases_for("role", RoleModel, roles, ("roles", "finetune"))]
    seen: set[str] = set()
    unique = []
    for base, data, case in out:  # the same schema field in two examples is one case
        key = f"{case.kind}:{case.klass}:{case.field}:{base if case.kind != 'cluster' else ''}"
        if case.kind == "cluster":
            key = f"{case.klass}:{format_path(tuple(p if isinstance(p, str) else 0 for p in case.path))}"
        if key not in seen:
            seen.add(key)
            unique.append((base, data, case))
    return unique
