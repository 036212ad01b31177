"""Experiment (GPU): sm90 GEMM launches made programmatically (programmatic dependent launch: the launch is processed
while the previous kernel on the stream still runs; the kernel waits for it, griddep_wait, before touching memory)
against ordinary launches and cuBLAS, two ways in one run:

- "flushed": the bench protocol (timing.time_interleaved: L2 flushed before each call, events around it);
- "chain": CHAIN calls back to back (the same operands, no flush, one event pair around them), per call: what a
  model running GEMMs one after another sees; contenders alternate per rep, and the host time per call is kept
  (a chain of calls shorter on the GPU than on the host measures the host);
- "graph": the same chain captured in one CUDA graph and replayed (ours only): no host in the way.

    python3 -m scripts.exp_pdl [--dtypes bf16,fp8_block] [--shapes 64x7168x2048,...] [--chain 20]
                               [--tree NAME=DIR ...] [--out DIR]

"off" / "on" are two Gemms of the same spec and kernels (the decode kernel too, gemv.py, at M <= 16) whose plans are
made with launch.PROGRAMMATIC_GEMMS off / on (checked against a float64 reference first). Each --tree NAME=DIR
(a copy of templates/, e.g. with griddepcontrol.launch_dependents placed somewhere) adds a contender NAME: the same
spec and tile built from that tree's kernels, launched programmatically.
"""
from __future__ import annotations

import argparse
import sys

from bench import report, runner

SHAPES = ("32x2112x7168", "64x7168x2048", "128x4096x7168", "64x32768x512", "128x7168x16384", "4096x7168x2048",
          "4096x4096x7168")


class Flagged:
    """A Gemm called with launch.PROGRAMMATIC_GEMMS set to `on` (its plans, made on its first call, keep it)."""

    def __init__(self, gemm, on: bool, tdir: str | None = None):
        self.gemm, self.on, self.spec, self.tdir = gemm, on, gemm.spec, tdir

    def __call__(self, *args, **kwargs):
        from deepgemm_jit import launch

        saved, launch.PROGRAMMATIC_GEMMS = launch.PROGRAMMATIC_GEMMS, self.on
        tdir, self.tdir = self.tdir, None
        try:
            if tdir:  # the first call (the plan, and any kernel it loads) with that tree's templates
                with runner.templates_tree(tdir):
                    return self.gemm(*args, **kwargs)
            return self.gemm(*args, **kwargs)
        finally:
            launch.PROGRAMMATIC_GEMMS = saved


def chain_us(fns: dict, calls: int, reps: int) -> tuple[dict, dict]:
    """Per contender: the median over `reps` of `calls` back-to-back calls' GPU time, per call, and the host time
    per call (us). Contenders alternate per rep (order reversed every other rep) so that clock and power drift
    fall on all alike."""
    import time

    import cupy
    import numpy as np

    gpu, host = {n: [] for n in fns}, {n: [] for n in fns}
    names = list(fns)
    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            fn = fns[name]
            cupy.cuda.Device().synchronize()
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            host[name].append((time.perf_counter() - t0) * 1e6 / calls)
            end.record()
            end.synchronize()
            gpu[name].append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / calls)
    return ({n: float(np.median(v)) for n, v in gpu.items()}, {n: float(np.median(v)) for n, v in host.items()})


def graph_us(fns: dict, calls: int, reps: int) -> dict:
    """Per contender: `calls` calls captured in one CUDA graph on a side stream, the graph's replay time per call
    (median over `reps`, contenders alternating): chains without the host in the way."""
    import cupy
    import numpy as np

    stream = cupy.cuda.Stream(non_blocking=True)
    graphs = {}
    with stream:
        for name, fn in fns.items():
            fn()  # the plan for this stream, made outside the capture
            stream.synchronize()
            stream.begin_capture()
            for _ in range(calls):
                fn()
            graphs[name] = stream.end_capture()
        for graph in graphs.values():  # uploaded and warm
            graph.launch(stream)
        stream.synchronize()
        times = {n: [] for n in graphs}
        names = list(graphs)
        for rep in range(reps):
            for name in (names if rep % 2 == 0 else names[::-1]):
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record(stream)
                graphs[name].launch(stream)
                end.record(stream)
                end.synchronize()
                times[name].append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / calls)
    return {n: float(np.median(v)) for n, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="bf16,fp8_block")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--chain", type=int, default=20)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--tree", action="append", default=[], help="NAME=DIR of a templates/ copy (launched on)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    trees = [t.split("=", 1) for t in args.tree]
    import deepgemm_jit as dg
    from bench import dtypes as bench_dtypes
    from deepgemm_jit import reference
    from deepgemm_jit.spec import GemmSpec

    rows = []
    for dname in args.dtypes.split(","):
        info = bench_dtypes.get(dname)
        for shape in args.shapes.split(","):
            m, n, k = (int(v) for v in shape.split("x"))
            build_kw = {"scaling": info.scaling} if info.scaling else {}
            g_off = dg.build(m, n, k, dtype=info.lib, **build_kw)
            g_on = dg.build(m, n, k, dtype=info.lib, config=g_off.config,
                            weight_streaming=bool(g_off.weight_streaming_max_m), **build_kw)
            contenders = {"off": Flagged(g_off, False), "on": Flagged(g_on, True)}
            for name, tdir in trees:
                with runner.templates_tree(tdir):
                    contenders[name] = Flagged(dg.build(m, n, k, dtype=info.lib, config=g_off.config,
                                                        weight_streaming=bool(g_off.weight_streaming_max_m),
                                                        **build_kw), True, tdir)
            spec = GemmSpec.create(n, k, dtype=info.lib, **build_kw)
            fns, errors, flushed = runner.time_checked(contenders, info, spec, m, args.reps)
            chain, chain_host = chain_us(fns, args.chain, max(5, args.reps // 3))
            graph = graph_us({n: f for n, f in fns.items() if n != "cublas"}, args.chain, max(5, args.reps // 3))
            row = {"dtype": dname, "m": m, "n": n, "k": k, "tile": g_off.config.tag, "flushed_us": flushed,
                   "chain_us": chain, "chain_host_us": chain_host, "graph_us": graph, "max_err": max(errors.values()),
                   "correct": all(reference.within_bound(e, spec.dtype) for e in errors.values())}
            rows.append(row)
            print(f"{dname} {m}x{n}x{k} ok={row['correct']} {row['tile']} flushed off {flushed['off']:.1f} on "
                  f"{flushed['on']:.1f} cublas {flushed.get('cublas', float('nan')):.1f} | chain off "
                  f"{chain['off']:.1f} on {chain['on']:.1f} cublas {chain.get('cublas', float('nan')):.1f} (host "
                  f"{chain_host['off']:.1f} / {chain_host['on']:.1f} / {chain_host.get('cublas', float('nan')):.1f})"
                  f" | graph off {graph['off']:.2f} on {graph['on']:.2f}"
                  + "".join(f" {name} {graph[name]:.2f}" for name, _ in trees), flush=True)
    report.write_experiment_json(args.out, "exp-pdl.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
