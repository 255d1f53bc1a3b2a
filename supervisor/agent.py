"""The node agent's loop: start workers, reap every child, restart in place.

One thread does all process work. Signal handlers do nothing but wake it
(signal.set_wakeup_fd writes the signal number into a pipe); the loop reads
the numbers and acts. Each pass reaps every exited child of this thread --
workers and orphans re-parented to the agent alike (it is PID 1 or a child
subreaper, and the kernel hands orphans to the main thread) -- so no zombie
outlives one pass.

Start steps (slurmd -G, NVML, scontrol, node-boot scripts) can take minutes,
so they run on a thread of their own (pipeline.StepRunner) while the loop
keeps reaping and answering; the loop starts the workers when the steps say
so. The loop reaps with __WNOTHREAD: the children of other threads (a step's
scripts, the Slurm thread's scontrol) are left to the thread that waits for
them, so each gets its own exit status.

Workers are held by pidfd, not by pid: signals go through the pidfd, and the
death of a main process followed through MAINPID= (not yet the agent's
child) is seen when its pidfd becomes readable, so a recycled pid is never
signalled nor taken for the worker.

A dead worker is restarted in place by this same process; nothing else is
killed with it: slurmd's job steps (slurmstepd) are not the agent's to kill,
so jobs survive a slurmd crash. When to restart, and whether it crash-loops,
is each worker's `lifecycle.Life` to decide (a worker that had got ready
comes back after backoff_initial; one that never does backs off); this
class keeps the operating-system side: spawn, reap, signals, sockets. A
crash loop's drain is a want of the node-state owner, on the Slurm thread.
"""

from __future__ import annotations

import ctypes
import dataclasses
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

from slurm_ext import command, config as config_mod, events, fileio
from slurm_ext.config import Config
from slurm_ext.errors import CommandError, ConfigError, SlurmExtError
from slurm_ext.procfs import all_stats, boot_id, read_stat
from slurm_ext.slurm import SlurmClient

from . import pipeline, slurmd_args
from .plugins import plugins
from .liaison import SlurmLiaison
from .notify import NotifySocket, SystemdLink, is_descendant
from .lifecycle import CrashLoopOver, GiveUp, Life, Policy, Restart
from .restart import backoff_delay
from .states import WorkerState
from .workers import WorkerSpec, speaks_notify, workers_for

__all__ = ["Agent", "Worker", "session_members", "kill_session"]

log = logging.getLogger("supervisor")

_PR_SET_CHILD_SUBREAPER = 36
_HANDLED = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
#: longest sleep of an idle loop: signals and notify messages wake it at once
_IDLE_WAKEUP = 30.0
#: waitpid/waitid option (linux/wait.h, not in the os module): only children of the calling thread
_WNOTHREAD = 0x20000000
_NEVER = float("inf")
#: at exit, how long a start step whose processes were killed may take to notice
_ABANDON_WAIT = 3.0
#: at SIGTERM, how long slurmd is kept running for Slurm to show the node drained (the pod's preStop)
_STOP_DRAIN_WAIT = 5.0
#: the owner of that drain in the node-state catalogue
STOP_DRAIN_OWNER = "stop"


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
    status_text: str = ""
    last_exit: str = ""
    notify: NotifySocket | None = None
    stop_deadline: float = 0.0
    #: start again as soon as it has stopped (a changed spec)
    restart_after_stop: bool = False
    #: a newer spec to use from its next start
    pending_spec: WorkerSpec | None = field(default=None, repr=False)
    #: pidfd of the main process (pid): what signals go through, readable once it has exited
    pidfd: int | None = None
    #: its start steps (before_restart_of) run now or are queued: started when they succeed
    awaiting_steps: bool = False
    #: waits for the workers of its spec's `after` to be ready: started by the loop once they are
    awaiting_after: bool = False
    #: a plug-in's hold on SIGKILL past the stop grace, asked at the last stop request (slurmctld's records)
    kill_hold: object = None
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


