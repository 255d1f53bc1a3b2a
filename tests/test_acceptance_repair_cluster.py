"""A repair's acceptance before its resume, on a 2-node dev cluster: real slurmctld, slurmd and agents, the repair
service in the controller agent, Slurm's reboot through the cluster's RebootProgram, and the acceptance runner's
tests in child processes of the node's agent.

The node's acceptance input is its [acceptance.interfaces.<name>]: an interface it does not have fails its
network-links test (acceptance.network), `lo` passes it; or its fake GPUs' memory. With [acceptance] enabled (on the controller, as the
cluster's config, and on the node):

- an approved reboot whose node fails its quick acceptance after the reboot (the at-start run of the new boot) is not
  resumed: the repair fails naming the test, the target and what was found, the node stays drained, and once an
  operator resumes it the node's own acceptance drain names why, and a repair is recommended for it; so too with
  the gpu area, for a GPU whose memory has a stuck bit (`dev inject stuck-bit`, the fake libcuda);
- a node that runs no acceptance at its start is asked for a run by the repair (POST /acceptance/run), passes it and
  is resumed.

Run with `flock /tmp/slurm-ext-cluster-tests.lock`."""

from __future__ import annotations

import os
import signal

import pytest

from slurm_ext.devcluster import daemons
from slurm_ext.devcluster.cluster import cluster_daemons
from slurm_ext.journal import read_events

from helpers.cli import cli
from helpers.cluster import TEST_CLUSTER, RepairCluster, cluster_of_its_own
from helpers.wait import wait_for

ACCEPT_REPAIR_CLUSTER = {**TEST_CLUSTER, "cluster_name": "slurmextaccrep", "node_name": "qnode1", "nodes": 2,
                         "defined_nodes": 2, "slurmctld_port": 19117, "slurmd_port": 19118, "slurmdbd_port": 19119,
                         "mariadb_port": 13341, "controller_probe_port": 19901, "worker_probe_port": 19900,
                         "accounting_probe_port": 19902, "web_port": 0, "node_port_base": 31000, "gpu_count": 2,
                         "kernel_log": "", "health_interval": 1.0, "repair_interval": 1.0, "resume_timeout": 30}
NODES = ["qnode1", "qnode2"]
#: the node repaired
NODE = "qnode2"


def _with_acceptance(rendered: str, at_start: str, interfaces: tuple[str, ...], area: str) -> str:
    """A node's config as `dev up` rendered it, with [acceptance] on for one area, run at start at `at_start`: the
    network area's quick level is network-links over `interfaces`; the gpu area's runs the fake libcuda's memory test
    (gpu-bandwidth left out: the fake's modelled copies are another test's business)."""
    keys = f'enabled = true\nareas = ["{area}"]\nat_start = "{at_start}"\n'
    text = (rendered.replace("\n[acceptance]\n", f"\n[acceptance]\n{keys}", 1) if "\n[acceptance]\n" in rendered
            else f"{rendered}\n[acceptance]\n{keys}")
    text += "".join(f"\n[acceptance.interfaces.{name}]\n" for name in interfaces)
    return text + ("\n[acceptance.tests.gpu-bandwidth]\nenabled = false\n" if area == "gpu" else "")


