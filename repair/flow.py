"""An approved repair, step by step: drain, wait for jobs, act, wait for the node, verify, resume.

`advance(record, seen)` moves one repair on as far as what the service saw
in this pass allows, and saves every step to the store before it acts, so
a controller agent killed at any point carries on from the record: a step
whose action is safe to repeat (drain, `scontrol reboot`, resume) is
repeated, one that is not (an executor's command) is never run twice: its
outcome unknown, the repair fails and says so.

Every step is stamped with the moment it happens, read from the clock when
the step runs (not once per pass: a pass reads Slurm and the agents for
seconds while a node reboots), and a step that acts on the node is stamped
before its action and says which (`Event.acts`): what Slurm and the node's
agent record of it comes later, in whole seconds, and the history lists it
after the step that caused it.

A reboot goes through Slurm: once the node is drained and its jobs have
ended, `scontrol reboot NODE` runs its RebootProgram, and the node comes
back still drained with our reason; it is resumed only once its own health
checks pass after the boot. (`scontrol reboot ASAP nextstate=RESUME` would
put it back in service as soon as it registers, before any check, and
nextstate=DOWN does too under ReturnToService=2: seen on Slurm 22.05.)

A GPU reset (reset-gpu) resets the one GPU its finding names, on the node,
while the node stays drained: it waits only for the jobs holding that GPU
(the node's agent names them when asked to reset it, and resets nothing
then; with repair.requeue they are requeued), so the jobs on the node's
other GPUs run on. The controller asks the node's agent (POST
/health/reset-gpu, with the agent credential), which runs
health.gpu_reset_command and clears that GPU's findings; the node's own
checks must then pass on a reading taken after the reset before it is
resumed. A reset that fails or does not clear the fault leaves the node
drained, and a reboot is recommended in its place.

Where [acceptance] is on, passing health checks is not enough: the node
must also pass an acceptance run taken after the action, on the boot it
runs now, of at least the level the repair calls for (after_repair;
after_reset for a GPU reset or a reprovision). The at-start run of the
boot a reboot gave it does; else the flow asks the node's agent for one,
once (POST /acceptance/run, trigger repair), and waits for it within
repair.verify_timeout. (After a GPU reset, whose repair let the jobs on
the node's other GPUs run on, it asks once they have ended: the tests
load every GPU.) A fail or a test that could not run fails the
repair, and the node stays drained: never resumed on a bad or an
unmeasured answer.
"""

from __future__ import annotations

import logging
import re
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Callable

from slurm_ext import nodestate
from slurm_ext.agentapi import ACCEPTANCE_LEVELS, AcceptanceAnswer, AgentAnswerError, GpuResetAnswer, HealthAnswer
from slurm_ext.errors import SlurmExtError, SlurmTooOld
from slurm_ext.slurm import Job, Node, SlurmClient

from .executors import ExecutorFailed, Outcome
from .settings import RepairSection
from .store import Record, Store
from .executors import OUTPUT_LIMIT

__all__ = ["Seen", "advance", "acceptance_trigger", "acceptance_level", "STEPS", "REBOOT_FLAGS"]

log = logging.getLogger("repair")

#: the steps of a running repair, in order
STEPS = ("drain", "wait-jobs", "act", "wait-boot", "verify", "resume")
#: Slurm's flags while a reboot it was asked for is pending or under way
REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})


