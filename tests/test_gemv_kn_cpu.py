"""The weight-streaming kernel for weights stored (K, N) without a GPU: its spec's validation, the cluster rule, the
dispatch rule, real NVRTC compiles to sm_90a with SASS checks, and what explain reports."""
import pytest

from deepgemm_jit import build, gemv, gemv_kn, sass
from deepgemm_jit.spec import GemmSpec

ARCH = "sm_90a"


def test_spec_validation():
    with pytest.raises(ValueError, match="w_dtype"):
        gemv_kn.GemvKnSpec("fp8_e4m3", "bf16")
    with pytest.raises(ValueError, match="out_dtype"):
        gemv_kn.GemvKnSpec("bf16", "int32")
    with pytest.raises(ValueError, match="cluster"):
        gemv_kn.GemvKnSpec("bf16", "bf16", cluster=3)
    with pytest.raises(ValueError, match="cluster"):
        gemv_kn.GemvKnSpec("bf16", "bf16", cluster=True)
    assert gemv_kn.GemvKnSpec("tf32", "fp32", 4).tag == "gemv_kn_tf32_fp32_c4"
    assert gemv_kn.GemvKnSpec("bf16", "bf16").block_cols == 128 and gemv_kn.GemvKnSpec("tf32", "fp32").block_cols == 64


@pytest.mark.parametrize("n,k,esize", [(4096, 4096, 2), (7168, 16384, 2), (28672, 4096, 2), (1280, 8192, 4),
                                       (37888, 3584, 4), (8192, 1024, 2), (8, 16, 2), (4096, 4096, 4)])
