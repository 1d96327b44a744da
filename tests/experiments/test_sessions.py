"""Dashboard sessions and CSRF, attacked from outside over HTTP (the real app in TestClient, on
https://testserver so the client's cookie jar behaves like a browser's with Secure cookies).

Before security round three the session cookie was the raw API token (admin too), it never
expired, logout only asked the browser to forget it, and /login took any token from any site
(login CSRF: a victim could be signed in as the attacker's tenant)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import inspect, select, text

from experiments.app import ServiceSettings, create_app
from experiments.auth import create_token
from experiments.models import Event
from gpufleet.cli import main
from tests.experiments.conftest import FakeClock, UnusedRunner


@dataclass
class Dashboard:
    app: object
    clock: FakeClock
    db_url: str

    def browser(self, headers: dict[str, str] | None = None) -> TestClient:
        """A fresh browser: its own cookie jar, and by default the ``Origin`` a browser sends with a
        form of this service's own page."""
        client = TestClient(self.app, base_url="https://testserver", headers={"Origin": "https://testserver"} if headers is None else headers)
        self._clients.append(client)
        return client

    def token(self, tenant: str | None = "finetune", admin: bool = False) -> tuple[str, str]:
        with self.app.state.ctx.sessions() as session, session.begin():
            return create_token(session, tenant=tenant, admin=admin, name="t", now=self.clock())


@pytest.fixture
def dashboard(db_url, catalog) -> Iterator[Dashboard]:
    clock = FakeClock()
    app = create_app(ServiceSettings(db_url=db_url, worker=False), runner=UnusedRunner(), catalog=catalog, clock=clock)
    board = Dashboard(app, clock, db_url)
    board._clients = []
    with TestClient(app, base_url="https://testserver"):  # the lifespan
        yield board
    for client in board._clients:
        client.close()


def _csrf(page: httpx.Response) -> str | None:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    return found.group(1) if found else None


def _sign_in(browser: TestClient, token: str) -> httpx.Response:
    """What a person does: open the sign-in page, paste the token, submit the form."""
    form = browser.get("/login")
    data = {"token": token}
    if _csrf(form):
        data["csrf"] = _csrf(form)
    return browser.post("/login", data=data, follow_redirects=False)


def _set_cookies(response: httpx.Response) -> list[str]:
    return response.headers.get_list("set-cookie")


def _signed_in(browser: TestClient) -> bool:
    page = browser.get("/", follow_redirects=False)
    return page.status_code == 200 and "signed in as" in page.text


def _sign_out(browser: TestClient) -> httpx.Response:
    index = browser.get("/")
    return browser.post("/logout", data={"csrf": _csrf(index) or ""}, follow_redirects=False)


def test_the_session_cookie_is_a_random_id_never_the_api_token_and_is_stored_hashed(dashboard):
    _id, token = dashboard.token(admin=True, tenant=None)
    browser = dashboard.browser()
    answer = _sign_in(browser, token)
    assert answer.status_code == 303
    assert token not in " ".join(_set_cookies(answer)), "the raw API token went into a cookie"
    session_cookies = [c for c in _set_cookies(answer) if "session" in c.split("=")[0]]
    assert len(session_cookies) == 1, _set_cookies(answer)
    cookie = session_cookies[0]
    attributes = {a.strip().split("=")[0].lower(): a.strip() for a in cookie.split(";")[1:]}
    assert {"httponly", "secure", "samesite", "path"} <= set(attributes), cookie
    assert attributes["samesite"].lower() == "samesite=strict" and attributes["path"] == "Path=/"
    assert "domain" not in attributes  # host-only: no sibling host name receives it
    value = cookie.split(";")[0].split("=", 1)[1]
    assert len(value) >= 40
    assert _signed_in(browser)
    engine = dashboard.app.state.engine
    with engine.connect() as connection:
        stored = " ".join(str(row) for table in inspect(connection).get_table_names() for row in connection.execute(text(f"SELECT * FROM {table}")))
    assert value not in stored and token not in stored, "a session id or token is stored in the clear"


def test_fails_when_a_session_is_idle_past_8_hours_or_older_than_24(dashboard):
    _id, token = dashboard.token()
    idle, busy = dashboard.browser(), dashboard.browser()
    assert _sign_in(idle, token).status_code == 303 and _sign_in(busy, token).status_code == 303
    dashboard.clock.advance(hours=7, minutes=59)
    assert _signed_in(busy)
    dashboard.clock.advance(minutes=2)
    assert not _signed_in(idle), "a session idle for 8 hours still signs in"
    assert _signed_in(busy)
    for _ in range(4):
        dashboard.clock.advance(hours=3, minutes=59)
        assert _signed_in(busy)  # used every few hours: alive until the absolute limit (now 23 h 57 min)
    dashboard.clock.advance(minutes=5)
    assert not _signed_in(busy), "a session older than 24 hours still signs in"


