"""The single-node NCCL all-reduce (`allreduce`): NVIDIA's NCCL wheel through ctypes, on the driver API's buffers.

What it proves: the node's GPUs reduce together at the bus bandwidth their NVLinks and NVSwitches
should give, and the sum is right. AzNHC gates HGX nodes the same way (all_reduce_perf's busbw against
a per-SKU floor); this runs without MPI, nccl-tests or a CUDA toolkit: `libnccl.so.2` of the
nvidia-nccl-cu12 / nvidia-nccl-cu13 wheel (site-packages/nvidia/nccl/lib/, the same place for both),
`ncclCommInitAll` over every GPU from one process, and libcuda (acceptance.cudadriver) for contexts,
buffers, streams and events. NCCL links the CUDA runtime statically, which uses the same primary
contexts as cudadriver, so buffers and streams made there are NCCL's to use.

The library is found in the running Python's site-packages and sys.path, or where
$SLURM_EXT_NCCL_LIBRARY names it (the tests name the fake one: devcluster/fakenvml/fakenccl.c);
nothing is downloaded. No wheel, or one GPU: not applicable. An NCCL error is the test's `error`
with NCCL's own words (ncclGetErrorString, and ncclGetLastError's detail), never a fail: nothing was
measured. A slow or wrong all-reduce is a `fail` whose action is `reboot` (see `_ACTION`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import site
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .catalog import Given
from .cudadriver import CudaError, Device, Driver, nvml_indexes, open_driver
from .records import ERROR, FAIL, Figure, NotApplicable, Result, TestError, judged

__all__ = ["allreduce", "find_library", "NcclError", "LIBRARY_ENV", "PROFILE_GPUS"]

TEST, _AREA = "gpu-nccl", "gpu"
#: names the libnccl.so.2 to load, over the wheel's (a path; the tests name the fake's)
LIBRARY_ENV = "SLURM_EXT_NCCL_LIBRARY"
#: where nvidia-nccl-cu12 and nvidia-nccl-cu13 both put it under site-packages (cu13 keeps NCCL out of the
#: nvidia/cu13/lib of the other CUDA 13 wheels: rapidsai/cuml#7304)
_WHEEL_PATH = ("nvidia", "nccl", "lib", "libnccl.so.2")
_MIB, _GIB = 2**20, 2**30
#: the message size per GPU by level (out of place: twice that is allocated), capped by free memory. The profiles'
#: floors are AzNHC's, measured with one 16 GiB message; a 1 GiB one keeps standard short and reads somewhat lower
#: on a healthy HGX node (not measured here: a real 8-GPU run should confirm the floor holds at 1 GiB)
_BYTES = {"standard": 1 * _GIB, "extended": 8 * _GIB}
#: (warm-up, timed) iterations: nccl-tests' defaults (-w 5 -n 20) at standard, more at extended
_ITERATIONS = {"standard": (5, 20), "extended": (5, 100)}
#: share of given.deadline the test plans to use: the rest is the child's start, the driver's and NCCL's init
_DEADLINE_SHARE = 0.5
#: the profiles' nccl_busbw_gbps are 8-GPU figures (AzNHC's ND H100/H200 v5 configs: 8 GPUs, one node). NCCL
#: picks other algorithms and channel counts for fewer GPUs and nobody publishes those figures, so with another
#: count the profile's value is shown, not judged; an operator's own [acceptance.tests.gpu-nccl] limit is judged
#: whatever the count (they set it for their nodes)
PROFILE_GPUS = 8
#: bytes read back from the start, the middle and the end of each GPU's result to check the sum
_SAMPLE = 1 * _MIB
#: an all-reduce slow or wrong on one node is the NVLinks or the NVSwitches (a link down or trained slow, a switch
#: or the fabric manager degraded): on HGX boards a GPU reset must reset every GPU and switch together, and the
#: fabric manager restarts with the node, so a reboot is the least repair; the repair flow escalates (reprovision,
#: remove) when the verify after it fails again
_ACTION = "reboot"

NCCL_FLOAT32, NCCL_SUM = 7, 0

#: what an operator does about each ncclResult_t
_MEANING = {
    1: "a CUDA call inside NCCL failed: run gpu-memory and gpu-p2p, and see the kernel log for an Xid",
    2: "a system call inside NCCL failed (in a container: /dev/shm too small, or no IPC): see NCCL_DEBUG=INFO",
    3: "an NCCL internal error: run again with NCCL_DEBUG=INFO and report it to NVIDIA",
    4: "an invalid argument: a slurm-ext bug, please report it",
    5: "invalid usage: a slurm-ext bug or a GPU listed twice, please report it",
    6: "a peer failed or the network broke",
}


class NcclError(TestError):
    """An NCCL call failed: `call`, NCCL's `code` and its words (`text`), and ncclGetLastError's `detail`."""

    def __init__(self, call: str, code: int, text: str = "", detail: str = ""):
        self.call, self.code, self.text, self.detail = call, code, text, detail
        meaning = _MEANING.get(code)
        super().__init__(f"{call} failed: {text or 'NCCL error'} ({code}){': ' + detail if detail else ''}"
                         f"{'; ' + meaning if meaning else ''}")


def _site_dirs() -> list[str]:
    """Where a wheel of the running Python may be: its sys.path, then site's own list."""
    dirs = list(sys.path)
    with contextlib.suppress(AttributeError):  # site.getsitepackages is missing in some virtualenvs of old
        dirs += site.getsitepackages()
    return [d for d in dict.fromkeys(dirs) if d]


