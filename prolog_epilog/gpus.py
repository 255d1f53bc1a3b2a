"""Are a job's GPUs free? The Epilog's GPU release check and the Prolog's foreign-process check.

Main API:

- `gpu_usage(indexes)` reads, through NVML, the processes and memory on GPUs.
- `release_gpus(indexes, is_job_process, kill, threshold_mib=...)` runs in the
  Epilog after the job's processes were killed: it kills what the job still
  has on its GPUs, waits for the driver to let go, and returns the GPUs that
  are still held (empty list: all released). A GPU that stays held must not
  go to the next job: the Epilog drains the node instead.
- `foreign_processes(indexes)` lists the processes already on GPUs that
  Slurm just allocated to a new job (a leftover of an earlier job, or a
  process started outside Slurm), which would share the GPU with the job.
  The Prolog judges the GPUs with `held_gpus(gpu_usage(indexes), ...)`, which
  also sees memory in use with no process listed.
- `held_gpus(usages, threshold_mib)` is the judge: which readings count as
  held. It is pure, so its rule is tested on literal records.

Memory in use is NVML's memory v2 ``used``, which leaves out the driver's
own reserve (615 MiB on an H200 with driver 580, about 900 MB on an A100):
v1's ``used`` includes it, so an idle GPU is never at 0 there. A driver
without v2 gives v1, and the threshold must then cover the reserve.

What is seen from a pod: newer open kernel modules report a process's PID in
the caller's PID namespace and leave out the processes of other namespaces
(a process of another pod on the same GPU is not listed at all). Its memory
still counts in ``used``, so a GPU with memory in use beyond the threshold
and no process listed is held by something this node agent cannot see.

GPU indexes are NVML indexes, as Slurm gives them in ``SLURM_JOB_GPUS`` on
this node. Slurm numbers the GPUs of a node in the order gres.conf lists
their device files; with gres.conf ordered by PCI bus id, which is also
NVML's order, Slurm's index and NVML's index agree. slurm-ext's gres
component writes gres.conf in NVML order to keep them aligned. MIG devices
are not addressed here: an index names a whole GPU.

Every NVML failure (library missing, driver not loaded, GPU lost, no such
index) becomes a `GpuCheckError` whose message says what to do; no pynvml
exception leaves this module. Loading pynvml, its exception types, its
strings and its init come from the core adapter `slurm_ext.nvml`.

NVML is initialised once per process and never shut down
(`slurm_ext.nvml.init_once`), unlike the gres inventory, which reads once per
node start: these checks run for every job in the warm node agent, and
nvmlInit costs up to seconds on a busy node.

NVML calls run on a worker thread and are waited for `NVML_TIMEOUT_S` at
most: a GPU falling off the bus can leave a call such as
nvmlDeviceGetComputeRunningProcesses blocked in the driver, and the Prolog
or Epilog waiting on it would wedge the job's start or end. A call that
does not return in time is a `GpuCheckTimeout` (a `GpuCheckError`); while
it is still blocked, later checks fail at once with the same error instead
of piling more blocked threads onto the driver.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from slurm_ext import nvml as nvml_adapter
from slurm_ext.errors import SlurmExtError

__all__ = [
    "GpuProcess",
    "GpuUsage",
    "GpuCheckError",
    "GpuCheckTimeout",
    "GpuLost",
    "gpu_usage",
    "held_gpus",
    "release_gpus",
    "foreign_processes",
    "POLL_INTERVAL_S",
    "NVML_TIMEOUT_S",
    "minor_numbers",
]

MIB = 2**20

#: How often `release_gpus` re-reads NVML while waiting for GPUs to free.
#: The driver frees a killed process's context within milliseconds to a few
#: seconds; polling faster than this only burns CPU in the Epilog.
POLL_INTERVAL_S = 0.1

#: Longest wait for one reading of a job's GPUs (nvmlInit included, which
#: can take seconds on a busy node; the reads themselves take milliseconds).
NVML_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process holding a context on a GPU."""

    #: NVML index of the GPU
    gpu: int
    #: process id, in the host's PID namespace (what NVML reports)
    pid: int
    #: GPU memory the process uses, MiB (0 where the driver does not say)
    used_mib: int


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """What one GPU holds: its processes and its memory in use."""

    #: NVML index of the GPU
    gpu: int
    #: GPU UUID, for logs and drain reasons that outlive index renumbering
    uuid: str
    #: compute and graphics processes, one entry per pid, in NVML's order
    processes: tuple[GpuProcess, ...]
    #: memory in use on the whole GPU beyond the driver's reserve, MiB (NVML memory v2 ``used``; v1's, which
    #: includes the reserve, where the driver has no v2)
    used_mib: int
    #: the driver's own reserve, MiB (v2 ``reserved``; 0 where unknown)
    reserved_mib: int = 0

    @property
    def unseen_mib(self) -> int:
        """Memory in use that no listed process accounts for: a process of another PID namespace, or memory the
        driver has not freed yet."""
        return max(0, self.used_mib - sum(p.used_mib for p in self.processes))


