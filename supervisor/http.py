"""The agent's HTTP listener: /livez, /readyz, /metrics (Prometheus), and, read-only, the node journal's
/events?since=EPOCH (its newest events, for the repair service's notifier), /journal?after=CURSOR (its lines after
the controller's collector's cursor: what `slurm-ext history` and the cluster page read, from the collector's table)
and the health monitor's /health with the node's facts. Three POSTs: /health/check asks the health monitor to read
the node now (the cluster page's "run the health checks"); it changes nothing but the time of the next poll, at most
once a second.
/health/clear?by=USER[&check=ID][&gpu=GPU] is an operator's `health clear` asked from the controller (the page, or
`slurm-ext health clear NODE` through it): the same request the node's own command writes, with the operator's name.
/health/reset-gpu?gpu=N resets one GPU for an approved reset-gpu repair (health.gpu_reset_command, never a shell;
refused for a GPU the node does not have, not run while a job holds the GPU: the answer names the jobs).
/acceptance/run?level=L&trigger=T starts an acceptance run the controller asks for (a repair's proof before its
resume, `accept cluster`): on a thread of the agent's (`acceptruns`), its verdict applied through the agent's own
node-state owner; GET /acceptance[?trigger=T] says whether it is under way and what the node's last run found.

/events, /journal, /health, /acceptance and every POST answer only an asker that proves it holds the cluster's agent
credential (node.agent_credential; `slurm_ext.agentapi`) in a request meant for this node, within a minute of this
clock, and taken once (`Guard`); they sign their answer with it, bound to this node, this boot and the asker's nonce: the
journal holds other users' job details, and the controller resumes a repaired node on what /health says. /events
sends the newest lines that fit under the client's cap (`events_body`), read from the journal's end back within a
byte and a time budget on a thread of its own (`later`): one at a time, and 503 with Retry-After to a request that
comes while one is being read, so the probes never wait for it. Without the proof they answer 401; without a usable
credential file here, 503 naming the file.
/livez and /readyz stay open (the kubelet's probes), and /metrics too unless supervisor.open_metrics is false.

`serve(agent, host, port)` starts a `ProbeServer` in a thread of its own;
handlers only read the agent's state, and metrics are collected at scrape
time from that state, so the loop never updates them.

Why one thread and a selector, not a thread per connection: 127.0.0.1 is
reachable from every job of a pod, and a job that holds a few hundred idle
connections to a threading server ties up one thread and one descriptor of
PID 1 each, until the liveness probe times out (or, at a low descriptor
limit, accept fails in a tight loop) and the kubelet restarts the pod with
every job on it. Here a connection costs one descriptor and a few hundred
bytes, and three rules keep a new probe answered in time:

- every connection has HEAD_TIMEOUT to send its request and take the answer,
  whether it sends nothing or one byte a second (slow loris): then it is closed;
- at most `max_connections` are open; one more sheds the oldest (the one a
  probe, which sends its request at once, is least likely to be), and so
  does accept failing for want of descriptors;
- a request head is at most MAX_HEAD bytes and the answer is computed at
  once (the handlers read memory, or for /health a few small local files),
  or off this thread (/events: `later`), so no connection waits long on
  another; an answer is sent from its buffers as they are, never copied
  whole again.
"""

from __future__ import annotations

import errno
import http
import json
import logging
import os
import resource
import selectors
import socket
import threading
import time
from collections import deque
from datetime import datetime, timezone
from typing import Callable

from slurm_ext import agentapi
from slurm_ext.errors import AgentError

from .acceptruns import AcceptanceRuns
from .later import AnswerWorker, Later


__all__ = ["serve", "ProbeServer", "Answer", "journal_answer", "HEAD_TIMEOUT", "MAX_HEAD", "connection_cap"]

log = logging.getLogger("supervisor")

#: seconds a connection has, from accept, to send its request head and take the answer
HEAD_TIMEOUT = 5.0
#: bytes of request line and headers accepted; more is answered 431 and closed
MAX_HEAD = 8192
#: most connections open at once, whatever the descriptor limit allows
MAX_CONNECTIONS = 1024
#: descriptors left to the rest of the agent (journal, pidfds, notify sockets, pipes)
_FDS_KEPT = 48
#: connections the kernel completes before they are accepted (a flood must not make it drop a probe's SYN)
_BACKLOG = 1024
#: accepts per wake-up, so that requests already read are answered in between
_ACCEPT_BATCH = 32
#: after accept failed with no connection left to shed, wait this long before accepting again
_ACCEPT_PAUSE = 0.05
_TEXT = "text/plain; charset=utf-8"

