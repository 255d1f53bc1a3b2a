"""Bring the single-host dev cluster up and down, report on it, run a demo job.

`up` is idempotent: files are rewritten only when their content changes,
running daemons are left alone, and a daemon is restarted only when a file it
reads changed. `down` cancels the cluster's jobs, stops every daemon by its
pidfile in reverse start order, kills what is left in the node's job cgroups
and removes those cgroups.
"""

from __future__ import annotations

import logging
import os
import pwd
import secrets
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_ext import cgroupfs, command, nodestate
from slurm_ext.config import SlurmSection
from slurm_ext.errors import CommandError, DevClusterError, SlurmError, SlurmExtError
from slurm_ext.slurm import Job, Node, SlurmClient

from . import daemons, deps, fakenvml, render
from .daemons import Daemon
from .layout import Layout
from .settings import DevSection

__all__ = ["DaemonStatus", "Status", "DemoResult", "up", "down", "status", "demo", "demo_script", "client",
           "cluster_daemons", "job_cgroups"]

log = logging.getLogger("dev")

_CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True, slots=True)
class DaemonStatus:
    name: str
    #: None when not running
    pid: int | None
    pidfile: Path


@dataclass(frozen=True, slots=True)
class Status:
    state_dir: Path
    daemons: tuple[DaemonStatus, ...]
    #: the node as slurmctld sees it; None when slurmctld does not answer
    node: Node | None
    #: why `node` is None
    problem: str = ""


@dataclass(frozen=True, slots=True)
class DemoResult:
    job: Job
    output: str


def client(settings: DevSection, timeout: float = 10.0, json: str = "auto") -> SlurmClient:
    """A Slurm client pointed at the dev cluster (`json` as slurm.json: auto, always, never)."""
    layout = Layout(settings)
    return SlurmClient(SlurmSection(conf=str(layout.slurm_conf), timeout=timeout, json=json),
                       environ=layout.daemon_environ())


def cluster_daemons(layout: Layout) -> list[Daemon]:
    """Every daemon of the cluster, in start order."""
    s = layout.settings
    munge = layout.munge
    return [
        Daemon("munged",
               ("runuser", "-u", "munge", "--", "munged", f"--key-file={munge}/munge.key",
                f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
                f"--seed-file={munge}/munged.seed"),
               munge / "munged.pid", frozenset({"munged"}), layout.log / "munged.out"),
        _agent(layout, "accounting", (s.mariadb_port, s.slurmdbd_port, s.accounting_probe_port)),
        _agent(layout, "controller", (s.slurmctld_port, s.controller_probe_port)),
        _agent(layout, "worker", (s.slurmd_port, s.worker_probe_port)),
    ]


def _agent(layout: Layout, role: str, ports: tuple[int, ...]) -> Daemon:
    """slurm-ext's node agent for `role`: it runs MariaDB and slurmdbd, slurmctld, or slurmd in the foreground."""
    name = f"supervise-{role}"
    return Daemon(name, (_entry_point("slurm-ext"), "--config", str(layout.slurm_ext_conf), "supervise",
                         "--role", role, "--pidfile", str(layout.pidfile(name))),
                  layout.pidfile(name), frozenset({"slurm-ext"}), layout.log / f"{name}.out", ports)


# The config files each daemon reads: a change to one restarts the daemon.
_SLURM_FILES = frozenset({"slurm.conf", "cgroup.conf"})  # gres.conf: the worker agent writes it from NVML
_CONFIG_FILES = {
    "supervise-accounting": frozenset({"slurm.conf", "slurm-ext.toml"}),
    "supervise-controller": _SLURM_FILES | {"slurm-ext.toml"},
    "supervise-worker": _SLURM_FILES | {"slurm-ext.toml"},
}


