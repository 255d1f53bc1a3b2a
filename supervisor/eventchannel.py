"""The socket a worker running as its own user sends its events to, for the agent to write in the journal.

The journal is root's; the page (web.user) cannot write it, and its web-operation (an operator's decision) and
web-refused events were lost. The agent gives such a worker a datagram socket of its own under node.runtime_dir
(owner the worker's user, 0600, like its notify socket) in $SLURM_EXT_EVENTS_SOCKET. What it accepts is bounded,
because the worker's user is the one an attacker holds once the page is broken into:
- only events the catalogue lists for the worker's component (WorkerSpec.events): no health-finding or
  drain-requested from the page; each written under that component, with `worker` naming the sender;
- a datagram of at most workerevents.MAX_DATAGRAM bytes, fields as workerevents.parse says;
- at most PER_MINUTE datagrams a minute parsed, written or refused: the rest of that minute's are read and
  counted, never parsed nor written, and said in one worker-events-dropped event when the minute is over (with
  those refused); a datagram that makes the parse or the write fail in a way no one foresaw is refused, never
  an exception in the agent's loop (which runs slurmctld);
- at most DRAIN_AT_ONCE datagrams read per wake-up, so a flood never holds the agent's loop.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

from slurm_ext import workerevents

__all__ = ["EventChannel", "PER_MINUTE", "WINDOW", "DRAIN_AT_ONCE"]

log = logging.getLogger("supervisor")

#: events a worker may have written a minute
PER_MINUTE = 120
#: seconds of one rate window
WINDOW = 60.0
#: datagrams read per wake-up of the agent's loop; the rest wait for its next pass
DRAIN_AT_ONCE = 512


class EventChannel:
    """A worker's event socket at `path`, for `uid`; `write(event, message, severity, fields)` journals one."""

    def __init__(self, path: Path, uid: int, worker: str, component: str, write: Callable[..., None],
                 clock: Callable[[], float]):
        self.path, self.worker, self.component = Path(path), worker, component
        self._write, self._clock = write, clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        self.sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        os.chown(self.path, uid, -1)  # the worker's user, and root, may send; no one else
        self.window_start: float | None = None
        self.written = self.dropped = self.refused = 0
        self.last_refusal = ""

    def fileno(self) -> int:
        return self.sock.fileno()

    def deadline(self) -> float | None:
        """When the agent must look again to say this window's drops (None: nothing to say)."""
        if self.window_start is None or not (self.dropped or self.refused):
            return None
        return self.window_start + WINDOW

    def receive(self) -> None:
        """Read what is waiting (at most DRAIN_AT_ONCE), writing what may be written; never blocks."""
        for _ in range(DRAIN_AT_ONCE):
            try:
                data = self.sock.recv(workerevents.MAX_DATAGRAM + 1)
            except (BlockingIOError, InterruptedError):
                return
            now = self._clock()
            self.tick(now)
            if self.window_start is None:
                self.window_start = now
            if self.written + self.refused >= PER_MINUTE:  # refusals cost a parse too: they share the budget
                self.dropped += 1
                continue
            try:
                event = workerevents.parse(data, self.component)
                self._write(event.event, event.message, event.severity, event.fields)
            except Exception as err:  # RefusedEvent, or what no one foresaw: the worker's problem, not the loop's
                self._refuse(err if isinstance(err, workerevents.RefusedEvent) else
                             f"{type(err).__name__} taking it (a bug of slurm-ext's: see the agent's log)")
                if not isinstance(err, workerevents.RefusedEvent):
                    log.exception("events of worker %s: a datagram could not be taken", self.worker)
                continue
            self.written += 1

    def _refuse(self, why) -> None:
        if not self.refused:
            log.warning("events of worker %s: refused: %s (more this minute are counted only)", self.worker, why)
        self.refused += 1
        self.last_refusal = str(why)

    def tick(self, now: float) -> None:
        """A window is over: say its drops and refusals in one event, and start counting anew."""
        if self.window_start is None or now < self.window_start + WINDOW:
            return
        said = ([f"{self.dropped} events over its limit of {PER_MINUTE} a minute dropped"] if self.dropped else []) \
            + ([f"{self.refused} refused (the last: {self.last_refusal})"] if self.refused else [])
        if said:
            self._write("worker-events-dropped", f"worker {self.worker}: " + "; ".join(said), None,
                        {"dropped": self.dropped, "refused": self.refused, "limit": PER_MINUTE},
                        component="supervisor")
        self.window_start = None
        self.written = self.dropped = self.refused = 0
        self.last_refusal = ""

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)
