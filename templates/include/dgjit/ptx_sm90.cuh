// One small wrapper per sm_90a PTX instruction used by the Hopper family (TMA, mbarrier, WGMMA,
// setmaxnreg). The kernel body in gemm_sm90.cuh is written only in terms of these, so that it reads
// like the protocol (producer loads, consumers multiply, epilogue stores) and every instruction's
// contract is stated once, here.
//
// Conventions: "smem address" means the 32-bit address in the shared-memory window (what PTX's
// .shared state space takes); a generic pointer is converted once with shared_addr(). Everything
// lives in dgjit::sm90 so that it cannot collide with the sm_80 wrappers of the same names.
#pragma once
#include "dgjit/common.cuh"

#ifndef DGJIT_CUTENSORMAP_DEFINED
#define DGJIT_CUTENSORMAP_DEFINED
// The driver's opaque 128-byte tensor map (cuda.h is not available under NVRTC without include
// paths). It is encoded on the host (deepgemm_jit/tma.py) and passed by value as a
// __grid_constant__ kernel parameter, so TMA instructions can address it in the param space.
struct alignas(64) CUtensorMap { unsigned long long opaque[16]; };
#endif

namespace dgjit {
namespace sm90 {

// ------------------------------------------------------------------------------------------------
// Thread geometry
// ------------------------------------------------------------------------------------------------

constexpr uint32_t kWarpgroupThreads = 128;

DGJIT_DEVICE uint32_t shared_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The warpgroup index, made warp-uniform with shfl so the compiler knows every branch on it is
// uniform (role dispatch and setmaxnreg must be taken by whole warpgroups).
DGJIT_DEVICE uint32_t warpgroup_idx() {
  return __shfl_sync(0xffffffffu, threadIdx.x / kWarpgroupThreads, 0);
}
DGJIT_DEVICE uint32_t warp_idx_in_warpgroup() {
  return __shfl_sync(0xffffffffu, (threadIdx.x / 32) % 4, 0);
}
DGJIT_DEVICE uint32_t lane_idx() { return threadIdx.x % 32; }

// elect.sync: exactly one active lane of the (fully active) warp gets true. Cheaper and clearer than
// "lane == 0" because the compiler learns the predicate is warp-uniform-elected.
DGJIT_DEVICE bool elect_one() {
  uint32_t is_elected = 0;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "elect.sync _|p, 0xffffffff;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(is_elected));
  return is_elected != 0;
}

// setmaxnreg: move registers between warpgroups of the CTA. The producer needs few registers
// (addresses and loop counters) and gives them to the consumers, whose accumulators need many.
// Only effective when the kernel has a register cap at entry (__launch_bounds__(threads, 1)) and the
// calls sit in the two branches of one role if/else (ptxas warns C7508 otherwise).
template <uint32_t kRegs>
DGJIT_DEVICE void setmaxnreg_dec() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg takes 24..256, multiple of 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" : : "n"(kRegs));
}
template <uint32_t kRegs>
DGJIT_DEVICE void setmaxnreg_inc() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg takes 24..256, multiple of 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" : : "n"(kRegs));
}

// Named barrier over a subset of warps (here: one consumer warpgroup), so the two consumer
// warpgroups never wait on each other in their epilogues. ID 0 is __syncthreads'.
DGJIT_DEVICE void named_barrier_sync(uint32_t barrier_id, uint32_t num_threads) {
  asm volatile("bar.sync %0, %1;\n" : : "r"(barrier_id), "r"(num_threads) : "memory");
}
// Arrive without waiting (the other side of a producer / consumer pair of named-barrier users).
DGJIT_DEVICE void named_barrier_arrive(uint32_t barrier_id, uint32_t num_threads) {
  asm volatile("bar.arrive %0, %1;\n" : : "r"(barrier_id), "r"(num_threads) : "memory");
}

// ------------------------------------------------------------------------------------------------
// mbarrier (shared-memory transaction barriers): the producer/consumer handshake of the smem ring
// ------------------------------------------------------------------------------------------------

DGJIT_DEVICE void mbarrier_init(uint64_t* bar, uint32_t arrive_count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" : : "r"(shared_addr(bar)), "r"(arrive_count));
}

// Makes barrier initialisation visible to the async proxy (TMA's complete_tx) and, for clusters,
// to the peer CTAs; must precede the CTA-wide barrier that publishes the initialised barriers.
DGJIT_DEVICE void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" : : : "memory");
}

// Arrive once and announce `tx_bytes` bytes the async proxy will deliver in this phase: the phase
// completes when all arrivals are in AND all announced bytes have landed.
DGJIT_DEVICE void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t tx_bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               : : "r"(shared_addr(bar)), "r"(tx_bytes) : "memory");
}

// Announce `tx_bytes` more bytes for the current phase without arriving (a second issuer's bulk copy).
DGJIT_DEVICE void mbarrier_expect_tx(uint64_t* bar, uint32_t tx_bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n"
               : : "r"(shared_addr(bar)), "r"(tx_bytes) : "memory");
}

DGJIT_DEVICE void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" : : "r"(shared_addr(bar)) : "memory");
}

// Blocks until the phase with parity `phase` has completed. A fresh barrier is in phase 0, so waiting
// on parity 1 returns at once: that is how "all stages empty" is expressed at start-up without an
// extra arrival. try_wait (not test_wait) lets the hardware suspend the thread for a while.
// The retry loop is in C++ because inline-asm labels would be duplicated when this is inlined twice.
DGJIT_DEVICE void mbarrier_wait(uint64_t* bar, uint32_t phase) {
  const uint32_t addr = shared_addr(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done) : "r"(addr), "r"(phase) : "memory");
  } while (done == 0);
}

// ---- stores into another CTA of a thread-block cluster (distributed shared memory) ----
// The address of the same shared-memory location in the CTA of rank `cta_rank` of this cluster.
DGJIT_DEVICE uint32_t cluster_shared_addr(uint32_t addr, uint32_t cta_rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(cta_rank));
  return remote;
}
// Two words into another CTA's shared memory (`remote_addr`, 8-byte aligned), completing 8 bytes of transactions on
// its barrier `remote_bar` (both cluster_shared_addr) once written: the receiver's wait on that barrier then sees
// them. No fence: a release at cluster scope (mbarrier.arrive.release.cluster after st.shared::cluster) compiled to
// MEMBAR.ALL.GPU, and the acquiring wait to an L1 invalidation (CCTL.IVALL), on every use.
DGJIT_DEVICE void st_async_cluster_v2(uint32_t remote_addr, uint32_t lo, uint32_t hi, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];\n"
               : : "r"(remote_addr), "r"(lo), "r"(hi), "r"(remote_bar) : "memory");
}

