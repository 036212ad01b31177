// Quantization for the FP8/INT8 GEMM: FP32/FP16/BF16 -> FP8 (E4M3, E5M2) or INT8 with float32
// dequantization scales, and back. The host side is deepgemm_jit/quantization.py; the float64 ground
// truth is quantize_reference() in deepgemm_jit/reference.py. The contract, shared with the GEMM:
//
//   s = amax(|x| over the group) / kMax   (fp32, IEEE division); s == 0 (all-zero group) -> s = 1
//   q = cvt.rn.satfinite(x / s)           FP8: round to nearest even, saturate to the finite range
//   q = clamp(rint(x / s), -127, 127)     INT8: round half to even
//   x ~= float(q) * s
//
// x / s is a true division (the codes of div.rn, computed by quant::divide below), not a multiplication by 1/s:
// the float64 reference then agrees except where the FP32 quotient rounds onto a rounding boundary of the 8-bit
// format (one ulp).
// amax is taken as the maximum of the unsigned bit patterns of |x|: for non-negative floats that
// order is the numeric one, it lets the tensor-wide amax use an integer atomicMax, and a NaN (whose
// bits exceed +inf's) propagates into its group's scale instead of being dropped.
//
// Work decomposition: a "unit" is one (row, 128-column group) pair. A run of kLanes consecutive
// lanes owns a unit, each lane one chunk of 16 bytes of x (4 FP32 or 8 FP16/BF16 elements), so a
// unit is one fully coalesced 512- or 256-byte read.
//   group128, tensor: one lane run per unit; the chunk stays in registers between the amax
//                     reduction (shuffles within the run) and the stores.
//   row, block128:    one block per scale; the block reduces the amax of its rectangle (one row, or
//                     128 rows x 128 columns), then reads it again (L1/L2 hits) to quantize.
//   tensor amax:      a grid-stride pass that atomicMax-es one device word per block; the quantize
//                     kernel then reads that word: no amax ever travels to the host.
//
// Scales are written and read through run-time element strides (stride_m along rows or row blocks,
// stride_g along 128-column groups): row-major and M-major (DeepGEMM's TMA-aligned layout, what the host
// allocates for group128) are both just strides.
//
// Everything lives in dgjit::quant so that nothing collides with the GEMM headers.
#pragma once
#include "dgjit/common.cuh"

