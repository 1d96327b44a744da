"""Struct serialization without the generated getters (constructs_lib/jsii_structs.py) against jsii's own.

Every struct class the example fleet's synthesis registers with jsii (constructs, cdktf and every provider
submodule the constructs use) is checked property by property: the key the fast path reads is the value the
real getter returns, a missing required property fails with the getter's own ``AssertionError``, and the
whole serialized struct equals what jsii 1.142.0's ``_make_reference_for_native`` makes of it. Getters that
are not the generated one (a user subclass, hand-written near misses) must be called, not bypassed.
"""

from __future__ import annotations

import typing

import jsii
import pytest
from jsii import _reference_map
import jsii._kernel as jsii_kernel

from constructs_lib import jsii_structs
from constructs_lib.providers import google


def _upstream():
    return jsii_structs._state["upstream"]


def _fleet_struct_classes() -> list[type]:
    return sorted(set(_reference_map._data_types.values()), key=lambda cls: cls.__jsii_type__)


def test_installed_only_on_the_reviewed_jsii():
    # An upgrade fails here until the new _make_reference_for_native is read and REVIEWED_JSII names it.
    assert jsii.__version__ == jsii_structs.REVIEWED_JSII
    assert jsii_kernel._make_reference_for_native is jsii_structs.make_reference_for_native
    assert _upstream().__module__ == "jsii._kernel"


def test_every_fleet_struct_reads_what_its_getter_returns(fleet_out):
    classes = _fleet_struct_classes()
    assert len(classes) > 100  # the fleet's synthesis loaded the providers' structs
    fields = 0
    for cls in classes:
        struct = jsii_structs._struct_of(cls)
        assert struct is not None, cls
        mapping = cls.__jsii_name_mapping__
        assert [f.jsii_name for f in struct.fields] == list(mapping.values())
        # Every property of these classes is the generated getter, so none falls back to a getter call.
        assert all(f.key is not None for f in struct.fields), cls
        obj = cls.__new__(cls)
        obj._values = {f.key: f"value of {f.python_name}" for f in struct.fields}
        for f in struct.fields:
            assert getattr(obj, f.python_name) is obj._values[f.key], (cls, f)
        assert jsii_structs.make_reference_for_native(None, obj) == _upstream()(None, obj)
        # Unset: optional getters return None, required ones fail with their own message, on both paths.
        for f in struct.fields:
            obj._values = {g.key: "set" for g in struct.fields if g is not f}
            if f.required:
                with pytest.raises(AssertionError) as upstream_error:
                    _upstream()(None, obj)
                with pytest.raises(AssertionError) as fast_error:
                    jsii_structs.make_reference_for_native(None, obj)
                assert str(fast_error.value) == str(upstream_error.value) == f"Required property '{f.key}' is missing"
            else:
                assert getattr(obj, f.python_name) is None
                assert jsii_structs.make_reference_for_native(None, obj) == _upstream()(None, obj)
            fields += 1
    assert fields > 1000


def test_nested_structs_lists_and_maps_serialize_as_upstream(fleet_out):
    pool = google.container_node_pool
    autoscaling = pool.ContainerNodePoolAutoscaling(max_node_count=4, location_policy="ANY")
    config = pool.ContainerNodePoolNodeConfig(machine_type="a3-highgpu-8g", labels={"a": "1"},
                                              taint=[pool.ContainerNodePoolNodeConfigTaint(key="k", value="v",
                                                                                          effect="NO_SCHEDULE")])
    for value in (autoscaling, config, [autoscaling, {"m": config}], {"x": [config, None, 1.5, True]}, "s", 0, None, False, 2.5):
        assert jsii_structs.make_reference_for_native(None, value) == _upstream()(None, value)


def test_a_subclass_overriding_a_getter_is_called(fleet_out):
    base = google.container_node_pool.ContainerNodePoolAutoscaling

    class Defaulted(base):
        @property
        def location_policy(self) -> typing.Optional[str]:
            return self._values.get("location_policy") or "BALANCED"

    data = jsii_structs.make_reference_for_native(None, Defaulted(max_node_count=2))["$jsii.struct"]["data"]
    assert data["locationPolicy"] == "BALANCED"
    assert data == _upstream()(None, Defaulted(max_node_count=2))["$jsii.struct"]["data"]
    assert jsii_structs.make_reference_for_native(None, base(max_node_count=2))["$jsii.struct"]["data"][
        "locationPolicy"] is None


def test_a_struct_without_values_fails_as_upstream(fleet_out):
    obj = google.container_node_pool.ContainerNodePoolAutoscaling.__new__(google.container_node_pool.ContainerNodePoolAutoscaling)
    with pytest.raises(AttributeError) as upstream_error:
        _upstream()(None, obj)
    with pytest.raises(AttributeError) as fast_error:
        jsii_structs.make_reference_for_native(None, obj)
    assert str(fast_error.value) == str(upstream_error.value)


_GENERATED = '''
@builtins.property
def optional(self) -> typing.Optional[builtins.str]:
    """doc"""
    result = self._values.get("optional")
    return typing.cast(typing.Optional[typing.List[builtins.str]], result)

@builtins.property
def required(self) -> builtins.str:
    result = self._values.get("required")
    assert result is not None, "Required property 'required' is missing"
    return typing.cast(builtins.str, result)
'''

_NEAR_MISSES = {
    "default": 'result = self._values.get("k")\n    return typing.cast(typing.Optional[str], result or "x")',
    "call in the type": 'result = self._values.get("k")\n    return typing.cast(typing.Optional[pick()], result)',
    "another dict": 'result = self._other.get("k")\n    return typing.cast(typing.Optional[str], result)',
    "computed key": 'result = self._values.get("k" + "")\n    return typing.cast(typing.Optional[key()], result)',
    "not cast": 'result = self._values.get("k")\n    return typing.Optional[str](result)',
    "missing global": 'result = self._values.get("k")\n    return typing.cast(typing.Optional[Nowhere], result)',
    "side effect": 'result = self._values.get("k")\n    log.append(1)\n    return typing.cast(str, result)',
}


def _compile(source: str, namespace: dict) -> dict:
    exec(compile(source, "<generated>", "exec"), namespace)
    return namespace


def test_the_generated_shape_is_recognised():
    import builtins

    ns = _compile(_GENERATED, {"builtins": builtins, "typing": typing})
    assert jsii_structs._generated_key(ns["optional"].fget) == ("optional", False)
    assert jsii_structs._generated_key(ns["required"].fget) == ("required", True)


@pytest.mark.parametrize("name", sorted(_NEAR_MISSES))
def test_a_getter_that_is_not_the_generated_one_is_not_bypassed(name):
    ns = _compile(f"def getter(self):\n    {_NEAR_MISSES[name]}\n",
                  {"typing": typing, "str": str, "pick": lambda: str, "key": lambda: str, "log": []})
    assert jsii_structs._generated_key(ns["getter"]) is None


def test_a_module_whose_typing_cast_is_not_typings_is_not_bypassed():
    import builtins
    import types

    fake = types.SimpleNamespace(cast=lambda t, v: "changed", Optional=typing.Optional, List=typing.List)
    ns = _compile(_GENERATED, {"builtins": builtins, "typing": fake})
    assert jsii_structs._generated_key(ns["optional"].fget) is None
