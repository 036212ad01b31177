"""Pre-generation: turn a list of GEMM problems into compiled, cached kernels (``deepgemm-jit warmup``).

A problem is a spec (N, K, dtype, layout, out_dtype, fused epilogue) and the M buckets it runs at; each bucket
maps to the heuristic's config (``config.choose_config``), and every distinct (spec, config) is compiled once
through ``jit.get_kernel`` into the disk cache. An 8-bit problem with scales also brings the quantization
kernels that make its A and scale_a from bf16 activations (``activation_quantize_spec``), compiled through
``quantization.get_kernel``; ``--quantize`` adds those of any other ``quantize()`` call. A grouped problem
(``build_grouped``, mixture-of-experts) is a grouped spec and the hints it is built with: its config depends on
the expected_m bucket and on num_groups, so every (bucket, num_groups) pair maps to one config and each distinct
(spec, config) is compiled once; grouped problems also bring the m_indices -> segments kernel
(``grouped.segments_kernel``). No GPU is needed with ``--arch``.

Where problems come from and their syntax: ``warmup_sources.py`` (and ``docs/warmup.md``).

Example::

    deepgemm-jit warmup --from-hf-config examples/configs/deepseek-v3.json --arch sm_90a --jobs 2
    deepgemm-jit warmup --arch sm_90a --shape 1-16384:7168:2048:bf16 --shape 1-4096:7168:2048:fp8/block --dry-run
    deepgemm-jit warmup --arch sm_90a --quantize bf16:fp8_e4m3/block128
    deepgemm-jit warmup --arch sm_90a --grouped 256,32,8:1-4096:4096:7168:fp8/block
    deepgemm-jit warmup --arch sm_90a --shape 1-4096:28672:4096:bf16:epilogue=swiglu+quant_fp8_g128
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import multiprocessing
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from . import config as config_mod
from . import (copies, device, dtypes, env, fp32x3, gemv, gemv_kn, gemv_rows, quantization, sm90_rules, sm90_tiles,
               tuning)
from .config import KernelConfig
from .errors import DeepGemmError
from .gemv import GemvSpec
from .gemv_kn import GemvKnSpec
from .gemv_rows import GemvRowsSpec
from .grouped import DEFAULT_NUM_GROUPS
from .quantization import QuantKernelSpec
from .spec import GemmSpec

_OFFLINE = "DEEPGEMM_JIT_OFFLINE"

# The sources (and the warmup lines an offline miss prints) live in warmup_sources.py; imported here for the
# planner and kept importable from warmup, where api.py, grouped.py, quantization.py and the tests find them.
from .warmup_sources import (ACTIVATION_DTYPE, DEFAULT_M_RANGE, EP_DEGREES, M_MAX_BUCKET,
                             QUANTIZE_EXAMPLES, QUANTIZE_SYNTAX, SHAPE_SYNTAX, TYPE_EXAMPLES, TYPE_SYNTAX, GemmType,
                             WarmupEntry, _hints_text, _m_text, activation_quantize_spec, activation_quantize_specs,
                             expert_group_counts, grouped_warmup_command_for, hf_config_entries, m_buckets,
                             parse_grouped, parse_m, parse_num_groups, parse_quantize, parse_shape, parse_shapes_file,
                             parse_type, quantize_command_for, quantize_text, type_text, warmup_command_for)


# The public names: the planner's, and the sources' (importable from here as before).
__all__ = ["SegmentsKernel", "Summary", "plan_buckets", "plan_grouped", "plan_segments", "plan_quantize",
           "plan_copies", "plan_split", "plan_gemv", "plan", "kernel_type", "run", "add_parser", "main",
           "M_MAX_BUCKET", "SHAPE_SYNTAX",
           "GemmType", "WarmupEntry", "expert_group_counts", "grouped_warmup_command_for", "hf_config_entries",
           "m_buckets", "parse_grouped", "parse_m", "parse_quantize", "parse_shape", "parse_shapes_file",
           "parse_type", "quantize_command_for", "type_text", "warmup_command_for", "activation_quantize_spec",
           "activation_quantize_specs"]


@dataclass(frozen=True)
class SegmentsKernel:
    """The m_indices -> (start, end) per group kernel that grouped GEMMs called with ``m_indices=`` run first
    (``grouped.segments_kernel``): one per arch, whatever the shapes."""
    tag: str = "group_segments"


@dataclass
class Summary:
    compiled: int = 0
    cached: int = 0
    failed: list = field(default_factory=list)  # (spec, config or None for quantization kernels, error message)
    seconds: float = 0.0
    types: Counter = field(default_factory=Counter)  # kernel_type(spec) -> kernels of the run

    @property
    def total(self) -> int:
        return self.compiled + self.cached + len(self.failed)

    def line(self, arch: str) -> str:
        return (f"warmup: {self.total} kernels for {arch}{_types_note(self.types)}: compiled {self.compiled}, "
                f"already cached {self.cached}, failed {len(self.failed)} in {self.seconds:.1f} s")


def _types_note(types: Counter) -> str:
    """' (bf16)' for one type, ' (50 fp8_e4m3/block, 5 bf16)' for several, '' for none."""
    if len(types) <= 1:
        return "".join(f" ({t})" for t in types)
    return " (" + ", ".join(f"{num} {t}" for t, num in types.most_common()) + ")"


# -- plan and run ---------------------------------------------------------------------------------------
def plan_buckets(entries: list[WarmupEntry], arch: str, num_sms: int | None = None,
                 tuned: Callable[[GemmSpec, int, str], KernelConfig | None] | None = None
                 ) -> dict[tuple[GemmSpec, KernelConfig], tuple[int, ...]]:
    """(spec, config) -> the M buckets it serves, in first-seen order (plain GEMMs; grouped ones: plan_grouped).
    Where swapped tiles are weighed, a bucket stands for its 8-row steps (config.buckets_within): every M that
    m_bucket rounds to it gets its kernel, whatever M inside the bucket the entry named.
    `tuned` (a warmup for the GPU it runs on: tuning.stored_config): a bucket's stored tuned config, which that GPU's
    builds take, replaces the heuristic's. A static-scale quantizing GEMM brings its amax twin (the same config, the
    epilogue's amax word: what a call with amax_out= runs, Gemm._amax_gemm)."""
    served: dict[tuple[GemmSpec, KernelConfig], set[int]] = {}
    for entry in entries:
        if entry.spec.grouped:
            continue  # plan_grouped
        for coarse in entry.m_buckets:
            # (the 8-row buckets inside it where swapped tiles are weighed: config.m_bucket_for)
            for bucket in config_mod.buckets_within(entry.spec_at(coarse, arch), coarse, arch):
                spec = entry.spec_at(bucket, arch)
                cfg = (tuned(spec, bucket, arch) if tuned is not None else None) or config_mod.choose_config(
                    spec, bucket, arch, num_sms)
                served.setdefault((spec, cfg), set()).add(bucket)
                if spec.epi.has_static_scale and not spec.epi.amax:
                    twin = dataclasses.replace(spec, epilogue=dataclasses.replace(spec.epi, amax=True).text)
                    served.setdefault((twin, cfg), set()).add(bucket)
    return {key: tuple(sorted(b)) for key, b in served.items()}


