// Weight streaming for decode: D (M x N) = A (M x K) * B (N x K)^T with M <= 16 tokens, bound by reading
// the weight B once. The host side is deepgemm_jit/gemv.py (dispatch rule, grid, launch).
//
// Why tensor cores at M = 1: a dot product on CUDA cores costs a conversion and an FMA per weight element
// (~2 instructions per 2 bytes: at 4 TB/s that is ~4 T instructions/s, close to what 132 SMs issue), while
// mma.sync takes the 16-byte weight chunks as loaded, without any unpacking. Swap-AB: the 16 weight rows of
// a row block are the MMA's M side, the tokens its N side (n8; two n8 tiles for M in 9..16), so no
// tensor-core work is wasted on padding beyond the token tile.
//
// K permutation. A dot product is invariant to a permutation of K applied to both operands. In every
// 16-byte chunk a lane loads (8 BF16/FP16 or 16 FP8 values of one row, contiguous), register r holds
// "physical" elements [4r/e, 4(r+1)/e) (e = element bytes); MMA s (two per chunk) takes registers
// {2s, 2s+1} as the A fragment's low-K and high-K halves of its row (m16n8k16: logical k {2t, 2t+1} and
// {2t+8, 2t+9}; m16n8k32: {4t..4t+3} and {4t+16..4t+19}, t = lane % 4). The activation fragment of a lane
// is the same two registers of the same 16 physical bytes of its token's row, so both operands see the
// same permutation of each 16-byte chunk, and no shuffle, ldmatrix or shared memory is needed.
//
// Work decomposition: a CTA of kNumWarps warps owns kNumWarps / warps_k row blocks of 16 rows; the
// warps_k warps of one row block split K into contiguous ranges of steps (a step: 256 bytes of each of the
// block's 16 rows, lane t of a row group reading chunks t, t+4, t+8, t+12). Partial sums are reduced
// through shared memory in a fixed order: results are the same bits on every run (no atomics anywhere).
// NOTES: bytes in flight (Little's law: ~4.25 TB/s x ~1 us / 132 SMs ~= 32 KB per SM): a warp keeps one
// step loading (4 KB of weights) while it multiplies the previous one, so 2 KB..8 KB per warp, 8 warps
// per CTA, 1-2 CTAs per SM: 32..128 KB per SM.
//
// Tails: rows past N and tokens past M read a clamped (valid) row and are never stored (MMA rows and
// columns are independent); K past the end reads zeros in both operands (16-byte chunks that straddle
// K are read byte by byte). The host guarantees 16-byte aligned rows of A and B.
#pragma once
#include "dgjit/common.cuh"
#include "dgjit/ptx_sm80.cuh"

namespace dgjit {
namespace gemv {

constexpr int kNumWarps = 8;
constexpr int kNumThreads = kNumWarps * 32;
constexpr int kBlockRows = 16;                      // MMA M: weight rows per row block
constexpr int kChunkBytes = 16;                     // one ld.v4 per lane
constexpr int kChunksPerStep = 4;                   // per lane and row
constexpr int kStepBytes = 4 * kChunkBytes * kChunksPerStep;  // 256 bytes of each row per step
constexpr int kScaleGroup = 128;                    // FP8 block scaling: 1x128 (A) and 128x128 (B)
static_assert(kStepBytes % kScaleGroup == 0, "a step holds whole FP8 scale groups");

// -- PTX wrappers -------------------------------------------------------------------------------------

// 16 bytes of the weight: dgjit::ld_stream_v4 (ptx_sm80.cuh; a row's step is 256 contiguous bytes).

// 16 bytes of the activations: every warp of an SM that works on the same K range reads them: keep in L1.
DGJIT_DEVICE void ld_cached_v4(uint32_t (&r)[4], const uint8_t* p) {
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "l"(p));
}

// D(16x8, f32) += A(16x32, 8-bit float, row) * B(32x8, 8-bit float, col). sm_89+.
template <class TA, class TB>
DGJIT_DEVICE void mma_16832_fp8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  static_assert(sizeof(TA) == 0, "mma.sync with FP8 operands needs sm_89 or newer");
#endif
  constexpr bool kAE4 = is_same<TA, float_e4m3_t>::value;
  constexpr bool kBE4 = is_same<TB, float_e4m3_t>::value;
  static_assert(kAE4 || is_same<TA, float_e5m2_t>::value, "FP8 A");
  static_assert(kBE4 || is_same<TB, float_e5m2_t>::value, "FP8 B");
#define DGJIT_MMA_FP8(AT, BT)                                                                       \
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." AT "." BT ".f32 "                           \
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                            \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                     \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
  if constexpr (kAE4 && kBE4) {
    DGJIT_MMA_FP8("e4m3", "e4m3");
  } else if constexpr (kAE4) {
    DGJIT_MMA_FP8("e4m3", "e5m2");
  } else if constexpr (kBE4) {
    DGJIT_MMA_FP8("e5m2", "e4m3");
  } else {
    DGJIT_MMA_FP8("e5m2", "e5m2");
  }
#undef DGJIT_MMA_FP8
}

