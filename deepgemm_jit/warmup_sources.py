"""Where ``deepgemm-jit warmup``'s problems come from: shapes files, ``--shape`` / ``--grouped`` / ``--quantize``
lines, Hugging Face configs, and the lines an offline miss prints (``warmup_command_for`` ...). Each source becomes
``WarmupEntry`` values (a spec and its M buckets / grouped hints); ``warmup.py`` plans and compiles them.

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
  values. Either becomes the M buckets it touches (``buckets.m_bucket``: 64, 128, steps of 64 rows up to 384 and
  of 128 rows from 512 up to 16384, 16384 above; every M of a bucket shares one kernel). ``name`` is
  a free label. ``epilogue`` (null: none) is the fused
  epilogue of ``build(..., epilogue=...)`` (``"bias+gelu"``, ``"swiglu+quant_fp8_g128"``; words of
  ``epilogue.py``, any order, kept in canonical form). ``"grouped": true`` makes the entry a grouped GEMM
  (``build_grouped(n, k, ...)``, layout nt, bf16 / fp16 / fp8 block): ``m`` / ``m_values`` are then its
  ``expected_m`` hints (rows per group) and ``num_groups`` (one integer or a list; default
  ``grouped.DEFAULT_NUM_GROUPS``, 8, what ``build_grouped`` assumes) its ``num_groups`` hints; ``num_groups``
  without ``grouped`` is refused. Unknown keys are refused.
- ``--shape M:N:K:TYPE[:layout[:out_dtype]][:epilogue=EPI]``, M one value or ``lo-hi`` (repeatable), TYPE
  ``dtype[xb_dtype][/scaling][+fast_accum]`` (``bf16``, ``fp8/block``, ``fp8/tensor+fast_accum``,
  ``int8/row``, ``fp8_e4m3xfp8_e5m2/tensor``, or ``fp32``: the 3xTF32 GEMM of ``build_fp32``, its TF32
  GEMM and the split kernel of the layout), EPI a fused epilogue (``bias+gelu``; a keyed last field, so
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

"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from . import config as config_mod
from . import buckets, dtypes, fp32x3, model_shapes, quantization, sm90_rules, sm90_tiles
from . import epilogue as epilogue_mod
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
    # dtype fp32 (3xTF32, fp32x3.py): the caller's layout, whose split kernel is compiled too; `spec` is then the
    # TF32 GEMM build_fp32 runs (K' = 3 * ceil(K/32) * 32, promoted, layout nt), and `fp32` the caller's problem
    # (at decode sizes build_fp32 runs that GEMM's raw_b form: spec_at).
    split_layout: str | None = None
    fp32: "fp32x3.Fp32Spec | None" = None

    def spec_at(self, bucket: int, arch: str) -> GemmSpec:
        """The spec build() (build_fp32) compiles at M bucket `bucket` for `arch` (sm90_rules.kernel_spec: the nt twin
        of a TF32 spec with MN-major operands on Hopper, except at small M nn itself and tn's nn twin, whose kernels
        transpose B)."""
        spec = self.spec if self.fp32 is None else self.fp32.inner_at(bucket, arch)
        return sm90_rules.kernel_spec(spec, arch, bucket)


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
        spec = GemmSpec.create(n, k, self.dtype, out_dtype, layout, b_dtype=self.b_dtype, scaling=self.scaling,
                               fast_accum=self.fast_accum, epilogue=epilogue, grouped=grouped)
        return _grouped_checked(spec) if grouped else spec


def _grouped_checked(spec: GemmSpec) -> GemmSpec:
    """`spec` (grouped), refused as build_grouped refuses it (grouped.grouped_spec: K and D rows TMA cannot read or
    store): warmup must not plan kernels no build_grouped call can use."""
    from .grouped import grouped_spec

    grouped_spec(spec.n, spec.k, spec.dtype, spec.out_dtype, epilogue=spec.epilogue, scaling=spec.scaling,
                 b_dtype=spec.b_dtype)
    return spec


# -- M ranges -----------------------------------------------------------------------------------------
def m_buckets(lo: int, hi: int) -> tuple[int, ...]:
    """The buckets every M in [lo, hi] falls in: m_bucket(lo), then buckets.next_m_bucket up to m_bucket(hi)."""
    for name, value in (("lo", lo), ("hi", hi)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"M range {name} must be a positive integer, got {value!r}")
    if lo > hi:
        raise ValueError(f"M range [{lo}, {hi}] is empty (lo > hi)")
    found, bucket = [], buckets.m_bucket(lo)
    last = buckets.m_bucket(hi)
    while bucket <= last:
        found.append(bucket)
        bucket = buckets.next_m_bucket(bucket)
    return tuple(found)


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
    allowed = dtypes.GEMM_DTYPES  # fp32: 3xTF32 (build_fp32), --shape only
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
        gemm_type = parse_type(parts[3])
        buckets = parse_m(parts[0])
        if gemm_type.dtype == "fp32":  # build_fp32: the split kernel of the layout and the TF32 GEMM over K'
            if gemm_type != GemmType("fp32"):
                raise ValueError("fp32 (3xTF32) takes no b_dtype, scaling or fast_accum")
            fspec = fp32x3.Fp32Spec.create(n, k, out_dtype=out_dtype, layout=layout, epilogue=epilogue)
            return WarmupEntry(spec=fspec.inner, m_buckets=buckets, source=where, split_layout=fspec.layout,
                               fp32=fspec)
        spec = gemm_type.spec(n, k, out_dtype, layout, epilogue=epilogue)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    return WarmupEntry(spec=spec, m_buckets=buckets, source=where)


def target_flags(arch: str, num_sms: int | None) -> str:
    """``--arch`` and, where the build chose its tile for a GPU of another SM count than the arch's usual one (an
    H100 PCIe's 114), ``--num-sms``: warmup then plans the same tile."""
    flags = f"--arch {arch}"
    if num_sms is not None and num_sms != sm90_tiles.DEFAULT_SM90_NUM_SMS:
        flags += f" --num-sms {num_sms}"
    return flags


