"""One row at a time: build, check against float64, then (only if correct) time ours and the baseline.

Each row is isolated: an exception becomes the row's ``error`` and the run goes on. A sticky CUDA error (the
context is lost, e.g. an illegal address) cannot be recovered in-process: the remaining rows are marked skipped
and the run ends with what it has (rerun them with ``--only``).
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
import traceback

import cupy

from deepgemm_jit import baseline, reference, timing

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


def empty_row(case: Case) -> dict:
    return {
        "suite": case.suite, "dtype": case.dtype, "layout": case.layout, "m": case.m, "n": case.n, "k": case.k,
        "status": "error", "error": None, "note": "",
        "us": None, "us_min": None, "us_p20": None, "us_p80": None, "tflops": None, "gbps": None,
        "baseline": None, "baseline_us": None, "baseline_us_min": None, "baseline_us_p20": None,
        "baseline_us_p80": None, "baseline_tflops": None, "ratio": None,
        "err": None, "tol": reference.ERROR_BOUND[case.dtype],
        "err_metric": reference.ERROR_METRIC[case.dtype], "ref": None, "baseline_err": None,
        "poison": None, "intensity": None, "io_bytes": None, "out_dtype": None,
        "family": None, "config": None, "config_fields": None, "build_s": None, "first_call_s": None,
        "reps": None, "host_us": None, "baseline_host_us": None, "flush_us": None,
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


def run_case(case: Case, ctx: RunContext, index: int) -> dict:
    row = empty_row(case)
    if ctx.is_context_lost:
        row["status"] = "skipped"
        row["error"] = "CUDA context lost earlier in the run"
        return row
    try:
        _run_case(case, ctx, index, row)
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


def _run_case(case: Case, ctx: RunContext, index: int, row: dict) -> None:
    m, n, k = case.m, case.n, case.k
    metric = reference.ERROR_METRIC[case.dtype]

    t0 = time.perf_counter()
    spec = ctx.dg.GemmSpec.create(n, k, dtype=case.dtype, layout=case.layout)
    g = ctx.dg.build(m, n, k, dtype=case.dtype, layout=case.layout, config=case.forced_config(spec),
                     tune=case.tiles == "tuned")
    row["build_s"] = time.perf_counter() - t0
    row["family"], row["config"], row["config_fields"] = _config_strings(g)

    # ---- correctness: fresh inputs, poisoned output, float64 reference
    a, b = reference.random_operands(g.spec, m, rng=cupy.random.default_rng(ctx.seed + index))
    d = reference.poisoned(g.spec.out_shape(m), g.spec.out_dtype)
    t0 = time.perf_counter()
    g(a, b, out=d)
    cupy.cuda.Device().synchronize()
    row["first_call_s"] = time.perf_counter() - t0
    row["poison"] = "out="
    row["out_dtype"] = d.dtype.name
    row["ref"] = reference.reference_kind(g.spec, m)
    ref = reference.reference(g.spec, a, b)
    row["err"] = reference.error(d, ref, metric)
    notes = []
    if math.isnan(row["err"]):
        notes.append(f"{reference.num_nonfinite(d)} non-finite output elements (unwritten or overflow)")
    io_bytes = metrics.gemm_io_bytes(m, n, k, a.dtype.itemsize, b.dtype.itemsize, d.dtype.itemsize)
    row["io_bytes"] = io_bytes
    row["intensity"] = metrics.gemm_flops(m, n, k) / io_bytes
    if not reference.within_bound(row["err"], case.dtype):
        row["status"] = "fail"
        row["note"] = "; ".join(notes + [f"err {row['err']:.3e} > tol {row['tol']:g}: not timed"])
        return

    base, reasons = baseline.bind(g.spec, a, b, ctx.baseline_order)
    if base is not None:
        base_check = baseline.check(base, g.spec, ref)
        row["baseline_err"] = base_check.err
        if base_check.note:
            notes.append(base_check.note)
        if not base_check.is_ok:
            base = None
    else:
        notes.append("no baseline: " + "; ".join(reasons))
    del ref
    if base is not None:
        row["baseline"] = base.name

    # ---- timing, ours and the baseline interleaved
    fns = {"ours": lambda: g(a, b, out=d)}
    if base is not None:
        fns["base"] = base.fn
    if ctx.flusher is None:
        ctx.flusher = timing.L2Flusher()
    stats = timing.time_interleaved(fns, reps=ctx.reps, warmup=ctx.warmup, flush=ctx.flusher)

    ours = stats["ours"]
    row.update(us=ours.median_us, us_min=ours.min_us, us_p20=ours.p20_us, us_p80=ours.p80_us,
               reps=ours.num_reps, host_us=ours.host_us, flush_us=ours.flush_us)
    row["tflops"] = metrics.tflops(m, n, k, row["us"])
    row["gbps"] = metrics.gbps(io_bytes, row["us"])
    if "base" in stats:
        bt = stats["base"]
        row.update(baseline_us=bt.median_us, baseline_us_min=bt.min_us, baseline_us_p20=bt.p20_us,
                   baseline_us_p80=bt.p80_us, baseline_host_us=bt.host_us)
        row["baseline_tflops"] = metrics.tflops(m, n, k, row["baseline_us"])
        row["ratio"] = row["baseline_us"] / row["us"] if row["us"] else None
    for who, t in stats.items():
        if t.host_us > t.flush_us:
            notes.append(f"{'ours' if who == 'ours' else 'baseline'} host launch {t.host_us:.0f} µs > flush "
                         f"{t.flush_us:.0f} µs: launch gaps may be in the time")
    row["status"] = "ok"
    row["note"] = "; ".join(x for x in notes if x)
    if math.isfinite(row["us"]) and row["us"] <= 0:
        raise RuntimeError(f"non-positive time {row['us']}")