#: most events one GET /events returns (the newest)
EVENTS_LIMIT = 20000
#: seconds one GET /events may read the journal: its answer must still go out within HEAD_TIMEOUT
EVENTS_SECONDS = 2.0

#: (status code, body, content type), and optionally a dict of more headers
Answer = tuple


class Guard:
    """The agent credential's side of this listener: who may ask, and the proof that signs each answer."""

    #: refusals logged a minute at most: a flood of bad requests must not flood the log
    LOG_PER_MINUTE = 10

    def __init__(self, agent, clock: Callable[[], float] = time.time):
        self.agent = agent
        self.clock = clock
        self._file: agentapi.CredentialFile | None = None
        self._said = ""
        #: the nonces taken within the request window: a request is taken once
        self.nonces = agentapi.NonceMemory()
        #: refusals logged in the current minute, and those not logged
        self._refusals_logged, self._refusals_quiet, self._refusals_minute = 0, 0, 0.0

    def credential(self) -> agentapi.Credential:
        """Raises CredentialError (logged once per problem)."""
        path = self.agent.config.node.agent_credential
        if self._file is None or self._file.path != path:
            self._file = agentapi.CredentialFile(path)
        try:
            found = self._file.get()
        except agentapi.CredentialError as err:
            if str(err) != self._said:
                self._said = str(err)
                log.error("http: /events, /health and POST /health/check refused: %s", err)
            raise
        self._said = ""
        return found

    def guarded(self, method: str, target: str, headers: dict, route: Callable[[], Answer]) -> Answer:
        """`route()`'s answer, signed, when the request proves the credential; else 401 (or 503: none here)."""
        try:
            secret = self.credential().secret
        except agentapi.CredentialError as err:
            return 503, f"{err}\n".encode(), _TEXT
        node = self.agent.config.node.slurm_name
        why, proven = agentapi.request_refusal(secret, method, target, headers, node, self.nonces, self.clock())
        if why:
            self._log_refusal(method, target, why)
            if proven:  # the asker holds the credential: it may know why
                said = f"{agentapi.REFUSED}{method} {target.partition('?')[0]}: {why}\n"
            else:
                said = (f"{method} {target.partition('?')[0]} needs the cluster's agent credential "
                        f"(Authorization: {agentapi.AUTH_SCHEME}, see docs/operator/agent-credential.md)\n")
            return 401, said.encode(), _TEXT
        nonce = headers.get(agentapi.NONCE_HEADER.lower(), "")

        def signed(answer: Answer) -> Answer:
            from slurm_ext.procfs import boot_id
            code, body, content_type, *more = answer
            boot = boot_id(self.agent.config.node.boot_id_file)
            return code, body, content_type, {
                **(more[0] if more else {}), **agentapi.answer_headers(secret, node, boot, nonce, code, body)}

        answer = route()
        if isinstance(answer, Later):  # signed where it is computed: a 32 MiB body is hashed off the probe thread
            return Later(lambda: signed(answer.work()), answer.worker)
        return signed(answer)

    def _log_refusal(self, method: str, target: str, why: str) -> None:
        """One warning per refusal, LOG_PER_MINUTE a minute at most; the first of the next minute counts the rest."""
        now = time.monotonic()
        if now - self._refusals_minute >= 60:
            if self._refusals_quiet:
                log.warning("http: %d more request(s) refused in the minute before, not logged one by one",
                            self._refusals_quiet)
            self._refusals_logged, self._refusals_quiet, self._refusals_minute = 0, 0, now
        if self._refusals_logged >= self.LOG_PER_MINUTE:
            self._refusals_quiet += 1
            return
        self._refusals_logged += 1
        log.warning("http: %s %s refused (401): %s", method, target.partition("?")[0][:100], why)


