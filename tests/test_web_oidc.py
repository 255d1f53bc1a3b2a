"""The page's own OpenID Connect sign-in against a real OIDC provider on 127.0.0.1 (tests/helpers/idp.py): the
authorization code flow with PKCE through Flask's test client (the IdP's sign-in form posted over HTTP as a browser
would), the session cookie, the roles, logout, and every bad answer of the IdP: each a clear 401/403 (never a 500),
a web-signin-refused event, and no session. A real browser over a real cluster: tests/test_web_oidc_cluster.py."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from slurm_ext import config
from slurm_ext.repair.store import Record, open_sqlite
from slurm_ext.web.app import create_app
from slurm_ext.web.session import COOKIE, Sessions, SessionRefused, person_text
from slurm_ext.web.signin import STATE_COOKIE, SignInRefused, role_of
from slurm_ext.web.watch import Watcher

from helpers.idp import TestIdP, not_http, rsa_key
from test_web import TOKEN, _Agents, _hashed, _sent, _Slurm, _token_file

ROLES = '{ viewer = ["slurm-users"], operator = ["slurm-operators"], admin = ["slurm-admins"] }'
USERS = {"ada": {"groups": ["slurm-users", "slurm-operators"], "name": "Ada Lovelace", "email": "ada@example.org"},
         "vic": {"groups": ["slurm-users"], "name": "Vic Viewer"},
         "nob": {"groups": ["elsewhere"], "name": "No Body"},
         "odd": {"groups": "slurm-operators", "name": "Odd Groups"}}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _at_idp(url: str, user: str) -> str:
    """What the IdP's sign-in form does in a browser: GET the form, POST the user; the Location it answers."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)
    parts = urllib.parse.urlsplit(url)
    with opener.open(url, timeout=10) as answer:
        assert answer.status == 200 and b"id=user" in answer.read()
    form = dict(urllib.parse.parse_qsl(parts.query), user=user)
    try:
        opener.open(urllib.request.Request(f"{parts.scheme}://{parts.netloc}{parts.path}",
                                           data=urllib.parse.urlencode(form).encode(), method="POST"), timeout=10)
    except urllib.error.HTTPError as err:
        assert err.code == 302, err.read()
        return err.headers["Location"]
    raise AssertionError("the IdP did not redirect back")


def _callback(client, user: str):
    """Begin a sign-in at the page, sign `user` in at the IdP: (the page's callback URL's path and query)."""
    began = client.get("/auth/login")
    assert began.status_code == 302, began.data
    back = urllib.parse.urlsplit(_at_idp(began.headers["Location"], user))
    return f"{back.path}?{back.query}"


def sign_in(client, user: str):
    """The whole flow for `user`: the page's answer to the IdP's callback."""
    return client.get(_callback(client, user))


def _events(tmp_path: Path, name: str) -> list[dict]:
    path = tmp_path / "state" / "journal.jsonl"
    if not path.exists():
        return []
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == name]


def _session_cookie(client):
    return client.get_cookie(COOKIE)


@pytest.fixture
def idp():
    with TestIdP(users={name: dict(claims) for name, claims in USERS.items()}, client_id="slurm-ext-page") as found:
        yield found


class Clock:
    def __init__(self):
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _page(tmp_path: Path, idp: TestIdP, web: str = "", oidc: str = "", clock=time.time):
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n'
                    f'[oidc]\nissuer = "{idp.issuer}"\nclock_skew = "60s"\n{oidc}'
                    f'[web]\ntoken_file = "{tmp_path / "tokens"}"\noidc_client_id = "{idp.client_id}"\n'
                    f'roles = {ROLES}\n{web}'
                    f'[repair]\nagents = {{ n1 = "127.0.0.1:1", n2 = "127.0.0.1:2" }}\n')
    _token_file(tmp_path, f"alice {_hashed(TOKEN)}\nrobot {_hashed('r' * 24)} viewer\n")
    loaded = config.load(path)
    db = str(tmp_path / "repair.db")
    store = open_sqlite(db)
    with store.locked():
        store.add(Record("n2", "xid/79", "reboot", "79 gpu 1", opened=1.0, updated=1.0))
    watcher = Watcher(loaded, _Slurm(), store, lambda url, timeout: (None, "refused"), _Agents(_sent(100.0)))
    app = create_app(loaded, watcher, store_opener=lambda: open_sqlite(db), clock=clock, keys_clock=clock)
    watcher.refresh()
    client = app.test_client()
    client.db = db
    return client


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def page(tmp_path, idp, clock):
    return _page(tmp_path, idp, clock=clock)