@dataclass
class Seen:
    """What one pass of the service saw, and what a step may act with."""

    slurm: SlurmClient
    store: Store
    settings: RepairSection
    #: every node, by name, from one Slurm query
    nodes: dict[str, Node]
    #: node -> the jobs on it, from one squeue
    jobs: dict[str, list[Job]]
    #: node -> its agent's /health answer, or None when it gives none to believe
    health: Callable[[str], HealthAnswer | None]
    #: start an executor's action on a thread: (action, node) -> Future of its Outcome
    start_action: Callable[[str, str], Future]
    #: record id -> the executor action running for it (this process's)
    actions: dict[int, Future]
    #: the journal's emitter
    emit: Callable[..., object]
    #: the time now (epoch seconds), read when a step happens: its stamp and its deadlines
    clock: Callable[[], float]
    #: ask a node's agent to reset one of its GPUs on a thread: (node, gpu) -> Future of its GpuResetAnswer
    reset_gpu: Callable[[str, int], Future] | None = None
    #: the controller's [acceptance] section (config.acceptance); None or enabled false: no acceptance before a resume
    accept: object | None = None
    #: node -> its agent's /acceptance answer (None: none to believe), for the repairs `acceptance_trigger` names; a
    #: node not in it was not asked in this pass
    acceptance: dict[str, AcceptanceAnswer | None] = field(default_factory=dict)
    #: ask a node's agent for an acceptance run on a thread: (node, level) -> Future of True (it started) or False
    #: (refused: another run holds the node, or its acceptance is off)
    run_acceptance: Callable[[str, str], Future] | None = None


def advance(record: Record, seen: Seen) -> None:
    """Move `record` (approved or running) on; every step is saved and is an event."""
    if record.state == "approved":
        record.state, record.step = "running", "drain"
        _save(record, seen, seen.clock(), "repair-step", f"{record.action} started (approved by {record.decided_by})"
              + (" as a dry run: nothing is done to the node" if seen.settings.dry_run else ""))
    for _ in STEPS:  # as many steps as this pass allows, each saved before the next
        step = record.step
        if step not in _STEP:
            _fail(record, seen, f"its record names step {step!r}, which this slurm-ext does not know (written by "
                                "another version?)", touch_node=False)
            return
        try:
            _STEP[step](record, seen)
        except (nodestate.HeldByOthers, ExecutorFailed) as err:
            _fail(record, seen, str(err), touch_node=isinstance(err, ExecutorFailed))
        except SlurmTooOld as err:  # the configuration asks what this Slurm lacks: found before the drain
            _fail_untouched(record, seen, str(err))
        except SlurmExtError as err:  # Slurm or the store did not answer: the same step again next pass
            log.warning("repair of %s: step %s: %s (tried again next pass)", record.node, step, err)
            return
        if record.state != "running" or record.step == step:
            return


def _node(record: Record, seen: Seen) -> Node | None:
    node = seen.nodes.get(record.node)
    if node is None:
        _fail(record, seen, f"node {record.node} is no longer known to slurmctld", touch_node=False)
    return node


def _reason(record: Record) -> str:
    return nodestate.repair_reason(record.action, f"{record.signature} {record.evidence}", record.decided_by)


def _drain(record: Record, seen: Seen) -> None:
    node = _node(record, seen)
    if node is None:
        return
    if record.action == "reboot":  # a reboot this Slurm cannot do fails before the drain and the wait for jobs
        seen.slurm.check_reboot_action(seen.settings.reboot_action)
    record.detail["reason"] = _reason(record)
    now = seen.clock()
    if seen.settings.dry_run:
        record.step = "wait-jobs"
        _save(record, seen, now, "repair-step", f"dry run: would drain {record.node}: {record.detail['reason']!r}")
        return
    _drain_now(record, seen, node)
    record.step, record.detail["drained_at"] = "wait-jobs", now
    _save(record, seen, now, "repair-step", f"drained {record.node}: {record.detail['reason']!r}", acts="drain")


def _drain_now(record: Record, seen: Seen, node: Node) -> None:
    """Drain with the repair's reason, and let the rest of this pass see the node so (its snapshot is older)."""
    nodestate.drain_for_repair(seen.slurm, node, record.detail["reason"])
    seen.nodes[record.node] = replace(node, flags=node.flags | {"DRAIN"}, reason=record.detail["reason"])


