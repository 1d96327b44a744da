"""Nomad side of the scheduler seam: spec -> Nomad API job JSON (``render``), plan/register/dispatch
through python-nomad (``client``), allocation state -> run phase (``status``), the operator's
dispatch flow and namespace lookup (``dispatch``) and FailedTGAllocs in the job file's words
(``placement``, Nomad's alone).

The same module names live in ``jobs.k8s``, which this side never imports. The neutral modules
that pick a side are ``jobs.runner`` (the control plane's seam), ``jobs.outputs`` (``gpufleet jobs
render``) and ``jobs.local`` (run-local reproduces a Nomad client); the CLI's
``gpufleet.jobs_cmd`` routes to ``gpufleet.jobs_nomad_cmd``.
"""
