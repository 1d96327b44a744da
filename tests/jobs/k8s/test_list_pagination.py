"""Tracked lists: selected by value, paginated like the API server, within a budget.

The double's chunking is checked first against what the API server does (kubernetes/website
``api-concepts.md`` "Retrieving large results sets in chunks"; apimachinery ``ListMeta``: the
list resourceVersion constant across pages, later objects not shown in a continuation,
``remainingItemCount`` only without selectors, 410 ``Expired`` with an inconsistent continue
token once the snapshot is compacted), then the client against it."""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.error import HTTPError
from urllib.parse import urlencode
from urllib.request import Request, urlopen

import pytest

from jobs.k8s import client as k8s_client
from jobs.k8s.client import ListBudget

NS = "research"


def _put(k8s: Any, name: str, run_label: str) -> None:
    with k8s._lock:
        k8s.store.version += 1
        k8s.store.objects[("jobs", NS, name)] = {
            "apiVersion": "batch/v1", "kind": "Job", "status": {},
            "metadata": {"name": name, "namespace": NS, "uid": str(uuid.uuid4()), "resourceVersion": str(k8s.store.version),
                         "labels": {"gpufleet.dev/run": run_label}}}


def _get(k8s: Any, **query: str) -> tuple[int, dict[str, Any]]:
    request = Request(f"{k8s.address}/apis/batch/v1/namespaces/{NS}/jobs?{urlencode(query)}", headers={"Authorization": f"Bearer {k8s.token}"})
    try:
        with urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_double_chunks_lists_like_the_api_server(k8s: Any) -> None:
    for i in range(5):
        _put(k8s, f"run-{i}", f"run-{i}")
    status, first = _get(k8s, limit="2")
    assert status == 200 and [j["metadata"]["name"] for j in first["items"]] == ["run-0", "run-1"]
    assert first["metadata"]["continue"] and first["metadata"]["remainingItemCount"] == 3
    _put(k8s, "run-9", "run-9")  # created after the first chunk: not in this list's snapshot
    _, second = _get(k8s, limit="2", **{"continue": first["metadata"]["continue"]})
    _, third = _get(k8s, limit="2", **{"continue": second["metadata"]["continue"]})
    assert [j["metadata"]["name"] for j in second["items"] + third["items"]] == ["run-2", "run-3", "run-4"]
    assert first["metadata"]["resourceVersion"] == second["metadata"]["resourceVersion"] == third["metadata"]["resourceVersion"]
    assert "continue" not in third["metadata"]
    _, selected = _get(k8s, limit="1", labelSelector="gpufleet.dev/run in (run-1,run-3)")
    assert [j["metadata"]["name"] for j in selected["items"]] == ["run-1"] and "remainingItemCount" not in selected["metadata"]
    k8s.compact()
    status, expired = _get(k8s, limit="1", labelSelector="gpufleet.dev/run in (run-1,run-3)", **{"continue": selected["metadata"]["continue"]})
    assert status == 410 and expired["reason"] == "Expired" and expired["code"] == 410
    assert expired["message"].startswith("The provided continue parameter is too old to display a consistent list result.")
    assert expired["metadata"]["continue"]  # the inconsistent remainder the server offers


