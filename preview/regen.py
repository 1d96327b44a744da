"""Maintainer script: regenerate the vendored ForceNew tables from the providers' Go source.

    python -m preview.regen --mirror google=/path/to/terraform-provider-google.git ...

Each ``--mirror NAME=GIT_DIR`` is a clone (bare is fine) of the provider's repository; the
script reads the tag of the version gpufleet pins (``PROVIDERS[NAME].tag``) with ``git show``,
so the working copy's checkout does not matter. It writes ``forcenew/<name>.json`` next to
this file: for every resource type gpufleet synthesizes, the attribute paths whose change
forces replacement, each with the Go file and line it was read from, plus the tag and commit.
``tests/preview/test_forcenew_tables.py`` fails when a pinned provider version (the
``required_providers`` of the synthesized stacks) differs from the table's.

Semantics recorded per path (terraform-plugin-sdk v2): ``"kind": "attribute"`` forces
replacement on any change of its value; ``"kind": "block"`` (a ForceNew list/set of nested
blocks) only when blocks are added or removed; nested attributes carry their own flag.
Plugin-framework resources (``RequiresReplace()`` plan modifiers) and ``kubernetes_manifest``
(``RequiresReplace`` paths set in PlanResourceChange) map to ``attribute``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from preview.goschema import Attr, Reader, force_new_paths
from preview.gosource import Package, Unsupported

TABLE_DIR = Path(__file__).resolve().parent / "forcenew"


@dataclass(frozen=True)
class Provider:
    repo: str
    tag: str
    registry: str
    """The provider source address in required_providers (``google``, ``cloudflare/cloudflare``)."""
    dirs: tuple[str, ...]
    """Go package directories whose ``func``/``var`` declarations schemas may reference."""
    registration: tuple[str, ...]
    """Files (or directories) that map resource type names to their schema functions."""
    resources: tuple[str, ...]


PROVIDERS: dict[str, Provider] = {
    "google": Provider(
        repo="hashicorp/terraform-provider-google", tag="v6.50.0", registry="google",
        dirs=("google/services/container", "google/services/compute", "google/services/dns", "google/services/resourcemanager", "google/services/secretmanager", "google/services/storage",
              "google/tpgresource",
              "google/tpgiamresource", "google/verify"),
        registration=("google/provider",),
        resources=(
            "google_compute_address", "google_compute_firewall", "google_compute_forwarding_rule", "google_compute_global_address",
            "google_compute_instance_group_manager", "google_compute_instance_template", "google_compute_network",
            "google_compute_region_autoscaler", "google_compute_region_backend_service", "google_compute_region_health_check",
            "google_compute_region_instance_group_manager", "google_compute_region_instance_template", "google_compute_router",
            "google_compute_router_nat", "google_compute_subnetwork", "google_container_cluster", "google_container_node_pool",
            "google_dns_managed_zone", "google_dns_record_set",
            "google_project_iam_member", "google_secret_manager_secret", "google_secret_manager_secret_iam_member",
            "google_service_account", "google_service_account_iam_member", "google_storage_bucket", "google_storage_bucket_iam_member",
        ),
    ),
    "nomad": Provider(
        repo="hashicorp/terraform-provider-nomad", tag="v2.5.2", registry="nomad", dirs=("nomad",), registration=("nomad/provider.go",),
        resources=("nomad_acl_policy", "nomad_namespace", "nomad_node_pool"),
    ),
    "tfe": Provider(
        repo="hashicorp/terraform-provider-tfe", tag="v0.71.0", registry="hashicorp/tfe", dirs=("internal/provider",),
        registration=("internal/provider",),
        resources=("tfe_variable", "tfe_variable_set", "tfe_workspace", "tfe_workspace_settings", "tfe_workspace_variable_set"),
    ),
    "kubernetes": Provider(
        repo="hashicorp/terraform-provider-kubernetes", tag="v2.38.0", registry="kubernetes", dirs=("kubernetes",),
        registration=("kubernetes/provider.go", "manifest/provider/plan.go"),
        resources=(
            "kubernetes_cluster_role_v1", "kubernetes_limit_range_v1", "kubernetes_manifest", "kubernetes_namespace_v1", "kubernetes_network_policy_v1",
            "kubernetes_priority_class_v1", "kubernetes_resource_quota_v1", "kubernetes_role_binding_v1", "kubernetes_service_account_v1",
        ),
    ),
    "cloudflare": Provider(
        repo="cloudflare/terraform-provider-cloudflare", tag="v5.14.0", registry="cloudflare/cloudflare", dirs=(),
        registration=(), resources=("cloudflare_dns_record",),
    ),
}


class Git:
    """The Go files of one tag, read once with ``git archive`` (one process, not one per file)."""

    def __init__(self, git_dir: Path, tag: str, paths: tuple[str, ...]) -> None:
        import io
        import tarfile

        self.git_dir, self.tag = git_dir, tag
        archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "--format=tar", tag, "--", *paths],
                                 check=True, capture_output=True).stdout
        self.sources: dict[str, str] = {}
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            for member in tar:
                if member.isfile() and member.name.endswith(".go") and not member.name.endswith("_test.go"):
                    self.sources[member.name] = tar.extractfile(member).read().decode("utf-8")  # type: ignore[union-attr]
        self._packages: dict[str, Package] = {}

    def commit(self) -> tuple[str, str]:
        out = subprocess.run(["git", "--git-dir", str(self.git_dir), "log", "-1", "--format=%H %cs", f"{self.tag}^{{commit}}"],
                             check=True, capture_output=True, text=True).stdout.split()
        return out[0], out[1]

    def files(self, path: str) -> list[str]:
        return sorted(n for n in self.sources if n == path or n.startswith(path.rstrip("/") + "/"))

    def package(self, directory: str) -> Package:
        """Declarations of one Go package directory (not its subdirectories), parsed once."""
        if directory not in self._packages:
            package = Package()
            for name in self.files(directory):
                if str(Path(name).parent) == directory:
                    package.add_source(self.sources[name], name)
            self._packages[directory] = package
        return self._packages[directory]

    def grep(self, pattern: str, *paths: str) -> list[tuple[str, int, str]]:
        regex = re.compile(pattern)
        hits = []
        for path in sorted({f for p in paths for f in self.files(p)}):
            for number, text in enumerate(self.sources[path].splitlines(), 1):
                if regex.search(text):
                    hits.append((path, number, text))
        return hits


def _reader(git: Git, own_dir: str, dirs: tuple[str, ...]) -> Reader:
    """Names resolve in the resource's own package first, then the helper packages in order."""
    order = [own_dir, *(d for d in dirs if d != own_dir)]
    return Reader([git.package(d) for d in order])


