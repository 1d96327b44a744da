"""libyaml's C parser for the common shapes of reviewed YAML files, with ruamel.yaml's round-trip result.

ruamel.yaml 0.19.1's round-trip loader is pure Python (~7 ms a 2 KB cluster file, most of it scanning and
parsing); libyaml (PyYAML 6.0.4's ``yaml._yaml.CParser``) parses the same text in ~0.1 ms. ``load`` builds
what ``YAML(typ="rt").load`` builds, as far as ``clusters.source`` looks at it (the values and their types,
key order, and the line of every key and item), but only for a subset of YAML where both parsers are known
to read the same text the same way; for anything else, and for every libyaml error, it returns None and the
caller loads with ruamel as before, so errors keep ruamel's words. docs/large-fleets.md, "Reading cluster
files with libyaml", says why the results are equal; tests/clusters/test_yaml_fast.py checks them.

What is left to ruamel (``None``):
- text ruamel's reader refuses or reads differently: characters outside its printable set
  (ruamel/yaml/reader.py:187), tabs, CR, NEL, LS, PS and a byte-order mark (line breaks and separators
  that YAML 1.1 and 1.2 treat differently);
- directives, explicit tags, anchors and aliases (so no merge keys), more than one document (a second ``...``
  counts: ruamel reads an empty document after it), a top level
  that is not a mapping, more nodes than ``source._expansion`` allows, more than ``MAX_DEPTH`` levels;
- block scalars (``|``, ``>``: ruamel returns its own string subclasses carrying comments) and scalars
  spanning lines (line folding, and escaped line ends, are where the YAML versions differ);
- in a flow collection, a value not set apart from its ``:`` by a space or line break; a comment between
  a key and its plain value on a later line (ruamel raises on some, see ``_COMMENT_CRASH``);
- keys that are not strings (ruamel would keep an int key, ``_plain`` would make it text), duplicate
  keys (ruamel raises), and scalars ruamel's resolver types as anything but str, int, float, bool, null
  or timestamp (``<<``, ``=``).

Escapes in one-line double-quoted scalars need no restriction: libyaml and ruamel share one table
(libyaml src/scanner.c:3125-3249 at 840b65c, ruamel/yaml/scanner.py:1363-1384), and the escapes only
ruamel accepts (surrogates such as ``\ud83d``) are libyaml errors, so ruamel loads those files. Where the
two scanners' rules for plain scalars differ (``:``, ``?`` and ``#`` in flow collections, YAML 1.2's
ruamel/yaml/scanner.py:768-800 and 1515-1530), libyaml refuses the text or reads it the same way: the
differential test generates those cases.

Scalar types come from ruamel itself: the tag from its ``VersionedResolver`` for YAML 1.2 (the version
ruamel uses without a ``%YAML`` directive, ruamel/yaml/resolver.py:376-392) and every typed value from its
``RoundTripConstructor`` (ScalarFloat, ScalarInt, ScalarBoolean, ... as ruamel makes them). Two shapes skip
the constructor because its result is the input: a string (for a plain or quoted scalar without anchor
construct_scalar returns the scanned text, ruamel/yaml/constructor.py:947-1004) and a decimal integer
without sign, underscore or leading zero (a plain ``int``, constructor.py:1006-1104).

Only the reviewed versions take this path (``REVIEWED``): a new PyYAML, libyaml or ruamel.yaml falls back
to ruamel until someone reruns the differential test and updates the pins (a test fails on a bump).
"""

from __future__ import annotations

import re

import yaml
from ruamel.yaml import YAML, __version__ as ruamel_version
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import RoundTripConstructor
from ruamel.yaml.nodes import ScalarNode
from ruamel.yaml.reader import Reader
from yaml.events import (DocumentEndEvent, DocumentStartEvent, MappingEndEvent, MappingStartEvent,
                         ScalarEvent, SequenceEndEvent, SequenceStartEvent, StreamEndEvent)

try:
    from yaml._yaml import CParser, get_version_string
except ImportError:  # a PyYAML built without libyaml: ruamel loads every file
    CParser, get_version_string = None, lambda: None

