"""Correctness helpers on the GPU (DESIGN.md, "Measuring"): random operands, poisoned outputs, float64 references,
errors and their bounds.

Everything here works on CuPy arrays and converts 16-bit formats with integer bit operations, so it does not
depend on CuPy's bfloat16 arithmetic support. Nothing runs at import.
"""
from __future__ import annotations

import math

import numpy as np

from . import dtypes, env
from .spec import GemmSpec

# Bounds of DESIGN.md ("Measuring") on the error metric vs float64, per input dtype (fp32 = the 3xTF32 mode).
ERROR_BOUND = {"fp16": 1e-2, "bf16": 1e-2, "tf32": 5e-3, "fp32": 1e-5}
# "rel_fro": ||out - ref||_F / ||ref||_F; "cos": DeepGEMM's 1 - 2<x,y>/(|x|^2+|y|^2) (for FP8 when it lands).
ERROR_METRIC = {"fp16": "rel_fro", "bf16": "rel_fro", "tf32": "rel_fro", "fp32": "rel_fro"}

# cuBLAS DGEMM on an H200 runs at ~50-60 TFLOPS: 1.2e13 FLOP is ~0.2 s, which covers 8192^3 and every DeepSeek
# shape. Larger products are checked against an IEEE FP32 (not TF32) SGEMM on exactly upcast inputs.
REF_FP64_MAX_FLOPS = 1.2e13

POISON_BYTE = 0xFF  # 0xFF.. is a NaN in bf16, fp16, fp32, fp64 and both FP8 formats


def _to_storage(x32, name: str):
    """float32 CuPy array -> storage dtype `name` (round to nearest even)."""
    import cupy

    if name in ("fp32", "tf32"):
        return x32.astype(cupy.float32)
    if name == "fp16":
        return x32.astype(cupy.float16)
    bits = x32.astype(cupy.float32).view(cupy.uint32)
    rounded = (bits + cupy.uint32(0x7FFF) + ((bits >> 16) & cupy.uint32(1))) >> 16
    return rounded.astype(cupy.uint16).view(dtypes.numpy_dtype("bf16"))


def to_float64(x):
    """Any supported storage dtype (CuPy) -> float64 CuPy array, exactly."""
    import cupy

    if x.dtype.name == "bfloat16":
        return (x.view(cupy.uint16).astype(cupy.uint32) << 16).view(cupy.float32).astype(cupy.float64)
    return x.astype(cupy.float64)


def random_matrix(shape, name: str, rng=None, scale: float = 1.0):
    """Fresh random N(0, scale^2) values in storage dtype `name` (never zeros)."""
    import cupy

    rng = rng or cupy.random.default_rng()
    x = rng.standard_normal(shape, dtype=cupy.float32) * np.float32(scale)
    return _to_storage(x, name)


def poisoned(shape, name: str):
    """A contiguous output buffer of storage dtype `name` filled with NaN, so that unwritten elements fail checks."""
    import cupy

    x = cupy.empty(shape, dtype=dtypes.numpy_dtype(name))
    cupy.cuda.runtime.memsetAsync(x.data.ptr, POISON_BYTE, x.nbytes, cupy.cuda.get_current_stream().ptr)
    return x


def random_operands(spec: GemmSpec, m: int, rng=None):
    """(a, b) in the spec's layout and dtype, with fresh random values.

    >>> a, b = random_operands(g.spec, 4096, rng=cupy.random.default_rng(0))
    """
    return (random_matrix(spec.a_shape(m), spec.dtype, rng),
            random_matrix(spec.b_shape(), spec.dtype, rng))


def reference_kind(spec: GemmSpec, m: int) -> str:
    """How `reference` computes this product: "fp64" (DGEMM) or, above REF_FP64_MAX_FLOPS, "fp32-sgemm"."""
    return "fp64" if 2 * m * spec.n * spec.k <= REF_FP64_MAX_FLOPS else "fp32-sgemm"


def reference(spec: GemmSpec, a, b):
    """D = op(A) op(B) as a float64 (M, N) CuPy array, from exactly upcast inputs on the GPU.

    cuBLAS DGEMM up to REF_FP64_MAX_FLOPS, an IEEE FP32 SGEMM above (see `reference_kind`).
    """
    import cupy

    m = a.shape[0] if spec.a_k_major else a.shape[1]
    a_ref, b_ref = to_float64(a), to_float64(b)
    if reference_kind(spec, m) == "fp32-sgemm":
        if env.cupy_tf32():
            raise RuntimeError("CUPY_TF32=1 would make the fp32 reference a tf32 one; unset it")
        a_ref, b_ref = a_ref.astype(cupy.float32), b_ref.astype(cupy.float32)
    a_mk = a_ref if spec.a_k_major else a_ref.T
    b_kn = b_ref.T if spec.b_k_major else b_ref
    return cupy.matmul(a_mk, b_kn).astype(cupy.float64, copy=False)


def num_nonfinite(x) -> int:
    """How many elements of `x` are NaN or Inf (unwritten under poisoning, or overflow)."""
    import cupy

    return int(cupy.count_nonzero(~cupy.isfinite(to_float64(x))))


def error(out, ref, metric: str = "rel_fro") -> float:
    """The error of `out` against the float64 `ref` by `metric` (see ERROR_METRIC); NaN if out is not finite.

    NaN never passes `within_bound`; a shape mismatch raises ValueError.
    """
    import cupy

    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    o = to_float64(out)
    if not bool(cupy.isfinite(o).all()):
        return math.nan
    if metric == "rel_fro":
        denom = float(cupy.linalg.norm(ref))
        num = float(cupy.linalg.norm(o - ref))
        if denom == 0.0:
            return 0.0 if num == 0.0 else math.inf
        return num / denom
    if metric == "cos":
        x, y = o.ravel(), ref.ravel()
        denom = float(cupy.dot(x, x) + cupy.dot(y, y))
        return 0.0 if denom == 0.0 else 1.0 - 2.0 * float(cupy.dot(x, y)) / denom
    raise ValueError(f"unknown error metric {metric!r}; choose 'rel_fro' or 'cos'")


def relative_error(out, ref) -> float:
    """||out - ref||_F / ||ref||_F in float64; NaN if out has any NaN/Inf."""
    return error(out, ref, "rel_fro")


def within_bound(err: float, dtype: str) -> bool:
    """Whether an error passes the DESIGN.md bound of input dtype `dtype` (NaN never does)."""
    return not math.isnan(err) and err <= ERROR_BOUND[dtype]
