"""A GPU load and a GPU memory holder for the device check, with nothing but Python and the driver.

Run by tests/device/gpu_check.py, under the machine's own Python (not the check's venv: torch or
CuPy, where the machine has them, are installed there):

- `python gpuload.py load [--backend auto|torch|cupy|cuda] [--gib N] [--seconds S]` keeps GPU 0
  busy until SIGTERM (or S seconds): a bf16 matmul loop with torch or CuPy when one imports and
  sees a GPU, else the driver API through ctypes (`libcuda.so.1`: cuInit, a primary context,
  cuMemAlloc of N GiB, a hand-written PTX kernel of dependent FMAs loaded with cuModuleLoadData
  and launched over and over; no CUDA toolkit). It prints one line `ready <backend> <what>` once
  the first batch of work has finished on the GPU, `failed <backend>: <why>` per backend that
  could not start, and exits 1 when none could.
- `python gpuload.py hold [--gib N] [--fake]` allocates N GiB through libcuda (ctypes), prints
  `ready <pid> <bytes>` and sleeps until killed: the Epilog's leftover process. `--fake` allocates
  nothing (the fake NVML is told about the process instead).

Standard library only, so that it runs on a Python the project does not support.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time

GIB = 2**30

#: float fma chains, 4 per loop turn; each thread reads and writes one float of the buffer
PTX = rb"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry burn(
    .param .u64 burn_buf,
    .param .u32 burn_n,
    .param .u32 burn_iters
)
{
    .reg .pred  %p<3>;
    .reg .b32   %r<9>;
    .reg .b64   %rd<5>;
    .reg .f32   %f<5>;

    ld.param.u64    %rd1, [burn_buf];
    ld.param.u32    %r1, [burn_n];
    ld.param.u32    %r2, [burn_iters];
    mov.u32         %r3, %ctaid.x;
    mov.u32         %r4, %ntid.x;
    mov.u32         %r5, %tid.x;
    mad.lo.s32      %r6, %r3, %r4, %r5;
    setp.ge.u32     %p1, %r6, %r1;
    @%p1 bra        DONE;
    cvta.to.global.u64  %rd2, %rd1;
    mul.wide.u32    %rd3, %r6, 4;
    add.s64         %rd4, %rd2, %rd3;
    ld.global.f32   %f1, [%rd4];
    mov.f32         %f2, 0f3F7FFFEF;
    mov.f32         %f3, 0f3A83126F;
    mov.u32         %r7, 0;
LOOP:
    fma.rn.f32      %f1, %f1, %f2, %f3;
    fma.rn.f32      %f1, %f1, %f2, %f3;
    fma.rn.f32      %f1, %f1, %f2, %f3;
    fma.rn.f32      %f1, %f1, %f2, %f3;
    add.u32         %r7, %r7, 1;
    setp.lt.u32     %p2, %r7, %r2;
    @%p2 bra        LOOP;
    st.global.f32   [%rd4], %f1;
DONE:
    ret;
}
"""

#: threads per block, and the floats the kernel works on (the rest of the allocation is only held)
_BLOCK = 256
_ELEMENTS = 1 << 24
_ITERS = 4096


class CudaError(Exception):
    pass


