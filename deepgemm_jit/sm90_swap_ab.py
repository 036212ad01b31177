"""Swapped sm90 tiles (KernelConfig.swap_ab: the kernel computes D^T = B A^T, so the tile's rows are N's and block_m
may be any multiple of 8): which specs take them, their shapes, and how the cost model prices them against the usual
pick at mid M (pure Python, no GPU).
"""
from __future__ import annotations

from . import dtypes
from .sm90_cost import sm90_tile_cost
from .sm90_rules import sm90_stages
from .sm90_tiles import SM90_THREE_CONSUMER_MAX_ACCUMULATORS, sm90_max_accumulators
from .spec import GemmSpec


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
# FP8 swapped tiles of fewer rows than this are not weighed for N >= SM90_SWAP_AB_FP8_NARROW_MIN_N: the model priced
# the 40-72-row ones below 128-row or wider swapped tiles, and they ran slower at every K (2048-8192). H200 session 53,
# same call, two rounds, the old pick -> the pick without them, us (bench/results/*exp-ab-fp8-swapped-min-80-rows*):
# 13 rows 0.957x the old time, then 14 held-out rows 0.959x; 20 of 27 faster by more than 1% (per-tensor 441x6144x4096
# 56x128 27.2 -> 24.0 at 128x96, 473x7168x2048 72x128 19.0 -> 17.1 at 128x112, 417x7168x2048 64x128 18.6 -> 17.0 at
# 112x128, 433x7168x8192 49.8 -> 45.8; per-row 297x6144x4096 21.9 -> 19.9), 4 slower by 1.6-3.8% (bias+gelu
# 273x4096x7168 72x128 20.2 -> 20.9 at 80x128; per-row 305x6144x4096 21.7 -> 22.6 at 64x128 unswapped). N = 1280
# (1280x8192, few row blocks) was mixed, 1.011x over 5 rows (353 rows 15.7 -> 16.7 at 128x32), and keeps them.
SM90_SWAP_AB_FP8_MIN_BLOCK_M = 80
SM90_SWAP_AB_FP8_NARROW_MIN_N = 2048
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
    model does not weigh it (fewer than 3 stages, narrow tiles at long K, narrow FP8 tiles of wide N)."""
    if block_m < SM90_SWAP_AB_NARROW_BLOCK_M and spec.k > SM90_SWAP_AB_NARROW_MAX_K:
        return None
    if (spec.dtype in dtypes.FP8_DTYPES and block_m < SM90_SWAP_AB_FP8_MIN_BLOCK_M
            and spec.n >= SM90_SWAP_AB_FP8_NARROW_MIN_N):
        return None
    stages = sm90_stages(spec, block_m, block_n, m_hint=m, d_ring=0, swap_ab=True)
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


def sm90_swap_ab_tiles(spec: GemmSpec, m: int, num_sms: int) -> list[tuple[float, int, int, int]]:
    """Every swapped tile the model weighs at M = m (_sm90_swap_ab_priced), cheapest first (ties: fewer columns,
    then fewer rows)."""
    priced = (_sm90_swap_ab_priced(spec, m, num_sms, block_m, block_n)
              for block_n in _sm90_swap_ab_costed_block_ns(spec)
              for block_m in range(8, sm90_swap_ab_max_block_m(spec, block_n) + 1, 8))
    return sorted((p for p in priced if p is not None), key=lambda p: (p[0], p[2], p[1]))


def sm90_swap_ab_best(spec: GemmSpec, m: int, num_sms: int) -> tuple[float, int, int, int] | None:
    """(cost, block_m, block_n, stages) of the cheapest swapped tile at M = m, or None."""
    tiles = sm90_swap_ab_tiles(spec, m, num_sms)
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


def sm90_swap_ab_block_ns(spec: GemmSpec) -> tuple[int, ...]:
    """A swapped tile's block_n for `spec`: 64 columns a consumer, three consumers (192) for 16-bit inputs only
    (as 192-row tiles: sm90_three_consumer_problem)."""
    return SM90_SWAP_AB_BLOCK_N if spec.dtype in ("bf16", "fp16") else SM90_SWAP_AB_BLOCK_N[:2]
