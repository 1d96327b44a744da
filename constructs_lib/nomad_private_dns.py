"""The Nomad API's name, resolvable only inside the cluster's VPC.

A ``nomad_api: true`` record names the servers' internal load balancer, a private address: in the
public Cloudflare zone it would tell the world the VPC's layout and resolve for nobody who could
use it. It becomes a Cloud DNS private zone holding exactly that name (not the whole domain: a
private zone for the domain would hide every public record of it from the VPC's VMs), visible to
the cluster's VPC; operators on the VPN resolve it through the VPC's inbound DNS forwarding.
"""

from __future__ import annotations

from constructs import Construct

from clusters.schema import DnsRecord
from constructs_lib.dns_records import record_fqdn
from constructs_lib.naming import pin
from constructs_lib.providers import google

TTL_SECONDS = 300


def private_zone_name(cluster: str, record: DnsRecord) -> str:
    """A Cloud DNS zone name: lowercase letters, digits and dashes, at most 63 characters."""
    return f"{cluster}-{record.name.replace('.', '-').replace('@', 'apex')}-private"[:63].rstrip("-")


class NomadPrivateDns(Construct):
    def __init__(self, scope: Construct, id_: str, *, cluster: str, project: str, zone_name: str, records: tuple[DnsRecord, ...],
                 network: str, address: str) -> None:
        super().__init__(scope, id_)
        self.zones, self.records = {}, {}
        dz = google.dns_managed_zone
        for record in sorted(records, key=lambda r: r.name):
            fqdn = record_fqdn(record, zone_name) + "."
            key = private_zone_name(cluster, record).replace("-", "_")
            self.zones[record.name] = zone = pin(dz.DnsManagedZone(
                self, f"zone_{key}", name=private_zone_name(cluster, record), project=project, dns_name=fqdn, visibility="private",
                description=f"gpufleet: the Nomad API of {cluster}, inside its VPC only",
                private_visibility_config=dz.DnsManagedZonePrivateVisibilityConfig(
                    networks=[dz.DnsManagedZonePrivateVisibilityConfigNetworks(network_url=network)])), f"dns_private_{key}")
            self.records[record.name] = pin(google.dns_record_set.DnsRecordSet(
                self, f"record_{key}", managed_zone=zone.name, project=project, name=fqdn, type="A", ttl=TTL_SECONDS,
                rrdatas=[address]), f"dns_private_record_{key}")