def agent_routes(agent, guard: Guard | None = None, runs: AcceptanceRuns | None = None
                 ) -> Callable[[str, dict], Answer | Later]:
    """The answer to a GET of each path (with its query) and the request's headers, from the agent's state."""
    exposition = []
    guard = guard or Guard(agent)
    runs = runs or AcceptanceRuns(agent)
    journal_reader = AnswerWorker("http-events")
    collector_reader = AnswerWorker("http-journal")  # the collector's own: the page's /events never makes it wait

    def answer(target: str, headers: dict) -> Answer:
        path, _, query = target.partition("?")
        if path in ("/events", "/journal", "/health", "/acceptance") or (
                path == "/metrics" and not agent.config.supervisor.open_metrics):
            return guard.guarded("GET", target, headers, lambda: answer_of(path, query))
        return answer_of(path, query)

    def answer_of(path: str, query: str) -> Answer | Later:
        if path == "/livez":
            ok = agent.live()
            return (200, b"ok\n", _TEXT) if ok else (503, b"agent loop stalled\n", _TEXT)
        if path == "/readyz":
            ok, why = agent.ready()
            return 200 if ok else 503, (why + "\n").encode(), _TEXT
        if path == "/metrics":
            if not exposition:  # prometheus_client is 12 MB of a 20 MB agent: loaded when first scraped
                from .metrics import exposition_of
                exposition.append(exposition_of(agent))
            body, content_type = exposition[0]()
            return 200, body, content_type
        if path == "/events":
            return _events(agent, query, journal_reader)
        if path == "/journal":
            return journal_answer(agent.config.node.state_dir, query, collector_reader)
        if path == "/health":
            return _health(agent)
        if path == "/acceptance":
            return _acceptance(agent, runs, query)
        return 404, (b"try /livez, /readyz, /metrics, /events?since=EPOCH, /journal?after=CURSOR, /health or "
                     b"/acceptance\n"), _TEXT

    return answer


#: least time between two polls asked by POST /health/check
_CHECK_SPACING = 1.0


def agent_posts(agent, guard: Guard | None = None, runs: AcceptanceRuns | None = None
                ) -> Callable[[str, dict], Answer | Later]:
    """The answer to a POST of each path: /health/check, which has the health monitor read the node now,
    /health/reset-gpu?gpu=N, which resets one GPU for an approved reset-gpu repair (health.gpureset),
    /health/clear?by=USER[&check=ID][&gpu=GPU], an operator's `health clear` asked from the controller, and
    /acceptance/run?level=L&trigger=T, an acceptance run the controller asks for (`runs`, shared with GET
    /acceptance)."""
    last = [0.0]
    guard = guard or Guard(agent)
    runs = runs or AcceptanceRuns(agent)
    resetter = AnswerWorker("http-reset-gpu")
    clearer = AnswerWorker("http-clear")
    starter = AnswerWorker("http-acceptance")

    def answer(target: str, headers: dict) -> Answer | Later:
        path, _, query = target.partition("?")
        if path == "/health/reset-gpu":
            return guard.guarded("POST", target, headers, lambda: _reset_gpu(agent, query, resetter))
        if path == "/health/clear":
            return guard.guarded("POST", target, headers, lambda: _clear(agent, query, clearer))
        if path == "/acceptance/run":
            return guard.guarded("POST", target, headers, lambda: _run_acceptance(agent, query, runs, starter))
        if path != "/health/check":
            return 405, (b"POST only to /health/check, /health/reset-gpu?gpu=N, /health/clear?by=USER and "
                         b"/acceptance/run?level=L&trigger=T\n"), _TEXT
        return guard.guarded("POST", target, headers, check_now)

    def check_now() -> Answer:
        now = time.monotonic()
        if now - last[0] < _CHECK_SPACING:
            return 429, b"a check was asked less than a second ago: its readings come within the second\n", _TEXT
        last[0] = now
        asked = time.time()
        if not agent.poll_health_now():
            return 409, b"no health monitor runs on this node (health.enabled), or it is still starting\n", _TEXT
        return 202, (json.dumps({"asked": asked}) + "\n").encode(), "application/json"

    return answer


#: how long POST /health/clear waits for the health monitor to take the request up (it looks each second)
CLEAR_WAIT = 5.0


