"""The faults `slurm-ext dev inject` makes, by name: what `dev inject --help` lists.

Apart from devcluster.drills, which makes them, so that building the command line's parser (every `slurm-ext`
process, the agent and its workers included) does not import the drills and, through them, the fake NVML's
modules: that cost every process about 5 MB of memory (bench_supervisor, bench_health).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Kind", "KINDS", "FS_SIZE"]

#: the size of the tmpfs fs-full fills: full whatever the filesystem check's threshold
FS_SIZE = "16m"


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of fault a drill makes."""

    #: what the drill does, in the words of `dev inject --help`
    doc: str
    #: a fault of one GPU (`--gpu N`, default 0)
    gpu: bool
    #: the health checks whose findings it makes
    checks: tuple[str, ...]


#: every fault a drill makes; `xid-NN` stands for any Xid number
KINDS: dict[str, Kind] = {
    "xid-NN": Kind("Xid NN on the GPU, as NVML's event set delivers it (79 fallen off the bus, 48 double-bit ECC, "
                   "94/95 contained/uncontained ECC, 63/64 row remapping)", True, ("xid",)),
    "gpu-lost": Kind("the GPU has fallen off the bus: NVML answers GPU_IS_LOST for it", True, ("gpu-lost",)),
    "ecc": Kind("a double-bit (uncorrectable) ECC error: volatile and aggregate counts 1 and a row remap pending",
                True, ("ecc", "row-remap")),
    "throttle": Kind("the GPU held in hardware thermal slowdown (clocks event reasons HW slowdown + HW thermal)",
                     True, ("throttle",)),
    "nvlink-down": Kind("the GPU's last active NVLink inactive", True, ("nvlink",)),
    "link-down": Kind("the node's watched interface down: lo of the node's own network namespace, never the host's",
                      False, ("link-down",)),
    "fs-full": Kind(f"a file system of the node's health.paths full: a {FS_SIZE[:-1]} MiB tmpfs mounted on the "
                    "node's drill-fs directory, filled", False, ("filesystem",)),
    "stuck-bit": Kind("a bit of the GPU's memory stuck at 0 (the fake libcuda's stuck_bits): no passive check sees it; "
                      "the acceptance memory test fails it (`slurm-ext accept run`, the node's next start with "
                      "[acceptance] enabled)", True, ()),
    "slurmd-hang": Kind("the node's slurmd stopped (SIGSTOP, by its pidfile): Slurm's pings time out", False,
                        ("slurmd",)),
}
