"""Helpers to write a mutated cluster file and load it, for bad-input tests."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from clusters import CLUSTERS_DIR


def _read(name: str) -> dict:
    return YAML(typ="safe").load((CLUSTERS_DIR / f"{name}.yaml").read_text())


@pytest.fixture
def write_cluster(tmp_path: Path) -> Callable[..., Path]:
    """``write_cluster("prod-gke", mutate)`` -> path of a copy of that example with ``mutate(data)`` applied."""

    def write(base: str, mutate: Callable[[dict], object] | None = None, *, file_name: str | None = None) -> Path:
        data = copy.deepcopy(_read(base))
        if mutate is not None:
            mutate(data)
        path = tmp_path / f"{file_name or base}.yaml"
        yaml = YAML()
        yaml.default_flow_style = False
        with path.open("w") as fh:
            yaml.dump(data, fh)
        return path

    return write
