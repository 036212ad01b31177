"""Quantization on the CPU: argument validation, rendering, real NVRTC compiles of every kernel variant to sm_90a
with SASS checks, and the float64 references (on NumPy arrays) against ml_dtypes and hand-worked cases.

The GPU side (kernels against these references) is tests/test_quantize_gpu.py.
"""
import argparse
import contextlib
import itertools

import jinja2
import ml_dtypes
import numpy as np
import pytest

from deepgemm_jit import cache, device, dtypes, reference, render, sass, warmup
from deepgemm_jit import quantization as quant
from deepgemm_jit.errors import KernelNotCachedError, NoGPUError
from deepgemm_jit.spec import GemmSpec
from fakes import BASE, FakeDeviceArray

ARCH = "sm_90a"
SRC = ("fp32", "fp16", "bf16")
Q_GRAN = [(q, g) for q in quant.QUANT_DTYPES for g in quant.GRANULARITIES
          if q != "int8" or g in quant.INT8_GRANULARITIES]


def full_vec(src):
    return 16 // dtypes.get(src).storage_bytes


def vecs(src):
    v = full_vec(src)
    return [1 << i for i in range(v.bit_length())]  # 1, 2, 4 (, 8)


# -- specs and validation ----------------------------------------------------------------------------------

def test_spec_validation_and_tags():
    spec = quant.QuantKernelSpec("quantize", "bf16", "fp8_e4m3", "group128", 8)
    assert spec.tag == "quant_quantize_bf16_fp8_e4m3_group128_v8" and spec.entry == "dgjit_quantize"
    assert quant.QuantKernelSpec("amax", "fp32", vec=4).tag == "quant_amax_fp32_v4"
    assert quant.QuantKernelSpec("dequantize", "fp16", "int8").tag == "quant_dequantize_fp16_int8"
    bad = [dict(op="cast", src_dtype="bf16", q_dtype="int8"),
           dict(op="quantize", src_dtype="tf32", q_dtype="int8", granularity="row"),
           dict(op="quantize", src_dtype="bf16", q_dtype="int8", granularity="group128"),
           dict(op="quantize", src_dtype="bf16", q_dtype="fp8", granularity="row"),  # canonical names only
           dict(op="quantize", src_dtype="fp32", q_dtype="int8", granularity="row", vec=8),  # > 16 bytes
           dict(op="quantize", src_dtype="bf16", q_dtype="int8", granularity="row", vec=3),
           dict(op="amax", src_dtype="bf16", q_dtype="int8"),
           dict(op="dequantize", src_dtype="bf16", q_dtype="int8", granularity="row"),
           dict(op="dequantize", src_dtype="bf16", q_dtype="int8", vec=2)]
    for kwargs in bad:
        with pytest.raises(ValueError):
            quant.QuantKernelSpec(**kwargs)


def test_scale_shapes():
    assert quant.scale_shape("tensor", 5, 7) == (1,)
    assert quant.scale_shape("row", 5, 7) == (5,)
    assert quant.scale_shape("group128", 5, 7) == (5, 1)
    assert quant.scale_shape("group128", 3, 128) == (3, 1) and quant.scale_shape("group128", 3, 129) == (3, 2)
    assert quant.scale_shape("block128", 129, 7168) == (2, 56) and quant.scale_shape("block128", 128, 1) == (1, 1)


F32 = np.float32


@pytest.mark.parametrize("x,kwargs,exc,words", [
    (np.zeros((4, 8), F32), {}, TypeError, "x is a NumPy"),
    ([[1.0]], {}, TypeError, "x must be a GPU array"),
    (FakeDeviceArray((4, 8), np.int32), {}, TypeError, "x has dtype int32"),
    (FakeDeviceArray((4, 8), np.float64), {}, TypeError, "x has dtype float64"),
    (FakeDeviceArray((4, 8, 2), F32), {}, ValueError, "x must be 2-D"),
    (FakeDeviceArray((4, 8), F32, strides=(16, 2)), {}, ValueError, "x must have unit stride"),
    (FakeDeviceArray((4, 8), F32, ptr=BASE + 2), {}, ValueError, "x data pointer"),
    (FakeDeviceArray((4, 0), F32), {}, ValueError, "K >= 1"),
    (FakeDeviceArray((4, 8), F32), {"dtype": "fp16"}, ValueError, "dtype='fp16' is not supported"),
    (FakeDeviceArray((4, 8), F32), {"dtype": 8}, TypeError, "dtype must be a string"),
    (FakeDeviceArray((4, 8), F32), {"granularity": "group64"}, ValueError, "granularity='group64'"),
    (FakeDeviceArray((4, 8), F32), {"granularity": None}, TypeError, "granularity must be a string"),
    (FakeDeviceArray((4, 8), F32), {"dtype": "int8", "granularity": "group128"}, ValueError,
     "not supported for int8; choose 'tensor' or 'row'"),
    (FakeDeviceArray((4, 8), F32), {"dtype": "s8", "granularity": "block128"}, ValueError, "for int8"),
])
def test_quantize_argument_errors(fake_gpu_memory, x, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        quant.quantize(x, **kwargs)


def test_dtype_and_granularity_are_checked_before_x():
    # No array is even looked at: the strings are wrong first.
    with pytest.raises(ValueError, match="dtype="):
        quant.quantize(object(), dtype="fp4")
    with pytest.raises(ValueError, match="granularity="):
        quant.dequantize(object(), object(), granularity="column")
    with pytest.raises(ValueError, match="out_dtype="):
        quant.dequantize(object(), object(), out_dtype="int8")


def test_valid_call_without_gpu_is_a_clear_error(fake_gpu_memory):
    if device.gpu_count():
        pytest.skip("a GPU is present")
    for dt, gran in Q_GRAN:
        with pytest.raises(NoGPUError, match="GPU"):
            quant.quantize(FakeDeviceArray((4, 8), np.float16), dt, gran)


def test_dequantize_argument_errors():
    with pytest.raises(TypeError, match="q is a NumPy"):
        quant.dequantize(np.zeros((2, 2), np.uint8), np.ones(1, F32), granularity="tensor")
    with pytest.raises(TypeError, match="CuPy array or a torch CUDA tensor"):
        quant.dequantize(FakeDeviceArray((2, 2), np.uint8), FakeDeviceArray((1,), F32), granularity="tensor")


@pytest.mark.torch
def test_dequantize_argument_errors_torch():
    """torch CPU tensors reach every check that precedes the GPU ones (dtype, shapes, scales layout)."""
    torch = pytest.importorskip("torch")
    q8 = torch.zeros((5, 300), dtype=torch.float8_e4m3fn)
    s = torch.ones((5, 3), dtype=torch.float32)
    cases = [
        (lambda: quant.dequantize(q8, s, "fp8_e5m2"), TypeError, "q has dtype torch.float8_e4m3fn"),
        (lambda: quant.dequantize(q8.view(torch.int8), s, "fp8"), TypeError, "q has dtype torch.int8"),
        (lambda: quant.dequantize(torch.zeros(5, 300, dtype=torch.uint8), s, "int8", "row"), TypeError,
         "takes q of dtype int8"),
        (lambda: quant.dequantize(q8.reshape(5, 300, 1), s), ValueError, "q must be 2-D"),
        (lambda: quant.dequantize(q8, s.double()), TypeError, "scales has dtype"),
        (lambda: quant.dequantize(q8, s[:, :2]), ValueError, r"expected \(5, 3\)"),
        (lambda: quant.dequantize(q8, torch.ones(3, 8).t()[:5]), TypeError, "torch tensor on cpu"),  # M-major: fine
        (lambda: quant.dequantize(q8, s, granularity="block128"), ValueError, r"expected \(1, 3\)"),
        (lambda: quant.dequantize(q8, np.ones((5, 3), F32)), TypeError, "scales must be a torch tensor"),
        (lambda: quant.dequantize(q8, s, out=torch.empty(5, 300)[:, :299]), ValueError, r"out has shape"),
        (lambda: quant.dequantize(q8, s, out_dtype="bf16", out=torch.empty(5, 300)), TypeError,
         "out has dtype torch.float32; out_dtype='bf16' writes torch.bfloat16"),
        (lambda: quant.dequantize(q8, s, out=torch.empty(300, 5).T), ValueError, "out must be contiguous"),
        (lambda: quant.dequantize(q8, s), TypeError, "torch tensor on cpu"),  # all fine but for the device
    ]
    for call, exc, words in cases:
        with pytest.raises(exc, match=words):
            call()


@pytest.mark.torch
def test_quantize_torch_cpu_tensor_is_refused():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="x is a torch tensor on cpu"):
        quant.quantize(torch.randn(4, 8))


