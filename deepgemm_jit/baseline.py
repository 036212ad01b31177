"""cuBLAS baselines, bound to the very arrays our kernel reads, computing the same product in the same layout.

A baseline kind is a class with ``name``, ``available()`` and ``bind(spec, a, b) -> Bound``; add a kind
(torch._scaled_mm for fp8, torch._int_mm for int8, ...) by writing one and listing it in ``KINDS``.
``Bound.fn()`` runs the product into its own preallocated output (of ``spec.out_dtype``) on the current CuPy
stream, so that the events of ``timing.py`` bracket it; ``Bound.result_f64()`` returns the last result as a
float64 CuPy (M, N) array, and ``check`` judges it like our own output before it may be timed.

Nothing here imports torch or touches the GPU at import time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Callable

from . import dtypes, env, reference
from .spec import GemmSpec

DEFAULT_ORDER = ("torch", "cupy")
# torch's FP32 matmul mode around the call: tf32 must run on TF32 tensor cores, fp32 (3xTF32) against IEEE.
_TORCH_TF32 = {"tf32": True, "fp32": False}
_SAME_WIDTH_INT = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


class BaselineUnavailable(RuntimeError):
    """This baseline kind cannot compute this product (missing package, unsupported dtype)."""


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

    def available(self) -> str | None:
        """None when usable, else why not."""
        try:
            torch = _torch()
        except BaselineUnavailable as exc:
            return str(exc)
        if not torch.cuda.is_available():
            return "torch.cuda.is_available() is False"
        return None

    def bind(self, spec: GemmSpec, a, b) -> Bound:
        import cupy

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
                torch.mm(A, B, out=out)
        else:
            # e.g. bf16 inputs, fp32 output: torch >= 2.8 has out_dtype; else mm then a cast (timed, and labelled).
            try:
                torch.mm(A[:1, :], B[:, :1], out_dtype=out_dtype)
                label += f"(out_dtype={out_name})"

                def product():
                    out.copy_(torch.mm(A, B, out_dtype=out_dtype))
            except (TypeError, RuntimeError):
                label += f"+cast({out_name})"

                def product():
                    out.copy_(torch.mm(A, B))

        # Run on the CuPy stream the events are recorded on (both default to the legacy default stream).
        cupy_stream_ptr = cupy.cuda.get_current_stream().ptr
        stream = None
        if torch.cuda.current_stream().cuda_stream != cupy_stream_ptr:
            stream = torch.cuda.ExternalStream(cupy_stream_ptr)

        def on_stream():
            return contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)

        def fn() -> None:
            with torch_fp32_mode(torch, allow_tf32), on_stream():
                product()

        def result_f64():
            with on_stream():
                return cupy.from_dlpack(out.to(torch.float64).contiguous())

        return Bound(label, fn, result_f64)


# ------------------------------------------------------------------------------------------------------- CuPy
class CupyMatmul:
    """cuBLAS through ``cupy.matmul(A, B, out=D)``: fp16, and tf32 only under CUPY_TF32=1."""

    name = "cupy"

    def available(self) -> str | None:
        return None

    def bind(self, spec: GemmSpec, a, b) -> Bound:
        import cupy

        if spec.dtype == "tf32" and not env.cupy_tf32():
            raise BaselineUnavailable("cupy.matmul computes tf32 only with CUPY_TF32=1 in the environment")
        if spec.dtype == "fp32" and env.cupy_tf32():
            raise BaselineUnavailable("CUPY_TF32=1 is set: cupy.matmul would not compute full fp32")
        if a.dtype.name not in ("float16", "float32") or dtypes.get(spec.out_dtype).numpy_name != a.dtype.name:
            raise BaselineUnavailable(f"cupy.matmul covers fp16/fp32 with out = in, not {spec.dtype}->"
                                      f"{spec.out_dtype}")
        A, B = math_operands(spec, a, b)
        out = cupy.empty((A.shape[0], B.shape[1]), dtype=a.dtype)

        def fn() -> None:
            cupy.matmul(A, B, out=out)

        return Bound(f"cupy.matmul({spec.dtype})", fn, lambda: out.astype(cupy.float64))


KINDS = {k.name: k for k in (TorchMatmul(), CupyMatmul())}


def bind(spec: GemmSpec, a, b, order: tuple[str, ...] = DEFAULT_ORDER) -> tuple[Bound | None, list[str]]:
    """The first baseline kind in `order` that computes op(a) @ op(b) of `spec`, and why the others did not.

    >>> base, reasons = bind(g.spec, a, b)      # base.fn() runs cuBLAS on a and b, into its own output
    """
    reasons: list[str] = []
    for name in order:
        kind = KINDS[name]
        why = kind.available()
        if why is not None:
            reasons.append(f"{name}: {why}")
            continue
        try:
            return kind.bind(spec, a, b), reasons
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
