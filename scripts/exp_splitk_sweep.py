"""Experiment (GPU): split-K counts forced on the decode shapes, against cuBLAS, to calibrate splitk.py's rule.

    python3 -m scripts.exp_splitk_sweep [--dtype bf16|tf32|fp8_block|fp8_tensor|...] [--ms 16,32,64,128] [--splits 1,2,3,4,6,8,12,16]
                                        [--nk 4096x7168,...] [--tiles 64x64,128x64] [--atomic] [--epilogue E]
                                        [--out DIR]

Per DeepSeek-V3 (N, K) and M: the unsplit heuristic's tile (what main chose before split-K, "old"), the split-K
tile of the current heuristic (or each of --tiles) with every forced split count, the heuristic's own choice ("auto"), and
the first baseline of `deepgemm_jit.baseline` that covers the dtype (cuBLAS through torch), interleaved in one run (L2 flushed, medians). Outputs are checked against a float64
reference before timing. Weight streaming is off: this measures the tile kernels.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from bench import report


NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


def _unsplit_heuristic(spec, m, num_sms):
    from bench import runner
    from deepgemm_jit import config

    with runner.config_constants({"SPLIT_MAX_M": 0}):
        return config.choose_sm90_config(spec, config.tile_bucket(spec, m), num_sms)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", help="a bench dtype (bench/dtypes.py), e.g. bf16, tf32, fp8_block")
    ap.add_argument("--ms", default="16,32,64,128")
    ap.add_argument("--splits", default="1,2,3,4,6,8,12,16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--nk", default=None, help="comma list of NxK (default: the six DeepSeek shapes)")
    ap.add_argument("--tiles", default=None, help="comma list of BMxBN split-K tiles to sweep (default: the auto tile)")
    ap.add_argument("--atomic", action="store_true",
                    help="also time every forced count with deterministic=False (the shares add atomically): sNa")
    ap.add_argument("--epilogue", default=None, help="a fused epilogue for every contender (baseline: cuBLAS + ops)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import cupy

    import deepgemm_jit as dg
    from bench import dtypes as bench_dtypes
    from bench import runner
    from deepgemm_jit import config, device, reference, splitk, timing
    from deepgemm_jit.spec import GemmSpec

    info = bench_dtypes.get(args.dtype)
    num_sms = device.num_sms()
    rows = []
    shapes = NK if args.nk is None else [tuple(int(v) for v in t.split("x")) for t in args.nk.split(",")]
    for n, k in shapes:
        for m in (int(x) for x in args.ms.split(",")):
            kw = {"dtype": info.lib, "scaling": info.scaling, "epilogue": args.epilogue}
            spec = GemmSpec.create(n, k, **kw)
            rng = cupy.random.default_rng(m * 7 + n + k)
            inputs = runner.operands(info, spec, m, rng, 1.0 / k ** 0.5 if args.epilogue else 1.0)
            epi_ops = runner.epilogue_operands(spec, m, rng) if args.epilogue else None
            auto = dg.build(m, n, k, weight_streaming=False, **kw)
            split_cfgs = []
            if args.tiles:
                for t in args.tiles.split(","):
                    bm, bn = (int(v) for v in t.split("x"))
                    split_cfgs.append(config.sm90_config(spec, bm, bn, split_k=True))
            elif auto.config.split_k:
                split_cfgs.append(auto.config)
            else:
                try:
                    cfg = dataclasses.replace(auto.config, split_k=True, pingpong=False)
                    cfg.check_for(spec, "sm_90a")
                except ValueError:
                    cfg = config.sm90_split_config(spec, config.usual_tile_bucket(spec, m), num_sms, 4)
                split_cfgs.append(cfg)
            split_cfg = split_cfgs[0]
            gemms = {"old": dg.build(m, n, k, config=_unsplit_heuristic(spec, m, num_sms), weight_streaming=False,
                                     **kw),
                     "auto": auto}
            for cfg in split_cfgs:
                prefix = "" if len(split_cfgs) == 1 else f"{cfg.block_m}x{cfg.block_n}_"
                for s in (int(x) for x in args.splits.split(",")):
                    gemms[f"{prefix}s{s}"] = dg.build(m, n, k, config=cfg, split_k=s, weight_streaming=False, **kw)
                    if args.atomic and s > 1:
                        gemms[f"{prefix}s{s}a"] = dg.build(m, n, k, config=cfg, split_k=s, weight_streaming=False,
                                                           deterministic=False, **kw)
            fns, errors = runner.checked_contenders(gemms, inputs, m, epi_ops)
            cupy.cuda.Device().synchronize()
            t = timing.time_interleaved(fns, reps=args.reps, warmup=3)
            row = {"dtype": args.dtype, "epilogue": spec.epilogue, "m": m, "n": n, "k": k,
                   "old_tile": gemms["old"].config.tag,
                   "split_tile": split_cfg.tag, "split_tiles": [c.tag for c in split_cfgs], "auto_tile": auto.config.tag,
                   "auto_splits": (splitk.num_splits(spec, auto.config, m, num_sms, auto.split_k)
                                   if auto.config.split_k else 1),
                   "us": {name: r.median_us for name, r in t.items()},
                   "max_err": max(errors.values())}
            bound_ok = all(reference.within_bound(e, spec.dtype) for e in errors.values())
            row["correct"] = bound_ok
            rows.append(row)
            us = row["us"]
            best = min((v, name) for name, v in us.items() if name not in ("old", "auto", "cublas"))
            label = args.dtype + (f"+{spec.epilogue}" if args.epilogue else "")
            print(f"{label} m={m} n={n} k={k} ok={bound_ok} old {us['old']:.1f} ({row['old_tile']}) auto "
                  f"{us['auto']:.1f} (S={row['auto_splits']}, {row['auto_tile']}) best {best[1]} {best[0]:.1f}"
                  + (f" cublas {us['cublas']:.1f}" if "cublas" in us else "") + " | "
                  + " ".join(f"{name}={v:.1f}" for name, v in us.items() if name not in ("old", "auto", "cublas")),
                  flush=True)
    name = args.dtype + (f"-{spec.epilogue.replace('+', '-')}" if args.epilogue else "")
    report.write_experiment_json(args.out, f"exp-splitk-sweep-{name}.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
