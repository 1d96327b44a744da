"""What admission checks against: the cluster files, the Vault view and the job files,
through the same loader ``gpufleet check`` uses (``jobs.loader.load``: schema, cross-checks
against clusters/ and vault_policies/). Cluster and Vault files are read once at start-up;
a job file is re-read when it changes on disk. An admitted experiment keeps the document it was
checked from (``admit``) and is dispatched from that (``frozen``), never from the file as edited later."""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import clusters
from clusters import repo
from clusters.derive.tenants import TenantSpec, derive_tenants
from clusters.errors import ConfigError, Problem
from clusters.source import did_you_mean
from clusters.schema import ClusterConfig
from experiments.errors import ApiError
from jobs.loader import document_sha256, job_files, load_admitted, load_frozen, load_text
from jobs.spec import FinetuneSpec
from jobs.vault_refs import VaultView, load_vault_view


# How an ad-hoc job file is named in errors: the request body's field, never a path on the server.
ADHOC_SOURCE = Path("job_file")
RACY_S = 2  # seconds after jobs/ last changed before its listing is kept (Catalog._job_files)
# Checked specs of frozen documents kept (``Catalog.frozen``); ad-hoc job files make one document each.
FROZEN_KEPT = 256


def _settled(mtime_ns: int) -> bool:
    """Whether a stamp is older than ``RACY_S``: only then can a later change no longer share its tick."""
    return time.time_ns() - mtime_ns > RACY_S * 1_000_000_000


