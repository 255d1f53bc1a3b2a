"""gres.conf and Gres= rebuilt from NVML on every node start, with drift detection.

After a pod reschedules, Slurm's idea of a node's GPUs drifts from the
hardware; Slurm's own AutoDetect=nvml needs a Slurm built against NVML.
This component asks NVML through pynvml and writes what Slurm needs.

`regenerate(config, node, emit, node_state)` is the worker agent's start step:
read the inventory, write gres.conf when it changed, check it with
`slurmd -G`, and make the node's drain agree (an owned drain for a missing
or lost GPU, cleared when the GPUs are back). `generate` is the same
without Slurm (`slurm-ext gres generate`); `read_inventory` and the render
functions are what `slurm-ext gres inventory` and `gres check` use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from slurm_ext.lazy import lazy_names

if TYPE_CHECKING:
    from slurm_ext.config import Config

    from .generation import Generation

__all__ = ["regenerate", "generate", "read_inventory", "output_path", "baseline", "Generation", "Inventory",
           "GresError", "OWNER"]

#: the owner of this component's drains in the node-state catalogue (slurm_ext.nodestate)
OWNER = "gres"

# Imported on first use: loading a config with a [gres] section imports this package (its settings),
# and the Python hooks load the config once per job.
_LAZY = {"generate": "generation", "output_path": "generation", "Generation": "generation", "baseline": "generation",
         "read_inventory": "inventory", "Inventory": "inventory", "GresError": "inventory"}


__getattr__ = lazy_names(__name__, _LAZY)


#: how long a configless node's start waits for Slurm to show a GPU drain before slurmd starts anyway
_CONFIGLESS_DRAIN_WAIT = 2.0


def regenerate(config: Config, node: str, emit: Callable[..., object], node_state,
               configless: bool = False) -> Generation:
    """The start step: generate, let slurmd check the file, then have the node drained or our drain cleared.

    `node_state` is the node-state owner (slurm_ext.nodestate; the agent's
    Slurm thread): a GPU drain is waited for, since slurmd must not
    register with the wrong GPUs before Slurm shows the node drained; a
    clear is not (the owner resumes the node once the new slurmd has
    registered, which it cannot do before this step lets it start).

    `configless`: slurmd gets slurm.conf from slurmctld when it starts, and
    until it has, Slurm's tools on this node cannot reach slurmctld (a new
    pod): slurmd -G checks the file against a stand-in slurm.conf, and a
    drain Slurm does not show in time is left to the owner, which shows it
    as soon as slurmd has fetched the config. Holding slurmd back would
    wedge the node; a node recreated after a stop is drained already (the
    agent drains at SIGTERM), so no job lands meanwhile.

    Raises:
        SlurmExtError: the node needs a drain and Slurm has not shown it
            within slurm.timeout (the agent then keeps slurmd down and
            retries, without counting it as a slurmd exit).
    """
    from slurm_ext.errors import CommandError, SlurmExtError

    from .check import compare_counts, nvml_counts, slurmd_counts
    from .generation import generate

    generation = generate(config, node, emit=emit)
    drain = generation.drain
    if generation.inventory is not None and drain is None:
        try:
            seen = slurmd_counts(None if configless else config.slurm.conf_path(), generation.text, node,
                                 gres=generation.gres, inventory=generation.inventory)
            mismatch = compare_counts(nvml_counts(generation.inventory), seen, "slurmd -G")
        except (CommandError, OSError) as err:
            mismatch = [f"slurmd -G failed: {err}"]
        if mismatch:
            emit("gres-rejected", f"{generation.path}: {'; '.join(mismatch)}", "error")
            drain = f"gpu inventory failed: {mismatch[0]}"
    if not drain:
        node_state.clear(OWNER)
        return generation
    # configless, Slurm answers within a moment (slurmd restarted in the same pod) or not until slurmd runs
    timeout = _CONFIGLESS_DRAIN_WAIT if configless else config.slurm.timeout + 1.0
    ticket = node_state.want(OWNER, drain)
    if ticket.wait(timeout) is None:
        if configless:
            emit("gres-drain-pending", f"node {node} needs a drain ({drain}) that Slurm has not shown within "
                 f"{timeout:g}s; a configless slurmd is started anyway (it brings the config that lets this node "
                 "reach slurmctld) and the drain is shown as soon as it can be", "warning")
            return generation
        raise SlurmExtError(f"node {node} needs a drain ({drain}) that Slurm has not shown within {timeout:g}s; "
                            "slurmd stays down until it does")
    return generation
