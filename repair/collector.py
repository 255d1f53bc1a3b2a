"""The collector: the controller agent's `collector` worker (`slurm-ext repair collect`).

It takes every node agent's journal, each line once, into the repair
database's node_events (`nodeevents`), so that `history` and the page ask
one table instead of every agent. Each node has a cursor (`journal.read_after`:
a file and a byte offset), kept in the database with the events it moved past
and written in the same transaction, so a collector that stops anywhere
starts again where the database says, and an agent that was away is caught
up from its cursor.

Why it is built this way:

- One Slurm query for the node list (every 4 intervals, a minute at most;
  every interval while it lists none: dynamic nodes register after the
  controller starts), then each node on
  its own clock: asked every `history.interval`, at once again while its answer
  says more is written (a burst is caught up at the speed the database takes
  it, not one page an interval), and after a wait that doubles up to
  `history.retry_max` while its agent does not answer (a cluster with 900
  nodes powered off does not wait on 900 timeouts every interval).
- `history.parallel` agents are asked at once, on threads; the pages are
  stored from the main loop, `history.batch` events a transaction. Events
  read and not stored are the backlog: past `history.backlog` no agent is asked
  (or `history.backlog_bytes`) until the database took them: a database that
  is slow or away costs memory up to that bound, never more, and the events
  wait in the agents' journals (bounded too: a journal rotated past what was
  not taken is said). A full backlog, a database that fails, a page it
  refuses and lines lost to a journal's rotation before they were taken are
  each said in an event and counted in the metrics.
"""

from __future__ import annotations

import heapq
import json
import logging
import queue
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from slurm_ext import config as config_mod, events
from slurm_ext.agentapi import AgentAnswerError, AgentClient
from slurm_ext.errors import SlurmExtError
from slurm_ext.slurm import SlurmClient

from . import metrics, nodeevents
from .store import Store, StoreError, open_store

__all__ = ["Collector", "Figures", "collect", "running", "CONTROL", "LATE"]

log = logging.getLogger("repair")

#: the repair_control row where the collector says it runs: {"interval": s, "nodes": n} and the time
CONTROL = "collector"
#: the collector is said not to run when its last word is older than this many of its intervals (and a minute)
LATE = 3
#: seconds between two reads of Slurm's node list
_NODES_EVERY = 60.0
#: ... and every this many intervals, when that is sooner (a small cluster's new nodes are asked within seconds)
_NODES_INTERVALS = 4
#: seconds between two writes of the figures, of the agents' failures and of the control row
_SAY_EVERY = 5.0
#: seconds between two prunings of the table
_PRUNE_EVERY = 600.0
#: a batch is stored once its oldest page waited this long, full or not
_STORE_AFTER = 1.0
#: after the database failed, the next try
_STORE_RETRY = 5.0
#: the loop wakes for nodes due at most this often (a node due within it is asked with the others)
_TICK = 0.05


@dataclass
class _Node:
    name: str
    addr: str
    cursor: str = ""
    due: float = 0.0
    failures: int = 0
    #: its failure as last written to the database ("" once it answered)
    error: str = ""
    busy: bool = False
    #: when its /health was last asked (once an interval, with the first page)
    health_at: float = -1e18


@dataclass
class Figures:
    """What the collector did since it started (counters) and where it is now (gauges)."""

    events: int = 0
    pages: int = 0
    #: answers that were not a page (no answer, refused, not believed)
    failures: int = 0
    #: pages whose agent gave no /health beside them
    health_failures: int = 0
    #: pages that began at the oldest file kept: the cursor's file had been rotated out
    lost: int = 0
    #: lines that were no journal event, not stored
    odd: int = 0
    #: pages dropped because another collector had moved the node's cursor
    dropped: int = 0
    store_seconds: float = 0.0
    store_failures: int = 0
    #: events a database refused whole pages of (set aside, their cursor moved past them)
    refused: int = 0
    backlog_full: int = 0
    #: now: events read and not stored, nodes whose agent does not answer, nodes known
    backlog: int = 0
    failing: int = 0
    nodes: int = 0


@dataclass
class _Waiting:
    """Pages read and not stored yet."""

    pages: list = field(default_factory=list)
    events: int = 0
    #: the bytes of their lines
    size: int = 0
    since: float = 0.0


