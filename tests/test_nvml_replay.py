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
import warnings
from pathlib import Path

import pytest

from slurm_ext import nvmlrecord
from slurm_ext.devcluster import fakenvml

from helpers.wait import wait_for

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


# -- the replay -------------------------------------------------------------------------------------------

#: every recording here is replayed: another GPU is another file
RECORDINGS = sorted(p.name for p in DATA.glob("*.json"))

#: every NVML-reading path of slurm-ext but the monitor and `health check` (processes of their own, below): the
#: health reader (a first poll that reads each GPU's facts, a second that keeps them), NVML's events, the gres
#: inventory, the Prolog/Epilog's reads
PATHS = """
    import sys
    from pathlib import Path
    from slurm_ext.health import nvmlread
    from slurm_ext.gres import inventory
    from slurm_ext.prolog_epilog import gpus

    module = nvmlread.nvml_module()
    facts = {}
    for _ in range(2):
        nvmlread.read_gpus(lambda: module, facts=facts)
    events = nvmlread.NvmlEvents(module)
    events.wait(0.05)
    events.close()
    count = module.nvmlDeviceGetCount()
    inventory.read_inventory(dev_dir=Path(sys.argv[1]))
    gpus.gpu_usage(range(count))
    gpus.minor_numbers(range(count))
    gpus.foreign_processes(range(count))
"""

#: checks with a hold or a window get short ones, so that a run of seconds is longer than every one of them
_HELD = {"fabric": 'hold = "1s"', "temperature": 'hold = "1s"', "nvlink": 'hold = "1s"', "pcie-link": 'hold = "1s"',
         "persistence": 'hold = "1s"', "link-down": 'hold = "1s"', "throttle": 'window = "2s"',
         "nvlink-errors": 'window = "2s"', "pcie-replay": 'window = "2s"', "kernel": 'window = "2s"',
         "link-flap": 'window = "2s"', "xid": 'window = "2s"', "nvml": "threshold = 2"}
#: what a run must last: past every hold and window above, in polls
_LONGEST = 2.0


def _config(root: Path) -> Path:
    """A node of the test's own: its state, no Slurm (the Slurm checks are off), its own empty kernel log."""
    text = f"""
[node]
name = "replaynode"
state_dir = "{root}/state"
runtime_dir = "{root}/run"
[log]
file = "{root}/slurm-ext.log"
[slurm]
conf = "{root}/no-slurm.conf"
timeout = "1s"
[health]
interval = "0.2s"
kernel_log = "{root}/kernel.log"
paths = ["{root}"]
[health.checks.slurmd]
enabled = false
[health.checks.foreign-drain]
enabled = false
"""
    text += "".join(f"[health.checks.{check}]\n{line}\n" for check, line in _HELD.items())
    (root / "kernel.log").write_text("")
    (root / "config.toml").write_text(text)
    return root / "config.toml"


