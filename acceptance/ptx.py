"""The GPU tests' kernels: hand-written PTX that the driver compiles when it is loaded (cuModuleLoadData).

No CUDA toolkit on the node: the NVIDIA driver JIT-compiles PTX text for its GPU. `.version 7.0` and
`.target sm_70` are old enough that every driver since 450 takes them (the tests require 525 or later)
and compile them for sm_80, sm_90 and sm_100. The fake libcuda (devcluster/fakenvml/fakecuda.c)
recognises these kernels by their `.entry` names and runs C twins of them: keep the two in step.

Kernels (one module, `MODULE`):

- `fill(buf, words, mode, pattern)`: word i of `buf` (u32) gets `expected(mode, pattern, i, address)`;
- `check(buf, words, mode, pattern, result)`: counts the words that differ from it ON THE GPU, so that
  ~140 GB is checked at HBM speed instead of copied to the host: `result` is u64[4], set by atomics:
  bad words, lowest and highest bad word index, and the OR of every differing bit (init 0, ~0, 0, 0);
- `burn(buf, n, iters)`: each of n threads runs `iters` turns of 4 dependent FP32 FMAs on its float.

Both memory kernels walk the buffer with a grid-stride loop (any grid size covers any buffer) and
64-bit indexes (a 141 GB buffer has 35 G words).
"""

from __future__ import annotations

__all__ = ["MODULE", "FILL", "CHECK", "BURN", "MODES", "expected", "RESULT_WORDS"]

FILL, CHECK, BURN = "fill", "check", "burn"

#: pattern modes: value XOR word index, address-in-address (the word's own address, both halves
#: XORed, XOR pattern), walking ones (1 << ((index + pattern) % 32)) and walking zeros (its inverse)
MODES = {"xor-index": 0, "address": 1, "walking-ones": 2, "walking-zeros": 3}

#: u64s of check's result: bad words, lowest bad index, highest bad index, OR of the differing bits
RESULT_WORDS = 4


def expected(mode: int, pattern: int, index: int, address: int) -> int:
    """What `fill` writes at word `index` (byte address `address`): the kernels' rule, for tests and the fake."""
    one = 1 << ((index + pattern) & 31)
    if mode == 1:
        return (address ^ (address >> 32) ^ pattern) & 0xFFFFFFFF
    if mode == 2:
        return one
    if mode == 3:
        return ~one & 0xFFFFFFFF
    return (pattern ^ index) & 0xFFFFFFFF  # 0, and any other mode, as the PTX


# The expected word of the loop's index %rd4 and generic address %rd9, by mode %r1 and pattern %r2, into %r7.
# Every mode is computed and the one asked for kept by predicate: no divergent branches in the loop.
_EXPECTED = """
    cvt.u32.u64     %r8, %rd4;              // index, low 32 bits
    xor.b32         %r7, %r8, %r2;          // mode 0: pattern ^ index
    cvt.u32.u64     %r9, %rd9;              // address, low half
    shr.u64         %rd11, %rd9, 32;
    cvt.u32.u64     %r10, %rd11;            // address, high half
    xor.b32         %r11, %r9, %r10;
    xor.b32         %r11, %r11, %r2;        // mode 1: address-in-address
    setp.eq.u32     %p3, %r1, 1;
    @%p3 mov.b32    %r7, %r11;
    add.u32         %r12, %r8, %r2;
    and.b32         %r12, %r12, 31;
    mov.b32         %r14, 1;
    shl.b32         %r13, %r14, %r12;       // mode 2: walking one
    setp.eq.u32     %p4, %r1, 2;
    @%p4 mov.b32    %r7, %r13;
    not.b32         %r15, %r13;             // mode 3: walking zero
    setp.eq.u32     %p5, %r1, 3;
    @%p5 mov.b32    %r7, %r15;
"""

# The grid-stride loop's head: %rd1 buffer (generic), %rd2 words, %rd4 index, %rd6 stride, %rd7 buffer (global).
_LOOP_HEAD = """
    mov.u32         %r3, %ctaid.x;
    mov.u32         %r4, %ntid.x;
    mov.u32         %r5, %tid.x;
    mul.wide.u32    %rd4, %r3, %r4;
    cvt.u64.u32     %rd5, %r5;
    add.u64         %rd4, %rd4, %rd5;       // first index: this thread's number in the grid
    mov.u32         %r6, %nctaid.x;
    mul.wide.u32    %rd6, %r6, %r4;         // stride: threads in the grid
    cvta.to.global.u64 %rd7, %rd1;
LOOP:
    setp.ge.u64     %p1, %rd4, %rd2;
    @%p1 bra        DONE;
    shl.b64         %rd8, %rd4, 2;
    add.u64         %rd9, %rd1, %rd8;       // the word's address as the program sees it
    add.u64         %rd10, %rd7, %rd8;      // and as a global address, to load and store
"""