// ------------------------------------------------------------------------------------------------
// Proxy fences
// ------------------------------------------------------------------------------------------------

// Generic-proxy writes to shared memory (st.shared in the epilogue) are not ordered with later
// async-proxy reads (TMA store, wgmma) of the same bytes unless each writing thread fences.
DGJIT_DEVICE void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" : : : "memory");
}

// ------------------------------------------------------------------------------------------------
// TMA (cp.async.bulk.tensor): whole tiles between global and shared memory, described by a tensor map
// ------------------------------------------------------------------------------------------------

// Pull the descriptor into the TMA unit's cache before the first copy that uses it.
DGJIT_DEVICE void tma_prefetch_descriptor(const CUtensorMap* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" : : "l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}

// Box at (col, row) -> smem; completion is signalled as transaction bytes on `bar`. Coordinates are
// in elements, innermost first. Out-of-bounds parts of the box are zero-filled but still counted in
// the transaction bytes, which is what makes M/N/K tails need no special code.
DGJIT_DEVICE void tma_load_2d(void* smem_dst, const CUtensorMap* tmap, uint64_t* bar,
                              int32_t col, int32_t row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n"
      :
      : "r"(shared_addr(smem_dst)), "l"(reinterpret_cast<uint64_t>(tmap)), "r"(shared_addr(bar)),
        "r"(col), "r"(row)
      : "memory");
}

// An L2 cache policy (createpolicy, sm_80+) that marks every line an access brings in as the first to be evicted.
DGJIT_DEVICE uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// tma_load_2d with an L2 cache policy on the lines the copy reads.
DGJIT_DEVICE void tma_load_2d(void* smem_dst, const CUtensorMap* tmap, uint64_t* bar, int32_t col, int32_t row,
                              uint64_t l2_policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;\n"
      :
      : "r"(shared_addr(smem_dst)), "l"(reinterpret_cast<uint64_t>(tmap)), "r"(shared_addr(bar)),
        "r"(col), "r"(row), "l"(l2_policy)
      : "memory");
}

// `bytes` contiguous bytes global -> shared without a tensor map (cp.async.bulk, SASS UBLKCP); completion is signalled
// as transaction bytes on `bar`, like a tensor load's. PTX ISA: both addresses 16-byte aligned and `bytes` a multiple
// of 16 (docs/experiments/sm90-fp8-bulk-a-scales.md has the sources); the callers guarantee it, nothing checks it here.
DGJIT_DEVICE void bulk_load(uint32_t smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      :
      : "r"(smem_dst), "l"(reinterpret_cast<uint64_t>(gmem_src)), "r"(bytes), "r"(shared_addr(bar))
      : "memory");
}

// smem -> box at (col, row). Parts of the box outside the tensor are not written: M/N tails of D are
// clipped by the hardware. Completion is tracked per thread with bulk groups (commit/wait below).
DGJIT_DEVICE void tma_store_2d(const CUtensorMap* tmap, const void* smem_src, int32_t col, int32_t row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
      :
      : "l"(reinterpret_cast<uint64_t>(tmap)), "r"(shared_addr(smem_src)), "r"(col), "r"(row)
      : "memory");
}

DGJIT_DEVICE void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" : : : "memory"); }

// Wait until at most kPending bulk groups are still reading their shared-memory source, so the
// buffer can be overwritten (the global writes may still be in flight).
template <int kPending>
DGJIT_DEVICE void tma_store_wait_read() {
  static_assert(kPending >= 0 && kPending <= 7, "bulk wait_group takes a small immediate");
  asm volatile("cp.async.bulk.wait_group.read %0;\n" : : "n"(kPending) : "memory");
}

// Wait until the stores are complete (writes performed), e.g. before the CTA exits.
template <int kPending>
DGJIT_DEVICE void tma_store_wait_all() {
  static_assert(kPending >= 0 && kPending <= 7, "bulk wait_group takes a small immediate");
  asm volatile("cp.async.bulk.wait_group %0;\n" : : "n"(kPending) : "memory");
}

// ------------------------------------------------------------------------------------------------
// WGMMA: warpgroup-wide asynchronous MMA, operands from shared memory via matrix descriptors
// ------------------------------------------------------------------------------------------------

// Orders this warpgroup's earlier register accesses (accumulators) before the next wgmma reads
// them; required before the first wgmma of a batch.
DGJIT_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" : : : "memory"); }

// Closes the batch of wgmmas issued since the last commit into one group that can be waited on.
DGJIT_DEVICE void wgmma_commit_group() { asm volatile("wgmma.commit_group.sync.aligned;\n" : : : "memory"); }

// Waits until at most kPending committed groups are in flight. With kPending = 1 the tensor cores
// keep working on the newest group while the oldest one's smem stage is handed back.
template <int kPending>
DGJIT_DEVICE void wgmma_wait_group() {
  static_assert(kPending >= 0 && kPending <= 7, "wgmma.wait_group takes a small immediate");
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" : : "n"(kPending) : "memory");
}

// The compiler sees the wgmma asm as writing the accumulators synchronously; without this it could
// move reads of them (epilogue) above wgmma_wait_group. An empty asm that "reads and writes" the
// register pins the order.
DGJIT_DEVICE void fence_operand(float& reg) { asm volatile("" : "+f"(reg) : : "memory"); }
DGJIT_DEVICE void fence_operand(int32_t& reg) { asm volatile("" : "+r"(reg) : : "memory"); }

