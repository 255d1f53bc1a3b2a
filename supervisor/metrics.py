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
        if agent.role == "worker":
            yield from _health_metrics(agent)
            yield from _network_metrics(agent)
        watch = agent.queue_watch
        if watch is not None and watch.size is not None:
            queue = GaugeMetricFamily("slurm_ext_accounting_dbd_queue", "Accounting records slurmctld holds for "
                                      "slurmdbd (sdiag's DBD agent queue size): above 0 while slurmdbd or its "
                                      "database is away", labels=["role"])
            queue.add_metric([agent.role], watch.size)
            yield queue


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


#: dcgm-exporter's names for what the health monitor reads: (name, help, GpuSample field). Gauges all,
#: counters too: dcgm-exporter exposes its counters without the _total suffix prometheus_client would add, and
#: dashboards written for it must work unchanged
_DCGM = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "utilization"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "memory_utilization"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "fb_used_mib"),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "fb_free_mib"),
    ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", "fb_reserved_mib"),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", "memory_temperature"),
    ("DCGM_FI_DEV_SLOWDOWN_TEMP", "GPU slowdown temperature threshold (in C).", "slowdown_temperature"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", "energy_mj"),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock"),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "memory_clock"),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "Current clock event (throttle) reasons, a bitmask.",
     "clocks_event_reasons"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", "pcie_replay"),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe link generation.", "pcie_gen"),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe link width.", "pcie_width"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors",
     "remapped_uncorrectable"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors",
     "remapped_correctable"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", "remap_failure"),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "Whether remapping of rows is pending (a reset applies it)", "remap_pending"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total double-bit volatile ECC errors.", "ecc_uncorrected_volatile"),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total single-bit volatile ECC errors.", "ecc_corrected_volatile"),
    ("DCGM_FI_DEV_PERSISTENCE_MODE", "Persistence mode (1 on).", "persistence"),
    # no DCGM field has these: our own names
    ("slurm_ext_health_retired_pages", "Pages retired, single- and double-bit (GPUs before Ampere).", "retired_pages"),
    ("slurm_ext_health_nvlink_active_links", "NVLinks active.", "nvlink_active"),
    ("slurm_ext_health_nvlink_errors", "NVLink CRC (flit and data) and replay errors, all links, since the driver "
     "loaded.", "nvlink_errors"),
)
_GPU_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname", "hpc_job"]
_CHECK_STATES = {"disabled": -1, "not-applicable": -2, "ok": 0, "warning": 1, "critical": 2, "failed": 3}


def _health_metrics(agent):
    """The health monitor's latest readings (its worker writes them to <runtime_dir>/health.json each poll), with
    dcgm-exporter's names and labels, plus what it lacks: Xids counted by number, each check's state."""
    import json
    from slurm_ext.health import metrics_path
    try:
        data = json.loads(metrics_path(agent.config.supervisor.runtime_dir).read_text())
    except (OSError, ValueError):
        return
    age = time.time() - float(data.get("time", 0))
    fresh = age <= 3 * float(data.get("interval", 10)) + 5
    up = GaugeMetricFamily("slurm_ext_health_monitor_up", "1 while the health monitor's readings are fresh "
                           "(written within three poll intervals)", labels=["hostname"])
    host = data.get("node", "")
    up.add_metric([host], 1 if fresh else 0)
    yield up
    if not fresh:
        return  # a monitor that stopped writing: its last readings would pass for current ones
    yield from _health_states(data, host)
    if time.time() - float(data.get("readings_time", 0)) > 3 * float(data.get("interval", 10)) + 5:
        return  # NVML has not answered for three polls (hung): no GPU readings rather than old ones
    families = {name: GaugeMetricFamily(name, text, labels=_GPU_LABELS) for name, text, _ in _DCGM}
    last = GaugeMetricFamily("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", labels=_GPU_LABELS)
    for row in data.get("gpus") or ():
        gpu = row.get("gpu") or {}
        if not gpu.get("uuid"):
            continue
        device = f"nvidia{gpu.get('minor') if gpu.get('minor', -1) >= 0 else gpu.get('index')}"
        # as dcgm-exporter: one copy of the GPU's series per job holding it, hpc_job empty (no label) when none
        for job in [str(j) for j in row.get("jobs") or ()] or [""]:
            labels = [str(gpu.get("index")), gpu["uuid"], gpu.get("pci_bus_id", ""), device, gpu.get("name", ""), host,
                      job]
            for name, _, key in _DCGM:
                value = row.get(key)
                if value is not None:
                    families[name].add_metric(labels, float(value))
            last.add_metric(labels, float((data.get("last_xid") or {}).get(gpu["uuid"], 0)))
    yield from families.values()
    yield last
    xids = CounterMetricFamily("slurm_ext_health_xid_errors", "Xids seen, by GPU and Xid number (dcgm-exporter "
                               "keeps only the last one); gpu and UUID empty for a bus id no GPU has",
                               labels=["gpu", "UUID", "pci_bus_id", "xid", "hostname"])
    for item in data.get("xid_counts") or ():
        xids.add_metric([str(item.get("gpu", "")), item.get("uuid", ""), item.get("pci_bus_id", ""),
                         str(item.get("xid")), host], item.get("count", 0))
    yield xids


def _health_states(data: dict, host: str):
    """Each check's state and the open findings: served whenever the monitor writes, NVML answering or not."""
    checks = GaugeMetricFamily("slurm_ext_health_check_state", "Each check's state: 0 ok, 1 warning, 2 critical "
                               "(drained), 3 failed (the check itself), -1 disabled, -2 not applicable (no fabric, say)", labels=["check", "hostname"])
    for check, state in (data.get("checks") or {}).items():
        checks.add_metric([check, host], _CHECK_STATES.get(state, 3))
    yield checks
    findings = GaugeMetricFamily("slurm_ext_health_findings", "Open findings by severity",
                                 labels=["severity", "hostname"])
    counts = {"info": 0, "warning": 0, "critical": 0}
    for finding in data.get("findings") or ():
        counts[finding.get("severity", "warning")] = counts.get(finding.get("severity", "warning"), 0) + 1
    for severity, count in counts.items():
        findings.add_metric([severity, host], count)
    yield findings


def exposition_of(agent) -> Callable[[], tuple[bytes, str]]:
    """A function that renders `agent`'s metrics in the text format: (body, content type)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agent))
    return lambda: (generate_latest(registry), CONTENT_TYPE_LATEST)
