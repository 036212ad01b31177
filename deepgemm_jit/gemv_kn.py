"""Weight streaming for decode with the weight stored (K, N) (layouts nn and tn): D (M, N) = A @ B, M <= 8, at the
speed of reading B once.

gemv.py streams weights stored (N, K) (layout nt: PyTorch's nn.Linear); weights stored (K, N), as JAX / Flax and
x @ W code keep them, go to the Hopper tiles, which in TF32 stream them at 0.7-0.9x cuBLAS at M = 1
(bench/results/*models-m1-bf16-tf32-nn-nt-s28*): TF32 calls with M <= 8 run this kernel instead. It reads each
weight row's columns in 16-byte chunks and multiplies with ``mma.sync`` in swap-AB form (16 weight columns on the
MMA's M side, the tokens on its N side); K is split across the 8 warps of a CTA and the CTAs of a thread-block
cluster, and the partial sums are reduced in a fixed order through shared and distributed shared memory (the same
bits on every run; nothing is allocated and nothing synchronises, so it is graph-capturable). Device logic and the
fragment layouts: ``templates/include/dgjit/gemv_kn.cuh``.

Dispatch (:func:`max_m`): ``Gemm.__call__`` launches this kernel instead of its own when the call's M is at most
:data:`DISPATCH_MAX_M` and the Gemm is

- layout ``nn`` or ``tn`` (B stored (K, N); A stored (M, K) or (K, M): read through its strides), no fused epilogue;
- tf32 (operands rounded to nearest, FP32 accumulation; the kernel also takes bf16 / fp16, which the Hopper tiles
  stream faster: see STREAM_DTYPES), output bf16 / fp16 / fp32;
- N a whole number of 16-byte chunks, compiled for sm_90 or newer (thread-block clusters);
- a grid whose last (or only) wave of CTAs is nearly full (:func:`fills_its_last_wave`, MIN_LAST_WAVE: a
  partly empty one left the tiles faster);

and the call's B has 16-byte aligned rows (:func:`operands_fit`); otherwise the Gemm's own kernel runs, exactly as
before. ``build(..., weight_streaming=False)`` turns it off.

Example::

    g = deepgemm_jit.build(1, 4096, 4096, dtype="tf32", layout="nn")
    d = g(x, w)           # x (1, 4096), w (4096, 4096) float32 stored (K, N): runs this kernel
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import cubin, device, dtypes, jit, sm90_tiles
from . import launch as launch_mod
from .arrays import MatrixView
from .launch import LaunchPlan
from .render import RenderedSource
from .spec import GemmSpec

MAX_M = 8                 # the MMA's N side
DISPATCH_MAX_M = 8
NUM_WARPS = 8             # warps per CTA (gemv_kn::kNumWarps)
CTAS_PER_SM = 2           # the kernel's launch bounds (<= 128 registers: no spill)
CHUNK_BYTES = 16          # one ld.v4 per lane and row
BLOCK_BYTES = 256         # bytes of each weight row a CTA reads (two 16-byte chunks per lane, 8 quads)
STEP_K = {2: 16, 4: 8}    # K rows per MMA step by element bytes (m16n8k16, m16n8k8)
CLUSTERS = (1, 2, 4, 8)
MIN_STEPS_PER_WARP = 4    # below this, a larger cluster only adds reduction work
# The grid should give (nearly) every SM a CTA; more CTAs were slower. H200, M = 1, every cluster size timed
# (bench/results/*exp-gemv-kn-clusters-s28*), the best: TF32 4096x4096 (64 column blocks) c2 28.3 us (c4 35.3),
# 4096x14336 c2 78.4 (c4 98.2, c8 89.7), 7168x8192 (112) c2 69.1 (c1 81.4), 4608x3584 (72) c2 29.8 (c1 37.0),
# 1280x8192 (20) c8 21.3 (c4 25.4), 28672x4096 (448) c1 131.7; BF16 alike (4096x4096: c4, 3584x18944: c8). Where one
# CTA per column block would do (125-132 blocks), two ran faster (*exp-gemv-kn-c1-c2-s28*: 8192x3584 (128) c2 39.7 vs
# c1 42.7, 8192x1024 17.2 vs 17.6): cluster 1 only past one CTA per SM.
MIN_FILL = 0.95
WEIGHT_DTYPES = ("bf16", "fp16", "tf32")
# What calls stream: TF32 only. The 16-bit kernels are correct (GPU-tested by widening this) but ran 1.1-1.4x slower
# than the Hopper tiles at every cluster size on six models shapes (BF16 M = 1, same run: 8192x3584 26.3 vs 21.7 us
# at its best cluster, 37888x3584 94.4 vs 76.5, 4096x4096 20.5 vs 17.6); TF32 beat them on all six (4096x14336 78.4
# vs 88.0, 28672x4096 131.7 vs 153.8): the tiles' TF32 main loop needs twice the stages per byte.
STREAM_DTYPES = ("tf32",)
# At cluster 1 (more column blocks than SMs), a grid whose last (or only) wave fills less than this share of the
# CTA slots (CTAS_PER_SM per SM) left the Hopper tiles ahead (TF32 M = 1, same run): past one wave
# (*exp-gemv-kn-waves-s29*) 18944x4096, last wave 56% full, 119.8 vs tiles 101.5 us; 22528x4096 67%, 122.7 vs
# 106.4; 24576x4096 73%, 123.5 vs 112.3; 37888x3584 75%, 167.8 vs 148.7; within one (*exp-gemv-kn-one-wave-band-s29*)
# 10240x4096 61%, 56.9 vs 53.8; 11008x4096 65%, 57.9 vs 55.0; 12288x4096 73%, 62.0 vs 58.5. Fuller grids stream
# faster: 13824x5120 82%, 80.7 vs 86.7; 14336x4096 85%, 67.8 vs 70.9; 28672x4096 85%, 130.7 vs 137.9; 32768x4096
# and 49152x4096 97%. A larger cluster only narrowed the first group (18944x4096 c4 98.8, 22528x4096 c2 110.3,
# 24576x4096 c2 116.4, 37888x3584 c2 160.1; within one wave c2 was slower than c1), so those rows do not stream.
MIN_LAST_WAVE = 0.8
OUT_DTYPES = ("bf16", "fp16", "fp32")
SYMBOLS = ("num_threads", "block_cols", "cluster", "ctas_per_sm")

_TEMPLATE = "gemv_kn.cu.j2"
_ENTRY = "dgjit_gemv_kn"


@dataclass(frozen=True)
class GemvKnSpec:
    """What one kernel is compiled for; M, N, K, pointers and strides are run-time arguments. `cluster`: the CTAs
    of a thread-block cluster that split K (compiled in: ``__cluster_dims__``)."""

    w_dtype: str
    out_dtype: str
    cluster: int = 1

    def __post_init__(self):
        if self.w_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"w_dtype={self.w_dtype!r} is not one of {', '.join(WEIGHT_DTYPES)}")
        if self.out_dtype not in OUT_DTYPES:
            raise ValueError(f"out_dtype={self.out_dtype!r} is not one of {', '.join(OUT_DTYPES)}")
        if self.cluster not in CLUSTERS or isinstance(self.cluster, bool):
            raise ValueError(f"cluster={self.cluster!r} must be one of {CLUSTERS}")

    @property
    def entry(self) -> str:
        return _ENTRY

    @property
    def max_m(self) -> int:
        return MAX_M

    @property
    def block_cols(self) -> int:
        """Weight columns per CTA."""
        return BLOCK_BYTES // dtypes.get(self.w_dtype).storage_bytes

    @property
    def tag(self) -> str:
        return f"gemv_kn_{self.w_dtype}_{self.out_dtype}_c{self.cluster}"

    @classmethod
    def for_gemm(cls, spec: GemmSpec, num_sms: int) -> "GemvKnSpec":
        """The kernel calls of `spec` run on a GPU of `num_sms` SMs."""
        return cls(w_dtype=spec.b_dtype, out_dtype=spec.out_dtype,
                   cluster=choose_cluster(spec.n, spec.k, dtypes.get(spec.b_dtype).storage_bytes, num_sms))


def column_blocks(n: int, element_bytes: int) -> int:
    """CTAs along N: BLOCK_BYTES of each weight row per CTA."""
    return -(-n * element_bytes // BLOCK_BYTES)


def choose_cluster(n: int, k: int, element_bytes: int, num_sms: int) -> int:
    """CTAs per cluster (K split across them): the smallest whose grid gives MIN_FILL of the SMs a CTA (1 only where
    the column blocks alone outnumber the SMs), at most the largest that leaves each warp MIN_STEPS_PER_WARP steps
    of K."""
    col_blocks = column_blocks(n, element_bytes)
    steps = -(-k // STEP_K[element_bytes])
    cluster = 1
    for c in CLUSTERS:
        if steps < MIN_STEPS_PER_WARP * NUM_WARPS * c:
            break
        cluster = c
        if col_blocks * c >= MIN_FILL * num_sms and (c > 1 or col_blocks > num_sms):
            break
    return cluster


def fills_its_last_wave(n: int, k: int, element_bytes: int, num_sms: int) -> bool:
    """Whether the grid's last (or only) wave fills at least MIN_LAST_WAVE of the CTA slots (CTAS_PER_SM per SM)
    where its column blocks alone outnumber the SMs (cluster 1); grids whose cluster splits K to fill the SMs, and
    small ones that K leaves at cluster 1 (choose_cluster), are not held to it."""
    col_blocks = column_blocks(n, element_bytes)
    if choose_cluster(n, k, element_bytes, num_sms) > 1 or col_blocks <= num_sms:
        return True
    slots = CTAS_PER_SM * num_sms
    return col_blocks / (slots * -(-col_blocks // slots)) >= MIN_LAST_WAVE


def max_m(spec: GemmSpec, arch: str, num_sms: int = sm90_tiles.DEFAULT_SM90_NUM_SMS) -> int:
    """The largest M for which a Gemm of `spec` compiled for `arch` runs this kernel on a GPU of `num_sms` SMs
    (0: never): the module docstring's rule."""
    if spec.layout not in ("nn", "tn") or spec.epilogue != "none" or spec.grouped or spec.hi_lo or spec.raw_b:
        return 0
    if spec.promoted:  # the kernel accumulates through all of K in the tensor cores: promoted=True's contract is
        return 0       # FP32 partial sums every K block, which the tile kernels keep
    if device.arch_number(arch) < 90:
        return 0
    if spec.dtype not in STREAM_DTYPES or spec.b_dtype != spec.dtype or spec.out_dtype not in OUT_DTYPES:
        return 0
    element_bytes = dtypes.get(spec.b_dtype).storage_bytes
    if (spec.n * element_bytes) % CHUNK_BYTES:
        return 0
    if not fills_its_last_wave(spec.n, spec.k, element_bytes, num_sms):
        return 0
    steps = -(-spec.k // STEP_K[element_bytes])
    if steps * NUM_WARPS * choose_cluster(spec.n, spec.k, element_bytes, num_sms) >= 1 << 32:
        return 0  # the kernel splits K as steps * part / parts in 32 bits (K of ~5e8 and more): the tiles serve
    return DISPATCH_MAX_M


def operands_fit(va: MatrixView, vb: MatrixView) -> bool:
    """16-byte loads of the weight: a 16-byte aligned base and row pitch (a single row has no pitch); A is read
    element by element (gemv.operands_fit's signature)."""
    return vb.ptr % 16 == 0 and (vb.rows == 1 or (vb.row_stride * vb.itemsize) % 16 == 0)


# -- compile ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GemvKnArtifact(jit.BuiltKernel):
    """A compiled kernel: the cached cubin and what it was built for."""

    spec: GemvKnSpec
    arch: str


_family: jit.KernelFamily[GemvKnArtifact] = jit.KernelFamily(_TEMPLATE, GemvKnArtifact, "gemv_kn_spec")


def render_kernel(spec: GemvKnSpec) -> RenderedSource:
    return _family.render(spec)


def get_kernel(spec: GemvKnSpec, arch: str) -> GemvKnArtifact:
    """The kernel of `spec` for `arch`: from the in-process memo, the disk cache, or NVRTC (once)."""
    return _family.get(spec, arch)


def clear_memo() -> None:
    _family.clear()


def check_symbols(artifact: GemvKnArtifact) -> None:
    """This module's copy of the kernel's sizes must be the kernel's (a mismatch is a bug, caught before any
    launch)."""
    sym = cubin.entry_symbols(artifact.cubin, artifact.entry, SYMBOLS)
    mine = {"num_threads": 32 * NUM_WARPS, "block_cols": artifact.spec.block_cols, "cluster": artifact.spec.cluster,
            "ctas_per_sm": CTAS_PER_SM}
    if sym != mine:
        raise RuntimeError(f"{artifact.spec.tag}: the kernel exports {sym}, gemv_kn.py assumes {mine}")


# -- launch -----------------------------------------------------------------------------------------------

def grid(spec: GemmSpec, kernel: GemvKnSpec) -> tuple[int, int, int]:
    return (-(-spec.n // kernel.block_cols), kernel.cluster, 1)


def plan(spec: GemmSpec, arch: str, m: int, va: MatrixView, vb: MatrixView, vd: MatrixView, device_id: int,
         sa=None, sb=None) -> LaunchPlan:
    """A ``launch.LaunchPlan`` of this kernel for validated operands (1 <= m <= MAX_M, :func:`operands_fit` true;
    no scales: `sa` / `sb` must be None, as in gemv.plan's signature). Compiles or loads the kernel on first use."""
    if not 1 <= m <= MAX_M:
        raise ValueError(f"M={m}: the weight-streaming kernel takes 1 <= M <= {MAX_M}")
    if not operands_fit(va, vb):
        raise ValueError("b needs 16-byte aligned rows for the weight-streaming kernel")
    if sa is not None or sb is not None:
        raise ValueError("the (K, N) weight-streaming kernel takes no scales")
    artifact = get_kernel(GemvKnSpec.for_gemm(spec, device.num_sms(device_id)), arch)
    check_symbols(artifact)
    # A's element (token, k): A stored (M, K) (nn) or (K, M) (tn), rows of row_stride elements.
    x_sm, x_sk = (va.row_stride, 1) if spec.a_k_major else (1, va.row_stride)
    args = (np.uint64(vb.ptr), np.int64(vb.row_stride * vb.itemsize), np.uint64(va.ptr), np.int64(x_sm),
            np.int64(x_sk), np.uint64(vd.ptr), np.int64(vd.row_stride), np.uint32(m), np.uint32(spec.n),
            np.uint32(spec.k))
    return launch_mod.decode_plan(artifact, arch, grid(spec, artifact.spec), (32 * NUM_WARPS, 1, 1), args,
                                  device_id)


def describe(spec: GemmSpec, arch: str, num_sms: int) -> dict:
    """What a call with M <= max_m runs (for ``explain``): the kernel and its launch shape on a GPU of `num_sms`
    SMs. Not compiled here (as for gemv's, explain stays cheap and works offline): the first such call builds it,
    or get_kernel / warmup."""
    kernel = GemvKnSpec.for_gemm(spec, num_sms)
    return {"max_m": max_m(spec, arch, num_sms), "kernels": [kernel.tag], "cluster": kernel.cluster,
            "grid": grid(spec, kernel)[0] * kernel.cluster, "num_threads": 32 * NUM_WARPS}


__all__ = ["MAX_M", "GemvKnSpec", "max_m", "operands_fit", "choose_cluster", "fills_its_last_wave", "plan",
           "get_kernel", "describe"]
