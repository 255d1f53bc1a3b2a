"""The boundary between the node agents and the controller (slurm_ext.agentapi), attacked for real.

Real HTTP on 127.0.0.1 throughout: the agent's own server (a `slurm-ext supervise` process, or its HTTP server
with its credential guard in this process), a forged agent that binds the port first and answers "healthy",
a replaying proxy, an agent answering 400 MiB or a byte at a time, and a reader that is `nobody`.
"""

from __future__ import annotations

import http.client
import http.server
import json
import logging
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

from helpers.agent import ask_as_nobody, health_only_worker
from helpers.wait import wait_for
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
        with pytest.raises(AgentAnswerError, match="request refused: GET /health: it was meant for node 'n5', and "
                                                   "this is node 'elsewhere1'"):
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
        from slurm_ext.agentapi import AgentAnswerError, AgentClient
        client = AgentClient({str(credential)!r}, {port}, {{}}, 30.0)
        for _ in range(2):
            try:
                client.health("n1", "127.0.0.1")
            except AgentAnswerError as err:
                print(err.problem)
        # its own high-water mark since its exec (ru_maxrss would count the forking pytest worker's memory too)
        print(next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) // 1024)
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
        runtime_dir = "{tmp_path}/run"
        agent_credential = "{credential}"
        [slurm]
        timeout = "2s"
        [supervisor]
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


