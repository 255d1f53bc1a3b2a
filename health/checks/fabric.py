"""GPU fabric (GPUs behind NVSwitches): training must have completed, without error, and the fabric be healthy.

Judged only where there is a fabric: a GPU that reports none (NVML answers
NOT_SUPPORTED, or, as the real H200 on driver 580 does, SUCCESS with state
NOT_SUPPORTED) has no fabric reading, and the check does not apply to it.
Where the driver gives GpuFabricInfo v3, its health summary is judged:
UNHEALTHY is critical, LIMITED_CAPACITY (degraded bandwidth) a warning; the
mask's fields that are set are named in the evidence.
"""

from ..check import Check, View, gpu_observation
from ..settings import Params

_COMPLETED = 3
_STATES = {1: "not started", 2: "in progress", 3: "completed"}
#: NVML_GPU_FABRIC_HEALTH_SUMMARY_*: 0 not supported
_HEALTHY, _UNHEALTHY, _LIMITED = 1, 2, 3
#: the health mask's fields (NVML_GPU_FABRIC_HEALTH_MASK_*): shift, width, and the values that are bad, in words,
#: with whether they alone (a driver without the v3 summary) make the GPU unfit
_MASK = (
    (0, 0x3, {1: ("degraded bandwidth", False)}),
    (2, 0x3, {1: ("route recovery in progress", False)}),
    (4, 0x3, {1: ("route unhealthy", True)}),
    (6, 0x3, {1: ("access timeout recovery in progress", False)}),
    (8, 0xF, {2: ("incorrect system GUID", True), 3: ("incorrect chassis serial number", True),
              4: ("no partition", True), 5: ("insufficient NVLinks", True), 6: ("incompatible GPU firmware", True),
              7: ("invalid location", True), 8: ("GPU state invalid", True)}),
    (12, 0x3, {2: ("no partition assigned", False)}),
    (14, 0x3, {2: ("fabric manager disconnected", False)}),
)


def applies(view: View) -> bool:
    """Any GPU of the latest reading on a fabric."""
    snapshot = view.latest
    return any(s.fabric_state is not None for s in snapshot.gpus) if snapshot else False


def judge(view: View, params: Params) -> list:
    snapshot = view.latest
    found = []
    for sample in snapshot.gpus if snapshot else ():
        if sample.fabric_state is None:
            continue
        if sample.fabric_state != _COMPLETED:
            state = _STATES.get(sample.fabric_state, sample.fabric_state)
            found.append(gpu_observation(params, sample.gpu, f"fabric training {state}", "completed"))
        elif sample.fabric_status:
            found.append(gpu_observation(params, sample.gpu, f"fabric status NVML error {sample.fabric_status}",
                                         "success"))
        elif (verdict := _health(sample.fabric_health_summary, sample.fabric_health_mask or 0)) is not None:
            critical, fault = verdict
            found.append(gpu_observation(params, sample.gpu, fault, "healthy") if critical else
                         gpu_observation(params, sample.gpu, fault, "healthy", severity="warning", action="none"))
    return found


def _health(summary: int | None, mask: int) -> tuple[bool, str] | None:
    """(critical, fault) from the v3 summary where the driver gives one, else from the mask alone."""
    bad = [values[field] for shift, width, values in _MASK if (field := (mask >> shift) & width) in values]
    named = ", ".join(words for words, _ in bad) or "no detail in the health mask"
    if summary == _HEALTHY:
        return None
    if summary == _UNHEALTHY:
        return True, f"fabric unhealthy: {named}"
    if summary == _LIMITED:
        return False, f"fabric limited capacity: {named}"
    if not bad:
        return None
    return any(serious for _, serious in bad), f"fabric health mask: {named}"


CHECK = Check("fabric", "nvml", polled=judge, applies=applies)
