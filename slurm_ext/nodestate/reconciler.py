"""Makes Slurm agree with the node-state owner: one thread's work, Slurm calls and all.

`want` and `clear` may come from any thread (a start step, the agent's loop,
a request of the hook service); they are queued and taken up by the one
thread that calls `reconcile`, so NodeState has a single user and Slurm a
single writer of this node's drain. Each request returns a `Ticket` its
caller may wait on: a start step that needs a drain before slurmd starts
waits for it on its own thread, the agent's loop never does.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from slurm_ext.errors import SlurmExtError
from slurm_ext.slurm import Node, SlurmClient

from .controller import is_repair_reason
from .owner import Drain, Leave, NodeState, Resume, Wait, Want, checked, shows_ours

__all__ = ["Ticket", "Reconciler", "registered"]

log = logging.getLogger("nodestate")

#: most actions in one pass (a re-worded drain, then a resume): a bound, not a number to reach
_ACTIONS_PER_PASS = 4


@dataclass
class Ticket:
    """A want or clear on its way to Slurm; `wait` returns how it ended, None while it has not."""

    owner: str
    reason: str | None
    fields: dict = field(default_factory=dict)
    outcome: str = ""
    #: False: it ended without reaching Slurm (only a look ends so; a want is retried until it does)
    ok: bool = True
    _done: threading.Event = field(default_factory=threading.Event, repr=False)

    def settle(self, outcome: str, ok: bool = True) -> None:
        self.outcome, self.ok = outcome, ok
        self._done.set()

    @property
    def settled(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None) -> str | None:
        return self.outcome if self._done.wait(timeout) else None


def registered(node: Node, since: float | None) -> bool:
    """slurmd has registered with slurmctld, after `since` (epoch seconds) when given.

    Slurm refuses to resume a node whose slurmd does not answer or whose
    last registration was invalid; SlurmdStartTime tells a slurmd started
    after `since` from the one before it (whole seconds: `since` is floored).
    """
    if node.flags & {"NOT_RESPONDING", "INVALID_REG"} or node.state in ("UNKNOWN", "FUTURE"):
        return False
    if since is None:
        return True
    return node.slurmd_start is not None and node.slurmd_start.timestamp() >= math.floor(since)


class Reconciler:
    def __init__(self, slurm: SlurmClient, node: str, emit: Callable[..., object],
                 stale_prefixes: tuple[str, ...] = (), lift_stale: bool = True):
        self.slurm = slurm
        self.node = node
        self.emit = emit
        self.state = NodeState(node, stale_prefixes, lift_stale)
        self._queue: list[tuple[str, str, Ticket]] = []
        self._open: list[tuple[Want | None, Ticket]] = []
        self._lock = threading.Lock()
        self._failing = ""
        #: a resume waits for slurmd to register
        self._waiting = False
        #: the agent of the node's slurmd: when its latest slurmd started (epoch seconds; None: not yet); a
        #: stale drain is lifted only once that slurmd has registered. Left unset by one-off writers.
        self.slurmd_started: float | None = None
        self.runs_slurmd = False
        #: where the drain we want and Slurm does not show is kept for the Prolog (slurm_ext.drainmark; the agent
        #: of the node's slurmd sets it; None: nowhere)
        self.unshown_file: Path | None = None
        #: what unshown_file says (None: not written by this run yet; a previous run's is rewritten at the first pass)
        self._unshown: str | None = None
        #: the last look found our wants held behind someone else's drain: the node is watched closely, since an
        #: admin's resume must be followed by our drain before Slurm gives the node a job
        self.held = False
        #: the node as the last pass read it (None before the first): what /metrics says of its drain
        self.seen: Node | None = None

    # -- requests (any thread) --------------------------------------------------------

    def want(self, owner: str, reason: str, **fields) -> Ticket:
        """Queue a want; raises UnknownReason at once when the reason is not catalogued for `owner`.

        `fields` go into the journal's drain event (e.g. job=...)."""
        text, _ = checked(owner, reason)
        return self._enqueue("want", owner, text, fields)

    def clear(self, owner: str) -> Ticket:
        return self._enqueue("clear", owner, None)

    def look(self) -> Ticket:
        """Settled by the next pass: with what the node shows, or (ok False) with why Slurm did not say."""
        return self._enqueue("look", "", None)

    def _enqueue(self, what: str, owner: str, reason: str | None, fields: dict | None = None) -> Ticket:
        ticket = Ticket(owner, reason, fields or {})
        with self._lock:
            self._queue.append((what, owner, ticket))
        return ticket

    @property
    def busy(self) -> bool:
        """Requests wait, or a resume waits for slurmd: the caller should reconcile again soon."""
        with self._lock:
            return bool(self._queue or self._open or self._waiting)

    # -- the work (the one thread) ------------------------------------------------------

    def reconcile(self) -> Node:
        """Take up queued requests, read the node, write what it needs; returns the node as read.

        Raises:
            SlurmExtError: Slurm did not answer or refused; requests stay, the next call retries.
        """
        with self._lock:
            queued, self._queue = self._queue, []
        looks = []
        for what, owner, ticket in queued:
            if what == "want":
                self._open.append((self.state.want(owner, ticket.reason, **ticket.fields), ticket))
            elif what == "clear":
                gone = self.state.clear(owner)
                self._open.append((None, ticket))
                if gone:
                    log.info("node %s: %s cleared %s", self.node, owner, "; ".join(w.reason for w in gone))
            else:
                looks.append(ticket)
        try:
            node = self._pass()
        except SlurmExtError as err:
            for ticket in looks:
                ticket.settle(str(err), ok=False)
            raise
        for ticket in looks:
            ticket.settle(node.reason if node.drained or node.state == "DOWN" else "")
        return node

    def _pass(self) -> Node:
        node = self.slurm.node(self.node)
        for _ in range(_ACTIONS_PER_PASS):
            # a resume needs a slurmd that answers with a valid registration, not necessarily our newest one;
            # the resume of a stale drain needs this run's slurmd (the one before may still show as registered)
            fresh = (self.slurmd_started is not None and registered(node, self.slurmd_started)) \
                if self.runs_slurmd else None
            action = self.state.step(node, registered(node, None), fresh)
            if isinstance(action, Leave):
                if action.event:
                    self.emit(action.event, action.message, node=self.node)
                break
            if isinstance(action, Wait):
                if not self._waiting:
                    self.emit("resume-waiting", f"node {self.node}: resume from {action.reason!r} waits for slurmd to "
                              "register", node=self.node, reason=action.reason)
                break
            self._write(action, node)
            node = self.slurm.node(self.node)
        self._waiting = isinstance(action, Wait)
        wanted = self.state.desired()
        ours = shows_ours(node) and not is_repair_reason(node.reason)
        self.held = wanted is not None and node.drained and not ours
        self._keep_unshown(wanted if wanted is not None and not ours else "")
        self._settle(node)
        self.seen = node
        return node

    def _keep_unshown(self, reason: str) -> None:
        if self.unshown_file is None or reason == self._unshown:
            return
        try:
            if reason:
                from slurm_ext.fileio import atomic_write
                atomic_write(self.unshown_file, reason + "\n", mode=0o644, fsync="none")
            else:
                os.unlink(self.unshown_file)
        except FileNotFoundError:
            pass
        except OSError as err:  # the Prolog then does not know: the drain still comes, by this thread
            log.error("node %s: cannot keep %s: %s", self.node, self.unshown_file, err.strerror or err)
            return
        self._unshown = reason

    def _write(self, action: Drain | Resume, node: Node) -> None:
        try:
            if isinstance(action, Drain):
                self.slurm.drain(self.node, action.reason)
            else:
                self.slurm.resume(self.node)
        except SlurmExtError as err:
            what = f"drain ({action.reason})" if isinstance(action, Drain) else f"resume from {action.reason!r}"
            if str(err) != self._failing:
                self._failing = str(err)
                state = "+".join([node.state, *sorted(node.flags)])
                self.emit("drain-failed", f"node {self.node} ({state}): cannot {what} now: {err}; retrying",
                          severity="error", node=self.node)
            raise
        self._failing = ""
        self.state.done(action)
        if isinstance(action, Drain):
            was = f" (was {action.replaces!r})" if action.replaces else ""
            self.emit("drain", f"drained node {self.node}: {action.reason}{was}", severity="warning",
                      **{**action.fields, "node": self.node, "reason": action.reason})
        else:
            why = ("left by a previous run of this node" if action.why == "stale"
                   else "no slurm-ext drain is wanted any more")
            self.emit("resume", f"resumed node {self.node} from {action.reason!r}: {why}", node=self.node,
                      reason=action.reason, why=action.why)

    def _settle(self, node: Node) -> None:
        """Tell the waiters whose request Slurm now reflects (or that someone else's drain holds)."""
        foreign = node.drained and (not node.reason_is_ours or is_repair_reason(node.reason))
        still = []
        for want, ticket in self._open:
            if want is None:  # a clear: done once no resume of ours is pending
                if self.state.desired() is None and self.state.shown is not None and not foreign:
                    still.append((want, ticket))
                else:
                    ticket.settle(f"cleared; node {node.name} shows {node.reason or 'no reason'!r}")
            elif foreign:
                ticket.settle(f"held by someone else's drain: {node.reason!r}")
            elif want.dismissed or self.state.wants.get(want.key) is not want:
                ticket.settle(f"dismissed; node shows {node.reason or 'no reason'!r}")
            elif want.shown:
                ticket.settle(f"drained: {node.reason}")
            else:
                still.append((want, ticket))
        self._open = still
