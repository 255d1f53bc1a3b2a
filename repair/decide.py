"""An operator's decisions: approve, reject or reopen a node's recommendation, pause or unpause every repair.

Each decision is one locked transaction on the store, so two operators
approving at once get one approval and one clear refusal, and the guard
counts the repairs under way at the moment of the decision. A refusal is
an exception whose message says why and what to do; nothing is queued
behind it.
"""

from __future__ import annotations

import math
import time
from datetime import datetime

from slurm_ext.errors import SlurmExtError
from slurm_ext.whoami import invoking_user

from .settings import ACTIONS, KEEPS_DATA, RepairSection
from .store import IN_PROGRESS, Record, Store

__all__ = ["DecisionRefused", "operator", "guard_limit", "approve", "reject", "reopen", "pause", "unpause", "paused"]

_PAUSE = "paused"


class DecisionRefused(SlurmExtError):
    """A decision the service will not take; the message says why."""

    exit_code = 1


def operator() -> str:
    """Who decides from this shell (slurm_ext.whoami): the user behind sudo, else the login user."""
    return invoking_user()


def guard_limit(settings: RepairSection, nodes: int) -> int:
    """Nodes under repair at once: max(guard_nodes, guard_percent of the cluster's nodes, rounded down)."""
    return max(settings.guard_nodes, math.floor(nodes * settings.guard_percent / 100))


def paused(store: Store) -> tuple[str, float] | None:
    """(who, since when) when repairs are paused."""
    found = store.control(_PAUSE)
    return (found[1], found[2]) if found and found[0] == "yes" else None


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")


