"""--offline for ``python -m bench`` and ``python -m bench.moe``: compile, on a machine without a GPU, every kernel the
selected rows would build on the H200 (sm_90a, 132 SMs) into the kernel cache (``DEEPGEMM_JIT_CACHE_DIR``).

A device run spends its limited time compiling otherwise: a full FP8 MoE run timed 12 of its 42 rows in 150 s
(session 41). Compile here, carry the cache folder, copy it into the device's cache dir, and the run only times::

    DEEPGEMM_JIT_CACHE_DIR=$PWD/.carry/cache python -m bench --suite deepseek --dtype fp8_block --offline
    # on the device: mkdir -p /tmp/dgjit-cache && cp -r .carry/cache/. /tmp/dgjit-cache/

Kernel keys hash the rendered source and headers, the compile options, the NVRTC version, the arch and the package
version: compile after the last change to the templates or to what renders them, with the NVRTC the device has (13.0
on both today). The kernels are planned as ``deepgemm-jit warmup`` plans them (``warmup.plan``: the heuristic's tile
per M bucket, the decode kernels, the activations' quantize kernel, the grouped segments kernel, fp32's split kernel,
the staging copies) plus every forced ``--tiles`` config and bench.moe's quantize kernels (FP8 rows quantize BF16
activations by group, weights by block and, for torch's row-wise contender, both by row). Not covered: ``--tiles
tuned`` (tuning runs on the GPU), and tuned configs a device cache already holds (``<cache dir>/tuning``): a build
there takes them instead of the heuristic's.
"""
from __future__ import annotations

import dataclasses
import sys
from deepgemm_jit import sm90_rules

ARCH = "sm_90a"
NUM_SMS = 132  # the H200's: what build(arch=...) and warmup assume for sm_90a


def _forced(spec, m: int, n: int, k: int, tiles: str, notes: list[str]):
    """(spec, config) the GPU run would compile for a forced tile, or None ('tuned'; a tile the spec refuses is the
    GPU run's skipped row too)."""
    from deepgemm_jit import config

    from . import suites

    if tiles == "tuned":
        notes.append(f"{m}x{n}x{k} --tiles tuned: tuning runs on the GPU, not compiled here")
        return None
    try:
        cfg = (config.choose_config(spec, m, ARCH, NUM_SMS) if tiles == "auto"
               else suites.forced_tile_config(spec, tiles))
        kspec = sm90_rules.kernel_spec(spec, ARCH, m) if cfg.family == "sm90" else spec  # what build() compiles
        cfg.check_for(kspec, ARCH)
    except ValueError as exc:
        notes.append(f"{m}x{n}x{k} tile {tiles}: {exc}")
        return None
    return kspec, cfg


def dense_work(cases) -> tuple[list, list[str]]:
    """The warmup work list (``warmup.run``'s (spec, config) / (kernel spec, None) pairs) of bench cases, and notes
    on what is left out. An epilogue row also times the plain GEMM: its kernels are planned too."""
    from deepgemm_jit import warmup

    from . import dtypes as bench_dtypes

    entries, extra, notes = [], [], []  # extra: kernels warmup's plan cannot know
    for case in cases:
        for epilogue in dict.fromkeys((case.epilogue, None)):  # the plain GEMM takes the row's forced tile too
            variant = dataclasses.replace(case, epilogue=epilogue)
            spec = variant.make_spec()  # fp32 rows: the TF32 GEMM inside; warmup's TYPE is fp32 itself
            gemm_type = "fp32" if bench_dtypes.get(case.dtype).lib == "fp32" else warmup.type_text(spec)
            text = f"{case.m}:{case.n}:{case.k}:{gemm_type}:{case.layout}"
            entries.append(warmup.parse_shape(text + (f":epilogue={epilogue}" if epilogue else "")))
            if case.tiles:
                item = _forced(spec, case.m, case.n, case.k, case.tiles, notes)
                if item is not None:
                    extra.append(item)
    return _distinct(warmup.plan(entries, ARCH, NUM_SMS) + extra), notes


def quant_epilogue_work(rows) -> tuple[list, list[str]]:
    """The same for bench.quant_epilogue rows ((M, N, K, epilogue, GEMM dtype)): the fused GEMM, the GEMM without
    the quantization (and the plain one), the standalone group quantize of the unfused pair and the quantize
    kernels that make the FP8 operands."""
    from deepgemm_jit import warmup

    from . import quant_epilogue
    from .suites import Case

    cases = [Case("quant_epilogue", dt, "nt", m, n, k, epilogue=e) for m, n, k, epi, dt in rows
             for e in (epi, quant_epilogue.unfused_epilogue(epi))]
    work, notes = dense_work(cases)
    quantize = [warmup.parse_quantize(f"bf16:fp8_e4m3/{g}") for g in ("group128", "block128", "tensor")]
    return _distinct(work + warmup.plan([], ARCH, NUM_SMS, quantize)), notes


def grouped_work(cases, tiles: tuple[str, ...] = ()) -> tuple[list, list[str]]:
    """The same for bench.moe rows (``build_grouped(N, K, dtype, expected_m=rows, num_groups=groups)``), with the
    forced grouped tiles of ``--tiles``."""
    from deepgemm_jit import warmup
    from deepgemm_jit.grouped import grouped_spec

    from . import moe

    entries, extra, notes = [], [], []  # extra: kernels warmup's plan cannot know
    quantize = []
    if any(case.dtype == "fp8" for case in cases):  # bench.moe quantizes BF16 operands (_quantize_rows, _weights)
        quantize = [warmup.parse_quantize(f"bf16:fp8_e4m3/{g}") for g in ("group128", "block128", "row")]
    for case in cases:
        spec = grouped_spec(case.n, case.k, dtype=case.dtype)  # what build_grouped compiles for the row
        entries.append(warmup.parse_grouped(f"{case.groups}:{case.rows}:{case.n}:{case.k}:{warmup.type_text(spec)}"))
        for tile in tiles:
            try:
                extra.append((spec, moe.forced_config(case, tile, ARCH)))
            except ValueError as exc:
                notes.append(f"{case.tag} tile {tile}: {exc}")
    return _distinct(warmup.plan(entries, ARCH, NUM_SMS, quantize) + extra), notes


def _distinct(work: list) -> list:
    return list(dict.fromkeys(work))


def compile_work(work: list, notes: list[str], what: str, jobs: int = 2) -> int:
    """Compile `work` for sm_90a into the kernel cache; print the summary. 0 when every kernel is in the cache."""
    from deepgemm_jit import cache, warmup

    store = cache.default_cache()
    if store is None:
        print(f"{what} --offline: no disk cache to compile into (DEEPGEMM_JIT_CACHE_DIR unset and no default, or "
              "DEEPGEMM_JIT_DISABLE_DISK_CACHE set)", file=sys.stderr)
        return 2
    summary = warmup.run(work, ARCH, jobs=jobs, progress=False)
    for note in notes[:5]:
        print(f"{what} --offline: not compiled: {note}")
    if len(notes) > 5:
        print(f"{what} --offline: not compiled: {len(notes) - 5} more forced tiles or rows (as the GPU run skips them)")
    for spec, cfg, error in summary.failed:
        print(f"{what} --offline: FAILED {getattr(spec, 'tag', spec)} {getattr(cfg, 'tag', '')}: {error}",
              file=sys.stderr)
    print(f"{what} --offline: {len(work)} kernels for {ARCH} ({NUM_SMS} SMs) in {store.root}: {summary.compiled} "
          f"compiled, {summary.cached} already cached, {len(summary.failed)} failed, {summary.seconds:.1f} s")
    return 1 if summary.failed else 0
