"""Recordings of real GPUs replayed against the fake libnvidia-ml, and the recorder that makes them.

The recorder (`slurm_ext.nvmlrecord`, on with SLURM_EXT_NVML_RECORD) runs in child processes over the real pynvml
and the fake library. The replay runs every NVML-reading path of slurm-ext against the fake built from a spec that
describes a recorded GPU, records it, and compares each call with the recording: return codes and value shapes.
Every recording in tests/data/real-gpu/ is replayed, so another GPU is another file there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from slurm_ext import nvmlrecord
from slurm_ext.devcluster import fakenvml

from conftest import wait_for

DATA = Path(__file__).parent / "data" / "real-gpu"


@pytest.fixture(scope="session")
def fakenvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake library, built once per session; returns its directory."""
    return fakenvml.build(tmp_path_factory.mktemp("fakenvml-lib")).parent


def _env(lib: Path, spec: Path, record: Path | None) -> dict[str, str]:
    env = {**os.environ, **fakenvml.environ(lib, spec)}
    env.pop(nvmlrecord.ENV, None)
    if record is not None:
        env[nvmlrecord.ENV] = str(record)
    return env


def _run(lib: Path, spec: Path, record: Path | None, code: str, timeout: float = 60) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_env(lib, spec, record),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _entry(recording: dict, call: str, gpu=None, args=None) -> dict:
    found = [e for e in recording["calls"] if e["call"] == call and e["gpu"] == gpu
             and (args is None or e["args"] == args)]
    assert len(found) == 1, (call, gpu, args, [(e["call"], e["gpu"], e["args"]) for e in recording["calls"]])
    return found[0]


# -- the recorder -----------------------------------------------------------------------------------------


def test_the_recorder_keeps_each_call_its_gpu_arguments_answer_and_time(fakenvml_lib: Path, tmp_path: Path) -> None:
    spec = fakenvml.default_gpus(2)
    spec["gpus"][1]["temperature_thresholds"] = {"mem_max": -1}
    spec["gpus"][0].update(fabric={"state": 3, "clique_id": 7}, memory_temperature=41,
                           temperature_thresholds={"mem_max": 95})
    fakenvml.write_spec(tmp_path / "gpus.json", spec)
    record = tmp_path / "calls.json"
    _run(fakenvml_lib, tmp_path / "gpus.json", record, """
        import ctypes
        from slurm_ext import nvml
        m = nvml.load()
        assert m is nvml.load() and m.NVMLError is __import__("pynvml").NVMLError  # one module, passed through
        m.nvmlInit()
        for i in range(m.nvmlDeviceGetCount()):
            h = m.nvmlDeviceGetHandleByIndex(i)
            m.nvmlDeviceGetUUID(h)
            m.nvmlDeviceGetUUID(h)
            try:
                m.nvmlDeviceGetTemperatureThreshold(h, m.NVML_TEMPERATURE_THRESHOLD_MEM_MAX)
            except m.NVMLError_NotSupported:
                pass
            m.nvmlDeviceGetCpuAffinity(h, 4)
        h = m.nvmlDeviceGetHandleByIndex(0)
        info = m.c_nvmlGpuFabricInfo_v3_t()
        info.version = m.nvmlGpuFabricInfo_v3
        m.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
        m.nvmlDeviceGetMemoryInfo(h, version=m.nvmlMemory_v2)
        m.nvmlDeviceGetFieldValues(h, [m.NVML_FI_DEV_MEMORY_TEMP, 38])
        m.nvmlShutdown()
    """)
    rec = nvmlrecord.read(record)
    assert rec["source"]["pynvml"] and rec["source"]["argv"] == ["-c"]
    uuid = _entry(rec, "nvmlDeviceGetUUID", 1, [])
    assert uuid["count"] == 2 and uuid["answers"] == [{"ret": 0, "value": spec["gpus"][1]["uuid"], "count": 2}]
    assert uuid["ms"]["median"] >= 0 and uuid["ms"]["max"] >= uuid["ms"]["median"]
    assert _entry(rec, "nvmlDeviceGetHandleByIndex", None, [1])["answers"][0]["value"] == {"handle": 1}
    assert _entry(rec, "nvmlDeviceGetTemperatureThreshold", 0, [2])["answers"][0]["value"] == 95
    assert _entry(rec, "nvmlDeviceGetTemperatureThreshold", 1, [2])["answers"] == [
        {"ret": 3, "text": "Not Supported", "count": 1}]
    affinity = _entry(rec, "nvmlDeviceGetCpuAffinity", 0, [])
    assert affinity["params"] == [4] and len(affinity["answers"][0]["value"]) == 4
    fabric = _entry(rec, "nvmlDeviceGetGpuFabricInfoV", 0, [{"byref": "c_nvmlGpuFabricInfo_v3_t"}])
    (out,) = fabric["answers"][0]["out"]
    assert (out["state"], out["cliqueId"], out["version"]) == (3, 7, 0x03000028)
    assert len(out["clusterUuid"]) == 16 and "healthSummary" in out
    memory = _entry(rec, "nvmlDeviceGetMemoryInfo", 0, [{"version": 0x02000028}])["answers"][0]["value"]
    assert set(memory) == {"version", "total", "reserved", "free", "used"}
    fields = _entry(rec, "nvmlDeviceGetFieldValues", 0, [[82, 38]])["answers"][0]["value"]
    assert [(f["fieldId"], f["nvmlReturn"]) for f in fields] == [(82, 0), (38, 3)] and fields[0]["value"] == 41
    assert _entry(rec, "nvmlShutdown")["answers"][0]["ret"] == 0


