"""The single place where prebuilt cdktf provider packages are imported.

Constructs reach provider classes through a submodule attribute,
``google.container_node_pool.ContainerNodePool``; this module decides how that submodule is
loaded. Keeping every provider import here means a later switch (CDK Terrain, or a faster
loader) is one edit, and a stack only loads the providers it actually touches.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class ProviderPackage:
    """``package.<submodule>`` imports ``<package>.<submodule>`` on first use."""

    def __init__(self, package: str) -> None:
        self.package = package

    def __getattr__(self, submodule: str) -> ModuleType:
        if submodule.startswith("_"):
            raise AttributeError(submodule)
        module = importlib.import_module(f"{self.package}.{submodule}")
        setattr(self, submodule, module)
        return module


google = ProviderPackage("cdktf_cdktf_provider_google")
kubernetes = ProviderPackage("cdktf_cdktf_provider_kubernetes")
cloudflare = ProviderPackage("cdktf_cdktf_provider_cloudflare")
nomad = ProviderPackage("cdktf_cdktf_provider_nomad")
tfe = ProviderPackage("cdktf_cdktf_provider_tfe")
