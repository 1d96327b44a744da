"""One long-lived checkov process that scans many stacks, a chunk at a time, with checkov's own CLI code.

Run by ``safety.checkov_scan`` with the interpreter checkov is installed in (it imports only
checkov and the standard library, so it runs as a script there); not a gpufleet entry point.

Why (profiled with py-spy, checkov 3.3.30, 40 synthesized fleet stacks in one process): 60% of
checkov's time went to rendering attribute values (``evaluate_terraform`` over the CEL
expressions of the scheduler stacks' admission policies, the same strings in every stack), 15%
to parsing the JSON with a pure-Python YAML loader (for line numbers), 7% to imports; the checks
themselves were a few percent. So this process:

- imports checkov once and runs ``Checkov(argv).run()``, the CLI's own entry, once per chunk of
  stacks, with the argv ``checkov_scan`` would pass the CLI (same options, same report);
- remembers ``evaluate_terraform``'s result per input string for the life of the process, while
  checkov's asteval symbol table is its own (``remember_rendering``; ``timestamp()``, its only
  clock, is never remembered), every caller gets its own copy of a mutable result, and a result
  it raised is not remembered;
- parses with libyaml's C scanner and parser under checkov's own ``SafeLineLoader`` constructor
  (same ``__startline__``/``__endline__`` marks, same booleans), when PyYAML has libyaml and the
  text is of the kind both read alike (JSON in printable ASCII, no surrogate escape; else checkov's loader);
- runs checkov once per stack file, each from checkov's own symbol table, so a stack's result is what
  ``checkov -f <that file>`` reports, whichever stacks share its chunk (``scan``);
- holds one stack's graph at a time, not the whole fleet's (the memory of a cold check);
- drops checkov's in-memory copy of its debug log and sets the collector's generations for a process
  whose own objects (checkov's modules and check registries) live as long as it does (``lighten``).

Profiled again with cProfile (one worker, 31 synthesized stacks after a warm-up, CPU per stack):
89-97 ms before ``lighten``, 62-70 ms after, at the same results; about 11% of the time went to
formatting checkov's debug records into a buffer nobody reads and about 20% to the cyclic
collector walking checkov's own long-lived objects again and again.

``tests/safety/test_checkov_worker.py`` scans real synthesized stacks and stacks with known
failures both through this worker and through the plain ``checkov`` CLI and requires the same
passed and failed checks (ids, resources, lines) per file.

Protocol: argv is checkov's arguments without ``-f``; each stdin line is a JSON list of stack files
(one chunk), answered by one stdout line: ``{"reports": [...]}`` with checkov's JSON report(s) of
each file, cut to the fields ``checkov_scan`` reads, or ``{"error": "..."}`` when a run of that chunk failed.
The process ends when stdin closes. Chunks are handed out one at a time, so two workers share a
fleet's stacks however their costs differ.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import io
import json
import os
import sys
import re
import traceback
import warnings
from collections.abc import Callable
from typing import Any

_IMMUTABLE = (str, int, float, bool, type(None))


# The checkov whose source every replacement here was checked against, line by line: the remembered
# renderings (``remember_rendering``), the libyaml loader (``parse_with_libyaml``) and ``equivalent_shortcuts``.
# Another version runs checkov's own functions; tests/safety/test_checkov_worker.py fails on an upgrade
# until the new source is read and named here.
REVIEWED_CHECKOV = "3.3.30"
# checkov 3.3.30 pins it (its METADATA); ``_Dpath`` reproduces this version's search and get.
REVIEWED_DPATH = "2.1.3"


def _reviewed() -> bool:
    from checkov.version import version

    return version == REVIEWED_CHECKOV


def remember_rendering() -> Callable[[], None]:
    """Memoize checkov's ``evaluate_terraform`` per (string, keep_interpolations) in this process; returns
    the reset each chunk starts with.

    Rendering is a function of the string only while checkov's asteval symbol table is as checkov
    made it: asteval runs over the module-level ``SAFE_EVAL_DICT`` (checkov 3.3.30
    safe_eval_functions.py, ``get_asteval``), so rendering a string such as ``x = 'allUsers'``
    defines ``x`` for every later rendering in the process. So a rendering is remembered and served
    only while that table is untouched, and each chunk starts from checkov's own table, as a fresh
    ``checkov`` process does. With a checkov other than ``REVIEWED_CHECKOV`` nothing is remembered, but each chunk
    still starts from checkov's own table (the reset).
    """
    from checkov.terraform.graph_builder.variable_rendering import evaluate_terraform as module
    from checkov.terraform.graph_builder.variable_rendering import safe_eval_functions

    symbols = safe_eval_functions.SAFE_EVAL_DICT
    safe_eval_functions.get_asteval()  # every asteval Interpreter binds its own printer as "print" (asteval.py:144)
    pristine = dict(symbols)
    own = [(name, value) for name, value in pristine.items() if name != "print"]
    original = module.evaluate_terraform
    known: dict[tuple[str, bool], Any] = {}

    def untouched() -> bool:
        return len(symbols) == len(pristine) and all(symbols.get(name, symbols) is value for name, value in own)

    def evaluate_terraform(input_str: Any, keep_interpolations: bool = True) -> Any:
        if type(input_str) is not str or "timestamp" in input_str or not untouched():
            return original(input_str, keep_interpolations)
        key = (input_str, keep_interpolations)
        try:
            value = known[key]
        except KeyError:
            value = original(input_str, keep_interpolations)
            if not untouched():  # this string assigned a name: its rendering changes what later ones render
                return value
            known[key] = value
        return value if type(value) in _IMMUTABLE else copy.deepcopy(value)

    def reset() -> None:
        symbols.clear()
        symbols.update(pristine)

    # the renderer and evaluate_terraform's own recursion both look it up on the module at each call
    if _reviewed():
        module.evaluate_terraform = evaluate_terraform
    return reset


# Text libyaml reads as checkov's pure-Python loader does (PyYAML 6.0.4, libyaml 0.2.6): JSON in printable
# ASCII lines with no ``\\uD800``-``\\uDFFF`` escape (no difference in line marks or values in 120,000
# random such documents). Outside it they differ: libyaml takes a tab between tokens (the pure loader
# fails, so the CLI reports the stack unparsable), a byte-order mark at any line start and, in text that
# is not JSON, a plain ``a?b`` key in braces; it rejects the surrogate escapes ``json.dumps`` writes for
# an emoji (the pure loader reads them).
_LIBYAML_READS_ALIKE = re.compile(r"[\n\x20-\x7e]*")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_with_libyaml() -> None:
    """checkov's ``SafeLineLoader`` (its constructor: line marks, booleans) over libyaml's scanner and parser,
    for text both read alike (JSON matching ``_LIBYAML_READS_ALIKE``); any other text gets checkov's own loader.
    Only with checkov ``REVIEWED_CHECKOV``."""
    import yaml
    from checkov.common.parsers.yaml import loader

    if not getattr(yaml, "__with_libyaml__", False) or not _reviewed():
        return
    from yaml._yaml import CParser  # type: ignore[import-not-found]
    from yaml.constructor import SafeConstructor
    from yaml.resolver import Resolver

    pure = loader.SafeLineLoader

    class CSafeLineLoader(CParser, pure):  # type: ignore[misc, valid-type]
        def __init__(self, stream: Any) -> None:
            CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    def is_json(text: str) -> bool:
        try:
            json.loads(text)
        except (ValueError, RecursionError):
            return False
        return True

    def line_loader(stream: Any) -> Any:
        alike = isinstance(stream, str) and _LIBYAML_READS_ALIKE.fullmatch(stream) and not _SURROGATE_ESCAPE.search(stream)
        return CSafeLineLoader(stream) if alike and is_json(stream) else pure(stream)

    loader.SafeLineLoader = line_loader  # checkov's loads() passes it to yaml.load_all, which only calls it


class _Unusual(Exception):
    """A value nested deeper than ``_flatten`` walks; the caller falls back to checkov's own code, so a value too
    deep for checkov's recursion fails as it does there."""


