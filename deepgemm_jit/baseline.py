"""cuBLAS baselines, bound to the very arrays our kernel reads, computing the same product in the same layout.

A baseline kind is a class with ``name``, ``covers(spec)``, ``available()`` and
``bind(spec, a, b, scaling=None) -> Bound``; add a kind by writing one and listing it in ``KINDS``. Kinds:
``torch`` (``torch.mm``: fp16/bf16/tf32/fp32), ``torch_scaled`` (FP8: ``torch._scaled_mm`` per-tensor and
row-wise, ``torch.nn.functional.scaled_mm`` 1x128 x 128x128 block-wise), ``torch_int`` (INT8:
``torch._int_mm``), ``cupy`` (``cupy.matmul``) and, for GEMMs with a fused epilogue, ``torch_unfused`` (cuBLAS
then separate torch ops, as a user writes them) and ``torch_scaled_unfused`` (FP8: torch's scaled matmul, then
separate torch ops); for quantize-on-store epilogues ``torch_quantized`` (the same, then the quantization as torch
ops, or cuBLASLt's FP8 output; its bind takes the static scale, so it is not one of ``KINDS``: bench.quant_epilogue
binds it). docs/fp8-baselines.md records the torch API facts (scale
layouts, size rules) and where in torch's source they come from.

``Bound.fn()`` runs the product on the current CuPy stream, so that the events of ``timing.py`` bracket it;
``Bound.result_f64()`` returns the last result as a float64 CuPy (M, N) array, and ``check`` judges it like our
own output before it may be timed. FP8 scales reach a kind as a ``Scaling`` in the library's own layout
(row-major, x ≈ q · s); whatever torch wants instead is made once in ``bind``, outside the timed call. A kind
that cannot compute a case raises ``BaselineUnavailable`` with the reason, and the row reports no baseline.

Nothing here imports torch or touches the GPU at import time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Callable

from . import dtypes, env, reference
from .spec import GemmSpec

DEFAULT_ORDER = ("torch", "torch_scaled", "torch_int", "cupy", "torch_unfused", "torch_scaled_unfused")
# torch's FP32 matmul mode around the call: tf32 must run on TF32 tensor cores, fp32 (3xTF32) against IEEE.
_TORCH_TF32 = {"tf32": True, "fp32": False}
_SAME_WIDTH_INT = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}
_FLOAT_DTYPES = ("fp16", "bf16", "tf32", "fp32")

SCALING_RECIPES = ("tensor", "row", "block")
SCALE_BLOCK = 128   # K elements per scale of A (1x128 groups) and of B (128x128 blocks), DeepSeek-V3's recipe
# torch's 1x128 x 128x128 path takes B's scales with ceil(K/128) padded up to a multiple of 4 ("L4": 16-byte
# aligned columns of the scale matrix cuBLASLt reads); see docs/fp8-baselines.md.
TORCH_128X128_K_BLOCK_MULTIPLE = 4
# torch._int_mm (CUDA): self.size(0) > 16; K and N multiples of 8 (Blas.cpp, _int_mm_out_cuda).
INT_MM_MIN_M = 17
INT_MM_MULTIPLE = 8
# torch._scaled_mm / scaled_mm (CUDA): K and N multiples of 16 ("mat2 shape ... must be divisible by 16").
SCALED_MM_MULTIPLE = 16


class BaselineUnavailable(RuntimeError):
    """This baseline kind cannot compute this product (missing package, unsupported dtype, size rule)."""


@dataclasses.dataclass(frozen=True)
class Bound:
    name: str                                  # what a report shows, e.g. "torch.mm(tf32)"
    fn: Callable[[], None]
    result_f64: Callable[[], object]


@dataclasses.dataclass(frozen=True)
class BaselineCheck:
    err: float
    is_ok: bool          # within the dtype's bound: may be timed
    note: str = ""       # why not, or what looks wrong


def _ceil_div(x: int, y: int) -> int:
    return -(-x // y)


@dataclasses.dataclass(frozen=True)
class Scaling:
    """FP8 dequantization factors as the library takes them: float32, x ≈ q · s, any strides (quantize's layouts:
    group128 M-major, the others row-major).

    ``recipe`` "tensor": scale_a (1,), scale_b (1,); "row": scale_a (M,), scale_b (N,); "block": scale_a
    (M, ceil(K/128)) per 1x128 group of A along K, scale_b (ceil(N/128), ceil(K/128)) per 128x128 block of the
    (N, K) B. Arrays are CuPy on the GPU (NumPy or CPU torch in tests).

    >>> base, reasons = bind(g.spec, qa, qb, scaling=Scaling("block", sa, sb))
    """

    recipe: str
    scale_a: object
    scale_b: object

    def __post_init__(self) -> None:
        if self.recipe not in SCALING_RECIPES:
            raise ValueError(f"scaling recipe {self.recipe!r} not in {SCALING_RECIPES}")

    @staticmethod
    def shapes(recipe: str, m: int, n: int, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(scale_a shape, scale_b shape) of `recipe` for an (M, N, K) product."""
        kb = _ceil_div(k, SCALE_BLOCK)
        return {"tensor": ((1,), (1,)), "row": ((m,), (n,)),
                "block": ((m, kb), (_ceil_div(n, SCALE_BLOCK), kb))}[recipe]

    def check(self, m: int, n: int, k: int) -> None:
        """ValueError unless the scales have the shapes of the recipe for (M, N, K)."""
        want_a, want_b = self.shapes(self.recipe, m, n, k)
        got_a, got_b = tuple(self.scale_a.shape), tuple(self.scale_b.shape)
        if (got_a, got_b) != (want_a, want_b):
            raise ValueError(f"{self.recipe} scales for M={m} N={n} K={k} are {want_a} and {want_b}, "
                             f"got {got_a} and {got_b}")

    @property
    def num_bytes(self) -> int:
        """Bytes of both scale arrays (read by the kernel, so counted in GB/s)."""
        return int(self.scale_a.nbytes) + int(self.scale_b.nbytes)