def up(settings: DevSection) -> Status:
    """Bring the cluster up (or leave it as it is) and wait for the node.

    Raises:
        DevClusterError: not root, a package missing, a port taken, or a
            daemon that does not come up (with the end of its log).
    """
    deps.require_root("dev up")
    deps.require()
    started_at = time.monotonic()
    layout = Layout(settings)
    changed = _write_files(layout)
    to_start = []
    for daemon in cluster_daemons(layout):
        if daemons.running_pid(daemon) and _CONFIG_FILES.get(daemon.name, frozenset()) & changed:
            log.info("%s: its config changed: restarting it", daemon.name)
            daemons.stop(daemon)
        if not daemons.running_pid(daemon):
            to_start.append(daemon)
    for daemon in to_start:  # all ports first: a taken one fails before anything starts
        for port in daemon.ports:
            daemons.check_port_free(port, daemon.name)
    for daemon in to_start:
        if daemon.name == "munged" and _munge_works():
            log.info("munged: one already answers on the default socket: using it")
            continue
        daemons.start(daemon, layout.daemon_environ(), settings.up_timeout)
        _wait_ready(daemon.name, layout)
    slurm = client(settings, timeout=5.0)
    node = _wait_node(layout, slurm)
    log.info("cluster up in %.1fs: node %s is %s", time.monotonic() - started_at, node.name, _state_text(node))
    return status(settings)


def _write_files(layout: Layout) -> set[str]:
    """Create the state tree and every config file; names of files that changed."""
    s = layout.settings
    for path in (layout.etc, layout.log, layout.run, layout.bin, layout.ctld_state, layout.slurmd_spool,
                 layout.node_state, layout.dev, layout.lib, layout.munge):
        path.mkdir(parents=True, exist_ok=True)
    layout.out.mkdir(exist_ok=True)
    layout.out.chmod(0o1777)
    os.chown(layout.run, 0, 0)  # root writes the pidfiles here (an older dev cluster gave it to mysql)
    _prepare_munge(layout)
    if not layout.db_password.exists():  # the accounting agent writes it into slurmdbd.conf and MariaDB
        _write(layout.db_password, secrets.token_hex(16) + "\n", 0o600)

    for minor, device in enumerate(layout.gpu_devices()):
        fakenvml.make_device(device, minor)
    fakenvml.build(layout.lib)
    if not layout.gpu_spec.exists():
        fakenvml.write_spec(layout.gpu_spec, fakenvml.default_gpus(s.gpu_count, s.gpu_name))
    if not s.kernel_log:
        layout.kernel_log.touch()  # the worker's simulated kernel log: kernel lines appended to it are judged

    prolog, epilog = layout.bin / "slurm-ext-prolog", layout.bin / "slurm-ext-epilog"
    from slurm_ext.prolog_epilog import build_hook, write_launchers  # dev assembles the components into a cluster
    python_prolog, python_epilog = write_launchers(layout.bin)
    _write(prolog, render.hook_wrapper(layout, str(python_prolog)), 0o755)
    _write(epilog, render.hook_wrapper(layout, str(python_epilog)), 0o755)
    hook = build_hook(layout.bin / "slurm-ext-hook", str(layout.hook_socket), str(prolog), str(epilog))
    topology = render.parse_topology(command.run(["slurmd", "-C"], 30, env=layout.daemon_environ()).stdout)
    files = {
        "slurm.conf": render.slurm_conf(layout, topology, str(hook)),
        "cgroup.conf": render.cgroup_conf(),
        "slurm-ext.toml": render.slurm_ext_toml(layout),
    }
    return {name for name, text in files.items() if _write(layout.etc / name, text)}


def _write(path: Path, text: str, mode: int = 0o644) -> bool:
    """Write `text` atomically unless the file already holds it; True when written."""
    try:
        if path.read_text() == text:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)
    return True


def _entry_point(name: str) -> str:
    """Absolute path of one of slurm-ext's console scripts, beside this Python."""
    for candidate in (Path(sys.executable).parent / name, shutil.which(name)):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    raise DevClusterError(f"{name} is not installed next to {sys.executable}: install slurm-ext into this "
                          f"Python's environment (its wheel, or `pip install -e .` in a checkout)")


def _prepare_munge(layout: Layout) -> None:
    munge = pwd.getpwnam("munge")
    run_dir = Path("/run/munge")  # slurmdbd only talks to munged's default socket
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chown(run_dir, munge.pw_uid, munge.pw_gid)
    run_dir.chmod(0o755)
    key = layout.munge / "munge.key"
    if not key.exists():
        command.run(["mungekey", "--create", f"--keyfile={key}"], 30)
    for path in (layout.munge, key):
        os.chown(path, munge.pw_uid, munge.pw_gid)
    layout.munge.chmod(0o700)
    key.chmod(0o400)


def _munge_works() -> bool:
    try:
        cred = command.run(["munge", "-n"], 5).stdout
        command.run(["unmunge"], 5, input=cred)
    except SlurmExtError:
        return False
    return True