def plan_grouped(entries: list[WarmupEntry], arch: str, num_sms: int | None = None
                 ) -> dict[tuple[GemmSpec, KernelConfig], tuple[tuple[int, int], ...]]:
    """(grouped spec, config) -> the (expected_m bucket, num_groups) hints it serves, sorted, for every pair of
    every grouped entry: the config ``build_grouped`` picks for them (``config.choose_config(spec, bucket, arch,
    num_sms, groups=G)``). Most hints share a few configs; each distinct (spec, config) appears once."""
    served: dict[tuple[GemmSpec, KernelConfig], set[tuple[int, int]]] = {}
    for entry in entries:
        if not entry.spec.grouped:
            continue
        for groups in entry.num_groups or (DEFAULT_NUM_GROUPS,):
            for bucket in entry.m_buckets:
                cfg = config_mod.choose_config(entry.spec, bucket, arch, num_sms, groups=groups)
                served.setdefault((entry.spec, cfg), set()).add((bucket, groups))
    return {key: tuple(sorted(hints)) for key, hints in served.items()}


def plan_segments(entries: list[WarmupEntry]) -> list[SegmentsKernel]:
    """The segments kernel (``m_indices=`` calls of a grouped GEMM) when any entry is grouped."""
    return [SegmentsKernel()] if any(e.spec.grouped for e in entries) else []


