"""Every pattern-constrained schema field describes its format in words: a refusal quotes that
description instead of the regex (clusters.source._message); a new field without one would fall back
to a vague sentence, so this walks every model reachable from the three file schemas."""

from __future__ import annotations

import typing

from pydantic import BaseModel

from clusters.schema import ClusterConfig
from jobs.schema import JobFile
from tests.adversarial.generate import _metadata
from vault_policies.roles import RoleModel


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    if model in seen:
        return
    seen.add(model)
    for field in model.model_fields.values():
        stack = [field.annotation]
        while stack:
            annotation = stack.pop()
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                _models(annotation, seen)
            stack.extend(typing.get_args(annotation))


def test_every_pattern_field_has_a_description() -> None:
    seen: set[type[BaseModel]] = set()
    for root in (ClusterConfig, JobFile, RoleModel):
        _models(root, seen)
    missing = [f"{model.__name__}.{name}" for model in seen for name, field in model.model_fields.items()
               if any(getattr(m, "pattern", None) for m in _metadata(field)) and not field.description]
    assert not missing, f"pattern fields without a description (their errors would not say what is allowed): {missing}"
