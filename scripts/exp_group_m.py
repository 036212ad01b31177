"""Experiment (GPU): the persistent walk's raster band (KernelConfig.group_m, M blocks walked together) per problem.

    python3 -m scripts.exp_group_m [--problems DTYPE:MxNxK,...] [--grouped GxMxNxK,...] [--values 4,8,16,32]
                                   [--reps 30] [--offline] [--out DIR]

Every sm90 kernel walks its tiles in bands of group_m consecutive M blocks, M fastest inside a band
(sched_sm90.cuh, raster); group_m has been 16 everywhere since the first sm90 kernels and was never swept. The band
decides which CTAs load the same A / B tiles at the same time, which session 43's ncu runs tied to how many loads
the L2 request coalescer merges. Each problem is built with the heuristic's config and with that config's group_m
replaced by each value (same tile, stages and everything else); the outputs must be bitwise equal (the band changes
which CTA computes a tile, not how), then all are timed interleaved (L2 flushed, medians).
--grouped rows are contiguous FP8 block-scaled grouped GEMMs (G groups of M rows, B (G, N, K)); their walk runs the
band inside each group. --offline (no GPU) compiles every variant into DEEPGEMM_JIT_CACHE_DIR for sm_90a.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

ARCH = "sm_90a"


def _dense_builds(problem: str, values: list[int], arch: str | None) -> tuple[object, dict]:
    """(problem inputs or None offline, value -> Gemm): the heuristic's config with each group_m."""
    import deepgemm_jit as dg
    from bench import runner

    m, n, k, info, _spec, epilogue, layout = runner.parse_problem(problem)
    kwargs = dict(dtype=info.lib, scaling=info.scaling, layout=layout, **({"epilogue": epilogue} if epilogue else {}))
    base = dg.build(m, n, k, arch=arch, **kwargs)
    if base.config.family != "sm90":
        raise SystemExit(f"{problem}: the heuristic picked the {base.config.family} family (no raster)")
    return base, {v: dg.build(m, n, k, arch=arch, config=dataclasses.replace(base.config, group_m=v), **kwargs)
                  for v in values}


def _grouped_builds(text: str, values: list[int], arch: str | None) -> tuple[tuple[int, ...], dict]:
    import deepgemm_jit as dg

    groups, m, n, k = (int(v) for v in text.split("x"))
    base = dg.build_grouped(n, k, dtype="fp8", expected_m=m, num_groups=groups, arch=arch)
    return (groups, m, n, k), {v: dg.build_grouped(n, k, dtype="fp8", expected_m=m, num_groups=groups, arch=arch,
                                                   config=dataclasses.replace(base.config, group_m=v))
                               for v in values}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default="fp8_block:4096x4096x7168,fp8_block:4096x7168x16384,"
                                          "fp8_block:32768x4096x7168,bf16:4096x4096x7168")
    ap.add_argument("--grouped", default="4x8192x4096x7168", help="GxMxNxK contiguous FP8 rows ('' for none)")
    ap.add_argument("--values", default="4,8,16,32")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--offline", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    values = [int(v) for v in args.values.split(",")]
    problems = [p for p in args.problems.split(",") if p]
    grouped = [g for g in args.grouped.split(",") if g]
    if args.offline:
        for p in problems:
            base, gemms = _dense_builds(p, values, ARCH)
            print(p, base.config.tag, "->", ", ".join(g.config.tag for g in gemms.values()))
        for g in grouped:
            _, gemms = _grouped_builds(g, values, ARCH)
            print(g, ", ".join(x.config.tag for x in gemms.values()))
        return 0

    from bench import report, runner
    from deepgemm_jit import reference, timing

    cases = []
    for p in problems:
        inputs = runner.problem_inputs(p)
        base, gemms = _dense_builds(p, values, None)
        out = reference.poisoned(inputs.spec.out_shape(inputs.m), inputs.spec.out_dtype)
        calls = {f"g{v}": (lambda g=g, p=inputs, out=out: g(p.inputs.a, p.inputs.b, out=out, **p.kwargs))
                 for v, g in gemms.items()}
        cases.append((p, base.config.tag, calls, out))
    for text in grouped:
        (groups, m, n, k), gemms = _grouped_builds(text, values, None)
        gp = runner.grouped_fp8_inputs(groups, m, n, k, seed=m + n + k)
        out = reference.poisoned((groups * m, n), "bf16")
        calls = {f"g{v}": (lambda g=g, gp=gp, out=out: g(gp.qa, gp.qb, scale_a=gp.sa, scale_b=gp.sb, offs=gp.offs,
                                                         out=out))
                 for v, g in gemms.items()}
        cases.append((f"grouped fp8 {text}", next(iter(gemms.values())).config.tag, calls, out))
    rows = []
    for name, tag, calls, out in cases:
        same = runner.bitwise_equal_outputs(calls, out)
        t = timing.time_interleaved(calls, reps=args.reps, warmup=5)
        row = {"problem": name, "config": tag, "bitwise_equal": same, **{v: r.median_us for v, r in t.items()}}
        rows.append(row)
        print(f"{name} ({tag}): equal={all(same.values())} " + "  ".join(f"{v} {r.median_us:.1f} us"
                                                                         for v, r in t.items()), flush=True)
    header = report.collect_env(sys.argv[1:], {"values": args.values}, module="scripts.exp_group_m")
    stamp = report.experiment_stamp(header)
    report.write_experiment_json(args.out, f"{stamp}-exp-group-m.json", {"header": header, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