class GpuCheckError(SlurmExtError):
    """NVML could not tell what a GPU holds.

    `gpu` is the NVML index concerned (None when NVML as a whole failed),
    `problem` what went wrong, `nvml_code` NVML's return code when there is
    one. Without an answer the caller must assume the GPU is not free.
    """

    def __init__(self, problem: str, gpu: int | None = None, nvml_code: int | None = None):
        self.gpu = gpu
        self.problem = problem
        self.nvml_code = nvml_code
        where = "NVML" if gpu is None else f"GPU {gpu}"
        super().__init__(f"gpu check: {where}: {nvml_adapter.describe(problem, nvml_code)}")


class GpuLost(GpuCheckError):
    """NVML answers GPU_IS_LOST (the GPU fell off the bus) or RESET_REQUIRED for a GPU: no job may use it."""


class GpuCheckTimeout(GpuCheckError):
    """An NVML call did not return within its timeout (`seconds`); it may
    still be blocked in the driver, so the GPU's state is unknown.
    `initialising`: the call is still in nvmlInit, which takes seconds on a
    node of many GPUs without persistence mode: slow, not yet a hung GPU."""

    def __init__(self, problem: str, gpu: int | None, seconds: float, initialising: bool = False):
        self.seconds = seconds
        self.initialising = initialising
        super().__init__(problem, gpu)


def _default_nvml() -> Any:
    """pynvml, or the adapter's "not installed" as a GpuCheckError."""
    try:
        return nvml_adapter.load()
    except nvml_adapter.NvmlUnavailable as err:
        raise GpuCheckError(err.problem) from err


_LOST = (nvml_adapter.GPU_IS_LOST, nvml_adapter.RESET_REQUIRED)


def _translate(err: BaseException, gpu: int | None, doing: str) -> GpuCheckError:
    code = nvml_adapter.error_code(err)
    return (GpuLost if code in _LOST and gpu is not None else GpuCheckError)(f"{doing}: {err}", gpu, code)


def _ensure_init(nvml: Any) -> None:
    """NVML initialised for this process (see the module docstring); a failure
    is not cached, so a driver loaded later is picked up by the next check."""
    nvml_adapter.init_once(nvml, lambda err: _translate(err, None, "cannot initialise"))


def _processes(nvml: Any, call: Callable[[Any], Any], handle: Any) -> list[Any]:
    """One NVML process list; NOT_SUPPORTED (e.g. graphics on a compute-only
    GPU) means the GPU has none of that kind."""
    return list(nvml_adapter.optional(nvml, call, handle, default=[]))


def _merge(gpu: int, entries: Iterable[Any]) -> tuple[GpuProcess, ...]:
    """Processes from NVML entries (``pid``, ``usedGpuMemory``), one per pid.

    A process with compute and graphics contexts is in both NVML lists; it
    is one process. Its memory is the largest figure reported for it (the
    driver reports the same figure in both lists; the largest never hides
    memory). ``usedGpuMemory`` None (not available) counts as 0.
    """
    used: dict[int, int] = {}
    for entry in entries:
        pid = int(entry.pid)
        mib = int(entry.usedGpuMemory or 0) // MIB
        used[pid] = max(used.get(pid, 0), mib)
    return tuple(GpuProcess(gpu, pid, mib) for pid, mib in used.items())


def _read_gpu(nvml: Any, index: int) -> GpuUsage:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    uuid = nvml_adapter.text(nvml.nvmlDeviceGetUUID(handle))
    used, _, reserved = nvml_adapter.memory(nvml, handle)
    used_mib, reserved_mib = used // MIB, (reserved or 0) // MIB
    entries = _processes(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, handle)
    entries += _processes(nvml, nvml.nvmlDeviceGetGraphicsRunningProcesses, handle)
    return GpuUsage(index, uuid, _merge(index, entries), used_mib, reserved_mib)