def find_library() -> str | None:
    """The libnccl.so.2 to load: $SLURM_EXT_NCCL_LIBRARY, else the NCCL wheel's in site-packages; None: none.

    Raises:
        TestError: $SLURM_EXT_NCCL_LIBRARY names a file that is not there.
    """
    named = os.environ.get(LIBRARY_ENV, "")
    if named:
        if not Path(named).is_file():
            raise TestError(f"${LIBRARY_ENV} names {named}, which is not a file: point it at a libnccl.so.2 "
                            f"or unset it")
        return named
    for root in _site_dirs():
        candidate = Path(root, *_WHEEL_PATH)
        if candidate.is_file():
            return str(candidate)
    return None


_c_void_p = ctypes.c_void_p
# name -> (argtypes, restype); ncclResult_t is an int
_SIGNATURES: dict[str, tuple[tuple, object]] = {
    "ncclGetVersion": ((ctypes.POINTER(ctypes.c_int),), ctypes.c_int),
    "ncclCommInitAll": ((ctypes.POINTER(_c_void_p), ctypes.c_int, ctypes.POINTER(ctypes.c_int)), ctypes.c_int),
    "ncclCommDestroy": ((_c_void_p,), ctypes.c_int),
    "ncclGroupStart": ((), ctypes.c_int),
    "ncclGroupEnd": ((), ctypes.c_int),
    "ncclAllReduce": ((_c_void_p, _c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _c_void_p, _c_void_p),
                      ctypes.c_int),
    "ncclGetErrorString": ((ctypes.c_int,), ctypes.c_char_p),
}


