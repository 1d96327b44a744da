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


def test_fails_when_a_new_role_has_no_clusters_and_says_which_exist(checkout, gpufleet_check):
    """Before: "required field is missing; add it", at line 1, with no word on what to write."""
    edit(checkout / "vault_policies" / "roles.yaml", "roles:\n",
         "roles:\n  newbie:\n    policies: [ml-keys-eval]\n    token_ttl: 5m\n    token_max_ttl: 4h\n    secret_id_ttl: 30m\n")
    done = gpufleet_check(checkout, "--skip-checkov")
    assert error_lines(done) == ["error: vault_policies/roles.yaml:11: roles.newbie.clusters: required field is missing; name the clusters"
                                 " whose GPU nodes run this role's tasks (their subnets become the role's CIDR bindings); allowed: dev-gke,"
                                 " prod-gke, prod-nomad, train-a3mega; add e.g. clusters: [dev-gke]"]


def test_fails_when_an_upgrade_exclusion_outlasts_what_gke_accepts(checkout, gpufleet_check):
    """Before: a 5-year dated exclusion was accepted here and refused by GKE at apply."""
    edit(checkout / "clusters" / "prod-gke.yaml", "    scope: NO_MINOR_OR_NODE_UPGRADES\n",
         '    scope: NO_MINOR_OR_NODE_UPGRADES\n    start_time: "2026-01-01T00:00:00Z"\n    end_time: "2031-01-01T00:00:00Z"\n')
    done = gpufleet_check(checkout, "--skip-checkov")
    assert error_lines(done) == [
        "error: clusters/prod-gke.yaml:34: gke.upgrade_exclusion.end_time: 2031-01-01T00:00:00Z is 1826 days after start_time"
        " 2026-01-01T00:00:00Z; GKE refuses a NO_MINOR_OR_NODE_UPGRADES exclusion that outlasts the end of support of the cluster's"
        " minor version, at most 14 months after its release on the REGULAR channel (allowed: up to 426 days); set end_time at most"
        " 426 days after start_time, or remove both dates and gpufleet renews the exclusion every calendar quarter"]


def test_accepts_an_upgrade_exclusion_within_the_limit(checkout, gpufleet_check):
    edit(checkout / "clusters" / "prod-gke.yaml", "    scope: NO_MINOR_OR_NODE_UPGRADES\n",
         '    scope: NO_MINOR_OR_NODE_UPGRADES\n    start_time: "2026-01-01T00:00:00Z"\n    end_time: "2027-03-01T00:00:00Z"\n')
    done = gpufleet_check(checkout, "--skip-checkov")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_fails_when_gpudirect_is_asked_of_an_l4_pool(checkout, gpufleet_check):
    """Before: ``gpudirect: true`` on g2 (L4) was accepted and silently ignored."""
    edit(checkout / "clusters" / "dev-gke.yaml", "    machine_type: g2-standard-24\n", "    machine_type: g2-standard-24\n    gpudirect: true\n")
    done = gpufleet_check(checkout, "--skip-checkov")
    assert error_lines(done) == [
        "error: clusters/dev-gke.yaml:40: gpu_pools[1].gpudirect: true on g2-standard-24, which has no GPUDirect NICs (it would be"
        " silently ignored); allowed on: a3-highgpu-8g (TCPX), a3-megagpu-8g (TCPXO), a3-ultragpu-8g (RDMA), a4-highgpu-8g (RDMA);"
        " remove gpudirect (it is on by default where the machine has it) or pick one of those machine types"]
