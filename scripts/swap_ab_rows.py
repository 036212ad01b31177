"""Rows for scripts/exp_ab_rows.sh where the cost model picks a swapped tile (KernelConfig.swap_ab): each line is
"DTYPE:MxNxK USUAL SWAPPED [ALT ...]" with the usual bucket's pick (what build() took before swapped tiles were
weighed for the spec), the swapped pick, and the cheapest swapped tiles of other widths (ALT), all with stages,
so that one device call measures whether the pick pays and which price the model should have used. No GPU.

    python3 -m scripts.swap_ab_rows --dtype fp8_tensor --m 300,586,1050 [--nk deepseek|models|N:K,...] [--alts 2]
                                    [--epilogue bias+gelu]
"""
from __future__ import annotations

import argparse

from bench import dtypes as bench_dtypes
from bench.suites import Case, _DEEPSEEK_NK, _MODELS_NK
from deepgemm_jit import buckets, config, sm90_swap_ab

NUM_SMS = 132  # the H200's


def tile_text(cfg) -> str:
    """bench --tiles spelling of an unsplit cooperative tile, its stages and D ring given."""
    return f"{cfg.block_m}x{cfg.block_n}s{cfg.num_stages}r{cfg.d_ring}" + ("w" if cfg.swap_ab else "")


def row(dtype: str, m: int, n: int, k: int, alts: int, epilogue: str | None = None) -> str | None:
    spec = Case(suite="rows", dtype=dtype, layout="nt", m=m, n=n, k=k, epilogue=epilogue).make_spec()
    bucket = config.m_bucket_for(spec, m)
    if not sm90_swap_ab.sm90_swap_ab_costed(spec, bucket):
        return None
    pick, _ = config._sm90_pick(spec, bucket, NUM_SMS)
    if not pick.swap_ab:
        return None
    usual, _ = config._sm90_pick_tile(spec, buckets.m_bucket(bucket), NUM_SMS)
    tiles = [tile_text(usual), tile_text(pick)]
    widths = {pick.block_n}
    for _, block_m, block_n, stages in sm90_swap_ab.sm90_swap_ab_tiles(spec, bucket, NUM_SMS):
        if len(tiles) >= 2 + alts:
            break
        if block_n not in widths:  # the cheapest of each other width
            widths.add(block_n)
            tiles.append(tile_text(config.sm90_config(spec, block_m, block_n, stages, swap_ab=True)))
    return f"{dtype}{'+' + epilogue if epilogue else ''}:{m}x{n}x{k} " + " ".join(tiles)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", required=True, choices=sorted(bench_dtypes.DTYPES))
    ap.add_argument("--m", required=True, help="comma-separated M values")
    ap.add_argument("--nk", default="deepseek", help="deepseek, models or N:K,N:K,...")
    ap.add_argument("--alts", type=int, default=1, help="swapped tiles of other widths beside the pick")
    ap.add_argument("--epilogue", default=None, help="a fused epilogue (bench spelling, e.g. bias+gelu)")
    args = ap.parse_args()
    if args.nk in ("deepseek", "models"):
        nks = _DEEPSEEK_NK if args.nk == "deepseek" else _MODELS_NK
    else:
        nks = tuple(tuple(int(v) for v in item.split(":")) for item in args.nk.split(","))
    for m in (int(v) for v in args.m.split(",")):
        for n, k in nks:
            line = row(args.dtype, m, n, k, args.alts, args.epilogue)
            if line:
                print(line)


if __name__ == "__main__":
    main()
