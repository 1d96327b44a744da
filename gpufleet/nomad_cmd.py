"""Nomad operator commands: ``gpufleet nomad bootstrap-script <cluster>``.

The script it prints creates the cluster's CA, agent certificates and gossip key with the
``nomad`` CLI and stores them as Secret Manager versions, where the agents' boot scripts read
them; gpufleet itself never sees or stores a key.
"""

from __future__ import annotations

import typer

from clusters.errors import UserError


def cmd_bootstrap_script(cluster: str = typer.Argument(..., help="Cluster name (clusters/<name>.yaml), scheduler nomad.")) -> None:
    """Print the TLS and gossip bootstrap script for a Nomad cluster (run it after the infra apply)."""
    import clusters
    from clusters.derive.nomad import derive_nomad_secrets
    from clusters.source import did_you_mean
    from constructs_lib.nomad_bootstrap import render_bootstrap_script

    configs = {c.name: c for c in clusters.load_all()}
    nomad = sorted(n for n, c in configs.items() if c.nomad is not None)
    config = configs.get(cluster)
    if config is None or config.nomad is None:
        raise UserError(f"{cluster!r} is not a Nomad cluster in clusters/{did_you_mean(cluster, nomad)}; allowed: {', '.join(nomad) or '(none)'}")
    typer.echo(render_bootstrap_script(cluster=config.name, project=config.gcp.project, region=config.nomad.region,
                                       secrets=derive_nomad_secrets(config)), nl=False)


def register(app: typer.Typer) -> None:
    nomad = typer.Typer(help="Nomad cluster operations: TLS/gossip bootstrap.", no_args_is_help=True)
    nomad.command("bootstrap-script")(cmd_bootstrap_script)
    app.add_typer(nomad, name="nomad")
