"""Recording what NVML answers: every NVML call a process makes, its arguments, its answer and its time.

Why: the fake libnvidia-ml (devcluster/fakenvml) is worth only as much as its answers are the driver's. With
`SLURM_EXT_NVML_RECORD=<path>` in its environment, a slurm-ext process records every call it makes through
`slurm_ext.nvml.load()`, on a real GPU or on the fake, and the two recordings can be compared call by call
(`python -m slurm_ext.nvmlrecord diff OLD NEW`). Recordings of real GPUs are test data (tests/data/real-gpu/): the
replay test holds the fake to them, and a recording of another GPU is added as a file, not as code.

Main API:

- `recording(module, path)`: `module` (pynvml) behind a `Recorder`, one per path and process; `nvml.load()`
  returns it when the variable is set. Every attribute passes through; NVML's functions are recorded.
- `read(path)` / `write(recording, path)`: a recording file, checked / written atomically.
- `compare(old, new)`: where `new` answers otherwise than `old` (`Difference` records), `declared()` those
  `old` names as gaps, `shape(value)` the value shape compared, `merge(...)` several recordings of one run as one.
- `main(argv)`: the CLI, `diff OLD NEW` (exit 1 when they differ) and `show FILE`.

The format, version 1 (JSON, one object)::

    {"format": "slurm-ext-nvml-recording", "version": 1,
     "source": {"recorded": "2026-12-04T16:41:26Z", "argv": [...], "pynvml": "13.615.71", ...},
     "calls": [
       {"call": "nvmlDeviceGetTemperatureThreshold", "gpu": 0, "args": [1],
        "count": 3, "ms": {"median": 2.79, "max": 3.1},
        "answers": [{"ret": 0, "value": 89, "count": 3}]},
       {"call": "nvmlDeviceGetGpuFabricInfoV", "gpu": 0, "args": [{"byref": "c_nvmlGpuFabricInfo_v3_t"}], ...,
        "answers": [{"ret": 0, "value": 0, "out": [{"version": 50331688, "state": 0, "status": 0, ...}]}]},
       {"call": "nvmlDeviceGetRetiredPagesPendingStatus", "gpu": 0, "args": [], ...,
        "answers": [{"ret": 3, "text": "Not Supported", "count": 1}]}],
     "gaps": {"nvmlShutdown": "why this recording lacks a call the project makes"}}

- One entry per (call, gpu, args): `call` is pynvml's function name, `gpu` the NVML index of the device handle
  passed first (null: no handle; "0/mig1": MIG slot 1 of GPU 0; "?": a handle not seen coming from
  nvmlDeviceGetHandleByIndex), `args` the other arguments made JSON-able (a ctypes object passed by reference is
  {"byref": its type}, any other object {"object": its type}, keyword arguments one {"name": value} at the end).
- `params` (optional): arguments that say how to answer, not what is asked (a CPU-set size, an event mask, a wait's
  timeout; `PARAMETERS` names them). They are not part of the entry's identity; the first seen is kept.
- `count` calls, their time in ms (`median` of the last 1000, `max` of all; null where not measured), and
  `answers`: one per NVML return code seen (`ret`: 0 is success; null for an exception that is no NVML error),
  with the latest `value` returned (ctypes structures as {field: value}, arrays as lists, device handles as
  {"handle": gpu}), `out`: the fields of each by-reference argument after the call, and `text`: the error's
  message.
- Written by hand or converted from older notes: `"derived": "why"` on an entry inferred rather than seen,
  `"partial": true` on one whose values carry only some of the answer's fields, {"$unrecorded": type} for a value
  whose content was not kept. `gaps` names calls the project makes that the recording lacks, with the reason.

Comparing (`compare`): each call of NEW is looked up in OLD by (call, gpu, args); its return codes must be ones OLD
saw (an event wait's TIMEOUT and SUCCESS stand for each other: which one comes depends on what happened, not on
the driver), and for each code both saw, the value shapes (types, keys, list items) must be the same; numbers may
differ. nvmlDeviceGetFieldValues is compared field by field (by field id, in any of OLD's calls on that GPU): each
field's own return code and, when it succeeded, its value type.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import datetime
import inspect
import json
import os
import statistics
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ENV", "FORMAT", "VERSION", "PARAMETERS", "Recorder", "Difference", "recording", "read", "write",
           "shape", "compare", "declared", "merge", "key_text", "main"]

#: the environment variable that turns recording on: the file to write
ENV = "SLURM_EXT_NVML_RECORD"
FORMAT = "slurm-ext-nvml-recording"
VERSION = 1

#: positional arguments (0: the first, the handle) that say how to answer, not what is asked: kept as `params`
PARAMETERS: dict[str, tuple[int, ...]] = {
    "nvmlDeviceGetCpuAffinity": (1,),
    "nvmlDeviceGetCpuAffinityWithinScope": (1,),
    "nvmlDeviceGetMemoryAffinity": (1,),
    "nvmlDeviceRegisterEvents": (1,),
    "nvmlEventSetWait": (1,),
    "nvmlEventSetWait_v2": (1,),
}

#: return codes that stand for each other: an event wait gets an event or times out, by what happened
_EITHER = {"nvmlEventSetWait": {0, 10}, "nvmlEventSetWait_v2": {0, 10}}
#: functions of pynvml's that are no NVML call (helpers of its own)
_NOT_CALLS = {"nvmlExceptionClass", "nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct"}
#: how often a recording is written while calls come (a monitor killed by SIGTERM runs no atexit)
_WRITE_EVERY = 10.0
#: the first write, this long after the first call: a process killed early still leaves its first calls
_FIRST_WRITE = 1.0
#: call times kept per entry for the median
_SAMPLES = 1000
#: nvmlValueType_t -> the member of nvmlValue_t that holds it
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


# -- JSON-able values -------------------------------------------------------------------------------------


class _Handles:
    """Device handles seen coming back from NVML, by address: their GPU label."""

    def __init__(self) -> None:
        self.labels: dict[int, int | str] = {}

    @staticmethod
    def address(value: Any) -> int | None:
        if isinstance(value, ctypes._Pointer) and "nvmlDevice" in type(value).__name__:
            return ctypes.cast(value, ctypes.c_void_p).value
        return None

    def label(self, value: Any) -> int | str | None:
        address = self.address(value)
        if address is None:
            return None
        return self.labels.get(address, "?")


def _plain(value: Any, handles: _Handles, depth: int = 0) -> Any:
    """`value` as JSON: numbers, strings, lists and objects only."""
    if depth > 8:
        return {"object": type(value).__name__}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (list, tuple)):
        return [_plain(v, handles, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, handles, depth + 1) for k, v in value.items()}
    label = handles.label(value)
    if label is not None or _Handles.address(value) is not None:
        return {"handle": label}
    if isinstance(value, ctypes._SimpleCData):
        return _plain(value.value, handles, depth + 1)
    if isinstance(value, ctypes.Array):
        return [_plain(v, handles, depth + 1) for v in value]
    if isinstance(value, ctypes.Structure):
        return _struct(value, handles, depth)
    if type(value).__name__ == "CArgObject":  # ctypes.byref(x)
        return {"byref": type(getattr(value, "_obj", value)).__name__}
    if type(value).__name__ == "nvmlFriendlyObject":
        return {k: _plain(v, handles, depth + 1) for k, v in vars(value).items()}
    return {"object": type(value).__name__}


def _struct(value: ctypes.Structure, handles: _Handles, depth: int) -> dict:
    fields = {}
    for name, *_ in value._fields_:
        item = getattr(value, name)
        if isinstance(item, ctypes.Union):
            item = _union(value, name, item)
        fields[name] = _plain(item, handles, depth + 1)
    return fields


def _union(owner: ctypes.Structure, name: str, union: ctypes.Union) -> Any:
    """An nvmlValue_t as the number its valueType says; any other union as its first member."""
    kind = getattr(owner, "valueType", None)
    member = _VALUE_MEMBERS.get(kind) if name == "value" and isinstance(kind, int) else None
    return getattr(union, member or union._fields_[0][0])


# -- the recorder -----------------------------------------------------------------------------------------


class _Entry:
    """One (call, gpu, args) while it is being recorded (mutable: counts grow)."""

    def __init__(self, call: str, gpu: Any, args: list, params: list | None):
        self.call, self.gpu, self.args, self.params = call, gpu, args, params
        self.count = 0
        self.samples: deque[float] = deque(maxlen=_SAMPLES)
        self.max_ms = 0.0
        self.answers: dict[Any, dict] = {}

    def add(self, ms: float, ret: int | None, answer: dict) -> None:
        self.count += 1
        self.samples.append(ms)
        self.max_ms = max(self.max_ms, ms)
        seen = self.answers.get(ret)
        answer["count"] = (seen["count"] if seen else 0) + 1
        self.answers[ret] = answer

    def as_json(self) -> dict:
        entry = {"call": self.call, "gpu": self.gpu, "args": self.args}
        if self.params is not None:
            entry["params"] = self.params
        entry["count"] = self.count
        entry["ms"] = {"median": round(statistics.median(self.samples), 4), "max": round(self.max_ms, 4)}
        entry["answers"] = [self.answers[ret] for ret in sorted(self.answers, key=lambda r: (r is None, r or 0))]
        return entry


class Recorder:
    """pynvml with every NVML call recorded; every other attribute passes through unchanged.

    One per recording file and process (`recording()`): code that tells NVML modules apart by identity
    (`nvml.init_once`) sees one module. The file is written at exit, one second after the first call, and then
    at most every 10 s while calls come, always whole (a temporary file renamed over it).
    """

    def __init__(self, module: Any, path: str | os.PathLike):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_path", Path(path))
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_write_lock", threading.Lock())
        object.__setattr__(self, "_entries", {})
        object.__setattr__(self, "_handles", _Handles())
        object.__setattr__(self, "_wrapped", {})
        object.__setattr__(self, "_dirty", threading.Event())
        object.__setattr__(self, "_writer", None)
        object.__setattr__(self, "_started", datetime.datetime.now(datetime.timezone.utc))
        atexit.register(self.flush)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if not (name.startswith("nvml") and name not in _NOT_CALLS and inspect.isfunction(value)):
            return value
        wrapped = self._wrapped.get(name)
        if wrapped is None:
            wrapped = self._wrap(name, value)
            self._wrapped[name] = wrapped
        return wrapped

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._module, name, value)

    def __dir__(self) -> list[str]:
        return dir(self._module)

    def __repr__(self) -> str:
        return f"<pynvml recorded to {self._path}>"

    def _wrap(self, name: str, function: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                value = function(*args, **kwargs)
            except BaseException as err:
                self._add(name, args, kwargs, None, err, (time.perf_counter() - start) * 1000)
                raise
            self._add(name, args, kwargs, value, None, (time.perf_counter() - start) * 1000)
            return value
        call.__name__ = call.__qualname__ = name
        call.__doc__ = function.__doc__
        call.__wrapped__ = function
        return call

    def _add(self, name: str, args: tuple, kwargs: dict, value: Any, err: BaseException | None, ms: float) -> None:
        try:
            self._record(name, args, kwargs, value, err, ms)
        except Exception as bug:  # recording must never change what the caller gets
            print(f"slurm-ext: nvmlrecord: cannot record {name}: {bug!r}", file=sys.stderr)

    def _record(self, name: str, args: tuple, kwargs: dict, value: Any, err: BaseException | None,
                ms: float) -> None:
        handles = self._handles
        gpu = handles.label(args[0]) if args else None
        rest = list(args[1:] if gpu is not None else args)
        skip = {p - (len(args) - len(rest)) for p in PARAMETERS.get(name, ())}
        identity = [_plain(a, handles) for i, a in enumerate(rest) if i not in skip]
        if kwargs:
            identity.append({k: _plain(v, handles) for k, v in sorted(kwargs.items())})
        params = [_plain(a, handles) for i, a in enumerate(rest) if i in skip] or None
        if err is None:
            self._learn_handle(name, args, gpu, value)
            answer: dict = {"ret": 0, "value": _plain(value, handles)}
            outs = [_plain(getattr(a, "_obj", None), handles) for a in args if type(a).__name__ == "CArgObject"]
            if outs:
                answer["out"] = outs
            ret: int | None = 0
        else:
            code = getattr(err, "value", None)
            ret = code if isinstance(code, int) and not isinstance(code, bool) else None
            text = str(err) if ret is not None else f"{type(err).__name__}: {err}"
            answer = {"ret": ret, "text": text}
        key = (name, json.dumps(gpu), json.dumps(identity, sort_keys=True))
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(name, gpu, identity, params)
            entry.add(ms, ret, answer)
        self._dirty.set()
        self._start_writer()

    def _learn_handle(self, name: str, args: tuple, gpu: Any, value: Any) -> None:
        address = _Handles.address(value)
        if address is None:
            return
        labels = self._handles.labels
        if name in ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2") and args:
            labels[address] = int(args[0])
        elif name == "nvmlDeviceGetMigDeviceHandleByIndex" and len(args) > 1 and gpu is not None:
            labels.setdefault(address, f"{gpu}/mig{int(args[1])}")

    def _start_writer(self) -> None:
        if self._writer is not None:
            return
        with self._lock:
            if self._writer is not None:
                return
            writer = threading.Thread(target=self._write_loop, name="nvml-record", daemon=True)
            object.__setattr__(self, "_writer", writer)
        writer.start()

    def _write_loop(self) -> None:
        time.sleep(_FIRST_WRITE)
        while True:
            self._dirty.wait()
            self.flush()
            time.sleep(_WRITE_EVERY)

    def snapshot(self) -> dict:
        """The recording so far, in the file's format."""
        with self._lock:
            calls = [entry.as_json() for entry in self._entries.values()]
        calls.sort(key=_sort_key)
        module = self._module
        source = {"recorded": self._started.strftime("%Y-%m-%dT%H:%M:%SZ"), "host": os.uname().nodename,
                  "argv": list(sys.argv), "pid": os.getpid(), "pynvml": _pynvml_version(module)}
        return {"format": FORMAT, "version": VERSION, "source": source, "calls": calls}

    def flush(self) -> None:
        """Write the recording now (nothing when no call came yet)."""
        with self._write_lock:
            if not self._entries:
                return
            self._dirty.clear()
            try:
                write(self.snapshot(), self._path)
            except OSError as err:
                print(f"slurm-ext: nvmlrecord: cannot write {self._path}: {err}", file=sys.stderr)


