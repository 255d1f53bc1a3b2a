#!/usr/bin/env python3
"""Record what real Slurm daemons answer to every call slurm-ext's Slurm client makes: tests/data/slurm/<version>.json.

    python3 tests/record_slurm_answers.py host     # the host's Slurm (Debian 12: 22.05), a dev cluster of its own
    python3 tests/record_slurm_answers.py sid      # slurm-ext's images on Debian sid (26.05), in Docker
    python3 tests/record_slurm_answers.py trixie   # on Debian trixie (24.11)
    python3 tests/record_slurm_answers.py resolute # on Ubuntu 26.04 (25.11: Debian has none)

As root, from the checkout, with the test dependencies installed (the README's test command), under the suite's
lock (`flock /tmp/slurm-ext-cluster-tests.lock python3 tests/record_slurm_answers.py ...`: its clusters use ports and
node names of their own, but Slurm's job cgroups and the CPUs are the host's). The images must be
built into the engine first (`containers/build.py --suite SUITE`); the engine is SLURM_EXT_TEST_DOCKER_HOST's, or one
of the script's own (then it builds them). Each run prepares the same cluster (helpers.slurmanswers.Facts), runs the
walk through a recorder, and writes the file, replacing the version's earlier one; tests/test_slurm_answers.py
replays it. Record again when the client makes a new call or a new form of one (the replay names it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "containers")]

from slurm_ext import command  # noqa: E402
from slurm_ext.config import SlurmSection  # noqa: E402
from slurm_ext.slurm import SlurmClient  # noqa: E402

from helpers.containerrepair import exec_runner  # noqa: E402
from helpers.slurmanswers import FOREIGN_DRAIN, POWER_ACTION, Facts, Recorder, Recording, walk  # noqa: E402
from helpers.wait import wait_for  # noqa: E402

#: ports of the recording's clusters, clear of the suite's
HOST_PORTS = dict(slurmctld_port=28517, slurmd_port=28518, slurmdbd_port=28519, mariadb_port=23350,
                  controller_probe_port=29951, worker_probe_port=29950, accounting_probe_port=29952, web_port=29953,
                  node_port_base=28540)


def _since() -> str:
    """Now, to the second, as the walk's `sacctmgr show event start=` will say it (a second back: Slurm keeps
    whole seconds)."""
    return datetime.fromtimestamp(int(time.time()) - 1, timezone.utc).astimezone().isoformat()


def _prepare(client: SlurmClient, sbatch, drain, busy: str, drained: str, cluster: str) -> Facts:
    """Two ended jobs (exit 0 and 3) in sacct, a job holding one GPU of `busy`, `drained` drained by another tool."""
    completed = sbatch("-w", busy, "-o", "/dev/null", "--wrap", "exit 0")
    failed = sbatch("-w", busy, "-o", "/dev/null", "--wrap", "exit 3")
    for job_id in (completed, failed):
        client.wait_accounted(job_id, timeout=60)
    running = sbatch("-w", busy, "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 600")
    wait_for(f"job {running} running", lambda: any(j.job_id == running and j.state == "RUNNING"
                                                   for j in client.jobs()), 60, interval=0.5)
    since = _since()
    time.sleep(1.5)
    drain(drained)
    wait_for(f"{drained} drained", lambda: client.node(drained).drained, 30, interval=0.5)
    return Facts(cluster=cluster, busy=busy, drained=drained, running=running, completed=completed, failed=failed,
                 since=since)


def _record(client: SlurmClient, recorder: Recorder, facts: Facts, recorded_on: str) -> Path:
    walk(client, facts)
    version = next(c["stdout"] for c in recorder.calls if c["argv"][:2] == ["sinfo", "--version"]).split()[-1]
    path = Recording(version, facts, recorded_on, recorder.calls).save()
    print(f"slurm {version}: {len(recorder.calls)} calls recorded in {path}")
    return path


def record_host() -> Path:
    from slurm_ext import devcluster as dev
    from helpers.cluster import TEST_CLUSTER, cluster_of_its_own

    settings = {**TEST_CLUSTER, **HOST_PORTS, "cluster_name": "slurmextrec", "node_name": "recnode1", "nodes": 2,
                "gpu_count": 2}
    with cluster_of_its_own("slurm-ext-record-", **settings) as own:
        plain = dev.client(own, timeout=30)
        env = plain.environ

        def sbatch(*args: str) -> int:
            out = command.run(["sbatch", "--parsable", "--chdir=/tmp", *args], 30, env=env).stdout
            return int(out.strip().split(";")[0])

        def drain(node: str) -> None:
            command.run(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={FOREIGN_DRAIN}"], 30,
                        env=env)
        facts = _prepare(plain, sbatch, drain, "recnode1", "recnode2", own.cluster_name)
        recorder = Recorder()
        client = SlurmClient(plain.settings, runner=recorder, environ=env)
        return _record(client, recorder, facts, f"the host's Debian 12 packages, a dev cluster (`slurm-ext dev up`: "
                                                f"munge, cgroup/v1, slurmdbd on MariaDB), {time.strftime('%Y-%m-%d')}")


def record_images(suite: str) -> Path:
    from cluster import USER, ContainerCluster, Ports  # containers/cluster.py
    from docker_engine import Engine  # tests/docker_engine.py

    host = os.environ.get("SLURM_EXT_TEST_DOCKER_HOST")
    engine = Engine.existing(host) if host else Engine().start()
    try:
        if not host:
            subprocess.run([sys.executable, str(HERE.parent / "containers" / "build.py"), "--suite", suite,
                            "--apt-release-max-age", "365"], env=engine.environ(), check=True)
        images = {name: f"slurm-ext-{name}:{suite}" for name in ("controller", "worker", "accounting", "mariadb",
                                                                  "login", "restapi")}
        ports = Ports(ctld=27827, dbd=27829, mariadb=23351, slurmd=27830, worker_agent=29960,
                      controller_agent=29955, accounting_agent=29956, mariadb_agent=29957, restapi=27828)
        # 26.05's PowerAction for the walk's reboot by one (older Slurm refuses the key: slurmctld would not start)
        power = f"PowerAction={POWER_ACTION} Location=slurmd Program=/bin/true\n" if suite == "sid" else ""
        cluster = ContainerCluster(engine.client, images, "cgroup-v1", ports=ports, prefix=f"rec-{suite}",
                                   workers=((1, 2), (2, 2)), slurm_conf=f"RebootProgram=/bin/true\n{power}")
        try:
            cluster.start()
            in_controller = exec_runner(engine, cluster.containers["controller"].name)
            plain = SlurmClient(SlurmSection(timeout=30), runner=in_controller)

            def sbatch(*args: str) -> int:
                return cluster.sbatch("--chdir=/tmp", *args)

            def drain(node: str) -> None:
                cluster.exec("controller", "scontrol", "update", f"nodename={node}", "state=drain",
                             f"reason={FOREIGN_DRAIN}")
            busy, drained = cluster.node_name(1), cluster.node_name(2)
            facts = _prepare(plain, sbatch, drain, busy, drained, "ctest")
            recorder = Recorder(in_controller)
            client = SlurmClient(SlurmSection(timeout=30), runner=recorder)
            return _record(client, recorder, facts,
                           f"slurm-ext's images on Debian {suite} (containers/cluster.py, cgroup-v1: auth/slurm, "
                           f"configless dynamic nodes, slurmdbd on MariaDB, jobs as {USER}), "
                           f"{time.strftime('%Y-%m-%d')}")
        finally:
            cluster.stop()
    finally:
        engine.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("where", choices=("host", "sid", "trixie", "resolute"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root: it starts Slurm's daemons")
    record_host() if args.where == "host" else record_images(args.where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
