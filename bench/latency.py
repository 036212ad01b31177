"""Latency of the JIT itself: cold compile, warm load from disk, and host overhead of a hot call.

    python -m bench.latency [--out bench/results] [--arch sm_90a] [--calls 2000]

- cold compile: every kernel of the DeepSeek suite's (N, K) at M = 64 and 4096 (BF16), each built into an
  empty cache directory (render + key + NVRTC + store), wall time per kernel;
- warm load: the same kernels built again by fresh processes (in-process memo empty, cubins on disk):
  render index + read + checksum, wall time per kernel; the first kernel of each process apart (it also pays
  what a process does once: its stat memo of the sources, first calls), over `--warm-processes` processes;
  the one-time import of the package and the loading of CuPy's NVRTC (its version is part of every key)
  are reported apart;
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

from . import report
from .suites import SUITES

_BUILD_ALL = """
import json, sys, time
t0 = time.perf_counter()
import deepgemm_jit as dg
from deepgemm_jit import compiler
t1 = time.perf_counter()
compiler.nvrtc_version()  # one-time per process: imports CuPy's NVRTC binding and loads libnvrtc
t2 = time.perf_counter()
shapes, arch = json.loads(sys.argv[1]), sys.argv[2]
out = [{"setup_seconds": t2 - t0, "import_seconds": t1 - t0, "nvrtc_seconds": t2 - t1}]
for m, n, k in shapes:
    t0 = time.perf_counter()
    g = dg.build(m, n, k, dtype="bf16", arch=arch)
    out.append({"m": m, "n": n, "k": k, "seconds": time.perf_counter() - t0,
                "compiled": g.artifact.compiled_now, "config": g.config.tag})
print(json.dumps(out))
"""


def _build_in_fresh_process(shapes, arch: str, cache_dir: str) -> tuple[dict, list[dict]]:
    env = dict(os.environ, DEEPGEMM_JIT_CACHE_DIR=cache_dir)
    proc = subprocess.run([sys.executable, "-c", _BUILD_ALL, json.dumps(shapes), arch], env=env,
                          capture_output=True, text=True, check=True)
    rows = json.loads(proc.stdout)
    return rows[0], rows[1:]


def _summary(secs: list[float], count: str = "kernels") -> dict:
    return {count: len(secs), "median_ms": statistics.median(secs) * 1e3, "min_ms": min(secs) * 1e3,
            "max_ms": max(secs) * 1e3, "mean_ms": statistics.fmean(secs) * 1e3}


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
    p.add_argument("--warm-processes", type=int, default=5,
                   help="fresh processes that load every kernel from the warm cache (one first load each)")
    p.add_argument("--no-gpu", action="store_true", help="skip the hot-call measurement")
    args = p.parse_args(argv)

    shapes = sorted({(m, n, k) for m, n, k in SUITES["deepseek"].shapes if m in (64, 4096)})
    with tempfile.TemporaryDirectory(prefix="dgjit-latency-") as cache_dir:
        cold_setup, cold = _build_in_fresh_process(shapes, args.arch, cache_dir)
        warm_runs = [_build_in_fresh_process(shapes, args.arch, cache_dir) for _ in range(max(1, args.warm_processes))]
    warm_setup, warm = warm_runs[0]
    if not all(r["compiled"] for r in cold) or any(r["compiled"] for _, rows in warm_runs for r in rows):
        print("latency: unexpected cache behaviour (cold must compile, warm must not)", file=sys.stderr)
        return 1
    # The run's header without the GPU (versions, commit, source hash): the first two parts need none.
    header = report.collect_host_env(list(argv if argv is not None else sys.argv[1:]), module="bench.latency")
    result = {"header": header, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpu_count": os.cpu_count(),
              "arch": args.arch,
              "cold_compile": _summary([r["seconds"] for r in cold]),
              # the first warm process, every kernel (as reported before the first load was reported apart)
              "warm_load": _summary([r["seconds"] for r in warm]),
              "first_warm_load": _summary([rows[0]["seconds"] for _, rows in warm_runs], "processes"),
              "warm_load_after_first": _summary([r["seconds"] for _, rows in warm_runs for r in rows[1:]]),
              "rows": {"cold": cold, "warm": warm, "warm_processes": [rows for _, rows in warm_runs]},
              "process_setup_ms": {"cold": cold_setup["setup_seconds"] * 1e3,
                                   "warm": warm_setup["setup_seconds"] * 1e3},
              "process_once_ms": {
                  "import": statistics.median(s["import_seconds"] for s, _ in warm_runs) * 1e3,
                  "nvrtc": statistics.median(s["nvrtc_seconds"] for s, _ in warm_runs) * 1e3}}
    if not args.no_gpu:
        from deepgemm_jit import device

        if device.gpu_count():
            result["hot_call"] = hot_call_overhead(args.calls)
            # a GPU figure: the header says which GPU, driver and clocks it was measured on
            result["header"] = report.collect_env(list(argv if argv is not None else sys.argv[1:]), {},
                                                  module="bench.latency")
    print(f"cold compile: {result['cold_compile']['median_ms']:.0f} ms median, "
          f"{result['cold_compile']['max_ms']:.0f} ms max over {len(cold)} kernels ({os.cpu_count()} CPUs)")
    first, rest, once = result["first_warm_load"], result["warm_load_after_first"], result["process_once_ms"]
    print(f"warm load:    {rest['median_ms']:.2f} ms median, {rest['max_ms']:.2f} ms max (all but the first kernel "
          f"of {len(warm_runs)} processes)")
    print(f"first warm load of a process: {first['median_ms']:.2f} ms median, {first['min_ms']:.2f}-"
          f"{first['max_ms']:.2f} ms over {first['processes']} processes")
    print(f"once per process: import deepgemm_jit {once['import']:.0f} ms, load CuPy's NVRTC {once['nvrtc']:.0f} ms "
          "(median)")
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
