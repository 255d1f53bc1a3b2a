"""The SKU profiles: each GPU model's limits for the acceptance tests, and which one a node gets.

`PROFILES` holds h100-sxm, h200-sxm, h200-nvl, b200 and generic; `choose(setting)` picks one:
"auto" asks NVML for the GPUs' name, any other setting is a profile's name. An operator overrides
any figure per test ([acceptance.tests.<test>] limits = { h2d_gbps = 40 }): the figures here are
floors a healthy part clears with room, not the part's datasheet.

Every figure says where it comes from. [F] a fact of the cited source, [M] a measurement on the
real H200 of tests/data/real-gpu (driver 580.159.04, 2026-12-04), [I] an inference from those.
Bandwidths: GB/s is 1e9 bytes a second; device-to-device counts bytes read and written, as the
prototype and nvbandwidth do. Limit keys are the catalog's (slurm_ext.acceptance.catalog).

The generic profile is for a GPU no profile names: it must never fail a healthy part, so it has
only the limits that hold for every GPU (no bad memory) and a loose one for hardware slowdown.
The GPU count is no profile's: it comes from [acceptance] gpus or the gres baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slurm_ext import nvml

__all__ = ["Profile", "PROFILES", "GENERIC", "choose", "match"]


@dataclass(frozen=True, slots=True)
class Profile:
    """One GPU model's limits."""

    name: str
    #: nvmlDeviceGetName answers this profile is for, compared without case and surrounding blanks
    names: tuple[str, ...]
    #: limit key (the catalog's) -> its figure; a key left out is shown and not judged
    limits: dict[str, float] = field(default_factory=dict)


# Shared by the Hopper SXM parts (HGX H100 and H200 8-GPU boards: same NVLink 4, NVSwitch, PCIe Gen5 host link).
_HOPPER_SXM = {
    # [F] NVIDIA's H100/H200 SXM datasheets: NVLink 900 GB/s per GPU = 18 NVLink 4 links of 50 GB/s.
    "nvlink_links": 18,
    # Any bad byte is a bad GPU.
    "memory_bad_bytes": 0,
    # [F] AzNHC conf/nd96isr_h100_v5.conf and nd96isr_h200_v5.conf: check_gpu_bw 48 335, every cell of
    # nvbandwidth's H2D and D2H matrix at least 48 GB/s (PCIe Gen5 x16). [M] the real H200 reached 55.4 GB/s
    # H2D and 55.2 D2H (1 GiB pinned, best of 5): 48 is 87 % of that.
    "h2d_gbps": 48,
    "d2h_gbps": 48,
    # [M] the real H200 ran its PCIe link at Gen5 x16 (NVML, nvidia-smi -q); [I] every HGX H100/H200 board's host
    # link is Gen5 x16. DCGM's SKU file asks only gen >= 3 (its pcie plugin), too loose to see a link that trained
    # down a generation.
    "pcie_gen": 5,
    # [F] DCGM nvvs/diag-skus.yaml.in, H100 80GB HBM3 (2330): pcie minimum width 16.
    "pcie_width": 16,
    # [F] AzNHC check_gpu_bw 48 335: NVLink peer-to-peer at least 335 GB/s on ND H100 v5 and H200 v5.
    "p2p_gbps": 335,
    # [I] a healthy GPU's share of burn samples with a hardware slowdown reason (HW slowdown, HW thermal, power
    # brake) is 0; 5 % leaves room for one sample at the burn's start. A software power cap is not counted: the
    # real H200 ran at its 700 W cap (reason 0x4) under load and was healthy.
    "burn_throttled_share": 0.05,
    # [F] AzNHC check_ib_bw_gdr: ib_write_bw at least 380 Gb/s on ND H100 v5, 360 on ND H200 v5 (ConnectX-7 NDR,
    # 400 Gb/s). 360 for both: ours is a host-memory loopback, not GPUDirect, and HGX boards carry the same NDR
    # HCAs. Judged only where acceptance.hcas names HCAs.
    "rdma_gbps": 360,
}

