"""PyTorch integration: the GEMMs and FP8 quantization as ``torch.library`` custom ops, and a drop-in ``Linear``.

Optional: importing this module needs torch >= 2.4 (``pip install "deepgemm-jit[torch]"``); the rest of
the package never imports it.

    import deepgemm_jit.torch as dgt
    d = dgt.gemm(x, w)                        # x (..., K), w (N, K) CUDA tensors -> (..., N) tensor
    n = dgt.swap_linears(model)               # every bf16/fp16 CUDA nn.Linear -> dgt.Linear
    n = dgt.swap_linears(model, dtype="fp8", scaling="block")   # the same, weights quantized to FP8 once

    qx, sx = dgt.quantize(x2, "fp8", "group128")   # x2 (M, K) -> FP8 (M, K) and (M, ceil(K/128)) scales
    y = dgt.gemm_fp8(qx, qw, sx, sw, "block")      # -> (M, N) bf16
    y = dgt.grouped_mm(x, w, offs=offs)            # mixture of experts: x (M, K), w (G, N, K) -> (M, N)

Five ops, ``torch.ops.deepgemm_jit.gemm``, ``.quantize``, ``.gemm_fp8``, ``.grouped_mm`` and ``.grouped_mm_fp8``,
each with a fake (meta)
implementation, so they trace under ``torch.compile(fullgraph=True)`` and ``torch.export`` without a graph
break. Once a stream has run a problem at a size, they synchronise nothing with the host and allocate only their
outputs from torch's allocator (``quantize`` with ``granularity="tensor"`` also a one-word amax), so they can be
captured in a CUDA graph. The first call of a size on a stream allocates (and synchronises for) the Gemm's buffers
of that stream: the split-K workspace, and the aligned staging copies (staging.py) that an FP8 operand whose rows
are not a multiple of 16 bytes (K % 16 != 0), or an output whose rows are not (N % 8 != 0 for bf16/fp16 output),
goes through. No autograd formulas: inference only.

Each op keeps one Gemm per (device, problem, M bucket) and every caller of that problem shares it. Its split-K
workspace and staging buffers are kept per stream (stream_buffers.py), so calls on two streams may overlap. A
captured graph writes the buffers it was captured with wherever it is replayed: do not replay it while the same
problem runs eagerly on its capture stream, nor two graphs captured on one stream at once (capture each
micro-batch on a stream of its own, warmed up there: ``torch.cuda.graph(g, stream=s)``). A capture on a stream
whose own buffers are missing or too small (by default torch.cuda.graph's own stream) uses the device's largest
that fit, another stream's.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from . import config as config_mod
from . import buckets, dtypes, quantization, sm90_swap_ab
from .arrays import mn_major_storage_shape, mn_major_view
from .device import arch_of_capability
from .api import Gemm, build
from .grouped import GroupedGemm, build_grouped
from .spec import LAYOUTS, GemmSpec

if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
    raise ImportError(f"deepgemm_jit.torch needs torch >= 2.4 (torch.library.custom_op); found {torch.__version__}")

# torch input dtype -> the library's input dtype name (float32 runs on TF32 tensor cores).
_INPUT_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "tf32"}
_OUTPUT_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
_FP8_INPUT_DTYPES = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}
_QUANT_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2, "int8": torch.int8}
_QUANT_SOURCES = (torch.float32, torch.float16, torch.bfloat16)   # what quantize reads
_FP8_SCALINGS = ("tensor", "row", "block")
_FP8_OUTPUTS = ("bf16", "fp16", "fp32")
# Weight dtypes of a dense Linear (TF32 Linears stay with torch: their accuracy contract differs).
_LINEAR_DTYPES = (torch.bfloat16, torch.float16)
_FP8_WEIGHT_DTYPE = torch.float8_e4m3fn   # FP8 Linears store E4M3 weights and quantize activations to E4M3


@dataclass(frozen=True)
class _Fp8Recipe:
    """How an FP8 Linear quantizes: the GEMM's scaling and the two ``quantize`` granularities feeding it."""
    scaling: str              # deepgemm_jit.build(scaling=...)
    weight_granularity: str   # the (N, K) weight, once, when the Linear is made
    input_granularity: str    # the (M, K) activations, on every call


# weight_format -> recipe. DeepGEMM's (block) is the default of dtype="fp8".
_FP8_RECIPES = {"fp8_block": _Fp8Recipe("block", "block128", "group128"),
                "fp8_row": _Fp8Recipe("row", "row", "row"),
                "fp8_tensor": _Fp8Recipe("tensor", "tensor", "tensor")}
WEIGHT_FORMATS = ("bf16",) + tuple(_FP8_RECIPES)


@dataclass(frozen=True)
class _Problem:
    """What one call computes, derived from shapes and dtypes only (real and fake impl share it)."""
    m: int
    n: int
    k: int
    dtype: str            # library input dtype name
    out_dtype: str        # library output dtype name
    layout: str
    out_shape: tuple      # shape of the returned tensor (leading dims of a kept for nt)

    @property
    def torch_out_dtype(self) -> torch.dtype:
        return _OUTPUT_DTYPES[self.out_dtype]


