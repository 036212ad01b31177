"""Experiment (GPU): do FP8 block GEMMs run faster when neighbouring CTAs are placed on one GPC?

    python3 -m scripts.exp_cluster_placement [--problems fp8_block:MxNxK,...] [--grouped 4x8192x4096x7168]
                                             [--variants c1g132,c2g132,c2g128,c1g128,c1gbal] [--reps 30]
                                             [--out DIR]

Session 43's ncu runs tied the grouped kernels' speed to how many loads of CTAs in one GPC the L2 request
coalescer merges. The persistent walk gives CTA b the tiles b, b + grid, ... in an M-fastest raster, so CTAs 2c and
2c + 1 read the same B tile at the same time. Launched as clusters of two (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
no kernel change: the kernels use no cluster features), each such pair shares a GPC. Variant cCgG: clusters of C
CTAs, a grid of G CTAs (the walk takes any grid; a grid whose clusters do not all fit at once runs a second round,
which the times show); G "bal" (dense cases): the fewest CTAs that keep the walk's number of rounds. Every
variant's output is compared bit for bit with the plain launch before timing.
"""
from __future__ import annotations

import argparse
import ctypes
import sys

_CLUSTER_DIMENSION = 4  # CUlaunchAttributeID
_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_EXP = {"cluster": 1, "grid": None}  # what the patched launch uses, set by each timed callable


def _patch_launch() -> None:
    """LoadedKernel.launch with the programmatic configuration rebuilt per launch from _EXP (cluster dims, grid)."""
    from deepgemm_jit import runtime

    class Attr(ctypes.Structure):
        _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("x", ctypes.c_uint), ("y", ctypes.c_uint),
                    ("z", ctypes.c_uint), ("rest", ctypes.c_char * 52)]

    original = runtime.LoadedKernel.launch

    def launch(self, grid, block, args, stream, bound=None, programmatic=None):
        if _EXP["cluster"] == 1 and _EXP["grid"] is None:
            return original(self, grid, block, args, stream, bound, programmatic)
        if programmatic is None:
            raise RuntimeError("a variant needs the programmatic launch configuration (cuLaunchKernelEx)")
        attrs = (Attr * 2)()
        attrs[0].id, attrs[0].x = _PROGRAMMATIC_STREAM_SERIALIZATION, 1
        attrs[1].id, attrs[1].x, attrs[1].y, attrs[1].z = _CLUSTER_DIMENSION, _EXP["cluster"], 1, 1
        config = runtime._LaunchConfig.from_buffer_copy(bytes(programmatic.template))
        if _EXP["grid"] is not None:
            config.grid[0] = _EXP["grid"]
        config.stream = stream.ptr
        config.attrs = ctypes.cast(attrs, ctypes.POINTER(runtime._LaunchAttribute))
        config.num_attrs = 2 if _EXP["cluster"] > 1 else 1
        code = runtime._cu_launch_kernel_ex()(ctypes.byref(config), ctypes.c_void_p(self.function.ptr), args.params,
                                              None)
        if code != 0:
            raise runtime.LaunchError(code, tuple(config.grid), block)

    runtime.LoadedKernel.launch = launch


def _variant(text: str, tiles: int | None, num_sms: int = 132) -> tuple[int, int | None]:
    """cCgG -> (C, G); G "bal": the fewest CTAs that keep the walk's rounds, ceil(tiles / ceil(tiles / SMs))."""
    c, _, g = text[1:].partition("g")
    if g == "bal":
        if tiles is None:
            raise SystemExit(f"{text}: a balanced grid needs the dense case's tile count")
        return int(c), -(-tiles // -(-tiles // num_sms))
    return int(c), int(g) if g else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default="fp8_block:4096x4096x7168,fp8_block:4096x7168x16384,"
                                          "fp8_block:32768x4096x7168")
    ap.add_argument("--grouped", default="4x8192x4096x7168", help="GxMxNxK contiguous FP8 rows ('' for none)")
    ap.add_argument("--variants", default="c1g132,c2g132,c2g128,c1g128")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import deepgemm_jit as dg
    from bench import report, runner
    from deepgemm_jit import reference, timing

    _patch_launch()
    cases = []
    for problem in filter(None, args.problems.split(",")):
        p = runner.problem_inputs(problem)
        g = dg.build(p.m, p.n, p.k, **p.build_kwargs())
        out = reference.poisoned(p.spec.out_shape(p.m), p.spec.out_dtype)
        cfg = g.explain()["config"]
        tiles = -(-p.m // cfg["block_m"]) * -(-p.n // cfg["block_n"])
        cases.append((problem, lambda g=g, p=p, out=out: g(p.inputs.a, p.inputs.b, out=out, **p.kwargs), out, tiles))
    if args.grouped:
        groups, m, n, k = (int(v) for v in args.grouped.split("x"))
        gp = runner.grouped_fp8_inputs(groups, m, n, k, seed=m + n + k)
        gg = dg.build_grouped(n, k, dtype="fp8", expected_m=m, num_groups=groups)
        out = reference.poisoned((groups * m, n), "bf16")
        cases.append((f"grouped {args.grouped}",
                      lambda: gg(gp.qa, gp.qb, scale_a=gp.sa, scale_b=gp.sb, offs=gp.offs, out=out), out, None))
    rows = []
    for name, call, out, tiles in cases:
        fns = {}
        variants = {v: _variant(v, tiles) for v in args.variants.split(",")}
        for v, (cluster, grid) in variants.items():
            def run(call=call, cluster=cluster, grid=grid):
                _EXP["cluster"], _EXP["grid"] = cluster, grid
                try:
                    call()
                finally:
                    _EXP["cluster"], _EXP["grid"] = 1, None
            fns[v] = run
        same = runner.bitwise_equal_outputs(fns, out)
        t = timing.time_interleaved(fns, reps=args.reps, warmup=5)
        row = {"problem": name, "tiles": tiles, "grids": {v: g for v, (_, g) in variants.items()},
               "bitwise_equal": same,
               **{v: r.median_us for v, r in t.items()}}
        rows.append(row)
        print(f"{name}: tiles {tiles} grids {row['grids']} equal={all(same.values())} " + "  ".join(
            f"{v} {r.median_us:.1f} us" for v, r in t.items()),
              flush=True)
    header = report.collect_env(sys.argv[1:], {"variants": args.variants}, module="scripts.exp_cluster_placement")
    stamp = report.experiment_stamp(header)
    report.write_experiment_json(args.out, f"{stamp}-exp-cluster-placement.json", {"header": header, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
