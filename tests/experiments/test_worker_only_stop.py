"""``gpufleet serve --worker-only`` stopped in the moment between its first heartbeat and its threads.

`Worker.start()` writes the first heartbeat row before it starts its loops. A SIGTERM (how systemd and
Kubernetes stop a worker) that lands in that moment must still leave cleanly: exit 0 and no heartbeat
row left behind to go stale. The subprocess test in test_scale_out.py hits the window only by chance;
here the interrupt is raised right after the first beat is written, every time, in process."""
from __future__ import annotations

import shutil

from sqlalchemy import select
from typer.testing import CliRunner

from tests.conftest import FLEET_CLUSTERS, REPO_ROOT


def worker_repo(tmp_path):
    """A repository of the example fleet's cluster files, jobs and Vault roles: what `serve` loads."""
    repo = tmp_path / "repo"
    (repo / "clusters").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "cdktf.json", repo / "cdktf.json")
    for path in FLEET_CLUSTERS.glob("*.yaml"):
        shutil.copy(path, repo / "clusters" / path.name)
    for tree in ("jobs", "vault_policies"):  # the job catalog and the roles it checks jobs against
        shutil.copytree(REPO_ROOT / tree, repo / tree, ignore=shutil.ignore_patterns("out", "__pycache__"))
    return repo


def test_a_sigterm_right_after_the_first_heartbeat_exits_0_and_removes_the_row(tmp_path, pg_url, monkeypatch):
    import clusters.repo
    from experiments import db
    from experiments.background.membership import Membership
    from experiments.db import database_url
    from experiments.models import WorkerBeat
    from gpufleet.cli import app

    beat = Membership.beat
    beats: list[int] = []

    def beat_then_sigterm(self, sessions, now):
        beat(self, sessions, now)  # the row is written ...
        beats.append(1)
        if len(beats) == 1:
            raise KeyboardInterrupt  # ... and the SIGTERM handler's interrupt arrives before any thread starts

    monkeypatch.setattr(Membership, "beat", beat_then_sigterm)
    try:
        result = CliRunner().invoke(app, ["--repo", str(worker_repo(tmp_path)), "serve", "--worker-only", "--scheduler", "local", "--db", pg_url])
    finally:
        clusters.repo.use(None)  # --repo pins the process: the next tests read this checkout again
    assert beats == [1], "the interrupt was meant to land in the first beat"
    assert result.exit_code == 0, result.output
    engine = db.make_engine(database_url(pg_url))
    try:
        with db.session_factory(engine)() as session:
            assert session.scalars(select(WorkerBeat)).all() == []
    finally:
        engine.dispose()
