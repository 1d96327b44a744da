"""Safety and operations: the plan gate, secret and checkov scans, reviewed imports, CI comments.

Nothing here imports cdktf at module level: ``gpufleet plan`` and ``gpufleet gate`` must start
fast in CI, where the only heavy work is terraform itself.
"""
