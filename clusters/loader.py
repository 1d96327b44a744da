"""Load cluster files into frozen, validated ClusterConfig objects (or one ConfigError)."""

from __future__ import annotations

from pathlib import Path

from clusters import repo
from clusters.checks import cross_check
from clusters.errors import ConfigError, Problem
from clusters.schema import ClusterConfig
from clusters.source import read_yaml, validate_document

# The package's own directory: the example cluster files of this checkout (tests read them).
# Commands never default to it; they read ``clusters.repo.clusters_dir()`` of the repository they run in.
CLUSTERS_DIR = Path(__file__).resolve().parent


def load(path: Path) -> ClusterConfig:
    """Parse, validate and cross-check one cluster file; every problem is reported at once."""
    path = Path(path)
    doc = read_yaml(path)
    config = validate_document(doc, ClusterConfig)
    findings = cross_check(config, file_stem=path.stem)
    if findings:
        raise ConfigError([doc.problem(field, message) for field, message in findings])
    return config


def cluster_files(directory: Path | None = None) -> tuple[Path, ...]:
    return tuple(sorted(Path(directory or repo.clusters_dir()).glob("*.yaml")))


def load_all(directory: Path | None = None) -> tuple[ClusterConfig, ...]:
    """Every cluster file in name order (default: the current repository's clusters/); problems of all files are collected into one error."""
    directory = Path(directory or repo.clusters_dir())
    if not directory.is_dir():
        raise ConfigError([Problem(str(directory), None, "", "directory not found; pass the directory holding the cluster files (*.yaml)")])
    files = cluster_files(directory)
    if not files:
        raise ConfigError([Problem(str(directory), None, "", "no cluster files (*.yaml) found; add clusters/<name>.yaml")])
    configs: list[ClusterConfig] = []
    problems: list[Problem] = []
    for path in files:
        try:
            configs.append(load(path))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return tuple(configs)
