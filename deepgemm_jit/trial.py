"""A random call of any GemmSpec and the float64 value it must produce: what the autotuner (tuning.py) runs on every
candidate config, keeping only candidates whose result is within the dtype's bound.

A spec's call needs more than A and B: FP8 / INT8 take their scales, a fused epilogue its bias / C / residual /
alpha / beta, quantize-on-store a static scale, and its result (8-bit codes, with group scales for quant_fp8_g128)
is judged after dequantization. The operands are N(0, 1) (B N(0, 1/K) under an epilogue, so that activations see
values of order one), quantized with the recipe's granularities for 8-bit inputs; the value is the float64 product
of what the kernel multiplies (the dequantized inputs) followed by the unfused epilogue (reference.py).

    trial = trial_call(spec, m)
    outputs = trial.poisoned_outputs()
    err = trial.error(trial.run(gemm, outputs))     # NaN when anything is unwritten
    trial.within_bound(err)

3xTF32's inner GEMMs (hi_lo) multiply [hi | lo] operands block by block and have no such value here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import baseline, dtypes, reference
from .spec import GemmSpec

# (scale_a, scale_b) granularities of each scaling (quantize_reference's names); unscaled INT8 multiplies the codes
# of a per-row quantization and ignores its scales.
_GRANULARITIES = {"none": ("row", "row"), "tensor": ("tensor", "tensor"), "row": ("row", "row"),
                  "block": ("group128", "block128")}
# With the 'beta' word: neither 1 nor 0, so that a dropped factor shows.
ALPHA, BETA = 0.75, 0.5
# Rounding of a quantize-on-store output: half an E4M3 ulp is 2^-4 of the value.
FP8_STORE_REL = 2.0 ** -4
# What rounding D adds to a relative error: (a whole output's, one element's). One element's is at most the format's
# unit roundoff (2^-8 bf16, 2^-11 fp16; FP32 D: 2^-23 allowed). A whole output's Frobenius error averages to ~0.42 of
# it over normal values, so half of it bounds large outputs, but not small ones: 96 normal values rounded to bf16
# exceed half 2.3% of the time (a 2 x 48 bf16 D of fuzz seed 16094 did, on the H200), 480 never in 3000 draws.
OUT_ROUNDING = {"bf16": (2.0 ** -9, 2.0 ** -8), "fp16": (2.0 ** -12, 2.0 ** -11), "fp32": (0.0, 2.0 ** -23)}
AVERAGED_ROUNDING_MIN_ELEMENTS = 1024
INT8_POISON = -128  # what poisoned_outputs fills an INT8 D with: never written by the saturating quantizer
INT32_POISON = -(2**31)  # an INT32 D's poison: no INT8 product of K < 2^17 reaches it (|sum| <= 2^14 K)


def out_rounding(out_dtype: str, size: int) -> tuple[float, float]:
    """(whole output, one element): the relative error rounding a D of `size` elements to `out_dtype` may add; a D
    of fewer than AVERAGED_ROUNDING_MIN_ELEMENTS gets the per-element bound for the whole, which holds for any size."""
    whole, element = OUT_ROUNDING.get(out_dtype, (0.0, 2.0 ** -23))
    return (whole if size >= AVERAGED_ROUNDING_MIN_ELEMENTS else element), element


@dataclass
class TrialCall:
    """One call's arguments (CuPy arrays) and the float64 (M, N_out) value its output must hold."""

    spec: GemmSpec
    m: int
    a: object
    b: object
    kwargs: dict        # scales, epilogue operands, quant_scale
    value: object       # float64, before any quantize-on-store

    def poisoned_outputs(self) -> dict:
        """out= (and scales_out= for quant_fp8_g128) filled with NaN bytes, so that unwritten elements show. An
        INT8 D takes -128 instead: 0xFF is -1, a value the quantizer writes, and -128 is one its saturation
        (to +-127) never does (`error` makes it NaN)."""
        import cupy

        outputs = {"out": reference.poisoned(self.spec.out_shape(self.m), self.spec.out_dtype)}
        if self.spec.out_dtype == "int8":
            outputs["out"].fill(INT8_POISON)
        elif self.spec.out_dtype == "int32":  # 0xFF.. is -1, a product's value; and `bound` is 0 there
            outputs["out"].fill(INT32_POISON)
        if self.spec.epi.has_group_scales:
            outputs["scales_out"] = cupy.full(self.spec.scales_out_shape(self.m), cupy.nan, dtype=cupy.float32)
        return outputs

    def run(self, gemm, outputs: dict):
        """gemm's result on these operands, written into `outputs` (poisoned_outputs)."""
        return gemm(self.a, self.b, **outputs, **self.kwargs)

    def error(self, result) -> float:
        """rel_fro of `result` (dequantized where D is quantized) against the value; NaN if anything is not
        finite."""
        epi = self.spec.epi
        if epi.has_group_scales:
            q, scales = result
            got = reference.dequantize_reference(q, scales, "fp8_e4m3", "group128")
        elif epi.has_static_scale:
            scale = float(self.kwargs["quant_scale"][0])
            if epi.quant_dtype == "int8":
                xp = reference._array_module(result)
                got = xp.where(result == INT8_POISON, np.nan, result.astype(np.float64)) * scale
            else:
                got = reference.decode_fp8(result, "fp8_e4m3") * scale
        else:
            got = result
        return reference.error(got, self.value)

    @property
    def bound(self) -> float:
        """The dtype's DESIGN.md bound plus what storing D adds (16-bit rounding, or quantization); 0 for the exact
        INT8 -> INT32 product (1e-2 let a whole unwritten column of a wide D through: review)."""
        epi, bound = self.spec.epi, reference.ERROR_BOUND[self.spec.dtype]
        if self.spec.out_dtype == "int32":
            return 0.0
        if epi.quant_dtype == "int8":
            scale = float(self.kwargs["quant_scale"][0])
            return bound + 0.5 * scale / max(_rms(self.value), 1e-30)
        if epi.quant != "none":
            return bound + FP8_STORE_REL
        return bound + out_rounding(self.spec.out_dtype, self.value.size)[0]

    def within_bound(self, err: float) -> bool:
        return not math.isnan(err) and err <= self.bound


