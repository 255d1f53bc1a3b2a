"""The Prolog and Epilog under attack and fault (issue 9): a full disk, a Prolog racing an Epilog of the
same user, a stale record, forged log lines, a journal that grows without end.

Real processes of a uid that no process had when the test began, real files in /dev/shm, a real full
tmpfs; the hooks run in this process as the hook service would run them. No Slurm: drains are attempted
(and fail, which is an event too), so their events are what the tests read.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from slurm_ext import events, log
from slurm_ext.config import from_dict
from slurm_ext.procfs import pids, read_stat, real_uid
from slurm_ext.prolog_epilog import hooks, jobrecord
from slurm_ext.prolog_epilog.procs import signal_uid

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM_PYTHON = "/usr/bin/python3"


def _free_uid() -> int:
    used = {real_uid(pid) for pid in pids()}
    uid = 430_000 + (os.getpid() % 10_000) * 10
    while uid in used:
        uid += 1
    return uid


class Node:
    """A state dir, an empty scripts dir, a uid and the processes of one test; close() undoes them."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="slurm-ext-hooks-sec-"))
        self.root.chmod(0o755)
        self.state = self.root / "state"
        self.scripts = self.root / "scripts"
        self.state.mkdir()
        self.scripts.mkdir()
        self.uid = _free_uid()
        self.children: list[subprocess.Popen] = []
        self.shm: list[Path] = []
        self.mounts: list[Path] = []
        self._job = 8_000_000 + (os.getpid() % 1000) * 100

    def config(self, **node):
        return from_dict({"node": {"state_dir": str(self.state), **node},
                          "prolog_epilog": {"scripts_dir": str(self.scripts), "kill_timeout": "2s"},
                          "slurm": {"timeout": "2s"}})

    def env(self, job_id: int) -> dict[str, str]:
        return {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_UID": str(self.uid), "SLURM_JOB_GID": str(self.uid),
                "SLURM_JOB_USER": f"u{self.uid}", "SLURMD_NODENAME": f"hooks-sec-{os.getpid()}"}

    def job_id(self) -> int:
        self._job += 1
        return self._job

    def start(self, code: str, job_id: int | None = None) -> subprocess.Popen:
        """Run Python `code` as the test uid, in a session of its own; its environment is empty but for
        SLURM_JOB_ID=job_id when given."""
        env = {"SLURM_JOB_ID": str(job_id)} if job_id is not None else {}
        child = subprocess.Popen(["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                                  "env", "-i", *(f"{k}={v}" for k, v in env.items()), SYSTEM_PYTHON, "-c", code],
                                 cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 start_new_session=True)
        self.children.append(child)
        return child

    def journal(self) -> list[dict]:
        path = events.journal_path(str(self.state))
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def assert_no_internal_error(self) -> None:
        """handle() turns a bug into exit 0 and an event: a test that only looks at the effects misses it."""
        failed = [e for e in self.journal() if e["event"] in ("prolog-failed", "epilog-failed")]
        assert not failed, failed

    def close(self) -> None:
        signal_uid(self.uid, signal.SIGKILL)
        for child in self.children:
            child.kill()
            child.wait(timeout=10)
        for path in self.shm:
            path.unlink(missing_ok=True)
        for mount in self.mounts:
            subprocess.run(["umount", str(mount)], check=True)
        shutil.rmtree(self.root)


@pytest.fixture
def node():
    made = Node()
    try:
        yield made
    finally:
        made.close()


def _ready(child: subprocess.Popen) -> str:
    """The first line the child prints (it prints once it is set up)."""
    return child.stdout.readline().decode().strip()


def _alive(child: subprocess.Popen) -> bool:
    stat = read_stat(child.pid)
    return stat is not None and stat.state not in ("Z", "X")


def test_a_full_disk_does_not_make_the_prolog_fail_open(node, caplog):
    """No room for the job record: the job-start scripts still run (their failure still stops the job) and
    the node is drained with an owned reason."""
    start = node.scripts / "worker" / "job-start.d"
    start.mkdir(parents=True)
    (start / "10-fail").write_text("#!/bin/sh\necho the node is not ready\nexit 1\n")
    (start / "10-fail").chmod(0o755)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(node.state)], check=True)
    node.mounts.append(node.state)
    (node.state / "jobs").mkdir(mode=0o700)
    filler = os.open(node.state / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:  # every block taken
        while os.write(filler, b"x" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(filler)
    job = node.job_id()
    with caplog.at_level(logging.INFO, logger="events"):
        verdict = hooks.handle("prolog", node.env(job), node.config())
    assert verdict.exit_code == 1, verdict  # the failed job-start script is not skipped
    assert "prolog-failed" not in caplog.text
    logged = caplog.text
    assert "record-failed" in logged and "No space left on device" in logged
    assert f"drain: node hooks-sec-{os.getpid()}: cannot record job {job} in {node.state}/jobs" in logged


def test_an_epilog_waits_for_a_prolog_of_the_same_user_and_then_spares_its_job(node):
    """The race: job A ends while job B of the same user starts. Deciding "no other job" before B's
    record is written would sweep B's processes and remove its shared memory."""
    config = node.config()
    job_a, job_b = node.job_id(), node.job_id()
    jobrecord.write(jobrecord.from_environ(node.env(job_a), now=time.time() - 60), str(node.state))
    epilog = threading.Thread(target=hooks.handle, args=("epilog", node.env(job_a), config))
    shm = Path(f"/dev/shm/slurm-ext-test-{os.getpid()}-{job_b}")
    node.shm.append(shm)
    with jobrecord.uid_lock(str(node.state), node.uid, timeout=5) as held:  # job B's Prolog, mid-way
        assert held
        epilog.start()
        time.sleep(0.5)
        assert epilog.is_alive(), "the Epilog decided without waiting for the Prolog that holds the uid lock"
        jobrecord.write(jobrecord.from_environ(node.env(job_b)), str(node.state))
    epilog.join(timeout=30)
    assert not epilog.is_alive()
    # job B runs now: its process holds its shared memory
    worker = node.start(f"import os, time\nf = open('{shm}', 'w')\nprint('ready', flush=True)\ntime.sleep(1000)\n",
                        job_id=job_b)
    assert _ready(worker) == "ready"
    assert _alive(worker) and shm.exists()


def test_the_epilog_rereads_the_records_once_it_has_the_lock(node):
    """Same race, the other order: job B's record lands while the Epilog of A waits for the lock; B's
    process is already there. The Epilog must see B (not sweep the uid, keep B's held file)."""
    config = node.config()
    job_a, job_b = node.job_id(), node.job_id()
    jobrecord.write(jobrecord.from_environ(node.env(job_a), now=time.time() - 60), str(node.state))
    shm = Path(f"/dev/shm/slurm-ext-test-{os.getpid()}-{job_b}")
    node.shm.append(shm)
    epilog = threading.Thread(target=hooks.handle, args=("epilog", node.env(job_a), config))
    with jobrecord.uid_lock(str(node.state), node.uid, timeout=5):
        epilog.start()
        time.sleep(0.3)
        jobrecord.write(jobrecord.from_environ(node.env(job_b)), str(node.state))
        worker = node.start(f"import os, time\nf = open('{shm}', 'w')\nprint('ready', flush=True)\n"
                            "time.sleep(1000)\n", job_id=job_b)
        assert _ready(worker) == "ready"
    epilog.join(timeout=30)
    node.assert_no_internal_error()
    assert _alive(worker), "job B's process was swept by job A's Epilog"
    assert shm.exists(), "job B's shared memory was removed by job A's Epilog"


def test_a_stale_record_does_not_turn_the_uid_sweep_off(node, monkeypatch):
    """A job whose Epilog never ran (the hook service was killed, say) left its record: it has no
    slurmstepd and no cgroup here, so it is gone, and the user's next Epilog sweeps the uid again."""
    monkeypatch.setattr(jobrecord, "STARTING_GRACE", 5.0, raising=False)  # so that a record can be both stale and since boot
    config = node.config()
    lost, job = node.job_id(), node.job_id()
    jobrecord.write(jobrecord.from_environ(node.env(lost), now=time.time() - 20), str(node.state))
    jobrecord.write(jobrecord.from_environ(node.env(job), now=time.time() - 60), str(node.state))
    bare = node.start("print('ready', flush=True)\nimport time\ntime.sleep(1000)\n")  # no SLURM_JOB_ID
    assert _ready(bare) == "ready"

    verdict = hooks.handle("epilog", node.env(job), config)
    assert verdict.exit_code == 0
    node.assert_no_internal_error()
    assert bare.wait(timeout=10) == -signal.SIGKILL
    assert jobrecord.read(lost, str(node.state)) is None
    stale = [e for e in node.journal() if e["event"] == "record-stale"]
    assert stale and stale[0]["stale"] == [lost]
    swept = [e for e in node.journal() if e["event"] == "leftovers-cleaned"]
    assert swept and "by uid" in swept[0]["message"]


def test_a_young_record_or_a_running_slurmstepd_keeps_the_other_job(node):
    record = jobrecord.from_environ(node.env(1), now=time.time())
    young = jobrecord.from_environ(node.env(2), now=time.time() - 10)
    old = jobrecord.from_environ(node.env(3), now=time.time() - 3600)
    for other in (young, old):
        jobrecord.write(other, str(node.state))
    assert jobrecord.other_jobs(record, str(node.state), alive=lambda r: r.job_id == 3) == ([2, 3], [])
    assert jobrecord.other_jobs(record, str(node.state), alive=lambda r: False) == ([2], [3])
    # slurmstepd calls itself "slurmstepd: [<job>.<step>]"; only root's program named slurmstepd counts
    binaries = node.root / "bin"  # a uid without a home must reach it: not pytest's 0700 tmp_path
    binaries.mkdir()
    shutil.copy("/bin/sleep", binaries / "slurmstepd")
    real = subprocess.Popen(["bash", "-c", f"exec -a 'slurmstepd: [4242.extern]' {binaries}/slurmstepd 1000"])
    named = subprocess.Popen(["bash", "-c", "exec -a 'slurmstepd: [4243.extern]' sleep 1000"])
    forged = subprocess.Popen(["setpriv", f"--reuid={node.uid}", f"--regid={node.uid}", "--clear-groups",
                               "bash", "-c", f"exec -a 'slurmstepd: [4244.extern]' {binaries}/slurmstepd 1000"])
    try:
        deadline = time.monotonic() + 5
        while 4242 not in jobrecord.running_jobs({4242}) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # the others have exec'd too
        assert forged.poll() is None, "the forged slurmstepd did not start"
        assert jobrecord.running_jobs({4242, 4243, 4244}) == {4242}
    finally:
        for child in (real, named, forged):
            child.kill()
            child.wait()


def test_user_chosen_names_cannot_forge_log_lines(node):
    """A user hook named "ok<newline>FORGED ..." is logged on one line, its newline escaped."""
    from slurm_ext.prolog_epilog.scripts import run_scripts
    log_file = node.root / "hooks.log"
    config = from_dict({"node": {"state_dir": str(node.state)}, "log": {"file": str(log_file)},
                        "prolog_epilog": {"scripts_dir": str(node.scripts), "allow_user_hooks": True}})
    home = node.root / "home"
    hooks_dir = home / ".config" / "slurm-ext" / "job-start"
    hooks_dir.mkdir(parents=True)
    hook = hooks_dir / "ok\n2026-12-01T00:00:00 slurm-ext[1] supervisor INFO: FORGED"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    for path in (home, home / ".config", home / ".config" / "slurm-ext", hooks_dir, hook):
        os.chown(path, node.uid, node.uid)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        log.setup(config.log, "hooks")
        run_scripts("job-start", config, env=node.env(node.job_id()), home_of=lambda uid: str(home))
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
            handler.close()
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
    text = log_file.read_text()
    assert "ok\\n2026-12-01T00:00:00" in text, text
    assert not any("FORGED" in line and not line.startswith(time.strftime("%Y-")) for line in text.splitlines())
    assert not any(line.startswith("2026-12-01T00:00:00") for line in text.splitlines()), text


def test_the_journal_is_rotated_and_user_text_in_events_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(events, "JOURNAL_MAX_BYTES", 256 * 1024)
    logging.getLogger("events").disabled = True  # a megabyte per log line is not for pytest's report
    try:
        state = str(tmp_path)
        huge = "y" * (1 << 20)  # a script's or a user's megabyte
        for number in range(200):
            events.emit(state, "prolog_epilog", "script-failed", f"event {number}: {huge}", "error",
                        output=huge, processes=[f"pid {n}" for n in range(1000)])
    finally:
        logging.getLogger("events").disabled = False
    files = sorted(p.name for p in tmp_path.iterdir() if p.name != "journal.lock")  # the lock file: empty
    assert files == ["journal.jsonl"] + [f"journal.jsonl.{n}" for n in range(1, events.JOURNAL_KEEP + 1)], files
    assert (tmp_path / "journal.lock").stat().st_size == 0
    limit = events.JOURNAL_MAX_BYTES + 20_000  # a full file plus at most one line past it
    sizes = [(tmp_path / name).stat().st_size for name in files]
    assert all(size <= limit for size in sizes), sizes
    last = json.loads(events.journal_path(state).read_text().splitlines()[-1])
    assert last["message"].startswith("[") and last["message"].endswith("y")
    assert len(last["message"]) < events.FIELD_MAX_CHARS + 100 and len(last["output"]) < events.FIELD_MAX_CHARS + 100
    assert len(last["processes"]) == events.LIST_MAX_ITEMS + 1 and last["processes"][-1] == "[900 more]"


def _hook_on_fake_gpus(node, tmp_path, phase: str, **gpu0) -> tuple[int, str, list[dict], float]:
    """`phase` (prolog or epilog) for a job with GPU 0 of a fake NVML whose GPU 0 has `gpu0` in its spec: the
    verdict's exit code and message, the drains it asked for, and how long it took."""
    from slurm_ext.devcluster import fakenvml
    lib = fakenvml.build(tmp_path / "lib").parent
    spec = fakenvml.default_gpus(2)
    spec["gpus"][0].update(gpu0)
    fakenvml.write_spec(tmp_path / "gpus.json", spec)
    code = (f"import json, sys\n"
            f"from slurm_ext.config import from_dict\n"
            f"from slurm_ext.prolog_epilog import gpus, hooks\n"
            f"gpus.NVML_TIMEOUT_S = 0.5\n"
            f"env = {{**{node.env(node.job_id())!r}, 'SLURM_JOB_GPUS': '0'}}\n"
            f"config = from_dict({{'node': {{'state_dir': {str(node.state)!r}}}, "
            f"'prolog_epilog': {{'scripts_dir': {str(node.scripts)!r}}}, 'slurm': {{'timeout': '2s'}}}})\n"
            f"verdict = hooks.handle({phase!r}, env, config)\n"
            f"print(json.dumps([verdict.exit_code, verdict.message]))\n")
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, **fakenvml.environ(lib, tmp_path / "gpus.json")})
    took = time.monotonic() - began
    assert result.returncode == 0, result.stderr
    exit_code, message = json.loads(result.stdout.splitlines()[-1])
    return exit_code, message, [e for e in node.journal() if e["event"] == "drain"], took


