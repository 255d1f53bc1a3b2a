"""The fake libnvidia-ml.so.1 (devcluster/fakenvml) seen through the real pynvml.

pynvml loads the library once per process and caches it, and the loader
reads LD_LIBRARY_PATH only at process start, so every scenario runs pynvml
in a child process.  Scenarios that change the spec file while pynvml runs
drive a long-lived child (`PynvmlChild`) one Python expression at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_ext.devcluster import fakenvml

GIB = 1024**3

# Runs in the child: each request is one JSON-encoded string of Python
# code; an expression answers {"value": ...}, statements answer null, an
# exception answers {"error": class name}.
CHILD_LOOP = textwrap.dedent(
    """
    import json, sys, time
    import pynvml as n

    def timed(fn, *args):
        start = time.monotonic()
        try:
            value = fn(*args)
        finally:
            timed.elapsed = time.monotonic() - start
        return value

    scope = {"n": n, "time": time, "timed": timed}
    for line in sys.stdin:
        source = json.loads(line)
        try:
            try:
                code, mode = compile(source, "<cmd>", "eval"), "eval"
            except SyntaxError:
                code, mode = compile(source, "<cmd>", "exec"), "exec"
            value = eval(code, scope) if mode == "eval" else exec(code, scope)
            reply = {"value": value}
        except Exception as exc:
            reply = {"error": type(exc).__name__, "message": str(exc)}
        print(json.dumps(reply, default=repr), flush=True)
    """
)


@pytest.fixture(scope="session")
def fakenvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake library, built once per session; returns its directory."""
    return fakenvml.build(tmp_path_factory.mktemp("fakenvml-lib")).parent


def child_env(lib_dir: Path, spec_path: Path, dev_dir: Path | None = None) -> dict[str, str]:
    return {**os.environ, **fakenvml.environ(lib_dir, spec_path, dev_dir=dev_dir)}


