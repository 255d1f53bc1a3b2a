"""Error counters judged as a rate over a window (NVLink CRC and replays, PCIe replays): a counter that
only ever grows says nothing by its value, a counter growing fast says a link is going bad."""

from slurm_ext.config import format_duration

from ..check import View, gpu_observation
from ..settings import Params


def counter_rate(view: View, params: Params, field: str, what: str) -> list:
    """Observations for GPUs whose `field` grew faster than the threshold (per second) over the window."""
    snapshots = view.window(params.window)
    if not snapshots or len(snapshots) < 2:
        return None  # not watched for a window yet: no verdict
    start, newest = snapshots[0], snapshots[-1]
    span = newest.time - start.time
    before = {sample.gpu.uuid: getattr(sample, field) for sample in start.gpus}
    found = []
    for sample in newest.gpus:
        now, then = getattr(sample, field), before.get(sample.gpu.uuid)
        if now is None or then is None or now < then:  # a counter reset (driver reload) is no rate
            continue
        rate = (now - then) / span
        if rate > params.threshold:
            found.append(gpu_observation(params, sample.gpu, f"{what} {_per_unit(rate)} over "
                                         f"{format_duration(span)}",
                                         f"at most {_per_unit(params.threshold)}"))
    return found


def _per_unit(rate: float) -> str:
    for unit, size in (("s", 1), ("m", 60), ("h", 3600)):
        if rate * size >= 1:
            return f"{rate * size:.3g}/{unit}"
    return f"{rate * 3600:.3g}/h"
