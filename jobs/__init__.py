"""Jobs layer: typed fine-tune job files -> checked FinetuneSpecs -> a scheduler's job.

The scheduler-neutral part sits here: ``spec``/``schema``/``loader`` (the job file), ``checks``
(cross-checks against ``clusters/`` and ``vault_policies/``), ``meta``, ``quota``, ``nccl`` (the
GPUDirect NCCL environment), ``durations``, ``logs``, ``vault_refs``/``vault_mint`` (AppRole wraps).
Each scheduler has its own subpackage with the same module names:
``jobs.nomad.{render,client,status,dispatch}`` (+ ``placement``) and
``jobs.k8s.{render,client,status,dispatch}`` (+ ``schemas``, ``gpudirect``). The two sides never
import each other, and the neutral modules import neither, except the three that pick a side by
design: ``runner`` (the seam the control plane uses), ``outputs`` (writes the rendered file of the
job's scheduler) and ``local`` (runs a job here as a Nomad client would). ``tests/test_layers.py``
holds that rule.
Nothing in this package imports cdktf; python-nomad, kubernetes and hvac are imported where used.
"""

from jobs.loader import JOBS_DIR, find, job_files, load, load_all
from jobs.spec import FinetuneSpec

__all__ = ["JOBS_DIR", "FinetuneSpec", "find", "job_files", "load", "load_all"]
