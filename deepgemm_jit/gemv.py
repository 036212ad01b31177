"""Weight streaming for decode (M <= 8; the kernel takes 16): D (M, N) = A (M, K) @ B (N, K).T at the speed of
reading B once.

In LLM decoding the GEMMs have 1..16 rows (tokens) and are bound by reading the weight B. The Hopper family's
tiles (64+ rows) waste most of their tensor-core work there, and on small or short-K weights keep too few bytes in
flight; this kernel streams B with 16-byte non-caching loads, multiplies with ``mma.sync`` in swap-AB form (16 weight rows on the
MMA's M side, the tokens on its N side), splits K across the warps of a CTA and reduces through shared memory
in a fixed order (the same bits on every run; nothing is allocated and nothing synchronises, so it is
graph-capturable). Device logic and the design notes: ``templates/include/dgjit/gemv.cuh``.

Dispatch (:func:`use_weight_streaming`): ``Gemm.__call__`` launches a decode kernel of this module's instead of its
own: at the M where gemv_rows.py's rule takes the call (M <= 2 with weight rows of >= 2 KB), that
row-sweep kernel (:func:`kernel_for`, :func:`plan`); otherwise this one, when the call's M is at most
:data:`DISPATCH_MAX_M`, the weight is not one the Hopper tiles stream faster (N at least
:data:`TILES_MIN_N` and K at least :data:`TILES_MIN_K_16BIT` / :data:`TILES_MIN_K_FP8`, or for FP8 at most
:data:`TILES_MAX_SHORT_K_FP8`), and the Gemm is

- layout ``nt`` (a (M, K), b (N, K)), no fused epilogue (epilogues stay in the sm90 kernel);
- bf16 or fp16, or FP8 (E4M3/E5M2, mixes included) with ``tensor`` / ``row`` / ``block`` scaling (FP8 partial
  sums are promoted to FP32 every 128 K whatever ``fast_accum`` says);
- compiled for sm_90 or newer (the kernel itself runs on sm_80+, FP8 on sm_89+; only Hopper is measured);

and the call's operands have 16-byte aligned rows (base and row pitch of a and b, :func:`operands_fit`);
otherwise the Gemm's own kernel runs, exactly as before. ``build(..., weight_streaming=False)`` turns it off.
Out, scales (any strides), streams and return kinds behave as for the Gemm's own kernel.

Example::

    g = deepgemm_jit.build(1, 2112, 7168, dtype="bf16")
    d = g(x, w)           # x (1, 7168), w (2112, 7168): runs the weight-streaming kernel
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import cubin, device, dtypes, gemv_rows, jit
from . import launch as launch_mod
from .arrays import MatrixView, ScaleView
from .launch import LaunchPlan, scale_args
from .render import RenderedSource
from .spec import GemmSpec

MAX_M = 16                # what the kernel takes: two n8 token tiles of mma.sync
# What the dispatch gives it: one token tile. From 9 rows on, the Hopper family's tiles were as fast or faster on the
# H200: 16-bit weights since session 5 (bench/results/*decode-2f5dc04-dirty*, *exp-splitk-sweep-bf16*), FP8 since
# the tiles load B evict-first (session 11, *exp-ab-gemv-vs-tiles-ef*: M = 16 FP8 tensor 7168x16384 36.9 vs 41.1 us,
# 4096x7168 14.8 vs 16.3, 2112x7168 12.1 vs 13.1; FP8 block alike or equal). The second token tile stays in the
# kernel (GPU-tested by raising this limit) for a future where it wins again.
DISPATCH_MAX_M = 8
# Weights the tiles stream faster at every M: N >= TILES_MIN_N and K >= TILES_MIN_K_16BIT (bf16 / fp16) or
# TILES_MIN_K_FP8. Same-run A/B at M = 1 and 8 with the evict-first B loads (session 11, *exp-ab-gemv-vs-tiles-ef*):
# tiles faster on 7168x16384 (BF16 66.5 vs 68.1 us, FP8 36.5 vs 38.9), 7168x2048 (BF16 14.0 vs 14.6, FP8 equal) and
# FP8 24576x1536 (16.2 vs 18.8); weight streaming faster on 2112x7168 (10-19%), 32768x512 (4-11%), BF16 24576x1536
# (2-4%); 4096x7168 within +-4% either way (kept on weight streaming).
TILES_MIN_N = 7168
TILES_MIN_K_16BIT = 2048
TILES_MIN_K_FP8 = 1536
# FP8 weights with N >= TILES_MIN_N and a K row of at most TILES_MAX_SHORT_K_FP8 bytes go to the tiles as well, which
# run 64x64 there (sm90_rules._sm90_decode_short_k): same-call A/B on the H200, session 19 (bench/results/
# *exp-ab-fp8-32768x512-gemv-vs-64x64-s19*): 32768x512 block M = 1 11.23 vs 11.57 us, M = 8 11.49 vs 12.00; per-tensor
# M = 8 11.34 vs 11.55 (session 11's 4-11% for weight streaming there was against the wider tiles of that time).
TILES_MAX_SHORT_K_FP8 = 512
BLOCK_ROWS = 16           # weight rows per row block (gemv::kBlockRows)
STEP_BYTES = 256          # bytes of each row a warp reads per step (gemv::kStepBytes)
NUM_WARPS = 8             # warps per CTA (gemv::kNumWarps)
MIN_STEPS_PER_WARP = 2    # below this, splitting K across more warps only adds reduction work
WEIGHT_DTYPES = dtypes.DECODE_WEIGHT_DTYPES
OUT_DTYPES = dtypes.DECODE_OUT_DTYPES
SYMBOLS = ("num_threads", "num_warps", "block_rows", "step_bytes")

_TEMPLATE = "gemv.cu.j2"
_ENTRY = "dgjit_gemv"
_SCALING_CPP = {"none": "kNone", "tensor": "kTensor", "row": "kRow", "block": "kBlock"}


@dataclass(frozen=True)
class GemvSpec:
    """What one weight-streaming kernel is compiled for; M, N, K, pointers and strides are run-time arguments.

    w_dtype: the weight B (the MMA's A side); x_dtype: the activations A; token_tiles: 1 for M <= 8, 2 for
    M <= 16 (the accumulator registers of the second n8 tile cost occupancy, so M <= 8 does not carry them).
    """

    w_dtype: str
    x_dtype: str
    out_dtype: str
    scaling: str = "none"
    token_tiles: int = 1

    def __post_init__(self):
        dtypes.check_decode_types(self.w_dtype, self.x_dtype, self.out_dtype, self.scaling)
        if self.token_tiles not in (1, 2) or isinstance(self.token_tiles, bool):
            raise ValueError(f"token_tiles={self.token_tiles!r} must be 1 or 2")

    @property
    def scaling_cpp(self) -> str:
        return _SCALING_CPP[self.scaling]

    @property
    def entry(self) -> str:
        return _ENTRY

    @property
    def max_m(self) -> int:
        return 8 * self.token_tiles

    @property
    def ctas_per_sm(self) -> int:
        """CTAs an SM holds at once, which the kernel's launch bounds promise (the entry's second
        __launch_bounds__ argument): two (<= 128 registers) for 16-bit weights and one token tile, where that
        does not spill; FP8 (conversions, scales) and the second token tile need more registers (ptxas: 164-254)."""
        return 2 if self.token_tiles == 1 and self.w_dtype not in dtypes.FP8_DTYPES else 1

    @property
    def tag(self) -> str:
        types = self.x_dtype if self.x_dtype == self.w_dtype else f"{self.x_dtype}x{self.w_dtype}"
        scaled = "" if self.scaling == "none" else f"_{self.scaling}"
        return f"gemv_{types}{scaled}_{self.out_dtype}_t{self.token_tiles}"

    @classmethod
    def for_gemm(cls, spec: GemmSpec, m: int) -> "GemvSpec":
        """The kernel a call of `spec` with M = `m` (1..MAX_M) runs."""
        return cls(w_dtype=spec.b_dtype, x_dtype=spec.dtype, out_dtype=spec.out_dtype, scaling=spec.scaling,
                   token_tiles=1 if m <= 8 else 2)


def max_m(spec: GemmSpec, arch: str) -> int:
    """The largest M for which a Gemm of `spec` compiled for `arch` runs a decode kernel of this module (0: never):
    the row sweep's (gemv_rows.max_m) or the mma.sync kernel's (:func:`mma_max_m`), whichever reaches further."""
    return max(mma_max_m(spec, arch), gemv_rows.max_m(spec, arch))


def mma_max_m(spec: GemmSpec, arch: str) -> int:
    """The largest M for which a Gemm of `spec` compiled for `arch` runs this module's mma.sync kernel (0: never;
    the row sweep may still take the smallest M). The rule is the module docstring's."""
    if spec.layout != "nt" or spec.epilogue != "none" or device.arch_number(arch) < 90:
        return 0
    if spec.dtype not in WEIGHT_DTYPES or spec.b_dtype not in WEIGHT_DTYPES or spec.out_dtype not in OUT_DTYPES:
        return 0
    fp8 = spec.b_dtype in dtypes.FP8_DTYPES
    tiles_min_k = TILES_MIN_K_FP8 if fp8 else TILES_MIN_K_16BIT
    if spec.n >= TILES_MIN_N and (spec.k >= tiles_min_k or (fp8 and spec.k <= TILES_MAX_SHORT_K_FP8)):
        return 0
    return DISPATCH_MAX_M


