"""One row at a time: build, check against float64, then (only if correct) time ours and the baseline.

Operands (``Operands``): 16/32-bit rows multiply fresh N(0, 1) inputs in their storage type and are judged
against the float64 product of exactly those inputs. 8-bit rows (``bench/dtypes.py`` recipes) start from fresh
N(0, 1) inputs rounded to BF16 (as DeepGEMM's tests do), quantize them with the library's
``reference.quantize_reference`` and are judged against the float64 product of the *dequantized* operands
(rel_fro, the dtype's bound); FP8 rows also record DeepGEMM's cos difference against the product of the BF16
inputs (``err_cos``, ``baseline_err_cos``; noted above ``reference.FP8_COS_BOUND``, not judged), and INT8 rows,
whose INT32 product is exact, fail on any element that differs from it.

Epilogue rows (``Case.epilogue``, ``--epilogue``): B is drawn with scale 1/sqrt(K) so that the product is
~N(0, 1) and the activation is exercised on both sides of zero; bias, C and residual are fresh N(0, 1) values in
the output dtype (alpha 0.75, beta 0.5 with ``beta``). Ours with the epilogue is judged against the unfused
float64 reference (``reference.unfused_epilogue`` of the float64 product), our plain GEMM (the same build without
the epilogue) against the product itself; then ours, our plain GEMM and the baseline (``torch_unfused``: cuBLAS
then separate torch ops) are timed interleaved on the same operands: ``overhead`` = us / plain_us,
``ratio`` = baseline_us / us as everywhere.

Each row is isolated: an exception becomes the row's ``error`` and the run goes on. A sticky CUDA error (the
context is lost, e.g. an illegal address) cannot be recovered in-process: the remaining rows are marked skipped
and the run ends with what it has (rerun them with ``--only``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
import traceback
from typing import Callable

import cupy

from deepgemm_jit import baseline, dtypes, reference, sm90_tiles, timing, trial

from . import dtypes as bench_dtypes
from . import metrics
from .suites import Case


@dataclasses.dataclass
class RunContext:
    reps: int
    warmup: int
    baseline_order: tuple[str, ...]
    seed: int
    flusher: timing.L2Flusher | None = None
    dg: object = None
    is_context_lost: bool = False


# ------------------------------------------------------------------------------------------------- operands
def quantize(x32, lib_dtype: str, granularity: str):
    """(q, scales) of float32 CuPy `x32`: the library's quantization reference (the one place that names it)."""
    return reference.quantize_reference(x32, lib_dtype, granularity)


def dequantize(q, scales, lib_dtype: str, granularity: str):
    """float64 CuPy q · s: the library's dequantization reference (the one place that names it)."""
    return reference.dequantize_reference(q, scales, lib_dtype, granularity)


@dataclasses.dataclass
class Operands:
    """One row's inputs, and the float64 (M, N) products they are judged against."""

    a: object
    b: object
    ref: object                              # the product the dtype's bound applies to
    ref_kind: str                            # how it was computed (row["ref"])
    scaling: baseline.Scaling | None = None  # FP8 scales: passed to ours and to the baseline
    ref_cos: object | None = None            # FP8: product of the BF16 inputs, for DeepGEMM's cos difference
    is_exact: bool = False                   # INT8 -> INT32: every element must equal the reference

    def call_kwargs(self) -> dict:
        """Keyword arguments of our kernel's call besides out=."""
        if self.scaling is None:
            return {}
        return {"scale_a": self.scaling.scale_a, "scale_b": self.scaling.scale_b}

    @property
    def scale_bytes(self) -> int:
        return 0 if self.scaling is None else self.scaling.num_bytes


def plain_operands(spec, m: int, rng, b_scale: float = 1.0) -> Operands:
    """Fresh N(0, 1) inputs (B: N(0, b_scale²)) in the spec's storage type, and their exact float64 product."""
    if b_scale == 1.0:
        a, b = reference.random_operands(spec, m, rng=rng)
    else:
        a = reference.random_matrix(spec.a_shape(m), spec.dtype, rng)
        b = reference.random_matrix(spec.b_shape(), spec.dtype, rng, scale=b_scale)
    return Operands(a, b, reference.reference(spec, a, b), reference.reference_kind(spec, m))


