"""A fleet of simulated node agents beside the dev cluster: `slurm-ext dev fleet`.

The dev cluster's slurm.conf may define far more nodes than run
([dev] defined_nodes, up to 10,000); the fleet plays the agents of those that
do not run, so the controller's collector, `history`, `status` and the page
can be tried at that size on one small host. Each simulated node has what the
collector reads of a real agent:

- a node journal of its own (fleet/<node> in the cluster's state folder), written by the
  real `events.emit` (rotation included) at `rate` events a second per node,
  plus a burst of `burst_rate` events a second over the whole fleet between
  `burst_after` and `burst_after + burst_for` seconds (an Xid storm: health
  findings); every event carries `fleet_seq`, its number on its node from 0,
  so a reader can check that it holds each event once;
- its agent's HTTP listener on the node's own port (127.0.0.1, as the layout
  says), answering GET /journal as the agent does (the same credential check,
  `journal.read_after`, the same signed answer), GET /health (eight H200s whose
  utilization, memory and temperature are read anew every `_READINGS_EVERY`
  seconds, every check ok) and /livez, /readyz.

It runs in one process or a few (`processes`, each with its own share of the
nodes and of the rates), on one asyncio loop each. A fleet stopped and
started again carries on each node's numbering from its journal, as an agent
restarted keeps its journal: the collector must neither miss nor repeat.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import resource
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from slurm_ext import agentapi, events
from slurm_ext.health.settings import CHECKS
from slurm_ext.journal import read_after, read_newest

from .layout import Layout

__all__ = ["FleetSettings", "SimulatedNode", "simulated_nodes", "run", "written"]

log = logging.getLogger("devcluster")

#: seconds between two batches of events written
_TICK = 0.05
#: seconds between two readings of a simulated node's GPUs (a health monitor's poll)
_READINGS_EVERY = 10.0
#: what a simulated node's health monitor reports besides its GPUs' figures
_CHECKS = dict.fromkeys(CHECKS, "ok")
_H200_MIB = 143771
_HEAD_LIMIT = 8192


@dataclass(frozen=True, slots=True)
class FleetSettings:
    #: events a second of each node, all the time (NVSentinel's large clusters: 0.025-0.03)
    rate: float = 0.03
    #: events a second of the whole fleet during the burst, on top of `rate`
    burst_rate: float = 0.0
    #: seconds from the start to the burst, and its length
    burst_after: float = 60.0
    burst_for: float = 300.0
    #: seconds to run (0: until SIGTERM or SIGINT)
    seconds: float = 0.0
    processes: int = 1


@dataclass
class SimulatedNode:
    name: str
    port: int
    state_dir: str
    #: the number of its next event (the count written so far)
    seq: int = 0
    nonces: agentapi.NonceMemory = field(default_factory=agentapi.NonceMemory)


def simulated_nodes(layout: Layout) -> list[SimulatedNode]:
    """The nodes slurm.conf defines that do not run (beyond [dev] nodes), each with its journal's next number."""
    found = []
    for node in layout.defined_nodes[layout.settings.nodes:]:
        state = layout.root / "fleet" / node.name  # not under nodes/: a folder there is a node `dev up` ran
        found.append(SimulatedNode(node.name, node.probe_port, str(state), _next_seq(str(state))))
    return found


def written(layout: Layout) -> dict[str, int]:
    """Each simulated node's events so far, counted in its own journal (a fleet numbers them from 0): what a reader
    of the fleet checks that it holds, each once."""
    counts = {}
    for node in layout.defined_nodes[layout.settings.nodes:]:
        count = 0
        for path in events.journal_files(str(layout.root / "fleet" / node.name)):
            try:
                with open(path, "rb") as journal:
                    count += sum(1 for _ in journal)
            except FileNotFoundError:
                pass
        counts[node.name] = count
    return counts


