"""gres.conf, the node's Gres= string, and a file writer that leaves unchanged files alone.

Main API:

- `gres_conf(inventory, node)` is the gres.conf text: a comment header
  saying who wrote it, when, for which driver and which GPUs, then one
  `NodeName=... Name=gpu Type=... File=...` line per GPU (per MIG device
  for GPUs in MIG mode, with `MultipleFiles=`), in inventory order, which is
  the order Slurm numbers them in.
- `gres_string(inventory)` is the node's `Gres=` for slurm.conf ("gpu:h200:8"),
  `dynamic_node_conf(inventory)` what `slurmd -Z --conf "..."` takes.
- `write_if_changed(path, text)` replaces a file atomically, only when its
  content changed; `differs(path, text)` says whether it would.

The header's time: the header carries a line ``# generated at: <UTC time>``
(`TIME_PREFIX`). Comparing whole texts would make every start differ, so
every file rewrite (and slurmd restart or drift alarm hanging on it) would
happen for nothing. `differs` and `write_if_changed` therefore ignore lines
that start with `TIME_PREFIX` when comparing, and nothing else: an unchanged
inventory leaves the file, its mtime and its time line untouched, so the
time line says when the content last changed. The time lives in the text
(rather than only in the file's mtime) because gres.conf is copied around
(configless setups, support bundles) and mtimes do not survive that.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from slurm_ext.fileio import atomic_write

from .inventory import Inventory, InventoryGpu
from .topology import ranges

__all__ = [
    "TIME_PREFIX",
    "gres_conf",
    "gres_string",
    "dynamic_node_conf",
    "gres_types",
    "differs",
    "write_if_changed",
]

#: Start of the header line holding the generation time; ignored when comparing texts.
TIME_PREFIX = "# generated at: "


def gres_conf(inventory: Inventory, node: str, *, generator: str = "slurm-ext gres generate",
              now: float | None = None) -> str:
    """The gres.conf text for `node` (ends with a newline).

    Per GPU: ``NodeName=<node> Name=gpu Type=<type> File=<device>
    Cores=<cores> Links=<links>``. Cores= is left out when the GPU's cores
    are unknown or are every core of the node (Slurm then allows any core,
    which is the same thing and survives a topology read failure). Links= is
    left out when no GPU has an NVLink to another (PCIe cards), and when any
    GPU is in MIG mode: Links= positions count gres.conf records, which MIG
    devices no longer match one to one, and MIG devices have no peer-to-peer
    NVLink anyway.

    A GPU in MIG mode gets one line per MIG device instead, of type
    ``<type>_<profile>`` with ``MultipleFiles=`` (the GPU's device and its
    nvidia-caps files), so Slurm hands out and isolates MIG devices; with no
    MIG devices it gets no line (the inventory's problems say so). Lost GPUs
    and problems are listed in the header, for whoever reads the file.
    `now` (seconds since the epoch, default: the current time) is the header
    time.
    """
    stamp = datetime.fromtimestamp(time.time() if now is None else now, timezone.utc)
    lines = [
        f"# gres.conf for {node}, written by {generator}; edits are overwritten",
        f"{TIME_PREFIX}{stamp.strftime('%Y-%m-%dT%H:%M:%SZ')}",
        f"# NVIDIA driver {inventory.driver_version}",
    ]
    for index, gpu in enumerate(inventory.gpus):
        lines.append(f"# gpu {index}: {gpu.uuid}, {gpu.pci_bus_id}, minor {gpu.minor}, {gpu.name}"
                     + (f" (NVML index {gpu.nvml_index})" if gpu.nvml_index != index else ""))
        lines.extend(f"#   mig gi {m.gpu_instance} ci {m.compute_instance}: {m.uuid}, {m.profile}" for m in gpu.mig)
    lines.extend(f"# lost: {line}" for line in inventory.lost)
    lines.extend(f"# problem: {line}" for line in inventory.problems)

    any_mig = any(gpu.mig_mode for gpu in inventory.gpus)
    with_links = not any_mig and any(n > 0 for gpu in inventory.gpus for n in gpu.links)
    for gpu in inventory.gpus:
        cores = _cores(gpu, inventory.core_count, inventory.socket_count)
        if gpu.mig_mode:
            for mig in gpu.mig:
                lines.append(f"NodeName={node} Name=gpu Type={gpu.type}_{mig.profile} "
                             f"MultipleFiles={','.join(mig.files)}{cores}")
            continue
        links = f" Links={','.join(str(n) for n in gpu.links)}" if with_links else ""
        lines.append(f"NodeName={node} Name=gpu Type={gpu.type} File={gpu.device}{cores}{links}")
    return "\n".join(lines) + "\n"


def gres_string(inventory: Inventory) -> str:
    """The node's Gres= value: "gpu:<type>:<count>" per type, sorted by type,
    comma-separated ("gpu:a100:2,gpu:h200:6"); MIG devices count under their
    MIG types; "" when there is nothing (slurm.conf's Gres= takes no empty
    entries)."""
    counts = Counter(kind for gpu in inventory.gpus for kind in gres_types(gpu))
    return ",".join(f"gpu:{kind}:{counts[kind]}" for kind in sorted(counts))


def dynamic_node_conf(inventory: Inventory, extra: str = "") -> str:
    """The ``slurmd -Z --conf`` value: "Gres=gpu:h200:8", then `extra` (other
    node settings, e.g. "Feature=hopper") after a space. Without GPUs there is
    no Gres= at all: "Gres=" with nothing after it is not a valid setting."""
    gres = gres_string(inventory)
    return " ".join(part for part in (f"Gres={gres}" if gres else "", extra.strip()) if part)


def differs(path: Path, text: str) -> bool:
    """Whether `path` holds something other than `text`, time line aside (see
    the module docstring). A missing file differs.

    Raises:
        OSError: the file exists but cannot be read (a directory in the way,
            no permission).
    """
    try:
        old = Path(path).read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return True
    return _without_time(old) != _without_time(text)


def write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    """Replace `path` with `text` unless only the time line would change.

    Returns True when the file was written, False when its content already
    matched (the file, its mode and its mtime are then left alone). The
    write is `fileio.atomic_write`'s, durable: slurmd (or a crash) sees the
    old file or the new one, never half of one.

    Raises:
        OSError: the file cannot be read, written or renamed into place (the
            caller reports it; the old file is then untouched and no
            temporary file is left behind).
    """
    path = Path(path)
    if not differs(path, text):
        return False
    atomic_write(path, text, mode=mode)
    return True


def _without_time(text: str) -> list[str]:
    return [line for line in text.split("\n") if not line.startswith(TIME_PREFIX)]


def gres_types(gpu: InventoryGpu) -> list[str]:
    """The gres types `gpu` is counted under, one entry per GRES: its own
    type, or in MIG mode "<type>_<profile>" per MIG device (none when MIG
    mode is on without MIG devices: such a GPU runs no CUDA job whole)."""
    if gpu.mig_mode:
        return [f"{gpu.type}_{mig.profile}" for mig in gpu.mig]
    return [gpu.type]


def _cores(gpu: InventoryGpu, core_count: int, sockets: int = 0) -> str:
    """" Cores=..." or "" (unknown, or every core of the node).

    With the sockets known, the cores are widened to the one socket that holds
    them, and left out when they span sockets: Slurm schedules GPUs by socket,
    and from 24.11 on slurmctld refuses any other Cores= ("GRES core
    specification ... doesn't match socket boundaries", node INVALID_REG),
    which NVML's NUMA-sized affinity (AMD NPS4, Intel SNC) would otherwise
    give. Slurm numbers cores socket by socket, core_count / sockets each.
    """
    cores = set(gpu.cores)
    if cores and core_count and sockets and core_count % sockets == 0:
        per = core_count // sockets
        sockets_held = {core // per for core in cores if core < core_count}
        socket = min(sockets_held) if len(sockets_held) == 1 else None
        cores = set(range(socket * per, (socket + 1) * per)) if socket is not None else set()
    if not cores or (core_count and cores >= set(range(core_count))):
        return ""
    return f" Cores={ranges(sorted(cores))}"
