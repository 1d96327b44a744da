"""The dashboard in a real headless Chromium (Debian's, installed by `make browser`), driven by
Playwright over the service served by uvicorn on 127.0.0.1. A missing browser fails the test."""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]
META = {"dataset_uri": "hf://datasets/acme/chat@v3", "run_id": "r1"}


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing; run `make browser` (apt-get install chromium)", pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        yield instance
        instance.close()


def _sign_in(page, base: str, token: str) -> None:
    page.goto(f"{base}/")
    assert page.url.endswith("/login")
    page.fill("#token", token)
    page.click("#sign-in")
    page.wait_for_url(f"{base}/")


def test_dashboard_lists_filters_and_shows_the_timeline_in_chromium(browser, live, nomad, tmp_path):
    import httpx

    from experiments.background.worker import run_once

    base, tokens = live["base"], live["tokens"]
    auth = {"Authorization": f"Bearer {tokens['finetune']}"}
    ids = [httpx.post(f"{base}/api/v1/experiments", json={"job": "finetune-llama", "meta": {**META, "run_id": f"r{i}"}}, headers=auth).json()["id"] for i in range(3)]
    httpx.post(f"{base}/api/v1/experiments/{ids[2]}/cancel", headers=auth)
    eval_auth = {"Authorization": f"Bearer {tokens['eval']}"}
    httpx.post(f"{base}/api/v1/experiments", json={"job": "eval-judge", "meta": META}, headers=eval_auth)
    run_once(live["ctx"])  # dispatch: two finetune runs are placed on the double's A100s
    for job_id in nomad.dispatched("finetune-llama"):
        nomad.finish(job_id, client_status="running")
        nomad.gpu_stats[nomad.state.allocations[job_id][-1]["ID"]] = [(75, 20_000)]
    live["clock"].advance(hours=1)
    run_once(live["ctx"])
    research_auth = {"Authorization": f"Bearer {tokens['research']}"}
    gke = httpx.post(f"{base}/api/v1/experiments", json={"job": "finetune-llama-gke", "meta": {"dataset_uri": "gs://acme-data/chat/v3/", "run_id": "g1"}}, headers=research_auth)
    assert gke.status_code == 202 and gke.json()["scheduler"] == "gke"
    run_once(live["ctx"])  # dispatched to the Kubernetes double, queued in Kueue

    page = browser.new_page()
    _sign_in(page, base, tokens["finetune"])
    rows = page.locator("#experiments tbody tr")
    assert rows.count() == 3  # finetune's three, not eval's
    assert sorted(page.locator("#experiments td.state").all_inner_texts()) == ["cancelled", "running", "running"]
    capacity = page.locator("#capacity tbody tr").all_inner_texts()
    assert any("a100" in row and "\t8\t2" in row for row in capacity), capacity  # quota 8, 2 GPUs held
    assert all("eval" not in row for row in capacity)
    assert page.locator("#cost-by-tenant").inner_text().count("finetune") == 1
    budgets = page.locator("#budgets tbody tr").all_inner_texts()  # prod-nomad's example file: finetune has $50,000 a month
    assert len(budgets) == 1 and budgets[0].startswith("prod-nomad\tfinetune\t2026-12\t50000.00\t") and budgets[0].endswith("\tstop"), budgets
    spent, committed = (float(v) for v in budgets[0].split("\t")[4:6])
    assert spent > 0 and committed > 0  # two runs placed an hour ago, with most of their deadline left
    page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)

    page.select_option("#filter-status", "cancelled")
    page.click("#apply-filters")
    page.wait_for_url("**status=cancelled**")
    assert page.locator("#experiments tbody tr").count() == 1
    page.click("#experiments tbody tr a")
    assert page.locator("#state").inner_text() == "cancelled"
    timeline = page.locator("#events tbody tr").all_inner_texts()
    assert len(timeline) == 3 and "cancel requested" in timeline[1] and "token:" in timeline[0]

    page.goto(f"{base}/experiments/{ids[0]}")  # running, sampled once: its utilization and chart
    assert page.locator("#usage-mean").inner_text() == "75.0 %" and page.locator("#usage-memory").inner_text() == "20000 MiB"
    assert page.locator("#usage-chart polyline").count() == 1
    page.goto(f"{base}/experiments/{ids[2]}")  # cancelled before it ran: unknown, no chart
    assert page.locator("#usage-mean").inner_text() == "unknown" and page.locator("#usage-chart").count() == 0

    admin_page = browser.new_page()
    _sign_in(admin_page, base, tokens["admin"])
    assert admin_page.locator("#experiments tbody tr").count() == 5
    # GKE pools count like Nomad pools: research's 2 x 8 H100 run (queued in Kueue) holds 16 of its 24.
    admin_capacity = admin_page.locator("#capacity tbody tr").all_inner_texts()
    assert any(row.startswith("prod-gke\th100") and "\tresearch\t24\t16" in row for row in admin_capacity), admin_capacity
    assert any(row.startswith("prod-nomad\ta100") and "\tfinetune\t8\t2" in row for row in admin_capacity), admin_capacity
    admin_page.goto(f"{base}/?tenant=eval")
    # No L4 node in the double: eval-judge queued for an hour, past its wrapped secret_id, and was failed.
    assert admin_page.locator("#experiments td.state").all_inner_texts() == ["failed"]


