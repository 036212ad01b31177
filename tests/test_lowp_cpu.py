"""FP8 / INT8 GEMMs on the CPU: spec rules, tile limits, scale validation, and real sm_90a compiles of
every 8-bit variant with SASS checks (QGMMA / IGMMA, no local memory, layout symbols = config.py)."""
import dataclasses
import math

import numpy as np
import pytest

from deepgemm_jit import GemmSpec, build, compiler, config, jit, launch, sass, sm90_cost, sm90_rules, sm90_tiles
from deepgemm_jit.arrays import scale_view
from fakes import FakeDeviceArray
from sm90_kernels import compiled_clean


# ---------------------------------------------------------------------------------------------- spec
def test_spec_defaults():
    s = GemmSpec.create(7168, 2048, "fp8")
    assert (s.dtype, s.b_dtype, s.scaling, s.out_dtype, s.promote) == ("fp8_e4m3", "fp8_e4m3", "block", "bf16", True)
    assert GemmSpec.create(64, 64, "int8").out_dtype == "int32"
    assert GemmSpec.create(64, 64, "int8", scaling="row").out_dtype == "bf16"
    assert not GemmSpec.create(64, 64, "fp8", scaling="tensor", fast_accum=True).promote
    mixed = GemmSpec.create(64, 64, "fp8_e4m3", b_dtype="e5m2", scaling="row")
    assert mixed.b_type == "fp8_e5m2" and "fp8_e4m3xfp8_e5m2_row" in mixed.tag
    assert GemmSpec.create(64, 64, "bf16").scaling == "none"


