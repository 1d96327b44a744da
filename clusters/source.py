"""Reading reviewed YAML files with line numbers, and turning pydantic errors into Problems.

Every loader (clusters, jobs, Vault roles) goes through here so that all of them report
``file:line: field.path: message`` the same way.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq, TaggedScalar
from ruamel.yaml.constructor import ConstructorError, DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import (AliasEvent, MappingEndEvent, MappingStartEvent, ScalarEvent, SequenceEndEvent,
                                  SequenceStartEvent)

from clusters import repo, yaml_fast
from clusters.errors import ConfigError, Problem
from clusters.secrets import Hit, detect

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


def _repository(directory: Path) -> Path:
    """The gpufleet repository (``clusters.repo.is_repo``) or else git checkout enclosing ``directory``
    as written, before symlinks are resolved (a symlinked ``clusters/`` must not move the root); else
    ``directory`` itself."""
    for candidate in (directory, *directory.parents):
        if repo.is_repo(candidate) or (candidate / ".git").exists():
            return candidate.resolve()
    return directory.resolve()


def _outside_repository(path: Path) -> Problem | None:
    """A reviewed file that is (or sits behind) a symlink leaving the repository is not reviewed content."""
    root = _repository(path.absolute().parent)
    target = path.resolve()
    if target.is_relative_to(root):
        return None
    return Problem(str(path), None, "", f"is a symlink to {target}, outside the repository {root}; reviewed files must live in"
                   " the repository: copy the file in (so the change is reviewed) or delete the link")


# Anchors, aliases and '<<' merges are ordinary YAML and keep long files short, so they are allowed;
# what is bounded is what they expand to. The "billion laughs" bomb (9 levels of 9 aliases, under 500
# bytes) expands to ~387 million nodes; the example fleet's files have a few hundred nodes each.
MAX_EXPANDED_NODES = 10_000
MAX_ALIAS_DEPTH = 5


def _expansion(path: Path, text: str) -> Problem | None:
    """Count, from the parser's events and without building anything, how many nodes the document holds
    once every alias is expanded, and how deep aliases reach into aliases; past either bound the file is
    refused at the alias that crossed it. Parsing events costs as much as loading, so a file without '&'
    or '*' skips it."""
    if "&" not in text and "*" not in text:
        return None
    sizes: dict[str, tuple[int, int]] = {}  # anchor -> (expanded nodes, alias depth inside it)
    open_nodes: list[list] = [[None, 0, 0]]  # [anchor, expanded nodes so far, deepest alias inside]

    def add(count: int, depth: int) -> None:
        top = open_nodes[-1]
        top[1] += count
        top[2] = max(top[2], depth)

    for event in YAML(typ="rt").parse(text):
        if isinstance(event, AliasEvent):
            count, inner = sizes.get(event.anchor, (1, 0))
            add(count, inner + 1)
        elif isinstance(event, (MappingStartEvent, SequenceStartEvent)):
            open_nodes.append([event.anchor, 1, 0])
            continue
        elif isinstance(event, (MappingEndEvent, SequenceEndEvent)):
            anchor, count, depth = open_nodes.pop()
            if anchor:
                sizes[anchor] = (count, depth)
            add(count, depth)
        elif isinstance(event, ScalarEvent):
            if event.anchor:
                sizes[event.anchor] = (1, 0)
            add(1, 0)
        else:
            continue
        total, depth = sum(node[1] for node in open_nodes), max(node[2] for node in open_nodes)
        if total > MAX_EXPANDED_NODES or depth > MAX_ALIAS_DEPTH:
            line = event.start_mark.line + 1 if event.start_mark else None
            what = (f"expand to more than {MAX_EXPANDED_NODES:,} values" if total > MAX_EXPANDED_NODES
                    else f"nest more than {MAX_ALIAS_DEPTH} aliases deep")
            return Problem(str(path), line, "", f"YAML aliases {what} (an alias bomb, or a file that should be split);"
                           " write the repeated values out or alias less")
    return None


def read_yaml(path: Path) -> YamlDocument:
    """Parse one file; a syntax error, aliases past their bound, a symlink out of the repository or a non-mapping
    top level is a ConfigError, not a traceback."""
    escaped = _outside_repository(path)
    if escaped is not None:
        raise ConfigError([escaped])
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([Problem(str(path), None, "", f"cannot read file: {exc.strerror}")]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([Problem(str(path), None, "", f"not UTF-8 text (byte {exc.start}); save the file as UTF-8")]) from None
    return parse_yaml(path, text)


def _ruamel_load(path: Path, text: str) -> Any:
    """The alias bound, then ruamel.yaml's round-trip loader: every document outside the fast path's subset."""
    expanded = _expansion(path, text)
    if expanded is not None:
        raise ConfigError([expanded])
    return YAML(typ="rt").load(text)


def parse_yaml(path: Path, text: str) -> YamlDocument:
    """``read_yaml`` of text already in hand (an ad-hoc job file sent to the API): the same parser, alias
    bound and top-level check; ``path`` only names the source in errors and is never read. Common documents
    are parsed by libyaml with ruamel's result (clusters/yaml_fast.py); the rest, and every error, by ruamel."""
    try:
        raw = yaml_fast.load(text, MAX_EXPANDED_NODES)
        if raw is None:
            raw = _ruamel_load(path, text)
    except MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else None
        fix = ("keep one of them" if isinstance(exc, DuplicateKeyError)
               else "quote the value to keep it as text, or correct it" if isinstance(exc, ConstructorError)
               else "indent with spaces (YAML forbids tabs in indentation)" if "'\\t'" in str(exc.problem) else "fix the syntax")
        raise ConfigError([Problem(str(path), line, "", f"invalid YAML: {_unechoed(exc)}; {fix}")]) from None
    except YAMLError as exc:  # e.g. ReaderError: control characters the YAML spec forbids
        raise ConfigError([Problem(str(path), None, "", f"invalid YAML: {str(exc).splitlines()[0]}; remove the offending characters")]) from None
    except RecursionError as exc:
        raise ConfigError([_unreadable(path, exc)]) from None
    except (ValueError, KeyError, IndexError, NotImplementedError) as exc:
        if not _raised_by_ruamel(exc):
            raise
        raise ConfigError([_unreadable(path, exc)]) from None
    if not isinstance(raw, CommentedMap):
        raise ConfigError([Problem(str(path), 1, "", "top level must be a mapping of fields; see the examples beside it")])
    try:
        return YamlDocument(path, raw)
    except RecursionError as exc:
        raise ConfigError([_unreadable(path, exc)]) from None


