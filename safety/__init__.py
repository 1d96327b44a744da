"""Safety library: the plan gate, secret and checkov scans (with their reviewed skips), reviewed
imports, and what a removed cluster file or pool destroys.

Used by ``preview``, ``review`` and the CLI's thin commands. Nothing here imports cdktf at module
level: ``gpufleet plan`` and ``gpufleet gate`` must start fast in CI, where the only heavy work is
terraform itself.
"""