def quantized_operands(info: bench_dtypes.BenchDtype, spec, m: int, rng, b_scale: float = 1.0) -> Operands:
    """Fresh N(0, 1) inputs (B: N(0, b_scale²)) rounded to BF16, quantized per the recipe `info`; the references
    of the module doc."""
    x_a = reference.random_matrix(spec.a_shape(m), "bf16", rng)
    x_b = reference.random_matrix(spec.b_shape(), "bf16", rng, scale=b_scale)
    kind = reference.reference_kind(spec, m)
    ref_cos = reference.reference(spec, x_a, x_b) if info.scaling else None
    qa, sa = quantize(reference.to_float64(x_a).astype(cupy.float32), info.lib, info.quant_a)
    qb, sb = quantize(reference.to_float64(x_b).astype(cupy.float32), info.lib, info.quant_b)
    del x_a, x_b
    if info.scaling is None:
        # INT8: the kernel multiplies the integers (the scales belong to a later epilogue), exactly.
        return Operands(qa, qb, reference.reference(spec, qa, qb), kind, is_exact=True)
    scaling = baseline.Scaling(info.scaling, sa, sb)
    scaling.check(m, spec.n, spec.k)
    ref = reference.reference(spec, dequantize(qa, sa, info.lib, info.quant_a),
                              dequantize(qb, sb, info.lib, info.quant_b))
    # Scales go to our kernel as quantize returns them: block scale_a (group128) M-major with 16-byte aligned
    # columns, the layout our block kernel bulk-copies (launch.bulk_a_scales); the torch baseline makes its own
    # copies in the layouts it checks for (baseline.torch_scaled_mm_calls).
    return Operands(qa, qb, ref, f"{kind}-dequant", scaling, ref_cos)


def operands(info: bench_dtypes.BenchDtype, spec, m: int, rng, b_scale: float = 1.0) -> Operands:
    """A row's inputs for the bench dtype `info` (quantized per its recipe, or plain) and their references."""
    if info.is_quantized:
        return quantized_operands(info, spec, m, rng, b_scale)
    return plain_operands(spec, m, rng, b_scale)


@contextlib.contextmanager
def config_constants(values: dict):
    """For experiment scripts: the heuristic's module constants (config and the modules it builds on: buckets,
    sm90_tiles, sm90_cost, sm90_rules, sm90_swap_ab) set to `values` (name -> value) inside the block, e.g. another
    rule's thresholds, with the heuristic's memo cleared on the way in and out. A constant is set in every one of
    those modules that binds the name (a module that imports it holds its own binding)."""
    from deepgemm_jit import buckets, config, sm90_cost, sm90_rules, sm90_swap_ab, sm90_tiles

    modules = (buckets, sm90_tiles, sm90_cost, sm90_rules, sm90_swap_ab, config)
    saved = []
    for name, value in values.items():
        holders = [module for module in modules if hasattr(module, name)]
        if not holders:
            raise AttributeError(f"no heuristic module defines {name!r}")
        for module in holders:
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, value)
    config.choose_sm90_config.cache_clear()
    try:
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)
        config.choose_sm90_config.cache_clear()


def checked_contenders(gemms: dict, inputs: Operands, m: int,
                       epi_ops: baseline.EpilogueOperands | None = None,
                       after_timing: dict | None = None) -> tuple[dict, dict]:
    """For experiment scripts: each named Gemm of `gemms` called once on `inputs` into a poisoned output, its error
    against the float64 reference, and the first baseline that computes the problem and passes its check ("cublas";
    with a fused epilogue, cuBLAS + the separate torch ops); returns (name -> call, name -> error) ready for
    timing.time_interleaved. `epi_ops`: the operands of the Gemms' (common) fused epilogue (epilogue_operands).
    `after_timing` (a dict) gets name -> a function giving the error of what the timed calls left in that Gemm's
    output, which is poisoned again here (a kernel right only on its first call shows: the bench's run_row does
    the same)."""
    spec = next(iter(gemms.values())).spec
    ops, ref, bind_kwargs = inputs.call_kwargs(), inputs.ref, {"scaling": inputs.scaling}
    if epi_ops is not None:
        ops = {**ops, **epi_ops.call_kwargs(spec.epi)}
        ref = apply_epilogue(ref, spec.epi, epi_ops)
        bind_kwargs["epilogue"] = epi_ops
    fns, errors = {}, {}
    for name, g in gemms.items():
        out = reference.poisoned(g.spec.out_shape(m), g.spec.out_dtype)
        fns[name] = (lambda g=g, out=out: g(inputs.a, inputs.b, out=out, **ops))
        fns[name]()
        errors[name] = reference.error(out, ref)
        if after_timing is not None:
            reference.poison(out)
            after_timing[name] = (lambda out=out: reference.error(out, ref))
    base, _ = baseline.bind(spec, inputs.a, inputs.b, **bind_kwargs)
    if base is not None and baseline.check(base, spec, ref).is_ok:
        fns["cublas"] = base.fn
    return fns, errors


