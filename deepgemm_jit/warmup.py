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

Where problems come from (the format in full: ``docs/warmup.md``):

- a shapes file, JSON::

      {"gemms": [
        {"n": 7168, "k": 2048, "dtype": "bf16", "layout": "nt", "out_dtype": null, "m": [1, 16384]},
        {"n": 4096, "k": 7168, "m_values": [1, 64, 4096], "name": "experts.gate_up"},
        {"n": 7168, "k": 2048, "dtype": "fp8_e4m3", "scaling": "block", "m": [1, 4096]}
      ]}

  ``n`` and ``k`` are required; ``dtype`` (any of ``dtypes.INPUT_DTYPES``, default bf16), ``b_dtype``
  (null: as dtype), ``scaling`` (null: fp8 block, int8 none), ``fast_accum`` (false), ``layout`` (nt),
  ``out_dtype`` (null: ``GemmSpec.create``'s default) as in ``build()``. ``m`` is an inclusive range
  ``[lo, hi]`` (default ``[1, 16384]``) or one integer; ``m_values`` (instead of ``m``) lists single M
  values. Either becomes the M buckets it touches (``config.m_bucket``: powers of two in [64, 16384];
  every M of a bucket shares one kernel). ``name`` is a free label. ``epilogue`` (null: none) is the fused
  epilogue of ``build(..., epilogue=...)`` (``"bias+gelu"``, ``"swiglu+quant_fp8_g128"``; words of
  ``epilogue.py``, any order, kept in canonical form). ``"grouped": true`` makes the entry a grouped GEMM
  (``build_grouped(n, k, ...)``, layout nt, bf16 / fp16 / fp8 block): ``m`` / ``m_values`` are then its
  ``expected_m`` hints (rows per group) and ``num_groups`` (one integer or a list; default
  ``grouped.DEFAULT_NUM_GROUPS``, 8, what ``build_grouped`` assumes) its ``num_groups`` hints; ``num_groups``
  without ``grouped`` is refused. Unknown keys are refused.
- ``--shape M:N:K:TYPE[:layout[:out_dtype]][:epilogue=EPI]``, M one value or ``lo-hi`` (repeatable), TYPE
  ``dtype[xb_dtype][/scaling][+fast_accum]`` (``bf16``, ``fp8/block``, ``fp8/tensor+fast_accum``,
  ``int8/row``, ``fp8_e4m3xfp8_e5m2/tensor``), EPI a fused epilogue (``bias+gelu``; a keyed last field, so
  layout and out_dtype may be left out before it); this is the line ``warmup_command_for`` writes for a
  kernel missing from the cache.
- ``--grouped G:M:N:K:TYPE[:out_dtype][:epilogue=EPI]`` (repeatable): one grouped GEMM, ``build_grouped(N, K,
  TYPE, expected_m=M, num_groups=G, epilogue=EPI)``; M one value or lo-hi (expected_m buckets), G one value or a
  comma list; the line ``grouped_warmup_command_for`` writes.
- ``--from-hf-config config.json``: every weight GEMM of the model (``model_shapes.gemm_shapes``), for
  each ``--dtype`` TYPE and the ``--m`` range; without ``--dtype``, FP8 block-quantized checkpoints
  (``model_shapes.weight_quantization``) get ``fp8_e4m3/block`` for their quantized layers and bf16 for
  the rest (lm_head), other models bf16. MoE models also get their routed experts as grouped GEMMs
  (``model_shapes.expert_gemms``) in those of the types grouped GEMMs take (bf16, fp16, fp8 block), with the
  ``--m`` buckets as expected_m and ``--num-groups`` (default ``expert_group_counts``: the expert count, its
  shares under expert parallelism 2..32, 8 and 1) as num_groups.
- ``--quantize SRC:DTYPE/GRANULARITY[:vN]`` (repeatable): the kernels of one ``quantize()`` call
  (``bf16:fp8_e4m3/group128``, ``fp16:int8/row``, ``bf16:fp8/tensor:v4``; ``parse_quantize``); this is the
  line ``quantize_command_for`` writes for a quantization kernel missing from the cache.

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
import json
import multiprocessing
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import config as config_mod
from . import device, dtypes, gemv, model_shapes, quantization
from . import epilogue as epilogue_mod
from .config import KernelConfig
from .errors import DeepGemmError
from .gemv import GemvSpec
from .grouped import DEFAULT_NUM_GROUPS
from .quantization import QuantKernelSpec
from .spec import GemmSpec

M_MAX_BUCKET = 16384
DEFAULT_M_RANGE = (1, M_MAX_BUCKET)
TYPE_SYNTAX = "dtype[xb_dtype][/scaling][+fast_accum]"
EPILOGUE_FIELD = "epilogue="  # the keyed last field of --shape and --grouped: epilogue=bias+gelu
SHAPE_SYNTAX = (f"M:N:K:TYPE[:layout[:out_dtype]][:{EPILOGUE_FIELD}EPI] (M one value or lo-hi, TYPE {TYPE_SYNTAX}, "
                "EPI a fused epilogue such as bias+gelu)")
TYPE_EXAMPLES = "bf16, fp8/block, fp8/tensor+fast_accum, int8/row, fp8_e4m3xfp8_e5m2/tensor"
_FILE_KEYS = {"n", "k", "dtype", "b_dtype", "scaling", "fast_accum", "layout", "out_dtype", "m", "m_values", "name",
              "grouped", "num_groups", "epilogue"}
GROUPED_SYNTAX = (f"G:M:N:K:TYPE[:out_dtype][:{EPILOGUE_FIELD}EPI] (G one value or a comma list, M one value or "
                  "lo-hi)")
# Expert-parallel degrees whose share of a model's experts (experts / degree, where it divides) is a num_groups
# hint --from-hf-config covers (expert_group_counts).
EP_DEGREES = (2, 4, 8, 16, 32)
_OFFLINE = "DEEPGEMM_JIT_OFFLINE"
QUANTIZE_SYNTAX = "SRC:DTYPE/GRANULARITY[:vN]"
QUANTIZE_EXAMPLES = "bf16:fp8_e4m3/group128, bf16:int8/row, fp16:fp8/tensor:v4"
ACTIVATION_DTYPE = "bf16"  # what an 8-bit GEMM entry's activations are quantized from


@dataclass(frozen=True)
class WarmupEntry:
    """One problem to pre-generate: a spec and the M buckets it runs at. A grouped spec (``spec.grouped``) is
    built with ``build_grouped``'s hints: `m_buckets` are its expected_m buckets and `num_groups` its num_groups
    hints (every pair is covered); `num_groups` is empty for other specs."""
    spec: GemmSpec
    m_buckets: tuple[int, ...]
    source: str = ""  # where it came from, for messages ("shapes.json #3", "--shape ...", a model row)
    num_groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class GemmType:
    """The TYPE of ``--shape`` and ``--dtype``: what a spec says besides N, K, layout and out_dtype.

    None fields take ``GemmSpec.create``'s defaults (b_dtype: as dtype; scaling: fp8 block, int8 none).
    """
    dtype: str
    b_dtype: str | None = None
    scaling: str | None = None
    fast_accum: bool = False

    def spec(self, n: int, k: int, out_dtype: str | None = None, layout: str = "nt", grouped: bool = False,
             epilogue: str | None = None) -> GemmSpec:
        return GemmSpec.create(n, k, self.dtype, out_dtype, layout, b_dtype=self.b_dtype, scaling=self.scaling,
                               fast_accum=self.fast_accum, epilogue=epilogue, grouped=grouped)


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


# -- M ranges -----------------------------------------------------------------------------------------
def m_buckets(lo: int, hi: int) -> tuple[int, ...]:
    """The buckets every M in [lo, hi] falls in: (64, 128, ...) up to m_bucket(hi)."""
    for name, value in (("lo", lo), ("hi", hi)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"M range {name} must be a positive integer, got {value!r}")
    if lo > hi:
        raise ValueError(f"M range [{lo}, {hi}] is empty (lo > hi)")
    buckets, bucket = [], config_mod.m_bucket(lo)
    last = config_mod.m_bucket(hi)
    while bucket <= last:
        buckets.append(bucket)
        bucket *= 2
    return tuple(buckets)


def parse_m(text: str) -> tuple[int, ...]:
    """'4096' -> (4096's bucket,); '1-16384' -> every bucket of the range."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if match is None:
        raise ValueError(f"M={text!r}: write one value (4096) or a range lo-hi (1-16384)")
    lo = int(match.group(1))
    return m_buckets(lo, int(match.group(2)) if match.group(2) else lo)


def _m_text(buckets: tuple[int, ...]) -> str:
    return ",".join(str(b) for b in buckets)


def _hints_text(hints: tuple[tuple[int, int], ...]) -> str:
    """(bucket, num_groups) pairs, num_groups sharing the same buckets together: 'G 256,128 at M 64,128; G 8 at
    M 4096'."""
    by_groups: dict[int, list[int]] = {}
    for bucket, groups in hints:
        by_groups.setdefault(groups, []).append(bucket)
    together: dict[tuple[int, ...], list[int]] = {}
    for groups in sorted(by_groups, reverse=True):
        together.setdefault(tuple(by_groups[groups]), []).append(groups)
    return "; ".join(f"G {_m_text(tuple(gs))} at M {_m_text(bs)}" for bs, gs in together.items())


# -- sources ------------------------------------------------------------------------------------------
def parse_type(text: str) -> GemmType:
    """A TYPE ``dtype[xb_dtype][/scaling][+fast_accum]`` -> GemmType (names checked, combinations not:
    ``GemmType.spec`` checks those). ``"fp8/tensor+fast_accum"`` -> ``GemmType("fp8_e4m3", None,
    "tensor", True)``; ValueError for a malformed TYPE or an unknown name."""
    if not isinstance(text, str):
        raise TypeError(f"TYPE must be a string such as 'fp8/block', got {type(text).__name__}")
    rest, plus, modifier = text.strip().lower().partition("+")
    rest, slash, scaling = rest.partition("/")
    a, times, b = rest.partition("x")
    if (plus and modifier != "fast_accum") or (slash and not scaling) or (times and not b):
        raise ValueError(f"TYPE {text!r}: write {TYPE_SYNTAX} (+fast_accum is the only modifier), e.g. "
                         f"{TYPE_EXAMPLES}")
    allowed = dtypes.INPUT_DTYPES
    return GemmType(dtype=dtypes.canonical(a, arg="dtype", allowed=allowed),
                    b_dtype=dtypes.canonical(b, arg="b_dtype", allowed=allowed) if times else None,
                    scaling=scaling if slash else None, fast_accum=bool(plus))


def type_text(spec: GemmSpec) -> str:
    """The TYPE that gives back `spec`'s types, scaling and accumulation (``parse_type`` reads it):
    ``"bf16"``, ``"fp8_e4m3/block"``, ``"fp8_e4m3xfp8_e5m2/tensor+fast_accum"``, ``"int8"`` (unscaled)."""
    text = spec.dtype if spec.b_dtype == spec.dtype else f"{spec.dtype}x{spec.b_dtype}"
    if spec.scaling != "none":
        text += f"/{spec.scaling}"
    return text + ("+fast_accum" if spec.fast_accum else "")


def _split_epilogue(parts: list[str], where: str, syntax: str) -> tuple[list[str], str]:
    """The positional fields of a ``--shape`` / ``--grouped`` text and its epilogue: the keyed last field
    ``epilogue=EPI`` (canonical, ``epilogue.canonical``), 'none' without one. ``["64", "8", "8", "bf16",
    "epilogue=gelu+bias"]`` -> ``(["64", "8", "8", "bf16"], "bias+gelu")``."""
    keyed = [i for i, part in enumerate(parts) if "=" in part]
    if not keyed:
        return parts, "none"
    key, _, value = parts[keyed[0]].partition("=")
    if key.strip().lower() != EPILOGUE_FIELD[:-1]:
        raise ValueError(f"{where}: unknown field {parts[keyed[0]]!r}; the one keyed field is {EPILOGUE_FIELD}EPI "
                         f"({syntax})")
    if keyed != [len(parts) - 1]:
        raise ValueError(f"{where}: {EPILOGUE_FIELD}EPI must be the last field, once ({syntax})")
    if not value.strip():
        raise ValueError(f"{where}: {EPILOGUE_FIELD} names no epilogue (e.g. {EPILOGUE_FIELD}bias+gelu)")
    try:
        return parts[:-1], epilogue_mod.canonical(value.strip())
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def _epilogue_field(spec: GemmSpec) -> list[str]:
    """The keyed ``epilogue=EPI`` field that gives back `spec`'s epilogue (none for a plain store)."""
    return [] if spec.epilogue == "none" else [f"{EPILOGUE_FIELD}{spec.epilogue}"]


def parse_shape(text: str) -> WarmupEntry:
    """One ``--shape M:N:K:TYPE[:layout[:out_dtype]][:epilogue=EPI]`` (M may be lo-hi; TYPE as ``parse_type``;
    EPI a fused epilogue as ``build(..., epilogue=...)`` takes it) -> a WarmupEntry.
    ``"1-4096:7168:2048:fp8/block"``: FP8 E4M3, 128x128 block scales, bf16 out, M buckets 64..4096;
    ``"1-4096:7168:2048:bf16:epilogue=bias+gelu"``: the same shape in bf16 with bias and GELU fused.
    """
    where = f"--shape {text}"
    parts, epilogue = _split_epilogue(text.strip().split(":"), where, SHAPE_SYNTAX)
    if not 4 <= len(parts) <= 6:
        raise ValueError(f"--shape {text!r}: expected {SHAPE_SYNTAX}, e.g. 1-16384:7168:2048:bf16 or "
                         "1-4096:7168:2048:fp8/block")
    try:
        n, k = int(parts[1]), int(parts[2])
    except ValueError:
        raise ValueError(f"{where}: N and K must be integers ({SHAPE_SYNTAX})") from None
    layout = parts[4] if len(parts) > 4 else "nt"
    out_dtype = parts[5] if len(parts) > 5 else None
    try:
        spec = parse_type(parts[3]).spec(n, k, out_dtype, layout, epilogue=epilogue)
        buckets = parse_m(parts[0])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    return WarmupEntry(spec=spec, m_buckets=buckets, source=where)


def warmup_command_for(spec: GemmSpec, m_hint: int, arch: str) -> str:
    """The one ``deepgemm-jit warmup`` line that compiles the kernel `build()` picks for (spec, M, arch):
    its ``--shape`` gives back exactly `spec` (types, scaling, fast_accum, layout, out_dtype, fused epilogue).

    Example: ``warmup_command_for(GemmSpec.create(7168, 2048, "fp8"), 4096, "sm_90a")`` ->
    ``"deepgemm-jit warmup --arch sm_90a --shape 4096:7168:2048:fp8_e4m3/block"``;
    ``warmup_command_for(GemmSpec.create(7168, 2048, epilogue="gelu+bias"), 4096, "sm_90a")`` ->
    ``"deepgemm-jit warmup --arch sm_90a --shape 4096:7168:2048:bf16:epilogue=bias+gelu"``.
    """
    fields = [str(m_hint), str(spec.n), str(spec.k), type_text(spec)]
    default_out = GemmSpec.create(spec.n, spec.k, spec.dtype, None, spec.layout, b_dtype=spec.b_dtype,
                                  scaling=spec.scaling, fast_accum=spec.fast_accum, epilogue=spec.epilogue).out_dtype
    if spec.out_dtype != default_out:
        fields += [spec.layout, spec.out_dtype]
    elif spec.layout != "nt":
        fields.append(spec.layout)
    fields += _epilogue_field(spec)
    return f"deepgemm-jit warmup --arch {arch} --shape {':'.join(fields)}"


def expert_group_counts(num_experts: int) -> tuple[int, ...]:
    """The num_groups hints ``--from-hf-config`` covers for a MoE layer of `num_experts` routed experts, largest
    first: all of them (one GPU), their share on each expert-parallel degree of ``EP_DEGREES`` that divides them,
    ``grouped.DEFAULT_NUM_GROUPS`` (what ``build_grouped`` assumes without a hint) and 1.
    ``expert_group_counts(256)`` -> ``(256, 128, 64, 32, 16, 8, 1)``; ``expert_group_counts(8)`` -> ``(8, 4, 2, 1)``.
    """
    counts = {num_experts, DEFAULT_NUM_GROUPS, 1}
    counts.update(num_experts // d for d in EP_DEGREES if num_experts % d == 0)
    return tuple(sorted(counts, reverse=True))


def parse_num_groups(text: str) -> tuple[int, ...]:
    """'256,32,8' -> (256, 32, 8): positive integers, in order, each once."""
    values = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"num_groups {text!r}: expected positive integers separated by commas (256,32,8)")
        if int(part) not in values:
            values.append(int(part))
    return tuple(values)


def _check_num_groups(values: object, where: str) -> tuple[int, ...]:
    if isinstance(values, int) and not isinstance(values, bool):
        values = [values]
    if (not isinstance(values, list) or not values
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values)):
        raise ValueError(f"{where}: num_groups must be a positive integer or a non-empty list of them, got {values!r}")
    return tuple(dict.fromkeys(values))


