"""checkov findings read as gpufleet errors: the cluster file, line and field to change, and the fix (issue 27).

Each case plants one mistake a newcomer makes in a copy of a fixture cluster file and runs the
real ``gpufleet check`` (checkov included) in a subprocess. Before, the same mistakes showed only
checkov's rule title and a Terraform address, one line per rule (``roles/owner`` gave two).
"""

from __future__ import annotations

import pytest

from review.checkov_fixes import FIXES
from tests.review.conftest import edit

OWNER = ("prod-gke", "      roles: [roles/storage.objectViewer]\n", "      roles: [roles/owner]\n")
CASES = {
    "control-plane-open-to-the-internet": (
        [("prod-gke", "      cidr: 198.51.100.0/24\n", "      cidr: 0.0.0.0/0\n")],
        "clusters/prod-gke.yaml:18: gcp.master_authorized_networks[0].cidr: 0.0.0.0/0 lets the whole internet reach the control plane's"
        " public endpoint; allowed: your VPN or CI ranges (e.g. 198.51.100.0/24); remove the 0.0.0.0/0 entry, or reach the cluster over"
        " gke.dns_endpoint: true with gke.private_endpoint: true (checkov CKV_GCP_18 on google_container_cluster.gke)"),
    "tenant-service-account-owner": (
        [OWNER],
        "clusters/prod-gke.yaml:64: tenants[0].service_account.roles[0]: roles/owner is a basic role (owner, editor or viewer: nearly every"
        " permission in the project); allowed: predefined roles such as roles/storage.objectViewer; grant the narrowest predefined role"
        " that does the job (checkov CKV_GCP_117, CKV_GCP_49 on google_project_iam_member.tenant_role_research_owner)"),
    "node-service-account-user": (
        [("prod-gke", "  node_roles: [roles/storage.objectViewer]\n", "  node_roles: [roles/iam.serviceAccountUser]\n")],
        "clusters/prod-gke.yaml:54: iam.node_roles[0]: roles/iam.serviceAccountUser lets its member act as every service account in the"
        " project; allowed: roles that do not impersonate (node and tenant pods reach their own account without it); remove it"
        " (checkov CKV_GCP_41, CKV_GCP_49 on google_project_iam_member.node_role_iam_serviceAccountUser)"),
    "grant-service-account-admin": (
        [("prod-gke", "    - role: roles/container.developer\n", "    - role: roles/iam.serviceAccountAdmin\n")],
        "clusters/prod-gke.yaml:56: iam.grants[0].role: roles/iam.serviceAccountAdmin can impersonate or manage the project's service"
        " accounts; allowed: roles without iam.serviceAccounts.* permissions; remove it or pick a narrower predefined role (checkov"
        " CKV_GCP_49 on google_project_iam_member.grant_iam_serviceAccountAdmin_group_ml_platform_example_com)"),
    "rbac-without-google-groups": (
        [("dev-gke", "  rbac_security_group: gke-security-groups@example.com\n", ""),
         ("dev-gke", "    groups: [group:ml-everyone@example.com]\n", "    groups: [user:alice@example.com]\n")],
        "clusters/dev-gke.yaml:16: gke.rbac_security_group: RBAC names single users, not Google Groups; set gke.rbac_security_group:"
        " gke-security-groups@<your domain> and list tenants' groups (group:team@<your domain>) nested in it (checkov CKV_GCP_65 on"
        " google_container_cluster.gke)"),
}


def test_every_rule_in_the_table_is_planted_by_a_case():
    """The table holds only rules seen firing on gpufleet's output: each id is proven by a case below."""
    planted = {rule for _, expected in CASES.values() for rule in expected.rsplit("(checkov ", 1)[1].split(" on ")[0].split(", ")}
    assert planted == set(FIXES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_checkov_finding_names_the_cluster_file_field_and_the_fix(case, checkout, gpufleet_check):
    edits, expected = CASES[case]
    for cluster, old, new in edits:
        edit(checkout / "clusters" / f"{cluster}.yaml", old, new)
    done = gpufleet_check(checkout)  # checkov runs: no --skip-checkov
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    findings = [line for line in done.stdout.splitlines() if line.startswith("checkov: ")]
    assert findings == [f"checkov: {expected}"], findings
