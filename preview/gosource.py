"""Go source as tokens and top-level declarations: the part of the schema reader that knows Go syntax.

Only what Terraform provider schemas are written with: identifiers, literals, brackets,
``func`` (and methods) and ``var`` (single and grouped) at package level. Bodies are kept as
token lists; ``goschema.Reader`` evaluates the schema expressions in them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = re.compile(
    r"""(?P<ws>\s+)|(?P<comment>//[^\n]*|/\*.*?\*/)|(?P<raw>`[^`]*`)|(?P<str>"(?:\\.|[^"\\\n])*")|(?P<rune>'(?:\\.|[^'\\\n])+')"""
    r"""|(?P<num>\d[\w.]*)|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>:=|\.\.\.|&&|\|\||==|!=|<=|>=|<-|[-+*/%&|^<>=!.,;:(){}\[\]])""",
    re.DOTALL,
)
OPEN, CLOSE = "([{", ")]}"


class Unsupported(Exception):
    """A schema expression this reader cannot evaluate; the message names file:line."""


@dataclass(frozen=True)
class Tok:
    text: str
    kind: str
    file: str
    line: int


def tokenize(source: str, file: str) -> list[Tok]:
    tokens: list[Tok] = []
    line, pos = 1, 0
    for match in _TOKEN.finditer(source):
        if match.start() != pos:
            raise Unsupported(f"{file}:{line}: cannot tokenize {source[pos:pos + 20]!r}")
        pos = match.end()
        kind = match.lastgroup or ""
        if kind not in ("ws", "comment"):
            tokens.append(Tok(match.group(), kind, file, line))
        line += match.group().count("\n")
    return tokens


def split(tokens: list[Tok], sep: str) -> list[list[Tok]]:
    """Split at depth-0 separators (commas of a literal, arguments of a call)."""
    parts: list[list[Tok]] = [[]]
    depth = 0
    for tok in tokens:
        if tok.text in OPEN:
            depth += 1
        elif tok.text in CLOSE:
            depth -= 1
        if depth == 0 and tok.text == sep:
            parts.append([])
        else:
            parts[-1].append(tok)
    return [p for p in parts if p]


def matching(tokens: list[Tok], start: int) -> int:
    """Index of the bracket closing the one at ``start``."""
    depth = 0
    for i in range(start, len(tokens)):
        if tokens[i].text in OPEN:
            depth += 1
        elif tokens[i].text in CLOSE:
            depth -= 1
            if depth == 0:
                return i
    raise Unsupported(f"{tokens[start].file}:{tokens[start].line}: unbalanced {tokens[start].text!r}")


@dataclass
class Func:
    name: str
    params: list[str]
    body: list[Tok]


@dataclass
class Package:
    """Top-level ``func`` and ``var`` declarations of a set of Go files (one name space, first wins)."""

    funcs: dict[str, Func] = field(default_factory=dict)
    vars: dict[str, list[Tok]] = field(default_factory=dict)

    def add_source(self, source: str, file: str) -> None:
        tokens = tokenize(source, file)
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok.text == "func" and i + 1 < len(tokens) and tokens[i + 1].kind == "ident":
                i = self._func(tokens, i)
            elif tok.text == "func" and tokens[i + 1].text == "(":  # method: skip its receiver, then record by name
                receiver_end = matching(tokens, i + 1)
                i = self._func(tokens, receiver_end)
            elif tok.text == "var" and tokens[i + 1].text == "(":
                end = matching(tokens, i + 1)
                j = i + 2
                while j < end:
                    spec_end = min(self._statement_end(tokens, j), end)
                    self._var(tokens[j:spec_end])
                    j = spec_end
                i = end + 1
            elif tok.text == "var":
                end = self._statement_end(tokens, i + 1)
                self._var(tokens[i + 1:end])
                i = end
            elif tok.text in OPEN:
                i = matching(tokens, i) + 1
            else:
                i += 1

    @staticmethod
    def _statement_end(tokens: list[Tok], i: int) -> int:
        """End of a declaration: the first depth-0 token on a new line after a complete expression."""
        depth = 0
        start_line = tokens[i].line
        j = i
        while j < len(tokens):
            tok = tokens[j]
            if depth == 0 and tok.line != start_line and j > i and tokens[j - 1].text not in ("=", ",", "{", "(", "&", ".", "&&", "||", "+"):
                return j
            if tok.text in OPEN:
                depth += 1
            elif tok.text in CLOSE:
                depth -= 1
            if depth == 0:
                start_line = tok.line
            j += 1
        return j

    def _var(self, spec: list[Tok]) -> None:
        eq = next((k for k, t in enumerate(spec) if t.text == "="), None)
        if eq is None or spec[0].kind != "ident":
            return
        self.vars.setdefault(spec[0].text, spec[eq + 1:])

    def _func(self, tokens: list[Tok], i: int) -> int:
        name = tokens[i + 1].text
        j = i + 2
        if tokens[j].text == "[":  # type parameters
            j = matching(tokens, j) + 1
        params_end = matching(tokens, j)
        params = [p[0].text for p in split(tokens[j + 1:params_end], ",") if p and p[0].kind == "ident"]
        k = params_end + 1
        while k < len(tokens) and tokens[k].text != "{":
            if tokens[k].text in "([":
                k = matching(tokens, k)
            k += 1
        end = matching(tokens, k)
        self.funcs.setdefault(name, Func(name, params, tokens[k + 1:end]))
        return end + 1


def subst(tokens: list[Tok], scope: dict[str, list[Tok]]) -> list[Tok]:
    """Replace identifiers bound in ``scope`` (function parameters, locals) by their expressions.

    Not a field selector (``x.name``) and not a literal key (``name:``).
    """
    if not scope:
        return tokens
    out: list[Tok] = []
    for k, tok in enumerate(tokens):
        selector = k > 0 and tokens[k - 1].text == "."
        key = k + 1 < len(tokens) and tokens[k + 1].text == ":"
        if tok.kind == "ident" and tok.text in scope and not selector and not key:
            out.extend(scope[tok.text])
        else:
            out.append(tok)
    return out


def where(tokens: list[Tok]) -> str:
    return f"{tokens[0].file}:{tokens[0].line}" if tokens else "?"
