"""Regenerate kueue-v1beta2-v0.19.2.json: the v1beta2 openAPIV3Schema of the Kueue kinds gpufleet declares.

Usage: git clone https://github.com/kubernetes-sigs/kueue && python tests/schemas/regen_kueue.py <kueue checkout> [tag]
Reads config/components/crd/bases/kueue.x-k8s.io_<plural>.yaml at the tag with `git show`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ruamel.yaml import YAML

KINDS = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues",
         "AdmissionCheck": "admissionchecks", "ProvisioningRequestConfig": "provisioningrequestconfigs", "Topology": "topologies"}
VERSION = "v1beta2"


def main(repo: str, tag: str = "v0.19.2") -> None:
    commit = subprocess.run(["git", "-C", repo, "rev-list", "-n1", tag], capture_output=True, text=True, check=True).stdout.strip()
    out: dict[str, object] = {"_meta": {
        "source": "kubernetes-sigs/kueue", "tag": tag, "commit": commit, "version": VERSION,
        "files": [f"config/components/crd/bases/kueue.x-k8s.io_{p}.yaml" for p in KINDS.values()],
        "regenerate": "python tests/schemas/regen_kueue.py <kueue checkout> <tag>",
    }}
    for kind, plural in KINDS.items():
        text = subprocess.run(["git", "-C", repo, "show", f"{tag}:config/components/crd/bases/kueue.x-k8s.io_{plural}.yaml"],
                              capture_output=True, text=True, check=True).stdout
        crd = YAML(typ="safe").load(text)
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == VERSION]
        out[kind] = {"scope": crd["spec"]["scope"], "served": version["served"], "storage": version["storage"],
                     "schema": version["schema"]["openAPIV3Schema"]}
    target = Path(__file__).with_name(f"kueue-{VERSION}-{tag}.json")
    target.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
