"""AppRole role definitions (``vault_policies/roles.yaml``): schema, TTL rules and the derived spec.

The jobs layer calls :func:`load_roles` to check that a job's role exists; ``gpufleet check``
and the sync call it too, so a role that would hand out over-long or reusable credentials
is refused before it reaches Vault.

Each role names the clusters its tasks run on; its ``secret_id_bound_cidrs`` and
``token_bound_cidrs`` are derived from those cluster files (:func:`task_source_cidrs`), so a
wrapped secret_id, or the token it buys, is useless from any other host (a job reader's
laptop, the dispatcher). Extra ranges may be listed per role; none can be removed.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from clusters.errors import ConfigError, Problem
from clusters.source import YamlDocument, did_you_mean, problems_from_validation, read_yaml, validate_document
from vault_policies.layout import JOB_POLICY_PREFIX, MAX_WRAP_TTL_SECONDS

if TYPE_CHECKING:
    from clusters.schema import ClusterConfig

# Short, renewed at least every minute: a token orphaned by a killed wrapper dies in minutes.
MAX_TOKEN_TTL_SECONDS = 900
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


MIN_REASON_CHARS = 10
SPAN_FIELD = "spans_dev_and_prod"
DEV_ENVIRONMENT = "dev"


class SpanException(BaseModel):
    """The reviewed exception that lets one role serve dev and non-dev clusters: its reason is the audit trail."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: str

    @field_validator("reason")
    @classmethod
    def _reason(cls, reason: str) -> str:
        if len(reason.strip()) < MIN_REASON_CHARS:
            raise ValueError(f"{reason!r} is too short to review; allowed: a reason of {MIN_REASON_CHARS}+ characters saying why dev "
                             "pods may read this role's production keys; write it, or split the role")
        return reason.strip()


class RoleModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    policies: list[str] = Field(min_length=1)
    clusters: list[str] = Field(min_length=1)
    token_ttl: Duration
    token_max_ttl: Duration
    secret_id_ttl: Duration
    # Single use, always: Vault itself refuses any other value from the sync token
    # (gpufleet-admin pins it), so there is no reviewed exception to grant here.
    secret_id_num_uses: Literal[1] = 1
    secret_id_bound_cidrs: list[str] | None = None
    token_bound_cidrs: list[str] | None = None
    token_period: Duration | None = None
    # A dev cluster hosts the sandbox tenant and the everyone group: a role bound to it and to
    # non-dev clusters gives every dev pod the production keys (issue 22). Refused unless named here.
    spans_dev_and_prod: SpanException | None = None

    @field_validator("secret_id_bound_cidrs", "token_bound_cidrs")
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
    # Roles gpufleet created and the repo dropped: `gpufleet vault prune` may delete exactly
    # these (gpufleet-admin is granted delete on these names only, never on a live role).
    retired: list[str] = []


@dataclass(frozen=True)
class RoleSpec:
    """One AppRole role as the sync writes it; durations in seconds."""

    name: str
    policies: tuple[str, ...]
    clusters: tuple[str, ...]
    token_ttl_seconds: int
    token_max_ttl_seconds: int
    secret_id_ttl_seconds: int
    secret_id_num_uses: int
    secret_id_bound_cidrs: tuple[str, ...]
    token_bound_cidrs: tuple[str, ...]
    token_period_seconds: int | None
    line: int | None
    spans_dev_and_prod_reason: str | None = None
    """The reviewed reason this role may serve dev and non-dev clusters at once (None: it may not)."""


def task_source_cidrs(config: ClusterConfig) -> tuple[str, ...]:
    """The source addresses a task of this cluster reaches Vault from.

    Nomad: the GPU clients are VMs in the cluster subnet (subnet_cidr). GKE: pods are
    VPC-native and keep their pod address towards in-VPC destinations (pods_cidr). A Vault
    reached through Cloud NAT sees the NAT address instead; then list it per role.
    """
    return (config.gcp.subnet_cidr,) if config.scheduler.value == "nomad" else (config.gcp.pods_cidr,)


