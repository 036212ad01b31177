"""Correctness helpers on the GPU (DESIGN.md, "Measuring"): random operands, poisoned outputs, float64 references,
errors and their bounds.

Everything here works on CuPy arrays and converts 16-bit formats with integer bit operations, so it does not
depend on CuPy's bfloat16 arithmetic support. Nothing runs at import.
"""
from __future__ import annotations

import math

import numpy as np

from . import dtypes, env
from .spec import GemmSpec

# Bounds of DESIGN.md ("Measuring") on the error metric vs float64, per input dtype (fp32 = the 3xTF32 mode).
# FP8 and INT8 are judged against the float64 product of the *dequantized* operands (q * scale), so the bound
# covers FP32 accumulation and the output rounding, not the quantization itself; INT8 with INT32 output is exact.
ERROR_BOUND = {"fp16": 1e-2, "bf16": 1e-2, "tf32": 5e-3, "fp32": 1e-5, "fp8_e4m3": 3e-2, "fp8_e5m2": 3e-2,
               "int8": 1e-2}
# "rel_fro": ||out - ref||_F / ||ref||_F; "cos": DeepGEMM's 1 - 2<x,y>/(|x|^2+|y|^2), used for FP8 against a
# BF16-input reference in addition to rel_fro against the dequantized one.
ERROR_METRIC = {"fp16": "rel_fro", "bf16": "rel_fro", "tf32": "rel_fro", "fp32": "rel_fro", "fp8_e4m3": "rel_fro",
                "fp8_e5m2": "rel_fro", "int8": "rel_fro"}
# DeepGEMM's acceptance threshold on the "cos" difference of an FP8 GEMM against a BF16-input reference.
FP8_COS_BOUND = 1e-3

# cuBLAS DGEMM on an H200 runs at ~50-60 TFLOPS: 1.2e13 FLOP is ~0.2 s, which covers 8192^3 and every DeepSeek
# shape. Larger products are checked against an IEEE FP32 (not TF32) SGEMM on exactly upcast inputs.
REF_FP64_MAX_FLOPS = 1.2e13

POISON_BYTE = 0xFF  # 0xFF.. is a NaN in bf16, fp16, fp32, fp64 and both FP8 formats


def _to_storage(x32, name: str):
    """float32 CuPy array -> storage dtype `name` (round to nearest even)."""
    import cupy

    if name in ("fp32", "tf32"):
        return x32.astype(cupy.float32)
    if name == "fp16":
        return x32.astype(cupy.float16)
    bits = x32.astype(cupy.float32).view(cupy.uint32)
    rounded = (bits + cupy.uint32(0x7FFF) + ((bits >> 16) & cupy.uint32(1))) >> 16
    return rounded.astype(cupy.uint16).view(dtypes.numpy_dtype("bf16"))


def to_float64(x):
    """Any supported storage dtype (CuPy) -> float64 CuPy array, exactly."""
    import cupy

    if x.dtype.name == "bfloat16":
        return (x.view(cupy.uint16).astype(cupy.uint32) << 16).view(cupy.float32).astype(cupy.float64)
    return x.astype(cupy.float64)


def random_matrix(shape, name: str, rng=None, scale: float = 1.0):
    """Fresh random N(0, scale^2) values in storage dtype `name` (never zeros)."""
    import cupy

    rng = rng or cupy.random.default_rng()
    x = rng.standard_normal(shape, dtype=cupy.float32) * np.float32(scale)
    return _to_storage(x, name)


def poisoned(shape, name: str):
    """A contiguous output buffer of storage dtype `name` (FP8: uint8 bits, as the library allocates them) filled
    with NaN, so that unwritten elements fail checks."""
    import cupy

    from .arrays import new_array

    return poison(new_array("cupy", tuple(shape), name, cupy.cuda.Device().id))


