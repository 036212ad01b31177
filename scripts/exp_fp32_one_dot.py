"""Experiment (GPU): the 3xTF32 FP32 GEMM's error on single dot products (M = N = 1), where the relative error is
ill-conditioned: a sum whose terms cancel reads large relative errors from FP32-level rounding. For each seed: the
result, the condition (sum |a_i b_i| / |sum a_i b_i|), and the error of build_fp32's kernel with and without raw_b
(DEEPGEMM_JIT_NO_RAW_B), each against float64, also scaled by 1 / condition (what FP32 rounding allows: ~1e-7).

    python3 -m scripts.exp_fp32_one_dot [--k 4096] [--n 1] [--seeds 20] [--out DIR]

Seed 0 draws tests/test_fp32x3_gpu.py's test_sweep_nt operands for the shape (its seed formula).
"""
from __future__ import annotations

import argparse
import os
import sys

from bench import report


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import cupy

    import deepgemm_jit as dg
    from deepgemm_jit import reference

    m, n, k = 1, args.n, args.k
    gemms = {}
    for name, off in (("raw_b", "0"), ("split", "1")):
        os.environ["DEEPGEMM_JIT_NO_RAW_B"] = off
        gemms[name] = dg.build_fp32(m, n, k)
    os.environ.pop("DEEPGEMM_JIT_NO_RAW_B")
    rows = []
    for seed in range(args.seeds):
        rng = cupy.random.default_rng(m * 1_000_003 + n * 1_009 + k if seed == 0 else seed)
        a = rng.standard_normal((m, k), dtype=cupy.float32)
        b = rng.standard_normal((n, k), dtype=cupy.float32)
        terms = a.astype(cupy.float64)[:, None, :] * b.astype(cupy.float64)[None, :, :]
        ref = terms.sum(-1)
        cond = float(cupy.abs(terms).sum(-1).max() / cupy.abs(ref).min())
        row = {"seed": seed, "ref": float(ref.ravel()[0]), "condition": cond, "tags": {}}
        for name, g in gemms.items():
            out = reference.poisoned((m, n), "fp32")
            g(a, b, out=out)
            err = reference.relative_error(out, ref)
            row[name] = err
            row[f"{name}_over_condition"] = err / cond
            row["tags"][name] = f"{g.config.tag} raw_b={g.raw_b}"
        rows.append(row)
        print(f"seed {seed} ref {row['ref']:.4g} cond {cond:.3g} raw_b err {row['raw_b']:.2e} "
              f"({row['raw_b_over_condition']:.2e}/cond) split err {row['split']:.2e} "
              f"({row['split_over_condition']:.2e}/cond)", flush=True)
    print(rows[0]["tags"])
    report.write_experiment_json(args.out, f"exp-fp32-one-dot-n{n}-k{k}.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