def _post(client, path: str, body: dict | None = None, headers: dict | None = None):
    csrf = client.get("/api/session").get_json()["csrf"]
    return client.post(path, json=body or {}, headers={"X-CSRF-Token": csrf, **(headers or {})})


# -- the flow -----------------------------------------------------------------------------------------------------

def test_an_operator_signs_in_with_pkce_and_approves_and_the_history_names_the_person(page, idp, tmp_path):
    answer = sign_in(page, "ada")
    assert answer.status_code == 302 and answer.headers["Location"] == "/", answer.data
    cookie = answer.headers.getlist("Set-Cookie")
    session_cookie = next(c for c in cookie if c.startswith(COOKIE + "="))
    assert "HttpOnly" in session_cookie and "SameSite=Lax" in session_cookie and "Secure" not in session_cookie
    assert "POST /realm/token" in idp.requests
    session = page.get("/api/session").get_json()
    person = "Ada Lovelace <ada@example.org> (oidc:ada)"
    assert (session["user"], session["via"], session["role"]) == (person, "oidc", "operator")
    approved = _post(page, "/api/nodes/n2/approve")
    assert approved.status_code == 200 and approved.get_json()["user"] == person, approved.data
    store = open_sqlite(page.db)
    assert [r.decided_by for r in store.records() if r.node == "n2"] == [person]
    assert any(e.user == person and e.event == "repair-approved" for e in store.events())
    signed = _events(tmp_path, "web-signin")
    assert len(signed) == 1 and signed[0]["user"] == person and signed[0]["role"] == "operator"
    assert any(e["user"] == person for e in _events(tmp_path, "web-operation"))


def test_a_viewer_views_and_is_refused_an_approval_by_role(page, tmp_path):
    assert sign_in(page, "vic").status_code == 302
    assert page.get("/api/session").get_json()["role"] == "viewer"
    assert page.get("/api/cluster").status_code == 200
    refused = _post(page, "/api/nodes/n2/approve")
    assert refused.status_code == 403
    assert refused.get_json()["error"].startswith("your role viewer cannot approve repairs: operator or admin needed")
    assert _events(tmp_path, "web-refused")
    # a token still acts for automation, named by its line's user; a viewer token may not operate
    by_token = _post(page, "/api/nodes/n2/reject", {"why": "test"}, {"Authorization": f"Bearer {TOKEN}"})
    assert by_token.status_code == 200 and by_token.get_json()["user"] == "alice"
    viewer_token = _post(page, "/api/nodes/n2/reopen", {}, {"Authorization": "Bearer " + "r" * 24})
    assert viewer_token.status_code == 403 and "your role viewer cannot reopen repairs" in viewer_token.get_json()["error"]


def test_logout_ends_the_session_and_sends_the_browser_to_the_idp(page, idp, tmp_path):
    sign_in(page, "ada")
    value = _session_cookie(page).value
    out = _post(page, "/auth/logout")
    target = out.get_json()["redirect"]
    assert out.status_code == 200 and target.startswith(f"{idp.issuer}/logout?")
    asked = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(target).query))
    assert asked["post_logout_redirect_uri"] == "http://localhost/" and asked["client_id"] == idp.client_id
    assert asked["id_token_hint"].count(".") == 2  # the session's ID token, which Okta requires
    assert _session_cookie(page) is None
    assert page.get("/api/session").get_json()["user"] is None
    assert _events(tmp_path, "web-signout")[0]["user"].endswith("(oidc:ada)")
    page.set_cookie(COOKIE, value)  # a copy of the cookie kept: it ended with the logout
    again = page.get("/api/cluster")
    assert again.status_code == 401 and "signed out" in again.get_json()["error"]


def test_an_expired_session_asks_to_sign_in_again(page, clock):
    sign_in(page, "ada")
    assert page.get("/api/cluster").status_code == 200
    clock.now += 3601  # session_lifetime's default: an hour
    expired = page.get("/api/cluster")
    assert expired.status_code == 401 and "sign in again" in expired.get_json()["error"]
    assert expired.get_json()["signin"] is True
    assert _session_cookie(page) is None  # forgotten: the page goes on as anyone's (viewing is open here)
    assert page.get("/api/cluster").status_code == 200
    refused = _post(page, "/api/nodes/n2/approve")
    assert refused.status_code == 401 and "sign-in (/auth/login)" in refused.get_json()["error"]