@pytest.mark.parametrize("kwargs,match", [
    (dict(dtype="bf16", scaling="row"), "scaling"),
    (dict(dtype="bf16", b_dtype="fp16"), "b_dtype"),
    (dict(dtype="fp8", scaling="none"), "fp8 GEMMs need scaling"),
    (dict(dtype="fp8", scaling="block", fast_accum=True), "fast_accum"),
    (dict(dtype="fp8", out_dtype="int32"), "out_dtype"),
    (dict(dtype="fp8", b_dtype="int8"), "b_dtype"),
    (dict(dtype="int8", scaling="block"), "int8"),
    (dict(dtype="int8", out_dtype="bf16"), "int32"),
    (dict(dtype="int8", scaling="row", out_dtype="int32"), "int32"),
    (dict(dtype="int8", fast_accum=True), "fast_accum"),
    (dict(dtype="fp8", layout="nn"), "layout 'nt'"),
    (dict(dtype="bf16", out_dtype="int32"), "int32"),
    (dict(dtype="fp8", scaling="rows"), "scaling"),
])
def test_spec_rejections(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        GemmSpec.create(256, 256, **kwargs)


def test_scale_shapes():
    s = GemmSpec.create(300, 1000, "fp8", scaling="block")
    assert s.scale_shapes(77) == ((77, 8), (3, 8))
    assert GemmSpec.create(300, 1000, "fp8", scaling="row").scale_shapes(5) == ((5,), (300,))
    assert GemmSpec.create(300, 1000, "fp8", scaling="tensor").scale_shapes(5) == ((1,), (1,))
    assert GemmSpec.create(300, 1000, "int8").scale_shapes(5) is None


@pytest.mark.parametrize("scaling", ["tensor", "row", "block"])
def test_recipe_granularities_produce_the_scales_the_gemm_takes(scaling):
    """quantize(x, granularity=A's) and quantize(w, granularity=B's) give exactly spec.scale_shapes(M)."""
    from deepgemm_jit.quantization import recipe_granularities, scale_shape

    spec = GemmSpec.create(300, 1000, "fp8", scaling=scaling)
    ga, gb = recipe_granularities(scaling)
    assert (scale_shape(ga, 77, 1000), scale_shape(gb, 300, 1000)) == spec.scale_shapes(77)


# ---------------------------------------------------------------------------------------------- config
def test_block_scaling_prices_straddling_tiles_main_loop():
    """FP8 block scaling prices 176-wide tiles' main loop SM90_BLOCK_STRADDLE_MAIN_LOOP_COST higher (H200 session 54:
    128x128 beat 176 at long K), so 15353 x 4096 x 14336 takes 128 (176 was 6.5% slower) while 4096 x 2112 x 7168
    keeps 176 (12 column blocks against 17); per-tensor / row scales and 128-wide tiles are priced as before."""
    block = GemmSpec.create(4096, 14336, "fp8", scaling="block")
    assert config.choose_config(block, 15353, "sm_90a", 132).block_n == 128
    assert config.choose_config(GemmSpec.create(2112, 7168, "fp8", scaling="block"), 4096, "sm_90a", 132).block_n == 176
    row = GemmSpec.create(4096, 14336, "fp8", scaling="row")
    for spec, block_n, scale in ((block, 176, sm90_rules.SM90_BLOCK_STRADDLE_MAIN_LOOP_COST), (block, 128, 1.0),
                                 (row, 176, 1.0)):
        priced = sm90_rules.sm90_priced_cost(spec, 15360, 128, block_n, 4, 132)
        plain = sm90_cost.sm90_tile_cost(15360, 4096, 14336, 128, block_n, 128, 2, 132, 4, main_loop_scale=scale)
        assert priced == pytest.approx(plain), (spec.scaling, block_n)
    assert sm90_rules.SM90_BLOCK_STRADDLE_MAIN_LOOP_COST > 1.0


def test_promotion_limits_block_n():
    """Promoted FP8 tile choices at large M (H200 sweeps): 176 (block, row) or 160 (K <= 2048: tensor, row) beside
    128, whose K loop keeps two partial sets (session 18); the waves model picks 176 at 2112x7168 and 7168x16384,
    128 on the other DeepSeek rows, as measured (bench/results/*fp8-m4096-tiles-two-sets-s18*); block scaling's
    7168x16384 takes 128 since session 54 (SM90_BLOCK_STRADDLE_MAIN_LOOP_COST: 176 ran even there, 7.6% slower
    with bias+gelu)."""
    spec = GemmSpec.create(7168, 16384, "fp8")
    ranked = config.sm90_ranked(spec, 4096, 132)
    assert ranked and all(sm90_tiles.sm90_accumulators(c.block_m, c.block_n, True) <= 176 for c in ranked)
    assert {c.block_n for c in ranked} == {128, 176}
    want = {(2112, 7168): 176, (24576, 1536): 128, (32768, 512): 128, (7168, 16384): 176, (4096, 7168): 128,
            (7168, 2048): 128}
    for scaling in ("block", "row", "tensor"):
        for (n, k), block_n in (want | {(7168, 16384): 128} if scaling == "block" else want).items():
            chosen = config.choose_sm90_config(GemmSpec.create(n, k, "fp8", scaling=scaling), 4096, 132)
            assert (chosen.block_m, chosen.block_n) == (128, block_n), (scaling, n, k, chosen.tag)
    assert all(128 % c.block_n == 0 for c in config.sm90_ranked(spec, 64, 132))
    # Grouped (MoE) calls: 176 or 128 only once the groups hold >= 1024 rows in all (masked calls of 256-512 rows
    # ran 15-20% slower at 176 on the H200).
    grouped = GemmSpec.create(4096, 7168, "fp8", grouped=True)
    assert config.choose_config(grouped, 256, "sm_90a", 132, groups=1).block_n == 128
    assert {c.block_n for c in config.sm90_ranked(grouped, 256, 132)} == {128}
    row = GemmSpec.create(7168, 16384, "fp8", scaling="row")
    assert {c.block_n for c in config.sm90_ranked(row, 4096, 132)} == {128, 176}
    assert {c.block_n for c in config.sm90_ranked(GemmSpec.create(7168, 2048, "fp8", scaling="row"), 4096, 132)} == {
        128, 160}
    assert len({c.block_n for c in config.sm90_ranked(row, 64, 132)}) > 1
    # ... and from SM90_FP8_ROW_WIDE_MIN_M rows only: below, the waves model chooses (H200 session 51, us, 128x176 ->
    # the model's pick; 26 rows of 192-777 rows 0.855x the time, bench/results/*exp-ab-fp8-row-rule-s51*)
    for (m, n, k), tile in {(256, 7168, 16384): (128, 112),    # 62.5 -> 47.5
                            (192, 2112, 7168): (128, 32),      # 21.9 -> 15.4
                            (512, 24576, 1536): (128, 128),    # 42.4 -> 36.9
                            (777, 32768, 512): (128, 128)}.items():  # 36.7 -> 35.2
        row_pick = config.choose_config(GemmSpec.create(n, k, "fp8", scaling="row"), m, "sm_90a", 132)
        assert (row_pick.block_m, row_pick.block_n) == tile, (m, n, k, row_pick.tag)
    with pytest.raises(ValueError, match="accumulator"):
        config.sm90_config(spec, 128, 192).check_for(spec, "sm_90a")
    fast = GemmSpec.create(7168, 16384, "fp8", scaling="tensor", fast_accum=True)
    config.sm90_config(fast, 128, 256).check_for(fast, "sm_90a")  # one set of accumulators: fits


def test_int8_block_n_is_a_legal_wgmma_n():
    spec = GemmSpec.create(2112, 7168, "int8")
    assert all(c.block_n <= 24 or c.block_n % 16 == 0 for c in config.sm90_ranked(spec, 512, 132))
    with pytest.raises(ValueError, match="int8"):
        config.sm90_config(spec, 128, 136).check_for(spec, "sm_90a")


def test_choose_config_8bit():
    spec = GemmSpec.create(7168, 1000, "fp8")  # K % 16 != 0: still sm90 (operands are staged at call time)
    cfg = config.choose_config(spec, 4096, "sm_90a")
    assert cfg.family == "sm90" and cfg.block_k == 128
    with pytest.raises(ValueError, match="Hopper"):
        config.choose_config(spec, 4096, "sm_80")
    with pytest.raises(ValueError, match="sm90 family only"):
        config.choose_sm80_config(GemmSpec.create(64, 64, "bf16"), 64, "sm_80").check_for(spec, "sm_80")


def test_row_scaling_smem_mirror():
    plain = GemmSpec.create(4096, 4096, "fp8", scaling="tensor")
    row = GemmSpec.create(4096, 4096, "fp8", scaling="row")
    smem = sm90_tiles.sm90_smem_bytes
    assert smem(row, 128, 128, 4) - smem(plain, 128, 128, 4) == (128 + 2 * 128) * 4
    assert smem(row, 64, 96, 4) - smem(plain, 64, 96, 4) == (64 + 96) * 4


# ---------------------------------------------------------------------------------------------- scales
def test_scale_view_layouts(fake_gpu_memory):
    row_major = scale_view(FakeDeviceArray((77, 8)), "scale_a", (77, 8), "x")
    assert (row_major.stride_i, row_major.stride_j) == (8, 1)
    col_major = scale_view(FakeDeviceArray((77, 8), strides=(1, 80)), "scale_a", (77, 8), "x")  # DeepGEMM's, M padded
    assert (col_major.stride_i, col_major.stride_j) == (1, 80)
    assert scale_view(FakeDeviceArray((5, 1)), "scale_a", (5,), "x").stride_i == 1
    assert scale_view(FakeDeviceArray((1, 300)), "scale_b", (300,), "x").stride_i == 1
    assert scale_view(FakeDeviceArray(()), "scale_a", (1,), "x").shape == (1, 1)
    one_group = scale_view(FakeDeviceArray((77, 1)), "scale_a", (77, 1), "x")
    assert (one_group.stride_i, one_group.stride_j) == (1, 0)


@pytest.mark.parametrize("arr,match", [
    (FakeDeviceArray((77, 7)), "expected"),
    (FakeDeviceArray((77, 8), dtype=np.float16), "float32"),
    (FakeDeviceArray((77, 8), strides=(-8, 1)), "negative"),
    (np.ones((77, 8), np.float32), "host"),
])
def test_scale_view_rejections(arr, match, fake_gpu_memory):
    with pytest.raises((TypeError, ValueError), match=match):
        scale_view(arr, "scale_a", (77, 8), "per 1x128 group")


# ---------------------------------------------------------------------------------------------- compiles
LOWP_VARIANTS = [  # (dtype, b_dtype, scaling, fast_accum, out_dtype, block_m, block_n)
    ("fp8_e4m3", None, "block", False, "bf16", 128, 128),
    ("fp8_e4m3", None, "block", False, "fp32", 128, 176),
    ("fp8_e4m3", None, "block", False, "fp16", 64, 144),
    ("fp8_e4m3", None, "block", False, "bf16", 128, 112),
    ("fp8_e4m3", None, "tensor", False, "bf16", 128, 160),
    ("fp8_e4m3", None, "tensor", True, "bf16", 128, 256),
    ("fp8_e4m3", None, "row", False, "bf16", 128, 128),
    ("fp8_e4m3", None, "row", True, "fp32", 64, 256),
    ("fp8_e5m2", None, "row", False, "bf16", 128, 96),
    ("fp8_e4m3", "fp8_e5m2", "tensor", False, "bf16", 128, 128),
    ("fp8_e5m2", "fp8_e4m3", "block", False, "bf16", 128, 64),
    ("fp8_e4m3", None, "block", False, "bf16", 64, 32),
    ("fp8_e4m3", None, "block", False, "bf16", 64, 128),
    ("int8", None, "none", False, "int32", 128, 128),
    ("int8", None, "none", False, "int32", 64, 256),
    ("int8", None, "row", False, "bf16", 128, 256),
    ("int8", None, "tensor", False, "fp16", 128, 176),
]


@pytest.mark.parametrize("dtype,b_dtype,scaling,fast,out_dtype,block_m,block_n", LOWP_VARIANTS)
def test_lowp_variant_matrix(dtype, b_dtype, scaling, fast, out_dtype, block_m, block_n, shared_cache_dir,
                             monkeypatch):
    """Every 8-bit variant: QGMMA/IGMMA and TMA in the SASS, no local memory or stack, setmaxnreg kept, the
    exported layout equal to config.py's mirror."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    spec = GemmSpec.create(1000, 16384, dtype=dtype, b_dtype=b_dtype, scaling=scaling, fast_accum=fast,
                           out_dtype=out_dtype)
    cfg = config.sm90_config(spec, block_m, block_n)
    cfg = dataclasses.replace(cfg, num_stages=min(cfg.num_stages, 4))
    art, mix, case = compiled_clean(spec, cfg)
    mma = "IGMMA" if dtype == "int8" else "QGMMA"
    # Each K block is 4 k32 instructions per m64 slice; more means the K loop was unrolled (code bloat). Block
    # scaling with tiles that straddle 128-column scale blocks compiles one K loop per offset a tile can start at
    # inside a block (multiples of gcd(block_n, 128) columns).
    # Two partial sets (sm90_tiles.sm90_two_partial_sets) issue each K block from 4 places (first block, the loop's two,
    # the tail) and wait with one group left in flight (DEPBAR 0x1); one-set promoted kernels always drain (0x0).
    loops = 128 // math.gcd(block_n, 128) if scaling == "block" and block_n % 128 and 128 % block_n else 1
    two_sets = (sm90_tiles.sm90_two_partial_sets(spec, block_m, block_n, False)
                or sm90_tiles.sm90_half_partial_sets(spec, block_m, block_n, False))
    sites = 4 if two_sets else 1
    assert 0 < mix.get(mma, 0) <= 4 * (block_m // 64) * loops * sites and mix.get("HGMMA", 0) == 0, (case, mix.get(mma))
    if spec.promote:
        assert ("WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass.disassemble(art.cubin)) == two_sets, case
    assert mix.get("UTMALDG", 0) > 0, case
    # Block scaling: the TMA thread's bulk copy of A scales (cp.async.bulk, docs/experiments/sm90-fp8-bulk-a-scales.md);
    # compiled out of every other kernel.
    assert (mix.get("UBLKCP", 0) > 0) == (scaling == "block"), (case, mix.get("UBLKCP", 0))
    assert mix.get("USETMAXREG", 0) > 0 and "C7508" not in art.meta["log"], case
    assert launch.sm90_symbols(art)["smem_bytes"] == cfg.smem_bytes(spec), case
    launch.check_layout(art, spec)


def test_build_offline_fp8_explain(shared_cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    g = build(4096, 7168, 2048, dtype="fp8", arch="sm_90a")
    info = g.explain()
    assert g.family == "sm90" and info["local_bytes"] == 0
    assert info["sass"]["QGMMA"] > 0 and info["sass"].get("HGMMA", 0) == 0


def test_wg_split_k_rule_and_kernel(shared_cache_dir, monkeypatch):
    """64-row FP8 tiles with promotion and per-tensor / per-row scales split their K blocks between two consumer
    warpgroups (sm90_tiles.sm90_wg_split_k mirrors GemmSm90::kWGSplitK; the shared-memory mirror counts the lane
    buffer): the kernel compiles without serialised wgmmas and meets through named barriers 5 and 6."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    split = {}
    for dtype, scaling, fast in (("fp8", "tensor", False), ("fp8", "row", False), ("fp8", "block", False),
                                 ("fp8", "tensor", True), ("bf16", None, False), ("int8", None, False)):
        spec = GemmSpec.create(2112, 7168, dtype=dtype, scaling=scaling, fast_accum=fast)
        split[(dtype, scaling, fast)] = [sm90_tiles.sm90_wg_split_k(spec, bm, pp)
                                         for bm, pp in ((64, False), (64, True), (128, False))]
    assert split == {("fp8", "tensor", False): [True, False, False], ("fp8", "row", False): [True, False, False],
                     ("fp8", "block", False): [False] * 3, ("fp8", "tensor", True): [False] * 3,
                     ("bf16", None, False): [False] * 3, ("int8", None, False): [False] * 3}
    spec = GemmSpec.create(2112, 7168, dtype="fp8", scaling="tensor")
    plain = sm90_tiles.sm90_smem_bytes(GemmSpec.create(2112, 7168, dtype="fp8", scaling="tensor", fast_accum=True),
                                   64, 32, 8)
    assert sm90_tiles.sm90_smem_bytes(spec, 64, 32, 8) - plain == 64 * 32 * 4  # lane 1's FP32 sums
    cfg = config.sm90_config(spec, 64, 32)
    art = jit.get_kernel(spec, cfg, "sm_90a")
    launch.check_layout(art, spec)
    text = sass.disassemble(art.cubin)
    assert not compiler.serialization_warnings(art.meta["log"]), art.meta["log"]
    assert "BAR.ARV 0x5, 0x100" in text and "BAR.SYNC.DEFER_BLOCKING 0x5, 0x100" in text
    assert "BAR.ARV 0x6, 0x100" in text and "BAR.SYNC.DEFER_BLOCKING 0x6, 0x100" in text
    g = build(128, 2112, 7168, dtype="fp8", scaling="tensor", config=cfg, arch="sm_90a")
    assert g.explain()["k_lanes"] == 2
    assert build(4096, 2112, 7168, dtype="fp8", scaling="tensor", arch="sm_90a").explain()["k_lanes"] == 1


def test_two_partial_sets_rule():
    """Promoted FP8 tiles without K lanes keep a second partial set when it fits (<= 64 accumulators per consumer
    thread); explain reports the count (the SASS side is checked in test_lowp_variant_matrix)."""
    block = GemmSpec.create(7168, 16384, dtype="fp8", scaling="block")
    tensor = GemmSpec.create(7168, 16384, dtype="fp8", scaling="tensor")
    fast = GemmSpec.create(7168, 16384, dtype="fp8", scaling="tensor", fast_accum=True)
    rule = sm90_tiles.sm90_two_partial_sets
    assert [rule(block, bm, bn, False) for bm, bn in ((64, 32), (64, 128), (64, 144), (128, 128), (128, 176))] == [
        True, True, False, True, False]
    assert not rule(tensor, 64, 64, False)  # K lanes: two chains already
    assert rule(tensor, 128, 128, False) and not rule(fast, 128, 128, False)
    assert rule(block, 128, 64, True) and not rule(block, 128, 128, True)  # ping-pong: 128 rows per consumer
    assert not rule(GemmSpec.create(7168, 16384, dtype="bf16"), 64, 32, False)
    assert build(128, 7168, 16384, dtype="fp8", arch="sm_90a",
                 config=config.sm90_config(block, 64, 128)).explain()["partial_sets"] == 2
    # Wider per-tensor / per-row tiles: two halves of one set's width (no fused epilogue), else one set; block
    # scaling keeps one set, and 64-row per-tensor tiles have K lanes instead.
    half = sm90_tiles.sm90_half_partial_sets
    row = GemmSpec.create(7168, 16384, dtype="fp8", scaling="row")
    assert [half(tensor, bm, bn, False) for bm, bn in ((128, 176), (128, 160), (64, 144), (128, 128), (128, 168))] == [
        True, True, False, False, False]
    assert half(row, 128, 176, False) and not half(block, 128, 176, False)
    assert not half(GemmSpec.create(7168, 16384, dtype="fp8", scaling="tensor", epilogue="bias"), 128, 176, False)
    assert build(4096, 7168, 16384, dtype="fp8", scaling="tensor", arch="sm_90a",
                 config=config.sm90_config(tensor, 128, 176)).explain()["partial_sets"] == 2
    assert build(4096, 7168, 16384, dtype="fp8", arch="sm_90a",
                 config=config.sm90_config(block, 128, 176)).explain()["partial_sets"] == 1
    assert build(4096, 7168, 16384, dtype="bf16", arch="sm_90a").explain()["partial_sets"] == 0


@pytest.mark.parametrize("scaling,m,n,k", [("block", 4096, 7168, 16384), ("tensor", 4096, 7168, 16384),
                                           ("row", 4096, 7168, 16384), ("tensor", 128, 2112, 7168)])
def test_promoted_k_loop_keeps_interleaved_yields(scaling, m, n, k, shared_cache_dir, monkeypatch):
    """ptxas clears the yield bit on part of the promotion's FFMA/FADD run (the other consumer's wgmmas issue in
    between); a K loop reshaped so that it stopped ran 14-17% slower on the H200 (session 9). Heuristic tiles:
    128x176 (DeepSeek M = 4096) and the 64-row tile with two K lanes."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    spec = GemmSpec.create(n, k, dtype="fp8", scaling=scaling)
    cfg = config.choose_config(spec, m, "sm_90a")
    art = jit.get_kernel(spec, cfg, "sm_90a")
    cleared, set_ = sass.yield_mix(art.cubin)
    assert cleared >= 0.25 * (cleared + set_) > 0, (cfg.tag, cleared, set_)
