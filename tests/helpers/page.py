"""Every node's agent answering the page at once with literal answers: for the page's tests and bench_web, which
fill its journal cache without starting a thousand agents."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from slurm_ext.agentapi import AcceptanceAnswer, EventsPage, HealthAnswer

#: the components the stand-in journal's events take in turn
COMPONENTS = ("health", "supervisor", "prolog_epilog")


class StandInAgents:
    """`health` answers `answer` (with each node's name) for every node; `events` answers `page`, the same events
    for every node (parsed once: what is measured is the page, not the parsing)."""

    def __init__(self, names, page: EventsPage, answer: dict | None = None):
        self.page = page
        answer = answer or {"boot": "b", "time": 1.0}
        self.answers = {name: HealthAnswer.of({**answer, "node": name}) for name in names}

    def health(self, node, addr="", timeout=None):
        return self.answers[node]

    def events(self, node, addr="", since=0.0, limit=None, timeout=None):
        return self.page

    def acceptance(self, node, addr="", trigger="", timeout=None):
        return AcceptanceAnswer(node, "b", False, False, None)  # no run kept


def journal_page(start: int, count: int, node: str = "n0", boot: str = "b") -> EventsPage:
    """Events `start` .. `start + count - 1`, a second apart, of the components in turn."""
    return EventsPage.of(node, boot, "\n".join(
        json.dumps({"time": datetime.fromtimestamp(1_700_000_000 + i, timezone.utc).isoformat(), "event": "e",
                    "component": COMPONENTS[i % len(COMPONENTS)], "message": f"event {i}", "severity": "info"})
        for i in range(start, start + count)))
