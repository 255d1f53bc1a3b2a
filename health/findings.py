"""Findings: observations kept over time, so that what the node is told is steady.

A polled condition becomes a finding once it has held for its check's
`hold`; an event is a finding at once. A finding is reported once (its
repeats are counted, not re-reported), escalates in place when it gets
worse, and clears only after its condition has stayed away for `quiet`: a
fault that flaps makes one finding, not a storm. A sticky finding (an Xid
whose fix is a reset or a reboot) waits for the node's next boot or an
operator's `slurm-ext health clear`. `Findings` is pure bookkeeping over
wall-clock seconds; the monitor persists it (`to_json`/`from_json`) so a
restart neither forgets a finding nor reports it again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from slurm_ext.nodestate.catalogue import HEALTH, fault_signature

from .records import Observation
from .settings import ACTIONS, SEVERITIES, Params

__all__ = ["Finding", "FindingChange", "Findings", "finding_of"]


@dataclass
class Finding:
    check: str
    subject: str
    severity: str
    action: str
    evidence: str
    #: wall-clock seconds
    first_seen: float
    last_seen: float
    #: None while pending (polled, not held for `hold` yet)
    opened: float | None = None
    count: int = 1
    gpu: int | None = None
    uuid: str = ""
    pci_bus_id: str = ""
    detail: str = ""
    sticky: bool = False
    #: polled (cleared when its condition is away) or event (cleared when no repeat comes)
    polled: bool = True
    jobs: list = field(default_factory=list)
    fields: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.check, self.subject)

    @property
    def open(self) -> bool:
        return self.opened is not None

    @property
    def signature(self) -> str:
        """The fault's name, as its repair record names it (xid/79, row-remap)."""
        return fault_signature(self.check, self.evidence)

    @property
    def reason(self) -> str:
        """The drain reason (after "slurm-ext: "): check, evidence, action, in the catalogue's one template."""
        return HEALTH.format(check=self.check, evidence=self.evidence, action=self.action)

    def rank(self) -> tuple[int, int]:
        return (SEVERITIES.index(self.severity), ACTIONS.index(self.action))


@dataclass(frozen=True, slots=True)
class FindingChange:
    #: opened, escalated or cleared
    kind: str
    finding: Finding
    #: cleared: quiet, operator, reboot, disabled; escalated: what it was
    why: str = ""
    #: cleared by an operator: who (the invoking user on the node, the token's operator from the controller)
    by: str = ""


class Findings:
    def __init__(self, findings: list[Finding] | None = None):
        self.by_key: dict[tuple[str, str], Finding] = {f.key: f for f in findings or ()}

    def open(self) -> list[Finding]:
        return sorted((f for f in self.by_key.values() if f.open), key=lambda f: (f.opened, f.check, f.subject))

    def polled(self, params: Params, observations: list[Observation], now: float, jobs) -> list[FindingChange]:
        """A polled check's verdict now: `observations` hold, the check's other findings do not.

        `jobs(observation)` names the jobs that held its GPU (asked only when a finding opens)."""
        changes = []
        seen = set()
        for obs in observations:
            seen.add(obs.key)
            found = self.by_key.get(obs.key)
            if found is None:
                found = self.by_key[obs.key] = finding_of(obs, now, polled=True)
            found.last_seen = now
            if not found.open:
                if now - found.first_seen >= params.hold:
                    changes.append(self._open(found, obs, now, jobs))
                continue
            changes += self._worse(found, obs)
        for key, found in list(self.by_key.items()):
            if key[0] != params.id or key in seen or not found.polled:
                continue
            if not found.open:
                del self.by_key[key]  # gone before its hold: never a finding
            elif now - found.last_seen >= params.quiet:
                del self.by_key[key]
                changes.append(FindingChange("cleared", found, "quiet"))
        return changes

    def event(self, params: Params, obs: Observation, now: float, jobs) -> list[FindingChange]:
        """An event's verdict: a new finding, or a repeat of an open one (counted; escalated when worse)."""
        found = self.by_key.get(obs.key)
        if found is None:
            found = self.by_key[obs.key] = finding_of(obs, now, polled=False)
            return [self._open(found, obs, now, jobs)]
        found.count += 1
        found.last_seen = now
        return self._worse(found, obs)

    def expire(self, quiet_of, now: float) -> list[FindingChange]:
        """Event findings whose quiet window passed without a repeat; `quiet_of(check)` is its window."""
        changes = []
        for key, found in list(self.by_key.items()):
            if not found.polled and not found.sticky and now - found.last_seen >= quiet_of(found.check):
                del self.by_key[key]
                changes.append(FindingChange("cleared", found, "quiet"))
        return changes

    def drop(self, keep, why: str, by: str = "") -> list[FindingChange]:
        """Clear every finding for which `keep(finding)` is false (an operator's clear, `by` whom; a disabled
        check)."""
        changes = []
        for key, found in list(self.by_key.items()):
            if not keep(found):
                del self.by_key[key]
                if found.open:
                    changes.append(FindingChange("cleared", found, why, by))
        return changes

    def _open(self, found: Finding, obs: Observation, now: float, jobs) -> FindingChange:
        found.opened = now
        found.jobs = sorted(jobs(obs))
        return FindingChange("opened", found)

    def _worse(self, found: Finding, obs: Observation) -> list[FindingChange]:
        worse = (SEVERITIES.index(obs.severity), ACTIONS.index(obs.action)) > found.rank()
        if not worse:
            return []
        was = f"{found.severity} action={found.action}: {found.evidence}"
        found.severity, found.action, found.evidence = obs.severity, obs.action, obs.evidence
        found.sticky = found.sticky or obs.sticky
        found.detail = obs.detail or found.detail
        found.fields = {**found.fields, **obs.fields}
        return [FindingChange("escalated", found, was)]

    def to_json(self) -> list[dict]:
        return [dataclasses.asdict(f) for f in self.by_key.values()]

    @classmethod
    def from_json(cls, data: list) -> "Findings":
        names = {f.name for f in dataclasses.fields(Finding)}
        return cls([Finding(**{k: v for k, v in item.items() if k in names}) for item in data
                    if isinstance(item, dict)])


def finding_of(obs: Observation, now: float, polled: bool) -> Finding:
    """A new finding of `obs`, first seen `now` (not opened: that is the bookkeeping's to decide)."""
    gpu = obs.gpu
    return Finding(obs.check, obs.subject, obs.severity, obs.action, obs.evidence, now, now,
                   gpu=gpu.index if gpu else None, uuid=gpu.uuid if gpu else "",
                   pci_bus_id=obs.pci_bus_id, detail=obs.detail, sticky=obs.sticky, polled=polled,
                   fields=dict(obs.fields))
