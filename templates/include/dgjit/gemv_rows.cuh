// Row sweep for decode at 1 or 2 tokens: D (M x N) = A (M x K) * B (N x K)^T on CUDA cores (16-bit, or FP8 with
// tensor / row / block scales), reading the weight B the way a streaming read does. The host side is
// deepgemm_jit/gemv_rows.py (rule, grid, launch).
//
// Why this shape of work (NOTES "session 30"): a GEMV at M = 1 is bound by reading B once, and as an SM alone
// pulls at most ~31 GB/s, a read reaches the DRAM's speed only with nearly every SM pulling until an even end.
// Here every SM holds 1024 threads with two rows of 16-byte loads in flight, and a CTA takes one whole row at a
// time (~27 rows per CTA at N = 7168: an even end). On the H200 that reached the evict-first read's speed (BF16
// 7168x16384: 64.8 us vs the read's 64.0, the tiles 66.9).
//
// Work decomposition: CTA b owns rows b, b + gridDim.x, ... (one wave: gridDim.x <= resident CTAs). Thread t
// owns the row's 16-byte words t, t + kThreads, ..., t + (kChunks - 1) kThreads, the same positions in every
// row, so its activation words (kTokens x kChunks) are loaded once into registers. The next row's words are
// loaded before this row is reduced (two rows of loads in flight per thread). A row's partial sums meet in a
// fixed order (registers, warp butterfly, then warp 0 over the warps' sums in shared memory): the same bits on
// every run, no atomics, nothing allocated, graph-capturable.
//
// Arithmetic: a 16-bit value's FP32 value is its bits shifted up (BF16) or one conversion (FP16), an FP8 pair's
// two FP16 values one conversion (exact) and then one each; FP32 FMAs. At M = 1 a warp spends ~25 instructions
// per 512 bytes of 16-bit weight (per 32-bit word: unpack both operands, two FMAs), ~0.8 per cycle and SM at DRAM
// speed (~16 bytes per cycle and SM) of the 4 an SM issues; FP8 ~64 per 512 bytes at ~13 bytes per cycle, ~1.6.
// FP8 scales: tensor and row multiply a row's sum once; with block scaling each 16-byte word (16 values) lies in
// one 128-value K group, so its products are summed alone and added times its group's A and B scales (FP32
// throughout: no promotion interval to respect).
//
// Requirements the host guarantees (gemv_rows.py): K x element size a multiple of 16 bytes (row_words = K * e
// / 16 whole words), 16-byte aligned rows of A and B, row_words <= kThreads x kChunks, 1 <= m <= kTokens.
#pragma once
#include "dgjit/common.cuh"
#include "dgjit/quantize.cuh"  // quant::cvt_f16x2_from_fp8x2, quant::f16_bits_to_f32

