"""Experiment (GPU): how much of the FP8 block kernel's gap to the per-tensor kernel is its scale path?

Times the same 128x128 promoted FP8 kernel, interleaved, L2 flushed, in variants rendered from patched copies of
templates/ (DEEPGEMM_JIT_TEMPLATES_DIR):

  tensor        scaling="tensor" (promoted, no per-K-block scales): the ceiling for this tile (6 stages)
  tensor-s5     the same with 5 stages, the most the block kernel's shared memory holds at 128x128
  block         scaling="block" with row-major scale_a: the scale warp's path (cp.async into each stage, 33
                arrivals per full barrier); dg.quantize's M-major scale_a would take the bulk A-scale path instead
  block-nocopy  the scale warp issues no copies, only its arrivals (scales read from stale shared memory)
  block-nowarp  no scale warp at all, full barriers of one arrival (scales read from stale shared memory)

The patched variants compute wrong values on purpose (nothing is checked): they only bound what the scale path
costs. Usage: python3 scripts/exp_fp8_scale_path.py [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench import report


SHAPES = [(4096, 4096, 7168), (4096, 7168, 16384), (4096, 7168, 2048), (4096, 24576, 1536)]
HEADER = "include/dgjit/gemm_sm90.cuh"
PATCHES = {
    "block-nocopy": [
        ("          cp_async_4(dst + 4 * r, scales.a", "          if (false) cp_async_4(dst + 4 * r, scales.a"),
        ("        if (lane < kMaxScaleBBlocks) {", "        if (false) {"),
    ],
    "block-nowarp": [
        ("mbarrier_init(smem.full(s), kScaling == Scaling::kBlock ? 1 + kScaleWarpArrivals : 1);",
         "mbarrier_init(smem.full(s), 1);"),
        ("        if (warp_idx_in_warpgroup() == 1) produce_scales(smem, scales, m, ga);", ""),
    ],
}


def patched_templates(root: Path, variant: str, src: Path) -> Path:
    dst = root / variant
    shutil.copytree(src, dst)
    header = dst / HEADER
    text = header.read_text()
    for old, new in PATCHES[variant]:
        if text.count(old) != 1:
            raise SystemExit(f"{variant}: patch anchor not found exactly once: {old!r}")
        text = text.replace(old, new)
    header.write_text(text)
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    import cupy

    import deepgemm_jit as dg
    from deepgemm_jit import config, render, timing
    from deepgemm_jit.spec import GemmSpec

    src = render.templates_dir()
    tmp = Path(tempfile.mkdtemp(prefix="dgjit-exp-"))
    dirs = {"tensor": None, "tensor-s5": None, "block": None}
    for variant in PATCHES:
        dirs[variant] = patched_templates(tmp, variant, src)
    rows = []
    for m, n, k in SHAPES:
        rng = cupy.random.default_rng(m + n + k)
        x = rng.standard_normal((m, k), dtype=cupy.float32)
        w = rng.standard_normal((n, k), dtype=cupy.float32)
        qa, sa = dg.quantize(x, "fp8", "group128")
        sa = cupy.ascontiguousarray(sa)  # row-major: the scale warp copies A's scales too (what the patches cut)
        qb, sb = dg.quantize(w, "fp8", "block128")
        qa_t, sa_t = dg.quantize(x, "fp8", "tensor")
        qb_t, sb_t = dg.quantize(w, "fp8", "tensor")
        out = cupy.empty((m, n), dtype=dg.dtypes.numpy_dtype("bf16"))
        fns = {}
        for variant, tdir in dirs.items():
            if tdir is None:
                os.environ.pop("DEEPGEMM_JIT_TEMPLATES_DIR", None)
            else:
                os.environ["DEEPGEMM_JIT_TEMPLATES_DIR"] = str(tdir)
            scaling = "tensor" if variant.startswith("tensor") else "block"
            spec = GemmSpec.create(n, k, dtype="fp8", scaling=scaling)
            cfg = config.sm90_config(spec, 128, 128, num_stages=5 if variant == "tensor-s5" else None)
            g = dg.build(m, n, k, dtype="fp8", scaling=scaling, config=cfg, weight_streaming=False)
            if scaling == "tensor":
                fns[variant] = (lambda g=g: g(qa_t, qb_t, scale_a=sa_t, scale_b=sb_t, out=out))
            else:
                fns[variant] = (lambda g=g: g(qa, qb, scale_a=sa, scale_b=sb, out=out))
        os.environ.pop("DEEPGEMM_JIT_TEMPLATES_DIR", None)
        t = timing.time_interleaved(fns, reps=args.reps, warmup=5)
        flops = 2.0 * m * n * k
        row = {"m": m, "n": n, "k": k, "config": "sm90_m128n128k128 (stages by smem)",
               **{name: {"us": r.median_us, "tflops": flops / r.median_us / 1e6} for name, r in t.items()}}
        rows.append(row)
        print(f"{m}x{n}x{k}: " + "  ".join(f"{name} {r.median_us:.1f} us {flops / r.median_us / 1e6:.0f} TF"
                                           for name, r in t.items()), flush=True)
    report.write_experiment_json(args.out, "exp-fp8-scale-path.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
