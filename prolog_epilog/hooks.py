"""What the Prolog and the Epilog do, wherever they run.

The same two functions run inside the hook service (`slurm-ext hooks serve`,
warm: imports done, NVML initialised, script verdicts cached) when the thin
`slurm-ext-hook` client hands it a job, and inside the Python hooks
(`slurm-ext-prolog`, `slurm-ext-epilog`) when no service answers.

Prolog: record the job (the Epilog needs its uid, GPUs and cgroups when the
job is gone), refuse GPUs that a process already holds or that NVML does not
answer for, run job-start scripts. Epilog: kill what is left of the job, free
its IPC, check its GPUs are released, run job-end scripts, forget the job.

Exit codes are chosen with care: a non-zero exit makes slurmd drain the node
with a bare "Prolog error"/"Epilog error" (and requeue-hold a starting job).
So faults slurm-ext finds itself drain the node with an owned reason that
says what and where (`slurm-ext: gpu 1 memory held after job 42`), and the
exit is non-zero only where the job must not start (a held or hung GPU, a
failed job-start script under the drain policy). Failing closed where it
matters: a record that cannot be written (a full disk) still runs every
check and script, and drains the node, since the Epilogs of the user's other
jobs rely on records; an internal error is an event and exit 0, so a
slurm-ext bug never drains the cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from slurm_ext import config as config_mod, drainmark, events, log
from slurm_ext.config import Config
from slurm_ext.errors import ConfigError, SlurmExtError
from slurm_ext.log import printable

from . import jobrecord
from .places import phase_dir

# Imported where they are used: the Python hooks start afresh for every job on a node without the hook
# service, and a Prolog needs no process scan or IPC cleanup, a job without GPUs no NVML (nor typing:
# ~3 ms of such a start).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

    from . import procs

__all__ = ["Verdict", "prolog", "epilog", "handle", "prolog_main", "epilog_main"]

logger = logging.getLogger("prolog_epilog")
_COMPONENT = "prolog_epilog"
#: the owner of the Prolog's and Epilog's drains in the node-state catalogue (slurm_ext.nodestate)
OWNER = "jobs"
#: verdicts of admin scripts, kept for the life of the process (the hook service lives long)
_CACHE = None


@dataclass(frozen=True, slots=True)
class Verdict:
    #: what the hook exits with: slurmd drains the node on non-zero
    exit_code: int
    #: one line for slurmd's log and the hook's stderr
    message: str


def handle(phase: str, env: dict[str, str], config: Config, protect: tuple[int, ...] = ()) -> Verdict:
    """Run the Prolog or Epilog for the job in `env`; never raises.

    `protect`: pids the Epilog must never kill besides itself and its
    ancestors (the waiting hook client and its parents).
    """
    job = env.get("SLURM_JOB_ID", "?")
    try:
        if phase == "prolog":
            return prolog(env, config)
        if phase == "epilog":
            return epilog(env, config, protect)
        return Verdict(1, f"unknown phase {phase!r}: expected prolog or epilog")
    except (SlurmExtError, OSError) as err:
        _emit(config, f"{phase}-failed", f"job {job}: {phase}: {err}", "error", job=job)
        return Verdict(0, f"job {job}: {phase} failed: {err}")
    except Exception as err:  # a bug here must not drain every node of the cluster
        logger.exception("job %s: %s", job, phase)
        _emit(config, f"{phase}-failed", f"job {job}: {phase}: internal error: {err!r}", "error", job=job)
        return Verdict(0, f"job {job}: {phase}: internal error: {err!r}")


def prolog(env: dict[str, str], config: Config) -> Verdict:
    record = jobrecord.from_environ(env)
    state_dir = config.node.state_dir
    if unshown := drainmark.unshown_drain(config.node.runtime_dir):
        return _refuse(config, record, unshown)
    with jobrecord.uid_lock(state_dir, record.uid, _lock_timeout(config)) as held:
        if not held:
            _emit(config, "uid-lock-timeout", f"job {record.job_id}: uid {record.uid}'s lock not had within "
                  f"{_lock_timeout(config):g}s (an Epilog of the user's still cleaning up?); recording the job "
                  "anyway", "warning", job=record.job_id)
        try:
            jobrecord.write(record, state_dir)
        except OSError as err:
            # Fail closed: the checks below still run, and the node takes no more jobs, since without
            # records the Epilog of this user's other jobs cannot know this one runs here.
            _emit(config, "record-failed", f"job {record.job_id}: cannot write its record in {state_dir}/jobs: "
                  f"{err.strerror or err} (a full disk?); draining the node", "error", job=record.job_id)
            _drain(config, record, f"cannot record job {record.job_id} in {state_dir}/jobs: {err.strerror or err}")
    if record.gpus and (refused := _gpus_unfit(record, config)):
        return refused
    outcome = _run_scripts("job-start", config, env)
    if outcome.exit_code:
        return Verdict(outcome.exit_code, f"job {record.job_id}: job-start scripts failed (policy drain)")
    return Verdict(0, "")


def _refuse(config: Config, record: jobrecord.JobRecord, unshown: str) -> Verdict:
    """No job while a drain of ours waits for Slurm (an admin just resumed the node over a critical finding).

    The agent is asked to drain now and the answer waited for: the drain must be shown before this Prolog's
    failure reaches slurmctld, which would otherwise drain the node with its bare "Prolog error"."""
    from slurm_ext import nodestate
    try:
        shown = nodestate.look_now(config.node.runtime_dir, timeout=config.slurm.timeout)
    except SlurmExtError as err:
        shown = f"not known: {err}"
    _emit(config, "job-refused", f"job {record.job_id}: node {record.node or config.node.slurm_name} is to be "
          f"drained ({unshown}), which Slurm did not show when the job came; Slurm requeues the job (the node shows "
          f"{shown or 'no reason'!r})", "error", job=record.job_id, reason=unshown)
    return Verdict(1, f"job {record.job_id}: the node is being drained ({unshown}); Slurm requeues the job")


def _gpus_unfit(record: jobrecord.JobRecord, config: Config) -> Verdict | None:
    """The Prolog's verdict when the job must not start on its GPUs (the node is drained), else None.

    A process already on one of them, memory in use there beyond the
    threshold with no process listed (another pod's process, which NVML does
    not show across PID namespaces), a GPU that NVML says is lost, or a query
    that NVML does not answer (a GPU off the bus hangs its driver) stops the
    job; NVML missing, or an nvmlInit still running (slow on many GPUs
    without persistence mode), is an event and the job starts.
    """
    from . import gpus
    job = record.job_id
    try:
        held = gpus.held_gpus(gpus.gpu_usage(record.gpus), config.prolog_epilog.gpu_memory_threshold)
    except gpus.GpuLost as err:
        _emit(config, "gpu-check-failed", f"job {job}: a GPU of the job is lost: {err}", "error", job=job)
        _drain(config, record, f"gpu {err.gpu} lost (NVML {_nvml_code_name(err.nvml_code)}) before job {job}")
        return Verdict(1, f"job {job}: gpu {err.gpu} is lost ({err}); node drained, Slurm requeues the job")
    except gpus.GpuCheckError as err:
        _emit(config, "gpu-check-failed", f"job {job}: cannot check its GPUs before it starts: {err}", "error",
              job=job)
        if not isinstance(err, gpus.GpuCheckTimeout) or err.initialising:
            return None
        which = err.gpu if err.gpu is not None else ",".join(map(str, record.gpus))
        _drain(config, record, f"gpu {which} not answering NVML before job {job}")
        return Verdict(1, f"job {job}: NVML did not answer for its GPUs ({err}); node drained, Slurm requeues "
                       "the job")
    if not held:
        return None
    which = ",".join(str(usage.gpu) for usage in held)
    users = ", ".join(_holders(usage) for usage in held)
    _drain(config, record, f"gpu {which} held by another process before job {job} ({users})")
    return Verdict(1, f"job {job}: gpu {which} already in use ({users}); node drained, Slurm requeues the job")


def _holders(usage) -> str:
    """Who holds a GPU, as a drain reason says it: its processes, or memory that no process shown accounts for."""
    if usage.processes:
        return ", ".join(f"pid {p.pid} on gpu {p.gpu}" for p in usage.processes)
    return f"{usage.used_mib} MiB in use on gpu {usage.gpu} and no process this node sees"


def _nvml_code_name(code: int | None) -> str:
    return {15: "GPU_IS_LOST", 16: "RESET_REQUIRED"}.get(code, f"error {code}")


def epilog(env: dict[str, str], config: Config, protect: tuple[int, ...] = ()) -> Verdict:
    state_dir = config.node.state_dir
    job_id = jobrecord.job_id_of(env)
    record = jobrecord.read(job_id, state_dir)
    if record is None:
        # The Epilog's environment has the same fields; the start becomes now, which keeps IPC
        # objects of a user with other jobs rather than guess which are this job's.
        record = jobrecord.from_environ(env)
        _emit(config, "record-missing", f"job {job_id}: no record from its Prolog in {state_dir}/jobs; cleaning "
              "up from the Epilog's environment", "warning", job=job_id)
    try:
        return _clean_up(env, config, record, protect)
    finally:
        jobrecord.remove(job_id, state_dir)  # even after a failure: a stale record would stop the uid sweep


def _clean_up(env: dict[str, str], config: Config, record: jobrecord.JobRecord, protect: tuple[int, ...]) -> Verdict:
    from . import procs
    from .ipc import clean_ipc
    settings = config.prolog_epilog
    job_id = record.job_id
    protected = procs.protected_pids(protect)
    with _exclusive_step(config, record) as (others, exclusive):
        # the hook client that ran this hook names itself: it sends the uid sweep's signals (procs.signal_uid)
        cleanup = procs.kill_job(record, sweep_uid=exclusive, protected=protected, timeout=settings.kill_timeout,
                                 live_jobs=frozenset(others), signal_helper=env.get("SLURM_EXT_HOOK"))
        ipc = clean_ipc(record.uid, exclusive=exclusive, since=record.start) if record.uid else None
    reasons = [f"job {job_id} left pid {p.pid} ({printable(p.comm)}) unkillable in state {state}"
               for p, state in cleanup.survivors]
    reasons += _release_gpus(config, record, cleanup, protected, frozenset(others))
    _report(config, record, cleanup, ipc, others)
    for reason in reasons:
        _drain(config, record, reason)
    # the user's job-end hooks run after the cleanup: each in a cgroup of its own that is killed when it
    # ends (scripts._HookCgroup), so no process of theirs outlives them; what they left in IPC goes now
    outcome = _run_scripts("job-end", config, env)
    if record.uid and any(result.user == record.user and not result.refused for result in outcome.results):
        with _exclusive_step(config, record) as (others, exclusive):
            late = clean_ipc(record.uid, exclusive=exclusive, since=record.start)
        if late.removed or late.errors:
            _report(config, record, procs.Cleanup((), (), 0.0, 0), late, others)
    if outcome.exit_code:
        return Verdict(outcome.exit_code, f"job {job_id}: job-end scripts failed (policy drain)")
    return Verdict(0, "; ".join(reasons))


@contextlib.contextmanager
def _exclusive_step(config: Config, record: jobrecord.JobRecord) -> Iterator[tuple[list[int], bool]]:
    """(the same user's other live jobs, whether the user has none) while the uid's lock is held.

    A Prolog of the same user holds the lock while it writes its record, so
    no job of the user can start between this look and what it allows (the
    uid sweep, removing every IPC object). Without the lock (not had in time)
    the user is never taken to have no other job.
    """
    state_dir = config.node.state_dir
    with jobrecord.uid_lock(state_dir, record.uid, _lock_timeout(config)) as held:
        others, stale = jobrecord.other_jobs(record, state_dir, since=_boot_time())
        if stale:
            _emit(config, "record-stale", f"job {record.job_id}: removed the records of job(s) "
                  f"{','.join(map(str, stale))} of uid {record.uid}, which no longer run here", "warning",
                  job=record.job_id, stale=stale)
        if not held:
            _emit(config, "uid-lock-timeout", f"job {record.job_id}: uid {record.uid}'s lock not had within "
                  f"{_lock_timeout(config):g}s; cleaning up as if the user had another job here", "warning",
                  job=record.job_id)
        yield others, held and not others and record.uid >= config.prolog_epilog.min_uid


def _lock_timeout(config: Config) -> float:
    """How long a hook waits for the uid lock: an Epilog holds it through its kill and IPC cleanup."""
    return config.prolog_epilog.kill_timeout + 20.0


class _NothingRan:
    """What _run_scripts returns when there is nothing to run (a constant, not a record)."""

    exit_code = 0
    results = ()


def _run_scripts(phase: str, config: Config, env: dict[str, str]):
    """Run the phase's scripts; the runner (and its imports) only when there is something to run."""
    global _CACHE
    if not phase_dir(config, "worker", phase).is_dir() and not config.prolog_epilog.allow_user_hooks:
        return _NothingRan
    from .scripts import run_scripts
    from .validate import VerdictCache
    if _CACHE is None:
        _CACHE = VerdictCache()
    return run_scripts(phase, config, env=env, cache=_CACHE)


def _release_gpus(config: Config, record: jobrecord.JobRecord, cleanup: procs.Cleanup,
                  protected: frozenset[int], live: frozenset[int]) -> list[str]:
    """Drain reasons for the job's GPUs that are still held once its processes are gone."""
    if not record.gpus:
        return []
    from . import gpus, procs
    found = {p.pid: p for p in cleanup.found}

    def is_job_process(pid: int) -> bool:
        process = found.get(pid) or procs.gpu_process_of(record, pid, protected, live)
        if process is not None:
            found[pid] = process
        return process is not None

    try:
        held = gpus.release_gpus(record.gpus, is_job_process, lambda pid: procs.kill_process(found[pid]),
                                 threshold_mib=config.prolog_epilog.gpu_memory_threshold)
    except gpus.GpuLost as err:
        _emit(config, "gpu-check-failed", f"job {record.job_id}: a GPU of the job is lost: {err}", "error",
              job=record.job_id)
        return [f"gpu {err.gpu} lost (NVML {_nvml_code_name(err.nvml_code)}) after job {record.job_id}"]
    except gpus.GpuCheckError as err:
        _emit(config, "gpu-check-failed", f"job {record.job_id}: cannot check its GPUs are released: {err}",
              "error", job=record.job_id)
        return []
    reasons = []
    for usage in held:
        users = ", ".join(f"pid {p.pid}" for p in usage.processes) or "no process"
        _emit(config, "gpu-held", f"job {record.job_id}: gpu {usage.gpu} ({usage.uuid}) still holds "
              f"{usage.used_mib} MiB ({users}) after the job's processes are gone (expected at most "
              f"{config.prolog_epilog.gpu_memory_threshold} MiB and no process)", "error",
              job=record.job_id, gpu=usage.gpu, uuid=usage.uuid)
        reasons.append(f"gpu {usage.gpu} memory held after job {record.job_id}")
    return reasons


def _report(config: Config, record: jobrecord.JobRecord, cleanup: procs.Cleanup, ipc, others: list[int]) -> None:
    """One journal event when the Epilog found something to clean, a debug line when not."""
    removed = ipc.removed if ipc else ()
    errors = ipc.errors if ipc else ()
    if not cleanup.found and not removed and not errors and not cleanup.survivors:
        logger.debug("job %s: nothing left behind (%.0f ms)", record.job_id, cleanup.seconds * 1000)
        return
    ties: dict[str, int] = {}
    for process in cleanup.found:
        ties[process.tie] = ties.get(process.tie, 0) + 1
    how = ", ".join(f"{n} by {tie}" for tie, n in sorted(ties.items()))
    text = (f"job {record.job_id} (user {record.user}): killed {len(cleanup.found)} leftover process(es)"
            f"{f' ({how})' if how else ''} in {cleanup.seconds * 1000:.0f} ms; removed {len(removed)} IPC "
            f"object(s)" + (f"; user has other job(s) {','.join(map(str, others))}: only what no process holds"
                            if others else ""))
    if errors:
        text += f"; {len(errors)} IPC object(s) could not be removed"
    severity = "error" if cleanup.survivors or errors else "warning"
    _emit(config, "leftovers-cleaned", text, severity, job=record.job_id, uid=record.uid,
          processes=[str(p) for p in cleanup.found][:50], ipc_removed=list(removed)[:50],
          ipc_kept=list(ipc.kept)[:50] if ipc else [], ipc_errors=list(errors)[:50],
          survivors=[f"{p} state {s}" for p, s in cleanup.survivors])


def _drain(config: Config, record: jobrecord.JobRecord, reason: str) -> None:
    """Hand the drain to the node-state owner (the agent's, or this process's own when no agent runs).

    Waited for: the node must show it before Slurm can give it the next job."""
    node = record.node or config.node.slurm_name
    _emit(config, "drain", f"node {node}: {reason}", "error", job=record.job_id, node=node)
    # only here: a drain is rare, the imports are not free
    from slurm_ext import nodestate
    from slurm_ext.slurm import SlurmClient
    try:
        outcome = nodestate.post(config.node.runtime_dir, OWNER, reason, node=node,
                                 slurm=lambda: SlurmClient(config.slurm),
                                 emit=events.emitter(config.node.state_dir, "nodestate"),
                                 timeout=config.slurm.timeout + 2.0, job=record.job_id)
    except SlurmExtError as err:
        _emit(config, "drain-failed", f"node {node}: could not drain ({reason}): {err}", "error",
              job=record.job_id, node=node)
    else:
        logger.info("job %s: node %s drain (%s): %s", record.job_id, node, reason, outcome)


def _emit(config: Config, event: str, message: str, severity: str = "info", **fields) -> None:
    events.emit(config.node.state_dir, _COMPONENT, event, message, severity, **fields)


def _boot_time() -> float:
    """Seconds since the epoch when this kernel booted: job records older than that are stale.

    From the clocks (now, less the time since boot), which is how the kernel
    itself makes /proc/stat's btime, without reading /proc/stat: on a node
    with many CPUs that file holds a line per CPU and one per interrupt.
    """
    try:
        return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):  # not Linux
        return 0.0


