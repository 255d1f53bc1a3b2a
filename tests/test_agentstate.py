"""The node agent's own state (supervisor.agentstate) on literal events and a fake clock: its start steps, its stop,
the stop drain slurmd waits for, and the transitions it refuses."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from slurm_ext.supervisor.agentstate import ALLOWED, STOP_DRAIN_WAIT, AgentLife, AgentState


@dataclass
class Ticket:
    """A node-state ticket as the stop drain gets one: settled once Slurm shows the drain."""

    settled: bool = False


def test_the_start_steps_run_once_then_the_agent_runs():
    life = AgentLife(backoff_initial=0.01, backoff_max=30.0)
    assert life.state == AgentState.STARTING and not life.started and life.deadline(0.0) == 0.0
    assert life.steps_due(0.0)
    assert not life.steps_due(100.0), "due again while they run"
    assert life.deadline(100.0) == float("inf")
    assert life.steps_done(True, 5.0)
    assert life.state == AgentState.RUNNING and life.started and life.deadline(5.0) is None
    assert not life.steps_due(10.0)


def test_a_blocking_step_failure_backs_off_from_a_second_up_to_backoff_max():
    life = AgentLife(backoff_initial=0.01, backoff_max=5.0)  # a step asks Slurm or NVML: never sooner than 1 s
    tries, now = [], 0.0
    for _ in range(5):
        assert life.steps_due(now)
        assert not life.steps_done(False, now)
        tries.append(life.next_steps - now)
        assert not life.steps_due(life.next_steps - 0.001)
        now = life.next_steps
    assert tries == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert life.state == AgentState.STARTING and life.step_failures == 5


def test_a_stop_while_the_steps_run_ignores_their_result():
    life = AgentLife(1.0, 30.0)
    assert life.steps_due(0.0)
    life.move(AgentState.STOPPING)
    assert life.stopping and not life.started
    assert not life.steps_done(True, 1.0) and life.state == AgentState.STOPPING
    assert not life.steps_due(2.0)
    life.move(AgentState.STOPPED)
    assert life.stopping


def test_transitions_not_allowed_raise():
    for old, allowed in ALLOWED.items():
        for new in AgentState:
            life = AgentLife(1.0, 30.0, state=old)
            if new in allowed:
                assert life.move(new) == old and life.state == new
            else:
                with pytest.raises(RuntimeError, match=f"agent state {old.value} -> {new.value} is not allowed"):
                    life.move(new)
                assert life.state == old
    assert ALLOWED[AgentState.STOPPED] == set(), "a stopped agent is stopped"
    assert AgentState.STARTING not in {new for allowed in ALLOWED.values() for new in allowed}


def test_slurmd_waits_for_the_stop_drain_until_slurm_shows_it():
    life = AgentLife(1.0, 30.0, state=AgentState.STOPPING)
    ticket = Ticket()
    life.hold_for_drain(ticket, 100.0)
    assert life.drain_holds(100.0) == (True, False)
    assert life.deadline(100.0) == pytest.approx(100.02), "the loop looks again soon: the ticket settles elsewhere"
    ticket.settled = True
    assert life.drain_holds(101.0) == (False, False)
    assert life.stop_drain is None and life.deadline(101.0) is None


def test_slurmd_stops_anyway_once_the_stop_drain_is_late():
    life = AgentLife(1.0, 30.0, state=AgentState.STOPPING)
    life.hold_for_drain(Ticket(), 100.0)
    assert life.drain_holds(100.0 + STOP_DRAIN_WAIT - 0.001) == (True, False)
    assert life.deadline(100.0 + STOP_DRAIN_WAIT - 0.001) == 100.0 + STOP_DRAIN_WAIT
    assert life.drain_holds(100.0 + STOP_DRAIN_WAIT) == (False, True), "late: said once"
    assert life.drain_holds(100.0 + STOP_DRAIN_WAIT + 1) == (False, False)