def _wait_jobs(record: Record, seen: Seen) -> None:
    running = sorted(j.job_id for j in seen.jobs.get(record.node, []) if not j.finished)
    now = seen.clock()
    if seen.settings.dry_run:
        record.step = "act"
        _save(record, seen, now, "repair-step", f"dry run: would wait for jobs {running or 'none'}")
        return
    node = _node(record, seen)
    if node is None:
        return
    if not (node.drained and nodestate.is_repair_reason(node.reason)):  # lifted meanwhile (a slurmctld restarted
        # from older state, or someone resumed it): drained again, or failed when someone else's reason holds it
        _drain_now(record, seen, node)
        _save(record, seen, now, "repair-step", f"drained {record.node} again: it showed {node.reason or 'no drain'!r} "
                                                "while its repair waited for its jobs", acts="drain")
        return
    if record.action == "reset-gpu":  # the jobs on the node's other GPUs run on
        record.step = "act"
        _save(record, seen, now, "repair-step", f"waits only for the jobs holding gpu {record.detail.get('gpu')}, "
                                                "which the node's agent names when asked to reset it")
        return
    if running and seen.settings.requeue and not record.detail.get("requeued"):
        answer = seen.slurm.requeue(running)
        record.detail["requeued"] = running
        said = f"requeued the node's jobs {running}" + (f": {answer}" if answer else "")
        _save(record, seen, now, "repair-step", said, acts="requeue")
        return
    if not running:
        record.step = "act"
        _save(record, seen, now, "repair-step", "the node's jobs have ended")
        return
    _wait_or_fail(record, seen, now, running, "")


def _act(record: Record, seen: Seen) -> None:
    node = _node(record, seen)
    if node is None:
        return
    now = seen.clock()
    if seen.settings.dry_run:
        record.state, record.closed, record.detail["dry_run"] = "done", now, True
        _save(record, seen, now, "repair-done", f"dry run: would {record.action} {record.node}; nothing was done")
        return
    if record.action == "reboot":
        _reboot(record, seen, node, now)
        return
    if record.action == "reset-gpu":
        _reset_gpu(record, seen, now)
        return
    running = seen.actions.get(record.id)
    if running is None:
        if "acted_at" in record.detail:
            raise ExecutorFailed(f"the controller agent restarted while {record.action} ran through the executor; "
                                 "its outcome is unknown and it is not run twice: check the node, then resume it or "
                                 "approve a new repair")
        record.detail["acted_at"] = now
        record.detail["slurmd_before"] = node.slurmd_start.timestamp() if node.slurmd_start else 0.0
        _save(record, seen, now, "repair-step", f"{record.action} of {record.node} handed to the "
                                                f"{seen.settings.executor} executor", acts="executor")
        seen.actions[record.id] = seen.start_action(record.action, record.node)
        return
    if not running.done():
        return
    outcome: Outcome = running.result()  # ExecutorFailed propagates to advance
    said = f"{outcome.summary}" + (f"; it printed: {outcome.output[-500:]}" if outcome.output else "")
    if record.action == "remove":
        record.state, record.closed = "done", now
        _save(record, seen, now, "repair-done", f"removed {record.node} from the pool: {said}; it stays drained with "
                                                "our reason")
    else:
        record.step = "wait-boot"
        _save(record, seen, now, "repair-step", f"{record.action} done: {said}")
    del seen.actions[record.id]  # only once its outcome is saved: a failed save tries again next pass


def _reboot(record: Record, seen: Seen, node: Node, now: float) -> None:
    """`scontrol reboot`, stamped with the moment before it: Slurm's reboot events and the agent's stop and start
    follow it (in whole seconds, maybe the same one)."""
    if "acted_at" not in record.detail:  # saved before the command: a restart re-issues it (harmless)
        record.detail["acted_at"] = now
        record.detail["boot_before"] = node.boot_time.timestamp() if node.boot_time else 0.0
        _save(record, seen, now)
    action = seen.settings.reboot_action
    try:
        seen.slurm.reboot(record.node, action)
    except SlurmTooOld as err:  # the configuration's, not a Slurm away: asked again it would say the same
        raise ExecutorFailed(str(err)) from None
    record.step = "wait-boot"
    how = f"action={action} {record.node}: Slurm runs PowerAction {action}" if action else \
        f"{record.node}: Slurm reboots it through its RebootProgram"
    _save(record, seen, now, "repair-step", f"scontrol reboot {how}; it stays drained", acts="reboot")


