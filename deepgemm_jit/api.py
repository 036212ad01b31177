"""The public API: ``build`` -> ``Gemm``, ``Gemm.__call__``, and the functional ``gemm``."""
from __future__ import annotations

import dataclasses
import math
import operator
import threading
import time
from collections.abc import Callable

import numpy as np

from . import config as config_mod
from . import copies, device, dtypes, env, gemv, gemv_kn, jit, launch, runtime, splitk, staging
from .arrays import (MatrixView, ScaleView, array_kind, check_writable, has_distinct_elements, matrix_view, new_array,
                     new_mn_major_scales, out_view, overlaps, scalar_signature, scale_view, signature)
from .errors import KernelNotCachedError, NoGPUError
from .spec import LAYOUTS, GemmSpec
from . import buckets, sm90_rules, sm90_tiles

_MAX_M = 2**31 - 1
OFFLINE_DECODE_RETRY_S = 5.0  # how long a decode kernel found missing (offline mode) is not looked up again
_MAX_LAUNCH_PLANS = 64
# What scale_a / scale_b hold, per scaling (for error messages).
_SCALE_MEANING = {"tensor": ("one scale for all of A", "one scale for all of B"),
                  "row": ("(M,): one per row of A", "(N,): one per row of B, i.e. per output column"),
                  "block": ("(M, ceil(K/128)): one per 1x128 group of A",
                            "(ceil(N/128), ceil(K/128)): one per 128x128 block of B")}  # per Gemm; a full table is dropped, not evicted one by one


def _check_m(m: object, arg: str = "M", allow_zero: bool = False) -> int:
    if isinstance(m, bool):
        raise TypeError(f"{arg} must be an integer, got bool")
    try:
        v = operator.index(m)
    except TypeError:
        raise TypeError(f"{arg} must be an integer, got {type(m).__name__}") from None
    if v < (0 if allow_zero else 1) or v > _MAX_M:
        raise ValueError(f"{arg} must be in [{0 if allow_zero else 1}, {_MAX_M}], got {v}")
    return v