namespace dgjit {
namespace gemv_rows {

// 16 bytes of the weight, read once: not kept in L1, and first out of L2 (the dirty lines other kernels left
// there stay rather than being written back under the stream).
DGJIT_DEVICE uint64_t evict_first_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
DGJIT_DEVICE uint4 ld_weight(const uint8_t* p, uint64_t policy) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}

// The FP32 values of the elements of one 32-bit word of T (two 16-bit or four FP8 values), lowest address first.
template <class T>
DGJIT_DEVICE void unpack(uint32_t word, float (&f)[4 / sizeof(T)]) {
  if constexpr (is_same<T, bfloat16_t>::value) {
    f[0] = __uint_as_float(word << 16);
    f[1] = __uint_as_float(word & 0xffff0000u);
  } else if constexpr (is_same<T, half_t>::value) {
    f[0] = quant::f16_bits_to_f32(uint16_t(word));
    f[1] = quant::f16_bits_to_f32(uint16_t(word >> 16));
  } else {
    static_assert(is_same<T, float_e4m3_t>::value || is_same<T, float_e5m2_t>::value, "16-bit or FP8 values");
    constexpr quant::Format kFormat = is_same<T, float_e4m3_t>::value ? quant::Format::kE4M3 : quant::Format::kE5M2;
    const uint32_t lo = quant::cvt_f16x2_from_fp8x2<kFormat>(uint16_t(word));  // exact: FP8 is a subset of FP16
    const uint32_t hi = quant::cvt_f16x2_from_fp8x2<kFormat>(uint16_t(word >> 16));
    f[0] = quant::f16_bits_to_f32(uint16_t(lo));
    f[1] = quant::f16_bits_to_f32(uint16_t(lo >> 16));
    f[2] = quant::f16_bits_to_f32(uint16_t(hi));
    f[3] = quant::f16_bits_to_f32(uint16_t(hi >> 16));
  }
}

// A thread's activation word as the dot products read it, every row: 16-bit words stay packed (widening costs one
// instruction or none), FP8 words are widened to FP32 once (16 registers), which leaves a row's FP8 word 40
// instructions instead of 64.
template <class TX, bool kWidened = sizeof(TX) == 1>
struct ActWord {
  uint4 bits;
};
template <class TX>
struct ActWord<TX, true> {
  float v[16];
};

template <class TX>
DGJIT_DEVICE ActWord<TX> act_word(const uint4& bits) {
  ActWord<TX> a;
  if constexpr (sizeof(TX) == 1) {
    const uint32_t regs[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      float f[4];
      unpack<TX>(regs[r], f);
#pragma unroll
      for (int e = 0; e < 4; ++e) a.v[4 * r + e] = f[e];
    }
  } else {
    a.bits = bits;
  }
  return a;
}

// acc[0..3] += the products of one weight word (TW) and one activation word (TX): 8 (16-bit) or 16 (FP8), in
// four chains so that the FMAs of a word do not wait on each other.
template <class TW, class TX>
DGJIT_DEVICE void dot_word(const uint4& w, const ActWord<TX>& x, float (&acc)[4]) {
  static_assert(sizeof(TW) == sizeof(TX), "one element size");
  constexpr int kPerReg = 4 / int(sizeof(TW));
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    float fw[kPerReg], fx[kPerReg];
    unpack<TW>(ws[r], fw);
    if constexpr (sizeof(TX) == 1) {
#pragma unroll
      for (int e = 0; e < kPerReg; ++e) fx[e] = x.v[r * kPerReg + e];
    } else {
      const uint32_t xs[4] = {x.bits.x, x.bits.y, x.bits.z, x.bits.w};
      unpack<TX>(xs[r], fx);
    }
#pragma unroll
    for (int e = 0; e < kPerReg; ++e) acc[(r * kPerReg + e) % 4] = fmaf(fw[e], fx[e], acc[(r * kPerReg + e) % 4]);
  }
}

DGJIT_DEVICE float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Scales (8-bit weights): element (i, j) of scale_a at sa[i * sa_si + j * sa_sj] (i: token; j: 128-value group of
// K for block scaling, else 0), of scale_b at sb[i * sb_si + j * sb_sj] (i: weight row for row scaling, its
// 128-row block for block scaling, else 0).
struct Scales {
  const float* sa;
  const float* sb;
  int64_t sa_si, sa_sj, sb_si, sb_sj;
};

// The kernel body; the entry (gemv_rows.cu.j2) fixes the types and sizes.
template <class TW, class TX, class TOut, Scaling kScaling, int kTokens, int kThreads, int kChunks>
DGJIT_DEVICE void run(const uint8_t* __restrict__ w, int64_t ldw_bytes, const uint8_t* __restrict__ x,
                      int64_t ldx_bytes, const Scales& sc, TOut* __restrict__ d, int64_t ldd, uint32_t m, uint32_t n,
                      uint32_t row_words) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, one CTA");
  static_assert(kTokens >= 1 && kTokens <= 2 && kChunks >= 1, "1 or 2 tokens (registers)");
  static_assert((kScaling == Scaling::kNone) == (sizeof(TW) == 2), "scales belong to FP8 weights");
  constexpr bool kBlock = kScaling == Scaling::kBlock;
  constexpr int kWarps = kThreads / 32;
  constexpr int kChunkBytes = 16;
  constexpr int kWordsPerGroup = 128 / (kChunkBytes / int(sizeof(TW)));  // block scaling: 8 FP8 words a K group
  __shared__ float partials[2][kTokens][kWarps];  // two slots: one barrier per row (see below)

  const int t = int(threadIdx.x), warp = t / 32, lane = t % 32;
  const uint64_t policy = evict_first_policy();
  bool owns[kChunks];
  int group[kChunks];  // block scaling: the K group of each of this thread's words
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    owns[j] = uint32_t(t + j * kThreads) < row_words;
    group[j] = (t + j * kThreads) / kWordsPerGroup;
  }

  // This thread's activation words (and their group scales): tokens past m repeat the last one (their sums are
  // never stored).
  ActWord<TX> xr[kTokens][kChunks];
  float sa_words[kBlock ? kTokens : 1][kChunks];