def run_pynvml(lib_dir: Path, spec_path: Path, code: str, timeout: float = 30,
               dev_dir: Path | None = None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter using the fake; it may print JSON."""
    return subprocess.run(
        [sys.executable, "-c", "import pynvml as n\n" + textwrap.dedent(code)],
        env=child_env(lib_dir, spec_path, dev_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_json(lib_dir: Path, spec_path: Path, code: str, dev_dir: Path | None = None) -> Any:
    proc = run_pynvml(lib_dir, spec_path, code, dev_dir=dev_dir)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


class PynvmlChild:
    """A pynvml process that stays alive while the test rewrites the spec."""

    def __init__(self, lib_dir: Path, spec_path: Path, dev_dir: Path | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD_LOOP],
            env=child_env(lib_dir, spec_path, dev_dir),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr: str | None = None

    def send(self, code: str) -> None:
        self.proc.stdin.write(json.dumps(textwrap.dedent(code)) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        reply = self.proc.stdout.readline()
        assert reply, f"child died: {self.proc.stderr.read()}"
        return json.loads(reply)

    def __call__(self, line: str) -> Any:
        """Evaluate `line` in the child; return its value or raise AssertionError."""
        self.send(line)
        reply = self.receive()
        assert "error" not in reply, f"{line!r} raised {reply}"
        return reply["value"]

    def error(self, line: str) -> str:
        """Evaluate `line`, which must raise; return the exception class name."""
        self.send(line)
        reply = self.receive()
        assert "error" in reply, f"{line!r} did not raise, returned {reply}"
        return reply["error"]

    def close(self) -> str:
        """End the child (idempotent) and return its stderr."""
        if self.stderr is None:
            self.proc.stdin.close()
            self.stderr = self.proc.stderr.read()
            self.proc.wait(timeout=10)
            self.proc.stdout.close()
            self.proc.stderr.close()
        return self.stderr


@pytest.fixture
def spec_path(tmp_path: Path) -> Path:
    return tmp_path / "gpus.json"


@pytest.fixture
def child_factory(fakenvml_lib: Path):
    children: list[PynvmlChild] = []

    def make(spec: Path, dev_dir: Path | None = None) -> PynvmlChild:
        child = PynvmlChild(fakenvml_lib, spec, dev_dir)
        children.append(child)
        return child

    yield make
    for child in children:
        if child.stderr is None and child.proc.poll() is None:
            child.proc.kill()
        child.close()


# ---------------------------------------------------------------------------
# Reading configured devices
# ---------------------------------------------------------------------------

def detailed_spec() -> dict[str, Any]:
    """Two GPUs with values that differ from every default."""
    return {
        "driver_version": "560.35.03",
        "nvml_version": "12.560.35.03",
        "cuda_driver_version": 12060,
        "gpus": [
            {
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": "GPU-11111111-2222-3333-4444-555555555555",
                "minor": 3,
                "pci_bus_id": "00000000:1B:00.0",
                "serial": "1321021000042",
                "memory_total": 80 * GIB,
                "memory_reserved": 1 * GIB,
                "memory_used": 5 * GIB,
                "utilization_gpu": 87,
                "utilization_memory": 41,
                "temperature": 66,
                "power_usage": 512_345,
                "power_limit": 650_000,
                "cpu_affinity": [0, 1, 2, 3, 64, 65],
                "nvlink_peers": ["00000000:43:00.0", "00000000:43:00.0"],
                "nvlink_count": 18,  # Hopper's, two of them to the other GPU
                "ecc": {
                    "volatile": {"corrected": 3, "uncorrected": 1},
                    "aggregate": {"corrected": 30, "uncorrected": 2},
                },
                "remapped_rows": {"corrected": 4, "uncorrected": 1, "pending": True, "failure": 0},
                "processes": [
                    {"pid": 4242, "used_memory": 3 * GIB},
                    {"pid": 4343, "used_memory": 2 * GIB},
                ],
            },
            {
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": "GPU-66666666-7777-8888-9999-000000000000",
                "minor": 7,
                "pci_bus_id": "00000000:43:00.0",
                "mig_devices": [
                    {"uuid": "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", "memory_total": 10 * GIB},
                    {"uuid": "MIG-ffffffff-bbbb-cccc-dddd-eeeeeeeeeeee", "memory_total": 20 * GIB},
                ],
            },
        ],
    }


def test_pynvml_reads_configured_devices(fakenvml_lib: Path, spec_path: Path) -> None:
    fakenvml.write_spec(spec_path, detailed_spec())
    got = run_json(
        fakenvml_lib,
        spec_path,
        """
        import json
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        h1 = n.nvmlDeviceGetHandleByIndex(1)
        pci = n.nvmlDeviceGetPciInfo(h)
        mem = n.nvmlDeviceGetMemoryInfo(h)
        mem2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
        util = n.nvmlDeviceGetUtilizationRates(h)
        remote = n.nvmlDeviceGetNvLinkRemotePciInfo(h, 1)
        migs = [n.nvmlDeviceGetMigDeviceHandleByIndex(h1, i) for i in range(2)]
        out = {
            "driver": n.nvmlSystemGetDriverVersion(),
            "nvml": n.nvmlSystemGetNVMLVersion(),
            "cuda": n.nvmlSystemGetCudaDriverVersion(),
            "count": n.nvmlDeviceGetCount(),
            "name": n.nvmlDeviceGetName(h),
            "uuid": n.nvmlDeviceGetUUID(h),
            "minor": n.nvmlDeviceGetMinorNumber(h),
            "serial": n.nvmlDeviceGetSerial(h),
            "bus_id": pci.busId,
            "bus_id_legacy": pci.busIdLegacy,
            "pci": [pci.domain, pci.bus, pci.device],
            "by_pci": n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByPciBusId("0000:43:00.0")),
            "by_uuid": n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID("GPU-66666666-7777-8888-9999-000000000000")),
            "mem": [mem.total, mem.used, mem.free],
            "mem2": [mem2.total, mem2.reserved, mem2.used, mem2.free],
            "util": [util.gpu, util.memory],
            "temp": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
            "power": n.nvmlDeviceGetPowerUsage(h),
            "limit": n.nvmlDeviceGetEnforcedPowerLimit(h),
            "affinity": list(n.nvmlDeviceGetCpuAffinity(h, 2)),
            "affinity_scope": list(n.nvmlDeviceGetCpuAffinityWithinScope(h, 2, n.NVML_AFFINITY_SCOPE_NODE)),
            "links": [n.nvmlDeviceGetNvLinkState(h, link) for link in range(4)],
            "remote": remote.busId,
            "remote_device_id": remote.pciDeviceId,
            "mig_mode": [n.nvmlDeviceGetMigMode(h), n.nvmlDeviceGetMigMode(h1)],
            "mig_max": n.nvmlDeviceGetMaxMigDeviceCount(h1),
            "mig_uuids": [n.nvmlDeviceGetUUID(m) for m in migs],
            "mig_is_mig": [n.nvmlDeviceIsMigDeviceHandle(m).value for m in migs]
            + [n.nvmlDeviceIsMigDeviceHandle(h1).value],
            "mig_parent": n.nvmlDeviceGetUUID(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migs[1])),
            "mig_mem": [n.nvmlDeviceGetMemoryInfo(m).total for m in migs],
            "ecc_mode": n.nvmlDeviceGetEccMode(h),
            "ecc": [
                n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
                n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
                n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_AGGREGATE_ECC),
                n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC),
            ],
            "remapped": list(n.nvmlDeviceGetRemappedRows(h)),
            "procs": [[p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
            "procs_v2": [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses_v2(h)],
            "no_procs": n.nvmlDeviceGetComputeRunningProcesses(h1),
        }
        n.nvmlShutdown()
        print(json.dumps(out))
        """,
    )
    assert got["driver"] == "560.35.03"
    assert got["nvml"] == "12.560.35.03"
    assert got["cuda"] == 12060
    assert got["count"] == 2
    assert got["name"] == "NVIDIA H100 80GB HBM3"
    assert got["uuid"] == "GPU-11111111-2222-3333-4444-555555555555"
    assert got["minor"] == 3
    assert got["serial"] == "1321021000042"
    assert got["bus_id"] == "00000000:1B:00.0"
    assert got["bus_id_legacy"] == "0000:1B:00.0"
    assert got["pci"] == [0, 0x1B, 0]
    assert got["by_pci"] == "GPU-66666666-7777-8888-9999-000000000000"
    assert got["by_uuid"] == 1
    # v1 counts the driver's reserve as used; v2 keeps it apart
    assert got["mem"] == [80 * GIB, 6 * GIB, 74 * GIB]
    assert got["mem2"] == [80 * GIB, 1 * GIB, 5 * GIB, 74 * GIB]
    assert got["util"] == [87, 41]
    assert got["temp"] == 66
    assert got["power"] == 512_345
    assert got["limit"] == 650_000
    assert got["affinity"] == [0b1111, 0b11]
    assert got["affinity_scope"] == [0b1111, 0b11]
    assert got["links"] == [1, 1, 0, 0]
    assert got["remote"] == "00000000:43:00.0"
    assert got["remote_device_id"] == 0x233510DE  # the peer GPU's default id
    assert got["mig_mode"] == [[0, 0], [1, 1]]
    assert got["mig_max"] == 7
    assert got["mig_uuids"] == [
        "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        "MIG-ffffffff-bbbb-cccc-dddd-eeeeeeeeeeee",
    ]
    assert got["mig_is_mig"] == [1, 1, 0]
    assert got["mig_parent"] == "GPU-66666666-7777-8888-9999-000000000000"
    assert got["mig_mem"] == [10 * GIB, 20 * GIB]
    assert got["ecc_mode"] == [1, 1]
    assert got["ecc"] == [3, 1, 30, 2]
    assert got["remapped"] == [4, 1, 1, 0]
    assert got["procs"] == [[4242, 3 * GIB], [4343, 2 * GIB]]
    assert got["procs_v2"] == [4242, 4343]
    assert got["no_procs"] == []


def test_nvlink_beyond_device_links_is_not_supported(fakenvml_lib: Path, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(2)
    spec["gpus"][0]["nvlink_count"] = 18  # Hopper's 18, one of them to a peer
    fakenvml.write_spec(spec_path, spec)
    got = run_json(
        fakenvml_lib,
        spec_path,
        """
        import json
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out = {}
        for link in (0, 1, 17, 18, n.NVML_NVLINK_MAX_LINKS):
            try:
                out[link] = n.nvmlDeviceGetNvLinkState(h, link)
            except n.NVMLError as exc:
                out[link] = type(exc).__name__
        try:
            n.nvmlDeviceGetNvLinkRemotePciInfo(h, 1)
        except n.NVMLError as exc:
            out["inactive_remote"] = type(exc).__name__
        print(json.dumps(out))
        """,
    )
    assert got == {
        "0": 1,
        "1": 0,
        "17": 0,
        "18": "NVMLError_NotSupported",
        "36": "NVMLError_InvalidArgument",
        "inactive_remote": "NVMLError_NotSupported",
    }


def test_a_gpu_without_nvlink_and_a_driver_that_answers_invalid_argument_past_the_last_link(
        fakenvml_lib: Path, spec_path: Path) -> None:
    """No peers: no NVLink, link 0 NOT_SUPPORTED (the recorded H200); `nvlink_past_last` INVALID_ARGUMENT: what a
    GB200 driver answers past its last link. MIG off: the instance ids are INVALID_ARGUMENT, as recorded."""
    spec = fakenvml.default_gpus(3)
    spec["gpus"][0].update(nvlink_peers=[], nvlink_count=0)
    spec["gpus"][1].update(nvlink_count=2, nvlink_past_last="INVALID_ARGUMENT")
    fakenvml.write_spec(spec_path, spec)
    got = run_json(
        fakenvml_lib,
        spec_path,
        """
        import json
        n.nvmlInit()
        def call(fn, *args):
            try:
                return fn(*args)
            except n.NVMLError as exc:
                return type(exc).__name__
        hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(3)]
        print(json.dumps({
            "links": [[call(n.nvmlDeviceGetNvLinkState, h, link) for link in (0, 1, 2)] for h in hs],
            "ids": [call(n.nvmlDeviceGetGpuInstanceId, hs[0]), call(n.nvmlDeviceGetComputeInstanceId, hs[0])],
        }))
        """,
    )
    # GPU 2 as default_gpus leaves it: a link per peer, all active, none past them
    assert got["links"] == [["NVMLError_NotSupported"] * 3, [1, 1, "NVMLError_InvalidArgument"],
                            [1, 1, "NVMLError_NotSupported"]]
    assert got["ids"] == ["NVMLError_InvalidArgument"] * 2


# ---------------------------------------------------------------------------
# Latency: what a call costs on the recorded GPU
# ---------------------------------------------------------------------------

def test_the_recorded_latency_table_is_the_recorded_h200s() -> None:
    """latency_recorded.h (the spec's "latency": "recorded") is what the idle H200's recording gives, nothing else."""
    from slurm_ext import nvmlrecord
    recording = nvmlrecord.read(Path(__file__).parent / "data" / "real-gpu" / "h200-580-idle.json")
    header = (fakenvml.source_dir() / "latency_recorded.h").read_text()
    assert header == fakenvml.latency_header(recording), "regenerate it with fakenvml.latency_header()"
    table = fakenvml.recorded_latency(recording)
    # pynvml's calls land on the entry points it resolves: nvmlInit -> nvmlInitWithFlags, GetCount -> _v2
    assert table["nvmlInitWithFlags"] == 12.8 and table["nvmlDeviceGetCount_v2"] == 0.015
    assert table["nvmlDeviceGetTemperatureThreshold#1"] == 2.79 and table["nvmlDeviceGetCpuAffinity"] == 12.793
    assert not [name for name in table if name.startswith("nvmlEventSetWait")]


def test_latency_recorded_or_per_call_makes_calls_take_their_time(child_factory, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(1)
    spec["latency"] = "recorded"
    fakenvml.write_spec(spec_path, spec)
    child = child_factory(spec_path)
    child("n.nvmlInit()")
    child("h = n.nvmlDeviceGetHandleByIndex(0)")
    # the recorded H200's costliest calls: total energy 4.32 ms, the slowdown threshold 2.79 ms
    assert child("[timed(n.nvmlDeviceGetTotalEnergyConsumption, h), timed.elapsed][1]") >= 0.00432
    assert child("[timed(n.nvmlDeviceGetTemperatureThreshold, h, 1), timed.elapsed][1]") >= 0.00279

    # a map of entry points, with a selector after # (a threshold's or clock's type)
    spec["latency"] = {"nvmlDeviceGetClockInfo#1": 200, "nvmlDeviceGetUUID": 150.5}
    fakenvml.write_spec(spec_path, spec)
    assert child("[timed(n.nvmlDeviceGetClockInfo, h, 1), timed.elapsed][1]") >= 0.2
    assert child("[timed(n.nvmlDeviceGetClockInfo, h, 2), timed.elapsed][1]") < 0.1
    assert child("[timed(n.nvmlDeviceGetUUID, h), timed.elapsed][1]") >= 0.15
    assert child("[timed(n.nvmlDeviceGetTotalEnergyConsumption, h), timed.elapsed][1]") < 0.1
    assert child.close() == ""


@pytest.mark.parametrize("latency, message", [
    ("fast", 'latency: expected "recorded" or an object of entry points and ms'),
    ({"GetUUID": 1}, "latency.GetUUID: expected an NVML entry point"),
    ({"nvmlDeviceGetUUID": -1}, "latency.nvmlDeviceGetUUID: expected milliseconds from 0 to 60000"),
    ({"nvmlDeviceGetClockInfo#sm": 1}, "latency.nvmlDeviceGetClockInfo#sm: the selector after # must be"),
])
def test_a_bad_latency_is_refused_with_its_path(fakenvml_lib: Path, spec_path: Path, latency, message: str) -> None:
    fakenvml.write_spec(spec_path, {"count": 1, "latency": latency})
    proc = run_pynvml(fakenvml_lib, spec_path, "n.nvmlInit()")
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------
# Thermal limits, field values, PCIe link, NVLink fabric, energy
# ---------------------------------------------------------------------------

def test_temperature_thresholds_defaults_overrides_and_unreported(fakenvml_lib: Path, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(2)
    # slowdown null and mem_max absent keep their defaults; -1: this GPU does not report it
    spec["gpus"][1]["temperature_thresholds"] = {"shutdown": 97, "slowdown": None, "gpu_max": -1}
    fakenvml.write_spec(spec_path, spec)
    got = run_json(
        fakenvml_lib,
        spec_path,
        """
        import json
        n.nvmlInit()
        def threshold(h, kind):
            try:
                return n.nvmlDeviceGetTemperatureThreshold(h, kind)
            except n.NVMLError as exc:
                return type(exc).__name__
        kinds = [n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
                 n.NVML_TEMPERATURE_THRESHOLD_GPU_MAX, n.NVML_TEMPERATURE_THRESHOLD_MEM_MAX]
        others = [n.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN, n.NVML_TEMPERATURE_THRESHOLD_GPS_CURR,
                  n.NVML_TEMPERATURE_THRESHOLD_COUNT, 1000]
        hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
        print(json.dumps({
            "kinds": kinds,
            "values": [[threshold(h, k) for k in kinds] for h in hs],
            "others": [threshold(hs[0], k) for k in others],
        }))
        """,
    )
    assert got["kinds"] == [0, 1, 3, 2]  # pynvml's enum values: SHUTDOWN, SLOWDOWN, GPU_MAX, MEM_MAX
    # the recorded H200's: shutdown 95, slowdown 89, GPU max 87, memory max not reported
    assert got["values"] == [[95, 89, 87, "NVMLError_NotSupported"], [97, 89, "NVMLError_NotSupported",
                                                                       "NVMLError_NotSupported"]]
    assert got["others"] == ["NVMLError_NotSupported"] * 4


def test_field_values_memory_temperature_recovery_action_replay_counter(fakenvml_lib: Path,
                                                                       spec_path: Path) -> None:
    spec = fakenvml.default_gpus(2)
    spec["gpus"][1].update(memory_temperature=71, gpu_recovery_action=1, pcie_replay_counter=12,
                           remapped_rows={"uncorrected": 2})
    fakenvml.write_spec(spec_path, spec)
    got = run_json(
        fakenvml_lib,
        spec_path,
        """
        import json, time
        n.nvmlInit()
        ids = [n.NVML_FI_DEV_MEMORY_TEMP, (n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 3),
               n.NVML_FI_DEV_PCIE_REPLAY_COUNTER, n.NVML_FI_DEV_ECC_CURRENT, 99999, n.NVML_FI_DEV_REMAPPED_UNC,
               n.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL]
        out = {"ids": [n.NVML_FI_DEV_MEMORY_TEMP, n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
                       n.NVML_FI_DEV_PCIE_REPLAY_COUNTER, n.NVML_GPU_RECOVERY_ACTION_GPU_RESET]}
        for i in range(2):
            before = time.time_ns() // 1000
            values = n.nvmlDeviceGetFieldValues(n.nvmlDeviceGetHandleByIndex(i), ids)
            after = time.time_ns() // 1000
            out[i] = [[v.fieldId, v.scopeId, v.valueType, v.nvmlReturn, v.value.uiVal, v.value.ullVal,
                       v.latencyUsec, before <= v.timestamp <= after] for v in values]
        print(json.dumps(out))
        """,
    )
    assert got["ids"] == [82, 230, 94, 1]
    ok, unsupported, uint, ull = 0, 3, 1, 3  # NVML_SUCCESS, NOT_SUPPORTED, NVML_VALUE_TYPE_UNSIGNED_INT, _LONG_LONG

    def expected(memory_temp: int, action: int, replays: int, uncorrectable: int) -> list[list[Any]]:
        return [
            [82, 0, uint, ok, memory_temp, memory_temp, 0, True],
            [230, 3, uint, ok, action, action, 0, True],  # scopeId as given
            [94, 0, uint, ok, replays, replays, 0, True],
            [1, 0, 0, unsupported, 0, 0, 0, True],  # the call succeeds; this value does not (value type 0)
            [99999, 0, 0, unsupported, 0, 0, 0, True],
            [143, 0, ull, ok, uncorrectable, uncorrectable, 0, True],  # as the recorded H200: unsigned long long
            [38, 0, 0, unsupported, 0, 0, 0, True],  # NVLink CRC on a GPU without NVLink, as recorded
        ]

    assert got["0"] == expected(39, 0, 0, 0)  # the recorded H200's memory temperature, idle
    assert got["1"] == expected(71, 1, 12, 2)


def test_pcie_link_generation_and_width(fakenvml_lib: Path, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(3)
    # a Gen5 GPU in a Gen4 slot whose link trained down to x8; a link narrower than the slot
    spec["gpus"][1]["pcie"] = {"gen": 3, "width": 8, "max_gen": 4, "max_width": 16, "gpu_max_gen": 5}
    spec["gpus"][2]["pcie"] = {"width": 4, "gen": None}
    fakenvml.write_spec(spec_path, spec)
    got = run_json(
        fakenvml_lib,
        spec_path,
        """
        import json
        n.nvmlInit()
        out = []
        for i in range(3):
            h = n.nvmlDeviceGetHandleByIndex(i)
            out.append([n.nvmlDeviceGetCurrPcieLinkGeneration(h), n.nvmlDeviceGetCurrPcieLinkWidth(h),
                        n.nvmlDeviceGetMaxPcieLinkGeneration(h), n.nvmlDeviceGetMaxPcieLinkWidth(h),
                        n.nvmlDeviceGetGpuMaxPcieLinkGeneration(h)])
        print(json.dumps(out))
        """,
    )
    assert got == [[5, 16, 5, 16, 5], [3, 8, 4, 16, 5], [5, 4, 5, 16, 5]]


def test_gpu_fabric_info_absent_present_and_failing(fakenvml_lib: Path, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(5)
    spec["gpus"][1]["fabric"] = {"clique_id": 7, "cluster_uuid": "0123456789abcdef0123456789ABCDEF",
                                 "health_mask": 0x1A}
    spec["gpus"][2]["fabric"] = {"state": 2, "status": "NOT_READY",
                                 "cluster_uuid": "11223344-5566-7788-99aa-bbccddeeff00"}
    spec["gpus"][3]["fabric"] = {}
    spec["gpus"][4]["fabric"] = "NOT_SUPPORTED"  # a driver that does not answer fabric calls at all
    fakenvml.write_spec(spec_path, spec)
    got = run_json(
        fakenvml_lib,
        spec_path,
        """
        import json
        n.nvmlInit()
        def call(fn):
            try:
                return fn()
            except n.NVMLError as exc:
                return type(exc).__name__
        def plain(h):
            info = n.c_nvmlGpuFabricInfo_t()
            n.nvmlDeviceGetGpuFabricInfo(h, n.byref(info))
            return [bytes(info.clusterUuid).hex(), info.status, info.cliqueId, info.state]
        def versioned(h, struct, version=None):
            info = struct()
            info.healthMask = 0xDEAD
            if hasattr(info, "healthSummary"):
                info.healthSummary = 0xAB
            if version is not None:
                info.version = version
            n.nvmlDeviceGetGpuFabricInfoV(h, n.byref(info))
            got = [info.version, bytes(info.clusterUuid).hex(), info.status, info.cliqueId, info.state,
                   info.healthMask]
            return got + [info.healthSummary] if hasattr(info, "healthSummary") else got
        out = []
        for i in range(5):
            h = n.nvmlDeviceGetHandleByIndex(i)
            out.append([call(lambda: plain(h)), call(lambda: versioned(h, n.c_nvmlGpuFabricInfoV_t)),
                        call(lambda: versioned(h, n.c_nvmlGpuFabricInfo_v3_t))])
        h1 = n.nvmlDeviceGetHandleByIndex(1)
        print(json.dumps({
            "gpus": out,
            "bad_version": call(lambda: versioned(h1, n.c_nvmlGpuFabricInfoV_t, 0x01000024)),
            "constants": [n.nvmlGpuFabricInfo_v2, n.nvmlGpuFabricInfo_v3, n.NVML_GPU_FABRIC_STATE_COMPLETED],
        }))
        """,
    )
    assert got["constants"] == [0x02000024, 0x03000028, 3]
    v2, v3 = 0x02000024, 0x03000028
    uuid1, uuid2, zero = "0123456789abcdef0123456789abcdef", "112233445566778899aabbccddeeff00", "00" * 16
    # absent: a GPU that is not in an NVLink fabric answers, with state NOT_SUPPORTED (0), as the recorded H200
    assert got["gpus"][0] == [[zero, 0, 0, 0], [v2, zero, 0, 0, 0, 0], [v3, zero, 0, 0, 0, 0, 0]]
    assert got["gpus"][1] == [[uuid1, 0, 7, 3], [v2, uuid1, 0, 7, 3, 0x1A], [v3, uuid1, 0, 7, 3, 0x1A, 0]]
    assert got["gpus"][2] == [[uuid2, 27, 0, 2], [v2, uuid2, 27, 0, 2, 0], [v3, uuid2, 27, 0, 2, 0, 0]]
    assert got["gpus"][3] == [[zero, 0, 0, 3], [v2, zero, 0, 0, 3, 0], [v3, zero, 0, 0, 3, 0, 0]]
    assert got["gpus"][4] == ["NVMLError_NotSupported"] * 3
    assert got["bad_version"] == "NVMLError_ArgumentVersionMismatch"


def test_total_energy_counts_power_over_time(child_factory, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(2)
    spec["gpus"][0].update(energy=5_000_000, power_usage=100_000)  # 5 kJ so far, drawing 100 W
    fakenvml.write_spec(spec_path, spec)
    child = child_factory(spec_path)
    child("n.nvmlInit()")
    child("hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(2)]")
    child("""
        t0 = time.monotonic()
        e0 = n.nvmlDeviceGetTotalEnergyConsumption(hs[0])
        time.sleep(0.5)
        e1 = n.nvmlDeviceGetTotalEnergyConsumption(hs[0])
        dt = time.monotonic() - t0
        """)
    e0, e1, dt = child("[e0, e1, dt]")
    assert 5_000_000 <= e0 < 5_000_000 + 100_000 * 10  # loaded at nvmlInit, a moment ago
    assert 100_000 * 0.5 <= e1 - e0 <= 100_000 * dt + 1  # mW * s = mJ
    # the default GPU: energy 0 plus its idle 78.7 W (the recorded H200's) since the load
    assert 0 < child("n.nvmlDeviceGetTotalEnergyConsumption(hs[1])") < 78_692 * 10

    # A rewrite restarts the count from the new "energy"; with no power drawn it stays there.
    spec["gpus"][0].update(energy=9_000_000, power_usage=0)
    fakenvml.write_spec(spec_path, spec)
    assert child("[n.nvmlDeviceGetTotalEnergyConsumption(hs[0]) for _ in range(2)]") == [9_000_000] * 2


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("temperature_thresholds", {"shutdown": -2},
         "gpus[0].temperature_thresholds.shutdown: expected degrees C"),
        ("memory_temperature", "hot", "gpus[0].memory_temperature: expected a non-negative integer"),
        ("gpu_recovery_action", -1, "gpus[0].gpu_recovery_action: expected a non-negative integer"),
        ("pcie", {"lanes": 16}, 'gpus[0].pcie: unknown key "lanes"'),
        ("fabric", {"cluster_uuid": "0123-4567"}, "gpus[0].fabric.cluster_uuid: expected 32 hex digits"),
        ("energy", 1.5, "gpus[0].energy: expected a non-negative integer"),
        ("query_error", "NOT_AN_ERROR", 'gpus[0].query_error: unknown NVML error name "NOT_AN_ERROR"'),
        ("query_delay_ms", 3_600_001, "gpus[0].query_delay_ms: 3600001 is larger than 3600000"),
    ],
)
def test_bad_value_of_a_new_key_is_named_and_keeps_the_last_good_state(
    child_factory, spec_path: Path, key: str, value: Any, message: str
) -> None:
    spec = fakenvml.default_gpus(2)
    fakenvml.write_spec(spec_path, spec)
    child = child_factory(spec_path)
    child("n.nvmlInit()")
    child("h = n.nvmlDeviceGetHandleByIndex(0)")
    assert child("n.nvmlDeviceGetTemperature(h, 0)") == 37

    spec["gpus"][0]["temperature"] = 77  # in the same rewrite: must not be applied
    spec["gpus"][0][key] = value
    fakenvml.write_spec(spec_path, spec)
    assert child("n.nvmlDeviceGetTemperature(h, 0)") == 37
    assert child("n.nvmlDeviceGetCount()") == 2
    stderr = child.close()
    assert stderr.count("\n") == 1, stderr
    assert message in stderr and str(spec_path) in stderr, stderr
    assert "keeping the previous state" in stderr


# ---------------------------------------------------------------------------
# Faults
# ---------------------------------------------------------------------------

def test_lost_gpu_raises_gpu_is_lost_and_others_work(fakenvml_lib: Path, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(3)
    spec["gpus"][1]["lost"] = True
    fakenvml.write_spec(spec_path, spec)
    got = run_json(
        fakenvml_lib,
        spec_path,
        """
        import json
        n.nvmlInit()
        lost = n.nvmlDeviceGetHandleByIndex(1)   # getting the handle still works
        errors = {}
        for name, call in {
            "uuid": lambda: n.nvmlDeviceGetUUID(lost),
            "memory": lambda: n.nvmlDeviceGetMemoryInfo(lost),
            "temperature": lambda: n.nvmlDeviceGetTemperature(lost, 0),
            "index": lambda: n.nvmlDeviceGetIndex(lost),
            "stub": lambda: n.nvmlDeviceGetFanSpeed(lost),  # not implemented
        }.items():
            try:
                call()
                errors[name] = None
            except n.NVMLError as exc:
                errors[name] = [isinstance(exc, n.NVMLError_GpuIsLost), exc.value, str(exc)]
        print(json.dumps({
            "errors": errors,
            "count": n.nvmlDeviceGetCount(),
            "others": [n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(i)) for i in (0, 2)],
        }))
        """,
    )
    assert got["errors"] == {name: [True, 15, "GPU is lost"] for name in got["errors"]}
    assert set(got["errors"]) == {"uuid", "memory", "temperature", "index", "stub"}
    assert got["count"] == 3
    assert got["others"] == [spec["gpus"][0]["uuid"], spec["gpus"][2]["uuid"]]


def test_queued_xid_is_delivered_once_per_event_set(fakenvml_lib: Path, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(4)
    spec["events"] = [
        {"gpu": 2, "xid": 48},
        {"gpu": 3, "xid": 79},  # GPU 3 is never registered: never delivered
        {"gpu": 2, "type": 0x2, "data": 0},  # double-bit ECC, not registered
    ]
    fakenvml.write_spec(spec_path, spec)
    got = run_json(
        fakenvml_lib,
        spec_path,
        """
        import json, time
        n.nvmlInit()
        sets = [n.nvmlEventSetCreate(), n.nvmlEventSetCreate()]
        for i in range(3):
            h = n.nvmlDeviceGetHandleByIndex(i)
            for s in sets:
                n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, s)
        out = []
        for s in sets:
            data = n.nvmlEventSetWait(s, 1000)
            out.append([n.nvmlDeviceGetUUID(data.device), data.eventType, data.eventData])
        start = time.monotonic()
        try:
            n.nvmlEventSetWait(sets[0], 300)
            again = "delivered twice"
        except n.NVMLError_Timeout:
            again = "timeout"
        elapsed = time.monotonic() - start
        for s in sets:
            n.nvmlEventSetFree(s)
        print(json.dumps({"events": out, "again": again, "elapsed": elapsed}))
        """,
    )
    expected = [spec["gpus"][2]["uuid"], 0x8, 48]
    assert got["events"] == [expected, expected]
    assert got["again"] == "timeout"
    assert 0.25 <= got["elapsed"] < 2.0


def test_xid_appended_while_waiting_arrives(child_factory, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(2)
    fakenvml.write_spec(spec_path, spec)
    child = child_factory(spec_path)
    child("n.nvmlInit()")
    child("es = n.nvmlEventSetCreate()")
    child("n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(1), n.nvmlEventTypeXidCriticalError, es)")
    child.send("d = timed(n.nvmlEventSetWait, es, 10000)")
    time.sleep(0.3)  # the child is now blocked in nvmlEventSetWait
    spec["events"].append({"gpu": 1, "xid": 79})
    fakenvml.write_spec(spec_path, spec)
    assert child.receive() == {"value": None}
    assert child("n.nvmlDeviceGetUUID(d.device)") == spec["gpus"][1]["uuid"]
    assert child("[d.eventType, d.eventData]") == [0x8, 79]
    # It waited for the append, and the append woke it promptly.
    assert 0.2 <= child("timed.elapsed") < 3.0


def test_wait_with_nothing_queued_times_out(fakenvml_lib: Path, spec_path: Path) -> None:
    fakenvml.write_spec(spec_path, fakenvml.default_gpus(1))
    got = run_json(
        fakenvml_lib,
        spec_path,
        """
        import json, time
        n.nvmlInit()
        s = n.nvmlEventSetCreate()
        n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(0), n.nvmlEventTypeAll, s)
        start = time.monotonic()
        try:
            n.nvmlEventSetWait(s, 400)
            result = "event"
        except n.NVMLError as exc:
            result = [type(exc).__name__, isinstance(exc, n.NVMLError_Timeout)]
        print(json.dumps({"result": result, "elapsed": time.monotonic() - start}))
        """,
    )
    assert got["result"] == ["NVMLError_Timeout", True]
    assert 0.38 <= got["elapsed"] < 1.5


def test_throttle_reason_set_mid_run_is_seen_without_reinit(child_factory, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(2)
    fakenvml.write_spec(spec_path, spec)
    child = child_factory(spec_path)
    child("n.nvmlInit()")
    child("h = n.nvmlDeviceGetHandleByIndex(1)")
    assert child("n.nvmlDeviceGetCurrentClocksEventReasons(h)") == 0x1  # GPU idle, as the recorded H200

    reasons = 0x8 | 0x40  # HW slowdown + HW thermal slowdown
    spec["gpus"][1]["clocks_event_reasons"] = reasons
    fakenvml.write_spec(spec_path, spec)
    assert child("n.nvmlDeviceGetCurrentClocksEventReasons(h)") == reasons
    assert child("n.nvmlDeviceGetCurrentClocksThrottleReasons(h)") == reasons

    # Rewritten again immediately, with the same size: still noticed.
    spec["gpus"][1]["clocks_event_reasons"] = 0x4 | 0x20
    fakenvml.write_spec(spec_path, spec)
    assert child("n.nvmlDeviceGetCurrentClocksEventReasons(h)") == 0x24
    assert child.close() == ""


def test_gpu_lost_and_removed_mid_run(child_factory, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(4)
    fakenvml.write_spec(spec_path, spec)
    child = child_factory(spec_path)
    child("n.nvmlInit()")
    child("hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(4)]")
    assert child("n.nvmlDeviceGetUUID(hs[3])") == spec["gpus"][3]["uuid"]

    spec["gpus"][0]["lost"] = True
    del spec["gpus"][2:]
    fakenvml.write_spec(spec_path, spec)
    assert child("n.nvmlDeviceGetCount()") == 2
    assert child.error("n.nvmlDeviceGetUUID(hs[0])") == "NVMLError_GpuIsLost"
    assert child.error("n.nvmlDeviceGetUUID(hs[3])") == "NVMLError_GpuIsLost"
    assert child.error("n.nvmlDeviceGetHandleByIndex(3)") == "NVMLError_InvalidArgument"
    assert child("n.nvmlDeviceGetUUID(hs[1])") == spec["gpus"][1]["uuid"]


def test_malformed_file_mid_run_keeps_last_good_state(child_factory, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(2)
    fakenvml.write_spec(spec_path, spec)
    child = child_factory(spec_path)
    child("n.nvmlInit()")
    child("h = n.nvmlDeviceGetHandleByIndex(0)")
    assert child("n.nvmlDeviceGetTemperature(h, 0)") == 37

    broken = spec_path.with_name("broken.json")
    broken.write_text('{"gpus": [{"temperature": 90,}]}')
    os.replace(broken, spec_path)
    assert child("n.nvmlDeviceGetTemperature(h, 0)") == 37
    assert child("n.nvmlDeviceGetCount()") == 2

    spec["gpus"][0]["temperature"] = 91
    fakenvml.write_spec(spec_path, spec)
    assert child("n.nvmlDeviceGetTemperature(h, 0)") == 91
    stderr = child.close()
    # One line for the broken version, however many calls saw it.
    assert stderr.count("\n") == 1, stderr
    assert str(spec_path) in stderr and "line 1, column 30" in stderr
    assert "keeping the previous state" in stderr


def test_threads_and_rewrites_do_not_crash(child_factory, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(8)
    fakenvml.write_spec(spec_path, spec)
    child = child_factory(spec_path)
    child("n.nvmlInit()")
    child(
        """
        import threading
        stop = threading.Event()
        errors = []

        def loop():
            while not stop.is_set():
                try:
                    for i in range(n.nvmlDeviceGetCount()):
                        n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(i))
                except n.NVMLError as exc:
                    errors.append(type(exc).__name__)

        threads = [threading.Thread(target=loop) for _ in range(4)]
        for t in threads:
            t.start()
        """
    )
    for k in range(20):
        fakenvml.write_spec(spec_path, fakenvml.default_gpus(8 - k % 4))
        time.sleep(0.01)
    child("stop.set()\nfor t in threads: t.join()")
    # The GPU count can shrink between GetCount and the next call: that must
    # be a clean NVML error, never a crash or garbage.
    assert set(child("errors")) <= {"NVMLError_InvalidArgument", "NVMLError_GpuIsLost"}
    assert child("n.nvmlDeviceGetCount()") == 8 - 19 % 4


def test_query_error_replaces_gpu_is_lost_and_lost_wins(fakenvml_lib: Path, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(5)
    spec["gpus"][1]["query_error"] = "RESET_REQUIRED"
    spec["gpus"][1]["mig_devices"] = [{}]
    spec["gpus"][2]["query_error"] = 999  # a code works too
    spec["gpus"][3]["query_error"] = "nvml_error_timeout"
    spec["gpus"][4].update(query_error="RESET_REQUIRED", lost=True)
    fakenvml.write_spec(spec_path, spec)
    got = run_json(
        fakenvml_lib,
        spec_path,
        """
        import json
        n.nvmlInit()
        def call(fn):
            try:
                fn()
                return None
            except n.NVMLError as exc:
                return [type(exc).__name__, exc.value]
        out = []
        for i in range(5):
            h = n.nvmlDeviceGetHandleByIndex(i)  # lookups still succeed
            out.append({
                "uuid": call(lambda: n.nvmlDeviceGetUUID(h)),
                "memory": call(lambda: n.nvmlDeviceGetMemoryInfo(h)),
                "fields": call(lambda: n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_MEMORY_TEMP])),
                "threshold": call(lambda: n.nvmlDeviceGetTemperatureThreshold(h, 0)),
                "stub": call(lambda: n.nvmlDeviceGetFanSpeed(h)),
            })
        gpu = n.nvmlDeviceGetHandleByUUID(GPU1_UUID)
        mig = n.nvmlDeviceGetHandleByUUID("MIG-fa4e0001-0000-5000-8000-000000000001")
        by_pci = n.nvmlDeviceGetHandleByPciBusId(GPU2_BUS_ID)
        print(json.dumps({
            "gpus": out,
            "by_uuid_gpu": call(lambda: n.nvmlDeviceGetName(gpu)),
            "by_uuid_mig": call(lambda: n.nvmlDeviceGetMemoryInfo(mig)),
            "by_pci": call(lambda: n.nvmlDeviceGetPowerUsage(by_pci)),
        }))
        """.replace("GPU1_UUID", repr(spec["gpus"][1]["uuid"])).replace(
            "GPU2_BUS_ID", repr(spec["gpus"][2]["pci_bus_id"])),
    )
    stub_ok = ["NVMLError_NotSupported", 3]
    assert got["gpus"][0] == {"uuid": None, "memory": None, "fields": None, "threshold": None, "stub": stub_ok}
    for i, error in ((1, ["NVMLError_ResetRequired", 16]), (2, ["NVMLError_Unknown", 999]),
                     (3, ["NVMLError_Timeout", 10]), (4, ["NVMLError_GpuIsLost", 15])):
        assert got["gpus"][i] == dict.fromkeys(("uuid", "memory", "fields", "threshold", "stub"), error), i
    assert got["by_uuid_gpu"] == got["by_uuid_mig"] == ["NVMLError_ResetRequired", 16]
    assert got["by_pci"] == ["NVMLError_Unknown", 999]


def test_query_delay_hangs_one_gpu_while_other_threads_proceed(child_factory, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(2)
    spec["gpus"][1]["query_delay_ms"] = 1500
    fakenvml.write_spec(spec_path, spec)
    child = child_factory(spec_path)
    child("n.nvmlInit()")
    child("hs = [timed(n.nvmlDeviceGetHandleByIndex, i) for i in range(2)]")
    assert child("timed.elapsed") < 0.5  # handle lookups do not hang
    child("""
        import threading
        slow = {}
        def hang(name, fn):
            start = time.monotonic()
            try:
                slow[name] = fn()
            except n.NVMLError as exc:
                slow[name] = type(exc).__name__
            slow[name + "_s"] = time.monotonic() - start
        threads = [threading.Thread(target=hang, args=("uuid", lambda: n.nvmlDeviceGetUUID(hs[1]))),
                   threading.Thread(target=hang, args=("stub", lambda: n.nvmlDeviceGetFanSpeed(hs[1])))]
        for t in threads:
            t.start()
        time.sleep(0.2)
        start = time.monotonic()
        fast = [n.nvmlDeviceGetUUID(hs[0]), n.nvmlDeviceGetMemoryInfo(hs[0]).total, n.nvmlDeviceGetCount()]
        fast_s = time.monotonic() - start
        hanging = [t.is_alive() for t in threads]
        """)
    fast, fast_s, hanging = child("[fast, fast_s, hanging]")
    assert fast == [spec["gpus"][0]["uuid"], spec["gpus"][0]["memory_total"], 2]
    assert fast_s < 0.5 and hanging == [True, True]
    child("for t in threads: t.join()")
    slow = child("slow")
    assert slow["uuid"] == spec["gpus"][1]["uuid"] and slow["stub"] == "NVMLError_NotSupported"
    assert 1.45 <= slow["uuid_s"] < 4 and 1.45 <= slow["stub_s"] < 4

    # A call that hangs and then times out; the answer is the spec's when the sleep ends.
    spec["gpus"][1].update(query_delay_ms=300, query_error="TIMEOUT")
    fakenvml.write_spec(spec_path, spec)
    assert child.error("timed(n.nvmlDeviceGetTemperature, hs[1], 0)") == "NVMLError_Timeout"
    assert 0.28 <= child("timed.elapsed") < 3
    child("threading.Thread(target=hang, args=('late', lambda: n.nvmlDeviceGetUUID(hs[1]))).start()")
    time.sleep(0.1)
    spec["gpus"][1].update(query_error=None, lost=True)
    fakenvml.write_spec(spec_path, spec)
    deadline = time.monotonic() + 5
    while "late_s" not in child("slow"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert child("slow['late']") == "NVMLError_GpuIsLost"
    assert child.close() == ""


# ---------------------------------------------------------------------------
# Processes that exit ("while_alive")
# ---------------------------------------------------------------------------

@pytest.fixture
def sleeper():
    """Start real `sleep` processes; each is killed (by pid) and reaped at the end."""
    procs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(["sleep", "300"])
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat ("" when the pid is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return ""
    return stat[stat.rindex(")") + 2]


def test_while_alive_process_is_listed_and_counted_until_it_exits(
    child_factory, spec_path: Path, sleeper
) -> None:
    job = sleeper()
    spec = fakenvml.default_gpus(2)
    gpu = spec["gpus"][0]
    gpu["memory_used"] = 1 * GIB
    gpu["processes"] = [
        {"pid": job.pid, "used_memory": 2 * GIB, "while_alive": True},
        {"pid": 4242, "used_memory": 3 * GIB},  # static: always listed, never counted
    ]
    # The same process with a graphics context: listed there too, counted once.
    gpu["graphics_processes"] = [{"pid": job.pid, "used_memory": 2 * GIB, "while_alive": True}]
    fakenvml.write_spec(spec_path, spec)
    child = child_factory(spec_path)
    child("n.nvmlInit()")
    child("hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(2)]")
    compute = "[p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(hs[0])]"
    compute_v2 = "[[p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetComputeRunningProcesses_v2(hs[0])]"
    graphics = "[p.pid for p in n.nvmlDeviceGetGraphicsRunningProcesses(hs[0])]"
    memory = "[[m.used, m.free] for m in (n.nvmlDeviceGetMemoryInfo(hs[0]), " \
             "n.nvmlDeviceGetMemoryInfo(hs[0], version=n.nvmlMemory_v2))]"
    total, reserve = gpu["memory_total"], fakenvml.MEMORY_RESERVED

    def used(gib: int) -> list[list[int]]:
        """v1 counts the driver's reserve (615 MiB, the recorded H200's) as used, v2 does not."""
        return [[reserve + gib * GIB, total - reserve - gib * GIB], [gib * GIB, total - reserve - gib * GIB]]

    assert child(compute) == [job.pid, 4242]
    assert child(compute_v2) == [[job.pid, 2 * GIB], [4242, 3 * GIB]]
    assert child(graphics) == [job.pid]
    assert child(memory) == used(3)
    assert child("n.nvmlDeviceGetMemoryInfo(hs[1]).used") == reserve

    os.kill(job.pid, signal.SIGKILL)
    job.wait(timeout=10)
    # No spec rewrite: the driver notices the exit by itself.
    assert child(compute) == [4242]
    assert child(compute_v2) == [[4242, 3 * GIB]]
    assert child(graphics) == []
    assert child(memory) == used(1)
    assert child.close() == ""


def test_while_alive_zombie_is_already_gone(child_factory, spec_path: Path, sleeper) -> None:
    job = sleeper()
    spec = fakenvml.default_gpus(1)
    spec["gpus"][0]["processes"] = [{"pid": job.pid, "used_memory": 5 * GIB, "while_alive": True}]
    fakenvml.write_spec(spec_path, spec)
    child = child_factory(spec_path)
    child("n.nvmlInit()")
    child("h = n.nvmlDeviceGetHandleByIndex(0)")
    assert child("[p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]") == [job.pid]
    assert child("n.nvmlDeviceGetMemoryInfo(h).used") == fakenvml.MEMORY_RESERVED + 5 * GIB

    os.kill(job.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while process_state(job.pid) != "Z":  # exited, not reaped yet
        assert time.monotonic() < deadline, f"pid {job.pid} never became a zombie"
        time.sleep(0.01)
    assert child("n.nvmlDeviceGetComputeRunningProcesses(h)") == []
    assert child("n.nvmlDeviceGetMemoryInfo(h).used") == fakenvml.MEMORY_RESERVED  # back to the driver's own
    job.wait(timeout=10)


def test_while_alive_counts_on_its_mig_instance_only(fakenvml_lib: Path, spec_path: Path, sleeper) -> None:
    job = sleeper()
    spec = fakenvml.default_gpus(1)
    gpu = spec["gpus"][0]
    gpu["mig_devices"] = [{"memory_used": 1 * GIB}, {}]  # gpu_instance_id 1 and 2
    gpu["processes"] = [
        {"pid": job.pid, "used_memory": 2 * GIB, "gpu_instance_id": 1, "while_alive": True},
        {"pid": 2**31 + 5, "used_memory": 4 * GIB, "while_alive": True},  # never a live pid
    ]
    fakenvml.write_spec(spec_path, spec)
    got = run_json(
        fakenvml_lib,
        spec_path,
        """
        import json
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        migs = [n.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(2)]
        print(json.dumps({
            "used": [n.nvmlDeviceGetMemoryInfo(d).used for d in [h, *migs]],
            "pids": [[p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(d)] for d in [h, *migs]],
        }))
        """,
    )
    # the GPU counts the driver's reserve as used, its MIG devices do not
    assert got == {"used": [fakenvml.MEMORY_RESERVED + 2 * GIB, 3 * GIB, 0], "pids": [[job.pid], [job.pid], []]}


# ---------------------------------------------------------------------------
# Entry points and initialisation
# ---------------------------------------------------------------------------

def test_missing_entry_point_is_not_supported(fakenvml_lib: Path, spec_path: Path) -> None:
    # The fake does not implement fan speed (an H200 has no fans); the stub
    # generated from pynvml's list must answer NOT_SUPPORTED.
    c_sources = sorted(fakenvml.source_dir().glob("*.c"))
    assert "nvmlDeviceGetFanSpeed" not in "".join(p.read_text() for p in c_sources)
    fakenvml.write_spec(spec_path, fakenvml.default_gpus(1))
    got = run_json(
        fakenvml_lib,
        spec_path,
        """
        import json
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out = {}
        for name, call in {
            "fan": lambda: n.nvmlDeviceGetFanSpeed(h),
            "inforom": lambda: n.nvmlDeviceGetInforomImageVersion(h),
        }.items():
            try:
                call()
                out[name] = "no error"
            except n.NVMLError as exc:
                out[name] = [type(exc).__name__, isinstance(exc, n.NVMLError_NotSupported)]
        print(json.dumps(out))
        """,
    )
    assert got == {name: ["NVMLError_NotSupported", True] for name in ("fan", "inforom")}


def test_init_error_driver_not_loaded(fakenvml_lib: Path, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(2)
    spec["init_error"] = "DRIVER_NOT_LOADED"
    fakenvml.write_spec(spec_path, spec)
    got = run_json(
        fakenvml_lib,
        spec_path,
        """
        import json
        try:
            n.nvmlInit()
            result = "initialised"
        except n.NVMLError as exc:
            result = [type(exc).__name__, isinstance(exc, n.NVMLError_DriverNotLoaded)]
        try:
            n.nvmlDeviceGetCount()
            after = "counted"
        except n.NVMLError as exc:
            after = type(exc).__name__
        print(json.dumps({"init": result, "after": after}))
        """,
    )
    assert got == {"init": ["NVMLError_DriverNotLoaded", True], "after": "NVMLError_Uninitialized"}


def test_malformed_json_fails_init_with_unknown(fakenvml_lib: Path, spec_path: Path) -> None:
    spec_path.write_text('{\n  "gpus": [\n    {"name": "x"\n  ]\n}\n')
    proc = run_pynvml(
        fakenvml_lib,
        spec_path,
        """
        try:
            n.nvmlInit()
            print("initialised")
        except n.NVMLError as exc:
            print(type(exc).__name__, isinstance(exc, n.NVMLError_Unknown))
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "NVMLError_Unknown True"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(spec_path) in lines[0]
    assert "line 4, column 3" in lines[0]


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot stat"),
        ('{"gpus": [{"temprature": 40}]}', 'gpus[0]: unknown key "temprature"'),
        ('{"gpus": [{"memory_total": "lots"}]}', "gpus[0].memory_total: expected a non-negative integer"),
        ('{"init_error": "NO_SUCH_ERROR"}', "init_error: unknown NVML error name"),
        ('{"gpus": [{"processes": [{"pid": 7, "while_alive": 2}]}]}',
         "gpus[0].processes[0].while_alive: 2 is larger than 1"),
    ],
)
def test_invalid_spec_fails_init_with_reason(
    fakenvml_lib: Path, spec_path: Path, content: str | None, message: str
) -> None:
    if content is not None:
        spec_path.write_text(content)
    proc = run_pynvml(
        fakenvml_lib,
        spec_path,
        """
        try:
            n.nvmlInit()
        except n.NVMLError_Unknown:
            print("unknown")
        """,
    )
    assert proc.stdout.strip() == "unknown"
    assert message in proc.stderr and str(spec_path) in proc.stderr


