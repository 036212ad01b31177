#!/usr/bin/env python3
"""Standalone driver for the sm90 (Hopper TMA + WGMMA) GEMM: render, compile, check, time.

Runs from the repository root on a Hopper GPU machine:

    python3 dev/sm90_proto.py            # full sweep: correctness over variants and shapes, then timing
    python3 dev/sm90_proto.py --quick    # a few variants / shapes, short timing
    python3 dev/sm90_proto.py --no-bench # correctness only
    python3 dev/sm90_proto.py --compile-only  # no GPU: render + compile the whole plan
    python3 dev/sm90_proto.py --templates dev/next/templates --only-big   # candidate templates, big shapes

--templates DIR renders and compiles another copy of the templates (same layout: DIR/gemm_sm90.cu.j2,
DIR/include/dgjit/*.cuh). A template directory whose gemm_sm90.cu.j2 mentions cfg.cluster_m uses the
"v2" shared-memory layout (D staging ring sized from the stages; B box of block_n / cluster_m rows) and
may run cluster variants; the repository's templates use the original layout.
--only-big: correctness on 3 odd shapes for every timed variant, then timing at M=4096 for the big
(N, K) rows plus 4096^3 and 8192^3 (a few minutes on an H200).

Needs only cupy, numpy, ml_dtypes, jinja2 (torch optional: the cuBLAS baseline). It does not import
the deepgemm_jit package (which may be mid-edit); it loads deepgemm_jit/tma.py by path. The render and
compile helpers here are also used by dev/sm90_compile_check.py, which needs no GPU.

Every case runs in its own try/except, synchronises and checks for errors after each launch, and a
watchdog thread ends the process (after writing the partial JSON) if one step hangs, so one run on
the GPU machine always reports as much as it reached. JSON goes to $OUT/sm90_proto.json if OUT is set.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import jinja2
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "templates"
INCLUDE = TEMPLATES / "include"
LAYOUT_V2 = False  # set by set_templates(): the template directory has the v2 layout (cfg.cluster_m)


def set_templates(path) -> None:
    """Point render/compile at another template directory (before precompile forks its workers)."""
    global TEMPLATES, INCLUDE, LAYOUT_V2
    TEMPLATES = Path(path).resolve()
    INCLUDE = TEMPLATES / "include"
    if not (TEMPLATES / "gemm_sm90.cu.j2").is_file() or not (INCLUDE / "dgjit").is_dir():
        raise SystemExit(f"--templates {path}: expected gemm_sm90.cu.j2 and include/dgjit/ there")
    LAYOUT_V2 = "cfg.cluster_m" in (TEMPLATES / "gemm_sm90.cu.j2").read_text()


set_templates(TEMPLATES)
ENTRY = "dgjit_gemm_sm90"
# Hopper's per-block opt-in maximum is 232448 bytes; stage counts are chosen 1 KiB below it in case the
# driver counts the 1 KiB system area (cuobjdump shows SHARED:1024 for every smem-using sm_90 kernel).
SMEM_LIMIT_BYTES = 232448 - 1024

STORAGE = {"bf16": "bfloat16_t", "fp16": "half_t", "tf32": "float", "fp32": "float"}
ELEM_BYTES = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}
NVRTC_OPTIONS = ["--gpu-architecture=sm_90a", "-std=c++17", "--ptxas-options=-v", "-default-device"]
TOLERANCE = {"bf16": 1e-2, "fp16": 1e-2, "tf32": 5e-3}


# ----------------------------------------------------------------------------------------------------
# Variants: the compile-time configuration of one kernel
# ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    dtype: str          # operand type: bf16 | fp16 | tf32
    out_dtype: str      # bf16 | fp16 | fp32
    block_m: int
    block_n: int
    num_stages: int = 0  # 0: as many as fit in shared memory (capped at 8)
    group_m: int = 16
    cluster_m: int = 1   # CTAs per cluster along M (2: B multicast); v2 templates only

    @property
    def block_k(self) -> int:
        return 128 // ELEM_BYTES[self.dtype]  # 128 bytes of K per stage row

    @property
    def stages(self) -> int:
        return self.num_stages or max_stages(self)

    @property
    def tag(self) -> str:
        return (f"{self.dtype}_{self.out_dtype}_m{self.block_m}n{self.block_n}k{self.block_k}"
                f"_s{self.stages}_g{self.group_m}" + (f"_c{self.cluster_m}" if self.cluster_m > 1 else ""))


def v2_layout(v: Variant, stages: int) -> dict | None:
    """Mirror of the v2 GemmSm90 layout (D ring sized from what the stages leave); None if it cannot fit."""
    nwg = 1 if v.block_m == 64 else 2
    wg_rows = v.block_m // nwg
    elem = ELEM_BYTES[v.out_dtype]
    row_bytes = v.block_n * elem
    slice_row = next(s for s in (128, 64, 32, 16) if row_bytes % s == 0)
    slice_bytes = wg_rows * slice_row
    num_slices = row_bytes // slice_row
    pipe = stages * (v.block_m + v.block_n) * 128
    bars = 2 * stages * 8
    if pipe + bars + 1024 >= SMEM_LIMIT_BYTES:
        return None
    chunk = min(num_slices, (SMEM_LIMIT_BYTES - pipe - bars - 1024) // nwg // (2 * slice_bytes))
    if chunk < 1:
        return None
    return dict(chunk_slices=chunk, slice_bytes=slice_bytes, num_slices=num_slices,
                smem=nwg * 2 * chunk * slice_bytes + pipe + bars + 1024)


def smem_bytes(v: Variant, stages: int) -> int:
    """Mirror of GemmSm90::kSmemBytes (the GPU run checks it against the value the module exports)."""
    if LAYOUT_V2:
        lay = v2_layout(v, stages)
        if lay is None:
            raise ValueError(f"{v}: {stages} stages do not fit")
        return lay["smem"]
    d = v.block_m * v.block_n * ELEM_BYTES[v.out_dtype]
    a = v.block_m * 128
    b = v.block_n * 128
    return d + stages * (a + b) + 2 * stages * 8 + 1024


# v2: a D ring chunk (per consumer warpgroup) of at least this many bytes, or the whole tile, is what
# the automatic stage count keeps; stages beyond that would make the epilogue too serial.
V2_MIN_CHUNK_BYTES = 8192


def max_stages(v: Variant) -> int:
    for s in range(8, 1, -1):
        if LAYOUT_V2:
            lay = v2_layout(v, s)
            if lay is not None and lay["chunk_slices"] * lay["slice_bytes"] >= min(
                    lay["num_slices"] * lay["slice_bytes"], V2_MIN_CHUNK_BYTES):
                return s
        elif smem_bytes(v, s) <= SMEM_LIMIT_BYTES:
            return s
    raise ValueError(f"{v}: not even two stages fit in shared memory")


def d_store_box(v: Variant) -> tuple[int, int, int]:
    """(box_cols, box_rows, swizzle_bytes) of D's tensor map; mirror of StoreTraits (checked on GPU)."""
    elem = ELEM_BYTES[v.out_dtype]
    row_bytes = v.block_n * elem
    slice_bytes = next(s for s in (128, 64, 32, 16) if row_bytes % s == 0)
    wg_rows = v.block_m if v.block_m == 64 else v.block_m // 2
    return slice_bytes // elem, wg_rows, (slice_bytes if slice_bytes >= 32 else 0)


