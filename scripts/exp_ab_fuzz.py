"""Experiment (GPU): template trees A/B on any recipe the fuzz knows (INT8 row-scaled, quantize-on-store, ...),
each tree's call checked by the fuzz's own check, then all timed interleaved in one process (L2 flushed, medians).

    python3 -m scripts.exp_ab_fuzz --tree NAME=DIR [--tree ...] --cases RECIPE:LAYOUT:MxNxK[:EPILOGUE[:OUT]],...
                                   [--reps 30] [--out DIR]   # from the repo root

RECIPE is a tests/fuzz.py recipe (int8_row, fp8_block, bf16, ...); "base" is the checkout's templates. The operands
are made once per case (fuzz._prepare: fresh random values, out= poisoned) and every tree's kernel runs on them:
each result is checked against the float64 value (fuzz._check, the fuzz's bounds) before anything is timed, and the
trees' outputs compared bit for bit. scripts/exp_ab_templates.py does the same for the bench's dtypes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scripts.exp_ab_templates import _use_tree  # the tree switch both A/B scripts share

sys.path.insert(0, "tests")


def _case(text: str):
    import fuzz

    recipe, layout, shape, *rest = text.split(":")
    m, n, k = (int(v) for v in shape.split("x"))
    epilogue = rest[0] if rest and rest[0] else None
    out = rest[1] if len(rest) > 1 else None
    return fuzz.FuzzCase(0, recipe, layout, m, n, k, out, epilogue, None, True, 0, 0, 0, False)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR of a templates/ copy")
    ap.add_argument("--cases", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import cupy

    import deepgemm_jit as dg
    import fuzz
    from bench import report
    from deepgemm_jit import timing

    trees = [("base", None)] + [(name, str(Path(d).resolve())) for name, d in (t.split("=", 1) for t in args.tree)]
    rows = []
    for text in args.cases.split(","):
        case = _case(text)
        rng = cupy.random.default_rng(case.m + case.n + case.k)
        call, fns, outs, configs = None, {}, {}, {}
        for name, tdir in trees:
            _use_tree(tdir)
            g = dg.build(case.m, case.n, case.k, **case.build_kwargs())
            configs[name] = g.config.tag
            if call is None:
                call = fuzz._prepare(case, g.spec, case.m, rng)
            fuzz._fill_out(call, g.spec)
            result = g(call.a, call.b, out=call.out, **call.kwargs, **call.ops)
            fuzz.wait_for_call(f"{name} {text}")
            fuzz._check(case, g.spec, call, result, f"tree {name}")  # raises on a wrong result: nothing timed
            outs[name] = result.copy()
            fns[name] = (lambda g=g, call=call: g(call.a, call.b, out=call.out, **call.kwargs, **call.ops))
        _use_tree(None)
        same = all(bool((o.view(cupy.uint8) == outs["base"].view(cupy.uint8)).all()) for o in outs.values())
        t = timing.time_interleaved(fns, reps=args.reps, warmup=5)
        row = {"case": text, "configs": configs, "bitwise_equal": same,
               **{name: {"us": r.median_us} for name, r in t.items()}}
        rows.append(row)
        print(f"{text} [{configs['base']}] equal={same} " + "  ".join(
            f"{name} {r.median_us:.1f} us" for name, r in t.items()), flush=True)
    header = report.collect_env(sys.argv[1:], {"trees": dict(trees)}, module="scripts.exp_ab_fuzz")
    stamp = report.experiment_stamp(header)
    commit = (header.get("git_commit") or "nogit")[:7]
    report.write_experiment_json(args.out, f"{stamp}-exp-ab-fuzz-{commit}.json", {"header": header, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
