"""The single place where prebuilt cdktf provider packages are imported.

Constructs reach provider classes through a submodule attribute,
``google.container_node_pool.ContainerNodePool``; this module decides how that submodule is
loaded. Keeping every provider import here means a later switch (CDK Terrain) is one edit,
and a stack only loads the providers it actually touches.

Why not a plain import: each prebuilt provider's root ``__init__.py`` imports every one of
its submodules (1,470 for google) only so that their classes register with the jsii runtime.
That costs seconds and hundreds of MB per provider. A submodule needs nothing from that root
module except ``from .._jsii import *`` (the assembly handle), so we put a bare package
module in ``sys.modules`` (just ``__path__``), load ``<package>._jsii`` (which loads the
assembly into the jsii kernel) and import only the submodules a construct asks for.

Classes the kernel hands back from a submodule nobody imported (an output reference typed
in another submodule) are still found: jsii's runtime imports the submodule that owns an
unknown type when its ``_submodule_fqn_map`` names it, and we fill that map for every
submodule of a provider when the provider loads (cheap: one directory listing).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType

_loading = {"naive": False, "started": False}


def use_naive_imports(naive: bool = True) -> None:
    """Import providers the packaged way (root ``__init__`` and all its submodules).

    Only the benchmark baseline and the byte-identical-output test want this; it must be
    chosen before the first provider submodule is touched, because ``sys.modules`` cannot
    hold both a bare and a fully imported package of the same name.
    """
    if _loading["started"] and _loading["naive"] != naive:
        raise RuntimeError("provider loading mode must be chosen before any provider submodule is imported")
    _loading["naive"] = naive


def jsii_submodule_name(python_name: str) -> str:
    """``container_node_pool`` -> ``containerNodePool``: jsii-pacmak's snake_case, reversed."""
    head, *rest = python_name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def load_assembly(package: str) -> ModuleType:
    """Load ``package``'s jsii assembly behind a bare package module; returns its ``_jsii`` module.

    Idempotent. A package already imported the normal way is left as it is (its types are
    all registered already).
    """
    existing = sys.modules.get(package)
    if existing is not None:
        return importlib.import_module(f"{package}._jsii")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"provider package {package!r} is not installed", name=package)
    search = list(spec.submodule_search_locations)
    bare_spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
    bare_spec.submodule_search_locations = search
    root = importlib.util.module_from_spec(bare_spec)
    root.__path__ = search
    sys.modules[package] = root
    try:
        jsii_module = importlib.import_module(f"{package}._jsii")
    except BaseException:
        del sys.modules[package]
        raise
    _register_submodules(package, jsii_module.__jsii_assembly__.name, search)
    return jsii_module


def submodule_fqn_map(package: str, assembly: str, search: list[str]) -> dict[str, str]:
    """jsii namespace -> Python module for every submodule directory of an installed provider."""
    fqn_map = {}
    for directory in search:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_dir() and not entry.name.startswith("_"):
                    fqn_map[f"{assembly}.{jsii_submodule_name(entry.name)}"] = f"{package}.{entry.name}"
    return fqn_map


def _register_submodules(package: str, assembly: str, search: list[str]) -> None:
    """Tell jsii which Python module owns each namespace, so it can import one on demand."""
    from jsii import _reference_map

    _reference_map._submodule_fqn_map.update(submodule_fqn_map(package, assembly, search))


class ProviderPackage:
    """``package.<submodule>`` imports ``<package>.<submodule>`` on first use, and nothing else."""

    def __init__(self, package: str) -> None:
        self.package = package

    def __getattr__(self, submodule: str) -> ModuleType:
        if submodule.startswith("_"):
            raise AttributeError(submodule)
        _loading["started"] = True
        if not _loading["naive"]:
            load_assembly(self.package)
        module = importlib.import_module(f"{self.package}.{submodule}")
        setattr(self, submodule, module)
        return module


google = ProviderPackage("cdktf_cdktf_provider_google")
kubernetes = ProviderPackage("cdktf_cdktf_provider_kubernetes")
cloudflare = ProviderPackage("cdktf_cdktf_provider_cloudflare")
nomad = ProviderPackage("cdktf_cdktf_provider_nomad")
tfe = ProviderPackage("cdktf_cdktf_provider_tfe")