def _reset_gpu(record: Record, seen: Seen, now: float) -> None:
    """Ask the node's agent to reset the record's GPU; while jobs hold it, wait for them (or requeue them) and ask
    again next pass; once reset, its checks are verified as after a reboot."""
    gpu = record.detail.get("gpu")
    if not isinstance(gpu, int) or seen.reset_gpu is None:
        raise ExecutorFailed(f"no GPU to reset: the finding {record.signature} names none (approve a reboot)")
    running = seen.actions.get(record.id)
    if running is None:
        first = "acted_at" not in record.detail
        record.detail.setdefault("acted_at", now)
        if first:  # said once; asked again each pass while jobs hold the GPU
            _save(record, seen, now, "repair-step", f"asked {record.node}'s agent to reset gpu {gpu}",
                  acts="reset-gpu")
        seen.actions[record.id] = seen.reset_gpu(record.node, gpu)
        return
    if not running.done():
        return
    del seen.actions[record.id]
    try:
        answer: GpuResetAnswer = running.result()
    except AgentAnswerError as err:
        if err.status == 409:  # a reset runs there already (asked before this service restarted): ask again
            return
        raise ExecutorFailed(f"the reset of gpu {gpu} was not done: {err}") from None
    if answer.held_by:
        jobs = _slurm_runs(record, seen, now, gpu, answer.held_by)
        if jobs:
            _wait_for_gpu_jobs(record, seen, now, gpu, jobs)
        else:  # the node still counts them (a live slurmstepd, a record in its Prolog's grace): asked again each
            # pass, and waited for no longer than jobs Slurm runs
            _wait_or_fail(record, seen, now, sorted(answer.held_by), f" holding gpu {gpu} (on the node; Slurm "
                                                                      "lists none of them)")
        return
    said = f"{answer.command}" + (f": {answer.output[-OUTPUT_LIMIT:]}" if answer.output else "")
    if not answer.ok:
        raise ExecutorFailed(f"the reset of gpu {gpu} failed: {said}")
    record.step, record.detail["back_at"] = "verify", now
    _save(record, seen, now, "repair-step", f"gpu {gpu} of {record.node} reset: {said}; its health checks run")


def _slurm_runs(record: Record, seen: Seen, now: float, gpu: int, held_by) -> list[int]:
    """Of the jobs the node's agent says hold the GPU (its job records), those Slurm runs on the node now (this pass's
    squeue). A record outlives a job whose Epilog never ran: such a job is not requeued (Slurm refuses to requeue a
    finished one), and the reset is asked again each pass (the agent drops a record with no slurmstepd); said once."""
    runs = {job.job_id for job in seen.jobs.get(record.node, []) if not job.finished}
    jobs = sorted(job for job in held_by if job in runs)
    gone = sorted(job for job in held_by if job not in runs)
    if gone and record.detail.get("not_running") != gone:
        record.detail["not_running"] = gone
        _save(record, seen, now, "repair-step", f"gpu {gpu}'s job records of jobs {gone} that Slurm no longer runs on "
                                                f"{record.node}: not requeued; the reset is asked again each pass")
    return jobs


def _wait_for_gpu_jobs(record: Record, seen: Seen, now: float, gpu: int, jobs: list[int]) -> None:
    """Jobs Slurm runs hold the GPU to reset: requeued where repair.requeue says so, else waited for until
    drain_deadline."""
    if seen.settings.requeue and record.detail.get("requeued") != jobs:
        answer = seen.slurm.requeue(jobs)
        record.detail["requeued"] = jobs
        _save(record, seen, now, "repair-step", f"requeued jobs {jobs} holding gpu {gpu}"
              + (f": {answer}" if answer else ""), acts="requeue")
        return
    _wait_or_fail(record, seen, now, jobs, f" holding gpu {gpu}")


