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
  static constexpr bool kAmax = false;  // per-tensor kinds: max |x| into the amax argument (when not null)
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

// A float, bf16 or fp16 value as its bits (load_bits) and those bits as FP32 (bits_as_float): split so that a load
// can be issued long before its value is used (the bias read under the main loop, gemm_sm90.cuh's read_bias).
DGJIT_DEVICE uint32_t load_bits(const float* p) { return __float_as_uint(*p); }
DGJIT_DEVICE uint32_t load_bits(const bfloat16_t* p) { return p->bits; }
DGJIT_DEVICE uint32_t load_bits(const half_t* p) { return p->bits; }
template <class T>
DGJIT_DEVICE float bits_as_float(uint32_t bits) {
  if constexpr (is_same<T, bfloat16_t>::value) {
    return __uint_as_float(bits << 16);
  } else if constexpr (is_same<T, half_t>::value) {
    float x;
    asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(static_cast<uint16_t>(bits)));
    return x;
  } else {
    static_assert(is_same<T, float>::value, "bias types: float, bf16, fp16");
    return __uint_as_float(bits);
  }
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

// min(a, b) / max(a, b), NaN if either is (min.f32 / max.f32 would return the other operand). One FMNMX each.
DGJIT_DEVICE float min_nan(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
DGJIT_DEVICE float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// v / (1 + exp(-u)), i.e. v * sigmoid(u), in one of two forms (SigmoidForm, chosen with GELU's by
// ActivationForms). kTwoMufu: the hardware exp2 and reciprocal, relative error ~1e-7. kOneMufu: the reciprocal of
// d = 1 + exp(-u) by two Newton steps y += y (1 - d y) from a seed read off d's bits (0x7EF311C3 - bits(d): relative
// error below 5.1%, then 2.6e-3, then 6.5e-6 in float32), on the FP32 pipe instead of MUFU's; d is capped (min.NaN)
// at the float whose bits are that constant, where the seed is 0. Either way exp(-u) = inf for u << 0 gives v * 0 =
// 0, its limit, and a NaN stays NaN.
enum class SigmoidForm : uint32_t { kTwoMufu, kOneMufu };
template <SigmoidForm kForm>
DGJIT_DEVICE float times_sigmoid(float v, float u) {
  const float d = 1.0f + ex2_approx(-1.44269504088896341f * u);
  if constexpr (kForm == SigmoidForm::kTwoMufu) {
    return v * rcp_approx(d);
  } else {
    constexpr int32_t kSeed = 0x7EF311C3;
    const float dc = min_nan(d, __int_as_float(kSeed));
    float y = __int_as_float(kSeed - __float_as_int(dc));
    y = fmaf(y, fmaf(-dc, y, 1.0f), y);
    y = fmaf(y, fmaf(-dc, y, 1.0f), y);
    return v * y;
  }
}

// GELU (erf form) as x * Phi(x), Phi the normal CDF: with a = |x| and h = Phi(-a) = erfc(a / sqrt(2)) / 2,
// x * Phi(x) = max(x, 0) - a h for either sign of x. h has two forms (GeluForm, chosen by gelu_form_for):
//
// kErfcN, rational: h = t * exp(P(t) - z^2) with z = a / sqrt(2), t = 1 / (1 + z / 2), P a polynomial of degree N
// fitted to ln(erfc(z) / t) + z^2 over z in [0, 10.5] (least squares reweighted toward the largest errors; the
// coefficients below are P's times log2(e), the constant term minus 1 for the factor 1/2 of h). Two MUFU (rcp,
// ex2) and N + 7 FP32 instructions per element; a is capped at FLT_MAX in the product so that x = +inf (h = 0)
// gives inf, not inf * 0. Error in float32: N = 3 relative below 3.1e-4, N = 5 below 2.7e-5, N = 9 absolute below
// 2.4e-7.
//
// kLog2*, one MUFU: h = exp2(Q(min(a, cap))), Q a polynomial in a fitted the same way to log2 Phi(-a) on [0, cap]
// (coefficients rounded to float32 one at a time from the top, the lower ones refitted after each); degree + 3 FP32
// instructions. Relative error of h, so of the result, in float32 (Horner in a, on a 2e6-point grid):
//   kLog2Bf16: degree 7, cap 13, below 5.2e-4. Q(13) = -126.9: ex2.approx.ftz gives h = 0 from there on (results
//     below 2^-126 flush to zero, so |results| below 13 * 2^-126 = 1.6e-37 are 0), and x -> -inf gives 0.
//   kLog2Fp16: degree 7, cap 6, below 5.5e-6. Past the cap the result is -6 Phi(-6) = -5.9e-9 instead of something
//     smaller: both round to fp16's zero (half its smallest subnormal is 3e-8).
//   kLog2Byte (quantize-on-store): degree 9, cap 13, below 3.9e-5.
// min.NaN keeps a NaN x NaN (min.f32 would return the cap); +inf gives max(x, 0) - cap * 0 = inf.
//
// Which form is cheaper depends on what bounds the epilogue (same-call A/B, session 55, us old -> new). Where both
// consumers run it between their tiles' wgmmas (cooperative tiles), MUFU's 16 results per clock and SM do:
// 4096 x 32768 x 512 FP8 bias+gelu ran ~89 us longer than the plain GEMM, ~2 MUFU per element at 1.5 GHz, and the
// one-MUFU form took it from 217.2 to 207.1 (FP8 block 237.6 -> 225.9, 24576 x 1536 298.7 -> 290.2). Where it
// overlaps the other consumer's wgmmas (ping-pong tiles), the one-MUFU form was slower at the same FP32 count
// (bf16 4096 x 32768 x 512: 248.4 -> 254.6, 24576 x 1536 439.9 -> 450.6): those keep the rational form. Both forms
// are well inside the output's rounding (bf16's half-ulp is 2e-3..3.9e-3 of the value, fp16's at most 4.9e-4;
// quantize-on-store's scales are checked to 1e-4); FP32 D always takes kErfc9.
enum class GeluForm : uint32_t { kErfc3, kErfc5, kErfc9, kLog2Bf16, kLog2Fp16, kLog2Byte };
template <class TD, bool kOverlapsMma>
constexpr GeluForm gelu_form_for() {
  constexpr bool bf16 = is_same<TD, bfloat16_t>::value, fp16 = is_same<TD, half_t>::value;
  return sizeof(TD) == 4 ? GeluForm::kErfc9
         : kOverlapsMma  ? (bf16 ? GeluForm::kErfc3 : GeluForm::kErfc5)
                         : (bf16 ? GeluForm::kLog2Bf16 : fp16 ? GeluForm::kLog2Fp16 : GeluForm::kLog2Byte);
}

// The activations' forms for D's type TD and the tile's schedule (kOverlapsMma: ping-pong tiles, whose epilogue
// overlaps the other consumer's wgmmas): one MUFU per element where MUFU bounds the epilogue (cooperative tiles,
// 16-bit and 8-bit D), the shorter FP32 sequences with two MUFU elsewhere (FP32 D: the precise forms). kSigmoid
// serves silu and sigmoid: same-call A/B (session 55, us two MUFU -> one): FP8 tensor bias+silu 4096 x 32768 x 512
// 206.7 -> 194.0, FP8 block 227.3 -> 214.6, 24576 x 1536 291.0 -> 284.6. gelu_tanh (four more FP32 instructions
// before the sigmoid: 189.9 -> 192.5 at 4096 x 32768 x 512 FP8) and the swiglu gate (FP8 block 4096 x 4096 x 7168
// 183.4 -> 188.6; FP8 tensor and bf16 gained < 1%) keep two.
template <class TD, bool kOverlapsMma>
struct ActivationForms {
  static constexpr GeluForm kGelu = gelu_form_for<TD, kOverlapsMma>();
  static constexpr SigmoidForm kSigmoid =
      sizeof(TD) == 4 || kOverlapsMma ? SigmoidForm::kTwoMufu : SigmoidForm::kOneMufu;
};

// Horner's rule, highest coefficient first; the constant arrays fold into the FFMAs' immediates.
template <int kN>
DGJIT_DEVICE float horner(float x, const float (&c)[kN]) {
  float p = c[0];
#pragma unroll
  for (int i = 1; i < kN; ++i) p = fmaf(p, x, c[i]);
  return p;
}

// The one-MUFU forms: max(x, 0) - a exp2(Q(a)) with a = min(|x|, cap), Q's coefficients highest first.
template <int kN>
DGJIT_DEVICE float gelu_log2(float x, float cap, const float (&q)[kN]) {
  const float a = min_nan(fabsf(x), cap);
  return fmaf(-a, ex2_approx(horner(a, q)), fmaxf(x, 0.0f));
}

template <GeluForm kForm>
DGJIT_DEVICE float gelu_erf(float x) {
  if constexpr (kForm == GeluForm::kErfc3 || kForm == GeluForm::kErfc5 || kForm == GeluForm::kErfc9) {
    const float t = rcp_approx(fmaf(fabsf(x), 0.35355339059327376f, 1.0f));  // 1 / (1 + z / 2)
    float p;
    if constexpr (kForm == GeluForm::kErfc3) {
      constexpr float kP[] = {-0.4968442916870117f, 0.9914038181304932f, 1.3207887411117554f, -2.814920425415039f};
      p = horner(t, kP);
    } else if constexpr (kForm == GeluForm::kErfc5) {
      constexpr float kP[] = {0.3301486074924469f,  -1.0233557224273682f, 0.6847704648971558f,
                              0.36697718501091003f, 1.4687057733535767f,  -2.827234983444214f};
      p = horner(t, kP);
    } else {
      constexpr float kP[] = {0.21358460187911987f, -1.0068010091781616f,   1.7269014120101929f,
                              -1.082167148590088f,  -0.05122573301196098f,  -0.032682936638593674f,
                              0.06172822788357735f, 0.5553191304206848f,    1.4410135746002197f,
                              -2.825670003890991f};
      p = horner(t, kP);
    }
    const float xs = x * 0.84932180028801904f;  // xs^2 = z^2 log2(e): one product fewer than z, z^2, then the scaling
    // (p - xs^2 by quant::fnma_rn: written as fmaf(xs, -xs, p), NVVM made -xs a second FMUL instead of the FFMA's
    // negation modifier.)
    const float h = t * ex2_approx(quant::fnma_rn(xs, xs, p));
    return fmaf(-fminf(fabsf(x), 3.40282347e38f), h, fmaxf(x, 0.0f));
  } else if constexpr (kForm == GeluForm::kLog2Bf16) {
    constexpr float kQ[] = {-3.3647080499576987e-07f, 1.852557215897832e-05f, -0.00042996081174351275f,
                            0.005547397304326296f,    -0.044775426387786865f, -0.47225138545036316f,
                            -1.143412709236145f,      -1.0007290840148926f};
    return gelu_log2(x, 13.0f, kQ);
  } else if constexpr (kForm == GeluForm::kLog2Fp16) {
    constexpr float kQ[] = {-1.8348129060541396e-06f, 6.159832264529541e-05f, -0.0009305250714533031f,
                            0.008507891558110714f,    -0.05396007001399994f, -0.4584643840789795f,
                            -1.1512510776519775f,     -0.9999952912330627f};
    return gelu_log2(x, 6.0f, kQ);
  } else {
    static_assert(kForm == GeluForm::kLog2Byte, "GELU forms: kErfc3 / 5 / 9, kLog2Bf16 / Fp16 / Byte");
    constexpr float kQ[] = {-2.0123944732830523e-09f, 1.4528770009292202e-07f, -4.617325885192258e-06f,
                            8.55300750117749e-05f,    -0.0010343975154682994f, 0.008723311126232147f,
                            -0.05408887192606926f,    -0.4586363136768341f,   -1.1510511636734009f,
                            -1.0000252723693848f};
    return gelu_log2(x, 13.0f, kQ);
  }
}

// The gate's activation of a gated unit (the up projection multiplies it).
template <GateKind kGate, class Forms>
DGJIT_DEVICE float gate_activate(float g) {
  if constexpr (kGate == GateKind::kSwiGlu) {
    return times_sigmoid<SigmoidForm::kTwoMufu>(g, g);  // see ActivationForms
  } else {
    static_assert(kGate == GateKind::kGeGlu, "gated units: swiglu or geglu");
    return gelu_erf<Forms::kGelu>(g);
  }
}

// Two floats x / s -> two 8-bit values in one 16-bit word (element `lo` at the lower address), with the
// quantizer's contract (quantize.cuh): IEEE division (quant::divide, bit-identical to div.rn), E4M3
// round-to-nearest-even saturated to +-448, or INT8 round-half-to-even saturated to [-127, 127].
// kBounded: quant::divide_bounded (no quotient overflows: group scales, see there). kPackedInt8: INT8 pairs by
// quant::cvt_int8x2_sat (about two instructions fewer per element; the amax kernels keep the clamp form, with
// which the int8-row ping-pong one does not keep stack bytes).
template <QuantKind kQuant, bool kBounded = false, bool kPackedInt8 = false>
DGJIT_DEVICE uint16_t quantize_pair(float lo, float hi, const quant::Divisor& s) {
  const float ylo = kBounded ? quant::divide_bounded(lo, s) : quant::divide(lo, s);
  const float yhi = kBounded ? quant::divide_bounded(hi, s) : quant::divide(hi, s);
  if constexpr (kQuant == QuantKind::kInt8Tensor && kPackedInt8) {
    return quant::cvt_int8x2_sat(yhi, ylo);
  } else if constexpr (kQuant == QuantKind::kInt8Tensor) {
    int32_t rlo = quant::cvt_rni_s32(ylo), rhi = quant::cvt_rni_s32(yhi);
    rlo = rlo < -quant::kInt8Max ? -quant::kInt8Max : (rlo > quant::kInt8Max ? quant::kInt8Max : rlo);
    rhi = rhi < -quant::kInt8Max ? -quant::kInt8Max : (rhi > quant::kInt8Max ? quant::kInt8Max : rhi);
    return static_cast<uint16_t>((static_cast<uint32_t>(rlo) & 0xFFu) | ((static_cast<uint32_t>(rhi) & 0xFFu) << 8));
  } else {
    return quant::cvt_fp8x2_satfinite<quant::Format::kE4M3>(yhi, ylo);
  }
}

// Forms: the activations' forms (ActivationForms).
template <Activation kAct, class Forms>
DGJIT_DEVICE float activate(float v) {
  if constexpr (kAct == Activation::kRelu) {
    // max.NaN: a NaN stays NaN, as torch.relu and the float64 reference give (fmaxf's max.f32 returns the
    // operand that is not NaN: 0).
    return max_nan(v, 0.0f);
  } else if constexpr (kAct == Activation::kGelu) {
    return gelu_erf<Forms::kGelu>(v);
  } else if constexpr (kAct == Activation::kGeluTanh) {
    // 0.5 v (1 + tanh(u)) = v * sigmoid(2u), u = sqrt(2/pi) (v + 0.044715 v^3).
    return times_sigmoid<SigmoidForm::kTwoMufu>(v, 1.5957691216057308f * fmaf(0.044715f * v, v * v, v));
  } else if constexpr (kAct == Activation::kSilu) {
    return times_sigmoid<Forms::kSigmoid>(v, v);
  } else if constexpr (kAct == Activation::kSigmoid) {
    return times_sigmoid<Forms::kSigmoid>(1.0f, v);
  } else {
    return v;
  }
}

}  // namespace sm90
}  // namespace dgjit
