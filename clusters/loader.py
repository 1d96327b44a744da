"""Load cluster files into frozen, validated ClusterConfig objects (or one ConfigError)."""

from __future__ import annotations

from pathlib import Path

from clusters.checks import cross_check
from clusters.errors import ConfigError, Problem
from clusters.schema import ClusterConfig
from clusters.source import read_yaml, validate_document

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


def cluster_files(directory: Path = CLUSTERS_DIR) -> tuple[Path, ...]:
    return tuple(sorted(Path(directory).glob("*.yaml")))


def load_all(directory: Path = CLUSTERS_DIR) -> tuple[ClusterConfig, ...]:
    """Every cluster file in name order; problems of all files are collected into one error."""
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
