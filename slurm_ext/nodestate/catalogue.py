"""The closed list of drain reasons slurm-ext may set: who sets each, how it reads, how it ends.

A reason in Slurm is free text; this catalogue is what makes ours
recognisable again. Every drain slurm-ext writes matches exactly one kind
here, so the node-state owner can tell, from the text alone, whose it is,
how severe, and whether slurm-ext may lift it (`when-cleared`: once its
owner says the condition is gone) or only an operator may (`by-operator`:
slurm-ext cannot know the node is fit again, e.g. an unkillable process).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["DrainKind", "CATALOGUE", "HEALTH", "kind_named", "kind_of", "split_more", "supersedes",
           "stale_at_start", "fault_signature"]

#: the resume rules
WHEN_CLEARED = "when-cleared"
BY_OPERATOR = "by-operator"


@dataclass(frozen=True, slots=True)
class DrainKind:
    #: who wants it: the part of an owner name before '/' (crash-loop/slurmd is owned by crash-loop, health/xid by
    #: health)
    owner: str
    name: str
    #: how the reason reads after "slurm-ext: "; {fields} stand for any text
    template: str
    #: the node shows the most severe reason wanted
    severity: int
    #: when-cleared or by-operator
    resume: str
    meaning: str
    #: left by a previous run of the node (a crash loop of a slurmd now gone): lifted at the agent's start
    stale_at_start: bool = False
    #: set and lifted by the controller's repair service, not by the node's own agent: the node's owner leaves
    #: it as it would an admin's reason (its own wants wait behind it), and never adopts it
    from_controller: bool = False
    pattern: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        regex = re.sub(r"\\\{([a-z_]+)\\\}", r"(?P<\1>.+?)", re.escape(self.template))
        object.__setattr__(self, "pattern", re.compile(regex + r"\Z", re.DOTALL))

    def matches(self, reason: str) -> bool:
        return self.pattern.match(reason) is not None

    def format(self, **fields: str) -> str:
        """The reason of this kind (after "slurm-ext: ") with `fields` in its template: what `parse` reads back."""
        return self.template.format(**fields)

    def parse(self, reason: str) -> dict[str, str] | None:
        """The fields of a reason of this kind (without the prefix and the (+N more) tail), or None: not one."""
        found = self.pattern.match(reason)
        return found.groupdict() if found else None

    def owner_of(self, reason: str) -> str:
        """The full owner name of a reason of this kind: crash-loop/slurmd for a crash loop of slurmd, health/xid for
        an Xid's drain."""
        found = self.pattern.match(reason)
        groups = found.groupdict() if found else {}
        sub = groups.get("worker") or groups.get("check")
        return f"{self.owner}/{sub}" if sub else self.owner


CATALOGUE: tuple[DrainKind, ...] = (
    DrainKind("repair", "repair", "repair {detail}", 60, BY_OPERATOR,
              "an operator approved a repair of the node (slurm_ext.repair, in the controller agent): drained while "
              "its jobs end, the action runs and the checks pass; lifted by the repair service alone (Slurm may add "
              "': reboot issued' to it)", from_controller=True),
    DrainKind("gres", "gpu-missing", "gpu missing: {uuid}", 50, WHEN_CLEARED,
              "a GPU this node had is not in NVML: jobs would get the wrong GPUs"),
    DrainKind("gres", "gpu-lost", "gpu lost during inventory: {gpu}", 50, WHEN_CLEARED,
              "a GPU answered NVML partly (fell off the bus while being read)"),
    DrainKind("gres", "inventory-failed", "gpu inventory failed: {error}", 50, WHEN_CLEARED,
              "NVML could not be read, or slurmd -G disagrees with it"),
    DrainKind("gres", "gpus-fewer", "gpus fewer than expected: {count}", 50, WHEN_CLEARED,
              "fewer GPUs than gres.expected"),
    DrainKind("jobs", "gpu-held-before-job", "gpu {gpus} held by another process before job {job} ({pids})", 45,
              BY_OPERATOR, "the Prolog found a process of someone else on the job's GPU, or memory in use there that "
              "no process it sees accounts for (another pod's process: NVML lists only its own PID namespace)"),
    DrainKind("jobs", "gpu-lost-before-job", "gpu {gpu} lost (NVML {code}) before job {job}", 45, BY_OPERATOR,
              "the Prolog found the job's GPU lost (NVML GPU_IS_LOST: off the bus, or RESET_REQUIRED); the job is "
              "requeued"),
    DrainKind("jobs", "gpu-lost-after-job", "gpu {gpu} lost (NVML {code}) after job {job}", 40, BY_OPERATOR,
              "the Epilog found the job's GPU lost (NVML GPU_IS_LOST or RESET_REQUIRED)"),
    DrainKind("jobs", "gpu-not-answering", "gpu {gpus} not answering NVML before job {job}", 45, BY_OPERATOR,
              "the Prolog's NVML query for the job's GPUs hung (a GPU off the bus hangs the driver)"),
    DrainKind("jobs", "unkillable", "job {job} left pid {pid} unkillable in state {state}", 40, BY_OPERATOR,
              "a process of a finished job survived SIGKILL (state D: stuck in the kernel)"),
    DrainKind("jobs", "gpu-memory-held", "gpu {gpu} memory held after job {job}", 40, BY_OPERATOR,
              "a GPU still holds memory after its job's processes are gone"),
    DrainKind("jobs", "record-failed", "cannot record job {job} in {where}", 35, BY_OPERATOR,
              "the Prolog could not write the job's record (a full disk?): cleanup could not tell jobs apart"),
    # before health's kind: its template matches any reason that ends in action=X
    DrainKind("acceptance", "acceptance", "acceptance {level} failed: {detail} action={action}", 46, WHEN_CLEARED,
              "the node failed an active acceptance test (slurm_ext.acceptance) at its start: the test, the GPU and "
              "what was measured against its limit, and the recommended action; lifted when a later run on the node "
              "passes (after a repair, or `slurm-ext accept run`); a test that could not run never drains"),
    DrainKind("health", "health", "{check} {evidence} action={action}", 47, WHEN_CLEARED,
              "a health check's critical finding (owner health/<check>): the evidence (a GPU's: the GPU and the fault "
              "in NVIDIA's words) and the recommended action; lifted by the check once its condition has stayed away for its quiet window "
              "(a sticky Xid: at the next boot or `slurm-ext health clear`)"),
    DrainKind("crash-loop", "crash-loop", "{worker} crash loop: {detail}", 30, WHEN_CLEARED,
              "a worker exited crash_loop_count times within crash_loop_window; lifted once it has run the "
              "window", stale_at_start=True),
    DrainKind("stop", "node-stopping", "node agent stopping: {signal}", 10, WHEN_CLEARED,
              "the worker agent was told to stop (SIGTERM: pod deletion, docker stop) and drained the node before "
              "stopping slurmd, so that no job lands on it; the node's next start lifts it once its slurmd has "
              "registered", stale_at_start=True),
)


