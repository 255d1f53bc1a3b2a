"""Idle-node acceptance on a real 2-node dev cluster: the controller agent's `accept-idle` worker, started by a reload
of its config ([acceptance] enabled, idle_period = 20s), submits real lowest-priority exclusive jobs through sbatch,
each running its node's own `slurm-ext accept run --trigger idle --apply` over the fake NVML and libcuda.

- only the idle node gets a slurm-ext-accept-idle job (at the lowest priority Slurm gives), its run's trigger is idle;
- the node running someone's job gets none while that job runs, and is tested once it has ended;
- a reload with idle_period = 0 stops the worker.

Run with `flock /tmp/slurm-ext-cluster-tests.lock`."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

from slurm_ext.acceptance.idle import IDLE_JOB_NAME
from slurm_ext.devcluster import daemons
from slurm_ext.devcluster.cluster import cluster_daemons
from slurm_ext.journal import read_events

from helpers.cli import cli
from helpers.cluster import TEST_CLUSTER, RepairCluster, cluster_of_its_own
from helpers.wait import wait_for

IDLE_CLUSTER = {**TEST_CLUSTER, "cluster_name": "slurmextaccidle", "node_name": "inode1", "nodes": 2,
                "defined_nodes": 2, "slurmctld_port": 19317, "slurmd_port": 19318, "slurmdbd_port": 19319,
                "mariadb_port": 13345, "controller_probe_port": 19921, "worker_probe_port": 19920,
                "accounting_probe_port": 19922, "web_port": 0, "node_port_base": 31400, "gpu_count": 2,
                "health_interval": 1.0, "repair_interval": 1.0}
IDLE, BUSY = "inode1", "inode2"


def _small_gpus(cluster: RepairCluster) -> None:
    """Each node's acceptance: the gpu area only, its memory test over 32 MiB fake GPUs (no bandwidth test)."""
    for name in (IDLE, BUSY):
        node = cluster.layout.node(name)
        conf = node.slurm_ext_conf.read_text()
        assert "\n[acceptance]\n" in conf, conf
        conf = conf.replace("\n[acceptance]\n", '\n[acceptance]\nareas = ["gpu"]\nat_start = "off"\n', 1)
        node.slurm_ext_conf.write_text(conf + "\n[acceptance.tests.gpu-bandwidth]\nenabled = false\n")
        spec = json.loads(node.gpu_spec.read_text())
        for gpu in spec["gpus"]:
            gpu["cuda"] = {"memory_mib": 32}
        node.gpu_spec.write_text(json.dumps(spec, indent=1))


class _Cluster(RepairCluster):
    def idle_testing(self, period: str) -> None:
        """The controller's [acceptance] enabled with `period` (the controller's config is the first node's), then
        SIGHUP to the controller agent."""
        path = self.layout.slurm_ext_conf
        text = re.sub(r'\nenabled = true\nidle_period = "[^"]*"\n', "\n", path.read_text())
        path.write_text(text.replace("\n[acceptance]\n", f'\n[acceptance]\nenabled = true\nidle_period = "{period}"\n',
                                     1))
        agent = next(d for d in cluster_daemons(self.layout) if d.name == "supervise-controller")
        os.kill(daemons.running_pid(agent), signal.SIGHUP)

    def told(self, event: str) -> list:
        return [e for e in read_events(str(self.layout.node_state)) if e.event == event]

    def idle_jobs(self) -> dict[int, tuple[str, str]]:
        """job id -> (node, state) of the idle tests slurmctld holds (ended ones too, within MinJobAge)."""
        out = self.run("squeue", "--noheader", "--states=all", f"--name={IDLE_JOB_NAME}", "--format=%i|%n|%N|%T").stdout
        return {int(i): (asked or ran, state) for i, asked, ran, state in (line.split("|") for line in out.split())}

    def shown(self, node: str) -> tuple[int, dict | None]:
        done = cli("--config", str(self.layout.node(node).slurm_ext_conf), "accept", "show", "--trigger", "idle",
                   "--json")
        return done.returncode, json.loads(done.stdout) if done.stdout.strip() else None


