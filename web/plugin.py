"""What web gives the node agent (slurm_ext.plugin): the cluster page on the controller, with web.enabled."""

from __future__ import annotations

import sys

from slurm_ext.config import Config
from slurm_ext.plugin import Plugin, PluginWorker, WorkerSpec

__all__ = ["PLUGIN"]


def _enabled(config: Config, role: str) -> bool:
    return role != "controller" or config.web.enabled


PLUGIN = Plugin(
    name="web",
    # reads Slurm only while someone looks; never the controller's readiness
    workers=(PluginWorker(WorkerSpec("web", ("controller",), (sys.executable, "-I", "-m", "slurm_ext.cli", "web"),
                                     gates_ready=False, after=("slurmctld",))),),
    enabled=_enabled,
)