def kind_named(name: str) -> DrainKind:
    """The kind of that name (a KeyError for a name the catalogue lacks: a bug, found by the first test)."""
    for kind in CATALOGUE:
        if kind.name == name:
            return kind
    raise KeyError(name)


#: a health check's drain: written by health (Finding.reason), read back by repair (recommend.fault_of)
HEALTH = kind_named("health")
#: checks whose evidence starts with the code that tells their faults apart (xid 79 is not xid 13)
_CODED = ("xid", "sxid")


def fault_signature(check: str, evidence: str) -> str:
    """A fault's name, as a repair record, the history and a clear name it: the check, or check/code for a coded one
    (xid/79), from the check and the evidence of its finding (or of the drain reason that states it)."""
    code = evidence.split(maxsplit=1)[0] if check in _CODED and evidence else ""
    return f"{check}/{code}" if code.isdigit() else check

#: Slurm's own drain for the very thing gres reports: a node that registers fewer GPUs than slurmctld has for
#: it (a dynamic node's record outlives its pod, so a pod recreated with a GPU fewer registers INVALID_REG)
_SLURM_GPU_COUNT = re.compile(r"gres/gpu(:\S+)? count (reported lower than configured|too low)")


def supersedes(kind: DrainKind, reason: str) -> bool:
    """Whether our `kind` may replace the node's current reason, which is not ours: only Slurm's own
    GPU-count drain, with our gres reason that names the missing GPU (no admin's or other tool's reason)."""
    return kind.owner == "gres" and _SLURM_GPU_COUNT.match(reason) is not None


_MORE = re.compile(r"(.*) \(\+(\d+) more\)\Z", re.DOTALL)


def split_more(reason: str) -> tuple[str, int]:
    """'gpu missing: X (+2 more)' -> ('gpu missing: X', 2): the shown reason and how many others were wanted."""
    found = _MORE.match(reason)
    return (found.group(1), int(found.group(2))) if found else (reason, 0)


def kind_of(reason: str, owner: str | None = None) -> DrainKind | None:
    """The kind of a reason (without the slurm-ext: prefix and the (+N more) tail), or None."""
    for kind in CATALOGUE:
        if (owner is None or kind.owner == owner) and kind.matches(reason):
            return kind
    return None


def stale_at_start(reason: str) -> bool:
    """Whether a node's full reason is one of ours that an agent lifts at its start, once slurmd has
    registered (a crash loop of a slurmd now gone, the drain of the last stop): worth waiting for."""
    from slurm_ext.slurm import REASON_PREFIX
    if not reason.startswith(REASON_PREFIX):
        return False
    kind = kind_of(split_more(reason.removeprefix(REASON_PREFIX).strip())[0])
    return kind is not None and kind.stale_at_start
