"""What admission checks against: the cluster files, the Vault view and the job files,
through the same loader ``gpufleet check`` uses (``jobs.loader.load``: schema, cross-checks
against clusters/ and vault_policies/). Cluster and Vault files are read once at start-up;
a job file is re-read when it changes on disk."""

from __future__ import annotations

import threading
from pathlib import Path

import clusters
from clusters import repo
from clusters.derive.tenants import TenantSpec, derive_tenants
from clusters.errors import ConfigError, UserError
from clusters.schema import ClusterConfig
from experiments.errors import ApiError, split_message
from jobs.loader import find, load
from jobs.spec import FinetuneSpec
from jobs.vault_refs import VaultView, load_vault_view


class Catalog:
    def __init__(self, jobs_dir: Path | None = None, *, configs: tuple[ClusterConfig, ...] | None = None, vault: VaultView | None = None) -> None:
        self.jobs_dir = Path(jobs_dir or repo.jobs_dir())
        self.configs = configs if configs is not None else clusters.load_all()
        self.vault = vault if vault is not None else load_vault_view()
        self._by_name = {c.name: c for c in self.configs}
        self._cache: dict[Path, tuple[float, FinetuneSpec]] = {}
        self._lock = threading.Lock()

    def job(self, name: str) -> FinetuneSpec:
        """The checked spec of job ``name``; a bad name or file is a 422 on field ``job``."""
        try:
            path = find(name, self.jobs_dir)
        except UserError as exc:
            error, fix = split_message(str(exc))
            raise ApiError(422, error, field="job", fix=fix) from None
        if path.parent.resolve() != self.jobs_dir.resolve():
            raise ApiError(422, f"job {name!r} is not a job name", field="job", fix=f"name a file in {self.jobs_dir.name}/ without its .yaml suffix")
        mtime = path.stat().st_mtime
        with self._lock:
            cached = self._cache.get(path)
        if cached and cached[0] == mtime:
            return cached[1]
        try:
            spec = load(path, cluster_configs=self.configs, vault=self.vault)
        except ConfigError as exc:
            first = exc.problems[0]
            raise ApiError(422, f"job file {path.name} does not pass gpufleet check: {first}", field="job",
                           fix="fix the job file (gpufleet check lists every problem) and submit again") from None
        with self._lock:
            self._cache[path] = (mtime, spec)
        return spec

    def region(self, cluster: str) -> str | None:
        config = self._by_name.get(cluster)
        return config.gcp.region if config else None

    def tenant(self, cluster: str, name: str) -> TenantSpec | None:
        config = self._by_name.get(cluster)
        return next((t for t in derive_tenants(config) if t.name == name), None) if config else None
