"""The node-state owner's rules, with literal node records (the real-Slurm runs are in test_nodestate_cluster.py)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

import pytest

from slurm_ext.nodestate import CATALOGUE, NodeState, UnknownReason, kind_of, registered
from slurm_ext.nodestate.owner import Drain, Leave, Resume, Wait
from slurm_ext.slurm import Node

IDLE = Node("n1", "IDLE")
CRASH = "slurmd crash loop: 5 exits in 10s (last: died (killed by SIGKILL))"
GPU = "gpu missing: GPU-1234"
UNKILLABLE = "job 7 left pid 99 (python) unkillable in state D"


def drained(reason: str, state: str = "IDLE") -> Node:
    return Node("n1", state, frozenset({"DRAIN"}), reason)


def settle(owner: NodeState, node: Node, registered_: bool = True, limit: int = 5) -> tuple[Node, list]:
    """Run the owner against a pretend Slurm until it leaves the node alone; returns the node and what it did."""
    actions = []
    for _ in range(limit):
        action = owner.step(node, registered_)
        actions.append(action)
        if isinstance(action, Drain):
            node = drained(action.reason, node.state)
        elif isinstance(action, Resume):
            node = dataclasses.replace(node, flags=node.flags - {"DRAIN"}, reason="")
        else:
            return node, actions
        owner.done(action)
    raise AssertionError(f"no settled state after {limit} steps: {actions}")


def test_two_wants_show_the_most_severe_and_the_node_is_resumed_only_after_the_last_clear():
    owner = NodeState("n1")
    owner.want("crash-loop/slurmd", CRASH)
    node, _ = settle(owner, IDLE)
    assert node.reason == f"slurm-ext: {CRASH}"
    owner.want("gres", GPU)
    node, _ = settle(owner, node)
    assert node.reason == f"slurm-ext: {GPU} (+1 more)"
    owner.clear("gres")
    node, _ = settle(owner, node)
    assert node.drained and node.reason == f"slurm-ext: {CRASH}"
    owner.clear("crash-loop/slurmd")
    node, actions = settle(owner, node)
    assert not node.drained and actions[0] == Resume(f"slurm-ext: {CRASH}", "cleared")


def test_an_admins_drain_set_in_between_is_never_touched():
    owner = NodeState("n1")
    owner.want("crash-loop/slurmd", CRASH)
    owner.want("gres", GPU)
    node, _ = settle(owner, IDLE)
    node = drained("maintenance")  # the admin replaces our reason
    node, actions = settle(owner, node)
    assert node.reason == "maintenance" and actions[0].event == "drain-overridden"
    owner.clear("gres")
    owner.clear("crash-loop/slurmd")
    node, actions = settle(owner, node)
    assert node.reason == "maintenance"
    assert actions == [Leave("resume-skipped", "node n1 stays drained: its reason 'maintenance' is not this agent's")]
    assert settle(owner, node)[1] == [Leave()]  # said once


def test_wants_wait_behind_a_foreign_drain_and_show_once_it_is_lifted():
    owner = NodeState("n1")
    node = drained("NHC: check_fs_mount failed")
    owner.want("gres", GPU)
    node, actions = settle(owner, node)
    assert node.reason.startswith("NHC:") and actions[0].event == "drain-skipped"
    assert settle(owner, node)[1] == [Leave()]  # not news twice
    node, _ = settle(owner, IDLE)  # NHC resumed the node: our want was never shown, so it shows now
    assert node.reason == f"slurm-ext: {GPU}"


def test_our_gpu_drain_replaces_slurms_own_gpu_count_drain_and_nothing_else_does():
    """A dynamic node's record outlives its pod: recreated with a GPU fewer, it registers INVALID_REG with
    Slurm's "count reported lower" reason, which our reason naming the missing GPU replaces."""
    slurms = "gres/gpu count reported lower than configured (1 < 2)"
    owner = NodeState("n1")
    owner.want("gres", GPU)
    node, actions = settle(owner, drained(slurms))
    assert node.reason == f"slurm-ext: {GPU}" and actions[0] == Drain(f"slurm-ext: {GPU}", slurms, {"uuid": "GPU-1234"})
    owner.clear("gres")  # the GPU is back
    node, actions = settle(owner, node)
    assert not node.drained and actions[0].why == "cleared"
    crash = NodeState("n1")  # another owner's want does not replace it
    crash.want("crash-loop/slurmd", CRASH)
    node, _ = settle(crash, drained(slurms))
    assert node.reason == slurms
    for foreign in ("slurm-operator: pod is terminating", "NHC: gres/gpu count reported lower than configured"):
        gres = NodeState("n1")
        gres.want("gres", GPU)
        assert settle(gres, drained(foreign))[0].reason == foreign


