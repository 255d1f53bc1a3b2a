"""Issue 28 item 21: the page runs as its own Unix user (web.user), never as root, and reads copies of its secrets.

A real controller agent starts the real page (`slurm-ext web`) as slurm-ext-web: its process's uid, gid and groups
are read from /proc; it still takes an operator's token (from the token file of hashes its group may read); as that
user nothing of root's is readable (the agent credential's original, the database password files, a Slurm key, the
copies made for another worker). A worker whose user the host lacks is not started, and the event says how to make
the user."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers.agent import AgentProcess, page_only_controller, page_user as helpers_page_user
from helpers.files import temp_dir
from helpers.wait import wait_for
from slurm_ext import credentials

PAGE_USER = "slurm-ext-web"
AGENT_PORT, PAGE_PORT = 19874, 19875
TOKEN = "t" * 32
NOBODY = 65534


@pytest.fixture(scope="module")
def page_user() -> pwd.struct_passwd:
    return helpers_page_user(PAGE_USER)


@pytest.fixture
def site():
    """A folder other users may enter (pytest's tmp_path is root's 0700), removed at the end."""
    folder = temp_dir(mode=0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _secret(path: Path, text: str, mode: int = 0o600, group: int = 0) -> Path:
    path.write_text(text + "\n")
    os.chown(path, 0, group)
    path.chmod(mode)
    return path


def _controller(site: Path, web: str, more: str = "") -> AgentProcess:
    """A controller agent whose only worker is the page (no Slurm here: the page says Slurm is away)."""
    return AgentProcess(site, page_only_controller(AGENT_PORT, PAGE_PORT, f'refresh = "1s"\n{web}\n{more}\n'),
                        role="controller", port=AGENT_PORT, slurm=f'conf = "{site}/no-such-slurm.conf"',
                        node=f'agent_credential = "{site}/etc/agent-credential"')


def _ask(path: str, token: str = "", headers: dict | None = None) -> tuple[int, dict]:
    """GET `path`, or POST it with `token` (and `headers`) as an operation."""
    request = urllib.request.Request(f"http://127.0.0.1:{PAGE_PORT}{path}", data=b"" if token else None,
                                     headers={**({"Authorization": f"Bearer {token}"} if token else {}),
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, {}


def _answers() -> bool:
    try:
        return _ask("/api/session")[0] == 200
    except OSError:
        return False


def _ids(pid: int) -> dict[str, list[int]]:
    """Uid, Gid and Groups of a process, from /proc."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid", "Groups"):
            found[key] = [int(word) for word in value.split()]
    return found


_READ = """import sys
for path in sys.argv[1:]:
    try:
        open(path, "rb").read()
        print("read", path)
    except OSError as err:
        print("refused", path, err.strerror)
"""


def _reads_as(user: pwd.struct_passwd, *paths: Path) -> dict[str, str]:
    """What `user` (uid, gid and groups as the agent gives them) can read of `paths`: read or refused, by path."""
    done = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
                           sys.executable, "-I", "-c", _READ, *map(str, paths)], capture_output=True, text=True,
                          timeout=60, env={"PATH": os.defpath})
    assert done.returncode == 0, done.stderr
    return {words[1]: words[0] for words in (line.split(" ", 2) for line in done.stdout.splitlines())}


def test_the_page_runs_as_its_user_takes_a_token_and_reads_nothing_of_roots(page_user, site):
    etc = site / "etc"
    etc.mkdir(mode=0o755)
    agent_credential = _secret(etc / "agent-credential", "c" * 64)
    slurmdbd_password = _secret(etc / "db-password", "slurmdbd-password-1234567890")
    repair_password = _secret(etc / "repair-password", "repair-password-1234567890")
    page_password = _secret(etc / "page-password", "page-password-1234567890")
    slurm_key = _secret(etc / "slurm.key", "k" * 64)
    hashed = hashlib.sha256(TOKEN.encode()).hexdigest()
    tokens = _secret(etc / "web-tokens", f"alice sha256:{hashed}", mode=0o640, group=page_user.pw_gid)
    agent = _controller(site, f'token_file = "{tokens}"', f"""\
        [accounting]
        password_file = "{slurmdbd_password}"
        repair_password_file = "{repair_password}"
        page_password_file = "{page_password}"
        [repair]
        database = "sqlite"
        sqlite_file = "{site}/repair.db"
        """)
    try:
        [started] = agent.wait_event("worker-state", worker="web", state="running", timeout=30)
        wait_for("the page answers", _answers, 30, interval=0.2)
        ids = _ids(started["pid"])
        assert ids["Uid"] == [page_user.pw_uid] * 4 and ids["Gid"] == [page_user.pw_gid] * 4, ids
        assert sorted(ids["Groups"]) == sorted(os.getgrouplist(PAGE_USER, page_user.pw_gid)), ids
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{started['pid']}/environ").read_text().split("\0") if "=" in item)
        assert environ["HOME"] == "/" and environ["USER"] == PAGE_USER
        copies = Path(environ[credentials.ENV])
        assert copies == site / "run" / "credentials" / "web"
        # the copies: its own, 0400 in a 0500 folder, only those it needs (its own database account's password)
        assert sorted(path.name for path in copies.iterdir()) == ["accounting.page_password_file",
                                                                  "node.agent_credential"]
        for path in (copies, *copies.iterdir()):
            info = path.stat()
            assert (info.st_uid, oct(info.st_mode & 0o777)) == (page_user.pw_uid, "0o500" if path == copies
                                                                else "0o400"), path
        assert (copies / "node.agent_credential").read_text() == agent_credential.read_text()

        status, session = _ask("/api/session")
        assert (status, session["tokens"], session["problem"]) == (200, True, ""), session  # the hashes were read
        asked = {"X-CSRF-Token": session["csrf"]}
        assert _ask("/api/nodes/n1/check", "u" * 32, asked)[0] == 401  # a token no one has
        assert _ask("/api/nodes/n1/check", TOKEN, asked)[0] in (404, 503)  # alice's: past the operator check

        # another worker's copies, made as the agent makes them, for nobody
        other = credentials.copy_for(agent_config(agent), "other", NOBODY, NOBODY, ("node.agent_credential",))
        said = _reads_as(page_user, agent_credential, slurmdbd_password, repair_password, page_password, slurm_key,
                         other / "node.agent_credential", copies / "node.agent_credential", tokens)
        assert said == {str(agent_credential): "refused", str(slurmdbd_password): "refused",
                        str(repair_password): "refused", str(page_password): "refused", str(slurm_key): "refused",
                        str(other / "node.agent_credential"): "refused",
                        str(copies / "node.agent_credential"): "read", str(tokens): "read"}, said
    finally:
        assert agent.stop() == 0, agent.text()[-3000:]
    # the page's copies go with the agent; the other worker's are not its to remove (another agent's, on a host
    # where two share the runtime directory), and with them gone the folder goes too
    assert not (site / "run" / "credentials" / "web").exists()
    assert (site / "run" / "credentials" / "other" / "node.agent_credential").exists()
    credentials.remove_all(site / "run", ["other"])
    assert not (site / "run" / "credentials").exists()


