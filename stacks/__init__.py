"""Composition of constructs into stacks: one infrastructure stack (and a scheduler stack) per cluster."""

from stacks.fleet import Fleet, StackInfo, build_fleet

__all__ = ["Fleet", "StackInfo", "build_fleet"]
