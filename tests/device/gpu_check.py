"""The device check: slurm-ext against a real NVIDIA GPU, with nothing on the machine but Python and the driver.

Run through `tests/device/gpu-check [--out DIR]` (it picks a Python >= 3.11 and says so when there is
none). In under five minutes, each step with its own time limit (a step that fails is reported and the
next one runs):

1. a venv (`python -m venv --without-pip`; pip is run from its wheel) with slurm-ext installed from
   tests/device/wheels (made by tests/device/build-wheels on a machine with network) with `--no-index`;
2. `slurm-ext gres inventory` and `slurm-ext health check --json` with a config of the check's own (a
   state dir in a temporary directory, Slurm's checks off: no Slurm here);
3. `slurm-ext health monitor` at its default settings for a minute idle and a minute under a GPU load
   (torch or CuPy where they import, else the driver API through ctypes: tests/device/gpuload.py), its
   CPU time and RSS sampled from /proc every second, its mappings (/proc/PID/smaps) at the end of each
   minute; beside it, once, the same monitor with tracemalloc for what its imports keep;
4. the Epilog's GPU release: a process holding GPU memory through libcuda is SIGKILLed and
   `prolog_epilog.gpus.release_gpus` is timed until it says released;
5. the acceptance tests gpu-memory, gpu-bandwidth and gpu-burn (standard level) through their child process
   (`python -m slurm_ext.acceptance.child`: libcuda through ctypes, PTX kernels), and, where the machine's
   Python imports PyTorch, a PyTorch device-to-device copy of the same size in the same run: D2D as a
   share of PyTorch's (target >= 95 %) and H2D as a share of PCIe Gen5 x16's 63 GB/s (target >= 85 %);
   `--no-acceptance` leaves it out;
6. every NVML call of steps 2-4 recorded (SLURM_EXT_NVML_RECORD; the measured monitor runs without the
   recorder) and merged into one recording, compared with the recordings of the same GPU in
   tests/data/real-gpu/ and with the fake NVML's recording made by build-wheels.

Files under --out: summary.txt and summary.json (the summary printed last), gpu-check.log (everything
printed), recording-<gpu>-<driver>.json, each step's output, the monitor's readings, smaps and imports.
Exit 0 when the check ran (its findings are in the summary), 2 when it could not run (no wheels, the
install failed), 3 when NVML shows no GPU (nothing to check).

`--fake` runs the same steps against the project's fake libnvidia-ml (built with gcc from the installed
wheel): no GPU load (the fake's spec is rewritten to look busy) and a holder that allocates nothing (the
fake lists it while it lives). tests/test_device_check.py runs it so that the check cannot rot.
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_WHEELS = HERE / "wheels"
COMMITTED_RECORDINGS = REPO / "tests" / "data" / "real-gpu"

#: the monitor's targets at its default settings (issue 26)
TARGET_CPU_PERCENT = 0.2
TARGET_RSS_MB = 50.0
#: the acceptance phase's targets: our D2D copy against PyTorch's of the same size, H2D against PCIe Gen5 x16
TARGET_D2D_SHARE_OF_TORCH = 0.95
PCIE5_X16_GBPS = 63.0
TARGET_H2D_SHARE = 0.85
#: the acceptance tests run on the real GPU: the burn too, whose clock and power under load only a real GPU shows
ACCEPTANCE_TESTS = ("gpu-memory", "gpu-bandwidth", "gpu-burn")
#: the D2D copy size of gpu-bandwidth at standard (slurm_ext.acceptance.gpucuda._COPY), for PyTorch's copy
D2D_BYTES = 4 * 2**30
#: PyTorch's device-to-device copy, best of 5, counting bytes read and written (as gpu-bandwidth does)
TORCH_D2D = r"""
import json, sys
import torch
if not torch.cuda.is_available():
    print(json.dumps({"error": "torch sees no GPU"})); sys.exit(0)
