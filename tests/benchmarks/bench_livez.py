#!/usr/bin/env python3
"""Benchmark: the node agent's /livez latency while a job floods its port, or while clients read its journal.

Starts a real agent (`slurm-ext supervise --role login`, one worker: `sleep`)
on a free 127.0.0.1 port in a temporary directory and times GET /livez, each
on a new connection:

- baseline: nothing else connected;
- flood: a process of uid nobody (any job can reach 127.0.0.1) holds `--idle`
  silent connections and `--loris` slow-loris ones that send one byte of a
  request head a second, and opens a new one for each the agent closes;
- with `--events N` instead of the flood: a full journal (64 MiB) and N
  processes with the agent credential that ask /events?since=0 in a loop, as
  `slurm-ext history` or the page ask it (a busy agent's 503 once more a
  second later; issue 28, item 2). Each probe has the kubelet's 1 s; one not answered in it counts as 1 s.

Prints median, p99 and max of each, and what the agent did to the flood (the
connections it closed, the age of the oldest still open) or for the clients
(pages sent, requests answered 503). Target: /livez within 100 ms under a
flood of 500 (every probe), and a p99 under 100 ms with 10 /events clients.
Everything it starts is stopped by PID.

Run: python tests/benchmarks/bench_livez.py [--probes 50] [--idle 500] [--loris 20] [--events 10]
"""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_supervisor_security import (Attacker, EventsClients, free_port, get_livez,  # noqa: E402  the tests' own
                                      write_full_journal)

GAP = 0.05  # seconds between two probes


def start_agent(work: Path, port: int, node: str = "") -> subprocess.Popen:
    config = work / "slurm-ext.toml"
    config.write_text(textwrap.dedent(f"""\
        [node]
        name = "benchlivez"
        state_dir = "{work}/state"
        runtime_dir = "{work}/run"
        {node}
        [supervisor.workers.sshd]
        roles = []
        [supervisor.workers.idle]
        roles = ["login"]
        command = ["sleep", "100000"]
        """))
    entry = shutil.which("slurm-ext", path=os.path.dirname(sys.executable))
    program = [entry] if entry else [sys.executable, "-m", "slurm_ext.cli"]
    log = open(work / "agent.log", "wb")
    agent = subprocess.Popen([*program, "--config", str(config), "supervise", "--role", "login", "--port", str(port)],
                             stdout=log, stderr=log, cwd="/")
    log.close()
    deadline = time.monotonic() + 30
    while get_livez(port, timeout=1.0)[0] != 200:
        if agent.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the agent did not answer /livez:\n{(work / 'agent.log').read_text()[-2000:]}")
        time.sleep(0.1)
    return agent


def stop_agent(agent: subprocess.Popen) -> None:
    if agent.poll() is None:
        os.kill(agent.pid, signal.SIGTERM)
        try:
            agent.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(agent.pid, signal.SIGKILL)
            agent.wait()


def probe(port: int, count: int) -> list[float]:
    """Seconds of `count` GETs of /livez; a probe not answered 200 ends the run."""
    seconds = []
    for _ in range(count):
        code, took = get_livez(port, timeout=5.0)
        if code != 200:
            raise SystemExit(f"/livez answered {code or 'nothing'} after {took:.3f}s")
        seconds.append(took)
        time.sleep(GAP)
    return seconds


#: the kubelet's default livenessProbe timeoutSeconds
KUBELET_TIMEOUT = 1.0


def probe_as_kubelet(port: int, count: int) -> tuple[list[float], int]:
    """Seconds of `count` GETs of /livez with the kubelet's timeout (one not answered 200 in it counts as the
    timeout), and how many were not."""
    seconds, failed = [], 0
    for _ in range(count):
        code, took = get_livez(port, timeout=KUBELET_TIMEOUT)
        if code != 200:
            failed += 1
            took = max(took, KUBELET_TIMEOUT)
        seconds.append(took)
        time.sleep(GAP)
    return seconds, failed