class Gemm:
    """A compiled GEMM for one spec: call it on device arrays of any M.

    Contract (``layout`` letters say how A and B are stored, D is always row-major):

    - ``nt``: a (M, K), b (N, K) -> d (M, N) = a @ b.T   (b like ``nn.Linear.weight``)
    - ``nn``: a (M, K), b (K, N) -> d = a @ b
    - ``tn``: a (K, M), b (K, N) -> d = a.T @ b
    - ``tt``: a (K, M), b (N, K) -> d = a.T @ b.T

    a and b have the spec's input dtype (float16, ml_dtypes.bfloat16, float32 for tf32; FP8 as torch
    float8_e4m3fn/float8_e5m2 tensors or uint8 arrays of the FP8 bits; int8), unit stride along their last
    dimension, any row stride. d has ``out_dtype``.

    FP8 and scaled INT8 take ``scale_a``/``scale_b`` (float32 dequantization factors, x = q * s) in the
    shapes of ``spec.scaling``: tensor (1,) and (1,); row (M,) and (N,); block (M, ceil(K/128)) per 1x128
    group of A and (ceil(N/128), ceil(K/128)) per 128x128 block of B. Any strides are read as they are:
    row-major, or DeepGEMM's column-major scale_a (a transposed view), which makes a warp's loads of
    consecutive rows contiguous and is the (slightly) faster one.

    Example::

        g = deepgemm_jit.build(4096, 7168, 2048, dtype="bf16")
        d = g(a, b)                 # new (M, N) array
        g(a, b, out=d)              # or into your own
    """

    def __init__(self, spec: GemmSpec, arch: str, m_hint: int, artifact: jit.KernelArtifact,
                 weight_streaming: bool = True, split_k: int | None = None, deterministic: bool = True):
        self.spec = spec
        self.arch = arch
        self.m_hint = m_hint
        self.config = artifact.config
        self.artifact = artifact
        # The spec the kernel was compiled for: `spec`, or its nt (tn at small M: nn) twin, whose calls transpose
        # MN-major TF32 operands into K-major staging buffers first (sm90_rules.kernel_spec, copies.py).
        self.kernel_spec = artifact.spec
        # The warmup line that plans this Gemm's kernel and its twins (what an offline miss of its amax twin
        # prints), computed only then: build_spec sets it (None where warmup cannot plan the build: config=, split_k=,
        # promoted=True), build_fp32 the line of its own shape.
        self._warmup_command: Callable[[], str | None] = lambda: None
        self._transposes = artifact.spec.layout != spec.layout
        # The operands those calls transpose: MN-major in `spec`, K-major in the kernel's; empty for every other Gemm.
        self.transposed_operands = tuple(role for role, k_major, kernel_k_major in (
            ("a", spec.a_k_major, artifact.spec.a_k_major), ("b", spec.b_k_major, artifact.spec.b_k_major))
            if kernel_k_major and not k_major)
        # Resolved once here rather than on every call.
        self._a_dtypes = _accepted_dtypes(spec.dtype)
        self._b_dtypes = _accepted_dtypes(spec.b_type)
        # 8-bit operands and fused epilogues exist only in the Hopper family (no portable fallback kernel).
        self._sm90_only = dtypes.is_quantized(spec.dtype) or spec.epilogue != "none" or spec.raw_b
        self._epi = spec.epi  # parsed once: the call path reads it
        self._returns_scales = self._epi.has_group_scales  # quant_fp8_g128: calls return (q, scales)
        # Calls with M <= this (and 16-byte aligned rows) run a weight-streaming kernel (0: never): gemv.py's for
        # weights stored (N, K), gemv_kn.py's for weights stored (K, N).
        self.weight_streaming_kernel = gemv if spec.b_k_major else gemv_kn
        self.weight_streaming_max_m = 0
        if weight_streaming and spec.b_k_major:
            self.weight_streaming_max_m = gemv.max_m(spec, arch)
        elif weight_streaming:  # gemv_kn's rule counts waves of CTAs: this GPU's SMs (an H200's where none is here)
            num_sms = device.num_sms_or(sm90_tiles.DEFAULT_SM90_NUM_SMS)
            self.weight_streaming_max_m = gemv_kn.max_m(spec, arch, num_sms)
        self._out_dtype = dtypes.numpy_dtype(spec.out_dtype)
        self._out_dtypes = _accepted_dtypes(spec.out_dtype)  # FP8 outputs (quantize-on-store) also as uint8
        self._esize = dtypes.get(spec.dtype).storage_bytes
        # Portable-family kernels by (vec_a, vec_b): the built one when it is sm80, and fallbacks.
        self._variants: dict[tuple[int, int], jit.KernelArtifact] = {}
        if artifact.config.family == "sm80":
            self._variants[(artifact.config.vec_a, artifact.config.vec_b)] = artifact
        self._ready_devices: set[int] = set()  # devices checked to run this arch
        # Launches already validated, by the signatures of (a, b, out): a repeat call with the same
        # buffers (the inference loop) skips validation, variant choice and tensor-map look-ups. Plans that write
        # the split-K workspace or staging buffers serve only the stream whose buffers they are.
        self._launch_plans = launch.KeptPlans(_MAX_LAUNCH_PLANS)
        # DEEPGEMM_JIT_OFFLINE: when the decode kernel was last found missing from the cache, the next look is due
        # (a miss costs a render and a disk lookup, ~0.3 ms; misses are not memoized since warmup may fill the cache)
        self._decode_retry_at = 0.0
        self._lock = threading.Lock()
        self._amax_twin: Gemm | None = None  # static-scale quantization: the amax_out kernel (_amax_gemm)
        self._amax_needs_twin = self._epi.has_static_scale and not self._epi.amax  # calls with amax_out run it
        # Split-K kernels (splitk.py): K shares per call (None: chosen per call's M), how they meet (deterministic:
        # in split order; else atomic adds, splitk.adds_atomically) and the partial-tile workspace (one mode per
        # Gemm, so it stays zeroed), one per stream: calls on two streams may overlap (stream_buffers.py).
        self.split_k = split_k
        self.deterministic = deterministic
        self.split_adds_atomically = splitk.adds_atomically(spec, deterministic)
        self._split_workspace = splitk.Workspace()
        # Aligned copies of operands TMA cannot describe (staging.py; _staged_roles says when they are used).
        self._staging = staging.StagingBuffers()

    @property
    def family(self) -> str:
        return self.config.family

    def __repr__(self) -> str:
        return f"Gemm({self.spec.tag}, {self.config.tag}, arch={self.arch})"

    # -- validation -------------------------------------------------------------
    def _operands(self, a, b, out) -> tuple[int, MatrixView, MatrixView, MatrixView | None]:
        spec = self.spec
        va = matrix_view(a, "a")
        vb = matrix_view(b, "b")
        for view, arg, accepted, name in ((va, "a", self._a_dtypes, spec.dtype), (vb, "b", self._b_dtypes, spec.b_type)):
            if view.dtype not in accepted:
                raise TypeError(f"{arg} has dtype {view.dtype}, but this Gemm takes "
                                f"{' or '.join(str(d) for d in accepted)} ({name})")
        if spec.a_k_major:
            m, a_k = va.rows, va.cols
            a_desc = "(M, K)"
        else:
            a_k, m = va.rows, va.cols
            a_desc = "(K, M)"
        if a_k != spec.operand_k:
            raise ValueError(f"a has shape {(va.rows, va.cols)}; layout {spec.layout!r} wants a {a_desc} "
                             f"with K={spec.operand_k}")
        if (vb.rows, vb.cols) != spec.b_shape():
            want = "(N, K)" if spec.b_k_major else "(K, N)"
            raise ValueError(f"b has shape {(vb.rows, vb.cols)}; layout {spec.layout!r} wants b {want} = "
                             f"{spec.b_shape()}")
        m = _check_m(m, "M (rows of a)" if spec.a_k_major else "M (columns of a)", allow_zero=True)
        if vb.device != va.device:
            raise ValueError(f"a is on device {va.device} but b is on device {vb.device}")
        vd = out_view(out, self._out_dtypes, f"{self._out_dtype} ({spec.out_dtype})", spec.out_shape(m), va, vb)
        return m, va, vb, vd

    def _epilogue_operands(self, m: int, va: MatrixView, vd: MatrixView | None, bias, c, residual, alpha, beta
                           ) -> launch.EpilogueOperands:
        """Validate the call-time operands of the fused epilogue (before anything is launched)."""
        epi = self._epi
        given = {"bias": bias, "c": c, "residual": residual}
        wanted = {"bias": epi.bias != "none", "c": epi.beta, "residual": epi.residual}
        for arg, x in given.items():
            if x is not None and not wanted[arg]:
                raise TypeError(f"{arg}= was given, but this Gemm's epilogue is {self.spec.epilogue!r}")
            if x is None and wanted[arg]:
                raise TypeError(f"{arg} is required: this Gemm's epilogue is {self.spec.epilogue!r}")
        for arg, v in (("alpha", alpha), ("beta", beta)):
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
                raise TypeError(f"{arg} must be a number, got {type(v).__name__}")
            if not _fits_float32(v):  # the kernel takes it as a float32: a finite value must stay finite
                text = str(v) if len(str(v)) <= 24 else str(v)[:20] + "..."
                raise ValueError(f"{arg}={text} is outside the float32 range the kernel takes it in")
            if float(v) != 1.0 and not epi.beta:
                raise TypeError(f"{arg}={v} needs the 'beta' epilogue (D = alpha * acc + beta * C)")
        out_dtype = self._out_dtype
        ops: dict = {"alpha": float(alpha), "beta": float(beta)}
        if bias is not None:
            length = self.spec.n if epi.bias == "col" else m
            what = "one per output " + ("column (N)" if epi.bias == "col" else "row (M)")
            if epi.is_gated and epi.bias == "col":
                what = "one per weight row (N), gate and up interleaved like the weight"
            bias_dtype = dtypes.numpy_dtype(self.spec.epilogue_operand_dtype)
            why = (f"it must be {bias_dtype} like the output" if self.spec.epilogue_operand_dtype == self.spec.out_dtype
                   else f"this epilogue adds it in {bias_dtype}")
            view = scale_view(bias, "bias", (length,), what, bias_dtype, why)
            if length > 1 and view.stride_i != 1:
                raise ValueError("bias must be contiguous")
            if view.device != va.device:
                raise ValueError(f"bias is on device {view.device} but a is on device {va.device}")
            if vd is not None and m > 0 and overlaps(vd, view):
                raise ValueError("out overlaps bias; the kernel would read what it overwrites")
            ops["bias"], ops["bias_view"] = view.ptr, view
        for arg, x in (("c", c), ("residual", residual)):
            if x is None:
                continue
            view = matrix_view(x, arg)
            if view.dtype != out_dtype:
                raise TypeError(f"{arg} has dtype {view.dtype}; it must be {out_dtype} like the output")
            if (view.rows, view.cols) != self.spec.out_shape(m):
                raise ValueError(f"{arg} has shape {(view.rows, view.cols)}, expected (M, N) = {self.spec.out_shape(m)}")
            if view.device != va.device:
                raise ValueError(f"{arg} is on device {view.device} but a is on device {va.device}")
            if (vd is not None and m > 0 and overlaps(vd, view)
                    and (view.ptr, view.row_stride) != (vd.ptr, vd.row_stride)):
                raise ValueError(f"out partly overlaps {arg}: it may be out itself (same memory and row stride) "
                                 "or separate memory")
            ops[arg] = view
        return launch.EpilogueOperands(**ops)

    def _quant_operands(self, m: int, va: MatrixView, vd: MatrixView | None, ops: launch.EpilogueOperands,
                        quant_scale, amax_out, scales_out, reads: dict | None = None) -> launch.EpilogueOperands:
        """Validate the quantize-on-store operands (before anything is launched): the static scale and amax output
        of the per-tensor kinds, the group scales output of quant_fp8_g128 (when not given, the call allocates
        it); the written ones must not overlap `reads` (name -> view the kernel reads). Returns `ops` with their
        pointers."""
        epi = self._epi
        given = {"quant_scale": quant_scale, "amax_out": amax_out, "scales_out": scales_out}
        takes = {"quant_scale": epi.has_static_scale, "amax_out": epi.has_static_scale,
                 "scales_out": epi.has_group_scales}
        for arg, x in given.items():
            if x is not None and not takes[arg]:
                owner = "quant_fp8_g128" if arg == "scales_out" else "quant_fp8_tensor / quant_int8_tensor"
                raise TypeError(f"{arg}= was given, but this Gemm's epilogue is {self.spec.epilogue!r} (only "
                                f"{owner} take it)")
        if epi.has_static_scale and quant_scale is None:
            raise TypeError(f"quant_scale is required: this Gemm's epilogue is {self.spec.epilogue!r} (a float32 "
                            "device array of one element, q = x / quant_scale)")
        views: dict[str, ScaleView] = {}
        for arg, shape, what in (("quant_scale", (1,), "one float32 scale, q = x / quant_scale"),
                                 ("amax_out", (1,), "one float32 word the kernel atomically maxes |x| into"),
                                 ("scales_out", self.spec.scales_out_shape(m), "(M, ceil(N_out/128)) float32, one "
                                  "per 1x128 group of each output row")):
            if given[arg] is None:
                continue
            if arg != "quant_scale":  # amax_out, scales_out: written
                check_writable(given[arg], arg)
            view = scale_view(given[arg], arg, shape, what)
            if view.device != va.device:
                raise ValueError(f"{arg} is on device {view.device} but a is on device {va.device}")
            if arg == "scales_out" and m > 0 and not has_distinct_elements(view.shape, (view.stride_i, view.stride_j)):
                raise ValueError("scales_out has zero or interleaving strides: its elements must be distinct")
            if vd is not None and m > 0 and overlaps(vd, view):
                raise ValueError(f"out overlaps {arg}; the kernel writes both")
            if arg != "quant_scale" and m > 0:  # what the kernel writes must not be what it reads
                for name, read in (reads or {}).items():
                    if read is not None and overlaps(read, view):
                        raise ValueError(f"{arg} overlaps {name}; the kernel would read what it overwrites")
            views[arg] = view
        if "amax_out" in views and "quant_scale" in views and overlaps(views["amax_out"], views["quant_scale"]):
            raise ValueError("amax_out overlaps quant_scale; the kernel reads one while it writes the other")
        if "quant_scale" in views:
            ops = dataclasses.replace(ops, quant=views["quant_scale"].ptr,
                                      amax=views["amax_out"].ptr if "amax_out" in views else 0)
        sv = views.get("scales_out")
        if sv is not None:
            ops = dataclasses.replace(ops, quant=sv.ptr, scales_stride_m=sv.stride_i, scales_stride_g=sv.stride_j)
        return ops

    def _scales(self, m: int, va: MatrixView, vd: MatrixView | None, scale_a, scale_b
                ) -> tuple[ScaleView | None, ScaleView | None]:
        spec = self.spec
        shapes = spec.scale_shapes(m)
        if shapes is None:
            for x, arg in ((scale_a, "scale_a"), (scale_b, "scale_b")):
                if x is not None:
                    raise TypeError(f"{arg} was given, but this Gemm ({spec.dtype}, scaling={spec.scaling!r}) "
                                    "takes no scales")
            return None, None
        meaning = _SCALE_MEANING[spec.scaling]
        views = []
        for x, arg, shape, what in zip((scale_a, scale_b), ("scale_a", "scale_b"), shapes, meaning):
            if x is None:
                raise TypeError(f"{arg} is required: this Gemm has scaling={spec.scaling!r} ({what})")
            view = scale_view(x, arg, shape, what)
            if view.device != va.device:
                raise ValueError(f"{arg} is on device {view.device} but a is on device {va.device}")
            if vd is not None and m > 0 and overlaps(vd, view):
                raise ValueError(f"out overlaps {arg}; the kernel would read what it overwrites")
            views.append(view)
        return views[0], views[1]

    # -- kernel variants ----------------------------------------------------------
    def _artifact_for(self, va: MatrixView, vb: MatrixView, vd: MatrixView) -> jit.KernelArtifact:
        """The compiled kernel these operands allow: the built one, or a portable variant (built on
        first use) with loads as wide as the operands' alignment permits."""
        base = self.config
        if self._sm90_only:
            return self.artifact
        if (base.family == "sm90" and not self._transposes and launch.tma_legal(va) and launch.tma_legal(vb)
                and launch.tma_store_legal(vd)):
            return self.artifact
        vec_a = config_mod.max_vector(self._esize, va.ptr, va.row_stride, va.rows)
        vec_b = config_mod.max_vector(self._esize, vb.ptr, vb.row_stride, vb.rows)
        if base.family == "sm80":  # never wider than what was built
            vec_a, vec_b = min(base.vec_a, vec_a), min(base.vec_b, vec_b)
        variant = self._variants.get((vec_a, vec_b))
        if variant is None:
            with self._lock:
                variant = self._variants.get((vec_a, vec_b))
                if variant is None:
                    if base.family == "sm80":  # same tiles as built, narrower loads
                        cfg = dataclasses.replace(base, vec_a=vec_a, vec_b=vec_b)
                    else:
                        cfg = config_mod.choose_sm80_config(self.spec, self.m_hint, self.arch, vec_a, vec_b)
                    variant = jit.get_kernel(self.spec, cfg, self.arch)
                    self._variants[(vec_a, vec_b)] = variant
        return variant

    # -- call -----------------------------------------------------------------------
    @runtime.orders_dlpack_imports
    def __call__(self, a, b, *, scale_a=None, scale_b=None, bias=None, c=None, residual=None, alpha=1.0,
                 beta=1.0, out=None, stream=None, quant_scale=None, amax_out=None, scales_out=None):
        """d = op(a) @ op(b) for this Gemm's layout (times the scales for FP8 / scaled INT8, through the fused
        epilogue when the Gemm has one: bias (N,) or (M,), c and residual (M, N), alpha/beta, all in the output's
        dtype; c and residual may be `out` itself); returns `out` if given, else a new array of the inputs' kind
        (CuPy in, CuPy out; torch in, torch out). Runs on `stream`, else on the current stream of the inputs'
        library (CuPy's, or torch's for torch tensors).

        Quantize-on-store epilogues (see ``deepgemm_jit/epilogue.py``): ``quant_fp8_g128`` returns ``(q, scales)``,
        q (M, N_out) FP8 E4M3 (uint8 bits for CuPy, float8_e4m3fn for torch) and scales (M, ceil(N_out/128))
        float32, M-major as :func:`deepgemm_jit.quantize` returns group128 scales (so they feed a block-scaled FP8
        GEMM's fast path), into ``out=`` / ``scales_out=`` when given (scales_out any strides, e.g. row-major);
        ``quant_fp8_tensor`` / ``quant_int8_tensor`` take ``quant_scale=`` (float32, one element, on the device) and
        optionally ``amax_out=`` (float32, one element, zeroed by the caller: the kernel max-reduces into it; such a
        call runs the Gemm's amax twin, epilogue.py says why) and return q. Gated epilogues (swiglu / geglu) return
        (M, N/2)."""
        if amax_out is not None and self._amax_needs_twin:
            if self._amax_twin is None:  # the arguments are checked before the twin is built (a compile, or offline
                # a KernelNotCachedError that would hide a wrong argument)
                self._checked_operands(a, b, out, scale_a, scale_b, bias, c, residual, alpha, beta, quant_scale,
                                       amax_out, scales_out)
            return self._amax_gemm()(a, b, scale_a=scale_a, scale_b=scale_b, bias=bias, c=c, residual=residual,
                                     alpha=alpha, beta=beta, out=out, stream=stream, quant_scale=quant_scale,
                                     amax_out=amax_out, scales_out=scales_out)
        key = None
        if out is not None:
            key = (signature(a), signature(b), signature(out), signature(scale_a), signature(scale_b),
                   signature(bias), signature(c), signature(residual), scalar_signature(alpha), scalar_signature(beta),
                   signature(quant_scale), signature(amax_out), signature(scales_out))
            hit = self._launch_plans.lookup(key, stream) if None not in key else None
            if hit is not None:
                plan, cu_stream = hit
                plan.run(cu_stream)
                return (out, scales_out) if self._returns_scales else out
        kind, m, va, vb, vd, sa, sb, epi = self._checked_operands(a, b, out, scale_a, scale_b, bias, c, residual,
                                                                  alpha, beta, quant_scale, amax_out, scales_out)
        dev = device.device_for_call(self.arch, self._ready_devices, va.device, "Gemm")
        cu_stream = runtime.stream_for(kind, stream, dev)
        if out is None:
            out = new_array(kind, self.spec.out_shape(m), self.spec.out_dtype, dev, cu_stream, stream is not None)
            vd = matrix_view(out, "out")
        # A launch plan is replayed only for calls whose every written buffer the caller passed (out=, and
        # scales_out= for quant_fp8_g128): a plan writing into a buffer allocated here would hand it out again.
        replayable = key is not None and (not self._returns_scales or scales_out is not None)
        # Nor are the plans of a CUDA-graph capture kept: it may run the portable kernel or skip copies where the
        # staging buffers are not yet sized (_staged_roles), which a call after the capture would not.
        replayable = replayable and not runtime.is_capturing(cu_stream)
        if self._returns_scales:  # quant_fp8_g128 returns (q, scales)
            if scales_out is None:  # M-major like quantize's group128 scales: a next FP8 block GEMM bulk-copies them
                scales_out = new_mn_major_scales(kind, *self.spec.scales_out_shape(m), dev, cu_stream,
                                                 stream is not None)
                sv = scale_view(scales_out, "scales_out", self.spec.scales_out_shape(m), "")
                epi = dataclasses.replace(epi, quant=sv.ptr, scales_stride_m=sv.stride_i, scales_stride_g=sv.stride_j)
            result = (out, scales_out)
        else:
            result = out
        if m == 0:
            return result
        decode = self.weight_streaming_kernel
        if m <= self.weight_streaming_max_m and decode.operands_fit(va, vb):  # decode: see gemv.py, gemv_kn.py
            plan = None
            if time.monotonic() < self._decode_retry_at:  # missing from the cache a moment ago: not looked up again
                replayable = False
            else:
                try:
                    plan = decode.plan(self.spec, self.arch, m, va, vb, vd, dev, sa, sb)
                except KernelNotCachedError:  # DEEPGEMM_JIT_OFFLINE and not warmed: the Gemm's own kernel serves,
                    # unkept, until the decode kernel reaches the cache (a kept plan would serve for good)
                    replayable, self._decode_retry_at = False, time.monotonic() + OFFLINE_DECODE_RETRY_S
            if plan is not None:
                plan.run(cu_stream)
                self._remember_plan(key if replayable else None, plan, kind, None)
                return result
        realigned = self._staged_roles(m, va, vb, vd, epi, cu_stream) if self.config.family == "sm90" else None
        if realigned is not None:
            staged = self._staged_plan(m, va, vb, vd, sa, sb, epi, dev, cu_stream, realigned)
            staged.run(cu_stream)
            self._remember_plan(key if replayable else None, staged, kind, cu_stream.ptr)  # the staging buffers'
            return result
        artifact = self._artifact_for(va, vb, vd)
        split = self._split_operands(artifact, m, dev, cu_stream)
        plan = launch.plan(launch.load(artifact, self.spec, dev), artifact, self.spec, m, va, vb, vd, dev, sa, sb,
                           epi, split=split)
        plan.run(cu_stream)
        bound = cu_stream.ptr if split is not None and split.partials else None  # the stream's split workspace
        self._remember_plan(key if replayable else None, plan, kind, bound)
        return result

    def _checked_operands(self, a, b, out, scale_a, scale_b, bias, c, residual, alpha, beta, quant_scale, amax_out,
                          scales_out):
        """Every operand of a call validated (nothing launched or allocated): (kind, m, va, vb, vd, sa, sb, epi)."""
        kind = _common_kind(a, b, out)
        m, va, vb, vd = self._operands(a, b, out)
        sa, sb = self._scales(m, va, vd, scale_a, scale_b)
        epi = self._epilogue_operands(m, va, vd, bias, c, residual, alpha, beta)
        if self._epi.quant != "none" or quant_scale is not None or amax_out is not None or scales_out is not None:
            reads = {"a": va, "b": vb, "scale_a": sa, "scale_b": sb, "bias": epi.bias_view, "c": epi.c,
                     "residual": epi.residual}
            epi = self._quant_operands(m, va, vd, epi, quant_scale, amax_out, scales_out, reads)
        return kind, m, va, vb, vd, sa, sb, epi

    def _amax_gemm(self) -> "Gemm":
        """The twin of this static-scale quantizing Gemm whose kernel also max-reduces |x| into amax_out (the
        epilogue's amax word; epilogue.py says why it is a kernel of its own): the same tiles, built on the first
        call that passes amax_out (warmup plans it too)."""
        twin = self._amax_twin
        if twin is None:
            with self._lock:
                if self._amax_twin is None:
                    spec = dataclasses.replace(self.spec, epilogue=dataclasses.replace(self._epi, amax=True).text)
                    try:
                        self._amax_twin = build_spec(spec, self.m_hint, arch=self.arch, config=self.config,
                                                     weight_streaming=self.weight_streaming_max_m > 0,
                                                     split_k=self.split_k, deterministic=self.deterministic)
                    except KernelNotCachedError as exc:
                        # build_spec names no warmup line for the twin's forced config, but warmup of this Gemm's
                        # own shape plans the twin with this Gemm's config (warmup.plan_buckets)
                        line = self._warmup_command()
                        note = "" if line is not None else (
                            "warmup cannot plan this Gemm's kernels (built with config=, split_k= or promoted=True): "
                            "pre-generate the amax twin by making a call with amax_out= once without "
                            "DEEPGEMM_JIT_OFFLINE")
                        raise exc.with_warmup_command(line, note=note) from None
                twin = self._amax_twin
        return twin

    def _split_operands(self, artifact: jit.KernelArtifact, m: int, dev: int, cu_stream
                        ) -> splitk.SplitOperands | None:
        """A split-K kernel's shares for this M and the workspace they meet in (None for other kernels)."""
        cfg = artifact.config
        if not cfg.split_k:
            return None
        splits = splitk.num_splits(artifact.spec, cfg, m, launch.num_sms(dev), self.split_k)
        return self._split_workspace.operands(artifact.spec, cfg, m, splits, dev, cu_stream,
                                              atomic=self.split_adds_atomically)

    def _remember_plan(self, key: tuple | None, plan: launch.LaunchPlan, kind: str, stream_ptr: int | None) -> None:
        """Keep `plan` for calls with `key` (None: not kept) on the stream `stream_ptr` (None: any stream)."""
        if key is not None and None not in key:
            self._launch_plans.keep(key, plan, kind, plan.device_id, stream_ptr)

    def _staged_roles(self, m: int, va: MatrixView, vb: MatrixView, vd: MatrixView, epi: launch.EpilogueOperands,
                      cu_stream) -> frozenset[str] | None:
        """None when a call of the Hopper kernel reads its operands in place; else it runs on staged copies
        (_staged_plan) of MN-major TF32 operands (always transposed, sm90_rules.sm90_transposes), of every operand TMA
        cannot describe, of a D whose rows end inside a 16-byte chunk (launch.tma_store_legal: a TMA store would
        overwrite the chunk's rest, which is not ours), and of the returned roles: A / B that TMA can read but whose
        rows start off 32-byte sectors, where their copies pay (sm90_rules.sm90_realign_roles). The portable kernel
        is 2-4x slower on operands TMA cannot describe even with 2- or 4-element loads (sm90_tiles.sm90_supports), so
        it serves only kernels that have one (no 8-bit types or fused epilogues) and only while the stream captures a
        CUDA graph before the staging buffers hold these operands (staging.py allocates outside a capture); such a
        capture reads rows off sectors in place."""
        off_sector = {role: v.rows * v.cols * v.itemsize for role, v in (("a", va), ("b", vb))
                      if role not in self.transposed_operands and launch.tma_legal(v) and staging.off_sector(v)}
        realigned = sm90_rules.sm90_realign_roles(m, self.spec.n, self.config.block_m, self.config.block_n,
                                                  off_sector)
        must = (self._transposes or not all(map(launch.tma_legal, (va, vb) + epi.views()))
                or not launch.tma_store_legal(vd))
        if not must and not realigned:
            return None
        if not runtime.is_capturing(cu_stream):
            return realigned
        roles = tuple(zip((va, vb, vd), ("a", "b", "d")))
        for keep in (realigned, frozenset()):  # buffers sized outside the capture: realigned if they can be
            if all(self._staging.fits(v, role, cu_stream, role in self.transposed_operands, role in keep)
                   for v, role in roles):
                return keep if must or keep else None
        return frozenset() if must and self._sm90_only else None

    def _staged_plan(self, m: int, va: MatrixView, vb: MatrixView, vd: MatrixView, sa, sb,
                     epi: launch.EpilogueOperands, dev: int, cu_stream,
                     realigned: frozenset[str] = frozenset()) -> staging.StagedPlan:
        """The launch on aligned copies of the operands TMA cannot describe (row pitch not a multiple of 16 bytes,
        e.g. K % 16 != 0, or a misaligned base), where _staged_roles says so: they are copied into the Gemm's staging
        buffers (staging.py, 128-byte pitches; no allocation or synchronisation once they are large enough), and D
        goes through one when it is unaligned, copied out after the launch, all on the call's stream. MN-major TF32
        operands are written transposed (K-major) for the nt kernel. The copies are copies.py's kernels."""
        import cupy

        steps, row_copies = [], []
        with cupy.cuda.Device(dev):
            originals = {"a": va, "b": vb, "c": epi.c, "residual": epi.residual}
            staged = {}
            for role, view in originals.items():
                if view is None:
                    continue
                if role in self.transposed_operands:
                    staged[role] = self._staging.aligned(view, role, cu_stream, dev, transposed=True)
                    steps.append(copies.transpose_plan(staged[role], view, self.arch, dev))
                else:
                    row_bytes = view.cols * view.itemsize
                    realign = role in realigned and row_bytes <= copies.MAX_ROW_BYTES  # (never past the copy's rows)
                    if row_bytes > copies.MAX_ROW_BYTES and not staging.in_place(view, role, False, realign):
                        raise ValueError(
                            f"{role} has rows of {row_bytes} bytes whose base (0x{view.ptr:x}) or row pitch "
                            f"({view.row_stride * view.itemsize} bytes) is not a multiple of 16, so the call would "
                            f"copy it into an aligned buffer, and that copy takes rows of at most "
                            f"{copies.MAX_ROW_BYTES} bytes: pass {role} with a 16-byte aligned base and row pitch")
                    staged[role] = self._staging.aligned(view, role, cu_stream, dev, realign=realign)
                    if staged[role] is not view:
                        row_copies.append((staged[role], view))
            if row_copies:  # one launch for all of them (each launch costs ~3 us at tiny sizes)
                steps.append(copies.rows_plan(row_copies, self.arch, dev))
            vd2 = self._staging.aligned(vd, "d", cu_stream, dev, realign="d" in realigned)
            epi2 = dataclasses.replace(epi, **{role: staged[role] for role in ("c", "residual") if role in staged})
            plan = launch.plan(launch.load(self.artifact, self.kernel_spec, dev), self.artifact, self.kernel_spec, m,
                               staged["a"], staged["b"], vd2, dev, sa, sb, epi2,
                               split=self._split_operands(self.artifact, m, dev, cu_stream))
        out = () if vd2 is vd else (copies.rows_plan([(vd, vd2)], self.arch, dev),)
        return staging.StagedPlan(tuple(steps), plan, out, self._staging.launch_lock)

    def explain(self) -> dict:
        from .explain import describe

        return describe(self)


