"""The sm90 heuristic's rules (pure Python, no GPU): how many stages a tile gets, where D goes through a ring, which
tiles are weighed at which M (decode fillers, 64- and 192-row tiles, split-K, ping-pong, grouped splits) and at what
price beyond sm90_cost's tile cost (sm90_priced_cost), their ranking (sm90_tiles_by_cost), and the transposing TF32
kernel's range. Each constant names the H200 measurement it was fitted on. Built on sm90_tiles (what a tile can be)
and sm90_cost (what it costs); config turns the ranking into KernelConfigs.
"""
from __future__ import annotations

import dataclasses

from . import dtypes, env
from .buckets import m_bucket
from .sm90_cost import RAW_B_BLOCK_N, sm90_best_splits, sm90_few_16b_slices, sm90_tile_cost
from .sm90_tiles import (SM90_MN_BLOCK, SM90_SMEM_BUDGET_BYTES, sm90_accumulators, sm90_block_n_legal, sm90_consumers,
                         sm90_cluster_sms, sm90_cluster_tiles, sm90_d_ring_problem, sm90_epilogue_block_n_problem,
                         sm90_max_accumulators, sm90_quant_cluster, sm90_quant_cluster_problem, sm90_smem_bytes,
                         sm90_three_consumer_problem, sm90_trans_b,
                         sm90_two_partial_sets, sm90_wg_split_k, split_max_accumulators)
from .spec import GemmSpec


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
    whole = sm90_stages(spec, block_m, block_n, m_hint=m_hint, d_ring=0)
    return whole <= SM90_D_RING_16BIT_MAX_STAGES and sm90_stages(spec, block_m, block_n, m_hint=m_hint,
                                                                    d_ring=SM90_D_RING) > whole


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


def _group_quant_two_groups(spec: GemmSpec, block_n: int) -> bool:
    """Whether a quant_fp8_g128 tile BLOCK_N wide holds two 1x128 groups per row (256 columns of D).
    bench.quant_epilogue, bf16, same call (bench/results/*quant-256-columns-*s57*): from 256 rows on faster than 128
    columns or even (M = 4096: 24576x1536 455.9 -> 431.2 us, 4096x7168 331.3 -> 311.1); at M = 64 / 128, where they
    make one wave of tiles with twice the epilogue each, slower (64 x 32768x512 bias+gelu 18.0 -> 21.1, 128 x
    32768x512 19.0 -> 20.2)."""
    out_cols = block_n // 2 if spec.epi.is_gated else block_n
    return spec.epi.has_group_scales and out_cols == 256


