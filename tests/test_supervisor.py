"""The node agent with real processes (no Slurm): backoff, crash loop, reload, stop, reaping, notify, probes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers.wait import wait_for
from slurm_ext import config
from slurm_ext.procfs import all_stats, pid_alive
from slurm_ext.supervisor.agent import session_members
from slurm_ext.supervisor.notify import is_descendant, parse
from slurm_ext.supervisor.slurmd_args import SlurmdLayout, layout_of, with_gpus
from slurm_ext.supervisor.restart import CrashWindow, backoff_delay, should_restart
from slurm_ext.supervisor.workers import speaks_notify, workers_for

# -- pure rules ------------------------------------------------------------------------


def test_backoff_doubles_from_the_first_delay_to_the_cap():
    assert [backoff_delay(n, 0.01, 0.1) for n in range(1, 7)] == [0.01, 0.02, 0.04, 0.08, 0.1, 0.1]
    assert backoff_delay(10_000, 0.01, 30.0) == 30.0


def test_restart_policies():
    assert should_restart("always", 0) and should_restart("always", None)
    assert should_restart("on-failure", 1) and should_restart("on-failure", None)
    assert not should_restart("on-failure", 0)
    assert not should_restart("never", 1)


def test_crash_window_counts_exits_within_the_window_only():
    window = CrashWindow(3, 10.0)
    assert not window.add(0.0) and not window.add(5.0)
    assert not window.add(20.0)  # the first two fell out of the window
    assert not window.add(25.0) and window.add(29.0)


def test_notify_parse():
    message = parse(b"READY=1\nMAINPID=4242\nSTATUS=serving jobs\nX-CUSTOM=1\n", 7)
    assert (message.sender, message.ready, message.mainpid, message.status) == (7, True, 4242, "serving jobs")
    bad = parse(b"garbage line\nMAINPID=-3\n\xff\xfe\n", 7)
    assert bad.mainpid is None and len(bad.garbage) == 3


def test_is_descendant():
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert is_descendant(child.pid, os.getpid())
        assert not is_descendant(os.getpid(), child.pid)
        assert not is_descendant(999_999_999, os.getpid())
    finally:
        child.kill()
        child.wait()


def test_role_workers_from_builtins_and_config(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[supervisor.workers.slurmd]\ncommand = ["slurmd", "-D", "-N", "n1"]\nstop_grace = "5s"\n'
                    '[supervisor.workers.munged]\nroles = ["worker"]\n'
                    '[supervisor.workers.extra]\nroles = ["worker"]\ncommand = ["sleep", "9"]\n')
    specs = workers_for("worker", config.load(path).supervisor)
    assert [s.name for s in specs] == ["munged", "hooks", "slurmd", "health", "extra"]
    slurmd = specs[2]
    assert slurmd.command == ("slurmd", "-D", "-N", "n1") and slurmd.stop_grace == 5.0
    assert slurmd.ready == "slurm-node" and slurmd.drain_on_crash_loop  # built-in keys kept
    assert [s.name for s in workers_for("controller", config.Config().supervisor)] == [
        "slurmctld", "accept-idle", "repair", "collector", "web"]


def test_arguments_after_the_double_dash_go_to_the_roles_daemon(tmp_path):
    """What a Slinky NodeSet passes as the container's arguments reaches slurmd, after the config's own."""
    path = tmp_path / "c.toml"
    path.write_text('[supervisor.workers.slurmd]\ncommand = ["slurmd", "-D"]\n')
    given = ("-Z", "--conf-server", "ctld:6817", "--conf", "Features=gpu")
    specs = {s.name: s for s in workers_for("worker", config.load(path).supervisor, given)}
    assert specs["slurmd"].command == ("slurmd", "-D", *given)
    assert specs["hooks"].command[-2:] == ("hooks", "serve")  # the other workers keep theirs
    assert workers_for("controller", config.Config().supervisor, ("-i",))[0].command == ("slurmctld", "-D", "-i")
    path.write_text('[supervisor.workers.slurmd]\nroles = []\n')
    with pytest.raises(ValueError, match="arguments after -- are for slurmd, which role worker does not run"):
        workers_for("worker", config.load(path).supervisor, given)
    # the command line: everything after -- is the daemon's, options of slurmd's included
    from slurm_ext.cli import _parser
    args = _parser().parse_args(["supervise", "--role", "worker", "--", *given])
    assert tuple(args.daemon_args) == given
    # then $SLURMD_OPTIONS, as Debian's /etc/default/slurmd and Slinky's images give it
    from slurm_ext.supervisor.cli import daemon_args
    assert daemon_args("worker", list(given), {"SLURMD_OPTIONS": "-v --conf 'Features=a b'"}) == \
        (*given, "-v", "--conf", "Features=a b")
    assert daemon_args("controller", [], {"SLURMD_OPTIONS": "-v"}) == ()
    with pytest.raises(config.ConfigError, match=r"\$SLURMD_OPTIONS.*does not split"):
        daemon_args("worker", [], {"SLURMD_OPTIONS": "--conf 'unclosed"})


def test_slurmd_with_systemd_from_slurm_23_11_unless_the_config_names_its_command(tmp_path):
    assert [speaks_notify(v) for v in ("slurm-wlm 22.05.8", "slurm 23.02.7", "slurm 23.11.1", "slurm 26.05.5",
                                       "slurm-wlm 24.11.5", "", "slurmd: not found")] == \
        [False, False, True, True, True, False, False]
    defaults = config.Config().supervisor
    slurmd = {s.name: s for s in workers_for("worker", defaults, ("-Z",), slurmd_notify=True)}["slurmd"]
    assert slurmd.command == ("slurmd", "--systemd", "-Z") and slurmd.notify and slurmd.ready == "slurm-node"
    assert {s.name: s for s in workers_for("worker", defaults)}["slurmd"].command == ("slurmd", "-D")
    path = tmp_path / "c.toml"
    path.write_text('[supervisor.workers.slurmd]\ncommand = ["slurmd", "-D"]\n')
    own = {s.name: s for s in workers_for("worker", config.load(path).supervisor, slurmd_notify=True)}["slurmd"]
    assert own.command == ("slurmd", "-D") and not own.notify
    # slurmd refuses --systemd beside -D, and without a socket: -D in the arguments, or notify = false, keep -D
    with_d = {s.name: s for s in workers_for("worker", defaults, ("-D", "-Z"), slurmd_notify=True)}["slurmd"]
    assert with_d.command[:2] == ("slurmd", "-D") and not with_d.notify
    path.write_text('[supervisor.workers.slurmd]\nnotify = false\n')
    off = {s.name: s for s in workers_for("worker", config.load(path).supervisor, slurmd_notify=True)}["slurmd"]
    assert off.command == ("slurmd", "-D") and not off.notify


def test_slurmd_layout_and_the_gpus_in_a_dynamic_nodes_conf():
    slinky = ("-Z", "--conf-server", "ctld:6817", "--conf", "Features=gpu Gres=gpu:8,shard:4", "-N", "w1")
    assert layout_of(slinky) == SlurmdLayout(node="w1", dynamic=True, configless=True)
    assert layout_of(("-D", "-Nw2")) == SlurmdLayout(node="w2", dynamic=False, configless=False)
    assert layout_of(("--conf-server=c:1", "--conf=Features=x")) == SlurmdLayout(None, False, True)
    assert with_gpus(slinky, "gpu:h200:2")[4] == "Features=gpu Gres=gpu:h200:2,shard:4"
    assert with_gpus(slinky, "")[4] == "Features=gpu Gres=shard:4"
    assert with_gpus(("-Z", "--conf=Features=x"), "gpu:a100:1") == ("-Z", "--conf=Features=x Gres=gpu:a100:1")
    assert with_gpus(("-Z",), "gpu:a100:1") == ("-Z", "--conf", "Gres=gpu:a100:1")
    assert with_gpus(("-Z",), "") == ("-Z",)
    assert with_gpus(("-D", "--conf", "Features=x"), "gpu:a100:1") == ("-D", "--conf", "Features=x")  # static
    # slurmd takes the last --conf; a GRES whose name only starts with gpu is another GRES
    assert with_gpus(("-Z", "--conf", "A=1", "--conf", "Features=x Gres=gpu_mem:4"), "gpu:h200:1") == \
        ("-Z", "--conf", "A=1", "--conf", "Features=x Gres=gpu:h200:1,gpu_mem:4")


def test_a_worker_with_no_command_is_a_config_error(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[supervisor.workers.extra]\nroles = ["worker"]\n')
    with pytest.raises(ValueError, match="supervisor.workers.extra: runs in role worker but has no command"):
        workers_for("worker", config.load(path).supervisor)


def test_bad_worker_keys_name_the_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[supervisor.workers.slurmd]\nrestart = "sometimes"\n')
    with pytest.raises(config.ConfigError, match=r"line 2: supervisor.workers.slurmd.restart: 'sometimes'"):
        config.load(path)
    path.write_text('[supervisor]\nports = {workr = 1}\n')
    with pytest.raises(config.ConfigError, match="unknown name 'workr'"):
        config.load(path)


# -- the agent as a process ------------------------------------------------------------

CRASHY = """\
    backoff_initial = "20ms"
    backoff_max = "320ms"
    crash_loop_count = 6
    crash_loop_window = "2s"
    stable_after = "1s"
    [supervisor.workers.sshd]
    roles = []
    [supervisor.workers.flaky]
    roles = ["login"]
    command = ["sh", "-c", "exit 3"]
    """


def test_crash_loop_backs_off_to_the_cap_and_a_reload_fixes_it(agents):
    agent = agents(CRASHY)
    delays = [e["delay"] for e in agent.wait_event("worker-state", count=9, worker="flaky", state="backoff")]
    assert delays[:6] == [0.02, 0.04, 0.08, 0.16, 0.32, 0.32], delays
    assert set(delays[5:]) == {0.32}
    crash = [e for e in agent.journal() if e["event"] == "crash-loop"]
    assert len(crash) == 1 and crash[0]["worker"] == "flaky" and "exit status 3" in crash[0]["last"]
    assert agent.metric("slurm_ext_supervisor_crash_loop", worker="flaky") == 1
    status, why = agent.get("/readyz")
    assert status == 503 and "worker flaky: backoff" in why

    # a worker that keeps dying is retried at the capped delay: no tight loop
    starts_before = len(agent.events("worker-state", state="running"))
    time.sleep(1.0)
    assert len(agent.events("worker-state", state="running")) - starts_before <= 1.0 / 0.32 + 1

    agent.write_config(CRASHY.replace('command = ["sh", "-c", "exit 3"]', 'command = ["sleep", "300"]'))
    agent.proc.send_signal(signal.SIGHUP)
    agent.wait_event("worker-state", worker="flaky", was="backoff", state="running", message=re.compile("sleep 300"))
    agent.wait_event("recovered", worker="flaky")
    assert agent.metric("slurm_ext_supervisor_crash_loop", worker="flaky") == 0
    assert agent.get("/readyz") == (200, "ready\n")
    assert agent.stop() == 0


def test_a_worker_removed_by_a_reload_and_added_back_runs_again(agents):
    base = '[supervisor.workers.sshd]\nroles = []\n[supervisor.workers.a]\nroles = ["login"]\n'
    # `a` takes 4 s to stop: added back while it is still stopping, then after it has stopped
    slow = base + 'command = ["sh", "-c", "trap \'sleep 4; exit 0\' TERM; sleep 300 & wait"]\n'
    removed = '[supervisor.workers.sshd]\nroles = []\n[supervisor.workers.a]\nroles = []\n' \
              'command = ["sleep", "300"]\n'

    def reload(text: str) -> None:
        agent.write_config(text)
        agent.proc.send_signal(signal.SIGHUP)

    agent = agents(slow)
    agent.wait_event("worker-state", worker="a", was="stopped", state="running")
    for round_, wait_stopped in ((1, False), (2, True)):
        reload(removed)
        agent.wait_event("worker-state", count=round_, worker="a", was="running", state="stopping")
        if wait_stopped:
            agent.wait_event("worker-state", count=round_, worker="a", was="stopping", state="stopped")
            # a removed worker that has stopped is not waited for
            wait_for("ready without it", lambda: agent.get("/readyz") == (200, "ready\n"), timeout=3)
        reload(slow)
        agent.wait_event("worker-state", count=round_ + 1, worker="a", was="stopped", state="running")
    added = [e for e in agent.journal() if e["event"] == "worker-added"]
    assert len(added) == 2 and "once its stop is over" in added[0]["message"], added
    # started again on a pidfd of the number the old one had: not taken for an exit (a second, untracked `a`)
    assert not agent.events("worker-exited", message=re.compile("not this agent's child"))

    # removed, added back and removed again, all before it has stopped: it stays stopped
    reload(removed)
    agent.wait_event("worker-state", count=3, worker="a", was="running", state="stopping")
    reload(slow)
    agent.wait_event("worker-added", count=2, worker="a", message=re.compile("started once its stop is over"))
    reload(removed)
    agent.wait_event("worker-state", count=3, worker="a", was="stopping", state="stopped")
    wait_for("ready without it", lambda: agent.get("/readyz") == (200, "ready\n"), timeout=3)
    time.sleep(1)
    assert len(agent.events("worker-state", worker="a", state="running")) == 3
    assert agent.stop() == 0


def test_reload_with_a_bad_config_keeps_the_running_one(agents):
    agent = agents('[supervisor.workers.sshd]\nroles = []\n[supervisor.workers.a]\nroles = ["login"]\n'
                   'command = ["sleep", "300"]\n')
    agent.wait_event("worker-state", worker="a", state="running")
    agent.config.write_text(agent.config.read_text() + "stop_grace = 5\n")
    agent.proc.send_signal(signal.SIGHUP)
    agent.wait_event("reload-failed", message=re.compile("config not reloaded, keeping the running one: .*stop_grace"))
    assert agent.proc.poll() is None and agent.get("/livez")[0] == 200
    assert agent.stop() == 0


def test_missing_binary_is_an_event_and_a_backoff_not_a_crash(agents):
    agent = agents('backoff_initial = "50ms"\nbackoff_max = "200ms"\n[supervisor.workers.sshd]\nroles = []\n'
                   '[supervisor.workers.ghost]\nroles = ["login"]\ncommand = ["slurm-ext-no-such-program"]\n')
    [first, *_] = agent.wait_event("worker-state", count=4, worker="ghost", state="backoff",
                                   message=re.compile("cannot start: slurm-ext-no-such-program: not found in PATH"))
    assert first["was"] == "stopped" and not agent.events("crash-loop") and not agent.events("worker-exited")
    assert agent.proc.poll() is None and agent.get("/livez")[0] == 200
    assert agent.stop() == 0


def test_sigterm_stops_in_reverse_order_and_sigkills_a_worker_that_ignores_it(agents):
    agent = agents("""\
        [supervisor.workers.sshd]
        roles = []
        [supervisor.workers.first]
        roles = ["login"]
        command = ["sleep", "300"]
        [supervisor.workers.stubborn]
        roles = ["login"]
        command = ["sh", "-c", "trap '' TERM; sleep 300 & wait; sleep 300"]
        stop_grace = "700ms"
        """)
    pids = [e["pid"] for e in agent.wait_event("worker-state", count=2, was="stopped", state="running")]
    time.sleep(0.3)
    session = session_members(pids[1])
    assert len(session) >= 2, "the stubborn worker's shell and its sleep"
    started = time.monotonic()
    code = agent.stop()
    elapsed = time.monotonic() - started
    assert code == 1, "a stop that needed SIGKILL is not clean"
    assert 0.6 < elapsed < 10
    stops = [e["worker"] for e in agent.events("worker-state", state="stopping")]
    assert stops == ["stubborn", "first"], stops
    [killed] = agent.events("kill")
    assert killed["worker"] == "stubborn" and "still running 0.7s after SIGTERM: SIGKILL" in killed["message"]
    leftovers = [p for p in session + pids if pid_alive(p)]
    assert not leftovers, f"still running after the agent stopped: {leftovers}"


def test_unknown_role_is_exit_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "slurm_ext.cli", "supervise", "--role", "wizard"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "unknown role 'wizard'" in result.stderr and "Traceback" not in result.stderr


def test_unreadable_config_is_exit_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "slurm_ext.cli", "--config", str(tmp_path / "nope.toml"),
                             "supervise", "--role", "login"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "nope.toml: no such file" in result.stderr


ORPHANS = textwrap.dedent("""\
    import os, sys, time
    count = int(sys.argv[1])
    time.sleep(0.5)
    for _ in range(count):
        child = os.fork()
        if child == 0:
            if os.fork() == 0:      # the grandchild: orphaned at once, exits soon after
                time.sleep(0.05)
                os._exit(0)
            os._exit(0)
        os.waitpid(child, 0)        # reap our own child: only the grandchildren are orphans
    open(sys.argv[2], "w").write("done")
    time.sleep(300)
    """)


def _zombies_of(parent: int) -> int:
    return sum(1 for stat in all_stats() if stat.state == "Z" and stat.ppid == parent)


@pytest.mark.parametrize("mode", ["subreaper", "pid1"])
def test_a_burst_of_orphans_leaves_no_zombie(agents, tmp_path, mode):
    script = tmp_path / "orphans.py"
    script.write_text(ORPHANS)
    done = tmp_path / "done"
    prefix = ["unshare", "--pid", "--fork", "--mount-proc"] if mode == "pid1" else []
    agent = agents(f"""\
        [supervisor.workers.sshd]
        roles = []
        [supervisor.workers.spawner]
        roles = ["login"]
        command = ["{sys.executable}", "{script}", "2000", "{done}"]
        """, prefix=prefix)
    deadline = time.monotonic() + 60
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done.exists(), agent.text()[-2000:]
    agent_pid = agent.pid
    if mode == "pid1":  # unshare forks the agent, which is PID 1 inside the new namespace
        assert Path(f"/proc/{agent_pid}/status").read_text().split("NSpid:")[1].split()[1] == "1"
    time.sleep(1.0)
    assert _zombies_of(agent_pid) == 0
    assert agent.metric("slurm_ext_supervisor_orphans_reaped_total", role="login") >= 2000
    assert agent.stop() == 0


NOTIFY_WORKER = textwrap.dedent("""\
    import os, select, socket, struct, sys, time

    def send(data, fds=()):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.connect(os.environ["NOTIFY_SOCKET"])
        s.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else [])
        s.close()

    def barrier():
        # sd_notify_barrier, as slurmd does after READY=1: the receiver closing its copy of the
        # write end is the answer (POLLHUP); slurmd waits 5 s for it
        r, w = os.pipe()
        send(b"BARRIER=1", [w])
        os.close(w)
        started = time.monotonic()
        answered = select.select([r], [], [], 5.0)[0]  # readable at EOF: no write end left open
        with open(os.environ["BARRIER_FILE"], "a") as out:
            out.write(f"{'answered' if answered else 'timed out'} {time.monotonic() - started:.3f}\\n")

    generation = int(sys.argv[1])
    send(f"READY=1\\nMAINPID={os.getpid()}\\nSTATUS=generation {generation}".encode())
    barrier()
    send(b"\\xff\\xfe this is no sd_notify message")
    send(b"MAINPID=1")  # not a descendant of the agent: must be ignored
    if generation == 0:
        time.sleep(1.0)
        child = os.fork()     # what slurmd does on reconfigure: fork, exec the new one, hand over, exit
        if child == 0:
            os.execv(sys.executable, [sys.executable, sys.argv[0], "1"])
        send(f"MAINPID={child}".encode())
        time.sleep(0.3)
        sys.exit(0)
    while True:
        time.sleep(1)
    """)


def test_notify_worker_re_exec_is_followed_through_mainpid(agents, tmp_path):
    script = tmp_path / "notifier.py"
    script.write_text(NOTIFY_WORKER)
    agent = agents(f"""\
        [supervisor.workers.sshd]
        roles = []
        [supervisor.workers.notifier]
        roles = ["login"]
        command = ["{sys.executable}", "{script}", "0"]
        notify = true
        ready = "notify"
        environment = {{ BARRIER_FILE = "{tmp_path / 'barriers'}" }}
        """)
    first = agent.wait_event("worker-state", worker="notifier", was="stopped", state="running")[0]["pid"]
    agent.wait_event("worker-ready", worker="notifier", ready="notify")
    assert agent.get("/readyz") == (200, "ready\n")
    agent.wait_log(r"not sd_notify KEY=VALUE")
    agent.wait_log(r"MAINPID=1 is not a descendant of this agent: ignored")
    second = agent.wait_event("mainpid", worker="notifier")[0]["pid"]
    assert second != first
    deadline = time.monotonic() + 5
    while pid_alive(first) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert agent.metric("slurm_ext_supervisor_restarts_total", worker="notifier") == 0, "the hand-over was a crash"
    assert not agent.events("worker-state", worker="notifier", state="backoff")
    # both generations' barriers were answered at once: the agent closed the descriptor each passed
    barriers = (tmp_path / "barriers").read_text().split("\n")[:-1]
    assert len(barriers) == 2 and all(b.startswith("answered ") and float(b.split()[1]) < 1.0
                                      for b in barriers), barriers

    os.kill(second, signal.SIGKILL)  # the new main process dying is the worker dying
    agent.wait_event("worker-state", worker="notifier", was="running", state="backoff",
                     message=re.compile(r"died \(killed by SIGKILL\)"))
    agent.wait_event("worker-state", worker="notifier", was="backoff", state="running")
    assert agent.metric("slurm_ext_supervisor_restarts_total", worker="notifier") == 1
    assert agent.stop() == 0


def test_probe_command_and_metrics(agents):
    agent = agents('[supervisor.workers.sshd]\nroles = []\n[supervisor.workers.a]\nroles = ["login"]\n'
                   'command = ["sleep", "300"]\n')
    agent.wait_event("worker-state", worker="a", state="running")
    base = [sys.executable, "-m", "slurm_ext.cli", "--config", str(agent.config), "probe"]
    for kind in ("live", "ready"):
        result = subprocess.run([*base, kind, "--role", "login", "--port", str(agent.port)], capture_output=True,
                                text=True, timeout=30)
        assert result.returncode == 0, result.stderr
    assert agent.metric("slurm_ext_supervisor_worker_up", worker="a") == 1
    assert agent.metric("slurm_ext_supervisor_worker_state", worker="a", state="running") == 1
    assert agent.metric("slurm_ext_supervisor_worker_state", worker="a", state="backoff") == 0
    assert agent.metric("slurm_ext_supervisor_worker_uptime_seconds", worker="a") > 0
    assert agent.metric("slurm_ext_supervisor_ready", role="login") == 1
    assert agent.stop() == 0
    result = subprocess.run([*base, "live", "--role", "login", "--port", str(agent.port)], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 1 and "no agent answers" in result.stderr


def test_a_taken_probe_port_is_a_clear_error(tmp_path):
    import socket
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "slurm_ext.cli", "supervise", "--role", "login", "--port",
                                 str(port), "--pidfile", str(tmp_path / "agent.pid")],
                                capture_output=True, text=True, timeout=60, env={**os.environ, "SLURM_EXT_CONFIG": ""})
    assert result.returncode == 1, result.stderr
    assert f"cannot listen on 127.0.0.1:{port} for probes and metrics: Address already in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "agent.pid").exists()


def test_start_steps_block_or_continue_and_boot_steps_run_once_per_boot(tmp_path):
    from slurm_ext.supervisor import pipeline

    ran = []
    emitted = []

    def ok(context):
        ran.append("boot")

    def broken(context):
        ran.append("broken")
        raise RuntimeError("no GPUs answered")

    context = pipeline.StepContext("worker", config.Config(), "n1",
                                   lambda event, message, **kw: emitted.append((event, message, kw)))
    steps = [pipeline.StartStep("boot", ok, once_per_boot=True), pipeline.StartStep("broken", broken)]
    assert pipeline.run_steps(steps, context, tmp_path, "boot-a") is True  # broken continues by default
    assert pipeline.run_steps(steps, context, tmp_path, "boot-a") is True
    assert ran == ["boot", "broken", "broken"], "a node-boot step ran twice in one boot"
    assert pipeline.run_steps(steps, context, tmp_path, "boot-b") is True
    assert ran[-2:] == ["boot", "broken"]
    assert emitted[0][0] == "start-step-failed" and "no GPUs answered" in emitted[0][1]

    blocking = config.from_dict({"supervisor": {"step_failure": {"broken": "block"}}})
    context = pipeline.StepContext("worker", blocking, "n1",
                                   lambda event, message, **kw: emitted.append((event, message, kw)))
    assert pipeline.run_steps(steps, context, tmp_path, "boot-b") is False
    assert "workers are not started until it succeeds" in emitted[-1][1]


def test_systemd_notify_for_the_agent_itself(agents, tmp_path):
    import socket
    path = tmp_path / "systemd-notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(path))
    listener.settimeout(10)
    os.environ["NOTIFY_SOCKET"], os.environ["WATCHDOG_USEC"] = str(path), "400000"
    try:
        agent = agents('[supervisor.workers.sshd]\nroles = []\n[supervisor.workers.a]\nroles = ["login"]\n'
                       'command = ["sh", "-c", "echo NOTIFY_SOCKET=$NOTIFY_SOCKET; exec sleep 300"]\n')
    finally:
        del os.environ["NOTIFY_SOCKET"], os.environ["WATCHDOG_USEC"]
    messages = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (any("READY=1" in m for m in messages)
                                               and sum("WATCHDOG=1" in m for m in messages) >= 2):
        messages.append(listener.recv(4096).decode())
    listener.close()
    assert any("READY=1" in m and "STATUS=login: ready" in m for m in messages), messages
    assert sum("WATCHDOG=1" in m for m in messages) >= 2, messages
    agent.wait_log(r"NOTIFY_SOCKET=\n")  # the worker did not inherit systemd's socket
    assert agent.stop() == 0


def test_systemd_notify_to_an_abstract_socket_one_line_and_again_when_not_taken():
    """NOTIFY_SOCKET '@name' is the abstract name; a status is one line (a newline in a reason must not become
    another assignment, STOPPING=1); a status nobody took is sent again at the next tick, never blocking."""
    import socket
    import uuid
    from supervisor.notify import SystemdLink
    name = f"slurm-ext-test-{uuid.uuid4().hex}"
    link = SystemdLink("@" + name, 0)
    assert link.next_send() == float("inf")  # no watchdog, nothing waiting: the loop need not wake for it
    link.tick(1.0, True, "worker: ready")  # nobody listens yet: not taken, no exception
    assert link.next_send() == 2.0  # tried again in a second
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind("\0" + name)
    listener.settimeout(5)
    try:
        link.tick(2.0, True, "worker: ready")
        assert listener.recv(4096) == b"READY=1\nSTATUS=worker: ready" and link.next_send() == float("inf")
        link.tick(3.0, False, "worker slurmd: it said\nSTOPPING=1")
        assert listener.recv(4096) == b"STATUS=worker slurmd: it said STOPPING=1"
    finally:
        listener.close()
        link._sock.close()


def test_a_blocking_start_step_keeps_workers_down_and_is_retried_with_backoff(agents, tmp_path):
    agent = agents("""\
        step_failure = {"clear-stale-drains" = "block"}
        [supervisor.workers.slurmd]
        command = ["sleep", "300"]
        """, role="worker", slurm=f'conf = "{tmp_path}/no-such-slurm.conf"')
    agent.wait_event("start-step-failed", count=2, timeout=15,
                     message=re.compile("start step clear-stale-drains failed: .*workers are not started until it "
                                        "succeeds"))
    assert not agent.events("worker-state", worker="slurmd")
    status, why = agent.get("/readyz")
    assert status == 503 and "start steps have not succeeded" in why
    started = time.monotonic()
    assert agent.stop() == 0
    assert time.monotonic() - started < 5


def test_preflight_names_a_missing_or_loose_slurm_key_and_the_mount_that_provides_it(tmp_path):
    from slurm_ext.supervisor.preflight import problems
    [missing] = problems(tmp_path)
    assert "/etc/slurm/slurm.key is missing" in missing and "slurmKeyRef" in missing and "-v KEY:" in missing
    assert problems(tmp_path, munged_here=True) == []  # the agent's own munged makes the socket
    assert "for slurmctld" in problems(tmp_path, daemon="slurmctld")[0]
    (tmp_path / "run/munge").mkdir(parents=True)
    (tmp_path / "run/munge/munge.socket.2").touch()
    assert problems(tmp_path) == []  # auth/munge instead
    key = tmp_path / "etc/slurm/slurm.key"
    key.parent.mkdir(parents=True)
    key.write_bytes(b"k" * 1024)
    key.chmod(0o644)
    [loose] = problems(tmp_path)
    assert "mode 0644" in loose and "defaultMode: 0600" in loose
    key.chmod(0o600)
    assert problems(tmp_path) == []


def test_each_change_of_the_agents_own_state_is_one_event_and_its_metric(agents):
    agent = agents('[supervisor.workers.sshd]\nroles = []\n[supervisor.workers.a]\nroles = ["login"]\n'
                   'command = ["sleep", "300"]\n')
    agent.wait_event("worker-state", worker="a", state="running")
    assert agent.metric("slurm_ext_supervisor_state", role="login", state="running") == 1
    assert agent.metric("slurm_ext_supervisor_state", role="login", state="starting") == 0
    assert agent.stop() == 0
    states = [(e["event"], e.get("state")) for e in agent.journal() if e["component"] == "supervisor"
              and e["event"] in ("started", "running", "stop", "exited")]
    assert states == [("started", "starting"), ("running", "running"), ("stop", "stopping"), ("exited", "stopped")]
