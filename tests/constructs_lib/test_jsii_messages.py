"""Requests encoded without cattrs (constructs_lib/jsii_messages.py) against jsii 1.142.0's own encoding.

Every message of a real synthesis of the example fleet is encoded both ways while it is sent, and the bytes
must be the same; so must they for requests holding values a synthesis rarely sends (enum members that are
also strings, tuples, non-string keys, object references with interfaces, subclasses of JSON types).
"""

from __future__ import annotations

import collections
import enum
import inspect
import json

import jsii
import pytest
from jsii._kernel import types
from jsii._kernel.providers import process

import constructs_lib.providers  # noqa: F401  (installs both, as every synthesis does)
from constructs_lib import jsii_messages, jsii_structs


def _bytes(request, encode) -> bytes:
    return json.dumps(encode(request), default=process.jdefault).encode("utf8")


def _both(converter, request) -> tuple[bytes, bytes]:
    return _bytes(request, converter.unstructure), _bytes(request, lambda r: jsii_messages.unstructure(converter, r))


def test_installed_only_on_the_reviewed_jsii():
    # An upgrade of jsii or of cattrs fails here until the new one is compared and named.
    import importlib.metadata

    assert jsii.__version__ == jsii_structs.REVIEWED_JSII
    assert importlib.metadata.version("cattrs") == jsii_messages.REVIEWED_CATTRS
    assert process._NodeProcess.send is jsii_messages.send


def test_every_message_of_a_synthesis_encodes_to_the_same_bytes(example_configs, tmp_path, monkeypatch):
    from stacks.synth import synthesize

    narrow = jsii_messages._unstructure
    sent: collections.Counter = collections.Counter()
    different = []

    def recording(converter, request):
        mine, plain = narrow(converter, request)
        upstream = converter.unstructure(request)
        jsii_text = json.dumps(upstream, default=process.jdefault)
        if json.dumps(mine, default=process.jdefault) != jsii_text:
            different.append((request, mine, upstream))
        # what the kernel parses from the line sent: the same value, keys in the same order
        line = jsii_messages._encode(mine, plain, process.jdefault)
        if _parsed(line) != _parsed(jsii_text):
            different.append((request, line, jsii_text))
        sent[mine.get("api", type(request).__name__)] += 1
        sent["written by orjson"] += line != jsii_text.encode()
        return mine, plain

    from constructs_lib import naming

    deferred = naming.defer_logical_id

    def counting(element, logical_id):  # an override that rides along is an invoke not encoded on its own
        rode = deferred(element, logical_id)
        sent["rode along"] += rode
        return rode

    monkeypatch.setattr(jsii_messages, "_unstructure", recording)
    monkeypatch.setattr(naming, "defer_logical_id", counting)
    synthesize(example_configs, tmp_path / "out")
    assert different == []
    assert sent["create"] > 400 and sent["invoke"] + sent["rode along"] > 300 and sent["get"] > 100, sent
    assert sent["written by orjson"] > 0.9 * (sent["create"] + sent["invoke"] + sent["get"]), sent


def _parsed(text: str | bytes) -> object:
    """A JSON text as ``JSON.parse`` reads it, objects as lists of pairs so that key order counts; numbers as
    doubles, as in JavaScript."""
    return json.loads(text, object_pairs_hook=list, parse_int=float)


class Mode(str, enum.Enum):
    __jsii_type__ = "test.Mode"
    FAST = "fast"


class Level(enum.Enum):
    __jsii_type__ = "test.Level"
    HIGH = "high"


class Name(str):
    pass


