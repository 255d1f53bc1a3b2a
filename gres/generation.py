"""Rebuild gres.conf from NVML and judge the node's GPUs: `slurm-ext gres generate` and the start step.

Each run reads the inventory, compares it with the baseline kept in
`<node.state_dir>/gres/baseline.json` (every GPU this node has had, by UUID,
including the ones missing now), writes gres.conf only when its content
changed, and says which drain the node needs: a missing or lost GPU, or
fewer GPUs than `gres.expected`, keeps the node out of service with an
owned reason rather than letting slurmd register the wrong count. A GPU
stays in the baseline until it is back or an operator accepts the new
hardware (`slurm-ext gres generate --accept`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from slurm_ext.config import Config

from . import render
from .drift import Drift, compare
from .inventory import GresError, Inventory, read_inventory

__all__ = ["Generation", "generate", "output_path"]

@dataclass(frozen=True, slots=True)
class Generation:
    #: None when NVML could not be read at all
    inventory: Inventory | None
    drift: Drift
    path: Path
    #: the gres.conf text (empty when there is no inventory)
    text: str
    #: the file was (or, with dry_run, would be) rewritten
    changed: bool
    #: the drain reason the node needs now (without the slurm-ext: prefix; a gres kind of
    #: slurm_ext.nodestate's catalogue), or None when it is fit
    drain: str | None

    @property
    def gres(self) -> str:
        return render.gres_string(self.inventory) if self.inventory else ""


def output_path(config: Config, environ: dict[str, str] | None = None) -> Path:
    """gres.output, else gres.conf beside slurm.conf (the only place Slurm reads it)."""
    if config.gres.output:
        return Path(config.gres.output)
    return config.slurm.conf_path(environ).parent / "gres.conf"


def generate(config: Config, node: str, *, emit: Callable[..., object], dry_run: bool = False, accept: bool = False,
             nvml=None, sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc")) -> Generation:
    """Read NVML, compare, write gres.conf if it changed; see the module docstring.

    `emit(event, message, severity, **fields)` records events. With
    `dry_run` nothing is written (neither gres.conf nor the baseline).

    Raises:
        OSError: gres.conf or the baseline cannot be written (the message names the path).
    """
    path = output_path(config)
    baseline_file = Path(config.node.state_dir) / "gres" / "baseline.json"
    known = {} if accept else _load_baseline(baseline_file)
    expected = config.gres.expected
    try:
        inventory = read_inventory(nvml=nvml, dev_dir=Path(config.gres.dev_dir), types=config.gres.types,
                                   sys_root=sys_root, proc_root=proc_root)
    except GresError as err:
        emit("inventory-failed", f"cannot read the GPUs through NVML: {err}; gres.conf left as it is",
             "error" if expected else "warning")
        drain = f"gpu inventory failed: {err}" if expected else None
        return Generation(None, Drift(), path, "", False, drain)
    current = {gpu.uuid: (gpu.pci_bus_id, gpu.minor) for gpu in inventory.gpus}
    drift = compare(known, current)
    _report(inventory, drift if known else Drift(), emit)
    if not known:  # the first inventory of this node (or an accepted one): every GPU is "new", say it once
        emit("gpu-baseline", f"{len(current)} GPUs are this node's from now on: "
             f"{render.gres_string(inventory) or 'none'}", "info")
    text = render.gres_conf(inventory, node)
    changed = render.differs(path, text)
    if not dry_run:
        if changed:
            path.parent.mkdir(parents=True, exist_ok=True)  # /etc/slurm-local on a configless node
            render.write_if_changed(path, text)
            emit("gres-written", f"{path}: {render.gres_string(inventory) or 'no GPUs'}", "info", path=str(path))
        remembered = {**{m.uuid: (m.pci_bus_id, known[m.uuid][1]) for m in drift.missing}, **current}
        _save_baseline(baseline_file, remembered)
    return Generation(inventory, drift, path, text, changed, _drain_reason(inventory, drift, expected))


def _report(inventory: Inventory, drift: Drift, emit: Callable[..., object]) -> None:
    for missing in drift.missing:
        emit("gpu-missing", f"gpu {missing} was here before and NVML does not show it now", "error",
             uuid=missing.uuid, pci_bus_id=missing.pci_bus_id)
    for uuid in drift.new:
        emit("gpu-new", f"gpu {uuid} is new on this node", "info", uuid=uuid)
    for uuid, old, new in drift.renumbered:
        emit("gpu-renumbered", f"gpu {uuid} moved from /dev/nvidia{old} to /dev/nvidia{new}: gres.conf follows",
             "warning", uuid=uuid)
    for lost in inventory.lost:
        emit("gpu-lost", f"gpu left out of gres.conf: {lost}", "error")
    for problem in inventory.problems:
        emit("inventory-problem", problem, "warning")


def _drain_reason(inventory: Inventory, drift: Drift, expected: int) -> str | None:
    if drift.missing:
        more = f" and {len(drift.missing) - 1} more" if len(drift.missing) > 1 else ""
        return f"gpu missing: {drift.missing[0]}{more}"
    if inventory.lost:
        return f"gpu lost during inventory: {inventory.lost[0]}"
    if expected and len(inventory.gpus) < expected:
        return f"gpus fewer than expected: {len(inventory.gpus)} of {expected}"
    return None


def baseline(state_dir: str) -> dict[str, tuple[str, int]]:
    """The node's baseline, {uuid: (pci bus id, minor)}: every GPU it has had (empty before its first inventory)."""
    return _load_baseline(Path(state_dir) / "gres" / "baseline.json")


def _load_baseline(path: Path) -> dict[str, tuple[str, int]]:
    try:
        data = json.loads(path.read_text())
        return {uuid: (bus, int(minor)) for uuid, (bus, minor) in data["gpus"].items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # unreadable: start over from what NVML shows (the event log keeps the history)


def _save_baseline(path: Path, gpus: dict[str, tuple[str, int]]) -> None:
    text = json.dumps({"gpus": {uuid: list(value) for uuid, value in gpus.items()}}, sort_keys=True) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    render.write_if_changed(path, text, mode=0o600)
