"""The agent's one thread that talks to Slurm.

scontrol can take seconds (up to slurm.timeout when slurmctld is away); the
agent's loop must keep reaping and restarting meanwhile, so every Slurm call
happens here. The loop states what it wants (a crash-loop drain, or none) and
this thread makes Slurm agree, retrying while Slurm is unreachable; it also
keeps the node's readiness (registered and responding) up to date.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from slurm_ext.errors import SlurmExtError
from slurm_ext.slurm import SlurmClient, is_our_reason

__all__ = ["SlurmLiaison"]

log = logging.getLogger("supervisor")


class SlurmLiaison(threading.Thread):
    def __init__(self, slurm: SlurmClient, node: str, ready_interval: float, emit: Callable[..., dict],
                 drain_prefix: str):
        super().__init__(name="slurm-liaison", daemon=True)
        self.slurm = slurm
        self.node = node
        self.ready_interval = ready_interval
        self.emit = emit
        #: reasons starting with this are the ones this agent may clear
        self.drain_prefix = drain_prefix
        #: set by the agent: the drain reason wanted now, or None
        self.want_drain: str | None = None
        #: whether to poll the node for readiness
        self.watch_node = False
        #: last answer: the node is registered and responding
        self.node_ok = False
        self.node_problem = "not asked yet"
        #: set by start steps: resume the node once it answers, if its drain reason starts with one of these
        self.resume_reasons: tuple[str, ...] = ()
        self._drained = False
        self._wake = threading.Event()
        self._stop = threading.Event()

    def poke(self) -> None:
        """Act now rather than at the next interval."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self._reconcile_drain()
                self._resume_when_fit()
                if self.watch_node:
                    self._check_node()
            except SlurmExtError as err:
                self.node_ok = False
                self.node_problem = str(err)
                log.warning("slurm: %s (retrying)", err)
            except Exception:  # never let this thread die silently
                log.exception("slurm liaison: unexpected error (retrying)")
            self._wake.wait(self.ready_interval if (self.node_ok or not self.watch_node) and not self.resume_reasons
                            else 0.5)
            self._wake.clear()

    def _reconcile_drain(self) -> None:
        want = self.want_drain
        if want and not self._drained:
            node = self.slurm.node(self.node)
            if node.drained and not is_our_reason(node.reason):
                self.emit("drain-skipped", f"node {self.node} is already drained by someone else "
                          f"({node.reason!r}); not replacing their reason", node=self.node)
            else:
                self.slurm.drain(self.node, want)
                self.emit("drain", f"drained node {self.node}: {want}", severity="warning", node=self.node)
            self._drained = True
        elif not want and self._drained:
            node = self.slurm.node(self.node)
            if node.drained and node.reason.startswith(self.drain_prefix):
                self.slurm.resume(self.node)
                self.emit("resume", f"resumed node {self.node}: the crash loop is over", node=self.node)
            elif node.drained:
                self.emit("resume-skipped", f"node {self.node} stays drained: its reason {node.reason!r} is not "
                          "this agent's", node=self.node)
            self._drained = False

    def _resume_when_fit(self) -> None:
        """Clear a drain a start step found no longer holds (a GPU back), once slurmd has registered
        again: Slurm refuses to resume a node whose last registration was invalid."""
        reasons = self.resume_reasons
        if not reasons:
            return
        node = self.slurm.node(self.node)
        if not node.drained or not node.reason.startswith(reasons):
            if node.drained:  # an admin's drain, or another tool's: it stays, and the journal says so
                self.emit("resume-skipped", f"node {self.node} stays drained: its reason {node.reason!r} is not "
                          "slurm-ext's", node=self.node)
            self.resume_reasons = ()
        elif node.responding and "INVALID_REG" not in node.flags:
            self.slurm.resume(self.node)
            self.emit("drain-cleared", f"resumed node {self.node}: {node.reason!r} no longer holds", node=self.node)
            self.resume_reasons = ()

    def _check_node(self) -> None:
        node = self.slurm.node(self.node)
        ok = node.responding and node.state not in ("UNKNOWN", "FUTURE")
        if ok != self.node_ok:
            log.info("node %s in Slurm: %s", self.node, "registered and responding" if ok else
                     "not responding")
        self.node_ok = ok
        self.node_problem = "" if ok else f"node {node.name} is {node.state}+{'+'.join(sorted(node.flags))}"
