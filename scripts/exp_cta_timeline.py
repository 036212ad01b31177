"""Experiment (GPU): when each CTA of a decode-size sm90 GEMM starts and finishes (%globaltimer, %smid), to see
whether its time is set by a tail of late CTAs (ncu, docs/analysis/ncu-tf32-m64-ours-vs-cublas-s16.md: our
slowest SM ran 7.3 us past the mean CTA at TF32 64x7168x16384, cuBLAS's 2.0 us).

    python3 -m scripts.exp_cta_timeline [--problems bf16:1x7168x16384,tf32:64x7168x16384@64x64s12] [--reps 8]
        [--out DIR]

A problem may force its tile with @BMxBN[sS] (bench's tile spelling; not fp32). FP8 / INT8 dtypes are the bench's
(quantized as the bench quantizes them).

The kernels come from an instrumented copy of templates/ (DEEPGEMM_JIT_TEMPLATES_DIR, made here in a temporary
folder: a __device__ array dgjit_cta_timeline gets each CTA's start after its barrier setup, its consumer's end
after the last TMA store, and its SM), so the library's own kernels are untouched. Each repetition flushes L2
first, as the bench does. Per problem: the spread of finish times over CTAs (max - median) per repetition, the
start skew, and whether the same SMs are late in every repetition.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench import report


PROBLEMS = "bf16:1x7168x16384,bf16:64x7168x16384,tf32:64x7168x16384,fp32:64x7168x16384"
MAX_CTAS = 1024
_DECL = ('extern "C" { __device__ unsigned long long dgjit_cta_timeline[4 * %d]; }\n'
         "__device__ __forceinline__ unsigned long long dgjit_now() {\n"
         '  unsigned long long t; asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t)); return t;\n}\n' % MAX_CTAS)
_START_ANCHOR = "\n    if (wg == kProducerWG) {\n"  # run(): after the barriers' setup and the CTA (cluster) sync
_START = ("\n    if (threadIdx.x == 0 && blockIdx.x < %d) {\n"
          "      unsigned int sm; asm volatile(\"mov.u32 %%0, %%%%smid;\" : \"=r\"(sm));\n"
          "      dgjit_cta_timeline[4 * blockIdx.x] = dgjit_now(); dgjit_cta_timeline[4 * blockIdx.x + 2] = sm;\n"
          "    }\n    if (wg == kProducerWG) {\n" % MAX_CTAS)
_END_ANCHOR = "    if (threadIdx.x % kWarpgroupThreads == 0) tma_store_wait_all<0>();\n  }"
_END = ("    if (threadIdx.x % kWarpgroupThreads == 0) tma_store_wait_all<0>();\n"
        "    if (threadIdx.x == 0 && blockIdx.x < " + str(MAX_CTAS) + ") "
        "dgjit_cta_timeline[4 * blockIdx.x + 1] = dgjit_now();\n  }")


def instrumented_templates(src: Path) -> Path:
    """A copy of `src` (templates/) whose sm90 kernel records the CTA timeline; ValueError if an anchor moved."""
    dst = Path(tempfile.mkdtemp(prefix="dgjit-timeline-")) / "templates"
    shutil.copytree(src, dst)
    header = dst / "include" / "dgjit" / "gemm_sm90.cuh"
    text = header.read_text()
    for anchor in (_START_ANCHOR, _END_ANCHOR, "namespace dgjit {"):
        if anchor not in text:
            raise ValueError(f"anchor not found in gemm_sm90.cuh: {anchor!r}")
    text = text.replace("namespace dgjit {", _DECL + "namespace dgjit {", 1)
    text = text.replace(_START_ANCHOR, _START, 1).replace(_END_ANCHOR, _END, 1)
    header.write_text(text)
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=PROBLEMS, help="comma list of dtype:MxNxK[@TILE] (fp32 or a bench dtype: bf16, tf32, fp8_block, ...)")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    os.environ["DEEPGEMM_JIT_TEMPLATES_DIR"] = str(instrumented_templates(Path(__file__).parent.parent / "templates"))
    import cupy
    import numpy as np

    import deepgemm_jit as dg
    from bench import dtypes as bench_dtypes
    from bench import runner, suites
    from deepgemm_jit import reference, runtime, timing

    flush = timing.L2Flusher()
    results = []
    for item in args.problems.split(","):
        dtype, shape = item.split(":")
        shape, _, tile = shape.partition("@")
        m, n, k = (int(v) for v in shape.split("x"))
        rng = cupy.random.default_rng(m + n + k)
        kwargs = {}
        if dtype == "fp32":
            g = dg.build_fp32(m, n, k)
        else:  # a bench dtype (bf16, tf32, fp8_block, ...), quantized as the bench does
            info = bench_dtypes.get(dtype)
            spec = dg.GemmSpec.create(n, k, dtype=info.lib, scaling=info.scaling)
            forced = dict(config=suites.forced_tile_config(spec, tile), weight_streaming=False) if tile else {}
            g = dg.build(m, n, k, dtype=info.lib, scaling=info.scaling, **forced)
        gemm = g.gemm if dtype == "fp32" else g
        if dtype in ("fp32", "tf32") or not bench_dtypes.get(dtype).is_quantized:
            store = "fp32" if dtype in ("fp32", "tf32") else dtype
            a = reference.random_matrix((m, k), store, rng)
            b = reference.random_matrix((n, k), store, rng)
        else:
            ops = runner.operands(bench_dtypes.get(dtype), gemm.spec, m, rng)
            a, b, kwargs = ops.a, ops.b, ops.call_kwargs()
        out = reference.poisoned((m, n), g.spec.out_dtype)
        g(a, b, out=out, **kwargs)
        cupy.cuda.Device().synchronize()
        kernels = [kern for (key, _), kern in runtime._loaded.items() if key == gemm.artifact.key]
        if not kernels:
            print(f"{item}: the call did not run {gemm.config.tag} (another kernel served it), skipped", flush=True)
            continue
        ptr = kernels[0].module.get_global_var("dgjit_cta_timeline")  # the device address (CuPy returns no size)
        mem = cupy.cuda.UnownedMemory(ptr, 4 * MAX_CTAS * 8, kernels[0].module)
        timeline = cupy.ndarray((MAX_CTAS, 4), dtype=cupy.uint64, memptr=cupy.cuda.MemoryPointer(mem, 0))
        reps = []
        for _ in range(args.reps):
            timeline.fill(0)
            flush()
            g(a, b, out=out, **kwargs)
            cupy.cuda.Device().synchronize()
            t = cupy.asnumpy(timeline)
            used = t[:, 0] > 0
            start, end, sm = t[used, 0].astype(np.int64), t[used, 1].astype(np.int64), t[used, 2].astype(np.int64)
            t0 = start.min()
            finish = (end - t0) / 1e3
            reps.append({"ctas": int(used.sum()), "span_us": float(finish.max()),
                         "finish_median_us": float(np.median(finish)), "finish_p10_us": float(np.percentile(finish, 10)),
                         "finish_p90_us": float(np.percentile(finish, 90)),
                         "start_skew_us": float((start.max() - t0) / 1e3),
                         "late_sms": [int(s) for s in sm[np.argsort(-finish)[:8]]],
                         "finish_us_by_sm": {int(s): float(f) for s, f in zip(sm, finish)},
                         # by blockIdx.x, of the CTAs that ran (the scheduler maps them to tiles and shares)
                         "start_us_by_cta": [round(float(v), 2) for v in (start - t0) / 1e3],
                         "finish_us_by_cta": [round(float(v), 2) for v in finish]})
        late_sets = [set(r["late_sms"]) for r in reps]
        common = set.intersection(*late_sets) if late_sets else set()
        row = {"problem": item, "config": gemm.config.tag, "reps": reps, "late_in_every_rep": sorted(common)}
        results.append(row)
        spans = [r["span_us"] for r in reps]
        tails = [r["span_us"] - r["finish_median_us"] for r in reps]
        print(f"{item} {gemm.config.tag} ctas={reps[0]['ctas']}: span {np.median(spans):.1f} us (min {min(spans):.1f}),"
              f" finish median {np.median([r['finish_median_us'] for r in reps]):.1f}, p10 "
              f"{np.median([r['finish_p10_us'] for r in reps]):.1f}, p90 {np.median([r['finish_p90_us'] for r in reps]):.1f}"
              f", tail (max - median) {np.median(tails):.1f} us, start skew "
              f"{np.median([r['start_skew_us'] for r in reps]):.1f} us; late SMs in every rep: {sorted(common)}",
              flush=True)
    report.write_experiment_json(args.out, "exp-cta-timeline.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
