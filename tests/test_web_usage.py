"""The page's "is it being used?" view, as pure logic over literal records: Slurm's queue with the GPU indexes each
job holds (parsed from what Slurm 22.05 answered on the dev cluster: squeue --json's gres_detail and `scontrol show
job -d`), jobs per partition and user, GPUs allocated per type, each GPU's holders, the idle flag, and each fault
listed once in a node's findings cell."""

from __future__ import annotations

from slurm_ext import command
from slurm_ext.config import SlurmSection
from slurm_ext.agentapi import HealthAnswer
from slurm_ext.slurm import Job, Node, SlurmClient, gpu_indexes
from slurm_ext.web import allocation
from slurm_ext.web.watch import finding_lines

#: one job of `scontrol show job -d --oneliner` on the dev cluster (Slurm 22.05.8), its Reason= in the middle
SCONTROL_JOB = (
    "JobId=1 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 Account=root "
    "QOS=normal JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 "
    "ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED StartTime=2026-12-05T05:49:19 EndTime=Unknown "
    "Partition=debug AllocNode:Sid=localhost:26657 ReqNodeList=unode2 NodeList=unode2 BatchHost=unode2 NumNodes=1 "
    "TRES=cpu=1,mem=5901M,node=1,billing=1,gres/gpu=2 JOB_GRES=gpu:h200:2   Nodes=unode2 CPU_IDs=0 Mem=5901 "
    "GRES=gpu:h200:2(IDX:0-1) MinCPUsNode=1 Features=(null) TresPerNode=gres:gpu:2 ")
#: the same job in squeue --json (v0.0.38), the fields the page reads
SQUEUE_JOB = {"job_id": 1, "name": "wrap", "user_name": "root", "job_state": "RUNNING", "partition": "debug",
              "nodes": "unode2", "gres_detail": ["gpu:h200:2(IDX:0-1)"],
              "job_resources": {"nodes": "unode2", "allocated_nodes": [{"nodename": "unode2"}]}}


def _client(answers: dict[str, str], json: str) -> SlurmClient:
    def run(argv, timeout, **_):
        return command.CommandResult(argv, 0, answers[argv[0]], "")
    return SlurmClient(SlurmSection(json=json), runner=run)


def test_gpu_indexes_of_a_gres_detail():
    assert gpu_indexes("gpu:h200:2(IDX:0-1)") == ("h200", (0, 1))
    assert gpu_indexes("gpu:4(IDX:0,2-3)") == ("gpu", (0, 2, 3))
    assert gpu_indexes("gpu:h200:0(IDX:N/A)") == ("", ())  # no index: holds no GPU
    assert gpu_indexes("") == ("", ())


def test_the_queue_names_each_running_jobs_gpus_from_json_and_from_scontrols_text():
    import json
    from_json = _client({"squeue": json.dumps({"jobs": [SQUEUE_JOB]})}, "always").queue()
    from_text = _client({"scontrol": SCONTROL_JOB + "\n"}, "never").queue()
    for jobs in (from_json, from_text):
        assert [(j.job_id, j.user, j.state, j.partition, j.gpus) for j in jobs] == \
            [(1, "root", "RUNNING", "debug", (("unode2", "h200", (0, 1)),))]


def test_a_job_over_several_nodes_holds_each_nodes_own_indexes():
    line = ("JobId=9 JobName=big UserId=bob(1001) JobState=RUNNING Reason=None Partition=gpu NodeList=g[1-3] "
            "Nodes=g[1-2] CPU_IDs=0-3 Mem=100 GRES=gpu:a100:4(IDX:0-3) Nodes=g3 CPU_IDs=0 Mem=10 "
            "GRES=gpu:a100:1(IDX:2) MinCPUsNode=1")
    job = _client({"scontrol": line}, "never").queue()[0]
    assert job.gpus == (("g1", "a100", (0, 1, 2, 3)), ("g2", "a100", (0, 1, 2, 3)), ("g3", "a100", (2,)))


JOBS = [Job(1, "train", "alice", "RUNNING", "n1", "gpu", gpus=(("n1", "h200", (0, 1)),)),
        Job(2, "eval", "bob", "RUNNING", "n2", "gpu", gpus=(("n2", "h200", (3,)),)),
        Job(3, "cpu", "bob", "RUNNING", "n2", "cpu"),
        Job(4, "wait", "carol", "PENDING", "", "gpu,cpu"),
        Job(5, "done", "carol", "COMPLETING", "n1", "gpu")]
