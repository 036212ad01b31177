"""The weight-streaming (decode) kernel on the CPU: its spec, the dispatch rule, the launch shape, rendering, and
real NVRTC compiles to sm_90a with SASS checks (tensor-core MMAs, streaming loads, no local memory).

The GPU side (results against float64 references, graphs, dispatch from Gemm.__call__) is tests/test_gemv_gpu.py.
"""
import jinja2
import numpy as np
import pytest

from deepgemm_jit import GemmSpec, build, cubin, gemv, render, sass
from deepgemm_jit.arrays import MatrixView

ARCH = "sm_90a"
S = gemv.GemvSpec


# -- spec ---------------------------------------------------------------------------------------------------

def test_spec_tags_and_for_gemm():
    assert S("bf16", "bf16", "bf16").tag == "gemv_bf16_bf16_t1"
    assert S("fp8_e5m2", "fp8_e4m3", "fp32", "row", 2).tag == "gemv_fp8_e4m3xfp8_e5m2_row_fp32_t2"
    spec = GemmSpec.create(7168, 2048, "fp8", scaling="block")
    assert gemv.GemvSpec.for_gemm(spec, 1) == S("fp8_e4m3", "fp8_e4m3", "bf16", "block", 1)
    assert gemv.GemvSpec.for_gemm(spec, 8).token_tiles == 1 and gemv.GemvSpec.for_gemm(spec, 9).token_tiles == 2
    assert gemv.GemvSpec.for_gemm(spec, 16).max_m == 16


@pytest.mark.parametrize("kwargs", [
    dict(w_dtype="tf32", x_dtype="tf32", out_dtype="fp32"),
    dict(w_dtype="int8", x_dtype="int8", out_dtype="int32"),
    dict(w_dtype="bf16", x_dtype="fp16", out_dtype="bf16"),
    dict(w_dtype="bf16", x_dtype="fp8_e4m3", out_dtype="bf16", scaling="tensor"),
    dict(w_dtype="bf16", x_dtype="bf16", out_dtype="bf16", scaling="row"),
    dict(w_dtype="fp8_e4m3", x_dtype="fp8_e4m3", out_dtype="bf16"),
    dict(w_dtype="fp8_e4m3", x_dtype="fp8_e4m3", out_dtype="int32", scaling="row"),
    dict(w_dtype="bf16", x_dtype="bf16", out_dtype="bf16", token_tiles=3),
    dict(w_dtype="bf16", x_dtype="bf16", out_dtype="bf16", token_tiles=True),
])
def test_spec_rejections(kwargs):
    with pytest.raises(ValueError):
        S(**kwargs)


# -- dispatch rule --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,arch,expected", [
    (dict(dtype="bf16"), ARCH, 8),                       # the Hopper tiles from 9 rows on
    (dict(dtype="fp16", out_dtype="fp32"), ARCH, 8),
    (dict(dtype="fp8", scaling="block"), ARCH, 8),
    (dict(dtype="fp8", scaling="tensor", fast_accum=True), ARCH, 8),
    (dict(dtype="fp8_e4m3", b_dtype="fp8_e5m2", scaling="row"), ARCH, 8),
    (dict(dtype="bf16", layout="nn"), ARCH, 0),          # weights must be (N, K) row-major
    (dict(dtype="bf16", layout="tt"), ARCH, 0),
    (dict(dtype="bf16", epilogue="bias+gelu"), ARCH, 0),  # epilogues stay in the sm90 kernel
    (dict(dtype="tf32"), ARCH, 0),
    (dict(dtype="int8"), ARCH, 0),
    (dict(dtype="int8", scaling="row"), ARCH, 0),
    (dict(dtype="bf16"), "sm_80", 0),                     # only Hopper is measured
])
def test_dispatch_rule(kwargs, arch, expected):
    spec = GemmSpec.create(2112, 7168, **kwargs)
    _check_rule(spec, arch, expected)