n = int(sys.argv[1])
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
b.copy_(a); torch.cuda.synchronize()
best = float("inf")
for _ in range(5):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); b.copy_(a); e.record(); e.synchronize(); best = min(best, s.elapsed_time(e))
print(json.dumps({"d2d_gbps": 2 * n / (best / 1e3) / 1e9, "bytes": n, "torch": torch.__version__}))
"""

#: what the monitor cost on the H200 before (tests/data/real-gpu/original/README.md), for the summary
H200_BEFORE = {"idle_cpu_percent": 0.36, "load_cpu_percent": 0.30, "rss_mb": 67.5}

CLK_TCK = os.sysconf("SC_CLK_TCK")

#: exit codes
RAN, CANNOT_RUN, NO_GPU = 0, 2, 3


class CannotRun(Exception):
    """The check cannot go on at all (exit 2)."""


@dataclass
class Step:
    name: str
    ok: bool | None = None
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Result:
    """What a command did: its exit code (None: killed at its time limit), its output, its time."""

    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def run(argv: list, timeout: float, env: dict | None = None, cwd: Path | None = None,
        input: str | None = None) -> Result:
    """`argv` in a session of its own (`input` on its stdin); at `timeout` the whole session is killed and what it
    printed is kept."""
    argv = [str(a) for a in argv]
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            start_new_session=True, stdin=None if input is None else subprocess.PIPE)
    try:
        out, err = proc.communicate(input=input, timeout=max(1.0, timeout))
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    return Result(argv, code, out, err, time.monotonic() - started)


# -- /proc: what a process costs ------------------------------------------------------------------

def cpu_ticks(pid: int) -> int:
    """utime + stime of `pid` (all its threads, those ended included), in clock ticks."""
    with open(f"/proc/{pid}/stat") as file:
        data = file.read()
    fields = data[data.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def sched_ns(pid: int) -> int | None:
    """Time on CPU of `pid`'s live threads in ns (/proc/PID/task/*/schedstat), or None without schedstats."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as file:
                    total += int(file.read().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue
    except (FileNotFoundError, PermissionError, ValueError, IndexError):
        return None
    return total


def status(pid: int) -> dict[str, int]:
    """The kB figures and thread count of /proc/PID/status that say where memory is."""
    found = {}
    with open(f"/proc/{pid}/status") as file:
        for line in file:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem", "VmSize", "Threads"):
                found[key] = int(value.split()[0])
    return found


@dataclass
class Mapping:
    path: str
    perms: str
    size_kb: int
    rss_kb: int = 0
    pss_kb: int = 0
    private_kb: int = 0


_MAP_HEAD = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \d+\s*(.*)$")


def smaps(pid: int) -> list[Mapping]:
    maps: list[Mapping] = []
    with open(f"/proc/{pid}/smaps") as file:
        for line in file:
            head = _MAP_HEAD.match(line)
            if head:
                start, end = int(head.group(1), 16), int(head.group(2), 16)
                maps.append(Mapping(head.group(4).strip(), head.group(3), (end - start) // 1024))
                continue
            key, _, value = line.partition(":")
            if not maps or not value.strip().endswith("kB"):
                continue
            kb = int(value.split()[0])
            if key == "Rss":
                maps[-1].rss_kb = kb
            elif key == "Pss":
                maps[-1].pss_kb = kb
            elif key in ("Private_Clean", "Private_Dirty"):
                maps[-1].private_kb += kb
    return maps


def _category(mapping: Mapping, exe: str) -> str:
    path = mapping.path
    name = os.path.basename(path)
    if "libnvidia-ml" in name:
        return "libnvidia-ml"
    if path.startswith("/dev/nvidia"):
        return "/dev/nvidia* (driver mappings)"
    if "nvidia" in path or name.startswith("libcuda"):
        return "other NVIDIA libraries"
    if path == exe or name.startswith("libpython"):
        return "python (interpreter, libpython)"
    if path == "[heap]":
        return "[heap] (malloc, brk)"
    if path == "[stack]":
        return "[stack] (main thread)"
    if not path or path.startswith("[anon"):
        return "anonymous (Python arenas, thread stacks, mmap'd malloc)"
    if ".so" in name:
        return "other shared libraries"
    return "other (files, vdso, locale)"


def breakdown(pid: int) -> dict:
    """Where `pid`'s RSS is: by kind of mapping, the largest mappings, and the anonymous ones by size."""
    maps = smaps(pid)
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    kinds: dict[str, dict] = {}
    by_path: dict[str, dict] = {}
    for m in maps:
        kind = kinds.setdefault(_category(m, exe), {"rss_kb": 0, "pss_kb": 0, "mappings": 0})
        kind["rss_kb"] += m.rss_kb
        kind["pss_kb"] += m.pss_kb
        kind["mappings"] += 1
        row = by_path.setdefault(m.path or "(anonymous)", {"rss_kb": 0, "private_kb": 0, "size_kb": 0})
        row["rss_kb"] += m.rss_kb
        row["private_kb"] += m.private_kb
        row["size_kb"] += m.size_kb
    anon: dict[str, dict] = {}
    for use, m in _anonymous_uses(maps):
        row = anon.setdefault(use, {"mappings": 0, "rss_kb": 0, "size_kb": 0})
        row["mappings"] += 1
        row["rss_kb"] += m.rss_kb
        row["size_kb"] += m.size_kb
    largest = sorted(by_path.items(), key=lambda item: -item[1]["rss_kb"])[:12]
    return {"rss_kb": sum(m.rss_kb for m in maps), "pss_kb": sum(m.pss_kb for m in maps),
            "by_kind": dict(sorted(kinds.items(), key=lambda item: -item[1]["rss_kb"])),
            "largest": [{"path": path, **row} for path, row in largest],
            "anonymous_by_use": dict(sorted(anon.items(), key=lambda item: -item[1]["rss_kb"])),
            "mappings": len(maps)}


#: glibc's malloc gives each thread that allocates an arena of its own (up to 8 x cores of them): a heap of
#: HEAP_MAX_SIZE (64 MiB) reserved, its used start read-write and the rest PROT_NONE
_ARENA_KB = 64 * 1024


def _anonymous_uses(maps: list[Mapping]):
    """(use, mapping) for each anonymous read-write mapping, told by its neighbours: a thread's malloc arena
    (read-write then PROT_NONE, 64 MiB together), a thread's stack (a 4 KiB guard then read-write), 1 MiB or
    256 KiB alone (Python's object arenas), or other: Python's arenas that the kernel merged into one mapping
    (they are mapped side by side), large malloc blocks, mmap of C libraries. tracemalloc (the imports step)
    says how much of it is Python's."""
    def anonymous(m: Mapping) -> bool:
        return not m.path or m.path.startswith("[anon")
    for i, m in enumerate(maps):
        if not anonymous(m) or "w" not in m.perms:
            continue
        after = maps[i + 1] if i + 1 < len(maps) else None
        before = maps[i - 1] if i else None
        if after is not None and anonymous(after) and after.perms.startswith("---") and \
                m.size_kb + after.size_kb == _ARENA_KB:
            yield "malloc arenas of threads (glibc, 64 MiB reserved each)", m
        elif before is not None and anonymous(before) and before.perms.startswith("---") and before.size_kb <= 64:
            yield "thread stacks (a guard page before)", m
        elif m.size_kb in (256, 1024):
            yield "Python object arenas (obmalloc, 256 KiB or 1 MiB)", m
        else:
            yield "other anonymous (merged Python arenas, large malloc blocks, C libraries' mmap)", m


# -- the check ------------------------------------------------------------------------------------

class Check:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.started = time.monotonic()
        self.deadline = self.started + args.budget
        self.out = Path(args.out).absolute()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "steps").mkdir(exist_ok=True)
        self.work = Path(args.work).absolute() if args.work else Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = open(self.out / "gpu-check.log", "w")
        self.steps: list[Step] = []
        self.summary: dict = {"mode": "fake" if args.fake else "real", "out": str(self.out),
                              "targets": {"cpu_percent": TARGET_CPU_PERCENT, "rss_mb": TARGET_RSS_MB}}
        self.python: str | None = None  # the venv's
        self.slurm_ext: list[str] = []
        self.env: dict[str, str] = {}
        self.config = self.work / "slurm-ext.toml"
        self.spec = self.work / "fake" / "gpus.json"
        self.recordings: list[Path] = []
        self.gpu_slug = "gpu"
        self.children: list[subprocess.Popen] = []

    # -- output ---------------------------------------------------------------------------------

    def run(self, argv: list, timeout: float, env: dict | None = None) -> Result:
        """`argv` in the work directory: `python -c` and `-m` put their directory first on sys.path, and the
        checkout's root holds a slurm_ext folder that is not the installed package."""
        return run(argv, timeout, env=env, cwd=self.work)

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def note(self, text: str) -> None:
        self.say(f"[{time.monotonic() - self.started:6.1f}s] {text}")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def limit(self, wanted: float, keep: float = 0.0) -> float:
        """`wanted` seconds, or what the budget leaves once `keep` seconds are kept for the steps after."""
        return max(1.0, min(wanted, self.left() - keep))

    def keep(self, name: str, result: Result) -> None:
        (self.out / "steps" / f"{name}.out").write_text(result.stdout)
        (self.out / "steps" / f"{name}.err").write_text(result.stderr)

    def step(self, name: str, work, *args, **kwargs):
        """Run one step: its result, or None when it failed (reported; the check goes on)."""
        step = Step(name)
        self.steps.append(step)
        self.note(f"{name} ...")
        started = time.monotonic()
        try:
            found = work(step, *args, **kwargs)
            if step.ok is None:
                step.ok = True
        except CannotRun:
            step.ok, step.seconds = False, time.monotonic() - started
            raise
        except Exception as err:
            step.ok = False
            step.detail = (step.detail + "; " if step.detail else "") + f"{type(err).__name__}: {err}"
            found = None
        step.seconds = time.monotonic() - started
        self.note(f"{name}: {'ok' if step.ok else 'FAILED'} ({step.seconds:.1f}s) {step.detail}")
        return found

    # -- environment and install ------------------------------------------------------------------

    def environment(self, step: Step) -> dict:
        import ctypes
        import importlib.util
        found = {"python": f"{sys.version.split()[0]} ({sys.executable})", "cpus": os.cpu_count(),
                 "kernel": os.uname().release, "user": os.geteuid()}
        for lib in ("libnvidia-ml.so.1", "libcuda.so.1"):
            try:
                ctypes.CDLL(lib)
                found[lib] = "loads"
            except OSError as err:
                found[lib] = f"missing ({err})"
        found["torch"] = "present" if importlib.util.find_spec("torch") else "absent"
        found["cupy"] = "present" if importlib.util.find_spec("cupy") else "absent"
        found["gcc"] = shutil.which("gcc") or "absent"
        found["devices"] = sorted(p.name for p in Path("/dev").glob("nvidia*"))
        self.summary["machine"] = found
        step.detail = (f"Python {found['python']}, {found['cpus']} CPUs, kernel {found['kernel']}; "
                       f"libnvidia-ml {found['libnvidia-ml.so.1'].split(' ')[0]}, libcuda "
                       f"{found['libcuda.so.1'].split(' ')[0]}, torch {found['torch']}, cupy {found['cupy']}")
        return found

    def install(self, step: Step) -> None:
        wheels = Path(self.args.wheels).absolute()
        project = sorted(wheels.glob("slurm_ext-*.whl"))
        if not project:
            raise CannotRun(f"no slurm_ext wheel in {wheels}: run tests/device/build-wheels on a machine with "
                            "network first, and carry tests/device/wheels with the checkout")
        manifest = wheels / "manifest.json"
        if manifest.exists():
            self.summary["wheels"] = json.loads(manifest.read_text())
        self.summary["wheel_vs_tree"] = _wheel_vs_tree(project[-1])
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "SLURM_EXT_"))}
        env["PIP_CONFIG_FILE"] = os.devnull
        venv = self.work / "venv"
        made = self.run([sys.executable, "-m", "venv", "--without-pip", venv], self.limit(60))
        how = []
        if made.returncode == 0:
            python, target = venv / "bin" / "python", None
            how.append("venv")
        else:
            python, target = Path(sys.executable), self.work / "site"
            how.append(f"no venv ({(made.stderr or made.stdout).strip()[-200:]}): --target {target}")
        pip_wheel = sorted(wheels.glob("pip-*.whl"))
        pip = [python, f"{pip_wheel[-1]}/pip"] if pip_wheel else [python, "-m", "pip"]
        argv = [*pip, "install", "--no-index", "--find-links", wheels, "--no-cache-dir", "--disable-pip-version-check",
                "--no-warn-script-location", "--no-compile" if self.args.no_compile else "--compile", "slurm-ext"]
        if target is not None:
            argv += ["--target", target]
        done = self.run(argv, self.limit(120, 150), env=env)
        self.keep("install", done)
        if done.returncode == 0:
            how.append(f"pip {'from ' + pip_wheel[-1].name if pip_wheel else 'of the system'}")
        else:
            how.append(f"pip failed ({done.stderr.strip()[-300:] or 'killed at its time limit'}): wheels unpacked")
            target = target or self.work / "site"
            python = Path(sys.executable)
            _unpack(wheels, target)
        if target is not None:
            env["PYTHONPATH"] = str(target)
        self.python = str(python)
        script = python.parent / "slurm-ext"
        self.slurm_ext = [str(script)] if target is None and script.exists() else [self.python, "-m", "slurm_ext.cli"]
        self.env = env
        probe = self.run([self.python, "-c", "import importlib.metadata as m, slurm_ext, pynvml; "
                     "print(m.version('slurm-ext'), m.version('nvidia-ml-py'), slurm_ext.__file__)"], 60, env=env)
        if probe.returncode != 0:
            raise CannotRun(f"slurm-ext does not import after the install: {probe.stderr.strip()[-500:]}")
        version, pynvml_version, where = probe.stdout.split()
        self.summary["slurm_ext"] = {"version": version, "pynvml": pynvml_version, "installed": where,
                                     "how": ", ".join(how), "wheel": project[-1].name}
        differs = self.summary["wheel_vs_tree"]
        step.detail = (f"slurm-ext {version} ({project[-1].name}), nvidia-ml-py {pynvml_version}: {', '.join(how)}; "
                       f"{differs}")

    def fake_setup(self, step: Step) -> None:
        lib, dev = self.work / "fake" / "lib", self.work / "dev"
        dev.mkdir(parents=True, exist_ok=True)
        code = ("import sys, os\nfrom pathlib import Path\nfrom slurm_ext.devcluster import fakenvml\n"
                "fakenvml.build(Path(sys.argv[1]))\n"
                "fakenvml.write_spec(Path(sys.argv[2]), fakenvml.default_gpus(1))\n"
                "if os.geteuid() == 0:\n    fakenvml.make_device(Path(sys.argv[3]) / 'nvidia0', 0)\n"
                "print(fakenvml.environ(Path(sys.argv[1]), Path(sys.argv[2])))\n")
        done = self.run([self.python, "-c", code, lib, self.spec, dev], self.limit(180, 60), env=self.env)
        self.keep("fake-setup", done)
        if done.returncode != 0:
            raise CannotRun(f"the fake NVML could not be built: {done.stderr.strip()[-800:]}")
        self.env.update(LD_LIBRARY_PATH=str(lib), SLURM_EXT_FAKE_NVML=str(self.spec))
        step.detail = f"fake libnvidia-ml built in {lib}, one fake NVIDIA H200 in {self.spec}"

    def nvml_info(self, step: Step) -> dict:
        done = self.run([self.python, HERE / "probes.py", "nvml-info"], self.limit(30), env=self.env)
        self.keep("nvml-info", done)
        if done.returncode != 0:
            raise RuntimeError(f"NVML does not answer: {done.stderr.strip()[-600:]}")
        info = json.loads(done.stdout)
        self.summary["gpu"] = info
        if not info["gpus"]:
            raise RuntimeError("NVML answers but lists no GPU")
        name = info["gpus"][0]["name"]
        self.gpu_slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + "-" + info["driver"]
        step.detail = (f"{len(info['gpus'])} x {name}, driver {info['driver']}, NVML {info['nvml_version']}, "
                       f"CUDA {info.get('cuda_driver_version')}, nvmlInit {info['init_ms']} ms")
        return info

    def write_config(self, path: Path, state: str = "state", runtime: str = "run") -> Path:
        """A config of the check's own: no Slurm here, so Slurm's checks are off; every other key its default."""
        gres = f'\n[gres]\ndev_dir = "{self.work / "dev"}"\n' if self.args.fake else ""
        text = (f'# the device check\'s own: no Slurm here, so its checks are off\n[node]\nname = "gpucheck"\n'
                f'state_dir = "{self.work / state}"\nruntime_dir = "{self.work / runtime}"\n'
                f'{gres}\n[health.checks.slurmd]\nenabled = false\n[health.checks.foreign-drain]\nenabled = false\n')
        (self.work / state).mkdir(exist_ok=True)
        (self.work / runtime).mkdir(exist_ok=True)
        path.write_text(text)
        return path

    def recorded(self, name: str) -> dict:
        """The environment of a project command whose NVML calls go to recording-<gpu>-<driver>-<name>.json."""
        path = self.work / "recordings" / f"recording-{self.gpu_slug}-{name}.json"
        path.parent.mkdir(exist_ok=True)
        self.recordings.append(path)
        return {**self.env, "SLURM_EXT_NVML_RECORD": str(path), "SLURM_EXT_CONFIG": str(self.config)}

    # -- the project's commands -------------------------------------------------------------------

    def inventory(self, step: Step) -> None:
        done = self.run([*self.slurm_ext, "--config", self.config, "gres", "inventory", "--json"], self.limit(30),
                   env=self.recorded("gres-inventory"))
        self.keep("gres-inventory", done)
        if done.returncode != 0:
            raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-600:]}")
        inv = json.loads(done.stdout)
        gpus = inv.get("gpus") or []
        self.summary["gres_inventory"] = {"gpus": [f"{g.get('name')} {g.get('uuid')} minor {g.get('minor')} "
                                                   f"type {g.get('type')}" for g in gpus],
                                          "problems": inv.get("problems") or [], "lost": inv.get("lost") or []}
        expected = len((self.summary.get("gpu") or {}).get("gpus") or [])
        step.ok = bool(gpus) and len(gpus) == expected and not inv.get("problems") and not inv.get("lost")
        step.detail = (f"{len(gpus)} GPU(s) ({', '.join(sorted({g.get('type', '?') for g in gpus}))}), "
                       f"{len(inv.get('problems') or [])} problem(s)"
                       + "".join(f"; {p}" for p in (inv.get("problems") or [])[:3]))

    def health_check(self, step: Step, name: str) -> dict:
        done = self.run([*self.slurm_ext, "--config", self.config, "health", "check", "--json"], self.limit(60),
                   env=self.recorded(name))
        self.keep(name, done)
        try:
            report = json.loads(done.stdout)
        except ValueError:
            raise RuntimeError(f"exit {done.returncode}, no JSON: {done.stderr.strip()[-600:]}") from None
        findings = report.get("findings") or []
        row = {"exit": done.returncode, "healthy": report.get("healthy"), "findings": findings,
               "not_applicable": report.get("not_applicable"), "monitor": report.get("monitor"),
               "ran": len(report.get("ran") or [])}
        self.summary.setdefault("health_check", {})[name] = row
        step.ok = done.returncode == 0 and not findings
        step.detail = (f"exit {done.returncode}, {len(findings)} finding(s), {row['ran']} checks ran, not "
                       f"applicable: {', '.join(report.get('not_applicable') or []) or 'none'}"
                       + "".join(f"; {f.get('severity')} {f.get('check')}: {f.get('evidence')}" for f in findings[:4]))
        return row

    def imports(self, step: Step) -> None:
        """The monitor with tracemalloc (what its imports keep) and, beside it, the monitor with the recorder (its
        NVML calls): two runs, because the recorder imports modules of its own. Each has a state dir of its own;
        the first one's is the check's (`health check` reads what a monitor wrote this boot)."""
        seconds = self.args.import_seconds
        config = self.write_config(self.work / "slurm-ext-recorded.toml", "state-recorded", "run-recorded")
        log = open(self.out / "monitor-recorded.log", "w")
        recorded = subprocess.Popen([*self.slurm_ext, "--config", str(config), "health", "monitor"],
                                    env={**self.recorded("monitor"), "SLURM_EXT_CONFIG": str(config)}, stdout=log,
                                    stderr=subprocess.STDOUT, cwd=self.work, start_new_session=True)
        self.children.append(recorded)
        try:
            done = self.run([self.python, HERE / "probes.py", "imports", "--config", self.config, "--seconds",
                             seconds], self.limit(seconds + 30), env={**self.env, "SLURM_EXT_CONFIG": str(self.config)})
        finally:
            self._stop(recorded)
            log.close()
        self.keep("imports", done)
        if done.returncode != 0 or not done.stdout.strip():
            raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-600:]}")
        found = json.loads(done.stdout.strip().splitlines()[-1])
        (self.out / "imports.json").write_text(json.dumps(found, indent=1))
        self.summary["imports"] = found
        step.detail = (f"{found['modules_total']} modules in the process ({found['modules_loaded']} imported by the "
                       f"monitor), Python memory {found['python_traced_mb']} MB traced; the recorded monitor's exit "
                       f"{recorded.returncode}")
        step.ok = recorded.returncode == 0

    # -- the monitor's cost -----------------------------------------------------------------------------

    def monitor(self, step: Step) -> None:
        runtime = self.work / "run"
        readings = runtime / "health.json"
        readings.unlink(missing_ok=True)
        extra = dict(item.split("=", 1) for item in self.args.monitor_env)
        env = {**self.env, "SLURM_EXT_CONFIG": str(self.config), **extra}
        log = open(self.out / "monitor.log", "w")
        proc = subprocess.Popen([*self.slurm_ext, "--config", str(self.config), "health", "monitor"], env=env,
                                stdout=log, stderr=subprocess.STDOUT, cwd=self.work, start_new_session=True)
        self.children.append(proc)
        try:
            first = time.monotonic()
            while not readings.exists() and proc.poll() is None and time.monotonic() - first < 30:
                time.sleep(0.1)
            if proc.poll() is not None or not readings.exists():
                raise RuntimeError(f"the monitor wrote no readings within 30 s (exit {proc.poll()}): "
                                   f"{(self.out / 'monitor.log').read_text()[-600:]}")
            self.note(f"monitor pid {proc.pid}: first readings after {time.monotonic() - first:.1f}s")
            time.sleep(1.0)  # the first poll's judging and files
            phase = min(self.args.phase_seconds, max(5.0, (self.left() - 75) / 2))
            costs = self.summary.setdefault("monitor", {"pid": proc.pid, "command": " ".join(
                [f"{k}={v}" for k, v in extra.items()] + [os.path.basename(proc.args[0])]
                + [a if a != str(self.config) else "CONFIG" for a in proc.args[1:]])})
            costs["idle"] = self._phase("idle", proc.pid, phase, readings)
            load = self._start_load()
            if load is None:
                step.ok = False
                step.detail = f"idle: {_cost_line(costs['idle'])}; no load could start: {costs.get('load_error')}"
                return
            try:
                phase = min(self.args.phase_seconds, max(5.0, self.left() - 50))
                costs["load"] = self._phase("load", proc.pid, phase, readings)
                self.step("health check (under load)", self.health_check, "health-check-load")
            finally:
                self._stop_load(load)
        finally:
            self._stop(proc)
            log.close()
            costs = self.summary.get("monitor") or {}
            costs["exit"] = proc.returncode
            costs["findings"] = _journal_findings(self.work / "state" / "journal.jsonl")
            journal = self.work / "state" / "journal.jsonl"
            if journal.exists():
                shutil.copy(journal, self.out / "journal.jsonl")
        costs = self.summary["monitor"]
        step.detail = (f"idle: {_cost_line(costs['idle'])}; load: {_cost_line(costs['load'])}; exit {costs['exit']}; "
                       f"{len(costs['findings'])} finding(s) in its journal")
        step.ok = costs["exit"] == 0

    def _phase(self, name: str, pid: int, seconds: float, readings: Path) -> dict:
        self.note(f"monitor {name}: measuring {seconds:.0f}s")
        ticks0, sched0, t0 = cpu_ticks(pid), sched_ns(pid), time.monotonic()
        rss: list[int] = []
        while time.monotonic() - t0 < seconds:
            time.sleep(min(1.0, max(0.0, seconds - (time.monotonic() - t0))))
            rss.append(status(pid)["VmRSS"])
        wall = time.monotonic() - t0
        ticks1, sched1 = cpu_ticks(pid), sched_ns(pid)
        mem = status(pid)
        found = {"seconds": round(wall, 1), "cpu_percent": round(100 * (ticks1 - ticks0) / CLK_TCK / wall, 3),
                 "cpu_ms": round(1000 * (ticks1 - ticks0) / CLK_TCK),
                 "rss_mb": round(mem["VmRSS"] / 1024, 1), "rss_max_mb": round(max(rss) / 1024, 1),
                 "rss_min_mb": round(min(rss) / 1024, 1), "rss_anon_mb": round(mem.get("RssAnon", 0) / 1024, 1),
                 "rss_file_mb": round(mem.get("RssFile", 0) / 1024, 1), "threads": mem.get("Threads"),
                 "vm_size_mb": round(mem.get("VmSize", 0) / 1024, 1)}
        if sched0 is not None and sched1 is not None:
            found["cpu_percent_schedstat"] = round(100 * (sched1 - sched0) / 1e9 / wall, 3)
        found["breakdown"] = breakdown(pid)
        (self.out / f"smaps-{name}.txt").write_text(open(f"/proc/{pid}/smaps").read())
        try:
            data = json.loads(readings.read_text())
            shutil.copy(readings, self.out / f"monitor-readings-{name}.json")
            found["readings"] = [{k: g.get(k) for k in ("utilization", "fb_used_mib", "power_w", "sm_clock",
                                                        "clocks_event_reasons", "temperature", "error")}
                                 for g in data.get("gpus") or []]
        except (OSError, ValueError) as err:
            found["readings"] = f"unreadable: {err}"
        self.note(f"monitor {name}: {_cost_line(found)}")
        return found

    def _start_load(self) -> subprocess.Popen | None:
        costs = self.summary["monitor"]
        if self.args.fake:
            spec = json.loads(self.spec.read_text())
            for gpu in spec["gpus"]:
                gpu.update(utilization_gpu=100, utilization_memory=60, memory_used=21 * 2**30, power_usage=690_000,
                           clocks_event_reasons=0x4, temperature=55)
            self._write_spec(spec)
            costs["load_kind"] = "fake: the spec says 100 % busy, 21 GiB used, 690 W, software power cap"
            return subprocess.Popen(["sleep", "3600"])  # stands for the load process
        argv = [sys.executable, HERE / "gpuload.py", "load", "--backend", self.args.load_backend,
                "--gib", str(self.args.load_gib), "--seconds", str(self.args.phase_seconds + 120)]
        log = open(self.out / "load.log", "w")
        proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=log, text=True,
                                start_new_session=True)
        self.children.append(proc)
        deadline = time.monotonic() + self.limit(90, 60)
        lines, output = [], _lines(proc)
        while True:
            line = output.get(max(0.0, deadline - time.monotonic()))
            if line is None:  # it ended, or nothing came in time
                break
            lines.append(line.strip())
            log.write(line)
            if line.startswith("ready "):
                costs["load_kind"] = line.strip()[len("ready "):]
                self.note(f"load: {costs['load_kind']}")
                return proc
        costs["load_error"] = "; ".join(lines) or "no answer from gpuload.py"
        self._stop_load(proc)
        return None

    def _stop_load(self, proc: subprocess.Popen) -> None:
        if self.args.fake:
            spec = json.loads(self.spec.read_text())
            for gpu in spec["gpus"]:
                gpu.update(utilization_gpu=0, utilization_memory=0, memory_used=0, power_usage=70_000,
                           clocks_event_reasons=0, temperature=30)
            self._write_spec(spec)
        self._stop(proc)

    def _write_spec(self, spec: dict) -> None:
        tmp = self.spec.with_suffix(".tmp")
        tmp.write_text(json.dumps(spec))
        os.replace(tmp, self.spec)

    def _stop(self, proc: subprocess.Popen, wait: float = 15.0) -> None:
        """SIGTERM to `proc` (by its PID), SIGKILL after `wait` seconds."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc in self.children:
            self.children.remove(proc)

    # -- the Epilog's release -----------------------------------------------------------------------

    def release(self, step: Step) -> None:
        argv = [self.python, HERE / "probes.py", "release", "--config", self.config, "--gib", str(self.args.hold_gib),
                "--holder-python", sys.executable, "--gpuload", HERE / "gpuload.py"]
        if self.args.fake:
            argv += ["--fake-spec", self.spec]
        done = self.run(argv, self.limit(60, 10), env=self.recorded("epilog-release"))
        self.keep("epilog-release", done)
        if done.returncode != 0 or not done.stdout.strip():
            raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-600:]}")
        found = json.loads(done.stdout.strip().splitlines()[-1])
        self.summary["release"] = found
        (self.out / "release.json").write_text(json.dumps(found, indent=1))
        if found.get("error"):
            step.ok = False
            step.detail = found["error"]
            return
        step.ok = bool(found.get("released")) and bool(found.get("listed"))
        step.detail = (f"holder {'listed' if found.get('listed') else 'NOT listed'} by NVML "
                       f"(pids seen {[p['pid'] for p in found.get('processes_seen', [])]}); "
                       + (f"released {found['release_s']:.3f}s after SIGKILL" if found.get("released") else
                          f"still held after {found.get('release_s')}s: {found.get('still_held')}"))

    # -- the acceptance tests through libcuda ------------------------------------------------------------

    def acceptance(self, step: Step) -> None:
        """gpu-memory, gpu-bandwidth and gpu-burn at standard through the acceptance child, then PyTorch's D2D copy."""
        found: dict = {"targets": {"d2d_share_of_torch": TARGET_D2D_SHARE_OF_TORCH, "h2d_share": TARGET_H2D_SHARE,
                                   "pcie5_x16_gbps": PCIE5_X16_GBPS}}
        self.summary["acceptance"] = found
        problems = []
        for test in ACCEPTANCE_TESTS:
            deadline = self.limit(120, 30)
            request = {"test": test, "level": "standard", "config": str(self.config), "deadline": deadline,
                       "profile": "auto"}
            done = run([self.python, "-m", "slurm_ext.acceptance.child"], deadline + 15, env=self.env, cwd=self.work,
                       input=json.dumps(request))
            self.keep(f"acceptance-{test}", done)
            try:
                answer = json.loads(done.stdout)
            except ValueError:
                answer = {"error": f"exit {done.returncode}: {done.stderr.strip()[-400:] or 'no answer'}"}
            found[test] = answer
            if "results" not in answer:
                problems.append(f"{test}: {answer.get('error') or answer.get('not_applicable')}")
            else:
                problems += [f"{r['target']} {test} {r['outcome']}: {r['message']}" for r in answer["results"]
                             if r["outcome"] != "pass"]
        figures = {f["name"]: f["value"] for r in (found.get("gpu-bandwidth") or {}).get("results", [])[:1]
                   for f in r["figures"]}
        if "h2d_gbps" in figures:
            found["h2d_share"] = figures["h2d_gbps"] / PCIE5_X16_GBPS
        torch = self.run([sys.executable, "-c", TORCH_D2D, str(D2D_BYTES)], self.limit(90, 10))
        self.keep("acceptance-torch-d2d", torch)
        try:
            found["torch"] = json.loads(torch.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            last = torch.stderr.strip().splitlines()[-1:] or ["no answer"]
            found["torch"] = {"error": "PyTorch absent" if "No module named 'torch'" in torch.stderr else last[0]}
        if "d2d_gbps" in found["torch"] and "d2d_gbps" in figures:
            found["d2d_share_of_torch"] = figures["d2d_gbps"] / found["torch"]["d2d_gbps"]
        (self.out / "acceptance.json").write_text(json.dumps(found, indent=1))
        step.ok = not problems
        step.detail = "; ".join(line.strip() for line in _render_acceptance(found)[1:3]) + (
            f"; {'; '.join(problems)[:300]}" if problems else "")

    # -- recordings -------------------------------------------------------------------------------------

    def recordings_diff(self, step: Step) -> None:
        present = [p for p in self.recordings if p.exists()]
        absent = [p.name for p in self.recordings if not p.exists()]
        if not present:
            raise RuntimeError("no recording was written (is slurm_ext.nvmlrecord in this slurm-ext?)")
        merged = self.out / f"recording-{self.gpu_slug}.json"
        gpu, machine = self.summary.get("gpu") or {}, self.summary.get("machine") or {}
        source = {"by": "tests/device/gpu-check" + (" --fake" if self.args.fake else ""),
                  "gpu": ", ".join(sorted({g["name"] for g in gpu.get("gpus", [])})), "driver": gpu.get("driver"),
                  "host": f"kernel {machine.get('kernel')}, {machine.get('cpus')} CPUs",
                  "python": machine.get("python"), "merged_from": [p.name for p in present]}
        code = ("import json, sys\nfrom slurm_ext import nvmlrecord\n"
                "rec = nvmlrecord.merge(*[nvmlrecord.read(p) for p in sys.argv[3:]])\n"
                "rec['source'] = {**rec.get('source', {}), **json.loads(sys.argv[2])}\n"
                "nvmlrecord.write(rec, sys.argv[1])\nprint(len(rec['calls']))\n")
        done = self.run([self.python, "-c", code, merged, json.dumps(source), *present], self.limit(30), env=self.env)
        if done.returncode != 0:
            raise RuntimeError(f"cannot merge the recordings: {done.stderr.strip()[-600:]}")
        for path in present:
            shutil.copy(path, self.out / path.name)
        rows = {"recording": str(merged), "calls": int(done.stdout.split()[-1]), "parts": [p.name for p in present],
                "part_names": [p.stem[len(f"recording-{self.gpu_slug}-"):] for p in present],
                "parts_missing": absent, "diffs": []}
        self.summary["recording"] = rows
        name = (gpu.get("gpus") or [{}])[0].get("name", "")
        pairs = [(old, merged, f"{old.relative_to(REPO)} (committed) -> this run", f"diff-{old.stem}-vs-this-run.txt")
                 for old in _recordings_of(name)]
        fake = Path(self.args.wheels) / "fake-recording.json"
        if not self.args.fake and fake.exists():
            pairs.append((merged, fake, "this run -> the fake NVML's answers (build-wheels' fake-recording.json)",
                          "diff-fake-vs-this-run.txt"))
        if not pairs:
            rows["diffs"].append({"against": f"no committed recording of {name!r} in {COMMITTED_RECORDINGS}",
                                  "differs": None})
        for old, new, label, out_name in pairs:
            done = self.run([self.python, "-m", "slurm_ext.nvmlrecord", "diff", old, new], self.limit(30),
                            env=self.env)
            (self.out / out_name).write_text(done.stdout + done.stderr)
            lines = [line for line in done.stdout.splitlines() if line.strip()]
            gaps = [line for line in lines if ": a gap of " in line]
            rows["diffs"].append({"against": label, "old": str(old), "new": str(new), "exit": done.returncode,
                                  "differs": done.returncode == 1, "gaps": len(gaps),
                                  "lines": [line for line in lines if line not in gaps][:40], "file": out_name})
        verdicts = [f"{d['against']}: {_verdict(d)}" for d in rows["diffs"]]
        step.detail = f"{rows['calls']} calls in {merged.name} from {len(present)} process(es); " + "; ".join(verdicts)
        step.ok = not absent and all(d.get("exit") in (0, 1) for d in rows["diffs"] if "exit" in d)

    # -- the whole check --------------------------------------------------------------------------------

    def main(self) -> int:
        code = RAN
        self.say(f"gpu-check: {'FAKE NVML (no GPU)' if self.args.fake else 'real GPU'}; out {self.out}; "
                 f"work {self.work}; budget {self.args.budget:.0f}s")
        try:
            self.step("environment", self.environment)
            self.step("install", self.install)
            if self.args.fake:
                self.step("fake NVML", self.fake_setup)
            shutil.copy(self.write_config(self.config), self.out / "slurm-ext.toml")
            info = self.step("NVML", self.nvml_info)
            self.step("gres inventory", self.inventory)
            if info is None:
                code = NO_GPU
                self.step("health check", self.health_check, "health-check")
            else:
                self.step("monitor imports (tracemalloc)", self.imports)
                self.step("health check", self.health_check, "health-check")
                self.step("monitor idle and under load", self.monitor)
                self.step("epilog GPU release", self.release)
                if self.args.acceptance:
                    self.step("acceptance GPU tests", self.acceptance)
            self.step("recordings", self.recordings_diff)
        except CannotRun as err:
            self.steps[-1].detail = str(err)
            self.note(f"cannot run: {err}")
            code = CANNOT_RUN
        finally:
            for proc in list(self.children):
                self._stop(proc, 5.0)
        self.summary["steps"] = [vars(s) for s in self.steps]
        self.summary["seconds"] = round(time.monotonic() - self.started, 1)
        self.summary["exit"] = code
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str))
        text = render(self.summary)
        (self.out / "summary.txt").write_text(text)
        self.say(text)
        self.log.close()
        if not self.args.keep_work and not self.args.work:
            shutil.rmtree(self.work, ignore_errors=True)
        return code