def test_unset_spec_variable_fails_init(fakenvml_lib: Path, spec_path: Path) -> None:
    env = child_env(fakenvml_lib, spec_path)
    del env[fakenvml.SPEC_ENV]
    proc = subprocess.run(
        [sys.executable, "-c",
         "import pynvml as n\ntry:\n n.nvmlInit()\nexcept n.NVMLError_Unknown:\n print('unknown')"],
        env=env, capture_output=True, text=True, timeout=30,
    )
    assert proc.stdout.strip() == "unknown"
    assert fakenvml.SPEC_ENV in proc.stderr


def test_init_is_refcounted(fakenvml_lib: Path, spec_path: Path) -> None:
    fakenvml.write_spec(spec_path, fakenvml.default_gpus(1))
    got = run_json(
        fakenvml_lib,
        spec_path,
        """
        import ctypes, json
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        lib.nvmlErrorString.restype = ctypes.c_char_p
        count = ctypes.c_uint()
        print(json.dumps([
            lib.nvmlInit_v2(), lib.nvmlInit(), lib.nvmlShutdown(),
            lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), count.value,
            lib.nvmlShutdown(), lib.nvmlDeviceGetCount_v2(ctypes.byref(count)),
            lib.nvmlShutdown(), lib.nvmlErrorString(15).decode(),
        ]))
        """,
    )
    assert got == [0, 0, 0, 0, 1, 0, 1, 1, "GPU is lost"]


