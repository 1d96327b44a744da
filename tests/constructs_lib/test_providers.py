"""Provider loading: only the submodules a stack uses, and output identical to the packaged import.

The packaged import is the reference: the fast path is only worth having if ``cdktf.out`` is
byte-for-byte what the root ``__init__`` import gives, and if jsii still finds the Python
class for every type the kernel hands back.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from constructs_lib import providers

REPO_ROOT = Path(__file__).resolve().parents[2]
PROVIDERS = ("google", "kubernetes", "cloudflare", "nomad", "tfe")
JSII_TYPE = re.compile(r'jsii_type="([^"]+)"')

SYNTH_EXAMPLE = """
import sys
from pathlib import Path
from constructs_lib import providers
if sys.argv[2] == "naive":
    providers.use_naive_imports()
import clusters
from stacks.synth import synthesize
synthesize(clusters.load_all(), Path(sys.argv[1]))
print(len([m for m in sys.modules if m.startswith("cdktf_cdktf_provider_google.")]))
"""

NOMAD_ONLY = """
import json, sys
from pathlib import Path
from cdktf import App, TerraformStack
from constructs_lib import providers
from constructs_lib.providers import nomad
providers.lazy_tarball_cache = lambda: Path(sys.argv[2])
app = App(outdir=sys.argv[1])
stack = TerraformStack(app, "nomad-only")
nomad.provider.NomadProvider(stack, "nomad", address="http://127.0.0.1:4646")
nomad.namespace.Namespace(stack, "ns", name="training")
app.synth()
root = sys.modules["cdktf_cdktf_provider_nomad"]
print(json.dumps({
    "loaded": sorted({m.split(".")[0] for m in sys.modules if m.startswith("cdktf_cdktf_provider_")}),
    "nomad_root_is_bare": not hasattr(root, "_private"),
    "nomad_submodules": sorted(m.split(".")[1] for m in sys.modules
                               if m.startswith("cdktf_cdktf_provider_nomad.") and m.count(".") == 1),
}))
"""


def _python(code: str, *args: str) -> subprocess.Popen:
    env = os.environ | {"JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
                        "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return out


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _first_jsii_type(module_dir: str) -> str:
    with open(os.path.join(module_dir, "__init__.py"), encoding="utf-8") as source:
        text = ""
        while chunk := source.read(65536):
            text += chunk
            if match := JSII_TYPE.search(text):
                return match.group(1)
    raise AssertionError(f"no jsii type in {module_dir}")


def test_synthesized_fleet_is_byte_identical_to_naive_provider_imports(tmp_path):
    """Both in fresh processes (run side by side): an in-process synth would share sys.modules."""
    fast = _python(SYNTH_EXAMPLE, str(tmp_path / "fast"), "fast")
    naive = _python(SYNTH_EXAMPLE, str(tmp_path / "naive"), "naive")
    fast_modules, naive_modules = int(_finish(fast)), int(_finish(naive))
    assert fast_modules < 100 < 1000 < naive_modules  # each process really loaded its own way
    fast_tree, naive_tree = _tree(tmp_path / "fast"), _tree(tmp_path / "naive")
    assert any(name.endswith("cdk.tf.json") for name in fast_tree)
    assert sorted(fast_tree) == sorted(naive_tree)
    differing = [name for name in fast_tree if fast_tree[name] != naive_tree[name]]
    assert differing == []


def test_nomad_only_stack_never_loads_other_providers(tmp_path):
    report = json.loads(_finish(_python(NOMAD_ONLY, str(tmp_path / "out"), str(tmp_path / "cache"))))
    assert report["loaded"] == ["cdktf_cdktf_provider_nomad"]
    assert report["nomad_root_is_bare"] is True
    assert report["nomad_submodules"] == ["_jsii", "namespace", "provider"]
    assert [p.name.split("-")[0] for p in (tmp_path / "cache").iterdir()] == ["provider"]
    assert (tmp_path / "out" / "stacks" / "nomad-only" / "cdk.tf.json").is_file()


def test_unusable_tarball_cache_falls_back_to_the_packaged_tarball(tmp_path):
    """Only speed may be lost: a cache path that cannot be a directory still synthesizes."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    report = json.loads(_finish(_python(NOMAD_ONLY, str(tmp_path / "out"), str(blocker / "cache"))))
    assert report["loaded"] == ["cdktf_cdktf_provider_nomad"]
    assert (tmp_path / "out" / "stacks" / "nomad-only" / "cdk.tf.json").is_file()


def test_lazy_index_requires_submodules_only_on_access():
    source = (b'"use strict";\nexports.a = exports.b = void 0;\n'
              b'exports.computeNetwork = require("./compute-network");\nexports.provider = require("./provider");\n')
    lazy = providers.lazy_index_js(source)
    assert lazy.startswith(b'"use strict";\nexports.a = exports.b = void 0;\n')
    assert b'exports.computeNetwork = require' not in lazy and b'exports.provider = require' not in lazy
    assert b'Object.defineProperty(exports, "computeNetwork", { enumerable: true, configurable: true, get() { ' \
           b'const m = require("./compute-network");' in lazy
    assert lazy.count(b"get() {") == 2


