"""The health checks' judges, fed literal records: healthy input gives no observation, a fault gives one with
its severity, action and evidence ("actual (expected limit)"; a GPU's: "gpu N <the fault in NVIDIA's words>", what
was expected in its fields, tests/test_health_reasons.py), and odd input (None readings, short windows,
unknown Xids, bus ids no GPU has) is judged without an exception."""

from __future__ import annotations

import dataclasses
import re

import pytest

from slurm_ext import nvml
from slurm_ext.health import xids
from slurm_ext.health.check import View
from slurm_ext.health.checks import REGISTRY
from slurm_ext.health.records import (FsSample, Gpu, GpuSample, KernelHang, LinkChange, NodeSample, Observation,
                                      Snapshot, SXid, Xid)
from slurm_ext.health.settings import ACTIONS, CHECKS, SEVERITIES, HealthSection, XidSection

GPU0 = Gpu(0, "GPU-0a1b2c3d-0000-4000-8000-000000000000", "00000000:17:00.0", 0, "NVIDIA H200")
GPU1 = Gpu(1, "GPU-0a1b2c3d-1111-4000-8000-000000000001", "00000000:2A:00.0", 1, "NVIDIA H200")

#: a busy, healthy H200 as NVML reads it
HEALTHY = dict(utilization=97, memory_utilization=40, fb_used_mib=60000.0, fb_free_mib=80000.0, temperature=61,
               memory_temperature=70, slowdown_temperature=87, memory_max_temperature=95, power_w=640.0,
               energy_mj=10_000_000, sm_clock=1980, memory_clock=3201, clocks_event_reasons=0x0, pcie_replay=0,
               pcie_gen=5, pcie_width=16, pcie_max_gen=5, pcie_max_width=16, remapped_correctable=0,
               remapped_uncorrectable=0, remap_pending=False, remap_failure=False, ecc_uncorrected_volatile=0,
               ecc_corrected_volatile=2, nvlink_active=18, nvlink_errors=0, persistence=True, recovery_action=0)

#: "actual (expected limit)": a parenthesis that says what was expected or the limit ends the evidence, or is
#: followed only by what failed (the nvml check: "...(limit 2): nvmlInit: Unknown Error")
EVIDENCE = re.compile(r"^[^()\s].*\S \((expected|limit)\b[^()]*\)(: \S.*)?$")


def sample(gpu: Gpu = GPU0, **readings) -> GpuSample:
    return GpuSample(gpu, **{**HEALTHY, **readings})


def snap(time: float, *samples: GpuSample, **kw) -> Snapshot:
    return Snapshot(time, samples if samples else (sample(),), **kw)


def series(span: float, step: float, make) -> tuple[Snapshot, ...]:
    """Snapshots every `step` seconds from 0 to `span`; `make(i, time)` gives each one's samples."""
    count = int(span / step) + 1
    return tuple(Snapshot(i * step, tuple(make(i, i * step))) for i in range(count))


def params(check: str, **changes):
    return dataclasses.replace(HealthSection().params(check), **changes)


def polled(check: str, view: View, p=None) -> list[Observation]:
    judge = REGISTRY[check].polled
    assert judge is not None, f"{check} is not a polled check"
    return judge(view, p or params(check))


def event(check: str, record, view: View | None = None, p=None) -> list[Observation]:
    judge = REGISTRY[check].on_event
    assert judge is not None, f"{check} is not an event check"
    return judge(record, view or View(), p or params(check))


#: a GPU's evidence, as the drain reason shows it: the GPU, then the fault (an Xid's: its code first)
GPU_EVIDENCE = re.compile(r"^(-?\d+ )?(gpu \d+ |bus .+ \(no such gpu\) |node |Fatal |Non-fatal |unstated )?\S.*$")


def one(found: list[Observation]) -> Observation:
    assert len(found) == 1, found
    if "expected" in found[0].fields:
        assert GPU_EVIDENCE.match(found[0].evidence), found[0].evidence
        assert "(expected" not in found[0].evidence and "(limit" not in found[0].evidence, found[0].evidence
    else:
        assert EVIDENCE.match(found[0].evidence), found[0].evidence
    assert found[0].severity in SEVERITIES and found[0].action in ACTIONS
    return found[0]


def xid(number: int, bus: str = GPU0.pci_bus_id, time: float = 1000.0, **kw) -> Xid:
    return Xid(number, bus, kw.pop("text", f"NVRM: Xid (PCI:{bus}): {number}, pid=1, name=test"), "kernel", time,
               **kw)


GPUS_VIEW = View(snapshots=(snap(0.0, sample(GPU0), sample(GPU1)),))


# -- the registry and the defaults -------------------------------------------------------

def test_registry_is_settings_checks_in_order():
    assert list(REGISTRY) == list(CHECKS)
    for check_id, check in REGISTRY.items():
        assert check.id == check_id
        assert check.source in ("nvml", "kernel", "netlink", "filesystem", "slurm")
        assert (check.polled is None) != (check.on_event is None), check_id
        if check.on_event is not None:
            assert check.events, check_id


@pytest.mark.parametrize("check", list(CHECKS))
def test_defaults_are_valid(check):
    base = CHECKS[check]
    assert base.severity in SEVERITIES and base.action in ACTIONS
    assert base.doc
    p = HealthSection().params(check)
    assert p.id == check and p.enabled
    assert (p.threshold is None) == (base.threshold is None)
    assert p.interval > 0 and p.quiet >= 0 and p.hold >= 0 and p.window >= 0


def test_catalog_entries_are_valid():
    for number, entry in xids.KNOWN.items():
        assert entry.xid == number
        assert entry.severity in SEVERITIES and entry.action in ACTIONS, entry
        assert not (entry.application and entry.sticky), entry
    for severity, action in xids.RECOVERY_ACTIONS.values():
        assert severity in SEVERITIES and action in ACTIONS


# -- every polled check: healthy literal input gives nothing, the fault one observation ---------------

def _full(span: float, make, step: float = 10.0) -> View:
    return View(snapshots=series(span, step, make))


