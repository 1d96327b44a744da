"""AppRole role definitions (``vault_policies/roles.yaml``): schema, TTL rules and the derived spec.

The jobs layer calls :func:`load_roles` to check that a job's role exists; ``gpufleet check``
and the sync call it too, so a role that would hand out over-long or reusable credentials
is refused before it reaches Vault.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from clusters.errors import ConfigError, Problem
from clusters.source import YamlDocument, problems_from_validation, read_yaml, validate_document

MAX_TOKEN_TTL_SECONDS = 3600
MIN_REASON_CHARS = 10
ROLE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(value: object) -> int:
    """Seconds from an int or a Vault-style duration ("90s", "30m", "24h", "1h30m")."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; use seconds (1800) or a string like '30m' or '24h'")
    if isinstance(value, int):
        seconds = value
    else:
        match = _DURATION.match(str(value).strip())
        if not match or not any(match.groups()):
            raise ValueError(f"{value!r} is not a duration; use seconds (1800) or a string like '30m' or '24h'")
        hours, minutes, secs = (int(g) if g else 0 for g in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if seconds <= 0:
        raise ValueError(f"{value!r} must be a positive duration; use e.g. '30m'")
    return seconds


Duration = Annotated[int, BeforeValidator(parse_duration)]


class RoleModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    policies: list[str] = Field(min_length=1)
    token_ttl: Duration
    token_max_ttl: Duration
    secret_id_ttl: Duration
    secret_id_num_uses: int = Field(default=1, ge=0)
    secret_id_bound_cidrs: list[str] | None = None
    token_period: Duration | None = None
    reason: str | None = None

    @field_validator("secret_id_bound_cidrs")
    @classmethod
    def _cidrs(cls, cidrs: list[str] | None) -> list[str] | None:
        for cidr in cidrs or []:
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError:
                raise ValueError(f"{cidr!r} is not a CIDR; use a network like '10.20.0.0/16'") from None
        return cidrs


class RolesFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    roles: dict[str, dict[str, Any]] = Field(min_length=1)


@dataclass(frozen=True)
class RoleSpec:
    """One AppRole role as the sync writes it; durations in seconds."""

    name: str
    policies: tuple[str, ...]
    token_ttl_seconds: int
    token_max_ttl_seconds: int
    secret_id_ttl_seconds: int
    secret_id_num_uses: int
    secret_id_bound_cidrs: tuple[str, ...]
    token_period_seconds: int | None
    reason: str | None
    line: int | None


def _rule_problems(doc: YamlDocument, name: str, role: RoleModel) -> list[Problem]:
    """The rules a schema cannot express: they relate fields to each other."""
    at = ("roles", name)
    problems = []
    if not ROLE_NAME.match(name):
        problems.append(doc.problem(at, f"role name {name!r} is not allowed; use lowercase letters, digits, '-' or '_' (at most 63)"))
    if role.token_ttl > MAX_TOKEN_TTL_SECONDS and role.token_period is None:
        problems.append(doc.problem((*at, "token_ttl"), f"{role.token_ttl}s is longer than {MAX_TOKEN_TTL_SECONDS}s (1h); tokens are renewed in the background, so set token_ttl to at most 1h (e.g. '30m') or set token_period for a periodic token"))
    if role.token_period is not None and role.token_period > MAX_TOKEN_TTL_SECONDS:
        problems.append(doc.problem((*at, "token_period"), f"{role.token_period}s is longer than {MAX_TOKEN_TTL_SECONDS}s (1h); a periodic token is renewed every period, so set token_period to at most 1h"))
    if role.token_max_ttl < role.token_ttl:
        problems.append(doc.problem((*at, "token_max_ttl"), f"{role.token_max_ttl}s is shorter than token_ttl {role.token_ttl}s; allowed: token_max_ttl >= token_ttl; raise token_max_ttl to cover the longest run"))
    if role.secret_id_num_uses != 1 and not (role.reason and len(role.reason.strip()) >= MIN_REASON_CHARS):
        problems.append(doc.problem((*at, "secret_id_num_uses"), f"{role.secret_id_num_uses} is not allowed without a reason; allowed: 1 (single use); set secret_id_num_uses: 1 or add reason: '<why, {MIN_REASON_CHARS}+ characters>' to the role"))
    if len(set(role.policies)) != len(role.policies):
        problems.append(doc.problem((*at, "policies"), f"{role.policies} names a policy twice; list each policy once"))
    return problems


def _validate_roles(doc: YamlDocument) -> dict[str, RoleModel]:
    """Each role validated on its own node, so unknown-field hints list the role's fields."""
    names = validate_document(doc, RolesFile).roles
    roles: dict[str, RoleModel] = {}
    problems: list[Problem] = []
    for name in sorted(names):
        sub = YamlDocument(doc.path, doc.raw["roles"][name])
        try:
            roles[name] = RoleModel.model_validate(sub.data)
        except ValidationError as exc:
            problems += [Problem(p.file, p.line, f"roles.{name}.{p.field}" if p.field else f"roles.{name}", p.message) for p in problems_from_validation(sub, RoleModel, exc)]
    if problems:
        raise ConfigError(problems)
    return roles


def load_roles_document(path: Path) -> tuple[YamlDocument, dict[str, RoleSpec]]:
    """The parsed file (for line numbers in cross-checks) and the validated roles, sorted by name."""
    doc = read_yaml(path)
    parsed = _validate_roles(doc)
    problems = [p for name, role in parsed.items() for p in _rule_problems(doc, name, role)]
    if problems:
        raise ConfigError(problems)
    specs = {
        name: RoleSpec(
            name=name,
            policies=tuple(role.policies),
            token_ttl_seconds=role.token_ttl,
            token_max_ttl_seconds=role.token_max_ttl,
            secret_id_ttl_seconds=role.secret_id_ttl,
            secret_id_num_uses=role.secret_id_num_uses,
            secret_id_bound_cidrs=tuple(role.secret_id_bound_cidrs or ()),
            token_period_seconds=role.token_period,
            reason=role.reason,
            line=doc.line_of(("roles", name)),
        )
        for name, role in parsed.items()
    }
    return doc, specs


def load_roles(path: Path) -> dict[str, RoleSpec]:
    """Validated roles by name; raises ConfigError with one line per problem."""
    return load_roles_document(path)[1]
