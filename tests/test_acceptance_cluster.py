"""`slurm-ext accept cluster` on a real 4-node dev cluster: slurmctld, four slurmd each with its own worker agent,
config and fake GPUs (fake NVML and fake libcuda), a real MAINT reservation and one real exclusive job per node,
each running that node's own `slurm-ext accept run --apply` (the dev cluster's [acceptance] job_command hands the
job to its node by SLURMD_NODENAME).

[acceptance] stays off (the nodes start at once); the nodes test the gpu area only, quick level, on 32 MiB fake
GPUs; one node's GPU 1 has a stuck bit (the fake libcuda's "cuda": {"stuck_bits": [...]}), which its memory test
finds and its agent drains for."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from slurm_ext import events
from slurm_ext.acceptance.cluster import JOB_NAME

from helpers.cli import cli, cli_as_nobody
from helpers.cluster import TEST_CLUSTER, RepairCluster, cluster_of_its_own
from helpers.wait import wait_for

ACCEPT_CLUSTER = {**TEST_CLUSTER, "cluster_name": "slurmextaccept", "node_name": "cnode1", "nodes": 4,
                  "defined_nodes": 4, "slurmctld_port": 18977, "slurmd_port": 18978, "slurmdbd_port": 18979,
                  "mariadb_port": 13333, "controller_probe_port": 19891, "worker_probe_port": 19890,
                  "accounting_probe_port": 19892, "web_port": 0, "node_port_base": 26000, "gpu_count": 2,
                  "health_interval": 1.0, "repair_interval": 1.0}
NODES = ["cnode1", "cnode2", "cnode3", "cnode4"]
#: the node whose GPU 1 has a stuck bit
BAD = "cnode3"


def _small_gpus(cluster: RepairCluster) -> None:
    """Every node tests the gpu area only (the memory test over 32 MiB fake GPUs, inventory, NVLink); the bad node's
    GPU 1 has bit 3 of byte 4096 stuck at 1."""
    for name in NODES:
        node = cluster.layout.node(name)
        conf = node.slurm_ext_conf.read_text()
        assert "\njob_command = " in conf, conf  # [acceptance]'s, as `dev up` renders it
        conf = re.sub(r"(\njob_command = [^\n]*\n)", r'\1areas = ["gpu"]\n', conf)
        conf += "\n[acceptance.tests.gpu-bandwidth]\nenabled = false\n"
        node.slurm_ext_conf.write_text(conf)
        spec = json.loads(node.gpu_spec.read_text())
        for index, gpu in enumerate(spec["gpus"]):
            gpu["cuda"] = {"memory_mib": 32}
            if name == BAD and index == 1:
                gpu["cuda"]["stuck_bits"] = [{"offset": 4096, "bit": 3, "value": 1}]
        node.gpu_spec.write_text(json.dumps(spec, indent=1))


@pytest.fixture(scope="module")
def four():
    with cluster_of_its_own("slurm-ext-accept-", **ACCEPT_CLUSTER) as settings:
        cluster = RepairCluster(settings)
        _small_gpus(cluster)
        yield cluster


def _accept_cluster(cluster: RepairCluster, *args: str) -> subprocess.Popen:
    """`slurm-ext accept cluster --json ...` on the controller (the first node's config), in the background."""
    return subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "--config", str(cluster.layout.slurm_ext_conf),
                             "accept", "cluster", "--json", "--output-dir", str(cluster.layout.out), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env)