H100_SXM = Profile("h100-sxm", ("NVIDIA H100 80GB HBM3",), {
    **_HOPPER_SXM,
    # [I] nvidia-smi shows 81,559 MiB (79.6 GiB) on an H100 80GB HBM3 in published outputs (not recorded here);
    # at least 78 GiB leaves room for a driver that reserves more.
    "memory_gib": 78,
    # [I] R525, the first production branch with CUDA 12 and the H100 (an older one does not drive it at all).
    "driver_major": 525,
    # [F] DCGM diag-skus.yaml.in, H100 80GB HBM3 (2330): memory_bandwidth minimum 1,905,000, "~2540000 x .75"
    # (read as MB/s: 1,905 GB/s). Whether DCGM counts read plus written is not said: if it counts one way, ours
    # (read + written) is about twice it, and 1,905 is a loose floor, never a tight one.
    "d2d_gbps": 1905,
    # [I] the H100 SXM's maximum SM clock is 1,980 MHz, as the H200's; under a burn a healthy part sits at its
    # 700 W cap (the real H200 ran 1,470-1,980 MHz there): at least 1,200 MHz, about 80 % of the lowest.
    "burn_sm_clock_mhz": 1200,
    # [F] AzNHC conf/nd96isr_h100_v5.conf: all_reduce_perf busbw at least 460 GB/s, 8 GPUs, one 16 GiB message;
    # gpu-nccl's message is 1 GiB (standard), which reads below a 16 GiB one, so 0.9 x 460 = 414, the margin
    # nccl-tests itself gives NCCL_TESTS_MIN_BW ("FAILED" below 0.9 x it: src/common.cu).
    "nccl_busbw_gbps": 414,
})

H200_SXM = Profile("h200-sxm", ("NVIDIA H200",), {
    **_HOPPER_SXM,
    # [M] NVML's total memory on the real H200: 150,754,820,096 bytes = 140.4 GiB (143,771 MiB); at least 139
    # leaves room for a driver that reserves a little more (0.4 GiB under the recording was too close).
    "memory_gib": 139,
    # [I] R550, the branch the H200 launched with.
    "driver_major": 550,
    # [M] the real H200 copied device to device at 4,265 GB/s (4 GiB, best of 5, read + written; PyTorch 4,256).
    # 75 % of it, as DCGM's SKU file sets its own floors ("multiply by .75"): 3,200 GB/s.
    "d2d_gbps": 3200,
    # [M] the real H200's SM clock under a bf16 matmul at its power cap: 1,470-1,980 MHz. About 80 % of the lowest.
    "burn_sm_clock_mhz": 1200,
    # [F] AzNHC conf/nd96isr_h200_v5.conf (and nd96is_, nd96isrf_): busbw at least 431 GB/s at 16 GiB, 8 GPUs
    # (its README's table says 480: the configs, which AzNHC runs, are taken); x 0.9 for the 1 GiB message, as
    # for the H100: 388.
    "nccl_busbw_gbps": 388,
})

H200_NVL = Profile("h200-nvl", ("NVIDIA H200 NVL",), {
    # [I] the same 141 GB of HBM3e as the SXM part; at least 139 GiB, a GiB under the SXM part's 140.4, since this
    # part's reserve was not recorded.
    "memory_gib": 139,
    # [I] R550, as the H200 SXM (the NVL shipped later, on R560/R565: a floor, not the branch to run).
    "driver_major": 550,
    # No nvlink_links: the NVL's NVLinks are 2- or 4-way bridges ([F] NVIDIA's H200 NVL datasheet: "2- or 4-way
    # NVLink bridge: 900GB/s per GPU"), so the active count depends on how the node is bridged: set it per node
    # ([acceptance.tests.gpu-nvlink] limits = { nvlink_links = N }).
    "memory_bad_bytes": 0,
    # [I] a PCIe Gen5 x16 card: the same 48 GB/s floor as the SXM parts' Gen5 x16 host link.
    "h2d_gbps": 48,
    "d2h_gbps": 48,
    # [F] DCGM diag-skus.yaml.in, H200 NVL (233b): memory_bandwidth 2,212,500 (read as MB/s: 2,212 GB/s), the
    # H100 figure's reading and caveat.
    "d2d_gbps": 2212,
    # [I] a Gen5 x16 card.
    "pcie_gen": 5,
    "pcie_width": 16,
    # No p2p_gbps: pairs across bridges run at NVLink speed, the others over PCIe; one floor does not fit both.
    # [I] the NVL's maximum SM clock is 1,785 MHz and its cap 600 W ([F] DCGM's 233b entry: targeted_power 600 W),
    # lower than the SXM part's: at least 1,000 MHz under the burn.
    "burn_sm_clock_mhz": 1000,
    "burn_throttled_share": 0.05,
    # No nccl_busbw_gbps: no NVSwitch, so an 8-GPU all-reduce is bounded by the bridges and PCIe; no source.
})

