"""Nomad side of the scheduler seam: spec -> Nomad API job JSON (``render``), plan/register/dispatch
through python-nomad (``client``), allocation state -> run phase (``status``).

The same module names live in ``jobs.k8s``; ``jobs.runner`` is the one place that picks a side.
"""