def test_a_clear_made_before_slurm_could_be_read_lifts_the_reason_it_then_finds():
    """A configless node: gres finds the GPUs back and clears before slurmd has fetched the config, so the
    owner's first read of the node comes after: the gpu drain it finds then is over, not adopted."""
    owner = NodeState("n1")
    owner.clear("gres")
    node, actions = settle(owner, drained(f"slurm-ext: {GPU}"))
    assert not node.drained and actions[0] == Resume(f"slurm-ext: {GPU}", "stale")
    kept = NodeState("n1")
    kept.clear("crash-loop/slurmd")  # someone else's clear does not lift the gres owner's drain
    assert settle(kept, drained(f"slurm-ext: {GPU}"))[0].drained


def test_an_operator_resume_dismisses_our_want_until_it_is_wanted_again():
    owner = NodeState("n1")
    owner.want("gres", GPU)
    node, _ = settle(owner, IDLE)
    node, actions = settle(owner, IDLE)  # resumed by an admin
    assert not node.drained and actions[0].event == "drain-overridden"
    assert settle(owner, node)[1] == [Leave()]
    owner.want("gres", GPU)  # the next slurmd start finds the GPU still missing
    node, _ = settle(owner, node)
    assert node.reason == f"slurm-ext: {GPU}"


def test_a_by_operator_drain_is_never_resumed_by_slurm_ext():
    owner = NodeState("n1")
    owner.want("jobs", UNKILLABLE)
    owner.want("crash-loop/slurmd", CRASH)
    node, _ = settle(owner, IDLE)
    assert node.reason == f"slurm-ext: {UNKILLABLE} (+1 more)"
    owner.clear("crash-loop/slurmd")
    owner.clear("jobs")  # an owner cannot clear what needs an operator
    node, _ = settle(owner, node)
    assert node.reason == f"slurm-ext: {UNKILLABLE}"


def test_at_start_a_stale_crash_loop_drain_is_resumed_once_slurmd_has_registered():
    owner = NodeState("n1")
    node = drained(f"slurm-ext: {CRASH}", state="DOWN")
    assert settle(owner, node, registered_=False)[1] == [Wait(f"slurm-ext: {CRASH}")]
    node, actions = settle(owner, node, registered_=True)
    assert not node.drained and actions[0] == Resume(f"slurm-ext: {CRASH}", "stale")


@pytest.mark.parametrize("reason", [f"slurm-ext: {UNKILLABLE}", "slurm-ext: gpu 3 lost", "maintenance"])
def test_at_start_other_reasons_stay(reason):
    owner = NodeState("n1")
    node, actions = settle(owner, drained(reason))
    assert node.reason == reason and not any(isinstance(a, (Drain, Resume)) for a in actions)


def test_a_gres_drain_left_at_start_is_the_gres_owners_to_clear():
    owner = NodeState("n1")
    node, _ = settle(owner, drained(f"slurm-ext: {GPU}"))
    assert node.drained
    owner.clear("gres")
    node, actions = settle(owner, node)
    assert not node.drained and actions[0] == Resume(f"slurm-ext: {GPU}", "cleared")