class Agent:
    """`slurm-ext supervise --role ROLE`."""

    def __init__(self, config: Config, role: str, config_path: str | None = None, port: int | None = None,
                 pidfile: str | None = None, environ: dict[str, str] | None = None,
                 daemon_args: tuple[str, ...] = ()):
        if role not in config_mod.ROLES:
            raise ConfigError(config.source or "<command line>", f"unknown role {role!r}; allowed: "
                              f"{', '.join(config_mod.ROLES)}", key="--role")
        self.config = config
        self.role = role
        #: the arguments given after `--`, for the role's daemon (workers.ROLE_DAEMON), kept across reloads
        self.daemon_args = tuple(daemon_args)
        # absolute: the agent works from / (see _setup_process)
        self.config_path = os.path.abspath(config_path) if config_path else None
        self.pidfile = Path(pidfile).absolute() if pidfile else None
        environ = dict(os.environ if environ is None else environ)
        if config_path:  # workers of slurm-ext itself (the hook service) read the same file
            environ[config_mod.ENV_VAR] = self.config_path
        self._systemd_socket = environ.pop("NOTIFY_SOCKET", None)
        for plugin in plugins():  # e.g. the database password, for a start step (which reads os.environ)
            for name in plugin.private_env:
                environ.pop(name, None)
        self.base_env = environ
        self.port = port
        #: what slurmd's command line says (worker role): its node name, dynamic, configless (_fit_to_slurmd)
        self.layout: slurmd_args.SlurmdLayout | None = None
        #: the installed slurmd has --systemd: the built-in slurmd runs on a NOTIFY_SOCKET
        self.slurmd_notify = role == "worker" and _slurmd_speaks_notify(environ)
        #: the node's gpu GRES from the last NVML read, for a dynamic slurmd's --conf (None: not read)
        self.gpus: str | None = None
        self.workers: list[Worker] = []
        self.by_pid: dict[int, Worker] = {}
        self.orphans_reaped = 0
        self.heartbeat = time.monotonic()
        self._next_wake = self.heartbeat
        self.stopping = False
        self.stop_clean = True
        self.pipeline_done = False
        self._pipeline_failures = 0
        self._next_pipeline = 0.0
        self._stop_queue: list[Worker] = []
        self._steps = pipeline.StepRunner()
        #: workers whose start steps wait for the runner
        self._steps_queue: list[Worker] = []
        self._selector = selectors.DefaultSelector()
        self._wakeup_r = self._wakeup_w = -1
        self.liaison: SlurmLiaison | None = None
        self.http = None
        self._systemd: SystemdLink | None = None
        #: at SIGTERM: the drain slurmd waits for before it is stopped, and until when
        self._stop_drain: tuple[object, float] | None = None
        #: the Slurm client of the agent's own thread (the liaison's), for the plug-ins' watches
        self.slurm: SlurmClient | None = None
        #: the plug-ins' live parts (slurm_ext.plugin.Live): watches, metrics, stop holds, config reactions
        self.live_plugins: list = []
        self._apply_config(self._fit_to_slurmd(config), first=True)
        self.node = self.config.node.slurm_name

    # -- set-up -------------------------------------------------------------------

    def _apply_config(self, config: Config, first: bool = False) -> None:
        """Adopt a (new) config, fitted to slurmd's command line (_fit_to_slurmd): worker specs, restart settings."""
        self.config = config
        #: emit(event, message, severity=None, **fields): a journal event of this agent
        self.emit = events.emitter(config.node.state_dir, "supervisor", role=self.role)
        s = config.supervisor
        try:
            specs = workers_for(self.role, s, self.daemon_args, self.slurmd_notify, _spec_changes(config, self.role))
        except ValueError as err:
            raise ConfigError(config.source or "<defaults>", str(err)) from None
        switched_off = _switched_off(config, self.role)
        specs = [spec for spec in specs if spec.name not in switched_off]
        if first:
            self.workers = [self._new_worker(spec) for spec in specs]
            return
        old = {w.spec.name: w for w in self.workers}
        updated = []
        for spec in specs:
            worker = old.pop(spec.name, None)
            if worker is not None and worker.removed and worker.state != WorkerState.STOPPING:
                self._forget(worker)  # removed by an earlier reload and gone: added anew
                worker = None
            if worker is None:
                worker = self._new_worker(spec)
                self.emit("worker-added", f"worker {spec.name} added by the reloaded config", worker=spec.name)
                self._start(worker)
            elif worker.removed:  # removed by an earlier reload, still stopping: started again once it has stopped
                worker.removed, worker.restart_after_stop, worker.pending_spec = False, True, spec
                self.emit("worker-added", f"worker {spec.name} added by the reloaded config: started once its "
                          "stop is over", worker=spec.name)
            elif spec != worker.spec:
                self._respec(worker, spec)
            worker.life.adopt(_policy(s, spec))
            updated.append(worker)
        for worker in old.values():
            # a restart an earlier reload asked for (a changed spec, an add-back) is off: the worker goes
            worker.restart_after_stop, worker.pending_spec = False, None
            if not worker.removed:
                worker.removed = True
                self.emit("worker-removed", f"worker {worker.spec.name} removed by the reloaded config: stopping it",
                          worker=worker.spec.name)
                if self.liaison:
                    self.liaison.clear(worker.drain_owner)  # its crash loop, if any, ends with it
            self._request_stop(worker)
            if worker.state == WorkerState.STOPPED:
                self._forget(worker)
            else:
                updated.append(worker)  # kept until it has stopped (_on_exit forgets it then)
        self.workers = updated

    def _fit_to_slurmd(self, config: Config) -> Config:
        """The config as slurmd's arguments make it: `-N` names the node; configless, gres.conf goes where
        the controller's `Include` finds it (slurmd_args.CONFIGLESS_GRES), unless gres.output says otherwise.

        Raises:
            ConfigError: `-N` and node.name disagree.
        """
        if self.role != "worker":
            return config
        own = config.supervisor.workers.get(slurmd_args.WORKER)
        command = (own.command or ()) if own else ()
        layout = self.layout = slurmd_args.layout_of((*command, *self.daemon_args))
        node, changes = config.node, {}
        if layout.node and node.name and layout.node != node.name:
            raise ConfigError(config.source or "<defaults>", f"slurmd's -N {layout.node} names another node than "
                              f"node.name = {node.name!r}: give one of them", key="node.name")
        if layout.node:
            changes["node"] = dataclasses.replace(node, name=layout.node)
        if layout.configless and not config.gres.output:
            changes["gres"] = dataclasses.replace(config.gres, output=slurmd_args.CONFIGLESS_GRES)
        return dataclasses.replace(config, **changes) if changes else config

    def _new_worker(self, spec: WorkerSpec) -> Worker:
        return Worker(spec=spec, life=Life(_policy(self.config.supervisor, spec)))

    def _forget(self, worker: Worker) -> None:
        """A removed worker has stopped: out of the list (readiness, metrics) and its notify socket closed;
        the plug-ins are told (a removed health monitor may have posted a drain while it was stopping)."""
        self.workers = [w for w in self.workers if w is not worker]
        if worker.notify is not None:
            self._selector.unregister(worker.notify)
            worker.notify.close()
            worker.notify = None
        for live in self.live_plugins:
            live.worker_gone(worker.spec.name)

    def _respec(self, worker: Worker, spec: WorkerSpec) -> None:
        """A worker's definition changed: run the new one."""
        self.emit("worker-changed", f"worker {spec.name}: definition changed by the reloaded config",
                  worker=spec.name)
        if worker.state == WorkerState.RUNNING:
            worker.pending_spec = spec
            worker.restart_after_stop = True
            self._request_stop(worker)
            return
        worker.spec = spec
        if worker.state == WorkerState.BACKOFF and not worker.awaiting_steps:  # e.g. the command was fixed: try now
            worker.life.failures = 0
            worker.life.next_start = time.monotonic()

    def _setup_process(self) -> None:
        # Workers inherit the cwd: the directory someone started the agent from may be theirs to
        # write, and `python -m` (the hook service) imports from it. / is root's, like any daemon's.
        os.chdir("/")
        self._wakeup_r, self._wakeup_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self._wakeup_w, warn_on_full_buffer=False)
        for signum in _HANDLED:
            signal.signal(signum, lambda *_: None)  # the wakeup fd carries the signal to the loop
        self._selector.register(self._wakeup_r, selectors.EVENT_READ, self._read_signals)
        self._selector.register(self._steps, selectors.EVENT_READ, self._on_steps_done)
        if os.getpid() == 1:
            log.info("running as PID 1: reaping every orphan of this PID namespace")
            if self.config.supervisor.cgroup_writable and self.role == "worker":  # only slurmd makes cgroups
                _make_cgroups_writable(self.emit)
            if self.config.supervisor.leave_root_cgroup:
                _leave_root_cgroup(self.emit)
        else:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                err = ctypes.get_errno()
                self.emit("subreaper-failed", f"cannot become child subreaper: {os.strerror(err)}; orphans of "
                          "workers will be re-parented past this agent", severity="error")
            else:
                log.info("running as child subreaper (pid %d): orphans of workers are re-parented here",
                         os.getpid())
        if self.pidfile:
            self.pidfile.parent.mkdir(parents=True, exist_ok=True)
            fileio.atomic_write(self.pidfile, f"{os.getpid()}\n", mode=0o644, fsync="none")
        if self._systemd_socket:
            self._systemd = SystemdLink(self._systemd_socket, int(self.base_env.pop("WATCHDOG_USEC", "0") or 0))
        port = self.port if self.port is not None else self.config.supervisor.port(self.role)
        if port:
            from .http import serve
            self.http = serve(self, self.config.supervisor.listen, port)
        slurm = self.slurm = SlurmClient(self.config.slurm, environ=self.base_env)
        s = self.config.supervisor
        self.liaison = SlurmLiaison(slurm, self.node, s.ready_interval,
                                    events.emitter(self.config.node.state_dir, "nodestate", role=self.role),
                                    Path(s.runtime_dir), s.stale_drain_reasons,
                                    on_change=functools.partial(_poke, self._wakeup_w),
                                    runs_slurmd=any(w.spec.ready == "slurm-node" for w in self.workers))
        # before the liaison's first look: a drain a plug-in lifts at start is lifted, not adopted
        self.live_plugins = [live for plugin in plugins() if (live := plugin.attach(self)) is not None]
        self.liaison.start()

    # -- the loop -----------------------------------------------------------------

    def run(self) -> int:
        """Supervise until SIGTERM/SIGINT; 0 when every worker stopped within its grace."""
        try:
            self._setup_process()
            self.emit("started", f"supervising role {self.role} on node {self.node}: "
                      f"{', '.join(w.spec.name for w in self.workers) or 'no workers'}")
            while not (self.stopping and not self._stop_queue
                       and all(w.state == WorkerState.STOPPED for w in self.workers)):
                self._pass()
            if self._steps.busy:
                self._abandon_steps()
        finally:
            self._teardown()
        self.emit("exited", "all workers stopped" + ("" if self.stop_clean else "; some needed SIGKILL"),
                  severity="info" if self.stop_clean else "warning")
        return 0 if self.stop_clean else 1

    def _pass(self) -> None:
        now = time.monotonic()
        for key, _ in self._selector.select(self._timeout(now)):
            key.data()  # the handler registered with the descriptor
        self._reap()
        self._tick(time.monotonic())
        self.heartbeat = time.monotonic()
        if self._systemd:
            ready, why = self.ready()
            self._systemd.tick(time.monotonic(), ready, f"{self.role}: {why}")

    def _timeout(self, now: float) -> float:
        deadlines = [d for w in self.workers if (d := w.life.deadline()) is not None]
        deadlines += [w.stop_deadline for w in self.workers if w.state == WorkerState.STOPPING]
        if not self.pipeline_done and not self.stopping:
            deadlines.append(self._next_pipeline)
        if self._systemd and self._systemd.watchdog_every:
            deadlines.append(self._systemd.next_watchdog())
        if self._stop_drain is not None:  # the ticket settles on the Slurm thread: look again soon
            deadlines.append(min(self._stop_drain[1], now + 0.02))
        wake = min([now + _IDLE_WAKEUP, *deadlines])
        self._next_wake = wake
        return max(0.0, wake - now)

    def _read_signals(self) -> None:
        try:
            data = os.read(self._wakeup_r, 4096)
        except BlockingIOError:
            return
        for signum in set(data):
            if signum in (signal.SIGTERM, signal.SIGINT) and not self.stopping:
                self.emit("stop", f"{signal.Signals(signum).name}: stopping every worker in reverse start order")
                self.stopping = True
                self._stop_queue = [w for w in reversed(self.workers)]
                self._drain_before_stop(signal.Signals(signum).name)
            elif signum == signal.SIGHUP:
                self._reload()
            elif signum == signal.SIGUSR1:  # POST /health/check, or kill -USR1
                for worker in self._usr1_takers():
                    _signal(worker, signal.SIGUSR1)

    def _reload(self) -> None:
        try:
            new = self._fit_to_slurmd(config_mod.load(self.config_path))
            workers_for(self.role, new.supervisor, self.daemon_args, self.slurmd_notify, _spec_changes(new, self.role))
        except (ConfigError, ValueError) as err:
            self.emit("reload-failed", f"SIGHUP: config not reloaded, keeping the running one: {err}",
                      severity="error")
            return
        self.emit("reload", f"SIGHUP: config reloaded from {new.source or 'defaults'}")
        old = self.config
        self._apply_config(new)
        for live in self.live_plugins:
            live.reloaded(old, new)
        for worker in self.workers:
            if worker.spec.reload_signal and worker.state == WorkerState.RUNNING:
                _signal(worker, getattr(signal, f"SIG{worker.spec.reload_signal}"))
        self.liaison.ready_interval = new.supervisor.ready_interval
        self.liaison.watch_node = any(w.spec.ready == "slurm-node" for w in self.workers)
        self.liaison.owner.runs_slurmd = self.liaison.watch_node
        self.liaison.poke()

    def _reap(self) -> None:
        """Reap every exited child of this thread: workers, and orphans the kernel re-parented here.

        Children of the other threads (a start step's scripts and slurmd -G,
        the Slurm thread's scontrol) are not looked at (__WNOTHREAD): the
        thread that started one waits for it and gets its exit status.
        """
        while (pid := _exited_child()) is not None:
            worker = self.by_pid.pop(pid, None)
            if worker is not None and worker.state == WorkerState.STOPPING:
                # before the reap: while the leader is a zombie no new process can get its session id
                _kill_leftovers(worker)
            status = _reap_pid(pid)
            if status is None:  # waited for by someone else after all: a bug elsewhere, not worth dying of
                log.error("pid %d was reaped by another waiter of this process; its exit status is lost", pid)
                if worker is not None:
                    self._on_exit(worker, None)
                continue
            if worker is not None:
                self._on_exit(worker, status)
            else:
                self.orphans_reaped += 1

    def _tick(self, now: float) -> None:
        if not self.pipeline_done and not self.stopping and now >= self._next_pipeline:
            self._next_pipeline = _NEVER  # until they are done: _pipeline_done takes their result
            self._run_steps(pipeline.steps_for(self.role))
        for worker in list(self.workers):
            if worker.state == WorkerState.BACKOFF and not self.stopping and self.pipeline_done \
                    and now >= worker.life.next_start:
                self._start(worker)
            elif worker.state == WorkerState.STOPPING and now >= worker.stop_deadline:
                self._kill(worker)
            elif worker.awaiting_after and not self.stopping and self._after_ready(worker):
                worker.awaiting_after = False
                self._start(worker)
            elif worker.state == WorkerState.RUNNING:
                if not worker.life.ready and worker.spec.ready != "running" and self.worker_ready(worker):
                    worker.life.on_ready()
                if isinstance(over := worker.life.tick(now), CrashLoopOver):
                    self._crash_loop_over(worker, over)
        if self.stopping:
            self._advance_stop()

    # -- starting ----------------------------------------------------------------

    def _pipeline_done(self, ok: bool) -> None:
        if ok:
            self.pipeline_done = True
            for worker in self.workers:
                if worker.state == WorkerState.STOPPED:
                    self._start(worker)
            return
        self._pipeline_failures += 1
        s = self.config.supervisor
        self._next_pipeline = time.monotonic() + backoff_delay(self._pipeline_failures,
                                                               max(s.backoff_initial, 1.0), s.backoff_max)

    def _run_steps(self, steps: list[pipeline.StartStep], worker: Worker | None = None) -> None:
        """Run `steps` on the step thread, for `worker`'s restart (None: the role's start)."""
        context = pipeline.StepContext(self.role, self.config, self.node, self.emit, self.liaison,
                                       configless=bool(self.layout and self.layout.configless),
                                       workers=tuple(w.spec.name for w in self.workers if not w.removed),
                                       gpus_found=self._gpus_found)
        self._steps.start(steps, context, Path(self.config.supervisor.runtime_dir), boot_id(self.config.node.boot_id_file), worker)

    def _abandon_steps(self) -> None:
        """Stopped while start steps run: kill what they started (each in its own session), so that
        no node-boot script outlives the agent, and give the step a moment to record it."""
        killed = [pid for child in self._steps.children() for pid in kill_session(child, signal.SIGKILL)]
        self.emit("start-steps-abandoned", f"stopped while start steps ran ({self._steps.running}); killed "
                  f"{len(killed)} process(es) they had started: {' '.join(map(str, killed)) or 'none'}",
                  severity="warning")
        self._steps.wait(_ABANDON_WAIT)

    def _on_steps_done(self) -> None:
        """The step thread finished a batch: start the workers it was for, or back off."""
        done = self._steps.result()
        if done is None:
            return
        worker, ok = done
        if worker is None:
            if not self.stopping:
                self._pipeline_done(ok)
        else:
            self._restart_steps_done(worker, ok)
        while self._steps_queue and not self._steps.busy:
            waiting = self._steps_queue.pop(0)
            if self.stopping or waiting.state != WorkerState.BACKOFF:
                waiting.awaiting_steps = False  # stopped while it waited
                continue
            self._run_steps(_restart_steps(self.role, waiting), waiting)

    def _restart_steps_done(self, worker: Worker, ok: bool) -> None:
        worker.awaiting_steps = False
        if self.stopping or worker not in self.workers or worker.state != WorkerState.BACKOFF:
            return  # stopped or removed meanwhile
        if ok:
            self._spawn(worker)
        else:
            decision = worker.life.on_steps_failed(time.monotonic())
            _log_state(worker, WorkerState.BACKOFF, f"a start step before its restart failed; next try in "
                       f"{decision.delay:.3g}s (not counted as an exit of {worker.spec.name})")

    def _gpus_found(self, gres: str) -> None:
        """From the step thread: NVML's answer, for the next slurmd start (read by the loop after the step)."""
        self.gpus = gres

    def _start(self, worker: Worker) -> None:
        """Start `worker`, after its restart steps (on the step thread) when it ran before."""
        if self.stopping or not self.pipeline_done or worker.awaiting_steps:
            return
        if worker.pending_spec is not None:
            worker.spec, worker.pending_spec = worker.pending_spec, None
        if not self._after_ready(worker):
            if not worker.awaiting_after:
                log.info("worker %s: waits for %s to be ready", worker.spec.name, ", ".join(worker.spec.after))
            worker.awaiting_after = True
            worker.life.next_start = _NEVER  # started by _tick once they are
            return
        steps = _restart_steps(self.role, worker) if worker.started else []
        if not steps:
            self._spawn(worker)
            return
        worker.awaiting_steps = True
        worker.life.next_start = _NEVER  # started by _restart_steps_done
        if worker.state != WorkerState.BACKOFF:
            _set_state(worker, WorkerState.BACKOFF, "start steps run before its restart")
        if self._steps.busy:
            self._steps_queue.append(worker)
        else:
            self._run_steps(steps, worker)

    def _after_ready(self, worker: Worker) -> bool:
        """The workers `worker` starts after are all ready."""
        return all(self.worker_ready(w) for w in self.workers if w.spec.name in worker.spec.after)

    def _spawn(self, worker: Worker) -> None:
        spec = worker.spec
        env = {**self.base_env, **spec.environment}
        if spec.notify:
            if worker.notify is None:
                worker.notify = NotifySocket(Path(self.config.supervisor.runtime_dir)
                                             / f"notify-{self.role}-{spec.name}.sock", _uid(spec.notify_user))
                self._selector.register(worker.notify, selectors.EVENT_READ,
                                        functools.partial(self._on_notify, worker))
            env["NOTIFY_SOCKET"] = str(worker.notify.path)
        argv = spec.command
        if spec.name == slurmd_args.WORKER and self.gpus is not None:  # a dynamic node's Gres= in --conf
            argv = slurmd_args.with_gpus(argv, self.gpus)
        program = shutil.which(argv[0], path=env.get("PATH", os.defpath))
        try:
            if program is None:
                raise FileNotFoundError(f"{argv[0]}: not found in PATH ({env.get('PATH', os.defpath)})")
            pid = os.posix_spawn(program, list(argv), env, setsid=True)
        except OSError as err:
            old = worker.state
            self._back_off(worker, worker.life.on_start_failed(time.monotonic()), f"cannot start: {err}", old)
            return
        old = worker.state
        worker.life.on_start(time.monotonic())
        _log_state(worker, old, f"started pid {pid}: {' '.join(argv)}")
        worker.pid = worker.session = pid
        worker.notified_ready = worker.announced_stop = False
        self.by_pid[pid] = worker
        # our unreaped child: its pid cannot be reused before this pidfd refers to it
        self._watch(worker, _pidfd_open(pid, f"worker {spec.name}"))
        if spec.ready == "slurm-node":
            self.liaison.slurmd_started()

    def _watch(self, worker: Worker, pidfd: int | None) -> None:
        """Hold `pidfd` for the worker's main process; the loop hears of its exit through it."""
        worker.pidfd = pidfd
        if pidfd is not None:
            self._selector.register(pidfd, selectors.EVENT_READ, functools.partial(self._on_pidfd, worker, pidfd))

    def _unwatch(self, worker: Worker) -> None:
        if worker.pidfd is not None:
            self._selector.unregister(worker.pidfd)
            os.close(worker.pidfd)
            worker.pidfd = None

    def _on_pidfd(self, worker: Worker, pidfd: int) -> None:
        """The worker's main process has exited. Our child: the reap says how. A MAINPID that was
        not yet re-parented to us: its parent reaps it, so how it ended is not ours to know."""
        if worker.pidfd != pidfd or not _pidfd_exited(pidfd):
            return  # closed and reused earlier in this pass
        pid = worker.pid
        self._reap()
        if worker.pidfd != pidfd or worker.pid != pid:
            return  # reaped, and maybe started again (restart_after_stop) on a pidfd of the same number
        if worker.state == WorkerState.STOPPING:
            _kill_leftovers(worker)
        self.by_pid.pop(worker.pid, None)
        self._on_exit(worker, None)

    # -- exits ---------------------------------------------------------------------

    def _on_exit(self, worker: Worker, status: int | None) -> None:
        """The worker's main process is gone; `status` is its wait status, None when unknown.

        A STOPPING worker's session has been killed already, by the caller."""
        how, exit_fields = _how_it_ended(status, worker.pid)
        code = exit_fields["exit_code"]
        pid, worker.last_exit, worker.pid = worker.pid, how, None
        self._unwatch(worker)
        now = time.monotonic()
        # every exit is an event: how it ended, after how long, what comes next
        exited = functools.partial(self.emit, "worker-exited", worker=worker.spec.name, pid=pid,
                                   uptime=round(now - worker.started, 3), **exit_fields)
        said = f"worker {worker.spec.name} (pid {pid}) {how} after {now - worker.started:.3g}s"
        if worker.state == WorkerState.STOPPING or self.stopping:
            _set_state(worker, WorkerState.STOPPED, f"stopped ({how})")
            exited(f"{said}; it was asked to stop", severity="info", restarts=worker.restarts)
            if worker.restart_after_stop and not self.stopping:
                worker.restart_after_stop = False
                self._start(worker)
            elif worker.removed and not self.stopping:
                self._forget(worker)
            return
        decision = worker.life.on_exit(now, code, worker.announced_stop)
        if isinstance(decision, GiveUp):
            _log_state(worker, WorkerState.RUNNING, f"exited ({how}); {decision.why}")
            exited(f"{said}; {decision.why}", restarts=worker.restarts)
            return
        exited(f"{said}; starting it again in {decision.delay:.3g}s", restarts=worker.restarts,
               delay=decision.delay, was_ready=decision.was_ready)
        what = f"exited ({how}) after STOPPING=1" if worker.announced_stop else f"died ({how})"
        self._back_off(worker, decision, what, old=WorkerState.RUNNING)

    def _back_off(self, worker: Worker, decision: Restart, what: str, old: WorkerState | None = None) -> None:
        """Log the restart the worker's life decided on; a crash loop it began is an event and maybe a drain."""
        s = self.config.supervisor
        _log_state(worker, old or WorkerState.BACKOFF, f"{what}; restart {worker.restarts} in {decision.delay:.3g}s")
        if not decision.crash_loop_began:
            return
        self.emit("crash-loop", f"worker {worker.spec.name} is crash-looping: {decision.exits_in_window} exits "
                  f"within {s.crash_loop_window:g}s; "
                  + (f"restarted after {decision.delay:g}s each time, it gets ready" if decision.was_ready else
                     f"retrying every {s.backoff_max:g}s at most"),
                  severity="error", worker=worker.spec.name, last=what)
        if worker.spec.drain_on_crash_loop:
            self.liaison.want(worker.drain_owner, f"{worker.spec.name} crash loop: {decision.exits_in_window} exits "
                              f"in {s.crash_loop_window:g}s (last: {what})")

    def _crash_loop_over(self, worker: Worker, over: CrashLoopOver) -> None:
        self.emit("recovered", f"worker {worker.spec.name} has run for {over.ran:.3g}s: crash loop over",
                  worker=worker.spec.name)
        if worker.spec.drain_on_crash_loop:
            self.liaison.clear(worker.drain_owner)

    # -- notify ------------------------------------------------------------------

    def _on_notify(self, worker: Worker) -> None:
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
                self._follow_mainpid(worker, message.mainpid)
            if message.ready:
                worker.notified_ready = True
                log.info("notify %s: READY=1", name)
            if message.reloading:
                worker.notified_ready = False
                log.info("notify %s: RELOADING=1", name)
            if message.stopping:
                worker.announced_stop = True
                log.info("notify %s: STOPPING=1", name)
            if message.status is not None:
                worker.status_text = message.status

    def _follow_mainpid(self, worker: Worker, pid: int) -> None:
        """Take `pid` as the worker's main process, held by a pidfd opened before it is checked."""
        name = worker.spec.name
        if worker.state != WorkerState.RUNNING:
            log.warning("notify %s: MAINPID=%d while %s: ignored", name, pid, worker.state.value)
            return
        pidfd = _pidfd_open(pid, f"notify {name}: MAINPID")
        if pidfd is None:
            return
        # checked while the pidfd holds the process: alive after the check, the check was about it
        if not is_descendant(pid, os.getpid()) or not _pidfd_alive(pidfd):
            os.close(pidfd)
            log.warning("notify %s: MAINPID=%d is not a descendant of this agent: ignored", name, pid)
            return
        self.emit("mainpid", f"worker {name}: main process is now pid {pid} (was {worker.pid})",
                  worker=name, pid=pid)
        if worker.pid is not None:
            self.by_pid.pop(worker.pid, None)  # its exit is now a hand-over, not a death
        self._unwatch(worker)
        worker.pid = pid
        self.by_pid[pid] = worker
        self._watch(worker, pidfd)

    # -- stopping ----------------------------------------------------------------

    def _request_stop(self, worker: Worker) -> None:
        if worker.state == WorkerState.RUNNING and worker.pid:
            _set_state(worker, WorkerState.STOPPING, f"sending SIG{worker.spec.stop_signal} to pid "
                       f"{worker.pid}; SIGKILL after {worker.spec.stop_grace:g}s")
            now = time.monotonic()
            worker.stop_deadline = now + worker.spec.stop_grace
            worker.kill_hold = next((hold for live in self.live_plugins
                                     if (hold := live.stop_hold(worker.spec, worker.pid, now)) is not None), None)
            _signal(worker, worker.spec.signal)
        elif worker.state == WorkerState.BACKOFF:
            _set_state(worker, WorkerState.STOPPED, "stopped while waiting to restart")

    def _drain_before_stop(self, why: str) -> None:
        """Drain the node with our reason before slurmd stops (what Slinky's preStop does), so that no job
        lands on a node whose pod is going away; the next start of this node lifts it once its slurmd has
        registered (stale at start). Not when slurmd is not running: there is nothing to keep jobs from."""
        slurmd = [w for w in self.workers if w.spec.ready == "slurm-node" and w.state == WorkerState.RUNNING]
        if not slurmd or self.liaison is None:
            return
        ticket = self.liaison.want(STOP_DRAIN_OWNER, f"node agent stopping: {why}")
        self._stop_drain = (ticket, time.monotonic() + _STOP_DRAIN_WAIT)

    def _stop_waits_for_drain(self, worker: Worker) -> bool:
        """slurmd is kept running until Slurm shows the stop drain, for _STOP_DRAIN_WAIT at most."""
        if self._stop_drain is None or worker.spec.ready != "slurm-node":
            return False
        ticket, until = self._stop_drain
        if ticket.settled or time.monotonic() >= until:
            if not ticket.settled:
                self.emit("stop-drain-late", f"node {self.node}: Slurm did not show the stop drain within "
                          f"{_STOP_DRAIN_WAIT:g}s; stopping {worker.spec.name} anyway", severity="warning")
            self._stop_drain = None
            return False
        return True

    def _advance_stop(self) -> None:
        """Stop workers one at a time, last started first."""
        while self._stop_queue:
            current = self._stop_queue[0]
            if self._stop_waits_for_drain(current):
                return
            if current.state in (WorkerState.RUNNING, WorkerState.BACKOFF):
                self._request_stop(current)
            if current.state != WorkerState.STOPPED:
                return
            self._stop_queue.pop(0)

    def _kill(self, worker: Worker) -> None:
        if worker.kill_hold is not None and worker.pid and (until := worker.kill_hold(time.monotonic())) is not None:
            worker.stop_deadline = until  # a plug-in holds SIGKILL back (slurmctld saving accounting records)
            return
        if worker.pid:
            self.emit("kill", f"worker {worker.spec.name} (pid {worker.pid}) still running "
                      f"{worker.spec.stop_grace:g}s after SIG{worker.spec.stop_signal}: SIGKILL",
                      severity="warning", worker=worker.spec.name)
            _signal(worker, signal.SIGKILL)
            self.stop_clean = False
        worker.stop_deadline = _NEVER

    def _teardown(self) -> None:
        if self.liaison:
            self.liaison.stop()
        for live in self.live_plugins:
            live.close()
        if self.http:
            self.http.close()
        for worker in self.workers:
            if worker.notify:
                worker.notify.close()
            if worker.pidfd is not None:
                os.close(worker.pidfd)
                worker.pidfd = None
        self._steps.close()
        if self.pidfile:
            self.pidfile.unlink(missing_ok=True)
        signal.set_wakeup_fd(-1)

    # -- reporting -----------------------------------------------------------------

    def worker_ready(self, worker: Worker) -> bool:
        if worker.state != WorkerState.RUNNING:
            return False
        if worker.spec.ready == "notify":
            return worker.notified_ready
        if worker.spec.ready == "slurm-node":
            return self.liaison is not None and self.liaison.node_ok
        return True

    def ready(self) -> tuple[bool, str]:
        """Ready for work: every worker runs and meets its readiness condition."""
        if self.stopping:
            return False, "stopping"
        if not self.pipeline_done:
            return False, "start steps have not succeeded"
        for worker in self.workers:
            if worker.spec.gates_ready and not self.worker_ready(worker):
                if worker.awaiting_after:
                    return False, f"worker {worker.spec.name}: waits for {', '.join(worker.spec.after)}"
                why = worker.state.value if worker.state != WorkerState.RUNNING else (
                    "no READY=1 yet" if worker.spec.ready == "notify" else self.liaison.node_problem)
                return False, f"worker {worker.spec.name}: {why}"
        return True, "ready"

    def _usr1_takers(self) -> list[Worker]:
        """The running workers that take the agent's SIGUSR1 now, as their plug-ins say (the health monitor, once
        it has set its handler)."""
        now = time.monotonic()
        return [w for w in self.workers if w.state == WorkerState.RUNNING
                and any(live.takes_usr1(w.spec.name, now - w.started) for live in self.live_plugins)]

    def poll_health_now(self) -> bool:
        """From the HTTP thread: have the health monitor read the node now (the loop signals it, SIGUSR1, as
        for an operator's `kill -USR1` of the agent); False when no monitor runs, or it is still starting."""
        if not self._usr1_takers():
            return False
        _poke(self._wakeup_w, signal.SIGUSR1)
        return True

    def live(self, grace: float = 10.0) -> bool:
        """The loop is alive: it has not overslept the wake-up it planned."""
        return time.monotonic() < max(self._next_wake, self.heartbeat) + grace


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


