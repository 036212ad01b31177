"""Probe (GPU): which kernels cuBLAS (through torch) launches for given problems, with their grids and blocks.

    python3 -m scripts.probe_cublas_kernels [--problems DTYPE:MxNxK,...] [--out DIR]

DTYPE: bf16 (torch.mm), tf32 (torch.mm of float32 with TF32 allowed), fp8_tensor (torch._scaled_mm, per-tensor scales), fp8_block (F.scaled_mm, 1x128 x
128x128 block scales). Each problem is run a few times under torch.profiler; the table lists every CUDA kernel
of the last call (name, grid, block, dynamic shared memory, duration). The kernel names of cuBLAS encode the tile,
cluster and split strategy (e.g. ``..._tilesize64x128x64_..._cluster1x2x1...``): what the baseline does on the rows
where ours is slower.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench import report


DEFAULT = ("bf16:64x4096x7168,bf16:128x4096x7168,bf16:32x7168x16384,fp8_tensor:64x2112x7168,"
           "fp8_tensor:128x2112x7168,fp8_tensor:64x4096x7168,bf16:4096x4096x7168,fp8_tensor:4096x7168x16384")


def _call(torch, dtype: str, m: int, n: int, k: int):
    """The baseline call the bench times for this row (deepgemm_jit.baseline's torch recipes, unit scales)."""
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(n, k, device="cuda")
    if dtype == "bf16":
        a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
        return lambda: torch.mm(a, b.T)
    if dtype == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
        return lambda: torch.mm(a, b.T)
    from deepgemm_jit import baseline

    recipe = {"fp8_tensor": "tensor", "fp8_block": "block"}.get(dtype)
    if recipe is None:
        raise ValueError(f"dtype {dtype!r}: bf16, tf32, fp8_tensor or fp8_block")
    qa, qb = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    if recipe == "tensor":
        sa = sb = torch.ones((), device="cuda")
    else:
        sa = torch.ones(m, -(-k // 128), device="cuda")
        sb = torch.ones(-(-n // 128), -(-k // 128), device="cuda")
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    _, call = baseline.first_that_runs(baseline.torch_scaled_mm_calls(torch, qa, qb, recipe, sa, sb, out),
                                       f"FP8 {recipe} scaling")
    return call


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default=DEFAULT)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for problem in args.problems.split(","):
        dtype, _, dims = problem.partition(":")
        m, n, k = (int(v) for v in dims.split("x"))
        try:
            fn = _call(torch, dtype, m, n, k)
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
        except Exception as exc:  # a baseline torch refuses: say so and go on
            print(f"{problem}: {type(exc).__name__}: {exc}", flush=True)
            rows.append({"problem": problem, "error": str(exc)})
            continue
        # The chrome trace carries each kernel's launch shape (args: grid, block, registers, shared memory).
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            trace = json.loads(path.read_text())
        kernels = []
        for ev in trace.get("traceEvents", []):
            if ev.get("cat") != "kernel":
                continue
            a = ev.get("args", {})
            kernels.append({"name": ev.get("name"), "us": ev.get("dur"), "grid": a.get("grid"), "block": a.get("block"),
                            "registers": a.get("registers per thread"), "shared_memory": a.get("shared memory")})
        rows.append({"problem": problem, "kernels": kernels})
        for kern in kernels:
            print(f"{problem}: {kern['name'][:160]} grid={kern['grid']} block={kern['block']} "
                  f"regs={kern['registers']} smem={kern['shared_memory']} us={kern['us']}", flush=True)
    report.write_experiment_json(args.out, "probe-cublas-kernels.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