def test_fails_to_sign_in_with_a_bad_token_and_hides_other_tenants_experiments(browser, live):
    import httpx

    base, tokens = live["base"], live["tokens"]
    exp = httpx.post(f"{base}/api/v1/experiments", json={"job": "finetune-llama", "meta": META}, headers={"Authorization": f"Bearer {tokens['finetune']}"}).json()
    page = browser.new_page()
    page.goto(f"{base}/login")
    page.fill("#token", "gfx_wrong")
    page.click("#sign-in")
    assert "unknown or revoked token" in page.locator("#error").inner_text()
    _sign_in(page, base, tokens["eval"])
    assert page.locator("#no-experiments").count() == 1
    page.goto(f"{base}/experiments/{exp['id']}")
    assert "no experiment" in page.locator("h1").inner_text()


def test_fails_to_sign_a_victim_in_as_the_attackers_tenant_from_another_site(browser, live):
    """Login CSRF in a real browser: a page on another site (http://localhost:<port>, another site
    than 127.0.0.1) auto-submits the attacker's own token to /login. Before security round three
    the victim's browser came back signed in as the attacker's tenant (eval), so whatever the
    victim then looked at or typed went to the attacker's view."""
    base, tokens = live["base"], live["tokens"]
    page_html = (f'<form id="f" method="post" action="{base}/login"><input name="token" value="{tokens["eval"]}"></form>'
                 '<script>document.getElementById("f").submit()</script>').encode()

    class Attacker(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page_html)))
            self.end_headers()
            self.wfile.write(page_html)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        victim = browser.new_page()
        victim.goto(f"http://localhost:{server.server_address[1]}/")
        victim.wait_for_url(f"{base}/**")
        victim.wait_for_load_state()
        victim.goto(f"{base}/")
        assert victim.url.endswith("/login"), f"the victim is signed in as the attacker's tenant: {victim.locator('header').inner_text()}"
        _sign_in(victim, base, tokens["finetune"])  # the victim's own sign-in still works
        assert "tenant finetune" in victim.locator("header").inner_text()
    finally:
        server.shutdown()
        server.server_close()


def test_fails_to_sign_a_victim_in_as_the_attackers_tenant_from_another_port_of_the_host(browser, live):
    """Login CSRF from another PORT of 127.0.0.1 (security round three, second red team): cookies
    ignore ports and SameSite=Strict counts every port of a host as the same site, so a page on
    http://127.0.0.1:<other port> plants a ``__Host-gpufleet_login`` cookie of its choosing (Secure,
    host-only, Path=/ satisfy the prefix) and posts the HMAC of it with the attacker's token: the
    double-submit pair matched and the victim came back signed in as the attacker's tenant. Only the
    request's ``Origin`` tells the ports apart."""
    base, tokens = live["base"], live["tokens"]
    secret = "attacker-chosen-pre-session-secret"
    csrf = hmac.new(secret.encode(), b"gpufleet-csrf:login", hashlib.sha256).hexdigest()
    page_html = (f'<form id="f" method="post" action="{base}/login"><input name="csrf" value="{csrf}">'
                 f'<input name="token" value="{tokens["eval"]}"></form><script>document.getElementById("f").submit()</script>').encode()

    class Attacker(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Set-Cookie", f"__Host-gpufleet_login={secret}; Secure; Path=/; SameSite=Strict; HttpOnly")
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page_html)))
            self.end_headers()
            self.wfile.write(page_html)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        victim = browser.new_page()
        _sign_in(victim, base, tokens["finetune"])
        victim.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        victim.wait_for_url(f"{base}/**")
        victim.wait_for_load_state()
        victim.goto(f"{base}/")
        assert "tenant finetune" in victim.locator("header").inner_text(), f"the victim's browser now shows: {victim.locator('header').inner_text()}"
    finally:
        server.shutdown()
        server.server_close()


