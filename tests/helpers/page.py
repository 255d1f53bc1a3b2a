"""Every node's agent answering the page at once with literal answers, and journals stored as the controller's
collector stores them: for the page's tests and bench_web, which fill the history without starting a thousand
agents."""

from __future__ import annotations

import json
import time

from slurm_ext.agentapi import AcceptanceAnswer, HealthAnswer
from slurm_ext.repair import nodeevents

#: the components the stand-in journal's events take in turn
COMPONENTS = ("health", "supervisor", "prolog_epilog")


class LiteralSlurm:
    """slurmctld's answers as literal records: `listed`, which a test may change between refreshes; no job, no
    event."""

    def __init__(self, listed: list):
        self.listed = listed

    def nodes(self):
        return list(self.listed)

    def node_events(self, node, since):
        return []

    def queue(self):
        return []

    def show_config(self):
        return {"ClusterName": "unit", "SLURM_VERSION": "26.05.0"}


class StandInAgents:
    """`health` answers `answer` (with each node's name) for every node; no acceptance run is kept."""

    def __init__(self, names, answer: dict | None = None):
        answer = answer or {"boot": "b", "time": 1.0}
        self.answers = {name: HealthAnswer.of({**answer, "node": name}) for name in names}

    def health(self, node, addr="", timeout=None):
        return self.answers[node]

    def acceptance(self, node, addr="", trigger="", timeout=None):
        return AcceptanceAnswer(node, "b", False, False, None)  # no run kept


def journal_lines(start: int, count: int, first: float | None = None) -> str:
    """Events `start` .. `start + count - 1`, a second apart from `first` (epoch; default: `count` seconds ago), of
    the components in turn, as a node's journal holds them."""
    first = time.time() - count if first is None else first
    return "\n".join(
        json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(first + i - start)), "event": "e",
                    "component": COMPONENTS[i % len(COMPONENTS)], "message": f"event {i}", "severity": "info"})
        for i in range(start, start + count))


def stored_journal(store, node: str, journal: str) -> int:
    """`journal` (lines as a node's journal holds them) stored as the collector stores a page of node `node`: after
    the node's cursor, which moves past it. The events stored."""
    start = nodeevents.cursors(store).get(node, nodeevents.Cursor(node)).cursor
    offset = int(start.split(":")[1]) if start else 0
    rows = [row for line in journal.splitlines() if (row := nodeevents.row_of(node, line.encode())) is not None]
    taken, dropped = nodeevents.take(store, [nodeevents.Page(node, start, f"{'0' * 16}:{offset + len(journal) + 1}",
                                                             "boot-1", rows)])
    assert not dropped
    return taken
