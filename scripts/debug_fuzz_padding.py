"""Debug (GPU): which bytes of out's row padding failing fuzz seeds change, and through which path (family, tile,
staged roles). Session 32 found TMA stores writing element N of every row this way (docs/NOTES.md).

    python3 scripts/debug_fuzz_padding.py 278,284,238   # from the repo root
"""
import dataclasses
import sys

import cupy

sys.path.insert(0, "tests")
import fuzz  # noqa: E402

import deepgemm_jit as dg  # noqa: E402


def probe(seed: int) -> None:
    case = fuzz.draw(seed)
    case = dataclasses.replace(case, out_pad=max(case.out_pad, 1))  # out= a padded view, whatever the draw said
    g = dg.build(case.m, case.n, case.k, **case.build_kwargs())
    call = fuzz._prepare(case, g.spec, case.m, cupy.random.default_rng(seed))
    g(call.a, call.b, out=call.out, **call.kwargs, **call.ops)
    cupy.cuda.get_current_stream().synchronize()
    base = call.out.base
    lo, hi = fuzz._out_bytes(call, g.spec)
    outside = cupy.ones(call.pad_before.shape, dtype=bool)
    outside[:, lo:hi] = False
    changed = cupy.argwhere((fuzz.as_bytes(base) != call.pad_before) & outside)
    staged = sorted(r for _, _, r in g._staging.held()) if hasattr(g, "_staging") else "-"
    print(f"seed {seed}: {case.describe()}", flush=True)
    print(f"  family {g.family} config {getattr(g.config, 'tag', None)} staged {staged} out ptr%16 "
          f"{call.out.data.ptr % 16} pitch {base.strides[0]} changed bytes {int(changed.shape[0])} of "
          f"{int(outside.sum())}",
          flush=True)
    if changed.shape[0]:
        rows, cols = cupy.unique(changed[:, 0]), cupy.unique(changed[:, 1])
        print(f"  rows {rows[:10].tolist()}... ({rows.size}) byte columns {cols.tolist()[:16]} (out: {lo}..{hi})",
              flush=True)


if __name__ == "__main__":
    for s in [int(x) for x in sys.argv[1].split(",")]:
        try:
            probe(s)
        except Exception as e:
            print(f"seed {s}: {type(e).__name__}: {e}", flush=True)