def _exited_child() -> int | None:
    """The pid of an exited child of this thread, left unreaped (WNOWAIT); None when there is none."""
    try:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT | _WNOTHREAD)
    except ChildProcessError:
        return None
    return info.si_pid if info is not None and info.si_pid else None


def _reap_pid(pid: int) -> int | None:
    """Reap `pid`, a zombie child of this thread; returns its wait status (None: already reaped)."""
    try:
        _, status = os.waitpid(pid, _WNOTHREAD)
    except ChildProcessError:
        return None
    return status


def _pidfd_open(pid: int, what: str) -> int | None:
    """A pidfd of `pid`, or None (logged) when it is gone or no descriptor is left."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        log.warning("%s: pid %d has already exited", what, pid)
    except OSError as err:
        log.error("%s: cannot open a pidfd of pid %d: %s", what, pid, err.strerror)
    return None


def _pidfd_alive(pidfd: int) -> bool:
    """The pidfd's process still runs (not exited, not a zombie)."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    return not _pidfd_exited(pidfd)


def _pidfd_exited(pidfd: int) -> bool:
    """A pidfd is readable once its process has exited (a zombie counts)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def _policy(settings, spec: WorkerSpec) -> Policy:
    """A worker's restart policy from [supervisor] and its spec."""
    return Policy(restart=spec.restart, backoff_initial=settings.backoff_initial, backoff_max=settings.backoff_max,
                  stable_after=settings.stable_after, crash_loop_count=settings.crash_loop_count,
                  crash_loop_window=settings.crash_loop_window)


