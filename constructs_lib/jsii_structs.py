"""Struct values sent to the jsii kernel without calling each generated property getter.

Whenever Python hands a struct (a ``@jsii.data_type`` class: a resource's config, a block of it) to the
kernel, jsii 1.142.0 serializes it in ``_make_reference_for_native``
(``jsii/_kernel/__init__.py:154-206``): for every entry of the class's name mapping it calls the
property getter, ``getattr(d, python_name)`` (line 182), and serializes the result. Each getter
jsii-pacmak generated reads ``self._values.get("<key>")`` and returns
``typing.cast(typing.Optional[<type>], result)`` (a required property asserts ``result is not None``
first): ``typing.cast`` returns its second argument unchanged, so all the getter adds to the dictionary
read is building the subscripted type, a ``typing`` cache lookup per getter. A generated provider struct
has dozens of optional properties, mostly unset; a generated cluster passes about 2,800 getters per
cluster, about 4 us each (11 ms of a cluster's ~88 ms of CPU, issue 28 fifth round).

Here the same function reads ``_values`` directly, but only for a property whose getter is provably the
generated one: the class attribute (the first one on the class's MRO, which is what ``getattr`` finds
for a data descriptor when the metaclass is ``type``) is a plain ``property`` whose getter's bytecode is
exactly the generator's shape (``_generated_key`` below: ``self._values.get(<str constant>)``,
optionally the ``is not None`` assert, then ``typing.cast(<type expression>, result)`` where the type
expression only loads existing global names and their attributes, subscripts and builds tuples, and
``typing.cast`` is the real one). Anything else (a user subclass overriding a getter, a class with its
own ``__getattribute__`` or metaclass, a missing or non-dict ``_values``, another Python's bytecode) is
read through the getter as before. A required property whose value is missing is read through its getter
too, so it fails with the generated ``AssertionError`` and message. The values are read and serialized
one after another in the mapping's order, as upstream does (serializing a value may create a kernel
object, and object ids follow that order).

Each class is examined on its first use in a process (a getter replaced on a class after that keeps the
reading chosen then; generated code never replaces one), and getters that compile to the same bytecode,
names and constant types (all getters of one property type: a few hundred layouts) are disassembled
once: about 10 ms a process for the example fleet's 150 struct classes, against ~75 ms disassembling
each getter.

Installed only on jsii ``REVIEWED_JSII``, the version whose ``_make_reference_for_native`` was read
(``tests/constructs_lib/test_jsii_structs.py`` fails on an upgrade until the new one is read and named
here); on any other version jsii's own function runs.
"""

from __future__ import annotations

import builtins
import dis
import enum
import inspect
import sys
import typing
from types import CodeType, FunctionType
from typing import Any, NamedTuple

REVIEWED_JSII = "1.142.0"
_TYPE_EXPRESSION_OPS = frozenset({"LOAD_GLOBAL", "LOAD_ATTR", "LOAD_CONST", "BINARY_SUBSCR", "BUILD_TUPLE"})


class _Field(NamedTuple):
    jsii_name: str
    python_name: str
    key: str | None  # the ``_values`` key its generated getter reads; None: call the getter
    required: bool


class _Struct(NamedTuple):
    mapping: object  # the class's ``__jsii_name_mapping__`` when examined
    fields: tuple[_Field, ...]


_structs: dict[type, _Struct | None] = {}
_state: dict[str, Any] = {}


class _Shape(NamedTuple):
    key_index: int  # where the ``_values`` key is in ``co_consts``
    required: bool
    global_names: tuple[str, ...]  # what the type expression loads from the module


# One getter bytecode per type expression: thousands of getters share a few hundred shapes.
_shapes: dict[tuple, _Shape | None] = {}


def _shape(code: CodeType) -> _Shape | None:
    """The generated getter's layout found in ``code`` (see ``_generated_key``), or None."""
    ins = list(dis.get_instructions(code))
    ops = [(i.opname, i.argval) for i in ins]
    head = ops[:8]
    if len(ops) < 13 or head[:4] != [("RESUME", 0), ("LOAD_FAST", "self"), ("LOAD_ATTR", "_values"), ("LOAD_METHOD", "get")] \
            or head[4][0] != "LOAD_CONST" or type(head[4][1]) is not str \
            or head[5:] != [("PRECALL", 1), ("CALL", 1), ("STORE_FAST", "result")]:
        return None
    rest = 8
    required = ops[rest:rest + 2] == [("LOAD_FAST", "result"), ("POP_JUMP_FORWARD_IF_NOT_NONE", ins[rest + 7].offset)] \
        if len(ins) > rest + 7 else False
    if required:
        if ops[rest + 2][0] != "LOAD_ASSERTION_ERROR" or ops[rest + 3][0] != "LOAD_CONST" \
                or type(ops[rest + 3][1]) is not str \
                or ops[rest + 4:rest + 7] != [("PRECALL", 0), ("CALL", 0), ("RAISE_VARARGS", 1)]:
            return None
        rest += 7
    # ``typing.cast`` compiles to LOAD_GLOBAL (with NULL) + LOAD_ATTR, or to LOAD_GLOBAL + LOAD_METHOD: the same call.
    if ops[rest:rest + 2] not in ([("LOAD_GLOBAL", "typing"), ("LOAD_ATTR", "cast")],
                                  [("LOAD_GLOBAL", "typing"), ("LOAD_METHOD", "cast")]) \
            or ops[-4:] != [("LOAD_FAST", "result"), ("PRECALL", 2), ("CALL", 2), ("RETURN_VALUE", None)]:
        return None
    expression = ops[rest + 2:-4]
    if not expression or any(op not in _TYPE_EXPRESSION_OPS for op, _ in expression):
        return None
    return _Shape(ins[4].arg, required, tuple(name for op, name in expression if op == "LOAD_GLOBAL"))