// One MMA of the swap-AB product: weights TW (A side, 16 rows), activations TX (B side, 8 tokens).
template <class TW, class TX>
DGJIT_DEVICE void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  static_assert(sizeof(TW) == sizeof(TX), "both operands have the same element size");
  if constexpr (sizeof(TW) == 2) {
    static_assert(is_same<TW, TX>::value, "16-bit operands of one type");
    mma_16816<TW>(d, a, b);
  } else {
    mma_16832_fp8<TW, TX>(d, a, b);
  }
}

// -- loads --------------------------------------------------------------------------------------------

// The bytes [offset, offset + 16) of a row whose first `row_bytes` bytes exist, zeros past the end (the
// step that holds the end of K only; byte by byte for the chunk that straddles it: padded rows only).
DGJIT_DEVICE void load_chunk_tail(uint32_t (&r)[4], const uint8_t* row, int64_t offset, int64_t row_bytes) {
#pragma unroll
  for (int i = 0; i < 4; ++i) r[i] = 0u;
  if (offset + kChunkBytes <= row_bytes) {
    ld_cached_v4(r, row + offset);
  } else if (offset < row_bytes) {
#pragma unroll
    for (int b = 0; b < kChunkBytes; ++b) {  // unrolled: register indices stay static (no local memory)
      if (offset + b < row_bytes) r[b / 4] |= uint32_t(__ldg(row + offset + b)) << (8 * (b % 4));
    }
  }
}

// What a lane holds for one step: its 4 chunks of weight rows g and g+8, of tokens g (and g+8), and for
// FP8 block scaling the scales of the step's two K groups.
template <int kTokenTiles, bool kBlockScaled>
struct Stage {
  uint32_t w[kChunksPerStep][2][4];               // [chunk][row g, row g+8][reg]
  uint32_t x[kChunksPerStep][kTokenTiles][4];     // [chunk][token tile][reg]
  float sa[kBlockScaled ? 2 : 1][kTokenTiles][2];  // [group][tile][token 2t, 2t+1]
  float sb[kBlockScaled ? 2 : 1];
};

struct Problem {
  const uint8_t* w;     // B (N, K), row pitch ldw_bytes
  int64_t ldw_bytes;
  const uint8_t* x;     // A (M, K), row pitch ldx_bytes
  int64_t ldx_bytes;
  const float* sa;      // scales of A and B (element strides), see deepgemm_jit.gemv
  const float* sb;
  int64_t sa_si, sa_sj, sb_si, sb_sj;
  uint32_t m, n, k;
};

// The rows a lane reads, already offset by its chunk column (lane_t * 16 bytes).
template <int kTokenTiles>
struct LaneRows {
  const uint8_t* w[2];
  const uint8_t* x[kTokenTiles];
  int tokens[kTokenTiles][2];  // the (clamped) tokens of the lane's accumulator columns, for scales
  int64_t sb_row;              // offset of the row block's 128-row scale block in sb
};

