"""Row sweep for decode (M <= 2 tokens, 16-bit weights stored (N, K)): D (M, N) = A (M, K) @ B (N, K).T on CUDA
cores, reading B front to back like a streaming read.

Why a second decode kernel beside gemv.py's: at M = 1 the speed is how fast the DRAM delivers the weight, and that
depends on how many weight rows are read at once. The Hopper tiles and the mma.sync weight-streaming kernel read
128-256 bytes of thousands of rows at a time; this kernel gives each CTA one whole row at a time (its threads'
16-byte words are consecutive), so the grid reads a window of a few hundred rows. H200, M = 1 BF16, against the
evict-first read of the same bytes, same call (bench/results/*exp-row-sweep-bf16-m1-s30*, us):

    7168x16384  64.8 (read 64.0; tiles 66.9; cuBLAS 72.5)      2112x7168   13.6 (read 13.3; mma.sync 15.0)
    4096x7168   20.7 (read 20.5; mma.sync 22.5)                 7168x2048   13.0 (read 13.4; tiles 14.3)
    24576x1536  24.7 (read 24.7; mma.sync 27.0)                 32768x512   15.9 (read 14.8; mma.sync 15.7)

so it runs where a weight row has at least MIN_ROW_BYTES (K = 512 did not gain). Against what the same calls ran
before it, on the decode and models weights (bench/results/*exp-gemv-rows-m1-m2-s30*, 17 (N, K)): faster on every
one at M = 1 (0-11%) and M = 2 (0.4-11%, the two-token form), so the rule takes both. Device logic and the work
decomposition: ``templates/include/dgjit/gemv_rows.cuh``. Deterministic (fixed reduction order), allocates and
synchronises nothing: graph-capturable.

Dispatch (:func:`max_m`): gemv.py's rule and plan call this module first; a call of an ``nt`` Gemm without a fused
epilogue, bf16 or fp16 in and bf16 / fp16 / fp32 out, compiled for sm_90+, with K x 2 bytes a multiple of 16, runs
this kernel when M <= :data:`DISPATCH_MAX_M` and a and b have 16-byte aligned rows (gemv.operands_fit).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import cubin, device, dtypes, jit, runtime
from . import launch as launch_mod
from .arrays import MatrixView
from .launch import LaunchPlan
from .render import RenderedSource
from .spec import GemmSpec

MAX_TOKENS = 2            # what the kernel takes: its activation words are registers (4 tokens spilled 456 B)
DISPATCH_MAX_M = 2        # what the rule gives it: both, faster at M = 1 and 2 on every row measured (above)
DTYPES = ("bf16", "fp16")
OUT_DTYPES = ("bf16", "fp16", "fp32")
WORD_BYTES = 16           # one 16-byte load per thread and chunk
MIN_ROW_BYTES = 2048      # K >= 1024 (16-bit): at K = 512 the mma.sync kernel was as fast (above)
# The launch bounds' budget by tokens: threads per SM (1024: <= 64 registers a thread; 512: <= 128, which the
# activation words of 2 tokens need, tokens x chunks x 4 registers, beside two rows of weight words).
THREADS_PER_SM = {1: 1024, 2: 512}
MAX_CTAS_PER_SM = 32      # sm_90's resident CTA limit
# 16-byte words of a row per thread: H200, M = 1, 512 threads x 4 words at K = 16384 64.8 us, 1024 x 2 65.4; 64 x 4
# at K = 2048 13.0, 128 x 2 13.2, 256 x 1 14.4. A fifth word spilled at one token (64 registers), so rows longer than
# the budget's threads x CHUNKS words (M = 1: K = 32768 16-bit values) are left to the other kernels.
CHUNKS = 4
SYMBOLS = ("num_threads", "chunks", "tokens")

_TEMPLATE = "gemv_rows.cu.j2"
_ENTRY = "dgjit_gemv_rows"


@dataclass(frozen=True)
class GemvRowsSpec:
    """What one row-sweep kernel is compiled for; M, N, K (as 16-byte words per row), pointers and strides are
    run-time arguments. threads x chunks must cover a row's words (``for_gemm`` picks them from K)."""

    dtype: str
    out_dtype: str
    tokens: int = 1
    threads: int = 512
    chunks: int = 4

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.out_dtype not in OUT_DTYPES:
            raise ValueError(f"out_dtype={self.out_dtype!r} is not one of {', '.join(OUT_DTYPES)}")
        if self.tokens not in THREADS_PER_SM or isinstance(self.tokens, bool):
            raise ValueError(f"tokens={self.tokens!r} must be 1 or 2")
        budget = THREADS_PER_SM[self.tokens]
        if not (isinstance(self.threads, int) and 32 <= self.threads <= budget and self.threads % 32 == 0):
            raise ValueError(f"threads={self.threads!r} must be a multiple of 32 in [32, {budget}] at "
                             f"tokens={self.tokens}")
        if not (isinstance(self.chunks, int) and 1 <= self.chunks <= CHUNKS):
            raise ValueError(f"chunks={self.chunks!r} must be in [1, {CHUNKS}]")

    @property
    def entry(self) -> str:
        return _ENTRY

    @property
    def ctas_per_sm(self) -> int:
        """CTAs an SM holds at once, which the launch bounds promise and the grid counts on."""
        return min(MAX_CTAS_PER_SM, THREADS_PER_SM[self.tokens] // self.threads)

    @property
    def max_row_words(self) -> int:
        return self.threads * self.chunks

    @property
    def tag(self) -> str:
        return f"gemv_rows_{self.dtype}_{self.out_dtype}_m{self.tokens}_{self.threads}x{self.chunks}"

    @classmethod
    def for_gemm(cls, spec: GemmSpec, m: int) -> "GemvRowsSpec":
        """The kernel a call of `spec` with M = `m` (1..MAX_TOKENS) runs."""
        if not 1 <= m <= MAX_TOKENS:
            raise ValueError(f"M={m}: the row-sweep kernel takes 1 <= M <= {MAX_TOKENS}")
        words = row_words(spec)
        if words > max_row_words(m):
            raise ValueError(f"K={spec.k}: rows of {words} 16-byte words exceed the {max_row_words(m)} that "
                             f"{THREADS_PER_SM[m]} threads x {CHUNKS} take at M={m}")
        return cls(dtype=spec.dtype, out_dtype=spec.out_dtype, tokens=m, threads=threads_for(words), chunks=CHUNKS)


def row_words(spec: GemmSpec) -> int:
    """16-byte words of one weight row (K x element size must be a multiple of 16: see max_m)."""
    return spec.k * dtypes.get(spec.b_dtype).storage_bytes // WORD_BYTES


def threads_for(words: int) -> int:
    """Threads of a CTA that reads a row of `words` 16-byte words, CHUNKS each: whole warps.

    >>> threads_for(2048), threads_for(896), threads_for(256), threads_for(128), threads_for(4096)
    (512, 224, 64, 32, 1024)
    """
    return -(-words // (32 * CHUNKS)) * 32


def max_row_words(tokens: int) -> int:
    """The longest row (16-byte words) the kernel takes at `tokens` tokens: its thread budget x CHUNKS."""
    return THREADS_PER_SM[tokens] * CHUNKS


def max_m(spec: GemmSpec, arch: str) -> int:
    """The largest M for which a Gemm of `spec` compiled for `arch` runs this kernel (0: never); the module
    docstring's rule."""
    if spec.layout != "nt" or spec.epilogue != "none" or spec.grouped or device.arch_number(arch) < 90:
        return 0
    if spec.dtype not in DTYPES or spec.b_dtype != spec.dtype or spec.out_dtype not in OUT_DTYPES:
        return 0
    row_bytes = spec.k * dtypes.get(spec.b_dtype).storage_bytes
    if row_bytes % WORD_BYTES or row_bytes < MIN_ROW_BYTES:
        return 0
    return max((m for m in range(1, DISPATCH_MAX_M + 1) if row_words(spec) <= max_row_words(m)), default=0)


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
         kernel: GemvRowsSpec | None = None) -> LaunchPlan:
    """A ``launch.LaunchPlan`` of the row-sweep kernel for validated operands (1 <= m <= MAX_TOKENS, 16-byte
    aligned rows: gemv.operands_fit). `kernel`: another spec than ``GemvRowsSpec.for_gemm`` (experiments; it must
    cover the row and M). Compiles or loads the kernel on first use."""
    kernel = kernel or GemvRowsSpec.for_gemm(spec, m)
    words = row_words(spec)
    if spec.k * dtypes.get(spec.b_dtype).storage_bytes % WORD_BYTES or words > kernel.max_row_words:
        raise ValueError(f"{kernel.tag} does not cover a row of K={spec.k} ({words} words of 16 bytes)")
    if not 1 <= m <= kernel.tokens:
        raise ValueError(f"M={m}: {kernel.tag} takes 1 <= M <= {kernel.tokens}")
    artifact = get_kernel(kernel, arch)
    loaded = runtime.loaded_kernel(artifact, device_id, 0)
    grid = (grid_size(spec.n, kernel, device.num_sms(device_id)), 1, 1)
    args = (np.uint64(vb.ptr), np.int64(vb.row_stride * vb.itemsize), np.uint64(va.ptr),
            np.int64(va.row_stride * va.itemsize), np.uint64(vd.ptr), np.int64(vd.row_stride), np.uint32(m),
            np.uint32(spec.n), np.uint32(words))
    # Programmatic dependent launch needs sm_90; the kernel's wait is a no-op elsewhere.
    waits = arch == "sm_90a" and cubin.optional_entry_symbol(artifact.cubin, artifact.entry,
                                                             "takes_programmatic_launch") == 1
    return LaunchPlan(loaded, grid, (kernel.threads, 1, 1), args, device_id, waits,
                      waits and launch_mod.PROGRAMMATIC_GEMMS)


def describe(spec: GemmSpec, m: int, num_sms: int) -> dict:
    """What a call with M = `m` (1..MAX_TOKENS) runs, for ``explain`` (not compiled here)."""
    kernel = GemvRowsSpec.for_gemm(spec, m)
    return {"tag": kernel.tag, "num_threads": kernel.threads, "chunks": kernel.chunks,
            "grid": grid_size(spec.n, kernel, num_sms)}


__all__ = ["MAX_TOKENS", "DISPATCH_MAX_M", "GemvRowsSpec", "max_m", "row_words", "threads_for", "max_row_words",
           "get_kernel", "plan", "describe", "grid_size"]