def plan_quantize(entries: list[WarmupEntry], extra: list[QuantKernelSpec] = ()
                  ) -> dict[QuantKernelSpec, tuple[str, ...]]:
    """Quantization kernel -> what needs it, in first-seen order: the activations' quantize kernel of every
    8-bit entry with scales (``activation_quantize_specs``) and the ``--quantize`` kernels of `extra`, each
    with the amax kernel a tensor granularity runs first."""
    needs: dict[QuantKernelSpec, list[str]] = {}
    wanted = [(spec, f"{type_text(e.spec)} activations")
              for e in entries for spec in activation_quantize_specs(e.spec)]
    wanted += [(spec, f"--quantize {quantize_text(spec)}") for spec in extra]
    for spec, why in wanted:
        if spec is None:
            continue
        for kernel in (spec, spec.amax_spec):
            if kernel is not None and why not in needs.setdefault(kernel, []):
                needs[kernel].append(why)
    return {kernel: tuple(whys) for kernel, whys in needs.items()}


def plan_gemv(entries: list[WarmupEntry], arch: str, num_sms: int | None = None
              ) -> list[GemvSpec | GemvRowsSpec | GemvKnSpec]:
    """The weight-streaming kernels of entries that run at small M (their first bucket, 64, holds M = 1..64) and
    that the decode rules take (``gemv.max_m``, ``gemv_kn.max_m``: not grouped ones, nor fused epilogues, which stay
    in the sm90 kernel at every M, nor weights the Hopper tiles stream faster): gemv's token-tile variant the rule
    uses (M <= 8), whose code does not depend on N or K, the row sweep's at M = 1 and 2 (gemv.kernel_for; its
    threads follow K), and gemv_kn's cluster size for N, K on `num_sms` SMs (None: the arch's usual count), so a model needs
    only a few."""
    found: list[GemvSpec | GemvRowsSpec | GemvKnSpec] = []
    num_sms = num_sms or sm90_tiles.DEFAULT_SM90_NUM_SMS
    for entry in entries:
        if entry.spec.grouped or not entry.m_buckets or entry.m_buckets[0] != 64:  # grouped: its own kernel always
            continue
        kernels = []
        if gemv.max_m(entry.spec, arch) > 0:
            kernels = [gemv.kernel_for(entry.spec, m, arch) for m in range(1, gemv.max_m(entry.spec, arch) + 1)]
        elif gemv_kn.max_m(entry.spec, arch, num_sms) > 0:
            kernels = [GemvKnSpec.for_gemm(entry.spec, num_sms)]
        for kernel in kernels:
            if kernel not in found:
                found.append(kernel)
    return found