def _clear(agent, query: str, clearer: AnswerWorker) -> Answer | Later:
    """An operator's clear of this node's findings, asked from the controller (only the agent credential gets here):
    the request the node's own `health clear` writes, with the operator's name, then a wait on `clearer`'s thread
    for the monitor to take it up; 400 for a check, GPU or name not taken, 409 when no monitor runs or another clear
    is being taken up."""
    from urllib.parse import parse_qs
    from .plugins import clear_checks
    asked = {key: values[0] for key, values in parse_qs(query, keep_blank_values=True).items()}
    by, check, gpu = asked.get("by", ""), asked.get("check", ""), asked.get("gpu", "")
    if not agentapi.OPERATOR_NAME.match(by):
        return 400, b"by: expected the operator's name (letters, digits, ._@+-)\n", _TEXT
    if check and check not in clear_checks():
        return 400, f"check: {check[:40]!r} is not a check; checks: {', '.join(clear_checks())}\n".encode(), _TEXT
    if gpu and not agentapi.CLEAR_SUBJECT.match(gpu):
        return 400, b"gpu: expected a GPU's index, UUID or PCI bus id, or a finding's subject (printable)\n", _TEXT
    if clearer.busy:
        return 409, b"another clear is being taken up on this node: ask again in a few seconds\n", _TEXT
    if not agent.poll_health_now():  # the monitor wakes for its poll, and takes the request up with it
        return 409, b"no health monitor runs on this node (health.enabled), or it is still starting\n", _TEXT
    return Later(lambda: _clear_answer(agent, check, gpu, by), clearer)


def _clear_answer(agent, check: str, gpu: str, by: str) -> Answer:
    """The answer to POST /health/clear, on the clearer's thread: whether the monitor took the request up."""
    from .plugins import request_clear
    path = request_clear(agent.config.node.state_dir, check, gpu, by)
    log.warning("http: health clear (check %r, gpu %r) asked by %s from the controller", check, gpu, by)
    start = time.monotonic()
    while os.path.exists(path) and time.monotonic() - start < CLEAR_WAIT:
        time.sleep(0.05)
    body = {"taken": not os.path.exists(path), "waited": round(time.monotonic() - start, 3)}
    return 200, (json.dumps(body) + "\n").encode(), "application/json"


def _reset_gpu(agent, query: str, resetter: AnswerWorker) -> Answer | Later:
    """Reset one GPU of this node (only the agent credential gets here): the tool runs on `resetter`'s thread, one
    reset at a time; 404 for a GPU the node does not have, nothing run."""
    from urllib.parse import parse_qs
    asked = parse_qs(query).get("gpu", [""])[0]
    if not (asked.isascii() and asked.isdigit()) or len(asked) > 4:  # "²" is a digit to str, not to int()
        return 400, b"gpu: expected the GPU's NVML index, such as gpu=2\n", _TEXT
    if resetter.busy:
        return 409, b"a GPU reset is running on this node: ask again once it has ended\n", _TEXT
    return Later(lambda: _reset_answer(agent, int(asked)), resetter)


def _reset_answer(agent, gpu: int) -> Answer:
    """The answer to POST /health/reset-gpu, on the resetter's thread."""
    from slurm_ext.errors import SlurmExtError
    from .plugins import reset_gpu
    try:
        outcome = reset_gpu(agent.config, gpu)
    except SlurmExtError as err:  # no such GPU: nothing was run
        return 404, f"{err}\n".encode(), _TEXT
    if outcome.ok:
        log.warning("http: GPU %d reset for the repair service: %s", gpu, outcome.command)
        agent.poll_health_now()  # the monitor reads the GPU as the reset left it
    elif outcome.ran:
        log.error("http: GPU %d reset failed: %s: %s", gpu, outcome.command, outcome.output[-300:])
    body = {"gpu": outcome.gpu, "ran": outcome.ran, "ok": outcome.ok, "command": outcome.command,
            "output": outcome.output, "held_by": list(outcome.held_by)}
    return 200, (json.dumps(body) + "\n").encode(), "application/json"


