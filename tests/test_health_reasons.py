"""The drain reason operators read (`sinfo -R` shows 20 characters, `sinfo -R -o "%60E %N"` 60): for every GPU
check it names the GPU and the fault in NVIDIA's own words within the first 40 characters after "slurm-ext: ",
and none of the project's internal phrasing ("(expected none)", "(limit 0)") reaches it; that stays in the
finding's fields."""

from __future__ import annotations

import dataclasses

import pytest

from slurm_ext import nvml
from slurm_ext.health import xids
from slurm_ext.health.check import View
from slurm_ext.health.checks import REGISTRY
from slurm_ext.health.findings import finding_of
from slurm_ext.health.records import Gpu, GpuSample, Snapshot, Xid
from slurm_ext.health.settings import HealthSection
from slurm_ext.slurm import REASON_PREFIX

GPU2 = Gpu(2, "GPU-0a1b2c3d-2222-4000-8000-000000000002", "00000000:3B:00.0", 2, "NVIDIA H200")

HEALTHY = dict(utilization=97, temperature=61, memory_temperature=70, slowdown_temperature=87,
               memory_max_temperature=95, clocks_event_reasons=0x0, pcie_replay=0, pcie_gen=5, pcie_width=16,
               pcie_max_gen=5, pcie_max_width=16, remap_pending=False, remap_failure=False,
               ecc_uncorrected_volatile=0, retired_pages=0, retired_pending=False, nvlink_active=18,
               nvlink_errors=0, persistence=True, recovery_action=0)


def _one(**readings) -> View:
    return View(snapshots=(Snapshot(0.0, (GpuSample(GPU2, **{**HEALTHY, **readings}),)),),
                nvlink_seen={GPU2.uuid: 18})


def _series(span: float, step: float, make) -> View:
    count = int(span / step) + 1
    return View(snapshots=tuple(Snapshot(i * step, (GpuSample(GPU2, **{**HEALTHY, **make(i, i * step)}),))
                                for i in range(count)))


#: (check, view, the fault's words that must be within the first 40 characters)
POLLED = [
    ("gpu-lost", View(snapshots=(Snapshot(0.0, (GpuSample(GPU2, error=nvml.GPU_IS_LOST),)),)), "fallen off the bus"),
    ("gpu-lost", View(snapshots=(Snapshot(0.0, (GpuSample(GPU2, error=nvml.RESET_REQUIRED),)),)),
     "GPU requires a reset"),
    ("gpu-lost", _one(recovery_action=1), "GPU reset required"),
    ("gpu-lost", _one(recovery_action=2), "node reboot required"),
    ("fabric", _one(fabric_state=2, fabric_status=0), "fabric training in progress"),
    ("throttle", _series(600.0, 60.0, lambda i, t: {"clocks_event_reasons": 0x40}), "HW Thermal Slowdown"),
    ("throttle", _series(600.0, 60.0, lambda i, t: {"clocks_event_reasons": 0x20}), "SW Thermal Slowdown"),
    ("temperature", _one(temperature=88), "thermal slowdown"),
    ("temperature", _one(memory_temperature=96), "memory over its max"),
    ("row-remap", _one(remap_pending=True), "row remapping pending"),
    ("row-remap", _one(remap_failure=True, remapped_uncorrectable=9), "row remapping failed"),
    ("ecc", _one(ecc_uncorrected_volatile=1), "double-bit ECC error"),
    ("retired-pages", _one(retired_pages=60), "60 retired pages"),
    ("retired-pages", _one(retired_pending=True), "pending retirement"),
    ("nvlink", _one(nvlink_active=16), "NVLink down"),
    ("nvlink-errors", _series(60.0, 10.0, lambda i, t: {"nvlink_errors": int(t * 200)}), "NVLink errors"),
    ("pcie-link", _one(pcie_width=8), "PCIe link x8"),
    ("pcie-replay", _series(300.0, 10.0, lambda i, t: {"pcie_replay": int(t / 3)}), "PCIe replays"),
    ("persistence", _one(persistence=False), "persistence mode off"),
]

#: the Xids that drain a node (critical), each with NVIDIA's description as the catalogue keeps it
CRITICAL_XIDS = sorted(n for n in xids.KNOWN if xids.entry(n).severity == "critical")


def _params(check: str):
    return dataclasses.replace(HealthSection().params(check))


def _shown(observation) -> str:
    """The reason as `sinfo -R -o "%60E"` shows it, after slurm-ext's prefix."""
    reason = f"{REASON_PREFIX} {finding_of(observation, 0.0, polled=True).reason}"  # as the node-state owner writes it
    assert reason.startswith("slurm-ext: ")
    return reason.removeprefix("slurm-ext: ")


def _assert_operator_text(observation) -> None:
    shown = _shown(observation)
    for internal in ("expected none", "limit 0", "expected an answer", "(expected", "(limit"):
        assert internal not in shown, shown


def test_every_gpu_check_has_a_case():
    gpu_checks = {c for c, check in REGISTRY.items() if check.source == "nvml"} - {"gpu-count", "nvml"}
    assert gpu_checks == {check for check, _, _ in POLLED}


@pytest.mark.parametrize("check,view,words", POLLED, ids=[f"{c}-{w}" for c, _, w in POLLED])
def test_a_gpu_check_names_the_gpu_and_the_fault_in_the_first_40_characters(check, view, words):
    found = REGISTRY[check].polled(view, _params(check))
    assert found and len(found) == 1, found
    shown = _shown(found[0])
    assert "gpu 2 " in shown[:40], shown
    assert words in shown[:40], shown
    _assert_operator_text(found[0])
    assert found[0].fields.get("expected"), "what was expected stays in the finding's fields"


@pytest.mark.parametrize("number", CRITICAL_XIDS)
def test_an_xid_names_the_gpu_and_nvidias_words_in_the_first_40_characters(number):
    view = View(snapshots=(Snapshot(0.0, (GpuSample(GPU2),)),))
    record = Xid(number, GPU2.pci_bus_id, f"NVRM: Xid (PCI:{GPU2.pci_bus_id}): {number}, pid=1", "kernel", 10.0)
    found = REGISTRY["xid"].on_event(record, view, _params("xid"))[0]
    shown = _shown(found)
    assert shown.startswith(f"xid {number} gpu 2 "), shown
    words = xids.short_meaning(xids.entry(number))
    assert shown[len(f"xid {number} gpu 2 "):].startswith(words[:40 - len(f"xid {number} gpu 2 ")]), shown
    _assert_operator_text(found)
    assert found.fields["expected"] == "none"


@pytest.mark.parametrize("number,words", [(79, "GPU has fallen off the bus"), (48, "double-bit ECC error"),
                                          (46, "GPU stopped processing"), (95, "uncontained memory error")])
def test_the_xids_operators_meet_most_read_whole(number, words):
    view = View(snapshots=(Snapshot(0.0, (GpuSample(GPU2),)),))
    record = Xid(number, GPU2.pci_bus_id, "NVRM: Xid", "kernel", 10.0)
    shown = _shown(REGISTRY["xid"].on_event(record, view, _params("xid"))[0])
    assert f"xid {number} gpu 2 {words}" in shown[:40], shown


def test_the_reason_is_stable_for_one_finding():
    """The node-state owner compares reasons: the same fault seen again gives the same text."""
    first = REGISTRY["ecc"].polled(_one(ecc_uncorrected_volatile=1), _params("ecc"))[0]
    again = REGISTRY["ecc"].polled(_one(ecc_uncorrected_volatile=1), _params("ecc"))[0]
    assert _shown(first) == _shown(again)
