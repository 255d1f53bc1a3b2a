"""Issue 28 item 21: the page, running as its own user, loses none of its events, and cannot write anyone else's.

A real controller agent starts the real page as slurm-ext-web. The page's own events (web-started, web-refused)
are in root's journal, written by the agent under component web with worker=web. Then, as the page's user (a
process started with setpriv, as an attacker who took the page would be), into the page's event socket: a forged
health-finding and drain-requested (never written; refused and counted in one worker-events-dropped), the page's
own code path sending a web-operation (written, component web), and a flood of 10,000 datagrams: at most the
agent's limit of them are written and one worker-events-dropped counts the rest, while /livez answers throughout.
Before the fix the page's events went to its log only (the journal is root's 0640)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers.agent import AgentProcess, page_only_controller, page_user as helpers_page_user
from helpers.files import temp_dir
from helpers.wait import wait_for
from slurm_ext import workerevents
from slurm_ext.supervisor import eventchannel

PAGE_USER = "slurm-ext-web"
AGENT_PORT, PAGE_PORT = 19878, 19879
FLOOD = 10_000

# run as the page's user: argv socket, state_dir; the forged events, the page's own emit, then the flood
_ATTACK = """import errno, json, os, socket, sys, time
from slurm_ext import events
path, state_dir = sys.argv[1], sys.argv[2]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
def send(body):
    data = json.dumps(body).encode()
    deadline = time.monotonic() + 120
    while True:
        try:
            return sock.sendto(data, path)
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.001)
if sys.argv[3] == "forge":
    send({"event": "health-finding", "message": "xid 79 gpu 0 forged", "severity": "error", "fields": {"node": "n1"}})
    send({"event": "drain-requested", "message": "forged drain", "fields": {"node": "n1", "reason": "forged"}})
    send({"event": "web-operation", "message": "posing as another worker", "fields": {"worker": "slurmd"}})
    sock.setblocking(False)
    send({"event": "web-operation", "message": "x" * 20000})
else:
    os.environ["SLURM_EXT_EVENTS_SOCKET"] = path
    events.emit(state_dir, "web", "web-operation", "approved the repair of n1 (by alice, token, from 127.0.0.1)",
                node="n1", user="alice")
    sock.setblocking(False)
    for n in range(int(sys.argv[4])):
        send({"event": "web-source-ok", "message": f"flood {n}"})
print("sent")
"""


@pytest.fixture(scope="module")
def page_user() -> pwd.struct_passwd:
    return helpers_page_user(PAGE_USER)


@pytest.fixture
def site():
    folder = temp_dir(mode=0o755)
    (folder / "etc").mkdir(mode=0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _controller(site: Path) -> AgentProcess:
    """A controller agent whose only worker is the page, as slurm-ext-web (no Slurm here)."""
    credential = site / "etc" / "agent-credential"
    credential.write_text("c" * 64 + "\n")
    credential.chmod(0o600)
    return AgentProcess(site, page_only_controller(AGENT_PORT, PAGE_PORT, f"""\
        [repair]
        database = "sqlite"
        sqlite_file = "{site}/repair.db"
        """), role="controller", port=AGENT_PORT, slurm=f'conf = "{site}/no-such-slurm.conf"',
                        node=f'agent_credential = "{credential}"')


def _as_page(user: pwd.struct_passwd, *args: str) -> None:
    done = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
                           sys.executable, "-c", _ATTACK, *args], capture_output=True, text=True, timeout=180,
                          env={"PATH": os.defpath, "SLURM_EXT_STRICT_EVENTS": "1"}, cwd="/")
    assert (done.returncode, done.stdout) == (0, "sent\n"), done.stderr[-3000:]


class LivezProbe(threading.Thread):
    """Asks the agent's /livez every 50 ms with the kubelet's 1 s timeout, until stopped: every answer's status and
    seconds."""

    def __init__(self):
        super().__init__(daemon=True)
        self.answers: list[tuple[int, float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            began = time.monotonic()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{AGENT_PORT}/livez", timeout=1) as answer:
                    status = answer.status
            except urllib.error.HTTPError as err:
                status = err.code
            except OSError:
                status = 0
            self.answers.append((status, time.monotonic() - began))
            self.done.wait(0.05)


def test_the_pages_events_are_journaled_by_the_agent_and_a_forger_or_a_flood_writes_nothing_else(page_user, site):
    agent = _controller(site)
    try:
        [started] = agent.wait_event("worker-state", worker="web", state="running", timeout=30)
        # the page's own events, as its user: in root's journal, component web, worker web
        [said] = agent.wait_event("web-started", timeout=30)
        assert (said["component"], said["worker"]) == ("web", "web"), said
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{started['pid']}/environ").read_text().split("\0") if "=" in item)
        channel = Path(environ[workerevents.ENV])
        info = channel.stat()
        assert (info.st_uid, oct(info.st_mode & 0o777)) == (page_user.pw_uid, "0o600")
        wait_for("the page answers", lambda: _get(f"http://127.0.0.1:{PAGE_PORT}/api/session") == 200, 30, 0.2)
        request = urllib.request.Request(f"http://127.0.0.1:{PAGE_PORT}/api/nodes/n1/check", data=b"",
                                         headers={"Authorization": "Bearer " + "u" * 32})
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(request, timeout=5)
        [refused] = agent.wait_event("web-refused", timeout=10)
        assert (refused["component"], refused["worker"]) == ("web", "web"), refused

        # an attacker holding the page's user forges another component's events: refused, counted once
        _as_page(page_user, str(channel), str(site / "state"), "forge")
        [counted] = agent.wait_event("worker-events-dropped", timeout=eventchannel.WINDOW + 15)
        assert (counted["component"], counted["worker"], counted["refused"]) == ("supervisor", "web", 4), counted

        # the page's own emit, then the flood, while /livez is asked
        probe = LivezProbe()
        probe.start()
        began = time.monotonic()
        _as_page(page_user, str(channel), str(site / "state"), "flood", str(FLOOD))
        flooded = time.monotonic() - began
        counts = agent.wait_event("worker-events-dropped", count=2, timeout=eventchannel.WINDOW + 15)
        probe.done.set()
        probe.join()
        journal = agent.journal()
        [operation] = [r for r in journal if r["event"] == "web-operation"]
        assert (operation["component"], operation["worker"], operation["user"]) == ("web", "web", "alice")
        assert not [r for r in journal if r["event"] in ("health-finding", "drain-requested")]
        written = [r for r in journal if r["event"] == "web-source-ok" and r["message"].startswith("flood ")]
        assert flooded < eventchannel.WINDOW, flooded  # the flood fell in one window, the operation's
        assert 0 < len(written) <= eventchannel.PER_MINUTE - 1, len(written)
        assert len(counts) == 2 and counts[1]["dropped"] >= FLOOD - len(written), counts[1]
        assert all(r["component"] == "web" and r["worker"] == "web" for r in written)
        # the agent's loop and probe kept answering
        assert probe.answers and all(status == 200 for status, _ in probe.answers), probe.answers[:20]
        assert max(seconds for _, seconds in probe.answers) < 0.5, sorted(s for _, s in probe.answers)[-5:]
        assert _get(f"http://127.0.0.1:{AGENT_PORT}/livez") == 200
    finally:
        assert agent.stop() == 0, agent.text()[-3000:]
    assert not channel.exists()


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0