def _acceptance(agent, runs: AcceptanceRuns, query: str) -> Answer:
    """The node's last acceptance run (of `trigger`, when asked) as it kept it, whether a run asked of this agent is
    under way, and whether [acceptance] is on here: what the repair service asks before it resumes a repaired node
    (agentapi.AcceptanceAnswer). 500 when the kept run is unreadable (said, never taken as no run)."""
    from urllib.parse import parse_qs
    from slurm_ext.errors import SlurmExtError
    from slurm_ext.procfs import boot_id
    from .plugins import acceptance_enabled, last_acceptance
    trigger = parse_qs(query).get("trigger", [""])[0]
    if trigger and trigger not in agentapi.ACCEPTANCE_TRIGGERS:
        return 400, f"trigger: expected one of {', '.join(agentapi.ACCEPTANCE_TRIGGERS)}\n".encode(), _TEXT
    try:
        run = last_acceptance(agent.config, trigger)
    except SlurmExtError as err:
        return 500, f"{err}\n".encode(), _TEXT
    body = {"node": agent.config.node.slurm_name, "boot": boot_id(agent.config.node.boot_id_file),
            "running": runs.running, "enabled": acceptance_enabled(agent.config), "run": run}
    return 200, (json.dumps(body) + "\n").encode(), "application/json"


def _run_acceptance(agent, query: str, runs: AcceptanceRuns, starter: AnswerWorker) -> Answer | Later:
    """Start an acceptance run the controller asks for (only the agent credential gets here): 400 for a level or
    trigger not taken, 409 when [acceptance] enabled is false here, this is no worker's agent, or a run is under way;
    else 202 once the run holds the node (`acceptruns`), on `starter`'s thread."""
    from urllib.parse import parse_qs
    from .plugins import acceptance_enabled
    asked = parse_qs(query)
    level, trigger = asked.get("level", [""])[0], asked.get("trigger", [""])[0]
    if level not in agentapi.ACCEPTANCE_LEVELS or trigger not in agentapi.ACCEPTANCE_ASKED:
        return 400, (f"level and trigger: expected one of {', '.join(agentapi.ACCEPTANCE_LEVELS)} and one of "
                     f"{', '.join(agentapi.ACCEPTANCE_ASKED)}\n").encode(), _TEXT
    if agent.role != "worker":
        return 409, f"this is the {agent.role} agent: acceptance runs on a worker's\n".encode(), _TEXT
    if not acceptance_enabled(agent.config):
        return 409, (f"[acceptance] enabled is false on this node ({agent.config.origin}): it runs no acceptance "
                     "test\n").encode(), _TEXT
    if runs.running or starter.busy:
        return 409, b"an acceptance run asked of this agent is under way: ask again once it has ended\n", _TEXT

    def start() -> Answer:
        code, said = runs.start(level, trigger)
        return code, f"{said}\n".encode(), _TEXT
    return Later(start, starter)


def _events(agent, query: str, reader: AnswerWorker) -> Answer | Later:
    """The node journal's events since `since` (epoch seconds), oldest first, one JSON object a line, the newest
    `limit` (at most EVENTS_LIMIT): what `slurm-ext history` and the cluster page merge from every node. Read-only,
    like every route here; read by `reader`, off the probe thread, and 503 while it reads for another request."""
    from urllib.parse import parse_qs
    asked = parse_qs(query)
    try:
        since = float(asked.get("since", ["0"])[0])
        datetime.fromtimestamp(since, timezone.utc)  # a time, not inf or 1e300
    except (ValueError, OverflowError, OSError):
        return 400, b"since: expected epoch seconds, such as since=1767225600\n", _TEXT
    try:
        limit = int(asked.get("limit", [str(EVENTS_LIMIT)])[0])
        if not 1 <= limit <= EVENTS_LIMIT:
            raise ValueError
    except ValueError:
        return 400, f"limit: expected a count of events from 1 to {EVENTS_LIMIT}\n".encode(), _TEXT
    if reader.busy:
        return (503, f"{agentapi.BUSY}the journal is being read for another /events request\n".encode(), _TEXT,
                {"Retry-After": f"{agentapi.BUSY_RETRY:.0f}"})
    state_dir = agent.config.node.state_dir
    return Later(lambda: _events_page(state_dir, since if since > 0 else None, limit), reader)


def journal_answer(state_dir: str, query: str, reader: AnswerWorker) -> Answer | Later:
    """The node journal's lines after a cursor, and the cursor after them (agentapi.journal_body): what the
    controller's collector takes, each line once. Read on `reader`, off the probe thread, and 503 while it reads
    for another request (one collector asks; a second is a misconfiguration, and waits)."""
    try:
        cursor, size = agentapi.journal_query(query)
    except ValueError as err:
        return 400, f"{err}\n".encode(), _TEXT
    if reader.busy:
        return (503, f"{agentapi.BUSY}the journal is being read for another /journal request\n".encode(), _TEXT,
                {"Retry-After": f"{agentapi.BUSY_RETRY:.0f}"})
    return Later(lambda: _journal_page(state_dir, cursor, size), reader)


