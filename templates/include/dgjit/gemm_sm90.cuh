// Hopper (sm_90a) GEMM: persistent, warp-specialised, TMA + WGMMA.
//
//   D (M x N, row-major) = A (M x K, row-major) * B (N x K, row-major)^T       ("nt", both K-major)
//
// 16-bit operands may also be MN-major (kAKMajor / kBKMajor false): A stored (K, M) and/or B stored (K, N), M / N
// contiguous (layouts "tn", "nn", "tt"). Shared-memory layout of one stage of an operand (rows: M or N, 128 bytes of
// K per K block), both with the 128-byte swizzle and starting on the 1024-byte swizzle repeat:
//   K-major:  one TMA box (kBlockK x rows); row r (an M / N index) is 128 bytes of K at r * 128.
//   MN-major: rows / 64 TMA boxes (64 MN x kBlockK K) one after the other, kMnBlockBytes = kBlockK * 128 apart;
//             inside a box, K row k is 128 bytes of 64 MN elements at k * 128. Same size as K-major.
// The wgmma descriptors describe either (make_smem_desc_k_major / make_smem_desc_mn_major) and the instruction's
// trans immediates say which; everything after the main loop is the same for every layout. TF32 B stored (K, N)
// (layout "nn") arrives MN-major (boxes of 32 FP32 columns) and is transposed into a K-major slot in shared memory
// for the wgmmas (kTransB, transpose_b).
// docs/experiments/sm90-mn-major.md has the sources of the MN-major facts; tests/test_mn_major_cpu.py a NumPy model of
// the address math (TMA writes vs the descriptors' reads), tied to this file by static_asserts.
//
// One CTA per SM walks the output tiles in a grouped order (TileScheduler). Warpgroups:
//   * 0 .. kNumMathWGs-1  consumers: each owns kWGRows rows of the kBlockM x kBlockN tile, issues
//                         wgmma on the shared B stage and its slice of the A stage, then runs the
//                         epilogue for its rows (registers -> swizzled smem -> TMA store).
//   * 2 (3 with kBlockM = 192) producer: one elected thread issues the TMA loads of A and B into a
//                         kNumStages-deep shared-memory ring.
//   * 1 when kBlockM = 64 idle: the kernel has 384 threads so that the register budget at entry
//                         (65536 / 384 = 168) and the setmaxnreg split (40 / 232) are the same for
//                         every configuration but one; the idle warpgroup gives its registers back and exits.
//                         192-row tiles have three consumers and 512 threads (128 registers a thread).
// Handshake per ring stage s (mbarriers in shared memory):
//   full[s]  : 1 arrival (producer's arrive.expect_tx) + the TMA transaction bytes of A and B (kBlock: + the
//              scale warp's 32 cp.async arrivals, + the A scales' bulk-copy bytes when it is used).
//   empty[s] : one arrival per consumer warp once its wgmmas reading stage s have completed.
// Producer and consumers walk the same tile sequence and K loop, so they agree on (stage, phase)
// without communicating anything else.
//
// 8-bit operands (FP8 E4M3/E5M2, INT8) use k32 wgmmas over the same 128-byte K blocks (128 elements).
// Their scales (dequantization factors, x = q * s) are applied by kScaling:
//   kTensor: one FP32 per operand, folded into the epilogue;
//   kRow:    A per row (M), B per row of the (N, K) weight, i.e. per output column; staged into shared
//            memory with cp.async while the tile's main loop runs, applied in the epilogue;
//   kBlock:  A per 1x128 group along K, B per 128x128 block; applied per K block when the partial sums
//            are promoted into the FP32 accumulators (the block size equals kBlockK = 128). Each stage's
//            scales (kBlockM of A, the tile's B blocks) sit in the stage's slot in shared memory, filled
//            from global memory asynchronously with completion on the stage's full barrier, so the
//            consumers never wait on a global load (loading them in the consumers, even one K block
//            ahead, measured 1010 against 1424 TFLOPS for per-tensor scales at 4096x7168x16384). Warp 1
//            of the producer warpgroup copies the B blocks with cp.async, and the A scales too unless the
//            host set ScaleArgs::is_a_bulk (M-major scale_a, see a_scale_bulk_bytes): then a tile's A
//            scales of a K block are bulk-copied, by that warp (128-row tiles of dense and grouped split-K
//            kernels, kScaleWarpBulkA) or
//            the TMA thread with the stage's operands.
// kPromote (FP8; TF32 for 3xTF32, whose accuracy the tensor cores' truncating additions would cap): every K block
// accumulates into fresh registers that are then added (scaled, for
// kBlock) into the FP32 accumulators: Hopper's FP8 tensor-core accumulation keeps fewer mantissa bits
// than FP32, so long K sums drift without it. Without kPromote (fast_accum) the wgmmas accumulate
// straight through K like the 16-bit kernels.
//
// Tails: M, N and K need no special code. TMA zero-fills the parts of a load box outside the tensor
// (zeros contribute nothing to the dot products) and clips the parts of a store box outside D. Since that fill
// is slow, dense kernels load the partial last M / N blocks of K-major operands through boxes that end at the
// tensor instead (EdgeMaps; the stage rows past them stay unwritten and feed only output rows / columns that are
// never stored), and a single tile's A box holds just M rows (a_box_rows).
#pragma once
#include "dgjit/epilogue_sm90.cuh"
#include "dgjit/ptx_sm90.cuh"
#include "dgjit/sched_sm90.cuh"

namespace dgjit {
namespace sm90 {

// Storage types of A and B -> wgmma operand kind. FP32 storage means TF32 MMAs (the tensor cores
// ignore the low 13 mantissa bits).
template <class TA, class TB> struct OperandTraits;
template <> struct OperandTraits<bfloat16_t, bfloat16_t> { static constexpr MmaKind kKind = MmaKind::kBF16; };
template <> struct OperandTraits<half_t, half_t> { static constexpr MmaKind kKind = MmaKind::kFP16; };
template <> struct OperandTraits<float, float> { static constexpr MmaKind kKind = MmaKind::kTF32; };
template <> struct OperandTraits<float_e4m3_t, float_e4m3_t> { static constexpr MmaKind kKind = MmaKind::kE4M3E4M3; };
template <> struct OperandTraits<float_e4m3_t, float_e5m2_t> { static constexpr MmaKind kKind = MmaKind::kE4M3E5M2; };
template <> struct OperandTraits<float_e5m2_t, float_e4m3_t> { static constexpr MmaKind kKind = MmaKind::kE5M2E4M3; };
template <> struct OperandTraits<float_e5m2_t, float_e5m2_t> { static constexpr MmaKind kKind = MmaKind::kE5M2E5M2; };
template <> struct OperandTraits<int8_t, int8_t> { static constexpr MmaKind kKind = MmaKind::kS8S8; };

// How scale factors are applied (see the top of this file): dgjit::Scaling (common.cuh).

// Where the scale factors live: element (i, j) of scale_a is a[i * a_stride_m + j * a_stride_k]
// (i: row of A, j: 128-group of K for kBlock, 0 otherwise), element (i, j) of scale_b is
// b[i * b_stride_n + j * b_stride_k] (i: row of B for kRow, 128-block of rows for kBlock). Strides
// make row-major and column-major (DeepGEMM's) scale layouts the same code.
// is_a_bulk (kBlock; set per call by the host, deepgemm_jit/launch.py bulk_a_scales): scale_a is M-major
// (a_stride_m == 1, or one row), 16-byte aligned, a_stride_k a multiple of 4 and at least M rounded up to 4. Then
// rows [r, r + 4q) of one K column, r a multiple of 4, are a 16-byte aligned run of 16q bytes, inside the column
// whenever r + 4q <= round_up(M, 4): what a_scale_bulk_bytes copies.
struct ScaleArgs {
  const float* a;
  const float* b;
  int64_t a_stride_m, a_stride_k, b_stride_n, b_stride_k;
  uint32_t is_a_bulk;
};

// Tensor maps for the tiles at the far edges of A and B (dense kernels; launch.py edge_maps): `a` boxes `a_rows` =
// M % kBlockM rows, for the last M block when M is larger than one tile (0: no such map, also where the host keeps
// whole boxes: launch.A_EDGE_MAX_BLOCK_N); `b` boxes kN % kBlockN rows, for the last N block (GemmSm90::kBEdgeRows).
// Unused ones may point at any map.
struct EdgeMaps {
  const CUtensorMap* a = nullptr;
  const CUtensorMap* b = nullptr;
  uint32_t a_rows = 0;
};

// How D leaves shared memory. TMA stores column slices whose smem row is one swizzle span, so the
// slice width is the widest of 128/64/32/16 bytes that divides the tile's row (kBlockN = 112 bf16 ->
// 224 bytes -> 32-byte slices). A slice may never reach into the neighbouring tile's columns, which a
// fixed 128-byte slice would do for such N. The swizzle makes the epilogue's st.shared pattern (8 rows
// x 16 bytes per warp instruction) conflict-free; 16-byte rows are conflict-free without one.
// The host must encode D's tensor map with box = (kSliceCols, GemmSm90::kDRows) and this swizzle.
template <class TD, uint32_t kBlockN>
struct StoreTraits {
  static constexpr uint32_t kElemBytes = sizeof(TD);
  static constexpr uint32_t kTileRowBytes = kBlockN * kElemBytes;
  static constexpr uint32_t kSliceRowBytes = kTileRowBytes % 128 == 0   ? 128
                                             : kTileRowBytes % 64 == 0  ? 64
                                             : kTileRowBytes % 32 == 0  ? 32
                                                                        : 16;
  static constexpr uint32_t kSliceCols = kSliceRowBytes / kElemBytes;
  static constexpr uint32_t kNumSlices = kBlockN / kSliceCols;
  static constexpr uint32_t kSwizzleBytes = kSliceRowBytes >= 32 ? kSliceRowBytes : 0;
  static_assert(kTileRowBytes % 16 == 0, "a D tile row must be a whole number of 16-byte chunks");

  // TMA's swizzle (on 1024-byte aligned buffers): the 16-byte chunk index inside each 128-byte line
  // is XORed with the line index modulo (span / 16).
  static DGJIT_DEVICE uint32_t swizzle(uint32_t offset_bytes) {
    if constexpr (kSwizzleBytes == 0) {
      return offset_bytes;
    } else {
      return offset_bytes ^ (((offset_bytes >> 7) & (kSwizzleBytes / 16 - 1)) << 4);
    }
  }
};

// Ring position shared by producer and consumers: the stage, and the parity of the barrier phase
// that the next use of the stage waits for.
template <uint32_t kNumStages>
struct PipelineState {
  uint32_t stage = 0;
  uint32_t phase = 0;
  DGJIT_DEVICE void advance() {
    if (++stage == kNumStages) {
      stage = 0;
      phase ^= 1;
    }
  }
  // Pass over `n` uses of the ring (another consumer's tile in ping-pong).
  DGJIT_DEVICE void skip(uint32_t n) {
    const uint32_t total = stage + n;
    phase ^= (total / kNumStages) & 1;
    stage = total % kNumStages;
  }
};

template <class TA,           // A storage: bfloat16_t, half_t, float (TF32 MMAs), float_e4m3_t, float_e5m2_t, int8_t
          class TB,           // B storage: as TA (FP8 may mix E4M3 and E5M2)
          class TD,           // output storage: bfloat16_t, half_t, float, int32_t (INT8 without scales), or the
                              // quantize-on-store epilogues' float_e4m3_t / int8_t
          uint32_t kN,        // problem N (columns of D, rows of B)
          uint32_t kK,        // problem K
          uint32_t kBlockM,   // 64 (one consumer), 128 or 256 (two consumers of 64 / 128 rows), 192 (three of 64)
          uint32_t kBlockN,   // multiple of 8 in 8..256 (one wgmma instruction spans it)
          uint32_t kBlockK,   // 128 bytes of K: 64 for 16-bit types, 32 for TF32
          uint32_t kNumStages,
          uint32_t kGroupM,   // M blocks per raster group
          Scaling kScaling,   // how scale factors are applied (kNone for unscaled types)
          bool kPromote,      // FP8, TF32 (3xTF32): promote each K block's partial sums into FP32 accumulators
          bool kPingPong,     // the two consumers take turns on whole tiles (see below) instead of sharing each
          class Epi = EpilogueNone,  // fused epilogue (see EpilogueNone)
          bool kGrouped = false,     // grouped GEMM: tiles of all groups, B_g and the bias per group (GroupArgs)
          bool kSplitK = false,      // split-K: tiles' K divided among CTAs at run time (SplitArgs)
          bool kAKMajor = true,      // A stored (M, K) (K contiguous); false: (K, M), M contiguous (16-bit only)
          bool kBKMajor = true,      // B stored (N, K) (K contiguous); false: (K, N), N contiguous (16-bit only)
          uint32_t kDRing = 0,       // D through a ring of this many slices per consumer (0: the whole tile)
          bool kHiLo = false,        // 3xTF32: A and B are [hi | lo] (2/3 of kK wide), see hi_lo_column
          bool kRawB = false,        // kHiLo with B the raw FP32 weight (kK / 3 wide), see convert_lo
          bool kSwapAB = false>      // the wgmmas compute the tile transposed (D^T = B A^T), see below
struct GemmSm90 {
  // ---- roles and threads -------------------------------------------------------------------------
  // kSwapAB: the tile's columns are the wgmmas' rows (instruction M, 64 per consumer, from the B stage) and its rows
  // their columns (instruction N, from the A stage), so kBlockM may be any multiple of 8 up to 256 and the tiles fit
  // an awkward M (1050 rows: 12 tiles of 88 instead of 9 of 128, whose last one is mostly empty). The scheduler, the
  // producer and the stages are the kernel's usual ones (tiles of kBlockM x kBlockN of D, A then B per stage); only
  // the operands of each wgmma swap, and the epilogue stores the transposed accumulators (epilogue_swapped).
  // kMmaRows / kMmaCols: the tile's extent along the wgmma's M / N.
  static constexpr uint32_t kMmaRows = kSwapAB ? kBlockN : kBlockM;
  static constexpr uint32_t kMmaCols = kSwapAB ? kBlockM : kBlockN;
  // 192-row tiles: three consumers of 64 rows and a fourth warpgroup (512 threads), the producer last.
  static constexpr uint32_t kNumMathWGs = kMmaRows == 192 ? 3 : (kPingPong || kMmaRows != 64 ? 2 : 1);
  static constexpr uint32_t kNumWGs = kNumMathWGs == 3 ? 4 : 3;
  static constexpr uint32_t kNumThreads = kNumWGs * kWarpgroupThreads;
  static constexpr uint32_t kProducerWG = kNumWGs - 1;
  static constexpr uint32_t kWGRows = kPingPong ? kBlockM : kMmaRows / kNumMathWGs;
  // First row of a consumer's part of the tile (ping-pong: each consumer owns whole tiles).
  static DGJIT_DEVICE constexpr uint32_t wg_row_offset(uint32_t math_wg) { return kPingPong ? 0 : math_wg * kWGRows; }
  // Arrivals that free a ring stage: each warp of the consumers that read it (kRawB: and each converter warp).
  static constexpr uint32_t kStageReaders = kPingPong ? 4 : 4 * kNumMathWGs;
  // Named barriers: 1 + math_wg synchronise one consumer's epilogue; kTurnBarrier + math_wg (ping-pong)
  // tells consumer math_wg that the other one has left its main loop; kLaneFull / kLaneFree (5, 6) hand K lane 1's
  // sums to lane 0 (kWGSplitK).
  static constexpr uint32_t kTurnBarrier = 3;
  static constexpr uint32_t kNumM64PerWG = kWGRows / 64;
  // 40 + 232 (+ 232) per thread over 3 warpgroups = 504 <= 3 * 168: the consumers' increase is covered
  // by what the producer (and the idle warpgroup) release. Four warpgroups (192-row tiles) launch with 128 a thread,
  // which is also ptxas's ceiling for the whole kernel (__launch_bounds__): an increase would buy the consumers
  // nothing, so they keep 128 (96 accumulators, 192x192, fit; 192x208 did not compile).
  static constexpr uint32_t kProducerRegs = 40;
  // The registers per thread the CTA launches with (a multiple of 8 that 65536 / kNumThreads allows).
  static constexpr uint32_t kLaunchRegs = kNumWGs == 4 ? 128 : 168;
  static constexpr uint32_t kMathRegs = kNumWGs == 4 ? kLaunchRegs : 232;

  // ---- MMA geometry ------------------------------------------------------------------------------
  static constexpr MmaKind kKind = OperandTraits<TA, TB>::kKind;
  // The wgmmas' operand types in instruction order: kSwapAB feeds B's rows as the instruction's A (E5M2 x E4M3 then).
  static constexpr MmaKind kMmaKind = kSwapAB ? OperandTraits<TB, TA>::kKind : kKind;
  static constexpr bool kIsInt = kKind == MmaKind::kS8S8;
  static constexpr bool kIsFP8 = sizeof(TA) == 1 && !kIsInt;
  // Split-K inside the CTA (FP8 with promotion, per-tensor or per-row scales): a cooperative 64-row tile has one
  // consumer warpgroup, so the other one takes every second K block (its "K lane" 1) and adds its sums into the
  // owner's (lane 0) through shared memory before the owner's epilogue (reduce_k_lanes). Two promotion chains are
  // then in flight per tile instead of one. Measured on the H200 (session 9, same stages with and without): FP8
  // per-tensor M = 64/128 2-9% faster (128x2112x7168 15.6 -> 14.2 us); block scaling 1-6% slower and BF16 up to 9%
  // slower (its K loop keeps two K blocks in flight already), so those keep one lane. sm90_tiles.sm90_wg_split_k
  // mirrors this rule.
  static constexpr bool kWGSplitK = kBlockM == 64 && !kPingPong && !kSwapAB && kIsFP8 && kPromote &&
                                    (kScaling == Scaling::kTensor || kScaling == Scaling::kRow);
  static constexpr uint32_t kKStep = kWGSplitK ? 2 : 1;  // K blocks from one of a consumer's blocks to its next
  using TAcc = typename conditional<kIsInt, int32_t, float>::type;
  using Mma = WgmmaM64<kMmaCols>;
  static constexpr uint32_t kMmaK = wgmma_k<kKind>();
  static constexpr uint32_t kNumAccum = kMmaCols / 2;  // fp32 accumulators per thread per m64 slice
  // A consumer's accumulators moved as a whole (split-K partials in global memory, kWGSplitK's lane buffer in
  // shared memory): 4 per 16-byte word, kAccumWords per thread, word q of thread t at q * 128 + t (a warp's
  // stores and loads are 512 contiguous bytes).
  static constexpr uint32_t kAccumWords = kNumM64PerWG * kNumAccum / 4;
  static_assert(kNumAccum % 4 == 0, "accumulators move in groups of four");
  // The 16-byte word (counted from thread 0's first) holding thread 0's accumulators 4q..4q+3 of m64 slice mi;
  // `stride`: threads per word (split-K partials keep only the threads that hold rows below M, reduce_split).
  static DGJIT_DEVICE constexpr uint32_t accum_word(uint32_t mi, uint32_t q, uint32_t stride = kWarpgroupThreads) {
    return (mi * kNumAccum / 4 + q) * stride;
  }
  static constexpr uint32_t kInBytes = sizeof(TA);
  static constexpr uint32_t kSmemRowBytes = kBlockK * kInBytes;  // one 128B-swizzled row per M/N index
  // MN-major operands: a stage holds rows / kMnBlockElems boxes of kMnBlockElems MN elements (one 128-byte swizzle
  // row) x kBlockK K rows, kMnBlockBytes each.
  static constexpr uint32_t kMnBlockElems = 128 / kInBytes;
  static constexpr uint32_t kMnBlockBytes = kBlockK * 128;
  static constexpr uint32_t kNumKBlocks = (kK + kBlockK - 1) / kBlockK;
  // The K blocks a tile's loop walks (schedulers, split-K shares): kRawB takes a raw K block's three products from
  // one stage (see kRawB below), so its loop is a third of the K' = 3 Kp blocks long.
  static constexpr uint32_t kLoopKBlocks = kRawB ? kNumKBlocks / 3 : kNumKBlocks;
  static constexpr uint32_t kNumNBlocks = (kN + kBlockN - 1) / kBlockN;

