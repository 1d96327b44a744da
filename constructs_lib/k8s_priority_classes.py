"""Training priority classes: high-priority runs may preempt low-priority ones, never the reverse."""

from __future__ import annotations

from constructs import Construct

from constructs_lib.naming import pin
from constructs_lib.providers import kubernetes

# Well below system-cluster-critical (2e9): training never preempts cluster components.
PRIORITY_CLASSES: tuple[tuple[str, int, str, str], ...] = (
    ("training-low", 100, "Never", "preemptible sweeps and experiments; never preempts other pods"),
    ("training-high", 1000, "PreemptLowerPriority", "reserved production runs; may preempt training-low pods"),
)


class PriorityClasses(Construct):
    def __init__(self, scope: Construct, id_: str) -> None:
        super().__init__(scope, id_)
        self.classes = {
            name: pin(kubernetes.priority_class_v1.PriorityClassV1(
                self, name, metadata={"name": name}, value=value, preemption_policy=policy, global_default=False,
                description=description), f"priority_{name.replace('-', '_')}")
            for name, value, policy, description in PRIORITY_CLASSES
        }