def _pynvml_version(module: Any) -> str:
    try:
        from importlib.metadata import version
        return version("nvidia-ml-py")
    except Exception:  # noqa: BLE001 - a stand-in module, or no metadata: the version is only a note
        return str(getattr(module, "__version__", ""))


_RECORDERS: dict[tuple[int, str], Recorder] = {}
_RECORDERS_LOCK = threading.Lock()


def recording(module: Any, path: str | os.PathLike) -> Recorder:
    """`module` behind the one `Recorder` of this process for `path` (relative paths are taken from the current
    directory at the first call)."""
    resolved = str(Path(path).absolute())
    with _RECORDERS_LOCK:
        recorder = _RECORDERS.get((id(module), resolved))
        if recorder is None:
            recorder = _RECORDERS[(id(module), resolved)] = Recorder(module, resolved)
        return recorder


# -- files ------------------------------------------------------------------------------------------------


def _sort_key(entry: dict) -> tuple:
    return entry["call"], json.dumps(entry.get("gpu")), json.dumps(entry.get("args"), sort_keys=True)


def write(recording: dict, path: str | os.PathLike) -> None:
    """Write `recording` to `path` atomically (readers never see half a file).

    Raises:
        OSError: the directory is missing or not writable.
    """
    from slurm_ext.fileio import atomic_write
    atomic_write(path, json.dumps(recording, indent=1, sort_keys=False) + "\n", fsync="file")


