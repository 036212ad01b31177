"""FP32-accurate GEMMs (3xTF32, deepgemm_jit/fp32x3.py) on the CPU: the Kp / K' arithmetic and the spec, rendering,
real NVRTC compiles of the split kernel and of the TF32 GEMM over K' to sm_90a (SASS checked), argument
validation before any launch, the launch sequence with the GPU replaced by recorders, and the NumPy model of the
split: exact hi/lo, TF32 values only, and a float64 product of the three TF32 terms within 1e-6 of float64.

The GPU side (kernels against the model bit for bit, and against float64 products) is tests/test_fp32x3_gpu.py.
"""
import dataclasses
import types

import jinja2
import numpy as np
import pytest

import deepgemm_jit as dg
from deepgemm_jit import compiler, config, device, fp32x3, render, sass, sm90_rules, sm90_tiles
from deepgemm_jit.arrays import matrix_view
from deepgemm_jit.errors import KernelNotCachedError, NoGPUError
from deepgemm_jit.spec import GemmSpec
from fakes import BASE, FakeDeviceArray

ARCH = "sm_90a"
LAYOUTS = ("nt", "nn", "tn", "tt")
F32 = np.float32
LOW13 = np.uint32(0x1FFF)


def bits(x):
    return np.asarray(x, dtype=F32).view(np.uint32)


@pytest.fixture
def cache(shared_cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    return shared_cache_dir


# -- Kp, K' and the spec -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("k,kp", [(1, 32), (31, 32), (32, 32), (33, 64), (129, 160), (1000, 1024), (4096, 4096),
                                  (7168, 7168)])
def test_padded_and_inner_k(k, kp):
    assert fp32x3.padded_k(k) == kp and fp32x3.inner_k(k) == 3 * kp
    spec = fp32x3.Fp32Spec.create(1000, k)
    assert (spec.k, spec.k_padded, spec.k_inner) == (k, kp, 3 * kp)
    inner = spec.inner
    assert (inner.n, inner.k, inner.dtype, inner.layout, inner.out_dtype) == (1000, 3 * kp, "tf32", "nt", "fp32")
    # The TF32 GEMM loops over K' = 3 Kp and reads [hi | lo] operands of 2 Kp (GemmSpec.hi_lo).
    assert inner.hi_lo and inner.promoted and inner.operand_k == 2 * kp
    assert inner.a_shape(5) == (5, 2 * kp) and inner.b_shape() == (1000, 2 * kp)
    # Rows of A2/B2 are whole 16-byte multiples (TMA), and K' holds whole BLOCK_K steps of the TF32 GEMM.
    assert (2 * kp * 4) % 16 == 0 and kp % fp32x3.K_ALIGN == 0
    assert fp32x3.K_ALIGN == config.sm90_config(inner, 128, 128).block_k
    assert inner.k % fp32x3.K_ALIGN == 0


def test_spec_shapes_tag_and_gemmspec_answers():
    for layout, a_shape, b_shape in (("nt", (5, 33), (7, 33)), ("nn", (5, 33), (33, 7)),
                                     ("tn", (33, 5), (33, 7)), ("tt", (33, 5), (7, 33))):
        spec = fp32x3.Fp32Spec.create(7, 33, layout=layout.upper())
        assert spec.layout == layout and spec.a_shape(5) == a_shape and spec.b_shape() == b_shape
        assert spec.out_shape(5) == (5, 7) and spec.inner.layout == "nt"
        assert spec.a_k_major == (layout[0] == "n") and spec.b_k_major == (layout[1] == "t")
    spec = fp32x3.Fp32Spec.create(7, 33)
    assert spec.tag == "gemm_fp32x3_fp32_nt_n7_k33"
    # What the bench, the baselines and the references read of a GemmSpec.
    assert (spec.dtype, spec.b_dtype, spec.b_type, spec.scaling, spec.epilogue) == ("fp32", "fp32", "fp32", "none",
                                                                                   "none")
    assert not (spec.fast_accum or spec.is_scaled or spec.promote or spec.grouped)
    assert spec.scale_shapes(5) is None and spec.epi.bias == "none" and spec.n_out == 7
    assert dataclasses.asdict(spec) == {"n": 7, "k": 33, "out_dtype": "fp32", "layout": "nt", "epilogue": "none",
                                        "dtype": "fp32"}
    assert spec == fp32x3.Fp32Spec(7, 33) and hash(spec) == hash(fp32x3.Fp32Spec(7, 33))
    bf16 = fp32x3.Fp32Spec.create(7, 33, out_dtype="bf16")
    assert bf16.out_dtype == "bf16" and bf16.inner.out_dtype == "bf16" and bf16.tag == "gemm_fp32x3_bf16_nt_n7_k33"