def _generated_key(fget: object) -> tuple[str, bool] | None:
    """``(key, required)`` when ``fget`` is a getter exactly as jsii-pacmak generates it, else None."""
    if type(fget) is not FunctionType or fget.__defaults__ or fget.__kwdefaults__ or fget.__closure__:
        return None
    code = fget.__code__
    if code.co_argcount != 1 or code.co_kwonlyargcount or code.co_varnames != ("self", "result") or code.co_freevars \
            or code.co_cellvars or code.co_exceptiontable or code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS | inspect.CO_GENERATOR
                                                    | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        return None
    # What ``dis`` reads from the code object, except the constants' values (only their types are checked).
    layout = (code.co_code, code.co_names, code.co_varnames, tuple(type(c) for c in code.co_consts))
    try:
        shape = _shapes[layout]
    except KeyError:
        shape = _shapes[layout] = _shape(code)
    if shape is None:
        return None
    globals_ = fget.__globals__
    if getattr(globals_.get("typing"), "cast", None) is not typing.cast:
        return None
    for name in shape.global_names:
        if name not in globals_ and not hasattr(builtins, name):
            return None
    return code.co_consts[shape.key_index], shape.required


def _class_attribute(cls: type, name: str) -> object:
    """``inspect.getattr_static(cls, name)`` for a class whose metaclass is ``type`` (a struct's is)."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None


def _examine(cls: type) -> _Struct | None:
    """How to read ``cls``'s struct values, or None when jsii's own function must serialize it."""
    if type(cls) is not type or issubclass(cls, (dict, list, enum.Enum)) \
            or cls.__getattribute__ is not object.__getattribute__:
        return None
    mapping = getattr(cls, "__jsii_name_mapping__", None)
    if type(mapping) is not dict or getattr(cls, "__jsii_type__", None) is None:
        return None
    fields = []
    for python_name, jsii_name in mapping.items():
        attribute = _class_attribute(cls, python_name)
        generated = _generated_key(attribute.fget) if type(attribute) is property else None
        key, required = generated if generated is not None else (None, False)
        fields.append(_Field(jsii_name, python_name, key, required))
    return _Struct(mapping, tuple(fields))


def _struct_of(cls: type) -> _Struct | None:
    try:
        return _structs[cls]
    except KeyError:
        struct = _structs[cls] = _examine(cls)
        return struct


def make_reference_for_native(kernel: Any, d: Any) -> Any:
    """jsii's ``_make_reference_for_native`` with struct values read as described in the module docstring."""
    cls = type(d)
    if cls is str or cls is int or cls is float or cls is bool or d is None:
        return d  # what upstream returns for these exact types (line 190), after its three checks
    struct = _struct_of(cls)
    if struct is None or getattr(d, "__jsii_type__", None) is None \
            or getattr(d, "__jsii_name_mapping__", None) is not struct.mapping:
        return _state["upstream"](kernel, d)
    values = getattr(d, "_values", None)  # not there, or not a dict: jsii's function, which fails as it fails
    if type(values) is not dict:
        return _state["upstream"](kernel, d)
    module = _state["module"]
    data = {}
    for field in struct.fields:
        if field.key is None:
            value = getattr(d, field.python_name)
        else:
            value = values.get(field.key)
            if value is None and field.required:
                value = getattr(d, field.python_name)  # the generated assert, with its message
        data[field.jsii_name] = module._make_reference_for_native(kernel, value)
    return {"$jsii.struct": {"fqn": getattr(d, "__jsii_type__"), "data": data}}


def hide_from_host_stack_traces(function: FunctionType) -> None:
    """Leave ``function``'s file out of the Python stack jsii sends with each request when
    ``JSII_HOST_STACK_TRACES`` is set, as jsii leaves out its own files (``jsii/_stack_trace.py``: frames
    whose file starts with one of ``_INTERNAL_PREFIXES``, jsii's directory). This module's and
    ``jsii_messages``' functions run where jsii's own ran, so the request lists the same frames as jsii's."""
    from jsii import _stack_trace

    filename = function.__code__.co_filename
    if filename not in _stack_trace._INTERNAL_PREFIXES:
        _stack_trace._INTERNAL_PREFIXES += (filename,)


def reviewed_jsii() -> bool:
    import jsii

    return jsii.__version__ == REVIEWED_JSII and sys.version_info[:2] == (3, 11)


def install() -> bool:
    """Serialize structs this way from now on in this process (True), or leave jsii's function (False)."""
    import jsii._kernel as module

    if module._make_reference_for_native is make_reference_for_native:
        return True
    if not reviewed_jsii():
        return False
    _state["upstream"] = module._make_reference_for_native
    _state["module"] = module
    hide_from_host_stack_traces(make_reference_for_native)
    module._make_reference_for_native = make_reference_for_native
    return True