@dataclass(slots=True)
class _Call:
    """One worker's NVML call: where it is (for the timeout's message) and how it ended.

    Not frozen: the worker thread fills it in as it goes.
    """

    nvml: Any
    started: float
    gpu: int | None = None
    doing: str = "initialising"
    done: bool = False
    value: Any = None
    error: BaseException | None = None


# Calls that timed out and have not returned yet, per nvml module (by identity: tests pass stand-ins).
_BLOCKED_LOCK = threading.Lock()
_BLOCKED: list[_Call] = []


def _blocked_call(nvml: Any) -> _Call | None:
    """The oldest call of `nvml` that timed out and is still blocked, if any."""
    with _BLOCKED_LOCK:
        _BLOCKED[:] = [call for call in _BLOCKED if not call.done]
        return next((call for call in _BLOCKED if call.nvml is nvml), None)


def _timeout_error(call: _Call, seconds: float, earlier: bool = False) -> GpuCheckTimeout:
    """What the operator reads: how long NVML has been blocked, where, and what to do."""
    where = "NVML" if call.gpu is None else f"GPU {call.gpu}"
    age = time.monotonic() - call.started
    what = (f"an earlier NVML call has been blocked for {age:.1f}s {call.doing} {where}; not asking again until "
            "it returns" if earlier else f"NVML did not answer within {seconds:g}s {call.doing} {where}")
    return GpuCheckTimeout(f"{what}: a GPU that fell off the bus or a hung driver does this; check dmesg for Xid "
                           "errors and nvidia-smi, then drain the node and reset the GPU or reboot", call.gpu, seconds,
                           initialising=call.doing == "initialising")


def _with_timeout(nvml: Any, work: Callable[[_Call], Any], timeout: float) -> Any:
    """Run `work` (the NVML calls) on a worker thread and wait `timeout` seconds at most.

    The worker is a daemon thread: one blocked in the driver for good does
    not keep the process from exiting. It records what it is doing in its
    `_Call`, so a timeout names the GPU and the step.

    Raises:
        GpuCheckTimeout: `work` did not finish in time, or an earlier call of
            `nvml` that timed out is still blocked (asking again would only
            block another thread).
        Whatever `work` raises.
    """
    blocked = _blocked_call(nvml)
    if blocked is not None:
        raise _timeout_error(blocked, timeout, earlier=True)
    call = _Call(nvml, time.monotonic())

    def run() -> None:
        try:
            call.value = work(call)
        except BaseException as err:  # handed to the caller, whatever it is
            call.error = err
        finally:
            call.done = True

    worker = threading.Thread(target=run, name="nvml-call", daemon=True)
    worker.start()
    worker.join(timeout)
    if not call.done:
        with _BLOCKED_LOCK:
            _BLOCKED.append(call)
        raise _timeout_error(call, timeout)
    if call.error is not None:
        raise call.error
    return call.value


def gpu_usage(indexes: Iterable[int], nvml: Any = None, *, timeout: float | None = None) -> list[GpuUsage]:
    """Read the processes and memory of each GPU in `indexes` (NVML indexes).

    Returns one record per distinct index, in the order given. `nvml` is the
    pynvml module (the default) or a stand-in with its interface. NVML is
    initialised on first use and kept initialised for the life of the
    process (thread-safe). The NVML calls run on a worker thread; `timeout`
    (default NVML_TIMEOUT_S) bounds the whole reading.

    Raises:
        GpuCheckError: NVML cannot be loaded or initialised; an index that
            NVML does not have (naming the index and NVML's count); a GPU
            that is lost or whose query fails (naming the index).
        GpuCheckTimeout: NVML did not answer within `timeout` seconds, or an
            earlier call that timed out is still blocked (naming the GPU
            when a GPU's query blocked).
    """
    nvml = _default_nvml() if nvml is None else nvml
    timeout = NVML_TIMEOUT_S if timeout is None else timeout
    indexes = list(dict.fromkeys(indexes))
    return _with_timeout(nvml, lambda call: _read_gpus(nvml, indexes, call), timeout)


def minor_numbers(indexes: Iterable[int], nvml: Any = None, *, timeout: float | None = None) -> dict[int, int]:
    """The device minor (`/dev/nvidia<minor>`) of each GPU in `indexes` (NVML indexes), as
    `gpu_usage` reads: on a worker, within `timeout`.

    A job's GPU indexes are not its device minors wherever the driver numbers
    devices in another order than the PCI bus: a cgroup that allows a job's
    devices must ask.

    Raises:
        GpuCheckError, GpuCheckTimeout: as `gpu_usage`.
    """
    nvml = _default_nvml() if nvml is None else nvml
    timeout = NVML_TIMEOUT_S if timeout is None else timeout
    indexes = list(dict.fromkeys(indexes))

    def read(call: _Call) -> dict[int, int]:
        _ensure_init(nvml)
        minors = {}
        for index in indexes:
            call.gpu, call.doing = index, "reading the minor number of"
            try:
                minors[index] = int(nvml.nvmlDeviceGetMinorNumber(nvml.nvmlDeviceGetHandleByIndex(index)))
            except nvml_adapter.errors(nvml) as err:
                raise _translate(err, index, "cannot read its minor number") from err
        return minors

    return _with_timeout(nvml, read, timeout)