# -- helpers ----------------------------------------------------------------------------------------------

def _lines(proc: subprocess.Popen):
    """A queue of `proc`'s stdout lines, read on a thread of their own (None once it ends). Not select() and
    readline(): lines that came in one read wait in the file's buffer where select() does not see them."""
    import queue
    import threading
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)
    threading.Thread(target=read, name="load-output", daemon=True).start()
    return _Lines(lines)


class _Lines:
    """`get(timeout)`: the next line, or None when the process ended or nothing came in time."""

    def __init__(self, lines) -> None:
        self._lines = lines

    def get(self, timeout: float) -> str | None:
        import queue
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            return None


def _journal_findings(path: Path) -> list[str]:
    found = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "health-finding":
                found.append(str(event.get("message") or event)[:300])
    return found


def _recordings_of(name: str) -> list[Path]:
    """The committed recordings (tests/data/real-gpu/*.json) whose GPU is named `name`."""
    found = []
    for path in sorted(COMMITTED_RECORDINGS.glob("*.json")) if COMMITTED_RECORDINGS.is_dir() else ():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or data.get("format") != "slurm-ext-nvml-recording":
            continue
        names = {a.get("value") for c in data.get("calls") or () if c.get("call") == "nvmlDeviceGetName"
                 for a in c.get("answers") or () if a.get("ret") == 0}
        if name in names:
            found.append(path)
    return found


