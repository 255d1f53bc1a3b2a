"""GPU lost: NVML answers GPU_IS_LOST (the GPU fell off the bus) or RESET_REQUIRED for a GPU it lists, or
the driver's recovery-action field asks for a reset or a reboot (no other tool reads it)."""

from slurm_ext import nvml

from ..xids import recovery_entry
from ..check import Check, View, gpu_observation
from ..settings import Params


def judge(view: View, params: Params) -> list:
    snapshot = view.latest
    if snapshot is None:
        return []
    found = []
    for sample in snapshot.gpus:
        if sample.error == nvml.GPU_IS_LOST:
            found.append(gpu_observation(params, sample.gpu, "fallen off the bus (NVML GPU_IS_LOST)", "an answer",
                                         detail=sample.error_text))
        elif sample.error == nvml.RESET_REQUIRED:
            found.append(gpu_observation(params, sample.gpu, "GPU requires a reset (NVML RESET_REQUIRED)",
                                         "an answer", action="reset-gpu", detail=sample.error_text))
        elif sample.recovery_action:
            words, severity, action = recovery_entry(sample.recovery_action)
            if severity == "critical":
                words = words.replace("gpu reset", "GPU reset")
                found.append(gpu_observation(params, sample.gpu, f"{words} (NVML recovery action)", "none",
                                             action=action))
    return found


CHECK = Check("gpu-lost", "nvml", polled=judge)
