"""Requests encoded without cattrs (constructs_lib/jsii_messages.py) against jsii 1.142.0's own encoding.

Every message of a real synthesis of the example fleet is encoded both ways while it is sent, and the bytes
must be the same; so must they for requests holding values a synthesis rarely sends (enum members that are
also strings, tuples, non-string keys, object references with interfaces, subclasses of JSON types).
"""

from __future__ import annotations

import collections
import enum
import json

import jsii
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

    monkeypatch.setattr(jsii_messages, "unstructure", recording)
    synthesize(example_configs, tmp_path / "out")
    assert different == []
    assert sent["create"] > 400 and sent["invoke"] > 300 and sent["get"] > 100, sent


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