#: check -> (healthy view, faulty view, severity, action, evidence)
POLLED = {
    "gpu-lost": (
        View(snapshots=(snap(0.0),)),
        View(snapshots=(snap(0.0, GpuSample(GPU0, error=nvml.GPU_IS_LOST, error_text="gpu 0: GPU is lost")),)),
        "critical", "reboot", "gpu 0 fallen off the bus (NVML GPU_IS_LOST)"),
    "gpu-count": (
        View(snapshots=(snap(0.0, sample(GPU0), sample(GPU1), baseline=(GPU0.uuid, GPU1.uuid)),)),
        View(snapshots=(snap(0.0, sample(GPU0), baseline=(GPU0.uuid, GPU1.uuid)),)),
        "critical", "reboot", f"1 gpus, missing {GPU1.uuid} (expected 2)"),
    "fabric": (
        View(snapshots=(snap(0.0, sample(fabric_state=3, fabric_status=0)),)),
        View(snapshots=(snap(0.0, sample(fabric_state=2, fabric_status=0)),)),
        "critical", "reboot", "gpu 0 fabric training in progress"),
    "throttle": (
        _full(600.0, lambda i, t: [sample(clocks_event_reasons=0x4)]),  # software power cap: the limit working
        _full(600.0, lambda i, t: [sample(clocks_event_reasons=0x40 if i >= 3 else 0x0)], step=60.0),  # 8 of 11
        "critical", "failover", "gpu 0 HW Thermal Slowdown 73% of 10m"),
    "temperature": (
        View(snapshots=(snap(0.0, sample(temperature=86, slowdown_temperature=87)),)),
        View(snapshots=(snap(0.0, sample(temperature=88, slowdown_temperature=87)),)),
        "warning", "failover", "gpu 0 thermal slowdown 88C (slowdown at 87C)"),
    "row-remap": (
        View(snapshots=(snap(0.0, sample(remapped_correctable=3)),)),
        View(snapshots=(snap(0.0, sample(remap_pending=True)),)),
        "critical", "reset-gpu", "gpu 0 row remapping pending (a GPU reset applies it)"),
    "ecc": (
        View(snapshots=(snap(0.0, sample(ecc_corrected_volatile=5000)),)),
        View(snapshots=(snap(0.0, sample(ecc_uncorrected_volatile=2)),)),
        "critical", "reset-gpu", "gpu 0 double-bit ECC errors: 2 (volatile)"),
    "retired-pages": (
        View(snapshots=(snap(0.0, sample(retired_pages=59, retired_pending=False)),)),
        View(snapshots=(snap(0.0, sample(retired_pages=60, retired_pending=False)),)),
        "critical", "remove", "gpu 0 60 retired pages"),
    "nvlink": (
        View(snapshots=(snap(0.0, sample(nvlink_active=18)),), nvlink_seen={GPU0.uuid: 18}),
        View(snapshots=(snap(0.0, sample(nvlink_active=16)),), nvlink_seen={GPU0.uuid: 18}),
        "critical", "reboot", "gpu 0 NVLink down: 16 of 18 active"),
    "nvlink-errors": (
        _full(60.0, lambda i, t: [sample(nvlink_errors=int(t * 50))]),  # 50/s: below 100/s
        _full(60.0, lambda i, t: [sample(nvlink_errors=int(t * 200))]),
        "warning", "none", "gpu 0 NVLink errors 200/s over 1m"),
    "pcie-link": (
        View(snapshots=(snap(0.0, sample(pcie_gen=5, pcie_width=16)),)),
        View(snapshots=(snap(0.0, sample(pcie_width=8)),)),
        "warning", "reboot", "gpu 0 PCIe link x8 of x16"),
    "pcie-replay": (
        _full(300.0, lambda i, t: [sample(pcie_replay=i)]),  # 30 in 5 minutes: 6/m, below 8/m
        _full(300.0, lambda i, t: [sample(pcie_replay=int(t / 3))]),  # 100 in 5 minutes
        "warning", "none", "gpu 0 PCIe replays 20/m over 5m"),
    "persistence": (
        View(snapshots=(snap(0.0, sample(persistence=True)),)),
        View(snapshots=(snap(0.0, sample(persistence=False)),)),
        "warning", "none", "gpu 0 persistence mode off"),
    "nvml": (
        View(snapshots=tuple(snap(float(t)) for t in range(5))),
        View(snapshots=tuple(Snapshot(float(t), error=999, error_text="nvmlDeviceGetCount: Unknown Error")
                             for t in range(3))),
        "critical", "reboot", "nvml failed 3 polls in a row (limit 2): nvmlDeviceGetCount: Unknown Error"),
    "link-down": (
        View(interfaces=("ib0",), links={"ib0": LinkChange("ib0", True, 0.0)}),
        View(interfaces=("ib0",), links={"ib0": LinkChange("ib0", False, 0.0)}),
        "critical", "reboot", "ib0 down (expected up)"),
    "link-flap": (
        View(now=1000.0, interfaces=("ib0",), link_changes=(
            LinkChange("ib0", True, 500.0), LinkChange("ib0", False, 600.0), LinkChange("ib0", True, 610.0),
            LinkChange("ib0", False, 700.0), LinkChange("ib0", True, 710.0))),
        View(now=1000.0, interfaces=("ib0",), link_changes=(
            LinkChange("ib0", True, 500.0), LinkChange("ib0", False, 600.0), LinkChange("ib0", True, 610.0),
            LinkChange("ib0", False, 700.0), LinkChange("ib0", True, 710.0), LinkChange("ib0", False, 800.0),
            LinkChange("ib0", True, 810.0))),
        "critical", "reboot", "ib0 went down 3 times in 10m (limit 2)"),
    "filesystem": (
        View(filesystems=(FsSample("/", 2**31, 2**40), FsSample("/tmp", 200 * 2**30, 2**40))),
        View(filesystems=(FsSample("/", 2**29, 2**40), FsSample("/tmp", 200 * 2**30, 2**40))),
        "critical", "none", "/ 512MiB free (limit 1GiB)"),
    "slurmd": (
        View(node=NodeSample("node1", responding=True)),
        View(node=NodeSample("node1", responding=False)),
        "warning", "none", "slurmd of node1 not responding (expected responding)"),
    "foreign-drain": (
        View(node=NodeSample("node1", drained=False)),
        View(node=NodeSample("node1", drained=True, reason="maintenance by ops")),
        "info", "none", "drained by someone else: maintenance by ops (expected not drained)"),
}

EVENTS = [check_id for check_id, check in REGISTRY.items() if check.on_event is not None]


def test_every_polled_check_has_a_case():
    assert set(POLLED) == {check_id for check_id, check in REGISTRY.items() if check.polled is not None}
    assert set(EVENTS) == {"xid", "sxid", "kernel"}


@pytest.mark.parametrize("check", list(POLLED))
def test_healthy_gives_nothing(check):
    healthy = POLLED[check][0]
    assert polled(check, healthy) == []


@pytest.mark.parametrize("check", list(POLLED))
def test_fault_gives_one_observation(check):
    _, faulty, severity, action, evidence = POLLED[check]
    found = one(polled(check, faulty))
    assert found.check == check
    assert (found.severity, found.action, found.evidence) == (severity, action, evidence)
    assert not found.sticky
    if found.gpu is not None:
        assert found.subject == found.gpu.uuid and found.pci_bus_id == found.gpu.pci_bus_id


@pytest.mark.parametrize("check", list(POLLED))
def test_severity_and_action_come_from_params(check):
    _, faulty, *_ = POLLED[check]
    found = one(polled(check, faulty, params(check, severity="info", action="remove")))
    assert found.severity == "info"
    # foreign drains are reported, never acted on, whatever the config says
    assert found.action == ("none" if check == "foreign-drain" else "remove")


@pytest.mark.parametrize("check", list(POLLED))
def test_nothing_read_gives_nothing(check):
    """An empty view, and GPUs whose every reading is None (not supported), are never a fault (an empty view
    is no verdict at all for the checks that need a window or an answer)."""
    assert not polled(check, View())
    unsupported = View(now=600.0, snapshots=series(600.0, 10.0, lambda i, t: [GpuSample(GPU0), GpuSample(GPU1)]),
                       nvlink_seen={GPU0.uuid: 18})
    assert not polled(check, unsupported)