def test_a_gpu_that_hangs_nvml_stops_the_job_in_its_prolog(node, tmp_path):
    """NVML blocked in the driver for the job's GPU (a GPU off the bus does that): the Prolog does not
    wait forever, and it does not start the job on a GPU it could not check: drain, exit 1 (requeue)."""
    exit_code, message, drains, took = _hook_on_fake_gpus(node, tmp_path, "prolog", process_list_delay_ms=5000)
    assert exit_code == 1 and "NVML did not answer" in message, message
    assert took < 5.0, f"the Prolog waited {took:.1f}s on a blocked NVML call"
    assert drains and "gpu 0 not answering NVML before job" in drains[0]["message"]


def test_a_lost_gpu_stops_the_job_in_its_prolog_and_drains_in_the_epilog(node, tmp_path):
    """NVML answers GPU_IS_LOST for the job's GPU: the job must not start on it, and an Epilog that finds it
    lost drains the node too (before, the Prolog started the job and the Epilog only logged it)."""
    exit_code, message, drains, _ = _hook_on_fake_gpus(node, tmp_path, "prolog", lost=True)
    assert exit_code == 1 and "gpu 0 is lost" in message, message
    assert drains and "gpu 0 lost (NVML GPU_IS_LOST) before job" in drains[-1]["message"], drains
    exit_code, message, drains, _ = _hook_on_fake_gpus(node, tmp_path, "epilog", lost=True)
    assert "gpu 0 lost (NVML GPU_IS_LOST) after job" in drains[-1]["message"], drains