def test_without_the_credential_the_agent_refuses_what_shows_or_does_something(agent):
    """As nobody, from a job: 401 for the journal, the health and the check; the kubelet's probes and /metrics
    stay open."""
    statuses = ask_as_nobody(agent.port, [("GET", "/events?since=0"), ("GET", "/health"), ("POST", "/health/check"),
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
    while ask_as_nobody(agent.port, [("GET", "/metrics")]) != [401]:
        assert time.monotonic() < deadline, "a reload with open_metrics = false left /metrics open"
        time.sleep(0.1)
    assert ask_as_nobody(agent.port, [("GET", "/livez")]) == [200]


def test_a_job_cannot_make_the_health_monitor_read_the_node(agents, tmp_path, monkeypatch):
    """Issue 28, item 19: POST /health/check has the worker's health monitor read its GPUs and the node at once. As
    nobody (a job's user), without the credential, it is refused (401) and nothing is read: the readings stay as they
    were, and the controller's ask right after is taken (202, not 429: nobody's came to nothing within the agent's
    second of spacing) and read."""
    from slurm_ext.devcluster import fakenvml
    lib = fakenvml.build(tmp_path / "lib")
    spec = tmp_path / "gpus.json"
    fakenvml.write_spec(spec, fakenvml.default_gpus(2))
    for name, value in fakenvml.environ(lib.parent, spec).items():  # the health worker inherits the agent's
        monkeypatch.setenv(name, value)
    credential = _credential(tmp_path)
    port = _free_port()
    agent = agents(health_only_worker(port, tmp_path, "1h"), role="worker", port=port,
                   slurm=f'conf = "{tmp_path}/no-such-slurm.conf"', node=f'agent_credential = "{credential}"')
    client = _client(credential, "testnode", port)

    def readings() -> float:
        try:
            monitor = client.health("testnode").monitor
        except AgentAnswerError:  # not listening yet
            return 0.0
        return monitor.readings_time if monitor is not None else 0.0

    try:
        baseline = wait_for("the health monitor's first readings", readings, timeout=60)
        asked = time.monotonic()
        assert ask_as_nobody(port, [("POST", "/health/check")] * 3) == [401] * 3
        assert readings() == baseline
        assert client.check_now("testnode") is True, "a check asked by nobody was taken within the second before"
        assert time.monotonic() - asked < 1.0, "too slow for the agent's spacing to witness nobody's asks"
        wait_for("the controller's check read", lambda: readings() > baseline, timeout=30)
    finally:
        stopped = agent.stop()  # the health worker with it
    assert stopped == 0


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


# -- review: hostile bytes, a trickling head, replays, the file's owner, a busy node's journal ------------------------

class _Raw:
    """A TCP server on 127.0.0.1 that reads a request head and answers with `respond(head)`'s bytes as they are
    (any bytes: no HTTP library between it and the client); an iterable of bytes is sent piece by piece, a
    float in it is a pause. Close it with close()."""

    def __init__(self, respond):
        self.respond = respond
        self.heads: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn):
        with conn:
            head = b""
            conn.settimeout(5)
            try:
                while b"\r\n\r\n" not in head:
                    data = conn.recv(65536)
                    if not data:
                        return
                    head += data
                self.heads.append(head)
                answer = self.respond(head)
                for piece in [answer] if isinstance(answer, bytes) else answer:
                    if self.stop.is_set():
                        return
                    if isinstance(piece, float):
                        time.sleep(piece)
                    else:
                        conn.sendall(piece)
            except OSError:
                return

    def close(self):
        self.stop.set()
        self.listener.close()


def _headers_of(head: bytes) -> dict[str, str]:
    return {name.strip().lower(): value.strip() for name, _, value in
            (line.partition(":") for line in head.decode("latin-1").split("\r\n")[1:] if ":" in line)}


def _signed(secret: bytes, head: bytes, status: int, body: bytes, node: str = "n1", boot: str = "boot-1",
            extra: bytes = b"") -> bytes:
    """The real agent's answer to `head`, signed with `secret` (a forger that had it would send this)."""
    nonce = _headers_of(head).get(agentapi.NONCE_HEADER.lower(), "")
    proof = agentapi.answer_signature(secret, node, boot, nonce, status, body)
    return (f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{agentapi.NODE_HEADER}: {node}\r\n"
            f"{agentapi.BOOT_HEADER}: {boot}\r\n{agentapi.SIGNATURE_HEADER}: {proof}\r\n").encode() + extra + \
        b"\r\n" + body


def test_a_proof_of_odd_bytes_is_a_refusal_on_the_agent_not_a_500(tmp_path, caplog):
    """compare_digest raises TypeError on a str beyond ASCII: any local user made a 500 and a traceback per
    request with `Authorization: SlurmExt \\xe9`."""
    credential = _credential(tmp_path)
    server = _guarded_agent(tmp_path, "n1", credential)
    try:
        for proof, nonce in ((b"\xe9", b"a" * 32), (b"\xe9" * 64, b"a" * 32), (b"0" * 64, b"\xe9" * 32),
                             (b"\xff\xfe", b"\xe9"), (b"", b"")):
            with socket.create_connection(("127.0.0.1", server.address[1]), timeout=5) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nAuthorization: SlurmExt " + proof + b"\r\nX-Slurm-Ext-Nonce: "
                             + nonce + b"\r\nX-Slurm-Ext-Time: \xe9\r\nX-Slurm-Ext-Node: n\xe91\r\n\r\n")
                answer = b""
                while data := sock.recv(65536):
                    answer += data
            assert answer.startswith(b"HTTP/1.1 401 "), (proof, answer[:200])
    finally:
        server.close()
    assert not [r for r in caplog.records if r.exc_info], "a refusal logged a traceback"