def test_spec_epilogues_follow_the_tf32_gemm():
    spec = fp32x3.Fp32Spec.create(64, 100, layout="tn", epilogue="gelu+bias")
    # Any layout: the TF32 GEMM always runs nt on the split operands.
    assert spec.epilogue == "bias+gelu" and spec.inner.epilogue == "bias+gelu" and spec.inner.layout == "nt"
    assert spec.tag == "gemm_fp32x3_ep_bias_gelu_fp32_tn_n64_k100"
    q = fp32x3.Fp32Spec.create(256, 100, epilogue="quant_fp8_g128")
    assert q.out_dtype == "fp8_e4m3" and q.scales_out_shape(3) == (3, 2)
    gated = fp32x3.Fp32Spec.create(64, 100, epilogue="swiglu")
    assert gated.out_shape(5) == (5, 32) and gated.n_out == 32
    with pytest.raises(ValueError, match="multiple of 16"):
        fp32x3.Fp32Spec.create(60, 100, epilogue="swiglu")
    with pytest.raises(ValueError, match="epilogue"):
        fp32x3.Fp32Spec.create(64, 100, epilogue="bias+tanh2")
    # A fix the fp32 caller can apply (it cannot pass promoted=False)
    with pytest.raises(ValueError, match="use dtype='tf32'") as info:
        fp32x3.Fp32Spec.create(256, 100, epilogue="swiglu+quant_fp8_g128")
    assert "promoted" not in str(info.value)


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(n=0, k=8), ValueError, "N must be >= 1"),
    (dict(n=8, k=0), ValueError, "K must be >= 1"),
    (dict(n=True, k=8), TypeError, "N must be an integer"),
    (dict(n=8, k=8.0), TypeError, "K must be an integer"),
    (dict(n=8, k=2**31 - 1), ValueError, "K' = 3"),
    (dict(n=8, k=8, layout="ntt"), ValueError, "layout="),
    (dict(n=8, k=8, out_dtype="int32"), ValueError, "int32"),
    (dict(n=8, k=8, out_dtype="fp64"), ValueError, "out_dtype="),
    (dict(n=8, k=8, out_dtype="fp32", epilogue="quant_fp8_g128"), ValueError, "leave out_dtype unset"),
])
def test_spec_errors(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        fp32x3.Fp32Spec.create(**kwargs)


def test_spec_refuses_other_dtypes():
    with pytest.raises(ValueError, match="fp32 operands"):
        fp32x3.Fp32Spec(8, 8, dtype="tf32")
    # fp32 stays out of the GEMM's input dtypes: GemmSpec itself still refuses it.
    with pytest.raises(ValueError, match="dtype='fp32'"):
        GemmSpec.create(8, 8, dtype="fp32")


def test_split_grid():
    assert fp32x3.num_tiles(1, 1) == 1 and fp32x3.num_tiles(32, 128) == 1 and fp32x3.num_tiles(33, 129) == 4
    assert fp32x3.split_grid(4096, 7168, 2048) == (128 * 16 + 224 * 16, 1, 1)
    assert fp32x3.split_grid(1, 7, 1) == (2, 1, 1)
    with pytest.raises(ValueError, match="blocks"):
        fp32x3.split_grid(2**31 - 1, 2**31 - 1, 2**20)


# -- rendering and compiling ------------------------------------------------------------------------------------

def test_split_kernel_spec():
    spec = fp32x3.SplitKernelSpec("tn")
    assert (spec.tag, spec.entry, spec.a_k_major, spec.b_k_major) == ("split_tf32_tn", "dgjit_split_tf32", False,
                                                                       False)
    with pytest.raises(ValueError, match="layout"):
        fp32x3.SplitKernelSpec("NT")


def test_render_every_layout():
    seen = set()
    for layout in LAYOUTS:
        spec = fp32x3.SplitKernelSpec(layout)
        src = fp32x3.render_kernel(spec)
        assert [name for name, _ in src.headers] == ["dgjit/common.cuh", "dgjit/split_tf32.cuh"], layout
        assert "{{" not in src.source and "{%" not in src.source
        assert f"constexpr bool kAKMajor = {'true' if spec.a_k_major else 'false'};" in src.source
        assert f"constexpr bool kBKMajor = {'true' if spec.b_k_major else 'false'};" in src.source
        for name in fp32x3.SYMBOLS:
            assert f"dgjit_split_tf32_{name} =" in src.source
        seen.add(src.source)
    assert len(seen) == 4
    with pytest.raises(jinja2.UndefinedError):
        render.render("split_tf32.cu.j2", "k", tag="x")  # no spec


@pytest.mark.parametrize("layout", LAYOUTS)
def test_compile_split_sm90a(layout, cache):
    """Real NVRTC compile: no local memory or spills, the exported sizes equal fp32x3.py's mirror, 16-byte stores
    of the two segments, 16-byte loads of K-major sources, shared memory only for MN-major ones, and the TF32
    rounding (cvt.rna.tf32 becomes integer add-and-mask code)."""
    spec = fp32x3.SplitKernelSpec(layout)
    art = fp32x3.get_kernel(spec, ARCH)
    usage = sass.resource_usage(art.cubin)[art.entry]
    text = sass.disassemble(art.cubin)
    case = f"{spec.tag} {art.key[:12]}"
    assert usage.get("LOCAL", 0) == 0 and usage.get("STACK", 0) == 0, case
    assert art.meta["spill_store_bytes"] == 0 and art.meta["spill_load_bytes"] == 0, case
    assert 0 < usage["REG"] <= 64, case  # 256 threads: several blocks per SM
    assert "STL" not in text and "LDL" not in text, case
    fp32x3.check_symbols(art)
    assert fp32x3.kernel_symbols(art) == {"num_threads": 256, "tile_rows": 32, "tile_cols": 128, "k_align": 32,
                                          "num_segments": 2}
    assert "STG.E.128" in text, case
    assert "0xffffe000" in text.lower(), case  # the TF32 mask
    has_mn_major = not (spec.a_k_major and spec.b_k_major)
    assert ("BAR.SYNC" in text) == has_mn_major and ("STS" in text) == has_mn_major, case
    assert (art.meta["static_smem_bytes"] > 0) == has_mn_major, case
    if spec.a_k_major or spec.b_k_major:
        assert "LDG.E.128" in text, case
    assert art.cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 129, 33), (129, 1000, 4096), (4096, 4096, 4096), (1000, 7, 129),
                                   (4096, 1000, 1)])
def test_build_fp32_compiles_both_kernels(m, n, k, cache):
    """build_fp32 without a GPU: the TF32 GEMM over K' and the split kernel compiled to sm_90a, neither with local
    memory; the Hopper family (D's rows of N * 4 bytes staged per call where TMA cannot store them)."""
    g = dg.build_fp32(m, n, k, arch=ARCH)
    case = f"{m=} {n=} {k=} {g!r}"
    assert isinstance(g, dg.Fp32Gemm) and g.spec == fp32x3.Fp32Spec.create(n, k), case
    assert g.gemm.spec == g.spec.inner_at(m, ARCH) and g.gemm.spec.k == 3 * fp32x3.padded_k(k) and g.gemm.spec.hi_lo, case
    assert g.family == g.gemm.family == "sm90", case
    assert g.config == g.gemm.config and g.arch == ARCH and g.m_hint == m, case
    assert g.split_artifact.spec == fp32x3.SplitKernelSpec("nt"), case
    info = g.explain()
    assert info["method"] == "3xtf32" and info["tag"] == g.spec.tag and info["k_inner"] == g.spec.k_inner, case
    assert info["spec"]["dtype"] == "fp32" and info["inner_spec"]["dtype"] == "tf32", case
    assert info["local_bytes"] == 0 and info["spill_bytes"] == 0, case
    # The TF32 GEMM promotes partial sums (spec.promoted): without waits injected into its pipeline.
    assert g.gemm.spec.promoted and g.gemm.spec.promote, case
    log = g.gemm.artifact.meta["log"]
    assert not compiler.serialization_warnings(log), (case, log)
    assert info["split"]["local_bytes"] == 0 and info["split"]["sass"].get("STG", 0) > 0, case
    assert "STL" not in info["sass"] and "LDL" not in info["sass"], case
    assert info["sass"].get("HGMMA", 0) > 0, case
    assert "Fp32Gemm(gemm_fp32x3_fp32_nt" in repr(g) and g.config.tag in repr(g)


