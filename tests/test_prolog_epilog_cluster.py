"""The Prolog and Epilog on the real cluster: escaped job processes, IPC, GPUs, lifecycle scripts.

Jobs run as `nobody` (sbatch --uid). The escape suite runs under
ProctrackType=proctrack/cgroup and proctrack/linuxproc: under linuxproc Slurm
itself leaves every escapee running, so whatever is gone after the Epilog
was killed by slurm-ext.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from helpers.cluster import Cluster
from helpers.wait import wait_for
from slurm_ext import devcluster as dev
from slurm_ext.devcluster import fakenvml


NOBODY = 65534
OTHER_UID = 4242  # "another user": setpriv needs no passwd entry

# Holds a /dev/shm file open and a SysV segment attached, then sleeps.
IPC_HOLDER = """\
import ctypes, os, sys, time
path, id_file = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
os.write(fd, b"x" * 4096)
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget(0, 4096, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
assert shmid >= 0 and libc.shmat(shmid, None, 0) not in (None, ctypes.c_void_p(-1).value)
open(id_file, "w").write(str(shmid))
time.sleep(100007)
"""

ESCAPE_JOB = """\
#!/bin/bash
out={out}/esc-$SLURM_JOB_ID
echo "gpus $SLURM_JOB_GPUS" >> $out.pids
setsid nohup sleep 100001 >/dev/null 2>&1 &
echo "setsid-nohup $!" >> $out.pids
( sleep 100002 >/dev/null 2>&1 & echo "double-fork $!" >> $out.pids )
setsid bash -c 'trap "" TERM HUP INT; exec sleep 100003' >/dev/null 2>&1 &
echo "ignores-sigterm $!" >> $out.pids
setsid bash -c 'exec env -i /bin/sleep 100004' >/dev/null 2>&1 &
echo "env-i $!" >> $out.pids
python3 -c 'import ctypes, time; ctypes.CDLL(None).prctl(15, b"kworker/0:9", 0, 0, 0); time.sleep(100005)' \
    >/dev/null 2>&1 &
echo "renamed $!" >> $out.pids
setsid bash -c 'while true; do sleep 100006; done' >/dev/null 2>&1 &
echo "respawner $!" >> $out.pids
python3 {out}/ipc_holder.py /dev/shm/sx-esc-$SLURM_JOB_ID $out.shmid >/dev/null 2>&1 &
echo "ipc-holder $!" >> $out.pids
setsid sleep 100008 >/dev/null 2>&1 &
echo "on-gpu $!" >> $out.pids
ln -s {root_file} /dev/shm/sx-link-$SLURM_JOB_ID
while [ ! -s $out.shmid ]; do sleep 0.05; done
touch $out.started
while [ ! -e $out.release ]; do sleep 0.1; done
"""

KEEPER_JOB = """\
#!/bin/bash
out={out}/keep-$SLURM_JOB_ID
echo kept > /dev/shm/sx-keep-$SLURM_JOB_ID
exec 3</dev/shm/sx-keep-$SLURM_JOB_ID
sleep 100009 &
echo $! > $out.pid
touch $out.started
wait
"""


@dataclasses.dataclass(frozen=True)
class Proc:
    """A process named by pid and start time, so a recycled pid never passes for it."""

    pid: int
    started: float

    @classmethod
    def of(cls, pid: int) -> "Proc":
        return cls(pid, psutil.Process(pid).create_time())

    def alive(self) -> bool:
        try:
            process = psutil.Process(self.pid)
            return process.create_time() == self.started and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False


@pytest.fixture(params=["cgroup", "linuxproc"])
def proctrack_cluster(request, running_cluster) -> Cluster:
    """The cluster with ProctrackType=proctrack/<param> (the next test's `dev up` puts cgroup back)."""
    settings = dataclasses.replace(running_cluster.settings, proctrack=request.param)
    dev.up(settings)
    cluster = Cluster(settings)
    assert f"ProctrackType=proctrack/{request.param}" in cluster.layout.slurm_conf.read_text()
    cluster.wait_idle()
    return cluster


@pytest.fixture
def bystanders():
    """A root process and another user's process, started by the test: the Epilog must not touch them."""
    started = [subprocess.Popen(["sleep", "100010"]),
               subprocess.Popen(["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
                                 "sleep", "100011"])]
    time.sleep(0.2)
    yield [Proc.of(p.pid) for p in started]
    for process in started:
        process.kill()
        process.wait()


@pytest.fixture
def root_file():
    path = Path(f"/var/tmp/sx-root-target-{os.getpid()}")
    path.write_text("precious\n")
    path.chmod(0o600)
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def gpu_spec(running_cluster):
    """The fake GPUs' spec; put back as it was after the test."""
    path = running_cluster.layout.gpu_spec
    original = path.read_text()
    yield path
    fakenvml.write_spec(path, json.loads(original))


def _submit_as_nobody(cluster: Cluster, script: str, *args: str) -> int:
    path = cluster.layout.out / f"job-{time.monotonic_ns()}.sh"
    path.write_text(script)
    path.chmod(0o755)
    return cluster.sbatch("--uid=nobody", "--gid=nogroup", *args, str(path))


def _epilog_done(cluster: Cluster, job_id: int, timeout: float = 60.0) -> None:
    """Wait until the job is over and its Epilog returned (its job record is removed last), and check
    neither hook hit an internal error (which the hooks turn into exit 0 and an event)."""
    record = cluster.layout.node_state / "jobs" / f"{job_id}.json"
    slurm = cluster.client()
    wait_for(f"job {job_id}'s Epilog", lambda: (job := slurm.job(job_id)) is not None and job.finished
             and not record.exists(), timeout=timeout, interval=0.2)
    failed = _journal(cluster, "prolog-failed", job_id) + _journal(cluster, "epilog-failed", job_id)
    assert not failed, failed


def _journal(cluster: Cluster, event: str, job_id: int) -> list[dict]:
    path = cluster.layout.node_state / "journal.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in records if r.get("event") == event and str(r.get("job")) == str(job_id)]


def _gpu_processes(cluster: Cluster, index: int) -> list[int]:
    """Pids NVML (the fake, through the real pynvml) lists on GPU `index`."""
    code = ("import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(%d); "
            "print([p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)])" % index)
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **cluster.env}, capture_output=True,
                         text=True, check=True, timeout=30).stdout
    return json.loads(out)