@pytest.mark.parametrize("dtype,n,k,expected", [
    ("bf16", 7168, 16384, 2), ("bf16", 7168, 2048, 2), ("fp16", 24576, 2048, 2),   # tiles from M = 3 (row sweep to 2)
    ("bf16", 24576, 1536, 8), ("bf16", 7167, 16384, 8), ("bf16", 4096, 7168, 8), ("bf16", 2112, 7168, 8),
    ("fp8", 24576, 1536, 0), ("fp8", 7168, 16384, 1), ("fp8", 7168, 2048, 1),
    ("fp8", 24576, 1535, 8), ("fp8", 32768, 512, 0), ("fp8", 32768, 528, 8), ("fp8", 4096, 512, 8),
    ("fp8", 4096, 7168, 8), ("fp8", 2112, 7168, 8), ("bf16", 32768, 512, 8),
])
def test_dispatch_rule_large_weights_take_the_tiles(dtype, n, k, expected):
    """N >= 7168 with K >= 2048 (16-bit) or >= 1536 (FP8), or FP8 with K <= 512: the Hopper tiles, which load B
    evict-first (64x64 at short K), were faster than the mma.sync kernel at M = 1 and 8 on the H200
    (gemv.TILES_MIN_N, gemv.TILES_MAX_SHORT_K_FP8); 16-bit M <= 2 and FP8 M = 1 run the row sweep (gemv_rows.py)."""
    for scaling in (("tensor", "block") if dtype == "fp8" else (None,)):
        spec = GemmSpec.create(n, k, dtype=dtype, scaling=scaling)
        _check_rule(spec, ARCH, expected)
        assert gemv.mma_max_m(spec, ARCH) == (0 if expected <= 2 else expected)


def _check_rule(spec, arch, expected):
    assert gemv.max_m(spec, arch) == expected
    for m in (1, 8, 13, 16):
        assert gemv.use_weight_streaming(spec, m, arch) == (m <= expected)
    for m in (0, 17, 64, 4096):
        assert not gemv.use_weight_streaming(spec, m, arch)


def _view(ptr, rows, cols, stride, dtype=np.uint16):
    return MatrixView(ptr=ptr, rows=rows, cols=cols, row_stride=stride, dtype=np.dtype(dtype), device=0)


def test_operands_fit_needs_16_byte_rows():
    base = 1 << 20
    assert gemv.operands_fit(_view(base, 4, 520, 520), _view(base, 7, 520, 520))
    assert gemv.operands_fit(_view(base, 1, 7, 7), _view(base, 7, 7, 8))          # one row of A: no pitch
    assert not gemv.operands_fit(_view(base, 2, 7, 7), _view(base, 7, 7, 8))      # A pitch 14 bytes
    assert not gemv.operands_fit(_view(base, 1, 8, 8), _view(base, 7, 7, 7))      # B pitch 14 bytes
    assert not gemv.operands_fit(_view(base + 2, 1, 8, 8), _view(base, 7, 8, 8))  # misaligned base
    assert gemv.operands_fit(_view(base, 3, 24, 32, np.uint8), _view(base, 5, 24, 32, np.uint8))


def test_build_switch():
    g = build(1, 2112, 7168, dtype="bf16", arch=ARCH)
    assert g.weight_streaming_max_m == 8
    assert build(1, 2112, 7168, dtype="bf16", arch=ARCH, weight_streaming=False).weight_streaming_max_m == 0
    forced = build(1, 2112, 7168, dtype="bf16", arch=ARCH, config=g.config)
    assert forced.weight_streaming_max_m == 0  # a forced config means that kernel (tuning, bench sweeps)
    info = g.explain()["weight_streaming"]
    assert info["max_m"] == 8 and info["kernels"] == ["gemv_bf16_bf16_t1", "gemv_rows_bf16_bf16_m1_224x4",
                                                      "gemv_rows_bf16_bf16_m2_224x4"]
    assert info["row_sweep"]["max_m"] == 2 and info["row_sweep"]["grid"] == 4 * 132
    fp8 = build(1, 2112, 7168, dtype="fp8", arch=ARCH).explain()["weight_streaming"]
    assert fp8["max_m"] == 8
    assert fp8["kernels"] == ["gemv_fp8_e4m3_block_bf16_t1", "gemv_rows_fp8_e4m3_block_bf16_m1_224x2"]
    assert info["grid"] == 132 and info["warps_k"] == 8
    # 7168 rows: 448 row blocks in one wave of 2 x 132 CTAs at warps_k 4 (BF16), of 132 at 2 (FP8, one per SM).
    assert build(1, 7168, 1536, dtype="bf16", arch=ARCH).explain()["weight_streaming"]["warps_k"] == 4
    assert build(1, 7168, 1024, dtype="fp8", arch=ARCH).explain()["weight_streaming"]["warps_k"] == 2
    rows_only = build(1, 7168, 16384, dtype="bf16", arch=ARCH).explain()["weight_streaming"]
    assert rows_only["max_m"] == 2
    assert rows_only["kernels"] == ["gemv_rows_bf16_bf16_m1_512x4", "gemv_rows_bf16_bf16_m2_512x4"]
    assert rows_only["row_sweep"] == {"max_m": 2, "tag": "gemv_rows_bf16_bf16_m1_512x4", "num_threads": 512,
                                      "chunks": 4, "grid": 264} and "warps_k" not in rows_only
    assert build(1, 7168, 16384, dtype="fp8", arch=ARCH).explain()["weight_streaming"]["max_m"] == 1
    assert build(1, 24576, 1536, dtype="fp8", arch=ARCH).explain()["weight_streaming"]["max_m"] == 0


