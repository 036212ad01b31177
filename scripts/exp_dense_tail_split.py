"""Experiment (GPU): would dense GEMMs gain from splitting the K of their last, partial wave's tiles?

    python3 -m scripts.exp_dense_tail_split [--rows MxNxK,...] [--tiles 128x208,128x256s3,...] [--max-splits 4]
                                            [--dtype bf16] [--out DIR]

Dense kernels split every tile or none (TileScheduler); grouped split-K kernels split only the tiles of a last wave
that would leave at least half of the CTAs idle (GroupedTileScheduler, splitk.tail_split). A grouped GEMM of one
group given by offsets [M] is the dense problem, so it measures what a dense tail split would give before the dense
walk learns it. Per row, interleaved in one process (L2 flushed, medians): "bucket" (build(M)'s kernel), cuBLAS, and
per forced tile "g:TILE" (the one-group grouped kernel, plain) and "gs:TILE" (its device-split kernel, at most
--max-splits shares). Every output is checked against the float64 product before timing.
"""
from __future__ import annotations

import argparse
import sys

ROWS = "1800x2112x7168,700x2112x7168,1300x4096x7168,2600x4096x7168,900x4096x7168,4096x2112x7168,4096x7168x2048"
TILES = "128x128,128x176,128x208,128x224"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=ROWS)
    ap.add_argument("--tiles", default=TILES)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--max-splits", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import cupy

    import deepgemm_jit as dg
    from bench import dtypes as bench_dtypes
    from bench import report, runner, suites
    from deepgemm_jit import grouped, launch, reference, splitk, timing

    info = bench_dtypes.get(args.dtype)
    rows = []
    for text in args.rows.split(","):
        m, n, k = (int(v) for v in text.split("x"))
        rng = cupy.random.default_rng(m + 3 * n + 7 * k)
        bucket = dg.build(m, n, k, dtype=info.lib)
        inputs = runner.operands(info, bucket.spec, m, rng)
        fns, errors = runner.checked_contenders({"bucket": bucket}, inputs, m)
        gspec = grouped.grouped_spec(n, k, dtype=info.lib)
        offs = cupy.asarray([m], dtype=cupy.int32)
        b3 = inputs.b.reshape(1, n, k)
        configs, plans = {}, {}
        for tile in args.tiles.split(","):
            for name, text_tile in ((f"g:{tile}", tile), (f"gs:{tile}", tile + "k")):
                try:
                    cfg = suites.forced_tile_config(gspec, text_tile)
                    g = dg.build_grouped(n, k, dtype=info.lib, config=cfg)
                except ValueError as exc:
                    print(f"{text} {name}: skipped, {exc}", flush=True)
                    continue
                if cfg.split_k:
                    g.max_splits = args.max_splits
                    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
                    plans[name] = splitk.tail_split(tiles, launch.num_sms(0), g.max_splits)
                out = reference.poisoned((m, n), gspec.out_dtype)
                fns[name] = (lambda g=g, out=out: g(inputs.a, b3, offs=offs, out=out))
                fns[name]()
                errors[name] = reference.error(out, inputs.ref)
                configs[name] = g.config.tag
        cupy.cuda.Device().synchronize()
        t = timing.time_interleaved(fns, reps=args.reps, warmup=3)
        us = {name: r.median_us for name, r in t.items()}
        row = {"m": m, "n": n, "k": k, "dtype": args.dtype, "bucket_tile": bucket.config.tag, "configs": configs,
               "plans": {name: list(p) for name, p in plans.items()}, "us": us, "errors": errors,
               "correct": all(reference.within_bound(e, bucket.spec.dtype) for e in errors.values())}
        rows.append(row)
        print(f"{text} ok={row['correct']} bucket {us['bucket']:.1f} ({bucket.config.tag}) cublas "
              f"{us.get('cublas', float('nan')):.1f} " + " ".join(
                  f"{name} {us[name]:.1f}" + (f"[{plans[name][0]}+{plans[name][1]}]" if name in plans else "")
                  for name in configs), flush=True)
    report.write_experiment_json(args.out, "exp-dense-tail-split.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