def _wait_or_fail(record: Record, seen: Seen, now: float, jobs: list[int], holding: str) -> None:
    """Jobs `holding` what the repair needs (the node, or " holding gpu N") are waited for until
    repair.drain_deadline after the drain, said once per set of jobs; past it, the repair fails and the node stays
    drained."""
    drained_at = record.detail.get("drained_at", now)
    if now - drained_at > seen.settings.drain_deadline:
        _fail(record, seen, f"jobs {jobs}{holding} still run {now - drained_at:.0f}s after the drain "
                            f"(repair.drain_deadline {seen.settings.drain_deadline:g}s); the node stays drained")
    elif record.detail.get("waiting_for") != jobs:
        record.detail["waiting_for"] = jobs
        _save(record, seen, now, "repair-step", f"waiting for jobs {jobs}{holding} to end (until "
                                                f"{seen.settings.drain_deadline:g}s after the drain)")


def _wait_boot(record: Record, seen: Seen) -> None:
    node = _node(record, seen)
    if node is None:
        return
    now = seen.clock()
    acted_at = record.detail.get("acted_at", now)
    if record.action == "reboot":
        booted = node.boot_time and node.boot_time.timestamp() > record.detail.get("boot_before", 0.0)
        back = booted and not node.flags & REBOOT_FLAGS and "NOT_RESPONDING" not in node.flags
    else:
        started = node.slurmd_start and node.slurmd_start.timestamp() > record.detail.get("slurmd_before", 0.0)
        back = started and "NOT_RESPONDING" not in node.flags
    if back:
        record.step, record.detail["back_at"] = "verify", now
        _save(record, seen, now, "repair-step", f"{record.node} is back (boot time {node.boot_time}), its health "
                                                "checks run")
        return
    timed_out = "reboot timed out" in node.reason
    if timed_out or now - acted_at > seen.settings.boot_timeout:
        why = ("Slurm gave up on its reboot (ResumeTimeout)" if timed_out
               else f"not back {now - acted_at:.0f}s after the {record.action} (repair.boot_timeout)")
        _fail(record, seen, f"{record.node} did not come back: {why}")


def _verify(record: Record, seen: Seen) -> None:
    if "checks_passed" in record.detail:
        _accept(record, seen)
        return
    answer = seen.health(record.node)
    now = seen.clock()
    back_at = record.detail.get("back_at", now)
    if answer is None and record.action == "reset-gpu" and "first_reading" not in record.detail:
        # the pass that reset the GPU asked its agent for no health: the reading compared from is one the agent
        # gives after the reset (its findings then cleared), and the verdict a reading newer than that
        if now - back_at > seen.settings.verify_timeout:
            _fail(record, seen, f"no health verdict {now - back_at:.0f}s after the reset (its agent does not "
                                "answer; repair.verify_timeout)")
        return
    monitor = answer.monitor if answer is not None else None
    # a reading newer than the first one seen in this step, both on the node's own clock and of the same boot:
    # taken after it came back (a node that booted again meanwhile starts the comparison over)
    reading = monitor.readings_time if monitor is not None else 0.0
    boot = answer.boot if answer is not None else ""
    known_boot = record.detail.get("verify_boot", "")
    if "first_reading" not in record.detail or (boot and known_boot and boot != known_boot):
        record.detail["first_reading"], record.detail["verify_boot"] = reading, boot
        _save(record, seen, now)
        return
    if boot and not known_boot:  # the agent's first answer of this step: its boot is the one compared from now on
        record.detail["verify_boot"] = boot
    fresh = reading > record.detail["first_reading"]
    if fresh:
        critical = monitor.critical()
        if critical:
            _fail(record, seen, "its health checks fail after the repair: " + "; ".join(
                f"{f.get('check')} {f.get('evidence')}" for f in critical))
            return
        level = acceptance_level(record, seen.accept)
        if level:
            record.detail["checks_passed"], record.detail["accept_level"] = now, level
            _save(record, seen, now, "repair-step", f"{record.node}'s health checks pass after the {record.action}; "
                                                    f"its acceptance {level} must pass before the resume")
            _accept(record, seen)
            return
        record.step = "resume"
        _save(record, seen, now, "repair-step", f"{record.node}'s health checks pass after the {record.action}")
        return
    if now - back_at > seen.settings.verify_timeout:
        why = "its agent does not answer" if answer is None else "its health monitor has not read it since"
        _fail(record, seen, f"no health verdict {now - back_at:.0f}s after it came back ({why}; "
                            "repair.verify_timeout)")