REVIEWED = {"pyyaml": "6.0.4", "libyaml": "0.2.6", "ruamel.yaml": "0.19.1"}
INSTALLED = {"pyyaml": yaml.__version__, "libyaml": get_version_string(), "ruamel.yaml": ruamel_version}
ENABLED = INSTALLED == REVIEWED

_UNSAFE_TEXT = re.compile("[\t\r\x85\u2028\u2029\ufeff]")
_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_DECIMAL = re.compile("[1-9][0-9]{0,17}")  # past 18 digits, ruamel's int() is asked (and its limit applies)
# Plain scalars resolve as YAML 1.2 (ruamel's version without a %YAML directive, ruamel/yaml/resolver.py:376-392).
# One resolver serves all threads: its rule table is filled on the first call, here, and only read after.
_RESOLVER = YAML(typ="rt").resolver
_RESOLVER.resolve(ScalarNode, "", (True, False))
# In a flow collection a value must stand apart from its ':' (``["x":y]`` is a pair to libyaml and an
# error to ruamel's YAML 1.2 scanner, ruamel/yaml/scanner.py:751-767 check_value); nor may a comment sit
# between key and value. Mark indexes count characters (libyaml's SKIP, src/scanner.c:495-499).
_FLOW_VALUE = re.compile("[ \n]*:[ \n]+")
# _COMMENT_CRASH: ruamel 0.19.1 raises NotImplementedError("overlap in comment") when a comment after a
# key's ':' moves onto a plain scalar on a later line that has a comment of its own (blank lines after it):
# ruamel/yaml/parser.py:626-635 parse_block_mapping_value, ruamel/yaml/tokens.py:117-146 move_old_comment.
# Such a file is left to ruamel, so it fails as it does today.
# ruamel composes and constructs recursively (ruamel/yaml/composer.py:110-125 compose_node, about three Python
# frames a level; YAML().max_depth is 0, no bound, main.py:97): a document some 300 levels deep raises RecursionError
# there, while libyaml parses up to 1,000 levels (0.2.6's default yaml_set_max_nest_level, "Limit depth of nesting
# by default") and this builder needs no recursion. Deeper than MAX_DEPTH is left to ruamel, so such a file fails
# as it does today; 64 levels leave ruamel far from the interpreter's limit even deep in a request's stack.
MAX_DEPTH = 64
_TYPED = frozenset(f"tag:yaml.org,2002:{kind}" for kind in ("int", "float", "bool", "null", "timestamp"))


def _blank_or_comments(text: str) -> bool:
    """Only blank lines and comments: all that may follow an explicit document end ('...') on the fast path.
    libyaml skips any further '...' (src/parser.c yaml_parser_parse_document_start, "Parse extra document end
    indicators"), while ruamel's YAML 1.2 parser opens an implicit document at the next one
    (ruamel/yaml/parser.py:243-275 parse_document_end, then parse_implicit_document_start): an empty second
    document, which load() refuses. Checked line by line, not by a regex alternating blanks and comments,
    which backtracks exponentially over a tenant's line of '#'."""
    return all(not line.strip(" ") or line.lstrip(" ").startswith("#") for line in text.split("\n"))


class _Decline(Exception):
    """The document is outside the subset: ruamel loads it."""


def load(text: str, max_nodes: int) -> CommentedMap | None:
    """The top-level mapping ruamel's round-trip loader makes of ``text``, or None to load it with ruamel.
    A document of more than ``max_nodes`` nodes is left to ruamel, so that its alias bound decides it as before."""
    if not ENABLED or _UNSAFE_TEXT.search(text) or Reader.NON_PRINTABLE.search(text):
        return None
    try:
        return _Builder(text, max_nodes).build()
    except (_Decline, yaml.YAMLError):
        return None