def plan_copies(entries: list[WarmupEntry], arch: str) -> list[copies.CopySpec]:
    """The staging copies (copies.py) the entries' Hopper GEMMs run: the row copy where packed operands are
    misaligned (sm90_tiles.sm90_unaligned_rows) or off 32-byte sectors (sm90_tiles.sm90_off_sector_rows: calls copy one
    of them where it pays; calls on misaligned views of aligned specs load it on first use) and where a kernel
    reads an MN-major A (rows of M elements, staged by the calls whose M leaves them misaligned or off sectors: an
    M bucket holds such M), the transpose for TF32 entries with MN-major operands (sm90_rules.sm90_transposes)."""
    if arch != "sm_90a":
        return []
    plain = [e for e in entries if not e.spec.grouped]
    specs = [e.spec_at(e.m_buckets[0] if e.m_buckets else 64, arch) for e in plain]
    rows = any(sm90_tiles.sm90_unaligned_rows(s) or sm90_tiles.sm90_off_sector_rows(s) for s in specs)
    rows = rows or any(not e.spec_at(bucket, arch).a_k_major for e in plain for bucket in (e.m_buckets or (64,)))
    transposes = any(e.fp32 is None and sm90_rules.sm90_transposes(e.spec, arch, bucket)
                     for e in plain for bucket in (e.m_buckets or (None,)))
    return [copies.ROWS] * rows + [copies.CopySpec("transpose", 4)] * transposes


def plan_split(entries: list[WarmupEntry]) -> list[fp32x3.SplitKernelSpec]:
    """The 3xTF32 split kernels of fp32 entries (one per caller layout)."""
    found: list[fp32x3.SplitKernelSpec] = []
    for entry in entries:
        if entry.split_layout is not None and fp32x3.SplitKernelSpec(entry.split_layout) not in found:
            found.append(fp32x3.SplitKernelSpec(entry.split_layout))
    return found


def plan(entries: list[WarmupEntry], arch: str, num_sms: int | None = None, quantize: list[QuantKernelSpec] = ()
         ) -> list[tuple[GemmSpec, KernelConfig] | tuple[QuantKernelSpec | GemvSpec | SegmentsKernel, None]]:
    """The distinct kernels the entries need on `arch`: (spec, config) pairs of the GEMMs (heuristic choice per
    M bucket; num_sms None means the arch's usual count, as ``build(arch=...)`` assumes), then those of the
    grouped GEMMs (``plan_grouped``: choice per expected_m bucket and num_groups), then (quantization spec, None)
    for the kernels of ``plan_quantize(entries, quantize)``, then (gemv spec, None) for the decode kernels of
    ``plan_gemv``, then (SegmentsKernel(), None) when there are grouped entries, then the split kernels of fp32
    (3xTF32) entries (``plan_split``), then the staging copies (``plan_copies``)."""
    return (list(plan_buckets(entries, arch, num_sms)) + list(plan_grouped(entries, arch, num_sms))
            + [(q, None) for q in plan_quantize(entries, quantize)]
            + [(g, None) for g in plan_gemv(entries, arch, num_sms)] + [(s, None) for s in plan_segments(entries)]
            + [(s, None) for s in plan_split(entries)] + [(t, None) for t in plan_copies(entries, arch)])


def kernel_type(spec: GemmSpec | QuantKernelSpec | GemvSpec | SegmentsKernel) -> str:
    """What the counts call a kernel: its GEMM TYPE (``type_text``; ``grouped TYPE`` for grouped GEMMs; then the
    fused epilogue, if any: ``bf16 bias+gelu``), ``quantize`` for quantization kernels, ``gemv`` for the decode
    kernels, ``group_segments`` for the segments kernel."""
    if isinstance(spec, GemmSpec):
        text = f"grouped {type_text(spec)}" if spec.grouped else type_text(spec)
        text = "fp32 (3xtf32)" if spec.promoted else text
        return text if spec.epilogue == "none" else f"{text} {spec.epilogue}"
    if isinstance(spec, (SegmentsKernel, fp32x3.SplitKernelSpec, copies.CopySpec)):
        return spec.tag
    return "gemv" if isinstance(spec, (GemvSpec, GemvRowsSpec, GemvKnSpec)) else "quantize"


