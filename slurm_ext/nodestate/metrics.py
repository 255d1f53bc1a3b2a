"""The node-state owner's view as a Prometheus metric family: is this node drained by slurm-ext, and for whom.

`drained_families(node, hostname)` gives `slurm_ext_nodestate_drained`, from the node as the owner last read it
(the worker agent's Slurm thread reads it every supervisor.ready_interval): what an alert on "a node drained by
slurm-ext" needs without asking slurmctld at each scrape. Imported at the first scrape, with prometheus_client.
"""

from __future__ import annotations

from slurm_ext.slurm import REASON_PREFIX, Node

from .catalogue import kind_of, split_more

__all__ = ["drain_owner", "drained_families"]

#: the owner of a reason of ours that no kind of the catalogue reads (written by another version of slurm-ext)
UNKNOWN_OWNER = "slurm-ext"


def drain_owner(node: Node) -> str:
    """The owner of the node's drain (health/xid, repair, crash-loop/slurmd, ...) when Slurm shows it drained or
    down with a reason of ours; "" when it is not (in service, or drained by an admin or another tool)."""
    if not (node.drained or node.state == "DOWN") or not node.reason.startswith(REASON_PREFIX):
        return ""
    text, _ = split_more(node.reason.removeprefix(REASON_PREFIX).strip())
    kind = kind_of(text)
    return kind.owner_of(text) if kind else UNKNOWN_OWNER


def drained_families(node: Node | None, hostname: str):
    """`slurm_ext_nodestate_drained{hostname, owner}`: 1 while the node shows a drain of ours (owner: whose), else 0
    with an empty owner; nothing before the owner's first look (it does not know yet)."""
    from prometheus_client.core import GaugeMetricFamily
    drained = GaugeMetricFamily("slurm_ext_nodestate_drained", "1 while Slurm shows the node drained (or down) with "
                                "a reason of slurm-ext's (slurm-ext: ...); owner is whose drain it is",
                                labels=["hostname", "owner"])
    if node is not None:
        owner = drain_owner(node)
        drained.add_metric([hostname, owner], 1 if owner else 0)
    yield drained