def _wheel_vs_tree(wheel: Path) -> str:
    """Whether the wheel's modules are the working tree's (a stale wheel measures old code)."""
    setup = REPO / "setup.cfg"
    if not setup.exists():
        return "no checkout beside the script to compare the wheel with"
    parser = configparser.ConfigParser()
    parser.read(setup)
    dirs = dict(tuple(p.strip() for p in line.split("=")) for line in
                parser["options"]["package_dir"].strip().splitlines())
    differ, compared = [], 0
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if not name.endswith(".py") or ".dist-info/" in name:
                continue
            module = name[:-3].replace("/", ".")
            package = max((p for p in dirs if module == p or module.startswith(p + ".")), key=len, default=None)
            if package is None:
                continue
            rest = name[len(package.replace(".", "/")):].lstrip("/")
            local = REPO / dirs[package] / rest
            compared += 1
            if not local.exists() or local.read_bytes() != archive.read(name):
                differ.append(name)
    if differ:
        return (f"the wheel is NOT the working tree: {len(differ)} of {compared} modules differ "
                f"({', '.join(differ[:5])}); run tests/device/build-wheels again")
    return f"the wheel's {compared} modules are the working tree's"


def _unpack(wheels: Path, target: Path) -> None:
    """Every wheel unpacked into `target` (no pip): the pure-Python ones work as installed; MarkupSafe falls back
    to its Python code when its compiled part is for another Python."""
    target.mkdir(parents=True, exist_ok=True)
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for wheel in sorted(wheels.glob("*.whl")):
        name = wheel.name
        if name.startswith("pip-") or ("-cp" in name and f"-{tag}-" not in name):
            continue
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)


