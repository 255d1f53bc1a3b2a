"""The node agent under attack and fault, for real (issue 9, items 7, 14, 19, 24; issue 28, items 2 and 20).

- /livez keeps answering while a job (uid nobody) holds hundreds of idle and
  slow-loris connections to the agent's port, also at a low descriptor limit;
- /livez keeps answering within the kubelet's 1 s while clients with the agent
  credential ask /events?since=0 in a loop of a full (64 MiB) journal;
- the agent's log.file is created 0640, as the journal, whatever the umask;
- a slow start step (a node-boot script) runs off the loop: the agent keeps
  reaping and answering, and the script's exit status is its own;
- a worker's main process followed through MAINPID= is held by pidfd: when
  its pid is recycled, the new process is neither taken for the worker nor
  signalled;
- the hook service does not import a `slurm_ext` package planted in the
  directory the agent was started from.
"""

from __future__ import annotations

import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from slurm_ext import agentapi, events
from slurm_ext.procfs import all_stats, pid_alive

NOBODY = 65534
#: "a few seconds": the longest an idle or slow-loris connection may stay open (the agent's HEAD_TIMEOUT is 5 s)
CLOSED_WITHIN = 6.5
#: a Python that nobody may run (the test's own may live under /root); the attacker needs only the stdlib
USER_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
SLEEPER = ('[supervisor.workers.sshd]\nroles = []\n'
           '[supervisor.workers.a]\nroles = ["login"]\ncommand = ["sleep", "300"]\n')


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get_livez(port: int, timeout: float = 5.0) -> tuple[int, float]:
    """(HTTP status, seconds) of one GET /livez on a new connection; status 0: no answer in time."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            conn.sendall(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := conn.recv(4096):
                answer += chunk
    except OSError:
        return 0, time.monotonic() - started
    seconds = time.monotonic() - started
    try:
        return int(answer.split(b" ", 2)[1]), seconds
    except (IndexError, ValueError):
        return 0, seconds


# A job's process: holds `idle` silent connections and `loris` ones that send one byte of a request head a
# second, opens a new one for each the agent closes, and at the end reports what the agent did to them.
ATTACKER = textwrap.dedent("""\
    import json, selectors, socket, sys, time
    port, idle, loris, seconds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    head = b"GET /livez HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nX-Slow: " + b"a" * 10000
    selector = selectors.DefaultSelector()
    held = {}
    closed = {"idle": 0, "loris": 0}
    failed = 0
    def hold(kind):
        global failed
        try:
            conn = socket.create_connection(("127.0.0.1", port), timeout=3)
        except OSError:
            failed += 1
            return
        conn.setblocking(False)
        held[conn] = [kind, time.monotonic(), 0]
        selector.register(conn, selectors.EVENT_READ)
    opening = time.monotonic() + 5  # a server that accepts nothing leaves connects hanging: not for ever
    for kind, count in (("idle", idle), ("loris", loris)):
        for _ in range(count):
            if time.monotonic() < opening:
                hold(kind)
    print(json.dumps({"held": len(held), "uid": __import__("os").getuid()}), flush=True)
    end = time.monotonic() + seconds
    next_byte = time.monotonic() + 1
    while time.monotonic() < end:
        for key, _ in selector.select(0.05):
            conn = key.fileobj
            try:
                data = conn.recv(4096)
            except OSError:
                data = b""
            if data:
                continue
            kind = held.pop(conn)[0]
            selector.unregister(conn)
            conn.close()
            closed[kind] += 1
            hold(kind)
        if time.monotonic() >= next_byte:
            next_byte += 1
            for conn, (kind, _, sent) in list(held.items()):
                if kind == "loris":
                    try:
                        conn.send(head[sent:sent + 1])
                    except OSError:
                        pass
                    held[conn][2] += 1
    now = time.monotonic()
    print(json.dumps({"closed": closed, "failed": failed, "held": len(held),
                      "oldest": round(max(now - since for _, since, _ in held.values()), 2)}), flush=True)
    """)


class Attacker:
    """ATTACKER run as uid nobody, stopped by its PID."""

    def __init__(self, port: int, idle: int, loris: int, seconds: float):
        self.proc = subprocess.Popen([USER_PYTHON, "-c", ATTACKER, str(port), str(idle), str(loris),
                                      str(seconds)], stdout=subprocess.PIPE, text=True, user=NOBODY, group=NOBODY,
                                     extra_groups=[], cwd="/")
        self.started = json.loads(self.proc.stdout.readline())

    def report(self, timeout: float) -> dict:
        out, _ = self.proc.communicate(timeout=timeout)
        return json.loads(out.splitlines()[-1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def attackers():
    started: list[Attacker] = []

    def start(*args) -> Attacker:
        attacker = Attacker(*args)
        started.append(attacker)
        return attacker

    yield start
    for attacker in started:
        attacker.stop()


def probe_many(port: int, count: int, every: float = 0.1, timeout: float = 2.0) -> list[tuple[int, float]]:
    """`count` GETs of /livez, `every` seconds apart; ends early at the first that is not answered 200."""
    results = []
    for _ in range(count):
        results.append(get_livez(port, timeout=timeout))
        if results[-1][0] != 200:
            break
        time.sleep(every)
    return results


# -- item 7: /livez under a connection flood -----------------------------------------------


def test_livez_answers_while_a_job_holds_500_idle_and_slow_loris_connections(agents, attackers):
    port = free_port()
    agent = agents(SLEEPER, port=port)
    agent.wait_event("worker-state", worker="a", state="running")
    attack_seconds = CLOSED_WITHIN + 3.5
    attacker = attackers(port, 500, 20, attack_seconds)
    assert attacker.started == {"held": 520, "uid": NOBODY}
    answers = probe_many(port, 40)
    report = attacker.report(timeout=attack_seconds + 30)
    # every probe answered within its 2 s: how fast (the median, the worst) is bench_livez's figure
    assert [code for code, _ in answers] == [200] * 40, answers
    # every connection is closed within the timeout (shed sooner), slow loris included, and opened again
    assert report["oldest"] < CLOSED_WITHIN, report
    assert report["closed"]["idle"] >= 500 and report["closed"]["loris"] >= 20, report
    assert agent.proc.poll() is None and agent.stop() == 0


def test_at_a_low_descriptor_limit_a_connection_flood_does_not_stop_livez(agents, attackers):
    port = free_port()
    agent = agents(SLEEPER, port=port)
    agent.wait_event("worker-state", worker="a", state="running")
    resource.prlimit(agent.proc.pid, resource.RLIMIT_NOFILE, (64, 64))
    attacker = attackers(port, 300, 0, 6)
    answers = probe_many(port, 30)
    attacker.report(timeout=40)
    assert [code for code, _ in answers] == [200] * 30, answers  # each within its 2 s
    assert agent.proc.poll() is None, agent.text()[-3000:]
    assert get_livez(port)[0] == 200
    assert agent.stop() == 0


def _exchange(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Send `data` on a new connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(data)
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    return answer


def test_probe_server_answers_bad_requests_sheds_the_oldest_and_times_out_idle_ones():
    from slurm_ext.supervisor.http import MAX_HEAD, ProbeServer
    server = ProbeServer("127.0.0.1", 0, lambda path, headers: (200, path.encode(), "text/plain"), max_connections=3,
                         timeout=0.5).start()
    port = server.address[1]
    try:
        assert _exchange(port, b"GET /livez?x=1 HTTP/1.1\r\nHost: a\r\n\r\n").endswith(b"\r\n\r\n/livez?x=1")
        assert _exchange(port, b"POST /livez HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405 ")
        assert _exchange(port, b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        assert _exchange(port, b"GET /" + b"x" * MAX_HEAD).startswith(b"HTTP/1.1 431 ")
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        time.sleep(0.1)
        assert _exchange(port, b"GET /readyz HTTP/1.1\r\n\r\n").endswith(b"/readyz"), "the cap blocked a probe"
        idle[0].settimeout(1.0)
        assert idle[0].recv(1) == b"", "the oldest connection was not shed for the new one"
        idle[2].settimeout(2.0)  # four times the server's timeout: a recv that times out fails the test
        assert idle[2].recv(1) == b"", "an idle connection outlived the timeout"
        for conn in idle:
            conn.close()
    finally:
        server.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


# -- issue 28, item 2: /events?since=0 in a loop does not silence /livez ------------------------------------


def write_full_journal(state_dir: Path, total: int = (events.JOURNAL_KEEP + 1) * events.JOURNAL_MAX_BYTES,
                       end: float | None = None) -> float:
    """A journal as full as its rotation lets it be (journal.jsonl.3 .. .1 and journal.jsonl, each just under
    events.JOURNAL_MAX_BYTES), lines as events.emit writes them, one a second up to `end` (now): mostly a worker's
    events, one in ten a failed script's with 8 KiB of its output. Returns the time of the last line."""
    end = time.time() if end is None else end
    small = '{{"time": "{}", "component": "supervisor", "event": "worker-state", "severity": "info", ' \
            '"message": "worker a: running -> backoff: died (exit status 1)", "role": "login", "worker": "a", ' \
            '"state": "backoff", "was": "running", "n": {}}}\n'
    large = '{{"time": "{}", "component": "prolog_epilog", "event": "script-failed", "severity": "error", ' \
            '"message": "job {}: job-end script 50-nccl exited 1", "job": {}, "output": "' + "x" * 8000 + '"}}\n'
    per_file = events.JOURNAL_MAX_BYTES - 2**16
    files = events.journal_files(str(state_dir))[-(total // per_file or 1):]
    lines_per_file = per_file // 1060  # the lines' mean size, and a little more
    count = lines_per_file * len(files)
    state_dir.mkdir(parents=True, exist_ok=True)
    number = 0
    for path in files:
        with open(path, "w") as out:
            for _ in range(lines_per_file):
                when = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(end - (count - 1 - number)))
                out.write(large.format(when, number, number) if number % 10 == 9 else small.format(when, number))
                number += 1
        path.chmod(0o640)
    return end


# A client of the controller's (the agent credential): asks /events?since=0 in a loop as the controller does (a busy
# agent's 503 is asked once more a second later, then counted), until the stop file exists; says "going" after its
# first answer, and at the end what it got.
EVENTS_CLIENT = textwrap.dedent("""\
    import json, os, sys, time
    from slurm_ext import agentapi
    from slurm_ext.agentapi import AgentAnswerError, AgentClient
    credential, node, port, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    client = AgentClient(credential, port, {node: f"127.0.0.1:{port}"}, 30.0)
    report = {"pages": 0, "busy": 0, "failed": [], "events": [], "newest": 0.0}
    end = time.monotonic() + 600
    while not os.path.exists(stop) and time.monotonic() < end:
        try:
            page = client.events(node, since=0)
        except AgentAnswerError as err:
            if err.status == 503 and agentapi.BUSY in str(err):
                report["busy"] += 1
                continue
            report["failed"].append(str(err)[:300])
        else:
            report["pages"] += 1
            report["events"].append(len(page.events))
            report["newest"] = min(report["newest"] or 9e99, page.events[-1].time)
        if report["pages"] + len(report["failed"]) == 1:
            print("going", flush=True)
    report["events"] = sorted(set(report["events"]))
    print(json.dumps(report), flush=True)
    """)


class EventsClients:
    """`count` EVENTS_CLIENT processes, as root with the agent credential, stopped by the stop file or their PIDs."""

    def __init__(self, credential: Path, node: str, port: int, count: int, workdir: Path):
        self.stop_file = workdir / "events-clients-stop"
        self.procs = [subprocess.Popen([sys.executable, "-c", EVENTS_CLIENT, str(credential), node, str(port),
                                        str(self.stop_file)], stdout=subprocess.PIPE, text=True, cwd=workdir)
                      for _ in range(count)]

    def wait_going(self, timeout: float) -> None:
        """Until each client has had its first answer (a page or a failure)."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            assert ready and proc.stdout.readline() == "going\n", "an /events client had no answer in time"

    def report(self, timeout: float = 60.0) -> list[dict]:
        self.stop_file.touch()
        return [json.loads(proc.communicate(timeout=timeout)[0].splitlines()[-1]) for proc in self.procs]

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()


@pytest.fixture
def events_clients():
    started: list[EventsClients] = []

    def start(*args) -> EventsClients:
        started.append(EventsClients(*args))
        return started[-1]

    yield start
    for clients in started:
        clients.kill()


#: the kubelet's default livenessProbe timeoutSeconds
KUBELET_TIMEOUT = 1.0


def test_livez_answers_while_clients_loop_events_since_0_of_a_full_journal(agents, events_clients, tmp_path):
    """The issue's fault: /events of a 64 MiB journal was read whole on the probe thread (2.2 s a request), and three
    clients asking it in a loop made every probe with the kubelet's 1 s timeout fail. Read from the end, on a thread
    of its own, and 503 while it is busy: every probe answers in time (how fast is bench_livez's --events figure),
    and every page is the journal's newest 20,000 events."""
    credential = tmp_path / "agent-credential"
    agentapi.create_credential(credential)
    written_end = write_full_journal(tmp_path / "state")
    assert sum(path.stat().st_size for path in (tmp_path / "state").iterdir()) > 60 * 2**20
    port = free_port()
    agent = agents(SLEEPER, port=port, node=f'agent_credential = "{credential}"')
    agent.wait_event("worker-state", worker="a", state="running", timeout=30)
    clients = events_clients(credential, "testnode", port, 3, tmp_path)
    clients.wait_going(timeout=60)
    answers = probe_many(port, 20, every=0.2, timeout=KUBELET_TIMEOUT)
    reports = clients.report()
    assert [code for code, _ in answers] == [200] * 20, answers
    for report in reports:
        assert report["failed"] == [] and report["pages"] >= 1, report
        assert report["events"] == [20000], report  # the limit, none cut: the newest 20,000 of some 64,000
        assert report["newest"] >= int(written_end), report  # each page ends at the journal's end
    assert agent.proc.poll() is None and agent.stop() == 0


# -- issue 28, item 20: the log file is as private as the journal ------------------------------------------


def _agent_logging_to(tmp_path: Path, log_file: Path) -> str:
    """Run `slurm-ext supervise` under umask 022 with [log] file = `log_file` until it serves its probes (it logs so),
    then stop it; returns what it logged."""
    config = tmp_path / "slurm-ext.toml"
    config.write_text(f'[node]\nname = "testnode"\nstate_dir = "{tmp_path}/state"\nruntime_dir = "{tmp_path}/run"\n'
                      f'[log]\nfile = "{log_file}"\n' + SLEEPER)
    agent = subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "--config", str(config), "supervise", "--role",
                              "login", "--port", str(free_port())], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, umask=0o022, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while not (log_file.exists() and "probes and metrics on" in log_file.read_text()):
            assert agent.poll() is None and time.monotonic() < deadline, agent.stderr.read().decode()[-3000:]
            time.sleep(0.05)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
        agent.stderr.close()
    return log_file.read_text()


def test_the_agents_log_file_is_created_0640_and_an_existing_one_is_tightened_to_it(tmp_path):
    """log.file holds every event's fields, script output included, as the journal does: it was created 0644 under
    the usual umask, for any user of the node to read other users' jobs in it. Now 0640, like the journal; a file
    that an earlier version made 0644 loses its group write and others' bits at the agent's start (said once in the
    log), and an operator's 0600 is not loosened."""
    made, loose, private = tmp_path / "made.log", tmp_path / "loose.log", tmp_path / "private.log"
    assert "supervisor INFO: probes and metrics on" in _agent_logging_to(tmp_path, made)
    loose.write_text("")
    loose.chmod(0o644)
    logged = _agent_logging_to(tmp_path, loose)
    assert "supervisor INFO: probes and metrics on" in logged
    assert f"log.file {loose} was readable by others (0o644): now 0o640" in logged
    private.write_text("")
    private.chmod(0o600)
    assert "was readable by others" not in _agent_logging_to(tmp_path, private)
    assert [oct(path.stat().st_mode & 0o777) for path in (made, loose, private)] == [oct(0o640), oct(0o640),
                                                                                   oct(0o600)]
    journal = tmp_path / "state" / "journal.jsonl"
    assert made.stat().st_mode & 0o777 == journal.stat().st_mode & 0o777  # as the journal


# -- item 14: start steps off the loop -----------------------------------------------------


def _zombies_of(parent: int) -> int:
    return sum(1 for stat in all_stats() if stat.state == "Z" and stat.ppid == parent)


def _node_boot_script(tmp_path: Path, body: str, name: str = "10-boot") -> Path:
    directory = tmp_path / "login" / "node-boot.d"
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / name
    script.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    script.chmod(0o755)
    return script


def test_a_slow_node_boot_script_leaves_the_loop_reaping_and_answering(agents, tmp_path):
    started = tmp_path / "boot-started"
    _node_boot_script(tmp_path, f"""\
        touch {started}
        for i in $(seq 40); do (sleep 0.05 &); done
        sleep 5
        """)
    port = free_port()
    agent = agents(SLEEPER, port=port)
    deadline = time.monotonic() + 20
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), agent.text()[-3000:]
    time.sleep(1.0)  # the script's 40 orphans have exited
    assert not agent.events("worker-state", worker="a"), "a worker started before the node-boot script ended"
    assert _zombies_of(agent.pid) == 0, "orphans left as zombies while a start step runs"
    assert agent.metric("slurm_ext_supervisor_orphans_reaped_total", role="login") >= 40
    answers = probe_many(port, 10, every=0.2)
    # each answered within its 2 s while the script still had seconds to run: the loop is not waiting for it
    assert [code for code, _ in answers] == [200] * 10 and not [e for e in agent.journal() if e["event"] == "script-ok"]
    agent.wait_event("worker-state", worker="a", state="running", timeout=15)
    assert [e["exit_code"] for e in agent.journal() if e["event"] == "script-ok"] == [0]
    assert agent.stop() == 0