# -- rendering ---------------------------------------------------------------------------------------------

def all_specs():
    """Every kernel variant the library can ask for."""
    for src, (q, gran) in itertools.product(SRC, Q_GRAN):
        for vec in vecs(src):
            yield quant.QuantKernelSpec("quantize", src, q, gran, vec)
    for src in SRC:
        for vec in vecs(src):
            yield quant.QuantKernelSpec("amax", src, vec=vec)
    for src, q in itertools.product(SRC, quant.QUANT_DTYPES):
        yield quant.QuantKernelSpec("dequantize", src, q)


def test_render_every_variant():
    seen = set()
    for spec in all_specs():
        src = quant.render_kernel(spec)
        case = spec.tag
        assert [name for name, _ in src.headers] == ["dgjit/common.cuh", "dgjit/quantize.cuh"], case
        assert "{{" not in src.source and "{%" not in src.source, case
        assert src.entry == spec.entry and "void __launch_bounds__" in src.source, case
        assert f"{spec.entry}(" in src.source and f"{spec.entry}_units_per_block" in src.source, case
        if spec.op != "dequantize":
            assert f"constexpr int kVecIn = {spec.vec};" in src.source, case
            assert f"using TIn = {dtypes.get(spec.src_dtype).cpp_storage};" in src.source, case
        if spec.op == "quantize":
            assert f"quant::Granularity::{spec.granularity_cpp};" in src.source, case
        if spec.op != "amax":
            assert f"quant::Format::{spec.format_cpp};" in src.source, case
        seen.add(src.source)
    assert len(seen) == len(list(all_specs()))  # every variant is a different source


def test_render_is_strict():
    with pytest.raises(jinja2.UndefinedError):
        render.render("quantize.cu.j2", "k", tag="x")  # no spec


# -- real compiles, SASS ----------------------------------------------------------------------------------

def compile_all(specs, cache_root, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(cache_root))
    return [(spec, quant.get_kernel(spec, ARCH)) for spec in specs]


@pytest.mark.parametrize("src", SRC)
def test_compile_every_variant_sm90a(src, shared_cache_dir, monkeypatch):
    """NVRTC to sm_90a for every quantize/amax/dequantize variant of one source dtype (every vector width):
    no local memory, no spills, and the sizes the host reads from the cubin."""
    specs = [s for s in all_specs() if s.src_dtype == src]
    lanes = quant.GROUP // full_vec(src)
    for spec, art in compile_all(specs, shared_cache_dir, monkeypatch):
        case = f"{spec.tag} {art.key[:12]}"
        usage = sass.resource_usage(art.cubin)[art.entry]
        assert usage.get("LOCAL", 0) == 0 and usage.get("STACK", 0) == 0, case
        assert art.meta["spill_store_bytes"] == 0 and art.meta["spill_load_bytes"] == 0, case
        assert 0 < usage["REG"] <= 64, case  # 256 threads: room for several blocks per SM
        sym = quant.kernel_symbols(art)
        assert sym["num_threads"] == 256 and sym["group_cols"] == quant.GROUP, case
        assert sym["units_per_block"] == (256 if spec.op == "dequantize" else 256 // lanes), case
        assert art.cubin[:4] == b"\x7fELF"


S = quant.QuantKernelSpec
F2FP_Q = "F2FP.SATFINITE.{}.F32.PACK_AB"  # cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32
F2FP_DQ = "F2FP.F16.{}.UNPACK_B"          # cvt.rn.f16x2.{e4m3x2,e5m2x2}
ROUND_INT = "F2I.NTZ "                     # cvt.rni.s32.f32 (the F2I of integer divisions say .TRUNC)
# (spec, SASS it must contain, SASS it must not contain): one disassembly each covers every conversion, every
# load width and every reduction scheme (cuobjdump takes ~0.6 s per cubin, so not all 130 variants).
SASS_CASES = [
    (S("quantize", "fp32", "fp8_e4m3", "group128", 4), ["LDG.E.128", F2FP_Q.format("E4M3"), "SHFL.BFLY"],
     ["BAR.SYNC", "F2FP.SATFINITE.E5M2", ROUND_INT]),
    (S("quantize", "bf16", "fp8_e4m3", "group128", 8), ["LDG.E.128", "STG.E.64", F2FP_Q.format("E4M3")], ["BAR.SYNC"]),
    (S("quantize", "fp16", "fp8_e5m2", "tensor", 8), ["LDG.E.128", F2FP_Q.format("E5M2")], ["SHFL", "BAR.SYNC"]),
    (S("quantize", "bf16", "fp8_e5m2", "row", 1), ["BAR.SYNC", F2FP_Q.format("E5M2")], ["LDG.E.128", "LDG.E.64"]),
    (S("quantize", "fp16", "int8", "row", 4), ["LDG.E.64", ROUND_INT, "BAR.SYNC"], ["LDG.E.128", "F2FP"]),
    (S("quantize", "fp32", "int8", "tensor", 2), ["LDG.E.64", ROUND_INT], ["LDG.E.128", "F2FP", "SHFL"]),
    (S("quantize", "bf16", "fp8_e4m3", "block128", 4), ["LDG.E.64", "BAR.SYNC", F2FP_Q.format("E4M3")], ["LDG.E.128"]),
    (S("quantize", "fp32", "fp8_e5m2", "block128", 1), ["BAR.SYNC", F2FP_Q.format("E5M2")], ["LDG.E.128", "LDG.E.64"]),
    (S("amax", "bf16", vec=8), ["LDG.E.128", "REDG.E.MAX", "BAR.SYNC"], ["F2FP", "STG"]),
    (S("amax", "fp32", vec=1), ["REDG.E.MAX"], ["LDG.E.128", "LDG.E.64"]),
    (S("dequantize", "fp32", "fp8_e4m3"), [F2FP_DQ.format("E4M3")], [ROUND_INT]),
    (S("dequantize", "bf16", "fp8_e5m2"), [F2FP_DQ.format("E5M2"), "F2FP.BF16.F32.PACK_AB"], []),
    (S("dequantize", "fp16", "int8"), ["I2F.S8", "F2FP.F16.F32.PACK_AB"], ["UNPACK_B"]),
]


@pytest.mark.parametrize("spec,present,absent", SASS_CASES, ids=[c[0].tag for c in SASS_CASES])
def test_sass_of_representative_variants(spec, present, absent, shared_cache_dir, monkeypatch):
    (_, art), = compile_all([spec], shared_cache_dir, monkeypatch)
    text = sass.disassemble(art.cubin)
    for word in present:
        assert word in text, f"{spec.tag}: {word!r} missing from the SASS"
    for word in absent:
        assert word not in text, f"{spec.tag}: unexpected {word!r} in the SASS"
    assert "STL" not in text and "LDL" not in text, spec.tag


def test_cache_reuse_and_offline(cache_dir, monkeypatch):
    quant.clear_memo()  # the cache_dir fixture clears jit's memo, not this module's
    spec = quant.QuantKernelSpec("quantize", "bf16", "fp8_e4m3", "group128", 8)
    first = quant.get_kernel(spec, ARCH)
    assert first.compiled_now and first.meta["name"] == spec.tag
    assert quant.get_kernel(spec, ARCH).compiled_now is False  # memo
    quant.clear_memo()
    again = quant.get_kernel(spec, ARCH)
    assert again.compiled_now is False and again.key == first.key and again.cubin == first.cubin  # disk
    assert any(e["name"] == spec.tag for e in cache.default_cache().entries())
    quant.clear_memo()
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    assert quant.get_kernel(spec, ARCH).key == first.key
    with pytest.raises(KernelNotCachedError, match="quant_amax_bf16_v8"):
        quant.get_kernel(quant.QuantKernelSpec("amax", "bf16", vec=8), ARCH)
    quant.clear_memo()


# -- references (NumPy) ------------------------------------------------------------------------------------

ML = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}