def _common_kind(a, b, out) -> str:
    """The array library of the call: a, b (and out) must all come from the same one."""
    kinds = {"a": array_kind(a), "b": array_kind(b)}
    if out is not None:
        kinds["out"] = array_kind(out)
    if len(set(kinds.values())) > 1:
        listed = ", ".join(f"{arg} is {type(x).__module__}.{type(x).__name__}"
                           for arg, x in zip(kinds, (a, b, out)))
        raise TypeError(f"a, b and out must come from the same array library; {listed}")
    return kinds["a"]


def build(M: int, N: int, K: int, dtype: str = "bf16", out_dtype: str | None = None, layout: str = "nt",
          arch: str | None = None, config: config_mod.KernelConfig | None = None,
          tune: bool | None = None, *, scaling: str | None = None, b_dtype: str | None = None,
          fast_accum: bool = False, epilogue=None, weight_streaming: bool | None = None,
          split_k: int | None = None, promoted: bool = False, deterministic: bool = True) -> Gemm:
    """Compile (or load from the cache) a GEMM for an (N, K) problem and return it.

    M is a tuning hint: the returned ``Gemm`` accepts any M at call time. ``dtype`` is
    ``"fp16"``, ``"bf16"``, ``"tf32"``, ``"fp8"`` (= ``"fp8_e4m3"``), ``"fp8_e5m2"`` or ``"int8"``;
    ``out_dtype`` defaults to the input type (fp32 for tf32, bf16 for fp8 and scaled int8, int32 for
    unscaled int8). 8-bit GEMMs: ``scaling`` is ``"tensor"``, ``"row"`` or ``"block"`` for fp8 (default
    block, DeepGEMM's recipe) and ``"none"`` (default) / ``"tensor"`` / ``"row"`` for int8 (see
    :class:`Gemm` for the scale shapes); ``b_dtype`` mixes E4M3 and E5M2; ``fast_accum=True`` skips the
    FP32 promotion of FP8 partial sums every 128 K (tensor/row only: faster, less accurate for long K).
    ``epilogue`` fuses operations into the store: a :class:`deepgemm_jit.Epilogue` or a string such as
    ``"bias+gelu"`` (see ``deepgemm_jit/epilogue.py``); the call then takes ``bias=``, ``c=``, ``residual=``,
    ``alpha=``/``beta=`` as it needs (Hopper family: layout nt, or any layout for bf16 / fp16).
    ``layout`` is ``"nt"`` (default), ``"nn"``, ``"tn"`` or ``"tt"`` (see
    :class:`Gemm`). ``arch=None`` targets the current GPU; ``arch="sm_90a"`` compiles
    without one (the Gemm can then be cached and explained, and run where a GPU is).
    ``config`` overrides the heuristic's :class:`KernelConfig` (tuning, experiments); it is
    checked against the problem and the arch first (ValueError if it cannot compute it).
    ``weight_streaming`` (default: on unless ``config`` is given) lets calls with M <= 8 run a decode kernel
    instead of ``config``'s: ``deepgemm_jit/gemv.py``'s for nt (not for weights the Hopper tiles stream faster, see
    ``gemv.max_m``), ``deepgemm_jit/gemv_kn.py``'s for nn / tn in TF32; no epilogue, Hopper.
    ``split_k`` (Hopper family): None (default) lets the heuristic compile a split-K kernel for small M and each
    call choose how many CTAs share a tile's K (see ``deepgemm_jit/splitk.py``); an int S > 1 forces S shares on
    every call (at most the number of 128-byte K blocks); 1 never splits. ``deterministic`` (default True): split-K
    shares are summed in a fixed order, the same bits on every run; False lets them add atomically into one sum per
    tile (the last share reads it once instead of every share's partial; FP32 results then vary in their last bits
    from run to run). Kernels without split-K, and the weight-streaming kernel, are deterministic either way.
    ``promoted=True`` (tf32 only) adds each 32-wide K block's partial sums into FP32 registers on the CUDA cores
    instead of accumulating through K in the tensor cores, whose additions truncate: slower, error no longer growing
    with K (``dtype="fp32"``, 3xTF32, uses it).
    Without ``config``, a stored tuning result for this GPU, problem and M bucket is used when there is one;
    ``tune=True`` (default: ``DEEPGEMM_JIT_TUNE``) times candidate configs on the GPU when there is
    none, each on a whole call checked against float64 (``trial.py``), and stores the winner (see ``tuning.py``);
    otherwise the heuristic decides. ``dtype="fp32"`` refuses ``tune=True``.

    Example::

        g = deepgemm_jit.build(4096, 4096, 4096, dtype="bf16")
        d = g(a, b)   # a (M, 4096), b (4096, 4096) as (N, K) -> d (M, 4096)
    """
    m_hint = _check_m(M)
    if dtypes.canonical(dtype, arg="dtype", allowed=dtypes.GEMM_DTYPES) == "fp32":
        _check_fp32_options(scaling=scaling, b_dtype=b_dtype, fast_accum=fast_accum,
                            weight_streaming=weight_streaming, split_k=split_k, promoted=promoted,
                            deterministic=deterministic)
        from .fp32x3 import build_fp32

        return build_fp32(m_hint, N, K, out_dtype=out_dtype, layout=layout, arch=arch, config=config, tune=tune,
                          epilogue=epilogue)
    spec = GemmSpec.create(N, K, dtype=dtype, out_dtype=out_dtype, layout=layout, b_dtype=b_dtype, scaling=scaling,
                           fast_accum=fast_accum, epilogue=epilogue, promoted=promoted)
    return build_spec(spec, m_hint, arch=arch, config=config, tune=tune, weight_streaming=weight_streaming,
                      split_k=split_k, deterministic=deterministic)


