"""Reading the GPUs through NVML: one snapshot per poll, and NVML's pushed events.

`read_snapshot` asks every GPU for what the checks and the metrics need,
one pass, about thirty calls a GPU. A reading the GPU does not support is
None. The first call that fails otherwise ends that GPU's sample with
NVML's code: GPU_IS_LOST there is the GPU off the bus, another code counts
towards NVML failing. `NvmlEvents` waits in nvmlEventSetWait for Xids,
double-bit ECC errors and recovery-action changes, which the driver pushes
as they happen.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

from slurm_ext import nvml

from .records import Gpu, GpuSample, Snapshot, Xid, normal_bus_id

__all__ = ["read_gpus", "read_snapshot", "NvmlEvents", "nvml_module", "NvmlInitFailed"]

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


def read_gpus(load=None, baseline: tuple[str, ...] = (), known: dict[int, Gpu] | None = None) -> Snapshot:
    """A snapshot through `load()` (default nvml_module): NVML that cannot start is the snapshot's error, except
    on a node that never had GPUs (an empty baseline and no driver: a CPU node has nothing to fail)."""
    try:
        module = (load or nvml_module)()
    except (NvmlInitFailed, nvml.NvmlUnavailable) as err:
        code = getattr(err, "code", None)
        if not baseline and (code in _NO_DRIVER or isinstance(err, nvml.NvmlUnavailable)):
            return Snapshot(time.monotonic())
        return Snapshot(time.monotonic(), error=code or -1, error_text=str(err), baseline=baseline)
    return read_snapshot(module, baseline, known=known)


class _Unsupported:
    pass


def read_snapshot(module: Any, baseline: tuple[str, ...] = (), now: float | None = None,
                  known: dict[int, Gpu] | None = None) -> Snapshot:
    """Every GPU's readings now (monotonic time); NVML's own failure is the snapshot's error, not an exception.

    `known`: each index's identity from earlier snapshots, for a GPU that no longer answers even its UUID (off
    the bus), so that its finding still names it."""
    caught = nvml.errors(module)
    try:
        count = module.nvmlDeviceGetCount()
    except caught as err:
        return Snapshot(time.monotonic() if now is None else now, error=nvml.error_code(err) or -1,
                        error_text=f"nvmlDeviceGetCount: {err}", baseline=baseline)
    samples = []
    for index in range(count):
        samples.append(_sample(module, index, caught, (known or {}).get(index)))
    try:
        driver = nvml.text(module.nvmlSystemGetDriverVersion())
    except caught:
        driver = ""
    # stamped when the reading is complete: one that hung lands after the monitor's stand-ins for the polls it
    # missed, in time order
    return Snapshot(time.monotonic() if now is None else now, tuple(samples), baseline=baseline, driver=driver)


def _sample(module: Any, index: int, caught: tuple, known: Gpu | None) -> GpuSample:
    try:
        handle = module.nvmlDeviceGetHandleByIndex(index)
        gpu = Gpu(index, nvml.text(module.nvmlDeviceGetUUID(handle)),
                  normal_bus_id(nvml.text(module.nvmlDeviceGetPciInfo(handle).busId)),
                  _get(module, module.nvmlDeviceGetMinorNumber, handle, default=-1),
                  nvml.text(module.nvmlDeviceGetName(handle)))
    except caught as err:
        return GpuSample(known or Gpu(index, "", ""), error=nvml.error_code(err) or -1,
                         error_text=f"gpu {index}: {err}")
    try:
        return GpuSample(gpu, **_readings(module, handle))
    except caught as err:
        return GpuSample(gpu, error=nvml.error_code(err) or -1, error_text=f"gpu {index} {gpu.uuid}: {err}")


def _get(module: Any, call, *args, default=None):
    """`call(*args)`, or `default` when the GPU does not support it."""
    return nvml.optional(module, call, *args, default=default,
                         codes=(nvml.NOT_SUPPORTED, nvml.FUNCTION_NOT_FOUND, nvml.NOT_FOUND))


def _readings(m: Any, h: Any) -> dict:
    out: dict[str, Any] = {}
    utilization = _get(m, m.nvmlDeviceGetUtilizationRates, h)
    if utilization is not None:
        out["utilization"], out["memory_utilization"] = utilization.gpu, utilization.memory
    memory = _get(m, m.nvmlDeviceGetMemoryInfo, h)
    if memory is not None:
        out["fb_used_mib"], out["fb_free_mib"] = memory.used / _MIB, memory.free / _MIB
    out["temperature"] = _get(m, m.nvmlDeviceGetTemperature, h, m.NVML_TEMPERATURE_GPU)
    out["slowdown_temperature"] = _threshold(m, h, m.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    out["memory_max_temperature"] = _threshold(m, h, m.NVML_TEMPERATURE_THRESHOLD_MEM_MAX)
    power = _get(m, m.nvmlDeviceGetPowerUsage, h)
    out["power_w"] = power / 1000 if power is not None else None
    out["energy_mj"] = _get(m, m.nvmlDeviceGetTotalEnergyConsumption, h)
    out["sm_clock"] = _get(m, m.nvmlDeviceGetClockInfo, h, m.NVML_CLOCK_SM)
    out["memory_clock"] = _get(m, m.nvmlDeviceGetClockInfo, h, m.NVML_CLOCK_MEM)
    reasons = getattr(m, "nvmlDeviceGetCurrentClocksEventReasons", None) or m.nvmlDeviceGetCurrentClocksThrottleReasons
    out["clocks_event_reasons"] = _get(m, reasons, h)
    out["pcie_replay"] = _get(m, m.nvmlDeviceGetPcieReplayCounter, h)
    out["pcie_gen"] = _get(m, m.nvmlDeviceGetCurrPcieLinkGeneration, h)
    out["pcie_width"] = _get(m, m.nvmlDeviceGetCurrPcieLinkWidth, h)
    out["pcie_max_gen"] = _get(m, m.nvmlDeviceGetMaxPcieLinkGeneration, h)
    out["pcie_max_width"] = _get(m, m.nvmlDeviceGetMaxPcieLinkWidth, h)
    remapped = _get(m, m.nvmlDeviceGetRemappedRows, h)
    if remapped is not None:
        (out["remapped_correctable"], out["remapped_uncorrectable"], pending, failure) = remapped
        out["remap_pending"], out["remap_failure"] = bool(pending), bool(failure)
    out["ecc_uncorrected_volatile"] = _get(m, m.nvmlDeviceGetTotalEccErrors, h, m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                           m.NVML_VOLATILE_ECC)
    out["ecc_corrected_volatile"] = _get(m, m.nvmlDeviceGetTotalEccErrors, h, m.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                         m.NVML_VOLATILE_ECC)
    pages = _get(m, m.nvmlDeviceGetRetiredPages, h, m.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    if pages is not None:
        single = _get(m, m.nvmlDeviceGetRetiredPages, h, m.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                      default=[])
        out["retired_pages"] = len(pages) + len(single)
        out["retired_pending"] = bool(_get(m, m.nvmlDeviceGetRetiredPagesPendingStatus, h, default=0))
    out.update(_nvlinks(m, h))
    persistence = _get(m, m.nvmlDeviceGetPersistenceMode, h)
    out["persistence"] = bool(persistence) if persistence is not None else None
    fabric = m.c_nvmlGpuFabricInfo_t()
    if _get(m, m.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(fabric)) is not None:
        out["fabric_state"], out["fabric_status"] = fabric.state, fabric.status
    out.update(_fields(m, h))
    return out


def _threshold(m: Any, h: Any, kind: int) -> int | None:
    value = _get(m, m.nvmlDeviceGetTemperatureThreshold, h, kind, default=None)
    return value if value is None or value > 0 else None


def _nvlinks(m: Any, h: Any) -> dict:
    """Active links and the sum of their CRC and replay error counters; None off NVLink (a PCIe card)."""
    active = errors = 0
    present = False
    for link in range(m.NVML_NVLINK_MAX_LINKS):
        state = _get(m, m.nvmlDeviceGetNvLinkState, h, link, default=_Unsupported)
        if state is _Unsupported:
            break  # a GPU's links are numbered from 0: the first one it lacks ends them
        present = True
        if state:
            active += 1
            for counter in (m.NVML_NVLINK_ERROR_DL_REPLAY, m.NVML_NVLINK_ERROR_DL_CRC_FLIT,
                            m.NVML_NVLINK_ERROR_DL_CRC_DATA):
                errors += _get(m, m.nvmlDeviceGetNvLinkErrorCounter, h, link, counter, default=0)
    return {"nvlink_active": active, "nvlink_errors": errors} if present else {}


_FIELD_NAMES = (("memory_temperature", "NVML_FI_DEV_MEMORY_TEMP"),
                ("recovery_action", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"))


def _fields(m: Any, h: Any) -> dict:
    """NVML field values (memory temperature, the recovery action): one call for all of them."""
    wanted = [(name, getattr(m, constant)) for name, constant in _FIELD_NAMES if hasattr(m, constant)]
    values = _get(m, m.nvmlDeviceGetFieldValues, h, [field for _, field in wanted], default=None)
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
    from .catalog import recovery_entry
    return recovery_entry(code)[0]
