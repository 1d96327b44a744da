"""Pure derivations from a validated ClusterConfig to the specs the constructs declare, one module
per thing derived: ``pools`` (GPU node pools), ``upgrades``, ``gke`` (control plane, system pool),
``gpudirect`` (NIC networks, runtime DaemonSets), ``tenants``, ``addresses`` (TFC workspaces, DNS,
IAM grant keys) and ``nomad`` (servers, agent secrets, task groups).

Tests call these directly; constructs only read the specs. Nothing here knows cdktf. There are no
re-exports: import from the module that derives the thing.
"""
