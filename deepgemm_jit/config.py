"""Kernel configurations and the heuristic that picks one (pure Python, no GPU).

A config is everything compile-time about *how* a spec is computed: family, tile
shape, pipeline depth, warp layout and the vector width of global loads.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from . import dtypes, env
from .spec import GemmSpec

FAMILIES = ("sm80", "sm90")
# Hopper's per-block opt-in maximum is 232,448 B; the sm90 family stays 1 KiB under it because the
# driver reserves 1 KiB of system shared memory per block (cuobjdump shows SHARED:1024).
SM90_SMEM_BUDGET_BYTES = 232448 - 1024
# SM count assumed when compiling for sm_90a without a GPU (H100 SXM / H200); with a GPU the
# device's own count is used.
DEFAULT_SM90_NUM_SMS = 132
# Input types whose operands the sm90 family also takes MN-major (layouts nn, tn, tt): wgmma's trans immediates
# exist for 16-bit operands only; tf32 and 8-bit operands are read K-major (layout nt).
SM90_MN_MAJOR_DTYPES = ("bf16", "fp16")
# An MN-major operand arrives in TMA boxes of 128 bytes of M / N (the swizzle span): 64 16-bit elements, so its tile
# extent (block_n for B, block_m for A) is a multiple of this (TF32 B transposed in the kernel: 32, sm90_mn_block).
SM90_MN_BLOCK = 64


def sm90_mn_block(spec: GemmSpec) -> int:
    """Elements of M / N per 128-byte TMA box of an MN-major operand of the spec's input type."""
    return 128 // dtypes.get(spec.dtype).storage_bytes
# Opt-in dynamic shared memory per block on sm_80 / sm_90 (bytes).
SMEM_LIMIT_BYTES = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024, "sm_90": 227 * 1024}


def smem_limit_bytes(arch: str) -> int:
    base = arch.rstrip("a")
    return SMEM_LIMIT_BYTES.get(base, 99 * 1024)


MAX_GROUP_M = 256            # sm90 raster bands (sched_sm90.cuh): far above any useful band (the heuristic's 16)
MAX_THREADS_PER_CTA = 1024   # CUDA's limit (the portable family's 32 * warps_m * warps_n)
MAX_GRID_Y = 65535           # CUDA's limit on grid.y (the portable family's N blocks)
# The portable kernel's accumulators per thread: 128 (64x64 per warp) compiled without a stack (bf16 / tf32, ptxas
# of 2026-12-02); 256 spilled 288-984 bytes and 512 (a 128x128 tile on one warp) 2504-3480.
SM80_MAX_ACCUMULATORS = 128