def _sdk_function(git: Git, provider: Provider, rtype: str) -> tuple[str, str, str]:
    """The schema function registered for a resource type (data sources excluded): (file, name, call arguments)."""
    for _, _, text in git.grep(rf'"{rtype}"\s*:\s*[\w.]+\(', *provider.registration):
        match = re.search(rf'"{rtype}"\s*:\s*(?:\w+\.)?(\w+)\((.*)\),?\s*$', text)
        if match and not match.group(1).lower().startswith("datasource"):
            name = match.group(1)
            hits = git.grep(rf"^func {name}\(", *provider.dirs)
            if not hits:
                raise Unsupported(f"{rtype}: schema function {name} not found in {provider.dirs}")
            return hits[0][0], name, match.group(2)
    raise Unsupported(f"{rtype}: not registered as an SDK resource in {provider.registration}")


def _framework_schema(git: Git, provider: Provider, rtype: str) -> tuple[str, str]:
    """A plugin-framework resource: the file naming the type, and the function building its schema.

    The function is ``ResourceSchema`` (cloudflare's generated code) or the resource's
    ``Schema`` method, whose ``resp.Schema = ...`` assignment holds the literal.
    """
    suffix = rtype.split("_", 1)[1]
    hits = git.grep(rf'TypeName = ("{rtype}"|req\.ProviderTypeName \+ "_{suffix}")', *(provider.dirs or ("internal",)))
    if not hits:
        raise Unsupported(f"{rtype}: no SDK registration and no framework resource naming it")
    path = hits[0][0]
    source = git.sources[path]
    schema_file = str(Path(path).parent / "schema.go")
    for candidate in (path, schema_file):
        if re.search(r"^func ResourceSchema\(", git.sources.get(candidate, ""), re.MULTILINE):
            return candidate, "ResourceSchema"
    if re.search(r"^func \([^)]*\) Schema\(", source, re.MULTILINE):
        return path, "Schema"
    raise Unsupported(f"{path}: cannot find the schema function of {rtype}")