def _compile_one(spec: GemmSpec | QuantKernelSpec | GemvSpec | SegmentsKernel, cfg: KernelConfig | None, arch: str
                 ) -> tuple[bool, str | None]:
    """Worker: (compiled now, error message or None). Never raises, so one bad kernel fails alone. A kernel compiled
    but not saved (full disk, an unwritable kernels/ folder: the cache only warns and keeps it in memory) is a
    failure here: warming up is for the processes that come later."""
    from . import cache, grouped, jit

    try:
        if isinstance(spec, SegmentsKernel):
            art = grouped.segments_kernel(arch)
        elif isinstance(spec, fp32x3.SplitKernelSpec):
            art = fp32x3.get_kernel(spec, arch)
        elif isinstance(spec, copies.CopySpec):
            art = copies.get_kernel(spec, arch)
        elif isinstance(spec, GemvSpec):
            art = gemv.get_kernel(spec, arch)
        elif isinstance(spec, GemvKnSpec):
            art = gemv_kn.get_kernel(spec, arch)
        elif isinstance(spec, GemvRowsSpec):
            art = gemv_rows.get_kernel(spec, arch)
        elif cfg is None:
            art = quantization.get_kernel(spec, arch)
        else:
            art = jit.get_kernel(spec, cfg, arch)
        store = cache.default_cache()
        if store is None or store.load(art.key) is None:
            if art.compiled_now:
                return False, "compiled, but not saved to the disk cache (see the warning about the cache directory)"
            # found in this process's memo, built while the disk cache was off or pointed elsewhere (review,
            # session 60: it was counted as already cached)
            return False, ("in this process's memory only, not in the disk cache (built while the cache was off or "
                           "elsewhere): run warmup in a fresh process")
        return art.compiled_now, None
    except Exception as exc:  # any failure is reported per kernel in the summary
        return False, f"{type(exc).__name__}: {exc}"