  static_assert(kSwapAB ? (kBlockM % 8 == 0 && kBlockM >= 8 && kBlockM <= 256 &&
                           (kBlockN == 64 || kBlockN == 128 || kBlockN == 192))
                        : (kBlockM == 64 || kBlockM == 128 || kBlockM == 192 || kBlockM == 256),
                "kBlockM must be 64, 128, 192 or 256 (kSwapAB: a multiple of 8 up to 256, kBlockN 64, 128 or 192)");
  // Three consumers hold 128 registers each: plain 16-bit tiles only (no promotion's second set, no converters).
  static_assert(kNumMathWGs != 3 || (!kPingPong && !kPromote && !kIsFP8 && !kIsInt && !kGrouped && !kSplitK &&
                                   kAKMajor && kBKMajor),
                "192-row tiles (three consumers): 16-bit, layout nt, dense, unsplit, cooperative");
  static_assert(!kPingPong || kBlockM <= 128, "a ping-pong consumer holds a whole tile: kBlockM 64 or 128");
  static_assert(kBlockN % 8 == 0 && kBlockN >= 8 && kBlockN <= 256, "kBlockN: multiple of 8 in 8..256");
  static_assert(kSmemRowBytes == 128 && sizeof(TB) == sizeof(TA),
                "kBlockK must span 128 bytes (128 for 8-bit operands, 64 for 16-bit, 32 for TF32): TMA box "
                "rows and wgmma descriptors assume the 128-byte swizzle");
  static_assert(kScaling == Scaling::kNone || sizeof(TA) == 1, "scale factors belong to 8-bit operands");
  // kTransB (TF32 with B stored (K, N), layout nn): TF32 wgmma reads K-major operands only, so B arrives MN-major
  // by TMA into the stage's raw slot and the converter warps (those of kRawB) transpose it into the stage's second
  // B slot, laid out as a K-major TMA box would be (transpose_b); the consumers read that slot. For small M, where
  // the kernel streams the weight and shared memory has bandwidth to spare (sm90_tiles.sm90_trans_b,
  // SM90_TF32_TRANS_B_MAX_M).
  static constexpr bool kTransB = !kBKMajor && kKind == MmaKind::kTF32;
  static constexpr bool kBMmaKMajor = kBKMajor || kTransB;  // how the wgmmas read B
  // Kernels with converter warps (kRawB, kTransB): a second B slot and a third barrier per stage.
  static constexpr bool kConverts = kRawB || kTransB;
  static_assert((kAKMajor && kBMmaKMajor) || kKind == MmaKind::kBF16 || kKind == MmaKind::kFP16,
                "MN-major operands exist for bf16 / fp16 only (and a TF32 B, transposed in shared memory): wgmma "
                "reads tf32 and 8-bit operands K-major");
  static_assert(kBKMajor || kBlockN % kMnBlockElems == 0,
                "an MN-major B stage is whole 128-byte TMA boxes: kBlockN a multiple of 64 (16-bit) or 32 (TF32)");
  static_assert(kAKMajor || kBlockM % kMnBlockElems == 0,
                "an MN-major A stage is whole 64-row TMA boxes: kBlockM must be a multiple of 64");
  static_assert(!kGrouped || (kAKMajor && kBKMajor), "grouped GEMMs take layout nt");
  static_assert(kScaling != Scaling::kBlock || (kIsFP8 && kPromote && kBlockK == 128),
                "block scaling is applied at promotion, once per 128-wide K block");
  static_assert(!kPromote || kIsFP8 || kKind == MmaKind::kTF32,
                "promotion exists for FP8's reduced-precision accumulation and for TF32 (3xTF32 accuracy)");
  static_assert(is_same<TD, int32_t>::value == (kIsInt && kScaling == Scaling::kNone),
                "INT32 output is exactly the unscaled INT8 product");
  static constexpr bool kHasEpilogue = Epi::kBeta || Epi::kBias != BiasKind::kNone ||
                                       Epi::kAct != Activation::kNone || Epi::kResidual ||
                                       Epi::kGate != GateKind::kNone || Epi::kQuant != QuantKind::kNone;
  static_assert(!kHasEpilogue || !is_same<TD, int32_t>::value, "fused epilogues write floating outputs");
  // Gated units: accumulator group j = 2i (B rows 16c..16c+7 of the interleaved weight) is the gate and j = 2i + 1
  // the up projection of the same 8 output columns, so D tiles have half the tile's columns.
  static constexpr bool kGated = Epi::kGate != GateKind::kNone;
  static constexpr uint32_t kOutCols = kGated ? kBlockN / 2 : kBlockN;  // D columns per tile
  static constexpr uint32_t kOutN = kGated ? kN / 2 : kN;               // D columns
  static_assert(!kGated || (kBlockN % 16 == 0 && kN % 16 == 0), "gated units interleave gate/up in blocks of 8");
  static_assert(!kGated || (Epi::kAct == Activation::kNone && !Epi::kBeta), "the gate's activation replaces act");
  static constexpr bool kQuantGroup = Epi::kQuant == QuantKind::kFp8Group128;
  static constexpr bool kQuantTensor = Epi::kQuant == QuantKind::kFp8Tensor || Epi::kQuant == QuantKind::kInt8Tensor;
  // 1x128 group scales: a tile of 128 or 256 columns of D reduces its groups' amax itself; a narrower one (16, 32 or
  // 64 columns, which small M needs to fill the SMs) is one of the kClusterN = 128 / kOutCols CTAs of a thread-block
  // cluster that take the group's tiles together and exchange their rows' partial amax (quantize_groups_cluster).
  static_assert(!kQuantGroup || kOutCols == 128 || kOutCols == 256 || kOutCols == 64 || kOutCols == 32 ||
                    kOutCols == 16,
                "1x128 group scales: D tiles of 128 or 256 columns, or of 16, 32 or 64 in a cluster along N");
  static constexpr uint32_t kClusterN = kQuantGroup && kOutCols < 128 ? 128 / kOutCols : 1;
  static constexpr bool kCluster = kClusterN > 1;
  static_assert(!kCluster || (!kPingPong && !kSplitK && !kGrouped && !kSwapAB),
                "group quantization across a cluster: dense, unsplit, cooperative tiles");
  static_assert((Epi::kQuant == QuantKind::kNone) ||
                    (Epi::kQuant == QuantKind::kInt8Tensor ? is_same<TD, int8_t>::value
                                                           : is_same<TD, float_e4m3_t>::value),
                "quantize-on-store writes E4M3 (quant_fp8_*) or INT8 (quant_int8_tensor)");
  static_assert(Epi::kQuant == QuantKind::kNone || (!Epi::kBeta && !Epi::kResidual),
                "C and the residual would have D's 8-bit type");
  // The bias's storage: D's type, FP32 for quantized outputs.
  using TBias = typename conditional<Epi::kQuant == QuantKind::kNone, TD, float>::type;
  static_assert(kNumStages >= 2, "the ring needs at least two stages to overlap loads with MMAs");
  static_assert(kN >= 1 && kK >= 1, "empty problems are handled on the host");
  static_assert(kNumM64PerWG * kNumAccum * (kPromote ? 2 : 1) <= (kNumMathWGs == 3 ? 96 : kPromote ? 176 : 128),
                "too many accumulators per consumer thread for its registers (promotion doubles them)");

  // ---- shared memory (one source of truth; the host reads kSmemBytes from the module) ------------
  // A consumer's part of the D tile: kDRows rows of kDCols columns (kSwapAB: all rows, its 64 columns).
  static constexpr uint32_t kDRows = kSwapAB ? kBlockM : kWGRows;
  static constexpr uint32_t kDCols = kSwapAB ? 64 : kOutCols;
  using Store = StoreTraits<TD, kDCols>;
  static constexpr uint32_t kSmemDBytesPerWG = kDRows * kDCols * sizeof(TD);
  static constexpr uint32_t kSmemDSliceBytes = kDRows * Store::kSliceRowBytes;
  // kRawB: a stage holds A_hi then A_lo (the A part), and the raw B block then its B_lo slot (the B part), which
  // the converter warps fill from the raw block (TMA loads 2 A tiles and 1 B tile).
  static constexpr uint32_t kAOperandsPerStage = kRawB ? 2 : 1;
  static constexpr uint32_t kSmemABoxBytes = kBlockM * kSmemRowBytes;
  static constexpr uint32_t kSmemBBoxBytes = kBlockN * kSmemRowBytes;
  static constexpr uint32_t kSmemABytesPerStage = kAOperandsPerStage * kSmemABoxBytes;
  static constexpr uint32_t kSmemBBytesPerStage = (kConverts ? 2 : 1) * kSmemBBoxBytes;
  static constexpr uint32_t kStageTxBytes = kSmemABytesPerStage + kSmemBBoxBytes;
  static_assert((kAKMajor || kSmemABytesPerStage == kBlockM / kMnBlockElems * kMnBlockBytes) &&
                    (kBKMajor || kSmemBBytesPerStage == (kTransB ? 2 : 1) * kBlockN / kMnBlockElems * kMnBlockBytes),
                "an MN-major stage occupies what the K-major one does (sm90_tiles.sm90_smem_bytes mirrors one formula)");
  // Epilogue operands of a whole tile are loaded by TMA while the tile's main loop runs, into the buffer
  // the epilogue then overwrites with D in place (each thread reads exactly the addresses it writes): C
  // into the D buffer, the residual too unless C is there, then into a second buffer of the same shape.
  static constexpr bool kLoadC = Epi::kBeta;
  static constexpr bool kLoadR = Epi::kResidual;
  static constexpr bool kPrefetch = kLoadC || kLoadR;
  // kDRing: a consumer's D leaves slice by slice (FP32: 32 or 16 columns, 128 or 64 bytes per row; 16-bit: 64, 32 or
  // 16 columns) through a ring of kDRing slice buffers: each slice is stored by TMA as soon as its columns are
  // written, and its buffer is written again kDRing slices later, once that store has read it. The shared memory a
  // whole staged tile takes goes to pipeline stages instead (TF32: 4 stages of a 128x256 tile, where the whole tile
  // allowed 2; BF16 at mid M: 4 stages of 128x240, where it allowed 3). Needs the tile's columns walked in
  // slice order by one m64 slice of rows (kNumM64PerWG == 1), and a tile nobody else reads from the buffer: no C /
  // residual (TMA loads them into the whole tile), not grouped (store_rows), no group quantizer.
  static constexpr bool kRing = kDRing > 0;
  static constexpr bool k16BitD = is_same<TD, bfloat16_t>::value || is_same<TD, half_t>::value;
  static constexpr bool kRingD = (is_same<TD, float>::value && Store::kSliceRowBytes >= 64) ||
                                 (k16BitD && Store::kSliceRowBytes >= 32);
  static_assert(!kRing || (kRingD && kDRing >= 2 && kDRing < Store::kNumSlices && kNumM64PerWG == 1 && !kPrefetch &&
                           !kGrouped),
                "a D ring holds 2 or more (and fewer than the tile's) slices of a 64-row consumer without C / "
                "residual, not grouped: FP32 slices of 64 or 128 bytes, 16-bit ones of 32 bytes or more");
  static constexpr uint32_t kSmemDBufBytesPerWG = kRing ? kDRing * kSmemDSliceBytes : kSmemDBytesPerWG;
  static_assert(!kSwapAB || (k16BitD && (kKind == MmaKind::kBF16 || kKind == MmaKind::kFP16 ||
                                         (kIsFP8 && (kScaling == Scaling::kTensor || kScaling == Scaling::kRow))) &&
                             !kPrefetch && !kGated && Epi::kQuant == QuantKind::kNone && !kPingPong && !kGrouped &&
                             !kSplitK && !kRing && kAKMajor && kBKMajor),
                "swapped tiles: 16-bit operands or FP8 with per-tensor / per-row scales, 16-bit D, layout nt, a bias "
                "and an activation at most, dense, unsplit, cooperative, D staged whole (epilogue_swapped stores 8x8 "
                "groups transposed with stmatrix)");
  static constexpr uint32_t kSmemDOffset = 0;
  static constexpr uint32_t kSmemROffset = kSmemDOffset + kNumMathWGs * kSmemDBufBytesPerWG;
  static constexpr uint32_t kSmemRBytes = kLoadC && kLoadR ? kNumMathWGs * kSmemDBytesPerWG : 0;
  static constexpr uint32_t kSmemAOffset = kSmemROffset + kSmemRBytes;
  static constexpr uint32_t kSmemBOffset = kSmemAOffset + kNumStages * kSmemABytesPerStage;
  static constexpr uint32_t kSmemBarrierOffset = kSmemBOffset + kNumStages * kSmemBBytesPerStage;
  // 2 barriers per stage (kRawB: 3, rounded up to 16 bytes); then (kRow only) each consumer's row and column
  // scales of its current tile; then 1024 bytes of slack so the base can be rounded up to the 1024-byte swizzle repeat at run time
  // (the dynamic smem base alignment is not guaranteed beyond 16 bytes).
  // kBlock: per stage, kBlockM scales of A then kMaxScaleBBlocks of B (16-byte aligned slots).
  static constexpr uint32_t kMaxScaleBBlocks =
      128 % kBlockN == 0 ? 1 : (kBlockN % 128 == 0 ? kBlockN / 128 : kBlockN / 128 + 2);
  static constexpr uint32_t kStageScaleFloats = (kBlockM + kMaxScaleBBlocks + 3) / 4 * 4;
  // One epilogue-operand barrier per consumer (16 bytes keep what follows 16-byte aligned).
  static constexpr uint32_t kBarriersPerStage = kConverts ? 3 : 2;
  static constexpr uint32_t kSmemEpiBarrierOffset = kSmemBarrierOffset + (kBarriersPerStage * kNumStages * 8 + 15) / 16 * 16;
  static constexpr uint32_t kSmemEpiBarrierBytes = kPrefetch ? 16 : 0;
  static constexpr uint32_t kSmemStageScaleOffset = kSmemEpiBarrierOffset + kSmemEpiBarrierBytes;
  static constexpr uint32_t kSmemStageScaleBytes =
      kScaling == Scaling::kBlock ? kNumStages * kStageScaleFloats * 4 : 0;
  static constexpr uint32_t kSmemScaleOffset = kSmemStageScaleOffset + kSmemStageScaleBytes;
  // kRow: each consumer's row scales (its rows of the tile; kSwapAB: all kBlockM) and column scales (the tile's;
  // kSwapAB: its 64).
  static constexpr uint32_t kScaleRowsPerWG = kSwapAB ? kBlockM : kWGRows;
  static constexpr uint32_t kScaleColsPerWG = kSwapAB ? 64 : kBlockN;
  static constexpr uint32_t kSmemScaleFloatsPerWG = kScaleRowsPerWG + kScaleColsPerWG;
  static constexpr uint32_t kSmemScaleBytes =
      kScaling == Scaling::kRow ? kNumMathWGs * kSmemScaleFloatsPerWG * 4 : 0;
  // The tile's bias as FP32, per consumer (its columns, or its rows), zero past N / M.
  // kSwapAB: a consumer's 64 columns, or all kBlockM rows.
  static constexpr uint32_t kBiasFloatsPerWG =
      Epi::kBias == BiasKind::kCol ? (kSwapAB ? 64 : kBlockN)
                                   : (Epi::kBias == BiasKind::kRow ? (kSwapAB ? kBlockM : kWGRows) : 0);
  static constexpr uint32_t kSmemBiasOffset = kSmemScaleOffset + kSmemScaleBytes;
  static constexpr uint32_t kSmemBiasBytes = kNumMathWGs * kBiasFloatsPerWG * 4;
  // Split-K: one word per consumer, where its thread 0 tells the others whether they arrived last; grouped, then
  // the launch's split plan (GroupedTileScheduler::plan, two words).
  static constexpr uint32_t kSmemSplitOffset = kSmemBiasOffset + kSmemBiasBytes;
  static constexpr uint32_t kSmemSplitBytes = kSplitK ? 16 : 0;
  // kWGSplitK: K lane 1's accumulators on their way to lane 0 (reduce_k_lanes), 16-byte words of 4.
  static constexpr uint32_t kSmemRedOffset = kSmemSplitOffset + kSmemSplitBytes;
  static constexpr uint32_t kSmemRedBytes = kWGSplitK ? kAccumWords * kWarpgroupThreads * 16 : 0;
  static_assert(kSmemRedOffset % 16 == 0, "the K-lane buffer is written in 16-byte words");
  // kCluster: two exchange barriers (16 bytes), then two buffers (tiles alternate) of kClusterN x kBlockM partial
  // amaxes, one row of kBlockM per sending rank (quantize_groups_cluster).
  static constexpr uint32_t kSmemExchOffset = kSmemRedOffset + kSmemRedBytes;
  static constexpr uint32_t kSmemExchBytes = kCluster ? 16 + 2 * kClusterN * kBlockM * 4 : 0;
  static constexpr uint32_t kSmemBytes = kSmemExchOffset + kSmemExchBytes + 1024;
  static_assert(kSmemDSliceBytes % 1024 == 0 && kSmemABytesPerStage % 1024 == 0 &&
                    kSmemBBytesPerStage % 1024 == 0 && kSmemDBytesPerWG % 1024 == 0,
                "every swizzled buffer must start on a 1024-byte boundary");
  static_assert(kSmemBytes <= 232448, "shared memory exceeds the 227 KiB a Hopper CTA can opt into");

  // Grouped GEMMs: one walk over the tiles of all groups. C and the residual are not taken (their prefetch into
  // the D buffer would race with store_rows' reads of it), nor per-tensor / per-row scales (they are per group).
  static_assert(!kGrouped || (!kPrefetch && !kPingPong && (kScaling == Scaling::kNone || kScaling == Scaling::kBlock)),
                "grouped GEMMs: no C / residual operands, no ping-pong, scaling none or block");
  // kWalkSplits: the walk hands out K shares (split-K kernels; grouped ones only in launches whose plan splits).
  template <bool kWalkSplits>
  using Walk = typename conditional<kGrouped, GroupedTileScheduler<kBlockM, kNumNBlocks, kGroupM, kLoopKBlocks, kWalkSplits>,
                                    TileScheduler<kBlockM, kNumNBlocks, kGroupM, kLoopKBlocks, kClusterN>>::type;
  // Split-K: ping-pong consumers take turns by tile count. Grouped walks choose which tiles to split, and how far,
  // on the device (GroupedTileScheduler), the host's count the most they may use.
  static_assert(!kSplitK || !kPingPong, "split-K runs cooperative tiles");
  using State = PipelineState<kNumStages>;

  struct Smem {
    uint8_t* base;  // 1024-byte aligned
    DGJIT_DEVICE uint8_t* d(uint32_t math_wg) const { return base + kSmemDOffset + math_wg * kSmemDBufBytesPerWG; }
    // Where the residual tile lands (see kSmemRBytes).
    DGJIT_DEVICE uint8_t* r(uint32_t math_wg) const {
      return kSmemRBytes ? base + kSmemROffset + math_wg * kSmemDBytesPerWG : d(math_wg);
    }
    DGJIT_DEVICE uint64_t* epi_full(uint32_t math_wg) const {
      return reinterpret_cast<uint64_t*>(base + kSmemEpiBarrierOffset) + math_wg;
    }
    DGJIT_DEVICE float* bias(uint32_t math_wg) const {
      return reinterpret_cast<float*>(base + kSmemBiasOffset) + math_wg * kBiasFloatsPerWG;
    }
    DGJIT_DEVICE uint8_t* a(uint32_t stage) const { return base + kSmemAOffset + stage * kSmemABytesPerStage; }
    DGJIT_DEVICE uint8_t* b(uint32_t stage) const { return base + kSmemBOffset + stage * kSmemBBytesPerStage; }
    // kRawB: the stage's A_lo tile and B_lo slot (kTransB: the transposed, K-major B).
    DGJIT_DEVICE uint8_t* a_lo(uint32_t stage) const { return a(stage) + kSmemABoxBytes; }
    DGJIT_DEVICE uint8_t* b_lo(uint32_t stage) const { return b(stage) + kSmemBBoxBytes; }
    DGJIT_DEVICE uint64_t* full(uint32_t stage) const {
      return reinterpret_cast<uint64_t*>(base + kSmemBarrierOffset) + stage;
    }
    DGJIT_DEVICE uint64_t* empty(uint32_t stage) const {
      return reinterpret_cast<uint64_t*>(base + kSmemBarrierOffset) + kNumStages + stage;
    }
    // kRawB: the stage's B_lo slot is written (kTransB: the K-major B; the converter warps' arrivals).
    DGJIT_DEVICE uint64_t* lo_full(uint32_t stage) const {
      return reinterpret_cast<uint64_t*>(base + kSmemBarrierOffset) + 2 * kNumStages + stage;
    }
    // kBlock: the stage's scales (A rows of the tile, then its B blocks).
    DGJIT_DEVICE uint32_t stage_scales(uint32_t stage) const {
      return shared_addr(base + kSmemStageScaleOffset + stage * kStageScaleFloats * 4);
    }
    // kRow: kScaleRowsPerWG row scales, then kScaleColsPerWG column scales, per consumer warpgroup.
    DGJIT_DEVICE float* row_scales(uint32_t math_wg) const {
      return reinterpret_cast<float*>(base + kSmemScaleOffset + math_wg * kSmemScaleFloatsPerWG * 4);
    }
    DGJIT_DEVICE float* col_scales(uint32_t math_wg) const { return row_scales(math_wg) + kScaleRowsPerWG; }
    DGJIT_DEVICE volatile uint32_t* split_last(uint32_t math_wg) const {
      return reinterpret_cast<volatile uint32_t*>(base + kSmemSplitOffset) + math_wg;
    }
    DGJIT_DEVICE volatile uint32_t* split_plan() const {
      return reinterpret_cast<volatile uint32_t*>(base + kSmemSplitOffset) + 2;
    }

    DGJIT_DEVICE uint32_t red() const { return shared_addr(base + kSmemRedOffset); }
    // kCluster: exchange buffer `buf`'s barrier, and its row of partial amaxes (float bits) from rank `rank`.
    DGJIT_DEVICE uint64_t* exch_full(uint32_t buf) const {
      return reinterpret_cast<uint64_t*>(base + kSmemExchOffset) + buf;
    }
    DGJIT_DEVICE uint32_t* exch(uint32_t buf, uint32_t rank) const {
      return reinterpret_cast<uint32_t*>(base + kSmemExchOffset + 16) + (buf * kClusterN + rank) * kBlockM;
    }
  };

  // ---- kBlock: A scales by bulk copy (ScaleArgs::is_a_bulk) ---------------------------------------
  // Bytes of the tile's A scales bulk-copied per K block into the stage's slot (kScaleWarpBulkA says by whom; rows
  // [row0, row0 + n), n = min(kBlockM, rows left in M / the group rounded up to 4)), or 0 when the scale warp copies
  // them: the host did not allow it, or the tile starts on a row that is not a multiple of 4 (grouped walks: a group
  // starting there), where the run would not be 16-byte aligned. The TMA thread and the scale warp evaluate it
  // alike per tile. Slot rows past n keep what an earlier use of the stage left (or were never written): they are the
  // scales of tile rows past row_end, whose outputs are never stored (docs/experiments/sm90-fp8-bulk-a-scales.md
  // checks every epilogue), while the scale warp's path fills them with clamped rows.
  // (tests/test_bulk_scales_cpu.py ties its model of this arithmetic to this function with static_asserts.)
  static DGJIT_DEVICE constexpr uint32_t a_scale_bulk_bytes(uint32_t is_a_bulk, uint32_t row0, uint32_t row_end) {
    if (kScaling != Scaling::kBlock || is_a_bulk == 0 || row0 % 4 != 0 || row_end <= row0) return 0;
    const uint32_t rows_left = row_end - row0;
    return 4 * (rows_left < kBlockM ? (rows_left + 3) / 4 * 4 : kBlockM);
  }
  static DGJIT_DEVICE uint32_t a_scale_bulk_bytes(const ScaleArgs& scales, const Tile& tile) {
    return a_scale_bulk_bytes(scales.is_a_bulk, tile.row0, tile.row_end);
  }
  // Who issues that bulk copy: the scale warp's lane 0 (announcing its bytes on the full barrier itself, before its
  // deferred arrival) in dense kernels and grouped split-K kernels of 128-row tiles, else the TMA thread beside the
  // stage's operand loads. Measured on the H200 (docs/NOTES.md, sessions 42-43; bitwise equal): dense FP8 block rows
  // 0-6% faster from the scale warp (4096x4096x7168 188.7 -> 181.7 us, 512x7168x16384 109.4 -> 103.1; 27 of 30 rows
  // at M 256..4096 faster or within 0.5%), while 64-row tiles (M <= 128) ran 1-2% slower. Grouped: the split-K
  // kernel with the scale warp's copy was the fastest on the MoE rows (4 x 8192 x 4096 x 7168 1638 us; plain kernel
  // with the TMA thread's copy 1740, split-K kernel with it 1776), the plain kernel with the scale warp's copy the
  // slowest (1871), so sm90_rules.grouped_fp8_split_kernel gives FP8 grouped 128x128 tiles the split-K kernel.
  static constexpr bool kScaleWarpBulkA = kScaling == Scaling::kBlock && (!kGrouped || kSplitK) && kBlockM >= 128;
  static_assert(kBlockM % 4 == 0, "a bulk copy of kBlockM A scales must be whole 16-byte units");