def test_build_fp32_layouts_epilogue_and_config(cache):
    for layout in LAYOUTS:
        g = dg.build_fp32(256, 264, 1000, layout=layout, arch=ARCH)
        assert g.spec.layout == layout and g.gemm.spec.layout == "nt"
        assert g.split_artifact.spec.layout == layout
    g = dg.build_fp32(256, 264, 1000, layout="tn", epilogue="bias+relu", arch=ARCH)
    assert g.gemm.spec.epilogue == "bias+relu" and g.family == "sm90"
    cfg = config.sm90_config(g.spec.inner, 128, 128)
    g2 = dg.build_fp32(256, 264, 1000, epilogue="relu+bias", config=cfg, arch=ARCH)
    assert g2.config == cfg
    # At decode sizes the heuristic takes the raw-B GEMM (sm90 only); a config only the split-B GEMM takes (a
    # portable one) builds that instead of being refused for the M hint.
    assert dg.build_fp32(64, 264, 1024, arch=ARCH).raw_b
    portable = dg.KernelConfig("sm80", 64, 64, 32, 3, 2, 2, vec_a=4, vec_b=4)
    g3 = dg.build_fp32(64, 264, 1024, config=portable, arch=ARCH)
    assert g3.config == portable and not g3.raw_b
    raw_cfg = config.choose_config(g3.spec.inner_at(64, ARCH), 64, ARCH, 132)
    assert dg.build_fp32(64, 264, 1024, config=raw_cfg, arch=ARCH).raw_b  # one the raw-B GEMM takes keeps it
    with pytest.raises(ValueError, match="M must be"):
        dg.build_fp32(0, 8, 8, arch=ARCH)
    for m in (64, 1024):  # the decode path reads the config before build does (it was an AttributeError there)
        with pytest.raises(TypeError, match="config must be a deepgemm_jit.KernelConfig or None, got str"):
            dg.build_fp32(m, 264, 1024, config="x", arch=ARCH)
    with pytest.raises(ValueError, match="arch"):
        dg.build_fp32(8, 8, 8, arch="sm_70")
    if not device.gpu_count():
        with pytest.raises(NoGPUError, match="arch='sm_90a'"):
            dg.build_fp32(8, 8, 8)


def test_cache_reuse_and_offline(cache_dir, monkeypatch):
    fp32x3.clear_memo()  # the cache_dir fixture clears jit's memo, not this module's
    g = dg.build_fp32(64, 64, 100, arch=ARCH)
    assert g.split_artifact.meta["name"] == "split_tf32_nt"
    fp32x3.clear_memo()
    again = dg.build_fp32(64, 64, 100, arch=ARCH)
    assert again.split_artifact.compiled_now is False and again.split_artifact.key == g.split_artifact.key
    fp32x3.clear_memo()
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    assert dg.build_fp32(64, 64, 100, arch=ARCH).split_artifact.key == g.split_artifact.key   # from disk
    with pytest.raises(KernelNotCachedError) as info:
        dg.build_fp32(64, 64, 100, layout="tt", arch=ARCH)   # the tt split kernel was never compiled
    assert info.value.warmup_command == "deepgemm-jit warmup --arch sm_90a --shape 64:64:100:fp32:tt"
    with pytest.raises(KernelNotCachedError) as info:
        dg.build_fp32(64, 72, 100, epilogue="bias", arch=ARCH)  # a TF32 GEMM never compiled
    assert info.value.warmup_command == "deepgemm-jit warmup --arch sm_90a --shape 64:72:100:fp32:epilogue=bias"
    # The printed line compiles exactly what was missing: afterwards the offline build finds both kernels.
    from deepgemm_jit import warmup

    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "0")
    work = warmup.plan([warmup.parse_shape("64:72:100:fp32:epilogue=bias"), warmup.parse_shape("64:64:100:fp32:tt")],
                       ARCH)
    assert {warmup.kernel_type(spec) for spec, _ in work} == {"fp32 (3xtf32) bias", "fp32 (3xtf32)", "split_tf32_nt",
                                                             "split_tf32_tt"}
    assert not warmup.run(work, ARCH, jobs=1, progress=False).failed
    fp32x3.clear_memo()
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    assert dg.build_fp32(64, 72, 100, epilogue="bias", arch=ARCH).split_artifact.compiled_now is False
    assert dg.build_fp32(64, 64, 100, layout="tt", arch=ARCH).split_artifact.spec.layout == "tt"
    fp32x3.clear_memo()


# -- validation: every error before anything is launched or allocated ------------------------------------------

@pytest.fixture
def g(cache):
    return dg.build_fp32(64, 48, 40, arch=ARCH)


@pytest.fixture
def nothing_runs(monkeypatch, fake_gpu_memory):
    """Any allocation or launch fails the test: errors must come first."""
    def forbidden(*args, **kwargs):
        raise AssertionError("allocated or launched before the arguments were checked")
    monkeypatch.setattr(fp32x3, "_stream_array", forbidden)
    monkeypatch.setattr(fp32x3.runtime, "loaded_kernel", forbidden)


A_OK = dict(shape=(5, 40), ptr=BASE)
B_OK = dict(shape=(48, 40), ptr=BASE + 4096)


@pytest.mark.parametrize("a,b,exc,words", [
    (np.zeros((5, 40), F32), FakeDeviceArray((48, 40)), TypeError, "a is a NumPy"),
    (FakeDeviceArray((5, 40), np.float16), FakeDeviceArray((48, 40)), TypeError, "a has dtype float16.*float32"),
    (FakeDeviceArray((5, 40)), FakeDeviceArray((48, 40), np.float64), TypeError, "b has dtype float64"),
    (FakeDeviceArray((5, 41)), FakeDeviceArray((48, 40)), ValueError, r"a has shape \(5, 41\).*K=40"),
    (FakeDeviceArray((5, 40)), FakeDeviceArray((40, 48)), ValueError, r"b has shape \(40, 48\)"),
    (FakeDeviceArray((5, 40, 1)), FakeDeviceArray((48, 40)), ValueError, "a must be 2-D"),
    (FakeDeviceArray((5, 40), strides=(80, 2)), FakeDeviceArray((48, 40)), ValueError, "a must have unit stride"),
    (FakeDeviceArray((5, 40)), FakeDeviceArray((48, 40), strides=(20, 1)), ValueError, "b has a row stride"),
    (FakeDeviceArray((5, 40), ptr=BASE + 2), FakeDeviceArray((48, 40)), ValueError, "a data pointer"),
])
def test_operand_errors(g, nothing_runs, a, b, exc, words):
    with pytest.raises(exc, match=words):
        g(a, b)


@pytest.mark.parametrize("layout,a_shape,b_shape,words", [
    ("nn", (5, 40), (48, 40), r"b has shape \(48, 40\); layout 'nn' wants b \(K, N\) = \(40, 48\)"),
    ("tn", (5, 40), (40, 48), r"a has shape \(5, 40\); layout 'tn' wants a \(K, M\) with K=40"),
    ("tt", (40, 5), (40, 48), r"b has shape \(40, 48\); layout 'tt' wants b \(N, K\)"),
])
def test_layout_shape_errors(cache, nothing_runs, layout, a_shape, b_shape, words):
    gl = dg.build_fp32(64, 48, 40, layout=layout, arch=ARCH)
    with pytest.raises(ValueError, match=words):
        gl(FakeDeviceArray(a_shape, ptr=BASE), FakeDeviceArray(b_shape, ptr=BASE + 65536))


