"""Per-dtype facts only the benchmark needs: roofline peaks and cuBLAS ceilings on the H200.

Storage types, error bounds and error metrics come from the library (``deepgemm_jit.dtypes``,
``deepgemm_jit.reference.ERROR_BOUND`` / ``ERROR_METRIC``). A new dtype (fp8, int8, ...) is one more
``BenchDtype`` row here once the library knows its bound.
"""
from __future__ import annotations

import dataclasses

from deepgemm_jit.reference import ERROR_BOUND


@dataclasses.dataclass(frozen=True)
class BenchDtype:
    name: str                            # the library's dtype string: dg.build(..., dtype=name)
    peak_tflops: float | None = None     # datasheet dense peak, H200
    cublas_tflops: float | None = None   # best cuBLAS figure measured on this H200 (shared/anchors)

    def __post_init__(self) -> None:
        if self.name not in ERROR_BOUND:
            raise ValueError(f"{self.name}: no error bound in deepgemm_jit.reference.ERROR_BOUND")


# NOTES: cublas_tflops are the maxima of shared/anchors/h200-cublas-2026-11-29.json per kind; the fp32 entry is
# the library's FP32-accurate 3xTF32 mode, whose roof is a third of TF32's.
DTYPES: dict[str, BenchDtype] = {
    d.name: d
    for d in (
        BenchDtype("bf16", peak_tflops=989.0, cublas_tflops=767.0),
        BenchDtype("fp16", peak_tflops=989.0, cublas_tflops=682.0),
        BenchDtype("tf32", peak_tflops=494.0, cublas_tflops=367.0),
        BenchDtype("fp32", peak_tflops=165.0, cublas_tflops=52.0),
    )
}

# The H200's measured device-to-device copy (bytes read + written per second).
COPY_TBPS = 4.25


def get(name: str) -> BenchDtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; the bench knows {sorted(DTYPES)}") from None
