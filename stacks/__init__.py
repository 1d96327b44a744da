"""Composition of constructs into stacks: one infrastructure stack (and a scheduler stack) per cluster.

``stacks.layout`` is pure (importable without cdktf); ``stacks.fleet.build_fleet`` builds them.
"""
