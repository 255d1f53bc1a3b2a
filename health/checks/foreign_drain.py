"""The node drained by someone else (an admin, NHC, slurm-operator): reported, never acted on."""

from ..check import Check, View
from ..records import Observation
from ..settings import Params


def judge(view: View, params: Params) -> list:
    node = view.node
    if node is None or node.error:
        return None  # Slurm did not say: no verdict
    if not node.drained or node.ours:
        return []
    return [Observation(params.id, "node", params.severity, "none",
                        f"drained by someone else: {node.reason or 'no reason'} (expected not drained)",
                        fields={"reason": node.reason})]


CHECK = Check("foreign-drain", "slurm", polled=judge)
