"""Per-dtype facts only the benchmark needs: what a bench dtype builds and feeds, roofline peaks, cuBLAS ceilings.

A bench dtype is a name on the command line (``--dtype fp8_block``) and in the rows' ``dtype`` column. For the
16/32-bit types it is the library's dtype itself. For 8-bit types it is a *recipe*: the library dtype to build,
the scaling the kernel applies (``dg.build(..., scaling=...)``), and how each operand is quantized from its
float inputs (``reference.quantize_reference`` granularity of A and of B).

Storage types, error bounds and error metrics come from the library (``deepgemm_jit.dtypes``,
``deepgemm_jit.reference.ERROR_BOUND`` / ``ERROR_METRIC``). A new dtype or recipe is one more ``BenchDtype`` row
here once the library knows its bound.
"""
from __future__ import annotations

import dataclasses

from deepgemm_jit.reference import ERROR_BOUND
from deepgemm_jit.spec import LAYOUTS

# dg.build(scaling=...) values, and the quantize_reference granularities each operand may take.
SCALINGS = ("tensor", "row", "block")
GRANULARITIES = ("tensor", "row", "group128", "block128")


@dataclasses.dataclass(frozen=True)
class BenchDtype:
    name: str                            # --dtype and the rows' dtype column
    peak_tflops: float | None = None     # datasheet dense peak, H200 (TOPS for int8)
    cublas_tflops: float | None = None   # best torch/cuBLAS figure measured on this H200 (shared/anchors)
    library_dtype: str | None = None     # dg.build(dtype=...); None: the name itself
    scaling: str | None = None           # dg.build(scaling=...) for FP8 recipes; None: no scales
    quant_a: str | None = None           # quantize_reference granularity of A (M, K); None: not quantized
    quant_b: str | None = None           # ... of B (N, K)
    layouts: tuple[str, ...] = LAYOUTS   # the layouts the library builds for it

    def __post_init__(self) -> None:
        if self.lib not in ERROR_BOUND:
            raise ValueError(f"{self.name}: no error bound for {self.lib!r} in deepgemm_jit.reference.ERROR_BOUND")
        if (self.quant_a is None) != (self.quant_b is None):
            raise ValueError(f"{self.name}: quantize both operands or neither")
        for q in (self.quant_a, self.quant_b):
            if q is not None and q not in GRANULARITIES:
                raise ValueError(f"{self.name}: granularity {q!r} not in {GRANULARITIES}")
        if self.scaling is not None and (self.scaling not in SCALINGS or self.quant_a is None):
            raise ValueError(f"{self.name}: scaling {self.scaling!r} needs quantized operands and one of {SCALINGS}")
        if not self.layouts or set(self.layouts) - set(LAYOUTS):
            raise ValueError(f"{self.name}: layouts {self.layouts} not within {LAYOUTS}")

    @property
    def lib(self) -> str:
        """The library's dtype string: dg.build(..., dtype=lib)."""
        return self.library_dtype or self.name

    @property
    def is_quantized(self) -> bool:
        """8-bit operands made by quantizing float inputs (FP8 with scales, INT8 without)."""
        return self.quant_a is not None

    @property
    def unit(self) -> str:
        """What 2MNK/t is called for this dtype."""
        return "TOPS" if self.lib == "int8" else "TFLOPS"


# 8-bit operands are K-contiguous on Hopper's tensor cores: a (M, K) and b (N, K), layout "nt" only.
_NT = ("nt",)

# NOTES: cublas_tflops are the maxima of shared/anchors/h200-*-2026-11-29*.json per kind; the fp32 entry is
# the library's FP32-accurate 3xTF32 mode, whose roof is a third of TF32's. torch's block FP8 measured 1136 then
# 1282 TFLOPS at 4096x7168x16384 in two runs (anchors README): the larger is kept.
DTYPES: dict[str, BenchDtype] = {
    d.name: d
    for d in (
        BenchDtype("bf16", peak_tflops=989.0, cublas_tflops=767.0),
        BenchDtype("fp16", peak_tflops=989.0, cublas_tflops=682.0),
        BenchDtype("tf32", peak_tflops=494.0, cublas_tflops=367.0),
        BenchDtype("fp32", peak_tflops=165.0, cublas_tflops=52.0),
        # FP8 E4M3 recipes (A granularity x B granularity), BF16 output.
        BenchDtype("fp8_tensor", peak_tflops=1979.0, cublas_tflops=1291.0, library_dtype="fp8_e4m3",
                   scaling="tensor", quant_a="tensor", quant_b="tensor", layouts=_NT),
        BenchDtype("fp8_row", peak_tflops=1979.0, cublas_tflops=1217.0, library_dtype="fp8_e4m3",
                   scaling="row", quant_a="row", quant_b="row", layouts=_NT),
        BenchDtype("fp8_block", peak_tflops=1979.0, cublas_tflops=1282.0, library_dtype="fp8_e4m3",
                   scaling="block", quant_a="group128", quant_b="block128", layouts=_NT),
        # INT8 x INT8 -> INT32, exact; the operands are row-quantized N(0,1) values, their scales unused.
        BenchDtype("int8", peak_tflops=1979.0, cublas_tflops=899.0, quant_a="row", quant_b="row", layouts=_NT),
    )
}

# The H200's measured device-to-device copy (bytes read + written per second).
COPY_TBPS = 4.25


def get(name: str) -> BenchDtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; the bench knows {sorted(DTYPES)}") from None
