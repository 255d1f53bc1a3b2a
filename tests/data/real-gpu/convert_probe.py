#!/usr/bin/env python3
"""The probe's notes of a real H200 (original/h200-580-*.json) as NVML recordings (slurm_ext.nvmlrecord's format).

Why: the first real GPU was read by a probe script written before slurm-ext had a recorder; its notes name calls
loosely ("Temp_GPU", "TempThreshold_SLOWDOWN", "fabric") and keep some answers only as Python reprs. This script
says once how each note maps to an NVML call, so the recordings the tests replay are traceable to what the driver
answered. What is inferred rather than seen is marked "derived" with the reason; answers whose content the probe
did not keep are {"$unrecorded": type}; calls slurm-ext makes that the probe did not are listed in "gaps".

Run from anywhere: python tests/data/real-gpu/convert_probe.py (rewrites h200-580-idle.json and h200-580-load.json
beside it; tests/test_nvml_replay.py checks that the files are this script's output).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORIGINALS = HERE / "original"

#: pynvml's constants the probe's names stand for
_THRESHOLDS = {"SHUTDOWN": 0, "SLOWDOWN": 1, "MEM_MAX": 2, "GPU_MAX": 3}
_CLOCKS = {"GRAPHICS": 0, "SM": 1, "MEM": 2}
_EVENT_SET = {"object": "LP_struct_c_nvmlEventSet_t"}
_REPR = re.compile(r"^<pynvml\.(\w+) object at 0x[0-9a-f]+>$")

#: calls slurm-ext makes that the probe did not, and why the recording cannot say what the driver answered
GAPS = {
    "nvmlShutdown": "the probe never shut NVML down (the gres inventory does, once per reading)",
    "nvmlEventSetFree": "the probe never freed its event set (the health monitor does when it stops)",
    "nvmlDeviceGetGpuFabricInfoV": "the probe asked the unversioned nvmlDeviceGetGpuFabricInfo only; the health "
                                   "reader asks the versioned call with GpuFabricInfo v3 first",
    "nvmlDeviceGetFieldValues field 230": "the probe did not ask NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; the health "
                                          "monitor's readings on the same GPU (original/h200-580-monitor-readings"
                                          ".json) show recovery_action 0, so it answered SUCCESS, of a value type "
                                          "not recorded",
}

#: gaps of one state's file only
STATE_GAPS = {
    "load": {"nvmlDeviceGetMemoryInfo": "the probe read NVML's v2 memory (version=nvmlMemory_v2) on the idle GPU "
                                        "only; under load it has v1"},
}


def _value(value):
    """A probe value as a recording's: reprs of objects it did not keep become {"$unrecorded": type}."""
    if isinstance(value, str):
        match = _REPR.match(value)
        return {"$unrecorded": match.group(1)} if match else value
    if isinstance(value, list):
        return [_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _value(v) for k, v in value.items()}
    return value


def _ms(note: dict | None) -> dict | None:
    if note is None or note.get("ms") is None:
        return None
    return {"median": note["ms"], "max": note["ms"]}


def _entry(call: str, gpu, args: list, note: dict, *, params=None, out=None, derived: str | None = None,
           partial: bool = False, ms: dict | None = None) -> dict:
    if "err" in note:
        answer = {"ret": note["err"], "text": note["text"], "count": 1}
    else:
        answer = {"ret": 0, "value": _value(note.get("ok")), "count": 1}
        if out is not None:
            answer["out"] = out
    entry = {"call": call, "gpu": gpu, "args": args}
    if params is not None:
        entry["params"] = params
    entry.update(count=1, ms=ms if ms is not None else _ms(note), answers=[answer])
    if derived:
        entry["derived"] = derived
    if partial:
        entry["partial"] = True
    return entry


