"""Repairs on real Slurm as they run normally: a reboot and a GPU reset journal none of the node-state owner's
warnings meant for someone else's drain (issue 29, item 7), and a job record that outlived its job does not hold a
GPU reset (the review of 29.3). A 2-node dev cluster of its own: real slurmctld and slurmd, their agents, fake NVML,
the repair service in the controller agent. An admin's drain still gives the warnings: test_nodestate_cluster's
two-owners test."""

from __future__ import annotations

import json
import time

import pytest

from slurm_ext import events
from slurm_ext.devcluster import fakenvml
from slurm_ext.prolog_epilog.jobrecord import JobRecord, remove, write

from helpers.cluster import TEST_CLUSTER, RepairCluster, cluster_of_its_own
from helpers.wait import wait_for

CLUSTER = {**TEST_CLUSTER, "cluster_name": "slurmextrreset", "node_name": "xnode1", "nodes": 2,
           "slurmctld_port": 18957, "slurmd_port": 18958, "slurmdbd_port": 18959, "mariadb_port": 13317,
           "controller_probe_port": 19871, "worker_probe_port": 19870, "accounting_probe_port": 19872,
           "web_port": 19873, "node_port_base": 25300, "kernel_log": "", "health_interval": 1.0,
           "repair_interval": 1.0, "resume_timeout": 30}
NODES = ["xnode1", "xnode2"]
#: what the node-state owner says only when someone else's reason is in the way
FOREIGN = ("drain-overridden", "resume-skipped", "drain-skipped")


@pytest.fixture(scope="module")
def two():
    with cluster_of_its_own("slurm-ext-rreset-", **CLUSTER) as settings:
        yield RepairCluster(settings)


@pytest.fixture
def cluster(two):
    yield two
    two.settle(NODES)


def _journal_size(cluster: RepairCluster, node: str) -> int:
    path = events.journal_path(str(cluster.layout.node(node).node_state))
    return path.stat().st_size if path.exists() else 0


def _nodestate_events(cluster: RepairCluster, node: str, start: int) -> list[dict]:
    with open(events.journal_path(str(cluster.layout.node(node).node_state)), "rb") as journal:
        journal.seek(start)
        rows = [json.loads(line) for line in journal.read().decode().splitlines() if line.strip()]
    return [r for r in rows if r.get("component") == "nodestate"]


def _done(cluster: RepairCluster, node: str, record: dict, timeout: float) -> dict:
    return wait_for(f"repair {record['id']} of {node} ended", lambda: next(
        (r for r in cluster.all_records(node) if r["id"] == record["id"] and r["state"] in ("done", "failed")), None),
        timeout, interval=0.5)


def test_a_reset_held_only_by_a_stale_job_record_runs_and_journals_no_warning(cluster):
    """A job record of a job that ended long ago (its Epilog never ran) on the GPU to reset: the repair resets the
    GPU at once instead of waiting for that job until repair.drain_deadline (2 h), and neither the drain of the
    finding replaced by the repair's nor the finding cleared under it is journaled as someone else's drain."""
    node = cluster.layout.node("xnode2")
    write(JobRecord(987654, 0, 0, "root", "xnode2", (2,), time.time() - 3600, ()), str(node.node_state))
    start = _journal_size(cluster, "xnode2")
    spec = json.loads(node.gpu_spec.read_text())
    spec["gpus"][2]["remapped_rows"] = {"corrected": 0, "uncorrected": 1, "pending": 1, "failure": 0}
    fakenvml.write_spec(node.gpu_spec, spec)
    wait_for("xnode2 drained for gpu 2", lambda: cluster.slurm_node("xnode2").reason.startswith(
        "slurm-ext: row-remap"), 30, interval=0.3)
    record = cluster.record("xnode2", "recommended")
    assert record["action"] == "reset-gpu", record
    assert cluster.repair_cli("repair", "approve", "xnode2").returncode == 0
    done = _done(cluster, "xnode2", record, 90)
    assert done["state"] == "done", done
    wait_for("xnode2 resumed", lambda: not cluster.slurm_node("xnode2").drained, 30, interval=0.3)
    said = [e["message"] for e in cluster.history("xnode2") if e["source"] == "repair"]
    assert not any("waiting for jobs [987654]" in m for m in said), said
    seen = _nodestate_events(cluster, "xnode2", start)
    assert any(e["event"] == "drain" for e in seen), seen  # the monitor's drain is there: the journal was read
    assert not [e for e in seen if e["event"] in FOREIGN], seen
    remove(987654, str(node.node_state))


def test_a_reboot_repair_journals_no_warning_of_someone_elses_drain(cluster):
    start = _journal_size(cluster, "xnode1")
    cluster.inject_xid("xnode1")
    record = cluster.record("xnode1", "recommended")
    assert record["action"] == "reboot", record
    assert cluster.repair_cli("repair", "approve", "xnode1").returncode == 0
    done = _done(cluster, "xnode1", record, 120)
    assert done["state"] == "done", done
    wait_for("xnode1 resumed", lambda: not cluster.slurm_node("xnode1").drained, 30, interval=0.3)
    seen = _nodestate_events(cluster, "xnode1", start)
    assert any(e["event"] == "drain" for e in seen), seen  # the monitor's drain is there: the journal was read
    assert not [e for e in seen if e["event"] in FOREIGN], seen
