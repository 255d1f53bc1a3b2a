"""The start pipeline: named steps that run before the workers start.

The agent has two steps of its own; the components give theirs through their
plug-ins (slurm_ext.plugin: GRES regeneration, the storage guard, node-boot
scripts); the agent runs the steps in order before it starts the workers. A step signals
failure by raising; the failure is an event, and then, per step (config
`supervisor.step_failure`, else the step's own default), the start either
blocks (retried with backoff) or continues. Steps marked `once_per_boot` run
once per kernel boot: a marker in the runtime dir holds the boot id.

The agent runs the steps on a `StepRunner` thread, never on its loop: a
step may take minutes (slurmd -G, NVML, scontrol, node-boot scripts) and the
loop must keep reaping orphans and answering /livez meanwhile.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from slurm_ext import fileio
from slurm_ext.plugin import StartStep, StepContext

from .plugins import plugins

__all__ = ["StepContext", "StartStep", "StepRunner", "steps_for", "run_steps"]

log = logging.getLogger("supervisor")


def clear_stale_drains(context: StepContext) -> None:
    """Have the node-state owner read the node before slurmd starts.

    Its first read takes over what a previous run of this node left: a
    stale drain of ours (a crash loop of a slurmd now gone) is lifted once
    the new slurmd has registered (Slurm refuses it before), by the owner;
    other reasons of ours stay with their owners. This step fails when
    Slurm does not answer, so `step_failure` can make that block the start,
    except on a configless node, which cannot ask Slurm before its slurmd
    has fetched the config.
    """
    timeout = context.config.slurm.timeout + 1.0
    ticket = context.node_state.look()
    outcome = ticket.wait(timeout)
    if outcome is not None and ticket.ok:
        return
    if context.configless:  # no config before slurmd has fetched one: the owner's first read comes after
        log.info("node %s: Slurm cannot be asked before slurmd has fetched the config (configless); stale "
                 "drains of ours are lifted once it has registered", context.node)
        return
    if outcome is None:
        raise RuntimeError(f"node {context.node}: Slurm did not answer within {timeout:g}s")
    raise RuntimeError(f"node {context.node}: cannot read its state: {ticket.outcome}")


def preflight(context: StepContext) -> None:
    """Say what the role's Slurm daemon lacks to authenticate (preflight.problems): an event each, no block;
    but refuse a guessable slurm.key (preflight.key_refusal): the step fails and blocks the start until the
    key is replaced. Not for a role whose daemon the config took out (the mariadb image's accounting role)."""
    from .preflight import key_refusal, problems
    from .workers import ROLE_DAEMON
    daemon = ROLE_DAEMON[context.role]
    if daemon not in context.workers:
        return
    munged_here = "munged" in context.workers
    for problem in problems(daemon=daemon, munged_here=munged_here):
        context.emit("preflight-problem", problem, severity="warning")
    refused = key_refusal(daemon=daemon, munged_here=munged_here)
    if refused:
        raise RuntimeError(refused)


def steps_for(role: str) -> list[StartStep]:
    """The steps `role` runs before its workers, in order: the agent's own (what the role's daemon lacks to
    authenticate; the worker's stale drains), then each plug-in's, in plugins.PLUGINS' order (accounting's
    storage guard, gres.conf from NVML, the lifecycle scripts).

    A step with `before_restart_of` also runs before every restart of that worker (gres.conf before slurmd).
    """
    # preflight blocks only when it raises: a guessable slurm.key (its missing key is a warning)
    daemon_roles = ("worker", "controller", "accounting")
    steps = [StartStep("preflight", preflight, on_failure="block")] if role in daemon_roles else []
    if role == "worker":
        steps.append(StartStep("clear-stale-drains", clear_stale_drains))
    for plugin in plugins():
        steps += plugin.steps(role)
    return steps


def run_steps(steps: list[StartStep], context: StepContext, marker_dir: Path, boot: str) -> bool:
    """Run the steps; False when a failed step blocks the start."""
    for step in steps:
        marker = marker_dir / f"boot-step-{step.name}"
        if step.once_per_boot and _read(marker) == boot:
            continue
        try:
            step.run(context)
        except Exception as err:  # a step of another component must not take the agent down
            policy = context.config.supervisor.step_failure.get(step.name, step.on_failure)
            context.emit("start-step-failed", f"start step {step.name} failed: {err}; "
                         + ("workers are not started until it succeeds" if policy == "block" else "continuing"),
                         severity="error", step=step.name, policy=policy)
            if policy == "block":
                return False
            continue
        if step.once_per_boot:
            marker_dir.mkdir(parents=True, exist_ok=True)
            fileio.atomic_write(marker, boot + "\n", mode=0o600, fsync="file")
    return True


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


class StepRunner:
    """Runs one batch of start steps at a time on a thread of its own.

    The agent's loop selects on `fileno()`, which turns readable when a batch
    is done; `result()` then gives (what it was for, whether it succeeded).
    A step's children (scripts, slurmd -G) are this thread's own: the agent
    reaps only its own thread's children (__WNOTHREAD), so a step always gets
    its children's exit status.
    """

    def __init__(self):
        self._read_end, self._write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread: threading.Thread | None = None
        self._done: tuple[object, bool] | None = None
        self._closed = False
        self._lock = threading.Lock()  # close() against the thread's last write
        self._native_id: int | None = None
        #: the names of the steps of the batch that runs now, for messages
        self.running = ""

    def fileno(self) -> int:
        return self._read_end

    @property
    def busy(self) -> bool:
        return self._thread is not None

    def start(self, steps: list[StartStep], context: StepContext, marker_dir: Path, boot: str,
              purpose: object = None) -> None:
        """Run `steps` (run_steps) on the thread; `purpose` comes back with the result.

        Raises:
            RuntimeError: a batch is still running (the caller queues instead).
        """
        if self.busy:
            raise RuntimeError(f"start steps {self.running} still run: one batch at a time")
        self.running = ", ".join(step.name for step in steps)
        self._native_id = None  # set by the new thread
        self._thread = threading.Thread(target=self._run, args=(steps, context, marker_dir, boot, purpose),
                                        name="start-steps", daemon=True)
        self._thread.start()

    def _run(self, steps: list[StartStep], context: StepContext, marker_dir: Path, boot: str,
             purpose: object) -> None:
        self._native_id = threading.get_native_id()
        try:
            ok = run_steps(steps, context, marker_dir, boot)
        except BaseException:  # run_steps contains each step's failure; this is a bug of ours
            log.exception("start steps %s: unexpected error; counted as a failure", self.running)
            ok = False
        with self._lock:
            self._done = (purpose, ok)
            if not self._closed:
                os.write(self._write_end, b"x")

    def result(self) -> tuple[object, bool] | None:
        """(purpose, ok) of the batch that has finished, or None while it runs."""
        try:
            os.read(self._read_end, 64)
        except BlockingIOError:
            pass
        if self._done is None:
            return None
        self._thread.join()
        done, self._done, self._thread, self.running = self._done, None, None, ""
        return done

    def children(self) -> list[int]:
        """The processes the running batch has started and not yet waited for (scripts, slurmd -G)."""
        if not self.busy or self._native_id is None:
            return []
        try:
            return [int(pid) for pid in Path(f"/proc/self/task/{self._native_id}/children").read_text().split()]
        except OSError:  # the thread has just ended
            return []

    def wait(self, timeout: float) -> None:
        """Let the running batch finish for up to `timeout` seconds."""
        if self._thread is not None:
            self._thread.join(timeout)

    def close(self) -> None:
        """Close the pipe; a batch still running is abandoned (its thread ends with the process)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._read_end)
                os.close(self._write_end)