// Shared-memory matrix descriptor (64 bits) for a K-major operand tile laid out the way TMA writes
// a box whose inner extent equals the swizzle span:
//   bits  0..13  start address >> 4
//   bits 16..29  leading-dimension byte offset >> 4: unused for swizzled K-major tiles whose K extent
//                per instruction (32 bytes) stays inside one swizzle row; set to 1 as a harmless value
//   bits 32..45  stride-dimension byte offset >> 4: distance between consecutive 8-row groups
//                = 8 rows * kSwizzleBytes (one swizzle atom)
//   bits 49..51  base offset: 0, as every stage buffer is aligned to the 1024-byte swizzle repeat
//   bits 62..63  layout: 1 = 128B swizzle, 2 = 64B, 3 = 32B, 0 = none (interleaved)
// Advancing along K inside the swizzle row is a plain add of (bytes >> 4) to the start address: the
// hardware applies the XOR swizzle to the final address bits, exactly as TMA did when writing.
template <uint32_t kSwizzleBytes>
DGJIT_DEVICE constexpr uint64_t make_smem_desc_k_major(uint32_t smem_addr) {
  static_assert(kSwizzleBytes == 128 || kSwizzleBytes == 64 || kSwizzleBytes == 32,
                "K-major wgmma operands use a 32/64/128-byte swizzle here");
  constexpr uint64_t kLayout = kSwizzleBytes == 128 ? 1 : (kSwizzleBytes == 64 ? 2 : 3);
  constexpr uint64_t kStrideBytes = 8 * kSwizzleBytes;
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>(1) << 16;
  desc |= (kStrideBytes >> 4) << 32;
  desc |= kLayout << 62;
  return desc;
}

// Shared-memory matrix descriptor (64 bits) for an MN-major operand tile (wgmma's imm-trans = 1; 16-bit types
// only) laid out the way TMA writes boxes of 64 MN elements (128 bytes, the swizzle span) x K rows with the
// 128-byte swizzle, the boxes one after the other along MN, kMnBlockBytes apart:
//   byte of element (k, mn) before the swizzle = (mn / 64) * kMnBlockBytes + k * 128 + (mn % 64) * 2
//   bits 16..29  leading-dimension byte offset >> 4: for MN-major swizzled layouts the distance between
//                consecutive 64-element (128-byte) blocks along MN = kMnBlockBytes
//   bits 32..45  stride-dimension byte offset >> 4: the distance between consecutive groups of 8 K rows
//                = 8 rows * 128 bytes (one swizzle atom)
//   bits 62..63  1 = 128B swizzle; base offset 0 (every block starts on the 1024-byte swizzle repeat)
// (PTX ISA "Major-ness supported by strides"; docs/experiments/sm90-mn-major.md has the sources.) One k16
// instruction reads 16 K rows = two 8-row groups; the next K step starts 16 rows (2048 bytes) further, which keeps
// the start address on the 1024-byte repeat, so advancing is the same plain add as for K-major tiles.
template <uint32_t kMnBlockBytes>
DGJIT_DEVICE constexpr uint64_t make_smem_desc_mn_major(uint32_t smem_addr) {
  static_assert(kMnBlockBytes % 1024 == 0 && (kMnBlockBytes >> 4) < (1u << 14),
                "MN blocks start on the 1024-byte swizzle repeat and their distance fits the 14-bit LBO field");
  constexpr uint64_t kKGroupBytes = 8 * 128;
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>(kMnBlockBytes >> 4) << 16;
  desc |= (kKGroupBytes >> 4) << 32;
  desc |= static_cast<uint64_t>(1) << 62;
  return desc;
}

// Offsetting a descriptor by a byte distance within the same buffer (no carry leaves the 14-bit
// start-address field: shared memory is < 256 KiB).
DGJIT_DEVICE constexpr uint64_t smem_desc_advance(uint64_t desc, uint32_t offset_bytes) {
  return desc + static_cast<uint64_t>(offset_bytes >> 4);
}

// The operand kinds of wgmma that this library emits: FP32 accumulation for the floating types (FP8 in
// all four E4M3/E5M2 pairings of A and B), INT32 accumulation for s8 x s8.
enum class MmaKind { kBF16, kFP16, kTF32, kE4M3E4M3, kE4M3E5M2, kE5M2E4M3, kE5M2E5M2, kS8S8 };