def read(path: str | os.PathLike) -> dict:
    """The recording in `path`.

    Raises:
        OSError: it cannot be read.
        ValueError: it is no recording of this format and version (the message says what is wrong).
    """
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not an NVML recording (expected \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise ValueError(f"{path}: recording version {data.get('version')!r} (this slurm-ext reads {VERSION})")
    calls = data.get("calls")
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("call"), str)
                                              and isinstance(c.get("answers"), list) for c in calls):
        raise ValueError(f"{path}: \"calls\" must be a list of entries with \"call\" and \"answers\"")
    return data


def merge(*recordings: dict) -> dict:
    """Several recordings as one (the processes of one run): counts added, the slower max kept."""
    entries: dict[tuple, dict] = {}
    for rec in recordings:
        for entry in rec["calls"]:
            key = _sort_key(entry)
            seen = entries.get(key)
            if seen is None:
                entries[key] = json.loads(json.dumps(entry))
                continue
            seen["count"] = seen.get("count", 0) + entry.get("count", 0)
            old_ms, new_ms = seen.get("ms") or {}, entry.get("ms") or {}
            if new_ms.get("max") is not None and (old_ms.get("max") is None or new_ms["max"] > old_ms["max"]):
                seen["ms"] = {**old_ms, "max": new_ms["max"]}
            by_ret = {a.get("ret"): a for a in seen["answers"]}
            for answer in entry["answers"]:
                if answer.get("ret") in by_ret:
                    by_ret[answer.get("ret")]["count"] = by_ret[answer.get("ret")].get("count", 0) + answer.get(
                        "count", 0)
                else:
                    seen["answers"].append(answer)
    first = recordings[0] if recordings else {}
    return {"format": FORMAT, "version": VERSION, "source": first.get("source", {}),
            "calls": sorted(entries.values(), key=_sort_key)}