  // ---- producer: one thread keeps the ring full ---------------------------------------------------
  // B rows that few tiles read (small M: one row of tiles, or a few) are loaded with an L2 evict-first policy.
  // They are dead once read, and marking them first to go keeps the lines already in L2 (the dirty output of
  // earlier kernels, the activations every column tile reads) instead of evicting them: evicting dirty lines writes
  // them back to DRAM inside this kernel, on the bandwidth its weight reads need. kStreamBMaxReaders: the most M
  // blocks that may share a B tile and still have it loaded evict-first. H200, session 11 (`*exp-ab-b-evict-first*`,
  // docs/NOTES.md): 2-14% faster with 1-4 M blocks (M = 32..512); with 8 mixed (-4..+4%); with every tile hinted,
  // 4096x32768x512 ran 12% slower (B lines evicted before the other M blocks read them). The weight-streaming
  // kernel's loads (gemv.cuh) did not gain from the same policy.
  struct L2Policy {
    bool hinted = false;
    uint64_t policy = 0;
  };
  static constexpr uint32_t kStreamBMaxReaders = 4;

  // a_box_rows: the rows of tmap_a's box (K-major A): kBlockM, or M when the host made the box fit a problem of
  // fewer rows than one tile (launch.py a_box_rows). The rows of a stage past the box are then never written (they
  // feed only output rows past M, which are not stored), instead of zero-filled by TMA on every K block: the fill
  // ran at a few cycles per row and capped FP8 64x56 tiles at M = 24 (40 rows of fill per 7 KB of B) 26% below
  // M = 64 (session 9).
  // kHiLo (3xTF32's inner GEMM): [hi | lo] operands of kSegmentBlocks K blocks each (common.cuh,
  // hi_lo_stored_block): hi is stored once, and read the second time while it is still in L2.
  static constexpr uint32_t kSegmentBlocks = kNumKBlocks / 3;
  static_assert(!kHiLo || (kKind == MmaKind::kTF32 && kPromote && kAKMajor && kBKMajor && !kGrouped &&
                           kK % (3 * kBlockK) == 0),
                "hi_lo operands: promoted TF32, layout nt, not grouped, K three segments of whole K blocks");
  // kRawB (3xTF32 at small M, fp32x3.py): B is the caller's FP32 weight itself. The TF32 wgmma reads an FP32
  // operand by dropping its low 13 mantissa bits (H200, session 15: bit-equal results for raw and truncated inputs,
  // scripts/exp_tf32_input_rounding.py), so the raw block serves as B_hi = trunc(B). One stage holds raw K block
  // j whole: A_hi, A_lo and the raw B block by TMA, and B_lo = B - trunc(B), which the converter warps
  // (convert_lo) write into the stage's B_lo slot and announce on its lo_full barrier. The
  // consumers issue (hi, hi), (lo, hi) and (hi, lo) from that stage (issue_raw_b_block), so the loop walks
  // kSegmentBlocks stages per tile, each weight byte crosses DRAM and L2 once, no split pass writes it, and the
  // conversion runs beside the wgmmas instead of in front of them. (Session 15's first form loaded the raw block
  // for each of the three K'-blocks and converted in place on the consumers: 3 stages per raw block, 1.5 TB/s of
  // weight at 64x7168x16384.) hi by truncation leaves out A_lo B_lo of up to ~2^-21 relative (rna's hi: ~2^-22),
  // under the 1e-5 bound; B_lo has up to 13 significant bits, of which the wgmma keeps 11. A NaN whose payload
  // sits only in the 13 dropped bits reads as inf (the split pass would keep it a NaN).
  static_assert(!kRawB || (kHiLo && !kPingPong && kKStep == 1 && kScaling == Scaling::kNone),
                "raw B: the hi_lo GEMM with cooperative consumers");
  static_assert(!kTransB || (!kHiLo && !kPromote && !kPingPong && !kGrouped && kAKMajor),
                "a transposed TF32 B: the plain main loop with cooperative consumers, A K-major");
  // The converter warps: producer warps 1-3, and the idle warpgroup of a 64-row tile (one consumer).
  static constexpr bool kIdleWGConverts = kNumMathWGs == 1;
  static constexpr uint32_t kConverterWarps = 3 + (kIdleWGConverts ? 4 : 0);
  // Registers of the producer warpgroup and of the idle one (kSideRegs), which run the converters here, and of each
  // consumer (kConsumerRegs). kProducerRegs + 2 * kMathRegs = 40 + 2 * 232 = 504 = 3 * 168 in general. kTransB's
  // producer and transposing warps walking split-K shares need more than 40 (tests/fuzz.py: TF32 nn 64x96 and
  // 128x64 / 128x96 with quantize-on-store kept a value on the stack): they take 56, from the consumers' 232
  // where there are two consumers (224 each; their accumulators are at most 64 a thread there), from the 160 spare
  // registers with one. kRawB's converters showed no stack at 40.
  static constexpr uint32_t kSideRegs = kTransB ? 56 : kProducerRegs;
  static constexpr uint32_t kConsumerRegs = kTransB && !kIdleWGConverts ? 224 : kMathRegs;
  static_assert(kSideRegs * (kIdleWGConverts ? 2 : 1) + kConsumerRegs * kNumMathWGs <= kNumWGs * kLaunchRegs,
                "setmaxnreg: the warpgroups' registers must fit those the CTA launches with");
  // The K coordinate in the stored operand of K-loop block k_block (A: kIsA, else B). kRawB loads by its own rule
  // (produce): A_hi at column block j, A_lo at kSegmentBlocks + j, B at j.
  template <bool kIsA>
  static DGJIT_DEVICE constexpr int32_t hi_lo_column(uint32_t k_block) {
    if constexpr (!kHiLo) {
      return static_cast<int32_t>(k_block * kBlockK);
    } else {
      return static_cast<int32_t>(hi_lo_stored_block(k_block, kSegmentBlocks, kIsA) * kBlockK);
    }
  }

  // Edge maps (dense kernels; EdgeMaps): the tiles of the last M block, when M is not a multiple of kBlockM and
  // larger than it, load A through edges.a, whose box holds the edges.a_rows = M % kBlockM rows left; the tiles of the
  // last N block, when kN is not a multiple of kBlockN, load B through edges.b (kBEdgeRows rows). The stage's rows past
  // the box stay unwritten, as with a_box_rows. TMA's zero fill of a box's rows past the tensor, at a few cycles per
  // row on every K block, made such tiles the slowest of their wave: 400 x 4096 x 7168 BF16 at 128x128 ran 56.5 us,
  // 448 rows 42.3 (session 23).
  static constexpr uint32_t kBEdgeRows = kBKMajor && !kGrouped ? kN % kBlockN : 0;

  template <bool kWalkSplits>
  static DGJIT_DEVICE void produce(const Smem& smem, const CUtensorMap& tmap_a, const CUtensorMap& tmap_b,
                                   uint32_t m, const GroupArgs& ga, const SplitArgs& sk, const ScaleArgs& scales,
                                   uint32_t a_box_rows, const EdgeMaps& edges) {
    Walk<kWalkSplits> scheduler(m, ga, sk);
    State state;
    Tile tile;
    const uint64_t evict_first = l2_evict_first_policy();
    while (scheduler.next(tile)) {
      const int32_t a_row = static_cast<int32_t>(tile.row0);
      const int32_t b_row = static_cast<int32_t>(tile.group * kN + tile.n_block * kBlockN);
      const L2Policy b_policy{scheduler.b_readers() <= kStreamBMaxReaders, evict_first};
      const uint32_t scale_bytes = a_scale_bulk_bytes(scales, tile);
      const bool a_edge = kAKMajor && !kGrouped && edges.a_rows != 0 && tile.row0 + kBlockM > m;
      const bool b_edge = kBEdgeRows != 0 && tile.n_block == kNumNBlocks - 1;
      const CUtensorMap* map_a = a_edge ? edges.a : &tmap_a;
      const CUtensorMap* map_b = b_edge ? edges.b : &tmap_b;
      const uint32_t a_rows = a_edge ? edges.a_rows : a_box_rows;
      const uint32_t stage_tx_bytes = (kAKMajor ? kAOperandsPerStage * a_rows * kSmemRowBytes : kSmemABytesPerStage) +
                                      (b_edge ? kBEdgeRows * kSmemRowBytes : kSmemBBoxBytes);
#pragma unroll 1
      for (uint32_t k_block = tile.k_begin; k_block < tile.k_end; ++k_block) {
        // Parity flipped: the first pass over the ring finds every stage free.
        mbarrier_wait(smem.empty(state.stage), state.phase ^ 1);
        uint64_t* full = smem.full(state.stage);
        mbarrier_arrive_expect_tx(full, stage_tx_bytes + (kScaleWarpBulkA ? 0 : scale_bytes));
        if constexpr (kRawB) {
          const int32_t k_idx = static_cast<int32_t>(k_block * kBlockK);
          load_box(smem.a(state.stage), map_a, full, k_idx, a_row, L2Policy{});
          load_box(smem.a_lo(state.stage), map_a, full, k_idx + static_cast<int32_t>(kSegmentBlocks * kBlockK),
                   a_row, L2Policy{});
          load_box(smem.b(state.stage), map_b, full, k_idx, b_row, b_policy);
        } else {
          load_operand<kAKMajor, kBlockM>(smem.a(state.stage), map_a, full, hi_lo_column<true>(k_block), a_row, m);
          load_operand<kBKMajor, kBlockN>(smem.b(state.stage), map_b, full, hi_lo_column<false>(k_block), b_row, kN,
                                          b_policy);
        }
        if constexpr (kScaling == Scaling::kBlock && !kScaleWarpBulkA) {
          // a_stride_m is 1 (or M is 1 and row0 0) whenever scale_bytes is nonzero.
          if (scale_bytes != 0) {
            bulk_load(smem.stage_scales(state.stage), scales.a + tile.row0 + k_block * scales.a_stride_k, scale_bytes,
                      full);
          }
        }
        state.advance();
      }
    }
  }

  // One stage of an operand, kRows M / N indices from mn0 by kBlockK from k_idx. K-major: one box of the (rows, K)
  // map at (k_idx, mn0). MN-major: kRows / 64 boxes of the (K, rows) map, box j at (mn_box_col(mn0, j, extent),
  // k_idx) into the stage's j-th kMnBlockBytes block; `extent`: the operand's M / N (MN-major only). Boxes reaching
  // past the tensor (M / N / K tails) are zero-filled and count their full bytes, so kStageTxBytes holds for every
  // tile.
  template <bool kKMajor, uint32_t kRows>
  static DGJIT_DEVICE void load_operand(uint8_t* dst, const CUtensorMap* tmap, uint64_t* bar, int32_t k_idx,
                                        int32_t mn0, uint32_t extent, L2Policy l2 = {}) {
    if constexpr (kKMajor) {
      load_box(dst, tmap, bar, k_idx, mn0, l2);
    } else {
#pragma unroll
      for (uint32_t j = 0; j < kRows / kMnBlockElems; ++j) {
        load_box(dst + j * kMnBlockBytes, tmap, bar, mn_box_col(mn0, j, extent), k_idx, l2);
      }
    }
  }
  static DGJIT_DEVICE void load_box(uint8_t* dst, const CUtensorMap* tmap, uint64_t* bar, int32_t col, int32_t row,
                                    L2Policy l2) {
    if (l2.hinted) {
      tma_load_2d(dst, tmap, bar, col, row, l2.policy);
    } else {
      tma_load_2d(dst, tmap, bar, col, row);
    }
  }

  // M / N index of box j of an MN-major stage from mn0 (a multiple of 64, inside the tensor) in an operand of
  // `extent` M / N indices. A box that would lie wholly past the tensor (the last tile's boxes beyond its rows)
  // loads the tensor's last box instead (written when only partial boxes' zero fill had been seen on hardware; the
  // K-major cluster ranks past N now issue wholly out-of-bounds boxes, zero-filled, GPU-tested in session 59). What
  // it loads sits in rows / columns of the tile that no output element depends on (D[i][j] reads A row i and B
  // column j only; those are never stored).
  static DGJIT_DEVICE constexpr int32_t mn_box_col(int32_t mn0, uint32_t j, uint32_t extent) {
    const int32_t col = mn0 + static_cast<int32_t>(j * kMnBlockElems);
    const int32_t last = static_cast<int32_t>((extent - 1) / kMnBlockElems * kMnBlockElems);
    return col < last ? col : last;
  }

  // ---- consumer main loop: accumulate one tile over K ---------------------------------------------
  // Group g of wgmmas (one per K block) is committed, then we wait for group g-1 only: the tensor
  // cores always have the next batch queued while the previous stage is handed back to the producer.
  // From a consumer's K block to its next one in the ring (kWGSplitK: the other K lane's block lies between).
  static DGJIT_DEVICE void advance_k(State& state) {
    state.advance();
    if constexpr (kKStep == 2) state.advance();
  }

  static DGJIT_DEVICE void release_stage(const Smem& smem, uint32_t stage) {
    // One arrival per warp (empty barrier count kStageReaders), after this warp's wait_group.
    if (lane_idx() == 0) mbarrier_arrive(smem.empty(stage));
  }

  template <class T>
  static DGJIT_DEVICE void fence_accumulators(T (&acc)[kNumM64PerWG][kNumAccum]) {
#pragma unroll
    for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi)
#pragma unroll
      for (uint32_t i = 0; i < kNumAccum; ++i) fence_operand(acc[mi][i]);
  }

  // Where, inside a stage of an operand, the wgmma operand starting at M / N index `mn` (a multiple of 64) and K
  // step `k` (kMmaK elements) begins (the layouts at the top of this file): K-major, row mn and 32 bytes per K step
  // along the row; MN-major, block mn / 64 and 16 rows (2048 bytes) per K step.
  template <bool kKMajor>
  static DGJIT_DEVICE constexpr uint32_t operand_offset(uint32_t mn, uint32_t k) {
    return kKMajor ? mn * kSmemRowBytes + k * kMmaK * kInBytes
                   : (mn / kMnBlockElems) * kMnBlockBytes + k * kMmaK * 128;
  }
  template <bool kKMajor>
  static DGJIT_DEVICE constexpr uint64_t operand_desc(uint32_t smem_addr) {
    if constexpr (kKMajor) {
      return make_smem_desc_k_major<128>(smem_addr);
    } else {
      return make_smem_desc_mn_major<kMnBlockBytes>(smem_addr);
    }
  }

  // The wgmma descriptors of a stage whose A / B buffers start at shared addresses stage_a / stage_b: the base of
  // consumer math_wg's part of A (of B), computed once per stage, and the operand of K step k (of kMmaK) and m64
  // slice mi advanced from it. tests/test_mn_major_cpu.py checks both against a model of the hardware's reads
  // through static_asserts on these very functions.
  static DGJIT_DEVICE constexpr uint64_t desc_a_base(uint32_t stage_a, uint32_t math_wg) {
    return operand_desc<kAKMajor>(stage_a + operand_offset<kAKMajor>(wg_row_offset(math_wg), 0));
  }
  static DGJIT_DEVICE constexpr uint64_t desc_a_at(uint64_t base, uint32_t mi, uint32_t k) {
    return smem_desc_advance(base, operand_offset<kAKMajor>(mi * 64, k));
  }
  static DGJIT_DEVICE constexpr uint64_t desc_b_base(uint32_t stage_b) { return operand_desc<kBMmaKMajor>(stage_b); }
  static DGJIT_DEVICE constexpr uint64_t desc_b_at(uint64_t base, uint32_t k) {
    return smem_desc_advance(base, operand_offset<kBMmaKMajor>(0, k));
  }

  // The wgmmas of one K block from the operands at desc_a / desc_b (their bases, desc_a_base / desc_b_base) into
  // `acc`; the first K step overwrites when `accumulate` is false.
  template <class T>
  static DGJIT_DEVICE void issue_k_steps(T (&acc)[kNumM64PerWG][kNumAccum], uint64_t desc_a, uint64_t desc_b,
                                         bool accumulate) {
#pragma unroll
    for (uint32_t k = 0; k < kBlockK / kMmaK; ++k) {
      const uint32_t scale_d = (accumulate || k != 0) ? 1u : 0u;
#pragma unroll
      for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi) {
        // The trans immediates: 1 = the operand is MN-major in shared memory.
        Mma::template mma<kMmaKind, !kAKMajor, !kBMmaKMajor>(acc[mi], desc_a_at(desc_a, mi, k), desc_b_at(desc_b, k),
                                                          scale_d);
      }
    }
  }

  // The wgmmas of one K block (stage) into `acc`; the first K step overwrites when `accumulate` is false. kTransB:
  // from the stage's transposed B, once the converter warps announced it (lo_full, at the stage's `phase`).
  template <class T>
  static DGJIT_DEVICE void issue_k_block(const Smem& smem, uint32_t stage, uint32_t math_wg, bool accumulate,
                                         T (&acc)[kNumM64PerWG][kNumAccum], uint32_t phase = 0) {
    // kSwapAB: the wgmma's A operand (rows) is this consumer's 64 rows of the B stage, its B operand the A stage.
    const uint64_t desc_a = desc_a_base(shared_addr(kSwapAB ? smem.b(stage) : smem.a(stage)), math_wg);
    const uint64_t desc_b = desc_b_base(shared_addr(kSwapAB ? smem.a(stage) : (kTransB ? smem.b_lo(stage) : smem.b(stage))));
    if constexpr (kTransB) mbarrier_wait(smem.lo_full(stage), phase);
    fence_accumulators(acc);
    wgmma_fence();
    issue_k_steps(acc, desc_a, desc_b, accumulate);
    wgmma_commit_group();
    fence_accumulators(acc);
  }

  // Straight accumulation through K (16-bit, TF32, INT8, FP8 with fast_accum). `after_first_issue` runs
  // once the tile's first wgmmas are queued (the epilogue-operand prefetch, off the tensor cores' path).
  template <class Hook>
  static DGJIT_DEVICE void mainloop(const Smem& smem, State& state, uint32_t math_wg, const Tile& tile,
                                    TAcc (&acc)[kNumM64PerWG][kNumAccum], const Hook& after_first_issue) {
    uint32_t previous_stage = 0;
#pragma unroll 1
    for (uint32_t k_block = tile.k_begin; k_block < tile.k_end; k_block += kKStep) {
      mbarrier_wait(smem.full(state.stage), state.phase);
      // The tile's first K block overwrites stale accumulators from the previous tile.
      issue_k_block(smem, state.stage, math_wg, k_block != tile.k_begin, acc, state.phase);
      if (k_block == tile.k_begin) after_first_issue();
      if (k_block > tile.k_begin) {
        wgmma_wait_group<1>();
        release_stage(smem, previous_stage);
      }
      previous_stage = state.stage;
      advance_k(state);
    }
    wgmma_wait_group<0>();
    release_stage(smem, previous_stage);
    fence_accumulators(acc);
  }

  // ---- FP8 with promotion: per-K-block partial sums, scaled (kBlock) into FP32 accumulators ---------
  // (kMaxScaleBBlocks: the scale-B blocks a tile's columns can touch: one when 128 is a multiple of
  // kBlockN, so tiles never straddle a 128-column block, else up to ceil(kBlockN / 128) + 1.)
  static constexpr uint32_t kNumScaleBBlocks = (kN + 127) / 128;
  // K blocks per promotion: FP8 every block (128 K; block scales change per block), TF32 every 4 (128 K), kRawB
  // every 2 of its stages (2 x 3 x 32 = 192 products).
  static constexpr uint32_t kPromoteEvery = kIsFP8 ? 1 : (kRawB ? 2 : 4);
  static_assert(!kWGSplitK || kPromoteEvery == 1 || !kPromote, "K lanes step over single K blocks");

  struct BlockScales {
    float a[kNumM64PerWG][2];     // this thread's two rows per m64 slice
    float b[kMaxScaleBBlocks];    // the tile's 128-column blocks, from its first column's block on
  };
  static DGJIT_DEVICE void fence_scales(BlockScales& sc) {
#pragma unroll
    for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi) {
      fence_operand(sc.a[mi][0]);
      fence_operand(sc.a[mi][1]);
    }
#pragma unroll
    for (uint32_t i = 0; i < kMaxScaleBBlocks; ++i) fence_operand(sc.b[i]);
  }

  // Producer side (warp 1 of the producer warpgroup): copy each stage's scales into shared memory, in
  // the same tile / K-block order as the TMA producer: the B blocks always, the A scales of the tiles whose
  // a_scale_bulk_bytes is 0, and the others' as one bulk copy where kScaleWarpBulkA (else the TMA thread issues it;
  // the bulk copy completes on the full barrier by its bytes). The other copies are cp.async with a deferred arrival
  // on the stage's full barrier (one per lane, also when a lane copies nothing: the barrier's count is fixed), so
  // the warp runs ahead through the ring instead of waiting out a global-memory round trip per K block (which
  // capped the kernel when it did).
  static constexpr uint32_t kScaleWarpArrivals = 32;
  template <bool kWalkSplits>
  static DGJIT_DEVICE void produce_scales(const Smem& smem, const ScaleArgs& scales, uint32_t m,
                                         const GroupArgs& ga, const SplitArgs& sk) {
    Walk<kWalkSplits> scheduler(m, ga, sk);
    State state;
    Tile tile;
    const uint32_t lane = lane_idx();
    while (scheduler.next(tile)) {
      const uint32_t first_b = tile.n_block * kBlockN / 128;
      const uint32_t group_b = tile.group * kNumScaleBBlocks;  // B_g's blocks in the stacked scales
      const uint32_t a_bulk_bytes = a_scale_bulk_bytes(scales, tile);
      const bool copies_a = a_bulk_bytes == 0;
#pragma unroll 1
      for (uint32_t k_block = tile.k_begin; k_block < tile.k_end; ++k_block) {
        mbarrier_wait(smem.empty(state.stage), state.phase ^ 1);
        const uint32_t dst = smem.stage_scales(state.stage);
        if (kScaleWarpBulkA && !copies_a && lane == 0) {
          // Announced before this lane's (deferred) arrival below, so the phase cannot complete without the bytes.
          uint64_t* full = smem.full(state.stage);
          mbarrier_expect_tx(full, a_bulk_bytes);
          bulk_load(dst, scales.a + tile.row0 + k_block * scales.a_stride_k, a_bulk_bytes, full);
        }
        if (copies_a) {
#pragma unroll
          for (uint32_t r = lane; r < kBlockM; r += 32) {
            const uint32_t row = tile.row0 + r;
            cp_async_4(dst + 4 * r,
                       scales.a + (row < m ? row : m - 1) * scales.a_stride_m + k_block * scales.a_stride_k);
          }
        }
        if (lane < kMaxScaleBBlocks) {
          const uint32_t blk = first_b + lane < kNumScaleBBlocks ? first_b + lane : kNumScaleBBlocks - 1;
          cp_async_4(dst + 4 * (kBlockM + lane),
                     scales.b + (group_b + blk) * scales.b_stride_n + k_block * scales.b_stride_k);
        }
        cp_async_mbarrier_arrive_noinc(smem.full(state.stage));
        state.advance();
      }
    }
    cp_async_wait_all();  // shared memory must outlive the copies in flight
  }

  // Consumer side: this thread's row scales and the tile's B blocks, from the stage's slot (the full
  // barrier's acquire made them visible). `row_byte` (scale_row_byte) is fixed per thread, so no index math
  // or shuffle runs per K block. Volatile loads: they stay behind the K block's wgmma issue (volatile asm
  // too) instead of being scheduled between its wgmmas, where each load's latency delayed the next issue.
  static DGJIT_DEVICE uint32_t scale_row_byte(uint32_t math_wg) {
    return 4 * (wg_row_offset(math_wg) + warp_idx_in_warpgroup() * 16 + lane_idx() / 4);
  }
  static DGJIT_DEVICE void read_block_scales(BlockScales& out, const Smem& smem, uint32_t stage, uint32_t row_byte) {
    const uint32_t base = smem.stage_scales(stage);
#pragma unroll
    for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi)
