"""What repair gives the node agent (slurm_ext.plugin): on the controller, the repair service (with repair.enabled)
and the collector of the agents' journals (with history.enabled: the history is collected whether repairs are on or
not), and their figures on the controller agent's /metrics (repairs awaiting approval, the notifier's counts; events
stored, the backlog, agents failing)."""

from __future__ import annotations

import sys

from slurm_ext.config import Config
from slurm_ext.plugin import Live, Plugin, PluginWorker, WorkerSpec

__all__ = ["PLUGIN"]


def _repairs(config: Config, role: str) -> bool:
    return role != "controller" or config.repair.enabled


def _collects(config: Config, role: str) -> bool:
    return role != "controller" or config.history.enabled


class _Figures(Live):
    """The figures the repair service writes at each pass (repair.metrics) and the collector every few seconds
    (repair.collector), read at each scrape."""

    def __init__(self, host):
        self.host = host

    def metrics(self):
        from . import metrics
        config = self.host.config
        if config.repair.enabled:
            yield from metrics.families(config.node.state_dir)
        if config.history.enabled:
            yield from metrics.collector_families(config.node.state_dir)


def _attach(host) -> Live | None:
    return _Figures(host) if host.role == "controller" else None


PLUGIN = Plugin(
    name="repair",
    # recommendations, approved repairs step by step; its record is durable, so a restart carries on; never the
    # controller's readiness
    workers=(PluginWorker(WorkerSpec("repair", ("controller",), (sys.executable, "-I", "-m", "slurm_ext.cli", "repair",
                                                                 "serve"), reload_signal="HUP", gates_ready=False,
                                     after=("slurmctld",)), enabled=_repairs),
             # its cursors are in the database with the events: a restart carries on; never the readiness either
             PluginWorker(WorkerSpec("collector", ("controller",), (sys.executable, "-I", "-m", "slurm_ext.cli",
                                                                    "repair", "collect"), gates_ready=False,
                                     after=("slurmctld",)), enabled=_collects)),
    attach=_attach,
)
