"""Fused FP8 group quantization against the unfused pair (issue 5's second bar).

    python -m bench.quant_epilogue [--dtype bf16,fp8_block] [--m 64,128,4096]
                                   [--epilogue quant_fp8_g128,bias+gelu+quant_fp8_g128]
                                   [--reps 30] [--out bench/results] [--list]

For each DeepSeek (N, K) of ``suites._DEEPSEEK_NK``, each M and each epilogue ending in ``quant_fp8_g128``:

- fused: one GEMM (``--dtype``: BF16, or FP8 E4M3 with 1x128 x 128x128 block scales, the GEMMs of an FP8
  model whose next layer takes this output) whose epilogue writes E4M3 q and its 1x128 group scales
  (``build(..., epilogue=E)``);
- unfused: the same GEMM with the epilogue minus the quantization, writing BF16 D, then
  ``deepgemm_jit.quantize(D, "fp8", "group128")`` (what a user runs without the fused epilogue).

Both start from the same fresh random operands (never zeros). Both results are checked first against float64:
the reference is the float64 product of the (dequantized) operands through the epilogue's float64 unfused
operations, quantized as the kernel quantizes its FP32 values (``reference.quantized_epilogue_reference``). The
fused scales must match the reference's within the GEMM dtype's bound, and both dequantized results (the pair's D
rounded to BF16 before the standalone quantization) the float64 values within the FP8 bound; the largest q
distance in FP8 ulps is recorded. Only
a checked row is timed, with ``timing.time_interleaved`` (L2 flushed, interleaved, medians), into outputs poisoned
before timing and compared bit for bit with the checked results afterwards. ratio = unfused µs / fused µs (> 1:
fusing pays); the bar is ratio >= 1.3 at M <= 128 and >= 1.1 at M = 4096. The GEMM and the quantize of the pair
are also timed alone: ceiling = unfused / GEMM is the ratio a fused kernel as fast as the plain GEMM would reach.
The JSON carries the run's header (``report.collect_env``: GPU, versions, commit).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from . import report
from .suites import _DEEPSEEK_NK

DEFAULT_M = (64, 128, 4096)
DEFAULT_EPILOGUES = ("quant_fp8_g128", "bias+gelu+quant_fp8_g128")
GEMM_DTYPES = {"bf16": {"dtype": "bf16"}, "fp8_block": {"dtype": "fp8", "scaling": "block"}}  # --dtype -> build()
QUANT_WORD = "quant_fp8_g128"


def cases(ms, epilogues, gemm_dtypes=("bf16",)) -> list[tuple[int, int, int, str, str]]:
    """(M, N, K, epilogue, GEMM dtype) rows, in run order."""
    for epilogue in epilogues:
        if QUANT_WORD not in epilogue.split("+"):
            raise ValueError(f"epilogue {epilogue!r} must end in {QUANT_WORD!r} (the row compares it with the "
                             "unfused GEMM + quantize)")
    for dt in gemm_dtypes:
        if dt not in GEMM_DTYPES:
            raise ValueError(f"--dtype {dt!r}: choose from {sorted(GEMM_DTYPES)}")
    return [(m, n, k, e, dt) for dt in gemm_dtypes for e in epilogues for m in ms for n, k in _DEEPSEEK_NK]


def unfused_epilogue(epilogue: str) -> str:
    """The epilogue of the unfused GEMM: the fused one without its quantization ("none" when nothing is left)."""
    words = [w for w in epilogue.split("+") if w != QUANT_WORD]
    return "+".join(words) or "none"


def run_case(m: int, n: int, k: int, epilogue: str, reps: int, seed: int, gemm_dtype: str = "bf16") -> dict:
    import cupy

    import deepgemm_jit as dg
    from deepgemm_jit import reference, timing
    from deepgemm_jit.quantization import recipe_granularities

    row = {"m": m, "n": n, "k": k, "epilogue": epilogue, "dtype": gemm_dtype, "status": "error", "error": None}
    try:
        build_kw = GEMM_DTYPES[gemm_dtype]
        fused = dg.build(m, n, k, epilogue=epilogue, **build_kw)
        plain_epi = unfused_epilogue(epilogue)
        plain = dg.build(m, n, k, epilogue=None if plain_epi == "none" else plain_epi, **build_kw)
        rng = cupy.random.default_rng(seed)
        a = reference.random_matrix((m, k), "bf16", rng)
        b = reference.random_matrix((n, k), "bf16", rng, scale=1.0 / math.sqrt(k))
        operands = {}
        a64, b64 = reference.to_float64(a), reference.to_float64(b)
        if "scaling" in build_kw:  # FP8: the operands as an FP8 model holds them, quantized by our quantize
            gran_a, gran_b = recipe_granularities(build_kw["scaling"])
            a, sa = dg.quantize(a, "fp8", gran_a)
            b, sb = dg.quantize(b, "fp8", gran_b)
            operands = {"scale_a": sa, "scale_b": sb}
            a64 = reference.dequantize_reference(a, sa, "fp8_e4m3", gran_a)
            b64 = reference.dequantize_reference(b, sb, "fp8_e4m3", gran_b)
        kwargs = {}
        bias32 = None
        if "bias" in epilogue.split("+"):
            # Quantized outputs take a float32 bias; the unfused GEMM takes one in its output dtype (bf16).
            bias32 = reference.random_matrix((n,), "fp32", rng)
            kwargs_fused = {"bias": bias32, **operands}
            kwargs = {"bias": reference._to_storage(bias32, "bf16"), **operands}
        else:
            kwargs_fused, kwargs = dict(operands), dict(operands)
        value = reference.unfused_epilogue(a64 @ b64.T, fused.spec.epi, bias=bias32)
        q_ref, s_ref = reference.quantized_epilogue_reference(value, fused.spec.epi)
        d = reference.poisoned((m, n), "bf16")
        q, s = fused(a, b, **kwargs_fused)
        plain(a, b, out=d, **kwargs)
        q_sep, s_sep = dg.quantize(d, "fp8", "group128")
        cupy.cuda.Device().synchronize()
        scale_err = float(cupy.max(cupy.abs(s - s_ref) / cupy.abs(s_ref)))
        ulps = int(reference.quant_ulp_distance(q, q_ref, "fp8_e4m3").max())
        deq_ref = reference.dequantize_reference(q_ref, s_ref, "fp8_e4m3", "group128")
        err = float(reference.error(reference.dequantize_reference(q, s, "fp8_e4m3", "group128"), deq_ref))
        pair_err = float(reference.error(reference.dequantize_reference(q_sep, s_sep, "fp8_e4m3", "group128"),
                                         value))
        fused_err = float(reference.error(reference.dequantize_reference(q, s, "fp8_e4m3", "group128"), value))
        row.update(scale_rel_err=scale_err, q_ulps=ulps, err=err, fused_err=fused_err, pair_err=pair_err)
        # The scales follow the group maxima of the GEMM's FP32 values: within the GEMM's own bound of float64 (FP8
        # GEMMs: ~4e-4 measured; BF16: ~4e-5). q's ulps are recorded, not gated: near zero (FP8 subnormals, 2^-9 of
        # a group's max) the FP32 accumulation error of long K moves a value by a few ulps (3 at K = 16384 BF16).
        scale_bound = reference.ERROR_BOUND[plain.spec.dtype]
        if not (scale_err <= scale_bound and reference.within_bound(fused_err, "fp8_e4m3")
                and reference.within_bound(pair_err, "fp8_e4m3")):
            row.update(status="wrong", error=f"scale_rel_err {scale_err:.2e}, fused err {fused_err:.2e}, "
                       f"unfused pair err {pair_err:.2e}")
            return row
        # Both contenders write into buffers allocated once (the fused GEMM and quantize both take out=): a
        # fresh allocation per call timed CuPy's pool, not the kernels (session 7: 86-92 us outliers at M = 64).
        # Poisoned (0xFF is an FP8 NaN, never produced from finite values), compared with the checked results
        # after timing: a timed call that wrote nothing or something else shows.
        q_out, s_out, q_sep2, s_sep2 = (cupy.empty_like(x) for x in (q, s, q_sep, s_sep))
        for x in (q_out, q_sep2):
            x.fill(0xFF)
        for x in (s_out, s_sep2):
            x.fill(cupy.nan)
        t = timing.time_interleaved({
            "fused": lambda: fused(a, b, out=q_out, scales_out=s_out, **kwargs_fused),
            "unfused": lambda: (plain(a, b, out=d, **kwargs), dg.quantize(d, "fp8", "group128",
                                                                         out=(q_sep2, s_sep2))),
            # The pair's parts alone: (GEMM + quantize) / GEMM is the most fusing can give when the fused GEMM
            # runs as fast as the plain one.
            "gemm": lambda: plain(a, b, out=d, **kwargs),
            "quantize": lambda: dg.quantize(d, "fp8", "group128", out=(q_sep2, s_sep2)),
        }, reps=reps)
        cupy.cuda.Device().synchronize()
        for name, got, want in (("fused q", q_out, q), ("fused scales", s_out, s), ("unfused q", q_sep2, q_sep),
                                ("unfused scales", s_sep2, s_sep)):
            bits = {1: cupy.uint8, 4: cupy.uint32}[got.dtype.itemsize]  # same width: any strides view
            if not bool(cupy.array_equal(got.view(bits), want.view(bits))):
                row.update(status="wrong", error=f"timed {name} differ from the checked result")
                return row
        row.update(status="ok", fused_us=t["fused"].median_us, unfused_us=t["unfused"].median_us,
                   gemm_us=t["gemm"].median_us, quantize_us=t["quantize"].median_us,
                   ratio=t["unfused"].median_us / t["fused"].median_us,
                   ceiling=t["unfused"].median_us / t["gemm"].median_us, fused_config=fused.config.tag,
                   plain_config=plain.config.tag)
    except Exception as exc:  # reported per row; the run goes on
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| GEMM | epilogue | M | N | K | fused µs | GEMM + quantize µs | ratio | GEMM µs | quantize µs | "
             "ceiling | err | fused tile | GEMM tile | status |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|---|"]
    for r in rows:
        f = (lambda key, fmt: format(r[key], fmt) if r.get(key) is not None else "-")
        lines.append(f"| {r.get('dtype', 'bf16')} | {r['epilogue']} | {r['m']} | {r['n']} | {r['k']} | "
                     f"{f('fused_us', '.1f')} | {f('unfused_us', '.1f')} | {f('ratio', '.3f')} | {f('gemm_us', '.1f')} | "
                     f"{f('quantize_us', '.1f')} | {f('ceiling', '.3f')} | {f('fused_err', '.1e')} | "
                     f"{r.get('fused_config', '-')} | {r.get('plain_config', '-')} | "
                     f"{r['status']}{': ' + r['error'] if r.get('error') else ''} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quant_epilogue", description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bf16", help=f"comma list of GEMM types: {', '.join(GEMM_DTYPES)}")
    p.add_argument("--m", default=",".join(map(str, DEFAULT_M)), help="comma list of M")
    p.add_argument("--epilogue", default=",".join(DEFAULT_EPILOGUES), help="comma list, each ending in "
                   f"{QUANT_WORD}")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--list", action="store_true", help="print the rows and exit (no GPU)")
    args = p.parse_args(argv)
    rows_spec = cases([int(x) for x in args.m.split(",")], [e.strip() for e in args.epilogue.split(",")],
                      [d.strip() for d in args.dtype.split(",")])
    if args.list:
        for m, n, k, e, dt in rows_spec:
            print(f"{dt:9s} {e:32s} m{m} n{n} k{k}")
        print(f"{len(rows_spec)} rows")
        return 0
    seed = args.seed if args.seed is not None else int(time.time())
    rows = []
    for i, (m, n, k, e, dt) in enumerate(rows_spec):
        rows.append(run_case(m, n, k, e, args.reps, seed + i, dt))
        r = rows[-1]
        print(f"[{i + 1}/{len(rows_spec)}] {dt} {e} m{m} n{n} k{k}: {r['status']} "
              f"{'' if r.get('ratio') is None else format(r['ratio'], '.3f')} {r.get('error') or ''}", flush=True)
    text = markdown(rows)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-quant-epilogue"
    header = report.collect_env(list(argv if argv is not None else sys.argv[1:]), {"seed": seed, "reps": args.reps},
                                module="bench.quant_epilogue")
    (out / f"{stem}.json").write_text(json.dumps({"header": header, "seed": seed, "rows": rows}, indent=1))
    (out / f"{stem}.md").write_text(text)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
