"""Regenerate the vendored GPUDirect manifests in this folder (run by hand; synthesis and rendering only read the output).

Each ``<name>.yaml`` is the upstream file of GoogleCloudPlatform/container-engine-accelerators at
``COMMIT``, byte for byte, under a provenance header. Image tags stay as upstream pins them (the
NCCL plugin installers by release tag, the NRI injector and pause by digest); the adaptations
gpufleet makes (node affinity and tolerations narrowed to the cluster's GPUDirect pools, the one
unversioned image given a tag) are applied at synthesis in ``constructs_lib/gpudirect_runtime.py``,
so a regeneration diff shows only upstream's changes.

Which DaemonSet a transport needs is cluster-toolkit's choice (``clusters/families.py``
GPUDIRECT_RUNTIME): modules/compute/gke-node-pool/gpu_direct.tf installs the TCPX/TCPXO installer
plus the NRI device injector; examples/gke-a3-ultragpu and gke-a4 install the RDMA (gIB) installer.
The ``nccl-test-*`` files are upstream's two-node NCCL tests: jobs/k8s/gpudirect.py takes the RxDM
sidecar (whose version upstream couples to the installer's), the device annotation, the volumes
and the NCCL library environment from their first Pod; ``nccl-config-tcpx`` is the TCPX test's
ConfigMap, whose ``run-nccl.sh`` passes the NCCL tuning TCPX needs (TCPX has no env profile
script in its plugin, unlike TCPXO and RDMA). All files come from one commit, so the
sidecar and the installer are always a released pair.

    git clone https://github.com/GoogleCloudPlatform/container-engine-accelerators /tmp/cea
    python clusters/gpudirect_manifests/regenerate.py --repo /tmp/cea
"""

from __future__ import annotations

import argparse
import subprocess
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = "GoogleCloudPlatform/container-engine-accelerators"
COMMIT = "992db81257553607f1477945f1b3219632991829"
FILES = {
    "nccl-tcpx-installer": "gpudirect-tcpx/nccl-tcpx-installer.yaml",
    "nccl-tcpxo-installer": "gpudirect-tcpxo/nccl-tcpxo-installer.yaml",
    "nri-device-injector": "nri_device_injector/nri-device-injector.yaml",
    "nccl-rdma-installer": "gpudirect-rdma/nccl-rdma-installer.yaml",
    "nccl-test-tcpx": "gpudirect-tcpx/nccl-test-latest.yaml",
    "nccl-test-tcpxo": "gpudirect-tcpxo/nccl-test-latest.yaml",
    "nccl-test-rdma": "gpudirect-rdma/nccl-test.yaml",
    "nccl-config-tcpx": "gpudirect-tcpx/nccl-config.yaml",
}


def header(path: str, today: str) -> str:
    return (f"# Vendored from {REPO} {path} at commit {COMMIT}\n"
            f"# (upstream text unchanged below this header); extracted {today} by clusters/gpudirect_manifests/regenerate.py\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True, help=f"a git clone of {REPO}")
    parser.add_argument("--commit", default=COMMIT)
    args = parser.parse_args()
    today = datetime.now(UTC).date().isoformat()
    for name, path in FILES.items():
        text = subprocess.run(["git", "-C", str(args.repo), "show", f"{args.commit}:{path}"], check=True, capture_output=True, text=True).stdout
        (HERE / f"{name}.yaml").write_text(header(path, today) + text)


if __name__ == "__main__":
    main()
