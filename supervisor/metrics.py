"""The agent's Prometheus metrics (/metrics), through prometheus_client.

The agent's own (its workers, readiness, the node's interfaces) and each
plug-in's (slurm_ext.plugin.Live.metrics). A module of its own, imported at
the first scrape: prometheus_client loads about 110 modules (12 MB of
resident memory), more than half of an agent that is never scraped.
"""

from __future__ import annotations

import time
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

from .agentstate import AgentState
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
        states = GaugeMetricFamily("slurm_ext_supervisor_worker_state", "1 for the worker's state (stopped, "
                                   "running, backoff, stopping), 0 for the others", labels=["role", "worker", "state"])
        for worker in list(agent.workers):
            for each in WorkerState:
                states.add_metric([agent.role, worker.spec.name, each.value], 1 if worker.state == each else 0)
        yield states
        orphans = CounterMetricFamily("slurm_ext_supervisor_orphans_reaped", "Exited processes reaped that "
                                      "were not workers (orphans re-parented to the agent)", labels=["role"])
        orphans.add_metric([agent.role], agent.orphans_reaped)
        yield orphans
        ready = GaugeMetricFamily("slurm_ext_supervisor_ready", "1 when the role is ready for work",
                                  labels=["role"])
        ready.add_metric([agent.role], 1 if agent.ready()[0] else 0)
        yield ready
        state = GaugeMetricFamily("slurm_ext_supervisor_state", "1 for the agent's own state (starting, running, "
                                  "stopping, stopped), 0 for the others", labels=["role", "state"])
        for each in AgentState:
            state.add_metric([agent.role, each.value], 1 if agent.life.state == each else 0)
        yield state
        if agent.role == "worker":
            yield from _network_metrics(agent)
        liaison = agent.liaison
        if liaison is not None and liaison.watch_node:  # the agent of the node's slurmd: its drain, as last read
            from slurm_ext.nodestate.metrics import drained_families
            yield from drained_families(liaison.owner.seen, agent.node)
        for live in agent.live_plugins:  # each plug-in's (health's readings, accounting's queue)
            yield from live.metrics()


def _network_metrics(agent):
    """The node's interfaces' byte counters (nodefacts: physical interfaces and health.interfaces), for the cluster
    page's bandwidth when it reads Prometheus; counters, so rate() gives bytes per second."""
    from slurm_ext.nodefacts import read_facts
    host = agent.config.node.slurm_name
    received = CounterMetricFamily("slurm_ext_network_receive_bytes", "Bytes received by the interface (its "
                                   "statistics/rx_bytes)", labels=["device", "hostname"])
    sent = CounterMetricFamily("slurm_ext_network_transmit_bytes", "Bytes sent by the interface (its "
                               "statistics/tx_bytes)", labels=["device", "hostname"])
    for interface in read_facts(tuple(agent.config.health.interfaces)).interfaces:
        received.add_metric([interface.name, host], interface.rx_bytes)
        sent.add_metric([interface.name, host], interface.tx_bytes)
    yield received
    yield sent


def exposition_of(agent) -> Callable[[], tuple[bytes, str]]:
    """A function that renders `agent`'s metrics in the text format: (body, content type)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agent))
    return lambda: (generate_latest(registry), CONTENT_TYPE_LATEST)
