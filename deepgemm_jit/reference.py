"""Test and demo helpers on the GPU: random operands, float64 references, errors.

Everything here works on CuPy arrays and converts 16-bit formats with integer
bit operations, so it does not depend on CuPy's bfloat16 arithmetic support.
"""
from __future__ import annotations

import math

import numpy as np

from . import dtypes
from .spec import GemmSpec

# Error bounds of DESIGN.md ("Measuring"): relative Frobenius error vs float64.
ERROR_BOUND = {"fp16": 1e-2, "bf16": 1e-2, "tf32": 5e-3}


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
    """An output buffer filled with NaN, so that unwritten elements fail checks."""
    import cupy

    if name == "bf16":
        return cupy.full(shape, 0x7FC0, dtype=cupy.uint16).view(dtypes.numpy_dtype("bf16"))
    return cupy.full(shape, np.nan, dtype=dtypes.numpy_dtype(name))


def random_operands(spec: GemmSpec, m: int, rng=None):
    """(a, b) in the spec's layout and dtype, with fresh random values."""
    return (random_matrix(spec.a_shape(m), spec.dtype, rng),
            random_matrix(spec.b_shape(), spec.dtype, rng))


def reference(spec: GemmSpec, a, b):
    """D = op(A) op(B) in float64 on the GPU (cuBLAS DGEMM on upcast inputs)."""
    a64 = to_float64(a)
    b64 = to_float64(b)
    a_mk = a64 if spec.a_k_major else a64.T
    b_kn = b64.T if spec.b_k_major else b64
    return a_mk @ b_kn


def relative_error(out, ref) -> float:
    """||out - ref||_F / ||ref||_F in float64; inf if out has any NaN/Inf."""
    import cupy

    o = to_float64(out)
    if not bool(cupy.isfinite(o).all()):
        return math.inf
    denom = float(cupy.linalg.norm(ref))
    num = float(cupy.linalg.norm(o - ref))
    if denom == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / denom