class Catalog:
    def __init__(self, jobs_dir: Path | None = None, *, configs: tuple[ClusterConfig, ...] | None = None, vault: VaultView | None = None) -> None:
        self.jobs_dir = Path(jobs_dir or repo.jobs_dir())
        self.configs = configs if configs is not None else clusters.load_all()
        self.vault = vault if vault is not None else load_vault_view()
        self._by_name = {c.name: c for c in self.configs}
        self._cache: dict[Path, tuple[tuple[int, int, int], FinetuneSpec, dict[str, Any]]] = {}  # (mtime ns, size, inode)
        self._frozen: OrderedDict[tuple[str, str], FinetuneSpec] = OrderedDict()  # the FROZEN_KEPT most recently used
        self._lock = threading.Lock()
        self._listing: tuple[int, dict[str, Path]] | None = None  # (jobs/'s mtime in ns, the job files by name)

    def job(self, name: str) -> FinetuneSpec:
        """The checked spec of job ``name``; an unknown name or a bad file is a 422 on field ``job``."""
        return self.admit(name)[0]

    def admit(self, name: str) -> tuple[FinetuneSpec, dict[str, Any]]:
        """The checked spec of job ``name`` and the document it was checked from (what an admitted
        experiment freezes); an unknown name or a bad file is a 422 on field ``job``.

        The name is looked up among the job files' names, never joined into a path: a name with
        ``/`` or ``..``, or one of a file that exists outside ``jobs/``, gets the very same answer
        as any unknown name, so the API is no oracle for files on the server (issue 22).
        """
        files = self._job_files()
        path = files.get(name)
        try:
            status = path.stat() if path is not None else None
        except FileNotFoundError:
            status = None  # removed since the listing was taken: as unknown as a name never listed
        if path is None or status is None:
            raise ApiError(422, f"no job {name!r}{did_you_mean(name, files)}", field="job",
                           fix=f"allowed: {', '.join(sorted(files)) or '(none)'}; name a job file of {self.jobs_dir.name}/ without its suffix")
        stamp = (status.st_mtime_ns, status.st_size, status.st_ino)
        with self._lock:
            cached = self._cache.get(path)
        if cached and cached[0] == stamp:
            return cached[1], cached[2]
        try:
            spec, document = load_admitted(path, cluster_configs=self.configs, vault=self.vault)
        except ConfigError as exc:
            raise ApiError(422, f"job file {path.name} does not pass gpufleet check: {self._relative(exc.problems[0])}", field="job",
                           fix="fix the job file (gpufleet check lists every problem) and submit again") from None
        if _settled(status.st_mtime_ns):
            # Kept only once the file is older than RACY_S, for the reason _job_files gives: a second write
            # in the same mtime tick as the one read here would leave the stamp as it is.
            with self._lock:
                self._cache[path] = (stamp, spec, document)
        return spec, document

    def _job_files(self) -> dict[str, Path]:
        """The job files by name (.yaml wins over .yml, as jobs.loader.find), listed again only when
        jobs/ changed: adding, removing or renaming a file in it moves the directory's mtime, and an edit
        in place is caught by the file's own mtime in ``admit``. Listing (two globs) costs about 0.1 ms of
        CPU on every submission, a stat about 4 us. A listing taken less than ``RACY_S`` after the
        directory's last change is not kept (git's "racy clean" rule): the kernel stamps mtimes from a
        coarse clock, so a second change within the same tick would leave the stamp as it was."""
        try:
            stamp = self.jobs_dir.stat().st_mtime_ns
        except OSError:
            stamp = None  # no jobs/: nothing to list, nothing to keep
        with self._lock:
            listing = self._listing
        if stamp is not None and listing is not None and listing[0] == stamp:
            return listing[1]
        files = {p.stem: p for p in reversed(job_files(self.jobs_dir))}
        if stamp is not None and _settled(stamp):
            with self._lock:
                self._listing = (stamp, files)
        return files

    def admit_text(self, text: str) -> tuple[FinetuneSpec, dict[str, Any]]:
        """An ad-hoc job file sent in the request (``job_file``), checked by the loader exactly as a file of
        jobs/ (schema, secret detector, cross-checks against the cluster and Vault files); a problem is a
        422 naming ``job_file``, its line and field. Whether the tenant may send one is ``adhoc_allowed``."""
        try:
            return load_text(text, ADHOC_SOURCE, cluster_configs=self.configs, vault=self.vault)
        except ConfigError as exc:
            first = exc.problems[0]
            more = f" (and {len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
            raise ApiError(422, f"{self._relative(first)}{more}", field=f"job_file.{first.field}" if first.field else "job_file",
                           fix="fix that line of the job file (the same checks as gpufleet check) and submit again") from None

    def adhoc_allowed(self, tenant: str, cluster: str | None = None) -> bool:
        """Whether ``tenant`` has ``adhoc_jobs: true`` in the cluster file of ``cluster`` (None: in any cluster)."""
        configs = self.configs if cluster is None else tuple(c for c in self.configs if c.name == cluster)
        return any(t.adhoc_jobs for c in configs for t in c.tenants if t.name == tenant)

    def frozen(self, name: str, document: dict[str, Any] | None, sha256: str | None) -> FinetuneSpec:
        """The spec an experiment was admitted with: its frozen document, checked again against
        today's cluster and Vault files, never the job file as it reads now (edited or deleted, issue
        25). A row admitted before documents were kept (``document`` None) reads the file.

        The checked spec is kept per job name and digest: this catalog's cluster and Vault files are
        read once, at start-up, so the same document always checks to the same spec, and a dispatch
        burst of one job ran the schema and the secret detector once per run (about 0.7 ms of CPU each,
        most of a worker's non-I/O time besides the HTTP and database calls). The digest is still
        computed from the row's document every time, so an altered row is refused as before, and a
        document that fails its checks is never kept (it is checked, and refused, every time)."""
        if document is None:
            return self.job(name)
        if sha256 != document_sha256(document):
            raise ApiError(422, f"the admitted document of job {name} does not match its digest", field="job",
                           fix="the database row was altered; submit the job again")
        with self._lock:
            known = self._frozen.get((name, sha256))
            if known is not None:
                self._frozen.move_to_end((name, sha256))
                return known
        try:
            spec = load_frozen(document, self.jobs_dir / f"{name}.yaml", cluster_configs=self.configs, vault=self.vault)
        except ConfigError as exc:
            raise ApiError(422, f"job {name} as admitted no longer passes gpufleet check: {self._relative(exc.problems[0])}", field="job",
                           fix="the cluster or Vault files changed since admission; submit the job again") from None
        with self._lock:
            self._frozen[(name, sha256)] = spec
            while len(self._frozen) > FROZEN_KEPT:
                self._frozen.popitem(last=False)
        return spec

    def _relative(self, problem: Problem) -> str:
        """The problem with paths relative to the repository (the parent of jobs/): an API answer never
        carries the server's absolute paths."""
        root = self.jobs_dir.resolve().parent
        file = Path(problem.file)
        try:
            shown = str(file.resolve().relative_to(root)) if file.is_absolute() else problem.file
        except ValueError:
            shown = file.name
        message = problem.message.replace(f"{root}{os.sep}", "").replace(str(root), ".")
        return str(Problem(shown, problem.line, problem.field, message))

    def region(self, cluster: str) -> str | None:
        config = self._by_name.get(cluster)
        return config.gcp.region if config else None

    def tenant(self, cluster: str, name: str) -> TenantSpec | None:
        config = self._by_name.get(cluster)
        return next((t for t in derive_tenants(config) if t.name == name), None) if config else None
