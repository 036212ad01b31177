"""The sm90 cost model (pure Python, no GPU): the relative time of a tile shape under the persistent schedule
(sm90_tile_cost: waves x (main loop + epilogue), split-K shares' partial-tile traffic), the split counts it weighs
and the cheapest of them (sm90_best_splits), and the raw-B 3xTF32 GEMM's own per-stage cost. Each constant names the
H200 measurement it was fitted on. Built on sm90_tiles (what a tile can be); sm90_rules decides which tiles it prices.
"""
from __future__ import annotations

from . import dtypes
from .sm90_tiles import sm90_d_slice_bytes
from .spec import GemmSpec


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


def sm90_tile_cost(m: int, n: int, k: int, block_m: int, block_n: int, block_k: int, out_esize: int,
                   num_sms: int, num_stages: int = 8, d_cols: int | None = None, groups: int = 1,
                   splits: int = 1, few_16b_slices: bool = False, main_loop_scale: float = 1.0) -> float:
    """Relative time of a tile shape under the persistent schedule (smaller is better).

    Waves: every SM runs ceil(tiles / SMs) tiles, so a last wave that is barely used costs a
    whole wave. A tile costs its main loop, K blocks of area / efficiency, where efficiency
    drops for thin tiles because shared-memory traffic per FLOP is (bm + bn) / (bm * bn), plus
    its epilogue, which weighs more when K is short and when D leaves in narrow slices; a
    pipeline holding fewer than 128 K elements costs 10% more. `d_cols`: D's tile width when it is not
    block_n (gated units: block_n / 2); `few_16b_slices`: sm90_few_16b_slices. `groups`: a grouped GEMM of that
    many groups of m rows each (every group rounds its rows up to whole tiles). `splits` > 1: split-K, each tile's
    K blocks shared by that many CTAs (tiles x splits units in waves, each storing a partial tile; every tile's
    epilogue, after loading its partials, counted in waves of tiles). `main_loop_scale`: the main loop's price per K
    block relative to the usual one (sm90_rules.SM90_BLOCK_STRADDLE_MAIN_LOOP_COST).
    """
    tiles = -(-m // block_m) * -(-n // block_n) * groups
    units = tiles * splits
    waves = -(-units // num_sms)
    area = block_m * block_n
    main_loop = -(-(-(-k // block_k)) // splits) * (area + 24 * (block_m + block_n)) * main_loop_scale
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