class _Builder:
    """One pass over libyaml's events; containers are filled in place, so no recursion limit applies."""

    def __init__(self, text: str, max_nodes: int) -> None:
        self.text = text
        self.parser = CParser(text)
        self.max_nodes = max_nodes
        self.constructor: RoundTripConstructor | None = None  # made for the first typed scalar
        self.nodes = 0

    def build(self) -> CommentedMap:
        get = self.parser.get_event
        get()  # StreamStartEvent
        start = get()
        if not isinstance(start, DocumentStartEvent) or start.version or start.tags:
            raise _Decline
        event = get()
        if type(event) is not MappingStartEvent:
            raise _Decline
        root = CommentedMap()
        self._check_collection(event)
        # Each open container: [container, key waiting for its value, that key's event, is in a flow collection].
        stack: list[list] = [[root, None, None, bool(event.flow_style)]]
        while stack:
            event = get()
            kind = type(event)
            if kind is MappingEndEvent or kind is SequenceEndEvent:
                stack.pop()
                continue
            top = stack[-1]
            if kind is ScalarEvent:
                value = self._scalar(event)
            elif kind is MappingStartEvent or kind is SequenceStartEvent:
                self._check_collection(event)
                value = CommentedMap() if kind is MappingStartEvent else CommentedSeq()
            else:  # an alias
                raise _Decline
            container = top[0]
            if type(container) is CommentedSeq:
                mark = event.start_mark
                container._yaml_set_idx_line_col(len(container), [mark.line, mark.column])
                container.append(value)
            elif top[1] is None:
                if type(value) is not str or value in container:
                    raise _Decline
                top[1], top[2] = value, event
                continue
            else:
                key, key_start, value_start = top[1], top[2].start_mark, event.start_mark
                if top[3] and not _FLOW_VALUE.fullmatch(self.text, top[2].end_mark.index, value_start.index):
                    raise _Decline
                if (kind is ScalarEvent and event.style == "" and value_start.line > key_start.line
                        and "#" in self.text[top[2].end_mark.index:value_start.index]):
                    raise _Decline  # ruamel's parser raises on this comment (see _COMMENT_CRASH)
                container._yaml_set_kv_line_col(key, [key_start.line, key_start.column, value_start.line, value_start.column])
                container[key] = value
                top[1] = None
            if kind is not ScalarEvent:
                if len(stack) >= MAX_DEPTH:
                    raise _Decline
                stack.append([value, None, None, top[3] or bool(event.flow_style)])
        end = get()
        if type(end) is not DocumentEndEvent or type(get()) is not StreamEndEvent:
            raise _Decline
        if end.explicit and not _blank_or_comments(self.text[end.end_mark.index:]):
            raise _Decline  # another '...': a second, empty document to ruamel (see _blank_or_comments)
        return root

    def _check_collection(self, event: MappingStartEvent | SequenceStartEvent) -> None:
        self.nodes += 1
        if event.anchor is not None or event.tag is not None or self.nodes > self.max_nodes:
            raise _Decline

    def _scalar(self, event: ScalarEvent) -> object:
        """The value ruamel constructs for one scalar: the tag from its resolver, the object from its constructor."""
        self.nodes += 1
        style, value, start = event.style, event.value, event.start_mark
        if (event.anchor is not None or event.tag is not None or self.nodes > self.max_nodes
                or style not in ("", "'", '"') or start.line != event.end_mark.line):
            raise _Decline
        if style:
            # ruamel's parser marks an untagged quoted scalar implicit (False, True) (ruamel/yaml/parser.py:441-446)
            # and its resolver gives that the default str tag (ruamel/yaml/resolver.py:352-372).
            return value
        tag = _RESOLVER.resolve(ScalarNode, value, (True, False)).suffix
        if tag == _STR:
            return value
        if tag == _INT and _DECIMAL.fullmatch(value):
            # construct_yaml_int's last branch: no sign, base prefix, underscore or leading zero (a lone 0 is
            # a ScalarInt of width 1) (ruamel/yaml/constructor.py:1006-1104)
            return int(value)
        if tag not in _TYPED:
            raise _Decline
        if self.constructor is None:
            self.constructor = YAML(typ="rt").constructor
        try:
            return self.constructor.construct_document(ScalarNode(tag, value, start, event.end_mark))
        except Exception:  # whatever ruamel's constructor raises, ruamel's own load must raise it too
            raise _Decline from None
