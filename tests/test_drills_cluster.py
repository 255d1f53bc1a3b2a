"""Drills on a real dev cluster: `slurm-ext dev inject NODE FAULT [--gpu N]` and `slurm-ext dev heal NODE`.

One cluster of two nodes for the module, its real agents, health monitors, repair service and Slurm. Each fault
kind is injected through the real command and must lead to the finding, drain and recommendation the health
catalogue says (settings.CHECKS, NVIDIA's Xid catalog, repair's mapping of actions), and `dev heal` must clear
it; Xid 79 goes the whole way, as the README's first fault does: inject, drain, recommendation, `repair approve`,
the node IDLE again, the drill and the repair in `history`. The monitors run with short windows (appended to each
node's config, taken by a restart of its agent) so that a finding opens and clears in seconds.
"""

from __future__ import annotations

import json
import os

import pytest

from slurm_ext import config, events
from slurm_ext.devcluster import cluster as devcluster, nodenet
from slurm_ext.devcluster.drills import FILL
from slurm_ext.health import xids
from slurm_ext.health.settings import CHECKS
from slurm_ext.repair.recommend import Fault, action_for

from helpers.cli import cli
from helpers.cluster import TEST_CLUSTER, RepairCluster, cluster_of_its_own
from helpers.wait import wait_for

pytestmark = pytest.mark.cluster

DRILL_CLUSTER = {**TEST_CLUSTER, "cluster_name": "slurmextdrill", "node_name": "dnode1", "nodes": 2,
                 "defined_nodes": 2, "slurmctld_port": 17817, "slurmd_port": 17818, "slurmdbd_port": 17819,
                 "mariadb_port": 13311, "controller_probe_port": 19841, "worker_probe_port": 19840,
                 "accounting_probe_port": 19842, "web_port": 19843, "node_port_base": 28000, "kernel_log": "",
                 "health_interval": 1.0, "repair_interval": 1.0, "resume_timeout": 30, "slurmd_timeout": 30}
NODES = ["dnode1", "dnode2"]

#: short windows: a finding opens and clears in seconds (the defaults are minutes)
_FAST = """
[health.checks.gpu-lost]
quiet = "3s"
[health.checks.ecc]
quiet = "3s"
[health.checks.row-remap]
quiet = "3s"
[health.checks.throttle]
window = "4s"
quiet = "3s"
[health.checks.nvlink]
hold = "0s"
quiet = "3s"
[health.checks.link-down]
hold = "1s"
quiet = "3s"
[health.checks.filesystem]
interval = "1s"
quiet = "3s"
[health.checks.slurmd]
interval = "1s"
hold = "0s"
quiet = "3s"
[health.checks.xid]
quiet = "3s"
"""


class Drills(RepairCluster):
    def dev(self, *args: str):
        return cli("--config", str(self.layout.dev_conf), "dev", *args, timeout=60)

    def journal(self, node: str) -> list[dict]:
        path = events.journal_path(str(self.layout.node(node).node_state))
        text = path.read_text() if path.exists() else ""
        return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines() if line.strip()]

    def wait_event(self, node: str, mark: int, name: str, timeout: float = 30.0, **fields) -> dict:
        def found():
            return next((e for e in self.journal(node)[mark:] if e["event"] == name
                         and all(e.get(k) == v for k, v in fields.items())), None)
        return wait_for(f"{node}: event {name} {fields}", found, timeout, interval=0.2)

    def reason(self, node: str) -> str:
        state = self.slurm_node(node)
        return state.reason if state.drained else ""


@pytest.fixture(scope="module")
def two():
    with cluster_of_its_own("slurm-ext-drills-", **DRILL_CLUSTER) as settings:
        drills = Drills(settings)
        for node in NODES:  # the short windows, taken by each node's agent at its (re)start
            conf = drills.layout.node(node).slurm_ext_conf
            conf.write_text(conf.read_text() + _FAST)
            devcluster.reboot_node(settings, node)
        wait_for("both nodes idle", lambda: all(drills.slurm_node(n).idle for n in NODES), 60, interval=0.5)
        yield drills