def test_a_hostile_answer_raises_only_agent_answer_error(tmp_path):
    """Whatever a process on the agent's port answers (odd status lines, odd headers, bytes beyond ASCII in the
    proof, a broken chunked body, invalid JSON, JSON of the wrong types, even signed with the credential), every
    question of the client ends in AgentAnswerError: the repair service's pass, history and status catch that."""
    credential = _credential(tmp_path)
    secret = CredentialFile(str(credential)).get().secret
    ok = b"HTTP/1.1 200 OK\r\n"
    unsigned = [
        b"", b"\r\n\r\n", b"SSH-2.0-OpenSSH_9.6\r\n", b"HTTP/1.1 abc OK\r\n\r\n", b"HTTP/1.1 99999 OK\r\n\r\n",
        b"HTTP/9 200 OK\r\n\r\n", b"\xff\xfe\xe9\r\n\r\n",
        ok + b"X-Slurm-Ext-Signature: \xe9\r\nContent-Length: 2\r\n\r\n{}",
        ok + b"X-Slurm-Ext-Signature: " + b"\xe9" * 64 + b"\r\nX-Slurm-Ext-Node: \xe9\r\n\r\n{}",
        ok + b"Content-Length: \xb2\r\n\r\n{}", ok + b"Content-Length: -5\r\n\r\n{}",
        ok + b"Content-Length: 99999999999999999999999\r\n\r\n{}",
        ok + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        ok + b"Transfer-Encoding: chunked\r\n\r\n\xe9\xe9\r\n",
        ok + b"".join(b"X-%d: y\r\n" % n for n in range(200)) + b"\r\n",
        ok + b"X-Long: " + b"y" * 100000 + b"\r\n\r\n",
        ok + b"no colon here\r\n\xff\r\n\r\n{}",
    ]
    bodies = [b"not json", b"\xff\xfe", b"[", b"[]", b"null", b'"text"', b"1e999", b"[" * 100000 + b"]" * 100000,
              b'{"node": 5}', b'{"node": "n1", "boot": "boot-1", "time": "x"}',
              b'{"node": "n1", "boot": "boot-1", "time": NaN}',
              b'{"node": "n1", "boot": "boot-1", "time": 1, "monitor": []}',
              b'{"node": "n1", "boot": "boot-1", "time": 1, "monitor": {"findings": [1]}}',
              b'{"node": "n1", "boot": "boot-1", "time": 1, "monitor": {"readings_time": true}}',
              b'{"node": "n1", "boot": "boot-1", "time": 1, "facts": []}',
              b'{"node": "n1", "boot": "boot-2", "time": 1}', b'{"node": "n2", "boot": "boot-1", "time": 1}',
              b'{"node": "n1", "boot": "boot-1", "time": ' + b"9" * 5000 + b"}",
              b'{"node": "n1", "boot": "boot-1", "time": 1' + b"0" * 400 + b"}"]
    answers = [lambda head, a=a: a for a in unsigned] + \
        [lambda head, b=b: _signed(secret, head, 200, b) for b in bodies] + \
        [lambda head: _signed(secret, head, 200, b"{}", extra=b"X-Odd: \xe9\xff\r\n"),
         lambda head: _signed(secret, head, 404, b"\xff" * 300), lambda head: _signed(secret, head, 401, b"\xe9"),
         lambda head: _signed(secret, head, 200, b"{}", boot="\xe9")]
    for number, respond in enumerate(answers):
        server = _Raw(lambda head, respond=respond: respond(head))
        client = _client(credential, "n1", server.port, timeout=2.0)
        try:
            for ask in (lambda: client.health("n1"), lambda: client.check_now("n1")):
                try:
                    ask()
                except AgentAnswerError:
                    pass
                else:
                    raise AssertionError(f"answer {number} was believed")
            try:  # a page of /events keeps its good lines: it may be taken, or refused, never another error
                client.events("n1")
            except AgentAnswerError:
                pass
        finally:
            server.close()


def _health_of(tmp_path: Path, answer: dict) -> agentapi.HealthAnswer:
    """`answer` as the client takes it from the real agent's server (as JSON: NaN and Infinity as Python writes
    them, numbers past float's range as their digits)."""
    credential = _credential(tmp_path)
    server = _guarded_agent(tmp_path, "n1", credential, json.dumps(answer).encode())
    try:
        return _client(credential, "n1", server.address[1]).health("n1")
    finally:
        server.close()


