"""The row-sweep decode kernel (gemv_rows.py) on the CPU: its spec, how a row is split over threads, the dispatch
rule and how gemv.py defers to it, warmup, rendering, and real NVRTC compiles to sm_90a with SASS checks (FP32
FMAs and no tensor-core MMA, FP8 unpacking, evict-first weight loads, no local memory, the launch bounds'
registers) for 16-bit and FP8 (every scaling, mixed types) forms.

The GPU side is tests/test_gemv_rows_gpu.py.
"""
import pytest

from deepgemm_jit import GemmSpec, build, cubin, gemv, gemv_rows, sass, warmup

ARCH = "sm_90a"
R = gemv_rows.GemvRowsSpec


# -- spec and the split of a row ------------------------------------------------------------------------------

def B16(dtype="bf16", out="bf16", tokens=1, threads=512, chunks=4):
    return R(dtype, dtype, out, "none", tokens, threads, chunks)


def test_spec_tag_and_ctas_per_sm():
    assert B16().tag == "gemv_rows_bf16_bf16_m1_512x4"
    assert B16("fp16", "fp32", 2, 224, 4).tag == "gemv_rows_fp16_fp32_m2_224x4"
    mixed = R("fp8_e5m2", "fp8_e4m3", "bf16", "block", 1, 512, 2)
    assert mixed.tag == "gemv_rows_fp8_e4m3xfp8_e5m2_block_bf16_m1_512x2"
    # The launch bounds' thread budget per SM: 1024 at one token (<= 64 registers), 512 at two; at most 32 CTAs.
    assert B16(threads=512).ctas_per_sm == 2 and B16(threads=224).ctas_per_sm == 4
    assert B16(threads=32).ctas_per_sm == 32 and B16(tokens=2, threads=512).ctas_per_sm == 1
    assert B16(threads=1024).max_row_words == 4096 == gemv_rows.max_row_words(1, 2)
    assert gemv_rows.max_row_words(2, 2) == 2048 and gemv_rows.max_row_words(1, 1) == 2048


@pytest.mark.parametrize("kwargs", [
    dict(w_dtype="fp8_e4m3", x_dtype="fp8_e4m3", out_dtype="bf16"),           # FP8 without scales
    dict(w_dtype="bf16", x_dtype="bf16", out_dtype="bf16", scaling="tensor"),  # 16-bit with scales
    dict(w_dtype="bf16", x_dtype="fp16", out_dtype="bf16"), dict(w_dtype="bf16", x_dtype="fp8_e4m3", out_dtype="bf16"),
    dict(w_dtype="tf32", x_dtype="tf32", out_dtype="fp32"), dict(w_dtype="int8", x_dtype="int8", out_dtype="int32"),
    dict(w_dtype="bf16", x_dtype="bf16", out_dtype="int32"), dict(w_dtype="bf16", x_dtype="bf16", out_dtype="bf16",
                                                                  tokens=4),
    dict(w_dtype="bf16", x_dtype="bf16", out_dtype="bf16", tokens=True),
    dict(w_dtype="bf16", x_dtype="bf16", out_dtype="bf16", threads=48),
    dict(w_dtype="bf16", x_dtype="bf16", out_dtype="bf16", threads=2048),
    dict(w_dtype="bf16", x_dtype="bf16", out_dtype="bf16", tokens=2, threads=1024),
    dict(w_dtype="bf16", x_dtype="bf16", out_dtype="bf16", chunks=0),
    dict(w_dtype="bf16", x_dtype="bf16", out_dtype="bf16", chunks=5),
    dict(w_dtype="fp8_e4m3", x_dtype="fp8_e4m3", out_dtype="bf16", scaling="row", chunks=4),  # FP8: 2 words at most
])
def test_spec_rejections(kwargs):
    with pytest.raises(ValueError):
        R(**kwargs)