# -- gpu-lost, gpu-count --------------------------------------------------------------------

def test_gpu_lost_reset_required_and_recovery_action():
    view = View(snapshots=(snap(0.0, GpuSample(GPU0, error=nvml.RESET_REQUIRED),
                                sample(GPU1, recovery_action=2)),))
    found = polled("gpu-lost", view)
    assert [(o.subject, o.severity, o.action, o.evidence) for o in found] == [
        (GPU0.uuid, "critical", "reset-gpu", "gpu 0 GPU requires a reset (NVML RESET_REQUIRED)"),
        (GPU1.uuid, "critical", "reboot", "gpu 1 node reboot required (NVML recovery action)")]
    found = one(polled("gpu-lost", View(snapshots=(snap(0.0, sample(recovery_action=1)),))))
    assert (found.action, found.evidence) == ("reset-gpu", "gpu 0 GPU reset required (NVML recovery action)")
    # drain p2p is not a lost GPU; other NVML errors are the nvml check's
    assert polled("gpu-lost", View(snapshots=(snap(0.0, sample(recovery_action=3)),))) == []
    assert polled("gpu-lost", View(snapshots=(snap(0.0, GpuSample(GPU0, error=999)),))) == []


def test_gpu_count_needs_a_baseline_and_an_answer():
    assert polled("gpu-count", View(snapshots=(snap(0.0, sample(GPU0)),))) == []
    failed = Snapshot(0.0, error=999, error_text="nvmlInit failed", baseline=(GPU0.uuid, GPU1.uuid))
    assert polled("gpu-count", View(snapshots=(failed,))) is None  # no verdict: not "all back"
    gone = View(snapshots=(Snapshot(0.0, (), baseline=(GPU0.uuid, GPU1.uuid)),))
    found = one(polled("gpu-count", gone))
    assert found.evidence == f"0 gpus, missing {GPU0.uuid} +1 more (expected 2)"
    assert found.fields["missing"] == [GPU0.uuid, GPU1.uuid]


# -- fabric, temperature, row remap, retired pages, ecc ------------------------------------------

def test_fabric_status_error_and_not_supported():
    found = one(polled("fabric", View(snapshots=(snap(0.0, sample(fabric_state=3, fabric_status=5)),))))
    assert found.evidence == "gpu 0 fabric status NVML error 5"
    assert polled("fabric", View(snapshots=(snap(0.0, sample(fabric_state=None, fabric_status=None)),))) == []


def test_temperature_margin_and_memory():
    view = View(snapshots=(snap(0.0, sample(temperature=83, slowdown_temperature=87)),))
    assert polled("temperature", view) == []
    found = one(polled("temperature", view, params("temperature", threshold=5.0)))
    assert found.evidence == "gpu 0 near thermal slowdown 83C (slowdown at 87C)"
    found = one(polled("temperature", View(snapshots=(snap(0.0, sample(memory_temperature=95)),))))
    assert found.evidence == "gpu 0 memory over its max: 95C (max 95C)"
    no_limits = View(snapshots=(snap(0.0, sample(temperature=120, slowdown_temperature=None, memory_temperature=120,
                                                 memory_max_temperature=None)),))
    assert polled("temperature", no_limits) == []


def test_row_remap_failure_is_remove():
    found = one(polled("row-remap", View(snapshots=(snap(0.0, sample(remap_failure=True, remap_pending=True,
                                                                        remapped_uncorrectable=3)),))))
    assert (found.severity, found.action) == ("critical", "remove")
    assert found.evidence == "gpu 0 row remapping failed, 3 uncorrectable rows"
    # the count not read: the evidence says nothing about it rather than "None"
    found = one(polled("row-remap", View(snapshots=(snap(0.0, GpuSample(GPU0, remap_failure=True)),))))
    assert "None" not in found.evidence and found.action == "remove"


def test_retired_pages_pending_is_reset():
    found = one(polled("retired-pages", View(snapshots=(snap(0.0, sample(retired_pages=2, retired_pending=True)),))))
    assert (found.action, found.evidence) == ("reset-gpu", "gpu 0 pending retirement (a GPU reset applies it)")


def test_ecc_threshold():
    view = View(snapshots=(snap(0.0, sample(ecc_uncorrected_volatile=4)),))
    assert polled("ecc", view, params("ecc", threshold=5.0)) == []
    assert one(polled("ecc", view, params("ecc", threshold=4.0))).evidence == \
        "gpu 0 double-bit ECC errors: 4 (volatile)"


# -- throttle: share of a full window ------------------------------------------------------------

def test_throttle_no_verdict_before_a_full_window():
    # throttled all the time, but watched for 5 minutes of a 10-minute window
    view = View(snapshots=series(300.0, 10.0, lambda i, t: [sample(clocks_event_reasons=0x8)]))
    assert polled("throttle", view) is None
    assert polled("throttle", View(snapshots=(snap(0.0, sample(clocks_event_reasons=0x8)),))) is None


def test_throttle_single_sample_is_nothing():
    view = _full(600.0, lambda i, t: [sample(clocks_event_reasons=0x80 if i == 5 else 0x0)])
    assert polled("throttle", view) == []


def test_throttle_over_the_window_names_the_reasons():
    view = _full(600.0, lambda i, t: [sample(GPU0, clocks_event_reasons=(0x8 if i % 2 else 0x80) | 0x4),
                                      sample(GPU1, clocks_event_reasons=0x4)])
    found = one(polled("throttle", view))
    assert found.gpu == GPU0
    assert found.evidence == "gpu 0 HW Slowdown, HW Power Brake Slowdown 100% of 10m"


def test_throttle_judges_only_the_window_and_skips_unsupported_readings():
    # throttled for its first 10 minutes, then 10 minutes clean: the last window is clean
    view = View(snapshots=series(1200.0, 10.0, lambda i, t: [sample(clocks_event_reasons=0x20 if t < 600 else 0)]))
    assert polled("throttle", view) == []
    # readings missing on some polls: the share is of the polls that read it
    view = _full(600.0, lambda i, t: [sample(clocks_event_reasons=None if i % 2 else 0x20)])
    assert one(polled("throttle", view)).evidence == "gpu 0 SW Thermal Slowdown 100% of 10m"


def test_throttle_shorter_window_and_threshold():
    view = _full(120.0, lambda i, t: [sample(clocks_event_reasons=0x40 if i < 6 else 0)])  # 6 of 13
    p = params("throttle", window=120.0, threshold=0.4)
    assert one(polled("throttle", view, p)).evidence == "gpu 0 HW Thermal Slowdown 46% of 2m"
    assert polled("throttle", view, params("throttle", window=120.0, threshold=0.5)) == []


def test_throttle_zero_threshold_needs_a_throttled_sample():
    """threshold "0%" (any throttling) must not flag a GPU that never throttled."""
    clean = _full(600.0, lambda i, t: [sample(clocks_event_reasons=0)])
    assert polled("throttle", clean, params("throttle", threshold=0.0)) == []
    once = _full(600.0, lambda i, t: [sample(clocks_event_reasons=0x8 if i == 0 else 0)])
    assert one(polled("throttle", once, params("throttle", threshold=0.0))).evidence == \
        "gpu 0 HW Slowdown 2% of 10m"


