"""GPUDirect privileges, each backed by an upstream line (issue 26): what the training container and the
RxDM sidecar get per transport, read from the vendored NCCL tests (clusters/gpudirect_manifests, Google's
container-engine-accelerators at the commit in regenerate.py) and rendered exactly so.

Each table row names the upstream file and the line range (upstream's numbering; the vendored copy adds
a two-line provenance header) and the text those lines hold, and the test reads those lines from the
vendored file: a regeneration that moves or changes them fails here, so the citation cannot go stale.
Whether uid 1000 can pin memory and reach the RxDM sockets on real nodes is not testable here: the
NCCL test jobs (jobs/nccl-test-*.yaml) are that proof, run by a person with the hardware.
"""

from __future__ import annotations

import pytest

from clusters.families import GpuDirect
from clusters.gpudirect_manifests.regenerate import FILES
from clusters.gpudirect_upstream import MANIFESTS_DIR, WORKLOAD_CONTAINER, workload_capabilities
from jobs.k8s.gpudirect import pod_networking
from jobs.k8s.render import manifests
from jobs.loader import find, load
from jobs.spec import TASK

HEADER_LINES = 2
# transport -> (who, privilege, vendored stem, upstream first line, last line, text the lines contain)
PRIVILEGES = [
    ("tcpx", "training container", "adds IPC_LOCK", "nccl-test-tcpx", 103, 106, "- IPC_LOCK"),
    ("tcpxo", "training container", "adds nothing (securityContext commented out)", "nccl-test-tcpxo", 110, 111, "#      securityContext:"),
    ("rdma", "training container", "adds nothing (no securityContext)", "nccl-test-rdma", 65, 89, "name: test"),
    ("tcpx", "RxDM sidecar", "adds NET_ADMIN", "nccl-test-tcpx", 75, 78, "- NET_ADMIN"),
    ("tcpxo", "RxDM sidecar", "adds NET_ADMIN, NET_BIND_SERVICE, not privileged", "nccl-test-tcpxo", 91, 96, "#        privileged: true"),
    ("tcpx", "RxDM sidecar", "mounts /sys and /proc/sys", "nccl-test-tcpx", 84, 87, "mountPath: /hostprocsysfs"),
    ("tcpxo", "RxDM sidecar", "mounts /sys and /proc/sys", "nccl-test-tcpxo", 100, 103, "mountPath: /hostprocsysfs"),
]
TRAINING_ADDS = {"tcpx": ("IPC_LOCK",), "tcpxo": (), "rdma": ()}
SIDECAR_ADDS = {"tcpx": ["NET_ADMIN"], "tcpxo": ["NET_ADMIN", "NET_BIND_SERVICE"]}


@pytest.mark.parametrize(("transport", "who", "privilege", "stem", "start", "end", "text"), PRIVILEGES)
def test_each_privilege_is_on_the_upstream_line_cited(transport, who, privilege, stem, start, end, text):
    lines = (MANIFESTS_DIR / f"{stem}.yaml").read_text().splitlines()[HEADER_LINES:]
    assert FILES[stem].startswith(f"gpudirect-{transport}/")
    assert any(text in line for line in lines[start - 1:end]), f"{FILES[stem]}:{start}-{end} no longer holds {text!r} ({who} {privilege})"


def test_training_container_capabilities_are_read_from_upstream_not_typed():
    assert workload_capabilities() == TRAINING_ADDS


@pytest.mark.parametrize("transport", sorted(TRAINING_ADDS))
def test_rendered_wiring_adds_exactly_upstreams_capabilities(transport):
    mode = "RDMA" if transport == "rdma" else "NetDevice"
    wiring = pod_networking(GpuDirect(transport), (("n", mode),))
    assert wiring.capabilities == TRAINING_ADDS[transport]
    for sidecar in wiring.sidecars:
        context = sidecar["securityContext"]
        assert context["capabilities"] == {"add": SIDECAR_ADDS[transport]}
        assert context["runAsUser"] == 0 and "privileged" not in context


def test_the_tcpx_training_container_gets_ipc_lock_and_stays_uid_1000(cluster_configs, vault_view):
    """prod-gke's h100 pool is A3 High (TCPX). Before issue 26 the container dropped ALL and added nothing."""
    job = next(d for d in manifests(load(find("finetune-llama-gke"), cluster_configs=cluster_configs, vault=vault_view)) if d["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    train = next(c for c in pod["containers"] if c["name"] == TASK)
    assert train["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert train["securityContext"]["runAsNonRoot"] is True and train["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsUser"] == 1000 and "runAsUser" not in train["securityContext"]
    # No group or mode for the socket directory: RxDM creates its sockets under umask(0) (google/tcpgpudmarxd
    # app/tcpgpudmarxd.cu:263), and fsGroup does not apply to a hostPath.
    assert "supplementalGroups" not in pod["securityContext"]


def test_the_policy_names_the_container_the_renderer_writes():
    assert WORKLOAD_CONTAINER == TASK

