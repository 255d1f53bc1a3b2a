"""The boundary between the node agents and the controller (slurm_ext.agentapi), attacked for real.

Real HTTP on 127.0.0.1 throughout: the agent's own server (a `slurm-ext supervise` process, or its HTTP server
with its credential guard in this process), a forged agent that binds the port first and answers "healthy",
a replaying proxy, an agent answering 400 MiB or a byte at a time, and a reader that is `nobody`.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_ext import agentapi
from slurm_ext.agentapi import AgentAnswerError, AgentClient, CredentialError, CredentialFile, create_credential
from slurm_ext.supervisor.http import Guard, ProbeServer

HEALTHY = {"node": "n1", "boot": "boot-1", "time": 1.0, "facts": {},
           "monitor": {"readings_time": 2.0, "findings": [], "checks": {}, "driver": "", "gpus": []}}


def _credential(directory: Path, name: str = "agent-credential") -> Path:
    path = directory / name
    create_credential(path)
    return path


def _guarded_agent(tmp_path: Path, node: str, credential: Path, body: bytes = b"") -> ProbeServer:
    """The agents' HTTP server with its guard, answering GET /health as node `node` (boot-1) with `body` (else
    HEALTHY with that name); the server is started, close it."""
    boot = tmp_path / f"boot-{node}"
    boot.write_text("boot-1\n")
    agent = SimpleNamespace(config=SimpleNamespace(node=SimpleNamespace(
        agent_credential=str(credential), slurm_name=node, boot_id_file=str(boot))))
    guard = Guard(agent)
    answer = body or json.dumps({**HEALTHY, "node": node}).encode()
    return ProbeServer("127.0.0.1", 0, lambda target, headers: guard.guarded(
        "GET", target, headers, lambda: (200, answer, "application/json"))).start()


class _Forged(http.server.BaseHTTPRequestHandler):
    """Answers every request with what `answer(self)` gives: (status, headers, body)."""

    answer = staticmethod(lambda handler: (200, {}, json.dumps(HEALTHY).encode()))
    protocol_version = "HTTP/1.0"

    def do_GET(self):
        status, headers, body = self.answer(self)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if callable(body):
            body(self.wfile)
        else:
            self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args):
        pass


def _serve(handler: type, port: int = 0) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _client(credential: Path, node: str, port: int, timeout: float = 5.0) -> AgentClient:
    return AgentClient(str(credential), 9810, {node: f"127.0.0.1:{port}"}, timeout)


# -- who is believed ---------------------------------------------------------------------------------------------------

def test_the_agent_that_proves_the_credential_is_believed_and_its_answer_is_a_record(tmp_path):
    credential = _credential(tmp_path)
    server = _guarded_agent(tmp_path, "n1", credential)
    try:
        answer = _client(credential, "n1", server.address[1]).health("n1")
    finally:
        server.close()
    assert (answer.node, answer.boot, answer.monitor.readings_time, answer.monitor.findings) == \
        ("n1", "boot-1", 2.0, ())


def test_a_process_on_the_agents_port_that_answers_healthy_is_not_believed(tmp_path):
    """The attack seen: a user binds the agent's port on 127.0.0.1 before the agent starts and answers "healthy";
    without the credential it cannot sign the answer, whatever it copies of a real one's headers."""
    credential = _credential(tmp_path)

    class Forger(_Forged):
        answer = staticmethod(lambda handler: (200, {agentapi.NODE_HEADER: "n1", agentapi.BOOT_HEADER: "boot-1",
                                                     agentapi.SIGNATURE_HEADER: "0" * 64},
                                               json.dumps(HEALTHY).encode()))
    forger = _serve(Forger)
    try:
        with pytest.raises(AgentAnswerError) as raised:
            _client(credential, "n1", forger.server_address[1]).health("n1")
    finally:
        forger.shutdown()
        forger.server_close()
    assert raised.value.node == "n1" and raised.value.status == 200
    assert "answer not believed: its signature does not match the agent credential" in str(raised.value)
    assert str(credential) in str(raised.value)