# -- nvlink, nvlink errors, pcie ----------------------------------------------------------------

def test_nvlink_threshold_zero_uses_what_the_gpu_has_shown():
    view = View(snapshots=(snap(0.0, sample(GPU0, nvlink_active=12), sample(GPU1, nvlink_active=12)),),
                nvlink_seen={GPU0.uuid: 12, GPU1.uuid: 18})
    found = one(polled("nvlink", view))  # an H100 PCIe with 12 links is not a fault; the one that had 18 is
    assert found.gpu == GPU1 and found.evidence == "gpu 1 NVLink down: 12 of 18 active"
    # never seen (the monitor just started): nothing to compare with
    assert polled("nvlink", dataclasses.replace(view, nvlink_seen={})) == []


def test_nvlink_fixed_threshold():
    view = View(snapshots=(snap(0.0, sample(nvlink_active=17)),), nvlink_seen={GPU0.uuid: 17})
    assert one(polled("nvlink", view, params("nvlink", threshold=18.0))).evidence == \
        "gpu 0 NVLink down: 17 of 18 active"
    assert polled("nvlink", dataclasses.replace(view, snapshots=(snap(0.0, sample(nvlink_active=18)),)),
                  params("nvlink", threshold=18.0)) == []


@pytest.mark.parametrize("check,field", [("nvlink-errors", "nvlink_errors"), ("pcie-replay", "pcie_replay")])
def test_rates_no_verdict_before_a_full_window(check, field):
    window = params(check).window
    short = View(snapshots=series(window / 2, 10.0, lambda i, t: [sample(**{field: int(t * 10_000)})]))
    assert polled(check, short) is None
    assert polled(check, View(snapshots=(snap(0.0, sample(**{field: 10**9})),))) is None


@pytest.mark.parametrize("check,field", [("nvlink-errors", "nvlink_errors"), ("pcie-replay", "pcie_replay")])
def test_rates_counter_reset_and_unsupported(check, field):
    window = params(check).window
    reset = View(snapshots=series(window, 10.0, lambda i, t: [sample(**{field: 10**9 if i == 0 else 5})]))
    assert polled(check, reset) == []
    unsupported = View(snapshots=series(window, 10.0, lambda i, t: [sample(**{field: None})]))
    assert polled(check, unsupported) == []


def test_rates_judge_only_the_last_window():
    # a burst of 12000 errors in the first minute, then none: the last minute is clean
    view = View(snapshots=series(120.0, 10.0, lambda i, t: [sample(nvlink_errors=min(int(t), 60) * 200)]))
    assert polled("nvlink-errors", view) == []
    p = params("pcie-replay", threshold=1.0, window=60.0)  # "1/s"
    view = _full(60.0, lambda i, t: [sample(pcie_replay=int(t * 2))])
    assert one(polled("pcie-replay", view, p)).evidence == "gpu 0 PCIe replays 2/s over 1m"


def test_pcie_generation_only_while_busy():
    busy = View(snapshots=(snap(0.0, sample(pcie_gen=4, clocks_event_reasons=0x0)),))
    assert one(polled("pcie-link", busy)).evidence == "gpu 0 PCIe link gen4 of gen5 while busy"
    idle = View(snapshots=(snap(0.0, sample(pcie_gen=1, clocks_event_reasons=0x1)),))
    assert polled("pcie-link", idle) == []
    idle_capped = View(snapshots=(snap(0.0, sample(pcie_gen=1, clocks_event_reasons=0x1 | 0x4)),))
    assert polled("pcie-link", idle_capped) == []
    unknown = View(snapshots=(snap(0.0, sample(pcie_gen=1, clocks_event_reasons=None)),))
    assert polled("pcie-link", unknown) == []
    # width below the maximum is wrong idle or not
    narrow_idle = View(snapshots=(snap(0.0, sample(pcie_width=8, pcie_gen=1, clocks_event_reasons=0x1)),))
    assert one(polled("pcie-link", narrow_idle)).evidence == "gpu 0 PCIe link x8 of x16"
    no_max = View(snapshots=(snap(0.0, sample(pcie_width=8, pcie_max_width=None, pcie_gen=3, pcie_max_gen=None)),))
    assert polled("pcie-link", no_max) == []


def test_persistence_unsupported_is_nothing():
    assert polled("persistence", View(snapshots=(snap(0.0, sample(persistence=None)),))) == []


# -- nvml failing -------------------------------------------------------------------------------

def _failed(t: float) -> Snapshot:
    return Snapshot(t, error=999, error_text="nvmlInit: Unknown Error")


def test_nvml_needs_threshold_consecutive_failures():
    ok = snap(0.0)
    assert polled("nvml", View(snapshots=(ok, _failed(1), _failed(2)))) == []
    assert polled("nvml", View(snapshots=(_failed(0), _failed(1), ok))) == []
    assert polled("nvml", View(snapshots=(_failed(0), ok, _failed(2), _failed(3)))) == []
    assert one(polled("nvml", View(snapshots=(ok, _failed(1), _failed(2), _failed(3))))).severity == "critical"
    assert polled("nvml", View(snapshots=(_failed(0), _failed(1)))) == []
    assert one(polled("nvml", View(snapshots=(_failed(0), _failed(1))), params("nvml", threshold=2.0)))


def test_nvml_gpu_read_failures_count_lost_gpus_do_not():
    failing = tuple(Snapshot(float(t), (GpuSample(GPU0, error=999, error_text="gpu 0: Timeout"), sample(GPU1)))
                    for t in range(3))
    found = one(polled("nvml", View(snapshots=failing)))
    assert found.evidence == "nvml failed 3 polls in a row (limit 2): gpu 0: Timeout"
    lost = tuple(Snapshot(float(t), (GpuSample(GPU0, error=nvml.GPU_IS_LOST), sample(GPU1))) for t in range(3))
    assert polled("nvml", View(snapshots=lost)) == []


# -- network links --------------------------------------------------------------------------------

def test_link_down_missing_and_unwatched():
    view = View(interfaces=("ib0", "ib1", "ib2"),
                links={"ib0": LinkChange("ib0", True, 0.0), "ib1": LinkChange("ib1", False, 0.0, exists=False),
                       "eth0": LinkChange("eth0", False, 0.0)})
    found = polled("link-down", view)
    assert [(o.subject, o.evidence) for o in found] == [("ib1", "ib1 missing (expected up)"),
                                                         ("ib2", "ib2 missing (expected up)")]
    assert all(o.fields == {"interface": o.subject} for o in found)
    assert polled("link-down", View(links={"eth0": LinkChange("eth0", False, 0.0)})) == []


