"""Fused quantize-on-store against the unfused GEMM + quantization (issue 5's second bar, and its benchmarks).

    python -m bench.quant_epilogue [--dtype bf16,fp8_tensor,fp8_block] [--m 64,128,4096]
                                   [--epilogue quant_fp8_g128,bias+gelu+quant_fp8_g128,quant_fp8_tensor,...]
                                   [--reps 30] [--out bench/results] [--list] [--offline [--jobs N]]

For each DeepSeek (N, K) of ``suites._DEEPSEEK_NK``, each M and each epilogue ending in a quantize-on-store word
(``quant_fp8_g128``, ``quant_fp8_tensor``, ``quant_int8_tensor``), one GEMM (``--dtype``: BF16, or FP8 E4M3 with
per-tensor or 1x128 x 128x128 block scales, the GEMMs of an FP8 model whose next layer takes this output):

- fused: ``build(..., epilogue=E)`` writes q (E4M3 or INT8) and, for ``quant_fp8_g128``, its 1x128 group scales;
- gemm: the same GEMM with the epilogue minus the quantization, writing BF16 D (overhead = fused / gemm);
- unfused (``quant_fp8_g128`` only): gemm, then ``deepgemm_jit.quantize(D, "fp8", "group128")``, what a user of
  this library runs without the fused epilogue (the library has no static-scale quantize);
- torch: what a torch user runs (``baseline.TorchQuantized``): cuBLAS(Lt) for the product (and the bias), the
  activation as a torch op, then the quantization as torch ops; for an FP8 per-tensor GEMM with
  ``quant_fp8_tensor`` alone, cuBLASLt's own FP8 output (``torch._scaled_mm(out_dtype=e4m3)``, 1/s folded into A's
  scale).

Static-scale rows quantize with s = max |value| / 448 (FP8) or / 127 (INT8) of the float64 result, the scale a
delayed-scaling recipe would hold when the range does not move. All contenders start from the same fresh random
operands (never zeros) and are checked first against float64: the reference is the float64 product of the
(dequantized) operands through the epilogue's float64 unfused operations, quantized as the kernel quantizes its
FP32 values (``reference.quantized_epilogue_reference``). Every contender's dequantized output must be within the
quantized type's bound of the dequantized reference; fused group scales must match the reference's within the GEMM
dtype's bound, and the fused and unfused group results the float64 values within the FP8 bound; the largest q
distance in quantization steps is recorded. Only a checked row is timed, with ``timing.time_interleaved`` (L2
flushed, interleaved, medians), ours into outputs poisoned before timing and compared bit for bit with the checked
results afterwards. ratio = unfused µs / fused µs (> 1: fusing pays; the bar is ratio >= 1.3 at M <= 128 and
>= 1.1 at M = 4096, group rows), ceiling = unfused / gemm (the ratio a fused kernel as fast as the plain GEMM
would reach), vs_torch = torch µs / fused µs. The JSON carries the run's header (``report.collect_env``).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from deepgemm_jit.trial import INT8_POISON

from . import report
from .suites import _DEEPSEEK_NK

DEFAULT_M = (64, 128, 4096)
DEFAULT_EPILOGUES = ("quant_fp8_g128", "bias+gelu+quant_fp8_g128")
# --dtype -> build()
GEMM_DTYPES = {"bf16": {"dtype": "bf16"}, "fp8_tensor": {"dtype": "fp8", "scaling": "tensor"},
               "fp8_block": {"dtype": "fp8", "scaling": "block"}}
QUANT_WORD = "quant_fp8_g128"   # the dynamic group quantization of the bar
QUANT_WORDS = (QUANT_WORD, "quant_fp8_tensor", "quant_int8_tensor")
# Poison of q before a timed call: a byte the kernel never writes (an E4M3 NaN; INT8 saturates to [-127, 127]).
Q_POISON = {"fp8_e4m3": 0xFF, "int8": INT8_POISON}


def quant_word(epilogue: str) -> str | None:
    """The epilogue's quantize-on-store word, None without one."""
    words = [w for w in epilogue.split("+") if w in QUANT_WORDS]
    return words[0] if words else None