def _finished(proc: subprocess.Popen, timeout: float = 150) -> tuple[int, dict, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: it cancels its jobs and removes its reservation
        out, err = proc.communicate(timeout=90)
        raise AssertionError(f"accept cluster still ran after {timeout}s: {out} {err}") from None
    assert out.strip(), err
    return proc.returncode, json.loads(out), err


def _reservations(cluster: RepairCluster) -> str:
    return cluster.run("scontrol", "show", "reservation", "--oneliner").stdout.strip()


def _our_jobs(cluster: RepairCluster) -> dict[str, str]:
    """node -> state of accept cluster's jobs slurmctld holds now."""
    out = cluster.run("squeue", "--noheader", f"--name={JOB_NAME}", "--format=%T|%n").stdout  # %n: the node asked
    return {node: state for state, node in (line.split("|") for line in out.splitlines())}


def _blocker(cluster: RepairCluster, node: str, release) -> int:
    """A job of someone else's running on `node` until `release` exists."""
    job = cluster.sbatch("-w", node, "--wrap", f"while [ ! -e {release} ]; do sleep 0.2; done")
    wait_for(f"job {job} runs on {node}", lambda: any(j.job_id == job and j.state == "RUNNING"
                                                        for j in cluster.client().jobs()), 30, interval=0.3)
    return job


def _by_node(answer: dict) -> dict[str, dict]:
    return {n["node"]: n for n in answer["nodes"]}


def test_a_bad_node_list_or_no_permission_is_refused_and_leaves_nothing(four):
    done = cli("--config", str(four.layout.slurm_ext_conf), "accept", "cluster", "--nodes", "cnode[1-2],nosuch7",
               env=four.env)
    assert done.returncode == 2, done.stderr
    assert "slurmctld knows no node nosuch7" in done.stderr
    # not a Slurm operator: slurmctld refuses the reservation, and says so with what it takes
    code, err = cli_as_nobody("--config", str(four.layout.slurm_ext_conf), "accept", "cluster", "--nodes", "cnode4",
                              env=four.env)
    assert code == 2, err
    assert "cannot make the maintenance reservation slurm-ext-accept-" in err and "operator or admin" in err, err
    assert "No reservations in the system" in _reservations(four)
    assert not _our_jobs(four)


def test_every_node_is_tested_in_a_reservation_that_waits_for_a_running_job_and_is_gone_at_the_end(four, tmp_path):
    release = tmp_path / "release"
    blocker = _blocker(four, "cnode2", release)
    proc = _accept_cluster(four, "--nodes", "cnode[1-4]", "--level", "quick", "--wait-jobs", "2m")
    try:
        reservation = wait_for("the MAINT reservation", lambda: re.search(
            r"ReservationName=(slurm-ext-accept-\S+) .*", _reservations(four)), 60, interval=0.3)
        assert re.search(r"Nodes=cnode\[1-4\]", reservation.group(0)), reservation.group(0)
        assert "MAINT" in reservation.group(0) and "IGNORE_JOBS" in reservation.group(0)
        # cnode2's test waits in the reservation for the job running there, which is left alone
        wait_for("cnode2's test job waiting", lambda: _our_jobs(four).get("cnode2") == "PENDING", 60, interval=0.3)
        assert any(j.job_id == blocker and j.state == "RUNNING" for j in four.client().jobs())
    except BaseException:
        proc.terminate()
        proc.communicate(timeout=90)
        raise
    finally:
        release.touch()
    code, answer, err = _finished(proc)
    nodes = _by_node(answer)
    assert code == 1, (answer, err)
    assert answer["verdict"] == "fail" and answer["reservation_end"] == "removed", answer
    assert answer["counts"] == {"pass": 3, "fail": 1, "error": 0, "not-tested": 0}, [(n["node"], n["why"], n["run"])
                                                                                      for n in answer["nodes"]]
    assert all(nodes[n]["outcome"] == "pass" and nodes[n]["job_id"] for n in NODES if n != BAD), nodes
    bad = nodes[BAD]
    assert bad["outcome"] == "fail" and "drained: slurm-ext: acceptance quick failed: gpu-memory gpu 1" in bad["why"]
    assert four.wait_accounted(blocker).state == "COMPLETED"  # never killed

    # the bad node drained by its own agent, with our reason naming the test and the GPU; the others not
    slurm_nodes = {n.name: n for n in four.client().nodes()}
    assert slurm_nodes[BAD].drained and slurm_nodes[BAD].reason.startswith("slurm-ext: acceptance quick failed: "
                                                                           "gpu-memory gpu 1"), slurm_nodes[BAD]
    assert all(not slurm_nodes[n].drained for n in NODES if n != BAD), slurm_nodes
    assert "No reservations in the system" in _reservations(four)
    # and the repair service recommends from that reason: a GPU reset of that GPU
    record = four.record(BAD, "recommended")
    assert (record["signature"], record["action"]) == ("acceptance/gpu-memory", "reset-gpu"), record
    assert not [r for r in four.records() if r["node"] != BAD], four.records()
    # each node's run is its own (trigger cluster), kept under its state directory; the controller's journal tells
    for name in NODES:
        kept = json.loads((four.layout.node(name).node_state / "acceptance" / "cluster.json").read_text())
        assert kept["node"] == name and kept["verdict"] == ("fail" if name == BAD else "pass"), kept
    journal = [json.loads(line) for line in events.journal_path(str(four.layout.node_state)).read_text().splitlines()]
    told = [e for e in journal if e["event"].startswith("acceptance-cluster-")]
    assert [e["event"] for e in told[-2:]] == ["acceptance-cluster-started", "acceptance-cluster-done"], told
    assert told[-1]["verdict"] == "fail" and told[-1]["failed"].keys() == {BAD}, told[-1]


def test_a_busy_node_past_wait_jobs_and_a_drained_node_are_not_tested(four, tmp_path):
    release = tmp_path / "release"
    blocker = _blocker(four, "cnode2", release)
    four.run("scontrol", "update", "nodename=cnode1", "state=drain", "reason=admin: new cables")
    try:
        proc = _accept_cluster(four, "--nodes", "cnode1,cnode2,cnode4", "--wait-jobs", "3s")
        code, answer, err = _finished(proc)
        nodes = _by_node(answer)
        assert code == 3, (answer, err)
        assert nodes["cnode1"]["outcome"] == "not-tested" and nodes["cnode1"]["why"] == "drained (admin: new cables)"
        assert nodes["cnode2"]["outcome"] == "not-tested" and nodes["cnode2"]["why"].startswith(
            "busy: its job waited 3s (--wait-jobs)"), nodes["cnode2"]
        assert nodes["cnode4"]["outcome"] == "pass", nodes["cnode4"]
        assert answer["reservation_end"] == "removed"
        assert "No reservations in the system" in _reservations(four)
        assert not _our_jobs(four)
        assert any(j.job_id == blocker and j.state == "RUNNING" for j in four.client().jobs())  # never killed
    finally:
        release.touch()
        four.run("scontrol", "update", "nodename=cnode1", "state=resume", check=False)


def test_sigterm_cancels_the_runs_jobs_and_removes_the_reservation(four, tmp_path):
    release = tmp_path / "release"
    blocker = _blocker(four, "cnode4", release)
    proc = _accept_cluster(four, "--nodes", "cnode4", "--wait-jobs", "10m")
    try:
        wait_for("cnode4's test job waiting", lambda: _our_jobs(four).get("cnode4") == "PENDING", 60, interval=0.3)
        assert "slurm-ext-accept-" in _reservations(four)
        proc.terminate()
        code, answer, err = _finished(proc, timeout=90)
        assert code == 3, (answer, err)
        assert answer["interrupted"] and answer["reservation_end"] == "removed", answer
        node = _by_node(answer)["cnode4"]
        assert node["outcome"] == "not-tested" and "stopped" in node["why"] and node["job_id"], node
        assert "No reservations in the system" in _reservations(four)
        assert not _our_jobs(four)
        assert any(j.job_id == blocker and j.state == "RUNNING" for j in four.client().jobs())  # never killed
    finally:
        release.touch()
        if proc.poll() is None:
            proc.kill()


def test_the_jobs_script_quotes_each_word_of_the_command(tmp_path):
    """job_command is a list, never a shell string: each word reaches the program as it is in the config."""
    from slurm_ext.acceptance.cluster import job_script
    script = tmp_path / "job"
    script.write_text(job_script(("printf", "%s|", "a b", "it's", "$HOME;x"), "quick"))
    done = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=True)
    assert done.stdout == "a b|it's|$HOME;x|--level|quick|--json|--trigger|cluster|--apply|"
