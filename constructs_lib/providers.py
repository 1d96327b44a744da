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

The Node side has the same problem: the kernel ``require()``s the provider's
``lib/index.js``, which requires every submodule's JavaScript (google: ~5 s and ~450 MB in
the Node process). So the kernel is handed a copy of the assembly tarball whose
``index.js`` defines each submodule as a lazy getter; the kernel reaches a class through
``exports.<namespace>.<Class>``, so only the submodules a stack uses get required. The copy
is built once per installed tarball into a cache directory; if that fails (read-only home)
the packaged tarball is used and only speed is lost.

Last, every generated method re-derives ``typing.get_type_hints(<stub>)`` on each call to
type-check its arguments (~17% of a 50-cluster synthesis here). The hints of a stub
never change, so the submodules we import, and cdktf's own module (about 3% more: a
resource's lifecycle, an output's config, a backend's), get a ``typing`` whose
``get_type_hints`` is memoised (constructs' generated code already uses jsii's
``cached_type_hints``; swapping its ``typing`` changes nothing).

The checks themselves (typeguard, ~11% of a synthesis) guard values gpufleet's own typed code
already produced, so production synthesis skips them. The bindings' only switch is
``__debug__`` (``python -O``; jsii-pacmak emits ``if __debug__:`` before each ``check_type`` call,
``packages/jsii-pacmak/lib/targets/python.ts`` of aws/jsii, and jsii's runtime says the same in
``jsii/_type_checking.py``: "When running with python -O ... check_type is never called"); there
is no environment variable. ``-O`` would also strip gpufleet's own asserts and cannot be
turned on inside a running process, so instead the ``check_type`` name each generated module
calls (a global of its ``_private`` module) is replaced by a no-op. ``GPUFLEET_JSII_TYPE_CHECKS=1``
keeps the checks; the test suite sets it (``tests/conftest.py``) so a wrong prop type still fails.
"""

from __future__ import annotations

import gzip
import importlib
import importlib.machinery
import importlib.util
import io
import os
import re
import sys
import tarfile
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from constructs_lib import jsii_messages, jsii_structs

# Every synthesis imports the providers through here: from now on this process hands structs to the
# kernel without calling each generated getter (constructs_lib/jsii_structs.py) and encodes its most
# frequent requests without cattrs (constructs_lib/jsii_messages.py); jsii 1.142.0 only.
jsii_structs.install()
jsii_messages.install()

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


INDEX_JS = "package/lib/index.js"
_EAGER_EXPORT = re.compile(rb'^exports\.([A-Za-z0-9_$]+) = require\("(\./[^"]+)"\);$', re.MULTILINE)
_LAZY_EXPORT = (rb'Object.defineProperty(exports, "\1", { enumerable: true, configurable: true, get() { '
                rb'const m = require("\2"); Object.defineProperty(exports, "\1", { value: m, enumerable: true, '
                rb'writable: true }); return m; } });')
# Bump when the rewrite changes, so caches built by an older rewrite are not reused.
_LAZY_VERSION = 1


def lazy_index_js(source: bytes) -> bytes:
    """``exports.x = require("./x");`` -> a getter that requires ``./x`` on first access."""
    return _EAGER_EXPORT.sub(_LAZY_EXPORT, source)


def lazy_tarball_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpufleet" / "jsii-lazy-index"


def lazy_tarball(original: Path, cache_dir: Path) -> Path:
    """The assembly tarball with a lazy ``index.js``; built once, keyed by the original's size and mtime."""
    stat = original.stat()
    target = cache_dir / f"{original.name.removesuffix('.tgz')}-{stat.st_size}-{stat.st_mtime_ns}-v{_LAZY_VERSION}.tgz"
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        # Same bytes on every build (no gzip name or time, members keep their headers): jsii's
        # package cache is keyed by the tarball digest, so a rebuild must not add an entry.
        with tarfile.open(original, "r|gz") as src, open(partial, "wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", compresslevel=1, fileobj=raw, mtime=0) as packed, \
                tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as dst:
            for member in src:
                data = src.extractfile(member) if member.isfile() else None
                if member.name == INDEX_JS and data is not None:
                    rewritten = lazy_index_js(data.read())
                    member.size = len(rewritten)
                    data = io.BytesIO(rewritten)
                dst.addfile(member, data)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