def _sysv_ids() -> set[int]:
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    return {int(line.split()[1]) for line in lines}


def test_escaped_processes_ipc_and_gpu_are_cleaned_and_nothing_else(proctrack_cluster, bystanders, root_file,
                                                                     gpu_spec):
    cluster = proctrack_cluster
    out = cluster.layout.out
    (out / "ipc_holder.py").write_text(IPC_HOLDER)
    keeper = _submit_as_nobody(cluster, KEEPER_JOB.format(out=out))
    wait_for("the second job of the same user", (out / f"keep-{keeper}.started").exists, timeout=30)
    keeper_sleep = Proc.of(int((out / f"keep-{keeper}.pid").read_text()))
    job = _submit_as_nobody(cluster, ESCAPE_JOB.format(out=out, root_file=root_file), "--gres=gpu:1")
    try:
        wait_for("the escaping job", (out / f"esc-{job}.started").exists, timeout=30)
        lines = dict(line.split(" ", 1) for line in (out / f"esc-{job}.pids").read_text().splitlines())
        gpu = int(lines.pop("gpus"))
        escapees = {name: Proc.of(int(pid)) for name, pid in lines.items()}
        shmid = int((out / f"esc-{job}.shmid").read_text())
        assert shmid in _sysv_ids()
        spec = json.loads(gpu_spec.read_text())
        spec["gpus"][gpu]["processes"] = [{"pid": escapees["on-gpu"].pid, "used_memory": 2 << 30,
                                           "while_alive": True}]
        fakenvml.write_spec(gpu_spec, spec)
        assert _gpu_processes(cluster, gpu) == [escapees["on-gpu"].pid]

        (out / f"esc-{job}.release").touch()
        _epilog_done(cluster, job)

        survivors = [name for name, proc in escapees.items() if proc.alive()]
        assert not survivors, f"escaped processes still alive after the Epilog: {survivors}"
        job_env = f"SLURM_JOB_ID={job}".encode()
        assert not [p.pid for p in psutil.process_iter() if _environ_has(p.pid, job_env)], \
            "a process with the job's SLURM_JOB_ID survived (the respawner's child?)"
        assert not Path(f"/dev/shm/sx-esc-{job}").exists()
        assert shmid not in _sysv_ids()
        assert not os.path.lexists(f"/dev/shm/sx-link-{job}")
        assert root_file.read_text() == "precious\n"
        assert _gpu_processes(cluster, gpu) == []

        assert keeper_sleep.alive(), "the same user's other running job lost a process"
        assert Path(f"/dev/shm/sx-keep-{keeper}").read_text() == "kept\n"
        assert all(proc.alive() for proc in bystanders), "a root or another user's process was killed"
        node = cluster.client().node(cluster.node)
        assert not node.drained, f"node drained: {node.reason}"
        assert cluster.wait_accounted(job).state == "COMPLETED"
        if cluster.settings.proctrack == "linuxproc":  # Slurm left them all: the Epilog killed them
            cleaned = _journal(cluster, "leftovers-cleaned", job)
            assert cleaned, "no leftovers-cleaned event for the job"
            assert any("by cgroup" in p for p in cleaned[0]["processes"]), cleaned
    finally:
        (out / f"esc-{job}.release").touch()
        cluster.run("scancel", str(keeper), check=False)
        _epilog_done(cluster, keeper)
    assert not Path(f"/dev/shm/sx-keep-{keeper}").exists(), "the keeper's own Epilog left its /dev/shm file"


