"""Experiment (GPU): where dtype fp32 (3xTF32) spends its time at small M: the whole call (split pass + TF32 GEMM),
the TF32 GEMM alone on operands split once, and cuBLAS FP32 (torch.mm, IEEE), interleaved in one run (L2 flushed,
medians); the split pass is the difference. Outputs are checked against float64 before timing.

    python3 -m scripts.exp_fp32_breakdown [--ms 64,128] [--nk 2112x7168,...] [--out DIR]
"""
from __future__ import annotations

import argparse
import sys

from bench import report


NK = "2112x7168,24576x1536,32768x512,7168x16384,4096x7168,7168x2048"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="64,128")
    ap.add_argument("--nk", default=NK)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import cupy

    import deepgemm_jit as dg
    from deepgemm_jit import baseline, reference, timing

    rows = []
    for nk in args.nk.split(","):
        n, k = (int(v) for v in nk.split("x"))
        for m in (int(x) for x in args.ms.split(",")):
            g = dg.build(m, n, k, dtype="fp32")
            rng = cupy.random.default_rng(m + n + k)
            a = reference.random_matrix((m, k), "fp32", rng)
            b = reference.random_matrix((n, k), "fp32", rng)
            out = reference.poisoned((m, n), "fp32")
            g(a, b, out=out)
            ref = reference.to_float64(a) @ reference.to_float64(b).T
            err = reference.error(out, ref)
            a2, b2 = g.split(a, b)
            if g.raw_b:  # the GEMM reads the caller's weight itself
                b2 = b
            inner_out = reference.poisoned((m, n), "fp32")
            g.gemm(a2, b2, out=inner_out)
            same = bool((inner_out == out).all())
            fns = {"call": lambda: g(a, b, out=out), "gemm": lambda: g.gemm(a2, b2, out=inner_out)}
            base, _ = baseline.bind(g.spec, a, b)
            if base is not None:
                fns["cublas"] = base.fn
            cupy.cuda.Device().synchronize()
            t = {name: r.median_us for name, r in timing.time_interleaved(fns, reps=args.reps).items()}
            row = {"m": m, "n": n, "k": k, "err": err, "gemm_equals_call": same, "us": t,
                   "split_us": t["call"] - t["gemm"], "config": g.gemm.config.tag}
            rows.append(row)
            print(f"fp32 {m}x{n}x{k} err={err:.1e} same={same} call {t['call']:.1f} gemm {t['gemm']:.1f} "
                  f"split {row['split_us']:.1f} cublas {t.get('cublas', float('nan')):.1f} us ({row['config']})",
                  flush=True)
    report.write_experiment_json(args.out, "exp-fp32-breakdown.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
