"""GPU and network usage from what the agents answer (or from Prometheus): pure functions of their answers.

An agent's /health carries its health monitor's latest GPU readings and the
node's interface byte counters; `node_usage` turns one answer into the
node's figures, and `bandwidth` two answers of one node into bytes per
second (a counter that went down, after a reboot or a driver reload, gives
nothing rather than a negative rate). `cluster_usage` sums the nodes.
`prometheus_usage` asks a Prometheus the same figures, when the page is
told to use one.
"""

from __future__ import annotations

import json
import math
import urllib.parse
from dataclasses import dataclass, field

from slurm_ext.agentapi import HealthAnswer

__all__ = ["GpuRow", "NodeUsage", "Usage", "gpu_rows", "node_usage", "bandwidth", "cluster_usage",
           "prometheus_usage", "PROMETHEUS_QUERIES"]

#: the Prometheus queries of the usage panels: dcgm-exporter's names (which the agents export too) and the agents'
#: interface counters
PROMETHEUS_QUERIES = {
    "gpu_utilization": "avg(DCGM_FI_DEV_GPU_UTIL)",
    "memory_used_mib": "sum(DCGM_FI_DEV_FB_USED)",
    "memory_free_mib": "sum(DCGM_FI_DEV_FB_FREE)",
    # the driver's own part of each GPU (NVML memory v2): in the total, not in what is used
    "memory_reserved_mib": "sum(DCGM_FI_DEV_FB_RESERVED)",
    "rx_bps": "sum(rate(slurm_ext_network_receive_bytes_total[1m]))",
    "tx_bps": "sum(rate(slurm_ext_network_transmit_bytes_total[1m]))",
    "gpus": "count(DCGM_FI_DEV_GPU_UTIL)",
}


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One GPU as the Nodes tab shows it."""

    index: int
    name: str
    uuid: str
    utilization: int | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    temperature: int | None
    #: NVML's error for a GPU that does not answer (lost, reset required), else ""
    error: str
    jobs: list = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """One node's figures from one agent answer."""

    #: the agent's clock when it answered
    time: float
    gpus: int
    #: sum of the GPUs' utilization (percent), over those that report it
    utilization_sum: float
    utilization_gpus: int
    memory_used_mib: float
    memory_total_mib: float
    #: interface -> (rx bytes, tx bytes)
    counters: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Usage:
    """The cluster's figures at one refresh."""

    gpus: int
    #: mean utilization of the GPUs that report it, None when none does
    gpu_utilization: float | None
    memory_used_mib: float
    memory_total_mib: float
    rx_bps: float | None
    tx_bps: float | None


def gpu_rows(answer: HealthAnswer | None) -> list[GpuRow]:
    """Each GPU of an agent's /health answer (none when its monitor wrote no readings)."""
    if answer is None or answer.monitor is None:
        return []
    rows = []
    for gpu in answer.monitor.gpus:
        used, free = gpu.fb_used_mib, gpu.fb_free_mib
        reserved = gpu.fb_reserved_mib or 0.0  # the driver's own part: in the total, not used
        rows.append(GpuRow(gpu.index or 0, gpu.name or "", gpu.uuid or "", gpu.utilization, used,
                           used + free + reserved if used is not None and free is not None else None,
                           gpu.temperature, gpu.error_text or "", list(gpu.jobs)))
    return rows


def node_usage(answer: HealthAnswer | None, rows: list[GpuRow] | None = None) -> NodeUsage | None:
    """A node's figures from its agent's /health answer (`rows`: its gpu_rows, where the caller has them), or None
    when there is none."""
    if answer is None:
        return None
    rows = gpu_rows(answer) if rows is None else rows
    utilization = [r.utilization for r in rows if r.utilization is not None]
    counters = {i.name: (i.rx_bytes, i.tx_bytes) for i in answer.facts.interfaces
                if i.name is not None and i.rx_bytes is not None and i.tx_bytes is not None}
    return NodeUsage(answer.time, len(rows), float(sum(utilization)), len(utilization),
                     sum(r.memory_used_mib or 0.0 for r in rows),
                     sum(r.memory_total_mib or 0.0 for r in rows), counters)


def bandwidth(before: NodeUsage | None, after: NodeUsage | None) -> tuple[float, float] | None:
    """(rx, tx) bytes per second of a node between two answers; None when it cannot be told (one answer, no
    time between them, or every counter reset)."""
    if before is None or after is None or after.time <= before.time:
        return None
    rx = tx = 0.0
    seen = False
    for name, (rx_now, tx_now) in after.counters.items():
        if name not in before.counters:
            continue
        rx_then, tx_then = before.counters[name]
        if rx_now < rx_then or tx_now < tx_then:
            continue  # reset: the interface came back, the node rebooted
        rx, tx, seen = rx + rx_now - rx_then, tx + tx_now - tx_then, True
    elapsed = after.time - before.time
    return (rx / elapsed, tx / elapsed) if seen else None


def cluster_usage(nodes: list[NodeUsage], rates: list[tuple[float, float]]) -> Usage:
    """The cluster's figures: `nodes`' latest readings, `rates` the bandwidth of those that have one."""
    gpus = sum(n.gpus for n in nodes)
    reporting = sum(n.utilization_gpus for n in nodes)
    return Usage(gpus, sum(n.utilization_sum for n in nodes) / reporting if reporting else None,
                 sum(n.memory_used_mib for n in nodes), sum(n.memory_total_mib for n in nodes),
                 sum(r[0] for r in rates) if rates else None, sum(r[1] for r in rates) if rates else None)


def prometheus_usage(url: str, get) -> Usage:
    """The cluster's figures from a Prometheus (PROMETHEUS_QUERIES); `get(url) -> (body or None, why)`.

    Raises:
        ValueError: it does not answer, or not with a PromQL result (the message says which query and why).
    """
    values: dict[str, float | None] = {}
    for key, query in PROMETHEUS_QUERIES.items():
        body, why = get(f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}")
        if body is None:
            raise ValueError(f"Prometheus {url} does not answer: {why}")
        try:
            data = json.loads(body)
            if data.get("status") != "success":
                raise ValueError(data.get("error"))
            result = data["data"]["result"]
            value = float(result[0]["value"][1]) if result else math.nan
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise ValueError(f"Prometheus {url}: no result for {query!r}: {body[:200]}") from None
        values[key] = value if math.isfinite(value) else None  # NaN of an empty average: no figure
    used, free = values["memory_used_mib"] or 0.0, values["memory_free_mib"] or 0.0
    return Usage(int(values["gpus"] or 0), values["gpu_utilization"], used,
                 used + free + (values["memory_reserved_mib"] or 0.0), values["rx_bps"], values["tx_bps"])
