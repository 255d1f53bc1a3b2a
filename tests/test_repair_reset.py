"""Issue 29, item 3: reset-gpu is a repair action. A finding whose action is reset-gpu is recommended as reset-gpu
(not reboot) for the GPU its drain names; the same GPU reset escalate_after times within escalate_window is
recommended a reboot (as reboots of one signature escalate to remove); a reset that failed leaves a reboot
recommended, which the cooldown of that failure does not hold back. Recommendations from literal nodes, decisions on
a real SQLite store."""

from __future__ import annotations

import pytest

from slurm_ext.repair import decide, recommend
from slurm_ext.repair.settings import ACTIONS, KEEPS_DATA, RepairSection
from slurm_ext.repair.store import Record, open_sqlite
from slurm_ext.slurm import Job, Node

XID48 = "slurm-ext: xid 48 gpu 2 double-bit ECC error action=reset-gpu"
ROW_REMAP = "slurm-ext: row-remap gpu 3 row remapping pending (a GPU reset applies it) action=reset-gpu"


def _drained(name: str, reason: str) -> Node:
    return Node(name, "IDLE", frozenset({"DRAIN"}), reason, "root", gres="gpu:h200:4")


@pytest.fixture
def store(tmp_path):
    opened = open_sqlite(str(tmp_path / "state" / "repair.db"))
    yield opened
    opened.close()


def test_reset_gpu_is_the_least_disruptive_repair_and_keeps_data():
    assert ACTIONS[0] == "reset-gpu" and ACTIONS.index("reset-gpu") < ACTIONS.index("reboot")
    assert "reset-gpu" in KEEPS_DATA


@pytest.mark.parametrize("reason,signature,gpu", [(XID48, "xid/48", 2), (ROW_REMAP, "row-remap", 3)])
def test_a_reset_gpu_finding_is_recommended_reset_gpu_for_its_gpu(reason, signature, gpu):
    changes = recommend.plan([], [_drained("n1", reason)], {}, RepairSection(), {}, 1000.0)
    assert [(c.kind, c.record.signature, c.record.action) for c in changes] == [("new", signature, "reset-gpu")]
    assert changes[0].record.detail["gpu"] == gpu


def test_the_same_gpu_reset_escalate_after_times_is_recommended_a_reboot():
    settings = RepairSection(escalate_after=2)
    once = recommend.plan([], [_drained("n1", XID48)], {}, settings, {}, 1000.0, resets={("n1", "xid/48", 2): 1})
    assert once[0].record.action == "reset-gpu"
    other_gpu = recommend.plan([], [_drained("n1", XID48)], {}, settings, {}, 1000.0,
                               resets={("n1", "xid/48", 1): 5})
    assert other_gpu[0].record.action == "reset-gpu", "another GPU's resets do not count"
    twice = recommend.plan([], [_drained("n1", XID48)], {}, settings, {}, 1000.0, resets={("n1", "xid/48", 2): 2})
    assert twice[0].record.action == "reboot"
    assert "back after 2 resets of gpu 2 for it: escalated to reboot" in twice[0].record.evidence


def test_a_reset_gpu_finding_that_names_no_gpu_is_a_reboot():
    changes = recommend.plan([], [_drained("n1", "slurm-ext: xid 48 node double-bit ECC error action=reset-gpu")], {},
                             RepairSection(), {}, 1000.0)
    assert changes[0].record.action == "reboot"


def test_a_failed_resets_reboot_is_kept_while_the_failure_drains_the_node_and_is_not_held_by_its_cooldown(store):
    settings = RepairSection(cooldown=3600.0)
    failed = store.add(Record("n1", "xid/48", "reset-gpu", "48 gpu 2 double-bit ECC error", [], opened=900.0,
                              updated=950.0, state="failed", closed=950.0, detail={"gpu": 2}))
    follow = store.add(Record("n1", "xid/48", "reboot", "48 gpu 2 double-bit ECC error (the GPU reset failed)", [],
                              opened=950.0, updated=950.0, detail={"gpu": 2, "after_failed": failed.id}))
    node = _drained("n1", "slurm-ext: repair reset-gpu failed: xid/48: exited with status 1 (approved by ann)")
    assert recommend.plan([follow], [node], {}, settings, {}, 1000.0) == [], "kept while the failure drains it"
    record, said = decide.approve(store, "n1", "ann", settings, 4, now=1000.0)
    assert (record.action, said) == ("reboot", "approved reboot of node n1")


def test_another_failure_still_holds_the_node_in_its_cooldown(store):
    settings = RepairSection(cooldown=3600.0)
    store.add(Record("n1", "xid/79", "reboot", "79 gpu 1 x", [], opened=900.0, updated=950.0, state="failed",
                     closed=950.0))
    store.add(Record("n1", "xid/48", "reset-gpu", "48 gpu 2 x", [], opened=990.0, updated=990.0, detail={"gpu": 2}))
    with pytest.raises(decide.DecisionRefused, match="in its cooldown"):
        decide.approve(store, "n1", "ann", settings, 4, now=1000.0)


