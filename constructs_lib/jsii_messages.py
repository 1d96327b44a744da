"""The three requests a synthesis sends most, turned into jsii's message without cattrs.

jsii 1.142.0 sends every request to the kernel as ``json.dumps(converter.unstructure(request),
default=jdefault)`` (``jsii/_kernel/providers/process.py:330-344``). A generated cluster sends about 275
requests, nearly all ``create``, ``invoke`` and ``get``; for them cattrs walks and copies each argument
(a resource's whole config) through a hook lookup per value, about 5 us of a message's 16 us of encoding.

``unstructure`` below builds the same dictionary for those three request types: the fields in the
class's order and then ``api`` (what ``_with_api_key`` around ``unstructure_attrs_asdict`` makes,
process.py:106-112 and 168-197), the object reference through jsii's own ``_unstructure_ref``
(process.py:121), overrides as their three fields. Arguments are copied the way cattrs copies a value
typed ``Any`` (by its runtime class): only values of exactly ``dict`` (with ``str`` keys), ``list``,
``str``, ``int``, ``float``, ``bool`` or ``None`` are copied here; any other value (a jsii object, an
``ObjRef``, an enum member, a tuple, a subclass of any of these) is handed to cattrs itself, and so is a
request with a field of an unexpected type; ``tests/constructs_lib/test_jsii_messages.py`` records every
message of a real synthesis both ways and compares the ``json.dumps`` bytes. A request so copied that holds
nothing but plain JSON values is written by orjson (``_encode``: the same value for the kernel's
``JSON.parse``, without the spaces, in about a sixth of the time); every other one by jsii's ``json.dumps``
call. Replies are read as jsii reads them, through one decoder (``_next_message``). Every other request is
jsii's code.

Installed only on jsii ``REVIEWED_JSII`` (``constructs_lib/jsii_structs.py``) with cattrs
``REVIEWED_CATTRS``: the bytes jsii sends depend on cattrs too, which jsii 1.142.0 accepts from 1.8 to
26.x. Up to 23.x cattrs hands an element of a ``List[Any]`` on as it is (an ``IntEnum`` argument is sent
as its number), where 24.1 and later, like the copy here, unstructure it by its class (the same
``IntEnum`` reaches jsii's enum hook and fails). With any other jsii or cattrs the packaged ``send``
runs, and the test fails on an upgrade of either.

Logical ids ride along (``defer_logical_id``). ``constructs_lib.naming.pin`` overrides the logical id of
about 100 elements a generated cluster, each an ``overrideLogicalId`` round trip of its own: a third of a
synthesis's messages, about 3 ms of Python's CPU a cluster plus the kernel's reading and writing of each.
When the kernel is gpufleet's launcher (``constructs_lib/jsii_runtime.py``, which applies them), the
overrides wait in this process and travel with the next request as its ``"gpufleet.pins"`` field; the
kernel invokes ``overrideLogicalId`` on each, in the order they were asked for, before it handles that
request. Nothing runs in the kernel in between, so every step the kernel takes sees the same logical ids as
with one round trip each. Only requests the kernel's ``processRequest`` handles carry them (``create``,
``get``, ``set``, ``invoke`` and their static forms); before any other request (a callback's ``complete``,
``load``, ``naming``, ``begin``/``end``, ``del``) waiting overrides go first on a ``stats`` request (which
it handles and which changes nothing). An override that fails fails the request that carried it, with the kernel's error
prefixed by the override; one that fails on the ``stats`` before a callback's ``complete`` is that callback's error, as
it is when the override raises inside the callback with one round trip each.
``tests/constructs_lib/test_jsii_runtime.py`` (``test_direct_kernel_synthesizes_the_bytes_of_jsii_packaged_entry_point``)
compares a synthesis through the launcher (which defers) with one through jsii's packaged runtime (which does not)
byte for byte, recorded imports included; the parallel-synthesis tests defer on both sides.
"""

from __future__ import annotations

import json
import math
from importlib import metadata
from typing import Any

import orjson

from constructs_lib.jsii_structs import hide_from_host_stack_traces, reviewed_jsii

REVIEWED_CATTRS = "26.2.1"
PINS_FIELD = "gpufleet.pins"
# What json.dumps writes itself (its C encoder's checks); it hands anything else to ``default``.
_ENCODED_AS_JSON = (str, int, float, list, tuple, dict)
_state: dict[str, Any] = {}
# Logical id overrides waiting for the next request: (the element's ObjRef, its new logical id).
_pins: list[tuple[Any, str]] = []


def reviewed_cattrs() -> bool:
    """The cattrs installed is the one whose unstructuring ``unstructure`` below was compared with."""
    try:
        return metadata.version("cattrs") == REVIEWED_CATTRS
    except metadata.PackageNotFoundError:
        return False