class Collector:
    """The loop's state: the nodes with their cursors and clocks, the pages waiting for the database."""

    def __init__(self, config, store: Store, agents: AgentClient, slurm: SlurmClient, emit, clock=time.time):
        self.config = config
        self.settings = config.history
        self.store = store
        self.agents = agents
        self.slurm = slurm
        self.emit = emit
        self.clock = clock
        self.figures = Figures()
        #: held while a pool thread counts in `figures` (the loop's own counts need none)
        self._counting = threading.Lock()
        self.nodes: dict[str, _Node] = {}
        self._due: list[tuple[float, str]] = []
        self._pool = ThreadPoolExecutor(max_workers=self.settings.parallel, thread_name_prefix="collector")
        #: nodes whose agent is being asked, and the answers that came: (node, its answer) from the pool's threads
        self._asked: set[str] = set()
        self._answers: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting = _Waiting()
        self._failed: dict[str, str] = {}
        self._store_failing = ""
        self._store_next = 0.0
        self._full = False
        self._nodes_at = self._said_at = self._pruned_at = -1e18
        #: a single pass: a node is asked again only while its agent has more
        self._once = False

    # -- the loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Until `stop` is set: ask the agents due, store what came, say how it goes."""
        while not stop.is_set():
            self.step(stop)
        self.close()

    def step(self, stop: threading.Event | None = None) -> None:
        now = self.clock()
        if now - self._nodes_at >= self._nodes_every():
            self._refresh_nodes(now)
        self._ask_due(now)
        self._take_answers(self._wait_for(now, stop))
        now = self.clock()
        w = self._waiting
        if w.pages and now >= self._store_next and (w.events >= self.settings.batch or not self._asked
                                                    or now - w.since >= _STORE_AFTER or self._full):
            self._store(now)
        if now - self._said_at >= _SAY_EVERY:
            self._say(now)
        if now - self._pruned_at >= _PRUNE_EVERY and not self._store_failing:
            self._prune(now)

    def once(self) -> Figures:
        """Every node's journal up to its end now (`slurm-ext repair collect --once`): the figures."""
        self._once = True
        self._refresh_nodes(self.clock())
        for node in self.nodes.values():
            node.due = 0.0
        self._due = [(0.0, name) for name in self.nodes]
        while self._due or self._asked or self._waiting.pages:
            self._ask_due(0.0)
            self._take_answers(self._came(1.0) if self._asked else [])
            if self._waiting.pages and (self._waiting.events >= self.settings.batch or not self._asked):
                self._store(self.clock())
                if self._store_failing:
                    raise StoreError(self._store_failing)
        self._say(self.clock())
        self.close()
        return self.figures

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- asking ----------------------------------------------------------------------------------

    def _nodes_every(self) -> float:
        """Seconds between two reads of the node list."""
        if not self.nodes:
            return self.settings.interval
        return min(_NODES_EVERY, _NODES_INTERVALS * self.settings.interval)

    def _refresh_nodes(self, now: float) -> None:
        """Slurm's node list: a new node is asked within one interval (spread, so a start does not ask every agent
        at once), a node gone from slurm.conf no more (its cursor stays; its failure is forgotten). In a single pass
        a list or cursors that cannot be read are an error: no pass claims what it did not read.

        Raises:
            SlurmExtError: in a single pass only."""
        try:
            listed = self.slurm.nodes()
            stored = nodeevents.cursors(self.store)
            names = {n.name for n in listed}
            gone = [name for name, cursor in stored.items() if cursor.error and name not in names]
            if gone:
                nodeevents.forget_errors(self.store, gone)
        except SlurmExtError as err:
            if self._once:
                raise
            log.warning("collector: the node list was not read (%s); the nodes known go on being asked, the list "
                        "is read again in %gs", err, self.settings.interval)
            self._nodes_at = now - self._nodes_every() + self.settings.interval  # tried again in an interval
            return
        self._nodes_at = now
        for name in set(self.nodes) - names:
            del self.nodes[name]
        new = [n for n in listed if n.name not in self.nodes]
        for index, node in enumerate(new):
            known = stored.get(node.name, nodeevents.Cursor(node.name))
            due = now + self.settings.interval * index / max(len(new), 1)
            self.nodes[node.name] = _Node(node.name, node.addr, known.cursor, due, error=known.error)
            heapq.heappush(self._due, (due, node.name))
        for node in listed:
            self.nodes[node.name].addr = node.addr
        self.figures.nodes = len(self.nodes)

    def _ask_due(self, now: float) -> None:
        while self._due and self._due[0][0] <= now and len(self._asked) < self.settings.parallel and not self._over():
            due, name = heapq.heappop(self._due)
            node = self.nodes.get(name)
            if node is None or node.busy or node.due != due:
                continue  # gone, asked already, or due again at another time
            node.busy = True
            self._asked.add(name)
            health = now - node.health_at >= 0.9 * self.settings.interval and not self._once
            node.health_at = now if health else node.health_at
            self._pool.submit(self._fetch, node.name, node.addr, node.cursor, health)
        w, s = self._waiting, self.settings
        if self._over() and not self._full:
            self._full = True
            self.figures.backlog_full += 1
            self.emit("history-backlog-full", f"{w.events} events ({w.size / 2**20:.0f} MiB) read from the agents "
                      f"wait for the database (history.backlog {s.backlog} events, history.backlog_bytes "
                      f"{s.backlog_bytes / 2**20:.0f} MiB): no agent is asked until they are stored; the agents' "
                      "journals hold what comes meanwhile", "warning", backlog=w.events)
        elif self._full and not self._over(half=True):
            self._full = False
            self.emit("history-backlog-cleared", f"the database took the backlog: agents are asked again "
                      f"({w.events} events waiting)", backlog=w.events)

    def _over(self, half: bool = False) -> bool:
        """The backlog is at its bound (`half`: at half of it, where a full one is said to have cleared)."""
        share = 2 if half else 1
        return (self._waiting.events >= self.settings.backlog // share
                or self._waiting.size >= self.settings.backlog_bytes // share)

    def _fetch(self, name: str, addr: str, cursor: str, health: bool) -> None:
        """Ask one agent, on a pool thread (its journal after `cursor`, and its /health when `health`); its answer
        always goes to the loop (a node whose answer never came would never be asked again): (the page, whether more
        is written), or why there is none."""
        try:
            answer = self.agents.journal(name, addr, cursor, self.settings.page_bytes, self.settings.timeout)
            rows = [row for line in answer.lines if (row := nodeevents.row_of(name, line)) is not None]
            odd = len(answer.lines) - len(rows) + answer.skipped
            size = sum(len(line) for line in answer.lines)
            said, came = self._health(name, addr) if health else (None, 0.0)
            page = nodeevents.Page(name, cursor, answer.cursor, answer.boot, rows, answer.lost, odd, size,
                                   health=json.dumps(said) if said else "",
                                   findings=json.dumps((said["monitor"] or {}).get("findings", []) if said else []),
                                   health_at=came)
        except AgentAnswerError as err:
            self._answers.put((name, err.problem))
        except Exception as err:  # a bug: said, and the node asked again later, never a wedged collector
            log.exception("collector: taking node %s's journal failed", name)
            self._answers.put((name, f"collector error: {type(err).__name__}: {err}"))
        else:
            self._answers.put((name, (page, answer.more)))

    def _health(self, name: str, addr: str) -> tuple[dict | None, float]:
        """The node's /health (HealthAnswer.wire()) and when it came, on a pool thread; (None, 0) when it gave none:
        its journal's page is taken all the same, and `status` and the page ask that agent themselves."""
        try:
            return self.agents.health(name, addr, self.settings.timeout).wire(), self.clock()
        except AgentAnswerError as err:
            with self._counting:  # several pool threads at once: a bare += could lose a count
                self.figures.health_failures += 1
            log.info("collector: node %s gave its journal but no /health: %s", name, err.problem)
            return None, 0.0

    def _came(self, timeout: float) -> list[tuple]:
        """The answers that came, waiting up to `timeout` for the first."""
        try:
            found = [self._answers.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                found.append(self._answers.get_nowait())
            except queue.Empty:
                return found

    def _wait_for(self, now: float, stop: threading.Event | None) -> list[tuple]:
        """The answers that came, waiting for one until the next node is due (or a store is), _TICK at least."""
        until = self._due[0][0] if self._due else now + self.settings.interval
        if self._waiting.pages:
            until = min(until, max(self._waiting.since + _STORE_AFTER, self._store_next))
        timeout = min(max(until - now, _TICK), 1.0)
        if self._asked:
            return self._came(timeout)
        if stop is not None:
            stop.wait(timeout)
        else:
            time.sleep(timeout)
        return []

    def _take_answers(self, done: list[tuple]) -> None:
        now = self.clock()
        for name, answer in done:
            self._asked.discard(name)
            node = self.nodes.get(name)
            if isinstance(answer, str):
                self.figures.failures += 1
                if node is not None:
                    node.busy = False
                    node.failures += 1
                    self._reschedule(node, now + min(self.settings.interval * 2 ** node.failures,
                                                     self.settings.retry_max))
                    if answer != node.error:
                        self._failed[name] = answer
                continue
            page, more = answer
            if not self._waiting.pages:
                self._waiting.since = now
            self._waiting.pages.append((page, more))
            self._waiting.events += len(page.rows)
            self._waiting.size += page.size

    def _reschedule(self, node: _Node, due: float, more: bool = False) -> None:
        """Due again at `due`; in a single pass (`once`) only while its agent has `more`."""
        if self._once:
            if not more:
                return
            due = 0.0
        node.due = due
        heapq.heappush(self._due, (due, node.name))

    # -- storing -------------------------------------------------------------------------------

    def _store(self, now: float) -> None:
        """The waiting pages into the database, `history.batch` events a transaction; each node is due again: at
        once when its agent has more, else in an interval. A batch the database refuses is tried page by page: when
        some pages go in and others not, the database is up and those pages are what it refuses (a value no column
        takes): each is set aside, said, and its node's cursor moved past it, so that one page never holds up the
        cluster's history; when none goes in, the database is away and every page waits."""
        waiting = self._waiting.pages
        while waiting:
            count, size = 0, 0
            while count < len(waiting) and (count == 0 or size + len(waiting[count][0].rows) <= self.settings.batch):
                size += len(waiting[count][0].rows)
                count += 1
            batch, waiting = waiting[:count], waiting[count:]
            started = time.monotonic()
            try:
                taken, dropped = nodeevents.take(self.store, [page for page, _ in batch], now)
            except StoreError as err:
                kept = self._page_by_page(batch, err, now) if len(batch) > 1 else batch
                if kept:
                    self._store_failed(err, now)
                    self._waiting = _Waiting(kept + waiting, sum(len(p.rows) for p, _ in kept + waiting),
                                             sum(p.size for p, _ in kept + waiting), self._waiting.since)
                    return
                continue
            self.figures.store_seconds += time.monotonic() - started
            self._recovered()
            self._stored(batch, set(dropped), taken, now)
        self._waiting = _Waiting()

    def _page_by_page(self, batch: list, err: StoreError, now: float) -> list:
        """Each page of a refused batch in a transaction of its own; the pages to keep waiting (all of them when
        none went in: the database is away)."""
        refused = []
        for item in batch:
            try:
                taken, dropped = nodeevents.take(self.store, [item[0]], now)
            except StoreError as alone:
                refused.append((item, alone))
                continue
            self._stored([item], set(dropped), taken, now)
        if len(refused) == len(batch):
            return batch
        self._recovered()
        kept = []
        for (page, more), why in refused:
            self.figures.refused += len(page.rows)
            self.emit("history-page-refused", f"the database refused {len(page.rows)} event(s) of node {page.node}'s "
                      f"journal ({why}): set aside, missing from the history, its cursor moved past them",
                      "error", node=page.node)
            aside = nodeevents.Page(page.node, page.start, page.cursor, page.boot, refused=len(page.rows))
            try:
                taken, dropped = nodeevents.take(self.store, [aside], now)
            except StoreError:
                kept.append((page, more))  # not even its mark: it waits, and the database is said to fail
                continue
            self._stored([(aside, more)], set(dropped), taken, now)
        return kept

    def _recovered(self) -> None:
        if self._store_failing:
            self._store_failing = ""
            self.emit("history-store-recovered", f"the database {self.store.where} takes the agents' events again")

    def _stored(self, batch: list, dropped: set[str], taken: int, now: float) -> None:
        self.figures.events += taken
        self.figures.pages += len(batch) - len(dropped)
        self.figures.dropped += len(dropped)
        for page, more in batch:
            node = self.nodes.get(page.node)
            if page.node not in dropped:
                self.figures.odd += page.odd
                if page.lost:
                    self.figures.lost += 1
                    self.emit("history-journal-lost", f"node {page.node}'s journal had lines rotated out before "
                              f"they were taken (its cursor {page.start} was gone): they are missing from the "
                              "history; the rest was taken from its oldest file kept", "warning", node=page.node)
            if node is None:
                continue
            node.busy = False
            if page.node in dropped:
                log.warning("collector: node %s's cursor was moved by another collector: its page was dropped, and "
                            "its cursor is read again", page.node)
                try:
                    node.cursor = nodeevents.cursors(self.store, [page.node]).get(
                        page.node, nodeevents.Cursor(page.node)).cursor
                except StoreError as err:  # its cursor is read again when the nodes are
                    self._store_failed(err, now)
                    del self.nodes[page.node]
                    continue
            else:
                node.cursor = page.cursor
                node.failures, node.error = 0, ""
                self._failed.pop(page.node, None)
            self._reschedule(node, now if more else now + self.settings.interval, more)

    def _store_failed(self, err: StoreError, now: float) -> None:
        self.figures.store_failures += 1
        self._store_next = now + _STORE_RETRY
        if str(err) != self._store_failing:
            self._store_failing = str(err)
            log.error("collector: %s; tried again every %gs", err, _STORE_RETRY)
            self.emit("history-store-failed", f"the agents' events are not stored: {err}; tried again every "
                      f"{_STORE_RETRY:g}s (at most history.backlog events wait, the agents' journals hold the rest)",
                      "error")

    def _say(self, now: float) -> None:
        """The figures for /metrics, the agents' failures and the control row that says the collector runs."""
        self._said_at = now
        self.figures.backlog = self._waiting.events
        self.figures.failing = sum(1 for node in self.nodes.values() if node.failures)
        figures = {"time": now, **self.figures.__dict__}
        try:
            metrics.write_collector(self.config.node.state_dir, figures)
        except OSError as err:
            log.warning("collector: figures not written: %s", err)
        if self._store_failing:
            return
        if self._failed:  # one line for a wave of them (a rack powered off), not one per node
            named = ", ".join(f"{name} ({why})" for name, why in list(self._failed.items())[:3])
            log.warning("collector: %d node(s) newly give no journal page: %s%s", len(self._failed), named,
                        " ..." if len(self._failed) > 3 else "")
        try:
            if self._failed:
                nodeevents.failed(self.store, self._failed, now)
                for name, problem in self._failed.items():
                    if name in self.nodes:
                        self.nodes[name].error = problem
                self._failed = {}
            self.store.set_control(CONTROL, json.dumps({"interval": self.settings.interval,
                                                        "nodes": len(self.nodes)}), "collector", now)
        except StoreError as err:
            self._store_failed(err, now)

    def _prune(self, now: float) -> None:
        self._pruned_at = now
        try:
            removed = nodeevents.prune(self.store, self.settings.keep, self.settings.max_events, now)
        except StoreError as err:
            self._store_failed(err, now)
            return
        if removed:
            log.info("collector: %d events older than history.keep or beyond history.max_events removed", removed)


def running(said: tuple | None, now: float) -> float:
    """The collector's interval, from its control row `said` ((value, user, time), store.control(CONTROL)), while it
    wrote it within LATE intervals (and a minute); 0 when it never ran or stopped."""
    if said is None:
        return 0.0
    try:
        interval = float(json.loads(said[0]).get("interval", 0.0))
    except (ValueError, AttributeError, TypeError):
        return 0.0
    return interval if interval > 0 and now - said[2] <= max(LATE * interval, 60.0) else 0.0


def collect(config_path: str | None = None, once: bool = False) -> int:
    """The entry point of `slurm-ext repair collect`: the worker's loop, or one pass over every node (`once`)."""
    config = config_mod.load(config_path)
    if not config.history.enabled and not once:
        log.info("collector: history.enabled is false: nothing to do")
        return 0
    said = ""
    while True:  # the database may come up after the controller: wait for it, loudly once
        try:
            store = open_store(config)
            break
        except StoreError as err:
            if once:
                raise
            if str(err) != said:
                said = str(err)
                log.warning("collector: %s; trying again every %gs", err, config.history.interval)
            time.sleep(config.history.interval)
    emit = events.emitter(config.node.state_dir, "repair")
    collector = Collector(config, store, AgentClient.of(config, config.history.timeout), SlurmClient(config.slurm),
                          emit)
    if once:
        figures = collector.once()
        store.close()
        print(f"{figures.events} events stored from {figures.pages} pages of {figures.nodes} nodes; "
              f"{figures.failures} agents gave no page")
        return 1 if figures.failures else 0
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    emit("history-collector-started", f"collecting the agents' journals into {store.where}: each node every "
         f"{config.history.interval:g}s, {config.history.parallel} at once")
    collector.run(stop)
    store.close()
    return 0