NODES = [Node("n1", "MIXED", gres="gpu:h200:4", gpus_used=2), Node("n2", "MIXED", gres="gpu:h200:4", gpus_used=1)]


def test_jobs_per_partition_and_per_user():
    summary = allocation.queue_summary(JOBS)
    assert (summary["running"], summary["pending"]) == (3, 1)
    assert summary["partitions"] == [{"name": "cpu", "running": 1, "pending": 1, "gpus": 0},
                                     {"name": "gpu", "running": 2, "pending": 1, "gpus": 3}]
    assert [(u["user"], u["running"], u["pending"], u["gpus"]) for u in summary["users"]] == \
        [("alice", 1, 0, 2), ("bob", 2, 0, 1), ("carol", 0, 1, 0)]


def test_gpus_allocated_against_configured_per_type_and_for_the_cluster():
    summary = allocation.allocation_summary(NODES, JOBS, {"h200": 8}, idle=1)
    assert summary == {"gpus": 8, "allocated": 3, "share": 37.5, "by_type": {"h200": {"total": 8, "allocated": 3}},
                       "idle": 1}
    assert allocation.allocation_summary([], [], {}, 0)["share"] is None


def test_each_gpu_names_the_running_jobs_that_hold_it_and_each_node_its_jobs():
    held = allocation.holders(JOBS)
    assert held["n1"][0] == held["n1"][1] == [allocation.GpuHolder(1, "alice", "gpu", "train")]
    assert 2 not in held["n1"] and [h.user for h in held["n2"][3]] == ["bob"]
    jobs = allocation.node_jobs(JOBS)
    assert [(j["job_id"], j["gpus"]) for j in jobs["n2"]] == [(2, [3]), (3, [])]
    assert "" not in jobs  # the pending job is on no node


def test_a_held_gpu_is_idle_since_its_first_quiet_reading_by_the_same_jobs():
    idle = allocation.IdleGpus()
    assert idle.node("n1", [(0, (1,), 2)], 5, now=100.0) == [100.0]
    assert idle.node("n1", [(0, (1,), 4)], 5, now=200.0) == [100.0]  # still quiet: counted from the first reading
    assert idle.node("n1", [(0, (1,), 50)], 5, now=300.0) == [None]  # busy: the count starts again
    assert idle.node("n1", [(0, (1,), 0)], 5, now=400.0) == [400.0]
    assert idle.node("n1", [(0, (2,), 0)], 5, now=500.0) == [500.0]  # another job: its own count
    assert idle.node("n1", [(0, (), 0), (1, (2,), None), (2, (2,), 0)], 5, now=600.0) == [None, None, 600.0]
    # not held: not waste; no utilization read: not judged
    assert idle.node("n1", [(0, (3,), 0), (2, (2,), 1)], 5, now=700.0) == [700.0, 600.0]
    assert idle.node("n1", [(0, (3,), 0)], 5, now=800.0) == [700.0]  # GPU 2 gone from the answer: forgotten
    assert idle.node("n1", [(0, (3,), 0), (2, (2,), 1)], 5, now=900.0) == [700.0, 900.0]
    idle.node("n2", [(0, (4,), 0)], 5, now=900.0)
    idle.forget_except({"n2"})
    assert list(idle.since) == ["n2"]


def test_one_fault_is_listed_once_in_a_nodes_findings_cell():
    # the drain is written from the agent's finding: the cell listed both (seen: an Xid 79 twice in one cell)
    finding = {"severity": "critical", "check": "xid", "gpu": 1, "evidence": "79 gpu 1 fallen off the bus"}
    assert finding_lines(["xid/79: 79 gpu 1 fallen off the bus"], [finding]) == \
        ["critical: xid 79 gpu 1 fallen off the bus"]
    # a drain no open finding states (the monitor restarted, an older drain) is still listed, once
    assert finding_lines(["ecc: 2 volatile double-bit", "ecc: 2 volatile double-bit"], [finding]) == \
        ["critical: xid 79 gpu 1 fallen off the bus", "ecc: 2 volatile double-bit"]
    assert finding_lines([], [finding, dict(finding)]) == ["critical: xid 79 gpu 1 fallen off the bus"]
    # an evidence that names its GPU does not get it twice (seen: "ecc gpu 2 gpu 2 double-bit ECC error", and in
    # `slurm-ext status`, "xid gpu 1 79 gpu 1 GPU has fallen off the bus")
    ecc = {"severity": "critical", "check": "ecc", "gpu": 2, "evidence": "gpu 2 double-bit ECC error (volatile)"}
    assert finding_lines(["ecc: gpu 2 double-bit ECC error (volatile)"], [ecc]) == \
        ["critical: ecc gpu 2 double-bit ECC error (volatile)"]