def test_lazy_tarball_differs_from_the_packaged_one_only_in_index_js(tmp_path):
    """nomad's tarball is small; the rewrite is the same for every provider (the synth test covers google)."""
    import tarfile

    package_dir = Path(importlib.util.find_spec("cdktf_cdktf_provider_nomad").submodule_search_locations[0])
    original = next((package_dir / "_jsii").glob("*.jsii.tgz"))
    lazy = providers.lazy_tarball(original, tmp_path / "a")
    assert providers.lazy_tarball(original, tmp_path / "a") == lazy
    # jsii caches extractions by digest: a rebuild elsewhere must give the same bytes.
    assert providers.lazy_tarball(original, tmp_path / "b").read_bytes() == lazy.read_bytes()
    with tarfile.open(original) as before, tarfile.open(lazy) as after:
        members_before = [(m.name, m.size, m.mode) for m in before.getmembers()]
        members_after = [(m.name, m.size, m.mode) for m in after.getmembers()]
        index_js = after.extractfile(providers.INDEX_JS).read()
    assert [m[0] for m in members_before] == [m[0] for m in members_after]
    unchanged = [m for m in members_before if m[0] != providers.INDEX_JS]
    assert unchanged == [m for m in members_after if m[0] != providers.INDEX_JS]
    assert re.search(rb"^exports\.\w+ = require\(", index_js, re.MULTILINE) is None
    assert index_js.count(b"get() {") == 44


@pytest.mark.parametrize("provider", PROVIDERS)
def test_fqn_map_names_the_module_of_every_jsii_type(provider):
    """jsii imports a submodule on demand only if this map names it; a wrong name is an 'Unknown type' at synth time."""
    package = f"cdktf_cdktf_provider_{provider}"
    search = list(importlib.util.find_spec(package).submodule_search_locations)
    # The assembly name is the npm name, the same for every prebuilt provider.
    fqn_map = providers.submodule_fqn_map(package, f"@cdktf/provider-{provider}", search)
    module_dirs = {module: os.path.join(search[0], module.split(".")[1]) for module in fqn_map.values()}
    wrong = []
    for namespace, module in fqn_map.items():
        fqn = _first_jsii_type(module_dirs[module])
        if not fqn.startswith(namespace + "."):
            wrong.append((module, fqn))
    assert len(fqn_map) > 40
    assert wrong == []


def test_deep_attribute_access_returns_output_references():
    from cdktf import App, TerraformOutput, TerraformStack, Testing

    stack = TerraformStack(App(), "deep")
    providers.google.provider.GoogleProvider(stack, "google", project="p", region="europe-west4")
    cluster = providers.google.container_cluster.ContainerCluster(stack, "cluster", name="c", location="europe-west4")
    master_auth = cluster.master_auth
    pool = cluster.node_pool.get(0)
    assert type(master_auth).__name__ == "ContainerClusterMasterAuthOutputReference"
    assert type(pool).__name__ == "ContainerClusterNodePoolOutputReference"
    TerraformOutput(stack, "ca", value=master_auth.cluster_ca_certificate)
    TerraformOutput(stack, "pool", value=pool.name)
    outputs = json.loads(Testing.synth(stack))["output"]
    assert outputs["ca"]["value"] == "${google_container_cluster.cluster.master_auth[0].cluster_ca_certificate}"
    assert outputs["pool"]["value"] == "${google_container_cluster.cluster.node_pool[0].name}"


def test_type_from_an_unimported_submodule_is_resolved_on_demand():
    """The kernel may return an object whose class lives in a submodule no construct imported."""
    from jsii import _reference_map
    from jsii._kernel.types import ObjRef

    providers.google.provider  # loads the assembly and registers the namespaces
    module = "cdktf_cdktf_provider_google.vmwareengine_network_peering"
    assert module not in sys.modules, "pick a submodule nothing else in the session imports"
    obj = _reference_map.resolve_reference(
        None, ObjRef(ref="@cdktf/provider-google.vmwareengineNetworkPeering.VmwareengineNetworkPeering@10000"))
    assert type(obj).__name__ == "VmwareengineNetworkPeering"
    assert module in sys.modules
    struct = "@cdktf/provider-google.vmwareenginePrivateCloud.VmwareenginePrivateCloudManagementCluster"
    assert _reference_map._try_import_type_module(struct)
    assert struct in _reference_map._data_types


def test_fails_when_loading_mode_changes_after_first_import():
    providers.google.provider
    with pytest.raises(RuntimeError, match="must be chosen before any provider submodule"):
        providers.use_naive_imports()


def test_fails_when_provider_package_is_missing():
    with pytest.raises(ModuleNotFoundError, match="'cdktf_cdktf_provider_nope' is not installed"):
        providers.load_assembly("cdktf_cdktf_provider_nope")


def test_fails_when_a_prop_has_the_wrong_type_even_with_memoised_hints():
    """Memoising the hints must not turn the generated argument checks off."""
    import typing

    from cdktf import App, TerraformStack

    stack = TerraformStack(App(), "typed")
    network = providers.google.compute_network
    assert sys.modules[f"{network.__name__}._private"].typing is not typing
    for _ in range(2):  # the second call reads the memoised hints
        with pytest.raises(TypeError, match="name must be str; got int"):
            network.ComputeNetwork(stack, f"vpc{_}", name=123)