#pragma unroll
      for (uint32_t h = 0; h < 2; ++h) out.a[mi][h] = ld_shared_f32(base + row_byte + 4 * (mi * 64 + 8 * h));
#pragma unroll
    for (uint32_t i = 0; i < kMaxScaleBBlocks; ++i) out.b[i] = ld_shared_f32(base + 4 * (kBlockM + i));
  }

  // acc += part, or for kBlock acc += part x (A row scale x B block scale) of the K block. A thread's
  // accumulators come in groups of 8 columns (j); which of the tile's B blocks group j falls in depends on
  // where the tile starts inside its 128-column block, kOff groups of 8 in. That is a compile-time argument
  // (mainloop_promoted picks the K loop compiled for the tile's value), so each accumulator costs one FFMA and each K block only
  // 2 x kMaxScaleBBlocks products: computing the block per group at run time made 128x160 tiles issue 1.8x
  // the instructions of the per-tensor kernel and run at 62% tensor-pipe activity (ncu, docs/NOTES.md).
  template <uint32_t kOff>
  static DGJIT_DEVICE void promote_at(float (&acc)[kNumM64PerWG][kNumAccum], const float (&part)[kNumM64PerWG][kNumAccum],
                                      const BlockScales& cur) {
#pragma unroll
    for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi) {
      float s[2][kMaxScaleBBlocks];
#pragma unroll
      for (uint32_t h = 0; h < 2; ++h)
#pragma unroll
        for (uint32_t bi = 0; bi < kMaxScaleBBlocks; ++bi) s[h][bi] = cur.a[mi][h] * cur.b[bi];
#pragma unroll
      for (uint32_t j = 0; j < kBlockN / 8; ++j) {
        const uint32_t blk = (8 * kOff + 8 * j) / 128;  // a constant once the loop is unrolled
#pragma unroll
        for (uint32_t h = 0; h < 2; ++h)
#pragma unroll
          for (uint32_t e = 0; e < 2; ++e) {
            const uint32_t i = 4 * j + 2 * h + e;
            acc[mi][i] = fmaf(part[mi][i], s[h][blk], acc[mi][i]);
          }
      }
    }
  }

  // acc += part (x the K block's scales for kBlock, B blocks placed by kOff as in promote_at).
  template <uint32_t kOff>
  static DGJIT_DEVICE void promote(float (&acc)[kNumM64PerWG][kNumAccum], const float (&part)[kNumM64PerWG][kNumAccum],
                                   const BlockScales& cur) {
    if constexpr (kScaling == Scaling::kBlock) {
      promote_at<kOff>(acc, part, cur);
    } else {
#pragma unroll
      for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi)
#pragma unroll
        for (uint32_t i = 0; i < kNumAccum; ++i) acc[mi][i] += part[mi][i];
    }
  }

  // Tiles without kTwoPartialSets (below): one partial set, waited for (wait_group 0) before each promotion.
  // Tried and measured (docs/NOTES.md): the two consumers taking turns (named barriers, one promotes while the
  // other's wgmmas run): 23% slower per-tensor, block unchanged.
  //
  // kBlock: the offsets (in 8-column groups) a tile can start at inside a 128-column scale block are multiples
  // of gcd(kBlockN, 128) / 8, only 0 when tiles never straddle (128 % kBlockN == 0 or kBlockN % 128 == 0). The
  // K loop is compiled once per offset (mainloop_promoted_at<kOff>) and chosen once per tile, so the promotion
  // has no per-K-block branch.
  static constexpr uint32_t kScaleOffStep =
      (kScaling != Scaling::kBlock || kBlockN % 128 == 0 || 128 % kBlockN == 0) ? 16
      : (kBlockN % 64 == 0 ? 8 : kBlockN % 32 == 0 ? 4 : kBlockN % 16 == 0 ? 2 : 1);
  template <class Hook, uint32_t kOff = 0>
  static DGJIT_DEVICE void mainloop_promoted(const Smem& smem, State& state, uint32_t math_wg, const Tile& tile,
                                             float (&acc)[kNumM64PerWG][kNumAccum], const Hook& after_first_issue) {
    if constexpr (kOff + kScaleOffStep >= 16) {
      mainloop_promoted_at<kOff>(smem, state, math_wg, tile, acc, after_first_issue);  // the last offset left
    } else if ((tile.n_block * kBlockN) % 128 / 8 == kOff) {
      mainloop_promoted_at<kOff>(smem, state, math_wg, tile, acc, after_first_issue);
    } else {
      mainloop_promoted<Hook, kOff + kScaleOffStep>(smem, state, math_wg, tile, acc, after_first_issue);
    }
  }

  // Two partial sets (promoted FP8): K block i + 1's wgmmas are queued into the second set before K block i's set
  // is waited for and promoted, so the tensor cores run while the FP32 adds (and the stage's release) do; with one
  // set every K block waited for its own wgmmas to drain. Measured on the H200 (session 18, bitwise equal): FP8
  // per-tensor 4096x4096x7168 (128x128) 177 -> 165 us, fused quant_fp8_g128 (128x128) 3-9% faster, FP8 block
  // 128x7168x16384 (64x128) 43.2 -> 40.2 us; 64x32 / 64x64 decode tiles within +-2%. The second set costs
  // kNumM64PerWG x kNumAccum registers, so tiles with more than 64 accumulators per thread (128x176 ...) keep one;
  // kWGSplitK tiles have two chains already (the K lanes). sm90_tiles.sm90_two_partial_sets mirrors the rule.
  static constexpr bool kTwoPartialSets = kIsFP8 && kPromote && !kWGSplitK && kNumM64PerWG * kNumAccum <= 64;

  // The promoted K loop of kTwoPartialSets kernels (called by mainloop_promoted_at, which zeroed acc).
  template <uint32_t kOff, class Hook>
  static DGJIT_DEVICE void mainloop_two_partial_sets(const Smem& smem, State& state, uint32_t math_wg,
                                                     const Tile& tile, uint32_t k_end,
                                                     float (&acc)[kNumM64PerWG][kNumAccum],
                                                     const Hook& after_first_issue) {
    static_assert(kPromoteEvery == 1 && kKStep == 1, "one promotion per K block, every K block this consumer's");
    if (tile.k_begin >= k_end) return;
    const uint32_t row_byte = kScaling == Scaling::kBlock ? scale_row_byte(math_wg) : 0;
    float part0[kNumM64PerWG][kNumAccum], part1[kNumM64PerWG][kNumAccum];
    BlockScales scales0, scales1;
    uint32_t stage0 = 0, stage1 = 0;
    // Queue the next K block's wgmmas into `part` (its stage into `stage`), then read its scales (they load while
    // the wgmmas run).
    auto issue = [&](float (&part)[kNumM64PerWG][kNumAccum], BlockScales& sc, uint32_t& stage) {
      mbarrier_wait(smem.full(state.stage), state.phase);
      issue_k_block(smem, state.stage, math_wg, false, part);
      if constexpr (kScaling == Scaling::kBlock) read_block_scales(sc, smem, state.stage, row_byte);
      stage = state.stage;
      advance_k(state);
    };
    // A K block's set (`part`, its stage and scales): once its wgmmas are done (`queued`: the next K block's are
    // queued behind them), hand the stage back and add the set into acc.
    auto retire = [&](float (&part)[kNumM64PerWG][kNumAccum], const BlockScales& sc, uint32_t stage, bool queued) {
      if (queued) {
        wgmma_wait_group<1>();
      } else {
        wgmma_wait_group<0>();
      }
      release_stage(smem, stage);
      fence_accumulators(part);
      promote<kOff>(acc, part, sc);
    };
    issue(part0, scales0, stage0);
    after_first_issue();
    // Steady state: no branch between a set's issue and the wait that retires the other set (ptxas serialised
    // the wgmmas (C7514) when the wait's group count depended on a branch); the tail's two ways out are needed
    // too (a straight tail was flagged as well: docs/experiments/c7514_loop_shapes.py).
    uint32_t k_block = tile.k_begin;
#pragma unroll 1
    for (; k_block + 2 < k_end; k_block += 2) {
      issue(part1, scales1, stage1);
      retire(part0, scales0, stage0, true);
      issue(part0, scales0, stage0);
      retire(part1, scales1, stage1, true);
    }
    if (k_block + 1 < k_end) {
      issue(part1, scales1, stage1);
      retire(part0, scales0, stage0, true);
      retire(part1, scales1, stage1, false);
    } else {
      retire(part0, scales0, stage0, false);
    }
  }

  // Half sets (promoted per-tensor / per-row FP8 tiles too wide for kTwoPartialSets, one m64 slice per consumer):
  // each K block's wgmmas are issued as two halves of kBlockN / 2 columns into their own partial sets, and one half
  // is added into the accumulators while the other's wgmmas (or the next K block's first half) run. Registers as
  // with one set (two halves of one set's size); A is read twice per K block. Same additions in the same order as
  // one set: bitwise equal. Measured (docs/NOTES.md, session 19): per-tensor 128x176 4096x7168x16384 2.4% faster,
  // per-row 1.4%; block scaling 1% SLOWER (its per-group FFMAs with the scale products), so kBlock keeps one set.
  // kSwapAB: the halves split the wgmmas' N (the tile's rows), the first rounded up to a multiple of 8 (152 rows:
  // 80 + 72), so any swapped tile of 16 rows or more has them. Not with an epilogue (session 52, the bias read in
  // the epilogue): FP8 bias+gelu halves / one set, us: 4096x2112x7168 (128x176) 94.4 / 94.2, 4096x7168x16384 675.4 /
  // 676.3, swapped 136x128 at 1050x4096x7168 53.0 / 53.3 (per-row 52.7 / 51.7); before that fix halves lost 4-12%.
  static constexpr uint32_t kHalfN0 = kSwapAB ? (kMmaCols / 2 + 7) / 8 * 8 : kBlockN / 2;
  static constexpr uint32_t kHalfN1 = kMmaCols - kHalfN0;
  static constexpr bool kHalfSets = kIsFP8 && kPromote && kScaling != Scaling::kBlock && !kWGSplitK &&
                                    !kTwoPartialSets && kNumM64PerWG == 1 &&
                                    (kSwapAB ? kHalfN1 >= 8 : (kBlockN / 2) % 8 == 0) && !kHasEpilogue;
  template <uint32_t kHalf>
  static constexpr uint32_t kHalfAccum = (kHalf == 0 ? kHalfN0 : kHalfN1) / 2;

  // Half `kHalf` of a K block's wgmmas into `part`: B rows [kHalf kHalfN0, ...) of the stage (kSwapAB: A rows, with
  // this consumer's 64 B rows as the instruction's A).
  template <uint32_t kHalf>
  static DGJIT_DEVICE void issue_half(const Smem& smem, uint32_t stage, uint32_t math_wg,
                                      float (&part)[kHalfAccum<kHalf>]) {
    const uint64_t desc_a = desc_a_base(shared_addr(kSwapAB ? smem.b(stage) : smem.a(stage)), math_wg);
    const uint64_t desc_b = desc_b_base(shared_addr(kSwapAB ? smem.a(stage) : smem.b(stage)));
#pragma unroll
    for (uint32_t i = 0; i < kHalfAccum<kHalf>; ++i) fence_operand(part[i]);
    wgmma_fence();
#pragma unroll
    for (uint32_t k = 0; k < kBlockK / kMmaK; ++k) {
      WgmmaM64<kHalf == 0 ? kHalfN0 : kHalfN1>::template mma<kMmaKind, false, false>(
          part, desc_a_at(desc_a, 0, k),
          smem_desc_advance(desc_b, operand_offset<true>(kHalf * kHalfN0, k)), k != 0 ? 1u : 0u);  // (K-major)
    }
    wgmma_commit_group();
#pragma unroll
    for (uint32_t i = 0; i < kHalfAccum<kHalf>; ++i) fence_operand(part[i]);
  }

  // acc's columns of half `kHalf` += part, once its wgmmas have been waited for.
  template <uint32_t kHalf>
  static DGJIT_DEVICE void add_half(float (&acc)[kNumM64PerWG][kNumAccum], float (&part)[kHalfAccum<kHalf>]) {
#pragma unroll
    for (uint32_t i = 0; i < kHalfAccum<kHalf>; ++i) fence_operand(part[i]);
#pragma unroll
    for (uint32_t i = 0; i < kHalfAccum<kHalf>; ++i) acc[0][kHalf * kHalfAccum<0> + i] += part[i];
  }

  template <class Hook>
  static DGJIT_DEVICE void mainloop_half_sets(const Smem& smem, State& state, uint32_t math_wg, const Tile& tile,
                                              uint32_t k_end, float (&acc)[kNumM64PerWG][kNumAccum],
                                              const Hook& after_first_issue) {
    static_assert(kPromoteEvery == 1 && kKStep == 1, "one promotion per K block, every K block this consumer's");
    if (tile.k_begin >= k_end) return;
    float lo[kHalfAccum<0>], hi[kHalfAccum<1>];
    mbarrier_wait(smem.full(state.stage), state.phase);
    issue_half<0>(smem, state.stage, math_wg, lo);
    after_first_issue();
    uint32_t stage = state.stage;
    advance_k(state);
    uint32_t k_block = tile.k_begin;
    // Each wait follows an issue of the same iteration: with both halves of a K block carried across the loop's
    // back edge, ptxas could not tell which one a wait_group 1 retires and serialised the wgmmas (C7514).
#pragma unroll 1
    for (; k_block + 1 < k_end; ++k_block) {  // lo of k_block in flight
      issue_half<1>(smem, stage, math_wg, hi);
      wgmma_wait_group<1>();  // lo of k done, hi of k running
      add_half<0>(acc, lo);
      mbarrier_wait(smem.full(state.stage), state.phase);
      issue_half<0>(smem, state.stage, math_wg, lo);  // lo of k + 1 behind hi of k
      wgmma_wait_group<1>();  // hi of k done
      release_stage(smem, stage);
      add_half<1>(acc, hi);
      stage = state.stage;
      advance_k(state);
    }
    // The loop leaves exactly one K block (its lo in flight), so the else arm never runs; ptxas needs a second way
    // out of the loop here to see which group each wait retires: without it, it serialised the wgmmas (C7514).
    // A reduced kernel of this loop compiled clean with this tail and flagged without it (session 18).
    if (k_block < k_end) {
      issue_half<1>(smem, stage, math_wg, hi);
      wgmma_wait_group<1>();
      add_half<0>(acc, lo);
      wgmma_wait_group<0>();
      release_stage(smem, stage);
      add_half<1>(acc, hi);
    } else {
      wgmma_wait_group<0>();
    }
  }

  // kBlock without a fused epilogue: the next K block's scales are read ahead (below). Kernels with epilogues keep
  // reading each K block's scales next to its issue: holding a second set of scales next to the bias registers and
  // the activation's constants made ptxas spill 8-48 bytes (128x176 bias+gelu, bias+swiglu, bias_row+gelu, grouped
  // and dense; session 8).
  static constexpr bool kBlockScalesAhead = kScaling == Scaling::kBlock && !kHasEpilogue;

  // The promoted K loop of kBlockScalesAhead kernels (called by mainloop_promoted_at, which zeroed acc).
  template <uint32_t kOff, class Hook>
  static DGJIT_DEVICE void mainloop_block_scales_ahead(const Smem& smem, State& state, uint32_t math_wg,
                                                       const Tile& tile, uint32_t k_end,
                                                       float (&acc)[kNumM64PerWG][kNumAccum],
                                                       const Hook& after_first_issue) {
    static_assert(kPromoteEvery == 1, "block scales change every K block");
    const uint32_t row_byte = scale_row_byte(math_wg);
    float part[kNumM64PerWG][kNumAccum];
    // The scales of K block i + 1 are read while K block i's wgmmas run (its stage waited for right after the
    // issue), so the products of the promotion never wait on a shared-memory load between two wgmma issues:
    // read next to the issue, ptxas hoisted the loads and products between the K block's QGMMAs, where each
    // product stalled the next issue (ncu, session 8: 3.9k of the kernel's 70k stall samples on those FMULs).
    BlockScales cur, next;
    mbarrier_wait(smem.full(state.stage), state.phase);
#pragma unroll 1
    for (uint32_t k_block = tile.k_begin; k_block < k_end; k_block += kKStep) {
      issue_k_block(smem, state.stage, math_wg, false, part);
      if (k_block == tile.k_begin) {
        after_first_issue();
        read_block_scales(cur, smem, state.stage, row_byte);
      }
      State upcoming = state;
      advance_k(upcoming);
      if (k_block + kKStep < k_end) {
        mbarrier_wait(smem.full(upcoming.stage), upcoming.phase);
        read_block_scales(next, smem, upcoming.stage, row_byte);
      }
      wgmma_wait_group<0>();
      release_stage(smem, state.stage);
      fence_accumulators(part);
      promote<kOff>(acc, part, cur);
      cur = next;
      state = upcoming;
    }
  }

  // ---- kRawB: B_lo beside the wgmmas ------------------------------------------------------------------
  // The converter warps follow the ring as the consumers do: for every stage, once TMA has filled it, they write
  // B_lo = x - trunc(x) of its raw B block into the stage's B_lo slot (16-byte chunks, elementwise: the slot has
  // the raw block's 128-byte swizzle, so the wgmma descriptors match), fence those generic-proxy writes for the
  // wgmmas (async proxy), and each warp arrives once on lo_full (count kConverterWarps) and once on empty (the raw
  // block is read: empty counts kStageReaders + kConverterWarps). The slot is next written after the stage's next
  // TMA fill, which waits for the consumers' release of this use.
  // The difference is exact; the wgmma then drops B_lo's lowest 2 of up to 13 significant bits (truncation, where
  // the first form rounded to nearest: 4 instructions per element instead of ~15, which left 3 converter warps
  // 2-3x slower than the wgmmas at 64x168; the error of 16x256x16384 products moves from 1.1e-7 to 1.4e-7 in a
  // float64 model). Non-finite elements get lo = 0 (inf - inf would be NaN; their hi carries them).
  static DGJIT_DEVICE uint32_t tf32_lo_of_truncated(uint32_t bits) {
    const float lo = sub_rn(__uint_as_float(bits), __uint_as_float(bits & 0xFFFFE000u));
    return lo == lo ? __float_as_uint(lo) : 0u;
  }
  // Converter thread index: producer warps 1-3 first, then the idle warpgroup (64-row tiles).
  static DGJIT_DEVICE uint32_t converter_thread() {
    const uint32_t producer_first = kProducerWG * kWarpgroupThreads + 32;
    return threadIdx.x >= producer_first ? threadIdx.x - producer_first : 96 + threadIdx.x - kWarpgroupThreads;
  }
  template <bool kWalkSplits>
  static DGJIT_DEVICE void convert_lo(const Smem& smem, uint32_t m, const GroupArgs& ga, const SplitArgs& sk) {
    constexpr uint32_t kThreads = kConverterWarps * 32;
    constexpr uint32_t kChunks = kSmemBBoxBytes / 16;
    const uint32_t t = converter_thread();
    Walk<kWalkSplits> scheduler(m, ga, sk);
    State state;
    Tile tile;
    while (scheduler.next(tile)) {
#pragma unroll 1
      for (uint32_t k_block = tile.k_begin; k_block < tile.k_end; ++k_block) {
        mbarrier_wait(smem.full(state.stage), state.phase);
        const uint32_t raw = shared_addr(smem.b(state.stage));
        const uint32_t lo = shared_addr(smem.b_lo(state.stage));
#pragma unroll 4
        for (uint32_t i = t; i < kChunks; i += kThreads) {
          const uint4 v = ld_shared_v4_b32(raw + 16 * i);
          st_shared_v4_b32(lo + 16 * i, tf32_lo_of_truncated(v.x), tf32_lo_of_truncated(v.y),
                           tf32_lo_of_truncated(v.z), tf32_lo_of_truncated(v.w));
        }
        fence_proxy_async_shared();
        __syncwarp();
        if (lane_idx() == 0) {
          mbarrier_arrive(smem.lo_full(state.stage));
          mbarrier_arrive(smem.empty(state.stage));
        }
        state.advance();
      }
    }
  }

  // ---- kTransB: B transposed beside the wgmmas ----------------------------------------------------------
  // The converter warps take the ring's stages in turn (warp w converts the K blocks w, w + kConverterWarps, ... of
  // the walk, each stage whole, so that kConverterWarps stages are in conversion at once: one warp's pass over a
  // stage, wait and fence included, was longer than a stage's TMA time at small M; all warps converting every
  // stage together ran 1x4096x7168 at 64.0 us, one warp per stage in turn at 45.9): once TMA has filled the stage,
  // the warp reads its raw B block (kBlockN / 32 boxes of 32 K rows x 32 FP32 columns, 128-byte swizzle: element
  // (k, n) of box n / 32 at k * 128 + (((n % 32) / 4) ^ (k % 8)) * 16 + (n % 4) * 4) and writes it K-major into the
  // stage's second B slot (row n at n * 128, its K elements 4c..4c+3 in chunk c ^ (n % 8): what a K-major TMA box
  // with the 128-byte swizzle holds), fences the writes for the wgmmas and arrives once on lo_full and once on empty
  // (counts 1 and kStageReaders + 1). One 16-byte chunk (n, c) per lane and step, the 32 lanes on 32 consecutive n
  // of one c: each 4-byte read spans one 128-byte row of a box and the 16-byte writes eight rows' distinct chunks,
  // both free of bank conflicts; two steps' eight reads go out before their two writes.
  static constexpr uint32_t kTransBArrivals = 1;
  template <bool kWalkSplits>
  static DGJIT_DEVICE void transpose_b(const Smem& smem, uint32_t m, const GroupArgs& ga, const SplitArgs& sk) {
    constexpr uint32_t kSteps = kBlockN * 8 / 32;  // per lane: kBlockN rows x 8 chunks of the K-major slot
    static_assert(kSteps % 2 == 0, "two steps per batch");
    static_assert(kSmemBBoxBytes % 1024 == 0 && kMnBlockBytes % 1024 == 0,
                  "raw and K-major slots on the swizzle repeat");
    const uint32_t warp = converter_thread() / 32;
    const uint32_t lane = lane_idx();
    Walk<kWalkSplits> scheduler(m, ga, sk);
    State state;
    Tile tile;
    uint32_t turn = 0;
    while (scheduler.next(tile)) {
#pragma unroll 1
      for (uint32_t k_block = tile.k_begin; k_block < tile.k_end; ++k_block) {
        // Every warp waits for every stage in ring order, converted by it or not: a warp that skipped a stage could
        // otherwise wait on a full barrier a whole phase behind, whose parity the wait cannot tell apart (the
        // stage's previous use not yet landed). The waits of stages already filled return at once.
        mbarrier_wait(smem.full(state.stage), state.phase);
        if (turn == warp) {
          // Step s of a lane: column n = (s / 8) * 32 + lane (box s / 8, row lane of its 32), chunk c = s % 8 (K rows
          // 4c..4c+3). Both slots are 1024-byte aligned, so each swizzle XOR touches only address bits 4-6 of a
          // per-lane base, and every other term is a compile-time offset: per stage, 8 XORs serve all the reads
          // (one per k % 8) and one per write; before, the address arithmetic of each element took ~60 ALU
          // instructions per two steps and left the converter warps the slowest stage of the ring (ncu, session 29).
          const uint32_t src = shared_addr(smem.b(state.stage)) + lane * 4;  // row k = 0 of column lane
          const uint32_t dst = shared_addr(smem.b_lo(state.stage)) + lane * 128 + (lane % 8) * 16;
          uint32_t src_q[8];  // element (k, lane) of box 0, less k * 128, for k % 8 = q
#pragma unroll
          for (uint32_t q = 0; q < 8; ++q) src_q[q] = src ^ (q * 16);
#pragma unroll
          for (uint32_t step = 0; step < kSteps; step += 2) {
            uint32_t v[2][4];
#pragma unroll
            for (uint32_t h = 0; h < 2; ++h) {
              const uint32_t box = (step + h) / 8, c = (step + h) % 8;
#pragma unroll
              for (uint32_t j = 0; j < 4; ++j) {
                const uint32_t k = 4 * c + j;
                v[h][j] = __float_as_uint(ld_shared_f32(src_q[k % 8] + box * kMnBlockBytes + k * 128));
              }
            }
#pragma unroll
            for (uint32_t h = 0; h < 2; ++h) {
              const uint32_t box = (step + h) / 8, c = (step + h) % 8;
              st_shared_v4_b32((dst ^ (c * 16)) + box * 32 * 128, v[h][0], v[h][1], v[h][2], v[h][3]);
            }
          }
          fence_proxy_async_shared();
          __syncwarp();
          if (lane == 0) {
            mbarrier_arrive(smem.lo_full(state.stage));
            mbarrier_arrive(smem.empty(state.stage));
          }
        }
        turn = turn + 1 == kConverterWarps ? 0 : turn + 1;
        state.advance();
      }
    }
  }

  // kRawB: the three products of one stage into `part` (the first wgmma overwrites when `accumulate` is false):
  // (A_hi, B) and (A_lo, B) as soon as TMA filled the stage (the caller waited on full), then (A_hi, B_lo) once the
  // converter warps have written B_lo.
  static DGJIT_DEVICE void issue_raw_b_block(const Smem& smem, const State& state, uint32_t math_wg, bool accumulate,
                                             float (&part)[kNumM64PerWG][kNumAccum]) {
    const uint64_t desc_a_hi = desc_a_base(shared_addr(smem.a(state.stage)), math_wg);
    const uint64_t desc_a_lo = desc_a_base(shared_addr(smem.a_lo(state.stage)), math_wg);
    const uint64_t desc_b = desc_b_base(shared_addr(smem.b(state.stage)));
    const uint64_t desc_b_lo = desc_b_base(shared_addr(smem.b_lo(state.stage)));
    fence_accumulators(part);
    wgmma_fence();
    issue_k_steps(part, desc_a_hi, desc_b, accumulate);
    issue_k_steps(part, desc_a_lo, desc_b, true);
    mbarrier_wait(smem.lo_full(state.stage), state.phase);
    wgmma_fence();  // (what ptxas would inject after the wait, C7519)
    issue_k_steps(part, desc_a_hi, desc_b_lo, true);
    wgmma_commit_group();
    fence_accumulators(part);
  }

  template <uint32_t kOff, class Hook>
  static DGJIT_DEVICE void mainloop_promoted_at(const Smem& smem, State& state, uint32_t math_wg, const Tile& tile,
                                                float (&acc)[kNumM64PerWG][kNumAccum], const Hook& after_first_issue) {
#pragma unroll
    for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi)