def test_viewing_signed_in_shows_nothing_to_anyone_and_a_person_without_a_mapped_group_is_refused(tmp_path, idp):
    page = _page(tmp_path, idp, web='viewing = "signed-in"\n')
    assert page.get("/").status_code == 200  # the shell, which shows the sign-in prompt
    session = page.get("/api/session").get_json()
    assert session["signin_needed"] is True and session["signin"] is True and session["user"] is None
    anonymous = page.get("/api/cluster")
    assert anonymous.status_code == 401 and "viewing this page needs sign-in" in anonymous.get_json()["error"]
    assert page.get("/api/cluster", headers={"Authorization": "Bearer " + "r" * 24}).status_code == 200
    nobody = sign_in(page, "nob")
    assert nobody.status_code == 403 and b"you are not in any group the page maps" in nobody.data
    assert _session_cookie(page) is None and _events(tmp_path, "web-signin-refused")
    assert sign_in(page, "vic").status_code == 302 and page.get("/api/cluster").status_code == 200


def test_a_person_without_a_mapped_group_views_where_anyone_may_and_may_not_operate(page):
    assert sign_in(page, "nob").status_code == 302
    assert page.get("/api/session").get_json()["role"] == ""
    refused = _post(page, "/api/nodes/n2/approve")
    assert refused.status_code == 403 and "your role none cannot approve repairs" in refused.get_json()["error"]


def test_a_confidential_client_sends_its_secret_and_without_it_the_idp_refuses(tmp_path, idp):
    idp.client_secret = "s" * 40
    (tmp_path / "none").mkdir()
    page = _page(tmp_path / "none", idp)
    refused = sign_in(page, "ada")
    assert refused.status_code == 401 and b"token endpoint refused the code: 401 invalid_client" in refused.data
    assert _session_cookie(page) is None
    secret = tmp_path / "client-secret"
    secret.write_text("s" * 40 + "\n")
    os.chmod(secret, 0o600)
    (tmp_path / "with").mkdir()
    page = _page(tmp_path / "with", idp, web=f'oidc_client_secret_file = "{secret}"\n')
    assert sign_in(page, "ada").status_code == 302 and page.get("/api/session").get_json()["role"] == "operator"


def test_a_key_the_idp_rotates_in_is_fetched_and_a_retired_one_stops_verifying(page, idp, clock):
    assert sign_in(page, "ada").status_code == 302
    old = idp.signing_kid
    idp.rotate()
    clock.now += 11  # a JWKS is fetched again for an unknown key at most every 10 s
    _post(page, "/auth/logout")
    assert sign_in(page, "ada").status_code == 302  # signed by the new key: fetched
    idp.retire(old)
    idp.signing_kid = old
    idp.keys[old] = rsa_key()  # signs with a key the IdP no longer publishes under that kid (as a forger would)
    _post(page, "/auth/logout")
    forged = sign_in(page, "ada")
    assert forged.status_code == 401 and b"signature does not verify" in forged.data


# -- bad input: each a clear 401/403, an event, no session ------------------------------------------------------

#: claims, or a function of the time the test runs that gives them (a time taken at import is stale by the time a
#: long suite comes to the test)
BAD_TOKENS = [
    ("wrong audience", {"aud": "another-client"}, 401, "issued for another audience"),
    ("wrong issuer", {"iss": "http://127.0.0.1:1/elsewhere"}, 401, "issued by another issuer"),
    ("expired", lambda now: {"exp": now - 3600, "iat": now - 7200}, 401, "expired"),
    ("issued in the future beyond the clock skew", lambda now: {"iat": now + 600, "exp": now + 900}, 401,
     "issued in the future"),
    ("nonce mismatch", {"nonce": "not-the-one-sent"}, 401, "its nonce is not the one this sign-in sent"),
    ("groups claim not a list", {"groups": "slurm-operators"}, 403, "groups claim is not a list of strings"),
    ("groups claim a list of numbers", {"groups": [1, 2]}, 403, "groups claim is not a list of strings"),
]