@dataclasses.dataclass(frozen=True)
class EpilogueOperands:
    """The call-time operands of a fused epilogue (``deepgemm_jit/epilogue.py``), in the output's dtype:
    bias (N,) or (M,), c and residual (M, N); alpha and beta apply with the ``beta`` word only."""

    bias: object = None
    c: object = None
    residual: object = None
    alpha: float = 1.0
    beta: float = 1.0

    def call_kwargs(self, epi) -> dict:
        """What our Gemm's call takes besides a, b and out= for the Epilogue `epi`."""
        kwargs = {name: getattr(self, name) for name, wanted in
                  (("bias", epi.bias != "none"), ("c", epi.beta), ("residual", epi.residual)) if wanted}
        if epi.beta:
            kwargs.update(alpha=self.alpha, beta=self.beta)
        return kwargs

    @property
    def num_bytes(self) -> int:
        """Bytes of the epilogue's operands (read by the kernel once each, so counted in GB/s)."""
        return sum(int(x.nbytes) for x in (self.bias, self.c, self.residual) if x is not None)


def _epilogue_text(spec) -> str:
    return getattr(spec, "epilogue", "none") or "none"


def math_operands(spec: GemmSpec, a, b):
    """(A (M, K), B (K, N)) views of stored a, b; works on CuPy arrays and torch tensors."""
    return (a if spec.a_k_major else a.T), (b.T if spec.b_k_major else b)


# ------------------------------------------------------------------------------------------------------ torch
def _torch():
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install
        raise BaselineUnavailable(f"torch does not import: {exc!r}") from None
    return torch


def _torch_cuda_missing() -> str | None:
    """None when torch imports and sees a GPU, else why not."""
    try:
        torch = _torch()
    except BaselineUnavailable as exc:
        return str(exc)
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    return None


def cupy_to_torch(x):
    """A torch tensor on the same memory as the CuPy array `x` (bf16 included).

    DLPack first; where torch refuses the dtype or maps it wrongly, through a same-width integer view
    reinterpreted in torch. The data pointer is checked: a copy here would time the wrong memory.
    """
    import cupy

    torch = _torch()
    want = getattr(torch, x.dtype.name)
    try:
        t = torch.from_dlpack(x)
    except Exception:
        t = None
    if t is None or t.dtype != want:
        t = torch.from_dlpack(x.view(getattr(cupy, _SAME_WIDTH_INT[x.dtype.itemsize]))).view(want)
    if t.data_ptr() != x.data.ptr or tuple(t.shape) != x.shape:
        raise RuntimeError(f"torch view of a CuPy array is not the same memory ({t.data_ptr():#x} vs "
                           f"{x.data.ptr:#x}, {tuple(t.shape)} vs {x.shape})")
    return t


def _torch_operand(x, torch_dtype):
    """torch view of operand `x` as `torch_dtype`: FP8 arrives as uint8 bits (or ml_dtypes float8) in CuPy."""
    t = cupy_to_torch(x)
    return t if t.dtype == torch_dtype else t.view(torch_dtype)


def _on_cupy_stream(torch) -> Callable[[], contextlib.AbstractContextManager]:
    """A context factory that runs torch work on the current CuPy stream, the one the events are recorded on
    (both default to the legacy default stream, where nothing needs switching)."""
    import cupy

    cupy_stream_ptr = cupy.cuda.get_current_stream().ptr
    if torch.cuda.current_stream().cuda_stream == cupy_stream_ptr:
        return contextlib.nullcontext
    stream = torch.cuda.ExternalStream(cupy_stream_ptr)
    return lambda: torch.cuda.stream(stream)


def _to_cupy_f64(torch, t):
    import cupy

    return cupy.from_dlpack(t.to(torch.float64).contiguous())