def test_a_stolen_session_cookie_is_dead_after_logout(dashboard):
    token_id, token = dashboard.token()
    victim = dashboard.browser()
    assert _sign_in(victim, token).status_code == 303
    stolen = dict(victim.cookies)
    assert _sign_out(victim).status_code == 303
    thief = dashboard.browser()
    for name, value in stolen.items():
        thief.cookies.set(name, value)
    assert not _signed_in(thief), "logout only asked the browser to forget the cookie; the server still takes it"
    with dashboard.app.state.ctx.sessions() as session:
        audit = [(e.actor, e.message) for e in session.scalars(select(Event).where(Event.kind == "session").order_by(Event.id))]
    assert audit == [(f"token:{token_id}", "dashboard sign-in"), (f"token:{token_id}", "dashboard sign-out")]


def test_revoking_the_api_token_ends_its_dashboard_sessions(dashboard, capsys):
    token_id, token = dashboard.token()
    browser = dashboard.browser()
    assert _sign_in(browser, token).status_code == 303 and _signed_in(browser)
    assert main(["api", "token", "revoke", token_id, "--db", dashboard.db_url]) == 0
    capsys.readouterr()
    assert not _signed_in(browser)
    if "dashboard_sessions" in inspect(dashboard.app.state.engine).get_table_names():
        with dashboard.app.state.engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM dashboard_sessions")).scalar() == 0


def test_fails_to_sign_a_victim_in_as_the_attackers_tenant_without_the_login_csrf_pair(dashboard):
    """Login CSRF: the attacker's page posts the attacker's own token to /login from the victim's
    browser. The browser sends no SameSite=Strict cookie cross-site, and the attacker cannot know
    the victim's form token; a form token the attacker fetched for itself does not fit the victim."""
    _id, attacker_token = dashboard.token(tenant="eval")
    victim = dashboard.browser()
    cross_site = victim.post("/login", data={"token": attacker_token}, follow_redirects=False)
    assert cross_site.status_code == 403, cross_site.text[:300]
    assert not [c for c in _set_cookies(cross_site) if "session" in c.split("=")[0]]
    assert not _signed_in(victim)
    attacker = dashboard.browser()
    attackers_field = _csrf(attacker.get("/login")) or ""
    victim.get("/login")  # the victim has a sign-in cookie of its own
    replayed = victim.post("/login", data={"token": attacker_token, "csrf": attackers_field}, follow_redirects=False)
    assert replayed.status_code == 403 and not _signed_in(victim)


def test_fails_to_sign_out_or_post_without_the_session_csrf_token(dashboard):
    _id, token = dashboard.token()
    browser = dashboard.browser()
    assert _sign_in(browser, token).status_code == 303
    for data in ({}, {"csrf": "forged"}):
        answer = browser.post("/logout", data=data, follow_redirects=False)
        assert answer.status_code == 403, answer.status_code
        assert _signed_in(browser)
    other = dashboard.browser()
    assert _sign_in(other, dashboard.token()[1]).status_code == 303
    others_field = _csrf(other.get("/")) or ""
    assert browser.post("/logout", data={"csrf": others_field}, follow_redirects=False).status_code == 403
    assert _signed_in(browser)
    assert _sign_out(browser).status_code == 303 and not _signed_in(browser)


def _login_pair(browser: TestClient) -> dict[str, str]:
    """The form field of a sign-in page this browser opened (its cookie stays in the jar)."""
    return {"csrf": _csrf(browser.get("/login")) or ""}