def _init_worker(environ: dict[str, str]) -> None:
    # A reused forkserver/spawn parent may hold an older environment: take the caller's switches.
    for key in [k for k in os.environ if k.startswith("DEEPGEMM_JIT_")]:
        del os.environ[key]
    os.environ.update(environ)


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled
        self.start = time.perf_counter()
        self.shown = 0  # longest line so far, so that a shorter one blanks its tail

    def show(self, summary: Summary, last: str = "") -> None:
        """Rewrite the line: counts, time and `last`, the kernel that just finished (padded over the
        previous line's tail)."""
        if not self.enabled:
            return
        width = len(str(self.total))
        text = (f"[{summary.total:>{width}}/{self.total}] compiled {summary.compiled} cached {summary.cached} "
                f"failed {len(summary.failed)}  {time.perf_counter() - self.start:.1f} s")
        text += f"  {last}" if last else ""
        self.shown = max(self.shown, len(text))
        sys.stderr.write("\r" + text.ljust(self.shown))
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def run(work: list[tuple[GemmSpec, KernelConfig] | tuple[QuantKernelSpec | GemvSpec | SegmentsKernel, None]],
        arch: str, jobs: int = 1, progress: bool = True) -> Summary:
    """Compile every kernel of `work` (as ``plan`` lists them: (GemmSpec, KernelConfig), or (QuantKernelSpec,
    GemvSpec or SegmentsKernel, None)) for `arch` into the disk cache; `jobs` > 1 compiles in that many processes
    (the cache's per-key lock keeps it one compile per kernel across processes)."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    summary = Summary(types=Counter(kernel_type(spec) for spec, _ in work))
    bar = _Progress(len(work), progress)
    start = time.perf_counter()

    def record(spec, cfg, result) -> None:
        compiled_now, error = result
        if error is not None:
            summary.failed.append((spec, cfg, error))
        elif compiled_now:
            summary.compiled += 1
        else:
            summary.cached += 1
        summary.seconds = time.perf_counter() - start
        bar.show(summary, f"{kernel_type(spec)} n{spec.n} k{spec.k}" if cfg is not None else spec.tag)

    bar.show(summary)
    # Compiling is the point of warmup: DEEPGEMM_JIT_OFFLINE (set for the serving process, perhaps in the
    # same container) is lifted for this call and its workers, and restored after.
    offline = os.environ.pop(_OFFLINE, None)
    try:
        if jobs == 1 or len(work) <= 1:
            for spec, cfg in work:
                record(spec, cfg, _compile_one(spec, cfg, arch))
        else:
            environ = {k: v for k, v in os.environ.items() if k.startswith("DEEPGEMM_JIT_")}
            context = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(work)), mp_context=context,
                                                        initializer=_init_worker, initargs=(environ,)) as pool:
                futures = {pool.submit(_compile_one, spec, cfg, arch): (spec, cfg) for spec, cfg in work}
                for future in concurrent.futures.as_completed(futures):
                    spec, cfg = futures[future]
                    try:
                        result = future.result()
                    except Exception as exc:  # the worker died (killed, out of memory)
                        result = (False, f"{type(exc).__name__}: {exc}")
                    record(spec, cfg, result)
    finally:
        if offline is not None:
            os.environ[_OFFLINE] = offline
        bar.close()
    summary.seconds = time.perf_counter() - start
    return summary


# -- command line -----------------------------------------------------------------------------------------
def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``warmup`` on an argparse subparsers object (sets ``fn=main``)."""
    w = subparsers.add_parser("warmup", help="pre-generate kernels into the cache (no GPU needed with --arch)",
                              description=__doc__.split("\n\n")[0])
    w.add_argument("shapes_file", nargs="?", help="JSON shapes file (format: docs/warmup.md)")
    w.add_argument("--from-hf-config", action="append", default=[], metavar="PATH",
                   help="a Hugging Face config.json: every weight GEMM of the model, and the routed experts of a MoE "
                        "model as grouped GEMMs (repeatable)")
    w.add_argument("--shape", action="append", default=[], metavar="M:N:K:TYPE[:LAYOUT[:OUT]][:epilogue=EPI]",
                   help=f"one problem, M one value or lo-hi, TYPE {TYPE_SYNTAX} ({TYPE_EXAMPLES}), EPI a fused "
                        "epilogue as build() takes it (bias+gelu, swiglu+quant_fp8_g128) (repeatable)")
    w.add_argument("--grouped", action="append", default=[], metavar="G:M:N:K:TYPE[:OUT][:epilogue=EPI]",
                   help="one grouped GEMM (build_grouped) with num_groups G (one value or a comma list) and "
                        "expected_m M (one value or lo-hi), TYPE bf16, fp16 or fp8/block, EPI a fused epilogue "
                        "(bias+swiglu) (repeatable)")
    w.add_argument("--quantize", action="append", default=[], metavar=QUANTIZE_SYNTAX,
                   help=f"the kernels of one quantize() call ({QUANTIZE_EXAMPLES}) (repeatable); 8-bit GEMMs with "
                        f"scales already bring their {ACTIVATION_DTYPE} activations' kernels")
    w.add_argument("--dtype", default=None, metavar="TYPE[,TYPE...]",
                   help="types for --from-hf-config, comma separated TYPEs as in --shape (bf16,fp8/block); default: "
                        "the model's own, fp8_e4m3/block for the quantized layers of an FP8 block-quantized "
                        "checkpoint (bf16 for the rest), bf16 for other models")
    w.add_argument("--m", default=None,
                   help="M range lo-hi for --from-hf-config (default 1-16384); also the expected_m range of its "
                        "grouped expert GEMMs")
    w.add_argument("--num-groups", default=None, metavar="G[,G...]|auto|none",
                   help="num_groups hints of the grouped expert GEMMs of --from-hf-config MoE models (comma "
                        "separated); auto (default): the expert count, its shares under expert parallelism "
                        f"{'/'.join(map(str, EP_DEGREES))}, {DEFAULT_NUM_GROUPS} and 1; none: no grouped kernels")
    w.add_argument("--arch", default=None, help="target, e.g. sm_90a (default: the GPU's; required without one)")
    w.add_argument("--num-sms", type=int, default=None, metavar="N",
                   help="plan the tiles for a GPU of N SMs (default: the GPU's own, or the arch's usual count with "
                        "--arch: 132 for sm_90a); offline misses on GPUs of other counts print it")
    w.add_argument("--jobs", type=int, default=1, help="compile in N processes (default 1)")
    w.add_argument("--dry-run", action="store_true", help="print the plan, compile nothing")
    w.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress line on stderr (default: when stderr is a terminal)")
    w.set_defaults(fn=main)
    return w