@pytest.fixture(scope="module")
def cluster():
    with cluster_of_its_own("slurm-ext-accidle-", **IDLE_CLUSTER) as settings:
        made = _Cluster(settings)
        _small_gpus(made)
        yield made


def test_only_the_idle_node_is_tested_at_the_lowest_priority_and_the_busy_one_once_its_job_ends(cluster, tmp_path):
    release = tmp_path / "release"
    blocker = cluster.sbatch("-w", BUSY, "--wrap", f"while [ ! -e {release} ]; do sleep 0.2; done")
    wait_for(f"job {blocker} runs on {BUSY}", lambda: any(j.job_id == blocker and j.state == "RUNNING"
                                                           for j in cluster.client().jobs()), 30, interval=0.3)
    try:
        cluster.idle_testing("20s")
        first = wait_for(f"{IDLE}'s idle test submitted", lambda: cluster.told("acceptance-idle-submitted"), 60,
                         interval=0.5)[0]
        assert first.fields["node"] == IDLE, first
        job = first.fields["job_id"]
        shown = cluster.run("scontrol", "show", "job", str(job), "--oneliner").stdout
        # below someone's job (priority/basic here: the nice takes about 2^31 off; multifactor's would be 1), and all
        # of the node's GPUs, exclusively
        theirs = cluster.run("scontrol", "show", "job", str(blocker), "--oneliner").stdout
        ours = int(re.search(r"\bPriority=(\d+)", shown).group(1))
        assert 0 < ours < int(re.search(r"\bPriority=(\d+)", theirs).group(1)) - 2**30, (shown, theirs)
        assert re.search(r"\bNice=2147483645\b", shown), shown
        assert f"JobName={IDLE_JOB_NAME}" in shown and re.search(r"\bOverSubscribe=NO\b", shown), shown
        assert re.search(r"gres/gpu(:[a-z0-9]+)?=2", shown), shown
        code, run = wait_for(f"{IDLE}'s idle run kept", lambda: (lambda c, r: (c, r) if r else None)(
            *cluster.shown(IDLE)), 90, interval=1.0)
        assert code == 0 and (run["trigger"], run["level"], run["verdict"], run["node"]) == ("idle", "quick", "pass",
                                                                                         IDLE), run
        assert {r["test"] for r in run["results"]} >= {"gpu-inventory", "gpu-memory"}, run
        wait_for(f"job {job} ended", lambda: cluster.idle_jobs().get(job, ("", "COMPLETED"))[1] == "COMPLETED", 60,
                 interval=0.5)
        # the busy node: never a job while someone's runs there, through a whole period of passes (the idle node
        # tested again, 20 s after its first test ended)
        again = wait_for(f"{IDLE}'s second idle test", lambda: cluster.told("acceptance-idle-submitted")[1:], 90,
                         interval=0.5)
        assert [e.fields["node"] for e in cluster.told("acceptance-idle-submitted")] == [IDLE, IDLE], again
        assert all(node != BUSY for node, _ in cluster.idle_jobs().values()), cluster.idle_jobs()
        assert cluster.shown(BUSY) == (3, None)
    finally:
        release.touch()
    assert cluster.wait_accounted(blocker).state == "COMPLETED"  # never touched
    busy = wait_for(f"{BUSY}'s idle test submitted once its job ended", lambda: next(
        (e for e in cluster.told("acceptance-idle-submitted") if e.fields["node"] == BUSY), None), 60, interval=0.5)
    code, run = wait_for(f"{BUSY}'s idle run kept", lambda: (lambda c, r: (c, r) if r else None)(
        *cluster.shown(BUSY)), 90, interval=1.0)
    assert code == 0 and (run["trigger"], run["verdict"]) == ("idle", "pass"), run
    assert cluster.idle_jobs()[busy.fields["job_id"]][0] == BUSY
    assert not cluster.told("acceptance-idle-refused")


def test_a_reload_with_no_period_stops_the_worker(cluster):
    cluster.idle_testing("0s")
    worker = wait_for("the accept-idle worker stopped", lambda: (lambda found: None if found else True)([
        p for p in _processes() if p.endswith("accept idle")]), 30, interval=0.5)
    assert worker


def _processes() -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                found.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode().strip())
            except OSError:
                continue
    return found
