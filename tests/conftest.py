"""Session-wide fixtures. Component fixtures live in their own plugin modules listed here.

Synthesis costs seconds (jsii start-up plus provider loading), so the example fleet is
synthesized once per session and every test reads the shared output.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
# Production synthesis skips jsii's generated argument checks (constructs_lib/providers.py); the suite
# keeps them, so a construct passing a wrong prop type fails here. Subprocesses inherit it.
os.environ.setdefault("GPUFLEET_JSII_TYPE_CHECKS", "1")
# checkov results are cached per stack (safety/checkov_cache.py); the suite keeps its own, per session,
# so no test reads a result stored by the user's runs or by an earlier session.
_CHECKOV_CACHE = tempfile.mkdtemp(prefix="gpufleet-test-checkov-cache-")
atexit.register(shutil.rmtree, _CHECKOV_CACHE, True)
os.environ.setdefault("GPUFLEET_CHECKOV_CACHE", _CHECKOV_CACHE)
# Synthesized stacks are cached per cluster (stacks/synth_cache.py). The suite synthesizes cold, so a test
# of synthesis always runs the constructs; tests/stacks/test_synth_cache.py turns the cache on in a temp dir.
os.environ.setdefault("GPUFLEET_SYNTH_CACHE", "off")
# Likewise the secret scan's memory of clean files (safety/scan_cache.py): tests/safety/test_scan_cache.py turns it on.
os.environ.setdefault("GPUFLEET_SECRET_SCAN_CACHE", "off")

pytest_plugins = ["tests.openbao_fixture"]

REPO_ROOT = Path(__file__).resolve().parent.parent
# The suite's own copy of the example fleet. Tests pin its addresses, stack lists and messages, so the
# files in clusters/ stay the user's: adding, editing or removing one changes what `gpufleet check`
# judges, never what `make test` asserts (tests/test_fleet_independence.py proves it). A change to the
# examples that tests should see is copied here on purpose, in the same commit.
FLEET_CLUSTERS = REPO_ROOT / "tests" / "fleet" / "clusters"


def copy_checkout(dest: Path) -> Path:
    """The files git tracks (and untracked ones it does not ignore) of this checkout, copied to ``dest``:
    a throwaway repository for tests that run the CLI or the suite the way a user's clone would."""
    import shutil
    import subprocess

    tracked = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                             capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        src = REPO_ROOT / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def load_fleet():
    """The suite's example fleet (``FLEET_CLUSTERS``), loaded as ``clusters.load_all`` loads clusters/."""
    import clusters

    return clusters.load_all(FLEET_CLUSTERS)


@pytest.fixture(scope="session")
def example_configs():
    return load_fleet()


@pytest.fixture(scope="session")
def fleet_out(tmp_path_factory, example_configs) -> Path:
    """``cdktf.out`` of the example fleet, synthesized once for the whole session."""
    from stacks.synth import synthesize

    outdir = tmp_path_factory.mktemp("fleet") / "cdktf.out"
    synthesize(example_configs, outdir)
    return outdir


@pytest.fixture(scope="session")
def stack_json(fleet_out):
    """``stack_json("prod-gke")`` -> the parsed cdk.tf.json of that stack."""
    cache: dict[str, dict] = {}

    def read(stack: str) -> dict:
        if stack not in cache:
            cache[stack] = json.loads((fleet_out / "stacks" / stack / "cdk.tf.json").read_text())
        return cache[stack]

    return read