def build_spec(spec: GemmSpec, m_hint: int, *, arch: str | None = None, config: config_mod.KernelConfig | None = None,
               tune: bool | None = None, weight_streaming: bool | None = None, split_k: int | None = None,
               deterministic: bool = True) -> Gemm:
    """``build`` for a spec made elsewhere (build_fp32's inner TF32 GEMM, whose spec build's arguments cannot
    spell): the same choice of config, tuning and kernel for `m_hint` (M, checked as build checks it)."""
    m_hint = _check_m(m_hint)
    for arg, value in (("tune", tune), ("weight_streaming", weight_streaming)):
        if value is not None and not isinstance(value, (bool, np.bool_)):  # "no" or 0 would read as a choice
            raise TypeError(f"{arg} must be True, False or None, got {type(value).__name__} {value!r}")
    target = device.target_arch(arch)
    # The spec the kernel is compiled for: `spec`, or its twin where calls transpose MN-major TF32 operands
    # (sm90_rules.kernel_spec: nt, or for tn at small M nn, whose kernel transposes B); a forced portable config keeps
    # the caller's layout.
    kspec = sm90_rules.kernel_spec(spec, target, m_hint)
    if isinstance(config, config_mod.KernelConfig) and config.family != "sm90":
        kspec = spec
    if config is None:
        # DEEPGEMM_JIT_TUNE is a default for builds on the GPU: an offline build (arch=) stays untuned under it
        # (tune=True with arch= is still refused)
        tune_now = (env.tune() and arch is None) if tune is None else tune
        cfg = _tuned_or_heuristic(kspec, m_hint, target, arch is None, tune_now)
    elif isinstance(config, config_mod.KernelConfig):
        cfg = config
        cfg.check_for(kspec, target)
    else:
        raise TypeError(f"config must be a deepgemm_jit.KernelConfig or None, got {type(config).__name__}")
    if weight_streaming is None:
        weight_streaming = config is None
    forced_splits = _check_split_k(split_k)
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic must be True or False, got {type(deterministic).__name__}")
    if forced_splits is not None:
        cfg = _with_split_k(cfg, kspec, target, forced_splits, m_hint, config is None, arch is None)
    # What makes the kernel one that warmup (which plans the heuristic's kernel of a --shape) cannot plan
    forced = [name for name, given in (("config=", config is not None), ("split_k=", forced_splits is not None),
                                       ("promoted=True", spec.promoted and not spec.hi_lo)) if given]
    try:
        # The staging copies every call will run (copies.py; warmup.plan_copies lists the same), loaded here so
        # that an offline build without them fails now, with its warmup line.
        if kspec is not spec:
            copies.get_kernel(copies.CopySpec("transpose", dtypes.get(spec.dtype).storage_bytes), target)
        if cfg.family == "sm90" and (sm90_tiles.sm90_unaligned_rows(kspec) or sm90_tiles.sm90_off_sector_rows(kspec)):
            copies.get_kernel(copies.ROWS, target)
        g = Gemm(spec, target, m_hint, jit.get_kernel(kspec, cfg, target), bool(weight_streaming), forced_splits,
                 bool(deterministic))
        if not forced:  # (as the miss below prints it: the GPU's SM count, no --arch for a tuned config)
            g._warmup_command = lambda: _warmup_line(spec, kspec, m_hint, target, cfg, arch is None)
        return g
    except KernelNotCachedError as exc:
        if forced:
            where = ("on this GPU (an arch= build plans for the arch's usual SM count, which may pick another "
                     "kernel)" if arch is None else f"with arch={arch!r}, also on a machine without a GPU")
            raise exc.with_warmup_command(None, note=(
                f"warmup cannot plan a build with {', '.join(forced)}: pre-generate it by making this build() call "
                f"once without DEEPGEMM_JIT_OFFLINE, {where}")) from None
        raise exc.with_warmup_command(_warmup_line(spec, kspec, m_hint, target, cfg, arch is None)) from None