def use_weight_streaming(spec: GemmSpec, m: int, arch: str = "sm_90a") -> bool:
    """Whether a call of a Gemm of `spec` (compiled for `arch`) with M = `m` runs the weight-streaming kernel,
    given operands with 16-byte aligned rows (:func:`operands_fit`).

    >>> use_weight_streaming(GemmSpec.create(2112, 7168, "bf16"), 1)
    True
    >>> use_weight_streaming(GemmSpec.create(7168, 16384, "bf16"), 3)
    False
    """
    return 1 <= m <= max_m(spec, arch)


def kernel_for(spec: GemmSpec, m: int, arch: str = "sm_90a") -> "GemvSpec | gemv_rows.GemvRowsSpec":
    """The decode kernel a call of `spec` with M = `m` runs, given :func:`use_weight_streaming`: the row sweep's
    where its rule takes M, else this module's mma.sync kernel.

    >>> [kernel_for(GemmSpec.create(2112, 7168, "bf16"), m).tag for m in (1, 2, 8)]
    ['gemv_rows_bf16_bf16_m1_224x4', 'gemv_rows_bf16_bf16_m2_224x4', 'gemv_bf16_bf16_t1']
    """
    if m <= gemv_rows.max_m(spec, arch):
        return gemv_rows.GemvRowsSpec.for_gemm(spec, m)
    return GemvSpec.for_gemm(spec, m)


