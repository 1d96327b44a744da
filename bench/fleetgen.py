"""The benchmarks' generated fleets: N cluster files shaped like prod-gke, with up to 6 GPU pools each."""

from __future__ import annotations

import json
from pathlib import Path

POOL_MACHINES = (
    ("h100", {"machine_type": "a3-highgpu-8g"}),
    ("a100", {"machine_type": "a2-highgpu-4g"}),
    ("a100-80", {"machine_type": "a2-ultragpu-8g"}),
    ("l4", {"machine_type": "g2-standard-24", "spot": True}),
    ("l4-small", {"machine_type": "g2-standard-8", "spot": True}),
    ("t4", {"machine_type": "n1-standard-8", "accelerator": "nvidia-tesla-t4", "gpus_per_node": 1, "spot": True}),
)


def generated_fleet(directory: Path, clusters: range = range(50), pools: int = 6) -> Path:
    """Cluster files shaped like prod-gke (GCS state, static IP, tenants, DNS); JSON is valid YAML."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in clusters:
        name = f"gen-{i:02d}"
        gpu_pools = [{"name": pool, "min_nodes": 0, "max_nodes": 4, "boot_disk_gb": 200, **shape}
                     for pool, shape in POOL_MACHINES[:pools]]
        doc = {
            "name": name, "environment": "prod", "scheduler": "gke",
            "state": {"backend": "gcs", "bucket": "gpufleet-bench-tfstate"},
            "gcp": {"project": f"ml-bench-{i:02d}", "region": "us-central1", "zones": ["us-central1-a", "us-central1-b"],
                    "subnet_cidr": "10.10.0.0/20", "pods_cidr": "10.64.0.0/14", "services_cidr": "10.20.0.0/20",
                    "master_cidr": "172.16.0.0/28",
                    "master_authorized_networks": [{"name": "corp-vpn", "cidr": "198.51.100.0/24"}],
                    "static_ips": [{"name": "ingress", "use": "ingress", "description": "bench ingress"}]},
            "gke": {"release_channel": "REGULAR", "rbac_security_group": "gke-security-groups@example.com"},
            "gpu_pools": gpu_pools,
            "tenants": [{"name": "research", "groups": ["group:ml-research@example.com"],
                         "gpu_quota": {pool["name"]: 4 for pool in gpu_pools}}],
            "dns": {"zone_id": "0123456789abcdef0123456789abcdef", "zone_name": "example.com",
                    "records": [{"name": f"tb.{name}", "static_ip": "ingress"}]},
        }
        (directory / f"{name}.yaml").write_text(json.dumps(doc, indent=1) + "\n")
    return directory