def test_split_and_grid():
    # K split across the warps of a CTA only while each warp keeps >= 2 steps of 256 bytes per row.
    assert gemv.choose_warps_k(16384, 2) == 8 and gemv.choose_warps_k(1536, 2) == 4
    assert gemv.choose_warps_k(512, 2) == 2 and gemv.choose_warps_k(512, 1) == 1
    assert gemv.choose_warps_k(8, 2) == 1 and gemv.choose_warps_k(1, 1) == 1
    assert gemv.grid_size(7168, 8) == 448 and gemv.grid_size(2112, 8) == 132
    assert gemv.grid_size(1, 1) == 1 and gemv.grid_size(129, 1) == 2 and gemv.grid_size(32768, 2) == 512
    assert 55 < gemv.predicted_us(7168, 16384, 2, 4.0) < 60


def test_warps_k_keeps_the_grid_in_one_wave():
    # Given the CTAs the GPU holds at once, the largest warps_k (up to the K-step rule's) whose grid fits them.
    bf16, fp8 = 2 * 132, 132  # ctas_per_sm 2 (16-bit, one token tile) and 1 (FP8) on 132 SMs
    assert gemv.choose_warps_k(16384, 2, 7168, bf16) == 4 and gemv.grid_size(7168, 4) == 224
    assert gemv.choose_warps_k(16384, 1, 7168, fp8) == 2 and gemv.grid_size(7168, 2) == 112
    assert gemv.choose_warps_k(7168, 1, 4096, fp8) == 4 and gemv.grid_size(4096, 4) == 128
    assert gemv.choose_warps_k(7168, 2, 4096, bf16) == 8 and gemv.choose_warps_k(7168, 2, 2112, bf16) == 8
    # Not below 2 warps per row block (measured slower): 24576 x 1536 would fit one wave of 192 CTAs at 1.
    assert gemv.choose_warps_k(1536, 2, 24576, bf16) == 4 and gemv.choose_warps_k(512, 2, 32768, bf16) == 2
    assert gemv.choose_warps_k(256, 2, 16, bf16) == 1  # the K-step rule's 1 stands
    # Nothing fits one wave (24576 rows, K = 1536 FP8: 192 CTAs even at 1): the K-step rule's answer.
    assert gemv.choose_warps_k(1536, 1, 24576, fp8) == gemv.choose_warps_k(1536, 1) == 2
    # Never more warps on K than the K-step rule allows, whatever the grid.
    assert gemv.choose_warps_k(512, 2, 16, bf16) == 2


def test_ctas_per_sm_reaches_the_launch_bounds():
    # The grid rule counts on GemvSpec.ctas_per_sm; the kernel is compiled with it as __launch_bounds__' minimum.
    cases = [(gemv.GemvSpec("bf16", "bf16", "bf16"), 2), (gemv.GemvSpec("bf16", "bf16", "bf16", token_tiles=2), 1),
             (gemv.GemvSpec("fp8_e4m3", "fp8_e4m3", "bf16", "block"), 1)]
    for spec, ctas in cases:
        assert spec.ctas_per_sm == ctas
        assert f"kMinBlocksPerSm = {ctas};" in gemv.render_kernel(spec).source


# -- render and compile ----------------------------------------------------------------------------------------