# ---------------------------------------------------------------------------
# The Python helper
# ---------------------------------------------------------------------------

def test_default_gpus_write_spec_round_trip(fakenvml_lib: Path, spec_path: Path) -> None:
    spec = fakenvml.default_gpus(8, cpus=16)
    fakenvml.write_spec(spec_path, spec)
    assert json.loads(spec_path.read_text()) == spec
    assert not [p for p in spec_path.parent.iterdir() if p.name.endswith(".tmp")]

    gpus = spec["gpus"]
    assert [g["minor"] for g in gpus] == list(range(8))
    assert len({g["uuid"] for g in gpus}) == 8 and all(g["uuid"].startswith("GPU-") for g in gpus)
    buses = [int(g["pci_bus_id"].split(":")[1], 16) for g in gpus]
    assert buses == sorted(set(buses))
    assert all(g["memory_total"] == fakenvml.H200_MEMORY for g in gpus)  # the recorded H200's 143,771 MiB
    assert gpus[0]["cpu_affinity"] == list(range(8)) and gpus[7]["cpu_affinity"] == list(range(8, 16))
    assert fakenvml.default_gpus(8, cpus=16) == spec  # deterministic

    # pynvml sees exactly that, and a bare {"count": 8} describes the same GPUs.
    count_only = spec_path.with_name("count.json")
    fakenvml.write_spec(count_only, {"count": 8})
    code = """
        import json
        n.nvmlInit()
        hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
        print(json.dumps([[n.nvmlDeviceGetUUID(h), n.nvmlDeviceGetPciInfo(h).busId, n.nvmlDeviceGetMinorNumber(h),
                           n.nvmlDeviceGetMemoryInfo(h).total, n.nvmlDeviceGetName(h), n.nvmlDeviceGetMemoryInfo(h).used,
                           n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM), n.nvmlDeviceGetCurrentClocksEventReasons(h),
                           n.nvmlDeviceGetTemperature(h, 0), n.nvmlDeviceGetPowerUsage(h)] for h in hs]))
        """
    expected = [[g["uuid"], g["pci_bus_id"], g["minor"], g["memory_total"], g["name"], g["memory_reserved"],
                 g["clock_sm"], g["clocks_event_reasons"], g["temperature"], g["power_usage"]] for g in gpus]
    assert run_json(fakenvml_lib, spec_path, code) == expected
    assert run_json(fakenvml_lib, count_only, code) == expected


