"""The dev cluster's `nvidia-smi`, for its GPU resets: `nvidia-smi --gpu-reset -i N` (or `-r -i N`).

The dev cluster's nodes have fake GPUs (fakenvml: a spec file per node, SLURM_EXT_FAKE_NVML in the node agent's
environment), so an approved reset-gpu repair runs this in place of NVIDIA's tool (the dev cluster's
health.gpu_reset_command names it). It does what a reset does to the faults a spec can hold: GPU N's entry becomes a
healthy GPU's again (its identity kept: UUID, bus id, minor, serial), which the node's health monitor then reads.
Each call appends its arguments to `nvidia-smi.log` beside the spec (one JSON list a line), so a test sees what ran
and how often; while a file `nvidia-smi.fail` lies beside the spec it fails as the real tool does when it cannot
reset (exit 1, its words on stdout), and changes nothing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from . import fakenvml

__all__ = ["main", "LOG_NAME", "FAIL_NAME", "reset_gpu_in_spec"]

#: beside the spec: every call's arguments, one JSON list a line
LOG_NAME = "nvidia-smi.log"
#: beside the spec: while it exists, every reset fails
FAIL_NAME = "nvidia-smi.fail"
#: what stays of a GPU's entry through a reset: who it is
_IDENTITY = ("uuid", "pci_bus_id", "minor", "name", "serial", "pci_device_id", "cpu_affinity")


def reset_gpu_in_spec(spec_path: Path, gpu: int) -> None:
    """GPU `gpu` of the spec healthy again, as a reset leaves it (events kept: NVML's event list only grows).

    Raises:
        IndexError: the spec has no such GPU."""
    spec = json.loads(spec_path.read_text())
    gpus = spec["gpus"]
    entry = gpus[gpu]
    healthy = fakenvml.default_gpus(len(gpus), entry.get("name", "NVIDIA H200"))["gpus"][gpu]
    gpus[gpu] = {**healthy, **{key: entry[key] for key in _IDENTITY if key in entry}}
    fakenvml.write_spec(spec_path, spec)


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
    if not index.isdigit():
        print(f"Invalid GPU index: {index}", file=sys.stderr)
        return 2
    if (spec_path.parent / FAIL_NAME).exists():
        print(f"Unable to reset GPU {index}: the GPU is in use by another client (dev cluster: "
              f"{spec_path.parent / FAIL_NAME} says so).")
        return 1
    try:
        reset_gpu_in_spec(spec_path, int(index))
    except IndexError:
        print(f"No devices were found with index {index}", file=sys.stderr)
        return 6
    print(f"GPU {index} was successfully reset (dev cluster: {spec_path}).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