@pytest.mark.parametrize("headers", [
    {"Origin": "https://testserver:8443"},  # another port of the same host: the same site, not the same origin
    {"Origin": "http://testserver"},  # another scheme
    {"Origin": "https://evil.example"},
    {"Origin": "null"},
    {"Origin": "https://testserver:notaport"},
    {"Sec-Fetch-Site": "same-site"},
    {"Sec-Fetch-Site": "cross-site"},
    {},  # neither header: not a browser's same-origin form
], ids=["other-port", "other-scheme", "other-host", "null", "bad-port", "no-origin-same-site", "no-origin-cross-site", "no-origin"])
def test_fails_to_sign_in_or_out_from_another_origin_even_with_a_matching_csrf_pair(dashboard, headers):
    """Login and logout CSRF from another port of the host (security round three, second red
    team): a page on https://testserver:8443 can plant the pre-session cookie of its choosing
    (cookies ignore ports, SameSite=Strict counts ports as one site) and so post a *matching*
    cookie and field; the double-submit check passed. Here the browser holds a genuine pair and
    still gets 403 whenever the request is not from this service's own origin."""
    _id, attacker_token = dashboard.token(tenant="eval")
    victim = dashboard.browser(headers)
    answer = victim.post("/login", data={"token": attacker_token, **_login_pair(victim)}, follow_redirects=False)
    assert answer.status_code == 403, answer.status_code
    assert not [c for c in _set_cookies(answer) if "session" in c.split("=")[0]] and not _signed_in(victim)
    own = victim.post("/login", data={"token": dashboard.token()[1], **_login_pair(victim)}, headers={"Origin": "https://testserver"}, follow_redirects=False)
    assert own.status_code == 303
    answer = victim.post("/logout", data={"csrf": _csrf(victim.get("/")) or ""}, follow_redirects=False)
    assert answer.status_code == 403 and _signed_in(victim)


def test_a_same_origin_form_without_origin_signs_in_by_sec_fetch_site(dashboard):
    browser = dashboard.browser({"Sec-Fetch-Site": "same-origin"})
    answer = browser.post("/login", data={"token": dashboard.token()[1], **_login_pair(browser)}, follow_redirects=False)
    assert answer.status_code == 303 and _signed_in(browser)


def test_behind_a_proxy_only_the_configured_public_origin_may_post(db_url, catalog):
    """Behind a TLS proxy the service sees its own Host and scheme, not the browser's; with
    ``--public-origin`` the form must come from exactly that origin, whatever the Host header says."""
    from experiments.services.sessions import SessionSettings

    clock = FakeClock()
    app = create_app(ServiceSettings(db_url=db_url, worker=False, sessions=SessionSettings(public_origin="https://gpufleet.example.com")),
                     runner=UnusedRunner(), catalog=catalog, clock=clock)
    with TestClient(app, base_url="https://testserver") as browser:
        with app.state.ctx.sessions() as session, session.begin():
            token = create_token(session, tenant="finetune", admin=False, name="t", now=clock())[1]
        own_host = browser.post("/login", data={"token": token, **_login_pair(browser)}, headers={"Origin": "https://testserver"}, follow_redirects=False)
        assert own_host.status_code == 403
        public = browser.post("/login", data={"token": token, **_login_pair(browser)}, headers={"Origin": "https://gpufleet.example.com"}, follow_redirects=False)
        assert public.status_code == 303


@pytest.mark.parametrize("origin", ["gpufleet.example.com", "ftp://gpufleet.example.com", "https://gpufleet.example.com/dashboard", "https://"])
def test_fails_when_the_public_origin_is_no_origin(origin, capsys):
    assert main(["serve", "--public-origin", origin, "--scheduler", "local"]) == 2
    err = capsys.readouterr().err
    assert f"--public-origin {origin}" in err and "https://gpufleet.example.com" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("path", ["/login", "/logout"])
@pytest.mark.parametrize("field", ["%C3%A9", "%E2%80%AE" * 64, "%FF", "%00"], ids=["e-acute", "rtl-override-x64", "byte-ff", "nul"])
def test_fails_with_403_not_500_when_the_csrf_field_is_not_ascii(dashboard, field, path):
    """Second red team: a non-ASCII ``csrf`` field made ``hmac.compare_digest`` raise TypeError,
    an unauthenticated 500 (with a traceback in the log) on both forms."""
    browser = TestClient(dashboard.app, base_url="https://testserver", headers={"Origin": "https://testserver"}, raise_server_exceptions=False)
    dashboard._clients.append(browser)
    browser.get("/login")
    browser.cookies.set("__Host-gpufleet_session", "x", domain="testserver.local")
    answer = browser.post(path, content=f"csrf={field}&token=gfx_x", headers={"Content-Type": "application/x-www-form-urlencoded"}, follow_redirects=False)
    assert answer.status_code == 403, answer.status_code
    assert answer.headers["cache-control"] == "no-store"


def test_a_fresh_sign_in_replaces_a_fixed_session_id(dashboard):
    """Session fixation: a cookie planted before sign-in is never the session after it."""
    _id, token = dashboard.token()
    browser = dashboard.browser()
    browser.cookies.set("__Host-gpufleet_session", "planted-by-attacker")
    answer = _sign_in(browser, token)
    assert answer.status_code == 303
    assert "planted-by-attacker" not in " ".join(_set_cookies(answer)) and _signed_in(browser)


