"""Jobs layer: typed fine-tune job files -> checked FinetuneSpecs -> a scheduler's job.

The scheduler-neutral part sits here: ``spec``/``schema``/``loader`` (the job file), ``checks``
(cross-checks against ``clusters/`` and ``vault_policies/``), ``meta``, ``quota``, ``placement``,
``vault_refs``/``vault_mint`` (AppRole wraps), ``local`` (runs a job here) and ``runner`` (the seam
the control plane uses). Each scheduler has its own subpackage with the same module names:
``jobs.nomad.{render,client,status}`` and ``jobs.k8s.{render,client,status,schemas}``.
Nothing in this package imports cdktf; python-nomad, kubernetes and hvac are imported where used.
"""

from jobs.loader import JOBS_DIR, find, job_files, load, load_all
from jobs.spec import FinetuneSpec

__all__ = ["JOBS_DIR", "FinetuneSpec", "find", "job_files", "load", "load_all"]