def test_write_spec_replaces_atomically_with_newer_mtime(spec_path: Path) -> None:
    fakenvml.write_spec(spec_path, {"count": 1})
    first = os.stat(spec_path)
    fakenvml.write_spec(spec_path, {"count": 2})
    second = os.stat(spec_path)
    assert second.st_mtime_ns > first.st_mtime_ns
    assert oct(second.st_mode & 0o777) == oct(0o644)
    assert json.loads(spec_path.read_text()) == {"count": 2}


def test_build_is_cached_and_links(fakenvml_lib: Path) -> None:
    lib = fakenvml_lib / "libnvidia-ml.so.1"
    before = os.stat(lib).st_mtime_ns
    assert fakenvml.build(fakenvml_lib) == lib
    assert os.stat(lib).st_mtime_ns == before  # not recompiled
    assert os.readlink(fakenvml_lib / "libnvidia-ml.so") == "libnvidia-ml.so.1"
    assert fakenvml.environ(fakenvml_lib, Path("/x.json")) == {
        "LD_LIBRARY_PATH": str(fakenvml_lib),
        "SLURM_EXT_FAKE_NVML": "/x.json",
    }


def test_build_reports_gcc_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "broken.c").write_text("int broken(void) { return }\n")
    monkeypatch.setattr(fakenvml, "source_dir", lambda: src)
    with pytest.raises(RuntimeError, match="broken.c"):
        fakenvml.build(tmp_path / "out")
    assert not (tmp_path / "out" / "libnvidia-ml.so.1").exists()
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]