def test_link_flap_counts_downs_within_the_window():
    old = (LinkChange("ib0", False, 100.0), LinkChange("ib0", True, 110.0),  # outside the window
           LinkChange("ib0", False, 200.0), LinkChange("ib0", True, 210.0))
    recent = (LinkChange("ib0", False, 900.0), LinkChange("ib0", True, 905.0))
    view = View(now=1000.0, interfaces=("ib0",), link_changes=old + recent)
    assert polled("link-flap", view) == []
    # down twice in a row is one flap; another interface flapping is counted for itself
    view = View(now=1000.0, interfaces=("ib0", "ib1"), link_changes=(
        LinkChange("ib0", False, 500.0), LinkChange("ib0", False, 510.0), LinkChange("ib0", True, 520.0),
        LinkChange("ib1", False, 530.0), LinkChange("ib1", True, 540.0),
        LinkChange("ib0", False, 600.0), LinkChange("ib0", True, 610.0),
        LinkChange("ib1", False, 630.0), LinkChange("ib1", True, 640.0),
        LinkChange("ib0", False, 700.0)))
    found = one(polled("link-flap", view, params("link-flap", threshold=3.0)))
    assert (found.subject, found.evidence) == ("ib0", "ib0 went down 3 times in 10m (limit 2)")
    both = polled("link-flap", view, params("link-flap", threshold=2.0))
    assert [o.subject for o in both] == ["ib0", "ib1"]


def test_link_flap_down_at_the_window_edge_is_not_a_new_flap():
    # down before the window began and still down: no down within the window
    view = View(now=1000.0, interfaces=("ib0",), link_changes=(
        LinkChange("ib0", False, 300.0), LinkChange("ib0", False, 500.0)))
    assert polled("link-flap", view, params("link-flap", threshold=1.0)) == []


# -- file systems, slurm --------------------------------------------------------------------------

def test_filesystem_read_only_unreadable_and_relative():
    view = View(filesystems=(FsSample("/", 2**31, 2**40, read_only=True),
                             FsSample("/scratch", error="Permission denied"),
                             FsSample("/tmp", None, None)))
    found = polled("filesystem", view)
    assert [(o.subject, o.severity, o.action, o.evidence) for o in found] == [
        ("/", "critical", "none", "/ read-only (expected writable)"),
        ("/scratch", "critical", "none", "/scratch unreadable: Permission denied (expected readable)")]
    relative = params("filesystem", threshold=0.05, relative=True)
    assert polled("filesystem", View(filesystems=(FsSample("/tmp", 60 * 2**30, 1000 * 2**30),)), relative) == []
    found = one(polled("filesystem", View(filesystems=(FsSample("/tmp", 40 * 2**30, 1000 * 2**30),)), relative))
    assert found.evidence == "/tmp 40GiB free (limit 50GiB)"
    assert found.fields == {"path": "/tmp"}


def test_slurmd_and_foreign_drain_skip_an_unanswered_slurm():
    unanswered = View(node=NodeSample("node1", responding=False, drained=True, reason="x",
                                      error="scontrol timed out"))
    assert polled("slurmd", unanswered) is None and polled("foreign-drain", unanswered) is None
    assert polled("slurmd", View()) is None and polled("foreign-drain", View()) is None


def test_foreign_drain_not_for_our_own_drain():
    from slurm_ext.slurm import is_our_reason
    reason = "slurm-ext: xid 79 gpu 0 GPU_HAS_FALLEN_OFF_THE_BUS (expected none) action=reboot"
    assert is_our_reason(reason)
    assert polled("foreign-drain", View(node=NodeSample("node1", drained=True, reason=reason, ours=True))) == []
    found = one(polled("foreign-drain", View(node=NodeSample("node1", drained=True, reason=""))))
    assert found.evidence == "drained by someone else: no reason (expected not drained)"
    assert (found.subject, found.fields) == ("node", {"reason": ""})


# -- xid ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("number", [8, 13, 31, 32, 69, 94])
def test_application_xids_are_warnings(number):
    found = one(event("xid", xid(number), GPUS_VIEW))
    assert (found.severity, found.action, found.sticky) == ("warning", "restart-job", False)
    assert found.subject == f"{GPU0.uuid}/xid{number}" and found.gpu == GPU0
    assert found.evidence == f"{number} gpu 0 {xids.short_meaning(xids.KNOWN[number])}"
    assert found.fields["repeats"] == 1 and found.fields["xid"] == number
    assert found.fields["bucket"] == "RESTART_APP"


@pytest.mark.parametrize("number,severity", [(43, "info"), (38, "info"), (121, "info"), (45, "warning")])
def test_xids_nvidia_says_to_ignore_are_no_action(number, severity):
    """43 (the application's fault, the GPU healthy), 38 (firmware watchdog) and 121 (corrected C2C errors): NVIDIA
    says IGNORE; 45 follows the Xid it comes with. None escalates, however often it comes."""
    recent = tuple(xid(number, time=float(t * 100), pid=t) for t in range(10))
    found = one(event("xid", xid(number, time=1000.0, pid=99), dataclasses.replace(GPUS_VIEW, recent=recent)))
    assert (found.severity, found.action, found.sticky) == (severity, "none", False)
    assert found.evidence == f"{number} gpu 0 {xids.short_meaning(xids.KNOWN[number])}"


@pytest.mark.parametrize("number", [13, 31])
def test_application_xid_repeating_across_faults_on_one_gpu_asks_for_diagnostics_without_a_drain(number):
    recent = (xid(number, time=100.0, pid=1), xid(number, time=2000.0, pid=2))
    found = one(event("xid", xid(number, time=3000.0, pid=3), dataclasses.replace(GPUS_VIEW, recent=recent)))
    assert (found.severity, found.action, found.sticky) == ("warning", "reset-gpu", False)
    assert found.fields["repeats"] == 3
    assert found.evidence.startswith(f"{number} gpu 0 {xids.short_meaning(xids.KNOWN[number])}, 3 faults in 1h: "
                                     "run DCGM diagnostics")
    assert found.evidence.endswith(f"(NVIDIA WORKFLOW_XID_{number})")
    # the second is still a plain warning
    found = one(event("xid", xid(number, time=3000.0, pid=3), dataclasses.replace(GPUS_VIEW, recent=recent[1:])))
    assert (found.severity, found.action, found.fields["repeats"]) == ("warning", "restart-job", 2)


def test_a_burst_of_lines_from_one_process_is_one_fault():
    """A crash prints a burst (16 Xid 13 lines in 2 ms from one process in a real log): one fault, a warning."""
    burst = tuple(xid(13, time=1000.0 + i * 0.0001, pid=4242) for i in range(15))
    found = one(event("xid", xid(13, time=1000.0016, pid=4242), dataclasses.replace(GPUS_VIEW, recent=burst)))
    assert (found.severity, found.action, found.fields["repeats"]) == ("warning", "restart-job", 1)
    # the driver's '<unknown>' pid: the lines of one burst are still one fault
    burst = tuple(xid(13, time=1000.0 + i * 0.0001) for i in range(15))
    found = one(event("xid", xid(13, time=1000.0016), dataclasses.replace(GPUS_VIEW, recent=burst)))
    assert found.fields["repeats"] == 1
    # one process's lines past the burst are still its one fault; another process's are another
    late = (*burst, xid(13, time=1500.0, pid=4242))
    assert one(event("xid", xid(13, time=1600.0, pid=4242), dataclasses.replace(GPUS_VIEW, recent=late))
               ).fields["repeats"] == 2  # the burst without a pid, then pid 4242's
    assert one(event("xid", xid(13, time=1600.0, pid=7), dataclasses.replace(GPUS_VIEW, recent=late))
               ).fields["repeats"] == 3