# ----------------------------------------------------------------------------------------------------
# Render and compile (no GPU needed)
# ----------------------------------------------------------------------------------------------------

def _cpp_bool(value: object) -> str:
    if not isinstance(value, bool):
        raise TypeError(f"cpp_bool expects a bool, got {value!r}")
    return "true" if value else "false"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["cpp_bool"] = _cpp_bool
    env.filters["cpp_storage"] = lambda name: STORAGE[name]
    return env


def render(v: Variant, n: int, k: int) -> str:
    spec = SimpleNamespace(dtype=v.dtype, out_dtype=v.out_dtype, n=n, k=k, a_k_major=True, b_k_major=True)
    if v.cluster_m != 1 and not LAYOUT_V2:
        raise ValueError(f"{v.tag}: cluster_m > 1 needs templates with cfg.cluster_m (e.g. dev/next/templates)")
    cfg = SimpleNamespace(block_m=v.block_m, block_n=v.block_n, block_k=v.block_k, num_stages=v.stages,
                          group_m=v.group_m, cluster_m=v.cluster_m)
    return _environment().get_template("gemm_sm90.cu.j2").render(spec=spec, cfg=cfg, entry=ENTRY,
                                                                 tag=f"{v.tag}_n{n}_k{k}")


def headers() -> list[tuple[str, str]]:
    return sorted((p.relative_to(INCLUDE).as_posix(), p.read_text()) for p in (INCLUDE / "dgjit").glob("*.cuh"))


class CompileError(RuntimeError):
    pass


def compile_cubin(source: str, options=NVRTC_OPTIONS) -> tuple[bytes, str]:
    """NVRTC compile to an sm_90a cubin; returns (cubin, log). Headers are passed in memory."""
    from cupy_backends.cuda.libs import nvrtc
    hdrs = headers()
    prog = nvrtc.createProgram(source, "gemm_sm90.cu", [c.encode() for _, c in hdrs], [n.encode() for n, _ in hdrs])
    try:
        try:
            nvrtc.compileProgram(prog, list(options))
        except nvrtc.NVRTCError as exc:
            raise CompileError(f"NVRTC failed: {exc}\n{nvrtc.getProgramLog(prog)}") from None
        log = nvrtc.getProgramLog(prog)
        # CuPy's getCUBIN drops the final (zero) byte; the driver tolerates that, cuobjdump does not.
        cubin = nvrtc.getCUBIN(prog) + b"\0"
    finally:
        nvrtc.destroyProgram(prog)
    if isinstance(log, bytes):
        log = log.decode(errors="replace")
    return cubin, log