def test_a_replayed_answer_of_the_real_agent_is_not_believed(tmp_path):
    """A proxy that kept the real agent's signed answer to an earlier question answers the next one with it: the
    signature covers the asker's nonce, so the old answer does not prove anything now."""
    credential = _credential(tmp_path)
    agent = _guarded_agent(tmp_path, "n1", credential)
    kept = []

    class Replayer(_Forged):
        @staticmethod
        def answer(handler):
            if not kept:  # the first question goes to the real agent; its answer is kept
                connection = http.client.HTTPConnection("127.0.0.1", agent.address[1], timeout=5)
                connection.request("GET", handler.path, headers=dict(handler.headers))
                reply = connection.getresponse()
                kept.append((reply.status, {k: v for k, v in reply.getheaders() if k.startswith("X-Slurm")},
                             reply.read()))
                connection.close()
            return kept[0]
    proxy = _serve(Replayer)
    client = _client(credential, "n1", proxy.server_address[1])
    try:
        assert client.health("n1").node == "n1"  # relayed as it came: the real agent's answer to this question
        with pytest.raises(AgentAnswerError, match="answer not believed: its signature does not match"):
            client.health("n1")
    finally:
        proxy.shutdown()
        proxy.server_close()
        agent.close()


def test_another_nodes_agent_is_not_taken_for_the_node_asked(tmp_path):
    """A node only in slurm.conf falls back to the default agent port, where another node's (or cluster's) agent
    may listen: its answer, signed for itself, is not this node's."""
    credential = _credential(tmp_path)
    server = _guarded_agent(tmp_path, "elsewhere1", credential)
    try:
        with pytest.raises(AgentAnswerError, match="it says it is node 'elsewhere1'"):
            _client(credential, "n5", server.address[1]).health("n5")
    finally:
        server.close()
    with pytest.raises(AgentAnswerError, match="no answer taken: "):
        _client(credential, "n5", server.address[1]).health("n5")


def test_a_mismatched_credential_is_refused_by_the_agent_and_named(tmp_path):
    ours, theirs = _credential(tmp_path, "ours"), _credential(tmp_path, "theirs")
    server = _guarded_agent(tmp_path, "n1", theirs)
    try:
        with pytest.raises(AgentAnswerError) as raised:
            _client(ours, "n1", server.address[1]).health("n1")
    finally:
        server.close()
    assert raised.value.status == 401
    assert f"refused our agent credential ({ours})" in str(raised.value)
    assert "needs the cluster's agent credential" in str(raised.value)


def test_the_credentials_absence_or_looseness_is_an_error_naming_the_file(tmp_path):
    missing = tmp_path / "none"
    with pytest.raises(AgentAnswerError, match=f"agent credential {missing}: no such file"):
        AgentClient(str(missing), 1).health("n1", "127.0.0.1")
    loose = _credential(tmp_path, "loose")
    loose.chmod(0o644)
    with pytest.raises(CredentialError, match=f"agent credential {loose}: mode 0644 lets others read it"):
        CredentialFile(str(loose)).get()
    short = tmp_path / "short"
    short.write_text("abc\n")
    short.chmod(0o600)
    with pytest.raises(CredentialError, match="3 bytes"):
        CredentialFile(str(short)).get()
    # an agent without a usable credential refuses its guarded routes with the file's problem, not an empty 401
    server = _guarded_agent(tmp_path, "n1", missing)
    try:
        with pytest.raises(AgentAnswerError, match=f"HTTP 503: 'agent credential {missing}: no such file"):
            _client(_credential(tmp_path, "ok"), "n1", server.address[1]).health("n1")
    finally:
        server.close()


def test_a_rotated_credential_is_taken_without_a_restart(tmp_path):
    credential = _credential(tmp_path)
    agent_copy = tmp_path / "agent-copy"
    agent_copy.write_bytes(credential.read_bytes())
    agent_copy.chmod(0o600)
    server = _guarded_agent(tmp_path, "n1", agent_copy)
    client = _client(credential, "n1", server.address[1])
    try:
        assert client.health("n1").node == "n1"
        for path in (agent_copy, credential):  # rotated on the node, then on the controller
            new = path.with_name(path.name + ".new")
            new.write_text("f" * 64 + "\n")
            new.chmod(0o600)
            os.replace(new, path)
            if path == agent_copy:
                with pytest.raises(AgentAnswerError, match="refused our agent credential"):
                    client.health("n1")
        assert client.health("n1").node == "n1"
    finally:
        server.close()