def test_out_and_call_errors(g, nothing_runs):
    a, b = FakeDeviceArray(**A_OK), FakeDeviceArray(**B_OK)
    out = dict(shape=(5, 48), ptr=BASE + 65536)
    cases = [
        (dict(out=FakeDeviceArray((5, 47), ptr=BASE + 65536)), ValueError, r"out has shape \(5, 47\)"),
        (dict(out=FakeDeviceArray(**out, dtype=np.float16)), TypeError, "out has dtype float16"),
        (dict(out=FakeDeviceArray((5, 48), ptr=BASE + 4096 + 64)), ValueError, "out overlaps a or b"),
        (dict(out=FakeDeviceArray((5, 48), ptr=BASE + 100)), ValueError, "out overlaps a or b"),
        (dict(out=FakeDeviceArray(**out, strides=(96, 2))), ValueError, "out must have unit stride"),
        (dict(scale_a=FakeDeviceArray((1,))), TypeError, "scale_a was given.*no scales"),
        (dict(scale_b=FakeDeviceArray((1,))), TypeError, "scale_b was given"),
        (dict(bias=FakeDeviceArray((48,))), TypeError, "bias= was given, but this Gemm's epilogue is 'none'"),
        (dict(residual=FakeDeviceArray((5, 48))), TypeError, "residual= was given"),
        (dict(alpha=2.0), TypeError, "alpha=2.0 needs the 'beta' epilogue"),
        (dict(quant_scale=FakeDeviceArray((1,))), TypeError, "quant_scale= was given"),
    ]
    for kwargs, exc, words in cases:
        with pytest.raises(exc, match=words):
            g(a, b, **kwargs)


def test_epilogue_operand_errors(cache, nothing_runs):
    ge = dg.build_fp32(64, 48, 40, epilogue="bias+residual", arch=ARCH)
    a, b = FakeDeviceArray(**A_OK), FakeDeviceArray(**B_OK)
    res = FakeDeviceArray((5, 48), ptr=BASE + 131072)
    with pytest.raises(TypeError, match="bias is required"):
        ge(a, b, residual=res)
    with pytest.raises(ValueError, match=r"bias has shape \(47,\)"):
        ge(a, b, bias=FakeDeviceArray((47,), ptr=BASE + 262144), residual=res)
    with pytest.raises(TypeError, match="residual has dtype float16"):
        ge(a, b, bias=FakeDeviceArray((48,), ptr=BASE + 262144),
           residual=FakeDeviceArray((5, 48), np.float16, ptr=BASE + 131072))
    out = FakeDeviceArray((5, 48), ptr=BASE + 65536)
    with pytest.raises(ValueError, match="out overlaps bias"):
        ge(a, b, bias=FakeDeviceArray((48,), ptr=BASE + 65536 + 8), residual=res, out=out)
    # written quantize-on-store outputs over the bias or the caller's a: refused before the split launches (they
    # were checked only by the TF32 Gemm, after the split kernel ran; review, session 60)
    gq = dg.build_fp32(64, 256, 128, epilogue="bias+quant_fp8_g128", arch=ARCH)
    aq, bq = FakeDeviceArray((5, 128), ptr=BASE), FakeDeviceArray((256, 128), ptr=BASE + (1 << 20))
    bias = FakeDeviceArray((256,), ptr=BASE + (2 << 20))
    outq = FakeDeviceArray((5, 256), np.uint8, ptr=BASE + (3 << 20))
    for ptr, words in ((BASE + (2 << 20) + 64, "scales_out overlaps bias"), (BASE + 64, "scales_out overlaps a")):
        with pytest.raises(ValueError, match=words):
            gq(aq, bq, bias=bias, out=outq, scales_out=FakeDeviceArray((5, 2), ptr=ptr))


@pytest.mark.torch
def test_mixed_array_libraries_are_refused(g, nothing_runs):
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="same array library"):
        g(torch.zeros(5, 40), FakeDeviceArray(**B_OK))


@pytest.mark.torch
def test_torch_cpu_tensors_are_refused(g, nothing_runs):
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="a is a torch tensor on cpu"):
        g(torch.zeros(5, 40), torch.zeros(48, 40))


def test_valid_call_without_gpu_is_a_clear_error(g, nothing_runs):
    if device.gpu_count():
        pytest.skip("a GPU is present")
    a, b = FakeDeviceArray(**A_OK), FakeDeviceArray(**B_OK)
    with pytest.raises(NoGPUError, match="needs a GPU"):
        g(a, b)
    with pytest.raises(NoGPUError):  # padded rows and any offset pass validation
        g(FakeDeviceArray((5, 40), ptr=BASE + 4, strides=(43, 1)), b, out=FakeDeviceArray((5, 48), ptr=BASE + 65536))
    with pytest.raises(NoGPUError):
        g.split(a, b)


# -- the launch sequence, with the GPU replaced by recorders ---------------------------------------------------

class FakeStream:
    ptr = 0x5000


@pytest.fixture
def recorded(monkeypatch, fake_gpu_memory, cache):
    """One sm_90 device; allocations at fake addresses, the split's launch and the TF32 Gemm's call recorded."""
    monkeypatch.setattr(device, "gpu_count", lambda: 1)
    monkeypatch.setattr(device, "current_device_id", lambda: 0)
    monkeypatch.setattr(device, "capability", lambda device_id=None: (9, 0))
    monkeypatch.setattr(fp32x3.runtime, "stream_for", lambda kind, stream, device_id: FakeStream())
    monkeypatch.setattr(fp32x3.runtime, "is_capturing", lambda stream: False)
    calls = []
    addresses = iter(range(0x10000000, 0x40000000, 0x1000000))

    def empty(kind, shape, name, device_id, cu_stream, is_explicit_stream):
        ptr = next(addresses)
        calls.append(("alloc", kind, shape, name, cu_stream.ptr))
        strides = (shape[1] * 4, 4)
        return types.SimpleNamespace(shape=shape, dtype=np.dtype(F32), strides=strides,
                                     data=types.SimpleNamespace(ptr=ptr)), ptr

    class Kernel:
        def bind(self, grid, block):
            return grid, block

        def launch(self, grid, block, args, stream, bound=None):
            grid, block = bound or (grid, block)
            calls.append(("launch", grid, block, args.args, stream.ptr))

    monkeypatch.setattr(fp32x3, "_stream_array", empty)
    monkeypatch.setattr(fp32x3.runtime, "loaded_kernel", lambda artifact, device_id, smem: Kernel())

    def make(*args, **kwargs):
        g = dg.build_fp32(*args, arch=ARCH, **kwargs)

        def gemm(a3, b3, *, out, stream, **ops):
            va3, vb3 = (matrix_view(x, name) for x, name in ((a3, "a3"), (b3, "b3")))
            calls.append(("gemm", (va3.ptr, va3.rows, va3.cols, va3.row_stride),
                          (vb3.ptr, vb3.rows, vb3.cols, vb3.row_stride), out, stream.ptr, ops))
            return out
        g.gemm = _Callable(gemm, g.gemm)   # its validators stay the real ones
        return g

    return make, calls