def parse_grouped(text: str) -> WarmupEntry:
    """One ``--grouped G:M:N:K:TYPE[:out_dtype][:epilogue=EPI]`` -> a grouped WarmupEntry: ``build_grouped(N, K,
    TYPE, out_dtype, expected_m=M, num_groups=G, epilogue=EPI)`` for every M bucket of M (one value or lo-hi) and
    every G of the comma list. ``"256,32:1-4096:4096:7168:fp8/block"``: FP8 E4M3 block scales, expected_m buckets
    64..4096, 256 or 32 groups; ``"8:512:4096:7168:bf16:epilogue=bias+swiglu"``: bf16 experts with the gated unit
    fused (D has N / 2 columns)."""
    where = f"--grouped {text}"
    parts, epilogue = _split_epilogue(text.strip().split(":"), where, GROUPED_SYNTAX)
    if not 5 <= len(parts) <= 6:
        raise ValueError(f"{where}: expected {GROUPED_SYNTAX}, e.g. 256,32,8:1-4096:4096:7168:bf16")
    try:
        n, k = int(parts[2]), int(parts[3])
    except ValueError:
        raise ValueError(f"{where}: N and K must be integers ({GROUPED_SYNTAX})") from None
    try:
        groups = parse_num_groups(parts[0])
        spec = parse_type(parts[4]).spec(n, k, parts[5] if len(parts) > 5 else None, grouped=True,
                                         epilogue=epilogue)
        buckets = parse_m(parts[1])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    return WarmupEntry(spec=spec, m_buckets=buckets, source=where, num_groups=groups)


