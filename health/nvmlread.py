"""Reading the GPUs through NVML: one snapshot per poll, and NVML's pushed events.

`read_snapshot` asks every GPU for what the checks and the metrics need,
one pass, about twenty-five calls a GPU; what never changes (identity,
thresholds, PCIe maxima, the NVLink count) is read at the GPU's first poll
only. A reading the GPU does not have is None. A call that fails otherwise
is None too and is named in the sample's `failed`, so one bad call never
costs the GPU's other readings; only GPU_IS_LOST or RESET_REQUIRED end the
sample (the GPU off the bus, or waiting for a reset). `NvmlEvents` waits in
nvmlEventSetWait for Xids, double-bit ECC errors and recovery-action
changes, which the driver pushes as they happen.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import Any

from slurm_ext import nvml

from .records import Gpu, GpuSample, Snapshot, Xid, normal_bus_id

__all__ = ["read_gpus", "read_snapshot", "GpuFacts", "NvmlEvents", "nvml_module", "NvmlInitFailed"]

_MIB = 2**20
#: nvmlInit's answers on a host without NVIDIA's driver (DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND)
_NO_DRIVER = (nvml.DRIVER_NOT_LOADED, nvml.LIBRARY_NOT_FOUND)


class NvmlInitFailed(Exception):
    def __init__(self, err: BaseException):
        self.code = nvml.error_code(err)
        super().__init__(nvml.describe(f"nvmlInit failed: {err}", self.code))


def nvml_module() -> Any:
    """pynvml, initialised once for this process.

    Raises:
        NvmlUnavailable: pynvml is not installed.
        NvmlInitFailed: nvmlInit failed (no driver, no GPUs' library).
    """
    module = nvml.load()
    nvml.init_once(module, NvmlInitFailed)
    return module


def read_gpus(load=None, baseline: tuple[str, ...] = (), known: dict[int, Gpu] | None = None,
              facts: dict | None = None) -> Snapshot:
    """A snapshot through `load()` (default nvml_module): NVML that cannot start is the snapshot's error, except
    on a node that never had GPUs (an empty baseline and no driver: a CPU node has nothing to fail)."""
    try:
        module = (load or nvml_module)()
    except (NvmlInitFailed, nvml.NvmlUnavailable) as err:
        code = getattr(err, "code", None)
        if not baseline and (code in _NO_DRIVER or isinstance(err, nvml.NvmlUnavailable)):
            return Snapshot(time.monotonic())
        return Snapshot(time.monotonic(), error=code or -1, error_text=str(err), baseline=baseline)
    return read_snapshot(module, baseline, known=known, facts=facts)


class _Unsupported:
    pass


#: NVML's answers for a reading this GPU does not have: a PCIe card's NVLinks, a Hopper's retired pages
_ABSENT = (nvml.NOT_SUPPORTED, nvml.FUNCTION_NOT_FOUND, nvml.NOT_FOUND)
#: answers that end the GPU's sample: it cannot be read at all (off the bus, or waiting for a reset)
_LOST = (nvml.GPU_IS_LOST, nvml.RESET_REQUIRED)
#: what a driver answers for a link past the GPU's last (NOT_SUPPORTED; INVALID_ARGUMENT on GB200, where pynvml's
#: NVML_NVLINK_MAX_LINKS, 36, is past every GPU's own count)
_NO_SUCH_LINK = (*_ABSENT, nvml.INVALID_ARGUMENT)


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What a GPU never changes while its driver runs, read at its first poll instead of every poll (on the real
    H200 the slowdown threshold alone costs 2.8 ms a call)."""

    gpu: Gpu
    slowdown_temperature: int | None
    memory_max_temperature: int | None
    pcie_max_gen: int | None
    pcie_max_width: int | None
    #: the GPU's NVLink count (0: none), or None when a link answered an error (asked again at the next poll)
    links: int | None


def read_snapshot(module: Any, baseline: tuple[str, ...] = (), now: float | None = None,
                  known: dict[int, Gpu] | None = None, facts: dict | None = None) -> Snapshot:
    """Every GPU's readings now (monotonic time); NVML's own failure is the snapshot's error, not an exception.

    `known`: each index's identity from earlier snapshots, for a GPU that no longer answers even its UUID (off
    the bus), so that its finding still names it. `facts`: a dict the caller keeps between polls, where each
    GPU's `GpuFacts` wait by UUID (None: read them every time, as a one-off check does)."""
    caught = nvml.errors(module)
    try:
        count = module.nvmlDeviceGetCount()
    except caught as err:
        return Snapshot(time.monotonic() if now is None else now, error=nvml.error_code(err) or -1,
                        error_text=f"nvmlDeviceGetCount: {err}", baseline=baseline)
    samples = []
    for index in range(count):
        samples.append(_sample(module, index, caught, (known or {}).get(index), {} if facts is None else facts))
    try:
        driver = nvml.text(module.nvmlSystemGetDriverVersion())
    except caught:
        driver = ""
    # stamped when the reading is complete: one that hung lands after the monitor's stand-ins for the polls it
    # missed, in time order
    return Snapshot(time.monotonic() if now is None else now, tuple(samples), baseline=baseline, driver=driver)


def _sample(module: Any, index: int, caught: tuple, known: Gpu | None, facts: dict) -> GpuSample:
    reading = _Reading(caught)
    try:
        handle = module.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.text(module.nvmlDeviceGetUUID(handle))
        gpu_facts = facts.get(uuid)
        if gpu_facts is None or gpu_facts.gpu.index != index:
            gpu_facts = _read_facts(module, handle, index, uuid, reading)
            if not reading.failed:  # a fact that failed is asked again next poll
                facts[uuid] = gpu_facts
    except caught as err:
        return GpuSample(known or Gpu(index, "", ""), error=nvml.error_code(err) or -1,
                         error_text=f"gpu {index}: {err}")
    gpu = gpu_facts.gpu
    try:
        values = _readings(module, handle, gpu_facts, reading)
    except caught as err:  # only _LOST reaches here: the GPU stopped answering in the middle
        return GpuSample(gpu, error=nvml.error_code(err) or -1, error_text=f"gpu {index} {gpu.uuid}: {err}")
    return GpuSample(gpu, failed=tuple(reading.failed), **values)


def _read_facts(m: Any, h: Any, index: int, uuid: str, read: _Reading) -> GpuFacts:
    """Raises: an NVML error when the GPU cannot say who it is (the sample is then that error)."""
    gpu = Gpu(index, uuid, normal_bus_id(nvml.text(m.nvmlDeviceGetPciInfo(h).busId)),
              _get(m, m.nvmlDeviceGetMinorNumber, h, default=-1), nvml.text(m.nvmlDeviceGetName(h)))
    return GpuFacts(gpu, _threshold(m, h, m.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, read),
                    _threshold(m, h, m.NVML_TEMPERATURE_THRESHOLD_MEM_MAX, read),
                    read(m.nvmlDeviceGetMaxPcieLinkGeneration, h), read(m.nvmlDeviceGetMaxPcieLinkWidth, h),
                    _link_count(m, h, read))


class _Reading:
    """Calls NVML for one reading of one GPU: an answer, None for a reading the GPU lacks, and None with the call
    kept in `failed` for any other error, so that one failing call never costs the GPU's other readings. Only a
    lost GPU (GPU_IS_LOST, RESET_REQUIRED) raises: nothing after it can be read."""

    def __init__(self, caught: tuple):
        self.caught = caught
        self.failed: list[str] = []

    def __call__(self, call, *args, default=None):
        try:
            return call(*args)
        except self.caught as err:
            code = nvml.error_code(err)
            if code in _LOST:
                raise
            if code not in _ABSENT:
                self.failed.append(f"{getattr(call, '__name__', 'nvml')}: {err}")
            return default


def _get(module: Any, call, *args, default=None):
    """`call(*args)`, or `default` when the GPU does not support it."""
    return nvml.optional(module, call, *args, default=default, codes=_ABSENT)


def _readings(m: Any, h: Any, facts: GpuFacts, read: _Reading) -> dict:
    out: dict[str, Any] = {"slowdown_temperature": facts.slowdown_temperature,
                           "memory_max_temperature": facts.memory_max_temperature,
                           "pcie_max_gen": facts.pcie_max_gen, "pcie_max_width": facts.pcie_max_width}
    utilization = read(m.nvmlDeviceGetUtilizationRates, h)
    if utilization is not None:
        out["utilization"], out["memory_utilization"] = utilization.gpu, utilization.memory
    out.update(_memory(m, h, read))
    out["temperature"] = read(m.nvmlDeviceGetTemperature, h, m.NVML_TEMPERATURE_GPU)
    power = read(m.nvmlDeviceGetPowerUsage, h)
    out["power_w"] = power / 1000 if power is not None else None
    out["energy_mj"] = read(m.nvmlDeviceGetTotalEnergyConsumption, h)
    out["sm_clock"] = read(m.nvmlDeviceGetClockInfo, h, m.NVML_CLOCK_SM)
    out["memory_clock"] = read(m.nvmlDeviceGetClockInfo, h, m.NVML_CLOCK_MEM)
    reasons = getattr(m, "nvmlDeviceGetCurrentClocksEventReasons", None) or m.nvmlDeviceGetCurrentClocksThrottleReasons
    out["clocks_event_reasons"] = read(reasons, h)
    out["pcie_replay"] = read(m.nvmlDeviceGetPcieReplayCounter, h)
    out["pcie_gen"] = read(m.nvmlDeviceGetCurrPcieLinkGeneration, h)
    out["pcie_width"] = read(m.nvmlDeviceGetCurrPcieLinkWidth, h)
    remapped = read(m.nvmlDeviceGetRemappedRows, h)
    if remapped is not None:
        (out["remapped_correctable"], out["remapped_uncorrectable"], pending, failure) = remapped
        out["remap_pending"], out["remap_failure"] = bool(pending), bool(failure)
    out["ecc_uncorrected_volatile"] = read(m.nvmlDeviceGetTotalEccErrors, h, m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                           m.NVML_VOLATILE_ECC)
    out["ecc_corrected_volatile"] = read(m.nvmlDeviceGetTotalEccErrors, h, m.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                         m.NVML_VOLATILE_ECC)
    pages = read(m.nvmlDeviceGetRetiredPages, h, m.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    if pages is not None:
        single = read(m.nvmlDeviceGetRetiredPages, h, m.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                      default=[])
        out["retired_pages"] = len(pages) + len(single)
        out["retired_pending"] = bool(read(m.nvmlDeviceGetRetiredPagesPendingStatus, h, default=0))
    out.update(_nvlinks(m, h, facts.links, read))
    persistence = read(m.nvmlDeviceGetPersistenceMode, h)
    out["persistence"] = bool(persistence) if persistence is not None else None
    out.update(_fabric(m, h, read))
    out.update(_fields(m, h, read))
    return out


def _memory(m: Any, h: Any, read: _Reading) -> dict:
    """Memory in use without the driver's reserve (nvml.memory: v2 where the driver has it), as DCGM counts FB_USED
    beside FB_RESERVED."""
    found = read(nvml.memory, m, h)
    if found is None:
        return {}
    used, free, reserved = found
    out = {"fb_used_mib": used / _MIB, "fb_free_mib": free / _MIB}
    if reserved is not None:
        out["fb_reserved_mib"] = reserved / _MIB
    return out


def _threshold(m: Any, h: Any, kind: int, read: _Reading) -> int | None:
    value = read(m.nvmlDeviceGetTemperatureThreshold, h, kind)
    return value if value is None or value > 0 else None


def _link_count(m: Any, h: Any, read: _Reading) -> int | None:
    """How many NVLinks the GPU has: links are numbered from 0, and the first one it does not have ends them.
    None when a link answered an error that is not "no such link" (the count is not known: ask again next poll)."""
    for link in range(m.NVML_NVLINK_MAX_LINKS):
        try:
            m.nvmlDeviceGetNvLinkState(h, link)
        except read.caught as err:
            code = nvml.error_code(err)
            if code in _NO_SUCH_LINK:
                return link
            if code in _LOST:
                raise
            read.failed.append(f"nvmlDeviceGetNvLinkState link {link}: {err}")
            return None
    return m.NVML_NVLINK_MAX_LINKS


def _nvlinks(m: Any, h: Any, links: int | None, read: _Reading) -> dict:
    """Active links and the sum of their CRC and replay error counters; None off NVLink (a PCIe card)."""
    if links is None:
        links = _link_count(m, h, read) or 0
    if not links:
        return {}
    active = errors = 0
    for link in range(links):
        if not read(m.nvmlDeviceGetNvLinkState, h, link, default=0):
            continue
        active += 1
        for counter in (m.NVML_NVLINK_ERROR_DL_REPLAY, m.NVML_NVLINK_ERROR_DL_CRC_FLIT,
                        m.NVML_NVLINK_ERROR_DL_CRC_DATA):
            errors += read(m.nvmlDeviceGetNvLinkErrorCounter, h, link, counter, default=0)
    return {"nvlink_active": active, "nvlink_errors": errors}


def _fabric(m: Any, h: Any, read: _Reading) -> dict:
    """The NVSwitch fabric's state, status and (GpuFabricInfo v3) health; nothing off a fabric.

    A GPU that is not part of a fabric answers either NOT_SUPPORTED or, as the real H200 on driver 580 did,
    SUCCESS with state NOT_SUPPORTED (0): both are "no fabric", never a finding."""
    info = None
    versioned = getattr(m, "c_nvmlGpuFabricInfo_v3_t", None)
    if versioned is not None and hasattr(m, "nvmlDeviceGetGpuFabricInfoV"):
        info = versioned()
        try:
            m.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
        except read.caught as err:
            if nvml.error_code(err) in _LOST:
                raise
            info = None  # an older driver (no V, or no v3): the plain call below
    if info is None:
        info = m.c_nvmlGpuFabricInfo_t()
        if read(m.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(info), default=_Unsupported) is _Unsupported:
            return {}
    if info.state == _FABRIC_NOT_SUPPORTED:
        return {}
    out = {"fabric_state": int(info.state), "fabric_status": int(info.status)}
    if hasattr(info, "healthMask"):
        out["fabric_health_mask"] = int(info.healthMask)
    if hasattr(info, "healthSummary"):
        out["fabric_health_summary"] = int(info.healthSummary)
    return out


#: NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
_FABRIC_NOT_SUPPORTED = 0


_FIELD_NAMES = (("memory_temperature", "NVML_FI_DEV_MEMORY_TEMP"),
                ("recovery_action", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"))


def _fields(m: Any, h: Any, read: _Reading) -> dict:
    """NVML field values (memory temperature, the recovery action): one call for all of them."""
    wanted = [(name, getattr(m, constant)) for name, constant in _FIELD_NAMES if hasattr(m, constant)]
    values = read(m.nvmlDeviceGetFieldValues, h, [field for _, field in wanted])
    out = {}
    for (name, _), value in zip(wanted, values or ()):
        if value.nvmlReturn == 0:
            out[name] = _field_value(m, value)
    return out


def _field_value(m: Any, value) -> int:
    kind = value.valueType
    union = value.value
    if kind == getattr(m, "NVML_VALUE_TYPE_DOUBLE", 0):
        return int(union.dVal)
    if kind == getattr(m, "NVML_VALUE_TYPE_UNSIGNED_INT", 1):
        return int(union.uiVal)
    if kind == getattr(m, "NVML_VALUE_TYPE_UNSIGNED_LONG", 2):
        return int(union.ulVal)
    if kind == getattr(m, "NVML_VALUE_TYPE_SIGNED_LONG_LONG", 4):
        return int(union.sllVal)
    return int(union.ullVal)


#: the events waited for: Xid, double-bit ECC, and (newer drivers) the recovery action changing
_XID_EVENT = 0x8
_DBE_EVENT = 0x2


class NvmlEvents:
    """nvmlEventSetWait over every GPU that supports the events; `wait(timeout)` returns the Xids that came."""

    def __init__(self, module: Any):
        self.m = module
        self.set = module.nvmlEventSetCreate()
        self.registered: list[str] = []
        self._recovery = getattr(module, "nvmlEventTypeGpuRecoveryAction", 0)
        wanted = _XID_EVENT | _DBE_EVENT | self._recovery
        caught = nvml.errors(module)
        for index in range(module.nvmlDeviceGetCount()):
            try:
                handle = module.nvmlDeviceGetHandleByIndex(index)
                supported = module.nvmlDeviceGetSupportedEventTypes(handle)
                if supported & wanted:
                    module.nvmlDeviceRegisterEvents(handle, supported & wanted, self.set)
                    self.registered.append(nvml.text(module.nvmlDeviceGetUUID(handle)))
            except caught:
                continue  # a GPU already lost: its Xids still reach the kernel log

    def wait(self, timeout: float) -> list[Xid]:
        m = self.m
        try:
            data = m.nvmlEventSetWait_v2(self.set, int(timeout * 1000))
        except nvml.errors(m) as err:
            if nvml.error_code(err) == 10:  # NVML_ERROR_TIMEOUT: nothing came
                return []
            raise
        try:
            uuid = nvml.text(m.nvmlDeviceGetUUID(data.device))
        except nvml.errors(m):
            uuid = ""
        now = time.time()
        if data.eventType & _XID_EVENT:
            return [Xid(int(data.eventData), "", f"NVML event: Xid {data.eventData}", "nvml", now, uuid=uuid)]
        if data.eventType & _DBE_EVENT:
            return [Xid(48, "", "NVML event: double-bit ECC error", "nvml", now, uuid=uuid)]
        if self._recovery and data.eventType & self._recovery:
            return [Xid(154, "", f"NVML event: recovery action {data.eventData}", "nvml", now, uuid=uuid,
                        recovery=_recovery_words(int(data.eventData)))]
        return []

    def close(self) -> None:
        try:
            self.m.nvmlEventSetFree(self.set)
        except nvml.errors(self.m):
            pass


def _recovery_words(code: int) -> str:
    from .xids import recovery_entry
    return recovery_entry(code)[0]
