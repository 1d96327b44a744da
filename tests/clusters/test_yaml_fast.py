"""The libyaml fast path (clusters/yaml_fast.py) gives exactly what ruamel.yaml's round-trip loader gives.

Differential: every YAML file of the repository, the benchmark's generated cluster files, and a few
thousand generated documents (tricky scalars, flow and block styles, comments, quoting, escapes) and
mutations of the repository's files are parsed by ``parse_yaml`` with the fast path and without it
(today's ruamel-only loader). Either the fast path declines, or the data are equal value for value and
type for type (key order too), ``line_of`` agrees on every path and on paths that do not exist, and
errors are the same Problems.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

from clusters import source, yaml_fast
from clusters.errors import ConfigError
from clusters.loader import CLUSTERS_DIR, load_all
from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from fleetgen import generated_fleet  # noqa: E402

SKIP_DIRS = {".venv", "node_modules", ".git", "cdktf.out"}


def repository_yaml() -> list[Path]:
    return sorted(p for p in REPO.rglob("*.y*ml") if p.suffix in (".yaml", ".yml") and not SKIP_DIRS & set(p.parts))


def outcome(text: str, fast: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """(data, raw) or the problems of ``parse_yaml``, with or without the fast path."""
    with monkeypatch.context() as patch:
        if not fast:
            patch.setattr(yaml_fast, "load", lambda text, max_nodes: None)
        try:
            return source.parse_yaml(Path("doc.yaml"), text)
        except ConfigError as exc:
            return [str(p) for p in exc.problems]
        except Exception as exc:  # today's loader lets some ruamel errors through; the fast path must too
            return f"raised {type(exc).__name__}: {exc}"


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types, dict keys in the same order, all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return b != b
    return a == b and repr(a) == repr(b)


def paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into ``node``, plus, at each level, one key and one index that do not exist."""
    out = [prefix, (*prefix, "no-such-key"), (*prefix, 10_000), (*prefix, -1)]
    if isinstance(node, dict):
        for key, value in node.items():
            out += paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out += paths(value, (*prefix, index))
    return out


