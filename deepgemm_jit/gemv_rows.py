"""Row sweep for decode (M <= 2 tokens, weights stored (N, K)): D (M, N) = A (M, K) @ B (N, K).T on CUDA cores,
reading B like a streaming read; bf16 / fp16, and FP8 with tensor, row or block scales.

Why a second decode kernel beside gemv.py's: at M = 1 the time is reading the weight, and an SM alone pulls at most
~31 GB/s, so a read reaches the DRAM's 3.7 TB/s only with nearly every SM pulling until an even end. This kernel is
shaped like the streaming read: each CTA takes one whole row at a time (rows b, b + grid, ...: ~27 per CTA at N =
7168, so the end is even), every SM holds 1024 threads with two rows of 16-byte loads in flight, and nothing waits
but one barrier per row. The Hopper tiles (112-132 CTAs) pull ~27 GB/s per SM. (The order in which rows are visited
does not matter: reads in the tiles' order, 64 rows a CTA and 128 bytes of each per visit, ran at the read's speed
with 8 rows a CTA and all SMs busy, bench/results/*exp-row-sweep-visits-s30*.) H200, M = 1 BF16, against the
evict-first read of the same bytes, same call (bench/results/*exp-row-sweep-bf16-m1-s30*, us):

    7168x16384  64.8 (read 64.0; tiles 66.9; cuBLAS 72.5)      2112x7168   13.6 (read 13.3; mma.sync 15.0)
    4096x7168   20.7 (read 20.5; mma.sync 22.5)                 7168x2048   13.0 (read 13.4; tiles 14.3)
    24576x1536  24.7 (read 24.7; mma.sync 27.0)                 32768x512   15.9 (read 14.8; mma.sync 15.7)

so it runs where a weight row has at least MIN_ROW_BYTES (K = 512 did not gain; FP8 K = 1536 and 512 lost
up to 60%, *exp-row-sweep-fp8-m1-s30*). FP8 (E4M3) M = 1 in the library, activations widened to FP32 once, against
what the same calls ran before (bench/results/*exp-gemv-rows-fp8-m1-widened-s30*, us, per-tensor / block):
7168x16384 35.6 / 36.5 (37.0 / 37.7), 2112x7168 9.8 / 10.3 (11.3 / 11.2), 4096x7168 13.5 / 13.9 (14.8 / 15.0),
7168x2048 9.8 / 10.3 (10.4 / 10.7); faster on every one of the 16 weights per-tensor, block but two (see
FP8_BLOCK_MAX_N). Against what the same calls ran
before it, on the decode and models weights (bench/results/*exp-gemv-rows-m1-m2-s30*, 17 (N, K)): faster on every
one at M = 1 (0-11%) and M = 2 (0.4-11%, the two-token form), so the rule takes both. Device logic and the work
decomposition: ``templates/include/dgjit/gemv_rows.cuh``. Deterministic (fixed reduction order), allocates and
synchronises nothing: graph-capturable.

Dispatch (:func:`max_m`): gemv.py's rule and plan call this module first; a call of an ``nt`` Gemm without a fused
epilogue, bf16 / fp16 (one type) or FP8 (E4M3 / E5M2, mixes included; tensor, row or block scales, fast_accum or
not: the sums are FP32 throughout) in and bf16 / fp16 / fp32 out, compiled for sm_90+, with weight rows of K x
element size a multiple of 16 bytes and at least MIN_ROW_BYTES, runs this kernel when M <= :data:`DISPATCH_MAX_M`
and a and b have 16-byte aligned rows (gemv.operands_fit).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import cubin, device, dtypes, jit
from . import launch as launch_mod
from .arrays import MatrixView, ScaleView
from .launch import LaunchPlan, scale_args
from .render import RenderedSource
from .spec import GemmSpec

MAX_TOKENS = 2            # what the kernel takes: its activation words are registers (4 tokens spilled 456 B)
DISPATCH_MAX_M = 2        # what the rule gives it: both, faster at M = 1 and 2 on every row measured (above)
# FP8 at M = 1 only: the second token's products made the kernel issue-bound (M = 2, bench/results/
# *exp-gemv-rows-fp8-m1-m2-s30*: 7168x16384 block 54.4 vs 38.0 us, 28672x4096 54.8 vs 38.8).
FP8_MAX_M = 1
# FP8 block scaling (an FMA and a scale load more per word than per-tensor) lost on the two largest models weights
# measured, 37888x3584 (44.2 vs 42.3 us) and 3584x18944 (28.1 vs 26.5), and won up to these (*exp-gemv-rows-fp8-m1-
# widened-s30*: 28672x4096 37.3 vs 37.8, 7168x16384 36.5 vs 37.7); per-tensor and row scaling won on all 16.
FP8_BLOCK_MAX_N = 28672
FP8_BLOCK_MAX_K = 16384
WEIGHT_DTYPES = dtypes.DECODE_WEIGHT_DTYPES
OUT_DTYPES = dtypes.DECODE_OUT_DTYPES
WORD_BYTES = 16           # one 16-byte load per thread and chunk
MIN_ROW_BYTES = 2048      # BF16 K >= 1024, FP8 K >= 2048: shorter rows did not gain (above)
# The launch bounds' budget by tokens: threads per SM (1024: <= 64 registers a thread; 512: <= 128, which the
# activation words of 2 tokens need, tokens x chunks x 4 registers, beside two rows of weight words).
THREADS_PER_SM = {1: 1024, 2: 512}
MAX_CTAS_PER_SM = 32      # sm_90's resident CTA limit
# 16-byte words of a row per thread, by element bytes. 16-bit: H200, M = 1, 512 threads x 4 words at K = 16384
# 64.8 us, 1024 x 2 65.4; 64 x 4 at K = 2048 13.0, 128 x 2 13.2, 256 x 1 14.4 (a fifth word spilled at 64
# registers). FP8 (16 values a word, ~2.5x the instructions per byte): 2 words beat 4 on every row
# (bench/results/*exp-row-sweep-fp8-m1-s30*: 7168x16384 per-tensor 35.2 vs 35.8 us, 2112x7168 9.7 vs 10.1).
# Rows longer than the budget's threads x CHUNKS words are left to the other kernels.
CHUNKS = {2: 4, 1: 2}
SYMBOLS = ("num_threads", "chunks", "tokens")

_TEMPLATE = "gemv_rows.cu.j2"
_ENTRY = "dgjit_gemv_rows"
_SCALING_CPP = {"none": "kNone", "tensor": "kTensor", "row": "kRow", "block": "kBlock"}


@dataclass(frozen=True)
class GemvRowsSpec:
    """What one row-sweep kernel is compiled for; M, N, K (as 16-byte words per row), pointers, strides and
    scales are run-time arguments. w_dtype: the weight B; x_dtype: the activations A (16-bit: the same type; FP8:
    either FP8 type, with scaling tensor / row / block). threads x chunks must cover a row's words (``for_gemm``
    picks them from K)."""

    w_dtype: str
    x_dtype: str
    out_dtype: str
    scaling: str = "none"
    tokens: int = 1
    threads: int = 512
    chunks: int = 4

    def __post_init__(self):
        dtypes.check_decode_types(self.w_dtype, self.x_dtype, self.out_dtype, self.scaling)
        if self.tokens not in THREADS_PER_SM or isinstance(self.tokens, bool):
            raise ValueError(f"tokens={self.tokens!r} must be 1 or 2")
        budget = THREADS_PER_SM[self.tokens]
        if not (isinstance(self.threads, int) and 32 <= self.threads <= budget and self.threads % 32 == 0):
            raise ValueError(f"threads={self.threads!r} must be a multiple of 32 in [32, {budget}] at "
                             f"tokens={self.tokens}")
        most = CHUNKS[dtypes.get(self.w_dtype).storage_bytes]
        if not (isinstance(self.chunks, int) and 1 <= self.chunks <= most):
            raise ValueError(f"chunks={self.chunks!r} must be in [1, {most}] for {self.w_dtype}")

    @property
    def entry(self) -> str:
        return _ENTRY

    @property
    def scaling_cpp(self) -> str:
        return _SCALING_CPP[self.scaling]

    @property
    def ctas_per_sm(self) -> int:
        """CTAs an SM holds at once, which the launch bounds promise and the grid counts on."""
        return min(MAX_CTAS_PER_SM, THREADS_PER_SM[self.tokens] // self.threads)

    @property
    def max_row_words(self) -> int:
        return self.threads * self.chunks

    @property
    def tag(self) -> str:
        types = self.x_dtype if self.x_dtype == self.w_dtype else f"{self.x_dtype}x{self.w_dtype}"
        scaled = "" if self.scaling == "none" else f"_{self.scaling}"
        return f"gemv_rows_{types}{scaled}_{self.out_dtype}_m{self.tokens}_{self.threads}x{self.chunks}"

    @classmethod
    def for_gemm(cls, spec: GemmSpec, m: int) -> "GemvRowsSpec":
        """The kernel a call of `spec` with M = `m` (1..MAX_TOKENS) runs."""
        if not 1 <= m <= MAX_TOKENS:
            raise ValueError(f"M={m}: the row-sweep kernel takes 1 <= M <= {MAX_TOKENS}")
        esize, words = dtypes.get(spec.b_dtype).storage_bytes, row_words(spec)
        if words > max_row_words(m, esize):
            raise ValueError(f"K={spec.k}: rows of {words} 16-byte words exceed the {max_row_words(m, esize)} "
                             f"that {THREADS_PER_SM[m]} threads x {CHUNKS[esize]} take at M={m}")
        return cls(w_dtype=spec.b_dtype, x_dtype=spec.dtype, out_dtype=spec.out_dtype, scaling=spec.scaling,
                   tokens=m, threads=threads_for(words, esize), chunks=CHUNKS[esize])


def row_words(spec: GemmSpec) -> int:
    """16-byte words of one weight row (K x element size must be a multiple of 16: see max_m)."""
    return spec.k * dtypes.get(spec.b_dtype).storage_bytes // WORD_BYTES


def threads_for(words: int, element_bytes: int) -> int:
    """Threads of a CTA that reads a row of `words` 16-byte words, CHUNKS[element_bytes] each: whole warps.

    >>> threads_for(2048, 2), threads_for(896, 2), threads_for(256, 2), threads_for(128, 2), threads_for(1024, 1)
    (512, 224, 64, 32, 512)
    """
    return -(-words // (32 * CHUNKS[element_bytes])) * 32


def max_row_words(tokens: int, element_bytes: int) -> int:
    """The longest row (16-byte words) the kernel takes at `tokens` tokens: its thread budget x CHUNKS."""
    return THREADS_PER_SM[tokens] * CHUNKS[element_bytes]


def max_m(spec: GemmSpec, arch: str) -> int:
    """The largest M for which a Gemm of `spec` compiled for `arch` runs this kernel (0: never); the module
    docstring's rule."""
    if spec.layout != "nt" or spec.epilogue != "none" or spec.grouped or device.arch_number(arch) < 90:
        return 0
    if spec.dtype not in WEIGHT_DTYPES or spec.b_dtype not in WEIGHT_DTYPES or spec.out_dtype not in OUT_DTYPES:
        return 0
    esize = dtypes.get(spec.b_dtype).storage_bytes
    row_bytes = spec.k * esize
    if row_bytes % WORD_BYTES or row_bytes < MIN_ROW_BYTES:
        return 0
    if spec.scaling == "block" and (spec.n > FP8_BLOCK_MAX_N or spec.k > FP8_BLOCK_MAX_K):
        return 0
    most = DISPATCH_MAX_M if esize == 2 else min(DISPATCH_MAX_M, FP8_MAX_M)
    return max((m for m in range(1, most + 1) if row_words(spec) <= max_row_words(m, esize)), default=0)