def _problem(a: torch.Tensor, b: torch.Tensor, layout: str, out_dtype: Optional[str]) -> _Problem:
    """Checks the operands against the layout's contract; errors name the argument."""
    if not isinstance(layout, str) or layout.lower() not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not supported; choose one of {', '.join(LAYOUTS)}")
    layout = layout.lower()
    name = _INPUT_DTYPES.get(a.dtype)
    if name is None:
        raise TypeError(f"a has dtype {a.dtype}; pass torch.float16, torch.bfloat16 or torch.float32 (TF32)")
    if b.dtype != a.dtype:
        raise TypeError(f"b has dtype {b.dtype} but a has {a.dtype}; both operands take one dtype")
    out_name = (dtypes.DEFAULT_OUT[name] if out_dtype is None
                else dtypes.canonical(out_dtype, arg="out_dtype", allowed=tuple(_OUTPUT_DTYPES)))
    if b.dim() != 2:
        raise ValueError(f"b must be 2-D, got shape {tuple(b.shape)}")
    if layout == "nt":
        if a.dim() < 1:
            raise ValueError("a must have at least one dimension (..., K) for layout 'nt'")
        lead, k = tuple(a.shape[:-1]), a.shape[-1]
        m = 1
        for size in lead:
            m = m * size
    else:
        if a.dim() != 2:
            raise ValueError(f"a must be 2-D for layout {layout!r}, got shape {tuple(a.shape)}; "
                             "only 'nt' flattens leading dimensions")
        m, k = (a.shape[0], a.shape[1]) if layout[0] == "n" else (a.shape[1], a.shape[0])
        lead = (m,)
    n, b_k = (b.shape[0], b.shape[1]) if layout[1] == "t" else (b.shape[1], b.shape[0])
    if b_k != k:
        want = "(N, K)" if layout[1] == "t" else "(K, N)"
        raise ValueError(f"b has shape {tuple(b.shape)}; layout {layout!r} wants b {want} with K={k} "
                         f"(from a of shape {tuple(a.shape)})")
    return _Problem(m, n, k, name, out_name, layout, lead + (n,))


@dataclass(frozen=True)
class _Fp8Problem:
    """One FP8 GEMM call, from shapes and dtypes only (real and fake impl share it)."""
    m: int
    n: int
    k: int
    dtype: str       # A's library dtype name (fp8_e4m3 or fp8_e5m2)
    b_dtype: str     # B's
    scaling: str     # tensor, row or block
    out_dtype: str   # bf16, fp16 or fp32

    @property
    def torch_out_dtype(self) -> torch.dtype:
        return _OUTPUT_DTYPES[self.out_dtype]


def _fp8_scale_shapes(scaling: str, m, n, k) -> tuple[tuple, tuple]:
    """(scale_a, scale_b) shapes, as GemmSpec.scale_shapes, for ints or the SymInts of a trace."""
    num_k_blocks, num_n_blocks = -(-k // 128), -(-n // 128)
    if scaling == "tensor":
        return (1,), (1,)
    if scaling == "row":
        return (m,), (n,)
    return (m, num_k_blocks), (num_n_blocks, num_k_blocks)


_SCALE_MEANING = {"tensor": ("one scale for all of A", "one scale for all of B"),
                  "row": ("(M,): one per row of A", "(N,): one per row of B"),
                  "block": ("(M, ceil(K/128)): one per 1x128 group of A",
                            "(ceil(N/128), ceil(K/128)): one per 128x128 block of B")}


def _fp8_problem(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, scaling: str,
                 out_dtype: Optional[str]) -> _Fp8Problem:
    """Checks FP8 operands and scales against their contract; errors name the argument."""
    if not isinstance(scaling, str) or scaling.lower() not in _FP8_SCALINGS:
        raise ValueError(f"scaling={scaling!r} is not supported; choose one of {', '.join(_FP8_SCALINGS)}")
    scaling = scaling.lower()
    names = []
    for t, arg in ((a, "a"), (b, "b")):
        name = _FP8_INPUT_DTYPES.get(t.dtype)
        if name is None:
            raise TypeError(f"{arg} has dtype {t.dtype}; pass torch.float8_e4m3fn or torch.float8_e5m2 "
                            "(deepgemm_jit.torch.quantize makes them)")
        if t.dim() != 2:
            raise ValueError(f"{arg} must be 2-D, got shape {tuple(t.shape)}; flatten leading dimensions "
                             "(a (M, K), b (N, K))")
        names.append(name)
    out_name = "bf16" if out_dtype is None else dtypes.canonical(out_dtype, arg="out_dtype", allowed=_FP8_OUTPUTS)
    (m, k), (n, b_k) = a.shape, b.shape
    if b_k != k:
        raise ValueError(f"b has shape {tuple(b.shape)}; it must be (N, K) with K={k} (from a of shape "
                         f"{tuple(a.shape)})")
    if k == 0:
        raise ValueError(f"a has shape {tuple(a.shape)}; FP8 GEMMs need K >= 1")
    for t, arg, want, what in zip((scale_a, scale_b), ("scale_a", "scale_b"), _fp8_scale_shapes(scaling, m, n, k),
                                  _SCALE_MEANING[scaling]):
        if t.dtype != torch.float32:
            raise TypeError(f"{arg} has dtype {t.dtype}; scales are torch.float32 dequantization factors")
        if tuple(t.shape) != want:
            raise ValueError(f"{arg} has shape {tuple(t.shape)}; scaling={scaling!r} wants {want} ({what})")
    for t, arg in ((b, "b"), (scale_a, "scale_a"), (scale_b, "scale_b")):
        if t.device != a.device:
            raise ValueError(f"{arg} is on {t.device} but a is on {a.device}")
    return _Fp8Problem(m, n, k, names[0], names[1], scaling, out_name)


@dataclass(frozen=True)
class _QuantProblem:
    """One quantize call, from shapes and dtypes only (real and fake impl share it)."""
    m: int
    k: int
    dtype: str          # fp8_e4m3, fp8_e5m2 or int8
    granularity: str
    scales_shape: tuple

    @property
    def torch_dtype(self) -> torch.dtype:
        return _QUANT_DTYPES[self.dtype]


def _quant_problem(x: torch.Tensor, dtype: str, granularity: str) -> _QuantProblem:
    name = dtypes.canonical(dtype, arg="dtype", allowed=quantization.QUANT_DTYPES)
    gran = quantization.check_granularity(granularity, name)
    if x.dtype not in _QUANT_SOURCES:
        raise TypeError(f"x has dtype {x.dtype}; quantize takes torch.float32, torch.float16 or torch.bfloat16")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, K), got shape {tuple(x.shape)}; flatten leading dimensions first")
    m, k = x.shape
    if k == 0:
        raise ValueError(f"x has shape {tuple(x.shape)}; quantization needs K >= 1")
    return _QuantProblem(m, k, name, gran, quantization.scale_shape(gran, m, k))