def events_run(args: argparse.Namespace) -> int:
    """/livez while `args.events` clients loop /events?since=0 of a full journal."""
    work = Path(tempfile.mkdtemp(prefix="bench-livez-"))
    port = free_port()
    agent = clients = None
    from slurm_ext.agentapi import create_credential
    try:
        credential = work / "agent-credential"
        create_credential(credential)
        write_full_journal(work / "state")
        size = sum(path.stat().st_size for path in (work / "state").iterdir())
        agent = start_agent(work, port, f'agent_credential = "{credential}"')
        probe(port, 3)  # warm-up
        baseline = probe(port, args.probes)
        clients = EventsClients(credential, "benchlivez", port, args.events, work)
        clients.wait_going(timeout=120)
        loaded, failed = probe_as_kubelet(port, args.probes)
        reports = clients.report(timeout=120)
    finally:
        if clients is not None:
            clients.kill()
        if agent is not None:
            stop_agent(agent)
        shutil.rmtree(work, ignore_errors=True)
    print(f"/livez of `slurm-ext supervise`, {args.probes} probes, each on a new connection, "
          f"timeout {KUBELET_TIMEOUT:g}s")
    print(f"  baseline (no other connection):                      {figures(baseline)}")
    print(f"  {args.events} clients looping /events?since=0 ({size / 2**20:.0f} MiB journal): {figures(loaded)}")
    print(f"  probes not answered within {KUBELET_TIMEOUT:g}s: {failed} of {args.probes}")
    sizes = sorted({count for report in reports for count in report["events"]})
    failures = [failure for report in reports for failure in report["failed"]]
    print(f"  the clients got {sum(r['pages'] for r in reports)} pages (of {sizes} events) and "
          f"{sum(r['busy'] for r in reports)} answers 503 (busy); failures: {len(failures)} {failures[:2]}")
    p99 = statistics.quantiles(loaded, n=100, method="inclusive")[98]
    print(f"  target, p99 under 100 ms with the clients: {'met' if p99 < 0.1 and not failed else 'NOT met'}")
    return 0 if p99 < 0.1 and not failed else 1


def figures(seconds: list[float]) -> str:
    p99 = statistics.quantiles(seconds, n=100, method="inclusive")[98]
    return (f"median {statistics.median(seconds) * 1000:7.2f} ms   p99 {p99 * 1000:7.2f} ms   "
            f"max {max(seconds) * 1000:7.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--probes", type=int, default=50)
    parser.add_argument("--idle", type=int, default=500)
    parser.add_argument("--loris", type=int, default=20)
    parser.add_argument("--events", type=int, default=0, metavar="N",
                        help="instead of the flood: N clients looping /events?since=0 of a full journal")
    args = parser.parse_args()
    if args.events:
        return events_run(args)
    work = Path(tempfile.mkdtemp(prefix="bench-livez-"))
    port = free_port()
    agent = attacker = None
    try:
        agent = start_agent(work, port)
        probe(port, 3)  # warm-up: imports, first metrics
        baseline = probe(port, args.probes)
        flood_seconds = args.probes * (GAP + 0.1) + 10
        attacker = Attacker(port, args.idle, args.loris, flood_seconds)
        time.sleep(1.0)
        flooded = probe(port, args.probes)
        report = attacker.report(timeout=flood_seconds + 60)
    finally:
        if attacker is not None:
            attacker.stop()
        if agent is not None:
            stop_agent(agent)
        shutil.rmtree(work, ignore_errors=True)
    print(f"/livez of `slurm-ext supervise`, {args.probes} probes, each on a new connection")
    print(f"  baseline (no other connection):            {figures(baseline)}")
    print(f"  flood ({attacker.started['held']} idle/slow-loris held by uid "
          f"{attacker.started['uid']}): {figures(flooded)}")
    print(f"  ratio of medians: {statistics.median(flooded) / statistics.median(baseline):.2f}")
    print(f"  the agent closed {report['closed']['idle']} idle and {report['closed']['loris']} slow-loris "
          f"connections (each opened again); oldest open at the end: {report['oldest']:.1f}s; "
          f"connects that failed: {report['failed']}")
    target = max(flooded) < 0.1
    print(f"  target, every probe under 100 ms in the flood: {'met' if target else 'NOT met'}")
    return 0 if target else 1


if __name__ == "__main__":
    sys.exit(main())
