#!/usr/bin/env python3
"""Benchmark: the node agent (`slurm-ext supervise`) against supervisord and dumb-init.

Every figure is printed with a baseline measured in the same run, and with
the ratio ours / baseline:

1. restart: slurmd of a real local cluster is killed with SIGKILL N times,
   at least --kill-gap seconds apart (so the crash-loop rule, 5 exits in 10 s,
   never triggers). Per kill: the time until a new slurmd PID is a child of
   the supervisor (polled every 2 ms), and until `scontrol show slurmd`
   answers. Ours: the cluster's supervise-worker agent. Baseline: supervisord
   (autorestart=true, startsecs=0) running the same `slurmd -D -N NODE` with
   the same environment. Targets: new PID within 0.05 s (ratio <= 0.1),
   answering within 0.3 s.
2. reap: each supervisor runs as PID 1 of a new PID namespace (unshare
   --pid --fork --mount-proc) a worker that makes K orphans by double fork,
   each exiting at once. Sampled from the host every 1 ms: the most zombies
   of that PID 1 at once, and the time from the burst's end until none is
   left (capped at 120 s). Ours vs supervisord vs dumb-init. Targets: as good
   as dumb-init: cleared within 50 ms of the burst's end, never more than
   100 at once.
3. idle: CPU time (utime+stime of the supervisor process only) over T
   seconds, as % of one core, and RSS at the end, supervising an idle slurmd.
   Targets: under 0.05 % and at most supervisord's RSS (the agent's after one
   /metrics scrape, with prometheus_client loaded, is printed too).

supervisord and dumb-init come from PyPI, installed with pip into a venv in
the run's temp dir; if one cannot be installed, only its baseline is skipped.

Run as root: python tests/benchmarks/bench_supervisor.py [--quick] [--kills N]
    [--orphans K] [--idle-seconds T] [--parts restart,idle,reap]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from slurm_ext import devcluster as dev
from slurm_ext.devcluster.settings import DevSection
from slurm_ext.devcluster import daemons
from slurm_ext.devcluster.cluster import cluster_daemons
from slurm_ext.devcluster.layout import Layout
from slurm_ext.procfs import all_stats, comm, pid_alive, read_stat

#: the bench cluster: its own names and ports, apart from the test cluster and `dev up`
BENCH_CLUSTER = dict(
    cluster_name="benchsup",
    node_name="benchsup1",
    slurmctld_port=26817,
    slurmd_port=26818,
    slurmdbd_port=26819,
    mariadb_port=23307,
    controller_probe_port=29811,
    worker_probe_port=29810,
    web_port=29813,
)

POLL_PID = 0.002  # seconds between looks for the new slurmd PID
SAMPLE = 0.001  # seconds between zombie samples
REAP_CAP = 120.0  # longest wait for the zombies to be cleared after a burst
CLK_TCK = os.sysconf("SC_CLK_TCK")

#: the burst: K orphans by double fork, each exiting at once; then "done" and sleep.
#: The done file holds the burst's start and end on CLOCK_MONOTONIC (system-wide).
BURST = textwrap.dedent("""\
    import os, sys, time
    count, done = int(sys.argv[1]), sys.argv[2]
    time.sleep(0.5)                 # lets the host find this namespace's PID 1 first
    start = time.monotonic()
    for _ in range(count):
        child = os.fork()
        if child == 0:
            os.fork()               # parent and grandchild both exit at once:
            os._exit(0)             # the grandchild is an orphan of PID 1
        os.waitpid(child, 0)        # our own child is reaped here
    end = time.monotonic()
    with open(done + ".tmp", "w") as f:
        f.write(f"{start} {end}\\n")
    os.rename(done + ".tmp", done)
    time.sleep(3600)
    """)


def note(text: str) -> None:
    """Progress, on stderr: stdout holds the figures."""
    print(f"# {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


# -- processes ----------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    """Children of every thread of `pid` (zombies included)."""
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids.extend(int(k) for k in f.read().split())
        except OSError:
            pass
    return kids


def slurmd_child(supervisor: int, not_pid: int | None = None) -> int | None:
    """The live slurmd that is a child of `supervisor`, other than `not_pid`."""
    for kid in children(supervisor):
        if kid != not_pid and comm(kid) == "slurmd" and pid_alive(kid):
            return kid
    return None


def find_slurmd(supervisor: int) -> int | None:
    """The supervisor's live slurmd child, by psutil (the 2 ms poll reads /proc directly)."""
    try:
        for child in psutil.Process(supervisor).children():
            try:
                if child.name() == "slurmd" and child.status() != psutil.STATUS_ZOMBIE:
                    return child.pid
            except psutil.NoSuchProcess:
                continue
    except psutil.NoSuchProcess:
        raise SystemExit(f"supervisor pid {supervisor} is gone") from None
    return None


