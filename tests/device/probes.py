"""The device check's measurements that run inside its venv, beside the installed slurm-ext.

Run by tests/device/gpu_check.py with the venv's Python; each prints one JSON object on stdout.

- `nvml-info`: the driver, NVML and CUDA versions and each GPU's name, through pynvml (not recorded:
  the check's own look, to name the recording).
- `release --config CFG`: the Epilog's GPU release of a killed process: a holder process takes GPU
  memory through libcuda (gpuload.py hold), the project's `gpu_usage` must list it, it is
  SIGKILLed, and `prolog_epilog.gpus.release_gpus` is called as the Epilog calls it (the config's
  gpu_memory_threshold) and timed from the kill to its answer; NVML's memory v1 used, v2 used and
  reserved before and after. Under the fake NVML (`--fake-spec`) the holder allocates nothing and
  is written into the spec as a process listed while it lives.
- `imports --config CFG --seconds T`: `slurm-ext health monitor` in this process for T seconds,
  with tracemalloc on, and what its imports cost: the modules loaded, and the Python memory each
  module's import kept (its own, without the modules it imported), by package. tracemalloc makes
  the process bigger and slower: the monitor whose cost is measured runs without it. Run it without
  SLURM_EXT_NVML_RECORD: the recorder imports modules of its own (inspect, statistics, importlib.metadata).
"""

from __future__ import annotations

import sys
import _thread
import _tracemalloc  # the C module: tracemalloc.py would import pickle and more before the measurement


class _ImportCosts:
    """Wraps each module's exec_module (a per-module loader instance: source and extension modules) to
    measure the Python memory its import kept, minus that of the modules it imported itself.

    Imports run on several threads at start (the monitor's readers): each thread has its own stack,
    but tracemalloc's total is the process's, so an import running beside another may be charged a
    little of the other's memory (a module's figure can even come out below zero).
    """

    def __init__(self) -> None:
        self.costs: dict[str, int] = {}
        self.importer: dict[str, str] = {}
        self._local = _thread._local()

    def find_spec(self, name, path, target=None):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or isinstance(loader, type) or not hasattr(loader, "exec_module"):
            return spec  # builtin and frozen modules: their loader is a class, shared
        inner = loader.exec_module
        costs = self

        def exec_module(module):
            stack = getattr(costs._local, "stack", None)
            if stack is None:
                stack = costs._local.stack = []
            if stack:
                costs.importer.setdefault(name, stack[-1][0])
            stack.append([name, 0])
            before = _tracemalloc.get_traced_memory()[0]
            try:
                inner(module)
            finally:
                total = _tracemalloc.get_traced_memory()[0] - before
                _, children = stack.pop()
                costs.costs[name] = costs.costs.get(name, 0) + total - children
                if stack:
                    stack[-1][1] += total
        loader.exec_module = exec_module
        return spec


# `imports`: tracemalloc and the import hook before anything else is imported, so that the modules this
# script imports below count as the monitor's (its CLI imports them too)
_BEFORE: set[str] = set()
_COSTS = _ImportCosts()
if __name__ == "__main__" and sys.argv[1:2] == ["imports"]:
    _tracemalloc.start(1)
    _BEFORE = set(sys.modules)
    sys.meta_path.insert(0, _COSTS)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

GIB = 2**30
MIB = 2**20


def _nvml_info() -> dict:
    import pynvml

    def text(value):
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

    started = time.monotonic()
    pynvml.nvmlInit()
    init_ms = 1000 * (time.monotonic() - started)
    info = {"driver": text(pynvml.nvmlSystemGetDriverVersion()),
            "nvml_version": text(pynvml.nvmlSystemGetNVMLVersion()), "init_ms": round(init_ms, 1), "gpus": []}
    try:
        version = pynvml.nvmlSystemGetCudaDriverVersion()
        info["cuda_driver_version"] = f"{version // 1000}.{version % 1000 // 10}"
    except pynvml.NVMLError as err:
        info["cuda_driver_version"] = f"error: {err}"
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        info["gpus"].append({"index": index, "name": text(pynvml.nvmlDeviceGetName(handle)),
                             "uuid": text(pynvml.nvmlDeviceGetUUID(handle)),
                             "pci_bus_id": text(pynvml.nvmlDeviceGetPciInfo(handle).busId)})
    from importlib.metadata import version as dist_version
    info["pynvml"] = dist_version("nvidia-ml-py")
    pynvml.nvmlShutdown()
    return info


