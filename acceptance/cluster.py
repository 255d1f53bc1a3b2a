"""`slurm-ext accept cluster`: every node's acceptance on demand, in a Slurm maintenance reservation.

Run where Slurm's admin tools work (the controller), as a Slurm operator or admin. `accept_cluster`

1. reads the nodes' states: a drained or down node cannot run a job, and is reported "not tested" with its
   reason (never put in the reservation);
2. makes a reservation `slurm-ext-accept-<time>` over the others with Flags=MAINT,IGNORE_JOBS: jobs already
   running there go on to their end (nothing is killed), nothing new but ours starts there;
3. submits one exclusive job per node, at most `batch` in flight, each running the node's own
   `slurm-ext accept run --level L --json --trigger cluster --apply` ([acceptance] job_command, with the
   node's config): a failing node is drained by its own node-state owner, its reason naming the test and
   the GPU, and the repair service recommends from that reason;
4. gives up on a job still pending after `wait_jobs` (a job of someone else still runs there, or the node
   never starts it): cancelled, the node reported "not tested: busy";
5. reads each node's verdict from its job's exit status (0 pass, 1 fail, 3 a test could not run, anything
   else: the job failed) and, where the node's agent answers, its last run of trigger `cluster`;
6. always removes the reservation at the end (errors, SIGINT and SIGTERM too: their handlers only set a
   flag the loop acts on), after cancelling its own jobs when it stops early.

Told in the controller's journal: `acceptance-cluster-started`, `acceptance-cluster-done`. The figures of
every node's run are in its own journal (`slurm-ext history`).
"""

from __future__ import annotations

import math
import os
import pwd
import re
import shlex
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from slurm_ext.config import Config
from slurm_ext.errors import SlurmError, SlurmExtError, SlurmUnreachable
from slurm_ext.slurm import Node, SlurmClient, expand_hostlist

from .records import ERROR, FAIL, PASS

__all__ = ["NOT_TESTED", "JOB_NAME", "ClusterRefused", "NodeOutcome", "ClusterRun", "accept_cluster", "job_minutes",
           "job_script", "submit_node_job"]

#: a node that ran no test: drained, down, busy past --wait-jobs, or the run stopped before its turn
NOT_TESTED = "not-tested"
#: every job of `accept cluster` has this name (squeue --name=slurm-ext-accept lists them)
JOB_NAME = "slurm-ext-accept"
#: how often the jobs' states are read
_POLL = 2.0
#: after cancelling its jobs, how long to wait for them to leave the reservation (Slurm refuses to delete a
#: reservation a job still holds)
_DRAIN_JOBS = 60.0
#: the job states after which a job runs no more (squeue --states=all lists them for MinJobAge)
_ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                    "BOOT_FAIL", "DEADLINE"})
#: a node in one of these states runs no job
_UNFIT = frozenset({"DOWN", "FUTURE", "ERROR"})
_SEVERITY = {PASS: "info", FAIL: "critical", ERROR: "error"}


class ClusterRefused(SlurmExtError):
    """`accept cluster` did not start (unknown nodes, no reservation): nothing of it is left behind."""

    exit_code = 2


class Interrupted(SlurmExtError):
    """SIGINT or SIGTERM: the run stopped, its jobs cancelled and its reservation removed."""


@dataclass(frozen=True, slots=True)
class NodeOutcome:
    """One node's end in a cluster run."""

    node: str
    #: pass, fail, error (its job could not run a test, or failed), or not-tested
    outcome: str
    #: a fail's drain reason, an error's cause, why it was not tested ("" for a pass)
    why: str = ""
    job_id: int = 0
    #: from its job's start to its end
    seconds: float = 0.0
    #: the node's run (acceptance Run.to_json) from its agent, where the agent answered
    run: dict | None = None

    def to_json(self) -> dict:
        return {"node": self.node, "outcome": self.outcome, "why": self.why, "job_id": self.job_id,
                "seconds": round(self.seconds, 1), "run": self.run}

    def line(self) -> str:
        """'gpu07  fail   slurm-ext: acceptance quick failed: gpu-memory gpu 1: ... (job 41)'."""
        words = "not tested" if self.outcome == NOT_TESTED else self.outcome
        tail = f"job {self.job_id}, {self.seconds:.0f}s" if self.job_id else ""
        text = f"{self.node:12} {words:10} {self.why}".rstrip()
        return text + (f" ({tail})" if tail else "")


