"""The worker state machine with a fake clock and literal events (supervisor/lifecycle.py)."""

from __future__ import annotations

import pytest

from slurm_ext.supervisor.lifecycle import CrashLoopOver, GiveUp, Life, Policy, Restart
from slurm_ext.supervisor.states import WorkerState

POLICY = Policy(backoff_initial=0.01, backoff_max=30.0, stable_after=2.0, crash_loop_count=5, crash_loop_window=10.0)


def test_a_registered_slurmd_killed_five_times_is_restarted_after_backoff_initial_each_time():
    life = Life(POLICY)
    now = 0.0
    decisions = []
    for _ in range(5):
        life.on_start(now)
        life.on_ready()  # registered with slurmctld
        now += 1.5
        decisions.append(life.on_exit(now, None))
        now += decisions[-1].delay
    assert [d.delay for d in decisions] == [0.01] * 5
    assert [d.crash_loop_began for d in decisions] == [False] * 4 + [True]
    assert decisions[-1].exits_in_window == 5 and life.crash_loop
    life.on_start(now)
    assert life.tick(now + 9.9) is None and life.crash_loop
    assert isinstance(life.tick(now + 10.001), CrashLoopOver)
    assert not life.crash_loop and life.deadline() is None


def test_exits_before_ready_double_the_delay_and_a_crash_loop_waits_the_cap():
    life = Life(Policy(backoff_initial=0.02, backoff_max=0.2, stable_after=2.0, crash_loop_count=3,
                       crash_loop_window=3.0))
    now, delays = 0.0, []
    for _ in range(6):
        life.on_start(now)
        decision = life.on_exit(now + 0.001, 1)
        delays.append(decision.delay)
        now = decision.at
    assert delays == [0.02, 0.04, 0.2, 0.2, 0.2, 0.2]


def test_running_stable_after_counts_as_ready():
    life = Life(POLICY)
    life.on_start(0.0)
    life.on_exit(0.1, 1)  # failed early: failures 1
    life.on_start(0.125)
    decision = life.on_exit(2.125, 1)
    assert decision.was_ready and decision.delay == 0.01


def test_a_failed_start_step_backs_off_but_is_no_crash():
    life = Life(POLICY)
    delays = [life.on_steps_failed(float(n)).delay for n in range(8)]
    assert delays == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28]
    assert not life.crash_loop and len(life.window) == 0


def test_a_start_that_fails_counts_as_an_exit_before_ready():
    life = Life(Policy(crash_loop_count=2, crash_loop_window=10.0, backoff_initial=0.01, backoff_max=5.0))
    first = life.on_start_failed(0.0)
    second = life.on_start_failed(0.5)
    assert (first.delay, second.delay, second.crash_loop_began) == (0.01, 5.0, True)


@pytest.mark.parametrize("policy, code, restarted", [("never", 0, False), ("never", 1, False),
                                                     ("on-failure", 0, False), ("on-failure", 1, True),
                                                     ("on-failure", None, True), ("always", 0, True)])
def test_the_restart_policy(policy, code, restarted):
    life = Life(Policy(restart=policy))
    life.on_start(0.0)
    decision = life.on_exit(5.0, code)
    assert isinstance(decision, Restart) is restarted
    assert life.state == (WorkerState.BACKOFF if restarted else WorkerState.STOPPED)
    if not restarted:
        assert isinstance(decision, GiveUp) and policy in decision.why


def test_an_announced_exit_restarts_at_once_and_is_not_counted():
    life = Life(POLICY)
    life.on_start(0.0)
    decision = life.on_exit(0.2, 0, announced=True)
    assert (decision.delay, decision.exits_in_window, life.failures) == (0.0, 0, 0)


def test_ready_is_only_for_a_running_worker_and_is_reset_by_each_start():
    life = Life(POLICY)
    life.on_ready()
    assert not life.ready
    life.on_start(0.0)
    life.on_ready()
    life.on_exit(0.5, None)
    life.on_start(0.6)
    assert not life.ready
    assert life.on_exit(0.7, None).delay == 0.01  # the last life was ready, so this one starts after initial
    life.on_start(0.8)
    assert life.on_exit(0.9, None).delay == 0.01 * 2  # this one never got ready: the delay grows


def test_deadlines_for_the_loop():
    life = Life(POLICY)
    assert life.deadline() is None
    life.on_start(0.0)
    assert life.deadline() is None  # nothing to forget
    decision = life.on_exit(0.5, 1)
    assert life.deadline() == decision.at
    life.on_start(decision.at)
    assert life.deadline() == decision.at + 2.0  # when its failure is forgotten
    with pytest.raises(RuntimeError, match="not allowed"):
        life.move(WorkerState.STOPPING) or life.move(WorkerState.BACKOFF)


def test_a_workers_policy_is_the_supervisor_section_and_its_restart():
    from slurm_ext import config
    settings = config.from_dict({"supervisor": {"backoff_max": "3s", "crash_loop_count": 7}}).supervisor
    policy = Policy.of(settings, "on-failure")
    assert (policy.restart, policy.backoff_max, policy.crash_loop_count) == ("on-failure", 3.0, 7)
    assert (policy.backoff_initial, policy.stable_after) == (settings.backoff_initial, settings.stable_after)