def test_memory_in_use_with_no_process_listed_stops_the_job_in_its_prolog(node, tmp_path):
    """Another pod's process on the job's GPU: newer drivers list only the caller's PID namespace, so NVML shows
    no process, but its memory is in use beyond the driver's reserve. The job does not start on that GPU."""
    exit_code, message, drains, _ = _hook_on_fake_gpus(node, tmp_path, "prolog", memory_used=4 * 2**30)
    assert exit_code == 1 and "already in use" in message, message
    assert drains and "gpu 0 held by another process before job" in drains[-1]["message"], drains
    assert "4096 MiB in use on gpu 0 and no process this node sees" in drains[-1]["message"]


def test_another_users_running_job_id_does_not_shield_from_the_uid_sweep(node):
    """`env SLURM_JOB_ID=<a job of someone else that runs here> ./miner`: job ids are public (squeue)."""
    config = node.config()
    job, theirs = node.job_id(), node.job_id()
    someone = {**node.env(theirs), "SLURM_JOB_UID": str(node.uid + 1), "SLURM_JOB_GID": str(node.uid + 1)}
    jobrecord.write(jobrecord.from_environ(someone), str(node.state))  # their job runs here
    jobrecord.write(jobrecord.from_environ(node.env(job), now=time.time() - 60), str(node.state))
    miner = node.start("print('ready', flush=True)\nimport time\ntime.sleep(1000)\n", job_id=theirs)
    assert _ready(miner) == "ready"

    hooks.handle("epilog", node.env(job), config)
    node.assert_no_internal_error()
    assert miner.wait(timeout=10) == -signal.SIGKILL
    assert jobrecord.read(theirs, str(node.state)) is not None  # their record is theirs


