"""Debug (GPU): a fuzz seed's calls one at a time, printing the Gemm (family, tile, split-K) and each call's M and time
before and after it, so that a call that never returns (a kernel that hangs) is named by the last line printed.
Run each seed in its own process under `timeout`:

    DEEPGEMM_JIT_FUZZ_CASES=3000 timeout 30 python3 scripts/debug_fuzz_calls.py 123   # from the repo root
"""
import sys
import time

import cupy

sys.path.insert(0, "tests")
import fuzz  # noqa: E402

import deepgemm_jit as dg  # noqa: E402
from deepgemm_jit import splitk  # noqa: E402


def say(*parts):
    print(f"[{time.monotonic() - START:7.2f}s]", *parts, flush=True)


def probe(seed: int) -> None:
    case = fuzz.draw(seed)
    say(case.describe())
    g = dg.build(case.m, case.n, case.k, **case.build_kwargs())
    info = g.explain()
    say("config", info.get("config"), "kernel spec", getattr(g, "kernel_spec", None))
    rng = cupy.random.default_rng(case.seed)
    calls = [(case.m, None), *((m, None) for m in case.later_ms)] + ([(case.m, "again")] if case.later_ms else [])
    first = None
    for m, again in calls:
        cfg = getattr(g, "config", None)
        shares = splitk.num_splits(g.kernel_spec, cfg, m, 132, case.split_k) if cfg is not None and hasattr(
            g, "kernel_spec") else "?"
        call = first if again else fuzz._prepare(case, g.spec, m, rng)
        if again:
            fuzz._fill_out(call, g.spec)
        say(f"call M = {m}{' (again)' if again else ''}, shares {shares}: launching")
        fuzz._call_and_check(case, g, call, f"M = {m}")
        say(f"call M = {m}: returned and checked")
        first = first or call


if __name__ == "__main__":
    START = time.monotonic()
    for s in sys.argv[1].split(","):
        probe(int(s))
