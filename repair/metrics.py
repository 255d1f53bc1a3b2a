"""The repair service's and the collector's figures for the controller agent's /metrics: repairs awaiting approval,
the notifier's counts; journal events stored, the collector's backlog, agents that give no page.

The service runs in a worker process of its own; at the end of every pass it writes what an alert needs to
`<node.state_dir>/repair-metrics.json` (`write_figures`), and the controller agent's repair plug-in turns the file
into metric families at each scrape (`families`), as accounting does with its last reconcile. An approval's age is
counted at the scrape, from when the recommendation was made: it grows while the service sleeps, and while it is
down.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from slurm_ext.fileio import atomic_write

__all__ = ["FIGURES_FILE", "COLLECTOR_FILE", "write_figures", "read_figures", "families", "write_collector",
           "collector_families"]

#: in node.state_dir
FIGURES_FILE = "repair-metrics.json"
COLLECTOR_FILE = "collector-metrics.json"


def write_figures(state_dir: str, now: float, awaiting: list, notify: dict | None) -> None:
    """`awaiting`: the records waiting for an operator's decision; `notify`: the notifier's counts (None: none)."""
    data = {"time": now, "awaiting": [{"node": r.node, "signature": r.signature, "action": r.action,
                                       "opened": r.opened} for r in awaiting],
            "notify": notify}
    atomic_write(Path(state_dir) / FIGURES_FILE, json.dumps(data), mode=0o644, fsync="none")


def write_collector(state_dir: str, figures: dict) -> None:
    """The collector's figures (collector.Figures and the time), every few seconds."""
    atomic_write(Path(state_dir) / COLLECTOR_FILE, json.dumps(figures), mode=0o644, fsync="none")


def read_figures(state_dir: str, name: str = FIGURES_FILE) -> dict | None:
    try:
        data = json.loads((Path(state_dir) / name).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def families(state_dir: str, now: float | None = None):
    """The metric families of the figures the service wrote last (nothing before its first pass)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    data = read_figures(state_dir)
    if data is None:
        return
    now = time.time() if now is None else now
    waiting = GaugeMetricFamily("slurm_ext_repair_awaiting_approval_seconds", "Seconds since the node's repair was "
                                "recommended, while it waits for an operator's approval or rejection",
                                labels=["hostname", "signature", "action"])
    for record in data.get("awaiting") or ():
        waiting.add_metric([record["node"], record["signature"], record["action"]],
                           max(0.0, now - float(record["opened"])))
    yield waiting
    passed = GaugeMetricFamily("slurm_ext_repair_pass_timestamp_seconds", "When the repair service last looked at "
                               "the cluster (Unix time)")
    passed.add_metric([], float(data.get("time", 0)))
    yield passed
    notify = data.get("notify")
    if not isinstance(notify, dict):
        return
    posted = CounterMetricFamily("slurm_ext_repair_notify_posted", "Notices the webhook took")
    posted.add_metric([], notify.get("posted", 0))
    retried = CounterMetricFamily("slurm_ext_repair_notify_retries", "Posts to the webhook tried again after it "
                                  "refused one or did not answer")
    retried.add_metric([], notify.get("retried", 0))
    dropped = CounterMetricFamily("slurm_ext_repair_notify_dropped", "Notices never posted: the queue was full "
                                  "(why=queue-full) or their retries ran out (why=failed)", labels=["why"])
    dropped.add_metric(["queue-full"], notify.get("dropped", 0))
    dropped.add_metric(["failed"], notify.get("failed", 0))
    queue = GaugeMetricFamily("slurm_ext_repair_notify_queue", "Notices waiting to be posted")
    queue.add_metric([], notify.get("queue", 0))
    yield from (posted, retried, dropped, queue)


def collector_families(state_dir: str):
    """The metric families of the figures the collector wrote last (nothing before its first)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    data = read_figures(state_dir, COLLECTOR_FILE)
    if data is None:
        return
    for name, kind, about in _METRICS:
        if kind == "counter":
            family = CounterMetricFamily(f"slurm_ext_history_{name}", about)
        else:
            family = GaugeMetricFamily(f"slurm_ext_history_{name}", about)
        family.add_metric([], float(data.get(name, 0) or 0))
        yield family


_METRICS = (
    ("events", "counter", "Journal events the collector stored"),
    ("pages", "counter", "Journal pages the collector stored (one agent's answer each)"),
    ("failures", "counter", "Agents' answers that were no journal page (no answer, refused, not believed)"),
    ("health_failures", "counter", "Journal pages whose agent gave no /health beside them (status and the page ask "
                                   "that agent themselves)"),
    ("lost", "counter", "Journal pages that began at the oldest file kept: lines were rotated out before they were "
                        "taken"),
    ("odd", "counter", "Journal lines that were no event, not stored"),
    ("dropped", "counter", "Pages dropped because another collector had moved the node's cursor"),
    ("store_seconds", "counter", "Seconds spent storing events in the database"),
    ("store_failures", "counter", "Stores the database refused or did not answer"),
    ("refused", "counter", "Events of pages the database refused whole, set aside (history-page-refused)"),
    ("backlog_full", "counter", "Times the backlog reached history.backlog (no agent asked until it is stored)"),
    ("backlog", "gauge", "Events read from the agents and not stored yet"),
    ("failing", "gauge", "Nodes whose agent gave no journal page at its last ask"),
    ("nodes", "gauge", "Nodes the collector asks"),
)
