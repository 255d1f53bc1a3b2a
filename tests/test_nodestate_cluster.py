"""The node-state owner and the restart policy against the real cluster (issue 10's acceptance runs).

- five kills of a registered slurmd 1.5 s apart, a job running across them;
- two owners wanting a drain at once, through the agent's node-state socket
  as the hook service does, with an admin's drain set in between;
- a crash-loop drain left over a full `dev down` / `dev up`.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time

import psutil

from helpers.wait import wait_for
from slurm_ext import config, devcluster as dev, drainmark, nodestate
from slurm_ext.nodestate import channel

CRASH = "slurmd crash loop: 5 exits in 10s (last: died (killed by SIGKILL))"
GPU = "gpu missing: GPU-00000000-0000-0000-0000-000000000003"


def _journal(cluster, since: int = 0) -> list[dict]:
    """The node journal's events from line `since` on."""
    path = cluster.layout.node_state / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()[since:]] if path.exists() else []


def _journal_length(cluster) -> int:
    return len(_journal(cluster))


def _slurmd(cluster) -> int | None:
    agent = next(d.pid for d in dev.status(cluster.settings).daemons if d.name == "supervise-worker")
    for child in psutil.Process(agent).children():
        try:
            if child.name() == "slurmd" and child.status() != psutil.STATUS_ZOMBIE:
                return child.pid
        except psutil.NoSuchProcess:  # the slurmd just killed, reaped between the listing and the look
            continue
    return None


def _registered_since(cluster, since: float) -> bool:
    node = cluster.client().node(cluster.node)
    return node.slurmd_start is not None and node.slurmd_start.timestamp() >= math.floor(since) \
        and node.responding


def _ask(cluster, message: dict, timeout: float = 30.0) -> dict:
    """One request on the worker agent's node-state socket, as the hook service sends it."""
    return channel.request(nodestate.socket_path(cluster.layout.hook_socket.parent), message, timeout)


def test_five_fast_kills_of_a_registered_slurmd_each_restart_it_at_once_then_drain_the_crash_loop(running_cluster):
    """Each kill of a slurmd that got ready is restarted after backoff_initial, not a backoff that grows (the
    agent's decision, in its journal: how fast that is, is bench_supervisor's figure), and the fifth is a crash
    loop that drains the node."""
    cluster = running_cluster
    first_line = _journal_length(cluster)
    release, started = cluster.layout.out / "release-five", cluster.layout.out / "started-five"
    release.unlink(missing_ok=True)
    started.unlink(missing_ok=True)
    job_id = cluster.sbatch(f"--wrap=touch {started}; while [ ! -e {release} ]; do sleep 0.2; done; echo survived")
    wait_for("the job's script to start", started.exists, timeout=30)
    killed_at, last_kill = 0.0, 0.0
    for round_ in range(5):
        # the slurmd that is there registered: its death is that of a worker that worked. It started
        # after the last kill, so its SlurmdStartTime (whole seconds) is at least that second; the time
        # the test saw it is no bound, as slurmd may have read the clock in the second before.
        wait_for(f"round {round_}: slurmd registered", lambda: _registered_since(cluster, killed_at), timeout=10,
                 interval=0.05)
        time.sleep(max(0.0, last_kill + 1.5 - time.monotonic()))
        old = _slurmd(cluster)
        killed_at = time.time()
        psutil.Process(old).send_signal(signal.SIGKILL)
        last_kill = time.monotonic()
        wait_for(f"round {round_}: a new slurmd", lambda: _slurmd(cluster) not in (None, old), timeout=30,
                 interval=0.01)

    events = _journal(cluster, first_line)
    deaths = [e for e in events if e["event"] == "worker-exited" and e["worker"] == "slurmd"]
    assert len(deaths) == 5 and all(e["signal"] == "SIGKILL" and e["uptime"] > 1.0 for e in deaths), deaths
    backoff_initial = config.load(cluster.layout.slurm_ext_conf).supervisor.backoff_initial
    assert [(e["delay"], e["was_ready"]) for e in deaths] == [(backoff_initial, True)] * 5, deaths
    assert any(e["event"] == "crash-loop" for e in events)
    node = wait_for("the crash-loop drain", lambda: (n := cluster.client().node(cluster.node)).drained and n)
    assert node.reason.startswith("slurm-ext: slurmd crash loop: 5 exits in 10s"), node.reason

    release.touch()
    job = cluster.wait_accounted(job_id)
    assert job.state == "COMPLETED" and (cluster.layout.out / f"{job_id}.out").read_text().strip() == "survived"
    # nobody resumes it: the agent does once slurmd has run the crash window
    cluster.wait_idle(timeout=40)
    events = _journal(cluster, first_line)
    assert any(e["event"] == "recovered" for e in events)
    assert any(e["event"] == "resume" and e["why"] == "cleared" for e in events)