@pytest.mark.parametrize("fmt", dtypes.FP8_DTYPES)
def test_decode_fp8_table(fmt):
    bits = np.arange(256, dtype=np.uint8)
    values = reference.decode_fp8(bits, fmt)
    assert values.dtype == np.float64
    expect = bits.view(ML[fmt]).astype(np.float64)
    np.testing.assert_array_equal(values, expect)
    assert values[0x7E if fmt == "fp8_e4m3" else 0x7B] == dtypes.QUANT_MAX[fmt]
    with pytest.raises(TypeError, match="uint8"):
        reference.decode_fp8(bits.astype(np.int16), fmt)


@pytest.mark.parametrize("fmt", dtypes.FP8_DTYPES)
def test_fp8_rounding_matches_ml_dtypes_on_float32_values(fmt):
    """On float32 inputs (where ml_dtypes rounds once) the reference's arithmetic rounding is ml_dtypes'."""
    rng = np.random.default_rng(1)
    lim = dtypes.QUANT_MAX[fmt]
    v = np.concatenate([rng.standard_normal(50000) * lim / 3, rng.standard_normal(20000) * 1e-3,
                        rng.standard_normal(20000) * 1e-6, [0.0, -0.0, lim, -lim, 2 * lim, -1e30]]).astype(np.float32)
    ours = reference._round_fp8(np, v.astype(np.float64), fmt)
    theirs = np.clip(v, -lim, lim).astype(ML[fmt]).view(np.uint8)
    np.testing.assert_array_equal(ours, theirs)
    finite = np.isfinite(reference.decode_fp8(np.arange(256, dtype=np.uint8), fmt))
    codes = np.arange(256, dtype=np.uint8)[finite]
    np.testing.assert_array_equal(reference._round_fp8(np, reference.decode_fp8(codes, fmt), fmt), codes)


def test_fp8_rounding_is_single_from_float64():
    r = lambda vals, fmt="fp8_e4m3": reference.decode_fp8(reference._round_fp8(np, np.array(vals), fmt), fmt)
    # 1.0625 is the midpoint of 1 and 1.125: ties go to the even mantissa (1.0); anything above goes up, even by 2**-30
    # (where rounding through float32 first would land on the tie and go down).
    np.testing.assert_array_equal(r([1.0625, 1.0625 + 2**-30, 1.1875, -1.0625]), [1.0, 1.125, 1.25, -1.0])
    # subnormals: E4M3 steps of 2**-9; 2**-10 is a tie between 0 and 2**-9 -> 0, 3 * 2**-10 -> 2 * 2**-9
    np.testing.assert_array_equal(r([2**-10, 3 * 2**-10, 2**-10 + 2**-40]), [0.0, 2**-8, 2**-9])
    # saturation, not NaN/Inf
    np.testing.assert_array_equal(r([464.0, 1e9, -np.inf]), [448.0, 448.0, -448.0])
    np.testing.assert_array_equal(r([61440.0, -1e30], "fp8_e5m2"), [57344.0, -57344.0])
    assert reference._round_fp8(np, np.array([np.nan]), "fp8_e4m3")[0] == 0x7F
    assert reference._round_fp8(np, np.array([-1e-30]), "fp8_e4m3")[0] == 0x80  # -0 keeps its sign, like cvt


def test_int8_rounding_half_even_and_saturating():
    q = reference._round_int8(np, np.array([0.5, 1.5, 2.5, -0.5, -2.5, 126.5, 127.4, 200.0, -128.0, np.nan]))
    np.testing.assert_array_equal(q, [0, 2, 2, 0, -2, 126, 127, 127, -127, 0])
    assert q.dtype == np.int8


def test_quantize_reference_scales_and_layouts():
    rng = np.random.default_rng(2)
    m, k = 130, 300  # partial last group (300 = 2 * 128 + 44) and partial last row block (130 = 128 + 2)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[5, 128:256] = 0.0  # one all-zero group
    q, s = reference.quantize_reference(x, "fp8", "group128")
    assert q.shape == (m, k) and q.dtype == np.uint8 and s.shape == (m, 3) and s.dtype == np.float32
    assert s.strides == (4, 4 * 132) and np.all(s.base[:, m:] == 1.0)  # quantize's M-major layout, padding 1.0
    a = np.abs(x.astype(np.float64))
    expect = np.stack([a[:, :128].max(1), a[:, 128:256].max(1), a[:, 256:].max(1)], axis=1) / 448.0
    expect = np.where(expect == 0, 1.0, expect).astype(np.float32)
    np.testing.assert_array_equal(s, expect)
    assert s[5, 1] == 1.0 and np.all(q[5, 128:256] == 0)
    _, sb = reference.quantize_reference(x, "fp8_e5m2", "block128")
    assert sb.shape == (2, 3) and sb.flags.c_contiguous
    assert sb[1, 2] == np.float32(a[128:, 256:].max() / 57344.0)
    assert sb[0, 0] == np.float32(a[:128, :128].max() / 57344.0)
    _, sr = reference.quantize_reference(x, "int8", "row")
    np.testing.assert_array_equal(sr, (a.max(1) / 127.0).astype(np.float32))
    _, st = reference.quantize_reference(x, "int8", "tensor")
    assert st.shape == (1,) and st[0] == np.float32(a.max() / 127.0)
    _, sz = reference.quantize_reference(np.zeros((3, 5), np.float32), "fp8", "tensor")
    assert sz[0] == 1.0
    with pytest.raises(ValueError, match="for int8"):
        reference.quantize_reference(x, "int8", "group128")
    with pytest.raises(ValueError, match="2-D"):
        reference.quantize_reference(x[0], "fp8", "row")


@pytest.mark.parametrize("dt,gran", Q_GRAN)
@pytest.mark.parametrize("src", SRC)
def test_reference_round_trip(src, dt, gran):
    """dequantize(quantize(x)) is within half an 8-bit step of x, the group's largest value maps to the format's
    maximum, and every value of q agrees with an independent ml_dtypes / numpy rounding of x / s."""
    rng = np.random.default_rng(3)
    # Large enough that a float64 quotient (not the kernels' float32 one) changes q values: 7 x 129 could not tell
    # them apart (session 60 review: a 512 x 1024 BF16 input changes 646).
    m, k = 300, 1000
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32).astype(dtypes.numpy_dtype(src))
    x64 = x.astype(np.float64)
    q, s = reference.quantize_reference(x, dt, gran)
    s_full = reference._expand_scales(np, s.astype(np.float64), gran, m, k)
    xhat = reference.dequantize_reference(q, s, dt, gran)
    assert xhat.shape == (m, k) and xhat.dtype == np.float64
    step = {"fp8_e4m3": 2.0**-3, "fp8_e5m2": 2.0**-2, "int8": None}[dt]
    if step is None:
        # half a step, plus the float32 quotient's rounding (a quotient just below a half rounds up to it)
        assert np.all(np.abs(xhat - x64) <= 0.5 * s_full + 2.0**-23 * np.abs(x64))
        v32 = x.astype(np.float32) / s_full.astype(np.float32)  # rint: half to even
        np.testing.assert_array_equal(q, np.clip(np.rint(v32), -127, 127).astype(np.int8))
    else:  # relative half-step for normals, absolute for the (tiny) subnormal range
        tiny = s_full * (2.0**-6 if dt == "fp8_e4m3" else 2.0**-14)
        assert np.all(np.abs(xhat - x64) <= np.maximum(0.5 * step * np.abs(x64), tiny)), f"{src=} {dt=} {gran=}"
        v = x64 / s_full
        assert np.all(np.abs(v) <= dtypes.QUANT_MAX[dt] * (1 + 1e-6))
        # ml_dtypes' round-to-nearest-even of the float32 quotient (no value is past the format's largest)
        fp8 = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}[dt]
        v32 = x.astype(np.float32) / s_full.astype(np.float32)
        np.testing.assert_array_equal(q, v32.astype(fp8).view(np.uint8), err_msg=f"{src=} {dt=} {gran=}")
    # The largest magnitude of each group becomes the format's largest value.
    group_amax = reference._expand_scales(np, reference._group_amax(np, np.abs(x64), gran), gran, m, k)
    decoded = reference.decode_fp8(q, dt) if dt != "int8" else q.astype(np.float64)
    at_amax = np.abs(x64) == group_amax
    assert at_amax.sum() >= s.size and np.all(np.abs(decoded[at_amax]) == dtypes.QUANT_MAX[dt]), f"{src=} {dt=} {gran=}"


