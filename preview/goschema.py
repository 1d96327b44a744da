"""Read Terraform provider resource schemas statically from Go source (maintainer tooling).

Terraform's own schema export (``terraform providers schema -json``) does not say which
attributes force replacement, and building a provider to ask it at run time needs Go and
gigabytes of modules. The schemas are Go composite literals, so this reads them the way a
reviewer would: ``map[string]*schema.Schema{"name": {Type: ..., ForceNew: true, Elem: ...}}``,
following package-level ``var``s, schema-returning functions (``schemaNodeConfig()``),
``MergeSchemas(a, b)`` and nested ``Elem: &schema.Resource{Schema: ...}`` blocks (SDK v2), and
``Attributes``/``Blocks`` with a ``RequiresReplace`` plan modifier (plugin framework).

It is not a Go compiler: an expression it cannot evaluate (a schema assembled by loops or
mutated after construction) raises ``Unsupported`` naming the file and line, so a provider
upgrade that changes style fails the regeneration instead of silently dropping attributes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from preview.gosource import CLOSE, OPEN, Func, Package, Tok, Unsupported, matching, split, subst, tokenize, where


@dataclass
class Attr:
    """One schema attribute or block, as far as replacement is concerned."""

    force_new: bool
    block: bool
    computed_only: bool
    optional_computed: bool
    file: str
    line: int
    type: str
    children: dict[str, Attr] = field(default_factory=dict)


class Reader:
    """Evaluates schema expressions against a ``Package``."""

    def __init__(self, packages: list[Package]) -> None:
        self.packages = packages

    def _func(self, name: str) -> Func | None:
        return next((p.funcs[name] for p in self.packages if name in p.funcs), None)

    def _var(self, name: str) -> list[Tok] | None:
        return next((p.vars[name] for p in self.packages if name in p.vars), None)

    # -- expressions -------------------------------------------------------------------------
    def _strip(self, tokens: list[Tok]) -> list[Tok]:
        while tokens and tokens[0].text in ("&", "*"):
            tokens = tokens[1:]
        while tokens and tokens[0].text == "(" and matching(tokens, 0) == len(tokens) - 1:
            tokens = tokens[1:-1]
        return tokens

    def _qualified(self, tokens: list[Tok]) -> tuple[str, int]:
        """``pkg.Name`` / ``Name`` at the start of tokens -> (Name, index after it)."""
        j = 0
        name = tokens[0].text
        while j + 2 < len(tokens) and tokens[j + 1].text == "." and tokens[j + 2].kind == "ident":
            j += 2
            name = tokens[j].text
        return name, j + 1

    def literal(self, tokens: list[Tok], scope: dict[str, list[Tok]]) -> tuple[str, list[Tok]]:
        """Resolve an expression to (type text, the tokens inside its braces) of a composite literal,
        following variables and function calls. The type text is '' when elided."""
        tokens = self._strip(tokens)
        if not tokens:
            raise Unsupported("empty expression")
        if tokens[-1].text == "}":
            start = next(k for k, t in enumerate(tokens) if t.text == "{")
            if matching(tokens, start) != len(tokens) - 1:
                raise Unsupported(f"{where(tokens)}: not a composite literal")
            return "".join(t.text for t in tokens[:start]), subst(tokens[start + 1:-1], scope)
        if tokens[0].kind == "ident":
            name, after = self._qualified(tokens)
            if after == len(tokens):
                if tokens[0].text in scope and len(tokens) == 1:
                    return self.literal(scope[tokens[0].text], {})
                if self._var(name) is not None:
                    return self.literal(self._var(name) or [], {})
                raise Unsupported(f"{where(tokens)}: unknown identifier {name}")
            if tokens[after].text == "(" and matching(tokens, after) == len(tokens) - 1:
                return self.call(name, split(tokens[after + 1:-1], ","), scope, tokens)
        raise Unsupported(f"{where(tokens)}: cannot evaluate {' '.join(t.text for t in tokens[:12])}")

    def call(self, name: str, args: list[list[Tok]], scope: dict[str, list[Tok]], where: list[Tok]) -> tuple[str, list[Tok]]:
        if name == "MergeSchemas":
            merged: list[Tok] = []
            for arg in args:
                _, inner = self.literal(arg, scope)
                merged.extend([*inner, Tok(",", "op", inner[0].file if inner else "", 0)])
            return "map[string]*schema.Schema", merged
        func = self._func(name)
        if func is None:
            raise Unsupported(f"{where(where)}: unknown function {name}")
        bound = {p: subst(a, scope) for p, a in zip(func.params, args, strict=False)}
        return self.literal(self._returned(func), {**bound, **self._locals(func, bound)})

    def _returned(self, func: Func) -> list[Tok]:
        """The expression of the function's last top-level ``return``."""
        body, depth, last = func.body, 0, None
        for k, tok in enumerate(body):
            if tok.text in OPEN:
                depth += 1
            elif tok.text in CLOSE:
                depth -= 1
            elif depth == 0 and tok.text == "return":
                last = k
        if last is None:
            raise Unsupported(f"{func.name}: no return statement")
        end = Package._statement_end(body, last + 1)
        return body[last + 1:end]

    def _locals(self, func: Func, bound: dict[str, list[Tok]] | None = None) -> dict[str, list[Tok]]:
        """Local variables of a function body, so ``return x`` resolves.

        Modelled: ``x := expr``, ``var x T``, ``x = expr``, adding a map entry ``x["k"] = expr``
        (returned as ``MergeSchemas(x, {"k": expr})``), and ``if``/``else`` on a condition
        that evaluates to a constant (a bound ``true``/``false`` parameter). Setting a field that
        matters for replacement (``x.ForceNew = ...``) or a mutation under a condition it
        cannot evaluate is refused: better no table than a wrong one.
        """
        scope = dict(bound or {})
        locals_: dict[str, list[Tok]] = {}
        self._block(func, func.body, scope, locals_)
        return locals_

    def _block(self, func: Func, body: list[Tok], scope: dict[str, list[Tok]], locals_: dict[str, list[Tok]]) -> None:
        i = 0
        while i < len(body):
            tok = body[i]
            if tok.text == "if":
                brace = next(k for k in range(i + 1, len(body)) if body[k].text == "{")
                end = matching(body, brace)
                branches = [(body[i + 1:brace], body[brace + 1:end])]
                i = end + 1
                while i + 1 < len(body) and body[i].text == "else":
                    if body[i + 1].text == "{":
                        close = matching(body, i + 1)
                        branches.append(([], body[i + 2:close]))
                        i = close + 1
                        break
                    raise Unsupported(f"{body[i].file}:{body[i].line}: {func.name}: else-if chains are not modelled")
                chosen = self._choose(func, branches, {**scope, **locals_}, locals_)
                if chosen is not None:
                    self._block(func, chosen, scope, locals_)
                continue
            if tok.text in ("for", "switch", "select", "go", "defer"):
                brace = next(k for k in range(i + 1, len(body)) if body[k].text == "{")
                end = matching(body, brace)
                if self._mutates(body[i:end + 1], locals_, scope):
                    raise Unsupported(f"{tok.file}:{tok.line}: {func.name} changes a schema inside a {tok.text}")
                i = end + 1
                continue
            end = Package._statement_end(body, i)
            self._statement(func, body[i:end], scope, locals_)
            i = end

    RELEVANT = frozenset({"ForceNew", "Computed", "Optional", "Required", "Type", "Elem", "Schema", "PlanModifiers", "Attributes", "Blocks"})

    def _mutates(self, tokens: list[Tok], locals_: dict[str, list[Tok]], scope: dict[str, list[Tok]]) -> bool:
        """Does a block assign into a local/parameter map or set a relevant field of one?"""
        names = {*locals_, *scope}
        for k, tok in enumerate(tokens):
            if tok.text != "=" or k == 0:
                continue
            lhs_start = k - 1
            while lhs_start > 0 and tokens[lhs_start - 1].line == tok.line and tokens[lhs_start - 1].text not in ("{", "}", ";"):
                lhs_start -= 1
            lhs = tokens[lhs_start:k]
            if lhs and lhs[0].text in names and (any(t.text in self.RELEVANT for t in lhs) or (len(lhs) > 1 and lhs[1].text == "[")):
                if not (len(lhs) > 1 and lhs[-2].text == "." and lhs[-1].text not in self.RELEVANT):
                    return True
        return False

    def _choose(self, func: Func, branches: list[tuple[list[Tok], list[Tok]]], scope: dict[str, list[Tok]],
                locals_: dict[str, list[Tok]]) -> list[Tok] | None:
        for cond, block in branches:
            if not cond:
                return block
            text = "".join(t.text for t in subst(cond, scope))
            value = {"true": True, "false": False, "!true": False, "!false": True}.get(text)
            if value is None:
                if any(self._mutates(b, locals_, scope) for _, b in branches):
                    raise Unsupported(f"{cond[0].file}:{cond[0].line}: {func.name} changes a schema under `if {text}`")
                return None
            if value:
                return block
        return None

    def _statement(self, func: Func, stmt: list[Tok], scope: dict[str, list[Tok]], locals_: dict[str, list[Tok]]) -> None:
        if not stmt or stmt[0].text == "return":
            return
        env = {**scope, **locals_}
        if stmt[0].text == "var" and len(stmt) > 1:
            eq = next((k for k, t in enumerate(stmt) if t.text == "="), None)
            locals_[stmt[1].text] = subst(stmt[eq + 1:], env) if eq is not None else []
            return
        if len(stmt) > 2 and stmt[1].text == ":=" and stmt[0].kind == "ident":
            locals_[stmt[0].text] = subst(stmt[2:], env)
            return
        eq = next((k for k, t in enumerate(stmt) if t.text == "="), None)
        if eq is None or stmt[0].text not in env:
            return
        lhs, rhs = stmt[:eq], stmt[eq + 1:]
        name = lhs[0].text
        if len(lhs) == 1 and name in locals_:
            locals_[name] = subst(rhs, env)
        elif len(lhs) == 4 and lhs[1].text == "[" and lhs[2].kind == "str" and lhs[3].text == "]" and name in locals_:
            locals_[name] = self._merged(locals_[name], lhs[2], subst(rhs, env))
        elif len(lhs) >= 3 and lhs[-2].text == "." and lhs[-1].text not in self.RELEVANT:
            return  # ValidateFunc, ConflictsWith, Description: no effect on replacement
        else:
            where = stmt[0]
            raise Unsupported(f"{where.file}:{where.line}: {func.name} mutates a schema after building it "
                              f"({' '.join(t.text for t in lhs)} = ...)")

    @staticmethod
    def _merged(base: list[Tok], key: Tok, value: list[Tok]) -> list[Tok]:
        """``MergeSchemas(base, map[string]*schema.Schema{key: value})`` as tokens."""
        def t(text: str, kind: str = "op") -> Tok:
            return Tok(text, kind, key.file, key.line)
        literal = [t("map", "ident"), t("["), t("string", "ident"), t("]"), t("*"), t("schema", "ident"), t("."), t("Schema", "ident"),
                   t("{"), key, t(":"), *value, t("}")]
        return [t("MergeSchemas", "ident"), t("("), *base, t(","), *literal, t(")")]

    def fields(self, inner: list[Tok]) -> Iterator[tuple[str, list[Tok]]]:
        """``key: value`` pairs of a composite literal (keys unquoted)."""
        for part in split(inner, ","):
            colon = next((k for k, t in enumerate(part) if t.text == ":"), None)
            depth = 0
            for k, t in enumerate(part):  # the first depth-0 colon
                if t.text in OPEN:
                    depth += 1
                elif t.text in CLOSE:
                    depth -= 1
                elif t.text == ":" and depth == 0:
                    colon = k
                    break
            if colon is None:
                if len(part) == 1 or part[-1].text in (")", "}"):  # an element of a list literal / merged map spread
                    yield "", part
                    continue
                raise Unsupported(f"{where(part)}: literal element without a key")
            key = "".join(t.text for t in part[:colon])
            yield key.strip('"'), part[colon + 1:]

    # -- SDK v2 ------------------------------------------------------------------------------
    def sdk_map(self, tokens: list[Tok], scope: dict[str, list[Tok]]) -> dict[str, Attr]:
        _, inner = self.literal(tokens, scope)
        out: dict[str, Attr] = {}
        for key, value in self.fields(inner):
            if not key:
                continue
            out[key] = self.sdk_attr(value, scope)
        return out

    def _bool(self, tokens: list[Tok], scope: dict[str, list[Tok]]) -> bool:
        text = "".join(t.text for t in tokens)
        negated = text.startswith("!")
        text = text.lstrip("!")
        if text in ("true", "false"):
            return (text == "true") != negated
        if text in scope:
            return self._bool(scope[text], {})
        raise Unsupported(f"{where(tokens)}: cannot evaluate boolean {text}")

    def sdk_attr(self, tokens: list[Tok], scope: dict[str, list[Tok]]) -> Attr:
        type_text, inner = self.literal(tokens, scope)
        values = dict(self.fields(inner))
        flag = {k: self._bool(values[k], scope) if k in values else False for k in ("ForceNew", "Computed", "Optional", "Required")}
        kind = "".join(t.text for t in values.get("Type", []))
        children: dict[str, Attr] = {}
        block = False
        elem_text = "".join(t.text for t in values.get("Elem", []))
        if re.fullmatch(r"schema\.Type\w+", elem_text):
            values.pop("Elem")  # `Elem: schema.TypeString` (a bare ValueType): a map/list of values, no nested schema
        if "Elem" in values:
            elem_type, elem_inner = self.literal(values["Elem"], scope)
            if "Resource" in elem_type:
                block = True
                schema = dict(self.fields(elem_inner)).get("Schema")
                if schema is None:
                    raise Unsupported(f"{where(values['Elem'])}: Elem resource without Schema")
                children = self.sdk_map(schema, scope)
            elif "Schema" not in elem_type and elem_type:
                raise Unsupported(f"{where(values['Elem'])}: Elem of type {elem_type}")
        where = tokens[0] if tokens else Tok("", "", "?", 0)
        return Attr(
            force_new=flag["ForceNew"], block=block, computed_only=flag["Computed"] and not (flag["Optional"] or flag["Required"]),
            optional_computed=flag["Computed"] and flag["Optional"], file=where.file, line=where.line,
            type=kind.removeprefix("schema."), children=children,
        )

    def sdk_resource(self, func_name: str, args: str = "") -> dict[str, Attr]:
        """The schema of ``func_name(args)``; ``args`` is the Go text of the registration call's arguments."""
        arg_tokens = split(tokenize(args, "<registration>"), ",")
        func = self._func(func_name)
        if func is None:
            raise Unsupported(f"unknown function {func_name}")
        bound = dict(zip(func.params, arg_tokens, strict=False))
        scope = {**bound, **self._locals(func, bound)}
        _, inner = self.literal(self._returned(func), scope)
        schema = dict(self.fields(inner)).get("Schema")
        if schema is None:
            raise Unsupported(f"{func_name}: resource without Schema")
        return self.sdk_map(schema, scope)

    # -- plugin framework --------------------------------------------------------------------
    def fw_schema(self, func_name: str) -> dict[str, Attr]:
        _, inner = self.call(func_name, [], {}, [])
        return self._fw_children(dict(self.fields(inner)), {})

    def fw_literal(self, tokens: list[Tok]) -> dict[str, Attr]:
        _, inner = self.literal(tokens, {})
        return self._fw_children(dict(self.fields(inner)), {})

    def _fw_children(self, values: dict[str, list[Tok]], scope: dict[str, list[Tok]]) -> dict[str, Attr]:
        out: dict[str, Attr] = {}
        for group in ("Attributes", "Blocks"):
            if group in values:
                _, inner = self.literal(values[group], scope)
                for key, value in self.fields(inner):
                    out[key] = self.fw_attr(value, scope)
        return out

    def fw_attr(self, tokens: list[Tok], scope: dict[str, list[Tok]]) -> Attr:
        type_text, inner = self.literal(tokens, scope)
        values = dict(self.fields(inner))
        flag = {k: self._bool(values[k], scope) if k in values else False for k in ("Computed", "Optional", "Required")}
        modifiers = " ".join(t.text for t in values.get("PlanModifiers", []))
        force_new = bool(re.search(r"\bRequiresReplace\s*\(", modifiers))
        nested = values
        if "NestedObject" in values:
            _, nested_inner = self.literal(values["NestedObject"], scope)
            nested = dict(self.fields(nested_inner))
        children = self._fw_children(nested, scope) if nested is not values or "Attributes" in values or "Blocks" in values else {}
        where = tokens[0] if tokens else Tok("", "", "?", 0)
        return Attr(
            force_new=force_new, block=bool(children), computed_only=flag["Computed"] and not (flag["Optional"] or flag["Required"]),
            optional_computed=flag["Computed"] and flag["Optional"], file=where.file, line=where.line,
            type=type_text.removeprefix("schema."), children=children,
        )


def force_new_paths(attrs: dict[str, Attr], prefix: str = "") -> Iterator[tuple[str, Attr]]:
    """Every ForceNew attribute or block, as a dotted path with list indexes dropped."""
    for name in sorted(attrs):
        attr = attrs[name]
        path = f"{prefix}{name}"
        if attr.force_new:
            yield path, attr
        yield from force_new_paths(attr.children, f"{path}.")