def _framework_attrs(git: Git, path: str, func: str) -> dict[str, Attr]:
    """Read a framework schema; a ``Schema`` method is parsed from its own file (every resource has one)."""
    own = Package()
    own.add_source(git.sources[path], path)
    reader = Reader([own, git.package(str(Path(path).parent))])
    if func != "Schema":
        return reader.fw_schema(func)
    body = own.funcs["Schema"].body
    start = next((k for k in range(len(body) - 3) if [t.text for t in body[k:k + 4]] == ["resp", ".", "Schema", "="]), None)
    if start is None:
        raise Unsupported(f"{path}: Schema method without `resp.Schema = ...`")
    end = Package._statement_end(body, start + 4)
    return reader.fw_literal(body[start + 4:end])


def _manifest_paths(git: Git) -> list[tuple[str, dict]]:
    """kubernetes_manifest is a plugin-go resource: PlanResourceChange names the replacement paths."""
    path = "manifest/provider/plan.go"
    source = git.sources[path]
    out = []
    for match in re.finditer(r"resp\.RequiresReplace = append\(resp\.RequiresReplace,(.*?)\n\t*\)", source, re.DOTALL):
        line = source.count("\n", 0, match.start()) + 1
        for chain in re.findall(r"tftypes\.NewAttributePath\(\)((?:\.WithAttributeName\(\"\w+\"\))+)", match.group(1)):
            dotted = ".".join(re.findall(r'"(\w+)"', chain))
            out.append((dotted, {"kind": "attribute", "file": path, "line": line, "computed_only": False,
                                 "note": "unless the resource was imported (isImportedFlagFromPrivate)"}))
    if not out:
        raise Unsupported(f"{path}: no RequiresReplace paths found")
    return out


def _entries(attrs: dict[str, Attr]) -> dict[str, dict]:
    return {
        path: {"kind": "block" if attr.block else "attribute", "file": attr.file, "line": attr.line, "computed_only": attr.computed_only,
               **({"optional_computed": True} if attr.optional_computed else {})}
        for path, attr in force_new_paths(attrs)
    }


def build_table(name: str, git_dir: Path) -> dict:
    provider = PROVIDERS[name]
    git = Git(git_dir, provider.tag, (*provider.dirs, *provider.registration) or ("internal",))
    commit, date = git.commit()
    resources: dict[str, dict] = {}
    unsupported: dict[str, str] = {}
    for rtype in provider.resources:
        try:
            if rtype == "kubernetes_manifest":
                resources[rtype] = dict(_manifest_paths(git))
                continue
            try:
                path, func, args = _sdk_function(git, provider, rtype)
                reader = _reader(git, str(Path(path).parent), provider.dirs)
                resources[rtype] = _entries(reader.sdk_resource(func, args))
            except Unsupported as sdk_error:
                if "not registered" not in str(sdk_error):
                    raise
                path, func = _framework_schema(git, provider, rtype)
                resources[rtype] = _entries(_framework_attrs(git, path, func))
        except Unsupported as exc:
            unsupported[rtype] = str(exc)
    return {
        "_meta": {
            "provider": provider.repo, "registry": provider.registry, "version": provider.tag.removeprefix("v"), "tag": provider.tag,
            "commit": commit, "commit_date": date, "generated_by": "python -m preview.regen",
            "semantics": "kind=attribute: any change forces replacement; kind=block: adding or removing blocks forces replacement, "
                         "nested attributes follow their own entry. optional_computed: removing it from the configuration keeps "
                         "the prior value (no replacement). CustomizeDiff and DiffSuppressFunc logic is not modelled.",
            "unsupported": unsupported,
        },
        "resources": resources,
    }


def write_table(name: str, table: dict, directory: Path = TABLE_DIR) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", action="append", default=[], metavar="NAME=GIT_DIR",
                        help=f"provider name ({', '.join(PROVIDERS)}) and a clone of its repository")
    parser.add_argument("--out", type=Path, default=TABLE_DIR)
    args = parser.parse_args(argv)
    status = 0
    for item in args.mirror:
        name, _, git_dir = item.partition("=")
        if name not in PROVIDERS or not git_dir:
            print(f"error: --mirror {item}: expected NAME=GIT_DIR with NAME one of {', '.join(PROVIDERS)}", file=sys.stderr)
            return 2
        table = build_table(name, Path(git_dir))
        path = write_table(name, table, args.out)
        counts = {t: len(p) for t, p in table["resources"].items()}
        print(f"{path}: {table['_meta']['tag']} {table['_meta']['commit'][:12]} {counts}")
        for rtype, reason in table["_meta"]["unsupported"].items():
            print(f"  unsupported {rtype}: {reason}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