@dataclasses.dataclass
class ProblemInputs:
    """For experiment scripts: one dense problem "DTYPE[+EPILOGUE][/LAYOUT]:MxNxK" (problem_inputs)."""

    m: int
    n: int
    k: int
    info: bench_dtypes.BenchDtype
    spec: object
    epilogue: str    # "" without one
    layout: str      # nt unless the problem names another
    inputs: Operands  # its ref includes the epilogue
    kwargs: dict     # the call's keyword arguments besides out=: scales, the epilogue's operands
    io_bytes: int    # fewest bytes through memory, as the bench rows count them (D as written, scales, epilogue)

    def build_kwargs(self) -> dict:
        """deepgemm_jit.build's dtype, scaling and epilogue for the problem."""
        return dict(dtype=self.info.lib, scaling=self.info.scaling, layout=self.layout,
                    **({"epilogue": self.epilogue} if self.epilogue else {}))


@dataclasses.dataclass
class GroupedFp8Inputs:
    """For experiment scripts: a contiguous grouped FP8 (block recipe) problem, `groups` groups of the same rows
    (grouped_fp8_inputs)."""

    qa: object       # (groups x rows, K) E4M3
    sa: object       # its 1x128 scales, M-major as dg.quantize returns them
    weights: list    # per group (q, scales) of the (N, K) weight, 128x128 blocks
    qb: object       # the weights stacked, (groups, N, K), and their scales
    sb: object
    offs: object     # int32 group ends (torch's offs)


def bitwise_equal_outputs(calls: dict, out) -> dict:
    """For experiment variants that must compute the same bits (same kernel math, another schedule or launch): run
    each zero-argument call, which writes the contiguous CuPy array `out`, poisoned first (a call that writes
    nothing cannot match), and compare every output's bytes with the first call's: {name: bitwise equal}."""
    outputs = {}
    for name, call in calls.items():
        reference.poison(out)
        call()
        cupy.cuda.Device().synchronize()
        outputs[name] = out.copy()
    first = next(iter(outputs.values())).view(cupy.uint8)
    return {name: bool((o.view(cupy.uint8) == first).all()) for name, o in outputs.items()}


def grouped_fp8_inputs(groups: int, rows: int, n: int, k: int, seed: int) -> GroupedFp8Inputs:
    """Random operands of a contiguous grouped FP8 GEMM (A quantized first, then each weight, from `seed`)."""
    import numpy as np

    import deepgemm_jit as dg

    rng = cupy.random.default_rng(seed)
    qa, sa = dg.quantize(rng.standard_normal((groups * rows, k), dtype=cupy.float32), "fp8", "group128")
    ws = [dg.quantize(rng.standard_normal((n, k), dtype=cupy.float32), "fp8", "block128") for _ in range(groups)]
    offs = cupy.asarray(np.arange(1, groups + 1) * rows, dtype=cupy.int32)
    return GroupedFp8Inputs(qa, sa, ws, cupy.stack([w[0] for w in ws]), cupy.stack([w[1] for w in ws]), offs)


def parse_problem(problem: str):
    """(m, n, k, bench dtype, GemmSpec, epilogue or "", layout) of "DTYPE[+EPILOGUE][/LAYOUT]:MxNxK" (no GPU)."""
    from deepgemm_jit.spec import GemmSpec

    kind, _, dims = problem.partition(":")
    kind, _, layout = kind.partition("/")
    dtype_name, _, epilogue = kind.partition("+")
    m, n, k = (int(v) for v in dims.split("x"))
    info = bench_dtypes.get(dtype_name)
    layout = layout or "nt"
    spec = GemmSpec.create(n, k, dtype=info.lib, scaling=info.scaling, epilogue=epilogue or None, layout=layout)
    return m, n, k, info, spec, epilogue, layout