def agent_config(agent: AgentProcess):
    from slurm_ext import config
    return config.load(str(agent.config))


def test_a_page_whose_user_the_host_lacks_is_not_started_and_the_event_says_how_to_make_it(site):
    agent = _controller(site, 'user = "slurm-ext-nobody-here"\ntoken_file = ""')
    try:
        refused = agent.wait_event("worker-state", worker="web", timeout=30)[0]
        assert "pid" not in refused and refused["state"] != "running", refused
        assert ("runs as user slurm-ext-nobody-here (web.user, or supervisor.workers.web.user), which this host does "
                "not have: create it (useradd --system --no-create-home --shell /usr/sbin/nologin "
                "slurm-ext-nobody-here)") in refused["message"], refused
        assert not _answers()
    finally:
        assert agent.stop() == 0, agent.text()[-3000:]


def test_add_token_makes_the_file_of_hashes_readable_by_the_pages_group_only(page_user, site):
    """The page, as its user, reads the token file in place (it sees a revoked token at once): root's, its group
    the page's, 0640; the file holds hashes only."""
    conf = site / "cli.toml"
    conf.write_text(f'[node]\nstate_dir = "{site}/state"\n[web]\ntoken_file = "{site}/web-tokens"\n')
    added = subprocess.run([sys.executable, "-m", "slurm_ext.cli", "--config", str(conf), "web", "add-token",
                            "alice"], capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    info = (site / "web-tokens").stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (0, page_user.pw_gid, 0o640)
    assert "readable by the page's group" in added.stderr
    assert _reads_as(page_user, site / "web-tokens") == {str(site / "web-tokens"): "read"}
    nobody = pwd.getpwuid(NOBODY)
    assert _reads_as(nobody, site / "web-tokens") == {str(site / "web-tokens"): "refused"}


def test_the_page_as_its_user_keeps_a_logout_in_its_own_folder_across_its_restart(page_user, site):
    """Review 2, defect 1: [node] state_dir is root's; the agent makes <state_dir>/web/ the page's (0700) and the
    page, as web.user, writes the sessions ended by logout there, so a copied signed-out cookie stays refused."""
    from slurm_ext.web.session import COOKIE, ENDED_FILE, Sessions
    etc = site / "etc"
    etc.mkdir(mode=0o755)
    _secret(etc / "agent-credential", "c" * 64)
    key = _secret(etc / "session-key", "k" * 64)
    agent = _controller(site, f'token_file = ""\nsession_key_file = "{key}"')
    try:
        agent.wait_event("worker-state", worker="web", state="running", timeout=30)
        wait_for("the page answers", _answers, 30, interval=0.2)
        folder = site / "state" / "web"
        info = folder.stat()
        assert (info.st_uid, info.st_mode & 0o777) == (page_user.pw_uid, 0o700)
        value, _ = Sessions(600.0, str(key)).issue("ada", "Ada", "", "admin")  # as the page signs one, same key
        cookie = {"Cookie": f"{COOKIE}={value}"}
        status, session = _ask("/api/session", headers=cookie)
        assert status == 200 and session["user"] == "Ada (oidc:ada)", session
        request = urllib.request.Request(f"http://127.0.0.1:{PAGE_PORT}/auth/logout", data=b"", method="POST",
                                         headers={**cookie, "X-CSRF-Token": session["csrf"]})
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.status == 200
        kept = folder / ENDED_FILE
        assert (kept.stat().st_uid, kept.stat().st_mode & 0o777) == (page_user.pw_uid, 0o600)
        assert not agent.events("web-sessions-unkept")
        assert "cannot be kept" not in agent.text()
    finally:
        assert agent.stop() == 0, agent.text()[-3000:]
    agent = _controller(site, f'token_file = ""\nsession_key_file = "{key}"')  # the page restarted
    try:
        agent.wait_event("worker-state", worker="web", state="running", timeout=30)
        wait_for("the page answers", _answers, 30, interval=0.2)
        assert _ask("/api/session", headers={"Cookie": f"{COOKIE}={value}"})[1]["problem"].startswith(
            "this sign-in was ended (signed out)")
    finally:
        assert agent.stop() == 0, agent.text()[-3000:]
