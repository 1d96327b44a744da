"""Terraform addresses are a public contract: one helper gives every resource its readable id.

cdktf would otherwise derive logical ids from the construct path plus a hash; overriding them
keeps addresses short (``google_container_node_pool.pool_h100``) and lets the plan gate's
``--allow-destroy`` name what a reviewer sees in the cluster file.
"""

from __future__ import annotations

from typing import TypeVar

from cdktf import TerraformElement

E = TypeVar("E", bound=TerraformElement)


def tf_id(name: str) -> str:
    return name.replace("-", "_").replace(".", "_")


def pin(element: E, logical_id: str) -> E:
    element.override_logical_id(tf_id(logical_id))
    return element