def _read_gpus(nvml: Any, indexes: list[int], call: _Call) -> list[GpuUsage]:
    """gpu_usage's NVML calls, on the worker thread; `call` follows where they are."""
    _ensure_init(nvml)
    errors = nvml_adapter.errors(nvml)
    call.doing = "counting GPUs in"
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except errors as err:
        raise _translate(err, None, "cannot count GPUs") from err
    usages = []
    for index in indexes:
        if not 0 <= index < count:
            seen = f"indexes 0-{count - 1}" if count else "no GPUs"
            raise GpuCheckError(
                f"no such GPU: NVML has {count} ({seen}); check SLURM_JOB_GPUS against gres.conf", index
            )
        call.gpu, call.doing = index, "reading processes and memory of"
        try:
            usages.append(_read_gpu(nvml, index))
        except errors as err:
            raise _translate(err, index, "cannot read processes and memory") from err
    return usages


def held_gpus(usages: Iterable[GpuUsage], threshold_mib: int) -> list[GpuUsage]:
    """The GPUs not free for the next job: any process on them, or more than
    `threshold_mib` MiB of memory in use.

    The threshold leaves room for what an idle GPU still shows: nothing
    beyond the reserve in memory v2, the reserve itself (a few hundred MiB
    on Hopper) where the driver only has v1. Memory above it with no process
    listed is memory the driver has not freed, or a process NVML cannot see
    (another container's PID namespace).
    """
    return [u for u in usages if u.processes or u.used_mib > threshold_mib]


def release_gpus(
    indexes: Iterable[int],
    is_job_process: Callable[[int], bool],
    kill: Callable[[int], None],
    *,
    threshold_mib: int,
    timeout: float = 5.0,
    nvml: Any = None,
    nvml_timeout: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[GpuUsage]:
    """Make sure a finished job let go of its GPUs; return those it did not.

    Runs in the Epilog after the job's processes were killed. Each poll
    reads the GPUs; a process on them for which `is_job_process(pid)` is true
    is killed with `kill(pid)` (once per pid: a process stuck in the driver
    does not die faster for more signals). Processes that are not the job's
    are never killed: they are someone else's, and the GPU is reported held.
    Polls every POLL_INTERVAL_S until no GPU is held (see `held_gpus`) or
    `timeout` seconds have passed; reads at least once; each reading has
    `nvml_timeout` (see `gpu_usage`).

    Returns the GPUs still held at the last poll, as read then (empty list:
    all released).

    Raises:
        GpuCheckError: as `gpu_usage` (NVML unavailable, index missing, GPU
            lost); the caller must then treat the GPUs as not released.
        Whatever `kill` raises, except ProcessLookupError (the process
            exited on its own, which is what we wanted).
    """
    indexes = list(indexes)
    deadline = clock() + timeout
    judged: set[int] = set()
    while True:
        usages = gpu_usage(indexes, nvml, timeout=nvml_timeout)
        for process in (p for u in usages for p in u.processes):
            if process.pid in judged:
                continue
            judged.add(process.pid)
            if is_job_process(process.pid):
                try:
                    kill(process.pid)
                except ProcessLookupError:
                    pass
        held = held_gpus(usages, threshold_mib)
        remaining = deadline - clock()
        if not held or remaining <= 0:
            return held
        sleep(min(POLL_INTERVAL_S, remaining))


def foreign_processes(indexes: Iterable[int], nvml: Any = None, *,
                      timeout: float | None = None) -> list[GpuProcess]:
    """Processes already on GPUs just allocated to a new job (Prolog check).

    At Prolog time the job has not started, so any process on its GPUs
    belongs to someone else; sharing the GPU would cost the job memory and
    time and could expose its data. Returns them in GPU order (empty list:
    the GPUs are free of processes).

    Raises:
        GpuCheckError: as `gpu_usage`.
    """
    return [p for usage in gpu_usage(indexes, nvml, timeout=timeout) for p in usage.processes]