_FLATTEN_DEPTH = 200


def _flatten(out: dict[str, Any], key: Any, value: Any, strip_list: bool, depth: int) -> None:
    """Into ``out``: what checkov's ``get_inner_attributes`` returns for (key, value), same keys in the same order.

    checkov (3.3.30, common/graph/graph_builder/graph_components/blocks.py:293-320 and its terraform override,
    terraform/graph_builder/graph_components/blocks.py:227-239) builds one dict per nesting level and
    merges each into its parent's (``inner_attributes.update``), so a value nested n deep is copied n
    times. Writing every entry once into one dict, in the order checkov first inserts it, gives the same
    dict: a path is written before its descendants, whose paths are longer, so the value read back for
    a container's item is the one its own walk wrote; where two paths meet (``a.b`` under ``x`` is also the
    path of ``b`` under ``x.a``) the later write wins in place, as with ``update``. Like checkov, a one-item
    list is unwrapped below the top level, and an empty-string key is deleted from the caller's dict
    (blocks.py:315-316), not walked. Deeper than ``_FLATTEN_DEPTH`` it raises ``_Unusual``."""
    if strip_list and isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, dict):
        if depth > _FLATTEN_DEPTH:
            raise _Unusual
        mapping: dict[str, Any] = {}
        out[key] = mapping
        for name in list(value.keys()):
            if name == "":
                del value[name]
                continue
            inner, item = f"{key}.{name}", value[name]
            if isinstance(item, (dict, list)):
                _flatten(out, inner, item, True, depth + 1)
                item = out[inner]
            else:  # a leaf inline: most entries are, and a call each was the largest cost left
                out[inner] = item
            mapping[name] = item
    elif isinstance(value, list):
        if depth > _FLATTEN_DEPTH:
            raise _Unusual
        items: list[Any] = [None] * len(value)
        out[key] = items
        for index in range(len(value)):
            inner, item = f"{key}.{index}", value[index]
            if isinstance(item, (dict, list)):
                _flatten(out, inner, item, True, depth + 1)
                item = out[inner]
            else:
                out[inner] = item
            items[index] = item
    else:
        out[key] = value


