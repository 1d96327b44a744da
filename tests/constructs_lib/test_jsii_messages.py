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

    narrow = jsii_messages.unstructure
    sent: collections.Counter = collections.Counter()
    different = []

    def recording(converter, request):
        mine = narrow(converter, request)
        upstream = converter.unstructure(request)
        if json.dumps(mine, default=process.jdefault) != json.dumps(upstream, default=process.jdefault):
            different.append((request, mine, upstream))
        sent[mine.get("api", type(request).__name__)] += 1
        return mine

    from constructs_lib import naming

    deferred = naming.defer_logical_id

    def counting(element, logical_id):  # an override that rides along is an invoke not encoded on its own
        rode = deferred(element, logical_id)
        sent["rode along"] += rode
        return rode

    monkeypatch.setattr(jsii_messages, "unstructure", recording)
    monkeypatch.setattr(naming, "defer_logical_id", counting)
    synthesize(example_configs, tmp_path / "out")
    assert different == []
    assert sent["create"] > 400 and sent["invoke"] + sent["rode along"] > 300 and sent["get"] > 100, sent


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
