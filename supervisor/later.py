"""Answers the probe server computes off its own thread.

/events reads up to 32 MiB of the node journal; computed on the probe server's one thread, it made the kubelet's
/livez wait behind it, and three clients asking /events?since=0 in a loop made every probe with the kubelet's 1 s
timeout fail, which restarts the pod with every job on it (issue 28, item 2). Such a route returns `Later(work,
worker)` instead of an answer: the server hands `work` to `worker`, which runs one at a time on a thread of its own,
and sends what it returns once it is done, while it goes on answering the probes. A route asks `worker.busy` first
and answers 503 with Retry-After at once when it is: a client may wait for its own answer, a probe never waits for
a client's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Later", "AnswerWorker"]

log = logging.getLogger("supervisor")


@dataclass(frozen=True, slots=True)
class Later:
    """An answer to compute off the probe server's thread."""

    #: computes the answer (status, body, content type, and optionally a dict of more headers); runs on `worker`
    work: Callable[[], tuple]
    worker: AnswerWorker


class AnswerWorker:
    """Computes `Later` answers one at a time, each on a thread of its own (named `name`)."""

    def __init__(self, name: str):
        self.name = name
        self._busy = threading.Event()

    @property
    def busy(self) -> bool:
        """An answer is being computed: another is refused until it is done."""
        return self._busy.is_set()

    def submit(self, work: Callable[[], tuple], done: Callable[[tuple], None]) -> bool:
        """Compute `work()` and give it to `done` (both on the worker's thread); False, and nothing run, while
        another answer is being computed."""
        if self._busy.is_set():
            return False
        self._busy.set()
        threading.Thread(target=self._run, args=(work, done), name=self.name, daemon=True).start()
        return True

    def _run(self, work: Callable[[], tuple], done: Callable[[tuple], None]) -> None:
        try:
            answer = work()
        except Exception:  # a bug answers 500, and the next answer is computed as usual
            log.exception("http: %s failed", self.name)
            answer = (500, b"internal error: see the agent's log\n", "text/plain; charset=utf-8")
        finally:
            self._busy.clear()
        done(answer)
