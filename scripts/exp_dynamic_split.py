"""Experiment (GPU): split-K variants against the heuristic's kernel and cuBLAS, and template A/Bs of them.

    python3 -m scripts.exp_dynamic_split --problems bf16:1x7168x16384,fp8_tensor:1x7168x16384
                                         --variants auto,64x56s10d,64x56s10d:6,64x112s10:2,old:auto
                                         [--old TEMPLATES_DIR] [--reps 30] [--out DIR]

Per problem (a bench dtype, M x N x K): every variant of --variants, the first baseline of `deepgemm_jit.baseline`
that covers the dtype (cuBLAS through torch), interleaved in one timing call (L2 flushed, medians). A variant is
"auto" (the heuristic's choice, weight streaming off) or BMxBN[sS][d][:S]: that sm90 tile as a split-K kernel
(d: dynamic, units handed out at run time: needs docs/experiments/sm90-dynamic-split-k.patch applied, which adds
KernelConfig.split_dynamic), S shares per tile (default: splitk's rule for the kernel). Every
output is checked against the float64 reference first, and each variant runs twice more on the same inputs:
the bits must not change (both split-K modes sum the shares in a fixed order). "old:VARIANT" builds VARIANT from
the templates in --old (e.g. `git archive <commit> templates | tar -x -C DIR`, then DIR/templates) for an A/B in the
same call; the split workspaces are then sized for 64-row partials at every M (what kernels before the partials
shrank to the valid rows write).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from bench import report


_VARIANT = re.compile(r"(\d+)x(\d+)(?:s(\d+))?(d?)(?::(\d+))?")


def _variant_gemm(dg, config, spec, m, n, k, kw, text):
    """(Gemm, forced shares or None) of one --variants word (without its old: prefix)."""
    if text == "auto":
        return dg.build(m, n, k, weight_streaming=False, **kw), None
    match = _VARIANT.fullmatch(text)
    if match is None:
        raise SystemExit(f"--variants: {text!r} is not auto or BMxBN[sS][d][:S]")
    bm, bn = int(match.group(1)), int(match.group(2))
    stages = int(match.group(3)) if match.group(3) else None
    splits = int(match.group(5)) if match.group(5) else None
    dynamic = {"split_dynamic": True} if match.group(4) else {}
    if dynamic and "split_dynamic" not in config.KernelConfig.__dataclass_fields__:
        raise SystemExit(f"--variants {text}: dynamic split-K is docs/experiments/sm90-dynamic-split-k.patch; "
                         "apply it first")
    cfg = config.sm90_config(spec, bm, bn, stages, split_k=True, **dynamic)
    # build's split_k=1 would make the plain kernel; the split-K kernel with one share is what ":1" measures (a
    # dynamic one then draws whole tiles at run time).
    g = dg.build(m, n, k, config=cfg, weight_streaming=False, **kw)
    g.split_k = splits
    return g, splits


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", required=True, help="DTYPE:MxNxK,... (bench dtypes, e.g. bf16, fp8_tensor)")
    ap.add_argument("--variants", default="auto,64x56s10d")
    ap.add_argument("--old", default=None, help="a templates/ copy for the old: variants")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import cupy

    import deepgemm_jit as dg
    from bench import dtypes as bench_dtypes
    from bench import runner
    from deepgemm_jit import baseline, config, device, reference, splitk, timing
    from deepgemm_jit.spec import GemmSpec

    num_sms = device.num_sms()
    if args.old:  # old kernels write 64-row partials at every M
        splitk.partial_threads = lambda m: 128
    rows = []
    for problem in args.problems.split(","):
        dtype, shape = problem.split(":")
        m, n, k = (int(v) for v in shape.split("x"))
        info = bench_dtypes.get(dtype)
        kw = {"dtype": info.lib, "scaling": info.scaling}
        spec = GemmSpec.create(n, k, **kw)
        inputs = runner.operands(info, spec, m, cupy.random.default_rng(m * 7 + n + k))
        a, b, ops, ref = inputs.a, inputs.b, inputs.call_kwargs(), inputs.ref
        fns, info_rows = {}, {}
        for text in args.variants.split(","):
            old = text.startswith("old:")
            if old and not args.old:
                raise SystemExit(f"--variants {text}: give the old templates with --old")
            if old:  # build compiles the kernel
                os.environ["DEEPGEMM_JIT_TEMPLATES_DIR"] = str(Path(args.old).resolve())
            try:
                g, forced = _variant_gemm(dg, config, spec, m, n, k, kw, text[4:] if old else text)
            finally:
                os.environ.pop("DEEPGEMM_JIT_TEMPLATES_DIR", None)
            out = reference.poisoned(g.spec.out_shape(m), g.spec.out_dtype)
            g(a, b, out=out, **ops)
            err = reference.error(out, ref)
            same = True
            for _ in range(2):
                again = reference.poisoned(g.spec.out_shape(m), g.spec.out_dtype)
                g(a, b, out=again, **ops)
                same = same and bool(cupy.array_equal(again.view(cupy.uint8), out.view(cupy.uint8)))
            splits = splitk.num_splits(g.spec, g.config, m, num_sms, forced) if g.config.split_k else 1
            info_rows[text] = {"config": g.config.tag, "splits": splits, "err": err,
                               "within_bound": bool(reference.within_bound(err, spec.dtype)), "same_bits": same}
            fns[text] = (lambda g=g, out=out: g(a, b, out=out, **ops))
        base, _ = baseline.bind(spec, a, b, scaling=inputs.scaling)
        if base is not None and baseline.check(base, spec, ref).is_ok:
            fns["cublas"] = base.fn
        cupy.cuda.Device().synchronize()
        t = timing.time_interleaved(fns, reps=args.reps, warmup=3)
        row = {"dtype": dtype, "m": m, "n": n, "k": k, "variants": info_rows,
               "us": {name: r.median_us for name, r in t.items()},
               "us_min": {name: r.min_us for name, r in t.items()}}
        rows.append(row)
        weight_mb = n * k * spec_bytes(spec) / 1e6
        print(f"{dtype} {m}x{n}x{k} ({weight_mb:.0f} MB weight): " + " | ".join(
            f"{name} {us:.1f} us" + (f" ({weight_mb / us:.2f} TB/s {info_rows[name]['config']} S="
                                     f"{info_rows[name]['splits']} ok={info_rows[name]['within_bound']} "
                                     f"same={info_rows[name]['same_bits']})" if name in info_rows else "")
            for name, us in row["us"].items()), flush=True)
    report.write_experiment_json(args.out, "exp-dynamic-split.json", rows)
    bad = [(r["dtype"], r["m"], name) for r in rows for name, v in r["variants"].items()
           if not (v["within_bound"] and v["same_bits"])]
    if bad:
        print("FAILED (error bound or changing bits):", bad)
        return 1
    return 0


def spec_bytes(spec) -> float:
    from deepgemm_jit import dtypes

    return dtypes.get(spec.b_type).storage_bytes


if __name__ == "__main__":
    sys.exit(main())
