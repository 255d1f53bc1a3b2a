"""Recommendations from what Slurm shows: pure functions of the nodes, their jobs and the open records.

A node's health monitor drains it, through the node-state owner, with a
reason that names the fault and its action (`slurm-ext: xid 79 gpu 2 ...
action=reboot`); that drain is the fault as the whole cluster sees it, in
one Slurm query for every node. Here a fault becomes a recommendation (one
per node and signature), with the action from the [repair] actions table
or else the finding's own; it escalates in place when the fault gets worse
(its action does) or came back after escalate_after reboots (to remove) or
escalate_after resets of the same GPU (to reboot); it goes away when the
monitor lifts the drain (its quiet window passed). A node that failed its
acceptance tests (`slurm-ext: acceptance quick failed: gpu-memory gpu 1:
... action=reset-gpu`) is a fault the same way: acceptance/<test>, with the
action and the GPU its reason names (a later run that passes lifts it). A
reboot recommended because a GPU reset failed stays while that failure
drains the node. Records under repair are the flow's, not touched here.
"""

from __future__ import annotations

from dataclasses import dataclass
import re

from slurm_ext import nodestate
from slurm_ext.nodestate.catalogue import HEALTH, fault_signature, kind_named, split_more
from slurm_ext.slurm import REASON_PREFIX, Node

from .settings import ACTIONS, RepairSection
from .store import Record

__all__ = ["Fault", "RecordChange", "fault_of", "action_for", "plan"]

#: health's actions that a repair carries out as one of ours
_AS_REPAIR = {"reset-gpu": "reset-gpu", "reboot": "reboot", "reprovision": "reprovision", "failover": "failover",
              "remove": "remove"}
#: the records this module keeps: not decided yet, or rejected while their fault lasts
_UNDECIDED = ("recommended", "rejected")
#: the GPU a health drain's evidence names ("48 gpu 2 ...", "gpu 3 row remapping pending")
_GPU = re.compile(r"(?:^|\s)gpu (\d+)(?=\s|$)")
#: the GPU an acceptance drain's detail names: its failed test's target ("gpu-memory gpu 1: ...")
_TARGET_GPU = re.compile(r"^\S+ gpu (\d+):")
#: a failed acceptance run's drain: written by acceptance (verdict.drain_reason), its detail the first failed test,
#: its target and what was measured
_ACCEPTANCE = kind_named("acceptance")


@dataclass(frozen=True, slots=True)
class Fault:
    node: str
    signature: str
    #: the finding's own action (health's words)
    action: str
    evidence: str
    #: the GPU the evidence names (its NVML index), None for a fault of the node
    gpu: int | None = None


@dataclass(frozen=True, slots=True)
class RecordChange:
    #: new, escalated, updated (jobs or evidence), gone (fault cleared, record closed), closed (a rejected record's
    #: fault is over)
    kind: str
    record: Record
    message: str = ""


def fault_of(node: Node) -> Fault | None:
    """The fault a node's health or acceptance drain names, or None (drained by neither)."""
    if not (node.drained or node.state == "DOWN") or not node.reason.startswith(REASON_PREFIX):
        return None
    text, _ = split_more(node.reason.removeprefix(REASON_PREFIX).strip())
    failed = _ACCEPTANCE.parse(text)  # before health's, whose template matches any reason that ends in action=X
    if failed is not None:
        detail = failed["detail"]
        gpu = _TARGET_GPU.match(detail)
        return Fault(node.name, f"acceptance/{detail.split(maxsplit=1)[0].rstrip(':')}", failed["action"].split()[0],
                     f"acceptance {failed['level']}: {detail}", int(gpu.group(1)) if gpu else None)
    found = HEALTH.parse(text)
    if found is None:
        return None
    check, evidence, action = found["check"], found["evidence"], found["action"]
    gpu = _GPU.search(evidence)
    return Fault(node.name, fault_signature(check, evidence), action.split()[0], evidence,
                 int(gpu.group(1)) if gpu else None)