@pytest.mark.parametrize("changes,status,said", [case[1:] for case in BAD_TOKENS], ids=[c[0] for c in BAD_TOKENS])
def test_an_id_token_not_believed_is_refused_with_its_reason_an_event_and_no_session(page, idp, tmp_path, changes,
                                                                                  status, said):
    idp.id_token_changes = changes(int(time.time())) if callable(changes) else changes
    answer = sign_in(page, "ada")
    assert answer.status_code == status and said in answer.data.decode(), answer.data
    assert answer.data.decode().startswith("Sign-in refused: ")
    assert _session_cookie(page) is None and page.get("/api/session").get_json()["user"] is None
    refused = _events(tmp_path, "web-signin-refused")
    assert len(refused) == 1 and said in refused[0]["message"] and refused[0]["severity"] == "warning"
    assert not _events(tmp_path, "web-signin")


def test_an_issue_time_within_the_clock_skew_is_taken(page, idp):
    idp.id_token_changes = {"iat": int(time.time()) + 30}
    assert sign_in(page, "ada").status_code == 302 and page.get("/api/session").get_json()["role"] == "operator"


def test_a_signature_by_a_key_the_jwks_does_not_hold_is_refused(page, idp):
    assert sign_in(page, "ada").status_code == 302  # the page has the IdP's keys now
    idp.keys[idp.signing_kid] = rsa_key()  # the same kid, another key: what the page holds does not verify it
    _post(page, "/auth/logout")
    answer = sign_in(page, "ada")
    assert answer.status_code == 401 and b"its signature does not verify" in answer.data
    assert _session_cookie(page) is None


@pytest.mark.parametrize("missing", ["token_endpoint", "jwks_uri", "authorization_endpoint"])
def test_a_discovery_document_without_a_required_field_is_said_and_no_sign_in_begins(tmp_path, idp, missing):
    idp.discovery_changes = {missing: None}
    page = _page(tmp_path, idp)
    answer = page.get("/auth/login")
    assert answer.status_code == 502 and f"lacks {missing}" in answer.data.decode(), answer.data
    assert "Location" not in answer.headers and _events(tmp_path, "web-signin-refused")


def test_a_state_mismatch_and_a_replayed_callback_are_refused(page, idp, tmp_path):
    path = _callback(page, "ada")
    began = page.get_cookie(STATE_COOKIE, path="/auth/").value  # the signed cookie of the sign-in begun
    stranger = page.application.test_client()  # the callback carried into another browser: no state of its own
    foreign = stranger.get(path)
    assert foreign.status_code == 403 and b"state mismatch" in foreign.data
    assert stranger.get_cookie(COOKIE) is None
    assert page.get(path).status_code == 302  # the browser that began it: signed in
    replayer = page.application.test_client()
    replayer.set_cookie(STATE_COOKIE, began, path="/auth/")
    replayed = replayer.get(path)
    assert replayed.status_code == 403 and b"used already" in replayed.data and replayer.get_cookie(COOKIE) is None
    error = page.get("/auth/callback?error=access_denied&error_description=no+thanks&state=x")
    assert error.status_code == 401 and b"the IdP refused the sign-in: access_denied (no thanks)" in error.data
    assert page.get("/auth/callback").status_code == 400


def test_without_a_client_id_there_is_no_sign_in_and_tokens_work_as_before(tmp_path, idp):
    page = _page(tmp_path, idp, web="").application  # built with oidc_client_id: rebuild one without
    path = tmp_path / "plain.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state2"}"\n[web]\ntoken_file = "{tmp_path / "tokens"}"\n')
    plain = create_app(config.load(path), page.extensions["slurm_ext_watcher"]).test_client()
    assert plain.get("/auth/login").status_code == 404
    session = plain.get("/api/session", headers={"Authorization": f"Bearer {TOKEN}"}).get_json()
    assert (session["user"], session["via"], session["role"], session["signin"]) == ("alice", "token", "operator",
                                                                                    False)


# -- the parts --------------------------------------------------------------------------------------------------

def test_the_person_names_the_idp_subject_and_fits_the_history():
    assert person_text("sub-123", "Ada Lovelace", "ada@example.org") == "Ada Lovelace <ada@example.org> (oidc:sub-123)"
    assert person_text("sub-123") == "(oidc:sub-123)"
    long = person_text("s" * 300, "n" * 300, "e" * 300)
    assert len(long) <= 255 and long.endswith(")")
    assert person_text("x", "Mallory <evil>\n(admin)") == "Mallory evil admin (oidc:x)"