def test_sign_out_ends_the_session_in_chromium(browser, live):
    base, tokens = live["base"], live["tokens"]
    page = browser.new_page()
    _sign_in(page, base, tokens["finetune"])
    page.click("header button")
    page.wait_for_url(f"{base}/login")
    page.goto(f"{base}/")
    assert page.url.endswith("/login")


def test_run_page_follows_the_masked_log_tail_and_the_list_refreshes_itself_in_chromium(browser, live, nomad):
    """The run page reads its tail through the session (the browser never holds the API's bearer
    token), shows a planted credential masked, follows new lines while the run runs and stops
    when it ended; the list picks up a new experiment without a reload; empty tables say so."""
    import random

    import httpx

    from experiments.background.worker import run_once
    from tests.jobs.test_log_masking import BODY as PEM_BODY
    from tests.jobs.test_log_masking import PEM
    from tests.safety.test_secret_matrix import NEW_FORMATS

    base, tokens = live["base"], live["tokens"]
    auth = {"Authorization": f"Bearer {tokens['finetune']}"}
    exp_id = httpx.post(f"{base}/api/v1/experiments", json={"job": "finetune-llama", "meta": META}, headers=auth).json()["id"]
    run_once(live["ctx"])
    job_id = nomad.dispatched("finetune-llama")[0]
    alloc = nomad.start_task(job_id)
    run_once(live["ctx"])
    planted = NEW_FORMATS(random.Random(11))["groq"]
    nomad.write_log(alloc, f"step 1 loss 2.0\nexport GROQ_API_KEY={planted}\nloading {PEM}\n")  # a PEM key: every line masked

    page = browser.new_page()
    _sign_in(page, base, tokens["finetune"])
    assert page.locator("#experiments tbody tr").count() == 1
    page.goto(f"{base}/experiments/{exp_id}")
    page.wait_for_function("document.getElementById('log-tail').textContent.includes('step 1 loss 2.0')", timeout=15_000)
    assert page.locator("#log-tail").inner_text().splitlines() == ["step 1 loss 2.0", "[masked: groq-key]", *["[masked: private-key]"] * (len(PEM_BODY) + 2)]
    assert planted not in page.content() and planted[-12:] not in page.content() and not any(line in page.content() for line in PEM_BODY)
    assert page.locator("#log-status").inner_text() == "following the run"
    nomad.write_log(alloc, "step 2 loss 1.5\n")  # still running: the page follows
    page.wait_for_function("document.getElementById('log-tail').textContent.includes('step 2 loss 1.5')", timeout=15_000)
    nomad.write_log(alloc, "done\n")
    nomad.finish(job_id, client_status="complete", events=[{"Type": "Terminated", "Time": 2, "ExitCode": 0, "Details": {"exit_code": "0"}}])
    run_once(live["ctx"])
    page.wait_for_function("document.getElementById('log-status').textContent.startsWith('the run has ended')", timeout=15_000)
    assert page.locator("#log-tail").inner_text().splitlines()[-1] == "done"
    page.wait_for_function("document.getElementById('state').textContent === 'succeeded'", timeout=15_000)  # the state refreshed too

    assert page.request.get(f"{base}/experiments/{exp_id}/log-tail").text().splitlines()[-1] == "done"
    other = browser.new_page()
    _sign_in(other, base, tokens["eval"])
    assert other.request.get(f"{base}/experiments/{exp_id}/log-tail").status == 404  # another tenant's run does not exist for them
    assert other.request.get(f"{base}/experiments/{exp_id[:8]}/log-tail").status == 404
    assert httpx.get(f"{base}/experiments/{exp_id}/log-tail").status_code == 401  # no session
    assert other.locator("#no-experiments").inner_text() == "no experiments match"
    assert other.locator("#no-cost-by-tenant").inner_text() == "no cost yet" and other.locator("#no-cost-by-job").count() == 1

    page.goto(f"{base}/")
    assert page.locator("#experiments tbody tr").count() == 1
    httpx.post(f"{base}/api/v1/experiments", json={"job": "finetune-llama", "meta": {**META, "run_id": "r2"}}, headers=auth)
    page.wait_for_function("document.querySelectorAll('#experiments tbody tr').length === 2", timeout=15_000)  # no reload
    assert sorted(page.locator("#experiments td.state").all_inner_texts()) == ["pending", "succeeded"]