def _require_cuda(op: str, t: torch.Tensor, arg: str) -> None:
    if t.device.type != "cuda":
        raise ValueError(f"deepgemm_jit::{op} runs on CUDA tensors; {arg} is on {t.device}")


def _k_contiguous(t: torch.Tensor) -> torch.Tensor:
    """t with unit stride along its last dimension and rows that do not overlap (the kernels' requirements), copied
    only if needed. Overlapping rows are valid torch input that F.linear reads: an expanded vector (row stride 0),
    a sliding window (unfold)."""
    if t.dim() >= 2 and t.shape[-2] > 1 and t.stride(-2) < max(t.shape[-1], 1):
        return t.contiguous()
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


# Built Gemms / GroupedGemms by what the op saw (device index, kind, N, K, M bucket, spec arguments ...): one per
# problem and bucket, the bucket's representative M serving every M of the bucket.
_built: dict[tuple, object] = {}
_built_lock = threading.Lock()


def _built_once(key: tuple, make: Callable[[], object]):
    g = _built.get(key)
    if g is None:
        with _built_lock:
            g = _built.get(key)
            if g is None:
                g = _built[key] = make()
    return g


@functools.lru_cache(maxsize=1024)
def _spec_and_arch(device_index: int, n: int, k: int, spec_items: tuple) -> tuple[GemmSpec, str]:
    """The spec of an op's problem and its device's arch, made once per problem (not per call)."""
    return (GemmSpec.create(n, k, **dict(spec_items)),
            arch_of_capability(*torch.cuda.get_device_capability(device_index)))


def _gemm_for(device_index: int, m: int, n: int, k: int, **spec_args) -> Gemm:
    items = tuple(sorted(spec_args.items()))
    bucket = buckets.m_bucket(m)
    if sm90_swap_ab.sm90_swap_ab_sizes(m, k):  # finer where swapped tiles are weighed (config.m_bucket_for)
        spec, arch = _spec_and_arch(device_index, n, k, items)
        bucket = config_mod.m_bucket_for(spec, m, arch)
    key = ("gemm", device_index, n, k, bucket, items)
    return _built_once(key, lambda: build(bucket, n, k, **spec_args))


# -- the 16-bit / TF32 GEMM ---------------------------------------------------------------------------------
@torch.library.custom_op("deepgemm_jit::gemm", mutates_args=())
def _gemm_op(a: torch.Tensor, b: torch.Tensor, layout: str = "nt", out_dtype: Optional[str] = None) -> torch.Tensor:
    p = _problem(a, b, layout, out_dtype)
    _require_cuda("gemm", a, "a")
    with torch.cuda.device(a.device):
        # Allocated in the returned shape (a base tensor, not a view: callers such as Linear may add to it in place).
        out = torch.empty(p.out_shape, dtype=p.torch_out_dtype, device=a.device)
        if p.m and p.n and not p.k:  # an empty sum, as torch.mm (and nn.Linear with in_features 0) gives
            out.zero_()
        elif p.m and p.n:
            a2 = a.reshape(p.m, p.k) if p.layout == "nt" else a  # a view when a's leading dims allow one
            g = _gemm_for(a.device.index, p.m, p.n, p.k, dtype=p.dtype, out_dtype=p.out_dtype, layout=p.layout)
            # on torch's current stream (Gemm's default for torch); operands strided along their last dimension
            # (x.t(), x[..., ::2]) are copied, as gemm_fp8 and nn.Linear take them
            g(_k_contiguous(a2), _k_contiguous(b), out=out.view(p.m, p.n))
    return out


@_gemm_op.register_fake
def _gemm_fake(a, b, layout="nt", out_dtype=None):
    p = _problem(a, b, layout, out_dtype)
    return a.new_empty(p.out_shape, dtype=p.torch_out_dtype)


def gemm(a: torch.Tensor, b: torch.Tensor, layout: str = "nt", out_dtype: Optional[str] = None) -> torch.Tensor:
    """d = op(a) @ op(b) on CUDA tensors through ``torch.ops.deepgemm_jit.gemm``; returns a new tensor.

    - ``nt``: a (..., K), b (N, K) -> (..., N) = a @ b.T   (b like ``nn.Linear.weight``; leading dims of a
      are flattened into M and restored, a copy of a only if they cannot be viewed as one)
    - ``nn``: a (M, K), b (K, N) -> (M, N);  ``tn``: a (K, M), b (K, N);  ``tt``: a (K, M), b (N, K)

    a and b share one dtype: float16, bfloat16, or float32 (TF32 tensor cores, FP32 accumulation).
    ``out_dtype`` (``"fp16"``, ``"bf16"``, ``"fp32"``) defaults to a's dtype (float32 for TF32). An operand
    without unit stride along its last dimension is copied first. Runs on torch's current stream; one kernel per
    problem and M bucket is compiled on first use (do that first call outside CUDA-graph capture). Example::

        y = deepgemm_jit.torch.gemm(x, linear.weight)   # x (2, 37, 256) bf16 -> (2, 37, out_features)
    """
    return torch.ops.deepgemm_jit.gemm.default(a, b, layout, out_dtype)


# -- FP8: quantize and the scaled GEMM ---------------------------------------------------------------------------
def _new_scales(x: torch.Tensor, p: _QuantProblem) -> torch.Tensor:
    """Uninitialised scales of `p` in the layout quantization.quantize returns (group128 M-major: a view of
    (ceil(K/128), round_up(M, 4)) storage; the others contiguous): the fake must give the real op's strides."""
    if p.granularity == "group128":
        return mn_major_view(x.new_empty(mn_major_storage_shape(p.m, p.scales_shape[1]), dtype=torch.float32), p.m)
    return x.new_empty(p.scales_shape, dtype=torch.float32)