# -- comparing --------------------------------------------------------------------------------------------


def shape(value: Any) -> Any:
    """What a comparison looks at: a value's types and keys, never its numbers.

    {"$unrecorded": t} is "?" (anything); a list's shape is ["list", the shapes of its items, merged]."""
    if isinstance(value, dict):
        if "$unrecorded" in value:
            return "?"
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        items = {json.dumps(shape(v), sort_keys=True) for v in value}
        return ["list", *sorted(json.loads(i) for i in items)] if items else ["list"]
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "str"


def _same_shape(old: Any, new: Any, partial: bool) -> bool:
    """Whether `new` has `old`'s shape. `partial`: old recorded only some of the fields (compare those)."""
    if old == "?" or new == "?":
        return True
    if isinstance(old, dict) and isinstance(new, dict):
        if not partial and set(old) != set(new):
            return False
        return all(k in new and _same_shape(v, new[k], partial) for k, v in old.items())
    if isinstance(old, list) and isinstance(new, list) and old[:1] == new[:1] == ["list"]:
        if len(old) == 1 or len(new) == 1:  # an empty list has the shape of any list
            return True
        return all(any(_same_shape(o, n, partial) for o in old[1:]) for n in new[1:])
    return old == new


@dataclass(frozen=True, slots=True)
class Difference:
    """One way NEW answered otherwise than OLD."""

    call: str
    gpu: Any
    args: Any
    #: "missing": OLD has no such call; "ret": a return code OLD never saw; "shape": another value shape
    kind: str
    #: what OLD and NEW had (return codes, or the shapes)
    old: Any = None
    new: Any = None

    @property
    def key(self) -> str:
        return key_text(self.call, self.gpu, self.args)

    @property
    def name(self) -> str:
        """The call as a recording's `gaps` name it: 'nvmlShutdown', 'nvmlDeviceGetFieldValues field 230'."""
        field = self.args[0] if isinstance(self.args, list) and len(self.args) == 1 and \
            str(self.args[0]).startswith("field ") else None
        return f"{self.call} {field}" if field else self.call

    def __str__(self) -> str:
        if self.kind == "missing":
            return f"{self.key}: not in the recording compared with (answered {self.new})"
        if self.kind == "ret":
            return f"{self.key}: return code {self.new}, the recording has {self.old}"
        return f"{self.key}: value shape {json.dumps(self.new)}, the recording has {json.dumps(self.old)}"