@dataclass(frozen=True)
class KernelConfig:
    family: str
    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    warps_m: int
    warps_n: int
    vec_a: int  # sm80: elements per global load of A (16 bytes / element size when aligned)
    vec_b: int
    group_m: int = 1  # sm90: M blocks walked together by the persistent scheduler (L2 reuse)
    # sm90: the two consumer warpgroups take turns on whole tiles (one's epilogue runs while the other's
    # main loop keeps the tensor cores busy) instead of splitting every tile between them.
    pingpong: bool = False
    # sm90: split-K kernel: each tile's K blocks may be shared among CTAs (how many is chosen per call, see
    # splitk.py), for problems with fewer tiles than SMs.
    split_k: bool = False
    # sm90: D leaves each consumer through a ring of this many 64- or 128-byte column slices of shared memory, each
    # stored by TMA as soon as it is written, instead of a staging tile of the consumer's whole part of D; 0: whole
    # tile.
    # The 64-128 KB a staged FP32 tile takes become pipeline stages (sm90_d_ring says where).
    d_ring: int = 0
    # sm90: the wgmmas compute each tile transposed (D^T = B A^T): B's rows are the instruction's M (64 per consumer,
    # block_n 64 / 128 / 192) and A's its N, so block_m may be any multiple of 8 up to 256 (sm90_swap_ab_problem says
    # which specs). For an M that whole 64-row blocks fit badly.
    swap_ab: bool = False

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family={self.family!r} is not one of {FAMILIES}")
        for name in ("block_m", "block_n", "block_k", "num_stages", "warps_m", "warps_n", "vec_a", "vec_b",
                     "group_m"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not isinstance(self.pingpong, bool):
            raise ValueError(f"pingpong must be a bool, got {self.pingpong!r}")
        if self.pingpong and self.family != "sm90":
            raise ValueError("pingpong consumers exist in the sm90 family only")
        if not isinstance(self.split_k, bool):
            raise ValueError(f"split_k must be a bool, got {self.split_k!r}")
        if self.split_k and (self.family != "sm90" or self.pingpong):
            raise ValueError("split_k kernels are sm90 kernels with cooperative tiles (pingpong=False)")
        if not isinstance(self.swap_ab, bool):
            raise ValueError(f"swap_ab must be a bool, got {self.swap_ab!r}")
        if self.swap_ab and (self.family != "sm90" or self.pingpong or self.split_k or self.d_ring):
            raise ValueError("swap_ab tiles are sm90 kernels with cooperative consumers, unsplit, D staged whole "
                             "(pingpong=False, split_k=False, d_ring=0)")
        if not isinstance(self.d_ring, int) or isinstance(self.d_ring, bool) or self.d_ring < 0 or self.d_ring == 1:
            raise ValueError(f"d_ring must be 0 (whole-tile staging) or a slice count >= 2, got {self.d_ring!r}")
        if self.d_ring and (self.family != "sm90" or sm90_consumers(self.block_m, self.pingpong)[1] != 64):
            raise ValueError("d_ring exists in the sm90 family, for consumers of 64 rows (cooperative tiles of 64 or "
                             f"128 rows, or ping-pong at block_m 64), got block_m={self.block_m}"
                             + (" ping-pong" if self.pingpong else ""))
        if self.num_stages < 2:
            raise ValueError("num_stages must be >= 2 (the pipeline keeps one stage in flight)")
        if self.group_m > MAX_GROUP_M:  # the scheduler multiplies it by the N blocks in 32 bits
            raise ValueError(f"group_m must be at most {MAX_GROUP_M} M blocks, got {self.group_m}")
        if self.family != "sm90" and 32 * self.warps_m * self.warps_n > MAX_THREADS_PER_CTA:
            raise ValueError(f"warps_m * warps_n = {self.warps_m * self.warps_n} warps: a CTA holds at most "
                             f"{MAX_THREADS_PER_CTA // 32}")
        if self.swap_ab and self.block_m % 8:  # the wgmma's N
            raise ValueError(f"block_m={self.block_m} is not a multiple of 8 (swapped tiles: the wgmmas' N)")
        if not self.swap_ab and self.block_m % (16 * self.warps_m):
            raise ValueError(f"block_m={self.block_m} is not a multiple of 16 * warps_m={self.warps_m}")
        if self.block_n % (8 * self.warps_n):
            raise ValueError(f"block_n={self.block_n} is not a multiple of 8 * warps_n={self.warps_n}")
        for name in ("vec_a", "vec_b"):
            if getattr(self, name) not in (1, 2, 4, 8, 16):
                raise ValueError(f"{name} must be 1, 2, 4, 8 or 16 elements (16 bytes at most)")

    @property
    def num_threads(self) -> int:
        if self.family == "sm90":
            return sm90_num_threads(self.block_m, self.pingpong, self.block_n if self.swap_ab else None)
        return 32 * self.warps_m * self.warps_n

    @property
    def tag(self) -> str:
        if self.family == "sm90":
            return (f"sm90_m{self.block_m}n{self.block_n}k{self.block_k}_s{self.num_stages}_g{self.group_m}"
                    + ("_pp" if self.pingpong else "") + ("_sk" if self.split_k else "")
                    + (f"_r{self.d_ring}" if self.d_ring else "") + ("_sw" if self.swap_ab else ""))
        return (f"{self.family}_m{self.block_m}n{self.block_n}k{self.block_k}_s{self.num_stages}"
                f"_w{self.warps_m}x{self.warps_n}_v{self.vec_a}{self.vec_b}")

    def smem_bytes(self, spec: GemmSpec) -> int:
        """Dynamic shared memory; mirrors kSmemBytes of the family's kernel (the GPU tests compare
        it with the value the sm90 module exports)."""
        if self.family == "sm90":
            return sm90_smem_bytes(spec, self.block_m, self.block_n, self.num_stages, self.pingpong, self.split_k,
                                   self.d_ring, self.swap_ab)
        esize = dtypes.get(spec.dtype).storage_bytes
        pad = 16 // esize
        a_rows, a_cols = (self.block_m, self.block_k) if spec.a_k_major else (self.block_k, self.block_m)
        b_rows, b_cols = (self.block_n, self.block_k) if spec.b_k_major else (self.block_k, self.block_n)
        stage = a_rows * (a_cols + pad) + b_rows * (b_cols + pad)
        return self.num_stages * stage * esize

    def fits(self, spec: GemmSpec, arch: str) -> bool:
        """Whether this config can compute `spec` on `arch` (check_for raises nothing)."""
        try:
            self.check_for(spec, arch)
        except ValueError:
            return False
        return True

    def check_for(self, spec: GemmSpec, arch: str) -> None:
        """Raise ValueError if this config cannot compute `spec` on `arch`."""
        if self.family == "sm90":
            _check_sm90(self, spec, arch)
            return
        if spec.grouped:  # the portable kernel has no group walk: it would multiply every row by group 0's weight
            raise ValueError("grouped GEMMs run on the sm90 family only")
        if dtypes.is_quantized(spec.dtype):
            raise ValueError(f"{spec.dtype} GEMMs run on the sm90 family only (Hopper's 8-bit WGMMA)")
        if spec.epilogue != "none":
            raise ValueError(f"fused epilogues ({spec.epilogue!r}) run on the sm90 family only")
        if spec.raw_b:
            raise ValueError("raw-B 3xTF32 GEMMs (GemmSpec.raw_b) run on the sm90 family only")
        esize = dtypes.get(spec.dtype).storage_bytes
        mma_k = 8 if spec.dtype == "tf32" else 16
        if self.block_k % mma_k:
            raise ValueError(f"block_k={self.block_k} must be a multiple of {mma_k} for {spec.dtype}")
        if spec.hi_lo and spec.k % (3 * self.block_k):  # gemm_sm80.cuh's static_assert
            segment = spec.k // 3
            raise ValueError(f"block_k={self.block_k}: the 3xTF32 GEMM's K' = {spec.k} holds three segments of "
                             f"{segment} columns, which must be whole K blocks (use a block_k dividing {segment})")
        accumulators = self.block_m // self.warps_m * (self.block_n // self.warps_n) // 32
        if accumulators > SM80_MAX_ACCUMULATORS:
            raise ValueError(f"config {self.tag}: each thread would hold {accumulators} accumulators, more than the "
                             f"{SM80_MAX_ACCUMULATORS} that fit its registers (more spill to local memory); use more "
                             "warps_m / warps_n or a smaller block")
        if -(-spec.n // self.block_n) > MAX_GRID_Y:  # the portable kernel's grid.y walks N blocks
            raise ValueError(f"N={spec.n} with block_n={self.block_n} makes {-(-spec.n // self.block_n)} column "
                             f"blocks, more than a grid's y dimension takes ({MAX_GRID_Y}); use a wider block_n")
        for name in ("vec_a", "vec_b"):
            vec = getattr(self, name)
            if vec * esize > 16:
                raise ValueError(f"{name}={vec} elements exceeds 16 bytes for {spec.dtype}")
        a_cols = self.block_k if spec.a_k_major else self.block_m
        b_cols = self.block_k if spec.b_k_major else self.block_n
        if a_cols % self.vec_a or b_cols % self.vec_b:
            raise ValueError("tile rows must hold whole vector chunks")
        if self.smem_bytes(spec) > smem_limit_bytes(arch):
            raise ValueError(
                f"config {self.tag} needs {self.smem_bytes(spec)} B of shared memory; "
                f"{arch} allows {smem_limit_bytes(arch)} B: lower num_stages or the block shape")


def sm90_consumers(block_m: int, pingpong: bool) -> tuple[int, int]:
    """(consumer warpgroups, rows each holds): one of 64 rows for a cooperative 64-row tile, two halves of a
    128/256-row tile, three thirds of a 192-row tile, or (ping-pong) two that each hold a whole tile (mirror of
    GemmSm90)."""
    if pingpong:
        return 2, block_m
    if block_m == 192:
        return 3, 64
    return (1, 64) if block_m == 64 else (2, block_m // 2)


def sm90_num_threads(block_m: int, pingpong: bool, swapped_block_n: int | None = None) -> int:
    """Threads of an sm90 CTA: the consumers and a producer warpgroup, at least three warpgroups (a 64-row tile's
    second one idles: the register split stays that of two consumers; mirror of GemmSm90::kNumThreads). A swapped
    tile (swapped_block_n: its block_n) has a consumer per 64 of its columns."""
    consumers = sm90_consumers(block_m, pingpong)[0] if swapped_block_n is None else swapped_block_n // 64
    return max(3, consumers + 1) * 128


def sm90_wg_split_k(spec: GemmSpec, block_m: int, pingpong: bool, swap_ab: bool = False) -> bool:
    """Whether a 64-row cooperative tile splits its K blocks between two consumer warpgroups (the second would
    otherwise idle), summed through shared memory before the epilogue: promoted FP8 with per-tensor or per-row
    scales, where it measured 2-9% faster (mirror of GemmSm90::kWGSplitK, which says why not the others). Not
    swapped tiles."""
    return (block_m == 64 and not pingpong and not swap_ab and spec.dtype in dtypes.FP8_DTYPES and spec.promote
            and spec.scaling in ("tensor", "row"))


def sm90_two_partial_sets(spec: GemmSpec, block_m: int, block_n: int, pingpong: bool, swap_ab: bool = False) -> bool:
    """Whether a promoted FP8 tile queues K block i + 1's wgmmas into a second partial set before promoting K block
    i (mirror of GemmSm90::kTwoPartialSets): tiles without K lanes whose consumer holds at most 64 accumulators
    per thread (64 / 128-row tiles up to 128 columns, ping-pong or 256-row tiles up to 64), where the extra set
    fits the registers. Measured on the H200 (session 18): FP8 per-tensor 4096x4096x7168 (128x128) 7% faster,
    fused quant_fp8_g128 (128x128) 3-9%, FP8 block 128x7168x16384 (64x128) 6%. A swapped tile's consumer holds
    block_m / 2: up to 128 rows."""
    if not (spec.dtype in dtypes.FP8_DTYPES and spec.promote):
        return False
    if swap_ab:
        return block_m // 2 <= 64
    _, rows = sm90_consumers(block_m, pingpong)
    return not sm90_wg_split_k(spec, block_m, pingpong) and (rows // 64) * (block_n // 2) <= 64


def sm90_half_partial_sets(spec: GemmSpec, block_m: int, block_n: int, pingpong: bool, swap_ab: bool = False) -> bool:
    """Whether a promoted per-tensor / per-row FP8 tile too wide for sm90_two_partial_sets issues each K block as two
    halves of block_n / 2 columns into their own partial sets (mirror of GemmSm90::kHalfSets): one m64 slice per
    consumer, halves a multiple of 8 wide, no K lanes and no fused epilogue. Block scaling keeps one set (1% slower
    with halves, session 19). Swapped tiles halve block_m (the wgmmas' N), the first half rounded up to 8 rows."""
    if not (spec.dtype in dtypes.FP8_DTYPES and spec.promote and spec.scaling != "block" and spec.epi.is_identity):
        return False
    if sm90_two_partial_sets(spec, block_m, block_n, pingpong, swap_ab):
        return False
    if swap_ab:
        return block_m >= 16
    _, rows = sm90_consumers(block_m, pingpong)
    return not sm90_wg_split_k(spec, block_m, pingpong) and rows == 64 and (block_n // 2) % 8 == 0


# Narrowest slice (bytes per row) a D ring takes, by D dtype (mirror of GemmSm90::kRingD): FP32 from 16 columns;
# 16-bit from 16 columns too (a chunk of the epilogue, two 8-column groups, must lie inside one slice).
_D_RING_MIN_SLICE_BYTES = {"fp32": 64, "bf16": 32, "fp16": 32}


def sm90_d_ring_problem(spec: GemmSpec, block_n: int, d_ring: int) -> str | None:
    """Why D cannot leave through a ring of `d_ring` slices (KernelConfig.d_ring), or None when it can (mirror of
    GemmSm90's static_assert): FP32 D in 64- or 128-byte slices (D tile width a multiple of 16), BF16 / FP16 D in
    32-byte or wider ones (a multiple of 16 columns), with more slices than the ring, not grouped (tiles ending
    inside their group are stored from the whole staged tile, store_rows), and no C / residual (TMA loads them into
    the staging tile)."""
    min_slice_bytes = _D_RING_MIN_SLICE_BYTES.get(spec.out_dtype)
    if min_slice_bytes is None:
        return f"out_dtype {spec.out_dtype!r} (the ring holds FP32, BF16 or FP16 slices)"
    out_cols = block_n // 2 if spec.epi.is_gated else block_n  # gated units: D tiles are half as wide
    esize = dtypes.get(spec.out_dtype).storage_bytes
    slice_bytes = sm90_d_slice_bytes(out_cols, esize)
    if slice_bytes < min_slice_bytes or out_cols * esize // slice_bytes <= d_ring:
        return (f"a D tile of {out_cols} {spec.out_dtype} columns is not more than {d_ring} slices of at least "
                f"{min_slice_bytes} bytes per row (its slices are {slice_bytes // esize} columns wide)")
    if spec.grouped:
        return "grouped GEMMs stage the whole tile (tiles ending inside their group)"
    if spec.epi.beta or spec.epi.residual:
        return "C / the residual are loaded into the whole staging tile"
    return None


SM90_D_RING = 2
# From the first bucket above 128 rows (192 since session 40; the rule was measured on the 256-row bucket, which then
# held every M from 129 on).
SM90_D_RING_MIN_M = 129


def sm90_d_ring(spec: GemmSpec, block_m: int, block_n: int, pingpong: bool = False, m_hint: int | None = None) -> int:
    """The heuristic's KernelConfig.d_ring for a tile: SM90_D_RING slices for TF32 with FP32 D where the ring applies
    and M (m_hint; None: large) is at least SM90_D_RING_MIN_M, for BF16 / FP16 where _sm90_16bit_ring_pays, else 0.
    A whole staged FP32 tile's 64-128 KB of shared memory held TF32 to 4-5 stages of 32 K and a 128x256 tile to 2;
    with the ring 128x256 runs 4 stages.
    H200 session 14 (bench/results/*tf32-d-ring-s14*): at M = 4096 2112x7168 357 -> 304 us (128x176), 4096x7168 651
    -> 594 and 4096^3 364 -> 335 (128x256); the same tile with and without the ring within +-3%. At M <= 128 the
    wider tiles it allows were 1-6% slower (128x7168x16384 135 -> 144 us). Promoted TF32 (fp32 = 3xTF32 over [hi |
    lo] operands) too since session 15 (bench/results/*fp32-ring-tiles-s15*): the model then takes 128x176 s5 (160
    at N = 32768) instead of 128x136-160 s4: 4096x2112x7168 1207 -> 1042 us, 8192^3 8843 -> 8718, 4096x7168x16384
    7768 -> 7658; 4096x4096x7168 +1%, 4096^3 +2.6%. (Before [hi | lo], session 14, 128x176 with the ring had lost
    up to 32%.) The raw-B GEMM (decode-size fp32) at every M: its stages are twice as large, and its tile sweep
    (session 16, *exp-fp32-raw-b-tiles-s16*) ran with the ring. DEEPGEMM_JIT_NO_D_RING=1 turns the rule off
    (experiments)."""
    if (sm90_consumers(block_m, pingpong)[1] != 64 or env.no_d_ring()
            or sm90_d_ring_problem(spec, block_n, SM90_D_RING) is not None):
        return 0
    if spec.dtype in ("bf16", "fp16"):
        return SM90_D_RING if _sm90_16bit_ring_pays(spec, block_m, block_n, pingpong, m_hint) else 0
    # TF32 with 16-bit D: not measured, keeps the whole tile; the 192-row bucket's 64-row tiles were measured without
    if (spec.dtype != "tf32" or spec.out_dtype != "fp32"
            or (m_hint is not None and m_hint < SM90_D_RING_MIN_M and not spec.raw_b)
            or (block_m == 64 and not pingpong and m_hint in SM90_ROWS64_UNSPLIT_BUCKETS and not spec.raw_b)):
        return 0
    return SM90_D_RING


# 16-bit GEMMs whose whole staged D tile leaves a wide cooperative tile this many stages or fewer take the ring where
# it adds a stage, for M buckets in [SM90_D_RING_MIN_M, SM90_D_RING_16BIT_MAX_M]; below SM90_D_RING_16BIT_MIN_K only
# up to SM90_D_RING_16BIT_SHORT_K_MAX_M rows.
SM90_D_RING_16BIT_MAX_STAGES = 3
SM90_D_RING_16BIT_MAX_M = 3968
SM90_D_RING_16BIT_MIN_K = 2048
SM90_D_RING_16BIT_SHORT_K_MAX_M = 512


def _sm90_16bit_ring_pays(spec: GemmSpec, block_m: int, block_n: int, pingpong: bool, m_hint: int | None) -> bool:
    """Whether a 16-bit tile takes SM90_D_RING slices (sm90_d_ring's rule for bf16 / fp16): 16-bit D, no gated unit
    (C and the residual already keep the whole tile: sm90_d_ring_problem), a cooperative 128-row tile whose whole
    staged D leaves it SM90_D_RING_16BIT_MAX_STAGES stages or fewer and the ring one more, at mid M (m_hint; None:
    large M) and long K.
    H200 session 22 (bench/results/*exp-16bit-d-ring*-s22*): forced 3 -> 4 stages of 128x240 at 800 x 4096 x 7168
    79.0 -> 72.3 us (cuBLAS 66.9; cuBLAS runs 128x224 at 4 stages there), at 2600 rows 231.1 -> 224.0; 128x176 4 -> 5
    stages gained 0.5-2%, 128x208 4 -> 5 at K = 2048 lost 3%; at M = 4096 128x256 3 -> 4 stages was -2..+4% (short K
    worst: 4096 x 32768 x 512 198.9 -> 207.6), where the kernels are power-bound. With bias, bias+gelu and bias+silu
    fused, the 12 rows the ring changed ran 3.7-10% faster (800 x 4096 x 7168 bias+gelu 84.2 -> 75.7 us; cuBLAS +
    torch ops 74.3). Gated units are not measured (nor GPU-tested with 16-bit D). Those M had partial last M blocks
    whose TMA zero fill the extra stage also hid; re-measured after the edge maps (session 23,
    *exp-16bit-d-ring-rule-after-edge-maps*): still faster on all 14 rows it changes, 1.001-1.077x (800 x 4096 x 7168
    75.8 -> 73.6 us)."""
    if (m_hint is None or not SM90_D_RING_MIN_M <= m_hint <= SM90_D_RING_16BIT_MAX_M or pingpong or block_m != 128
            or spec.epi.is_gated or spec.out_dtype not in ("bf16", "fp16")
            or (spec.k < SM90_D_RING_16BIT_MIN_K and m_hint > SM90_D_RING_16BIT_SHORT_K_MAX_M)):
        return False
    whole = _sm90_stages(spec, block_m, block_n, m_hint=m_hint, d_ring=0)
    return whole <= SM90_D_RING_16BIT_MAX_STAGES and _sm90_stages(spec, block_m, block_n, m_hint=m_hint,
                                                                    d_ring=SM90_D_RING) > whole


def sm90_smem_bytes(spec: GemmSpec, block_m: int, block_n: int, num_stages: int, pingpong: bool = False,
                    split_k: bool = False, d_ring: int = 0, swap_ab: bool = False) -> int:
    """D staging tile per consumer (d_ring: only that many of its column slices) (+ a residual tile when the
    epilogue reads both C and a residual) + stages x (A tile
    + B tile, 128 bytes of K per row; an MN-major operand's 64-wide boxes of block_k rows take the same bytes;
    raw_b: two of each) + full/empty (raw_b: and lo_full) barriers (+ 16 bytes of epilogue-operand barriers) +
    (block scaling) each stage's scales + (row scaling) each consumer's row and column scales + (bias) the
    tile's bias as FP32 per consumer (+ 16 bytes of split-K flags) (+ the second K lane's FP32 sums of a 64-row tile,
    sm90_wg_split_k) + 1 KiB alignment slack: the layout of GemmSm90 (gemm_sm90.cuh). Swapped tiles (swap_ab):
    block_n / 64 consumers each stage block_m rows of their 64 columns (the same D bytes), and row scaling's and the
    bias's buffers hold block_m rows and 64 columns a consumer."""
    num_math_wgs, wg_rows = sm90_consumers(block_m, pingpong)
    epi = spec.epi
    out_cols = block_n // 2 if epi.is_gated else block_n  # gated units: D tiles are half as wide (kOutCols)
    out_esize = dtypes.get(spec.out_dtype).storage_bytes
    d_row_bytes = d_ring * sm90_d_slice_bytes(out_cols, out_esize) if d_ring else out_cols * out_esize
    d_bytes = num_math_wgs * wg_rows * d_row_bytes
    epi_bytes = (d_bytes if epi.beta and epi.residual else 0) + (16 if epi.beta or epi.residual else 0)
    if swap_ab:  # a consumer's 64 columns, or all block_m rows
        epi_bytes += {"none": 0, "col": block_n * 4, "row": block_n // 64 * block_m * 4}[epi.bias]
    else:
        epi_bytes += {"none": 0, "col": num_math_wgs * block_n * 4, "row": num_math_wgs * wg_rows * 4}[epi.bias]
    scale_bytes = 0
    if spec.scaling == "block":  # per stage: block_m scales of A, the tile's B blocks, 16-byte slots
        b_blocks = 1 if 128 % block_n == 0 else (block_n // 128 if block_n % 128 == 0 else block_n // 128 + 2)
        scale_bytes = num_stages * -(-(block_m + b_blocks) // 4) * 16
    if spec.scaling == "row":
        scale_bytes = (block_n // 64 * (block_m + 64) if swap_ab else num_math_wgs * (wg_rows + block_n)) * 4
    split_bytes = 16 if split_k else 0
    lane_bytes = wg_rows * block_n * 4 if sm90_wg_split_k(spec, block_m, pingpong, swap_ab) else 0
    # raw_b: a stage holds A_hi and A_lo, the raw B block and its B_lo slot, and has a third barrier (lo_full);
    # trans_b: the raw (MN-major) B block and its K-major slot, and the third barrier.
    operand_tiles = 2 if spec.raw_b else 1
    trans_b = sm90_trans_b(spec)
    barrier_bytes = -(-(3 if spec.raw_b or trans_b else 2) * num_stages * 8 // 16) * 16
    return (d_bytes + num_stages * (operand_tiles * (block_m + block_n) + (block_n if trans_b else 0)) * 128
            + barrier_bytes + scale_bytes + epi_bytes + split_bytes + lane_bytes + 1024)


def sm90_max_accumulators(spec: GemmSpec, block_m: int = 128) -> int:
    """FP32/INT32 accumulators a consumer thread may hold within its 232 registers: 128, or 176 split into
    two sets when FP8 partial sums are promoted (the partial set and the running set; 128x192 spilled to
    the stack, 128x176 did not). The three consumers of a 192-row tile (512 threads) have 128 registers, ptxas's
    ceiling for the whole kernel: 96 (192x192; 192x208 did not compile), 64 where the epilogue loads C or a
    residual, or writes a gated unit's FP32 D (192x192 kept 24-136 bytes on the stack there)."""
    if block_m == 192:
        epi = spec.epi
        if epi.beta or (epi.residual and not epi.is_gated) or (epi.is_gated and spec.out_dtype == "fp32"):
            return 64
        return SM90_THREE_CONSUMER_MAX_ACCUMULATORS
    return 176 if spec.promote else 128


SM90_THREE_CONSUMER_MAX_ACCUMULATORS = 96


def sm90_three_consumer_problem(spec: GemmSpec) -> str | None:
    """Why a spec cannot run 192-row tiles (three consumers of 128 registers, mirror of GemmSm90's static_assert),
    or None: 16-bit inputs without promotion, layout nt, dense and unsplit."""
    if spec.dtype not in ("bf16", "fp16"):
        return f"dtype {spec.dtype!r} (16-bit inputs only)"
    if not (spec.a_k_major and spec.b_k_major):
        return f"layout {spec.layout!r} (nt only)"
    if spec.grouped:
        return "grouped GEMMs"
    return None


def sm90_block_n_legal(spec: GemmSpec, block_n: int) -> bool:
    """wgmma's N: any multiple of 8 up to 256, except that integer (s8) wgmma takes only 8, 16, 24 and the
    multiples of 16 (ptxas rejects m64n136k32.s32.s8.s8), and that an MN-major B (layouts nn, tn) is loaded in
    64-column TMA boxes (one 128-byte swizzle row each): block_n a multiple of 64 (TF32 nn: 32, sm90_mn_block)."""
    if block_n % 8 or not 8 <= block_n <= 256:
        return False
    if not spec.b_k_major and block_n % sm90_mn_block(spec):
        return False
    return spec.dtype != "int8" or block_n <= 24 or block_n % 16 == 0


def sm90_layout_problem(spec: GemmSpec) -> str | None:
    """Why the sm90 family cannot read the spec's operands in its layout, or None when it can: K-major operands
    (layout nt) for every type, MN-major ones (nn, tn, tt) for bf16 / fp16, and TF32's MN-major B (layout nn), which
    the kernel transposes in shared memory (sm90_trans_b; mirror of GemmSm90's static_asserts)."""
    if spec.layout == "nt" or spec.dtype in SM90_MN_MAJOR_DTYPES or sm90_trans_b(spec):
        return None
    return (f"layout {spec.layout!r} has MN-major operands, which the sm90 family (WGMMA) reads for bf16/fp16 only; "
            f"{spec.dtype} operands must be K-major (layout 'nt')")


def sm90_trans_b(spec: GemmSpec) -> bool:
    """Whether the spec's Hopper kernel reads a TF32 B stored (K, N) (layout nn) and transposes it in shared memory
    (GemmSm90's kTransB, converter warps beside the wgmmas): plain TF32 (not promoted, not grouped, no 3xTF32
    operands), A K-major."""
    return (spec.dtype == "tf32" and spec.layout == "nn" and not spec.promote and not spec.grouped
            and not spec.hi_lo and not spec.raw_b)


# TF32 nn with M up to this bucket runs the kernel that transposes B in shared memory (sm90_trans_b); larger M the
# nt kernel on K-major copies that each call makes (sm90_transposes), whose one pass over B is cheap against the
# GEMM there while the in-kernel transpose costs shared-memory bandwidth the TF32 wgmmas use (96 of 128 bytes a
# clock at full rate).
SM90_TF32_TRANS_B_MAX_M = 256
# Such a kernel's stage holds B twice (raw and transposed), so wide tiles fit few stages, and its converter warps add
# a stage's latency: 64x128 at 4 stages ran 128 x 7168 x 16384 in 408.6 us where 64x64 at 8 ran 64 rows in 156.9
# (session 27). Its tiles keep at least this many stages.
SM90_TRANS_B_MIN_STAGES = 6
# Such a kernel converts each B block once per M block, so above 64 rows a 64-row tile converts B twice as often per
# flop as a 128-row one, with one consumer warpgroup beside the converters; the cost model does not see that, so
# those tiles' costs are scaled by this. Measured at 128 rows (*exp-m-buckets-tf32-nn-trans-b-tiles-s29*): the model's
# 64x96 s6 ran 28672 x 4096 in 221.9 us and 37888 x 3584 in 235.7 where 128x64 s6 ran 181.8 / 200.7; at
# N = 3584-4096, where 128-row tiles leave SMs idle, 64x64 s8 stays ahead (4096 x 14336: 108.5 vs 147.2).
SM90_TRANS_B_ROWS64_COST = 1.1


def _trans_b_serves(spec: GemmSpec, m_hint: int | None) -> bool:
    """Whether the kernel that transposes B in shared memory runs `spec` (layout nn) at M = m_hint: few enough rows
    (known, and in a bucket up to SM90_TF32_TRANS_B_MAX_M), and an epilogue it has a tile for. A gated unit with
    quant_fp8_g128 needs 256-column tiles (128 columns of D), and a stage of them holds B twice: 128x256 fits 2
    stages, 64x256 3 only without a bias (tests/fuzz.py found it); those calls run the nt twin on a copy of B."""
    if spec.epi.is_gated and spec.epi.has_group_scales:
        return False
    return m_hint is not None and m_bucket(m_hint) <= SM90_TF32_TRANS_B_MAX_M


def sm90_transposes(spec: GemmSpec, arch: str, m_hint: int | None = None) -> bool:
    """Whether the Hopper kernel of `spec` at M = m_hint is a twin's (kernel_spec: nt, or nn for tn at small M),
    fed K-major copies of MN-major operands that every call makes (copies.py, Gemm._staged_plan): TF32 in layouts
    tn / tt, and nn above SM90_TF32_TRANS_B_MAX_M rows (or M unknown), which Hopper's TF32 WGMMA cannot read as
    stored; the portable kernel ran them at 0.28-0.44x cuBLAS (bench/results/*oddk*s25*)."""
    if arch != "sm_90a" or spec.dtype != "tf32" or spec.layout == "nt" or spec.grouped or spec.hi_lo:
        return False
    return not (sm90_trans_b(spec) and _trans_b_serves(spec, m_hint))


def kernel_spec(spec: GemmSpec, arch: str, m_hint: int | None = None) -> GemmSpec:
    """The spec whose kernel `spec`'s calls run at M = m_hint: where sm90_transposes, its nt twin, or for tn up to
    SM90_TF32_TRANS_B_MAX_M rows its nn twin (calls copy only A, which is small there, transposed; the kernel
    transposes B, sm90_trans_b); else `spec`."""
    if not sm90_transposes(spec, arch, m_hint):
        return spec
    nn = dataclasses.replace(spec, layout="nn")
    if spec.layout == "tn" and sm90_trans_b(nn) and _trans_b_serves(nn, m_hint):
        return nn
    return dataclasses.replace(spec, layout="nt")


def sm90_epilogue_block_n_problem(spec: GemmSpec, block_n: int) -> str | None:
    """Why the fused epilogue cannot use tiles BLOCK_N wide, or None when it can (mirror of GemmSm90's
    static_asserts): gated units pair 8 gate with 8 up columns (BLOCK_N multiple of 16), quant_fp8_g128 needs tiles
    that cover one whole 1x128 group of D (128 output columns: the group's amax is reduced inside the tile),
    and a D tile row must be whole 16-byte chunks (TMA store boxes; 1-byte outputs need 16 columns)."""
    epi = spec.epi
    if epi.is_gated and block_n % 16:
        return f"gated units ({epi.gate}) need block_n to be a multiple of 16, got {block_n}"
    out_cols = block_n // 2 if epi.is_gated else block_n
    if epi.has_group_scales and out_cols != 128:
        # 256 output columns would park 128 values per thread for the second pass, which spilled (with the
        # division's slow-path calls); 128 covers one group per tile row.
        return (f"quant_fp8_g128 needs D tiles of 128 columns (one whole 1x128 group), got {out_cols}"
                + (" (block_n / 2: gated)" if epi.is_gated else ""))
    if (out_cols * dtypes.get(spec.out_dtype).storage_bytes) % 16:
        return f"a D tile row of {out_cols} {spec.out_dtype} columns is not a whole number of 16-byte chunks"
    return None


# Per-tensor FP8 (promoted) at K > 2048, N >= 2048 and M >= 1024 rows considers tiles at least this wide
# (sm90_block_n_preferred; at N = 1024 / 1280 narrow tiles are what fills the SMs, and it was not measured there).
# 128x64 was a near-tie with 128x144 in the waves model at 2112 x 7168 and lost on the H200 (session 22,
# bench/results/*exp-fp8-tensor-*-s22*): 1000 / 2000 rows 32.1 / 75.3 us against 128x144's 28.1 / 50.5 (cuBLAS 27.9 /
# 48.9). 96 stays allowed: a floor of 112 also moved 96-wide picks, 1.04-1.18x faster where the model then took 144
# or 160 but 1.7-7% slower on the four rows where it took 112 (e.g. 1000 x 3072 x 4096 23.4 -> 25.2 us). Still so
# once partial last M blocks stopped being zero-filled (session 23, *floor-after-edge-maps*): 30.9 / 71.1 vs 28.3 /
# 50.1 us.
SM90_FP8_TENSOR_MIN_BLOCK_N = 96


# An MN-major B (layouts nn, tn) leaves the cost model BLOCK_N = 64, 128, 192 or 256, and its waves term chose 64
# where it saves a wave of 128s: 1.4-2.2x slower than 128 / 192 at 1000 and 4096 rows (H200 session 24, bench --tiles
# on the models suite, bench/results/*models-bf16-nn-tn-tiles-s24*: tn 1000 x 4608 x 3584 122.5 us at 128x64 vs 61.3
# at 128x192 (cuBLAS 46.6), nn 4096 x 1280 x 8192 196.4 vs 132.0 (110.8)); 64 was never the fastest of the seven
# tiles timed on the 12 rows. From this bucket on it is left out. (The model's (block_m + block_n) term underweights a
# narrow tile's bytes per FLOP; K-major B has the widths between 64 and 128 to fall back on, and its 128x64 picks
# there are left alone: nt 4096 x 1280 x 8192 picks 128x160.)
SM90_MN_B_MIN_M_NO_64 = 512


# Rules measured at "M < 256" when the buckets below 256 rows were powers of two up to 128: they hold for the buckets
# up to this, and the 192-row bucket (session 40) keeps the 256-row bucket's side of them.
SM90_SMALL_M_BUCKET_MAX = 128
# FP8 row scaling's preference for 176 / 160 columns (sm90_block_n_preferred, measured at 4096 rows) from this M on;
# below it the model chooses as for per-tensor scales. H200 session 51: at 256 rows 128x176 ran 0.83-0.92x torch's
# row-scaled matmul where per-tensor's 128x112 ran 1.04 (bench/results/*midm-fp8-tensor-row-swap-ab-8341b23-s51*), and
# at 777 rows 128x176 took 57.9 us against 38.6 for the swapped 104x128 (*exp-ab-fp8-swap-ab-rows-s51*).
SM90_FP8_ROW_WIDE_MIN_M = 1024


def sm90_block_n_preferred(spec: GemmSpec, block_n: int, m_hint: int, groups: int = 1) -> bool:
    """Tiles the heuristic considers (others stay legal for explicit configs and the tuner). Measured exceptions to
    the waves model for FP8 above SM90_SMALL_M_BUCKET_MAX rows (H200 sweeps, bench/results/*probe-block-row-tiles*,
    and as cited; measured when 129-256 rows were one 256-row bucket):

    - block scaling takes BLOCK_N = 176 when N and K >= 1024 and the problem has >= 1024 rows in all (m_hint x
      groups), else 128: since the promotion resolves which scale blocks a straddling tile touches at compile time
      (session 6), 128x176 was the fastest or within 1% of it on five of the six M = 4096 DeepSeek shapes
      (2112x7168: 1.03 vs 0.89 x torch at 128x128) and on the grouped 4 x 8192 x 4096 x 7168 (6% faster); at
      K = 512 (32768x512) 128x128 was 8% faster, and masked MoE calls of 256-512 rows in all ran 15-20% slower
      at 176 (fewer, wider tiles on an underfilled GPU). Smaller M keeps the BLOCK_N that divide 128.
    - row scaling takes BLOCK_N = 176 for N >= 1024 from SM90_FP8_ROW_WIDE_MIN_M rows (M = 4096 measured; below,
      176 ran 10-30% slower than the waves model's picks): best or within 9% on all six shapes, 4% better in geomean
      than the model's picks (which chose 128 where 176 was 10-15% faster: 24576x1536, 7168x2048); but 160, like
      per-tensor below, where K <= 2048 and M >= 1024 (session 13, same run, bench/results/*exp-ab-fp8-row-tiles-s13*:
      32768x512 149.3 us at 160 vs 162.4 at 176, 7168x2048 94.9 vs 97.4, 24576x1536 247.4 vs 248.8; at K = 7168
      176 stays, 160 was 5% slower).
    - per-tensor scaling (promoted) takes BLOCK_N = 160 for N >= 1024, K <= 2048 and M >= 1024 (session 7 sweep,
      bench/results/*fp8-tiles-m4096-s7*): 7168x2048 90.1 us at 160 vs 96.2 at the model's 128 (176: 93.0),
      24576x1536 235.2 vs 241.3 (176: 237.4), 32768x512 134.3 vs 134.4; at K >= 7168 the model's picks (176, or
      128 = 176 on 4096x7168) stay, 160 was 2-4% slower there. At K > 2048 (N >= 2048, M >= 1024) it keeps the
      model's picks of at least SM90_FP8_TENSOR_MIN_BLOCK_N columns (session 22: 128x64 lost up to 1.49x).
    """
    if not spec.b_k_major and block_n == SM90_MN_BLOCK and m_hint >= SM90_MN_B_MIN_M_NO_64:
        return False
    if m_hint <= SM90_SMALL_M_BUCKET_MAX:
        return spec.scaling != "block" or 128 % block_n == 0
    # Since session 18 a promoted FP8 128x128 tile keeps two partial sets (sm90_two_partial_sets) and ran 1-6% faster
    # than the 176 / 160 below on most M = 4096 rows (bench/results/*fp8-m4096-tiles-two-sets-s18*); 128 is
    # preferred beside them from 1024 rows on, and the waves model decides: it picks 176 where that tile fills the
    # waves much better (2112x7168: 19% faster) or K is long (7168x16384: 2.5-6%), 128 on the other rows, as
    # measured.
    two_sets_128 = (block_n == 128 and m_hint * groups >= 1024 and spec.promote
                    and spec.dtype in dtypes.FP8_DTYPES and spec.n >= 1024)
    if spec.scaling == "block":
        if spec.n >= 1024 and spec.k >= 1024 and m_hint * groups >= 1024:
            return block_n == 176 or two_sets_128
        return block_n == 128 if spec.n >= 128 else 128 % block_n == 0
    if (spec.scaling == "row" and spec.dtype in dtypes.FP8_DTYPES and spec.n >= 1024
            and m_hint * groups >= SM90_FP8_ROW_WIDE_MIN_M):
        if spec.promote and spec.k <= 2048 and m_hint >= 1024:
            return block_n == 160 or two_sets_128
        return block_n == 176 or two_sets_128
    if (spec.scaling == "tensor" and spec.promote and spec.dtype in dtypes.FP8_DTYPES and spec.n >= 1024
            and spec.k <= 2048 and m_hint >= 1024):
        return block_n == 160 or two_sets_128
    if (spec.scaling == "tensor" and spec.promote and spec.dtype in dtypes.FP8_DTYPES and spec.n >= 2048
            and m_hint >= 1024):
        return block_n >= SM90_FP8_TENSOR_MIN_BLOCK_N
    return True



def sm90_accumulators(block_m: int, block_n: int, promote: bool, pingpong: bool = False) -> int:
    """Accumulator registers per consumer thread for a tile (mirror of GemmSm90's static_assert)."""
    per_wg_rows = sm90_consumers(block_m, pingpong)[1]
    return (per_wg_rows // 64) * (block_n // 2) * (2 if promote else 1)


def sm90_supports(spec: GemmSpec, arch: str) -> bool:
    """Whether the Hopper family builds this spec's kernel: sm_90a and a layout its WGMMA reads for the type (nt for
    every type; nn, tn, tt for bf16 / fp16). Calls whose operands TMA cannot describe (row pitches or bases not
    16-byte aligned: an odd K, K = 4100 in 16 bits, a sliced view) run it on aligned copies (Gemm._staged_roles,
    staging.py): 2-4x faster than the portable kernel with 1-, 2- or 4-element loads on every row measured
    (1000 x 1000 x 1002 BF16 68.0 -> 20.9 us, 4096 x 4096 x 4100 810 -> 363; cuBLAS 24.1 / 544;
    bench/results/*exp-staging-s25*). The portable family serves other archs, other layouts, and calls captured
    in a CUDA graph before the staging buffers were sized."""
    if dtypes.is_quantized(spec.dtype) or spec.epilogue != "none" or spec.grouped:
        return arch == "sm_90a"
    return arch == "sm_90a" and sm90_layout_problem(spec) is None


# A call copies A / B whose rows TMA could read in place but that start off 32-byte sectors (staging.off_sector:
# such rows read ~1.5x slower) into 128-byte-pitched buffers where the copy saves time. Every tile load of an
# off-sector operand costs extra, so the loss grows with its bytes times the tiles that re-read them (B: one read
# per M block, A: one per N block), while its copy costs its bytes once, plus the copy kernel's launch. Wide tiles
# (few load bytes per MMA) lose to off-sector rows only through the operand re-read most: there copying the other
# one as well costs more than it saves, so they copy one; narrow tiles (block_m block_n / (block_m + block_n) <=
# REALIGN_BOTH_MAX_TILE, 128 x 160 and narrower) copy each operand that pays. Placed from interleaved runs of 37
# rows (BF16, TF32, FP8; in place / A / B / both copied, docs/NOTES.md session 27), e.g. BF16 128 x 256 tiles:
# 8192 x 1024 x 4104 in place 147.3 us, A 161.7, B 102.3, both 132.9; 1024 x 4096 x 4104 73.2, A 61.1, B 68.0,
# both 71.6; FP8 128 x 128: 4096 x 4096 x 4112 190.2, A 155.4, B 146.9, both 122.0; BF16 128 x 144: 2000 x 2112 x
# 7176 176.7, A 152.3, B 137.9, both 122.3.
REALIGN_LOSS_US_PER_MB_READ = 0.1  # per MB of an off-sector operand's tile loads (its bytes x the tiles re-reading)
REALIGN_COPY_US_PER_MB = 0.67  # per MB copied (read and written once, ~3 TB/s)
REALIGN_LAUNCH_US = 2.0  # the copy kernel's launch (programmatic, staging.StagedPlan)
REALIGN_BOTH_MAX_TILE = 72  # block_m block_n / (block_m + block_n) of the widest tile that copies both (128 x 160)


def sm90_realign_roles(m: int, n: int, block_m: int, block_n: int, off_sector_bytes: dict[str, int]) -> frozenset:
    """Which of the off-sector operands a call copies ({'a', 'b'} subsets, see REALIGN_LOSS_US_PER_MB_READ):
    `off_sector_bytes` maps each off-sector role to its bytes; the tile (block_m x block_n) says how often each is
    re-read and whether more than one copy can pay."""
    if not off_sector_bytes:  # every call of the Hopper kernel asks (Gemm._staged_roles): the common case first
        return frozenset()
    rereads = {"a": -(-n // block_n), "b": -(-m // block_m)}
    saved = {role: nbytes / 1e6 * (REALIGN_LOSS_US_PER_MB_READ * rereads[role] - REALIGN_COPY_US_PER_MB)
             - REALIGN_LAUNCH_US for role, nbytes in off_sector_bytes.items()}
    paying = sorted((role for role in saved if saved[role] > 0), key=lambda role: (saved[role], role), reverse=True)
    if block_m * block_n > REALIGN_BOTH_MAX_TILE * (block_m + block_n):
        paying = paying[:1]
    return frozenset(paying)


def _packed_row_bytes(spec: GemmSpec) -> dict[str, int]:
    """Row bytes of the packed (contiguous) operands whose rows the spec fixes: A's rows of K when K-major, B's
    rows (of K, or of N when MN-major), D's rows of N_out. An MN-major A's rows are M long (per call)."""
    esize = dtypes.get(spec.dtype).storage_bytes
    b_esize = 4 if spec.raw_b else esize  # raw_b: the caller's FP32 weight
    rows = {"b": spec.b_shape()[1] * b_esize, "d": spec.n_out * dtypes.get(spec.out_dtype).storage_bytes}
    if spec.a_k_major:
        rows["a"] = spec.a_shape(1)[1] * esize
    return rows


def sm90_unaligned_rows(spec: GemmSpec) -> list[str]:
    """The operands whose packed rows TMA cannot describe (row bytes not a multiple of 16), which every call of
    the Hopper kernel copies into aligned buffers (Gemm._staged_roles): 'a' / 'b' for K-major rows of K, 'b' for an
    MN-major B's rows of N, 'd' for D's rows of N_out. An MN-major A's rows (M) are judged per call."""
    return [role for role, nbytes in sorted(_packed_row_bytes(spec).items()) if nbytes % 16]


def sm90_off_sector_rows(spec: GemmSpec) -> list[str]:
    """The packed A / B whose rows TMA reads in place but every other one of which starts 16 bytes into a 32-byte
    sector (row bytes an odd multiple of 16): calls copy those whose copy pays (sm90_realign_roles,
    Gemm._staged_roles)."""
    return [role for role, nbytes in sorted(_packed_row_bytes(spec).items())
            if role != "d" and nbytes % 16 == 0 and nbytes % 32]


def _check_sm90(cfg: KernelConfig, spec: GemmSpec, arch: str) -> None:
    if arch != "sm_90a":
        raise ValueError(f"the sm90 family needs arch='sm_90a', got {arch!r}")
    layout_problem = sm90_layout_problem(spec)
    if layout_problem is not None:
        raise ValueError(f"the sm90 family cannot take this spec: {layout_problem}")
    esize = dtypes.get(spec.dtype).storage_bytes
    if cfg.block_k * esize != 128:
        raise ValueError(f"sm90 block_k must span 128 bytes ({128 // esize} for {spec.dtype}), got {cfg.block_k}")
    if cfg.swap_ab:
        _check_sm90_swap_ab(cfg, spec)
        return
    if cfg.block_m not in (64, 128, 192, 256):
        raise ValueError(f"sm90 block_m must be 64, 128, 192 or 256, got {cfg.block_m}")
    if cfg.block_m == 192:
        problem = sm90_three_consumer_problem(spec)
        if problem is None and (cfg.pingpong or cfg.split_k):
            problem = "ping-pong or split-K tiles"
        if problem is not None:
            raise ValueError(f"sm90 192-row tiles (three consumer warpgroups) cannot take {problem}")
    if sm90_trans_b(spec) and cfg.pingpong:
        raise ValueError("a TF32 B stored (K, N) is transposed by the kernel's converter warps beside cooperative "
                         "consumers: no ping-pong tiles")
    if not spec.b_k_major and cfg.block_n % sm90_mn_block(spec):
        mn_block = sm90_mn_block(spec)
        raise ValueError(f"layout {spec.layout!r} has an MN-major B, loaded in boxes of {mn_block} columns "
                         f"(128 bytes, the swizzle span): sm90 block_n must be a multiple of {mn_block}, got "
                         f"{cfg.block_n}")
    if not sm90_block_n_legal(spec, cfg.block_n):
        raise ValueError(f"sm90 block_n must be a multiple of 8 in [8, 256] (int8: 8, 16, 24 or a multiple of 16), "
                         f"got {cfg.block_n}")
    problem = sm90_epilogue_block_n_problem(spec, cfg.block_n)
    if problem is not None:
        raise ValueError(f"config {cfg.tag} cannot run epilogue {spec.epilogue!r}: {problem}")
    if cfg.pingpong and spec.grouped:
        raise ValueError("grouped GEMMs run cooperative tiles (pingpong=False)")
    if cfg.d_ring and sm90_d_ring_problem(spec, cfg.block_n, cfg.d_ring) is not None:
        raise ValueError(f"config {cfg.tag} stores D through a ring of {cfg.d_ring} slices, which this spec cannot: "
                         f"{sm90_d_ring_problem(spec, cfg.block_n, cfg.d_ring)}")
    if cfg.split_k and sm90_accumulators(cfg.block_m, cfg.block_n, False) > split_max_accumulators(spec):
        raise ValueError(f"split-K tiles hold at most {split_max_accumulators(spec)} accumulators per thread (the "
                         f"partials' reduction needs registers too, and a bias); {cfg.block_m}x{cfg.block_n} holds "
                         f"{sm90_accumulators(cfg.block_m, cfg.block_n, False)}")
    if cfg.pingpong and cfg.block_m not in (64, 128):
        raise ValueError(f"ping-pong consumers each hold a whole tile: block_m must be 64 or 128, got {cfg.block_m}")
    accumulators = sm90_accumulators(cfg.block_m, cfg.block_n, spec.promote, cfg.pingpong)
    if accumulators > sm90_max_accumulators(spec, cfg.block_m):
        raise ValueError(f"sm90 tile {cfg.block_m}x{cfg.block_n}{' ping-pong' if cfg.pingpong else ''} needs "
                         f"{accumulators} accumulator registers per "
                         f"thread; at most {sm90_max_accumulators(spec, cfg.block_m)} fit"
                         + (" (FP8 promotion keeps two sets)" if spec.promote else ""))
    _check_sm90_smem(cfg, spec)


SM90_SWAP_AB_BLOCK_N = (64, 128, 192)


# Swapped tiles in the cost model. Their gain is M's granularity: block_m any multiple of 8 fits an M that whole 64-row
# blocks fit badly (1050 rows: 12 tiles of 88, 1056 rows, against 9 of 128, 1152), so build() weighs them at M rounded
# up to SM90_SWAP_AB_BUCKET_STEP rows (tile_bucket) instead of the usual bucket, against the usual bucket's pick costed
# at that M. Each is priced by its consumers (block_n / 64): x1.09 for one (a warpgroup idles), x1.03 for two, x1.12
# for three (as 192-row tiles). Fitted on H200 session 50 (scripts/exp_ab_rows.sh, bf16, measured / modelled time
# against the heuristic's pick, bench/results/*swap-ab-rows-s50*): two consumers 0.97-1.03 for block_m >= 136, 1.03-1.07
# for 80-104; three 1.03-1.17 (176x192 1.04-1.15); one 1.05-1.10. The measured wins, us (heuristic pick -> swapped):
# 1050x2112x7168 51.1 -> 46.8 (88x192), 1050x4096x7168 90.4 -> 85.5 (136x128) / 87.7 (176x192), 1050x7168x16384
# 330.3 -> 310.9 (152x128), 1050x7168x2048 48.4 -> 44.9, 586x2112x7168 33.6 -> 30.3 (152x64), 586x4096x7168 52.8 ->
# 49.3, 586x7168x2048 31.1 -> 29.9 (88x128), 300x4096x7168 34.1 -> 30.9 (80x128), 700x7168x2048 36.2 -> 33.5
# (104x128), 1200x2112x7168 55.7 -> 51.6 (104x192, modelled even: not picked). Even or slower, hence the fences: K <=
# 1536 (1050x24576x1536 115.9 -> 113.8 at best, 1050x32768x512 60.8 -> 60.1 at best and 62.6 at the model's 176x128,
# 586x24576x1536 67.8 -> 67.6 at best and 73.8 at 152x192), and gains under 2% (2048x2112x7168 86.0 -> 86.8 at
# 176x192, modelled 0.984; 586x7168x16384 199.4 -> 201.8 at 152x128, 210.0 at 88x128, modelled 1.01).
# FP8 with per-tensor / per-row scales (session 51) takes the same prices: all 31 rows of M 300-1666 where they picked
# a swapped tile ran faster, 0.910x the usual pick's time (geomean; bench/results/*exp-ab-fp8-swap-ab-rows-s51*):
# per-tensor 1050x7168x16384 184.5 -> 171.9 us, 300x7168x16384 72.6 -> 57.3, 1666x4096x7168 75.1 -> 74.8 (the least);
# per-row 777x4096x7168 57.9 -> 38.6 (128x176 before). One consumer (x64) ran slower than two on 29 of the 30 rows
# timed both ways (152x64 258.2 us at 1050x7168x16384), as the x1.09 price has it.
SM90_SWAP_AB_COST = {64: 1.09, 128: 1.03, 192: 1.12}
SM90_SWAP_AB_MIN_GAIN = 0.98
SM90_SWAP_AB_M_RANGE = (256, 2048)  # M in (lo, hi]: below, split-K and 64-row tiles hold the small rows
SM90_SWAP_AB_MIN_K = 2048
SM90_SWAP_AB_BUCKET_STEP = 8
# Three stages only from this K: at K = 2048, 216x128 (s3) lost to the usual picks (420x7168x2048 24.8 -> 25.8 us,
# 1500x7168x2048 61.8 -> 64.7), while 3-stage tiles won at K >= 4096 (900x28672x4096 232x128 296.0 -> 277.2,
# 1200x28672x4096 240x128 384.1 -> 368.7, 1050x4096x7168 176x192 90.4 -> 87.7).
SM90_SWAP_AB_SHALLOW_MIN_K = 4096
# Tiles of fewer rows than SM90_SWAP_AB_NARROW_BLOCK_M (the wgmmas' N) only up to this K: their wgmmas read more
# shared memory per MAC (64 + N rows of 32 bytes per 64 x N x 16), which the model's (rows + columns) term underprices
# once the main loop dominates. 777x3584x18944 88x128 ran 157.5 -> 173.3 us (one round of 128x200 became two of
# 88x128) and 586x7168x16384 88x128 199.4 -> 210.0, while 333x4096x14336 88x128 ran 60.8 -> 58.9, 1666x3584x18944
# 120x128 304.3 -> 288.1, and every narrow pick at K <= 8192 won 3-9% (1050x2112x7168 88x192 51.1 -> 46.8,
# 777x7168x8192 112x128 134.5 -> 122.9).
SM90_SWAP_AB_NARROW_BLOCK_M = 112
SM90_SWAP_AB_NARROW_MAX_K = 14336
# With a fused epilogue (a bias and an activation: epilogue_swapped), swapped tiles are weighed for 16-bit inputs from
# this K only (FP8: see SM90_SWAP_AB_FP8_EPILOGUE_BLOCK_N). H200 session 51, bias+gelu, the usual pick -> the model's
# swapped one (us, bench/results/*exp-ab-swap-ab-epilogue-rows-s51*): bf16 586x2112x7168 37.6 -> 32.1,
# 1050x7168x16384 342.0 -> 320.2,
# 586x4096x7168 54.8 -> 51.7, 1666x7168x16384 515.4 -> 503.2, 1050x2112x7168 53.2 -> 52.4, 1050x4096x7168 93.9 -> 94.4,
# but 586x7168x2048 34.8 -> 37.1 (K = 2048); FP8 per-tensor lost on 7 of 11 rows (1050x4096x7168 58.8 -> 65.6,
# 1050x2112x7168 33.5 -> 37.1) with half partial sets, and with one set (the rule since) still at 1050x4096x7168
# (58.5 -> 62.5 us; 1050x2112x7168 33.4 -> 32.7, bench/results/*fp8-swap-ab-epilogue-partial-sets-s51*). Forced
# swapped tiles take these epilogues for every input they take.
SM90_SWAP_AB_EPILOGUE_MIN_K = 4096
# FP8 (per-tensor / per-row) with a fused epilogue: swapped tiles of two consumers only, at any K. Session 51's losses
# above were the bias read ahead of the main loop (its wgmma descriptors then sat in vector registers); with it read
# in the epilogue (session 52) bias+gelu, usual pick -> swapped, us (bench/results/*exp-ab-fp8-swap-ab-epilogue-*s52*):
# 20 of 22 DeepSeek rows at 586-1666 rows faster or even (per-row 1050x4096x7168 62.6 -> 52.7, 1666x4096x7168 91.0 ->
# 79.1, 1050x7168x16384 191.3 -> 174.9; per-tensor 1666x2112x7168 47.3 -> 43.5, 1050x7168x2048 35.8 -> 34.2), but the
# one-consumer 152x64 at 586x2112x7168 lost 21.6 -> 27.5 (per-row 21.9 -> 27.1): with an epilogue the promoted
# swapped tile has one partial set, and one consumer leaves the tensor cores idle while it promotes.
SM90_SWAP_AB_FP8_EPILOGUE_BLOCK_N = (128,)
# A usual pick of 64 rows (one consumer; FP8 weighs them up to 320 rows) is priced this much higher against swapped
# tiles: at 257-320 rows the swapped tiles ran 1-22% faster where the model, at 1.0, kept 64x144 / 64x160 (H200
# session 51, FP8 per-tensor / per-row, us, bench/results/*exp-ab-fp8-swap-ab-rows64-price-s51*, all 14 picks the
# factor moved in a grid: 320x7168x16384 76.7 -> 60.0 at 160x128, 320x4096x7168 25.0 -> 20.3, 264x3584x18944 45.4 ->
# 38.2, 288x6144x4096 22.1 -> 21.9 the least; 0.885x in geomean).
SM90_SWAP_AB_ROWS64_USUAL_COST = 1.1


def sm90_swap_ab_sizes(m: int, k: int) -> bool:
    """M in SM90_SWAP_AB_M_RANGE and K >= SM90_SWAP_AB_MIN_K: the sizes where swapped tiles are weighed (a cheap
    first test before sm90_swap_ab_costed's spec check, also per call in the torch ops)."""
    lo, hi = SM90_SWAP_AB_M_RANGE
    return lo < m <= hi and k >= SM90_SWAP_AB_MIN_K


def sm90_swap_ab_costed(spec: GemmSpec, m: int) -> bool:
    """Whether build() weighs swapped tiles for `spec` at M = m (and chooses its tile for M rounded up to
    SM90_SWAP_AB_BUCKET_STEP rows, tile_bucket): sm90_swap_ab_sizes, for specs they take (sm90_swap_ab_problem), with
    a fused epilogue for FP8 (two-consumer tiles: _sm90_swap_ab_costed_block_ns) and for 16-bit inputs from
    SM90_SWAP_AB_EPILOGUE_MIN_K."""
    if not sm90_swap_ab_sizes(m, spec.k) or sm90_swap_ab_problem(spec) is not None:
        return False
    return spec.epi.is_identity or spec.dtype not in ("bf16", "fp16") or spec.k >= SM90_SWAP_AB_EPILOGUE_MIN_K


def sm90_swap_ab_max_block_m(spec: GemmSpec, block_n: int) -> int:
    """A swapped tile's most rows: block_m / 2 accumulators a thread within 128 registers (96 with the three
    consumers of block_n 192, as 192-row tiles; promoted FP8 holds two sets in 176)."""
    if block_n == 192:
        return 2 * SM90_THREE_CONSUMER_MAX_ACCUMULATORS
    return sm90_max_accumulators(spec, 128) // (2 if spec.promote else 1) * 2


def _sm90_swap_ab_priced(spec: GemmSpec, m: int, num_sms: int, block_m: int,
                         block_n: int) -> tuple[float, int, int, int] | None:
    """(cost, block_m, block_n, stages) of one swapped tile at M = m, priced by SM90_SWAP_AB_COST, or None where the
    model does not weigh it (fewer than 3 stages, the fences below)."""
    if block_m < SM90_SWAP_AB_NARROW_BLOCK_M and spec.k > SM90_SWAP_AB_NARROW_MAX_K:
        return None
    stages = _sm90_stages(spec, block_m, block_n, m_hint=m, d_ring=0, swap_ab=True)
    if stages < 3 or (stages == 3 and spec.k < SM90_SWAP_AB_SHALLOW_MIN_K):
        return None
    esize = dtypes.get(spec.dtype).storage_bytes
    out_esize = dtypes.get(spec.out_dtype).storage_bytes
    cost = SM90_SWAP_AB_COST[block_n] * sm90_tile_cost(m, spec.n, spec.k, block_m, block_n, 128 // esize,
                                                        out_esize, num_sms, stages)
    return cost, block_m, block_n, stages


def _sm90_swap_ab_costed_block_ns(spec: GemmSpec) -> tuple[int, ...]:
    """The swapped tiles' widths the model weighs: sm90_swap_ab_block_ns, FP8 with a fused epilogue
    SM90_SWAP_AB_FP8_EPILOGUE_BLOCK_N of them (forced tiles may take the others)."""
    block_ns = sm90_swap_ab_block_ns(spec)
    if spec.dtype in ("bf16", "fp16") or spec.epi.is_identity:
        return block_ns
    return tuple(b for b in block_ns if b in SM90_SWAP_AB_FP8_EPILOGUE_BLOCK_N)


def _sm90_swap_ab_tiles(spec: GemmSpec, m: int, num_sms: int) -> list[tuple[float, int, int, int]]:
    """Every swapped tile the model weighs at M = m (_sm90_swap_ab_priced), cheapest first (ties: fewer columns,
    then fewer rows)."""
    priced = (_sm90_swap_ab_priced(spec, m, num_sms, block_m, block_n)
              for block_n in _sm90_swap_ab_costed_block_ns(spec)
              for block_m in range(8, sm90_swap_ab_max_block_m(spec, block_n) + 1, 8))
    return sorted((p for p in priced if p is not None), key=lambda p: (p[0], p[2], p[1]))


def _sm90_swap_ab_best(spec: GemmSpec, m: int, num_sms: int) -> tuple[float, int, int, int] | None:
    """(cost, block_m, block_n, stages) of the cheapest swapped tile at M = m, or None."""
    tiles = _sm90_swap_ab_tiles(spec, m, num_sms)
    return tiles[0] if tiles else None


def sm90_swap_ab_problem(spec: GemmSpec) -> str | None:
    """Why a spec cannot run swapped tiles (KernelConfig.swap_ab, mirror of GemmSm90's kSwapAB static_assert), or
    None: 16-bit inputs or FP8 with per-tensor / per-row scales, a 16-bit D, layout nt, dense, and of the fused
    epilogues a bias (per column or row) and an activation at most (epilogue_swapped: no C / residual tile, gated
    units or quantize-on-store)."""
    fp8 = spec.dtype in dtypes.FP8_DTYPES and spec.scaling in ("tensor", "row")
    if (spec.dtype not in ("bf16", "fp16") and not fp8) or spec.out_dtype not in ("bf16", "fp16"):
        return (f"dtype {spec.dtype!r} / out_dtype {spec.out_dtype!r} (16-bit inputs or FP8 with tensor / row "
                "scales, and a 16-bit output)")
    if not (spec.a_k_major and spec.b_k_major):
        return f"layout {spec.layout!r} (nt only)"
    if spec.grouped:
        return "grouped GEMMs"
    epi = spec.epi
    if epi.beta or epi.residual or epi.is_gated or epi.quant != "none":
        return f"epilogue {spec.epilogue!r} (a bias and an activation at most)"
    return None


def _check_sm90_smem(cfg: KernelConfig, spec: GemmSpec) -> None:
    if cfg.smem_bytes(spec) > SM90_SMEM_BUDGET_BYTES:
        raise ValueError(f"config {cfg.tag} needs {cfg.smem_bytes(spec)} B of shared memory; "
                         f"sm_90a allows {SM90_SMEM_BUDGET_BYTES} B: lower num_stages or the block shape")


def sm90_swap_ab_block_ns(spec: GemmSpec) -> tuple[int, ...]:
    """A swapped tile's block_n for `spec`: 64 columns a consumer, three consumers (192) for 16-bit inputs only
    (as 192-row tiles: sm90_three_consumer_problem)."""
    return SM90_SWAP_AB_BLOCK_N if spec.dtype in ("bf16", "fp16") else SM90_SWAP_AB_BLOCK_N[:2]


def _check_sm90_swap_ab(cfg: KernelConfig, spec: GemmSpec) -> None:
    problem = sm90_swap_ab_problem(spec)
    if problem is not None:
        raise ValueError(f"sm90 swapped tiles (swap_ab) cannot take {problem}")
    block_ns = sm90_swap_ab_block_ns(spec)
    if cfg.block_n not in block_ns:
        names = ", ".join(map(str, block_ns[:-1])) + f" or {block_ns[-1]}"
        raise ValueError(f"sm90 swapped tiles of {spec.dtype} take block_n {names} (64 columns a consumer), got "
                         f"{cfg.block_n}")
    max_block_m = sm90_swap_ab_max_block_m(spec, cfg.block_n)
    if not 8 <= cfg.block_m <= max_block_m:  # (a multiple of 8: KernelConfig checks that)
        raise ValueError(f"sm90 swapped tiles of {cfg.block_n} columns take block_m a multiple of 8 up to "
                         f"{max_block_m}, got {cfg.block_m}")
    _check_sm90_smem(cfg, spec)


# Stage cap. Beyond 8 stages a tile gains only where its stages hold few bytes of the weight: at decode sizes
# (M <= 128) a tile is bound by streaming B from DRAM, and a CTA keeps stages x block_n x 128 bytes of it in
# flight (shared by the tiles of the same columns: two at M = 128 with 64-row tiles). H200, session 10
# (bench/results/*decode-9a52a6f*, every tile at up to 16 stages against *decode-bdf934e* at 8): 64x32 tiles (4 KB
# of B per stage) ran 5-12% faster at 16 stages, 64x64 at M = 128 (two tiles per column) 7-12% faster at 12-13;
# 64x64 at M <= 64 (8 KB, 64 KB in flight at 8 stages) ran 1-5% SLOWER at 12-13 (FP8 block 64x7168x16384 42.1 ->
# 44.4 us). So: enough stages for SM90_B_BYTES_IN_FLIGHT per column tile, never fewer than 8.
SM90_BASE_STAGES = 8
SM90_MAX_STAGES = 16
SM90_B_BYTES_IN_FLIGHT = 64 * 1024
SM90_DEEP_STAGES_MAX_M = 128
# The cost model ties 128xW with 64x2W tiles (same area, same rows + columns). Up to this M a tie goes to the
# 64-row tile: H200 session 10, M = 128, the six DeepSeek (N, K) (bench/results/*decode-tile-ties-s10*): 64x128
# against 128x64 ran 1-5% faster on all six FP8 block rows, 7% on BF16 7168x16384 and FP8 per-tensor
# 2112x7168 / 7168x16384 (at 7 stages, all that fits with the K-lane buffer), and within +-3% on the rest.
SM90_DECODE_TIE_M = 128


def sm90_stage_cap(block_m: int, block_n: int, m_hint: int | None) -> int:
    """Most stages worth having for a tile at M = m_hint (None: no hint, SM90_BASE_STAGES)."""
    if m_hint is None or m_hint > SM90_DEEP_STAGES_MAX_M:
        return SM90_BASE_STAGES
    tiles_per_column = -(-m_hint // block_m)
    wanted = -(-SM90_B_BYTES_IN_FLIGHT * tiles_per_column // (block_n * 128))
    return max(SM90_BASE_STAGES, min(SM90_MAX_STAGES, wanted))


def _sm90_stages(spec: GemmSpec, block_m: int, block_n: int, pingpong: bool = False, split_k: bool = False,
                 m_hint: int | None = None, d_ring: int | None = None, swap_ab: bool = False) -> int:
    """As many stages as fit, 2 up to sm90_stage_cap (d_ring None: sm90_d_ring's rule)."""
    if d_ring is None:
        d_ring = sm90_d_ring(spec, block_m, block_n, pingpong, m_hint)
    for stages in range(sm90_stage_cap(block_m, block_n, m_hint), 1, -1):
        if (sm90_smem_bytes(spec, block_m, block_n, stages, pingpong, split_k, d_ring, swap_ab)
                <= SM90_SMEM_BUDGET_BYTES):
            return stages
    return 0


def sm90_d_slice_bytes(block_n: int, out_esize: int) -> int:
    """Width of the column slices the sm90 epilogue stores D in: the widest of 128/64/32/16 bytes
    that divides a tile row (mirror of StoreTraits in gemm_sm90.cuh)."""
    row_bytes = block_n * out_esize
    return next(w for w in (128, 64, 32, 16) if row_bytes % w == 0)


# Relative speed of the epilogue by slice width: 16-byte slices cannot be swizzled and take many small
# TMA stores (4096x32768x512: 128x216 ran at 0.55x cuBLAS where 128x256 ran at 1.07x).
_SLICE_EFFICIENCY = {128: 1.0, 64: 0.7, 32: 0.7, 16: 0.25}
# A gated unit's D tile is half as wide as its tile, so a wide tile stores few 16-byte slices (9 at 128x144, 11 at
# 128x176, against the 27 of the plain 128x216 the table's 0.25 came from): priced at 0.45 from 128 columns and 384
# rows on. H200 session 49, bias+swiglu, every pick this moves measured against the table's (same-call A/B,
# bench/results/*gated-slice-rule*, *128x96-picks*, us): bf16 1000x4608x3584 53.5 -> 50.5, 2048x2112x7168 92.5 ->
# 84.8, 4096x2112x7168 175.1 -> 168.0, 384x14336x4096 70.8 -> 68.1, 1050x4096x7168 94.1 -> 94.2; FP8 per-tensor
# 1050x4096x7168 60.7 -> 56.1, 1536x7168x16384 305.2 -> 268.2, 2048x2112x7168 63.5 -> 56.0, 2048x7168x16384 366.5
# -> 335.5, 586x7168x16384 131.0 -> 117.0, 384x7168x2048 18.9 -> 17.6. Left out where it lost: FP8 row / block
# scales (block 1050x4096x7168 128x176 80.7 against 128x128's 64.4: the tile straddles B's 128-column scale blocks),
# 256 rows (split 128x176 61.3 vs 57.2), narrow tiles (128x48 at one round 11-12% slower) and decode sizes (2-3%).
_GATED_16B_SLICE_EFFICIENCY = 0.45
_GATED_SLICE_MIN_M = 384
_GATED_CHEAP_SLICES_MIN_BLOCK_N = 128


def sm90_few_16b_slices(spec: GemmSpec) -> bool:
    """Whether the cost model prices the spec's 16-byte D slices as few (_GATED_16B_SLICE_EFFICIENCY): gated units
    (D tiles half as wide as the tiles) without FP8 row or block scales."""
    return spec.epi.is_gated and spec.scaling not in ("row", "block")


# The epilogue of a tile costs about this many K blocks of main loop (fitted, with the constants
# above and below, to the H200 tile sweeps in docs/NOTES.md).
_EPILOGUE_K_BLOCKS = 5.5


# Fewer K elements than this in flight (stages x BLOCK_K) starve the tensor cores: TF32 at 3 stages
# of 32 measured 0.92x where 5 stages of 128x128 reached 1.00x (4096x7168x16384).
_MIN_K_IN_FLIGHT = 128
_SHALLOW_PIPELINE_PENALTY = 1.1


# Split-K (splitk.py): a share that does not arrive last stores its partial tile (FP32, about one K block's cost of
# the tile's area); the last one loads every share's partial (about one K block each, on its one SM after its main
# loop) and runs the epilogue. The load was 0.5 K blocks until session 38: at 0.5 the model took four shares of
# 128x128 / 64x128 / 64x96 tiles where two shares of half as wide tiles ran 5-12% faster. H200, same-run A/B of the
# picks of 0.5 and 1.0 on the 75 grid problems whose pick changes (bench/results/*exp-split-model-ab*-s38*, bf16 /
# fp8 block / fp8 tensor / tf32 / int8 / bf16 beta+residual, M 1..512): geomean 0.949 of the old time, 55 rows
# faster by more than 1% (256x2048x7168 bf16 22.8 -> 21.0 us, tf32 64x1536x7168 23.7 -> 21.7, fp8 tensor
# 128x4096x28672 46.3 -> 40.2), 9 slower by 1.2-4.4% (int8 decode 2048x7168 64x32x2 instead of 64x64x4, bf16
# 512x1024x4096 15.6 -> 16.3). 1.5 and 2.0 lost up to 20% on TF32 rows.
_SPLIT_STORE_K_BLOCKS = 1.0
_SPLIT_LOAD_K_BLOCKS = 1.0
MAX_SPLITS = 16
_MIN_K_BLOCKS_PER_SPLIT = 4
# Split-K kernels are chosen for M buckets up to this (the small-M / decode path); larger M keeps the measured
# tile choices (bench/results, docs/NOTES.md) until split-K is measured there.
SPLIT_MAX_M = 1024
# The last share holds its accumulators while it loads and adds the partials: 128 per thread (128x256) spilled
# (ptxas, 168 registers at entry), 112 (128x224) did not. A bias keeps its registers live through the tile: with one,
# 128x216 / 128x224 spilled 40-72 bytes (any epilogue with a bias), 128x200 did not (tests/fuzz.py found it).
SPLIT_MAX_ACCUMULATORS = 112
SPLIT_MAX_ACCUMULATORS_BIAS = 100


def split_max_accumulators(spec: GemmSpec) -> int:
    """Accumulators per thread a split-K tile of `spec` may hold (SPLIT_MAX_ACCUMULATORS[_BIAS])."""
    return SPLIT_MAX_ACCUMULATORS if spec.epi.bias == "none" else SPLIT_MAX_ACCUMULATORS_BIAS


# A split-K tile replaces the unsplit choice only when the model expects it this much faster. Decode shapes on the
# H200 (bench/results/*exp-splitk-sweep-bf16*): model ratios 0.70-0.87 were measured gains of 5-56% (2112x7168,
# 4096x7168, 7168x16384 at M <= 64); 0.90 a 10% loss (7168x16384 at M = 128, where 128 unsplit 64x112 tiles already
# stream the weight at full bandwidth).
SPLIT_MIN_GAIN = 0.88


def sm90_tile_cost(m: int, n: int, k: int, block_m: int, block_n: int, block_k: int, out_esize: int,
                   num_sms: int, num_stages: int = 8, d_cols: int | None = None, groups: int = 1,
                   splits: int = 1, few_16b_slices: bool = False) -> float:
    """Relative time of a tile shape under the persistent schedule (smaller is better).

    Waves: every SM runs ceil(tiles / SMs) tiles, so a last wave that is barely used costs a
    whole wave. A tile costs its main loop, K blocks of area / efficiency, where efficiency
    drops for thin tiles because shared-memory traffic per FLOP is (bm + bn) / (bm * bn), plus
    its epilogue, which weighs more when K is short and when D leaves in narrow slices; a
    pipeline holding fewer than 128 K elements costs 10% more. `d_cols`: D's tile width when it is not
    block_n (gated units: block_n / 2); `few_16b_slices`: sm90_few_16b_slices. `groups`: a grouped GEMM of that
    many groups of m rows each (every group rounds its rows up to whole tiles). `splits` > 1: split-K, each tile's
    K blocks shared by that many CTAs (tiles x splits units in waves, each storing a partial tile; every tile's
    epilogue, after loading its partials, counted in waves of tiles).
    """
    tiles = -(-m // block_m) * -(-n // block_n) * groups
    units = tiles * splits
    waves = -(-units // num_sms)
    area = block_m * block_n
    main_loop = -(-(-(-k // block_k)) // splits) * (area + 24 * (block_m + block_n))
    slice_bytes = sm90_d_slice_bytes(block_n if d_cols is None else d_cols, out_esize)
    efficiency = _SLICE_EFFICIENCY[slice_bytes]
    if (few_16b_slices and slice_bytes == 16 and block_n >= _GATED_CHEAP_SLICES_MIN_BLOCK_N
            and m >= _GATED_SLICE_MIN_M):
        efficiency = _GATED_16B_SLICE_EFFICIENCY
    epilogue = _EPILOGUE_K_BLOCKS * area / efficiency
    if splits == 1:
        cost = waves * (main_loop + epilogue)
    else:  # every tile still has one epilogue, run by its last share after loading the partials
        cost = (waves * (main_loop + _SPLIT_STORE_K_BLOCKS * area)
                + -(-tiles // num_sms) * (epilogue + splits * _SPLIT_LOAD_K_BLOCKS * area))
    if num_stages * block_k < _MIN_K_IN_FLIGHT:
        cost *= _SHALLOW_PIPELINE_PENALTY
    return cost


SM90_BLOCK_N = tuple(range(256, 7, -8))


def split_candidates(k: int, block_k: int, tiles: int | None = None, num_sms: int | None = None) -> range:
    """The split counts considered for K: 1 up to MAX_SPLITS, keeping at least _MIN_K_BLOCKS_PER_SPLIT K blocks per
    share (a shorter share cannot fill the pipeline) and, given `tiles` and `num_sms`, all shares of all tiles in one
    wave (H200, bench/results/*exp-splitk-sweep*: every measured best had tiles x splits <= 132; FP8 7168x16384 at
    M = 128 took 74.7 us with 56 x 7 shares against 46.5 with 56 x 2)."""
    k_blocks = -(-k // block_k)
    top = min(MAX_SPLITS, k_blocks // _MIN_K_BLOCKS_PER_SPLIT)
    if tiles is not None and num_sms is not None:
        top = min(top, num_sms // max(1, tiles))
    return range(1, max(1, top) + 1)


# The raw-B 3xTF32 GEMM (GemmSpec.raw_b, dtype fp32 at M <= 512) has its own cost: a stage carries a raw K block's
# three products (12 wgmmas) plus the converter warps' B_lo, so its time per stage grows with BLOCK_N from a fixed
# part (barriers, the promotion's drain, the converter's pass) that the compute-centric sm90_tile_cost does not
# see: it picked 64x56 unsplit at 64x7168x16384 (228 us) where 64x112 x 2 shares ran 178. Fitted on the H200 sweep
# of session 16 (bench/results/*exp-fp32-raw-b-tiles-s16*, 6 DeepSeek (N, K) x M = 64 / 128, tiles 64x32..128x128 x
# 1-3 shares): per stage and CTA, 0.22 + 0.0042 BLOCK_N us for 64-row tiles (56: 0.45, 112: 0.69, 168: 1.1) and
# 0.33 + 0.007 BLOCK_N for 128-row tiles (56: 0.76, 112: 1.13). A tile costs waves x its share's stages x that,
# plus one stage per share for the partial tile's round trip. BLOCK_N stays among (or between) the measured widths;
# 64 fills 132 SMs at M = 512, N = 2112 (4 x 33 tiles).
RAW_B_BLOCK_N = (56, 64, 96, 112, 128)
RAW_B_BLOCK_K = 32  # TF32: a stage's 128 bytes of K per row
_RAW_B_STAGE_US = {64: (0.22, 0.0042), 128: (0.33, 0.007)}


def raw_b_tile_cost(m: int, n: int, loop_k: int, block_m: int, block_n: int, num_sms: int, splits: int = 1) -> float:
    """Modelled microseconds of the raw-B GEMM's main loops at M = m with this tile and split count (see
    RAW_B_BLOCK_N); loop_k: GemmSpec.loop_k (the raw K)."""
    fixed, per_column = _RAW_B_STAGE_US[block_m]
    units = -(-m // block_m) * -(-n // block_n) * splits
    stages = -(-(-(-loop_k // RAW_B_BLOCK_K)) // splits) + (1 if splits > 1 else 0)
    return -(-units // num_sms) * stages * (fixed + per_column * block_n)


def _raw_b_tiles_by_cost(spec: GemmSpec, m_hint: int, num_sms: int) -> list[tuple[float, int, int, int, int]]:
    """_sm90_tiles_by_cost for raw-B GEMMs: (cost, block_m, block_n, stages, splits) by raw_b_tile_cost."""
    tiles = []
    for block_m in (64, 128) if m_hint > 64 else (64,):
        for block_n in RAW_B_BLOCK_N:
            if (sm90_accumulators(block_m, block_n, spec.promote) > sm90_max_accumulators(spec)
                    or sm90_epilogue_block_n_problem(spec, block_n) is not None):  # e.g. 56 INT8 columns of D
                continue
            cost, splits = sm90_best_splits(spec, m_hint, block_m, block_n, num_sms)
            stages = _sm90_stages(spec, block_m, block_n, split_k=splits > 1, m_hint=m_hint)
            if stages >= 2:
                tiles.append((cost, block_m, block_n, stages, splits))
    return sorted(tiles)


def sm90_best_splits(spec: GemmSpec, m: int, block_m: int, block_n: int, num_sms: int, num_stages: int = 8
                     ) -> tuple[float, int]:
    """(cost, splits) of the cheapest split count for a tile shape at M = m (1 when splitting does not pay)."""
    if spec.raw_b:
        tiles = -(-m // block_m) * -(-spec.n // block_n)
        return min((raw_b_tile_cost(m, spec.n, spec.loop_k, block_m, block_n, num_sms, s), s)
                   for s in split_candidates(spec.loop_k, RAW_B_BLOCK_K, tiles, num_sms))
    esize = dtypes.get(spec.dtype).storage_bytes
    out_esize = dtypes.get(spec.out_dtype).storage_bytes
    block_k = 128 // esize
    d_cols = block_n // 2 if spec.epi.is_gated else None
    tiles = -(-m // block_m) * -(-spec.n // block_n)
    return min((sm90_tile_cost(m, spec.n, spec.k, block_m, block_n, block_k, out_esize, num_sms, num_stages, d_cols,
                               splits=s, few_16b_slices=sm90_few_16b_slices(spec)), s)
               for s in split_candidates(spec.loop_k, block_k, tiles, num_sms))


# Split-K exists to give idle SMs a share of the K loop. At decode sizes the cost model still prefers it where an
# unsplit tile already keeps most SMs' consumers busy in one wave, and there the partial sums' extra traffic made it
# slower (H200 session 10, bench/results/*decode-split-fill-s10*): BF16 {32,64}x4096x7168 64x32 unsplit 25.8/26.2
# us vs 64x128 split 27.8/28.5; {32,64}x7168x16384 64x56 68.7/69.4 vs 64x224 split 73.5/73.8; FP8 per-tensor
# {32,64}x2112x7168 64x32 with K lanes 12.0/12.2 vs 64x64 split 13.7/13.8. Not for promoted FP8 without K lanes (it
# waits for every K block's wgmmas: a long serial chain; FP8 block 2112x7168 split 13.7/14.1 vs unsplit 64x32
# 14.8/14.9) nor for tiles narrower than 32 columns (BF16 2112x7168: 64x16 unsplit 19.7/19.9 vs split 18.5/18.6).
# TF32 (unpromoted) since session 11 (bench/results/*tf32-decode-filler-s11*): 64x7168x16384 64x56 unsplit 129.3 us
# vs 64x224 split 138.7, 64x4096x7168 64x32 38.5 vs 64x128 split 42.0.
# Promoted FP8 tiles with two partial sets (sm90_two_partial_sets, session 18) no longer drain every K block either,
# and from 16 columns: FP8 block {16,32,64}x2112x7168 64x16 unsplit (132 tiles) 13.5 / 13.3 / 13.4 us vs the 64x64
# x 4 split pick 13.9 / 13.8 / 14.2 (H200 session 19, bench/results/*exp-splitk-sweep-fp8_block-2112x7168-s19*).
# INT8 (unscaled K loop, no wait per K block) since session 19: 16 / 64 x 7168x16384 64x64 unsplit 36.9 / 38.2 us vs
# the 64x112 x 2 split pick 39.9 / 40.8 (bench/results/*exp-splitk-sweep-int8-atomic-s19*).
SPLIT_SKIP_MAX_M = 64
SPLIT_SKIP_DTYPES = ("bf16", "fp16", "tf32", "int8")
SPLIT_SKIP_FILL = 0.75
SPLIT_SKIP_MIN_N = 32
SPLIT_SKIP_MIN_N_TWO_SETS = 16


def _sm90_decode_filler(spec: GemmSpec, m_hint: int, num_sms: int, tiles: list) -> tuple | None:
    """The cheapest unsplit tile of `tiles` ((cost, block_m, block_n, stages, splits), any order) that keeps at
    least SPLIT_SKIP_FILL of the SMs' consumer lanes busy in one wave at M = m_hint <= SPLIT_SKIP_MAX_M, for a K loop
    without a wait per K block (16-bit types and unpromoted TF32, FP8 with K lanes, or promoted FP8 with two partial
    sets, from SPLIT_SKIP_MIN_N_TWO_SETS columns); None when there is none. It replaces a split-K pick
    (SPLIT_SKIP_*)."""
    if m_hint > SPLIT_SKIP_MAX_M or spec.grouped:
        return None
    no_wait = spec.dtype in SPLIT_SKIP_DTYPES and not spec.promote  # K loop without a wait per K block
    for tile in sorted(tiles, key=lambda t: t[0]):
        _, block_m, block_n, _, _ = tile
        lanes = 2 if sm90_wg_split_k(spec, block_m, False) else 1
        two_sets = sm90_two_partial_sets(spec, block_m, block_n, False)
        if two_sets:
            if block_n < SPLIT_SKIP_MIN_N_TWO_SETS:
                continue
        elif block_n < SPLIT_SKIP_MIN_N or (not no_wait and lanes == 1):
            continue
        count = -(-m_hint // block_m) * -(-spec.n // block_n)
        if count <= num_sms and count * lanes >= SPLIT_SKIP_FILL * num_sms:
            return tile
    return None


# Short K at decode sizes: a 64x64 tile streamed the weight 4-10% faster than the cost model's wider picks (64x192 /
# 64x256 for 16-bit, 64x128 for FP8), H200 session 11 with B loaded evict-first, M = 16..64 (bench/results/
# *decode-short-k-tiles-s11*): BF16 24576x1536 25.6-26.6 vs 27.6-28.1 us, 32768x512 15.3-16.2 vs 17.0-17.4; FP8
# per-tensor 32768x512 11.2-11.5 vs 11.8-12.2. At the stage cap (8 here): 12 stages were 2-6% slower, also on rows
# that already ran 64x64 (*decode-tiles-sweep-s11*). Measured for plain GEMMs of 16-bit types and FP8 with tensor /
# row scales only.
SHORT_K_DECODE_MAX_BYTES = 3072  # K x element size
SHORT_K_DECODE_TILE = (64, 64)
# M buckets above SPLIT_SKIP_MAX_M up to 128 (two 64-row M blocks): 64x128 at the stage cap (8) ran best of six
# tiles, 16-bit only measured (H200 session 17, bench/results/*deepseek-short-k-m128-tiles-s17*, us, ours / cuBLAS):
# BF16 / FP16 128x32768x512 17.6 / 18.3 against 18.7 / 19.0 at the model's 128x256 s3 (cuBLAS 18.7-19.0),
# 128x24576x1536 28.1 / 27.8 against 29.1 / 28.8 at 128x192 s4 (cuBLAS 31.0-31.4); 128x64 18.0-18.5 and 28.3,
# 128x128 s5 17.7-18.0 but 30.7-31.0, 64x64 18.8-18.9 and 32.3-32.5. FP8 per-tensor keeps the model's picks there
# (*decode-fp8-short-k-m128-tiles-s17*: 64x128 s7 / 128x128 s6 / 64x112 s8, within 3% of 128x64 s8; 64x64 5-10%
# slower; 64x128 s8 does not fit). FP8 block at M <= 64 too since session 19 (*exp-ab-fp8-32768x512-gemv-vs-64x64-s19*:
# 16x32768x512 11.54 vs 11.70 us at 64x128).
SHORT_K_DECODE_M128_MAX_M = 128
SHORT_K_DECODE_M128_TILE = (64, 128)
# ... and at the 192-row bucket up to K = 512 (16-bit) from N = 4096: H200 session 40 (exp_m_buckets --against
# shortk192, M 144 / 176 / 192, bench/results/*exp-m-buckets-vs-shortk192-s40*): 1.05-1.14x faster than the 128x256
# pick at 32768 x 512 (192 rows 20.8 -> 19.5 us, cuBLAS 19.4), 0.99-1.04x at 4096 x 512; slower than the bucket's
# 64-row picks at K = 1024 / 1536 (8192 x 1024 12.2 -> 13.5 us, 7168 x 1536 14.0 -> 16.5, 24576 x 1536 5-7%;
# 16384 x 1024 0.99-1.04x). Narrower N was not measured: 64x128 leaves most SMs idle there (N = 1024: 24 CTAs).
SHORT_K_DECODE_M192_BUCKETS = (192,)
SHORT_K_DECODE_M192_MAX_BYTES = 1024
SHORT_K_DECODE_M192_MIN_N = 4096


def _sm90_decode_short_k(spec: GemmSpec, m_hint: int, num_sms: int) -> tuple | None:
    """The (cost, block_m, block_n, stages, splits) entry that goes first when a row of K is at most
    SHORT_K_DECODE_MAX_BYTES: SHORT_K_DECODE_TILE at M = m_hint <= SPLIT_SKIP_MAX_M (16-bit and FP8 types),
    SHORT_K_DECODE_M128_TILE for 16-bit types up to SHORT_K_DECODE_M128_MAX_M and at SHORT_K_DECODE_M192_BUCKETS
    up to SHORT_K_DECODE_M192_MAX_BYTES from SHORT_K_DECODE_M192_MIN_N columns; None where the rule does not apply."""
    esize = dtypes.get(spec.dtype).storage_bytes
    if spec.grouped or spec.epilogue != "none" or spec.k * esize > SHORT_K_DECODE_MAX_BYTES:
        return None
    sixteen_bit = spec.dtype in ("bf16", "fp16")
    if m_hint <= SPLIT_SKIP_MAX_M:
        if not sixteen_bit and spec.dtype not in dtypes.FP8_DTYPES:
            return None
        block_m, block_n = SHORT_K_DECODE_TILE
    elif sixteen_bit and (m_hint <= SHORT_K_DECODE_M128_MAX_M or (
            m_hint in SHORT_K_DECODE_M192_BUCKETS and spec.k * esize <= SHORT_K_DECODE_M192_MAX_BYTES
            and spec.n >= SHORT_K_DECODE_M192_MIN_N)):
        block_m, block_n = SHORT_K_DECODE_M128_TILE
    else:
        return None
    if not sm90_block_n_legal(spec, block_n):
        return None
    stages = _sm90_stages(spec, block_m, block_n, m_hint=m_hint)
    if stages < 3:
        return None
    cost = sm90_tile_cost(m_hint, spec.n, spec.k, block_m, block_n, 128 // esize,
                          dtypes.get(spec.out_dtype).storage_bytes, num_sms, stages)
    return (cost, block_m, block_n, stages, 1)


# 64-row tiles (one consumer warpgroup) are costed up to SM90_ROWS64_MAX_M rows and at the buckets of
# SM90_ROWS64_BUCKETS. H200, session 21 (scripts/exp_m_buckets.py --against previous, the previous rule: 128-row tiles
# from 129 rows): at 260 and 300 rows (bucket 320) the 64-row tiles the cost model then picks ran 1.02-1.68x faster on
# 12 of the 14 rows whose pick changed (BF16 300 x 2112 x 7168 64x88 27.5 us vs 128x64 39.1, cuBLAS 25.4; FP8 per-tensor
# 260 x 2112 x 7168 17.0 vs 26.2) and 0.97 / 0.99x on 2; at 400 rows (a 448 bucket in that sweep) and 600-700 rows they
# lost up to 11% where they were picked (BF16 400 x 7168 x 2048 28.0 vs 26.4; FP8 per-tensor 700 x 4096 x 7168 42.2 vs
# 38.2), so those M keep 128-row tiles. 129-256 rows (bucket 256) were not measured then (for 129-192 rows see
# SM90_ROWS64_UNSPLIT_BUCKETS below). Those 128-row tiles were slowed by TMA's zero fill of their last M block (84 of
# 128 rows at 300 rows), which the edge maps removed (launch.edge_maps); re-measured against 128-row tiles costed at the
# same bucket (session 23, --against rows128at320, bench/results/*exp-m-buckets-rows64-vs-rows128-at-320-s23*, 7 shapes
# x 260 / 300 rows): 16-bit now runs 128-row tiles 1.072x faster in geomean (0.988-1.226; 300 x 7168 x 16384 150.3 ->
# 122.6 us, 300 x 2112 x 7168 27.4 -> 24.8), so only 8-bit types (FP8 block: 64-row tiles still 1.074x faster, 300 x
# 3072 x 7168 20.8 vs 27.0 us) keep 64-row tiles there. TF32 was measured neither way and goes with 16-bit.
SM90_ROWS64_MAX_M = 128
SM90_ROWS64_BUCKETS = (320,)
# 129-192 rows (their own bucket since session 40): there 128-row tiles compute 256 rows, a quarter to half of them
# idle, against three 64-row blocks. H200 session 40, first run (scripts/exp_m_buckets.py --against rows64at192, every
# 64-row tile costed there, 4 types x 12 (N, K) x M 160 / 192, bench/results/*exp-m-buckets-rows64at192-s40*): the
# unsplit 64-row picks at least 96 columns wide mostly ran faster (BF16 192 x 4096 x 28672 102.9 -> 91.3 us, cuBLAS
# 82.1; TF32 192 x 4096 x 14336 112.5 -> 92.0), narrower or split ones lost 7-21% to 128-row split-K picks (BF16 /
# TF32 192 x 2112 x 7168: 20.3 -> 21.9, 33.1 -> 39.3 us), and FP8 block scaling lost on most shapes (its 64-row
# tiles promote every K block on one consumer warpgroup: 192 x 7168 x 16384 55.4 -> 86.0). Second run, that rule
# against the one before (--against no192, M 144 / 176 / 192, bench/results/*exp-m-buckets-vs-no192-s40*): faster by
# 1.048x geomean BF16, 1.052x FP16, 1.036x TF32, 1.070x FP8 row (its 128-row picks are 176 wide), 1.068x BF16
# bias+gelu, 1.020x BF16 nn; but 2-12% slower at K = 512 in every type, and FP8 per-tensor 0.93-1.12x (1.004x).
# FP8 per-tensor is the other way round in width: its 64-row tiles of any width (64x40 / 64x48 / 64x96) ran 6-10%
# faster at N <= 4096, where its 128-row picks are 32-64 columns wide, and 64x112 / 64x176 0-7% slower at N >= 7168
# (first run, and a third at M 144 / 176 / 192, --against fp8t192, bench/results/*exp-m-buckets-vs-fp8t192-s40*:
# 192 x 2112 x 7168 15.6 -> 14.2 us, cuBLAS 14.8; 192 x 4096 x 28672 53.4 -> 49.0; 192 x 24576 x 1536 21.1 -> 22.3).
# So: unsplit, at K >= SM90_ROWS64_UNSPLIT_MIN_K, from SM90_ROWS64_UNSPLIT_MIN_N columns (FP8 per-tensor: any width,
# for N up to SM90_ROWS64_UNSPLIT_FP8_TENSOR_MAX_N), for the types that gained.
SM90_ROWS64_UNSPLIT_BUCKETS = (192,)
SM90_ROWS64_UNSPLIT_MIN_N = 96
SM90_ROWS64_UNSPLIT_MIN_K = 1024
SM90_ROWS64_UNSPLIT_FP8_TENSOR_MAX_N = 4096
# FP8 block scaling with N in [SM90_ROWS64_FP8_BLOCK_MIN_N, SM90_ROWS64_FP8_BLOCK_MAX_N] and K >= SM90_ROWS64_UNSPLIT_
# MIN_K weighs every 64-row tile at those buckets, split ones too: the cost model's 64x128 split picks ran 1.10-1.29x
# faster than its 128x128 split ones on all 18 rows of session 40's fifth run (--against fp8b192, N 576..2112, K
# 4096..8192, M 144 / 176 / 192, bench/results/*exp-m-buckets-vs-fp8b192-s40*: 192 x 2112 x 7168 19.3 -> 16.9 us,
# 192 x 576 x 7168 18.0 -> 15.9, 192 x 1024 x 4096 17.7 -> 13.9; torch block-scaled 25.6 / 18.8 / 17.6), where wider
# N lost with 64x64 unsplit tiles (first run: 192 x 7168 x 16384 55.4 -> 86.0). N below 512 (64x8 / 64x16 split
# picks) was not measured.
SM90_ROWS64_FP8_BLOCK_MIN_N = 512
SM90_ROWS64_FP8_BLOCK_MAX_N = 2112


def _trans_b_rows64_cost(spec: GemmSpec, m_hint: int, block_m: int) -> float:
    """The cost factor of a tile that converts B once per 64 rows (SM90_TRANS_B_ROWS64_COST), else 1."""
    return SM90_TRANS_B_ROWS64_COST if block_m == 64 and m_hint > 64 and sm90_trans_b(spec) else 1.0


def sm90_rows64_costed(spec: GemmSpec, m_hint: int) -> bool:
    """Whether the cost model weighs 64-row tiles at M bucket m_hint: up to SM90_ROWS64_MAX_M rows, at
    SM90_ROWS64_BUCKETS for 8-bit inputs, and at SM90_ROWS64_UNSPLIT_BUCKETS (sm90_rows64_unsplit_only; FP8 block
    scaling there with every 64-row tile, split too, in SM90_ROWS64_FP8_BLOCK_MIN_N..MAX_N columns)."""
    return (m_hint <= SM90_ROWS64_MAX_M or sm90_rows64_unsplit_only(spec, m_hint) or _rows64_fp8_block(spec, m_hint)
            or (m_hint in SM90_ROWS64_BUCKETS and dtypes.get(spec.dtype).storage_bytes == 1))


def _rows64_fp8_block(spec: GemmSpec, m_hint: int) -> bool:
    """FP8 block scaling at SM90_ROWS64_UNSPLIT_BUCKETS in SM90_ROWS64_FP8_BLOCK_MIN_N..MAX_N columns and K >=
    SM90_ROWS64_UNSPLIT_MIN_K: every 64-row tile weighed, split ones too."""
    return (m_hint in SM90_ROWS64_UNSPLIT_BUCKETS and spec.scaling == "block" and spec.k >= SM90_ROWS64_UNSPLIT_MIN_K
            and SM90_ROWS64_FP8_BLOCK_MIN_N <= spec.n <= SM90_ROWS64_FP8_BLOCK_MAX_N)


# 192-row tiles (three consumers) multiply as efficiently as 128-row ones: H200 session 49, one full wave each,
# 2112x2304x16384 at 192x192 812 TFLOPS, 1536x2816x16384 at 128x256 821; 1050x4096x7168 at 192x192 (one round)
# 91.5 us and 128x144 (two rounds of the same area) 90.4 (bench/results/*exp-ab-192-row-tiles-s49*). They win
# where their rounds hold less area: 2304x2112x7168 112.1 -> 92.3 us (192x192), 6144x2112x7168 262.8 -> 247.3,
# 2048x2112x7168 89.9 -> 86.1 (192x176, cuBLAS 86.0), 576x24576x1536 67.7 -> 64.6. The cost model's (rows +
# columns) term prices them ~3-8% cheaper per MAC than they are; this factor takes that back (a 192-row pick must
# save about that much by the model), and below two 192-row blocks nothing was measured. At 1.10 it also took
# 1050x4096x4096, where 192x192 ran 55.4 us against 128x144's 53.9 (same area per CTA); 1.12 leaves that one out and
# keeps every measured win.
SM90_ROWS192_COST = 1.12
SM90_ROWS192_MIN_M = 384


def sm90_rows192_costed(spec: GemmSpec, m_hint: int) -> bool:
    """Whether the cost model weighs 192-row tiles (three consumer warpgroups) for `spec` at M bucket m_hint: 16-bit
    nt dense GEMMs (sm90_three_consumer_problem) of at least SM90_ROWS192_MIN_M rows, with a 16-bit or FP32 D
    (quantize-on-store was not measured with them)."""
    return (m_hint >= SM90_ROWS192_MIN_M and sm90_three_consumer_problem(spec) is None
            and spec.epi.quant == "none")


def sm90_tile_may_split(spec: GemmSpec, m_hint: int, block_m: int) -> bool:
    """Whether a tile of `block_m` rows may run split-K at M bucket m_hint: every tile but the 64-row ones of a
    bucket that weighs them unsplit only (sm90_rows64_unsplit_only: split ones measured slower). The cost model's
    split ranking, sm90_split_config and build's split_k= all ask this."""
    return block_m != 192 and not (block_m == 64 and sm90_rows64_unsplit_only(spec, m_hint))


def sm90_rows64_unsplit_only(spec: GemmSpec, m_hint: int) -> bool:
    """Whether M bucket m_hint weighs 64-row tiles unsplit and from sm90_rows64_unsplit_min_n columns only: the
    SM90_ROWS64_UNSPLIT_BUCKETS at K >= SM90_ROWS64_UNSPLIT_MIN_K, for 16-bit, TF32, FP8 with row scales, and FP8
    with a per-tensor scale up to SM90_ROWS64_UNSPLIT_FP8_TENSOR_MAX_N columns (not block scales, INT8, the TF32
    kernel that transposes B in shared memory, or promoted / raw-B TF32 (dtype fp32, which skips the bucket:
    tile_bucket): measured slower, or not measured)."""
    if m_hint not in SM90_ROWS64_UNSPLIT_BUCKETS or spec.k < SM90_ROWS64_UNSPLIT_MIN_K or sm90_trans_b(spec):
        return False
    if spec.dtype in dtypes.FP8_DTYPES:
        return spec.scaling == "row" or (spec.scaling == "tensor" and spec.n <= SM90_ROWS64_UNSPLIT_FP8_TENSOR_MAX_N)
    return spec.dtype in ("bf16", "fp16") or (spec.dtype == "tf32" and not spec.promoted and not spec.raw_b)


def sm90_rows64_unsplit_min_n(spec: GemmSpec) -> int:
    """The narrowest 64-row tile sm90_rows64_unsplit_only buckets weigh: any for FP8 per-tensor scaling, else
    SM90_ROWS64_UNSPLIT_MIN_N."""
    return 8 if spec.dtype in dtypes.FP8_DTYPES and spec.scaling == "tensor" else SM90_ROWS64_UNSPLIT_MIN_N


def sm90_epilogue_spills(spec: GemmSpec, block_m: int, block_n: int) -> bool:
    """Whether ptxas keeps bytes on the stack for this tile's epilogue: a 64-row tile at least 240 columns wide
    that adds a column bias, activates and quantizes to a static scale (bf16 / fp16 / tf32, relu / gelu / silu /
    sigmoid, FP8 and INT8 alike, offline compiles of 2026-12-01; 224 columns, 128-row tiles, a row bias, gated units
    and 16-bit D did not). Since the bias is read in the epilogue (2026-12-04) 64x240 nt keeps 16 bytes (bf16 / fp16
    / tf32 / int8) and 64x256 none. The cost model never ranked such a tile first; the tuner offered it as a
    candidate."""
    epi = spec.epi
    return (block_m == 64 and block_n >= 240 and epi.bias == "col" and epi.activation != "none"
            and epi.has_static_scale)


# Tiles of 128+ rows and at most this many columns only where they fit one round of the SMs: over several rounds they
# ran 1.3-1.7x slower per output than 128x144 (their A + B bytes per MAC are 1.6x), which the cost model's (rows +
# columns) term does not see. H200 session 49 (bench/results/*gated-thin-tiles*): bf16 2048x2112x7168 128x64 139.3
# us vs 128x144 90.7; bias+swiglu, where the model picked 128x64, 2048x2112x7168 139.0 -> 84.8 (192x176) and
# 1024x2112x7168 57.0 -> 48.4 (128x144). In one round (512x2112x7168) 128x64 stays the fastest (27.8 vs 43.3). From
# SM90_THIN_MIN_M rows on: with one M block A's re-reads are few (TF32 nn at 96-128 rows: 128x64 over 224 rounds of
# 28672 columns measured fastest, session 29).
SM90_THIN_MAX_BLOCK_N = 64
SM90_THIN_MIN_M = 512


def _sm90_priced_cost(spec: GemmSpec, m: int, block_m: int, block_n: int, stages: int, num_sms: int,
                      groups: int = 1) -> float:
    """An unsplit (unswapped) tile's price at M = m: sm90_tile_cost for the spec's D (gated units' half-width D,
    their few 16-byte slices), times the 192-row or trans_b 64-row factor."""
    cost = sm90_tile_cost(m, spec.n, spec.k, block_m, block_n, 128 // dtypes.get(spec.dtype).storage_bytes,
                          dtypes.get(spec.out_dtype).storage_bytes, num_sms, stages,
                          block_n // 2 if spec.epi.is_gated else None, groups, few_16b_slices=sm90_few_16b_slices(spec))
    return cost * (SM90_ROWS192_COST if block_m == 192 else _trans_b_rows64_cost(spec, m, block_m))


def _sm90_tiles_by_cost(spec: GemmSpec, m_hint: int, num_sms: int,
                        preferred_only: bool = True, groups: int = 1) -> list[tuple[float, int, int, int, int]]:
    """(cost, block_m, block_n, stages, splits) of every sm90 tile with at least 3 stages, cheapest first:
    BLOCK_M in {64, 128, 192} (64 only for small M: a consumer warpgroup idles there; 192: sm90_rows192_costed) and
    every BLOCK_N multiple of 8 up to 256 that the epilogue can use (thin ones in one round only:
    SM90_THIN_MAX_BLOCK_N); stages as many as shared memory holds, up to sm90_stage_cap;
    splits: the best split-K count at m_hint (non-grouped GEMMs; 1 when it does not pay, or when
    _sm90_decode_filler finds an unsplit tile that fills the SMs, which then comes first; at short K and small M,
    _sm90_decode_short_k's tile comes first). Where no preferred
    tile suits the epilogue (FP8 row scaling prefers 176, which quant_fp8_g128 cannot use), every legal one counts,
    and kTransB tiles down to 3 stages (quant_fp8_g128's 128 columns leave TF32 nn 5 at most).
    Raw-B GEMMs: _raw_b_tiles_by_cost."""
    if spec.raw_b:
        return _raw_b_tiles_by_cost(spec, m_hint, num_sms)
    stage_hint = None if spec.grouped or groups > 1 else m_hint  # deeper stages measured on dense GEMMs only
    trans_b = sm90_trans_b(spec)
    rows64_min_n = sm90_rows64_unsplit_min_n(spec) if sm90_rows64_unsplit_only(spec, m_hint) else 0
    tiles = []
    for block_m in (192, 128, 64):
        if block_m == 64 and not sm90_rows64_costed(spec, m_hint):
            continue
        if block_m == 192 and not sm90_rows192_costed(spec, m_hint):
            continue
        for block_n in SM90_BLOCK_N:
            if not sm90_block_n_legal(spec, block_n) or sm90_epilogue_block_n_problem(spec, block_n) is not None:
                continue
            if block_m == 64 and block_n < rows64_min_n:
                continue
            if preferred_only and not sm90_block_n_preferred(spec, block_n, m_hint, groups):
                continue
            if (sm90_accumulators(block_m, block_n, spec.promote) > sm90_max_accumulators(spec, block_m)
                    or sm90_epilogue_spills(spec, block_m, block_n)):
                continue
            if (block_m >= 128 and block_n <= SM90_THIN_MAX_BLOCK_N and m_hint >= SM90_THIN_MIN_M and not spec.grouped
                    and groups == 1 and -(-m_hint // block_m) * -(-spec.n // block_n) > num_sms):
                continue  # a thin tile over several rounds (SM90_THIN_MAX_BLOCK_N)
            stages = _sm90_stages(spec, block_m, block_n, m_hint=stage_hint)
            if stages < (SM90_TRANS_B_MIN_STAGES if trans_b and preferred_only else 3):
                continue
            tiles.append((_sm90_priced_cost(spec, m_hint, block_m, block_n, stages, num_sms, groups),
                          block_m, block_n, stages, 1))
    if not tiles and preferred_only:
        return _sm90_tiles_by_cost(spec, m_hint, num_sms, preferred_only=False, groups=groups)
    filler = _sm90_decode_filler(spec, m_hint, num_sms, tiles)
    if not spec.grouped and m_hint <= SPLIT_MAX_M and tiles:
        # Split-K versions of the tiles, where one beats every unsplit tile by SPLIT_MIN_GAIN.
        unsplit_best = min(t[0] for t in tiles)
        for i, (cost, block_m, block_n, stages, _) in enumerate(tiles):
            if (sm90_accumulators(block_m, block_n, False) > split_max_accumulators(spec)
                    or not sm90_tile_may_split(spec, m_hint, block_m)):
                continue
            split_cost, best = sm90_best_splits(spec, m_hint, block_m, block_n, num_sms, stages)
            split_cost *= _trans_b_rows64_cost(spec, m_hint, block_m)
            split_stages = _sm90_stages(spec, block_m, block_n, split_k=True, m_hint=stage_hint)
            if best > 1 and split_cost < SPLIT_MIN_GAIN * unsplit_best and split_stages >= 3:
                tiles[i] = (split_cost, block_m, block_n, split_stages, best)
    # Stable: ties keep the wider tile first; at decode sizes a 64-row tile wins a tie (see SM90_DECODE_TIE_M).
    tiles.sort(key=lambda t: (t[0], t[1] != 64 if m_hint <= SM90_DECODE_TIE_M else False))
    if filler is not None and tiles[0][4] > 1:  # a split-K pick gives way to a tile that fills the SMs unsplit
        tiles = [filler] + [t for t in tiles if t[1:3] != filler[1:3]]
    short_k = _sm90_decode_short_k(spec, m_hint, num_sms)
    if short_k is not None:
        tiles = [short_k] + [t for t in tiles if t[1:3] != short_k[1:3]]
    return tiles


def sm90_ranked(spec: GemmSpec, m_hint: int, num_sms: int) -> list[KernelConfig]:
    """Every sm90 tile config by `sm90_tile_cost`, cheapest first."""
    return [sm90_config(spec, bm, bn, st, split_k=sk > 1, m_hint=m_hint)
            for _, bm, bn, st, sk in _sm90_tiles_by_cost(spec, m_hint, num_sms)]


# Fused epilogues with an activation or a residual keep the CUDA cores busy for a while after each tile; up to
# this K the 128x128 ping-pong tile (one consumer's epilogue under the other's main loop) beat the cooperative
# tiles on the H200 (bench/results/*pingpong*: bias+gelu at 4096 x {24576x1536, 32768x512, 7168x2048} 4-11%
# faster; K = 7168 lost 4%, its main loop is long enough to hide nothing worth the smaller tile).
_PINGPONG_MAX_K = 4096


def _sm90_pingpong_fits(spec: GemmSpec) -> bool:
    """Whether the 128x128 ping-pong tile can serve `spec` and has an epilogue to hide: dense, not the kernel that
    transposes B in shared memory (its converter runs with cooperative consumers only), an activation or a residual,
    and 128 columns the accumulators and the epilogue can take."""
    epi = spec.epi
    return (not spec.grouped and not sm90_trans_b(spec) and (epi.activation != "none" or epi.residual)
            and sm90_accumulators(128, 128, spec.promote, True) <= sm90_max_accumulators(spec)
            and sm90_epilogue_block_n_problem(spec, 128) is None)


def _sm90_pingpong_pays(spec: GemmSpec, m_hint: int, num_sms: int, block_m: int, block_n: int) -> bool:
    """Whether the 128x128 ping-pong tile replaces the cost model's cooperative pick: an epilogue with real work
    per element, a short K, and no more waves (counted in cooperative-tile areas) than the cooperative tile;
    2112 columns at 128x128 need 5 waves where 128x176 needs 3 (measured 21% slower)."""
    if not _sm90_pingpong_fits(spec) or spec.k > _PINGPONG_MAX_K or m_hint <= SM90_SMALL_M_BUCKET_MAX:
        return False
    if spec.epi.has_group_scales:  # a ping-pong consumer's 128 rows of parked values + the division's calls spilled
        return False
    waves = -(-(-(-m_hint // block_m) * -(-spec.n // block_n)) // num_sms)
    pp_waves = -(-(-(-m_hint // 128) * -(-spec.n // 128)) // num_sms)
    return pp_waves * 128 * 128 <= waves * block_m * block_n


# TF32 at short K and large M: ping-pong consumers of 64 rows, D through the ring, beat the cooperative tiles (each
# consumer's epilogue, 48 KB of FP32 per 64x192 tile, runs under the other's main loop). H200 session 14, one run
# (bench/results/*tf32-pp64-s14*): 4096x32768x512 402.6 us at 64x192 vs 421.7 at the model's 128x224 (64x224 406.9,
# 64x256 416.3); at K = 1536 within 2% either way (24576x1536: 64x224 818 vs 836), at K >= 2048 5-30% slower.
TF32_SHORT_K_PINGPONG_MAX_K = 512
TF32_SHORT_K_PINGPONG_MIN_M = 1024
TF32_SHORT_K_PINGPONG_TILE = (64, 192)


def _sm90_tf32_short_k_pingpong(spec: GemmSpec, m_hint: int) -> KernelConfig | None:
    """The ping-pong tile of TF32_SHORT_K_PINGPONG_* where that measured rule applies (plain unpromoted TF32 with
    FP32 D, K <= 512, M >= 1024, N at least one tile), else None."""
    block_m, block_n = TF32_SHORT_K_PINGPONG_TILE
    if (spec.dtype != "tf32" or spec.promoted or spec.epilogue != "none" or spec.grouped or sm90_trans_b(spec)
            or spec.k > TF32_SHORT_K_PINGPONG_MAX_K or m_hint < TF32_SHORT_K_PINGPONG_MIN_M or spec.n < block_n):
        return None
    d_ring = sm90_d_ring(spec, block_m, block_n, True, m_hint)
    if not d_ring:
        return None
    cfg = sm90_config(spec, block_m, block_n, pingpong=True, d_ring=d_ring)
    return cfg if cfg.num_stages >= 3 else None


# Grouped GEMMs of a few waves of long-K tiles (a few groups of a few hundred to a thousand rows: decode MoE, small
# prefill) get a split-K kernel that decides on the device, from the realised group sizes, whether to split the tiles
# of the last, partial wave (all tiles when there are fewer than half as many as SMs) and how far
# (GroupedTileScheduler in sched_sm90.cuh, splitk.tail_split): at most GROUPED_MAX_SPLITS shares of at least
# _MIN_K_BLOCKS_PER_SPLIT K blocks each (split_candidates). Measured on the H200 (docs/NOTES.md, sessions 20-21,
# masked rows):
# - FP8, the cost model's tile (128x128), up to GROUPED_SPLIT_MAX_WAVES expected waves: 7-17% faster where it split
#   (24.5 vs 28.0 us at 231 rows x 4096 x 7168), 1-3% slower where the realised groups left nothing to split (its
#   K loop sits at the register limit); at K = 2048 a split tail lost (28.9 vs 26.6 us).
# - 16-bit: the cost model's wide tiles (128x224 / 128x256 at 3 stages) fill a wave at the expected rows, but the
#   realised rows (only the GPU knows them) often leave a second wave a few tiles full: 586 masked rows x 4096 x 7168
#   ran 76.9 us at 128x256 and 61.2 as 128x128 device-split (torch 49.2). 128x128 split up to GROUPED_SCAN_WAVES
#   expected waves (where the kernel still counts): masked BF16 geomean against torch 0.980 -> 1.036 and 0.967 ->
#   1.028 over two group-size draws (30 rows each), its split kernel no slower than the plain one where nothing
#   split. Narrower picks (128x64, 128x112: one or two hundred rows) stay plain: they were faster than 128x128 split.
GROUPED_MAX_SPLITS = 4
GROUPED_SPLIT_MIN_K_BLOCKS = 32
GROUPED_SPLIT_MAX_WAVES = 2
GROUPED_SPLIT_TILE_16BIT = (128, 128)


def grouped_split_tile(spec: GemmSpec, m_hint: int, num_sms: int, groups: int, block_m: int, block_n: int
                       ) -> tuple[int, int] | None:
    """The tile of the device-split kernel build_grouped compiles instead of the cost model's (block_m, block_n),
    or None for the plain kernel of that tile: K has at least GROUPED_SPLIT_MIN_K_BLOCKS blocks, and
    - FP8: the same tile, when `groups` groups of m_hint rows make at most GROUPED_SPLIT_MAX_WAVES waves of it;
    - 16-bit: GROUPED_SPLIT_TILE_16BIT, when the pick is at least as wide, the epilogue can use its width (a gated
      unit with quant_fp8_g128 needs 256 columns) and its tiles make at most splitk.GROUPED_SCAN_WAVES waves
      (beyond them the kernel never splits);
    and the tile's accumulators leave the reduction its registers. Epilogues with a bias keep the plain kernel: the
    bias read pushed the split kernels (168 registers a thread) into a stack frame (8-24 bytes)."""
    from .splitk import GROUPED_SCAN_WAVES  # splitk imports this module

    if (spec.loop_k < GROUPED_SPLIT_MIN_K_BLOCKS * (128 // dtypes.get(spec.dtype).storage_bytes)
            or spec.epi.bias != "none"):
        return None
    if spec.dtype in dtypes.FP8_DTYPES:
        tile, max_waves = (block_m, block_n), GROUPED_SPLIT_MAX_WAVES
    elif (dtypes.get(spec.dtype).storage_bytes == 2 and block_n >= GROUPED_SPLIT_TILE_16BIT[1]
          and sm90_epilogue_block_n_problem(spec, GROUPED_SPLIT_TILE_16BIT[1]) is None):
        tile, max_waves = GROUPED_SPLIT_TILE_16BIT, GROUPED_SCAN_WAVES
    else:
        return None
    tiles = groups * -(-m_hint // tile[0]) * -(-spec.n // tile[1])
    if tiles > max_waves * num_sms or sm90_accumulators(*tile, False) > split_max_accumulators(spec):
        return None
    return tile


# FP8 grouped GEMMs of 128x128 tiles compile the device-split kernel everywhere, and launches split only where
# grouped_split_tile would have chosen it (grouped_launch_splits; elsewhere the host passes one share and the kernel
# counts nothing). The split kernel's scale warp issues the A-scale bulk copy (gemm_sm90.cuh, kScaleWarpBulkA); that
# pair beat the plain kernel on the multi-wave MoE rows, while the plain kernel with the scale warp's copy ran 5-15%
# slower (why is open: both kernels' roles are the same code; ncu of the plain one showed the L2 request coalescer
# merging fewer loads of neighbouring CTAs). H200, session 43 (bench/results/*moe-fp8-*-s43*, same calls):
# 4 x 8192 x 4096 x 7168 1740 -> 1638 us, 4 x 8192 x 7168 x 2048 912 -> 840, masked 16 x ~1024 x 4096 x 7168
# 903 -> 855; against the plain 128x128 kernel timed in the record's call (*moe-fp8-record-cea5017-s43*) 1.035x over
# the 42 rows (contiguous 1.03-1.07x, masked K = 7168 1.00-1.18x, masked K = 2048 0.97-1.04x). Only what was
# measured: no epilogue, K >= 2048. A forced device-split config (build_grouped(config=...)) may split wherever the
# realised groups leave SMs idle, also where the heuristic's same kernel would not.
GROUPED_FP8_SPLIT_KERNEL_TILE = (128, 128)
GROUPED_FP8_SPLIT_KERNEL_MIN_K = 2048


def _grouped_fp8_split_kernel(spec: GemmSpec, block_m: int, block_n: int) -> bool:
    """Whether a grouped FP8 spec whose cost-model tile is (block_m, block_n) gets the device-split kernel for its
    speed (GROUPED_FP8_SPLIT_KERNEL_TILE) without the split rule's wave and K limits: the measured cases only, no
    epilogue and K >= GROUPED_FP8_SPLIT_KERNEL_MIN_K (the MoE rows: K = 2048 and 7168)."""
    return (spec.grouped and spec.dtype in dtypes.FP8_DTYPES and spec.epilogue == "none"
            and spec.k >= GROUPED_FP8_SPLIT_KERNEL_MIN_K and (block_m, block_n) == GROUPED_FP8_SPLIT_KERNEL_TILE
            and sm90_accumulators(block_m, block_n, False) <= split_max_accumulators(spec))


def grouped_launch_splits(spec: GemmSpec, m_hint: int, num_sms: int, groups: int) -> bool:
    """Whether launches of the heuristic's grouped kernel (choose_config(spec, m_hint, ..., num_sms, groups)) may
    split tiles: where grouped_split_tile chose the device-split kernel, not where _grouped_fp8_split_kernel did
    (nor for a plain kernel)."""
    return _sm90_pick(spec, tile_bucket(spec, m_hint), num_sms, groups)[1]


def choose_sm90_config(spec: GemmSpec, m_hint: int, num_sms: int, groups: int = 1) -> KernelConfig:
    """The cheapest tile of the cost model, or the 128x128 ping-pong tile where `_sm90_pingpong_pays`, or TF32's
    short-K ping-pong tile (`_sm90_tf32_short_k_pingpong`) (`groups`: see sm90_tile_cost)."""
    return _sm90_pick(spec, m_hint, num_sms, groups)[0]


@functools.lru_cache(maxsize=1024)
def _sm90_pick(spec: GemmSpec, m_hint: int, num_sms: int, groups: int = 1) -> tuple[KernelConfig, bool]:
    """choose_sm90_config's tile and whether launches of it may split on the device (grouped_launch_splits), decided
    together so that the two cannot drift apart. Memoized: a pure function of its arguments (all hashable, the
    result frozen), and at 0.65-0.9 ms it was the largest host cost of a warm build (2 cores). Where swapped tiles
    are weighed (sm90_swap_ab_costed: m_hint is then a bucket of SM90_SWAP_AB_BUCKET_STEP rows), the pick of the
    usual bucket gives way to the cheapest swapped tile when that costs less by SM90_SWAP_AB_MIN_GAIN at m_hint."""
    if groups == 1 and sm90_swap_ab_costed(spec, m_hint):
        cfg, device_splits = _sm90_pick_tile(spec, m_bucket(m_hint), num_sms, groups)
        if cfg.split_k or cfg.pingpong:
            return cfg, device_splits
        pick_cost = _sm90_priced_cost(spec, m_hint, cfg.block_m, cfg.block_n, cfg.num_stages, num_sms)
        if cfg.block_m == 64:
            pick_cost *= SM90_SWAP_AB_ROWS64_USUAL_COST
        swapped = _sm90_swap_ab_best(spec, m_hint, num_sms)
        if swapped is not None and swapped[0] < SM90_SWAP_AB_MIN_GAIN * pick_cost:
            _, block_m, block_n, stages = swapped
            return sm90_config(spec, block_m, block_n, stages, swap_ab=True), False
        return cfg, device_splits
    return _sm90_pick_tile(spec, m_hint, num_sms, groups)


def _sm90_pick_tile(spec: GemmSpec, m_hint: int, num_sms: int, groups: int = 1) -> tuple[KernelConfig, bool]:
    """_sm90_pick without swapped tiles, for the usual M bucket m_hint."""
    if groups == 1:
        short_k = _sm90_tf32_short_k_pingpong(spec, m_hint)
        if short_k is not None:
            return short_k, False
    ranked = _sm90_tiles_by_cost(spec, m_hint, num_sms, groups=groups)
    if not ranked:  # a bug of the rules (a spec the family accepts must have a tile), not of the call
        raise ValueError(f"no sm90 tile serves {spec.tag} (M = {m_hint}); please report it")
    _, block_m, block_n, stages, splits = ranked[0]
    split_tile = grouped_split_tile(spec, m_hint, num_sms, groups, block_m, block_n) if spec.grouped else None
    if split_tile is not None:
        if split_tile == (block_m, block_n):
            stages = min(stages, _sm90_stages(spec, block_m, block_n, split_k=True))
        else:  # as many stages as fit (what the measurement forced)
            (block_m, block_n), stages = split_tile, None
        return sm90_config(spec, block_m, block_n, stages, split_k=True, m_hint=m_hint), True
    if _grouped_fp8_split_kernel(spec, block_m, block_n):
        stages = min(stages, _sm90_stages(spec, block_m, block_n, split_k=True))
        return sm90_config(spec, block_m, block_n, stages, split_k=True, m_hint=m_hint), False
    if (splits == 1 and _sm90_pingpong_pays(spec, m_hint, num_sms, block_m, block_n)
            and _sm90_stages(spec, 128, 128, True) >= 3):
        return sm90_config(spec, 128, 128, pingpong=True), False
    return sm90_config(spec, block_m, block_n, stages, split_k=splits > 1, m_hint=m_hint), False


choose_sm90_config.cache_clear = _sm90_pick.cache_clear  # callers that change the rules' constants clear the memo


def candidate_configs(spec: GemmSpec, m_hint: int, arch: str, num_sms: int | None = None,
                      limit: int = 8) -> list[KernelConfig]:
    """What the tuner times for M's bucket: the heuristic's choice first (and it with one stage fewer),
    then the model's next best tiles (sm90), or the portable tile shapes (sm80)."""
    first = choose_config(spec, m_hint, arch, num_sms)
    found = [first]
    if first.family == "sm90":
        if first.num_stages > 3:
            found.append(dataclasses.replace(first, num_stages=first.num_stages - 1))
        ranked = sm90_ranked(spec, usual_tile_bucket(spec, m_hint), num_sms or DEFAULT_SM90_NUM_SMS)
        # The tiles that won somewhere in the H200 sweeps, then the model's order.
        staples = [cfg for cfg in ranked if (cfg.block_m, cfg.block_n) in ((128, 256), (128, 128), (64, 128))]
        if _sm90_pingpong_fits(spec) and _sm90_stages(spec, 128, 128, True) >= 3:
            pingpong = sm90_config(spec, 128, 128, pingpong=True)  # the ping-pong tile hides such epilogues
            if pingpong not in found:
                found.append(pingpong)
        for cfg in staples + ranked:
            if len(found) >= limit:
                break
            if all((cfg.block_m, cfg.block_n, cfg.pingpong, cfg.swap_ab) != (f.block_m, f.block_n, False, f.swap_ab)
                   for f in found):
                found.append(cfg)
    else:
        for block_m, warps_m in ((128, 2), (64, 1)):
            for block_n, warps_n in ((128, 4), (64, 2)):
                cfg = dataclasses.replace(first, block_m=block_m, warps_m=warps_m, block_n=block_n,
                                          warps_n=warps_n)
                if cfg.fits(spec, arch) and cfg not in found:
                    found.append(cfg)
    return found[:limit]


def sm90_split_config(spec: GemmSpec, m_hint: int, num_sms: int, splits: int) -> KernelConfig:
    """The cheapest split-K tile of the cost model for M bucket m_hint with `splits` shares (build's split_k=)."""
    esize = dtypes.get(spec.dtype).storage_bytes
    out_esize = dtypes.get(spec.out_dtype).storage_bytes
    best = None
    for block_m in (128, 64):
        if block_m == 64 and not sm90_rows64_costed(spec, m_hint):
            continue
        for block_n in SM90_BLOCK_N:
            if (not sm90_block_n_legal(spec, block_n) or sm90_epilogue_block_n_problem(spec, block_n) is not None
                    or not sm90_tile_may_split(spec, m_hint, block_m)
                    or not sm90_block_n_preferred(spec, block_n, m_hint)
                    or sm90_accumulators(block_m, block_n, False) > split_max_accumulators(spec)
                    or sm90_accumulators(block_m, block_n, spec.promote) > sm90_max_accumulators(spec)):
                continue
            stages = _sm90_stages(spec, block_m, block_n, split_k=True, m_hint=m_hint)
            if stages < 3:
                continue
            cost = sm90_tile_cost(m_hint, spec.n, spec.k, block_m, block_n, 128 // esize, out_esize, num_sms, stages,
                                  block_n // 2 if spec.epi.is_gated else None, splits=splits,
                                  few_16b_slices=sm90_few_16b_slices(spec))
            if best is None or cost < best[0]:
                best = (cost, block_m, block_n, stages)
    if best is None:
        raise ValueError(f"split_k={splits}: no split-K tile serves {spec.tag} (none that its epilogue and shared "
                         f"memory allow holds at most {split_max_accumulators(spec)} accumulators a thread); leave "
                         "split_k unset or 1")
    return sm90_config(spec, best[1], best[2], best[3], split_k=True, m_hint=m_hint)


def sm90_config(spec: GemmSpec, block_m: int, block_n: int, num_stages: int | None = None,
                group_m: int = 16, pingpong: bool = False, split_k: bool = False,
                d_ring: int | None = None, m_hint: int | None = None, swap_ab: bool = False) -> KernelConfig:
    """An sm90 config for `spec` with the given tile (stages: as many as fit when None; d_ring: the rule of
    sm90_d_ring at m_hint when None, 0 for swapped tiles)."""
    esize = dtypes.get(spec.dtype).storage_bytes
    if swap_ab and d_ring is None:
        d_ring = 0
    if d_ring is None:
        d_ring = sm90_d_ring(spec, block_m, block_n, pingpong, m_hint)
    stages = (_sm90_stages(spec, block_m, block_n, pingpong, split_k, d_ring=d_ring, swap_ab=swap_ab)
              if num_stages is None else num_stages)
    return KernelConfig(family="sm90", block_m=block_m, block_n=block_n, block_k=128 // esize,
                        num_stages=stages, warps_m=2, warps_n=1, vec_a=16 // esize, vec_b=16 // esize,
                        group_m=group_m, pingpong=pingpong, split_k=split_k, d_ring=d_ring, swap_ab=swap_ab)


def max_vector(esize: int, ptr: int, row_stride: int, rows: int) -> int:
    """Widest load (elements, <= 16 bytes) that every row start of a matrix allows.

    A matrix is described by its base pointer and its row stride in elements; a
    vector load of v elements is legal when every row starts v-element aligned.
    """
    vec = 16 // esize
    while vec > 1:
        aligned_ptr = ptr % (vec * esize) == 0
        aligned_rows = rows <= 1 or row_stride % vec == 0
        if aligned_ptr and aligned_rows:
            return vec
        vec //= 2
    return 1


def packed_vectors(spec: GemmSpec) -> tuple[int, int]:
    """Vector widths for freshly allocated, packed operands (256-byte aligned bases)."""
    esize = dtypes.get(spec.dtype).storage_bytes
    a_ld = spec.k if spec.a_k_major else None  # an MN-major A has M as its row length
    b_ld = spec.k if spec.b_k_major else spec.n
    vec_a = max_vector(esize, 0, a_ld, 2) if a_ld is not None else 16 // esize
    vec_b = max_vector(esize, 0, b_ld, 2)
    return vec_a, vec_b


# M buckets: (lo, hi, step) ranges where M is rounded up to a whole step of rows, powers of two elsewhere. A tile's
# wave count changes with every M block, and a tile chosen for the bucket's top can run far from it at the bucket's
# bottom: with power-of-two buckets every M of (512, 1024] ran the 1024-row tile, 128x256 for BF16 4096 x 7168, which
# at 586 rows makes 80 tiles on 132 SMs (76.4 us; the tile the cost model picks for 640 rows, 128x160: 52.0; cuBLAS
# 49.3). H200, docs/NOTES.md session 21 (scripts/exp_m_buckets.py): 128-row buckets in (512, 4096] took BF16 from
# 0.821 to 0.925 and 0.937 to 0.989 geomean against cuBLAS, FP8 per-tensor 1.042 -> 1.063, FP8 block 1.021 -> 1.032
# and 1.094 -> 1.090 (99 rows at M = 586..3500). M in (256, 320] has its own bucket, 5 blocks of the 64-row tiles the
# cost model weighs there for 8-bit types (SM90_ROWS64_BUCKETS; 16-bit costs 128-row tiles at 320 rows), and M in
# (320, 384] its own too: the 512-row bucket's tiles ran there 1.13x slower in geomean (BF16) and 1.10x (FP8
# per-tensor) than the cost model's picks for 384 rows (H200 session 24, scripts/exp_m_buckets.py --against rows,
# bench/results/*exp-m-buckets-384-rows-s24*, 14 shapes x 330 / 384 rows: BF16 24576 x 1536 54.5 -> 43.8 us, 4096 x
# 7168 40.5 -> 34.1, FP8 7168 x 16384 81.8 -> 66.1; against cuBLAS BF16 0.90 -> 1.02, FP8 1.00 -> 1.10; one row 1.3%
# slower); against the 512-row bucket's kernels (--against no384, *exp-m-buckets-384-vs-512-bucket-*): FP16 1.119x,
# TF32 1.129x, FP8 block 1.013x (the one changed row 1.205x), none slower; fp32's raw-B GEMM 8-37% faster than the
# 512-row bucket's tiles on 5 shapes (*exp-fp32-384-bucket-*). At 400 / 448 rows the cost model's picks equal the
# 512-row bucket's on the same shapes. M in (128, 192] has its own bucket since session 40, for the 64-row tiles of
# SM90_ROWS64_UNSPLIT_BUCKETS. Small M otherwise keeps powers of two (the decode rules were measured on them); above
# 4096 a 128-row block is under 3% of M.
M_BUCKET_STEPS = ((128, 384, 64), (512, 4096, 128))
# Buckets measured on dense GEMMs only: grouped GEMMs choose their tile for the next bucket that is not one of them.
DENSE_ONLY_BUCKETS = (192, 320, 384)
# The 3xTF32 GEMMs of dtype fp32 (GemmSpec.promoted / raw_b) were measured at 129-192 rows in the 256-row bucket only
# (its raw-B tiles would change there: its own cost model weighs 64-row tiles at every M): they keep that choice.
FP32X3_SKIPPED_BUCKETS = (192,)


def raster_band_m_blocks(m_blocks: int, group_m: int, band: int) -> int:
    """M blocks in band `band` of the persistent tile order (sched_sm90.cuh's raster: bands of group_m consecutive
    M blocks, the last band holding what is left); its host mirror for grouped.tile_walk and launch.a_edge_used."""
    return min(group_m, m_blocks - band * group_m)


def m_bucket(m: int) -> int:
    """The M a config is chosen for: M rounded up to a whole step of rows inside a range of M_BUCKET_STEPS, else to
    a power of two in [64, 16384].

    Heuristics see this representative, not the exact M, so that every M of a bucket shares one
    compiled kernel (and the functional ``gemm`` one memo entry); above 16384 rows the wave
    quantisation the heuristics model no longer changes the choice.
    """
    for lo, hi, step in M_BUCKET_STEPS:
        if lo < m <= hi:
            return -(-m // step) * step
    bucket = 64
    while bucket < m and bucket < 16384:
        bucket *= 2
    return bucket


def next_m_bucket(bucket: int) -> int:
    """The bucket after `bucket` (warmup lists a range's buckets with it): the bucket of the next row; past the
    largest bucket, twice it (so that a walk up to it ends)."""
    nxt = m_bucket(bucket + 1)
    return nxt if nxt > bucket else 2 * bucket


def m_bucket_for(spec: GemmSpec, m: int, arch: str = "sm_90a") -> int:
    """The M bucket Gemms of `spec` are chosen, memoized and tuned for on `arch`: m_bucket, except M rounded up to
    SM90_SWAP_AB_BUCKET_STEP rows where swapped tiles are weighed (sm90_swap_ab_costed, Hopper only: their gain is
    M's granularity, so a Gemm chosen for 1050 rows must not serve 1100)."""
    if arch == "sm_90a" and sm90_swap_ab_costed(spec, m):
        return -(-m // SM90_SWAP_AB_BUCKET_STEP) * SM90_SWAP_AB_BUCKET_STEP
    return m_bucket(m)


def buckets_within(spec: GemmSpec, bucket: int, arch: str = "sm_90a") -> tuple[int, ...]:
    """The m_bucket_for buckets of the M that m_bucket rounds up to `bucket` (warmup compiles a kernel for each):
    `bucket` itself, or its steps of SM90_SWAP_AB_BUCKET_STEP rows where swapped tiles are weighed (on Hopper)."""
    first = bucket
    while first > 1 and m_bucket(first - 1) == bucket:
        first -= 1
    if arch != "sm_90a" or not (sm90_swap_ab_costed(spec, first) or sm90_swap_ab_costed(spec, bucket)):
        return (bucket,)  # (one range: both ends tell)
    return tuple(sorted({m_bucket_for(spec, m) for m in range(first, bucket + 1)}))


def usual_tile_bucket(spec: GemmSpec, m_hint: int) -> int:
    """The bucket unswapped tiles are weighed at: tile_bucket, rounded up to its usual M bucket where swapped tiles
    made it finer (as _sm90_pick prices the usual pick; the rules that weigh 64-row tiles name usual buckets)."""
    return m_bucket(tile_bucket(spec, m_hint))


def tile_bucket(spec: GemmSpec, m_hint: int) -> int:
    """The M bucket `spec`'s tile is chosen for (choose_config; explain reports it): m_bucket_for, except that grouped
    GEMMs skip DENSE_ONLY_BUCKETS (the 192- and 320-row ones exist for dense 64-row tiles, the 384-row one was
    measured on dense GEMMs) and keep the next bucket's choice (grouped FP8 64x128 lost to 128x128 on 15 of 18 masked
    rows, session 19), and that the 3xTF32 GEMMs skip FP32X3_SKIPPED_BUCKETS."""
    bucket = m_bucket_for(spec, m_hint)
    while ((spec.grouped and bucket in DENSE_ONLY_BUCKETS)
           or ((spec.promoted or spec.raw_b) and bucket in FP32X3_SKIPPED_BUCKETS)):
        bucket = next_m_bucket(bucket)
    return bucket


def choose_config(spec: GemmSpec, m_hint: int, arch: str, num_sms: int | None = None, groups: int = 1
                  ) -> KernelConfig:
    """The heuristic choice for M's bucket: the Hopper family where it applies (sm_90a, a layout it reads for the
    type, row strides TMA describes or that Gemm._staged_roles copies: `sm90_supports`), the portable family otherwise.
    Grouped GEMMs: `m_hint` rows in each of `groups` groups."""
    if sm90_supports(spec, arch):
        cfg = choose_sm90_config(spec, tile_bucket(spec, m_hint), num_sms or DEFAULT_SM90_NUM_SMS, groups)
        cfg.check_for(spec, arch)
        return cfg
    if dtypes.is_quantized(spec.dtype) or spec.epilogue != "none" or spec.grouped or spec.raw_b:
        what = (f"{spec.dtype} GEMMs" if dtypes.is_quantized(spec.dtype) else
                "grouped GEMMs" if spec.grouped else "raw-B 3xTF32 GEMMs (GemmSpec.raw_b)" if spec.raw_b else
                f"fused epilogues ({spec.epilogue!r})")
        raise ValueError(f"{what} need a Hopper GPU (arch sm_90a), got arch {arch!r}")
    return choose_sm80_config(spec, m_hint, arch)


def choose_sm80_config(spec: GemmSpec, m_hint: int, arch: str, vec_a: int | None = None,
                       vec_b: int | None = None) -> KernelConfig:
    """The heuristic choice for the portable family.

    - 128x128 tiles with 8 warps (64x32 per warp) for large M; 64x128 with 4 warps
      when M is small, so that a few M tiles still spread over the SMs.
    - BLOCK_K of 32 for every dtype (64 bytes of 16-bit or 128 bytes of FP32 per
      row), three stages: enough cp.async in flight to hide latency, under 100 KB
      so that two blocks fit per SM.
    - vec_a/vec_b: widest loads the operands allow (packed operands by default).
    """
    if vec_a is None or vec_b is None:
        pa, pb = packed_vectors(spec)
        vec_a = pa if vec_a is None else vec_a
        vec_b = pb if vec_b is None else vec_b
    if m_bucket(m_hint) == 64:
        block_m, warps_m = 64, 1
    else:
        block_m, warps_m = 128, 2
    cfg = KernelConfig(family="sm80", block_m=block_m, block_n=128, block_k=32, num_stages=3,
                       warps_m=warps_m, warps_n=4, vec_a=vec_a, vec_b=vec_b)
    cfg.check_for(spec, arch)
    return cfg
