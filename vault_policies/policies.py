"""Vault ACL policies as files (``vault_policies/policies/<name>.hcl``): parsing and path rules.

Two kinds, told apart by name. Job-family policies are named ``ml-keys-<family>`` (the
prefix is the namespace gpufleet-admin may write in; Vault's built-in ``default`` and
``root`` and every other name are refused) and may only read the current version of API
keys under ``secret/data/ml-api-keys/``. The operator policies (``gpufleet-admin``,
``orchestrator``) are generated from the roles and clusters (vault_policies/operator.py)
and checked against that rendering in validate.py.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusters.errors import Problem
from vault_policies.layout import (
    API_KEYS_POLICY_PREFIX,
    APPROLE_MOUNT,
    BUILTIN_POLICIES,
    JOB_POLICY_PREFIX,
    KV_MOUNT,
    MANAGED_MARKER,
    OPERATOR_POLICIES,
)

POLICY_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
VAULT_CAPABILITIES = frozenset({"create", "read", "update", "patch", "delete", "list", "sudo", "deny"})
BLOCK_FIELDS = frozenset({"capabilities", "min_wrapping_ttl", "max_wrapping_ttl", "required_parameters", "allowed_parameters", "denied_parameters"})
ROLE_PATH = f"auth/{APPROLE_MOUNT}/role/"
# KV v2 serves old versions of a key through ?version=N on the same path; a job token reads
# only the current one (a rotated-out key stays out of reach). Vault denies any value of a
# parameter listed with an empty list.
CURRENT_VERSION_ONLY = {"version": []}
_HCL_LINE = re.compile(r"Line (\d+)")


@dataclass(frozen=True)
class PolicyRule:
    path: str
    capabilities: tuple[str, ...]
    min_wrapping_ttl: str | None
    max_wrapping_ttl: str | None
    line: int | None
    denied_parameters: object = None


@dataclass(frozen=True)
class PolicyFile:
    name: str
    file: Path
    text: str
    rules: tuple[PolicyRule, ...]

    def rendered(self) -> str:
        """The text the sync writes: the managed marker first, so prune can recognise it, and a
        final newline always. The operator policy pins this text in ``allowed_parameters``, where
        Vault reads a value that starts or ends with ``*`` as a glob: a file whose last character
        is ``*`` would otherwise let the sync token append any grant to it."""
        body = self.text if self.text.endswith("\n") else self.text + "\n"
        return f"{MANAGED_MARKER} (vault_policies/policies/{self.file.name})\n{body}"


def line_of_text(text: str, needle: str) -> int | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    return None


_TOKENS = {"RIGHTBRACE": "'}'", "LEFTBRACE": "'{'", "RIGHTBRACKET": "']'", "LEFTBRACKET": "'['", "COMMA": "','",
           "EQUAL": "'='", "STRING": "a quoted string", "IDENTIFIER": "a name", "RIGHTPAREN": "')'", "LEFTPAREN": "'('",
           "NUMBER": "a number", "FLOAT": "a number", "MINUS": "'-'", "BOOL": "true or false", "PERIOD": "'.'", "COLON": "':'",
           "ASTERISK_PERIOD": "'*.'", "QMARK": "'?'", "EPLUS": "a number", "EMINUS": "a number"}


def hcl_error(raw: str, text: str) -> tuple[int, str]:
    """(line, words) of a pyhcl parse error: token names as the characters they stand for, no column
    (pyhcl's is unreliable); an unexpected end of file points at the last line and says what is open."""
    found = _HCL_LINE.search(raw)
    line = int(found.group(1)) if found else max(text.count("\n"), 1)
    unexpected = re.search(r"unexpected (\w+)", raw)
    tail = re.split(r"\bexpected\b", raw, maxsplit=1)
    expected = [t for t in re.findall(r"\b[A-Z_]{2,}\b", tail[1]) if t in _TOKENS] if len(tail) == 2 else []
    wanted = " or ".join(dict.fromkeys(_TOKENS[t] for t in expected if "COMMENT" not in t))
    if "end of file" in raw.lower():
        return line, f"the file ends inside a block or list{'; expected ' + wanted if wanted else ''} (a closing '}}' or ']' is missing)"
    what = _TOKENS.get(unexpected.group(1), unexpected.group(1).lower()) if unexpected else "text"
    return line, f"unexpected {what}{'; expected ' + wanted if wanted else ''}"


def text_line(data: bytes, offset: int) -> int:
    """1-based line of a byte offset."""
    return data[:offset].count(b"\n") + 1


# pyhcl 0.4.5 (pinned): ``hcl.loads`` (hcl/api.py:79-83) builds a new ``HclParser`` for every call, and its
# ``__init__`` (hcl/parser.py:636-639) runs PLY's LALR table generation again each time (its vendored yacc keeps
# no table cache): about 25 ms a policy file, ten of them per ``gpufleet check``. One parser per process parses
# the same way (PLY's ``parse`` starts from fresh stacks on every call); the lock keeps one parse at a time.
_HCL_LOCK = threading.Lock()


@functools.cache
def _hcl_parser() -> Any:
    from hcl.parser import HclParser

    return HclParser()


def hcl_loads(text: str) -> Any:
    """``hcl.loads(text)``: the same result and the same ValueError, with one parser per process."""
    from hcl.api import isHcl, u

    decoded = u(text)
    if not isHcl(decoded):
        return json.loads(decoded)
    with _HCL_LOCK:
        return _hcl_parser().parse(decoded)


def parse_policy(file: Path) -> tuple[PolicyFile | None, list[Problem]]:
    """One policy file; problems instead of exceptions so every file is reported in one pass."""
    where = str(file)
    name = file.stem
    problems: list[Problem] = []
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        return None, [Problem(where, None, "", f"cannot read file: {exc.strerror}")]
    except UnicodeDecodeError as exc:
        return None, [Problem(where, text_line(file.read_bytes(), exc.start), "", f"not UTF-8 text (byte {exc.start}); save the file as UTF-8")]
    if name in BUILTIN_POLICIES:
        problems.append(Problem(where, None, "", f"{name!r} is Vault's built-in policy ({'attached to every token' if name == 'default' else 'all-powerful'}); gpufleet never writes it; allowed: {JOB_POLICY_PREFIX}<family>.hcl; rename the file"))
    elif name not in OPERATOR_POLICIES and not (POLICY_NAME.match(name) and name.startswith(JOB_POLICY_PREFIX) and len(name) > len(JOB_POLICY_PREFIX)):
        problems.append(Problem(where, None, "", f"policy name {name!r} is outside gpufleet's namespace; allowed: {JOB_POLICY_PREFIX}<family> (lowercase letters, digits, '-' or '_'); rename the file to {JOB_POLICY_PREFIX}{name if POLICY_NAME.match(name) else 'family'}.hcl"))
    if MANAGED_MARKER in text and name not in OPERATOR_POLICIES:
        problems.append(Problem(where, line_of_text(text, MANAGED_MARKER), "", f"{MANAGED_MARKER!r} is added by the sync; remove that line from the file"))
    try:
        parsed = hcl_loads(text)
    except ValueError as exc:
        line, message = hcl_error(str(exc), text)
        return None, [*problems, Problem(where, line, "", f"invalid HCL: {message}; fix the syntax (blocks look like: path \"secret/data/...\" {{ capabilities = [\"read\"] }})")]
    shape = structure_problems(text)
    if shape:
        return None, [*problems, *(Problem(where, line, field, message) for line, field, message in shape)]
    unknown = sorted(set(parsed) - {"path"})
    for key in unknown:
        problems.append(Problem(where, line_of_text(text, key), key, f"unknown top-level block {key!r}; allowed: path; remove it"))
    blocks = parsed.get("path", {})
    if not isinstance(blocks, dict) or not blocks:
        problems.append(Problem(where, 1, "path", "the policy grants nothing; add at least one path \"...\" { capabilities = [...] } block"))
        return None, problems
    rules = []
    for path, body in blocks.items():
        line = line_of_text(text, f'"{path}"')
        field = f'path "{path}"'
        if not isinstance(body, dict):
            problems.append(Problem(where, line, field, "must be a block; write path \"...\" { capabilities = [...] }"))
            continue
        for key in sorted(set(body) - BLOCK_FIELDS):
            problems.append(Problem(where, line, f"{field}.{key}", f"unknown field {key!r}; allowed: {', '.join(sorted(BLOCK_FIELDS))}; remove it"))
        caps = body.get("capabilities")
        if not isinstance(caps, list) or not caps or not all(isinstance(c, str) for c in caps):
            problems.append(Problem(where, line, f"{field}.capabilities", f"{caps!r} is not a list of capabilities; write capabilities = [\"read\"]"))
            continue
        for cap in caps:
            if cap not in VAULT_CAPABILITIES:
                problems.append(Problem(where, line, f"{field}.capabilities", f"{cap!r} is not a Vault capability; allowed: {', '.join(sorted(VAULT_CAPABILITIES))}"))
        rules.append(PolicyRule(path, tuple(caps), body.get("min_wrapping_ttl"), body.get("max_wrapping_ttl"), line, body.get("denied_parameters")))
    policy = PolicyFile(name, file, text, tuple(rules))
    problems.extend(_kind_problems(policy))
    return policy, problems


def structure_problems(text: str) -> list[tuple[int, str, str]]:
    """(line, field, message) for what pyhcl parses differently from Vault: pyhcl keeps the last
    of two blocks or keys with the same name, Vault (hashicorp/hcl v1, ``vault/policy.go``
    parsePaths) merges every ``path`` block. So a repeated ``path "x"`` or key would grant what
    the checks never saw. Only the plain form ``path "<path>" { key = value ... }`` is accepted."""
    import hcl.lexer

    lexer = hcl.lexer.Lexer()
    lexer.input(text)
    tokens = []
    while (token := lexer.token()) is not None:
        tokens.append(token)
    problems: list[tuple[int, str, str]] = []
    scopes: list[set[str]] = [set()]
    names: list[str] = [""]
    brackets = 0
    last = ""
    i = 0
    while i < len(tokens):
        token = tokens[i]
        after = [t.type for t in tokens[i + 1 : i + 3]]
        if token.type == "LEFTBRACKET":
            brackets += 1
        elif token.type == "RIGHTBRACKET":
            brackets -= 1
        elif brackets:
            pass
        elif token.type == "RIGHTBRACE":
            if len(scopes) > 1:
                scopes.pop()
                names.pop()
        elif len(scopes) == 1:
            if token.type == "IDENTIFIER" and token.value == "path" and after == ["STRING", "LEFTBRACE"]:
                key = f'path "{tokens[i + 1].value}"'
                if key in scopes[0]:
                    problems.append((token.lineno, key, "appears twice; Vault merges both blocks (gpufleet's checks would see only the last); write each path once"))
                scopes[0].add(key)
                scopes.append(set())
                names.append(key)
                i += 3
                continue
            if token.type == "IDENTIFIER" and token.value != "path":
                break  # an unknown top-level block: parse_policy names it
            problems.append((token.lineno, str(token.value), "top-level blocks must read path \"<path>\" { capabilities = [...] }; rewrite it in that form"))
            break
        elif token.type == "LEFTBRACE":  # the value of `key = {`
            scopes.append(set())
            names.append(last)
        elif token.type in ("IDENTIFIER", "STRING") and after[:1] in (["EQUAL"], ["LEFTBRACE"]):
            key = last = f"{names[-1]}.{token.value}"
            if key in scopes[-1]:
                problems.append((token.lineno, key, "appears twice; Vault would not read it as gpufleet's checks do; write each key once"))
            scopes[-1].add(key)
            if after[:1] == ["LEFTBRACE"]:
                scopes.append(set())
                names.append(key)
                i += 2
                continue
        i += 1
    return problems


def _kind_problems(policy: PolicyFile) -> list[Problem]:
    if policy.name in OPERATOR_POLICIES or policy.name in BUILTIN_POLICIES:
        return []
    return [p for rule in policy.rules for p in _job_rule(policy, rule)]


def _problem(policy: PolicyFile, rule: PolicyRule, suffix: str, message: str) -> Problem:
    return Problem(str(policy.file), rule.line, f'path "{rule.path}"{suffix}', message)


def _job_rule(policy: PolicyFile, rule: PolicyRule) -> list[Problem]:
    problems = []
    if not rule.path.startswith(API_KEYS_POLICY_PREFIX) or rule.path == API_KEYS_POLICY_PREFIX:
        hint = f" (KV v2 reads need the data/ segment: {KV_MOUNT}/data/{rule.path.removeprefix(f'{KV_MOUNT}/')})" if rule.path.startswith(f"{KV_MOUNT}/") and not rule.path.startswith(f"{KV_MOUNT}/data/") else ""
        problems.append(_problem(policy, rule, "", f"{rule.path!r} is outside {API_KEYS_POLICY_PREFIX}; job policies may only read API keys under {API_KEYS_POLICY_PREFIX}<name>{hint}; move the path there"))
    extra = sorted(set(rule.capabilities) - {"read"})
    if extra:
        problems.append(_problem(policy, rule, ".capabilities", f"{extra} not allowed in a job policy; allowed: [\"read\"]; job tokens are read-only, so set capabilities = [\"read\"]"))
    if rule.min_wrapping_ttl or rule.max_wrapping_ttl:
        problems.append(_problem(policy, rule, "", "wrapping TTLs belong to the orchestrator policy; remove min_wrapping_ttl/max_wrapping_ttl"))
    if rule.denied_parameters != CURRENT_VERSION_ONLY:
        problems.append(_problem(policy, rule, ".denied_parameters", f"{'missing' if rule.denied_parameters is None else repr(rule.denied_parameters)} is not allowed; allowed: {{\"version\" = []}}; without it the token also reads rotated-out versions (?version=N); add denied_parameters = {{ \"version\" = [] }} to the block"))
    return problems


def path_pattern(path: str) -> re.Pattern[str]:
    """A Vault ACL path as a regex: '+' is one segment, a trailing '*' any suffix (``vault/policy.go``)."""
    prefix = path.endswith("*")
    body = re.escape(path.removesuffix("*") if prefix else path).replace(r"\+", "[^/]+")
    return re.compile(body + (".*" if prefix else ""))


def _covers(pattern: str, path: str) -> bool:
    """Whether the rule ``pattern`` grants ``path`` (itself a rule path: its '+' read as one segment, its '*' as nothing more)."""
    probe = path.removesuffix("*").replace("+", "p") if path.endswith("*") else path.replace("+", "p")
    return bool(path_pattern(pattern).fullmatch(path) or path_pattern(pattern).fullmatch(probe))


_SEGMENT, _ANYTHING = "segment", "anything"


def _items(path: str) -> tuple[tuple[str, bool], ...]:
    """A rule path as (what one character may be, may repeat) items, read as ``path_pattern`` does:
    a literal character; '+' one or more characters other than '/'; a trailing '*' any suffix."""
    glob = path.endswith("*")
    items: list[tuple[str, bool]] = []
    for char in path.removesuffix("*") if glob else path:
        items += [(_SEGMENT, False), (_SEGMENT, True)] if char == "+" else [(char, False)]
    return (*items, (_ANYTHING, True)) if glob else tuple(items)


def _meet(one: str, other: str) -> str | None:
    """A character both items accept, or None."""
    wild = (_SEGMENT, _ANYTHING)
    if one in wild and other in wild:
        return "x"
    if one not in wild and other not in wild:
        return one if one == other else None
    char, kind = (other, one) if one in wild else (one, other)
    return None if kind == _SEGMENT and char == "/" else char


def common_path(one: str, other: str) -> str | None:
    """A path both rule paths grant, or None when they share none.

    Neither covering the other is not enough: ``ml-api-keys/team/*`` and ``ml-api-keys/+/prod-token``
    both grant ``ml-api-keys/team/prod-token`` (issue 22 red team). This walks the two patterns
    together, one character at a time (breadth first over pairs of positions, finite), and returns
    the first path that reaches the end of both.
    """
    a, b = _items(one), _items(other)
    seen = {(0, 0): ""}
    queue = deque(seen)
    while queue:
        i, j = queue.popleft()
        text = seen[(i, j)]
        if i == len(a) and j == len(b):
            return text
        moves = []
        if i < len(a) and a[i][1]:
            moves.append(((i + 1, j), text))
        if j < len(b) and b[j][1]:
            moves.append(((i, j + 1), text))
        if i < len(a) and j < len(b) and (char := _meet(a[i][0], b[j][0])) is not None:
            moves.append(((i if a[i][1] else i + 1, j if b[j][1] else j + 1), text + char))
        for state, walked in moves:
            if state not in seen:
                seen[state] = walked
                queue.append(state)
    return None


def family_problems(policies: dict[str, PolicyFile]) -> list[Problem]:
    """A key path belongs to the one job family (``ml-keys-<family>``) whose policy grants it.

    A rule of one family that covers a path another family's policy names (the same path, or a
    glob over it) gives that family's tasks the other's keys: refused on the granting rule, naming
    the owner. Equal paths are refused on both sides, each naming the other: a key two families
    need is two keys, one per family, so a leaked task token exposes one family only. Two globs
    that share a path without either covering the other are refused on both sides, naming a path
    both grant.
    """
    jobs = {name: policy for name, policy in sorted(policies.items())
            if name not in OPERATOR_POLICIES and name not in BUILTIN_POLICIES and name.startswith(JOB_POLICY_PREFIX)}
    problems = []
    for name, policy in jobs.items():
        own = name.removeprefix(JOB_POLICY_PREFIX)
        for rule in policy.rules:
            for other_name, other in jobs.items():
                if other_name == name:
                    continue
                family = other_name.removeprefix(JOB_POLICY_PREFIX)
                for owned in other.rules:
                    if _covers(rule.path, owned.path):
                        key = owned.path.removeprefix(API_KEYS_POLICY_PREFIX).rstrip("*").rstrip("/") or "key"
                        problems.append(_problem(policy, rule, "", (
                            f"grants {owned.path!r}, a key path of family {family!r} ({other.file.name}:{owned.line}); a job policy "
                            f"reads only its own family's keys; allowed: paths no other ml-keys-* policy names; give family "
                            f"{own!r} its own key (e.g. {API_KEYS_POLICY_PREFIX}{key}-{own}) or run the job under a role with {other_name}")))
                    elif not _covers(owned.path, rule.path) and (shared := common_path(rule.path, owned.path)) is not None:
                        problems.append(_problem(policy, rule, "", (
                            f"overlaps {owned.path!r}, a key path of family {family!r} ({other.file.name}:{owned.line}): both grant "
                            f"{shared!r}; a job policy reads only its own family's keys; allowed: patterns that share no path with "
                            f"another ml-keys-* policy's; name family {own!r}'s keys one by one, or narrow the glob to a sub-tree "
                            f"of its own (e.g. {API_KEYS_POLICY_PREFIX}{own}/*)")))
    return problems


def load_policies(directory: Path) -> tuple[dict[str, PolicyFile], list[Problem]]:
    """Every ``*.hcl`` in the directory by name (sorted), plus every problem found (per file, then across families)."""
    policies: dict[str, PolicyFile] = {}
    problems: list[Problem] = []
    for file in sorted(directory.glob("*.hcl")):
        policy, found = parse_policy(file)
        problems.extend(found)
        if policy is not None:
            policies[policy.name] = policy
    return policies, problems + family_problems(policies)