@pytest.mark.parametrize("times,pids,faults", [
    ([0.0], [None], 1),
    ([0.0, 0.001, 4.9], [None, None, None], 1),
    ([0.0, 5.5], [None, None], 2),
    ([0.0, 2.5, 4.5, 6.0, 9.0], [None] * 5, 2),  # a burst is counted from its first line, not chained
    ([0.0, 100.0, 200.0], [1, 1, 1], 1),
    ([0.0, 100.0, 200.0], [1, 2, 3], 3),
    ([200.0, 0.0, 100.0], [3, 1, 2], 3),  # order does not matter
    ([], [], 0),
])
def test_count_faults(times, pids, faults):
    from slurm_ext.health.checks.xid import count_faults
    assert count_faults([xid(13, time=t, pid=p) for t, p in zip(times, pids)]) == faults


def test_application_xid_repeats_count_only_the_same_gpu_xid_and_window():
    others = (xid(13, GPU1.pci_bus_id, time=2900.0, pid=1), xid(13, GPU1.pci_bus_id, time=2950.0, pid=2),  # GPU 1
              xid(31, time=2960.0, pid=3), xid(31, time=2970.0, pid=4),  # another Xid
              xid(13, time=100.0, pid=5), SXid(22013, "00000000:0A:00.0", False, "sxid", 2980.0))  # too old
    found = one(event("xid", xid(13, time=4000.0, pid=6), dataclasses.replace(GPUS_VIEW, recent=others)))
    assert (found.severity, found.fields["repeats"]) == ("warning", 1)
    # a shorter threshold and window from the config
    p = params("xid", threshold=2.0, window=60.0)
    near = (xid(13, time=3950.0, pid=7),)
    found = one(event("xid", xid(13, time=4000.0, pid=8), dataclasses.replace(GPUS_VIEW, recent=near), p))
    assert (found.severity, found.action) == ("warning", "reset-gpu")
    assert "2 faults in 1m:" in found.evidence and found.fields["expected"] == "at most 1 faults in 1m"


def test_nvml_event_xids_match_their_gpu_by_uuid():
    nvml_xid = Xid(31, "", "NVML event: Xid 31", "nvml", 3000.0, uuid=GPU1.uuid)
    recent = (Xid(31, "", "NVML event: Xid 31", "nvml", 2000.0, uuid=GPU1.uuid),
              xid(31, GPU1.pci_bus_id, time=2500.0))  # the kernel's line names the bus: the same GPU
    found = one(event("xid", nvml_xid, dataclasses.replace(GPUS_VIEW, recent=recent)))
    assert found.gpu == GPU1 and found.pci_bus_id == GPU1.pci_bus_id
    assert found.subject == f"{GPU1.uuid}/xid31" and found.fields["repeats"] == 3
    assert (found.severity, found.action) == ("warning", "reset-gpu")
    assert found.fields["source"] == "nvml"


def test_xid_79_is_critical_reboot_sticky():
    found = one(event("xid", xid(79), GPUS_VIEW))
    assert (found.severity, found.action, found.sticky) == ("critical", "reboot", True)
    assert found.evidence == "79 gpu 0 GPU has fallen off the bus"
    assert found.detail.startswith("NVRM: Xid")
    assert found.fields["bucket"] == "RESTART_BM"


@pytest.mark.parametrize("number", [46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158])
def test_xids_nvidia_resolves_by_a_gpu_reset_are_critical_reset_gpu(number):
    found = one(event("xid", xid(number), GPUS_VIEW))
    assert (found.severity, found.action, found.sticky) == ("critical", "reset-gpu", True)
    assert found.fields["bucket"] == "RESET_GPU"


def test_hardware_xid_does_not_escalate_by_repeats():
    recent = tuple(xid(48, time=float(t), pid=t) for t in range(10))
    found = one(event("xid", xid(48, time=20.0), dataclasses.replace(GPUS_VIEW, recent=recent)))
    assert (found.severity, found.action) == ("critical", "reset-gpu")
    assert found.evidence == "48 gpu 0 double-bit ECC error"


@pytest.mark.parametrize("number,unit,fatal,intrinfo,status,severity,action", [
    (149, "NETIR_LINK_EVT", True, 0x025525C6, 0x0, "critical", "reset-gpu"),  # link down, peer device: reset
    (149, "NETIR_LINK_EVT", True, 0x026005C6, 0x0, "info", "none"),  # reason 0b100110: IGNORE
    (149, "NETIR_LINK_DOWN", True, 0x028005C6, 0x0, "info", "none"),  # reason 0b101000: IGNORE
    (149, "NETIR", True, 0x000FE406, 0x0, "critical", "reset-gpu"),
    (149, "NETIR_BER_EVENT", False, 0x00086226, 0x1, "info", "none"),
    (144, "SAW_MVB", False, 0x1, 0x8, "info", "none"),
    (144, "SAW_MVB", True, 0x1, 0x2, "critical", "reset-gpu"),
    (145, "RLW_REMAP", False, 0x40820C2, 0x4, "warning", "restart-job"),  # XID_154_EVAL
    (145, "RLW_SRC_TRACK", False, 0x040988E2, 0x8, "warning", "restart-job"),
    (145, "RLW_SRC_TRACK", False, 0x040988E2, 0x2, "info", "none"),
    (145, "RLW_RXPIPE", False, 0x0409A0C2, 0x8, "info", "none"),
    (146, "TLW_RX_PIPE0", True, 0x0A, 0x4, "critical", "reset-gpu"),
    (146, "TLW_RX_PIPE0", False, 0x0A, 0x2, "info", "none"),
    (150, "MSE_WATCHDOG", True, 0x0, 0x0, "critical", "reset-gpu"),
    (144, "", None, None, None, "warning", "none"),  # the line does not say: the Xid 154 with it will
])
def test_nvlink5_follows_nvidia_decode(number, unit, fatal, intrinfo, status, severity, action):
    record = xid(number, fatal=fatal, unit=unit, intrinfo=intrinfo, error_status=status)
    found = one(event("xid", record, GPUS_VIEW))
    assert (found.severity, found.action, found.sticky) == (severity, action, severity == "critical")
    assert found.evidence == f"{number} gpu 0 {xids.short_meaning(xids.KNOWN[number])}"


@pytest.mark.parametrize("recovery,severity,action", [("GPU Reset Required", "critical", "reset-gpu"),
                                                      ("Node Reboot Required", "critical", "reboot"),
                                                      ("Drain and Reset", "critical", "reset-gpu"),
                                                      ("None", "info", "none"),
                                                      ("", "info", "none")])
def test_xid_154_acts_on_the_stated_recovery(recovery, severity, action):
    found = one(event("xid", xid(154, recovery=recovery), GPUS_VIEW))
    assert (found.severity, found.action, found.sticky) == (severity, action, severity == "critical")
    assert found.evidence == f"154 gpu 0 {xids.short_meaning(xids.KNOWN[154])}"
    if recovery:
        assert found.fields["meaning"] == recovery.lower()