def test_dequantize_reference_padded_rows_and_errors():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 200)).astype(np.float32)
    q, s = reference.quantize_reference(x, "fp8", "group128")
    padded = np.zeros((3, 208), np.uint8)
    padded[:, :200] = q
    np.testing.assert_array_equal(reference.dequantize_reference(padded, s, "fp8", "group128", k=200),
                                  reference.dequantize_reference(q, s, "fp8", "group128"))
    with pytest.raises(ValueError, match="k=300"):
        reference.dequantize_reference(padded, s, "fp8", "group128", k=300)
    with pytest.raises(ValueError, match="scales has shape"):
        reference.dequantize_reference(q, s[:, :1], "fp8", "group128")
    with pytest.raises(TypeError, match="int8"):
        reference.dequantize_reference(q, s[:, 0], "int8", "row")


def test_quant_ulp_distance():
    a = np.array([0x00, 0x80, 0x01, 0x81, 0x7E, 0x10], np.uint8)
    b = np.array([0x80, 0x00, 0x81, 0x82, 0x7D, 0x12], np.uint8)
    np.testing.assert_array_equal(reference.quant_ulp_distance(a, b, "fp8"), [0, 0, 2, 1, 1, 2])
    np.testing.assert_array_equal(reference.quant_ulp_distance(np.array([-127, 5], np.int8),
                                                               np.array([127, 4], np.int8), "int8"), [254, 1])
    # NaN / Inf codes are no step from the largest finite ones (an unwritten 0xFF next to -448, a conversion that
    # lost satfinite next to +448, E5M2's inf next to 57344); the same code is 0 apart (a NaN input's NaN)
    far = reference.NON_FINITE_DISTANCE
    np.testing.assert_array_equal(reference.quant_ulp_distance(np.array([0xFF, 0x7F, 0x7F, 0x7E], np.uint8),
                                                               np.array([0xFE, 0x7E, 0x7F, 0x7F], np.uint8), "fp8"),
                                  [far, far, 0, far])
    np.testing.assert_array_equal(reference.quant_ulp_distance(np.array([0x7C, 0xFB], np.uint8),
                                                               np.array([0x7B, 0xFB], np.uint8), "fp8_e5m2"),
                                  [far, 0])


# -- launches, with the GPU-touching pieces replaced -------------------------------------------------------------

class FakeStream:
    ptr = 0x5000


class _Calls(list):
    """The fake device's record of allocations and launches; `capturing`: what runtime.is_capturing answers."""
    capturing = False


