"""prolog_epilog.gpus: the Epilog's GPU release check and the Prolog's foreign-process check.

The main tests run the module with the real pynvml over the fake
libnvidia-ml (devcluster/fakenvml) in a child process (pynvml caches the library
per process and LD_LIBRARY_PATH is read at process start). The job's
process on GPU 1 is a real `sleep` listed as a `while_alive` process, so
the fake drops it and frees its memory when it dies, as the driver does.
The polling, kill and judging logic is also tested in-process with a small
stand-in for the pynvml module and a fake clock. A call blocked in the
driver is the fake's `process_list_delay_ms` (real pynvml, a real blocked C
call) and, in-process, a stand-in call that waits on an event.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from slurm_ext.devcluster import fakenvml
from slurm_ext.errors import SlurmExtError
from slurm_ext.prolog_epilog import gpus
from slurm_ext.prolog_epilog.gpus import GpuCheckError, GpuProcess, GpuUsage

MIB = 2**20
#: the driver's reserve on an idle GPU (the recorded H200's 615 MiB; NVML's v2 memory keeps it apart)
RESERVED_MIB = fakenvml.MEMORY_RESERVED // MIB
GIB = 2**30

# Runs in the child: argv[1] is a JSON request {"op": ..., ...}; prints one
# JSON line, {"value": ...} or {"error": ...} for a GpuCheckError. Any other
# exception (a pynvml one escaping, say) fails the child with a traceback.
CHILD = textwrap.dedent(
    """
    import dataclasses, json, os, signal, sys, time
    import pynvml
    from slurm_ext.devcluster import fakenvml
    from slurm_ext.prolog_epilog import gpus

    request = json.loads(sys.argv[1])
    op = request["op"]
    killed = []

    def kill(pid):
        killed.append(pid)
        os.kill(pid, signal.SIGKILL)

    def records(items):
        return [dataclasses.asdict(item) for item in items]

    try:
        if op == "usage":
            value = records(gpus.gpu_usage(request["gpus"]))
            value = {"first": value, "again": records(gpus.gpu_usage(request["gpus"])),
                     "refcount": pynvml._nvmlLib_refcount}
        elif op == "release":
            job = set(request["job_pids"])
            held = gpus.release_gpus(request["gpus"], lambda pid: pid in job, kill,
                                     threshold_mib=request["threshold_mib"], timeout=request["timeout"])
            value = {"held": records(held), "killed": killed}
        elif op == "foreign":
            value = records(gpus.foreign_processes(request["gpus"]))
        elif op == "hang":
            # the spec makes GPU 1's process lists block; the calls get `timeout` each
            def timed(read):
                started = time.monotonic()
                try:
                    return {"value": records(read()), "s": time.monotonic() - started}
                except gpus.GpuCheckError as err:
                    return {"error": str(err), "type": type(err).__name__, "gpu": err.gpu,
                            "s": time.monotonic() - started}

            first = timed(lambda: gpus.foreign_processes(request["gpus"], timeout=request["timeout"]))
            again = timed(lambda: gpus.gpu_usage([0], timeout=request["timeout"]))
            spec = json.loads(open(os.environ["SLURM_EXT_FAKE_NVML"]).read())
            for gpu in spec["gpus"]:
                gpu.pop("process_list_delay_ms", None)
            fakenvml.write_spec(os.environ["SLURM_EXT_FAKE_NVML"], spec)  # the GPU answers again
            waited = time.monotonic()
            while "error" in (later := timed(lambda: gpus.gpu_usage(request["gpus"], timeout=request["timeout"]))):
                if time.monotonic() - waited > 30:
                    break
                time.sleep(0.05)
            value = {"first": first, "again": again, "later": later}
        else:
            raise SystemExit(f"unknown op {op}")
        print(json.dumps({"value": value}))
    except gpus.GpuCheckError as err:
        print(json.dumps({"error": str(err), "gpu": err.gpu, "code": err.nvml_code,
                          "cause": type(err.__cause__).__name__}))
    """
)


@pytest.fixture(scope="session")
def fakenvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake library, built once per session; returns its directory."""
    return fakenvml.build(tmp_path_factory.mktemp("fakenvml-lib")).parent


@pytest.fixture
def spec_path(tmp_path: Path) -> Path:
    return tmp_path / "gpus.json"


