"""Reading reviewed YAML files with line numbers, and turning pydantic errors into Problems.

Every loader (clusters, jobs, Vault roles) goes through here so that all of them report
``file:line: field.path: message`` the same way.
"""

from __future__ import annotations

import difflib
import re
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


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message(err: dict[str, Any], model: type[BaseModel], loc: FieldPath) -> str:
    """Every pydantic error in words: the value, what is allowed and the fix; never a regex or a class name."""
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx", {})
    if kind == "extra_forbidden":
        allowed = _allowed_fields(model, loc[:-1])
        hint = did_you_mean(str(loc[-1]), allowed)
        listed = f"; allowed: {', '.join(sorted(allowed))}" if allowed else ""
        return f"unknown field{hint}{listed}; remove or rename it"
    if kind == "missing":
        return "required field is missing; add it"
    if kind in ("literal_error", "enum"):
        return f"{_show(value)} is not allowed; allowed: {ctx.get('expected', '')}; pick one of those"
    if kind == "union_tag_invalid":
        return f"{_show(ctx.get('tag'))} is not allowed; allowed: {ctx.get('expected_tags', '')}; pick one of those"
    if kind == "union_tag_not_found":
        return f"needs {ctx.get('discriminator', 'a kind')}: one of the allowed kinds; add it"
    if kind == "value_error":
        return err["msg"].removeprefix("Value error, ")
    if kind == "string_pattern_mismatch":
        described = _field_description(model, loc)
        return f"{_show(value)} is not {described or 'in the format this field takes'}; write it that way"
    words = _WORDS.get(kind)
    if words is not None:
        return f"{_show(value)}: {words.format(**{k: v for k, v in ctx.items() if isinstance(v, (int, float, str))})}"
    # Unknown kinds: pydantic's sentence without class names ("instance of GpuPool").
    text = re.sub(r" or instance of \w+| of \w+ type", "", err["msg"])
    return f"{_show(value)}: {text[0].lower() + text[1:]}; fix the value"


_WORDS = {
    "bool_parsing": "expected true or false; write true or false",
    "bool_type": "expected true or false; write true or false",
    "int_parsing": "expected a whole number; write e.g. 4",
    "int_type": "expected a whole number; write e.g. 4",
    "int_from_float": "expected a whole number, not a fraction; write e.g. 4",
    "float_parsing": "expected a number; write e.g. 1.5",
    "float_type": "expected a number; write e.g. 1.5",
    "string_type": "expected text; write a quoted string",
    "tuple_type": "expected a list; write a YAML list, e.g. [a, b]",
    "list_type": "expected a list; write a YAML list, e.g. [a, b]",
    "dict_type": "expected a mapping; write key: value lines",
    "model_type": "expected a mapping of fields; write field: value lines",
    "model_attributes_type": "expected a mapping of fields; write field: value lines",
    "string_too_short": "too short; allowed: at least {min_length} characters; write a longer value",
    "string_too_long": "too long; allowed: at most {max_length} characters; shorten it",
    "too_short": "too few entries; allowed: at least {min_length}; add entries",
    "too_long": "too many entries; allowed: at most {max_length}; remove entries",
    "greater_than_equal": "too small; allowed: >= {ge}; raise the value",
    "greater_than": "too small; allowed: > {gt}; raise the value",
    "less_than_equal": "too large; allowed: <= {le}; lower the value",
    "less_than": "too large; allowed: < {lt}; lower the value",
    "finite_number": "expected a finite number; write e.g. 1.5",
}


def _field_description(model: type[BaseModel], loc: FieldPath) -> str | None:
    """``description`` of the field at ``loc`` (list indexes skipped): schemas describe pattern fields in words."""
    current: Any = model
    field = None
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return None
        current = _model_of(field.annotation)
    return field.description if field is not None else None


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


def _data_path(data: Any, loc: FieldPath) -> FieldPath:
    """``loc`` without the parts pydantic adds that are not keys of the file (the tag of a discriminated
    union: ``state.gcs.bucket`` is ``state.bucket`` in the YAML), so field names and lines match the file."""
    out: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        if isinstance(node, dict) and isinstance(part, str) and part not in node and i + 1 < len(loc) and loc[i + 1] in node:
            continue
        out.append(part)
        node = node.get(part) if isinstance(node, dict) else node[part] if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node) else None
    return tuple(out)


def problems_from_validation(doc: YamlDocument, model: type[BaseModel], exc: ValidationError) -> list[Problem]:
    """One Problem per pydantic error, located at the YAML line of the failing field."""
    errors = [(_data_path(doc.data, tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))), e)
              for e in exc.errors()]
    nested = {loc[:i] for loc, _ in errors for i in range(len(loc))}
    # A list whose items failed also reports "too short"; the item errors are the ones to fix.
    return [doc.problem(loc, _message(e, model, loc)) for loc, e in errors if not (e["type"] == "too_short" and loc in nested)]


def validate_document(doc: YamlDocument, model: type[M], context: dict[str, Any] | None = None) -> M:
    try:
        return model.model_validate(doc.data, context=context)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(doc, model, exc)) from None
