"""GPU tests through the driver API (libcuda via ctypes, PTX kernels): `memory`, `bandwidth`, `p2p` and `burn`.

Each is `f(given) -> list[Result]`, one result per GPU ("gpu N", N the NVML index) or per ordered
pair ("gpu 0->gpu 1"). What each measures, and against which limits, is catalog.TESTS's rows
gpu-memory, gpu-bandwidth, gpu-p2p and gpu-burn. Sizes follow the level (quick: seconds a node;
standard: most of each GPU's memory; extended: more patterns, longer) and stay well inside
given.deadline: a test that sees it would run out stops early and says how much it did.

Outcomes: a measured fault is a `fail` with a repair action; a CUDA error on a GPU (a GPU lost
mid-test, an ECC error, a failed launch) or NVML's GPU_IS_LOST is that GPU's `error`, never a fail,
unless the memory check had already counted bad words on it. No libcuda, an old driver, no GPU or
no PTX compiler raise TestError (cudadriver.open_driver): the whole test is an error.
"""

from __future__ import annotations

import contextlib
import os
import ctypes
import itertools
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from slurm_ext import nvml

from . import ptx
from .catalog import Given
from .cudadriver import CudaError, Device, Driver, nvml_indexes, open_driver
from .records import ERROR, FAIL, PASS, Figure, NotApplicable, Result, TestError, judged

__all__ = ["memory", "bandwidth", "p2p", "burn", "MEMORY_PATTERNS"]

_AREA = "gpu"
_MIB, _GIB = 2**20, 2**30
#: the memory kernels' launch: grid-stride loops, so any grid covers any buffer; 4096 x 256 threads fill an H200
_GRID, _BLOCK = 4096, 256
#: share of given.deadline a test plans to use: the rest is the child's start, the driver's and NVML's
_DEADLINE_SHARE = 0.5

_WALKING = [("walking-ones", s) for s in range(1, 32)] + [("walking-zeros", s) for s in range(1, 32)]
#: (mode, pattern) in the order run; see ptx.MODES. Each level writes every bit of every word both ways (a pattern
#: and its complement), so that a bit stuck at 0 or at 1 is found at any level
MEMORY_PATTERNS: dict[str, list[tuple[str, int]]] = {
    "quick": [("xor-index", 0xA5A5A5A5), ("xor-index", 0x5A5A5A5A), ("address", 0)],
    "standard": [("xor-index", 0x00000000), ("xor-index", 0xFFFFFFFF), ("xor-index", 0xA5A5A5A5),
                 ("xor-index", 0x5A5A5A5A), ("address", 0), ("address", 0xFFFFFFFF), ("walking-ones", 0),
                 ("walking-zeros", 0)],
}
# extended: the standard patterns twice, then every shift of the walking bits
MEMORY_PATTERNS["extended"] = MEMORY_PATTERNS["standard"] * 2 + _WALKING
#: quick tests a slice of each GPU's memory; the other levels all but a margin of what is free
_QUICK_BYTES = 4 * _GIB
#: pinned host<->device copy size (the prototype's 1 GiB at standard), device-to-device size, best of N
_COPY = {"quick": (256 * _MIB, 1 * _GIB, 3), "standard": (1 * _GIB, 4 * _GIB, 5), "extended": (1 * _GIB, 4 * _GIB, 10)}
_P2P = {"quick": (256 * _MIB, 3), "standard": (256 * _MIB, 5), "extended": (1 * _GIB, 10)}
#: burn seconds by level (capped by the deadline)
_BURN_SECONDS = {"quick": 10.0, "standard": 60.0, "extended": 600.0}
_BURN_FLOATS = 1 << 24
#: NVML clocks event reasons that are faults under load: HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40, HW
#: power brake 0x80. The software power cap (0x4) is not: the real H200 sat at its 700 W cap under load, healthy.
_THROTTLE_MASK = 0x8 | 0x20 | 0x40 | 0x80


def _name(index: int) -> str:
    return f"gpu {index}"


@dataclass(frozen=True, slots=True)
class _Gpu:
    index: int
    device: Device

    @property
    def name(self) -> str:
        return _name(self.index)