def _slurm_ext(root: Path, env: dict[str, str], *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "slurm_ext.cli", "--config", str(root / "config.toml"), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _readings(root: Path) -> dict | None:
    try:
        return json.loads((root / "run" / "health.json").read_text())
    except (OSError, ValueError):
        return None


class Replay:
    """One recording replayed: the fake built from a spec that describes its GPUs, every NVML path of slurm-ext run
    against it with the recorder on, the monitor run past every hold, and `health check --json` after it."""

    def __init__(self, lib: Path, root: Path, name: str):
        self.name = name
        self.recording = nvmlrecord.read(DATA / name)
        self.spec = fakenvml.spec_from_recording(self.recording)
        root.mkdir()
        fakenvml.write_spec(root / "gpus.json", self.spec)
        (root / "dev").mkdir()
        (root / "run").mkdir()  # the agent's runtime dir, made by the agent on a node
        _config(root)
        self.root = root
        env = _env(lib, root / "gpus.json", None)
        env.pop("SLURM_EXT_CONFIG", None)
        paths = subprocess.run([sys.executable, "-c", textwrap.dedent(PATHS), str(root / "dev")],
                               env={**env, nvmlrecord.ENV: str(root / "paths.json")}, capture_output=True, text=True,
                               timeout=120)
        assert paths.returncode == 0, paths.stdout + paths.stderr
        self.monitor_run(env)
        check = _slurm_ext(root, {**env, nvmlrecord.ENV: str(root / "check.json")}, "health", "check", "--json")
        self.check_out, check_err = check.communicate(timeout=120)
        self.check_code = check.returncode
        assert self.check_out, check_err
        self.check = json.loads(self.check_out)
        self.recorded = nvmlrecord.merge(*(nvmlrecord.read(root / f) for f in ("paths.json", "monitor.json",
                                                                                 "check.json")))

    def monitor_run(self, env: dict[str, str]) -> None:
        """`slurm-ext health monitor` until its readings span every hold and window, then SIGTERM (it stops)."""
        monitor = _slurm_ext(self.root, {**env, nvmlrecord.ENV: str(self.root / "monitor.json")}, "health",
                             "monitor")
        def readings(later_than: float) -> dict | None:
            assert monitor.poll() is None, f"the monitor ended: {monitor.communicate()}"
            found = _readings(self.root)
            return found if found and found["readings_time"] > later_than else None
        try:
            start = wait_for("the monitor's first readings", lambda: readings(0.0), timeout=60)["readings_time"]
            self.readings = wait_for(f"the monitor's readings {_LONGEST + 1:g}s after its first",
                                     lambda: readings(start + _LONGEST + 1), timeout=60)
        finally:
            monitor.send_signal(signal.SIGTERM)
            out, err = monitor.communicate(timeout=60)
        assert monitor.returncode == 0, err
        self.journal = [json.loads(line) for line in (self.root / "state" / "journal.jsonl").read_text().splitlines()
                        if line.strip()]
        self.state = json.loads((self.root / "state" / "health" / "findings.json").read_text())


@pytest.fixture(scope="module", params=RECORDINGS)
def replay(request, fakenvml_lib: Path, tmp_path_factory: pytest.TempPathFactory) -> Replay:
    return Replay(fakenvml_lib, tmp_path_factory.mktemp("replay") / "node", request.param)


def test_there_is_a_recording_to_replay() -> None:
    assert "h200-580-idle.json" in RECORDINGS


def test_every_call_answers_as_the_recorded_gpu_did(replay: Replay) -> None:
    """Each call slurm-ext makes, against the fake that describes the recorded GPU: the recorded return codes and
    value shapes. A call the recording lacks fails the test unless the recording names it in its gaps, and a gap
    that slurm-ext no longer hits is stale."""
    gaps, differences = nvmlrecord.declared(nvmlrecord.compare(replay.recording, replay.recorded),
                                            replay.recording)
    assert not differences, f"{replay.name}: " + "\n".join(map(str, differences))
    declared = set(replay.recording.get("gaps") or ())
    assert {d.name for d in gaps} == declared, f"{replay.name}: stale gaps {declared - {d.name for d in gaps}}"
    if gaps:
        warnings.warn(f"{replay.name}: {len(gaps)} calls slurm-ext makes that the recording lacks (its gaps): "
                      + "; ".join(sorted(d.key for d in gaps)), GapWarning, stacklevel=1)


def test_the_recorded_gpu_is_healthy_now(replay: Replay) -> None:
    """`health check --json` after the monitor's run: every check ran or does not apply, no finding, exit 0."""
    assert replay.check_code == 0, replay.check_out
    assert replay.check["healthy"] is True and replay.check["findings"] == []
    assert "fabric" in replay.check["not_applicable"]  # no NVSwitch fabric: state NOT_SUPPORTED is no fault
    assert set(replay.check["ran"]) >= {"gpu-lost", "temperature", "row-remap", "ecc", "pcie-link", "persistence",
                                        "nvml"}


def test_a_monitor_run_past_every_hold_finds_nothing_and_drains_nothing(replay: Replay) -> None:
    events = {e["event"] for e in replay.journal}
    assert "health-started" in events
    assert not events & {"health-finding", "health-escalated", "health-check-failed", "health-check-hung",
                         "health-source-failed"}, [e for e in replay.journal if e["event"] != "health-started"]
    assert not [e for e in replay.journal if e["event"].startswith("nodestate")], "a drain was asked for"
    assert replay.state["findings"] == [] and not replay.state.get("drains")
    assert replay.readings["findings"] == [] and replay.readings["nvml_error"] == ""
    (gpu, *_) = replay.readings["gpus"]
    assert gpu["error"] is None and gpu["failed"] == [] if "failed" in gpu else gpu["error"] is None
    states = replay.readings["checks"]
    assert {c: s for c, s in states.items() if s not in ("ok", "not-applicable", "disabled")} == {}
    assert states["fabric"] == "not-applicable" and states["slurmd"] == "disabled"


class GapWarning(UserWarning):
    """A recording lacks calls slurm-ext makes (the recording says why): shown in the test summary."""


#: every call a recording has, made again (through the recorder) against the fake: the recording's own probe
RECORDED_CALLS = """
    import ctypes, json, sys
    from slurm_ext import nvml, nvmlrecord
    m = nvml.load()
    m.nvmlInit()
    recording = json.load(open(sys.argv[1]))
    sets = []

    def event_set():
        if not sets:
            sets.append(m.nvmlEventSetCreate())
        return sets[0]

    def argument(value):
        if isinstance(value, dict) and "byref" in value:  # a struct filled by the call, versioned where it has one
            struct = getattr(m, value["byref"])()
            if hasattr(struct, "version"):
                struct.version = getattr(m, value["byref"][2:-2])
            return ctypes.byref(struct)
        if isinstance(value, dict) and value.get("object") == "LP_struct_c_nvmlEventSet_t":
            return event_set()
        return value

    for entry in recording["calls"]:
        call, gpu, args = entry["call"], entry["gpu"], list(entry["args"])
        if call in ("nvmlInit", "nvmlShutdown", "nvmlEventSetCreate", "nvmlEventSetFree") or isinstance(gpu, str):
            continue  # init and the event set are made here; MIG handles are not replayed
        kwargs = args.pop() if args and isinstance(args[-1], dict) and not {"byref", "object"} & set(args[-1]) else {}
        full = ([m.nvmlDeviceGetHandleByIndex(gpu)] if gpu is not None else []) + [argument(a) for a in args]
        params = entry.get("params") or []
        if call.startswith("nvmlEventSetWait"):
            params = [10]  # the wait's timeout: not the recorded seconds
        for position, value in zip(nvmlrecord.PARAMETERS.get(call, ()), params):
            full.insert(position, value)
        try:
            getattr(m, call)(*full, **kwargs)
        except m.NVMLError:
            pass
"""


def _recorded_calls(lib: Path, root: Path, spec: dict, recording: str) -> dict:
    """RECORDED_CALLS of `recording` (a file here) against the fake with `spec`, recorded."""
    root.mkdir()
    fakenvml.write_spec(root / "gpus.json", spec)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(RECORDED_CALLS), str(DATA / recording)],
                          env=_env(lib, root / "gpus.json", root / "calls.json"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return nvmlrecord.read(root / "calls.json")


@pytest.mark.parametrize("name", RECORDINGS)
def test_every_recorded_call_answers_as_recorded(fakenvml_lib: Path, tmp_path: Path, name: str) -> None:
    """Beyond slurm-ext's own calls: each call of the recording, made again against the fake that describes the
    GPU, answers with the recorded return code and value shape."""
    recorded = nvmlrecord.read(DATA / name)
    fake = _recorded_calls(fakenvml_lib, tmp_path / "node", fakenvml.spec_from_recording(recorded), name)
    assert len(fake["calls"]) >= len(recorded["calls"]) - 4  # all but init, the event set's, MIG handles
    differences = nvmlrecord.compare(recorded, fake)
    assert not differences, "\n".join(map(str, differences))


#: what the recorded H200 answered that is a fact of the GPU and its driver, not of the moment or of its identity:
#: the fake's defaults must give the same values (call, args, the part of the answer compared)
_FACTS = [
    ("nvmlSystemGetDriverVersion", [], None), ("nvmlSystemGetNVMLVersion", [], None), ("nvmlDeviceGetName", [], None),
    ("nvmlDeviceGetMemoryInfo", [], None), ("nvmlDeviceGetMemoryInfo", [{"version": 0x02000028}], None),
    ("nvmlDeviceGetPciInfo", [], ("pciDeviceId", "pciSubSystemId")), ("nvmlDeviceGetClockInfo", [0], None),
    ("nvmlDeviceGetClockInfo", [1], None), ("nvmlDeviceGetClockInfo", [2], None),
    ("nvmlDeviceGetCurrentClocksEventReasons", [], None), ("nvmlDeviceGetCurrentClocksThrottleReasons", [], None),
    *[("nvmlDeviceGetTemperatureThreshold", [kind], None) for kind in range(4)],
    ("nvmlDeviceGetTemperature", [0], None), ("nvmlDeviceGetPowerUsage", [], None),
    ("nvmlDeviceGetMaxPcieLinkGeneration", [], None), ("nvmlDeviceGetMaxPcieLinkWidth", [], None),
    ("nvmlDeviceGetCurrPcieLinkGeneration", [], None), ("nvmlDeviceGetCurrPcieLinkWidth", [], None),
    ("nvmlDeviceGetRemappedRows", [], None), ("nvmlDeviceGetPersistenceMode", [], None),
    ("nvmlDeviceGetSupportedEventTypes", [], None), ("nvmlDeviceGetMigMode", [], None),
    ("nvmlDeviceGetMaxMigDeviceCount", [], None), ("nvmlDeviceGetComputeRunningProcesses", [], None),
    ("nvmlDeviceGetGpuInstanceId", [], None), ("nvmlDeviceGetComputeInstanceId", [], None),
    ("nvmlDeviceGetNvLinkState", [0], None), ("nvmlDeviceGetRetiredPages", [0], None),
    ("nvmlDeviceGetRetiredPagesPendingStatus", [], None),
    ("nvmlDeviceGetGpuFabricInfo", [{"byref": "c_nvmlGpuFabricInfo_t"}], None),
    ("nvmlDeviceGetFieldValues", [[94, 38, 82, 143]], ("fieldId", "nvmlReturn", "valueType", "value")),
    ("nvmlEventSetWait_v2", [{"object": "LP_struct_c_nvmlEventSet_t"}], None),
]


def _answer(rec: dict, call: str, args: list) -> dict:
    (entry,) = [e for e in rec["calls"] if e["call"] == call and e["args"] == args]
    return entry["answers"][-1]


def _part(value, keys: tuple | None):
    if keys is None or value is None:
        return value
    if isinstance(value, list):
        return [_part(v, keys) for v in value]
    return {k: value[k] for k in keys}


@pytest.mark.parametrize("spec", [{"count": 1}, fakenvml.default_gpus(1)], ids=["count-only", "default_gpus"])
def test_where_a_spec_says_nothing_the_fake_answers_as_the_recorded_h200(fakenvml_lib: Path, tmp_path: Path,
                                                                          spec: dict) -> None:
    """The C defaults and default_gpus() are the idle H200 of the recording: every recorded call answers with its
    return code and value shape, and with its value where that is a fact of the GPU and its driver (not its
    identity, its counters or its now); the fabric call's structure says "no fabric" as the driver's did."""
    recorded = nvmlrecord.read(DATA / "h200-580-idle.json")
    fake = _recorded_calls(fakenvml_lib, tmp_path / "node", spec, "h200-580-idle.json")
    differences = nvmlrecord.compare(recorded, fake)
    assert not differences, "\n".join(map(str, differences))
    for call, args, keys in _FACTS:
        got, want = _answer(fake, call, args), _answer(recorded, call, args)
        assert got["ret"] == want["ret"], (call, args, got, want)
        assert _part(got.get("value"), keys) == _part(want.get("value"), keys), (call, args, got, want)
    (fabric,) = _answer(fake, "nvmlDeviceGetGpuFabricInfo", [{"byref": "c_nvmlGpuFabricInfo_t"}])["out"]
    assert (fabric["state"], fabric["status"]) == (0, 0)


def test_the_comparison_sees_an_answer_the_driver_did_not_give(fakenvml_lib: Path, tmp_path: Path) -> None:
    """The comparison has teeth: the fake made to answer as other drivers do differs from the recording there."""
    recorded = nvmlrecord.read(DATA / "h200-580-idle.json")
    spec = fakenvml.spec_from_recording(recorded)
    spec["gpus"][0].update(fabric="NOT_SUPPORTED", nvlink_past_last="INVALID_ARGUMENT",
                           temperature_thresholds={"mem_max": 95}, clocks_event_reasons=0)
    fake = _recorded_calls(fakenvml_lib, tmp_path / "node", spec, "h200-580-idle.json")
    assert {(d.key, d.kind) for d in nvmlrecord.compare(recorded, fake)} == {
        ('nvmlDeviceGetGpuFabricInfo(gpu 0, {"byref": "c_nvmlGpuFabricInfo_t"})', "ret"),
        ("nvmlDeviceGetNvLinkState(gpu 0, 0)", "ret"),
        ("nvmlDeviceGetTemperatureThreshold(gpu 0, 2)", "ret")}  # a number (the reasons) is no difference


#: the health fault tests' faults (tests/test_health_cluster.py), each on the recorded GPU: check, severity, action
FAULTS = [
    ({"temperature": 89}, "temperature", "warning", "failover"),
    ({"persistence_mode": 0}, "persistence", "warning", "none"),
    ({"pcie": {"width": 8}}, "pcie-link", "warning", "reboot"),
    ({"remapped_rows": {"pending": 1}}, "row-remap", "critical", "reset-gpu"),
    ({"remapped_rows": {"failure": 1, "uncorrected": 3}}, "row-remap", "critical", "remove"),
    ({"ecc": {"volatile": {"corrected": 0, "uncorrected": 2}}}, "ecc", "critical", "reset-gpu"),
    ({"lost": True}, "gpu-lost", "critical", "reboot"),
    ({"query_error": "RESET_REQUIRED"}, "gpu-lost", "critical", "reset-gpu"),
    ({"fabric": {"state": 2}}, "fabric", "critical", "reboot"),
    ({"retired_pages": [{"address": 4096 * n, "cause": "double_bit", "timestamp": 1700000000 + n}
                        for n in range(60)]}, "retired-pages", "critical", "remove"),
    ({"retired_pages": [], "retired_pages_pending": 1}, "retired-pages", "critical", "reset-gpu"),
    ({"query_error": "UNKNOWN"}, "nvml", "warning", "reboot"),  # one reading: the monitor judges repeats
]


@pytest.mark.parametrize("fault, check, severity, action", FAULTS,
                         ids=[f"{check}-{'-'.join(map(str, fault))}" for fault, check, *_ in FAULTS])
def test_each_fault_fires_on_the_recorded_gpus_answers(fakenvml_lib: Path, tmp_path: Path, fault: dict, check: str,
                                                       severity: str, action: str) -> None:
    """The fake describing the recorded idle H200, one fault injected: `health check --json` finds it, and only it."""
    spec = fakenvml.spec_from_recording(nvmlrecord.read(DATA / "h200-580-idle.json"))
    spec["gpus"][0].update(fault)
    root = tmp_path / "node"
    root.mkdir()
    (root / "run").mkdir()
    _config(root)
    fakenvml.write_spec(root / "gpus.json", spec)
    env = _env(fakenvml_lib, root / "gpus.json", None)
    env.pop("SLURM_EXT_CONFIG", None)
    out, err = _slurm_ext(root, env, "health", "check", "--json").communicate(timeout=120)
    found = [(f["check"], f["severity"], f["action"]) for f in json.loads(out)["findings"]]
    assert found == [(check, severity, action)], err