def _warmup_line(spec: GemmSpec, kspec: GemmSpec, m_hint: int, target: str, cfg: config_mod.KernelConfig,
                 on_gpu: bool) -> str:
    """The warmup line that plans the heuristic's (or the tuning store's) kernel `cfg` of a build of (spec, M):
    chosen for this GPU's SM count when built on it (`on_gpu`), and, for a tuned config (the store's, which only a
    warmup on this GPU plans), with no --arch."""
    from . import tuning
    from .warmup_sources import warmup_command_for

    local_sms = device.num_sms() if on_gpu else None
    tuned = on_gpu and tuning.stored_config(kspec, m_hint, target) == cfg
    return warmup_command_for(spec, m_hint, target, local_sms, this_gpu=tuned)


def _check_fp32_options(scaling=None, b_dtype=None, fast_accum=False, weight_streaming=None, split_k=None,
                        promoted=False, deterministic=True) -> None:
    """dtype='fp32' (build_fp32) has no scales, no second input type, no decode kernel, its own TF32 GEMM's
    accumulation and split-K in split order only: refuse options that would otherwise be ignored."""
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic must be True or False, got {type(deterministic).__name__}")
    given = [name for name, v in (("scaling", scaling not in (None, "none")), ("b_dtype", b_dtype not in (None, "fp32")),
                                  ("fast_accum", bool(fast_accum)), ("weight_streaming", bool(weight_streaming)),
                                  ("split_k", split_k is not None), ("promoted", bool(promoted)),
                                  ("deterministic=False", not bool(deterministic))) if v]
    if given:
        raise ValueError(f"dtype='fp32' (FP32-accurate 3xTF32) takes no {', '.join(given)}")


