"""The notifier: each recommendation, approval, failed repair and critical health finding posted to a webhook.

It runs in the repair service, on threads of its own, so a webhook that is slow or down costs retries, never a
repair step or the agent. The service hands it what is new at every pass (`repair_notices`: the store's new
repair events; `health_notices`: the critical findings in the journals of nodes drained by a health check, read
over their agents' /events, each from where its last read ended), it queues them (at most repair.notify_queue:
when full the oldest queued is dropped, never the one being posted; counted and said once in a
`repair-notify-dropped` event) and one thread posts them in order, each retried repair.notify_retries times with a
doubling wait before it is given up (counted, `repair-notify-failed`).

Each notice is posted at least once, and once as a rule: what was posted (or given up) is written to a small file
on the controller's state volume after each post (`repair-notify.json`: the last repair event id, each node's last
journal event posted and where its journal was last read), and a restarted service starts from there. A service
killed between a post and its save posts that notice again; a stopped notifier never saves again (its successor
owns the file). A first start posts nothing from before it.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Callable

from slurm_ext.fileio import atomic_write

from . import webhook
from .webhook import Notice, WebhookFailed

__all__ = ["Notifier", "Sent", "repair_notices", "health_notices", "SENT_FILE", "NOTIFIED_EVENTS"]

log = logging.getLogger("repair")

#: in node.state_dir: what was posted already
SENT_FILE = "repair-notify.json"
#: the repair events posted, and their severity
NOTIFIED_EVENTS = {"repair-recommended": "warning", "repair-escalated": "warning", "repair-approved": "info",
                   "repair-failed": "critical"}
#: the longest wait between two tries
_MAX_BACKOFF = 300.0
#: a journal that had nothing new is read next from this long before the last ask (a node's clock a little behind
#: the controller's, a line being written as it was read)
_EMPTY_READ_MARGIN = 300.0


class Sent:
    """What was posted already: the last repair event id, and per node the time of the last journal event and the
    digests of the events of that second (two events of one second are told apart by their line); and per node
    where its journal was last read (`reads`). Shared by the notifier's two threads, hence its lock; once closed
    (its notifier stopped) it is never saved again."""

    def __init__(self, path: Path):
        self.path = path
        self.repair_id: int | None = None
        self.nodes: dict[str, dict] = {}
        #: per node, the journal time to read from next (see read_to)
        self.reads: dict[str, float] = {}
        self._lock = threading.RLock()
        self._closed = False
        #: when the notifier first started: a node's journal is read from then on
        self.started = time.time()
        try:
            data = json.loads(path.read_text())
            self.repair_id = int(data["repair_id"]) if data.get("repair_id") is not None else None
            self.started = float(data.get("started", self.started))
            self.nodes = {str(k): {"time": float(v["time"]), "seen": list(v["seen"])}
                          for k, v in dict(data.get("nodes", {})).items()}
            self.reads = {str(k): float(v) for k, v in dict(data.get("reads", {})).items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as err:  # unreadable: start from now, said once
            log.warning("repair: %s cannot be read (%s): notices from before this start are not posted", path, err)

    @property
    def known(self) -> bool:
        return self.repair_id is not None

    def save(self) -> None:
        """Written to its file, unless closed: a stopped notifier's thread that outlived its join would put its
        stale progress over its successor's."""
        with self._lock:
            if self._closed:
                return
            atomic_write(self.path, json.dumps({"repair_id": self.repair_id, "started": self.started,
                                               "nodes": self.nodes, "reads": self.reads}), mode=0o600)

    def close(self) -> None:
        """Never saved again (a save under way ends first)."""
        with self._lock:
            self._closed = True

    def read_from(self, node: str, default: float) -> float:
        """The journal time to ask `node`'s agent for events since."""
        with self._lock:
            return self.reads.get(node, default)

    def read_to(self, node: str, when: float) -> None:
        """`node`'s journal was read up to `when` (never moved back)."""
        with self._lock:
            self.reads[node] = max(self.reads.get(node, when), when)

    def mark(self, notice: Notice) -> None:
        with self._lock:
            self._mark(notice)

    def has(self, notice: Notice) -> bool:
        """`notice` was posted (or given up) already."""
        kind, _, rest = notice.key.partition(":")
        with self._lock:
            if kind == "repair":
                return self.repair_id is not None and int(rest) <= self.repair_id
            node, _, when_digest = rest.partition(":")
            when, _, digest = when_digest.partition(":")
            entry = self.nodes.get(node)
            return entry is not None and (float(when) < entry["time"] or
                                          (float(when) == entry["time"] and digest in entry["seen"]))

    def _mark(self, notice: Notice) -> None:
        kind, _, rest = notice.key.partition(":")
        if kind == "repair":
            self.repair_id = max(self.repair_id or 0, int(rest))
        else:
            node, _, when_digest = rest.partition(":")
            when, _, digest = when_digest.partition(":")
            entry = self.nodes.setdefault(node, {"time": 0.0, "seen": []})
            if float(when) > entry["time"]:
                entry["time"], entry["seen"] = float(when), [digest]
            elif float(when) == entry["time"]:
                entry["seen"].append(digest)


