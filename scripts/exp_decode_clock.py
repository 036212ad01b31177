"""Experiment (GPU): SM clock and board power while one decode call runs back to back, per variant.

    python3 scripts/exp_decode_clock.py --problems DTYPE[+EPILOGUE]:MxNxK,... [--tree NAME=DIR[@nows]]
                                        [--seconds S] [--out DIR]

Session 30's ncu run saw the decode tile (64x56 s10, M = 1) at 1.80 GHz and the row sweep at 1.97 GHz on the same
call. This times each variant alone, back to back (no flush: the weights here are larger than L2), for S seconds
while `nvidia-smi` samples the SM clock and power every 100 ms, and reports per variant: us per call (CUDA events
over the window), the mean SM clock and power of the samples inside the window (the first 0.3 s dropped), and GB/s.
Variants: "new" (the checkout's templates, build's dispatch), "new@nows" (the tile kernels where build would stream
weights), and each --tree NAME=DIR[@nows] (a templates/ copy, as scripts/exp_ab_templates.py). Every variant's
result is checked against the float64 reference first. A problem may fuse an epilogue (bf16+bias+gelu:4096x32768x512,
with the bench's operands) to see where large GEMMs sit against the board's power cap.
"""
from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

from bench import report


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", required=True, help="DTYPE:MxNxK,... (bench dtypes: bf16, fp8_tensor, ...)")
    ap.add_argument("--tree", action="append", default=[], help="NAME=DIR[@nows] of a templates/ copy")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    variants = [("new", None, False), ("new@nows", None, True)]
    for t in args.tree:
        name, spec = t.split("=", 1)
        d, _, opt = spec.partition("@")
        variants.append((name, str(Path(d).resolve()), opt == "nows"))
    sampler = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "100"],
        stdout=subprocess.PIPE, text=True)
    rows = []
    try:
        windows = []
        for problem in args.problems.split(","):
            for name, tdir, nows in variants:
                windows.append((problem, name, *_run(problem, tdir, nows, args.seconds)))
    finally:
        sampler.terminate()
        samples_text = sampler.communicate(timeout=10)[0]
    samples = _parse_samples(samples_text)
    for problem, name, tag, t0, t1, us, gbps, err in windows:
        inside = [(clk, pw) for ts, clk, pw in samples if t0 + 0.3 <= ts <= t1]
        clk = sum(c for c, _ in inside) / len(inside) if inside else float("nan")
        pw = sum(p for _, p in inside) / len(inside) if inside else float("nan")
        rows.append({"problem": problem, "variant": name, "kernel": tag, "us": us, "gbps": gbps, "err": err,
                     "sm_mhz": clk, "power_w": pw, "samples": len(inside)})
        print(f"{problem:24s} {name:12s} {tag:36s} {us:8.2f} us {gbps:7.0f} GB/s  {clk:6.0f} MHz  {pw:6.1f} W "
              f"({len(inside)} samples) err {err:.1e}", flush=True)
    report.write_experiment_json(args.out, "exp-decode-clock.json", rows)
    return 0


def _parse_samples(text: str) -> list[tuple[float, float, float]]:
    from datetime import datetime
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            ts = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((ts, float(parts[1]), float(parts[2])))
        except ValueError:
            continue
    return out


def _run(problem: str, tdir, nows: bool, seconds: float):
    import cupy

    import deepgemm_jit as dg
    from bench import runner
    from deepgemm_jit import reference

    p = runner.problem_inputs(problem)
    m, ops, kwargs = p.m, p.inputs, p.kwargs
    with runner.templates_tree(tdir):
        g = dg.build(m, p.n, p.k, **p.build_kwargs(), **({"weight_streaming": False} if nows else {}))
        out = reference.poisoned(p.spec.out_shape(m), p.spec.out_dtype)
        g(ops.a, ops.b, out=out, **kwargs)
    cupy.cuda.Device().synchronize()
    err = reference.error(reference.to_float64(out), ops.ref)
    if not reference.within_bound(err, p.info.lib):
        raise RuntimeError(f"{problem}: error {err:.3e} against the float64 reference, beyond the {p.info.lib} bound")
    tag = str(getattr(g.config, "tag", g.config))
    if m <= getattr(g, "weight_streaming_max_m", 0):
        tag = "weight streaming"
    # Calls per batch: about 20 ms of work, so the host loop stays ahead.
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(20):
        g(ops.a, ops.b, out=out, **kwargs)
    end.record()
    end.synchronize()
    per = cupy.cuda.get_elapsed_time(start, end) / 20
    batch = max(1, int(20.0 / per))
    t0 = time.time()
    start.record()
    calls = 0
    while time.time() - t0 < seconds:
        for _ in range(batch):
            g(ops.a, ops.b, out=out, **kwargs)
        calls += batch
        cupy.cuda.Device().synchronize()
    end.record()
    end.synchronize()
    t1 = time.time()
    us = cupy.cuda.get_elapsed_time(start, end) * 1e3 / calls
    nbytes = ops.a.nbytes + ops.b.nbytes + out.nbytes  # (an epilogue's operands not counted)
    return tag, t0, t1, us, nbytes / us / 1e3, err


if __name__ == "__main__":
    raise SystemExit(main())