def _copy(value: Any, unstructure: Any, impure: list[Any]) -> Any:
    """``value`` as cattrs unstructures a value typed ``Any``: plain JSON types copied, the rest by cattrs.
    A jsii object becomes the reference ``json.dumps`` would write for it. ``impure`` gets every other value
    handed to cattrs and every float JSON has no number for (NaN, an infinity): a request holding one is
    written by ``json.dumps`` (``_encode``)."""
    cls = type(value)
    if cls is str or cls is int or cls is bool or value is None:
        return value
    if cls is float:
        if not math.isfinite(value):
            impure.append(value)
        return value
    if cls is list:
        return [_copy(item, unstructure, impure) for item in value]
    if cls is dict:
        for key in value:
            if type(key) is not str:  # cattrs may make a str of it (a Path key) and keep values orjson writes its way
                impure.append(value)
                return unstructure(value)
        return {key: _copy(item, unstructure, impure) for key, item in value.items()}
    result = unstructure(value)
    if result is value and not isinstance(value, _ENCODED_AS_JSON) and hasattr(value, "__jsii_ref__"):
        # a jsii object (cattrs hands it back as it is): json.dumps would call jsii's ``jdefault`` on it, which
        # writes ``_unstructure_ref`` of its reference; the same dictionary, made here, is plain
        return _state["process"]._unstructure_ref(value.__jsii_ref__)
    impure.append(value)
    return result


def _strings(values: Any) -> bool:
    return type(values) is list and all(type(v) is str for v in values)


def unstructure(converter: Any, request: Any) -> dict[str, Any]:
    """What ``converter.unstructure(request)`` returns, without cattrs for create, invoke and get."""
    return _unstructure(converter, request)[0]


def _unstructure(converter: Any, request: Any) -> tuple[dict[str, Any], bool]:
    """``unstructure``, and whether the dictionary holds only exact ``dict`` (``str`` keys), ``list``, ``str``,
    ``int``, finite ``float``, ``bool`` and ``None`` (what ``_encode`` may write with orjson)."""
    process, types = _state["process"], _state["types"]
    CreateRequest, GetRequest, InvokeRequest, ObjRef, Override = (  # noqa: N806
        types.CreateRequest, types.GetRequest, types.InvokeRequest, types.ObjRef, types.Override)
    cls = type(request)
    impure: list[Any] = []
    if cls is InvokeRequest:
        args = request.args
        if isinstance(request.objref, ObjRef) and type(request.method) is str and (args is None or type(args) is list):
            return {"objref": process._unstructure_ref(request.objref), "method": request.method,
                    "args": None if args is None else _copy(args, converter.unstructure, impure), "api": "invoke"}, not impure
    elif cls is GetRequest:
        if isinstance(request.objref, ObjRef) and type(request.property) is str:
            return {"objref": process._unstructure_ref(request.objref), "property": request.property, "api": "get"}, True
    elif cls is CreateRequest:
        overrides, interfaces = request.overrides, request.interfaces
        if type(request.fqn) is str and type(request.args) is list and type(overrides) is list \
                and all(type(o) is Override and all(v is None or type(v) is str for v in (o.method, o.property, o.cookie))
                        for o in overrides) \
                and (interfaces is None or _strings(interfaces)):
            return {"fqn": request.fqn, "args": _copy(request.args, converter.unstructure, impure),
                    "overrides": [{"method": o.method, "property": o.property, "cookie": o.cookie} for o in overrides],
                    "interfaces": None if interfaces is None else list(interfaces), "api": "create"}, not impure
    return converter.unstructure(request), False


def _encode(req_dict: dict[str, Any], plain: bool, default: Any) -> bytes:
    """The request's line: ``json.dumps(req_dict, default=default)`` as jsii writes it, or, for a ``plain``
    dictionary (``_unstructure``), orjson's text of it when that is ASCII. The kernel parses both to the same
    value: the same keys in the same order, the same strings, and numbers to the same double (orjson writes
    the shortest text that reads back as the float, as ``repr`` does, in another spelling: ``1e16`` for
    ``1e+16``); only the spaces after ``,`` and ``:`` are left out. Anything orjson would write differently
    goes to ``json.dumps``: a value handed to cattrs (an enum member, a subclass of a JSON type, a tuple, a
    datetime), NaN and the infinities (``json.dumps`` writes ``NaN``, orjson ``null``), an integer past 64 bits,
    a dictionary with a key that is not exactly ``str`` (cattrs may turn a ``Path`` key into one and leave its
    values as they were), a string that is not valid UTF-8 (orjson refuses it), and text that is not ASCII
    (``json.dumps`` escapes it). orjson takes about a sixth of ``json.dumps``'s time over the
    messages of a synthesis (issue 28, ninth round)."""
    if plain:
        try:
            data = orjson.dumps(req_dict)
        except orjson.JSONEncodeError:
            pass
        else:
            if data.isascii():
                return data
    return json.dumps(req_dict, default=default).encode("utf8")