// wgmma.mma_async m64nNk{16,8}: D(64xN, fp32, registers) (+)= A(64xK, smem) * B(NxK, smem)^T.
// A instruction names its register count (N/2 per thread), so each N needs its own asm string. The
// tables below spell the operand numbers for every N in 8..256 step 8 (G = N/8 groups of 4 registers);
// they are mechanical (generated once), and DGJIT_DEFINE_WGMMA stamps out one specialisation per N.
// scale_d = 0 makes the instruction ignore (overwrite) the accumulators: used for the first K step of
// a tile, so accumulators never need zeroing. trans_a/trans_b select MN-major smem operands (16-bit
// types only; tf32 supports K-major only and has no transpose immediates).
// Operand numbers of the accumulator registers, as the asm string spells them: group g holds the 4 registers
// of one 8-column slice of the m64nN tile (registers 4g .. 4g+3).
#define DGJIT_WGMMA_ACC_IDX_1 "%0, %1, %2, %3"
#define DGJIT_WGMMA_ACC_IDX_2 DGJIT_WGMMA_ACC_IDX_1 ", %4, %5, %6, %7"
#define DGJIT_WGMMA_ACC_IDX_3 DGJIT_WGMMA_ACC_IDX_2 ", %8, %9, %10, %11"
#define DGJIT_WGMMA_ACC_IDX_4 DGJIT_WGMMA_ACC_IDX_3 ", %12, %13, %14, %15"
#define DGJIT_WGMMA_ACC_IDX_5 DGJIT_WGMMA_ACC_IDX_4 ", %16, %17, %18, %19"
#define DGJIT_WGMMA_ACC_IDX_6 DGJIT_WGMMA_ACC_IDX_5 ", %20, %21, %22, %23"
#define DGJIT_WGMMA_ACC_IDX_7 DGJIT_WGMMA_ACC_IDX_6 ", %24, %25, %26, %27"
#define DGJIT_WGMMA_ACC_IDX_8 DGJIT_WGMMA_ACC_IDX_7 ", %28, %29, %30, %31"
#define DGJIT_WGMMA_ACC_IDX_9 DGJIT_WGMMA_ACC_IDX_8 ", %32, %33, %34, %35"
#define DGJIT_WGMMA_ACC_IDX_10 DGJIT_WGMMA_ACC_IDX_9 ", %36, %37, %38, %39"
#define DGJIT_WGMMA_ACC_IDX_11 DGJIT_WGMMA_ACC_IDX_10 ", %40, %41, %42, %43"
#define DGJIT_WGMMA_ACC_IDX_12 DGJIT_WGMMA_ACC_IDX_11 ", %44, %45, %46, %47"
#define DGJIT_WGMMA_ACC_IDX_13 DGJIT_WGMMA_ACC_IDX_12 ", %48, %49, %50, %51"
#define DGJIT_WGMMA_ACC_IDX_14 DGJIT_WGMMA_ACC_IDX_13 ", %52, %53, %54, %55"
#define DGJIT_WGMMA_ACC_IDX_15 DGJIT_WGMMA_ACC_IDX_14 ", %56, %57, %58, %59"
#define DGJIT_WGMMA_ACC_IDX_16 DGJIT_WGMMA_ACC_IDX_15 ", %60, %61, %62, %63"
#define DGJIT_WGMMA_ACC_IDX_17 DGJIT_WGMMA_ACC_IDX_16 ", %64, %65, %66, %67"
#define DGJIT_WGMMA_ACC_IDX_18 DGJIT_WGMMA_ACC_IDX_17 ", %68, %69, %70, %71"
#define DGJIT_WGMMA_ACC_IDX_19 DGJIT_WGMMA_ACC_IDX_18 ", %72, %73, %74, %75"
#define DGJIT_WGMMA_ACC_IDX_20 DGJIT_WGMMA_ACC_IDX_19 ", %76, %77, %78, %79"
#define DGJIT_WGMMA_ACC_IDX_21 DGJIT_WGMMA_ACC_IDX_20 ", %80, %81, %82, %83"
#define DGJIT_WGMMA_ACC_IDX_22 DGJIT_WGMMA_ACC_IDX_21 ", %84, %85, %86, %87"
#define DGJIT_WGMMA_ACC_IDX_23 DGJIT_WGMMA_ACC_IDX_22 ", %88, %89, %90, %91"
#define DGJIT_WGMMA_ACC_IDX_24 DGJIT_WGMMA_ACC_IDX_23 ", %92, %93, %94, %95"
#define DGJIT_WGMMA_ACC_IDX_25 DGJIT_WGMMA_ACC_IDX_24 ", %96, %97, %98, %99"
#define DGJIT_WGMMA_ACC_IDX_26 DGJIT_WGMMA_ACC_IDX_25 ", %100, %101, %102, %103"
#define DGJIT_WGMMA_ACC_IDX_27 DGJIT_WGMMA_ACC_IDX_26 ", %104, %105, %106, %107"
#define DGJIT_WGMMA_ACC_IDX_28 DGJIT_WGMMA_ACC_IDX_27 ", %108, %109, %110, %111"
#define DGJIT_WGMMA_ACC_IDX_29 DGJIT_WGMMA_ACC_IDX_28 ", %112, %113, %114, %115"
#define DGJIT_WGMMA_ACC_IDX_30 DGJIT_WGMMA_ACC_IDX_29 ", %116, %117, %118, %119"
#define DGJIT_WGMMA_ACC_IDX_31 DGJIT_WGMMA_ACC_IDX_30 ", %120, %121, %122, %123"
#define DGJIT_WGMMA_ACC_IDX_32 DGJIT_WGMMA_ACC_IDX_31 ", %124, %125, %126, %127"

