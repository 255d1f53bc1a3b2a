"""Throttling that costs throughput: hardware slowdown, thermal slowdown, power brake.

Judged as the share of the samples over a full window, never one sample:
a GPU brushing its power brake for a second is normal, one held in
slowdown for most of ten minutes runs a job at a fraction of its speed.
Software power capping (0x4) is left out: it is the power limit doing its job.
"""

from slurm_ext.config import format_duration

from ..check import Check, View, gpu_observation
from ..settings import Params

#: HwSlowdown 0x8, SwThermalSlowdown 0x20, HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80
#: in NVIDIA's words (nvidia-smi -q's "Clocks Event Reasons")
_COSTLY = {0x8: "HW Slowdown", 0x20: "SW Thermal Slowdown", 0x40: "HW Thermal Slowdown", 0x80: "HW Power Brake Slowdown"}
_MASK = sum(_COSTLY)


def judge(view: View, params: Params) -> list:
    snapshots = view.window(params.window)
    if snapshots is None:
        return None  # not watched for a full window yet: no verdict
    samples: dict[str, list] = {}
    for snapshot in snapshots:
        for sample in snapshot.gpus:
            if sample.clocks_event_reasons is not None:
                samples.setdefault(sample.gpu.uuid, []).append(sample)
    found = []
    for readings in samples.values():
        throttled = [s for s in readings if s.clocks_event_reasons & _MASK]
        share = len(throttled) / len(readings)
        if not throttled or share < params.threshold:
            continue
        seen = 0
        for s in throttled:
            seen |= s.clocks_event_reasons
        why = ", ".join(name for bit, name in _COSTLY.items() if seen & bit)
        span = format_duration(params.window)
        found.append(gpu_observation(params, readings[-1].gpu, f"{why} {share:.0%} of {span}",
                                     f"under {params.threshold:.0%} of {span}"))
    return found


CHECK = Check("throttle", "nvml", polled=judge)