def test_stopping_while_a_node_boot_script_runs_kills_the_script(agents, tmp_path):
    pids = tmp_path / "pids"
    _node_boot_script(tmp_path, f"""\
        sleep 300 &
        echo $$ $! > {pids}
        wait
        """)
    agent = agents(SLEEPER, port=free_port())
    deadline = time.monotonic() + 20
    while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    script, child = map(int, pids.read_text().split())
    try:
        started = time.monotonic()
        assert agent.stop() == 0
        assert time.monotonic() - started < 5, "the agent waited for the node-boot script"
        time.sleep(0.2)
        assert not pid_alive(script) and not pid_alive(child), "a node-boot script outlived the agent"
    finally:
        for pid in (child, script):  # what a failure left behind
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    abandoned = [e for e in agent.journal() if e["event"] == "start-steps-abandoned"]
    assert len(abandoned) == 1 and str(child) in abandoned[0]["message"], abandoned


def test_a_node_boot_scripts_exit_status_is_its_own_under_the_agent(agents, tmp_path):
    # each script exits at once while an orphan of it keeps its output open: the agent's loop hears of the
    # exit first (SIGCHLD), and a reaper that took it would leave the step exit code 0 (ECHILD), so the node
    # would boot past a failed script
    for number in range(5):
        _node_boot_script(tmp_path, """\
            (sleep 0.3 &)
            exit 3
            """, name=f"{number}0-boot")
    agent = agents(SLEEPER, port=free_port())
    agent.wait_event("start-step-failed", count=2, timeout=30,
                     message=re.compile("start step node-boot-scripts failed: .*workers are not started until it "
                                        "succeeds"))
    results = [(e["event"], e["exit_code"]) for e in agent.journal() if e["event"].startswith("script-")]
    assert results[:10] == [("script-failed", 3)] * 10, results
    assert not agent.events("worker-state", worker="a")
    assert agent.stop() == 0