#pragma unroll
      for (uint32_t i = 0; i < kNumAccum; ++i) acc[mi][i] = 0.0f;
    // The trip count is hidden from the optimiser: with it known, NVVM unrolls this loop completely
    // despite the pragma (K = 16384 gave 512 QGMMAs and minutes of compile time).
    uint32_t k_end = tile.k_end;
    asm volatile("" : "+r"(k_end));
    if constexpr (kTwoPartialSets) {
      mainloop_two_partial_sets<kOff>(smem, state, math_wg, tile, k_end, acc, after_first_issue);
    } else if constexpr (kHalfSets) {
      mainloop_half_sets(smem, state, math_wg, tile, k_end, acc, after_first_issue);
    } else if constexpr (kBlockScalesAhead) {
      mainloop_block_scales_ahead<kOff>(smem, state, math_wg, tile, k_end, acc, after_first_issue);
    } else {
      // FP8: one K block (128) per promotion, its scales applied there. TF32: up to kPromoteEvery blocks (128 K
      // elements) accumulate in the tensor cores first, pipelined like the plain main loop (each wait leaves the
      // newest group running), so that the promotion's full wait and adds come once per 128 K as for FP8.
      float part[kNumM64PerWG][kNumAccum];
      const uint32_t row_byte = kScaling == Scaling::kBlock ? scale_row_byte(math_wg) : 0;
#pragma unroll 1
      for (uint32_t k_first = tile.k_begin; k_first < k_end; k_first += kPromoteEvery * kKStep) {
        BlockScales cur;
        uint32_t previous_stage = 0;
#pragma unroll
        for (uint32_t j = 0; j < kPromoteEvery; ++j) {
          if (j > 0 && k_first + j >= k_end) break;
          mbarrier_wait(smem.full(state.stage), state.phase);
          if constexpr (kRawB) {
            issue_raw_b_block(smem, state, math_wg, j != 0, part);
          } else {
            issue_k_block(smem, state.stage, math_wg, j != 0, part);
          }
          if (j == 0 && k_first == tile.k_begin) after_first_issue();
          // The stage's scales are read while its wgmmas run (the stage is released only after them).
          if constexpr (kScaling == Scaling::kBlock) read_block_scales(cur, smem, state.stage, row_byte);
          if (j > 0) {
            wgmma_wait_group<1>();
            release_stage(smem, previous_stage);
          }
          previous_stage = state.stage;
          advance_k(state);
        }
        wgmma_wait_group<0>();
        release_stage(smem, previous_stage);
        fence_accumulators(part);
        // Meant to keep the scales' products after the wait (next to their loads, between the K block's wgmmas,
        // each product stalls the remaining wgmma issues on the loads' latency). NVVM honours it, but ptxas still
        // hoists the FMULs (SASS of 128x128 and 128x176, session 6); kept because the GPU-verified tree has it.
        if constexpr (kScaling == Scaling::kBlock) fence_scales(cur);
        promote<kOff>(acc, part, cur);
      }
    }
  }

  // ---- kRow: stage a tile's row and column scales (asynchronously, during its main loop) ----------
  // The copies of a tile are issued before the loop over tiles (the first) and after the previous tile's epilogue
  // (the others), never between the tile's start and its main loop: there, the copies' per-thread addresses made
  // ptxas compute the main loop's stage addresses per thread (IMAD + R2UR for every wgmma operand instead of
  // uniform registers): +24% instructions and 716 against 655 us for per-tensor scaling at 128x176,
  // 4096x7168x16384 (ncu, session 7). After the epilogue's last barrier every thread of the consumer has read the
  // previous tile's scales, so the buffer is free.
  static DGJIT_DEVICE void stage_row_scales(const Smem& smem, const ScaleArgs& scales, uint32_t math_wg,
                                            uint32_t m, const Tile& tile) {
    const uint32_t t = threadIdx.x % kWarpgroupThreads;
    const uint32_t row0 = tile.row0 + (kSwapAB ? 0 : wg_row_offset(math_wg));
    const uint32_t col0 = tile.n_block * kBlockN + (kSwapAB ? 64 * math_wg : 0);
#pragma unroll
    for (uint32_t j = 0; j < (kScaleRowsPerWG + kWarpgroupThreads - 1) / kWarpgroupThreads; ++j) {
      const uint32_t i = t + j * kWarpgroupThreads;
      const uint32_t row = row0 + i < m ? row0 + i : m - 1;
      cp_async_4_if(i < kScaleRowsPerWG, shared_addr(smem.row_scales(math_wg) + i),
                    scales.a + row * scales.a_stride_m);
    }
#pragma unroll
    for (uint32_t j = 0; j < (kScaleColsPerWG + kWarpgroupThreads - 1) / kWarpgroupThreads; ++j) {
      const uint32_t i = t + j * kWarpgroupThreads;
      const uint32_t col = col0 + i < kN ? col0 + i : kN - 1;
      cp_async_4_if(i < kScaleColsPerWG, shared_addr(smem.col_scales(math_wg) + i),
                    scales.b + col * scales.b_stride_n);
    }
    cp_async_commit_group();
  }

  // The scales of this consumer's next tile, if any: `peek` is a copy of the walk, `skip` the other consumer's
  // tiles in between (ping-pong: they alternate).
  template <class Sched>
  static DGJIT_DEVICE void stage_next_row_scales(const Smem& smem, const ScaleArgs& scales, uint32_t math_wg,
                                                 uint32_t m, Sched peek, uint32_t skip) {
    Tile next;
    for (uint32_t i = 0; i < skip; ++i) {
      if (!peek.next(next)) return;
    }
    if (peek.next(next)) stage_row_scales(smem, scales, math_wg, m, next);
  }

  // ---- epilogue operands: the bias through shared memory, C and the residual by TMA --------------
  static constexpr uint32_t kBiasPerThread = (kBiasFloatsPerWG + kWarpgroupThreads - 1) / kWarpgroupThreads;
  // Length of the bias register arrays: kBiasPerThread, at least 1 (kernels without a bias still declare them).
  static constexpr uint32_t kBiasRegs = kBiasPerThread > 0 ? kBiasPerThread : 1;

  // The tile's bias from global memory into this consumer's buffer (as FP32, zero past N or M), where every thread
  // finds the ones of its columns or rows: read_bias loads this thread's values as they are stored (bits: 0 past N
  // or M), park_bias converts them into the buffer before the epilogue's first barrier (after the previous
  // epilogue's last one every thread of the consumer has read the old values). Grouped GEMMs: a column bias per
  // group, (G, N).
  // When to read it (consume's kBiasEarly): not ahead of the main loop, where a load in flight across it made ptxas
  // keep the loop's wgmma descriptors in vector registers (an R2UR before every wgmma, as kRow's copies did in
  // session 7; sass.wgmma_vector_descriptors, checked by the tests' compiled_clean), which cost FP8 bias+gelu 6-15%
  // (docs/NOTES.md, session 52); on cooperative tiles once the tile's first wgmmas are queued, so that its latency
  // passes under the main loop (nothing uses the bits before park_bias: a conversion there waited for the load
  // before the next K block); elsewhere at the epilogue's start (stage_bias: both steps there).
  static DGJIT_DEVICE void read_bias(const EpilogueArgs& ea, const Tile& tile, uint32_t math_wg,
                                     uint32_t (&bits)[kBiasRegs]) {
    if constexpr (Epi::kBias != BiasKind::kNone) {
      const TBias* bias = static_cast<const TBias*>(ea.bias);
      if constexpr (kGrouped && Epi::kBias == BiasKind::kCol) bias += static_cast<uint64_t>(tile.group) * kN;
#pragma unroll
      for (uint32_t i = 0; i < kBiasPerThread; ++i) {
        const uint32_t idx = threadIdx.x % kWarpgroupThreads + i * kWarpgroupThreads;
        bits[i] = 0;  // (the bits of 0.0 in every bias type)
        if constexpr (Epi::kBias == BiasKind::kCol) {
          const uint32_t col = tile.n_block * kBlockN + (kSwapAB ? 64 * math_wg : 0) + idx;
          if (idx < kBiasFloatsPerWG && col < kN) bits[i] = load_bits(bias + col);
        } else {
          const uint32_t row = tile.row0 + (kSwapAB ? 0 : wg_row_offset(math_wg)) + idx;
          if (idx < kBiasFloatsPerWG && row < tile.row_end) bits[i] = load_bits(bias + row);
        }
      }
    }
  }
  static DGJIT_DEVICE void park_bias(const Smem& smem, uint32_t math_wg, const uint32_t (&bits)[kBiasRegs]) {
    if constexpr (Epi::kBias != BiasKind::kNone) {
#pragma unroll
      for (uint32_t i = 0; i < kBiasPerThread; ++i) {
        const uint32_t idx = threadIdx.x % kWarpgroupThreads + i * kWarpgroupThreads;
        if (idx < kBiasFloatsPerWG) smem.bias(math_wg)[idx] = bits_as_float<TBias>(bits[i]);
      }
    }
  }
  static DGJIT_DEVICE void stage_bias(const Smem& smem, const EpilogueArgs& ea, const Tile& tile, uint32_t math_wg) {
    uint32_t bits[kBiasRegs];
    read_bias(ea, tile, math_wg, bits);
    park_bias(smem, math_wg, bits);
  }

  // D column slices of tile n_block that start inside N (the others are neither loaded nor stored).
  static DGJIT_DEVICE uint32_t slices_in_n(uint32_t n_block) {
    if (kCluster && n_block * kOutCols >= kOutN) return 0;  // a cluster tile's rank past N (TileScheduler)
    const uint32_t cols_left = kOutN - n_block * kOutCols;
    const uint32_t slices = (cols_left + Store::kSliceCols - 1) / Store::kSliceCols;
    return slices < Store::kNumSlices ? slices : Store::kNumSlices;
  }

  // Whether this consumer loads C / residual for the tile (the same answer in all its threads): it has
  // rows inside M, and something to read (beta = 0 never reads C: BLAS semantics, C may hold NaN).
  static DGJIT_DEVICE bool loads_epilogue_operands(const EpilogueArgs& ea, const Tile& tile, uint32_t math_wg) {
    return kPrefetch && tile.row0 + wg_row_offset(math_wg) < tile.row_end && (kLoadR || ea.beta != 0.0f);
  }

  // Thread 0 of the consumer: TMA-load the tile's C and residual into the staging buffers (same boxes and
  // swizzle as D's store; TMA zero-fills rows past M and columns past N). Runs once the tile's first
  // wgmmas are queued, so waiting for the previous tile's store to leave the buffer costs no MMA time.
  static DGJIT_DEVICE void prefetch_epilogue_operands(const Smem& smem, const CUtensorMap& tmap_c,
                                                      const CUtensorMap& tmap_r, const EpilogueArgs& ea,
                                                      uint32_t math_wg, const Tile& tile) {
    if (threadIdx.x % kWarpgroupThreads != 0) return;
    tma_store_wait_read<0>();
    const bool load_c = kLoadC && ea.beta != 0.0f;
    const uint32_t num_slices = slices_in_n(tile.n_block);
    uint64_t* bar = smem.epi_full(math_wg);
    mbarrier_arrive_expect_tx(bar, num_slices * ((load_c ? 1u : 0u) + (kLoadR ? 1u : 0u)) * kSmemDSliceBytes);
    const int32_t row0 = static_cast<int32_t>(tile.row0 + wg_row_offset(math_wg));
#pragma unroll
    for (uint32_t slice = 0; slice < Store::kNumSlices; ++slice) {
      if (slice < num_slices) {
        const int32_t col0 = static_cast<int32_t>(tile.n_block * kOutCols + slice * Store::kSliceCols);
        if (load_c) tma_load_2d(smem.d(math_wg) + slice * kSmemDSliceBytes, &tmap_c, bar, col0, row0);
        if constexpr (kLoadR) tma_load_2d(smem.r(math_wg) + slice * kSmemDSliceBytes, &tmap_r, bar, col0, row0);
      }
    }
  }

  // Two packed 16-bit D values (the lower one in the lower half) as FP32.
  static DGJIT_DEVICE float2 unpack_d(uint32_t bits) {
    if constexpr (is_same<TD, bfloat16_t>::value) {
      return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
    } else {
      float lo, hi;
      asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(static_cast<uint16_t>(bits & 0xffffu)));
      asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(static_cast<uint16_t>(bits >> 16)));
      return make_float2(lo, hi);
    }
  }

  // kStMatrix tiles move a warp's 16 rows x column groups j (and j + 1 when `two`) of m64 slice mi with one
  // stmatrix / ldmatrix: lane l gives the row address of matrix l / 8, which holds group j + l / 16 (x4; j for x2),
  // rows 8 ((l / 8) % 2) + l % 8; matrix 2q + h is pair (q, h) of the accumulator layout.
  // (warp: the warp's index in its warpgroup, computed once by the caller: warp_idx_in_warpgroup is a shuffle.)
  static DGJIT_DEVICE uint32_t matrix_row_offset(uint32_t warp, uint32_t lane, uint32_t mi, uint32_t j, bool two) {
    const uint32_t m = lane / 8;
    const uint32_t row = mi * 64 + warp * 16 + 8 * (m % 2) + lane % 8;
    return d_offset(row, (j + (two ? m / 2 : 0)) * 8);
  }

  // The D pairs (both h) of groups j (`first`) and j + 1 (`second`, when `two`) into the staging tile.
  static DGJIT_DEVICE void store_groups(uint32_t base, uint32_t warp, uint32_t lane, uint32_t mi, uint32_t j, bool two,
                                        const float2 (&first)[2], const float2 (&second)[2]) {
    const uint32_t addr = base + matrix_row_offset(warp, lane, mi, j, two);
    if (two) {
      stmatrix_x4(addr, pack_d(first[0].x, first[0].y), pack_d(first[1].x, first[1].y),
                  pack_d(second[0].x, second[0].y), pack_d(second[1].x, second[1].y));
    } else {
      stmatrix_x2(addr, pack_d(first[0].x, first[0].y), pack_d(first[1].x, first[1].y));
    }
  }

  // The C / residual pairs of groups j and j + 1 (when `two`) from a D-typed tile, by ldmatrix (one instruction per
  // 16 rows x 2 groups instead of four 32-bit loads).
  static DGJIT_DEVICE void load_groups(uint32_t base, uint32_t warp, uint32_t lane, uint32_t mi, uint32_t j, bool two,
                                       float2 (&first)[2], float2 (&second)[2]) {
    const uint32_t addr = base + matrix_row_offset(warp, lane, mi, j, two);
    uint32_t v[4];
    if (two) {
      ldmatrix_x4(addr, v[0], v[1], v[2], v[3]);
      second[0] = unpack_d(v[2]);
      second[1] = unpack_d(v[3]);
    } else {
      ldmatrix_x2(addr, v[0], v[1]);
    }
    first[0] = unpack_d(v[0]);
    first[1] = unpack_d(v[1]);
  }

  // ---- epilogue: accumulators -> D tile (this warpgroup's kWGRows rows) ---------------------------
  // Accumulator layout of m64nN (per warp w of the warpgroup, lane l): register 4j + 2h + e holds
  // row 16w + l/4 + 8h, column 8j + 2(l%4) + e. Each (j, h) pair is one 2-element store.
  // `tensor_scale` is scale_a * scale_b for kTensor (1 otherwise).
  // Fused operations, D = act(alpha * acc + beta * C + bias) + residual, read their operands from shared
  // memory only. They run on rows past M and columns past N too (on TMA's zeros): TMA never stores those.
  // C and residual loads (ordered asm, like the stores) of a chunk of (j, h) pairs are issued together
  // before its math, so their latencies overlap; a load cannot pass the previous chunk's stores. The bias
  // is read with plain loads, which the compiler schedules freely. Larger chunks spilled registers.
  // Gated units: output group j (D columns 8j..8j+7 of the tile) combines accumulator groups 2j (gate) and
  // 2j + 1 (up), registers 8j + 2h + e and 8j + 4 + 2h + e of the same thread.
  // Quantize-on-store, per tensor: each pair is divided by the static scale and stored as two bytes. 1x128 groups:
  // a group of a row lies in one quad of lanes (l / 4 fixes the row) x 16 output groups j, so its amax is an
  // in-thread maximum and two shuffles; the first pass parks each finished value in its (gate) accumulator
  // register, the second reduces, writes the scale and stores q (no second register array: it would spill).
  static constexpr uint32_t kNumPairCols = kOutCols / 8;  // 8-column groups of the D tile
  // kBatchMath: a chunk's math runs before its stores. A store (asm volatile, "memory") keeps the next pair's
  // loads (bias, scales) behind it, so math and stores interleaved pair by pair left one pair's dependent chain in
  // flight per warp: GELU's ~45 FFMA/MUFU instructions per pair ran at ~4 cycles each (SASS, session 12). Batched,
  // 4-8 chains interleave. Measured (docs/NOTES.md, session 12): cooperative tiles, whose epilogue stalls the tensor
  // cores, 2-14% faster with every activation; ping-pong tiles, whose epilogue overlaps the other consumer's main
  // loop, faster while the epilogue is the longer of the two (K <= 1024 with GELU: 4096x32768x512 324 -> 291 us)
  // but 2-5% slower with GELU at K >= 1536 (4096x24576x1536 458 -> 482), where it is not: those keep the old order.
  // Chunks of 2 groups (4 pairs); 4 left ptxas a 16-byte stack frame (bias_row+gelu ping-pong 128x128). The
  // ping-pong exception still held with the degree-5 GELU (session 13: 467 vs 450 us at 4096x24576x1536).
  static constexpr bool kGeluWeight = Epi::kAct == Activation::kGelu || Epi::kGate == GateKind::kGeGlu;
  static constexpr bool kBatchMath = (Epi::kAct != Activation::kNone || kGated || kPrefetch) &&
                                     !(kPingPong && kGeluWeight && kK > 1024);
  // 16-bit D leaves the registers by stmatrix after the chunk's math (stmatrix_x4: a warp's 16 rows x 2 column
  // groups in one instruction instead of four st.shared.b32 and their address arithmetic; x2 for chunks of one
  // group, which kernels with an activation but without kBatchMath keep).
  static constexpr bool kStMatrix = k16BitD && !kQuantGroup &&
                                    !kQuantTensor;
  static constexpr bool kPlainMath = Epi::kAct == Activation::kNone && !kGated;
  static constexpr uint32_t kChunk = kPrefetch ? (sizeof(TD) == 4 ? 2 : 4)
                                               : (kBatchMath || (kStMatrix && kPlainMath) ? 2 : 1);
  // Column biases per output column group: gated units have a gate and an up bias.
  static constexpr uint32_t kBiasPerGroup = kGated ? 2 : 1;
  // kBiasAhead: a chunk's column biases are read while the previous chunk computes, before its stores. Read next to
  // their use, after the previous chunk's stores (volatile asm, "memory"), their latency stalled each chunk's first
  // add (ncu, docs/NOTES.md session 13: the bias FADD held 10% of the stall samples, short scoreboard). Measured
  // (same-run A/B): bias+silu 4096x32768x512 231.8 -> 221.0 us, fp8 tensor bias+gelu 24576x1536 314.5 -> 308.1;
  // the ping-pong GELU rows without kBatchMath (K > 1024) lost 4-5% (429 -> 452 us at 24576x1536) and read them
  // at use.
  static constexpr bool kBiasAhead = kBatchMath || kPlainMath;
  // kBiasAll: all of this thread's column biases (up to 16 pairs) read from the buffer at once, after the barrier,
  // instead of a chunk ahead: the short epilogues still waited on each chunk's loads (ncu, FP8 bias only at
  // 4096 x 32768 x 512: 10% of the stall samples, short scoreboard). Same call, session 56, us: FP8 tensor bias
  // only 135.4 -> 133.0, bias+gelu 183.7 -> 179.5, FP8 block bias+gelu 196.2 -> 195.2, 16-bit cooperative rows
  // even. Not on ping-pong tiles (bf16 bias+gelu 24576 x 1536 431.8 -> 454.4, fp16 7168 x 2048 176.5 -> 183.8) nor
  // with silu / sigmoid (FP8 bias+silu 171.0 -> 173.0 both rounds).
  static constexpr bool kBiasAll = Epi::kBias == BiasKind::kCol && !kPingPong && kNumPairCols * kBiasPerGroup <= 16 &&
                                   Epi::kAct != Activation::kSilu && Epi::kAct != Activation::kSigmoid;
  // The activations' forms for D's precision and this schedule (ActivationForms: one MUFU per element where the
  // epilogue does not overlap the other consumer's wgmmas).
  using Forms = ActivationForms<TD, kPingPong>;
  // kRow: column-scale pairs held in registers at a time (epilogue()).
  static constexpr uint32_t kColBatch = kScaling == Scaling::kRow ? 8 : 1;

  // Two D values packed for a 16-bit D (stmatrix), `lo` in the lower half.
  static DGJIT_DEVICE uint32_t pack_d(float lo, float hi) {
    if constexpr (is_same<TD, bfloat16_t>::value) {
      return pack_bf16x2(lo, hi);
    } else {
      return pack_f16x2(lo, hi);
    }
  }

  static DGJIT_DEVICE uint32_t d_offset(uint32_t row, uint32_t col) {
    const uint32_t slice = kRing ? col / Store::kSliceCols % kDRing : col / Store::kSliceCols;  // kRing: its buffer
    return slice * kSmemDSliceBytes +
           Store::swizzle(row * Store::kSliceRowBytes + (col % Store::kSliceCols) * sizeof(TD));
  }

  // d_offset(row, col) for a row this thread owns in the accumulator layout (row = lane / 4 modulo 8), as a row part
  // plus a column part: the swizzle's XOR term then depends on the lane only (`swz`, d_lane_swizzle), not on the
  // row (rows 8 apart differ by whole 128-byte lines, a multiple of the swizzle period), and touches the column
  // bytes only. So the column part of each column group is one XOR per thread and tile, shared by every row, where
  // d_offset's full form cost about two instructions per stored pair (8-bit D: 16-bit stores; session 58).
  static DGJIT_DEVICE uint32_t d_lane_swizzle(uint32_t lane) {
    const uint32_t first_row = (lane / 4) * Store::kSliceRowBytes;
    return Store::swizzle(first_row) ^ first_row;
  }
  static DGJIT_DEVICE uint32_t d_offset_owned(uint32_t row, uint32_t col, uint32_t swz) {
    static_assert(Store::kSwizzleBytes == 0 || (8 * Store::kSliceRowBytes) % (8 * Store::kSwizzleBytes) == 0,
                  "rows 8 apart must be whole swizzle periods apart");
    static_assert(Store::kSwizzleBytes == 0 || Store::kSwizzleBytes <= Store::kSliceRowBytes,
                  "the swizzle's XOR term stays inside a row's bytes");
    const uint32_t slice = kRing ? col / Store::kSliceCols % kDRing : col / Store::kSliceCols;
    return slice * kSmemDSliceBytes + row * Store::kSliceRowBytes +
           (((col % Store::kSliceCols) * static_cast<uint32_t>(sizeof(TD))) ^ swz);
  }

  // The accumulator register holding the first element of D pair (j, h) once parked (kQuantGroup).
  static DGJIT_DEVICE constexpr uint32_t park_index(uint32_t j, uint32_t h) { return 4 * (kGated ? 2 * j : j) + 2 * h; }
  static DGJIT_DEVICE void park(TAcc& slot, float v) {
    if constexpr (kIsInt) {
      slot = __float_as_int(v);
    } else {
      slot = v;
    }
  }
  static DGJIT_DEVICE float parked(TAcc slot) {
    if constexpr (kIsInt) {
      return __int_as_float(slot);
    } else {
      return slot;
    }
  }

  // The pair of accumulator registers i, i + 1 before the activation: the scales, alpha * acc + beta * C, and the
  // bias (col_bias: the pair's two column biases, row_bias its row's; both from registers, see epilogue()).
  // kRow: row_scale is the pair's row scale, col_scale its two column scales (from registers, see epilogue()).
  static DGJIT_DEVICE float2 pre_activation(const TAcc (&acc)[kNumAccum], uint32_t i, float tensor_scale,
                                            float row_scale, const float2& col_scale, const EpilogueArgs& ea,
                                            bool read_c, const float2& c, const float2& col_bias, float row_bias) {
    float lo = static_cast<float>(acc[i]);
    float hi = static_cast<float>(acc[i + 1]);
    if constexpr (kScaling == Scaling::kTensor) {
      lo *= tensor_scale;
      hi *= tensor_scale;
    } else if constexpr (kScaling == Scaling::kRow) {
      lo *= row_scale * col_scale.x;
      hi *= row_scale * col_scale.y;
    }
    if constexpr (Epi::kBeta) {
      lo = ea.alpha * lo + (read_c ? ea.beta * c.x : 0.0f);
      hi = ea.alpha * hi + (read_c ? ea.beta * c.y : 0.0f);
    }
    if constexpr (Epi::kBias == BiasKind::kCol) {
      lo += col_bias.x;
      hi += col_bias.y;
    } else if constexpr (Epi::kBias == BiasKind::kRow) {
      lo += row_bias;
      hi += row_bias;
    }
    return make_float2(lo, hi);
  }

  // Group quantization of a thread's D row (m64 slice `acc`, half h): max |x| over its pairs [j0, j0 + kPairs) inside
  // N (a bias or an activation such as sigmoid makes TMA's zero columns past N nonzero), reduced over the quad that
  // holds the row: float bits, NaN wins. (Columns past N exist where N is not whole tiles, or, across a cluster,
  // where the last cluster tile has ranks past N.)
  template <uint32_t kPairs>
  static DGJIT_DEVICE uint32_t group_row_amax(const TAcc (&acc)[kNumAccum], uint32_t h, uint32_t n_block, uint32_t j0,
                                              uint32_t lane) {
    constexpr bool kPastN = kOutN % (kCluster ? 128 : kOutCols) != 0;
    float amax = 0.0f;
#pragma unroll
    for (uint32_t j = j0; j < j0 + kPairs; ++j) {
#pragma unroll
      for (uint32_t e = 0; e < 2; ++e) {
        const uint32_t col = n_block * kOutCols + j * 8 + 2 * (lane % 4) + e;
        if (!kPastN || col < kOutN) amax = quant::max_abs_nan(amax, parked(acc[park_index(j, h) + e]));
      }
    }
    return quant::reduce_max_lanes<4>(__float_as_uint(amax));
  }
  // q of the same pairs into the D tile's row `row` (swz: d_lane_swizzle). All are quantized before any is stored (a
  // store's "memory" clobber would keep each next pair's math behind it, see kBatchMath). Bounded division: no value
  // inside N exceeds 448 s (those past N may come out NaN instead of saturated; TMA does not store them).
  template <uint32_t kPairs>
  static DGJIT_DEVICE void store_group_row(uint32_t d_base, const TAcc (&acc)[kNumAccum], uint32_t h, uint32_t row,
                                           uint32_t j0, uint32_t lane, uint32_t swz, const quant::Divisor& divisor) {
    uint16_t q[kPairs];
#pragma unroll
    for (uint32_t j = 0; j < kPairs; ++j) {
      const uint32_t i = park_index(j0 + j, h);
      q[j] = quantize_pair<Epi::kQuant, true>(parked(acc[i]), parked(acc[i + 1]), divisor);
    }
#pragma unroll
    for (uint32_t j = 0; j < kPairs; ++j) {
      st_shared_b16(d_base + d_offset_owned(row, (j0 + j) * 8 + 2 * (lane % 4), swz), q[j]);
    }
  }

  // kQuantGroup, second pass: per row and 128-column group, the amax, the scale (written for rows inside M by the
  // quad's first lane) and q into the D tile.
  static DGJIT_DEVICE void quantize_groups(uint32_t d_base, uint32_t math_wg, const Tile& tile, const EpilogueArgs& ea,
                                           const TAcc (&acc)[kNumM64PerWG][kNumAccum]) {
    const uint32_t warp = warp_idx_in_warpgroup();
    const uint32_t lane = lane_idx();
    const uint32_t swz = d_lane_swizzle(lane);
#pragma unroll
    for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi) {
#pragma unroll
      for (uint32_t h = 0; h < 2; ++h) {
        const uint32_t row = mi * 64 + warp * 16 + lane / 4 + 8 * h;
        const uint32_t global_row = tile.row0 + wg_row_offset(math_wg) + row;
        const uint32_t n_block = tile.n_block;
#pragma unroll
        for (uint32_t g = 0; g < kOutCols / 128; ++g) {
          const float scale =
              quant::scale_of<quant::Format::kE4M3>(group_row_amax<16>(acc[mi], h, n_block, 16 * g, lane));
          // A 256-column tile's second group can lie wholly past N (N = 2112: groups 0-16): it has no scale column.
          const bool group_in_n = kOutN % kOutCols == 0 || n_block * kOutCols + g * 128 < kOutN;
          if (lane % 4 == 0 && global_row < tile.row_end && group_in_n) {
            ea.quant[global_row * ea.scales_stride_m + (n_block * kOutCols / 128 + g) * ea.scales_stride_g] = scale;
          }
          store_group_row<16>(d_base, acc[mi], h, row, 16 * g, lane, swz, quant::make_divisor(scale));
        }
      }
    }
  }

  // kCluster: the tile is kOutCols of a 1x128 group's columns; the cluster's kClusterN CTAs hold the others (same rows,
  // TileScheduler's cluster walk). Each row's amax over this tile's columns (inside N) is reduced in its quad; the
  // quad's first lane (a sender) writes its two rows' partials (h = 0, 1) into slot [rank] of exchange buffer
  // `exchange % 2` of every CTA of the cluster, its own included, by st.async, which completes 8 bytes on that
  // CTA's barrier; thread 0 of each CTA announces the kClusterN x kBlockM x 4 bytes its buffer receives (the
  // barrier's one arrival). The thread in the same place of every CTA holds the same rows, so a partial's slot is
  // its sender's place (exch_slot), where the receiving thread finds all kClusterN of its rows' partials. Then the
  // group's amax, its scale (written by rank 0, whose tile starts the group) and q of this tile's columns follow. A
  // buffer is written again two tiles later, after every CTA's sends of the tile in between, which each makes only
  // after reading this tile's partials: two buffers and one barrier each suffice.
  static DGJIT_DEVICE constexpr uint32_t exch_slot(uint32_t math_wg, uint32_t mi, uint32_t warp, uint32_t lane) {
    return (((math_wg * kNumM64PerWG + mi) * 4 + warp) * 8 + lane / 4) * 2;
  }
  static_assert(!kCluster || exch_slot(kNumMathWGs, 0, 0, 0) == kBlockM, "one slot per tile row");
  static DGJIT_DEVICE void quantize_groups_cluster(const Smem& smem, uint32_t d_base, uint32_t math_wg,
                                                   const Tile& tile, const EpilogueArgs& ea,
                                                   const TAcc (&acc)[kNumM64PerWG][kNumAccum], uint32_t exchange) {
    const uint32_t warp = warp_idx_in_warpgroup();
    const uint32_t lane = lane_idx();
    const uint32_t rank = cluster_rank();
    const uint32_t buf = exchange % 2;
    const uint32_t n_block = tile.n_block;
    if (threadIdx.x == 0) mbarrier_arrive_expect_tx(smem.exch_full(buf), kClusterN * kBlockM * 4);
    uint32_t partial[kNumM64PerWG][2];
#pragma unroll
    for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi) {
#pragma unroll
      for (uint32_t h = 0; h < 2; ++h) partial[mi][h] = group_row_amax<kOutCols / 8>(acc[mi], h, n_block, 0, lane);
    }
    if (lane % 4 == 0) {
      const uint32_t bar = shared_addr(smem.exch_full(buf));
#pragma unroll
      for (uint32_t r = 0; r < kClusterN; ++r) {
#pragma unroll
        for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi) {
          const uint32_t slot = shared_addr(smem.exch(buf, rank) + exch_slot(math_wg, mi, warp, lane));
          st_async_cluster_v2(cluster_shared_addr(slot, r), partial[mi][0], partial[mi][1],
                              cluster_shared_addr(bar, r));
        }
      }
    }
    mbarrier_wait(smem.exch_full(buf), (exchange / 2) % 2);
    const uint32_t swz = d_lane_swizzle(lane);