class _Queue:
    """Slurm as literal records: two nodes of 4 GPUs, one job on n1 holding GPUs 0 and 1; `down` makes the job
    queue fail as an unreachable slurmctld does."""

    def __init__(self):
        self.down = False

    def nodes(self):
        return [Node("n1", "MIXED", gres="gpu:h200:4", gpus_used=2, addr="127.0.0.1"),
                Node("n2", "IDLE", gres="gpu:h200:4", addr="127.0.0.1")]

    def queue(self):
        if self.down:
            from slurm_ext.errors import SlurmUnreachable
            raise SlurmUnreachable("squeue: Slurm unreachable: Unable to contact slurm controller", ["squeue"])
        return [Job(7, "train", "alice", "RUNNING", "n1", "gpu", gpus=(("n1", "h200", (0, 1)),)),
                Job(8, "wait", "bob", "PENDING", "", "gpu")]

    def node_events(self, node, since):
        return []

    def show_config(self):
        return {}


def _watcher(tmp_path, clock):
    from helpers.page import StandInAgents
    from slurm_ext import config
    from slurm_ext.repair.store import open_sqlite
    from slurm_ext.web.watch import Watcher
    path = tmp_path / "slurm-ext.toml"
    path.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[web]\ntoken_file = ""\nidle_gpu_after = "60s"\n')
    gpus = [{"gpu": {"index": i}, "utilization": 1 if i == 0 else 90, "fb_used_mib": 10.0, "fb_free_mib": 90.0}
            for i in range(4)]
    answer = {"boot": "b", "time": 1.0, "monitor": {"readings_time": 1.0, "findings": [], "gpus": gpus,
                                                    "checks": {"xid": "ok", "ecc": "critical", "nvlink": "disabled"}}}
    slurm = _Queue()
    agents = StandInAgents(["n1", "n2"], answer)
    return Watcher(config.load(path), slurm, open_sqlite(str(tmp_path / "r.db")),
                   lambda url, timeout: (None, "refused"), agents, clock=clock), slurm


def test_the_view_names_each_gpus_holder_flags_it_idle_after_the_window_and_keeps_the_queue_slurm_last_gave(
        tmp_path):
    now = [1000.0]
    watcher, slurm = _watcher(tmp_path, lambda: now[0])
    view = watcher.refresh().data
    n1 = next(n for n in view["nodes"] if n["name"] == "n1")
    assert [(g["index"], [h["user"] for h in g["holders"]], g["idle"]) for g in n1["gpu_readings"]] == \
        [(0, ["alice"], False), (1, ["alice"], False), (2, [], False), (3, [], False)]
    assert n1["jobs"] == [{"job_id": 7, "user": "alice", "partition": "gpu", "name": "train", "gpus": [0, 1]}]
    assert n1["checks"] == {"xid": "ok", "ecc": "critical", "nvlink": "disabled"}  # as the agent's /metrics has them
    assert (view["queue"]["running"], view["queue"]["pending"]) == (1, 1)
    assert view["allocation"]["share"] == 25.0 and view["usage"]["history"][-1][6] == 25.0
    now[0] += 61  # GPU 0 held and under 5 % for longer than idle_gpu_after; GPU 1 busy
    view = watcher.refresh().data
    n1 = next(n for n in view["nodes"] if n["name"] == "n1")
    assert [(g["index"], g["idle"], g["idle_since"]) for g in n1["gpu_readings"][:2]] == \
        [(0, True, 1000.0), (1, False, None)]
    assert view["allocation"]["idle"] == 1
    slurm.down = True  # slurmctld away for the queue: the last answer stays, said to be old
    now[0] += 5
    view = watcher.refresh().data
    jobs = view["sources"]["slurm-jobs"]
    assert jobs["ok"] is False and "Unable to contact" in jobs["error"]
    assert view["queue"]["running"] == 1 and view["allocation"]["idle"] == 1


