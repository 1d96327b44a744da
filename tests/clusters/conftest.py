"""Helpers to write a mutated cluster file and load it, for bad-input tests."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from ruamel.yaml import YAML

import clusters
from clusters.errors import ConfigError
from tests.conftest import FLEET_CLUSTERS


def _read(name: str) -> dict:
    return YAML(typ="safe").load((FLEET_CLUSTERS / f"{name}.yaml").read_text())


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
        yaml.representer.ignore_aliases = lambda _data: True  # a mutation may share an object; loaders refuse anchors
        with path.open("w") as fh:
            yaml.dump(data, fh)
        return path

    return write


def assert_rejected(path: Path, field: str, fix: str) -> None:
    """Loading ``path`` fails with a one-line problem at ``file:line`` that names ``field`` and says ``fix``."""
    with pytest.raises(ConfigError) as err:
        clusters.load(path)
    lines = [str(p) for p in err.value.problems]
    matching = [line for line in lines if f": {field}:" in line]
    assert matching, f"no problem names {field!r}: {lines}"
    assert any(fix in line for line in matching), f"no fix {fix!r} in {matching}"
    assert all(re.match(rf"^{re.escape(str(path))}:\d+: ", line) for line in matching), matching
    assert all("\n" not in line for line in lines)