def _gpus(driver: Driver) -> list[_Gpu]:
    """The driver's GPUs by NVML index."""
    devices = driver.devices()
    if not devices:
        raise TestError("the driver sees no GPU: check nvidia-smi and the kernel log")
    indexes = nvml_indexes(devices)
    return sorted((_Gpu(indexes[d.ordinal], d) for d in devices), key=lambda g: g.index)


@contextlib.contextmanager
def _context(driver: Driver, gpu: _Gpu) -> Iterator[int]:
    """The GPU's primary context, current while the block runs; released after (its memory freed with it)."""
    ctx = driver.retain(gpu.device)
    try:
        yield ctx
    finally:
        with contextlib.suppress(CudaError):
            driver.release(gpu.device)


@contextlib.contextmanager
def _nvml(indexes: list[int]) -> Iterator[tuple[Any, dict[int, Any]]]:
    """NVML and a handle per NVML index, for sampling while the GPUs work."""
    try:
        module = nvml.load()
    except nvml.NvmlUnavailable as err:
        raise TestError(err.problem) from err

    def fail(err: BaseException) -> Exception:
        return TestError(nvml.describe(f"NVML cannot start: {err}", nvml.error_code(err)))

    with nvml.session(module, fail):
        try:
            handles = {i: module.nvmlDeviceGetHandleByIndex(i) for i in indexes}
        except nvml.errors(module) as err:
            raise TestError(nvml.describe("NVML cannot open the GPUs", nvml.error_code(err))) from err
        yield module, handles


def _error(test: str, target: str, err: BaseException, started: float) -> Result:
    text = str(err.on(target)) if isinstance(err, CudaError) else f"{target}: {err}"
    return Result(test, _AREA, target, ERROR, text, (), time.monotonic() - started)