def cases(ms, epilogues, gemm_dtypes=("bf16",)) -> list[tuple[int, int, int, str, str]]:
    """(M, N, K, epilogue, GEMM dtype) rows, in run order."""
    for epilogue in epilogues:
        if quant_word(epilogue) is None:
            raise ValueError(f"epilogue {epilogue!r} must end in one of {', '.join(QUANT_WORDS)} (the row compares "
                             "it with the unfused GEMM + quantization)")
    for dt in gemm_dtypes:
        if dt not in GEMM_DTYPES:
            raise ValueError(f"--dtype {dt!r}: choose from {sorted(GEMM_DTYPES)}")
    return [(m, n, k, e, dt) for dt in gemm_dtypes for e in epilogues for m in ms for n, k in _DEEPSEEK_NK]


def unfused_epilogue(epilogue: str) -> str:
    """The epilogue of the unfused GEMM: the fused one without its quantization and its amax ("none" when nothing
    is left)."""
    words = [w for w in epilogue.split("+") if w not in QUANT_WORDS + ("amax",)]
    return "+".join(words) or "none"


def _bitwise_equal(got, want) -> bool:
    import cupy

    bits = {1: cupy.uint8, 2: cupy.uint16, 4: cupy.uint32}[got.dtype.itemsize]  # same width: any strides view
    return bool(cupy.array_equal(got.view(bits), want.view(bits)))