class _Cluster(RepairCluster):
    def accept(self, node: str, at_start: str = "quick", interfaces: tuple[str, ...] = ("lo",),
               area: str = "network") -> None:
        """The node's [acceptance] (read by its agent at its next start, by the repair flow's asks at once)."""
        path = self.layout.node(node).slurm_ext_conf
        self.rendered = getattr(self, "rendered", {})
        self.rendered.setdefault(node, path.read_text())
        path.write_text(_with_acceptance(self.rendered[node], at_start, interfaces, area))

    def reload_controller(self) -> None:
        """SIGHUP to the controller agent, which hands it to the repair service; waits for the service's reload."""
        agent = next(d for d in cluster_daemons(self.layout) if d.name == "supervise-controller")
        state_dir = str(self.layout.first.node_state)
        before = len(self.repair_reloads(state_dir))
        os.kill(daemons.running_pid(agent), signal.SIGHUP)
        wait_for("the repair service reloaded", lambda: len(self.repair_reloads(state_dir)) > before, 30,
                 interval=0.3)

    @staticmethod
    def repair_reloads(state_dir: str) -> list:
        return [e for e in read_events(state_dir) if e.component == "repair" and e.event in ("reload", "reload-failed")]

    def approved_repair(self, node: str) -> dict:
        """An Xid on the node's GPU 1, its reboot recommended and approved; the record."""
        self.inject_xid(node)
        record = self.record(node, "recommended")
        assert (record["action"], record["signature"]) == ("reboot", "xid/79"), record
        approved = self.repair_cli("repair", "approve", node, user="alice")
        assert approved.returncode == 0, approved.stderr
        return record

    def ended(self, node: str, record: dict) -> dict:
        return wait_for(f"{node}: the repair ended", lambda: next(
            (r for r in self.all_records(node) if r["id"] == record["id"] and r["state"] in ("done", "failed")), None),
            180, interval=1.0)

    def drill_heal(self, node: str) -> str:
        """`dev heal NODE`: every drill undone (the GPU's spec healthy again)."""
        healed = cli("--config", str(self.layout.dev_conf), "dev", "heal", node, timeout=60)
        assert healed.returncode == 0, healed.stderr
        self.drilled = getattr(self, "drilled", set()) - {node}
        return healed.stdout

    def steps(self, record: dict) -> list[str]:
        with self.store() as store:
            return [f"{e.event}: {e.message}" for e in store.events(record=record["id"])]


@pytest.fixture(scope="module")
def cluster():
    with cluster_of_its_own("slurm-ext-accrep-", **ACCEPT_REPAIR_CLUSTER) as settings:
        made = _Cluster(settings)
        made.accept("qnode1")  # the controller's config: [acceptance] on for the cluster
        made.reload_controller()
        yield made


@pytest.fixture
def repair(cluster):
    """The cluster settled after each test, as an operator would: the node's drill healed, its config fixed, a
    repair's drain lifted by hand and an acceptance drain by a run that passes (one failure does not fail the rest)."""
    yield cluster
    if NODE in getattr(cluster, "drilled", set()):
        cluster.drill_heal(NODE)
    cluster.accept(NODE, at_start="off")
    cluster.run("scontrol", "update", f"nodename={NODE}", "state=resume", check=False)
    cluster.repair_cli("accept", "run", "--apply", node=NODE)
    cluster.settle(NODES)


def test_an_approved_reboot_whose_node_fails_its_quick_acceptance_after_the_reboot_is_not_resumed(repair):
    repair.accept(NODE, at_start="quick", interfaces=("lo", "nosuch0"))
    boot_before = repair.slurm_node(NODE).boot_time
    record = repair.approved_repair(NODE)
    failed = repair.ended(NODE, record)

    assert failed["state"] == "failed", failed
    assert failed["step"] == "verify" and "acceptance quick (start run of this boot)" in failed["note"], failed
    assert "network-links nosuch0: " in failed["note"] and "no such interface (expected up)" in failed["note"], failed
    node = repair.slurm_node(NODE)
    assert node.boot_time > boot_before, node  # rebooted, and
    assert node.drained and node.reason.startswith("slurm-ext: repair reboot failed: it fails its acceptance"), node
    steps = repair.steps(record)
    assert any("health checks pass after the reboot; its acceptance quick must pass before the resume" in s
               for s in steps), steps
    assert steps[-1].startswith("repair-failed: reboot of qnode2 failed at verify: it fails its acceptance quick"), \
        steps
    assert not any("resumed" in s for s in steps) and not any("asked qnode2's agent" in s for s in steps), steps

    # the operator resumes it: its own acceptance drain (wanted since its start, behind the repair's) names why,
    # and a repair is recommended for it
    repair.run("scontrol", "update", f"nodename={NODE}", "state=resume")
    own = wait_for("the node's acceptance drain", lambda: (n := repair.slurm_node(NODE)).drained and
                   n.reason.startswith("slurm-ext: acceptance") and n, 30, interval=0.3)
    assert own.reason.startswith("slurm-ext: acceptance quick failed: network-links nosuch0: ") and \
        "no such interface (expected up)" in own.reason and own.reason.endswith(" action=reboot"), own.reason
    follow = repair.record(NODE, "recommended")
    assert (follow["signature"], follow["action"]) == ("acceptance/network-links", "reboot"), follow

    # fixed (its config), a run by hand passes and lifts the drain; the recommendation goes with it
    repair.accept(NODE, at_start="off")
    rerun = repair.repair_cli("accept", "run", "--apply", node=NODE)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    wait_for("the node back in service", lambda: repair.slurm_node(NODE).idle, 30, interval=0.5)
    wait_for("the recommendation gone", lambda: not [r for r in repair.records() if r["node"] == NODE and
                                                     r["state"] == "recommended"], 30, interval=0.5)


