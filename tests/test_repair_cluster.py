"""Human-approved repair on a 4-node dev cluster: real slurmctld, four slurmd with their own agents, fake NVML,
each node's kernel log a file of its own, the repair service in the controller agent keeping its records in the
cluster's MariaDB, and Slurm's reboot flow through the cluster's RebootProgram."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime

import psutil
import pytest

from slurm_ext import devcluster as dev
from slurm_ext.devcluster import daemons, fakenvml, fakesmi
from slurm_ext.devcluster.cluster import cluster_daemons

from helpers.cluster import TEST_CLUSTER, RepairCluster, cluster_of_its_own
from helpers.wait import wait_for

REPAIR_CLUSTER = {**TEST_CLUSTER, "cluster_name": "slurmextrepair", "node_name": "rnode1", "nodes": 4,
                  "defined_nodes": 5, "slurmctld_port": 18817, "slurmd_port": 18818, "slurmdbd_port": 18819,
                  "mariadb_port": 13309, "controller_probe_port": 19831, "worker_probe_port": 19830,
                  "accounting_probe_port": 19832, "web_port": 19833, "node_port_base": 24000, "kernel_log": "",
                  "health_interval": 1.0, "repair_interval": 1.0, "resume_timeout": 30}
NODES = ["rnode1", "rnode2", "rnode3", "rnode4"]


@pytest.fixture(scope="module")
def four():
    with cluster_of_its_own("slurm-ext-repair-", **REPAIR_CLUSTER) as settings:
        yield RepairCluster(settings)


@pytest.fixture
def repair(four):
    """The cluster idle, every fault cleared and nothing open, after each test (one failure does not fail the
    rest)."""
    yield four
    four.settle(NODES)


def _events(cluster: RepairCluster, record: int) -> list:
    """The repair events of one record, from the store."""
    with cluster.store() as store:
        return store.events(record=record)


def _all_in_order(entries: list[dict], wanted: list[tuple[str, str]]) -> list[dict] | None:
    """`entries` when they hold each of `wanted` in turn, else None (what a wait asks again)."""
    try:
        _in_order(entries, wanted)
    except AssertionError:
        return None
    return entries


def _in_order(entries: list[dict], wanted: list[tuple[str, str]]) -> list[dict]:
    """The entries matching each (source, text) in turn, in time order; fails naming the first one missing."""
    found, at = [], 0
    for source, text in wanted:
        for index in range(at, len(entries)):
            entry = entries[index]
            if entry["source"] == source and text in f"{entry['event']}: {entry['message']}":
                found.append(entry)
                at = index + 1
                break
        else:
            lines = "\n".join(f"{e['source']} {e['event']}: {e['message']}" for e in entries)
            raise AssertionError(f"history lacks {source} {text!r} after {found[-1:]}:\n{lines}")
    return found


@pytest.fixture(params=["host", pytest.param("images", marks=pytest.mark.containers)])
def either(request):
    """The test on the host's 4-node dev cluster (Slurm 22.05) and on the images' (Slurm 26.05, or the suite's
    SLURM_EXT_TEST_IMAGE_SUITE; configless dynamic nodes, as Slinky runs them: the session's `twin`), settled after
    it."""
    cluster = request.getfixturevalue("four" if request.param == "host" else "twin")
    yield cluster
    cluster.settle(cluster.nodes)


def test_a_critical_finding_drains_naming_gpu_and_action_and_the_nodes_clear_lifts_it(either):
    """The health monitor's drain and its clear, with Slurm's own record of both (sacctmgr's event table)."""
    cluster = either
    node = cluster.nodes[2]
    cluster.inject_xid(node)
    drained = wait_for("the xid 79 drain", lambda: (n := cluster.slurm_node(node)).reason.startswith(
        "slurm-ext: xid 79 gpu 1") and n, 15, interval=0.3)
    assert drained.drained and drained.reason.endswith("action=reboot") and drained.reason_is_ours, drained
    cleared = cluster.repair_cli("health", "clear", "--check", "xid", node=node, user="bob")
    assert cleared.returncode == 0, cleared.stderr
    wait_for("the drain lifted", lambda: not (n := cluster.slurm_node(node)).drained and not n.reason, 15,
             interval=0.3)
    entries = wait_for("Slurm's drain event and the clear in the history", lambda: (h := cluster.history(
        node, "health/health-finding: critical: xid 79 gpu 1", "nodestate/drain: drained node",
        "health/health-cleared: xid ", "nodestate/resume: resumed node")) and any(
        e["source"] == "slurm" and "slurm-ext: xid 79 gpu 1" in e["message"] for e in h) and h, 60, interval=1.0)
    said = [f"{e['source']} {e['event']}: {e['message']}" for e in entries]
    # Slurm's event has its whole second: beside the agent's of the same second it may come first
    for wanted in ("agent health/health-finding: critical: xid 79 gpu 1", "slurm drain: DRAIN: slurm-ext: xid 79 gpu 1",
                   "agent nodestate/drain: drained node", "agent health/health-cleared: xid ",
                   "agent nodestate/resume: resumed node"):
        assert any(line.startswith(wanted) for line in said), (wanted, said)
    assert any("by bob" in line for line in said if "health-cleared" in line), said


def test_a_gpu_fault_is_recommended_approved_and_repaired_through_slurms_reboot(either):
    repair = either
    node = repair.nodes[1]
    release = repair.gate(node)  # the job runs until the test has seen the repair wait for it, however slow
    job = repair.sbatch("-w", node, "--wrap", f"while [ ! -e {release.path} ]; do sleep 0.2; done")
    wait_for("the job runs", lambda: any(j.job_id == job and j.state == "RUNNING" for j in repair.client().jobs()),
             30, interval=0.3)
    boot_before, reboots_before = repair.slurm_node(node).boot_time, repair.reboots_seen(node)
    repair.inject_xid(node)
    record = repair.record(node, "recommended")
    assert (record["action"], record["signature"], record["jobs"]) == ("reboot", "xid/79", [job])
    assert "GPU has fallen off the bus" in record["evidence"]
    listed = repair.repair_cli("repair", "list")
    assert node in listed.stdout and "recommended" in listed.stdout

    approved = repair.repair_cli("repair", "approve", node, user="alice")
    assert approved.returncode == 0, approved.stderr
    # the record is saved at every step: read between two of them it may still say drain
    running = wait_for("the repair past its drain", lambda: (r := repair.record(node, "running"))["step"]
                       != "drain" and r, 30, interval=0.3)
    drained = wait_for("drained with the repair's reason", lambda: (n := repair.slurm_node(node)).reason.startswith(
        "slurm-ext: repair reboot: xid/79") and n, 15, interval=0.3)
    assert running["step"] == "wait-jobs" and "DRAIN" in drained.flags
    assert any(j.job_id == job and j.state == "RUNNING" for j in repair.client().jobs())  # allowed to finish

    release.open()
    assert repair.wait_accounted(job).state == "COMPLETED"
    done = wait_for("the repair done", lambda: next((r for r in repair.all_records(node)
                                                     if r["id"] == record["id"] and r["state"] == "done"), None),
                    120, interval=1.0)
    assert done["decided_by"] == "alice"
    # a resumed node answers Slurm's next ping (it shows NOT_RESPONDING until then: SlurmdTimeout/3 at most)
    after = wait_for(f"{node} back in service", lambda: (n := repair.slurm_node(node)).idle and n, 30, interval=0.5)
    assert after.boot_time > boot_before, after
    # slurmctld queued this reboot and slurmd ran the RebootProgram (26.05: the repair's PowerAction)
    queued, ran = repair.reboots_seen(node)
    assert queued > reboots_before[0] and ran > reboots_before[1], (reboots_before, queued, ran)

    wanted = [("agent", "health/health-finding: critical: xid 79 gpu 1"),
              ("repair", "repair-recommended"), ("repair", "repair-approved"),
              ("repair", f"drained {node}"), ("slurm", "DRAIN: slurm-ext: repair reboot"),
              ("repair", "jobs have ended"),
              ("repair", repair.reboot_step(node)), ("agent", "supervisor/started"),
              ("repair", f"{node} is back"), ("repair", "checks pass"), ("repair", "repair-done")]
    # Slurm's own drain event reaches slurmdbd through slurmctld's DBD agent queue, which may lag under load, and
    # the agent's journal the history through the controller's collector, within its interval
    entries = wait_for("every step in the history", lambda: _all_in_order(repair.history(node), wanted), 60,
                       interval=1.0)
    assert [e["time_epoch"] for e in entries] == sorted(e["time_epoch"] for e in entries)
    # issue 29.7: one time format (ISO 8601 with the zone), epoch seconds named as such
    assert all(datetime.fromisoformat(e["time"]).timestamp() == int(e["time_epoch"]) for e in entries), entries
    steps = _in_order(entries, wanted)
    assert steps[2]["user"] == "alice"


def _remap_pending(cluster: RepairCluster, node: str, gpu: int) -> None:
    """A row remap pending on the node's GPU `gpu`, in its fake NVML spec (a fault whose fix is a GPU reset)."""
    path = cluster.layout.node(node).gpu_spec
    spec = json.loads(path.read_text())
    spec["gpus"][gpu]["remapped_rows"] = {**spec["gpus"][gpu].get("remapped_rows", {}), "uncorrected": 1, "pending": 1}
    fakenvml.write_spec(path, spec)


def _smi_calls(cluster: RepairCluster, node: str) -> list[list[str]]:
    """Every call of the dev cluster's nvidia-smi on the node, its arguments (devcluster/fakesmi.py's log)."""
    log = cluster.layout.node(node).gpu_spec.parent / fakesmi.LOG_NAME
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_gpu_fault_whose_fix_is_a_reset_is_repaired_by_resetting_that_gpu_while_other_jobs_run(repair, tmp_path):
    """Issue 29, item 3: a row remap pending on GPU 2 (NVIDIA: a GPU reset applies it) drains the node with a reason
    naming GPU 2 and the fault within 40 characters, is recommended reset-gpu (not reboot), and once approved the
    node's agent resets GPU 2 alone (the dev cluster's nvidia-smi, called once with that GPU) while a job on another
    GPU runs on; its checks pass on a reading after the reset, the node is resumed, and the history shows each step
    as a reboot's does."""
    release = tmp_path / "release"
    job = repair.sbatch("-w", "rnode3", "--gres=gpu:1", "--wrap", f"while [ ! -e {release} ]; do sleep 0.2; done")
    wait_for("the job runs", lambda: any(j.job_id == job and j.state == "RUNNING" for j in repair.client().jobs()),
             30, interval=0.3)
    calls = len(_smi_calls(repair, "rnode3"))
    _remap_pending(repair, "rnode3", 2)
    node = wait_for("rnode3 drained for its GPU 2", lambda: (n := repair.slurm_node("rnode3")).reason.startswith(
        "slurm-ext: row-remap") and n, 30, interval=0.3)
    shown = node.reason.removeprefix("slurm-ext: ")[:40]
    assert "gpu 2" in shown and "row remapping pending" in shown, node.reason
    assert "expected" not in node.reason and "limit 0" not in node.reason, node.reason
    record = repair.record("rnode3", "recommended")
    assert (record["action"], record["signature"]) == ("reset-gpu", "row-remap"), record

    approved = repair.repair_cli("repair", "approve", "rnode3", user="alice")
    assert approved.returncode == 0, approved.stderr
    done = wait_for("the reset done", lambda: next((r for r in repair.all_records("rnode3") if r["id"] == record["id"]
                                                    and r["state"] in ("done", "failed")), None), 120, interval=0.5)
    assert done["state"] == "done", done
    assert _smi_calls(repair, "rnode3")[calls:] == [["--gpu-reset", "-i", "2"]]
    resumed = wait_for("rnode3 resumed", lambda: not (n := repair.slurm_node("rnode3")).drained and n, 30,
                       interval=0.3)
    assert "reset" not in resumed.reason
    assert any(j.job_id == job and j.state == "RUNNING" for j in repair.client().jobs()), "the job on gpu 0 ran on"
    findings = repair.repair_cli("health", "show", "--json", node="rnode3")
    assert not [f for f in json.loads(findings.stdout) if f["check"] == "row-remap"], findings.stdout

    release.touch()
    assert repair.wait_accounted(job).state == "COMPLETED"
    wait_for("rnode3 idle", lambda: repair.slurm_node("rnode3").idle, 30, interval=0.5)
    entries = repair.history("rnode3", "health/health-finding: critical: row-remap gpu 2",
                             "health/health-cleared: row-remap ")
    steps = _in_order(entries, [("agent", "health/health-finding: critical: row-remap gpu 2 row remapping pending"),
                                ("repair", "repair-recommended: reset-gpu recommended for row-remap"),
                                ("repair", "repair-approved"), ("repair", "drained rnode3"),
                                ("repair", "waits only for the jobs holding gpu 2"),
                                ("repair", "asked rnode3's agent to reset gpu 2"),
                                ("repair", "gpu 2 of rnode3 reset"), ("repair", "checks pass after the reset-gpu"),
                                ("repair", "repair-done")])
    assert steps[2]["user"] == "alice"
    # the reset's clear says why (it said "an operator's slurm-ext health clear", with no operator)
    cleared = [e for e in entries if e["event"] == "health/health-cleared" and e["message"].startswith("row-remap ")]
    assert cleared and all("cleared (its GPU was reset for an approved reset-gpu repair)" in e["message"]
                           for e in cleared), cleared


def test_a_gpu_reset_that_fails_leaves_the_node_drained_and_recommends_a_reboot(repair):
    """The reset tool fails (the dev cluster's nvidia-smi exits 255, a GPU in use): the repair fails with the tool's words, the node
    stays drained saying so, and a reboot is recommended for the same fault."""
    spec = repair.layout.node("rnode4").gpu_spec
    failing = spec.parent / fakesmi.FAIL_NAME
    failing.touch()
    try:
        calls = len(_smi_calls(repair, "rnode4"))
        _remap_pending(repair, "rnode4", 2)
        record = repair.record("rnode4", "recommended")
        assert record["action"] == "reset-gpu"
        assert repair.repair_cli("repair", "approve", "rnode4").returncode == 0
        failed = wait_for("the reset failed", lambda: next((r for r in repair.all_records("rnode4") if r["id"] ==
                                                            record["id"] and r["state"] in ("done", "failed")), None),
                          120, interval=0.5)
        assert failed["state"] == "failed", failed
        assert "exited with status 255" in failed["note"] and "In use by another client" in failed["note"], failed
        assert _smi_calls(repair, "rnode4")[calls:] == [["--gpu-reset", "-i", "2"]]
        node = repair.slurm_node("rnode4")
        assert node.drained and node.reason.startswith("slurm-ext: repair reset-gpu failed"), node.reason
        follow = repair.record("rnode4", "recommended")
        assert (follow["action"], follow["signature"]) == ("reboot", "row-remap"), follow
        assert [e.event for e in _events(repair, record["id"])][-1] == "repair-failed"
        time.sleep(2 * REPAIR_CLUSTER["repair_interval"])  # passes of the service: the reboot stays recommended
        assert repair.record("rnode4", "recommended")["id"] == follow["id"]
    finally:  # as an operator would: the GPU fixed, its finding cleared, the node resumed
        failing.unlink(missing_ok=True)
        fakesmi.reset_gpu_in_spec(spec, 2)
        repair.repair_cli("health", "clear", node="rnode4")
        repair.run("scontrol", "update", "nodename=rnode4", "state=resume", check=False)


def test_a_job_cannot_read_its_nodes_agent_and_a_forger_on_an_agents_port_is_not_believed(repair, tmp_path):
    """Issue 27 on the dev cluster: a job of nobody's asks its node's agent for the journal, the health and a
    check without the agent credential and gets 401 each time; the controller's `history` reads every agent with
    it; and with rnode3's agent stopped, a process of nobody's that took its port and answers "healthy" is named
    as not believed, never taken for the node."""
    node = next(n for n in repair.layout.nodes if n.name == "rnode1")
    base = f"http://127.0.0.1:{node.probe_port}"
    out = repair.layout.out / "agent-asked-by-nobody.txt"
    job = repair.sbatch("--uid=65534", "--gid=65534", "-w", "rnode1", "--wrap", " ; ".join(
        f"curl -s -o /dev/null -w '%{{http_code}} ' {method} {base}{path} >> {out}"
        for method, path in (("", "/events?since=0"), ("", "/health"), ("-X POST", "/health/check"))))
    wait_for(f"job {job}'s three answers", lambda: out.exists() and len(out.read_text().split()) == 3, 60,
             interval=0.3)
    assert out.read_text().split() == ["401", "401", "401"]

    def collected():  # the collector takes every agent's journal within an interval (history.interval)
        timeline = json.loads(repair.repair_cli("history", "--json", "--since", "1h").stdout)
        return timeline if {e["node"] for e in timeline["entries"] if e["source"] == "agent"} >= set(NODES) \
            else None
    timeline = wait_for("every running node's journal in the history", collected, 60, interval=1.0)
    assert not set(timeline["unreachable"]) & set(NODES), timeline["unreachable"]  # rnode5 is only in slurm.conf

    third = next(n for n in repair.layout.nodes if n.name == "rnode3")
    agent = next(d for d in cluster_daemons(repair.layout) if d.name == third.agent)
    daemons.stop(agent)
    forger = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                               "-c", "import http.server, json, sys\n"
                               "class H(http.server.BaseHTTPRequestHandler):\n"
                               "    def do_GET(self):\n"
                               "        body = json.dumps({'node': 'rnode3', 'boot': '', 'time': 1, 'facts': {},"
                               " 'monitor': {'readings_time': 9e9, 'findings': []}}).encode()\n"
                               "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
                               f"http.server.HTTPServer(('127.0.0.1', {third.probe_port}), H).serve_forever()\n"])
    try:
        wait_for("the forger listens", lambda: subprocess.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:"
                                                                f"{third.probe_port}/health"]).returncode == 0, 15,
                 interval=0.1)

        def named():  # the collector's next ask of rnode3 meets the forger, and says so within a few seconds
            timeline = json.loads(repair.repair_cli("history", "--json", "--since", "1h", "--node", "rnode3").stdout)
            return timeline["unreachable"].get("rnode3", "")
        said = wait_for("rnode3 named as not believed", lambda: "answer not believed" in named() and named(), 60,
                        interval=1.0)
        assert "answer not believed: not signed with the agent credential" in said
    finally:
        forger.kill()
        forger.wait(10)
        dev.up(repair.settings)  # the agent comes back on its port


