"""The node agent's own state and the transitions it allows, as supervisord's SupervisorStates.

STARTING: the start steps have not succeeded yet (they run, or wait to be
tried again after a failure that blocks); no worker runs. RUNNING: they
succeeded; the workers are started and kept alive. STOPPING: SIGTERM or
SIGINT; the workers are stopped, last started first, slurmd only once Slurm
shows the node drained (for a few seconds at most). STOPPED: every worker
has stopped; the agent exits. The agent announces each transition as one
journal event and its state as a metric; a transition not listed here is a
bug and raises.

`AgentLife` holds the rules as pure decisions on the time given as a
number, so its tests are literal events on a fake clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .restart import backoff_delay

__all__ = ["AgentState", "ALLOWED", "AgentLife", "STOP_DRAIN_WAIT"]

#: at SIGTERM, how long slurmd is kept running for Slurm to show the node drained (the pod's preStop)
STOP_DRAIN_WAIT = 5.0
_NEVER = float("inf")


class AgentState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


ALLOWED = {
    AgentState.STARTING: {AgentState.RUNNING, AgentState.STOPPING},
    AgentState.RUNNING: {AgentState.STOPPING},
    AgentState.STOPPING: {AgentState.STOPPED},
    AgentState.STOPPED: set(),
}


@dataclass
class AgentLife:
    """The agent's state, when its start steps run next, and how its stop goes."""

    #: the first delay after a failed start (at least 1 s: a step asks Slurm or NVML) and the longest
    backoff_initial: float
    backoff_max: float
    state: AgentState = AgentState.STARTING
    #: start steps that failed in a row (a blocking failure)
    step_failures: int = 0
    #: when the start steps run next (monotonic); never while they run
    next_steps: float = 0.0
    #: every worker stopped within its stop grace (no SIGKILL): the exit status
    clean: bool = True
    #: at SIGTERM: the node-state ticket of the drain slurmd waits for, and until when
    stop_drain: tuple[Any, float] | None = None

    def move(self, new: AgentState) -> AgentState:
        """Make a transition; returns the old state. Raises RuntimeError for one not in ALLOWED."""
        if new not in ALLOWED[self.state]:
            raise RuntimeError(f"agent state {self.state.value} -> {new.value} is not allowed")
        old, self.state = self.state, new
        return old

    @property
    def stopping(self) -> bool:
        return self.state in (AgentState.STOPPING, AgentState.STOPPED)

    @property
    def started(self) -> bool:
        """The start steps have succeeded: workers may start."""
        return self.state == AgentState.RUNNING

    def steps_due(self, now: float) -> bool:
        """Whether to run the start steps now; from then on they are not due until steps_done says."""
        if self.state != AgentState.STARTING or now < self.next_steps:
            return False
        self.next_steps = _NEVER
        return True

    def steps_done(self, ok: bool, now: float) -> bool:
        """The start steps finished: True when the agent is now RUNNING; a blocking failure backs off."""
        if self.state != AgentState.STARTING:
            return False  # stopped while they ran
        if ok:
            self.move(AgentState.RUNNING)
            return True
        self.step_failures += 1
        self.next_steps = now + backoff_delay(self.step_failures, max(self.backoff_initial, 1.0), self.backoff_max)
        return False

    def deadline(self, now: float) -> float | None:
        """When the loop must look again: the next try of the start steps, or soon while a stop drain settles."""
        if self.state == AgentState.STARTING:
            return self.next_steps
        if self.stop_drain is not None:  # the ticket settles on the Slurm thread: look again soon
            return min(self.stop_drain[1], now + 0.02)
        return None

    def hold_for_drain(self, ticket: Any, now: float) -> None:
        """SIGTERM with slurmd running: slurmd waits for `ticket` (the stop drain), STOP_DRAIN_WAIT at most."""
        self.stop_drain = (ticket, now + STOP_DRAIN_WAIT)

    def drain_holds(self, now: float) -> tuple[bool, bool]:
        """(slurmd still waits for the stop drain, the wait has just ended without Slurm showing it)."""
        if self.stop_drain is None:
            return False, False
        ticket, until = self.stop_drain
        if ticket.settled or now >= until:
            self.stop_drain = None
            return False, not ticket.settled
        return True, False
