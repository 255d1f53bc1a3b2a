"""Fewer GPUs than the node's baseline: the other face of a GPU off the bus, after the driver dropped it."""

from ..check import Check, View
from ..records import Observation
from ..settings import Params


def judge(view: View, params: Params) -> list:
    snapshot = view.latest
    if snapshot is None or snapshot.error is not None:
        return None  # NVML did not answer: no verdict (the nvml check judges that), not "all GPUs back"
    if not snapshot.baseline:
        return []
    seen = {sample.gpu.uuid for sample in snapshot.gpus}
    missing = [uuid for uuid in snapshot.baseline if uuid not in seen]
    if not missing:
        return []
    more = f" +{len(missing) - 1} more" if len(missing) > 1 else ""
    return [Observation(params.id, "node", params.severity, params.action,
                        f"{len(seen)} gpus, missing {missing[0]}{more} (expected {len(snapshot.baseline)})",
                        fields={"missing": missing})]


CHECK = Check("gpu-count", "nvml", polled=judge)
