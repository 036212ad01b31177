"""Experiment (GPU): one GEMM kernel under Nsight Compute, to see where its warps stall.

Run as the target of ncu (scripts/profile_ncu.sh does it for every variant and exports the pages):

  ncu --kernel-name regex:dgjit_gemm --launch-skip 2 --launch-count 1 --set full \
      python3 -m scripts.profile_ncu --variant fp8-block

The script builds one variant, launches it `--launches` times (the first ones are warm-up that ncu skips) and
checks nothing: correctness lives in the GPU tests. Variants (4096 x N x K, default 4096x7168x16384):

  fp8-block       scaling="block" with M-major scale_a (as dg.quantize returns it): A scales bulk-copied by the
                  TMA thread, B scales by the scale warp (docs/experiments/sm90-fp8-bulk-a-scales.md)
  fp8-block-warp  the same kernel and scales with DEEPGEMM_JIT_NO_BULK_SCALES=1: A scales by the scale warp too
  fp8-block-grouped  the contiguous grouped kernel (build_grouped): --groups groups of M rows each (offs), B
                  (G, N, K), block scales as fp8-block's
  fp8-tensor      scaling="tensor", promoted: the same main loop without per-block scales
  fp8-row         scaling="row", promoted: per-tensor's main loop, row and column scales in the epilogue
  fp8-tensor-fast scaling="tensor", fast_accum=True: no promotion at all
  bf16            the 16-bit kernel
  tf32            the TF32 kernel (FP32 inputs)

A "gemv-" prefix (e.g. gemv-fp8-tensor with --shape 1x24576x1536) profiles the weight-streaming kernel that build()
dispatches calls of M <= 8 (16) to, instead of the tile kernel. A variant takes the heuristic's tile, or a forced
one as NAME@BMxBN (e.g. fp8-block@128x128, or any bench --tiles spelling: tf32@128x256s4r2), and a fused
epilogue as NAME:EPILOGUE (e.g. bf16:bias+gelu@128x128; a bias is a random vector, a residual a random (M, N)
tensor; epilogues that need C are not supported here). Ping-pong tiles: @BMxBNpp.

tf32-promoted is the TF32 GEMM of dtype fp32 (3xTF32, K three times the fp32 K). cublas-bf16 / cublas-tf32 profile
cuBLAS's kernel for the same shape (torch.mm, nt, TF32 allowed for cublas-tf32) to set beside ours.

--layout nn (or tn, tt) stores the operands that way (default nt); with a gemv- variant and nn / tn, that is the
(K, N) weight-streaming kernel (gemv_kn.py), 16-bit weights included (gemv_kn.STREAM_DTYPES is widened here).

Usage: python3 -m scripts.profile_ncu --variant NAME[:EPILOGUE][@BMxBN[pp]] [--shape MxNxK] [--layout nt]
       [--launches N]
"""
from __future__ import annotations

import argparse
import os
import sys

VARIANTS = ("fp8-block", "fp8-block-warp", "fp8-block-grouped", "fp8-tensor", "fp8-row", "fp8-tensor-fast", "bf16",
            "tf32", "tf32-promoted")


