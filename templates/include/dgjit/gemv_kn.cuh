// Weight streaming for decode with the weight stored (K, N) (layouts nn / tn): D (M x N) = A (M x K) * B (K x N),
// M <= 8 tokens, bound by reading B once. The host side is deepgemm_jit/gemv_kn.py (dispatch rule, grid, launch).
//
// The weight's rows are K rows here, so the K-major trick of gemv.cuh (a 16-byte chunk of one row is a run of K)
// does not apply: a 16-byte chunk holds consecutive columns. mma.sync in swap-AB form still takes them without
// shared memory: the MMA's M side is 16 weight columns, its N side the 8 tokens, and a lane builds its A fragment
// from the chunks of the K rows the fragment names.
//   16-bit, m16n8k16: lane (g, t) = (lane / 4, lane % 4) reads, in each step of 16 K rows, rows 2t, 2t+1, 2t+8 and
//   2t+9, columns 8g..8g+7 of every chunk column (8 quads: 128 contiguous bytes of a row). Word w of the row-2t chunk
//   holds columns 8g+2w (low half) and 8g+2w+1 (high half); one PRMT per fragment register pairs rows 2t and 2t+1 of
//   one column, so MMA w takes column 8g+2w as its row g and 8g+2w+1 as its row g+8 (a0 / a2: the low halves of
//   rows (2t, 2t+1) / (2t+8, 2t+9); a1 / a3: the high halves).
//   TF32, m16n8k8: steps of 8 K rows; lane (g, t) reads rows t and t+4, columns 4g..4g+3; MMA j takes columns 4g+2j
//   (row g) and 4g+2j+1 (row g+8): a0 / a1 from row t, a2 / a3 from row t+4. Operands rounded to TF32 (cvt.rna).
// The activations are the MMA's B fragment: token g's elements at the same K rows (b0: 2t, 2t+1 / t; b1: 2t+8,
// 2t+9 / t+4), read with scalar loads through any (M, K) strides (nn: A (M, K); tn: A stored (K, M)).
//
// Work decomposition: a CTA owns kBlockCols columns (two chunk columns: 256 bytes of each weight row); its 8 warps
// and the CTAs of its cluster (grid.y, the cluster's size) split K into contiguous ranges of whole steps. Each warp
// loads kUnroll steps (8 KB) before it multiplies them. Partial sums are reduced in a fixed order, first the warps
// through shared memory, then the cluster's CTAs through distributed shared memory into rank 0, which stores D:
// the same bits on every run, no atomics, no workspace (graph-capturable).
//
// Tails: weight rows past K and columns past N read a valid address and are zeroed; tokens past M read zeros and
// are never stored. The host guarantees 16-byte aligned weight rows and N a multiple of a chunk's columns.
#pragma once
#include "dgjit/common.cuh"
#include "dgjit/ptx_sm80.cuh"

