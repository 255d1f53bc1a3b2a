"""Temperature against the GPU's own slowdown limit (and the memory's maximum), not a fixed number:
an H100 and a B200 slow down at different temperatures, and NVML knows each one's."""

from ..check import Check, View, gpu_observation
from ..settings import Params


def judge(view: View, params: Params) -> list:
    snapshot = view.latest
    margin = params.threshold or 0.0
    found = []
    for sample in snapshot.gpus if snapshot else ():
        if sample.temperature is not None and sample.slowdown_temperature is not None \
                and sample.temperature >= sample.slowdown_temperature - margin:
            near = "thermal slowdown" if sample.temperature >= sample.slowdown_temperature else \
                "near thermal slowdown"
            found.append(gpu_observation(params, sample.gpu, f"{near} {sample.temperature}C (slowdown at "
                                         f"{sample.slowdown_temperature}C)",
                                         f"below {sample.slowdown_temperature - margin:g}C (slowdown "
                                         f"{sample.slowdown_temperature}C - {margin:g}C)"))
        elif sample.memory_temperature is not None and sample.memory_max_temperature is not None \
                and sample.memory_temperature >= sample.memory_max_temperature:
            found.append(gpu_observation(params, sample.gpu, f"memory over its max: {sample.memory_temperature}C "
                                         f"(max {sample.memory_max_temperature}C)",
                                         f"below {sample.memory_max_temperature}C"))
    return found


CHECK = Check("temperature", "nvml", polled=judge)
