"""Experiment (GPU): dense GEMMs at M between the power-of-two buckets, the bucket's tile against the tile the cost
model picks for the call's own rows (M rounded up to a whole 128-row block), and cuBLAS, in one interleaved run.

    python3 -m scripts.exp_m_buckets [--dtypes bf16,fp8_block] [--ms 300,479,586,...] [--nk 4096x7168,...] [--out DIR]

`build(M)` picks its kernel for config.m_bucket(M), M rounded up to a power of two, so every M of (512, 1024] runs
the 1024-row tile: at 586 rows x 4096 x 7168 BF16 that is 128x256 (80 tiles on 132 SMs, 77 us; cuBLAS 50). "bucket"
= that kernel, "rows" = config.choose_sm90_config at M rounded up to 128 rows (forced with build(config=)), "cublas" = the
first baseline that covers the dtype. Outputs are checked against a float64 reference before timing (L2 flushed,
medians); a row whose two configs are the same kernel times it once.
"""
from __future__ import annotations

import argparse
import sys

from bench import report

MS = (300, 479, 586, 700, 800, 900, 1100, 1300, 1800, 2600, 3500)
NK = {"bf16": ((4096, 7168), (7168, 2048), (2112, 7168)), "fp8_block": ((4096, 7168), (7168, 2048))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="bf16,fp8_block")
    ap.add_argument("--ms", default=",".join(str(m) for m in MS))
    ap.add_argument("--nk", default=None, help="comma list of NxK for every dtype (default: NK per dtype)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import cupy

    import deepgemm_jit as dg
    from bench import dtypes as bench_dtypes
    from bench import runner
    from deepgemm_jit import config, device, reference, timing
    from deepgemm_jit.spec import GemmSpec

    num_sms = device.num_sms()
    rows = []
    for dname in args.dtypes.split(","):
        info = bench_dtypes.get(dname)
        shapes = NK[dname] if args.nk is None else [tuple(int(v) for v in t.split("x")) for t in args.nk.split(",")]
        for n, k in shapes:
            kw = {"dtype": info.lib, "scaling": info.scaling}
            spec = GemmSpec.create(n, k, **kw)
            for m in (int(x) for x in args.ms.split(",")):
                inputs = runner.operands(info, spec, m, cupy.random.default_rng(m * 7 + n + k))
                bucket = dg.build(m, n, k, **kw)
                rows_cfg = config.choose_sm90_config(spec, -(-m // 128) * 128, num_sms)
                gemms = {"bucket": bucket}
                if rows_cfg != bucket.config:
                    gemms["rows"] = dg.build(m, n, k, config=rows_cfg, **kw)
                fns, errors = runner.checked_contenders(gemms, inputs, m)
                cupy.cuda.Device().synchronize()
                t = timing.time_interleaved(fns, reps=args.reps, warmup=3)
                us = {name: r.median_us for name, r in t.items()}
                us.setdefault("rows", us["bucket"])
                row = {"dtype": dname, "m": m, "n": n, "k": k, "bucket_tile": bucket.config.tag,
                       "rows_tile": rows_cfg.tag, "us": us, "max_err": max(errors.values()),
                       "correct": all(reference.within_bound(e, spec.dtype) for e in errors.values())}
                rows.append(row)
                cub = us.get("cublas")
                print(f"{dname} m={m} n={n} k={k} ok={row['correct']} bucket {us['bucket']:.1f} ({row['bucket_tile']}) "
                      f"rows {us['rows']:.1f} ({row['rows_tile']})" + (f" cublas {cub:.1f}" if cub else ""),
                      flush=True)
    report.write_experiment_json(args.out, "exp-m-buckets.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