def _wait_ready(name: str, layout: Layout) -> None:
    """Wait until a freshly started daemon answers, and bootstrap what needs it."""
    timeout = layout.settings.up_timeout
    env = layout.daemon_environ()
    if name == "supervise-accounting":  # MariaDB first, then slurmdbd: the agent starts them in that order
        daemons.wait_for("slurmdbd", lambda: _ok(["sacctmgr", "-n", "show", "cluster"], env), timeout,
                         logfile=layout.log / "supervise-accounting.out")
        _bootstrap_accounting(layout, env)
    elif name == "supervise-controller":
        daemons.wait_for("slurmctld", lambda: _ok(["scontrol", "ping"], env, "is UP"), timeout,
                         logfile=layout.log / "slurmctld.log")


def _ok(cmd: list[str], env: dict[str, str], expect: str = "") -> bool:
    try:
        return expect in command.run(cmd, 5, env=env).stdout
    except SlurmExtError:
        return False


def _bootstrap_accounting(layout: Layout, env: dict[str, str]) -> None:
    """The cluster, an account and root's association, added once."""
    s = layout.settings

    def show(*what: str) -> str:
        return command.run(["sacctmgr", "-n", "-P", "show", *what], 30, env=env).stdout

    if s.cluster_name not in show("cluster", "format=cluster").split():
        command.run(["sacctmgr", "-i", "add", "cluster", s.cluster_name], 30, env=env)
    if "research" not in show("account", "research", "format=account").split():
        command.run(["sacctmgr", "-i", "add", "account", "research", "Description=dev cluster",
                     "Organization=slurm-ext", f"Cluster={s.cluster_name}"], 30, env=env)
    if "root" not in show("user", "root", "format=user").split():
        command.run(["sacctmgr", "-i", "add", "user", "root", "Account=research",
                     f"Cluster={s.cluster_name}"], 30, env=env)


def _wait_node(layout: Layout, slurm: SlurmClient) -> Node:
    """Wait until the node is registered and answering; warn when it is not idle."""
    name = layout.settings.node_name
    found: list[Node] = []

    def registered() -> bool:
        try:
            node = slurm.node(name)
        except SlurmExtError:
            return False
        found[:] = [node]
        if node.drained and nodestate.stale_at_start(node.reason):
            return False  # the worker agent lifts it in a moment (the drain of the last `down`)
        return node.idle or (node.responding and node.state not in ("UNKNOWN", "FUTURE"))

    daemons.wait_for(f"node {name} to register", registered, layout.settings.up_timeout,
                     logfile=layout.log / "slurmd.log")
    node = found[0]
    if not node.idle:
        log.warning("node %s is %s: %s", name, _state_text(node),
                    f"reason {node.reason!r}; resume with `scontrol update nodename={name} state=resume`"
                    if node.reason else "it is busy")
    return node


def _state_text(node: Node) -> str:
    return "+".join([node.state, *sorted(node.flags)])


def down(settings: DevSection) -> list[int]:
    """Cancel the jobs, stop every daemon, remove the node's job cgroups.

    Returns the PIDs that were stopped. Raises DevClusterError when not root.
    """
    deps.require_root("dev down")
    layout = Layout(settings)
    all_daemons = cluster_daemons(layout)
    if daemons.running_pid(_named(all_daemons, "supervise-controller")):  # let Slurm end its jobs itself
        _cancel_jobs(layout)
    # an agent stops its workers one by one, each within its own grace (mariadbd 60s): give it the time
    stopped = [pid for d in reversed(all_daemons) if (pid := daemons.stop(d, grace=120.0)) is not None]
    _remove_job_cgroups(settings.node_name)
    log.info("cluster down: stopped %d daemons", len(stopped))
    return stopped


def _cancel_jobs(layout: Layout) -> None:
    slurm = client(layout.settings, timeout=10.0)
    try:
        jobs = [j for j in slurm.jobs() if not j.finished]
        if not jobs:
            return
        log.info("cancelling %d jobs", len(jobs))
        command.run(["scancel", *(str(j.job_id) for j in jobs)], 30, env=layout.daemon_environ(), check=False)
        daemons.wait_for("jobs to end", lambda: not [j for j in slurm.jobs() if not j.finished],
                         30.0, interval=0.2)
    except SlurmExtError as err:
        log.warning("could not cancel jobs cleanly (%s); their processes are killed with the cgroups", err)