def _align(size: float, unit: int = 2 * _MIB) -> int:
    return max(unit, int(size) // unit * unit)


def _alloc_most(driver: Driver, size: int) -> tuple[int, int]:
    """(pointer, bytes): `size`, or less where the allocator cannot give that much in one piece."""
    for _ in range(6):
        try:
            return driver.alloc(size), size
        except CudaError as err:
            if err.code != 2 or size <= 4 * _MIB:
                raise
            size = _align(size * 7 / 8)
    return driver.alloc(size), size


# -- memory ---------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Bad:
    """What the check kernel counted over the patterns run: bad words, and the first and last bad byte."""

    words: int = 0
    first: int = -1
    last: int = -1
    bits: int = 0

    def add(self, words: int, first: int, last: int, bits: int) -> None:
        if not words:
            return
        # the most bad words any one pattern saw: a bit stuck at 0 is seen only by patterns that write a 1 there
        self.words = max(self.words, words)
        self.first = first if self.first < 0 else min(self.first, first)
        self.last = max(self.last, last)
        self.bits |= bits


def _bad_bytes(driver: Driver, buf: int, mode: int, pattern: int, low: int, high: int) -> tuple[int, int]:
    """The first and last bad byte offsets of a pattern's lowest and highest bad words: each read back (4 bytes)
    and compared on the host with what the pattern wrote there. A word that reads right again (a transient error)
    counts whole."""
    word = ctypes.c_uint32()
    found = []
    for index, pick in ((low, lambda d: (d & -d).bit_length() - 1), (high, lambda d: d.bit_length() - 1)):
        driver.dtoh(ctypes.addressof(word), buf + 4 * index, 4)
        driver.sync()
        diff = word.value ^ ptx.expected(mode, pattern, index, buf + 4 * index)
        found.append(index * 4 + (pick(diff) // 8 if diff else (0 if index == low else 3)))
    return found[0], found[1]


def memory(given: Given) -> list[Result]:
    """Patterns written and checked by PTX kernels over most of each GPU's free memory, one GPU at a time.

    Raises:
        TestError: no libcuda, an old driver, no GPU, no PTX compiler, no NVML.
    """
    driver = open_driver()
    gpus = _gpus(driver)
    patterns = MEMORY_PATTERNS[given.level]
    budget = given.deadline * _DEADLINE_SHARE / len(gpus)
    return [_memory_one(driver, gpu, given, patterns, budget) for gpu in gpus]


def _memory_one(driver: Driver, gpu: _Gpu, given: Given, patterns: list[tuple[str, int]], budget: float) -> Result:
    test, started = "gpu-memory", time.monotonic()
    bad, done, tested, moved, kernel_s = _Bad(), 0, 0, 0, 0.0
    try:
        with _context(driver, gpu):
            module = driver.load_module(ptx.MODULE)
            fill, check = driver.function(module, ptx.FILL), driver.function(module, ptx.CHECK)
            free, _ = driver.mem_info()
            # all but 2 % and 32 MiB (a tenth of a small GPU): the driver's own allocations need some while it runs
            margin = free / 50 + min(32 * _MIB, free / 10)
            want = min(free * 0.9, _QUICK_BYTES) if given.level == "quick" else free - margin
            # the tested buffer first, so that its offsets are the GPU's allocation offsets
            buf, tested = _alloc_most(driver, _align(want))
            result = driver.alloc(ptx.RESULT_WORDS * 8)
            host = (ctypes.c_uint64 * ptx.RESULT_WORDS)()
            words = tested // 4
            for mode_name, pattern in patterns:
                t0 = time.monotonic()
                host[:] = [0, 2**64 - 1, 0, 0]
                driver.htod(result, ctypes.addressof(host), ctypes.sizeof(host))
                mode = ptx.MODES[mode_name]
                driver.launch(fill, _GRID, _BLOCK, [ctypes.c_uint64(buf), ctypes.c_uint64(words),
                                                    ctypes.c_uint32(mode), ctypes.c_uint32(pattern)])
                driver.launch(check, _GRID, _BLOCK, [ctypes.c_uint64(buf), ctypes.c_uint64(words),
                                                     ctypes.c_uint32(mode), ctypes.c_uint32(pattern),
                                                     ctypes.c_uint64(result)])
                driver.dtoh(ctypes.addressof(host), result, ctypes.sizeof(host))
                driver.sync()
                if host[0]:
                    bad.add(host[0], *_bad_bytes(driver, buf, mode, pattern, host[1], host[2]), host[3])
                done += 1
                moved += tested  # bytes checked, as the prototype counted (1 GiB x 4 patterns in 4.1 s)
                kernel_s += time.monotonic() - t0
                if time.monotonic() - started + kernel_s / done > budget:
                    break  # one more pattern would pass this GPU's share of the deadline
    except CudaError as err:
        if not bad.words:
            return _error(test, gpu.name, err, started)
        # measured bad words, then the GPU failed: still a fail, with the error said
        return _memory_result(test, gpu, given, bad, tested, done, len(patterns), moved, kernel_s, started,
                              f"; then {err.on(gpu.name)}")
    return _memory_result(test, gpu, given, bad, tested, done, len(patterns), moved, kernel_s, started, "")


def _memory_result(test: str, gpu: _Gpu, given: Given, bad: _Bad, tested: int, done: int, planned: int,
                   moved: int, kernel_s: float, started: float, after: str) -> Result:
    figures = [Figure("memory_bad_bytes", float(bad.words * 4), "B", given.limits.get("memory_bad_bytes"), False),
               Figure("memory_gibps", moved / _GIB / kernel_s if kernel_s > 0 else 0.0, "GiB/s")]
    size = f"{tested / _GIB:.2f} GiB" if tested >= _GIB else f"{tested // _MIB} MiB"
    scope = f"{size} tested ({done} of {planned} patterns" + (
        ", stopped at its share of the deadline)" if done < planned else ")")
    if bad.words:
        failed = (f"{gpu.name}: {bad.words} bad 32-bit word(s) in bytes 0x{bad.first:x}-0x{bad.last:x} of the {scope} "
                  f"(bits 0x{bad.bits:08x} differ){after}; reset the GPU (row remapping may retire the rows) and "
                  f"test again, replace it if they stay")
        result = judged(test, _AREA, gpu.name, figures, time.monotonic() - started, "reset-gpu", failed=failed)
        if result.outcome == PASS:  # no limit for bad bytes: shown, not judged
            result.message = failed
        return result
    return judged(test, _AREA, gpu.name, figures, time.monotonic() - started, "reset-gpu",
                  passed=f"{gpu.name}: no bad word in {scope}; {figures[1].text()}")


# -- bandwidth ------------------------------------------------------------------------------------------------


class _Sampler(threading.Thread):
    """Calls `read()` every `period` seconds until stopped: NVML readings taken while the GPUs work."""

    def __init__(self, read: Callable[[], Any], period: float):
        super().__init__(daemon=True)
        self.read, self.period = read, period
        self.samples: list[Any] = []
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        while True:
            try:
                self.samples.append(self.read())
            except Exception as err:  # NVML's error: kept for the caller, who knows the GPU
                self.error = err
                return
            if self._halt.wait(self.period):
                return

    def stop(self) -> "_Sampler":
        self._halt.set()
        self.join()
        return self


def _best_gbps(driver: Driver, stream: int, copy: Callable[[], None], counted: int, repeats: int) -> float:
    """GB/s (1e9 bytes) of the fastest of `repeats` timed copies (events on the stream), after one warm-up."""
    start, end = driver.event(), driver.event()
    try:
        copy()
        best = float("inf")
        for _ in range(repeats):
            driver.record(start, stream)
            copy()
            driver.record(end, stream)
            driver.event_sync(end)
            best = min(best, driver.elapsed_ms(start, end))
        return counted / (best / 1e3) / 1e9 if best > 0 else float("nan")
    finally:
        driver.destroy_event(start)
        driver.destroy_event(end)


def bandwidth(given: Given) -> list[Result]:
    """Pinned host-to-device and device-to-host copies, device-to-device copies, and NVML's PCIe link under load.

    Raises:
        TestError: no libcuda, an old driver, no GPU, no NVML.
    """
    driver = open_driver()
    gpus = _gpus(driver)
    with _nvml([g.index for g in gpus]) as (module, handles):
        return [_bandwidth_one(driver, module, handles[gpu.index], gpu, given) for gpu in gpus]


#: words of 64 CPUs asked of nvmlDeviceGetCpuAffinity (4096 CPUs), as gres asks
_AFFINITY_WORDS = 64


@contextlib.contextmanager
def _near(module: Any, handle: Any):
    """This thread on the CPUs near the GPU (NVML's CPU affinity: its socket) while it copies: pinned host memory
    is placed where it is first touched, and on a two-socket HGX board a copy across sockets reads below the
    floor of a healthy GPU. NVML or the kernel refusing leaves the thread where it was (the figure says so)."""
    from slurm_ext.gres.topology import cpus_from_masks
    before = os.sched_getaffinity(0)
    try:
        near = set(cpus_from_masks([int(w) for w in module.nvmlDeviceGetCpuAffinity(handle, _AFFINITY_WORDS)]))
        os.sched_setaffinity(0, (near & before) or before)
    except Exception:  # NVML's error, or the kernel's: an affinity is an optimisation, never the test's failure
        pass
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _bandwidth_one(driver: Driver, module: Any, handle: Any, gpu: _Gpu, given: Given) -> Result:
    test, started = "gpu-bandwidth", time.monotonic()
    copy_bytes, d2d_bytes, repeats = _COPY[given.level]
    limits = given.limits
    link = _Sampler(lambda: (module.nvmlDeviceGetCurrPcieLinkGeneration(handle),
                             module.nvmlDeviceGetCurrPcieLinkWidth(handle)), 0.005)
    host = 0
    try:
        with _context(driver, gpu), _near(module, handle):
            free, _ = driver.mem_info()
            size = _align(min(copy_bytes, free * 0.25))
            stream = driver.stream()
            host = driver.host_alloc(size)
            ctypes.memset(host, 0x5A, size)
            dev = driver.alloc(size)
            link.start()
            h2d = _best_gbps(driver, stream, lambda: driver.htod(dev, host, size, stream), size, repeats)
            link.stop()
            d2h = _best_gbps(driver, stream, lambda: driver.dtoh(host, dev, size, stream), size, repeats)
            driver.free(dev)
            d2d_size = _align(min(d2d_bytes, driver.mem_info()[0] * 0.4))
            src, dst = driver.alloc(d2d_size), driver.alloc(d2d_size)
            # bytes read and written, as the prototype and nvbandwidth count a device-to-device copy
            d2d = _best_gbps(driver, stream, lambda: driver.dtod(dst, src, d2d_size, stream), 2 * d2d_size, repeats)
            driver.destroy_stream(stream)
    except CudaError as err:
        return _error(test, gpu.name, err, started)
    finally:
        if link.is_alive():
            link.stop()
        if host:
            with contextlib.suppress(CudaError):
                driver.free_host(host)
    figures = [Figure("h2d_gbps", h2d, "GB/s", limits.get("h2d_gbps")),
               Figure("d2h_gbps", d2h, "GB/s", limits.get("d2h_gbps")),
               Figure("d2d_gbps", d2d, "GB/s", limits.get("d2d_gbps"))]
    if link.error is not None and nvml.error_code(link.error) == nvml.GPU_IS_LOST:
        return Result(test, _AREA, gpu.name, ERROR, f"{gpu.name}: NVML says the GPU is lost (GPU_IS_LOST) during the "
                      f"copies; see the kernel log (Xid 79), reset the GPU or reboot", tuple(figures),
                      time.monotonic() - started)
    if link.samples:
        # the most the link showed under load: an idle link drops its generation to save power
        figures += [Figure("pcie_gen", float(max(s[0] for s in link.samples)), "", limits.get("pcie_gen")),
                    Figure("pcie_width", float(max(s[1] for s in link.samples)), "lanes", limits.get("pcie_width"))]
    outside = [f.name for f in figures if not f.within]
    # a link that trained below its generation or width is retrained only by a reboot (or a reseat), which a GPU
    # reset does not do; slow copies on a healthy link are the GPU's (its copy engines, its memory): reset it
    action = "reboot" if any(n.startswith("pcie_") for n in outside) else "reset-gpu"
    text = "; ".join(f.text() for f in figures)
    if not link.samples and (limits.get("pcie_gen") or limits.get("pcie_width")):
        # the copies were measured, the link was not: said, so that a pass does not read as the link's too
        text += f"; PCIe link not read ({link.error or 'no sample under the copies'})"
    return judged(test, _AREA, gpu.name, figures, time.monotonic() - started, action,
                  passed=f"{gpu.name}: {text}",
                  failed=f"{gpu.name}: " + "; ".join(f.text() for f in figures if not f.within) +
                  (f" (all: {text})" if len(outside) < len(figures) else ""))


# -- p2p --------------------------------------------------------------------------------------------------------


def p2p(given: Given) -> list[Result]:
    """Peer-to-peer copy bandwidth for each ordered pair of GPUs.

    Raises:
        NotApplicable: one GPU.
        TestError: no libcuda, an old driver, no GPU, no NVML.
    """
    driver = open_driver()
    gpus = _gpus(driver)
    if len(gpus) < 2:
        raise NotApplicable("one GPU: no pair to copy between")
    size_wanted, repeats = _P2P[given.level]
    limit = given.limits.get("p2p_gbps")
    contexts: dict[int, int] = {}
    buffers: dict[int, tuple[int, int]] = {}
    broken: dict[int, CudaError] = {}
    results = []
    try:
        for gpu in gpus:
            try:
                contexts[gpu.index] = driver.retain(gpu.device)
                size = _align(min(size_wanted, driver.mem_info()[0] * 0.3))
                buffers[gpu.index] = (driver.alloc(size), size)
            except CudaError as err:
                broken[gpu.index] = err
        for a, b in itertools.permutations(gpus, 2):
            results.append(_p2p_pair(driver, a, b, contexts, buffers, broken, limit, repeats))
    finally:
        for index in contexts:
            with contextlib.suppress(CudaError):
                driver.release(next(g.device for g in gpus if g.index == index))
    return results


def _p2p_pair(driver: Driver, a: _Gpu, b: _Gpu, contexts: dict, buffers: dict, broken: dict, limit: float | None,
              repeats: int) -> Result:
    test, started, target = "gpu-p2p", time.monotonic(), f"{a.name}->{b.name}"
    for gpu in (a, b):
        if gpu.index in broken:
            return _error(test, target, broken[gpu.index].on(gpu.name), started)
    try:
        if not driver.can_access_peer(a.device, b.device):
            if limit:
                return Result(test, _AREA, target, FAIL, f"{target}: no peer access between them (expected "
                              f"p2p >= {limit:g} GB/s, NVLink): see `nvidia-smi topo -m` and the NVLinks; reset the "
                              f"GPUs", (Figure("p2p_gbps", 0.0, "GB/s", limit),), time.monotonic() - started,
                              "reset-gpu")
            return Result(test, _AREA, target, PASS, f"{target}: no peer access (not measured)", (),
                          time.monotonic() - started)
        driver.set_current(contexts[a.index])
        driver.enable_peer_access(contexts[b.index])
        (src, size_a), (dst, size_b) = buffers[a.index], buffers[b.index]
        size = min(size_a, size_b)
        stream = driver.stream()
        gbps = _best_gbps(driver, stream, lambda: driver.peer(dst, contexts[b.index], src, contexts[a.index], size,
                                                               stream), size, repeats)
        driver.destroy_stream(stream)
    except CudaError as err:
        # the pair's copy failed: which GPU is at fault is not known, so the pair is named
        return _error(test, target, err, started)
    figure = Figure("p2p_gbps", gbps, "GB/s", limit)
    return judged(test, _AREA, target, [figure], time.monotonic() - started, "reset-gpu",
                  passed=f"{target}: {figure.text()}", failed=f"{target}: {figure.text()}")


# -- burn ---------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Burner:
    gpu: _Gpu
    ctx: int = 0
    stream: int = 0
    function: int = 0
    buf: int = 0
    iters: int = 0
    launches: int = 0
    error: BaseException | None = None
    #: events around each batch's launch: its time on the GPU resizes the next (the GPU speeds up under load)
    began: int = 0
    ended: int = 0
    #: NVML's samples under the burn: SM clock MHz, power W, clocks event reasons
    clocks: list[int] = field(default_factory=list)
    powers: list[float] = field(default_factory=list)
    reasons: list[int] = field(default_factory=list)


def burn(given: Given) -> list[Result]:
    """An FMA burn on every GPU at once while NVML's SM clock, power and clocks-event reasons are sampled.

    Raises:
        TestError: no libcuda, an old driver, no GPU, no PTX compiler, no NVML.
    """
    started = time.monotonic()
    driver = open_driver()
    gpus = _gpus(driver)
    seconds = min(_BURN_SECONDS[given.level], given.deadline * 0.4)
    burners = [_Burner(g) for g in gpus]
    with _nvml([g.index for g in gpus]) as (module, handles):
        try:
            for b in burners:
                _burn_setup(driver, b, seconds)
            _burn_run(driver, module, handles, burners, seconds)
        finally:
            for b in burners:
                if b.ctx:
                    with contextlib.suppress(CudaError):
                        driver.release(b.gpu.device)
    return [_burn_result(b, given, started) for b in burners]


def _burn_setup(driver: Driver, b: _Burner, seconds: float) -> None:
    """Context, buffer and kernel; the iterations per launch from a timed calibration launch (a launch takes about
    a quarter of a second, or less in a short burn, so that the sampling loop keeps up)."""
    try:
        b.ctx = driver.retain(b.gpu.device)
        b.stream = driver.stream()
        b.buf = driver.alloc(_BURN_FLOATS * 4)
        driver.memset32(b.buf, 0x3F800000, _BURN_FLOATS)  # 1.0f
        b.function = driver.function(driver.load_module(ptx.MODULE), ptx.BURN)
        b.began, b.ended = driver.event(), driver.event()
        calibration = 256
        _burn_launch(driver, b, calibration)  # a warm-up: the first launch also pays for the clocks' ramp
        driver.record(b.began, b.stream)
        _burn_launch(driver, b, calibration)
        driver.record(b.ended, b.stream)
        driver.event_sync(b.ended)
        b.iters = _resized(calibration, driver.elapsed_ms(b.began, b.ended) / 1e3, _burn_window(seconds))
    except CudaError as err:
        b.error = err


def _burn_window(seconds: float) -> float:
    """How long one launch should keep a GPU busy: a quarter of a second, shorter in a short burn."""
    return min(0.25, seconds / 8)


def _resized(iters: int, took: float, window: float) -> int:
    """The iterations that fill `window`, from `iters` that took `took` seconds on the GPU (a tenth more: a launch
    that ends early leaves the GPU idle while NVML samples it, and an idle GPU's clocks fail a healthy one)."""
    per_iter = max(took, 1e-6) / iters
    return max(16, min(2**31 - 1, int(window * 1.1 / per_iter)))


def _burn_launch(driver: Driver, b: _Burner, iters: int) -> None:
    driver.set_current(b.ctx)
    driver.launch(b.function, _BURN_FLOATS // _BLOCK, _BLOCK,
                  [ctypes.c_uint64(b.buf), ctypes.c_uint32(_BURN_FLOATS), ctypes.c_uint32(iters)], b.stream)


def _burn_run(driver: Driver, module: Any, handles: dict, burners: list[_Burner], seconds: float) -> None:
    """Launch on every GPU, sample NVML every 0.1 s while the launches run, wait for them; until `seconds` pass."""
    caught = nvml.errors(module)
    # nvmlDeviceGetCurrentClocksEventReasons is the newer pynvml's name of the throttle reasons
    reasons = getattr(module, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        module.nvmlDeviceGetCurrentClocksThrottleReasons
    end = time.monotonic() + seconds
    window = _burn_window(seconds)
    while time.monotonic() < end and any(b.error is None for b in burners):
        for b in burners:
            if b.error is None:
                try:
                    driver.set_current(b.ctx)
                    driver.record(b.began, b.stream)
                    _burn_launch(driver, b, b.iters)
                    driver.record(b.ended, b.stream)
                    b.launches += 1
                except CudaError as err:
                    b.error = err
        batch_end = min(end, time.monotonic() + window)
        while True:
            for b in burners:
                if b.error is not None:
                    continue
                h = handles[b.gpu.index]
                try:
                    b.clocks.append(module.nvmlDeviceGetClockInfo(h, module.NVML_CLOCK_SM))
                    b.powers.append(module.nvmlDeviceGetPowerUsage(h) / 1000.0)
                    b.reasons.append(reasons(h))
                except caught as err:
                    if nvml.error_code(err) == nvml.GPU_IS_LOST:
                        b.error = TestError("NVML says the GPU is lost (GPU_IS_LOST) under the burn; see the kernel "
                                            "log (Xid 79), reset the GPU or reboot")
            if time.monotonic() >= batch_end:
                break
            time.sleep(min(0.1, max(0.0, batch_end - time.monotonic())))
        for b in burners:
            if b.error is None:
                try:
                    driver.set_current(b.ctx)
                    driver.sync(b.stream)
                    b.iters = _resized(b.iters, driver.elapsed_ms(b.began, b.ended) / 1e3, window)
                except CudaError as err:
                    b.error = err


def _burn_result(b: _Burner, given: Given, started: float) -> Result:
    test, seconds = "gpu-burn", time.monotonic() - started
    if b.error is not None:
        return _error(test, b.gpu.name, b.error, started)
    if not b.clocks:
        return Result(test, _AREA, b.gpu.name, ERROR, f"{b.gpu.name}: NVML gave no clock reading under the burn",
                      (), seconds)
    throttled = sum(1 for r in b.reasons if r & _THROTTLE_MASK) / len(b.reasons)
    figures = [Figure("burn_sm_clock_mhz", float(statistics.median(b.clocks)), "MHz",
                      given.limits.get("burn_sm_clock_mhz")),
               Figure("burn_throttled_share", throttled, "", given.limits.get("burn_throttled_share"), False),
               Figure("burn_power_w", float(statistics.median(b.powers)), "W"),
               Figure("burn_samples", float(len(b.clocks)))]
    seen = 0
    for r in b.reasons:
        seen |= r
    why = f" (clocks event reasons seen: 0x{seen:x})" if seen & _THROTTLE_MASK else ""
    # a clock that does not hold or a hardware slowdown under load: reset first (a stuck clock state, a power brake
    # latched); the repair flow escalates when the verify after the reset fails again (cooling, power delivery)
    return judged(test, _AREA, b.gpu.name, figures, seconds, "reset-gpu",
                  passed=f"{b.gpu.name}: " + "; ".join(f.text() for f in figures[:3]),
                  failed=f"{b.gpu.name}: " + "; ".join(f.text() for f in figures[:2] if not f.within) + why)
