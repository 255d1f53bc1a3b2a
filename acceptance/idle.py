"""`slurm-ext accept idle`: the controller agent's worker that tests idle nodes, at the lowest priority, preemptible.

What CoreWeave and Crusoe do (verification on idle nodes, at low priority, preemptible): with [acceptance]
enabled and `idle_period` > 0, the controller's agent runs this worker. Every tenth of the period (at most a
minute) it reads the cluster, one `scontrol show node` and one `squeue` for all nodes, and for each node that

- is idle: no job of anyone on it (pending jobs shown there included), not drained, down, reserved, planned by the
  backfill scheduler, powered down or not responding, and
- had its last acceptance end more than `idle_period` ago (this worker's own record of its jobs,
  `<state_dir>/acceptance/idle-nodes.json`, and, for a node due by that record, its agent's last run of any
  trigger: a node tested at its start or by `accept cluster` is not tested again so soon),

submits one job: exclusive on the node, all its GPUs and memory, `--nice` at Slurm's maximum, `--qos=<idle_qos>`
(a QOS the site made preemptible by every other job; none: the job is only of the lowest priority),
`--no-requeue`, a time limit of the quick level's deadlines, `--job-name=slurm-ext-accept-idle`, running the
node's own `accept run --level quick --json --trigger idle --apply` ([acceptance] job_command, as `accept
cluster`'s jobs): a fail drains the node through its own agent with a repair recommended; a test that could not
run drains nothing. At most 1 % of the nodes (at least one) have such a job at once, so idle testing never takes a
large share of the cluster; a job still pending after `_PENDING_LIMIT` (someone else's job got the node) is
cancelled and the node waits another period.

Told in the controller's journal: `acceptance-idle-submitted` per job, `acceptance-idle-refused` when sbatch
refuses one (said once until its words change). Each node's run is in its own journal, as every run is.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from slurm_ext.config import Config
    from slurm_ext.slurm import Job, Node, SlurmClient

__all__ = ["IDLE_JOB_NAME", "NICE", "Seen", "state_path", "load_seen", "save_seen", "interval", "share", "testable",
           "due", "choose", "IdleTester", "serve"]

log = logging.getLogger("acceptance")

#: every idle test job has this name (squeue --name=slurm-ext-accept-idle lists them)
IDLE_JOB_NAME = "slurm-ext-accept-idle"
#: sbatch --nice: Slurm's largest (it refuses more than NICE_OFFSET - 3 = 2147483645), subtracted from the priority
#: Slurm would give the job: under priority/multifactor (whose priorities stay far below 2^31) the result is below 1,
#: which Slurm raises to 1 (0 means held): the lowest any job can have, whatever the site's weights; under
#: priority/basic (first come, first served from 2^32 - 2^16 down) it is about 2^31 below every other job (seen on
#: 22.05: 2147418113 against 4294901759)
NICE = 2147483645
#: our job still pending after this long: a job of someone else was given the node first; cancelled, so that it never
#: holds one of the few places for idle tests, nor starts on a node later that was busy when we chose it
_PENDING_LIMIT = 120.0
#: node flags under which the node takes no test: someone's (a drain, a reservation, a maintenance, a reboot, the
#: backfill's plan for a pending job) or Slurm's power saving (a test would wake a powered-down node)
_KEEP_OFF = frozenset({"DRAIN", "DRAINED", "DRAINING", "INVALID_REG", "COMPLETING", "MAINTENANCE", "MAINT",
                       "REBOOT_REQUESTED", "REBOOT_ISSUED", "RESERVED", "PLANNED", "POWERED_DOWN", "POWERING_DOWN",
                       "POWER_DOWN", "POWERING_UP", "POWER_UP", "FAIL", "NOT_RESPONDING", "BLOCKED"})
#: how many agents one pass may ask for their last run (an agent that does not answer costs its timeout)
_MAX_ASKS = 8
#: the agents' answer timeout
_AGENT_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class Seen:
    """What this worker knows of one node's idle testing."""

    #: when it last submitted the node's job (epoch seconds; 0: never)
    submitted: float = 0.0
    #: when the node's last acceptance ended: our job's end as squeue showed it, or its agent's last run
    ended: float = 0.0
    #: our job in flight there (0: none)
    job_id: int = 0

    @property
    def last(self) -> float:
        return max(self.submitted, self.ended)