def problem_inputs(problem: str) -> ProblemInputs:
    """Fresh operands (seeded by the size) of "DTYPE[+EPILOGUE][/LAYOUT]:MxNxK": DTYPE a bench dtype (bf16,
    fp8_block, ...), EPILOGUE a fused one (bias+gelu, ...) with the bench's epilogue operands, LAYOUT nt (default),
    nn, tn or tt (e.g. "tf32/nn:4x4096x7168", the decode kernel for (K, N) weights); B scaled by 1/sqrt(K) with an
    epilogue, as the bench's epilogue rows, so that activations see O(1) values."""
    m, n, k, info, spec, epilogue, layout = parse_problem(problem)
    rng = cupy.random.default_rng(m + n + k)
    inputs = operands(info, spec, m, rng, 1.0 / k ** 0.5 if epilogue else 1.0)
    kwargs = inputs.call_kwargs()
    out_rows, out_cols = spec.out_shape(m)
    io_bytes = (metrics.gemm_io_bytes(m, n, k, inputs.a.dtype.itemsize, inputs.b.dtype.itemsize, 0)
                + out_rows * out_cols * dtypes.get(spec.out_dtype).storage_bytes + inputs.scale_bytes)
    if epilogue:
        epi_ops = epilogue_operands(spec, m, rng)
        inputs.ref = apply_epilogue(inputs.ref, spec.epi, epi_ops)
        kwargs.update(epi_ops.call_kwargs(spec.epi))
        io_bytes += epi_ops.num_bytes
    return ProblemInputs(m, n, k, info, spec, epilogue, layout, inputs, kwargs, io_bytes)


def time_checked(contenders: dict, info: bench_dtypes.BenchDtype, spec, m: int, reps: int
                 ) -> tuple[dict, dict, dict]:
    """For experiment scripts: fresh operands for one problem (seeded by its size), each named Gemm checked against
    the float64 reference (checked_contenders, which adds "cublas"), then all timed interleaved by the bench protocol
    (L2 flushed, events); returns (name -> call, name -> error, name -> median us)."""
    n, k = spec.n, spec.k
    inputs = operands(info, spec, m, cupy.random.default_rng(m + n + k), 1.0)
    fns, errors = checked_contenders(contenders, inputs, m)
    cupy.cuda.Device().synchronize()
    timed = timing.time_interleaved(fns, reps=reps, warmup=3)
    return fns, errors, {name: r.median_us for name, r in timed.items()}


@contextlib.contextmanager
def templates_tree(tdir: str | None):
    """For experiment scripts: kernels built (and launch plans made) inside the block render from another copy of
    templates/ (DEEPGEMM_JIT_TEMPLATES_DIR); None leaves the checkout's."""
    import os

    if tdir is None:
        yield
        return
    os.environ["DEEPGEMM_JIT_TEMPLATES_DIR"] = tdir
    try:
        yield
    finally:
        os.environ.pop("DEEPGEMM_JIT_TEMPLATES_DIR", None)


# Fresh N(0, 1) bias / C / residual (and alpha / beta) for an Epilogue: the tuner's trial calls draw theirs there too.
epilogue_operands = trial.epilogue_operands


def apply_epilogue(product, epi, ops: baseline.EpilogueOperands):
    """The float64 unfused reference of the epilogue applied to the float64 `product` (None stays None)."""
    if product is None:
        return None
    return reference.unfused_epilogue(product, epi, ops.bias, ops.c, ops.residual, ops.alpha, ops.beta)


def num_mismatches(out, ref) -> int:
    """Elements of `out` that differ from `ref` (an exact product), NaN included."""
    return int(cupy.count_nonzero(~(reference.to_float64(out) == ref)))


