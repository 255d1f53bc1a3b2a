"""The controller's writes of node state: the repair service's drain and resume of the nodes it repairs.

A node's own agent owns that node's drains (`NodeState`); a repair is the
one thing decided away from the node, by an operator, on the controller.
Its reason is the catalogue's `repair` kind, which node agents leave
alone as they would an admin's. The rules are the owner's: the repair's
drain replaces only a reason of ours (the health finding that asked for
the repair) or none, never an admin's or another tool's; the resume lifts
only a repair reason.
"""

from __future__ import annotations

from slurm_ext.errors import SlurmError
from slurm_ext.slurm import REASON_PREFIX, Node, SlurmClient, is_our_reason

from .catalogue import kind_of, split_more

__all__ = ["HeldByOthers", "repair_reason", "is_repair_reason", "drain_for_repair", "resume_after_repair"]


class HeldByOthers(SlurmError):
    """The node holds a reason that is not the repair's: the repair stops, the reason stays as it is."""

    def __init__(self, node: str, reason: str, what: str):
        self.node, self.reason = node, reason
        super().__init__(f"node {node}: not {what}: it holds {reason!r}, which is not this repair's (an admin's or "
                         "another part's reason is left as it is)")


def repair_reason(action: str, what: str, user: str) -> str:
    """The full reason of a node under repair (Slurm may add ': reboot issued' and ': reboot complete')."""
    text = " ".join(what.split()).replace("action=", "action ")  # never read back as a health finding's
    return f"{REASON_PREFIX} repair {action}: {text} (approved by {user})"


def is_repair_reason(reason: str) -> bool:
    """Whether a node's reason (Slurm's ': reboot issued' tail and all) is a repair's: the controller's to lift."""
    if not is_our_reason(reason):
        return False
    kind = kind_of(split_more(reason.removeprefix(REASON_PREFIX).strip())[0])
    return kind is not None and kind.from_controller


def drain_for_repair(slurm: SlurmClient, node: Node, reason: str) -> bool:
    """Drain `node` with the repair's `reason`; False when it already shows it.

    Raises:
        HeldByOthers: the node is drained or down with a reason that is not ours (an admin's: left as it is).
    """
    if node.reason == reason and (node.drained or node.state == "DOWN"):
        return False
    if (node.drained or node.state == "DOWN") and node.reason and not is_our_reason(node.reason):
        raise HeldByOthers(node.name, node.reason, "draining it for its repair")
    slurm.drain(node.name, reason)
    return True


def resume_after_repair(slurm: SlurmClient, node: Node) -> bool:
    """Resume `node` if it shows a repair reason; False when there was nothing of ours to lift.

    Raises:
        HeldByOthers: the node holds a reason that is not a repair's (an admin took it over meanwhile, or a
            health check drained it again).
    """
    if not (node.drained or node.state == "DOWN"):
        return False
    if not is_repair_reason(node.reason):
        raise HeldByOthers(node.name, node.reason, "resuming it after its repair")
    slurm.resume(node.name)
    return True
