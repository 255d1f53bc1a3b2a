"""File systems the node needs (health.paths): writable, readable, not full."""

from ..check import Check, View
from ..records import Observation
from ..settings import Params


def judge(view: View, params: Params) -> list:
    found = []
    for sample in view.filesystems:
        if sample.error:
            evidence = f"{sample.path} unreadable: {sample.error} (expected readable)"
        elif sample.read_only:
            evidence = f"{sample.path} read-only (expected writable)"
        elif sample.free_bytes is not None and sample.total_bytes:
            need = params.threshold * sample.total_bytes if params.relative else params.threshold
            if sample.free_bytes >= need:
                continue
            evidence = f"{sample.path} {_size(sample.free_bytes)} free (limit {_size(need)})"
        else:
            continue
        found.append(Observation(params.id, sample.path, params.severity, params.action, evidence,
                                 fields={"path": sample.path}))
    return found


def _size(count: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return f"{count:.0f}B"


CHECK = Check("filesystem", "filesystem", polled=judge)