def test_cluster_rule(n, k, esize):
    """The smallest cluster whose grid gives 95% of the SMs a CTA (1 only past one column block per SM), within the
    largest that leaves every warp 4 steps of K."""
    sms = 132
    c = gemv_kn.choose_cluster(n, k, esize, sms)
    col_blocks = -(-n * esize // gemv_kn.BLOCK_BYTES)
    steps = -(-k // gemv_kn.STEP_K[esize])
    assert c in gemv_kn.CLUSTERS
    assert c == 1 or steps >= gemv_kn.MIN_STEPS_PER_WARP * 8 * c
    assert c > 1 or col_blocks > sms or steps < gemv_kn.MIN_STEPS_PER_WARP * 8 * 2
    if c > 2:  # the next smaller did not fill
        assert col_blocks * c // 2 < gemv_kn.MIN_FILL * sms
    bigger = [x for x in gemv_kn.CLUSTERS if x > c]
    if bigger and col_blocks * c < gemv_kn.MIN_FILL * sms:  # not filled: K ran out of steps
        assert steps < gemv_kn.MIN_STEPS_PER_WARP * 8 * bigger[0]


def test_cluster_rule_measured_picks():
    """The best of the four sizes timed on the H200 (TF32, M = 1; see gemv_kn.MIN_FILL)."""
    picks = {(4096, 4096): 2, (4096, 14336): 2, (7168, 8192): 2, (4608, 3584): 2, (1280, 8192): 8, (28672, 4096): 1,
             (8192, 3584): 2, (8192, 1024): 2}
    assert {nk: gemv_kn.choose_cluster(*nk, 4, 132) for nk in picks} == picks


def test_dispatch_rule():
    def mm(layout="nn", dtype="bf16", n=4096, k=4096, arch=ARCH, **kw):
        return gemv_kn.max_m(GemmSpec.create(n, k, dtype=dtype, layout=layout, **kw), arch)

    assert mm(dtype="tf32") == mm(dtype="tf32", layout="tn") == mm(dtype="tf32", out_dtype="bf16") == 8
    assert mm() == mm(dtype="fp16") == 0  # 16-bit: the tiles stream faster (gemv_kn.STREAM_DTYPES)
    assert mm(layout="nt", dtype="tf32") == mm(layout="tt", dtype="tf32") == 0  # B stored (N, K)
    assert mm(arch="sm_80", dtype="tf32") == mm(arch="sm_89", dtype="tf32") == 0  # thread-block clusters
    assert mm(epilogue="bias", dtype="tf32") == 0
    assert mm(n=4100, dtype="tf32") == 8 and mm(n=4097, dtype="tf32") == 0  # 16400 bytes: whole chunks; 16388: not
    # promoted=True promises FP32 partial sums every K block; this kernel accumulates through K in the tensor cores
    assert mm(dtype="tf32", promoted=True) == mm(dtype="tf32", layout="tn", promoted=True) == 0
    # K split across warps as steps * part / parts in 32 bits: past 2^32 the ranges wrapped (N = 4, K = 6e8 at
    # cluster 8 covered 73.8 M of 75 M steps); such K run the tiles
    assert mm(n=4, k=60_000_000, dtype="tf32") == 8 and mm(n=4, k=600_000_000, dtype="tf32") == 0


def test_dispatch_needs_a_full_last_wave():
    """At cluster 1 the last (or only) wave of CTAs (2 per SM) must be MIN_LAST_WAVE full: the rows timed on the
    H200 (*exp-gemv-kn-waves-s29*, *exp-gemv-kn-one-wave-band-s29*) and the SM count the rule is given."""
    def mm(n, k, num_sms=132):
        return gemv_kn.max_m(GemmSpec.create(n, k, dtype="tf32", layout="nn"), ARCH, num_sms)

    # Streamed faster than the tiles: waves 82-97% full.
    assert mm(16384, 4096) == mm(28672, 4096) == mm(32768, 4096) == mm(49152, 4096) == 8
    assert mm(14336, 4096) == mm(13824, 5120) == 8
    # Slower: 56-75% full, past one wave or within it.
    assert mm(18944, 4096) == mm(22528, 4096) == mm(24576, 4096) == mm(37888, 3584) == 0
    assert mm(10240, 4096) == mm(11008, 4096) == mm(12288, 4096) == 0
    # Clusters that split K fill the SMs; the wave is the GPU's: 18944 columns are 296 CTAs, 4% past 2 x 142 SMs
    # but exactly one wave on 148.
    assert mm(4096, 4096) == mm(8192, 3584) == mm(1280, 8192) == 8
    # Grids that K leaves at cluster 1 with fewer column blocks than SMs are not held to it.
    assert mm(68, 40) == mm(7168, 24) == 8 and gemv_kn.choose_cluster(7168, 24, 4, 132) == 1
    assert mm(18944, 4096, num_sms=142) == 0 and mm(18944, 4096, num_sms=148) == 8
    assert gemv_kn.fills_its_last_wave(18944, 4096, 4, 148) and not gemv_kn.fills_its_last_wave(18944, 4096, 4, 132)


@pytest.mark.parametrize("w,out,cluster", [("bf16", "bf16", 1), ("fp16", "fp16", 2), ("bf16", "fp32", 4),
                                            ("tf32", "fp32", 8), ("tf32", "fp32", 1), ("fp16", "fp32", 8)])
def test_compiles_without_local_memory(w, out, cluster, shared_cache_dir, monkeypatch):
    """Real NVRTC compile to sm_90a: tensor-core MMAs, 16-byte weight loads, no local memory, at most 128 registers
    (the launch bounds' two CTAs per SM), the sizes gemv_kn.py assumes, cluster barriers where a cluster splits K."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    art = gemv_kn.get_kernel(gemv_kn.GemvKnSpec(w, out, cluster), ARCH)
    gemv_kn.check_symbols(art)
    usage = sass.resource_usage(art.cubin)[art.entry]
    assert usage["LOCAL"] == 0 and usage["STACK"] == 0 and usage["REG"] <= 128, usage
    mix = sass.opcode_mix(art.cubin)
    assert mix.get("HMMA", 0) >= 16 and mix.get("LDG", 0) >= 16, mix
    assert "STL" not in mix and "LDL" not in mix
    assert (mix.get("UCGABAR_ARV", 0) > 0) == (cluster > 1), mix
    if w != "tf32":
        assert mix.get("PRMT", 0) >= 32, mix  # the fragments pair two K rows of one column


def test_gemm_dispatch_and_explain(shared_cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    g = build(1, 4096, 4096, dtype="tf32", layout="nn", arch=ARCH)
    assert g.weight_streaming_kernel is gemv_kn and g.weight_streaming_max_m == 8
    gemv_kn.clear_memo()
    info = g.explain()["weight_streaming"]
    assert gemv_kn._family.memoized() == 0  # explain names the kernel without compiling it (cheap, works offline)
    assert info["kernels"] == ["gemv_kn_tf32_fp32_c2"] and info["grid"] == 64 * 2 and info["cluster"] == 2, info
    tn = build(1, 1000, 1003, dtype="tf32", layout="tn", arch=ARCH)
    assert tn.weight_streaming_max_m == 8 and tn.explain()["weight_streaming"]["kernels"][0].startswith("gemv_kn_tf32")
    off = build(1, 4096, 4096, dtype="tf32", layout="nn", arch=ARCH, weight_streaming=False)
    assert off.weight_streaming_max_m == 0
    assert build(1, 4096, 4096, dtype="bf16", layout="nn", arch=ARCH).weight_streaming_max_m == 0
    nt = build(1, 2112, 7168, dtype="bf16", arch=ARCH)
    assert nt.weight_streaming_kernel is gemv and nt.weight_streaming_max_m == 8