# -- how much, how long -------------------------------------------------------------------------------------------------

_MIB = 2**20


def test_a_400_mib_answer_is_refused_without_being_read(tmp_path):
    """From its Content-Length when it says one, else once the cap has come; the reader's memory stays small
    (before the caps a 400 MiB answer took it from 20 to 826 MiB)."""
    credential = _credential(tmp_path)
    sent, asked = [], []

    def stream(out):
        chunk = b"x" * _MIB
        try:
            for _ in range(400):
                out.write(chunk)
                sent.append(len(chunk))
        except OSError:  # the reader hung up
            pass

    class Big(_Forged):
        @staticmethod
        def answer(handler):
            asked.append(handler.path)  # the first answer says its length, the second does not
            return 200, {"Content-Length": str(400 * _MIB)} if len(asked) == 1 else {}, stream
    server = _serve(Big)
    port = server.server_address[1]
    child = textwrap.dedent(f"""\
        import resource, sys
        from slurm_ext.agentapi import AgentAnswerError, AgentClient
        client = AgentClient({str(credential)!r}, {port}, {{}}, 30.0)
        for _ in range(2):
            try:
                client.health("n1", "127.0.0.1")
            except AgentAnswerError as err:
                print(err.problem)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
        """)
    try:
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
        took = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    said, streamed, peak_mib = result.stdout.splitlines()
    assert said == f"no answer taken: answer of {400 * _MIB} bytes refused (at most {4 * _MIB})", result.stderr
    assert streamed == f"no answer taken: answer longer than {4 * _MIB} bytes refused"
    assert int(peak_mib) < 120, f"the reader grew to {peak_mib} MiB"
    assert sum(sent) < 100 * _MIB and took < 30, (sum(sent), took)


def test_an_answer_that_trickles_is_cut_at_the_time_cap(tmp_path):
    """A byte a second keeps every single read within a socket timeout: the cap is on the whole answer."""
    credential = _credential(tmp_path)
    stop = threading.Event()

    def trickle(out):
        while not stop.wait(0.2):
            try:
                out.write(b" ")
                out.flush()
            except OSError:
                return

    class Slow(_Forged):
        answer = staticmethod(lambda handler: (200, {}, trickle))
    server = _serve(Slow)
    try:
        started = time.monotonic()
        with pytest.raises(AgentAnswerError, match="no complete answer within 1.5s"):
            _client(credential, "n1", server.server_address[1], timeout=1.5).health("n1")
        assert time.monotonic() - started < 3.0
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


# -- the agent itself, as a process ----------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def agent(tmp_path):
    """A `slurm-ext supervise --role login` process with an agent credential (and no worker), its port and files."""
    credential = _credential(tmp_path)
    port = _free_port()
    config = tmp_path / "slurm-ext.toml"
    config.write_text(textwrap.dedent(f"""\
        [node]
        name = "n1"
        state_dir = "{tmp_path}/state"
        agent_credential = "{credential}"
        [slurm]
        timeout = "2s"
        [supervisor]
        runtime_dir = "{tmp_path}/run"
        [supervisor.workers.sshd]
        roles = []
        """))
    log = open(tmp_path / "agent.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "--config", str(config), "supervise", "--role",
                             "login", "--port", str(port)], stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "agent.log").read_text()
            time.sleep(0.05)
    yield SimpleNamespace(port=port, credential=credential, config=config, proc=proc)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(30)
    log.close()


