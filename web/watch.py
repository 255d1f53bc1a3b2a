"""The cluster as the page shows it: read once per refresh while someone looks, shared by every browser.

One refresh asks Slurm once per table (the node table: `scontrol show node`,
its JSON from Slurm 23.02; the job queue, with the GPU indexes each running
job holds: `squeue --json` or `scontrol show job -d`; the event table:
`sacctmgr show event`), and reads the repair records and what the
controller's collector took of each node: its journal's state, and its
/health answer (only those taken since the last refresh). A node whose
answer the collector took within 3 of its intervals is not asked; the others
(no collector runs, or it has not come to them) are asked for their /health,
every agent at once. At 10,000 nodes a refresh asks no agent. The nodes'
journals are not asked of the agents: the timeline and the Health checks tab
query the events the collector stored (`journal`: one query, whatever the
number of nodes, its filters in the query).
The result is one `PageView`, which every request of every browser reads: ten
open tabs cost slurmctld what one costs, and when nobody looks nothing is
asked. Slurm's configuration (cluster name, version) is read at the first
refresh and every `_CONFIG_EVERY` after.

A source that fails keeps its last answer, marked with the error and the
age of what is shown, so the page says "slurmctld does not answer; shown:
the state of 2 min ago" and goes on showing it; the next refresh tries
again and recovers by itself. An agent is asked only while Slurm sees its
node answering, or while the agent itself still answered last time: a
cluster of 1,000 nodes with 900 powered off does not wait on 900 timeouts.
"""

from __future__ import annotations

import gc
import logging
import re
import shlex
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone

from slurm_ext import events
from slurm_ext.agentapi import AgentAnswerError, AgentClient, HealthAnswer, FactsReading, get_text
from slurm_ext.errors import SlurmExtError
from slurm_ext.repair.history import result_lines
from slurm_ext.repair.status import (acceptance_state, counts, done_summary, finding_lines, held, node_statuses,
                                     run_summary)
from slurm_ext.slurm import Node, SlurmClient, is_our_reason
from slurm_ext.words import moment

from . import allocation, usage
from .changes import Changes, figures_of, json_bytes

__all__ = ["Source", "PageView", "Watcher", "gpus_by_type", "drain_owner", "ssh_command", "finding_lines"]

log = logging.getLogger("web")

#: seconds between two reads of Slurm's configuration (cluster name, version): it changes with a restart
_CONFIG_EVERY = 600.0
#: agents asked at once
_PARALLEL = 32
#: nodes whose last acceptance run is asked of their agent in one refresh, where the collector took their /health
#: and their journal told of no run (a run older than the timeline, or the page just started)
_RUNS_ASKED = 50
#: points of the usage history kept (at a 5 s refresh: an hour)
_HISTORY = 720
#: newest Slurm events kept from one read of the event table
_SLURM_EVENTS_KEPT = 5000
#: nodes from which a refresh sets what the page holds aside from the cycle collector's passes (_set_aside)
_SET_ASIDE_FROM = 1000
#: refreshes between two whole passes of the cycle collector over what the page holds (5 minutes at a 5 s refresh)
_COLLECT_ALL_EVERY = 60
#: the fields of web.ssh_command
_SSH_FIELD = re.compile(r"\{(node|addr)\}")
#: a refresh runs only while a request came within this many refresh intervals
_LOOKING = 3
#: a monitor's GPU readings older than this, by its agent's clock (and than _STALE_POLLS of its polls), say nothing of
#: now: an NVML hang or a stopped monitor (a held GPU is not flagged idle from them)
_STALE_READINGS = 60.0
_STALE_POLLS = 6


@dataclass
class Source:
    """One thing the page reads, and how it last went."""

    name: str
    ok: bool = False
    error: str = ""
    #: when it last answered (epoch seconds; 0: never)
    answered: float = 0.0
    #: when it first failed in the failure going on now (0: not failing)
    failing_since: float = 0.0

    def success(self, now: float) -> None:
        self.ok, self.error, self.answered, self.failing_since = True, "", now, 0.0

    def failure(self, error: str, now: float) -> None:
        self.failing_since = self.failing_since or now
        self.ok, self.error = False, error