# ---------------------------------------------------------------------------
# Visibility by device file: the devices cgroup of a job
# ---------------------------------------------------------------------------

#: minor numbers of the four GPUs, by spec position: not the positions, so a
#: fake that looked up nvidia<index> instead of nvidia<minor> would be caught
VISIBILITY_MINORS = [6, 2, 9, 4]

#: defines visible() in the child: what NVML shows of the GPUs, by NVML index
VISIBLE_GPUS = """
def visible():
    count = n.nvmlDeviceGetCount()
    handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    uuids = [n.nvmlDeviceGetUUID(h) for h in handles]
    return {
        "count": count,
        "uuids": uuids,
        "minors": [n.nvmlDeviceGetMinorNumber(h) for h in handles],
        "indexes": [n.nvmlDeviceGetIndex(h) for h in handles],
        "by_uuid": [n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(u)) for u in uuids],
        "by_pci": [n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId(n.nvmlDeviceGetPciInfo(h).busId))
                   for h in handles],
    }
"""

#: one-shot: print visible() as JSON
PRINT_VISIBLE = VISIBLE_GPUS + """
import json
n.nvmlInit()
print(json.dumps(visible()))
"""


def expected_visible(spec: dict[str, Any], positions: list[int]) -> dict[str, Any]:
    """visible() of a process that sees the spec's GPUs at `positions`: dense indexes."""
    return {
        "count": len(positions),
        "uuids": [spec["gpus"][p]["uuid"] for p in positions],
        "minors": [spec["gpus"][p]["minor"] for p in positions],
        "indexes": list(range(len(positions))),
        "by_uuid": list(range(len(positions))),
        "by_pci": list(range(len(positions))),
    }