_MAX_SPLIT_K = 64


def _fits_float32(v) -> bool:
    """Whether the number v converts to float32 without a finite value becoming inf (inf and NaN pass as given)."""
    try:
        x = float(v)
    except OverflowError:  # an int beyond float64
        return False
    # (float32 rounds up to inf from FLT_MAX + half its ulp, 2^128 - 2^103, on; no numpy: this is on the call path)
    return not math.isfinite(x) or abs(x) < 2.0**128 - 2.0**103


def _check_split_k(split_k: object) -> int | None:
    if split_k is None:
        return None
    if isinstance(split_k, bool) or not isinstance(split_k, (int, np.integer)):
        raise TypeError(f"split_k must be an integer or None, got {type(split_k).__name__}")
    if not 1 <= split_k <= _MAX_SPLIT_K:
        raise ValueError(f"split_k must be in [1, {_MAX_SPLIT_K}] (None: chosen per call), got {split_k}")
    return int(split_k)


def _with_split_k(cfg: config_mod.KernelConfig, spec: GemmSpec, arch: str, splits: int, m_hint: int,
                  chosen: bool, on_gpu: bool) -> config_mod.KernelConfig:
    """`cfg` as a plain kernel (splits 1) or a split-K one: the same tile where it can be one (cooperative, one stage
    fewer if the 16 bytes of split flags need it); a heuristic choice (`chosen`) that cannot becomes the cost model's
    best split-K tile."""
    if not splits > 1:
        return dataclasses.replace(cfg, split_k=False) if cfg.split_k else cfg
    if cfg.split_k:
        return cfg
    if cfg.family != "sm90" or spec.grouped:
        raise ValueError(f"split_k > 1 needs the Hopper (sm90) family; this problem runs the {cfg.family} family")
    num_sms = device.num_sms() if on_gpu else sm90_tiles.DEFAULT_SM90_NUM_SMS
    bucket = config_mod.usual_tile_bucket(spec, m_hint)  # (split tiles are unswapped)
    if chosen and (cfg.swap_ab or not sm90_rules.sm90_tile_may_split(spec, bucket, cfg.block_m)):
        return config_mod.sm90_split_config(spec, bucket, num_sms, splits)  # the cost model's split tile instead
    if cfg.swap_ab:
        raise ValueError(f"config {cfg.tag} is a swapped tile (swap_ab), which does not split K: pass split_k=None "
                         "or 1, or a config with swap_ab=False")
    out = dataclasses.replace(cfg, split_k=True, pingpong=False)
    if out.smem_bytes(spec) > sm90_tiles.SM90_SMEM_BUDGET_BYTES and out.num_stages > 2:
        out = dataclasses.replace(out, num_stages=out.num_stages - 1)
    try:
        out.check_for(spec, arch)
    except ValueError as exc:
        if not chosen:
            raise ValueError(f"split_k={splits} with config {cfg.tag}: its split-K form cannot serve this problem "
                             f"({exc}); pass split_k=None or 1, or a config that splits") from None
        out = config_mod.sm90_split_config(spec, bucket, num_sms, splits)
    return out


