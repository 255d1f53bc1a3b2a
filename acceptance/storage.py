"""The storage test: for each path of acceptance.paths, fsync latency and sequential write and read throughput.

In a scratch directory made in the path and removed after: N small writes, each followed by an
fsync, whose fsync time is measured (a checkpoint's cost); then one file written sequentially and
flushed, and read back. fio does it where installed (`fio --output-format=json`, its per-job
"sync" latency percentiles and "bw_bytes"); otherwise Python does the same with os.write,
os.fsync and os.read. Reading a file just written would measure the page cache: fio drops the
file's cached pages before it reads (its invalidate=1, the default), and the Python fallback does
the same with posix_fadvise(POSIX_FADV_DONTNEED) after the fsync, which drops clean pages.

The fsync figure judged is the median of the N fsyncs (fsync_ms, at most): a quick level has
20 samples, whose 99th percentile is their slowest one, too noisy to fail a node on; the p99 is
shown beside it. MB/s is 1e6 bytes a second.

A path that is read-only, full, missing or unreadable fails naming the path, with action "none" as
health's filesystem check acts (a repair of the node does not empty or remount a file system).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path
import time

from slurm_ext.command import run
from slurm_ext.errors import CommandError, CommandTimeout

from .catalog import Given
from .records import ERROR, FAIL, PASS, Figure, NotApplicable, Result, TestError

__all__ = ["paths", "SIZES"]

_MIB = 2**20
#: level -> (fsynced small writes, bytes written then read sequentially): quick is seconds on a local disk
SIZES = {"quick": (20, 64 * _MIB), "standard": (100, 512 * _MIB), "extended": (500, 4096 * _MIB)}
_SMALL = 4096
_BLOCK = _MIB
#: the share of the free space the sequential file may take at most
_SHARE = 0.25
#: errnos that are the file system's state, a fail; any other OSError is an error
_FAULTS = {errno.EROFS: "read-only", errno.ENOSPC: "full", errno.EDQUOT: "over its quota",
           errno.ENOENT: "missing", errno.ENOTDIR: "not a directory", errno.EACCES: "not writable",
           errno.EIO: "failing with I/O errors"}


class _Fault(Exception):
    """The path is unusable (read-only, full, ...): a fail, named by `what`."""

    def __init__(self, what: str):
        self.what = what
        super().__init__(what)


def paths(given: Given) -> list[Result]:
    """One result per path of acceptance.paths.

    Raises:
        NotApplicable: no path is configured.
    """
    configured = tuple(getattr(given.settings, "paths", ()) or ())
    if not configured:
        raise NotApplicable("no path configured (acceptance.paths)")
    fio = shutil.which("fio")
    count, size = SIZES.get(given.level, SIZES["quick"])
    budget = max(5.0, given.deadline - 5.0) / len(configured)
    return [_path(str(path), count, size, fio, budget, given.limits) for path in configured]


def _path(path: str, count: int, size: int, fio: str | None, budget: float, limits: dict) -> Result:
    started = time.monotonic()
    try:
        scratch = _scratch(path)
    except _Fault as fault:
        return Result("storage", "storage", path, FAIL, f"{path}: {fault.what}", (), time.monotonic() - started)
    try:
        try:
            free = shutil.disk_usage(scratch).free
        except OSError as err:
            raise _fault(err) from err
        if free < count * _SMALL + _MIB:
            raise _Fault(f"full ({free} bytes free)")
        size = max(_MIB, min(size, int(free * _SHARE) // _MIB * _MIB))
        measure = _with_fio if fio else _with_python
        fsync_median, fsync_p99, write_mbps, read_mbps = measure(fio, scratch, count, size, budget)
    except _Fault as fault:
        return Result("storage", "storage", path, FAIL, f"{path}: {fault.what}", (), time.monotonic() - started)
    except TestError as err:
        return Result("storage", "storage", path, ERROR, f"{path}: {err}", (), time.monotonic() - started)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    figures = (Figure("fsync_ms", fsync_median, "ms", limits.get("fsync_ms"), at_least=False),
               Figure("fsync_p99_ms", fsync_p99, "ms"),
               Figure("write_mbps", write_mbps, "MB/s", limits.get("write_mbps")),
               Figure("read_mbps", read_mbps, "MB/s", limits.get("read_mbps")))
    seconds = time.monotonic() - started
    tool = "fio" if fio else "python"
    text = ", ".join(f.text() for f in figures) + f" ({tool}, {size // _MIB} MiB)"
    outside = [f for f in figures if not f.within]
    if outside:
        return Result("storage", "storage", path, FAIL, f"{path}: too slow: " + "; ".join(f.text() for f in outside),
                      figures, seconds)
    return Result("storage", "storage", path, PASS, f"{path}: {text}", figures, seconds)


def _fault(err: OSError) -> _Fault:
    return _Fault(f"{_FAULTS.get(err.errno, 'unusable')} ({err.strerror or err})")


#: the scratch directories' prefix
_SCRATCH = ".slurm-ext-accept-"


def _scratch(path: str) -> str:
    """A scratch directory of this run's in `path`, after removing any an earlier run left there: one killed at its
    deadline cannot remove its own (up to 4 GiB at extended), and one run at a time holds the node."""
    for left in Path(path).glob(_SCRATCH + "*"):
        shutil.rmtree(left, ignore_errors=True)
    try:
        return tempfile.mkdtemp(prefix=_SCRATCH, dir=path)
    except OSError as err:
        raise _fault(err) from err


# -- with Python -------------------------------------------------------------------------------------------------


def _with_python(_fio, scratch: str, count: int, size: int, budget: float) -> tuple[float, float, float, float]:
    try:
        times = _fsyncs(os.path.join(scratch, "fsync"), count)
        write_mbps, read_mbps = _sequential(os.path.join(scratch, "sequential"), size)
    except OSError as err:
        raise _fault(err) from err
    return statistics.median(times), _p99(times), write_mbps, read_mbps


def _fsyncs(name: str, count: int) -> list[float]:
    """Each fsync's time in ms after a 4 KiB append."""
    block = os.urandom(_SMALL)
    times = []
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(count):
            _write_all(fd, block)
            begun = time.perf_counter()
            os.fsync(fd)
            times.append((time.perf_counter() - begun) * 1000.0)
    finally:
        os.close(fd)
    return times


