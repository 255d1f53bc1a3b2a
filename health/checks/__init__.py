"""The checks, one module each; `REGISTRY` lists them in the order settings.CHECKS has them."""

from ..settings import CHECKS
from . import (ecc, fabric, filesystem, foreign_drain, gpu_count, gpu_lost, kernel, link_down, link_flap,
               nvlink, nvlink_errors, nvml_failing, pcie_link, pcie_replay, persistence, retired_pages, row_remap,
               slurmd, sxid, temperature, throttle, xid)

__all__ = ["REGISTRY", "markdown_table"]

_MODULES = (gpu_lost, gpu_count, xid, sxid, fabric, throttle, temperature, row_remap, ecc, retired_pages, nvlink,
            nvlink_errors, pcie_link, pcie_replay, persistence, nvml_failing, link_down, link_flap, filesystem,
            kernel, slurmd, foreign_drain)

#: check id -> Check, in the order of settings.CHECKS
REGISTRY = {check.id: check for check in sorted((m.CHECK for m in _MODULES), key=lambda c: list(CHECKS).index(c.id))}

assert list(REGISTRY) == list(CHECKS), "every check in settings.CHECKS has a module, and no other"


def markdown_table() -> str:
    """docs/operator/health.md's table of the checks' defaults, one row per check, from CHECKS and the modules."""
    rows = ["| check | reader | severity | action | threshold | window | hold | quiet | what |",
            "|---|---|---|---|---|---|---|---|---|"]
    for check_id, check in REGISTRY.items():
        d = CHECKS[check_id]
        threshold = f"`{d.threshold}`" if d.threshold is not None else ""
        rows.append(f"| `{check_id}` | {check.source} | {d.severity} | {d.action} | {threshold} | {_span(d.window)} | "
                    f"{_span(d.hold)} | {_span(d.quiet)} | {d.doc} |")
    return "\n".join(rows) + "\n"


def _span(seconds: float) -> str:
    if not seconds:
        return ""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"