@torch.library.custom_op("deepgemm_jit::quantize", mutates_args=())
def _quantize_op(x: torch.Tensor, dtype: str = "fp8", granularity: str = "group128"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    p = _quant_problem(x, dtype, granularity)
    _require_cuda("quantize", x, "x")
    if p.m == 0:   # no rows: quantization.quantize's answer (empty q, scales 1) without a driver call
        return x.new_empty((0, p.k), dtype=p.torch_dtype), _new_scales(x, p).fill_(1.0)
    with torch.cuda.device(x.device):
        return quantization.quantize(_k_contiguous(x), p.dtype, p.granularity)   # torch's current stream


@_quantize_op.register_fake
def _quantize_fake(x, dtype="fp8", granularity="group128"):
    p = _quant_problem(x, dtype, granularity)
    return x.new_empty((p.m, p.k), dtype=p.torch_dtype), _new_scales(x, p)


def quantize(x: torch.Tensor, dtype: str = "fp8", granularity: str = "group128"
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scales) of a 2-D (M, K) CUDA tensor through ``torch.ops.deepgemm_jit.quantize``.

    :func:`deepgemm_jit.quantize` as an op: x float32, float16 or bfloat16 (M, K), unit stride along K
    (copied if not); ``dtype`` ``"fp8"`` (= ``"fp8_e4m3"``), ``"fp8_e5m2"`` or ``"int8"``; q contiguous
    (M, K) torch.float8_e4m3fn / float8_e5m2 / int8; scales float32 dequantization factors (x ~= q * s):
    ``"tensor"`` (1,), ``"row"`` (M,), ``"group128"`` (M, ceil(K/128)) M-major (strides (1, round_up(M, 4)), the
    layout :func:`gemm_fp8` reads fastest), ``"block128"`` (ceil(M/128), ceil(K/128)); all but group128
    contiguous. M may be 0 (nothing runs). Runs on torch's current stream, no host sync.
    Example::

        qx, sx = deepgemm_jit.torch.quantize(x.reshape(-1, 7168), "fp8", "group128")
    """
    return torch.ops.deepgemm_jit.quantize.default(x, dtype, granularity)


@torch.library.custom_op("deepgemm_jit::gemm_fp8", mutates_args=())
def _gemm_fp8_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                 scaling: str = "block", out_dtype: Optional[str] = None) -> torch.Tensor:
    p = _fp8_problem(a, b, scale_a, scale_b, scaling, out_dtype)
    _require_cuda("gemm_fp8", a, "a")
    with torch.cuda.device(a.device):
        out = torch.empty((p.m, p.n), dtype=p.torch_out_dtype, device=a.device)
        if p.m and p.n:
            g = _gemm_for(a.device.index, p.m, p.n, p.k, dtype=p.dtype, b_dtype=p.b_dtype, scaling=p.scaling,
                          out_dtype=p.out_dtype)
            g(_k_contiguous(a), _k_contiguous(b), scale_a=scale_a, scale_b=scale_b, out=out)
    return out


@_gemm_fp8_op.register_fake
def _gemm_fp8_fake(a, b, scale_a, scale_b, scaling="block", out_dtype=None):
    p = _fp8_problem(a, b, scale_a, scale_b, scaling, out_dtype)
    return a.new_empty((p.m, p.n), dtype=p.torch_out_dtype)


def gemm_fp8(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
             scaling: str = "block", out_dtype: Optional[str] = None) -> torch.Tensor:
    """d = (a * scale_a) @ (b * scale_b).T through ``torch.ops.deepgemm_jit.gemm_fp8``; a new (M, N) tensor.

    a (M, K) and b (N, K) CUDA tensors of torch.float8_e4m3fn or float8_e5m2 (unit stride along K, copied
    if not); scales float32 dequantization factors in :func:`quantize`'s layouts: ``"block"`` scale_a
    (M, ceil(K/128)) (group128 of a), scale_b (ceil(N/128), ceil(K/128)) (block128 of b); ``"row"`` (M,)
    and (N,); ``"tensor"`` (1,) and (1,). ``out_dtype`` ``"bf16"`` (default), ``"fp16"`` or ``"fp32"``.
    FP32 accumulation, promoted every 128 K. Any K works; K % 16 != 0 (or an output row that is not a
    multiple of 16 bytes) goes through aligned staging copies (the first call of a size synchronises). Example::

        qx, sx = quantize(x, "fp8", "group128"); qw, sw = quantize(w, "fp8", "block128")
        y = gemm_fp8(qx, qw, sx, sw, "block")    # (M, N) bf16 ~= x @ w.T
    """
    return torch.ops.deepgemm_jit.gemm_fp8.default(a, b, scale_a, scale_b, scaling, out_dtype)


# -- grouped GEMMs (mixture of experts) ----------------------------------------------------------------------------
def _grouped_for(device_index: int, n: int, k: int, expected_m: int, num_groups: int, **spec_args) -> GroupedGemm:
    bucket = buckets.m_bucket(max(1, expected_m))
    key = ("grouped", device_index, n, k, bucket, num_groups, tuple(sorted(spec_args.items())))
    return _built_once(key, lambda: build_grouped(n, k, expected_m=bucket, num_groups=num_groups, **spec_args))


def _grouped_out(a: torch.Tensor, b: torch.Tensor, offs, masked_m, out_dtype: Optional[str], fp8: bool
                 ) -> tuple[tuple, torch.dtype, str, str]:
    """(output shape, torch output dtype, library input dtype, library output dtype) of a grouped call; the
    shape and dtype checks shared by the real and the fake implementations (the rest is GroupedGemm's)."""
    if (offs is None) == (masked_m is None):
        raise ValueError("give exactly one of offs (contiguous a (M, K)) and masked_m (masked a (G, max_m, K))")
    if b.dim() != 3:
        raise ValueError(f"b must be 3-D (G, N, K), got shape {tuple(b.shape)}")
    want = 3 if masked_m is not None else 2
    if a.dim() != want:
        raise ValueError(f"a must be {want}-D ({'(G, max_m, K)' if want == 3 else '(M, K)'}), got shape "
                         f"{tuple(a.shape)}")
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"a has K={a.shape[-1]} but b has K={b.shape[-1]}")
    inputs = _FP8_INPUT_DTYPES if fp8 else {torch.float16: "fp16", torch.bfloat16: "bf16"}
    if a.dtype not in inputs or b.dtype != a.dtype:
        raise TypeError(f"a and b must share one dtype of {', '.join(map(str, inputs))}; got {a.dtype} and {b.dtype}")
    if masked_m is not None and a.shape[0] != b.shape[0]:  # the fake must refuse what the real op refuses
        raise ValueError(f"a has {a.shape[0]} groups (G, max_m, K) but b has {b.shape[0]} (G, N, K)")
    name = inputs[a.dtype]
    out_name = (("bf16" if fp8 else name) if out_dtype is None
                else dtypes.canonical(out_dtype, arg="out_dtype", allowed=tuple(_OUTPUT_DTYPES)))
    shape = (a.shape[0], a.shape[1], b.shape[1]) if masked_m is not None else (a.shape[0], b.shape[1])
    return shape, _OUTPUT_DTYPES[out_name], name, out_name


def _grouped_run(a, b, offs, masked_m, out_dtype, scale_a=None, scale_b=None) -> torch.Tensor:
    fp8 = scale_a is not None
    shape, torch_out, name, out_name = _grouped_out(a, b, offs, masked_m, out_dtype, fp8)
    _require_cuda("grouped_mm_fp8" if fp8 else "grouped_mm", a, "a")
    num_groups, n, k = b.shape
    with torch.cuda.device(a.device):
        out = torch.empty(shape, dtype=torch_out, device=a.device)
        if out.numel() and num_groups:
            expected = a.shape[1] if masked_m is not None else -(-a.shape[0] // num_groups)
            spec_args = {"dtype": name, "out_dtype": out_name}
            if fp8:
                spec_args["scaling"] = "block"
            g = _grouped_for(a.device.index, n, k, expected, num_groups, **spec_args)
            kw = {"offs": offs} if offs is not None else {"masked_m": masked_m}
            if fp8:
                kw.update(scale_a=scale_a, scale_b=scale_b)
            # masked a (G, max_m, K): its groups must lie one after another too (a slice buf[:, :max_m] does not)
            a_in = a.contiguous() if masked_m is not None and not a.is_contiguous() else _k_contiguous(a)
            g(a_in, b if b.is_contiguous() else b.contiguous(), out=out, **kw)  # torch's current stream
    return out


@torch.library.custom_op("deepgemm_jit::grouped_mm", mutates_args=())
def _grouped_mm_op(a: torch.Tensor, b: torch.Tensor, offs: Optional[torch.Tensor] = None,
                   masked_m: Optional[torch.Tensor] = None, out_dtype: Optional[str] = None) -> torch.Tensor:
    return _grouped_run(a, b, offs, masked_m, out_dtype)


@_grouped_mm_op.register_fake
def _grouped_mm_fake(a, b, offs=None, masked_m=None, out_dtype=None):
    shape, torch_out, _, _ = _grouped_out(a, b, offs, masked_m, out_dtype, False)
    return a.new_empty(shape, dtype=torch_out)


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: Optional[torch.Tensor] = None,
               masked_m: Optional[torch.Tensor] = None, out_dtype: Optional[str] = None) -> torch.Tensor:
    """Grouped GEMM (mixture of experts) through ``torch.ops.deepgemm_jit.grouped_mm``; a new tensor.

    Contiguous: a (M, K) rows of all groups stacked, ``offs`` (G,) int32 cumulative row ends (as
    ``torch._grouped_mm``) -> (M, N), group g's rows times b[g].T. Masked: a (G, max_m, K), ``masked_m`` (G,) int32
    valid rows per group -> (G, max_m, N). b (G, N, K) like stacked ``nn.Linear`` weights; bfloat16 or float16.
    Rows of no group (past offs[-1], past masked_m[g]) are not written: their values are unspecified. Group sizes
    stay on the device (no host sync; capturable in a CUDA graph once a call outside has built the kernel). See
    ``deepgemm_jit.build_grouped`` for the alignment rules (rows of a, b and the output 16-byte multiples)."""
    return torch.ops.deepgemm_jit.grouped_mm.default(a, b, offs, masked_m, out_dtype)


@torch.library.custom_op("deepgemm_jit::grouped_mm_fp8", mutates_args=())
def _grouped_mm_fp8_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                       offs: Optional[torch.Tensor] = None, masked_m: Optional[torch.Tensor] = None,
                       out_dtype: Optional[str] = None) -> torch.Tensor:
    return _grouped_run(a, b, offs, masked_m, out_dtype, scale_a, scale_b)