def _journal_page(state_dir: str, cursor: str, size: int) -> Answer:
    from slurm_ext.journal import read_after
    return 200, agentapi.journal_body(read_after(state_dir, cursor, size)), "application/x-ndjson"


def _events_page(state_dir: str, since: float | None, limit: int) -> Answer:
    """The answer to GET /events, on the journal reader's thread."""
    from slurm_ext.journal import read_newest
    tail = read_newest(state_dir, since, limit, agentapi.EVENTS_SENT, EVENTS_SECONDS)
    if tail.out_of_time:
        log.warning("http: GET /events read the journal in %s for %gs, its most, and sent the %d newest events "
                    "read (a slow disk, or lines that are no events)", state_dir, EVENTS_SECONDS, len(tail.lines))
    return 200, events_body(tail), "application/x-ndjson"


def events_body(tail) -> bytes:
    """`tail`'s lines (a journal.JournalTail), one a line; when events were cut for want of bytes (or time), a first
    line says how many and the time of the first sent (agentapi.CUT_KEY): a busy node's journal (a script's event
    carries up to 8 KiB of its output) must not pass the client's cap and cost the node its whole timeline."""
    body = b"\n".join((*tail.lines, b""))
    if not tail.cut:
        return body
    return json.dumps({agentapi.CUT_KEY: tail.cut, "from": tail.first_time}).encode() + b"\n" + body


def _health(agent) -> Answer:
    """The health monitor's latest readings and open findings (its worker writes them each poll), this boot's id
    and the node's facts (OS, kernel, interfaces and their byte counters): what the repair service asks after a
    repair, before it resumes the node, and what the cluster page shows of the node."""
    from dataclasses import asdict
    from slurm_ext.nodefacts import read_facts
    from slurm_ext.procfs import boot_id
    from .plugins import health_readings_path
    try:
        readings = json.loads(health_readings_path(agent.config.node.runtime_dir).read_text())
    except (OSError, ValueError):
        readings = None
    body = {"node": agent.config.node.slurm_name, "boot": boot_id(agent.config.node.boot_id_file),
            "time": time.time(), "monitor": readings,
            "facts": asdict(read_facts(tuple(agent.config.health.interfaces)))}
    return 200, (json.dumps(body) + "\n").encode(), "application/json"