def test_an_odd_field_of_one_gpu_or_interface_is_none_and_costs_nothing_else(tmp_path):
    """One GPU's NaN, a bool where a number goes, a text for a number, a name that is not text: that field is None
    (the page shows "-" there), the GPU's other fields and the node stand; texts are cut to a length a page shows."""
    good = {"gpu": {"index": 3, "uuid": "GPU-3", "name": "NVIDIA H200", "pci_bus_id": "00000000:17:00.0"},
            "utilization": 42, "fb_used_mib": 1024.5, "fb_free_mib": 3000, "fb_reserved_mib": 615, "temperature": 51,
            "error_text": "", "jobs": [7, 8], "power_w": 300.0}
    odd = {"gpu": "not an object", "utilization": float("nan"), "fb_used_mib": float("inf"), "fb_free_mib": "3000",
           "fb_reserved_mib": None, "temperature": True, "error_text": 5, "jobs": "7"}
    odder = {"gpu": {"index": 1.9, "name": "N" * 300, "uuid": ["GPU-1"]}, "utilization": False,
             "fb_used_mib": 10**400, "fb_free_mib": -float("inf"), "jobs": [1, "2", True, 3.0, None]}
    facts = {"os": "Debian GNU/Linux 13 (trixie)", "kernel": 6, "interfaces": [
        {"name": "ib0", "state": "up", "speed_mbps": 400000, "rx_bytes": 10, "tx_bytes": 20},
        {"name": "x" * 100, "speed_mbps": -1, "rx_bytes": float("nan"), "tx_bytes": "1"},
        {"speed_mbps": True, "rx_bytes": 1.5, "tx_bytes": False}]}
    answer = _health_of(tmp_path, {**HEALTHY, "facts": facts, "monitor": {
        **HEALTHY["monitor"], "driver": "5" * 300, "gpus": [good, odd, odder]}})
    assert answer.monitor.gpus == (
        agentapi.GpuReading(3, "NVIDIA H200", "GPU-3", 42, 1024.5, 3000.0, 615.0, 51, "", (7, 8)),
        agentapi.GpuReading(None, None, None, None, None, None, None, None, None, ()),
        agentapi.GpuReading(1, "N" * 200, None, None, None, None, None, None, None, (1,)))
    assert answer.monitor.driver == "5" * 200
    assert answer.facts == agentapi.FactsReading("Debian GNU/Linux 13 (trixie)", None, (
        agentapi.InterfaceReading("ib0", 400000, 10.0, 20.0), agentapi.InterfaceReading("x" * 64, None, None, None),
        agentapi.InterfaceReading(None, None, 1.5, None)))
    assert _health_of(tmp_path / "bare", {**HEALTHY, "monitor": None}).facts == agentapi.FactsReading(None, None, ())


@pytest.mark.parametrize("odd, why", [
    ({"monitor": {"gpus": {"0": {}}}}, "gpus: expected a list of objects"),
    ({"monitor": {"gpus": [{"gpu": {"index": 0}}, 7]}}, "gpus: expected a list of objects"),
    ({"monitor": {"gpus": "none"}}, "gpus: expected a list of objects"),
    ({"facts": {"interfaces": {"ib0": {}}}}, "interfaces: expected a list of objects"),
    ({"facts": {"interfaces": [{"name": "ib0"}, "eth0"]}}, "interfaces: expected a list of objects"),
    ({"facts": "Debian"}, "facts: expected an object"),
    ({"time": 10**400}, "time: expected a number"),  # an integer past float's range was an OverflowError
    ({"time": float("nan")}, "time: expected a number"),
    ({"time": True}, "time: expected a number"),
])
def test_an_answer_of_the_wrong_shape_is_refused_whole_with_one_error(tmp_path, odd, why):
    """What is not a health answer (its GPUs or interfaces not a list of objects, no time) is refused at the
    boundary with the one AgentAnswerError every reader catches: nothing in it can be placed."""
    with pytest.raises(AgentAnswerError, match=f"its /health is not a health answer: {why}"):
        _health_of(tmp_path, {**HEALTHY, **odd})


