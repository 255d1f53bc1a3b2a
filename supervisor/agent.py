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
so. The agent's own state (agentstate.AgentLife: starting, running,
stopping, stopped) is one enum with allowed transitions, each one journal
event.

A dead worker is restarted in place by this same process; nothing else is
killed with it: slurmd's job steps (slurmstepd) are not the agent's to kill,
so jobs survive a slurmd crash. When to restart, and whether it crash-loops,
is each worker's `lifecycle.Life` to decide; the processes (spawn, pidfd,
reap, sessions, notify) are `processes`, the reload `reload`, the stop
`stopping`, readiness `readiness`; what components add, their plug-ins
(`plugins`). A crash loop's drain is a want of the node-state owner, on the
Slurm thread.
"""

from __future__ import annotations

import functools
import logging
import os
import selectors
import signal
import time
from pathlib import Path

from slurm_ext import config as config_mod, credentials, events, fileio
from slurm_ext.config import Config
from slurm_ext.errors import ConfigError, SlurmExtError
from slurm_ext.procfs import boot_id
from slurm_ext.slurm import SlurmClient

from . import pipeline, readiness, slurmd_args
from .agentstate import AgentLife, AgentState
from .crashloop import crash_loop_over, restart_planned
from .liaison import SlurmLiaison
from .lifecycle import CrashLoopOver, GiveUp
from .notify import SystemdLink
from .plugins import plugins
from .processes import (NEVER, Worker, become_reaper, close_channels, how_it_ended, kill_session, poke, reap,
                        send_signal, session_members, set_state, spawn, state_changed, unwatch)
from .readiness import after_ready, worker_ready
from .reload import apply_config, fit_to_slurmd, forget, reload
from .states import WorkerState
from .stopping import abandon_steps, advance_stop, drain_before_stop, kill
from .workers import slurmd_speaks_notify

__all__ = ["Agent", "Worker", "session_members", "kill_session"]

log = logging.getLogger("supervisor")

_HANDLED = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
#: longest sleep of an idle loop: signals and notify messages wake it at once
_IDLE_WAKEUP = 30.0


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
        #: what slurmd's command line says (worker role): its node name, dynamic, configless (fit_to_slurmd)
        self.layout: slurmd_args.SlurmdLayout | None = None
        #: the installed slurmd has --systemd: the built-in slurmd runs on a NOTIFY_SOCKET
        self.slurmd_notify = slurmd_args.runs_slurmd(role) and slurmd_speaks_notify(environ)
        #: the node's gpu GRES from the last NVML read, for a dynamic slurmd's --conf (None: not read)
        self.gpus: str | None = None
        self.workers: list[Worker] = []
        self.by_pid: dict[int, Worker] = {}
        self.orphans_reaped = 0
        self.heartbeat = self.next_wake = time.monotonic()
        s = config.supervisor
        #: the agent's own state: starting, running, stopping, stopped (agentstate)
        self.life = AgentLife(s.backoff_initial, s.backoff_max)
        #: workers still to stop, last started first
        self.stop_queue: list[Worker] = []
        self.steps = pipeline.StepRunner()
        #: workers whose start steps wait for the runner
        self.steps_queue: list[Worker] = []
        self.selector = selectors.DefaultSelector()
        self._wakeup_r = self._wakeup_w = -1
        self.liaison: SlurmLiaison | None = None
        self.http = None
        self._systemd: SystemdLink | None = None
        #: the Slurm client of the agent's own thread (the liaison's), for the plug-ins' watches
        self.slurm: SlurmClient | None = None
        #: the plug-ins' live parts (slurm_ext.plugin.Live): watches, metrics, stop holds, config reactions
        self.live_plugins: list = []
        apply_config(self, fit_to_slurmd(self, config), first=True)
        self.node = self.config.node.slurm_name

    # -- set-up -------------------------------------------------------------------

    def _setup_process(self) -> None:
        # Workers inherit the cwd: the directory someone started the agent from may be theirs to
        # write, and `python -m` (the hook service) imports from it. / is root's, like any daemon's.
        os.chdir("/")
        self._wakeup_r, self._wakeup_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self._wakeup_w, warn_on_full_buffer=False)
        for signum in _HANDLED:
            signal.signal(signum, lambda *_: None)  # the wakeup fd carries the signal to the loop
        self.selector.register(self._wakeup_r, selectors.EVENT_READ, self._read_signals)
        self.selector.register(self.steps, selectors.EVENT_READ, self._on_steps_done)
        become_reaper(self)
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
                                    Path(self.config.node.runtime_dir), s.stale_drain_reasons,
                                    on_change=functools.partial(poke, self._wakeup_w),
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
                      f"{', '.join(w.spec.name for w in self.workers) or 'no workers'}", state=self.life.state.value)
            while not (self.life.stopping and not self.stop_queue
                       and all(w.state == WorkerState.STOPPED for w in self.workers)):
                self._pass()
            if self.steps.busy:
                abandon_steps(self)
        finally:
            self._teardown()
        clean = self.life.clean
        self.life.move(AgentState.STOPPED)  # each transition of the agent's state is one event
        self.emit("exited", "all workers stopped" + ("" if clean else "; some needed SIGKILL"),
                  severity="info" if clean else "warning", state=self.life.state.value)
        return 0 if clean else 1

    def _pass(self) -> None:
        now = time.monotonic()
        for key, _ in self.selector.select(self._timeout(now)):
            key.data()  # the handler registered with the descriptor
        reap(self)
        self._tick(time.monotonic())
        self.heartbeat = time.monotonic()
        if self._systemd:
            ready, why = self.ready()
            self._systemd.tick(time.monotonic(), ready, f"{self.role}: {why}")

    def _timeout(self, now: float) -> float:
        deadlines = [d for w in self.workers if (d := w.life.deadline()) is not None]
        deadlines += [w.stop_deadline for w in self.workers if w.state == WorkerState.STOPPING]
        deadlines += [d for w in self.workers if w.events and (d := w.events.deadline()) is not None]
        if (own := self.life.deadline(now)) is not None:
            deadlines.append(own)
        if self._systemd:
            deadlines.append(self._systemd.next_send())
        wake = self.next_wake = min([now + _IDLE_WAKEUP, *deadlines])
        return max(0.0, wake - now)

    def _read_signals(self) -> None:
        try:
            data = os.read(self._wakeup_r, 4096)
        except BlockingIOError:
            return
        for signum in set(data):
            if signum in (signal.SIGTERM, signal.SIGINT) and not self.life.stopping:
                name = signal.Signals(signum).name
                self.life.move(AgentState.STOPPING)
                self.emit("stop", f"{name}: stopping every worker in reverse start order", state=self.life.state.value)
                self.stop_queue = list(reversed(self.workers))
                drain_before_stop(self, name)
            elif signum == signal.SIGHUP:
                reload(self)
            elif signum == signal.SIGUSR1:  # POST /health/check, or kill -USR1
                for worker in readiness.workers_taking_usr1(self):
                    send_signal(worker, signal.SIGUSR1)

    def _tick(self, now: float) -> None:
        if self.life.steps_due(now):
            self._run_steps(pipeline.steps_for(self.role))
        for worker in list(self.workers):
            if worker.events:
                worker.events.tick(now)
            if worker.state == WorkerState.BACKOFF and self.life.started and now >= worker.life.next_start:
                self.start(worker)
            elif worker.state == WorkerState.STOPPING and now >= worker.stop_deadline:
                kill(self, worker)
            elif worker.life.awaiting_after and not self.life.stopping and after_ready(self, worker):
                worker.life.awaiting_after = False
                self.start(worker)
            elif worker.state == WorkerState.RUNNING:
                if not worker.life.ready and worker.spec.ready != "running" and worker_ready(self, worker):
                    worker.life.on_ready()
                    self.emit("worker-ready", f"worker {worker.spec.name} is ready ({worker.spec.ready})",
                              worker=worker.spec.name, ready=worker.spec.ready)
                if isinstance(over := worker.life.tick(now), CrashLoopOver):
                    crash_loop_over(self, worker, over)
        if self.life.stopping:
            advance_stop(self)

    # -- starting ----------------------------------------------------------------

    def _steps_done(self, ok: bool) -> None:
        if self.life.steps_done(ok, time.monotonic()):
            self.emit("running", f"start steps done: starting the workers of role {self.role}",
                      state=self.life.state.value)
            for worker in self.workers:
                if worker.state == WorkerState.STOPPED:
                    self.start(worker)

    def _run_steps(self, steps: list[pipeline.StartStep], worker: Worker | None = None) -> None:
        """Run `steps` on the step thread, for `worker`'s restart (None: the role's start)."""
        context = pipeline.StepContext(self.role, self.config, self.node, self.emit, self.liaison,
                                       configless=bool(self.layout and self.layout.configless),
                                       workers=tuple(w.spec.name for w in self.workers if not w.removed),
                                       gpus_found=self._gpus_found)
        self.steps.start(steps, context, Path(self.config.node.runtime_dir),
                         boot_id(self.config.node.boot_id_file), worker)

    def _on_steps_done(self) -> None:
        """The step thread finished a batch: start the workers it was for, or back off."""
        done = self.steps.result()
        if done is None:
            return
        worker, ok = done
        if worker is None:
            self._steps_done(ok)
        else:
            self._restart_steps_done(worker, ok)
        while self.steps_queue and not self.steps.busy:
            waiting = self.steps_queue.pop(0)
            if self.life.stopping or waiting.state != WorkerState.BACKOFF:
                waiting.life.awaiting_steps = False  # stopped while it waited
                continue
            self._run_steps(_restart_steps(self.role, waiting), waiting)

    def _restart_steps_done(self, worker: Worker, ok: bool) -> None:
        worker.life.awaiting_steps = False
        if self.life.stopping or worker not in self.workers or worker.state != WorkerState.BACKOFF:
            return  # stopped or removed meanwhile
        if ok:
            self._spawn(worker)
        else:
            decision = worker.life.on_steps_failed(time.monotonic())
            state_changed(self.emit, worker, WorkerState.BACKOFF, f"a start step before its restart failed; next "
                          f"try in {decision.delay:.3g}s (not counted as an exit of {worker.spec.name})",
                          delay=decision.delay)

    def _gpus_found(self, gres: str) -> None:
        """From the step thread: NVML's answer, for the next slurmd start (read by the loop after the step)."""
        self.gpus = gres

    def start(self, worker: Worker) -> None:
        """Start `worker`, after its restart steps (on the step thread) when it ran before."""
        if not self.life.started or worker.life.awaiting_steps:
            return
        if worker.pending_spec is not None:
            worker.spec, worker.pending_spec = worker.pending_spec, None
        if not after_ready(self, worker):
            if not worker.life.awaiting_after:
                log.info("worker %s: waits for %s to be ready", worker.spec.name, ", ".join(worker.spec.after))
            worker.life.awaiting_after = True
            worker.life.next_start = NEVER  # started by _tick once they are
            return
        steps = _restart_steps(self.role, worker) if worker.started else []
        if not steps:
            self._spawn(worker)
            return
        worker.life.awaiting_steps = True
        worker.life.next_start = NEVER  # started by _restart_steps_done
        if worker.state != WorkerState.BACKOFF:
            set_state(self.emit, worker, WorkerState.BACKOFF, "start steps run before its restart")
        if self.steps.busy:
            self.steps_queue.append(worker)
        else:
            self._run_steps(steps, worker)

    def _spawn(self, worker: Worker) -> None:
        try:
            pid, argv = spawn(self, worker)
        except (OSError, SlurmExtError) as err:
            old = worker.state
            restart_planned(self, worker, worker.life.on_start_failed(time.monotonic()), f"cannot start: {err}", old)
            return
        old = worker.state
        worker.life.on_start(time.monotonic())
        state_changed(self.emit, worker, old, f"started pid {pid}: {' '.join(argv)}", pid=pid)
        if worker.spec.ready == "slurm-node":
            self.liaison.slurmd_started()

    # -- exits ---------------------------------------------------------------------

    def on_exit(self, worker: Worker, status: int | None) -> None:
        """The worker's main process is gone; `status` is its wait status, None when unknown.

        A STOPPING worker's session has been killed already, by the caller."""
        how, exit_fields = how_it_ended(status, worker.pid)
        code = exit_fields["exit_code"]
        pid, worker.pid = worker.pid, None
        unwatch(self, worker)
        now = time.monotonic()
        # every exit is an event: how it ended, after how long, what comes next
        exited = functools.partial(self.emit, "worker-exited", worker=worker.spec.name, pid=pid,
                                   uptime=round(now - worker.started, 3), **exit_fields)
        said = f"worker {worker.spec.name} (pid {pid}) {how} after {now - worker.started:.3g}s"
        if worker.state == WorkerState.STOPPING or self.life.stopping:
            set_state(self.emit, worker, WorkerState.STOPPED, f"stopped ({how})")
            exited(f"{said}; it was asked to stop", severity="info", restarts=worker.restarts)
            if worker.restart_after_stop and not self.life.stopping:
                worker.restart_after_stop = False
                self.start(worker)
            elif worker.removed and not self.life.stopping:
                forget(self, worker)
            return
        decision = worker.life.on_exit(now, code, worker.announced_stop)
        if isinstance(decision, GiveUp):
            state_changed(self.emit, worker, WorkerState.RUNNING, f"exited ({how}); {decision.why}")
            exited(f"{said}; {decision.why}", restarts=worker.restarts)
            return
        exited(f"{said}; starting it again in {decision.delay:.3g}s", restarts=worker.restarts,
               delay=decision.delay, was_ready=decision.was_ready)
        what = f"exited ({how}) after STOPPING=1" if worker.announced_stop else f"died ({how})"
        restart_planned(self, worker, decision, what, old=WorkerState.RUNNING)

    def _teardown(self) -> None:
        if self.liaison:
            self.liaison.stop()
        for live in self.live_plugins:
            live.close()
        if self.http:
            self.http.close()
        for worker in self.workers:
            close_channels(self, worker)
            unwatch(self, worker)
        self.steps.close()
        # the copies of root's secrets made for its workers
        credentials.remove_all(self.config.node.runtime_dir, [w.spec.name for w in self.workers])
        if self.pidfile:
            self.pidfile.unlink(missing_ok=True)
        signal.set_wakeup_fd(-1)

    # -- reporting (also read by the HTTP thread) --------------------------------------

    def ready(self) -> tuple[bool, str]:
        return readiness.ready(self)

    def live(self, grace: float = 10.0) -> bool:
        return readiness.live(self, grace)

    def poll_health_now(self) -> bool:
        """From the HTTP thread: have the health monitor read the node now (the loop signals it, SIGUSR1, as
        for an operator's `kill -USR1` of the agent); False when no monitor runs, or it is still starting."""
        if not readiness.workers_taking_usr1(self):
            return False
        poke(self._wakeup_w, signal.SIGUSR1)
        return True


def _restart_steps(role: str, worker: Worker) -> list[pipeline.StartStep]:
    """The start steps that precede every restart of `worker` (gres.conf before slurmd)."""
    return [step for step in pipeline.steps_for(role) if step.before_restart_of == worker.spec.name]
