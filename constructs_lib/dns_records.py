"""Cloudflare DNS records of a cluster: A records to its named static IPs, CNAMEs to hostnames."""

from __future__ import annotations

from collections.abc import Mapping

from constructs import Construct

from clusters.derive.addresses import dns_record_address
from clusters.schema import DnsConfig, DnsRecord
from constructs_lib.naming import pin
from constructs_lib.providers import cloudflare


def record_fqdn(record: DnsRecord, zone_name: str) -> str:
    """Cloudflare's v5 provider stores full names; a relative name would show a diff on every plan."""
    return zone_name if record.name == "@" else f"{record.name}.{zone_name}"


class DnsRecords(Construct):
    """The API token is never passed here: the provider reads CLOUDFLARE_API_TOKEN itself.

    ``static_ips`` maps the cluster file's static IP names to their address references, so an
    A record follows the reserved address without anyone copying it. ``nomad_api: true`` records
    are not published here (a private address in a public zone): constructs_lib.nomad_private_dns.
    """

    def __init__(self, scope: Construct, id_: str, *, cluster: str, dns: DnsConfig, static_ips: Mapping[str, str]) -> None:
        super().__init__(scope, id_)
        self.provider = cloudflare.provider.CloudflareProvider(self, "cloudflare")
        self.records = {}
        # nomad_api records name a private address: constructs_lib.nomad_private_dns, never the public zone.
        for record in sorted((r for r in dns.records if not r.nomad_api), key=lambda r: r.name):
            address = dns_record_address(record.name)
            is_a = record.static_ip is not None
            content = static_ips[record.static_ip] if record.static_ip is not None else record.hostname
            self.records[record.name] = pin(cloudflare.dns_record.DnsRecord(
                self, address,
                zone_id=dns.zone_id,
                name=record_fqdn(record, dns.zone_name),
                type="A" if is_a else "CNAME",
                content=content,
                proxied=record.proxied,
                ttl=record.ttl,
                comment=f"gpufleet: clusters/{cluster}.yaml",  # Cloudflare free plans cap comments at 100 characters
                provider=self.provider,
            ), address)
