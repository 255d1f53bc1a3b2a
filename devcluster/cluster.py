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
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from slurm_ext import agentapi, cgroupfs, command, config, nodestate
from slurm_ext.config import SlurmSection
from slurm_ext.errors import CommandError, DevClusterError, SlurmError, SlurmExtError
from slurm_ext.slurm import Job, Node, SlurmClient

from . import daemons, deps, drills, fakenvml, nodenet, render
from .daemons import Daemon
from .layout import Layout, NodeLayout, node_names
from .settings import DevSection

__all__ = ["DaemonStatus", "Status", "DemoResult", "up", "down", "status", "demo", "demo_script", "client",
           "cluster_daemons", "job_cgroups", "shared_munged"]

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
    #: the first node as slurmctld sees it; None when slurmctld does not answer
    node: Node | None
    #: why `node` is None
    problem: str = ""
    #: every running node as slurmctld sees it (the first is `node`)
    nodes: tuple[Node, ...] = ()


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
    """Every daemon of the cluster, in start order: a worker agent per running node last."""
    s = layout.settings
    munge = layout.munge
    slurm_files = {layout.slurm_conf, layout.etc / "cgroup.conf"}  # gres.conf: each worker agent writes its own
    return [
        Daemon("munged",
               ("runuser", "-u", "munge", "--", "munged", f"--key-file={munge}/munge.key",
                f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
                f"--seed-file={munge}/munged.seed"),
               munge / "munged.pid", frozenset({"munged"}), layout.log / "munged.out"),
        _agent(layout, "supervise-accounting", "accounting", layout.slurm_ext_conf,
               (s.mariadb_port, s.slurmdbd_port, s.accounting_probe_port), {layout.slurm_conf}),
        _agent(layout, "supervise-controller", "controller", layout.slurm_ext_conf,
               (s.slurmctld_port, s.controller_probe_port), slurm_files),
        *(_agent(layout, node.agent, "worker", node.slurm_ext_conf, (node.slurmd_port, node.probe_port), slurm_files)
          for node in layout.nodes),
    ]


def _agent(layout: Layout, name: str, role: str, conf: Path, ports: tuple[int, ...], reads: set[Path]) -> Daemon:
    """slurm-ext's node agent for `role`: it runs MariaDB and slurmdbd, slurmctld, or slurmd in the foreground."""
    return Daemon(name, (_entry_point("slurm-ext"), "--config", str(conf), "supervise", "--role", role,
                         "--pidfile", str(layout.pidfile(name))),
                  layout.pidfile(name), frozenset({"slurm-ext"}), layout.log / f"{name}.out", ports,
                  frozenset(reads | {conf}))


def environ_of(layout: Layout, daemon: Daemon) -> dict[str, str]:
    """The environment a daemon starts with: a worker agent's is its node's."""
    for node in layout.nodes:
        if daemon.name == node.agent:
            return node.daemon_environ()
    return layout.daemon_environ()


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
    _stop_nodes_beyond(settings)
    changed = _write_files(layout)
    if settings.web_port:
        _ensure_page_user()
    to_start = []
    for daemon in cluster_daemons(layout):
        if daemons.running_pid(daemon) and daemon.reads & changed:
            log.info("%s: its config changed: restarting it", daemon.name)
            daemons.stop(daemon)
        if not daemons.running_pid(daemon):
            to_start.append(daemon)
    for daemon in to_start:  # all ports first: a taken one fails before anything starts (a namespace included)
        for port in daemon.ports:
            daemons.check_port_free(port, daemon.name)
    for node in layout.nodes:  # before the agents: a monitor watches lo of its node's namespace from its start
        nodenet.ensure(node.netns)
    for daemon in to_start:
        if daemon.name == "munged" and _munge_works():
            log.info("munged: one already answers on the default socket: using it")
            continue
        daemons.start(daemon, environ_of(layout, daemon), settings.up_timeout)
        _wait_ready(daemon.name, layout)
    slurm = client(settings, timeout=5.0)
    for node in _wait_nodes(layout, slurm):
        log.info("node %s is %s", node.name, _state_text(node))
    log.info("cluster up in %.1fs", time.monotonic() - started_at)
    return status(settings)