@dataclass(slots=True)
class ClusterRun:
    """A whole `accept cluster`: every node's outcome, and what became of the reservation."""

    level: str
    reservation: str
    started: float
    finished: float = 0.0
    nodes: list[NodeOutcome] = field(default_factory=list)
    #: "removed", "none made" (nothing to test), or why it could not be removed and what to do
    reservation_end: str = ""
    #: stopped by SIGINT or SIGTERM before every node ran
    interrupted: bool = False

    @property
    def verdict(self) -> str:
        """fail when a node failed; error when a node could not be tested or a test could not run; else pass."""
        outcomes = {n.outcome for n in self.nodes}
        if FAIL in outcomes:
            return FAIL
        if outcomes - {PASS} or not self.nodes or self.interrupted:
            return ERROR
        return PASS

    def counts(self) -> dict[str, int]:
        return {o: sum(n.outcome == o for n in self.nodes) for o in (PASS, FAIL, ERROR, NOT_TESTED)}

    def summary(self) -> str:
        c = self.counts()
        text = (f"accept cluster {self.level}: {self.verdict}: {len(self.nodes)} nodes, {c[PASS]} passed, "
                f"{c[FAIL]} failed, {c[ERROR]} could not run a test, {c[NOT_TESTED]} not tested, in "
                f"{self.finished - self.started:.0f}s")
        if self.interrupted:
            text += " (interrupted)"
        return text + (f"; reservation {self.reservation}: {self.reservation_end}" if self.reservation else "")

    def to_json(self) -> dict:
        return {"level": self.level, "reservation": self.reservation, "reservation_end": self.reservation_end,
                "started": self.started, "finished": self.finished, "verdict": self.verdict,
                "interrupted": self.interrupted, "counts": self.counts(), "nodes": [n.to_json() for n in self.nodes]}


@dataclass(slots=True)
class _Job:
    node: str
    job_id: int
    submitted: float
    started: float = 0.0
    reason: str = ""


def job_minutes(config: Config, level: str) -> int:
    """A node's job's time limit: every test of the level at its deadline (the controller's [acceptance]), and two
    minutes for Python and Slurm; an upper bound, since each test is killed at its deadline."""
    from .catalog import TESTS
    seconds = sum(config.acceptance.deadline(spec.name, level) for spec in TESTS.values() if level in spec.levels)
    return math.ceil((seconds + 120.0) / 60.0)


def job_script(command: tuple[str, ...], level: str, trigger: str = "cluster") -> str:
    """The batch script of a node's job: the node's `accept run` with the cluster's options (`trigger`: cluster, or
    idle for acceptance.idle's jobs), each word quoted (the command is a list in the config, never a shell string)."""
    argv = [*command, "--level", level, "--json", "--trigger", trigger, "--apply"]
    return (f"#!/bin/sh\n# slurm-ext accept {trigger}: this node's acceptance run (exit 0 pass, 1 fail, 3 a test could "
            "not run)\nexec " + " ".join(shlex.quote(word) for word in argv) + "\n")