// Step `step` into `st`. kTail: the step that holds the end of K (bounds checked, zeros past K); every other
// step is read without a single comparison.
template <bool kTail, int kTokenTiles, bool kBlockScaled>
DGJIT_DEVICE void load_stage(Stage<kTokenTiles, kBlockScaled>& st, const Problem& p, const LaneRows<kTokenTiles>& r,
                             int64_t k_bytes, int step, int lane_t) {
  const int64_t base = int64_t(step) * kStepBytes;
#pragma unroll
  for (int c = 0; c < kChunksPerStep; ++c) {
    const int64_t offset = base + c * 4 * kChunkBytes;
    if constexpr (kTail) {
      const int64_t limit = k_bytes - lane_t * kChunkBytes;  // r.* already point at the lane's column
#pragma unroll
      for (int h = 0; h < 2; ++h) load_chunk_tail(st.w[c][h], r.w[h], offset, limit);
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) load_chunk_tail(st.x[c][j], r.x[j], offset, limit);
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) ld_stream_v4(st.w[c][h], r.w[h] + offset);
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) ld_cached_v4(st.x[c][j], r.x[j] + offset);
    }
  }
  if constexpr (kBlockScaled) {
    // A step is 256 FP8 values: K groups 2*step and 2*step+1 (clamped: a group past K multiplies zeros).
    const int num_groups = int(ceil_div(p.k, uint32_t(kScaleGroup)));
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      const int64_t group = min(2 * step + g, num_groups - 1);
      st.sb[g] = __ldg(p.sb + r.sb_row + group * p.sb_sj);
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
#pragma unroll
        for (int i = 0; i < 2; ++i) st.sa[g][j][i] = __ldg(p.sa + r.tokens[j][i] * p.sa_si + group * p.sa_sj);
      }
    }
  }
}

// acc += the step's products. FP8: each 128-value K group is summed in its own registers first and then
// added in FP32 (times its block scales): the same promotion as the WGMMA kernels.
template <class TW, class TX, int kTokenTiles, bool kBlockScaled>
DGJIT_DEVICE void compute_stage(const Stage<kTokenTiles, kBlockScaled>& st, float (&acc)[kTokenTiles][4]) {
  constexpr bool kFp8 = sizeof(TW) == 1;
  if constexpr (!kFp8) {
#pragma unroll
    for (int c = 0; c < kChunksPerStep; ++c) {
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const uint32_t a[4] = {st.w[c][0][2 * s], st.w[c][1][2 * s], st.w[c][0][2 * s + 1],
                               st.w[c][1][2 * s + 1]};
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) {
          const uint32_t b[2] = {st.x[c][j][2 * s], st.x[c][j][2 * s + 1]};
          mma<TW, TX>(acc[j], a, b);
        }
      }
    }
  } else {
    constexpr int kChunksPerGroup = kScaleGroup / (4 * kChunkBytes);  // 2: chunks c of one group
#pragma unroll
    for (int g = 0; g < kChunksPerStep / kChunksPerGroup; ++g) {
      float part[kTokenTiles][4] = {};
#pragma unroll
      for (int c = g * kChunksPerGroup; c < (g + 1) * kChunksPerGroup; ++c) {
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const uint32_t a[4] = {st.w[c][0][2 * s], st.w[c][1][2 * s], st.w[c][0][2 * s + 1],
                                 st.w[c][1][2 * s + 1]};
#pragma unroll
          for (int j = 0; j < kTokenTiles; ++j) {
            const uint32_t b[2] = {st.x[c][j][2 * s], st.x[c][j][2 * s + 1]};
            mma<TW, TX>(part[j], a, b);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if constexpr (kBlockScaled) {
            acc[j][i] += part[j][i] * (st.sa[g][j][i % 2] * st.sb[g]);
          } else {
            acc[j][i] += part[j][i];
          }
        }
      }
    }
  }
}