def m_major_scales(scales, fill: float = float("nan")):
    """A copy of (M, KB) float32 scales (CuPy) in DeepGEMM's M-major layout: storage (KB, round_up(M, 4)) seen as its
    transpose cut to M rows, the padding rows set to `fill` (NaN: a kernel that reads them shows it)."""
    import cupy

    m, kb = scales.shape
    storage = cupy.full((kb, -(-m // 4) * 4), fill, dtype=cupy.float32)
    storage[:, :m] = scales.T
    return storage[:, :m].T


def poison(x, stream=None):
    """Fill the contiguous CuPy array `x` with NaN bytes again, on `stream` (default: the current stream), e.g.
    between replays of a captured CUDA graph; returns x."""
    import cupy

    stream = cupy.cuda.get_current_stream() if stream is None else stream
    cupy.cuda.runtime.memsetAsync(x.data.ptr, POISON_BYTE, x.nbytes, stream.ptr)
    return x


def random_operands(spec: GemmSpec, m: int, rng=None):
    """(a, b) in the spec's layout and dtype, with fresh random values.

    >>> a, b = random_operands(g.spec, 4096, rng=cupy.random.default_rng(0))
    """
    return (random_matrix(spec.a_shape(m), spec.dtype, rng),
            random_matrix(spec.b_shape(), spec.dtype, rng))


def reference_kind(spec: GemmSpec, m: int) -> str:
    """How `reference` computes this product: "fp64" (DGEMM) or, above REF_FP64_MAX_FLOPS, "fp32-sgemm"."""
    return "fp64" if 2 * m * spec.n * spec.k <= REF_FP64_MAX_FLOPS else "fp32-sgemm"


def reference(spec: GemmSpec, a, b):
    """D = op(A) op(B) as a float64 (M, N) CuPy array, from exactly upcast inputs on the GPU.

    cuBLAS DGEMM up to REF_FP64_MAX_FLOPS, an IEEE FP32 SGEMM above (see `reference_kind`).
    """
    import cupy

    m = a.shape[0] if spec.a_k_major else a.shape[1]
    a_ref, b_ref = to_float64(a), to_float64(b)
    if reference_kind(spec, m) == "fp32-sgemm":
        if env.cupy_tf32():
            raise RuntimeError("CUPY_TF32=1 would make the fp32 reference a tf32 one; unset it")
        a_ref, b_ref = a_ref.astype(cupy.float32), b_ref.astype(cupy.float32)
    a_mk = a_ref if spec.a_k_major else a_ref.T
    b_kn = b_ref.T if spec.b_k_major else b_ref
    return cupy.matmul(a_mk, b_kn).astype(cupy.float64, copy=False)


def num_nonfinite(x) -> int:
    """How many elements of `x` are NaN or Inf (unwritten under poisoning, or overflow)."""
    import cupy

    return int(cupy.count_nonzero(~cupy.isfinite(to_float64(x))))


def error(out, ref, metric: str = "rel_fro") -> float:
    """The error of `out` against the float64 `ref` by `metric` (see ERROR_METRIC); NaN if out is not finite.

    NaN never passes `within_bound`; a shape mismatch raises ValueError.
    """
    import cupy

    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    o = to_float64(out)
    if not bool(cupy.isfinite(o).all()):
        return math.nan
    if metric == "rel_fro":
        denom = float(cupy.linalg.norm(ref))
        num = float(cupy.linalg.norm(o - ref))
        if denom == 0.0:
            return 0.0 if num == 0.0 else math.inf
        return num / denom
    if metric == "cos":
        x, y = o.ravel(), ref.ravel()
        denom = float(cupy.dot(x, x) + cupy.dot(y, y))
        return 0.0 if denom == 0.0 else 1.0 - 2.0 * float(cupy.dot(x, y)) / denom
    raise ValueError(f"unknown error metric {metric!r}; choose 'rel_fro' or 'cos'")


def relative_error(out, ref) -> float:
    """||out - ref||_F / ||ref||_F in float64; NaN if out has any NaN/Inf."""
    return error(out, ref, "rel_fro")


def within_bound(err: float, dtype: str) -> bool:
    """Whether an error passes the DESIGN.md bound of input dtype `dtype` (NaN never does)."""
    return not math.isnan(err) and err <= ERROR_BOUND[dtype]


# -------------------------------------------------------------------------------------------------------------------
# Quantization references (FP8 / INT8): the float64 ground truth of deepgemm_jit.quantize / dequantize
# -------------------------------------------------------------------------------------------------------------------
# They follow the contract in deepgemm_jit/quantization.py exactly, including its float32 division: q is the IEEE
# float32 quotient x / s rounded to the 8-bit format, as the kernels compute it. The math
# is written once against an array module: CuPy arrays in, CuPy arrays out (on the GPU); NumPy arrays in, NumPy out
# (CPU tests, small examples). x may be float32, float16 or bfloat16 (ml_dtypes); q is given and returned as
# quantize returns it for CuPy: uint8 FP8 bit patterns, or int8.

QUANT_GROUP = 128  # group128 groups are 1 x 128 along K, block128 blocks 128 x 128

# Per FP8 format: the ml_dtypes type, mantissa bits, the exponent of the smallest normal, and how many codes from 0x00
# upward are finite non-negative values (in increasing order: E4M3 "fn" ends at 0x7E = 448, E5M2 at 0x7B = 57344).
_FP8_FORMATS = {"fp8_e4m3": ("float8_e4m3fn", 3, -6, 0x7F), "fp8_e5m2": ("float8_e5m2", 2, -14, 0x7C)}
_FP8_NAN_BITS = 0x7F  # what cvt.rn.satfinite makes of a NaN, in both formats
_fp8_tables: dict[str, np.ndarray] = {}


def _array_module(x):
    """NumPy for NumPy arrays, else CuPy."""
    if isinstance(x, np.ndarray):
        return np
    import cupy

    return cupy


def _fp8_table(fmt: str) -> np.ndarray:
    """float64 value of each of the 256 bit patterns of `fmt` (host array, built once with ml_dtypes)."""
    table = _fp8_tables.get(fmt)
    if table is None:
        import ml_dtypes

        codes = np.arange(256, dtype=np.uint8)
        table = _fp8_tables[fmt] = codes.view(getattr(ml_dtypes, _FP8_FORMATS[fmt][0])).astype(np.float64)
    return table


def decode_fp8(bits, fmt: str):
    """FP8 bit patterns (uint8 CuPy or NumPy array, any shape) -> their exact float64 values, same array module.

    >>> decode_fp8(np.array([0x7E, 0x38, 0x81], np.uint8), "fp8_e4m3")   # -> [448., 1., -0.001953125]
    """
    fmt = dtypes.canonical(fmt, arg="fmt", allowed=dtypes.FP8_DTYPES)
    if bits.dtype != np.uint8:
        raise TypeError(f"bits has dtype {bits.dtype}; pass the FP8 bit patterns as uint8")
    xp = _array_module(bits)
    return xp.asarray(_fp8_table(fmt))[bits.astype(xp.intp)]


def _quant_args(dtype: str, granularity: str) -> tuple[str, str]:
    from .quantization import QUANT_DTYPES, check_granularity  # the contract's names, in one place

    name = dtypes.canonical(dtype, arg="dtype", allowed=QUANT_DTYPES)
    return name, check_granularity(granularity, name)


def _exact_float64(x):
    """Any supported storage dtype (CuPy or NumPy, bf16 included) -> float64, exactly."""
    return x.astype(np.float64) if isinstance(x, np.ndarray) else to_float64(x)


def _group_amax(xp, mag, granularity: str):
    """max(|x|) per group of an (M, K) array of magnitudes, in the scale layout of `granularity`. Padding with
    zeros does not change a maximum of magnitudes; a NaN propagates into its group."""
    m, k = mag.shape
    if granularity == "tensor":
        return xp.max(mag).reshape(1)
    if granularity == "row":
        return xp.max(mag, axis=1)
    num_groups = -(-k // QUANT_GROUP)
    rows = m if granularity == "group128" else -(-m // QUANT_GROUP) * QUANT_GROUP
    padded = xp.zeros((rows, num_groups * QUANT_GROUP), dtype=xp.float64)
    padded[:m, :k] = mag
    if granularity == "group128":
        return xp.max(padded.reshape(m, num_groups, QUANT_GROUP), axis=2)
    return xp.max(padded.reshape(rows // QUANT_GROUP, QUANT_GROUP, num_groups, QUANT_GROUP), axis=(1, 3))


def _expand_scales(xp, scales64, granularity: str, m: int, k: int):
    """The (M, K) array holding, at each element, the scale of its group."""
    if granularity == "tensor":
        return xp.broadcast_to(scales64.reshape(1, 1), (m, k))
    if granularity == "row":
        return xp.broadcast_to(scales64.reshape(m, 1), (m, k))
    wide = xp.repeat(scales64, QUANT_GROUP, axis=1)[:, :k]
    if granularity == "group128":
        return wide
    return xp.repeat(wide, QUANT_GROUP, axis=0)[:m]


def _round_fp8(xp, v, fmt: str):
    """float64 -> FP8 bit patterns (uint8): round to nearest even, saturate to the finite range, NaN -> 0x7F."""
    _, mantissa_bits, min_exp, num_finite = _FP8_FORMATS[fmt]
    limit = dtypes.QUANT_MAX[fmt]
    # Saturation first: past the largest finite value, rounding could only reach it or overflow to it.
    c = xp.clip(v, -limit, limit)
    mag = xp.abs(c)
    # mag = f * 2**e with f in [0.5, 1): values of the binade [2**(e-1), 2**e) are multiples of 2**(e-1-mantissa_bits);
    # below the smallest normal the spacing stays that of the subnormals. Division by a power of two and rint are exact.
    _, e = xp.frexp(mag)
    quantum = xp.ldexp(xp.ones_like(mag), xp.maximum(e - 1, min_exp) - mantissa_bits)
    rounded = xp.rint(mag / quantum) * quantum
    # Non-negative finite codes increase with their value, so a value's code is its rank in the table.
    finite = xp.asarray(_fp8_table(fmt)[:num_finite])
    bits = (xp.searchsorted(finite, rounded) | (xp.signbit(c).astype(xp.int64) << 7)).astype(xp.uint8)
    return xp.where(xp.isnan(v), xp.uint8(_FP8_NAN_BITS), bits)


def _round_int8(xp, v):
    """float64 -> int8: round half to even, saturate to [-127, 127], NaN -> 0 (as cvt.rni.s32.f32)."""
    limit = dtypes.QUANT_MAX["int8"]
    return xp.clip(xp.rint(xp.where(xp.isnan(v), 0.0, v)), -limit, limit).astype(xp.int8)


def quantize_reference(x, dtype: str = "fp8", granularity: str = "group128"):
    """(q, scales) of a 2-D (M, K) CuPy or NumPy array, by the contract of deepgemm_jit.quantize, in float64.

    scales: float32, the scale layout of `granularity` and the memory layout quantize returns (group128 M-major:
    a transposed view of (ceil(K/128), round_up(M, 4)) storage whose padding rows hold 1.0; the others
    contiguous): s = amax / QUANT_MAX as one IEEE float32 division (the float64 quotient rounded once to float32
    is exactly that), s = 1 where it is 0. q: round(x / s) of the IEEE float32 quotient (what the JIT kernels
    compute), as uint8 FP8 bit patterns or int8.

    >>> q, s = quantize_reference(np.random.randn(3, 200).astype(np.float32), "fp8", "group128")  # s: (3, 2)
    """
    name, gran = _quant_args(dtype, granularity)
    if len(x.shape) != 2:
        raise ValueError(f"x must be 2-D, got shape {tuple(x.shape)}")
    xp = _array_module(x)
    x64 = _exact_float64(x)
    m, k = x64.shape
    with np.errstate(invalid="ignore", divide="ignore"):  # NaN inputs make NaN scales, as on the GPU
        scales = (_group_amax(xp, xp.abs(x64), gran) / dtypes.QUANT_MAX[name]).astype(xp.float32)
        scales = xp.where(scales == 0, xp.float32(1.0), scales)
        # The quantizer's semantics: one IEEE float32 division x / s (exact inputs: every supported input type
        # is a subset of float32), then round to nearest even into the 8-bit format. Rounding the exact
        # quotient instead differs by one FP8 ulp on ~5% of BF16 inputs (a float32 quotient can land on an
        # FP8 tie that the exact one misses), which the H200 run showed.
        v = (x64.astype(xp.float32) / _expand_scales(xp, scales, gran, m, k).astype(xp.float32)).astype(xp.float64)
        q = _round_int8(xp, v) if name == "int8" else _round_fp8(xp, v, name)
    if gran == "group128":  # the layout quantize returns (and FP8 block GEMMs read fastest)
        from .arrays import mn_major_storage_shape, mn_major_view

        m_major = mn_major_view(xp.ones(mn_major_storage_shape(m, scales.shape[1]), dtype=xp.float32), m)
        m_major[...] = scales
        scales = m_major
    return q, scales


def dequantize_reference(q, scales, dtype: str = "fp8", granularity: str = "group128", k: int | None = None):
    """float(q) * s exactly, as a float64 (M, k) array of q's array module (CuPy or NumPy).

    q: uint8 FP8 bit patterns or int8, (M, K'); `k` (default K') takes only the first k columns, for q stored with
    padded rows; scales: float32 of the shape of `granularity` for (M, k), any strides (row-major or M-major).
    """
    name, gran = _quant_args(dtype, granularity)
    if len(q.shape) != 2:
        raise ValueError(f"q must be 2-D, got shape {tuple(q.shape)}")
    if k is not None:
        if not 1 <= k <= q.shape[1]:
            raise ValueError(f"k={k} must be in [1, {q.shape[1]}] (the columns of q)")
        q = q[:, :k]
    xp = _array_module(q)
    m, k = q.shape
    from .quantization import scale_shape

    if tuple(scales.shape) != scale_shape(gran, m, k):
        raise ValueError(f"scales has shape {tuple(scales.shape)}, expected {scale_shape(gran, m, k)}")
    if name == "int8":
        if q.dtype != np.int8:
            raise TypeError(f"q has dtype {q.dtype}; int8 values are int8")
        values = q.astype(xp.float64)
    else:
        values = decode_fp8(q, name)
    return values * _expand_scales(xp, xp.asarray(scales).astype(xp.float64), gran, m, k)


# What quant_ulp_distance reports where exactly one side (or two different codes) is NaN / Inf: no number of steps.
NON_FINITE_DISTANCE = 1 << 20


def quant_ulp_distance(a, b, dtype: str = "fp8"):
    """Per element, how many representable steps apart two quantized arrays are (int64; +0 and -0 are 0 apart).

    FP8 bit patterns: the distance of sign-magnitude codes (adjacent codes are adjacent finite values); a NaN / Inf
    code against any other code is NON_FINITE_DISTANCE apart (0x7F, an E4M3 NaN, is not one step from 0x7E = 448:
    DESIGN.md, NaN never passes), the same code 0 apart (a NaN input's NaN). INT8: |a - b|.
    """
    name = dtypes.canonical(dtype, arg="dtype", allowed=("fp8_e4m3", "fp8_e5m2", "int8"))
    xp = _array_module(a)
    if name == "int8":
        return xp.abs(a.astype(xp.int64) - b.astype(xp.int64))
    num_finite = _FP8_FORMATS[name][3]

    def signed(bits):
        mag = (bits & 0x7F).astype(xp.int64)
        return xp.where(bits >= 0x80, -mag, mag)

    non_finite = ((a & 0x7F) >= num_finite) | ((b & 0x7F) >= num_finite)
    return xp.where(non_finite & (a != b), NON_FINITE_DISTANCE, xp.abs(signed(a) - signed(b)))


# -------------------------------------------------------------------------------------------------------------------
# Fused epilogues: the unfused float64 reference of D = act(alpha * acc + beta * C + bias) + residual
# (deepgemm_jit/epilogue.py), step by step on whatever array module holds `acc` (CuPy on the GPU, NumPy on the CPU).
# -------------------------------------------------------------------------------------------------------------------

def _epilogue_array_module(x):
    """(xp, erf) of the module that holds `x`: CuPy (cupyx erf) or NumPy (math.erf, vectorized: no SciPy)."""
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy
        from cupyx.scipy import special

        return cupy, special.erf
    import numpy

    return numpy, numpy.vectorize(math.erf, otypes=[numpy.float64])


def activation_reference(name: str, v):
    """float64 `v` through activation `name` (one of ``deepgemm_jit.epilogue.ACTIVATIONS``); gelu is the erf form."""
    xp, erf = _epilogue_array_module(v)
    if name == "none":
        return v
    if name == "relu":
        return xp.maximum(v, 0.0)
    if name == "gelu":
        return 0.5 * v * (1.0 + erf(v / math.sqrt(2.0)))
    if name == "gelu_tanh":
        return 0.5 * v * (1.0 + xp.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))
    if name == "silu":
        return v / (1.0 + xp.exp(-v))
    if name == "sigmoid":
        return 1.0 / (1.0 + xp.exp(-v))
    raise ValueError(f"activation {name!r} unknown")


def unfused_epilogue(acc, epi, bias=None, c=None, residual=None, alpha: float = 1.0, beta: float = 1.0):
    """act(alpha * acc + beta * C + bias) + residual in float64, from the float64 (M, N) product `acc`; `epi` is an
    Epilogue or its string. Gated units (swiglu / geglu): `acc` is the product with the interleaved weight (see
    ``deepgemm_jit.interleave_gate_up``), the result act(gate + bias_gate) * (up + bias_up) + residual is
    (M, N/2). Quantize-on-store is not applied here: this is the float64 value the kernel quantizes (see
    :func:`quantized_epilogue_reference`).

    bias is (N,) for ``bias`` / (M,) for ``bias_row``; c and residual are (M, N) (residual (M, N/2) when gated);
    any storage dtype (upcast exactly). alpha and beta apply only with the ``beta`` word (as the kernel's call
    requires); beta = 0 does not read C (BLAS: a NaN in C does not reach D), as the kernels do.

    >>> ref = unfused_epilogue(reference(g.spec, a, b), g.spec.epi, bias=bias, residual=res)
    """
    from .epilogue import Epilogue, deinterleave_gate_up

    epi = Epilogue.parse(epi) if isinstance(epi, str) else epi
    v = acc
    if epi.beta:
        v = alpha * v + (beta * _exact_float64(c) if beta != 0 else 0.0)
    if epi.bias == "col":
        v = v + _exact_float64(bias)[None, :]
    elif epi.bias == "row":
        v = v + _exact_float64(bias)[:, None]
    if epi.is_gated:
        gate, up = deinterleave_gate_up(v.T)
        v = activation_reference("silu" if epi.gate == "swiglu" else "gelu", gate.T) * up.T
    else:
        v = activation_reference(epi.activation, v)
    if epi.residual:
        v = v + _exact_float64(residual)
    return v


def quantized_epilogue_reference(value, epi, quant_scale=None):
    """What a quantize-on-store epilogue stores, from the float64 unfused result `value` (M, N_out)
    (:func:`unfused_epilogue`) rounded to float32, as the kernel quantizes its float32 values:

    - ``quant_fp8_g128``: (q, scales) = quantize_reference(value32, "fp8", "group128");
    - ``quant_fp8_tensor`` / ``quant_int8_tensor``: (q, amax) with q = round(value32 / s) (one float32 division,
      saturating) for the static scale `quant_scale` (a number or a 1-element array) and amax = max |value32|.

    q is uint8 FP8 bits or int8 of value's array module; compare with :func:`quant_ulp_distance`.
    """
    from .epilogue import Epilogue

    epi = Epilogue.parse(epi) if isinstance(epi, str) else epi
    xp = _array_module(value)
    v32 = value.astype(xp.float32)
    if epi.has_group_scales:
        return quantize_reference(v32, "fp8", "group128")
    if not epi.has_static_scale:
        raise ValueError(f"epilogue {epi.text!r} has no quantize-on-store")
    s32 = xp.asarray(quant_scale, dtype=xp.float32).reshape(())
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        quotient = (v32 / s32).astype(xp.float64)
    q = _round_int8(xp, quotient) if epi.quant == "int8_tensor" else _round_fp8(xp, quotient, "fp8_e4m3")
    return q, xp.max(xp.abs(v32))
