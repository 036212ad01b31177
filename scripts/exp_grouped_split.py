"""Experiment (GPU): where a grouped device-split kernel's time goes, on bench.moe's masked FP8 rows.

    python3 -m scripts.exp_grouped_split [--dtype fp8|bf16] [--rows G:E:N:K,...] [--tile 128x128|auto] [--out DIR]

For each masked row (G groups of about E rows, the group sizes bench.moe draws for it; --tile auto: the tile
build_grouped picks for the row, its split-K flag dropped for "plain") three launches of the same
tile, interleaved in one process (L2 flushed, medians): "plain" (the kernel without split-K), "split" (the
device-split kernel as build_grouped runs it: tiles of the last partial wave split on the device) and "split1" (the
same kernel told it may use one share: no group count, every tile whole, which must equal "plain" bit for bit;
"split" within rounding of it). Separates what the split kernel costs when it does not split (split1 vs
plain) from what splitting gains (split vs split1).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1:256:4096:7168,1:512:4096:7168,1:1024:4096:7168,1:1024:7168:2048,"
                                      "2:256:4096:7168,2:512:4096:7168,4:512:4096:7168,8:256:4096:7168")
    ap.add_argument("--tile", default="128x128")
    ap.add_argument("--dtype", default="fp8", choices=("fp8", "bf16"))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import cupy

    import deepgemm_jit as dg
    from bench import moe, report
    from bench.suites import parse_tile
    from deepgemm_jit import config, grouped, launch, reference, splitk, timing

    rows = []
    for text in args.rows.split(","):
        groups, expected, n, k = (int(v) for v in text.split(":"))
        case = moe.MoeCase("masked", "masked_m", "random", args.dtype, groups, expected, n, k)
        counts = moe.group_sizes(case)
        max_m = case.max_m
        rng = cupy.random.default_rng(groups + expected + n + k)
        masked = cupy.asarray(counts, dtype=cupy.int32)
        if args.dtype == "fp8":
            qa, sa = dg.quantize(rng.standard_normal((groups * max_m, k), dtype=cupy.float32), "fp8", "group128")
            ws = [dg.quantize(rng.standard_normal((n, k), dtype=cupy.float32) * 0.05, "fp8", "block128")
                  for _ in range(groups)]
            qb = cupy.stack([w[0] for w in ws])
            a3 = qa.reshape(groups, max_m, k)
            kw = dict(scale_a=sa.reshape(groups, max_m, -1), scale_b=cupy.stack([w[1] for w in ws]), masked_m=masked)
        else:
            a3 = reference.random_matrix((groups, max_m, k), "bf16", rng)
            qb = reference.random_matrix((groups, n, k), "bf16", rng, scale=k ** -0.5)
            kw = dict(masked_m=masked)
        spec = grouped.grouped_spec(n, k, dtype=args.dtype)
        if args.tile == "auto":
            split_cfg = dataclasses.replace(
                dg.build_grouped(n, k, dtype=args.dtype, expected_m=expected, num_groups=groups).config, split_k=True)
        else:
            block_m, block_n, stages, *_ = parse_tile(args.tile)
            split_cfg = config.sm90_config(spec, block_m, block_n, stages, split_k=True)
        block_m, block_n = split_cfg.block_m, split_cfg.block_n
        try:
            gemms = {
                "plain": dg.build_grouped(n, k, dtype=args.dtype, config=dataclasses.replace(split_cfg, split_k=False)),
                "split": dg.build_grouped(n, k, dtype=args.dtype, config=split_cfg),
            }
        except ValueError as exc:  # a tile with no split-K kernel (too many accumulators, shared memory)
            print(f"{case.tag} {split_cfg.tag}: skipped, {exc}", flush=True)
            continue
        gemms["split1"] = dg.build_grouped(n, k, dtype=args.dtype, config=split_cfg)
        gemms["split1"].max_splits = 1  # the same kernel, passed one share at most: no count, every tile whole
        outs, fns = {}, {}
        for name, g in gemms.items():
            outs[name] = reference.poisoned((groups, max_m, n), "bf16")
            fns[name] = (lambda g=g, o=outs[name]: g(a3, qb, out=o, **kw))
            fns[name]()
        cupy.cuda.Device().synchronize()
        valid = [slice(gi * max_m, gi * max_m + c) for gi, c in enumerate(counts) if c]
        flat = {name: o.reshape(groups * max_m, n) for name, o in outs.items()}
        same1 = all(bool((flat["split1"][s].view(cupy.uint16) == flat["plain"][s].view(cupy.uint16)).all())
                    for s in valid)
        diff = max(reference.error(reference.to_float64(flat["split"][s]), reference.to_float64(flat["plain"][s]))
                   for s in valid)
        tiles = sum(-(-c // block_m) for c in counts) * -(-n // block_n)
        whole, shares = splitk.tail_split(tiles, launch.num_sms(0), gemms["split"].max_splits)
        t = timing.time_interleaved(fns, reps=args.reps, warmup=5)
        row = {"row": case.tag, "config": split_cfg.tag, "counts": counts, "tiles": tiles, "whole": whole,
               "shares": shares,
               "split1_bitwise_equal": same1, "split_rel_diff": diff,
               **{name: r.median_us for name, r in t.items()}}
        rows.append(row)
        print(f"{case.tag} {split_cfg.tag} tiles {tiles} (whole {whole}, shares {shares}) equal1={same1} "
              f"diff={diff:.1e} " + "  ".join(f"{name} {r.median_us:.1f}" for name, r in t.items()), flush=True)
    report.write_experiment_json(args.out, "exp-grouped-split.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