def _tuned_or_heuristic(spec: GemmSpec, m_hint: int, arch: str, on_gpu: bool, tune: bool
                        ) -> config_mod.KernelConfig:
    if not on_gpu:  # compiling for an arch without its GPU: nothing to look up or time
        if tune:
            raise NoGPUError("tune=True needs the GPU the kernel will run on; drop arch= or tune=")
        return config_mod.choose_config(spec, m_hint, arch)
    from . import tuning

    num_sms = device.num_sms()
    stored = tuning.stored_config(spec, m_hint, arch)
    if stored is not None:
        return stored
    if not tune:
        return config_mod.choose_config(spec, m_hint, arch, num_sms)
    candidates = config_mod.candidate_configs(spec, m_hint, arch, num_sms)
    make = lambda cfg: Gemm(spec, arch, m_hint, jit.get_kernel(spec, cfg, arch))  # noqa: E731
    return tuning.tune(tuning.DeviceIdentity.current(), spec, config_mod.m_bucket_for(spec, m_hint, arch), candidates,
                       make).config


_functional: dict[tuple, Gemm] = {}


def _accepted_dtypes(name: str) -> tuple[np.dtype, ...]:
    """Storage dtypes an operand of type `name` may arrive in: FP8 also as uint8 bit patterns (CuPy has no
    float8 dtype)."""
    own = dtypes.numpy_dtype(name)
    return (own, np.dtype(np.uint8)) if name in dtypes.FP8_DTYPES else (own,)