def zombie_children(pid: int) -> int:
    """Zombies whose parent is `pid`: its children list, each child's state."""
    return sum(1 for kid in children(pid) if getattr(read_stat(kid), "state", "") == "Z")


def zombies_by_scan(pid: int) -> int:
    """The same count by a scan of /proc/*/stat (state Z, ppid == pid)."""
    return sum(1 for stat in all_stats() if stat.state == "Z" and stat.ppid == pid)


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    fields = data[data.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def run_ns(pid: int) -> int | None:
    """Nanoseconds on CPU of the process's live threads (/proc/PID/task/*/schedstat), or None."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def stop_pid(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
    """Stop a process this script started, by its PID: `sig`, then SIGKILL."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, sig)
            proc.wait(timeout)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            note(f"pid {proc.pid} still runs {timeout:g}s after signal {sig}: SIGKILL")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)


def kill_leftovers(pids: set[int], name: str) -> None:
    """SIGKILL the processes of ours in `pids` that still run as `name`, and wait for them."""
    for pid in pids:
        if pid_alive(pid) and comm(pid) == name:
            note(f"{name} pid {pid} outlived its supervisor: SIGKILL")
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(pid_alive(p) and comm(p) == name for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def reap_own_children() -> None:
    """Reap this process's exited children (the daemons dev up started by Popen and dev
    down stopped), so that none is left a zombie for the host's PID 1."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# -- baselines from PyPI --------------------------------------------------------------------


@dataclass
class Baselines:
    supervisord: str | None = None
    dumb_init: str | None = None


def install_baselines(venv: Path) -> Baselines:
    """One venv per run, one pip install per package: a failure skips only that baseline."""
    found = Baselines()
    note(f"creating a venv for the baselines in {venv}")
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        print(f"baselines: could not create a venv ({made.stderr.strip()[-300:]}): "
              "supervisord and dumb-init baselines skipped")
        return found
    for package, program, attr in (("supervisor", "supervisord", "supervisord"), ("dumb-init", "dumb-init",
                                                                                   "dumb_init")):
        note(f"pip install {package}")
        pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", package],
                             capture_output=True, text=True, env=_clean_env(), cwd=str(venv))
        path = venv / "bin" / program
        if pip.returncode != 0 or not os.access(path, os.X_OK):
            print(f"baseline {program}: could not be installed (pip install {package}: "
                  f"{(pip.stderr or pip.stdout).strip()[-300:]}): its baseline is skipped")
            continue
        version = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "show", package],
                                 capture_output=True, text=True, env=_clean_env()).stdout
        version = next((line.split()[1] for line in version.splitlines() if line.startswith("Version:")), "?")
        note(f"{package} {version} installed")
        setattr(found, attr, str(path))
    return found


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ without PYTHONPATH: the checkout's supervisor/ must not shadow supervisord's package."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(extra or {})
    return env


# -- 1. restart latency -----------------------------------------------------------------------


def scontrol_answers(env: dict[str, str]) -> bool:
    try:
        return subprocess.run(["scontrol", "show", "slurmd"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def wait_answering(supervisor: int, env: dict[str, str], timeout: float = 90.0) -> int:
    """Wait until the supervisor's slurmd runs and answers; its PID."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = find_slurmd(supervisor)
        if pid and scontrol_answers(env):
            return pid
        time.sleep(0.1)
    raise SystemExit(f"slurmd under pid {supervisor} did not answer `scontrol show slurmd` within {timeout:g}s")


def kill_loop(label: str, supervisor: int, env: dict[str, str], kills: int, gap: float,
              seen: set[int] | None = None) -> tuple[list[float], list[float]]:
    """SIGKILL the supervisor's slurmd `kills` times; per kill: seconds to a new PID, to an answer."""
    to_pid, to_answer = [], []
    wait_answering(supervisor, env)
    last_kill = 0.0
    for i in range(kills):
        time.sleep(max(0.0, last_kill + gap - time.monotonic()))
        old = find_slurmd(supervisor)
        if old is None:  # should not happen: the last one answered
            old = wait_answering(supervisor, env)
        if seen is not None:
            seen.add(old)
        last_kill = killed = time.monotonic()
        os.kill(old, signal.SIGKILL)
        deadline = killed + 60
        new = None
        while new is None:
            new = slurmd_child(supervisor, not_pid=old)
            if new is None:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{label}: no new slurmd under pid {supervisor} within 60 s of kill {i + 1}")
                time.sleep(POLL_PID)
        got_pid = time.monotonic()
        if seen is not None:
            seen.add(new)
        while not scontrol_answers(env):
            if time.monotonic() > deadline:
                raise SystemExit(f"{label}: slurmd pid {new} not answering within 60 s of kill {i + 1}")
        answered = time.monotonic()
        to_pid.append(got_pid - killed)
        to_answer.append(answered - killed)
        note(f"{label}: kill {i + 1}/{kills}: slurmd {old} -> {new} in {got_pid - killed:.4f} s, "
             f"answering in {answered - killed:.4f} s")
    return to_pid, to_answer


# -- 3. idle cost -----------------------------------------------------------------------------------


@dataclass
class Idle:
    #: utime+stime over the window, % of one core (resolution: one clock tick)
    cpu_percent: float
    rss_mb: float
    #: the same from schedstat (ns resolution, live threads only); None where unreadable
    sched_percent: float | None = None


def scraped_rss(agent: int, port: int) -> float:
    """The agent's RSS after one /metrics scrape (prometheus_client is loaded at the first)."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        answer.read()
    return rss_mb(agent)


def idle_cost(label: str, supervisor: int, seconds: float) -> Idle:
    note(f"{label}: idle for {seconds:g} s (pid {supervisor})")
    start_cpu, start_ns, start = cpu_seconds(supervisor), run_ns(supervisor), time.monotonic()
    time.sleep(seconds)
    used, end_ns, elapsed = cpu_seconds(supervisor) - start_cpu, run_ns(supervisor), time.monotonic() - start
    sched = None if start_ns is None or end_ns is None else 100.0 * (end_ns - start_ns) / 1e9 / elapsed
    return Idle(100.0 * used / elapsed, rss_mb(supervisor), sched)


# -- 2. orphan bursts as PID 1 ----------------------------------------------------------------------


@dataclass
class Reap:
    peak: int
    #: seconds from the burst's end to no zombie; None: not within REAP_CAP
    cleared: float | None
    burst: float
    error: str = ""


def run_burst(label: str, argv: list[str], done: Path, log: Path, cwd: Path, env: dict[str, str]) -> Reap:
    """Run `argv` as PID 1 of a new PID namespace; sample its zombies until cleared."""
    done.unlink(missing_ok=True)
    out = open(log, "ab")
    note(f"reap: {label}: {' '.join(argv)}")
    unshare = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", *argv], stdout=out, stderr=out,
                               stdin=subprocess.DEVNULL, cwd=str(cwd), env=env, start_new_session=True)
    pid1 = None
    try:
        deadline = time.monotonic() + 30
        while pid1 is None:
            kids = children(unshare.pid)
            if kids:
                pid1 = kids[0]
            elif unshare.poll() is not None or time.monotonic() > deadline:
                return Reap(0, None, 0.0, f"did not start (unshare exit {unshare.poll()}); see {log}")
            else:
                time.sleep(0.001)
        peak, burst_end, burst = 0, None, 0.0
        start = time.monotonic()
        while True:
            if burst_end is None and done.exists():
                begin, burst_end = (float(x) for x in done.read_text().split())
                burst = burst_end - begin
            zombies = zombie_children(pid1)
            now = time.monotonic()
            peak = max(peak, zombies)
            if burst_end is not None:
                if zombies == 0 and zombies_by_scan(pid1) == 0:
                    return Reap(peak, max(0.0, now - burst_end), burst)
                if now - burst_end > REAP_CAP:
                    return Reap(peak, None, burst)
            elif now - start > 600 or not pid_alive(pid1):
                return Reap(peak, None, burst, f"the burst did not finish; see {log}")
            time.sleep(SAMPLE)
    finally:
        if pid1 is not None and unshare.poll() is None:
            try:
                os.kill(pid1, signal.SIGKILL)  # PID 1 gone: the kernel kills the whole namespace
            except ProcessLookupError:
                pass
        try:
            unshare.wait(60)
        except subprocess.TimeoutExpired:
            note(f"unshare pid {unshare.pid} did not exit: SIGKILL")
            unshare.kill()
            unshare.wait(30)
        out.close()


def reap_part(work: Path, orphans: int, baselines: Baselines) -> dict[str, Reap]:
    script = work / "burst.py"
    script.write_text(BURST)
    done = work / "burst.done"
    env = _clean_env()
    burst_argv = [sys.executable, str(script), str(orphans), str(done)]
    results: dict[str, Reap] = {}

    # ours: a login agent whose only worker is the burst; --port 0: no listener
    agent_dir = work / "agent"
    agent_dir.mkdir(exist_ok=True)
    config = agent_dir / "slurm-ext.toml"
    config.write_text(textwrap.dedent(f"""\
        [node]
        name = "benchreap"
        state_dir = {json.dumps(str(agent_dir / "state"))}
        runtime_dir = {json.dumps(str(agent_dir / "run"))}
        [slurm]
        timeout = "2s"
        [supervisor.workers.sshd]
        roles = []
        [supervisor.workers.burst]
        roles = ["login"]
        command = {json.dumps(burst_argv)}
        """))
    results["ours"] = run_burst("ours", [sys.executable, "-m", "slurm_ext.cli", "--config", str(config),
                                         "supervise", "--role", "login", "--port", "0"],
                                done, work / "reap-ours.log", work, env)

    if baselines.supervisord:
        conf = supervisord_conf(work / "supervisord-reap", "burst", " ".join(burst_argv), "autorestart=false")
        results["supervisord"] = run_burst("supervisord", [baselines.supervisord, "-n", "-c", str(conf)],
                                           done, work / "reap-supervisord.log", work, env)
    if baselines.dumb_init:
        results["dumb-init"] = run_burst("dumb-init", [baselines.dumb_init, *burst_argv],
                                         done, work / "reap-dumb-init.log", work, env)
    return results


# -- supervisord running the cluster's slurmd -----------------------------------------------------


def supervisord_conf(directory: Path, name: str, command: str, *options: str) -> Path:
    """A supervisord.conf in `directory` (made) running one program `name`."""
    directory.mkdir(exist_ok=True)
    conf = directory / "supervisord.conf"
    conf.write_text("\n".join([
        "[supervisord]", "nodaemon=true", f"logfile={directory}/supervisord.log",
        f"pidfile={directory}/supervisord.pid", f"childlogdir={directory}",
        "[unix_http_server]", f"file={directory}/supervisord.sock",
        f"[program:{name}]", f"command={command}", *options, "startsecs=0",
        f"stdout_logfile={directory}/{name}.out", "redirect_stderr=true"]) + "\n")
    return conf


def start_supervisord(program: str, work: Path, settings: DevSection, env: dict[str, str]) -> subprocess.Popen:
    sv = work / "supervisord-slurmd"
    conf = supervisord_conf(sv, "slurmd", f"slurmd -D -N {settings.node_name}", "autorestart=true",
                            "stopwaitsecs=10")
    out = open(sv / "supervisord.out", "ab")
    proc = subprocess.Popen([program, "-n", "-c", str(conf)], env=env, cwd=str(sv), stdin=subprocess.DEVNULL,
                            stdout=out, stderr=out, start_new_session=True)
    out.close()
    return proc


def warn_shared_munged(settings: DevSection) -> None:
    """dev up starts a munged on the default socket only when none answers there, and
    other clusters' dev up then use it: say so when dev down is about to stop it under them."""
    if not next(d.pid for d in dev.status(settings).daemons if d.name == "munged"):
        return
    ours = str(Layout(settings).slurm_conf)
    others = []
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] in ("slurmctld", "slurmd", "slurmdbd"):
            try:
                conf = proc.environ().get("SLURM_CONF", "")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if conf != ours:
                others.append(f"{proc.info['name']} {proc.pid} ({conf or 'default slurm.conf'})")
    if others:
        note("warning: dev down stops this run's munged (the one on /run/munge) while other Slurm daemons "
             f"run and may use it: {', '.join(others)}")