def test_a_rejected_recommendation_is_recorded_and_nothing_runs(repair):
    boot_before = repair.slurm_node("rnode3").boot_time
    repair.inject_xid("rnode3")
    repair.record("rnode3", "recommended")
    refused = repair.repair_cli("repair", "reject", "rnode3", "--why", "   ")
    assert refused.returncode == 1 and "needs its reason" in refused.stderr
    done = repair.repair_cli("repair", "reject", "rnode3", "--why", "vendor swaps the board tomorrow", user="bob")
    assert done.returncode == 0, done.stderr
    record = repair.record("rnode3", "rejected")
    assert (record["decided_by"], record["note"]) == ("bob", "vendor swaps the board tomorrow")
    time.sleep(4)  # four passes of the service: nothing runs
    node = repair.slurm_node("rnode3")
    assert node.drained and node.reason.startswith("slurm-ext: xid 79") and node.boot_time == boot_before
    again = repair.repair_cli("repair", "approve", "rnode3")
    assert again.returncode == 1 and "rejected by bob" in again.stderr
    assert "`slurm-ext repair reopen rnode3` makes it await approval again" in again.stderr, again.stderr
    assert _in_order(repair.history("rnode3"), [("repair", "repair-rejected: reboot rejected by bob: vendor")])


def test_a_fault_that_clears_before_approval_takes_its_recommendation_away(repair):
    repair.inject_xid("rnode4")
    record = repair.record("rnode4", "recommended")
    assert repair.repair_cli("health", "clear", node="rnode4").returncode == 0
    wait_for("the recommendation gone", lambda: not [r for r in repair.records() if r["node"] == "rnode4"], 20,
             interval=0.5)
    assert [r["state"] for r in repair.all_records("rnode4") if r["id"] == record["id"]] == ["gone"]
    refused = repair.repair_cli("repair", "approve", "rnode4")
    assert refused.returncode == 1 and "no recommendation" in refused.stderr


