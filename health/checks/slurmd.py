"""Slurm shows this node's slurmd not responding (the agent restarts a dead one; this says Slurm lost it)."""

from ..check import Check, View
from ..records import Observation
from ..settings import Params


def judge(view: View, params: Params) -> list:
    node = view.node
    if node is None or node.error:
        return None  # Slurm did not say: no verdict
    if node.responding:
        return []
    return [Observation(params.id, "node", params.severity, params.action,
                        f"slurmd of {node.name} not responding (expected responding)")]


CHECK = Check("slurmd", "slurm", polled=judge)
