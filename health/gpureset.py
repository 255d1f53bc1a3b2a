"""A GPU reset on this node, as an approved reset-gpu repair asks it: `reset_gpu(...)`.

The controller's repair service asks the node's agent (POST /health/reset-gpu?gpu=N, with the agent credential);
the agent runs this. It refuses a GPU the health monitor has not read on this node, and does not reset a GPU that a
job recorded here still holds (it names the jobs: the repair waits for them or requeues them). The reset is
health.gpu_reset_command, a program and its arguments (never a shell), with {gpu} filled in, killed past
health.gpu_reset_timeout. Once it exits 0, the monitor is asked to clear that GPU's findings (a sticky Xid stays
until a reset or a reboot: this is the reset) and to read the node again, so the repair's verify step sees the
GPU as the reset left it: a condition that is still there (a row remap still pending) is found again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_ext import command
from slurm_ext.errors import CommandError, CommandTimeout, SlurmExtError
from slurm_ext.log import printable

from .settings import HealthSection

__all__ = ["ResetOutcome", "NoSuchGpu", "reset_gpu", "known_gpus", "OUTPUT_LIMIT"]

#: characters of the tool's output (its tail) an outcome keeps: it reaches the repair's history and the page
OUTPUT_LIMIT = 2000
#: how long the reset waits for the monitor to take its clear request up (it does within a second)
_CLEAR_WAIT = 5.0


class NoSuchGpu(SlurmExtError):
    """The node has no GPU of that index (as its health monitor last read it)."""

    def __init__(self, gpu: int, known: list[int]):
        self.gpu, self.known = gpu, known
        have = ", ".join(map(str, known)) if known else "none read by its health monitor yet"
        super().__init__(f"no GPU {gpu} on this node (its GPUs: {have}); nothing was reset")


@dataclass(frozen=True, slots=True)
class ResetOutcome:
    gpu: int
    #: the tool ran (False: jobs hold the GPU, nothing was run)
    ran: bool
    #: it exited 0
    ok: bool
    #: the command as run, for the history
    command: str = ""
    #: its output's tail, control characters escaped
    output: str = ""
    #: the jobs recorded on the node that hold the GPU (when not run for them)
    held_by: tuple[int, ...] = ()


def known_gpus(readings_file: Path) -> list[int]:
    """The GPU indexes the health monitor read last (its readings file), [] when it has read none."""
    try:
        rows = json.loads(readings_file.read_text()).get("gpus") or []
    except (OSError, ValueError, AttributeError):
        return []
    found = [row.get("gpu", {}).get("index") for row in rows if isinstance(row, dict)
             and isinstance(row.get("gpu"), dict)]
    return sorted(index for index in found if type(index) is int)


def reset_gpu(health: HealthSection, state_dir: str, readings_file: Path, gpu: int, held=None) -> ResetOutcome:
    """Reset GPU `gpu` with health.gpu_reset_command, unless jobs hold it; on success clear its findings.

    `held()`: GPU index -> the jobs recorded here that hold it (prolog_epilog's job records by default).

    Raises:
        NoSuchGpu: the node has no such GPU (nothing run).
    """
    known = known_gpus(readings_file)
    if gpu not in known:
        raise NoSuchGpu(gpu, known)
    if held is None:
        held = lambda: _live_gpu_jobs(state_dir)  # noqa: E731
    holding = tuple(held().get(gpu, ()))
    if holding:
        return ResetOutcome(gpu, ran=False, ok=False, held_by=holding)
    argv = [word.replace("{gpu}", str(gpu)) for word in health.gpu_reset_command]
    shown = printable(" ".join(argv))
    try:
        result = command.run(argv, health.gpu_reset_timeout)
    except CommandTimeout as err:
        return ResetOutcome(gpu, True, False, shown, _tail(f"killed after {health.gpu_reset_timeout:g}s "
                                                           f"(health.gpu_reset_timeout): {err.stderr or ''}"))
    except CommandError as err:
        how = f"exited with status {err.returncode}" if err.returncode is not None else "could not start"
        return ResetOutcome(gpu, True, False, shown, _tail(f"{how}: {err.stderr or ''}".strip()))
    _clear_findings(state_dir, gpu)
    return ResetOutcome(gpu, True, True, shown, _tail((result.stdout + result.stderr).strip()))


def _live_gpu_jobs(state_dir: str) -> dict[int, list[int]]:
    """GPU index -> the jobs recorded here that hold it and may still run: a record younger than STARTING_GRACE (a job
    in its Prolog) or of a job with a slurmstepd on this node. An older record of a job with none is an Epilog that
    never ran, and holds no reset."""
    from slurm_ext.prolog_epilog import jobrecord
    recorded = jobrecord.gpu_jobs(state_dir)
    running = jobrecord.running_jobs(set(recorded.get(-1, ())))
    now = time.time()

    def live(job_id: int) -> bool:
        if job_id in running:
            return True
        record = jobrecord.read(job_id, state_dir)
        return record is not None and now - record.start < jobrecord.STARTING_GRACE
    return {gpu: [job for job in jobs if live(job)] for gpu, jobs in recorded.items()}


def _clear_findings(state_dir: str, gpu: int) -> None:
    """Ask the monitor to clear the GPU's findings that a reset repairs (action reset-gpu: a finding on the same
    GPU that needs a reboot stays open, and the repair's verify then refuses to resume the node), and wait
    (briefly) for it to take the request up."""
    from . import request_clear
    from .monitor import clear_path
    request_clear(state_dir, "", str(gpu), action="reset-gpu", why="reset")
    deadline = time.monotonic() + _CLEAR_WAIT
    while clear_path(state_dir).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _tail(text: str) -> str:
    return printable(text[-OUTPUT_LIMIT:])[-OUTPUT_LIMIT:]
