"""Row remapping (Ampere and later): pending needs a GPU reset; failed is NVIDIA's RMA criterion."""

from ..check import Check, View, gpu_observation
from ..settings import Params


def judge(view: View, params: Params) -> list:
    snapshot = view.latest
    found = []
    for sample in snapshot.gpus if snapshot else ():
        if sample.remap_failure:
            rows = sample.remapped_uncorrectable
            count = f", {rows} uncorrectable rows" if rows is not None else ""
            found.append(gpu_observation(params, sample.gpu, f"row remapping failed{count}", "no failure",
                                         action="remove"))
        elif sample.remap_pending:
            found.append(gpu_observation(params, sample.gpu, "row remapping pending (a GPU reset applies it)",
                                         "none"))
    return found


CHECK = Check("row-remap", "nvml", polled=judge)