# -- compile ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GemvRowsArtifact(jit.BuiltKernel):
    """A compiled row-sweep kernel: the cached cubin and what it was built for."""

    spec: GemvRowsSpec
    arch: str


def check_symbols(artifact: GemvRowsArtifact) -> None:
    """The kernel's exported sizes must be its spec's (a mismatch is a bug, caught before any launch)."""
    sym = cubin.entry_symbols(artifact.cubin, artifact.entry, SYMBOLS)
    mine = {"num_threads": artifact.spec.threads, "chunks": artifact.spec.chunks, "tokens": artifact.spec.tokens}
    if sym != mine:
        raise RuntimeError(f"{artifact.spec.tag}: the kernel exports {sym}, gemv_rows.py assumes {mine}")


_family: jit.KernelFamily[GemvRowsArtifact] = jit.KernelFamily(_TEMPLATE, GemvRowsArtifact, "gemv_rows_spec",
                                                               check=check_symbols)


def render_kernel(spec: GemvRowsSpec) -> RenderedSource:
    return _family.render(spec)


def get_kernel(spec: GemvRowsSpec, arch: str) -> GemvRowsArtifact:
    """The kernel of `spec` for `arch`: from the in-process memo, the disk cache, or NVRTC (once)."""
    return _family.get(spec, arch)