@_grouped_mm_fp8_op.register_fake
def _grouped_mm_fp8_fake(a, b, scale_a, scale_b, offs=None, masked_m=None, out_dtype=None):
    shape, torch_out, _, _ = _grouped_out(a, b, offs, masked_m, out_dtype, True)
    return a.new_empty(shape, dtype=torch_out)


def grouped_mm_fp8(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   offs: Optional[torch.Tensor] = None, masked_m: Optional[torch.Tensor] = None,
                   out_dtype: Optional[str] = None) -> torch.Tensor:
    """:func:`grouped_mm` for FP8 (float8_e4m3fn / float8_e5m2) with block scales, through
    ``torch.ops.deepgemm_jit.grouped_mm_fp8``: scale_a one per 1x128 group of a's rows ((M, ceil(K/128)), or
    (G, max_m, ceil(K/128)) masked; :func:`quantize` ``"group128"`` of a), scale_b (G, ceil(N/128), ceil(K/128))
    (``"block128"`` of each b[g], stacked). ``out_dtype`` ``"bf16"`` (default), ``"fp16"`` or ``"fp32"``."""
    return torch.ops.deepgemm_jit.grouped_mm_fp8.default(a, b, scale_a, scale_b, offs, masked_m, out_dtype)


# -- Linear ------------------------------------------------------------------------------------------------------
def _no_backward(grad):
    raise RuntimeError("deepgemm_jit.torch.Linear has no backward (inference only): the GEMM passes no gradient, so "
                       "only its bias would be trained; train with torch.nn.Linear, run this one under "
                       "torch.no_grad() / torch.inference_mode()")