def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        return needle + b"\0" in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


# -- the two paths: hook service and fallback ------------------------------------------------


def test_without_the_hook_service_the_python_hooks_do_the_same_work(running_cluster):
    cluster = running_cluster
    socket_path = cluster.layout.hook_socket
    hidden = socket_path.with_name("hooks.sock.hidden")
    log_file = cluster.layout.log / "slurm-ext.log"
    wait_for("the hook service's socket", socket_path.exists, timeout=30)  # it binds just after the agent starts
    os.rename(socket_path, hidden)  # the client finds no service; the service keeps its socket
    try:
        job = _submit_as_nobody(cluster, "#!/bin/bash\necho left > /dev/shm/sx-fallback-$SLURM_JOB_ID\n")
        _epilog_done(cluster, job)
    finally:
        os.rename(hidden, socket_path)
    text = log_file.read_text()
    assert f"job {job}: prolog done in" in text and f"job {job}: epilog done in" in text
    assert not Path(f"/dev/shm/sx-fallback-{job}").exists()
    assert _journal(cluster, "leftovers-cleaned", job)

    job = _submit_as_nobody(cluster, "#!/bin/bash\necho left > /dev/shm/sx-service-$SLURM_JOB_ID\n")
    _epilog_done(cluster, job)
    assert f"job {job}: epilog done in" not in log_file.read_text()  # the service did it
    assert not Path(f"/dev/shm/sx-service-{job}").exists()


def test_an_unkillable_leftover_drains_the_node_naming_the_pid(running_cluster):
    """A job process frozen in a foreign freezer cgroup cannot die: its state is reported, the
    node drained by us, and the Epilog returns after kill_timeout instead of hanging."""
    cluster = running_cluster
    out = cluster.layout.out
    frozen = Path(f"/sys/fs/cgroup/freezer/sx-test-frozen-{os.getpid()}")
    frozen.mkdir()
    job = _submit_as_nobody(cluster, f"#!/bin/bash\nsetsid sleep 100020 &\necho $! > {out}/frozen-$SLURM_JOB_ID\n"
                                     f"while [ ! -e {out}/frozen-$SLURM_JOB_ID.release ]; do sleep 0.1; done\n")
    sleeper = None
    try:
        pid = int(wait_for("the job's sleep", lambda: (p := out / f"frozen-{job}").exists() and p.read_text()
                           .strip(), timeout=30))
        sleeper = Proc.of(pid)
        # $! is the pid of setsid, which execs sleep: freeze it only once it is sleep, or the
        # reason names the process it was a moment before.
        wait_for("setsid to exec sleep", lambda: psutil.Process(pid).name() == "sleep", timeout=10)
        (frozen / "cgroup.procs").write_text(str(pid))
        (frozen / "freezer.state").write_text("FROZEN")
        started = time.monotonic()
        (out / f"frozen-{job}.release").touch()
        _epilog_done(cluster, job, timeout=90)
        assert time.monotonic() - started < 60
        node = wait_for("our drain", lambda: (n := cluster.client().node(cluster.node)).drained and n)
        assert node.reason.startswith(f"slurm-ext: job {job} left pid {pid} (sleep) unkillable in state")
        assert _journal(cluster, "drain", job)
    finally:
        (frozen / "freezer.state").write_text("THAWED")
        try:
            if sleeper:
                wait_for("the frozen sleep to die after the thaw", lambda: not sleeper.alive(), timeout=10)
        finally:
            frozen.rmdir()
            cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume", check=False)