def _as_nobody(port: int, requests: list[tuple[str, str]]) -> list[int]:
    """The status of each (method, path) asked of 127.0.0.1:port by a child that became nobody (as a job's user
    would ask), without any credential."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            found = []
            for method, path in requests:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request(method, path)
                answer = connection.getresponse()
                answer.read()
                found.append(answer.status)
                connection.close()
            os.write(write_end, json.dumps(found).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(text)


def test_without_the_credential_the_agent_refuses_what_shows_or_does_something(agent):
    """As nobody, from a job: 401 for the journal, the health and the check; the kubelet's probes and /metrics
    stay open."""
    statuses = _as_nobody(agent.port, [("GET", "/events?since=0"), ("GET", "/health"), ("POST", "/health/check"),
                                       ("GET", "/livez"), ("GET", "/metrics")])
    assert statuses == [401, 401, 401, 200, 200]
    client = _client(agent.credential, "n1", agent.port)
    answer = client.health("n1")
    assert answer.node == "n1" and answer.boot == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    page = client.events("n1", since=0)
    assert page.node == "n1" and any(line.data.get("event") == "started" for line in page.events), page
    with pytest.raises(AgentAnswerError) as raised:  # signed, and refused: no health monitor on a login node
        client.check_now("n1")
    assert raised.value.status == 409 and "no health monitor runs on this node" in str(raised.value)


def test_metrics_need_the_credential_where_the_config_says_so(agent):
    agent.config.write_text(agent.config.read_text().replace("[supervisor]\n", "[supervisor]\nopen_metrics = false\n"))
    os.kill(agent.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 15
    while _as_nobody(agent.port, [("GET", "/metrics")]) != [401]:
        assert time.monotonic() < deadline, "a reload with open_metrics = false left /metrics open"
        time.sleep(0.1)
    assert _as_nobody(agent.port, [("GET", "/livez")]) == [200]


def test_a_forger_on_the_port_before_the_agent_is_not_believed(tmp_path):
    """The issue's attack as it happens: nobody binds the port the agent will use and answers "healthy"; the agent
    cannot listen, and the controller, asking the port, believes nothing it hears."""
    credential = _credential(tmp_path)
    port = _free_port()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the forger: nobody, serving HEALTHY on the agent's port
        try:
            os.setgid(65534)
            os.setuid(65534)
            server = http.server.HTTPServer(("127.0.0.1", port), _Forged)
            os.write(write_end, b"up")
            server.serve_forever()
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        assert os.read(read_end, 2) == b"up"
        with pytest.raises(AgentAnswerError, match="answer not believed: not signed with the agent credential"):
            _client(credential, "n1", port).health("n1")
    finally:
        os.close(read_end)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


# -- the drain reason's one template --------------------------------------------------------------------------------------

def test_the_health_drain_reason_reads_back_as_it_was_written():
    from slurm_ext.health.findings import Finding
    from slurm_ext.nodestate.catalogue import HEALTH
    from slurm_ext.repair.recommend import fault_of
    from slurm_ext.slurm import REASON_PREFIX, Node
    for check, evidence, action in (("xid", "79 gpu 1 GPU_HAS_FALLEN_OFF_THE_BUS (expected none)", "reboot"),
                                    ("temperature", "gpu 0 at 91C (expected under 85C)", "failover"),
                                    ("ecc", "gpu 2: 3 uncorrectable (expected 0)", "reset-gpu")):
        finding = Finding(check, "gpu0", "critical", action, evidence, 1.0, 1.0)
        assert HEALTH.parse(finding.reason) == {"check": check, "evidence": evidence, "action": action}
        fault = fault_of(Node("n1", "IDLE", frozenset({"DRAIN"}), f"{REASON_PREFIX} {finding.reason} (+2 more)"))
        assert (fault.evidence, fault.action) == (evidence, action)
    assert HEALTH.parse("gpu missing: GPU-1") is None


def test_a_plain_get_has_the_same_caps_and_says_why_it_failed():
    """What the page asks that is not an agent (a Prometheus) goes through the same reader: no credential, the
    same size and time caps."""
    class Prometheus(_Forged):
        @staticmethod
        def answer(handler):
            if handler.path.startswith("/api/v1/query?query="):
                return 200, {}, b'{"status": "success"}'
            return (404, {}, b"not found") if handler.path != "/big" else (200, {}, lambda out: out.write(b"x" * 5000))
    server = _serve(Prometheus)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert agentapi.get_text(f"{base}/api/v1/query?query=up", 5.0) == ('{"status": "success"}', "")
        assert agentapi.get_text(f"{base}/other", 5.0) == (None, "HTTP 404: not found")
        assert agentapi.get_text(f"{base}/big", 5.0, limit=4096) == (None, "answer longer than 4096 bytes refused")
    finally:
        server.shutdown()
        server.server_close()
    assert agentapi.get_text(f"{base}/api/v1/query?query=up", 5.0)[1] == "Connection refused"
