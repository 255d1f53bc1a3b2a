"""The node agent's processes: each worker's live record, spawning, pidfds, reaping, sessions, signals.

Workers are held by pidfd, not by pid: signals go through the pidfd, and the
death of a main process followed through MAINPID= (not yet the agent's
child) is seen when its pidfd becomes readable, so a recycled pid is never
signalled nor taken for the worker. The agent reaps with __WNOTHREAD: the
children of other threads (a step's scripts, the Slurm thread's scontrol)
are left to the thread that waits for them.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import select
import selectors
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from slurm_ext import credentials, events, workerevents
from slurm_ext.errors import SlurmExtError
from slurm_ext.plugin import KillHold, WorkerSpec
from slurm_ext.procfs import all_stats, read_stat

from . import slurmd_args
from .lifecycle import Life
from .eventchannel import EventChannel
from .notify import NotifySocket, is_descendant
from .states import WorkerState

__all__ = ["Worker", "session_members", "kill_session", "exited_child", "reap_pid", "pidfd_open", "pidfd_alive",
           "pidfd_exited", "set_state", "state_changed", "send_signal", "kill_leftovers", "notify_uid", "poke",
           "how_it_ended", "on_notify", "follow_mainpid", "WorkerUserMissing", "user_of", "close_channels",
           "become_reaper", "spawn", "watch", "unwatch", "reap", "NEVER"]

log = logging.getLogger("supervisor")

_PR_SET_CHILD_SUBREAPER = 36
#: waitpid/waitid option (linux/wait.h, not in the os module): only children of the calling thread
_WNOTHREAD = 0x20000000
NEVER = float("inf")


@dataclass
class Worker:
    """A worker's live record: the spec is what to run, `life` its restart decisions, the rest its process."""

    spec: WorkerSpec
    life: Life
    pid: int | None = None
    #: the session it was started in (setsid): its helpers share it, job steps do not
    session: int | None = None
    #: READY=1 received since the last start
    notified_ready: bool = False
    #: STOPPING=1 received: its coming exit is announced, not a crash
    announced_stop: bool = False
    notify: NotifySocket | None = None
    #: the socket its events come in by, when it runs as a user that cannot write the journal (spec.events)
    events: EventChannel | None = None
    stop_deadline: float = 0.0
    #: start again as soon as it has stopped (a changed spec)
    restart_after_stop: bool = False
    #: a newer spec to use from its next start
    pending_spec: WorkerSpec | None = field(default=None, repr=False)
    #: pidfd of the main process (pid): what signals go through, readable once it has exited
    pidfd: int | None = None
    #: a plug-in's hold on SIGKILL past the stop grace, asked at the last stop request (slurmctld's records)
    kill_hold: KillHold | None = None
    #: dropped by a reloaded config: kept only until it has stopped
    removed: bool = False

    @property
    def state(self) -> WorkerState:
        return self.life.state

    @property
    def restarts(self) -> int:
        return self.life.restarts

    @property
    def crash_loop(self) -> bool:
        return self.life.crash_loop

    @property
    def started(self) -> float:
        return self.life.started or 0.0

    @property
    def drain_owner(self) -> str:
        """Its name as the owner of a crash-loop drain (slurm_ext.nodestate)."""
        return f"crash-loop/{self.spec.name}"


def session_members(session: int | None, proc: Path = Path("/proc")) -> list[int]:
    """Live processes whose session id is `session`."""
    if not session:
        return []
    return [s.pid for s in all_stats(proc) if s.session == session and s.state not in ("Z", "X")]


def kill_session(session: int | None, signum: int, proc: Path = Path("/proc")) -> list[int]:
    """Send `signum` to the live processes of `session`; returns their pids.

    Each is signalled through a pidfd opened before its session is checked
    again, so a pid that exits and is reused between the listing and the
    signal is never hit: the pidfd still names the process that was checked.
    """
    signalled = []
    for pid in session_members(session, proc):
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # gone since the listing
        except OSError as err:
            log.error("session %d: cannot open a pidfd of pid %d to signal it: %s", session, pid, err.strerror)
            continue
        try:
            stat = read_stat(pid, proc)
            if stat is not None and stat.session == session:
                signal.pidfd_send_signal(pidfd, signum)
                signalled.append(pid)
        except ProcessLookupError:
            pass
        finally:
            os.close(pidfd)
    return signalled


def exited_child() -> int | None:
    """The pid of an exited child of this thread, left unreaped (WNOWAIT); None when there is none."""
    try:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT | _WNOTHREAD)
    except ChildProcessError:
        return None
    return info.si_pid if info is not None and info.si_pid else None