def _infer_dtype(x) -> str:
    dt = getattr(x, "dtype", None)
    if dt is not None and not isinstance(dt, np.dtype):  # torch dtypes
        from .arrays import numpy_dtype_of_torch

        dt = numpy_dtype_of_torch(dt)
    name = dtypes.storage_name_of(dt if dt is not None else np.dtype("V1"))
    if name in ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8"):
        return name
    if name == "fp32":  # FP32-accurate (3xTF32); dtype='tf32' is the faster, TF32-accurate product
        return "fp32"
    raise TypeError(f"a has dtype {getattr(x, 'dtype', None)}; pass float16, bfloat16, float8 or int8 arrays, "
                    "or dtype= (uint8 arrays of FP8 bits need dtype='fp8_e4m3' or 'fp8_e5m2')")


def gemm(a, b, *, dtype: str | None = None, out_dtype: str | None = None, layout: str = "nt",
         out=None, stream=None, scale_a=None, scale_b=None, scaling: str | None = None,
         b_dtype: str | None = None, fast_accum: bool = False, epilogue=None, bias=None, c=None, residual=None,
         alpha=1.0, beta=1.0, quant_scale=None, amax_out=None, scales_out=None):
    """Functional form: builds (once per problem, memoized) and calls a :class:`Gemm`.

    ``dtype`` defaults from a (float16 -> fp16, bfloat16 -> bf16, torch float8 -> fp8, int8 -> int8);
    8-bit arguments as in :func:`build`. Every caller of one problem (device, types, N, K, M bucket) shares that
    Gemm; it keeps its split-K workspace and staging buffers per stream, so calls on two streams may overlap
    (stream_buffers.py). Example::

        d = deepgemm_jit.gemm(a, b)            # a (M, K), b (N, K) -> (M, N)
        d = deepgemm_jit.gemm(qa, qb, scale_a=sa, scale_b=sb, scaling="block")
    """
    if not isinstance(layout, str) or layout.lower() not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not supported; choose one of {', '.join(LAYOUTS)}")
    layout = layout.lower()
    name = dtypes.canonical(dtype, arg="dtype", allowed=dtypes.GEMM_DTYPES) if dtype else _infer_dtype(a)
    a_shape, b_shape = getattr(a, "shape", None), getattr(b, "shape", None)
    if a_shape is None or len(a_shape) != 2:
        raise ValueError(f"a must be 2-D, got shape {a_shape}")
    if b_shape is None or len(b_shape) != 2:
        raise ValueError(f"b must be 2-D, got shape {b_shape}")
    m, k = (a_shape[0], a_shape[1]) if layout[0] == "n" else (a_shape[1], a_shape[0])
    n = b_shape[0] if layout[1] == "t" else b_shape[1]
    arch = device.current_arch()
    if name == "fp32":
        from .fp32x3 import Fp32Spec

        _check_fp32_options(scaling=scaling, b_dtype=b_dtype, fast_accum=fast_accum)
        spec = Fp32Spec.create(n, k, out_dtype=out_dtype, layout=layout, epilogue=epilogue)
    else:
        spec = GemmSpec.create(n, k, dtype=name, out_dtype=out_dtype, layout=layout, b_dtype=b_dtype,
                               scaling=scaling, fast_accum=fast_accum, epilogue=epilogue)
    # (finer where swapped tiles are weighed: config.m_bucket_for)
    bucket = config_mod.m_bucket_for(spec, m, arch) if isinstance(spec, GemmSpec) else buckets.m_bucket(m)
    key = (spec, arch, device.current_device_id(), bucket)  # built for this GPU (SM count, tuning): one per device
    g = _functional.get(key)
    if g is None:  # built for the bucket's representative M, which serves every M of the bucket
        # arch=None: the build for this GPU (its SM count, stored tuning, DEEPGEMM_JIT_TUNE); an explicit arch means
        # an offline build.
        g = build(bucket, n, k, dtype=spec.dtype, out_dtype=spec.out_dtype, layout=layout, arch=None,
                  scaling=spec.scaling, b_dtype=spec.b_dtype, fast_accum=spec.fast_accum, epilogue=spec.epilogue)
        _functional[key] = g
    return g(a, b, out=out, stream=stream, scale_a=scale_a, scale_b=scale_b, bias=bias, c=c, residual=residual,
             alpha=alpha, beta=beta, quant_scale=quant_scale, amax_out=amax_out, scales_out=scales_out)
