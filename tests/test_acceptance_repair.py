"""The repair flow's acceptance before a resume (repair.flow): which run proves a repaired node, the ask for one, and
what a pass, a fail and a test that could not run do to the repair. The records live in a real SQLite store; the
agents' answers are built as the boundary reads them (agentapi.AcceptanceAnswer.of a runner's Run); Slurm's side is a
recorder of the flow's calls (test_acceptance_repair_cluster.py runs the whole thing on a real cluster)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from slurm_ext.acceptance.records import Figure, Result, Run
from slurm_ext.agentapi import AcceptanceAnswer, AgentAnswerError, HealthAnswer, Readings
from slurm_ext.config import from_dict
from slurm_ext.repair.flow import Seen, acceptance_level, acceptance_trigger, advance
from slurm_ext.repair.settings import RepairSection
from slurm_ext.repair.store import Record, open_sqlite
from slurm_ext.slurm import Job, Node

REASON = "slurm-ext: repair reboot: xid/79 79 gpu 1 (approved by alice)"
ON = from_dict({"acceptance": {"enabled": True}}).acceptance
OFF = from_dict({}).acceptance
#: the controller's clock: the action at 100, the node back at 200, now 300
ACTED, BACK, NOW = 100.0, 200.0, 300.0
LINK_PASS = Result("network-links", "network", "lo", "pass", "lo: up", (), 0.1)
MEMORY_FAIL = Result("gpu-memory", "gpu", "gpu 1", "fail", "gpu 1: 3 bad bytes at 0x1000-0x1fff", (
    Figure("memory_bad_bytes", 3.0, "B", 0.0, at_least=False),), 2.0, "reset-gpu")
NO_LIBCUDA = Result("gpu-bandwidth", "gpu", "", "error", "libcuda.so.1 not found: is the NVIDIA driver installed?")


@pytest.fixture
def store(tmp_path):
    opened = open_sqlite(str(tmp_path / "repair.db"))
    yield opened
    opened.close()


class _Slurm:
    def __init__(self):
        self.calls = []

    def drain(self, node, reason):
        self.calls.append(("drain", node, reason))

    def resume(self, node):
        self.calls.append(("resume", node))
        return True


def _verifying(store, action: str = "reboot", **detail) -> Record:
    """A repair at its verify step whose node's health checks are about to pass (a reading newer than the first)."""
    with store.locked():
        return store.add(Record("n1", "xid/79", action, "79 gpu 1", state="running", step="verify", decided_by="alice",
                                opened=1.0, updated=1.0, detail={"reason": REASON, "drained_at": 90.0, "acted_at": ACTED,
                                                                 "back_at": BACK, "first_reading": 250.0,
                                                                 "verify_boot": "boot-2", "gpu": 1, **detail}))


def _answer(*results: Result, trigger: str = "start", boot: str = "boot-2", started: float = 150.0,
            level: str = "quick", running: bool = False, enabled: bool = True, none: bool = False) -> AcceptanceAnswer:
    run = Run("n1", level, trigger, started, started + 3.0, "h200-sxm", list(results), {}, boot)
    return AcceptanceAnswer.of({"node": "n1", "boot": "boot-2", "running": running, "enabled": enabled,
                                "run": None if none else run.to_json()})


def _future(value) -> Future:
    future = Future()
    if isinstance(value, Exception):
        future.set_exception(value)
    else:
        future.set_result(value)
    return future


def _seen(store, answer: AcceptanceAnswer | None, accept=ON, asked=None, ask=True, now=NOW, actions=None,
          **settings) -> Seen:
    """One pass that saw the node's health pass (a reading at 260 of boot-2) and its acceptance `answer`."""
    health = HealthAnswer("n1", "boot-2", 260.0, Readings(260.0, (), {}, "", ()), {})
    node = Node("n1", "IDLE", frozenset({"DRAIN"}), REASON, "root", gres="gpu:h200:4")
    seen = Seen(_Slurm(), store, RepairSection(**settings), {"n1": node}, {}, lambda name: health, None,
                {} if actions is None else actions, lambda *a, **k: None, lambda: now, None, accept,
                {"n1": answer}, None)
    if asked is not None:
        seen.run_acceptance = lambda node, level: asked.append((node, level)) or _future(ask)
    return seen


def _steps(store, record: Record) -> list[str]:
    return [f"{e.event}: {e.message}" for e in store.events(record=record.id)]


def _of(action: str, evidence: str = "79 gpu 1") -> Record:
    return Record("n1", "xid/79", action, evidence)


