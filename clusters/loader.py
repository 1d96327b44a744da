"""Load cluster files into frozen, validated ClusterConfig objects (or one ConfigError)."""

from __future__ import annotations

from pathlib import Path

from clusters import repo
from clusters.checks import cross_check
from clusters.errors import ConfigError, Problem
from clusters.schema import ClusterConfig
from clusters.collisions import cross_cluster
from clusters.source import YamlDocument, read_yaml, remembering_clean, validate_document

# The package's own directory: the example cluster files of this checkout (tests read them).
# Commands never default to it; they read ``clusters.repo.clusters_dir()`` of the repository they run in.
CLUSTERS_DIR = Path(__file__).resolve().parent


def _load(path: Path) -> tuple[YamlDocument, ClusterConfig]:
    path = Path(path)
    doc = read_yaml(path)
    config = validate_document(doc, ClusterConfig)
    findings = cross_check(config, file_stem=path.stem)
    if findings:
        raise ConfigError([doc.problem(field, message) for field, message in findings])
    return doc, config


def load(path: Path) -> ClusterConfig:
    """Parse, validate and cross-check one cluster file; every problem is reported at once."""
    return _load(path)[1]


# ``.yml`` is loaded like ``.yaml``: a cluster file must never be silently ignored for its extension.
SUFFIXES = ("*.yaml", "*.yml")


def cluster_files(directory: Path | None = None) -> tuple[Path, ...]:
    directory = Path(directory or repo.clusters_dir())
    return tuple(sorted(p for pattern in SUFFIXES for p in directory.glob(pattern)))


def load_all(directory: Path | None = None) -> tuple[ClusterConfig, ...]:
    """Every cluster file in name order (default: the current repository's clusters/); problems of all files are collected into one error."""
    directory = Path(directory or repo.clusters_dir())
    if not directory.is_dir():
        what = "is a file, not a directory" if directory.exists() else "directory not found"
        raise ConfigError([Problem(str(directory), None, "", f"{what}; pass the directory holding the cluster files (*.yaml)")])
    files = cluster_files(directory)
    if not files:
        raise ConfigError([Problem(str(directory), None, "", "no cluster files (*.yaml, *.yml) found; add clusters/<name>.yaml")])
    loaded: list[tuple[YamlDocument, ClusterConfig]] = []
    problems: list[Problem] = []
    with remembering_clean():  # the fleet's repeated strings are scanned for secrets once in this load
        for path in files:
            try:
                loaded.append(_load(path))
            except ConfigError as exc:
                problems.extend(exc.problems)
    for index, field, message in cross_cluster([(str(doc.path), config) for doc, config in loaded]):
        problems.append(loaded[index][0].problem(field, message))
    if problems:
        raise ConfigError(problems)
    return tuple(config for _, config in loaded)