def _verdict(diff: dict) -> str:
    return {None: "n/a", True: "DIFFERS", False: "same"}[diff.get("differs")]


def _mb(kb: int) -> str:
    return f"{kb / 1024:.1f}"


def _cost_line(found: dict | None) -> str:
    if not found:
        return "not measured"
    return (f"{found['cpu_percent']:.3f} % of a core over {found['seconds']:.0f}s, RSS {found['rss_mb']:.1f} MB "
            f"(max {found['rss_max_mb']:.1f}), {found['threads']} threads")


def _mark(values: list[float], limit: float) -> str:
    return "ok" if max(values) < limit else "OVER"


def _row(label: str, idle: dict, load: dict | None, key: str, unit: str) -> str:
    cells = [f"{phase[key]:.3f}{unit}" if unit else f"{phase[key]:.1f}" for phase in (idle, load) if phase]
    return f"  {label:<28}" + "".join(f"{cell:>14}" for cell in cells)


def _render_monitor(s: dict) -> list[str]:
    mon = s.get("monitor") or {}
    idle, load = mon.get("idle"), mon.get("load")
    if not idle:
        return []
    phases = [p for p in (idle, load) if p]
    before = H200_BEFORE
    lines = [f"monitor at default settings (pid {mon.get('pid')}, {mon.get('command')}):",
             f"  {'':<28}{'idle':>14}{'load':>14}{'target':>12}   before, on the H200 (Python 3.12)",
             _row("CPU % of one core", idle, load, "cpu_percent", " %")
             + f"{'< 0.2 %':>12}   {_mark([p['cpu_percent'] for p in phases], TARGET_CPU_PERCENT):<5}"
             f"({before['idle_cpu_percent']:.2f} % idle, {before['load_cpu_percent']:.2f} % load)"]
    if all("cpu_percent_schedstat" in p for p in phases):
        lines.append(_row("  (schedstat, live threads)", idle, load, "cpu_percent_schedstat", " %"))
    lines += [_row("RSS, MB (at the end)", idle, load, "rss_mb", "")
              + f"{'< 50 MB':>12}   {_mark([p['rss_mb'] for p in phases], TARGET_RSS_MB):<5}({before['rss_mb']} MB)",
              _row("RSS, MB (largest sampled)", idle, load, "rss_max_mb", ""),
              _row("RSS anonymous, MB", idle, load, "rss_anon_mb", ""),
              _row("RSS of files, MB", idle, load, "rss_file_mb", ""),
              f"  {'threads':<28}" + "".join(f"{p['threads']:>14}" for p in phases)]
    if load:
        lines.append(f"  load: {mon.get('load_kind')}")
    elif mon.get("load_error"):
        lines.append(f"  load: none could start: {mon['load_error'][:300]}")
    for name, phase in (("idle", idle), ("load", load)):
        if phase and isinstance(phase.get("readings"), list):
            lines.append(f"  the monitor's readings ({name}): " + "; ".join(
                f"util {r.get('utilization')} %, {r.get('fb_used_mib')} MiB, {r.get('power_w')} W, SM "
                f"{r.get('sm_clock')} MHz, reasons {r.get('clocks_event_reasons')}" for r in phase["readings"]))
    findings = mon.get("findings") or []
    lines.append(f"  findings in the monitor's journal: {len(findings)}" + "".join(f"\n    {f}" for f in findings[:5]))
    for name, phase in (("idle", idle), ("load", load)):
        if not phase:
            continue
        b = phase["breakdown"]
        lines.append(f"  RSS by mapping ({name}, smaps: {_mb(b['rss_kb'])} MB, PSS {_mb(b['pss_kb'])} MB, "
                     f"{b['mappings']} mappings):")
        lines += [f"    {_mb(row['rss_kb']):>6} MB  {kind} ({row['mappings']} mappings)"
                  for kind, row in b["by_kind"].items() if row["rss_kb"] >= 100]
        lines.append("    anonymous by use: " + "; ".join(
            f"{k}: {v['mappings']} x, {_mb(v['rss_kb'])} MB" for k, v in b["anonymous_by_use"].items()))
        if name == "idle":
            lines.append("    largest: " + "; ".join(
                f"{os.path.basename(r['path']) or r['path']} {_mb(r['rss_kb'])}" for r in b["largest"][:8]))
    imports = s.get("imports")
    if imports:
        kinds = ", ".join(f"{k} {v['modules']} ({v['kept_kb'] / 1024:.1f} MB)" for k, v in imports["by_kind"].items())
        lines.append(f"  imports: {imports['modules_total']} modules in the process, {imports['modules_loaded']} "
                     f"imported by the monitor ({imports.get('module_files_mb')} MB of files): {kinds} kept; "
                     f"Python memory traced {imports['python_traced_mb']} MB (tracemalloc, in a run of its own)")
        top = [f"{n} {g['kept_kb'] / 1024:.2f} MB/{g['modules']}" + (f" (by {g['imported_by']})"
                                                                       if g.get("imported_by") else "")
               for n, g in list(imports["by_package"].items())[:10]]
        lines.append("    kept by package: " + "; ".join(top))
    return lines


