"""What a worker's restart and crash loop mean outside it: an event per restart; a crash loop is an event and,
for a worker that drains on it (slurmd), an owned drain of the node, lifted once it has run the crash window."""

from __future__ import annotations

from .lifecycle import CrashLoopOver, Restart
from .processes import Worker, state_changed
from .states import WorkerState

__all__ = ["crash_loop_over", "restart_planned"]


def restart_planned(agent, worker: Worker, decision: Restart, what: str, old: WorkerState | None = None) -> None:
    """The restart the worker's life decided on is an event; a crash loop it began is an event and maybe a drain."""
    s = agent.config.supervisor
    state_changed(agent.emit, worker, old or WorkerState.BACKOFF,
                  f"{what}; restart {worker.restarts} in {decision.delay:.3g}s",
                  restarts=worker.restarts, delay=decision.delay)
    if not decision.crash_loop_began:
        return
    agent.emit("crash-loop", f"worker {worker.spec.name} is crash-looping: {decision.exits_in_window} exits "
               f"within {s.crash_loop_window:g}s; "
               + (f"restarted after {decision.delay:g}s each time, it gets ready" if decision.was_ready else
                  f"retrying every {s.backoff_max:g}s at most"),
               severity="error", worker=worker.spec.name, last=what)
    if worker.spec.drain_on_crash_loop:
        agent.liaison.want(worker.drain_owner, f"{worker.spec.name} crash loop: {decision.exits_in_window} exits "
                           f"in {s.crash_loop_window:g}s (last: {what})")


def crash_loop_over(agent, worker: Worker, over: CrashLoopOver) -> None:
    agent.emit("recovered", f"worker {worker.spec.name} has run for {over.ran:.3g}s: crash loop over",
               worker=worker.spec.name)
    if worker.spec.drain_on_crash_loop:
        agent.liaison.clear(worker.drain_owner)
