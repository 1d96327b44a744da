"""No secret in the database, the logs or an API response; Alembic up and down on both databases."""

from __future__ import annotations

import logging

from sqlalchemy import inspect, text

from experiments import db
from jobs.nomad.render import META_WRAPPED_SECRET_ID


def _database_text(svc) -> str:
    """Every row of every table as text (on SQLite also the raw file and its WAL)."""
    engine = svc.ctx.sessions.kw["bind"]
    chunks = []
    with engine.connect() as connection:
        for table in inspect(connection).get_table_names():
            chunks.extend(repr(tuple(row)) for row in connection.execute(text(f"SELECT * FROM {table}")))
    if svc.db_url.startswith("sqlite"):
        path = engine.url.database
        for suffix in ("", "-wal"):
            try:
                with open(path + suffix, "rb") as handle:
                    chunks.append(handle.read().decode("latin-1"))
            except FileNotFoundError:
                pass
    return "\n".join(chunks)


def test_no_secret_reaches_the_database_logs_or_responses(make_service, db_url, nomad, nomad_runner, vault, caplog):
    caplog.set_level(logging.DEBUG)
    svc = make_service(db_url, nomad_runner)
    headers = svc.token("finetune")
    admin = svc.token(None, admin=True)
    responses = []
    first = svc.submit(headers)
    second = svc.submit(headers, meta={"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "r2"})
    responses += [first.text, second.text]
    svc.step()
    for job_id in nomad.dispatched("finetune-llama"):
        nomad.finish(job_id, client_status="running")
    svc.step()
    responses.append(svc.client.post(f"/api/v1/experiments/{second.json()['id']}/cancel", headers=headers).text)
    nomad.finish(nomad.dispatched("finetune-llama")[0], client_status="complete", events=[{"Type": "Terminated", "Time": 1, "ExitCode": 0}])
    svc.step()
    for exp in (first.json(), second.json()):
        for path in ("", "/events"):
            responses.append(svc.client.get(f"/api/v1/experiments/{exp['id']}{path}", headers=headers).text)
    responses += [svc.client.get(p, headers=admin).text for p in ("/api/v1/experiments", "/api/v1/costs", "/metrics", "/healthz")]
    wrapping_tokens = [call.body["Meta"][META_WRAPPED_SECRET_ID] for call in nomad.calls("POST", "dispatch")]
    assert len(wrapping_tokens) == 2 and all(len(t) > 20 for t in wrapping_tokens)
    secrets = {
        *wrapping_tokens,
        vault.orchestrator.token,
        nomad.acl_token,
        headers["Authorization"].removeprefix("Bearer "),
        admin["Authorization"].removeprefix("Bearer "),
    }
    haystacks = {"database": _database_text(svc), "logs": caplog.text, "responses": "\n".join(responses)}
    assert "dispatched experiment" in caplog.text  # the logs were captured, so the scan means something
    for where, haystack in haystacks.items():
        leaked = [f"{s[:6]}..." for s in secrets if s in haystack]
        assert not leaked, f"secret values found in the {where}: {leaked}"


def test_alembic_upgrades_from_empty_and_downgrades_one_step(db_url):
    engine = db.make_engine(db_url)
    try:
        assert db.current_revision(engine) is None
        db.upgrade(engine)
        assert db.current_revision(engine) == "0013_attempts"
        assert "run_attempts" in set(inspect(engine).get_table_names())
        assert {"attempt", "failure_class", "prior_gpu_hours"} <= {c["name"] for c in inspect(engine).get_columns("experiments")}
        assert "attempt" in {c["name"] for c in inspect(engine).get_columns("events")}
        db.downgrade(engine, "-1")
        assert db.current_revision(engine) == "0012_release" and "run_attempts" not in set(inspect(engine).get_table_names())
        assert "attempt" not in {c["name"] for c in inspect(engine).get_columns("experiments")}
        assert {"released_at", "release_held"} <= {c["name"] for c in inspect(engine).get_columns("experiments")}
        db.downgrade(engine, "-1")
        assert db.current_revision(engine) == "0011_pool_usage" and "released_at" not in {c["name"] for c in inspect(engine).get_columns("experiments")}
        assert {"experiments", "events", "outbox", "api_tokens", "run_logs", "scheduler_identities", "run_usage", "dashboard_sessions",
                "pool_usage", "workers"} <= set(inspect(engine).get_table_names())
        db.downgrade(engine, "-1")
        assert db.current_revision(engine) == "0010_budgets" and not {"pool_usage", "workers"} & set(inspect(engine).get_table_names())
        assert "claimed_by" not in {c["name"] for c in inspect(engine).get_columns("outbox")}
        assert "util_max_pct" in {c["name"] for c in inspect(engine).get_columns("run_usage")}
        assert "changed_at" in {c["name"] for c in inspect(engine).get_columns("run_logs")}
        db.downgrade(engine, "-1")
        assert db.current_revision(engine) == "0009" and "changed_at" not in {c["name"] for c in inspect(engine).get_columns("run_logs")}
        assert {"experiments", "events", "outbox", "api_tokens", "run_logs", "scheduler_identities", "run_usage", "dashboard_sessions"} <= set(inspect(engine).get_table_names())
        assert {"scheduler_refs", "job_spec", "job_spec_sha256"} <= {c["name"] for c in inspect(engine).get_columns("experiments")}
        assert inspect(engine).get_pk_constraint("run_logs")["constrained_columns"] == ["experiment_id", "rank", "stream"]
        db.downgrade(engine, "-1")
        assert db.current_revision(engine) == "0008" and "job_spec" not in {c["name"] for c in inspect(engine).get_columns("experiments")}
        db.downgrade(engine, "-1")
        assert db.current_revision(engine) == "0007" and "rank" not in {c["name"] for c in inspect(engine).get_columns("run_logs")}
        db.downgrade(engine, "-1")
        assert db.current_revision(engine) == "0006" and "dashboard_sessions" not in set(inspect(engine).get_table_names())
        db.downgrade(engine, "-1")
        assert db.current_revision(engine) == "0005" and "run_usage" not in set(inspect(engine).get_table_names())
        db.downgrade(engine, "-1")
        assert db.current_revision(engine) == "0004" and "scheduler_identities" not in set(inspect(engine).get_table_names())
        db.downgrade(engine, "-1")
        assert db.current_revision(engine) == "0003" and "run_logs" not in set(inspect(engine).get_table_names())
        db.downgrade(engine, "-1")
        assert db.current_revision(engine) == "0002"
        assert "scheduler_refs" not in {c["name"] for c in inspect(engine).get_columns("experiments")}
        db.downgrade(engine, "-1")
        assert db.current_revision(engine) == "0001"
        tables = set(inspect(engine).get_table_names())
        assert "api_tokens" not in tables and {"experiments", "events", "outbox"} <= tables
        db.upgrade(engine)
        assert db.current_revision(engine) == "0013_attempts"
    finally:
        engine.dispose()


def test_a_credential_sent_as_the_job_name_or_idempotency_key_is_refused_unshown_and_unstored(make_service, sqlite_url, nomad_runner):
    """Fields echoed by later errors or stored as they are (the job name, the Idempotency-Key)
    get the same detector as meta: refused with 422 before any lookup, the value never echoed."""
    import random

    from tests.safety.test_secret_matrix import NEW_FORMATS

    svc = make_service(sqlite_url, nomad_runner)
    headers = svc.token("finetune")
    planted = NEW_FORMATS(random.Random(7))
    for kind in ("nvidia-ngc", "groq", "age-secret-key"):
        value = planted[kind]
        as_job = svc.submit(headers, job=value)
        as_key = svc.client.post("/api/v1/experiments", headers={**headers, "Idempotency-Key": value},
                                 json={"job": "finetune-llama", "meta": {"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "r1"}})
        for answer, field in ((as_job, "job"), (as_key, "Idempotency-Key")):
            assert answer.status_code == 422 and answer.json()["field"] == field, answer.text
            assert value[-12:] not in answer.text
    assert all(planted[k][-12:] not in _database_text(svc) for k in ("nvidia-ngc", "groq", "age-secret-key"))