def reap_pid(pid: int) -> int | None:
    """Reap `pid`, a zombie child of this thread; returns its wait status (None: already reaped)."""
    try:
        _, status = os.waitpid(pid, _WNOTHREAD)
    except ChildProcessError:
        return None
    return status


def pidfd_open(pid: int, what: str) -> int | None:
    """A pidfd of `pid`, or None (logged) when it is gone or no descriptor is left."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        log.warning("%s: pid %d has already exited", what, pid)
    except OSError as err:
        log.error("%s: cannot open a pidfd of pid %d: %s", what, pid, err.strerror)
    return None


def pidfd_alive(pidfd: int) -> bool:
    """The pidfd's process still runs (not exited, not a zombie)."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    return not pidfd_exited(pidfd)


def pidfd_exited(pidfd: int) -> bool:
    """A pidfd is readable once its process has exited (a zombie counts)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def set_state(emit, worker: Worker, new: WorkerState, why: str, **fields) -> None:
    old = worker.state
    worker.life.move(new)
    state_changed(emit, worker, old, why, **fields)


def state_changed(emit, worker: Worker, old: WorkerState, why: str, **fields) -> None:
    """One `worker-state` event per decision of the worker's life (made already): what an operator reads in the
    journal and a test waits for, where the log line alone was a regex to match."""
    new, name = worker.state, worker.spec.name
    emit("worker-state", f"worker {name}: {old.value} -> {new.value}: {why}",
         severity="info" if new in (WorkerState.RUNNING, WorkerState.STOPPED) else "warning",
         worker=name, was=old.value, state=new.value, **fields)


def send_signal(worker: Worker, signum: int) -> None:
    """Signal the worker's main process through its pidfd: never whoever has its pid now."""
    try:
        if worker.pidfd is not None:
            signal.pidfd_send_signal(worker.pidfd, signum)
        elif worker.pid is not None:  # no pidfd (none was left): only our own unreaped child, never a
            os.kill(worker.pid, signum)  # MAINPID (followed only with a pidfd), so the pid is still it
    except ProcessLookupError:
        pass


def kill_leftovers(worker: Worker) -> None:
    """After a stop, kill what the worker left in its own session (helpers it
    forked). slurmstepd and jobs run in sessions of their own: untouched."""
    for pid in kill_session(worker.session, signal.SIGKILL):
        log.warning("worker %s: pid %d of its session outlived it: SIGKILL", worker.spec.name, pid)


def notify_uid(user: str) -> int | None:
    """The uid of a worker's notify_user; None for root's own workers (or a user this host lacks)."""
    if not user:
        return None
    import pwd
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        log.warning("notify: no user %s on this host: its worker's notify socket stays root's, so a worker "
                    "running as %s cannot say READY=1 (and workers after it never start)", user, user)
        return None


class WorkerUserMissing(SlurmExtError):
    """A worker's user is not on this host: the worker is not started."""

    def __init__(self, worker: str, user: str):
        self.worker, self.user = worker, user
        super().__init__(f"runs as user {user} ({worker}.user, or supervisor.workers.{worker}.user), which this host "
                         f"does not have: create it (useradd --system --no-create-home --shell /usr/sbin/nologin "
                         f"{user}) and it is started at its next try")


def user_of(spec: WorkerSpec):
    """The passwd entry of the user `spec` runs as.

    Raises:
        WorkerUserMissing: no such user on this host."""
    import pwd
    try:
        return pwd.getpwnam(spec.user)
    except KeyError:
        raise WorkerUserMissing(spec.name, spec.user) from None


def _as_user(account, program: str, arguments: list[str], env: dict[str, str]) -> tuple[str, list[str]]:
    """(file, argv) that run `program` with `arguments` as `account`: its uid, its primary gid and its
    supplementary groups (initgroups), through util-linux's setpriv, which drops root and execs the program in the
    same process (the pid the agent holds). No preexec in this threaded agent: its child does nothing but exec."""
    setpriv = shutil.which("setpriv", path=env.get("PATH", os.defpath)) or "/usr/bin/setpriv"
    return setpriv, [setpriv, f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups", "--",
                     program, *arguments]


def poke(fd: int, signum: int = 0) -> None:
    """From another thread: make the loop look again now (a 0 byte in the signal pipe is no signal), or act as
    if `signum` had come."""
    try:
        os.write(fd, bytes([signum]))
    except OSError:
        pass  # full: the loop wakes anyway