#pragma unroll
    for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi) {
#pragma unroll
      for (uint32_t h = 0; h < 2; ++h) {
        const uint32_t row = mi * 64 + warp * 16 + lane / 4 + 8 * h;
        uint32_t amax_bits = 0;  // max of non-negative float bits (NaN wins), as reduce_max_lanes
#pragma unroll
        for (uint32_t r = 0; r < kClusterN; ++r) {
          amax_bits = quant::max_u32(amax_bits, smem.exch(buf, r)[exch_slot(math_wg, mi, warp, lane) + h]);
        }
        const float scale = quant::scale_of<quant::Format::kE4M3>(amax_bits);
        const uint32_t global_row = tile.row0 + wg_row_offset(math_wg) + row;
        if (rank == 0 && lane % 4 == 0 && global_row < tile.row_end) {
          ea.quant[global_row * ea.scales_stride_m + (n_block * kOutCols / 128) * ea.scales_stride_g] = scale;
        }
        store_group_row<kOutCols / 8>(d_base, acc[mi], h, row, 0, lane, swz, quant::make_divisor(scale));
      }
    }
  }

  // Grouped GEMMs: rows [row0, row0 + rows) of this consumer's D buffer, stored by its threads in 16-byte chunks
  // (element by element where a chunk crosses N). A tile ending inside its group cannot go out by TMA: the box
  // would overwrite the next group's first rows. The epilogue's barrier made the buffer visible; the next
  // epilogue's barrier keeps it from being overwritten before every thread has read its part.
  static DGJIT_DEVICE void store_rows(const Smem& smem, uint32_t math_wg, uint32_t row0, uint32_t rows,
                                      uint32_t n_block, const GroupArgs& ga) {
    constexpr uint32_t kVec = 16 / sizeof(TD);  // elements per chunk (a D tile row is whole chunks)
    constexpr uint32_t kChunksPerRow = kOutCols / kVec;
    const uint8_t* buf = smem.d(math_wg);
    const uint32_t col0 = n_block * kOutCols;
#pragma unroll 1
    for (uint32_t idx = threadIdx.x % kWarpgroupThreads; idx < rows * kChunksPerRow; idx += kWarpgroupThreads) {
      const uint32_t r = idx / kChunksPerRow;
      const uint32_t col = (idx % kChunksPerRow) * kVec;
      if (col0 + col >= kOutN) continue;
      const uint4 v = *reinterpret_cast<const uint4*>(buf + d_offset(r, col));
      TD* dst = static_cast<TD*>(ga.d) + static_cast<int64_t>(row0 + r) * ga.d_ld + col0 + col;
      if (kOutN % kVec == 0 || col0 + col + kVec <= kOutN) {
        *reinterpret_cast<uint4*>(dst) = v;
      } else {
        const TD* src = reinterpret_cast<const TD*>(&v);
        for (uint32_t e = 0; col0 + col + e < kOutN; ++e) dst[e] = src[e];
      }
    }
  }

  // kRing: slice `slice` of this consumer's D has been written into its ring buffer. One barrier per slice: before
  // it, the store thread waits until the store issued kDRing - 1 slices back has read the buffer the next slice
  // goes to (every slice commits one bulk group, an empty one where nothing is stored, so the counts hold); after
  // it, it stores this slice (parts past M or N clipped by TMA, slices wholly past N not issued).
  static DGJIT_DEVICE void store_ring_slice(const Smem& smem, const CUtensorMap& tmap_d, uint32_t math_wg,
                                            const Tile& tile, uint32_t slice) {
    const bool is_store_thread = threadIdx.x % kWarpgroupThreads == 0;
    fence_proxy_async_shared();
    if (is_store_thread) tma_store_wait_read<kDRing - 2>();
    named_barrier_sync(1 + math_wg, kWarpgroupThreads);
    if (is_store_thread) {
      const uint32_t row0 = tile.row0 + wg_row_offset(math_wg);
      if (row0 < tile.row_end && slice < slices_in_n(tile.n_block)) {
        store_d_slice(tmap_d, smem.d(math_wg) + slice % kDRing * kSmemDSliceBytes, tile.n_block, slice, row0);
      }
      tma_store_commit();
    }
  }

  // TMA store of D's column slice `slice` of n block `n_block`, rows from row0, from its staging buffer `src`.
  static DGJIT_DEVICE void store_d_slice(const CUtensorMap& tmap_d, uint8_t* src, uint32_t n_block, uint32_t slice,
                                         uint32_t row0) {
    tma_store_2d(&tmap_d, src, static_cast<int32_t>(n_block * kOutCols + slice * Store::kSliceCols),
                 static_cast<int32_t>(row0));
  }

  // kBiasRead: the main loop read the tile's bias into `bias` (consume's kBiasEarly); else it is read here.
  template <bool kBiasRead>
  static DGJIT_DEVICE void epilogue(const Smem& smem, const CUtensorMap& tmap_d, uint32_t math_wg,
                                    uint32_t m, const Tile& tile, float tensor_scale, const EpilogueArgs& ea,
                                    const GroupArgs& ga, bool wait_operands, uint32_t& operand_phase,
                                    TAcc (&acc)[kNumM64PerWG][kNumAccum], const uint32_t (&bias)[kBiasRegs],
                                    uint32_t exchange = 0) {
    const bool is_store_thread = threadIdx.x % kWarpgroupThreads == 0;
    const uint32_t barrier_id = 1 + math_wg;
    const uint32_t n_block = tile.n_block;
    // Per-tensor quantization: the static scale, read while the barrier below is waited for.
    float quant_scale = 1.0f;
    if constexpr (kQuantTensor) quant_scale = ld_global_nc_f32(ea.quant);
    // The previous tile's TMA store must have finished reading the buffer before it is overwritten.
    if (is_store_thread) tma_store_wait_read<0>();
    // kRow: this thread's scale copies have landed; the barrier makes everyone's visible.
    if constexpr (kScaling == Scaling::kRow) cp_async_wait_all();
    if constexpr (kBiasRead) {
      park_bias(smem, math_wg, bias);
    } else {
      stage_bias(smem, ea, tile, math_wg);
    }
    named_barrier_sync(barrier_id, kWarpgroupThreads);
    if constexpr (kPrefetch) {
      if (wait_operands) {
        mbarrier_wait(smem.epi_full(math_wg), operand_phase);
        operand_phase ^= 1;
      }
    }
    const bool read_c = kLoadC && ea.beta != 0.0f;
    const quant::Divisor quant_divisor = quant::make_divisor(quant_scale);  // kQuantTensor's

    const uint32_t d_base = shared_addr(smem.d(math_wg));
    const uint32_t r_base = shared_addr(smem.r(math_wg));
    const uint32_t warp = warp_idx_in_warpgroup();
    const uint32_t lane = lane_idx();
    // kRow: the scales come from registers, loaded in batches (the row scales per m64 slice, the column scales of
    // kColBatch accumulator groups of 8 columns at a time), so one load latency covers many stores. Read next to
    // each use, every load sat between D stores (volatile asm, so not hoisted) and each multiply stalled on its
    // latency: at K = 512 the row kernel ran 1.45x the per-tensor kernel's time (ncu: short-scoreboard stalls).
    float row_scale[2] = {1.0f, 1.0f};
    float2 col_batch[kColBatch];
    col_batch[0] = make_float2(1.0f, 1.0f);
    uint32_t amax_bits = 0;  // Epi::kAmax: this thread's max |x| inside (M, N_out) (float bits; NaN wins)
    // Column biases (the same for every m64 slice), read one chunk ahead where kBiasAhead says so.
    float2 col_bias_next[kChunk][kBiasPerGroup] = {};
    // (gated: gate columns 16j + ..., up columns 8 further; else 8j + ...)
    const auto col_bias_pair = [&](uint32_t j, uint32_t q) {
      return *reinterpret_cast<const float2*>(smem.bias(math_wg) + (kGated ? 16 * j + 8 * q : 8 * j) + 2 * (lane % 4));
    };
    auto load_col_bias = [&](uint32_t j0, float2 (&b)[kChunk][kBiasPerGroup]) {
      if constexpr (Epi::kBias == BiasKind::kCol) {
#pragma unroll
        for (uint32_t jj = 0; jj < kChunk; ++jj)
#pragma unroll
          for (uint32_t q = 0; q < kBiasPerGroup; ++q)
            if (j0 + jj < kNumPairCols) b[jj][q] = col_bias_pair(j0 + jj, q);
      }
    };
    float2 col_bias_all[kBiasAll ? kNumPairCols : 1][kBiasPerGroup];
    if constexpr (kBiasAll) {
#pragma unroll
      for (uint32_t j = 0; j < kNumPairCols; ++j)
#pragma unroll
        for (uint32_t q = 0; q < kBiasPerGroup; ++q) col_bias_all[j][q] = col_bias_pair(j, q);
    } else if constexpr (kBiasAhead) {
      load_col_bias(0, col_bias_next);
    }
#pragma unroll
    for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi) {
      float row_bias[2] = {0.0f, 0.0f};
      if constexpr (Epi::kBias == BiasKind::kRow) {
#pragma unroll
        for (uint32_t h = 0; h < 2; ++h) row_bias[h] = smem.bias(math_wg)[mi * 64 + warp * 16 + lane / 4 + 8 * h];
      }
      if constexpr (kScaling == Scaling::kRow) {
#pragma unroll
        for (uint32_t h = 0; h < 2; ++h)
          row_scale[h] = ld_shared_f32(shared_addr(smem.row_scales(math_wg) + mi * 64 + warp * 16 + lane / 4 + 8 * h));
      }
#pragma unroll
      for (uint32_t j0 = 0; j0 < kNumPairCols; j0 += kChunk) {
        // Gather the chunk's operands (and the next chunk's column biases).
        float2 col_bias[kChunk][kBiasPerGroup] = {};
        if constexpr (kBiasAll) {
#pragma unroll
          for (uint32_t jj = 0; jj < kChunk; ++jj)
#pragma unroll
            for (uint32_t q = 0; q < kBiasPerGroup; ++q)
              if (j0 + jj < kNumPairCols) col_bias[jj][q] = col_bias_all[j0 + jj][q];
        } else if constexpr (kBiasAhead) {
#pragma unroll
          for (uint32_t jj = 0; jj < kChunk; ++jj)
#pragma unroll
            for (uint32_t q = 0; q < kBiasPerGroup; ++q) col_bias[jj][q] = col_bias_next[jj][q];
          if (mi + 1 < kNumM64PerWG || j0 + kChunk < kNumPairCols)
            load_col_bias(j0 + kChunk < kNumPairCols ? j0 + kChunk : 0, col_bias_next);
        } else {
          load_col_bias(j0, col_bias);
        }
        float2 c_in[kChunk][2], r_in[kChunk][2];
        if constexpr (kStMatrix && kPrefetch) {  // 16-bit C / residual: two groups per ldmatrix
#pragma unroll
          for (uint32_t jj = 0; jj < kChunk; jj += 2) {
            const uint32_t j = j0 + jj;
            if (j < kNumPairCols) {
              const bool two = jj + 1 < kChunk && j + 1 < kNumPairCols;
              if constexpr (kLoadC) load_groups(d_base, warp, lane, mi, j, two, c_in[jj], c_in[jj + 1 < kChunk ? jj + 1 : jj]);
              if constexpr (kLoadR) load_groups(r_base, warp, lane, mi, j, two, r_in[jj], r_in[jj + 1 < kChunk ? jj + 1 : jj]);
            }
          }
        } else if constexpr (kPrefetch) {  // FP32 tiles (quantized D takes no C or residual: spec rule), pair by pair
          static_assert(is_same<TD, float>::value, "C / residual tiles are 16-bit (ldmatrix) or FP32");
#pragma unroll
          for (uint32_t jj = 0; jj < kChunk; ++jj) {
            const uint32_t j = j0 + jj;
            if (j < kNumPairCols) {
              const uint32_t col = j * 8 + 2 * (lane % 4);
#pragma unroll
              for (uint32_t h = 0; h < 2; ++h) {
                const uint32_t offset = d_offset(mi * 64 + warp * 16 + lane / 4 + 8 * h, col);
                if constexpr (kLoadC) c_in[jj][h] = ld_shared_v2_f32(d_base + offset);
                if constexpr (kLoadR) r_in[jj][h] = ld_shared_v2_f32(r_base + offset);
              }
            }
          }
        }
        // D pair (jj, h) of the chunk into the staging tile (or parked for the group quantizer).
        float2 out[kChunk][2] = {};  // (initialised only for the compiler's use-before-set analysis of the lambda)
        auto store = [&](uint32_t jj, uint32_t h) {
          const uint32_t j = j0 + jj;
          const uint32_t row = mi * 64 + warp * 16 + lane / 4 + 8 * h;
          const uint32_t col = j * 8 + 2 * (lane % 4);
          const uint32_t addr = d_base + d_offset(row, col);
          const float lo = out[jj][h].x, hi = out[jj][h].y;
          if constexpr (is_same<TD, int32_t>::value) {
            st_shared_v2_b32(addr, static_cast<uint32_t>(acc[mi][4 * j + 2 * h]),
                             static_cast<uint32_t>(acc[mi][4 * j + 2 * h + 1]));
          } else if constexpr (kQuantGroup) {
            park(acc[mi][park_index(j, h)], lo);
            park(acc[mi][park_index(j, h) + 1], hi);
          } else if constexpr (kQuantTensor) {
            const uint32_t global_row = tile.row0 + wg_row_offset(math_wg) + row;
            const uint32_t global_col = n_block * kOutCols + col;
            // Epi::kAmax: its own kernel (the epilogue's amax word). A run-time test per pair made every pair its
            // own branch region (36 BSSY/BSYNC), so no two pairs' divisions overlapped (FP8 tensor 4096x32768x512
            // 191.5 us against 125.2 for BF16 D); a run-time branch per tile into two copies of the epilogue
            // still cost 3-30% (code size: bf16 bias+gelu 128 x 32768x512 22.1 -> 29.2 us; session 58).
            if (Epi::kAmax && global_row < tile.row_end) {
              if (global_col < kOutN) amax_bits = quant::max_u32(amax_bits, quant::abs_bits(lo));
              if (global_col + 1 < kOutN) amax_bits = quant::max_u32(amax_bits, quant::abs_bits(hi));
            }
            // (the amax kernels keep d_offset: the int8-row ping-pong one kept 8 stack bytes with the split form)
            st_shared_b16(Epi::kAmax ? addr : d_base + d_offset_owned(row, col, d_lane_swizzle(lane)),
                          quantize_pair<Epi::kQuant, false, !Epi::kAmax>(lo, hi, quant_divisor));
          } else if constexpr (is_same<TD, float>::value) {
            st_shared_v2_f32(addr, lo, hi);
          }  // (16-bit D: stmatrix after the chunk's math, kStMatrix; this lambda is not called for it)
        };
        // Math, then stores (kBatchMath: the chunk's math first, see there; else each pair's store after its math).
#pragma unroll
        for (uint32_t jj = 0; jj < kChunk; ++jj) {
          const uint32_t j = j0 + jj;
          if (j < kNumPairCols) {
            // kRow: accumulator group g = j (gated: 2j and 2j + 1) of the tile's kBlockN / 8.
            if constexpr (kScaling == Scaling::kRow) {
              const uint32_t g0 = kGated ? 2 * j : j;
              if (g0 % kColBatch == 0) {
#pragma unroll
                for (uint32_t b = 0; b < kColBatch; ++b)
                  if (g0 + b < kBlockN / 8)
                    col_batch[b] = ld_shared_v2_f32(shared_addr(smem.col_scales(math_wg) + 8 * (g0 + b) + 2 * (lane % 4)));
              }
            }
#pragma unroll
            for (uint32_t h = 0; h < 2; ++h) {
              if constexpr (!is_same<TD, int32_t>::value) {
                float lo, hi;
                if constexpr (kGated) {
                  // Gate columns 16j + 2(l%4) + e of the tile's accumulators, up columns 8 further.
                  const float2 gate = pre_activation(acc[mi], 8 * j + 2 * h, tensor_scale, row_scale[h],
                                                     col_batch[kScaling == Scaling::kRow ? 2 * j % kColBatch : 0],
                                                     ea, read_c, c_in[jj][h], col_bias[jj][0], row_bias[h]);
                  const float2 up = pre_activation(acc[mi], 8 * j + 4 + 2 * h, tensor_scale, row_scale[h],
                                                   col_batch[kScaling == Scaling::kRow ? (2 * j + 1) % kColBatch : 0],
                                                   ea, read_c, c_in[jj][h], col_bias[jj][kBiasPerGroup - 1], row_bias[h]);
                  lo = gate_activate<Epi::kGate, Forms>(gate.x) * up.x;
                  hi = gate_activate<Epi::kGate, Forms>(gate.y) * up.y;
                } else {
                  const float2 v = pre_activation(acc[mi], 4 * j + 2 * h, tensor_scale, row_scale[h],
                                                  col_batch[kScaling == Scaling::kRow ? j % kColBatch : 0],
                                                  ea, read_c, c_in[jj][h], col_bias[jj][0], row_bias[h]);
                  lo = activate<Epi::kAct, Forms>(v.x);
                  hi = activate<Epi::kAct, Forms>(v.y);
                }
                if constexpr (kLoadR) {
                  lo += r_in[jj][h].x;
                  hi += r_in[jj][h].y;
                }
                out[jj][h] = make_float2(lo, hi);
              }
              if constexpr (!kBatchMath && !kStMatrix) store(jj, h);
            }
          }
        }
        if constexpr (kStMatrix) {
#pragma unroll
          for (uint32_t jj = 0; jj < kChunk; jj += 2) {
            const uint32_t j = j0 + jj;
            if (j < kNumPairCols)
              store_groups(d_base, warp, lane, mi, j, jj + 1 < kChunk && j + 1 < kNumPairCols, out[jj],
                           out[jj + 1 < kChunk ? jj + 1 : jj]);
          }
        } else if constexpr (kBatchMath) {
#pragma unroll
          for (uint32_t jj = 0; jj < kChunk; ++jj)
            if (j0 + jj < kNumPairCols) {
              store(jj, 0);
              store(jj, 1);
            }
        }
        if constexpr (kRing) {
          constexpr uint32_t kGroupsPerSlice = Store::kSliceCols / 8;
          static_assert(kGroupsPerSlice % kChunk == 0, "a chunk of column groups lies inside one D slice");
          if ((j0 + kChunk) % kGroupsPerSlice == 0) {
            store_ring_slice(smem, tmap_d, math_wg, tile, j0 / kGroupsPerSlice);
          }
        }
      }
    }
    if constexpr (kCluster) {
      quantize_groups_cluster(smem, d_base, math_wg, tile, ea, acc, exchange);
    } else if constexpr (kQuantGroup) {
      quantize_groups(d_base, math_wg, tile, ea, acc);
    }
    if constexpr (kQuantTensor) {
      // One atomic per warp and tile; max of non-negative float bits is the float maximum (NaN wins).
      if (Epi::kAmax && ea.amax != nullptr) {
        const uint32_t warp_amax = quant::reduce_max_lanes<32>(amax_bits);
        if (lane == 0) atomicMax(ea.amax, warp_amax);
      }
    }
    if constexpr (kRing) return;  // every slice is on its way (store_ring_slice)
    fence_proxy_async_shared();
    named_barrier_sync(barrier_id, kWarpgroupThreads);

    const uint32_t row0 = tile.row0 + wg_row_offset(math_wg);
    if constexpr (kGrouped) {
      // Rows ending inside their group (before M, where TMA would clip): the threads store them (store_rows).
      if (row0 < tile.row_end && row0 + kWGRows > tile.row_end && tile.row_end < m) {
        store_rows(smem, math_wg, row0, tile.row_end - row0, n_block, ga);
        return;
      }
    }
    // Parts of a box past M or N are clipped by TMA; boxes lying entirely past them (small M, the last
    // N block) are not issued at all.
    if (is_store_thread && row0 < tile.row_end) {
      const uint32_t num_slices = slices_in_n(n_block);
#pragma unroll
      for (uint32_t slice = 0; slice < Store::kNumSlices; ++slice) {
        if (slice < num_slices) store_d_slice(tmap_d, smem.d(math_wg) + slice * kSmemDSliceBytes, n_block, slice, row0);
      }
      tma_store_commit();
    }
  }

  // ---- kSwapAB: the transposed accumulators into D ---------------------------------------------------------------
  // Consumer math_wg holds D^T of the tile's columns [64 math_wg, 64 math_wg + 64) and all kBlockM rows: register
  // 4j + 2h + e of lane l in warp w is D row 8j + 2(l % 4) + e, column 64 math_wg + 16w + 8h + l / 4. Each 8x8 group
  // (j, h) is an stmatrix fragment whose rows are D columns; .trans stores it transposed, so the staging tile has D's
  // own layout: kBlockM rows of the consumer's 64 columns (128 bytes, one swizzled slice: conflict-free, since the
  // eight rows a matrix writes are consecutive), which one TMA box (64 columns x kBlockM rows) stores, clipped at M
  // and N. Lane l addresses row l % 8 of matrix l / 8 = 2q + h, i.e. D row 8 (j + q) + l % 8 from column 16w + 8h.
  // FP8: `tensor_scale` (kTensor) or the staged row and column scales (kRow: this thread's two columns in
  // registers, the two rows of each group j read as one pair) multiply each value, then the bias is added (a column
  // bias from registers, a row bias as a pair per group) and the activation applied, in epilogue()'s order.
  static DGJIT_DEVICE void epilogue_swapped(const Smem& smem, const CUtensorMap& tmap_d, uint32_t math_wg,
                                            const Tile& tile, float tensor_scale, const EpilogueArgs& ea,
                                            const TAcc (&acc)[kNumM64PerWG][kNumAccum]) {
    static_assert(kNumM64PerWG == 1 && Store::kNumSlices == 1 && Store::kSliceRowBytes == 128,
                  "a swapped consumer's D is one 128-byte slice of kBlockM rows");
    const bool is_store_thread = threadIdx.x % kWarpgroupThreads == 0;
    const uint32_t barrier_id = 1 + math_wg;
    // The previous tile's TMA store must have finished reading the buffer before it is overwritten.
    if (is_store_thread) tma_store_wait_read<0>();
    // kRow: this thread's scale copies have landed; the barrier makes everyone's visible.
    if constexpr (kScaling == Scaling::kRow) cp_async_wait_all();
    stage_bias(smem, ea, tile, math_wg);
    named_barrier_sync(barrier_id, kWarpgroupThreads);
    const uint32_t d_base = shared_addr(smem.d(math_wg));
    const uint32_t warp = warp_idx_in_warpgroup();
    const uint32_t lane = lane_idx();
    const uint32_t q = lane / 16, h = lane / 8 % 2;
    constexpr uint32_t kGroups = kBlockM / 8;
    float col_scale[2] = {1.0f, 1.0f};  // kRow: this thread's D columns 16w + l / 4 (+ 8)
    float col_bias[2] = {0.0f, 0.0f};   // a column bias of the same columns
#pragma unroll
    for (uint32_t c = 0; c < 2; ++c) {
      if constexpr (kScaling == Scaling::kRow) {
        col_scale[c] = ld_shared_f32(shared_addr(smem.col_scales(math_wg) + 16 * warp + 8 * c + lane / 4));
      }
      if constexpr (Epi::kBias == BiasKind::kCol) col_bias[c] = smem.bias(math_wg)[16 * warp + 8 * c + lane / 4];
    }
    // Register 4j + 2c + e scaled: D row 8j + 2 (l % 4) + e, column 16w + 8c + l / 4.
    const auto scaled = [&](uint32_t i) {
      const uint32_t j = i / 4, c = i / 2 % 2;
      float lo = static_cast<float>(acc[0][i]);
      float hi = static_cast<float>(acc[0][i + 1]);
      if constexpr (kScaling == Scaling::kTensor) {
        lo *= tensor_scale;
        hi *= tensor_scale;
      } else if constexpr (kScaling == Scaling::kRow) {
        const float2 rows = ld_shared_v2_f32(shared_addr(smem.row_scales(math_wg) + 8 * j + 2 * (lane % 4)));
        lo *= rows.x * col_scale[c];
        hi *= rows.y * col_scale[c];
      }
      if constexpr (Epi::kBias == BiasKind::kCol) {
        lo += col_bias[c];
        hi += col_bias[c];
      } else if constexpr (Epi::kBias == BiasKind::kRow) {
        const float2 rows = *reinterpret_cast<const float2*>(smem.bias(math_wg) + 8 * j + 2 * (lane % 4));
        lo += rows.x;
        hi += rows.y;
      }
      return pack_d(activate<Epi::kAct, Forms>(lo), activate<Epi::kAct, Forms>(hi));
    };
#pragma unroll
    for (uint32_t j = 0; j < kGroups; j += 2) {
      if (j + 1 < kGroups) {
        stmatrix_x4_trans(d_base + d_offset(8 * (j + q) + lane % 8, 16 * warp + 8 * h), scaled(4 * j),
                          scaled(4 * j + 2), scaled(4 * j + 4), scaled(4 * j + 6));
      } else {  // (x2: lanes 16-31 give addresses that are not read)
        stmatrix_x2_trans(d_base + d_offset(8 * j + lane % 8, 16 * warp + 8 * h), scaled(4 * j), scaled(4 * j + 2));
      }
    }
    fence_proxy_async_shared();
    named_barrier_sync(barrier_id, kWarpgroupThreads);
    const uint32_t col0 = tile.n_block * kBlockN + math_wg * 64;
    if (is_store_thread && col0 < kN) {
      tma_store_2d(&tmap_d, smem.d(math_wg), static_cast<int32_t>(col0), static_cast<int32_t>(tile.row0));
      tma_store_commit();
    }
  }

  // ---- split-K: the shares of a tile meet in global memory (SplitArgs) -------------------------------------
  // A consumer's partial tile: its threads' accumulators in kAccumWords 16-byte words each (accum_word), word-major
  // with `stride` threads per word. Only threads that hold a row below M store and load theirs: thread t holds rows
  // 16 (t / 32) + (t % 32) / 4 (+ 8) of each m64 slice, so those are the first partial_threads(M) threads, and at
  // M < 64 the partials shrink to them (M = 1: 4 threads of 128, 1/32 of the bytes). splitk.partial_threads sizes
  // the workspace by the same count (tests/test_splitk_cpu.py ties the two with static_asserts).
  static DGJIT_DEVICE constexpr uint32_t partial_threads(uint32_t m) {
    if (m >= 64) return kWarpgroupThreads;
    const uint32_t rows = m % 16 < 8 ? m % 16 : 8;  // rows of the last warp's first eight, 4 lanes each
    return m / 16 * 32 + rows * 4;
  }
  static DGJIT_DEVICE uint4* partial_words(const SplitArgs& sk, const Tile& tile, uint32_t split, uint32_t math_wg,
                                           uint32_t stride) {
    const uint64_t slot = (static_cast<uint64_t>(tile.id) * tile.num_splits + split) * kNumMathWGs + math_wg;
    return static_cast<uint4*>(sk.partials) + slot * kAccumWords * stride + threadIdx.x % kWarpgroupThreads;
  }
  // Whether this thread holds a row below the tile's end in m64 slice mi.
  static DGJIT_DEVICE bool holds_valid_row(const Tile& tile, uint32_t math_wg, uint32_t mi) {
    const uint32_t t = threadIdx.x % kWarpgroupThreads;
    const uint32_t row = tile.row0 + wg_row_offset(math_wg) + 64 * mi + 16 * (t / 32) + (t % 32) / 4;
    return row < tile.row_end;
  }
  // Store this share's partial tile and count the arrival; returns whether this consumer arrived last, in which
  // case `acc` now holds the sum of all shares (in split order) and the epilogue is its to run. Costs the others
  // one partial-tile store; the last one reads num_splits partials (its own included, for a fixed order). In the
  // atomic mode every share adds into slot 0 instead and the last one reads that sum once (then zeroes it).
  static DGJIT_DEVICE bool reduce_split(const Smem& smem, const SplitArgs& sk, const Tile& tile, uint32_t math_wg,
                                        uint32_t m, TAcc (&acc)[kNumM64PerWG][kNumAccum]) {
    const uint32_t barrier_id = 1 + math_wg;
    const uint32_t stride = partial_threads(m);
    // INT32 sums are exact in any order, and four scalar reductions per word measured slower than the ordered
    // sum (INT8 64x2112x7168, 4 shares: 16.8 vs 13.5 us): integer kernels have no atomic path at all (mirror:
    // splitk.adds_atomically, which never asks them for it).
    constexpr bool kCanAdd = !kIsInt;
    const bool atomic = kCanAdd && sk.atomic != 0;
    uint4* mine = partial_words(sk, tile, atomic ? 0 : tile.split, math_wg, stride);
#pragma unroll
    for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi) {
      if (!holds_valid_row(tile, math_wg, mi)) continue;
#pragma unroll
      for (uint32_t q = 0; q < kNumAccum / 4; ++q) {
        uint4* word = mine + accum_word(mi, q, stride);
        if constexpr (kCanAdd) {
          if (atomic) {
            red_add_gpu_v4(word, acc[mi][4 * q], acc[mi][4 * q + 1], acc[mi][4 * q + 2], acc[mi][4 * q + 3]);
            continue;
          }
        }
        st_global_cg_v4(word, acc[mi][4 * q], acc[mi][4 * q + 1], acc[mi][4 * q + 2], acc[mi][4 * q + 3]);
      }
    }
    fence_acq_rel_gpu();  // this thread's partial is visible GPU-wide before thread 0 counts the arrival
    named_barrier_sync(barrier_id, kWarpgroupThreads);
    if (threadIdx.x % kWarpgroupThreads == 0) {
      uint32_t* counter = sk.arrivals + tile.id * kNumMathWGs + math_wg;
      const bool last = atomic_add_acq_rel_gpu(counter, 1) == tile.num_splits - 1;
      if (last) st_relaxed_gpu_u32(counter, 0);  // every share has arrived: ready for the next launch
      *smem.split_last(math_wg) = last ? 1u : 0u;
    }
    named_barrier_sync(barrier_id, kWarpgroupThreads);
    if (*smem.split_last(math_wg) == 0) return false;
    fence_acq_rel_gpu();  // the others' partials, released by their arrivals, are read after this
    if (atomic) {  // the one sum; then its words back to zero for the next launch (the same words: same M)
      load_partial(mine, tile, math_wg, stride, acc);
#pragma unroll
      for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi) {
        if (!holds_valid_row(tile, math_wg, mi)) continue;
#pragma unroll
        for (uint32_t q = 0; q < kNumAccum / 4; ++q)
          st_global_cg_v4(mine + accum_word(mi, q, stride), TAcc(0), TAcc(0), TAcc(0), TAcc(0));
      }
      return true;
    }
    // acc = partial 0 + partial 1 + ... in this order (the last share's own registers are not used: its place in
    // the sum would depend on which share came last). kSumBatch partials' loads are in flight at once: with small
    // tiles and many shares, one round trip per share would put S round trips on the last tile's path. Up to 128
    // registers of them; 32 with promotion, whose second accumulator set is live too (128x128 FP8 block spilled),
    // and 64 before a quantize-on-store epilogue (64x128 BF16 spilled) or with a bias on tiles over 96 columns a
    // consumer, whose bias registers are live through the tile (bias with a residual or C spilled 8-112 bytes at
    // 128x112, 64x128 and 128x128: tests/fuzz.py); narrower ones keep 4 partials in flight (128x64 with the 64-register
    // batch: 20.7 -> 21.4 us at fp16 128x2112x7168, bias+gelu+residual).
    constexpr bool kBiasTight = Epi::kBias != BiasKind::kNone && kAccumWords > 12;
    constexpr uint32_t kSumBudgetWords = kPromote ? 8 : (Epi::kQuant != QuantKind::kNone || kBiasTight ? 16 : 32);
    constexpr uint32_t kSumBatch = kAccumWords >= kSumBudgetWords ? 1
                                   : (kSumBudgetWords / kAccumWords > 8 ? 8 : kSumBudgetWords / kAccumWords);
