"""What health gives the node agent (slurm_ext.plugin): the health monitor worker, its readings as metrics, the
SIGUSR1 that asks it for a poll now, and its drains lifted when health.enabled switches it off."""

from __future__ import annotations

import os
import sys
import time

from slurm_ext.config import Config
from slurm_ext.plugin import Live, Plugin, PluginWorker, WorkerSpec

__all__ = ["PLUGIN"]

#: the monitor's worker
WORKER = "health"


def _enabled(config: Config, role: str) -> bool:
    return role != "worker" or config.health.enabled


class _Monitor(Live):
    def __init__(self, host):
        self.host = host
        if not self._on():
            self._lift_drains()  # before the agent's first look: a drain of an earlier run is then lifted

    def _on(self) -> bool:
        return _enabled(self.host.config, self.host.role)

    def _lift_drains(self) -> None:
        """health.enabled = false: no monitor runs to clear its drains when their conditions go, so the
        operator's switch ends them (a drain of an earlier run found in Slurm is lifted, not adopted)."""
        from . import OWNER
        from .settings import CHECKS
        for check in CHECKS:
            self.host.liaison.clear(f"{OWNER}/{check}")

    def reloaded(self, old: Config, new: Config) -> None:
        if _enabled(old, self.host.role) and not _enabled(new, self.host.role):
            self._lift_drains()

    def worker_gone(self, name: str) -> None:
        """The removed monitor's drains are lifted once more: it may have posted one while it was stopping."""
        if name == WORKER and not self._on():
            self._lift_drains()

    def takes_usr1(self, name: str, running_since: float) -> bool:
        """The monitor has written its readings since its start: it takes SIGUSR1 from then on, while before its
        handler is set the signal's default action would end it (and a client posting /health/check in a loop
        could keep it from ever starting)."""
        if name != WORKER:
            return False
        from .monitor import metrics_path
        try:
            written = os.stat(metrics_path(self.host.config.node.runtime_dir)).st_mtime
        except OSError:
            return False
        return written >= time.time() - running_since

    def metrics(self):
        if self.host.role != "worker":
            return ()
        from .metrics import families
        return families(self.host.config.node.runtime_dir)


def _attach(host) -> Live | None:
    return _Monitor(host) if host.role == "worker" else None


PLUGIN = Plugin(
    name="health",
    # the passive health checks, in a process of their own: a check that hangs or crashes is restarted and
    # reported, never the agent's or slurmd's problem; SIGHUP after the agent's reload
    workers=(PluginWorker(WorkerSpec("health", ("worker",), (sys.executable, "-I", "-m", "slurm_ext.cli", "health",
                                                             "monitor"), reload_signal="HUP", gates_ready=False)),),
    enabled=_enabled,
    attach=_attach,
)