// The matching output operand lists, with the constraint `c` ("+f" for FP32 accumulators, "+r" for
// INT32): the accumulators are read and written by every wgmma.
#define DGJIT_WGMMA_ACC_OPS_1(c, d) c(d[0]), c(d[1]), c(d[2]), c(d[3])
#define DGJIT_WGMMA_ACC_OPS_2(c, d) DGJIT_WGMMA_ACC_OPS_1(c, d), c(d[4]), c(d[5]), c(d[6]), c(d[7])
#define DGJIT_WGMMA_ACC_OPS_3(c, d) DGJIT_WGMMA_ACC_OPS_2(c, d), c(d[8]), c(d[9]), c(d[10]), c(d[11])
#define DGJIT_WGMMA_ACC_OPS_4(c, d) DGJIT_WGMMA_ACC_OPS_3(c, d), c(d[12]), c(d[13]), c(d[14]), c(d[15])
#define DGJIT_WGMMA_ACC_OPS_5(c, d) DGJIT_WGMMA_ACC_OPS_4(c, d), c(d[16]), c(d[17]), c(d[18]), c(d[19])
#define DGJIT_WGMMA_ACC_OPS_6(c, d) DGJIT_WGMMA_ACC_OPS_5(c, d), c(d[20]), c(d[21]), c(d[22]), c(d[23])
#define DGJIT_WGMMA_ACC_OPS_7(c, d) DGJIT_WGMMA_ACC_OPS_6(c, d), c(d[24]), c(d[25]), c(d[26]), c(d[27])
#define DGJIT_WGMMA_ACC_OPS_8(c, d) DGJIT_WGMMA_ACC_OPS_7(c, d), c(d[28]), c(d[29]), c(d[30]), c(d[31])
#define DGJIT_WGMMA_ACC_OPS_9(c, d) DGJIT_WGMMA_ACC_OPS_8(c, d), c(d[32]), c(d[33]), c(d[34]), c(d[35])
#define DGJIT_WGMMA_ACC_OPS_10(c, d) DGJIT_WGMMA_ACC_OPS_9(c, d), c(d[36]), c(d[37]), c(d[38]), c(d[39])
#define DGJIT_WGMMA_ACC_OPS_11(c, d) DGJIT_WGMMA_ACC_OPS_10(c, d), c(d[40]), c(d[41]), c(d[42]), c(d[43])
#define DGJIT_WGMMA_ACC_OPS_12(c, d) DGJIT_WGMMA_ACC_OPS_11(c, d), c(d[44]), c(d[45]), c(d[46]), c(d[47])
#define DGJIT_WGMMA_ACC_OPS_13(c, d) DGJIT_WGMMA_ACC_OPS_12(c, d), c(d[48]), c(d[49]), c(d[50]), c(d[51])
#define DGJIT_WGMMA_ACC_OPS_14(c, d) DGJIT_WGMMA_ACC_OPS_13(c, d), c(d[52]), c(d[53]), c(d[54]), c(d[55])
#define DGJIT_WGMMA_ACC_OPS_15(c, d) DGJIT_WGMMA_ACC_OPS_14(c, d), c(d[56]), c(d[57]), c(d[58]), c(d[59])
#define DGJIT_WGMMA_ACC_OPS_16(c, d) DGJIT_WGMMA_ACC_OPS_15(c, d), c(d[60]), c(d[61]), c(d[62]), c(d[63])
#define DGJIT_WGMMA_ACC_OPS_17(c, d) DGJIT_WGMMA_ACC_OPS_16(c, d), c(d[64]), c(d[65]), c(d[66]), c(d[67])
#define DGJIT_WGMMA_ACC_OPS_18(c, d) DGJIT_WGMMA_ACC_OPS_17(c, d), c(d[68]), c(d[69]), c(d[70]), c(d[71])
#define DGJIT_WGMMA_ACC_OPS_19(c, d) DGJIT_WGMMA_ACC_OPS_18(c, d), c(d[72]), c(d[73]), c(d[74]), c(d[75])
#define DGJIT_WGMMA_ACC_OPS_20(c, d) DGJIT_WGMMA_ACC_OPS_19(c, d), c(d[76]), c(d[77]), c(d[78]), c(d[79])
#define DGJIT_WGMMA_ACC_OPS_21(c, d) DGJIT_WGMMA_ACC_OPS_20(c, d), c(d[80]), c(d[81]), c(d[82]), c(d[83])
#define DGJIT_WGMMA_ACC_OPS_22(c, d) DGJIT_WGMMA_ACC_OPS_21(c, d), c(d[84]), c(d[85]), c(d[86]), c(d[87])
#define DGJIT_WGMMA_ACC_OPS_23(c, d) DGJIT_WGMMA_ACC_OPS_22(c, d), c(d[88]), c(d[89]), c(d[90]), c(d[91])
#define DGJIT_WGMMA_ACC_OPS_24(c, d) DGJIT_WGMMA_ACC_OPS_23(c, d), c(d[92]), c(d[93]), c(d[94]), c(d[95])
#define DGJIT_WGMMA_ACC_OPS_25(c, d) DGJIT_WGMMA_ACC_OPS_24(c, d), c(d[96]), c(d[97]), c(d[98]), c(d[99])
#define DGJIT_WGMMA_ACC_OPS_26(c, d) DGJIT_WGMMA_ACC_OPS_25(c, d), c(d[100]), c(d[101]), c(d[102]), c(d[103])
#define DGJIT_WGMMA_ACC_OPS_27(c, d) DGJIT_WGMMA_ACC_OPS_26(c, d), c(d[104]), c(d[105]), c(d[106]), c(d[107])
#define DGJIT_WGMMA_ACC_OPS_28(c, d) DGJIT_WGMMA_ACC_OPS_27(c, d), c(d[108]), c(d[109]), c(d[110]), c(d[111])
#define DGJIT_WGMMA_ACC_OPS_29(c, d) DGJIT_WGMMA_ACC_OPS_28(c, d), c(d[112]), c(d[113]), c(d[114]), c(d[115])
#define DGJIT_WGMMA_ACC_OPS_30(c, d) DGJIT_WGMMA_ACC_OPS_29(c, d), c(d[116]), c(d[117]), c(d[118]), c(d[119])
#define DGJIT_WGMMA_ACC_OPS_31(c, d) DGJIT_WGMMA_ACC_OPS_30(c, d), c(d[120]), c(d[121]), c(d[122]), c(d[123])
#define DGJIT_WGMMA_ACC_OPS_32(c, d) DGJIT_WGMMA_ACC_OPS_31(c, d), c(d[124]), c(d[125]), c(d[126]), c(d[127])

// Operand numbers that follow the 4g accumulators: desc_a, desc_b, scale_d, trans_a, trans_b.
#define DGJIT_WGMMA_TAIL_IDX_1 4, 5, 6, 7, 8
#define DGJIT_WGMMA_TAIL_IDX_2 8, 9, 10, 11, 12
#define DGJIT_WGMMA_TAIL_IDX_3 12, 13, 14, 15, 16
#define DGJIT_WGMMA_TAIL_IDX_4 16, 17, 18, 19, 20
#define DGJIT_WGMMA_TAIL_IDX_5 20, 21, 22, 23, 24
#define DGJIT_WGMMA_TAIL_IDX_6 24, 25, 26, 27, 28
#define DGJIT_WGMMA_TAIL_IDX_7 28, 29, 30, 31, 32
#define DGJIT_WGMMA_TAIL_IDX_8 32, 33, 34, 35, 36
#define DGJIT_WGMMA_TAIL_IDX_9 36, 37, 38, 39, 40
#define DGJIT_WGMMA_TAIL_IDX_10 40, 41, 42, 43, 44
#define DGJIT_WGMMA_TAIL_IDX_11 44, 45, 46, 47, 48
#define DGJIT_WGMMA_TAIL_IDX_12 48, 49, 50, 51, 52
#define DGJIT_WGMMA_TAIL_IDX_13 52, 53, 54, 55, 56
#define DGJIT_WGMMA_TAIL_IDX_14 56, 57, 58, 59, 60
#define DGJIT_WGMMA_TAIL_IDX_15 60, 61, 62, 63, 64
#define DGJIT_WGMMA_TAIL_IDX_16 64, 65, 66, 67, 68
#define DGJIT_WGMMA_TAIL_IDX_17 68, 69, 70, 71, 72
#define DGJIT_WGMMA_TAIL_IDX_18 72, 73, 74, 75, 76
#define DGJIT_WGMMA_TAIL_IDX_19 76, 77, 78, 79, 80
#define DGJIT_WGMMA_TAIL_IDX_20 80, 81, 82, 83, 84
#define DGJIT_WGMMA_TAIL_IDX_21 84, 85, 86, 87, 88
#define DGJIT_WGMMA_TAIL_IDX_22 88, 89, 90, 91, 92
#define DGJIT_WGMMA_TAIL_IDX_23 92, 93, 94, 95, 96
#define DGJIT_WGMMA_TAIL_IDX_24 96, 97, 98, 99, 100
#define DGJIT_WGMMA_TAIL_IDX_25 100, 101, 102, 103, 104
#define DGJIT_WGMMA_TAIL_IDX_26 104, 105, 106, 107, 108
#define DGJIT_WGMMA_TAIL_IDX_27 108, 109, 110, 111, 112
#define DGJIT_WGMMA_TAIL_IDX_28 112, 113, 114, 115, 116
#define DGJIT_WGMMA_TAIL_IDX_29 116, 117, 118, 119, 120
#define DGJIT_WGMMA_TAIL_IDX_30 120, 121, 122, 123, 124
#define DGJIT_WGMMA_TAIL_IDX_31 124, 125, 126, 127, 128
#define DGJIT_WGMMA_TAIL_IDX_32 128, 129, 130, 131, 132

