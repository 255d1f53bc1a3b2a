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
            found.append(gpu_observation(params, sample.gpu, f"row remap failed{count} (expected no failure)",
                                         action="remove"))
        elif sample.remap_pending:
            found.append(gpu_observation(params, sample.gpu, "row remap pending (expected none: a GPU reset "
                                         "applies it)"))
    return found


CHECK = Check("row-remap", "nvml", polled=judge)