namespace dgjit {
namespace quant {

enum class Format { kE4M3, kE5M2, kInt8 };
enum class Granularity { kTensor, kRow, kGroup128, kBlock128 };

constexpr int kGroupCols = 128;  // group128: 1 x kGroupCols groups; block128: kGroupCols x kGroupCols
constexpr int kNumThreads = 256;
constexpr int kNumWarps = kNumThreads / 32;
constexpr int kInt8Max = 127;  // symmetric: -128 is never produced, so -q is always representable

template <Format F> struct FormatInfo;
template <> struct FormatInfo<Format::kE4M3> { static constexpr float kMax = 448.0f; };
template <> struct FormatInfo<Format::kE5M2> { static constexpr float kMax = 57344.0f; };
template <> struct FormatInfo<Format::kInt8> { static constexpr float kMax = float(kInt8Max); };

// ------------------------------------------------------------------------------------------------
// PTX wrappers (one per instruction)
// ------------------------------------------------------------------------------------------------

// IEEE division, round to nearest even, subnormals kept: what the reference computes, whatever
// fast-math or flush-to-zero options a compile might carry.
DGJIT_DEVICE float div_rn(float a, float b) {
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

DGJIT_DEVICE float rcp_rn(float a) {
  float r;
  asm("rcp.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}
DGJIT_DEVICE float mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
// a * b - c in one rounding. The negation is inside the asm: a negation in C++ can become neg.ftz.f32 (it did in
// the CuPy-compiled kernel of test_divisor_matches_div_rn, flushing a subnormal c to -0 on the H200).
DGJIT_DEVICE float fms_rn(float a, float b, float c) {
  float r;
  asm("{\n .reg .f32 t;\n neg.f32 t, %3;\n fma.rn.f32 %0, %1, %2, t;\n}" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
}
// c - a * b in one rounding (the product's sign flipped inside the asm, as above).
DGJIT_DEVICE float fnma_rn(float a, float b, float c) {
  float r;
  asm("{\n .reg .f32 t;\n neg.f32 t, %1;\n fma.rn.f32 %0, t, %2, %3;\n}" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
}

// x / s for one divisor and many x, as the quantizers need it: the float32 quotient of div_rn(x, s) bit for bit
// wherever it decides an 8-bit code (2^-10 <= |x / s| <= 2^16), so the same E4M3, E5M2 and INT8 codes for every x
// and s. div.rn compiles to a range check (FCHK) and a call to a slow path around every division; in the unrolled
// quantize-on-store epilogue each one became its own branch region, so no two divisions overlapped (4096x32768x512
// FP8 block quant_fp8_g128: 295 -> 206 us). Here: Markstein's correction. With y = RN(1/s) and q = RN(x y) (within
// one ulp of x / s), e = q s - x is exact (one FMA) and RN(q - e y) is the correctly rounded x / s, provided y is
// normal and e does not underflow. Divisors outside [2^-60, 2^60] are therefore scaled into range by 2^64 or 2^-64,
// with the dividends (exact power-of-two scalings; a dividend pushed to 0 or inf had a quotient far outside the
// range above). s = 0 or +-inf, an overflowing q and NaN operands make the correction NaN, and there x y is the
// IEEE quotient (+-inf, +-0 or NaN) or saturates the same way: it is taken. The divisor's sign moves to the
// dividend (x / s = (-x) / |s|, exactly), so y > 0 and a zero quotient keeps its sign: e = q s - x (not x - q s) is
// +0 and q - (+0) y keeps q's. Checked against div.rn.f32 on the H200 over random bit
// patterns, quantizer-like pairs and special values (tests/test_quantize_gpu.py::test_divisor_matches_div_rn).
struct Divisor {
  float s;    // |divisor|, scaled into [2^-60, 2^60] (or 0, inf, NaN)
  float y;    // RN(1 / s), not negative
  float pre;  // what each dividend is multiplied by first: +-1, +-2^64 or +-2^-64, the divisor's sign
};
DGJIT_DEVICE Divisor make_divisor(float s) {
  // Sign and magnitude by bits, which no flush-to-zero option touches (fabsf can become abs.ftz.f32).
  const uint32_t sign = __float_as_uint(s) & 0x80000000u;
  const float magnitude = __uint_as_float(__float_as_uint(s) ^ sign);
  const float scale = magnitude < 0x1p-60f ? 0x1p64f : (magnitude > 0x1p60f ? 0x1p-64f : 1.0f);
  const float scaled = mul_rn(magnitude, scale);
  // An infinite divisor keeps s = 0 (y is 0 either way): q s - x is then -x instead of NaN, and q - e y = q, the
  // quotient (+-0, or NaN for an infinite x) that divide's fallback returned for it, without the fallback.
  return Divisor{scaled == __uint_as_float(0x7F800000u) ? 0.0f : scaled, rcp_rn(scaled),
                 __uint_as_float(__float_as_uint(scale) | sign)};
}
DGJIT_DEVICE float divide(float x, const Divisor& d) {
  const float a = mul_rn(x, d.pre);
  const float q = mul_rn(a, d.y);
  const float e = fms_rn(q, d.s, a);           // q s - x, exactly
  const float corrected = fnma_rn(e, d.y, q);  // q - e y
  return corrected != corrected ? q : corrected;
}
// divide(x, d) without the NaN fallback, bit for bit where x / s does not overflow and s is not 0: q and e are then
// finite unless an operand is NaN or both are infinite, where the quotient is NaN too. Four instructions instead of
// six. The group quantizer divides by s = amax / kMax, so |x / s| <= kMax for every element of the group.
DGJIT_DEVICE float divide_bounded(float x, const Divisor& d) {
  const float a = mul_rn(x, d.pre);
  const float q = mul_rn(a, d.y);
  return fnma_rn(fms_rn(q, d.s, a), d.y, q);
}

// float -> int32, round half to even (NaN -> 0; out-of-range saturates to the int32 range).
DGJIT_DEVICE int32_t cvt_rni_s32(float x) {
  int32_t r;
  asm("cvt.rni.s32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// Two floats -> two INT8 values in one 16-bit word (`hi` in the upper byte), round half to even, saturated to
// [-127, 127], NaN -> 0: what cvt_rni_s32 and a clamp to [-127, 127] give. cvt.rni.sat.s8 saturates to [-128, 127]
// and takes NaN to 0 itself, so one integer max per value is left, and one byte permute packs the pair (instead of
// two integer min/max per value and three logic ops per pair).
DGJIT_DEVICE uint16_t cvt_int8x2_sat(float hi, float lo) {
  int32_t a, b;
  asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(a) : "f"(lo));
  asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(b) : "f"(hi));
  a = a < -kInt8Max ? -kInt8Max : a;
  b = b < -kInt8Max ? -kInt8Max : b;
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, 0x0040;" : "=r"(r) : "r"(a), "r"(b));  // byte 0: a's byte 0; byte 1: b's byte 0
  return static_cast<uint16_t>(r);
}

// Two floats -> two FP8 values in one 16-bit word, round to nearest even, saturating to the largest
// finite value: `hi` lands in the upper byte, `lo` in the lower one (lower address in memory).
template <Format F>
DGJIT_DEVICE uint16_t cvt_fp8x2_satfinite(float hi, float lo) {
  static_assert(F == Format::kE4M3 || F == Format::kE5M2, "FP8 formats only");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  static_assert(F != F, "FP8 conversions (cvt ...e4m3x2/e5m2x2) need sm_89 or newer");
#endif
  uint16_t r;
  if constexpr (F == Format::kE4M3) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

// Two FP8 values (one 16-bit word) -> two FP16 values, exactly (both FP8 formats are subsets of FP16);
// the upper byte becomes the upper half.
template <Format F>
DGJIT_DEVICE uint32_t cvt_f16x2_from_fp8x2(uint16_t pair) {
  static_assert(F == Format::kE4M3 || F == Format::kE5M2, "FP8 formats only");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  static_assert(F != F, "FP8 conversions (cvt ...e4m3x2/e5m2x2) need sm_89 or newer");
#endif
  uint32_t r;
  if constexpr (F == Format::kE4M3) {
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(pair));
  } else {
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(r) : "h"(pair));
  }
  return r;
}

DGJIT_DEVICE float f16_bits_to_f32(uint16_t bits) {
  float r;
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(bits));
  return r;
}

// ------------------------------------------------------------------------------------------------
// Element conversions (all exact)
// ------------------------------------------------------------------------------------------------

DGJIT_DEVICE float to_float(float x) { return x; }
DGJIT_DEVICE float to_float(half_t x) { return f16_bits_to_f32(x.bits); }
// BF16 is the upper half of an FP32: widening is a shift.
DGJIT_DEVICE float to_float(bfloat16_t x) { return __uint_as_float(uint32_t(x.bits) << 16); }

template <Format F>
DGJIT_DEVICE float dequantize_value(uint8_t q) {
  if constexpr (F == Format::kInt8) {
    return float(int8_t(q));
  } else {
    return f16_bits_to_f32(uint16_t(cvt_f16x2_from_fp8x2<F>(uint16_t(q)) & 0xFFFFu));
  }
}

// ------------------------------------------------------------------------------------------------
// Chunks: the 16 bytes of x one lane owns, and the 4 or 8 quantized bytes it writes
// ------------------------------------------------------------------------------------------------

template <class T>
struct Chunk {
  static constexpr int kElems = 16 / int(sizeof(T));        // 4 (FP32) or 8 (FP16/BF16)
  static constexpr int kLanes = kGroupCols / kElems;        // lanes per unit: 32 or 16
  static constexpr int kUnitsPerBlock = kNumThreads / kLanes;
  static constexpr int kWords = kElems / 4;                 // 32-bit words of quantized output
  static_assert(kGroupCols % kElems == 0 && kLanes <= 32 && 32 % kLanes == 0, "a unit is a lane run");
};

// kVec elements moved as one load or store; alignas makes it one LDG/STG of that width.
template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T e[kVec];
};

// Elements [col, col + kElems) of `row` as floats; columns at or past `limit` read as 0 (they never
// raise an amax and are never stored). kVec elements per load: the host checked that x's base and
// row stride allow it, and col is a multiple of kElems (so of kVec).
template <class T, int kVec>
DGJIT_DEVICE void load_chunk(const T* __restrict__ row, uint32_t col, uint32_t limit,
                             float (&v)[Chunk<T>::kElems]) {
  constexpr int kElems = Chunk<T>::kElems;
  static_assert(kVec >= 1 && kElems % kVec == 0, "kVec divides the chunk");
  if (col + kElems <= limit) {
#pragma unroll
    for (int i = 0; i < kElems; i += kVec) {
      const Vec<T, kVec> pack = *reinterpret_cast<const Vec<T, kVec>*>(row + col + i);
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[i + j] = to_float(pack.e[j]);
    }
  } else {  // the tail of a row (or an idle lane run): element by element
#pragma unroll
    for (int i = 0; i < kElems; ++i) v[i] = col + i < limit ? to_float(row[col + i]) : 0.0f;
  }
}

DGJIT_DEVICE uint32_t abs_bits(float x) { return __float_as_uint(x) & 0x7FFFFFFFu; }
DGJIT_DEVICE uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }
// max(m, |x|) for a running amax m >= 0, NaN if either is NaN (max.NaN, sm_80+); the abs inside the asm (fabsf can
// become abs.ftz.f32, flushing a subnormal x). ptxas folds the abs into the FMNMX operand: one instruction per
// element where abs bits and an integer max took 1.5. Bits of the result order as abs_bits do (NaN's above inf).
// For GEMM accumulators (the group quantizer): __float_as_uint on them made the compiler carry them through the K
// loop as integers, and ptxas waited for the wgmmas there (C7517); this stays in floats.
DGJIT_DEVICE float max_abs_nan(float m, float x) {
  float r;
  asm("{\n .reg .f32 t;\n abs.f32 t, %2;\n max.NaN.f32 %0, %1, t;\n}" : "=f"(r) : "f"(m), "f"(x));
  return r;
}

template <int kElems>
DGJIT_DEVICE uint32_t chunk_amax_bits(const float (&v)[kElems]) {
  uint32_t r = 0;
#pragma unroll
  for (int i = 0; i < kElems; ++i) r = max_u32(r, abs_bits(v[i]));
  return r;
}

// The scale of a group from its amax bits. s == 0 means an all-zero group (or an amax so small that
// amax / kMax underflows): s = 1 then keeps q = x / s finite (0 / 0 would be NaN).
template <Format F>
DGJIT_DEVICE float scale_of(uint32_t amax_bits) {
  const float s = div_rn(__uint_as_float(amax_bits), FormatInfo<F>::kMax);
  return s == 0.0f ? 1.0f : s;
}

// q = round(v / s) into little-endian 32-bit words (element 0 in the lowest byte).
template <Format F, int kElems>
DGJIT_DEVICE void quantize_chunk(const float (&v)[kElems], float scale, uint32_t (&words)[kElems / 4]) {
  const Divisor d = make_divisor(scale);
#pragma unroll
  for (int w = 0; w < kElems / 4; ++w) {
    float y[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) y[j] = divide(v[4 * w + j], d);
    if constexpr (F == Format::kInt8) {
      uint32_t word = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int32_t r = cvt_rni_s32(y[j]);
        r = r < -kInt8Max ? -kInt8Max : (r > kInt8Max ? kInt8Max : r);
        word |= (uint32_t(r) & 0xFFu) << (8 * j);
      }
      words[w] = word;
    } else {
      words[w] = uint32_t(cvt_fp8x2_satfinite<F>(y[1], y[0])) |
                 (uint32_t(cvt_fp8x2_satfinite<F>(y[3], y[2])) << 16);
    }
  }
}

// Bytes [col, col + kElems) of a row of q, those before `k` only. q is the library's own contiguous
// allocation (16-byte aligned), so a whole-chunk store is aligned exactly when k % kElems == 0.
template <int kElems>
DGJIT_DEVICE void store_chunk(uint8_t* __restrict__ row, uint32_t col, uint32_t k,
                              const uint32_t (&words)[kElems / 4]) {
  if (k % kElems == 0 && col + kElems <= k) {
    Vec<uint32_t, kElems / 4> pack;
#pragma unroll
    for (int w = 0; w < kElems / 4; ++w) pack.e[w] = words[w];
    *reinterpret_cast<Vec<uint32_t, kElems / 4>*>(row + col) = pack;
  } else {
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      if (col + i < k) row[col + i] = uint8_t(words[i / 4] >> (8 * (i % 4)));
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Reductions
// ------------------------------------------------------------------------------------------------

// Max over aligned runs of kLanes lanes; every lane of the warp must call it.
template <int kLanes>
DGJIT_DEVICE uint32_t reduce_max_lanes(uint32_t v) {
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "power-of-two lane runs");
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) v = max_u32(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  return v;
}

// Max over the block, returned to every thread; every thread must call it, once per kernel (the
// shared words are not reused, so one barrier suffices).
DGJIT_DEVICE uint32_t reduce_max_block(uint32_t v, uint32_t (&shared)[kNumWarps]) {
  v = reduce_max_lanes<32>(v);
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  uint32_t r = 0;
#pragma unroll
  for (int i = 0; i < kNumWarps; ++i) r = max_u32(r, shared[i]);
  return r;
}

// ------------------------------------------------------------------------------------------------
// Kernel bodies
// ------------------------------------------------------------------------------------------------

// group128 and tensor: grid = ceil(m * num_groups / kUnitsPerBlock) blocks. For tensor, `amax_bits`
// holds the tensor's amax (written by amax_body earlier on the stream) and block 0 stores the scale.
template <class T, Format F, Granularity G, int kVec>
DGJIT_DEVICE void quantize_units(const T* __restrict__ x, int64_t ldx, uint8_t* __restrict__ q,
                                 float* __restrict__ scales, int64_t scales_stride_m, int64_t scales_stride_g,
                                 const uint32_t* __restrict__ amax_bits, uint32_t m, uint32_t k) {
  static_assert(G == Granularity::kGroup128 || G == Granularity::kTensor, "one lane run per unit");
  using C = Chunk<T>;
  const uint32_t num_groups = ceil_div(k, uint32_t(kGroupCols));
  const uint64_t num_units = uint64_t(m) * num_groups;
  const uint64_t unit = uint64_t(blockIdx.x) * C::kUnitsPerBlock + threadIdx.x / C::kLanes;
  // Idle lane runs (past the last unit) still take part in the shuffles, reading nothing.
  const bool is_active = unit < num_units;
  const uint32_t row = is_active ? uint32_t(unit / num_groups) : 0;
  const uint32_t group = is_active ? uint32_t(unit % num_groups) : 0;
  const uint32_t col = group * kGroupCols + (threadIdx.x % C::kLanes) * C::kElems;
  float v[C::kElems];
  load_chunk<T, kVec>(x + int64_t(row) * ldx, col, is_active ? k : 0, v);

  float scale;
  if constexpr (G == Granularity::kTensor) {
    scale = scale_of<F>(*amax_bits);
    if (blockIdx.x == 0 && threadIdx.x == 0) scales[0] = scale;
  } else {
    scale = scale_of<F>(reduce_max_lanes<C::kLanes>(chunk_amax_bits(v)));
    if (is_active && threadIdx.x % C::kLanes == 0) {
      scales[int64_t(row) * scales_stride_m + int64_t(group) * scales_stride_g] = scale;
    }
  }
  if (!is_active) return;
  uint32_t words[C::kWords];
  quantize_chunk<F>(v, scale, words);
  store_chunk<C::kElems>(q + uint64_t(row) * k, col, k, words);
}

// row and block128: one block per scale, grid = m (row) or ceil(m / 128) * num_groups (block128,
// block index = row block * num_groups + group). Two passes over the block's rectangle: amax, then
// quantize; the second pass re-reads x, which the first pass has just brought into L1/L2.
template <class T, Format F, Granularity G, int kVec>
DGJIT_DEVICE void quantize_rects(const T* __restrict__ x, int64_t ldx, uint8_t* __restrict__ q,
                                 float* __restrict__ scales, int64_t scales_stride_m, int64_t scales_stride_g,
                                 uint32_t m, uint32_t k) {
  static_assert(G == Granularity::kRow || G == Granularity::kBlock128, "one block per scale");
  using C = Chunk<T>;
  __shared__ uint32_t shared[kNumWarps];
  const uint32_t num_groups = ceil_div(k, uint32_t(kGroupCols));
  uint32_t row0, group0, num_units;
  if constexpr (G == Granularity::kRow) {  // units: the groups of one row
    row0 = blockIdx.x;
    group0 = 0;
    num_units = num_groups;
  } else {  // units: up to 128 rows of one group
    row0 = (blockIdx.x / num_groups) * kGroupCols;
    group0 = blockIdx.x % num_groups;
    num_units = min_c(kGroupCols, int(m - row0));
  }
  const uint32_t first_unit = threadIdx.x / C::kLanes;
  const uint32_t lane_col = (threadIdx.x % C::kLanes) * C::kElems;
  auto locate = [&](uint32_t u, uint32_t& row, uint32_t& col) {
    row = G == Granularity::kRow ? row0 : row0 + u;
    col = (G == Granularity::kRow ? u : group0) * kGroupCols + lane_col;
  };

  uint32_t amax = 0;
  for (uint32_t u = first_unit; u < num_units; u += C::kUnitsPerBlock) {
    uint32_t row, col;
    locate(u, row, col);
    float v[C::kElems];
    load_chunk<T, kVec>(x + int64_t(row) * ldx, col, k, v);
    amax = max_u32(amax, chunk_amax_bits(v));
  }
  const float scale = scale_of<F>(reduce_max_block(amax, shared));
  if (threadIdx.x == 0) {  // row: the scale of row blockIdx.x; block128: of (row block, group)
    const uint32_t scale_row = G == Granularity::kRow ? blockIdx.x : blockIdx.x / num_groups;
    const uint32_t scale_group = G == Granularity::kRow ? 0 : blockIdx.x % num_groups;
    scales[int64_t(scale_row) * scales_stride_m + int64_t(scale_group) * scales_stride_g] = scale;
  }

  for (uint32_t u = first_unit; u < num_units; u += C::kUnitsPerBlock) {
    uint32_t row, col;
    locate(u, row, col);
    float v[C::kElems];
    load_chunk<T, kVec>(x + int64_t(row) * ldx, col, k, v);
    uint32_t words[C::kWords];
    quantize_chunk<F>(v, scale, words);
    store_chunk<C::kElems>(q + uint64_t(row) * k, col, k, words);
  }
}

// Scale (i, j) (row or row block i, group j) is scales[i * scales_stride_m + j * scales_stride_g];
// tensor writes scales[0].
template <class T, Format F, Granularity G, int kVec>
DGJIT_DEVICE void quantize_body(const T* __restrict__ x, int64_t ldx, uint8_t* __restrict__ q,
                                float* __restrict__ scales, int64_t scales_stride_m, int64_t scales_stride_g,
                                const uint32_t* __restrict__ amax_bits, uint32_t m, uint32_t k) {
  if constexpr (G == Granularity::kGroup128 || G == Granularity::kTensor) {
    quantize_units<T, F, G, kVec>(x, ldx, q, scales, scales_stride_m, scales_stride_g, amax_bits, m, k);
  } else {
    quantize_rects<T, F, G, kVec>(x, ldx, q, scales, scales_stride_m, scales_stride_g, m, k);
  }
}

// Tensor amax: a grid-stride loop over units, one atomicMax per block into `amax_bits`, which the
// host zeroes on the same stream first.
template <class T, int kVec>
DGJIT_DEVICE void amax_body(const T* __restrict__ x, int64_t ldx, uint32_t* __restrict__ amax_bits,
                            uint32_t m, uint32_t k) {
  using C = Chunk<T>;
  __shared__ uint32_t shared[kNumWarps];
  const uint32_t num_groups = ceil_div(k, uint32_t(kGroupCols));
  const uint64_t num_units = uint64_t(m) * num_groups;
  const uint64_t stride = uint64_t(gridDim.x) * C::kUnitsPerBlock;
  const uint32_t lane_col = (threadIdx.x % C::kLanes) * C::kElems;
  uint32_t amax = 0;
  for (uint64_t unit = uint64_t(blockIdx.x) * C::kUnitsPerBlock + threadIdx.x / C::kLanes; unit < num_units;
       unit += stride) {
    const uint32_t row = uint32_t(unit / num_groups);
    const uint32_t col = uint32_t(unit % num_groups) * kGroupCols + lane_col;
    float v[C::kElems];
    load_chunk<T, kVec>(x + int64_t(row) * ldx, col, k, v);
    amax = max_u32(amax, chunk_amax_bits(v));
  }
  amax = reduce_max_block(amax, shared);
  if (threadIdx.x == 0) atomicMax(amax_bits, amax);
}

// x = float(q) * s, one element per thread and iteration (a reference path, not a fast one). The
// scale of (row, col) is scales[(row / rows_per_scale) * stride_m + (col / cols_per_scale) * stride_g],
// which spells every granularity and layout: tensor (m, k, 0, 0), row (1, k, s, 0), group128
// (1, 128, s_m, s_g), block128 (128, 128, s_m, s_g). `out` is contiguous (m, k).
template <Format F, class TOut>
DGJIT_DEVICE void dequantize_body(const uint8_t* __restrict__ q, int64_t ldq, const float* __restrict__ scales,
                                  int64_t scales_stride_m, int64_t scales_stride_g, TOut* __restrict__ out,
                                  uint32_t m, uint32_t k, uint32_t rows_per_scale, uint32_t cols_per_scale) {
  const uint64_t total = uint64_t(m) * k;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const uint32_t row = uint32_t(i / k);
    const uint32_t col = uint32_t(i % k);
    const float s = scales[int64_t(row / rows_per_scale) * scales_stride_m +
                           int64_t(col / cols_per_scale) * scales_stride_g];
    store_converted(out + i, dequantize_value<F>(q[int64_t(row) * ldq + col]) * s);
  }
}

}  // namespace quant
}  // namespace dgjit