def test_roles_take_the_highest_and_refuse_a_claim_that_is_not_a_list():
    roles = {"viewer": ("u",), "operator": ("o",), "admin": ("a",)}
    assert role_of(["u", "a", "o"], roles, "groups") == "admin" and role_of(None, roles, "groups") == ""
    with pytest.raises(SignInRefused, match="not a list of strings") as refused:
        role_of({"o": 1}, roles, "groups")
    assert refused.value.status == 403


def test_a_session_cookie_is_signed_expires_and_a_forged_one_is_refused():
    now = [1_000_000.0]
    sessions = Sessions(60.0, clock=lambda: now[0])
    value, person = sessions.issue("ada", "Ada", "", "viewer")
    assert sessions.read(value) == person
    with pytest.raises(SessionRefused, match="not valid here"):
        Sessions(60.0).read(value)  # another process's key (a restart without web.session_key_file)
    with pytest.raises(SessionRefused, match="not valid here"):
        sessions.read(value[:-2] + "xx")
    now[0] += 61
    with pytest.raises(SessionRefused, match="expired"):
        sessions.read(value)


def test_a_session_key_file_keeps_sessions_across_a_restart(tmp_path):
    key = tmp_path / "session-key"
    key.write_text("k" * 64)
    os.chmod(key, 0o600)
    value, person = Sessions(60.0, str(key)).issue("ada", "Ada", "", "admin")
    assert Sessions(60.0, str(key)).read(value) == person
    key.write_text("short")
    with pytest.raises(SessionRefused, match="at least 32"):
        Sessions(60.0, str(key)).read(value)


# -- the review's defects (issue 31) ------------------------------------------------------------------------------

def _served(app):
    """`app` behind waitress as `slurm-ext web` serves it (server.wsgi_server): (server, its base URL)."""
    import threading
    from slurm_ext.web.server import wsgi_server
    server = wsgi_server(app, "127.0.0.1", 0)
    threading.Thread(target=server.run, daemon=True).start()
    return server, f"http://127.0.0.1:{server.effective_port}"


def test_behind_a_tls_proxy_the_cookies_are_secure_through_waitress(tmp_path, idp):
    # waitress drops X-Forwarded-Proto (no trusted_proxy): the https of web.oidc_redirect_url decides
    page = _page(tmp_path, idp, web='trusted_proxies = ["127.0.0.1"]\nproxy_user_header = "X-Remote-User"\n'
                                    'oidc_redirect_url = "https://page.example/auth/callback"\n')
    server, url = _served(page.application)
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)
        with pytest.raises(urllib.error.HTTPError) as began:
            opener.open(urllib.request.Request(f"{url}/auth/login", headers={"X-Forwarded-Proto": "https"}),
                        timeout=10)
        assert began.value.code == 302
        cookie = began.value.headers["Set-Cookie"]
        assert cookie.startswith(STATE_COOKIE + "=") and "Secure" in cookie and "HttpOnly" in cookie, cookie
        assert "redirect_uri=https%3A%2F%2Fpage.example%2Fauth%2Fcallback" in began.value.headers["Location"]
    finally:
        server.close()


def test_sign_in_behind_a_proxy_needs_the_redirect_url_and_never_uses_the_host_header(tmp_path, idp):
    from slurm_ext.errors import ConfigError
    with pytest.raises(ConfigError, match="web.oidc_redirect_url") as refused:
        _page(tmp_path, idp, web='trusted_proxies = ["127.0.0.1"]\nproxy_user_header = "X-Remote-User"\n')
    assert "reverse proxy" in str(refused.value)
    (tmp_path / "plain").mkdir()
    page = _page(tmp_path / "plain", idp)
    began = page.get("/auth/login", headers={"Host": "evil.example"})
    back = urllib.parse.urlsplit(_at_idp(began.headers["Location"], "ada"))
    done = page.get(f"/auth/callback?{back.query}", headers={"Host": "evil.example"})
    assert done.status_code == 302 and done.headers["Location"] == "/"
    assert _post(page, "/auth/logout", headers={"Host": "evil.example"}).status_code == 200