# -- the Epilog's GPU release --------------------------------------------------------------

def _memory(nvml, index: int) -> dict:
    """NVML's memory of GPU `index`: v1 used, and v2 used and reserved where the driver has v2 (MiB)."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    v1 = nvml.nvmlDeviceGetMemoryInfo(handle)
    found = {"v1_used_mib": round(v1.used / MIB, 1), "total_mib": round(v1.total / MIB, 1)}
    try:
        v2 = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
        found.update(v2_used_mib=round(v2.used / MIB, 1), v2_reserved_mib=round(v2.reserved / MIB, 1))
    except (nvml.NVMLError, AttributeError, TypeError) as err:
        found["v2"] = f"error: {err}"
    return found


def _fake_process(spec_path: str, index: int, pid: int | None, used: int) -> None:
    """Lists `pid` (or nobody, given None) on fake GPU `index`, using `used` bytes while it lives."""
    from slurm_ext.devcluster import fakenvml
    with open(spec_path) as file:
        spec = json.load(file)
    gpu = spec["gpus"][index]
    gpu["processes"] = [] if pid is None else [{"pid": pid, "used_memory": used, "while_alive": True}]
    fakenvml.write_spec(spec_path, spec)


def _release(args: argparse.Namespace) -> dict:
    import pynvml

    from slurm_ext import config as config_mod, nvml as nvml_adapter
    from slurm_ext.prolog_epilog import gpus
    threshold = config_mod.load(args.config).prolog_epilog.gpu_memory_threshold
    result: dict = {"gpu": args.gpu, "threshold_mib": threshold, "holder_gib": args.gib}
    holder = None
    try:
        nvml_adapter.init_once(pynvml, lambda err: gpus.GpuCheckError(f"cannot initialise: {err}"))
        waited = time.monotonic()
        while gpus.gpu_usage([args.gpu])[0].processes and time.monotonic() - waited < 5.0:
            time.sleep(0.05)  # the load of the step before may still be letting go
        result["idle"] = {**_memory(pynvml, args.gpu), "waited_s": round(time.monotonic() - waited, 2),
                          "pids": [p.pid for p in gpus.gpu_usage([args.gpu])[0].processes]}
        command = [args.holder_python, args.gpuload, "hold", "--gib", str(args.gib)]
        if args.fake_spec:
            command.append("--fake")
        started = time.monotonic()
        holder = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = _first_line(holder, args.timeout)
        result["holder"] = line
        if not line.startswith("ready "):
            said = line or f"no line within {args.timeout:g}s (exit {holder.poll()})"
            result["error"] = f"the holder did not start: {said}"
            return result
        result["holder_start_s"] = round(time.monotonic() - started, 2)
        if args.fake_spec:
            _fake_process(args.fake_spec, args.gpu, holder.pid, int(args.gib * GIB))
        deadline = time.monotonic() + 5.0
        while True:  # the driver lists a new context within a poll or two
            (usage,) = gpus.gpu_usage([args.gpu])
            listed = any(p.pid == holder.pid for p in usage.processes)
            if listed or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        result["listed"] = listed
        result["processes_seen"] = [{"pid": p.pid, "used_mib": p.used_mib} for p in usage.processes]
        result["held"] = {"gpu_usage_used_mib": usage.used_mib,
                          "gpu_usage_reserved_mib": getattr(usage, "reserved_mib", None), **_memory(pynvml, args.gpu)}
        killed = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        reaped = time.monotonic()

        def kill(pid: int) -> None:
            os.kill(pid, signal.SIGKILL)
        # as the Epilog calls it once the job's processes are killed: the holder is the job's
        held = gpus.release_gpus([args.gpu], lambda pid: pid == holder.pid, kill, threshold_mib=threshold,
                                 timeout=args.timeout)
        answered = time.monotonic()
        result.update(released=not held, release_s=round(answered - killed, 3), reap_s=round(reaped - killed, 3),
                      still_held=[{"gpu": u.gpu, "used_mib": u.used_mib, "pids": [p.pid for p in u.processes]}
                                  for u in held])
        result["after"] = _memory(pynvml, args.gpu)
        return result
    except gpus.GpuCheckError as err:
        result["error"] = str(err)
        return result
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait()
        if args.fake_spec:
            _fake_process(args.fake_spec, args.gpu, None, 0)


def _first_line(process: subprocess.Popen, timeout: float) -> str:
    """The first line `process` prints, or "" when it prints none within `timeout` (it is then killed)."""
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not found:
        process.kill()
        return ""
    return found[0].strip()


# -- what the monitor's imports cost -----------------------------------------------------------

def _kind(module) -> str:
    import sysconfig
    path = getattr(module, "__file__", None) or ""
    name = getattr(module, "__name__", "")
    if name == "slurm_ext" or name.startswith("slurm_ext."):
        return "slurm-ext"
    if not path:
        return "stdlib"  # built in or frozen
    if "site-packages" in path or "dist-packages" in path:
        return "third-party"
    return "stdlib" if path.startswith((sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"])) \
        else "other"


def _group(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "slurm_ext" and len(parts) > 1 else parts[0]


def _imports(args: argparse.Namespace) -> dict:
    before, costs = _BEFORE, _COSTS
    timer = threading.Timer(args.seconds, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.daemon = True
    timer.start()
    from slurm_ext.cli import main
    out, sys.stdout = sys.stdout, sys.stderr  # the monitor's own prints go with its log
    try:
        code = main(["--config", args.config, "health", "monitor"])
    finally:
        sys.stdout = out
        timer.cancel()
    traced, peak = _tracemalloc.get_traced_memory()
    new = {name: module for name, module in sys.modules.items() if name not in before and module is not None}
    groups: dict[str, dict] = {}
    kinds: dict[str, dict] = {}
    for name, module in new.items():
        path = getattr(module, "__file__", None)
        size = os.path.getsize(path) if path and os.path.isfile(path) else 0
        group = groups.setdefault(_group(name), {"modules": 0, "kept_kb": 0.0, "files_kb": 0.0, "kind": _kind(module)})
        kind = kinds.setdefault(_kind(module), {"modules": 0, "kept_kb": 0.0})
        for row in (group, kind):
            row["modules"] += 1
            row["kept_kb"] += costs.costs.get(name, 0) / 1024
        group["files_kb"] += size / 1024
    for name, group in groups.items():
        first = costs.importer.get(name)
        if first:
            group["imported_by"] = first
    top = sorted(((n, c) for n, c in costs.costs.items() if n in new), key=lambda item: -item[1])[:15]
    with open(f"/proc/{os.getpid()}/status") as file:
        rss = next(int(line.split()[1]) for line in file if line.startswith("VmRSS:"))
    return {"monitor_exit": code, "seconds": args.seconds, "modules_loaded": len(new),
            "module_files_mb": round(sum(g["files_kb"] for g in groups.values()) / 1024, 2),
            "modules_total": len(sys.modules), "python_traced_mb": round(traced / 1e6, 2),
            "python_traced_peak_mb": round(peak / 1e6, 2), "rss_with_tracemalloc_mb": round(rss * 1024 / 1e6, 1),
            "by_kind": {k: {"modules": v["modules"], "kept_kb": round(v["kept_kb"], 1)} for k, v in kinds.items()},
            "by_package": dict(sorted(((n, {**g, "kept_kb": round(g["kept_kb"], 1),
                                            "files_kb": round(g["files_kb"], 1)}) for n, g in groups.items()),
                                      key=lambda item: -item[1]["kept_kb"])),
            "top_modules": [{"module": n, "kept_kb": round(c / 1024, 1)} for n, c in top]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("nvml-info")
    release = actions.add_parser("release")
    release.add_argument("--config", required=True)
    release.add_argument("--gpu", type=int, default=0)
    release.add_argument("--gib", type=float, default=2.0)
    release.add_argument("--timeout", type=float, default=10.0)
    release.add_argument("--holder-python", default=sys.executable)
    release.add_argument("--gpuload", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpuload.py"))
    release.add_argument("--fake-spec", help="the fake NVML's spec file (no GPU: the holder is listed there)")
    imports = actions.add_parser("imports")
    imports.add_argument("--config", required=True)
    imports.add_argument("--seconds", type=float, default=12.0)
    args = parser.parse_args()
    if args.action == "nvml-info":
        found = _nvml_info()
    elif args.action == "release":
        found = _release(args)
    else:
        found = _imports(args)
    print(json.dumps(found), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
