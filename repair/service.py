"""The repair service: the controller agent's `repair` worker (`slurm-ext repair serve`).

Every repair.interval it reads the whole cluster once (one `scontrol show
node` or `sinfo --json`, one `squeue`), turns what the nodes' health drains
say into recommendations (`recommend.plan`), approves what auto-approve
allows, and moves every approved repair on (`flow.advance`). It keeps no
state of its own between passes beyond the executors running on its
threads: the store holds everything, so a restart carries on where it was.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from slurm_ext import config as config_mod, events
from slurm_ext.agentapi import AgentAnswerError, AgentClient, HealthAnswer
from slurm_ext.errors import SlurmExtError
from slurm_ext.slurm import Job, Node, SlurmClient, expand_hostlist

from . import decide, executors, flow, recommend
from .store import IN_PROGRESS, Store, StoreError, open_store

__all__ = ["Service", "serve", "jobs_by_node"]

log = logging.getLogger("repair")

#: longest wait for a node agent's /health
_AGENT_TIMEOUT = 5.0


def jobs_by_node(jobs: list[Job]) -> dict[str, list[Job]]:
    """The running (and completing) jobs of each node, from one squeue of the whole cluster."""
    found: dict[str, list[Job]] = {}
    for job in jobs:
        if job.finished or job.state == "PENDING":
            continue
        for name in expand_hostlist(job.nodes):
            found.setdefault(name, []).append(job)
    return found


class Service:
    """The worker's loop: its state is the store's, so it is a few handles and the executors' threads."""

    def __init__(self, config, config_path: str | None = None, store: Store | None = None):
        self.config = config
        self.config_path = config_path
        self.store = store or open_store(config)
        self.slurm = SlurmClient(config.slurm)
        self.agents = AgentClient.of(config, _AGENT_TIMEOUT)
        self.emit = events.emitter(config.node.state_dir, "repair")
        self.stopping = threading.Event()
        self._reload_wanted = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="repair-action")
        self._actions: dict[int, Future] = {}
        #: the nodes as the last pass saw them
        self._nodes: dict[str, Node] = {}

    @property
    def settings(self):
        return self.config.repair

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.stopping.set())
        signal.signal(signal.SIGHUP, lambda *_: self._reload_wanted.set())
        live = self.store.records(open_only=True, states=IN_PROGRESS)
        self.emit("repair-started", f"repair service on {self.store.where}: every {self.settings.interval:g}s"
                  + (f"; {len(live)} repair(s) under way carry on: {', '.join(r.node for r in live)}" if live else "")
                  + ("; dry run" if self.settings.dry_run else ""))
        while not self.stopping.is_set():
            if self._reload_wanted.is_set():
                self._reload_wanted.clear()
                self._reload()
            try:
                self.run_pass()
            except SlurmExtError as err:  # Slurm or the database away: the next pass tries again
                log.warning("repair: pass skipped: %s", err)
            self.stopping.wait(self.settings.interval)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.store.close()
        return 0

    def _reload(self) -> None:
        """The [repair] settings of a changed config apply from the next pass (a new database or [slurm] section
        needs a restart of the worker)."""
        try:
            self.config = config_mod.load(self.config_path)
            self.agents = AgentClient.of(self.config, _AGENT_TIMEOUT)
            self.emit("reload", "repair service reloaded its config")
        except SlurmExtError as err:
            self.emit("reload-failed", f"the config is invalid, the running one is kept: {err}", "error")

    def run_pass(self, now: float | None = None) -> None:
        """One look at the cluster and one step further for every repair (`now`: a fixed clock, for tests).

        Everything it records is stamped with the moment it happens, read from the clock then: a recommendation after
        the reads it rests on, each step of a repair when it runs (an operator's approval committed while this pass
        read the cluster is older than the first step it leads to; a reboot is stamped after the steps before it in
        the same pass, however long the reads and the other repairs took), so the history keeps them in order.
        """
        clock = (lambda: now) if now else time.time
        nodes = self._nodes = {node.name: node for node in self.slurm.nodes()}
        jobs = jobs_by_node(self.slurm.jobs())
        self._recommend(nodes, jobs, clock())
        self._auto_approve(len(nodes), clock())
        under_way = self.store.records(open_only=True, states=IN_PROGRESS)
        health = self._health_of([r.node for r in under_way if r.step in ("wait-boot", "verify")])
        seen = flow.Seen(self.slurm, self.store, self.settings, nodes, jobs, health.get, self._start_action,
                         self._actions, self.emit, clock)
        for record in under_way:
            try:
                flow.advance(record, seen)
            except SlurmExtError:
                raise
            except Exception:  # a bug, or an answer no one foresaw: this repair waits, the others go on
                log.exception("repair of %s: step %s failed unexpectedly; tried again next pass", record.node,
                              record.step)

    def _recommend(self, nodes: dict[str, Node], jobs: dict[str, list[Job]], now: float) -> None:
        window = now - self.settings.escalate_window
        reboots: dict[tuple[str, str], int] = {}
        for done in self.store.records(states=("done",), since=window):
            if done.action == "reboot" and not done.detail.get("dry_run"):
                reboots[(done.node, done.signature)] = reboots.get((done.node, done.signature), 0) + 1
        job_ids = {name: [j.job_id for j in node_jobs] for name, node_jobs in jobs.items()}
        with self.store.locked():  # read and written in one transaction: an approval meanwhile is never undone
            changes = recommend.plan(self.store.records(open_only=True), list(nodes.values()), job_ids,
                                     self.settings, reboots, now)
            for change in changes:
                if change.kind == "new":
                    self.store.add(change.record)
                else:
                    self.store.save(change.record)
                if change.kind != "updated":
                    self.store.event(change.record.node, f"repair-{_EVENT[change.kind]}", change.message,
                                     record=change.record, now=now)
        for change in changes:
            if change.kind != "updated":
                self.emit(f"repair-{_EVENT[change.kind]}", f"node {change.record.node}: {change.message}",
                          node=change.record.node, action=change.record.action, signature=change.record.signature)

    def _auto_approve(self, cluster_nodes: int, now: float) -> None:
        wanted = set(self.settings.auto_approve)
        if not wanted:
            return
        for record in self.store.records(open_only=True, states=("recommended",)):
            check = record.signature.split("/", 1)[0]
            if record.signature not in wanted and check not in wanted:
                continue
            try:
                decide.approve(self.store, record.node, "slurm-ext (auto-approve)", self.settings, cluster_nodes,
                               auto=True, now=now)
            except decide.DecisionRefused as err:
                if record.detail.get("auto_refused") != str(err):  # said once, not every pass
                    record.detail["auto_refused"] = str(err)
                    with self.store.locked():
                        if not self.store.save(record, expect_state="recommended"):
                            continue  # an operator decided meanwhile: theirs stands
                        self.store.event(record.node, "repair-refused", f"auto-approve refused: {err}",
                                         record=record, now=now)
                    self.emit("repair-refused", f"auto-approve refused: {err}", "warning", node=record.node)
                continue
            self.emit("repair-approved", f"node {record.node}: {record.action} auto-approved ({record.signature})",
                      node=record.node, action=record.action)

    def _health_of(self, names: list[str]) -> dict[str, HealthAnswer | None]:
        """The /health answers of the agents of nodes coming back from a repair, asked at once (an agent that does
        not answer costs the pass _AGENT_TIMEOUT once, not once per node)."""
        if not names:
            return {}

        def ask(name: str) -> HealthAnswer | None:
            known = self._nodes.get(name)
            try:
                return self.agents.health(name, known.addr if known else "")
            except AgentAnswerError as err:  # an answer came and is not believed: said; none at all is the flow's
                (log.warning if err.status else log.debug)("repair: %s", err)
                return None
        with ThreadPoolExecutor(max_workers=min(16, len(names))) as pool:
            return dict(zip(names, pool.map(ask, names)))

    def _start_action(self, action: str, node: str) -> Future:
        return self._pool.submit(executors.run_action, self.settings, action, node)


_EVENT = {"new": "recommended", "escalated": "escalated", "gone": "cleared", "closed": "cleared"}


def serve(config_path: str | None = None) -> int:
    """The entry point of `slurm-ext repair serve`."""
    config = config_mod.load(config_path)
    if not config.repair.enabled:
        log.info("repair: repair.enabled is false: nothing to do")
        return 0
    said = ""
    while True:  # the database may come up after the controller (MariaDB in its own pod): wait for it, loudly once
        try:
            service = Service(config, config_path)
            break
        except StoreError as err:
            if str(err) != said:
                said = str(err)
                log.warning("repair: %s; trying again every %gs", err, config.repair.interval)
            time.sleep(config.repair.interval)
    return service.run()