def test_under_a_sub_path_the_state_cookie_goes_to_the_callback(tmp_path, idp):
    page = _page(tmp_path, idp, web='oidc_redirect_url = "http://localhost/prefix/auth/callback"\n')
    began = page.get("/auth/login")
    assert began.status_code == 302 and "Path=/prefix/auth/" in began.headers["Set-Cookie"]
    state = page.get_cookie(STATE_COOKIE, path="/prefix/auth/").value
    back = urllib.parse.urlsplit(_at_idp(began.headers["Location"], "ada"))
    assert back.path == "/prefix/auth/callback"
    # the proxy takes /prefix off; the browser sent the cookie because its path is the callback's
    page.set_cookie(STATE_COOKIE, state, path="/auth/")
    done = page.get(f"/auth/callback?{back.query}")
    assert done.status_code == 302 and done.headers["Location"] == "http://localhost/prefix/", done.data


def test_logout_is_a_post_with_the_csrf_token(page):
    sign_in(page, "ada")
    assert page.get("/auth/logout").status_code == 405  # a link or an image of another site signs no one out
    forged = page.post("/auth/logout")
    assert forged.status_code == 403 and "CSRF" in forged.get_json()["error"]
    assert page.get("/api/session").get_json()["role"] == "operator"
    assert _post(page, "/auth/logout").status_code == 200 and page.get("/api/session").get_json()["user"] is None


def test_many_sign_ins_begun_cancel_no_one_elses(page, monkeypatch):
    import slurm_ext.web.signin as signin_module
    monkeypatch.setattr(signin_module, "_PENDING_MAX", 3, raising=False)  # the old bound on sign-ins kept here
    path = _callback(page, "ada")
    flood = page.application.test_client()
    for _ in range(5):
        assert flood.get("/auth/login").status_code == 302
    assert page.get(path).status_code == 302 and page.get("/api/session").get_json()["role"] == "operator"


def test_an_idp_down_keeps_the_last_discovery_and_is_not_asked_at_every_sign_in(page, idp, clock, tmp_path):
    assert page.get("/auth/login").status_code == 302
    read = lambda: idp.requests.count("GET /realm/.well-known/openid-configuration")  # noqa: E731
    assert read() == 1
    clock.now += 3601  # the document is old: read again, and the IdP answers with a broken one
    idp.discovery_changes = {"token_endpoint": None}
    assert page.get("/auth/login").status_code == 302 and read() == 2  # the last good one serves
    assert page.get("/auth/login").status_code == 302 and read() == 2  # not asked again within 10 s
    clock.now += 11
    idp.discovery_changes = {}
    assert page.get("/auth/login").status_code == 302 and read() == 3


def _unreachable(tmp_path: Path, clock):
    import types
    return _page(tmp_path, types.SimpleNamespace(issuer="http://127.0.0.1:1/realm", client_id="slurm-ext-page"),
                 oidc='timeout = "2s"\n', clock=clock)


def test_an_unreachable_issuer_is_a_502_with_an_event_and_is_not_waited_for_again(tmp_path, clock):
    page = _unreachable(tmp_path, clock)
    answer = page.get("/auth/login")
    assert answer.status_code == 502 and answer.data.startswith(b"Sign-in refused: the IdP cannot be used")
    assert "Location" not in answer.headers and _events(tmp_path, "web-signin-refused")
    again = page.get("/auth/login")
    assert again.status_code == 502 and b"tried again 10s after" in again.data


def test_a_malformed_endpoint_in_discovery_is_a_502(tmp_path, idp):
    idp.discovery_changes = {"token_endpoint": "https://[bad"}
    page = _page(tmp_path, idp)
    answer = page.get("/auth/login")
    if answer.status_code == 302:  # the provider took the document: the token endpoint is tried at the callback
        answer = page.get(_callback(page, "ada"))
    assert answer.status_code == 502 and answer.data.startswith(b"Sign-in refused: "), answer.data
    assert _session_cookie(page) is None and _events(tmp_path, "web-signin-refused")


@pytest.mark.parametrize("garbage", [b"this is not HTTP\r\n\r\n",
                                     b"HTTP/1.1 400 Bad\r\nContent-Length: 1000\r\n\r\n{\"err"],
                         ids=["no status line", "an error answer cut short"])
def test_a_token_endpoint_answering_garbage_is_a_502(tmp_path, idp, garbage):
    with not_http(garbage) as port:
        idp.discovery_changes = {"token_endpoint": f"http://127.0.0.1:{port}/token"}
        page = _page(tmp_path, idp)
        refused = sign_in(page, "ada")
        assert refused.status_code in (401, 502) and refused.data.startswith(b"Sign-in refused: the IdP's token "
                                                                             b"endpoint"), refused.data
        assert _session_cookie(page) is None and _events(tmp_path, "web-signin-refused")


