"""Production synthesis skips jsii's generated argument checks; the suite keeps them (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import sys
from cdktf import App, TerraformStack
from constructs_lib import providers
network = providers.google.compute_network
private = sys.modules[network.__name__ + "._private"]
print("provider", private.check_type is providers._no_type_check)
print("core", sys.modules["cdktf._private"].check_type is providers._no_type_check)
try:
    network.ComputeNetwork(TerraformStack(App(), "typed"), "vpc", name=123)
    print("wrong type", "accepted")
except TypeError as exc:
    print("wrong type", "rejected by typeguard:", exc)
except RuntimeError as exc:
    print("wrong type", "rejected by the jsii kernel:", str(exc).splitlines()[0])
"""


def _probe(**env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k != "GPUFLEET_JSII_TYPE_CHECKS"}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO_ROOT, env=base | env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def test_production_synthesis_skips_the_generated_type_checks() -> None:
    lines = _probe()
    assert lines[:2] == ["provider True", "core True"]
    # Python no longer checks; the Node kernel still refuses to deserialize the value, so a wrong
    # type fails synthesis either way, with a less precise message.
    assert lines[2].startswith("wrong type rejected by the jsii kernel:") and "ComputeNetworkConfig" in lines[2]


def test_the_switch_keeps_them() -> None:
    lines = _probe(GPUFLEET_JSII_TYPE_CHECKS="1")
    assert lines[:2] == ["provider False", "core False"]
    assert lines[2].startswith("wrong type rejected by typeguard:") and "name must be str; got int" in lines[2]


def test_the_suite_runs_with_type_checks_on() -> None:
    assert os.environ.get("GPUFLEET_JSII_TYPE_CHECKS") == "1"