class _Nccl:
    """NCCL's calls as methods; each raises NcclError on failure."""

    def __init__(self, path: str):
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as err:
            raise TestError(f"cannot load {path} ({err}): reinstall NVIDIA's NCCL wheel (pip install "
                            f"nvidia-nccl-cu12)") from err
        missing = []
        for name, (argtypes, restype) in _SIGNATURES.items():
            try:
                fn = getattr(self._lib, name)
            except AttributeError:
                missing.append(name)
                continue
            fn.argtypes, fn.restype = argtypes, restype
        if missing:
            raise TestError(f"{path} lacks {', '.join(missing)}: not an NCCL 2 library")
        # NCCL 2.13 and later: the last error's detail, which says what failed where
        self._last = getattr(self._lib, "ncclGetLastError", None)
        if self._last is not None:
            self._last.argtypes, self._last.restype = (_c_void_p,), ctypes.c_char_p

    def _call(self, name: str, *args) -> None:
        code = getattr(self._lib, name)(*args)
        if code != 0:
            raise self.error(name, code)

    def error(self, call: str, code: int) -> NcclError:
        text = (self._lib.ncclGetErrorString(code) or b"").decode(errors="replace")
        detail = ""
        if self._last is not None:
            detail = (self._last(None) or b"").decode(errors="replace").strip()
        return NcclError(call, code, text, detail)

    def version(self) -> str:
        """"2.27.3": NCCL_VERSION_CODE decoded (X*10000+Y*100+Z since 2.9, X*1000+Y*100+Z before)."""
        code = ctypes.c_int()
        self._call("ncclGetVersion", ctypes.byref(code))
        v = code.value
        if v >= 10000:
            return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
        return f"{v // 1000}.{v // 100 % 10}.{v % 100}"

    def init_all(self, ordinals: list[int]) -> list[int]:
        comms = (_c_void_p * len(ordinals))()
        devlist = (ctypes.c_int * len(ordinals))(*ordinals)
        self._call("ncclCommInitAll", comms, len(ordinals), devlist)
        return [c or 0 for c in comms]

    def destroy(self, comm: int) -> None:
        self._call("ncclCommDestroy", _c_void_p(comm))

    def all_reduce(self, ranks: list["_Rank"], count: int) -> None:
        """One float sum over every rank's send buffer into its receive buffer, on its stream: one group call.
        The group is closed even when a rank's call failed (NCCL requires it); the first failure is raised."""
        self._call("ncclGroupStart")
        try:
            for r in ranks:
                self._call("ncclAllReduce", _c_void_p(r.send), _c_void_p(r.recv), count, NCCL_FLOAT32, NCCL_SUM,
                           _c_void_p(r.comm), _c_void_p(r.stream))
        finally:
            code = self._lib.ncclGroupEnd()
        if code != 0:
            raise self.error("ncclGroupEnd", code)


@dataclass(slots=True)
class _Rank:
    """One GPU's part: its NVML index, CUDA device, primary context, communicator, stream, events and buffers."""

    index: int
    device: Device
    ctx: int = 0
    comm: int = 0
    stream: int = 0
    start: int = 0
    end: int = 0
    send: int = 0
    recv: int = 0

    @property
    def name(self) -> str:
        return f"gpu {self.index}"


def _gpu_list(ranks: list[_Rank]) -> str:
    indexes = sorted(r.index for r in ranks)
    if indexes == list(range(indexes[0], indexes[-1] + 1)) and len(indexes) > 2:
        return f"gpu {indexes[0]}-{indexes[-1]}"
    return ", ".join(f"gpu {i}" for i in indexes)


def _size_text(size: int) -> str:
    return f"{size / _GIB:.3g} GiB" if size >= _GIB else f"{size / _MIB:.3g} MiB"


def allreduce(given: Given) -> list[Result]:
    """An all-reduce of floats over every GPU of the node: its bus bandwidth against nccl_busbw_gbps, its sum checked.

    One result for the node (target ""). Sized by level (standard 1 GiB a GPU, extended 8 GiB, both capped by
    free memory), timed with events on each GPU's stream after a warm-up, and kept inside given.deadline.

    Raises:
        NotApplicable: no NCCL wheel, or one GPU.
        TestError: no libcuda, an old driver, no GPU, no NVML, a library that is not NCCL.
    """
    started = time.monotonic()
    path = find_library()
    if path is None:
        raise NotApplicable("NVIDIA's NCCL wheel is not installed (pip install nvidia-nccl-cu12)")
    driver = open_driver()
    devices = driver.devices()
    if not devices:
        raise TestError("the driver sees no GPU: check nvidia-smi and the kernel log")
    if len(devices) < 2:
        raise NotApplicable("one GPU: nothing to all-reduce with")
    indexes = nvml_indexes(devices)
    nccl = _Nccl(path)
    version = nccl.version()
    # in CUDA's order (NCCL takes CUDA ordinals); results name the GPUs by NVML index
    ranks = [_Rank(indexes[d.ordinal], d) for d in devices]
    try:
        return [_run(driver, nccl, version, ranks, given, started)]
    except NcclError as err:
        return [Result(TEST, _AREA, "", ERROR, f"NCCL {version}, {_gpu_list(ranks)}: {err}", (),
                       time.monotonic() - started)]