@pytest.fixture
def sleeper():
    """A real `sleep` process, the job's process on the GPU; killed (by pid) and reaped at the end."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def run_child(lib_dir: Path, spec_path: Path, request: dict[str, Any], lib_path: Path | None = None) -> dict:
    env = {**os.environ, **fakenvml.environ(lib_path or lib_dir, spec_path)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(request)],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def job_spec(pid: int) -> dict[str, Any]:
    """Two GPUs; GPU 1 runs `pid` with 2 GiB while it lives, over a 100 MiB idle baseline."""
    spec = fakenvml.default_gpus(2)
    spec["gpus"][1]["memory_used"] = 100 * MIB
    spec["gpus"][1]["processes"] = [{"pid": pid, "used_memory": 2 * GIB, "while_alive": True}]
    return spec


# ---------------------------------------------------------------------------
# Real pynvml over the fake library
# ---------------------------------------------------------------------------

def test_release_kills_the_jobs_process_and_frees_the_gpu(fakenvml_lib: Path, spec_path: Path, sleeper) -> None:
    fakenvml.write_spec(spec_path, job_spec(sleeper.pid))
    got = run_child(fakenvml_lib, spec_path, {
        "op": "release", "gpus": [0, 1], "job_pids": [sleeper.pid], "threshold_mib": 512, "timeout": 5.0,
    })
    assert got == {"value": {"held": [], "killed": [sleeper.pid]}}
    assert sleeper.wait(timeout=10) == -signal.SIGKILL


def test_release_leaves_a_foreign_process_and_reports_the_gpu_held(
    fakenvml_lib: Path, spec_path: Path, sleeper
) -> None:
    spec = job_spec(sleeper.pid)
    fakenvml.write_spec(spec_path, spec)
    got = run_child(fakenvml_lib, spec_path, {
        "op": "release", "gpus": [0, 1], "job_pids": [], "threshold_mib": 512, "timeout": 0.3,
    })
    assert got == {"value": {"killed": [], "held": [{
        "gpu": 1,
        "uuid": spec["gpus"][1]["uuid"],
        "processes": [{"gpu": 1, "pid": sleeper.pid, "used_mib": 2048}],
        "used_mib": 2048 + 100,
        "reserved_mib": RESERVED_MIB,
    }]}}
    assert sleeper.poll() is None  # not the job's: never killed


def test_memory_above_threshold_without_a_process_is_held(fakenvml_lib: Path, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(2)
    spec["gpus"][0]["memory_used"] = 1 * GIB  # nothing listed, memory not freed
    spec["gpus"][1]["memory_used"] = 300 * MIB  # idle baseline, under the threshold
    fakenvml.write_spec(spec_path, spec)
    got = run_child(fakenvml_lib, spec_path, {
        "op": "release", "gpus": [0, 1], "job_pids": [], "threshold_mib": 512, "timeout": 0.2,
    })
    assert got == {"value": {"killed": [], "held": [
        {"gpu": 0, "uuid": spec["gpus"][0]["uuid"], "processes": [], "used_mib": 1024, "reserved_mib": RESERVED_MIB},
    ]}}


def test_foreign_processes_lists_the_process_on_gpu_1_only(fakenvml_lib: Path, spec_path: Path, sleeper) -> None:
    fakenvml.write_spec(spec_path, job_spec(sleeper.pid))
    got = run_child(fakenvml_lib, spec_path, {"op": "foreign", "gpus": [0, 1]})
    assert got == {"value": [{"gpu": 1, "pid": sleeper.pid, "used_mib": 2048}]}
    assert run_child(fakenvml_lib, spec_path, {"op": "foreign", "gpus": [0]}) == {"value": []}


def test_gpu_usage_merges_lists_and_keeps_nvml_initialised(fakenvml_lib: Path, spec_path: Path, sleeper) -> None:
    spec = job_spec(sleeper.pid)
    # The same process with a graphics context too, plus a graphics-only one.
    spec["gpus"][1]["graphics_processes"] = [
        {"pid": sleeper.pid, "used_memory": 2 * GIB, "while_alive": True},
        {"pid": 4242, "used_memory": 64 * MIB},
    ]
    fakenvml.write_spec(spec_path, spec)
    got = run_child(fakenvml_lib, spec_path, {"op": "usage", "gpus": [1, 0, 1]})["value"]
    assert got["first"] == [
        {"gpu": 1, "uuid": spec["gpus"][1]["uuid"], "used_mib": 2148, "reserved_mib": RESERVED_MIB, "processes": [
            {"gpu": 1, "pid": sleeper.pid, "used_mib": 2048},
            {"gpu": 1, "pid": 4242, "used_mib": 64},
        ]},
        {"gpu": 0, "uuid": spec["gpus"][0]["uuid"], "used_mib": 0, "reserved_mib": RESERVED_MIB, "processes": []},
    ]
    assert got["again"] == got["first"]
    assert got["refcount"] == 1  # initialised once, never shut down


def test_lost_gpu_is_a_check_error_naming_it(fakenvml_lib: Path, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(2)
    spec["gpus"][1]["lost"] = True
    fakenvml.write_spec(spec_path, spec)
    got = run_child(fakenvml_lib, spec_path, {
        "op": "release", "gpus": [0, 1], "job_pids": [], "threshold_mib": 512, "timeout": 1.0,
    })
    assert got["gpu"] == 1 and got["code"] == 15 and got["cause"] == "NVMLError_GpuIsLost"
    assert got["error"].startswith("gpu check: GPU 1: cannot read processes and memory: GPU is lost (NVML error 15)")
    assert "Xid 79" in got["error"] and "drain the node" in got["error"]


def test_missing_index_is_a_check_error_naming_it(fakenvml_lib: Path, spec_path: Path) -> None:
    fakenvml.write_spec(spec_path, fakenvml.default_gpus(2))
    got = run_child(fakenvml_lib, spec_path, {"op": "foreign", "gpus": [0, 5]})
    assert got == {
        "error": "gpu check: GPU 5: no such GPU: NVML has 2 (indexes 0-1); check SLURM_JOB_GPUS against gres.conf",
        "gpu": 5, "code": None, "cause": "NoneType",
    }


def test_driver_not_loaded_is_a_check_error(fakenvml_lib: Path, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(2)
    spec["init_error"] = "DRIVER_NOT_LOADED"
    fakenvml.write_spec(spec_path, spec)
    got = run_child(fakenvml_lib, spec_path, {"op": "foreign", "gpus": [0]})
    assert got == {
        "error": "gpu check: NVML: cannot initialise: Driver Not Loaded (NVML error 9); "
                 "load the NVIDIA kernel driver (nvidia-smi should list the GPUs)",
        "gpu": None, "code": 9, "cause": "NVMLError_DriverNotLoaded",
    }


def test_malformed_spec_init_failure_is_a_check_error(fakenvml_lib: Path, spec_path: Path) -> None:
    spec_path.write_text('{"gpus": [')
    got = run_child(fakenvml_lib, spec_path, {"op": "usage", "gpus": [0]})
    assert got == {
        "error": "gpu check: NVML: cannot initialise: Unknown Error (NVML error 999)",
        "gpu": None, "code": 999, "cause": "NVMLError_Unknown",
    }


def test_blocked_nvml_call_is_a_timeout_naming_the_gpu_not_a_wedged_hook(
    fakenvml_lib: Path, spec_path: Path
) -> None:
    """GPU 1's process list blocks in the (fake) driver for 2 s per call, as when a GPU falls off the
    bus: the Prolog's check must give up after its timeout, naming GPU 1; while that call is still
    blocked, the next check fails at once instead of blocking another thread; once the GPU answers
    again, checks work."""
    spec = fakenvml.default_gpus(2)
    spec["gpus"][1]["process_list_delay_ms"] = 2000
    fakenvml.write_spec(spec_path, spec)
    got = run_child(fakenvml_lib, spec_path, {"op": "hang", "gpus": [0, 1], "timeout": 0.3})["value"]
    first, again, later = got["first"], got["again"], got["later"]
    assert (first.get("type"), first.get("gpu")) == ("GpuCheckTimeout", 1), first
    # the blocked call returns after 2 s: a check that answered before then did not wait for it
    assert first["s"] < 2.0, f"the check waited {first['s']:.1f}s for a blocked NVML call"
    assert first["error"].startswith(
        "gpu check: GPU 1: NVML did not answer within 0.3s reading processes and memory of GPU 1: ")
    assert "check dmesg for Xid errors" in first["error"] and "drain the node" in first["error"]
    assert (again.get("type"), again.get("gpu")) == ("GpuCheckTimeout", 1), again
    # not a second timeout: the check never went to the driver that has a call blocked
    assert "an earlier NVML call has been blocked for" in again["error"], again
    assert [u["gpu"] for u in later.get("value", [])] == [0, 1], later


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="a real libnvidia-ml is installed")
def test_missing_library_is_a_check_error(fakenvml_lib: Path, spec_path: Path, tmp_path: Path) -> None:
    fakenvml.write_spec(spec_path, fakenvml.default_gpus(1))
    empty = tmp_path / "no-lib"
    empty.mkdir()
    got = run_child(fakenvml_lib, spec_path, {"op": "foreign", "gpus": [0]}, lib_path=empty)
    assert got["code"] == 12 and got["gpu"] is None and got["cause"] == "NVMLError_LibraryNotFound"
    assert "libnvidia-ml.so.1" in got["error"]


# ---------------------------------------------------------------------------
# In-process, with a stand-in for pynvml
# ---------------------------------------------------------------------------

class FakeNVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 9: "Driver Not Loaded", 999: "Unknown Error"}.get(self.value, "error")


class FakeNvml:
    """The parts of pynvml that gpus uses. `gpus` maps index -> dict with
    used (bytes), compute / graphics (lists of (pid, bytes)), or an int
    (an NVML error code) instead of a list to make that call fail."""

    NVMLError = FakeNVMLError

    def __init__(self, gpus: dict[int, dict[str, Any]], init_errors: list[int] | None = None):
        self.gpus = gpus
        self.init_errors = list(init_errors or [])
        self.inits = 0

    def nvmlInit(self) -> None:
        if self.init_errors:
            raise FakeNVMLError(self.init_errors.pop(0))
        self.inits += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-{handle}".encode()  # old pynvml: bytes

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=self.gpus[handle].get("used", 0), free=0)  # v1 nvmlMemory_t's fields we read

    def _list(self, handle: int, key: str) -> list[SimpleNamespace]:
        value = self.gpus[handle].get(key, [])
        if isinstance(value, int):
            raise FakeNVMLError(value)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in value]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return self._list(handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return self._list(handle, "graphics")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_merge_dedups_by_pid_keeping_order_and_largest_memory() -> None:
    nvml = FakeNvml({0: {
        "used": 3 * GIB,
        "compute": [(10, 1 * GIB), (11, None), (10, 1 * GIB)],
        "graphics": [(12, 5 * MIB), (10, 2 * GIB)],
    }})
    assert gpus.gpu_usage([0], nvml) == [GpuUsage(0, "GPU-0", (
        GpuProcess(0, 10, 2048), GpuProcess(0, 11, 0), GpuProcess(0, 12, 5),
    ), 3072)]


def test_not_supported_process_list_counts_as_empty_other_errors_do_not() -> None:
    nvml = FakeNvml({0: {"compute": [(10, MIB)], "graphics": 3}, 1: {"compute": 999}})
    assert gpus.gpu_usage([0], nvml)[0].processes == (GpuProcess(0, 10, 1),)
    with pytest.raises(GpuCheckError) as caught:
        gpus.gpu_usage([0, 1], nvml)
    assert caught.value.gpu == 1 and caught.value.nvml_code == 999
    assert isinstance(caught.value, SlurmExtError) and isinstance(caught.value.__cause__, FakeNVMLError)
    assert str(caught.value) == "gpu check: GPU 1: cannot read processes and memory: Unknown Error (NVML error 999)"


def test_init_once_per_process_across_threads_and_failure_not_cached() -> None:
    nvml = FakeNvml({0: {}}, init_errors=[9])
    with pytest.raises(GpuCheckError, match="Driver Not Loaded"):
        gpus.gpu_usage([0], nvml)
    assert nvml.inits == 0
    threads = [threading.Thread(target=gpus.gpu_usage, args=([0], nvml)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gpus.gpu_usage([0], nvml)
    assert nvml.inits == 1


def test_negative_index_and_no_gpus_are_named() -> None:
    with pytest.raises(GpuCheckError, match=r"^gpu check: GPU -1: no such GPU: NVML has 1 \(indexes 0-0\)"):
        gpus.gpu_usage([-1], FakeNvml({0: {}}))
    with pytest.raises(GpuCheckError, match=r"^gpu check: GPU 0: no such GPU: NVML has 0 \(no GPUs\)"):
        gpus.gpu_usage([0], FakeNvml({}))


def test_held_gpus_judges_processes_and_memory() -> None:
    free = GpuUsage(0, "GPU-0", (), 512)
    busy = GpuUsage(1, "GPU-1", (GpuProcess(1, 7, 0),), 0)
    leaked = GpuUsage(2, "GPU-2", (), 513)
    assert gpus.held_gpus([free, busy, leaked], threshold_mib=512) == [busy, leaked]


def test_release_polls_until_freed_and_kills_each_job_pid_once() -> None:
    # Job process 10 dies two polls after its kill; 20 is the job's but already gone.
    nvml = FakeNvml({0: {"compute": [(10, GIB), (20, GIB)]}, 1: {}})
    clock = FakeClock()
    kills: list[int] = []
    judged: list[int] = []
    polls_left = {10: 2}

    def kill(pid: int) -> None:
        kills.append(pid)
        if pid == 20:
            nvml.gpus[0]["compute"] = [(10, GIB)]
            raise ProcessLookupError(pid)

    def tick(seconds: float) -> None:
        clock.sleep(seconds)
        polls_left[10] -= 1
        if polls_left[10] == 0:
            nvml.gpus[0]["compute"] = []

    def is_job(pid: int) -> bool:
        judged.append(pid)
        return True

    held = gpus.release_gpus([0, 1], is_job, kill, threshold_mib=100, timeout=5.0, nvml=nvml,
                             clock=clock, sleep=tick)
    assert held == []
    assert kills == [10, 20] and judged == [10, 20]
    assert clock.sleeps == [gpus.POLL_INTERVAL_S] * 2


def test_release_gives_up_at_timeout_and_returns_the_last_reading() -> None:
    nvml = FakeNvml({0: {"compute": [(30, GIB)], "used": GIB}})
    clock = FakeClock()
    held = gpus.release_gpus(iter([0]), lambda pid: False, lambda pid: pytest.fail("killed a foreign pid"),
                             threshold_mib=100, timeout=0.25, nvml=nvml, clock=clock, sleep=clock.sleep)
    assert held == [GpuUsage(0, "GPU-0", (GpuProcess(0, 30, 1024),), 1024)]
    assert clock.sleeps == pytest.approx([0.1, 0.1, 0.05])
    assert clock.now == pytest.approx(100.25)


def test_release_with_zero_timeout_reads_once() -> None:
    nvml = FakeNvml({0: {"used": GIB}})
    clock = FakeClock()
    held = gpus.release_gpus([0], lambda pid: True, lambda pid: None, threshold_mib=100, timeout=0,
                             nvml=nvml, clock=clock, sleep=clock.sleep)
    assert [u.gpu for u in held] == [0] and clock.sleeps == []


class BlockingNvml(FakeNvml):
    """FakeNvml whose compute process list blocks until `unblock` is set (a call stuck in the driver)."""

    def __init__(self, gpus: dict[int, dict[str, Any]]):
        super().__init__(gpus)
        self.unblock = threading.Event()
        self.entered = 0

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        self.entered += 1
        self.unblock.wait(30)
        return super().nvmlDeviceGetComputeRunningProcesses(handle)


def test_release_gives_up_on_a_blocked_nvml_and_recovers_when_it_returns() -> None:
    nvml = BlockingNvml({0: {"compute": [(10, GIB)]}})
    started = time.monotonic()
    with pytest.raises(gpus.GpuCheckTimeout) as caught:
        gpus.release_gpus([0], lambda pid: True, lambda pid: None, threshold_mib=100, nvml=nvml, nvml_timeout=0.2)
    assert time.monotonic() - started < 2
    assert isinstance(caught.value, GpuCheckError) and caught.value.gpu == 0 and caught.value.seconds == 0.2
    with pytest.raises(gpus.GpuCheckTimeout, match="an earlier NVML call has been blocked"):
        gpus.foreign_processes([0], nvml, timeout=5)
    assert nvml.entered == 1, "asked a driver that still has a call blocked"
    nvml.unblock.set()
    deadline = time.monotonic() + 10
    while True:
        try:
            assert gpus.foreign_processes([0], nvml) == [GpuProcess(0, 10, 1024)]
            break
        except gpus.GpuCheckTimeout:
            assert time.monotonic() < deadline, "the blocked call returned but checks still fail"
            time.sleep(0.01)


def test_a_blocked_call_of_one_nvml_does_not_fail_another() -> None:
    blocked = BlockingNvml({0: {}})
    with pytest.raises(gpus.GpuCheckTimeout):
        gpus.gpu_usage([0], blocked, timeout=0.1)
    try:
        assert gpus.gpu_usage([0], FakeNvml({0: {"used": GIB}})) == [GpuUsage(0, "GPU-0", (), 1024)]
    finally:
        blocked.unblock.set()