def state_path(state_dir: str) -> Path:
    """This worker's record (not `<trigger>.json`: on a controller that is also a node, `idle.json` is the node's own
    last idle run)."""
    return Path(state_dir) / "acceptance" / "idle-nodes.json"


def load_seen(state_dir: str) -> dict[str, Seen]:
    """The record; empty when absent or unreadable (at worst a node is tested a period early, which is said)."""
    path = state_path(state_dir)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.warning("acceptance: idle testing's record %s is unreadable (%s): started anew", path, err)
        return {}
    seen = {}
    for node, item in (data.get("nodes") or {}).items() if isinstance(data, dict) else ():
        try:
            seen[str(node)] = Seen(float(item.get("submitted") or 0), float(item.get("ended") or 0),
                                   int(item.get("job_id") or 0))
        except (AttributeError, TypeError, ValueError):
            continue
    return seen


def save_seen(state_dir: str, seen: dict[str, Seen]) -> None:
    """Raises: OSError: the state directory cannot be written."""
    from slurm_ext.fileio import atomic_write
    path = state_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"nodes": {n: asdict(s) for n, s in sorted(seen.items())}}), mode=0o644,
                 fsync="file")


def interval(period: float) -> float:
    """How often the worker looks: a tenth of the period, at most a minute, at least a second."""
    return max(1.0, min(period / 10.0, 60.0))