def _render_release(rel: dict | None) -> list[str]:
    if not rel:
        return []
    if rel.get("error"):
        return [f"epilog GPU release: {rel['error']}"]
    lines = [f"epilog GPU release: {'released' if rel.get('released') else 'NOT released'} {rel.get('release_s')}s "
             f"after SIGKILL (release_gpus, threshold {rel.get('threshold_mib')} MiB); the holder of "
             f"{rel.get('holder_gib')} GiB {'listed' if rel.get('listed') else 'NOT listed'} by NVML"]
    for name in ("idle", "held", "after"):
        mem = rel.get(name)
        if mem:
            lines.append(f"  memory {name:>5}: v1 used {mem.get('v1_used_mib')} MiB; v2 used "
                         f"{mem.get('v2_used_mib', mem.get('v2'))} MiB, reserved {mem.get('v2_reserved_mib', '-')} MiB")
    return lines


def _render_acceptance(found: dict | None) -> list[str]:
    """gpu-memory's, gpu-bandwidth's and gpu-burn's figures of the first GPU, and how they compare."""
    if not found:
        return []
    lines = ["acceptance (libcuda, PTX; standard):"]
    for test in ACCEPTANCE_TESTS:
        answer = found.get(test) or {}
        results = answer.get("results") or []
        if not results:
            lines.append(f"  {test}: {answer.get('error') or answer.get('not_applicable') or 'no answer'}")
            continue
        first = results[0]
        lines.append(f"  {test} ({len(results)} GPUs) {first['target']}: {first['outcome']}, "
                     + "; ".join(f"{f['name']} {f['value']:.4g}" for f in first["figures"]) + f" ({first['seconds']}s)")
    torch = found.get("torch") or {}
    if "d2d_share_of_torch" in found:
        share = found["d2d_share_of_torch"]
        lines.append(f"  D2D {share:.1%} of PyTorch's {torch['d2d_gbps']:.0f} GB/s (torch {torch.get('torch')}, "
                     f"{torch['bytes'] / 2**30:.0f} GiB; target >= {TARGET_D2D_SHARE_OF_TORCH:.0%}) "
                     f"{'ok' if share >= TARGET_D2D_SHARE_OF_TORCH else 'BELOW'}")
    else:
        lines.append(f"  D2D against PyTorch: not measured ({torch.get('error', 'no figure')})")
    if "h2d_share" in found:
        share = found["h2d_share"]
        lines.append(f"  H2D {share:.1%} of PCIe Gen5 x16's {PCIE5_X16_GBPS:.0f} GB/s (target >= "
                     f"{TARGET_H2D_SHARE:.0%}) {'ok' if share >= TARGET_H2D_SHARE else 'BELOW'}")
    return lines


