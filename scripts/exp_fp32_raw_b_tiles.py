"""Experiment (GPU): tiles and split-K counts of dtype fp32's raw-B TF32 GEMM (3xTF32 at M <= 128, GemmSpec.raw_b)
against the heuristic's pick and cuBLAS FP32 (torch.mm, IEEE), all timed in one interleaved run (L2 flushed,
medians) after each output was checked against float64.

    python3 -m scripts.exp_fp32_raw_b_tiles [--ms 64,128] [--nk 7168x16384,...] \
        [--tiles 64x56,64x112s4,128x112] [--splits 1,2,3] [--out DIR]

A tile is BMxBN[sS] (S stages, else as many as fit); each tile runs with every split count of --splits that its K
allows (1: the unsplit kernel).
"""
from __future__ import annotations

import argparse
import sys

from bench import report


NK = "2112x7168,24576x1536,32768x512,7168x16384,4096x7168,7168x2048"


def _variants(spec, tiles: list[str], splits: list[int]):
    """(name, KernelConfig, split count) of every tile x split count that compiles for `spec`."""
    from bench import suites
    from deepgemm_jit import config

    for tile in tiles:
        bm, bn, stages, *_ = suites.parse_tile(tile)
        for s in splits:
            try:
                cfg = config.sm90_config(spec, bm, bn, stages, split_k=s > 1)
                cfg.check_for(spec, "sm_90a")
            except ValueError as exc:
                print(f"  skip {tile} x{s}: {exc}", flush=True)
                continue
            yield f"{bm}x{bn}s{cfg.num_stages}" + (f"x{s}" if s > 1 else ""), cfg, s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="64,128")
    ap.add_argument("--nk", default=NK)
    ap.add_argument("--tiles", default="64x56,64x112,128x112")
    ap.add_argument("--splits", default="1,2,3")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=12, help="compile processes")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import cupy

    import deepgemm_jit as dg
    from deepgemm_jit import api, baseline, device, fp32x3, reference, splitk, timing, warmup

    tiles = [t for t in args.tiles.split(",") if t]
    splits = [int(s) for s in args.splits.split(",")]
    shapes = [(m, *(int(v) for v in nk.split("x"))) for nk in args.nk.split(",") for m in map(int, args.ms.split(","))]
    # Compile every variant first, in parallel processes (the disk cache serves the builds below).
    work = []
    for m, n, k in shapes:
        spec = fp32x3.Fp32Spec.create(n, k).inner_at(m, "sm_90a")
        work += [(spec, cfg) for _, cfg, _ in _variants(spec, tiles, splits)] if spec.raw_b else []
    summary = warmup.run(work, "sm_90a", jobs=args.jobs, progress=False)
    print(f"compiled {summary.compiled}, cached {summary.cached}, failed {len(summary.failed)} in "
          f"{summary.seconds:.0f} s", flush=True)
    rows = []
    for m, n, k in shapes:
        auto = dg.build_fp32(m, n, k)
        if not auto.raw_b:
            print(f"fp32 {m}x{n}x{k}: the raw-B rule does not apply, skipped", flush=True)
            continue
        spec = auto.gemm.spec
        gemms = {"auto": auto}
        for name, cfg, s in _variants(spec, tiles, splits):
            inner = api.build_spec(spec, m, config=cfg, split_k=s if cfg.split_k else None,
                                   weight_streaming=False)
            gemms[name] = fp32x3.Fp32Gemm(auto.spec, inner.arch, inner.m_hint, inner, auto.split_artifact)
        rng = cupy.random.default_rng(m + n + k)
        a = reference.random_matrix((m, k), "fp32", rng)
        b = reference.random_matrix((n, k), "fp32", rng)
        ref = reference.to_float64(a) @ reference.to_float64(b).T
        fns, errors = {}, {}
        for name, g in gemms.items():
            out = reference.poisoned((m, n), "fp32")
            g(a, b, out=out)
            errors[name] = reference.error(out, ref)
            if reference.within_bound(errors[name], "fp32"):
                fns[name] = (lambda g=g, out=out: g(a, b, out=out))
            else:
                print(f"  {name}: error {errors[name]:.2e} over the bound, not timed", flush=True)
        base, _ = baseline.bind(auto.spec, a, b)
        if base is not None:
            fns["cublas"] = base.fn
        cupy.cuda.Device().synchronize()
        t = {name: r.median_us for name, r in timing.time_interleaved(fns, reps=args.reps).items()}
        auto_splits = (splitk.num_splits(spec, auto.gemm.config, m, device.num_sms())
                       if auto.gemm.config.split_k else 1)
        row = {"m": m, "n": n, "k": k, "auto": auto.gemm.config.tag, "auto_splits": auto_splits, "us": t,
               "err": errors, "correct": all(reference.within_bound(e, "fp32") for e in errors.values())}
        rows.append(row)
        mine = {name: v for name, v in t.items() if name != "cublas"}
        best = min(mine, key=mine.get)
        print(f"fp32 {m}x{n}x{k} auto {t.get('auto', float('nan')):.1f} ({row['auto']} x{auto_splits}) best "
              f"{best} {mine[best]:.1f} cublas {t.get('cublas', float('nan')):.1f} | "
              + " ".join(f"{name}={v:.1f}" for name, v in t.items()), flush=True)
    report.write_experiment_json(args.out, "exp-fp32-raw-b-tiles.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
