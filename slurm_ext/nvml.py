"""The NVML adapter every component shares: loading pynvml, its exceptions, its
strings, its init, and what an operator does about each NVML return code.

Main API:

- `load()` imports pynvml, or raises `NvmlUnavailable` naming the package to
  install. pynvml is imported there and nowhere else, so importing this module
  (the Prolog/Epilog hot path does, through prolog_epilog.gpus) costs nothing
  until NVML is used. With `SLURM_EXT_NVML_RECORD=<file>` set it returns pynvml
  behind a recorder that writes every NVML call and its answer to that file
  (`slurm_ext.nvmlrecord`: how a real GPU's answers become the fake's).
- `errors(nvml)` is the tuple of exceptions an NVML call may raise.
- `error_code(err)` is NVML's return code of one of them, `text(value)` a pynvml
  string as str, `optional(nvml, call, ...)` a call whose "not supported"
  means "this GPU lacks the feature".
- `init_once(nvml, fail)` initialises NVML once for the life of the process
  (readers in the warm node agent); `session(nvml, fail)` initialises it for
  one `with` block and shuts it down after (a reader that runs once per start).
  NVML counts inits, so the two live side by side in one process.
- `describe(problem, code)` / `advice(code)`: the operator's next step.

Components translate at their boundary: `fail` turns the pynvml exception of a
failed nvmlInit into the component's own error, and the component catches
`errors(nvml)` around its other calls. No pynvml exception is turned into an
error here, so every component keeps its own exception type and messages.

pynvml raises NVMLError with the driver's numeric code in `.value`; the codes
are part of the driver's ABI (nvml.h), so they are stable.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from slurm_ext.errors import SlurmExtError

__all__ = ["INVALID_ARGUMENT", "NOT_SUPPORTED", "NO_PERMISSION", "NOT_FOUND", "DRIVER_NOT_LOADED",
           "LIBRARY_NOT_FOUND", "FUNCTION_NOT_FOUND", "GPU_IS_LOST", "RESET_REQUIRED", "LIB_RM_VERSION_MISMATCH",
           "ARGUMENT_VERSION_MISMATCH", "NvmlUnavailable", "load", "errors", "error_code", "text", "optional",
           "memory", "init_once", "session",
           "advice", "describe"]

INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18
ARGUMENT_VERSION_MISMATCH = 25

_ADVICE = {
    NO_PERMISSION: "run slurm-ext as root",
    DRIVER_NOT_LOADED: "load the NVIDIA kernel driver (nvidia-smi should list the GPUs)",
    LIBRARY_NOT_FOUND: "install the NVIDIA driver's libnvidia-ml.so.1 or put it on the library path",
    FUNCTION_NOT_FOUND: "the NVIDIA driver is older than pynvml expects: upgrade the driver",
    GPU_IS_LOST: "the GPU fell off the bus (Xid 79): drain the node, then reset the GPU or reboot",
    RESET_REQUIRED: "drain the node and reset the GPU (nvidia-smi -r) or reboot",
    LIB_RM_VERSION_MISMATCH: "the driver was upgraded without a reboot: reboot the node",
}

#: The fix for a missing pynvml; the package is nvidia-ml-py, the module pynvml.
_MISSING = "the pynvml package is not installed (pip install nvidia-ml-py)"


class NvmlUnavailable(SlurmExtError):
    """pynvml cannot be imported, so nothing can be asked of NVML.

    `problem` says what is missing and how to install it; components put it
    into their own error unchanged.
    """

    def __init__(self, problem: str = _MISSING):
        self.problem = problem
        super().__init__(f"nvml: {problem}")


#: the variable that makes load() record every NVML call (nvmlrecord.ENV, named here to import nothing)
_RECORD_ENV = "SLURM_EXT_NVML_RECORD"


def load() -> Any:
    """The pynvml module, imported on first use (it loads no library until nvmlInit); with
    `$SLURM_EXT_NVML_RECORD` set, the same module behind the process's one recorder for that file.

    Raises:
        NvmlUnavailable: pynvml is not installed.
    """
    try:
        import pynvml
    except ImportError as err:
        raise NvmlUnavailable() from err
    record = os.environ.get(_RECORD_ENV)
    if record:
        from slurm_ext import nvmlrecord
        return nvmlrecord.recording(pynvml, record)
    return pynvml


def errors(nvml: Any) -> tuple[type[BaseException], ...]:
    """The exceptions an NVML call may raise: NVMLError and its subclasses,
    and pynvml's NVMLLibraryMismatchError (not an NVMLError) for a driver
    that lacks the versioned call pynvml wants. `nvml` may be a stand-in
    that has only NVMLError."""
    found: list[type[BaseException]] = [nvml.NVMLError]
    mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
    if isinstance(mismatch, type):
        found.append(mismatch)
    return tuple(found)


def error_code(err: BaseException) -> int | None:
    """NVML's return code carried by `err` (pynvml's ``.value``), or None when it has none."""
    value = getattr(err, "value", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def text(value: Any) -> str:
    """A pynvml string as str: pynvml before 11.5 returned bytes."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def optional(nvml: Any, call: Callable[..., Any], *args: Any, default: Any,
             codes: tuple[int, ...] = (NOT_SUPPORTED,)) -> Any:
    """`call(*args)`, or `default` when NVML answers one of `codes` (a feature
    this GPU lacks, such as graphics processes on a compute-only GPU).

    Raises:
        nvml.NVMLError: any other code; the GPU is unreadable, which the
            caller translates.
    """
    try:
        return call(*args)
    except nvml.NVMLError as err:
        if error_code(err) in codes:
            return default
        raise


