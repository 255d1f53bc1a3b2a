"""The second review of the page's OIDC sign-in: each defect's fix, with a test that fails without it.

1. the sessions ended by logout are kept in the page's own folder (<state_dir>/web/, web.user's, made by the agent),
   written as that user; a folder it cannot write is said once at the start (log, web-sessions-unkept);
2. replay protection does not give way: a full set of used states refuses callbacks (503), a state cookie of before
   the process started is refused, /auth/login and /auth/callback are rate-limited per address (429);
3. the session cookie's path is the page's (under a proxy's sub-path);
4. a logout without the ID token (id_token_hint) does not send the browser to the IdP;
6. the ended sessions' file is cut at load, written outside the lock every request takes;
7. sign-in behind a proxy without web.oidc_redirect_url is refused by config.load.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.files import temp_dir
from slurm_ext import config, credentials
from slurm_ext.errors import ConfigError
from slurm_ext.web import session as session_mod, signin as signin_mod
from slurm_ext.web.session import COOKIE, ENDED_FILE, SessionRefused, Sessions
from slurm_ext.web.signin import STATE_COOKIE
import test_web_oidc
from test_web_oidc import _at_idp, _events, _page, _post, sign_in

NOBODY = 65534
# the sign-in tests' fixtures: a real IdP on 127.0.0.1, a clock the tests move, a page signed in through both
idp, clock, page = test_web_oidc.idp, test_web_oidc.clock, test_web_oidc.page


def _key(path: Path, uid: int = 0) -> Path:
    path.write_text("k" * 64)
    os.chown(path, uid, uid)
    path.chmod(0o600)
    return path


# -- 1. the ended sessions, as the page's user --------------------------------------------------------------------

_AS_PAGE = """
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
from slurm_ext.web.session import Sessions, SessionRefused
key, folder = sys.argv[1], sys.argv[2]
before = Sessions(600.0, key, folder=folder)
print("unkept", repr(before.unkept))
value, _ = before.issue("ada", "Ada", "", "admin")
other, _ = before.issue("bob", "Bob", "", "admin")
before.end(value)
before.end(other)
after = Sessions(600.0, key, folder=folder)
try:
    after.read(value)
    print("signed-out cookie works again")
except SessionRefused as err:
    print("refused", err)