def test_an_answer_head_that_trickles_is_cut_at_the_time_cap(tmp_path):
    """One header line every 0.2 s: each recv comes within a socket timeout, and the answer's head held a
    timeout=1.0 client for 8 s. Every read ends by the one deadline now."""
    credential = _credential(tmp_path)

    def trickle(head):
        yield b"HTTP/1.1 200 OK\r\n"
        for number in range(100):
            yield 0.2
            yield b"X-Slow-%d: y\r\n" % number
    server = _Raw(trickle)
    try:
        started = time.monotonic()
        with pytest.raises(AgentAnswerError, match="no complete answer within 1s"):
            _client(credential, "n1", server.port, timeout=1.0).health("n1")
        took = time.monotonic() - started
        assert took < 5.0, f"the head held the client {took:.1f}s (its trickle lasts 20s)"
        started = time.monotonic()
        assert agentapi.get_text(f"http://127.0.0.1:{server.port}/", 1.0) == (None, "no complete answer within 1s")
        assert time.monotonic() - started < 5.0
    finally:
        server.close()


def test_a_captured_request_is_taken_once_and_by_the_node_it_was_meant_for(tmp_path, caplog):
    """A request seen on the network (here: captured by a process that took node A's port for a moment) was good
    forever and on every node. It is bound to the node meant and its time, and the agent remembers its nonce."""
    credential = _credential(tmp_path)
    capture = _Raw(lambda head: b"HTTP/1.1 503 X\r\nContent-Length: 0\r\n\r\n")
    try:
        with pytest.raises(AgentAnswerError):
            _client(credential, "a1", capture.port).health("a1")
    finally:
        capture.close()
    (captured,) = capture.heads
    node_a, node_b = (_guarded_agent(tmp_path, name, credential) for name in ("a1", "b1"))

    def replay(server, head=captured) -> bytes:
        with socket.create_connection(("127.0.0.1", server.address[1]), timeout=5) as sock:
            sock.sendall(head)
            answer = b""
            while data := sock.recv(65536):
                answer += data
        return answer
    try:
        to_b = replay(node_b)
        assert to_b.startswith(b"HTTP/1.1 401 ") and b"it was meant for node 'a1', and this is node 'b1'" in to_b
        assert replay(node_a).startswith(b"HTTP/1.1 200 ")  # not used yet: the capture answered in A's place
        again = replay(node_a)
        assert again.startswith(b"HTTP/1.1 401 ") and b"its nonce was taken before: a replayed request" in again
        # a request of two minutes ago, properly signed, is refused for its time
        secret = CredentialFile(str(credential)).get().secret
        when, nonce = f"{time.time() - 120:.3f}", "b" * 32
        proof = agentapi.request_signature(secret, "GET", "/health", nonce, "a1", when)
        old = (f"GET /health HTTP/1.1\r\nAuthorization: SlurmExt {proof}\r\nX-Slurm-Ext-Nonce: {nonce}\r\n"
               f"X-Slurm-Ext-Time: {when}\r\nX-Slurm-Ext-Node: a1\r\n\r\n").encode()
        late = replay(node_a, old)
        assert late.startswith(b"HTTP/1.1 401 ") and b"s off this agent's clock (expected within 60s" in late
        # a flood of refusals is logged a few times a minute, then counted
        caplog.clear()
        for _ in range(40):
            assert replay(node_a).startswith(b"HTTP/1.1 401 ")
        refused = [r for r in caplog.records if "refused (401)" in r.getMessage()]
        assert 1 <= len(refused) <= Guard.LOG_PER_MINUTE, len(refused)
        # and the client, asking as it does, is still answered by both
        assert _client(credential, "a1", node_a.address[1]).health("a1").node == "a1"
        assert _client(credential, "b1", node_b.address[1]).health("b1").node == "b1"
    finally:
        node_a.close()
        node_b.close()


