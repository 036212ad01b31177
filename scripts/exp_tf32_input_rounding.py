"""Experiment (GPU): what Hopper's TF32 wgmma does with FP32 operands that are not TF32 values.

The same TF32 GEMM (sm90 kernel, dtype tf32) runs on A as drawn (full FP32 mantissas), on A truncated to TF32
(low 13 mantissa bits cleared) and on A rounded to the nearest TF32 (ties away, cvt.rna's rule, emulated here);
B is a TF32 value in all three. If the tensor cores drop the low bits, the raw and truncated results are equal bit
for bit and the rounded one differs. A premise of splitting fp32's weight inside the GEMM (docs/NOTES.md session 15).

    python3 -m scripts.exp_tf32_input_rounding [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import sys

from bench import report



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import cupy

    import deepgemm_jit as dg

    def truncate(x):
        return (x.view(cupy.uint32) & cupy.uint32(0xFFFFE000)).view(cupy.float32)

    def round_away(x):  # nearest TF32, ties away from zero (finite inputs far below FLT_MAX)
        bits = x.view(cupy.uint32)
        return ((bits + cupy.uint32(0x1000)) & cupy.uint32(0xFFFFE000)).view(cupy.float32)

    results = []
    for m, n, k in ((128, 256, 512), (64, 7168, 2048), (300, 1000, 4096)):
        rng = cupy.random.default_rng(m + n + k)
        a = rng.standard_normal((m, k), dtype=cupy.float32)
        b = truncate(rng.standard_normal((n, k), dtype=cupy.float32))
        g = dg.build(m, n, k, dtype="tf32", weight_streaming=False)
        outs = {}
        for name, aa in (("raw", a), ("trunc", truncate(a)), ("rna", round_away(a))):
            d = cupy.full((m, n), cupy.nan, dtype=cupy.float32)
            g(cupy.ascontiguousarray(aa), b, out=d)
            outs[name] = d
        row = {"m": m, "n": n, "k": k, "config": g.config.tag,
               "raw_equals_trunc": bool((outs["raw"] == outs["trunc"]).all()),
               "raw_equals_rna": bool((outs["raw"] == outs["rna"]).all()),
               "raw_vs_trunc_max_abs": float(cupy.abs(outs["raw"] - outs["trunc"]).max()),
               "raw_vs_rna_max_abs": float(cupy.abs(outs["raw"] - outs["rna"]).max()),
               "a_bits_dropped_by_trunc": int(cupy.count_nonzero(a != truncate(a)))}
        results.append(row)
        print(json.dumps(row), flush=True)
    report.write_experiment_json(args.out, "exp-tf32-input-rounding.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