def test_the_level_is_after_repair_or_after_reset_and_none_when_acceptance_is_off():
    assert [acceptance_level(_of(a), ON) for a in ("reboot", "reset-gpu", "reprovision", "remove")] == \
        ["quick", "standard", "standard", "quick"]
    assert acceptance_level(_of("reboot"), OFF) == "" and acceptance_level(_of("reboot"), None) == ""


def test_a_repair_of_a_failed_acceptance_needs_at_least_that_run_s_level():
    """A reboot for a standard run's failed burn must not resume on a quick pass, which runs no burn."""
    burn = "acceptance standard: gpu-burn gpu 2: burn_sm_clock_mhz 900 MHz (>= 1200)"
    assert acceptance_level(_of("reboot", burn), ON) == "standard"
    assert acceptance_level(_of("reboot", "acceptance quick: gpu-memory gpu 1: 1 bad word"), ON) == "quick"
    assert acceptance_level(_of("reboot", "acceptance extended: gpu-memory gpu 1: 1 bad word"), ON) == "extended"
    assert acceptance_level(_of("reboot", burn), OFF) == ""


def test_acceptance_off_resumes_on_the_health_checks_as_before(store):
    record = _verifying(store)
    seen = _seen(store, None, accept=OFF)
    advance(record, seen)
    assert (record.state, seen.slurm.calls) == ("done", [("resume", "n1")])


def test_the_start_run_of_the_new_boot_proves_a_rebooted_node(store):
    record = _verifying(store)
    seen = _seen(store, _answer(LINK_PASS), asked=[])
    advance(record, seen)
    assert (record.state, seen.slurm.calls) == ("done", [("resume", "n1")])
    steps = _steps(store, record)
    assert "repair-step: n1's health checks pass after the reboot; its acceptance quick must pass before the " \
           "resume" in steps
    assert "repair-step: n1 passes its acceptance quick (start run of this boot): 1 test(s) passed: network-links " \
           "lo: up" in steps


def test_a_fail_fails_the_repair_with_the_test_the_target_and_the_figures_and_the_node_stays_drained(store):
    record = _verifying(store)
    seen = _seen(store, _answer(LINK_PASS, MEMORY_FAIL))
    advance(record, seen)
    assert record.state == "failed" and ("resume", "n1") not in seen.slurm.calls
    assert record.note == ("it fails its acceptance quick (start run of this boot): gpu-memory gpu 1: 3 bad bytes at "
                           "0x1000-0x1fff [memory_bad_bytes 3 B (<= 0)]; its acceptance drain stays")
    assert seen.slurm.calls == [("drain", "n1", "slurm-ext: repair reboot failed: " + record.note[:120].strip()
                                 + " (approved by alice)")]
    assert _steps(store, record)[-1].startswith("repair-failed: reboot of n1 failed at verify: it fails its acceptance")


def test_a_test_that_could_not_run_fails_the_repair_never_resumed_unmeasured(store):
    record = _verifying(store)
    seen = _seen(store, _answer(LINK_PASS, NO_LIBCUDA))
    advance(record, seen)
    assert record.state == "failed" and ("resume", "n1") not in seen.slurm.calls
    assert "could not run every test, so nothing proves it fit: gpu-bandwidth: libcuda.so.1 not found" in record.note


@pytest.mark.parametrize("answer, why", [
    (_answer(LINK_PASS, boot="boot-1"), "a run of the boot before the reboot"),
    (_answer(LINK_PASS, started=ACTED - 5), "a run started before the action"),
    (_answer(LINK_PASS, trigger="manual"), "an operator's run"),
    (_answer(LINK_PASS, running=True, none=True), "no run"),
])
def test_without_a_proving_run_the_node_is_asked_for_one_once(store, answer, why):
    record = _verifying(store)
    asked = []
    seen = _seen(store, answer, asked=asked)
    advance(record, seen)
    if answer.running:  # a run the agent was asked for is under way (another asker's): waited for, not asked
        assert asked == [] and record.state == "running"
        return
    assert asked == [("n1", "quick")] and record.detail["accept_asked"] == NOW, why
    assert _steps(store, record)[-1] == ("repair-step: asked n1's agent for an acceptance quick run (it has none of "
                                         "this boot after the reboot)")
    assert acceptance_trigger(record, ON) == "repair"
    advance(record, seen)  # the ask's answer: taken
    assert _steps(store, record)[-1] == "repair-step: n1's agent runs its acceptance quick tests"
    seen.acceptance["n1"] = _answer(LINK_PASS, running=True, none=True)
    advance(record, seen)
    assert asked == [("n1", "quick")] and record.state == "running"  # not asked twice
    seen.acceptance["n1"] = _answer(LINK_PASS, trigger="repair", started=NOW + 1)
    advance(record, seen)
    assert record.state == "done" and seen.slurm.calls == [("resume", "n1")]


