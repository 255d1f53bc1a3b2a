"""The NVIDIA driver API through ctypes: the few calls the GPU acceptance tests make, with nothing but the driver.

`libcuda.so.1` ships with the driver, so a node needs no CUDA toolkit and no compiler: kernels are PTX
text (slurm_ext.acceptance.ptx) that the driver compiles when they are loaded. `open_driver()` loads the
library, initialises it and checks its version; `Driver` wraps each call so that a failure raises
`CudaError` naming the call, CUDA's error name and number and what it means for an operator.

Why could-not-run and broken are kept apart here: no libcuda.so.1, a driver older than `MIN_VERSION`,
no device and no PTX compiler are `records.TestError` (the test could not run); a CUDA error on one GPU
(`CudaError`, also a TestError) is that GPU's error result, decided by the test, never a fail.

GPUs are named by their NVML index ("gpu N", as the rest of slurm-ext names them): CUDA's ordinal is
the driver's own order, so `Driver.devices()` gives each device's PCI bus id and `nvml_indexes()` maps
bus ids to NVML indexes.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from .records import TestError

__all__ = ["CudaError", "Device", "Driver", "open_driver", "bus_key", "nvml_indexes", "MIN_VERSION", "LIBRARY"]

LIBRARY = "libcuda.so.1"
#: CUDA 12.0, what driver 525 offers: the oldest driver these tests are written for
MIN_VERSION = 12000

CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221
CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704
CU_MEMHOSTALLOC_PORTABLE = 0x1

#: what an operator does about each code (the GPU itself in trouble: 214, 700, 719, 999)
_MEANING = {
    1: "an invalid argument: a slurm-ext bug, please report it",
    2: "the GPU's memory is held by another process: run the test on an idle node",
    3: "the driver was not initialised: a slurm-ext bug, please report it",
    34: "the libcuda.so.1 found is the CUDA toolkit's stub, not the driver's: fix the library path",
    35: "the driver is older than this CUDA: upgrade the NVIDIA driver",
    46: "the GPU is busy or unavailable (exclusive-process mode, or another process): run it on an idle node",
    100: "the driver sees no GPU: check nvidia-smi and the kernel log",
    101: "an invalid device: the GPU list changed while the test ran",
    214: "an uncorrectable ECC error: drain the node and reset the GPU (row remapping), then test again",
    217: "peer access is not supported between these GPUs",
    218: "the driver could not compile the test's PTX: upgrade the driver, or report it",
    221: "the driver's PTX compiler (libnvidia-ptxjitcompiler.so.1) is missing: reinstall the NVIDIA driver",
    222: "the driver is too old for the test's PTX: upgrade the NVIDIA driver",
    700: "a kernel read or wrote an illegal address: reset the GPU, and report it if it repeats",
    719: "a kernel failed on the GPU: drain the node and reset the GPU; see the kernel log for an Xid",
    999: "the GPU may have fallen off the bus (Xid 79): see the kernel log; reset the GPU or reboot",
}


class CudaError(TestError):
    """A driver API call failed: `call`, CUDA's `code` and `name`, the driver's `text` and what it means."""

    def __init__(self, call: str, code: int, name: str = "", text: str = "", gpu: str = ""):
        self.call, self.code, self.name, self.text, self.gpu = call, code, name or f"CUDA error {code}", text, gpu
        meaning = _MEANING.get(code)
        where = f"{gpu}: " if gpu else ""
        super().__init__(f"{where}{call} failed: {self.name} ({code}){': ' + text if text else ''}"
                         f"{'; ' + meaning if meaning else ''}")

    def on(self, gpu: str) -> "CudaError":
        """The same error, said of `gpu` ("gpu 3")."""
        return CudaError(self.call, self.code, self.name, self.text, gpu)


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU as the driver sees it."""

    #: CUDA's ordinal (not NVML's index)
    ordinal: int
    handle: int
    name: str
    #: as cuDeviceGetPCIBusId gives it ("0000:18:00.0")
    pci_bus_id: str
    total_bytes: int