def test_two_operators_approving_at_once_make_one_repair(repair):
    repair.inject_xid("rnode4")
    record = repair.record("rnode4", "recommended")
    conf = str(repair.layout.slurm_ext_conf)
    both = [subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "--config", conf, "repair", "approve", "rnode4"],
                             env={**os.environ, "SUDO_USER": user}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for user in ("alice", "bob")]
    answers = [(p.wait(60), p.stderr.read()) for p in both]
    assert sorted(code for code, _ in answers) == [0, 1], answers
    refusal = next(text for code, text in answers if code == 1)
    assert "already approved by" in refusal or "decided by someone else meanwhile" in refusal, refusal
    done = wait_for("the one repair done", lambda: next((r for r in repair.all_records("rnode4")
                                                         if r["id"] == record["id"] and r["state"] == "done"), None),
                    120, interval=1.0)
    assert done["decided_by"] in ("alice", "bob")
    assert sum(e.event == "repair-approved" for e in _events(repair, record["id"])) == 1


def test_the_guard_refuses_the_third_and_a_killed_controller_carries_on_from_the_record(repair):
    jobs = {node: repair.sbatch("-w", node, "--wrap", "sleep 300") for node in ("rnode2", "rnode3")}
    wait_for("both jobs run", lambda: {j.job_id for j in repair.client().jobs() if j.state == "RUNNING"}
             >= set(jobs.values()), 30, interval=0.3)
    for node in ("rnode2", "rnode3", "rnode4"):
        repair.inject_xid(node)
    for node in ("rnode2", "rnode3", "rnode4"):
        repair.record(node, "recommended")
    for node in ("rnode2", "rnode3"):
        assert repair.repair_cli("repair", "approve", node).returncode == 0
    third = repair.repair_cli("repair", "approve", "rnode4")
    assert third.returncode == 1
    assert "refused by the guard: 2 node(s) under repair now (rnode2, rnode3), and at most 2 may be at once" \
        in third.stderr, third.stderr
    ids = {}
    for node in ("rnode2", "rnode3"):
        ids[node] = wait_for(f"{node} waits for its job", lambda: (r := repair.record(node, "running"))["step"]
                             == "wait-jobs" and r["id"], 20, interval=0.5)

    # the controller agent and its repair service SIGKILLed in the middle; slurmctld, orphaned, stopped as its
    # pod's would be (SIGTERM: it saves its state), so that the new agent's slurmctld can take its port
    controller = next(d for d in cluster_daemons(repair.layout) if d.name == "supervise-controller")
    agent = psutil.Process(daemons.running_pid(controller))
    children = agent.children()
    for process in [agent, *(c for c in children if c.name() != "slurmctld")]:
        process.send_signal(signal.SIGKILL)
    for process in children:
        if process.name() == "slurmctld":
            process.send_signal(signal.SIGTERM)
    psutil.wait_procs([agent, *children], timeout=30)
    dev.up(repair.settings)  # the controller agent comes back: slurmctld from its state, the repair service
    for job in jobs.values():
        repair.run("scancel", str(job))
    ended = {}
    for node in ("rnode2", "rnode3"):
        ended[node] = wait_for(f"{node}'s repair done", lambda: next(
            (r for r in repair.all_records(node) if r["id"] == ids[node] and r["state"] in ("done", "failed")), None),
            150, interval=1.0)
    assert {n: r["state"] for n, r in ended.items()} == {"rnode2": "done", "rnode3": "done"}, \
        {n: (r["state"], r["step"], r["note"]) for n, r in ended.items()}
    for node in ("rnode2", "rnode3"):  # the repair went on from its record: started once, rebooted once (a slurmctld
        # back from older state may show the health drain again: the flow drains it again, and says so)
        messages = [e.message for e in _events(repair, ids[node])]
        assert sum("scontrol reboot" in m for m in messages) == 1, messages
        assert sum(m.startswith("reboot started") for m in messages) == 1, messages
    fourth = repair.repair_cli("repair", "approve", "rnode4")  # room again under the guard
    assert fourth.returncode == 0, (fourth.stderr, repair.all_records("rnode4"), repair.history("rnode4")[-12:])
    wait_for("rnode4's repair done", lambda: any(r["state"] == "done" and r["node"] == "rnode4"
                                                 for r in repair.all_records("rnode4")), 120, interval=1.0)