class _Callable:
    """A recorder in place of the TF32 Gemm's call; everything else is the real Gemm's."""

    def __init__(self, fn, inner):
        self._fn, self._inner = fn, inner

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_split_then_gemm_on_one_stream(recorded, layout, monkeypatch):
    make, calls = recorded
    # arrays.signature keys CuPy arrays and torch tensors only; the fakes get the same kind of key here.
    monkeypatch.setattr(fp32x3, "signature", lambda x: () if x is None else (
        x.__cuda_array_interface__["data"][0], x.shape, x.__cuda_array_interface__["strides"], x.dtype))
    m, n, k = 37, 264, 100
    g = make(m, n, k, layout=layout)
    spec = g.spec
    kp, kk = 128, 256   # the workspaces are [hi | lo]: 2 Kp columns (the GEMM's K loop runs over 3 Kp)
    a = FakeDeviceArray(spec.a_shape(m), ptr=BASE, strides=(spec.a_shape(m)[1] + 3, 1))   # padded rows
    b = FakeDeviceArray(spec.b_shape(), ptr=BASE + (1 << 22) + 4)                        # 4-byte offset base
    out = FakeDeviceArray((m, n), ptr=BASE + (1 << 24))
    assert g(a, b, out=out) is out
    (alloc_a, alloc_b, launch, gemm) = calls
    assert alloc_a[:4] == ("alloc", "cupy", (m, kk), "fp32") and alloc_b[:4] == ("alloc", "cupy", (n, kk), "fp32")
    _, grid, block, args, stream = launch
    assert grid == fp32x3.split_grid(m, n, k) == (2 * 1 + 9 * 1, 1, 1) and block == (256, 1, 1)
    a_ld = spec.a_shape(m)[1] + 3
    b_ld = spec.b_shape()[1]
    assert [int(x) for x in args] == [BASE, a_ld, BASE + (1 << 22) + 4, b_ld, 0x10000000, 0x11000000, m, n, k, kp]
    assert [x.dtype for x in args] == [np.uint64, np.int64, np.uint64, np.int64, np.uint64, np.uint64] + [np.uint32] * 4
    # The TF32 Gemm multiplies exactly the two workspaces (nt, [hi | lo] of 2 Kp, contiguous) into out, on the same
    # stream.
    _, a3, b3, gemm_out, gemm_stream, ops = gemm
    assert a3 == (0x10000000, m, kk, kk) and b3 == (0x11000000, n, kk, kk)
    assert gemm_out is out and stream == gemm_stream == FakeStream.ptr == alloc_a[4] == alloc_b[4]
    assert ops == {"bias": None, "c": None, "residual": None, "alpha": 1.0, "beta": 1.0, "quant_scale": None,
                   "amax_out": None, "scales_out": None}
    # The same operands again: the kept plan is replayed (no validation: _operands is not called), new
    # workspaces, the same split launch with their pointers, the same Gemm call.
    calls.clear()
    g._operands = None
    assert g(a, b, out=out) is out
    (alloc_a, alloc_b, launch, gemm) = calls
    assert alloc_a[:4] == ("alloc", "cupy", (m, kk), "fp32") and alloc_b[:4] == ("alloc", "cupy", (n, kk), "fp32")
    assert launch[1:3] == (grid, block) and [int(x) for x in launch[3]] == [
        BASE, a_ld, BASE + (1 << 22) + 4, b_ld, 0x12000000, 0x13000000, m, n, k, kp]
    assert gemm[1] == (0x12000000, m, kk, kk) and gemm[2] == (0x13000000, n, kk, kk) and gemm[3] is out


def test_epilogue_operands_are_passed_through_and_m_zero_launches_nothing(recorded):
    make, calls = recorded
    g = make(64, 48, 40, epilogue="beta+bias")
    a, b = FakeDeviceArray((5, 40), ptr=BASE), FakeDeviceArray((48, 40), ptr=BASE + 4096)
    bias, c = FakeDeviceArray((48,), ptr=BASE + 8192), FakeDeviceArray((5, 48), ptr=BASE + 16384)
    out = FakeDeviceArray((5, 48), ptr=BASE + 32768)
    g(a, b, bias=bias, c=c, alpha=0.5, beta=2.0, out=out)
    ops = calls[-1][-1]
    assert ops["bias"] is bias and ops["c"] is c and (ops["alpha"], ops["beta"]) == (0.5, 2.0)
    calls.clear()
    g(FakeDeviceArray((0, 40), ptr=BASE), b, bias=bias, c=FakeDeviceArray((0, 48), ptr=BASE + 16384),
      out=FakeDeviceArray((0, 48), ptr=BASE + 32768))
    assert [c_[0] for c_ in calls] == ["alloc", "alloc", "gemm"]   # the Gemm returns at once for M = 0


def test_captured_call_keeps_its_split_workspaces(recorded, monkeypatch):
    """review: a call captured on a CuPy stream let A2 / B2 go back to the pool on return while the graph replays
    into their addresses; they are now kept (outside a capture they are not)."""
    make, calls = recorded
    monkeypatch.setattr(fp32x3.runtime, "_kept_for_graphs", [])
    g = make(512, 264, 100)  # K = 100: A and B are both split (no raw-B form)
    a, b = FakeDeviceArray((37, 100), ptr=BASE), FakeDeviceArray((264, 100), ptr=BASE + (1 << 22))
    out = FakeDeviceArray((37, 264), ptr=BASE + (1 << 24))
    g(a, b, out=out)
    assert fp32x3.runtime._kept_for_graphs == []
    monkeypatch.setattr(fp32x3.runtime, "is_capturing", lambda stream: True)
    g(a, b, out=out)
    ((a2, b2),) = fp32x3.runtime._kept_for_graphs
    split = [c for c in calls if c[0] == "launch"][-1]
    assert (int(split[3][4]), int(split[3][5])) == (a2.data.ptr, b2.data.ptr)  # the very buffers the split writes


def test_split_method_returns_the_workspaces(recorded):
    make, calls = recorded
    g = make(8, 16, 8)
    a2, b2 = g.split(FakeDeviceArray((3, 8), ptr=BASE), FakeDeviceArray((16, 8), ptr=BASE + 4096))
    assert a2.shape == (3, 64) and b2.shape == (16, 64)   # [hi | lo], Kp = 32
    assert (a2.shape, b2.shape) == (g.gemm.spec.a_shape(3), g.gemm.spec.b_shape())   # what the TF32 Gemm takes
    assert [c_[0] for c_ in calls] == ["alloc", "alloc", "launch"]


# -- the model of the split: exact, TF32 only, FP32-accurate products -------------------------------------------