@pytest.fixture
def fake_device(monkeypatch, fake_gpu_memory, shared_cache_dir):
    """quantize/dequantize run up to their launches: one sm_90 device with 132 SMs, outputs at fake addresses, the
    launches and the memset recorded instead of issued (the kernels themselves are compiled for real)."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    monkeypatch.setattr(quant, "_arch_of_device", {})
    monkeypatch.setattr(device, "gpu_count", lambda: 1)
    monkeypatch.setattr(device, "current_device_id", lambda: 0)
    monkeypatch.setattr(device, "capability", lambda device_id=None: (9, 0))
    monkeypatch.setattr(quant, "_num_sms", lambda device_id: 132)
    monkeypatch.setattr(quant.runtime, "stream_for", lambda kind, stream, device_id: FakeStream())
    calls = _Calls()
    addresses = iter(range(0x100000, 0x10000000, 0x100000))

    def empty(kind, shape, name, device_id, cu_stream, is_explicit_stream):
        # A NumPy stand-in of the right shape and dtype, so that views of it (the M-major transpose) can be made
        # and their strides checked; the kernels get the fake address.
        ptr = next(addresses)
        calls.append(("alloc", kind, shape, name, ptr, cu_stream.ptr, is_explicit_stream))
        return np.empty(shape, quant._cupy_dtype(name)), ptr

    class Kernel:
        def __init__(self, artifact):
            self.entry = artifact.entry

        def bind(self, grid, block):
            return ("bound", grid, block)

        def launch(self, grid, block, args, stream, bound=None):
            calls.append(("launch", self.entry, grid, block, args.args, stream.ptr))

    import cupy
    monkeypatch.setattr(quant, "_empty", empty)
    monkeypatch.setattr(quant.runtime, "loaded_kernel", lambda artifact, device_id, smem: Kernel(artifact))
    monkeypatch.setattr(cupy.cuda.runtime, "memsetAsync", lambda *args: calls.append(("memset",) + args))
    monkeypatch.setattr(quant.runtime, "is_capturing", lambda stream: calls.capturing)
    return calls


def _types(args):
    return [type(a).__name__ for a in args]


_C_TYPES = {"long long": "int64", "unsigned int": "uint32"}  # pointers travel as uint64


def entry_param_types(spec):
    """The argument types the rendered entry of `spec` declares, as the NumPy scalar types the host packs."""
    source = quant.render_kernel(spec).source
    entry = source[source.index(f"{spec.entry}("):]
    params = entry[entry.index("(") + 1:entry.index(") {")]
    types = []
    for param in params.split(","):
        words = param.replace("__restrict__", "").split()[:-1]  # drop the name
        text = " ".join(w for w in words if w != "const")
        types.append("uint64" if "*" in text else _C_TYPES[text])
    return types


def _round4(m):
    return -(-m // 4) * 4


def test_read_only_outputs_are_refused(fake_device):
    """A read-only array (a JAX array exports data[1] = True in its __cuda_array_interface__) given as out= was
    written (review)."""
    x = FakeDeviceArray((129, 1000), np.float16, ptr=BASE)
    q = FakeDeviceArray((129, 1000), np.uint8, ptr=BASE + (1 << 20), read_only=True)
    s = FakeDeviceArray((129, 8), np.float32, ptr=BASE + (2 << 20))
    with pytest.raises(ValueError, match=r"out\[0\] is read-only"):
        quant.quantize(x, "fp8", "group128", out=(q, s))
    q_ok = FakeDeviceArray((129, 1000), np.uint8, ptr=BASE + (1 << 20))
    with pytest.raises(ValueError, match=r"out\[1\] is read-only"):
        quant.quantize(x, "fp8", "group128", out=(q_ok, FakeDeviceArray((129, 8), np.float32, ptr=BASE + (2 << 20),
                                                                         read_only=True)))
    assert not [c for c in fake_device if c[0] == "launch"]


def test_captured_tensor_quantize_keeps_its_amax_word(fake_device, monkeypatch):
    """Under a CuPy capture the graph replays into the temporary amax word's address: it is kept (the GPU test shows
    what a freed one does), and outside a capture it is not."""
    monkeypatch.setattr(quant.runtime, "_kept_for_graphs", [])
    x = FakeDeviceArray((129, 1000), np.float16, ptr=BASE)
    quant.quantize(x, "fp8", "tensor")
    assert quant.runtime._kept_for_graphs == []
    fake_device.capturing = True
    quant.quantize(x, "fp8", "tensor")
    quant.quantize(x, "fp8", "row")  # no word
    ((word,),) = quant.runtime._kept_for_graphs
    assert word.shape == (1,)


@pytest.mark.parametrize("gran,m,k,grid", [
    ("group128", 1000, 7168, 1000 * 56 // 16),   # 16 units of 1 x 128 per 256-thread block (8 lanes x 16 B each)
    ("group128", 7, 129, 1),
    ("row", 1000, 7168, 1000),                   # a block per row
    ("block128", 1000, 7168, 8 * 56),            # a block per 128 x 128 block
    ("tensor", 129, 1000, -(-129 * 8 // 16)),
])
def test_quantize_launches(fake_device, gran, m, k, grid):
    ptr, row_stride = BASE + 4096, k + 8
    q, s = quant.quantize(FakeDeviceArray((m, k), np.float16, ptr=ptr, strides=(row_stride, 1)), "fp8", gran)
    assert (q.shape, q.dtype) == ((m, k), np.uint8) and q.flags.c_contiguous
    assert (s.shape, s.dtype) == (quant.scale_shape(gran, m, k), np.float32)
    allocs = [c for c in fake_device if c[0] == "alloc"]
    launches = [c for c in fake_device if c[0] == "launch"]
    q_ptr, s_ptr = allocs[0][4], allocs[1][4]
    kb = -(-k // 128)
    if gran == "group128":  # M-major: (kb, round_up(M, 4)) storage, transposed and cut to M rows
        assert allocs[1][2:4] == ((kb, _round4(m)), "fp32")
        assert s.strides == (4, 4 * _round4(m)) and s.base is not None and s.base.shape == (kb, _round4(m))
        s_strides = (1, _round4(m))
    else:  # row-major, contiguous
        assert allocs[1][2:4] == (quant.scale_shape(gran, m, k), "fp32") and s.flags.c_contiguous
        s_strides = (kb, 1) if gran == "block128" else (1, 0)
    assert s_ptr % 16 == 0
    if gran == "tensor":
        word_ptr = allocs[2][4]
        assert allocs[2][2:4] == ((1,), "word")
        memset = [c for c in fake_device if c[0] == "memset"]
        assert memset == [("memset", word_ptr, 0, 4, FakeStream.ptr)]
        assert fake_device.index(memset[0]) < fake_device.index(launches[0])  # zeroed before the amax kernel
        amax, launches = launches[0], launches[1:]
        assert amax[1] == "dgjit_amax" and amax[3] == (256, 1, 1)
        assert amax[2] == (min(-(-m * (-(-k // 128)) // 16), 8 * 132), 1, 1)
        assert amax[4] == (ptr, row_stride, word_ptr, m, k)
        assert _types(amax[4]) == ["uint64", "int64", "uint64", "uint32", "uint32"]
        assert _types(amax[4]) == entry_param_types(quant.QuantKernelSpec("amax", "fp16", vec=8))
    else:
        word_ptr = 0
    (launch,) = launches
    assert launch[1] == "dgjit_quantize" and launch[2] == (grid, 1, 1) and launch[3] == (256, 1, 1)
    assert launch[4] == (ptr, row_stride, q_ptr, s_ptr) + s_strides + (word_ptr, m, k) and launch[5] == FakeStream.ptr
    assert _types(launch[4]) == ["uint64", "int64", "uint64", "uint64", "int64", "int64", "uint64", "uint32", "uint32"]
    assert _types(launch[4]) == entry_param_types(quant.QuantKernelSpec("quantize", "fp16", "fp8_e4m3", gran, 8))


@pytest.mark.parametrize("m", [1, 3, 300, 1000])
def test_quantize_default_group128_scales_take_the_bulk_path(fake_device, m):
    """What quantize returns for group128, handed to an FP8 block GEMM as scale_a, is M-major with 16-byte aligned
    columns: launch.bulk_a_scales is on (dense, and masked after reshaping its rows to (G, max_m, kb))."""
    from deepgemm_jit import grouped, launch
    from deepgemm_jit.arrays import scale_view

    k = 1000
    kb = -(-k // 128)
    _, s = quant.quantize(FakeDeviceArray((m, k), np.float16), "fp8", "group128")
    s_ptr = [c for c in fake_device if c[0] == "alloc"][1][4]

    def stand_in(view):
        return FakeDeviceArray(view.shape, np.float32, s_ptr, tuple(st // 4 for st in view.strides))

    dense = GemmSpec.create(512, k, dtype="fp8", scaling="block")
    assert launch.bulk_a_scales(dense, scale_view(stand_in(s), "scale_a", (m, kb), "x"), m), m
    if m % 4 == 0:  # as G = 4 groups of max_m rows
        masked = s.reshape(4, m // 4, kb)
        assert np.shares_memory(masked, s)
        rows = grouped._scale_rows(stand_in(masked), "scale_a", (4, m // 4, kb), "x")
        spec = GemmSpec.create(512, k, dtype="fp8", scaling="block", grouped=True)
        assert launch.bulk_a_scales(spec, rows, m), m


def test_quantize_picks_the_widest_legal_load(fake_device, monkeypatch):
    seen = []
    real = quant.get_kernel
    monkeypatch.setattr(quant, "get_kernel", lambda spec, arch: seen.append(spec) or real(spec, arch))
    for dtype, ptr, stride, vec in [(np.float32, BASE, 64, 4), (np.float32, BASE + 8, 64, 2), (np.float32, BASE, 65, 1),
                                    (np.float16, BASE, 64, 8), (np.float16, BASE + 4, 64, 2),
                                    (np.float16, BASE, 68, 4)]:
        seen.clear()
        quant.quantize(FakeDeviceArray((3, 60), dtype, ptr=ptr, strides=(stride, 1)), "fp8", "row")
        assert [s.vec for s in seen] == [vec], (dtype, ptr, stride)


def warmup_args(line: str) -> argparse.Namespace:
    """A `deepgemm-jit warmup ...` line as the command line parses it."""
    parser = argparse.ArgumentParser()
    warmup.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(line.split()[1:])


# (quantize dtype, granularity, K, the GEMM whose activations it makes): K % 8 == 0 loads 8 bf16 at a time,
# K = 100 (packed rows, row stride 100) only 4.
OFFLINE_CASES = [("fp8", "group128", 7168, GemmSpec.create(4096, 7168, "fp8", scaling="block")),
                 ("fp8_e5m2", "row", 2048, GemmSpec.create(64, 2048, "fp8_e5m2", b_dtype="fp8_e4m3", scaling="row")),
                 ("fp8", "tensor", 512, GemmSpec.create(64, 512, "fp8", scaling="tensor", fast_accum=True)),
                 ("int8", "row", 4096, GemmSpec.create(64, 4096, "int8", scaling="row")),
                 ("int8", "tensor", 100, GemmSpec.create(64, 100, "int8", scaling="tensor"))]


@pytest.mark.parametrize("dtype,gran,k,gemm", OFFLINE_CASES, ids=[f"{c[0]}-{c[1]}-k{c[2]}" for c in OFFLINE_CASES])
def test_offline_quantize_names_the_warmup_line_of_its_kernels(fake_device, tmp_path, monkeypatch, dtype, gran, k,
                                                               gemm):
    """quantize() of packed bf16 rows asks for kernels (quantize, and amax first for tensor) that are exactly those
    warmup plans for the GEMM the activations feed, and, offline with an empty cache, names the warmup line that
    plans exactly them too."""
    # The fake x has float16 storage; here it stands for bf16 (the same 2-byte rows).
    real_storage_name = dtypes.storage_name_of
    monkeypatch.setattr(dtypes, "storage_name_of", lambda dt: "bf16" if dt == np.float16 else real_storage_name(dt))
    seen = []
    real_get_kernel = quant.get_kernel
    monkeypatch.setattr(quant, "get_kernel", lambda spec, arch: seen.append(spec) or real_get_kernel(spec, arch))
    x = FakeDeviceArray((3, k), np.float16)
    quant.quantize(x, dtype, gran)  # the shared cache: compiled at most once per session
    wanted = list(seen)
    assert {s.src_dtype for s in wanted} == {"bf16"} and len(wanted) == (2 if gran == "tensor" else 1)
    planned = list(warmup.plan_quantize([warmup.WarmupEntry(gemm, (64,))]))
    # (K % 8 != 0: also the 16-byte kernels a single row, M = 1, runs: warmup_sources.activation_quantize_specs)
    assert planned[:len(wanted)] == wanted and len(planned) == len(wanted) * (2 if k % 8 else 1)

    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    quant.clear_memo()
    with pytest.raises(KernelNotCachedError, match="pre-generate it with: deepgemm-jit warmup") as info:
        quant.quantize(x, dtype, gran)
    line = info.value.warmup_command
    q_name = dtypes.canonical(dtype, arg="dtype", allowed=quant.QUANT_DTYPES)
    assert line == f"deepgemm-jit warmup --arch {ARCH} --quantize bf16:{q_name}/{gran}" + (":v4" if k == 100 else "")
    assert info.value.spec_tag == wanted[0].tag  # the first kernel of the call is the one missing
    args = warmup_args(line)
    assert args.arch == ARCH
    assert list(warmup.plan_quantize([], [warmup.parse_quantize(text) for text in args.quantize])) == wanted
    quant.clear_memo()


def test_offline_quantize_after_its_warmup_line(fake_device, tmp_path, monkeypatch, capsys):
    """The serving loop for quantize: the line an offline miss names compiles the kernels (amax too), and the same
    call then runs offline."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    quant.clear_memo()
    x = FakeDeviceArray((2, 256), np.float16)
    with pytest.raises(KernelNotCachedError) as info:
        quant.quantize(x, "fp8", "tensor")
    line = info.value.warmup_command
    assert line == f"deepgemm-jit warmup --arch {ARCH} --quantize fp16:fp8_e4m3/tensor"
    assert warmup.main(warmup_args(line + " --no-progress")) == 0
    assert "warmup: 2 kernels for sm_90a (quantize): compiled 2, already cached 0, failed 0" in capsys.readouterr().out
    quant.clear_memo()
    quant.quantize(x, "fp8", "tensor")  # offline still: served from the cache
    assert [c[1] for c in fake_device if c[0] == "launch"] == ["dgjit_amax", "dgjit_quantize"]
    quant.clear_memo()


