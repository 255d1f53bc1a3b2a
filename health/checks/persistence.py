"""Persistence mode off: the driver tears the GPU's state down between jobs and every job start pays for it."""

from ..check import Check, View, gpu_observation
from ..settings import Params


def judge(view: View, params: Params) -> list:
    snapshot = view.latest
    return [gpu_observation(params, sample.gpu, "persistence mode off", "on")
            for sample in (snapshot.gpus if snapshot else ()) if sample.persistence is False]


CHECK = Check("persistence", "nvml", polled=judge)