def test_the_same_fault_after_two_reboots_recommends_remove(repair):
    def reboots():
        return [r for r in repair.all_records("rnode2") if r["state"] == "done" and r["action"] == "reboot"
                and r["signature"] == "xid/79"]
    while len(reboots()) < 2:
        assert repair.repair_with_reboot("rnode2")["state"] == "done"
    repair.inject_xid("rnode2")
    record = repair.record("rnode2", "recommended")
    assert record["action"] == "remove" and "after 2 reboots" in record["evidence"], record


def test_status_shows_the_five_states_and_leaves_an_admins_drain_alone(either):
    repair = either
    healthy, pending, paused, booting = repair.nodes
    repair.inject_xid(pending)
    repair.record(pending, "recommended")
    repair.run("scontrol", "update", f"nodename={paused}", "state=drain", "reason=admin: fan replacement")
    job = repair.sbatch("-w", booting, "--wrap", "sleep 300")
    wait_for("the job runs", lambda: any(j.job_id == job and j.state == "RUNNING" for j in repair.client().jobs()),
             30, interval=0.3)
    repair.run("scontrol", "reboot", booting)  # once idle: REBOOT_REQUESTED until then
    done = repair.repair_cli("status", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    states = {n["name"]: n["state"] for n in report["nodes"]}
    assert states == {healthy: "healthy", pending: "pending", paused: "paused", booting: "booting",
                      repair.down_node: "unhealthy"}, states
    assert report["counts"] == {"healthy": 1, "booting": 1, "unhealthy": 1, "pending": 1, "paused": 1}
    shown = next(n for n in report["nodes"] if n["name"] == paused)
    assert shown["reason"] == "admin: fan replacement" and shown["reason_owner"] == "root"
    text = repair.repair_cli("status").stdout
    assert "healthy 1  booting 1  unhealthy 1  pending 1  paused 1" in text
    time.sleep(3)
    assert repair.slurm_node(paused).reason == "admin: fan replacement"  # never touched
