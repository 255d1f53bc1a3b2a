"""Uncorrectable (double-bit) ECC errors since the driver loaded: the data a job read may be wrong."""

from ..check import Check, View, gpu_observation
from ..settings import Params


def judge(view: View, params: Params) -> list:
    snapshot = view.latest
    found = []
    for sample in snapshot.gpus if snapshot else ():
        count = sample.ecc_uncorrected_volatile
        if count is not None and count >= params.threshold:
            errors = "double-bit ECC error" + (f"s: {count} (volatile)" if count > 1 else " (volatile)")
            found.append(gpu_observation(params, sample.gpu, errors, f"at most {params.threshold - 1:g}"))
    return found


CHECK = Check("ecc", "nvml", polled=judge)
