"""Waiting for what a test can observe, never for a fixed time."""

from __future__ import annotations

import time


def wait_for(what: str, test, timeout: float = 15.0, interval: float = 0.02):
    """Poll `test` until it returns something true, and return that; fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = test()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout}s")