# ------------------------------------------------------------------------------------------------------- rows
def empty_row(case: Case) -> dict:
    info = bench_dtypes.get(case.dtype)
    return {
        "suite": case.suite, "dtype": case.dtype, "layout": case.layout, "m": case.m, "n": case.n, "k": case.k,
        "tiles": case.tiles, "status": "error", "error": None, "note": "",
        "us": None, "us_min": None, "us_p20": None, "us_p80": None, "tflops": None, "gbps": None,
        "baseline": None, "baseline_us": None, "baseline_us_min": None, "baseline_us_p20": None,
        "baseline_us_p80": None, "baseline_tflops": None, "ratio": None,
        "err": None, "tol": reference.ERROR_BOUND[info.lib],
        "err_metric": reference.ERROR_METRIC[info.lib], "ref": None, "baseline_err": None,
        "library_dtype": info.lib, "scaling": info.scaling, "err_cos": None, "baseline_err_cos": None,
        "cos_tol": reference.FP8_COS_BOUND if info.scaling else None,
        "poison": None, "intensity": None, "io_bytes": None, "out_dtype": None,
        "family": None, "config": None, "config_fields": None, "build_s": None, "first_call_s": None,
        "reps": None, "host_us": None, "baseline_host_us": None, "flush_us": None,
        # epilogue rows only (plain rows keep exactly the keys above)
        **({"epilogue": case.epilogue, "overhead": None, "plain_us": None, "plain_us_min": None,
            "plain_us_p20": None, "plain_us_p80": None, "plain_host_us": None, "plain_tflops": None,
            "plain_err": None, "plain_config": None, "alpha": None, "beta": None, "epilogue_bytes": None}
           if case.epilogue else {}),
    }


def _config_strings(g) -> tuple[str | None, str | None, dict | None]:
    family = getattr(g, "family", None)
    config = getattr(g, "config", None)
    fields = None
    if config is not None and dataclasses.is_dataclass(config) and not isinstance(config, type):
        fields = json.loads(json.dumps(dataclasses.asdict(config), default=str))
    tag = getattr(config, "tag", None)
    return (None if family is None else str(family),
            None if config is None else str(tag if tag is not None else config), fields)


def _is_sticky(exc: BaseException) -> bool:
    """After an exception, is the CUDA context lost (a sync or a tiny kernel fails)?"""
    try:
        cupy.cuda.Device().synchronize()
        cupy.empty(1, dtype=cupy.float32).fill(0)
        cupy.cuda.Device().synchronize()
        return False
    except Exception:
        return True


def _release_memory() -> None:
    cupy.get_default_memory_pool().free_all_blocks()
    try:
        import sys
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception:
        pass


def guarded_row(row: dict, ctx, work: Callable[[], None]) -> dict:
    """Run one bench row's `work` (which fills `row`): an exception becomes the row's error and the run goes on,
    a sticky CUDA error marks `ctx.is_context_lost` so that the rows after it are skipped, and memory is released
    whatever happened. A row after a lost context is skipped without running. Shared by every bench script."""
    if ctx.is_context_lost:
        row["status"] = "skipped"
        row["error"] = "CUDA context lost earlier in the run"
        return row
    try:
        work()
    except Exception as exc:
        row["status"] = "error"
        row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        row["traceback"] = traceback.format_exc(limit=8)[-4000:]
        if _is_sticky(exc):
            ctx.is_context_lost = True
            row["error"] += " [sticky CUDA error: remaining rows skipped]"
    finally:
        try:
            _release_memory()
        except Exception:
            pass
    return row


def run_case(case: Case, ctx: RunContext, index: int) -> dict:
    row = empty_row(case)
    return guarded_row(row, ctx, lambda: _run_case(case, ctx, index, row))


def _build(case: Case, ctx: RunContext):
    """(Gemm, build seconds) of the case, with its forced tile where it has one. fp32 rows build the FP32-accurate
    3xTF32 GEMM (``dg.build_fp32``: fp32 is no GemmSpec input dtype; a forced tile applies to its TF32 GEMM)."""
    t0 = time.perf_counter()
    kwargs = case.build_kwargs()
    if case.tiles and case.tiles != "tuned":
        kwargs["config"] = case.forced_config(case.make_spec())
    build = ctx.dg.build
    if kwargs["dtype"] == "fp32":
        build = ctx.dg.build_fp32
        del kwargs["dtype"]
    g = build(case.m, case.n, case.k, **kwargs)
    return g, time.perf_counter() - t0


def _decode_kernel_tag(g, m: int) -> str | None:
    """The tag of the decode kernel (gemv / gemv_kn) a call of `g` at M = m runs, or None where g's own config runs."""
    if m > getattr(g, "weight_streaming_max_m", 0):
        return None
    from deepgemm_jit import device, gemv, gemv_kn

    kernel = (gemv.kernel_for(g.spec, m, g.arch) if g.weight_streaming_kernel is gemv else
              gemv_kn.GemvKnSpec.for_gemm(g.spec, device.num_sms_or(sm90_tiles.DEFAULT_SM90_NUM_SMS)))
    return kernel.tag