def test_the_nonce_memory_is_bounded_and_refuses_rather_than_forgets():
    memory = agentapi.NonceMemory(window=60, limit=3)
    assert [memory.take(f"n{i}", 100.0 + i, 110.0) for i in range(4)] == ["", "", "", ""]
    assert "taken before" in memory.take("n3", 103.0, 110.0)
    assert "older than the nonces this agent still remembers" in memory.take("new", 100.0, 110.0)
    assert memory.take("later", 200.0, 200.0) == ""  # past the window, the old ones are gone
    assert len(memory._seen) <= 3


def test_the_credential_files_owner_and_folder_are_checked(tmp_path):
    """Mode 0600 alone is not enough: a file owned by nobody (or in a folder nobody can write) can be replaced by
    nobody with a secret of their own, who then passes for an agent."""
    folder = tmp_path / "etc"
    folder.mkdir(mode=0o755)
    credential = _credential(folder)
    assert CredentialFile(str(credential)).get().secret
    os.chown(credential, 65534, 65534)
    with pytest.raises(CredentialError, match=f"agent credential {credential}: owned by uid 65534 "
                                              rf"\(expected root, uid 0: chown root:root {credential}\)"):
        CredentialFile(str(credential)).get()
    os.chown(credential, 0, 0)
    for mode in (0o775, 0o757, 0o777):
        folder.chmod(mode)
        with pytest.raises(CredentialError, match=f"its folder {folder} \\(mode {mode:04o}, uid 0\\) can be changed by "
                                                  "others.*chmod go-w"):
            CredentialFile(str(credential)).get()
    folder.chmod(0o1777)  # a Secret's tmpfs in Kubernetes: sticky, so only root replaces root's file
    kept = CredentialFile(str(credential))
    assert kept.get().secret
    folder.chmod(0o777)  # a file read before is checked again when its folder changes
    with pytest.raises(CredentialError, match="can be changed by others"):
        kept.get()
    folder.chmod(0o755)
    os.chown(folder, 65534, 65534)
    with pytest.raises(CredentialError, match="uid 65534\\) can be changed by others"):
        CredentialFile(str(credential)).get()
    os.chown(folder, 0, 0)
    # behind a link, the real file's folder counts too
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    (loose / "real").write_bytes(credential.read_bytes())
    (loose / "real").chmod(0o600)
    link = folder / "linked"
    link.symlink_to(loose / "real")
    with pytest.raises(CredentialError, match=f"its folder {loose} "):
        CredentialFile(str(link)).get()