# -- the Python hooks (used when no hook service answers) ----------------------------


def prolog_main(config_cache: str | None = None) -> NoReturn:
    """The Python Prolog, a process of its own: run it and exit with its verdict.

    `config_cache`: where to keep the parsed config between runs (`config.load`'s parsed_cache).
    """
    _exit(_main("prolog", config_cache))


def epilog_main(config_cache: str | None = None) -> NoReturn:
    """The Python Epilog, a process of its own: run it and exit with its verdict (`config_cache`: as for the Prolog)."""
    _exit(_main("epilog", config_cache))


def _main(phase: str, config_cache: str | None) -> int:
    try:
        config = config_mod.load(parsed_cache=config_cache)
    except ConfigError as err:
        print(f"slurm-ext-{phase}: {err}; using defaults", file=sys.stderr)
        config = Config()
    log.setup(config.log, phase)
    started = time.monotonic()
    verdict = handle(phase, dict(os.environ), config)
    logger.info("job %s: %s done in %.0f ms without the hook service (is `slurm-ext hooks serve` running?)",
                os.environ.get("SLURM_JOB_ID", "?"), phase, (time.monotonic() - started) * 1000)
    if verdict.message:
        print(f"slurm-ext-{phase}: {printable(verdict.message)}", file=sys.stderr)
    return verdict.exit_code


def _exit(code: int) -> NoReturn:
    """Exit with `code` now, once the log and the standard streams are flushed.

    Why not a normal exit: the interpreter's teardown frees every object of
    every imported module, one by one, about 5 ms of a 50 ms Python hook
    that slurmd waits for. Nothing is lost by skipping it: the journal is
    written and closed event by event, logging's handlers (its atexit
    handler is the only one registered) are flushed and closed here, and
    the hook leaves no thread that must finish (NVML calls run on daemon
    threads, which an exit abandons anyway).
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed, or None (no stream at all)
            pass
    os._exit(code)