def how_it_ended(status: int | None, pid: int | None) -> tuple[str, dict]:
    """A wait status in words, and as the event's fields (exit_code None: a signal, or not known)."""
    if status is None:
        return (f"exit status unknown: main pid {pid} was not this agent's child",
                {"exit_code": None, "signal": None, "core_dumped": False})
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return f"exit status {code}", {"exit_code": code, "signal": None, "core_dumped": False}
    core = os.WCOREDUMP(status)
    name = signal.Signals(-code).name
    return (f"killed by {name}" + (" (core dumped)" if core else ""),
            {"exit_code": None, "signal": name, "core_dumped": core})


def on_notify(agent, worker: Worker) -> None:
    """A worker's sd_notify messages: READY=1, RELOADING=1, STOPPING=1, MAINPID= (only from its own processes)."""
    for message in worker.notify.receive():
        name = worker.spec.name
        if not message.sender or not is_descendant(message.sender, os.getpid()):
            log.warning("notify %s: message from pid %s, which is not one of this agent's processes: "
                        "ignored", name, message.sender)
            continue
        if message.garbage:
            log.warning("notify %s: pid %d sent lines that are not sd_notify KEY=VALUE: %s",
                        name, message.sender, "; ".join(message.garbage))
        if message.mainpid is not None and message.mainpid != worker.pid:
            follow_mainpid(agent, worker, message.mainpid)
        if message.ready:
            worker.notified_ready = True
            log.info("notify %s: READY=1", name)
        if message.reloading:
            worker.notified_ready = False
            log.info("notify %s: RELOADING=1", name)
        if message.stopping:
            worker.announced_stop = True
            log.info("notify %s: STOPPING=1", name)


def follow_mainpid(agent, worker: Worker, pid: int) -> None:
    """Take `pid` as the worker's main process, held by a pidfd opened before it is checked."""
    name = worker.spec.name
    if worker.state != WorkerState.RUNNING:
        log.warning("notify %s: MAINPID=%d while %s: ignored", name, pid, worker.state.value)
        return
    pidfd = pidfd_open(pid, f"notify {name}: MAINPID")
    if pidfd is None:
        return
    # checked while the pidfd holds the process: alive after the check, the check was about it
    if not is_descendant(pid, os.getpid()) or not pidfd_alive(pidfd):
        os.close(pidfd)
        log.warning("notify %s: MAINPID=%d is not a descendant of this agent: ignored", name, pid)
        return
    agent.emit("mainpid", f"worker {name}: main process is now pid {pid} (was {worker.pid})", worker=name, pid=pid)
    if worker.pid is not None:
        agent.by_pid.pop(worker.pid, None)  # its exit is now a hand-over, not a death
    unwatch(agent, worker)
    worker.pid = pid
    agent.by_pid[pid] = worker
    watch(agent, worker, pidfd)


def become_reaper(agent) -> None:
    """Make the agent the reaper of its workers' orphans: PID 1 of its namespace already is (and, in a container,
    fixes its cgroups for slurmd), any other pid becomes a child subreaper."""
    settings = agent.config.supervisor
    if os.getpid() == 1:
        log.info("running as PID 1: reaping every orphan of this PID namespace")
        from .cgroup import fix_container_cgroups
        fix_container_cgroups(agent.emit, writable=settings.cgroup_writable and slurmd_args.runs_slurmd(agent.role),
                              leave_root=settings.leave_root_cgroup)  # only slurmd makes cgroups
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        agent.emit("subreaper-failed", f"cannot become child subreaper: {os.strerror(err)}; orphans of "
                   "workers will be re-parented past this agent", severity="error")
    else:
        log.info("running as child subreaper (pid %d): orphans of workers are re-parented here", os.getpid())


