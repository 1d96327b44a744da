"""Recorded imports (``stacks/imported/<stack>.json``, written by ``gpufleet import apply``).

Synthesis reads them to emit Terraform ``import`` blocks for exactly those addresses; the
review workflow that writes them lives in ``safety.imports``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clusters.errors import UserError
from clusters.source import did_you_mean

# None: the current repository's ``stacks/imported`` (tests point it at a temp dir).
IMPORTED_DIR: Path | None = None


def imported_dir() -> Path:
    from clusters import repo

    return Path(IMPORTED_DIR) if IMPORTED_DIR is not None else repo.root() / "stacks" / "imported"


def load_imports(stack: str, *, imported_dir: Path | None = None) -> dict[str, str]:
    """Recorded imports of one stack (address -> provider id); empty when none were recorded."""
    path = Path(imported_dir or globals()["imported_dir"]()) / f"{stack}.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise UserError(f"{path}: must be a JSON object of address -> provider id; fix or restore it from git")
    return data


def apply_imports(stack: Any, imports: dict[str, str]) -> None:
    """Call ``import_from`` and set ``prevent_destroy`` on each recorded resource of a cdktf stack.

    Called by ``stacks.build_fleet`` after the stack is built. An address that no resource has
    any more is an error: silently dropping an import would let the next plan create a duplicate.
    A stack without recorded imports (nearly all of them) is not walked: the walk reads two
    attributes of every resource from the jsii kernel, about 40% of a cluster's kernel round trips.
    """
    if not imports:
        return
    from cdktf import TerraformResource

    by_address = {
        f"{node.terraform_resource_type}.{node.friendly_unique_id}": node
        for node in stack.node.find_all()
        if isinstance(node, TerraformResource)
    }
    for address, provider_id in sorted(imports.items()):
        resource = by_address.get(address)
        if resource is None:
            raise UserError(
                f"recorded import {address} matches no resource of stack {stack.node.id!r}{did_you_mean(address, by_address)}; "
                f"fix stacks/imported/{stack.node.id}.json in a reviewed change"
            )
        resource.import_from(provider_id)
        resource.add_override("lifecycle.prevent_destroy", True)