def bus_key(bus_id: str) -> tuple[int, int, int]:
    """(domain, bus, device) of a PCI bus id in CUDA's "0000:18:00.0" or NVML's "00000000:18:00.0" form."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3 or "." not in parts[2]:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    return int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16)


_c_int_p = ctypes.POINTER(ctypes.c_int)
_c_ull = ctypes.c_ulonglong
_c_void_pp = ctypes.POINTER(ctypes.c_void_p)

# name -> argtypes: every call returns CUresult (int)
_SIGNATURES: dict[str, tuple] = {
    "cuInit": (ctypes.c_uint,),
    "cuDriverGetVersion": (_c_int_p,),
    "cuDeviceGetCount": (_c_int_p,),
    "cuDeviceGet": (_c_int_p, ctypes.c_int),
    "cuDeviceGetName": (ctypes.c_char_p, ctypes.c_int, ctypes.c_int),
    "cuDeviceGetPCIBusId": (ctypes.c_char_p, ctypes.c_int, ctypes.c_int),
    "cuDeviceTotalMem_v2": (ctypes.POINTER(ctypes.c_size_t), ctypes.c_int),
    "cuDeviceCanAccessPeer": (_c_int_p, ctypes.c_int, ctypes.c_int),
    "cuDevicePrimaryCtxRetain": (_c_void_pp, ctypes.c_int),
    "cuDevicePrimaryCtxRelease_v2": (ctypes.c_int,),
    "cuCtxSetCurrent": (ctypes.c_void_p,),
    "cuCtxEnablePeerAccess": (ctypes.c_void_p, ctypes.c_uint),
    "cuMemGetInfo_v2": (ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)),
    "cuMemAlloc_v2": (ctypes.POINTER(_c_ull), ctypes.c_size_t),
    "cuMemFree_v2": (_c_ull,),
    "cuMemHostAlloc": (_c_void_pp, ctypes.c_size_t, ctypes.c_uint),
    "cuMemFreeHost": (ctypes.c_void_p,),
    "cuMemsetD32_v2": (_c_ull, ctypes.c_uint, ctypes.c_size_t),
    "cuMemcpyHtoDAsync_v2": (_c_ull, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p),
    "cuMemcpyDtoHAsync_v2": (ctypes.c_void_p, _c_ull, ctypes.c_size_t, ctypes.c_void_p),
    "cuMemcpyDtoDAsync_v2": (_c_ull, _c_ull, ctypes.c_size_t, ctypes.c_void_p),
    "cuMemcpyPeerAsync": (_c_ull, ctypes.c_void_p, _c_ull, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p),
    "cuStreamCreate": (_c_void_pp, ctypes.c_uint),
    "cuStreamDestroy_v2": (ctypes.c_void_p,),
    "cuStreamSynchronize": (ctypes.c_void_p,),
    "cuEventCreate": (_c_void_pp, ctypes.c_uint),
    "cuEventDestroy_v2": (ctypes.c_void_p,),
    "cuEventRecord": (ctypes.c_void_p, ctypes.c_void_p),
    "cuEventSynchronize": (ctypes.c_void_p,),
    "cuEventElapsedTime": (ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p),
    "cuModuleLoadData": (_c_void_pp, ctypes.c_char_p),
    "cuModuleUnload": (ctypes.c_void_p,),
    "cuModuleGetFunction": (_c_void_pp, ctypes.c_void_p, ctypes.c_char_p),
    "cuLaunchKernel": (ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                       ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, _c_void_pp, _c_void_pp),
    "cuGetErrorName": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
    "cuGetErrorString": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
}


class Driver:
    """libcuda's calls as methods; each raises CudaError on failure. Not thread-safe: one thread drives it."""

    def __init__(self, lib: ctypes.CDLL):
        self._lib = lib
        missing = []
        for name, argtypes in _SIGNATURES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                missing.append(name)
                continue
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
        if missing:
            raise TestError(f"{LIBRARY} lacks {', '.join(missing)}: the NVIDIA driver is too old for the GPU tests "
                            f"(driver 525 or later is needed)")

    # -- errors ----------------------------------------------------------------------------------------------

    def _describe(self, code: int) -> tuple[str, str]:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        if self._lib.cuGetErrorName(code, ctypes.byref(name)) != 0 or not name.value:
            return "", ""
        if self._lib.cuGetErrorString(code, ctypes.byref(text)) != 0 or not text.value:
            return name.value.decode(errors="replace"), ""
        return name.value.decode(errors="replace"), text.value.decode(errors="replace")

    def error(self, call: str, code: int) -> CudaError:
        return CudaError(call, code, *self._describe(code))

    def _call(self, name: str, *args) -> None:
        code = getattr(self._lib, name)(*args)
        if code != 0:
            raise self.error(name, code)

    # -- library and devices -----------------------------------------------------------------------------------

    def init(self) -> None:
        self._call("cuInit", 0)

    def version(self) -> int:
        value = ctypes.c_int()
        self._call("cuDriverGetVersion", ctypes.byref(value))
        return value.value

    def devices(self) -> list[Device]:
        count = ctypes.c_int()
        self._call("cuDeviceGetCount", ctypes.byref(count))
        found = []
        for ordinal in range(count.value):
            handle, total = ctypes.c_int(), ctypes.c_size_t()
            name, bus = ctypes.create_string_buffer(256), ctypes.create_string_buffer(64)
            self._call("cuDeviceGet", ctypes.byref(handle), ordinal)
            self._call("cuDeviceGetName", name, len(name), handle.value)
            self._call("cuDeviceGetPCIBusId", bus, len(bus), handle.value)
            self._call("cuDeviceTotalMem_v2", ctypes.byref(total), handle.value)
            found.append(Device(ordinal, handle.value, name.value.decode(errors="replace"),
                                bus.value.decode(errors="replace"), total.value))
        return found

    def can_access_peer(self, device: Device, peer: Device) -> bool:
        can = ctypes.c_int()
        self._call("cuDeviceCanAccessPeer", ctypes.byref(can), device.handle, peer.handle)
        return bool(can.value)

    # -- contexts ------------------------------------------------------------------------------------------------

    def retain(self, device: Device) -> int:
        """The device's primary context, made current."""
        ctx = ctypes.c_void_p()
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), device.handle)
        self._call("cuCtxSetCurrent", ctx)
        return ctx.value

    def release(self, device: Device) -> None:
        self._call("cuDevicePrimaryCtxRelease_v2", device.handle)

    def set_current(self, ctx: int) -> None:
        self._call("cuCtxSetCurrent", ctypes.c_void_p(ctx))

    def enable_peer_access(self, peer_ctx: int) -> None:
        """Let the current context reach `peer_ctx`'s memory (already enabled: fine)."""
        code = self._lib.cuCtxEnablePeerAccess(ctypes.c_void_p(peer_ctx), 0)
        if code not in (0, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED):
            raise self.error("cuCtxEnablePeerAccess", code)

    # -- memory ----------------------------------------------------------------------------------------------------

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current context's GPU."""
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def alloc(self, size: int) -> int:
        ptr = _c_ull()
        self._call("cuMemAlloc_v2", ctypes.byref(ptr), size)
        return ptr.value

    def free(self, ptr: int) -> None:
        self._call("cuMemFree_v2", ptr)

    def host_alloc(self, size: int) -> int:
        """Pinned (page-locked) host memory, portable to every context."""
        ptr = ctypes.c_void_p()
        self._call("cuMemHostAlloc", ctypes.byref(ptr), size, CU_MEMHOSTALLOC_PORTABLE)
        return ptr.value

    def free_host(self, ptr: int) -> None:
        self._call("cuMemFreeHost", ctypes.c_void_p(ptr))

    def memset32(self, ptr: int, value: int, words: int) -> None:
        self._call("cuMemsetD32_v2", ptr, value & 0xFFFFFFFF, words)

    def htod(self, dst: int, src: int, size: int, stream: int | None = None) -> None:
        self._call("cuMemcpyHtoDAsync_v2", dst, ctypes.c_void_p(src), size, ctypes.c_void_p(stream))

    def dtoh(self, dst: int, src: int, size: int, stream: int | None = None) -> None:
        self._call("cuMemcpyDtoHAsync_v2", ctypes.c_void_p(dst), src, size, ctypes.c_void_p(stream))

    def dtod(self, dst: int, src: int, size: int, stream: int | None = None) -> None:
        self._call("cuMemcpyDtoDAsync_v2", dst, src, size, ctypes.c_void_p(stream))

    def peer(self, dst: int, dst_ctx: int, src: int, src_ctx: int, size: int, stream: int | None = None) -> None:
        self._call("cuMemcpyPeerAsync", dst, ctypes.c_void_p(dst_ctx), src, ctypes.c_void_p(src_ctx), size,
                   ctypes.c_void_p(stream))

    # -- streams and events ----------------------------------------------------------------------------------

    def stream(self) -> int:
        s = ctypes.c_void_p()
        self._call("cuStreamCreate", ctypes.byref(s), 0)
        return s.value

    def destroy_stream(self, stream: int) -> None:
        self._call("cuStreamDestroy_v2", ctypes.c_void_p(stream))

    def sync(self, stream: int | None = None) -> None:
        self._call("cuStreamSynchronize", ctypes.c_void_p(stream))

    def event(self) -> int:
        e = ctypes.c_void_p()
        self._call("cuEventCreate", ctypes.byref(e), 0)
        return e.value

    def destroy_event(self, event: int) -> None:
        self._call("cuEventDestroy_v2", ctypes.c_void_p(event))

    def record(self, event: int, stream: int | None = None) -> None:
        self._call("cuEventRecord", ctypes.c_void_p(event), ctypes.c_void_p(stream))

    def event_sync(self, event: int) -> None:
        self._call("cuEventSynchronize", ctypes.c_void_p(event))

    def elapsed_ms(self, start: int, end: int) -> float:
        ms = ctypes.c_float()
        self._call("cuEventElapsedTime", ctypes.byref(ms), ctypes.c_void_p(start), ctypes.c_void_p(end))
        return ms.value

    # -- kernels -----------------------------------------------------------------------------------------------------

    def load_module(self, ptx: bytes) -> int:
        """PTX text, compiled by the driver now (its JIT), in the current context.

        Raises:
            TestError: the driver has no PTX compiler (a could-not-run, on every GPU alike).
            CudaError: any other failure.
        """
        module = ctypes.c_void_p()
        code = self._lib.cuModuleLoadData(ctypes.byref(module), ptx if ptx.endswith(b"\0") else ptx + b"\0")
        if code == CUDA_ERROR_JIT_COMPILER_NOT_FOUND:
            raise TestError(str(self.error("cuModuleLoadData", code)))
        if code != 0:
            raise self.error("cuModuleLoadData", code)
        return module.value

    def unload_module(self, module: int) -> None:
        self._call("cuModuleUnload", ctypes.c_void_p(module))

    def function(self, module: int, name: str) -> int:
        fn = ctypes.c_void_p()
        self._call("cuModuleGetFunction", ctypes.byref(fn), ctypes.c_void_p(module), name.encode())
        return fn.value

    def launch(self, function: int, grid: int, block: int, args: list, stream: int | None = None) -> None:
        """`function` over `grid` blocks of `block` threads; `args` are ctypes values (c_uint64, c_uint32)."""
        params = (ctypes.c_void_p * len(args))(*(ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args))
        self._call("cuLaunchKernel", ctypes.c_void_p(function), grid, 1, 1, block, 1, 1, 0, ctypes.c_void_p(stream),
                   ctypes.cast(params, _c_void_pp), None)