# -- report -----------------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    if value is None:
        return f"> {REAP_CAP:g} s"
    return f"{value:.4f} s" if value < 0.1 else f"{value:.3f} s"


def _ratio(ours: float | None, base: float | None) -> str:
    if ours is None or base is None:
        return "n/a"
    if base == 0:
        return "n/a (baseline 0)" if ours else "1 (both 0)"
    return f"{ours / base:.3g}"


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report_restart(kind: str, ours: list[float], base: list[float] | None, target: float,
                   ratio_target: float | None) -> None:
    o_med, o_max = statistics.median(ours), max(ours)
    line = f"restart: {kind}: ours median {_s(o_med)} (max {_s(o_max)})"
    if base:
        b_med, b_max = statistics.median(base), max(base)
        line += f" vs supervisord median {_s(b_med)} (max {_s(b_max)}): ratio {_ratio(o_med, b_med)}"
    else:
        line += " vs supervisord: skipped (not installed)"
    goal = f"within {target:g} s" + (f", ratio <= {ratio_target:g}" if ratio_target else "")
    verdict = o_med <= target and (not ratio_target or not base or o_med / statistics.median(base) <= ratio_target)
    print(f"{line} (target {goal}: {_met(verdict)}; ours max {_met(o_max <= target).lower()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, help="slurmd kills per supervisor (default 20; --quick 5)")
    parser.add_argument("--kill-gap", type=float, default=3.0,
                        help="seconds between kills, at least 3 so that 5 exits in 10 s never happen")
    parser.add_argument("--orphans", type=int, help="orphans per burst (default 10000; --quick 2000)")
    parser.add_argument("--idle-seconds", type=float, help="idle cost window (default 60; --quick 10)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 5 kills, 2000 orphans, 10 s idle")
    parser.add_argument("--parts", default="restart,idle,reap",
                        help="comma-separated subset of restart, idle, reap (default all)")
    args = parser.parse_args()
    kills = args.kills or (5 if args.quick else 20)
    orphans = args.orphans or (2000 if args.quick else 10000)
    idle_seconds = args.idle_seconds or (10.0 if args.quick else 60.0)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if parts - {"restart", "idle", "reap"}:
        parser.error(f"unknown parts: {', '.join(sorted(parts - {'restart', 'idle', 'reap'}))}")
    if args.kill_gap < 3.0:
        parser.error("--kill-gap below 3 s could trigger the crash-loop rule (5 exits in 10 s)")
    if os.geteuid() != 0:
        raise SystemExit("run as root: the benchmark brings up a real local Slurm cluster")

    root = Path(tempfile.mkdtemp(prefix="slurm-ext-bench-"))
    os.chmod(root, 0o755)  # MariaDB runs as mysql and must reach its datadir
    work = root / "bench"
    work.mkdir()
    settings = DevSection(state_dir=str(root), **BENCH_CLUSTER)
    layout = Layout(settings)
    cluster_up = False
    supervisord: subprocess.Popen | None = None
    supervisord_slurmds: set[int] = set()
    print(f"bench_supervisor: {kills} kills {args.kill_gap:g} s apart, {orphans} orphans per burst, "
          f"{idle_seconds:g} s idle; {os.cpu_count()} cores; parts: {', '.join(sorted(parts))}")
    try:
        baselines = install_baselines(root / "venv")
        ours_restart = base_restart = None
        ours_idle = base_idle = None
        ours_scraped = 0.0
        if parts & {"restart", "idle"}:
            note("dev up: the bench cluster")
            cluster_up = True
            dev.up(settings)
            env = layout.daemon_environ()
            munged = next(d.pid for d in dev.status(settings).daemons if d.name == "munged")
            note(f"munged: {'ours, pid ' + str(munged) if munged else 'the one already on /run/munge (not ours)'}")
            agent = next(d.pid for d in dev.status(settings).daemons if d.name == "supervise-worker")
            if not agent:
                raise SystemExit("the supervise-worker agent is not running after dev up")
            if "restart" in parts:
                ours_restart = kill_loop("ours", agent, env, kills, args.kill_gap)
            if "idle" in parts:
                wait_answering(agent, env)
                time.sleep(3.0)  # let the node settle after the last restart
                ours_idle = idle_cost("ours", agent, idle_seconds)
                ours_scraped = scraped_rss(agent, BENCH_CLUSTER["worker_probe_port"])
            if baselines.supervisord:
                worker = next(d for d in cluster_daemons(layout) if d.name == "supervise-worker")
                note("stopping the cluster's supervise-worker agent for the supervisord baseline")
                daemons.stop(worker, grace=30.0)
                supervisord = start_supervisord(baselines.supervisord, work, settings, env)
                first = wait_answering(supervisord.pid, env)
                supervisord_slurmds.add(first)
                if "restart" in parts:
                    base_restart = kill_loop("supervisord", supervisord.pid, env, kills, args.kill_gap,
                                             supervisord_slurmds)
                if "idle" in parts:
                    supervisord_slurmds.add(wait_answering(supervisord.pid, env))
                    time.sleep(3.0)
                    base_idle = idle_cost("supervisord", supervisord.pid, idle_seconds)
                supervisord_slurmds.update(p for p in children(supervisord.pid) if comm(p) == "slurmd")
                note(f"stopping supervisord (pid {supervisord.pid})")
                stop_pid(supervisord, signal.SIGTERM, 30.0)
                kill_leftovers(supervisord_slurmds, "slurmd")
            warn_shared_munged(settings)
            note("dev down")
            dev.down(settings)
            cluster_up = False

        if ours_restart:
            print("restart: targets: new slurmd pid within 0.05 s (ratio <= 0.1 of supervisord), "
                  "answering `scontrol show slurmd` within 0.3 s")
            report_restart("new slurmd pid", ours_restart[0], base_restart and base_restart[0], 0.05, 0.1)
            report_restart("answering scontrol show slurmd", ours_restart[1], base_restart and base_restart[1],
                           0.3, None)
        if ours_idle:
            line = (f"idle ({idle_seconds:g} s, supervising an idle slurmd): ours cpu {ours_idle.cpu_percent:.4f}% "
                    f"of one core, rss {ours_idle.rss_mb:.1f} MB")
            if base_idle:
                line += (f" vs supervisord cpu {base_idle.cpu_percent:.4f}%, rss {base_idle.rss_mb:.1f} MB: "
                         f"ratio cpu {_ratio(ours_idle.cpu_percent, base_idle.cpu_percent)}, "
                         f"rss {_ratio(ours_idle.rss_mb, base_idle.rss_mb)}")
            else:
                line += " vs supervisord: skipped (not installed)"
            print(line)
            if ours_idle.sched_percent is not None:
                line = f"idle: cpu by schedstat (ns resolution): ours {ours_idle.sched_percent:.4f}%"
                if base_idle and base_idle.sched_percent is not None:
                    line += (f" vs supervisord {base_idle.sched_percent:.4f}%: ratio "
                             f"{_ratio(ours_idle.sched_percent, base_idle.sched_percent)}")
                print(line)
            sched = ("" if ours_idle.sched_percent is None else
                     f", by schedstat {_met(ours_idle.sched_percent < 0.05)}")
            print(f"idle: ours rss after one /metrics scrape (prometheus_client loaded): {ours_scraped:.1f} MB"
                  + (f", ratio {_ratio(ours_scraped, base_idle.rss_mb)} of supervisord" if base_idle else ""))
            rss_met = _met(ours_idle.rss_mb <= base_idle.rss_mb) if base_idle else "not measured"
            print(f"idle: targets: cpu < 0.05% (utime+stime {_met(ours_idle.cpu_percent < 0.05)}{sched}), "
                  f"rss at most supervisord's ({rss_met}); utime+stime resolution "
                  f"{100.0 / CLK_TCK / idle_seconds:.3f}% (one {1000 // CLK_TCK} ms clock tick over the window)")

        if "reap" in parts:
            results = reap_part(work, orphans, baselines)
            for name, r in results.items():
                if r.error:
                    print(f"reap: {name}: {r.error}")
                    continue
                rate = f", {orphans / r.burst:.0f} orphans/s" if r.burst else ""
                print(f"reap ({orphans} orphans, as PID 1): {name}: at most {r.peak} zombies at once, "
                      f"cleared {_s(r.cleared)} after the burst's end (burst {r.burst:.2f} s{rate})")
            ours = results["ours"]
            for base in ("dumb-init", "supervisord"):
                b = results.get(base)
                if b is None or b.error or ours.error:
                    print(f"reap: ours vs {base}: skipped" + (" (not installed)" if b is None else ""))
                    continue
                print(f"reap: ours vs {base}: peak zombies ratio {_ratio(ours.peak, b.peak)}, "
                      f"time to clear ratio {_ratio(ours.cleared, b.cleared)}")
            if not ours.error:
                print(f"reap: targets (as good as dumb-init): cleared within 0.05 s of the burst's end "
                      f"({_met(ours.cleared is not None and ours.cleared <= 0.05)}), never more than 100 "
                      f"zombies at once ({_met(ours.peak <= 100)}); sampled every {SAMPLE * 1000:g} ms")
    finally:
        if supervisord is not None and supervisord.poll() is None:
            supervisord_slurmds.update(p for p in children(supervisord.pid) if comm(p) == "slurmd")
            stop_pid(supervisord, signal.SIGTERM, 30.0)
        kill_leftovers(supervisord_slurmds, "slurmd")
        if cluster_up:
            try:
                dev.down(settings)
            except Exception as err:  # noqa: BLE001  cleanup goes on
                note(f"dev down failed: {err}")
        shutil.rmtree(root, ignore_errors=True)
        reap_own_children()


if __name__ == "__main__":
    main()
