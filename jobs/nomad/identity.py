"""Which Nomad cluster answers at NOMAD_ADDR: its region and its servers' node ids.

A binding by name alone trusts whatever NOMAD_ADDR points at; a service pointed at another
cluster saw none of the runs and failed every one as gone. Nomad does keep a cluster id
(``structs.ClusterMetadata``, made by the first leader), but no HTTP endpoint returns it
(hashicorp/nomad ``command/agent/http.go`` at aa026cc: no handler reads
``Server.ClusterMetadata``). What a client can read is ``GET /v1/agent/members`` (ACL
``node:read``; ``Status.Members``): ``ServerRegion`` and each server's serf tags, among them
``region`` and ``id``, the server's node id, a random UUID kept in its data directory
(``nomad/server.go`` ``setupSerf``). Another cluster has other servers even when its region has
the same name (every cluster's default is ``global``). Servers are replaced one at a time, so
the set recorded earlier and the set answering now of the same cluster share most servers: that
is what ``same`` checks, a strict majority of the recorded servers among those answering. One
server in common is not enough: servers built from one image with a pre-seeded
``data_dir/server/node-id``, or a server moved between clusters, share an id with production.
The record follows a replacement (``follow``) only while the servers in common are also a
majority of the answering set, so one step adds or removes at most a minority and a cluster
sharing a minority of servers can never walk the record over to itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PREFIX = "nomad"


def identity(members: Mapping[str, Any]) -> str:
    """``nomad region=<region> servers=<id>,<id>...`` from a ``/v1/agent/members`` answer: the
    servers of the answering region (the gossip pool also holds other regions' servers)."""
    region = str(members.get("ServerRegion") or "")
    ids = sorted({str(tags["id"]) for m in members.get("Members") or [] if (tags := m.get("Tags") or {}).get("role") == "nomad"
                  and tags.get("region") == region and tags.get("id")})
    if not region or not ids:
        raise ValueError("Nomad's /v1/agent/members named no region or no server ids")
    return f"{PREFIX} region={region} servers={','.join(ids)}"


def _parse(text: str) -> tuple[str, frozenset[str]]:
    fields = dict(part.split("=", 1) for part in text.split()[1:] if "=" in part)
    return fields.get("region", ""), frozenset(filter(None, fields.get("servers", "").split(",")))


def same(recorded: str, answering: str) -> bool:
    """The same cluster: the same region name and most of the recorded servers answering."""
    (region_a, servers_a), (region_b, servers_b) = _parse(recorded), _parse(answering)
    return region_a == region_b and 2 * len(servers_a & servers_b) > len(servers_a)


def follow(recorded: str, answering: str) -> str:
    """What to record after ``same``: the answering set when the servers in common are a majority
    of it as well (a minority replaced), else the record as it was."""
    servers_a, servers_b = _parse(recorded)[1], _parse(answering)[1]
    return answering if same(recorded, answering) and 2 * len(servers_a & servers_b) > len(servers_b) else recorded