def _render_recording(rec: dict | None) -> list[str]:
    if not rec:
        return []
    missing = f"; MISSING {', '.join(rec['parts_missing'])}" if rec["parts_missing"] else ""
    lines = [f"recording: {rec['recording']} ({rec['calls']} calls, merged from the recordings of "
             f"{', '.join(rec['part_names'])}{missing})"]
    for diff in rec["diffs"]:
        gaps = f", besides {diff['gaps']} gap(s) the recording declares" if diff.get("gaps") else ""
        where = f" ({diff['file']})" if diff.get("file") else ""
        lines.append(f"  diff {diff['against']}: {_verdict(diff)}{gaps}{where}")
        if diff.get("differs"):
            lines += [f"    {line[:220]}" for line in diff["lines"][:25]]
    return lines


def render(s: dict) -> str:
    """The summary as text: the last thing the check prints (and summary.txt)."""
    lines = ["", "=" * 100, f"gpu-check summary ({s['mode']}): {s.get('seconds', 0):.0f}s, exit {s.get('exit')}"]
    gpu, machine, installed = s.get("gpu") or {}, s.get("machine") or {}, s.get("slurm_ext")
    if gpu:
        names = ", ".join(sorted({g["name"] for g in gpu.get("gpus", [])}))
        lines.append(f"GPU: {len(gpu.get('gpus', []))} x {names}; driver {gpu.get('driver')}, NVML "
                     f"{gpu.get('nvml_version')}, CUDA {gpu.get('cuda_driver_version')}; nvidia-ml-py "
                     f"{gpu.get('pynvml')}")
    if machine:
        lines.append(f"machine: Python {machine.get('python')}, {machine.get('cpus')} CPUs, kernel "
                     f"{machine.get('kernel')}, torch {machine.get('torch')}, cupy {machine.get('cupy')}"
                     + ("" if machine.get("user") == 0 else f", NOT root (uid {machine.get('user')})"))
    if installed:
        lines.append(f"slurm-ext {installed['version']} from {installed['wheel']} ({installed['how']}); "
                     f"{s.get('wheel_vs_tree')}")
    lines.append("steps:")
    for step in s.get("steps") or []:
        lines.append(f"  {'ok  ' if step['ok'] else 'FAIL'} {step['name']:<30} {step['seconds']:6.1f}s  "
                     f"{step['detail']}"[:400])
    lines += _render_monitor(s)
    lines += _render_release(s.get("release"))
    lines += _render_acceptance(s.get("acceptance"))
    lines += _render_recording(s.get("recording"))
    for name, row in (s.get("health_check") or {}).items():
        if row.get("findings"):
            lines.append(f"{name}: exit {row['exit']}: " + "; ".join(
                f"{f.get('severity')} {f.get('check')}: {f.get('evidence')}" for f in row["findings"][:5]))
    lines.append(f"files: {s['out']}")
    return "\n".join(lines)


