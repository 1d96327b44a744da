"""Which Kubernetes cluster answers through the kubeconfig context: the uid of its
``kube-system`` Namespace.

A binding by name alone trusts whatever the context points at; a service pointed at another
cluster saw none of the runs and failed every one as gone. The ``kube-system`` Namespace is made
once with the cluster and never recreated, its uid is random (apimachinery ``ObjectMeta.UID``)
and tenants cannot change it: the cluster id multi-cluster tools use. The service's identity
needs ``get`` on ``namespaces`` named ``kube-system`` (one cluster-scoped rule). The cluster CA
in the kubeconfig would only say what this client trusts, not which cluster answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PREFIX = "kubernetes"


def identity(namespace: Mapping[str, Any]) -> str:
    """``kubernetes kube-system=<uid>`` from the ``kube-system`` Namespace object."""
    uid = str((namespace.get("metadata") or {}).get("uid") or "")
    if not uid:
        raise ValueError("the kube-system Namespace has no uid")
    return f"{PREFIX} kube-system={uid}"


def same(recorded: str, answering: str) -> bool:
    return recorded == answering


def follow(recorded: str, answering: str) -> str:
    """What to record after ``same``: the kube-system uid never changes, so the record as it is."""
    return recorded
