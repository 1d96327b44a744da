"""Training priority classes: they order runs, they never evict one.

Both tenant classes have ``preemptionPolicy: Never``: kube-scheduler never evicts another
tenant's admitted pod to place a ``training-high`` one (issue 25: an evicted run's
``DisruptionTarget -> FailJob`` rule killed it, and its spent secret_ids cannot restart it).
The priority value still orders Kueue's queues, and preemption happens only through Kueue,
within a ClusterQueue or its cohort, under the ClusterQueue's own preemption policy.

``preemptionPolicy`` is immutable once created (kubernetes/kubernetes
pkg/apis/scheduling/validation/validation.go:63-64 ``ValidatePriorityClassUpdate``, commit
4c5c6b01d6a9) and ForceNew in the Terraform provider (preview/forcenew/kubernetes.json,
resource_kubernetes_priority_class_v1.go:52): changing it replaces the PriorityClass. Not a
protected type: ``gpufleet preview`` reports the replacement without blocking it; pods already
admitted keep the priority copied into their spec (docs/survive.md).
"""

from __future__ import annotations

from constructs import Construct

from constructs_lib.naming import pin
from constructs_lib.providers import kubernetes

# Well below system-cluster-critical (2e9): training never preempts cluster components.
PRIORITY_CLASSES: tuple[tuple[str, int, str, str], ...] = (
    ("training-low", 100, "Never", "preemptible sweeps and experiments; never preempts other pods"),
    ("training-high", 1000, "Never", "reserved production runs; ahead of training-low in Kueue, never evicts another pod"),
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
