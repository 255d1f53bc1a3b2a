"""What a run's verdict does to the node: a fail drains it with our reason, a full pass lifts that drain.

An error (a test could not run) does neither: nothing was measured, so the node is neither condemned
nor cleared by it, and an earlier fail's drain stays until a run passes.
"""

from __future__ import annotations

from slurm_ext.config import Config

from .records import ACTIONS, FAIL, PASS, Result, Run

__all__ = ["OWNER", "drain_reason", "apply_verdict"]

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


def apply_verdict(config: Config, run: Run, full: bool) -> str:
    """Post the run's drain (fail) or clear (a pass of every test: `full`) to the node's agent, or apply it here
    when no agent runs; the owner's outcome, or "" when the verdict changes nothing.

    Raises:
        SlurmExtError: Slurm refused or did not answer (no agent), or the agent did not confirm in time.
    """
    from slurm_ext import events, nodestate
    from slurm_ext.slurm import SlurmClient
    emit = events.emitter(config.node.state_dir, "nodestate")
    where = dict(node=run.node, slurm=lambda: SlurmClient(config.slurm), emit=emit, timeout=config.slurm.timeout + 2.0)
    if run.verdict == FAIL:
        return nodestate.post(config.node.runtime_dir, OWNER, drain_reason(run), **where)
    if run.verdict == PASS and full:
        return nodestate.post_clear(config.node.runtime_dir, OWNER, **where)
    return ""
