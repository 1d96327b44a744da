"""Kubernetes (GKE + Kueue) side of the scheduler seam: spec -> Job/Secret manifests (``render``),
apply/list/delete through the official kubernetes client (``client``), Job/Workload state -> run
phase (``status``), the vendored OpenAPI/CRD schemas the manifests are validated against
(``schemas``, data in ``openapi/``) and the GPUDirect pod additions (``gpudirect``).

The same module names live in ``jobs.nomad``; ``jobs.runner`` is the one place that picks a side.
"""
