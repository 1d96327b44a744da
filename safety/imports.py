"""Reviewed import: bring resources that already exist in the cloud under this repo, one reviewed step at a time.

``generate`` turns an ids file (address -> provider id) into a manifest outside the repository
and prints its SHA-256; a reviewer reads the manifest and the digest. ``apply`` re-derives the
manifest from the ids it holds and the *current* synthesized stack: if the file was edited
(digest differs) or the stack changed since (re-derived bytes differ), it refuses. Only then
is the mapping recorded in ``stacks/imported/<stack>.json`` (committed, reviewed), from which
the next synthesis emits Terraform ``import`` blocks, and the plan gate treats those addresses
as protected: an imported resource existed before this repo and must not be destroyed by it.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusters.errors import UserError
from clusters.source import did_you_mean
from clusters import outputs
from stacks import imported
from stacks.imported import load_imports

MANIFEST_VERSION = 1


def synthesized_stack(stack: str, clusters_dir: Path | None, workdir: Path) -> Path:
    """Synthesize the stack's cluster from the current tree into ``workdir``: manifests are checked against what the
    repo produces now, never against a ``cdktf.out`` that may predate the last edit."""
    import clusters
    from stacks.synth import synthesize

    configs = clusters.load_all(clusters_dir) if clusters_dir else clusters.load_all()
    out = Path(workdir) / "cdktf.out"
    synthesize(configs, out, only=(stack,))
    path = out / "stacks" / stack / "cdk.tf.json"
    if not path.is_file():
        raise UserError(f"unknown stack {stack!r}; list the stacks with `gpufleet stacks`")
    return path


def stack_resources(stack_json: Path) -> dict[str, Any]:
    """address -> resource config of a synthesized ``cdk.tf.json``."""
    data = json.loads(Path(stack_json).read_text(encoding="utf-8"))
    return {f"{kind}.{name}": body for kind, by_name in sorted(data.get("resource", {}).items()) for name, body in sorted(by_name.items())}


def _canonical(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_ids(path: Path) -> dict[str, str]:
    if not Path(path).is_file():
        raise UserError(f"{path}: ids file not found; write a JSON object {{\"<address>\": \"<provider id>\"}}")
    try:
        ids = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); write {{\"<address>\": \"<provider id>\"}}") from None
    if not isinstance(ids, dict) or not ids or not all(isinstance(k, str) and isinstance(v, str) and v for k, v in ids.items()):
        raise UserError(f"{path}: must be a non-empty JSON object of address -> non-empty provider id strings")
    return ids


def derive_manifest(stack: str, ids: dict[str, str], stack_json: Path) -> bytes:
    """The manifest bytes: the ids plus a digest of each target's current config, so a stack change makes it stale."""
    resources = stack_resources(stack_json)
    for address in sorted(ids):
        if address not in resources:
            raise UserError(
                f"{address} is not a resource of stack {stack!r}{did_you_mean(address, resources)}; "
                f"use an address from {stack_json}"
            )
    entries = {
        address: {"id": ids[address], "config_sha256": _digest(_canonical(resources[address]))} for address in sorted(ids)
    }
    return _canonical({"version": MANIFEST_VERSION, "stack": stack, "imports": entries})


def refuse_inside_repo(out: Path, repo: Path | None = None) -> None:
    """The manifest is reviewed, not committed: only the applied record enters the repo."""
    from clusters import repo as repo_mod

    repo = repo if repo is not None else repo_mod.root_or_none()
    if repo is not None and Path(out).resolve().is_relative_to(Path(repo).resolve()):
        raise UserError(f"{out} is inside the repository {repo}; write the manifest elsewhere (e.g. --out /tmp/{Path(out).stem}.import.json)")


def generate(stack: str, ids_file: Path, stack_json: Path, out: Path, *, repo: Path | None = None) -> tuple[dict[str, str], str]:
    """Write the manifest to ``out`` (never inside the repo); returns (address -> id, SHA-256 of the manifest)."""
    refuse_inside_repo(out, repo)
    ids = read_ids(ids_file)
    data = derive_manifest(stack, ids, stack_json)
    outputs.write_file(out, data, option="--out", owned=outputs.json_with_keys("version", "stack", "imports"))
    return ids, _digest(data)


