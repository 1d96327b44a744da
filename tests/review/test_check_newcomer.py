"""Mistakes a newcomer makes in their first week, answered by ``gpufleet check`` once each (issue 27).

Each test plants one mistake in a copy of the fixture fleet's checkout and runs the CLI in a
subprocess; the answer is one line with the path relative to the repository root, the line, the
field, what is allowed and the fix, exit 2 and no traceback.
"""

from __future__ import annotations

from tests.review.conftest import edit, error_lines


def test_fails_once_when_a_cidr_has_host_bits_set(checkout, gpufleet_check):
    """Before: three errors, two of them claiming the Vault operator policies were stale (they render
    from the cluster files, so a cluster file that does not load made them "differ")."""
    edit(checkout / "clusters" / "prod-gke.yaml", "subnet_cidr: 10.10.0.0/20", "subnet_cidr: 10.10.0.1/20")
    done = gpufleet_check(checkout, "--skip-checkov")
    assert error_lines(done) == ["error: clusters/prod-gke.yaml:12: gcp.subnet_cidr: '10.10.0.1/20' is not a valid IPv4 CIDR"
                                 " (10.10.0.1/20 has host bits set); write it like '10.10.0.0/20' with host bits zero"]
    assert "skipped: job files; Vault operator policies vs clusters/: fix the errors above first" in done.stderr.splitlines()