def test_xid_154_unknown_recovery_words_are_a_warning():
    found = one(event("xid", xid(154, recovery="Recover IMEX Domain"), GPUS_VIEW))
    assert (found.severity, found.action) == ("warning", "none")


@pytest.mark.parametrize("number", [999, 0, 1, 173, 10**6])
def test_unknown_xid_is_a_warning_without_action(number):
    found = one(event("xid", xid(number), GPUS_VIEW))
    assert (found.severity, found.action, found.sticky) == ("warning", "none", False)
    assert found.evidence == f"{number} gpu 0 not in this catalog"
    assert found.fields["bucket"] == "UNKNOWN"
    assert found.subject == f"{GPU0.uuid}/xid-other"  # every number no catalog has: one finding per GPU


def test_catalog_follows_nvidia_where_the_old_one_did_not():
    """Issue 26: the catalog against NVIDIA's table (46, 110, 155, 156, 158 reset; 109 reset, not the application's;
    38, 121 ignore; 119/120 reset; 43 ignore; NVLink5 Fatal reset)."""
    for number in (46, 109, 110, 119, 120, 155, 156, 158):
        assert (xids.KNOWN[number].bucket, xids.KNOWN[number].action) == ("RESET_GPU", "reset-gpu"), number
    for number in (38, 43, 121):
        entry = xids.KNOWN[number]
        assert (entry.bucket, entry.severity, entry.action, entry.sticky) == ("IGNORE", "info", "none", False)
    assert not xids.KNOWN[109].application
    assert xids.CATALOG_REVISION.startswith("NVIDIA Xid Catalog")


def test_xids_of_bus_ids_no_gpu_has_are_one_node_finding():
    found = one(event("xid", xid(79, "00000000:99:00.0"), GPUS_VIEW))
    assert found.gpu is None
    assert found.subject == "node/xid"
    assert found.pci_bus_id == "00000000:99:00.0"
    assert found.evidence == "79 bus 00000000:99:00.0 (no such gpu) GPU has fallen off the bus"
    assert (found.severity, found.action) == ("critical", "reboot")
    # every other bus no GPU has, and every Xid number: the same finding (the bookkeeping keeps its worst)
    for bus, number in (("00000000:9A:00.0", 13), ("0000ABCD:17:00.0", 48), ("00000001:17:00.0", 999)):
        assert one(event("xid", xid(number, bus), GPUS_VIEW)).subject == "node/xid"
    # no GPUs read at all (NVML down or not polled yet), and a fallen-off line that names no GPU
    assert one(event("xid", xid(79), View())).subject == "node/xid"
    nameless = one(event("xid", Xid(79, "", "NVRM: fallen off the bus", "kernel", 0.0, no_xid_line=True)))
    assert (nameless.subject, nameless.evidence) == ("node/xid", "79 node GPU has fallen off the bus")


def test_a_gpu_has_findings_for_a_bounded_number_of_xids_within_the_window():
    from slurm_ext.health.checks.xid import MAX_XIDS_PER_GPU
    numbers = sorted(n for n in xids.KNOWN if n not in (144, 145, 146, 147, 148, 149, 150, 154))
    recent = tuple(xid(n, time=float(i)) for i, n in enumerate(numbers[:MAX_XIDS_PER_GPU]))
    view = dataclasses.replace(GPUS_VIEW, recent=recent)
    extra = numbers[MAX_XIDS_PER_GPU]
    assert one(event("xid", xid(extra, time=100.0), view)).subject == f"{GPU0.uuid}/xid-other"
    assert one(event("xid", xid(numbers[0], time=100.0), view)).subject == f"{GPU0.uuid}/xid{numbers[0]}"
    # another GPU has its own; past the window the first ones are forgotten
    assert one(event("xid", xid(extra, GPU1.pci_bus_id, time=100.0), view)).subject == f"{GPU1.uuid}/xid{extra}"
    assert one(event("xid", xid(extra, time=100.0 + 3600.0 + MAX_XIDS_PER_GPU), view)).subject == \
        f"{GPU0.uuid}/xid{extra}"


def test_mig_and_pid_fields_reach_the_finding():
    found = one(event("xid", xid(94, pid=7194, gpu_instance=5, compute_instance=2), GPUS_VIEW))
    assert (found.fields["pid"], found.fields["gpu_instance"], found.fields["compute_instance"]) == (7194, 5, 2)
    assert "unit" not in one(event("xid", xid(94), GPUS_VIEW)).fields


def test_xid_gpu_is_found_in_the_latest_snapshot_with_gpus():
    view = View(snapshots=(snap(0.0, sample(GPU0)), Snapshot(10.0, error=999, error_text="nvml down")))
    assert one(event("xid", xid(79), view)).gpu == GPU0


def test_xid_overrides():
    view = dataclasses.replace(GPUS_VIEW, xid_overrides={"13": XidSection(severity="critical", action="reset-gpu"),
                                                         "79": XidSection(severity="warning", action="none"),
                                                         "48": XidSection(sticky=False),
                                                         "999": XidSection(action="reboot")})
    found = one(event("xid", xid(13), view))
    assert (found.severity, found.action, found.sticky) == ("critical", "reset-gpu", True)
    found = one(event("xid", xid(79), view))
    assert (found.severity, found.action, found.sticky) == ("warning", "none", False)
    found = one(event("xid", xid(48), view))
    assert (found.severity, found.action, found.sticky) == ("critical", "reset-gpu", False)
    found = one(event("xid", xid(999), view))
    assert (found.severity, found.action) == ("warning", "reboot")
    # an override for another Xid changes nothing
    found = one(event("xid", xid(31), view))
    assert (found.severity, found.action) == ("warning", "restart-job")


def test_xid_override_applies_over_escalation():
    view = dataclasses.replace(GPUS_VIEW, recent=(xid(13, time=1.0, pid=1), xid(13, time=20.0, pid=2)),
                               xid_overrides={"13": XidSection(severity="critical", action="reboot")})
    found = one(event("xid", xid(13, time=40.0, pid=3), view))
    assert (found.severity, found.action, found.sticky) == ("critical", "reboot", True)
    assert "3 faults in 1h" in found.evidence


def test_xid_judge_takes_odd_records():
    for record in (Xid(-1, "", "", "kernel", 0.0), Xid(13, "not a bus", "garbage", "kernel", -5.0),
                   Xid(150, GPU0.pci_bus_id, "", "kernel", 0.0, fatal=True, recovery="???"),
                   Xid(149, GPU0.pci_bus_id, "", "kernel", 0.0, fatal=True, unit="", intrinfo=None)):
        found = one(event("xid", record, GPUS_VIEW))
        assert found.check == "xid"


# -- sxid, kernel ---------------------------------------------------------------------------------