#pragma unroll 1
    for (uint32_t s0 = 0; s0 < tile.num_splits; s0 += kSumBatch) {
      TAcc v[kSumBatch][kNumM64PerWG][kNumAccum];
#pragma unroll
      for (uint32_t b = 0; b < kSumBatch; ++b) {
        if (s0 + b < tile.num_splits) load_partial(partial_words(sk, tile, s0 + b, math_wg, stride), tile, math_wg,
                                                 stride, v[b]);
      }
#pragma unroll
      for (uint32_t b = 0; b < kSumBatch; ++b) {
        if (s0 + b >= tile.num_splits) break;
#pragma unroll
        for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi)
#pragma unroll
          for (uint32_t i = 0; i < kNumAccum; ++i) acc[mi][i] = s0 + b == 0 ? v[b][mi][i] : acc[mi][i] + v[b][mi][i];
      }
    }
    return true;
  }

  // One share's partial tile into `v` (zeros in the words of rows past the tile's end, which no store reads).
  static DGJIT_DEVICE void load_partial(const uint4* words, const Tile& tile, uint32_t math_wg, uint32_t stride,
                                        TAcc (&v)[kNumM64PerWG][kNumAccum]) {
#pragma unroll
    for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi) {
      const bool valid = holds_valid_row(tile, math_wg, mi);
#pragma unroll
      for (uint32_t q = 0; q < kNumAccum / 4; ++q) {
        if (valid) {
          ld_global_cg_v4(words + accum_word(mi, q, stride), v[mi][4 * q], v[mi][4 * q + 1], v[mi][4 * q + 2],
                          v[mi][4 * q + 3]);
        } else {
          v[mi][4 * q] = v[mi][4 * q + 1] = v[mi][4 * q + 2] = v[mi][4 * q + 3] = TAcc(0);
        }
      }
    }
  }

  // ---- kWGSplitK: the two K lanes of a 64-row tile meet in shared memory -------------------------------
  // Named barriers kLaneFull (lane 1 has stored its sums) and kLaneFree (lane 0 has read them; lane 0 arrives once
  // before its first tile, lane 1 takes that arrival after its last). The split-K partials' layout (accum_word).
  static constexpr uint32_t kLaneFull = 5;
  static constexpr uint32_t kLaneFree = 6;
  // Lane 1 hands its sums over; lane 0 adds them to its own (in that order for every tile: deterministic).
  static DGJIT_DEVICE void reduce_k_lanes(const Smem& smem, uint32_t k_lane, float (&acc)[kNumM64PerWG][kNumAccum]) {
    const uint32_t base = smem.red() + 16 * (threadIdx.x % kWarpgroupThreads);
    if (k_lane == 1) {
      named_barrier_sync(kLaneFree, 2 * kWarpgroupThreads);
#pragma unroll
      for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi)
#pragma unroll
        for (uint32_t q = 0; q < kNumAccum / 4; ++q)
          st_shared_v4_b32(base + 16 * accum_word(mi, q), __float_as_uint(acc[mi][4 * q]),
                           __float_as_uint(acc[mi][4 * q + 1]), __float_as_uint(acc[mi][4 * q + 2]),
                           __float_as_uint(acc[mi][4 * q + 3]));
      named_barrier_arrive(kLaneFull, 2 * kWarpgroupThreads);
    } else {
      named_barrier_sync(kLaneFull, 2 * kWarpgroupThreads);
#pragma unroll
      for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi)