def share(nodes: int) -> int:
    """How many idle tests may run at once: 1 % of the nodes, at least one."""
    return max(1, nodes // 100)


def _running(jobs: list[Job]) -> list[Job]:
    return [job for job in jobs if not job.finished]


def testable(node: Node, busy: set[str]) -> bool:
    """Whether `node` may take an idle test now: idle, answering, no job on it, none of `_KEEP_OFF`'s flags."""
    return (node.state == "IDLE" and node.name not in busy and not (node.flags & _KEEP_OFF)
            and not any(flag.startswith("POWER") for flag in node.flags))


def _busy(jobs: list[Job]) -> set[str]:
    from slurm_ext.slurm import expand_hostlist
    return {name for job in _running(jobs) if job.nodes for name in expand_hostlist(job.nodes)}


def due(nodes: list[Node], jobs: list[Job], seen: dict[str, Seen], period: float, now: float) -> list[Node]:
    """The nodes an idle test is due on: testable, and their last test (or our last job there) more than `period`
    ago; the longest untested first (never tested before any), then by name."""
    busy = _busy(jobs)
    found = [node for node in nodes if testable(node, busy)
             and now - seen.get(node.name, Seen()).last >= period and not seen.get(node.name, Seen()).job_id]
    return sorted(found, key=lambda node: (seen.get(node.name, Seen()).last, node.name))


def in_flight(jobs: list[Job]) -> int:
    """Our idle tests slurmctld holds now (by name: also the ones of a record that was lost)."""
    return sum(job.name == IDLE_JOB_NAME for job in _running(jobs))


def choose(nodes: list[Node], jobs: list[Job], seen: dict[str, Seen], period: float, now: float) -> list[str]:
    """The nodes to submit an idle test to now: the due ones, as many as `share` leaves room for beside our jobs in
    flight. Pure: what a pass does before it asks the agents."""
    room = share(len(nodes)) - in_flight(jobs)
    return [node.name for node in due(nodes, jobs, seen, period, now)[:max(0, room)]]


class IdleTester:
    """The worker: one pass every `interval(idle_period)`, SIGHUP rereads the config, SIGTERM ends it (its jobs in
    flight run on to their end: each is a node's own test, minutes long)."""

    def __init__(self, config: Config, config_path: str | None = None, *, slurm: SlurmClient | None = None,
                 agents=None, emit: Callable[..., dict] | None = None, clock: Callable[[], float] = time.time):
        from slurm_ext import events
        from slurm_ext.slurm import SlurmClient
        self.config = config
        self.config_path = config_path
        self.slurm = slurm or SlurmClient(config.slurm)
        self.agents = agents
        self.emit = emit or events.emitter(config.node.state_dir, "acceptance", role="controller")
        self.clock = clock
        self.stopping = threading.Event()
        self._reload_wanted = threading.Event()
        self.seen = load_seen(config.node.state_dir)
        #: the words of sbatch's last refusal, said once until they change
        self._refused = ""

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.stopping.set())
        signal.signal(signal.SIGHUP, lambda *_: self._reload_wanted.set())
        settings = self.config.acceptance
        log.info("acceptance: idle nodes tested every %gs (%s), looked at every %gs", settings.idle_period,
                 f"QOS {settings.idle_qos}" if settings.idle_qos else "no idle_qos: lowest priority, not preemptible",
                 interval(settings.idle_period))
        while not self.stopping.is_set():
            if self._reload_wanted.is_set():
                self._reload_wanted.clear()
                self._reload()
            try:
                self.run_pass()
            except Exception as err:  # Slurm away, a state directory gone read-only, a bug: the next pass tries
                log.warning("acceptance: idle pass skipped: %s", err)
            self.stopping.wait(interval(self.config.acceptance.idle_period))
        return 0

    def _reload(self) -> None:
        from slurm_ext import config as config_mod
        from slurm_ext.errors import SlurmExtError
        from slurm_ext.slurm import SlurmClient
        try:
            self.config = config_mod.load(self.config_path)
        except SlurmExtError as err:
            log.error("acceptance: config not reloaded, the running one is kept: %s", err)
            return
        self.slurm = SlurmClient(self.config.slurm, self.slurm.runner)
        self.agents = None
        log.info("acceptance: idle testing reloaded its config: every %gs, QOS %s", self.config.acceptance.idle_period,
                 self.config.acceptance.idle_qos or "none")

    def run_pass(self, now: float | None = None) -> list[int]:
        """One look at the cluster: our jobs that ended or waited too long settled, the due nodes' jobs submitted;
        their job ids.

        Raises:
            SlurmError: scontrol or squeue did not answer (nothing was submitted).
            OSError: the record cannot be written."""
        settings = self.config.acceptance
        if not settings.enabled or settings.idle_period <= 0:
            return []
        nodes = self.slurm.nodes()
        jobs = self.slurm.jobs()
        now = self.clock() if now is None else now
        changed = self._settle(jobs, now)
        room = share(len(nodes)) - in_flight(jobs)
        submitted = []
        if room > 0:
            candidates = due(nodes, jobs, self.seen, settings.idle_period, now)
            for node in candidates[:room + _MAX_ASKS]:
                if len(submitted) >= room:
                    break
                if self._tested_lately(node, settings.idle_period, now):
                    changed = True
                    continue
                job_id = self._submit(node, now)
                changed = True
                if job_id:
                    submitted.append(job_id)
        if changed:
            save_seen(self.config.node.state_dir, self.seen)
        return submitted

    def _settle(self, jobs: list[Job], now: float) -> bool:
        """Our jobs that ended (their node's test ended now, as far as we know) or waited past _PENDING_LIMIT
        (cancelled); whether the record changed."""
        held = {job.job_id: job for job in _running(jobs)}
        changed = False
        for name, seen in list(self.seen.items()):
            if not seen.job_id:
                continue
            job = held.get(seen.job_id)
            if job is None:
                self.seen[name] = Seen(seen.submitted, now, 0)
                changed = True
            elif job.state == "PENDING" and now - seen.submitted > _PENDING_LIMIT:
                self.slurm.cancel([seen.job_id])
                log.info("acceptance: idle test job %d of %s still pending after %gs: cancelled (the node was given "
                         "to another job); tried again after idle_period", seen.job_id, name, _PENDING_LIMIT)
                self.seen[name] = Seen(seen.submitted, seen.ended, 0)
                changed = True
        return changed

    def _tested_lately(self, node: Node, period: float, now: float) -> bool:
        """Whether the node's agent says it runs a test now or ended one within `period` (at start, `accept
        cluster`, a repair, by hand): noted, and no job. An agent that does not answer says nothing."""
        from slurm_ext.errors import SlurmExtError
        if self.agents is None:
            from slurm_ext.agentapi import AgentClient
            self.agents = AgentClient.of(self.config, _AGENT_TIMEOUT)
        try:
            answer = self.agents.acceptance(node.name, node.addr)
        except (SlurmExtError, OSError) as err:
            log.debug("acceptance: %s's agent did not say its last run: %s", node.name, err)
            return False
        finished = float((answer.run or {}).get("finished") or 0)
        old = self.seen.get(node.name, Seen())
        if answer.running or now - finished < period:
            self.seen[node.name] = Seen(old.submitted, max(old.ended, now if answer.running else finished), 0)
            return True
        return False

    def _submit(self, node: Node, now: float) -> int:
        """sbatch the node's idle test; its job id, 0 when sbatch refused it (said once, the node tried again after
        a period: a wrong idle_qos is not retried every pass)."""
        from slurm_ext.errors import SlurmError
        from slurm_ext.slurm import SlurmClient

        from .cluster import job_minutes, job_script, submit_node_job
        settings = self.config.acceptance
        # the job runs with the node's config: the controller's SLURM_EXT_CONFIG stays here
        environ = {k: v for k, v in os.environ.items() if k != "SLURM_EXT_CONFIG"}
        submitter = SlurmClient(self.slurm.settings, self.slurm.runner, environ)
        options = (f"--nice={NICE}", "--no-requeue", *([f"--qos={settings.idle_qos}"] if settings.idle_qos else ()),
                   *([f"--partition={','.join(node.partitions)}"] if node.partitions else ()))
        old = self.seen.get(node.name, Seen())
        try:
            job_id = submit_node_job(submitter, node, job_script(settings.job_command, "quick", "idle"),
                                     job_name=IDLE_JOB_NAME, minutes=job_minutes(self.config, "quick"),
                                     output_dir="/tmp", output=f"{IDLE_JOB_NAME}-{node.name}.out", options=options)
        except SlurmError as err:
            self.seen[node.name] = Seen(now, old.ended, 0)
            words = str(err).split(": ", 1)[-1]
            if words != self._refused:
                self._refused = words
                self.emit("acceptance-idle-refused", f"sbatch refused the idle acceptance job of {node.name}: {words}"
                          + ("; is [acceptance] idle_qos a QOS of the cluster the root account may use?"
                             if settings.idle_qos and "qos" in words.lower() else ""), "error", node=node.name,
                          error=words)
            return 0
        self._refused = ""
        self.seen[node.name] = Seen(now, old.ended, job_id)
        how = (f"QOS {settings.idle_qos}, preemptible" if settings.idle_qos
               else "no idle_qos: lowest priority, not preemptible")
        self.emit("acceptance-idle-submitted", f"idle acceptance quick on {node.name}: job {job_id} (nice {NICE}, "
                  f"{how}); its last test ended "
                  + (f"{now - old.last:.0f}s ago" if old.last else "never before"),
                  node=node.name, job_id=job_id, qos=settings.idle_qos, level="quick")
        return job_id


def serve(config_path: str | None = None) -> int:
    """The entry point of `slurm-ext accept idle`."""
    from slurm_ext import config as config_mod
    config = config_mod.load(config_path)
    if not config.acceptance.enabled or config.acceptance.idle_period <= 0:
        log.info("acceptance: [acceptance] enabled is false or idle_period is 0: no idle node is tested")
        return 0
    return IdleTester(config, config_path).run()