def bind_to_clusters(role: RoleSpec, clusters: dict[str, ClusterConfig], *, extra: tuple[str, ...] = ()) -> RoleSpec:
    """The role with both CIDR bindings derived from its clusters (plus its own extras)."""
    derived = [cidr for name in role.clusters if name in clusters for cidr in task_source_cidrs(clusters[name])]
    return replace(
        role,
        secret_id_bound_cidrs=tuple(sorted(set(derived) | set(role.secret_id_bound_cidrs) | set(extra))),
        token_bound_cidrs=tuple(sorted(set(derived) | set(role.token_bound_cidrs) | set(extra))),
    )


def cluster_problems(doc: YamlDocument, roles: dict[str, RoleSpec], clusters: dict[str, ClusterConfig]) -> list[Problem]:
    """Every role's clusters exist (their subnets become the role's CIDR bindings)."""
    return [
        doc.problem(("roles", name, "clusters", index), f"cluster {cluster!r} is not in clusters/{did_you_mean(cluster, clusters)}; allowed: {', '.join(sorted(clusters))}; name the clusters whose GPU nodes run this role's tasks")
        for name, role in roles.items()
        for index, cluster in enumerate(role.clusters)
        if cluster not in clusters
    ]


def role_reach(role: RoleSpec, clusters: dict[str, ClusterConfig | None]) -> dict[str, tuple[str, str | None]]:
    """Every cluster whose tasks can log in as ``role``: cluster -> (environment, how, None when listed).

    A role binds the clusters it lists, and also any cluster whose task addresses one of its
    extra ``secret_id_bound_cidrs``/``token_bound_cidrs`` overlaps: a prod-only role with
    dev-gke's pod range as an extra CIDR hands the prod keys to dev pods (issue 22 red team).
    """
    reach: dict[str, tuple[str, str | None]] = {c: (str(config.environment.value), None) for c in role.clusters
                                                if (config := clusters.get(c)) is not None}
    extras = [(field, cidr) for field, cidrs in (("secret_id_bound_cidrs", role.secret_id_bound_cidrs),
                                                 ("token_bound_cidrs", role.token_bound_cidrs)) for cidr in cidrs]
    for name, config in sorted(clusters.items()):
        if config is None or name in reach:
            continue
        for field, cidr in extras:
            task = next((t for t in task_source_cidrs(config) if _overlap(cidr, t)), None)
            if task is not None:
                reach[name] = (str(config.environment.value), f"{field} {cidr} overlaps its task addresses {task}")
                break
    return reach


def _overlap(one: str, other: str) -> bool:
    a, b = ipaddress.ip_network(one, strict=False), ipaddress.ip_network(other, strict=False)
    return a.version == b.version and a.overlaps(b)


def _named(cluster: str, env: str, via: str | None, *, with_env: bool) -> str:
    inside = [env] if with_env else []
    inside += [] if via is None else [f"bound by {via}"]
    return f"{cluster} ({', '.join(inside)})" if inside else cluster


def span_problems(doc: YamlDocument, roles: dict[str, RoleSpec], clusters: dict[str, ClusterConfig | None]) -> list[Problem]:
    """A role serves dev clusters or non-dev (staging, prod) clusters, not both, unless it carries the
    reviewed ``spans_dev_and_prod`` exception; an exception on a role that spans nothing is refused too
    (a suppression that matches nothing hides the next mistake). A cluster counts when the role lists
    it or binds its task addresses by an extra CIDR (``role_reach``)."""
    problems = []
    for name, role in roles.items():
        reach = role_reach(role, clusters)
        dev = [_named(c, env, via, with_env=False) for c, (env, via) in sorted(reach.items()) if env == DEV_ENVIRONMENT]
        other = [_named(c, env, via, with_env=True) for c, (env, via) in sorted(reach.items()) if env != DEV_ENVIRONMENT]
        listed_loaded = all(clusters.get(c) is not None for c in role.clusters)
        if dev and other and role.spans_dev_and_prod_reason is None:
            dev_listed = sorted(c for c, (env, via) in reach.items() if env == DEV_ENVIRONMENT and via is None)
            problems.append(doc.problem(("roles", name, "clusters"), (
                f"role {name!r} spans dev cluster(s) {', '.join(dev)} and non-dev cluster(s) {', '.join(other)}: every dev pod "
                f"(the sandbox tenant, the everyone group) could log in as it and read its production keys; allowed: dev clusters "
                f"only or non-dev clusters only; split it (e.g. a role {name}-dev with its own ml-keys-<family> policy and keys for "
                f"{', '.join(dev_listed or sorted(c for c, (env, _) in reach.items() if env == DEV_ENVIRONMENT))}), drop an extra "
                f"CIDR that binds another environment's task addresses, or, reviewed, add {SPAN_FIELD}: {{reason: <why, "
                f"{MIN_REASON_CHARS}+ characters>}}")))
        # An unloadable or unknown cluster is reported on its own; the exception is judged once all of them load.
        elif role.spans_dev_and_prod_reason is not None and not (dev and other) and listed_loaded:
            problems.append(doc.problem(("roles", name, SPAN_FIELD), (
                f"role {name!r} does not span dev and non-dev clusters (its clusters: {', '.join(role.clusters)}); the exception "
                f"matches nothing; remove {SPAN_FIELD}")))
    return problems