def test_a_gpu_with_a_stuck_bit_fails_the_acceptance_after_the_reboot_and_is_recommended_by_its_gpu(repair):
    """The fault no passive check sees (`dev inject stuck-bit`, the fake libcuda's memory): the reboot approved for
    an Xid does not hide it; the memory test of the new boot names the GPU, and its drain recommends a repair of that
    GPU."""
    repair.accept(NODE, at_start="quick", interfaces=(), area="gpu")
    repair.drill(NODE, "stuck-bit", gpu=1)
    record = repair.approved_repair(NODE)
    failed = repair.ended(NODE, record)

    assert failed["state"] == "failed", failed
    assert "it fails its acceptance quick (start run of this boot): gpu-memory gpu 1:" in failed["note"], failed
    assert not repair.slurm_node(NODE).idle
    repair.run("scontrol", "update", f"nodename={NODE}", "state=resume")
    own = wait_for("the node's acceptance drain", lambda: (n := repair.slurm_node(NODE)).drained and
                   n.reason.startswith("slurm-ext: acceptance") and n, 30, interval=0.3)
    assert own.reason.startswith("slurm-ext: acceptance quick failed: gpu-memory gpu 1: "), own.reason
    follow = repair.record(NODE, "recommended")
    assert (follow["signature"], follow["detail"].get("gpu")) == ("acceptance/gpu-memory", 1), follow
    assert follow["action"] in ("reset-gpu", "reboot"), follow

    repair.drill_heal(NODE)
    rerun = repair.repair_cli("accept", "run", "--apply", node=NODE)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    wait_for("the node back in service", lambda: repair.slurm_node(NODE).idle, 30, interval=0.5)


def test_a_repaired_node_without_a_run_of_its_new_boot_is_asked_for_one_and_resumed_when_it_passes(repair):
    repair.accept(NODE, at_start="off", interfaces=("lo",))
    record = repair.approved_repair(NODE)
    done = repair.ended(NODE, record)

    steps = repair.steps(record)
    assert done["state"] == "done", (done, steps)
    wanted = ["health checks pass after the reboot; its acceptance quick must pass",
              "asked qnode2's agent for an acceptance quick run (it has none of this boot after the reboot)",
              "qnode2's agent runs its acceptance quick tests",
              "qnode2 passes its acceptance quick (repair run of this boot): 1 test(s) passed: network-links lo",
              "resumed qnode2"]
    at = 0
    for text in wanted:
        at = next((i for i in range(at, len(steps)) if text in steps[i]), None)
        assert at is not None, f"{text!r} not in order in {steps}"
    wait_for("qnode2 back in service", lambda: repair.slurm_node(NODE).idle, 30, interval=0.5)
    kept = repair.repair_cli("accept", "show", "--json", "--trigger", "repair", node=NODE)
    assert kept.returncode == 0 and '"verdict": "pass"' in kept.stdout, kept.stdout + kept.stderr
