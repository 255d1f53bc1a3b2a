#!/usr/bin/env python3
"""Benchmark: `dev up` from stopped (packages installed, state kept) to an idle node.

Prints the median of several runs against a baseline measured in the same run:
the same daemons started by hand from the same generated files, with the
plain polling loops of a shell recipe. The ratio says what slurm-ext's
checks (packages, ports, files, pidfiles, readiness) cost on top of the
daemons' own start-up. Target: under 15 s on a 2-core machine.

Run as root: python tests/benchmarks/bench_dev_up.py [--runs N]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.cluster import TEST_CLUSTER  # noqa: E402  the test cluster's ports and names

from slurm_ext import devcluster as dev  # noqa: E402
from slurm_ext.devcluster.settings import DevSection  # noqa: E402
from slurm_ext.devcluster import daemons  # noqa: E402
from slurm_ext.devcluster.cluster import cluster_daemons  # noqa: E402
from slurm_ext.devcluster.layout import Layout  # noqa: E402


def time_dev_up(settings: DevSection) -> float:
    started = time.perf_counter()
    state = dev.up(settings)
    elapsed = time.perf_counter() - started
    assert state.node and state.node.idle, state
    return elapsed


def _poll(cmd: list[str], env: dict, expect: str = "", timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if result.returncode == 0 and expect in result.stdout:
            return
        time.sleep(0.1)
    raise SystemExit(f"baseline: {' '.join(cmd)} never answered {expect!r}")


def time_by_hand(settings: DevSection) -> tuple[float, list[subprocess.Popen]]:
    """The recipe's way: start each daemon (in the foreground, so that its PID is ours to stop), poll until
    it answers, next. The files are those the agents wrote in the `dev up` before."""
    layout = Layout(settings)
    env = layout.daemon_environ()
    my_cnf = layout.runtime_dir / "accounting" / "my.cnf"
    started = time.perf_counter()
    procs = []
    with open(layout.log / "by-hand.out", "ab") as out:
        def start(*argv: str) -> None:
            procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=out, start_new_session=True))
        start("mariadbd", f"--defaults-file={my_cnf}")
        _poll(["mariadb", f"--defaults-file={my_cnf}", "-e", "select 1"], env)
        start("slurmdbd", "-D")
        _poll(["sacctmgr", "-n", "show", "cluster"], env)
        start("slurmctld", "-D")
        start("slurmd", "-D", "-N", settings.node_name)
        _poll(["sinfo", "-h", "-n", settings.node_name, "-o", "%T"], env, expect="idle")
    return time.perf_counter() - started, procs


def stop_by_hand(procs: list[subprocess.Popen]) -> None:
    for proc in reversed(procs):
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    state_dir = tempfile.mkdtemp(prefix="slurm-ext-bench-")
    os.chmod(state_dir, 0o755)
    settings = DevSection(state_dir=state_dir, **{**TEST_CLUSTER, "node_name": "benchnode"})
    try:
        first = time_dev_up(settings)  # from nothing: database initialised, library built
        dev.down(settings)
        ours, baseline = [], []
        for _ in range(args.runs):
            ours.append(time_dev_up(settings))
            dev.down(settings)
            # munged is left running for the baseline, as the recipe's machine has it
            munged = cluster_daemons(Layout(settings))[0]
            daemons.start(munged, Layout(settings).daemon_environ(), 30)
            elapsed, procs = time_by_hand(settings)
            baseline.append(elapsed)
            stop_by_hand(procs)
            dev.down(settings)
        ratio = statistics.median(ours) / statistics.median(baseline)
        print(f"dev up from nothing (first run, database initialised): {first:.2f} s")
        print(f"dev up from stopped to idle: median {statistics.median(ours):.2f} s over {args.runs} runs "
              f"({', '.join(f'{t:.2f}' for t in ours)}); target < 15 s")
        print(f"baseline, same daemons started by hand: median {statistics.median(baseline):.2f} s "
              f"({', '.join(f'{t:.2f}' for t in baseline)})")
        print(f"ratio dev up / baseline: {ratio:.2f}")
    finally:
        dev.down(settings)
        shutil.rmtree(state_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