def _rms(x) -> float:
    import cupy

    return float(cupy.sqrt(cupy.mean(x * x))) if x.size else 0.0


def trial_call(spec: GemmSpec, m: int, rng=None) -> TrialCall:
    """Fresh operands for a call of `spec` at M = m and the value it must produce (see the module)."""
    import cupy

    if spec.hi_lo:
        raise ValueError("3xTF32's inner GEMM (hi_lo) has no trial call: its operands are [hi | lo] splits")
    rng = rng or cupy.random.default_rng()
    epi = spec.epi
    b_scale = 1.0 / math.sqrt(spec.k) if spec.epilogue != "none" else 1.0
    kwargs: dict = {}
    if dtypes.is_quantized(spec.dtype):
        ga, gb = _GRANULARITIES[spec.scaling]
        x_a = rng.standard_normal(spec.a_shape(m), dtype=cupy.float32)
        x_b = rng.standard_normal(spec.b_shape(), dtype=cupy.float32) * cupy.float32(b_scale)
        a, sa = reference.quantize_reference(x_a, spec.dtype, ga)
        b, sb = reference.quantize_reference(x_b, spec.b_type, gb)
        if spec.scaling == "none":  # INT8 -> INT32: the codes' product
            product = reference.reference(spec, a, b)
        else:
            product = reference.reference(spec, reference.dequantize_reference(a, sa, spec.dtype, ga),
                                          reference.dequantize_reference(b, sb, spec.b_type, gb))
            kwargs.update(scale_a=sa, scale_b=sb)
    else:
        a = reference.random_matrix(spec.a_shape(m), spec.dtype, rng)
        b = reference.random_matrix(spec.b_shape(), spec.dtype, rng, scale=b_scale)
        product = reference.reference(spec, a, b)
    ops = epilogue_operands(spec, m, rng)
    kwargs.update(ops.call_kwargs(epi))
    value = reference.unfused_epilogue(product, epi, ops.bias, ops.c, ops.residual, ops.alpha, ops.beta)
    if epi.has_static_scale:  # a scale that keeps the largest value inside the 8-bit range
        q_max = dtypes.QUANT_MAX[epi.quant_dtype]
        kwargs["quant_scale"] = cupy.asarray([float(cupy.abs(value).max()) * 1.25 / q_max or 1.0],
                                             dtype=cupy.float32)
    return TrialCall(spec, m, a, b, kwargs, value)


def epilogue_operands(spec, m: int, rng) -> baseline.EpilogueOperands:
    """Fresh N(0, 1) bias / C / residual in the spec's epilogue_operand_dtype (D's type, float32 beside a quantized
    D), and ALPHA / BETA, as the epilogue of `spec` at M = m takes them (gated units: the bias has the weight's N
    entries, the residual D's N / 2 columns). The benchmarks and the fuzz draw theirs here too."""
    epi, n = spec.epi, spec.n

    def draw(shape):
        return reference.random_matrix(shape, spec.epilogue_operand_dtype, rng)

    return baseline.EpilogueOperands(
        bias=None if epi.bias == "none" else draw((n,) if epi.bias == "col" else (m,)),
        c=draw((m, n)) if epi.beta else None,
        residual=draw((m, n // 2 if epi.is_gated else n)) if epi.residual else None,
        alpha=ALPHA if epi.beta else 1.0, beta=BETA if epi.beta else 1.0)