def open_driver(library: str = LIBRARY) -> Driver:
    """libcuda loaded and initialised, at `MIN_VERSION` or later.

    Raises:
        TestError: no libcuda.so.1, a driver too old, no GPU, or cuInit failing: the tests cannot run.
    """
    try:
        lib = ctypes.CDLL(library)
    except OSError as err:
        raise TestError(f"cannot load {library} ({err}): the NVIDIA driver's user-space library is not installed "
                        f"or not on the library path; install the driver (its libcuda.so.1) to run the GPU tests") \
            from err
    driver = Driver(lib)
    version = driver.version()
    if version < MIN_VERSION:
        raise TestError(f"the NVIDIA driver offers CUDA {version // 1000}.{version % 1000 // 10}, the GPU tests need "
                        f"{MIN_VERSION // 1000}.{MIN_VERSION % 1000 // 10} or later (driver 525+): upgrade the driver")
    try:
        driver.init()
    except CudaError as err:
        if err.code == CUDA_ERROR_NO_DEVICE:
            raise TestError(f"the driver sees no GPU (cuInit: {err.name}): check nvidia-smi and the kernel log") \
                from err
        raise TestError(str(err)) from err
    return driver


def nvml_indexes(devices: list[Device], nvml=None) -> dict[int, int]:
    """CUDA ordinal -> NVML index, matched by PCI bus id (CUDA orders GPUs its own way).

    Raises:
        TestError: NVML cannot be read, or a CUDA device has no NVML twin.
    """
    from slurm_ext import nvml as nvml_helpers

    try:
        nvml = nvml or nvml_helpers.load()
    except nvml_helpers.NvmlUnavailable as err:
        raise TestError(f"cannot name the GPUs by their NVML index: {err.problem}") from err
    by_bus: dict[tuple[int, int, int], int] = {}
    try:
        with nvml_helpers.session(nvml, lambda err: TestError(nvml_helpers.describe("NVML did not start",
                                                                                   nvml_helpers.error_code(err)))):
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                by_bus[bus_key(nvml_helpers.text(nvml.nvmlDeviceGetPciInfo(handle).busId))] = index
    except nvml_helpers.errors(nvml) as err:
        raise TestError(nvml_helpers.describe("NVML could not list the GPUs", nvml_helpers.error_code(err))) from err
    found = {}
    for device in devices:
        index = by_bus.get(bus_key(device.pci_bus_id))
        if index is None:
            raise TestError(f"CUDA device {device.ordinal} ({device.pci_bus_id}) is not among NVML's GPUs: the "
                            f"driver's libraries disagree; check nvidia-smi")
        found[device.ordinal] = index
    return found
