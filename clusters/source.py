"""Reading reviewed YAML files with line numbers, and turning pydantic errors into Problems.

Every loader (clusters, jobs, Vault roles) goes through here so that all of them report
``file:line: field.path: message`` the same way.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from clusters.errors import ConfigError, Problem

FieldPath = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)


class YamlDocument:
    """Plain data of one YAML file plus the line of every key, for error messages."""

    def __init__(self, path: Path, raw: Any) -> None:
        self.path = path
        self.raw = raw
        self.data = _plain(raw)

    def line_of(self, field_path: Sequence[str | int]) -> int | None:
        """1-based line of the deepest node of ``field_path`` that exists in the file."""
        node, line = self.raw, 1
        for part in field_path:
            if isinstance(node, CommentedMap) and part in node:
                line = node.lc.key(part)[0] + 1
                node = node[part]
            elif isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node):
                line = node.lc.item(part)[0] + 1
                node = node[part]
            else:
                break
        return line

    def problem(self, field_path: Sequence[str | int], message: str) -> Problem:
        return Problem(str(self.path), self.line_of(field_path), format_path(field_path), message)


def _plain(node: Any) -> Any:
    if isinstance(node, CommentedMap):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, CommentedSeq):
        return [_plain(v) for v in node]
    return node


def format_path(field_path: Sequence[str | int]) -> str:
    out = ""
    for part in field_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def read_yaml(path: Path) -> YamlDocument:
    """Parse one file; a syntax error or a non-mapping top level is a ConfigError, not a traceback."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([Problem(str(path), None, "", f"cannot read file: {exc.strerror}")]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([Problem(str(path), None, "", f"not UTF-8 text (byte {exc.start}); save the file as UTF-8")]) from None
    try:
        raw = YAML(typ="rt").load(text)
    except MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else None
        raise ConfigError([Problem(str(path), line, "", f"invalid YAML: {exc.problem}; fix the syntax")]) from None
    except YAMLError as exc:  # e.g. ReaderError: control characters the YAML spec forbids
        raise ConfigError([Problem(str(path), None, "", f"invalid YAML: {str(exc).splitlines()[0]}; remove the offending characters")]) from None
    if not isinstance(raw, CommentedMap):
        raise ConfigError([Problem(str(path), 1, "", "top level must be a mapping of fields; see the examples beside it")])
    return YamlDocument(path, raw)


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(value), sorted(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _message(err: dict[str, Any], model: type[BaseModel], loc: FieldPath) -> str:
    kind, value = err["type"], err.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_fields(model, loc[:-1])
        hint = did_you_mean(str(loc[-1]), allowed)
        listed = f"; allowed: {', '.join(sorted(allowed))}" if allowed else ""
        return f"unknown field{hint}{listed}; remove or rename it"
    if kind == "missing":
        return "required field is missing; add it"
    if kind in ("literal_error", "enum"):
        expected = err.get("ctx", {}).get("expected", "")
        return f"{value!r} is not allowed; allowed: {expected}; pick one of those"
    text = err["msg"].removeprefix("Value error, ")
    if kind == "value_error":
        return text
    if kind in _FIXES:
        text = f"{text}; {_FIXES[kind]}"
    return f"{value!r}: {text}" if value is not None and not isinstance(value, (dict, list)) else text


_FIXES = {
    "bool_parsing": "write true or false",
    "bool_type": "write true or false",
    "int_parsing": "write a whole number",
    "int_type": "write a whole number",
    "string_type": "write a quoted string",
    "tuple_type": "write a YAML list, e.g. [a, b]",
    "dict_type": "write a mapping of key: value",
    "model_type": "write a mapping of fields",
    "string_pattern_mismatch": "see the examples in the same folder",
    "string_too_short": "write a longer value (a reason says why, in a sentence)",
    "too_short": "add at least one entry",
    "union_tag_invalid": "use one of those",
    "greater_than_equal": "raise the value",
    "less_than_equal": "lower the value",
}


def _allowed_fields(model: type[BaseModel], loc: FieldPath) -> list[str]:
    """Field names of the sub-model at ``loc``, by walking annotations; best effort for hints."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        current = _model_of(field.annotation)
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}))


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def problems_from_validation(doc: YamlDocument, model: type[BaseModel], exc: ValidationError) -> list[Problem]:
    """One Problem per pydantic error, located at the YAML line of the failing field."""
    errors = [(tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-"))), e) for e in exc.errors()]
    nested = {loc[:i] for loc, _ in errors for i in range(len(loc))}
    # A list whose items failed also reports "too short"; the item errors are the ones to fix.
    return [doc.problem(loc, _message(e, model, loc)) for loc, e in errors if not (e["type"] == "too_short" and loc in nested)]


def validate_document(doc: YamlDocument, model: type[M], context: dict[str, Any] | None = None) -> M:
    try:
        return model.model_validate(doc.data, context=context)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(doc, model, exc)) from None
