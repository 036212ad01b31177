"""FLOP/byte arithmetic and statistics (pure Python, no GPU)."""
from __future__ import annotations

import math
from typing import Iterable


def gemm_flops(m: int, n: int, k: int) -> int:
    """2·M·N·K: one multiply and one add per (m, n, k)."""
    return 2 * m * n * k


def gemm_io_bytes(m: int, n: int, k: int, a_bytes: int, b_bytes: int, d_bytes: int) -> int:
    """Fewest bytes through device memory: A and B read once, D written once (sizes are per element)."""
    return m * k * a_bytes + n * k * b_bytes + m * n * d_bytes


def intensity(m: int, n: int, k: int, a_bytes: int, b_bytes: int, d_bytes: int) -> float:
    """Arithmetic intensity in FLOP per byte."""
    return gemm_flops(m, n, k) / gemm_io_bytes(m, n, k, a_bytes, b_bytes, d_bytes)


def tflops(m: int, n: int, k: int, us: float | None) -> float | None:
    if us is None or not us > 0:
        return None
    return gemm_flops(m, n, k) / (us * 1e-6) / 1e12


def gbps(io_bytes: int, us: float | None) -> float | None:
    if us is None or not us > 0:
        return None
    return io_bytes / (us * 1e-6) / 1e9


def roofline_tflops(intensity_flop_per_byte: float, peak_tflops: float, copy_tbps: float) -> float:
    """min(compute roof, bandwidth roof) at an arithmetic intensity."""
    return min(peak_tflops, copy_tbps * intensity_flop_per_byte)


def geomean(values: Iterable[float | None]) -> float | None:
    """Geometric mean of the positive finite values; None when there are none."""
    xs = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not xs:
        return None
    return math.exp(sum(math.log(v) for v in xs) / len(xs))