def test_threads_cover_the_row_in_whole_warps():
    for esize, chunks in gemv_rows.CHUNKS.items():
        for words in (1, 31, 128, 192, 256, 896, 2048):
            threads = gemv_rows.threads_for(words, esize)
            assert threads % 32 == 0 and threads * chunks >= words
            assert (threads - 32) * chunks < words  # no whole idle warp
    # The measured picks (module notes): 512 x 4 at K = 16384, 64 x 4 at K = 2048 (BF16, one token); FP8 2 words.
    spec = GemmSpec.create(7168, 16384, dtype="bf16")
    assert R.for_gemm(spec, 1) == B16(threads=512)
    assert R.for_gemm(GemmSpec.create(7168, 2048, dtype="fp16", out_dtype="fp32"), 1) == B16("fp16", "fp32", 1, 64)
    assert R.for_gemm(spec, 2) == B16(tokens=2, threads=512)
    fp8 = GemmSpec.create(7168, 16384, dtype="fp8_e4m3", b_dtype="fp8_e5m2", scaling="block", out_dtype="fp16")
    assert R.for_gemm(fp8, 1) == R("fp8_e5m2", "fp8_e4m3", "fp16", "block", 1, 512, 2)
    with pytest.raises(ValueError):
        R.for_gemm(spec, 3)
    with pytest.raises(ValueError, match="exceed"):  # 2 tokens take rows of up to 512 threads x 4 words
        R.for_gemm(GemmSpec.create(7168, 16392, dtype="bf16"), 2)


# -- the rule and gemv.py's deference ---------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,arch,expected", [
    (dict(n=7168, k=16384, dtype="bf16"), ARCH, 2),
    (dict(n=7168, k=16392, dtype="bf16"), ARCH, 1),        # two tokens take rows of up to 512 threads x 4 words
    (dict(n=7, k=1024, dtype="fp16", out_dtype="fp32"), ARCH, 2),
    (dict(n=7, k=1016, dtype="bf16"), ARCH, 0),            # a row under MIN_ROW_BYTES (2032 bytes)
    (dict(n=7, k=32768, dtype="fp16"), ARCH, 1),           # 4096 words: 1024 threads x 4
    (dict(n=7, k=32776, dtype="bf16"), ARCH, 0),           # a longer row would need a fifth word (spills)
    (dict(n=2112, k=7170, dtype="bf16"), ARCH, 0),         # rows of K x 2 bytes not whole 16-byte words
    (dict(n=2112, k=7168, dtype="bf16", layout="nn"), ARCH, 0),
    (dict(n=2112, k=7168, dtype="bf16", epilogue="bias"), ARCH, 0),
    (dict(n=2112, k=7168, dtype="fp8", scaling="block"), ARCH, 1),  # FP8: one token (FP8_MAX_M)
    (dict(n=7168, k=2048, dtype="fp8", scaling="tensor", fast_accum=True), ARCH, 1),
    (dict(n=7168, k=16384, dtype="fp8_e5m2", b_dtype="fp8_e4m3", scaling="row", out_dtype="fp32"), ARCH, 1),
    (dict(n=7, k=32768, dtype="fp8", scaling="tensor"), ARCH, 1),    # 2048 words: 1024 threads x 2
    (dict(n=7, k=32768, dtype="fp8", scaling="block"), ARCH, 0),     # block: K <= FP8_BLOCK_MAX_K
    (dict(n=37888, k=3584, dtype="fp8", scaling="block"), ARCH, 0),  # block: N <= FP8_BLOCK_MAX_N
    (dict(n=37888, k=3584, dtype="fp8", scaling="row"), ARCH, 1),
    (dict(n=24576, k=1536, dtype="fp8", scaling="block"), ARCH, 0),  # 1536-byte rows: slower than the tiles
    (dict(n=2112, k=7168, dtype="int8"), ARCH, 0),
    (dict(n=2112, k=7168, dtype="tf32"), ARCH, 0),
    (dict(n=2112, k=7168, dtype="bf16"), "sm_80", 0),
])
def test_rule(kwargs, arch, expected):
    spec = GemmSpec.create(**kwargs)
    assert gemv_rows.max_m(spec, arch) == expected
    assert gemv.max_m(spec, arch) == max(expected, gemv.mma_max_m(spec, arch))


def test_gemv_defers_to_the_row_sweep_at_its_m():
    spec = GemmSpec.create(2112, 7168, dtype="bf16")
    assert gemv.kernel_for(spec, 1, ARCH) == B16(threads=224)
    assert gemv.kernel_for(spec, 2, ARCH) == B16(tokens=2, threads=224)
    assert gemv.kernel_for(spec, 3, ARCH) == gemv.GemvSpec("bf16", "bf16", "bf16")
    assert gemv.max_m(spec, ARCH) == gemv.mma_max_m(spec, ARCH) == 8
    big = GemmSpec.create(7168, 16384, dtype="bf16")
    assert gemv.max_m(big, ARCH) == 2 and gemv.mma_max_m(big, ARCH) == 0
    assert build(1, 7168, 16384, dtype="bf16", arch=ARCH).weight_streaming_max_m == 2
    assert build(1, 7168, 16384, dtype="bf16", arch=ARCH, weight_streaming=False).weight_streaming_max_m == 0