namespace dgjit {
namespace gemv_kn {

constexpr int kNumWarps = 8;
constexpr int kNumThreads = kNumWarps * 32;
constexpr int kChunkCols = 2;   // 16-byte chunks per lane of each weight row it reads
constexpr int kMaxTokens = 8;   // the MMA's N side

template <class T> struct Shape;
// kUnroll steps per batch: 8 KB of weights per warp, all loaded before any is multiplied. (Two batches of half that,
// the next one's loads issued before this one's MMAs, ran 1.3-1.7x slower: docs/experiments/gemv-kn-pipelined-loads.)
template <> struct Shape<bfloat16_t> {
  static constexpr int kStepK = 16, kRowsPerLane = 4, kChunkElems = 8, kUnroll = 2;
};
template <> struct Shape<half_t> {
  static constexpr int kStepK = 16, kRowsPerLane = 4, kChunkElems = 8, kUnroll = 2;
};
template <> struct Shape<float32_t> {
  static constexpr int kStepK = 8, kRowsPerLane = 2, kChunkElems = 4, kUnroll = 4;
};
template <class T> constexpr int block_cols() { return kChunkCols * 8 * Shape<T>::kChunkElems; }

// 16 bytes of the weight: dgjit::ld_stream_v4 (ptx_sm80.cuh; a CTA reads 256 contiguous bytes of each row).

DGJIT_DEVICE uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

// Row offset (within a step) of the q-th weight row lane t reads.
template <class T> DGJIT_DEVICE uint32_t lane_row(uint32_t t, int q) {
  if constexpr (sizeof(T) == 2) return 2 * t + (q & 1) + 8 * (q >> 1);
  else return t + 4 * q;
}

// Token `token`'s activation at K row `row` as the MMA's operand bits (0 past M or `k`: K, or the end of the warp's
// steps).
template <class T>
DGJIT_DEVICE uint32_t activation(const T* x, long long x_sm, long long x_sk, uint32_t token, uint32_t row,
                                 uint32_t m, uint32_t k) {
  if (token >= m || row >= k) return 0;
  if constexpr (sizeof(T) == 2) {
    return __ldg(reinterpret_cast<const unsigned short*>(x + token * x_sm + row * x_sk));
  } else {
    return to_tf32(__ldg(x + token * x_sm + row * x_sk));
  }
}

// ---- distributed shared memory (sm_90 clusters; cluster_rank and cluster_sync are common.cuh's) ----------------
DGJIT_DEVICE float ld_cluster_f32(const float* local, uint32_t rank) {
  float v = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(local)), remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
#endif
  return v;
}

// One batch of kUnroll steps of a lane's weight chunks: loaded (zeros where `ok` is false: past the warp's steps,
// past K or past N), then multiplied.
template <class T> struct Batch {
  using S = Shape<T>;
  uint32_t wr[S::kUnroll][S::kRowsPerLane][kChunkCols][4];
  bool ok[S::kUnroll][S::kRowsPerLane][kChunkCols];
};

template <class T>
DGJIT_DEVICE void load_batch(Batch<T>& bt, const uint8_t* __restrict__ w, long long ldw_bytes, uint32_t s,
                             uint32_t s_end, uint32_t col0, uint32_t g, uint32_t t, uint32_t n, uint32_t k) {
  using S = Shape<T>;
#pragma unroll
  for (int u = 0; u < S::kUnroll; ++u)
#pragma unroll
    for (int q = 0; q < S::kRowsPerLane; ++q)
#pragma unroll
      for (int c = 0; c < kChunkCols; ++c) {
        const uint32_t row = (s + u) * S::kStepK + lane_row<T>(t, q);
        const uint32_t col = col0 + c * 8 * S::kChunkElems + g * S::kChunkElems;
        bt.ok[u][q][c] = s + u < s_end && row < k && col < n;
        const uint8_t* p = bt.ok[u][q][c] ? w + row * ldw_bytes + col * sizeof(T) : w;
        ld_stream_v4(bt.wr[u][q][c], p);
      }
}

template <class T>
DGJIT_DEVICE void mma_batch(float (&acc)[kChunkCols][Shape<T>::kChunkElems / 2][4], const Batch<T>& bt,
                            const T* __restrict__ x, long long x_sm, long long x_sk, uint32_t s, uint32_t g,
                            uint32_t t, uint32_t m, uint32_t k) {
  using S = Shape<T>;
  constexpr int kMmas = S::kChunkElems / 2;
#pragma unroll
  for (int u = 0; u < S::kUnroll; ++u) {
    const uint32_t base = (s + u) * S::kStepK;
    uint32_t b[2];
    if constexpr (sizeof(T) == 2) {
      b[0] = activation(x, x_sm, x_sk, g, base + 2 * t, m, k) |
             (activation(x, x_sm, x_sk, g, base + 2 * t + 1, m, k) << 16);
      b[1] = activation(x, x_sm, x_sk, g, base + 2 * t + 8, m, k) |
             (activation(x, x_sm, x_sk, g, base + 2 * t + 9, m, k) << 16);
    } else {
      b[0] = activation(x, x_sm, x_sk, g, base + t, m, k);
      b[1] = activation(x, x_sm, x_sk, g, base + t + 4, m, k);
    }
#pragma unroll
    for (int c = 0; c < kChunkCols; ++c) {
      uint32_t r[S::kRowsPerLane][4];
#pragma unroll
      for (int q = 0; q < S::kRowsPerLane; ++q)
#pragma unroll
        for (int i = 0; i < 4; ++i) r[q][i] = bt.ok[u][q][c] ? bt.wr[u][q][c][i] : 0u;
#pragma unroll
      for (int j = 0; j < kMmas; ++j) {
        uint32_t a[4];
        if constexpr (sizeof(T) == 2) {
          a[0] = prmt(r[0][j], r[1][j], 0x5410);  // column 2j, rows 2t, 2t+1
          a[1] = prmt(r[0][j], r[1][j], 0x7632);  // column 2j+1
          a[2] = prmt(r[2][j], r[3][j], 0x5410);  // column 2j, rows 2t+8, 2t+9
          a[3] = prmt(r[2][j], r[3][j], 0x7632);
          mma_16816<T>(acc[c][j], a, b);
        } else {
          a[0] = to_tf32(__uint_as_float(r[0][2 * j]));
          a[1] = to_tf32(__uint_as_float(r[0][2 * j + 1]));
          a[2] = to_tf32(__uint_as_float(r[1][2 * j]));
          a[3] = to_tf32(__uint_as_float(r[1][2 * j + 1]));
          mma_1688_tf32(acc[c][j], a, b);
        }
      }
    }
  }
}

template <class T, class TOut, int kCluster>
DGJIT_DEVICE void run(const uint8_t* __restrict__ w, long long ldw_bytes, const T* __restrict__ x, long long x_sm,
                      long long x_sk, TOut* __restrict__ d, long long ldd, uint32_t m, uint32_t n, uint32_t k) {
  using S = Shape<T>;
  constexpr int kBlockCols = block_cols<T>();
  constexpr int kMmas = S::kChunkElems / 2;  // per chunk column: two weight columns each
  __shared__ float red[kNumWarps][kBlockCols * kMaxTokens];

  const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t g = lane / 4, t = lane % 4;
  const uint32_t col0 = blockIdx.x * kBlockCols;
  const uint32_t steps = ceil_div<uint32_t>(k, S::kStepK);
  const uint32_t parts = kCluster * kNumWarps, part = cluster_rank() * kNumWarps + warp;
  // 64-bit products: steps * parts passes 2^32 for K of ~5e8 and more (the host keeps such K on the tiles too).
  const uint32_t s_begin = static_cast<uint32_t>(static_cast<uint64_t>(steps) * part / parts);
  const uint32_t s_end = static_cast<uint32_t>(static_cast<uint64_t>(steps) * (part + 1) / parts);
  // The last batch's steps past s_end have zeroed weights; their activations (the next warp's K rows) must be
  // zeroed too, or an infinite activation there makes 0 * inf = NaN in every column of its token.
  const uint32_t k_end = min(k, s_end * S::kStepK);

  float acc[kChunkCols][kMmas][4];
#pragma unroll
  for (int c = 0; c < kChunkCols; ++c)
#pragma unroll
    for (int j = 0; j < kMmas; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[c][j][e] = 0.f;

#pragma unroll 1
  for (uint32_t s = s_begin; s < s_end; s += S::kUnroll) {
    Batch<T> bt;
    load_batch(bt, w, ldw_bytes, s, s_end, col0, g, t, n, k);
    mma_batch(acc, bt, x, x_sm, x_sk, s, g, t, m, k_end);
  }

  // Warps, in order: red[w][col * 8 + token].
#pragma unroll
  for (int c = 0; c < kChunkCols; ++c)
#pragma unroll
    for (int j = 0; j < kMmas; ++j) {
      const uint32_t col = c * 8 * S::kChunkElems + g * S::kChunkElems + 2 * j;
      red[warp][col * kMaxTokens + 2 * t] = acc[c][j][0];
      red[warp][col * kMaxTokens + 2 * t + 1] = acc[c][j][1];
      red[warp][(col + 1) * kMaxTokens + 2 * t] = acc[c][j][2];
      red[warp][(col + 1) * kMaxTokens + 2 * t + 1] = acc[c][j][3];
    }
  __syncthreads();
  constexpr int kEntries = kBlockCols * kMaxTokens;
  static_assert(kEntries % kNumThreads == 0, "whole entries per thread");
#pragma unroll
  for (int e = threadIdx.x; e < kEntries; e += kNumThreads) {
    float v = red[0][e];
#pragma unroll
    for (int w2 = 1; w2 < kNumWarps; ++w2) v += red[w2][e];
    red[0][e] = v;
  }
  // The cluster's CTAs, in rank order, into rank 0, which stores.
  if constexpr (kCluster > 1) cluster_sync();
  if (cluster_rank() == 0) {
#pragma unroll
    for (int e = threadIdx.x; e < kEntries; e += kNumThreads) {
      float v = red[0][e];
#pragma unroll
      for (int r = 1; r < kCluster; ++r) v += ld_cluster_f32(&red[0][e], r);
      const uint32_t col = col0 + e / kMaxTokens, token = e % kMaxTokens;
      if (col < n && token < m) store_converted(d + token * ldd + col, v);
    }
  }
  if constexpr (kCluster > 1) cluster_sync();  // rank 0 has read every CTA's shared memory
}

}  // namespace gemv_kn
}  // namespace dgjit
