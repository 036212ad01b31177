"""Experiment (GPU): SM clock and board power while a GEMM runs back to back, ours and cuBLAS's.

    python3 -m scripts.exp_power_clock [--seconds 4] [--out DIR]

Question it answers: at the large shapes, do the kernels run at the boost clock, or does the board's power limit
pull the clock down (then instructions and bytes moved per FLOP cost speed, not only issue slots)? For each
workload the call is repeated for --seconds without L2 flushes while `nvidia-smi` samples clocks.sm, power.draw and
the active clock-event reasons every 100 ms; the table gives the medians of the samples taken in the middle half
of the window and the achieved TFLOPS (events around the whole loop). "zeros" rows run the same kernel on zero
inputs (no correctness meaning: they show how much of the power is data-dependent switching).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench import report


QUERY = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active"


def _sample(fn, seconds: float) -> dict:
    import cupy
    import numpy as np

    proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "100"],
                            stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        calls = 0
        start.record()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(20):
                fn()
            calls += 20
            cupy.cuda.Device().synchronize()
        end.record()
        end.synchronize()
        elapsed_us = cupy.cuda.get_elapsed_time(start, end) * 1e3
    finally:
        proc.terminate()
        text, _ = proc.communicate(timeout=10)
    rows = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            rows.append((float(parts[0]), float(parts[1]), float(parts[2]), float(parts[3]), float(parts[4]), parts[5]))
        except (ValueError, IndexError):
            continue
    mid = rows[len(rows) // 4: max(len(rows) // 4 + 1, 3 * len(rows) // 4)]
    med = lambda i: float(np.median([r[i] for r in mid])) if mid else float("nan")  # noqa: E731
    return {"calls": calls, "us_per_call": elapsed_us / calls, "sm_mhz": med(0), "max_sm_mhz": med(1),
            "power_w": med(2), "power_limit_w": med(3), "temp_c": med(4),
            "reasons": sorted({r[5] for r in mid}), "samples": len(rows)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import cupy
    import torch

    import deepgemm_jit as dg
    from bench import dtypes as bench_dtypes
    from bench import runner
    from deepgemm_jit.spec import GemmSpec

    def ours(dtype_name, m, n, k, zeros=False):
        info = bench_dtypes.get(dtype_name)
        spec = GemmSpec.create(n, k, dtype=info.lib, scaling=info.scaling)
        ops = runner.operands(info, spec, m, cupy.random.default_rng(1))
        a, b = ops.a, ops.b
        if zeros:
            a, b = cupy.zeros_like(a), cupy.zeros_like(b)
        g = dg.build(m, n, k, dtype=info.lib, scaling=info.scaling)
        out = cupy.empty((m, n), dtype=dg.dtypes.numpy_dtype(spec.out_dtype))
        kwargs = ops.call_kwargs()
        return lambda: g(a, b, out=out, **kwargs)

    def torch_bf16(m, n, k):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        return lambda: torch.mm(a, b.T)  # torch's and CuPy's default streams are both the legacy null stream

    def torch_fp8_tensor(m, n, k):
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        return lambda: torch._scaled_mm(a, b.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    workloads = [
        ("ours bf16 4096x4096x7168", 4096, 4096, 7168, ours("bf16", 4096, 4096, 7168)),
        ("cublas bf16 4096x4096x7168", 4096, 4096, 7168, torch_bf16(4096, 4096, 7168)),
        ("ours bf16 zeros 4096x4096x7168", 4096, 4096, 7168, ours("bf16", 4096, 4096, 7168, zeros=True)),
        ("ours fp8_tensor 4096x7168x16384", 4096, 7168, 16384, ours("fp8_tensor", 4096, 7168, 16384)),
        ("cublas fp8_tensor 4096x7168x16384", 4096, 7168, 16384, torch_fp8_tensor(4096, 7168, 16384)),
        ("ours fp8_tensor zeros 4096x7168x16384", 4096, 7168, 16384, ours("fp8_tensor", 4096, 7168, 16384, zeros=True)),
        ("ours fp8_block 4096x7168x16384", 4096, 7168, 16384, ours("fp8_block", 4096, 7168, 16384)),
    ]
    idle = subprocess.run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv"], capture_output=True, text=True)
    print(idle.stdout.strip(), flush=True)
    rows = []
    for name, m, n, k, fn in workloads:
        for _ in range(3):
            fn()
        cupy.cuda.Device().synchronize()
        r = _sample(fn, args.seconds)
        r.update(name=name, tflops=2.0 * m * n * k / r["us_per_call"] / 1e6)
        rows.append(r)
        print(f"{name}: {r['us_per_call']:.1f} us/call {r['tflops']:.0f} TFLOPS | SM {r['sm_mhz']:.0f} MHz "
              f"(max {r['max_sm_mhz']:.0f}) power {r['power_w']:.0f} W (limit {r['power_limit_w']:.0f}) "
              f"{r['temp_c']:.0f} C reasons {r['reasons']} ({r['samples']} samples)", flush=True)
        time.sleep(1.0)
    report.write_experiment_json(args.out, "exp-power-clock.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
