"""Profile (GPU): where the host time of a hot Gemm call goes (cProfile over many calls of a replayed plan).

    python3 scripts/profile_hot_call.py [--calls 20000] [--grouped | --quantize | --fp32 | --unwrapped]

--grouped: a GroupedGemm (FP8 block, 8 groups) called with a new output each time, i.e. without a kept launch
plan (what the torch op does): the full validation and planning path.
--quantize: deepgemm_jit.quantize(x, "fp8", "group128") of a 64 x 7168 BF16 matrix, with new outputs (checked every
call, and through the kept plan of calls without out=) and with out= (session 7: the standalone quantize measured
5-43 us in bench.quant_epilogue for a ~3 us kernel).
--fp32: an Fp32Gemm (3xTF32, 64 x 7168 x 2048: the raw-B GEMM) called with out= (session 16: the bench measured
87-230 us of host time per call against ~11 us for a plain Gemm).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time


def _print_profile(loop, lines: int) -> None:
    """cProfile over one call of `loop` (the GPU synchronised after it), the `lines` costliest functions by own time."""
    import cupy

    prof = cProfile.Profile()
    prof.enable()
    loop()
    prof.disable()
    cupy.cuda.Device().synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--grouped", action="store_true")
    ap.add_argument("--quantize", action="store_true")
    ap.add_argument("--fp32", action="store_true")
    ap.add_argument("--unwrapped", action="store_true",
                    help="plain loop: call Gemm.__call__ without runtime.orders_dlpack_imports (its cost)")
    args = ap.parse_args()
    if args.fp32:
        return profile_fp32(args.calls)
    if args.grouped:
        return profile_grouped(args.calls)
    if args.quantize:
        return profile_quantize(args.calls)
    import cupy

    import deepgemm_jit as dg
    from deepgemm_jit import reference

    g = dg.build(64, 256, 256, dtype="bf16")
    a, b = reference.random_operands(g.spec, 64)
    d = cupy.empty((64, 256), dtype=a.dtype)
    for _ in range(100):
        g(a, b, out=d)
    cupy.cuda.Device().synchronize()

    call = type(g).__call__.__wrapped__.__get__(g) if args.unwrapped else g

    def loop():
        for i in range(args.calls):
            if i % 2000 == 0:
                cupy.cuda.Device().synchronize()
            call(a, b, out=d)
    t0 = time.perf_counter()
    loop()
    cupy.cuda.Device().synchronize()
    label = "plain loop, unwrapped" if args.unwrapped else "plain loop"
    print(f"{label}: {(time.perf_counter() - t0) / args.calls * 1e6:.2f} us per call (incl. periodic syncs)")
    _print_profile(loop, 15)
    return 0


def profile_grouped(calls: int) -> int:
    import cupy

    import deepgemm_jit as dg
    from bench import runner

    n, k, groups, rows = 4096, 7168, 8, 64
    g = dg.build_grouped(n, k, dtype="fp8", expected_m=rows, num_groups=groups)
    x = runner.grouped_fp8_inputs(groups, rows, n, k, seed=0)
    outs = [cupy.empty((groups * rows, n), dtype=dg.dtypes.numpy_dtype("bf16")) for _ in range(2)]
    calls = min(calls, 2000)

    def loop():
        for i in range(calls):
            g._plans.clear()  # every call validates and plans, as with a fresh output
            g(x.qa, x.qb, scale_a=x.sa, scale_b=x.sb, offs=x.offs, out=outs[i % 2])
    loop()
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    loop()
    cupy.cuda.Device().synchronize()
    print(f"grouped, no kept plan: {(time.perf_counter() - t0) / calls * 1e6:.1f} us per call")
    _print_profile(loop, 20)
    return 0


def profile_fp32(calls: int) -> int:
    import cupy

    import deepgemm_jit as dg
    from deepgemm_jit import reference

    calls = min(calls, 5000)
    for m in (64, 1024):
        g = dg.build_fp32(m, 7168, 2048)
        rng = cupy.random.default_rng(0)
        a = reference.random_matrix((m, 2048), "fp32", rng)
        b = reference.random_matrix((7168, 2048), "fp32", rng)
        d = cupy.empty((m, 7168), dtype=cupy.float32)

        def loop():
            for i in range(calls):
                if i % 500 == 0:
                    cupy.cuda.Device().synchronize()
                g(a, b, out=d)
        loop()
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        loop()
        cupy.cuda.Device().synchronize()
        print(f"fp32 {m}x7168x2048 (raw_b={g.raw_b}), out=: {(time.perf_counter() - t0) / calls * 1e6:.1f} us per "
              "call (incl. periodic syncs)", flush=True)
        t0 = time.perf_counter()
        for _ in range(200):
            g(a, b, out=d)
        print(f"  200 calls enqueued in {(time.perf_counter() - t0) / 200 * 1e6:.1f} us each", flush=True)
        cupy.cuda.Device().synchronize()
        _print_profile(loop, 25)
    return 0


def profile_quantize(calls: int) -> int:
    import cupy

    import deepgemm_jit as dg
    from deepgemm_jit import reference

    x = reference.random_matrix((64, 7168), "bf16")
    q, s = dg.quantize(x, "fp8", "group128")
    calls = min(calls, 5000)

    from deepgemm_jit import quantization

    def loop(mode: str):
        for i in range(calls):
            if i % 1000 == 0:
                cupy.cuda.Device().synchronize()
            if mode == "new, checked":  # no kept plan: the full path of every call (as before session 8)
                quantization._new_output_plans.clear()
            dg.quantize(x, "fp8", "group128", out=(q, s) if mode == "given" else None)
    for mode in ("new, checked", "new", "given"):
        loop(mode)
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        loop(mode)
        cupy.cuda.Device().synchronize()
        print(f"quantize 64x7168 bf16 -> fp8 group128, out={mode}: "
              f"{(time.perf_counter() - t0) / calls * 1e6:.1f} us per call", flush=True)
    for mode in ("new", "given"):
        print(f"-- cProfile, out={mode}")
        _print_profile(lambda: loop(mode), 25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