def _named(all_daemons: list[Daemon], name: str) -> Daemon:
    return next(d for d in all_daemons if d.name == name)


def job_cgroups(node_name: str, cgroup_root: Path = _CGROUP_ROOT) -> list[Path]:
    """The node's job cgroup trees Slurm made (`slurm_<node>` under each v1 controller)."""
    return sorted(p for p in cgroup_root.glob(f"*/slurm_{node_name}") if p.is_dir())


def _remove_job_cgroups(node_name: str, timeout: float = 10.0) -> None:
    """Kill what is left in the node's job cgroups (only the cluster's jobs are
    there) and remove the directories, deepest first."""
    deadline = time.monotonic() + timeout
    for top in job_cgroups(node_name):
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
            while True:
                for pid in sorted(cgroupfs.members([directory])):
                    log.warning("killing pid %d left in %s", pid, directory)
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    if time.monotonic() > deadline:
                        raise DevClusterError(f"cannot remove cgroup {directory}: {err.strerror}") from err
                    time.sleep(0.05)


def status(settings: DevSection) -> Status:
    """What runs, by pidfile, and the node as slurmctld sees it."""
    layout = Layout(settings)
    states = tuple(DaemonStatus(d.name, daemons.running_pid(d), d.pidfile) for d in cluster_daemons(layout))
    node, problem = None, ""
    if next(state for state in states if state.name == "supervise-controller").pid:
        try:
            node = client(settings, timeout=5.0).node(settings.node_name)
        except SlurmExtError as err:
            problem = str(err)
    else:
        problem = "slurmctld's agent (supervise-controller) is not running"
    return Status(layout.root, states, node, problem)


def demo_script(gpu_count: int) -> str:
    """The demo job's shell script: its CUDA_VISIBLE_DEVICES, then the GPUs NVML shows it.

    NVML (the fake, given the dev dir) lists only the GPUs whose device file
    the job may open, so this prints the job's own GPUs, not the node's
    `gpu_count`.
    """
    return (
        'echo "job $SLURM_JOB_ID on $SLURMD_NODENAME: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"\n'
        f"exec {sys.executable} -c '"
        "import pynvml\n"
        "pynvml.nvmlInit()\n"
        "count = pynvml.nvmlDeviceGetCount()\n"
        f'print(f"NVML in the job sees {{count}} of the {gpu_count} GPUs of the node'
        ' (its devices cgroup hides the others):")\n'
        "for i in range(count):\n"
        "    h = pynvml.nvmlDeviceGetHandleByIndex(i)\n"
        '    print(f"NVML gpu {i}: {pynvml.nvmlDeviceGetName(h)} {pynvml.nvmlDeviceGetUUID(h)} '
        'nvidia{pynvml.nvmlDeviceGetMinorNumber(h)}")\n'
        "'\n"
    )


def demo(settings: DevSection, timeout: float = 60.0) -> DemoResult:
    """Submit a job that lists, through NVML, the GPUs it sees; wait until sacct has it.

    The job asks for one GPU; Slurm's devices cgroup (ConstrainDevices) lets it
    open only that GPU's device file, so NVML in the job shows one GPU of the
    node's `gpu_count`, as the real driver would.

    Raises:
        DevClusterError: the cluster is not up, or the job does not reach
            sacct within `timeout`.
    """
    layout = Layout(settings)
    if not status(settings).node:
        raise DevClusterError("the dev cluster is not up: run `slurm-ext dev up` first")
    script = demo_script(settings.gpu_count)
    gres = ["--gres=gpu:1"] if settings.gpu_count else []
    try:
        submitted = command.run(["sbatch", "--parsable", "--job-name=slurm-ext-demo", *gres,
                                 f"--output={layout.out}/demo-%j.out", f"--chdir={layout.out}",
                                 f"--wrap={script}"], 30, env=layout.daemon_environ())
    except CommandError as err:
        raise DevClusterError(f"sbatch failed: {err}") from err
    job_id = int(submitted.stdout.strip().split(";")[0])
    log.info("submitted demo job %d", job_id)
    try:
        job = client(settings).wait_accounted(job_id, timeout)
    except SlurmError as err:
        raise DevClusterError(str(err)) from err
    output = (layout.out / f"demo-{job_id}.out").read_text(errors="replace")
    return DemoResult(job, output)