def test_the_queue_is_asked_while_the_node_table_is_read_and_slurm_away_is_said_once(tmp_path):
    import json
    import threading
    import time
    from slurm_ext.errors import SlurmUnreachable
    now = [1000.0]
    watcher, slurm = _watcher(tmp_path, lambda: now[0])
    queue, nodes, asked, seen, answered = slurm.queue, slurm.nodes, threading.Event(), [], []

    def asked_first():
        seen.append(asked.wait(10))  # squeue under way before the node table is read (False: one after the other)
        return nodes()

    def slow_queue():
        asked.set()
        time.sleep(0.3)
        try:
            return queue()
        finally:
            answered.append(now[0])

    slurm.queue, slurm.nodes = slow_queue, asked_first
    view = watcher.refresh().data
    assert seen == [True] and view["queue"]["running"] == 1

    def away():
        raise SlurmUnreachable("scontrol: Slurm unreachable: Unable to contact slurm controller", ["scontrol"])
    slurm.nodes, slurm.down = away, True
    now[0] += 5
    view = watcher.refresh().data
    assert answered == [1000.0, 1005.0], "each refresh waits for its own queue, even one whose node table failed"
    assert view["sources"]["slurm"]["ok"] is False and view["sources"]["slurm-jobs"]["ok"] is True
    journal = (tmp_path / "state" / "journal.jsonl").read_text().splitlines()
    assert [e["source"] for e in map(json.loads, journal) if e["event"] == "web-source-failed"] == ["slurm"]


def test_a_node_whose_agent_stopped_answering_shows_no_check_as_ok(tmp_path):
    """The review of 29: the check table is what the node's agent measured. Once its agent stops answering, the
    watcher keeps the agent's last answer (its figures are shown with their age), but a check state "ok" from it
    is not a measurement of now: the node has no check states (the page says "no readings" beside the agent's
    error) until its agent answers again."""
    from slurm_ext.agentapi import AgentAnswerError
    now = [1000.0]
    watcher, _ = _watcher(tmp_path, lambda: now[0])
    n1 = next(n for n in watcher.refresh().data["nodes"] if n["name"] == "n1")
    assert n1["checks"]["xid"] == "ok"
    agents = watcher.agent_client
    answered = agents.health

    def silent(node, addr="", timeout=None):
        if node == "n1":
            raise AgentAnswerError(node, addr or "127.0.0.1", "no answer: connection refused")
        return answered(node, addr, timeout)
    agents.health = silent
    now[0] += 30
    n1 = next(n for n in watcher.refresh().data["nodes"] if n["name"] == "n1")
    assert n1["agent"]["error"], n1["agent"]
    assert n1["checks"] == {}, n1["checks"]
    agents.health = answered
    now[0] += 30
    n1 = next(n for n in watcher.refresh().data["nodes"] if n["name"] == "n1")
    assert n1["checks"]["xid"] == "ok"


def test_a_job_record_slurm_no_longer_runs_holds_no_gpu_on_the_page(tmp_path):
    """The review of 29: a node's agent names the jobs its job records say hold each GPU, and a record outlives a job
    whose Epilog never ran. Where Slurm's queue does not run that job, the GPU is free: not held by a gone job, and
    not flagged as an allocated GPU left idle (the waste operators hunt). A job Slurm runs there still holds it."""
    now = [1000.0]
    watcher, _ = _watcher(tmp_path, lambda: now[0])
    agents = watcher.agent_client
    for name, answer in agents.answers.items():  # GPU 2: a record of job 99 (gone); GPU 0: of job 7 (running)
        gpus = [{"gpu": {"index": i}, "utilization": 0, "fb_used_mib": 0.0, "fb_free_mib": 100.0,
                 "jobs": {0: [7], 2: [99]}.get(i, [])} for i in range(4)]
        agents.answers[name] = HealthAnswer.of({"boot": "b", "time": 1.0, "node": name, "monitor": {
            "readings_time": 1.0, "findings": [], "gpus": gpus, "checks": {}}})
    watcher.refresh()
    now[0] += 61
    view = watcher.refresh().data
    n2 = next(n for n in view["nodes"] if n["name"] == "n2")
    assert [(g["index"], g["holders"], g["idle"]) for g in n2["gpu_readings"]][2] == (2, [], False)
    assert n2["gpu_readings"][0]["holders"] == []  # job 7 runs, but on n1: n2's record of it is stale too
    n1 = next(n for n in view["nodes"] if n["name"] == "n1")
    assert [(g["index"], [h["job_id"] for h in g["holders"]], g["idle"]) for g in n1["gpu_readings"]][:3] == \
        [(0, [7], True), (1, [7], True), (2, [], False)]
    assert view["allocation"]["idle"] == 2


