"""The controller agent's watch on slurmctld's queue of accounting records (sdiag's DBD agent queue).

While slurmdbd or its database is away, slurmctld keeps every accounting
record in memory, writes them to StateSaveLocation/dbd.messages only at a
clean stop, and starts discarding step records when MaxDBDMsgs is reached.
Nothing in Slurm tells anyone before half of that ("RESTART SLURMDBD NOW", in
slurmctld's log). This thread reads `sdiag` every accounting.queue_interval:

- the size is exported (slurm_ext_accounting_dbd_queue) and kept for the
  agent, which holds back a SIGKILL of slurmctld while records are queued;
- above 0 for accounting.queue_alert_after: dbd-queue-growing (warning);
  at MaxDBDMsgs/2: dbd-queue-half-full (error); back to 0 after either:
  dbd-queue-drained.

`QueueAlarm` is the decision, a pure function of what was read and when.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from slurm_ext.errors import SlurmExtError
from slurm_ext.slurm import SlurmClient

__all__ = ["QueueAlarm", "QueueWatch", "Alert"]

log = logging.getLogger("accounting")


@dataclass(frozen=True, slots=True)
class Alert:
    event: str
    severity: str
    message: str


@dataclass
class QueueAlarm:
    """When the queue's readings become events: once per outage for each threshold, and once when it ends."""

    alert_after: float
    #: monotonic time the queue was first seen above 0 in this outage
    above_since: float | None = None
    growing_said: bool = False
    half_said: bool = False

    def observe(self, size: int, max_msgs: int | None, now: float) -> list[Alert]:
        if size == 0:
            said = self.growing_said or self.half_said
            lasted = now - self.above_since if self.above_since is not None else 0.0
            self.above_since, self.growing_said, self.half_said = None, False, False
            return [Alert("dbd-queue-drained", "info", f"DBD agent queue empty again after {lasted:.0f}s: "
                          "slurmdbd has every accounting record")] if said else []
        alerts = []
        if self.above_since is None:
            self.above_since = now
        held = now - self.above_since
        if not self.growing_said and held >= self.alert_after:
            self.growing_said = True
            alerts.append(Alert("dbd-queue-growing", "warning",
                                f"slurmctld has held accounting records for slurmdbd for {held:.0f}s ({size} "
                                f"queued{f' of MaxDBDMsgs={max_msgs}' if max_msgs else ''}): slurmdbd or its "
                                "database is away; they are lost if slurmctld dies before they are sent"))
        if max_msgs and not self.half_said and size >= max_msgs // 2:
            self.half_said = True
            alerts.append(Alert("dbd-queue-half-full", "error",
                                f"DBD agent queue at {size} of MaxDBDMsgs={max_msgs} (Slurm's RESTART SLURMDBD NOW): "
                                "bring slurmdbd and its database back; at the limit slurmctld discards step "
                                "records"))
        return alerts


class QueueWatch(threading.Thread):
    """Reads sdiag on a thread of its own (sdiag may take slurm.timeout when slurmctld is busy)."""

    def __init__(self, slurm: SlurmClient, interval: float, alert_after: float, emit: Callable[..., dict]):
        super().__init__(name="dbd-queue-watch", daemon=True)
        self.slurm = slurm
        self.interval = interval
        self.emit = emit
        self.alarm = QueueAlarm(alert_after)
        #: the last size read; None before the first answer, or when accounting does not use slurmdbd
        self.size: int | None = None
        self.max_msgs: int | None = None
        self._stopped = threading.Event()
        self._failing = False

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        while not self._stopped.is_set():
            try:
                self.read_once()
                self._failing = False
            except SlurmExtError as err:
                if not self._failing:  # slurmctld starting or away: said once, not every interval
                    log.info("DBD agent queue: cannot read sdiag: %s", err)
                self._failing = True
            except Exception:  # never let the watch die silently
                log.exception("DBD agent queue watch: unexpected error (retrying)")
            self._stopped.wait(self.interval)

    def read_once(self) -> int | None:
        if self.max_msgs is None:
            value = self.slurm.config_values().get("MaxDBDMsgs", "")
            self.max_msgs = int(value) if value.isdigit() else None
        size = self.slurm.dbd_queue()
        self.size = size
        if size is not None:
            for alert in self.alarm.observe(size, self.max_msgs, time.monotonic()):
                self.emit(alert.event, alert.message, severity=alert.severity, queued=size, max=self.max_msgs)
        return size
