// Shared device basics for every kernel family: fixed-width types, the 16-bit
// storage types and their conversions.
//
// NOTES: kernels are compiled by NVRTC with no system include path at all (no
// cuda_fp16.h / cuda_bf16.h / <cstdint>): that keeps a cold compile near one
// second and makes the rendered source plus these headers the complete input of
// the compile, which is exactly what the cache key hashes.
#pragma once

#ifndef DGJIT_FIXED_WIDTH_TYPES
#define DGJIT_FIXED_WIDTH_TYPES
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef signed char int8_t;
typedef int int32_t;
typedef long long int64_t;
#endif

#define DGJIT_DEVICE __device__ __forceinline__

namespace dgjit {

// Programmatic dependent launch: wait until the grids this launch depends on have completed and their writes are
// visible. A launch made with programmatic stream serialization (runtime.py, staged calls' later launches) may
// start before the previous kernel on its stream has finished; every kernel that can be launched so runs this
// before its first global memory access. Without that attribute it returns at once.
DGJIT_DEVICE void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" : : : "memory");
#endif
}

// 16-bit floating-point storage. Arithmetic happens in FP32 registers; these
// types only exist so that pointers carry the element size and the format.
typedef float float32_t;  // FP32 storage (also what TF32 operands are stored as)
struct half_t { uint16_t bits; };
struct bfloat16_t { uint16_t bits; };
static_assert(sizeof(half_t) == 2 && sizeof(bfloat16_t) == 2, "16-bit storage");
// 8-bit floating-point storage (OCP FP8): only the tensor cores read these, as raw bytes.
struct float_e4m3_t { uint8_t bits; };
struct float_e5m2_t { uint8_t bits; };
static_assert(sizeof(float_e4m3_t) == 1 && sizeof(float_e5m2_t) == 1, "8-bit storage");

// How an 8-bit GEMM's scale factors apply (build(..., scaling=...)): one per operand (tensor), per row of A and of
// B (row), or per 1x128 group of A and 128x128 block of B (block). The sm90, gemv and gemv_rows families share it.
enum class Scaling : uint32_t { kNone = 0, kTensor = 1, kRow = 2, kBlock = 3 };

template <class A, class B> struct is_same { static constexpr bool value = false; };
template <class A> struct is_same<A, A> { static constexpr bool value = true; };
template <bool kCond, class A, class B> struct conditional { using type = A; };
template <class A, class B> struct conditional<false, A, B> { using type = B; };

// float -> storage, round to nearest even (what cuBLAS does on output).
DGJIT_DEVICE void store_converted(float* dst, float x) { *dst = x; }
DGJIT_DEVICE void store_converted(half_t* dst, float x) {
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  dst->bits = h;
}
DGJIT_DEVICE void store_converted(bfloat16_t* dst, float x) {
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  dst->bits = h;
}

// IEEE subtraction, round to nearest even, subnormals kept whatever fast-math options a compile carries.
DGJIT_DEVICE float sub_rn(float a, float b) {
  float r;
  asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// x as the TF32 value a tensor core reads (the FP32 bits with the low 13 mantissa bits zero): the nearest, ties
// away from zero, as cvt.rna.tf32 rounds, except that a finite x within half a TF32 ulp of FLT_MAX, which rna
// rounds to inf, is truncated instead (as the tensor cores' own truncation, which the sm90 tiles rely on, keeps it
// finite). The same three SASS instructions as cvt.rna's lowering, with another threshold. inf stays inf; a NaN
// whose payload sits only in the dropped bits reads as inf, as on every TF32 tensor-core path (the sm90 tiles and
// cuBLAS hand the raw bits over); the 3xTF32 split keeps it a NaN (split_tf32.cuh).
DGJIT_DEVICE uint32_t tf32_nearest(float x) {
  const uint32_t bits = __float_as_uint(x);
  return (fabsf(x) < __uint_as_float(0x7F7FF000u) ? bits + 0x1000u : bits) & 0xFFFFE000u;
}

// 3xTF32's inner GEMM (GemmSpec.hi_lo, deepgemm_jit/fp32x3.py): A and B hold [hi | lo], `segment_blocks` K blocks
// each, and K-loop block 3j + s multiplies A (hi, hi, lo)[s] by B (hi, lo, hi)[s] of block j. The stored K block
// that loop block `k_block` reads of A (is_a) or B: hi's second read follows its first by one (A) or two (B) blocks.
DGJIT_DEVICE constexpr uint32_t hi_lo_stored_block(uint32_t k_block, uint32_t segment_blocks, bool is_a) {
  return (((is_a ? k_block % 3 == 2 : k_block % 3 == 1) ? segment_blocks : 0) + k_block / 3);
}

template <class T> DGJIT_DEVICE T ceil_div(T a, T b) { return (a + b - 1) / b; }

// ---- thread-block clusters (sm_90; 1-D along x: gemv_kn's K split, the sm90 GEMM's group quantization) ----
// This CTA's rank in its cluster (0 outside clusters and before sm_90).
DGJIT_DEVICE uint32_t cluster_rank() {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}
// Every thread of every CTA of the cluster; shared-memory writes before it are visible to all of them after it.
// .aligned: every lane of a warp executes it together (a warp whose lanes diverged runs __syncwarp first).
DGJIT_DEVICE void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" : : : "memory");
#endif
}
template <class T> constexpr T ceil_div_c(T a, T b) { return (a + b - 1) / b; }
constexpr int min_c(int a, int b) { return a < b ? a : b; }

}  // namespace dgjit
