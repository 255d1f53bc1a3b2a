"""What a run's verdict does to the node: a fail drains it with our reason, a full pass lifts that drain.

An error (a test could not run) does neither: nothing was measured, so the node is neither condemned
nor cleared by it, and an earlier fail's drain stays until a run passes. A pass lifts only a drain of
a level it covers: a quick pass proves nothing of a test only the standard level runs (a burn, NCCL),
so the level of the failed run that drained the node is kept on the node (`<state_dir>/acceptance/
drained.json`) until a pass of that level or a longer one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from slurm_ext.config import Config
from slurm_ext.fileio import atomic_write

from .records import ACTIONS, FAIL, LEVELS, PASS, Result, Run

__all__ = ["OWNER", "drain_reason", "apply_verdict", "settle", "drained_level"]

#: the node-state owner of acceptance drains
OWNER = "acceptance"
#: a reason's detail is cut here: Slurm keeps the whole reason, `sinfo -R` shows its start
_DETAIL = 160


def drain_reason(run: Run) -> str:
    """The drain reason (after "slurm-ext: ") of a failed run: its first failure, and how many more."""
    from slurm_ext.nodestate import catalogue
    failures = run.failures()
    first = failures[0]
    detail = first.told()
    detail = detail if len(detail) <= _DETAIL else detail[:_DETAIL - 3] + "..."
    if len(failures) > 1:
        detail += f" (+{len(failures) - 1} failed)"
    return catalogue.kind_named(OWNER).format(level=run.level, detail=detail, action=worst_action(failures))


def worst_action(failures: list[Result]) -> str:
    """The most disruptive action any failure recommends (a reboot covers a GPU reset)."""
    return max((f.action for f in failures), key=lambda a: ACTIONS.index(a) if a in ACTIONS else 0)


def _drained_path(state_dir: str) -> Path:
    return Path(state_dir) / "acceptance" / "drained.json"


def drained_level(state_dir: str) -> str:
    """The level of the failed run whose drain stands, "" when none is known (never failed, or lifted since)."""
    try:
        level = json.loads(_drained_path(state_dir).read_text()).get("level", "")
    except (OSError, ValueError, AttributeError):
        return ""
    return level if level in LEVELS else ""


def settle(state_dir: str, run: Run, full: bool, want: Callable[[str], object], clear: Callable[[], object],
           emit: Callable[..., object]) -> object:
    """Apply `run`'s verdict through the node-state owner (`want(reason)`, `clear()`), and say so; what want or
    clear returned, or None when the verdict changes nothing.

    A fail drains, keeping its level (the longest of the fails standing); a pass of every test (`full`) at that
    level or a longer one lifts the drain; a shorter pass, a partial one or an error leaves it."""
    node = run.node
    if run.verdict == FAIL:
        reason = drain_reason(run)
        held = drained_level(state_dir)
        kept = max((run.level, held), key=lambda level: LEVELS.index(level) if level else -1)
        try:
            _drained_path(state_dir).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(_drained_path(state_dir), json.dumps({"level": kept, "reason": reason}), fsync="file")
        except OSError as err:  # the drain matters more than its level: drained anyway, any full pass lifts it
            emit("acceptance-drain", f"cannot keep the level of node {node}'s acceptance drain in "
                 f"{_drained_path(state_dir)}: {err.strerror}; any later full pass lifts it", "error")
        emit("acceptance-drain", f"node {node} failed its {run.level} acceptance ({run.trigger}): drained (slurm-ext: "
             f"{reason}); a repair is recommended", reason=reason, trigger=run.trigger)
        return want(reason)
    if run.verdict != PASS or not full:
        return None
    held = drained_level(state_dir)
    if held and LEVELS.index(run.level) < LEVELS.index(held):
        emit("acceptance-kept", f"node {node} passed its {run.level} acceptance ({run.trigger}), but its drain "
             f"came from a failed {held} run: a {held} pass lifts it (`slurm-ext accept run --level {held} --apply`)",
             level=run.level, drained_level=held)
        return None
    if held:
        emit("acceptance-cleared", f"node {node} passed its {run.level} acceptance ({run.trigger}): the drain of its "
             f"failed {held} run is lifted", trigger=run.trigger)
    try:
        _drained_path(state_dir).unlink(missing_ok=True)
    except OSError:
        pass  # kept: the next pass of its level finds the drain gone and removes it then
    return clear()


def apply_verdict(config: Config, run: Run, full: bool) -> str:
    """Post the run's drain (fail) or clear (a pass of every test: `full`) to the node's agent, or apply it here
    when no agent runs; the owner's outcome, or "" when the verdict changes nothing.

    Raises:
        SlurmExtError: Slurm refused or did not answer (no agent), or the agent did not confirm in time.
    """
    from slurm_ext import events, nodestate
    from slurm_ext.slurm import SlurmClient
    where = dict(node=run.node, slurm=lambda: SlurmClient(config.slurm),
                 emit=events.emitter(config.node.state_dir, "nodestate"), timeout=config.slurm.timeout + 2.0)
    done = settle(config.node.state_dir, run, full,
                  want=lambda reason: nodestate.post(config.node.runtime_dir, OWNER, reason, **where),
                  clear=lambda: nodestate.post_clear(config.node.runtime_dir, OWNER, **where),
                  emit=events.emitter(config.node.state_dir, "acceptance"))
    return done or ""
