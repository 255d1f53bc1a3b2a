"""The agent's one thread that talks to Slurm: the node-state owner's reconciler and the node's readiness.

scontrol can take seconds (up to slurm.timeout when slurmctld is away); the
agent's loop must keep reaping and restarting meanwhile, so every Slurm call
happens here. Wants and clears come from the loop (a crash loop), from start
steps (gres) and, through the node-state socket, from the hook service;
this thread makes Slurm agree (slurm_ext.nodestate), retrying while Slurm is
unreachable, and keeps the node's readiness up to date: registered by the
slurmd started last, responding, and (Slurm >= 25.11) not hung or unready by its
slurmd's own /readyz (slurm_ext.slurm.slurmd_unready).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

from slurm_ext import drainmark, nodestate
from slurm_ext.errors import SlurmExtError
from slurm_ext.slurm import Node, SlurmClient, slurmd_unready

__all__ = ["SlurmLiaison"]

log = logging.getLogger("supervisor")

#: how often to ask while something is due (a request, a resume waiting for slurmd, a slurmd to register)
_BUSY_INTERVAL = 0.25
#: how often to look while a drain of ours waits behind someone else's: their resume must be followed by ours
#: before Slurm starts a job on the node (the Prolog refuses one meanwhile)
_HELD_INTERVAL = 0.5
#: how long slurmd's own /readyz (Slurm >= 25.11) may take to answer: this thread also owns the node's state
_READYZ_TIMEOUT = 1.0
#: how often an unchanged failure to reach Slurm is logged again
_REPEAT_FAILURE_EVERY = 60.0


class SlurmLiaison(threading.Thread):
    def __init__(self, slurm: SlurmClient, node: str, ready_interval: float, emit: Callable[..., dict],
                 runtime_dir: Path, stale_prefixes: tuple[str, ...] = (), on_change: Callable[[], None] = lambda: None,
                 runs_slurmd: bool = False):
        super().__init__(name="slurm-liaison", daemon=True)
        self.node = node
        self.ready_interval = ready_interval
        self.emit = emit
        self.owner = nodestate.Reconciler(slurm, node, emit, stale_prefixes)
        self.owner.runs_slurmd = runs_slurmd
        if runs_slurmd:
            self.owner.unshown_file = drainmark.path(runtime_dir)
        #: wakes the agent's loop when readiness changes
        self.on_change = on_change
        #: whether to poll the node for readiness (the role runs slurmd)
        self.watch_node = runs_slurmd
        #: last answer: the node is registered (by the slurmd started last) and responding
        self.node_ok = False
        self.node_problem = "not asked yet"
        #: the node as Slurm last showed it (where its slurmd answers /readyz), once read
        self._node: Node | None = None
        #: epoch time of the latest slurmd start: the node is ready once that slurmd has registered
        self._slurmd_started: float | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        #: Slurm failing to answer: since when, the last error logged and when (see _failed)
        self._failing_since: float | None = None
        self._last_error = ""
        self._last_logged = 0.0
        #: the node-state socket: served by the agent of the node's slurmd, whose hook service drains through it
        self.channel: nodestate.ChannelServer | None = None
        if runs_slurmd:
            try:
                self.channel = nodestate.ChannelServer(nodestate.socket_path(runtime_dir), self.owner)
            except OSError as err:
                emit("nodestate-socket-failed", f"cannot serve {nodestate.socket_path(runtime_dir)}: {err}; the "
                     "hook service will drain the node itself", severity="error")

    # -- the agent's side ------------------------------------------------------------

    def want(self, owner: str, reason: str) -> nodestate.Ticket:
        ticket = self.owner.want(owner, reason)
        self.poke()
        return ticket

    def clear(self, owner: str) -> nodestate.Ticket:
        ticket = self.owner.clear(owner)
        self.poke()
        return ticket

    def look(self) -> nodestate.Ticket:
        """Settled once the owner has read the node (a start step waits for it: is Slurm there?)."""
        ticket = self.owner.look()
        self.poke()
        return ticket

    def slurmd_started(self) -> None:
        """A slurmd has just been started: the node is ready again once it has registered."""
        self._slurmd_started = self.owner.slurmd_started = time.time()
        self.node_ok = False
        self.node_problem = "slurmd started, not registered yet"
        self.poke()

    def poke(self) -> None:
        """Act now rather than at the next interval."""
        if self.channel is not None:
            self.channel.poke()
        else:
            self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self.poke()

    # -- the thread ---------------------------------------------------------------------

    def run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    # the other roles' agents ask Slurm only when one of their own wants a drain (a crash loop)
                    if self.watch_node or self.owner.busy or self.owner.state.wants or self.owner.state.shown:
                        node = self.owner.reconcile()
                        self._answered()
                        if self.watch_node:
                            self._check_node(node)
                except SlurmExtError as err:
                    self._set_ok(False, self._slurmd_first(str(err)))
                    self._failed(str(err))
                except Exception:  # never let this thread die silently
                    log.exception("slurm liaison: unexpected error (retrying)")
                busy = self.owner.busy or (self.watch_node and not self.node_ok)
                self._wait(_BUSY_INTERVAL if busy else _HELD_INTERVAL if self.owner.held else self.ready_interval)
        finally:
            if self.channel is not None:
                self.channel.close()

    def _wait(self, timeout: float) -> None:
        if self.channel is None:
            self._wake.wait(timeout)
            self._wake.clear()
            return
        deadline = time.monotonic() + timeout
        while not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
            if self.channel.serve(left):
                return

    def _failed(self, error: str) -> None:
        """Log a failure to reach Slurm when it is new or changed, and once a minute while it lasts:
        a configless node cannot reach Slurm until slurmd has fetched the config, and every retry
        (four a second while busy) is not news."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if error != self._last_error or now - self._last_logged >= _REPEAT_FAILURE_EVERY:
            still = f" (failing for {now - self._failing_since:.0f}s)" if error == self._last_error else ""
            log.warning("slurm: %s%s; retrying", error, still)
            self._last_error, self._last_logged = error, now

    def _answered(self) -> None:
        if self._failing_since is not None:
            log.info("slurm: answering again after %.1fs", time.monotonic() - self._failing_since)
            self._failing_since, self._last_error = None, ""

    def _check_node(self, node: Node) -> None:
        ok = node.responding and node.state not in ("UNKNOWN", "FUTURE") and \
            nodestate.registered(node, self._slurmd_started)
        problem = "" if ok else (f"node {node.name} is {node.state}+{'+'.join(sorted(node.flags))}" if
                                 not node.responding or node.state in ("UNKNOWN", "FUTURE")
                                 else f"node {node.name}: the slurmd started last has not registered yet")
        self._node = node
        if ok and (unready := slurmd_unready(node, _READYZ_TIMEOUT)):
            # slurmctld still counts a hung slurmd as responding until SlurmdTimeout; its own /readyz says at once
            ok, problem = False, f"node {node.name}: {unready}"
        self._set_ok(ok, problem)

    def _slurmd_first(self, error: str) -> str:
        """Slurm did not answer: where slurmd has /readyz (by the node's last reading), and it does not answer
        either, that is said first. A configless node's Slurm commands get their credentials from slurmd (auth/slurm's
        sack socket), so a hung slurmd shows as every command timing out; its own /readyz names the cause."""
        if self._node is not None and (unready := slurmd_unready(self._node, _READYZ_TIMEOUT)):
            return f"node {self._node.name}: {unready} (and {error})"
        return error

    def _set_ok(self, ok: bool, problem: str) -> None:
        changed = ok != self.node_ok
        self.node_ok, self.node_problem = ok, problem
        if changed:
            log.info("node %s in Slurm: %s", self.node, "registered and responding" if ok else problem)
            self.on_change()