def action_for(fault: Fault, settings: RepairSection) -> str | None:
    """The repair action of a fault: the table's (signature, then check), else the finding's; None when it
    needs no repair of the node (restart-job, none)."""
    check = fault.signature.split("/", 1)[0]
    return settings.actions.get(fault.signature) or settings.actions.get(check) or _AS_REPAIR.get(fault.action)


def plan(records: list[Record], nodes: list[Node], jobs: dict[str, list[int]], settings: RepairSection,
         reboots: dict[tuple[str, str], int], now: float,
         resets: dict[tuple[str, str, int], int] | None = None) -> list[RecordChange]:
    """The changes to the open records that the cluster as seen now calls for.

    `records`: the open ones; `jobs`: node -> ids of its jobs; `reboots`: (node, signature) -> reboots done for it
    within escalate_window; `resets`: (node, signature, GPU) -> GPU resets done for it within escalate_window.
    """
    resets = resets or {}
    under_repair = {r.node for r in records if r.state not in _UNDECIDED}
    by_node: dict[str, list[Record]] = {}
    for record in records:
        if record.state in _UNDECIDED:
            by_node.setdefault(record.node, []).append(record)
    changes: list[RecordChange] = []
    for node in nodes:
        mine = by_node.pop(node.name, [])
        if node.name in under_repair:
            continue  # the flow's
        fault = fault_of(node)
        for record in mine:
            if fault is None and record.detail.get("after_failed") and nodestate.is_repair_reason(node.reason):
                continue  # a failed GPU reset's reboot: the failure drains the node, the fault is still there
            if fault is None or fault.signature != record.signature:
                changes.append(_closed(record, now, "its fault cleared" if fault is None else
                                       f"the node's fault is now {fault.signature}"))
        current = next((r for r in mine if fault and r.signature == fault.signature), None)
        if fault is None:
            continue
        action = action_for(fault, settings)
        if action is None:
            continue
        count = reboots.get((node.name, fault.signature), 0)
        evidence = fault.evidence
        if action == "reset-gpu" and fault.gpu is None:
            action = "reboot"  # no GPU named: the node's reboot resets every GPU
        elif action == "reset-gpu":
            done = resets.get((node.name, fault.signature, fault.gpu), 0)
            if done >= settings.escalate_after:
                action = "reboot"
                evidence += f" (back after {done} resets of gpu {fault.gpu} for it: escalated to reboot)"
        if action == "reboot" and count >= settings.escalate_after:
            action = "remove"
            evidence += f" (back after {count} reboots for it: escalated to remove)"
        node_jobs = sorted(jobs.get(node.name, []))
        if current is None:
            detail = {"gpu": fault.gpu} if fault.gpu is not None else {}
            changes.append(RecordChange("new", Record(node.name, fault.signature, action, evidence, node_jobs,
                                                opened=now, updated=now, detail=detail),
                                  f"{action} recommended for {fault.signature}: {evidence}"))
        elif current.state == "recommended" and ACTIONS.index(action) > ACTIONS.index(current.action):
            was = current.action
            current.action, current.evidence, current.jobs, current.updated = action, evidence, node_jobs, now
            if fault.gpu is not None:
                current.detail["gpu"] = fault.gpu
            changes.append(RecordChange("escalated", current, f"escalated from {was} to {action}: {evidence}"))
        elif current.state == "recommended" and (current.jobs != node_jobs or current.evidence != evidence):
            current.jobs, current.evidence, current.updated = node_jobs, evidence, now
            changes.append(RecordChange("updated", current))
    for leftover in by_node.values():  # nodes Slurm no longer lists
        changes += [_closed(record, now, "the node is no longer in Slurm") for record in leftover]
    return changes


def _closed(record: Record, now: float, why: str) -> RecordChange:
    kind = "gone" if record.state == "recommended" else "closed"
    if kind == "gone":
        record.state = "gone"
    record.closed, record.updated = now, now
    outcome = "no longer recommended" if kind == "gone" else "closed"
    return RecordChange(kind, record, f"{record.action} for {record.signature} {outcome}: {why}")