class FakeCupy:
    """A CuPy array as quantize / dequantize see it (array_kind patched to "cupy"): shape, dtype, strides (given in
    elements, kept in bytes like CuPy's), flags, data pointer and device, and __cuda_array_interface__."""

    def __init__(self, shape, dtype, ptr, strides=None):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        contiguous = tuple(int(np.prod(self.shape[i + 1:])) for i in range(len(self.shape)))
        self.strides = tuple(st * self.dtype.itemsize for st in (contiguous if strides is None else strides))
        self.flags = type("Flags", (), {"c_contiguous": strides is None or tuple(strides) == contiguous})()
        self.data = type("Mem", (), {"ptr": ptr, "device_id": 0})()
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize
        self.__cuda_array_interface__ = FakeDeviceArray(shape, dtype, ptr, strides).__cuda_array_interface__


@pytest.fixture
def fake_cupy(fake_device, monkeypatch):
    """fake_device, with every array taken for a CuPy one (so that FakeCupy outputs are of x's library)."""
    monkeypatch.setattr(quant, "array_kind", lambda a: "cupy")
    return fake_device


SCALES_AT = BASE + (1 << 20)


@pytest.mark.parametrize("gran,m,k,strides", [
    ("group128", 5, 300, None),            # row-major
    ("group128", 5, 300, (1, 8)),          # M-major, quantize's own layout
    ("group128", 5, 300, (1, 5)),          # column-major, unpadded
    ("group128", 5, 300, (4, 1)),          # row-major, padded rows
    ("group128", 1, 300, (1, 4)),          # one row, M-major
    ("group128", 1, 300, (0, 1)),          # one row: its stride addresses nothing
    ("row", 5, 300, (2,)),                 # every other element
    ("block128", 300, 300, (1, 3)),        # column-major
    ("tensor", 5, 300, (0,)),
])
def test_quantize_out_scales_any_distinct_strides(fake_cupy, gran, m, k, strides):
    """out=(q, scales): scales of the right shape with any strides that address each element once are written through
    those strides (the kernel gets them as arguments)."""
    x = FakeCupy((m, k), np.float16, BASE)
    q = FakeCupy((m, k), np.uint8, BASE + (1 << 19))
    shape = quant.scale_shape(gran, m, k)
    scales = FakeCupy(shape, np.float32, SCALES_AT, strides)
    got = quant.quantize(x, "fp8", gran, out=(q, scales))
    assert got[0] is q and got[1] is scales
    assert not [c for c in fake_cupy if c[0] == "alloc" and c[3] == "fp32"]  # nothing allocated for the scales
    (launch,) = [c for c in fake_cupy if c[0] == "launch" and c[1] == "dgjit_quantize"]
    want = scales.strides[0] // 4, (scales.strides[1] // 4 if len(shape) == 2 else 0)
    assert launch[4][2:6] == (q.data.ptr, SCALES_AT) + want, f"{gran=} {strides=}"


@pytest.mark.parametrize("gran,m,k,strides,words", [
    ("group128", 5, 300, (0, 1), r"out\[1\] has strides \(0, 1\).*overlap"),          # rows broadcast
    ("group128", 5, 300, (1, 0), r"out\[1\] has strides \(1, 0\).*overlap"),          # groups broadcast
    ("group128", 5, 300, (1, 4), r"out\[1\] has strides \(1, 4\).*overlap"),          # columns of 5 rows 4 apart
    ("group128", 5, 300, (2, 1), r"out\[1\] has strides \(2, 1\).*overlap"),          # rows of 3 groups 2 apart
    ("group128", 5, 300, (-1, 5), r"out\[1\] has negative strides"),
    ("row", 5, 300, (0,), r"out\[1\] has strides \(0,\).*overlap"),
    ("block128", 300, 300, (1, 2), r"out\[1\] has strides \(1, 2\).*overlap"),
])
def test_quantize_out_scales_overlapping_strides_are_refused(fake_cupy, gran, m, k, strides, words):
    x = FakeCupy((m, k), np.float16, BASE)
    q = FakeCupy((m, k), np.uint8, BASE + (1 << 19))
    scales = FakeCupy(quant.scale_shape(gran, m, k), np.float32, SCALES_AT, strides)
    with pytest.raises(ValueError, match=words):
        quant.quantize(x, "fp8", gran, out=(q, scales))
    assert not [c for c in fake_cupy if c[0] == "launch"]


@pytest.fixture
def unit_fills(fake_cupy, monkeypatch):
    """fake_cupy, with quantization._fill_unit_scale recorded as ("fill1", ptr, device, stream) in its calls."""
    monkeypatch.setattr(quant, "_fill_unit_scale",
                        lambda ptr, device_id, cu_stream: fake_cupy.append(("fill1", ptr, device_id, cu_stream.ptr)))
    return fake_cupy


@pytest.mark.parametrize("dt,gran", Q_GRAN)
def test_quantize_of_no_rows_returns_empty_outputs(unit_fills, dt, gran):
    """M = 0 (an expert that no token chose; the Gemms take M = 0 too) gives q (0, K) and scales of scale_shape with no
    kernel compiled or launched; the tensor granularity's one scale is 1 (an all-zero group's, as the contract and
    the torch op say), written on the call's stream. It was refused (session 60)."""
    k = 300
    shape = quant.scale_shape(gran, 0, k)
    zero_strides = (0,) * len(shape) if 0 in shape else None  # CuPy (as NumPy >= 1.23): zero-size arrays' strides
    for out in (None, (FakeCupy((0, k), np.int8 if dt == "int8" else np.uint8, BASE + 2048),
                       FakeCupy(shape, F32, BASE + 4096, zero_strides))):
        unit_fills.clear()
        q, s = quant.quantize(FakeCupy((0, k), np.float16, BASE), dt, gran, out=out)
        assert tuple(q.shape) == (0, k) and tuple(s.shape) == quant.scale_shape(gran, 0, k)
        if out is not None:
            assert q is out[0] and s is out[1]
        assert not [c for c in unit_fills if c[0] == "launch"]
        fills = [c for c in unit_fills if c[0] == "fill1"]
        if gran == "tensor":
            s_ptr = BASE + 4096 if out is not None else [c for c in unit_fills if c[0] == "alloc"][1][4]
            assert fills == [("fill1", s_ptr, 0, FakeStream.ptr)]
        else:
            assert fills == []


def test_quantize_of_no_rows_still_checks_its_arguments(unit_fills):
    x = FakeCupy((0, 300), np.float16, BASE)
    with pytest.raises(ValueError, match=r"out\[1\] has shape \(2,\), expected \(1,\)"):
        quant.quantize(x, "fp8", "tensor", out=(FakeCupy((0, 300), np.uint8, BASE), FakeCupy((2,), F32, BASE + 64)))
    with pytest.raises(ValueError, match=r"out\[0\] has shape \(1, 300\)"):
        quant.quantize(x, "fp8", "row", out=(FakeCupy((1, 300), np.uint8, BASE), FakeCupy((0,), F32, BASE + 4096)))
    with pytest.raises(TypeError, match="x has dtype int32"):
        quant.quantize(FakeCupy((0, 300), np.int32, BASE), "fp8", "row")
    assert not [c for c in unit_fills if c[0] in ("launch", "fill1")]


