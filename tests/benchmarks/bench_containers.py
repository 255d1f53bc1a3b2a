#!/usr/bin/env python3
"""Benchmark: slurm-ext's images (issue 11), each figure beside a host baseline measured in the same run.

1. image sizes: each image of containers/build.py, as the engine reports it (uncompressed). Slinky's
   published slurmd image (ghcr.io/slinkyproject/slurmd) cannot be pulled here: no registry is reachable.
2. start: a worker container started for a node that is not there -> slurmctld shows the node idle
   (polled every 50 ms through the controller container), against `slurm-ext dev up` on the host from
   stopped to an idle node (all daemons, the whole local cluster), median of --runs each.
3. kill: slurmd killed with SIGKILL -> a new slurmd under the agent -> its port takes connections again,
   timed by one script run inside the worker container (docker exec) and on the host against the dev
   cluster's worker agent; median of --kills each, 3 s apart (the crash-loop rule is 5 exits in 10 s).

The engine is one of its own (tests/docker_engine.py) unless SLURM_EXT_TEST_DOCKER_HOST names one; the
images are built from the checkout first (cached layers make a second run fast). Run as root:
    python tests/benchmarks/bench_containers.py [--runs N] [--kills N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE.parents[2] / "containers"))
from helpers.cluster import TEST_CLUSTER  # noqa: E402  the test cluster's ports and names
from helpers.images import APT_RELEASE_MAX_AGE_DAYS  # noqa: E402  the suite's snapshot mirror, as the tests take it
from docker_engine import Engine  # noqa: E402
from cluster import IMAGE_NAMES, SLURMD_PORT, ContainerCluster  # noqa: E402  containers/cluster.py

from slurm_ext import devcluster as dev  # noqa: E402
from slurm_ext.devcluster.settings import DevSection  # noqa: E402

SUITE = "sid"

#: run where slurmd runs (the container, or the host): SIGKILL it, time the new one and its answer
KILL_AND_TIME = r"""
import json, os, signal, socket, sys, time
agent, port = int(sys.argv[1]), int(sys.argv[2])

def slurmd(other=None):
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == other:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(") ", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                name = os.path.basename(f.read().split(b"\0")[0])
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == agent and name in (b"slurmd", b"slurmd-wlm"):
            return int(entry)
    return None

old = slurmd()
killed = time.monotonic()
os.kill(old, signal.SIGKILL)
while (new := slurmd(old)) is None:
    time.sleep(0.001)
seen = time.monotonic()
while True:  # its port takes connections again (a dynamic node's Port= is its own: scontrol cannot tell)
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        break
    except OSError:
        time.sleep(0.002)
print(json.dumps({"old": old, "new": new, "pid": seen - killed, "answering": time.monotonic() - killed}))
"""


def median(values: list[float]) -> float:
    return statistics.median(values)


def figures(values: list[float]) -> str:
    return f"median {median(values):.3f} s ({', '.join(f'{v:.3f}' for v in values)})"


def build_images(engine: Engine) -> dict[str, str]:
    subprocess.run([sys.executable, str(HERE.parents[2] / "containers" / "build.py"), "--suite", SUITE,
                    "--apt-release-max-age", str(APT_RELEASE_MAX_AGE_DAYS)],
                   env=engine.environ(), check=True, stdout=subprocess.DEVNULL)
    return {name: f"slurm-ext-{name}:{SUITE}" for name in IMAGE_NAMES}


def container_start(cluster: ContainerCluster, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        worker = cluster.workers[min(cluster.workers)]
        cluster.remove(f"n{worker.index}")
        cluster.exec("controller", "scontrol", "delete", f"nodename={worker.node}", check=False)
        started = time.monotonic()
        cluster.start_worker(worker.index, worker.gpus)
        cluster.wait_idle(worker.node, timeout=60)
        times.append(time.monotonic() - started)
    return times


def container_kills(cluster: ContainerCluster, kills: int) -> list[dict]:
    worker = cluster.workers[min(cluster.workers)]
    results = []
    for _ in range(kills):
        time.sleep(3.0)
        _, out = cluster.exec(f"n{worker.index}", "python3", "-c", KILL_AND_TIME, "1", str(SLURMD_PORT + worker.index))
        results.append(json.loads(out.strip().splitlines()[-1]))
    cluster.wait_idle(worker.node)
    return results


def host_figures(runs: int, kills: int) -> tuple[list[float], list[dict]]:
    state_dir = tempfile.mkdtemp(prefix="slurm-ext-bench-")
    os.chmod(state_dir, 0o755)
    settings = DevSection(state_dir=state_dir, **{**TEST_CLUSTER, "node_name": "benchnode"})
    try:
        state = dev.up(settings)  # from nothing: database initialised, library built
        dev.down(settings)
        ups = []
        for _ in range(runs):
            started = time.monotonic()
            state = dev.up(settings)
            ups.append(time.monotonic() - started)
            assert state.node and state.node.idle, state
            if len(ups) < runs:
                dev.down(settings)
        agent = next(d.pid for d in dev.status(settings).daemons if d.name == "supervise-worker")
        results = []
        for _ in range(kills):
            time.sleep(3.0)
            out = subprocess.run([sys.executable, "-c", KILL_AND_TIME, str(agent), str(settings.slurmd_port)],
                                 capture_output=True, text=True, check=True).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
        return ups, results
    finally:
        dev.down(settings)
        shutil.rmtree(state_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kills", type=int, default=3)
    args = parser.parse_args()

    host_ups, host_kills = host_figures(args.runs, args.kills)
    own = not os.environ.get("SLURM_EXT_TEST_DOCKER_HOST")
    engine = Engine().start() if own else Engine.existing(os.environ["SLURM_EXT_TEST_DOCKER_HOST"])
    cluster = None
    try:
        images = build_images(engine)
        sizes = {name: engine.client.images.get(tag).attrs["Size"] / 1e6 for name, tag in images.items()}
        base = engine.client.images.get(f"slurm-ext-base:{SUITE}").attrs["Size"] / 1e6
        cluster = ContainerCluster(engine.client, images, "cgroup-v1").start()
        starts = container_start(cluster, args.runs)
        kills = container_kills(cluster, args.kills)
    finally:
        if cluster is not None:
            cluster.stop()
        engine.stop()

    print(f"image sizes (uncompressed, Debian {SUITE}, Slurm 26.05): base {base:.0f} MB; "
          + ", ".join(f"{name} {size:.0f} MB" for name, size in sizes.items()))
    print("  Slinky's ghcr.io/slinkyproject/slurmd: not measurable here (no registry reachable)")
    print(f"worker container start -> node idle: {figures(starts)}")
    print(f"slurm-ext dev up (host, whole cluster) stopped -> node idle: {figures(host_ups)}")
    print(f"ratio container start / dev up: {median(starts) / median(host_ups):.2f}")
    for where, results in (("container", kills), ("host", host_kills)):
        print(f"slurmd kill -9 in the {where}: new pid {figures([r['pid'] for r in results])}; "
              f"answering {figures([r['answering'] for r in results])}")
    print(f"ratio answering container / host: "
          f"{median([r['answering'] for r in kills]) / median([r['answering'] for r in host_kills]):.2f}")


if __name__ == "__main__":
    main()