def test_run_page_cancels_with_the_sessions_csrf_token_and_refuses_forged_posts_in_chromium(browser, live):
    """The cancel button posts the session's form token; a post of the same session without it, with
    another token or from another origin is a 403 that cancels nothing, and another tenant's session,
    with its own valid token, gets a 404 for the run (tenant-scoped like every read)."""
    import re

    import httpx

    base, tokens = live["base"], live["tokens"]
    auth = {"Authorization": f"Bearer {tokens['finetune']}"}
    first, second = (httpx.post(f"{base}/api/v1/experiments", json={"job": "finetune-llama", "meta": {**META, "run_id": f"c{i}"}},
                                headers=auth).json()["id"] for i in range(2))

    def state(exp_id: str) -> str:
        return httpx.get(f"{base}/api/v1/experiments/{exp_id}", headers=auth).json()["status"]

    page = browser.new_page()
    _sign_in(page, base, tokens["finetune"])
    page.goto(f"{base}/experiments/{first}")
    page.click("#cancel")
    page.wait_for_function("document.getElementById('state').textContent === 'cancelled'", timeout=15_000)
    assert page.url == f"{base}/experiments/{first}" and state(first) == "cancelled"
    assert any("cancel requested" in row for row in page.locator("#events tbody tr").all_inner_texts())
    assert page.locator("#cancel").count() == 0  # an ended run has no button

    page.goto(f"{base}/experiments/{second}")
    csrf = page.locator("#cancel-form input[name=csrf]").get_attribute("value")
    url, own = f"{base}/experiments/{second}/cancel", {"Origin": base}
    assert page.request.post(url, form={}, headers=own, max_redirects=0).status == 403  # no token
    assert page.request.post(url, form={"csrf": "0" * 64}, headers=own, max_redirects=0).status == 403  # not this session's
    forged = page.request.post(url, form={"csrf": csrf}, headers={"Origin": "http://127.0.0.1:1"}, max_redirects=0)
    assert forged.status == 403  # the right token from another origin
    assert "CSRF token is missing" in page.request.post(url, form={"csrf": ""}, headers=own, max_redirects=0).text()
    assert state(second) == "pending"

    other = browser.new_page()
    _sign_in(other, base, tokens["eval"])
    other_csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', other.content()).group(1)
    refused = other.request.post(url, form={"csrf": other_csrf}, headers=own, max_redirects=0)
    assert refused.status == 404 and state(second) == "pending"
    assert page.request.post(url, form={"csrf": csrf}, headers=own, max_redirects=0).status == 303  # the same post, with the token
    assert state(second) == "cancelled"


def test_run_page_shows_the_attempts_of_a_retried_run_in_chromium(browser, live, nomad):
    """A run whose node was lost (issue 25): its page says attempt 2, lists both attempts with the
    first one's class and cause, and the timeline shows each event's attempt."""
    import httpx

    from experiments.background.worker import run_once

    base, tokens = live["base"], live["tokens"]
    auth = {"Authorization": f"Bearer {tokens['finetune']}"}
    exp_id = httpx.post(f"{base}/api/v1/experiments", json={"job": "finetune-llama", "meta": META}, headers=auth).json()["id"]
    run_once(live["ctx"])
    (first,) = nomad.dispatched("finetune-llama")
    nomad.start_task(first)
    run_once(live["ctx"])
    nomad.lose_node(first)
    run_once(live["ctx"])
    live["clock"].advance(seconds=live["ctx"].timing.retry_backoff_seconds + 1)
    run_once(live["ctx"])

    page = browser.new_page()
    _sign_in(page, base, tokens["finetune"])
    page.goto(f"{base}/experiments/{exp_id}")
    assert page.locator("#attempt").inner_text() == "2 (last failure: infrastructure)"
    attempts = page.locator("#attempts tbody tr").all_inner_texts()
    assert len(attempts) == 2 and attempts[0].startswith("1\tfailed\tinfrastructure (node-lost)") and attempts[1].startswith("2\tprovisioning")
    timeline = page.locator("#events tbody tr").all_inner_texts()
    assert {row.split("\t")[1] for row in timeline} == {"1", "2"} and any("retrying" in row for row in timeline)