def test_a_reason_of_ours_written_by_another_process_is_kept_beside_ours():
    owner = NodeState("n1")
    owner.want("crash-loop/slurmd", CRASH)
    node, _ = settle(owner, IDLE)
    node = drained(f"slurm-ext: {UNKILLABLE}")  # a Python hook without the agent drained it meanwhile
    node, _ = settle(owner, node)
    assert node.reason == f"slurm-ext: {UNKILLABLE} (+1 more)"
    owner.clear("crash-loop/slurmd")
    node, _ = settle(owner, node)
    assert node.reason == f"slurm-ext: {UNKILLABLE}"


def test_a_stale_prefix_from_the_config_counts_as_stale():
    owner = NodeState("n1", stale_prefixes=("slurm-ext: gpu missing",))
    node, actions = settle(owner, drained(f"slurm-ext: {GPU}"))
    assert not node.drained and actions[0].why == "stale"


def test_without_lift_stale_a_one_off_writer_keeps_a_crash_loop_reason():
    owner = NodeState("n1", lift_stale=False)
    owner.want("jobs", UNKILLABLE)
    node, _ = settle(owner, drained(f"slurm-ext: {CRASH}"))
    assert node.reason == f"slurm-ext: {UNKILLABLE} (+1 more)"


def test_a_reason_outside_the_catalogue_is_refused():
    owner = NodeState("n1")
    with pytest.raises(UnknownReason, match="not in the catalogue"):
        owner.want("gres", "slurmd crash loop: x")  # another owner's reason
    with pytest.raises(UnknownReason):
        owner.want("jobs", "something else")


def test_every_catalogued_template_matches_only_its_own_kind():
    for kind in CATALOGUE:
        example = kind.template.format(**{name: "X 1" for name in
                                          __import__("re").findall(r"\{([a-z_]+)\}", kind.template)})
        assert kind_of(example) is kind, (kind.name, example)
        assert kind.resume in ("when-cleared", "by-operator")


def test_registered_needs_a_slurmd_started_after_ours():
    started = datetime(2026, 12, 1, 10, 0, 5, tzinfo=timezone.utc)
    node = Node("n1", "IDLE", slurmd_start=started)
    assert registered(node, None)
    assert registered(node, started.timestamp() + 0.7)  # SlurmdStartTime has whole seconds
    assert not registered(node, started.timestamp() + 1.2)
    assert not registered(dataclasses.replace(node, flags=frozenset({"NOT_RESPONDING"})), None)
    assert not registered(dataclasses.replace(node, flags=frozenset({"INVALID_REG"})), None)


def test_a_crash_loop_reason_is_its_workers():
    owner = NodeState("n1")
    owner.want("crash-loop/slurmd", CRASH)
    node, _ = settle(owner, IDLE)
    node = drained("slurm-ext: munged crash loop: 5 exits in 10s (last: died)")  # another agent's
    node, _ = settle(owner, node)
    assert node.reason == f"slurm-ext: {CRASH} (+1 more)"  # as severe, and older
    owner.clear("crash-loop/slurmd")
    node, _ = settle(owner, node)
    assert node.reason == "slurm-ext: munged crash loop: 5 exits in 10s (last: died)"
    owner.clear("crash-loop/munged")
    node, _ = settle(owner, node)
    assert not node.drained


def test_a_clear_long_before_an_admins_drain_is_no_news_about_it():
    owner = NodeState("n1")
    owner.clear("gres")  # every slurmd start with its GPUs all there
    settle(owner, IDLE)
    assert settle(owner, drained("maintenance"))[1] == [Leave()]


def test_stale_at_start_tells_the_drains_an_agent_lifts_at_its_start():
    from slurm_ext.nodestate import stale_at_start
    assert stale_at_start("slurm-ext: node agent stopping: SIGTERM")
    assert stale_at_start(f"slurm-ext: {CRASH} (+1 more)")
    assert not stale_at_start(f"slurm-ext: {GPU}") and not stale_at_start("node agent stopping: SIGTERM")


def test_slinky_operators_drain_is_neither_lifted_at_start_nor_replaced_by_our_stop_drain():
    operator = "slurm-operator: Pod is terminating"
    owner = NodeState("n1")  # a new agent: only our own stale reasons are lifted at its start
    node, _ = settle(owner, drained(operator))
    assert node.reason == operator
    owner.want("stop", "node agent stopping: SIGTERM")
    node, actions = settle(owner, node)
    assert node.reason == operator and actions[0].event == "drain-skipped"