# -- item 19: pidfds, not pids --------------------------------------------------------------

# As PID 1 of its own PID namespace (every process there is its descendant): fork a child, announce it
# as MAINPID, reap it itself once the agent follows it, then make the kernel give its pid to an
# innocent process (ns_last_pid) that records any SIGTERM. Started again, it just sleeps.
RECYCLER = textwrap.dedent("""\
    import os, socket, subprocess, sys, time
    state = sys.argv[1]
    if os.path.exists(f"{state}/first-done"):
        time.sleep(300)
    open(f"{state}/first-done", "w").close()
    child = os.fork()
    if child == 0:
        time.sleep(300)
        os._exit(0)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.connect(os.environ["NOTIFY_SOCKET"])
    notify.send(f"READY=1\\nMAINPID={child}".encode())
    while not os.path.exists(f"{state}/go"):
        time.sleep(0.02)
    os.kill(child, 9)
    os.waitpid(child, 0)   # reaped here: the agent gets no exit status for it
    with open("/proc/sys/kernel/ns_last_pid", "w") as last:
        last.write(str(child - 1))
    innocent = ("import os, signal, sys, time\\n"
                "signal.signal(signal.SIGTERM, lambda *a: open(sys.argv[1] + '/innocent-signalled', 'w').close())\\n"
                "open(sys.argv[1] + '/innocent-pid', 'w').write(str(os.getpid()))\\n"
                "time.sleep(300)\\n")
    subprocess.Popen([sys.executable, "-c", innocent, state], start_new_session=True)
    time.sleep(300)
    """)