@contextmanager
def _kernel_loads_lazy_tarballs(jsii_dir: Path, cache_dir: Path) -> Iterator[None]:
    """While ``<package>._jsii`` imports, hand the kernel the lazy copy of that package's tarball."""
    from jsii._runtime import kernel

    def load(name: str, version: str, tarball: str) -> None:
        path = Path(tarball)
        if path.resolve().parent == jsii_dir:
            try:
                path = lazy_tarball(path, cache_dir)
            except (OSError, tarfile.TarError):
                pass
        type(kernel).load(kernel, name, version, os.fspath(path))

    kernel.load = load
    try:
        yield
    finally:
        del kernel.load


def load_assembly(package: str, *, lazy_js: bool = True) -> ModuleType:
    """Load ``package``'s jsii assembly behind a bare package module; returns its ``_jsii`` module.

    ``lazy_js=False`` hands the kernel the packaged tarball (the benchmark's jsii floor).
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
    import cdktf  # noqa: F401  (the assemblies every provider depends on load first, unmodified)

    sys.modules[package] = root
    try:
        if lazy_js:
            with _kernel_loads_lazy_tarballs((Path(search[0]) / "_jsii").resolve(), lazy_tarball_cache()):
                jsii_module = importlib.import_module(f"{package}._jsii")
        else:
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


_hints: dict[object, dict[str, object]] = {}


def _memoised_type_hints(obj: object, *args: object, **kwargs: object) -> dict[str, object]:
    """Generated code calls ``get_type_hints(stub)`` and only reads the result."""
    if args or kwargs:
        return typing.get_type_hints(obj, *args, **kwargs)
    hints = _hints.get(obj)
    if hints is None:
        hints = _hints[obj] = typing.get_type_hints(obj)
    return hints


_typing_with_memoised_hints = ModuleType("typing", typing.__doc__)
_typing_with_memoised_hints.__dict__.update(typing.__dict__)
_typing_with_memoised_hints.get_type_hints = _memoised_type_hints


def _memoise_type_hints(module: ModuleType) -> None:
    """``publication`` moved the module's real globals to ``<module>._private``; swap ``typing`` there."""
    private = sys.modules.get(f"{module.__name__}._private")
    if private is not None and getattr(private, "typing", None) is typing:
        private.typing = _typing_with_memoised_hints


TYPE_CHECKS_ENV = "GPUFLEET_JSII_TYPE_CHECKS"
# Core jsii modules whose generated methods every construct calls.
CORE_MODULES = ("constructs", "cdktf")


def type_checks_enabled() -> bool:
    return os.environ.get(TYPE_CHECKS_ENV, "") == "1"


def _no_type_check(argname: str, value: object, expected_type: object) -> None:
    """Stands in for the generated ``check_type``: production synthesis skips typeguard."""


def _skip_type_checks(module_name: str) -> None:
    private = sys.modules.get(f"{module_name}._private")
    if private is not None and callable(getattr(private, "check_type", None)):
        private.check_type = _no_type_check


def apply_type_check_policy(module: ModuleType | None = None) -> None:
    """Unless ``GPUFLEET_JSII_TYPE_CHECKS=1``, turn the generated checks of ``module`` and of cdktf's core off."""
    if type_checks_enabled():
        return
    for name in (*CORE_MODULES, *((module.__name__,) if module is not None else ())):
        _skip_type_checks(name)


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
        if not _loading["naive"]:
            for core in CORE_MODULES:  # cdktf's own structs (a resource's lifecycle, an output's config) too
                if core in sys.modules:
                    _memoise_type_hints(sys.modules[core])
            _memoise_type_hints(module)
            apply_type_check_policy(module)
        setattr(self, submodule, module)
        return module


google = ProviderPackage("cdktf_cdktf_provider_google")
kubernetes = ProviderPackage("cdktf_cdktf_provider_kubernetes")
cloudflare = ProviderPackage("cdktf_cdktf_provider_cloudflare")
nomad = ProviderPackage("cdktf_cdktf_provider_nomad")
tfe = ProviderPackage("cdktf_cdktf_provider_tfe")
