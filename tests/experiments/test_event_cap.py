"""Repeated identical requests do not grow the event log (issue 22), on real SQLite and PostgreSQL.

The red team repeated the cancel of a run whose stop was already requested: every call appended
a "cancel requested" row. A request that changes nothing now writes nothing; the first one is
still the audit record, and the answer stays 202 (the cancel is idempotent for the caller).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

REPEATS = 40


def _events(svc, exp_id: str, headers: dict[str, str]) -> list[tuple[str, str | None, str]]:
    answer = svc.client.get(f"/api/v1/experiments/{exp_id}/events", headers=headers)
    assert answer.status_code == 200, answer.text
    return [(e["kind"], e["to"], e["message"]) for e in answer.json()["events"]]


def test_repeated_cancels_of_a_dispatched_run_append_one_event(make_service, db_url, nomad, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    svc.step()  # dispatched through the Nomad double with a real wrapped secret_id: no longer cancellable at once
    assert svc.client.get(f"/api/v1/experiments/{exp['id']}", headers=headers).json()["status"] == "provisioning"
    before = _events(svc, exp["id"], headers)
    answers = [svc.client.post(f"/api/v1/experiments/{exp['id']}/cancel", headers=headers) for _ in range(REPEATS)]
    assert {a.status_code for a in answers} == {202}
    after = _events(svc, exp["id"], headers)
    assert after[len(before):] == [("request", None, "cancel requested")]


def test_concurrent_cancels_record_one_request(make_service, db_url, nomad, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    svc.step()
    before = len(_events(svc, exp["id"], headers))
    with ThreadPoolExecutor(max_workers=8) as pool:
        codes = list(pool.map(lambda _: svc.client.post(f"/api/v1/experiments/{exp['id']}/cancel", headers=headers).status_code, range(16)))
    assert set(codes) == {202}
    assert [e for e in _events(svc, exp["id"], headers)[before:] if e[0] == "request"] == [("request", None, "cancel requested")]


def test_repeated_cancels_of_a_cancelled_run_are_409_and_append_nothing(make_service, db_url, nomad_runner):
    svc = make_service(db_url, nomad_runner)
    headers = svc.token("finetune")
    exp = svc.submit(headers).json()
    assert svc.client.post(f"/api/v1/experiments/{exp['id']}/cancel", headers=headers).json()["status"] == "cancelled"
    before = _events(svc, exp["id"], headers)
    assert {svc.client.post(f"/api/v1/experiments/{exp['id']}/cancel", headers=headers).status_code for _ in range(REPEATS)} == {409}
    assert _events(svc, exp["id"], headers) == before
