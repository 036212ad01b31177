"""Profile (GPU): where the host time of a hot Gemm call goes (cProfile over many calls of a replayed plan).

    python3 scripts/profile_hot_call.py [--calls 20000]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    import cupy

    import deepgemm_jit as dg
    from deepgemm_jit import reference

    g = dg.build(64, 256, 256, dtype="bf16")
    a, b = reference.random_operands(g.spec, 64)
    d = cupy.empty((64, 256), dtype=a.dtype)
    for _ in range(100):
        g(a, b, out=d)
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for i in range(args.calls):
        if i % 2000 == 0:
            cupy.cuda.Device().synchronize()
        g(a, b, out=d)
    cupy.cuda.Device().synchronize()
    print(f"plain loop: {(time.perf_counter() - t0) / args.calls * 1e6:.2f} us per call (incl. periodic syncs)")
    prof = cProfile.Profile()
    prof.enable()
    for i in range(args.calls):
        if i % 2000 == 0:
            cupy.cuda.Device().synchronize()
        g(a, b, out=d)
    prof.disable()
    cupy.cuda.Device().synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