def _run_case(case: Case, ctx: RunContext, index: int, row: dict) -> None:
    m, n, k = case.m, case.n, case.k
    info = bench_dtypes.get(case.dtype)
    metric = reference.ERROR_METRIC[info.lib]

    g, row["build_s"] = _build(case, ctx)
    row["family"], row["config"], row["config_fields"] = _config_strings(g)
    decode_tag = _decode_kernel_tag(g, m)
    if decode_tag is not None:  # the call runs a decode kernel, not g.config's
        row["family"], row["config"] = "gemv", decode_tag
    # An epilogue row also builds the same GEMM without the epilogue: the time the epilogue is measured against (a
    # decode kernel where the plain GEMM's call runs one: its tag is then the one that ran).
    g_plain = _build(dataclasses.replace(case, epilogue=None), ctx)[0] if case.epilogue else None
    if g_plain is not None:
        row["plain_config"] = _decode_kernel_tag(g_plain, m) or _config_strings(g_plain)[1]

    # ---- correctness: fresh inputs, poisoned output, float64 reference
    rng = cupy.random.default_rng(ctx.seed + index)
    b_scale = 1.0 / math.sqrt(k) if case.epilogue else 1.0
    ops = operands(info, g.spec, m, rng, b_scale)
    a, b, call_kwargs = ops.a, ops.b, ops.call_kwargs()
    product_ref = ops.ref                 # what the plain GEMM is judged against
    epi_ops = None
    if case.epilogue:
        epi = g.spec.epi
        epi_ops = epilogue_operands(g.spec, m, rng)
        ops.ref = apply_epilogue(ops.ref, epi, epi_ops)
        ops.ref_cos = apply_epilogue(ops.ref_cos, epi, epi_ops)
        plain_kwargs = dict(call_kwargs)
        call_kwargs = {**call_kwargs, **epi_ops.call_kwargs(epi)}
        row["alpha"], row["beta"] = epi_ops.alpha, epi_ops.beta
    d = reference.poisoned(g.spec.out_shape(m), g.spec.out_dtype)
    t0 = time.perf_counter()
    g(a, b, out=d, **call_kwargs)
    cupy.cuda.Device().synchronize()
    row["first_call_s"] = time.perf_counter() - t0
    row["poison"] = "out="
    row["out_dtype"] = d.dtype.name
    row["ref"] = ops.ref_kind + ("+unfused-epilogue" if case.epilogue else "")
    row["err"] = reference.error(d, ops.ref, metric)
    notes = []
    if math.isnan(row["err"]):
        notes.append(f"{reference.num_nonfinite(d)} non-finite output elements (unwritten or overflow)")
    is_within = reference.within_bound(row["err"], info.lib)
    # An exact product (INT8 -> INT32, float64 reference) leaves no room for error: any difference is a bug.
    num_wrong = num_mismatches(d, ops.ref) if ops.is_exact and ops.ref_kind == "fp64" else 0
    if num_wrong:
        notes.append(f"{num_wrong} of {m * n} elements differ from the exact integer product")
    if ops.ref_cos is not None:
        row["err_cos"] = reference.error(d, ops.ref_cos, "cos")
        if not row["err_cos"] <= reference.FP8_COS_BOUND:
            notes.append(f"cos diff {row['err_cos']:.2e} > {reference.FP8_COS_BOUND:g} vs the BF16-input product "
                         "(recorded, not judged)")
    # D as written: (M, N/2) for gated epilogues (counting N columns overstated GB/s 1.3x on swiglu rows)
    io_bytes = metrics.gemm_io_bytes(m, n, k, a.dtype.itemsize, b.dtype.itemsize, 0) + d.size * d.dtype.itemsize
    io_bytes += ops.scale_bytes
    if epi_ops is not None:
        row["epilogue_bytes"] = epi_ops.num_bytes
        io_bytes += epi_ops.num_bytes
    row["io_bytes"] = io_bytes
    row["intensity"] = metrics.gemm_flops(m, n, k) / io_bytes
    if not is_within or num_wrong:
        row["status"] = "fail"
        verdict = f"err {row['err']:.3e} > tol {row['tol']:g}" if not is_within else "not exact"
        row["note"] = "; ".join(notes + [f"{verdict}: not timed"])
        return

    d_plain = None
    if g_plain is not None:
        d_plain = reference.poisoned(g_plain.spec.out_shape(m), g_plain.spec.out_dtype)
        g_plain(a, b, out=d_plain, **plain_kwargs)
        row["plain_err"] = reference.error(d_plain, product_ref, metric)
        if not reference.within_bound(row["plain_err"], info.lib):
            notes.append(f"plain GEMM failed its check (err {row['plain_err']:.3e}): not timed, no overhead")
            g_plain = None

    bind_kwargs = {"scaling": ops.scaling}
    if epi_ops is not None:
        bind_kwargs["epilogue"] = epi_ops
    base, reasons = baseline.bind(g.spec, a, b, ctx.baseline_order, **bind_kwargs)
    if base is not None:
        base_check = baseline.check(base, g.spec, ops.ref)
        row["baseline_err"] = base_check.err
        if ops.ref_cos is not None:
            row["baseline_err_cos"] = reference.error(base.result_f64(), ops.ref_cos, "cos")
        if base_check.note:
            notes.append(base_check.note)
        if not base_check.is_ok:
            base = None
    else:
        notes.append("no baseline: " + "; ".join(reasons))
    ref, exact = ops.ref, ops.is_exact and ops.ref_kind == "fp64"
    del ops
    if base is not None:
        row["baseline"] = base.name

    # ---- timing, ours (and our plain GEMM) and the baseline interleaved
    fns = {"ours": lambda: g(a, b, out=d, **call_kwargs)}
    if g_plain is not None:
        fns["plain"] = lambda: g_plain(a, b, out=d_plain, **plain_kwargs)
    if base is not None:
        fns["base"] = base.fn
    if ctx.flusher is None:
        ctx.flusher = timing.L2Flusher()
    # The timed calls' own outputs are poisoned first and judged after, as the first call's were: a kernel right
    # only on its first call (e.g. split-K counters left dirty, or a replayed launch plan that writes nothing) would
    # otherwise be timed and reported ok.
    reference.poison(d)
    if g_plain is not None:
        reference.poison(d_plain)
    stats = timing.time_interleaved(fns, reps=ctx.reps, warmup=ctx.warmup, flush=ctx.flusher)
    cupy.cuda.Device().synchronize()
    timed = [("ours", d, ref)] + ([("our plain GEMM", d_plain, product_ref)] if g_plain is not None else [])
    wrong_after_timing = []
    for who, out, want in timed:
        err = reference.error(out, want, metric)
        if not reference.within_bound(err, info.lib) or (exact and num_mismatches(out, want)):
            wrong_after_timing.append(f"{who}: the timed calls' output is wrong (err {err:.3e}; the first call's "
                                      "was within bound)")
    del ref, product_ref

    ours = stats["ours"]
    row.update(us=ours.median_us, us_min=ours.min_us, us_p20=ours.p20_us, us_p80=ours.p80_us,
               reps=ours.num_reps, host_us=ours.host_us, flush_us=ours.flush_us)
    row["tflops"] = metrics.tflops(m, n, k, row["us"])
    row["gbps"] = metrics.gbps(io_bytes, row["us"])
    if "plain" in stats:
        pt = stats["plain"]
        row.update(plain_us=pt.median_us, plain_us_min=pt.min_us, plain_us_p20=pt.p20_us, plain_us_p80=pt.p80_us,
                   plain_host_us=pt.host_us)
        row["plain_tflops"] = metrics.tflops(m, n, k, row["plain_us"])
        row["overhead"] = row["us"] / row["plain_us"] if row["plain_us"] else None
    if "base" in stats:
        bt = stats["base"]
        row.update(baseline_us=bt.median_us, baseline_us_min=bt.min_us, baseline_us_p20=bt.p20_us,
                   baseline_us_p80=bt.p80_us, baseline_host_us=bt.host_us)
        row["baseline_tflops"] = metrics.tflops(m, n, k, row["baseline_us"])
        row["ratio"] = row["baseline_us"] / row["us"] if row["us"] else None
    who_text = {"ours": "ours", "plain": "our plain GEMM", "base": "baseline"}
    for who, t in stats.items():
        if t.host_us > t.flush_us:
            notes.append(f"{who_text[who]} host launch {t.host_us:.0f} µs > flush "
                         f"{t.flush_us:.0f} µs: launch gaps may be in the time")
    row["status"] = "fail" if wrong_after_timing else "ok"
    row["note"] = "; ".join(x for x in wrong_after_timing + notes if x)
    if math.isfinite(row["us"]) and row["us"] <= 0:
        raise RuntimeError(f"non-positive time {row['us']}")