def _interrupted(*_) -> None:
    raise KeyboardInterrupt()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests/device/gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or f"gpu-check-{time.strftime('%Y%m%d-%H%M%S')}",
                        help="where the results go (default: $OUT, else ./gpu-check-<time>)")
    parser.add_argument("--fake", action="store_true", help="the project's fake libnvidia-ml instead of a GPU")
    parser.add_argument("--wheels", default=str(DEFAULT_WHEELS), help="the wheels to install (build-wheels')")
    parser.add_argument("--phase-seconds", type=float, default=60.0, help="each monitor phase (default 60)")
    parser.add_argument("--import-seconds", type=float, default=12.0,
                        help="the tracemalloc run of the monitor (default 12: two polls)")
    parser.add_argument("--budget", type=float, default=285.0, help="the whole check's time (default 285 s)")
    parser.add_argument("--load-backend", default="auto", choices=("auto", "torch", "cupy", "cuda"))
    parser.add_argument("--load-gib", type=float, default=8.0, help="GPU memory the load holds (default 8)")
    parser.add_argument("--hold-gib", type=float, default=2.0, help="GPU memory the killed process holds (default 2)")
    parser.add_argument("--monitor-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the measured monitor only (e.g. MALLOC_ARENA_MAX=2), to "
                             "measure what it changes; repeatable")
    parser.add_argument("--no-acceptance", dest="acceptance", action="store_false",
                        help="leave out the acceptance tests through libcuda (gpu-memory, gpu-bandwidth, gpu-burn)")
    parser.add_argument("--work", help="work directory (default: a temporary one, removed at the end)")
    parser.add_argument("--keep-work", action="store_true", help="keep the temporary work directory")
    parser.add_argument("--no-compile", action="store_true", help="install without byte-compiling (faster)")
    args = parser.parse_args(argv)
    bad = [item for item in args.monitor_env if "=" not in item or not item.split("=", 1)[0]]
    if bad:
        parser.error(f"--monitor-env wants NAME=VALUE, not {bad[0]!r}")
    if sys.version_info < (3, 11):
        print(f"gpu-check: Python {sys.version.split()[0]} is too old: slurm-ext needs Python >= 3.11",
              file=sys.stderr)
        return CANNOT_RUN
    check = Check(args)
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        return check.main()
    except KeyboardInterrupt:
        for proc in list(check.children):
            check._stop(proc, 3.0)
        return CANNOT_RUN


if __name__ == "__main__":
    sys.exit(main())