@pytest.fixture
def drills(two):
    yield two
    for node in NODES:
        two.dev("heal", node)
    two.settle(NODES)


def _expected(kind: str) -> dict[str, tuple[str, str]]:
    """check -> (severity, action), as the catalogue says today."""
    if kind.startswith("xid-"):
        entry = xids.entry(int(kind[4:]))
        return {"xid": (entry.severity, entry.action)}
    checks = {"gpu-lost": ["gpu-lost"], "ecc": ["ecc", "row-remap"], "throttle": ["throttle"],
              "nvlink-down": ["nvlink"], "link-down": ["link-down"], "fs-full": ["filesystem"],
              "slurmd-hang": ["slurmd"]}[kind]
    found = {check: (CHECKS[check].severity, CHECKS[check].action) for check in checks}
    if kind == "ecc":
        found["row-remap"] = (CHECKS["row-remap"].severity, "reset-gpu")  # pending: a reset applies it
    return found


def _signature(kind: str, check: str) -> str:
    return f"xid/{kind[4:]}" if check == "xid" else check


@pytest.mark.parametrize("kind, node, gpu", [
    ("gpu-lost", "dnode1", 1), ("ecc", "dnode2", 2), ("throttle", "dnode1", 3), ("nvlink-down", "dnode2", 0),
    ("link-down", "dnode1", None), ("fs-full", "dnode2", None), ("slurmd-hang", "dnode2", None),
    ("xid-48", "dnode1", 2), ("xid-95", "dnode2", 1), ("xid-94", "dnode1", 0),
])
def test_each_fault_is_found_drained_and_recommended_as_the_catalogue_says_and_heal_clears_it(drills, kind, node,
                                                                                                gpu):
    mark = len(drills.journal(node))
    done = drills.dev("inject", node, kind, *(["--gpu", str(gpu)] if gpu is not None else []))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"DRILL {kind} on {node}"), done.stdout
    injected = drills.wait_event(node, mark, "drill-injected", fault=kind)
    assert injected["drill"] is True and injected["component"] == "devcluster" and injected["gpu"] == gpu
    assert json.loads(drills.layout.drills.read_text())[node][0]["kind"] in (kind, "xid")
    if kind.startswith("xid-"):  # delivered once: a monitor started later (after a reboot) never gets it again
        assert "taken by the node's monitor and removed" in done.stdout, done.stdout
        assert json.loads(drills.layout.node(node).gpu_spec.read_text()).get("events") == []

    expected = _expected(kind)
    timeout = 60 if kind == "slurmd-hang" else 30  # slurmctld pings a quiet slurmd after 10 s, waits 10 s more
    for check, (severity, action) in expected.items():
        finding = drills.wait_event(node, mark, "health-finding", timeout, check=check)
        assert (finding["finding_severity"], finding["action"]) == (severity, action), finding
        if gpu is not None:
            assert finding["gpu"] == gpu, finding
        assert f"{check}: a {severity} finding, action {action}" in done.stdout, done.stdout
    critical = {check: action for check, (severity, action) in expected.items() if severity == "critical"}
    if critical:
        reason = wait_for(f"{node} drained by a {kind} finding", lambda: (lambda r: r if r.startswith(
            "slurm-ext: ") and r.split()[1] in critical else None)(drills.reason(node)), 30, interval=0.2)
        check = reason.split()[1]
        repair = action_for(Fault(node, _signature(kind, check), critical[check], ""),
                            config.load(drills.layout.slurm_ext_conf).repair)
        if repair:
            record = drills.record(node, "recommended")
            assert (record["signature"], record["action"]) == (_signature(kind, check), repair), record
        else:
            listed = drills.repair_cli("repair", "list", "--json")
            assert not [r for r in json.loads(listed.stdout)["records"] if r["node"] == node], listed.stdout
    else:
        assert not drills.reason(node).startswith("slurm-ext:")  # a warning: reported, never drained

    heal_mark = len(drills.journal(node))
    healed = drills.dev("heal", node)
    assert healed.returncode == 0 and f"undone on {node}:" in healed.stdout, healed
    assert drills.wait_event(node, heal_mark, "drill-healed")["faults"] == [kind]
    assert node not in json.loads(drills.layout.drills.read_text())
    if kind.startswith("xid-"):  # an event: a critical Xid's finding stays until a reboot or an operator's clear
        assert "nothing to undo" in healed.stdout
        drills.repair_cli("health", "clear", "--check", "xid", node=node)
    for check in expected:
        drills.wait_event(node, heal_mark, "health-cleared", 60, check=check)
    wait_for(f"{node} idle, its drain lifted by its monitor", lambda: drills.slurm_node(node).idle, 60, interval=0.3)


