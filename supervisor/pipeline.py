"""The start pipeline: named steps that run before the workers start.

Other components plug in a `StartStep` (GRES regeneration, node-boot scripts);
the agent runs the steps in order before it starts slurmd. A step signals
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from slurm_ext import events, fileio, gres, prolog_epilog
from slurm_ext.config import Config

__all__ = ["StepContext", "StartStep", "StepRunner", "steps_for", "run_steps"]

log = logging.getLogger("supervisor")


@dataclass(frozen=True)
class StepContext:
    role: str
    config: Config
    node: str
    #: emit(event, message, severity="info", **fields): record a node event
    emit: Callable[..., dict]
    #: the node-state owner (the agent's Slurm thread): want(owner, reason), clear(owner), look() -> Ticket
    node_state: Any = None
    #: slurmd gets its config from slurmctld (--conf-server)
    configless: bool = False
    #: told the node's gpu GRES ("gpu:h200:2", "" for none) once NVML has been read: a dynamic
    #: slurmd's --conf carries it
    gpus_found: Callable[[str], None] = lambda gres: None


@dataclass(frozen=True, slots=True)
class StartStep:
    name: str
    #: does the work; raises on failure (the message is the event's text)
    run: Callable[[StepContext], None]
    once_per_boot: bool = False
    #: block or continue, unless supervisor.step_failure names this step
    on_failure: str = "continue"
    #: also run before every restart of this worker (e.g. slurmd), not only at the agent's start
    before_restart_of: str | None = None


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


def validate_scripts(context: StepContext) -> None:
    """Check the role's lifecycle scripts now, so a bad one is reported at start, not at the first job."""
    top = prolog_epilog.scripts_dir(context.config) / context.role
    errors = [problem for phase in prolog_epilog.PHASES
              for problems in prolog_epilog.validate_dir(top / f"{phase}.d", shellcheck=False).values()
              for problem in problems if problem.severity == "error"]
    if errors:
        shown = "; ".join(map(str, errors[:5])) + (f"; and {len(errors) - 5} more" if len(errors) > 5 else "")
        raise ValueError(f"{len(errors)} problem(s) in lifecycle scripts, which the hooks will refuse to run "
                         f"(`slurm-ext scripts validate` lists them): {shown}")


def node_boot_scripts(context: StepContext) -> None:
    """Run <role>/node-boot.d/ once per boot, before the workers (each script's result is an event)."""
    outcome = prolog_epilog.run_scripts("node-boot", context.config, role=context.role)
    failed = [result.path for result in outcome.results if not result.ok]
    if failed:
        raise RuntimeError(f"node-boot script(s) failed: {', '.join(failed)} (see their events for output)")


def regenerate_gres(context: StepContext) -> None:
    """gres.conf from NVML, checked by slurmd -G, and the node's GPU drain made right (gres.regenerate)."""
    emit = events.emitter(context.config.node.state_dir, "gres", role=context.role)
    generation = gres.regenerate(context.config, context.node, emit, context.node_state, context.configless)
    if generation.inventory is not None:
        context.gpus_found(generation.gres)


def preflight(context: StepContext) -> None:
    """Say what the role's Slurm daemon lacks to authenticate (preflight.problems): an event each, never a
    block. Not for a role whose daemon the config took out (the mariadb image's accounting role)."""
    from .preflight import problems
    from .workers import ROLE_DAEMON, workers_for
    daemon = ROLE_DAEMON[context.role]
    running = {spec.name for spec in workers_for(context.role, context.config.supervisor)}
    if daemon not in running:
        return
    for problem in problems(daemon=daemon, munged_here="munged" in running):
        context.emit("preflight-problem", problem, severity="warning")


def accounting_config(context: StepContext) -> None:
    """slurmdbd.conf and, with accounting.run_database, MariaDB's files, from [accounting] and the password
    (`slurm-ext accounting config`): at every start, so a rotated password reaches both sides."""
    from slurm_ext import accounting
    if not accounting.configured(context.config):
        log.info("accounting: no database password given (accounting.password_file, $%s) and no database to "
                 "run: slurmdbd.conf is left as it is", accounting.PASSWORD_ENV)
        return
    from .workers import workers_for
    runs_slurmdbd = "slurmdbd" in {spec.name for spec in workers_for(context.role, context.config.supervisor)}
    written = accounting.write_config(context.config, slurmdbd=runs_slurmdbd)
    log.info("accounting: wrote %s", ", ".join(str(p) for p in (written.slurmdbd_conf, written.my_cnf) if p))


def check_storage(context: StepContext) -> None:
    """The durability guard before mariadbd or slurmctld (`slurm-ext accounting check-storage`): refuses
    ephemeral, read-only, full or replaced volumes; initialises a new database and marks its volume."""
    from slurm_ext import accounting
    verdict = accounting.prepare_storage(context.config, context.role)
    for note in verdict.notes:
        ephemeral = note.startswith(accounting.EPHEMERAL_NOTE)
        context.emit("storage-checked", note, severity="warning" if ephemeral else "info")


def steps_for(role: str) -> list[StartStep]:
    """The steps `role` runs before its workers, in order.

    gres.conf is regenerated before every slurmd start, restarts included: a
    GPU lost since the last start must not be registered. A failed node-boot
    script blocks the start (retried with backoff, all node-boot scripts
    again): a node whose boot set-up failed must not take jobs.
    `supervisor.step_failure = {node-boot-scripts = "continue"}` starts the
    workers anyway. The accounting and controller roles guard their storage
    first (check-storage blocks: a replaced volume must not be initialised
    over), the accounting role after writing slurmdbd's and MariaDB's files.
    """
    steps = [StartStep("preflight", preflight)] if role in ("worker", "controller", "accounting") else []
    if role == "accounting":
        steps.append(StartStep("accounting-config", accounting_config, on_failure="block"))
    if role in ("accounting", "controller"):  # also before the restart of what writes to the volume
        steps.append(StartStep("check-storage", check_storage, on_failure="block",
                               before_restart_of="mariadbd" if role == "accounting" else "slurmctld"))
    if role == "worker":
        steps.append(StartStep("clear-stale-drains", clear_stale_drains))
        steps.append(StartStep("gres-regenerate", regenerate_gres, on_failure="block", before_restart_of="slurmd"))
    if role in prolog_epilog.SCRIPT_ROLES:
        steps += [StartStep("validate-scripts", validate_scripts),
                  StartStep("node-boot-scripts", node_boot_scripts, once_per_boot=True, on_failure="block")]
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