@pytest.fixture
def gpu_nodes(tmp_path: Path, spec_path: Path) -> tuple[dict[str, Any], Path]:
    """Four GPUs (minors VISIBILITY_MINORS) in the spec, and a dev dir with their
    nvidia<minor> character devices (mknod, major 195: needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mknod of the GPU device files needs root")
    spec = fakenvml.default_gpus(4)
    for gpu, minor in zip(spec["gpus"], VISIBILITY_MINORS):
        gpu["minor"] = minor
    fakenvml.write_spec(spec_path, spec)
    dev = tmp_path / "dev"
    dev.mkdir()
    for minor in VISIBILITY_MINORS:
        fakenvml.make_device(dev / f"nvidia{minor}", minor)
    return spec, dev


DEVICES_CGROUP = Path("/sys/fs/cgroup/devices")


@pytest.fixture
def devices_cgroup():
    """A cgroup v1 devices cgroup of this test's own (unique name), removed afterwards.

    Every process the test moved in must be gone (killed and waited for) by
    teardown, or rmdir fails with EBUSY: request this fixture before
    child_factory, whose teardown would come too late.
    """
    if os.geteuid() != 0 or not (DEVICES_CGROUP / "devices.deny").exists():
        pytest.skip("needs root and a cgroup v1 devices hierarchy at /sys/fs/cgroup/devices")
    path = DEVICES_CGROUP / f"slurm-ext-test-fakenvml-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir()
    try:
        yield path
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                path.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def test_a_gpu_denied_by_the_devices_cgroup_is_not_visible(devices_cgroup: Path, child_factory, fakenvml_lib: Path,
                                                           spec_path: Path, gpu_nodes) -> None:
    """As under Slurm's ConstrainDevices: the driver enumerates only the GPUs whose
    /dev/nvidia<minor> the process may open; indexes stay dense, in spec order."""
    spec, dev = gpu_nodes
    hidden = 1  # spec position of the GPU the cgroup denies
    (devices_cgroup / "devices.deny").write_text(f"c {fakenvml.NVIDIA_MAJOR}:{VISIBILITY_MINORS[hidden]} rwm\n")
    child = child_factory(spec_path, dev)
    try:
        # moved in before its first NVML call: until then it only waits on stdin
        (devices_cgroup / "cgroup.procs").write_text(f"{child.proc.pid}\n")
        devices_line = next(line for line in Path(f"/proc/{child.proc.pid}/cgroup").read_text().splitlines()
                            if ":devices:" in line)
        assert devices_line.endswith("/" + devices_cgroup.name), devices_line
        assert child("n.nvmlInit()") is None
        child(VISIBLE_GPUS)
        seen = child("visible()")
        hidden_by_uuid = child.error(f"n.nvmlDeviceGetHandleByUUID({spec['gpus'][hidden]['uuid']!r})")
        hidden_by_pci = child.error(f"n.nvmlDeviceGetHandleByPciBusId({spec['gpus'][hidden]['pci_bus_id']!r})")
        past_the_end = child.error("n.nvmlDeviceGetHandleByIndex(3)")
    finally:
        child.proc.kill()
        child.close()
    assert seen == expected_visible(spec, [0, 2, 3])
    assert (hidden_by_uuid, hidden_by_pci) == ("NVMLError_NotFound", "NVMLError_NotFound")
    assert past_the_end == "NVMLError_InvalidArgument"
    # the same library, spec and dev dir outside the cgroup: all four
    assert run_json(fakenvml_lib, spec_path, PRINT_VISIBLE, dev_dir=dev) == \
        expected_visible(spec, [0, 1, 2, 3])


def test_with_every_device_openable_nothing_changes(fakenvml_lib: Path, spec_path: Path, gpu_nodes) -> None:
    spec, dev = gpu_nodes
    with_dev_dir = run_json(fakenvml_lib, spec_path, PRINT_VISIBLE, dev_dir=dev)
    without = run_json(fakenvml_lib, spec_path, PRINT_VISIBLE)
    assert with_dev_dir == without == expected_visible(spec, [0, 1, 2, 3])


def test_a_missing_or_plain_device_file_hides_its_gpu_only_with_a_dev_dir(fakenvml_lib: Path, spec_path: Path,
                                                                         gpu_nodes) -> None:
    """A GPU without its device node is not there for the driver (a container that
    was given only some /dev/nvidia<N>); without a dev dir the fake checks no file,
    which the tests of gres' "device file missing" problem rely on."""
    spec, dev = gpu_nodes
    (dev / f"nvidia{VISIBILITY_MINORS[0]}").unlink()
    (dev / f"nvidia{VISIBILITY_MINORS[2]}").unlink()
    (dev / f"nvidia{VISIBILITY_MINORS[2]}").write_text("")  # a plain file is no GPU device
    assert run_json(fakenvml_lib, spec_path, PRINT_VISIBLE, dev_dir=dev) == expected_visible(spec, [1, 3])
    assert run_json(fakenvml_lib, spec_path, PRINT_VISIBLE) == expected_visible(spec, [0, 1, 2, 3])


