// The portable tensor-core GEMM (family `sm80`): runs on sm_80 and newer, and on
// Hopper it is the fallback for problems that TMA cannot describe (row strides
// that are not a multiple of 16 bytes, misaligned pointers).
//
// D (M x N) = A (M x K) * B (K x N), FP32 accumulation, where A and B each are
// either K-major (K contiguous) or MN-major (M or N contiguous). M is a run-time
// argument; N and K are compile-time constants of the spec.
//
// Protocol: a kStages-deep ring of shared-memory tiles filled by cp.async with
// zero fill (tails in M, N and K read as zeros, so the math needs no tail path),
// consumed by warp-level mma.sync; the epilogue writes FP32 accumulators,
// converted, straight to global memory with bounds checks.
#pragma once
#include "dgjit/common.cuh"
#include "dgjit/ptx_sm80.cuh"

namespace dgjit {

// Copies a kRows x kCols tile of a row-major global matrix (leading dimension
// `ld` elements) into shared memory with row pitch kLd, starting at global
// (row0, col0). Elements at rows >= row_end or cols >= col_end become zero.
// kVec elements are moved together; below 4 bytes a chunk cannot go through
// cp.async, so it is a plain synchronous copy (only for odd 16-bit strides).
template <class T, int kRows, int kCols, int kLd, int kVec, int kThreads>
DGJIT_DEVICE void load_tile(T* smem, const T* gmem, int64_t ld, int row0, int col0,
                            int row_end, int col_end, int tid) {
  static_assert(kCols % kVec == 0, "a tile row is a whole number of chunks");
  static_assert(kLd % kVec == 0, "chunks stay aligned in shared memory");
  constexpr int kChunksPerRow = kCols / kVec;
  constexpr int kChunks = kRows * kChunksPerRow;
  constexpr int kChunkBytes = kVec * int(sizeof(T));
  constexpr int kIters = ceil_div_c(kChunks, kThreads);
  // Narrow (misaligned) loads take many iterations: unrolling all of them would
  // keep every address live across the main loop and spill, so unroll a few.
  constexpr int kUnroll = kIters <= 4 ? kIters : 2;
#pragma unroll kUnroll
  for (int it = 0; it < kIters; ++it) {
    const int i = it * kThreads + tid;
    if (kChunks % kThreads != 0 && i >= kChunks) break;
    const int r = i / kChunksPerRow;
    const int c = (i % kChunksPerRow) * kVec;
    const int grow = row0 + r;
    const int gcol = col0 + c;
    T* dst = smem + r * kLd + c;
    if constexpr (kChunkBytes >= 4) {
      int valid = 0;
      if (grow < row_end && gcol < col_end) valid = min(kVec, col_end - gcol);
      const T* src = valid > 0 ? gmem + grow * ld + gcol : gmem;
      cp_async_zfill<kChunkBytes>(dst, src, valid * int(sizeof(T)));
    } else {
      T v;
      *reinterpret_cast<uint16_t*>(&v) = 0;
      if (grow < row_end && gcol < col_end) v = gmem[grow * ld + gcol];
      *dst = v;
    }
  }
}

template <class TA, class TD, int kBlockM, int kBlockN, int kBlockK, int kStages,
          int kWarpsM, int kWarpsN, bool kAKMajor, bool kBKMajor, int kVecA, int kVecB,
          int kN, int kK, bool kPromote = false, bool kHiLo = false>
struct GemmSm80 {
  using TB = TA;
  static constexpr bool kIsTF32 = sizeof(TA) == 4;
  // kPromote (TF32, for 3xTF32): each block-K tile's products are summed by the tensor cores into zeroed registers
  // and then added into the FP32 accumulators on the CUDA cores; mma's own accumulation truncates, which capped
  // 3xTF32's accuracy (error linear in K).
  static_assert(!kPromote || kIsTF32, "promotion is for TF32 (3xTF32)");
  static constexpr int kMmaK = kIsTF32 ? 8 : 16;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWarpTileM = kBlockM / kWarpsM;
  static constexpr int kWarpTileN = kBlockN / kWarpsN;
  static constexpr int kFragsM = kWarpTileM / 16;
  static constexpr int kFragsN = kWarpTileN / 8;
  static_assert(kWarpTileM % 16 == 0 && kWarpTileN % 8 == 0, "warp tile is whole mma tiles");
  static_assert(kBlockK % kMmaK == 0, "block K is whole mma steps");