// The kernel body. grid.x = ceil(row_blocks / (kNumWarps / warps_k)); warps_k in {1, 2, 4, 8}.
template <class TW, class TX, class TOut, Scaling kScaling, int kTokenTiles>
DGJIT_DEVICE void run(const Problem& p, TOut* __restrict__ d, int64_t ldd, uint32_t warps_k) {
  static_assert(kTokenTiles == 1 || kTokenTiles == 2, "up to 16 tokens");
  constexpr bool kBlockScaled = kScaling == Scaling::kBlock;
  __shared__ float partials[kNumWarps][kTokenTiles * 4][32];

  const int lane = int(threadIdx.x % 32);
  const int warp = int(threadIdx.x / 32);
  const int lane_g = lane / 4;   // MMA group: weight rows g, g + 8; token g of each tile
  const int lane_t = lane % 4;   // thread in group: chunk column; output tokens 2t, 2t + 1
  const uint32_t blocks_per_cta = uint32_t(kNumWarps) / warps_k;
  const uint32_t row_block = blockIdx.x * blocks_per_cta + uint32_t(warp) / warps_k;
  const int kw = warp % int(warps_k);
  const uint32_t num_row_blocks = ceil_div(p.n, uint32_t(kBlockRows));
  const bool has_rows = row_block < num_row_blocks;

  const int64_t k_bytes = int64_t(p.k) * int64_t(sizeof(TW));
  const int num_steps = int(ceil_div(k_bytes, int64_t(kStepBytes)));
  const int steps_per_warp = (num_steps + int(warps_k) - 1) / int(warps_k);
  const int step_begin = kw * steps_per_warp;
  // [step_begin, step_end): this warp's steps (empty for warps past the last row block or past K).
  const int step_end = has_rows ? max(step_begin, min(num_steps, step_begin + steps_per_warp)) : step_begin;

  // Rows past N and tokens past M read a valid row: their results land in MMA rows/columns never stored.
  LaneRows<kTokenTiles> rows;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t row = min(row_block * kBlockRows + lane_g + 8 * h, p.n - 1);
    rows.w[h] = p.w + int64_t(row) * p.ldw_bytes + lane_t * kChunkBytes;
  }
#pragma unroll
  for (int j = 0; j < kTokenTiles; ++j) {
    rows.x[j] = p.x + int64_t(min(uint32_t(8 * j + lane_g), p.m - 1)) * p.ldx_bytes + lane_t * kChunkBytes;
#pragma unroll
    for (int i = 0; i < 2; ++i) rows.tokens[j][i] = int(min(uint32_t(8 * j + 2 * lane_t + i), p.m - 1));
  }
  rows.sb_row = int64_t(row_block * kBlockRows / kScaleGroup) * p.sb_si;

  float acc[kTokenTiles][4] = {};
  // Full steps: two stages in registers, one loading while the other is multiplied.
  const int full_end = max(step_begin, min(step_end, int(k_bytes / kStepBytes)));
  Stage<kTokenTiles, kBlockScaled> st0, st1;
  if (step_begin < full_end) load_stage<false>(st0, p, rows, k_bytes, step_begin, lane_t);
  for (int step = step_begin; step < full_end; step += 2) {
    if (step + 1 < full_end) load_stage<false>(st1, p, rows, k_bytes, step + 1, lane_t);
    compute_stage<TW, TX>(st0, acc);
    if (step + 1 < full_end) {
      if (step + 2 < full_end) load_stage<false>(st0, p, rows, k_bytes, step + 2, lane_t);
      compute_stage<TW, TX>(st1, acc);
    }
  }
  // The step that holds the end of K (K * element size not a multiple of 256): its warp reads it last.
  if (full_end < step_end) {
    load_stage<true>(st0, p, rows, k_bytes, full_end, lane_t);
    compute_stage<TW, TX>(st0, acc);
  }

  // Reduce the warps_k partial sums of a row block in a fixed order (deterministic).
  if (warps_k > 1) {
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) partials[warp][j * 4 + i][lane] = acc[j][i];
    }
    __syncthreads();
    if (kw != 0) return;
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float sum = partials[warp][j * 4 + i][lane];
        for (int w = 1; w < int(warps_k); ++w) sum += partials[warp + w][j * 4 + i][lane];
        acc[j][i] = sum;
      }
    }
  }
  if (!has_rows) return;

  // Store D[token][row]: accumulator element i of tile j is row g (+8 for i >= 2), token 8j + 2t + i % 2.
#pragma unroll
  for (int j = 0; j < kTokenTiles; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t row = row_block * kBlockRows + lane_g + (i >= 2 ? 8 : 0);
      const uint32_t token = uint32_t(8 * j + 2 * lane_t + i % 2);
      if (row >= p.n || token >= p.m) continue;
      float v = acc[j][i];
      if constexpr (kScaling == Scaling::kTensor) {
        v *= __ldg(p.sa) * __ldg(p.sb);
      } else if constexpr (kScaling == Scaling::kRow) {
        v *= __ldg(p.sa + int64_t(token) * p.sa_si) * __ldg(p.sb + int64_t(row) * p.sb_si);
      }
      store_converted(d + int64_t(token) * ldd + row, v);
    }
  }
}

}  // namespace gemv
}  // namespace dgjit
