"""No user string is evaluated by Terraform: every ``${``/``%{`` in synthesized JSON is one gpufleet generated.

Terraform's JSON syntax evaluates every string (and every object key inside an expression) as a
template, so ``${base64encode(file("/proc/self/environ"))}`` in a label value would print the
plan runner's credentials, base64-encoded past log masking. Cluster files refuse ``${``/``%{``
(``clusters.schema``); this is the synthesis-wide backstop that also covers a field added later,
an ``add_override`` or a construct bug. It allows exactly the shapes cdktf emits for the example
fleet (``tests/stacks/test_interpolation.py`` derives them from a real synthesis): references
(``${google_x.y.attr}``, ``${var.x}``, ``${data.x.y.z[0]}``) and a few functions of references.
Anything else, including every ``%{`` directive, refuses the synthesis; ``$${`` is Terraform's
escape for a literal ``${`` and is not evaluated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusters.errors import UserError
from clusters.reservation import PRECONDITION_SHAPE

_ESCAPES = ("$${", "%%{")
_OPENERS = ("${", "%{")
_MARK = re.compile(r"[$%]")
_NAME = r"[A-Za-z_][A-Za-z0-9_-]*"
_STEP = rf"(?:\.{_NAME}|\[[0-9]+\]|\[\"[A-Za-z0-9_./-]*\"\])"
REFERENCE = re.compile(rf"(?:var\.{_NAME}|local\.{_NAME}|data\.{_NAME}\.{_NAME}|{_NAME}\.{_NAME}){_STEP}*")
# Functions gpufleet's constructs emit (the GKE provider's CA certificate); a construct that needs
# another Fn.* adds it here. Arguments must themselves be allowed expressions, so no literal (and
# so no user text) can ride inside a call.
FUNCTIONS = frozenset({"base64decode"})
# Whole expressions gpufleet generates beyond references and calls: each a fixed template whose only
# variable parts are names (the reserved pool's precondition, clusters.reservation).
TEMPLATES = (PRECONDITION_SHAPE,)
_CALL = re.compile(rf"({_NAME})\((.*)\)", re.DOTALL)


@dataclass(frozen=True)
class Interpolation:
    file: str
    path: str
    marker: str
    expression: str

    def __str__(self) -> str:
        shown = self.expression if len(self.expression) <= 60 else self.expression[:57] + "..."
        return (f"{self.file}: {self.path}: {self.marker}{shown}}} is a Terraform {'directive' if self.marker == '%{' else 'interpolation'}"
                " gpufleet did not generate; Terraform would evaluate it at plan time (it can read files and the environment);"
                " remove '${'/'%{' from the cluster file or the override that put it there")


@dataclass(frozen=True)
class DuplicateKey:
    """A key written twice in one object of a stack's JSON: a JSON parser keeps one of the values (the template
    check reads what ``json.loads`` keeps), Terraform reads every one (HCL's JSON syntax keeps repeated block keys
    as blocks of their own), so a sequence under the dropped one would be evaluated unchecked."""
    file: str
    key: str

    def __str__(self) -> str:
        return (f"{self.file}: the key {self.key!r} appears twice in one object; Terraform would read both and the"
                " template check cannot vouch for the one a JSON parser drops; cdktf never writes a key twice:"
                " remove whatever edited the synthesized file")


# What the check refuses: a sequence gpufleet did not generate, or a key a parser would drop.
Finding = Interpolation | DuplicateKey


class _Repeated(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook``: the object, or ``_Repeated`` for its first key written twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Repeated(key)
            seen.add(key)
    return obj


def _closing(text: str, start: int) -> int:
    """Index of the ``}`` closing a template sequence whose body starts at ``start``; -1 if unclosed."""
    depth, i, quoted = 1, start, False
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def sequences(text: str) -> Iterator[tuple[str, str]]:
    """(``${`` or ``%{``, expression) for every template sequence Terraform would evaluate in ``text``.

    Every escape and opener starts with ``$`` or ``%`` and holds a ``{``, so the scan jumps from one
    ``$``/``%`` to the next (a character-by-character loop was most of a 200-cluster fleet's check)."""
    if "{" not in text:
        return
    i = 0
    while True:
        mark = _MARK.search(text, i)
        if mark is None:
            return
        i = mark.start()
        if text.startswith(_ESCAPES, i):
            i += 3
        elif text.startswith(_OPENERS, i):
            end = _closing(text, i + 2)
            yield text[i:i + 2], text[i + 2:end] if end >= 0 else text[i + 2:]
            if end < 0:
                return
            i = end + 1
        else:
            i += 1


def _split_args(body: str) -> list[str] | None:
    args, depth, current, quoted, i = [], 0, "", False, 0
    while i < len(body):
        ch = body[i]
        if quoted:
            current += ch
            if ch == "\\" and i + 1 < len(body):
                current += body[i + 1]
                i += 1
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted, current = True, current + ch
        elif ch in "([{":
            depth, current = depth + 1, current + ch
        elif ch in ")]}":
            depth, current = depth - 1, current + ch
        elif ch == "," and depth == 0:
            args.append(current.strip())
            current = ""
        else:
            current += ch
        i += 1
    if quoted or depth:
        return None
    if current.strip():
        args.append(current.strip())
    return args


def allowed(expression: str) -> bool:
    """A reference, or an allowed function applied to allowed expressions."""
    expression = expression.strip()
    if REFERENCE.fullmatch(expression) or any(t.fullmatch(expression) for t in TEMPLATES):
        return True
    call = _CALL.fullmatch(expression)
    if not call or call.group(1) not in FUNCTIONS:
        return False
    args = _split_args(call.group(2))
    return args is not None and all(allowed(a) for a in args)


def _segment(key: str) -> str:
    return f".{key}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key) else f"[{json.dumps(key)}]"


def find(node: Any, file: str, path: str = "$") -> Iterator[Interpolation]:
    """Every template sequence under ``node`` (keys included: JSON object keys are templates too) that is not allowed."""
    if isinstance(node, dict):
        for key in sorted(node):
            for marker, expression in sequences(str(key)):
                if marker == "%{" or not allowed(expression):
                    yield Interpolation(file, f"{path}{_segment(str(key))} (key)", marker, expression)
            yield from find(node[key], file, path + _segment(str(key)))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from find(item, file, f"{path}[{index}]")
    elif isinstance(node, str):
        for marker, expression in sequences(node):
            if marker == "%{" or not allowed(expression):
                yield Interpolation(file, path, marker, expression)


def _string_suspect(text: str, verdicts: dict[str, bool]) -> bool:
    """Whether ``find`` would report ``text`` (a string value or key); ``verdicts`` remembers ``allowed`` per expression."""
    if "{" not in text:
        return False
    for marker, expression in sequences(text):
        if marker == "%{":
            return True
        verdict = verdicts.get(expression)
        if verdict is None:
            verdict = verdicts[expression] = allowed(expression)
        if not verdict:
            return True
    return False


def _suspect(tree: Any, verdicts: dict[str, bool] | None = None) -> bool:
    """Whether ``find`` would report anything under ``tree``: the same test on every string and key, without
    building the path of every node (only a tree with a finding is walked again, by ``find``, for its paths)."""
    verdicts = {} if verdicts is None else verdicts
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            pending.extend(node)
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
        elif isinstance(node, str) and _string_suspect(node, verdicts):
            return True
    return False


def _quote(text: str, at: int, step: int) -> int:
    """The index of the first unescaped ``"`` from ``at`` towards ``step`` (-1: back, 1: forward); -1 if none."""
    while True:
        at = text.rfind('"', 0, at + 1) if step < 0 else text.find('"', at)
        if at < 0:
            return -1
        slashes = 0
        while at - 1 - slashes >= 0 and text[at - 1 - slashes] == "\\":
            slashes += 1
        if slashes % 2 == 0:
            return at
        at += step


def _text_suspect(text: str, literals: dict[str, bool], verdicts: dict[str, bool]) -> bool | None:
    """``_suspect`` of the JSON document ``text`` without parsing it, or None where only the parsed tree can tell.

    Only a string holding ``${`` or ``%{`` can hold a sequence (``sequences``). In JSON text ``$`` and ``%`` occur
    only inside strings, and there ``$``, ``%`` and ``{`` are written as themselves. So each ``${``/``%{`` of
    the text lies in a string whose opening quote is the nearest unescaped ``"`` before it and whose closing
    quote the nearest after it; that string literal is decoded on its own and tested as ``_suspect`` tests a
    string (keys and values alike). A text holding a ``\\u`` escape could spell a marker another way (``\\u0024{``),
    and a literal that does not decode means the text is not the JSON cdktf writes: both get None, and the
    caller parses. ``literals`` remembers the verdict per literal (stacks of a fleet repeat most of them).
    Parsing the tree was most of this check at 200 clusters (0.3 s of 0.31 s); cdktf's JSON holds no ``\\u``."""
    if "\\u" in text:
        return None
    checked: set[int] = set()
    for opener in _OPENERS:
        at = text.find(opener)
        while at >= 0:
            start, end = _quote(text, at, -1), _quote(text, at, 1)
            if start < 0 or end < 0:
                return None
            if start not in checked:
                checked.add(start)
                literal = text[start:end + 1]
                verdict = literals.get(literal)
                if verdict is None:
                    try:  # quote to quote: a str, or not JSON at all
                        value = json.loads(literal)
                    except ValueError:
                        return None
                    verdict = literals[literal] = _string_suspect(value, verdicts)
                if verdict:
                    return True
            at = text.find(opener, end + 1)
    return False


def check_outdir(outdir: Path, shown_as: Path | None = None, stacks: Iterable[str] | None = None) -> None:
    """Refuse a synthesis whose Terraform JSON holds a template sequence gpufleet did not generate.
    ``stacks``: only those (the synthesis cache checks what it synthesized before storing it)."""
    refuse(findings(outdir, shown_as, stacks))


def findings(outdir: Path, shown_as: Path | None = None,
             stacks: Iterable[str] | None = None) -> list[Finding]:
    """What ``check_outdir`` refuses, in its order (by stack name, then as ``find`` walks each file); each part
    of a parallel synthesis is checked in its own process and the parts' lists merged (``merged``).

    A stack whose text holds no sequence gpufleet did not generate (``_text_suspect``) is not parsed, so a file that
    is not JSON at all passes here when nothing in it could be a template (Terraform and checkov refuse it later); one
    that is parsed and repeats a key in an object is refused (``DuplicateKey``)."""
    found: list[Finding] = []
    files = sorted(Path(outdir).glob("stacks/*/cdk.tf.json")) if stacks is None else \
        [Path(outdir) / "stacks" / name / "cdk.tf.json" for name in sorted(stacks)]
    literals: dict[str, bool] = {}
    verdicts: dict[str, bool] = {}
    for file in files:
        name = str((shown_as or outdir) / file.relative_to(outdir))
        text = file.read_text()
        suspect = _text_suspect(text, literals, verdicts)
        if suspect is False:
            continue
        try:
            tree = json.loads(text, object_pairs_hook=_unique)
        except _Repeated as repeated:
            found.append(DuplicateKey(name, repeated.key))
            continue
        if suspect or _suspect(tree, verdicts):
            found.extend(find(tree, name))
    return found


def merged(parts: Iterable[list[Finding]]) -> list[Finding]:
    """The findings of parts holding different stacks, in the order one ``findings`` over all of them gives:
    by file as paths sort (one per stack; ``a`` before ``a-b``, as ``sorted`` of the globbed paths), each file's
    own in their order (a stable sort)."""
    return sorted((f for part in parts for f in part), key=lambda f: Path(f.file))


def refuse(found: list[Finding]) -> None:
    if found:
        raise UserError("\n".join(str(f) for f in found))
