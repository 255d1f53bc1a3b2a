"""Restart policy as pure functions: backoff delay and crash-loop detection.

Kept free of clocks and processes so the rules can be tested with literal
numbers: the agent passes `now` in.
"""

from collections import deque

__all__ = ["backoff_delay", "should_restart", "CrashWindow"]


def backoff_delay(failures: int, initial: float, cap: float) -> float:
    """Delay before restart number `failures` (1 = first): initial, doubling, capped."""
    if failures <= 0:
        return 0.0
    return min(initial * (2 ** min(failures - 1, 60)), cap)


def should_restart(policy: str, exit_status: int | None) -> bool:
    """`exit_status` is the exit code, or None when a signal killed it."""
    if policy == "always":
        return True
    if policy == "on-failure":
        return exit_status != 0
    return False


class CrashWindow:
    """Exit times within a sliding window: `count` of them is a crash loop."""

    def __init__(self, count: int, window: float):
        self.count = count
        self.window = window
        self._times: deque[float] = deque()

    def add(self, now: float) -> bool:
        """Record an exit at `now`; True when the window now holds a crash loop."""
        self._times.append(now)
        while self._times and now - self._times[0] > self.window:
            self._times.popleft()
        return len(self._times) >= self.count

    def clear(self) -> None:
        self._times.clear()

    def __len__(self) -> int:
        return len(self._times)