def repair_notices(store, after: int) -> list[Notice]:
    """The repair events after id `after` that are posted, oldest first."""
    found = []
    for event_id, event in store.events_after(after, tuple(NOTIFIED_EVENTS)):
        found.append(Notice(f"repair:{event_id}", event.event, event.node, event.message,
                            NOTIFIED_EVENTS[event.event], event.time, {"user": event.user}))
    return found


def _critical(data: dict) -> bool:
    return data.get("event") in ("health-finding", "health-escalated") and data.get("finding_severity") == "critical"


def health_notices(node: str, page, sent: Sent) -> list[Notice]:
    """The critical findings in a node's journal page not posted yet, oldest first."""
    with sent._lock:
        entry = dict(sent.nodes.get(node, {"time": 0.0, "seen": []}))
    found = []
    for line in page.events:
        if not _critical(line.data):
            continue
        digest = hashlib.sha256(line.line.encode()).hexdigest()[:16]
        if line.time < entry["time"] or (line.time == entry["time"] and digest in entry["seen"]):
            continue
        data = line.data
        fields = {k: data[k] for k in ("check", "gpu", "action") if data.get(k) not in (None, "")}
        found.append(Notice(f"health:{node}:{line.time!r}:{digest}", data["event"], node,
                            str(data.get("message", "")), "critical", line.time, fields))
    return found


