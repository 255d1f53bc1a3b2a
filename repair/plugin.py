"""What repair gives the node agent (slurm_ext.plugin): the repair service on the controller, with repair.enabled."""

from __future__ import annotations

import sys

from slurm_ext.config import Config
from slurm_ext.plugin import Plugin, PluginWorker, WorkerSpec

__all__ = ["PLUGIN"]


def _enabled(config: Config, role: str) -> bool:
    return role != "controller" or config.repair.enabled


PLUGIN = Plugin(
    name="repair",
    # recommendations, approved repairs step by step; its record is durable, so a restart carries on; never the
    # controller's readiness
    workers=(PluginWorker(WorkerSpec("repair", ("controller",), (sys.executable, "-I", "-m", "slurm_ext.cli", "repair",
                                                                 "serve"), reload_signal="HUP", gates_ready=False,
                                     after=("slurmctld",))),),
    enabled=_enabled,
)