def _entries(args) -> list[WarmupEntry]:
    entries = parse_shapes_file(args.shapes_file) if args.shapes_file else []
    entries += [parse_shape(text) for text in args.shape]
    entries += [parse_grouped(text) for text in args.grouped]
    given = [f"--{name.replace('_', '-')}" for name in ("dtype", "m", "num_groups") if getattr(args, name) is not None]
    if given and not args.from_hf_config:  # they shape a model's entries; --shape / --grouped spell their own
        raise ValueError(f"{', '.join(given)} apply to --from-hf-config, which is not given; --shape and --grouped "
                         "carry their own M and TYPE")
    type_names = None if args.dtype is None else [d.strip() for d in args.dtype.split(",") if d.strip()]
    if type_names == []:
        raise ValueError(f"--dtype {args.dtype!r} names no type")
    try:
        m_range = parse_m(args.m if args.m is not None else f"{DEFAULT_M_RANGE[0]}-{DEFAULT_M_RANGE[1]}")
    except ValueError as exc:
        raise ValueError(f"--m {args.m}: {exc}") from None
    choice = (args.num_groups or "auto").strip().lower()
    try:
        num_groups = None if choice == "auto" else () if choice == "none" else parse_num_groups(choice)
    except ValueError as exc:
        raise ValueError(f"--num-groups: {exc} (or auto, none)") from None
    for path in args.from_hf_config:
        entries += hf_config_entries(path, type_names, m_range, num_groups)
    if not entries and not args.quantize:
        raise ValueError("nothing to warm up: give a shapes file, --shape, --grouped, --from-hf-config or "
                         "--quantize")
    return entries


def _target(arch: str | None, num_sms: int | None = None) -> tuple[str, int | None]:
    """(arch, num_sms for the heuristic): the given arch with `num_sms` (None: the arch's usual count), or the GPU's
    own arch with `num_sms` or its own count."""
    if num_sms is not None and num_sms < 1:  # argparse made it an int
        raise ValueError(f"--num-sms must be a positive integer, got {num_sms!r}")
    if arch is not None:
        return device.normalize_arch(arch), num_sms
    if device.gpu_count() == 0:
        raise ValueError("no CUDA GPU found: pass --arch (e.g. --arch sm_90a) to pre-generate kernels for it")
    return device.current_arch(), num_sms or device.num_sms()


def _check_cache_writable() -> None:
    """Refuse to compile what the disk cache would not keep: without it, the library falls back to compiling in
    memory (build's right behaviour, warmup's whole point lost) and every kernel would read as compiled."""
    if env.disk_cache_disabled():
        raise ValueError("DEEPGEMM_JIT_DISABLE_DISK_CACHE is set: warmup fills the disk cache; unset it")
    root = env.cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".warmup-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"the cache directory {root} is not writable ({exc}); set DEEPGEMM_JIT_CACHE_DIR to a "
                         "writable directory") from None


def _check_quantize_arch(quantize: dict, arch: str) -> None:
    """FP8 conversions need sm_89 or newer (quantize() refuses older GPUs the same way): a plan for an older arch
    failed in NVRTC instead (review, session 60)."""
    fp8 = sorted({q.q_dtype for q in quantize if q.q_dtype in dtypes.FP8_DTYPES})
    if fp8 and device.arch_number(arch) < quantization.FP8_CONVERSIONS_MIN_ARCH:
        raise ValueError(f"{', '.join(fp8)} quantization needs sm_89 or newer (FP8 conversions); --arch {arch} "
                         "cannot run it: drop the FP8 --quantize / FP8 entries, or target sm_89 / sm_90a")