def grouped_warmup_command_for(spec: GemmSpec, expected_m: int, num_groups: int, arch: str) -> str:
    """The ``deepgemm-jit warmup`` line that compiles the kernel ``build_grouped`` picks for (spec, expected_m,
    num_groups, arch) (and the segments kernel and, for FP8, the activations' quantize kernel a call needs); its
    ``--grouped`` gives back exactly `spec`, fused epilogue included.

    Example: ``grouped_warmup_command_for(GemmSpec.create(4096, 7168, "fp8", grouped=True), 300, 32, "sm_90a")``
    -> ``"deepgemm-jit warmup --arch sm_90a --grouped 32:300:4096:7168:fp8_e4m3/block"``; with
    ``epilogue="bias+swiglu"`` the line ends in ``:epilogue=bias+swiglu``.
    """
    if not spec.grouped:
        raise ValueError(f"{spec.tag} is not a grouped spec (warmup_command_for writes the line of a plain GEMM)")
    fields = [str(num_groups), str(expected_m), str(spec.n), str(spec.k), type_text(spec)]
    default_out = GemmSpec.create(spec.n, spec.k, spec.dtype, None, b_dtype=spec.b_dtype, scaling=spec.scaling,
                                  epilogue=spec.epilogue, grouped=True).out_dtype
    if spec.out_dtype != default_out:
        fields.append(spec.out_dtype)
    fields += _epilogue_field(spec)
    return f"deepgemm-jit warmup --arch {arch} --grouped {':'.join(fields)}"