class Linear(torch.nn.Module):
    """Inference drop-in for ``torch.nn.Linear``: y = x @ weight.T + bias through the deepgemm-jit ops.

    x (..., in_features) -> (..., out_features); leading dimensions are flattened into M and restored.
    The bias is a separate torch add after the GEMM (a bias fused into the kernel's epilogue is a later
    issue). No backward (inference only: run under ``torch.inference_mode()`` or ``torch.no_grad()``); in grad
    mode the output still carries the bias's autograd history, and a backward through it raises a RuntimeError
    (rather than training the bias alone). ``torch.compile`` in grad mode traces with the eager backend only:
    AOTAutograd backends (the default inductor, aot_eager) trace a backward, which the ops do not have; compile
    under ``torch.no_grad()`` / ``torch.inference_mode()``.
    ``weight_format`` says what the GEMM multiplies:

    - ``"bf16"``: the 16-bit weight as stored (a bfloat16 or float16 Parameter; x of the same dtype,
      output too). Parameters and ``state_dict`` keys are those of ``nn.Linear`` (same initialisation).
    - ``"fp8_block"`` / ``"fp8_row"`` / ``"fp8_tensor"``: the weight quantized once to E4M3, kept as
      buffers ``weight`` (out_features, in_features) torch.float8_e4m3fn and ``weight_scale`` float32
      (weight ~= q * s; block128 (ceil(N/128), ceil(K/128)), row (N,), tensor (1,)); every call quantizes x
      (float32, float16 or bfloat16) by group128 / row / tensor and runs the FP8 GEMM into
      ``out_dtype`` (``"bf16"``, ``"fp16"`` or ``"fp32"``), then adds ``bias`` (a Parameter of its own
      dtype). ``.to(device)`` moves the buffers; a dtype cast (``.half()``, ``.to(torch.bfloat16)``) casts
      only the bias, never the quantized buffers. DeepSeek-V3's ``weight_scale_inv`` tensors are
      ``weight_scale`` of ``"fp8_block"`` (same values, same layout). Any in_features works; one that is
      not a multiple of 16 (or an out_features that is not a multiple of 8 for 16-bit output) is staged
      through aligned copies: slower, and the first call of a size synchronises (capture a graph after it).

    Built here, an FP8 Linear holds a zero weight to be filled by ``load_state_dict`` (``dtype`` is then
    the bias and output dtype); :meth:`from_linear` quantizes a trained ``nn.Linear`` and
    :meth:`from_quantized` takes an already quantized weight.

    Example::

        fast = deepgemm_jit.torch.Linear.from_linear(model.proj)                # shares model.proj.weight
        fp8 = deepgemm_jit.torch.Linear.from_linear(model.proj, dtype="fp8")    # block-scaled FP8 copy
        y = fp8(x)                                                              # x (batch, seq, in) bf16, CUDA
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype: torch.dtype = torch.bfloat16, weight_format: str = "bf16"):
        super().__init__()
        weight_format = _check_weight_format(weight_format)
        self.in_features = in_features
        self.out_features = out_features
        self.weight_format = weight_format
        if weight_format != "bf16":
            self.out_dtype = _out_name_of(dtype, "dtype")
            recipe = _FP8_RECIPES[weight_format]
            self.register_buffer("weight", torch.zeros((out_features, in_features), device=device,
                                                       dtype=_FP8_WEIGHT_DTYPE))
            self.register_buffer("weight_scale", torch.ones(_weight_scale_shape(recipe, out_features, in_features),
                                                            device=device, dtype=torch.float32))
            if bias:
                self.bias = torch.nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
            return
        _check_weight_dtype(dtype)
        self.out_dtype = None   # the weight's own dtype
        self.weight = torch.nn.Parameter(torch.empty((out_features, in_features), device=device, dtype=dtype))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        torch.nn.Linear.reset_parameters(self)  # nn.Linear's initialisation, on the same attributes

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, weight_format: Optional[str] = None, *,
                    dtype: Optional[str] = None, scaling: Optional[str] = None,
                    out_dtype: Optional[str] = None) -> "Linear":
        """A Linear computing ``linear``: its own 16-bit weight, or that weight quantized to FP8 once.

        Default (``weight_format="bf16"``, or nothing): holds ``linear``'s weight and bias Parameters (no
        copy: same storage); bfloat16 or float16 weights. ``dtype="fp8"`` with ``scaling="block"``
        (default), ``"row"`` or ``"tensor"`` (or ``weight_format="fp8_block"`` etc.): quantizes the weight
        (bfloat16, float16 or float32, on a CUDA device) on torch's current stream into new buffers, and
        shares the bias Parameter; ``out_dtype`` defaults to the weight's dtype (bf16, fp16, fp32).
        Example::

            fp8 = Linear.from_linear(model.mlp.up, dtype="fp8", scaling="row")
        """
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"from_linear takes a torch.nn.Linear, got {type(linear).__name__}")
        weight_format = _resolve_format(weight_format, dtype, scaling)
        if weight_format == "bf16":
            if out_dtype is not None:
                raise ValueError(f"out_dtype={out_dtype!r} applies to FP8 Linears; a 16-bit Linear writes its "
                                 "weight's dtype")
            _check_weight_dtype(linear.weight.dtype)
            new = cls.__new__(cls)
            torch.nn.Module.__init__(new)
            new.in_features = linear.in_features
            new.out_features = linear.out_features
            new.weight_format = weight_format
            new.out_dtype = None
            new.weight = linear.weight
            new.bias = linear.bias
            return new
        weight = linear.weight
        if weight.dtype not in _QUANT_SOURCES:
            raise TypeError(f"from_linear quantizes torch.bfloat16, float16 or float32 weights, got {weight.dtype}")
        if weight.device.type == "cpu":
            raise ValueError("from_linear quantizes the weight on the GPU: move the Linear to a CUDA device first "
                             "(or quantize elsewhere and use Linear.from_quantized)")
        out_name = _out_name_of(weight.dtype, "the weight") if out_dtype is None else _check_out_dtype(out_dtype)
        with torch.no_grad():
            q, scale = quantize(weight.detach(), "fp8_e4m3", _FP8_RECIPES[weight_format].weight_granularity)
        return cls._fp8(weight_format, q, scale, linear.bias, out_name)

    @classmethod
    def from_quantized(cls, weight: torch.Tensor, weight_scale: torch.Tensor, bias: Optional[torch.Tensor] = None,
                       *, scaling: str = "block", out_dtype: str = "bf16") -> "Linear":
        """An FP8 Linear holding an already quantized weight (no copy: the tensors become its buffers).

        weight (out_features, in_features) torch.float8_e4m3fn; weight_scale float32 dequantization factors
        (weight ~= q * s) of ``scaling``: ``"block"`` (ceil(N/128), ceil(K/128)) per 128x128 block,
        ``"row"`` (N,), ``"tensor"`` (1,); bias (N,) or None (a Parameter is shared, a tensor wrapped);
        all on one device. Example::

            lin = Linear.from_quantized(ckpt["w"], ckpt["w_scale_inv"], scaling="block")   # DeepSeek-V3
        """
        weight_format = _resolve_format(None, "fp8", scaling)
        if not isinstance(weight, torch.Tensor) or weight.dtype != _FP8_WEIGHT_DTYPE or weight.dim() != 2:
            raise TypeError(f"weight must be a 2-D torch.float8_e4m3fn tensor (out_features, in_features), got "
                            f"{getattr(weight, 'dtype', type(weight).__name__)} of shape "
                            f"{tuple(getattr(weight, 'shape', ()))}")
        n, k = weight.shape
        want = _weight_scale_shape(_FP8_RECIPES[weight_format], n, k)
        if not isinstance(weight_scale, torch.Tensor) or weight_scale.dtype != torch.float32:
            raise TypeError(f"weight_scale must be a torch.float32 tensor, got "
                            f"{getattr(weight_scale, 'dtype', type(weight_scale).__name__)}")
        if tuple(weight_scale.shape) != want:
            raise ValueError(f"weight_scale has shape {tuple(weight_scale.shape)}; scaling={scaling!r} for a "
                             f"({n}, {k}) weight wants {want}")
        if bias is not None and (not bias.is_floating_point() or tuple(bias.shape) != (n,)):
            raise ValueError(f"bias must be a floating-point ({n},) tensor, got {bias.dtype} {tuple(bias.shape)}")
        for t, arg in ((weight_scale, "weight_scale"), (bias, "bias")):
            if t is not None and t.device != weight.device:
                raise ValueError(f"{arg} is on {t.device} but weight is on {weight.device}")
        return cls._fp8(weight_format, weight, weight_scale, bias, _check_out_dtype(out_dtype))

    @classmethod
    def _fp8(cls, weight_format: str, q: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor],
             out_name: str) -> "Linear":
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.out_features, new.in_features = q.shape
        new.weight_format = weight_format
        new.out_dtype = out_name
        new.register_buffer("weight", q)
        new.register_buffer("weight_scale", scale)
        if bias is not None and not isinstance(bias, torch.nn.Parameter):
            bias = torch.nn.Parameter(bias, requires_grad=False)
        new.register_parameter("bias", bias)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_format == "bf16" and self.weight.dtype not in _LINEAR_DTYPES:
            # .float() / .double() made the weight one this Linear does not serve (float32 would run TF32, a
            # different accuracy contract than nn.Linear's): torch's own linear, as swap_linears leaves such layers
            return torch.nn.functional.linear(x, self.weight, self.bias)
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"x has shape {tuple(x.shape)}; this Linear takes (..., {self.in_features})")
        if self.weight_format == "bf16":
            if x.device.type == "cuda" and torch.is_autocast_enabled("cuda"):  # nn.Linear: the autocast dtype
                dtype = torch.get_autocast_dtype("cuda")
                if dtype != self.weight.dtype:  # another precision than this weight's: torch's linear, as nn.Linear
                    return torch.nn.functional.linear(x, self.weight, self.bias)
                x = x.to(dtype)
            y = gemm(x, self.weight, "nt")
        else:
            recipe = _FP8_RECIPES[self.weight_format]
            qx, sx = quantize(x.reshape(-1, self.in_features), "fp8_e4m3", recipe.input_granularity)
            y = gemm_fp8(qx, self.weight, sx, self.weight_scale, recipe.scaling, self.out_dtype)
            y = y.view(*x.shape[:-1], self.out_features)
        compiling = torch.compiler.is_compiling()
        if self.bias is not None:
            # torch.compile cannot trace the hook below (fullgraph=True failed in grad mode): there the bias is
            # detached, so a backward through the output raises as the GEMM ops' own missing autograd makes it
            y = y.add_(self.bias.detach() if compiling else self.bias)
        if y.requires_grad and not compiling:  # grad mode with a trainable bias (or x): only the bias would train
            y.register_hook(_no_backward)
        return y

    def _apply(self, fn, recurse=True):
        # Module.to(dtype)/.half() cast every floating-point buffer, float8 included: that would turn the
        # quantized weight and its scales into something the FP8 GEMM does not take (and round the scales).
        # Keep their dtypes and take only the move.
        if self.weight_format == "bf16":
            return super()._apply(fn, recurse)
        before = {name: self._buffers[name] for name in ("weight", "weight_scale")}
        super()._apply(fn, recurse)
        for name, old in before.items():
            new = self._buffers[name]
            if old is not None and new is not None and new.dtype != old.dtype:
                self._buffers[name] = old.to(device=new.device)
        return self

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # copy_ would cast a 16-bit weight into the FP8 buffer without scales: refuse it by name.
        weight = state_dict.get(prefix + "weight")
        if self.weight_format != "bf16" and weight is not None and weight.dtype != self.weight.dtype:
            error_msgs.append(f"{prefix}weight has dtype {weight.dtype}, but this {self.weight_format} Linear "
                              f"loads quantized {self.weight.dtype} weights (with {prefix}weight_scale); quantize "
                              "a 16-bit Linear with Linear.from_linear(linear, dtype='fp8')")
            return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self) -> str:
        text = (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, weight_format={self.weight_format!r}")
        return text if self.weight_format == "bf16" else f"{text}, out_dtype={self.out_dtype!r}"


def _weight_scale_shape(recipe: _Fp8Recipe, n: int, k: int) -> tuple:
    return quantization.scale_shape(recipe.weight_granularity, n, k)


def _check_weight_format(weight_format: str) -> str:
    if not isinstance(weight_format, str) or weight_format.lower() not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format={weight_format!r} is not supported; choose one of "
                         f"{', '.join(WEIGHT_FORMATS)} ('bf16': 16-bit weights as stored, bf16 or fp16)")
    return weight_format.lower()


def _resolve_format(weight_format: Optional[str], dtype: Optional[str], scaling: Optional[str]) -> str:
    """The weight_format that (weight_format) or (dtype, scaling) name; they are two spellings of one choice."""
    if weight_format is not None:
        if dtype is not None or scaling is not None:
            raise TypeError("give weight_format or dtype/scaling, not both")
        return _check_weight_format(weight_format)
    if dtype is None:
        if scaling is not None:
            raise ValueError(f"scaling={scaling!r} applies to dtype='fp8'; dtype=None keeps the 16-bit weight")
        return "bf16"
    if not isinstance(dtype, str) or dtype.lower() not in ("fp8", "fp8_e4m3"):
        raise ValueError(f"dtype={dtype!r} is not supported; choose 'fp8' (E4M3 weights and activations), or "
                         "dtype=None for the 16-bit weight as stored")
    scaling = "block" if scaling is None else scaling
    if not isinstance(scaling, str) or scaling.lower() not in _FP8_SCALINGS:
        raise ValueError(f"scaling={scaling!r} is not supported for dtype={dtype!r}; choose one of "
                         f"{', '.join(_FP8_SCALINGS)}")
    return f"fp8_{scaling.lower()}"


def _check_out_dtype(out_dtype: str) -> str:
    return dtypes.canonical(out_dtype, arg="out_dtype", allowed=_FP8_OUTPUTS)


def _out_name_of(dtype: torch.dtype, arg: str) -> str:
    for name, torch_dtype in _OUTPUT_DTYPES.items():
        if dtype == torch_dtype:
            return name
    raise TypeError(f"{arg} is {dtype}; an FP8 Linear writes torch.bfloat16, float16 or float32")


def _check_weight_dtype(dtype: torch.dtype) -> None:
    if dtype not in _LINEAR_DTYPES:
        raise TypeError(f"deepgemm_jit.torch.Linear takes torch.bfloat16 or torch.float16 weights, got {dtype}")


def _on_cuda(name: str, linear: torch.nn.Linear) -> bool:
    return linear.weight.is_cuda


def swap_linears(module: torch.nn.Module,
                 predicate: Optional[Callable[[str, torch.nn.Linear], bool]] = None, *,
                 dtype: Optional[str] = None, scaling: Optional[str] = None,
                 weight_format: Optional[str] = None, out_dtype: Optional[str] = None) -> int:
    """Replace, in place, every ``torch.nn.Linear`` below ``module`` by a :class:`Linear` computing it.

    Only modules of exactly the type ``nn.Linear`` with bfloat16 or float16 weights are candidates
    (subclasses may override ``forward``; other dtypes stay with torch). ``predicate(qualified_name, linear)``
    picks among them; the default takes those whose weight is on a CUDA device. ``module`` itself is
    never replaced (use :meth:`Linear.from_linear`). A Linear reachable under two names is replaced by one
    shared Linear. ``dtype``, ``scaling``, ``weight_format`` and ``out_dtype`` go to
    :meth:`Linear.from_linear`: by default the new Linears share the 16-bit weights; with ``dtype="fp8"``
    each weight is quantized once (all replacements are made before the first is installed, so an error
    leaves ``module`` as it was). Returns the number of Linears replaced. Example::

        n = deepgemm_jit.torch.swap_linears(model)                    # model on CUDA, bf16
        n = deepgemm_jit.torch.swap_linears(model, lambda name, m: "mlp" in name)
        n = deepgemm_jit.torch.swap_linears(model, dtype="fp8", scaling="block")
    """
    weight_format = _resolve_format(weight_format, dtype, scaling)
    choose = predicate or _on_cuda
    chosen: dict[int, torch.nn.Linear] = {}       # id -> Linear to replace (kept alive so its id is not reused)
    slots: list[tuple[torch.nn.Module, str, int]] = []   # (parent, attribute, id of the Linear there)

    def walk(parent: torch.nn.Module, prefix: str) -> None:
        # _modules, not named_children(): that one hides a module's second name, which must be swapped too.
        for child_name, child in list(parent._modules.items()):
            name = f"{prefix}{child_name}"
            if child is None:
                continue
            if id(child) in chosen:
                slots.append((parent, child_name, id(child)))
            elif (type(child) is torch.nn.Linear and child.weight.dtype in _LINEAR_DTYPES
                  and choose(name, child)):
                chosen[id(child)] = child
                slots.append((parent, child_name, id(child)))
            else:
                walk(child, name + ".")

    walk(module, "")
    replacements = {key: Linear.from_linear(linear, weight_format, out_dtype=out_dtype)
                    for key, linear in chosen.items()}
    for parent, child_name, key in slots:
        setattr(parent, child_name, replacements[key])
    return len(chosen)


__all__ = ["gemm", "gemm_fp8", "quantize", "grouped_mm", "grouped_mm_fp8", "Linear", "swap_linears",
           "WEIGHT_FORMATS"]