def acceptance_level(record: Record, accept) -> str:
    """The acceptance level a node repaired by the record's action must pass before its resume, "" when none:
    [acceptance] of the controller's config (`accept`), taken as the cluster's (one config for every node: the dev
    cluster's, a Slinky chart's); a node whose own says enabled = false refuses the run, and its repair fails saying
    so. A repair of a failed acceptance run (its evidence "acceptance standard: ...") needs at least that run's
    level: a quick pass proves nothing of a test only the standard level runs (a burn, NCCL)."""
    if accept is None or not getattr(accept, "enabled", False):
        return ""
    level = accept.after_reset if record.action in ("reset-gpu", "reprovision") else accept.after_repair
    failed = _FAILED_LEVEL.match(record.evidence or "")
    if failed and ACCEPTANCE_LEVELS.index(failed.group(1)) > ACCEPTANCE_LEVELS.index(level):
        return failed.group(1)
    return level


#: the level of the failed acceptance run a repair's evidence names (recommend.fault_of writes it so)
_FAILED_LEVEL = re.compile(r"acceptance (" + "|".join(ACCEPTANCE_LEVELS) + r"):")


def acceptance_trigger(record: Record, accept) -> str | None:
    """Which kept run of the node this pass needs from its agent (GET /acceptance?trigger=): "" its last run of any
    trigger, "repair" the run the flow asked for; None: no acceptance answer needed (not in verify, or none wanted)."""
    if record.state != "running" or record.step != "verify" or not acceptance_level(record, accept):
        return None
    return "repair" if "accept_asked" in record.detail else ""


#: the kept runs that can prove a repaired node: its at-start run, and the run a repair asked for
_PROVING = ("start", "repair")


def _proves(run: dict | None, boot: str, since: float, level: str) -> bool:
    """Whether `run` proves the node as it is now: ended, of its current boot, started after the action (`since`),
    at `level` or a longer one. The run's times are the node's clock and `since` the controller's: they are taken
    to agree within the seconds between an action and its node's next run (NTP; the dev cluster's one host)."""
    return (run is not None and run["trigger"] in _PROVING and bool(boot) and run["boot_id"] == boot
            and run["finished"] > 0 and run["started"] >= since
            and ACCEPTANCE_LEVELS.index(run["level"]) >= ACCEPTANCE_LEVELS.index(level))