#define DGJIT_WGMMA_ASM_16BIT(N, T, ACC, TAIL) DGJIT_WGMMA_ASM_16BIT_(N, T, ACC, TAIL)
#define DGJIT_WGMMA_ASM_16BIT_(N, T, ACC, da, db, sd, ta, tb)                                      \
  "{\n"                                                                                             \
  ".reg .pred p;\n"                                                                                 \
  "setp.ne.b32 p, %" #sd ", 0;\n"                                                                   \
  "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " {" ACC "}, %" #da ", %" #db         \
  ", p, 1, 1, %" #ta ", %" #tb ";\n"                                                                \
  "}\n"

#define DGJIT_WGMMA_ASM_TF32(N, ACC, TAIL) DGJIT_WGMMA_ASM_TF32_(N, ACC, TAIL)
#define DGJIT_WGMMA_ASM_TF32_(N, ACC, da, db, sd, ta, tb)                                          \
  "{\n"                                                                                             \
  ".reg .pred p;\n"                                                                                 \
  "setp.ne.b32 p, %" #sd ", 0;\n"                                                                   \
  "wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 {" ACC "}, %" #da ", %" #db           \
  ", p, 1, 1;\n"                                                                                    \
  "}\n"

// 8-bit operands: k32, K-major only (no transpose immediates). FP8 keeps the +1 operand scales; the
// integer form has none.
#define DGJIT_WGMMA_ASM_FP8(N, TA, TB, ACC, TAIL) DGJIT_WGMMA_ASM_FP8_(N, TA, TB, ACC, TAIL)
#define DGJIT_WGMMA_ASM_FP8_(N, TA, TB, ACC, da, db, sd, ta, tb)                                   \
  "{\n"                                                                                             \
  ".reg .pred p;\n"                                                                                 \
  "setp.ne.b32 p, %" #sd ", 0;\n"                                                                   \
  "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32." TA "." TB " {" ACC "}, %" #da ", %" #db       \
  ", p, 1, 1;\n"                                                                                    \
  "}\n"

#define DGJIT_WGMMA_ASM_S8(N, ACC, TAIL) DGJIT_WGMMA_ASM_S8_(N, ACC, TAIL)
#define DGJIT_WGMMA_ASM_S8_(N, ACC, da, db, sd, ta, tb)                                            \
  "{\n"                                                                                             \
  ".reg .pred p;\n"                                                                                 \
  "setp.ne.b32 p, %" #sd ", 0;\n"                                                                   \
  "wgmma.mma_async.sync.aligned.m64n" #N "k32.s32.s8.s8 {" ACC "}, %" #da ", %" #db ", p;\n"        \
  "}\n"

template <uint32_t kN>
struct WgmmaM64 {
  static_assert(kN % 8 == 0 && kN >= 8 && kN <= 256, "wgmma m64nNk*: N must be a multiple of 8 in 8..256");
};

// One asm statement per (kind, N); `ops` is the accumulator operand list for the kind's register type.
#define DGJIT_WGMMA_CALL(ASM, OPS, ta, tb) \
  asm volatile(ASM : OPS : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(ta), "n"(tb))