def test_signing_in_over_a_planted_live_session_issues_a_fresh_id_and_ends_the_planted_one(dashboard):
    """Session fixation with a *live* id (second red team, attack 1b): the attacker signs in with
    its own token and plants that session's id in the victim's browser (from another port of the
    host). When the victim then signs in, the cookie is a new id, and the planted session is gone,
    so the attacker's copy of it cannot follow the victim's session."""
    attacker = dashboard.browser()
    assert _sign_in(attacker, dashboard.token(tenant="eval")[1]).status_code == 303
    [cookie] = [c for c in attacker.cookies.jar if c.name == "__Host-gpufleet_session"]
    planted = cookie.value
    victim = dashboard.browser()
    victim.cookies.jar.set_cookie(cookie)  # the same host, path and name: the browser's own cookie slot
    answer = _sign_in(victim, dashboard.token()[1])
    assert answer.status_code == 303
    fresh = victim.cookies.get("__Host-gpufleet_session")
    assert fresh and fresh != planted and planted not in " ".join(_set_cookies(answer))
    assert "tenant finetune" in victim.get("/").text
    assert not _signed_in(attacker)


def test_one_token_keeps_at_most_20_live_sessions_the_oldest_end_first(dashboard):
    """Second red team: every sign-in added a session row kept for up to 24 h, without limit per
    token (300 sign-ins, 300 live sessions). The 21st sign-in of a token ends its oldest session;
    another token's session is untouched."""
    _other_id, other_token = dashboard.token(tenant="eval")
    bystander = dashboard.browser()
    assert _sign_in(bystander, other_token).status_code == 303
    token_id, token = dashboard.token()
    browsers = []
    for _ in range(25):
        browser = dashboard.browser()
        assert _sign_in(browser, token).status_code == 303
        browsers.append(browser)
        dashboard.clock.advance(seconds=1)
    assert [_signed_in(b) for b in browsers] == [False] * 5 + [True] * 20
    assert _signed_in(bystander)
    with dashboard.app.state.engine.connect() as connection:
        live = connection.execute(text("SELECT count(*) FROM dashboard_sessions WHERE token_id = :t"), {"t": token_id}).scalar()
    assert live == 20


def test_the_session_cookie_is_no_api_credential(dashboard):
    _id, token = dashboard.token()
    browser = dashboard.browser()
    assert _sign_in(browser, token).status_code == 303
    assert browser.get("/api/v1/experiments").status_code == 401  # the API takes only a bearer header


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "gpufleet.example.com", "::"])
def test_fails_when_cookies_without_secure_are_asked_for_off_loopback(host, capsys):
    assert main(["serve", "--host", host, "--insecure-cookie", "--scheduler", "local"]) == 2
    err = capsys.readouterr().err
    assert "allowed only on a loopback address" in err and len(err.strip().splitlines()) == 1


def test_cookies_are_secure_unless_a_loopback_service_opts_out():
    from gpufleet.serve_cmd import _session_settings

    assert ServiceSettings(db_url="sqlite://").sessions.secure_cookie
    assert _session_settings("0.0.0.0", insecure_cookie=False, idle_hours=8, max_hours=24).secure_cookie
    for host in ("127.0.0.1", "::1", "localhost"):
        settings = _session_settings(host, insecure_cookie=True, idle_hours=8, max_hours=24)
        assert not settings.secure_cookie and not settings.session_cookie.startswith("__Host-")


def test_an_insecure_loopback_service_still_runs_sessions_and_csrf(sqlite_url, catalog):
    from experiments.services.sessions import SessionSettings

    clock = FakeClock()
    app = create_app(ServiceSettings(db_url=sqlite_url, worker=False, sessions=SessionSettings(secure_cookie=False, idle_hours=1, max_hours=2)),
                     runner=UnusedRunner(), catalog=catalog, clock=clock)
    with TestClient(app, base_url="http://127.0.0.1", headers={"Origin": "http://127.0.0.1"}) as browser:
        with app.state.ctx.sessions() as session, session.begin():
            token = create_token(session, tenant="finetune", admin=False, name="t", now=clock())[1]
        answer = _sign_in(browser, token)
        assert answer.status_code == 303 and "Secure" not in answer.headers["set-cookie"]
        assert _signed_in(browser)
        clock.advance(hours=1, minutes=1)
        assert not _signed_in(browser)  # the configured idle limit
        assert browser.post("/login", data={"token": token}, follow_redirects=False).status_code == 403


def test_fails_when_the_idle_limit_exceeds_the_absolute_one(capsys):
    assert main(["serve", "--session-idle-hours", "30", "--session-max-hours", "24", "--scheduler", "local"]) == 2
    assert "--session-idle-hours 30 is longer than --session-max-hours 24" in capsys.readouterr().err