def run(layout: Layout, settings: FleetSettings) -> int:
    """Play the simulated nodes until `settings.seconds` pass or SIGTERM/SIGINT; in `processes` processes."""
    nodes = simulated_nodes(layout)
    if not nodes:
        raise SystemExit("dev fleet: [dev] defined_nodes is not above [dev] nodes: every node runs, none to play")
    _raise_descriptor_limit(len(nodes) // max(settings.processes, 1) + 4096)
    parts = [nodes[index::settings.processes] for index in range(settings.processes)]
    children = []
    for index, part in enumerate(parts[1:], 1):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _play(layout, part, len(nodes), settings, index)
            finally:
                os._exit(code)
        children.append(pid)
    try:
        return _play(layout, parts[0], len(nodes), settings, 0)
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for pid in children:
            os.waitpid(pid, 0)


def _play(layout: Layout, nodes: list[SimulatedNode], fleet: int, settings: FleetSettings, part: int) -> int:
    logging.getLogger("events").setLevel(logging.ERROR)  # a line in the log for each of thousands of events: no
    secret = agentapi.CredentialFile(str(layout.agent_credential)).get().secret
    return asyncio.run(_fleet(nodes, fleet, settings, secret))


async def _fleet(nodes: list[SimulatedNode], fleet: int, settings: FleetSettings, secret: bytes) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    servers = []
    for node in nodes:
        Path(node.state_dir).mkdir(parents=True, exist_ok=True)
        servers.append(await asyncio.start_server(lambda r, w, n=node: _answer(n, secret, r, w), "127.0.0.1",
                                                  node.port, backlog=256, reuse_address=True))
    log.info("fleet: %d simulated node agents listen", len(nodes))
    share = len(nodes) / fleet
    writer = asyncio.create_task(_write_events(nodes, settings, share, stop))
    if settings.seconds:
        loop.call_later(settings.seconds, stop.set)
    await stop.wait()
    await writer
    for server in servers:
        server.close()
    return 0


async def _write_events(nodes: list[SimulatedNode], settings: FleetSettings, share: float,
                        stop: asyncio.Event) -> None:
    """`rate` per node and this process's share of the burst, a batch every _TICK, until `stop`."""
    started = time.monotonic()
    owed = 0.0
    while not stop.is_set():
        now = time.monotonic()
        elapsed = now - started
        rate = settings.rate * len(nodes)
        burst = settings.burst_rate > 0 and settings.burst_after <= elapsed < settings.burst_after + settings.burst_for
        if burst:
            rate += settings.burst_rate * share
        owed += rate * _TICK
        for _ in range(int(owed)):
            _emit(random.choice(nodes), burst)
        owed -= int(owed)
        await asyncio.sleep(max(0.0, _TICK - (time.monotonic() - now)))


def _emit(node: SimulatedNode, burst: bool) -> None:
    gpu = node.seq % 8
    if burst:
        events.emit(node.state_dir, "health", "health-finding", f"warning: xid 13 gpu {gpu}: graphics engine "
                    "exception (fleet burst)", "warning", check="xid", evidence=f"13 gpu {gpu} Graphics Engine "
                    "Exception", gpu=gpu, finding_severity="warning", fleet_seq=node.seq)
    else:
        events.emit(node.state_dir, "prolog_epilog", "script-ok", f"job-start script 10-check ran for job "
                    f"{node.seq}", job=str(node.seq), fleet_seq=node.seq)
    node.seq += 1


def _next_seq(state_dir: str) -> int:
    """One more than the newest fleet_seq in a node's journal (0 when it has none)."""
    try:
        tail = read_newest(state_dir, None, 100, 2**20, 5.0)
    except OSError:
        return 0
    for line in reversed(tail.lines):
        try:
            return int(json.loads(line)["fleet_seq"]) + 1
        except (ValueError, KeyError, TypeError):
            continue  # a line of another writer: the one before
    return 0


async def _answer(node: SimulatedNode, secret: bytes, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> None:
    """One request, one answer, as the agent's listener gives them (supervisor/http.py)."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
        lines = head[:_HEAD_LIMIT].decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        code, body, kind, more = _route(node, secret, method, target, headers)
        said = "".join(f"{k}: {v}\r\n" for k, v in more.items())
        writer.write(f"HTTP/1.1 {code} -\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n{said}"
                     "Connection: close\r\n\r\n".encode() + body)
        await writer.drain()
    except (OSError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
            asyncio.CancelledError):  # cancelled: the fleet stops with this request unanswered, as an agent would
        pass
    finally:
        writer.close()


def _route(node: SimulatedNode, secret: bytes, method: str, target: str, headers: dict) -> tuple:
    path, _, query = target.partition("?")
    if path in ("/livez", "/readyz"):
        return 200, b"ok\n", "text/plain", {}
    if path not in ("/journal", "/health") or method != "GET":
        return 404, b"the fleet plays /journal, /health, /livez and /readyz\n", "text/plain", {}
    why, _ = agentapi.request_refusal(secret, method, target, headers, node.name, node.nonces, time.time())
    if why:
        return 401, f"{why}\n".encode(), "text/plain", {}
    kind = "application/json" if path == "/health" else "application/x-ndjson"
    try:
        if path == "/health":
            code, body = 200, json.dumps(_health(node.name, time.time())).encode()
        else:
            cursor, size = agentapi.journal_query(query)
            code, body = 200, agentapi.journal_body(read_after(node.state_dir, cursor, size))
    except ValueError as err:
        code, body = 400, f"{err}\n".encode()
    nonce = headers.get(agentapi.NONCE_HEADER.lower(), "")
    return code, body, kind, agentapi.answer_headers(secret, node.name, _BOOT, nonce, code, body)


#: the boot id every simulated node answers with
_BOOT = "fleet"


def _health(name: str, now: float) -> dict:
    """A simulated node's /health as an agent's health monitor writes it: eight H200s, read every _READINGS_EVERY
    seconds (each reading's figures drawn from the node's name and the reading's time, so that two askers of one
    reading see the same figures)."""
    read = now - now % _READINGS_EVERY
    draw = random.Random(f"{name}/{read}")
    gpus = []
    for index in range(8):
        used = draw.uniform(0, _H200_MIB * 0.95)
        gpus.append({"gpu": {"index": index, "name": "NVIDIA H200", "uuid": f"GPU-fleet-{name}-{index}"},
                     "utilization": draw.randrange(101), "fb_used_mib": round(used, 1),
                     "fb_free_mib": round(_H200_MIB - used, 1), "fb_reserved_mib": 0.0,
                     "temperature": draw.randrange(30, 80), "error_text": "", "jobs": []})
    return {"node": name, "boot": _BOOT, "time": now,
            "monitor": {"readings_time": read, "findings": [], "checks": _CHECKS, "driver": "570.195.03",
                        "gpus": gpus, "interval": _READINGS_EVERY},
            "facts": {"os": "Debian GNU/Linux 13 (trixie)", "kernel": "6.12.57+deb13-amd64",
                      "interfaces": [{"name": "ib0", "speed_mbps": 400000, "rx_bytes": read * 1e7,
                                      "tx_bytes": read * 1e7}]}}


def _raise_descriptor_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(wanted, soft), max(wanted, hard)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