def with_present_nodes(settings: DevSection) -> DevSection:
    """`settings` with as many nodes as an earlier `dev up --nodes N` left in the state directory, if more: `down`
    and `status` then cover every node that may run, whatever --nodes they are given."""
    present = Path(settings.state_dir) / "nodes"
    names = node_names(replace(settings, nodes=64, defined_nodes=0))
    count = max([index + 1 for index, name in enumerate(names) if (present / name).is_dir()], default=1)
    return replace(settings, nodes=count) if count > settings.nodes else settings


def _stop_nodes_beyond(settings: DevSection) -> None:
    """Stop the agents of nodes an earlier `dev up` ran that this one does not (slurm.conf drops them)."""
    wider = with_present_nodes(settings)
    if wider.nodes > settings.nodes:
        kept = {node.agent for node in Layout(settings).nodes}
        for daemon in cluster_daemons(Layout(wider)):
            if daemon.name.startswith("supervise-worker") and daemon.name not in kept:
                daemons.stop(daemon, grace=120.0)


def _write_files(layout: Layout) -> set[Path]:
    """Create the state tree and every config file; the files that changed."""
    s = layout.settings
    for path in (layout.etc, layout.log, layout.run, layout.root / "bin", layout.ctld_state, layout.slurmd_spools,
                 layout.lib, layout.munge):
        path.mkdir(parents=True, exist_ok=True)
    layout.out.mkdir(exist_ok=True)
    layout.out.chmod(0o1777)
    os.chown(layout.run, 0, 0)  # root writes the pidfiles here (an older dev cluster gave it to mysql)
    _prepare_munge(layout)
    for password in (layout.db_password, layout.page_db_password):  # the accounting agent gives them to MariaDB
        if not password.exists():
            _write(password, secrets.token_hex(16) + "\n", 0o600)
    agentapi.create_credential(layout.agent_credential)  # the agents and the controller prove it to each other
    fakenvml.build(layout.lib)
    hooks = {node.name: _node_files(layout, node) for node in layout.nodes}
    hook = next(iter(hooks.values()))
    if len(hooks) > 1:
        _write(layout.node_hook, render.node_hook(layout, hooks), 0o755)
        hook = str(layout.node_hook)
    _write(layout.reboot_program, render.reboot_program(layout, _entry_point("slurm-ext")), 0o755)
    _write(layout.nvidia_smi, render.nvidia_smi(sys.executable), 0o755)
    _write(layout.accept_program, render.accept_program(layout, _entry_point("slurm-ext")), 0o755)
    _write(layout.dev_conf, config.render_section("dev", s))
    topology = render.parse_topology(command.run(["slurmd", "-C"], 30, env=layout.daemon_environ()).stdout)
    files = {
        layout.slurm_conf: render.slurm_conf(layout, topology, hook),
        layout.etc / "cgroup.conf": render.cgroup_conf(),
        **{node.slurm_ext_conf: render.slurm_ext_toml(layout, node) for node in layout.nodes},
    }
    return {path for path, text in files.items() if _write(path, text)}


#: the users `dev up` made in this process: a system user stays after `dev down`, as a package's does; the test
#: suite removes the one its session made
USERS_MADE: set[str] = set()


