"""NVLinks down: fewer active links than expected, per GPU.

Expected is `threshold` links, or with 0 the most this GPU has shown this
boot (the monitor keeps it across its restarts; `health clear --check nvlink`
forgets it): an H100 PCIe with its bridge has 12 links of 18, an HGX H100
all 18, and a fixed number would be wrong for one of them.
"""

from ..check import Check, View, gpu_observation
from ..settings import Params


def judge(view: View, params: Params) -> list:
    snapshot = view.latest
    found = []
    for sample in snapshot.gpus if snapshot else ():
        if sample.nvlink_active is None:
            continue
        expected = int(params.threshold) or view.nvlink_seen.get(sample.gpu.uuid, 0)
        if sample.nvlink_active < expected:
            found.append(gpu_observation(params, sample.gpu, f"NVLink down: {sample.nvlink_active} of {expected} "
                                         "active", f"{expected} active"))
    return found


CHECK = Check("nvlink", "nvml", polled=judge)