def test_a_stale_drain_waits_for_this_runs_slurmd_a_cleared_one_does_not():
    """The slurmd before the restart stays registered in Slurm until SlurmdTimeout: lifting the drain of the
    last stop on its word would let jobs onto a node whose new slurmd is not up."""
    stop = "slurm-ext: node agent stopping: SIGTERM"
    owner = NodeState("n1")
    assert owner.step(drained(stop), registered=True, fresh=False) == Wait(stop)
    assert owner.step(drained(stop), registered=True, fresh=True) == Resume(stop, "stale")
    gres = NodeState("n1")
    gres.want("gres", GPU)
    node, _ = settle(gres, IDLE)
    gres.clear("gres")
    assert gres.step(node, registered=True, fresh=False) == Resume(f"slurm-ext: {GPU}", "cleared")



def test_a_want_asked_anew_before_the_operators_resume_was_seen_still_drains():
    """The operator resumed our drain and, before the owner looked again, the same want came anew (a second Xid 79
    on the GPU): the new evidence drains again; only the want Slurm had shown is dismissed."""
    owner = NodeState("n1")
    owner.want("gres", GPU)
    node, _ = settle(owner, IDLE)
    assert node.reason == f"slurm-ext: {GPU}"
    owner.want("gres", GPU)  # asked again while Slurm shows it: the operator's resume below has not been seen
    node, actions = settle(owner, IDLE)
    assert actions[0].event == "drain-overridden"
    node, actions = settle(owner, node)
    assert node.reason == f"slurm-ext: {GPU}", actions


def test_asking_again_while_shown_writes_nothing():
    owner = NodeState("n1")
    owner.want("gres", GPU)
    node, _ = settle(owner, IDLE)
    owner.want("gres", GPU)
    assert settle(owner, node)[1] == [Leave()]


REPAIR = "slurm-ext: repair reboot: xid/79 gpu 1 GPU has fallen off the bus (approved by alice)"
FINDING = "xid 79 gpu 1 GPU has fallen off the bus action=reboot"


def test_a_repairs_own_drain_is_ours_neither_an_override_nor_a_drain_that_skips_a_resume():
    """Issue 29, item 7: every normal repair journaled drain-overridden (the repair's reason replaced the monitor's)
    and resume-skipped (the finding cleared under the repair's reason). The repair's reason is slurm-ext's own:
    replacing ours with it, and clearing behind it, are silent; the repair resumes the node, and a want still there
    then drains it again."""
    owner = NodeState("n1")
    owner.want("health", FINDING)
    node, _ = settle(owner, IDLE)
    assert node.reason == f"slurm-ext: {FINDING}"
    node, actions = settle(owner, drained(REPAIR))  # the repair service drains with its reason
    assert actions == [Leave()], actions
    owner.clear("health")  # the reboot: the finding is gone
    node, actions = settle(owner, node)
    assert actions == [Leave()] and node.reason == REPAIR, actions
    node, actions = settle(owner, IDLE)  # the repair resumed it: nothing wanted, nothing to say
    assert actions == [Leave()] and not node.drained

    again = NodeState("n1")
    again.want("health", FINDING)
    settle(again, IDLE)
    settle(again, drained(REPAIR))
    node, actions = settle(again, IDLE)  # resumed by the repair while the finding stays: drained again
    assert node.reason == f"slurm-ext: {FINDING}" and not any(getattr(a, "event", "") for a in actions), actions


def test_an_admins_reason_in_place_of_a_repairs_is_still_someone_elses():
    owner = NodeState("n1")
    owner.want("health", FINDING)
    settle(owner, IDLE)
    settle(owner, drained(REPAIR))
    owner.clear("health")
    node, actions = settle(owner, drained("maintenance"))
    assert actions == [Leave("resume-skipped", "node n1 stays drained: its reason 'maintenance' is not this agent's")]