# ----------------------------------------------------------------------------------------------------
# GPU side
# ----------------------------------------------------------------------------------------------------

def _load_tma_module():
    spec = importlib.util.spec_from_file_location("dgjit_tma_standalone", ROOT / "deepgemm_jit" / "tma.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _compile_job(key: tuple[Variant, int, int]) -> tuple[bytes, str, float]:
    v, n, k = key
    t0 = time.perf_counter()
    cubin, log = compile_cubin(render(v, n, k))
    return cubin, log, time.perf_counter() - t0


def precompile(keys: list, workers: int) -> dict:
    """Compile many variants in parallel processes (NVRTC holds the GIL). Call before CUDA is initialised:
    the workers are forked and must not inherit a CUDA context. Failures are kept as exceptions."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing as mp
    out: dict = {}
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork")) as pool:
        futures = {key: pool.submit(_compile_job, key) for key in keys}
        for key, fut in futures.items():
            try:
                out[key] = fut.result()
            except Exception as exc:  # noqa: BLE001 - reported when the case runs
                out[key] = exc
    return out


class Watchdog:
    """Ends the process if one step runs longer than its limit (a deadlocked kernel never returns)."""

    def __init__(self, on_timeout):
        self._on_timeout = on_timeout
        self._deadline = None
        self._label = ""
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def arm(self, label: str, seconds: float):
        with self._lock:
            self._label, self._deadline = label, time.monotonic() + seconds

    def disarm(self):
        with self._lock:
            self._deadline = None

    def _watch(self):
        while True:
            time.sleep(0.5)
            with self._lock:
                expired = self._deadline is not None and time.monotonic() > self._deadline
                label = self._label
            if expired:
                print(f"\n!!! TIMEOUT: '{label}' did not finish (kernel hang?). Writing partial results and exiting.",
                      flush=True)
                try:
                    self._on_timeout(label)
                finally:
                    os._exit(3)


class Kernel:
    """One compiled variant for one (N, K), loaded and ready to launch."""

    def __init__(self, v: Variant, n: int, k: int, compiled: tuple[bytes, str, float] | None = None):
        import cupy
        self.v, self.n, self.k = v, n, k
        self.cubin, self.log, self.compile_s = compiled or _compile_job((v, n, k))
        self.module = cupy.cuda.function.Module()
        self.module.load(self.cubin)
        self.fn = self.module.get_function(ENTRY)
        self.smem_bytes = self._symbol("smem_bytes")
        self.num_threads = self._symbol("num_threads")
        self.d_box = (self._symbol("d_box_cols"), self._symbol("d_box_rows"), self._symbol("d_swizzle_bytes"))
        self.b_box_rows = self._symbol("b_box_rows") if LAYOUT_V2 else v.block_n
        self.cluster_m = self._symbol("cluster_m") if LAYOUT_V2 else 1
        self.d_chunk_slices = self._symbol("d_chunk_slices") if LAYOUT_V2 else 0
        got = (self.smem_bytes, self.num_threads, self.d_box, self.b_box_rows, self.cluster_m)
        expected = (smem_bytes(v, v.stages), 384, d_store_box(v), v.block_n // v.cluster_m, v.cluster_m)
        if got != expected:
            raise RuntimeError(f"layout mismatch kernel={got} python={expected}")
        drv = cupy.cuda.driver
        drv.funcSetAttribute(self.fn.ptr, drv.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.smem_bytes)
        self.num_regs = drv.funcGetAttribute(drv.CU_FUNC_ATTRIBUTE_NUM_REGS, self.fn.ptr)
        self.max_active_clusters = None
        if self.cluster_m > 1:  # diagnostic: can all num_sms / cluster_m clusters be resident at once?
            try:
                from cuda.bindings import driver as cbd
                cfg = cbd.CUlaunchConfig()
                cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = self.cluster_m * 64, 1, 1
                cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.num_threads, 1, 1
                cfg.sharedMemBytes = self.smem_bytes
                err, num = cbd.cuOccupancyMaxActiveClusters(cbd.CUfunction(self.fn.ptr), cfg)
                self.max_active_clusters = int(num) if int(err) == 0 else f"error {err}"
            except Exception as exc:  # noqa: BLE001 - diagnostic only
                self.max_active_clusters = f"{type(exc).__name__}: {exc}"[:120]
        self.local_bytes = drv.funcGetAttribute(drv.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, self.fn.ptr)

    def _symbol(self, name: str) -> int:
        import cupy

        ptr = self.module.get_global_var(f"{ENTRY}_{name}")
        host = np.zeros(1, dtype=np.uint32)
        if isinstance(ptr, int):  # CuPy 14 returns the device address
            cupy.cuda.runtime.memcpy(host.ctypes.data, ptr, 4, cupy.cuda.runtime.memcpyDeviceToHost)
        else:
            ptr.copy_to_host(host.ctypes.data, 4)
        return int(host[0])

    def tensor_maps(self, tma, a, b, d, m: int):
        v = self.v
        bc, br, sw = self.d_box
        in_bytes = ELEM_BYTES[v.dtype]
        tmap_a = tma.encode_tiled_2d(a.data.ptr, v.dtype, m, self.k, self.k * in_bytes, v.block_m, v.block_k, 128)
        tmap_b = tma.encode_tiled_2d(b.data.ptr, v.dtype, self.n, self.k, self.k * in_bytes, self.b_box_rows,
                                     v.block_k, 128)
        tmap_d = tma.encode_tiled_2d(d.data.ptr, v.out_dtype, m, self.n, self.n * ELEM_BYTES[v.out_dtype], br, bc, sw)
        return tmap_a, tmap_b, tmap_d

    def grid(self, m: int, num_sms: int) -> int:
        c = self.cluster_m
        # cluster tiles: c vertically adjacent tiles (the last one may lie past M: computed, not stored)
        tiles = -(-(-(-m // self.v.block_m)) // c) * -(-self.n // self.v.block_n)
        return c * max(1, min(num_sms // c, tiles))

    def launch(self, tmaps, m: int, num_sms: int):
        self.fn((self.grid(m, num_sms),), (self.num_threads,), (*tmaps, np.uint32(m)), shared_mem=self.smem_bytes)


# Raw 16-bit patterns are kept in uint16 device arrays: the kernel only needs bytes, and this avoids
# depending on CuPy's bfloat16 dtype support. Conversions to float64 happen on the GPU.
NAN_BITS = {"bf16": 0x7FC0, "fp16": 0x7E00}


def random_operand(rng, shape, dtype):
    import cupy
    import ml_dtypes
    x = rng.standard_normal(shape, dtype=np.float32)
    if dtype == "bf16":
        return cupy.asarray(x.astype(ml_dtypes.bfloat16).view(np.uint16))
    if dtype == "fp16":
        return cupy.asarray(x.astype(np.float16).view(np.uint16))
    return cupy.asarray(x)  # tf32: fp32 storage


def random_operand_gpu(shape, dtype, seed: int):
    """Like random_operand, generated on the GPU (big timing operands: host RNG + conversion is slow)."""
    import cupy
    x = cupy.random.default_rng(seed).standard_normal(shape, dtype=cupy.float32)
    if dtype == "tf32":
        return x
    if dtype == "fp16":
        return x.astype(cupy.float16).view(cupy.uint16)
    u = x.view(cupy.uint32)  # bf16: round to nearest even on the bit pattern (finite inputs)
    return ((u + cupy.uint32(0x7FFF) + ((u >> 16) & cupy.uint32(1))) >> 16).astype(cupy.uint16)


def to_f64(x, dtype):
    import cupy
    if dtype == "bf16":
        return (x.astype(cupy.uint32) << 16).view(cupy.float32).astype(cupy.float64)
    if dtype == "fp16":
        return x.view(cupy.float16).astype(cupy.float64)
    return x.astype(cupy.float64)


def empty_poisoned(shape, dtype):
    import cupy
    if dtype in NAN_BITS:
        return cupy.full(shape, NAN_BITS[dtype], dtype=cupy.uint16)
    return cupy.full(shape, np.nan, dtype=cupy.float32)


def check_case(kernel: Kernel, tma, m: int, num_sms: int, rng, watchdog: Watchdog) -> dict:
    import cupy
    v, n, k = kernel.v, kernel.n, kernel.k
    a = random_operand(rng, (m, k), v.dtype)
    b = random_operand(rng, (n, k), v.dtype)
    d = empty_poisoned((m, n), v.out_dtype)
    tmaps = kernel.tensor_maps(tma, a, b, d, m)
    label = f"check {v.tag} m={m} n={n} k={k}"
    watchdog.arm(label, 60)
    kernel.launch(tmaps, m, num_sms)
    cupy.cuda.Device().synchronize()
    watchdog.disarm()
    ref = to_f64(a, v.dtype) @ to_f64(b, v.dtype).T
    out = to_f64(d, v.out_dtype)
    nan_mask = cupy.isnan(out)
    num_nan = int(nan_mask.sum())
    diff = cupy.abs(out - ref)
    diff = cupy.where(nan_mask, cupy.inf, diff)
    flat = int(cupy.argmax(diff))
    worst = (flat // n, flat % n)
    ref_norm = float(cupy.linalg.norm(ref))
    err = float(cupy.linalg.norm(cupy.where(nan_mask, 0.0, out - ref))) / max(ref_norm, 1e-30)
    ok = num_nan == 0 and err <= TOLERANCE[v.dtype]
    result = dict(kind="check", variant=v.tag, m=m, n=n, k=k, rel_err=err, num_nan=num_nan, ok=ok,
                  max_abs_err=float(diff[worst]), max_abs_err_at=list(worst),
                  out_at=float(out[worst]), ref_at=float(ref[worst]))
    if not ok and num_nan:
        rows = cupy.nonzero(nan_mask.any(axis=1))[0]
        cols = cupy.nonzero(nan_mask.any(axis=0))[0]
        result["nan_rows"] = [int(rows.min()), int(rows.max()), int(rows.size)]
        result["nan_cols"] = [int(cols.min()), int(cols.max()), int(cols.size)]
    # With FP32 output the only error is summation order: anything above ~1e-5 hints at a real bug
    # (e.g. a missing K block) hiding under the 16-bit tolerance.
    if ok and v.out_dtype == "fp32" and v.dtype != "tf32" and err > 1e-4:
        result["suspicious"] = True
    return result


def time_case(kernel: Kernel, tma, m: int, num_sms: int, rng, watchdog: Watchdog, reps: int,
              use_torch: bool, operands=None) -> dict:
    import cupy
    v, n, k = kernel.v, kernel.n, kernel.k
    if operands is not None:
        a, b = operands
    else:
        a = random_operand(rng, (m, k), v.dtype)
        b = random_operand(rng, (n, k), v.dtype)
    d = empty_poisoned((m, n), v.out_dtype)
    tmaps = kernel.tensor_maps(tma, a, b, d, m)
    flush = cupy.empty(256 * 1024 * 1024, dtype=cupy.uint8)  # > 4x the 60 MB L2

    torch_fn = None
    if use_torch:
        import torch
        tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}[v.dtype]
        out_tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[v.out_dtype]
        # int16 views: every torch version takes int16 through DLPack, and view() reinterprets the bits.
        ta = torch.from_dlpack(a.view(cupy.int16)).view(tdt) if v.dtype != "tf32" else torch.from_dlpack(a)
        tb = torch.from_dlpack(b.view(cupy.int16)).view(tdt) if v.dtype != "tf32" else torch.from_dlpack(b)
        torch.backends.cuda.matmul.allow_tf32 = v.dtype == "tf32"
        if out_tdt == tdt:
            def torch_fn():
                return torch.matmul(ta, tb.T)
        else:
            def torch_fn():  # cuBLAS with a different output type: the out_dtype= overload where available
                try:
                    return torch.mm(ta, tb.T, out_dtype=out_tdt)
                except TypeError:
                    return torch.matmul(ta, tb.T).to(out_tdt)

    def timed(fn) -> float:
        flush.fill(1)
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return cupy.cuda.get_elapsed_time(start, stop) * 1e3  # us

    ours = lambda: kernel.launch(tmaps, m, num_sms)  # noqa: E731
    label = f"bench {v.tag} m={m} n={n} k={k}"
    watchdog.arm(label, 120)
    for _ in range(5):
        ours()
        if torch_fn is not None:
            torch_fn()
    cupy.cuda.Device().synchronize()
    t_ours, t_torch = [], []
    for _ in range(reps):  # interleaved, so clock/thermal drift hits both alike
        t_ours.append(timed(ours))
        if torch_fn is not None:
            t_torch.append(timed(torch_fn))
    cupy.cuda.Device().synchronize()
    watchdog.disarm()
    flops = 2.0 * m * n * k
    io_bytes = (m * k + n * k) * ELEM_BYTES[v.dtype] + m * n * ELEM_BYTES[v.out_dtype]
    us = float(np.median(t_ours))
    res = dict(kind="bench", variant=v.tag, m=m, n=n, k=k, us=us, tflops=flops / us * 1e-6,
               gbps=io_bytes / us * 1e-3, grid=kernel.grid(m, num_sms))
    if t_torch:
        tus = float(np.median(t_torch))
        res.update(torch_us=tus, torch_tflops=flops / tus * 1e-6, speedup=tus / us)
        # Cheap full-size check of what the timed launches wrote: relative difference to cuBLAS.
        ref = torch_fn().float()
        ours_t = torch.from_dlpack(d.view(cupy.int16)).view(out_tdt).float() if v.out_dtype != "fp32" \
            else torch.from_dlpack(d)
        diff = float(torch.linalg.norm(torch.nan_to_num(ours_t - ref, nan=1e30)) / torch.linalg.norm(ref))
        res["vs_cublas_err"] = diff
        res["vs_cublas_ok"] = bool(diff <= TOLERANCE[v.dtype])
    return res


# ----------------------------------------------------------------------------------------------------
# Plan
# ----------------------------------------------------------------------------------------------------

# Correctness: every variant on odd and small shapes (K, N multiples of 8 so row strides are 16-byte
# aligned, as TMA requires), plus the big shapes with the default variant.
CHECK_SHAPES = [(4096, 4096, 4096), (1000, 1008, 1024), (17, 40, 72), (1, 8, 8), (777, 1000, 392),
                (300, 2112, 520), (129, 264, 136)]
BIG_SHAPES = [(4096, 7168, 16384), (4096, 4096, 7168), (4096, 2112, 7168), (4096, 24576, 1536)]

CHECK_VARIANTS = [
    Variant("bf16", "bf16", 128, 256), Variant("bf16", "bf16", 128, 128), Variant("bf16", "bf16", 256, 128),
    Variant("bf16", "bf16", 64, 112), Variant("bf16", "bf16", 128, 208), Variant("bf16", "bf16", 128, 144),
    Variant("bf16", "bf16", 128, 176), Variant("bf16", "bf16", 128, 8), Variant("bf16", "bf16", 128, 40),
    Variant("bf16", "fp32", 128, 256), Variant("bf16", "fp32", 128, 160), Variant("bf16", "fp16", 128, 192),
    Variant("fp16", "fp16", 128, 256), Variant("fp16", "fp32", 64, 208), Variant("fp16", "bf16", 256, 96),
    Variant("bf16", "bf16", 128, 256, num_stages=2), Variant("bf16", "bf16", 128, 128, group_m=1),
    Variant("tf32", "fp32", 128, 128), Variant("tf32", "fp32", 128, 256), Variant("tf32", "fp32", 64, 72),
]
QUICK_VARIANTS = [Variant("bf16", "bf16", 128, 256), Variant("bf16", "bf16", 64, 112), Variant("fp16", "fp32", 256, 128),
                  Variant("tf32", "fp32", 128, 128)]

BENCH_VARIANTS = [Variant("bf16", "bf16", 128, 256), Variant("bf16", "bf16", 256, 128), Variant("bf16", "bf16", 128, 192),
                  Variant("bf16", "bf16", 128, 208), Variant("bf16", "bf16", 128, 176), Variant("bf16", "bf16", 128, 128)]
QUICK_BENCH_VARIANTS = [Variant("bf16", "bf16", 128, 256), Variant("bf16", "bf16", 256, 128)]

# --only-big: odd shapes for correctness of every timed variant (odd m-block counts exercise the padding
# tile of a cluster pair; N = 264 with block_n 256 a B half entirely past N), then the big timing rows.
ONLY_BIG_CHECK_SHAPES = [(777, 1000, 392), (300, 2112, 520), (129, 264, 136)]
ONLY_BIG_BENCH_SHAPES = [(4096, 7168, 16384), (4096, 4096, 7168), (4096, 2112, 7168), (4096, 24576, 1536),
                         (4096, 7168, 2048), (4096, 4096, 4096), (8192, 8192, 8192)]
ONLY_BIG_VARIANTS_V1 = [Variant("bf16", "bf16", 128, 256), Variant("bf16", "bf16", 128, 192),
                        Variant("bf16", "bf16", 128, 176)]
ONLY_BIG_VARIANTS_V2 = [
    Variant("bf16", "bf16", 128, 256),                            # idea 2 alone: 4 stages via the D ring
    Variant("bf16", "bf16", 128, 256, num_stages=3, cluster_m=2),  # idea 1 alone (3 stages as before)
    Variant("bf16", "bf16", 128, 256, cluster_m=2),               # ideas 1 + 2
    Variant("bf16", "bf16", 128, 192, cluster_m=2),
    Variant("bf16", "bf16", 128, 176, cluster_m=2),               # N = 2112 = 12 x 176
    Variant("bf16", "bf16", 128, 128, cluster_m=2),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few variants and shapes, 10 timing reps")
    ap.add_argument("--no-bench", action="store_true", help="correctness only")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile-only", action="store_true", help="render and compile the plan, no GPU (smoke test)")
    ap.add_argument("--templates", type=Path, default=TEMPLATES,
                    help="template directory to render (default: the repository's templates/)")
    ap.add_argument("--only-big", action="store_true",
                    help="3 odd correctness shapes per timed variant + the big M=4096 timing rows, 4096^3, 8192^3")
    args = ap.parse_args()
    set_templates(args.templates)
    print(f"# templates: {TEMPLATES} (layout {'v2' if LAYOUT_V2 else 'v1'})")

    if args.only_big:
        bench_variants = ONLY_BIG_VARIANTS_V2 if LAYOUT_V2 else ONLY_BIG_VARIANTS_V1
        plan = [(v, s) for v in bench_variants for s in ONLY_BIG_CHECK_SHAPES]
        bench_plan = [] if args.no_bench else [(v, s) for s in ONLY_BIG_BENCH_SHAPES for v in bench_variants]
    else:
        variants = QUICK_VARIANTS if args.quick else CHECK_VARIANTS
        plan = [(v, s) for v in variants for s in (CHECK_SHAPES[:4] if args.quick else CHECK_SHAPES[1:])]
        plan += [(v, CHECK_SHAPES[0]) for v in variants[:3]]
        plan += [(variants[0], s) for s in (BIG_SHAPES[:1] if args.quick else BIG_SHAPES)]
        plan = [(v, s) for v, s in plan if not (v.dtype == "tf32" and s in BIG_SHAPES)]
        bench_variants = QUICK_BENCH_VARIANTS if args.quick else BENCH_VARIANTS
        bench_plan = [] if args.no_bench else [(v, s) for s in BIG_SHAPES for v in bench_variants]
    keys = list(dict.fromkeys((v, n, k) for v, (m, n, k) in plan + bench_plan))
    t0 = time.perf_counter()
    compiled = precompile(keys, workers=max(1, min(16, os.cpu_count() or 1)))
    print(f"# compiled {len(keys)} kernels in {time.perf_counter() - t0:.1f} s "
          f"({sum(isinstance(c, Exception) for c in compiled.values())} failed)")
    if args.compile_only:
        for key, c in compiled.items():
            if isinstance(c, Exception):
                print(f"{key[0].tag} n={key[1]} k={key[2]}: {str(c)[:1000]}")
        return int(any(isinstance(c, Exception) for c in compiled.values()))

    import cupy
    tma = _load_tma_module()
    try:
        import torch  # noqa: F401
        use_torch = True
    except ImportError:
        use_torch = False

    dev = cupy.cuda.Device()
    num_sms = dev.attributes["MultiProcessorCount"]
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    env = dict(gpu=props["name"].decode() if isinstance(props["name"], bytes) else props["name"], num_sms=num_sms,
               cupy=cupy.__version__, torch=__import__("torch").__version__ if use_torch else None,
               date=time.strftime("%Y-%m-%dT%H:%M:%S"))
    print(f"# {env}")
    results: list[dict] = []
    kernels_info: list[dict] = []

    def dump(note: str = "") -> None:
        out_dir = os.environ.get("OUT")
        if not out_dir:
            return
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(out_dir) / "sm90_proto.json", "w") as f:
            json.dump(dict(env=env, note=note, kernels=kernels_info, results=results), f, indent=1)

    watchdog = Watchdog(lambda label: dump(f"timeout in {label}"))
    rng = np.random.default_rng(args.seed)

    # Tensor-map backends must agree byte for byte when both exist.
    try:
        probe = cupy.empty(1 << 20, dtype=cupy.uint8)
        maps = [bytes(tma.encode_tiled_2d(probe.data.ptr, "bf16", 512, 1024, 2048, 128, 64, 128, backend=bk))
                for bk in ("cuda-bindings", "ctypes")]
        print(f"# tensor-map backends agree: {maps[0] == maps[1]}")
    except Exception as exc:  # noqa: BLE001 - diagnostic only
        print(f"# tensor-map backend comparison skipped: {type(exc).__name__}: {exc}")

    cache: dict[tuple, Kernel] = {}

    def get_kernel(v: Variant, n: int, k: int) -> Kernel:
        key = (v, n, k)
        if key not in cache:
            pre = compiled.get(key)
            if isinstance(pre, Exception):
                raise pre
            watchdog.arm(f"compile+load {v.tag} n={n} k={k}", 120)
            kern = Kernel(v, n, k, pre)
            watchdog.disarm()
            cache[key] = kern
            info = dict(variant=v.tag, n=n, k=k, regs=kern.num_regs, local_bytes=kern.local_bytes,
                        smem_bytes=kern.smem_bytes, d_box=list(kern.d_box), compile_s=round(kern.compile_s, 2),
                        cluster_m=kern.cluster_m, d_chunk_slices=kern.d_chunk_slices,
                        max_active_clusters=kern.max_active_clusters)
            kernels_info.append(info)
        return cache[key]

    print(f"\n## correctness ({len(plan)} cases)")
    print(f"{'variant':44s} {'m':>5s} {'n':>6s} {'k':>6s} {'rel_err':>9s} {'nan':>6s}  result")
    num_fail = 0
    for v, (m, n, k) in plan:
        try:
            kern = get_kernel(v, n, k)
            r = check_case(kern, tma, m, num_sms, rng, watchdog)
        except Exception as exc:  # noqa: BLE001 - report and continue with the next case
            watchdog.disarm()
            r = dict(kind="check", variant=v.tag, m=m, n=n, k=k, ok=False, error=f"{type(exc).__name__}: {exc}",
                     traceback=traceback.format_exc(limit=4))
            try:
                cupy.cuda.Device().synchronize()
            except Exception as sync_exc:  # noqa: BLE001 - a sticky error poisons the context
                r["sticky"] = str(sync_exc)
        results.append(r)
        num_fail += not r["ok"]
        if "error" in r:
            print(f"{v.tag:44s} {m:5d} {n:6d} {k:6d}  ERROR {r['error'].splitlines()[0][:300]}")
            if "sticky" in r:
                print("!!! the CUDA context is broken (sticky error); stopping")
                dump("sticky error")
                return 2
        else:
            verdict = "ok" if r["ok"] else "FAIL"
            if r.get("suspicious"):
                verdict += " (suspicious for fp32 out)"
            extra = "" if r["ok"] else (f"  max|err|={r['max_abs_err']:.3g} at {tuple(r['max_abs_err_at'])}"
                                        f" out={r['out_at']:.4g} ref={r['ref_at']:.4g}"
                                        + (f" nan_rows={r.get('nan_rows')} nan_cols={r.get('nan_cols')}"
                                           if r['num_nan'] else ""))
            print(f"{v.tag:44s} {m:5d} {n:6d} {k:6d} {r['rel_err']:9.2e} {r['num_nan']:6d}  {verdict}{extra}",
                  flush=True)
        dump()

    print("\n## kernels (registers from the driver, local = spill/stack bytes per thread)")
    for info in kernels_info:
        print(f"{info['variant']:44s} n={info['n']:6d} k={info['k']:6d} regs={info['regs']:4d} "
              f"local={info['local_bytes']} smem={info['smem_bytes']} d_box={info['d_box']}"
              + (f" d_chunk_slices={info['d_chunk_slices']}" if LAYOUT_V2 else "")
              + (f" max_active_clusters={info['max_active_clusters']}" if info["cluster_m"] > 1 else ""))

    if not args.no_bench:
        print(f"\n## timing (median of {10 if args.quick else args.reps}, L2 flushed; torch = cuBLAS)")
        print(f"{'variant':44s} {'m':>5s} {'n':>6s} {'k':>6s} {'us':>9s} {'TFLOPS':>7s} {'torch_us':>9s} "
              f"{'torch_TF':>8s} {'speedup':>7s}")
        operand_cache: dict = {}
        for v, (m, n, k) in bench_plan:
            try:
                kern = get_kernel(v, n, k)
                operands = None
                if args.only_big:  # one pair of GPU-generated operands per shape, shared by the variants
                    key = (m, n, k, v.dtype)
                    if key not in operand_cache:
                        operand_cache.clear()
                        operand_cache[key] = (random_operand_gpu((m, k), v.dtype, args.seed + 1),
                                              random_operand_gpu((n, k), v.dtype, args.seed + 2))
                    operands = operand_cache[key]
                r = time_case(kern, tma, m, num_sms, rng, watchdog, 10 if args.quick else args.reps, use_torch,
                              operands)
            except Exception as exc:  # noqa: BLE001
                watchdog.disarm()
                r = dict(kind="bench", variant=v.tag, m=m, n=n, k=k, error=f"{type(exc).__name__}: {exc}")
                print(f"{v.tag:44s} {m:5d} {n:6d} {k:6d}  ERROR {r['error'][:300]}")
                results.append(r)
                continue
            results.append(r)
            num_fail += not r.get("vs_cublas_ok", True)
            print(f"{v.tag:44s} {m:5d} {n:6d} {k:6d} {r['us']:9.1f} {r['tflops']:7.1f} "
                  f"{r.get('torch_us', float('nan')):9.1f} {r.get('torch_tflops', float('nan')):8.1f} "
                  f"{r.get('speedup', float('nan')):7.3f}"
                  + ("" if r.get("vs_cublas_ok", True) else f"  MISMATCH vs cuBLAS rel={r['vs_cublas_err']:.3g}"),
                  flush=True)
            dump()
        # Geometric mean of the speedups of the best variant per shape (what the goal is stated in).
        best: dict = {}
        for r in results:
            if r.get("kind") == "bench" and "speedup" in r and r.get("vs_cublas_ok", True):
                key = (r["m"], r["n"], r["k"])
                if key not in best or r["speedup"] > best[key]["speedup"]:
                    best[key] = r
        if best:
            gm = float(np.exp(np.mean([np.log(r["speedup"]) for r in best.values()])))
            print(f"\n## best per shape (geomean speedup vs cuBLAS {gm:.3f})")
            for (m, n, k), r in best.items():
                print(f"{m:5d} {n:6d} {k:6d}  {r['variant']:44s} {r['us']:9.1f} us {r['tflops']:7.1f} TF "
                      f"{r['speedup']:7.3f}x")

    dump("complete")
    print(f"\n# {num_fail} correctness failures")
    return 1 if num_fail else 0


if __name__ == "__main__":
    sys.exit(main())