def policy_span_problems(doc: YamlDocument, roles: dict[str, RoleSpec], clusters: dict[str, ClusterConfig | None]) -> list[Problem]:
    """A job policy (``ml-keys-*``) is held by dev roles or by non-dev roles, not both.

    The span check judges one role; two roles sharing a policy are as good as one spanning role:
    a dev-only role holding ``ml-keys-eval`` gives every dev pod the prod key (issue 22 red team).
    Refused on the policies entry of each role that reaches a dev cluster while another role
    holding the policy reaches a non-dev one. The reviewed ``spans_dev_and_prod`` exception of a
    role covers that role's own dev reach only; a second, dev-only holder is refused all the same.
    """
    reach = {name: role_reach(role, clusters) for name, role in roles.items()}
    holders: dict[str, list[str]] = {}
    for name, role in roles.items():
        for policy in role.policies:
            if policy.startswith(JOB_POLICY_PREFIX):
                holders.setdefault(policy, []).append(name)
    problems = []
    for name, role in roles.items():
        dev = sorted(c for c, (env, _) in reach[name].items() if env == DEV_ENVIRONMENT)
        if not dev or role.spans_dev_and_prod_reason is not None:
            continue
        for index, policy in enumerate(role.policies):
            prod = sorted(f"{other} ({', '.join(sorted(f'{c} ({env})' for c, (env, _) in reach[other].items() if env != DEV_ENVIRONMENT))})"
                          for other in holders.get(policy, ()) if other != name
                          and any(env != DEV_ENVIRONMENT for env, _ in reach[other].values()))
            if prod:
                problems.append(doc.problem(("roles", name, "policies", index), (
                    f"role {name!r} reaches dev cluster(s) {', '.join(dev)} and holds {policy!r}, which non-dev role(s) "
                    f"{', '.join(prod)} hold: every dev pod (the sandbox tenant, the everyone group) could read that policy's "
                    f"production keys; allowed: a job policy held by dev roles only or by non-dev roles only; give {name!r} a "
                    f"policy of its own ({policy}-dev, with its own keys)")))
    return problems


def _rule_problems(doc: YamlDocument, name: str, role: RoleModel) -> list[Problem]:
    """The rules a schema cannot express: they relate fields to each other."""
    at = ("roles", name)
    problems = []
    if not ROLE_NAME.match(name):
        problems.append(doc.problem(at, f"role name {name!r} is not allowed; use lowercase letters, digits, '-' or '_' (at most 63)"))
    if role.token_ttl > MAX_TOKEN_TTL_SECONDS and role.token_period is None:
        problems.append(doc.problem((*at, "token_ttl"), f"{role.token_ttl}s is longer than {MAX_TOKEN_TTL_SECONDS}s (15m); a token orphaned by a killed wrapper lives that long, and tokens are renewed in the background anyway; allowed: <= 15m; set token_ttl: 5m"))
    if role.token_period is not None and role.token_period > MAX_TOKEN_TTL_SECONDS:
        problems.append(doc.problem((*at, "token_period"), f"{role.token_period}s is longer than {MAX_TOKEN_TTL_SECONDS}s (15m); a periodic token is renewed every period, so set token_period to at most 15m"))
    if role.token_max_ttl < role.token_ttl:
        problems.append(doc.problem((*at, "token_max_ttl"), f"{role.token_max_ttl}s is shorter than token_ttl {role.token_ttl}s; allowed: token_max_ttl >= token_ttl; raise token_max_ttl to cover the longest run"))
    if role.secret_id_ttl > MAX_WRAP_TTL_SECONDS:
        problems.append(doc.problem((*at, "secret_id_ttl"), f"{role.secret_id_ttl}s is longer than the longest wrap ({MAX_WRAP_TTL_SECONDS}s); a secret_id outliving its wrapping token only serves whoever unwrapped it; allowed: <= {MAX_WRAP_TTL_SECONDS // 60}m; set secret_id_ttl: {MAX_WRAP_TTL_SECONDS // 60}m"))
    if len(set(role.policies)) != len(role.policies):
        problems.append(doc.problem((*at, "policies"), f"{role.policies} names a policy twice; list each policy once"))
    return problems