def approve(store: Store, node: str, user: str, settings: RepairSection, cluster_nodes: int,
            action: str | None = None, dry_run: bool = False, auto: bool = False,
            now: float | None = None) -> tuple[Record, str]:
    """Approve `node`'s recommendation (with `action` instead of its own, when given); returns the record and what
    was done. `dry_run`: every check, nothing written. `auto`: the service's auto-approve (KEEPS_DATA only).

    Raises:
        DecisionRefused: no recommendation, decided already, an unknown action, paused, in cooldown, or past the guard.
    """
    now = now or time.time()
    if action is not None and action not in ACTIONS:
        raise DecisionRefused(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
    with store.locked():
        record = _recommendation(store, node)
        chosen = action or record.action
        if auto and chosen not in KEEPS_DATA:
            raise DecisionRefused(f"node {node}: auto-approve takes only {', '.join(KEEPS_DATA)}, not {chosen}")
        stop = paused(store)
        if stop:
            raise DecisionRefused(f"repairs are paused (by {stop[0]} at {_when(stop[1])}): nothing is approved until "
                                  "`slurm-ext repair unpause`")
        _check_cooldown(store, node, settings, now, record.detail.get("after_failed"))
        under_way = [r.node for r in store.records(open_only=True, states=IN_PROGRESS)]
        limit = guard_limit(settings, cluster_nodes)
        if len(under_way) + 1 > limit:
            raise DecisionRefused(f"node {node}: refused by the guard: {len(under_way)} node(s) under repair now "
                                  f"({', '.join(sorted(under_way))}), and at most {limit} may be at once "
                                  f"(max(guard_nodes {settings.guard_nodes}, guard_percent {settings.guard_percent}% "
                                  f"of {cluster_nodes} nodes)); approve again once one has finished")
        if dry_run:
            return record, f"would approve {chosen} of node {node} ({record.signature}: {record.evidence}); nothing done"
        changed = f" (recommended: {record.action})" if chosen != record.action else ""
        record.state, record.action, record.decided_by, record.decided_at = "approved", chosen, user, now
        record.updated = now
        if not store.save(record, expect_state="recommended"):
            raise DecisionRefused(f"node {node}: decided by someone else meanwhile; see `slurm-ext repair list`")
        how = "auto-approved" if auto else f"approved by {user}"
        store.event(node, "repair-approved", f"{chosen}{changed} {how}: {record.signature} {record.evidence}",
                    user, record, now)
    return record, f"approved {chosen} of node {node}"


def reject(store: Store, node: str, user: str, why: str, now: float | None = None) -> Record:
    """Reject `node`'s recommendation for the reason `why`: recorded; the node stays drained with our reason
    until its fault clears, and nothing runs.

    Raises:
        DecisionRefused: no recommendation to reject, or an empty reason.
    """
    now = now or time.time()
    if not why.strip():
        raise DecisionRefused("a rejection needs its reason: --why TEXT")
    with store.locked():
        record = _recommendation(store, node)
        record.state, record.decided_by, record.decided_at, record.note = "rejected", user, now, why.strip()
        record.updated = now
        if not store.save(record, expect_state="recommended"):
            raise DecisionRefused(f"node {node}: decided by someone else meanwhile; see `slurm-ext repair list`")
        store.event(node, "repair-rejected", f"{record.action} rejected by {user}: {why.strip()}", user, record, now)
    return record


def reopen(store: Store, node: str, user: str, now: float | None = None) -> Record:
    """Make `node`'s rejected recommendation one that awaits approval again (the vendor did not come, the reason
    for the rejection is gone): recorded with who reopened it and the rejection it undoes. Its fault must still
    hold: a rejected record whose fault is over is closed by the service, and a new fault gets a new record.

    Raises:
        DecisionRefused: no rejected recommendation on the node (none, one awaiting approval, one under way).
    """
    now = now or time.time()
    with store.locked():
        records = store.records(node=node, open_only=True)
        rejected = next((r for r in records if r.state == "rejected"), None)
        if rejected is None:
            waiting = next((r for r in records if r.state == "recommended"), None)
            if waiting:
                raise DecisionRefused(f"node {node}: its {waiting.action} awaits approval already (`slurm-ext repair "
                                      f"approve {node}`, or reject it)")
            busy = next((r for r in records if r.state in IN_PROGRESS), None)
            if busy:
                raise DecisionRefused(f"node {node}: its {busy.action} was already approved by {busy.decided_by} at "
                                      f"{_when(busy.decided_at or busy.updated)} and is {busy.state}")
            raise DecisionRefused(f"node {node}: no rejected recommendation to reopen (`slurm-ext repair list` shows "
                                  "the open ones; one whose fault cleared is closed, and a new fault is recommended "
                                  "anew)")
        undone = (f"rejected by {rejected.decided_by} at {_when(rejected.decided_at or rejected.updated)}: "
                  f"{rejected.note}")
        rejected.state, rejected.decided_by, rejected.decided_at, rejected.note = "recommended", "", None, ""
        rejected.updated = now
        if not store.save(rejected, expect_state="rejected"):
            raise DecisionRefused(f"node {node}: decided by someone else meanwhile; see `slurm-ext repair list`")
        store.event(node, "repair-reopened", f"{rejected.action} reopened by {user}, awaiting approval again (was "
                    f"{undone})", user, rejected, now)
    return rejected


def pause(store: Store, user: str, now: float | None = None) -> bool:
    """No approval (operator's or auto) until unpaused; repairs under way go on to their end. False (nothing
    recorded, the first pause stands) when repairs are paused already."""
    with store.locked():
        if paused(store):
            return False
        store.set_control(_PAUSE, "yes", user, now)
        store.event("", "repair-paused", f"repairs paused by {user}", user, now=now)
    return True


def unpause(store: Store, user: str, now: float | None = None) -> bool:
    """Approvals go through again; what was refused while paused is approved anew, never replayed. False (nothing
    recorded) when repairs were not paused: an unpause that changed nothing is no decision for the history."""
    with store.locked():
        if not paused(store):
            return False
        store.set_control(_PAUSE, "no", user, now)
        store.event("", "repair-unpaused", f"repairs unpaused by {user}", user, now=now)
    return True


def _recommendation(store: Store, node: str) -> Record:
    records = store.records(node=node, open_only=True)
    found = next((r for r in records if r.state == "recommended"), None)
    if found:
        return found
    busy = next((r for r in records if r.state in IN_PROGRESS), None)
    if busy:
        raise DecisionRefused(f"node {node}: its {busy.action} was already approved by {busy.decided_by} at "
                              f"{_when(busy.decided_at or busy.updated)} and is {busy.state}"
                              + (f" (step {busy.step})" if busy.step else ""))
    rejected = next((r for r in records if r.state == "rejected"), None)
    if rejected:
        raise DecisionRefused(f"node {node}: its {rejected.action} was rejected by {rejected.decided_by} at "
                              f"{_when(rejected.decided_at or rejected.updated)}: {rejected.note} (`slurm-ext "
                              f"repair reopen {node}` makes it await approval again)")
    raise DecisionRefused(f"node {node}: no recommendation to decide on (`slurm-ext repair list` shows them; a node "
                          "gets one when a health check drains it)")


def _check_cooldown(store: Store, node: str, settings: RepairSection, now: float, after_failed: int | None = None
                    ) -> None:
    """Refuse a repair of a node whose last one ended within repair.cooldown; not the reboot recommended because a
    GPU reset failed (`after_failed`: that reset's record), which is the next step of the same repair, and not after a
    repair that failed before it did anything to the node (its configuration was wrong: flow._fail_untouched)."""
    finished = [r for r in store.records(node=node, states=("done", "failed"))
                if r.closed and now - r.closed < settings.cooldown and not r.detail.get("dry_run")
                and not r.detail.get("untouched") and r.id != after_failed]
    if finished:
        last = max(finished, key=lambda r: r.closed)
        raise DecisionRefused(f"node {node}: in its cooldown: its {last.action} ended {last.state} at "
                              f"{_when(last.closed)}; no new repair before {_when(last.closed + settings.cooldown)} "
                              "(repair.cooldown)")
