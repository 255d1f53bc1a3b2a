"""What an acceptance run found: each test's outcome with its figures against their limits, and the run.

A test has three outcomes, as soperator's checks and NVIDIA's Health Validation keep them apart:
`pass`, `fail` (measured: the node is bad, drained with a recommendation) and `error` (the test
could not run: a missing library, a test over its deadline, a GPU lost mid-test; never a drain,
since nothing was measured). A run's verdict is the worst of its results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["PASS", "FAIL", "ERROR", "OUTCOMES", "LEVELS", "AREAS", "TRIGGERS", "ACTIONS", "Figure", "Result", "Run", "judged", "NotApplicable",
           "TestError"]

PASS, FAIL, ERROR = "pass", "fail", "error"
OUTCOMES = (PASS, FAIL, ERROR)
#: sized like DCGM's diag levels: quick in seconds, standard in about two minutes a node, extended up to an hour
LEVELS = ("quick", "standard", "extended")
AREAS = ("gpu", "network", "storage")
#: why a run ran
TRIGGERS = ("start", "cluster", "repair", "idle", "manual")
#: what a fail recommends, least disruptive first: health's words (health.settings.ACTIONS, which a layout on one
#: floor cannot import), which the repair service reads from a drain reason
ACTIONS = ("none", "restart-job", "reset-gpu", "reboot", "reprovision", "failover", "remove")


class TestError(Exception):
    """The test could not run (its message says why and what to do): an `error` result, never a drain."""

    __test__ = False  # not a pytest class


class NotApplicable(Exception):
    """Nothing for the test to test here (no NVLink on the part, no HCA configured): not run, said why."""


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured value against its limit: 55.4 GB/s host-to-device against at least 48."""

    name: str
    value: float
    unit: str = ""
    #: the limit it is judged by (the SKU's profile or [acceptance.tests.<test>] limits), None: shown, not judged
    limit: float | None = None
    #: True: the value must be at least `limit`; False: at most
    at_least: bool = True

    @property
    def within(self) -> bool:
        if self.limit is None:
            return True
        if math.isnan(self.value):
            return False
        return self.value >= self.limit if self.at_least else self.value <= self.limit

    def text(self) -> str:
        """'h2d 55.4 GB/s (>= 48)'."""
        limit = "" if self.limit is None else f" ({'>=' if self.at_least else '<='} {self.limit:g})"
        return f"{self.name} {self.value:.4g}{(' ' + self.unit) if self.unit else ''}{limit}"

    def to_json(self) -> dict:
        return {"name": self.name, "value": self.value, "unit": self.unit, "limit": self.limit,
                "at_least": self.at_least}

    @classmethod
    def from_json(cls, data: dict) -> "Figure":
        return cls(str(data["name"]), float(data["value"]), str(data.get("unit", "")),
                   None if data.get("limit") is None else float(data["limit"]), bool(data.get("at_least", True)))


@dataclass(slots=True)
class Result:
    """One test's verdict on one target (a GPU, an interface, a path, or the node: target "")."""

    test: str
    area: str
    target: str
    outcome: str
    #: what was found, for an operator: a fail names the GPU and what is wrong with it (an address range, a
    #: bandwidth against its limit); an error says why the test could not run
    message: str
    figures: tuple[Figure, ...] = ()
    seconds: float = 0.0
    #: a fail's recommended repair (health's actions: reset-gpu, reboot, reprovision, remove), "none" otherwise
    action: str = "none"

    def told(self) -> str:
        """'gpu-memory gpu 1: 1 bad word in ...': the test, its target and the message, the target said once."""
        where = f"{self.test} {self.target}".strip()
        message = self.message.removeprefix(f"{self.target}: ") if self.target else self.message
        return f"{where}: {message}"

    def to_json(self) -> dict:
        return {"test": self.test, "area": self.area, "target": self.target, "outcome": self.outcome,
                "message": self.message, "figures": [f.to_json() for f in self.figures],
                "seconds": round(self.seconds, 3), "action": self.action}

    @classmethod
    def from_json(cls, data: dict) -> "Result":
        outcome = str(data["outcome"])
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome {outcome!r} is none of {', '.join(OUTCOMES)}")
        return cls(str(data["test"]), str(data["area"]), str(data.get("target", "")), outcome,
                   str(data.get("message", "")), tuple(Figure.from_json(f) for f in data.get("figures", ())),
                   float(data.get("seconds", 0.0)), str(data.get("action", "none")))


def judged(test: str, area: str, target: str, figures: list[Figure] | tuple[Figure, ...], seconds: float = 0.0,
           action: str = "none", passed: str = "", failed: str = "") -> Result:
    """A result judged by its figures alone: fail when one is outside its limit (the message names each)."""
    outside = [f for f in figures if not f.within]
    if outside:
        why = failed or "; ".join(f.text() for f in outside)
        return Result(test, area, target, FAIL, why, tuple(figures), seconds, action)
    return Result(test, area, target, PASS, passed or "; ".join(f.text() for f in figures), tuple(figures), seconds)


@dataclass(slots=True)
class Run:
    """One acceptance run on one node: every test's results, and the tests that did not apply here."""

    node: str
    level: str
    #: why it ran: start (node start), cluster (`accept cluster`), repair (a repair's verify), idle, manual
    trigger: str
    started: float
    finished: float = 0.0
    #: the SKU profile the limits came from ("h200-sxm", "generic")
    profile: str = ""
    results: list[Result] = field(default_factory=list)
    #: test -> why it did not run here
    not_applicable: dict[str, str] = field(default_factory=dict)
    #: /proc/sys/kernel/random/boot_id when it ran: a repair's verify takes only a run of the boot after its action
    boot_id: str = ""

    @property
    def verdict(self) -> str:
        """fail when any test failed, else error when any could not run, else pass (no test at all: error)."""
        outcomes = {r.outcome for r in self.results}
        if FAIL in outcomes:
            return FAIL
        if ERROR in outcomes or not self.results:
            return ERROR
        return PASS

    def failures(self) -> list[Result]:
        return [r for r in self.results if r.outcome == FAIL]

    def errors(self) -> list[Result]:
        return [r for r in self.results if r.outcome == ERROR]

    def to_json(self) -> dict:
        return {"node": self.node, "level": self.level, "trigger": self.trigger, "started": self.started,
                "finished": self.finished, "profile": self.profile, "verdict": self.verdict,
                "boot_id": self.boot_id, "results": [r.to_json() for r in self.results],
                "not_applicable": dict(self.not_applicable)}

    @classmethod
    def from_json(cls, data: dict) -> "Run":
        return cls(str(data["node"]), str(data["level"]), str(data.get("trigger", "manual")),
                   float(data["started"]), float(data.get("finished", 0.0)), str(data.get("profile", "")),
                   [Result.from_json(r) for r in data.get("results", ())],
                   {str(k): str(v) for k, v in (data.get("not_applicable") or {}).items()},
                   str(data.get("boot_id", "")))
