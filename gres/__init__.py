"""gres.conf and Gres= rebuilt from NVML on every node start, with drift detection.

After a pod reschedules, Slurm's idea of a node's GPUs drifts from the
hardware; Slurm's own AutoDetect=nvml needs a Slurm built against NVML.
This component asks NVML through pynvml and writes what Slurm needs.

`regenerate(config, node, slurm, emit)` is the worker agent's start step:
read the inventory, write gres.conf when it changed, check it with
`slurmd -G`, and make the node's drain agree (an owned drain for a missing
or lost GPU, cleared when the GPUs are back). `generate` is the same
without Slurm (`slurm-ext gres generate`); `read_inventory` and the render
functions are what `slurm-ext gres inventory` and `gres check` use.
"""

from __future__ import annotations

from typing import Callable

from slurm_ext.config import Config
from slurm_ext.errors import CommandError, SlurmExtError
from slurm_ext.slurm import SlurmClient

from .check import compare_counts, nvml_counts, slurmd_counts
from .generate import OUR_REASONS, Generation, generate, output_path, slurm_conf_path
from .inventory import GresError, Inventory, read_inventory

__all__ = ["regenerate", "generate", "read_inventory", "output_path", "slurm_conf_path", "Generation", "Inventory",
           "GresError", "OUR_REASONS"]


def regenerate(config: Config, node: str, slurm: SlurmClient | None, emit: Callable[..., object],
               resume_when_fit: Callable[[tuple[str, ...]], None] | None = None) -> Generation:
    """The start step: generate, let slurmd check the file, then drain or clear our drain.

    Clearing waits for slurmd's next registration when `resume_when_fit` is
    given (the agent's Slurm thread does it): Slurm refuses to resume a node
    whose last registration reported fewer GPUs than configured.

    Raises:
        SlurmExtError: the node needs a drain and Slurm could not be told
            (the agent then keeps slurmd down and retries: a node must not
            register with the wrong GPUs).
    """
    generation = generate(config, node, emit=emit)
    drain = generation.drain
    if generation.inventory is not None and drain is None:
        try:
            seen = slurmd_counts(slurm_conf_path(config), generation.text, node)
            mismatch = compare_counts(nvml_counts(generation.inventory), seen, "slurmd -G")
        except (CommandError, OSError) as err:
            mismatch = [f"slurmd -G failed: {err}"]
        if mismatch:
            emit("gres-rejected", f"{generation.path}: {'; '.join(mismatch)}", "error")
            drain = f"gpu inventory failed: {mismatch[0]}"
    if slurm is None:
        return generation
    if drain:
        slurm.drain(node, drain)
        emit("drain", f"node {node}: {drain}", "error")
        return generation
    if resume_when_fit is not None:
        resume_when_fit(OUR_REASONS)
        return generation
    try:
        current = slurm.node(node)
        if current.drained and current.reason.startswith(OUR_REASONS):
            slurm.resume(node)
            emit("drain-cleared", f"node {node}: the GPUs are all back ({generation.gres}); resumed from "
                 f"{current.reason!r}", "info")
    except SlurmExtError as err:  # best effort: the next start tries again
        emit("drain-clear-failed", f"node {node}: cannot clear an old GPU drain now: {err}", "warning")
    return generation