def test_fill_unit_scale_writes_one_word_of_float_one(monkeypatch):
    """The one driver call: cuMemsetD32Async(ptr, bits of 1.0f, 1 word, stream), its failure an error naming it."""
    import cupy

    seen = []

    class Lib:
        code = 0

        def cuMemsetD32Async(self, *args):
            seen.append(args)
            return self.code

    lib = Lib()
    monkeypatch.setattr(quant.driver, "libcuda", lambda: lib)
    monkeypatch.setattr(quant.driver, "error_name", lambda code, lib=None: "CUDA_ERROR_INVALID_VALUE")
    monkeypatch.setattr(cupy.cuda, "Device", lambda device_id: contextlib.nullcontext())
    quant._fill_unit_scale(BASE + 64, 0, FakeStream())
    assert seen == [(BASE + 64, int(np.float32(1.0).view(np.uint32)), 1, FakeStream.ptr)]
    lib.code = 1
    with pytest.raises(RuntimeError, match="cuMemsetD32Async of the tensor scale failed with 1"):
        quant._fill_unit_scale(BASE + 64, 0, FakeStream())


@pytest.mark.parametrize("gran", quant.GRANULARITIES)
def test_dequantize_of_no_rows_launches_nothing(fake_cupy, gran):
    k = 300
    q = FakeCupy((0, k), np.uint8, BASE)
    s = FakeCupy(quant.scale_shape(gran, 0, k), F32, BASE + 4096)
    x = quant.dequantize(q, s, "fp8", gran)
    assert (tuple(x.shape), x.dtype) == ((0, k), np.float32)
    given = FakeCupy((0, k), np.float32, BASE + 8192)
    assert quant.dequantize(q, s, "fp8", gran, out=given) is given
    with pytest.raises(ValueError, match=r"out has shape \(1, 300\)"):
        quant.dequantize(q, s, "fp8", gran, out=FakeCupy((1, k), np.float32, BASE + 8192))
    assert not [c for c in fake_cupy if c[0] == "launch"]


def test_quantize_out_errors_name_the_argument(fake_cupy):
    x = FakeCupy((5, 300), np.float16, BASE)
    q = FakeCupy((5, 300), np.uint8, BASE + (1 << 19))
    cases = [
        ((q, FakeCupy((5, 2), np.float32, SCALES_AT)), ValueError, r"out\[1\] has shape \(5, 2\), expected \(5, 3\)"),
        ((q, FakeCupy((5, 3), np.float64, SCALES_AT)), TypeError, r"out\[1\] has dtype float64; scales are float32"),
        ((q, FakeCupy((3, 5), np.float32, SCALES_AT)), ValueError, r"out\[1\] has shape \(3, 5\)"),
        ((q, FakeCupy((5, 3), np.float32, SCALES_AT + 2)), ValueError, r"out\[1\] data pointer .* 4-byte"),
        ((FakeCupy((5, 300), np.uint8, BASE + (1 << 19), strides=(301, 1)), FakeCupy((5, 3), np.float32, SCALES_AT)),
         ValueError, r"out\[0\] must be contiguous"),
        ((q, FakeCupy((5, 3), np.float32, BASE + 64)), ValueError, "out\\[1\\] overlaps x|x overlaps out\\[1\\]"),
        ([q, FakeCupy((5, 3), np.float32, SCALES_AT)], TypeError, "out must be a \\(q, scales\\) tuple"),
        ((q, None), TypeError, r"out\[1\] must be a CuPy array"),  # was an AttributeError on None.dtype
    ]
    for out, exc, words in cases:
        with pytest.raises(exc, match=words):
            quant.quantize(x, "fp8", "group128", out=out)
    assert not [c for c in fake_cupy if c[0] == "launch"]


