"""Nomad operator commands: ``gpufleet nomad bootstrap-script <cluster>``, ``gpufleet nomad scrape-config <cluster>``,
``gpufleet nomad blackbox-module <cluster>``, ``gpufleet nomad alert-rules <cluster>``.

The script it prints creates the cluster's CA, agent certificates and gossip key with the
``nomad`` CLI and stores them as Secret Manager versions, where the agents' boot scripts read
them; gpufleet itself never sees or stores a key.
"""

from __future__ import annotations

from pathlib import Path

import typer

from clusters.errors import UserError


def _nomad_config(cluster: str):  # noqa: ANN202 - ClusterConfig, imported lazily like every command's dependencies
    import clusters
    from clusters.source import did_you_mean

    configs = {c.name: c for c in clusters.load_all()}
    nomad = sorted(n for n, c in configs.items() if c.nomad is not None)
    config = configs.get(cluster)
    if config is None or config.nomad is None:
        raise UserError(f"{cluster!r} is not a Nomad cluster in clusters/{did_you_mean(cluster, nomad)}; allowed: {', '.join(nomad) or '(none)'}")
    return config


def cmd_bootstrap_script(cluster: str = typer.Argument(..., help="Cluster name (clusters/<name>.yaml), scheduler nomad.")) -> None:
    """Print the TLS and gossip bootstrap script for a Nomad cluster (run it after the infra apply)."""
    from clusters.derive.nomad import derive_nomad_secrets
    from constructs_lib.nomad_bootstrap import render_bootstrap_script

    config = _nomad_config(cluster)
    typer.echo(render_bootstrap_script(cluster=config.name, project=config.gcp.project, region=config.nomad.region,
                                       secrets=derive_nomad_secrets(config), pki=config.nomad.tls.certificates == "vault-pki"), nl=False)


def _autoscaled_config(cluster: str):  # noqa: ANN202 - ClusterConfig, imported lazily like every command's dependencies
    """A Nomad cluster whose servers gpufleet runs, with the Prometheus scrape path (``nomad.autoscaler``)."""
    from clusters.derive.nomad import derive_nomad_servers

    config = _nomad_config(cluster)
    if derive_nomad_servers(config) is None or config.nomad.autoscaler is None:
        raise UserError(f"clusters/{cluster}.yaml: nomad.autoscaler: {cluster} runs no Nomad Autoscaler (it joins existing servers or has no"
                        " autoscaler block); nothing to scrape for it")
    return config


def _dump_yaml(data: object) -> None:
    import io

    from ruamel.yaml import YAML

    out = io.StringIO()
    YAML().dump(data, out)
    typer.echo(out.getvalue(), nl=False)


def cmd_scrape_config(cluster: str = typer.Argument(..., help="Cluster name (clusters/<name>.yaml), with nomad.autoscaler."),
                      blackbox: str | None = typer.Option(None, "--blackbox", metavar="ADDR",
                                                          help="The blackbox exporter's host:port: adds the TLS probe jobs"
                                                               " (certificate expiry of every server and client).")) -> None:
    """Print the Prometheus scrape jobs (YAML): every server, by GCE discovery (the Nomad Autoscaler's queue signal), and
    every GPU client's DCGM exporter (GPU telemetry); with --blackbox, a TLS probe of every agent's API."""
    from clusters.derive.nomad import derive_nomad_servers, server_tag
    from clusters.derive.pools import derive_gpu_pools
    from constructs_lib.nomad_autoscaler import render_scrape_config
    from constructs_lib.nomad_cert_expiry import render_tls_probe_config
    from constructs_lib.nomad_client_pool import client_tag
    from constructs_lib.nomad_gpu_node import render_gpu_scrape_config

    config = _autoscaled_config(cluster)
    if blackbox is not None and not _is_host_port(blackbox):
        raise UserError(f"--blackbox {blackbox!r}: not a host:port; allowed: the blackbox exporter's address such as blackbox.internal:9115")
    servers = derive_nomad_servers(config)
    server_zones = tuple(g.zone for g in servers.groups)
    pool_zones = tuple(dict.fromkeys(z for pool in derive_gpu_pools(config) for z in pool.zones))
    jobs = [render_scrape_config(cluster=config.name, project=config.gcp.project, zones=server_zones,
                                 server_tag=server_tag(config.name), nomad_region=config.nomad.region),
            render_gpu_scrape_config(cluster=config.name, project=config.gcp.project, zones=pool_zones, client_tag=client_tag(config.name))]
    if blackbox is not None:
        jobs += [render_tls_probe_config(cluster=config.name, kind=kind, project=config.gcp.project, zones=zones, tag=tag,
                                         nomad_region=config.nomad.region, blackbox=blackbox)
                 for kind, zones, tag in (("server", server_zones, server_tag(config.name)), ("client", pool_zones, client_tag(config.name)))]
    _dump_yaml({"scrape_configs": jobs})