def accept_cluster(config: Config, level: str, *, nodes: str = "", batch: int = 64, wait_jobs: float = 3600.0,
                   output_dir: str = "/tmp", slurm: SlurmClient | None = None, agents=None,
                   emit: Callable[..., dict] | None = None, say: Callable[[str], None] = lambda text: None,
                   on_node: Callable[[NodeOutcome], None] = lambda outcome: None,
                   stop: threading.Event | None = None) -> ClusterRun:
    """Test `nodes` (a Slurm host list; every node slurmctld knows when empty) at `level`, one exclusive job per
    node in a MAINT reservation, and remove the reservation; the run. `stop` set (by a signal handler) ends it
    early: its jobs are cancelled and the reservation removed all the same.

    Raises:
        ClusterRefused: a node slurmctld does not know, or the reservation could not be made (its words).
        SlurmExtError: Slurm stopped answering mid-run (the reservation was removed, or the error says how).
    """
    from slurm_ext import events
    slurm = slurm or SlurmClient(config.slurm)
    emit = emit or events.emitter(config.node.state_dir, "acceptance")
    stop = stop or threading.Event()
    known = {node.name: node for node in slurm.nodes()}
    wanted = expand_hostlist(nodes) if nodes else list(known)
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise ClusterRefused(f"slurmctld knows no node {', '.join(unknown[:5])}"
                             + (f" (+{len(unknown) - 5} more)" if len(unknown) > 5 else "")
                             + "; `sinfo -N` lists the nodes")
    run = ClusterRun(level, "", time.time())
    testable = []
    for name in dict.fromkeys(wanted):
        unfit = _unfit(known[name])
        if unfit:
            _told(run, NodeOutcome(name, NOT_TESTED, unfit), on_node)
        else:
            testable.append(known[name])
    minutes = job_minutes(config, level)
    if testable:
        waves = math.ceil(len(testable) / batch)
        run.reservation = _reserve(slurm, [n.name for n in testable],
                                   math.ceil(wait_jobs / 60.0) + waves * minutes + 10)
    jobs: dict[int, _Job] = {}
    # idle nodes first: a node still running a job waits in the reservation while the others are tested
    queue = deque(sorted(testable, key=lambda n: n.state != "IDLE"))
    try:
        if run.reservation:  # from here on, whatever happens, the finally below removes it
            say(f"reservation {run.reservation} (MAINT, IGNORE_JOBS) over {len(testable)} nodes")
        emit("acceptance-cluster-started", f"accept cluster {level} over {len(wanted)} nodes"
             + (f" in reservation {run.reservation}" if run.reservation else ": none can run a job")
             + (f"; not tested: {', '.join(n.node for n in run.nodes)}" if run.nodes else ""),
             level=level, reservation=run.reservation, nodes=[n.name for n in testable],
             not_tested={n.node: n.why for n in run.nodes})
        _drive(config, slurm, agents, run, queue, jobs, level, minutes, batch, wait_jobs, output_dir, on_node, stop)
    except Interrupted:
        run.interrupted = True
    finally:
        why = "the run was stopped" if run.interrupted else "the run ended on an error"
        if jobs:
            _cancel(slurm, jobs, run, on_node, f"{why} before its job ended")
        for node in queue:
            _told(run, NodeOutcome(node.name, NOT_TESTED, f"{why} before its turn"), on_node)
        if run.reservation:
            run.reservation_end = _unreserve(slurm, run.reservation)
            say(f"reservation {run.reservation}: {run.reservation_end}")
        else:
            run.reservation_end = "none made"
        run.finished = time.time()
        emit("acceptance-cluster-done", run.summary(), _SEVERITY[run.verdict], level=level,
             reservation=run.reservation, verdict=run.verdict, interrupted=run.interrupted,
             nodes={n.node: n.outcome for n in run.nodes},
             failed={n.node: n.why for n in run.nodes if n.outcome == FAIL},
             not_tested={n.node: n.why for n in run.nodes if n.outcome == NOT_TESTED})
    if not run.interrupted and any(n.job_id for n in run.nodes):
        from .offer import cluster_ran
        try:
            cluster_ran(config.node.state_dir)  # the offer made when acceptance was turned on is taken
        except OSError as err:
            say(f"cannot note the cluster run under {config.node.state_dir}: {err.strerror}")
    return run