def operands_fit(va: MatrixView, vb: MatrixView) -> bool:
    """16-byte loads of a and b: 16-byte aligned bases and row pitches (a single row has no pitch)."""
    for view in (va, vb):
        if view.ptr % 16 or (view.rows > 1 and (view.row_stride * view.itemsize) % 16):
            return False
    return True


def choose_warps_k(k: int, element_bytes: int, n: int | None = None, resident_ctas: int | None = None) -> int:
    """How many warps of a CTA split the K of one row block (1, 2, 4 or 8).

    At most as many as keep MIN_STEPS_PER_WARP steps of STEP_BYTES each (short K: several row blocks per CTA).
    Given N and how many CTAs the GPU holds at once (`resident_ctas`: SMs x GemvSpec.ctas_per_sm), the largest of
    those whose grid runs in one wave: a second, partial wave of CTAs left the weight stream underfed at its end.
    H200 sweep (bench/results/*exp-gemv-warps-k*): 7168x16384 BF16 M = 1 70.1 -> 66.3 us at warps_k 4 instead of 8
    (448 -> 224 CTAs, two per SM); FP8 block 44.9 -> 39.7 us at 2 (112 CTAs, one per SM); FP8 block M = 16,
    4096x7168 21.8 -> 16.9 us at 4. Not below 2 warps per row block: one wave of warps_k = 1 grids ran 2-4% slower
    than the K-step rule's 4 and 2 (BF16 24576x1536, 32768x512). Where no choice fits one wave, the K-step rule's
    answer stands."""
    num_steps = -(-k * element_bytes // STEP_BYTES)
    cap = NUM_WARPS
    while cap > 1 and num_steps < MIN_STEPS_PER_WARP * cap:
        cap //= 2
    if n is None or resident_ctas is None:
        return cap
    warps_k, floor = cap, min(cap, 2)
    while warps_k > floor and grid_size(n, warps_k) > resident_ctas:
        warps_k //= 2
    return warps_k if grid_size(n, warps_k) <= resident_ctas else cap


def grid_size(n: int, warps_k: int) -> int:
    """CTAs of a launch: ceil(row blocks / row blocks per CTA)."""
    row_blocks = -(-n // BLOCK_ROWS)
    per_cta = NUM_WARPS // warps_k
    return -(-row_blocks // per_cta)


# -- compile ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GemvArtifact(jit.BuiltKernel):
    """A compiled weight-streaming kernel: the cached cubin and what it was built for."""

    spec: GemvSpec
    arch: str


_family: jit.KernelFamily[GemvArtifact] = jit.KernelFamily(_TEMPLATE, GemvArtifact, "gemv_spec")


def render_kernel(spec: GemvSpec) -> RenderedSource:
    return _family.render(spec)


def get_kernel(spec: GemvSpec, arch: str) -> GemvArtifact:
    """The kernel of `spec` for `arch`: from the in-process memo, the disk cache, or NVRTC (once)."""
    if spec.w_dtype in dtypes.FP8_DTYPES and device.arch_number(arch) < 89:
        raise ValueError(f"{spec.tag}: FP8 mma.sync needs sm_89 or newer, not {arch}")
    return _family.get(spec, arch)


def clear_memo() -> None:
    _family.clear()


def kernel_symbols(artifact: GemvArtifact) -> dict[str, int]:
    """The sizes the compiled kernel exports (read from the cubin on the host)."""
    return cubin.entry_symbols(artifact.cubin, artifact.entry, SYMBOLS)


def check_symbols(artifact: GemvArtifact) -> None:
    """This module's copy of the kernel's sizes must be the kernel's (a mismatch is a bug, caught before any
    launch)."""
    sym = kernel_symbols(artifact)
    mine = {"num_threads": 32 * NUM_WARPS, "num_warps": NUM_WARPS, "block_rows": BLOCK_ROWS,
            "step_bytes": STEP_BYTES}
    if sym != mine:
        raise RuntimeError(f"{artifact.spec.tag}: the kernel exports {sym}, gemv.py assumes {mine}")


# -- launch -----------------------------------------------------------------------------------------------

def plan(spec: GemmSpec, arch: str, m: int, va: MatrixView, vb: MatrixView, vd: MatrixView, device_id: int,
         sa: ScaleView | None = None, sb: ScaleView | None = None) -> LaunchPlan:
    """A ``launch.LaunchPlan`` of the decode kernel :func:`kernel_for` names, for validated operands (1 <= m <=
    MAX_M, :func:`operands_fit` true, scales as ``Gemm`` validated them). Compiles or loads the kernel on first
    use."""
    if m <= gemv_rows.max_m(spec, arch) and operands_fit(va, vb):
        return gemv_rows.plan(spec, arch, m, va, vb, vd, device_id, sa, sb)
    if not 1 <= m <= MAX_M:
        raise ValueError(f"M={m}: the weight-streaming kernel takes 1 <= M <= {MAX_M}")
    if not operands_fit(va, vb):
        raise ValueError("a and b need 16-byte aligned rows for the weight-streaming kernel")
    artifact = get_kernel(GemvSpec.for_gemm(spec, m), arch)
    check_symbols(artifact)
    warps_k = launch_warps_k(spec, artifact.spec, device.num_sms(device_id))
    grid = (grid_size(spec.n, warps_k), 1, 1)
    args = (np.uint64(vb.ptr), np.int64(vb.row_stride * vb.itemsize), np.uint64(va.ptr),
            np.int64(va.row_stride * va.itemsize), np.uint64(vd.ptr), np.int64(vd.row_stride)
            ) + scale_args(sa, sb) + (np.uint32(m), np.uint32(spec.n), np.uint32(spec.k), np.uint32(warps_k))
    return launch_mod.decode_plan(artifact, arch, grid, (32 * NUM_WARPS, 1, 1), args, device_id)


def predicted_us(n: int, k: int, element_bytes: int, bandwidth_tb_s: float = 4.0) -> float:
    """The time of reading the weight once at `bandwidth_tb_s` (the target; 4.25 TB/s is a copy's speed)."""
    return n * k * element_bytes / (bandwidth_tb_s * 1e12) * 1e6


def launch_warps_k(spec: GemmSpec, gemv_spec: GemvSpec, num_sms: int) -> int:
    """The warps_k a call of `spec` runs `gemv_spec`'s kernel with on a GPU of `num_sms` SMs (plan, explain)."""
    return choose_warps_k(spec.k, dtypes.get(spec.b_dtype).storage_bytes, spec.n, num_sms * gemv_spec.ctas_per_sm)


__all__ = ["MAX_M", "GemvSpec", "use_weight_streaming", "max_m", "mma_max_m", "kernel_for", "operands_fit",
           "choose_warps_k", "launch_warps_k", "plan", "get_kernel"]
