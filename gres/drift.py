"""What changed in the node's GPUs since the last start: the judge, pure.

After a pod is rescheduled or a node reboots, a GPU can drop off the bus,
come back, or reappear under another minor number. Slurm notices none of
that until jobs fail. Comparing the inventory with the last one (by UUID,
the one identity that survives a reboot) tells which GPUs are missing,
which are new, and whether the minor numbers of the ones that stayed were
shuffled (so every File= of the old gres.conf points at another GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Missing", "Drift", "compare"]


@dataclass(frozen=True, slots=True)
class Missing:
    uuid: str
    pci_bus_id: str

    def __str__(self) -> str:
        return f"{self.uuid} ({self.pci_bus_id})"


@dataclass(frozen=True, slots=True)
class Drift:
    #: GPUs of the baseline that NVML does not show now, in the baseline's order
    missing: tuple[Missing, ...] = ()
    #: UUIDs NVML shows now that the baseline did not have
    new: tuple[str, ...] = ()
    #: (uuid, old minor, new minor) of GPUs that stayed but changed minor number
    renumbered: tuple[tuple[str, int, int], ...] = ()

    @property
    def any(self) -> bool:
        return bool(self.missing or self.new or self.renumbered)


def compare(baseline: dict[str, tuple[str, int]], current: dict[str, tuple[str, int]]) -> Drift:
    """Compare {uuid: (pci bus id, minor)} maps: the baseline (every GPU this node has had and not
    lost for good) against what NVML shows now."""
    missing = tuple(Missing(uuid, bus) for uuid, (bus, _) in baseline.items() if uuid not in current)
    new = tuple(uuid for uuid in current if uuid not in baseline)
    renumbered = tuple((uuid, baseline[uuid][1], minor) for uuid, (_, minor) in current.items()
                       if uuid in baseline and baseline[uuid][1] != minor)
    return Drift(missing, new, renumbered)
