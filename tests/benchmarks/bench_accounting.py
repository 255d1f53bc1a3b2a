#!/usr/bin/env python3
"""Benchmark: job end -> its record in sacct, on a dev cluster of its own (MariaDB and slurmdbd under the
accounting agent), median and p95 over N jobs; then the same with a 5 s database outage in the middle
(mariadbd stopped with SIGSTOP for 5 s, then SIGCONT: a database that does not answer, not one that
restarts), against the first run as the baseline.

Each job (`true`) runs alone: the end is when slurmctld first shows it COMPLETED (polled every 20 ms),
the record when sacct first shows it COMPLETED (polled every 20 ms). Run as root:
    python tests/benchmarks/bench_accounting.py [--jobs 100] [--outage 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time

import psutil

from slurm_ext import command, devcluster as dev
from slurm_ext.devcluster import daemons
from slurm_ext.devcluster.cluster import cluster_daemons
from slurm_ext.devcluster.layout import Layout

SETTINGS = dict(cluster_name="benchacct", node_name="benchacct1", slurmctld_port=18817, slurmd_port=18818,
                slurmdbd_port=18819, mariadb_port=13309, controller_probe_port=19831, worker_probe_port=19830,
                accounting_probe_port=19832, web_port=19843, gpu_count=0)
_POLL = 0.02


def _run(env, *argv) -> str:
    return command.run(list(argv), 30, env=env, check=False).stdout


def _one_job(env) -> tuple[float, float]:
    """(job end -> record, submit -> end) in seconds for one job."""
    job = _run(env, "sbatch", "--parsable", "-o", "/dev/null", "--wrap=true").strip().split(";")[0]
    submitted = time.monotonic()
    while "JobState=COMPLETED" not in _run(env, "scontrol", "show", "job", job):
        time.sleep(_POLL)
    ended = time.monotonic()
    while "COMPLETED" not in _run(env, "sacct", "-n", "-X", "-P", "-j", job, "-o", "State"):
        time.sleep(_POLL)
    return time.monotonic() - ended, ended - submitted


def _mariadbd(layout: Layout) -> int:
    agent = daemons.running_pid(next(d for d in cluster_daemons(layout) if d.name == "supervise-accounting"))
    return next(c.pid for c in psutil.Process(agent).children() if c.name() == "mariadbd")


def _series(env, jobs: int, outage: float = 0.0, layout: Layout | None = None) -> list[float]:
    latencies = []
    for index in range(jobs):
        if outage and index == jobs // 2:
            pid = _mariadbd(layout)
            os.kill(pid, signal.SIGSTOP)
            threading.Timer(outage, os.kill, (pid, signal.SIGCONT)).start()
        latencies.append(_one_job(env)[0])
    return latencies


def _figures(name: str, values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    median = statistics.median(ordered)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    print(f"{name:<28} median {median * 1000:8.0f} ms   p95 {p95 * 1000:8.0f} ms   max {ordered[-1] * 1000:8.0f} ms")
    return median, p95


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--outage", type=float, default=5.0, help="seconds the database stops answering")
    args = parser.parse_args()
    state_dir = tempfile.mkdtemp(prefix="slurm-ext-bench-acct-")
    os.chmod(state_dir, 0o755)
    settings = dev.DevSection(state_dir=state_dir, **SETTINGS)
    layout = Layout(settings)
    try:
        dev.up(settings)
        env = layout.daemon_environ()
        _one_job(env)  # the first job of a new cluster is slower (associations, first rows)
        base = _series(env, args.jobs)
        hit = _series(env, args.jobs, args.outage, layout)
        print(f"job end -> record in sacct, {args.jobs} jobs each, one at a time (Slurm "
              f"{_run(env, 'sinfo', '--version').strip()}):")
        base_median, base_p95 = _figures("steady", base)
        hit_median, hit_p95 = _figures(f"{args.outage:g} s database outage", hit)
        print(f"ratio outage/steady: median {hit_median / base_median:.2f}, p95 {hit_p95 / base_p95:.2f}")
    finally:
        dev.down(settings)
        shutil.rmtree(state_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