def _set_state(worker: Worker, new: WorkerState, why: str) -> None:
    old = worker.state
    worker.life.move(new)
    _log_state(worker, old, why)


def _log_state(worker: Worker, old: WorkerState, why: str) -> None:
    """One line per transition (the worker's life has made it already)."""
    new = worker.state
    level = logging.INFO if new in (WorkerState.RUNNING, WorkerState.STOPPED) else logging.WARNING
    log.log(level, "worker %s: %s -> %s: %s", worker.spec.name, old.value, new.value, why)


def _signal(worker: Worker, signum: int) -> None:
    """Signal the worker's main process through its pidfd: never whoever has its pid now."""
    try:
        if worker.pidfd is not None:
            signal.pidfd_send_signal(worker.pidfd, signum)
        elif worker.pid is not None:  # no pidfd (none was left): only our own unreaped child, never a
            os.kill(worker.pid, signum)  # MAINPID (followed only with a pidfd), so the pid is still it
    except ProcessLookupError:
        pass


def _kill_leftovers(worker: Worker) -> None:
    """After a stop, kill what the worker left in its own session (helpers it
    forked). slurmstepd and jobs run in sessions of their own: untouched."""
    for pid in kill_session(worker.session, signal.SIGKILL):
        log.warning("worker %s: pid %d of its session outlived it: SIGKILL", worker.spec.name, pid)