def _run(driver: Driver, nccl: _Nccl, version: str, ranks: list[_Rank], given: Given, started: float) -> Result:
    """Contexts, communicators and buffers; warm-up; timed all-reduces; the check; everything freed after."""
    current: _Rank | None = None
    try:
        for current in ranks:
            current.ctx = driver.retain(current.device)
            current.stream = driver.stream()
            current.start, current.end = driver.event(), driver.event()
        current = None
        for rank, comm in zip(ranks, nccl.init_all([r.device.ordinal for r in ranks])):
            rank.comm = comm
        # NCCL's own buffers are taken at init: size by what is left on the GPU with the least
        free = []
        for current in ranks:
            driver.set_current(current.ctx)
            free.append(driver.mem_info()[0])
        current = None
        size = _message_bytes(given.level, min(free))
        count = size // 4
        for current in ranks:
            driver.set_current(current.ctx)
            current.send, current.recv = driver.alloc(size), driver.alloc(size)
            driver.memset32(current.send, 0x3F800000, count)  # 1.0f
            driver.memset32(current.recv, 0, count)
            driver.sync()
        current = None
        warmup, planned = _ITERATIONS.get(given.level, _ITERATIONS["standard"])
        t0 = time.monotonic()
        for _ in range(warmup):
            nccl.all_reduce(ranks, count)
        _sync(driver, ranks)
        per_round = (time.monotonic() - t0) / warmup
        left = given.deadline * _DEADLINE_SHARE - (time.monotonic() - started)
        iterations = max(1, min(planned, int(left / per_round) if per_round > 0 else planned))
        for r in ranks:
            driver.set_current(r.ctx)
            driver.record(r.start, r.stream)
        for _ in range(iterations):
            nccl.all_reduce(ranks, count)
        for r in ranks:
            driver.set_current(r.ctx)
            driver.record(r.end, r.stream)
        for current in ranks:
            driver.set_current(current.ctx)
            driver.event_sync(current.end)
        current = None
        # the slowest GPU's time: the all-reduce is done when the last rank is
        ms = max(driver.elapsed_ms(r.start, r.end) for r in ranks)
        wrong = []
        for current in ranks:
            found = _check(driver, current, size, float(len(ranks)))
            if found:
                wrong.append((current.index, found))
        current = None
    except CudaError as err:
        where = err.on(current.name) if current is not None else err
        return Result(TEST, _AREA, "", ERROR, f"NCCL {version}, {_gpu_list(ranks)}: {where}", (),
                      time.monotonic() - started)
    finally:
        _release(driver, nccl, ranks)
    return _result(given, version, ranks, size, iterations, ms, wrong, started)


def _message_bytes(level: str, free: int) -> int:
    """The level's message size, or less: two buffers of it within 90 % of `free`, less 512 MiB (a tenth of a
    small GPU) for the driver's and NCCL's own use; whole MiB.

    Raises:
        TestError: not even 1 MiB a buffer fits.
    """
    usable = free * 0.9 - min(512 * _MIB, free / 10)
    size = int(min(_BYTES.get(level, _BYTES["standard"]), usable / 2)) // _MIB * _MIB
    if size < _MIB:
        raise TestError(f"only {free // _MIB} MiB of GPU memory free after NCCL's init: run the test on an idle node")
    return size


def _sync(driver: Driver, ranks: list[_Rank]) -> None:
    for r in ranks:
        driver.set_current(r.ctx)
        driver.sync(r.stream)