def _next_message(node: Any) -> Any:
    """jsii 1.142.0's ``_NodeProcess._next_message`` (process.py:251-253): ``json.loads(line, object_hook=ohook)``
    of the kernel's next line, through one decoder per hook instead of a new ``JSONDecoder`` per line (what
    ``json.loads`` makes whenever it is given a hook); the line is decoded as ``json.loads`` decodes bytes."""
    line = node._process.stdout.readline()
    hook = _state["process"].ohook
    decoder = _state.get("decoder")
    if decoder is None or decoder.object_hook is not hook:
        decoder = _state["decoder"] = json.JSONDecoder(object_hook=hook)
    return decoder.decode(line.decode(json.detect_encoding(line), "surrogatepass"))


def defer_logical_id(element: Any, logical_id: str) -> bool:
    """Send ``element.overrideLogicalId(logical_id)`` with the next request (True), or not at all (False:
    the caller makes the call itself) when this kernel does not apply ridden-along overrides."""
    if not _state.get("pins") or type(logical_id) is not str or "process" not in _state \
            or _state["process"]._NodeProcess.send is not send:
        return False
    ref = getattr(element, "__jsii_ref__", None)
    if not isinstance(ref, _state["types"].ObjRef):
        return False
    _pins.append((ref, logical_id))
    return True


def pins_ride_along() -> None:
    """Told by ``constructs_lib.jsii_runtime`` that this process's kernel applies ``"gpufleet.pins"`` (they are
    deferred only while this module's ``send``, which attaches them, is jsii's)."""
    _state["pins"] = True


def _carries_pins(request: Any) -> bool:
    types = _state["types"]
    return type(request) in (types.CreateRequest, types.GetRequest, types.SetRequest, types.InvokeRequest,
                             types.StaticGetRequest, types.StaticSetRequest, types.StaticInvokeRequest, types.StatsRequest)


def _callback_failed(request: Any, error: Exception) -> Any:
    """The ``complete`` that ends a callback, carrying ``error`` (an override made in the callback that the
    kernel refused) as the callback's own error, which is what jsii sends when the override raises inside the
    callback (``_callback_till_result``, jsii/_kernel/__init__.py:254-265). Raised instead, the error left the
    kernel waiting inside the callback for a ``complete`` that never came, and the JavaScript that called back
    never saw it (cdktf's ``Resolution error`` context). Any other request: ``error`` is raised, where jsii
    would have raised it at the override."""
    types, process = _state["types"], _state["process"]
    if type(request) is process._CompleteRequest:
        return process._CompleteRequest(complete=types.CompleteRequest(cbid=request.complete.cbid, err=str(error)))
    if type(request) is types.CompleteRequest:
        return types.CompleteRequest(cbid=request.cbid, err=str(error))
    raise error


def send(self: Any, request: Any, response_type: Any) -> Any:
    """jsii 1.142.0's ``_NodeProcess.send`` (process.py:330-358), line for line, with ``unstructure`` above,
    ``_encode`` for its ``json.dumps``, ``_next_message`` for its own, and waiting logical id overrides ridden
    along (the module's docstring)."""
    process = _state["process"]

    pins = None
    if _pins:
        if not _carries_pins(request):
            try:
                send(self, _state["types"].StatsRequest(), _state["types"].StatsResponse)
            except (process.JSIIError, RuntimeError) as error:
                request = _callback_failed(request, error)
        else:
            pins = [[process._unstructure_ref(ref), logical_id] for ref, logical_id in _pins]
            _pins.clear()

    req_dict, plain = _unstructure(self._serializer, request)
    if pins is not None:
        req_dict[PINS_FIELD] = pins

    if process._stack_traces_enabled():
        stack_trace = process.capture_stack_trace()
        if stack_trace:
            req_dict["$jsii.stacktrace"] = stack_trace

    data = _encode(req_dict, plain, process.jdefault)

    assert self._process.stdin is not None
    self._process.stdin.write(b"%b\n" % (data,))
    self._process.stdin.flush()

    resp = self._serializer.structure(_next_message(self), process._ProcessResponse)

    if isinstance(resp, process._OkayResponse):
        return self._serializer.structure(resp.ok, response_type)
    elif isinstance(resp, process._CallbackResponse):
        return resp.callback
    else:
        if resp.name == process.ErrorType.JSII_FAULT.value:
            raise process.JSIIError(resp.error) from process.JavaScriptError(resp.stack)
        raise RuntimeError(resp.error) from process.JavaScriptError(resp.stack)


def install() -> bool:
    """Send this way from now on in this process (True), or leave jsii's ``send`` (False). Works for a
    kernel already started too: ``send`` is looked up on the class."""
    from jsii._kernel import types
    from jsii._kernel.providers import process

    if process._NodeProcess.send is send:
        return True
    if not (reviewed_jsii() and reviewed_cattrs()):
        return False
    _state.update(process=process, types=types, upstream=process._NodeProcess.send)
    hide_from_host_stack_traces(send)
    process._NodeProcess.send = send
    return True
