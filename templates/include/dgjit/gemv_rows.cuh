// Row sweep for decode at 1 or 2 tokens: D (M x N) = A (M x K) * B (N x K)^T on CUDA cores, reading the weight B
// front to back the way a streaming read does. The host side is deepgemm_jit/gemv_rows.py (rule, grid, launch).
//
// Why this shape of work (NOTES "session 30"): a GEMV at M = 1 is bound by reading B once, and how fast the
// DRAM delivers it depends on how many weight rows are open at a time. The Hopper tiles and the mma.sync
// weight-streaming kernel (gemv.cuh) read 128-256 bytes of thousands of rows at once; here one CTA reads one
// whole row at a time (its threads' 16-byte words are consecutive), so the grid reads a window of ~2 x grid
// rows, as a grid-stride copy does. On the H200 that reached the evict-first read's speed (BF16 7168x16384:
// 64.8 us vs the read's 64.0, the tiles 66.9).
//
// Work decomposition: CTA b owns rows b, b + gridDim.x, ... (one wave: gridDim.x <= resident CTAs). Thread t
// owns the row's 16-byte words t, t + kThreads, ..., t + (kChunks - 1) kThreads, the same positions in every
// row, so its activation words (kTokens x kChunks) are loaded once into registers. The next row's words are
// loaded before this row is reduced (two rows of loads in flight per thread). A row's partial sums meet in a
// fixed order (registers, warp butterfly, then warp 0 over the warps' sums in shared memory): the same bits on
// every run, no atomics, nothing allocated, graph-capturable.
//
// Arithmetic: a 16-bit value's FP32 value is its bits shifted up (BF16) or one conversion (FP16); FP32 FMAs.
// At M = 1 a warp spends ~25 instructions per 512 bytes of weight (per 32-bit word: unpack both operands, two
// FMAs), ~0.8 per cycle and SM at DRAM speed (~16 bytes per cycle and SM) of the 4 an SM issues; ~1.3 at M = 2.
//
// Requirements the host guarantees (gemv_rows.py): K x element size a multiple of 16 bytes (row_words = K * e
// / 16 whole words), 16-byte aligned rows of A and B, row_words <= kThreads x kChunks, 1 <= m <= kTokens.
#pragma once
#include "dgjit/common.cuh"

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

// The two FP32 values of a 32-bit word of two 16-bit elements (low element first).
template <class T>
DGJIT_DEVICE void unpack2(uint32_t word, float& lo, float& hi) {
  if constexpr (is_same<T, bfloat16_t>::value) {
    lo = __uint_as_float(word << 16);
    hi = __uint_as_float(word & 0xffff0000u);
  } else {
    static_assert(is_same<T, half_t>::value, "16-bit weights");
    asm("{\n .reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}\n"
        : "=f"(lo), "=f"(hi)
        : "r"(word));
  }
}

// acc[0..3] += the 8 products of one weight word and one activation word (four chains: the FMAs of a word
// pair do not wait on each other).
template <class T>
DGJIT_DEVICE void dot8(const uint4& w, const uint4& x, float (&acc)[4]) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float wl, wh, xl, xh;
    unpack2<T>(ws[i], wl, wh);
    unpack2<T>(xs[i], xl, xh);
    acc[(i % 2) * 2] = fmaf(wl, xl, acc[(i % 2) * 2]);
    acc[(i % 2) * 2 + 1] = fmaf(wh, xh, acc[(i % 2) * 2 + 1]);
  }
}

DGJIT_DEVICE float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The kernel body; the entry (gemv_rows.cu.j2) fixes the types and sizes.
template <class T, class TOut, int kTokens, int kThreads, int kChunks>
DGJIT_DEVICE void run(const uint8_t* __restrict__ w, int64_t ldw_bytes, const uint8_t* __restrict__ x,
                      int64_t ldx_bytes, TOut* __restrict__ d, int64_t ldd, uint32_t m, uint32_t n,
                      uint32_t row_words) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, one CTA");
  static_assert(kTokens >= 1 && kTokens <= 2 && kChunks >= 1, "1 or 2 tokens (registers)");
  constexpr int kWarps = kThreads / 32;
  constexpr int kChunkBytes = 16;
  __shared__ float partials[2][kTokens][kWarps];  // two slots: one barrier per row (see below)

  const int t = int(threadIdx.x), warp = t / 32, lane = t % 32;
  const uint64_t policy = evict_first_policy();
  bool owns[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) owns[j] = uint32_t(t + j * kThreads) < row_words;

  // This thread's activation words: tokens past m repeat the last one (their sums are never stored).
  uint4 xr[kTokens][kChunks];
#pragma unroll
  for (int i = 0; i < kTokens; ++i) {
    const uint8_t* row = x + int64_t(min(uint32_t(i), m - 1)) * ldx_bytes;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      xr[i][j] = owns[j] ? *reinterpret_cast<const uint4*>(row + int64_t(t + j * kThreads) * kChunkBytes)
                         : make_uint4(0u, 0u, 0u, 0u);
    }
  }

  auto load_row = [&](uint4 (&words)[kChunks], uint32_t row) {
    const uint8_t* base = w + int64_t(row) * ldw_bytes + int64_t(t) * kChunkBytes;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      words[j] = (row < n && owns[j]) ? ld_weight(base + int64_t(j) * kThreads * kChunkBytes, policy)
                                      : make_uint4(0u, 0u, 0u, 0u);
    }
  };

  uint4 cur[kChunks], next[kChunks];
  uint32_t row = blockIdx.x;
  load_row(cur, row);
  int slot = 0;
  for (; row < n; row += gridDim.x) {
    load_row(next, row + gridDim.x);
    float sums[kTokens];
#pragma unroll
    for (int i = 0; i < kTokens; ++i) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < kChunks; ++j) dot8<T>(cur[j], xr[i][j], acc);
      sums[i] = warp_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
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
        const float total = warp_sum(lane < kWarps ? partials[slot][i][lane] : 0.f);
        if (lane == 0 && uint32_t(i) < m) store_converted(d + int64_t(i) * ldd + row, total);
      }
    }
    slot ^= 1;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) cur[j] = next[j];
  }
}

}  // namespace gemv_rows
}  // namespace dgjit