  // Shared-memory layout: tiles keep the global orientation; rows are padded by
  // 16 bytes so that fragment reads of consecutive rows hit different banks.
  static constexpr int kPad = 16 / int(sizeof(TA));
  static constexpr int kARows = kAKMajor ? kBlockM : kBlockK;
  static constexpr int kACols = kAKMajor ? kBlockK : kBlockM;
  static constexpr int kALd = kACols + kPad;
  static constexpr int kBRows = kBKMajor ? kBlockN : kBlockK;
  static constexpr int kBCols = kBKMajor ? kBlockK : kBlockN;
  static constexpr int kBLd = kBCols + kPad;
  static constexpr int kAStageElems = kARows * kALd;
  static constexpr int kBStageElems = kBRows * kBLd;
  static constexpr int kSmemBytes = kStages * (kAStageElems + kBStageElems) * int(sizeof(TA));
  static constexpr int kNumKTiles = ceil_div_c(kK, kBlockK);

  // Element (m, k) of the A stage / (n, k) of the B stage, whatever the orientation.
  static DGJIT_DEVICE const TA* a_at(const TA* s, int m, int k) {
    return kAKMajor ? s + m * kALd + k : s + k * kALd + m;
  }
  static DGJIT_DEVICE const TB* b_at(const TB* s, int n, int k) {
    return kBKMajor ? s + n * kBLd + k : s + k * kBLd + n;
  }
  // Two 16-bit values at (x, k) and (x, k + 1), packed as the mma fragments want.
  template <bool kKMajor, class T>
  static DGJIT_DEVICE uint32_t pair_k(const T* p, int ld) {
    if constexpr (kKMajor) {
      return *reinterpret_cast<const uint32_t*>(p);
    } else {
      const uint32_t lo = *reinterpret_cast<const uint16_t*>(p);
      const uint32_t hi = *reinterpret_cast<const uint16_t*>(p + ld);
      return lo | (hi << 16);
    }
  }
  static DGJIT_DEVICE uint32_t word(const TA* p) {
    return to_tf32(*reinterpret_cast<const float*>(p));
  }

  // kHiLo (3xTF32's inner GEMM): A and B hold [hi | lo], kOperandK = 2 kK / 3 columns, read in the order of
  // common.cuh's hi_lo_stored_block.
  static constexpr int kOperandK = kHiLo ? 2 * kK / 3 : kK;
  static_assert(!kHiLo || (kIsTF32 && kPromote && kAKMajor && kBKMajor && kK % (3 * kBlockK) == 0),
                "hi_lo operands: promoted TF32, layout nt, K three segments of whole K tiles");
  template <bool kIsA>
  static DGJIT_DEVICE constexpr int hi_lo_column(int kt) {
    if constexpr (!kHiLo) {
      return kt * kBlockK;
    } else {
      return static_cast<int>(hi_lo_stored_block(kt, kK / (3 * kBlockK), kIsA)) * kBlockK;
    }
  }

  // K tile kt of A and B into a stage.
  static DGJIT_DEVICE void load_stage(TA* sa, TB* sb, const TA* a, const TB* b, int m,
                                      int64_t lda, int64_t ldb, int m0, int n0, int kt, int tid) {
    const int ka = hi_lo_column<true>(kt), kb = hi_lo_column<false>(kt);
    if constexpr (kAKMajor) {
      load_tile<TA, kBlockM, kBlockK, kALd, kVecA, kThreads>(sa, a, lda, m0, ka, m, kOperandK, tid);
    } else {
      load_tile<TA, kBlockK, kBlockM, kALd, kVecA, kThreads>(sa, a, lda, ka, m0, kOperandK, m, tid);
    }
    if constexpr (kBKMajor) {
      load_tile<TB, kBlockN, kBlockK, kBLd, kVecB, kThreads>(sb, b, ldb, n0, kb, kN, kOperandK, tid);
    } else {
      load_tile<TB, kBlockK, kBlockN, kBLd, kVecB, kThreads>(sb, b, ldb, kb, n0, kOperandK, kN, tid);
    }
  }