def run_case(m: int, n: int, k: int, epilogue: str, reps: int, seed: int, gemm_dtype: str = "bf16") -> dict:
    import cupy

    import deepgemm_jit as dg
    from deepgemm_jit import baseline, dtypes, reference, timing
    from deepgemm_jit.quantization import recipe_granularities

    row = {"m": m, "n": n, "k": k, "epilogue": epilogue, "dtype": gemm_dtype, "status": "error", "error": None}
    try:
        build_kw = GEMM_DTYPES[gemm_dtype]
        fused = dg.build(m, n, k, epilogue=epilogue, **build_kw)
        plain_epi = unfused_epilogue(epilogue)
        plain = dg.build(m, n, k, epilogue=None if plain_epi == "none" else plain_epi, **build_kw)
        epi = fused.spec.epi
        q_dtype = epi.quant_dtype
        is_group = epi.has_group_scales
        rng = cupy.random.default_rng(seed)
        a = reference.random_matrix((m, k), "bf16", rng)
        b = reference.random_matrix((n, k), "bf16", rng, scale=1.0 / math.sqrt(k))
        operands, scaling = {}, None
        a64, b64 = reference.to_float64(a), reference.to_float64(b)
        if "scaling" in build_kw:  # FP8: the operands as an FP8 model holds them, quantized by our quantize
            gran_a, gran_b = recipe_granularities(build_kw["scaling"])
            a, sa = dg.quantize(a, "fp8", gran_a)
            b, sb = dg.quantize(b, "fp8", gran_b)
            operands = {"scale_a": sa, "scale_b": sb}
            scaling = baseline.Scaling(build_kw["scaling"], sa, sb)
            a64 = reference.dequantize_reference(a, sa, "fp8_e4m3", gran_a)
            b64 = reference.dequantize_reference(b, sb, "fp8_e4m3", gran_b)
        kwargs_fused, kwargs, bias32, bias16 = dict(operands), dict(operands), None, None
        if epi.bias != "none":
            # Quantized outputs take a float32 bias; the unfused GEMM and torch take one in BF16: the same values.
            bias16 = reference.random_matrix((n,), "bf16", rng)
            bias32 = reference.to_float64(bias16).astype(cupy.float32)
            kwargs_fused["bias"], kwargs["bias"] = bias32, bias16
        value = reference.unfused_epilogue(a64 @ b64.T, epi, bias=bias32)
        quant_scale = None
        if not is_group:  # the static scale: the float64 result's range, as float32
            quant_scale = cupy.asarray([float(cupy.max(cupy.abs(value))) / dtypes.QUANT_MAX[q_dtype]],
                                       dtype=cupy.float32)
            kwargs_fused["quant_scale"] = quant_scale
        q_ref, s_ref = reference.quantized_epilogue_reference(value, epi, quant_scale)
        gran = "group128" if is_group else "tensor"
        deq_ref = reference.dequantize_reference(q_ref, s_ref if is_group else quant_scale, q_dtype, gran)
        torch_base = baseline.TorchQuantized().bind(
            fused.spec, a, b, scaling=scaling, quant_scale=quant_scale,
            epilogue=baseline.EpilogueOperands(bias=bias16))
        row["torch"] = torch_base.name
        d = reference.poisoned((m, n), "bf16")
        result = fused(a, b, **kwargs_fused)
        q, s = result if is_group else (result, quant_scale)
        plain(a, b, out=d, **kwargs)
        torch_base.fn()
        cupy.cuda.Device().synchronize()
        deq = reference.dequantize_reference(q, s, q_dtype, gran)
        torch_deq = torch_base.result_f64()
        errs = {"err": float(reference.error(deq, deq_ref)), "fused_err": float(reference.error(deq, value)),
                "torch_err": float(reference.error(torch_deq, value)),
                "torch_quant_err": float(reference.error(torch_deq, deq_ref)),
                "gemm_err": float(reference.error(d, value))}  # the plain GEMM's D (its time is the overhead's base)
        ulps = int(reference.quant_ulp_distance(q, q_ref, q_dtype).max())
        row.update(q_ulps=ulps, **errs)
        # Ours quantizes the FP32 values the reference quantizes: within q's bound of the reference quantization.
        # torch quantizes its BF16 product (one step off near rounding boundaries, ~6e-3 for INT8): judged against
        # the float64 values with the FP8 bound, which the quantization's own error fits (INT8 ~1.2e-2, FP8 ~2e-2).
        bad = [f"{name} {errs[name]:.2e}" for name, bound in (("err", q_dtype), ("torch_err", "fp8_e4m3"),
                                                             ("gemm_err", plain.spec.dtype))
               if not reference.within_bound(errs[name], bound)]
        if is_group:
            q_sep, s_sep = dg.quantize(d, "fp8", "group128")
            scale_err = float(cupy.max(cupy.abs(s - s_ref) / cupy.abs(s_ref)))
            pair_err = float(reference.error(reference.dequantize_reference(q_sep, s_sep, "fp8_e4m3", gran), value))
            row.update(scale_rel_err=scale_err, pair_err=pair_err)
            # The scales follow the group maxima of the GEMM's FP32 values: within the GEMM's own bound of float64
            # (FP8 GEMMs: ~4e-4 measured; BF16: ~4e-5). q's ulps are recorded, not gated: near zero (FP8
            # subnormals, 2^-9 of a group's max) the FP32 accumulation error of long K moves a value by a few ulps
            # (3 at K = 16384 BF16).
            if scale_err > reference.ERROR_BOUND[plain.spec.dtype]:
                bad.append(f"scale_rel_err {scale_err:.2e}")
            bad += [f"{name} {e:.2e}" for name, e in (("fused err", errs["fused_err"]), ("unfused pair err", pair_err))
                    if not reference.within_bound(e, "fp8_e4m3")]
        if bad:
            row.update(status="wrong", error=", ".join(bad))
            return row
        # Our contenders write into buffers allocated once (the fused GEMM and quantize both take out=): a fresh
        # allocation per call timed CuPy's pool, not the kernels (session 7: 86-92 us outliers at M = 64). Poisoned
        # (Q_POISON, never produced from finite values; NaN scales), compared with the checked results after
        # timing: a timed call that wrote nothing or something else shows.
        q_out = cupy.full_like(q, Q_POISON[q_dtype])
        contenders = {"gemm": lambda: plain(a, b, out=d, **kwargs), "torch": torch_base.fn}
        checks = [("fused q", q_out, q), ("gemm D", d, d.copy())]  # (split-K GEMMs add in a fixed order)
        if is_group:
            s_out, q_sep2, s_sep2 = cupy.full_like(s, cupy.nan), cupy.full_like(q_sep, 0xFF), cupy.empty_like(s_sep)
            s_sep2.fill(cupy.nan)
            contenders.update({
                "fused": lambda: fused(a, b, out=q_out, scales_out=s_out, **kwargs_fused),
                "unfused": lambda: (plain(a, b, out=d, **kwargs),
                                    dg.quantize(d, "fp8", "group128", out=(q_sep2, s_sep2))),
                "quantize": lambda: dg.quantize(d, "fp8", "group128", out=(q_sep2, s_sep2))})
            checks += [("fused scales", s_out, s), ("unfused q", q_sep2, q_sep), ("unfused scales", s_sep2, s_sep)]
        else:
            contenders["fused"] = lambda: fused(a, b, out=q_out, **kwargs_fused)
        t = timing.time_interleaved(contenders, reps=reps)
        cupy.cuda.Device().synchronize()
        for name, got, want in checks:
            if not _bitwise_equal(got, want):
                row.update(status="wrong", error=f"timed {name} differ from the checked result")
                return row
        us = {name: t[name].median_us for name in contenders}
        row.update(status="ok", fused_us=us["fused"], gemm_us=us["gemm"], torch_us=us["torch"],
                   overhead=us["fused"] / us["gemm"], vs_torch=us["torch"] / us["fused"],
                   fused_config=fused.config.tag, plain_config=plain.config.tag)
        if is_group:
            row.update(unfused_us=us["unfused"], quantize_us=us["quantize"], ratio=us["unfused"] / us["fused"],
                       ceiling=us["unfused"] / us["gemm"])
    except Exception as exc:  # reported per row; the run goes on
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| GEMM | epilogue | M | N | K | fused µs | GEMM + quantize µs | ratio | GEMM µs | overhead | "
             "quantize µs | ceiling | torch µs | vs torch | err | fused tile | GEMM tile | status |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|---|"]
    for r in rows:
        f = (lambda key, fmt: format(r[key], fmt) if r.get(key) is not None else "-")
        lines.append(f"| {r.get('dtype', 'bf16')} | {r['epilogue']} | {r['m']} | {r['n']} | {r['k']} | "
                     f"{f('fused_us', '.1f')} | {f('unfused_us', '.1f')} | {f('ratio', '.3f')} | "
                     f"{f('gemm_us', '.1f')} | "
                     f"{f('overhead', '.3f')} | {f('quantize_us', '.1f')} | {f('ceiling', '.3f')} | "
                     f"{f('torch_us', '.1f')} | {f('vs_torch', '.3f')} | {f('fused_err', '.1e')} | "
                     f"{r.get('fused_config', '-')} | {r.get('plain_config', '-')} | "
                     f"{r['status']}{': ' + r['error'] if r.get('error') else ''} |")
    torch_labels = sorted({r["torch"] for r in rows if r.get("torch")})
    lines += ["", "torch contenders: " + "; ".join(f"`{x}`" for x in torch_labels)] if torch_labels else []
    return "\n".join(lines) + "\n" + summary(rows)


