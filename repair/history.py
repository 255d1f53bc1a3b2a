"""One timeline of what happened on the cluster: `slurm-ext history`.

Three sources, merged in time order:
- Slurm's own event table (`sacctmgr show event`, one query for every
  node): state changes, their reasons and who set them;
- the node agents' journals as the controller's collector stored them
  (`nodeevents`: one query of the repair database, whatever the number of
  nodes; no agent is asked);
- the repair records: recommendations, decisions (with the operator) and
  every step.
What the history cannot show is said, not skipped in silence: a node whose
agent the collector cannot reach (its events since are missing), a journal
that rotated lines out before they were taken, and a collector that does not
run (none of the journals is then current). An acceptance run's end
(acceptance-done) carries its results, each with its figures against their
limits: they are the entry's `lines`.

The order is causal where clocks are coarse (`in_causal_order`). Slurm's
event table and the journals keep whole seconds, the repair records keep the
moment each step happened, before the action it records. A whole-second
entry happened somewhere in its second, so in time order it goes at the
start of it: right for what a repair step observed in that second (the
drain Slurm recorded when the node's last job ended comes before "the
node's jobs have ended"), wrong for what a repair step caused in it
(Slurm's reboot and the agent's stop and start after `scontrol reboot`,
within the second on a quick node). An entry that a step of its second can
have caused (the step says what it did: `Event.acts`) is therefore listed
just after that step, and its time says so: each entry's time is the
earliest moment it can have happened.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from slurm_ext.nodestate.catalogue import fault_signature
from slurm_ext.slurm import SlurmClient
from slurm_ext.words import moment

from . import nodeevents
from .collector import CONTROL, running
from .store import ACTS, Record, Store

__all__ = ["Entry", "Timeline", "gather", "in_causal_order", "result_lines"]

#: most result lines shown under one acceptance-done (8 GPUs' tests, and a node's interfaces and paths, are fewer)
_RESULT_LINES = 200
#: how far after the step that caused it a whole-second entry is put: a microsecond, still inside its own second
_AFTER_CAUSE = 1e-6
#: what can cause each kind of whole-second entry of a node, of the actions a repair step records (store.ACTS)
_ANY_CHANGE = frozenset(ACTS) - {"requeue", "reset-gpu"}  # a node state that ended: it changed
_DOWN = frozenset({"reboot", "executor"})  # DOWN, NOT_RESPONDING, FAIL: the node went away
#: a word in the state of a Slurm event that starts -> what can cause it
_STATE_CAUSES = (("boot", frozenset({"reboot"})),  # BOOT^, REBOOT_ISSUED, ...
                 ("drain", frozenset({"drain", "requeue"})),  # a DRAIN starts once the node's last job is gone
                 ("down", _DOWN), ("fail", _DOWN), ("not_responding", _DOWN), ("*", _DOWN))
_RESTART = frozenset({"reboot", "executor"})  # anything its agent says: the agent stopped and started again
_AGENT_SEES_DRAIN = _RESTART | {"drain"}  # the agent finds its own drain replaced by the repair's
_AGENT_SEES_RESET = _RESTART | {"reset-gpu"}  # its health monitor clears the reset GPU's findings


@dataclass(frozen=True, slots=True)
class Entry:
    #: the earliest moment it can have happened (epoch seconds): a whole-second source's second, or just after the
    #: repair step of that second that caused it
    time: float
    node: str
    #: slurm, agent (the node's journal) or repair
    source: str
    event: str
    message: str
    user: str = ""
    #: a repair step's action on the node (store.ACTS), empty for anything else
    acts: str = ""
    #: the repair record a repair row belongs to (its id), None for anything else
    record: int | None = None
    #: the fault it is about (xid/79, row-remap), its check, GPU (NVML index) and severity: a repair row's from its
    #: record (the finding whose drain opened it: always critical, the only findings that drain), a health event's
    #: from its finding; empty (None) for a row about no fault
    signature: str = ""
    check: str = ""
    gpu: int | None = None
    severity: str = ""
    #: lines shown under the message: an acceptance run's results (acceptance-done), each with its figures against
    #: their limits (`gpu-bandwidth gpu 0: pass: h2d_gbps 55.4 GB/s (>= 48)`); empty for anything else
    lines: tuple[str, ...] = ()


@dataclass
class Timeline:
    entries: list[Entry] = field(default_factory=list)
    #: nodes whose agent the collector cannot reach (their events since are missing), with why and since when
    unreachable: dict[str, str] = field(default_factory=dict)
    #: nodes whose journal is incomplete in the span (lines rotated out before they were taken), with what
    incomplete: dict[str, str] = field(default_factory=dict)
    #: why the agents' journals are not current ("" while the collector runs): it never ran, or stopped
    collector: str = ""
    #: older entries left out to keep the newest `limit` (0: none)
    cut: int = 0


def gather(store: Store, slurm: SlurmClient, since: float, node: str | None = None, limit: int = 1000,
           now: float | None = None) -> Timeline:
    """The newest `limit` entries of the merged timeline since `since` (epoch seconds), of `node` or of every node:
    one Slurm query and a few queries of the repair database, whatever the number of nodes (a day of 10,000 nodes'
    journals is millions of events: the newest are asked for, and the rest counted as cut)."""
    timeline = Timeline()
    for event in slurm.node_events(node, datetime.fromtimestamp(since, timezone.utc)):
        who = f" (by {event.user})" if event.user else ""
        timeline.entries.append(Entry(event.start.timestamp(), event.node, "slurm", event.state.lower(),
                                      f"{event.state}: {event.reason}{who}", event.user))
        if event.end:
            timeline.entries.append(Entry(event.end.timestamp(), event.node, "slurm", "end",
                                          f"{event.state} over: {event.reason}"))
    records: dict[int, Record | None] = {}
    for entry in store.events(node=node, since=since):
        if entry.record is not None and entry.record not in records:
            records[entry.record] = store.get(entry.record)
        timeline.entries.append(Entry(entry.time, entry.node or "-", "repair", entry.event, entry.message,
                                      entry.user, entry.acts, entry.record,
                                      **_of_record(records.get(entry.record))))
    # component repair: the collector's word on a node's journal (what it lacks), not the node's own events
    journal = nodeevents.events(store, since, node=node, but=("repair",), limit=limit + 1)
    for mark in nodeevents.lost_marks(store, since, node).values():
        timeline.incomplete[mark.node] = f"{mark.message} ({moment(mark.time)})"
    for found in journal[-limit:]:
        data = found.data()
        timeline.entries.append(Entry(found.time, found.node, "agent", f"{found.component}/{found.event}",
                                      found.message, **_of_finding(data), lines=result_lines(data)))
    timeline.unreachable, timeline.collector = _not_collected(store, node, time.time() if now is None else now)
    timeline.entries = in_causal_order(timeline.entries)
    if len(timeline.entries) > limit or len(journal) > limit:
        timeline.cut = len(timeline.entries) - limit + (len(journal) > limit)
        timeline.entries = timeline.entries[-limit:]
    return timeline


def _not_collected(store: Store, node: str | None, now: float) -> tuple[dict[str, str], str]:
    """(the nodes whose agent the collector cannot reach, with why and since when; why no journal is current, or
    "")."""
    unreachable = {name: f"{c.error} (since {moment(c.failing_since)}; its events since then are missing)"
                   for name, c in nodeevents.failing(store, [node] if node else None).items()}
    said = store.control(CONTROL)
    if said is None:
        return unreachable, ("the collector has never run: no node agent's journal is in the history (the "
                             "controller agent runs it as its `collector` worker, with history.enabled)")
    if not running(said, now):
        return unreachable, (f"the collector last ran {moment(said[2])}: the agents' journals are in the history up "
                             "to about then (is the controller agent's `collector` worker running?)")
    return unreachable, ""


def result_lines(data: dict) -> tuple[str, ...]:
    """The result lines of a journal's acceptance-done event (its `results` field: one line per test and target, with
    its outcome and figures), the first `_RESULT_LINES`; none for any other event or an odd field."""
    if data.get("component") != "acceptance" or data.get("event") != "acceptance-done":
        return ()
    found = data.get("results")
    if not isinstance(found, list):
        return ()
    lines = tuple(str(line) for line in found[:_RESULT_LINES])
    return lines + ((f"+{len(found) - _RESULT_LINES} more (`slurm-ext accept show` on the node)",)
                    if len(found) > _RESULT_LINES else ())


def _of_record(record: Record | None) -> dict:
    """The fault fields of a repair row, from its record."""
    if record is None:
        return {}
    gpu = record.detail.get("gpu")
    return {"signature": record.signature, "check": record.signature.split("/", 1)[0],
            "gpu": gpu if isinstance(gpu, int) else None, "severity": "critical"}


def _of_finding(data: dict) -> dict:
    """The fault fields of a node's journal event about a finding (health-finding, -escalated, -cleared), else none."""
    check, evidence = data.get("check"), data.get("evidence")
    if data.get("component") != "health" or not isinstance(check, str) or not check:
        return {}
    gpu = data.get("gpu")
    severity = data.get("finding_severity")
    return {"signature": fault_signature(check, evidence if isinstance(evidence, str) else ""), "check": check,
            "gpu": gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else None,
            "severity": severity if isinstance(severity, str) else ""}


