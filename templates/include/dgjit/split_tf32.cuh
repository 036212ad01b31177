// The pre-pass of the FP32-accurate GEMM (3xTF32, deepgemm_jit/fp32x3.py): FP32 operands -> K-concatenated
// TF32 operands of one TF32 GEMM,
//
//   A2 = [A_hi | A_lo]   (M, 2 Kp)    the GEMM (GemmSpec.hi_lo) sums A_hi B_hi^T + A_hi B_lo^T + A_lo B_hi^T,
//   B2 = [B_hi | B_lo]   (N, 2 Kp)    K block by K block
//
// each segment Kp = ceil(K / kKAlign) * kKAlign columns wide, zero past K, both outputs row-major and
// contiguous (row pitch 2 Kp floats: a multiple of 16 bytes, so TMA can describe them). Per element:
//
//   hi = cvt.rna.tf32(x)        nearest TF32 (ties away from zero): the low 13 mantissa bits are zero
//   lo = cvt.rna.tf32(x - hi)   x - hi is exact in FP32 (|x - hi| <= half a TF32 ulp of x, a multiple of
//                               x's FP32 ulp); rounding it to TF32 too makes every value written a TF32 value,
//                               so the product does not depend on how the tensor cores drop low bits.
//
// What is left out: A_lo B_lo^T and the rounding of lo, each below 2^-22 relative per product, under the
// FP32 accumulation's own error. Non-finite x: hi = x (a NaN made quiet, so that it stays a NaN in TF32),
// lo = 0 (an inf must not turn into inf - inf = NaN in lo). A finite x within half a TF32 ulp of FLT_MAX,
// which rna would round to inf, is truncated instead.
//
// Work decomposition: a block owns one tile of kTileRows rows x kTileCols source columns (K) of one
// operand; blocks [0, tiles(A)) split A, the rest B, so both operands take one launch.
//   K-major source (row stride ld, K contiguous): lane i of a warp owns 16-byte chunk i of a row's 128
//     columns: one 512-byte read and two 512-byte writes per warp and chunk, no shared memory. A chunk
//     is one 16-byte load where its address is 16-byte aligned (tested per chunk: any base and row stride
//     work), else four scalar loads.
//   MN-major source (a (K, M) A or a (K, N) B, rows contiguous): the tile is read k-row by k-row (a warp
//     reads 32 consecutive rows of one k: 128 contiguous bytes) into shared memory, then written as in the
//     K-major case. Pitch kSmemPitch = 34 floats: the writes (32 rows of one k) and the reads (8 rows x
//     4 chunks per warp, 4 k per chunk) both touch 32 distinct banks.
#pragma once
#include "dgjit/common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "split_tf32.cuh needs sm_80 or newer (cvt.rna.tf32.f32)"
#endif

namespace dgjit {
namespace split {

constexpr int kNumThreads = 256;
constexpr int kNumWarps = kNumThreads / 32;
constexpr int kTileRows = 32;
constexpr int kTileCols = 128;    // source K columns per tile (and destination columns per segment)
constexpr int kChunk = 4;         // floats per 16-byte chunk
constexpr int kKAlign = 32;       // Kp is a multiple of this: the TF32 GEMM's BLOCK_K, so no K block straddles
constexpr int kNumSegments = 2;
constexpr int kChunksPerRow = kTileCols / kChunk;                          // 32: one warp per tile row
constexpr int kChunksPerThread = kTileRows * kChunksPerRow / kNumThreads;  // 4
constexpr int kSmemPitch = kTileRows + 2;
// The segment that holds lo in each output (the other holds hi): [hi lo] for both.
constexpr int kLoSegmentA = 1;
constexpr int kLoSegmentB = 1;
static_assert(kChunksPerRow == 32 && kTileRows * kChunksPerRow % kNumThreads == 0, "a warp covers a tile row");
static_assert(kTileCols % kKAlign == 0 && kKAlign % kChunk == 0, "chunks never straddle Kp");
static_assert(kTileCols % kNumWarps == 0 && kTileRows == 32, "MN-major loads: one lane per row");

// x rounded to the nearest TF32 value, ties away from zero, returned as the FP32 with those bits (sm_80+).
DGJIT_DEVICE float cvt_rna_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
}

// ------------------------------------------------------------------------------------------------
// One element, one chunk
// ------------------------------------------------------------------------------------------------

struct HiLo {
  float hi;
  float lo;
};

DGJIT_DEVICE HiLo split_tf32(float x) {
  // A NaN gets the quiet bit, which TF32 keeps: one whose payload sat only in the dropped bits would read as inf.
  const uint32_t quiet = isnan(x) ? 0x00400000u : 0u;
  const float hi = __uint_as_float(tf32_nearest(x) | quiet);  // near-FLT_MAX x: see tf32_nearest
  // lo = 0 for a non-finite x: inf - inf would make lo a NaN.
  const bool finite = (__float_as_uint(x) & 0x7F800000u) != 0x7F800000u;
  return {hi, finite ? cvt_rna_tf32(sub_rn(x, hi)) : 0.0f};
}

// Four floats moved as one 16-byte load or store.
struct alignas(16) Chunk {
  float e[kChunk];
};

// Columns [col, col + kChunk) of a K-major row; columns at or past `limit` read as 0 (the zero padding).
DGJIT_DEVICE void load_chunk(const float* __restrict__ row, uint32_t col, uint32_t limit, Chunk& v) {
  const float* p = row + col;
  if (col + kChunk <= limit && (reinterpret_cast<uint64_t>(p) & 15u) == 0) {
    v = *reinterpret_cast<const Chunk*>(p);
  } else {
#pragma unroll
    for (int j = 0; j < kChunk; ++j) v.e[j] = col + j < limit ? p[j] : 0.0f;
  }
}

// Splits a chunk and writes its hi and lo into the destination row (2 * kp floats, 16-byte aligned: kp is
// a multiple of kKAlign and the host allocates the destination).
template <int kLoSegment>
DGJIT_DEVICE void store_split_chunk(float* __restrict__ dst_row, uint32_t kp, uint32_t col, const Chunk& v) {
  Chunk hi, lo;
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    const HiLo s = split_tf32(v.e[j]);
    hi.e[j] = s.hi;
    lo.e[j] = s.lo;
  }
#pragma unroll
  for (int seg = 0; seg < kNumSegments; ++seg) {
    *reinterpret_cast<Chunk*>(dst_row + uint64_t(seg) * kp + col) = seg == kLoSegment ? lo : hi;
  }
}