# -- the flow's reset steps, on a real store (the node's agent and Slurm stood in for by what they answer) ---------

def _seen(store, *, health=None, reset=None, requeued=None, now=1000.0, **settings):
    from concurrent.futures import Future

    from slurm_ext.repair import flow

    class Slurm:  # only what the reset steps ask of Slurm
        resumed: list = []

        def requeue(self, jobs):
            requeued.append(list(jobs))
            return ""

        def resume(self, name):
            self.resumed.append(name)

        def drain(self, name, reason, *args, **kwargs):  # a failed repair re-words its drain
            self.drained = (name, reason)

    def reset_gpu(node, gpu):  # as the service's pool gives it: an error of the ask is the future's
        done = Future()
        try:
            done.set_result(reset(node, gpu))
        except Exception as err:
            done.set_exception(err)
        return done
    node = Node("n1", "MIXED", frozenset({"DRAIN"}), "slurm-ext: repair reset-gpu: row-remap gpu 2 (approved by ann)",
                "root", gres="gpu:h200:4")
    return flow.Seen(Slurm(), store, RepairSection(**settings), {"n1": node}, {}, health or (lambda name: None),
                     None, {}, lambda *a, **k: None, lambda: now, reset_gpu)


def _running(store, step: str, **detail) -> Record:
    return store.add(Record("n1", "row-remap", "reset-gpu", "gpu 2 row remapping pending", [], state="running",
                            step=step, opened=900.0, updated=900.0, decided_by="ann",
                            detail={"gpu": 2, "drained_at": 950.0, **detail}))


def _answer(reading: float, critical: bool):
    from slurm_ext.agentapi import FactsReading, HealthAnswer, Readings
    findings = ({"check": "row-remap", "severity": "critical", "evidence": "gpu 2 row remapping pending"},) \
        if critical else ()
    return HealthAnswer("n1", "boot-1", reading, Readings(reading, findings, {}, "", ()), FactsReading())


def test_jobs_holding_the_gpu_are_waited_for_and_requeued_where_allowed(store):
    from slurm_ext.agentapi import GpuResetAnswer
    from slurm_ext.repair import flow
    held = lambda node, gpu: GpuResetAnswer(gpu, False, False, "", "", (12,))  # noqa: E731
    record, requeued = _running(store, "act"), []
    seen = _seen(store, reset=held, requeued=requeued)
    seen.jobs = {"n1": [Job(12, "train", "ann", "RUNNING", "n1")]}  # Slurm runs it there
    flow.advance(record, seen)  # asks
    flow.advance(record, seen)  # the answer: job 12 holds gpu 2
    assert (record.state, record.step, record.detail["waiting_for"]) == ("running", "act", [12])
    assert requeued == []
    messages = [e.message for e in store.events(record=record.id)]
    assert "asked n1's agent to reset gpu 2" in messages
    assert any("waiting for jobs [12] holding gpu 2 to end" in m for m in messages)

    other, requeued = _running(store, "act"), []
    seen = _seen(store, reset=held, requeued=requeued, requeue=True)
    seen.jobs = {"n1": [Job(12, "train", "ann", "RUNNING", "n1")]}
    flow.advance(other, seen)
    flow.advance(other, seen)
    assert requeued == [[12]] and other.detail["requeued"] == [12]


def test_a_reset_is_verified_on_a_reading_taken_after_it_not_on_one_from_before(store):
    """The pass that reset the GPU asked the agent for no health: a reading the agent wrote before the reset (its
    finding still open) is not taken for the verdict; the one after it is."""
    from slurm_ext.repair import flow
    record = _running(store, "verify", back_at=1000.0)
    answers = iter([None, _answer(5.0, critical=True), _answer(6.0, critical=False)])
    seen = _seen(store, health=lambda name: next(answers))
    flow.advance(record, seen)
    assert (record.state, record.step) == ("running", "verify") and "first_reading" not in record.detail
    flow.advance(record, seen)
    assert (record.state, record.step, record.detail["first_reading"]) == ("running", "verify", 5.0)
    flow.advance(record, seen)
    assert (record.state, record.step, seen.slurm.resumed) == ("done", "resume", ["n1"]), record.note


def test_a_reset_already_running_on_the_node_is_asked_again_not_failed(store):
    """The review of 29.3: after a controller restart in the middle of a reset, the controller asks again and the
    node answers 409 (one is running); that failed the repair and recommended a reboot while the first reset could
    still succeed. A 409 is asked again next pass."""
    from slurm_ext.agentapi import AgentAnswerError, GpuResetAnswer
    from slurm_ext.repair import flow
    answers = [AgentAnswerError("n1", "127.0.0.1:9810", "HTTP 409: a GPU reset is running on this node", 409),
               GpuResetAnswer(2, True, True, "nvidia-smi --gpu-reset -i 2", "GPU reset", ())]

    def reset(node, gpu):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer
    record = _running(store, "act", acted_at=990.0)  # asked before the restart
    seen = _seen(store, reset=reset, requeued=[])
    flow.advance(record, seen)  # asks: 409
    flow.advance(record, seen)  # the 409: asked again next pass, not failed
    assert (record.state, record.step) == ("running", "act"), record.note
    flow.advance(record, seen)  # asks again
    flow.advance(record, seen)  # reset
    assert (record.state, record.step) == ("running", "verify")