def _raised_by_ruamel(exc: BaseException) -> bool:
    """Whether the innermost Python frame of ``exc`` is ruamel.yaml's (its constructor calling int(), float(),
    datetime or a dict lookup on the file's text): the file's fault. The same exception from gpufleet's own code
    on the way (clusters/yaml_fast.py, ``_expansion``) is a bug and keeps its traceback."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(tb.tb_frame.f_globals.get("__name__", "")).startswith("ruamel.yaml.")


def _unreadable(path: Path, exc: BaseException) -> Problem:
    """What ruamel.yaml 0.19.1 raises outside its own error classes, as one line instead of a traceback: a value
    its constructor refuses (a timestamp-shaped ``2026-13-45``: "month must be in 1..12"; an integer past
    Python's 4,300 digits; a !!bool it has no word for, KeyError; ``0b_``, IndexError), a comment where its
    round-trip reader cannot keep it (``key: # c`` with the value on the next line: "overlap in comment"), and
    nesting deeper than its recursive constructor reaches."""
    if isinstance(exc, RecursionError):
        return Problem(str(path), None, "", "invalid YAML: nested too deeply to read; flatten the structure")
    if isinstance(exc, NotImplementedError):
        return Problem(str(path), None, "", "invalid YAML: a comment the reader cannot place (between a key and its value on a"
                       " later line?); move the comment onto a line of its own")
    reason = str(exc).split(";")[0]
    if reason.startswith("Exceeds the limit"):
        reason = "an integer longer than 4,300 digits"
    elif not _DATE_RANGE.fullmatch(reason):  # int()/float() of a tagged value echo the text: "!!int <token>"
        reason = "not the number, date or boolean its form or tag (!!int, !!float, ...) says (not shown)"
    return Problem(str(path), None, "", f"invalid YAML value: {reason}; quote the value to keep it as text, or correct it")


# datetime's range messages (CPython Modules/_datetimemodule.c check_date_args/check_time_args): they name no value.
_DATE_RANGE = re.compile(r"(year|month|day|hour|minute|second|microsecond) (must be in [0-9.]+|is out of range for month)"
                         r"|year [0-9]+ is out of range")


def _unechoed(exc: MarkedYAMLError) -> str:
    """ruamel.yaml's problem text, unless it quotes the file's values: a constructor's ("failed to construct
    timestamp from "<value>"", ruamel/yaml/constructor.py:542), a duplicate key's (both values, :281), or any
    problem the secret detector flags (an undefined alias named like a token). The parse error comes before the
    secret scan and reaches the CLI, the API's response and its log."""
    problem = str(exc.problem)
    if isinstance(exc, DuplicateKeyError):
        return "a key appears twice in one mapping (values not shown)"
    if isinstance(exc, ConstructorError):
        return "a value is not what its form or tag says (not shown)"
    hit = detect(problem)
    return problem if hit is None else f"near a value that looks like a credential (not shown; detected: {hit.kind}); delete and rotate it"


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


def _strings(node: Any, path: FieldPath = (), field: str = "") -> Iterator[tuple[FieldPath, str, str, bool]]:
    """(path, string, nearest name, is a map key) for every string of a document; an argv-style list
    gives each item the flag before it as its name ('--wandb-key', '<value>')."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*path, key), str(key), "", True
            yield from _strings(value, (*path, key), str(key))
    elif isinstance(node, list):
        previous = field
        for index, item in enumerate(node):
            yield from _strings(item, (*path, index), previous)
            previous = item if isinstance(item, str) and item.startswith("-") else field
    elif isinstance(node, str):
        yield path, node, field, False
    elif isinstance(node, TaggedScalar):  # ``!custom <text>``: ruamel keeps the tag and the text, neither a str node
        yield path, str(node.tag), field, False
        yield from _strings(node.value, path, field)


# ``detect`` is a pure function of (string, name), and a fleet's files repeat most of their strings (every
# key name, regions, machine types): within ``remembering_clean`` (``load_all`` of a fleet) a pair found clean
# is remembered, so each is scanned once per load. Only clean pairs (no credential is kept), only short ones,
# at most _CLEAN_MAX of them, and only for that load: the set is dropped with it, so nothing a file or a
# tenant's job text held stays in the process (an API request's text is never remembered: no block is open).
# A ContextVar, so the API's other threads never see another thread's set.
_CLEAN: ContextVar[set[tuple[str, str]] | None] = ContextVar("gpufleet_clean_strings", default=None)
_CLEAN_MAX = 1 << 16
_CLEAN_LONGEST = 256


@contextmanager
def remembering_clean() -> Iterator[None]:
    """Scan each (string, name) pair once inside this block (this thread only)."""
    token = _CLEAN.set(set())
    try:
        yield
    finally:
        _CLEAN.reset(token)


def _detect(value: str, field: str) -> Hit | None:
    clean = _CLEAN.get()
    if clean is None:
        return detect(value, field)
    if (value, field) in clean:
        return None
    hit = detect(value, field)
    if hit is None and len(value) + len(field) <= _CLEAN_LONGEST and len(clean) < _CLEAN_MAX:
        clean.add((value, field))
    return hit


def secret_problems(doc: YamlDocument) -> list[Problem]:
    """Credentials anywhere in a reviewed file (values and keys), masked; checked before the schema so
    no schema message can echo one."""
    problems = []
    for path, value, field, is_key in _strings(doc.data):
        hit = _detect(value, field)
        if hit is None:
            continue
        where = path[:-1] if is_key else path
        if not is_key and path[:2] == ("secrets", "env"):
            message = ("value is not a Vault reference and looks like the secret itself (not shown); delete it, rotate it, and write"
                       f" <path under the secret/ mount>#<key>, e.g. ml-api-keys/huggingface#token; detected: {hit.kind}, {hit.masked}")
        else:
            what = "a key of this mapping" if is_key else "the value"
            message = (f"{what} looks like a credential (not shown); delete it from this file, rotate it, and keep it in Vault"
                       f" (a job reads it through secrets.env); detected: {hit.kind}, {hit.masked}")
        shown = tuple("<credential>" if isinstance(part, str) and detect(part) else part for part in where)
        problems.append(Problem(str(doc.path), doc.line_of(where), format_path(shown), message))
    return problems


def validate_document(doc: YamlDocument, model: type[M], context: dict[str, Any] | None = None) -> M:
    leaks = secret_problems(doc)
    if leaks:
        raise ConfigError(leaks)
    try:
        return model.model_validate(doc.data, context=context)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(doc, model, exc)) from None