# -- lifecycle scripts on the real cluster ---------------------------------------------------


@pytest.fixture
def scripts(running_cluster):
    """Write lifecycle scripts and [prolog_epilog] settings for the test; all removed after."""
    layout = running_cluster.layout
    config_file = layout.slurm_ext_conf
    original = config_file.read_text()
    made: list[Path] = []

    def add(phase: str, name: str, body: str, mode: int = 0o755) -> Path:
        directory = layout.etc / "worker" / f"{phase}.d"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / name
        path.write_text(textwrap.dedent(body))
        path.chmod(mode)
        made.append(path)
        return path

    def settings(text: str) -> None:
        config_file.write_text(original + "\n[prolog_epilog]\n" + textwrap.dedent(text))

    add.settings = settings
    yield add
    config_file.write_text(original)
    for path in made:
        path.unlink(missing_ok=True)
    for phase in ("job-start", "job-end"):
        shutil.rmtree(layout.etc / "worker" / f"{phase}.d", ignore_errors=True)


def test_job_start_scripts_run_in_order_with_a_clean_environment_into_the_journal(running_cluster, scripts):
    cluster = running_cluster
    trace = cluster.layout.out / f"trace-{os.getpid()}"
    for name in ("20-second", "10-first", "3-third"):
        scripts("job-start", name, f"""\
            #!/bin/sh
            echo "{name} $SLURM_JOB_ID $SLURM_JOB_USER $SLURM_EXT_PHASE $SLURM_EXT_ROLE" \
                "$PATH ${{LD_LIBRARY_PATH:-unset}}" >> {trace}
            echo "hello from {name}"
            """)
    job = _submit_as_nobody(cluster, "#!/bin/sh\ntrue\n")
    _epilog_done(cluster, job)
    lines = trace.read_text().splitlines()
    trace.unlink()
    assert [line.split()[0] for line in lines] == ["10-first", "20-second", "3-third"]  # lexical, like run-parts
    assert all(line.split()[1:5] == [str(job), "nobody", "job-start", "worker"] for line in lines)
    assert all(line.split()[5] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" for line in lines)
    assert all(line.split()[6] == "unset" for line in lines), "the hook's environment leaked into a script"
    outputs = [r["output"] for r in _journal(cluster, "script-ok", job)]
    assert any("hello from 10-first" in o for o in outputs), outputs
    assert cluster.wait_accounted(job).state == "COMPLETED"


def test_a_failing_job_start_script_drains_and_requeues_by_default(running_cluster, scripts):
    cluster = running_cluster
    scripts("job-start", "10-fail", "#!/bin/sh\necho no scratch space >&2\nexit 3\n")
    job = _submit_as_nobody(cluster, "#!/bin/sh\ntrue\n")
    slurm = cluster.client()
    try:
        node = wait_for("the node drained", lambda: (n := slurm.node(cluster.node)).drained and n, timeout=30)
        assert "Prolog error" in node.reason or node.reason.startswith("slurm-ext:")
        wait_for("the job requeued and held", lambda: (q := cluster.run(
            "squeue", "-h", "-j", str(job), "-o", "%T %r").stdout).startswith("PENDING") and "held" in q, timeout=30)
        failed = _journal(cluster, "script-failed", job)
        assert failed and "no scratch space" in failed[0]["output"] and failed[0]["exit_code"] == 3
    finally:
        cluster.run("scancel", str(job), check=False)
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume", check=False)


def test_policy_ignore_lets_the_job_run_and_an_invalid_script_is_refused(running_cluster, scripts):
    cluster = running_cluster
    scripts.settings('on_failure = {job-start = "ignore"}\n')
    marker = cluster.layout.out / f"refused-ran-{os.getpid()}"
    scripts("job-start", "10-world-writable", f"#!/bin/sh\ntouch {marker}\n", mode=0o777)
    scripts("job-start", "20-fails", "#!/bin/sh\nexit 1\n")
    job = _submit_as_nobody(cluster, "#!/bin/sh\ntrue\n")
    _epilog_done(cluster, job)
    assert cluster.wait_accounted(job).state == "COMPLETED"
    assert not marker.exists()
    refused = _journal(cluster, "script-refused", job)
    assert refused and "chmod go-w" in refused[0]["message"] + str(refused[0].get("refused", ""))
    assert _journal(cluster, "script-failed", job)
    assert not cluster.client().node(cluster.node).drained


def test_a_job_end_script_that_hangs_is_killed_at_its_timeout_and_the_job_is_not_hung(running_cluster, scripts):
    cluster = running_cluster
    scripts.settings('script_timeouts = {"50-hang" = "2s"}\n')
    scripts("job-end", "50-hang", "#!/bin/sh\necho going to sleep\nsleep 100030\n")
    started = time.monotonic()
    job = _submit_as_nobody(cluster, "#!/bin/sh\ntrue\n")
    _epilog_done(cluster, job, timeout=30)
    assert time.monotonic() - started < 20
    timed_out = _journal(cluster, "script-timeout", job)
    assert timed_out and "going to sleep" in timed_out[0]["output"]
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "100030"]
                and p.status() != psutil.STATUS_ZOMBIE]
    assert not cluster.client().node(cluster.node).drained  # job-end policy: ignore
    assert cluster.wait_accounted(job).state == "COMPLETED"


