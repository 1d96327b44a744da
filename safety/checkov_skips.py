"""The reviewed list of checkov checks gpufleet skips, each with a reason (cdk-nag's rule).

checkov's own config file cannot carry reasons and ignores inline skips for terraform_json,
so the list lives in ``.checkov-skips.yaml`` and is passed as ``--skip-check``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusters.errors import ConfigError
from clusters.source import read_yaml

SKIPS_FILE = Path(".checkov-skips.yaml")
MIN_REASON = 10


@dataclass(frozen=True)
class Skip:
    check_id: str
    reason: str


def load_skips(path: Path | None = None) -> tuple[Skip, ...]:
    """The skip list of ``path`` (default: the current repository's ``.checkov-skips.yaml``)."""
    from clusters import repo

    doc = read_yaml(path or repo.root() / SKIPS_FILE)
    entries = doc.data.get("skips")
    if not isinstance(entries, list):
        raise ConfigError([doc.problem(("skips",), "expected a list of {id, reason}; see the comment at the top of the file")])
    problems, skips, seen = [], [], set()
    for i, entry in enumerate(entries):
        check_id = str(entry.get("id", "")) if isinstance(entry, dict) else ""
        reason = str(entry.get("reason", "")).strip() if isinstance(entry, dict) else ""
        if not check_id.startswith("CKV"):
            problems.append(doc.problem(("skips", i, "id"), f"{check_id!r} is not a checkov check id; write e.g. CKV_GCP_65"))
        elif len(reason) < MIN_REASON:
            problems.append(doc.problem(("skips", i, "reason"), f"skip {check_id} needs a reason of {MIN_REASON}+ characters; say why it does not apply"))
        elif check_id in seen:
            problems.append(doc.problem(("skips", i, "id"), f"{check_id} is listed twice; keep one entry"))
        else:
            seen.add(check_id)
            skips.append(Skip(check_id, reason))
    if problems:
        raise ConfigError(problems)
    return tuple(skips)