def _told(run: ClusterRun, outcome: NodeOutcome, on_node: Callable[[NodeOutcome], None]) -> None:
    run.nodes.append(outcome)
    on_node(outcome)


def _unfit(node: Node) -> str:
    """Why `node` cannot run a job ("" when it can)."""
    reason = f" ({node.reason})" if node.reason else ""
    if node.drained:
        return f"drained{reason}"
    if node.state in _UNFIT or "NOT_RESPONDING" in node.flags:
        return f"{node.state.lower() if node.state in _UNFIT else 'not responding'}{reason}"
    return ""


def _user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _reserve(slurm: SlurmClient, nodes: list[str], minutes: int) -> str:
    """Make the MAINT reservation; its name.

    Raises:
        ClusterRefused: Slurm refused it (its words, and what creating one takes).
    """
    name = f"slurm-ext-accept-{time.strftime('%Y%m%d-%H%M%S')}"
    users = ",".join(dict.fromkeys((_user(), "root")))
    try:
        slurm.reserve(name, nodes, minutes, "MAINT,IGNORE_JOBS", users)
    except SlurmError as err:
        detail = str(err).split(": ", 1)[-1]
        # no answer in time (slurmctld busy): it may have made it all the same; a reservation left behind would keep
        # these nodes from work for its whole duration
        if isinstance(err, SlurmUnreachable):
            _unreserve(slurm, name)
        # slurmctld answers "Invalid user id" (ESLURM_USER_ID_MISSING) to a user who may not create reservations
        hint = (f" (making a reservation takes a Slurm operator or admin, which {_user()} is not: root, SlurmUser, or "
                "a user given `sacctmgr modify user NAME set adminlevel=operator`)"
                if re.search(r"denied|permission|not authorized|invalid user id", detail, re.I) else "")
        raise ClusterRefused(f"cannot make the maintenance reservation {name}: {detail}{hint}; nothing was "
                             "changed") from err
    return name


def _unreserve(slurm: SlurmClient, name: str) -> str:
    """Delete the reservation (retrying while a job of ours still leaves it); "removed", or what to do."""
    deadline = time.monotonic() + _DRAIN_JOBS
    while True:
        try:
            return "removed" if slurm.unreserve(name) else "removed (it was gone already)"
        except SlurmError as err:
            if time.monotonic() > deadline:
                return (f"NOT removed ({str(err).split(': ', 1)[-1]}): remove it with `scontrol delete "
                        f"ReservationName={name}`")
        time.sleep(1.0)


def _drive(config: Config, slurm: SlurmClient, agents, run: ClusterRun, queue: deque, jobs: dict[int, _Job],
           level: str, minutes: int, batch: int, wait_jobs: float, output_dir: str,
           on_node: Callable[[NodeOutcome], None], stop: threading.Event) -> None:
    """Submit the nodes' jobs, at most `batch` in flight, and collect each one's end."""
    script = job_script(config.acceptance.job_command, level)
    # the job runs with the node's config: the controller's SLURM_EXT_CONFIG stays here
    environ = {k: v for k, v in os.environ.items() if k != "SLURM_EXT_CONFIG"}
    submitter = SlurmClient(slurm.settings, slurm.runner, environ)
    if agents is None:
        from slurm_ext.agentapi import AgentClient
        agents = AgentClient.of(config)
    unanswered = 0
    while queue or jobs:
        if stop.is_set():
            raise Interrupted("stopped by a signal")
        while queue and len(jobs) < batch:
            node = queue.popleft()
            try:
                job_id = _submit(submitter, node, run.reservation, minutes, output_dir, script)
            except SlurmError as err:
                _told(run, NodeOutcome(node.name, ERROR, f"its job was refused: {str(err).split(': ', 1)[-1]}"),
                      on_node)
                continue
            jobs[job_id] = _Job(node.name, job_id, time.monotonic())
        try:
            states = _states(slurm, list(jobs))
            unanswered = 0
        except SlurmError as err:  # a slurmctld busy for a moment: the next round asks again
            unanswered += 1
            if unanswered * _POLL > _DRAIN_JOBS:
                raise SlurmError(f"squeue has not answered for {_DRAIN_JOBS:g}s: {err}") from err
            stop.wait(_POLL)
            continue
        now = time.monotonic()
        for job in list(jobs.values()):
            state, reason = states.get(job.job_id, ("", ""))
            if state == "PENDING":
                job.reason = reason
                if now - job.submitted > wait_jobs:
                    slurm.cancel([job.job_id])
                    del jobs[job.job_id]
                    _told(run, NodeOutcome(job.node, NOT_TESTED, f"busy: its job waited {wait_jobs:g}s (--wait-jobs) "
                                           f"and did not start ({reason or 'no reason given'}); jobs running there "
                                           "were left alone", job.job_id), on_node)
            elif state and state not in _ENDED:
                job.started = job.started or now
            else:  # ended, or gone from slurmctld's memory (MinJobAge): its end is read from scontrol or sacct
                del jobs[job.job_id]
                _told(run, _ended(slurm, agents, job, run.started, now), on_node)
        if jobs or queue:
            stop.wait(_POLL)