def test_unusual_values_encode_as_cattrs_does():
    from jsii._runtime import kernel

    converter = kernel.provider._process._serializer  # the running kernel's, as send uses it
    ref = types.ObjRef(ref="x@1", interfaces=["a.I"])
    values = [Mode.FAST, Level.HIGH, (1, "t"), {1: "int key"}, {"k": (Mode.FAST,)}, Name("n"), ref,
              collections.OrderedDict(a=1), [True, 1.5, None, float("inf")], {"nested": [{"$jsii.byref": "y@2"}]}]
    requests = [
        types.InvokeRequest(objref=ref, method="m", args=values),
        types.InvokeRequest(objref=types.CreateResponse(ref="z@3"), method="m", args=None),
        types.GetRequest(objref=ref, property="p"),
        types.CreateRequest(fqn="f.F", args=values, overrides=[types.Override(method="m", cookie="c")], interfaces=["a.I"]),
        types.CreateRequest(fqn="f.F"),
        types.CreateRequest(fqn=Name("f.F"), args=[Mode.FAST]),
        types.InvokeRequest(objref=ref, method=Name("m"), args=(1, 2)),
        types.SetRequest(objref=ref, property="p", value=values),
        types.DeleteRequest(objref=ref),
    ]
    for request in requests:
        upstream, mine = _both(converter, request)
        assert mine == upstream, request


def test_not_installed_with_a_cattrs_other_than_the_reviewed_one(monkeypatch):
    """jsii 1.142.0 accepts cattrs>=1.8,<27 (its METADATA), and what the bytes are depends on cattrs, not
    only on jsii: cattrs 23.2.3 hands a ``List[Any]`` element on as it is, so an ``IntEnum`` argument
    (``TerraformOutput(value=Replicas.TWO)``) synthesizes as ``2`` with jsii's own ``send``, while the copy
    here, which asks cattrs for the element by its class as 26.2.1 does, raised ``AttributeError:
    __jsii_type__`` (jsii's enum hook). With another cattrs the packaged ``send`` must run."""
    import importlib.metadata

    real_version = importlib.metadata.version
    monkeypatch.setattr(process._NodeProcess, "send", jsii_messages._state["upstream"])
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "23.2.3" if name == "cattrs" else real_version(name))
    assert jsii_messages.install() is False
    assert process._NodeProcess.send is jsii_messages._state["upstream"]


class _Recorder:
    """A kernel's stdin that keeps what is written and passes it on."""

    def __init__(self, stdin) -> None:
        self.stdin, self.lines = stdin, []

    def write(self, data: bytes) -> int:
        self.lines.append(data)
        return self.stdin.write(data)

    def flush(self) -> None:
        self.stdin.flush()


@pytest.mark.parametrize("sender", ["copy", "jsii's own (another cattrs)"])
def test_host_stack_traces_leave_out_the_copies_frames_as_jsii_leaves_out_its_own(monkeypatch, sender):
    """With ``JSII_HOST_STACK_TRACES=1`` every request carries the Python stack, jsii's own frames left out
    (``jsii/_stack_trace.py``: every file under jsii's directory). The copied ``send`` and the struct
    serializer stand where jsii's frames stood, so their frames are left out too: the request a struct
    holding a Python object sends (``create``) names the caller first, as jsii 1.142.0's does, whether the
    copied ``send`` or jsii's (with another cattrs only the struct serializer is installed) sends it. The
    copies used to add themselves (``constructs_lib/jsii_messages.py``, ``send``; ``jsii_structs.py``), so
    the message was not jsii's byte for byte."""
    import types as pytypes

    import cdktf
    from jsii._runtime import kernel

    from constructs_lib.providers import google

    @jsii.implements(cdktf.IResolvable)
    class Resolvable:
        creation_stack = []

        def resolve(self, context):
            return 4

    node = kernel.provider._process
    recorder = _Recorder(node._process.stdin)
    monkeypatch.setattr(node, "_process", pytypes.SimpleNamespace(stdin=recorder, stdout=node._process.stdout))
    monkeypatch.setenv("JSII_HOST_STACK_TRACES", "1")
    if sender != "copy":
        monkeypatch.setattr(process._NodeProcess, "send", jsii_messages._state["upstream"])
    cls = google.container_node_pool.ContainerNodePoolAutoscaling
    struct = cls.__new__(cls)
    struct._values = {"max_node_count": Resolvable()}
    here = inspect.currentframe()
    line = here.f_lineno + 1
    jsii_structs._state["module"]._make_reference_for_native(kernel, [struct])
    (sent,) = [m for m in map(json.loads, recorder.lines) if m.get("api") == "create" and m["fqn"] == "Object"]
    assert sent["$jsii.stacktrace"][0] == [here.f_code.co_filename, line, 0, here.f_code.co_name]
    assert not [f for f in sent["$jsii.stacktrace"] if f[0] in (jsii_messages.__file__, jsii_structs.__file__)]