def parse_quantize(text: str) -> QuantKernelSpec:
    """One ``--quantize SRC:DTYPE/GRANULARITY[:vN]`` -> the quantize kernel of that ``quantize()`` call: x of
    dtype SRC (bf16, fp16, fp32) to DTYPE (fp8_e4m3 = fp8, fp8_e5m2, int8) with GRANULARITY scales (tensor,
    row, group128, block128), loading N elements at a time (default: 16 bytes, what rows at 16-byte aligned
    addresses allow, ``quantization.full_vec``). ``"bf16:fp8/group128"`` -> ``QuantKernelSpec("quantize",
    "bf16", "fp8_e4m3", "group128", 8)``; ValueError naming the option for anything malformed."""
    where = f"--quantize {text}"
    parts = text.strip().lower().split(":")
    vec_match = re.fullmatch(r"v(\d+)", parts[2]) if len(parts) == 3 else None
    q_name, slash, granularity = parts[1].partition("/") if len(parts) > 1 else ("", "", "")
    if len(parts) not in (2, 3) or not slash or (len(parts) == 3 and vec_match is None):
        raise ValueError(f"{where}: expected {QUANTIZE_SYNTAX}, e.g. {QUANTIZE_EXAMPLES}")
    try:
        src = dtypes.canonical(parts[0], arg="SRC", allowed=quantization.SOURCE_DTYPES)
        q_name = dtypes.canonical(q_name, arg="DTYPE", allowed=quantization.QUANT_DTYPES)
        vec = int(vec_match.group(1)) if vec_match else quantization.full_vec(src)
        return QuantKernelSpec("quantize", src, q_name, quantization.check_granularity(granularity, q_name), vec)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def quantize_text(spec: QuantKernelSpec) -> str:
    """The ``--quantize`` text of a quantize kernel (``parse_quantize`` gives `spec` back); ``:vN`` only where
    the width is not the 16-byte default."""
    text = f"{spec.src_dtype}:{spec.q_dtype}/{spec.granularity}"
    return text if spec.vec == quantization.full_vec(spec.src_dtype) else f"{text}:v{spec.vec}"