def _journal_lines(count: int, size: int, start: float = 1767225600.0) -> list[str]:
    from datetime import datetime, timezone
    return [json.dumps({"time": datetime.fromtimestamp(start + n, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S%z"),
                        "component": "prolog_epilog", "event": "script-failed", "message": f"{n} " + "o" * size})
            for n in range(count)]


def test_a_busy_nodes_journal_is_cut_by_the_agent_to_what_the_client_takes(tmp_path, caplog):
    """5,000 script events of 8 KiB (a busy node): 40 MiB, over the client's 32 MiB, and the node's whole journal
    was lost to history. The agent sends the newest that fit and says from where."""
    from slurm_ext import events as events_mod
    caplog.set_level(logging.CRITICAL, logger="events")  # 40 MiB of events echoed to the log help no one
    credential = _credential(tmp_path)
    state = tmp_path / "state"
    emit = events_mod.emitter(str(state), "prolog_epilog")
    for n in range(5000):
        emit("script-failed", f"{n} " + "o" * 8000)
    boot = tmp_path / "boot"
    boot.write_text("boot-1\n")
    from slurm_ext.supervisor.http import agent_routes
    agent = SimpleNamespace(config=SimpleNamespace(
        node=SimpleNamespace(agent_credential=str(credential), slurm_name="n1", boot_id_file=str(boot),
                             state_dir=str(state)),
        supervisor=SimpleNamespace(open_metrics=True)))
    server = ProbeServer("127.0.0.1", 0, agent_routes(agent)).start()
    try:
        page = _client(credential, "n1", server.address[1], timeout=30).events("n1")
    finally:
        server.close()
    assert page.cut > 0 and page.skipped == 0
    assert page.cut + len(page.events) == 5000, (page.cut, len(page.events))  # every event: sent, or counted
    assert page.events[-1].data["message"].startswith("4999 ")
    assert page.cut_from == page.events[0].time
    assert sum(len(line.line) + 1 for line in page.events) <= agentapi.EVENTS_SENT
    assert "older event(s) not sent by the agent" in page.shortfall()


def test_odd_lines_of_a_journal_page_are_skipped_and_counted(tmp_path):
    """One odd line refused the whole page, and the node lost its timeline; its good lines are kept now."""
    credential = _credential(tmp_path)
    secret = CredentialFile(str(credential)).get().secret
    good = _journal_lines(3, 10)
    body = "\n".join([good[0], "not json", '["a list"]', good[1], '{"time": "yesterday"}', '{"time": 5}',
                      good[2], '{"cut": "x"}']).encode() + b"\n\xff\xfe\n"
    server = _Raw(lambda head: _signed(secret, head, 200, body))
    try:
        page = _client(credential, "n1", server.port).events("n1")
    finally:
        server.close()
    assert [line.line for line in page.events] == good
    assert (page.skipped, page.cut) == (6, 0)
    assert page.shortfall() == "6 line(s) that are not journal events skipped"


def test_a_plain_get_follows_three_redirects_and_no_more(tmp_path):
    class Redirects(_Forged):
        @staticmethod
        def answer(handler):
            if handler.path == "/loop":
                return 302, {"Location": "/loop"}, b""
            if handler.path == "/ftp":
                return 301, {"Location": "ftp://127.0.0.1/x"}, b""
            hop = int(handler.path.strip("/"))
            if hop < 3:
                return 307, {"Location": f"/{hop + 1}" if hop % 2 else
                             f"http://127.0.0.1:{handler.server.server_address[1]}/{hop + 1}"}, b""
            return 200, {}, b"arrived"
    server = _serve(Redirects)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert agentapi.get_text(f"{base}/0", 5.0) == ("arrived", "")
        assert agentapi.get_text(f"{base}/loop", 5.0) == (None, "more than 3 redirects")
        assert agentapi.get_text(f"{base}/ftp", 5.0) == (None, "not an http or https URL")
    finally:
        server.shutdown()
        server.server_close()


def test_the_kubelets_exec_probe_is_read_with_the_same_caps(tmp_path):
    """`slurm-ext probe` read whatever answered on the agent's port with urlopen: no size, no total time."""
    from slurm_ext.config import load
    from slurm_ext.supervisor import probe

    def flood(head):
        yield b"HTTP/1.1 200 OK\r\n\r\n"
        for _ in range(200):
            yield b"x" * 2**20
    for respond, said in ((flood, "answer longer than 65536 bytes refused"),
                          (lambda head: (b"HTTP/1.1 200 OK\r\n", *[0.2, b"X: y\r\n"] * 50),
                           "no complete answer within 1s")):
        server = _Raw(respond)
        config = tmp_path / "slurm-ext.toml"
        config.write_text('[supervisor]\nlisten = "127.0.0.1"\n')
        try:
            started = time.monotonic()
            ok, text = probe(load(str(config)), "live", port=server.port, timeout=1.0)
            assert time.monotonic() - started < 5.0  # the trickle lasts 10s, the flood 200 MiB
        finally:
            server.close()
        assert (ok, text) == (False, f"no agent answers at http://127.0.0.1:{server.port}/livez: {said}")
