"""Experiment (CPU): how well does the sm90 tile cost model rank the kernels the split-K sweeps measured, and would
a memory floor help? No GPU: it reads `bench/results/*exp-splitk-sweep*.json` (scripts/exp_splitk_sweep.py).

    python3 -m scripts.exp_split_model_fit [--floors 0,0.01,0.015,0.02,0.025] [--loads 1,2,4] [--glob PATTERN]

For each measured row (dtype, M, N, K) the contenders are the swept (tile, share count) pairs plus the unsplit
"old" tile and the heuristic's pick. Each variant of the model scores every contender; its choice's measured time
over the row's measured best is the row's regret. Variants:

- floor c: the main loop costs at least c model units per byte that A and B hold (M x K + N x K elements) times
  132 / the SMs the launch keeps busy: the time to stream them once from HBM, which fewer SMs cannot pull as fast
  (session 39's CTA timelines at 192 x 4096 x 28672 bf16: main loops of 76-88 us for tiles whose FLOPs per CTA
  differ by 25%);
- load L: `_SPLIT_LOAD_K_BLOCKS` (the last share's load of each partial, in K blocks of the tile).

Printed: per variant, the geomean regret, the rows within 2% of their best, and the worst rows. Only share counts
the heuristic would consider (sm90_cost.split_candidates: one wave) compete; the decode filler and ping-pong rules are
not modelled, and the oldest sweeps measured older kernels (session 10's "old" decode tiles ran 2x today's).

Session 39 (90 rows): the cost alone, as merged (load 1, no floor), regrets 1.026 geomean, 62 rows within 2%; load 2
1.024 / 64 (session 38's GPU A/B of 1.5 and 2.0 lost up to 20% on TF32 rows this set barely holds); a floor changes
nothing up to c = 0.005 and from 0.01 on picks unsplit decode tiles (regret 1.067): not the missing term as it is.
--min-k 320 (split tiles only) 1.024 / 64; with load 2 1.022 / 66. But the set is 73% BF16: the same threshold in K
elements re-picks 33 TF32 decode / small-M rows (8 stages of 32 = 256; exp_split_model_ab --plan), and TF32's
4-stage 128x192 x4 was measured the fastest at 384 x 2112 x 7168 (session 38), so depth alone is not it either.
"""
from __future__ import annotations

import argparse
import glob
import itertools
import json
import math
import re
import sys
from pathlib import Path

_TAG = re.compile(r"sm90_m(\d+)n(\d+)k(\d+)_s(\d+)")


def _tile(tag: str) -> tuple[int, int, int, int]:
    """(block_m, block_n, block_k, stages) of a config tag such as sm90_m128n64k64_s8_g16_sk."""
    match = _TAG.match(tag)
    if match is None:
        raise ValueError(f"not an sm90 tag: {tag}")
    return tuple(int(v) for v in match.groups())


def contenders(row: dict) -> dict[str, tuple[tuple[int, int, int, int], int]]:
    """Measured name -> ((block_m, block_n, block_k, stages), shares) of a sweep row (atomic variants and cuBLAS
    left out)."""
    tiles = {f"{bm}x{bn}": _tile(tag) for tag in row.get("split_tiles", [row["split_tile"]])
             for bm, bn, *_ in [_tile(tag)]}
    found = {"old": (_tile(row["old_tile"]), 1), "auto": (_tile(row["auto_tile"]), row["auto_splits"])}
    for name in row["us"]:
        match = re.fullmatch(r"(?:(\d+x\d+)_)?s(\d+)", name)
        if match is None:
            continue
        tile = tiles[match.group(1)] if match.group(1) else _tile(row["split_tile"])
        found[name] = (tile, int(match.group(2)))
    return found