@contextlib.contextmanager
def torch_fp32_mode(torch, allow_tf32: bool | None):
    """Set torch's FP32 matmul mode for the duration (``fp32_precision`` where present, else ``allow_tf32``)."""
    if allow_tf32 is None:
        yield
        return
    matmul = torch.backends.cuda.matmul
    attr, value = (("fp32_precision", "tf32" if allow_tf32 else "ieee") if hasattr(matmul, "fp32_precision")
                   else ("allow_tf32", allow_tf32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates one API or the other
        old = getattr(matmul, attr)
        setattr(matmul, attr, value)
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            setattr(matmul, attr, old)


class TorchMatmul:
    """cuBLAS(Lt) through ``torch.mm(A, B, out=D)`` on torch views of the CuPy inputs, on the CuPy stream."""

    name = "torch"

    def covers(self, spec: GemmSpec) -> bool:
        return spec.dtype in _FLOAT_DTYPES and _epilogue_text(spec) == "none"

    def available(self) -> str | None:
        """None when usable, else why not."""
        return _torch_cuda_missing()

    def bind(self, spec: GemmSpec, a, b, scaling: Scaling | None = None) -> Bound:
        if not self.covers(spec) or scaling is not None:
            raise BaselineUnavailable(f"torch.mm multiplies fp16/bf16/tf32/fp32 without scales, not {spec.dtype}")
        torch = _torch()
        ta, tb = cupy_to_torch(a), cupy_to_torch(b)
        A, B = math_operands(spec, ta, tb)
        out_name = dtypes.get(spec.out_dtype).numpy_name
        out_dtype = getattr(torch, out_name)
        out = torch.empty((A.shape[0], B.shape[1]), dtype=out_dtype, device=ta.device)
        allow_tf32 = _TORCH_TF32.get(spec.dtype)
        label = "torch.mm" if allow_tf32 is None else f"torch.mm({'tf32' if allow_tf32 else 'ieee'})"
        if out_dtype == ta.dtype:
            def product():
                return torch.mm(A, B, out=out)
        else:
            # e.g. bf16 inputs, fp32 output: torch >= 2.8 has out_dtype; else mm then a cast (timed, and labelled).
            try:
                torch.mm(A[:1, :], B[:, :1], out_dtype=out_dtype)
                label += f"(out_dtype={out_name})"

                def product():
                    return out.copy_(torch.mm(A, B, out_dtype=out_dtype))
            except (TypeError, RuntimeError):
                label += f"+cast({out_name})"

                def product():
                    return out.copy_(torch.mm(A, B))

        return _torch_bound(label, torch, _on_cupy_stream(torch), out, product, allow_tf32)


# ---------------------------------------------------------------------------- torch FP8: scale layouts, calls
# Pure functions of torch tensors (CPU tensors in the tests): our scales (any strides) -> what torch checks for.
def torch_tensorwise_scales(scale_a, scale_b):
    """(1,) and (1,) -> 0-dim views: torch._scaled_mm's per-tensor scales are single float32 elements."""
    return scale_a.reshape(()), scale_b.reshape(())


def torch_rowwise_scales(scale_a, scale_b):
    """(M,) and (N,) -> (M, 1) and (1, N) contiguous views: torch._scaled_mm's row-wise layout."""
    return scale_a.reshape(-1, 1), scale_b.reshape(1, -1)


def torch_scales_1x128(scale_a):
    """(M, ceil(K/128)) of any strides -> the same values column-major ("outer-dim-major", strides exactly (1, M)),
    the layout torch's BlockWise1x128 takes for A. A copy: made once in ``bind`` (quantize's M-major scales have
    strides (1, round_up(M, 4)): the same layout only when M % 4 == 0, and torch refuses the others).

    Allocated with those strides rather than by ``.t().contiguous().t()``, which keeps the row-major strides
    when M == 1 (a (1, kb) tensor is already "contiguous") and torch then refuses stride(0) != 1.
    """
    num_rows, num_k_blocks = scale_a.shape
    out = scale_a.new_empty((num_k_blocks, num_rows)).t()
    out.copy_(scale_a)
    return out


def torch_scales_128x128(scale_b, k_block_multiple: int = TORCH_128X128_K_BLOCK_MULTIPLE):
    """(ceil(N/128), ceil(K/128)) (any strides) -> (L, ceil(N/128)) with strides (1, L), L = ceil(K/128) rounded up
    to `k_block_multiple`: the transposed, padded layout torch's BlockWise128x128 takes for mat2 = b.t().

    Padding entries (K blocks past the end of K) are 1.0: they scale nothing but are never NaN.
    ``k_block_multiple=1`` gives the unpadded layout older/other torch builds check for instead.
    """
    num_n_blocks, num_k_blocks = scale_b.shape
    padded_k_blocks = _ceil_div(num_k_blocks, k_block_multiple) * k_block_multiple
    padded = scale_b.new_ones((num_n_blocks, padded_k_blocks))
    padded[:, :num_k_blocks] = scale_b
    return padded.t()


# cuBLASLt's block-wise FP8 takes M in multiples of this (see torch_scaled_mm_calls).
BLOCKWISE_M_MULTIPLE = 4


def scaled_mm_refusal(m: int, n: int, k: int) -> str | None:
    """Why torch's CUDA scaled matmul refuses (M, N, K), or None (the size rules of docs/fp8-baselines.md)."""
    if k % SCALED_MM_MULTIPLE or n % SCALED_MM_MULTIPLE:
        return f"torch scaled matmul needs K and N multiples of {SCALED_MM_MULTIPLE} (got N={n}, K={k})"
    return None


def int_mm_refusal(m: int, n: int, k: int) -> str | None:
    """Why torch._int_mm (CUDA) refuses (M, N, K), or None (its checks in Blas.cpp, _int_mm_out_cuda)."""
    if m < INT_MM_MIN_M:
        return f"torch._int_mm needs M > 16 (got M={m})"
    if k % INT_MM_MULTIPLE or n % INT_MM_MULTIPLE:
        return f"torch._int_mm needs K and N multiples of {INT_MM_MULTIPLE} (got N={n}, K={k})"
    return None


def torch_scaled_mm_calls(torch, a, b, recipe: str, scale_a, scale_b, out, *, use_fast_accum: bool = False
                          ) -> list[tuple[str, Callable[[], object]]]:
    """Ways to compute D = (a · sa) @ (b · sb).T with torch, best first: [(label, call returning D), ...].

    a (M, K) and b (N, K) are row-major FP8 tensors, scales in our layouts (see ``Scaling``), `out` a
    preallocated (M, N) output (used where the op has ``out=``). mat2 is ``b.t()``: cuBLASLt FP8 on Hopper takes
    a row-major A and a column-major B only. The scale layouts torch wants are made here, once. Several
    candidates exist only where torch builds disagree on a layout (block scales of B when ceil(K/128) is not a
    multiple of 4); ``first_that_runs`` picks the one this torch accepts.
    """
    mat2 = b.t()
    if recipe in ("tensor", "row"):
        convert = torch_tensorwise_scales if recipe == "tensor" else torch_rowwise_scales
        sa, sb = convert(scale_a, scale_b)

        def call():
            return torch._scaled_mm(a, mat2, sa, sb, out_dtype=out.dtype, use_fast_accum=use_fast_accum, out=out)

        return [(f"torch._scaled_mm({recipe}{', fast_accum' if use_fast_accum else ''})", call)]
    if recipe != "block":
        raise ValueError(f"scaling recipe {recipe!r} not in {SCALING_RECIPES}")
    F = torch.nn.functional
    if not hasattr(F, "scaled_mm") or not hasattr(F, "ScalingType"):
        return []  # torch < 2.10: no public block-scaled API
    sa = torch_scales_1x128(scale_a)
    num_k_blocks = scale_b.shape[1]
    multiples = [TORCH_128X128_K_BLOCK_MULTIPLE]
    if num_k_blocks % TORCH_128X128_K_BLOCK_MULTIPLE:
        multiples.append(1)  # the two layouts differ only here
    calls = []
    for multiple in multiples:
        sb = torch_scales_128x128(scale_b, multiple)

        def call(sb=sb):  # F.scaled_mm has no out=: it returns a new tensor from torch's caching allocator
            return F.scaled_mm(a, mat2, sa, F.ScalingType.BlockWise1x128, sb, F.ScalingType.BlockWise128x128,
                               output_dtype=out.dtype, use_fast_accum=use_fast_accum)

        pad = "" if multiple == TORCH_128X128_K_BLOCK_MULTIPLE else ", unpadded"
        calls.append((f"F.scaled_mm(1x128,128x128{pad})", call))
    num_rows = a.shape[0]
    if num_rows % BLOCKWISE_M_MULTIPLE:
        # cuBLASLt refuses block-wise FP8 when M is no multiple of 4 (CUBLAS_STATUS_NOT_SUPPORTED on the H200: the
        # M-major 1x128 scales' columns must be 16-byte aligned). Then the same product with A's rows padded to a
        # multiple of 4 (zero rows, scale 1.0; copies made once here) and D's first M rows: <= 3 extra rows of work.
        rows = _ceil_div(num_rows, BLOCKWISE_M_MULTIPLE) * BLOCKWISE_M_MULTIPLE
        a_pad = a.new_zeros((rows, a.shape[1]))
        a_pad[:num_rows] = a
        sa_rows = scale_a.new_ones((rows, scale_a.shape[1]))
        sa_rows[:num_rows] = scale_a
        sa_pad = torch_scales_1x128(sa_rows)
        for multiple in multiples:
            sb = torch_scales_128x128(scale_b, multiple)

            def padded_call(sb=sb):
                return F.scaled_mm(a_pad, mat2, sa_pad, F.ScalingType.BlockWise1x128, sb,
                                   F.ScalingType.BlockWise128x128, output_dtype=out.dtype,
                                   use_fast_accum=use_fast_accum)[:num_rows]

            pad = "" if multiple == TORCH_128X128_K_BLOCK_MULTIPLE else ", unpadded"
            calls.append((f"F.scaled_mm(1x128,128x128{pad}, M padded to {BLOCKWISE_M_MULTIPLE})", padded_call))
    return calls


def first_that_runs(calls: list[tuple[str, Callable[[], object]]], what: str) -> tuple[str, Callable[[], object]]:
    """The first (label, call) that runs once without raising; BaselineUnavailable with every refusal if none.

    torch checks shapes, strides and cuBLAS support (e.g. block scales at M=1: CUBLAS_STATUS_NOT_SUPPORTED) on
    the host before launching, so a refusal here leaves the CUDA context usable.
    """
    if not calls:
        raise BaselineUnavailable(f"this torch has no API for {what}")
    refusals = []
    for label, call in calls:
        try:
            call()
            return label, call
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            refusals.append(f"{label}: {type(exc).__name__}: {first_line[:300]}")
    raise BaselineUnavailable(f"torch refuses {what}: " + " | ".join(refusals))


class TorchScaledMM:
    """FP8 through torch on the CuPy inputs' memory: ``torch._scaled_mm`` (per-tensor, row-wise scales, into a
    preallocated output) and ``torch.nn.functional.scaled_mm`` (1x128 x 128x128 block scales), on the CuPy
    stream, with ``use_fast_accum`` as the spec says (default False: FP32 promotion, like ours)."""

    name = "torch_scaled"

    def covers(self, spec: GemmSpec) -> bool:
        return spec.dtype in dtypes.FP8_DTYPES and _epilogue_text(spec) == "none"

    def available(self) -> str | None:
        return _torch_cuda_missing()

    def bind(self, spec: GemmSpec, a, b, scaling: Scaling | None = None) -> Bound:
        if not self.covers(spec):
            raise BaselineUnavailable(f"torch scaled matmul multiplies fp8, not {spec.dtype}")
        torch, on_stream, out, label, call = _scaled_product(spec, a, b, scaling)
        return _torch_bound(label, torch, on_stream, out, call)


def _torch_bound(label: str, torch, on_stream, out, call: Callable[[], object],
                 allow_tf32: bool | None = None) -> Bound:
    """A Bound whose fn() runs `call` (returning D, which may be a fresh tensor) on the CuPy stream in torch's FP32
    matmul mode for `allow_tf32` (torch_fp32_mode), and whose result_f64 reads the last D (`out` before any run)."""
    last = [out]

    def fn() -> None:
        with torch_fp32_mode(torch, allow_tf32), on_stream():
            last[0] = call()

    def result_f64():
        with on_stream():
            return _to_cupy_f64(torch, last[0])

    return Bound(label, fn, result_f64)


def _scaled_product(spec: GemmSpec, a, b, scaling: Scaling | None, out_dtype: str | None = None):
    """(torch, on_stream, out, label, call returning D) of the FP8 product of `spec` through torch (the first of
    torch_scaled_mm_calls that runs), bound to the CuPy operands a (M, K), b (N, K) and `scaling`'s scales; D of
    `out_dtype` (default the spec's)."""
    if scaling is None:
        raise BaselineUnavailable("fp8 needs scales: pass scaling=Scaling(recipe, scale_a, scale_b)")
    spec_scaling = getattr(spec, "scaling", scaling.recipe)
    if spec_scaling != scaling.recipe:
        raise ValueError(f"the spec scales {spec_scaling!r}, the scales given are {scaling.recipe!r}")
    if spec.layout != "nt":
        raise BaselineUnavailable(f"torch scaled matmul takes a (M, K) and b (N, K) K-contiguous (layout nt), "
                                  f"not {spec.layout}")
    m, n, k = a.shape[0], spec.n, spec.k
    scaling.check(m, n, k)
    why = scaled_mm_refusal(m, n, k)
    if why:
        raise BaselineUnavailable(why)
    torch = _torch()
    ta = _torch_operand(a, getattr(torch, dtypes.get(spec.dtype).numpy_name))
    tb = _torch_operand(b, getattr(torch, dtypes.get(getattr(spec, "b_dtype", None) or spec.dtype).numpy_name))
    on_stream = _on_cupy_stream(torch)
    with on_stream():  # the scale copies too: they read what the CuPy stream wrote
        out = torch.empty((m, n), dtype=getattr(torch, dtypes.get(out_dtype or spec.out_dtype).numpy_name),
                          device=ta.device)
        calls = torch_scaled_mm_calls(torch, ta, tb, scaling.recipe, cupy_to_torch(scaling.scale_a),
                                      cupy_to_torch(scaling.scale_b), out,
                                      use_fast_accum=bool(getattr(spec, "fast_accum", False)))
        label, call = first_that_runs(calls, f"{scaling.recipe}-scaled {spec.dtype} at M={m} N={n} K={k}")
    return torch, on_stream, out, label, call


class TorchIntMM:
    """INT8 x INT8 -> INT32 through ``torch._int_mm(a, b.t(), out=D)`` (cuBLASLt) on the CuPy inputs' memory."""

    name = "torch_int"

    def covers(self, spec: GemmSpec) -> bool:
        return spec.dtype == "int8" and _epilogue_text(spec) == "none"

    def available(self) -> str | None:
        return _torch_cuda_missing()

    def bind(self, spec: GemmSpec, a, b, scaling: Scaling | None = None) -> Bound:
        if not self.covers(spec) or spec.out_dtype != "int32" or scaling is not None:
            raise BaselineUnavailable(f"torch._int_mm computes int8 x int8 -> int32 without scales, not "
                                      f"{spec.dtype} -> {spec.out_dtype}{' with scales' if scaling else ''}")
        if spec.layout != "nt":
            raise BaselineUnavailable(f"torch._int_mm is bound for layout nt (a (M, K), b (N, K)), not {spec.layout}")
        m, n, k = a.shape[0], spec.n, spec.k
        why = int_mm_refusal(m, n, k)
        if why:
            raise BaselineUnavailable(why)
        torch = _torch()
        ta, tb = cupy_to_torch(a), cupy_to_torch(b)
        mat2 = tb.t()   # column-major (K, N): the "TN" operand order cuBLASLt's integer GEMM wants
        on_stream = _on_cupy_stream(torch)
        with on_stream():
            out = torch.empty((m, n), dtype=torch.int32, device=ta.device)

            def call():
                return torch._int_mm(ta, mat2, out=out)

            label, call = first_that_runs([("torch._int_mm", call)], f"int8 at M={m} N={n} K={k}")

        def fn() -> None:
            with on_stream():
                call()

        def result_f64():
            with on_stream():
                return _to_cupy_f64(torch, out)

        return Bound(label, fn, result_f64)


# ------------------------------------------------------------------------- torch: cuBLAS, then separate ops
def torch_unfused_call(torch, epi, A, B, ops: EpilogueOperands, out,
                       scaled_product: tuple[str, Callable[[], object]] | None = None
                       ) -> tuple[str, Callable[[], object]]:
    """(label, call returning D) of D = act(alpha * A @ B + beta * C + bias) + residual, as a user writes it in
    torch: one cuBLAS call for the product (and C, and the bias where the GEMM takes it), then one kernel per op.
    Gated units (swiglu / geglu): act(gate) * up of the interleaved product's halves, (M, N / 2), then the residual.
    `scaled_product` (label, call returning the product): FP8's scaled matmul instead of A @ B (A and B unused);
    C and the bias are then separate ops too (torch's scaled matmuls take no C; the bias is added as its own op for
    every recipe alike, although ``torch._scaled_mm`` takes a ``bias=`` with some recipes: a slightly slower
    baseline there).

    A (M, K) and B (K, N) are math-order torch views, `out` a preallocated (M, N) tensor of the output dtype,
    the operands of `ops` torch tensors of that dtype, `epi` an ``Epilogue``. ``F.linear(x, w, bias)`` is
    ``aten::addmm(bias, x, w.t())``; it runs here as ``torch.addmm(bias, A, B, out=out)``, the same cuBLASLt
    call (bias fused by cuBLASLt's own epilogue) into preallocated memory. Each later op writes `out` in place
    where torch has an in-place or out= form (``F.gelu`` has neither: it returns a fresh tensor).
    """
    F = torch.nn.functional
    steps: list[str] = []
    if scaled_product is not None:
        steps.append(scaled_product[0])
        if epi.beta:
            steps.append(f"mul({ops.alpha:g}) + add(C, alpha={ops.beta:g})")
        if epi.bias != "none":
            steps.append("add(bias)" if epi.bias == "col" else "add(bias_row)")
    elif epi.beta:
        steps.append(f"addmm(C, beta={ops.beta:g}, alpha={ops.alpha:g})")
        if epi.bias != "none":
            steps.append("add(bias)" if epi.bias == "col" else "add(bias_row)")
    elif epi.bias == "col":
        steps.append("F.linear(bias)")
    elif epi.bias == "row":
        steps.append("addmm(bias_row[:, None])")
    else:
        steps.append("mm")
    if epi.activation != "none":
        steps.append({"gelu": "F.gelu", "gelu_tanh": "F.gelu(tanh)", "relu": "F.relu_", "silu": "F.silu_",
                      "sigmoid": "sigmoid"}[epi.activation])
    if epi.is_gated:
        steps.append(("F.silu" if epi.gate == "swiglu" else "F.gelu") + "(gate) * up")
    if epi.residual:
        steps.append("add(residual)")
    bias = None if ops.bias is None else (ops.bias if epi.bias == "col" else ops.bias[:, None])

    def product():
        if scaled_product is not None:
            y = scaled_product[1]()
            if epi.beta:
                y.mul_(ops.alpha).add_(ops.c, alpha=ops.beta)
            return y.add_(bias) if bias is not None else y
        if epi.beta:
            torch.addmm(ops.c, A, B, beta=ops.beta, alpha=ops.alpha, out=out)
            if bias is not None:
                out.add_(bias)
        elif bias is not None:
            torch.addmm(bias, A, B, out=out)
        else:
            torch.mm(A, B, out=out)
        return out

    def activation(y):
        if epi.activation == "relu":
            return F.relu(y, inplace=True)
        if epi.activation == "silu":
            return F.silu(y, inplace=True)
        if epi.activation == "sigmoid":
            return torch.sigmoid(y, out=y)
        if epi.activation in ("gelu", "gelu_tanh"):
            return F.gelu(y, approximate="tanh" if epi.activation == "gelu_tanh" else "none")
        return y

    def gated(y):
        # B's rows interleave gate and up in blocks of 8 (epilogue.interleave_gate_up): D's column block c of 16 is
        # gate columns 8c.. then up columns 8c..; what a torch user does with separate projections (act(g) * u,
        # two kernels after the GEMM) on strided views of the one product. (M, N / 2), a fresh tensor.
        blocks = y.view(y.shape[0], -1, 2, 8)
        gate, up = blocks[:, :, 0, :], blocks[:, :, 1, :]
        act = F.silu(gate) if epi.gate == "swiglu" else F.gelu(gate)
        return torch.mul(act, up).reshape(y.shape[0], -1)

    def call():
        y = product()
        y = gated(y) if epi.is_gated else activation(y)
        if epi.residual:
            y = torch.add(y, ops.residual, out=y if epi.is_gated else out)
        return y

    return " + ".join(steps), call


class TorchUnfused:
    """A GEMM with a fused epilogue, unfused: cuBLAS(Lt) through torch for the product (with C and the column
    bias where cuBLAS takes them), then the activation and the residual as separate torch ops
    (``torch_unfused_call``), on torch views of the CuPy operands, on the CuPy stream. 16/32-bit only."""

    name = "torch_unfused"

    def covers(self, spec: GemmSpec) -> bool:
        return spec.dtype in _FLOAT_DTYPES and _epilogue_text(spec) != "none"

    def available(self) -> str | None:
        return _torch_cuda_missing()

    def bind(self, spec: GemmSpec, a, b, scaling: Scaling | None = None,
             epilogue: EpilogueOperands | None = None) -> Bound:
        if not self.covers(spec) or scaling is not None:
            raise BaselineUnavailable(f"torch unfused epilogues cover fp16/bf16/tf32/fp32 GEMMs with an epilogue, "
                                      f"not {spec.dtype} with {_epilogue_text(spec)!r}")
        if epilogue is None:
            raise BaselineUnavailable(f"epilogue {spec.epilogue!r} needs its operands: pass epilogue="
                                      "EpilogueOperands(...)")
        torch = _torch()
        ta, tb = cupy_to_torch(a), cupy_to_torch(b)
        out_dtype = getattr(torch, dtypes.get(spec.out_dtype).numpy_name)
        if out_dtype != ta.dtype:
            raise BaselineUnavailable(f"torch.addmm keeps the input dtype: {spec.dtype} -> {spec.out_dtype} is "
                                      "not one call")
        A, B = math_operands(spec, ta, tb)
        ops = _torch_epilogue_operands(epilogue)
        out = torch.empty((A.shape[0], B.shape[1]), dtype=out_dtype, device=ta.device)
        label, call = torch_unfused_call(torch, spec.epi, A, B, ops, out)
        allow_tf32 = _TORCH_TF32.get(spec.dtype)
        if allow_tf32 is not None:
            label += f" ({'tf32' if allow_tf32 else 'ieee'})"
        return _torch_bound(f"torch: {label}", torch, _on_cupy_stream(torch), out, call, allow_tf32)


class TorchScaledUnfused:
    """An FP8 GEMM with a fused epilogue, unfused: torch's scaled matmul for the product (TorchScaledMM's call),
    then C, the bias, the activation and the residual as separate torch ops (``torch_unfused_call``), on the CuPy
    stream. Outputs of 16 or 32 bits (no quantize-on-store)."""

    name = "torch_scaled_unfused"

    def covers(self, spec: GemmSpec) -> bool:
        return (spec.dtype in dtypes.FP8_DTYPES and _epilogue_text(spec) != "none"
                and spec.out_dtype in ("bf16", "fp16", "fp32"))

    def available(self) -> str | None:
        return _torch_cuda_missing()

    def bind(self, spec: GemmSpec, a, b, scaling: Scaling | None = None,
             epilogue: EpilogueOperands | None = None) -> Bound:
        if not self.covers(spec):
            raise BaselineUnavailable(f"torch scaled matmul + separate ops cover fp8 GEMMs with an epilogue and a "
                                      f"16/32-bit output, not {spec.dtype} -> {spec.out_dtype} with "
                                      f"{_epilogue_text(spec)!r}")
        if epilogue is None:
            raise BaselineUnavailable(f"epilogue {spec.epilogue!r} needs its operands: pass epilogue="
                                      "EpilogueOperands(...)")
        torch, on_stream, out, product_label, product = _scaled_product(spec, a, b, scaling)
        ops = _torch_epilogue_operands(epilogue)
        label, call = torch_unfused_call(torch, spec.epi, None, None, ops, out,
                                         scaled_product=(product_label, product))
        return _torch_bound(f"torch: {label}", torch, on_stream, out, call)


def _torch_epilogue_operands(epilogue: EpilogueOperands) -> EpilogueOperands:
    """`epilogue`'s CuPy operands as torch views (alpha and beta as they are)."""
    return EpilogueOperands(*(None if x is None else cupy_to_torch(x)
                              for x in (epilogue.bias, epilogue.c, epilogue.residual)),
                            alpha=epilogue.alpha, beta=epilogue.beta)


# ------------------------------------------------------------------- torch: quantize-on-store as separate ops
def torch_quantize_call(torch, quant: str, quant_scale=None) -> tuple[str, Callable[[], object]]:
    """(label, quantize(y) -> (q, scales or None)) of the quantize-on-store kind `quant` (epilogue.QUANTS) as a torch
    user writes it after the GEMM: separate ops on the (M, N) 16/32-bit product y, in float32, one kernel each.

    - ``fp8_g128``: per row and 128 columns (a partial last group padded with zeros), s = amax / 448 (1 where the
      group is all zero), q = E4M3(clamp(x / s, -448, 448)); scales (M, ceil(N/128)) float32, row-major;
    - ``fp8_tensor`` / ``int8_tensor``: q = E4M3 / INT8 of x / s for the static (1,) float32 tensor `quant_scale`
      (INT8 rounded half to even and saturated to [-127, 127], as the kernel does).
    y may be overwritten (float32 products are divided in place)."""
    F = torch.nn.functional
    fp8_max = dtypes.QUANT_MAX["fp8_e4m3"]
    if quant == "fp8_g128":
        def quantize(y):
            m, n = y.shape
            x = y.float()
            pad = -n % SCALE_BLOCK
            groups = (F.pad(x, (0, pad)) if pad else x).view(m, -1, SCALE_BLOCK)
            amax = groups.abs().amax(dim=2)
            s = torch.where(amax > 0, amax / fp8_max, torch.ones_like(amax))
            q = groups.div_(s.unsqueeze(2)).clamp_(-fp8_max, fp8_max).to(torch.float8_e4m3fn).view(m, -1)
            return (q[:, :n] if pad else q), s

        return "amax(1x128) + div + clamp + to(e4m3)", quantize
    if quant not in ("fp8_tensor", "int8_tensor"):
        raise ValueError(f"quant {quant!r}: no torch quantization for it")
    if quant_scale is None:
        raise BaselineUnavailable(f"quant_{quant} needs its static scale: pass quant_scale=")
    is_int8 = quant == "int8_tensor"
    limit = dtypes.QUANT_MAX["int8"] if is_int8 else fp8_max
    target = torch.int8 if is_int8 else torch.float8_e4m3fn

    def quantize_static(y):
        x = y.float().div_(quant_scale)
        if is_int8:
            x.round_()
        return x.clamp_(-limit, limit).to(target), None

    return f"div(s){' + round' if is_int8 else ''} + clamp + to({'int8' if is_int8 else 'e4m3'})", quantize_static


def _unquantized_dtype(spec: GemmSpec) -> str:
    """The dtype a torch user's product has before quantizing: 16-bit inputs keep theirs, TF32 / FP32 give
    float32, FP8 products are asked for in BF16."""
    return spec.dtype if spec.dtype in ("fp16", "bf16") else "fp32" if spec.dtype in _FLOAT_DTYPES else "bf16"


class TorchQuantized:
    """A GEMM with quantize-on-store, unfused: the product and the epilogue's operations before the quantization
    as ``torch_unfused`` / ``torch_scaled_unfused`` compute them (into the input's 16-bit type, FP32 for TF32 / FP32,
    BF16 for FP8), then the quantization as separate torch ops (``torch_quantize_call``). An FP8 per-tensor GEMM
    whose only epilogue is quant_fp8_tensor gets cuBLASLt's own FP8 output instead, one call:
    ``torch._scaled_mm(out_dtype=float8_e4m3fn)`` with 1 / s folded into A's scale (scale_a / s, made once at bind).
    ``scale_result=1 / s`` would be the natural form, but torch 2.10 and 2.11 drop it on the FP8-output path
    (pytorch/pytorch#190449: the output came back unscaled on the H200, session 58). cuBLASLt multiplies by the
    folded factor, so a q may sit one FP8 step from ours. ``result_f64`` is the dequantized q (q · s) as float64."""

    name = "torch_quantized"

    def covers(self, spec: GemmSpec) -> bool:
        epi = getattr(spec, "epi", None)
        return (epi is not None and epi.quant != "none"
                and spec.dtype in _FLOAT_DTYPES + dtypes.FP8_DTYPES and spec.layout == "nt")

    def available(self) -> str | None:
        return _torch_cuda_missing()

    def bind(self, spec: GemmSpec, a, b, scaling: Scaling | None = None,
             epilogue: EpilogueOperands | None = None, quant_scale=None) -> Bound:
        if not self.covers(spec):
            raise BaselineUnavailable(f"torch quantized baselines cover float and fp8 GEMMs (layout nt) with a "
                                      f"quantize-on-store epilogue, not {spec.dtype} {spec.layout} with "
                                      f"{_epilogue_text(spec)!r}")
        epi = spec.epi
        before = dataclasses.replace(epi, quant="none")   # what runs before the quantization
        product_dtype = _unquantized_dtype(spec)
        scale_t = None if quant_scale is None else cupy_to_torch(quant_scale)
        ops = _torch_epilogue_operands(epilogue or EpilogueOperands())  # in the product's dtype (bias included)
        if spec.dtype in dtypes.FP8_DTYPES:
            # (the product runs once here even where cuBLASLt's FP8 output replaces it: _scaled_product's
            # first_that_runs is how torch's acceptance of these operands and scales is checked)
            torch, on_stream, out, product_label, product = _scaled_product(spec, a, b, scaling, product_dtype)
            if epi.quant == "fp8_tensor" and before.is_identity and scaling.recipe == "tensor" and scale_t is not None:
                return self._lt_fp8_output(torch, on_stream, a, b, scaling, scale_t)
            label, call = torch_unfused_call(torch, before, None, None, ops, out,
                                             scaled_product=(product_label, product))
        else:
            torch = _torch()
            on_stream = _on_cupy_stream(torch)
            A, B = math_operands(spec, cupy_to_torch(a), cupy_to_torch(b))
            out = torch.empty((A.shape[0], B.shape[1]), dtype=getattr(torch, dtypes.get(product_dtype).numpy_name),
                              device=A.device)
            label, call = torch_unfused_call(torch, before, A, B, ops, out)
        quant_label, quantize = torch_quantize_call(torch, epi.quant, scale_t)
        last = [None]

        def fn() -> None:
            with torch_fp32_mode(torch, _TORCH_TF32.get(spec.dtype)), on_stream():
                last[0] = quantize(call())

        def result_f64():
            with on_stream():
                q, s = last[0]
            return _dequantized_f64(torch, epi.quant, q, s if s is not None else scale_t)

        return Bound(f"torch: {label} + {quant_label}", fn, result_f64)

    @staticmethod
    def _lt_fp8_output(torch, on_stream, a, b, scaling: Scaling, scale_t) -> Bound:
        ta, tb = (_torch_operand(x, torch.float8_e4m3fn) for x in (a, b))
        with on_stream():
            sa, sb = torch_tensorwise_scales(cupy_to_torch(scaling.scale_a), cupy_to_torch(scaling.scale_b))
            sa_over_s = (sa / scale_t.reshape(sa.shape)).float()
        last = [None]

        def fn() -> None:
            with on_stream():
                last[0] = torch._scaled_mm(ta, tb.t(), sa_over_s, sb, out_dtype=torch.float8_e4m3fn)

        def result_f64():
            return _dequantized_f64(torch, "fp8_tensor", last[0], scale_t)

        return Bound("torch._scaled_mm(tensor, e4m3 out, scale_a / s)", fn, result_f64)


def _dequantized_f64(torch, quant: str, q, scales):
    """float64 CuPy q · s of a torch result quantized as `quant` (scales (1,) for a static scale, (M, G) for
    1x128 groups)."""
    import cupy

    is_int8 = quant == "int8_tensor"
    bits = cupy.from_dlpack(q.contiguous().view(torch.int8 if is_int8 else torch.uint8))
    if quant == "fp8_g128":
        return reference.dequantize_reference(bits, cupy.from_dlpack(scales.contiguous()), "fp8_e4m3", "group128")
    values = bits.astype(cupy.float64) if is_int8 else reference.decode_fp8(bits, "fp8_e4m3")
    return values * float(cupy.from_dlpack(scales.reshape(1)).get()[0])


# ------------------------------------------------------------------------------------------------------- CuPy
class CupyMatmul:
    """cuBLAS through ``cupy.matmul(A, B, out=D)``: fp16, and tf32 only under CUPY_TF32=1."""

    name = "cupy"

    def covers(self, spec: GemmSpec) -> bool:
        return spec.dtype in _FLOAT_DTYPES and _epilogue_text(spec) == "none"

    def available(self) -> str | None:
        return None

    def bind(self, spec: GemmSpec, a, b, scaling: Scaling | None = None) -> Bound:
        import cupy

        if spec.dtype == "tf32" and not env.cupy_tf32():
            raise BaselineUnavailable("cupy.matmul computes tf32 only with CUPY_TF32=1 in the environment")
        if spec.dtype == "fp32" and env.cupy_tf32():
            raise BaselineUnavailable("CUPY_TF32=1 is set: cupy.matmul would not compute full fp32")
        if (scaling is not None or a.dtype.name not in ("float16", "float32")
                or dtypes.get(spec.out_dtype).numpy_name != a.dtype.name):
            raise BaselineUnavailable(f"cupy.matmul covers fp16/fp32 with out = in, not {spec.dtype}->"
                                      f"{spec.out_dtype}")
        A, B = math_operands(spec, a, b)
        out = cupy.empty((A.shape[0], B.shape[1]), dtype=a.dtype)

        def fn() -> None:
            cupy.matmul(A, B, out=out)

        return Bound(f"cupy.matmul({spec.dtype})", fn, lambda: out.astype(cupy.float64))


KINDS = {k.name: k for k in (TorchMatmul(), TorchScaledMM(), TorchIntMM(), CupyMatmul(), TorchUnfused(),
                             TorchScaledUnfused())}


def bind(spec: GemmSpec, a, b, order: tuple[str, ...] = DEFAULT_ORDER, *, scaling: Scaling | None = None,
         epilogue: EpilogueOperands | None = None) -> tuple[Bound | None, list[str]]:
    """The first baseline kind in `order` that computes op(a) @ op(b) of `spec`, and why the others did not.

    Kinds that do not cover the dtype at all (torch.mm for fp8, ...) are passed over without a reason.
    `scaling` carries FP8 scales in the library's layout (see ``Scaling``); a spec with a fused epilogue binds
    only kinds that compute it (``torch_unfused``, ``torch_scaled_unfused``), with its operands in `epilogue`.

    >>> base, reasons = bind(g.spec, a, b)      # base.fn() runs cuBLAS on a and b, into its own output
    >>> base, reasons = bind(g.spec, qa, qb, scaling=Scaling("row", sa, sb))
    >>> base, reasons = bind(g.spec, a, b, epilogue=EpilogueOperands(bias=bias, residual=res))
    """
    reasons: list[str] = []
    covering = [name for name in order if KINDS[name].covers(spec)]
    if not covering:
        epi = _epilogue_text(spec)
        with_epi = "" if epi == "none" else f" with epilogue {epi!r}"
        return None, [f"no baseline kind in {list(order)} computes {spec.dtype}{with_epi}"]
    extra = {} if _epilogue_text(spec) == "none" else {"epilogue": epilogue}
    for name in covering:
        kind = KINDS[name]
        why = kind.available()
        if why is not None:
            reasons.append(f"{name}: {why}")
            continue
        try:
            return kind.bind(spec, a, b, scaling=scaling, **extra), reasons
        except BaselineUnavailable as exc:
            reasons.append(f"{name}: {exc}")
    return None, reasons


def check(base: Bound, spec: GemmSpec, ref) -> BaselineCheck:
    """Run the baseline once and judge its result against the float64 `ref` like ours: only a passing one is timed."""
    import cupy

    base.fn()
    cupy.cuda.get_current_stream().synchronize()
    err = reference.error(base.result_f64(), ref, reference.ERROR_METRIC[spec.dtype])
    if not reference.within_bound(err, spec.dtype):
        return BaselineCheck(err, False, f"baseline {base.name} failed its check (err {err:.3e}): not timed")
    if _TORCH_TF32.get(spec.dtype) and err < 1e-5:
        return BaselineCheck(err, True, f"baseline err {err:.1e} looks like IEEE fp32, not tf32")
    return BaselineCheck(err, True)