def spread_values(rng, n):
    """Normal values over many binades, plus subnormals and values near FLT_MAX."""
    scales = 2.0 ** rng.integers(-120, 120, n)
    x = (rng.standard_normal(n) * scales).astype(F32)
    tiny = (rng.standard_normal(64) * 1e-40).astype(F32)       # subnormal
    huge = (rng.standard_normal(64) * 1e37).astype(F32)   # up to ~5e37 < FLT_MAX
    return np.concatenate([x, tiny, huge, np.array([0.0, -0.0, 1.0, -1.0, 3.0, 1 / 3], F32)])


def test_round_tf32_is_nearest_ties_away():
    rng = np.random.default_rng(0)
    x = spread_values(rng, 20000)
    r = fp32x3.round_tf32(x)
    assert np.all(bits(r) & LOW13 == 0)
    # Nearest: no TF32 neighbour is closer (the neighbours are r +- one TF32 ulp, i.e. bit pattern +- 0x2000).
    x64, r64 = x.astype(np.float64), r.astype(np.float64)
    for step in (0x2000, -0x2000):
        neighbour = (bits(r).astype(np.int64) + step).astype(np.uint32).view(F32).astype(np.float64)
        ok = np.isfinite(neighbour)
        assert np.all(np.abs(x64 - r64)[ok] <= np.abs(x64 - neighbour)[ok])
    # Ties go away from zero: 1 + 2^-11 (exactly half a TF32 ulp above 1) -> 1 + 2^-10.
    ties = np.array([1 + 2.0**-11, -(1 + 2.0**-11), 1 + 3 * 2.0**-11], F32)
    np.testing.assert_array_equal(fp32x3.round_tf32(ties), np.array([1 + 2.0**-10, -(1 + 2.0**-10), 1 + 2.0**-9], F32))
    np.testing.assert_array_equal(fp32x3.round_tf32(r), r)   # idempotent


def test_split_is_exact_and_tf32_only():
    rng = np.random.default_rng(1)
    x = spread_values(rng, 50000)
    hi, lo = fp32x3.split_reference(x)
    assert hi.dtype == F32 and lo.dtype == F32
    assert np.all(bits(hi) & LOW13 == 0) and np.all(bits(lo) & LOW13 == 0)     # both are TF32 values
    x64, hi64 = x.astype(np.float64), hi.astype(np.float64)
    lo_exact = x - hi                                                            # float32 arithmetic...
    np.testing.assert_array_equal(lo_exact.astype(np.float64), x64 - hi64)     # ...is exact: hi + lo == x
    assert np.all(hi64 + lo_exact.astype(np.float64) == x64)
    # hi: within half a TF32 ulp (2^-137 absolute among subnormals, whose TF32 ulp is 0x2000 * 2^-149).
    assert np.all(np.abs(x64 - hi64) <= 2.0**-11 * np.abs(x64) + 2.0**-137)
    np.testing.assert_array_equal(lo, fp32x3.round_tf32(lo_exact))               # lo: the rounded remainder
    err = np.abs(x64 - hi64 - lo.astype(np.float64))
    assert np.all(err <= 2.0**-22 * np.abs(x64) + 2.0**-137)                    # hi + lo: 22 bits of x
    wide = np.abs(x64) >= 2.0**-115   # lo normal or its TF32 ulp below 2^-22 |x|: purely relative
    assert wide.sum() > 40000 and np.all(err[wide] <= 2.0**-22 * np.abs(x64[wide]))


def test_tf32_nearest_is_rna_kept_finite():
    """The kernels' TF32 conversion (dgjit/common.cuh tf32_nearest): round_tf32 wherever that stays finite; values
    rna would carry into inf are truncated; inf stays inf, and a NaN with its payload in the dropped bits becomes inf
    as the tensor cores read it (the split adds the quiet bit: test_split_special_values)."""
    rng = np.random.default_rng(2)
    x = spread_values(rng, 20000)
    np.testing.assert_array_equal(bits(fp32x3.tf32_nearest(x)), bits(fp32x3.round_tf32(x)))
    near_max = np.array([0x7F7FF000, 0x7F7FFFFF, 0xFF7FF000, 0x7F7FEFFF, 0x7F7FE000], np.uint32).view(F32)
    np.testing.assert_array_equal(bits(fp32x3.tf32_nearest(near_max)),
                                  np.array([0x7F7FE000, 0x7F7FE000, 0xFF7FE000, 0x7F7FE000, 0x7F7FE000], np.uint32))
    assert np.isinf(fp32x3.round_tf32(near_max[:3])).all()   # what plain rna gives
    special = np.array([0x7F800000, 0xFF800000, 0x7F800001, 0xFF801FFF, 0x7FC00000], np.uint32).view(F32)
    got = fp32x3.tf32_nearest(special)
    np.testing.assert_array_equal(bits(got), np.array([0x7F800000, 0xFF800000, 0x7F800000, 0xFF800000, 0x7FC00000],
                                                      np.uint32))


def test_split_special_values():
    flt_max = np.finfo(F32).max
    specials = np.array([np.inf, -np.inf, np.nan, flt_max, -flt_max, 0.0, -0.0, 1e-45], F32)
    payload_nan = np.array([0x7F800001, 0xFF801000, 0x7FC00000], np.uint32).view(F32)
    hi, lo = fp32x3.split_reference(np.concatenate([specials, payload_nan]))
    assert hi[0] == np.inf and hi[1] == -np.inf and lo[0] == 0 and lo[1] == 0
    # NaNs stay NaN as TF32 values (a payload only in the dropped bits would read as inf on the tensor cores).
    nans = np.r_[2, 8, 9, 10]
    assert np.all(np.isnan(hi[nans])) and np.all(bits(hi[nans]) & LOW13 == 0) and np.all(lo[nans] == 0)
    # FLT_MAX: rna would give inf; truncation keeps hi finite and lo carries the rest exactly.
    assert bits(hi[3]) == 0x7F7FE000 and hi[4] == -hi[3]
    assert lo[3] > 0 and lo[3] == fp32x3.round_tf32(np.array([flt_max - hi[3]], F32))[0] and lo[4] == -lo[3]
    assert bits(hi[5]) == 0 and bits(hi[6]) == 0x80000000 and lo[5] == 0
    assert hi[7] == 0 and lo[7] == 0   # 2^-149 is below half a TF32 ulp of the subnormal range: rounds to 0