def _restart_steps(role: str, worker: Worker) -> list[pipeline.StartStep]:
    """The start steps that precede every restart of `worker` (gres.conf before slurmd)."""
    return [step for step in pipeline.steps_for(role) if step.before_restart_of == worker.spec.name]


def _make_cgroups_writable(emit) -> None:
    """A warning, not an error: with CgroupPlugin=disabled slurmd needs no cgroups (and says nothing of it)."""
    from .cgroup import CgroupError, make_writable
    try:
        make_writable()
    except (OSError, CgroupError) as err:
        emit("cgroup-failed", str(err), severity="warning")


def _leave_root_cgroup(emit) -> None:
    from .cgroup import leave_root_cgroup
    try:
        leaf = leave_root_cgroup()
    except (OSError, RuntimeError) as err:
        emit("cgroup-failed", str(err), severity="error")
    else:
        if leaf:
            emit("cgroup-leaf", f"moved out of the root cgroup into {leaf}")


def _uid(user: str) -> int | None:
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


def _spec_changes(config: Config, role: str) -> dict[str, dict]:
    """The plug-ins' changes of built-in workers for `config` and `role` (accounting's own database)."""
    return {name: change for plugin in plugins() for name, change in plugin.spec_changes(config, role).items()}


def _switched_off(config: Config, role: str) -> set[str]:
    """The plug-ins' workers the config switches off (health.enabled, repair.enabled, web.enabled)."""
    return {worker.spec.name for plugin in plugins() if not plugin.enabled(config, role) for worker in plugin.workers}


def _slurmd_speaks_notify(environ: dict[str, str]) -> bool:
    """Whether the slurmd in PATH has --systemd (`slurmd -V`: Slurm >= 23.11); False when there is none."""
    try:
        answer = command.run(["slurmd", "-V"], 10.0, env=environ, check=True)
    except CommandError:  # CommandTimeout is one too
        return False
    return speaks_notify(answer.stdout + answer.stderr)


def _poke(fd: int, signum: int = 0) -> None:
    """From another thread: make the loop look again now (a 0 byte in the signal pipe is no signal), or act as
    if `signum` had come."""
    try:
        os.write(fd, bytes([signum]))
    except OSError:
        pass  # full: the loop wakes anyway


def _how_it_ended(status: int | None, pid: int | None) -> tuple[str, dict]:
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