class Cuda:
    """The few driver API calls the load and the holder need, through ctypes."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as err:
            raise CudaError(f"cannot load libcuda.so.1: {err}") from None
        self.ctx = ctypes.c_void_p()

    def call(self, name: str, *args) -> None:
        result = getattr(self.lib, name)(*args)
        if result != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(result, ctypes.byref(text))
            raise CudaError(f"{name}: CUDA error {result} ({(text.value or b'?').decode()})")

    def open(self, ordinal: int = 0) -> str:
        """cuInit and GPU `ordinal`'s primary context made current; returns the device's name."""
        self.call("cuInit", ctypes.c_uint(0))
        device = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(device), ctypes.c_int(ordinal))
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), device)
        self.call("cuCtxSetCurrent", self.ctx)
        name = ctypes.create_string_buffer(128)
        self.call("cuDeviceGetName", name, ctypes.c_int(len(name)), device)
        return name.value.decode(errors="replace")

    def alloc(self, size: int) -> ctypes.c_uint64:
        """`size` bytes of device memory, every byte written once (so that it is really taken)."""
        pointer = ctypes.c_uint64()
        self.call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(size))
        self.call("cuMemsetD32_v2", pointer, ctypes.c_uint(0), ctypes.c_size_t(size // 4))
        self.call("cuCtxSynchronize")
        return pointer

    def kernel(self, ptx: bytes, name: bytes) -> ctypes.c_void_p:
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        self.call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(ptx))
        self.call("cuModuleGetFunction", ctypes.byref(function), module, ctypes.c_char_p(name))
        return function

    def launch(self, function: ctypes.c_void_p, grid: int, block: int, *args) -> None:
        """`function` over `grid` x `block` threads, on the default stream; `args` are ctypes values."""
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        self.call("cuLaunchKernel", function, ctypes.c_uint(grid), ctypes.c_uint(1), ctypes.c_uint(1),
                  ctypes.c_uint(block), ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(0), ctypes.c_void_p(),
                  params, ctypes.c_void_p())


def _stopper() -> list[bool]:
    stop = [False]

    def handler(*_):
        stop[0] = True
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def _load_torch(gib: float, until: float, stop: list[bool]) -> None:
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no GPU")
    device = torch.device("cuda:0")
    held = torch.empty(int(gib * GIB), dtype=torch.uint8, device=device)
    held.fill_(1)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    started = time.monotonic()
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize()
    _ready("torch", f"{torch.cuda.get_device_name(0)}: bf16 8192x8192 matmul loop, {gib:g} GiB held, "
           f"first batch {1000 * (time.monotonic() - started):.0f} ms")
    while not stop[0] and time.monotonic() < until:
        for _ in range(20):
            c = a @ b
        torch.cuda.synchronize()
    del c, held


def _load_cupy(gib: float, until: float, stop: list[bool]) -> None:
    import cupy
    cupy.cuda.Device(0).use()
    held = cupy.ones(int(gib * GIB), dtype=cupy.uint8)
    a = cupy.random.rand(8192, 8192, dtype=cupy.float32)
    b = cupy.random.rand(8192, 8192, dtype=cupy.float32)
    started = time.monotonic()
    for _ in range(5):
        c = a @ b
    cupy.cuda.Device(0).synchronize()
    _ready("cupy", f"fp32 8192x8192 matmul loop, {gib:g} GiB held, first batch "
           f"{1000 * (time.monotonic() - started):.0f} ms")
    while not stop[0] and time.monotonic() < until:
        for _ in range(10):
            c = a @ b
        cupy.cuda.Device(0).synchronize()
    del c, held


def _load_cuda(gib: float, until: float, stop: list[bool]) -> None:
    cuda = Cuda()
    name = cuda.open()
    size = max(int(gib * GIB), _ELEMENTS * 4)
    buffer = cuda.alloc(size)
    compile_start = time.monotonic()
    burn = cuda.kernel(PTX, b"burn")
    compile_ms = 1000 * (time.monotonic() - compile_start)
    grid = (_ELEMENTS + _BLOCK - 1) // _BLOCK
    args = (buffer, ctypes.c_uint(_ELEMENTS), ctypes.c_uint(_ITERS))
    started = time.monotonic()
    cuda.launch(burn, grid, _BLOCK, *args)
    cuda.call("cuCtxSynchronize")
    launch_ms = 1000 * (time.monotonic() - started)
    _ready("cuda", f"{name}: PTX fma loop through libcuda (ctypes), {size / GIB:g} GiB held, PTX compiled by the "
           f"driver in {compile_ms:.0f} ms, one launch {launch_ms:.0f} ms")
    while not stop[0] and time.monotonic() < until:
        for _ in range(4):
            cuda.launch(burn, grid, _BLOCK, *args)
        cuda.call("cuCtxSynchronize")


_BACKENDS = {"torch": _load_torch, "cupy": _load_cupy, "cuda": _load_cuda}


def _ready(backend: str, what: str) -> None:
    print(f"ready {backend} {what}", flush=True)


def load(backend: str, gib: float, seconds: float) -> int:
    stop = _stopper()
    until = time.monotonic() + seconds
    for name in (("torch", "cupy", "cuda") if backend == "auto" else (backend,)):
        try:
            _BACKENDS[name](gib, until, stop)
            return 0
        except Exception as err:  # ImportError, no GPU seen, a CUDA error: the next backend
            print(f"failed {name}: {type(err).__name__}: {err}"[:500], flush=True)
        if stop[0]:
            break
    return 1


def hold(gib: float, fake: bool) -> int:
    size = int(gib * GIB)
    if not fake:
        cuda = Cuda()
        cuda.open()
        cuda.alloc(size)
    print(f"ready {os.getpid()} {0 if fake else size}", flush=True)
    while True:
        time.sleep(3600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    actions = parser.add_subparsers(dest="action", required=True)
    one = actions.add_parser("load", help="keep GPU 0 busy until SIGTERM")
    one.add_argument("--backend", choices=("auto", *_BACKENDS), default="auto")
    one.add_argument("--gib", type=float, default=8.0, help="GPU memory held besides the work (default 8)")
    one.add_argument("--seconds", type=float, default=600.0, help="stop after this long (default 600)")
    two = actions.add_parser("hold", help="allocate GPU memory and wait to be killed")
    two.add_argument("--gib", type=float, default=2.0)
    two.add_argument("--fake", action="store_true", help="allocate nothing (no GPU)")
    args = parser.parse_args()
    if args.action == "load":
        return load(args.backend, args.gib, args.seconds)
    return hold(args.gib, args.fake)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CudaError as err:
        print(f"failed cuda: {err}", flush=True)
        sys.exit(1)