_LOOP_TAIL = """
NEXT:
    add.u64         %rd4, %rd4, %rd6;
    bra             LOOP;
DONE:
    ret;
}
"""

_REGS = """
    .reg .pred      %p<8>;
    .reg .b32       %r<24>;
    .reg .b64       %rd<24>;
"""

MODULE = ("""//
// slurm-ext acceptance kernels (slurm_ext/acceptance/ptx.py): compiled by the driver at load.
//
.version 7.0
.target sm_70
.address_size 64

// fill: word i = expected(mode, pattern, i, its address)
.visible .entry fill(
    .param .u64 fill_buf,
    .param .u64 fill_words,
    .param .u32 fill_mode,
    .param .u32 fill_pattern
)
{""" + _REGS + """
    ld.param.u64    %rd1, [fill_buf];
    ld.param.u64    %rd2, [fill_words];
    ld.param.u32    %r1, [fill_mode];
    ld.param.u32    %r2, [fill_pattern];
""" + _LOOP_HEAD + _EXPECTED + """
    st.global.u32   [%rd10], %r7;
""" + _LOOP_TAIL + """
// check: count the words that are not expected(...), their lowest and highest index, the bits that differ
.visible .entry check(
    .param .u64 check_buf,
    .param .u64 check_words,
    .param .u32 check_mode,
    .param .u32 check_pattern,
    .param .u64 check_result
)
{""" + _REGS + """
    ld.param.u64    %rd1, [check_buf];
    ld.param.u64    %rd2, [check_words];
    ld.param.u32    %r1, [check_mode];
    ld.param.u32    %r2, [check_pattern];
    ld.param.u64    %rd12, [check_result];
    cvta.to.global.u64 %rd13, %rd12;        // result[0]: bad words
    add.u64         %rd14, %rd13, 8;        // result[1]: lowest bad index
    add.u64         %rd15, %rd13, 16;       // result[2]: highest bad index
    add.u64         %rd16, %rd13, 24;       // result[3]: OR of the differing bits
    mov.u64         %rd17, 1;
""" + _LOOP_HEAD + _EXPECTED + """
    ld.global.u32   %r16, [%rd10];
    xor.b32         %r17, %r16, %r7;
    setp.eq.u32     %p6, %r17, 0;
    @%p6 bra        NEXT;                   // a good word: no atomics (the usual case)
    red.global.add.u64 [%rd13], %rd17;
    red.global.min.u64 [%rd14], %rd4;
    red.global.max.u64 [%rd15], %rd4;
    cvt.u64.u32     %rd18, %r17;
    red.global.or.b64 [%rd16], %rd18;
""" + _LOOP_TAIL + """
// burn: each of n threads runs iters turns of 4 dependent FP32 FMAs on its own float (tests/device/gpuload.py's)
.visible .entry burn(
    .param .u64 burn_buf,
    .param .u32 burn_n,
    .param .u32 burn_iters
)
{
    .reg .pred      %p<3>;
    .reg .b32       %r<9>;
    .reg .b64       %rd<5>;
    .reg .f32       %f<5>;

    ld.param.u64    %rd1, [burn_buf];
    ld.param.u32    %r1, [burn_n];
    ld.param.u32    %r2, [burn_iters];
    mov.u32         %r3, %ctaid.x;
    mov.u32         %r4, %ntid.x;
    mov.u32         %r5, %tid.x;
    mad.lo.s32      %r6, %r3, %r4, %r5;
    setp.ge.u32     %p1, %r6, %r1;
    @%p1 bra        BURN_DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32    %rd3, %r6, 4;
    add.s64         %rd4, %rd2, %rd3;
    ld.global.f32   %f1, [%rd4];
    mov.f32         %f2, 0f3F7FFFEF;        // 0.99999899
    mov.f32         %f3, 0f3A83126F;        // 0.001
    mov.u32         %r7, 0;
BURN_LOOP:
    fma.rn.f32      %f1, %f1, %f2, %f3;
    fma.rn.f32      %f1, %f1, %f2, %f3;
    fma.rn.f32      %f1, %f1, %f2, %f3;
    fma.rn.f32      %f1, %f1, %f2, %f3;
    add.u32         %r7, %r7, 1;
    setp.lt.u32     %p2, %r7, %r2;
    @%p2 bra        BURN_LOOP;
    st.global.f32   [%rd4], %f1;
BURN_DONE:
    ret;
}
""").encode()