def _sequential(name: str, size: int) -> tuple[float, float]:
    """MB/s writing `size` bytes and flushing them, then reading them back from the device, not the page cache."""
    block = os.urandom(_BLOCK)
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        begun = time.perf_counter()
        for _ in range(size // _BLOCK):
            _write_all(fd, block)
        os.fsync(fd)
        write_s = time.perf_counter() - begun
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.lseek(fd, 0, os.SEEK_SET)
        begun = time.perf_counter()
        done = 0
        while chunk := os.read(fd, _BLOCK):
            done += len(chunk)
        read_s = time.perf_counter() - begun
    finally:
        os.close(fd)
    return size / 1e6 / max(write_s, 1e-9), done / 1e6 / max(read_s, 1e-9)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _p99(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


# -- with fio ----------------------------------------------------------------------------------------------------


def _with_fio(fio: str, scratch: str, count: int, size: int, budget: float) -> tuple[float, float, float, float]:
    # fio splits --directory at ':' (a list of directories) unless it is escaped
    common = ["--directory", scratch.replace(":", "\\:"), "--output-format=json", "--ioengine=psync",
              "--group_reporting"]
    fsync = _fio(fio, ["--name=fsync", "--rw=write", f"--bs={_SMALL}", f"--size={count * _SMALL}", "--fsync=1",
                       *common], budget / 3)
    lat = _field(fsync, "sync", "lat_ns")
    percentiles = lat.get("percentile") or {}
    median = float(percentiles.get("50.000000", lat.get("mean", 0.0))) / 1e6
    p99 = float(percentiles.get("99.000000", lat.get("max", 0.0))) / 1e6
    # end_fsync: the write's figure includes the flush, and the read then finds clean pages that fio's
    # invalidate=1 (the default) drops before it reads
    write = _fio(fio, ["--name=sequential", "--rw=write", f"--bs={_BLOCK}", f"--size={size}", "--end_fsync=1",
                       *common], budget / 3)
    read = _fio(fio, ["--name=sequential", "--rw=read", f"--bs={_BLOCK}", f"--size={size}", "--invalidate=1",
                      *common], budget / 3)
    return (median, p99, float(_field(write, "write")["bw_bytes"]) / 1e6,
            float(_field(read, "read")["bw_bytes"]) / 1e6)


def _fio(fio: str, args: list[str], timeout: float) -> dict:
    """fio's first job's JSON object.

    Raises:
        _Fault: the job failed with a file system's errno (ENOSPC, EROFS, ...).
        TestError: fio did not run, ran past the time, or gave JSON without a job.
    """
    try:
        answer = run([fio, *args], max(5.0, timeout), check=False)
    except CommandTimeout as err:
        raise TestError(f"fio did not finish within {err.timeout:g}s") from err
    except CommandError as err:
        raise TestError(str(err)) from err
    text = answer.stdout
    start = text.find("{")  # fio prints errors ("fio: io_u error ...") before its JSON
    try:
        job = json.loads(text[start:])["jobs"][0] if start >= 0 else None
    except (ValueError, KeyError, IndexError, TypeError):
        job = None
    code = int(job.get("error", 0)) if isinstance(job, dict) else 0
    if code in _FAULTS:
        raise _Fault(f"{_FAULTS[code]} ({os.strerror(code)})")
    if not isinstance(job, dict) or code or answer.returncode != 0:
        for number, what in _FAULTS.items():
            if os.strerror(number) in answer.stderr + text:
                raise _Fault(f"{what} ({os.strerror(number)})")
        why = (answer.stderr or text).strip().splitlines()[-1:] or ["no output"]
        raise TestError(f"fio exited with status {answer.returncode}: {why[0]}")
    return job


def _field(job: dict, *keys: str) -> dict:
    found = job
    for key in keys:
        found = found.get(key) if isinstance(found, dict) else None
        if found is None:
            raise TestError(f"fio's JSON has no {'.'.join(keys)}")
    return found
