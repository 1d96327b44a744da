"""Nomad layer: typed fine-tune job files -> checked FinetuneSpecs -> Nomad API job JSON.

``jobs/<job>.yaml`` names a Nomad cluster, tenant (namespace), GPU pool and Vault role that
must exist in ``clusters/`` and ``vault_policies/``; ``jobs.render`` turns the spec into a
parameterized batch job whose task runs behind ``gpufleet-exec``, ``jobs.client`` plans,
registers and dispatches it through python-nomad, and ``jobs.local`` runs it here.
Nothing in this package imports cdktf; python-nomad and hvac are imported where used.
"""

from jobs.loader import JOBS_DIR, find, job_files, load, load_all
from jobs.spec import FinetuneSpec

__all__ = ["JOBS_DIR", "FinetuneSpec", "find", "job_files", "load", "load_all"]
