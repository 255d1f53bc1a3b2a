"""Worker states and the transitions the agent allows between them.

A worker is STOPPED (not running, not to be started), BACKOFF (dead, to be
started at a deadline), RUNNING, or STOPPING (asked to stop, grace running).
The agent announces every transition as one `worker-state` event (journal and log); a transition not
listed here is a bug and raises.
"""

import enum

__all__ = ["WorkerState", "ALLOWED", "check_transition"]


class WorkerState(enum.Enum):
    STOPPED = "stopped"
    BACKOFF = "backoff"
    RUNNING = "running"
    STOPPING = "stopping"


ALLOWED = {
    WorkerState.STOPPED: {WorkerState.RUNNING, WorkerState.BACKOFF},
    WorkerState.BACKOFF: {WorkerState.RUNNING, WorkerState.BACKOFF, WorkerState.STOPPED},
    WorkerState.RUNNING: {WorkerState.BACKOFF, WorkerState.STOPPING, WorkerState.STOPPED},
    WorkerState.STOPPING: {WorkerState.STOPPED},
}


def check_transition(old: WorkerState, new: WorkerState) -> None:
    if new not in ALLOWED[old]:
        raise RuntimeError(f"worker state {old.value} -> {new.value} is not allowed")
