"""Experiment (GPU): TF32 nn (B stored (K, N)) with B transposed in the kernel's shared memory (sm90_tiles.sm90_trans_b)
against the nt kernel on per-call K-major copies of B (sm90_rules.sm90_transposes) and cuBLAS, in one interleaved run.

    python3 -m scripts.exp_tf32_trans_b [--ms 1,64,256,1000,4096] [--nk 4096x7168,7168x2048] [--reps 20]
                                        [--tree NAME=DIR ...] [--out DIR]

"kernel" is build()'s Gemm with sm90_rules.SM90_TF32_TRANS_B_MAX_M lifted (every M transposes in the kernel), "copies"
the same with it at 0 (every M copies B), "built" build()'s own choice; each the cost model's tile for its spec
(the nn spec's tiles are multiples of 32 columns). Outputs are checked against a float64 reference before timing
(L2 flushed, medians); the row says where the rule's bound (SM90_TF32_TRANS_B_MAX_M) should sit. Each --tree
NAME=DIR (a copy of templates/, e.g. with docs/experiments/sm90-trans-b-l2-prefetch.patch applied) adds a contender
NAME: "kernel" built from that tree's kernels.
"""
from __future__ import annotations

import argparse
import sys

from bench import report

MS = (1, 64, 128, 256, 512, 1000, 2048, 4096)
NK = ("4096x7168", "7168x2048", "2112x7168")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default=",".join(str(m) for m in MS))
    ap.add_argument("--nk", default=",".join(NK))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tree", action="append", default=[], help="NAME=DIR of a templates/ copy")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    trees = [t.split("=", 1) for t in args.tree]
    import deepgemm_jit as dg
    from bench import dtypes as bench_dtypes
    from bench import runner
    from deepgemm_jit import reference
    from deepgemm_jit.spec import GemmSpec

    info = bench_dtypes.get("tf32")
    rows = []
    for nk in args.nk.split(","):
        n, k = (int(v) for v in nk.split("x"))
        spec = GemmSpec.create(n, k, dtype="tf32", layout="nn")
        for m in (int(v) for v in args.ms.split(",")):
            contenders = {"built": dg.build(m, n, k, dtype="tf32", layout="nn")}
            for name, bound, tdir in [("kernel", 1 << 30, None), ("copies", 0, None)] + [
                    (name, 1 << 30, tdir) for name, tdir in trees]:
                with runner.templates_tree(tdir), runner.config_constants({"SM90_TF32_TRANS_B_MAX_M": bound}):
                    contenders[name] = dg.build(m, n, k, dtype="tf32", layout="nn")
            _, errors, us = runner.time_checked(contenders, info, spec, m, args.reps)
            tiles = {name: g.config.tag + ("" if g.kernel_spec.layout == "nn" else " (nt twin)")
                     for name, g in contenders.items()}
            row = {"m": m, "n": n, "k": k, "us": us, "tiles": tiles, "max_err": max(errors.values()),
                   "correct": all(reference.within_bound(e, "tf32") for e in errors.values())}
            rows.append(row)
            print(f"tf32 nn {m}x{n}x{k} ok={row['correct']} kernel {us['kernel']:.1f} ({tiles['kernel']}) copies "
                  f"{us['copies']:.1f} ({tiles['copies']}) built {us['built']:.1f} cublas "
                  f"{us.get('cublas', float('nan')):.1f}" + "".join(f" {name} {us[name]:.1f}" for name, _ in trees),
                  flush=True)
    report.write_experiment_json(args.out, "exp-tf32-trans-b.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