def connection_cap(limit: int = MAX_CONNECTIONS) -> int:
    """Connections to keep open at most: `limit`, or fewer when the descriptor limit is low."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limit
    return max(4, min(limit, (soft - _FDS_KEPT) // 2))


class _Connection:
    """One accepted connection: what it sent so far, what is still to be sent, its deadline."""

    __slots__ = ("sock", "deadline", "received", "outgoing", "answered")

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock = sock
        self.deadline = deadline
        self.received = bytearray()
        #: the answer's head and body still to be sent (views: what was sent is never copied again)
        self.outgoing: list[memoryview] = []
        #: the whole answer is sent: what the client still sends is read and dropped until it closes
        self.answered = False


class ProbeServer:
    """HTTP/1.1 server of one thread: each connection one request, then closed.

    `answer(target, headers)` answers a GET, `post(target, headers)` a POST (its body, if any, is not read: no
    route takes one; `headers`: the request's, names in lower case); both must be quick and must not block (they
    run on this thread). An answer is (status, body, content type) or that and a dict of more headers, or a
    `Later` whose work computes one on its worker's thread: the connection waits for it (within its deadline)
    while this thread serves the others. Start it with `start()`; `close()` stops the thread and closes every
    socket.
    """

    def __init__(self, host: str, port: int, answer: Callable[[str, dict], Answer | Later],
                 max_connections: int | None = None, timeout: float = HEAD_TIMEOUT,
                 post: Callable[[str, dict], Answer | Later] | None = None):
        self.answer = answer
        self.post = post or (lambda target, headers: (405, b"only GET\n", _TEXT))
        self.timeout = timeout
        self.max_connections = max_connections or connection_cap()
        self.listener = socket.create_server((host, port), backlog=_BACKLOG)
        self.listener.setblocking(False)
        self.address = self.listener.getsockname()[:2]
        #: open connections, oldest first (dicts keep insertion order; all share one timeout)
        self._open: dict[socket.socket, _Connection] = {}
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        #: held while the wake pipe is written from another thread, and while it is closed
        self._wake_lock = threading.Lock()
        #: (connection, answer) computed by a Later's worker, for this thread to send
        self._computed: deque[tuple[_Connection, Answer]] = deque()
        self._selector.register(self.listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._accept_paused_until = 0.0
        self._closing = False
        self._thread: threading.Thread | None = None

    def start(self) -> "ProbeServer":
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving: the thread closes every connection and the listener, then ends."""
        self._closing = True
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)
        if self._thread is None or not self._thread.is_alive():  # else it still reads them: leave them
            with self._wake_lock:  # a worker that finishes later must not write to a descriptor reused since
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_w = -1

    def _wake(self) -> None:
        """Wake the thread from its select (from any thread)."""
        with self._wake_lock:
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"x")
            except OSError:  # full: it is awake already
                pass

    # -- the thread -------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            while not self._closing:
                try:
                    self._pass()
                except Exception:  # the probes must not die: the kubelet would restart the pod with its jobs
                    log.exception("http: probe server error; serving on")
                    time.sleep(0.1)
        finally:
            for conn in list(self._open.values()):
                self._close(conn)
            self._selector.close()
            self.listener.close()

    def _pass(self) -> None:
        for key, _ in self._selector.select(self._wait()):
            if key.data == "accept":
                self._accept()
            elif key.data == "wake":
                os.read(self._wake_r, 64)
                self._send_computed()
            elif key.fileobj in self._open:  # not closed earlier in this batch
                self._on_ready(self._open[key.fileobj])
        self._expire(time.monotonic())

    def _wait(self) -> float | None:
        """Seconds until the oldest connection's deadline or the end of an accept pause; None: no deadline."""
        now = time.monotonic()
        deadlines = [next(iter(self._open.values())).deadline] if self._open else []
        if self._accept_paused_until:
            deadlines.append(self._accept_paused_until)
        return max(0.0, min(deadlines) - now) if deadlines else None

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._out_of_descriptors(err)
                    return
                # accept(2): network errors pending on the new connection are to be treated like EAGAIN
                log.warning("http: accept on the probe port failed: %s", err)
                return
            if len(self._open) >= self.max_connections:
                self._shed_oldest()
            sock.setblocking(False)
            conn = _Connection(sock, time.monotonic() + self.timeout)
            self._open[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, "conn")
            self._read(conn)  # a probe has usually sent its request already

    def _out_of_descriptors(self, err: OSError) -> None:
        """accept found no descriptor: make room by shedding, or stop accepting for a moment."""
        if self._open:
            log.warning("http: accept failed (%s) with %d connections open: closing the oldest",
                        err.strerror, len(self._open))
            self._shed_oldest()
            return
        log.warning("http: accept failed (%s) with no connection open: pausing accept for %gs",
                    err.strerror, _ACCEPT_PAUSE)
        self._selector.unregister(self.listener)
        self._accept_paused_until = time.monotonic() + _ACCEPT_PAUSE

    def _shed_oldest(self) -> None:
        self._close(next(iter(self._open.values())))

    def _expire(self, now: float) -> None:
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._selector.register(self.listener, selectors.EVENT_READ, "accept")
        while self._open:
            oldest = next(iter(self._open.values()))
            if oldest.deadline > now:
                return
            self._close(oldest)

    def _on_ready(self, conn: _Connection) -> None:
        if conn.answered:
            self._drain(conn)
        elif conn.outgoing:
            self._write(conn)
        else:
            self._read(conn)

    def _recv(self, conn: _Connection, size: int) -> bytes | None:
        """What the peer sent (None: nothing yet); the connection is closed at its end or on an error."""
        try:
            data = conn.sock.recv(size)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return None
        return data

    def _read(self, conn: _Connection) -> None:
        data = self._recv(conn, MAX_HEAD + 1 - len(conn.received))
        if data is None:
            return
        conn.received += data
        end = conn.received.find(b"\r\n\r\n")
        if end < 0:
            end = conn.received.find(b"\n\n")
        if end >= 0:
            self._answer(conn, self._respond(bytes(conn.received[:end])))
        elif len(conn.received) > MAX_HEAD:
            self._reply(conn, 431, f"request head longer than {MAX_HEAD} bytes\n".encode(), _TEXT)

    def _respond(self, head: bytes) -> Answer | Later:
        """The answer to one request head (request line and headers)."""
        line, *header_lines = head.decode("latin-1").split("\n")
        parts = line.strip().split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return 400, b"expected: GET /livez HTTP/1.1\n", _TEXT
        method, target, _ = parts
        handler = {"GET": self.answer, "POST": self.post}.get(method)
        if handler is None:
            return 405, b"only GET, and POST where a route takes it\n", _TEXT
        headers = {}
        for header in header_lines:
            name, sep, value = header.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        try:
            return handler(target, headers)
        except Exception:  # a bug in a handler answers 500; the server goes on
            log.exception("http: %s %s failed", method, target[:100])
            return 500, b"internal error: see the agent's log\n", _TEXT

    def _answer(self, conn: _Connection, answer: Answer | Later) -> None:
        """Send `answer`, or have its worker compute it: the connection is left alone until then (or its deadline)."""
        if not isinstance(answer, Later):
            self._reply(conn, *answer)
            return
        self._selector.unregister(conn.sock)
        if not answer.worker.submit(answer.work, lambda computed: self._computed_for(conn, computed)):
            self._selector.register(conn.sock, selectors.EVENT_READ, "conn")
            self._reply(conn, 503, b"busy: ask again in a second\n", _TEXT, {"Retry-After": "1"})

    def _computed_for(self, conn: _Connection, answer: Answer) -> None:
        """From a worker's thread: `answer` is ready for `conn`."""
        self._computed.append((conn, answer))
        self._wake()

    def _send_computed(self) -> None:
        while self._computed:
            conn, answer = self._computed.popleft()
            if self._open.get(conn.sock) is conn:  # else closed meanwhile (its deadline, shed): dropped
                self._selector.register(conn.sock, selectors.EVENT_READ, "conn")
                self._reply(conn, *answer)

    def _reply(self, conn: _Connection, code: int, body: bytes, content_type: str, more: dict | None = None) -> None:
        reason = http.HTTPStatus(code).phrase
        extra = "".join(f"{name}: {value}\r\n" for name, value in (more or {}).items())
        head = (f"HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                f"{extra}Connection: close\r\n\r\n").encode("latin-1", "replace")
        conn.outgoing = [memoryview(head), memoryview(body)] if body else [memoryview(head)]
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, "conn")
        self._write(conn)

    def _write(self, conn: _Connection) -> None:
        try:
            sent = conn.sock.sendmsg(conn.outgoing)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        while sent:
            first = conn.outgoing[0]
            if len(first) > sent:
                conn.outgoing[0] = first[sent:]
                break
            sent -= len(first)
            conn.outgoing.pop(0)
        if not conn.outgoing:
            self._finish(conn)

    def _finish(self, conn: _Connection) -> None:
        """The answer is sent: end our side, and close once the client has (or at the deadline).

        Closing at once, with bytes of the client's still unread (a request
        body, a head over MAX_HEAD), would make the kernel reset the
        connection, and the client could lose the answer."""
        conn.answered = True
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        self._selector.modify(conn.sock, selectors.EVENT_READ, "conn")
        self._drain(conn)

    def _drain(self, conn: _Connection) -> None:
        self._recv(conn, 65536)

    def _close(self, conn: _Connection) -> None:
        self._open.pop(conn.sock, None)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()


def serve(agent, host: str, port: int) -> ProbeServer:
    """Start the listener in its own thread; returns the server (call .close()).

    Raises:
        AgentError: the address cannot be listened on (port taken, address not local).
    """
    try:
        guard, runs = Guard(agent), AcceptanceRuns(agent)
        server = ProbeServer(host, port, agent_routes(agent, guard, runs), post=agent_posts(agent, guard, runs))
    except OSError as err:
        raise AgentError(f"cannot listen on {host}:{port} for probes and metrics: {err.strerror} "
                         "(another agent of this role running? set supervisor.ports or --port)") from err
    server.start()
    log.info("probes and metrics on http://%s:%d/ (livez, readyz, metrics); at most %d connections, each "
             "closed after %gs", host, server.address[1], server.max_connections, server.timeout)
    return server
