"""One worker's life as a pure state machine: what its state is, when it starts again, whether it crash-loops.

The agent feeds it what happened (started, ready, exited, a start step
failed, time passed) with the time as a number, and gets back records of
what to do; it never touches a process or a clock, so its tests are
literal: a fake clock, literal events, literal decisions.

The restart rule: a worker that had become ready (READY=1, or for slurmd:
registered with slurmctld, or simply up for stable_after) is restarted
after backoff_initial, every time. Only exits before that point double the
delay, up to backoff_max, and a worker that never gets ready and keeps
exiting is retried every backoff_max while it crash-loops. A crash loop
(crash_loop_count exits within crash_loop_window) is an event, a metric
and, for slurmd, an owned drain; it is over once the worker has run the
window without exiting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .restart import CrashWindow, backoff_delay, should_restart
from .states import WorkerState, check_transition

__all__ = ["Policy", "Life", "Restart", "GiveUp", "CrashLoopOver"]


@dataclass(frozen=True, slots=True)
class Policy:
    restart: str = "always"
    backoff_initial: float = 0.01
    backoff_max: float = 30.0
    stable_after: float = 2.0
    crash_loop_count: int = 5
    crash_loop_window: float = 10.0

    @classmethod
    def of(cls, settings, restart: str) -> Policy:
        """A worker's policy: [supervisor]'s delays and crash loop, its spec's `restart`."""
        return cls(restart, settings.backoff_initial, settings.backoff_max, settings.stable_after,
                   settings.crash_loop_count, settings.crash_loop_window)


@dataclass(frozen=True, slots=True)
class Restart:
    """Start it again at `at` (`delay` after the exit)."""

    at: float
    delay: float
    #: it had become ready since its last start: the delay did not grow
    was_ready: bool
    #: exits within the crash window, this one included (0: not counted, e.g. a failed start step)
    exits_in_window: int
    #: this exit began a crash loop
    crash_loop_began: bool


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Not started again: its restart policy says so."""

    why: str


@dataclass(frozen=True, slots=True)
class CrashLoopOver:
    """It has run the crash window without exiting."""

    ran: float


@dataclass
class Life:
    policy: Policy
    state: WorkerState = WorkerState.STOPPED
    started: float | None = None
    #: ready since its last start
    ready: bool = False
    #: exits before getting ready, in a row: what the delay grows with
    failures: int = 0
    restarts: int = 0
    crash_loop: bool = False
    next_start: float = 0.0
    #: gate: its start steps (before_restart_of) run now or are queued: started when they succeed
    awaiting_steps: bool = False
    #: gate: it waits for the workers of its spec's `after` to be ready: started by the loop once they are
    awaiting_after: bool = False
    window: CrashWindow = field(init=False)

    def __post_init__(self):
        self.window = CrashWindow(self.policy.crash_loop_count, self.policy.crash_loop_window)

    # -- what happened -----------------------------------------------------------------

    def move(self, new: WorkerState) -> None:
        check_transition(self.state, new)
        self.state = new

    def on_start(self, now: float) -> None:
        self.move(WorkerState.RUNNING)
        self.started = now
        self.ready = False

    def on_ready(self) -> None:
        """READY=1, or registered in Slurm: from now on an exit is the death of a worker that worked."""
        if self.state == WorkerState.RUNNING:
            self.ready = True
            self.failures = 0

    def on_exit(self, now: float, exit_code: int | None, announced: bool = False) -> Restart | GiveUp:
        """The main process of a RUNNING worker exited (`exit_code` None: killed by a signal, or unknown).

        `announced`: it said STOPPING=1 first (a planned restart): started again at once, not counted.
        """
        was_ready = self.ready or (self.started is not None and now - self.started >= self.policy.stable_after)
        self.ready = False
        if not should_restart(self.policy.restart, exit_code):
            self.move(WorkerState.STOPPED)
            return GiveUp(f"restart policy {self.policy.restart}: not restarting")
        self.move(WorkerState.BACKOFF)
        self.restarts += 1
        if announced:
            self.next_start = now
            return Restart(now, 0.0, was_ready, 0, False)
        return self._back_off(now, was_ready, counted=True)

    def on_start_failed(self, now: float) -> Restart:
        """It could not be started at all (exec failed): like an exit before getting ready."""
        if self.state != WorkerState.BACKOFF:
            self.move(WorkerState.BACKOFF)
        self.restarts += 1
        return self._back_off(now, was_ready=False, counted=True)

    def on_steps_failed(self, now: float) -> Restart:
        """A start step before its restart failed: retried with a growing delay, but the worker did not
        exit, so it is no crash (a GPU drain that cannot reach Slurm is not a slurmd crash loop)."""
        if self.state != WorkerState.BACKOFF:
            self.move(WorkerState.BACKOFF)
        return self._back_off(now, was_ready=False, counted=False)

    def tick(self, now: float) -> CrashLoopOver | None:
        """Time passed: a worker up long enough has settled (and may end its crash loop)."""
        if self.state != WorkerState.RUNNING or self.started is None:
            return None
        ran = now - self.started
        if self.failures and ran >= self.policy.stable_after:
            self.failures = 0
        if self.crash_loop and ran >= self.settle_time():
            self.crash_loop = False
            self.window.clear()
            return CrashLoopOver(ran)
        return None

    # -- what it means ---------------------------------------------------------------------

    def settle_time(self) -> float:
        """How long it must run before its failures (or crash loop) are forgotten."""
        if self.crash_loop:
            return max(self.policy.stable_after, self.policy.crash_loop_window)
        return self.policy.stable_after

    def deadline(self) -> float | None:
        """When `tick` or a start is next due; None when nothing is."""
        if self.state == WorkerState.BACKOFF:
            return self.next_start
        if self.state == WorkerState.RUNNING and self.started is not None and (self.failures or self.crash_loop):
            return self.started + self.settle_time()
        return None

    def adopt(self, policy: Policy) -> None:
        """A reloaded config: new settings from the next decision on, the history kept."""
        self.policy = policy
        self.window.count, self.window.window = policy.crash_loop_count, policy.crash_loop_window

    def _back_off(self, now: float, was_ready: bool, counted: bool) -> Restart:
        p = self.policy
        began = False
        if counted:
            began = self.window.add(now) and not self.crash_loop
            self.crash_loop |= began
        if was_ready:
            self.failures = 0
            delay = p.backoff_initial
        else:
            self.failures += 1
            delay = p.backoff_max if self.crash_loop and counted else \
                backoff_delay(self.failures, p.backoff_initial, p.backoff_max)
        self.next_start = now + delay
        return Restart(self.next_start, delay, was_ready, len(self.window) if counted else 0, began)
