"""One timeline of what happened on the cluster: `slurm-ext history`.

Three sources, merged in time order:
- Slurm's own event table (`sacctmgr show event`, one query for every
  node): state changes, their reasons and who set them;
- the node agents' journals, each read over its agent's HTTP listener
  (GET /events?since=, read-only), all at once on a few threads;
- the repair records: recommendations, decisions (with the operator) and
  every step.
An agent that does not answer is named in the answer, not skipped in
silence: its node's own events are then missing from the timeline.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone

from slurm_ext.slurm import SlurmClient

from . import agents
from .store import Store

__all__ = ["Entry", "Timeline", "gather"]

#: agents asked at once
_PARALLEL = 32
#: longest wait for one agent
_AGENT_TIMEOUT = 3.0


@dataclass(frozen=True, slots=True)
class Entry:
    time: float
    node: str
    #: slurm, agent (the node's journal) or repair
    source: str
    event: str
    message: str
    user: str = ""


@dataclass
class Timeline:
    entries: list[Entry] = field(default_factory=list)
    #: nodes whose agent did not answer (their journal is missing), with why
    unreachable: dict[str, str] = field(default_factory=dict)


def gather(settings, store: Store, slurm: SlurmClient, since: float, node: str | None = None) -> Timeline:
    """The merged timeline since `since` (epoch seconds), of `node` or of every node slurmctld knows.

    The event table and the node table are asked at once (each is one Slurm query for the whole cluster), and the
    agents as soon as the node table says where they listen.
    """
    timeline = Timeline()
    moment = datetime.fromtimestamp(since, timezone.utc)
    with ThreadPoolExecutor(max_workers=_PARALLEL) as pool:
        slurm_events = pool.submit(slurm.node_events, node, moment)
        listed = [slurm.node(node)] if node else slurm.nodes()
        journals = pool.map(lambda n: (n.name, _journal(agents.address(settings, n.name, n.addr), since)), listed)
        for event in slurm_events.result():
            who = f" (by {event.user})" if event.user else ""
            timeline.entries.append(Entry(event.start.timestamp(), event.node, "slurm", event.state.lower(),
                                          f"{event.state}: {event.reason}{who}", event.user))
            if event.end:
                timeline.entries.append(Entry(event.end.timestamp(), event.node, "slurm", "end",
                                              f"{event.state} over: {event.reason}"))
        for entry in store.events(node=node, since=since):
            timeline.entries.append(Entry(entry.time, entry.node or "-", "repair", entry.event, entry.message,
                                          entry.user))
        for name, (lines, problem) in journals:
            if problem:
                timeline.unreachable[name] = problem
            for data in lines:
                if data.get("component") == "repair":
                    continue  # the controller's journal: the same as the repair records, which hold the user
                timeline.entries.append(Entry(_epoch(data.get("time", "")), name, "agent",
                                              f"{data.get('component', '?')}/{data.get('event', '?')}",
                                              str(data.get("message", ""))))
    timeline.entries.sort(key=lambda e: (e.time, e.node))
    return timeline


def _journal(address: str, since: float) -> tuple[list[dict], str]:
    """A node's journal events since `since`, or ([], why) when its agent does not answer."""
    body, problem = agents.get(f"http://{address}/events?since={since:.0f}", _AGENT_TIMEOUT)
    lines = []
    for line in (body or "").splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):  # one odd line does not cost the node its timeline
            lines.append(data)
    return lines, problem


def _epoch(text: str) -> float:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return 0.0