# dpath 2.1.3's leaves (dpath/segments.py:35-41): its walk yields no path below one.
_DPATH_LEAVES = (bytes, str, int, float, bool, type(None))
_DIGIT_CLASS = re.compile(r"\[([0-9])\]")


def _literal_glob(glob: Any) -> list[str] | None:
    """The segments of a dpath glob whose every segment matches a key by equality: none holds ``*``, ``?`` or ``[``
    (``fnmatchcase`` of such a pattern is equality), or it is exactly a one-digit class ``[d]``, which
    ``fnmatchcase`` matches to ``"d"`` alone (checkov writes list positions that way:
    ``settings/[0]/backup_configuration``); None for any other glob, and for ``"/"``, which ``get`` answers itself."""
    if type(glob) is not str or glob == "/":
        return None
    parts: list[str] = []
    for part in glob.lstrip("/").split("/"):
        digit = _DIGIT_CLASS.fullmatch(part)
        if digit is not None:
            parts.append(digit.group(1))
        elif "*" in part or "?" in part or "[" in part:
            return None
        else:
            parts.append(part)
    return parts


def _plain_tree(node: Any, depth: int = 0) -> bool:
    """Whether dpath's ``walk`` over ``node`` meets only dicts with non-empty ``str`` keys, lists and leaves, so it
    cannot raise (an empty key anywhere raises ``InvalidKeyName``, segments.py:71-76) and matches keys by string."""
    if isinstance(node, _DPATH_LEAVES):
        return True
    if depth > _FLATTEN_DEPTH:
        return False
    if type(node) is dict:
        for key, value in node.items():
            if type(key) is not str or not key or not _plain_tree(value, depth + 1):
                return False
        return True
    if type(node) is list:
        for value in node:
            if not _plain_tree(value, depth + 1):
                return False
        return True
    return False


def _list_index(part: str, length: int) -> int | None:
    """The position of a list of ``length`` that dpath's ``match`` (segments.py:230-246) pairs with the glob segment
    ``part``: ``SymmetricInt(i, length) == int(part)`` when ``int`` reads it (negative counts from the end, as
    ``SymmetricInt.__eq__`` does, types.py:20-27), else ``fnmatchcase(str(i), part)``, which for a segment
    ``_literal_glob`` lets through is equality."""
    try:
        wanted = int(part)
    except ValueError:  # no position's decimal text equals a segment int() cannot read
        return None
    if -length < wanted < length:
        return wanted % length
    return None