def verify(stack: str, manifest: Path, digest: str, stack_json: Path) -> dict[str, str]:
    """Refuse an edited or stale manifest; return its address -> id mapping."""
    if not Path(manifest).is_file():
        raise UserError(f"{manifest}: manifest not found; run `gpufleet import generate {stack} --ids FILE` first")
    data = Path(manifest).read_bytes()
    if _digest(data) != digest.strip().lower():
        raise UserError(f"{manifest}: SHA-256 does not match --digest; the manifest was edited after review; generate and review it again")
    try:
        content = json.loads(data)
        ids = {address: entry["id"] for address, entry in content["imports"].items()}
        named = content["stack"]
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise UserError(f"{manifest}: not a gpufleet import manifest; generate it with `gpufleet import generate`") from None
    if named != stack:
        raise UserError(f"{manifest}: manifest is for stack {named!r}, not {stack!r}; pass the matching stack")
    if derive_manifest(stack, ids, stack_json) != data:
        raise UserError(f"{manifest}: stale: stack {stack!r} changed since the manifest was generated; generate and review it again")
    return ids


def record(stack: str, ids: dict[str, str], *, imported_dir: Path | None = None) -> Path:
    """Merge into ``<imported_dir>/<stack>.json``; an address already recorded with another id is refused."""
    imported_dir = Path(imported_dir or imported.imported_dir())
    current = load_imports(stack, imported_dir=imported_dir)
    for address, provider_id in sorted(ids.items()):
        if current.get(address, provider_id) != provider_id:
            raise UserError(f"{address} is already recorded with another id in {imported_dir / f'{stack}.json'}; remove that entry in a reviewed change first")
    target = imported_dir / f"{stack}.json"
    outputs.write_file(target, _canonical(dict(sorted((current | ids).items()))), option="import apply",
                       owned=lambda p: isinstance(load_imports(stack, imported_dir=imported_dir), dict), source_ok=True)
    return target


@dataclass(frozen=True)
class Generated:
    """What ``gpufleet import generate`` reports: where the manifest went, its imports and its SHA-256."""

    manifest: Path
    imports: dict[str, str]
    digest: str

    def counts_by_type(self) -> list[tuple[str, int]]:
        """Resources per Terraform type, sorted: what a reviewer checks against the ids they meant."""
        return sorted(Counter(address.split(".", 1)[0] for address in self.imports).items())


def default_manifest(stack: str) -> Path:
    """In the temp dir: the manifest is reviewed, never committed."""
    return Path(tempfile.gettempdir()) / f"gpufleet-import-{stack}.json"


def generate_for_stack(stack: str, ids_file: Path, *, out: Path | None, clusters_dir: Path | None) -> Generated:
    """The whole ``import generate`` step: refuse a manifest path inside the repo and a bad ids file
    before the synthesis they would waste, synthesize the stack in a temp dir, write the manifest."""
    target = out or default_manifest(stack)
    refuse_inside_repo(target)
    read_ids(ids_file)
    with tempfile.TemporaryDirectory(prefix="gpufleet-import-") as work:
        stack_json = synthesized_stack(stack, clusters_dir, Path(work))
        recorded, digest = generate(stack, ids_file, stack_json, target)
    return Generated(target, recorded, digest)


def apply_for_stack(stack: str, manifest: Path, digest: str, *, clusters_dir: Path | None) -> tuple[Path, dict[str, str]]:
    """The whole ``import apply`` step: a missing manifest is refused before the synthesis; the
    manifest is verified against the stack synthesized now, then recorded. Returns (record file, imports)."""
    if not manifest.is_file():
        raise UserError(f"{manifest}: manifest not found; run `gpufleet import generate {stack} --ids FILE` first")
    with tempfile.TemporaryDirectory(prefix="gpufleet-import-") as work:
        stack_json = synthesized_stack(stack, clusters_dir, Path(work))
        ids = verify(stack, manifest, digest, stack_json)
    return record(stack, ids), ids