def _accept(record: Record, seen: Seen) -> None:
    """The node's health checks passed: its acceptance run decides. A run that proves it (`_proves`) passes, fails
    or could not run; without one, the node's agent is asked for one, once, and waited for."""
    now = seen.clock()
    level = record.detail["accept_level"]
    # after a reset the boot is the same: its at-start run came before the reset and proves nothing of the GPU now
    since = record.detail.get("back_at" if record.action == "reset-gpu" else "acted_at", 0.0)
    asking = seen.actions.get(record.id)
    if asking is not None:
        if asking.done():
            del seen.actions[record.id]
            _asked(record, seen, now, level, asking)
        return
    if record.node not in seen.acceptance:
        return  # not asked in this pass (its health checks passed in it): the next pass asks
    answer = seen.acceptance[record.node]
    if answer is not None and not answer.enabled:
        _fail(record, seen, f"[acceptance] enabled is true on the controller and false on {record.node}: it cannot "
                            "prove itself after the repair (one [acceptance] for the whole cluster: turn it on there, "
                            "or off on the controller)")
        return
    if answer is not None and _proves(answer.run, answer.boot, since, level):
        _judge(record, seen, now, answer.run)
        return
    if answer is not None and not answer.running and "accept_asked" not in record.detail:
        jobs = sorted(j.job_id for j in seen.jobs.get(record.node, []) if not j.finished)
        if jobs:  # after a GPU reset the jobs on the node's other GPUs ran on; the tests load every GPU
            _wait_or_fail(record, seen, now, jobs, " on its other GPUs (its acceptance tests load every GPU)")
            return
        record.detail["accept_asked"] = now  # saved before the ask: a restarted controller does not ask twice
        if "accept_first_asked" in record.detail:  # asked again after a refusal (another run held the node): no news
            _save(record, seen, now)
        else:
            record.detail["accept_first_asked"] = now
            _save(record, seen, now, "repair-step", f"asked {record.node}'s agent for an acceptance {level} run (it "
                                                    f"has none of this boot after the {record.action})")
        if seen.run_acceptance is not None:
            seen.actions[record.id] = seen.run_acceptance(record.node, level)
        return
    waited = now - record.detail.get("accept_asked", record.detail["checks_passed"])
    if waited > seen.settings.verify_timeout and not (answer is not None and answer.running):
        why = ("its agent does not answer" if answer is None else
               "no run of it kept" if "accept_asked" in record.detail else "none of this boot after the action")
        since_what = "it was asked for" if "accept_asked" in record.detail else "its health checks passed"
        _fail(record, seen, f"no acceptance {level} verdict {waited:.0f}s after {since_what} ({why}; "
                            "repair.verify_timeout)")


def _asked(record: Record, seen: Seen, now: float, level: str, asking: Future) -> None:
    """The agent's answer to the ask for a run: taken (the run goes on: waited for), refused (another run holds the
    node: asked again once none runs), or none (asked again next pass)."""
    try:
        taken = asking.result()
    except AgentAnswerError as err:
        if err.status:
            _fail(record, seen, f"its agent did not start the acceptance {level} run: {err.problem}")
            return
        log.warning("repair of %s: asking for its acceptance run: %s (asked again next pass)", record.node, err)
        taken = False
    if not taken:
        del record.detail["accept_asked"]
        _save(record, seen, now)
        return
    _save(record, seen, now, "repair-step", f"{record.node}'s agent runs its acceptance {level} tests")


def _judge(record: Record, seen: Seen, now: float, run: dict) -> None:
    """The repair on the proving run's verdict: a pass resumes, a fail or a test that could not run fails it."""
    what = f"acceptance {run['level']} ({run['trigger']} run of this boot)"
    if run["verdict"] == "pass":
        record.step, record.detail["accepted"] = "resume", run["finished"]
        figures = "; ".join(_told(r, _figures(r) or r["message"]) for r in run["results"])
        _save(record, seen, now, "repair-step", f"{record.node} passes its {what}: {len(run['results'])} test(s) "
                                                f"passed: {figures[:OUTPUT_LIMIT]}")
        return
    bad = [r for r in run["results"] if r["outcome"] == run["verdict"]]
    said = "; ".join(_told(r, r["message"]) + (f" [{_figures(r)}]" if _figures(r) and _figures(r) not in r["message"]
                                               else "") for r in bad)
    if run["verdict"] == "fail":
        _fail(record, seen, f"it fails its {what}: {said[:OUTPUT_LIMIT]}; its acceptance drain stays")
    else:
        _fail(record, seen, f"its {what} could not run every test, so nothing proves it fit: "
                            f"{(said or 'no test ran')[:OUTPUT_LIMIT]}")


def _told(result: dict, what: str) -> str:
    """'gpu-memory gpu 1: <what>', the target said once, as the node's acceptance drain says it
    (acceptance.records.Result.told)."""
    target = result["target"]
    where = f"{result['test']} {target}".strip()
    return f"{where}: {what.removeprefix(f'{target}: ') if target else what}"


def _figures(result: dict) -> str:
    """'h2d 55.4 GB/s (>= 48); ...' of a result's figures (acceptance.records.Figure.text)."""
    said = []
    for f in result["figures"]:
        value = "?" if f["value"] is None else f"{f['value']:.4g}"
        limit = "" if f["limit"] is None else f" ({'>=' if f['at_least'] else '<='} {f['limit']:g})"
        said.append(f"{f['name']} {value}{' ' + f['unit'] if f['unit'] else ''}{limit}")
    return "; ".join(said)