def clear_memo() -> None:
    _family.clear()


# -- launch -----------------------------------------------------------------------------------------------

def grid_size(n: int, kernel: GemvRowsSpec, num_sms: int) -> int:
    """One wave: every resident CTA slot, but no more CTAs than rows."""
    return max(1, min(n, num_sms * kernel.ctas_per_sm))


def plan(spec: GemmSpec, arch: str, m: int, va: MatrixView, vb: MatrixView, vd: MatrixView, device_id: int,
         sa: ScaleView | None = None, sb: ScaleView | None = None, kernel: GemvRowsSpec | None = None
         ) -> LaunchPlan:
    """A ``launch.LaunchPlan`` of the row-sweep kernel for validated operands (1 <= m <= MAX_TOKENS, 16-byte
    aligned rows: gemv.operands_fit; FP8 scales as ``Gemm`` validated them). `kernel`: another spec than
    ``GemvRowsSpec.for_gemm`` (experiments; it must cover the row and M). Compiles or loads the kernel on first
    use."""
    kernel = kernel or GemvRowsSpec.for_gemm(spec, m)
    words = row_words(spec)
    if spec.k * dtypes.get(spec.b_dtype).storage_bytes % WORD_BYTES or words > kernel.max_row_words:
        raise ValueError(f"{kernel.tag} does not cover a row of K={spec.k} ({words} words of 16 bytes)")
    if not 1 <= m <= kernel.tokens:
        raise ValueError(f"M={m}: {kernel.tag} takes 1 <= M <= {kernel.tokens}")
    artifact = get_kernel(kernel, arch)
    grid = (grid_size(spec.n, kernel, device.num_sms(device_id)), 1, 1)
    args = (np.uint64(vb.ptr), np.int64(vb.row_stride * vb.itemsize), np.uint64(va.ptr),
            np.int64(va.row_stride * va.itemsize), np.uint64(vd.ptr), np.int64(vd.row_stride)
            ) + scale_args(sa, sb) + (np.uint32(m), np.uint32(spec.n), np.uint32(words))
    return launch_mod.decode_plan(artifact, arch, grid, (kernel.threads, 1, 1), args, device_id)


def describe(spec: GemmSpec, m: int, num_sms: int) -> dict:
    """What a call with M = `m` (1..MAX_TOKENS) runs, for ``explain`` (not compiled here)."""
    kernel = GemvRowsSpec.for_gemm(spec, m)
    return {"tag": kernel.tag, "num_threads": kernel.threads, "chunks": kernel.chunks,
            "grid": grid_size(spec.n, kernel, num_sms)}


__all__ = ["MAX_TOKENS", "DISPATCH_MAX_M", "GemvRowsSpec", "max_m", "row_words", "threads_for", "max_row_words",
           "get_kernel", "plan", "describe", "grid_size"]
