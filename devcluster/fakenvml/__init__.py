"""Build and drive the fake ``libnvidia-ml.so.1`` used by tests and the dev cluster.

Why this exists: slurm-ext reads GPU state through the real ``pynvml``
package, which loads ``libnvidia-ml.so.1`` from the library search path.  On
machines without NVIDIA GPUs (CI, laptops, the local dev cluster) we put a
fake library with the same name and ABI first on ``LD_LIBRARY_PATH``.  Its
answers come from a JSON spec file named by ``$SLURM_EXT_FAKE_NVML``, which
tests rewrite while code runs to inject faults (lost GPUs, Xid events,
throttling).  Where a spec says nothing, the fake answers as a real driver
did: the recorded H200 of tests/data/real-gpu/ (``default_gpus`` and the C
defaults), and ``spec_from_recording`` describes any recorded GPU; the spec's
``latency`` makes calls take their recorded time.  Given
``$SLURM_EXT_FAKE_NVML_DEV_DIR`` (``environ(dev_dir=)``),
a process sees only the GPUs whose device file it can open, as the real
driver under a job's devices cgroup.  The C sources and the spec format live beside this module, as
package data (see README.md here), so an installed slurm-ext builds the fake
without a checkout; this module compiles them and writes spec files.

Typical use::

    lib = build(tmp / "lib")
    write_spec(tmp / "gpus.json", default_gpus(8))
    env = {**os.environ, **environ(lib.parent, tmp / "gpus.json")}
    subprocess.run([...], env=env)
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import stat
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from slurm_ext.fileio import atomic_write

__all__ = [
    "source_dir",
    "build",
    "default_gpus",
    "spec_from_recording",
    "recorded_latency",
    "latency_header",
    "write_spec",
    "environ",
    "make_device",
    "nccl_library",
]

SPEC_ENV = "SLURM_EXT_FAKE_NVML"
#: where the GPUs' nvidia<minor> device files are; set, a GPU whose file the
#: process cannot open is not enumerated (the devices cgroup of a job)
DEV_DIR_ENV = "SLURM_EXT_FAKE_NVML_DEV_DIR"
LIB_NAME = "libnvidia-ml.so.1"
LINK_NAME = "libnvidia-ml.so"
STUBS_NAME = "fakenvml_stubs.c"
STAMP_NAME = LIB_NAME + ".sha256"
#: the fake driver API (fakecuda.c, with json.c), built beside the fake NVML from the same spec
CUDA_LIB_NAME = "libcuda.so.1"
CUDA_LINK_NAME = "libcuda.so"
CUDA_SOURCES = ("fakecuda.c", "json.c")
#: the fake NCCL (fakenccl.c, with json.c), built into a subdirectory: off the library path, so that a process sees
#: NCCL only where SLURM_EXT_NCCL_LIBRARY names it (`nccl_library()`)
NCCL_DIR = "nccl"
NCCL_LIB_NAME = "libnccl.so.2"
NCCL_SOURCES = ("fakenccl.c", "json.c")

# -fvisibility=hidden: only functions marked NVML_API in the C sources are
# exported, so internal helpers cannot clash with symbols of the host process.
GCC_FLAGS = (
    "-O2",
    "-Wall",
    "-Wextra",
    "-fPIC",
    "-shared",
    "-pthread",
    "-fvisibility=hidden",
)
GCC_TIMEOUT_S = 120

# Entry points the C sources define are marked "NVML_API <type> nvmlName(".
_DEFINED_RE = re.compile(r"^NVML_API\b[^(;]*?\b(nvml\w+)\s*\(", re.MULTILINE)
# Entry points pynvml may resolve.
_PYNVML_RE = re.compile(r'_nvmlGetFunctionPointer\(\s*"(\w+)"\s*\)')

GIB = 1024**3

#: what the recorded H200 (tests/data/real-gpu/h200-580-idle.json, driver 580.159.04) answered: its memory, the
#: driver's reserve of it (v1's used and v2's reserved with no process), its idle clocks and clock reasons
H200_MEMORY = 150_754_820_096
MEMORY_RESERVED = 644_939_776
IDLE_CLOCK_SM, CLOCK_MEM = 345, 3201
#: NVML_CLOCKS_EVENT_REASON_GPU_IDLE: what an idle GPU says slows its clocks
REASON_IDLE = 0x1
#: the recording the fake's "latency": "recorded" comes from (latency_recorded.h beside this module)
LATENCY_RECORDING = "tests/data/real-gpu/h200-580-idle.json"

# Per-model numbers for default_gpus; unknown names get the H200 numbers.
# (memory bytes, NVML architecture, compute capability, PCI device id,
#  power limit mW)
_MODELS: dict[str, tuple[int, int, tuple[int, int], int, int]] = {
    "NVIDIA H200": (H200_MEMORY, 9, (9, 0), 0x233510DE, 700_000),
    "NVIDIA H100 80GB HBM3": (80 * GIB, 9, (9, 0), 0x233010DE, 700_000),
    "NVIDIA A100-SXM4-80GB": (80 * GIB, 7, (8, 0), 0x20B210DE, 400_000),
    "NVIDIA A100-SXM4-40GB": (40 * GIB, 7, (8, 0), 0x20B010DE, 400_000),
}

# Hopper has 18 NVLinks per GPU; matches FAKE_NVLINK_DEFAULT_LINKS in spec.h.
_NVLINKS_PER_GPU = 18


def source_dir() -> Path:
    """Return the directory of the fake's C sources: this package's own folder.

    They are package data (setup.cfg), so a wheel or an image carries them and
    `dev up` works without a source checkout.

    Raises:
        FileNotFoundError: the sources are not there (an install that left
            package data out).
    """
    path = Path(__file__).resolve().parent
    if not (path / "fakenvml.c").is_file():
        raise FileNotFoundError(
            f"fake NVML sources not found in {path}: this slurm-ext was installed "
            "without its package data; reinstall it from a wheel or the checkout"
        )
    return path


def _pynvml_entry_points() -> set[str]:
    """Names the installed pynvml may look up in libnvidia-ml.

    Read from pynvml's source rather than hard-coded so that a newer pynvml
    with new entry points still gets NOT_SUPPORTED stubs for them.
    """
    spec = importlib.util.find_spec("pynvml")
    if spec is None or spec.origin is None:
        # Without pynvml nothing needs the stubs; the library still works
        # for other NVML consumers.
        return set()
    return set(_PYNVML_RE.findall(Path(spec.origin).read_text(encoding="utf-8")))


def _defined_entry_points(sources: list[Path]) -> set[str]:
    names: set[str] = set()
    for src in sources:
        names.update(_DEFINED_RE.findall(src.read_text(encoding="utf-8")))
    return names


def _stub_source(names: list[str]) -> str:
    lines = [
        "/* Generated by slurm_ext.devcluster.fakenvml -- do not edit.",
        " * Entry points pynvml knows but the fake does not implement. Each",
        " * returns NVML_ERROR_NOT_SUPPORTED (3), so callers see a device",
        " * that lacks the feature instead of pynvml's FunctionNotFound",
        " * (or GPU_IS_LOST / UNINITIALIZED like every other call, see",
        " * fake_stub_result in fakenvml.c).  Only the first argument is",
        " * declared: extra arguments are harmless in the C calling",
        " * convention, and the stubs never read them. */",
        "int fake_stub_result(const void *first_arg);",
        "#define STUB(name) \\",
        '    __attribute__((visibility("default"))) int name(const void *first_arg) \\',
        "    { return fake_stub_result(first_arg); }",
        "",
    ]
    lines += [f"STUB({name})" for name in names]
    return "\n".join(lines) + "\n"


def _ensure_symlink(out_dir: Path) -> None:
    link = out_dir / LINK_NAME
    if link.is_symlink() and os.readlink(link) == LIB_NAME:
        return
    tmp = out_dir / f".{LINK_NAME}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    os.symlink(LIB_NAME, tmp)
    os.replace(tmp, link)


def build(out_dir: Path) -> Path:
    """Compile the fake into ``out_dir/libnvidia-ml.so.1`` and return its path.

    Also creates ``libnvidia-ml.so`` -> ``libnvidia-ml.so.1``, and the fake
    driver API ``libcuda.so.1`` (+ ``libcuda.so``) from fakecuda.c, which
    reads the same spec (its GPUs' "cuda" objects), so that one
    LD_LIBRARY_PATH gives a process both.  Recompiles
    only when the sources, the generated stubs or the flags changed (a
    sha256 stamp next to the library).  The library is compiled under a
    temporary name and renamed into place, so processes that load it
    concurrently never see a half-written file.

    Raises RuntimeError with gcc's output when compilation fails.
    """
    src = source_dir()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = sorted(p for p in src.glob("*.c") if p.name not in (CUDA_SOURCES[0], NCCL_SOURCES[0]))
    headers = sorted(src.glob("*.h"))

    missing = sorted(_pynvml_entry_points() - _defined_entry_points(sources))
    stubs = _stub_source(missing)

    digest = hashlib.sha256()
    for path in sources + headers:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(stubs.encode() + b"\0" + " ".join(GCC_FLAGS).encode())
    stamp_value = digest.hexdigest()

    lib = out_dir / LIB_NAME
    stamp = out_dir / STAMP_NAME
    try:
        up_to_date = lib.is_file() and stamp.read_text().strip() == stamp_value
    except FileNotFoundError:
        up_to_date = False
    if up_to_date:
        _ensure_symlink(out_dir)
        _build_cuda(src, out_dir)
        _build_nccl(src, out_dir)
        return lib

    stub_file = out_dir / STUBS_NAME
    atomic_write(stub_file, stubs, fsync="file")
    fd, tmp_name = tempfile.mkstemp(dir=out_dir, prefix=f".{LIB_NAME}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        cmd = ["gcc", *GCC_FLAGS, "-o", str(tmp), *map(str, sources), str(stub_file)]
        proc = subprocess.run(cmd, capture_output=True, timeout=GCC_TIMEOUT_S)
        if proc.returncode != 0:
            stderr = proc.stderr.decode(errors="replace")
            raise RuntimeError(
                f"building the fake NVML library failed (gcc exit {proc.returncode}):\n"
                f"{' '.join(cmd)}\n{stderr}"
            )
        os.chmod(tmp, 0o755)
        os.replace(tmp, lib)
    finally:
        tmp.unlink(missing_ok=True)
    atomic_write(stamp, stamp_value + "\n", fsync="file")
    _ensure_symlink(out_dir)
    _build_cuda(src, out_dir)
    _build_nccl(src, out_dir)
    return lib


def _build_cuda(src: Path, out_dir: Path) -> Path | None:
    """``out_dir/libcuda.so.1`` from fakecuda.c and json.c (+ ``libcuda.so``), unless its stamp matches; nothing
    where `src` has no fakecuda.c."""
    lib = _build_side_library(src, out_dir, CUDA_LIB_NAME, CUDA_SOURCES, "the fake libcuda", ("-lm",))
    if lib is None:
        return None
    link = out_dir / CUDA_LINK_NAME
    if not (link.is_symlink() and os.readlink(link) == CUDA_LIB_NAME):
        tmp_link = out_dir / f".{CUDA_LINK_NAME}.{os.getpid()}.{time.monotonic_ns()}.tmp"
        os.symlink(CUDA_LIB_NAME, tmp_link)
        os.replace(tmp_link, link)
    return lib


def _build_nccl(src: Path, out_dir: Path) -> Path | None:
    """``out_dir/nccl/libnccl.so.2`` from fakenccl.c and json.c, unless its stamp matches; nothing where `src` has
    no fakenccl.c. It calls the fake libcuda's helpers, which it finds with dlopen("libcuda.so.1")."""
    nccl_dir = out_dir / NCCL_DIR
    nccl_dir.mkdir(exist_ok=True)
    return _build_side_library(src, nccl_dir, NCCL_LIB_NAME, NCCL_SOURCES, "the fake NCCL", ("-lm", "-ldl"))


def nccl_library(lib_dir: Path) -> Path:
    """Where `build(lib_dir)` put the fake ``libnccl.so.2``: what SLURM_EXT_NCCL_LIBRARY names for a test that
    wants NCCL (README.md here, "The fake NCCL")."""
    return Path(lib_dir) / NCCL_DIR / NCCL_LIB_NAME


def _build_side_library(src: Path, out_dir: Path, name: str, names: tuple[str, ...], what: str,
                        libs: tuple[str, ...]) -> Path | None:
    """``out_dir/<name>`` from `names` under `src` (and json.h), unless its sha256 stamp matches; compiled under a
    temporary name and renamed into place. Nothing where `src` lacks the first source."""
    sources = [src / n for n in names]
    if not sources[0].is_file():
        return None
    flags = (*GCC_FLAGS, *libs)
    digest = hashlib.sha256()
    for path in [*sources, src / "json.h"]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(" ".join(flags).encode())
    lib, stamp = out_dir / name, out_dir / (name + ".sha256")
    try:
        up_to_date = lib.is_file() and stamp.read_text().strip() == digest.hexdigest()
    except FileNotFoundError:
        up_to_date = False
    if not up_to_date:
        fd, tmp_name = tempfile.mkstemp(dir=out_dir, prefix=f".{name}.", suffix=".tmp")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            cmd = ["gcc", *GCC_FLAGS, "-o", str(tmp), *map(str, sources), *libs]
            proc = subprocess.run(cmd, capture_output=True, timeout=GCC_TIMEOUT_S)
            if proc.returncode != 0:
                raise RuntimeError(f"building {what} failed (gcc exit {proc.returncode}):\n"
                                   f"{' '.join(cmd)}\n{proc.stderr.decode(errors='replace')}")
            os.chmod(tmp, 0o755)
            os.replace(tmp, lib)
        finally:
            tmp.unlink(missing_ok=True)
        atomic_write(stamp, digest.hexdigest() + "\n", fsync="file")
    return lib


def _bus_id(index: int) -> str:
    # Keep in sync with gpu_defaults() in spec.c beside this module.
    return f"{index // 30:08X}:{0x10 + 8 * (index % 30):02X}:00.0"


def _cpu_split(index: int, count: int, cpus: int) -> list[int]:
    """CPUs local to GPU `index`: GPUs are spread over two equal "sockets"
    (one when there is a single GPU or CPU), as on a two-socket HGX node."""
    sockets = 2 if cpus >= 2 and count >= 2 else 1
    per_socket = cpus // sockets
    socket = index * sockets // count
    first = socket * per_socket
    last = cpus if socket == sockets - 1 else first + per_socket
    return list(range(first, last))


def default_gpus(
    count: int = 4, name: str = "NVIDIA H200", *, cpus: int | None = None
) -> dict[str, Any]:
    """A JSON-ready spec of `count` healthy, idle GPUs, ready for write_spec.

    GPU i has minor number i, UUID ``GPU-fa4e000i-...`` (deterministic and
    distinct), PCI bus id ``0000000D:BB:00.0`` with increasing bus numbers,
    NVLinks to every other GPU (at most 18; a single GPU has none), every
    link it has active, no
    faults, no processes, no events.  What an idle GPU says is what the
    recorded H200 said: 615 MiB kept by the driver, idle clocks (345 MHz)
    with the idle clock reason.  `cpus` (default: this host's CPU count) is
    split between two sockets for the CPU affinity.  Tests change entries of
    the returned dict to describe faults.
    """
    if not 0 <= count <= 64:
        raise ValueError(f"count must be between 0 and 64, not {count}")
    memory, arch, capability, pci_id, power_limit = _MODELS.get(name, _MODELS["NVIDIA H200"])
    host_cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    bus_ids = [_bus_id(i) for i in range(count)]
    gpus = []
    for i in range(count):
        peers = [bus for j, bus in enumerate(bus_ids) if j != i][:_NVLINKS_PER_GPU]
        gpus.append(
            {
                "name": name,
                "uuid": f"GPU-{0xFA4E0000 + i:08x}-0000-4000-8000-{i:012x}",
                "minor": i,
                "pci_bus_id": bus_ids[i],
                "pci_device_id": pci_id,
                "serial": f"165492400{i:04d}",
                "memory_total": memory,
                "memory_reserved": MEMORY_RESERVED,
                "memory_used": 0,
                "utilization_gpu": 0,
                "utilization_memory": 0,
                "temperature": 37,
                "power_usage": 78_692,
                "power_limit": power_limit,
                "cpu_affinity": _cpu_split(i, count, host_cpus),
                "nvlink_peers": peers,
                # No "mig_mode": it then follows mig_devices (on when any are
                # listed), so a test only has to add MIG devices.
                "mig_devices": [],
                "lost": False,
                "clocks_event_reasons": REASON_IDLE,
                "clock_sm": IDLE_CLOCK_SM,
                "clock_mem": CLOCK_MEM,
                "remapped_rows": {"corrected": 0, "uncorrected": 0, "pending": 0, "failure": 0},
                "ecc": {
                    "volatile": {"corrected": 0, "uncorrected": 0},
                    "aggregate": {"corrected": 0, "uncorrected": 0},
                },
                "processes": [],
                "pcie_replay_counter": 0,
                "persistence_mode": 1,
                "architecture": arch,
                "cuda_compute_capability": list(capability),
            }
        )
    return {
        "driver_version": "580.159.04",
        "nvml_version": "13.580.159.04",
        "cuda_driver_version": 13000,
        "init_error": None,
        "gpus": gpus,
        "events": [],
    }


# ---------------------------------------------------------------------------
# A spec and latencies from a recording (slurm_ext.nvmlrecord's format)
# ---------------------------------------------------------------------------

#: calls whose first argument selects what is asked, so that each one has a time of its own (a threshold, a clock)
_SELECTED = ("nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetClockInfo")
_POINTER_RE = re.compile(r'_nvmlGetFunctionPointer\(\s*"(\w+)"\s*\)')
_CALLS_RE = re.compile(r"\b(nvml\w+)\(")


def _pynvml_pointers() -> dict[str, tuple[list[str], list[str]]]:
    """pynvml's functions: the entry points each resolves, and the pynvml functions it calls."""
    spec = importlib.util.find_spec("pynvml")
    if spec is None or spec.origin is None:
        return {}
    found = {}
    for body in re.split(r"\n(?=def )", Path(spec.origin).read_text(encoding="utf-8")):
        match = re.match(r"def (\w+)\(", body)
        if match:
            found[match.group(1)] = (_POINTER_RE.findall(body), _CALLS_RE.findall(body[match.end():]))
    return found


def _entry_point(call: str, args: list, table: dict, depth: int = 0) -> str | None:
    """The library entry point pynvml's `call` reaches (the one it resolves, or that of the function it calls):
    nvmlDeviceGetCount -> nvmlDeviceGetCount_v2, nvmlInit -> nvmlInitWithFlags, nvmlDeviceGetMemoryInfo with
    a version -> nvmlDeviceGetMemoryInfo_v2."""
    pointers, calls = table.get(call, ([], []))
    if len(pointers) > 1:
        versioned = any(isinstance(a, dict) and "version" in a for a in args)
        for name in pointers:
            if name.endswith("_v2") == versioned:
                return name
    if pointers:
        return pointers[0]
    if depth < 3:
        for name in calls:
            if name != call and name in table:
                found = _entry_point(name, args, table, depth + 1)
                if found:
                    return found
    return None


def recorded_latency(recording: dict[str, Any]) -> dict[str, float]:
    """Each library entry point's time in a recording (slurm_ext.nvmlrecord's format), in ms, as the spec's
    "latency" takes it: ``{"nvmlDeviceGetUtilizationRates": 3.742, "nvmlDeviceGetTemperatureThreshold#1": 2.79,
    ...}``. The median of the call's recorded medians; a threshold's or clock's type has a time of its own
    (``#<type>``). Event waits are left out: their time is the wait."""
    table = _pynvml_pointers()
    times: dict[str, list[float]] = {}
    for entry in recording.get("calls", ()):
        ms = (entry.get("ms") or {}).get("median")
        call, args = entry["call"], entry.get("args") or []
        if ms is None or call.startswith("nvmlEventSetWait"):
            continue
        name = _entry_point(call, args, table)
        if name is None:
            continue
        times.setdefault(name, []).append(ms)
        if call in _SELECTED and args and isinstance(args[0], int):
            times.setdefault(f"{name}#{args[0]}", []).append(ms)
    return {name: round(statistics.median(values), 4) for name, values in sorted(times.items())}


def latency_header(recording: dict[str, Any], source: str = LATENCY_RECORDING) -> str:
    """The C table of `recording`'s times behind the spec's "latency": "recorded" (latency_recorded.h)."""
    lines = [
        f"/* Generated by slurm_ext.devcluster.fakenvml.latency_header() from {source}",
        f" * ({recording.get('source', {}).get('gpu', 'a GPU')}, driver "
        f"{recording.get('source', {}).get('driver', '?')}, {recording.get('source', {}).get('state', '')}):",
        " * each entry point's time in microseconds, -1 for any selector.  Do not edit:",
        " * tests/test_fakenvml.py checks that it is what that recording gives. */",
        "static const struct fake_latency recorded_latency[] = {",
    ]
    for key, ms in recorded_latency(recording).items():
        name, _, selector = key.partition("#")
        lines.append(f'    {{"{name}", {selector or -1}, {round(ms * 1000)}}},')
    lines.append("};")
    return "\n".join(lines) + "\n"


def _answer(recording: dict, call: str, gpu: Any, args: list | None = None, ret: int | None = 0) -> Any:
    """The latest answer of `call` on `gpu` with `args` (any args when None) in `recording`: its value when it
    answered `ret`, _MISSING when it never did, the return code when it answered something else."""
    for entry in recording.get("calls", ()):
        if entry["call"] != call or entry.get("gpu") != gpu or (args is not None and entry.get("args") != args):
            continue
        for answer in entry["answers"]:
            if answer.get("ret") == ret:
                return answer.get("value")
        return _Failed(entry["answers"][0].get("ret"))
    return _MISSING


class _Failed(int):
    """A return code where a value was looked for."""


_MISSING = object()


def _known(value: Any) -> bool:
    return value is not _MISSING and not isinstance(value, _Failed) and not (
        isinstance(value, dict) and "$unrecorded" in value)


def spec_from_recording(recording: dict[str, Any], *, latency: bool = False) -> dict[str, Any]:
    """A spec of the GPUs a recording (slurm_ext.nvmlrecord's format) describes: what they answered where the
    recording says (name, UUID, bus, memory and its reserve, clocks and reasons, PCIe, thresholds, NVLinks and what
    a link past the last answers, fabric, processes, ...), the fake's defaults elsewhere. `latency`: each call takes
    the recorded time (`recorded_latency`).

    The recorded processes' own fields are kept only where the recording has them; a process whose fields were
    not recorded is a stand-in with pid 1 + its position, holding the memory the GPU used beyond its reserve."""
    count = _answer(recording, "nvmlDeviceGetCount", None)
    count = count if _known(count) else 0
    spec: dict[str, Any] = {"gpus": [_gpu_from_recording(recording, i) for i in range(int(count))], "events": []}
    for key, call in (("driver_version", "nvmlSystemGetDriverVersion"), ("nvml_version", "nvmlSystemGetNVMLVersion")):
        value = _answer(recording, call, None)
        if _known(value):
            spec[key] = value
    cuda = _answer(recording, "nvmlSystemGetCudaDriverVersion", None)
    if _known(cuda):
        spec["cuda_driver_version"] = cuda
    if latency:
        spec["latency"] = recorded_latency(recording)
    return spec


def _gpu_from_recording(rec: dict, i: int) -> dict[str, Any]:
    gpu: dict[str, Any] = {}

    def take(key: str, call: str, args: list | None = None, convert=lambda v: v) -> None:
        value = _answer(rec, call, i, args)
        if _known(value):
            gpu[key] = convert(value)

    take("name", "nvmlDeviceGetName")
    take("uuid", "nvmlDeviceGetUUID")
    take("minor", "nvmlDeviceGetMinorNumber")
    pci = _answer(rec, "nvmlDeviceGetPciInfo", i)
    if _known(pci):
        gpu.update(pci_bus_id=pci["busId"], pci_device_id=pci["pciDeviceId"], pci_subsystem_id=pci["pciSubSystemId"])
    take("utilization_gpu", "nvmlDeviceGetUtilizationRates", None, lambda v: v["gpu"])
    take("utilization_memory", "nvmlDeviceGetUtilizationRates", None, lambda v: v["memory"])
    take("temperature", "nvmlDeviceGetTemperature", [0])
    take("power_usage", "nvmlDeviceGetPowerUsage")
    take("energy", "nvmlDeviceGetTotalEnergyConsumption")
    take("persistence_mode", "nvmlDeviceGetPersistenceMode")
    take("pcie_replay_counter", "nvmlDeviceGetPcieReplayCounter")
    take("supported_event_types", "nvmlDeviceGetSupportedEventTypes")
    take("clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons")
    for key, clock in (("clock_graphics", 0), ("clock_sm", 1), ("clock_mem", 2), ("clock_video", 3)):
        take(key, "nvmlDeviceGetClockInfo", [clock])
    take("mig_mode", "nvmlDeviceGetMigMode", None, lambda v: {"current": v[0], "pending": v[1]})
    take("remapped_rows", "nvmlDeviceGetRemappedRows", None,
         lambda v: dict(zip(("corrected", "uncorrected", "pending", "failure"), v)))
    pcie = {key: value for key, call in (("gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                                         ("width", "nvmlDeviceGetCurrPcieLinkWidth"),
                                         ("max_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
                                         ("max_width", "nvmlDeviceGetMaxPcieLinkWidth"),
                                         ("gpu_max_gen", "nvmlDeviceGetGpuMaxPcieLinkGeneration"))
            if _known(value := _answer(rec, call, i))}
    if pcie:
        gpu["pcie"] = pcie
    thresholds = {}
    for key, kind in (("shutdown", 0), ("slowdown", 1), ("mem_max", 2), ("gpu_max", 3)):
        value = _answer(rec, "nvmlDeviceGetTemperatureThreshold", i, [kind])
        if _known(value):
            thresholds[key] = value
        elif isinstance(value, _Failed):
            thresholds[key] = -1
    if thresholds:
        gpu["temperature_thresholds"] = thresholds
    ecc = {}
    for counter, name in ((0, "volatile"), (1, "aggregate")):
        values = {kind: _answer(rec, "nvmlDeviceGetTotalEccErrors", i, [error, counter])
                  for error, kind in ((0, "corrected"), (1, "uncorrected"))}
        if all(_known(v) for v in values.values()):
            ecc[name] = values
    if ecc:
        gpu["ecc"] = ecc
    fields = _fields_from_recording(rec, i)
    for key, field in (("memory_temperature", 82), ("gpu_recovery_action", 230)):
        if field in fields:
            gpu[key] = fields[field]
    gpu.update(_links_from_recording(rec, i))
    gpu.update(_fabric_from_recording(rec, i))
    gpu.update(_memory_from_recording(rec, i))
    return gpu


def _fields_from_recording(rec: dict, i: int) -> dict[int, int]:
    fields = {}
    for entry in rec.get("calls", ()):
        if entry["call"] == "nvmlDeviceGetFieldValues" and entry.get("gpu") == i:
            for answer in entry["answers"]:
                for item in answer.get("value") or ():
                    if isinstance(item, dict) and item.get("nvmlReturn") == 0 and isinstance(item.get("value"), int):
                        fields[item["fieldId"]] = item["value"]
    return fields


def _links_from_recording(rec: dict, i: int) -> dict[str, Any]:
    """NVLinks: the first link that answered an error is past the GPU's last, and says what such a link answers;
    active links' peers are their remote bus ids."""
    states = {}
    for entry in rec.get("calls", ()):
        if entry["call"] == "nvmlDeviceGetNvLinkState" and entry.get("gpu") == i and entry.get("args"):
            states[entry["args"][0]] = entry["answers"][-1]
    if not states:
        return {}
    link, out, peers = 0, {}, []
    while link in states and states[link].get("ret") == 0:
        if states[link].get("value") == 1:
            remote = _answer(rec, "nvmlDeviceGetNvLinkRemotePciInfo", i, [link])
            peers.append(remote["busId"] if _known(remote) else "00000000:FF:00.0")
        link += 1
    out["nvlink_count"] = link
    out["nvlink_peers"] = peers
    if link in states:
        out["nvlink_past_last"] = states[link].get("ret")
    return out


def _fabric_from_recording(rec: dict, i: int) -> dict[str, Any]:
    for call in ("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"):
        for entry in rec.get("calls", ()):
            if entry["call"] != call or entry.get("gpu") != i:
                continue
            answer = entry["answers"][-1]
            if answer.get("ret") != 0:
                return {"fabric": answer.get("ret")}
            (info, *_) = answer.get("out") or [{}]
            if not info.get("state"):  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: the default
                return {}
            fabric = {"state": info["state"], "status": info.get("status", 0)}
            if "cliqueId" in info:
                fabric["clique_id"] = info["cliqueId"]
            if isinstance(info.get("clusterUuid"), list):
                fabric["cluster_uuid"] = bytes(info["clusterUuid"]).hex()
            if "healthMask" in info:
                fabric["health_mask"] = info["healthMask"]
            return {"fabric": fabric}
    return {}


def _memory_from_recording(rec: dict, i: int) -> dict[str, Any]:
    """Memory: the total, the driver's reserve (v2's reserved, or v1's used with no process), what processes hold."""
    out: dict[str, Any] = {}
    v1 = _answer(rec, "nvmlDeviceGetMemoryInfo", i, [])
    v2 = next((a for e in rec.get("calls", ()) if e["call"] == "nvmlDeviceGetMemoryInfo" and e.get("gpu") == i
               and e.get("args") for a in [_answer(rec, e["call"], i, e["args"])] if _known(a)), _MISSING)
    processes = _answer(rec, "nvmlDeviceGetComputeRunningProcesses", i)
    listed = processes if _known(processes) and isinstance(processes, list) else []
    if _known(v1):
        out["memory_total"] = v1["total"]
    if _known(v2):
        out.update(memory_total=v2["total"], memory_reserved=v2["reserved"])
    elif _known(v1) and not listed:
        out["memory_reserved"] = v1["used"]
    if _known(v1) and listed:
        held = max(0, v1["used"] - out.get("memory_reserved", MEMORY_RESERVED))
        out["memory_used"] = held
        out["processes"] = [
            {"pid": int(p.get("pid", k + 1)) if isinstance(p, dict) and "pid" in p else k + 1,
             "used_memory": int(p["usedGpuMemory"]) if isinstance(p, dict) and isinstance(p.get("usedGpuMemory"), int)
             else held // len(listed)} for k, p in enumerate(listed)]
    return out


def write_spec(path: Path, spec: dict[str, Any]) -> None:
    """Atomically replace the spec file at `path` with `spec` as JSON.

    The fake library notices a rewrite by the file's (inode, mtime, ctime,
    size); it may be watching it from other processes right now.  Besides
    writing a temp file and renaming it over `path` (so a reader never sees
    partial JSON), we make the new mtime strictly later than the old one:
    two rewrites within one coarse filesystem-timestamp tick could otherwise
    reuse a freed inode with the same size and look unchanged.
    """
    path = Path(path)
    data = (json.dumps(spec, indent=2) + "\n").encode()
    try:
        previous_ns: int | None = os.stat(path).st_mtime_ns
    except FileNotFoundError:
        previous_ns = None
    mtime = time.time_ns()
    if previous_ns is not None and mtime <= previous_ns:
        mtime = previous_ns + 1
    # 0644: readable by job processes of other users in the dev cluster
    atomic_write(path, data, mode=0o644, fsync="file", mtime_ns=mtime)


def environ(lib_dir: Path, spec_path: Path, *, dev_dir: Path | None = None) -> dict[str, str]:
    """Environment variables that make pynvml (in a new process) use the fake.

    Merge into a child's environment; LD_LIBRARY_PATH is read by the dynamic
    loader at process start, so it cannot take effect in the current one.
    With `dev_dir`, the process sees only the GPUs whose `dev_dir/nvidia<minor>`
    it can open, as with the real driver under a job's devices cgroup (see
    README.md here, "Visibility by device file").
    """
    env = {"LD_LIBRARY_PATH": str(lib_dir), SPEC_ENV: str(spec_path)}
    if dev_dir is not None:
        env[DEV_DIR_ENV] = str(dev_dir)
    return env


#: character-device major number of /dev/nvidia<minor>
NVIDIA_MAJOR = 195


def make_device(path: Path, minor: int) -> Path:
    """A GPU device file like /dev/nvidia<minor> at `path` (root only).

    Slurm's gres.conf File= and its devices cgroup need a real character
    device: a plain file is rejected at job launch. Mode 0666, the driver's
    default (NVreg_DeviceFileMode), whatever the umask: the fake library,
    given a dev dir, shows a process only the GPUs whose file it can open
    read-write, so a job of any user must be able to. Idempotent: a
    character device already there is kept (its mode set to 0666), anything
    else is replaced.
    """
    path = Path(path)
    if not path.is_char_device():
        path.unlink(missing_ok=True)
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
    if stat.S_IMODE(path.stat().st_mode) != 0o666:
        path.chmod(0o666)
    return path
