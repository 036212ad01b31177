"""Latency of the JIT itself: cold compile, warm load from disk, and host overhead of a hot call.

    python -m bench.latency [--out bench/results] [--arch sm_90a] [--calls 2000]

- cold compile: every kernel of the DeepSeek suite's (N, K) at M = 64 and 4096 (BF16), each built into an
  empty cache directory (render + key + NVRTC + store), wall time per kernel;
- warm load: the same kernels built again by a fresh process (in-process memo empty, cubins on disk):
  render + key + read + checksum, wall time per kernel (the one-time import of the package and CuPy is
  reported apart);
- hot call (GPU only): host time of ``g(a, b, out=d)`` on a small problem (validation, variant lookup,
  tensor maps, launch), median over `--calls` calls, the device kept busy so the queue never drains.
The first two need no GPU (run them on the 2-core machine the issue's bar speaks of).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .suites import SUITES

_BUILD_ALL = """
import json, sys, time
t0 = time.perf_counter()
import deepgemm_jit as dg
from deepgemm_jit import compiler
compiler.nvrtc_version()  # one-time per process: imports CuPy's NVRTC binding (and CuPy)
setup = time.perf_counter() - t0
shapes, arch = json.loads(sys.argv[1]), sys.argv[2]
out = [{"setup_seconds": setup}]
for m, n, k in shapes:
    t0 = time.perf_counter()
    g = dg.build(m, n, k, dtype="bf16", arch=arch)
    out.append({"m": m, "n": n, "k": k, "seconds": time.perf_counter() - t0,
                "compiled": g.artifact.compiled_now, "config": g.config.tag})
print(json.dumps(out))
"""


def _build_in_fresh_process(shapes, arch: str, cache_dir: str) -> list[dict]:
    env = dict(os.environ, DEEPGEMM_JIT_CACHE_DIR=cache_dir)
    proc = subprocess.run([sys.executable, "-c", _BUILD_ALL, json.dumps(shapes), arch], env=env,
                          capture_output=True, text=True, check=True)
    rows = json.loads(proc.stdout)
    return rows[0]["setup_seconds"], rows[1:]


def _summary(rows: list[dict]) -> dict:
    secs = [r["seconds"] for r in rows]
    return {"kernels": len(rows), "median_ms": statistics.median(secs) * 1e3, "max_ms": max(secs) * 1e3,
            "mean_ms": statistics.fmean(secs) * 1e3}


def hot_call_overhead(calls: int) -> dict:
    import cupy

    import deepgemm_jit as dg
    from deepgemm_jit import reference

    g = dg.build(64, 256, 256, dtype="bf16")
    a, b = reference.random_operands(g.spec, 64)
    d = cupy.empty((64, 256), dtype=a.dtype)
    busy = cupy.empty(1 << 28, dtype=cupy.uint8)  # a long memset keeps the GPU ahead of the host
    for _ in range(20):
        g(a, b, out=d)
    cupy.cuda.Device().synchronize()
    samples = []
    for i in range(calls):
        if i % 200 == 0:
            cupy.cuda.Device().synchronize()
            busy.fill(i & 0xFF)
        t0 = time.perf_counter()
        g(a, b, out=d)
        samples.append(time.perf_counter() - t0)
    cupy.cuda.Device().synchronize()
    samples.sort()
    return {"calls": calls, "median_us": statistics.median(samples) * 1e6,
            "p90_us": samples[int(0.9 * len(samples))] * 1e6, "family": g.family, "config": g.config.tag}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--no-gpu", action="store_true", help="skip the hot-call measurement")
    args = p.parse_args(argv)

    shapes = sorted({(m, n, k) for m, n, k in SUITES["deepseek"].shapes if m in (64, 4096)})
    with tempfile.TemporaryDirectory(prefix="dgjit-latency-") as cache_dir:
        cold_setup, cold = _build_in_fresh_process(shapes, args.arch, cache_dir)
        warm_setup, warm = _build_in_fresh_process(shapes, args.arch, cache_dir)
    if not all(r["compiled"] for r in cold) or any(r["compiled"] for r in warm):
        print("latency: unexpected cache behaviour (cold must compile, warm must not)", file=sys.stderr)
        return 1
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpu_count": os.cpu_count(), "arch": args.arch,
              "cold_compile": _summary(cold), "warm_load": _summary(warm), "rows": {"cold": cold, "warm": warm},
              "process_setup_ms": {"cold": cold_setup * 1e3, "warm": warm_setup * 1e3}}
    if not args.no_gpu:
        from deepgemm_jit import device

        if device.gpu_count():
            result["hot_call"] = hot_call_overhead(args.calls)
    print(f"cold compile: {result['cold_compile']['median_ms']:.0f} ms median, "
          f"{result['cold_compile']['max_ms']:.0f} ms max over {len(cold)} kernels ({os.cpu_count()} CPUs)")
    print(f"warm load:    {result['warm_load']['median_ms']:.2f} ms median, {result['warm_load']['max_ms']:.2f} ms max")
    print(f"once per process (import deepgemm_jit + CuPy's NVRTC): {warm_setup * 1e3:.0f} ms")
    if "hot_call" in result:
        h = result["hot_call"]
        print(f"hot call:     {h['median_us']:.1f} us median host time, p90 {h['p90_us']:.1f} us ({h['config']})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-latency-{os.cpu_count()}cpu.json"
    (out / name).write_text(json.dumps(result, indent=1))
    print(f"json: {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