@dataclass
class _Agent:
    """What the page knows of one node's agent."""

    #: its last /health answer
    answer: HealthAnswer | None = None
    answered: float = 0.0
    error: str = ""
    usage: usage.NodeUsage | None = None
    rate: tuple[float, float] | None = None
    #: what the collector says of its journal ("" while it takes it: no agent, lines lost)
    journal_note: str = ""
    #: its last acceptance run as its /acceptance sent it (agentapi checked it), None while none is known; asked at
    #: its first answer and again only after its journal told of a run that ended (acceptance-done)
    acceptance: dict | None = None
    #: its journal's newest acceptance-done as the collector stored it: (its row id, epoch, the event), or None
    done: tuple | None = None
    #: /acceptance is to be asked at its next answer
    acceptance_due: bool = True
    busy: bool = False
    #: when the collector took the /health answer it holds (0: its own agent's answer, or none)
    taken: float = 0.0
    #: its answer's GPUs as the page shows them (usage.gpu_rows), made once an answer: (the answer, the rows)
    gpus: tuple = (None, [])


@dataclass(frozen=True, slots=True)
class _Made:
    """A node's row of the last view and what it was made of."""

    #: what its GPUs' holders and idle counts are made of: its agent's answer and error, whether Slurm's queue was
    #: read, the jobs Slurm runs on it, and its GPUs' holders as Slurm names them (index -> holders)
    inputs: tuple
    #: each GPU's holders, and since when it is held and idle (None: not)
    holders: list
    since: list
    #: what else the row shows: its status and Slurm's node, its agent's word, which GPUs are flagged idle
    shown: tuple
    row: dict


@dataclass
class PageView:
    """One refresh's answer, as the API serves it (JSON-ready)."""

    data: dict
    slurm_events: list = field(default_factory=list)
    repair_events: list = field(default_factory=list)
    #: the repair records still open, and those that changed within web.timeline
    open_records: list = field(default_factory=list)
    records: list = field(default_factory=list)
    _body: bytes | None = field(default=None, repr=False)
    _making: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def body(self) -> bytes:
        """The whole view as JSON (/api/cluster without since: a script's), made at its first request and shared:
        the page's own requests are served from changes.py, and at 10,000 nodes the whole view is 26 MiB that a
        refresh no one reads whole should not make."""
        with self._making:
            if self._body is None:  # a NaN or infinity of an agent's answer made null: a browser would refuse it
                self._body = json_bytes(self.data)
            return self._body


def _done_summary(done: tuple | None) -> dict | None:
    """A node's newest acceptance-done (its row id, epoch, the event) as `status` says a run, None for no event."""
    return done_summary(done[1], done[2]) if done else None


def _plain(record) -> dict:
    """A dataclass of plain fields (texts, numbers, lists of them) as a dict, without asdict's deep copy of every
    value: the view makes one per node and per GPU, 90,000 a refresh at 10,000 nodes of 8 GPUs."""
    return {name: getattr(record, name) for name in record.__dataclass_fields__}


@contextmanager
def _cycles_collected_after():
    """Python's cycle collector held off while a refresh reads and makes its view. At 10,000 nodes a refresh makes a
    few hundred thousand objects (Slurm's tables parsed, the answers taken, the rows of the nodes that changed), and
    each of the collector's passes that so many allocations set off walks everything the page holds (its view
    included): measured, it doubled the refresh. A refresh makes no cycles worth collecting midway (its objects are
    freed by their counts), and the collector runs again as soon as it ends (a refresh that waits for agents holds it
    off a few seconds: the page's request threads' cycles wait that long too)."""
    held = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if held:
            gc.enable()


def _set_aside(refreshes: int) -> None:
    """Everything the page holds after a refresh set aside from the cycle collector's passes (gc.freeze), where the
    cluster is large enough for them to cost: each pass walks what it holds, and at 10,000 nodes (some 850,000
    objects) the survivors of every refresh set off a pass of 0.1 to 0.6 s every refresh or two (measured). What is set
    aside is still freed as soon as nothing refers to it (a row made again, an answer replaced); only a cycle of
    objects waits, for the whole pass every _COLLECT_ALL_EVERY refreshes (set back, collected, set aside again: about
    a second at 10,000 nodes, once that refresh's view is in place; a request that waits for that refresh waits that
    long too). The collector is the process's: the page's server is a process of its own, whose request threads'
    objects are set aside with the view's."""
    if refreshes % _COLLECT_ALL_EVERY == 0:
        gc.unfreeze()
        gc.collect()
    gc.freeze()


def drain_owner(node: Node) -> str:
    """Who owns a node's drain or down reason: slurm-ext, the tool its prefix names (slurm-operator, NHC), or an
    admin (with the user Slurm recorded)."""
    if not node.reason:
        return ""
    if is_our_reason(node.reason):
        return "slurm-ext"
    prefix, sep, _ = node.reason.partition(":")
    if sep and prefix and len(prefix) <= 32 and " " not in prefix:
        return prefix
    return f"admin ({node.reason_user})" if node.reason_user else "admin"