def _resume(record: Record, seen: Seen) -> None:
    node = _node(record, seen)
    if node is None:
        return
    now = seen.clock()
    nodestate.resume_after_repair(seen.slurm, node)
    record.state, record.closed = "done", now
    _save(record, seen, now, "repair-done", f"resumed {record.node}: {record.action} done, its checks pass",
          acts="resume")


_STEP = {"drain": _drain, "wait-jobs": _wait_jobs, "act": _act, "wait-boot": _wait_boot, "verify": _verify,
         "resume": _resume}


def _fail(record: Record, seen: Seen, why: str, touch_node: bool = True) -> None:
    """The repair ends failed; the node stays drained, its reason saying so (when it still shows ours)."""
    now = seen.clock()
    node = seen.nodes.get(record.node)
    redrain = touch_node and node is not None and not seen.settings.dry_run and nodestate.is_repair_reason(node.reason)
    record.state, record.closed, record.note = "failed", now, why
    _save(record, seen, now, "repair-failed", f"{record.action} of {record.node} failed at {record.step}: {why}; the "
                                              f"node stays drained: once it is fixed, `scontrol update nodename="
                                              f"{record.node} state=resume` (its health checks drain it again if they "
                                              "still fail)", acts="drain" if redrain else "")
    if redrain:
        failed = nodestate.repair_reason(f"{record.action} failed", why[:120], record.decided_by)
        try:
            nodestate.drain_for_repair(seen.slurm, node, failed)
        except SlurmExtError as err:
            log.warning("repair of %s: cannot re-word its drain to say the repair failed: %s", record.node, err)
    if record.action == "reset-gpu" and redrain:
        _recommend_reboot(record, seen, now)


def _fail_untouched(record: Record, seen: Seen, why: str) -> None:
    """The repair ends failed before it did anything to the node: no drain of its own to keep, and no cooldown (the
    fix is the configuration's; repair.decide skips such a record)."""
    now = seen.clock()
    record.state, record.closed, record.note = "failed", now, why
    record.detail["untouched"] = True
    _save(record, seen, now, "repair-failed", f"{record.action} of {record.node} failed before it began: {why}; "
                                              "nothing was done to the node: once the configuration is fixed, its "
                                              "next recommendation can be approved at once")


def _recommend_reboot(failed: Record, seen: Seen, now: float) -> None:
    """A GPU reset that failed or did not clear the fault: a reboot is recommended for the same fault, kept while the
    failure drains the node (recommend.plan) and approved without waiting for this failure's cooldown."""
    follow = Record(failed.node, failed.signature, "reboot", f"{failed.evidence} (the reset of gpu "
                    f"{failed.detail.get('gpu')} failed)", list(failed.jobs), opened=now, updated=now,
                    detail={"gpu": failed.detail.get("gpu"), "after_failed": failed.id})
    message = f"reboot recommended for {failed.signature}: the reset of gpu {failed.detail.get('gpu')} failed"
    with seen.store.locked():
        seen.store.add(follow)
        seen.store.event(failed.node, "repair-recommended", message, record=follow, now=now)
    seen.emit("repair-recommended", f"node {failed.node}: {message}", node=failed.node, action="reboot",
              signature=failed.signature)


def _save(record: Record, seen: Seen, now: float, event: str = "", message: str = "", acts: str = "") -> None:
    """Save the record and, with `event`, its history row stamped `now`: the moment the step happened, before the
    action it records (`acts`, one of store.ACTS)."""
    record.updated = now
    with seen.store.locked():
        seen.store.save(record)
        if event:
            seen.store.event(record.node, event, message, record.decided_by, record, now, acts)
    if event:
        severity = "error" if event == "repair-failed" else "info"
        seen.emit(event, message, severity, node=record.node, action=record.action, step=record.step)