class Notifier:
    """The queue and the thread that posts it; `put` never blocks (a full queue drops its oldest). The notice being
    posted is out of the queue (`_posting`), so a drop counts only notices never tried."""

    def __init__(self, url_file: str, form: str, queue: int, retries: int, backoff: float, timeout: float,
                 sent: Sent, emit: Callable[..., object], post: Callable[[str, bytes, float], int] = webhook.post):
        self.url = webhook.read_url(url_file)  # NotifyUrlError at once: the service says so and runs without it
        self.form, self.retries, self.backoff, self.timeout = form, retries, backoff, timeout
        self.sent = sent
        self.emit = emit
        self._post = post
        self._queue: collections.deque[Notice] = collections.deque()
        #: the notice being posted, out of the queue
        self._posting: Notice | None = None
        self._size = queue
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        #: counters for /metrics: posted, retried, dropped (queue full), failed (given up after the retries)
        self.posted = self.retried = self.dropped = self.failed = 0
        #: a drop was said and nothing has been posted since: the next drop is counted, not said again
        self._said_drop = False
        #: an unexpected error in the thread was said (once: the next are counted)
        self._said_crash = False
        #: the keys queued or being posted (a notice handed over twice meanwhile is queued once; a posted one is
        #: told by `sent`)
        self._keys: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="repair-notify", daemon=True)
        self._thread.start()

    def put(self, notices: list[Notice]) -> None:
        with self._lock:
            for notice in notices:
                if notice.key in self._keys or self.sent.has(notice):  # queued, being posted, or posted
                    continue
                self._keys.add(notice.key)
                if len(self._queue) >= self._size:
                    self._drop(self._queue.popleft())
                self._queue.append(notice)
            self._lock.notify()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop posting; a post under way may outlive `timeout`, but nothing is saved after this returns (what it
        posted may be posted again by the next notifier: at least once)."""
        self._stopping.set()
        self.sent.close()
        with self._lock:
            self._lock.notify()
        self._thread.join(timeout)

    def figures(self) -> dict:
        return {"posted": self.posted, "retried": self.retried, "dropped": self.dropped, "failed": self.failed,
                "queue": self.waiting}

    # -- the thread --------------------------------------------------------------------

    def _drop(self, notice: Notice) -> None:
        """(with the lock) the queue is full: `notice`, its oldest, goes unposted."""
        self.dropped += 1
        self._keys.discard(notice.key)
        self._done(notice)
        if not self._said_drop:
            self._said_drop = True
            self.emit("repair-notify-dropped", f"the webhook's queue is full (repair.notify_queue {self._size}): "
                      f"dropped the oldest notice, {notice.event} of node {notice.node}; more drops are counted in "
                      "slurm_ext_repair_notify_dropped_total until a post gets through", "warning",
                      node=notice.node, notice=notice.event)

    def _done(self, notice: Notice) -> None:
        """Posted or given up: remembered, so that a restarted service does not post it again."""
        self.sent.mark(notice)
        try:
            self.sent.save()
        except OSError as err:
            log.warning("repair: cannot write %s: %s (a restart may post a notice again)", self.sent.path, err)

    def _run(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                while not self._queue and not self._stopping.is_set():
                    self._lock.wait()
                if self._stopping.is_set():
                    return
                notice = self._posting = self._queue.popleft()
            try:
                outcome = self._deliver(notice)
            except Exception as err:  # noqa: BLE001 -- a bug must not end the thread: every later notice is lost
                outcome = self._crashed(notice, err)
            with self._lock:
                self._posting = None
                self._keys.discard(notice.key)
                if outcome == "stopped":
                    return  # not marked: the next start posts it
                if outcome == "posted":
                    self.posted += 1
                    self._said_drop = False
                self._done(notice)

    def _crashed(self, notice: Notice, err: Exception) -> str:
        """An error no post should raise: counted as failed, said once (event and log, the class only: the message
        may hold the URL), the thread going on with the next notice."""
        with self._lock:
            self.failed += 1
            said, self._said_crash = self._said_crash, True
        if not said:
            log.error("repair: notifier: %s of node %s not posted: unexpected %s (more are counted in "
                      "slurm_ext_repair_notify_dropped_total)", notice.event, notice.node, type(err).__name__)
            self.emit("repair-notify-failed", f"{notice.event} of node {notice.node} not posted: unexpected "
                      f"{type(err).__name__} in the notifier (a bug: the notifier goes on; more are counted in "
                      "slurm_ext_repair_notify_dropped_total)", "error", node=notice.node, notice=notice.event)
        return "failed"

    def _deliver(self, notice: Notice) -> str:
        """Post `notice`, trying again with a doubling wait: posted, failed (its retries spent: counted, said) or
        stopped (the service stops)."""
        body = webhook.body_of(notice, self.form)
        wait = self.backoff
        for attempt in range(self.retries + 1):
            try:
                self._post(self.url, body, self.timeout)
                return "posted"
            except WebhookFailed as err:
                problem = err.problem
            if attempt == self.retries or self._stopping.wait(wait):
                break
            self.retried += 1
            wait = min(wait * 2, _MAX_BACKOFF)
        if self._stopping.is_set():
            return "stopped"
        with self._lock:
            self.failed += 1
        self.emit("repair-notify-failed", f"{notice.event} of node {notice.node} not posted: {problem} "
                  f"({self.retries + 1} tries, repair.notify_retries); given up", "error", node=notice.node,
                  notice=notice.event)
        return "failed"


class HealthFeed:
    """Reads the journals of the nodes a health check drained, on a thread of its own, and hands their critical
    findings to the notifier: an agent that does not answer costs this thread its timeout, never the service."""

    def __init__(self, notifier: Notifier, agents, sent: Sent, since: float):
        self.notifier, self.agents, self.sent, self.since = notifier, agents, sent, since
        #: reads that ended in an unexpected error (said once)
        self.failed = 0
        self._nodes: dict[str, str] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="repair-notify-health", daemon=True)
        self._thread.start()

    def watch(self, nodes: dict[str, str]) -> None:
        """Read these nodes' journals now (name -> NodeAddr): those drained by a health check in this pass."""
        with self._lock:
            self._nodes = dict(nodes)
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop reading; a read under way may outlive `timeout`: its save is skipped once the notifier, the owner of
        `sent`, has stopped too."""
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                nodes = dict(self._nodes)
            for node, addr in nodes.items():
                if self._stopping.is_set():
                    return
                try:
                    self._read(node, addr)
                except Exception as err:  # noqa: BLE001 -- a bug must not end the thread: no finding would be posted
                    self._crashed(node, err)

    def _read(self, node: str, addr: str) -> None:
        """Read `node`'s journal on from where the last read ended (never again from the notifier's first start:
        a month of a drained node's journal at every pass) and hand its new critical findings over. The read
        moves on to the newest line read, or, when it found notices, to the first of them: a restart before they
        are posted reads them again (those posted meanwhile are told by `sent`); a journal with nothing since is read
        next from a margin before this ask."""
        from slurm_ext.errors import SlurmExtError
        since = self.sent.read_from(node, self.since)
        asked = time.time()
        try:
            page = self.agents.events(node, addr, since=max(0.0, since - 1.0))  # whole seconds asked: one back
        except SlurmExtError as err:  # the next pass asks again
            log.debug("repair: notifier: %s", err)
            return
        notices = health_notices(node, page, self.sent)
        if notices:
            self.sent.read_to(node, notices[0].time)
        elif page.events:
            self.sent.read_to(node, max(line.time for line in page.events))
        else:
            self.sent.read_to(node, asked - _EMPTY_READ_MARGIN)
        self.notifier.put(notices)
        try:
            self.sent.save()
        except OSError as err:
            log.warning("repair: cannot write %s: %s (the next read starts further back)", self.sent.path, err)

    def _crashed(self, node: str, err: Exception) -> None:
        self.failed += 1
        if self.failed == 1:
            log.error("repair: notifier: reading the journal of %s failed: unexpected %s", node, type(err).__name__)
            self.notifier.emit("repair-notify-failed", f"reading the journal of node {node} for critical findings "
                               f"failed: unexpected {type(err).__name__} (a bug: it is read again at the next pass; "
                               "more are not said)", "error", node=node)