def _gpu_entries(index: int, gpu: dict) -> list[dict]:
    found = []
    for name, note in gpu.items():
        if name.startswith("nvml"):
            found.append(_entry(name, index, [], note))
        elif name.startswith("Temp_"):
            found.append(_entry("nvmlDeviceGetTemperature", index, [0], note))
        elif name.startswith("TempThreshold_"):
            found.append(_entry("nvmlDeviceGetTemperatureThreshold", index, [_THRESHOLDS[name[14:]]], note))
        elif name.startswith("Clock_"):
            found.append(_entry("nvmlDeviceGetClockInfo", index, [_CLOCKS[name[6:]]], note))
        elif name.startswith("TotalEcc_"):
            error_type, counter_type = map(int, name[9:].split("_"))
            found.append(_entry("nvmlDeviceGetTotalEccErrors", index, [error_type, counter_type], note))
        elif name.startswith("RetiredPages_"):
            found.append(_entry("nvmlDeviceGetRetiredPages", index, [int(name[13:])], note))
        elif name == "CpuAffinity":
            size = int(re.search(r"Array_(\d+)", note["ok"]).group(1))
            found.append(_entry("nvmlDeviceGetCpuAffinity", index, [], note, params=[size]))
        elif name == "fabric":
            found.append(_entry("nvmlDeviceGetGpuFabricInfo", index, [{"byref": "c_nvmlGpuFabricInfo_t"}],
                                {"ok": 0}, out=[note], partial=True))
        elif name == "nvlink":
            for link, states in note.items():
                found.append(_entry("nvmlDeviceGetNvLinkState", index, [int(link)], states["state"]))
        elif name == "FieldValues":
            fields = [{"fieldId": f["id"], "nvmlReturn": f["ret"], "valueType": f["type"], "value": f["u64"]}
                      for f in note]
            found.append(_entry("nvmlDeviceGetFieldValues", index, [[f["id"] for f in note]], {"ok": fields},
                                partial=True))
        else:
            raise ValueError(f"gpus[{index}].{name}: no NVML call known for this note")
    found.append(_entry("nvmlDeviceGetHandleByIndex", None, [index], {"ok": {"handle": index}},
                        derived="every device call above needed this GPU's handle"))
    return found


def convert(probe: dict, name: str, state: str, readme: dict) -> dict:
    """The recording of one probe file (`state`: what the GPU was doing)."""
    calls = [_entry("nvmlInit", None, [], {"ok": None}, ms={"median": probe["init_ms"], "max": probe["init_ms"]}),
             _entry("nvmlSystemGetDriverVersion", None, [], probe["driver"]),
             _entry("nvmlSystemGetNVMLVersion", None, [], probe["nvml_version"]),
             _entry("nvmlDeviceGetCount", None, [], probe["count"])]
    for index, gpu in enumerate(probe["gpus"]):
        calls += _gpu_entries(index, gpu)
    calls.append(_entry("nvmlEventSetCreate", None, [], {"ok": _EVENT_SET},
                        derived="the probe registered events (below), which takes an event set"))
    calls.append(_entry("nvmlDeviceRegisterEvents", 0, [_EVENT_SET], {"ok": None},
                        params=[probe["register_events"]["ok"]]))
    wait = probe["event_wait"]
    waited = {"median": round(wait["s"] * 1000, 3), "max": round(wait["s"] * 1000, 3)} if "s" in wait else None
    calls.append(_entry("nvmlEventSetWait_v2", None, [_EVENT_SET], wait, ms=waited))
    calls += readme.get(state, [])
    calls.sort(key=lambda e: (e["call"], json.dumps(e["gpu"]), json.dumps(e["args"], sort_keys=True)))
    source = {"converted_from": f"original/{name}", "converter": "convert_probe.py",
              "gpu": "NVIDIA H200 (SXM, 141 GB HBM3e), no NVSwitch fabric, no NVLink peers",
              "host": "Firecracker VM, kernel 6.18, NVIDIA open kernel module", "driver": "580.159.04",
              "recorded": "2026-12-04", "state": state,
              "by": "a probe script through the real pynvml (nvidia-ml-py 13.x), before slurm-ext had a recorder"}
    return {"format": "slurm-ext-nvml-recording", "version": 1, "source": source, "calls": calls,
            "gaps": {**GAPS, **STATE_GAPS.get(state, {})}}


def _readme_entries() -> dict:
    """What original/README.md says of calls the probe files lack: NVML's v2 memory, read on the idle GPU."""
    total, reserve = 150_754_820_096, 644_939_776
    v2 = _entry("nvmlDeviceGetMemoryInfo", 0, [{"version": 0x02000028}],
                {"ok": {"version": 0x02000028, "total": total, "reserved": reserve, "free": total - reserve,
                        "used": 0}},
                derived="original/README.md: 'v2 (nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)): used 0, "
                        "reserved 615 MiB' with v1's total; the reserve in bytes is v1's used with no process "
                        "(nvidia-smi -q rounds it to 616 MiB)")
    return {"idle": [v2]}


def main() -> int:
    readme = _readme_entries()
    for name, state in (("h200-580-idle.json", "idle"), ("h200-580-load.json", "load")):
        probe = json.loads((ORIGINALS / name).read_text())
        text = json.dumps(convert(probe, name, state, readme), indent=1) + "\n"
        (HERE / name).write_text(text)
        print(f"{HERE / name}: {len(json.loads(text)['calls'])} calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