def test_a_recycled_main_pid_is_neither_taken_for_the_worker_nor_signalled(agents, tmp_path):
    script = tmp_path / "recycler.py"
    script.write_text(RECYCLER)
    state = tmp_path / "recycle"
    state.mkdir()
    agent = agents(f"""\
        leave_root_cgroup = false
        [supervisor.workers.sshd]
        roles = []
        [supervisor.workers.w]
        roles = ["login"]
        command = ["{sys.executable}", "{script}", "{state}"]
        notify = true
        ready = "notify"
        """, prefix=["unshare", "--pid", "--fork", "--mount-proc"], port=free_port())
    child = agent.wait_event("mainpid", worker="w")[0]["pid"]
    (state / "go").touch()
    deadline = time.monotonic() + 10
    while not (state / "innocent-pid").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert int((state / "innocent-pid").read_text()) == child, "the kernel did not reuse the pid (test set-up)"
    agent.wait_event("worker-state", worker="w", was="running", state="backoff",
                     message=re.compile(rf"died \(exit status unknown: main pid {child} was not"))
    agent.wait_event("worker-state", worker="w", was="backoff", state="running")
    assert agent.stop() == 0
    assert not (state / "innocent-signalled").exists(), "the agent signalled the process that got the old pid"


# -- item 24: the hook service imports only slurm-ext's own code ----------------------------