#pragma unroll
        for (uint32_t q = 0; q < kNumAccum / 4; ++q) {
          const uint4 v = ld_shared_v4_b32(base + 16 * accum_word(mi, q));
          acc[mi][4 * q] += __uint_as_float(v.x);
          acc[mi][4 * q + 1] += __uint_as_float(v.y);
          acc[mi][4 * q + 2] += __uint_as_float(v.z);
          acc[mi][4 * q + 3] += __uint_as_float(v.w);
        }
      named_barrier_arrive(kLaneFree, 2 * kWarpgroupThreads);
    }
  }

  template <bool kWalkSplits>
  static DGJIT_DEVICE void consume(const Smem& smem, const CUtensorMap& tmap_d, const CUtensorMap& tmap_c,
                                   const CUtensorMap& tmap_r, uint32_t math_wg, uint32_t k_lane, uint32_t m,
                                   const ScaleArgs& scales, const EpilogueArgs& ea, const GroupArgs& ga,
                                   const SplitArgs& sk) {
    TAcc acc[kNumM64PerWG][kNumAccum];
    float tensor_scale = 1.0f;
    if constexpr (kScaling == Scaling::kTensor) tensor_scale = ld_global_nc_f32(scales.a) * ld_global_nc_f32(scales.b);
    // Split-K's share handling, where this launch's walk hands out shares.
    constexpr bool kShares = kSplitK && kWalkSplits;
    // The tile's bias read once its first wgmmas are queued (after_first_issue below), its bits kept in registers
    // until the epilogue parks them: read at the epilogue's start, its global load latency was exposed once per
    // tile. Same-call A/B, session 56 (us, bitwise equal): FP8 tensor bias+gelu 4096 x 32768 x 512 207.4 -> 182.3,
    // FP8 block 226.5 -> 194.9, bias only 157.1 -> 135.6, 24576 x 1536 289.6 -> 269.1; bf16 128x256 even. Not on
    // tiles whose epilogue overlaps the other consumer's MMAs (ping-pong: bf16 bias+gelu 240.9 -> 247.3 with it),
    // swapped tiles (mixed: 586 x 7168 x 2048 FP8 -6%, 300 x 7168 x 16384 +1.7%), split shares (the last share's
    // epilogue only) or K lanes (lane 0 owns the tile's epilogue).
    constexpr bool kBiasEarly =
        Epi::kBias != BiasKind::kNone && !kShares && !kWGSplitK && !kPingPong && !kSwapAB;
    Walk<kWalkSplits> scheduler(m, ga, sk);
    State state;
    uint32_t operand_phase = 0;
    Tile tile;
    uint32_t turn = 0;  // ping-pong: the consumer whose tile comes next
    uint32_t exchanges = 0;  // kCluster: the tiles whose amaxes this consumer exchanged (quantize_groups_cluster)
    // kWGSplitK: lane 0 owns the tile (bias, epilogue operands, kRow's scales, the epilogue); lane 1 only sums.
    const bool owns_tile = !kWGSplitK || k_lane == 0;
    uint32_t ring_parity = 0;  // kWGSplitK: parity of the ring position of the tile's first K block
    if constexpr (kWGSplitK) {
      if (k_lane == 0) named_barrier_arrive(kLaneFree, 2 * kWarpgroupThreads);
    }
    if constexpr (kScaling == Scaling::kRow) {
      if (owns_tile) stage_next_row_scales(smem, scales, math_wg, m, scheduler, kPingPong ? math_wg : 0);
    }
    while (scheduler.next(tile)) {
      if constexpr (kPingPong) {
        const uint32_t owner = turn;
        turn ^= 1;
        if (owner != math_wg) {  // the other consumer's tile: its K blocks pass through the ring unread here
          state.skip(tile.k_end - tile.k_begin);
          continue;
        }
      }
      if constexpr (kPingPong) {
        // Wait until the other consumer has left its previous tile's main loop (it arrives on our barrier
        // then): the ring's stages of our tile are filled after its, so waiting on them earlier could
        // match a barrier phase of its tile. The first tile of consumer 0 has no predecessor.
        if (scheduler.tiles_done() > 1) named_barrier_sync(kTurnBarrier + math_wg, 2 * kWarpgroupThreads);
      }
      const bool wait_operands = owns_tile && loads_epilogue_operands(ea, tile, math_wg);
      uint32_t bias[kBiasRegs] = {};  // kBiasEarly: the tile's bias bits (read_bias)
      const auto prefetch = [&]() {
        if constexpr (kPrefetch) {
          if (wait_operands) prefetch_epilogue_operands(smem, tmap_c, tmap_r, ea, math_wg, tile);
        }
      };
      // Split-K: only the share that arrives last runs the epilogue, which is known after the main loop; its
      // operands are loaded then.
      const auto after_first_issue = [&]() {
        if constexpr (!kShares) prefetch();
        if constexpr (kBiasEarly) read_bias(ea, tile, math_wg, bias);
      };
      // kWGSplitK: this lane's K blocks are those at ring positions of its parity, from `first` on (none when the
      // tile has one block and it is the other lane's); the ring then moves past the whole tile.
      Tile lane_tile = tile;
      State lane_state = state;
      if constexpr (kWGSplitK) {
        const uint32_t first = (k_lane ^ ring_parity) & 1;
        lane_tile.k_begin = tile.k_begin + first;
        lane_state.skip(first);
      }
      const Tile& mine = kWGSplitK ? lane_tile : tile;
      State& ring = kWGSplitK ? lane_state : state;
      if constexpr (kWGSplitK) {  // a lane without K blocks adds zeros
#pragma unroll
        for (uint32_t mi = 0; mi < kNumM64PerWG; ++mi)
#pragma unroll
          for (uint32_t i = 0; i < kNumAccum; ++i) acc[mi][i] = TAcc(0);
      }
      if (!kWGSplitK || mine.k_begin < mine.k_end) {
        if constexpr (kPromote) {
          mainloop_promoted(smem, ring, math_wg, mine, acc, after_first_issue);
        } else {
          mainloop(smem, ring, math_wg, mine, acc, after_first_issue);
        }
      } else {
        // kWGSplitK, a lane without K blocks: a one-block tile whose block is the other lane's (every other such
        // tile of a CTA). The owner still loads the epilogue's operands, which its epilogue waits for (without
        // this a 64-row FP8 tile with beta or a residual at K <= 128 hung on its second tile: tests/fuzz.py).
        after_first_issue();
      }
      if constexpr (kWGSplitK) {
        // No wgmma is in flight (the main loop waited for all); the wait tells ptxas so (C7517, as below).
        wgmma_wait_group<0>();
        state.skip(tile.k_end - tile.k_begin);
        ring_parity ^= (tile.k_end - tile.k_begin) & 1;
        reduce_k_lanes(smem, k_lane, acc);
        if (k_lane == 1) continue;
      }
      if constexpr (kShares) {
        // The tile's own share count: grouped walks split only the tiles of a last, partial wave.
        if (tile.num_splits > 1 && !reduce_split(smem, sk, tile, math_wg, m, acc)) {
          // kRow: the copies into the scale buffer must land before the next tile's copies overwrite it.
          if constexpr (kScaling == Scaling::kRow) {
            cp_async_wait_all();
            stage_next_row_scales(smem, scales, math_wg, m, scheduler, 0);
          }
          continue;
        }
        // No wgmma is in flight here (the main loop waited for all); this wait only tells ptxas so, which
        // otherwise injects one into the epilogue (C7517) for registers that either path may have defined.
        wgmma_wait_group<0>();
        prefetch();
      }
      if constexpr (kPingPong) {
        // Hand the tensor cores to the other consumer (if a next tile exists) and run our epilogue meanwhile.
        if (scheduler.has_next()) named_barrier_arrive(kTurnBarrier + (math_wg ^ 1), 2 * kWarpgroupThreads);
      }
      if constexpr (kSwapAB) {
        epilogue_swapped(smem, tmap_d, math_wg, tile, tensor_scale, ea, acc);
      } else {
        epilogue<kBiasEarly>(smem, tmap_d, math_wg, m, tile, tensor_scale, ea, ga, wait_operands, operand_phase, acc,
                             bias, exchanges++);
      }
      if constexpr (kScaling == Scaling::kRow) stage_next_row_scales(smem, scales, math_wg, m, scheduler, kPingPong ? 1 : 0);
    }
    // kWGSplitK: lane 0's arrival after its last read (or before its first tile) is lane 1's to take.
    if constexpr (kWGSplitK) {
      if (k_lane == 1) named_barrier_sync(kLaneFree, 2 * kWarpgroupThreads);
    }
    // Shared memory must outlive the last store's reads, and the writes should be done before exit.
    if (threadIdx.x % kWarpgroupThreads == 0) tma_store_wait_all<0>();
  }

  // ---- entry ------------------------------------------------------------------------------------
  // tmap_c / tmap_r: C and the residual (kernels that read neither get any valid map, e.g. D's).
  static DGJIT_DEVICE void run(const CUtensorMap& tmap_a, const CUtensorMap& tmap_b, const CUtensorMap& tmap_d,
                               const CUtensorMap& tmap_c, const CUtensorMap& tmap_r, uint32_t m,
                               const ScaleArgs& scales, const EpilogueArgs& ea, const GroupArgs& ga,
                               const SplitArgs& split_args, uint32_t a_box_rows, const EdgeMaps& edges) {
    // Split-K: between 1 and the number of K blocks (every share nonempty), whatever the host passed; 1 in other
    // kernels, where the scheduler's divisions then fold away.
    SplitArgs sk = split_args;
    if constexpr (kSplitK) {
      sk.num_splits = sk.num_splits < 1 ? 1 : (sk.num_splits > kLoopKBlocks ? kLoopKBlocks : sk.num_splits);
    } else {
      sk.num_splits = 1;
    }
    // Only 16-byte alignment of dynamic shared memory is promised; the 1024 bytes of slack in
    // kSmemBytes pay for rounding up to the swizzle repeat.
    extern __shared__ __align__(16) uint8_t dgjit_smem_raw[];
    const uint32_t raw_addr = shared_addr(dgjit_smem_raw);
    const Smem smem{dgjit_smem_raw + ((1024 - raw_addr % 1024) % 1024)};

    const uint32_t wg = warpgroup_idx();
    if (threadIdx.x == kProducerWG * kWarpgroupThreads) {
      tma_prefetch_descriptor(&tmap_a);
      tma_prefetch_descriptor(&tmap_b);
      tma_prefetch_descriptor(&tmap_d);
      if constexpr (kLoadC) tma_prefetch_descriptor(&tmap_c);
      if constexpr (kLoadR) tma_prefetch_descriptor(&tmap_r);
      if (edges.a_rows != 0) tma_prefetch_descriptor(edges.a);
      if constexpr (kBEdgeRows != 0) tma_prefetch_descriptor(edges.b);
      if constexpr (kPrefetch) {
        for (uint32_t wg_i = 0; wg_i < kNumMathWGs; ++wg_i) mbarrier_init(smem.epi_full(wg_i), 1);
      }
#pragma unroll 1
      for (uint32_t s = 0; s < kNumStages; ++s) {
        // kBlock: the scale warp's 32 deferred arrivals complete a stage together with the TMA producer's.
        mbarrier_init(smem.full(s), kScaling == Scaling::kBlock ? 1 + kScaleWarpArrivals : 1);
        // Converter arrivals per stage: every converter warp's (kRawB), one warp's (kTransB, transpose_b).
        constexpr uint32_t kConverterArrivals = kRawB ? kConverterWarps : (kTransB ? kTransBArrivals : 0);
        mbarrier_init(smem.empty(s), kStageReaders + kConverterArrivals);
        if constexpr (kConverts) mbarrier_init(smem.lo_full(s), kConverterArrivals);
      }
      if constexpr (kCluster) {
        for (uint32_t b = 0; b < 2; ++b) mbarrier_init(smem.exch_full(b), 1);  // thread 0's expect_tx
      }
      fence_mbarrier_init();
      fence_proxy_async_shared();
    }
    griddep_wait();  // everything above touched shared memory and parameters only
    // Grouped split-K: the producer's second warp counts the groups' tiles meanwhile (GroupedTileScheduler::plan);
    // after the barrier a launch whose plan splits runs the roles with the splitting walk, any other the plain one.
    if constexpr (kGrouped && kSplitK) {
      if (threadIdx.x / 32 == kProducerWG * 4 + 1) Walk<true>::plan(ga, m, sk.num_splits, smem.split_plan());
    }
    __syncthreads();
    // kCluster: no CTA sends to a peer's exchange barrier before the peer has initialised it.
    if constexpr (kCluster) cluster_sync();
    if constexpr (kGrouped && kSplitK) {
      sk.whole_tiles = smem.split_plan()[0];
      sk.num_splits = smem.split_plan()[1];
      if (sk.num_splits > 1) {
        roles<true>(smem, wg, tmap_a, tmap_b, tmap_d, tmap_c, tmap_r, m, scales, ea, ga, sk, a_box_rows, edges);
        return;
      }
    }
    roles<!kGrouped>(smem, wg, tmap_a, tmap_b, tmap_d, tmap_c, tmap_r, m, scales, ea, ga, sk, a_box_rows, edges);
    // kCluster: every exchange into this CTA's shared memory was waited for by its consumers, but its own last
    // sends to its peers may still be in flight: no CTA leaves before all of them are done.
    if constexpr (kCluster) {
      __syncwarp();
      cluster_sync();
    }
  }

  // The CTA's roles, each walking the tiles (kWalkSplits: with K shares; grouped kernels only where run() found a
  // launch's plan to split).
  template <bool kWalkSplits>
  static DGJIT_DEVICE void roles(const Smem& smem, uint32_t wg, const CUtensorMap& tmap_a, const CUtensorMap& tmap_b,
                                 const CUtensorMap& tmap_d, const CUtensorMap& tmap_c, const CUtensorMap& tmap_r,
                                 uint32_t m, const ScaleArgs& scales, const EpilogueArgs& ea, const GroupArgs& ga,
                                 const SplitArgs& sk, uint32_t a_box_rows, const EdgeMaps& edges) {
    if (wg == kProducerWG) {
      setmaxnreg_dec<kSideRegs>();
      if (warp_idx_in_warpgroup() == 0 && elect_one()) {
        produce<kWalkSplits>(smem, tmap_a, tmap_b, m, ga, sk, scales, a_box_rows, edges);
      }
      if constexpr (kScaling == Scaling::kBlock) {
        if (warp_idx_in_warpgroup() == 1) produce_scales<kWalkSplits>(smem, scales, m, ga, sk);
      }
      if constexpr (kRawB) {
        if (warp_idx_in_warpgroup() >= 1) convert_lo<kWalkSplits>(smem, m, ga, sk);
      }
      if constexpr (kTransB) {
        if (warp_idx_in_warpgroup() >= 1) transpose_b<kWalkSplits>(smem, m, ga, sk);
      }
    } else if (wg < kNumMathWGs) {
      if constexpr (kConsumerRegs > kLaunchRegs) setmaxnreg_inc<kConsumerRegs>();
      consume<kWalkSplits>(smem, tmap_d, tmap_c, tmap_r, wg, 0, m, scales, ea, ga, sk);
    } else if constexpr (kWGSplitK) {
      setmaxnreg_inc<kConsumerRegs>();
      consume<kWalkSplits>(smem, tmap_d, tmap_c, tmap_r, 0, 1, m, scales, ea, ga, sk);  // K lane 1 of the 64-row tile
    } else {
      setmaxnreg_dec<kSideRegs>();  // idle warpgroup (kBlockM = 64): give the registers back
      if constexpr (kRawB && kIdleWGConverts) convert_lo<kWalkSplits>(smem, m, ga, sk);
      if constexpr (kTransB && kIdleWGConverts) transpose_b<kWalkSplits>(smem, m, ga, sk);
    }
  }
};

// The kernel body as a free function (what the rendered entry calls).
template <class Gemm>
DGJIT_DEVICE void gemm_sm90_body(const CUtensorMap& tmap_a, const CUtensorMap& tmap_b, const CUtensorMap& tmap_d,
                                 const CUtensorMap& tmap_c, const CUtensorMap& tmap_r, uint32_t m,
                                 const ScaleArgs& scales, const EpilogueArgs& ea, const GroupArgs& ga,
                                 const SplitArgs& sk, uint32_t a_box_rows, const EdgeMaps& edges = {}) {
  Gemm::run(tmap_a, tmap_b, tmap_d, tmap_c, tmap_r, m, scales, ea, ga, sk, a_box_rows, edges);
}

}  // namespace sm90
}  // namespace dgjit