def _missing_clusters(roles_path: Path) -> str:
    """What a role without ``clusters:`` should say: the clusters there are (the files beside
    vault_policies/ in clusters/) and the form, since "add it" alone leaves a newcomer guessing."""
    from clusters.loader import cluster_files

    names = [path.stem for path in cluster_files(roles_path.parent.parent / "clusters")]
    example = names[0] if names else "<cluster>"
    allowed = f"; allowed: {', '.join(names)}" if names else "; no cluster file exists yet: add one to clusters/ first"
    return (f"required field is missing; name the clusters whose GPU nodes run this role's tasks (their subnets become the role's"
            f" CIDR bindings){allowed}; add e.g. clusters: [{example}]")


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
            # The role's own node starts below line 1: a line-1 answer means the field is absent, so point at the role.
            problems += [Problem(p.file, p.line if p.line != 1 else doc.line_of(("roles", name)), f"roles.{name}.{p.field}" if p.field else f"roles.{name}",
                                 _missing_clusters(doc.path) if p.field == "clusters" and "clusters" not in sub.data else p.message)
                         for p in problems_from_validation(sub, RoleModel, exc)]
    if problems:
        raise ConfigError(problems)
    return roles


def load_roles_document(path: Path) -> tuple[YamlDocument, dict[str, RoleSpec]]:
    """The parsed file (for line numbers in cross-checks) and the validated roles, sorted by name."""
    doc = read_yaml(path)
    parsed = _validate_roles(doc)
    problems = [p for name, role in parsed.items() for p in _rule_problems(doc, name, role)]
    for index, name in enumerate(retired_roles(doc)):
        if name in parsed or not ROLE_NAME.match(name):
            problems.append(doc.problem(("retired", index), f"{name!r} cannot be retired: {'it is a live role in roles' if name in parsed else 'not a role name'}; list here only roles gpufleet created that left roles:"))
    if problems:
        raise ConfigError(problems)
    specs = {
        name: RoleSpec(
            name=name,
            policies=tuple(role.policies),
            token_ttl_seconds=role.token_ttl,
            token_max_ttl_seconds=role.token_max_ttl,
            secret_id_ttl_seconds=role.secret_id_ttl,
            clusters=tuple(role.clusters),
            secret_id_num_uses=role.secret_id_num_uses,
            secret_id_bound_cidrs=tuple(role.secret_id_bound_cidrs or ()),
            token_bound_cidrs=tuple(role.token_bound_cidrs or ()),
            token_period_seconds=role.token_period,
            line=doc.line_of(("roles", name)),
            spans_dev_and_prod_reason=role.spans_dev_and_prod.reason if role.spans_dev_and_prod else None,
        )
        for name, role in parsed.items()
    }
    return doc, specs


def retired_roles(doc: YamlDocument) -> tuple[str, ...]:
    """Roles the repo dropped and prune may delete (validated as a list of names by RolesFile)."""
    data = doc.data if isinstance(doc.data, dict) else {}
    return tuple(sorted(str(name) for name in data.get("retired") or ()))


def load_roles(path: Path) -> dict[str, RoleSpec]:
    """Validated roles by name; raises ConfigError with one line per problem."""
    return load_roles_document(path)[1]