def test_a_device_file_the_user_may_not_open_hides_its_gpu(fakenvml_lib: Path, gpu_nodes) -> None:
    """The driver opens /dev/nvidia<N> read-write: a node of mode 0644 hides the GPU from
    other users, as a restrictive NVreg_DeviceFileMode does with the real driver."""
    spec, _ = gpu_nodes
    shared = Path(tempfile.mkdtemp(prefix="slurm-ext-test-fakenvml-"))  # pytest's tmp dirs are root's 0700
    try:
        shared.chmod(0o755)
        spec_path, dev = shared / "gpus.json", shared / "dev"
        fakenvml.write_spec(spec_path, spec)
        dev.mkdir()
        for minor in VISIBILITY_MINORS:
            fakenvml.make_device(dev / f"nvidia{minor}", minor)
        (dev / f"nvidia{VISIBILITY_MINORS[3]}").chmod(0o644)
        # the library is loaded while still root (its build dir is root's), then nobody calls nvmlInit
        as_nobody = PRINT_VISIBLE.replace("import json", "import json, os\nn._LoadNvmlLibrary()\n"
                                          "os.setgroups([])\nos.setgid(65534)\nos.setuid(65534)")
        assert run_json(fakenvml_lib, spec_path, as_nobody, dev_dir=dev) == expected_visible(spec, [0, 1, 2])
        assert run_json(fakenvml_lib, spec_path, PRINT_VISIBLE, dev_dir=dev) == expected_visible(spec, [0, 1, 2, 3])
    finally:
        shutil.rmtree(shared)


def test_a_rewritten_spec_is_matched_against_the_device_files_again(child_factory, spec_path: Path,
                                                                    gpu_nodes) -> None:
    """The fake reloads a changed spec mid-run (see "Live changes"); the GPUs it now lists
    are checked against the device files then, so a GPU moved to a minor without a node
    vanishes, and a handle taken before answers GPU_IS_LOST like a GPU off the bus."""
    spec, dev = gpu_nodes
    child = child_factory(spec_path, dev)
    child("n.nvmlInit()")
    child(VISIBLE_GPUS)
    assert child("visible()") == expected_visible(spec, [0, 1, 2, 3])
    child("h = n.nvmlDeviceGetHandleByIndex(2)")
    spec["gpus"][1]["minor"] = 63  # no nvidia63 in the dev dir
    fakenvml.write_spec(spec_path, spec)
    assert child("visible()") == expected_visible(spec, [0, 2, 3])
    assert child("n.nvmlDeviceGetUUID(h)") == spec["gpus"][2]["uuid"]  # a handle is the GPU, not its index
    spec["gpus"][2]["minor"] = 62
    fakenvml.write_spec(spec_path, spec)
    assert child.error("n.nvmlDeviceGetUUID(h)") == "NVMLError_GpuIsLost"
    assert child("visible()") == expected_visible(spec, [0, 3])
