"""Experiment (GPU): the row-sweep decode kernel (gemv_rows.py) against what the same call ran before it (the
mma.sync weight-streaming kernel or the Hopper tiles) and cuBLAS, in one interleaved run per row.

    python3 -m scripts.exp_gemv_rows [--ms 1,2] [--dtypes bf16,fp8_block] [--nk 7168x16384,...] [--splits 256x4,512x2]
                                     [--reps 30] [--out DIR]

"auto" is build()'s Gemm; "before" the same with the row sweep's rule off (gemv_rows.DISPATCH_MAX_M = 0); at M = 2
"rows" with the rule raised to 2 (the kernel's two-token form, FP8 too: FP8_MAX_M); each --splits TxC a contender
"rTxC": the row sweep with T threads x C words per thread instead of the rule's (the row must fit: T x C 16-byte
words >= one row).
Outputs are checked against a float64 reference before timing (bench protocol: L2 flushed, medians).
Default shapes: the decode suite's and the models suite's.
"""
from __future__ import annotations

import argparse
import contextlib
import sys

from bench import report


class Patched:
    """A Gemm built, planned and called with attributes of gemv_rows replaced (each contender its own Gemm, so
    launch plans made under one setting are replayed under it)."""

    def __init__(self, build, **attrs):
        self.attrs = attrs
        with self._patched():
            self.gemm = build()
        self.spec = self.gemm.spec

    @contextlib.contextmanager
    def _patched(self):
        from deepgemm_jit import gemv_rows

        saved = {name: getattr(gemv_rows, name) for name in self.attrs}
        for name, value in self.attrs.items():
            setattr(gemv_rows, name, value)
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(gemv_rows, name, value)

    def __call__(self, *args, **kwargs):
        with self._patched():
            return self.gemm(*args, **kwargs)


def main() -> int:
    from bench import suites

    decode_nk = ((7168, 16384), (2112, 7168), (4096, 7168), (7168, 2048), (24576, 1536), (32768, 512))
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,2")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--nk", default=",".join(f"{n}x{k}" for n, k in decode_nk + suites._MODELS_NK))
    ap.add_argument("--splits", default="", help="THREADSxCHUNKS,... forced row-sweep launch shapes")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import deepgemm_jit as dg
    from bench import dtypes as bench_dtypes
    from bench import runner
    from deepgemm_jit import dtypes, gemv, gemv_rows, reference
    from deepgemm_jit.spec import GemmSpec

    rows = []
    for name in args.dtypes.split(","):
        info = bench_dtypes.get(name)
        for nk in args.nk.split(","):
            n, k = (int(v) for v in nk.split("x"))
            spec = GemmSpec.create(n, k, dtype=info.lib, scaling=info.scaling)
            esize = dtypes.get(spec.b_dtype).storage_bytes
            for m in (int(v) for v in args.ms.split(",")):
                def build(m=m, n=n, k=k):
                    return dg.build(m, n, k, dtype=info.lib, scaling=info.scaling)
                contenders = {"auto": build(), "before": Patched(build, DISPATCH_MAX_M=0)}
                if m == 2:
                    contenders["rows"] = Patched(build, DISPATCH_MAX_M=2, FP8_MAX_M=2)
                for split in (s for s in args.splits.split(",") if s):
                    threads, chunks = (int(v) for v in split.split("x"))
                    fits = threads <= gemv_rows.THREADS_PER_SM[m] and chunks <= gemv_rows.CHUNKS[esize]
                    if fits and threads * chunks >= gemv_rows.row_words(spec):
                        contenders[f"r{split}"] = Patched(build, DISPATCH_MAX_M=m, FP8_MAX_M=m, CHUNKS={esize: chunks},
                                                          threads_for=lambda _words, _e, t=threads: t)
                _, errors, us = runner.time_checked(contenders, info, spec, m, args.reps)
                kernel = (gemv.kernel_for(spec, m).tag if m <= gemv.max_m(spec, "sm_90a")
                          else contenders["auto"].config.tag)
                row = {"dtype": name, "m": m, "n": n, "k": k, "us": us, "kernel": kernel,
                       "max_err": max(errors.values()),
                       "correct": all(reference.within_bound(e, info.lib) for e in errors.values()),
                       "tb_s": n * k * esize / us["auto"] / 1e6}
                rows.append(row)
                print(f"{name} {m}x{n}x{k} ok={row['correct']} auto {us['auto']:.2f} ({kernel}, {row['tb_s']:.2f} "
                      f"TB/s)" + "".join(f" {key} {v:.2f}" for key, v in us.items() if key != "auto"), flush=True)
    report.write_experiment_json(args.out, "exp-gemv-rows.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