def main(args: argparse.Namespace) -> int:
    """Run ``warmup`` for parsed arguments: 0 when every kernel is in the cache, 1 when any failed."""
    arch, num_sms = _target(args.arch, args.num_sms)
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    entries = _entries(args)
    # On the GPU itself, the configs its builds will take: tuned ones where the store has them (tune=True runs). A
    # plan for another GPU (--arch, or --num-sms other than this one's) has no store to ask: its builds find none.
    this_gpu = args.arch is None and args.num_sms in (None, device.num_sms())
    served = plan_buckets(entries, arch, num_sms, tuning.stored_config if this_gpu else None)
    try:
        grouped = plan_grouped(entries, arch, num_sms)
    except ValueError as exc:  # a model's experts (--num-groups auto) on a GPU without grouped GEMMs: say the way out
        if not args.from_hf_config:
            raise
        raise ValueError(f"{exc}; --from-hf-config plans the experts as grouped GEMMs (--num-groups auto): pass "
                         "--num-groups none to plan them as dense GEMMs only") from None
    quantize = plan_quantize(entries, [parse_quantize(text) for text in args.quantize])
    _check_quantize_arch(quantize, arch)
    decode = plan_gemv(entries, arch, num_sms)
    segments = plan_segments(entries)
    # fp32 entries' split kernels and the staging copies (plan() lists the same; before session 25 the command left
    # the split kernels out, so an offline fp32 build found none cached)
    helpers = plan_split(entries) + plan_copies(entries, arch)
    work = (list(served) + list(grouped) + [(spec, None) for spec in quantize] + [(spec, None) for spec in decode]
            + [(spec, None) for spec in segments] + [(spec, None) for spec in helpers])
    if args.dry_run:
        for (spec, cfg), buckets in served.items():
            print(f"{spec.tag:44s} {cfg.tag:32s} M buckets {_m_text(buckets)}")
        for (spec, cfg), hints in grouped.items():
            print(f"{spec.tag:44s} {cfg.tag:32s} {_hints_text(hints)}")
        for spec, whys in quantize.items():
            print(f"{spec.tag:77s} for {', '.join(whys)}")
        for spec in decode:  # the row sweep is compiled per M; the others serve every M up to theirs
            rows = f"M = {spec.tokens}" if isinstance(spec, GemvRowsSpec) else f"M <= {spec.max_m}"
            print(f"{spec.tag:77s} for {rows} (decode)")
        for spec in segments:
            print(f"{spec.tag:77s} for grouped GEMMs called with m_indices=")
        for spec in helpers:
            print(f"{spec.tag:77s} for " + ("fp32 (3xTF32) GEMMs" if isinstance(spec, fp32x3.SplitKernelSpec)
                                            else "staged operands (copies.py)"))
        types = Counter(kernel_type(spec) for spec, _ in work)
        print(f"warmup plan: {len(work)} kernels for {arch}{_types_note(types)}; dry run, nothing compiled")
        return 0
    _check_cache_writable()
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    summary = run(work, arch, jobs=args.jobs, progress=progress)
    for spec, cfg, error in summary.failed:
        tags = f"{spec.tag} {cfg.tag}" if cfg is not None else spec.tag
        print(f"FAILED {tags}: {error.splitlines()[0] if error else '?'}", file=sys.stderr)
    print(summary.line(arch))
    return 0 if not summary.failed else 1


def _standalone(argv: list[str] | None = None) -> int:
    """``python -m deepgemm_jit.warmup ...`` (the same options as ``deepgemm-jit warmup``)."""
    parser = argparse.ArgumentParser(prog="python -m deepgemm_jit")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["warmup", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.fn(args)
    except (DeepGemmError, ValueError, TypeError) as exc:  # as cli.main reports them
        print(f"deepgemm-jit: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(_standalone())
