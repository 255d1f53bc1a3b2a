"""The health monitor's readings as Prometheus metric families, for the node agent's /metrics (health.plugin).

Imported at the first scrape, with prometheus_client: an agent never scraped loads neither.
"""

from __future__ import annotations

import json
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .monitor import metrics_path

__all__ = ["families"]

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
_CHECK_STATES = {"pending": -3, "disabled": -1, "not-applicable": -2, "ok": 0, "warning": 1, "critical": 2,
                 "failed": 3}


def families(runtime_dir: str):
    """The health monitor's latest readings (its worker writes them to <runtime_dir>/health.json each poll), with
    dcgm-exporter's names and labels, plus what it lacks: Xids counted by number, each check's state."""
    try:
        data = json.loads(metrics_path(runtime_dir).read_text())
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
                               "(drained), 3 failed (the check itself), -1 disabled, -2 not applicable (no fabric, "
                               "say), -3 pending (no reading judged since the monitor started: not measured)",
                               labels=["check", "hostname"])
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
