"""The node-state owner's decisions, without Slurm: wants in, one action out.

Several parts of slurm-ext may want the node drained at once (slurmd crash-
looping while a GPU is missing); Slurm holds one reason. `NodeState` keeps
every want and, given what Slurm shows now, says the one thing to do:
drain (or re-word our drain), resume, or leave the node alone. It is fed
literal `Node` records in its tests; `reconciler.Reconciler` runs it against
Slurm.

Rules (DESIGN.md: Slurm is the source of truth):
- the node shows the most severe want, and says how many more there are;
- a drain whose reason is not ours (an admin's, `NHC:`, `slurm-operator:`)
  is never changed: our wants wait behind it; the one exception is
  Slurm's own "gres/gpu count reported lower than configured", which our
  GPU drain replaces with the reason naming the missing GPU;
- someone resuming our drain, or replacing its reason, while we want it is
  an operator's decision: those wants are dismissed (by-operator ones
  dropped) until their owner wants them again; a repair's reason (the
  controller's, approved by an operator) is ours: it replaces ours and
  holds the node without a word, and the wants stay for when it resumes it;
- the node is resumed only when no want is left, only from a reason of ours
  (set in this run, or left by a previous run and stale by the catalogue),
  and only once slurmd has registered.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from slurm_ext.slurm import REASON_PREFIX, Node, is_our_reason

from .catalogue import BY_OPERATOR, WHEN_CLEARED, DrainKind, kind_of, split_more, supersedes
from .controller import is_repair_reason

__all__ = ["Want", "Drain", "Resume", "Leave", "Wait", "NodeState", "UnknownReason", "checked", "shows_ours"]

#: a reason of ours that the catalogue does not know (another version of slurm-ext wrote it): kept for an operator
_UNKNOWN = DrainKind("unknown", "unknown", "{text}", 0, BY_OPERATOR, "a slurm-ext reason this version does not know")


class UnknownReason(ValueError):
    """A want whose reason is not in the catalogue for its owner: a bug of the caller."""

    def __init__(self, owner: str, reason: str):
        super().__init__(f"drain reason {reason!r} of owner {owner!r} is not in the catalogue "
                         "(slurm_ext/nodestate/catalogue.py)")


def checked(owner: str, reason: str) -> tuple[str, DrainKind]:
    """`reason` without the slurm-ext: prefix, and its kind in the catalogue for `owner`.

    Raises:
        UnknownReason: the reason is not a catalogued kind of that owner.
    """
    text = reason.removeprefix(REASON_PREFIX).strip()
    kind = kind_of(text, owner.split("/", 1)[0])
    if kind is None:
        raise UnknownReason(owner, text)
    return text, kind


@dataclass(slots=True)
class Want:
    owner: str
    reason: str
    kind: DrainKind
    seq: int
    #: part of the reason Slurm showed (so someone else's change to it is an operator's decision)
    shown: bool = False
    #: an operator resumed or replaced it: not shown again until its owner wants it anew
    dismissed: bool = False
    #: what the journal's drain event says besides the reason (e.g. the job)
    fields: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        """One want per owner for conditions that come and go; by-operator ones pile up."""
        return (self.owner, "" if self.kind.resume == WHEN_CLEARED else self.reason)


@dataclass(frozen=True, slots=True)
class Drain:
    #: the full reason to set, with the prefix
    reason: str
    #: the reason it replaces ('' when the node was not drained)
    replaces: str
    #: the shown want's fields, for the journal
    fields: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class Resume:
    #: our reason being lifted
    reason: str
    #: why it may go: "cleared" (no want left) or "stale" (left by a previous run)
    why: str


@dataclass(frozen=True, slots=True)
class Leave:
    """Nothing to write. `event`/`message` say why, once, when it is news."""

    event: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Wait:
    """Resume due, but slurmd has not registered yet (Slurm refuses it then): ask again soon."""

    reason: str


Action = Drain | Resume | Leave | Wait


@dataclass
class NodeState:
    node: str
    #: at start, our reasons starting with one of these are stale too (supervisor.stale_drain_reasons)
    stale_prefixes: tuple[str, ...] = ()
    #: lift stale reasons at the first step: the agent at its start does; a one-off writer does not
    lift_stale: bool = True
    wants: dict[tuple[str, str], Want] = field(default_factory=dict)
    #: the reason we last saw Slurm show for us, with the prefix; None when ours is not shown
    shown: str | None = None
    #: a reason of a previous run, to be resumed once slurmd has registered
    stale: str | None = None
    #: an owner cleared while someone else's drain holds the node: say once that it stays
    cleared_behind: bool = False
    #: the foreign reason already reported (not news again)
    _reported: str = ""
    _seq: itertools.count = field(default_factory=itertools.count)
    _started: bool = False
    #: owners that cleared before the first step: a reason of theirs found then is over, not adopted
    #: (a configless node regenerates gres before Slurm can be asked: its clear comes first)
    _cleared_unseen: set = field(default_factory=set)

    # -- requests -------------------------------------------------------------------

    def want(self, owner: str, reason: str, **fields) -> Want:
        """`owner` (e.g. "gres", "crash-loop/slurmd", "jobs") wants the node drained for `reason`; asking again
        for a reason Slurm already showed is new evidence, which drains again where an operator resumed the node.

        Raises:
            UnknownReason: the reason is not a catalogued kind of that owner.
        """
        reason, kind = checked(owner, reason)
        want = Want(owner, reason, kind, next(self._seq), fields=fields)
        old = self.wants.get(want.key)
        if old is not None and old.reason == reason and not old.dismissed and not old.shown:
            return old  # asked again before Slurm showed it: nothing new
        # asked anew after Slurm showed it: new evidence (a GPU off the bus again), which an operator's resume of the
        # old drain, seen or not yet, does not dismiss
        self.wants[want.key] = want
        return want

    def clear(self, owner: str) -> list[Want]:
        """`owner`'s conditions are gone; by-operator wants stay (an operator lifts those)."""
        gone = [w for w in self.wants.values() if w.owner == owner and w.kind.resume == WHEN_CLEARED]
        for want in gone:
            del self.wants[want.key]
        self.cleared_behind = True
        if not self._started:
            self._cleared_unseen.add(owner)
        return gone

    def active(self) -> list[Want]:
        """The wants that count now, most severe first (then oldest)."""
        return sorted((w for w in self.wants.values() if not w.dismissed), key=lambda w: (-w.kind.severity, w.seq))

    def desired(self) -> str | None:
        """The full reason the node should show, or None when nothing is wanted."""
        active = self.active()
        if not active:
            return None
        more = f" (+{len(active) - 1} more)" if len(active) > 1 else ""
        return f"{REASON_PREFIX} {active[0].reason}{more}"

    # -- the decision -----------------------------------------------------------------

    def step(self, node: Node, registered: bool, fresh: bool | None = None) -> Action:
        """What to do, given the node as Slurm shows it now. Call `done` once a Drain or Resume is written.

        `registered`: a slurmd answers with a valid registration (any: a cleared want may go then).
        `fresh`: the slurmd of this run has registered (None: same as `registered`). A stale reason, left
        by a previous run (the drain of its stop), waits for that: the old slurmd's registration outlives
        it until SlurmdTimeout, and the node must not take jobs before the new one is up."""
        if not self._started:
            self._started = True
            self._adopt(node, at_start=True)
        controllers = is_repair_reason(node.reason)
        ours = shows_ours(node) and not controllers
        if (node.drained or controllers and node.state == "DOWN") and not ours:
            active = self.active()
            if active and supersedes(active[0].kind, node.reason):  # Slurm's own word for our GPU drain
                return Drain(self.desired(), node.reason, active[0].fields)
            return self._held_by_someone_else(node)
        self._reported = ""
        self.cleared_behind = False  # a clear that found no one else's drain: nothing to say about it
        if ours:
            if node.reason != self.shown and node.reason != self.stale:
                self._adopt(node, at_start=False)  # ours, but not from this owner: another process's, kept
            want = self.desired()
            if want is None:
                why = "stale" if node.reason == self.stale else "cleared"
                ready = registered if why == "cleared" or fresh is None else fresh
                return Resume(node.reason, why) if ready else Wait(node.reason)
            if want != node.reason:
                return Drain(want, node.reason, self.active()[0].fields)
            self._mark_shown(want)
            return Leave()
        if self.shown is not None:  # we showed a reason and now none is there: an operator resumed the node
            self._dismiss_shown()
            message = (f"node {self.node}: our drain {self.shown!r} was resumed by someone else while still "
                       "wanted; not draining again until its owner asks anew")
            self.shown = None
            return Leave("drain-overridden", message)
        self.stale = None
        want = self.desired()
        return Drain(want, "", self.active()[0].fields) if want else Leave()

    def done(self, action: Action) -> None:
        """`action` was written to Slurm."""
        if isinstance(action, Drain):
            self._mark_shown(action.reason)
        elif isinstance(action, Resume):
            self.shown = self.stale = None
            self.cleared_behind = False

    # -- inside ---------------------------------------------------------------------------

    def _held_by_someone_else(self, node: Node) -> Action:
        if is_repair_reason(node.reason):  # a repair slurm-ext's controller runs: ours, not someone else's
            return self._under_repair()
        if self.shown is not None:  # our reason was replaced: the operator took the node over
            self._dismiss_shown()
            replaced, self.shown = self.shown, None
            self._reported = node.reason
            return Leave("drain-overridden", f"node {self.node}: our drain {replaced!r} was replaced by "
                         f"{node.reason!r}; that reason stays, and ours is not set again until its owner asks anew")
        self.stale = None
        if self.desired() is not None and self._reported != node.reason:
            self._reported = node.reason
            return Leave("drain-skipped", f"node {self.node} is already drained by someone else ({node.reason!r}); "
                         f"not replacing their reason with ours ({self.desired()!r})")
        if self.cleared_behind and self.desired() is None:
            self.cleared_behind = False
            return Leave("resume-skipped", f"node {self.node} stays drained: its reason {node.reason!r} is not "
                         "this agent's")
        return Leave()

    def _under_repair(self) -> Action:
        """The controller's repair holds the node with its reason, which replaced ours: no operator's decision, so no
        want is dismissed and nothing is news. The repair resumes the node; a want still there then drains it again."""
        self.shown = self.stale = None
        self.cleared_behind = False
        self._reported = ""
        return Leave()

    def _adopt(self, node: Node, at_start: bool) -> None:
        """Take over a reason of ours found in Slurm that this owner did not set (never the controller's)."""
        if not shows_ours(node) or is_repair_reason(node.reason):
            return
        text, _ = split_more(node.reason.removeprefix(REASON_PREFIX).strip())
        kind = kind_of(text) or _UNKNOWN
        stale = kind.stale_at_start or any(node.reason.startswith(prefix) for prefix in self.stale_prefixes)
        over = kind.resume == WHEN_CLEARED and kind.owner_of(text) in self._cleared_unseen
        if at_start and (self.lift_stale and stale or over):
            self.stale = node.reason
            return
        want = Want(kind.owner_of(text), text, kind, next(self._seq), shown=True)
        self.wants.setdefault(want.key, want)
        self.shown = node.reason

    def _mark_shown(self, reason: str) -> None:
        self.shown = reason
        for want in self.active():
            want.shown = True

    def _dismiss_shown(self) -> None:
        for key, want in list(self.wants.items()):
            if want.shown and not want.dismissed:
                if want.kind.resume == BY_OPERATOR:
                    del self.wants[key]
                else:
                    want.dismissed = True


def shows_ours(node: Node) -> bool:
    """Drained (or down) with a reason of slurm-ext's."""
    return (node.drained or node.state == "DOWN") and is_our_reason(node.reason)
