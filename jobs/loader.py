"""Load job files into frozen FinetuneSpecs (or one ConfigError listing every problem)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import clusters
from clusters import repo
from clusters.errors import ConfigError, Problem, UserError
from clusters.schema import ClusterConfig
from clusters.source import YamlDocument, did_you_mean, parse_yaml, read_yaml, validate_document
from jobs.checks import cross_check
from jobs.schema import JobFile
from jobs.spec import FinetuneSpec, derive_spec
from jobs.vault_refs import VaultView, load_vault_view

# The package's own directory (this checkout's example jobs, for tests); commands read ``clusters.repo.jobs_dir()``.
JOBS_DIR = Path(__file__).resolve().parent


def job_files(directory: Path | None = None) -> tuple[Path, ...]:
    """``.yml`` is loaded like ``.yaml``: a job file is never silently ignored for its extension."""
    directory = Path(directory or repo.jobs_dir())
    return tuple(sorted(p for pattern in ("*.yaml", "*.yml") for p in directory.glob(pattern)))


def load(path: Path, *, cluster_configs: tuple[ClusterConfig, ...] | None = None, vault: VaultView | None = None) -> FinetuneSpec:
    """Parse, validate and cross-check one job file against clusters/ and vault_policies/."""
    return load_admitted(path, cluster_configs=cluster_configs, vault=vault)[0]


def load_admitted(path: Path, *, cluster_configs: tuple[ClusterConfig, ...] | None = None,
                  vault: VaultView | None = None) -> tuple[FinetuneSpec, dict[str, Any]]:
    """``load``, plus the checked document as JSON data: what the control plane freezes at admission
    (both come from one read of the file, so the spec checked is the document kept)."""
    path = Path(path)
    doc = read_yaml(path)
    spec = _checked(doc, cluster_configs, vault)
    return spec, json.loads(json.dumps(doc.data, sort_keys=True, default=str))


def load_text(text: str, source: Path, *, cluster_configs: tuple[ClusterConfig, ...] | None = None,
              vault: VaultView | None = None) -> tuple[FinetuneSpec, dict[str, Any]]:
    """``load_admitted`` of a job file sent as text (``gpufleet exp submit -f``): the same parser, schema,
    secret detector and cross-checks. ``source`` names it in errors; there is no file name for ``name``
    to equal, so that one check is the only one not made."""
    doc = parse_yaml(Path(source), text)
    spec = _checked(doc, cluster_configs, vault, name_is_file=False)
    return spec, json.loads(json.dumps(doc.data, sort_keys=True, default=str))


def load_frozen(data: dict[str, Any], source: Path, *, cluster_configs: tuple[ClusterConfig, ...] | None = None,
                vault: VaultView | None = None) -> FinetuneSpec:
    """The spec of a document frozen by ``load_admitted``, through the same checks (the cluster and
    Vault files it is checked against are today's). ``source`` names the file it came from; it is
    not read, so an edited or deleted file changes nothing."""
    return _checked(YamlDocument(Path(source), data), cluster_configs, vault)


def document_sha256(data: dict[str, Any]) -> str:
    """The digest kept beside a frozen document: canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _checked(doc: YamlDocument, cluster_configs: tuple[ClusterConfig, ...] | None, vault: VaultView | None, *,
             name_is_file: bool = True) -> FinetuneSpec:
    path = doc.path
    job = validate_document(doc, JobFile)
    configs = cluster_configs if cluster_configs is not None else clusters.load_all()
    by_name = {c.name: c for c in configs}
    findings = cross_check(job, by_name, vault if vault is not None else load_vault_view(), file_stem=path.stem if name_is_file else None)
    if findings:
        raise ConfigError([doc.problem(field, message) for field, message in findings])
    return derive_spec(job, by_name[job.cluster], source=path)


def load_all(directory: Path | None = None, *, cluster_configs: tuple[ClusterConfig, ...] | None = None, vault: VaultView | None = None) -> tuple[FinetuneSpec, ...]:
    """Every job file in name order; problems of all files are collected into one error."""
    configs = cluster_configs if cluster_configs is not None else clusters.load_all()
    view = vault if vault is not None else load_vault_view()
    specs: list[FinetuneSpec] = []
    problems: list[Problem] = []
    for path in job_files(directory):
        try:
            specs.append(load(path, cluster_configs=configs, vault=view))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return tuple(specs)


def find(name: str, directory: Path | None = None) -> Path:
    """The file of job ``name`` (or a path given directly); a typo gets a did-you-mean."""
    directory = Path(directory or repo.jobs_dir())
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return candidate
    for suffix in (".yaml", ".yml"):
        path = Path(directory) / f"{name}{suffix}"
        if path.is_file():
            return path
    names = [p.stem for p in job_files(directory)]
    raise UserError(f"no job {name!r}{did_you_mean(name, names)}; allowed: {', '.join(names) or '(none)'}; add jobs/{name}.yaml or pick one")