def test_sxid_fatal_and_nonfatal():
    fatal = one(event("sxid", SXid(24007, "00000000:0A:00.0", True, "SXid ... Fatal", 5.0)))
    assert (fatal.severity, fatal.action, fatal.sticky) == ("critical", "reboot", True)
    assert fatal.subject == "00000000:0A:00.0/sxid24007"
    assert fatal.evidence == "24007 Fatal nvswitch 00000000:0A:00.0"
    assert fatal.fields == {"sxid": 24007, "name": "sourcetrack timeout error", "class": "fatal", "expected": "none"}
    nonfatal = one(event("sxid", SXid(12028, "00000000:0A:00.0", False, "SXid ... Non-fatal", 5.0)))
    assert (nonfatal.severity, nonfatal.action, nonfatal.sticky) == ("warning", "none", False)
    # the guide: no impact (single-bit ECC, 22013)
    harmless = one(event("sxid", SXid(22013, "00000000:0A:00.0", False, "SXid ... Non-fatal", 5.0)))
    assert (harmless.severity, harmless.action) == ("info", "none")
    assert event("sxid", SXid(1, "", False, "", 0.0))[0].subject == "nvswitch/sxid1"


def test_sxid_without_severity_and_always_fatal_ones():
    soe = one(event("sxid", SXid(26006, "00000004:00:00.0", None, "SXid ... SOE HALTED", 5.0)))
    assert (soe.severity, soe.action) == ("warning", "none")
    assert soe.evidence == "26006 unstated nvswitch 00000004:00:00.0"
    always = one(event("sxid", SXid(22003, "00000000:0A:00.0", None, "SXid ... Minion halt", 5.0)))
    assert (always.severity, always.action, always.sticky) == ("critical", "reboot", True)
    assert one(event("sxid", SXid(23001, "00000000:0A:00.0", False, "", 5.0))).severity == "critical"


def test_sxids_are_bounded_per_switch_and_in_switches():
    from slurm_ext.health.checks.sxid import MAX_SWITCHES, MAX_SXIDS_PER_SWITCH
    bus = "00000000:0A:00.0"
    numbers = sorted(xids.SXIDS)[:MAX_SXIDS_PER_SWITCH + 1]
    view = View(recent=tuple(SXid(n, bus, False, "", float(i)) for i, n in enumerate(numbers[:-1])))
    assert one(event("sxid", SXid(numbers[-1], bus, False, "", 50.0), view)).subject == f"{bus}/sxid-other"
    assert one(event("sxid", SXid(numbers[0], bus, False, "", 50.0), view)).subject == f"{bus}/sxid{numbers[0]}"
    switches = [f"0000{i:04X}:0A:00.0" for i in range(MAX_SWITCHES + 1)]
    view = View(recent=tuple(SXid(20034, b, True, "", 1.0) for b in switches[:-1]))
    assert one(event("sxid", SXid(20034, switches[-1], True, "", 2.0), view)).subject == "nvswitch/sxid"


def test_kernel_soft_lockup_is_critical_at_once():
    line = "watchdog: BUG: soft lockup - CPU#3 stuck for 23s! [kworker:12]"
    found = one(event("kernel", KernelHang("soft-lockup", line, 10.0)))
    assert (found.subject, found.severity, found.action) == ("soft-lockup", "critical", "reboot")
    assert found.evidence == "soft lockup" and found.detail == line


def test_kernel_hung_tasks_escalate_at_threshold_within_window():
    line = "INFO: task foo:123 blocked for more than 120 seconds."
    first = one(event("kernel", KernelHang("hung-task", line, 1000.0)))
    assert (first.subject, first.severity, first.action) == ("hung-task", "warning", "none")
    assert first.evidence == "1 hung tasks in 10m (limit 2)"
    recent = (KernelHang("hung-task", line, 100.0),  # outside the window
              KernelHang("soft-lockup", "soft lockup", 900.0),  # not a hung task
              KernelHang("hung-task", line, 800.0), KernelHang("hung-task", line, 900.0))
    third = one(event("kernel", KernelHang("hung-task", line, 1000.0), View(recent=recent)))
    assert (third.severity, third.action) == ("critical", "reboot")
    assert third.evidence == "3 hung tasks in 10m (limit 2)"
    second = one(event("kernel", KernelHang("hung-task", line, 1000.0), View(recent=recent[:3])))
    assert (second.severity, second.evidence) == ("warning", "2 hung tasks in 10m (limit 2)")


def test_event_checks_report_info_xid_as_info():
    found = one(event("xid", xid(63), GPUS_VIEW))
    assert (found.severity, found.action, found.sticky) == ("info", "none", False)


def test_fabric_health_summary_and_mask_are_judged_only_where_bad():
    healthy = sample(fabric_state=3, fabric_status=0, fabric_health_mask=0, fabric_health_summary=1)
    assert polled("fabric", View(snapshots=(snap(0.0, healthy),))) == []
    route = 1 << 4  # NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE
    unhealthy = one(polled("fabric", View(snapshots=(snap(0.0, sample(
        fabric_state=3, fabric_status=0, fabric_health_mask=route, fabric_health_summary=2)),))))
    assert (unhealthy.severity, unhealthy.evidence) == ("critical", "gpu 0 fabric unhealthy: route unhealthy")
    limited = one(polled("fabric", View(snapshots=(snap(0.0, sample(
        fabric_state=3, fabric_status=0, fabric_health_mask=1, fabric_health_summary=3)),))))
    assert (limited.severity, limited.action) == ("warning", "none")
    assert limited.evidence == "gpu 0 fabric limited capacity: degraded bandwidth"
    # a v2 driver: no summary, the mask alone; an incorrect configuration (insufficient NVLinks) is critical
    mask_only = one(polled("fabric", View(snapshots=(snap(0.0, sample(
        fabric_state=3, fabric_status=0, fabric_health_mask=5 << 8, fabric_health_summary=None)),))))
    assert (mask_only.severity, mask_only.evidence) == ("critical",
                                                        "gpu 0 fabric health mask: insufficient NVLinks")
    # every field reads "not supported" or "false": healthy
    quiet = (2 << 0) | (2 << 2) | (2 << 4) | (2 << 6) | (1 << 8) | (1 << 12) | (1 << 14)
    assert polled("fabric", View(snapshots=(snap(0.0, sample(
        fabric_state=3, fabric_status=0, fabric_health_mask=quiet, fabric_health_summary=0)),))) == []


def test_fabric_applies_only_to_a_gpu_on_a_fabric():
    from slurm_ext.health.checks import REGISTRY
    applies = REGISTRY["fabric"].applies
    assert not applies(View(snapshots=(snap(0.0, sample(fabric_state=None)),)))
    assert applies(View(snapshots=(snap(0.0, sample(fabric_state=3, fabric_status=0)),)))
    assert not applies(View())


def test_nvml_calls_failing_on_a_gpu_that_answers_are_a_warning_not_a_drain():
    failing = sample(failed=("nvmlDeviceGetPowerUsage: Unknown Error",))
    needed = int(params("nvml").threshold)
    found = one(polled("nvml", View(snapshots=tuple(snap(float(t), failing) for t in range(needed)))))
    assert (found.severity, found.action, found.subject) == ("warning", "none", "calls")
    assert "nvmlDeviceGetPowerUsage" in found.evidence
