"""When the node agent's role is ready for work (/readyz, sd_notify READY=1) and when its loop is live (/livez).

Read from the HTTP thread as well as the loop: these only read the agent's state.
"""

from __future__ import annotations

import time

from .agentstate import AgentState
from .processes import Worker
from .states import WorkerState

__all__ = ["worker_ready", "ready", "after_ready", "workers_taking_usr1", "live"]


def worker_ready(agent, worker: Worker) -> bool:
    """The worker runs and meets its readiness condition (READY=1, or its node answering in Slurm)."""
    if worker.state != WorkerState.RUNNING:
        return False
    if worker.spec.ready == "notify":
        return worker.notified_ready
    if worker.spec.ready == "slurm-node":
        return agent.liaison is not None and agent.liaison.node_ok
    return True


def ready(agent) -> tuple[bool, str]:
    """Ready for work: the start steps succeeded and every worker that gates readiness is ready."""
    if agent.life.stopping:
        return False, "stopping"
    if agent.life.state == AgentState.STARTING:
        return False, "start steps have not succeeded"
    for worker in agent.workers:
        if worker.spec.gates_ready and not worker_ready(agent, worker):
            if worker.life.awaiting_after:
                return False, f"worker {worker.spec.name}: waits for {', '.join(worker.spec.after)}"
            why = worker.state.value if worker.state != WorkerState.RUNNING else (
                "no READY=1 yet" if worker.spec.ready == "notify" else agent.liaison.node_problem)
            return False, f"worker {worker.spec.name}: {why}"
    return True, "ready"


def after_ready(agent, worker: Worker) -> bool:
    """The workers `worker` starts after are all ready."""
    return all(worker_ready(agent, w) for w in agent.workers if w.spec.name in worker.spec.after)


def workers_taking_usr1(agent) -> list[Worker]:
    """The running workers that take the agent's SIGUSR1 now, as their plug-ins say (the health monitor, once
    it has set its handler)."""
    now = time.monotonic()
    return [w for w in agent.workers if w.state == WorkerState.RUNNING
            and any(live.takes_usr1(w.spec.name, now - w.started) for live in agent.live_plugins)]


def live(agent, grace: float = 10.0) -> bool:
    """The loop is alive: it has not overslept the wake-up it planned."""
    return time.monotonic() < max(agent.next_wake, agent.heartbeat) + grace
