"""The repair service: the controller agent's `repair` worker (`slurm-ext repair serve`).

Every repair.interval it reads the whole cluster once (one `scontrol show
node`, one `squeue`), turns what the nodes' health drains
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
from pathlib import Path
from concurrent.futures import Future, ThreadPoolExecutor

from slurm_ext import config as config_mod, events
from slurm_ext.agentapi import AcceptanceAnswer, AgentAnswerError, AgentClient, HealthAnswer
from slurm_ext.errors import SlurmExtError
from slurm_ext.slurm import Job, Node, SlurmClient, expand_hostlist

from . import decide, executors, flow, metrics, notify, recommend
from .store import IN_PROGRESS, Store, StoreError, open_store

__all__ = ["Service", "serve", "jobs_by_node"]

log = logging.getLogger("repair")

#: longest wait for a node agent's /health
_AGENT_TIMEOUT = 5.0
#: longest wait for a node agent's answer to a GPU reset (health.gpu_reset_timeout on the node, 2 minutes by default,
#: and the clearing of its findings)
_RESET_TIMEOUT = 600.0  # longer than health.gpu_reset_timeout's maximum (540 s), so the reset ends first


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
        #: the webhook's notifier and the reader of critical findings (None: repair.notify_url_file is empty, or
        #: cannot be used: said at the start)
        self.notifier: notify.Notifier | None = None
        self._health_feed: notify.HealthFeed | None = None
        #: the newest repair event handed to the notifier
        self._notified_id = 0
        #: why the notifier could not start, as said last ("" when it runs or is not wanted)
        self._notifier_problem = ""

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
        self._start_notifier()
        while not self.stopping.is_set():
            if self._reload_wanted.is_set():
                self._reload_wanted.clear()
                self._reload()
            try:
                self.run_pass()
            except SlurmExtError as err:  # Slurm or the database away: the next pass tries again
                log.warning("repair: pass skipped: %s", err)
            self._notify()
            self.stopping.wait(self.settings.interval)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._stop_notifier()
        self.store.close()
        return 0

    def _stop_notifier(self) -> None:
        for part in (self._health_feed, self.notifier):
            if part is not None:
                part.stop(self.settings.notify_timeout + 1.0)  # a post under way ends first: it is marked once
        self.notifier = self._health_feed = None
        self._notifier_problem = ""

    def _start_notifier(self) -> None:
        """The webhook notifier of repair.notify_url_file, on threads of its own. A URL file that cannot be used (or
        a database away at the first start) is an error event, said once, and tried again at every pass: the
        service runs on without it (a notifier never holds a repair back)."""
        s = self.settings
        if not s.notify_url_file:
            return
        sent = notify.Sent(Path(self.config.node.state_dir) / notify.SENT_FILE)
        try:
            if not sent.known:  # the first start: from now on, nothing of before
                sent.repair_id = self.store.last_event_id()
                sent.save()
            notifier = notify.Notifier(s.notify_url_file, s.notify_format, s.notify_queue, s.notify_retries,
                                       s.notify_backoff, s.notify_timeout, sent, self.emit)
        except (SlurmExtError, OSError) as err:
            problem = f"no notifier: {err}"
            if problem != self._notifier_problem:
                self._notifier_problem = problem
                log.error("repair: %s", problem)
                self.emit("repair-notify-failed", f"{problem}; tried again at every pass", "error")
            return
        self.notifier, self._notifier_problem = notifier, ""
        self._notified_id = sent.repair_id or 0
        self._health_feed = notify.HealthFeed(self.notifier, self.agents, sent, sent.started)
        self.emit("repair-notify-started", f"posting recommendations, approvals, failed repairs and critical findings "
                  f"to the webhook of {s.notify_url_file} ({s.notify_format})")

    def _reload(self) -> None:
        """The [repair] settings of a changed config apply from the next pass (a new database or [slurm] section
        needs a restart of the worker)."""
        try:
            self.config = config_mod.load(self.config_path)
            self.agents = AgentClient.of(self.config, _AGENT_TIMEOUT)
            self.emit("reload", "repair service reloaded its config")
            # a new notifier, with the URL file read again (a rotated URL); what the old one had not posted is
            # not marked as posted, so the new one posts it
            self._stop_notifier()
            self._start_notifier()
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
        accept = self.config.acceptance
        acceptance = self._acceptance_of({r.node: trigger for r in under_way
                                          if (trigger := flow.acceptance_trigger(r, accept)) is not None})
        seen = flow.Seen(self.slurm, self.store, self.settings, nodes, jobs, health.get, self._start_action,
                         self._actions, self.emit, clock, self._start_reset, accept, acceptance,
                         self._start_acceptance)
        for record in under_way:
            try:
                flow.advance(record, seen)
            except SlurmExtError:
                raise
            except Exception:  # a bug, or an answer no one foresaw: this repair waits, the others go on
                log.exception("repair of %s: step %s failed unexpectedly; tried again next pass", record.node,
                              record.step)
        awaiting = self.store.records(open_only=True, states=("recommended",))
        try:
            metrics.write_figures(self.config.node.state_dir, clock(), awaiting,
                                  self.notifier.figures() if self.notifier else None)
        except OSError as err:
            log.warning("repair: cannot write its figures for /metrics: %s", err)

    def _notify(self) -> None:
        """Hand the notifier what is new: the store's repair events since the last pass (an approval made while
        Slurm is away too), and the nodes a health check drains as the last pass saw them, whose journals its own
        thread reads."""
        if self.notifier is None:
            self._start_notifier()
        if self.notifier is None:
            return
        try:
            notices = notify.repair_notices(self.store, self._notified_id)
        except SlurmExtError as err:  # the database away: the next pass asks again
            log.warning("repair: notifier: %s", err)
            notices = []
        if notices:
            self._notified_id = int(notices[-1].key.split(":")[1])
            self.notifier.put(notices)
        if self._health_feed is not None:
            self._health_feed.watch({n.name: n.addr for n in self._nodes.values()
                                     if recommend.fault_of(n) is not None})

    def _recommend(self, nodes: dict[str, Node], jobs: dict[str, list[Job]], now: float) -> None:
        window = now - self.settings.escalate_window
        reboots: dict[tuple[str, str], int] = {}
        resets: dict[tuple[str, str, int], int] = {}
        for done in self.store.records(states=("done",), since=window):
            if done.action == "reboot" and not done.detail.get("dry_run"):
                reboots[(done.node, done.signature)] = reboots.get((done.node, done.signature), 0) + 1
            elif done.action == "reset-gpu" and not done.detail.get("dry_run"):
                key = (done.node, done.signature, done.detail.get("gpu"))
                resets[key] = resets.get(key, 0) + 1
        job_ids = {name: [j.job_id for j in node_jobs] for name, node_jobs in jobs.items()}
        with self.store.locked():  # read and written in one transaction: an approval meanwhile is never undone
            changes = recommend.plan(self.store.records(open_only=True), list(nodes.values()), job_ids,
                                     self.settings, reboots, now, resets)
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

    def _acceptance_of(self, triggers: dict[str, str]) -> dict[str, AcceptanceAnswer | None]:
        """The /acceptance answers (of each node's trigger) of the agents of repaired nodes whose acceptance decides
        their resume, asked at once, as `_health_of`."""
        if not triggers:
            return {}

        def ask(name: str) -> AcceptanceAnswer | None:
            known = self._nodes.get(name)
            try:
                return self.agents.acceptance(name, known.addr if known else "", triggers[name])
            except AgentAnswerError as err:
                (log.warning if err.status else log.debug)("repair: %s", err)
                return None
        with ThreadPoolExecutor(max_workers=min(16, len(triggers))) as pool:
            return dict(zip(triggers, pool.map(ask, triggers)))

    def _start_acceptance(self, node: str, level: str) -> Future:
        """Ask the node's agent for an acceptance run of `level` (trigger repair), on a thread."""
        known = self._nodes.get(node)
        return self._pool.submit(self.agents.run_acceptance, node, level, "repair", known.addr if known else "")

    def _start_action(self, action: str, node: str) -> Future:
        return self._pool.submit(executors.run_action, self.settings, action, node)

    def _start_reset(self, node: str, gpu: int) -> Future:
        """Ask the node's agent to reset one GPU, on a thread (the reset takes seconds; the pass goes on)."""
        known = self._nodes.get(node)
        return self._pool.submit(self.agents.reset_gpu, node, gpu, known.addr if known else "", _RESET_TIMEOUT)


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