def test_tracked_lists_read_only_the_tracked_names_page_by_page(k8s: Any, k8s_client_for: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(k8s_client, "PAGE_LIMIT", 2)
    monkeypatch.setattr(k8s_client, "NAMES_PER_SELECTOR", 3)
    for i in range(7):
        _put(k8s, f"run-{i}", f"run-{i}")
    for i in range(50):
        _put(k8s, f"junk-{i:02d}", f"junk-{i:02d}")  # the run label with other values
    client = k8s_client_for(k8s)
    tracked = [f"run-{i}" for i in range(7)]
    listing = client.list_tracked(NS, tracked, ListBudget(max_objects=100, max_seconds=60))
    assert sorted(listing.jobs) == tracked and listing.jobs_complete and listing.workloads_complete
    assert k8s.listed[("jobs", NS)] == 7  # no junk decoded
    lists = [r for r in k8s.requests if r.path == f"/apis/batch/v1/namespaces/{NS}/jobs"]
    assert all(r.query["limit"] == ["2"] for r in lists) and sum("continue" in r.query for r in lists) >= 2


def test_an_expired_continue_token_restarts_the_list_once(k8s: Any, k8s_client_for: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(k8s_client, "PAGE_LIMIT", 2)
    for i in range(5):
        _put(k8s, f"run-{i}", f"run-{i}")
    client = k8s_client_for(k8s)
    original, pages = client._call, []

    def compacting_call(*args: Any, **kwargs: Any) -> Any:
        answer = original(*args, **kwargs)
        pages.append(kwargs.get("_continue"))
        if len(pages) == 1:
            k8s.compact()  # the first chunk's snapshot is gone before the second is asked for
        return answer

    monkeypatch.setattr(client, "_call", compacting_call)
    listing = client.list_tracked(NS, [f"run-{i}" for i in range(5)], ListBudget(max_objects=100, max_seconds=60))
    assert sorted(listing.jobs) == [f"run-{i}" for i in range(5)] and listing.jobs_complete
    assert [r.status for r in k8s.requests if r.path.endswith("/jobs")].count(410) == 1


def test_a_spent_budget_stops_the_list_and_says_so(k8s: Any, k8s_client_for: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(k8s_client, "PAGE_LIMIT", 10)
    _put(k8s, "run-0", "run-0")
    for i in range(100):
        _put(k8s, f"copy-{i:03d}", "run-0")  # junk copying the tracked name as its label value
    listing = k8s_client_for(k8s).list_tracked(NS, ["run-0"], ListBudget(max_objects=30, max_seconds=60))
    assert not listing.jobs_complete and k8s.listed[("jobs", NS)] == 30


def test_a_namespace_that_takes_too_long_stops_at_its_time_budget(k8s: Any, k8s_client_for: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seconds count too (a slow API server for one namespace): a clock that moves 0.2 s per
    reading (before each page, and after each piece of an answer read) stops a 1 s budget after
    the second page."""
    monkeypatch.setattr(k8s_client, "PAGE_LIMIT", 2)
    for i in range(10):
        _put(k8s, f"run-{i}", f"run-{i}")
    ticks = iter(i * 0.2 for i in range(100))
    listing = k8s_client_for(k8s).list_tracked(NS, [f"run-{i}" for i in range(10)],
                                               ListBudget(max_objects=10**6, max_seconds=1.0, clock=lambda: next(ticks)))
    assert not listing.jobs_complete and sorted(listing.jobs) == ["run-0", "run-1", "run-2", "run-3"]


def test_a_page_asks_for_no_more_items_than_the_budget_has_left(k8s: Any, k8s_client_for: Any) -> None:
    """``limit`` is what is left of the namespace's items, not a whole page: a budget of 3 asks
    for 3, and the API server's answer carries no more than that."""
    for i in range(10):
        _put(k8s, f"junk-{i}", "run-0")
    asked = len(k8s.requests)
    listing = k8s_client_for(k8s).list_tracked(NS, ["run-0"], ListBudget(max_objects=3, max_seconds=60.0))
    limits = [r.query.get("limit") for r in k8s.requests[asked:] if r.path.endswith("/jobs")]
    assert limits == [["3"]] and not listing.jobs_complete and k8s.listed[("jobs", NS)] == 3


def test_an_answer_past_the_namespace_bytes_is_dropped_unread_and_the_list_is_incomplete(k8s: Any, k8s_client_for: Any) -> None:
    """Items are not the cost: 20 Jobs of 200 KB each (annotations may hold 256 KiB) are 4 MB in
    one page. Read past its bytes, the answer is dropped with the rest unread, nothing of it is
    kept, and the list says it is incomplete (so its runs are asked one by one, never gone)."""
    for i in range(20):
        _put(k8s, f"fat-{i}", "run-0")
        k8s.store.objects[("jobs", NS, f"fat-{i}")]["metadata"]["annotations"] = {"x/pad": "a" * 200_000}
    _put(k8s, "run-0", "run-0")
    budget = ListBudget(max_objects=10**6, max_seconds=60.0, max_bytes=512 * 1024)
    listing = k8s_client_for(k8s).list_tracked(NS, ["run-0"], budget)
    assert not listing.jobs_complete and listing.jobs == {} and budget.objects == 0
    assert 512 * 1024 < budget.bytes <= 512 * 1024 + k8s_client.READ_CHUNK
