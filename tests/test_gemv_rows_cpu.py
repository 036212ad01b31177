"""The row-sweep decode kernel (gemv_rows.py) on the CPU: its spec, how a row is split over threads, the dispatch
rule and how gemv.py defers to it, explain / warmup, rendering, and real NVRTC compiles to sm_90a with SASS checks
(FP32 FMAs and no tensor-core MMA, evict-first weight loads, no local memory, the launch bounds' registers).

The GPU side is tests/test_gemv_rows_gpu.py.
"""
import pytest

from deepgemm_jit import GemmSpec, build, cubin, gemv, gemv_rows, sass, warmup

ARCH = "sm_90a"
R = gemv_rows.GemvRowsSpec


# -- spec and the split of a row ------------------------------------------------------------------------------

def test_spec_tag_and_ctas_per_sm():
    assert R("bf16", "bf16").tag == "gemv_rows_bf16_bf16_m1_512x4"
    assert R("fp16", "fp32", 2, 224, 4).tag == "gemv_rows_fp16_fp32_m2_224x4"
    # The launch bounds' thread budget per SM: 1024 at one token (<= 64 registers), 512 at two; at most 32 CTAs.
    assert R("bf16", "bf16", 1, 512, 4).ctas_per_sm == 2 and R("bf16", "bf16", 1, 224, 4).ctas_per_sm == 4
    assert R("bf16", "bf16", 1, 32, 4).ctas_per_sm == 32 and R("bf16", "bf16", 2, 512, 4).ctas_per_sm == 1
    assert R("bf16", "bf16", 1, 1024, 4).max_row_words == 4096 == gemv_rows.max_row_words(1)
    assert gemv_rows.max_row_words(2) == 2048


@pytest.mark.parametrize("kwargs", [
    dict(dtype="fp8_e4m3", out_dtype="bf16"), dict(dtype="tf32", out_dtype="fp32"),
    dict(dtype="bf16", out_dtype="int32"), dict(dtype="bf16", out_dtype="bf16", tokens=4),
    dict(dtype="bf16", out_dtype="bf16", tokens=True), dict(dtype="bf16", out_dtype="bf16", threads=48),
    dict(dtype="bf16", out_dtype="bf16", threads=2048), dict(dtype="bf16", out_dtype="bf16", tokens=2, threads=1024),
    dict(dtype="bf16", out_dtype="bf16", chunks=0), dict(dtype="bf16", out_dtype="bf16", chunks=5),
])
def test_spec_rejections(kwargs):
    with pytest.raises(ValueError):
        R(**kwargs)


def test_threads_cover_the_row_in_whole_warps():
    for words in (1, 31, 128, 192, 256, 896, 2048, 2049, 4095, 4096):
        threads = gemv_rows.threads_for(words)
        assert threads % 32 == 0 and threads * gemv_rows.CHUNKS >= words
        assert (threads - 32) * gemv_rows.CHUNKS < words  # no whole idle warp
    # The measured picks (module notes): 512 x 4 at K = 16384, 64 x 4 at K = 2048 (BF16, one token).
    spec = GemmSpec.create(7168, 16384, dtype="bf16")
    assert R.for_gemm(spec, 1) == R("bf16", "bf16", 1, 512, 4)
    assert R.for_gemm(GemmSpec.create(7168, 2048, dtype="fp16", out_dtype="fp32"), 1) == R("fp16", "fp32", 1, 64, 4)
    assert R.for_gemm(spec, 2) == R("bf16", "bf16", 2, 512, 4)
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
    (dict(n=2112, k=7168, dtype="fp8", scaling="block"), ARCH, 0),
    (dict(n=2112, k=7168, dtype="tf32"), ARCH, 0),
    (dict(n=2112, k=7168, dtype="bf16"), "sm_80", 0),
])
def test_rule(kwargs, arch, expected):
    spec = GemmSpec.create(**kwargs)
    assert gemv_rows.max_m(spec, arch) == expected
    assert gemv.max_m(spec, arch) == max(expected, gemv.mma_max_m(spec, arch))


def test_gemv_defers_to_the_row_sweep_at_its_m():
    spec = GemmSpec.create(2112, 7168, dtype="bf16")
    assert gemv.kernel_for(spec, 1, ARCH) == R("bf16", "bf16", 1, 224, 4)
    assert gemv.kernel_for(spec, 2, ARCH) == R("bf16", "bf16", 2, 224, 4)
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

VARIANTS = [R("bf16", "bf16", 1, 512, 4), R("fp16", "fp16", 1, 224, 4), R("bf16", "fp32", 1, 32, 4),
            R("bf16", "bf16", 1, 1024, 4), R("bf16", "bf16", 1, 1024, 2), R("bf16", "bf16", 2, 512, 4),
            R("fp16", "fp32", 2, 64, 4)]


def test_render_every_variant():
    seen = set()
    for spec in VARIANTS:
        src = gemv_rows.render_kernel(spec)
        assert [name for name, _ in src.headers] == ["dgjit/common.cuh", "dgjit/gemv_rows.cuh"]
        assert "{{" not in src.source and src.entry == "dgjit_gemv_rows"
        assert f"constexpr int kThreads = {spec.threads};" in src.source
        assert f"constexpr int kCtasPerSm = {spec.ctas_per_sm};" in src.source
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
    assert mix.get("FFMA", 0) >= 8 * spec.tokens * spec.chunks, (spec.tag, mix.get("FFMA"))
    text = sass.disassemble(art.cubin)
    weight_loads = [line for line in text.splitlines() if "LDG" in line and ".128" in line and "desc[" in line]
    assert len(weight_loads) >= 2 * spec.chunks, spec.tag  # this row's and the next row's words
    assert text.count("ACQBULK") == 1, spec.tag
    assert cubin.optional_entry_symbol(art.cubin, art.entry, "takes_programmatic_launch") == 1