def test_xid_79_end_to_end_inject_drain_recommend_approve_idle_history_heal(drills):
    """The README's first fault, drilled: what the walkthrough says an operator does, in its order."""
    node, mark = "dnode2", len(drills.journal("dnode2"))
    done = drills.dev("inject", node, "xid-79", "--gpu", "1")
    assert done.returncode == 0, done.stderr
    assert "xid: a critical finding, action reboot, at once; the node drained 'slurm-ext: xid ...', then reboot " \
           "recommended" in done.stdout, done.stdout
    finding = drills.wait_event(node, mark, "health-finding", check="xid", xid=79)
    assert finding["source"] == "nvml" and finding["gpu"] == 1  # NVML's event set, not a kernel line
    reason = wait_for("the xid drain", lambda: (lambda r: r if r.startswith("slurm-ext: xid 79 gpu 1") else None)(
        drills.reason(node)), 30, interval=0.2)
    assert "action=reboot" in reason
    record = drills.record(node, "recommended")
    assert (record["signature"], record["action"]) == ("xid/79", "reboot")
    assert drills.repair_cli("repair", "approve", node).returncode == 0
    wait_for("the repair done", lambda: next((r for r in drills.all_records(node)
                                              if r["id"] == record["id"] and r["state"] in ("done", "failed")), None),
             120, interval=1.0)
    repaired = next(r for r in drills.all_records(node) if r["id"] == record["id"])
    assert repaired["state"] == "done", repaired
    wait_for(f"{node} IDLE", lambda: drills.slurm_node(node).idle, 30, interval=0.3)
    history = wait_for("the drill and the repair in history", lambda: (lambda h: h if any(
        e["event"] == "devcluster/drill-injected" for e in h) and any(
        e["event"] == "repair-done" for e in h) else None)(drills.history(node)), 60, interval=1.0)
    drill, done_at = [next(e for e in history if e["event"] == "devcluster/drill-injected"
                           and e["message"].startswith("DRILL (not a real fault): xid-79 on dnode2 gpu 1")),
                      next(e for e in history if e["event"] == "repair-done")]
    assert history.index(drill) < history.index(done_at), history  # the timeline's order: the drill, then the repair
    healed = drills.dev("heal", node)
    assert healed.returncode == 0 and "xid-79: an event, nothing to undo" in healed.stdout, healed.stdout


def test_link_down_and_fs_full_touch_only_the_clusters_own_namespace_and_tmpfs(drills):
    node = drills.layout.node("dnode1")
    assert drills.dev("inject", "dnode1", "link-down").returncode == 0
    assert drills.dev("inject", "dnode1", "fs-full").returncode == 0
    assert not nodenet.lo_up(node.netns)
    with open("/sys/class/net/lo/flags") as flags:
        assert int(flags.read(), 16) & 1  # the host's lo untouched
    assert os.path.ismount(node.drill_fs) and os.statvfs(node.drill_fs).f_bavail == 0
    healed = drills.dev("heal", "dnode1")
    assert "link-down: lo of network namespace" in healed.stdout and "fs-full:" in healed.stdout, healed.stdout
    assert nodenet.lo_up(node.netns) and not os.path.ismount(node.drill_fs)
    assert not (node.drill_fs / FILL).exists()
