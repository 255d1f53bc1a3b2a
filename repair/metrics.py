"""The repair service's figures for the controller agent's /metrics: repairs awaiting approval, the notifier's counts.

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

__all__ = ["FIGURES_FILE", "write_figures", "read_figures", "families"]

#: in node.state_dir
FIGURES_FILE = "repair-metrics.json"


def write_figures(state_dir: str, now: float, awaiting: list, notify: dict | None) -> None:
    """`awaiting`: the records waiting for an operator's decision; `notify`: the notifier's counts (None: none)."""
    data = {"time": now, "awaiting": [{"node": r.node, "signature": r.signature, "action": r.action,
                                       "opened": r.opened} for r in awaiting],
            "notify": notify}
    atomic_write(Path(state_dir) / FIGURES_FILE, json.dumps(data), mode=0o644, fsync="none")


def read_figures(state_dir: str) -> dict | None:
    try:
        data = json.loads((Path(state_dir) / FIGURES_FILE).read_text())
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