def ssh_command(template: str, node: Node) -> str:
    """web.ssh_command for `node`, its name and address each quoted for a shell: an operator pastes the command into
    one, and a node's address is whatever Slurm reports (`scontrol update NodeAddr=...`), `a; touch x` included."""
    values = {"node": node.name, "addr": node.addr or node.name}
    # in one pass: a value is never read for a field
    return _SSH_FIELD.sub(lambda found: shlex.quote(values[found.group(1)]), template)


def gpus_by_type(nodes: list[Node]) -> dict[str, int]:
    """GPUs configured in Slurm by type (gpu:h200:4,gpu:a100:2(S:0) -> {h200: 4, a100: 2}; untyped: "gpu")."""
    found: dict[str, int] = {}
    for node in nodes:
        for item in node.gres.split(","):
            parts = item.split("(", 1)[0].split(":")
            if parts[0] != "gpu" or len(parts) < 2 or not parts[-1].isdigit():
                continue
            kind = parts[1] if len(parts) == 3 else "gpu"
            found[kind] = found.get(kind, 0) + int(parts[-1])
    return found


class Watcher:
    """The shared view and the thread that refreshes it while someone looks."""

    def __init__(self, config, slurm: SlurmClient | None = None, store=None, get=get_text,
                 agents: AgentClient | None = None, clock=time.time):
        self.config = config
        self.settings = config.web
        self.slurm = slurm or SlurmClient(config.slurm)
        self._store = store
        #: a plain bounded GET (the Prometheus); the agents are asked through `agents` only
        self._get = get
        self.agent_client = agents or AgentClient.of(config, self.settings.agent_timeout)
        self._clock = clock
        self.emit = events.emitter(config.node.state_dir, "web")
        self.sources = {name: Source(name) for name in ("slurm", "slurm-jobs", "slurm-events", "repair",
                                                        "prometheus")}
        self._nodes: list[Node] = []
        self._jobs: list = []
        self._idle = allocation.IdleGpus()
        self._slurm_events: list = []
        self._records: list = []
        self._repair_events: list = []
        self._open: list = []
        self._paused: dict | None = None
        self._agents: dict[str, _Agent] = {}
        #: each node's row of the last view, with what it was made of (_view_of makes it again only when that changed)
        self._rows: dict[str, _Made] = {}
        #: the /health answers the collector took (nodeevents.StoredHealth by node), read from the newest held on
        self._taken: dict = {}
        #: the collector's word: its interval while it runs lately, 0 while it does not
        self._collecting = 0.0
        #: the nodes whose agent the collector failed to reach at its last try
        self._failing: set = set()
        self._config: dict = {}
        self._config_read = 0.0
        self._prometheus: usage.Usage | None = None
        self.history: deque = deque(maxlen=_HISTORY)
        self.view: PageView | None = None
        #: each view's rows with the version at which they changed: what the page is sent (changes.py)
        self.changes = Changes()
        self.refreshes = 0
        self._looked = 0.0
        #: held while an agent's answer is taken in, and while the view reads the agents
        self._lock = threading.Lock()
        #: the repair database's one connection, used by the refresh and by requests' journal queries (neither
        #: driver's connection may be used by two threads at once)
        self._store_lock = threading.Lock()
        self._wake = threading.Event()
        self._events_future = None
        self._stop = threading.Event()
        #: notified after each refresh of the thread
        self._refreshed = threading.Condition()
        self._pool = ThreadPoolExecutor(max_workers=_PARALLEL, thread_name_prefix="web-agent")
        #: the repair database's read of a refresh and Slurm's queue, while the node table is read: threads of their
        #: own, never queued behind the agents the last refresh asked (a hung agent waits out its timeout in the
        #: pool); each refresh waits for both
        self._reader = ThreadPoolExecutor(max_workers=2, thread_name_prefix="web-read")
        self._thread: threading.Thread | None = None

    # -- the thread ------------------------------------------------------------------------

    def start(self) -> Watcher:
        self._thread = threading.Thread(target=self._run, name="web-refresh", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._reader.shutdown(wait=False, cancel_futures=True)
        gc.unfreeze()  # what a refresh set aside (_set_aside) is the cycle collector's again

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.settings.refresh)
            self._wake.clear()
            if self._stop.is_set():
                break
            now = self._clock()
            if now - self._looked > _LOOKING * self.settings.refresh:
                continue  # nobody looks: Slurm is not asked
            if self.view is not None and now - self.view.data["refreshed"] < 0.9 * self.settings.refresh:
                continue
            try:
                self.refresh()
            except Exception:  # a bug here must not end the page: the last view stays, the next refresh tries again
                log.exception("web: refresh failed")
            with self._refreshed:
                self._refreshed.notify_all()

    def current(self, wait: float = 30.0) -> PageView | None:
        """The latest view (a request's), waking the thread when a refresh is due. A request that finds no view,
        or one from before nobody looked (the page idle for a while), waits for the refresh it asked for, up to
        `wait` seconds, rather than show the cluster as it was minutes ago."""
        now = self._looked = self._clock()
        age = now - self.view.data["refreshed"] if self.view is not None else None
        if age is None or age >= self.settings.refresh:
            with self._refreshed:
                self._wake.set()
                if age is None or age > _LOOKING * self.settings.refresh:
                    self._refreshed.wait(wait)
        return self.view

    # -- one refresh -------------------------------------------------------------------------

    def refresh(self) -> PageView:
        """Read the cluster once (one query per Slurm table) and make the view every browser gets."""
        now = self._clock()
        self.refreshes += 1
        with _cycles_collected_after():
            waiting = self._read(now)
            wait(waiting, timeout=self.settings.agent_timeout + 1.0)
            view = self._make_view(now)
            self.changes.take(view)  # before it is served: the page's requests find what changed ready
            self.view = view
            if len(self._nodes) >= _SET_ASIDE_FROM:
                _set_aside(self.refreshes)
            else:  # a cluster that became small: nothing set aside any more
                gc.unfreeze()
        return view

    def _read(self, now: float) -> list:
        """Read every source; the futures of what is still being asked (the event table, agents)."""
        if self._events_future is None or self._events_future.done():  # a slow slurmdbd is not asked twice at once
            self._events_future = self._pool.submit(self._read_slurm_events, now)
        # the collector's part of the repair database is read while Slurm answers (its node table of 10,000 nodes:
        # 0.1 s to ask on this 2-core machine, 0.2 s to read where most lines changed)
        journals = self._reader.submit(self._read_journals, now, {name: found.taken for name, found in
                                                                  self._taken.items()})
        queue = self._reader.submit(self.slurm.queue)  # squeue answers while the node table is read
        if self._read_nodes(now):
            self._read_config(now)
            self._read_jobs(queue, now)
        else:
            wait([queue])  # not left running into the next refresh; Slurm away is said once, by the node table
        with self._lock:  # a node Slurm no longer lists is forgotten; a new one gets its record
            self._agents = {n.name: self._agents.get(n.name) or _Agent() for n in self._nodes}
        self._take_journals(journals.result())  # before the agents are asked: a run that ended is asked for now
        self._taken = {name: found for name, found in self._taken.items() if name in self._agents}
        asked = self._ask_agents(now)
        self._read_repair(now)
        if self.settings.prometheus_url:
            self._read_prometheus(now)
        return [self._events_future, *asked]

    def _read_nodes(self, now: float) -> bool:
        try:
            self._nodes = self.slurm.nodes()
        except SlurmExtError as err:
            self._fail("slurm", str(err), now)
            return False
        self._succeed("slurm", now)
        return True

    def _read_jobs(self, queue: Future, now: float) -> None:
        """Slurm's queue, as `queue` (slurm.queue on the read thread) read it; not taken when the node table was not
        (Slurm away: said once, by the node table)."""
        try:
            self._jobs = queue.result()
        except SlurmExtError as err:
            self._fail("slurm-jobs", str(err), now)
            return
        self._succeed("slurm-jobs", now)

    def _read_slurm_events(self, now: float) -> None:
        since = datetime.fromtimestamp(now - self.settings.timeline, timezone.utc)
        try:
            found = self.slurm.node_events(None, since)
        except SlurmExtError as err:
            self._fail("slurm-events", str(err), now)
            return
        self._slurm_events = found[-_SLURM_EVENTS_KEPT:]
        self._succeed("slurm-events", now)

    def _read_config(self, now: float) -> None:
        if now - self._config_read < _CONFIG_EVERY and self._config:
            return
        try:
            text = self.slurm.show_config()
        except SlurmExtError:
            return  # the node table's failure already says Slurm is away; tried again next refresh
        self._config_read = now
        self._config = {"ClusterName": text.get("ClusterName", ""), "SLURM_VERSION": text.get("SLURM_VERSION", ""),
                        "SlurmctldHost": text.get("SlurmctldHost[0]") or text.get("SlurmctldHost", "")}

    def _read_repair(self, now: float) -> None:
        since = now - self.settings.timeline
        try:
            with self._store_lock:
                self._read_records(self._repair_store(), since)
        except SlurmExtError as err:
            with self._store_lock:
                if self._store is not None:  # opened again next time (MariaDB restarted, the file replaced)
                    self._store.close()
                    self._store = None
            self._fail("repair", str(err), now)
            return
        self._succeed("repair", now)

    def _read_records(self, store, since: float) -> None:
        from slurm_ext.repair.decide import paused
        self._open = store.records(open_only=True)
        self._records = store.records(since=since)
        self._repair_events = store.events(since=since, limit=20000)
        stop = paused(store)
        self._paused = {"by": stop[0], "since": stop[1]} if stop else None

    def _repair_store(self):
        if self._store is None:
            from slurm_ext.repair.store import open_store
            self._store = open_store(self.config, create=False, role="page")
        return self._store

    def _read_prometheus(self, now: float) -> None:
        try:
            self._prometheus = usage.prometheus_usage(self.settings.prometheus_url,
                                                      lambda url: self._get(url, self.settings.agent_timeout))
        except ValueError as err:
            self._fail("prometheus", str(err), now)
            return
        self._succeed("prometheus", now)

    def _fail(self, name: str, error: str, now: float) -> None:
        source = self.sources[name]
        if source.ok or not source.failing_since:
            self.emit("web-source-failed", f"{name}: {error}; the page shows its last answer"
                      + (f" of {moment(source.answered)}"
                         if source.answered else ""), "warning", source=name)
        source.failure(error, now)

    def _succeed(self, name: str, now: float) -> None:
        source = self.sources[name]
        if source.failing_since:
            self.emit("web-source-ok", f"{name} answers again (it failed for {now - source.failing_since:.0f}s)",
                      source=name)
        source.success(now)

    # -- the agents ------------------------------------------------------------------------------

    def _ask_agents(self, now: float) -> list:
        """Take in what the collector took of each node lately, and ask the other nodes' agents (their futures)."""
        from slurm_ext.repair.collector import LATE
        asked, runs_asked = [], 0
        fresh = now - LATE * self._collecting
        for node in self._nodes:
            agent = self._agents[node.name]
            found = self._taken.get(node.name)
            if self._collecting and found is not None and found.taken >= fresh and node.name not in self._failing:
                self._use_taken(agent, found)
                # its last run: one its journal told of, or at the page's start (a run older than the timeline), a
                # few nodes a refresh
                if agent.acceptance_due and not agent.busy and (agent.done is not None or (
                        agent.acceptance is None and runs_asked < _RUNS_ASKED)):
                    agent.busy, runs_asked = True, runs_asked + 1
                    asked.append(self._pool.submit(self._ask_acceptance, node, agent))
                continue
            if agent.busy:
                continue  # its last request has not come back: not asked twice
            if not node.responding and not (agent.answered and not agent.error):
                agent.error = agent.error or f"not asked: Slurm shows the node {node.state.lower()}, not answering"
                continue
            agent.busy = True
            asked.append(self._pool.submit(self._ask_agent, node, agent, now))
        return asked

    def _use_taken(self, agent: _Agent, found) -> None:
        """A /health answer the collector took, as the node's own answer would be taken in (not over a newer answer
        the page had of the agent itself)."""
        if agent.taken == found.taken or (not agent.taken and agent.answered > found.taken and not agent.error):
            return
        self._take_in(agent, found.answer, found.taken, found.taken)

    def _take_in(self, agent: _Agent, answer, answered: float, taken: float) -> None:
        """An agent's /health answer taken in, whoever brought it (`taken`: its time in the collector's table, 0 for
        the agent's own answer to the page): its GPU rows and figures made once, outside the lock, and its rate
        against the last answer's figures."""
        gpus = usage.gpu_rows(answer)
        figures = usage.node_usage(answer, gpus)
        with self._lock:
            agent.rate = usage.bandwidth(agent.usage, figures)
            agent.answer, agent.answered, agent.error, agent.taken = answer, answered, "", taken
            agent.gpus, agent.usage = (answer, gpus), figures

    def _ask_acceptance(self, node: Node, agent: _Agent) -> None:
        try:
            run = self.agent_client.acceptance(node.name, node.addr, timeout=self.settings.agent_timeout).run
            with self._lock:
                agent.acceptance, agent.acceptance_due = run, False
        except AgentAnswerError as err:  # the run its journal told of stands
            log.info("web: %s", err)
            agent.acceptance_due = err.status != 404
        finally:
            agent.busy = False

    def _ask_agent(self, node: Node, agent: _Agent, now: float) -> None:
        try:
            timeout = self.settings.agent_timeout
            try:
                health = self.agent_client.health(node.name, node.addr, timeout)
            except AgentAnswerError as err:
                with self._lock:
                    agent.error = f"agent at {err.address}: {err.problem}"
                return
            run = agent.acceptance
            if agent.acceptance_due:
                try:
                    run = self.agent_client.acceptance(node.name, node.addr, timeout=timeout).run
                    agent.acceptance_due = False
                except AgentAnswerError as err:  # the last run known stands (an agent older than /acceptance: none)
                    log.info("web: %s", err)
                    agent.acceptance_due = err.status != 404
            with self._lock:
                agent.acceptance = run
            self._take_in(agent, health, now, 0.0)
        except Exception:  # an answer no one foresaw: this agent's, logged; the others and the page go on
            log.exception("web: the answer of node %s's agent could not be taken", node.name)
            agent.error = "its agent's answer could not be read (see the page's log)"
        finally:
            agent.busy = False

    def _read_journals(self, now: float, held: dict[str, float]) -> tuple | None:
        """What the collector says of each node's journal (an agent it cannot reach, lines lost), the /health answers
        it took since the last refresh (those not `held`: node -> the time of the answer the page holds), each node's
        newest acceptance-done, and whether it runs; None when the repair database cannot be read. A few queries,
        whatever the number of nodes."""
        from slurm_ext.repair import nodeevents
        from slurm_ext.repair.collector import CONTROL, LATE, running
        try:
            with self._store_lock:
                store = self._repair_store()
                failing = nodeevents.failing(store)
                since = now - self.settings.timeline
                lost = nodeevents.lost_marks(store, since)
                done = nodeevents.newest_runs(store, since)
                interval = running(store.control(CONTROL), now)
                # only the answers of the last intervals this page does not hold yet
                taken = nodeevents.health(store, now - LATE * interval, held) if interval else {}
        except SlurmExtError as err:
            self._fail("repair", str(err), now)
            return None
        return failing, lost, done, interval, taken

    def _take_journals(self, found: tuple | None) -> None:
        """_read_journals' answer on the nodes: a run that ended since the last refresh has /acceptance asked at the
        node's next answer."""
        if found is None:
            return
        failing, lost, done, self._collecting, taken = found
        self._taken.update(taken)
        # an agent the collector failed to reach after its last answer: that answer is not what the node says now
        self._failing = set(failing)
        with self._lock:
            for name, agent in self._agents.items():
                cursor, mark = failing.get(name), lost.get(name)
                said = [f"the collector has no journal from its agent since {moment(cursor.failing_since)}: "
                        f"{cursor.error}"] if cursor else []
                said += [f"{mark.message} ({moment(mark.time)})"] if mark else []
                agent.journal_note = "; ".join(said)
                latest = done.get(name)
                if latest is not None and (agent.done is None or latest.id != agent.done[0]):
                    agent.acceptance_due = agent.acceptance_due or agent.done is not None or agent.acceptance is None
                    agent.done = (latest.id, latest.time, latest.data())  # read once a run: the row keeps it

    def acceptance_runs(self, node: str | None = None) -> list[dict]:
        """Each node's last acceptance run (of `node`; None: every node), by node name: {"node", "run": its
        /acceptance's run or None, "summary": run_summary's (or its journal's newest acceptance-done's where its agent
        sent no run: an agent older than /acceptance, or one that did not answer it yet), "lines": that event's result
        lines, each with its figures}."""
        with self._lock:
            agents = [(name, agent.acceptance, agent.done)
                      for name, agent in sorted(self._agents.items()) if node in (None, name)]
        found = []
        for name, run, done in agents:
            done = done if run is None else None
            found.append({"node": name, "run": run, "summary": run_summary(run) or _done_summary(done),
                          "lines": list(result_lines(done[2])) if done else []})
        return found

    def journal(self, limit: int = 500, node: str | None = None, components: tuple[str, ...] = (),
                but: tuple[str, ...] = (), severity: str = "", text: str = "") -> list[tuple[float, str, dict]]:
        """The newest `limit` journal events the collector stored, of `node` (None: of every node), of `components`
        (none of `but`), of `severity`, whose component/event holds `text`, newest first: (epoch, node, event).
        One query of the repair database, its filters in the query, so `limit` counts what is shown.

        Raises:
            SlurmExtError: the database cannot be read (the message names it)."""
        from slurm_ext.repair import nodeevents
        since = self._clock() - self.settings.timeline
        with self._store_lock:
            found = nodeevents.events(self._repair_store(), since, node=node, components=components, but=but,
                                      severities=(severity,) if severity else (), text=text, limit=limit)
        return [(e.time, e.node, e.data()) for e in reversed(found)]

    # -- the view --------------------------------------------------------------------------------------

    def _make_view(self, now: float) -> PageView:
        with self._lock:
            return self._view_of(now)

    def _gpu_states(self, node: Node, agent: _Agent, gpus: list, named: dict, known: dict, jobs: list,
                    queue_read: bool, now: float) -> tuple[list, list]:
        """Each of a node's GPUs' holders, and since when it has been held and idle (None: not, or not known)."""
        # Slurm's allocation names the holders; the agent's own records (its Prolog's) where Slurm names none, of jobs
        # Slurm runs on the node (a record outlives a job whose Epilog never ran: a gone job holds no GPU), or all of
        # them while Slurm's queue was never read
        running_here = {job["job_id"] for job in jobs}
        holders = [named.get(gpu.index) or [allocation.GpuHolder(j, known[j].user if j in known else "",
                                                                 known[j].partition if j in known else "",
                                                                 known[j].name if j in known else "")
                                            for j in gpu.jobs if not queue_read or j in running_here]
                   for gpu in gpus]
        if agent.error:
            return holders, [None] * len(gpus)
        monitor = agent.answer.monitor if agent.answer is not None else None
        # a utilization its monitor read long ago (an NVML hang, a stopped monitor) is not known now
        stale = monitor is not None and agent.answer.time - monitor.readings_time > max(
            _STALE_READINGS, _STALE_POLLS * monitor.interval)
        return holders, self._idle.node(node.name, [(gpu.index, tuple(h.job_id for h in held),
                                                     None if stale else gpu.utilization)
                                                    for gpu, held in zip(gpus, holders)],
                                        self.settings.idle_utilization, now)

    def _row(self, status, node: Node, agent: _Agent, gpus: list, states: list, jobs: list) -> dict:
        """A node's row of the view: its status, its agent's word and its GPUs (`states`: each one's holders, since when
        it is idle, and whether it is flagged idle)."""
        answer = agent.answer
        monitor = answer.monitor if answer is not None else None
        findings = list(monitor.findings) if monitor is not None else []
        readings = [{**_plain(gpu), "holders": [_plain(h) for h in holders], "idle_since": since, "idle": flagged}
                    for gpu, (holders, since, flagged) in zip(gpus, states)]
        return {**_plain(status), "owner": drain_owner(node), "addr": node.addr, "version": node.version,
                "os": node.os,
                "gpus_total": sum(gpus_by_type([node]).values()),
                "gpu_readings": readings,
                "figures": figures_of(gpus, sum(flagged for _, _, flagged in states)),
                "jobs": jobs,
                "agent_findings": findings,
                "findings_shown": finding_lines(status.findings, findings),
                # what the agent measures now: none from the last answer of an agent that no longer answers (a check
                # read "ok" then is not "ok" now)
                "checks": dict(monitor.checks) if monitor is not None and not agent.error else {},
                "held": held(findings) if status.state == "paused" else [],
                "acceptance": run_summary(agent.acceptance) or _done_summary(agent.done),
                "agent": {"answered": agent.answered or None, "error": agent.error,
                          "readings_time": monitor.readings_time if monitor is not None else None,
                          "journal": agent.journal_note},
                "ssh": ssh_command(self.settings.ssh_command, node),
                "grafana": self.settings.grafana_url.replace("{node}", node.name)}

    def _view_of(self, now: float) -> PageView:
        statuses = node_statuses(self._nodes, self._open, self._repair_events)
        by_name = {n.name: n for n in self._nodes}
        held_by = allocation.holders(self._jobs)
        jobs_of = allocation.node_jobs(self._jobs)
        known = {j.job_id: j for j in self._jobs}
        queue_read = bool(self.sources["slurm-jobs"].answered)
        read = set()
        rows, made, node_usages, rates = [], {}, [], []
        drivers, images, interfaces = {}, {}, {}
        for status in statuses:
            node = by_name[status.name]
            agent = self._agents.get(node.name, _Agent())
            answer = agent.answer
            monitor = answer.monitor if answer is not None else None
            facts = answer.facts if answer is not None else FactsReading()
            if agent.usage is not None and not agent.error:
                node_usages.append(agent.usage)
                if agent.rate is not None:
                    rates.append(agent.rate)
            for found, value in ((drivers, monitor.driver if monitor is not None else ""), (images, facts.os)):
                if value:
                    found[value] = found.get(value, 0) + 1
            for interface in facts.interfaces:
                if interface.name is None:
                    continue  # an interface that does not say its name cannot be told from another
                seen = interfaces.setdefault(interface.name, {"nodes": 0, "speeds_mbps": set()})
                seen["nodes"] += 1
                if interface.speed_mbps is not None:
                    seen["speeds_mbps"].add(interface.speed_mbps)
            # made once an answer, as it is taken in (an answer the collector took comes at its interval, not each
            # refresh)
            gpus = agent.gpus[1] if agent.gpus[0] is answer else usage.gpu_rows(answer)
            agent.gpus = (answer, gpus)
            jobs_here, held_here = jobs_of.get(node.name, []), held_by.get(node.name, {})
            inputs = (answer, agent.error, queue_read, jobs_here, held_here)
            # at 10,000 nodes most nodes' GPUs are as the last refresh saw them (the collector brings a third of the
            # answers a refresh, Slurm's allocation moves little): their holders and idle counts are kept, and their
            # rows where nothing else they show changed
            kept = self._rows.get(node.name)
            kept = kept if kept is not None and kept.inputs == inputs else None
            if kept is not None:
                holders, since = kept.holders, kept.since
            else:
                holders, since = self._gpu_states(node, agent, gpus, held_here, known, jobs_here, queue_read, now)
            if not agent.error:  # a reading of an agent that no longer answers is not counted idle or busy
                read.add(node.name)
            flagged = [found is not None and now - found >= self.settings.idle_gpu_after for found in since]
            shown = (status, node, agent.answered, agent.journal_note, agent.acceptance, agent.done, flagged)
            if kept is not None and kept.shown == shown:
                row = kept.row
            else:
                row = self._row(status, node, agent, gpus, list(zip(holders, since, flagged)), jobs_here)
            made[node.name] = _Made(inputs, holders, since, shown, row)
            rows.append(row)
        self._rows = made
        idle = sum(row["figures"][-1] for row in rows)
        self._idle.forget_except(read)
        configured = gpus_by_type(self._nodes)
        allocated = allocation.allocation_summary(self._nodes, self._jobs, configured, idle)
        figures = self._prometheus if self.settings.prometheus_url else usage.cluster_usage(node_usages, rates)
        if figures is not None:  # [time, utilization %, memory used, memory total, rx, tx, GPUs allocated %]
            self.history.append([round(now, 3), figures.gpu_utilization, figures.memory_used_mib,
                                 figures.memory_total_mib, figures.rx_bps, figures.tx_bps, allocated["share"]])
        answering = [n for n in self._nodes if not self._agents.get(n.name, _Agent()).error]
        accepting = acceptance_state(self.config, [replace(s, acceptance=r["acceptance"]) for s, r in
                                                   zip(statuses, rows) if r["acceptance"]])
        data = {
            "refreshed": now,
            "refresh": self.settings.refresh,
            "sources": {name: {**asdict(s), "age": round(now - s.answered, 1) if s.answered else None}
                        for name, s in self.sources.items()
                        if name != "prometheus" or self.settings.prometheus_url},
            "agents": {"answering": len(answering), "nodes": len(self._nodes),
                       "not_answering": {n.name: self._agents[n.name].error for n in self._nodes
                                         if n.name in self._agents and self._agents[n.name].error}},
            "counts": counts(statuses),
            "paused": self._paused,
            "acceptance": accepting,
            "cluster": {"name": self._config.get("ClusterName", ""), "controller": self._config.get("SlurmctldHost", ""),
                        "slurm_version": self._config.get("SLURM_VERSION", ""),
                        "slurmd_versions": sorted({n.version for n in self._nodes if n.version}),
                        "nodes": len(self._nodes), "gpus_by_type": configured,
                        "drivers": drivers, "os_images": images,
                        "kernels": sorted({n.os.split(" #", 1)[0] for n in self._nodes if n.os}),
                        "interfaces": {name: {"nodes": v["nodes"], "speeds_mbps": sorted(v["speeds_mbps"])}
                                       for name, v in sorted(interfaces.items())},
                        "fields": dict(self.settings.fields)},
            "queue": allocation.queue_summary(self._jobs),
            "allocation": {**allocated, "idle_below": self.settings.idle_gpu_below,
                           "idle_after": self.settings.idle_gpu_after},
            "usage": {"source": "prometheus" if self.settings.prometheus_url else "agents",
                      "now": asdict(figures) if figures is not None else None,
                      "history": list(self.history), "grafana": self.settings.grafana_url.replace("{node}", "")},
            "nodes": rows,
        }
        return PageView(data, slurm_events=list(self._slurm_events), repair_events=list(self._repair_events),
                        open_records=list(self._open), records=list(self._records))
