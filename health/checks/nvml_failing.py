"""NVML itself failing: `threshold` polls in a row whose reads failed or hung.

A single failed or slow call is not a GPU fault (the monitor's own trouble
must never drain a healthy node); NVML failing poll after poll is a node
whose jobs cannot use their GPUs either. Lost GPUs are gpu-lost's. A GPU
that answers but fails one of its calls poll after poll (a driver that
answers a call this code does not expect) is a warning: its other readings
are still judged, and a call we read wrongly must not drain a healthy node.
"""

from slurm_ext import nvml

from ..check import Check, View
from ..records import Observation
from ..settings import Params

_LOST = (nvml.GPU_IS_LOST, nvml.RESET_REQUIRED)


def failure_of(snapshot) -> str:
    """What failed in one snapshot so that a GPU could not be read at all ('' when NVML answered)."""
    if snapshot.error is not None:
        return snapshot.error_text or f"nvml error {snapshot.error}"
    failed = [s for s in snapshot.gpus if s.error is not None and s.error not in _LOST]
    if not failed:
        return ""
    # the reader's error_text already names the GPU ("gpu 0: ...")
    return failed[0].error_text or f"gpu {failed[0].gpu.index}: nvml error {failed[0].error}"


def calls_failed(snapshot) -> str:
    """The calls that failed for GPUs that otherwise answered ('' when none did)."""
    return "; ".join(f"gpu {s.gpu.index} {call}" for s in snapshot.gpus for call in s.failed)


def judge(view: View, params: Params) -> list:
    needed = int(params.threshold)
    recent = view.snapshots[-needed:]
    if needed < 1 or len(recent) < needed:
        return []
    failures = [failure_of(s) for s in recent]
    if all(failures):
        return [Observation(params.id, "node", params.severity, params.action,
                            f"nvml failed {needed} polls in a row (limit {needed - 1:g}): {failures[-1]}")]
    partial = [failure_of(s) or calls_failed(s) for s in recent]
    if all(partial):
        return [Observation(params.id, "calls", "warning", "none",
                            f"nvml calls failed {needed} polls in a row (limit {needed - 1:g}): {partial[-1]}")]
    return []


CHECK = Check("nvml", "nvml", polled=judge)