def summary(rows: list[dict]) -> str:
    """Geomeans per (GEMM dtype, epilogue, M) group of ok rows: ratio (group rows), overhead, vs torch."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            groups.setdefault((r["dtype"], r["epilogue"], r["m"]), []).append(r)
    out = []
    for (dt, e, m), rs in groups.items():
        gm = {key: math.exp(sum(math.log(r[key]) for r in rs) / len(rs))
              for key in ("ratio", "overhead", "vs_torch") if all(r.get(key) for r in rs)}
        parts = ", ".join(f"{key} {v:.3f}" for key, v in gm.items())
        out.append(f"- **{dt} {e} M={m}** ({len(rs)} rows): geomean {parts}")
    return "\n" + "\n".join(out) + "\n" if out else ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quant_epilogue", description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bf16", help=f"comma list of GEMM types: {', '.join(GEMM_DTYPES)}")
    p.add_argument("--m", default=",".join(map(str, DEFAULT_M)), help="comma list of M")
    p.add_argument("--epilogue", default=",".join(DEFAULT_EPILOGUES), help="comma list, each with one of "
                   f"{', '.join(QUANT_WORDS)}")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--list", action="store_true", help="print the rows and exit (no GPU)")
    p.add_argument("--offline", action="store_true",
                   help="compile every kernel the rows would build on the H200 (sm_90a, 132 SMs) into the kernel "
                        "cache (DEEPGEMM_JIT_CACHE_DIR) and exit (bench/offline.py); no GPU needed")
    p.add_argument("--jobs", type=int, default=2, help="compile processes of --offline (default 2)")
    args = p.parse_args(argv)
    rows_spec = cases([int(x) for x in args.m.split(",")], [e.strip() for e in args.epilogue.split(",")],
                      [d.strip() for d in args.dtype.split(",")])
    if args.offline:
        from . import offline

        return offline.compile_work(*offline.quant_epilogue_work(rows_spec), "bench.quant_epilogue", jobs=args.jobs)
    if args.list:
        for m, n, k, e, dt in rows_spec:
            print(f"{dt:9s} {e:32s} m{m} n{n} k{k}")
        print(f"{len(rows_spec)} rows")
        return 0
    from deepgemm_jit import device

    if not device.gpu_count():  # (it ran every row into an error, then a traceback collecting the environment)
        print("bench.quant_epilogue: no usable CUDA device (--list and --offline need none)", file=sys.stderr)
        return 2
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
