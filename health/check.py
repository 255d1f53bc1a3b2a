"""The one small interface every check has, and the view of the node its judge reads.

A check is a module with a `CHECK`: its id (the key of settings.CHECKS),
the reader it needs, and a pure judge. A polled judge takes the `View`
(what the readers last saw) and says which conditions hold now; an event
judge takes one new record (an Xid, an SXid, a kernel hang) and the view,
and says what it means. Judges never read the node themselves, never
keep state between calls and never raise for odd input: the monitor
keeps the state (findings, windows), the readers do the I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .records import FsSample, Gpu, LinkChange, NodeSample, Observation, Snapshot
from .settings import Params, XidSection

__all__ = ["Check", "View", "gpu_observation", "limit"]


@dataclass(frozen=True, slots=True)
class View:
    """What the readers last saw; a judge's whole input besides its Params."""

    #: wall-clock seconds
    now: float = 0.0
    #: NVML snapshots, oldest first, as far back as the longest window needs
    snapshots: tuple[Snapshot, ...] = ()
    #: each watched interface's current state (health.interfaces), and its changes within the window, oldest first
    links: dict = field(default_factory=dict)
    link_changes: tuple[LinkChange, ...] = ()
    interfaces: tuple[str, ...] = ()
    filesystems: tuple[FsSample, ...] = ()
    node: NodeSample | None = None
    #: the event records seen before the one being judged, oldest first, within the longest window
    recent: tuple = ()
    #: [health.xid.N] overrides
    xid_overrides: dict[str, XidSection] = field(default_factory=dict)
    #: the most active NVLinks each GPU (by UUID) has shown since the monitor started
    nvlink_seen: dict = field(default_factory=dict)

    def window(self, seconds: float) -> list[Snapshot] | None:
        """The snapshots of the last `seconds`, oldest first; None while the monitor has not watched that long
        (a windowed check gives no verdict on less than its window)."""
        if len(self.snapshots) < 2 or self.snapshots[-1].time - self.snapshots[0].time < seconds * 0.99:
            return None
        newest = self.snapshots[-1].time
        return [s for s in self.snapshots if newest - s.time <= seconds]

    @property
    def latest(self) -> Snapshot | None:
        return self.snapshots[-1] if self.snapshots else None

    def gpu(self, pci_bus_id: str = "", uuid: str = "") -> Gpu | None:
        """The GPU with this bus id or UUID in the latest snapshot that has GPUs."""
        for snapshot in reversed(self.snapshots):
            for sample in snapshot.gpus:
                if (uuid and sample.gpu.uuid == uuid) or (pci_bus_id and sample.gpu.pci_bus_id == pci_bus_id):
                    return sample.gpu
            if snapshot.gpus:
                break
        return None


#: a polled judge returns the conditions that hold now, or None for "no verdict" (not watched for a full window
#: yet, its reader failed): a finding's quiet window runs only on verdicts, never on missing data
Polled = Callable[[View, Params], "list[Observation] | None"]
OnEvent = Callable[[object, View, Params], list[Observation]]


@dataclass(frozen=True, slots=True)
class Check:
    id: str
    #: the reader it needs: nvml, kernel, netlink, filesystem or slurm
    source: str
    polled: Polled | None = None
    on_event: OnEvent | None = None
    #: the record types `on_event` takes
    events: tuple[type, ...] = ()
    #: whether the node has what the check judges (a fabric, say); None: always. A check that does not apply is
    #: listed as such by `health check`, never counted as passed
    applies: Callable[[View], bool] | None = None


def gpu_observation(params: Params, gpu: Gpu, fault: str, expected: str, **changes) -> Observation:
    """An observation about one GPU, with the check's severity and action unless `changes` say otherwise.

    Its evidence is what the drain reason shows (`gpu N <fault>`, the fault in NVIDIA's words), so that the first
    40 characters after `slurm-ext: ` name the GPU and the fault (`sinfo -R` shows 20); what was expected goes into
    the finding's fields (`expected`), for the journal and the page, not into the reason."""
    values = {"severity": params.severity, "action": params.action, **changes}
    fields = {"expected": expected, **values.pop("fields", {})}
    return Observation(params.id, gpu.uuid or gpu.pci_bus_id, evidence=f"gpu {gpu.index} {fault}", gpu=gpu,
                       pci_bus_id=gpu.pci_bus_id, fields=fields, **values)


def limit(value: float, unit: str = "") -> str:
    """A number as evidence writes it: 3, 0.5, 87C."""
    return f"{value:g}{unit}"
