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

// 1 / x in one MUFU.RCP. __fdividef and 1.0f / x add a range fix around it (FSETP, FSEL and two FMUL for
// |x| < 2^-126) that none of the callers here needs: their divisors are >= 1, and a divisor above 2^126 (or
// inf) giving 0 is the limit they want.
DGJIT_DEVICE float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// v / (1 + exp(-u)), i.e. v * sigmoid(u), with the hardware exp2 and reciprocal (relative error ~1e-7;
// exp(-u) = inf for u << 0 gives v * 0 = 0, its limit).
DGJIT_DEVICE float times_sigmoid(float v, float u) {
  return v * rcp_approx(1.0f + ex2_approx(-1.44269504088896341f * u));
}

// GELU (erf form) as x * Phi(x), Phi the normal CDF: with z = |x| / sqrt(2) and h = erfc(z) / 2, Phi = 1 - h for
// x >= 0 and h for x < 0, so x * Phi(x) = max(x, 0) - |x| h for either sign. erfc(z) = t * exp(P(t) - z^2),
// t = 1 / (1 + z / 2), P a polynomial fitted for this kernel (least squares, reweighted toward the largest errors,
// on ln(erfc(z) / t) + z^2 over z in [0, 10.5]); the coefficients below are P's times log2(e), the constant term
// minus 1 (the factor 1/2 of h), so h = t * exp2(P2(t) - z^2 log2(e)). |x| is capped at FLT_MAX in the product so
// that x = +inf (h = 0) gives inf, not inf * 0; x = -inf gives 0, the limit.
// P's degree follows D's precision (GeluDegree): BF16 D: degree 3, relative error of the result below 3.1e-4 in
// float32 (bf16's half-ulp is 2e-3..3.9e-3 of the value; ~2% of outputs then round to the neighbour of the
// correctly rounded value, as unfused bf16 GEMM + GELU's double rounding does), 10 FP32 instructions and 2 MUFU per
// element. FP16 and 8-bit D: degree 5, below 2.7e-5 (a fp16 half-ulp is at most 4.9e-4; quantize-on-store's scales
// are checked to 1e-4), 12 FP32 instructions. FP32 D: degree 9, absolute error below 2.4e-7, 16 FP32 instructions.
// Each FFMA matters where the epilogue bounds the tile: at 4096 x 32768 x 512 (ping-pong) bias+gelu ran ~40 us
// longer than bias+silu for ~9 more instructions per element, and degree 3 instead of 5 took it from 260.6 to
// 247.7 us (docs/NOTES.md sessions 12 and 31).
enum class GeluDegree : uint32_t { k3 = 3, k5 = 5, k9 = 9 };
template <class TD>
constexpr GeluDegree gelu_degree_for() {
  return sizeof(TD) == 4 ? GeluDegree::k9 : (is_same<TD, bfloat16_t>::value ? GeluDegree::k3 : GeluDegree::k5);
}

template <GeluDegree kDegree>
DGJIT_DEVICE float gelu_erf(float x) {
  const float t = rcp_approx(fmaf(fabsf(x), 0.35355339059327376f, 1.0f));  // 1 / (1 + z / 2)
  float p;
  if constexpr (kDegree == GeluDegree::k3) {
    p = -0.4968442916870117f;
    p = fmaf(p, t, 0.9914038181304932f);
    p = fmaf(p, t, 1.3207887411117554f);
    p = fmaf(p, t, -2.814920425415039f);
  } else if constexpr (kDegree == GeluDegree::k5) {
    p = 0.3301486074924469f;
    p = fmaf(p, t, -1.0233557224273682f);
    p = fmaf(p, t, 0.6847704648971558f);
    p = fmaf(p, t, 0.36697718501091003f);
    p = fmaf(p, t, 1.4687057733535767f);
    p = fmaf(p, t, -2.827234983444214f);
  } else {
    static_assert(kDegree == GeluDegree::k9, "GELU polynomial degrees: 3, 5, 9");
    p = 0.21358460187911987f;
    p = fmaf(p, t, -1.0068010091781616f);
    p = fmaf(p, t, 1.7269014120101929f);
    p = fmaf(p, t, -1.082167148590088f);
    p = fmaf(p, t, -0.05122573301196098f);
    p = fmaf(p, t, -0.032682936638593674f);
    p = fmaf(p, t, 0.06172822788357735f);
    p = fmaf(p, t, 0.5553191304206848f);
    p = fmaf(p, t, 1.4410135746002197f);
    p = fmaf(p, t, -2.825670003890991f);
  }
  const float xs = x * 0.84932180028801904f;  // xs^2 = z^2 log2(e): one product fewer than z, z^2, then the scaling
  // (p - xs^2 by quant::fnma_rn: written as fmaf(xs, -xs, p), NVVM made -xs a second FMUL instead of the FFMA's
  // negation modifier.)
  const float h = t * ex2_approx(quant::fnma_rn(xs, xs, p));
  return fmaf(-fminf(fabsf(x), 3.40282347e38f), h, fmaxf(x, 0.0f));
}

// The gate's activation of a gated unit (the up projection multiplies it).
template <GateKind kGate, GeluDegree kDegree>
DGJIT_DEVICE float gate_activate(float g) {
  if constexpr (kGate == GateKind::kSwiGlu) {
    return times_sigmoid(g, g);
  } else {
    static_assert(kGate == GateKind::kGeGlu, "gated units: swiglu or geglu");
    return gelu_erf<kDegree>(g);
  }
}

// Two floats x / s -> two 8-bit values in one 16-bit word (element `lo` at the lower address), with the
// quantizer's contract (quantize.cuh): IEEE division (quant::divide, bit-identical to div.rn), E4M3
// round-to-nearest-even saturated to +-448, or INT8 round-half-to-even saturated to [-127, 127].
template <QuantKind kQuant>
DGJIT_DEVICE uint16_t quantize_pair(float lo, float hi, const quant::Divisor& s) {
  const float ylo = quant::divide(lo, s), yhi = quant::divide(hi, s);
  if constexpr (kQuant == QuantKind::kInt8Tensor) {
    int32_t rlo = quant::cvt_rni_s32(ylo), rhi = quant::cvt_rni_s32(yhi);
    rlo = rlo < -quant::kInt8Max ? -quant::kInt8Max : (rlo > quant::kInt8Max ? quant::kInt8Max : rlo);
    rhi = rhi < -quant::kInt8Max ? -quant::kInt8Max : (rhi > quant::kInt8Max ? quant::kInt8Max : rhi);
    return static_cast<uint16_t>((static_cast<uint32_t>(rlo) & 0xFFu) | ((static_cast<uint32_t>(rhi) & 0xFFu) << 8));
  } else {
    return quant::cvt_fp8x2_satfinite<quant::Format::kE4M3>(yhi, ylo);
  }
}

// kDegree: GELU's polynomial for D's precision (gelu_erf).
template <Activation kAct, GeluDegree kDegree>
DGJIT_DEVICE float activate(float v) {
  if constexpr (kAct == Activation::kRelu) {
    // max.NaN: a NaN stays NaN, as torch.relu and the float64 reference give (fmaxf's max.f32 returns the
    // operand that is not NaN: 0). One FMNMX either way.
    float r;
    asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(v), "f"(0.0f));
    return r;
  } else if constexpr (kAct == Activation::kGelu) {
    return gelu_erf<kDegree>(v);
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