def _dpath_match(obj: Any, parts: list[str], symmetric: Any) -> tuple[tuple[Any, ...], Any] | None:
    """The one path (keys, and ``SymmetricInt`` positions as dpath's walk names them) and value under ``obj`` that a
    literal glob matches, or None. Below a dict only the key equal to the segment can match (keys are ``str``),
    below a list only ``_list_index``'s position, below a leaf nothing: at most one path matches. ``symmetric``:
    dpath's ``SymmetricInt``."""
    node, path = obj, []
    for part in parts:
        if type(node) is dict:
            if part not in node:
                return None
            path.append(part)
            node = node[part]
        elif type(node) is list:
            index = _list_index(part, len(node))
            if index is None:
                return None
            path.append(symmetric(index, len(node)))
            node = node[index]
        else:
            return None
    return tuple(path), node


class _Dpath:
    """``dpath`` as checkov's value checks see it (``base_resource_value_check.py:61-63``,
    ``base_resource_negative_value_check.py:39-49``): ``search(conf, key) != {}`` and then ``get(conf, key)``
    for each check of each resource. dpath answers both by walking every path of the resource and matching
    each against the glob with ``fnmatchcase``, about 16% of a worker's time in a cold check of 200 clusters.
    For a literal glob (``_literal_glob``) over a plain tree (``_plain_tree``) the answer is the one path found
    by following the glob (``_dpath_match``): ``search`` returns what dpath builds for it (``segments.set``
    with ``segments.types``, as dpath/__init__.py:236-241 does), or ``{}``; ``get`` its value, or
    ``KeyError(glob)`` (dpath/__init__.py:170-193). Every other call, and any other attribute, is dpath's. (A red
    team found one difference, not reachable from parsed Terraform: called a frame or two from the interpreter's
    recursion limit, one of the two may meet ``RecursionError`` where the other does not.)"""

    def __init__(self, dpath: Any) -> None:
        from dpath import segments
        from dpath.types import SymmetricInt

        self._dpath, self._segments, self._symmetric = dpath, segments, SymmetricInt

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dpath, name)

    def search(self, obj: Any, glob: Any, *args: Any, **kwargs: Any) -> Any:
        parts = None if args or kwargs else _literal_glob(glob)
        if parts is None or not _plain_tree(obj):
            return self._dpath.search(obj, glob, *args, **kwargs)
        found = _dpath_match(obj, parts, self._symmetric)
        result: dict[Any, Any] = {}
        if found is not None:
            path, value = found
            self._segments.set(result, path, value, hints=self._segments.types(obj, path))
        return result

    def get(self, obj: Any, glob: Any, *args: Any, **kwargs: Any) -> Any:
        parts = None if args or kwargs else _literal_glob(glob)
        if parts is None or not _plain_tree(obj):
            return self._dpath.get(obj, glob, *args, **kwargs)
        found = _dpath_match(obj, parts, self._symmetric)
        if found is None:
            raise KeyError(glob)
        return found[1]