def key_text(call: str, gpu: Any = None, args: Any = None) -> str:
    """'nvmlDeviceGetClockInfo(gpu 0, 1)': a call as the diff prints it and `gaps` may name it."""
    parts = ([f"gpu {gpu}"] if gpu is not None else []) + [json.dumps(a, sort_keys=True) for a in args or ()]
    return f"{call}({', '.join(parts)})"


def declared(differences: list[Difference], old: dict) -> tuple[list[Difference], list[Difference]]:
    """`differences` split into those `old` declares as gaps (calls it lacks, said why) and the rest."""
    gaps = set(old.get("gaps") or ())
    known = [d for d in differences if d.kind == "missing" and d.name in gaps]
    return known, [d for d in differences if d not in known]


def _codes(entry: dict) -> set:
    return {a.get("ret") for a in entry["answers"]}


def _index(rec: dict) -> dict[tuple, dict]:
    return {_sort_key(e): e for e in rec["calls"]}


def compare(old: dict, new: dict) -> list[Difference]:
    """Where `new` (a recording) answers otherwise than `old`: every call of `new`, looked up in `old` (see the
    module docstring). Calls only `old` made are no difference."""
    found: list[Difference] = []
    known = _index(old)
    for entry in new["calls"]:
        if entry["call"] == "nvmlDeviceGetFieldValues":
            found.extend(_compare_fields(old, entry))
            continue
        seen = known.get(_sort_key(entry))
        call, gpu, args = entry["call"], entry.get("gpu"), entry.get("args")
        if seen is None:
            found.append(Difference(call, gpu, args, "missing", None, sorted(_codes(entry), key=str)))
            continue
        found.extend(_compare_entry(seen, entry))
    return found


