"""The dev cluster's `nvidia-smi`, for its GPU resets: `nvidia-smi --gpu-reset -i N` (or `-r -i N`).

The dev cluster's nodes have fake GPUs (fakenvml: a spec file per node, SLURM_EXT_FAKE_NVML in the node agent's
environment), so an approved reset-gpu repair runs this in place of NVIDIA's tool (the dev cluster's
health.gpu_reset_command names it). It does to GPU N's entry what NVIDIA documents a reset does, no more:

- volatile ECC counts go to 0 (they count since the driver loaded the GPU); aggregate counts persist;
- a pending row remap or page retirement is applied: pending goes to 0, the rows and pages stay remapped or retired
  (a remap failure stays: that GPU is for the vendor);
- a "reset required" state ends: NVML's RESET_REQUIRED (`query_error`) and a recovery action of GPU reset or drain
  and reset (`gpu_recovery_action` 1, 4) are gone; a node reboot's (2) is not;
- throttling, NVLinks, a lost GPU and the Xid events already delivered are not touched.

It refuses, changing nothing, as the real tool does: a GPU that has fallen off the bus (`lost`: exit 15, "GPU is
lost"; a reboot recovers it), a GPU a process holds (a `processes` or `graphics_processes` entry, a `while_alive`
one only while its process lives: "In use by another client", exit 255, nvidia-smi's "other error"), a GPU that is
not there (exit 6, "No devices were found"). Each call appends its arguments to `nvidia-smi.log` beside the spec (one
JSON list a line), so a test sees what ran and how often; while a file `nvidia-smi.fail` lies beside the spec every
reset fails as for a GPU in use (a holder NVML does not list).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from . import fakenvml

__all__ = ["main", "LOG_NAME", "FAIL_NAME", "reset_gpu_in_spec", "ResetRefused"]

#: beside the spec: every call's arguments, one JSON list a line
LOG_NAME = "nvidia-smi.log"
#: beside the spec: while it exists, every reset fails as for a GPU in use
FAIL_NAME = "nvidia-smi.fail"
#: nvidia-smi's exit statuses (its man page, RETURN VALUE)
EXIT_NOT_FOUND, EXIT_GPU_LOST, EXIT_OTHER = 6, 15, 255
#: gpu_recovery_action values a reset satisfies: NVML_GPU_RECOVERY_ACTION_GPU_RESET, _DRAIN_AND_RESET
_RESET_ACTIONS = (1, 4)
#: NVML_ERROR_RESET_REQUIRED, by code or name as a spec may give it
_RESET_REQUIRED = (16, "RESET_REQUIRED", "NVML_ERROR_RESET_REQUIRED")
_IN_USE = ("{count} device is currently being used by one or more other processes (e.g., Fabric Manager, CUDA "
           "application, graphics application such as an X server, or a monitoring application such as another "
           "instance of nvidia-smi). Please first kill all processes using this device and all compute applications "
           "running in the system.")


class ResetRefused(Exception):
    """The reset was refused, as nvidia-smi refuses it: its words and exit status."""

    def __init__(self, words: str, status: int):
        self.words, self.status = words, status
        super().__init__(words)


def reset_gpu_in_spec(spec_path: Path, gpu: int, *, in_use: bool = False) -> str:
    """Reset GPU `gpu` of the spec as NVIDIA's tool resets a GPU; its bus id. `in_use`: a holder the spec does not
    list (nvidia-smi.fail).

    Raises:
        ResetRefused: no such GPU, the GPU is lost or held by a process (the spec unchanged).
    """
    spec = json.loads(spec_path.read_text())
    gpus = spec.get("gpus") or []
    if not 0 <= gpu < len(gpus):
        raise ResetRefused("No devices were found", EXIT_NOT_FOUND)
    entry = gpus[gpu]
    bus = entry.get("pci_bus_id") or f"GPU {gpu}"
    if entry.get("lost"):
        raise ResetRefused(f"Unable to determine the device handle for GPU {bus}: GPU is lost.  Reboot the system "
                           "to recover this GPU", EXIT_GPU_LOST)
    if in_use or _held(entry):
        raise ResetRefused(f"The following GPUs could not be reset:\n  GPU {bus}: In use by another client\n\n"
                           + _IN_USE.format(count=1), EXIT_OTHER)
    gpus[gpu] = _after_reset(entry)
    fakenvml.write_spec(spec_path, spec)
    return bus


def _held(entry: dict) -> bool:
    """Whether a process the fake NVML lists uses the GPU (a `while_alive` one only while its pid lives)."""
    listed = list(entry.get("processes") or []) + list(entry.get("graphics_processes") or [])
    return any(not process.get("while_alive") or _alive(int(process["pid"])) for process in listed)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


def _after_reset(entry: dict) -> dict:
    after = dict(entry)
    ecc = entry.get("ecc") or {}
    after["ecc"] = {**ecc, "volatile": {"corrected": 0, "uncorrected": 0}}
    if "remapped_rows" in entry:
        after["remapped_rows"] = {**entry["remapped_rows"], "pending": 0}
    if "retired_pages_pending" in entry:
        after["retired_pages_pending"] = 0
    query_error = entry.get("query_error")
    if isinstance(query_error, str) and query_error.upper() in _RESET_REQUIRED or query_error in _RESET_REQUIRED:
        after["query_error"] = None
    if entry.get("gpu_recovery_action") in _RESET_ACTIONS:
        after["gpu_recovery_action"] = 0
    return after


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    spec_path = Path(os.environ.get(fakenvml.SPEC_ENV, ""))
    if not spec_path.name:
        print(f"nvidia-smi (dev cluster): {fakenvml.SPEC_ENV} is not set: no fake GPUs to reset", file=sys.stderr)
        return 2
    with open(spec_path.parent / LOG_NAME, "a") as log:
        log.write(json.dumps(args) + "\n")
    if not ({"--gpu-reset", "-r"} & set(args)) or "-i" not in args or args.index("-i") + 1 >= len(args):
        print("nvidia-smi (dev cluster): only --gpu-reset -i N (or -r -i N) is played here", file=sys.stderr)
        return 2
    index = args[args.index("-i") + 1]
    if not index.isascii() or not index.isdigit():
        print(f"Invalid GPU index: {index}", file=sys.stderr)
        return 2
    try:
        bus = reset_gpu_in_spec(spec_path, int(index), in_use=(spec_path.parent / FAIL_NAME).exists())
    except ResetRefused as refused:
        print(refused.words)
        return refused.status
    print(f"GPU {bus} was successfully reset.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