def test_a_process_killed_by_sigterm_leaves_its_recording(fakenvml_lib: Path, tmp_path: Path) -> None:
    """No atexit runs on SIGTERM's default action: the recorder writes while calls come (first after a second)."""
    fakenvml.write_spec(tmp_path / "gpus.json", fakenvml.default_gpus(1))
    record = tmp_path / "monitor.json"
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import time
        from slurm_ext import nvml
        m = nvml.load()
        m.nvmlInit()
        while True:
            m.nvmlDeviceGetCount()
            time.sleep(0.05)
    """)], env=_env(fakenvml_lib, tmp_path / "gpus.json", record))
    try:
        wait_for("the first write", lambda: record.exists(), timeout=30)
    finally:
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=10) == -signal.SIGTERM
    rec = nvmlrecord.read(record)
    assert _entry(rec, "nvmlDeviceGetCount")["count"] >= 1
    assert not list(tmp_path.glob(".monitor.json*")), "a temporary file was left"


def _recording(*entries: dict, gaps: dict | None = None) -> dict:
    rec = {"format": nvmlrecord.FORMAT, "version": nvmlrecord.VERSION, "source": {}, "calls": list(entries)}
    if gaps:
        rec["gaps"] = gaps
    return rec


def _call(call: str, *answers: dict, gpu=0, args=(), **extra) -> dict:
    return {"call": call, "gpu": gpu, "args": list(args), "count": 1, "ms": None, "answers": list(answers), **extra}


def test_compare_looks_at_return_codes_and_shapes_never_numbers() -> None:
    old = _recording(
        _call("nvmlDeviceGetMemoryInfo", {"ret": 0, "value": {"total": 10, "free": 4, "used": 6}}),
        _call("nvmlDeviceGetNvLinkState", {"ret": 3, "text": "Not Supported"}, args=[0]),
        _call("nvmlDeviceGetComputeRunningProcesses", {"ret": 0, "value": [{"$unrecorded": "nvmlFriendlyObject"}]}),
        _call("nvmlDeviceGetGpuFabricInfo", {"ret": 0, "value": 0, "out": [{"state": 0}]}, partial=True),
        _call("nvmlEventSetWait_v2", {"ret": 10, "text": "Timeout"}, gpu=None),
        _call("nvmlDeviceGetFieldValues", {"ret": 0, "value": [{"fieldId": 82, "nvmlReturn": 0, "valueType": 1},
                                                               {"fieldId": 38, "nvmlReturn": 3, "valueType": 0}]},
              args=[[82, 38]]),
        gaps={"nvmlShutdown": "not asked"})
    same = _recording(
        _call("nvmlDeviceGetMemoryInfo", {"ret": 0, "value": {"total": 99, "free": 1, "used": 98}}),
        _call("nvmlDeviceGetComputeRunningProcesses", {"ret": 0, "value": [{"pid": 1, "usedGpuMemory": 2}]}),
        _call("nvmlDeviceGetGpuFabricInfo", {"ret": 0, "value": 0, "out": [{"state": 0, "status": 0}]}),
        _call("nvmlEventSetWait_v2", {"ret": 0, "value": {"eventType": 8}}, gpu=None),
        _call("nvmlDeviceGetFieldValues", {"ret": 0, "value": [{"fieldId": 38, "nvmlReturn": 3, "valueType": 1}]},
              args=[[38]]))
    assert nvmlrecord.compare(old, same) == []
    other = _recording(
        _call("nvmlDeviceGetMemoryInfo", {"ret": 0, "value": {"total": 10, "free": 4, "used": 6.0}}),
        _call("nvmlDeviceGetNvLinkState", {"ret": 2, "text": "Invalid Argument"}, args=[0]),
        _call("nvmlDeviceGetFieldValues", {"ret": 0, "value": [{"fieldId": 82, "nvmlReturn": 0, "valueType": 3},
                                                               {"fieldId": 230, "nvmlReturn": 0, "valueType": 1}]},
              args=[[82, 230]]),
        _call("nvmlShutdown", {"ret": 0, "value": None}, gpu=None),
        _call("nvmlDeviceGetUUID", {"ret": 0, "value": "GPU-x"}))
    found = nvmlrecord.compare(old, other)
    assert {(d.name, d.kind) for d in found} == {
        ("nvmlDeviceGetMemoryInfo", "shape"), ("nvmlDeviceGetNvLinkState", "ret"),
        ("nvmlDeviceGetFieldValues field 82", "shape"), ("nvmlDeviceGetFieldValues field 230", "missing"),
        ("nvmlShutdown", "missing"), ("nvmlDeviceGetUUID", "missing")}
    gaps, rest = nvmlrecord.declared(found, old)
    assert [d.name for d in gaps] == ["nvmlShutdown"] and len(rest) == 5


def test_the_cli_diffs_and_shows(tmp_path: Path) -> None:
    old = _recording(_call("nvmlDeviceGetNvLinkState", {"ret": 3, "text": "Not Supported"}, args=[0]),
                     gaps={"nvmlShutdown": "not asked"})
    new = _recording(_call("nvmlDeviceGetNvLinkState", {"ret": 2, "text": "Invalid Argument"}, args=[0]))
    for name, rec in (("old", old), ("new", new)):
        nvmlrecord.write(rec, tmp_path / f"{name}.json")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "slurm_ext.nvmlrecord", *args], capture_output=True, text=True,
                              timeout=60)
    same = cli("diff", str(tmp_path / "old.json"), str(tmp_path / "old.json"))
    assert same.returncode == 0 and "every call answers as in" in same.stdout
    differ = cli("diff", str(tmp_path / "old.json"), str(tmp_path / "new.json"))
    assert differ.returncode == 1
    assert "nvmlDeviceGetNvLinkState(gpu 0, 0): return code [2], the recording has [3]" in differ.stdout
    shown = cli("show", str(tmp_path / "old.json"))
    assert shown.returncode == 0 and "error 3 Not Supported" in shown.stdout and "gap nvmlShutdown" in shown.stdout
    (tmp_path / "junk.json").write_text("{}")
    assert cli("show", str(tmp_path / "junk.json")).returncode == 2


# -- the recordings ---------------------------------------------------------------------------------------


def test_the_converted_recordings_are_the_probe_notes_as_the_converter_says() -> None:
    """tests/data/real-gpu/*.json come from original/ through convert_probe.py, nothing edited by hand."""
    sys.path.insert(0, str(DATA))
    try:
        import convert_probe
    finally:
        sys.path.remove(str(DATA))
    readme = convert_probe._readme_entries()
    for name, state in (("h200-580-idle.json", "idle"), ("h200-580-load.json", "load")):
        probe = json.loads((DATA / "original" / name).read_text())
        assert nvmlrecord.read(DATA / name) == json.loads(json.dumps(convert_probe.convert(probe, name, state,
                                                                                            readme)))