@pytest.mark.parametrize("algorithm", ["HS256", "none"])
def test_an_id_token_signed_with_a_shared_secret_or_unsigned_is_refused(page, idp, tmp_path, algorithm):
    import jwt

    def forged(user, nonce):
        now = int(time.time())
        claims = {"iss": idp.issuer, "sub": user, "aud": idp.client_id, "iat": now, "exp": now + 300, "nonce": nonce,
                  "groups": ["slurm-admins"]}
        return jwt.encode(claims, "s" * 32 if algorithm == "HS256" else None, algorithm=algorithm,
                          headers={"kid": idp.signing_kid})
    idp._id_token = forged
    refused = sign_in(page, "ada")
    assert refused.status_code == 401 and b"the IdP's ID token is not believed" in refused.data, refused.data
    assert _session_cookie(page) is None and _events(tmp_path, "web-signin-refused")


def test_an_id_token_without_a_nonce_is_refused(page, idp):
    idp.id_token_changes = {"nonce": None}
    refused = sign_in(page, "ada")
    assert refused.status_code == 401 and b"nonce" in refused.data and _session_cookie(page) is None


def test_a_jwks_with_ec_and_keyless_entries_beside_the_signing_key_still_signs_in(page, idp):
    from helpers.idp import ec_key, public_jwk
    idp.jwks_extra += [public_jwk(ec_key(), "ec-1", alg="ES256"), {"kty": "RSA", "kid": "keyless", "use": "sig"},
                       {"kty": "oct", "kid": "shared"}]
    assert sign_in(page, "ada").status_code == 302 and page.get("/api/session").get_json()["role"] == "operator"


DATA_ROUTES = ["/api/cluster", "/api/timeline", "/api/health", "/api/acceptance", "/api/repairs", "/api/future",
               "/future"]


def test_viewing_signed_in_closes_every_route_but_the_allow_list_and_a_session_without_a_role(tmp_path, idp):
    key = tmp_path / "session-key"
    key.write_text("k" * 64)
    os.chmod(key, 0o600)
    (tmp_path / "open").mkdir()
    (tmp_path / "closed").mkdir()
    opened = _page(tmp_path / "open", idp, web=f'session_key_file = "{key}"\n')
    assert sign_in(opened, "nob").status_code == 302  # no role: viewing only, while anyone may view
    roleless = _session_cookie(opened).value
    page = _page(tmp_path / "closed", idp, web=f'viewing = "signed-in"\nsession_key_file = "{key}"\n')
    page.application.add_url_rule("/api/future", "future", lambda: {"secret": 1})  # a route added later
    page.application.add_url_rule("/future", "future_page", lambda: "secret")
    for path in DATA_ROUTES:
        answer = page.get(path)
        assert answer.status_code == 401 and "needs sign-in" in answer.get_json()["error"], path
    for path in ("/", "/static/app.js", "/api/session"):
        assert page.get(path).status_code == 200, path
    page.set_cookie(COOKIE, roleless)
    for path in DATA_ROUTES:
        answer = page.get(path)
        assert answer.status_code == 403 and "needs a role" in answer.get_json()["error"], path
    page.delete_cookie(COOKIE)
    assert sign_in(page, "vic").status_code == 302
    for path in DATA_ROUTES:
        assert page.get(path).status_code in (200, 503), path  # 503: the watcher has not read this one yet


def test_with_a_session_key_file_a_logout_outlives_a_restart_and_sessions_sign_with_sha256(tmp_path):
    key = tmp_path / "session-key"
    key.write_text("k" * 64)
    os.chmod(key, 0o600)
    state = tmp_path / "state"
    state.mkdir()
    before = Sessions(600.0, str(key), folder=str(state))
    value, _ = before.issue("ada", "Ada", "", "admin")
    kept, _ = before.issue("bob", "Bob", "", "viewer")
    assert len(value.rsplit(".", 1)[1]) == 43  # an HMAC-SHA256 (32 bytes, base64), not SHA1's 20
    assert before.end(value) is not None
    after = Sessions(600.0, str(key), folder=str(state))  # the page restarted
    with pytest.raises(SessionRefused, match="signed out"):
        after.read(value)
    assert after.read(kept).subject == "bob"
    assert (state / "web-sessions-ended.json").stat().st_mode & 0o777 == 0o600