def test_ipc_left_by_a_job_end_user_hook_is_removed(node, monkeypatch):
    """Job-end user hooks run after the cleanup; what they leave in /dev/shm goes too."""
    import pwd
    home = node.root / "home"
    hooks_dir = home / ".config" / "slurm-ext" / "job-end"
    hooks_dir.mkdir(parents=True)
    shm = Path(f"/dev/shm/slurm-ext-test-{os.getpid()}-late")
    node.shm.append(shm)
    (hooks_dir / "10-leave").write_text(f"#!/bin/sh\necho x > {shm}\n")
    (hooks_dir / "10-leave").chmod(0o755)
    for path in (home, home / ".config", home / ".config" / "slurm-ext", hooks_dir, hooks_dir / "10-leave"):
        os.chown(path, node.uid, node.uid)
    real = pwd.getpwuid
    entry = pwd.struct_passwd((f"u{node.uid}", "x", node.uid, node.uid, "", str(home), "/bin/sh"))
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: entry if uid == node.uid else real(uid))  # the user's home
    config = from_dict({"node": {"state_dir": str(node.state)},
                        "prolog_epilog": {"scripts_dir": str(node.scripts), "allow_user_hooks": True}})
    job = node.job_id()
    jobrecord.write(jobrecord.from_environ(node.env(job), now=time.time() - 60), str(node.state))

    verdict = hooks.handle("epilog", node.env(job), config)
    assert verdict.exit_code == 0, verdict
    node.assert_no_internal_error()
    ran = [e for e in node.journal() if e["event"] == "script-ok"]
    assert ran and ran[0]["script"].endswith("10-leave"), node.journal()
    assert not shm.exists(), "the job-end hook's /dev/shm file outlived the Epilog"