// ------------------------------------------------------------------------------------------------
// Tiles
// ------------------------------------------------------------------------------------------------

DGJIT_DEVICE uint32_t num_tiles(uint32_t rows, uint32_t kp) {
  return ceil_div(rows, uint32_t(kTileRows)) * ceil_div(kp, uint32_t(kTileCols));
}

// Tile `tile` of one operand: `rows` rows of K columns, read from src (K-major: element (r, c) at
// src[r * ld + c]; MN-major: at src[c * ld + r]) and written to dst (rows, 3 * kp).
template <bool kKMajor, int kLoSegment>
DGJIT_DEVICE void split_tile(const float* __restrict__ src, int64_t ld, float* __restrict__ dst, uint32_t rows,
                             uint32_t k, uint32_t kp, uint32_t tile, float (*smem)[kSmemPitch]) {
  const uint32_t num_col_tiles = ceil_div(kp, uint32_t(kTileCols));
  const uint32_t row0 = (tile / num_col_tiles) * kTileRows;
  const uint32_t col0 = (tile % num_col_tiles) * kTileCols;
  const uint64_t dst_ld = uint64_t(kNumSegments) * kp;
  const uint32_t warp = threadIdx.x / 32;
  const uint32_t lane = threadIdx.x % 32;

  if constexpr (kKMajor) {
    // All loads first, then all stores: four 16-byte loads in flight per thread.
    Chunk v[kChunksPerThread];
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const uint32_t row = row0 + i * kNumWarps + warp;
      load_chunk(src + int64_t(row < rows ? row : 0) * ld, col0 + lane * kChunk, row < rows ? k : 0, v[i]);
    }
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const uint32_t row = row0 + i * kNumWarps + warp;
      const uint32_t col = col0 + lane * kChunk;
      if (row < rows && col < kp) store_split_chunk<kLoSegment>(dst + row * dst_ld, kp, col, v[i]);
    }
  } else {
    const uint32_t row = row0 + lane;
#pragma unroll
    for (int i = 0; i < kTileCols / kNumWarps; ++i) {
      const uint32_t c = i * kNumWarps + warp;
      smem[c][lane] = row < rows && col0 + c < k ? src[int64_t(col0 + c) * ld + row] : 0.0f;
    }
    __syncthreads();
    // A warp writes 8 rows x 4 chunks (64 contiguous bytes per row and segment: whole 32-byte sectors).
    constexpr int kRowGroups = kTileRows / 8;
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const uint32_t task = i * kNumWarps + warp;
      const uint32_t r = (task % kRowGroups) * 8 + lane % 8;
      const uint32_t c = (task / kRowGroups) * 4 + lane / 8;
      Chunk v;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) v.e[j] = smem[c * kChunk + j][r];
      const uint32_t col = col0 + c * kChunk;
      if (row0 + r < rows && col < kp) store_split_chunk<kLoSegment>(dst + (row0 + r) * dst_ld, kp, col, v);
    }
  }
}

// The whole launch: grid = num_tiles(m, kp) + num_tiles(n, kp) blocks of kNumThreads threads, no dynamic
// shared memory. a is (M, K) (kAKMajor) or (K, M); b is (N, K) (kBKMajor) or (K, N).
template <bool kAKMajor, bool kBKMajor>
DGJIT_DEVICE void split_body(const float* __restrict__ a, int64_t lda, const float* __restrict__ b, int64_t ldb,
                             float* __restrict__ a2, float* __restrict__ b2, uint32_t m, uint32_t n, uint32_t k,
                             uint32_t kp) {
  // Shared memory only where a source is MN-major (one row of it otherwise, never touched).
  __shared__ float smem[kAKMajor && kBKMajor ? 1 : kTileCols][kSmemPitch];
  const uint32_t a_tiles = num_tiles(m, kp);
  if (blockIdx.x < a_tiles) {
    split_tile<kAKMajor, kLoSegmentA>(a, lda, a2, m, k, kp, blockIdx.x, smem);
  } else {
    split_tile<kBKMajor, kLoSegmentB>(b, ldb, b2, n, k, kp, blockIdx.x - a_tiles, smem);
  }
}

}  // namespace split
}  // namespace dgjit
