"""``gpufleet check`` for the Vault layer: policies parse and stay in gpufleet's namespace,
roles are sane, name only job policies and existing clusters, never span dev and non-dev
clusters without a reviewed exception (alone, through an extra CIDR, or by sharing a job policy
with a role of the other side), and the two operator policies
are exactly what vault_policies/operator.py renders from them; the Nomad PKI policies
(vault_policies/policies/pki/) exactly what vault_policies/nomad_pki.py renders from the clusters."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from clusters.derive.nomad import NomadPkiSpec, derive_nomad_pki
from clusters.errors import ConfigError, Problem
from clusters.schema import ClusterConfig
from clusters.source import did_you_mean
from vault_policies.layout import LOOPBACK_CIDR, OPERATOR_POLICIES
from vault_policies.nomad_pki import PKI_POLICIES_DIR, pki_problems, render_pki_files
from vault_policies.operator import render_admin, render_orchestrator
from vault_policies.policies import PolicyFile, load_policies
from vault_policies.roles import (RoleSpec, bind_to_clusters, cluster_problems, load_roles_document, policy_span_problems, retired_roles,
                                   span_problems)

POLICIES_DIR = Path("vault_policies/policies")
ROLES_FILE = Path("vault_policies/roles.yaml")
CLUSTERS_DIR = Path("clusters")
RENDER_HINT = "run `gpufleet vault render` and review the diff (an operator applies it with a root token)"


@dataclass(frozen=True)
class VaultDefinitions:
    """Everything the sync writes, validated; roles carry their derived CIDR bindings."""

    policies: dict[str, PolicyFile]
    roles: dict[str, RoleSpec]
    retired: tuple[str, ...] = ()

    @property
    def job_policies(self) -> dict[str, PolicyFile]:
        return {name: p for name, p in self.policies.items() if name not in OPERATOR_POLICIES}

    def operator_texts(self) -> dict[str, str]:
        """The operator policies' file text as rendered from these roles."""
        from vault_policies.layout import ADMIN_POLICY, ORCHESTRATOR_POLICY

        texts = {name: policy.rendered() for name, policy in self.job_policies.items()}
        return {ADMIN_POLICY: render_admin(self.roles, self.retired, texts), ORCHESTRATOR_POLICY: render_orchestrator(self.roles)}

    def for_local_dev(self) -> VaultDefinitions:
        """The same definitions for a Vault on this machine (gpufleet dev up, tests): every role
        also accepts the loopback address, and the operator policies are re-rendered to match."""
        roles = {name: bind_to_clusters(role, {}, extra=(LOOPBACK_CIDR,)) for name, role in self.roles.items()}
        dev = VaultDefinitions(dict(self.policies), roles, self.retired)
        for name, text in dev.operator_texts().items():
            dev.policies[name] = replace(self.policies[name], text=text)
        return dev


def _clusters(repo_root: Path) -> dict[str, object]:
    """Cluster configs that load; a broken cluster file is the cluster check's to report."""
    from clusters.loader import cluster_files, load

    configs = {}
    for path in cluster_files(repo_root / CLUSTERS_DIR):
        try:
            config = load(path)
        except ConfigError:
            configs[path.stem] = None
            continue
        configs[config.name] = config
    return configs


def _pki_specs(configs: dict[str, ClusterConfig]) -> tuple[NomadPkiSpec, ...]:
    return tuple(spec for _, config in sorted(configs.items()) if (spec := derive_nomad_pki(config)) is not None)


def _collect(repo_root: Path) -> tuple[VaultDefinitions, list[Problem]]:
    policies, problems = load_policies(repo_root / POLICIES_DIR)
    for required in OPERATOR_POLICIES:
        if required not in policies and not (repo_root / POLICIES_DIR / f"{required}.hcl").exists():
            problems.append(Problem(str(repo_root / POLICIES_DIR), None, "", f"{required}.hcl is missing; the dispatch flow needs it; {RENDER_HINT}"))
    roles_path = repo_root / ROLES_FILE
    roles: dict[str, RoleSpec] = {}
    try:
        doc, roles = load_roles_document(roles_path)
    except ConfigError as exc:
        problems.extend(exc.problems)
        return VaultDefinitions(policies, roles), problems
    clusters = _clusters(repo_root)
    problems.extend(cluster_problems(doc, roles, clusters))
    problems.extend(span_problems(doc, roles, clusters))
    problems.extend(policy_span_problems(doc, roles, clusters))
    loaded = {name: config for name, config in clusters.items() if config is not None}
    roles = {name: bind_to_clusters(role, loaded) for name, role in roles.items()}
    job_policies = sorted(set(policies) - set(OPERATOR_POLICIES))
    for name, role in roles.items():
        for index, policy in enumerate(role.policies):
            if policy in OPERATOR_POLICIES:
                problems.append(doc.problem(("roles", name, "policies", index), f"{policy!r} is an operator policy and must not reach training tasks; allowed: {', '.join(job_policies)}; name a job policy"))
            elif policy not in policies and not (repo_root / POLICIES_DIR / f"{policy}.hcl").is_file():
                # A policy file that exists but does not parse is reported once, by its parser; a second
                # "does not exist" here would send the reader to the wrong file.
                problems.append(doc.problem(("roles", name, "policies", index), f"policy {policy!r} does not exist{did_you_mean(policy, job_policies)}; allowed: {', '.join(job_policies)}; add {POLICIES_DIR}/{policy}.hcl or fix the name"))
    definitions = VaultDefinitions(policies, roles, retired_roles(doc))
    # A cluster file that does not load renders without its CIDRs and PKI policies, so the rendered
    # files would "differ" because of that file alone: its own error is the one to fix (no cascade).
    if None not in clusters.values():
        problems.extend(pki_problems(repo_root, _pki_specs(loaded)))
    if not problems and None not in clusters.values():
        for name, text in definitions.operator_texts().items():
            if name in policies and policies[name].text != text:
                problems.append(Problem(str(policies[name].file), _first_difference(policies[name].text, text), "", f"differs from what roles.yaml and clusters/ render (hand-edited or stale); {RENDER_HINT}"))
    return definitions, problems


def _first_difference(have: str, want: str) -> int:
    for number, (a, b) in enumerate(zip(have.splitlines(), want.splitlines(), strict=False), start=1):
        if a != b:
            return number
    return min(len(have.splitlines()), len(want.splitlines())) + 1


def check(repo_root: Path) -> list[Problem]:
    """Every problem in the repo's Vault definitions; empty means the sync may write them."""
    return _collect(repo_root)[1]


def load_definitions(repo_root: Path) -> VaultDefinitions:
    """The validated definitions, or ConfigError listing every problem."""
    definitions, problems = _collect(repo_root)
    if problems:
        raise ConfigError(problems)
    return definitions


def render(repo_root: Path) -> list[Path]:
    """Write the operator policies rendered from roles.yaml and clusters/; the files changed."""
    definitions, problems = _collect(repo_root)
    operator_files = {str(repo_root / POLICIES_DIR / f"{name}.hcl") for name in OPERATOR_POLICIES} | {str(repo_root / POLICIES_DIR)}
    blocking = [p for p in problems if p.file not in operator_files and not Path(p.file).is_relative_to(repo_root / PKI_POLICIES_DIR)]
    if blocking:
        raise ConfigError(blocking)
    written = render_pki_files(repo_root, _pki_specs({name: c for name, c in _clusters(repo_root).items() if c is not None}))
    for name, text in definitions.operator_texts().items():
        path = repo_root / POLICIES_DIR / f"{name}.hcl"
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written
