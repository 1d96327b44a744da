"""Terraform addresses of the example fleet are pinned: renaming one destroys and recreates it.

If a change adds resources on purpose, regenerate the golden file and review the diff:
``GPUFLEET_UPDATE_GOLDEN=1 .venv/bin/pytest tests/stacks/test_addresses.py``. A removed or
renamed address in that diff is a breaking change for every deployed cluster.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

GOLDEN = Path(__file__).with_name("golden_addresses.json")


def addresses(fleet_out: Path) -> dict[str, list[str]]:
    result = {}
    for stack_dir in sorted((fleet_out / "stacks").iterdir()):
        data = json.loads((stack_dir / "cdk.tf.json").read_text())
        found = [f"{rtype}.{name}" for rtype, items in data.get("resource", {}).items() for name in items]
        found += [f"data.{rtype}.{name}" for rtype, items in data.get("data", {}).items() for name in items]
        found += [f"output.{name}" for name in data.get("output", {})]
        result[stack_dir.name] = sorted(found)
    return result


def test_addresses_match_the_pinned_list(fleet_out):
    current = addresses(fleet_out)
    if os.environ.get("GPUFLEET_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
        pytest.fail(f"regenerated {GOLDEN.name}: review `git diff` for removed addresses, then rerun without GPUFLEET_UPDATE_GOLDEN")
    pinned = json.loads(GOLDEN.read_text())
    for stack in sorted(set(pinned) | set(current)):
        gone = sorted(set(pinned.get(stack, ())) - set(current.get(stack, ())))
        new = sorted(set(current.get(stack, ())) - set(pinned.get(stack, ())))
        assert not gone, f"{stack}: addresses removed or renamed (destroys deployed resources): {gone}"
        assert not new, f"{stack}: new addresses not in {GOLDEN.name}; review and regenerate: {new}"


def test_no_address_carries_a_generated_hash(fleet_out):
    for stack, items in addresses(fleet_out).items():
        hashed = [a for a in items if a.rsplit("_", 1)[-1].isupper() and len(a.rsplit("_", 1)[-1]) == 8]
        assert not hashed, f"{stack}: unpinned logical ids {hashed}; pin them with constructs_lib.naming.pin"
