"""Every acceptance test: its area, the levels it runs at, where its code is and which limits it reads.

One row per test, so that `accept run --help`, the config's [acceptance.tests.<test>] validation,
docs/operator/acceptance.md and the runner read one table. A test's code is named, not imported:
it runs in a child process of its own (slurm_ext.acceptance.child), so that a GPU fault or a
crashing library ends that child, never the node agent.
"""

from __future__ import annotations

from dataclasses import dataclass

from .records import LEVELS

__all__ = ["TestSpec", "TESTS", "DEADLINES", "LIMIT_UNITS", "Given", "specs_for", "limit_words"]

_ALL = LEVELS
_LONGER = ("standard", "extended")


@dataclass(frozen=True, slots=True)
class TestSpec:
    name: str
    area: str
    levels: tuple[str, ...]
    #: "module:function" under slurm_ext.acceptance; the function takes a Given and returns a list of Results
    entry: str
    #: the limits it judges by: keys of a profile (slurm_ext.acceptance.profiles), overridable per test in
    #: [acceptance.tests.<test>] limits
    limits: tuple[str, ...] = ()
    doc: str = ""

    __test__ = False  # not a pytest class


#: each limit's unit, said wherever a limit is named (`accept list`, a refused key): `_gbps` keys of GPU copies are
#: gigabytes a second, rdma_gbps gigabits (perftest's and InfiniBand's own unit, as [acceptance.interfaces] speed)
LIMIT_UNITS = {"gpu_count": "GPUs", "memory_gib": "GiB", "driver_major": "driver major version",
               "nvlink_links": "active links per GPU", "memory_bad_bytes": "bytes", "h2d_gbps": "GB/s",
               "d2h_gbps": "GB/s", "d2d_gbps": "GB/s, read + written", "pcie_gen": "PCIe generation",
               "pcie_width": "lanes", "p2p_gbps": "GB/s", "burn_sm_clock_mhz": "MHz",
               "burn_throttled_share": "share of samples, 0-1", "nccl_busbw_gbps": "GB/s, 8 GPUs",
               "rdma_gbps": "Gb/s (bits)", "fsync_ms": "ms, at most", "write_mbps": "MB/s", "read_mbps": "MB/s"}

#: how long a test may run at each level before its child is killed (an error result, never a drain);
#: [acceptance.tests.<test>] deadline overrides it
DEADLINES = {"quick": 60.0, "standard": 300.0, "extended": 3600.0}

TESTS: dict[str, TestSpec] = {spec.name: spec for spec in (
    TestSpec("gpu-inventory", "gpu", _ALL, "gpunvml:inventory",
             ("gpu_count", "memory_gib", "driver_major"),
             "NVML: the GPUs' count and SKU against the profile, driver and VBIOS versions, persistence, ECC mode, "
             "row remapping (pending: reset-gpu; failed: remove) and retired pages"),
    TestSpec("gpu-nvlink", "gpu", _ALL, "gpunvml:nvlink", ("nvlink_links",),
             "NVML: active NVLinks per GPU against the profile (not applicable on a part without NVLink)"),
    TestSpec("gpu-memory", "gpu", _ALL, "gpucuda:memory", ("memory_bad_bytes",),
             "libcuda: patterns, address-in-address and walking bits over most of each GPU's free memory, written "
             "and checked by PTX kernels the driver compiles; a fail names the GPU and the address range"),
    TestSpec("gpu-bandwidth", "gpu", _ALL, "gpucuda:bandwidth",
             ("h2d_gbps", "d2h_gbps", "d2d_gbps", "pcie_gen", "pcie_width"),
             "libcuda: pinned host-to-device and device-to-host copies, device-to-device copies, and the PCIe "
             "generation and width NVML shows under that load"),
    TestSpec("gpu-p2p", "gpu", _LONGER, "gpucuda:p2p", ("p2p_gbps",),
             "libcuda: peer-to-peer copy bandwidth between each pair of the node's GPUs (not applicable with one)"),
    TestSpec("gpu-burn", "gpu", _LONGER, "gpucuda:burn", ("burn_sm_clock_mhz", "burn_throttled_share"),
             "libcuda: a compute burn on every GPU at once while NVML's clocks, power and throttle reasons are "
             "sampled: the SM clock must hold and no hardware slowdown show"),
    TestSpec("gpu-nccl", "gpu", _LONGER, "gpunccl:allreduce", ("nccl_busbw_gbps",),
             "NVIDIA's NCCL wheel (nvidia-nccl-cu12/cu13) where installed: a single-node all-reduce's bus bandwidth"),
    TestSpec("gpu-dcgm", "gpu", _ALL, "dcgm:diag", (),
             "DCGM where installed: `dcgmi diag -r 1|2|3 -j` for quick|standard|extended, judged from its JSON"),
    TestSpec("network-links", "network", _ALL, "network:links", (),
             "each interface of [acceptance.interfaces.<name>] up, at its expected speed and MTU"),
    TestSpec("network-rdma", "network", _LONGER, "network:rdma", ("rdma_gbps",),
             "RDMA loopback bandwidth per HCA of acceptance.hcas with perftest's ib_write_bw"),
    TestSpec("storage", "storage", _ALL, "storage:paths", ("fsync_ms", "write_mbps", "read_mbps"),
             "each path of acceptance.paths: fsync latency and sequential write and read throughput (fio's JSON "
             "where installed, Python otherwise)"),
)}


def limit_words(keys: tuple[str, ...]) -> str:
    """'h2d_gbps (GB/s), rdma_gbps (Gb/s (bits))': limits with their units, for an operator writing one."""
    return ", ".join(f"{key} ({LIMIT_UNITS[key]})" for key in keys)


def specs_for(level: str, areas: tuple[str, ...] = ()) -> list[TestSpec]:
    """The tests of `level`, in the table's order, of `areas` (all when empty)."""
    return [spec for spec in TESTS.values() if level in spec.levels and (not areas or spec.area in areas)]


@dataclass(frozen=True)
class Given:
    """What a test function is given in its child process."""

    level: str
    #: this test's limits: its profile's, with [acceptance.tests.<test>] limits over them
    limits: dict
    #: the [acceptance] section (slurm_ext.acceptance.settings.AcceptanceSection)
    settings: object
    #: the profile's name ("h200-sxm", "generic")
    profile: str
    #: seconds the test has before its child is killed: a test that can size itself (a burn, a memory test)
    #: stays well inside it
    deadline: float
    #: the node's state directory ([node] state_dir): the gres baseline of its GPU count is under it
    state_dir: str = ""