def test_a_job_slurm_no_longer_runs_does_not_hold_the_reset(store):
    """The review of 29.3: the node's agent names the jobs its job records say hold the GPU, and a record outlives a
    job whose Epilog never ran. A job Slurm does not list on the node (seen.jobs, this pass's squeue) is neither
    waited for until drain_deadline nor requeued (Slurm refuses to requeue a finished job): the reset is asked again,
    and a job Slurm runs still holds it."""
    from slurm_ext.agentapi import GpuResetAnswer
    from slurm_ext.repair import flow
    answers = [GpuResetAnswer(2, False, False, "", "", (12, 13)),
               GpuResetAnswer(2, True, True, "nvidia-smi --gpu-reset -i 2", "GPU reset", ())]
    record, requeued = _running(store, "act"), []
    seen = _seen(store, reset=lambda node, gpu: answers.pop(0), requeued=requeued, requeue=True, now=5000.0)
    seen.jobs = {"n1": [Job(13, "train", "ann", "RUNNING", "n1")]}
    flow.advance(record, seen)  # asks
    flow.advance(record, seen)  # held by 12 (gone from Slurm) and 13 (running): 13 alone is requeued
    assert requeued == [[13]] and record.detail["requeued"] == [13], record.detail
    messages = [e.message for e in store.events(record=record.id)]
    assert any("job records of jobs [12] that Slurm no longer runs on n1" in m for m in messages), messages
    seen.jobs = {"n1": []}  # 13 requeued: Slurm runs nothing there now
    flow.advance(record, seen)  # asks again
    flow.advance(record, seen)
    assert (record.state, record.step) == ("running", "verify"), record.note


def test_a_stale_job_record_alone_holds_no_gpu_reset_on_the_node(tmp_path):
    """The node's agent: a job record older than STARTING_GRACE whose job has no slurmstepd on the node (its Epilog
    never ran) does not hold the GPU; a young record (a job in its Prolog) still does. Real
    files, a real reset tool (/bin/true), real /proc."""
    import json
    import time

    from slurm_ext.health.gpureset import reset_gpu
    from slurm_ext.health.settings import HealthSection
    from slurm_ext.prolog_epilog.jobrecord import JobRecord, write
    state = tmp_path / "state"
    state.mkdir()
    readings = tmp_path / "readings.json"
    readings.write_text(json.dumps({"gpus": [{"gpu": {"index": i}} for i in range(4)]}))
    health = HealthSection(gpu_reset_command=["/bin/true", "{gpu}"])
    old = time.time() - 3600
    write(JobRecord(424242, 0, 0, "root", "n1", (2,), old, ()), str(state))  # no such job runs here
    outcome = reset_gpu(health, str(state), readings, 2)
    assert outcome.ran and outcome.ok and outcome.held_by == (), outcome
    write(JobRecord(424243, 0, 0, "root", "n1", (1,), time.time(), ()), str(state))  # in its Prolog
    outcome = reset_gpu(health, str(state), readings, 1)
    assert not outcome.ran and outcome.held_by == (424243,), outcome


def test_a_gpu_the_node_says_is_held_by_jobs_slurm_does_not_run_fails_the_repair_past_the_drain_deadline(store):
    """The review of 29: the node's agent counts a job record with a live slurmstepd (or one younger than
    STARTING_GRACE) as holding the GPU, and refuses the reset; Slurm may list none of those jobs (a slurmstepd hung
    past its job's end). The reset is asked again each pass, but not forever: past repair.drain_deadline after the
    drain the repair fails, as for jobs Slurm runs, and the node stays drained (it was never a dead end before)."""
    from slurm_ext.agentapi import GpuResetAnswer
    from slurm_ext.repair import flow
    held = lambda node, gpu: GpuResetAnswer(gpu, False, False, "", "", (12,))  # noqa: E731
    record = _running(store, "act")
    seen = _seen(store, reset=held, requeued=[], requeue=True, drain_deadline=600.0, now=1000.0)
    seen.jobs = {"n1": []}  # Slurm runs nothing there
    flow.advance(record, seen)  # asks
    flow.advance(record, seen)  # held by job 12, which Slurm does not list: asked again, waited for
    assert (record.state, record.step) == ("running", "act"), record.note
    late = _seen(store, reset=held, requeued=[], requeue=True, drain_deadline=600.0, now=2000.0)
    late.jobs = {"n1": []}
    for _ in range(2):
        flow.advance(record, late)  # asks again; held still, 1050 s after the drain
    assert record.state == "failed", (record.state, record.step, record.note)
    assert "jobs [12] holding gpu 2" in record.note and "drain_deadline" in record.note, record.note