def test_a_gpu_whose_readings_stopped_is_not_flagged_idle(tmp_path):
    """The review of 29: the agent serves the monitor's last readings, and during an NVML hang (or with its health
    monitor stopped) their time stops while the agent answers on. A utilization read minutes ago says nothing of now:
    a held GPU is not flagged idle from it, and is counted again once readings come."""
    now = [1000.0]
    watcher, _ = _watcher(tmp_path, lambda: now[0])
    agents = watcher.agent_client

    def answers(agent_time: float, readings_time: float) -> None:
        for name in list(agents.answers):
            gpus = [{"gpu": {"index": i}, "utilization": 0, "fb_used_mib": 0.0, "fb_free_mib": 100.0}
                    for i in range(4)]
            agents.answers[name] = HealthAnswer.of({"boot": "b", "time": agent_time, "node": name, "monitor": {
                "readings_time": readings_time, "interval": 10.0, "findings": [], "gpus": gpus, "checks": {}}})
    answers(5000.0, 4990.0)  # read 10 s before the answer: fresh
    watcher.refresh()
    now[0] += 61
    answers(5061.0, 5055.0)
    assert watcher.refresh().data["allocation"]["idle"] == 2  # GPUs 0 and 1 of n1, held by job 7
    now[0] += 61
    answers(5122.0, 5055.0)  # the agent answers; its monitor's readings stopped 67 s ago
    view = watcher.refresh().data
    n1 = next(n for n in view["nodes"] if n["name"] == "n1")
    assert [(g["idle"], g["idle_since"]) for g in n1["gpu_readings"][:2]] == [(False, None)] * 2
    assert view["allocation"]["idle"] == 0


def test_a_findings_odd_gpu_field_costs_nothing_but_its_own_words():
    """The review of 29: the agent's findings are JSON it sends (checked for shape, not each field): a GPU field that
    is not a number (a regular expression's "(") is said as it is, and never stops the view or `status`."""
    assert finding_lines([], [{"severity": "critical", "check": "xid", "gpu": "1 (", "evidence": "79 lost"}]) == \
        ["critical: xid gpu 1 ( 79 lost"]


def test_a_job_holding_gpus_of_two_types_on_one_node_holds_each():
    """The review of 29: Slurm's GRES detail of one node joins each type's allocation with "," (src/stepmgr/
    gres_stepmgr.c): `gpu:a100:1(IDX:0),gpu:h100:1(IDX:1)` for a job given one GPU of each type on a node that has
    both. Each type's indexes are the job's (the page read the first type's only: GPU 1 looked free)."""
    detail = "gpu:a100:1(IDX:0),gpu:h100:1(IDX:1)"
    json_job = {**SQUEUE_JOB, "gres_detail": [detail]}
    text_job = SCONTROL_JOB.replace("GRES=gpu:h200:2(IDX:0-1)", f"GRES={detail}")
    from slurm_ext.slurm import _job_from_scontrol_text, _job_from_squeue_json
    for job in (_job_from_squeue_json(json_job), _job_from_scontrol_text(text_job)):
        assert job.gpus == (("unode2", "a100", (0,)), ("unode2", "h100", (1,))), job.gpus
        assert {node: sorted(held) for node, held in allocation.holders([job]).items()} == {"unode2": [0, 1]}
        assert allocation.node_jobs([job])["unode2"][0]["gpus"] == [0, 1]