def _compare_entry(seen: dict, entry: dict) -> list[Difference]:
    call, gpu, args = entry["call"], entry.get("gpu"), entry.get("args")
    old_codes, new_codes = _codes(seen), _codes(entry)
    either = _EITHER.get(call, set())
    strange = {c for c in new_codes - old_codes if not (c in either and old_codes & either)}
    if strange:
        return [Difference(call, gpu, args, "ret", sorted(old_codes, key=str), sorted(new_codes, key=str))]
    partial = bool(seen.get("partial"))
    old_answers = {a.get("ret"): a for a in seen["answers"]}
    for answer in entry["answers"]:
        before = old_answers.get(answer.get("ret"))
        if before is None or answer.get("ret") != 0:
            continue
        for part in ("value", "out"):
            if part not in before or part not in answer:
                continue
            was, now = shape(before[part]), shape(answer[part])
            if not _same_shape(was, now, partial):
                return [Difference(call, gpu, args, "shape", was, now)]
    return []


def _compare_fields(old: dict, entry: dict) -> list[Difference]:
    """nvmlDeviceGetFieldValues, field by field: each field id of `entry` in any of `old`'s calls on the GPU."""
    call, gpu = entry["call"], entry.get("gpu")
    olds = [e for e in old["calls"] if e["call"] == call and e.get("gpu") == gpu]
    if not olds:
        return [Difference(call, gpu, entry.get("args"), "missing", None, sorted(_codes(entry), key=str))]
    found = _compare_entry({**olds[0], "answers": [a for e in olds for a in e["answers"]]},
                           {**entry, "answers": [{k: v for k, v in a.items() if k != "value"}
                                                 for a in entry["answers"]]})
    fields: dict[int, dict] = {}
    for e in olds:
        for answer in e["answers"]:
            for item in answer.get("value") or ():
                if isinstance(item, dict) and "fieldId" in item:
                    fields.setdefault(item["fieldId"], item)
    for answer in entry["answers"]:
        for item in answer.get("value") or ():
            if not isinstance(item, dict) or "fieldId" not in item:
                continue
            fid = item["fieldId"]
            was = fields.get(fid)
            if was is None:
                found.append(Difference(call, gpu, [f"field {fid}"], "missing", None, [item.get("nvmlReturn")]))
            elif was.get("nvmlReturn") != item.get("nvmlReturn"):
                found.append(Difference(call, gpu, [f"field {fid}"], "ret", [was.get("nvmlReturn")],
                                        [item.get("nvmlReturn")]))
            elif item.get("nvmlReturn") == 0 and was.get("valueType") != item.get("valueType"):
                found.append(Difference(call, gpu, [f"field {fid}"], "shape", {"valueType": was.get("valueType")},
                                        {"valueType": item.get("valueType")}))
    return found


