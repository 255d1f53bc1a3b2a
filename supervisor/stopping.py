"""How the node agent stops its workers: one at a time, last started first; SIGKILL after the stop grace unless
a plug-in holds it; slurmd only once Slurm shows the node drained (the pod's preStop), a few seconds at most."""

from __future__ import annotations

import signal
import time

from .agentstate import STOP_DRAIN_WAIT
from .processes import NEVER, Worker, kill_session, send_signal, set_state
from .states import WorkerState

__all__ = ["request_stop", "drain_before_stop", "advance_stop", "kill", "abandon_steps", "STOP_DRAIN_OWNER"]

#: the owner of the stop drain in the node-state catalogue
STOP_DRAIN_OWNER = "stop"
#: at exit, how long a start step whose processes were killed may take to notice
_ABANDON_WAIT = 3.0


def request_stop(agent, worker: Worker) -> None:
    """Send a running worker its stop signal (SIGKILL after its grace); a worker waiting to restart just stops."""
    if worker.state == WorkerState.RUNNING and worker.pid:
        set_state(agent.emit, worker, WorkerState.STOPPING, f"sending SIG{worker.spec.stop_signal} to pid "
                  f"{worker.pid}; SIGKILL after {worker.spec.stop_grace:g}s")
        now = time.monotonic()
        worker.stop_deadline = now + worker.spec.stop_grace
        worker.kill_hold = next((hold for live in agent.live_plugins
                                 if (hold := live.stop_hold(worker.spec, worker.pid, now)) is not None), None)
        send_signal(worker, worker.spec.signal)
    elif worker.state == WorkerState.BACKOFF:
        set_state(agent.emit, worker, WorkerState.STOPPED, "stopped while waiting to restart")


def drain_before_stop(agent, why: str) -> None:
    """Drain the node with our reason before slurmd stops (what Slinky's preStop does), so that no job
    lands on a node whose pod is going away; the next start of this node lifts it once its slurmd has
    registered (stale at start). Not when slurmd is not running: there is nothing to keep jobs from."""
    slurmd = [w for w in agent.workers if w.spec.ready == "slurm-node" and w.state == WorkerState.RUNNING]
    if not slurmd or agent.liaison is None:
        return
    agent.life.hold_for_drain(agent.liaison.want(STOP_DRAIN_OWNER, f"node agent stopping: {why}"), time.monotonic())


def _waits_for_drain(agent, worker: Worker) -> bool:
    """slurmd is kept running until Slurm shows the stop drain, for agentstate.STOP_DRAIN_WAIT at most."""
    if agent.life.stop_drain is None or worker.spec.ready != "slurm-node":
        return False
    waits, late = agent.life.drain_holds(time.monotonic())
    if late:
        agent.emit("stop-drain-late", f"node {agent.node}: Slurm did not show the stop drain within "
                   f"{STOP_DRAIN_WAIT:g}s; stopping {worker.spec.name} anyway", severity="warning")
    return waits


def advance_stop(agent) -> None:
    """Stop workers one at a time, last started first."""
    while agent.stop_queue:
        current = agent.stop_queue[0]
        if _waits_for_drain(agent, current):
            return
        if current.state in (WorkerState.RUNNING, WorkerState.BACKOFF):
            request_stop(agent, current)
        if current.state != WorkerState.STOPPED:
            return
        agent.stop_queue.pop(0)


def kill(agent, worker: Worker) -> None:
    """Its stop grace is over: SIGKILL, unless a plug-in holds it back (slurmctld saving accounting records)."""
    if worker.kill_hold is not None and worker.pid and (until := worker.kill_hold(time.monotonic())) is not None:
        worker.stop_deadline = until
        return
    if worker.pid:
        agent.emit("kill", f"worker {worker.spec.name} (pid {worker.pid}) still running "
                   f"{worker.spec.stop_grace:g}s after SIG{worker.spec.stop_signal}: SIGKILL",
                   severity="warning", worker=worker.spec.name)
        send_signal(worker, signal.SIGKILL)
        agent.life.clean = False
    worker.stop_deadline = NEVER


def abandon_steps(agent) -> None:
    """Stopped while start steps run: kill what they started (each in its own session), so that
    no node-boot script outlives the agent, and give the step a moment to record it."""
    steps = agent.steps
    killed = [pid for child in steps.children() for pid in kill_session(child, signal.SIGKILL)]
    agent.emit("start-steps-abandoned", f"stopped while start steps ran ({steps.running}); killed "
               f"{len(killed)} process(es) they had started: {' '.join(map(str, killed)) or 'none'}",
               severity="warning")
    steps.wait(_ABANDON_WAIT)