def quantize_command_for(spec: QuantKernelSpec, arch: str) -> str:
    """The ``deepgemm-jit warmup`` line that compiles the kernels of one ``quantize()`` call (`spec`, and the
    amax kernel before it for granularity tensor), the line an offline miss of either names.

    Example: ``quantize_command_for(QuantKernelSpec("quantize", "bf16", "fp8_e4m3", "group128", 8), "sm_90a")``
    -> ``"deepgemm-jit warmup --arch sm_90a --quantize bf16:fp8_e4m3/group128"``.
    """
    return f"deepgemm-jit warmup --arch {arch} --quantize {quantize_text(spec)}"


def activation_quantize_spec(spec: GemmSpec) -> QuantKernelSpec | None:
    """The quantize kernel that turns bf16 activations into A and scale_a of an 8-bit GEMM with scales (None
    without scales: bf16/fp16/tf32 and unscaled int8): A's dtype, the granularity of ``spec.scaling``
    (``quantization.ACTIVATION_GRANULARITY``: block -> group128, row -> row, tensor -> tensor), and the load
    width of contiguous (M, K) rows at a 16-byte aligned address (8 when K % 8 == 0)."""
    if spec.scaling == "none":
        return None
    vec = config_mod.max_vector(dtypes.get(ACTIVATION_DTYPE).storage_bytes, 0, spec.k, 2)
    return QuantKernelSpec("quantize", ACTIVATION_DTYPE, spec.dtype,
                           quantization.ACTIVATION_GRANULARITY[spec.scaling], vec)