def equivalent_shortcuts() -> bool:
    """Replace three checkov functions the profile of a stack's run ranks high with ones that return the same;
    only in checkov ``REVIEWED_CHECKOV`` (returns whether they were replaced).

    Measured with cProfile and per-phase CPU timers over 41 synthesized stacks of a 20-cluster fleet
    (docs/checkov-workers.md): about 9 ms of a stack's 65 went to ``attribute_has_nested_attributes``,
    3 ms to ``get_inner_attributes`` merging dicts level by level, and 4 ms to the thread pool each run
    starts for the graph checks. ``tests/safety/test_checkov_worker.py`` compares each replacement with
    checkov's original on every vertex of real stacks and on unusual values, and the worker's findings
    with the CLI's.

    - ``attribute_has_nested_attributes`` (terraform/graph_builder/utils.py:301-318) lists, for every
      attribute, every other attribute key it prefixes and searches them for ``.<digits>``, and only then
      looks at the value: True for a dict, False for anything but a list, and for a list whether that
      search found something. The replacement looks at the value first and searches only for a list
      that is not a leaf. It is imported by name into local_graph.py:33 and renderer.py:27, its only
      callers, so those names are replaced too.
    - ``TerraformBlock.get_inner_attributes``: ``_flatten``, and checkov's own code for what it does not
      reproduce (``_Unusual``).
    - ``BaseRegistry.run_checks`` (common/graph/checks_infra/registry.py:24-36) runs the graph checks of
      one run on a new ``ThreadPoolExecutor``; each check reads the graph and writes only its own entry
      of the results (registry.py:38-50). The replacement runs them one after another in this thread,
      which is one of the orders the pool may already run them in; results keep the checks' order
      instead of their finishing order, and ``checkov_scan`` sorts findings anyway. checkov only waits
      for the futures (registry.py:32-35), never reads them: a check that raises (a complex check's
      ``not_contains`` on a number, for one) leaves no result and the others run on, so the loop
      drops its exception the same way. Checks also write into the graph's vertices (a jsonpath
      match's path, common/checks_infra/solvers/attribute_solvers/base_attribute_solver.py:179-182; a
      connection check's connected node, connections_solvers/connection_exists_solver.py:86-87): no
      terraform graph check reads a path with a bracket or a top-level wildcard, and the connected node
      is not in what ``checkov_scan`` reads (``_cut``), so which check writes first changes no finding.
    """
    if not _reviewed():
        return False
    from checkov.common.graph.checks_infra.registry import BaseRegistry
    from checkov.terraform.graph_builder import local_graph, utils
    from checkov.terraform.graph_builder.graph_components.blocks import TerraformBlock
    from checkov.terraform.graph_builder.variable_rendering import renderer

    nested = utils.NESTED_ATTRIBUTE_PATTERN

    class CheckovsOwn(TerraformBlock):  # type: ignore[misc]
        """checkov's own ``get_inner_attributes``, also for the levels it recurses into: its recursion looks the
        method up on the class it is called on (blocks.py:313), which would otherwise find the replacement."""

        get_inner_attributes = TerraformBlock.__dict__["get_inner_attributes"]

    def attribute_has_nested_attributes(attribute_key: str, attributes: dict[str, Any],
                                        attribute_is_leaf: dict[str, bool] | None = None) -> bool:
        value = attributes[attribute_key]
        if isinstance(value, dict):
            return True
        if not isinstance(value, list) or (attribute_is_leaf and attribute_is_leaf.get(attribute_key)):
            return False
        return any(nested.search(key) for key in attributes if key.startswith(attribute_key) and key != attribute_key)

    def get_inner_attributes(cls: type, attribute_key: Any, attribute_value: Any, strip_list: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            _flatten(out, attribute_key, attribute_value, strip_list, 0)
        except _Unusual:
            return CheckovsOwn.get_inner_attributes(attribute_key, attribute_value, strip_list)
        return out

    def run_checks(self: Any, graph_connector: Any, runner_filter: Any, report_type: str) -> dict[Any, Any]:
        check_results: dict[Any, Any] = {}
        for check in [c for c in self.checks if runner_filter.should_run_check(c, report_type=report_type)]:
            try:
                self.run_check_parallel(check, check_results, graph_connector)
            except Exception:  # noqa: BLE001 - the pool's future kept it and nobody read it: the check leaves no result
                continue
        return check_results

    import dpath
    from checkov.terraform.checks.resource import base_resource_negative_value_check, base_resource_value_check
    from dpath.version import VERSION as dpath_version

    if dpath_version == REVIEWED_DPATH:
        base_resource_value_check.dpath = _Dpath(dpath)
        base_resource_negative_value_check.dpath = _Dpath(dpath)
    utils.attribute_has_nested_attributes = attribute_has_nested_attributes
    local_graph.attribute_has_nested_attributes = attribute_has_nested_attributes
    renderer.attribute_has_nested_attributes = attribute_has_nested_attributes
    TerraformBlock.get_inner_attributes = classmethod(get_inner_attributes)  # type: ignore[method-assign, assignment]
    BaseRegistry.run_checks = run_checks  # type: ignore[method-assign]
    return True


# What checkov's JSON report reads as while ``_ReportJson`` keeps the report itself (``run_one`` puts the real text
# back whenever checkov printed anything else).
_KEPT = "<gpufleet: checkov's JSON report, kept as an object>"


class _ReportJson:
    """``json`` for checkov 3.3.30's ``common/runners/runner_registry.py``, whose ``print_reports`` encodes the JSON
    report twice, to print it (line 539, ``indent=4``) and for ``--output-file-path`` (line 547, without), both with
    ``CustomJSONEncoder``; ``run_one`` then decoded the printed text again, about 5% of a worker's time a stack.
    While ``keeping`` (``keep_reports``: a run whose parsed options print the JSON report alone, write no file and
    load no external checks), the printed one is kept as the object (``kept``) and reads as ``_KEPT``, and so does
    the second, the same object. Every other call is ``json``'s own."""

    def __init__(self, module: Any, encoder: type) -> None:
        self._json, self.encoder = module, encoder
        self.kept: list[Any] = []
        self.keeping = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._json, name)

    def dumps(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        if self.keeping and not args and kwargs == {"indent": 4, "cls": self.encoder}:
            self.kept.append(obj)
            return _KEPT
        if self.keeping and not args and kwargs == {"cls": self.encoder} and self.kept and obj is self.kept[-1]:
            return _KEPT
        return self._json.dumps(obj, *args, **kwargs)


def _report_alone(config: Any) -> bool:
    """checkov's parsed options (argv and any ``.checkov.yaml`` it read) print the JSON report alone to stdout: no
    other output, no ``--output-file-path`` (which writes the second encoding to a file) and no external checks
    (whose results could hold values the full encoding refuses, which fails the run)."""
    return (list(getattr(config, "output", None) or []) == ["json"] and not getattr(config, "output_file_path", None)
            and not getattr(config, "external_checks_dir", None) and not getattr(config, "external_checks_git", None))


_report_json: list[_ReportJson] = []


def keep_reports() -> bool:
    """Let ``run_one`` take checkov's JSON report as the object it encodes (``_ReportJson``), with the checkov whose
    ``print_reports`` was read (``REVIEWED_CHECKOV``), in each run whose options allow it (``_report_alone``)."""
    if not _reviewed():
        return False
    from checkov.common.runners import runner_registry
    from checkov.common.util.json_utils import CustomJSONEncoder

    if isinstance(runner_registry.json, _ReportJson):
        return True
    shim = _ReportJson(json, CustomJSONEncoder)
    print_reports = runner_registry.RunnerRegistry.print_reports

    def deciding(self: Any, *args: Any, **kwargs: Any) -> Any:
        config = kwargs["config"] if "config" in kwargs else args[1] if len(args) > 1 else None
        shim.keeping = _report_alone(config)
        try:
            return print_reports(self, *args, **kwargs)
        finally:
            shim.keeping = False

    runner_registry.json = shim
    runner_registry.RunnerRegistry.print_reports = deciding  # type: ignore[method-assign]
    _report_json[:] = [shim]
    return True


def _cut(report: dict[str, Any]) -> dict[str, Any]:
    """The parts of one checkov JSON report that ``checkov_scan`` reads."""
    results = report.get("results", {})
    failed = ("check_id", "check_name", "resource", "file_line_range", "file_abs_path")
    return {"results": {"passed_checks": [{"file_abs_path": c["file_abs_path"]} for c in results.get("passed_checks", [])],
                        "failed_checks": [{k: c.get(k) for k in failed} for c in results.get("failed_checks", [])],
                        "parsing_errors": results.get("parsing_errors", [])}}


def _cuts(data: Any) -> list[dict[str, Any]]:
    """``_cut`` of each report of one run's JSON output (a list of reports, or one)."""
    return [_cut(r) for r in (data if isinstance(data, list) else [data])]


def run_one(checkov_args: list[str], path: str) -> dict[str, Any]:
    """One ``Checkov(argv).run()`` over one stack file, its stdout captured and parsed."""
    from checkov.main import Checkov

    out = io.StringIO()
    kept = _report_json[0].kept if _report_json else []
    kept.clear()
    try:
        with contextlib.redirect_stdout(out), warnings.catch_warnings():
            warnings.simplefilter("ignore", category=SyntaxWarning)
            code = Checkov(["-f", path, *checkov_args]).run()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 2
    except Exception:  # noqa: BLE001 - any crash of one run is its chunk's error, reported per stack
        return {"error": traceback.format_exc().strip().splitlines()[-1]}
    if code not in (0, 1):
        return {"error": f"checkov exited {code}"}
    text = out.getvalue()
    if len(kept) == 1 and text == _KEPT + "\n":  # the report alone, as print printed it: cut, then encoded and decoded
        return {"reports": json.loads(json.dumps(_cuts(kept.pop()), cls=_report_json[0].encoder))}
    for report in kept:  # anything else printed too: the text checkov would have printed, read as before
        text = text.replace(_KEPT, json.dumps(report, indent=4, cls=_report_json[0].encoder), 1)
    kept.clear()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return {"error": "checkov printed no JSON report"}
    return {"reports": _cuts(data)}


def scan(checkov_args: list[str], files: list[str], reset_rendering: Callable[[], None]) -> dict[str, Any]:
    """Each file of a chunk in its own checkov run, from checkov's own rendering symbols.

    One run over several files is one graph and one asteval symbol table (checkov 3.3.30
    safe_eval_functions.py, ``SAFE_EVAL_DICT``): a string in one stack rendering ``x = 'allUsers'``
    defined ``x`` for every stack after it in that run, so a stack's result depended on which
    stacks shared its chunk. The checkov cache keys a result on the stack's own bytes, so it must
    be the stack's own. A run per file costs about 5 ms of checkov's set-up (argument parsing, the
    graph-check thread pool); each run's garbage is collected after it (``lighten``)."""
    reports: list[dict[str, Any]] = []
    for path in files:
        reset_rendering()
        answer = run_one(checkov_args, path)
        gc.collect()
        if "error" in answer:
            return answer
        reports.extend(answer["reports"])
    return {"reports": reports}


def lighten() -> None:
    """Take out of a long-lived checkov process two costs that change nothing it reports.

    - checkov's ``logging_init`` (3.3.30, checkov/logging_init.py:15-24) sets the root logger to
      DEBUG and adds a handler formatting every record into an in-memory ``log_stream``, read only
      to upload support logs to the Bridgecrew platform (main.py:737 ``--support``, with an API key,
      which a scan here never has) and never cleared in this process (runner_registry.py:831-833
      clears it only in checkov's own subprocesses). That handler is removed and the root logger
      set to the level of the stderr handler that remains (``LOG_LEVEL``, WARNING by default), so
      stderr gets the same lines; debug records are no longer built. checkov reads the log level
      once, to pick a message for a failed platform login (main.py:431), which needs an API key.
    - The cyclic garbage collector: checkov's modules and check registries are hundreds of
      thousands of objects that live as long as the process, and every full collection walked them
      again. They are moved out of its reach (``gc.freeze``) once loaded, the youngest generation
      collects every 50,000 allocations instead of 700, and ``scan`` collects after each run, so
      a stack's garbage does not outlive it. Collection decides only when unreachable objects are
      freed: checkov defines no ``__del__`` and keeps no weak references (3.3.30), so nothing it
      computes depends on it.
    - The same collector during checkov's imports: ``main`` turns it off before them (it walked the modules
      loaded so far again and again while the rest loaded: 1.8 s of CPU to import, 1.5 s without, in each
      worker every ``gpufleet check`` starts), and this collects once and turns it back on.
    """
    import logging

    from checkov import logging_init

    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.StreamHandler) and handler.stream is logging_init.log_stream:
            root.removeHandler(handler)
    levels = [handler.level for handler in root.handlers]
    # no handler left: logging's last resort prints WARNING and up; a handler of level NOTSET takes everything
    root.setLevel(logging.WARNING if not levels else min(levels) or logging.DEBUG)
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    gc.enable()


def main(checkov_args: list[str]) -> int:
    # Answers go to the stdout we were given; anything else written to file descriptor 1 (a handler
    # bound to it before a chunk's stdout is captured) lands on stderr instead of in an answer.
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    gc.disable()  # through checkov's imports: ``lighten`` collects once and turns the collector back on
    reset_rendering = remember_rendering()
    parse_with_libyaml()
    equivalent_shortcuts()
    keep_reports()
    import checkov.main  # noqa: F401 - the rest of checkov's imports now, while the caller still synthesizes (prestart)

    lighten()
    first = True
    for line in sys.stdin:
        answers.write(json.dumps(scan(checkov_args, json.loads(line), reset_rendering)) + "\n")
        answers.flush()
        if first:  # the graph checks and the rest checkov loads at its first run live as long as the process
            gc.freeze()
            first = False
    return 0


if __name__ == "__main__":
    # Run as a script, Python puts safety/ first on the path: its modules (report, terraform, imports, ...)
    # must not shadow a top-level module checkov or its dependencies import.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    sys.exit(main(sys.argv[1:]))