def _ensure_page_user() -> None:
    """The page runs as web.user (slurm-ext-web), as on a real controller: made here where the host lacks it, as
    docs/operator/web.md says to. What it reads of the dev tree is its to read: the config and slurm.conf (0644),
    the token file (root:slurm-ext-web 0640, `web add-token`), munge's socket; its secrets are copies the
    controller agent makes for it, and the repair store is MariaDB over TCP."""
    user = config.Config().web.user
    try:
        pwd.getpwnam(user)
    except KeyError:
        log.info("making the page's user %s", user)
        made = command.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user], 60,
                           check=False)
        try:
            pwd.getpwnam(user)  # another `dev up` may have made it meanwhile
        except KeyError:
            raise DevClusterError(f"cannot make the page's user {user} (web.user): useradd said: "
                                  f"{made.stderr.strip()}") from None
        if made.returncode == 0:
            USERS_MADE.add(user)


def _node_files(layout: Layout, node: NodeLayout) -> str:
    """A node's own tree: fake GPUs, kernel log, Slurm's files linked, hook client and wrappers; its hook's path."""
    s = layout.settings
    for path in (node.etc, node.bin, node.node_state, node.dev, node.drill_fs, layout.slurmd_spools / node.name):
        path.mkdir(parents=True, exist_ok=True)
    if node.index:  # slurmd reads gres.conf beside the slurm.conf it is given: the node's own, beside the links
        for name in ("slurm.conf", "cgroup.conf"):
            link = node.etc / name
            if not link.is_symlink():
                link.unlink(missing_ok=True)
                link.symlink_to(layout.etc / name)
    if not node.boot_id.exists():
        _write(node.boot_id, str(uuid.uuid4()) + "\n")
    for minor, device in enumerate(node.gpu_devices()):
        fakenvml.make_device(device, minor)
    if not node.gpu_spec.exists():
        fakenvml.write_spec(node.gpu_spec, fakenvml.default_gpus(s.gpu_count, s.gpu_name))
    if node.kernel_log.parent == node.base:
        node.kernel_log.touch()  # the node's simulated kernel log: kernel lines appended to it are judged
    prolog, epilog = node.bin / "slurm-ext-prolog", node.bin / "slurm-ext-epilog"
    from slurm_ext.prolog_epilog import build_hook, write_launchers  # dev assembles the components into a cluster
    python_prolog, python_epilog = write_launchers(node.bin)
    _write(prolog, render.hook_wrapper(node, str(python_prolog)), 0o755)
    _write(epilog, render.hook_wrapper(node, str(python_epilog)), 0o755)
    return str(build_hook(node.bin / "slurm-ext-hook", str(node.hook_socket), str(prolog), str(epilog)))


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


def shared_munged(settings: DevSection) -> Daemon | None:
    """Start munged under `settings`' state directory unless one already answers on the default socket; the
    daemon started (None: there was one). For several clusters up at once (the tests, run in parallel): each
    `dev up` then uses this one, and no cluster's `dev down` stops it under the others; the caller stops it."""
    layout = Layout(settings)
    if _munge_works():
        return None
    layout.munge.mkdir(parents=True, exist_ok=True)
    layout.log.mkdir(parents=True, exist_ok=True)
    _prepare_munge(layout)
    daemon = _named(cluster_daemons(layout), "munged")
    daemons.start(daemon, environ_of(layout, daemon), settings.up_timeout)
    daemons.wait_for("munged", _munge_works, settings.up_timeout, logfile=daemon.logfile)
    return daemon


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


def _wait_nodes(layout: Layout, slurm: SlurmClient) -> list[Node]:
    """Wait until every running node is registered and answering; warn about those that are not idle."""
    names = [node.name for node in layout.nodes]
    found: dict[str, Node] = {}

    def registered(name: str) -> bool:
        try:
            node = slurm.node(name)
        except SlurmExtError:
            return False
        found[name] = node
        if node.drained and nodestate.stale_at_start(node.reason):
            return False  # the worker agent lifts it in a moment (the drain of the last `down`)
        return node.idle or (node.responding and node.state not in ("UNKNOWN", "FUTURE"))

    for name in names:
        daemons.wait_for(f"node {name} to register", lambda: registered(name), layout.settings.up_timeout,
                         logfile=layout.slurmd_log(name))
        node = found[name]
        if not node.idle:
            log.warning("node %s is %s: %s", name, _state_text(node),
                        f"reason {node.reason!r}; resume with `scontrol update nodename={name} state=resume`"
                        if node.reason else "it is busy")
    return [found[name] for name in names]