#define DGJIT_WGMMA_FP8_CALL(G, N, TA, TB)                                                          \
  DGJIT_WGMMA_CALL(DGJIT_WGMMA_ASM_FP8(N, TA, TB, DGJIT_WGMMA_ACC_IDX_##G, DGJIT_WGMMA_TAIL_IDX_##G), \
                   DGJIT_WGMMA_ACC_OPS_##G("+f", d), 0, 0)

#define DGJIT_DEFINE_WGMMA(G, N)                                                                    \
  template <>                                                                                       \
  struct WgmmaM64<N> {                                                                              \
    static constexpr uint32_t kNumAccum = N / 2;                                                    \
    template <MmaKind kKind, bool kTransA, bool kTransB, class TAcc>                               \
    static DGJIT_DEVICE void mma(TAcc* d, uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {     \
      static_assert(kKind == MmaKind::kBF16 || kKind == MmaKind::kFP16 || (!kTransA && !kTransB),   \
                    "tf32 and 8-bit wgmma read K-major operands only");                             \
      static_assert(is_same<TAcc, int32_t>::value == (kKind == MmaKind::kS8S8),                     \
                    "s8 wgmma accumulates in int32, every other kind in float");                    \
      if constexpr (kKind == MmaKind::kBF16) {                                                      \
        DGJIT_WGMMA_CALL(DGJIT_WGMMA_ASM_16BIT(N, "bf16", DGJIT_WGMMA_ACC_IDX_##G, DGJIT_WGMMA_TAIL_IDX_##G), \
                         DGJIT_WGMMA_ACC_OPS_##G("+f", d), int(kTransA), int(kTransB));             \
      } else if constexpr (kKind == MmaKind::kFP16) {                                               \
        DGJIT_WGMMA_CALL(DGJIT_WGMMA_ASM_16BIT(N, "f16", DGJIT_WGMMA_ACC_IDX_##G, DGJIT_WGMMA_TAIL_IDX_##G), \
                         DGJIT_WGMMA_ACC_OPS_##G("+f", d), int(kTransA), int(kTransB));             \
      } else if constexpr (kKind == MmaKind::kTF32) {                                               \
        DGJIT_WGMMA_CALL(DGJIT_WGMMA_ASM_TF32(N, DGJIT_WGMMA_ACC_IDX_##G, DGJIT_WGMMA_TAIL_IDX_##G),  \
                         DGJIT_WGMMA_ACC_OPS_##G("+f", d), 0, 0);                                   \
      } else if constexpr (kKind == MmaKind::kE4M3E4M3) {                                           \
        DGJIT_WGMMA_FP8_CALL(G, N, "e4m3", "e4m3");                                                 \
      } else if constexpr (kKind == MmaKind::kE4M3E5M2) {                                           \
        DGJIT_WGMMA_FP8_CALL(G, N, "e4m3", "e5m2");                                                 \
      } else if constexpr (kKind == MmaKind::kE5M2E4M3) {                                           \
        DGJIT_WGMMA_FP8_CALL(G, N, "e5m2", "e4m3");                                                 \
      } else if constexpr (kKind == MmaKind::kE5M2E5M2) {                                           \
        DGJIT_WGMMA_FP8_CALL(G, N, "e5m2", "e5m2");                                                 \
      } else {                                                                                      \
        DGJIT_WGMMA_CALL(DGJIT_WGMMA_ASM_S8(N, DGJIT_WGMMA_ACC_IDX_##G, DGJIT_WGMMA_TAIL_IDX_##G),    \
                         DGJIT_WGMMA_ACC_OPS_##G("+r", d), 0, 0);                                   \
      }                                                                                             \
    }                                                                                               \
  };

DGJIT_DEFINE_WGMMA(1, 8)
DGJIT_DEFINE_WGMMA(2, 16)
DGJIT_DEFINE_WGMMA(3, 24)
DGJIT_DEFINE_WGMMA(4, 32)
DGJIT_DEFINE_WGMMA(5, 40)
DGJIT_DEFINE_WGMMA(6, 48)
DGJIT_DEFINE_WGMMA(7, 56)
DGJIT_DEFINE_WGMMA(8, 64)
DGJIT_DEFINE_WGMMA(9, 72)
DGJIT_DEFINE_WGMMA(10, 80)
DGJIT_DEFINE_WGMMA(11, 88)
DGJIT_DEFINE_WGMMA(12, 96)
DGJIT_DEFINE_WGMMA(13, 104)
DGJIT_DEFINE_WGMMA(14, 112)
DGJIT_DEFINE_WGMMA(15, 120)
DGJIT_DEFINE_WGMMA(16, 128)
DGJIT_DEFINE_WGMMA(17, 136)
DGJIT_DEFINE_WGMMA(18, 144)
DGJIT_DEFINE_WGMMA(19, 152)
DGJIT_DEFINE_WGMMA(20, 160)
DGJIT_DEFINE_WGMMA(21, 168)
DGJIT_DEFINE_WGMMA(22, 176)
DGJIT_DEFINE_WGMMA(23, 184)
DGJIT_DEFINE_WGMMA(24, 192)
DGJIT_DEFINE_WGMMA(25, 200)
DGJIT_DEFINE_WGMMA(26, 208)
DGJIT_DEFINE_WGMMA(27, 216)
DGJIT_DEFINE_WGMMA(28, 224)
DGJIT_DEFINE_WGMMA(29, 232)
DGJIT_DEFINE_WGMMA(30, 240)
DGJIT_DEFINE_WGMMA(31, 248)
DGJIT_DEFINE_WGMMA(32, 256)

#undef DGJIT_DEFINE_WGMMA
#undef DGJIT_WGMMA_FP8_CALL
#undef DGJIT_WGMMA_CALL

// K extent of one wgmma instruction for each operand kind (32 bytes of K in every case).
template <MmaKind kKind>
constexpr uint32_t wgmma_k() {
  return kKind == MmaKind::kTF32 ? 8 : (kKind == MmaKind::kBF16 || kKind == MmaKind::kFP16) ? 16 : 32;
}

// ------------------------------------------------------------------------------------------------
// Conversions and shared-memory stores of the epilogue
// ------------------------------------------------------------------------------------------------

// Two floats -> packed 16-bit pair, `lo` in the low half (lower address / lower column). PTX's cvt
// packs its first source into the upper half, hence the swapped operands.
DGJIT_DEVICE uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
}
DGJIT_DEVICE uint32_t pack_f16x2(float lo, float hi) {
  uint32_t packed;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
}

DGJIT_DEVICE void st_shared_b32(uint32_t smem_addr, uint32_t value) {
  asm volatile("st.shared.b32 [%0], %1;\n" : : "r"(smem_addr), "r"(value) : "memory");
}
// stmatrix: the warp stores 8x8 matrices of 16-bit elements, one 32-bit register per thread and matrix (thread l
// holds row l / 4, columns 2 (l % 4) and + 1, the lower column in the lower half: the accumulator layout of a pair).
// Lane 8i + r gives the shared address of matrix i's row r (16 contiguous bytes). One instruction replaces two
// (x2) or four (x4) st.shared.b32 and their address arithmetic.
DGJIT_DEVICE void stmatrix_x2(uint32_t smem_addr, uint32_t m0, uint32_t m1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};\n" : : "r"(smem_addr), "r"(m0), "r"(m1)
               : "memory");
}
DGJIT_DEVICE void stmatrix_x4(uint32_t smem_addr, uint32_t m0, uint32_t m1, uint32_t m2, uint32_t m3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" : : "r"(smem_addr), "r"(m0),
               "r"(m1), "r"(m2), "r"(m3) : "memory");
}
// .trans: each matrix is stored transposed (the fragment's row l / 4 becomes column l / 4 of the stored matrix): lane
// 8i + r then addresses row r of the stored matrix i, which holds the fragment's column r.
DGJIT_DEVICE void stmatrix_x2_trans(uint32_t smem_addr, uint32_t m0, uint32_t m1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};\n" : : "r"(smem_addr), "r"(m0),
               "r"(m1) : "memory");
}
DGJIT_DEVICE void stmatrix_x4_trans(uint32_t smem_addr, uint32_t m0, uint32_t m1, uint32_t m2, uint32_t m3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" : : "r"(smem_addr),
               "r"(m0), "r"(m1), "r"(m2), "r"(m3) : "memory");
}
// ldmatrix, stmatrix's mirror (same fragment and address roles); volatile with a memory clobber like the
// epilogue's other shared loads, so that it stays ordered with its stores.
DGJIT_DEVICE void ldmatrix_x2(uint32_t smem_addr, uint32_t& m0, uint32_t& m1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(m0), "=r"(m1) : "r"(smem_addr)
               : "memory");
}
DGJIT_DEVICE void ldmatrix_x4(uint32_t smem_addr, uint32_t& m0, uint32_t& m1, uint32_t& m2, uint32_t& m3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(m0), "=r"(m1), "=r"(m2), "=r"(m3) : "r"(smem_addr) : "memory");
}
DGJIT_DEVICE void st_shared_b16(uint32_t smem_addr, uint16_t value) {
  asm volatile("st.shared.b16 [%0], %1;\n" : : "r"(smem_addr), "h"(value) : "memory");
}
DGJIT_DEVICE void st_shared_v2_f32(uint32_t smem_addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" : : "r"(smem_addr), "f"(x), "f"(y) : "memory");
}
DGJIT_DEVICE void st_shared_v2_b32(uint32_t smem_addr, uint32_t x, uint32_t y) {
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" : : "r"(smem_addr), "r"(x), "r"(y) : "memory");
}
DGJIT_DEVICE void st_shared_v4_b32(uint32_t smem_addr, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" : : "r"(smem_addr), "r"(x), "r"(y), "r"(z), "r"(w)
               : "memory");
}
DGJIT_DEVICE uint4 ld_shared_v4_b32(uint32_t smem_addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_addr) : "memory");
  return v;
}
DGJIT_DEVICE float ld_shared_f32(uint32_t smem_addr) {
  float x;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(x) : "r"(smem_addr) : "memory");
  return x;
}