class _Proxy:
    """What a jsii proxy object carries: its kernel reference (cattrs hands such an object back as it is)."""

    def __init__(self, ref: types.ObjRef) -> None:
        self.__jsii_ref__ = ref


class NamedProxy(str):
    """A string that also carries a reference: json.dumps writes it as the string, never through jsii's jdefault."""

    __jsii_ref__ = types.ObjRef(ref="s@2")


def test_orjson_writes_only_what_the_kernel_parses_as_jsiis_own_line():
    """``_encode`` writes a request holding only plain JSON values (and jsii objects, as their references) with
    orjson: the kernel's JSON.parse gets the value of jsii's own line. Every value orjson would write otherwise
    sends jsii's ``json.dumps`` bytes, exactly."""
    import datetime
    import math
    import pathlib
    import sys

    from jsii._runtime import kernel

    converter = kernel.provider._process._serializer
    ref = types.ObjRef(ref="x@1", interfaces=["a.I"])
    plain = [[1, -7, 2.5, 1e16, 1e-7, -0.0, 0.1 + 0.2, sys.float_info.max, 2**63 - 1, True, False, None, "x", 'q"\\\n\t'],
             [{"k": [_Proxy(ref), _Proxy(types.ObjRef(ref="y@2"))], "": {"nested": [[]]}}], []]
    other = [[math.nan], [math.inf], [-math.inf], [2**64], [-(2**63) - 1], ["é"], ["\ud800"], ["\u2028"], [Name("n")],
             [NamedProxy("s")], [Mode.FAST], [Level.HIGH], [(1, 2)], [{1: "int key"}], [{Name("k"): 1}],
             [{pathlib.Path("k"): math.nan}], [{"$jsii.map": {pathlib.Path("k"): datetime.datetime(2026, 12, 6, tzinfo=datetime.timezone.utc)}}],
             [datetime.datetime(2026, 12, 6, tzinfo=datetime.timezone.utc)], [{"k": [1, math.nan]}]]
    for args in plain + other:
        for request in (types.InvokeRequest(objref=ref, method="m", args=args), types.CreateRequest(fqn="f.F", args=args)):
            mine, is_plain = jsii_messages._unstructure(converter, request)
            line = jsii_messages._encode(mine, is_plain, process.jdefault)
            jsii_line = json.dumps(converter.unstructure(request), default=process.jdefault).encode("utf8")
            if args in plain:
                assert is_plain and line != jsii_line and _parsed(line) == _parsed(jsii_line), args
            else:
                assert line == jsii_line, args
    request = types.GetRequest(objref=ref, property="p")
    assert _parsed(jsii_messages._encode(*jsii_messages._unstructure(converter, request), process.jdefault)) \
        == _parsed(json.dumps(converter.unstructure(request)))


def test_replies_decode_as_json_loads_with_jsiis_hook_decodes_them(monkeypatch):
    """``_next_message`` keeps one decoder; each line must still read as ``json.loads(line, object_hook=ohook)``."""
    import io

    lines = [b'{"ok": {"$jsii.byref": "a@1"}}\n', b'{"ok": {"$jsii.byref": "a@1", "$jsii.interfaces": ["b.I"]}}\n',
             b'{"ok": {"$jsii.enum": "m.E/V"}}\n', b'{"ok": {"$jsii.map": {"k": [1, 2.5, "\\u00e9"]}}}\n',
             '{"ok": "é \u2028"}\n'.encode(), b'\xef\xbb\xbf{"ok": 1}\n', b'{"callback": {"cbid": "c1"}}\n']

    class Node:
        _process = type("P", (), {"stdout": io.BytesIO(b"".join(lines))})()

    for line in lines:
        assert repr(jsii_messages._next_message(Node())) == repr(json.loads(line, object_hook=process.ohook))
    other_hook = lambda d: ("hooked", d)  # noqa: E731  (a replaced hook is used, as jsii looks it up per line)
    monkeypatch.setattr(process, "ohook", other_hook)
    Node._process.stdout = io.BytesIO(lines[0])
    assert jsii_messages._next_message(Node()) == json.loads(lines[0], object_hook=other_hook)