def _gpus(node: Node) -> int:
    """The node's configured GPUs (gpu:h200:4,gpu:a100:2 -> 6): an exclusive job gets GRES only when it asks."""
    return sum(int(count) for count in re.findall(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)", node.gres))


def submit_node_job(slurm: SlurmClient, node: Node, script: str, *, job_name: str, minutes: int, output_dir: str,
                    output: str, options: tuple[str, ...] = ()) -> int:
    """sbatch `script` as one exclusive job on `node` with all its memory and GPUs; its job id. `output` is the
    output file's name in `output_dir` (sbatch's %j and %N patterns work); `options` more of sbatch's.

    Raises:
        SlurmError: sbatch refused it (its words), or printed no job id."""
    gpus = _gpus(node)
    return slurm.submit(script, [*options, "-w", node.name, "-N1", "--exclusive", "--mem=0",
                                 *([f"--gres=gpu:{gpus}"] if gpus else []), f"--time={minutes}",
                                 f"--job-name={job_name}", f"--chdir={output_dir}", f"--output={output_dir}/{output}"])


def _submit(slurm: SlurmClient, node: Node, reservation: str, minutes: int, output_dir: str, script: str) -> int:
    return submit_node_job(slurm, node, script, job_name=JOB_NAME, minutes=minutes, output_dir=output_dir,
                           output=f"{JOB_NAME}-{node.name}-%j.out", options=(f"--reservation={reservation}",))


def _states(slurm: SlurmClient, job_ids: list[int]) -> dict[int, tuple[str, str]]:
    """Job id -> (state, reason) of the jobs slurmctld still holds (pending, running, or ended within MinJobAge)."""
    if not job_ids:
        return {}
    return {job_id: found for job_id, found in slurm.jobs_named(JOB_NAME).items() if job_id in job_ids}


def _exit_status(slurm: SlurmClient, job_id: int) -> tuple[str, int | None]:
    """(state, exit status) of an ended job: from scontrol while slurmctld holds it, else from sacct."""
    shown = slurm.job_end(job_id)
    if shown and shown[0] in _ENDED:
        return shown
    try:
        accounted = slurm.wait_accounted(job_id, timeout=30.0, interval=1.0)
    except SlurmError:
        return "UNKNOWN", None
    return accounted.state, accounted.exit_code


def _ended(slurm: SlurmClient, agents, job: _Job, since: float, now: float) -> NodeOutcome:
    """A node's outcome from its ended job: its exit status, the node's drain reason (a fail), its agent's run."""
    state, code = _exit_status(slurm, job.job_id)
    seconds = now - job.started if job.started else 0.0
    run = _agent_run(agents, job.node, since)
    if state in ("COMPLETED", "FAILED") and code in (0, 1, 3):
        if code == 0:
            return NodeOutcome(job.node, PASS, _passed(run), job.job_id, seconds, run)
        failed = _fail_reason(slurm, job.node, run) if code == 1 else None
        if failed:
            return NodeOutcome(job.node, FAIL, failed, job.job_id, seconds, run)
        if code == 3:
            return NodeOutcome(job.node, ERROR, "a test could not run: " + _not_run(run), job.job_id, seconds, run)
    how = {"TIMEOUT": "ran past its time limit", "CANCELLED": "was cancelled (by someone else)",
           "NODE_FAIL": "lost its node", "PREEMPTED": "was preempted", "OUT_OF_MEMORY": "ran out of memory"}
    what = how.get(state) or (f"exited {code}" if code is not None else f"ended {state.lower()}")
    return NodeOutcome(job.node, ERROR, f"its job {what}: its output is {JOB_NAME}-{job.node}-{job.job_id}.out "
                       "in the output directory on the node", job.job_id, seconds, run)


def _agent_run(agents, node: str, since: float) -> dict | None:
    """The node's last run of trigger `cluster` from its agent, if it is this run's (None: no answer, or an older
    run). Agents of a release without GET /acceptance answer nothing here: the exit status stands alone."""
    ask = getattr(agents, "acceptance", None)
    if ask is None:
        return None
    try:
        answer = ask(node, trigger="cluster")
    except (SlurmExtError, OSError):
        return None
    found = getattr(answer, "run", None)
    return found if isinstance(found, dict) and float(found.get("started") or 0) >= since - 1.0 else None


def _passed(run: dict | None) -> str:
    if not run:
        return ""
    return (f"{len(run.get('results') or ())} results, profile {run.get('profile') or 'none'}, "
            f"{float(run.get('finished', 0)) - float(run.get('started', 0)):.1f}s")


def _fail_reason(slurm: SlurmClient, node: str, run: dict | None) -> str | None:
    """The node's acceptance drain reason as Slurm shows it, else the run's failures; None when neither confirms
    that a test failed."""
    try:
        shown = slurm.node(node)
        if shown.drained and shown.reason_is_ours and "acceptance" in shown.reason:
            return f"drained: {shown.reason}"
    except SlurmError:
        pass
    failed = [r for r in (run or {}).get("results") or () if r.get("outcome") == FAIL]
    if failed:
        return "; ".join(f"{r.get('test')} {r.get('target')}: {r.get('message')}".replace(" :", ":")
                         for r in failed[:3])
    # exit 1 with no failing run kept and no acceptance drain: Python's own exit for a crash, not a measurement
    return None


def _not_run(run: dict | None) -> str:
    errors = [r for r in (run or {}).get("results") or () if r.get("outcome") == ERROR]
    if errors:
        return "; ".join(f"{r.get('test')} {r.get('target')}: {r.get('message')}".replace(" :", ":")
                         for r in errors[:3])
    return "see `slurm-ext history --node NODE`"


def _cancel(slurm: SlurmClient, jobs: dict[int, _Job], run: ClusterRun, on_node: Callable[[NodeOutcome], None],
            why: str) -> None:
    """Cancel the run's unfinished jobs and wait (a while) until slurmctld holds none of them running."""
    try:
        slurm.cancel(list(jobs))
        deadline = time.monotonic() + _DRAIN_JOBS
        while time.monotonic() < deadline:
            states = _states(slurm, list(jobs))
            if all(states.get(j, ("",))[0] in _ENDED | {""} for j in jobs):
                break
            time.sleep(0.5)
    except SlurmError:
        pass  # the reservation's removal says what is left
    for job in jobs.values():
        _told(run, NodeOutcome(job.node, NOT_TESTED, f"{why}: cancelled", job.job_id), on_node)
    jobs.clear()