def test_the_hook_service_ignores_a_slurm_ext_package_planted_in_the_agents_cwd(tmp_path):
    planted = Path(tempfile.mkdtemp(prefix="slurm-ext-cwd-", dir="/tmp"))
    try:
        os.chown(planted, NOBODY, NOBODY)  # a directory a user may write, e.g. where an admin ran the agent
        marker = planted / "imported-as-root"
        payload = f"import os\nopen({str(marker)!r}, 'w').write(str(os.getuid()))\n"
        subprocess.run(["sh", "-c", 'mkdir slurm_ext && printf "%s" "$1" > slurm_ext/__init__.py', "sh", payload],
                       cwd=planted, user=NOBODY, group=NOBODY, extra_groups=[], check=True, timeout=30)
        assert (planted / "slurm_ext" / "__init__.py").stat().st_uid == NOBODY
        config = tmp_path / "slurm-ext.toml"
        config.write_text(textwrap.dedent(f"""\
            [node]
            name = "testnode"
            state_dir = "{tmp_path}/state"
            runtime_dir = "{tmp_path}/run"
            [supervisor.workers.sshd]
            roles = []
            [supervisor.workers.hooks]
            roles = ["login"]
            """))
        with open(tmp_path / "agent.log", "wb") as out:
            agent = subprocess.Popen([shutil.which("slurm-ext", path=os.path.dirname(sys.executable)) or "slurm-ext",
                                      "--config", str(config), "supervise", "--role", "login", "--port",
                                      str(free_port())], cwd=planted, stdout=out, stderr=out)
        try:
            socket_path = tmp_path / "run" / "hooks.sock"
            deadline = time.monotonic() + 30
            while not socket_path.exists() and time.monotonic() < deadline and not marker.exists():
                time.sleep(0.1)
            log = (tmp_path / "agent.log").read_text(errors="replace")
            assert not marker.exists(), f"root imported the planted package (uid {marker.read_text()})"
            assert socket_path.exists(), f"the hook service did not come up:\n{log[-3000:]}"
        finally:
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(30) == 0
    finally:
        shutil.rmtree(planted)
