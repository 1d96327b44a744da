"""Nomad objects of a cluster: a node pool per GPU pool, and per tenant a namespace and an ACL policy."""

from __future__ import annotations

from constructs import Construct

from clusters.derive.pools import GpuPoolSpec
from clusters.families import LOCAL_SSD_VOLUME
from clusters.derive.tenants import TenantSpec
from constructs_lib.naming import pin
from constructs_lib.nomad_agent_config import pool_meta
from constructs_lib.providers import nomad

# What a tenant may do in its own namespace: watch its jobs and read their logs. Submitting and
# dispatching go through gpufleet's dispatcher (``gpufleet jobs dispatch`` or the control plane),
# which enforces the tenant's GPU quota: Nomad CE has no quotas and no node-pool ACL, so a tenant
# token with submit-job could put any job on any pool. No alloc exec, no variables, no host
# volumes, no node or agent access: those stay with platform operators.
TENANT_CAPABILITIES = ("list-jobs", "parse-job", "read-job", "read-logs")
# The dispatcher's token: register, dispatch, stop and read jobs in every tenant namespace.
DISPATCHER_CAPABILITIES = ("dispatch-job", "list-jobs", "parse-job", "read-job", "submit-job")
DISPATCHER_POLICY = "gpufleet-dispatcher"
# The Nomad Autoscaler v0.4.9 with file policies, the prometheus APM and the gce-mig target needs, read
# from its source and Nomad v1.10.5's ACL checks:
# - node write: the cluster target lists, reads, drains (UpdateDrain), marks eligible and purges nodes
#   (nomad-autoscaler sdk/helper/scaleutils/cluster.go:200,263,350, node_drain.go:180); Nomad checks
#   AllowNodeWrite for drain, eligibility and purge (nomad/node_endpoint.go:674,778,881);
# - read-job in every namespace: the empty-node selector lists a node's allocations
#   (scaleutils/nodeselector/empty.go:73), which Nomad filters by read-job per namespace
#   (node_endpoint.go GetAllocs, :1004-1019), so without it a busy node would look empty;
# - list-scaling-policies and read-scaling-policy: the Nomad policy source is on by default
#   (agent/config/config.go:457-460; policy/nomad/source.go:63-68), and Nomad accepts those two
#   capabilities for it (nomad/scaling_endpoint.go:49-51,118-120); no list-jobs is needed;
# - its high-availability lock, a variable at nomad-autoscaler/lock (agent/config/config.go:401,
#   command/agent.go:411-418) in the default namespace. That block repeats the "*" capabilities: Nomad takes an
#   exact namespace's block alone, never its union with a glob (acl/acl.go:572-581 matchingNamespaceCapabilitySet),
#   so a variables-only "default" block would leave "default" (where a job with no tenant runs) without read-job.
# Nothing else: no submit-job, no scale-job (the nomad target is not used), no operator or agent access.
AUTOSCALER_POLICY = "gpufleet-autoscaler"
AUTOSCALER_RULES = """node {
  policy = "write"
}
namespace "*" {
  capabilities = ["read-job", "list-scaling-policies", "read-scaling-policy"]
}
namespace "default" {
  capabilities = ["read-job", "list-scaling-policies", "read-scaling-policy"]
  variables {
    path "nomad-autoscaler/lock" {
      capabilities = ["read", "write", "destroy"]
    }
  }
}
"""


def _namespace_rules(namespaces: list[str], capabilities: tuple[str, ...]) -> str:
    caps = ", ".join(f'"{c}"' for c in capabilities)
    return "".join(f'namespace "{n}" {{\n  capabilities = [{caps}]\n}}\n' for n in sorted(namespaces))


def tenant_acl_rules(namespace: str) -> str:
    """HCL rules of a tenant's ACL policy, one namespace block and nothing else."""
    return _namespace_rules([namespace], TENANT_CAPABILITIES)


