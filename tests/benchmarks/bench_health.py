#!/usr/bin/env python3
"""Benchmark: the health monitor's cost on a node, and how fast it catches faults.

1. cost: `slurm-ext health monitor` with 8 fake GPUs at the default settings (10 s polls, NVML events,
   /dev/kmsg) for T seconds: CPU time (utime+stime) as % of one core, and RSS at the end; once with the fake
   answering at once, once with it taking each call's time on the recorded H200 (the fake's "latency":
   "recorded"). Baseline in the same run: an idle node agent alone (`slurm-ext supervise` with no workers) over
   the same T. Targets: under 0.2 % of a core, under 50 MB.
2. latency, median and max over N injections each, from the injection to the monitor's journal line:
   - kernel-log Xid (a driver line appended to a kernel-log file of the run's own: user space cannot write a record
     of the kernel's own into /dev/kmsg, and the monitor judges no other) -> health-finding;
   - NVML Xid event (appended to the fake NVML's events) -> health-finding;
   - link down (a veth end set down in a network namespace of the run's own) -> health-finding;
   - polled fault (a GPU lost in the fake NVML) -> health-finding, at the default 10 s interval.
   Targets: event-driven under 1 s; polled within two intervals. Holds and quiet windows are set to 0 for the
   latency part (they are policy, added on top: link-down's default hold is 25 s).

3. drain (--parts drain): a dev cluster of the run's own (real slurmctld, slurmd, slurmdbd; the worker agent runs
   the monitor as its health worker, reading a kernel-log file of its own): Xid 79 appended to it -> the
   health-finding line, and -> Slurm showing the owned drain (scontrol polled every 20 ms); then `health clear`
   and the resume before the next one. Target: under 2 s to the drain.

Run as root: python tests/benchmarks/bench_health.py [--seconds T] [--injections N] [--parts cost,latency,drain]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from slurm_ext import devcluster as dev
from slurm_ext.devcluster import fakenvml
from slurm_ext.devcluster.layout import Layout
from slurm_ext.devcluster.settings import DevSection

_NS = f"se-bench-{os.getpid()}"
#: the drain part's cluster: its own names and ports, apart from the test cluster, `dev up` and other benchmarks
BENCH_CLUSTER = dict(cluster_name="benchhealth", node_name="benchhealth1", slurmctld_port=27817, slurmd_port=27818,
                     slurmdbd_port=27819, mariadb_port=24307, controller_probe_port=27811, worker_probe_port=27810,
                     accounting_probe_port=27812, web_port=27813)


def _config(root: Path, latency: bool) -> Path:
    text = f"""
[node]
name = "benchnode"
state_dir = "{root}/state"
runtime_dir = "{root}/run"
[log]
file = "{root}/monitor.log"
[supervisor]
ports = {{login = 0}}
[supervisor.workers.sshd]
roles = []
[slurm]
conf = "{root}/no-slurm.conf"
timeout = "1s"
[health]
paths = ["{root}"]
"""
    if latency:
        text += f"""kernel_log = "{root}/kmsg"
