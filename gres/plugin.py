"""What gres gives the node agent (slurm_ext.plugin): gres.conf rebuilt from NVML before every slurmd start."""

from __future__ import annotations

from slurm_ext.plugin import Plugin, StartStep, StepContext

__all__ = ["PLUGIN"]


def regenerate_gres(context: StepContext) -> None:
    """gres.conf from NVML, checked by slurmd -G, and the node's GPU drain made right (gres.regenerate)."""
    from slurm_ext import events, gres
    emit = events.emitter(context.config.node.state_dir, "gres", role=context.role)
    generation = gres.regenerate(context.config, context.node, emit, context.node_state, context.configless)
    if generation.inventory is not None:
        context.gpus_found(generation.gres)


def _steps(role: str) -> list[StartStep]:
    """Before every slurmd start, restarts included: a GPU lost since the last start must not be registered."""
    if role != "worker":
        return []
    return [StartStep("gres-regenerate", regenerate_gres, on_failure="block", before_restart_of="slurmd")]


PLUGIN = Plugin(name="gres", steps=_steps)
