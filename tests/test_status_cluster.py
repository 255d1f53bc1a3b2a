"""`slurm-ext status` says every warning the cluster page shows for the same cluster (issue 29, item 7): a node's
findings that drain nothing (warnings), node agents that do not answer, repairs paused. A 2-node dev cluster of its
own: real slurmctld and slurmd, their agents, fake NVML, the repair service in the controller agent."""

from __future__ import annotations

import json

import pytest

from slurm_ext import devcluster as dev, events
from slurm_ext.devcluster import daemons
from slurm_ext.devcluster.cluster import cluster_daemons

from helpers.cli import cli
from helpers.cluster import TEST_CLUSTER, RepairCluster, cluster_of_its_own
from helpers.wait import wait_for

CLUSTER = {**TEST_CLUSTER, "cluster_name": "slurmextstatus", "node_name": "snode1", "nodes": 2,
           "slurmctld_port": 18967, "slurmd_port": 18968, "slurmdbd_port": 18969, "mariadb_port": 13318,
           "controller_probe_port": 19881, "worker_probe_port": 19880, "accounting_probe_port": 19882,
           "web_port": 19883, "node_port_base": 25400, "kernel_log": "", "health_interval": 1.0,
           "repair_interval": 1.0}


@pytest.fixture(scope="module")
def two():
    with cluster_of_its_own("slurm-ext-status-", **CLUSTER) as settings:
        yield RepairCluster(settings)


def _status(cluster: RepairCluster) -> tuple[dict, str, str]:
    as_json = cluster.repair_cli("status", "--json")
    assert as_json.returncode == 0, as_json.stderr
    text = cluster.repair_cli("status")
    assert text.returncode == 0, text.stderr
    return json.loads(as_json.stdout), text.stdout, text.stderr


def _health_events(cluster: RepairCluster, node: str) -> list[str]:
    """What the node's monitor journaled (started, findings, a source that failed): said when the test fails."""
    journal = events.journal_path(str(cluster.layout.node(node).node_state))
    records = [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []
    return [f"{r['time']} {r['event']}: {r['message']}" for r in records if r.get("component") == "health"]


def test_status_shows_the_warnings_the_page_shows(two):
    cluster = two
    injected = cli("--config", str(cluster.layout.dev_conf), "dev", "inject", "snode2", "xid-13", "--gpu", "0",
                   timeout=60)
    assert injected.returncode == 0, injected.stderr
    try:
        # a warning finding drains nothing: the page lists it in the node's findings, and so does status
        last = {}

        def told():
            data, text, _ = last["status"] = _status(cluster)
            node = next(n for n in data["nodes"] if n["name"] == "snode2")
            return any(f.startswith("warning: xid 13 gpu 0") for f in node["findings"]) and (data, text)
        try:
            data, text = wait_for("status tells snode2's xid 13 warning", told, 60, interval=0.5)
        except AssertionError as err:
            raise AssertionError(f"{err}\ninject said: {injected.stdout}\nlast status: {last.get('status')}\n"
                                 f"snode2's health events: {_health_events(cluster, 'snode2')}") from None
        row = next(line for line in text.splitlines() if line.startswith("snode2"))
        assert "warning: xid 13 gpu 0" in row and "healthy" in row, row
        assert data["warnings"] == [], data["warnings"]

        # repairs paused: the page's repair tab says so; status too
        assert cluster.repair_cli("repair", "pause", user="bob").returncode == 0
        data, _, err = _status(cluster)
        assert any(w.startswith("repairs are paused by bob since ") for w in data["warnings"]), data["warnings"]
        assert "slurm-ext: warning: repairs are paused by bob" in err, err
        assert cluster.repair_cli("repair", "unpause").returncode == 0

        # a node agent that does not answer: the page's banner names it; status too, once the answer the
        # collector took of it is older than 3 of its intervals (status then asks the agent, or reads why the
        # collector cannot reach it)
        agent = next(d for d in cluster_daemons(cluster.layout) if d.name == cluster.layout.node("snode2").agent)
        daemons.stop(agent)

        def silent():
            data, _, err = _status(cluster)
            return any(w.startswith("no answer from 1 node agent: snode2 (") for w in data["warnings"]) and err
        err = wait_for("status names snode2's agent as not answering", silent, 30, interval=0.5)
        assert "slurm-ext: warning: no answer from 1 node agent: snode2 (" in err, err
    finally:
        cluster.repair_cli("repair", "unpause")
        dev.up(cluster.settings)
        cli("--config", str(cluster.layout.dev_conf), "dev", "heal", "snode2", timeout=60)
        cluster.repair_cli("health", "clear", node="snode2")