def _check(driver: Driver, rank: _Rank, size: int, expected: float) -> str:
    """'' when the start, middle and end of the rank's result read `expected` (the sum of n ones), else what is
    wrong there: the first bad element, its value and how many of those read were bad."""
    driver.set_current(rank.ctx)
    spans = sorted({0, max(0, (size // 2 - _SAMPLE // 2) // 4 * 4), max(0, size - _SAMPLE)})
    want = struct.pack("<f", expected)
    read = bad = 0
    first: tuple[int, float] | None = None
    for offset in spans:
        length = min(_SAMPLE, size - offset)
        host = ctypes.create_string_buffer(length)
        driver.dtoh(ctypes.addressof(host), rank.recv + offset, length)
        driver.sync()
        data = host.raw
        read += length // 4
        if data == want * (length // 4):
            continue
        for k, value in enumerate(memoryview(data).cast("f")):
            if value != expected:
                bad += 1
                if first is None:
                    first = ((offset // 4) + k, value)
    if first is None:
        return ""
    return (f"{rank.name}: element {first[0]} reads {first[1]:g}, expected {expected:g} (1.0 from each GPU); "
            f"{bad} of the {read} elements read are wrong")


def _release(driver: Driver, nccl: _Nccl, ranks: list[_Rank]) -> None:
    """Communicators first (they use the contexts), then each GPU's buffers, events, stream and context."""
    for r in ranks:
        if r.comm:
            with contextlib.suppress(NcclError):
                nccl.destroy(r.comm)
    for r in ranks:
        if not r.ctx:
            continue
        with contextlib.suppress(CudaError):
            driver.set_current(r.ctx)
            for ptr in (r.send, r.recv):
                if ptr:
                    driver.free(ptr)
            for event in (r.start, r.end):
                if event:
                    driver.destroy_event(event)
            if r.stream:
                driver.destroy_stream(r.stream)
        with contextlib.suppress(CudaError):
            driver.release(r.device)


def _overridden(given: Given) -> bool:
    """True where [acceptance.tests.gpu-nccl] limits sets nccl_busbw_gbps itself (not the profile)."""
    own = (getattr(given.settings, "tests", None) or {}).get(TEST)
    return bool(own is not None and own.limits and "nccl_busbw_gbps" in own.limits)


def _result(given: Given, version: str, ranks: list[_Rank], size: int, iterations: int, ms: float,
            wrong: list[tuple[int, str]], started: float) -> Result:
    n = len(ranks)
    seconds = ms / 1e3 / iterations
    algbw = size / seconds / 1e9 if seconds > 0 else float("nan")
    # nccl-tests' doc/PERFORMANCE.md: an all-reduce's bus bandwidth is algbw x 2(n-1)/n, comparable across counts
    busbw = algbw * 2 * (n - 1) / n
    limit = given.limits.get("nccl_busbw_gbps")
    unjudged = ""
    if limit is not None and n != PROFILE_GPUS and not _overridden(given):
        unjudged = (f"; not judged: the {given.profile} profile's {limit:g} GB/s is for {PROFILE_GPUS} GPUs and this "
                    f"node has {n} (set [acceptance.tests.{TEST}] limits = {{ nccl_busbw_gbps = ... }} for it)")
        limit = None
    figures = [Figure("nccl_busbw_gbps", busbw, "GB/s", limit), Figure("nccl_algbw_gbps", algbw, "GB/s")]
    what = f"NCCL {version}, {n} GPUs ({_gpu_list(ranks)}), a {_size_text(size)} all-reduce x {iterations}"
    elapsed = time.monotonic() - started
    if wrong:
        found = "; ".join(text for _, text in sorted(wrong))
        return Result(TEST, _AREA, "", FAIL, f"{what}: the sum is wrong: {found}"
                      f" (busbw {busbw:.4g} GB/s): data corrupted over NVLink/NVSwitch or in a GPU; reboot (resets "
                      f"the NVSwitches and the fabric manager), run gpu-memory, and replace the GPU or board if it "
                      f"stays", tuple(figures), elapsed, _ACTION)
    return judged(TEST, _AREA, "", figures, elapsed, _ACTION,
                  passed=f"{what}: {figures[0].text()}, {figures[1].text()}; the sum is right on every GPU{unjudged}",
                  failed=f"{what}: {figures[0].text()}, too slow for all of them together: an NVLink down or trained "
                         f"slow, or an NVSwitch or the fabric manager degraded; see `nvidia-smi nvlink -s` and "
                         f"`nvidia-smi -q` (Fabric), reboot (resets the NVSwitches and retrains the links)")
