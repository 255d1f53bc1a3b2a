"""Page retirement (GPUs before Ampere, which retire pages instead of remapping rows)."""

from ..check import Check, View, gpu_observation
from ..settings import Params


def judge(view: View, params: Params) -> list:
    snapshot = view.latest
    found = []
    for sample in snapshot.gpus if snapshot else ():
        if sample.retired_pages is not None and sample.retired_pages >= params.threshold:
            found.append(gpu_observation(params, sample.gpu, f"{sample.retired_pages} retired pages",
                                         f"at most {params.threshold - 1:g}"))
        elif sample.retired_pending:
            found.append(gpu_observation(params, sample.gpu, "pending retirement (a GPU reset applies it)",
                                         "none", action="reset-gpu"))
    return found


CHECK = Check("retired-pages", "nvml", polled=judge)
