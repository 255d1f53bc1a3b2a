"""Kernel hung tasks and soft lockups: a CPU or a task stuck in the kernel (often a driver, a file system)."""

from slurm_ext.config import format_duration

from ..check import Check, View
from ..records import KernelHang, Observation
from ..settings import Params


def judge(hang: KernelHang, view: View, params: Params) -> list:
    if hang.kind == "soft-lockup":
        return [Observation(params.id, "soft-lockup", params.severity, params.action,
                            "soft lockup", detail=hang.text, fields={"expected": "none"})]
    count = 1 + sum(1 for old in view.recent if isinstance(old, KernelHang) and old.kind == "hung-task"
                    and hang.time - old.time <= params.window)
    critical = count >= params.threshold
    return [Observation(params.id, "hung-task", params.severity if critical else "warning",
                        params.action if critical else "none",
                        f"{count} hung tasks in {format_duration(params.window)} (limit {params.threshold - 1:g})",
                        detail=hang.text)]


CHECK = Check("kernel", "kernel", on_event=judge, events=(KernelHang,))
