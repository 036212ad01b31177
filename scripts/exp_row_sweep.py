"""Experiment (GPU): does a decode GEMV shaped like the streaming read reach the read's speed?

    python3 -m scripts.exp_row_sweep [--fp8 | --visits] [--shapes 7168x16384,...] [--reps 50] [--out DIR]

Question it answers (issue 6's 3.6 TB/s at BF16 M = 1 x 7168 x 16384): the evict-first grid-stride read of
scripts.exp_decode_floor moves that weight in ~63 us, while our M = 1 call (Hopper tiles, 56-96 weight rows per
CTA, 128 bytes of each row per TMA box) took 66-68 us. Two M = 1 BF16 kernels shaped like the read (every SM
busy, loads in flight, no pipeline), timed beside it, our call and cuBLAS (interleaved, write flush, medians):

  cta_rows   one CTA per weight row at a time (rows blockIdx.x, + gridDim.x, ...): its threads read the row's
             16-byte words t, t + T, ... (a CTA reads T x 16 contiguous bytes per instruction, the grid a window
             of ~grid rows); each thread keeps its activation words in registers (the same positions every row),
             loads the next row before it reduces this one; one barrier per row (two partial slots).
  warp_rows  one warp per row (32 x 16 contiguous bytes per instruction, U loads in flight per lane), the
             activations in shared memory; no barrier after the prologue.

--fp8 times E4M3 forms of cta_rows; --visits times plain reads in the tiles' request order (below) to tell the
request order from the grid's shape (the answer: the order did not matter, docs/NOTES.md session 30).

Every variant's output is checked against a float64 product first (relative error <= 1e-2 of the largest
output). Nothing here is used by the library.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import report
from scripts.exp_decode_floor import _SOURCE as READ_SOURCE

SHAPES = ((7168, 16384), (2112, 7168), (4096, 7168), (7168, 2048), (24576, 1536), (32768, 512))

_COMMON = r"""
__device__ __forceinline__ unsigned long long evict_first_policy() {
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint4 ld_ef(const uint4* p, unsigned long long policy) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(policy));
  return v;
}
// Two BF16 products of one 32-bit word pair into two accumulators (the low half shifted up is its FP32 value,
// the high half masked is its FP32 value).
__device__ __forceinline__ void dot2(unsigned w, unsigned x, float& lo, float& hi) {
  lo = fmaf(__uint_as_float(w << 16), __uint_as_float(x << 16), lo);
  hi = fmaf(__uint_as_float(w & 0xffff0000u), __uint_as_float(x & 0xffff0000u), hi);
}
__device__ __forceinline__ void dot8(const uint4& w, const uint4& x, float (&a)[4]) {
  dot2(w.x, x.x, a[0], a[1]);
  dot2(w.y, x.y, a[2], a[3]);
  dot2(w.z, x.z, a[0], a[1]);
  dot2(w.w, x.w, a[2], a[3]);
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ unsigned short to_bf16(float f) {  // round to nearest even (finite inputs)
  unsigned u = __float_as_uint(f);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
"""

_CTA_ROWS = r"""
extern "C" __global__ void __launch_bounds__({T}, {MINB})
cta_rows_{T}_{C}_{KW}(const uint4* __restrict__ w, const uint4* __restrict__ x, unsigned short* __restrict__ out,
                      int n) {{
  constexpr int T = {T}, C = {C}, KW = {KW};
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const unsigned long long policy = evict_first_policy();
  uint4 xr[C], cur[C], nxt[C];
#pragma unroll
  for (int j = 0; j < C; ++j) xr[j] = (t + j * T < KW) ? x[t + j * T] : make_uint4(0, 0, 0, 0);
  __shared__ float part[2][T / 32];
  int row = blockIdx.x, slot = 0;
#pragma unroll
  for (int j = 0; j < C; ++j)
    cur[j] = (row < n && t + j * T < KW) ? ld_ef(w + (size_t)row * KW + t + j * T, policy) : make_uint4(0, 0, 0, 0);
  for (; row < n; row += gridDim.x) {{
    const int next = row + gridDim.x;
#pragma unroll
    for (int j = 0; j < C; ++j)
      nxt[j] = (next < n && t + j * T < KW) ? ld_ef(w + (size_t)next * KW + t + j * T, policy)
                                             : make_uint4(0, 0, 0, 0);
    float a[4] = {{0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int j = 0; j < C; ++j) dot8(cur[j], xr[j], a);
    const float s = warp_sum((a[0] + a[1]) + (a[2] + a[3]));
    if (lane == 0) part[slot][warp] = s;
    __syncthreads();
    if (warp == 0) {{
      const float v = warp_sum(lane < T / 32 ? part[slot][lane] : 0.f);
      if (lane == 0) out[row] = to_bf16(v);
    }}
    slot ^= 1;
#pragma unroll
    for (int j = 0; j < C; ++j) cur[j] = nxt[j];
  }}
}}
"""

_WARP_ROWS = r"""
extern "C" __global__ void __launch_bounds__(512, 2)
warp_rows_{U}_{KW}(const uint4* __restrict__ w, const uint4* __restrict__ x, unsigned short* __restrict__ out,
                   int n) {{
  constexpr int U = {U}, KW = {KW};
  extern __shared__ uint4 xs[];
  for (int i = threadIdx.x; i < KW; i += blockDim.x) xs[i] = x[i];
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int warps = blockDim.x / 32, first = blockIdx.x * warps + threadIdx.x / 32, step = gridDim.x * warps;
  const unsigned long long policy = evict_first_policy();
  for (int row = first; row < n; row += step) {{
    const uint4* wr = w + (size_t)row * KW;
    float a[4] = {{0.f, 0.f, 0.f, 0.f}};
    for (int base = lane; base < KW; base += 32 * U) {{
      uint4 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) if (base + 32 * u < KW) v[u] = ld_ef(wr + base + 32 * u, policy);
#pragma unroll
      for (int u = 0; u < U; ++u) if (base + 32 * u < KW) dot8(v[u], xs[base + 32 * u], a);
    }}
    const float s = warp_sum((a[0] + a[1]) + (a[2] + a[3]));
    if (lane == 0) out[row] = to_bf16(s);
  }}
}}
"""


# FP8 E4M3 at M = 1 (--fp8): the same CTA-per-row sweep, 16 values per 16-byte word; each word's 16 products are
# summed in FP32 and, with block scaling, multiplied by the product of its 128-value group's scales (A's kept in
# registers, B's loaded with the row's words); per-tensor scaling multiplies the row's sum once.
_FP8_ROWS = r"""
__device__ __forceinline__ void e4m3x4_to_f32(unsigned v, float (&f)[4]) {{
  asm("{{\n .reg .b16 lo, hi;\n .reg .b32 h0, h1;\n .reg .f16 a, b, c, d;\n mov.b32 {{lo, hi}}, %4;\n"
      " cvt.rn.f16x2.e4m3x2 h0, lo;\n cvt.rn.f16x2.e4m3x2 h1, hi;\n mov.b32 {{a, b}}, h0;\n mov.b32 {{c, d}}, h1;\n"
      " cvt.f32.f16 %0, a;\n cvt.f32.f16 %1, b;\n cvt.f32.f16 %2, c;\n cvt.f32.f16 %3, d;\n}}"
      : "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3]) : "r"(v));
}}
__device__ __forceinline__ float dot16(const uint4& w, const uint4& x) {{
  const unsigned ws[4] = {{w.x, w.y, w.z, w.w}}, xs[4] = {{x.x, x.y, x.z, x.w}};
  float acc[4] = {{0.f, 0.f, 0.f, 0.f}};
#pragma unroll
  for (int i = 0; i < 4; ++i) {{
    float fw[4], fx[4];
    e4m3x4_to_f32(ws[i], fw);
    e4m3x4_to_f32(xs[i], fx);
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] = fmaf(fw[e], fx[e], acc[e]);
  }}
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}}
extern "C" __global__ void __launch_bounds__({T}, {MINB})
fp8_rows_{BLOCK}_{T}_{C}_{KW}(const uint4* __restrict__ w, const uint4* __restrict__ x, const float* __restrict__ sa,
                         const float* __restrict__ sb, int sb_ld, unsigned short* __restrict__ out, int n) {{
  constexpr int T = {T}, C = {C}, KW = {KW};
  constexpr bool kBlock = {BLOCK};
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const unsigned long long policy = evict_first_policy();
  uint4 xr[C], cur[C], nxt[C];
  float sar[C], sbc[C], sbn[C];
#pragma unroll
  for (int j = 0; j < C; ++j) {{
    const bool own = t + j * T < KW;
    xr[j] = own ? x[t + j * T] : make_uint4(0, 0, 0, 0);
    sar[j] = (kBlock && own) ? sa[(t + j * T) / 8] : 0.f;
  }}
  __shared__ float part[2][T / 32];
  int row = blockIdx.x, slot = 0;
#pragma unroll
  for (int j = 0; j < C; ++j) {{
    const bool own = row < n && t + j * T < KW;
    cur[j] = own ? ld_ef(w + (size_t)row * KW + t + j * T, policy) : make_uint4(0, 0, 0, 0);
    sbc[j] = (kBlock && own) ? __ldg(sb + (row / 128) * sb_ld + (t + j * T) / 8) : 0.f;
  }}
  for (; row < n; row += gridDim.x) {{
    const int next = row + gridDim.x;
#pragma unroll
    for (int j = 0; j < C; ++j) {{
      const bool own = next < n && t + j * T < KW;
      nxt[j] = own ? ld_ef(w + (size_t)next * KW + t + j * T, policy) : make_uint4(0, 0, 0, 0);
      sbn[j] = (kBlock && own) ? __ldg(sb + (next / 128) * sb_ld + (t + j * T) / 8) : 0.f;
    }}
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < C; ++j) {{
      const float d = dot16(cur[j], xr[j]);
      acc = kBlock ? fmaf(d, sar[j] * sbc[j], acc) : acc + d;
    }}
    const float s = warp_sum(acc);
    if (lane == 0) part[slot][warp] = s;
    __syncthreads();
    if (warp == 0) {{
      float v = warp_sum(lane < T / 32 ? part[slot][lane] : 0.f);
      if (!kBlock) v *= sa[0] * sb[0];
      if (lane == 0) out[row] = to_bf16(v);
    }}
    slot ^= 1;
#pragma unroll
    for (int j = 0; j < C; ++j) {{ cur[j] = nxt[j]; sbc[j] = sbn[j]; }}
  }}
}}
"""


def fp8_variants(k: int) -> list[tuple[int, int, int]]:
    """(threads, words per thread, CTAs per SM) for a row of k FP8 values (k / 16 words)."""
    kw = k // 16
    out = []
    for c in (4, 2):  # four words a thread need ~120 registers (two CTA slots of 256 threads a SM at 7168 x 16384)
        t = max(32, -(-kw // (32 * c)) * 32)
        if t <= 1024:
            out.append((t, c, max(1, min(16, (512 if c == 4 else 1024) // t))))
    return out


def fp8_sources(shapes) -> tuple[str, list[dict]]:
    parts, variants = [READ_SOURCE, _COMMON, _FP8_ROWS.split("extern")[0].format()], []
    body = "extern" + _FP8_ROWS.split("extern", 1)[1]
    for n, k in shapes:
        kw = k // 16
        for block in ("true", "false"):
            for t, c, minb in fp8_variants(k):
                name = f"fp8_rows_{block}_{t}_{c}_{kw}"
                if name not in {v["kernel"] for v in variants}:
                    parts.append(body.format(T=t, C=c, KW=kw, MINB=minb, BLOCK=block))
                variants.append({"n": n, "k": k, "block": block == "true", "kernel": name, "threads": t,
                                 "per_sm": minb, "label": f"{'block' if block == 'true' else 'tensor'}{t}x{c}"})
    return "\n".join(parts), variants


# --visits: reads (no arithmetic) that request the weight in the order the tiles do, with a visit length V: CTA c
# owns rows [R c, R c + R) and asks for V bytes of each of its R rows, then the next V bytes of each, ... (R = 64:
# about the decode tiles' BN of 56-64; V = 128 bytes: a TMA box's row). Four (or, "x8", eight) 16-byte loads in
# flight per thread, 512 threads, one CTA per row block. Asks whether the request order (DRAM pages per visit) or
# the grid (busy SMs, bytes in flight per SM) sets the speed.
_ORDERED_READ = r"""
template <int U>  // 16-byte loads in flight per thread
__device__ __forceinline__ void ordered_read(const uint4* __restrict__ w, unsigned log2_rows, unsigned row_words,
                                             unsigned log2_visit, unsigned n, unsigned* sink) {
  // Powers of two (rows per CTA, words per visit): the order is shifts and masks, not divisions.
  const unsigned long long policy = evict_first_policy();
  const unsigned row0 = blockIdx.x << log2_rows;
  const unsigned total = row_words << log2_rows, log2_per_visit = log2_rows + log2_visit;
  const unsigned visit_mask = (1u << log2_visit) - 1, per_visit_mask = (1u << log2_per_visit) - 1;
  unsigned acc = 0;
  for (unsigned f = threadIdx.x; f < total; f += U * blockDim.x) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const unsigned g = f + u * blockDim.x;
      const unsigned row = row0 + ((g & per_visit_mask) >> log2_visit);
      if (g < total && row < n) {
        const unsigned col = ((g >> log2_per_visit) << log2_visit) + (g & visit_mask);
        v[u] = ld_ef(w + (unsigned long long)row * row_words + col, policy);
      } else {
        v[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if ((threadIdx.x & 31) == 0 && acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}
extern "C" __global__ void __launch_bounds__(512) ordered_read4(const uint4* __restrict__ w, unsigned log2_rows,
    unsigned row_words, unsigned log2_visit, unsigned n, unsigned* sink) {
  ordered_read<4>(w, log2_rows, row_words, log2_visit, n, sink);
}
extern "C" __global__ void __launch_bounds__(512) ordered_read8(const uint4* __restrict__ w, unsigned log2_rows,
    unsigned row_words, unsigned log2_visit, unsigned n, unsigned* sink) {
  ordered_read<8>(w, log2_rows, row_words, log2_visit, n, sink);
}
"""


def visits_main(shapes, reps: int, out_dir: str) -> None:
    """--visits: the ordered reads at visit lengths from 128 bytes to a whole row, beside the grid-stride read."""
    import cupy

    bench = _Bench("\n".join([READ_SOURCE, _COMMON, _ORDERED_READ]))
    fns_by_flight = {4: bench.module.get_function("ordered_read4"), 8: bench.module.get_function("ordered_read8")}
    sink = cupy.zeros(4096, dtype=cupy.uint32)
    for n, k in shapes:
        w = cupy.random.default_rng(n + k).integers(0, 255, n * k * 2, dtype=cupy.uint8)
        row_words = k * 2 // 16
        fns = {"read_ef": bench.read(w, n * k * 2)}
        for rows, visit_bytes, flight in ((64, 128, 4), (64, 512, 4), (64, 2048, 4), (64, 8192, 4), (64, k * 2, 4),
                                          (8, 128, 4), (8, 2048, 4), (64, 128, 8), (64, 2048, 8)):
            vw = min(visit_bytes // 16, row_words)
            if row_words % vw or vw & (vw - 1):
                continue
            grid = -(-n // rows)
            suffix = "" if flight == 4 else f"x{flight}"
            fns[f"r{rows}v{vw * 16}{suffix}"] = (
                lambda fn=fns_by_flight[flight], grid=grid, rows=rows, vw=vw:
                fn((grid,), (512,), (w, cupy.uint32(rows.bit_length() - 1), cupy.uint32(row_words),
                                     cupy.uint32(vw.bit_length() - 1), cupy.uint32(n), sink)))
        bench.time(fns, reps, {"n": n, "k": k, "weight_bytes": n * k * 2}, f"{n}x{k}")
    bench.write(out_dir, "exp-row-sweep-visits.json")


def cta_variants(k: int) -> list[tuple[int, int, int]]:
    """(threads, words per thread, CTAs per SM) for a row of k BF16 values (k / 8 16-byte words)."""
    kw = k // 8
    out = []
    for t in (1024, 512, 256, 128, 64):
        c = -(-kw // t)
        if t > kw and t > 64 or c > 4:
            continue
        out.append((t, c, max(1, min(16, 1024 // t))))
    return out[:3]


def sources(shapes) -> tuple[str, list[dict]]:
    parts, variants = [READ_SOURCE, _COMMON], []
    for n, k in shapes:
        kw = k // 8
        for t, c, minb in cta_variants(k):
            name = f"cta_rows_{t}_{c}_{kw}"
            if name not in {v["kernel"] for v in variants}:
                parts.append(_CTA_ROWS.format(T=t, C=c, KW=kw, MINB=minb))
            variants.append({"n": n, "k": k, "kind": "cta_rows", "kernel": name, "block": t, "per_sm": minb,
                             "label": f"cta{t}x{c}"})
        for u in (4, 8):
            name = f"warp_rows_{u}_{kw}"
            if name not in {v["kernel"] for v in variants}:
                parts.append(_WARP_ROWS.format(U=u, KW=kw))
            variants.append({"n": n, "k": k, "kind": "warp_rows", "kernel": name, "block": 512, "per_sm": 2,
                             "label": f"warp_u{u}", "smem": kw * 16})
    return "\n".join(parts), variants


class _Bench:
    """What both modes share: the compiled module, the evict-first read of a weight, correctness against a float64
    reference, the bench protocol's timing, and the rows written to JSON."""

    def __init__(self, code: str):
        import cupy

        from deepgemm_jit import device, timing

        self.module = cupy.RawModule(code=code, options=("-std=c++17",))
        self.num_sms = device.num_sms()
        self._read = self.module.get_function("read_stream_x4_ef")
        self._sink = cupy.zeros(self.num_sms * 4, dtype=cupy.uint32)
        self._flush = timing.L2Flusher()
        self.rows: list[dict] = []

    def read(self, buf, nbytes: int):
        """The evict-first grid-stride read of `buf`'s first `nbytes` bytes (4 CTAs of 512 threads per SM)."""
        import cupy

        n16 = cupy.uint64(nbytes // 16)
        return lambda: self._read((self.num_sms * 4,), (512,), (buf, n16, self._sink))

    @staticmethod
    def poisoned(n: int):
        """A BF16 output of n values (uint16 bits) holding a NaN pattern."""
        import cupy

        return cupy.full(n, 0x7FC1, dtype=cupy.uint16)

    @staticmethod
    def error(out_bits, ref) -> float:
        """max |out - ref| / max |ref|: BF16 bits (CuPy uint16) against a float64 CuPy reference."""
        import cupy

        got = (out_bits.astype(cupy.uint32) << 16).view(cupy.float32).astype(cupy.float64)
        return float(cupy.abs(got - ref).max() / cupy.abs(ref).max())

    def time(self, fns: dict, reps: int, row: dict, label: str) -> None:
        import cupy

        from deepgemm_jit import timing

        cupy.cuda.Device().synchronize()
        t = timing.time_interleaved(fns, reps=reps, flush=self._flush)
        row["us"] = {name: tm.median_us for name, tm in t.items()}
        self.rows.append(row)
        print(f"{label}: " + "  ".join(f"{name} {us:.2f} ({row['weight_bytes'] / us / 1e6:.2f} TB/s)"
                                       for name, us in row["us"].items()), flush=True)

    def write(self, out_dir: str, name: str) -> None:
        import torch

        report.write_experiment_json(out_dir, name, {"gpu": torch.cuda.get_device_name(), "rows": self.rows})
        print("json:", Path(out_dir) / name)


def bf16_main(shapes, reps: int, out_dir: str) -> None:
    """BF16 at M = 1: cta_rows and warp_rows against our call, cuBLAS and the read."""
    import cupy
    import torch

    import deepgemm_jit as dg

    code, variants = sources(shapes)
    bench = _Bench(code)
    for n, k in shapes:
        gen = torch.Generator(device="cuda").manual_seed(n * 131 + k)
        wb = torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16)
        xb = torch.randn(1, k, device="cuda", generator=gen).to(torch.bfloat16)
        ref = cupy.asarray((xb.double() @ wb.double().t()).reshape(-1))
        wc, xc = cupy.asarray(wb.view(torch.int16)), cupy.asarray(xb.view(torch.int16))
        fns = {"read_ef": bench.read(wc, n * k * 2)}
        g = dg.build(1, n, k, dtype="bf16")
        d_ours = torch.empty((1, n), device="cuda", dtype=torch.bfloat16)
        fns["ours"] = lambda: g(xb, wb, out=d_ours)
        fns["cublas"] = lambda: torch.matmul(xb, wb.t())
        errors = {}
        for v in (v for v in variants if (v["n"], v["k"]) == (n, k)):
            outv = bench.poisoned(n)
            grid = min(n, bench.num_sms * v["per_sm"]) if v["kind"] == "cta_rows" else bench.num_sms * 2
            call = (lambda fn=bench.module.get_function(v["kernel"]), grid=grid, v=v, outv=outv:
                    fn((grid,), (v["block"],), (wc, xc, outv, cupy.int32(n)), shared_mem=v.get("smem", 0)))
            call()
            errors[v["label"]] = bench.error(outv, ref)
            if not errors[v["label"]] <= 1e-2:
                print(f"{n}x{k} {v['label']}: relative error {errors[v['label']]:.3g} > 1e-2: not timed", flush=True)
                continue
            fns[v["label"]] = call
        g(xb, wb, out=d_ours)
        errors["ours"] = bench.error(cupy.asarray(d_ours.view(torch.int16)).reshape(-1).view(cupy.uint16), ref)
        bench.time(fns, reps, {"n": n, "k": k, "weight_bytes": n * k * 2, "errors": errors}, f"{n}x{k}")
    bench.write(out_dir, "exp-row-sweep.json")


def fp8_main(shapes, reps: int, out_dir: str) -> None:
    """--fp8: E4M3 at M = 1, per-tensor and block scaling, against our call of each recipe and the read."""
    import cupy

    import deepgemm_jit as dg
    from deepgemm_jit import reference

    code, variants = fp8_sources(shapes)
    bench = _Bench(code)
    for n, k in shapes:
        rng = cupy.random.default_rng(n * 7 + k)
        x = rng.standard_normal((1, k), dtype=cupy.float32)
        w = rng.standard_normal((n, k), dtype=cupy.float32) * cupy.float32(0.05)
        fns = {"read_ef": bench.read(w, n * k)}
        errors = {}
        for recipe, (ga, gb) in (("tensor", ("tensor", "tensor")), ("block", ("group128", "block128"))):
            qa, sa = reference.quantize_reference(x, "fp8_e4m3", ga)
            qb, sb = reference.quantize_reference(w, "fp8_e4m3", gb)
            ref = (reference.dequantize_reference(qa, sa, "fp8_e4m3", ga)
                   @ reference.dequantize_reference(qb, sb, "fp8_e4m3", gb).T).reshape(-1)
            g = dg.build(1, n, k, dtype="fp8", scaling=recipe)
            d = reference.poisoned((1, n), "bf16")
            fns[f"ours_{recipe}"] = (lambda g=g, qa=qa, qb=qb, sa=sa, sb=sb, d=d:
                                     g(qa, qb, scale_a=sa, scale_b=sb, out=d))
            sa_c, sb_c = cupy.ascontiguousarray(sa, dtype=cupy.float32), cupy.ascontiguousarray(sb, dtype=cupy.float32)
            for v in (v for v in variants if (v["n"], v["k"]) == (n, k) and v["block"] == (recipe == "block")):
                outv = bench.poisoned(n)
                grid = min(n, bench.num_sms * v["per_sm"])
                call = (lambda fn=bench.module.get_function(v["kernel"]), grid=grid, v=v, outv=outv, qa=qa, qb=qb,
                        sa_c=sa_c, sb_c=sb_c:
                        fn((grid,), (v["threads"],), (qb, qa, sa_c, sb_c, cupy.int32(k // 128), outv, cupy.int32(n))))
                call()
                errors[v["label"]] = bench.error(outv, ref)
                if not errors[v["label"]] <= 3e-2:
                    print(f"fp8 {n}x{k} {v['label']}: relative error {errors[v['label']]:.3g}: not timed", flush=True)
                    continue
                fns[v["label"]] = call
        bench.time(fns, reps, {"dtype": "fp8_e4m3", "n": n, "k": k, "weight_bytes": n * k, "errors": errors},
                   f"fp8 {n}x{k}")
    bench.write(out_dir, "exp-row-sweep-fp8.json")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--fp8", action="store_true", help="FP8 E4M3 kernels (per-tensor and block scales)")
    ap.add_argument("--visits", action="store_true", help="reads in the tiles' order at several visit lengths")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    (visits_main if args.visits else fp8_main if args.fp8 else bf16_main)(shapes, args.reps, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