def test_two_owners_at_once_then_each_clearing_and_an_admins_drain_in_between(running_cluster):
    cluster = running_cluster
    slurm = cluster.client()
    try:
        assert _ask(cluster, {"owner": "crash-loop/slurmd", "want": CRASH})["ok"]
        assert slurm.node(cluster.node).reason == f"slurm-ext: {CRASH}"
        answer = _ask(cluster, {"owner": "gres", "want": GPU, "fields": {"job": "7"}})
        assert answer["ok"] and answer["outcome"] == f"drained: slurm-ext: {GPU} (+1 more)", answer
        assert slurm.node(cluster.node).reason == f"slurm-ext: {GPU} (+1 more)"

        assert _ask(cluster, {"owner": "gres", "clear": True})["ok"]
        node = slurm.node(cluster.node)
        assert node.drained and node.reason == f"slurm-ext: {CRASH}", node  # the other want holds
        assert _ask(cluster, {"owner": "crash-loop/slurmd", "clear": True})["ok"]
        wait_for("the resume after the last clear", lambda: not slurm.node(cluster.node).drained, timeout=10)

        # again, and an admin drains the node in between: their reason is never touched
        assert _ask(cluster, {"owner": "crash-loop/slurmd", "want": CRASH})["ok"]
        assert _ask(cluster, {"owner": "gres", "want": GPU})["ok"]
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=drain", "reason=maintenance")
        first_line = _journal_length(cluster)
        assert _ask(cluster, {"owner": "gres", "clear": True})["ok"]
        assert _ask(cluster, {"owner": "crash-loop/slurmd", "clear": True})["ok"]
        events = _journal(cluster, first_line)
        assert [e["event"] for e in events if e["component"] == "nodestate"][:2] == \
            ["drain-overridden", "resume-skipped"], events
        node = slurm.node(cluster.node)
        assert node.drained and node.reason == "maintenance", node

        # a user cannot talk to the owner
        import os
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setuid(65534)
                try:
                    _ask(cluster, {"owner": "jobs", "want": "gpu 0 memory held after job 1"}, timeout=5)
                except (channel.NoAgent, PermissionError, TimeoutError, OSError):
                    code = 0
            finally:
                os._exit(code)
        assert os.waitpid(pid, 0)[1] == 0, "a non-root process got an answer from the node-state owner"
        assert slurm.node(cluster.node).reason == "maintenance"
    finally:
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume", check=False)


def test_a_crash_loop_drain_left_over_dev_down_and_up_is_cleared_without_an_error(running_cluster):
    cluster = running_cluster
    cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=drain", f"reason=slurm-ext: {CRASH}")
    dev.down(cluster.settings)
    first_line = _journal_length(cluster)
    dev.up(cluster.settings)  # waits for the node to be idle
    node = cluster.wait_idle(timeout=60)
    assert not node.drained, node
    events = _journal(cluster, first_line)
    said = [f'{e["component"]} {e["event"]}: {e["message"]}' for e in events]
    assert any(e["event"] == "resume" and e["why"] == "stale" for e in events), "\n".join(said)
    assert not [e for e in events if e["severity"] == "error"], "\n".join(said)


def _schedulable(node) -> bool:
    """Slurm may start a job there: up and not drained."""
    return not node.drained and node.state not in ("DOWN", "UNKNOWN", "FUTURE") and node.responding


def test_an_admins_resume_over_a_held_drain_is_followed_by_ours_before_any_job_starts(running_cluster, tmp_path):
    """A critical want behind an admin's drain; a job waits for the node; the admin resumes it. Our drain must
    land within a second, and the job must not run meanwhile: the agent looks twice a second while a want is held,
    and the Prolog refuses a job while the drain it wants is not shown (slurm_ext.drainmark)."""
    cluster = running_cluster
    slurm = cluster.client()
    marker = tmp_path / "ran"
    os.chmod(tmp_path, 0o777)
    cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=drain", "reason=admin: new cables")
    job = None
    try:
        answer = _ask(cluster, {"owner": "gres", "want": GPU})
        assert answer["ok"] and answer["outcome"].startswith("held by someone else's drain"), answer
        assert drainmark.unshown_drain(cluster.layout.hook_socket.parent) == f"slurm-ext: {GPU}"
        job = cluster.sbatch(f"--nodelist={cluster.node}", "--gres=gpu:1", f"--wrap=touch {marker}")
        wait_for("the job pending for the node", lambda: slurm.job(job) and slurm.job(job).state == "PENDING")
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume")
        resumed = time.monotonic()
        schedulable_since = None
        schedulable_for = 0.0
        while time.monotonic() - resumed < 10:
            node = slurm.node(cluster.node)
            now = time.monotonic()
            if _schedulable(node):
                schedulable_since = schedulable_since or now
            elif schedulable_since is not None:
                schedulable_for += now - schedulable_since
                schedulable_since = None
            if node.drained and node.reason.startswith(f"slurm-ext: {GPU}"):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"our drain did not follow the admin's resume within 10 s: {node}")
        assert schedulable_for <= 1.0, f"the node was schedulable for {schedulable_for:.2f}s"
        time.sleep(3)  # a job Slurm started meanwhile would have run its script by now
        assert not marker.exists(), "a job ran on the node between the admin's resume and our drain"
        assert slurm.node(cluster.node).reason.startswith(f"slurm-ext: {GPU}")
        assert not drainmark.unshown_drain(cluster.layout.hook_socket.parent)
    finally:
        if job is not None:
            cluster.run("scancel", str(job), check=False)
        _ask(cluster, {"owner": "gres", "clear": True})
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume", check=False)


def test_a_want_an_operator_resumed_drains_again_when_asked_anew(running_cluster):
    """An operator's resume dismisses our drain; the same want asked again (the health monitor does on each new
    critical event: a GPU off the bus twice) drains again."""
    cluster = running_cluster
    slurm = cluster.client()
    try:
        assert _ask(cluster, {"owner": "gres", "want": GPU})["ok"]
        assert slurm.node(cluster.node).reason == f"slurm-ext: {GPU}"
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume")
        wait_for("the operator's resume seen", lambda: not slurm.node(cluster.node).drained)
        answer = _ask(cluster, {"owner": "gres", "want": GPU})
        assert answer["ok"] and answer["outcome"] == f"drained: slurm-ext: {GPU}", answer
        assert slurm.node(cluster.node).reason == f"slurm-ext: {GPU}"
    finally:
        _ask(cluster, {"owner": "gres", "clear": True})
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume", check=False)
