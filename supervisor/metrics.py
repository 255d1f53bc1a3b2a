"""The agent's Prometheus metrics (/metrics), through prometheus_client.

A module of its own, imported at the first scrape: prometheus_client loads
about 110 modules (12 MB of resident memory), more than half of an agent
that is never scraped.
"""

from __future__ import annotations

import time
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

from .states import WorkerState

__all__ = ["AgentCollector", "exposition_of"]


class AgentCollector:
    """Prometheus view of one agent."""

    def __init__(self, agent):
        self.agent = agent

    def collect(self):
        agent = self.agent
        now = time.monotonic()
        labels = ["role", "worker"]
        restarts = CounterMetricFamily("slurm_ext_supervisor_restarts", "Restarts of a worker after it died "
                                       "or failed to start", labels=labels)
        up = GaugeMetricFamily("slurm_ext_supervisor_worker_up", "1 while the worker runs", labels=labels)
        uptime = GaugeMetricFamily("slurm_ext_supervisor_worker_uptime_seconds", "Seconds since the worker "
                                   "last started (0 when not running)", labels=labels)
        loop = GaugeMetricFamily("slurm_ext_supervisor_crash_loop", "1 while the worker is in a crash loop",
                                 labels=labels)
        for worker in list(agent.workers):
            key = [agent.role, worker.spec.name]
            running = worker.state == WorkerState.RUNNING
            restarts.add_metric(key, worker.restarts)
            up.add_metric(key, 1 if running else 0)
            uptime.add_metric(key, now - worker.started if running else 0)
            loop.add_metric(key, 1 if worker.crash_loop else 0)
        yield from (restarts, up, uptime, loop)
        orphans = CounterMetricFamily("slurm_ext_supervisor_orphans_reaped", "Exited processes reaped that "
                                      "were not workers (orphans re-parented to the agent)", labels=["role"])
        orphans.add_metric([agent.role], agent.orphans_reaped)
        yield orphans
        ready = GaugeMetricFamily("slurm_ext_supervisor_ready", "1 when the role is ready for work",
                                  labels=["role"])
        ready.add_metric([agent.role], 1 if agent.ready()[0] else 0)
        yield ready
        if agent.role == "controller":
            yield from _reconcile_metrics(agent)
        watch = agent.queue_watch
        if watch is not None and watch.size is not None:
            queue = GaugeMetricFamily("slurm_ext_accounting_dbd_queue", "Accounting records slurmctld holds for "
                                      "slurmdbd (sdiag's DBD agent queue size): above 0 while slurmdbd or its "
                                      "database is away", labels=["role"])
            queue.add_metric([agent.role], watch.size)
            yield queue


def _reconcile_metrics(agent):
    """The last `slurm-ext accounting reconcile` on this node (it keeps its counts in node.state_dir)."""
    from slurm_ext.accounting.reconcile import last_result
    result = last_result(agent.config.node.state_dir)
    if result is None:
        return
    for name, key, text in (("missing_jobs", "missing", "Job ends the witness saw that sacct lacks"),
                            ("runaway_jobs", "runaway", "Runaway jobs (sacctmgr show runawayjobs)")):
        family = GaugeMetricFamily(f"slurm_ext_accounting_{name}", f"{text}, at the last reconcile",
                                   labels=["role"])
        family.add_metric([agent.role], result.get(key, 0))
        yield family
    when = GaugeMetricFamily("slurm_ext_accounting_reconcile_timestamp_seconds", "When the last reconcile ran "
                             "(Unix time)", labels=["role"])
    when.add_metric([agent.role], result.get("time", 0))
    yield when


def exposition_of(agent) -> Callable[[], tuple[bytes, str]]:
    """A function that renders `agent`'s metrics in the text format: (body, content type)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agent))
    return lambda: (generate_latest(registry), CONTENT_TYPE_LATEST)