def test_without_the_uid_lock_the_epilog_does_not_sweep_the_uid(node, monkeypatch):
    """A lock not had in time (another Epilog of the user busy for long): no "the user has no other job"."""
    monkeypatch.setattr(hooks, "_lock_timeout", lambda config: 0.3)
    config = node.config()
    job = node.job_id()
    jobrecord.write(jobrecord.from_environ(node.env(job), now=time.time() - 60), str(node.state))
    bare = node.start("print('ready', flush=True)\nimport time\ntime.sleep(1000)\n")
    assert _ready(bare) == "ready"
    with jobrecord.uid_lock(str(node.state), node.uid, timeout=5):  # held elsewhere all along
        hooks.handle("epilog", node.env(job), config)
    node.assert_no_internal_error()
    assert _alive(bare), "the uid was swept without the lock"
    assert [e for e in node.journal() if e["event"] == "uid-lock-timeout"]


# -- the Python hooks, cheaper (issue 10) ------------------------------------------------------------


def test_the_python_hooks_import_only_what_every_job_needs():
    """The fallback starts a fresh Python per hook: NVML, the process scan, IPC cleanup, ctypes and the
    compression modules shutil pulls in are imported where a job needs them, not by every Prolog; typing by
    none, tomllib only when the parsed config is not cached."""
    lazy = ["slurm_ext.prolog_epilog.gpus", "slurm_ext.nvml", "pynvml", "slurm_ext.prolog_epilog.procs",
            "slurm_ext.prolog_epilog.ipc", "slurm_ext.prolog_epilog.scripts", "slurm_ext.prolog_epilog.validate",
            "ctypes", "shutil", "lzma", "bz2", "subprocess", "typing", "tomllib"]
    code = (f"import sys\nimport slurm_ext.prolog_epilog.hooks\n"
            f"print([name for name in {lazy!r} if name in sys.modules])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_the_python_hooks_started_as_slurm_ext_hook_starts_them_do_the_whole_job(node):
    """The launchers that slurm-ext-hook runs without a service (python -IS, imports where used, os._exit
    at the end): the Prolog records the job, the Epilog sweeps the uid and forgets it, both log that they
    ran without the service, and a verdict's message is printed."""
    from slurm_ext.prolog_epilog.service import write_launchers
    config_file, log_file = node.root / "slurm-ext.toml", node.root / "hooks.log"
    config_file.write_text(f'[node]\nstate_dir = "{node.state}"\n[prolog_epilog]\nscripts_dir = "{node.scripts}"\n'
                           f'[log]\nfile = "{log_file}"\n')  # a file is block-buffered: lost unless flushed
    bin_dir = node.root / "bin"
    bin_dir.mkdir()
    prolog, epilog = write_launchers(bin_dir)
    job = node.job_id()
    env = {**node.env(job), "PATH": PATH, "SLURM_EXT_CONFIG": str(config_file)}

    done = subprocess.run([str(prolog)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"job {job}: prolog done in" in log_file.read_text()  # the log line, flushed before the exit
    assert jobrecord.read(job, str(node.state)) is not None
    # the parsed config is kept beside the launchers, for root only, for the next hook
    cache = bin_dir / "slurm-ext-config.cache.json"
    assert cache.stat().st_mode & 0o777 == 0o600 and json.loads(cache.read_text())["source"] == str(config_file)
    leftover = node.start("print('ready', flush=True)\nimport time\ntime.sleep(1000)\n")
    assert _ready(leftover) == "ready"
    done = subprocess.run([str(epilog)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"job {job}: epilog done in" in log_file.read_text()
    assert leftover.wait(timeout=10) == -signal.SIGKILL
    assert jobrecord.read(job, str(node.state)) is None
    # a verdict with a message: printed, and the event in the journal
    broken = {key: value for key, value in env.items() if key != "SLURM_JOB_UID"}
    done = subprocess.run([str(prolog)], env=broken, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"slurm-ext-prolog: job {job}: prolog failed: SLURM_JOB_UID=None" in done.stderr
    assert [e for e in node.journal() if e["event"] == "prolog-failed"]


def test_the_boot_time_is_the_kernels():
    """Records older than the boot are stale: the boot time from the clocks is /proc/stat's btime."""
    btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                 if line.startswith("btime "))
    assert abs(hooks._boot_time() - btime) < 2.0
