"""``gpufleet ci nomad-tls <stack>``: the Nomad CA, client certificate and key of a CI plan job, as files.

The nomad provider reads its mTLS material from files named by ``NOMAD_CACERT``, ``NOMAD_CLIENT_CERT``
and ``NOMAD_CLIENT_KEY`` (its defaults for ``ca_file``, ``cert_file``, ``key_file``:
hashicorp/terraform-provider-nomad v2.5.2 ``nomad/provider.go:44-75``). CI holds them in one secret,
``NOMAD_PLAN_TLS``: a JSON object ``{"<cluster>": {"ca": PEM, "cert": PEM, "key": PEM}}``. GitHub masks a
secret's value as a whole, and the PEM lines decoded from JSON are not that value, so every line of
their bodies is masked here (``::add-mask::``) before anything else happens; the files are written 0600 in a 0700
directory, their paths go to ``$GITHUB_ENV``, and nothing of their content is ever printed otherwise.
The workflow removes the directory in an ``always()`` step after the plan.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from clusters.errors import UserError

SECRET = "NOMAD_PLAN_TLS"
# file name, environment variable the provider reads, key in the secret's cluster object
FILES = (("ca.pem", "NOMAD_CACERT", "ca"), ("client.pem", "NOMAD_CLIENT_CERT", "cert"), ("client-key.pem", "NOMAD_CLIENT_KEY", "key"))


def _material(raw: str, cluster: str) -> Mapping[str, str]:
    fix = f"set the CI secret {SECRET} to a JSON object {{\"{cluster}\": {{\"ca\": ..., \"cert\": ..., \"key\": ...}}}} (PEM text)"
    try:
        tls = json.loads(raw) if raw else None
    except json.JSONDecodeError:
        raise UserError(f"{SECRET} is not JSON; {fix}") from None
    entry = tls.get(cluster) if isinstance(tls, dict) else None
    if not isinstance(entry, dict) or any(not isinstance(entry.get(k), str) or "-----BEGIN " not in entry[k] for _, _, k in FILES):
        raise UserError(f"{SECRET} has no ca, cert and key PEM for cluster {cluster!r}; {fix}")
    return entry


def write_nomad_tls(*, cluster: str, raw: str, directory: Path, github_env: Path | None, emit: Callable[[str], None]) -> dict[str, Path]:
    """Mask, write and export; returns {environment variable: file}."""
    entry = _material(raw, cluster)
    body = dict.fromkeys(line.strip() for _, _, key in FILES for line in entry[key].splitlines()
                         if line.strip() and not line.startswith("-----"))
    for line in body:
        emit(f"::add-mask::{line}")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    written = {}
    for name, variable, key in FILES:
        path = directory / name
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(entry[key] if entry[key].endswith("\n") else entry[key] + "\n")
        written[variable] = path
    if github_env is not None:
        with github_env.open("a", encoding="utf-8") as handle:
            handle.writelines(f"{variable}={path}\n" for variable, path in written.items())
    emit(f"wrote the Nomad CA, client certificate and key of {cluster} (mode 0600) under {directory}")
    return written