def check(text: str, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Assert the fast path agrees with ruamel on ``text``; True when it was taken."""
    if yaml_fast.load(text, source.MAX_EXPANDED_NODES) is None:
        return False  # parse_yaml runs today's code unchanged
    slow = outcome(text, False, monkeypatch)
    assert isinstance(slow, source.YamlDocument), f"fast path took a document ruamel refuses: {text!r}: {slow}"
    fast = outcome(text, True, monkeypatch)
    assert same(fast.data, slow.data), f"{text!r}:\n{fast.data!r}\n{slow.data!r}"
    for path in paths(slow.data):
        assert fast.line_of(path) == slow.line_of(path), f"{text!r}: line of {path}"
    return True


# Scalars where YAML 1.1 (libyaml's rules) and 1.2 (ruamel's) differ, or where ruamel makes its own types.
SCALARS = [
    "yes", "No", "on", "OFF", "y", "n", "true", "False", "TRUE", "017", "0o17", "0o", "0x1F", "0X1F", "0xAb",
    "0b101", "0b", "1:30", "1:30:00", "190:20:30.15", "1_000", "1__0", "_1", "1_", "0_1", "+1", "-0", "00",
    "1.5", "1.", ".5", "1e3", "1E3", "1.0e+3", "1.0e-3", "-1.5e3", "6.8523015e+5", "685.230_15e+03", "1_0.5",
    ".inf", "-.Inf", "+.INF", ".NaN", ".nan", "nan", "inf", "~", "null", "Null", "NULL", "nul", "2026-12-05",
    "2026-12-05T10:00:00Z", "2026-12-5 1:02:03.5 +01:00", "2026-12-05t10:00:00.123-05:30", "2026-13-45",
    "<<", "=", "-", "--", "-a", "a-b", "a:b", "a:", "a::b", "http://x:80/y?z#w", "a?b", "a#b", "a !b",
    "@x", "`x", "%x", "a,b", "a]b", "a}b", "ü", "日本", "🙂", "a b", "a  b", "x" * 300, "0.0.0.0/0", "10.0.0.1",
    "'quoted'", "'it''s'", "''", '""', '"a\\"b"', '"\\x41\\u00e9\\U0001F642"', '"\\/\\N\\_\\L\\P\\0\\a\\e\\ "',
    '"\\ud83d\\ude42"', '"\\q"', '"\\t\\n\\r\\b\\f\\v"', '"a # b"', "'a: b'", '"yes"', "'017'", '"~"', '"\\x"',
    "[]", "{}", "[a, [b, {c: d}]]", "{a: [1, 2], b: {c: ~}}", "[a: b]", "[? a : b]", "{a}", "{a: }", "[a, ]",
    "[:a]", "[a:]", "[a:b]", "{a:b}", '{"a":1}', "[a #b]", "[a#b]", "[a?b]", "[?a]", "[-a]", "[- a]", "{? a}",
    '["x":y]', "['x':y]", '{"x":y}', '["x" :y]', '{"x" :y}', '["x":]', '["x":[1]]', "[x: ]", "{x:}", "[a :b]",
    "[a,b]", "{a:1,b:2}", "[a ,b]", "[a , ]", "{a: [b,c]:d}", "[{a: b}: c]", "[a\n ,b]", "{a: 1\n, b: 2}",
    "[\n  a,\n  b\n]", "{\n a: 1,\n b: [x,\n y]}", "[a\n# c\n, b]", "a # [b]", "[a] # c", "[a] x",
]
# What the fast path leaves to ruamel: tags, anchors, aliases, block and multi-line scalars.
OUTSIDE = ["&a x", "*a", "!!str 017", "!!int '7'", "! 17", "!x y", "|", ">", "|-\n  a", ">+\n  a\n",
           "'a\n  b'", '"a\\\n  b"', "a\n  b", "&a [1]", "!!map {a: 1}"]
KEYS = ["name", "a", "b", "yes", "1", "'1'", '"k"', "~", "<<", "=", "a b", "ü", "x" * 200, "'a: b'", "? a",
        "[a]", "{a: 1}", "-a", "a-", ":a", "null", "''", "a#b", "0o17", '"a\\tb"', "a?b", "a:b", "k" * 1100,
        '"' + "q" * 1100 + '"', "2026-12-05", "1.5", "true", "日本"]
COMMENTS = ["", "", "  # note", " #x", "#x", "   ", " # yes: no"]
VALID_COMMENTS = ["", "", "  # note", " #x", "   ", " # yes: no"]


def _loads(text: str) -> bool:
    try:
        YAML(typ="rt").load(text)
    except Exception:
        return False
    return True


# Half the documents use only the scalars and keys ruamel reads alone, so most of those load at all.
VALID_SCALARS = [s for s in SCALARS if _loads(f"a: {s}\n") and _loads(f"a: [{s}]\n".replace("\n", " ", s.count("\n")))]
VALID_KEYS = [k for k in KEYS if _loads(f"{k}: 1\n")]


def scalar(rng: random.Random, valid: bool = False) -> str:
    if valid:
        return rng.choice(VALID_SCALARS)
    return rng.choice(OUTSIDE) if rng.random() < 0.03 else rng.choice(SCALARS)


def comment(rng: random.Random, valid: bool) -> str:
    return rng.choice(VALID_COMMENTS if valid else COMMENTS)


def flow(rng: random.Random, depth: int = 0, valid: bool = False) -> str:
    """A random flow collection, items separated by random spaces and line breaks."""
    gap = lambda: rng.choice(["", " ", "  ", "\n  ", " \n"])  # noqa: E731
    opening, closing = rng.choice(["[]", "{}"])
    items = []
    for index in range(rng.randint(0, 3)):
        item = flow(rng, depth + 1, valid) if depth < 2 and rng.random() < 0.3 else scalar(rng, valid).replace("\n", " ")
        if rng.random() < 0.3 and not valid:
            item = f"{rng.choice(KEYS)}:{rng.choice(['', ' ', ' '])}{item}"
        if valid and opening == "{":
            item = f"f{index}: {item}"
        items.append(gap() + item + gap())
    return opening + ",".join(items) + (rng.choice(["", ","]) if items or not valid else "") + closing


def document(rng: random.Random, depth: int = 0, indent: str = "", valid: bool = False) -> str:
    """A random block mapping whose values are scalars, flow collections or nested blocks."""
    lines = []
    keys = [rng.choice(VALID_KEYS if valid else KEYS) if rng.random() < 0.3 else f"k{i}" for i in range(rng.randint(1, 4))]
    for key in dict.fromkeys(keys) if valid else keys:
        roll = rng.random()
        if depth < 3 and roll < 0.2:
            lines.append(f"{indent}{key}:{comment(rng, valid)}")
            lines.append(document(rng, depth + 1, indent + rng.choice(["  ", "    ", " "]), valid))
        elif depth < 3 and roll < 0.4:
            lines.append(f"{indent}{key}:{comment(rng, valid)}")
            item_indent = indent + rng.choice(["", "  "])
            for _ in range(rng.randint(1, 3)):
                if rng.random() < 0.3:
                    lines.append(f"{item_indent}-" + rng.choice(["", " # c"]))
                    lines.append(document(rng, depth + 1, item_indent + "  ", valid))
                elif rng.random() < 0.2:
                    lines.append(f"{item_indent}- " + document(rng, depth + 1, item_indent + "  ", valid).lstrip())
                else:
                    lines.append(f"{item_indent}- {scalar(rng, valid)}{comment(rng, valid)}")
        elif roll < 0.6:
            lines.append(f"{indent}{key}: {flow(rng, 0, valid).replace(chr(10), chr(10) + indent + '  ')}{comment(rng, valid)}")
        else:
            lines.append(f"{indent}{key}:{rng.choice([' ', '  '] if valid else [' ', '  ', ''])}{scalar(rng, valid)}{comment(rng, valid)}")
        if rng.random() < 0.1:
            lines.append(rng.choice(["", "# comment", indent + "# indented comment", indent + "  "]))
    return "\n".join(lines)


def corpus(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(count):
        text = document(rng, valid=rng.random() < 0.5) + "\n"
        roll = rng.random()
        if roll < 0.05:
            text = "---\n" + text
        elif roll < 0.08:
            text = text + rng.choice(["...\n", "... # c\n", "...\n# c\n", "...\n...\n", "...\n\n# c\n... # d\n"])
        elif roll < 0.1:
            text = text + "---\nb: 2\n"
        elif roll < 0.12:
            text = "%YAML 1.1\n---\n" + text
        docs.append(text)
    return docs


def commented(rng: random.Random) -> str:
    """A block document with comments and blank lines at token boundaries: after keys, '?', '-' and
    values, between a key and its value on a later line (where ruamel's comment handling raises,
    _COMMENT_CRASH), and in nested sequences and mappings."""
    def eol() -> str:
        return rng.choice(["", "", " # c", "  #c"])

    def gaps(indent: str) -> str:
        return "".join(rng.choice(["\n", "\n# x", f"\n{indent}# y", f"\n{indent}   # z", "\n   "])
                       for _ in range(rng.choice([0, 0, 1, 1, 2, 3])))

    def value(indent: str, depth: int) -> str:
        roll = rng.random()
        if depth < 3 and roll < 0.3:
            return mapping(indent + rng.choice(["  ", " "]), depth + 1)
        if depth < 3 and roll < 0.55:
            return sequence(indent + rng.choice(["  ", "", " "]), depth + 1)
        text = rng.choice(["b", "'b'", '"b"', "[b]", "{b: 1}", "1", "", "b c", f"[b,\n{indent}  c]"])
        if rng.random() < 0.3:
            return eol() + gaps(indent) + f"\n{indent}  {text}" + eol()
        return f" {text}" + eol()

    def mapping(indent: str, depth: int) -> str:
        out = ""
        for index in range(rng.randint(1, 3)):
            key = f"? k{index}{eol()}{gaps(indent)}\n{indent}:" if rng.random() < 0.1 else f"k{index}:"
            out += f"\n{indent}{key}{value(indent, depth)}{gaps(indent)}"
        return out

    def sequence(indent: str, depth: int) -> str:
        out = ""
        for _ in range(rng.randint(1, 3)):
            roll = rng.random()
            if roll < 0.3 and depth < 3:
                out += f"\n{indent}-{eol()}{gaps(indent)}{mapping(indent + '  ', depth + 1)}"
            elif roll < 0.45 and depth < 3:
                out += f"\n{indent}- " + mapping(indent + "  ", depth + 1).lstrip()
            else:
                out += f"\n{indent}-{value(indent, depth)}"
            out += gaps(indent)
        return out

    head = rng.choice(["", "# top\n", "\n", "---\n", "--- # c\n"])
    return head + mapping("", 0).lstrip("\n") + rng.choice(["\n", "", "\n# end\n", "\n...\n"])


def mutations(seed: int, count: int) -> list[str]:
    """Repository files with one to three characters inserted, replaced or deleted at random."""
    rng = random.Random(seed)
    files = [p.read_text() for p in repository_yaml() if p.stat().st_size < 6000]
    chars = list(":-?#'\"[]{},&*!|>%@` \n\\\t") + ["\r", "\ufeff", "  ", "- ", ": ", "yes", "0x", "~"]
    out = []
    for _ in range(count):
        text = rng.choice(files)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(text) + 1)
            roll = rng.random()
            if roll < 0.4:
                text = text[:at] + rng.choice(chars) + text[at:]
            elif roll < 0.7:
                text = text[:at] + rng.choice(chars) + text[at + 1:]
            else:
                text = text[:at] + text[at + 1:]
        out.append(text)
    return out


def test_repository_files_load_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    files = repository_yaml()
    assert len(files) > 20
    taken = {p.relative_to(REPO).as_posix() for p in files if check(p.read_text(encoding="utf-8"), monkeypatch)}
    # the files gpufleet loads through parse_yaml are all inside the subset
    assert {f"clusters/{p.name}" for p in CLUSTERS_DIR.glob("*.yaml")} <= taken
    assert {"vault_policies/roles.yaml", "jobs/finetune-llama.yaml", "jobs/finetune-llama-gke.yaml"} <= taken


def test_generated_cluster_files_load_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for path in sorted(generated_fleet(tmp_path, range(3)).glob("*.yaml")):
        assert check(path.read_text(), monkeypatch)


@pytest.mark.parametrize("seed", range(8))
def test_generated_documents_load_the_same(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = corpus(seed, 500)
    taken = sum(check(text, monkeypatch) for text in docs)
    assert 0 < taken < len(docs)  # both sides are exercised


@pytest.mark.parametrize("seed", range(2))
def test_commented_documents_load_the_same(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    taken = sum(check(commented(rng), monkeypatch) for _ in range(400))
    assert 0 < taken < 400


@pytest.mark.parametrize("seed", range(4))
def test_mutated_repository_files_load_the_same(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = mutations(seed, 400)
    taken = sum(check(text, monkeypatch) for text in docs)
    assert 0 < taken < len(docs)


@pytest.mark.parametrize("text", [
    "a: 1\na: 2\n", "a: [1\n", "a:\n\tb: 1\n", "a: \x07\n", "- a\n", "a\n", "", "# only\n", "a: 1\n---\nb: 2\n",
    "a: &x [1]\nb: *x\n", "a: *x\n", "a: {b: 1, b: 2}\n", "a: !!int x\n", "a: 0b_\n", "\ufeffa: 1\n", "a: 1\r\nb: 2\r\n",
    "a: |\n  x\n", "a: 'x\n  y'\n", "a: \"\\ud800\"\n", "1: a\n", "<<: {a: 1}\n", "? [a]\n: b\n",
    # past source.MAX_EXPANDED_NODES: refused as an alias bomb when the text holds '&' or '*', else loaded
    "a: '&'\nb: [" + ",".join(["1"] * 10_001) + "]\n", "b: [" + ",".join(["1"] * 10_001) + "]\n",
    "a: " + "1" * 5000 + "\n",  # past Python's int() digit limit: ruamel's ValueError, as today
    "a: # c\n  b\n\nc: 1\n",  # ruamel 0.19.1's "overlap in comment" NotImplementedError, as today
    # a second '...': libyaml skips it, ruamel's YAML 1.2 parser opens an empty document after an explicit end
    "a: 1\n...\n...\n", "---\na: {b: 1}\n... # end\n\n# c\n...\n", "a: 1\n...\n...",
    "a: 1\n...\n" + "#" * 200 + "\n...\n",  # and the check after '...' stays linear on a run of '#'
    # nested deeper than ruamel's recursive composer reaches (RecursionError today), though far under the node bound
    "a: " + "[" * 400 + "]" * 400 + "\n", "".join(" " * i + f"k{i}:\n" for i in range(400)) + " " * 400 + "x: 1\n",
], ids=lambda text: text[:40])
def test_documents_outside_the_subset_give_todays_result(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Errors (duplicate keys, syntax, tabs, control characters, a list or nothing at the top, alias
    bounds) and everything outside the subset go to ruamel: the same Problems or data as before."""
    assert yaml_fast.load(text, source.MAX_EXPANDED_NODES) is None
    fast, slow = outcome(text, True, monkeypatch), outcome(text, False, monkeypatch)
    shown = lambda result: repr(result.data) if isinstance(result, source.YamlDocument) else result  # noqa: E731
    assert shown(fast) == shown(slow)


def test_nesting_up_to_the_depth_bound_is_taken_and_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    """The root mapping is level 1: documents of MAX_DEPTH levels are the deepest the fast path builds."""
    def flow(levels: int) -> str:
        return "a: " + "[" * (levels - 1) + "]" * (levels - 1) + "\n"

    def block(levels: int) -> str:
        return "".join(" " * i + f"k{i}:\n" for i in range(levels - 1)) + " " * (levels - 1) + "x: 1\n"

    assert check(flow(yaml_fast.MAX_DEPTH), monkeypatch) and check(block(yaml_fast.MAX_DEPTH), monkeypatch)
    assert yaml_fast.load(flow(yaml_fast.MAX_DEPTH + 1), source.MAX_EXPANDED_NODES) is None
    assert yaml_fast.load(block(yaml_fast.MAX_DEPTH + 1), source.MAX_EXPANDED_NODES) is None


def test_the_fast_path_loads_the_example_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not timing: with ruamel's loader removed, every example cluster file still loads."""
    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("ruamel's loader was used")

    monkeypatch.setattr(source, "_ruamel_load", refused)
    assert len(load_all(CLUSTERS_DIR)) == len(list(CLUSTERS_DIR.glob("*.yaml")))


def test_only_the_reviewed_parser_versions_take_the_fast_path() -> None:
    """A bump of PyYAML, libyaml or ruamel.yaml must rerun this file and update yaml_fast.REVIEWED."""
    assert yaml_fast.INSTALLED == yaml_fast.REVIEWED