# -- the CLI ----------------------------------------------------------------------------------------------


def _show(path: str) -> int:
    rec = read(path)
    source = rec.get("source") or {}
    print(f"{path}: {len(rec['calls'])} calls; " + ", ".join(f"{k} {v}" for k, v in source.items()
                                                             if isinstance(v, (str, int, float))))
    for entry in rec["calls"]:
        ms = entry.get("ms") or {}
        answers = "; ".join(_answer_text(a) for a in entry["answers"])
        took = f"{ms['median']:.3f} ms" if ms.get("median") is not None else "-"
        notes = " (derived)" if entry.get("derived") else ""
        print(f"  {key_text(entry['call'], entry.get('gpu'), entry.get('args'))}: {answers} [{took}]{notes}")
    for call, why in (rec.get("gaps") or {}).items():
        print(f"  gap {call}: {why}")
    return 0


def _answer_text(answer: dict) -> str:
    text = (f"ok {json.dumps(answer.get('value'))[:80]}" if answer.get("ret") == 0
            else f"error {answer.get('ret')} {answer.get('text', '')}")
    return text + (f" x{answer['count']}" if answer.get("count", 1) != 1 else "")


def _diff(old_path: str, new_path: str) -> int:
    old = read(old_path)
    gaps, differences = declared(compare(old, read(new_path)), old)
    for difference in gaps:
        print(f"{difference.key}: a gap of {old_path} ({old['gaps'][difference.name]})")
    for difference in differences:
        print(difference)
    if differences:
        print(f"{len(differences)} difference(s) between {old_path} and {new_path}")
        return 1
    print(f"{new_path}: every call answers as in {old_path}" + (f", but for {len(gaps)} gap(s) it declares"
                                                                 if gaps else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_ext.nvmlrecord",
                                     description="NVML recordings (SLURM_EXT_NVML_RECORD=<file>): compare, show")
    commands = parser.add_subparsers(dest="command", required=True)
    diff = commands.add_parser("diff", help="where NEW's return codes or value shapes differ from OLD's "
                                            "(exit 1 when they do, or when NEW made a call OLD lacks and does "
                                            "not name in its gaps)")
    diff.add_argument("old")
    diff.add_argument("new")
    show = commands.add_parser("show", help="a recording, one line a call")
    show.add_argument("file")
    args = parser.parse_args(argv)
    try:
        if args.command == "diff":
            return _diff(args.old, args.new)
        return _show(args.file)
    except (OSError, ValueError) as err:
        print(f"slurm-ext: nvmlrecord: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
