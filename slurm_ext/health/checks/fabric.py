"""GPU fabric state (NVLink fabric nodes, where NVML reports it): training must have completed, without error."""

from ..check import Check, View, gpu_observation
from ..settings import Params

_COMPLETED = 3
_STATES = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}


def judge(view: View, params: Params) -> list:
    snapshot = view.latest
    found = []
    for sample in snapshot.gpus if snapshot else ():
        if sample.fabric_state is None:
            continue
        if sample.fabric_state != _COMPLETED:
            state = _STATES.get(sample.fabric_state, sample.fabric_state)
            found.append(gpu_observation(params, sample.gpu, f"fabric {state} (expected completed)"))
        elif sample.fabric_status:
            found.append(gpu_observation(params, sample.gpu, f"fabric status nvml error {sample.fabric_status} "
                                         "(expected success)"))
    return found


CHECK = Check("fabric", "nvml", polled=judge)