# ``node:read`` lets the control plane ask ``GET /v1/agent/members`` (nomad/status_endpoint.go
# Status.Members checks AllowNodeRead) which servers answer, so a service pointed at another
# cluster under this cluster's name leaves its runs alone (jobs/nomad/identity.py). Read only.
DISPATCHER_NODE_RULE = 'node {\n  policy = "read"\n}\n'


def dispatcher_acl_rules(namespaces: list[str], host_volumes: tuple[str, ...] = ()) -> str:
    """HCL rules of the dispatcher's policy: the job capabilities in each tenant namespace, and
    reading nodes and servers (to confirm which cluster answers); with ``host_volumes`` (pools with
    local SSD) mounting those client host volumes read-write, which registering a job that mounts one
    requires (nomad v1.10.5 nomad/job_endpoint.go:163-176, ``write`` expands to mount-readonly and
    mount-readwrite: acl/policy.go:350-362); nothing else."""
    volumes = "".join(f'host_volume "{v}" {{\n  policy = "write"\n}}\n' for v in sorted(set(host_volumes)))
    return _namespace_rules(namespaces, DISPATCHER_CAPABILITIES) + DISPATCHER_NODE_RULE + volumes


class NomadTenancy(Construct):
    """Node pools must exist before clients that name them register, so they live here, once each.

    The pool's meta mirrors what its clients report, so ``nomad node pool info`` tells an
    ML engineer which GPU a pool holds without reading the cluster file.
    """

    def __init__(self, scope: Construct, id_: str, *, cluster: str, pools: tuple[GpuPoolSpec, ...], tenants: tuple[TenantSpec, ...],
                 provider: object) -> None:
        super().__init__(scope, id_)
        self.node_pools = {
            p.name: pin(nomad.node_pool.NodePool(
                self, f"pool_{p.name}", name=p.name, provider=provider,
                description=f"{cluster} {p.name}: {p.gpus_per_node}x {p.gpu_model} per node ({p.machine_type})",
                meta=pool_meta(p, cluster)), f"nomad_node_pool_{p.name}")
            for p in pools
        }
        self.namespaces = {}
        self.policies = {}
        for t in tenants:
            key = t.name.replace("-", "_")
            quota = ", ".join(f"{pool}={gpus}" for pool, gpus in t.gpu_quota)
            self.namespaces[t.name] = pin(nomad.namespace.Namespace(
                self, f"ns_{t.name}", name=t.namespace, provider=provider, description=f"tenant {t.name} (GPU quota {quota or 'none'})",
                meta={"tenant": t.name, "gpu_quota": quota}), f"nomad_ns_{key}")
            self.policies[t.name] = pin(nomad.acl_policy.AclPolicy(
                self, f"acl_{t.name}", name=f"tenant-{t.name}", provider=provider,
                description=f"tenant {t.name}: submit and read jobs in namespace {t.namespace} only",
                rules_hcl=tenant_acl_rules(t.namespace), depends_on=[self.namespaces[t.name]]), f"nomad_acl_{key}")
        self.autoscaler_policy = pin(nomad.acl_policy.AclPolicy(
            self, "acl_autoscaler", name=AUTOSCALER_POLICY, provider=provider,
            description="Nomad Autoscaler on the servers: drain and purge GPU nodes it removes, hold its HA lock",
            rules_hcl=AUTOSCALER_RULES), "nomad_acl_autoscaler")
        self.dispatcher_policy = None
        if tenants:
            self.dispatcher_policy = pin(nomad.acl_policy.AclPolicy(
                self, "acl_dispatcher", name=DISPATCHER_POLICY, provider=provider,
                description="gpufleet dispatcher: register and dispatch tenant jobs after its GPU quota check",
                rules_hcl=dispatcher_acl_rules([t.namespace for t in tenants],
                                               (LOCAL_SSD_VOLUME,) if any(p.local_ssd_count for p in pools) else ()),
                depends_on=list(self.namespaces.values())), "nomad_acl_dispatcher")
