#!/usr/bin/env python3
"""Benchmark: the Epilog's kill of 1,000 escaped job processes, beside `pkill -KILL -U`.

Each round starts N `sleep`s that escaped their job (setsid, parent gone,
SLURM_JOB_ID in their environment) as one uid, and N more as another uid for
the baseline, then measures the time until none is alive (zombies count as
gone: PID 1 reaps them when it likes):

- kill_job: slurm-ext's scan, SIGSTOP rounds, SIGKILL through pidfds, verify;
- kill_job, cgroup: the same processes in the job's v1 freezer cgroup
  (freeze, kill, thaw, remove the cgroup);
- epilog: the whole Epilog (record, kill, IPC, GPU and script steps);
- pkill: `pkill -KILL -U <uid>` then polling until none is alive.

Targets: kill_job no slower than pkill; the whole Epilog under 1 s.

Run as root: python tests/benchmarks/bench_epilog_kill.py [--processes 1000] [--rounds 3]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from slurm_ext.config import from_dict
from slurm_ext.procfs import pids, read_stat, real_uid
from slurm_ext.prolog_epilog import hooks, jobrecord, procs

JOB_UID, PKILL_UID = 4243, 4244
JOB_ID = 9_900_001
NODE = "benchnode"


def start_escapees(uid: int, count: int, job_id: int) -> list[int]:
    """`count` setsid sleeps of `uid` whose parent shell has exited, as escaped job processes are."""
    script = f"for i in $(seq {count}); do setsid sleep 100000 </dev/null >/dev/null 2>&1 & done"
    subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sh", "-c", script],
                   env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": str(job_id)}, check=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = live_of(uid)
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise SystemExit(f"only {len(live_of(uid))} of {count} processes of uid {uid} started")


def live_of(uid: int) -> list[int]:
    found = []
    for pid in pids():
        stat = read_stat(pid)
        if stat and stat.state not in ("Z", "X") and real_uid(pid) == uid:
            found.append(pid)
    return found


def time_pkill(count: int) -> float:
    start_escapees(PKILL_UID, count, JOB_ID + 1)
    started = time.perf_counter()
    subprocess.run(["pkill", "-KILL", "-U", str(PKILL_UID)], check=True)
    while live_of(PKILL_UID):
        time.sleep(0.005)
    return time.perf_counter() - started


def record(state_dir: str, cgroups: tuple[str, ...] = ()) -> jobrecord.JobRecord:
    job = jobrecord.JobRecord(job_id=JOB_ID, uid=JOB_UID, gid=JOB_UID, user=str(JOB_UID), node=NODE, gpus=(),
                              start=time.time() - 60, cgroups=cgroups)
    jobrecord.write(job, state_dir)
    return job


def time_kill_job(count: int, state_dir: str, in_cgroup: bool) -> float:
    found = start_escapees(JOB_UID, count, JOB_ID)
    cgroup = Path(f"/sys/fs/cgroup/freezer/slurm_{NODE}/uid_{JOB_UID}/job_{JOB_ID}")
    if in_cgroup:
        cgroup.mkdir(parents=True, exist_ok=True)
        for pid in found:
            (cgroup / "cgroup.procs").write_text(str(pid))
    job = record(state_dir, (str(cgroup),) if in_cgroup else ())
    started = time.perf_counter()
    cleanup = procs.kill_job(job, sweep_uid=False, protected=procs.protected_pids(), timeout=10)
    elapsed = time.perf_counter() - started
    assert len(cleanup.found) >= count and not cleanup.survivors and not live_of(JOB_UID), cleanup.survivors
    assert not cgroup.exists(), f"{cgroup} left behind"
    jobrecord.remove(JOB_ID, state_dir)
    return elapsed


def time_epilog(count: int, state_dir: str) -> float:
    config = from_dict({"node": {"state_dir": state_dir}, "prolog_epilog": {"scripts_dir": state_dir}})
    start_escapees(JOB_UID, count, JOB_ID)
    record(state_dir)
    env = {"SLURM_JOB_ID": str(JOB_ID), "SLURM_JOB_UID": str(JOB_UID), "SLURM_JOB_GID": str(JOB_UID),
           "SLURMD_NODENAME": NODE}
    started = time.perf_counter()
    verdict = hooks.epilog(env, config)
    elapsed = time.perf_counter() - started
    assert verdict.exit_code == 0 and not live_of(JOB_UID), verdict
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if live_of(JOB_UID) or live_of(PKILL_UID):
        raise SystemExit(f"uids {JOB_UID} and {PKILL_UID} must have no processes before the benchmark")
    state_dir = tempfile.mkdtemp(prefix="slurm-ext-bench-")
    times: dict[str, list[float]] = {"kill_job": [], "kill_job, cgroup": [], "epilog": [], "pkill": []}
    try:
        for _ in range(args.rounds):
            times["pkill"].append(time_pkill(args.processes))
            times["kill_job"].append(time_kill_job(args.processes, state_dir, in_cgroup=False))
            times["kill_job, cgroup"].append(time_kill_job(args.processes, state_dir, in_cgroup=True))
            times["epilog"].append(time_epilog(args.processes, state_dir))
        median = {name: statistics.median(values) for name, values in times.items()}
        print(f"{args.processes} escaped processes, {args.rounds} rounds, time until none is alive (median):")
        for name, values in times.items():
            print(f"  {name:<17} {median[name] * 1000:7.0f} ms  ({', '.join(f'{v * 1000:.0f}' for v in values)})")
        print(f"ratio kill_job / pkill: {median['kill_job'] / median['pkill']:.2f}  (target <= 1)")
        print(f"ratio kill_job (cgroup) / pkill: {median['kill_job, cgroup'] / median['pkill']:.2f}")
        print(f"whole Epilog: {median['epilog'] * 1000:.0f} ms  (target < 1000 ms)")
    finally:
        for pid in live_of(JOB_UID) + live_of(PKILL_UID):  # what this run started, if it failed midway
            os.kill(pid, 9)
        node_cgroup = Path(f"/sys/fs/cgroup/freezer/slurm_{NODE}")
        for directory in (node_cgroup / f"uid_{JOB_UID}", node_cgroup):  # kill_job removed the job's own
            if directory.is_dir():
                directory.rmdir()
        shutil.rmtree(state_dir, ignore_errors=True)


if __name__ == "__main__":
    os.umask(0o022)
    main()