#pragma unroll
  for (int i = 0; i < kTokens; ++i) {
    const uint32_t token = min(uint32_t(i), m - 1);
    const uint8_t* row = x + int64_t(token) * ldx_bytes;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      xr[i][j] = act_word<TX>(owns[j] ? *reinterpret_cast<const uint4*>(row + int64_t(t + j * kThreads) * kChunkBytes)
                                      : make_uint4(0u, 0u, 0u, 0u));
      if constexpr (kBlock) sa_words[i][j] = owns[j] ? __ldg(sc.sa + token * sc.sa_si + group[j] * sc.sa_sj) : 0.f;
    }
  }

  // A row's words, and with block scaling their B scales (the row's 128-row block, each word's group).
  auto load_row = [&](uint4 (&words)[kChunks], float (&sb_words)[kChunks], uint32_t row) {
    const uint8_t* base = w + int64_t(row) * ldw_bytes + int64_t(t) * kChunkBytes;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const bool load = row < n && owns[j];
      words[j] = load ? ld_weight(base + int64_t(j) * kThreads * kChunkBytes, policy) : make_uint4(0u, 0u, 0u, 0u);
      if constexpr (kBlock) sb_words[j] = load ? __ldg(sc.sb + (row / 128) * sc.sb_si + group[j] * sc.sb_sj) : 0.f;
    }
  };

  uint4 cur[kChunks], next[kChunks];
  float sb_cur[kChunks], sb_next[kChunks];
  uint32_t row = blockIdx.x;
  load_row(cur, sb_cur, row);
  int slot = 0;
  for (; row < n; row += gridDim.x) {
    load_row(next, sb_next, row + gridDim.x);
    float sums[kTokens];
#pragma unroll
    for (int i = 0; i < kTokens; ++i) {
      float total;
      if constexpr (kBlock) {  // each word is one group's: its products summed, then times the group's scales
        total = 0.f;
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          float acc[4] = {0.f, 0.f, 0.f, 0.f};
          dot_word<TW, TX>(cur[j], xr[i][j], acc);
          total = fmaf((acc[0] + acc[1]) + (acc[2] + acc[3]), sa_words[i][j] * sb_cur[j], total);
        }
      } else {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < kChunks; ++j) dot_word<TW, TX>(cur[j], xr[i][j], acc);
        total = (acc[0] + acc[1]) + (acc[2] + acc[3]);
      }
      sums[i] = warp_sum(total);
    }
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < kTokens; ++i) partials[slot][i][warp] = sums[i];
    }
    // One barrier per row: warp 0 reads slot s after it; a warp writes slot s again two rows later, after the
    // next barrier, which warp 0 reaches only when its read of slot s is done.
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int i = 0; i < kTokens; ++i) {
        float value = warp_sum(lane < kWarps ? partials[slot][i][lane] : 0.f);
        if (lane == 0 && uint32_t(i) < m) {
          if constexpr (kScaling == Scaling::kTensor) {
            value *= __ldg(sc.sa) * __ldg(sc.sb);
          } else if constexpr (kScaling == Scaling::kRow) {
            value *= __ldg(sc.sa + i * sc.sa_si) * __ldg(sc.sb + int64_t(row) * sc.sb_si);
          }
          store_converted(d + int64_t(i) * ldd + row, value);
        }
      }
    }
    slot ^= 1;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      cur[j] = next[j];
      sb_cur[j] = sb_next[j];
    }
  }
}

}  // namespace gemv_rows
}  // namespace dgjit