def _is_host_port(address: str) -> bool:
    import re

    return re.fullmatch(r"[A-Za-z0-9.-]+:[0-9]{1,5}|\[[0-9A-Fa-f:]+\]:[0-9]{1,5}", address) is not None


def cmd_blackbox_module(cluster: str = typer.Argument(..., help="Cluster name (clusters/<name>.yaml), with nomad.autoscaler.")) -> None:
    """Print the blackbox exporter's module (YAML, blackbox.yml) that the TLS probe jobs of scrape-config --blackbox use."""
    from constructs_lib.nomad_cert_expiry import render_blackbox_module

    _autoscaled_config(cluster)
    _dump_yaml(render_blackbox_module())


def cmd_alert_rules(cluster: str = typer.Argument(..., help="Cluster name (clusters/<name>.yaml), with nomad.autoscaler.")) -> None:
    """Print the Prometheus alerting rules (YAML) on the agents' certificate expiry, from the TLS probe jobs."""
    from constructs_lib.nomad_cert_expiry import render_alert_rules

    config = _autoscaled_config(cluster)
    tls = config.nomad.tls
    _dump_yaml(render_alert_rules(cluster=config.name, renews=tls.certificates == "vault-pki", ttl_hours=tls.agent_cert_ttl_hours))


def cmd_pki_apply(cluster: str = typer.Argument(..., help="Cluster name, with nomad.tls.certificates: vault-pki."),
                  ca_cert: Path = typer.Option(..., "--ca-cert", exists=True, dir_okay=False, help="The cluster CA certificate (nomad-agent-ca.pem)."),
                  ca_key: Path = typer.Option(..., "--ca-key", exists=True, dir_okay=False, help="The cluster CA key (nomad-agent-ca-key.pem).")) -> None:
    """Create the cluster's PKI mount, roles, policies and VM-identity login roles, and import its CA
    (VAULT_ADDR, VAULT_TOKEN: an operator token). The bootstrap script runs it."""
    import hvac.exceptions

    from clusters.derive.nomad import derive_nomad_pki
    from gpufleet.vault_cmd import _client_from_env
    from vault_policies.nomad_pki import apply_pki, import_ca

    config = _nomad_config(cluster)
    spec = derive_nomad_pki(config)
    if spec is None:
        raise UserError(f"clusters/{cluster}.yaml: nomad.tls.certificates: {cluster} uses static certificates; allowed: vault-pki;"
                        " set nomad.tls.certificates: vault-pki first (docs/nomad.md)")
    client = _client_from_env()
    try:
        apply_pki(client, spec)
        import_ca(client, spec, ca_cert_pem=ca_cert.read_text(), ca_key_pem=ca_key.read_text())
    except hvac.exceptions.Forbidden as exc:
        raise UserError(f"Vault refused the PKI setup of {cluster}: {str(exc).splitlines()[-1].strip() or exc}; use an operator (root) token") from None
    typer.echo(f"{spec.mount}: roles {', '.join(r.name for r in spec.roles)}, login roles {', '.join(r.auth_role for r in spec.roles)}, CA imported")


def cmd_acl_bootstrap(cluster: str = typer.Argument(..., help="Cluster name (clusters/<name>.yaml), scheduler nomad."),
                      wait_seconds: float = typer.Option(600, "--wait-seconds", min=0, help="How long to wait for the servers' leader.")) -> None:
    """Bootstrap the cluster's Nomad ACLs once; the management token goes to OpenBao/Vault KV only (safe to repeat).

    Nomad: NOMAD_ADDR, NOMAD_CACERT, NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY. OpenBao/Vault: VAULT_ADDR, VAULT_TOKEN."""
    import os

    from gpufleet.nomad_acl import NomadApi, bootstrap
    from gpufleet.vault_cmd import _client_from_env

    config = _nomad_config(cluster)
    address = os.environ.get("NOMAD_ADDR")
    if not address:
        raise UserError("NOMAD_ADDR is not set; set it to the cluster's API, e.g. https://<nomad_address output>:4646 (the bootstrap script does)")
    api = NomadApi(address, os.environ.get("NOMAD_CACERT"), os.environ.get("NOMAD_CLIENT_CERT"), os.environ.get("NOMAD_CLIENT_KEY"))
    bootstrap(cluster=config.name, api=api, vault=_client_from_env(), wait_seconds=wait_seconds, say=typer.echo)


def register(app: typer.Typer) -> None:
    nomad = typer.Typer(help="Nomad cluster operations: TLS/gossip bootstrap, PKI setup, Prometheus scrape jobs and alerts.", no_args_is_help=True)
    nomad.command("bootstrap-script")(cmd_bootstrap_script)
    nomad.command("scrape-config")(cmd_scrape_config)
    nomad.command("blackbox-module")(cmd_blackbox_module)
    nomad.command("alert-rules")(cmd_alert_rules)
    nomad.command("pki-apply")(cmd_pki_apply)
    nomad.command("acl-bootstrap")(cmd_acl_bootstrap)
    app.add_typer(nomad, name="nomad")