def in_causal_order(entries: list[Entry]) -> list[Entry]:
    """`entries` in time order, each whole-second entry that a repair step of its second can have caused moved to
    just after that step (its time too: the earliest moment it can have happened). Entries of the same time keep
    their order, so Slurm's events of one second stay in the order Slurm gave them, and a node's journal in its own.
    """
    actions: dict[str, list[Entry]] = {}
    for entry in sorted((e for e in entries if e.source == "repair" and e.acts), key=lambda e: e.time):
        actions.setdefault(entry.node, []).append(entry)
    times = {node: [a.time for a in acted] for node, acted in actions.items()}
    placed = [_after_its_cause(entry, actions.get(entry.node, []), times.get(entry.node, [])) for entry in entries]
    return sorted(placed, key=lambda e: (e.time, e.node))


def _after_its_cause(entry: Entry, actions: list[Entry], times: list[float]) -> Entry:
    """`entry`, or, if it is a whole-second one and a repair step of its node in the same second did what can cause
    it, a copy just after the last such step (`actions`: the node's steps that acted, in time order; `times`: theirs).
    """
    if entry.source == "repair" or not entry.time.is_integer():
        return entry
    causes = _causes(entry)
    for index in range(bisect.bisect_left(times, entry.time + 1) - 1, -1, -1):
        if times[index] < entry.time:
            break
        if actions[index].acts in causes:
            return replace(entry, time=times[index] + _AFTER_CAUSE)
    return entry


def _causes(entry: Entry) -> frozenset[str]:
    """The repair actions that can cause a whole-second entry. From the node's agent: anything (it stopped and started
    again), its finding the repair's drain in place of its own also a drain, its health monitor's events also a GPU
    reset. From Slurm's event table: an event's end any change of the node's state; its start, by the states it names
    (BOOT^, DRAIN, DOWN*, ...)."""
    if entry.source == "agent":
        if entry.event.startswith("health/"):
            return _AGENT_SEES_RESET
        return _AGENT_SEES_DRAIN if entry.event == "nodestate/drain-overridden" else _RESTART
    if entry.event == "end":
        return _ANY_CHANGE
    named = [causes for word, causes in _STATE_CAUSES if word in entry.event]
    return frozenset().union(*named) if named else _DOWN
