"""Experiment (GPU): does a change of the split-K cost model's constants pick faster kernels? For every problem of a
grid (bench dtypes x (N, K) x M, optionally with a fused epilogue) whose pick (tile and share count) differs between
the current constants and a variant's, time both picks (and cuBLAS) in one interleaved call, checked against float64
first. Rows a decode kernel serves (M <= the default build's weight_streaming_max_m) are left out: the tile pick does
not run there.

    python3 -m scripts.exp_split_model_ab --variant load15:_SPLIT_LOAD_K_BLOCKS=1.5 [--variant ...]
        [--dtypes bf16,fp8_block] [--nk 2048x7168,...] [--ms 16,64,128,256] [--epilogue E] [--plan] [--out DIR]

--plan prints the changed picks without a GPU (arch sm_90a, 132 SMs) and times nothing.

Session 38 (`bench/results/*exp-split-model-ab*-s38*`): the split tile sweep at M 128..384 found the model's 128x128
and 64x128 four-share picks 5-9.5% slower than 128x64 with two or three shares; the last share's load of the other
shares' FP32 partials (64 KB each for 128x128) runs on one SM after the main loop, which 0.5 K blocks per share
undercounts.
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys

from bench import report
from deepgemm_jit import sm90_rules

NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048), (2048, 7168),
      (1536, 7168), (3072, 4096), (1024, 4096), (4096, 14336), (4096, 28672)]
MS = [1, 4, 16, 32, 64, 96, 128, 192, 256, 384, 512]


def _parse_variant(text: str) -> tuple[str, dict]:
    name, _, assignments = text.partition(":")
    values = {}
    for item in assignments.split(","):
        const, _, value = item.partition("=")
        values[const.strip()] = float(value)
    if not name or not values:
        raise ValueError(f"--variant {text!r}: expected NAME:CONST=VALUE[,CONST=VALUE]")
    return name, values


def _pick(spec, m: int, arch: str, num_sms: int, values: dict | None):
    """(config, shares) the heuristic picks for M = m under the constants `values` (None: the current ones)."""
    from bench import runner
    from deepgemm_jit import config, splitk

    with runner.config_constants(values or {}):
        splitk.num_splits.cache_clear()
        ks = sm90_rules.kernel_spec(spec, arch, m)
        cfg = config.choose_config(ks, m, arch, num_sms)  # (it buckets M itself: config.tile_bucket)
        shares = splitk.num_splits(ks, cfg, m, num_sms) if cfg.split_k else 1
    splitk.num_splits.cache_clear()
    return cfg, shares


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", action="append", required=True, help="NAME:CONST=VALUE[,CONST=VALUE] of config.py")
    ap.add_argument("--dtypes", default="bf16,fp8_block,fp8_tensor,tf32,int8")
    ap.add_argument("--nk", default=None)
    ap.add_argument("--ms", default=",".join(str(m) for m in MS))
    ap.add_argument("--epilogue", default=None)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--plan", action="store_true", help="print the changed picks (no GPU needed)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    variants = dict(_parse_variant(v) for v in args.variant)

    import deepgemm_jit as dg
    from bench import dtypes as bench_dtypes
    from deepgemm_jit import gemv
    from deepgemm_jit.spec import GemmSpec

    if args.plan:
        arch, num_sms = "sm_90a", 132
    else:
        from deepgemm_jit import device
        arch, num_sms = device.current_arch(), device.num_sms()
    shapes = NK if args.nk is None else [tuple(int(v) for v in t.split("x")) for t in args.nk.split(",")]
    work = []
    for dname, (n, k), m in itertools.product(args.dtypes.split(","), shapes, (int(x) for x in args.ms.split(","))):
        info = bench_dtypes.get(dname)
        kw = {"dtype": info.lib, "scaling": info.scaling, "epilogue": args.epilogue}
        spec = GemmSpec.create(n, k, **kw)
        if spec.b_k_major and m <= gemv.max_m(spec, arch):
            continue  # a decode kernel serves this M (api.Gemm's rule; the bench layouts are nt)
        picks = {"current": _pick(spec, m, arch, num_sms, None)}
        picks.update({name: _pick(spec, m, arch, num_sms, values) for name, values in variants.items()})
        if len({(c.tag, s) for c, s in picks.values()}) > 1:
            work.append((dname, info, kw, spec, n, k, m, picks))
    print(f"{len(work)} problems change pick", flush=True)
    if args.plan:
        for dname, _, _, _, n, k, m, picks in work:
            print(f"{dname} {m}x{n}x{k}: " + " | ".join(f"{name} {c.tag} x{s}" for name, (c, s) in picks.items()))
        return 0
    import cupy

    from bench import runner
    from deepgemm_jit import timing

    rows = []
    for dname, info, kw, spec, n, k, m, picks in work:
        rng = cupy.random.default_rng(m * 7 + n + k)
        inputs = runner.operands(info, spec, m, rng, 1.0 / k ** 0.5 if args.epilogue else 1.0)
        epi_ops = runner.epilogue_operands(spec, m, rng) if args.epilogue else None
        gemms, seen = {}, {}
        for name, (cfg, shares) in picks.items():
            key = (cfg.tag, shares)
            if key in seen:  # same kernel and shares as an earlier contender: time it once
                continue
            seen[key] = name
            forced = {"split_k": shares} if cfg.split_k else {}
            gemms[name] = dg.build(m, n, k, config=cfg, weight_streaming=False, **forced, **kw)
        fns, errors = runner.checked_contenders(gemms, inputs, m, epi_ops)
        cupy.cuda.Device().synchronize()
        t = timing.time_interleaved(fns, reps=args.reps, warmup=3)
        us = {name: r.median_us for name, r in t.items()}
        us.update({name: us[seen[(c.tag, s)]] for name, (c, s) in picks.items() if name not in us})
        row = {"dtype": dname, "epilogue": spec.epilogue, "m": m, "n": n, "k": k,
               "picks": {name: [c.tag, s] for name, (c, s) in picks.items()}, "us": us,
               "max_err": max(errors.values())}
        rows.append(row)
        print(f"{dname} {m}x{n}x{k}: " + " | ".join(f"{name} {c.tag} x{s} {us[name]:.1f}"
                                                   for name, (c, s) in picks.items())
              + (f" | cublas {us['cublas']:.1f}" if "cublas" in us else ""), flush=True)
    for name in variants:
        ratios = [r["us"][name] / r["us"]["current"] for r in rows]
        if ratios:
            geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            print(f"{name}: {len(ratios)} rows, time ratio variant/current geomean {geo:.3f}, "
                  f"best {min(ratios):.3f}, worst {max(ratios):.3f}")
    report.write_experiment_json(args.out, "exp-split-model-ab.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