# Every scaling and weight type once, both token tiles, each output type; mixed FP8 types.
VARIANTS = [
    S("bf16", "bf16", "bf16", "none", 1),
    S("bf16", "bf16", "fp32", "none", 2),
    S("fp16", "fp16", "fp16", "none", 1),
    S("fp8_e4m3", "fp8_e4m3", "bf16", "tensor", 1),
    S("fp8_e4m3", "fp8_e4m3", "fp16", "row", 2),
    S("fp8_e4m3", "fp8_e4m3", "bf16", "block", 1),
    S("fp8_e4m3", "fp8_e4m3", "fp32", "block", 2),
    S("fp8_e5m2", "fp8_e4m3", "bf16", "row", 1),
]


def test_render_every_variant():
    seen = set()
    for spec in VARIANTS:
        src = gemv.render_kernel(spec)
        assert [name for name, _ in src.headers] == ["dgjit/common.cuh", "dgjit/gemv.cuh", "dgjit/ptx_sm80.cuh"]
        assert "{{" not in src.source and "{%" not in src.source
        assert f"dgjit::Scaling::{spec.scaling_cpp};" in src.source and src.entry == "dgjit_gemv"
        assert f"constexpr int kTokenTiles = {spec.token_tiles};" in src.source
        seen.add(src.source)
    assert len(seen) == len(VARIANTS)


def test_render_is_strict():
    with pytest.raises(jinja2.UndefinedError):
        render.render("gemv.cu.j2", "k", tag="x")  # no spec


@pytest.mark.parametrize("spec", VARIANTS, ids=[s.tag for s in VARIANTS])
def test_compile_sm90a_sass(spec, shared_cache_dir, monkeypatch):
    """Real NVRTC compile: tensor-core MMAs, 16-byte streaming loads of the weight (ld.global.nc.L1::no_allocate
    -> LDG.E.NA...128.CONSTANT), no local memory, no spills, the sizes gemv.py assumes."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    art = gemv.get_kernel(spec, ARCH)
    gemv.check_symbols(art)
    assert art.meta["spill_store_bytes"] == 0 and art.meta["spill_load_bytes"] == 0, spec.tag
    usage = sass.resource_usage(art.cubin)[art.entry]
    assert usage.get("LOCAL", 0) == 0 and usage.get("STACK", 0) == 0, spec.tag
    # 16-bit M <= 8: two CTAs per SM (launch bounds), so <= 128 registers.
    assert usage["REG"] <= (128 if spec.token_tiles == 1 and spec.w_dtype in ("bf16", "fp16") else 255), spec.tag
    text = sass.disassemble(art.cubin)
    # griddepcontrol.wait first (gemv.plan launches it programmatically on sm_90a), exported for the host.
    assert text.count("ACQBULK") == 1, spec.tag
    assert cubin.optional_entry_symbol(art.cubin, art.entry, "takes_programmatic_launch") == 1, spec.tag
    mmas_per_step = 8 * spec.token_tiles  # 4 chunks x 2 MMAs x token tiles
    # mma.sync m16n8k16 is HMMA.16816; on sm_90a m16n8k32 with FP8 operands is also executed as HMMA.16816 on
    # FP16 values unpacked by F2FP (Hopper's native FP8 tensor-core path is wgmma / QGMMA).
    hmma = "HMMA.16816.F32.BF16" if spec.w_dtype == "bf16" else "HMMA.16816.F32"
    num_hmma = text.count(hmma)
    if spec.w_dtype in ("bf16", "fp16"):
        assert num_hmma == 3 * mmas_per_step, (spec.tag, num_hmma)  # two pipelined stages + the K tail step
    else:
        assert num_hmma == 2 * 3 * mmas_per_step, (spec.tag, num_hmma)  # k32 = two HMMA.16816
        assert "F2FP.F16.E4M3.UNPACK_B" in text, spec.tag
        assert ("F2FP.F16.E5M2.UNPACK_B" in text) == ("fp8_e5m2" in (spec.w_dtype, spec.x_dtype)), spec.tag
    assert "LDG.E.NA.LTC256B.128.CONSTANT" in text, spec.tag   # the weight: streamed, 256-byte L2 prefetch
    assert "LDG.E.128.CONSTANT" in text, spec.tag              # the activations: through L1
    assert "STL" not in text and "LDL" not in text and "ATOM" not in text and "RED" not in text, spec.tag
    assert "BAR.SYNC" in text, spec.tag                        # split-K reduction through shared memory