def parse_shapes_file(path: str | Path) -> list[WarmupEntry]:
    """The entries of a shapes file (format in the module docstring); ValueError naming the entry."""
    path = Path(path)
    doc = _read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("gemms"), list):
        raise ValueError(f'{path}: expected an object {{"gemms": [...]}}')
    return [_file_entry(item, f"{path} gemms[{i}]") for i, item in enumerate(doc["gemms"])]


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


def _file_entry(item: object, where: str) -> WarmupEntry:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: each gemm is an object with at least n and k")
    unknown = sorted(set(item) - _FILE_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {sorted(_FILE_KEYS)}")
    epilogue = item.get("epilogue")
    if epilogue is not None and not isinstance(epilogue, str):
        raise ValueError(f"{where}: epilogue must be a string such as \"bias+gelu\" (or null), got {epilogue!r}")
    for key in ("n", "k"):
        if key not in item:
            raise ValueError(f"{where}: missing {key!r}")
    if "m" in item and "m_values" in item:
        raise ValueError(f"{where}: give either m ([lo, hi] or one value) or m_values, not both")
    if "m_values" in item:
        values = item["m_values"]
        if not isinstance(values, list) or not values:
            raise ValueError(f"{where}: m_values must be a non-empty list of M values")
        buckets = tuple(sorted({b for v in values for b in m_buckets(v, v)}))
    else:
        m = item.get("m", list(DEFAULT_M_RANGE))
        if isinstance(m, int) and not isinstance(m, bool):
            buckets = m_buckets(m, m)
        elif isinstance(m, list) and len(m) == 2:
            buckets = m_buckets(m[0], m[1])
        else:
            raise ValueError(f"{where}: m must be [lo, hi] or one integer, got {m!r} (m_values lists single values)")
    given = {key: item[key] for key in ("dtype", "b_dtype", "scaling", "fast_accum", "layout", "grouped") if
             item.get(key) is not None}  # null is the default, as for out_dtype
    grouped = given.get("grouped", False)
    if not isinstance(grouped, bool):
        raise ValueError(f"{where}: grouped must be true or false, got {grouped!r}")
    num_groups = ()
    if grouped:
        num_groups = _check_num_groups(item.get("num_groups", DEFAULT_NUM_GROUPS), where)
    elif item.get("num_groups") is not None:
        raise ValueError(f"{where}: num_groups is a hint of grouped GEMMs; add \"grouped\": true or remove it")
    try:
        spec = GemmSpec.create(item["n"], item["k"], dtype=_file_dtype(given.get("dtype", "bf16")),
                               out_dtype=item.get("out_dtype"), layout=given.get("layout", "nt"),
                               b_dtype=given.get("b_dtype"), scaling=given.get("scaling"),
                               fast_accum=given.get("fast_accum", False), epilogue=epilogue, grouped=grouped)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    return WarmupEntry(spec=spec, m_buckets=buckets, source=item.get("name") or where, num_groups=num_groups)


def _file_dtype(name: object) -> str:
    try:
        return dtypes.canonical(name, arg="dtype", allowed=dtypes.INPUT_DTYPES)
    except ValueError as exc:
        if any(c in name for c in "x/+"):
            raise ValueError(f"{exc}; in a shapes file, b_dtype, scaling and fast_accum are keys of their own "
                             "(TYPE strings such as 'fp8/block' are for --shape and --dtype)") from None
        raise


_BF16 = GemmType("bf16")


def hf_config_entries(path: str | Path, type_names: list[str] | None, m_range: tuple[int, ...],
                      num_groups: tuple[int, ...] | None = None) -> list[WarmupEntry]:
    """Every weight GEMM of the model in a config.json at the buckets `m_range`: for each TYPE of
    `type_names` (``["bf16", "fp8/row"]``), or with None the model's own types (``_model_types``).

    Then the routed experts of a MoE model (``model_shapes.expert_gemms``) as grouped GEMMs, in those of the same
    types that grouped GEMMs take (bf16, fp16, FP8 block; others are left out of the grouped entries), with
    `m_range` as their expected_m buckets and `num_groups` as their num_groups hints (None:
    ``expert_group_counts`` of the layer's expert count; empty: no grouped entries)."""
    path = Path(path)
    config = _read_json(path)
    try:
        gemms = model_shapes.gemm_shapes(config)
        experts = model_shapes.expert_gemms(config) if num_groups != () else []
        quant = model_shapes.weight_quantization(config) if type_names is None else None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    given = []
    for name in type_names or ():
        try:
            given.append((parse_type(name), f"--dtype {name}"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"--dtype {name}: {exc}") from None
    entries = []
    for gemm in gemms:
        types = given if type_names is not None else [(t, str(path)) for t in _model_types(gemm, quant)]
        for gemm_type, where in types:
            try:
                spec = gemm_type.spec(gemm.n, gemm.k)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}: {exc}") from None
            entries.append(WarmupEntry(spec=spec, m_buckets=m_range, source=f"{path.name}: {gemm.name}"))
    for row in experts:
        types = given if type_names is not None else [(t, str(path)) for t in _model_types(row, quant)]
        hints = num_groups if num_groups is not None else expert_group_counts(row.num_experts)
        for gemm_type, _ in types:
            try:
                spec = gemm_type.spec(row.n, row.k, grouped=True)
            except (TypeError, ValueError):  # a type the grouped kernel does not take (tf32, int8, fp8 row...)
                continue
            entries.append(WarmupEntry(spec=spec, m_buckets=m_range, num_groups=hints,
                                       source=f"{path.name}: {row.name} (grouped, {row.num_experts} experts)"))
    return entries


def _model_types(gemm: model_shapes.ModelGemm | model_shapes.ExpertGemm,
                 quant: model_shapes.WeightQuantization | None) -> list[GemmType]:
    """The types a model row runs in: bf16 without quantization; with FP8 block weights, the quantized type
    where some merged module is converted and bf16 where some is not (lm_head), both when both."""
    if quant is None:
        return [_BF16]
    names = gemm.name.split(", ")
    types = []
    if any(quant.has_quantized(name) for name in names):
        types.append(GemmType(quant.dtype, scaling=quant.scaling))
    if any(quant.has_unquantized(name) for name in names):
        types.append(_BF16)
    return types


# -- plan and run ---------------------------------------------------------------------------------------
def plan_buckets(entries: list[WarmupEntry], arch: str, num_sms: int | None = None
                 ) -> dict[tuple[GemmSpec, KernelConfig], tuple[int, ...]]:
    """(spec, config) -> the M buckets it serves, in first-seen order (plain GEMMs; grouped ones: plan_grouped)."""
    served: dict[tuple[GemmSpec, KernelConfig], set[int]] = {}
    for entry in entries:
        if entry.spec.grouped:
            continue  # plan_grouped
        for bucket in entry.m_buckets:
            cfg = config_mod.choose_config(entry.spec, bucket, arch, num_sms)
            served.setdefault((entry.spec, cfg), set()).add(bucket)
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
    8-bit entry with scales (``activation_quantize_spec``) and the ``--quantize`` kernels of `extra`, each
    with the amax kernel a tensor granularity runs first."""
    needs: dict[QuantKernelSpec, list[str]] = {}
    wanted = [(activation_quantize_spec(e.spec), f"{type_text(e.spec)} activations") for e in entries]
    wanted += [(spec, f"--quantize {quantize_text(spec)}") for spec in extra]
    for spec, why in wanted:
        if spec is None:
            continue
        for kernel in (spec, spec.amax_spec):
            if kernel is not None and why not in needs.setdefault(kernel, []):
                needs[kernel].append(why)
    return {kernel: tuple(whys) for kernel, whys in needs.items()}


def plan_gemv(entries: list[WarmupEntry], arch: str) -> list[GemvSpec]:
    """The weight-streaming kernels of entries that run at small M (their first bucket, 64, holds M = 1..64) and
    that the decode rule takes (``gemv.max_m``: not grouped ones, nor fused epilogues, which stay in the sm90
    kernel at every M): both token-tile variants (M <= 8 and M <= 16), whose code does not depend on N or K, so a
    model needs only a few."""
    found: list[GemvSpec] = []
    for entry in entries:
        if entry.spec.grouped:  # build_grouped runs its own kernel at every M
            continue
        if entry.m_buckets and entry.m_buckets[0] == 64 and gemv.max_m(entry.spec, arch) > 0:
            for m in (1, gemv.max_m(entry.spec, arch)):
                kernel = GemvSpec.for_gemm(entry.spec, m)
                if kernel not in found:
                    found.append(kernel)
    return found


def plan(entries: list[WarmupEntry], arch: str, num_sms: int | None = None, quantize: list[QuantKernelSpec] = ()
         ) -> list[tuple[GemmSpec, KernelConfig] | tuple[QuantKernelSpec | GemvSpec | SegmentsKernel, None]]:
    """The distinct kernels the entries need on `arch`: (spec, config) pairs of the GEMMs (heuristic choice per
    M bucket; num_sms None means the arch's usual count, as ``build(arch=...)`` assumes), then those of the
    grouped GEMMs (``plan_grouped``: choice per expected_m bucket and num_groups), then (quantization spec, None)
    for the kernels of ``plan_quantize(entries, quantize)``, then (gemv spec, None) for the decode kernels of
    ``plan_gemv``, then (SegmentsKernel(), None) when there are grouped entries."""
    return (list(plan_buckets(entries, arch, num_sms)) + list(plan_grouped(entries, arch, num_sms))
            + [(q, None) for q in plan_quantize(entries, quantize)]
            + [(g, None) for g in plan_gemv(entries, arch)] + [(s, None) for s in plan_segments(entries)])


def kernel_type(spec: GemmSpec | QuantKernelSpec | GemvSpec | SegmentsKernel) -> str:
    """What the counts call a kernel: its GEMM TYPE (``type_text``; ``grouped TYPE`` for grouped GEMMs; then the
    fused epilogue, if any: ``bf16 bias+gelu``), ``quantize`` for quantization kernels, ``gemv`` for the decode
    kernels, ``group_segments`` for the segments kernel."""
    if isinstance(spec, GemmSpec):
        text = f"grouped {type_text(spec)}" if spec.grouped else type_text(spec)
        return text if spec.epilogue == "none" else f"{text} {spec.epilogue}"
    if isinstance(spec, SegmentsKernel):
        return spec.tag
    return "gemv" if isinstance(spec, GemvSpec) else "quantize"


def _compile_one(spec: GemmSpec | QuantKernelSpec | GemvSpec | SegmentsKernel, cfg: KernelConfig | None, arch: str
                 ) -> tuple[bool, str | None]:
    """Worker: (compiled now, error message or None). Never raises, so one bad kernel fails alone."""
    from . import grouped, jit

    try:
        if isinstance(spec, SegmentsKernel):
            return grouped.segments_kernel(arch).compiled_now, None
        if isinstance(spec, GemvSpec):
            return gemv.get_kernel(spec, arch).compiled_now, None
        if cfg is None:
            return quantization.get_kernel(spec, arch).compiled_now, None
        return jit.get_kernel(spec, cfg, arch).compiled_now, None
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
    w.add_argument("--m", default=f"{DEFAULT_M_RANGE[0]}-{DEFAULT_M_RANGE[1]}",
                   help="M range lo-hi for --from-hf-config (default 1-16384); also the expected_m range of its "
                        "grouped expert GEMMs")
    w.add_argument("--num-groups", default="auto", metavar="G[,G...]|auto|none",
                   help="num_groups hints of the grouped expert GEMMs of --from-hf-config MoE models (comma "
                        "separated); auto (default): the expert count, its shares under expert parallelism "
                        f"{'/'.join(map(str, EP_DEGREES))}, {DEFAULT_NUM_GROUPS} and 1; none: no grouped kernels")
    w.add_argument("--arch", default=None, help="target, e.g. sm_90a (default: the GPU's; required without one)")
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
    type_names = None if args.dtype is None else [d.strip() for d in args.dtype.split(",") if d.strip()]
    if type_names == []:
        raise ValueError(f"--dtype {args.dtype!r} names no type")
    m_range = parse_m(args.m)
    choice = args.num_groups.strip().lower()
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


def _target(arch: str | None) -> tuple[str, int | None]:
    """(arch, num_sms for the heuristic): the given arch with the arch's usual SM count, or the GPU's own."""
    if arch is not None:
        return device.normalize_arch(arch), None
    if device.gpu_count() == 0:
        raise ValueError("no CUDA GPU found: pass --arch (e.g. --arch sm_90a) to pre-generate kernels for it")
    return device.current_arch(), device.num_sms()


def main(args: argparse.Namespace) -> int:
    """Run ``warmup`` for parsed arguments: 0 when every kernel is in the cache, 1 when any failed."""
    arch, num_sms = _target(args.arch)
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    entries = _entries(args)
    served = plan_buckets(entries, arch, num_sms)
    grouped = plan_grouped(entries, arch, num_sms)
    quantize = plan_quantize(entries, [parse_quantize(text) for text in args.quantize])
    decode = plan_gemv(entries, arch)
    segments = plan_segments(entries)
    work = (list(served) + list(grouped) + [(spec, None) for spec in quantize] + [(spec, None) for spec in decode]
            + [(spec, None) for spec in segments])
    if args.dry_run:
        for (spec, cfg), buckets in served.items():
            print(f"{spec.tag:44s} {cfg.tag:32s} M buckets {_m_text(buckets)}")
        for (spec, cfg), hints in grouped.items():
            print(f"{spec.tag:44s} {cfg.tag:32s} {_hints_text(hints)}")
        for spec, whys in quantize.items():
            print(f"{spec.tag:77s} for {', '.join(whys)}")
        for spec in decode:
            print(f"{spec.tag:77s} for M <= {spec.max_m} (decode)")
        for spec in segments:
            print(f"{spec.tag:77s} for grouped GEMMs called with m_indices=")
        types = Counter(kernel_type(spec) for spec, _ in work)
        print(f"warmup plan: {len(work)} kernels for {arch}{_types_note(types)}; dry run, nothing compiled")
        return 0
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