def test_a_user_hook_runs_as_the_user_when_allowed(running_cluster, scripts):
    cluster = running_cluster
    home = Path("/nonexistent")  # nobody's home in /etc/passwd
    if home.exists():
        pytest.fail("/nonexistent exists on this host; the test needs to make it as nobody's home")
    hook_dir = home / ".config" / "slurm-ext" / "job-start"
    hook_dir.mkdir(parents=True)
    try:
        for path in (home, home / ".config", home / ".config" / "slurm-ext", hook_dir):
            os.chown(path, NOBODY, NOBODY)
        hook = hook_dir / "10-whoami"
        trace = cluster.layout.out / f"user-hook-{os.getpid()}"
        hook.write_text(f"#!/bin/sh\necho \"$(id -u) $(id -g) $HOME $SLURM_JOB_ID\" > {trace}\n")
        hook.chmod(0o755)
        os.chown(hook, NOBODY, NOBODY)
        job = _submit_as_nobody(cluster, "#!/bin/sh\ntrue\n")
        _epilog_done(cluster, job)
        assert not trace.exists(), "user hooks ran although allow_user_hooks is off"
        scripts.settings("allow_user_hooks = true\n")
        job = _submit_as_nobody(cluster, "#!/bin/sh\ntrue\n")
        _epilog_done(cluster, job)
        assert trace.read_text().split() == [str(NOBODY), str(NOBODY), str(home), str(job)]
        trace.unlink()
    finally:
        shutil.rmtree(home)


def test_a_gpu_already_in_use_stops_the_job_in_its_prolog(running_cluster, gpu_spec):
    """A process left on a GPU (not the new job's) is caught before the job starts on it: owned drain,
    non-zero Prolog, so Slurm requeues the job and holds it instead of running it on a busy GPU."""
    cluster = running_cluster
    squatter = subprocess.Popen(["sleep", "100040"])
    job = None
    try:
        spec = json.loads(gpu_spec.read_text())
        spec["gpus"][0]["processes"] = [{"pid": squatter.pid, "used_memory": 4 << 30, "while_alive": True}]
        fakenvml.write_spec(gpu_spec, spec)
        job = cluster.sbatch("--gres=gpu:1", "--wrap", "true")
        node = wait_for("our drain", lambda: (n := cluster.client().node(cluster.node)).drained and n, timeout=30)
        assert node.reason.startswith(f"slurm-ext: gpu 0 held by another process before job {job}"), node.reason
        assert f"pid {squatter.pid} on gpu 0" in node.reason
        wait_for("the job requeued and held", lambda: (q := cluster.run(
            "squeue", "-h", "-j", str(job), "-o", "%T %r").stdout).startswith("PENDING") and "held" in q, timeout=30)
        assert squatter.poll() is None, "the Prolog must not kill what is not the job's"
    finally:
        squatter.kill()
        squatter.wait()
        if job is not None:
            cluster.run("scancel", str(job), check=False)
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume", check=False)