def test_warmup_plans_the_row_sweep():
    """Explain's side is in test_gemv_cpu.test_build_switch and test_cli.test_explain_names_the_decode_kernel."""
    entries = [warmup.parse_shape(text) for text in ("1-4096:7168:16384:bf16", "64:2112:7168:bf16")]
    decode = warmup.plan_gemv(entries, ARCH)
    assert [k.tag for k in decode] == ["gemv_rows_bf16_bf16_m1_512x4", "gemv_rows_bf16_bf16_m2_512x4",
                                      "gemv_rows_bf16_bf16_m1_224x4", "gemv_rows_bf16_bf16_m2_224x4",
                                      "gemv_bf16_bf16_t1"]
    assert all(warmup.kernel_type(k) == "gemv" for k in decode)


# -- render and compile ------------------------------------------------------------------------------------------

VARIANTS = [B16(threads=512), B16("fp16", "fp16", 1, 224), B16(out="fp32", threads=32), B16(threads=1024),
            B16(threads=1024, chunks=2), B16(tokens=2, threads=512), B16("fp16", "fp32", 2, 64),
            R("fp8_e4m3", "fp8_e4m3", "bf16", "tensor", 1, 512, 2), R("fp8_e4m3", "fp8_e4m3", "fp16", "row", 2, 224, 2),
            R("fp8_e5m2", "fp8_e4m3", "fp32", "block", 1, 1024, 2),
            R("fp8_e5m2", "fp8_e5m2", "bf16", "block", 2, 512, 2)]


def test_render_every_variant():
    seen = set()
    for spec in VARIANTS:
        src = gemv_rows.render_kernel(spec)
        assert [name for name, _ in src.headers] == ["dgjit/common.cuh", "dgjit/gemv_rows.cuh", "dgjit/quantize.cuh"]
        assert "{{" not in src.source and src.entry == "dgjit_gemv_rows"
        assert f"constexpr int kThreads = {spec.threads};" in src.source
        assert f"constexpr int kCtasPerSm = {spec.ctas_per_sm};" in src.source
        assert f"dgjit::Scaling::{spec.scaling_cpp};" in src.source
        seen.add(src.source)
    assert len(seen) == len(VARIANTS)


@pytest.mark.parametrize("spec", VARIANTS, ids=[s.tag for s in VARIANTS])
def test_compile_sm90a_sass(spec, shared_cache_dir, monkeypatch):
    """CUDA-core FMAs only, 16-byte evict-first weight loads (LDG...128 with an L2 cache-policy descriptor), no
    local memory or spills within the launch bounds' registers, one griddepcontrol.wait, the exported sizes."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    art = gemv_rows.get_kernel(spec, ARCH)
    gemv_rows.check_symbols(art)
    assert art.meta["spill_store_bytes"] == 0 and art.meta["spill_load_bytes"] == 0, spec.tag
    usage = sass.resource_usage(art.cubin)[art.entry]
    assert usage.get("LOCAL", 0) == 0 and usage.get("STACK", 0) == 0, spec.tag
    assert usage["REG"] <= 65536 // (spec.threads * spec.ctas_per_sm), spec.tag
    mix = sass.opcode_mix(art.cubin)
    assert not any("MMA" in op for op in mix), spec.tag
    per_word = 16 if spec.scaling != "none" else 8  # products of a 16-byte word: 16 FP8 or 8 16-bit values
    assert mix.get("FFMA", 0) >= per_word * spec.tokens * spec.chunks, (spec.tag, mix.get("FFMA"))
    if spec.scaling != "none":  # FP8 pairs unpacked to FP16 pairs (cvt.rn.f16x2.e4m3x2 / e5m2x2), weight and tokens
        assert mix.get("F2FP", 0) >= 8 * (1 + spec.tokens) * spec.chunks, (spec.tag, mix.get("F2FP"))
    text = sass.disassemble(art.cubin)
    weight_loads = [line for line in text.splitlines() if "LDG" in line and ".128" in line and "desc[" in line]
    assert len(weight_loads) >= 2 * spec.chunks, spec.tag  # this row's and the next row's words
    assert text.count("ACQBULK") == 1, spec.tag
    assert cubin.optional_entry_symbol(art.cubin, art.entry, "takes_programmatic_launch") == 1
