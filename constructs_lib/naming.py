"""Terraform addresses are a public contract: one helper gives every resource its readable id.

cdktf would otherwise derive logical ids from the construct path plus a hash; overriding them
keeps addresses short (``google_container_node_pool.pool_h100``) and lets the plan gate's
``--allow-destroy`` name what a reviewer sees in the cluster file.
"""

from __future__ import annotations

from typing import TypeVar

from cdktf import TerraformElement

from constructs_lib.jsii_messages import defer_logical_id

E = TypeVar("E", bound=TerraformElement)


def tf_id(name: str) -> str:
    return name.replace("-", "_").replace(".", "_")


def pin(element: E, logical_id: str) -> E:
    """``element.override_logical_id``; the call rides along with the next kernel request where the kernel
    allows it (``constructs_lib/jsii_messages.py``, a third of a synthesis's round trips)."""
    name = tf_id(logical_id)
    if not defer_logical_id(element, name):
        element.override_logical_id(name)
    return element