@pytest.mark.parametrize("m,n,k", [(7, 129, 1), (33, 17, 33), (64, 48, 1000), (16, 16, 4096)])
def test_three_tf32_terms_are_fp32_accurate(m, n, k):
    """The float64 product of the split operands (what exact TF32 tensor cores would compute) against the float64
    product of the FP32 inputs: < 1e-6 (the bound for the GPU is 1e-5, FP32 accumulation included); one TF32
    term alone is ~1e-4, so the check can fail."""
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((m, k)).astype(F32)
    b = rng.standard_normal((n, k)).astype(F32)
    exact = a.astype(np.float64) @ b.astype(np.float64).T
    norm = np.linalg.norm(exact)
    a2 = fp32x3.split_operand_reference(a, fp32x3.LO_SEGMENT_A)
    b2 = fp32x3.split_operand_reference(b, fp32x3.LO_SEGMENT_B)
    kp = fp32x3.padded_k(k)
    assert a2.shape == (m, 2 * kp) and b2.shape == (n, 2 * kp)
    for seg in range(2):                                   # zero padding of every segment
        assert not a2[:, seg * kp + k:(seg + 1) * kp].any() and not b2[:, seg * kp + k:(seg + 1) * kp].any()
    hi_a, lo_a = fp32x3.split_reference(a)
    np.testing.assert_array_equal(a2[:, :k], hi_a)
    np.testing.assert_array_equal(a2[:, kp:kp + k], lo_a)
    err3 = np.linalg.norm(fp32x3.hi_lo_product_reference(a2, b2) - exact) / norm
    assert err3 < 1e-6, f"{m=} {n=} {k=} {err3=:.2e}"
    # The brief's model: lo kept exact and truncated (not rounded) to TF32 by the tensor cores.
    trunc = lambda x: (bits(x) & np.uint32(0xFFFFE000)).view(F32).astype(np.float64)  # noqa: E731
    ah, bh = hi_a.astype(np.float64), fp32x3.split_reference(b)[0].astype(np.float64)
    al, bl = trunc(a - hi_a), trunc(b - fp32x3.split_reference(b)[0])
    err_trunc = np.linalg.norm(ah @ bh.T + ah @ bl.T + al @ bh.T - exact) / norm
    assert err_trunc < 1e-6, f"{m=} {n=} {k=} {err_trunc=:.2e}"
    err1 = np.linalg.norm(ah @ bh.T - exact) / norm
    assert err1 > 50 * err3, f"one TF32 term {err1:.2e} vs three {err3:.2e}"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_reference_operands_do_not_depend_on_the_layout(layout):
    rng = np.random.default_rng(3)
    a_mk = rng.standard_normal((9, 70)).astype(F32)
    b_nk = rng.standard_normal((5, 70)).astype(F32)
    spec = fp32x3.Fp32Spec.create(5, 70, layout=layout)
    a = a_mk if spec.a_k_major else np.ascontiguousarray(a_mk.T)
    b = b_nk if spec.b_k_major else np.ascontiguousarray(b_nk.T)
    a3, b3 = fp32x3.split_operands_reference(spec, a, b)
    want_a3, want_b3 = fp32x3.split_operands_reference(fp32x3.Fp32Spec.create(5, 70), a_mk, b_nk)
    np.testing.assert_array_equal(a3.view(np.uint32), want_a3.view(np.uint32))
    np.testing.assert_array_equal(b3.view(np.uint32), want_b3.view(np.uint32))


@pytest.mark.parametrize("kwargs,named", [(dict(split_k=2), "split_k"), (dict(promoted=True), "promoted"),
                                          (dict(scaling="tensor", fast_accum=True), "scaling, fast_accum"),
                                          (dict(weight_streaming=True), "weight_streaming"),
                                          (dict(b_dtype="bf16"), "b_dtype")])
def test_build_fp32_refuses_options_it_would_ignore(kwargs, named):
    """build(dtype='fp32') names every option the 3xTF32 path has no use for instead of dropping it."""
    with pytest.raises(ValueError, match=f"takes no {named}"):
        dg.build(64, 64, 64, dtype="fp32", arch=ARCH, **kwargs)


def test_hi_lo_spec_rules_and_k_order():
    """GemmSpec.hi_lo: only 3xTF32's inner GEMM (promoted TF32, nt, K in whole segments of K blocks); the kernel's
    K blocks 3j + s read (hi, hi), (hi, lo), (lo, hi) of block j, whose sum hi_lo_product_reference computes."""
    spec = GemmSpec(1024, 3 * 4096, "tf32", "fp32", "nt", promoted=True, hi_lo=True)
    assert spec.operand_k == 2 * 4096 and spec.tag.endswith("_n1024_k12288") and "_hilo" in spec.tag
    for kwargs in (dict(promoted=False), dict(k=3 * 4096 + 32), dict(dtype="bf16", out_dtype="bf16"),
                   dict(layout="nn")):
        args = dict(n=1024, k=3 * 4096, dtype="tf32", out_dtype="fp32", layout="nt", promoted=True, hi_lo=True)
        args.update(kwargs)
        if args["dtype"] != "tf32":
            args["promoted"] = False
        with pytest.raises(ValueError, match="hi_lo"):
            GemmSpec(**args)
    rng = np.random.default_rng(5)
    kp = 64
    a2 = rng.standard_normal((3, 2 * kp)).astype(F32)
    b2 = rng.standard_normal((4, 2 * kp)).astype(F32)
    got = fp32x3.hi_lo_product_reference(a2, b2)
    blocks = [(a2[:, c:c + 32], b2[:, d:d + 32]) for j in range(kp // 32)
              for c, d in ((32 * j, 32 * j), (32 * j, kp + 32 * j), (kp + 32 * j, 32 * j))]
    want = sum(x.astype(np.float64) @ y.astype(np.float64).T for x, y in blocks)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_raw_b_rule_and_spec(cache, monkeypatch):
    """At decode sizes build_fp32's TF32 GEMM reads the caller's weight itself (GemmSpec.raw_b: B (N, K/3) raw FP32,
    its lo made in shared memory), where B is K-major, K a multiple of 32 and the Hopper family takes the spec;
    elsewhere both operands are split as before. The raw_b kernel: no local memory, nothing serialised, each stage's
    three products (4 K steps each) issued from one stage, two stages per promotion, and no barrier over the
    consumers for the lo conversion (the converter warps announce it on the stage's lo_full barrier)."""
    g = dg.build_fp32(64, 7168, 2048, arch=ARCH)
    assert g.raw_b and g.gemm.spec == dataclasses.replace(g.spec.inner, raw_b=True) and g.family == "sm90"
    assert g.gemm.spec.b_shape() == (7168, 2048) and g.gemm.spec.a_shape(64) == (64, 4096)
    assert g.gemm.spec.tag.endswith("_promoted_hilo_rawb_fp32_nt_n7168_k6144")
    usage = sass.resource_usage(g.gemm.artifact.cubin)[g.gemm.artifact.entry]
    assert usage.get("LOCAL", 0) == 0 and usage.get("STACK", 0) == 0
    log = g.gemm.artifact.meta["log"]
    assert not compiler.serialization_warnings(log), log
    text = sass.disassemble(g.gemm.artifact.cubin)
    assert text.count("HGMMA.64x") == 2 * 3 * 4 and "BAR.SYNC.DEFER_BLOCKING 0x7" not in text
    assert g.explain(with_sass=False)["raw_b"] is True
    assert dg.build_fp32(128, 7168, 2048, layout="tt", arch=ARCH).raw_b           # tt: B is K-major too
    assert dg.build_fp32(64, 7170, 2048, arch=ARCH).raw_b  # N % 4: D's rows staged per call (Gemm._stages)
    for m, n, k, layout in ((4096, 7168, 2048, "nt"), (513, 7168, 2048, "nt"), (64, 7168, 2000, "nt"),
                            (64, 7168, 2048, "nn")):  # large M, K % 32, MN-major B
        g = dg.build_fp32(m, n, k, layout=layout, arch=ARCH)
        assert not g.raw_b and g.gemm.spec == g.spec.inner, (m, n, k, layout)
    monkeypatch.setenv("DEEPGEMM_JIT_NO_RAW_B", "1")
    assert not dg.build_fp32(64, 7168, 2048, arch=ARCH).raw_b
    with pytest.raises(ValueError, match="hi_lo=True"):
        GemmSpec(7168, 6144, "tf32", "fp32", promoted=True, raw_b=True)
    raw = dataclasses.replace(fp32x3.Fp32Spec.create(7168, 2048).inner, raw_b=True)
    with pytest.raises(ValueError, match="need a Hopper GPU"):
        config.choose_config(raw, 64, "sm_80")
    with pytest.raises(ValueError, match="sm90 family only"):
        config.choose_sm80_config(raw, 64, "sm_80")


def test_warmup_plans_the_raw_b_gemm_at_decode_buckets():
    from deepgemm_jit import warmup

    entry = warmup.parse_shape("1-4096:7168:2048:fp32")
    by_mode: dict[bool, set[int]] = {True: set(), False: set()}
    for (spec, _), buckets in warmup.plan_buckets([entry], ARCH).items():
        by_mode[spec.raw_b].update(buckets)
    assert by_mode[True] == {64, 128, 192, 256, 320, 384, 512} and min(by_mode[False]) == 640, by_mode  # next bucket


def test_raw_b_gemm_warms_up_for_offline_builds(cache_dir, monkeypatch):
    """Offline, a decode-size build_fp32 needs the raw_b TF32 GEMM: the warmup line its error prints compiles it
    (and the split GEMM of the large buckets), after which both builds find their kernels on disk."""
    from deepgemm_jit import warmup

    fp32x3.clear_memo()
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    with pytest.raises(KernelNotCachedError) as info:
        dg.build_fp32(64, 7168, 2048, arch=ARCH)
    assert info.value.warmup_command == "deepgemm-jit warmup --arch sm_90a --shape 64:7168:2048:fp32"
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "0")
    work = warmup.plan([warmup.parse_shape("64:7168:2048:fp32"), warmup.parse_shape("4096:7168:2048:fp32")], ARCH)
    assert sorted(spec.raw_b for spec, _ in work if isinstance(spec, GemmSpec)) == [False, True]
    assert not warmup.run(work, ARCH, jobs=1, progress=False).failed
    fp32x3.clear_memo()
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    small, large = dg.build_fp32(64, 7168, 2048, arch=ARCH), dg.build_fp32(4096, 7168, 2048, arch=ARCH)
    assert small.raw_b and not large.raw_b and small.gemm.artifact.compiled_now is False
    fp32x3.clear_memo()



