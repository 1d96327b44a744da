"""``gpufleet api token create|list|revoke``: shown once, stored hashed, revocable, audited."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import select

from experiments import db
from experiments.app import ServiceSettings, create_app
from experiments.models import ApiToken, Event
from gpufleet.cli import main
from tests.experiments.conftest import UnusedRunner


def test_token_create_list_revoke(sqlite_url, catalog, capsys):
    assert main(["api", "token", "create", "--tenant", "finetune", "--name", "ci", "--db", sqlite_url, "--quiet"]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("gfx_") and len(token) > 40
    engine = db.make_engine(sqlite_url)
    with db.session_factory(engine)() as session:
        row = session.scalars(select(ApiToken)).one()
        audit = [e.message for e in session.scalars(select(Event))]
    assert row.tenant == "finetune" and row.token_sha256 != token and token not in repr(row.__dict__)
    assert audit == [f"created token {row.id} for tenant finetune"]
    app = create_app(ServiceSettings(db_url=sqlite_url, worker=False), runner=UnusedRunner(), catalog=catalog)
    with TestClient(app) as client:
        assert client.get("/api/v1/experiments", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        assert main(["api", "token", "list", "--db", sqlite_url]) == 0
        listed = capsys.readouterr().out
        assert row.id in listed and token not in listed
        assert main(["api", "token", "revoke", row.id, "--db", sqlite_url]) == 0
        assert client.get("/api/v1/experiments", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    engine.dispose()


def test_fails_when_the_tenant_is_unknown_or_both_or_neither_are_given(sqlite_url, capsys):
    assert main(["api", "token", "create", "--tenant", "fintune", "--db", sqlite_url]) == 2
    assert "is not a tenant of any cluster file; allowed: " in capsys.readouterr().err
    assert main(["api", "token", "create", "--db", sqlite_url]) == 2
    assert main(["api", "token", "create", "--tenant", "eval", "--admin", "--db", sqlite_url]) == 2
    assert main(["api", "token", "revoke", "nope", "--db", sqlite_url]) == 2
    assert "no token 'nope'" in capsys.readouterr().err