interfaces = ["se-v0"]
network_namespace = "{_NS}"
[health.checks.link-down]
hold = "0s"
quiet = "0s"
[health.checks.gpu-lost]
quiet = "0s"
[health.checks.xid]
quiet = "1h"
"""
    path = root / ("latency.toml" if latency else "cost.toml")
    path.write_text(text)
    return path


def _start(root: Path, config: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, **fakenvml.environ(root / "lib", root / "gpus.json")}
    return subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "--config", str(config), *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(root / f"{args[0]}.err", "ab"))


def _cost(proc: subprocess.Popen, seconds: float) -> tuple[float, float]:
    ps = psutil.Process(proc.pid)
    time.sleep(5)  # imports, NVML init, first polls
    before = ps.cpu_times()
    start = time.monotonic()
    time.sleep(seconds)
    after = ps.cpu_times()
    wall = time.monotonic() - start
    cpu = (after.user + after.system) - (before.user + before.system)
    return 100 * cpu / wall, ps.memory_info().rss / 2**20


def _journal_lines(root: Path) -> int:
    path = root / "state" / "journal.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _has_event(path: Path, start_line: int, name: str, **fields) -> bool:
    lines = path.read_text().splitlines()[start_line:] if path.exists() else []
    return any((e := json.loads(line))["event"] == name and all(e.get(k) == v for k, v in fields.items())
               for line in lines)


def _wait_event(root: Path, start_line: int, name: str, timeout: float, **fields) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _has_event(root / "state" / "journal.jsonl", start_line, name, **fields):
            return time.monotonic()
        time.sleep(0.005)
    return None


#: application Xids (warnings, no drain): each (GPU, Xid) is a finding of its own (48 of them, for 2 x 20 injections)
_APP_XIDS = (13, 31, 69, 68, 32, 8)


def _latencies(root: Path, injections: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"kernel-log xid": [], "nvml xid event": [], "link down": [],
                                       "polled (gpu lost)": []}
    spec = fakenvml.default_gpus(8)
    for i in range(injections):  # an application's Xid: a warning, a new finding each time (another GPU or number)
        mark = _journal_lines(root)
        gpu, xid = i % 8, _APP_XIDS[i // 8 % len(_APP_XIDS)]
        start = time.monotonic()
        with open(root / "kmsg", "a") as log:
            log.write(f"NVRM: Xid (PCI:0000:{0x10 + 8 * gpu:02x}:00): {xid}, pid={i + 1}, name=bench, injected\n")
        seen = _wait_event(root, mark, "health-finding", 5, xid=xid, gpu=gpu)
        results["kernel-log xid"].append(seen - start if seen else float("inf"))
    spec["events"] = []
    for i in range(injections):
        mark = _journal_lines(root)
        k = injections + i  # (GPU, Xid) pairs the kernel-log part did not use
        gpu, xid = k % 8, _APP_XIDS[k // 8 % len(_APP_XIDS)]
        spec["events"].append({"gpu": gpu, "xid": xid})
        start = time.monotonic()
        fakenvml.write_spec(root / "gpus.json", spec)
        seen = _wait_event(root, mark, "health-finding", 5, xid=xid, gpu=gpu)
        results["nvml xid event"].append(seen - start if seen else float("inf"))
    ip = ["ip", "-n", _NS, "link", "set", "se-v1"]
    for i in range(injections):
        mark = _journal_lines(root)
        start = time.monotonic()
        subprocess.run([*ip, "down"], check=True)
        seen = _wait_event(root, mark, "health-finding", 5, check="link-down")
        results["link down"].append(seen - start if seen else float("inf"))
        subprocess.run([*ip, "up"], check=True)
        _wait_event(root, mark, "health-cleared", 10, check="link-down")
    for i in range(injections):
        time.sleep(random.uniform(0, 10))  # anywhere between two polls (each clear came right after one)
        mark = _journal_lines(root)
        spec["gpus"][i % 8]["lost"] = True
        start = time.monotonic()
        fakenvml.write_spec(root / "gpus.json", spec)
        seen = _wait_event(root, mark, "health-finding", 30, check="gpu-lost")
        results["polled (gpu lost)"].append(seen - start if seen else float("inf"))
        spec["gpus"][i % 8]["lost"] = False
        fakenvml.write_spec(root / "gpus.json", spec)
        _wait_event(root, mark, "health-cleared", 30, check="gpu-lost")
    return results


def _drain(injections: int) -> dict[str, list[float]]:
    root = Path(tempfile.mkdtemp(prefix="slurm-ext-bench-health-dev-"))
    os.chmod(root, 0o755)
    settings = DevSection(state_dir=str(root), **BENCH_CLUSTER)
    layout = Layout(settings)
    results: dict[str, list[float]] = {"kernel-log xid -> event": [], "kernel-log xid -> drain in Slurm": []}
    try:
        dev.up(settings)
        slurm = dev.client(settings, 10.0, "auto")
        time.sleep(3)  # the monitor's first polls
        journal = layout.node_state / "journal.jsonl"
        for i in range(injections):
            mark = len(journal.read_text().splitlines())
            bus = f"0000:{0x10 + 8 * (i % settings.gpu_count):02x}:00"
            start = time.monotonic()
            with open(layout.kernel_log, "a") as log:
                log.write(f"NVRM: Xid (PCI:{bus}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n")
            seen = drained = None
            while (seen is None or drained is None) and time.monotonic() - start < 10:
                if seen is None and _has_event(journal, mark, "health-finding", check="xid"):
                    seen = time.monotonic()
                node = slurm.node(settings.node_name)
                if drained is None and node.drained and node.reason.startswith("slurm-ext: xid 79"):
                    drained = time.monotonic()
                time.sleep(0.01)
            results["kernel-log xid -> event"].append(seen - start if seen else float("inf"))
            results["kernel-log xid -> drain in Slurm"].append(drained - start if drained else float("inf"))
            subprocess.run([sys.executable, "-m", "slurm_ext.cli", "--config", str(layout.slurm_ext_conf), "health",
                            "clear"], check=True, stdout=subprocess.DEVNULL, env=layout.daemon_environ())
            deadline = time.monotonic() + 30
            while slurm.node(settings.node_name).drained and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        dev.down(settings)
        shutil.rmtree(root, ignore_errors=True)
    return results


def _report(results: dict[str, list[float]]) -> None:
    for name, values in results.items():
        print(f"  {name}: median {statistics.median(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="cost measurement span (default 60)")
    parser.add_argument("--injections", type=int, default=20, help="injections per latency figure (default 20)")
    parser.add_argument("--parts", default="cost,latency,drain", help="which parts (default: all three)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    root = Path(tempfile.mkdtemp(prefix="slurm-ext-bench-health-"))
    procs = []
    try:
        fakenvml.build(root / "lib")
        fakenvml.write_spec(root / "gpus.json", fakenvml.default_gpus(8))
        (root / "run").mkdir()
        if "cost" in parts:
            print(f"cost over {args.seconds:g}s, 8 fake GPUs, default settings:")
            agent = _start(root, _config(root, False), "supervise", "--role", "login")
            procs.append(agent)
            agent_cpu, agent_rss = _cost(agent, args.seconds)
            agent.terminate()
            agent.wait(30)
            print(f"  idle agent alone (baseline): {agent_cpu:.3f} % of a core, RSS {agent_rss:.1f} MB")
            for latency in (None, "recorded"):
                fakenvml.write_spec(root / "gpus.json", {**fakenvml.default_gpus(8), "latency": latency})
                monitor = _start(root, _config(root, False), "health", "monitor")
                procs.append(monitor)
                cpu, rss = _cost(monitor, args.seconds)
                monitor.terminate()
                monitor.wait(30)
                ratio = f"{cpu / agent_cpu:.1f}x" if agent_cpu else "n/a (the idle agent used under the clock's 10 ms)"
                print(f"  health monitor, fake NVML {'at the recorded H200 latencies' if latency else 'answering at once'}"
                      f": {cpu:.3f} % of a core, RSS {rss:.1f} MB; ratio to the agent: CPU {ratio}, RSS "
                      f"{rss / agent_rss:.2f}x")
            fakenvml.write_spec(root / "gpus.json", fakenvml.default_gpus(8))
            print("  targets: under 0.2 % of a core and under 50 MB")
        if "latency" in parts:
            subprocess.run(["ip", "netns", "add", _NS], check=True)
            subprocess.run(["ip", "-n", _NS, "link", "add", "se-v0", "type", "veth", "peer", "name", "se-v1"],
                           check=True)
            for end in ("se-v0", "se-v1"):
                subprocess.run(["ip", "-n", _NS, "link", "set", end, "up"], check=True)
            (root / "kmsg").touch()
            monitor = _start(root, _config(root, True), "health", "monitor")
            procs.append(monitor)
            time.sleep(5)
            print(f"latency, {args.injections} injections each (injection -> health-finding in the journal):")
            _report(_latencies(root, args.injections))
            print("  targets: event-driven under 1 s; polled within two intervals (20 s)")
        if "drain" in parts:
            print(f"drain, {args.injections} injections (a dev cluster of the run's own, real Slurm):")
            _report(_drain(args.injections))
            print("  target: under 2 s to the drain")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
        subprocess.run(["ip", "netns", "del", _NS], check=False, stderr=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