  // One block-K step of the warp tile: fragments from shared memory, then mma.
  static DGJIT_DEVICE void compute_stage(float (&acc)[kFragsM][kFragsN][4], const TA* sa,
                                         const TB* sb, int warp_m0, int warp_n0, int lane) {
    const int g = lane / 4;  // group of the mma fragment layout
    const int t = lane % 4;  // thread within the group
#pragma unroll
    for (int kk = 0; kk < kBlockK; kk += kMmaK) {
      uint32_t fa[kFragsM][4];
      uint32_t fb[kFragsN][2];
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) {
        const int r = warp_m0 + i * 16 + g;
        if constexpr (kIsTF32) {
          fa[i][0] = word(a_at(sa, r, kk + t));
          fa[i][1] = word(a_at(sa, r + 8, kk + t));
          fa[i][2] = word(a_at(sa, r, kk + t + 4));
          fa[i][3] = word(a_at(sa, r + 8, kk + t + 4));
        } else {
          fa[i][0] = pair_k<kAKMajor>(a_at(sa, r, kk + 2 * t), kALd);
          fa[i][1] = pair_k<kAKMajor>(a_at(sa, r + 8, kk + 2 * t), kALd);
          fa[i][2] = pair_k<kAKMajor>(a_at(sa, r, kk + 2 * t + 8), kALd);
          fa[i][3] = pair_k<kAKMajor>(a_at(sa, r + 8, kk + 2 * t + 8), kALd);
        }
      }
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) {
        const int c = warp_n0 + j * 8 + g;
        if constexpr (kIsTF32) {
          fb[j][0] = word(b_at(sb, c, kk + t));
          fb[j][1] = word(b_at(sb, c, kk + t + 4));
        } else {
          fb[j][0] = pair_k<kBKMajor>(b_at(sb, c, kk + 2 * t), kBLd);
          fb[j][1] = pair_k<kBKMajor>(b_at(sb, c, kk + 2 * t + 8), kBLd);
        }
      }
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) {
          if constexpr (kIsTF32) {
            mma_1688_tf32(acc[i][j], fa[i], fb[j]);
          } else {
            mma_16816<TA>(acc[i][j], fa[i], fb[j]);
          }
        }
      }
    }
  }

  static DGJIT_DEVICE void run(const TA* __restrict__ a, const TB* __restrict__ b,
                               TD* __restrict__ d, int m, int64_t lda, int64_t ldb, int64_t ldd) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    TA* smem_a = reinterpret_cast<TA*>(smem_raw);
    TB* smem_b = smem_a + kStages * kAStageElems;

    const int tid = threadIdx.x;
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int warp_m0 = (warp / kWarpsN) * kWarpTileM;
    const int warp_n0 = (warp % kWarpsN) * kWarpTileN;
    // M tiles on grid x (up to 2^31 - 1 blocks), N tiles on grid y.
    const int m0 = blockIdx.x * kBlockM;
    const int n0 = blockIdx.y * kBlockN;

    float acc[kFragsM][kFragsN][4];
#pragma unroll
    for (int i = 0; i < kFragsM; ++i)
#pragma unroll
      for (int j = 0; j < kFragsN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    // Prologue: the first kStages - 1 tiles in flight (one commit group each,
    // empty groups past the end keep the wait arithmetic uniform).
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < kNumKTiles) {
        load_stage(smem_a + s * kAStageElems, smem_b + s * kBStageElems, a, b, m, lda, ldb, m0,
                   n0, s, tid);
      }
      cp_async_commit();
    }

    for (int kt = 0; kt < kNumKTiles; ++kt) {
      cp_async_wait<kStages - 2>();
      // Tile kt has landed for everyone, and everyone is done with tile kt - 1,
      // whose stage the load below refills.
      __syncthreads();
      const int stage = kt % kStages;
      if constexpr (kPromote) {
        float part[kFragsM][kFragsN][4];
#pragma unroll
        for (int i = 0; i < kFragsM; ++i)
#pragma unroll
          for (int j = 0; j < kFragsN; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) part[i][j][e] = 0.0f;
        compute_stage(part, smem_a + stage * kAStageElems, smem_b + stage * kBStageElems, warp_m0, warp_n0, lane);
#pragma unroll
        for (int i = 0; i < kFragsM; ++i)
#pragma unroll
          for (int j = 0; j < kFragsN; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] += part[i][j][e];
      } else {
        compute_stage(acc, smem_a + stage * kAStageElems, smem_b + stage * kBStageElems, warp_m0,
                      warp_n0, lane);
      }
      const int next = kt + kStages - 1;
      if (next < kNumKTiles) {
        const int ns = next % kStages;
        load_stage(smem_a + ns * kAStageElems, smem_b + ns * kBStageElems, a, b, m, lda, ldb, m0,
                   n0, next, tid);
      }
      cp_async_commit();
    }
    cp_async_wait<0>();

    // Epilogue: accumulator (i, j, e) sits at row g (+8 for e >= 2), column
    // 2t (+1 for odd e) of its 16x8 fragment.
    const int g = lane / 4;
    const int t = lane % 4;
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = m0 + warp_m0 + i * 16 + g + (e >= 2 ? 8 : 0);
          const int col = n0 + warp_n0 + j * 8 + 2 * t + (e & 1);
          if (row < m && col < kN) store_converted(d + row * ldd + col, acc[i][j][e]);
        }
      }
    }
  }
};

}  // namespace dgjit
