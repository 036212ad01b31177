"""Experiment (GPU): the weight-streaming kernel for weights stored (K, N) (gemv_kn.py) against the Hopper tiles the
same Gemm runs without it, and cuBLAS, in one interleaved run per row.

    python3 -m scripts.exp_gemv_kn [--ms 1,8] [--dtypes bf16,tf32] [--layouts nn,tn] [--nk 4096x4096,...]
                                   [--reps 20] [--out DIR]

"stream" is build()'s Gemm (calls with M <= 8 run gemv_kn), "tiles" the same with weight_streaming=False; with
--clusters C,... also "cC": gemv_kn at cluster size C (instead of gemv_kn.choose_cluster's); each --tree NAME=DIR
(a copy of templates/) a contender NAME: "stream" with that copy's kernels; --all-dtypes streams 16-bit calls too.
Outputs are checked against a float64 reference before timing (L2 flushed, medians). Default shapes: the models
suite's.
"""
from __future__ import annotations

import argparse
import sys

from bench import report


def main() -> int:
    from bench import suites

    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,8")
    ap.add_argument("--dtypes", default="bf16,tf32")
    ap.add_argument("--layouts", default="nn")
    ap.add_argument("--nk", default=",".join(f"{n}x{k}" for n, k in suites._MODELS_NK))
    ap.add_argument("--clusters", default="")
    ap.add_argument("--tree", action="append", default=[], help="NAME=DIR of a templates/ copy")
    ap.add_argument("--all-dtypes", action="store_true", help="16-bit calls stream too (gemv_kn.STREAM_DTYPES)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import deepgemm_jit as dg
    from bench import dtypes as bench_dtypes
    from bench import runner
    from deepgemm_jit import gemv_kn, reference
    from deepgemm_jit.spec import GemmSpec

    if args.all_dtypes:
        gemv_kn.STREAM_DTYPES = gemv_kn.WEIGHT_DTYPES
    rows = []
    for name in args.dtypes.split(","):
        info = bench_dtypes.get(name)
        for layout in args.layouts.split(","):
            for nk in args.nk.split(","):
                n, k = (int(v) for v in nk.split("x"))
                spec = GemmSpec.create(n, k, dtype=info.lib, layout=layout)
                for m in (int(v) for v in args.ms.split(",")):
                    contenders = {"stream": dg.build(m, n, k, dtype=info.lib, layout=layout),
                                  "tiles": dg.build(m, n, k, dtype=info.lib, layout=layout, weight_streaming=False)}
                    for c in (int(v) for v in args.clusters.split(",") if v):
                        contenders[f"c{c}"] = ForcedCluster(dg.build(m, n, k, dtype=info.lib, layout=layout), c)
                    for name_dir in args.tree:
                        tree, tdir = name_dir.split("=", 1)
                        contenders[tree] = TreeGemm(dg.build(m, n, k, dtype=info.lib, layout=layout), tdir)
                    _, errors, us = runner.time_checked(contenders, info, spec, m, args.reps)
                    kernel = gemv_kn.GemvKnSpec.for_gemm(spec, 132).tag
                    row = {"dtype": name, "layout": layout, "m": m, "n": n, "k": k, "us": us, "kernel": kernel,
                           "tiles": contenders["tiles"].config.tag, "max_err": max(errors.values()),
                           "correct": all(reference.within_bound(e, info.lib) for e in errors.values()),
                           "tb_s": n * k * spec_bytes(info.lib) / us["stream"] / 1e6}
                    rows.append(row)
                    print(f"{name} {layout} {m}x{n}x{k} ok={row['correct']} stream {us['stream']:.1f} ({kernel}, "
                          f"{row['tb_s']:.2f} TB/s) tiles {us['tiles']:.1f} ({row['tiles']}) cublas "
                          f"{us.get('cublas', float('nan')):.1f}"
                          + "".join(f" {key} {v:.1f}" for key, v in us.items()
                                    if key not in ("stream", "tiles", "cublas")),
                          flush=True)
    report.write_experiment_json(args.out, "exp-gemv-kn.json", rows)
    return 0


class ForcedCluster:
    """A Gemm whose gemv_kn calls run at cluster size `cluster` (its first call plans; later calls replay)."""

    def __init__(self, gemm, cluster: int):
        self.gemm, self.spec, self.cluster = gemm, gemm.spec, cluster

    def __call__(self, *args, **kwargs):
        from deepgemm_jit import gemv_kn

        saved = gemv_kn.choose_cluster
        gemv_kn.choose_cluster = lambda *_: self.cluster
        try:
            return self.gemm(*args, **kwargs)
        finally:
            gemv_kn.choose_cluster = saved


class TreeGemm:
    """A Gemm whose calls build and run kernels from another templates/ copy (runner.templates_tree)."""

    def __init__(self, gemm, tdir: str):
        self.gemm, self.spec, self.tdir = gemm, gemm.spec, tdir

    def __call__(self, *args, **kwargs):
        from bench import runner

        with runner.templates_tree(self.tdir):
            return self.gemm(*args, **kwargs)


def spec_bytes(dtype: str) -> int:
    from deepgemm_jit import dtypes

    return dtypes.get(dtype).storage_bytes


if __name__ == "__main__":
    sys.exit(main())
