// Element-wise math of the sm90 fused epilogue (deepgemm_jit/epilogue.py): the compile-time description a
// rendered entry gives GemmSm90 (its Epi trait), the run-time scalars, and the per-value functions (activations,
// gated units, quantize-on-store). GemmSm90's epilogue (gemm_sm90.cuh) applies them to its accumulator tiles.
#pragma once
#include "dgjit/ptx_sm90.cuh"
#include "dgjit/quantize.cuh"  // quantize-on-store epilogues: the quantizer's exact division and conversions

namespace dgjit {
namespace sm90 {

// Fused epilogue (deepgemm_jit/epilogue.py): D = act(alpha * acc + beta * C + bias) + residual, or with a gated
// unit D = act(gate + bias_gate) * (up + bias_up) + residual over interleaved gate/up columns, then optionally
// quantized on store.
enum class Activation : uint32_t { kNone, kRelu, kGelu, kGeluTanh, kSilu, kSigmoid };
enum class BiasKind : uint32_t { kNone, kCol, kRow };
enum class GateKind : uint32_t { kNone, kSwiGlu, kGeGlu };
// kFp8Group128: E4M3 with one dynamic scale per row and 128 output columns; kFp8Tensor / kInt8Tensor: a static
// scale read from device memory (and an optional amax output).
enum class QuantKind : uint32_t { kNone, kFp8Group128, kFp8Tensor, kInt8Tensor };

// Compile-time shape of the epilogue; the rendered entry defines one (EpilogueNone = plain store).
struct EpilogueNone {
  static constexpr bool kBeta = false;
  static constexpr BiasKind kBias = BiasKind::kNone;
  static constexpr Activation kAct = Activation::kNone;
  static constexpr bool kResidual = false;
  static constexpr GateKind kGate = GateKind::kNone;
  static constexpr QuantKind kQuant = QuantKind::kNone;
};

// Run-time operands of the epilogue besides the tensor maps of C and the residual: the bias vector (D's
// type, FP32 for quantized outputs, N or M long) and the scalars. Quantize-on-store: `quant` is the group
// scales written (kFp8Group128, element (row, group) at row * scales_stride_m + group * scales_stride_g) or the
// static scale read (per-tensor kinds); `amax` (per-tensor kinds, may be null) receives max |x| as float bits.
struct EpilogueArgs {
  const void* bias;
  float alpha, beta;
  float* quant = nullptr;
  uint32_t* amax = nullptr;
  int64_t scales_stride_m = 0, scales_stride_g = 0;
};

DGJIT_DEVICE float load_as_float(const float* p) { return *p; }
DGJIT_DEVICE float load_as_float(const bfloat16_t* p) {
  return __uint_as_float(static_cast<uint32_t>(p->bits) << 16);
}
DGJIT_DEVICE float load_as_float(const half_t* p) {
  float x;
  asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(p->bits));
  return x;
}

DGJIT_DEVICE float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// v / (1 + exp(-u)), i.e. v * sigmoid(u), with the hardware exp2 and reciprocal (relative error ~1e-7;
// exp(-u) = inf for u << 0 gives v * 0 = 0, its limit).
DGJIT_DEVICE float times_sigmoid(float v, float u) {
  return __fdividef(v, 1.0f + ex2_approx(-1.44269504088896341f * u));
}

// GELU (erf form) as x * Phi(x), Phi the normal CDF: with z = |x| / sqrt(2), Phi = 1 - erfc(z) / 2 for x >= 0
// and erfc(z) / 2 for x < 0, where erfc(z) = t * exp(P(t) - z^2), t = 1 / (1 + z / 2) and P is a degree-9
// polynomial fitted for this kernel (least squares on ln(erfc(z) / t) + z^2 over z in [0, 10.5], exponent
// error 5e-8). Absolute error of the result below 2e-7 for every x (checked in float32 against float64),
// with two MUFU operations and ~17 FMA-class instructions, against ~25 for erff's two-branch polynomial.
DGJIT_DEVICE float gelu_erf(float x) {
  const float z = fabsf(x) * 0.70710678118654752f;
  const float t = __fdividef(1.0f, fmaf(0.5f, z, 1.0f));
  float p = 0.14804556965827942f;
  p = fmaf(p, t, -0.6978613138198853f);
  p = fmaf(p, t, 1.196996808052063f);
  p = fmaf(p, t, -0.7501010894775391f);
  p = fmaf(p, t, -0.035506971180438995f);
  p = fmaf(p, t, -0.022654086351394653f);
  p = fmaf(p, t, 0.042786747217178345f);
  p = fmaf(p, t, 0.38491788506507874f);
  p = fmaf(p, t, 0.998834490776062f);
  p = fmaf(p, t, -1.2654579877853394f);
  const float half_erfc = 0.5f * t * ex2_approx(1.44269504088896341f * fmaf(-z, z, p));
  return x * (x >= 0.0f ? 1.0f - half_erfc : half_erfc);
}

// The gate's activation of a gated unit (the up projection multiplies it).
template <GateKind kGate>
DGJIT_DEVICE float gate_activate(float g) {
  if constexpr (kGate == GateKind::kSwiGlu) {
    return times_sigmoid(g, g);
  } else {
    static_assert(kGate == GateKind::kGeGlu, "gated units: swiglu or geglu");
    return gelu_erf(g);
  }
}

// Two floats x / s -> two 8-bit values in one 16-bit word (element `lo` at the lower address), with the
// quantizer's contract (quantize.cuh): IEEE division, E4M3 round-to-nearest-even saturated to +-448, or INT8
// round-half-to-even saturated to [-127, 127].
template <QuantKind kQuant>
DGJIT_DEVICE uint16_t quantize_pair(float lo, float hi, float s) {
  const float ylo = quant::div_rn(lo, s), yhi = quant::div_rn(hi, s);
  if constexpr (kQuant == QuantKind::kInt8Tensor) {
    int32_t rlo = quant::cvt_rni_s32(ylo), rhi = quant::cvt_rni_s32(yhi);
    rlo = rlo < -quant::kInt8Max ? -quant::kInt8Max : (rlo > quant::kInt8Max ? quant::kInt8Max : rlo);
    rhi = rhi < -quant::kInt8Max ? -quant::kInt8Max : (rhi > quant::kInt8Max ? quant::kInt8Max : rhi);
    return static_cast<uint16_t>((static_cast<uint32_t>(rlo) & 0xFFu) | ((static_cast<uint32_t>(rhi) & 0xFFu) << 8));
  } else {
    return quant::cvt_fp8x2_satfinite<quant::Format::kE4M3>(yhi, ylo);
  }
}

template <Activation kAct>
DGJIT_DEVICE float activate(float v) {
  if constexpr (kAct == Activation::kRelu) {
    return fmaxf(v, 0.0f);
  } else if constexpr (kAct == Activation::kGelu) {
    return gelu_erf(v);
  } else if constexpr (kAct == Activation::kGeluTanh) {
    // 0.5 v (1 + tanh(u)) = v * sigmoid(2u), u = sqrt(2/pi) (v + 0.044715 v^3).
    return times_sigmoid(v, 1.5957691216057308f * fmaf(0.044715f * v, v * v, v));
  } else if constexpr (kAct == Activation::kSilu) {
    return times_sigmoid(v, v);
  } else if constexpr (kAct == Activation::kSigmoid) {
    return times_sigmoid(1.0f, v);
  } else {
    return v;
  }
}

}  // namespace sm90
}  // namespace dgjit