@pytest.mark.parametrize("gran,m,k,strides,layout", [
    ("tensor", 5, 300, None, (1, 0, 5, 300)), ("row", 5, 300, None, (1, 0, 1, 300)),
    ("row", 5, 300, (3,), (3, 0, 1, 300)),
    ("group128", 5, 300, None, (3, 1, 1, 128)), ("group128", 5, 300, (1, 8), (1, 8, 1, 128)),  # quantize's M-major
    ("group128", 5, 300, (0, 1), (0, 1, 1, 128)),   # one scale row read by every row: fine for an input
    ("block128", 300, 300, None, (3, 1, 128, 128)), ("block128", 300, 300, (1, 4), (1, 4, 128, 128)),
])
def test_dequantize_launch(fake_cupy, gran, m, k, strides, layout):
    """Every granularity and scale layout as the kernel's (stride_m, stride_g, rows_per_scale, cols_per_scale)."""
    q = FakeCupy((m, k), np.uint8, BASE, strides=(k + 16, 1))
    s = FakeCupy(quant.scale_shape(gran, m, k), np.float32, SCALES_AT, strides)
    out = quant.dequantize(q, s, "fp8", gran, out_dtype="bf16")
    assert (out.shape, out.dtype) == ((m, k), dtypes.numpy_dtype("bf16"))
    (launch,) = [c for c in fake_cupy if c[0] == "launch"]
    out_ptr = [c for c in fake_cupy if c[0] == "alloc"][0][4]
    assert launch[1] == "dgjit_dequantize" and launch[3] == (256, 1, 1)
    assert launch[2] == (min(-(-m * k // 256), 32 * 132), 1, 1)
    assert launch[4] == (BASE, k + 16, SCALES_AT, layout[0], layout[1], out_ptr, m, k) + layout[2:]
    assert _types(launch[4]) == ["uint64", "int64", "uint64", "int64", "int64", "uint64"] + ["uint32"] * 4
    assert _types(launch[4]) == entry_param_types(quant.QuantKernelSpec("dequantize", "bf16", "fp8_e4m3"))


def test_dequantize_scales_errors(fake_cupy):
    q = FakeCupy((5, 300), np.uint8, BASE)
    with pytest.raises(ValueError, match=r"scales has negative strides"):
        quant.dequantize(q, FakeCupy((5, 3), np.float32, SCALES_AT, (1, -5)))
    with pytest.raises(ValueError, match=r"scales has shape \(3, 5\), expected \(5, 3\)"):
        quant.dequantize(q, FakeCupy((3, 5), np.float32, SCALES_AT))
    with pytest.raises(ValueError, match="scales data pointer"):
        quant.dequantize(q, FakeCupy((5, 3), np.float32, SCALES_AT + 1))
    with pytest.raises(ValueError, match="out overlaps scales|scales overlaps out"):
        quant.dequantize(q, FakeCupy((5, 3), np.float32, SCALES_AT, (1, 8)),
                         out=FakeCupy((5, 300), np.float32, SCALES_AT + 64))
    # q and scales are only read: scales kept in q's row padding (a packed checkpoint) are not refused (review)
    packed = FakeCupy((5, 300), np.uint8, BASE, strides=(320, 1))
    quant.dequantize(packed, FakeCupy((5, 3), np.float32, BASE + 304, (80, 1)),
                     out=FakeCupy((5, 300), np.float32, SCALES_AT + 4096))
    with pytest.raises(ValueError, match="out overlaps q"):
        quant.dequantize(packed, FakeCupy((5, 3), np.float32, SCALES_AT), out=FakeCupy((5, 300), np.float32, BASE))
    with pytest.raises(TypeError, match="scales must be a CuPy array"):  # these were AttributeErrors
        quant.dequantize(q, None)
    with pytest.raises(TypeError, match="out must be a CuPy array"):
        quant.dequantize(q, FakeCupy((5, 3), np.float32, SCALES_AT), out=[1, 2])
    assert len([c for c in fake_cupy if c[0] == "launch"]) == 1  # the packed call's


def test_kept_plan_keys():
    """quantize keeps launches only for CuPy / torch arrays with out= a (q, scales) tuple and string arguments."""
    from fakes import FakeDeviceArray

    x = FakeDeviceArray((4, 256), np.float16)
    assert quant._plan_key(x, None, "fp8", "group128") is None
    assert quant._plan_key(x, [x, x], "fp8", "group128") is None
    assert quant._plan_key(x, (x, x), "fp8", "group128") is None  # not CuPy / torch: signature() is None
    assert quant._plan_key(x, (x, x), ["fp8"], "group128") is None


# -- kept launches of calls without out= -------------------------------------------------------------------------

def fake_signature(x):
    """arrays.signature for FakeDeviceArray (pointer, shape, strides, dtype: what CuPy's holds), None for others."""
    iface = getattr(x, "__cuda_array_interface__", None)
    if iface is None:
        return None
    return (iface["data"][0], iface["shape"], iface["strides"], iface["typestr"])


@pytest.fixture
def keyed(fake_device, monkeypatch):
    """fake_device, with FakeDeviceArray given a signature (so that quantize keeps plans for it), an empty table of
    kept plans, streams that are the given one (or FakeStream), and `checked`: the calls of matrix_view (x's checks,
    the first step of the full path)."""
    monkeypatch.setattr(quant, "signature", fake_signature)
    monkeypatch.setattr(quant, "_new_output_plans", {})
    monkeypatch.setattr(quant.runtime, "stream_for", lambda kind, stream, device_id: stream or FakeStream())
    checked = []
    real_matrix_view = quant.matrix_view
    monkeypatch.setattr(quant, "matrix_view", lambda x, arg: checked.append(x) or real_matrix_view(x, arg))
    return fake_device, checked


class OtherStream:
    ptr = 0x6000


def _replaced(args, slots):
    """args with the values at `slots` (a dict index -> value) replaced."""
    return tuple(slots.get(i, a) for i, a in enumerate(args))


@pytest.mark.parametrize("kind", ["cupy", "torch"])
@pytest.mark.parametrize("gran,m,k", [("group128", 1000, 7168), ("group128", 7, 129), ("row", 5, 300),
                                      ("block128", 300, 300)])
def test_repeated_call_without_out_replays_with_new_outputs(keyed, monkeypatch, kind, gran, m, k):
    """The second call with the same x (and dtype, granularity, device) skips the checks and planning: it allocates
    the same shapes and dtypes as the first (in x's library, for the call's stream), launches the same kernel with
    the same grid, block and non-pointer arguments, and only q's and the scales' pointers are the new outputs'."""
    calls, checked = keyed
    monkeypatch.setattr(quant, "array_kind", lambda a: kind)  # x of that library (the fake is neither)
    x = FakeDeviceArray((m, k), np.float16, ptr=BASE + 4096, strides=(k + 8, 1))
    results = [quant.quantize(x, "fp8", gran) for _ in range(3)]
    results.append(quant.quantize(x, "fp8", gran, stream=OtherStream()))
    assert len(checked) == 1 and len(quant._new_output_plans) == 1  # only the first call was checked
    allocs = [c for c in calls if c[0] == "alloc"]
    launches = [c for c in calls if c[0] == "launch"]
    assert len(allocs) == 8 and len(launches) == 4
    first_q, first_s = allocs[0], allocs[1]
    assert first_q[1:4] == (kind, (m, k), "fp8_e4m3")
    for i in range(1, 4):
        q_alloc, s_alloc = allocs[2 * i], allocs[2 * i + 1]
        assert q_alloc[1:4] == first_q[1:4] and s_alloc[1:4] == first_s[1:4], f"call {i}: {q_alloc} {s_alloc}"
        want_stream = (OtherStream.ptr, True) if i == 3 else (FakeStream.ptr, False)
        assert q_alloc[5:] == s_alloc[5:] == want_stream, f"call {i}"
        launch = launches[i]
        assert launch[1:4] == launches[0][1:4], f"call {i}: kernel, grid, block"
        assert launch[4] == _replaced(launches[0][4], {2: q_alloc[4], 3: s_alloc[4]}), f"call {i}"
        assert _types(launch[4]) == _types(launches[0][4])
        assert launch[5] == want_stream[0]
        q, s = results[i]
        assert (q.shape, q.dtype, q.strides) == (results[0][0].shape, results[0][0].dtype, results[0][0].strides)
        assert (s.shape, s.dtype, s.strides) == (results[0][1].shape, results[0][1].dtype, results[0][1].strides)
    assert len({c[4] for c in allocs}) == 8  # every call its own outputs
    if gran == "group128":  # M-major scales, the storage as _new_scales allocates it
        assert first_s[2] == (-(-k // 128), _round4(m)) and results[3][1].strides == (4, 4 * _round4(m))
    assert launches[0][4][3] == first_s[4] and launches[0][4][2] == first_q[4]


def test_other_arguments_take_the_checked_path(keyed, monkeypatch):
    """Any x that differs (pointer, shape, dtype, strides), another dtype or granularity string, or another current
    device is checked again (and keeps its own plan); the checks still refuse what they refuse."""
    calls, checked = keyed
    k = 256
    base = FakeDeviceArray((4, k), np.float16)
    others = [FakeDeviceArray((4, k), np.float16, ptr=BASE + 4096),
              FakeDeviceArray((5, k), np.float16),
              FakeDeviceArray((4, k), np.float32),
              FakeDeviceArray((4, k), np.float16, strides=(k + 8, 1))]
    quant.quantize(base, "fp8", "group128")
    quant.quantize(base, "fp8", "group128")
    assert len(checked) == 1
    for i, x in enumerate(others):
        quant.quantize(x, "fp8", "group128")
        assert checked[-1] is x and len(checked) == 2 + i, f"other x {i}"
    quant.quantize(base, "fp8_e4m3", "group128")
    quant.quantize(base, "fp8", "row")
    assert len(checked) == 7 and len(quant._new_output_plans) == 7
    for x in [base] + others:  # all kept now
        quant.quantize(x, "fp8", "group128")
    assert len(checked) == 7
    monkeypatch.setattr(device, "current_device_id", lambda: 1)  # a kept plan runs only on its device
    num_calls = len(calls)
    with pytest.raises(ValueError, match="current device is 1"):
        quant.quantize(base, "fp8", "group128")
    assert len(checked) == 8 and calls[num_calls:] == []
    monkeypatch.setattr(device, "current_device_id", lambda: 0)
    with pytest.raises(TypeError, match="x has dtype"):  # a refused x keeps no plan
        quant.quantize(FakeDeviceArray((4, k), np.int32), "fp8", "group128")
    assert len(quant._new_output_plans) == 7


def test_tensor_granularity_and_untyped_arguments_keep_no_plan(keyed):
    """"tensor" runs its amax pass and zeroes a new word on every call; non-string dtype/granularity and arrays
    without a signature are checked on every call."""
    calls, checked = keyed
    x = FakeDeviceArray((4, 256), np.float16)
    for _ in range(2):
        quant.quantize(x, "fp8", "tensor")
    assert len(checked) == 2 and not quant._new_output_plans
    assert [c[1] for c in calls if c[0] == "launch"] == ["dgjit_amax", "dgjit_quantize"] * 2
    assert len([c for c in calls if c[0] == "memset"]) == 2
    assert quant._new_outputs_key(x, ["fp8"], "group128") is None
    assert quant._new_outputs_key(x, "fp8", None) is None
    assert quant._new_outputs_key(object(), "fp8", "group128") is None
    assert quant._new_outputs_key(x, "fp8", "group128") == (fake_signature(x), "fp8", "group128", FakeDeviceArray)


def test_clear_memo_and_the_bound_clear_new_output_plans(keyed, monkeypatch):
    x = FakeDeviceArray((4, 256), np.float16)
    quant.quantize(x, "fp8", "row")
    assert len(quant._new_output_plans) == 1
    monkeypatch.setattr(quant, "_MAX_PLANS", 3)
    for i in range(3):
        quant.quantize(FakeDeviceArray((5 + i, 256), np.float16), "fp8", "row")
    assert len(quant._new_output_plans) == 1  # cleared when full, then the newest kept
    monkeypatch.setattr(quant, "_plans", {("a kept out= plan",): None})
    quant.clear_memo()
    assert not quant._new_output_plans and not quant._plans