def build_call(variant: str, m: int, n: int, k: int, layout: str = "nt", groups: int = 4):
    """Return (zero-argument launch, Gemm) for `variant`; inputs are random, quantized once, stored as `layout`
    says (16-bit and TF32 variants; 8-bit ones take nt only)."""
    import cupy
    if variant.partition("@")[0] == "fp8-block-grouped":  # @TILE (bench --tiles syntax) forces the grouped tile
        return _grouped_call(m, n, k, groups, variant.partition("@")[2])

    import deepgemm_jit as dg
    from deepgemm_jit import config, gemv_kn, reference
    from deepgemm_jit.quantization import recipe_granularities
    from deepgemm_jit.spec import GemmSpec

    rng = cupy.random.default_rng(m + n + k)
    x = rng.standard_normal((m, k), dtype=cupy.float32)
    w = rng.standard_normal((n, k), dtype=cupy.float32)
    name, _, tile = variant.partition("@")
    name, _, epilogue = name.partition(":")
    streaming = name.startswith("gemv-")
    name = name.removeprefix("gemv-")
    if name.startswith("cublas-"):
        if layout != "nt":
            raise SystemExit("--layout: cublas- variants profile nt only")
        return _cublas_call(name.removeprefix("cublas-"), x, w), None
    if name not in VARIANTS:
        raise SystemExit(f"--variant: {name!r} is not one of {VARIANTS}")
    if layout != "nt" and name not in ("bf16", "tf32"):
        raise SystemExit(f"--layout {layout}: only the bf16 and tf32 variants take another layout")
    if streaming:  # profile the kernel a 16-bit (K, N) weight would stream through, though build() does not pick it
        gemv_kn.STREAM_DTYPES = gemv_kn.WEIGHT_DTYPES
    if name == "fp8-block-warp":  # read when the first call makes its launch plan
        os.environ["DEEPGEMM_JIT_NO_BULK_SCALES"] = "1"
        name = "fp8-block"
    if name in ("bf16", "tf32"):
        kwargs = {"dtype": name, "layout": layout}
    elif name == "tf32-promoted":  # the TF32 GEMM inside dtype fp32 (3xTF32): pass K as 3 x the fp32 K
        kwargs = {"dtype": "tf32", "promoted": True}
    else:
        kwargs = {"dtype": "fp8", "scaling": {"fp8-block": "block", "fp8-row": "row"}.get(name, "tensor"),
                  "fast_accum": name == "fp8-tensor-fast"}
    if epilogue:
        kwargs["epilogue"] = epilogue
    if tile:
        spec_kwargs = {key: kwargs[key] for key in ("dtype", "layout", "scaling", "fast_accum", "epilogue", "promoted")
                       if key in kwargs}
        spec = GemmSpec.create(n, k, **spec_kwargs)
        if tile.endswith("pp"):
            bm, bn = (int(v) for v in tile.removesuffix("pp").split("x"))
            kwargs["config"] = config.sm90_config(spec, bm, bn, pingpong=True)
        else:  # bench --tiles syntax: BMxBN[sS][p][rR]
            from bench.suites import forced_tile_config
            kwargs["config"] = forced_tile_config(spec, tile)
    g = dg.build(m, n, k, weight_streaming=streaming, **kwargs)
    out = cupy.empty((m, n), dtype=dg.dtypes.numpy_dtype(g.spec.out_dtype))
    epi_ops = {}
    if g.spec.epi.bias != "none":
        vec = rng.standard_normal((n if g.spec.epi.bias == "col" else m,), dtype=cupy.float32)
        epi_ops["bias"] = reference._to_storage(vec, g.spec.out_dtype)
    if g.spec.epi.residual:  # an (M, N) tensor of D's dtype
        epi_ops["residual"] = reference._to_storage(rng.standard_normal((m, n), dtype=cupy.float32), g.spec.out_dtype)
    if name in ("bf16", "tf32", "tf32-promoted"):
        a = x.astype(dg.dtypes.numpy_dtype(g.spec.dtype))
        b = w.astype(dg.dtypes.numpy_dtype(g.spec.dtype))
        # Stored as the layout says: the first letter A's (t: a is (K, M)), the second B's (n: b is (K, N)).
        a = cupy.ascontiguousarray(a.T) if layout[0] == "t" else a
        b = cupy.ascontiguousarray(b.T) if layout[1] == "n" else b
        return (lambda: g(a, b, out=out, **epi_ops)), g
    granularity = recipe_granularities(kwargs["scaling"])
    qa, sa = dg.quantize(x, "fp8", granularity[0])
    qb, sb = dg.quantize(w, "fp8", granularity[1])  # block: scale_a M-major, the bulk-copied layout
    return (lambda: g(qa, qb, scale_a=sa, scale_b=sb, out=out, **epi_ops)), g


def _grouped_call(m: int, n: int, k: int, groups: int, tile: str = ""):
    """Zero-argument launch of the contiguous grouped FP8 block kernel: `groups` groups of m rows (offs), and its
    GroupedGemm (the heuristic's tile, or `tile` in bench --tiles syntax, e.g. 128x128 or 128x128k)."""
    import cupy

    import deepgemm_jit as dg
    from bench.runner import grouped_fp8_inputs

    p = grouped_fp8_inputs(groups, m, n, k, seed=m + n + k + groups)
    out = cupy.empty((groups * m, n), dtype=dg.dtypes.numpy_dtype("bf16"))
    forced = None
    if tile:
        from bench.suites import forced_tile_config
        forced = forced_tile_config(dg.grouped.grouped_spec(n, k, "fp8"), tile)
    g = dg.build_grouped(n, k, dtype="fp8", expected_m=m, num_groups=groups, config=forced)
    return (lambda: g(p.qa, p.qb, scale_a=p.sa, scale_b=p.sb, offs=p.offs, out=out)), g


def _cublas_call(dtype: str, x, w):
    """Zero-argument torch.mm(A, B^T) on torch copies of x and w in `dtype` (bf16, or tf32: FP32 with TF32 allowed)."""
    import torch

    from deepgemm_jit import baseline

    if dtype not in ("bf16", "tf32"):
        raise SystemExit(f"--variant cublas-{dtype}: cublas-bf16 or cublas-tf32")
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    a = torch.as_tensor(x, device="cuda").to(tdtype)
    b = torch.as_tensor(w, device="cuda").to(tdtype)

    def call():
        with baseline.torch_fp32_mode(torch, True if dtype == "tf32" else None):
            torch.mm(a, b.T)
    return call


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", required=True)
    ap.add_argument("--shape", default="4096x7168x16384")
    ap.add_argument("--layout", default="nt", choices=("nt", "nn", "tn", "tt"))
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--groups", type=int, default=4, help="fp8-block-grouped: groups of M rows each")
    args = ap.parse_args()
    import cupy

    m, n, k = (int(v) for v in args.shape.split("x"))
    call, g = build_call(args.variant, m, n, k, args.layout, args.groups)
    for _ in range(args.launches):
        call()
    cupy.cuda.get_current_stream().synchronize()
    if g is None:  # cuBLAS
        import torch
        torch.cuda.synchronize()
        print(f"{args.variant} {m}x{n}x{k}: torch.mm", flush=True)
        return 0
    info = g.explain()
    # gemv-* variants: the call ran the weight-streaming kernel (its tag, warps_k and grid), not the tile config.
    streaming = info.get("weight_streaming") or {}  # grouped GEMMs have none
    what = streaming if m <= streaming.get("max_m", 0) else info["config"]
    print(f"{args.variant} {m}x{n}x{k}: {what}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