@pytest.mark.parametrize("m,n,k,tile,splits", [
    # H200 session 16 (bench/results/*exp-fp32-raw-b-tiles-s16*, *rule-m256-512-s16*): the measured best, or the
    # tile that ran faster than the old pick where the best was not in the sweep.
    (64, 7168, 16384, (64, 112), 2),     # 177.8 us; the compute-centric model's 64x56 unsplit ran 227.9
    (128, 7168, 16384, (128, 112), 2),   # 288.8; 64x112 unsplit 322.7
    (64, 7168, 2048, (64, 112), 2),      # 35.2; 64x56 39.2
    (128, 2112, 7168, (128, 96), 6),     # 56.7; 128x64 x4 63.6
    (128, 32768, 512, (128, 128), 1),    # 53.1; 64x128 56.6
    (512, 2112, 7168, (128, 64), 1),     # 201.9; 128x96 (88 CTAs) 218.3
])
def test_raw_b_tile_rule_picks_the_measured_tiles(m, n, k, tile, splits):
    """The raw-B GEMM's tile and split count (sm90_cost.raw_b_tile_cost) on rows where the H200 measured them."""
    from deepgemm_jit import splitk

    spec = fp32x3.Fp32Spec.create(n, k).inner_at(m, ARCH)
    assert spec.raw_b and spec.loop_k == k
    cfg = config.choose_sm90_config(spec, m, 132)
    assert (cfg.block_m, cfg.block_n) == tile, cfg.tag
    assert splitk.num_splits(spec, cfg, m, 132) == splits, cfg.tag
    assert cfg.smem_bytes(spec) <= sm90_tiles.SM90_SMEM_BUDGET_BYTES
    if cfg.block_n >= 96:  # D leaves through the ring at every M here (unpromoted TF32 keeps it to M >= 256)
        assert cfg.d_ring == sm90_rules.SM90_D_RING, cfg.tag


def _cupy_over(shape, ptr):
    """A CuPy float32 array over a made-up device address (views only read metadata: no GPU needed)."""
    import cupy

    size = max(4 * int(np.prod(shape)), 1)
    memory = cupy.cuda.memory.UnownedMemory(ptr, size, None, device_id=0)
    return cupy.ndarray(shape, np.float32, cupy.cuda.memory.MemoryPointer(memory, 0))


def test_raw_b_call_of_another_producer_without_out(recorded, monkeypatch):
    """A raw-B GEMM (M <= 512: B goes to the TF32 Gemm as it is) called with CUDA-array-interface arrays and no
    out=: out is allocated as CuPy, so b reaches the TF32 Gemm as a CuPy view of its memory (the Gemm takes a, b and
    out from one library; before, it raised a TypeError blaming arrays the caller never passed)."""
    from deepgemm_jit import api

    make, calls = recorded
    g = make(64, 256, 128)
    assert g.raw_b
    seen = []
    monkeypatch.setattr(fp32x3, "new_array", lambda kind, shape, name, dev, *rest: _cupy_over(shape, 0x50000000))
    monkeypatch.setattr(fp32x3, "_cupy_view", lambda x: seen.append(x) or _cupy_over(
        x.shape, x.__cuda_array_interface__["data"][0]))
    monkeypatch.setattr(fp32x3, "_stream_array", lambda kind, shape, name, dev, s, e: (
        _cupy_over(shape, 0x10000000), 0x10000000))

    def gemm(a3, b3, *, out, stream, **ops):
        calls.append(("gemm", api._common_kind(a3, b3, out), b3.data.ptr))
        return out
    g.gemm = _Callable(gemm, g.gemm)
    a, b = FakeDeviceArray((8, 128), ptr=BASE), FakeDeviceArray((256, 128), ptr=BASE + (1 << 22))
    out = g(a, b)
    assert out.shape == (8, 256) and seen == [b]
    assert calls[-1] == ("gemm", "cupy", BASE + (1 << 22))   # b's own memory, no copy