def _one_wave(m: int, n: int, k: int, tile, shares: int, num_sms: int = 132) -> bool:
    """Whether the heuristic would consider this share count (sm90_cost.split_candidates: one wave, long shares)."""
    from deepgemm_jit import config as c

    block_m, block_n, block_k, _ = tile
    tiles = -(-m // block_m) * -(-n // block_n)
    return shares in c.split_candidates(k, block_k, tiles, num_sms)


def cost(m: int, n: int, k: int, tile, splits: int, esize: int, out_esize: int, floor: float, load: float,
         min_k: int | None = None, num_sms: int = 132) -> float:
    """sm90_cost.sm90_tile_cost with a memory floor under the main loop and `load` K blocks per partial loaded."""
    from deepgemm_jit import config as c

    block_m, block_n, block_k, stages = tile
    tiles = -(-m // block_m) * -(-n // block_n)
    waves = -(-tiles * splits // num_sms)
    area = block_m * block_n
    main_loop = waves * -(-(-(-k // block_k)) // splits) * (area + 24 * (block_m + block_n))
    # HBM streams A and B once at best, and only as fast as the SMs that run CTAs can pull: the floor grows as
    # fewer SMs are busy (an unsplit decode tile on 17 SMs cannot reach the bandwidth 132 SMs do).
    busy = min(tiles * splits, num_sms)
    main_loop = max(main_loop, floor * (m + n) * k * esize * num_sms / busy)
    epilogue = c._EPILOGUE_K_BLOCKS * area / c._SLICE_EFFICIENCY[c.sm90_d_slice_bytes(block_n, out_esize)]
    if splits == 1:
        total = main_loop + waves * epilogue
    else:
        total = (main_loop + waves * c._SPLIT_STORE_K_BLOCKS * area
                 + -(-tiles // num_sms) * (epilogue + splits * load * area))
    if stages * block_k < (c._MIN_K_IN_FLIGHT if min_k is None or splits == 1 else min_k):
        total *= c._SHALLOW_PIPELINE_PENALTY
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--floors", default="0,0.01,0.015,0.02,0.025,0.03")
    ap.add_argument("--loads", default="1,2,4")
    ap.add_argument("--min-k", default="128",
                    help="K elements in flight below which a split-K pipeline costs 10%% more (unsplit: config's)")
    results = Path(__file__).resolve().parents[1] / "bench/results"
    ap.add_argument("--glob", default=str(results / "*exp-splitk-sweep*.json"))
    args = ap.parse_args()
    from bench import dtypes as bench_dtypes
    from deepgemm_jit import dtypes
    from deepgemm_jit.spec import GemmSpec

    rows = []
    for path in sorted(glob.glob(args.glob)):
        for row in json.loads(Path(path).read_text()):
            if row.get("epilogue", "none") != "none" or not row.get("correct", True):
                continue
            info = bench_dtypes.get(row["dtype"])
            spec = GemmSpec.create(row["n"], row["k"], dtype=info.lib, scaling=info.scaling)
            found = {name: (tile, shares) for name, (tile, shares) in contenders(row).items()
                     if shares == 1 or _one_wave(row["m"], row["n"], row["k"], tile, shares)}
            rows.append((row, found, dtypes.get(spec.dtype).storage_bytes,
                         dtypes.get(spec.out_dtype).storage_bytes))
    print(f"{len(rows)} rows from {args.glob}")
    variants = itertools.product((float(v) for v in args.loads.split(",")),
                                 (float(v) for v in args.floors.split(",")), (int(v) for v in args.min_k.split(",")))
    for load, floor, min_k in variants:
        regrets = []
        for row, found, esize, out_esize in rows:
            us = row["us"]
            best = min(us[c] for c in found)
            pick = min(found, key=lambda c: cost(row["m"], row["n"], row["k"], found[c][0], found[c][1], esize,
                                                 out_esize, floor, load, min_k))
            regrets.append((us[pick] / best, f"{row['dtype']} {row['m']}x{row['n']}x{row['k']} picks {pick} "
                                             f"{us[pick]:.1f} vs best {best:.1f}"))
        geo = math.exp(sum(math.log(r) for r, _ in regrets) / len(regrets))
        close = sum(r <= 1.02 for r, _ in regrets)
        worst = sorted(regrets, reverse=True)[:3]
        print(f"load {load:g} floor {floor:g} min_k {min_k}: geomean regret {geo:.4f}, within 2%: "
              f"{close}/{len(regrets)}; worst: " + "; ".join(f"{r:.3f} {what}" for r, what in worst))
    return 0


if __name__ == "__main__":
    sys.exit(main())