def test_after_a_gpu_reset_the_boots_start_run_proves_nothing_and_the_standard_level_is_asked(store):
    record = _verifying(store, action="reset-gpu")
    asked = []
    seen = _seen(store, _answer(LINK_PASS, started=BACK - 1, level="extended"), asked=asked)
    advance(record, seen)
    assert asked == [("n1", "standard")]
    seen.actions.clear()
    seen.acceptance["n1"] = _answer(LINK_PASS, trigger="repair", started=BACK + 5)  # quick: short of standard
    advance(record, seen)
    assert record.state == "running"
    seen.acceptance["n1"] = _answer(LINK_PASS, trigger="repair", started=BACK + 5, level="standard")
    advance(record, seen)
    assert record.state == "done"


def test_after_a_gpu_reset_the_run_waits_for_the_jobs_on_the_other_gpus(store):
    """A reset-gpu repair lets the jobs on the node's other GPUs run on; its acceptance tests load every GPU, so they
    are asked for once those jobs have ended (or the repair fails at repair.drain_deadline, the node drained)."""
    record = _verifying(store, action="reset-gpu")
    asked = []
    seen = _seen(store, _answer(none=True), asked=asked)
    seen.jobs = {"n1": [Job(7, "train", "bob", "RUNNING", "n1")]}
    advance(record, seen)
    assert asked == [] and record.state == "running"
    assert _steps(store, record)[-1] == ("repair-step: waiting for jobs [7] on its other GPUs (its acceptance tests "
                                         "load every GPU) to end (until 7200s after the drain)")
    seen.jobs = {}
    advance(record, seen)
    assert asked == [("n1", "standard")]
    seen.jobs, seen.clock = {"n1": [Job(8, "train", "bob", "RUNNING", "n1")]}, lambda: 90.0 + 7201
    record2 = _verifying(store, action="reset-gpu")
    advance(record2, seen)
    assert record2.state == "failed" and "jobs [8] on its other GPUs" in record2.note


def test_a_refused_ask_is_asked_again_and_an_answerless_one_too(store):
    record = _verifying(store)
    asked = []
    seen = _seen(store, _answer(none=True), asked=asked, ask=False)
    advance(record, seen)
    advance(record, seen)  # refused (another run held the node): forgotten
    assert "accept_asked" not in record.detail and asked == [("n1", "quick")]
    seen.run_acceptance = lambda node, level: asked.append(level) or _future(AgentAnswerError("n1", "a", "no answer"))
    advance(record, seen)
    advance(record, seen)
    assert "accept_asked" not in record.detail and asked[-1] == "quick" and record.state == "running"
    seen.run_acceptance = lambda node, level: _future(AgentAnswerError("n1", "a", "HTTP 503: boom", 503))
    advance(record, seen)
    advance(record, seen)
    assert record.state == "failed" and "did not start the acceptance quick run: HTTP 503: boom" in record.note


def test_a_restarted_controller_does_not_ask_twice_and_gives_up_at_verify_timeout(store):
    record = _verifying(store, checks_passed=NOW, accept_level="quick", accept_asked=NOW)
    asked = []
    seen = _seen(store, _answer(none=True), asked=asked, now=NOW + 100)
    advance(record, seen)
    assert asked == [] and record.state == "running"
    seen.clock = lambda: NOW + 301
    advance(record, seen)
    assert record.state == "failed" and asked == []
    assert record.note == ("no acceptance quick verdict 301s after it was asked for (no run of it kept; "
                           "repair.verify_timeout)")


def test_a_node_whose_own_acceptance_is_off_fails_the_repair_saying_so(store):
    record = _verifying(store)
    seen = _seen(store, _answer(none=True, enabled=False), asked=[])
    advance(record, seen)
    assert record.state == "failed" and "[acceptance] enabled is true on the controller and false on n1" in record.note


def test_the_service_asks_the_agents_only_for_repairs_at_verify():
    record = Record("n1", "xid/79", "reboot", "", state="running", step="wait-boot")
    assert acceptance_trigger(record, ON) is None
    record.step = "verify"
    assert acceptance_trigger(record, ON) == "" and acceptance_trigger(record, OFF) is None
