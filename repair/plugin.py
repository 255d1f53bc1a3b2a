"""What repair gives the node agent (slurm_ext.plugin): the repair service on the controller, with repair.enabled,
and its figures on the controller agent's /metrics (repairs awaiting approval, the notifier's counts)."""

from __future__ import annotations

import sys

from slurm_ext.config import Config
from slurm_ext.plugin import Live, Plugin, PluginWorker, WorkerSpec

__all__ = ["PLUGIN"]


def _enabled(config: Config, role: str) -> bool:
    return role != "controller" or config.repair.enabled


class _Figures(Live):
    """The figures the repair service writes at each pass (repair.metrics), read at each scrape."""

    def __init__(self, host):
        self.host = host

    def metrics(self):
        from .metrics import families
        return families(self.host.config.node.state_dir)


def _attach(host) -> Live | None:
    return _Figures(host) if host.role == "controller" and host.config.repair.enabled else None


PLUGIN = Plugin(
    name="repair",
    # recommendations, approved repairs step by step; its record is durable, so a restart carries on; never the
    # controller's readiness
    workers=(PluginWorker(WorkerSpec("repair", ("controller",), (sys.executable, "-I", "-m", "slurm_ext.cli", "repair",
                                                                 "serve"), reload_signal="HUP", gates_ready=False,
                                     after=("slurmctld",))),),
    enabled=_enabled,
    attach=_attach,
)