"""


@pytest.fixture
def site():
    folder = temp_dir(mode=0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _as_nobody(key: Path, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable,
                           "-c", _AS_PAGE, str(key), str(folder)], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.defpath, "PYTHONPATH": os.pathsep.join(sys.path)}, cwd="/")


def test_a_page_run_as_its_user_keeps_the_ended_sessions_in_its_own_folder(site):
    state = site / "state"
    state.mkdir(mode=0o755)  # root's, as [node] state_dir is
    key = _key(site / "session-key", NOBODY)
    # what the agent does before it starts the page as web.user
    folder = credentials.state_folder(SimpleNamespace(node=SimpleNamespace(state_dir=str(state))), "web", NOBODY,
                                      NOBODY)
    assert folder == state / "web"
    info = folder.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (NOBODY, NOBODY, 0o700)
    done = _as_nobody(key, folder)
    assert done.returncode == 0, done.stderr
    assert "unkept ''" in done.stdout and "refused this sign-in was ended (signed out)" in done.stdout, done.stdout
    assert "cannot be kept" not in done.stderr, done.stderr
    kept = folder / ENDED_FILE
    assert (kept.stat().st_uid, kept.stat().st_mode & 0o777) == (NOBODY, 0o600)
    assert len(json.loads(kept.read_text())) == 2


def test_a_folder_the_page_cannot_write_is_said_once_at_the_start_not_at_every_logout(site):
    state = site / "state"
    state.mkdir(mode=0o755)  # root's: the page's user cannot write it
    key = _key(site / "session-key", NOBODY)
    done = _as_nobody(key, state)
    assert done.returncode == 0, done.stderr
    assert f"cannot be kept in {state}/{ENDED_FILE} (Permission denied)" in done.stdout, done.stdout
    # the first Sessions says it at its start; its two logouts say nothing more (the second Sessions says it again)
    assert done.stderr.count("cannot be kept") == 2, done.stderr


def test_the_agent_makes_the_pages_folder_its_users_and_refuses_a_link_in_its_place(site):
    state = site / "state"
    state.mkdir(mode=0o755)
    elsewhere = site / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (state / "web").symlink_to(elsewhere)
    conf = SimpleNamespace(node=SimpleNamespace(state_dir=str(state)))
    with pytest.raises(OSError):
        credentials.state_folder(conf, "web", NOBODY, NOBODY)
    assert elsewhere.stat().st_uid == 0  # root chowned nothing through the link
    (state / "web").unlink()
    (state / "web").mkdir(mode=0o755)  # left by an older page: taken over
    credentials.state_folder(conf, "web", NOBODY, NOBODY)
    assert ((state / "web").stat().st_uid, (state / "web").stat().st_mode & 0o777) == (NOBODY, 0o700)


def test_the_page_says_once_at_its_start_that_it_cannot_keep_ended_sessions(tmp_path, idp, caplog):
    key = _key(tmp_path / "session-key")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "web").write_text("")  # a file where the page's folder should be
    with caplog.at_level(logging.WARNING, logger="web"):
        page = _page(tmp_path, idp, web=f'session_key_file = "{key}"\n')
        [said] = _events(tmp_path, "web-sessions-unkept")
        assert said["severity"] == "warning" and f"{tmp_path}/state/web/{ENDED_FILE}" in said["message"]
        for user in ("ada", "vic"):
            assert sign_in(page, user).status_code == 302
            assert _post(page, "/auth/logout").status_code == 200
    assert sum("cannot be kept" in record.getMessage() for record in caplog.records if record.name == "web") == 1
    assert len(_events(tmp_path, "web-sessions-unkept")) == 1


def test_with_a_session_key_file_the_page_keeps_ended_sessions_under_state_dir_web(tmp_path, idp):
    key = _key(tmp_path / "session-key")
    page = _page(tmp_path, idp, web=f'session_key_file = "{key}"\n')
    sign_in(page, "ada")
    assert _post(page, "/auth/logout").status_code == 200
    assert len(json.loads((tmp_path / "state" / "web" / ENDED_FILE).read_text())) == 1
    assert not (tmp_path / "state" / ENDED_FILE).exists()
    assert _events(tmp_path, "web-sessions-unkept") == []


# -- 6. the ended sessions' file: cut at load, written outside the lock ------------------------------------------

def test_an_oversized_file_of_ended_sessions_is_cut_at_load_and_a_logout_stays_quick(tmp_path):
    key = _key(tmp_path / "session-key")
    now = time.time()
    (tmp_path / ENDED_FILE).write_text(json.dumps({f"s{n}": now + 100 + n for n in range(200000)}))
    sessions = Sessions(600.0, str(key), folder=str(tmp_path))
    assert len(sessions._ended) == session_mod._ENDED_MAX
    assert min(sessions._ended.values()) == now + 100 + 200000 - session_mod._ENDED_MAX  # the latest kept
    value, _ = sessions.issue("ada", "Ada", "", "admin")
    began = time.monotonic()
    assert sessions.end(value) is not None
    assert time.monotonic() - began < 2.0  # was min() per entry beyond the cap: minutes
    assert len(json.loads((tmp_path / ENDED_FILE).read_text())) == session_mod._ENDED_MAX


def test_requests_read_sessions_while_a_logout_writes_the_file(tmp_path, monkeypatch):
    key = _key(tmp_path / "session-key")
    sessions = Sessions(600.0, str(key), folder=str(tmp_path))
    ended, kept = sessions.issue("ada", "Ada", "", "admin")[0], sessions.issue("bob", "Bob", "", "viewer")[0]
    writing, go_on = threading.Event(), threading.Event()
    real = session_mod.atomic_write

    def slow_write(*args, **kwargs):
        writing.set()
        assert go_on.wait(10)
        return real(*args, **kwargs)
    monkeypatch.setattr(session_mod, "atomic_write", slow_write)
    logout = threading.Thread(target=sessions.end, args=(ended,))
    logout.start()
    try:
        assert writing.wait(10)
        read = []
        reader = threading.Thread(target=lambda: read.append(sessions.read(kept).subject))
        reader.start()
        reader.join(5)
        assert read == ["bob"]  # not held behind the fsync'd write
        with pytest.raises(SessionRefused, match="signed out"):
            sessions.read(ended)  # ended already, before its write
    finally:
        go_on.set()
        logout.join(10)
    assert list(json.loads((tmp_path / ENDED_FILE).read_text())) == [sessions._serializer().loads(ended)["sid"]]


# -- 2. replay protection and the sign-in's rate ----------------------------------------------------------------

def _begin(page) -> str:
    """A sign-in begun at the page, its state (the IdP never asked)."""
    began = page.get("/auth/login")
    assert began.status_code == 302, began.data
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(began.headers["Location"]).query))["state"]


def test_a_full_set_of_used_states_refuses_callbacks_instead_of_forgetting_one(page, idp, monkeypatch):
    monkeypatch.setattr(signin_mod, "_USED_MAX", 3)
    first = _begin(page)
    first_cookie = page.get_cookie(STATE_COOKIE, path="/auth/").value
    assert page.get(f"/auth/callback?state={first}&code=bogus").status_code == 401  # used, the code refused
    for _ in range(2):
        state = _begin(page)
        assert page.get(f"/auth/callback?state={state}&code=bogus").status_code == 401
    posts = idp.requests.count("POST /realm/token")
    state = _begin(page)
    full = page.get(f"/auth/callback?state={state}&code=bogus")
    assert full.status_code == 503 and "too many sign-ins in the last 10 min" in full.text, full.text
    assert full.headers["Retry-After"] == "60"
    assert idp.requests.count("POST /realm/token") == posts  # the IdP was not asked
    page.set_cookie(STATE_COOKIE, first_cookie, path="/auth/")
    replayed = page.get(f"/auth/callback?state={first}&code=bogus")  # the oldest was not pushed out
    assert replayed.status_code == 403 and "used already" in replayed.text


def test_a_state_cookie_from_before_the_page_started_is_refused(tmp_path, idp, clock):
    key = _key(tmp_path / "session-key")
    before = _page(tmp_path, idp, web=f'session_key_file = "{key}"\n', clock=clock)
    began = before.get("/auth/login")
    cookie = before.get_cookie(STATE_COOKIE, path="/auth/").value
    back = urllib.parse.urlsplit(_at_idp(began.headers["Location"], "ada"))
    clock.now += 1
    (tmp_path / "again").mkdir()
    after = _page(tmp_path / "again", idp, web=f'session_key_file = "{key}"\n', clock=clock)  # restarted
    after.set_cookie(STATE_COOKIE, cookie, path="/auth/")
    refused = after.get(f"/auth/callback?{back.query}")
    assert refused.status_code == 403 and "begun before the page restarted" in refused.text, refused.text
    assert after.get_cookie(COOKIE) is None


def test_sign_ins_are_rate_limited_per_address(page, idp):
    for _ in range(signin_mod.RATE):
        assert page.get("/auth/login").status_code == 302
    refused = page.get("/auth/login")
    assert refused.status_code == 429 and "too many sign-ins from 127.0.0.1 (at most 20 a minute)" in refused.text
    assert int(refused.headers["Retry-After"]) >= 1
    callback = page.get("/auth/callback?state=s&code=bogus")
    assert callback.status_code == 429  # the same bucket: no POST to the IdP
    assert page.get("/auth/login", environ_base={"REMOTE_ADDR": "10.0.0.2"}).status_code == 302  # another address
    assert _events(Path(page.db).parent, "web-signin-refused")


# -- 3. the session cookie's path ---------------------------------------------------------------------------------

def test_under_a_sub_path_the_session_cookie_is_the_pages_only(tmp_path, idp, clock):
    page = _page(tmp_path, idp, web='oidc_redirect_url = "http://localhost/prefix/auth/callback"\n', clock=clock)
    began = page.get("/auth/login")
    state = page.get_cookie(STATE_COOKIE, path="/prefix/auth/").value
    back = urllib.parse.urlsplit(_at_idp(began.headers["Location"], "ada"))
    page.set_cookie(STATE_COOKIE, state, path="/auth/")  # the proxy takes /prefix off
    done = page.get(f"/auth/callback?{back.query}")
    [session_cookie] = [c for c in done.headers.getlist("Set-Cookie") if c.startswith(COOKIE + "=")]
    assert "Path=/prefix/" in session_cookie, session_cookie
    value = page.get_cookie(COOKIE, path="/prefix/").value
    page.set_cookie(COOKIE, value, path="/")  # as the browser sends it to the page, the proxy having taken /prefix
    out = _post(page, "/auth/logout")
    assert out.status_code == 200
    [gone] = [c for c in out.headers.getlist("Set-Cookie") if c.startswith(COOKIE + "=")]
    assert "Path=/prefix/" in gone and "Expires=Thu, 01 Jan 1970" in gone, gone
    page.set_cookie(COOKIE, value, path="/")
    clock.now += 3601
    expired = page.get("/api/cluster")
    [forgotten] = [c for c in expired.headers.getlist("Set-Cookie") if c.startswith(COOKIE + "=")]
    assert expired.status_code == 401 and "Path=/prefix/" in forgotten


# -- 4. logout without the ID token ------------------------------------------------------------------------------

def test_a_logout_without_the_id_token_stays_at_the_page_and_says_the_idps_session_may_be_open(tmp_path, idp, clock):
    key = _key(tmp_path / "session-key")
    before = _page(tmp_path, idp, web=f'session_key_file = "{key}"\n', clock=clock)
    assert sign_in(before, "ada").status_code == 302
    value = before.get_cookie(COOKIE).value
    (tmp_path / "again").mkdir()
    after = _page(tmp_path / "again", idp, web=f'session_key_file = "{key}"\n', clock=clock)  # restarted
    after.set_cookie(COOKIE, value)
    out = _post(after, "/auth/logout")
    said = out.get_json()
    assert out.status_code == 200 and said["redirect"] == "/" and said["idp_session_open"] is True, said
    assert "your session at the IdP may still be open" in said["message"]
    assert after.get("/api/session").get_json()["user"] is None
    # with the hint kept (same process), the IdP's logout, as before
    assert sign_in(after, "ada").status_code == 302
    out = _post(after, "/auth/logout").get_json()
    assert out["redirect"].startswith(f"{idp.issuer}/logout?") and "id_token_hint=" in out["redirect"]
    assert out["idp_session_open"] is False


# -- 7. the config refuses sign-in behind a proxy without the redirect URL ---------------------------------------

def test_config_load_refuses_sign_in_behind_a_proxy_without_the_redirect_url(tmp_path):
    path = tmp_path / "slurm-ext.toml"
    path.write_text('[oidc]\nissuer = "https://idp.example"\n[web]\noidc_client_id = "page"\n'
                    'trusted_proxies = ["127.0.0.1"]\nproxy_user_header = "X-Remote-User"\n')
    with pytest.raises(ConfigError, match="web.oidc_redirect_url: sign-in behind a reverse proxy") as refused:
        config.load(path)
    assert refused.value.key == "web.oidc_redirect_url" and refused.value.line == 3
    path.write_text(path.read_text() + 'oidc_redirect_url = "https://page.example/auth/callback"\n')
    assert config.load(path).web.oidc_redirect_url == "https://page.example/auth/callback"
    path.write_text('[web]\ntrusted_proxies = ["127.0.0.1"]\nproxy_user_header = "X-Remote-User"\n')
    assert config.load(path).web.trusted_proxies == ("127.0.0.1",)  # no sign-in: nothing to refuse
