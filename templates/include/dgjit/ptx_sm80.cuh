// One small wrapper per sm_80-class PTX instruction used by the portable family and the decode kernels:
// streaming loads, asynchronous global->shared copies and warp-level tensor-core MMAs.
#pragma once
#include "dgjit/common.cuh"

namespace dgjit {

// 16 bytes read once (the decode kernels' weights): kept out of L1 (no_allocate), with a 256-byte L2 prefetch.
DGJIT_DEVICE void ld_stream_v4(uint32_t (&r)[4], const uint8_t* p) {
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "l"(p));
}

DGJIT_DEVICE uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async of kBytes (4, 8 or 16) with zero fill: only `src_bytes` bytes are
// read, the rest of the destination is written with zeros. This is how tails in
// M, N and K become zeros in shared memory without a separate slow path.
template <int kBytes>
DGJIT_DEVICE void cp_async_zfill(void* smem_dst, const void* gmem_src, int src_bytes) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (kBytes == 16) {
    // .cg bypasses L1: operands are streamed once per block.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr(smem_dst)), "l"(gmem_src), "r"(src_bytes));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
                 :: "r"(smem_addr(smem_dst)), "l"(gmem_src), "n"(kBytes), "r"(src_bytes));
  }
}

DGJIT_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
DGJIT_DEVICE void cp_async_wait() {
  static_assert(kPending >= 0, "pending group count");
  asm volatile("cp.async.wait_group %0;\n" :: "n"(kPending));
}

// FP32 -> TF32 with round-to-nearest (the tensor core would otherwise truncate
// the low mantissa bits, a biased error); near-FLT_MAX values as tf32_nearest says.
DGJIT_DEVICE uint32_t to_tf32(float x) { return tf32_nearest(x); }

// D(16x8, f32) += A(16x16) * B(16x8), A row-major, B column-major fragments.
template <class T>
DGJIT_DEVICE void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  static_assert(sizeof(T) == 2, "m16n8k16 takes 16-bit operands");
  if constexpr (is_same<T, bfloat16_t>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// D(16x8, f32) += A(16x8, tf32) * B(8x8, tf32).
DGJIT_DEVICE void mma_1688_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace dgjit
