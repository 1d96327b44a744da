"""Kubernetes (GKE + Kueue) side of the scheduler seam: spec -> Job/Secret manifests (``render``),
apply/list/delete through the official kubernetes client (``client``), Job/Workload state -> run
phase (``status``), the operator's dispatch with one wrapped secret_id per rank and the run-id
lookup (``dispatch``), the vendored OpenAPI/CRD schemas the manifests are validated against
(``schemas``, data in ``openapi/``) and the GPUDirect pod additions (``gpudirect``).

The same module names live in ``jobs.nomad``, which this side never imports. The neutral modules
that pick a side are ``jobs.runner`` (the control plane's seam) and ``jobs.outputs`` (``gpufleet
jobs render``); the CLI's ``gpufleet.jobs_cmd`` routes to ``gpufleet.jobs_k8s_cmd``.
"""