// Shared loads ordered with the st.shared above (both volatile with a memory clobber): the in-place
// epilogue reads C / residual from the address it then writes D to (16-bit tiles: ldmatrix_x2 / x4).
DGJIT_DEVICE float2 ld_shared_v2_f32(uint32_t smem_addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(smem_addr) : "memory");
  return v;
}

// ------------------------------------------------------------------------------------------------
// Scale factors (FP8 / INT8): small read-only FP32 vectors in global memory
// ------------------------------------------------------------------------------------------------

// A read-only load through the non-coherent path: scales never change during a kernel.
DGJIT_DEVICE float ld_global_nc_f32(const float* p) {
  float x;
  asm volatile("ld.global.nc.f32 %0, [%1];\n" : "=f"(x) : "l"(p));
  return x;
}

// 4-byte cp.async global -> shared (asynchronous: the thread does not wait for the data), and the
// waits. Used to stage a tile's row/column scales while its main loop runs.
DGJIT_DEVICE void cp_async_4(uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" : : "r"(smem_addr), "l"(gmem) : "memory");
}
// cp_async_4 when `pred`, as a predicated instruction rather than a branch: copy loops whose trip count depends on the
// thread are divergent code, after which ptxas keeps warp-uniform values (a main loop's stage addresses) in
// per-thread registers.
DGJIT_DEVICE void cp_async_4_if(bool pred, uint32_t smem_addr, const void* gmem) {
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %2, 0;\n"
      "  @p cp.async.ca.shared.global [%0], [%1], 4;\n"
      "}\n"
      : : "r"(smem_addr), "l"(gmem), "r"(static_cast<uint32_t>(pred)) : "memory");
}
// Arrive on an mbarrier once all of this thread's earlier cp.async copies have landed (.noinc: the
// arrival is one of the barrier's expected count, so the thread goes on without waiting for the data).
DGJIT_DEVICE void cp_async_mbarrier_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" : : "r"(shared_addr(bar)) : "memory");
}
DGJIT_DEVICE void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" : : : "memory"); }
DGJIT_DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" : : : "memory"); }

// ------------------------------------------------------------------------------------------------
// Split-K: partial tiles through global memory (written and read by different CTAs of one launch)
// ------------------------------------------------------------------------------------------------

// 16 bytes stored / loaded at the L2 (.cg): a partial tile is read once, by another SM, so it should not
// occupy this SM's L1, and the reader must not see a stale L1 line. Typed per accumulator (FP32 / INT32):
// moving accumulators through integer registers made NVVM keep them there, with copies after every wgmma
// that ptxas then had to wait for (C7517).
DGJIT_DEVICE void st_global_cg_v4(void* p, float a, float b, float c, float d) {
  asm volatile("st.global.cg.v4.f32 [%0], {%1, %2, %3, %4};\n" : : "l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
DGJIT_DEVICE void st_global_cg_v4(void* p, int32_t a, int32_t b, int32_t c, int32_t d) {
  asm volatile("st.global.cg.v4.s32 [%0], {%1, %2, %3, %4};\n" : : "l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
DGJIT_DEVICE void ld_global_cg_v4(const void* p, float& a, float& b, float& c, float& d) {
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(a), "=f"(b), "=f"(c), "=f"(d) : "l"(p) : "memory");
}
DGJIT_DEVICE void ld_global_cg_v4(const void* p, int32_t& a, int32_t& b, int32_t& c, int32_t& d) {
  asm volatile("ld.global.cg.v4.s32 {%0, %1, %2, %3}, [%4];\n" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p) : "memory");
}
// Split-K's atomic mode: add 16 bytes of an FP32 partial tile into the tile's one sum in global memory, at the L2
// (GPU scope, relaxed: the arrival's fence and release order them before the last share reads the sum), in
// whatever order the shares arrive (not bitwise reproducible).
DGJIT_DEVICE void red_add_gpu_v4(void* p, float a, float b, float c, float d) {
  asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n"
               : : "l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
// Arrival counter of a split tile: acquire-release at GPU scope, so the partials written (and fenced) before an
// arrival are visible to the thread that sees the last one.
DGJIT_DEVICE uint32_t atomic_add_acq_rel_gpu(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
DGJIT_DEVICE void st_relaxed_gpu_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;\n" : : "l"(p), "r"(v) : "memory");
}
DGJIT_DEVICE void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" : : : "memory"); }

}  // namespace sm90
}  // namespace dgjit