def sm90_block_n_preferred(spec: GemmSpec, block_n: int, m_hint: int, groups: int = 1) -> bool:
    """Tiles the heuristic considers (others stay legal for explicit configs and the tuner). Measured exceptions to
    the waves model for FP8 above SM90_SMALL_M_BUCKET_MAX rows (H200 sweeps, bench/results/*probe-block-row-tiles*,
    and as cited; measured when 129-256 rows were one 256-row bucket):

    - quant_fp8_g128 takes two groups per tile row (256 columns of D) only above SM90_SMALL_M_BUCKET_MAX rows
      (_group_quant_two_groups).
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
        return not _group_quant_two_groups(spec, block_n) and (spec.scaling != "block" or 128 % block_n == 0)
    # Since session 18 a promoted FP8 128x128 tile keeps two partial sets (sm90_two_partial_sets) and ran 1-6% faster
    # than the 176 / 160 below on most M = 4096 rows (bench/results/*fp8-m4096-tiles-two-sets-s18*); 128 is
    # preferred beside them from 1024 rows on, and the waves model decides: it picks 176 where that tile fills the
    # waves much better (2112x7168: 19% faster) or K is long (7168x16384: 2.5-6%, row and per-tensor scales), 128
    # on the other rows, as measured (block scaling's 7168x16384 takes 128 since session 54, where 176 ran even:
    # SM90_BLOCK_STRADDLE_MAIN_LOOP_COST).
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


def sm90_stages(spec: GemmSpec, block_m: int, block_n: int, pingpong: bool = False, split_k: bool = False,
                 m_hint: int | None = None, d_ring: int | None = None, swap_ab: bool = False) -> int:
    """As many stages as fit, 2 up to sm90_stage_cap (d_ring None: sm90_d_ring's rule)."""
    if d_ring is None:
        d_ring = sm90_d_ring(spec, block_m, block_n, pingpong, m_hint)
    for stages in range(sm90_stage_cap(block_m, block_n, m_hint), 1, -1):
        if (sm90_smem_bytes(spec, block_m, block_n, stages, pingpong, split_k, d_ring, swap_ab)
                <= SM90_SMEM_BUDGET_BYTES):
            return stages
    return 0


# Split-K kernels are chosen for M buckets up to this (the small-M / decode path); larger M keeps the measured
# tile choices (bench/results, docs/NOTES.md) until split-K is measured there.
SPLIT_MAX_M = 1024
# A split-K tile replaces the unsplit choice only when the model expects it this much faster. Decode shapes on the
# H200 (bench/results/*exp-splitk-sweep-bf16*): model ratios 0.70-0.87 were measured gains of 5-56% (2112x7168,
# 4096x7168, 7168x16384 at M <= 64); 0.90 a 10% loss (7168x16384 at M = 128, where 128 unsplit 64x112 tiles already
# stream the weight at full bandwidth).
SPLIT_MIN_GAIN = 0.88
# Group quantization (quant_fp8_g128): the last share runs the whole epilogue after summing the partials, and the
# model's split gains were far from the H200's (BF16, tiles forced in one timing, and the heuristic's picks against
# HEAD: bench/results/*exp-quant-cluster-tiles-st-async-s59*, *exp-ab-quant-split-shares-fp8-tensor-vs-head-s59*;
# model split cost / best unsplit cost -> measured time ratio): 0.21 -> 0.85 (64 x 2112x7168, 7 shares), 0.38 ->
# 0.84 (128 x 2112x7168), 0.30 -> 0.98 (64 x 4096x7168) won; 0.51 -> 1.03 (64 x 7168x16384), 0.53 / 0.54 -> 1.10
# (128 x 4096x7168, 64x128 2 shares / 128x128 4 shares), 0.60 -> 1.22 (64 x 7168x2048) lost. Such splits must be
# this much cheaper instead.
SPLIT_MIN_GAIN_GROUP_QUANT = 0.45


SM90_BLOCK_N = tuple(range(256, 7, -8))


def _raw_b_tiles_by_cost(spec: GemmSpec, m_hint: int, num_sms: int) -> list[tuple[float, int, int, int, int]]:
    """sm90_tiles_by_cost for raw-B GEMMs: (cost, block_m, block_n, stages, splits) by raw_b_tile_cost."""
    tiles = []
    for block_m in (64, 128) if m_hint > 64 else (64,):
        for block_n in RAW_B_BLOCK_N:
            if (sm90_accumulators(block_m, block_n, spec.promote) > sm90_max_accumulators(spec)
                    or sm90_epilogue_block_n_problem(spec, block_n) is not None  # e.g. 56 INT8 columns of D
                    or sm90_quant_cluster(spec, block_n) > 1):  # (it may split: clusters do not)
                continue
            cost, splits = sm90_best_splits(spec, m_hint, block_m, block_n, num_sms)
            stages = sm90_stages(spec, block_m, block_n, split_k=splits > 1, m_hint=m_hint)
            if stages >= 2:
                tiles.append((cost, block_m, block_n, stages, splits))
    return sorted(tiles)


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
    stages = sm90_stages(spec, block_m, block_n, m_hint=m_hint)
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
# Session 60 added the 256-row bucket (193-256 rows) for 8-bit types, tiles up to SM90_ROWS64_NARROW_MAX_N columns
# there (scripts/exp_m_buckets.py --against rows64at256, M 200 / 224 / 256 x 6 (N, K), FP8 block / per-tensor / row
# and INT8, plain and FP8 bias+gelu, bench/results/*exp-m-buckets-vs-rows64at256-s60*): the 128-row picks fill half
# the SMs or split K at N <= 4096 (FP8 block 256 x 4096 x 7168 128x128 split 24.5 -> 64x128 22.0 us, 256 x 1280 x
# 8192 20.1 -> 17.1; FP8 row 256 x 1536 x 7168 128x48 split 15.1 -> 64x48 13.9; INT8 256 x 2112 x 7168 15.8 -> 14.8):
# of the 64 rows this rule changes, 58 ran faster by > 1% (up to 16%), 5 within 1%, 1 1.3% slower (geomean 1.070);
# the one clear loss, INT8 (INT32 out) 7168 x 2048 at 64x224 (4 stages), 13.2 -> 14.1 us, is why the width cap.
SM90_ROWS64_MAX_M = 128
SM90_ROWS64_BUCKETS = (256, 320)
SM90_ROWS64_NARROW_BUCKETS = (256,)
SM90_ROWS64_NARROW_MAX_N = 128
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
    nt dense GEMMs (sm90_three_consumer_problem) of at least SM90_ROWS192_MIN_M rows, with a 16-bit or FP32 D or
    quant_fp8_g128 (static-scale quantize-on-store was not measured with them). Group quantization needs tiles of
    whole 128-column groups, so N = 2112 had 128x128 (4.1 waves at M = 4096) or 128x256 (72 tiles at M = 1024);
    192x128 ran 4096 x 2112x7168 quant_fp8_g128 196.3 -> 175.5 us and 1024 rows 75.2 -> 59.4 (bf16, same call,
    bench/results/*quant-rows192-*s57*)."""
    return (m_hint >= SM90_ROWS192_MIN_M and sm90_three_consumer_problem(spec) is None
            and spec.epi.quant in ("none", "fp8_g128"))


def sm90_quant_cluster_costed(spec: GemmSpec, m_hint: int, block_m: int, block_n: int, num_sms: int) -> bool:
    """Whether the cost model weighs a tile BLOCK_N wide for `spec` at M bucket m_hint, where it quantizes across a
    cluster (sm90_quant_cluster): always for other tiles; for those, FP8 operands (INT8 was not measured) and every
    cluster resident at once (one round: sm90_cluster_sms). H200, quant_fp8_g128 at M = 64 / 128, every tile
    forced in one timing (bench/results/*exp-quant-cluster-tiles-st-async-s59*): FP8 block 64 x 2112x7168 at 64x32
    15.6 us against 18.4 for the best 128-column tile (64x128 split), 64 / 128 x 4096x7168 at 64x64 18.6 / 19.1
    against 19.3 / 19.8; BF16 tied or lost (128 x 4096x7168 64x64 29.3 vs 27.8), and past one round the exchange
    between tiles cost up to 1.6x (FP8 128 x 24576x1536 64x64 25.9 vs 19.2 at 64x128; 64 x 4096x7168 at 64x32, 32
    clusters of 4 of which 30 are resident: 24.0 vs 18.6)."""
    cluster = sm90_quant_cluster(spec, block_n)
    if cluster == 1:
        return True
    return (spec.dtype in dtypes.FP8_DTYPES
            and sm90_cluster_tiles(spec, m_hint, block_m, block_n) * cluster <= sm90_cluster_sms(cluster, num_sms))


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


# Tiles of 128+ rows and at most this many columns only where they fit one round of the SMs: over several rounds they
# ran 1.3-1.7x slower per output than 128x144 (their A + B bytes per MAC are 1.6x), which the cost model's (rows +
# columns) term does not see. H200 session 49 (bench/results/*gated-thin-tiles*): bf16 2048x2112x7168 128x64 139.3
# us vs 128x144 90.7; bias+swiglu, where the model picked 128x64, 2048x2112x7168 139.0 -> 84.8 (192x176) and
# 1024x2112x7168 57.0 -> 48.4 (128x144). In one round (512x2112x7168) 128x64 stays the fastest (27.8 vs 43.3). From
# SM90_THIN_MIN_M rows on: with one M block A's re-reads are few (TF32 nn at 96-128 rows: 128x64 over 224 rounds of
# 28672 columns measured fastest, session 29).
SM90_THIN_MAX_BLOCK_N = 64
SM90_THIN_MIN_M = 512


# FP8 block scaling: the main loop of a tile whose width straddles B's 128-column scale blocks (176) costs this much
# per K block more than the waves model's area term says. H200 session 54: in the A/B of finer M buckets above 4096
# rows (buckets.M_BUCKET_STEPS) 128x128 beat or tied 128x176 on all 12 FP8 block rows, by more the longer K (the
# model's price of 176 / 128 against the measured time: 6-8% too low at K >= 14336, 0-3% at K <= 8192). Priced at
# 1.05, checked on 18 other rows where the pick moves (bench/results/*exp-ab-fp8-block-straddle-cost-s54*, same-call
# A/B, two rounds, us): geomean 0.982 of the 176 time, 10 faster by more than 1% (4429 x 7168 x 16384 858.7 ->
# 828.2, 7000 x 4096 x 14336 709.8 -> 689.2; bias+gelu 4096 x 7168 x 16384 876.4 -> 810.0), 2 slower (16384 x 2112
# x 7168 371.3 -> 378.6, 1536 x 7168 x 2048 42.8 -> 43.4), 4096 x 7168 x 16384 even (727.7 / 728.1); at 4096 x 2112
# x 7168 176 stays (12 column blocks against 128's 17). Why (SASS, docs/NOTES.md session 54): the 176 loop keeps one
# partial set, so its promotion must end before the next K block's wgmmas (128x128 keeps two), and it reads more
# scales per K block: 177 instructions per K block against 128x128's 115.5, 1.01 against 0.90 per column.
SM90_BLOCK_STRADDLE_MAIN_LOOP_COST = 1.05


def sm90_priced_cost(spec: GemmSpec, m: int, block_m: int, block_n: int, stages: int, num_sms: int,
                      groups: int = 1) -> float:
    """An unsplit (unswapped) tile's price at M = m: sm90_tile_cost for the spec's D (gated units' half-width D,
    their few 16-byte slices; FP8 block scaling's straddling tiles: SM90_BLOCK_STRADDLE_MAIN_LOOP_COST; tiles that
    quantize across a cluster: the SMs its clusters keep busy, sm90_cluster_sms), times the 192-row or trans_b
    64-row factor."""
    straddles = spec.scaling == "block" and block_n % 128 != 0 and 128 % block_n != 0
    num_sms = sm90_cluster_sms(sm90_quant_cluster(spec, block_n), num_sms)
    cost = sm90_tile_cost(m, spec.n, spec.k, block_m, block_n, 128 // dtypes.get(spec.dtype).storage_bytes,
                          dtypes.get(spec.out_dtype).storage_bytes, num_sms, stages,
                          block_n // 2 if spec.epi.is_gated else None, groups, few_16b_slices=sm90_few_16b_slices(spec),
                          main_loop_scale=SM90_BLOCK_STRADDLE_MAIN_LOOP_COST if straddles else 1.0)
    return cost * (SM90_ROWS192_COST if block_m == 192 else _trans_b_rows64_cost(spec, m, block_m))


def sm90_tiles_by_cost(spec: GemmSpec, m_hint: int, num_sms: int,
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
    rows64_max_n = SM90_ROWS64_NARROW_MAX_N if m_hint in SM90_ROWS64_NARROW_BUCKETS else max(SM90_BLOCK_N)
    tiles = []
    for block_m in (192, 128, 64):
        if block_m == 64 and not sm90_rows64_costed(spec, m_hint):
            continue
        if block_m == 192 and not sm90_rows192_costed(spec, m_hint):
            continue
        for block_n in SM90_BLOCK_N:
            if not sm90_block_n_legal(spec, block_n) or sm90_epilogue_block_n_problem(spec, block_n) is not None:
                continue
            if block_m == 64 and (block_n < rows64_min_n or block_n > rows64_max_n):
                continue
            if not sm90_quant_cluster_costed(spec, m_hint, block_m, block_n, num_sms):
                continue
            if preferred_only and not sm90_block_n_preferred(spec, block_n, m_hint, groups):
                continue
            if sm90_accumulators(block_m, block_n, spec.promote) > sm90_max_accumulators(spec, block_m):
                continue
            if (block_m >= 128 and block_n <= SM90_THIN_MAX_BLOCK_N and m_hint >= SM90_THIN_MIN_M and not spec.grouped
                    and groups == 1 and -(-m_hint // block_m) * -(-spec.n // block_n) > num_sms):
                continue  # a thin tile over several rounds (SM90_THIN_MAX_BLOCK_N)
            stages = sm90_stages(spec, block_m, block_n, m_hint=stage_hint)
            if stages < (SM90_TRANS_B_MIN_STAGES if trans_b and preferred_only else 3):
                continue
            tiles.append((sm90_priced_cost(spec, m_hint, block_m, block_n, stages, num_sms, groups),
                          block_m, block_n, stages, 1))
    if not tiles and preferred_only:
        return sm90_tiles_by_cost(spec, m_hint, num_sms, preferred_only=False, groups=groups)
    filler = _sm90_decode_filler(spec, m_hint, num_sms, tiles)
    # Group quantization with tiles that quantize across a cluster in one round (FP8): those fill the SMs,
    # and split-K lost to them or tied (FP8 block 64 x 2112x7168 18.4 us at 64x128 split vs 15.6 at 64x32, 64 x
    # 7168x2048 15.0 vs 12.1 at 64x64; sm90_quant_cluster_costed), the split's last share running the epilogue alone.
    cluster_fills = any(sm90_quant_cluster(spec, t[2]) > 1 for t in tiles)
    if not spec.grouped and m_hint <= SPLIT_MAX_M and tiles and not cluster_fills:
        # Split-K versions of the tiles, where one beats every unsplit tile by SPLIT_MIN_GAIN.
        unsplit_best = min(t[0] for t in tiles)
        for i, (cost, block_m, block_n, stages, _) in enumerate(tiles):
            if (sm90_accumulators(block_m, block_n, False) > split_max_accumulators(spec)
                    or not sm90_tile_may_split(spec, m_hint, block_m)
                    or sm90_quant_cluster_problem(spec, block_n, split_k=True) is not None):
                continue
            split_cost, best = sm90_best_splits(spec, m_hint, block_m, block_n, num_sms, stages)
            split_cost *= _trans_b_rows64_cost(spec, m_hint, block_m)
            split_stages = sm90_stages(spec, block_m, block_n, split_k=True, m_hint=stage_hint)
            min_gain = SPLIT_MIN_GAIN_GROUP_QUANT if spec.epi.has_group_scales else SPLIT_MIN_GAIN
            if best > 1 and split_cost < min_gain * unsplit_best and split_stages >= 3:
                tiles[i] = (split_cost, block_m, block_n, split_stages, best)
    # Stable: ties keep the wider tile first; at decode sizes a 64-row tile wins a tie (see SM90_DECODE_TIE_M).
    tiles.sort(key=lambda t: (t[0], t[1] != 64 if m_hint <= SM90_DECODE_TIE_M else False))
    if filler is not None and tiles[0][4] > 1:  # a split-K pick gives way to a tile that fills the SMs unsplit
        tiles = [filler] + [t for t in tiles if t[1:3] != filler[1:3]]
    short_k = _sm90_decode_short_k(spec, m_hint, num_sms)
    if short_k is not None:
        tiles = [short_k] + [t for t in tiles if t[1:3] != short_k[1:3]]
    return tiles


# Fused epilogues with an activation or a residual keep the CUDA cores busy for a while after each tile; up to
# this K the 128x128 ping-pong tile (one consumer's epilogue under the other's main loop) beat the cooperative
# tiles on the H200 (bench/results/*pingpong*: bias+gelu at 4096 x {24576x1536, 32768x512, 7168x2048} 4-11%
# faster; K = 7168 lost 4%, its main loop is long enough to hide nothing worth the smaller tile).
_PINGPONG_MAX_K = 4096


def sm90_pingpong_fits(spec: GemmSpec) -> bool:
    """Whether the 128x128 ping-pong tile can serve `spec` and has an epilogue to hide: dense, not the kernel that
    transposes B in shared memory (its converter runs with cooperative consumers only), an activation or a residual,
    and 128 columns the accumulators and the epilogue can take."""
    epi = spec.epi
    return (not spec.grouped and not sm90_trans_b(spec) and (epi.activation != "none" or epi.residual)
            and sm90_accumulators(128, 128, spec.promote, True) <= sm90_max_accumulators(spec)
            and sm90_epilogue_block_n_problem(spec, 128) is None)


def sm90_pingpong_pays(spec: GemmSpec, m_hint: int, num_sms: int, block_m: int, block_n: int) -> bool:
    """Whether the 128x128 ping-pong tile replaces the cost model's cooperative pick: an epilogue with real work
    per element, a short K, and no more waves (counted in cooperative-tile areas) than the cooperative tile;
    2112 columns at 128x128 need 5 waves where 128x176 needs 3 (measured 21% slower)."""
    if not sm90_pingpong_fits(spec) or spec.k > _PINGPONG_MAX_K or m_hint <= SM90_SMALL_M_BUCKET_MAX:
        return False
    # Group quantization: compiles clean since 2026-12-04 (it spilled before), but ran 0-15% slower than the
    # cooperative picks (bench/results/*quant-pingpong-*s57*: bf16 bias+gelu+quant 4096 x 32768x512 324 -> 333 us).
    if spec.epi.has_group_scales:
        return False
    waves = -(-(-(-m_hint // block_m) * -(-spec.n // block_n)) // num_sms)
    pp_waves = -(-(-(-m_hint // 128) * -(-spec.n // 128)) // num_sms)
    return pp_waves * 128 * 128 <= waves * block_m * block_n


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


def grouped_fp8_split_kernel(spec: GemmSpec, block_m: int, block_n: int) -> bool:
    """Whether a grouped FP8 spec whose cost-model tile is (block_m, block_n) gets the device-split kernel for its
    speed (GROUPED_FP8_SPLIT_KERNEL_TILE) without the split rule's wave and K limits: the measured cases only, no
    epilogue and K >= GROUPED_FP8_SPLIT_KERNEL_MIN_K (the MoE rows: K = 2048 and 7168)."""
    return (spec.grouped and spec.dtype in dtypes.FP8_DTYPES and spec.epilogue == "none"
            and spec.k >= GROUPED_FP8_SPLIT_KERNEL_MIN_K and (block_m, block_n) == GROUPED_FP8_SPLIT_KERNEL_TILE
            and sm90_accumulators(block_m, block_n, False) <= split_max_accumulators(spec))