def spawn(agent, worker: Worker) -> tuple[int, tuple[str, ...]]:
    """Start the worker's program in a session of its own, on its notify socket if it speaks sd_notify; returns
    (pid, argv), the pid held by a pidfd the loop selects on.

    Raises:
        OSError: the program is not found or cannot be executed, or its credentials' folder or its state folder
            cannot be made.
        SlurmExtError: its user is not on this host (WorkerUserMissing), or a secret file it needs is refused
            (slurm_ext.secretfile.SecretFileError).
    """
    spec = worker.spec
    env = {**agent.base_env, **spec.environment}
    account = user_of(spec) if spec.user else None
    if spec.notify:
        if worker.notify is None:
            worker.notify = NotifySocket(Path(agent.config.node.runtime_dir)
                                         / f"notify-{agent.role}-{spec.name}.sock",
                                         notify_uid(spec.notify_user or spec.user))
            agent.selector.register(worker.notify, selectors.EVENT_READ, functools.partial(on_notify, agent, worker))
        env["NOTIFY_SOCKET"] = str(worker.notify.path)
    argv = slurmd_args.argv_of(spec.name, spec.command, agent.gpus)
    program = shutil.which(argv[0], path=env.get("PATH", os.defpath))
    if program is None:
        raise FileNotFoundError(f"{argv[0]}: not found in PATH ({env.get('PATH', os.defpath)})")
    file, args = program, list(argv)
    if account is not None:
        env.update(HOME=account.pw_dir if os.path.isdir(account.pw_dir) else "/", USER=account.pw_name,
                   LOGNAME=account.pw_name)
        if spec.events:
            env[workerevents.ENV] = str(_event_channel(agent, worker, account.pw_uid).path)
        if spec.credentials:
            env[credentials.ENV] = str(credentials.copy_for(agent.config, spec.name, account.pw_uid, account.pw_gid,
                                                            spec.credentials))
            # its own folder of state, <state_dir>/<worker>/ (root's state_dir is not its to write): the page keeps
            # its sessions ended by logout there
            credentials.state_folder(agent.config, spec.name, account.pw_uid, account.pw_gid)
        file, args = _as_user(account, program, args[1:], env)
    pid = os.posix_spawn(file, args, env, setsid=True)
    worker.pid = worker.session = pid
    worker.notified_ready = worker.announced_stop = False
    agent.by_pid[pid] = worker
    # our unreaped child: its pid cannot be reused before this pidfd refers to it
    watch(agent, worker, pidfd_open(pid, f"worker {spec.name}"))
    return pid, argv


def _event_channel(agent, worker: Worker, uid: int) -> EventChannel:
    """The worker's event socket (made at its first start, kept across restarts), its events journaled under its
    component with `worker` naming it."""
    if worker.events is None:
        name, state_dir = worker.spec.name, agent.config.node.state_dir

        def write(event: str, message: str, severity: str | None, fields: dict, component: str = "") -> None:
            events.emit(state_dir, component or worker.spec.events, event, message, severity,
                        **{**fields, "worker": name})

        worker.events = EventChannel(Path(agent.config.node.runtime_dir) / f"events-{agent.role}-{name}.sock", uid,
                                     name, worker.spec.events, write, time.monotonic)
        agent.selector.register(worker.events, selectors.EVENT_READ, worker.events.receive)
    return worker.events


def close_channels(agent, worker: Worker) -> None:
    """Close the worker's notify and event sockets (it was removed, or the agent stops)."""
    for channel in (worker.notify, worker.events):
        if channel is not None:
            try:
                agent.selector.unregister(channel)
            except (KeyError, ValueError):
                pass
            channel.close()
    worker.notify = worker.events = None


def watch(agent, worker: Worker, pidfd: int | None) -> None:
    """Hold `pidfd` for the worker's main process; the loop hears of its exit through it."""
    worker.pidfd = pidfd
    if pidfd is not None:
        agent.selector.register(pidfd, selectors.EVENT_READ, functools.partial(_on_pidfd, agent, worker, pidfd))


def unwatch(agent, worker: Worker) -> None:
    if worker.pidfd is not None:
        agent.selector.unregister(worker.pidfd)
        os.close(worker.pidfd)
        worker.pidfd = None


def _on_pidfd(agent, worker: Worker, pidfd: int) -> None:
    """The worker's main process has exited. Our child: the reap says how. A MAINPID that was
    not yet re-parented to us: its parent reaps it, so how it ended is not ours to know."""
    if worker.pidfd != pidfd or not pidfd_exited(pidfd):
        return  # closed and reused earlier in this pass
    pid = worker.pid
    reap(agent)
    if worker.pidfd != pidfd or worker.pid != pid:
        return  # reaped, and maybe started again (restart_after_stop) on a pidfd of the same number
    if worker.state == WorkerState.STOPPING:
        kill_leftovers(worker)
    agent.by_pid.pop(worker.pid, None)
    agent.on_exit(worker, None)


def reap(agent) -> None:
    """Reap every exited child of this thread: workers, and orphans the kernel re-parented here.

    Children of the other threads (a start step's scripts and slurmd -G,
    the Slurm thread's scontrol) are not looked at (__WNOTHREAD): the
    thread that started one waits for it and gets its exit status.
    """
    while (pid := exited_child()) is not None:
        worker = agent.by_pid.pop(pid, None)
        if worker is not None and worker.state == WorkerState.STOPPING:
            # before the reap: while the leader is a zombie no new process can get its session id
            kill_leftovers(worker)
        status = reap_pid(pid)
        if status is None:  # waited for by someone else after all: a bug elsewhere, not worth dying of
            log.error("pid %d was reaped by another waiter of this process; its exit status is lost", pid)
            if worker is not None:
                agent.on_exit(worker, None)
            continue
        if worker is not None:
            agent.on_exit(worker, status)
        else:
            agent.orphans_reaped += 1