#: what a driver or pynvml without memory v2 answers for it
_NO_MEMORY_V2 = (NOT_SUPPORTED, FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH)


def memory(nvml: Any, handle: Any) -> tuple[int, int, int | None]:
    """(used, free, reserved) bytes of a GPU: memory v2 where the driver has it, whose `used` leaves out the
    driver's own reserve (615 MiB of an idle H200's v1 "used"); v1, and reserved None, where it does not.

    Raises:
        nvml.NVMLError: any other answer (the caller translates it).
    """
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            return int(info.used), int(info.free), int(info.reserved)
        except nvml.NVMLError as err:
            if error_code(err) not in _NO_MEMORY_V2:
                raise
    info = nvml.nvmlDeviceGetMemoryInfo(handle)
    return int(info.used), int(info.free), None


# init_once: modules initialised in this process, by identity (tests pass stand-ins).
_INIT_LOCK = threading.Lock()
_INITIALISED: list[Any] = []


def init_once(nvml: Any, fail: Callable[[BaseException], Exception]) -> None:
    """nvmlInit once per process and `nvml` module, never shut down; thread-safe.

    For readers in a long-lived process (the node agent checks every job's
    GPUs): nvmlInit costs up to seconds on a busy node. A failure is not
    remembered, so a driver loaded later is picked up by the next call.

    Raises:
        Whatever `fail(err)` returns for the NVML error `err` of nvmlInit
        (the caller's own error type), chained to `err`.
    """
    with _INIT_LOCK:
        if any(done is nvml for done in _INITIALISED):
            return
        try:
            nvml.nvmlInit()
        except errors(nvml) as err:
            raise fail(err) from err
        _INITIALISED.append(nvml)


@contextmanager
def session(nvml: Any, fail: Callable[[BaseException], Exception]) -> Iterator[Any]:
    """NVML initialised for one `with` block, then shut down; yields `nvml`.

    For a reader that runs once per start and should leave no state behind.
    NVML counts inits, so an `init_once` in the same process stays in force.
    An error of nvmlShutdown is ignored: nothing depends on it.

    Raises:
        Whatever `fail(err)` returns for the NVML error `err` of nvmlInit,
        chained to `err`; errors of the block itself pass through untouched.
    """
    caught = errors(nvml)
    try:
        nvml.nvmlInit()
    except caught as err:
        raise fail(err) from err
    try:
        yield nvml
    finally:
        try:
            nvml.nvmlShutdown()
        except caught:
            pass


def advice(code: int | None) -> str | None:
    """What an operator should do about NVML error `code`, or None when there is nothing specific."""
    return _ADVICE.get(code)


def describe(problem: str, code: int | None) -> str:
    """`problem`, with NVML's code and what to do about it when there is one."""
    if code is None:
        return problem
    action = advice(code)
    return f"{problem} (NVML error {code})" + (f"; {action}" if action else "")
