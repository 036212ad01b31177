"""GPU probe for the 8-bit kernels: tile sweep of ours against torch's FP8 / INT8 matmuls, same process.

Quick-look tool for kernel work (the benchmark of record is `python -m bench`): for each M = 4096 DeepSeek
shape and recipe, time the heuristic's tile and a few alternatives against torch, interleaved with L2 flushes,
and check every contender against the float64 product of the dequantized operands first.

    python scripts/probe_lowp.py --recipes tensor,block,int8 --tiles auto,128x128,128x176 > $OUT/probe.txt
Writes JSON rows to --json when given.
"""
from __future__ import annotations

import argparse
import json
import sys

import cupy

import deepgemm_jit as dg
from deepgemm_jit import config, reference, timing
from deepgemm_jit.quantization import WEIGHT_GRANULARITY, recipe_granularities

SHAPES = [(4096, 2112, 7168), (4096, 24576, 1536), (4096, 32768, 512), (4096, 7168, 16384), (4096, 4096, 7168),
          (4096, 7168, 2048)]


def torch_baseline(recipe, qa, sa, qb, sb):
    import torch

    ta, tb = torch.from_dlpack(qa), torch.from_dlpack(qb)
    if recipe == "int8":
        return lambda: torch._int_mm(ta, tb.t())
    ta, tb = ta.view(torch.float8_e4m3fn), tb.view(torch.float8_e4m3fn)
    tsa, tsb = torch.from_dlpack(sa), torch.from_dlpack(sb)
    if recipe == "tensor":
        return lambda: torch._scaled_mm(ta, tb.t(), scale_a=tsa.reshape(()), scale_b=tsb.reshape(()),
                                        out_dtype=torch.bfloat16)
    if recipe == "row":
        sa2, sb2 = tsa.reshape(-1, 1).contiguous(), tsb.reshape(1, -1).contiguous()
        return lambda: torch._scaled_mm(ta, tb.t(), scale_a=sa2, scale_b=sb2, out_dtype=torch.bfloat16)
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", default="tensor,block,int8")
    ap.add_argument("--tiles", default="auto,128x128,128x176,128x144")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--fast-accum", action="store_true")
    args = ap.parse_args()
    rows = []
    flush = timing.L2Flusher()
    rng = cupy.random.default_rng(0)
    for m, n, k in SHAPES:
        x = rng.standard_normal((m, k), dtype=cupy.float32)
        w = rng.standard_normal((n, k), dtype=cupy.float32)
        for recipe in args.recipes.split(","):
            dtype = "int8" if recipe == "int8" else "fp8_e4m3"
            scaling = "none" if recipe == "int8" else recipe
            ga, gb = recipe_granularities(recipe) if recipe in WEIGHT_GRANULARITY else ("tensor", "tensor")
            qa, sa = reference.quantize_reference(x, dtype, ga)
            qb, sb = reference.quantize_reference(w, dtype, gb)
            if recipe == "int8":
                ref = qa.astype(cupy.float64) @ qb.astype(cupy.float64).T
                call_kw = {}
            else:
                ref = (reference.dequantize_reference(qa, sa, dtype, ga)
                       @ reference.dequantize_reference(qb, sb, dtype, gb).T)
                # Block: scale_a M-major as quantize (and its reference) returns it, the bulk-copied layout.
                call_kw = dict(scale_a=sa, scale_b=sb)
            fns, tags = {}, {}
            for tile in args.tiles.split(","):
                kw = dict(dtype=dtype, scaling=scaling, fast_accum=args.fast_accum and recipe in ("tensor", "row"))
                if tile == "auto":
                    g = dg.build(m, n, k, **kw)
                else:
                    bm, bn = (int(v) for v in tile.split("x"))
                    spec = dg.GemmSpec.create(n, k, **kw)
                    try:
                        cfg = config.sm90_config(spec, bm, bn)
                        cfg.check_for(spec, "sm_90a")
                    except ValueError as exc:
                        print(f"skip {tile}: {exc}", file=sys.stderr)
                        continue
                    g = dg.build(m, n, k, config=cfg, **kw)
                out = cupy.empty((m, n), dtype=dg.dtypes.numpy_dtype(g.spec.out_dtype))
                out.fill(0)
                g(qa, qb, out=out, **call_kw)
                err = reference.error(out.astype(cupy.float64) if recipe == "int8" else out, ref)
                name = f"ours:{tile}"
                tags[name] = (g.config.tag, err)
                fns[name] = (lambda g=g, out=out: g(qa, qb, out=out, **call_kw))
            base = torch_baseline(recipe, qa, sa, qb, sb)
            if base is not None:
                fns["torch"] = base
            t = timing.time_interleaved(fns, reps=args.reps, flush=flush)
            base_us = t["torch"].median_us if "torch" in t else None
            for name, tm in t.items():
                tflops = 2 * m * n * k / tm.median_us / 1e6
                ratio = base_us / tm.median_us if base_us and name != "torch" else None
                tag, err = tags.get(name, ("", None))
                row = dict(recipe=recipe, m=m, n=n, k=k, name=name, tag=tag, us=tm.median_us, tflops=tflops,
                           ratio=ratio, err=err)
                rows.append(row)
                print(f"{recipe:6s} {m}x{n}x{k} {name:14s} {tag:28s} {tm.median_us:9.1f} us {tflops:7.1f} TF "
                      f"ratio={'' if ratio is None else f'{ratio:.3f}'} err={'' if err is None else f'{err:.1e}'}",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