def _state_text(node: Node) -> str:
    return "+".join([node.state, *sorted(node.flags)])


def down(settings: DevSection) -> list[int]:
    """Cancel the jobs, stop every daemon, remove the node's job cgroups.

    Returns the PIDs that were stopped. Raises DevClusterError when not root.
    """
    deps.require_root("dev down")
    layout = Layout(with_present_nodes(settings))
    try:  # a stopped slurmd must go on to stop; a drill's tmpfs must go
        for healed in drills.heal_all(layout.settings):
            log.info("node %s: drills undone: %s", healed.node, "; ".join(healed.undone))
        not_healed = None
    except DevClusterError as err:  # the daemons stop all the same; the error once they have
        not_healed = err
    all_daemons = cluster_daemons(layout)
    if daemons.running_pid(_named(all_daemons, "supervise-controller")):  # let Slurm end its jobs itself
        _cancel_jobs(layout)
    # an agent stops its workers one by one, each within its own grace (mariadbd 60s): give it the time
    stopped = [pid for d in reversed(all_daemons) if (pid := daemons.stop(d, grace=120.0)) is not None]
    for node in layout.nodes:
        _remove_job_cgroups(node.name)
    nodenet.remove_all(layout.netns_prefix)  # a node's of an earlier, larger up too, or one a killed run left
    log.info("cluster down: stopped %d daemons", len(stopped))
    if not_healed is not None:
        raise not_healed
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


def reboot_node(settings: DevSection, name: str) -> int:
    """What the cluster's RebootProgram does for node `name`: a new boot id, then its worker agent stopped (and
    with it slurmd) and started again, its slurmd told that the node has just booted (`slurmd -b`), so slurmctld
    sees the reboot it asked for completed. Returns the new agent's PID.

    Raises:
        DevClusterError: `name` is not a running node, or its agent does not come back.
    """
    deps.require_root("dev reboot-node")
    layout = Layout(settings)
    try:
        node = layout.node(name)
    except KeyError:
        raise DevClusterError(f"dev reboot-node: {name!r} is not a running node of the dev cluster "
                              f"({', '.join(n.name for n in layout.nodes)})") from None
    agent = next(d for d in cluster_daemons(layout) if d.name == node.agent)
    log.info("node %s: rebooting (its agent and slurmd restart with a new boot id)", name)
    daemons.stop(agent, grace=120.0)
    _write(node.boot_id, str(uuid.uuid4()) + "\n")
    booted = replace(agent, argv=agent.argv + ("--", "-b"))
    pid = daemons.start(booted, node.daemon_environ(), settings.up_timeout)
    log.info("node %s: booted, agent pid %d", name, pid)
    return pid


def status(settings: DevSection) -> Status:
    """What runs, by pidfile, and the nodes as slurmctld sees them."""
    settings = with_present_nodes(settings)
    layout = Layout(settings)
    states = tuple(DaemonStatus(d.name, daemons.running_pid(d), d.pidfile) for d in cluster_daemons(layout))
    nodes: list[Node] = []
    problem = ""
    if next(state for state in states if state.name == "supervise-controller").pid:
        try:
            known = {node.name: node for node in client(settings, timeout=5.0).nodes()}
            nodes = [known[node.name] for node in layout.nodes if node.name in known]
            if not nodes:
                problem = f"slurmctld does not know node {settings.node_name}"
        except SlurmExtError as err:
            problem = str(err)
    else:
        problem = "slurmctld's agent (supervise-controller) is not running"
    first = nodes[0] if nodes and nodes[0].name == settings.node_name else None
    return Status(layout.root, states, first, problem, tuple(nodes))


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
