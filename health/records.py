"""What the readers return and the judges take: typed records, and the judges' verdicts.

Readers (NVML, the kernel log, netlink, the file systems, Slurm) turn the
node into these records; a check's judge is a pure function of them, so
its tests hand it literal records. `None` in a field means the GPU or the
driver does not report it (NVML's NOT_SUPPORTED): a judge skips it, it is
never read as zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Gpu", "GpuSample", "Snapshot", "Xid", "SXid", "KernelHang", "LinkChange", "FsSample", "NodeSample",
           "Observation", "normal_bus_id"]


def normal_bus_id(text: str) -> str:
    """A PCI address in NVML's form, 00000000:17:00.0, from what the kernel writes: PCI:0000:17:00,
    0000:17:00.0, 17:00.0; text that is no PCI address comes back lower-cased as it is."""
    text = text.strip().lower().removeprefix("pci:")
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return text
    domain, bus, rest = parts
    device, _, function = rest.partition(".")
    try:
        return f"{int(domain, 16):08x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function or '0', 16)}".upper()
    except ValueError:
        return text


@dataclass(frozen=True, slots=True)
class Gpu:
    """A GPU's identity: what dcgm-exporter labels its series with."""

    index: int
    uuid: str
    #: NVML's form, 00000000:17:00.0
    pci_bus_id: str
    minor: int = -1
    name: str = ""

    @property
    def device(self) -> str:
        return f"nvidia{self.minor if self.minor >= 0 else self.index}"


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU's readings at one poll."""

    gpu: Gpu
    #: NVML's error code when the GPU could not be read (15 lost, 16 reset required, ...), else None
    error: int | None = None
    error_text: str = ""
    utilization: int | None = None
    memory_utilization: int | None = None
    #: memory in use without the driver's reserve (NVML memory v2; v1's, which includes it, on an older driver)
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    #: the driver's own reserve (memory v2), None where unknown
    fb_reserved_mib: float | None = None
    temperature: int | None = None
    memory_temperature: int | None = None
    slowdown_temperature: int | None = None
    memory_max_temperature: int | None = None
    power_w: float | None = None
    energy_mj: int | None = None
    sm_clock: int | None = None
    memory_clock: int | None = None
    clocks_event_reasons: int | None = None
    pcie_replay: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_volatile: int | None = None
    retired_pages: int | None = None
    retired_pending: bool | None = None
    nvlink_active: int | None = None
    nvlink_errors: int | None = None
    persistence: bool | None = None
    #: NVML_GPU_FABRIC_STATE_* (1-3; 3: completed) and the fabric's status (an NVML code), None off a fabric
    fabric_state: int | None = None
    fabric_status: int | None = None
    #: GpuFabricInfo v2/v3's health mask and summary (NVML_GPU_FABRIC_HEALTH_*), None where the driver lacks them
    fabric_health_mask: int | None = None
    fabric_health_summary: int | None = None
    recovery_action: int | None = None
    #: the calls that failed in this poll ("nvmlDeviceGetX: <NVML's error>"), their readings None; the GPU answered
    failed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every GPU at one poll (monotonic `time`), and what NVML said about the whole node."""

    time: float
    gpus: tuple[GpuSample, ...] = ()
    #: NVML's own failure (init, count), with its code; the GPUs are then unknown
    error: int | None = None
    error_text: str = ""
    #: the node's baseline: UUIDs it has had (gres/baseline.json), empty when unknown
    baseline: tuple[str, ...] = ()
    #: the NVIDIA driver's version, as NVML says it ("" when it does not)
    driver: str = ""


@dataclass(frozen=True, slots=True)
class Xid:
    """An Xid, from a kernel line or an NVML event."""

    xid: int
    #: NVML's form of the GPU's PCI address ('' when the source gives none: NVML events carry the GPU itself)
    pci_bus_id: str
    text: str
    #: kernel or nvml
    source: str
    time: float
    #: the GPU's UUID when the source names it (NVML events)
    uuid: str = ""
    #: NVLink5 Xids (144-150): Fatal or Nonfatal; None when the line does not say
    fatal: bool | None = None
    #: Xid 154: the recovery action the driver states ("GPU Reset Required", "Node Reboot Required", ...)
    recovery: str = ""
    #: a "fallen off the bus" line without an Xid, read as Xid 79
    no_xid_line: bool = False
    #: the process the driver names (pid=...), None when it says '<unknown>' or nothing: lines of one process are
    #: one fault, however many the driver prints
    pid: int | None = None
    #: MIG: the GPU instance and compute instance the driver attributes the error to ("GPU-I:05 GPU-CI:02")
    gpu_instance: int | None = None
    compute_instance: int | None = None
    #: NVLink5 Xids (144-150): the sub-unit (NETIR_LINK_EVT, TLW_RX_PIPE0, ...) and the first two words in
    #: parentheses, IntrInfo and ErrorStatus, that NVIDIA's "Xid 144-150 Decode" table is read with
    unit: str = ""
    intrinfo: int | None = None
    error_status: int | None = None


@dataclass(frozen=True, slots=True)
class SXid:
    """An NVSwitch error line (its "Severity"/"Data" detail lines are not records: they follow the event)."""

    sxid: int
    pci_bus_id: str
    #: Fatal or Non-fatal as the line says; None when it says neither (SOE errors: "26006, SOE HALTED")
    fatal: bool | None
    text: str
    time: float


@dataclass(frozen=True, slots=True)
class KernelHang:
    """A hung-task or soft-lockup line of the kernel."""

    kind: str  # hung-task or soft-lockup
    text: str
    time: float


@dataclass(frozen=True, slots=True)
class LinkChange:
    """A network interface's state: from netlink's dump at start and each change after."""

    ifname: str
    up: bool
    time: float
    #: present in the namespace at all
    exists: bool = True


@dataclass(frozen=True, slots=True)
class FsSample:
    path: str
    free_bytes: int | None = None
    total_bytes: int | None = None
    read_only: bool = False
    #: the path could not be read (the error's text)
    error: str = ""


@dataclass(frozen=True, slots=True)
class NodeSample:
    """The node as Slurm shows it."""

    name: str
    responding: bool = True
    drained: bool = False
    reason: str = ""
    #: the reason is slurm-ext's own
    ours: bool = False
    #: Slurm did not answer (the text of its error)
    error: str = ""


@dataclass(frozen=True, slots=True)
class Observation:
    """A judge's verdict: this condition holds now (polled), or this happened (an event)."""

    check: str
    #: what it is about, part of the finding's key: a GPU's UUID (or bus id), an interface, a path, "node"
    subject: str
    severity: str
    action: str
    #: what the drain reason shows: a GPU's "gpu N <the fault in NVIDIA's words>" (what was expected in
    #: fields["expected"]), the node's "actual (expected limit)"
    evidence: str
    gpu: Gpu | None = None
    pci_bus_id: str = ""
    #: the kernel line or NVML's words, for the journal
    detail: str = ""
    #: stays until the node reboots or an operator clears it (an Xid whose fix is a reset or a reboot)
    sticky: bool = False
    #: more fields for the journal (xid, interface, ...)
    fields: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.check, self.subject)