B200 = Profile("b200", ("NVIDIA B200",), {
    # [F] NVIDIA's DGX/HGX B200 datasheet: NVLink 5, 1.8 TB/s per GPU = 18 links of 100 GB/s.
    "nvlink_links": 18,
    # [I] 180 GB of HBM3e per GPU ([F] DGX B200 datasheet: 1,440 GB for 8); NVML's total was not recorded here.
    # 180 GB is 167.6 GiB if the datasheet's GB is 1e9 bytes (more if it is GiB): at least 165 GiB.
    "memory_gib": 165,
    # [I] R570, the first branch with Blackwell data-centre parts (CUDA 12.8).
    "driver_major": 570,
    "memory_bad_bytes": 0,
    # [I] the HGX B200's host link is PCIe Gen5 x16, as Hopper's: the same 48 GB/s floor.
    "h2d_gbps": 48,
    "d2h_gbps": 48,
    # [I] no measurement: half the 8 TB/s HBM3e figure of NVIDIA's datasheet (the real H200 reached 89 % of its
    # 4.8 TB/s counting read + written, and the H200 floor is 75 % of that).
    "d2d_gbps": 4000,
    "pcie_gen": 5,
    "pcie_width": 16,
    # [I] no measurement: NVLink 5 doubles NVLink 4's per-GPU bandwidth, so the Hopper floor of 335 GB/s is loose.
    "p2p_gbps": 335,
    # [I] no measurement: a loose 1,000 MHz (the B200's boost is near 1,965 MHz; 1,000 W cap).
    "burn_sm_clock_mhz": 1000,
    "burn_throttled_share": 0.05,
    # [I] no published B200 gate: the H100's 414 GB/s (AzNHC's 460 x 0.9), which NVLink 5's doubled bandwidth
    # clears.
    "nccl_busbw_gbps": 414,
    # [F] DGX B200 carries ConnectX-7 400 Gb/s HCAs, as HGX H200: AzNHC's H200 v5 floor.
    "rdma_gbps": 360,
})

GENERIC = Profile("generic", (), {
    # Any bad byte is a bad GPU, whatever the model.
    "memory_bad_bytes": 0,
    # [I] loose: hardware slowdown in half the burn's samples is a cooling or power fault on any part.
    "burn_throttled_share": 0.5,
})

PROFILES: dict[str, Profile] = {p.name: p for p in (H100_SXM, H200_SXM, H200_NVL, B200, GENERIC)}


def match(gpu_name: str) -> Profile | None:
    """The profile whose names include `gpu_name` (NVML's), or None for a GPU no profile knows."""
    wanted = gpu_name.strip().casefold()
    for profile in PROFILES.values():
        if any(wanted == name.casefold() for name in profile.names):
            return profile
    return None


def choose(setting: str, load=nvml.load) -> tuple[Profile, str]:
    """The profile of [acceptance] profile `setting`, and a note for the operator ("" when there is nothing to say).

    "auto": the profile of NVML's name for GPU 0; the generic one, with a note saying why, for a GPU no profile
    names, a node whose GPUs have different names (noted; GPU 0's profile is kept), or NVML that cannot be asked
    (the GPU tests then report their own errors). Any other setting: that profile.

    Raises:
        KeyError: `setting` names no profile (the config's choices make that impossible from a config).
    """
    if setting != "auto":
        return PROFILES[setting], ""
    try:
        names = _gpu_names(load)
    except (nvml.NvmlUnavailable, _NoNvml) as err:
        return GENERIC, f"{err}: the generic profile's limits"
    if not names:
        return GENERIC, "NVML shows no GPU: the generic profile's limits"
    profile = match(names[0])
    note = "" if profile else f"unknown GPU {names[0]!r}: the generic profile's limits"
    others = sorted({n for n in names if n != names[0]})
    if others:
        differ = f"GPUs differ: gpu 0 is {names[0]!r}, others {', '.join(map(repr, others))} (the limits are gpu 0's)"
        note = "; ".join(filter(None, (note, differ)))
    return profile or GENERIC, note


class _NoNvml(Exception):
    pass


def _gpu_names(load) -> list[str]:
    module = load()
    with nvml.session(module, lambda err: _NoNvml(nvml.describe(f"NVML cannot start: {err}", nvml.error_code(err)))):
        try:
            return [nvml.text(module.nvmlDeviceGetName(module.nvmlDeviceGetHandleByIndex(i)))
                    for i in range(module.nvmlDeviceGetCount())]
        except nvml.errors(module) as err:
            raise _NoNvml(nvml.describe(f"NVML cannot name the GPUs: {err}", nvml.error_code(err))) from err