def warmup_command_for(spec: GemmSpec, m_hint: int, arch: str, num_sms: int | None = None,
                       this_gpu: bool = False) -> str:
    """The one ``deepgemm-jit warmup`` line that compiles the kernel `build()` picks for (spec, M, arch) on a GPU
    of `num_sms` SMs (None: the arch's usual count): its ``--shape`` gives back exactly `spec` (types, scaling,
    fast_accum, layout, out_dtype, fused epilogue). `this_gpu`: the pick is the tuned config stored for the GPU the
    build runs on, which only a warmup on that GPU plans: the line has no ``--arch``.

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
    target = "" if this_gpu else f"{target_flags(arch, num_sms)} "
    return f"deepgemm-jit warmup {target}--shape {':'.join(fields)}"


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


def grouped_warmup_command_for(spec: GemmSpec, expected_m: int, num_groups: int, arch: str,
                               num_sms: int | None = None) -> str:
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
    return f"deepgemm-jit warmup {target_flags(arch, num_sms)} --grouped {':'.join(fields)}"


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


def activation_quantize_specs(spec: GemmSpec) -> tuple[QuantKernelSpec, ...]:
    """Every quantize kernel a call's activations may need (what warmup plans): activation_quantize_spec's, and,
    where K % 8 != 0 narrows it, the 16-byte one a single row (M = 1: no row stride to align) runs."""
    packed = activation_quantize_spec(spec)
    if packed is None:
        return ()
    one_row = replace(packed, vec=config_mod.max_vector(dtypes.get(ACTIVATION_DTYPE).storage_bytes, 0,
                                                                    spec.k, 1))
    return (packed,) if one_row == packed else (packed, one_row)


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
        if grouped:
            _grouped_checked(spec)
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
