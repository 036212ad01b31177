import pytest

from deepgemm_jit import GemmSpec, KernelConfig, buckets, config, device, sm90_rules, sm90_swap_ab, sm90_tiles


def test_spec_defaults_and_tag():
    s = GemmSpec.create(4096, 7168, dtype="bfloat16")
    assert (s.dtype, s.out_dtype, s.layout) == ("bf16", "bf16", "nt")
    assert GemmSpec.create(8, 8, dtype="tf32").out_dtype == "fp32"
    assert s.tag == "gemm_bf16_bf16_nt_n4096_k7168"
    assert hash(s) == hash(GemmSpec.create(4096, 7168, dtype="bf16"))


@pytest.mark.parametrize("layout,a_shape,b_shape", [
    ("nt", (5, 7), (3, 7)), ("nn", (5, 7), (7, 3)), ("tn", (7, 5), (7, 3)), ("tt", (7, 5), (3, 7))])
def test_layout_shapes(layout, a_shape, b_shape):
    s = GemmSpec.create(3, 7, dtype="fp16", layout=layout)
    assert s.a_shape(5) == a_shape and s.b_shape() == b_shape and s.out_shape(5) == (5, 3)


@pytest.mark.parametrize("kwargs,exc,word", [
    (dict(n=0, k=8), ValueError, "N"),
    (dict(n=8, k=-1), ValueError, "K"),
    (dict(n=8.0, k=8), TypeError, "N"),
    (dict(n=True, k=8), TypeError, "N"),
    (dict(n=8, k=8, dtype="int4"), ValueError, "dtype"),
    (dict(n=8, k=8, dtype=3), TypeError, "dtype"),
    (dict(n=8, k=8, out_dtype="tf32"), ValueError, "out_dtype"),
    (dict(n=8, k=8, layout="xx"), ValueError, "layout"),
    # an epilogue on a type that cannot write int32 is told that, not about int8's scaling
    (dict(n=8, k=8, dtype="bf16", out_dtype="int32", epilogue="bias"), ValueError, "unscaled int8 GEMMs, not bf16"),
    (dict(n=8, k=8, dtype="int8", epilogue="bias"), ValueError, "needs a floating output"),
])
def test_spec_rejects(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        GemmSpec.create(**kwargs)


def test_config_validation():
    good = dict(family="sm80", block_m=128, block_n=128, block_k=32, num_stages=3, warps_m=2, warps_n=4,
                vec_a=8, vec_b=8)
    KernelConfig(**good)
    for field, value in [("family", "sm70"), ("num_stages", 1), ("block_m", 100), ("vec_a", 3), ("warps_n", 0)]:
        with pytest.raises(ValueError):
            KernelConfig(**dict(good, **{field: value}))


def test_config_checks_against_spec():
    spec = GemmSpec.create(64, 64, dtype="tf32")
    cfg = KernelConfig("sm80", 128, 128, 32, 3, 2, 4, vec_a=8, vec_b=4)  # 8 fp32 = 32 bytes
    with pytest.raises(ValueError, match="vec_a"):
        cfg.check_for(spec, "sm_90a")
    huge = KernelConfig("sm80", 128, 128, 64, 8, 2, 4, vec_a=4, vec_b=4)
    with pytest.raises(ValueError, match="shared memory"):
        huge.check_for(spec, "sm_90a")


def test_sm80_configs_that_compile_badly_are_refused():
    """Forced portable configs the kernel cannot take well: more accumulators per thread than registers hold (a
    128x128 tile on one warp kept 2504 bytes on the stack), more column blocks than grid.y takes, and 3xTF32's K'
    segments that are not whole K blocks (the template's static_assert)."""
    bf16 = GemmSpec.create(4096, 4096, dtype="bf16")
    KernelConfig("sm80", 128, 128, 32, 3, 2, 2, 8, 8).check_for(bf16, "sm_90a")  # 128 per thread: compiles clean
    for warps in ((1, 1), (1, 2), (2, 1)):
        with pytest.raises(ValueError, match="accumulators"):
            KernelConfig("sm80", 128, 128, 32, 3, *warps, 8, 8).check_for(bf16, "sm_90a")
    wide = GemmSpec.create(65535 * 8 + 1, 64, dtype="bf16")
    KernelConfig("sm80", 64, 16, 32, 3, 1, 1, 8, 8).check_for(wide, "sm_90a")
    with pytest.raises(ValueError, match="grid's y"):
        KernelConfig("sm80", 64, 8, 32, 3, 1, 1, 8, 8).check_for(wide, "sm_90a")
    hi_lo = GemmSpec(64, 96, "tf32", "fp32", "nt", promoted=True, hi_lo=True)  # dtype='fp32' at K = 32
    KernelConfig("sm80", 64, 64, 32, 3, 1, 2, 4, 4).check_for(hi_lo, "sm_90a")
    with pytest.raises(ValueError, match="block_k=64.*whole K blocks"):
        KernelConfig("sm80", 64, 64, 64, 3, 1, 2, 4, 4).check_for(hi_lo, "sm_90a")


def test_max_vector():
    # 16-bit elements: 16-byte loads need 8-element aligned rows and a 16-byte aligned base.
    assert config.max_vector(2, 0, 4096, 100) == 8
    assert config.max_vector(2, 0, 1003, 100) == 1
    assert config.max_vector(2, 0, 1002, 100) == 2
    assert config.max_vector(2, 8, 4096, 100) == 4
    assert config.max_vector(2, 0, 1003, 1) == 8   # one row: the stride never matters
    assert config.max_vector(4, 0, 65, 2) == 1
    assert config.max_vector(4, 0, 68, 2) == 4


def test_heuristic_buckets_and_vectors():
    spec = GemmSpec.create(4096, 4096, dtype="bf16")
    small = config.choose_sm80_config(spec, 16, "sm_90a")
    large = config.choose_sm80_config(spec, 4096, "sm_90a")
    assert small.block_m == 64 and large.block_m == 128
    assert (large.vec_a, large.vec_b) == (8, 8)
    odd = config.choose_sm80_config(GemmSpec.create(1001, 1003, dtype="bf16", layout="nn"), 1000, "sm_90a")
    assert (odd.vec_a, odd.vec_b) == (1, 1)
    for dt in ("fp16", "bf16", "tf32"):
        for layout in ("nt", "nn", "tn", "tt"):
            s = GemmSpec.create(7168, 2048, dtype=dt, layout=layout)
            cfg = config.choose_config(s, 4096, "sm_90a")
            assert cfg.smem_bytes(s) <= config.smem_limit_bytes("sm_90a")


def test_arch_handling():
    assert device.normalize_arch("SM_90a") == "sm_90a"
    assert device.arch_of_capability(9, 0) == "sm_90a"
    assert device.arch_of_capability(8, 6) == "sm_86"
    for bad in ("sm_70", "90a", "sm_86a", ""):
        with pytest.raises(ValueError, match="arch"):
            device.normalize_arch(bad)
    assert device.runs_on("sm_90a", 9, 0) and not device.runs_on("sm_90a", 10, 0)
    assert device.runs_on("sm_80", 8, 6) and not device.runs_on("sm_86", 8, 0)
    assert not device.runs_on("sm_80", 9, 0)


def test_family_selection():
    def fam(n, k, layout="nt", dtype="bf16", out=None, arch="sm_90a"):
        return config.choose_config(GemmSpec.create(n, k, dtype=dtype, out_dtype=out, layout=layout), 4096,
                                    arch).family
    assert fam(4096, 4096) == "sm90"
    assert fam(4096, 4096, dtype="tf32") == "sm90"
    assert fam(4096, 4096, layout="nn") == "sm90"       # MN-major 16-bit operands (WGMMA's trans immediates)
    # TF32 WGMMA reads K-major operands only: an MN-major B (nn) is transposed in the kernel (sm90_tiles.sm90_trans_b),
    # an MN-major A (tn) is not read by any Hopper kernel as stored (build runs the nt twin on copies)
    assert fam(4096, 4096, layout="nn", dtype="tf32") == "sm90"
    assert fam(4096, 4096, layout="tn", dtype="tf32") == "sm80"
    # Rows TMA cannot describe (K * 2 bytes or D's N * 2 not multiples of 16, odd N of an MN-major B) still build
    # the Hopper kernel: calls copy those operands into aligned buffers (Gemm._staged_roles)
    assert fam(4096, 4100) == fam(4100, 4096) == fam(1001, 1003) == fam(1001, 1024, layout="nn") == "sm90"
    assert fam(4096, 4096, arch="sm_80") == "sm80"


def test_tf32_mn_major_layouts_run_the_nt_kernel_on_transposed_copies():
    """Hopper's TF32 WGMMA reads K-major operands only: a TF32 spec with MN-major operands compiles its nt twin's
    kernel (sm90_rules.kernel_spec) and calls transpose those operands first, except nn up to
    SM90_TF32_TRANS_B_MAX_M rows, whose kernel transposes B in shared memory (sm90_tiles.sm90_trans_b); 16-bit types and
    other archs keep their layout, and so do grouped and 3xTF32 (hi_lo) specs."""
    big = 2 * sm90_rules.SM90_TF32_TRANS_B_MAX_M
    for layout in ("nn", "tn", "tt"):
        spec = GemmSpec.create(1001, 1003, dtype="tf32", layout=layout)
        twin = GemmSpec.create(1001, 1003, dtype="tf32", layout="nt")
        for m in (None, big):
            assert sm90_rules.sm90_transposes(spec, "sm_90a", m) and sm90_rules.kernel_spec(spec, "sm_90a", m) == twin
        small = sm90_rules.kernel_spec(spec, "sm_90a", 64)
        # nn: its own kernel; tn: the nn twin (A copied, B transposed in the kernel); tt: the nt twin (A copied)
        expect = {"nn": spec, "tn": GemmSpec.create(1001, 1003, dtype="tf32", layout="nn"), "tt": twin}[layout]
        assert small == expect, layout
        assert sm90_tiles.sm90_trans_b(spec) == (layout == "nn")
        assert sm90_rules.kernel_spec(spec, "sm_80") is spec
        assert config.choose_config(spec, 1000, "sm_90a").family == ("sm90" if layout == "nn" else "sm80")
        half = GemmSpec.create(1001, 1003, dtype="bf16", layout=layout)
        assert not sm90_rules.sm90_transposes(half, "sm_90a", 64) and sm90_rules.kernel_spec(half, "sm_90a", 64) is half
    nt = GemmSpec.create(1001, 1003, dtype="tf32")
    assert sm90_rules.kernel_spec(nt, "sm_90a", 64) is nt and not sm90_tiles.sm90_trans_b(nt)
    assert not sm90_tiles.sm90_trans_b(GemmSpec.create(1001, 1003, dtype="tf32", layout="nn", promoted=True))


def test_tf32_trans_b_tiles_are_whole_boxes_and_cooperative():
    """A TF32 B stored (K, N) arrives in TMA boxes of 32 columns (128 bytes): block_n a multiple of 32; its
    converter warps serve cooperative consumers only (no ping-pong), and its stages hold the raw and the
    transposed B (sm90_tiles.sm90_smem_bytes)."""
    nn = GemmSpec.create(4096, 7168, dtype="tf32", layout="nn")
    nt = GemmSpec.create(4096, 7168, dtype="tf32")
    assert sm90_tiles.sm90_block_n_legal(nn, 32) and not sm90_tiles.sm90_block_n_legal(nn, 48)
    # + the transposed B per stage, + a third barrier per stage (8 x 8 bytes)
    assert sm90_tiles.sm90_smem_bytes(nn, 64, 32, 8) == sm90_tiles.sm90_smem_bytes(nt, 64, 32, 8) + 8 * 32 * 128 + 64
    for m in (1, 64, 256, 1024):
        cfg = config.choose_sm90_config(nn, config.tile_bucket(nn, m), 132)
        assert cfg.block_n % 32 == 0 and not cfg.pingpong, (m, cfg.tag)
    with pytest.raises(ValueError, match="ping-pong"):
        config.sm90_config(nn, 128, 128, pingpong=True).check_for(nn, "sm_90a")


def test_tf32_trans_b_128_row_tiles_above_64_rows():
    """Above 64 rows a 64-row kTransB tile converts each B block twice as often per flop (SM90_TRANS_B_ROWS64_COST):
    the picks measured on the H200 at 96 and 128 rows (*exp-m-buckets-tf32-nn-trans-b-rows64-cost-s29*) take 128-row
    tiles (split-K where N leaves SMs idle); at 64 rows and below the 64-row tiles stay."""
    def pick(m, n, k):
        spec = GemmSpec.create(n, k, dtype="tf32", layout="nn")
        cfg = config.choose_sm90_config(spec, config.tile_bucket(spec, m), 132)
        return cfg.block_m, cfg.block_n, cfg.split_k
    for m in (96, 128):
        assert pick(m, 28672, 4096) == (128, 64, False)   # 182.9 us at 128 rows; 64x96 s6 221.6
        assert pick(m, 37888, 3584) == (128, 64, False)   # 202.1; 64x96 s6 235.8
        assert pick(m, 4096, 14336) == (128, 64, True)    # 90.2; 64x64 s8 109.6
        assert pick(m, 4096, 7168) == (128, 64, True)     # 49.8; 64x64 s8 57.2
    assert pick(64, 28672, 4096)[0] == pick(64, 4096, 7168)[0] == 64
    # Off the Hopper kTransB kernel (nt, 16-bit nn) nothing changes.
    nt = GemmSpec.create(4096, 7168, dtype="tf32")
    assert sm90_rules._trans_b_rows64_cost(nt, 128, 64) == 1.0


def test_sm90_heuristic_follows_waves():
    """Shapes measured on the H200 (docs/NOTES.md): the waves model picks the measured winner."""
    pick = lambda m, n, k: config.choose_config(GemmSpec.create(n, k, dtype="bf16"), m, "sm_90a", 132)
    assert (pick(4096, 7168, 16384).block_m, pick(4096, 7168, 16384).block_n) == (128, 256)
    assert pick(4096, 4096, 7168).block_n == 256
    assert pick(4096, 2112, 7168).block_n == 176   # 12 N tiles x 32 M tiles = 2.9 waves of 132
    # K = 512: the epilogue weighs; 216 would store D in 16-byte slices (measured 0.55x vs 1.07x).
    assert pick(4096, 32768, 512).block_n == 256
    assert pick(8192, 8192, 8192).block_n == 256      # 224 measured 1.004x, 256 1.057x
    assert pick(4096, 24576, 1536).block_n == 256     # 240 measured 0.993x, 256 1.020x
    small = pick(64, 7168, 16384)
    assert small.block_m == 64 and -(-7168 // small.block_n) <= 132  # one wave over the SMs
    for m, n, k in ((4096, 24576, 1536), (128, 2112, 7168), (1, 4096, 4096)):
        cfg = pick(m, n, k)
        assert cfg.num_stages >= 3
        assert cfg.smem_bytes(GemmSpec.create(n, k, dtype="bf16")) <= sm90_tiles.SM90_SMEM_BUDGET_BYTES


def test_192_row_bucket(monkeypatch):
    """M in (128, 192]: 64-row tiles compete unsplit, at K >= 1024, from 96 columns (FP8 per-tensor: any width up to
    N = 4096), for 16-bit, TF32 nt and FP8 row / tensor scales (SM90_ROWS64_UNSPLIT_BUCKETS, measured session 40); FP8
    block scaling at N 512..2112 weighs every 64-row tile; 16-bit K <= 512 from N = 4096 takes the short-K 64x128
    tile; everything else keeps the 256-row bucket's pick."""
    from deepgemm_jit import api, fp32x3

    def pick(spec, m):
        return config.choose_config(spec, m, "sm_90a", 132)

    wide = GemmSpec.create(4096, 28672, dtype="bf16")
    assert [(c.block_m, c.block_n, c.split_k) for c in (pick(wide, m) for m in (129, 160, 192))] == \
        [(64, 96, False)] * 3
    assert pick(wide, 193).block_m == 128
    # TF32 (nt) too, without the D ring the bucket's 128-row tiles have (its 64-row tiles were measured without)
    tf32 = pick(GemmSpec.create(4096, 28672, dtype="tf32"), 160)
    assert (tf32.block_m, tf32.block_n, tf32.d_ring) == (64, 96, 0)
    tf32_128 = pick(GemmSpec.create(2112, 7168, dtype="tf32"), 160)  # a 128-row pick keeps the ring it had at 256
    assert (tf32_128.block_m, tf32_128.d_ring) == (128, sm90_rules.SM90_D_RING)
    # FP8 per-tensor up to 4096 columns takes narrow 64-row tiles there (its 128-row picks of 32-64 columns lost)
    fp8_tensor = GemmSpec.create(2112, 7168, dtype="fp8", scaling="tensor")
    assert [(c.block_m, c.block_n) for c in (pick(fp8_tensor, m) for m in (150, 256))] == [(64, 48), (64, 64)]
    # 16-bit 64-row tiles narrower than 96 columns or split lost to 128-row split-K tiles: 2112 x 7168 keeps 128x64 x s
    narrow = GemmSpec.create(2112, 7168, dtype="bf16")
    assert all((c.block_m, c.block_n, c.split_k) == (128, 64, True) for c in (pick(narrow, m) for m in (129, 192)))
    # FP8 block scaling up to 2112 columns: every 64-row tile, split ones too (64x128 x s ran 1.10-1.29x faster)
    block = pick(GemmSpec.create(2112, 7168, dtype="fp8", scaling="block"), 160)
    assert (block.block_m, block.block_n, block.split_k) == (64, 128, True)
    # 16-bit at K <= 512 from 4096 columns: the short-K decode tile, 64x128 unsplit (not at K = 1024, where the 64-row
    # picks won)
    for dtype in ("bf16", "fp16"):
        picks = [pick(GemmSpec.create(32768, k, dtype=dtype), 160) for k in (512, 1024)]
        assert [(c.block_m, c.block_n, c.split_k) for c in picks] == [(64, 128, False), (64, 256, False)]
    def pick_256_before_s60(spec):  # the 256-row bucket's pick before session 60 weighed 8-bit 64-row tiles there
        with monkeypatch.context() as mp:
            mp.setattr(sm90_rules, "SM90_ROWS64_BUCKETS", (320,))
            config.choose_sm90_config.cache_clear()
            cfg = pick(spec, 256)
        config.choose_sm90_config.cache_clear()
        return cfg

    # the kernels that were measured at 129-256 rows before the bucket keep their picks there: FP8 block scaling past
    # 2112 columns, below 512 or at K < 1024, INT8 (also at narrow N), the TF32 kernel that transposes B, 16-bit at
    # K = 512 with an epilogue, below 4096 columns or at 512 < K < 1024, FP8 per-tensor past 4096 columns, grouped
    for spec in (GemmSpec.create(4096, 7168, dtype="fp8", scaling="block"), GemmSpec.create(4096, 7168, dtype="int8"),
                 GemmSpec.create(3072, 7168, dtype="fp8", scaling="block"),
                 GemmSpec.create(256, 7168, dtype="fp8", scaling="block"),
                 GemmSpec.create(2112, 512, dtype="fp8", scaling="block"), GemmSpec.create(2112, 7168, dtype="int8"),
                 GemmSpec.create(1024, 512, dtype="bf16"), GemmSpec.create(32768, 768, dtype="bf16"),
                 GemmSpec.create(7168, 2048, dtype="tf32", layout="nn"),
                 GemmSpec.create(32768, 512, dtype="bf16", epilogue="bias"),
                 GemmSpec.create(7168, 2048, dtype="fp8", scaling="tensor"), GemmSpec.create(2112, 7168, dtype="tf32"),
                 GemmSpec.create(4096, 7168, dtype="bf16", grouped=True)):
        for m in (129, 160, 192):
            assert pick(spec, m) == pick_256_before_s60(spec), (spec.tag, m)
    # and so do the 3xTF32 GEMMs of dtype fp32 (raw B at these M for nt, [hi | lo] for nn): they skip the bucket
    for layout in ("nt", "nn"):
        for n, k in ((2112, 7168), (7168, 2048), (4096, 28672)):
            fspec = fp32x3.Fp32Spec.create(n, k, layout=layout)
            inner = fspec.inner_at(160, "sm_90a")
            assert inner.raw_b == (layout == "nt") and config.tile_bucket(inner, 160) == 256
            assert pick(inner, 160) == pick(fspec.inner_at(256, "sm_90a"), 256)
    # a forced split_k does not split the bucket's 64-row tile: the cost model's split tile instead (128 rows)
    assert api.build(160, 4096, 28672, dtype="bf16", split_k=2, arch="sm_90a").config.block_m == 128
    assert config.sm90_split_config(GemmSpec.create(28672, 4096, dtype="bf16", epilogue="bias"), 192, 132,
                                    2).block_m == 128


def test_m_buckets():
    """Powers of two up to 128 rows, then whole 64-row blocks up to 384 (192 for (128, 192], 256, 320, 384), 512,
    then whole 128-row blocks up to 16384, and 16384 above (M_BUCKET_STEPS)."""
    assert [buckets.m_bucket(m) for m in (1, 64, 65, 128, 129, 192, 193, 257, 300, 320, 321, 384, 385, 512, 513, 586,
                                         640, 641, 3000, 4096, 4097, 6537, 16384, 16385, 10**6)] == \
        [64, 64, 128, 128, 192, 192, 256, 320, 320, 320, 384, 384, 512, 512, 640, 640, 640, 768, 3072, 4096, 4224,
         6656, 16384, 16384, 16384]
    assert [buckets.next_m_bucket(b) for b in (64, 128, 192, 256, 320, 384, 512, 640, 3968, 4096, 8192, 16384)] == \
        [128, 192, 256, 320, 384, 512, 640, 768, 4096, 4224, 8320, 32768]
    spec = GemmSpec.create(4096, 7168, dtype="bf16")
    # Every M of a bucket gets the same config (and so the same compiled kernel) ...
    assert config.choose_config(spec, 2945, "sm_90a") == config.choose_config(spec, 3072, "sm_90a")
    # ... chosen for the bucket's own M blocks: 586 rows no longer run the 1024-row bucket's 128x256 (80 tiles)
    assert config.choose_config(spec, 586, "sm_90a") != config.choose_config(spec, 1024, "sm_90a")
    # 64-row tiles are weighed up to 128 rows, at the 320-row bucket (SM90_ROWS64_BUCKETS) for 8-bit types only
    # (16-bit ran 128-row tiles faster there once the last M block stopped being zero-filled, session 23), and at the
    # 192-row bucket unsplit and from 96 columns (SM90_ROWS64_UNSPLIT_BUCKETS), not for FP8 block scaling (a residual
    # keeps bf16's usual buckets: plain or with a bias, 257-2048 rows weigh swapped tiles, test_sm90_swap_ab_picks)
    assert [config.choose_config(GemmSpec.create(2112, 7168, dtype="bf16", epilogue="bias+residual"), m,
                                 "sm_90a").block_m for m in (64, 200, 300, 400)] == [64, 128, 128, 128]
    assert [config.choose_config(GemmSpec.create(3072, 7168, dtype="fp8", scaling="block"), m, "sm_90a").block_m
            for m in (64, 160, 200, 256, 300, 400)] == [64, 128, 64, 64, 64, 128]
    # ... and at the 256-row bucket for 8-bit types up to 128 columns (SM90_ROWS64_NARROW_MAX_N; session 60: INT8
    # 7168 x 2048 lost at 64x224), while 16-bit keeps 128-row tiles there
    assert config.choose_config(GemmSpec.create(3072, 7168, dtype="bf16"), 256, "sm_90a").block_m == 128
    int8_wide = config.choose_config(GemmSpec.create(7168, 2048, dtype="int8"), 256, "sm_90a")
    assert (int8_wide.block_m, int8_wide.block_n) == (128, 112)
    assert all(config.choose_config(GemmSpec.create(n, 7168, dtype="int8"), 256, "sm_90a").block_m == 64
               for n in (1536, 2112, 3072))
    # 321-384 rows: the cost model's picks for 384 rows (session 24), e.g. BF16 4096 x 7168 128x96 where 512 rows
    # take 128x128
    bf16 = GemmSpec.create(4096, 7168, dtype="bf16", epilogue="bias+residual")
    assert [config.choose_config(bf16, m, "sm_90a").block_n for m in (330, 384, 385, 512)] == [96, 96, 128, 128]
    # grouped GEMMs (measured elsewhere) keep the 512-row bucket's choice there
    grouped = GemmSpec.create(2112, 7168, dtype="bf16", grouped=True)
    for groups in (1, 16):
        for m in (300, 384):
            assert config.choose_config(grouped, m, "sm_90a", groups=groups) == \
                config.choose_config(grouped, 512, "sm_90a", groups=groups)


def test_d_slice_widths_mirror_the_kernel():
    assert [sm90_tiles.sm90_d_slice_bytes(bn, 2) for bn in (256, 224, 176, 216, 8)] == [128, 64, 32, 16, 16]
    assert sm90_tiles.sm90_d_slice_bytes(216, 4) == 32


def test_sm90_stage_cap_keeps_64k_of_the_weight_in_flight_at_decode_sizes():
    """Deeper than 8 stages only where 8 hold less than 64 KB of B per column tile (H200 session 10: 64x32 and
    M = 128's 64x64 gained, 64x64 at M <= 64 lost); no M hint, large M and grouped GEMMs keep 8."""
    cap = sm90_rules.sm90_stage_cap
    assert cap(64, 32, 32) == 16 and cap(64, 32, 128) == 16
    assert cap(64, 64, 64) == 8 and cap(64, 64, 128) == 16
    assert cap(64, 56, 32) == 10
    assert cap(64, 32, None) == 8 and cap(64, 32, 4096) == 8 and cap(128, 64, 128) == 8
    fp8 = GemmSpec.create(4096, 7168, dtype="fp8", scaling="tensor")
    assert config.choose_sm90_config(fp8, 32, 132).num_stages == 16  # 64x32, measured 17.3 -> 16.3 us
    assert config.choose_sm90_config(fp8, 4096, 132).num_stages <= 8
    block = GemmSpec.create(7168, 16384, dtype="fp8", scaling="block")
    assert config.choose_sm90_config(block, 64, 132).num_stages == 8  # 64x64: 13 stages were 5% slower
    grouped = GemmSpec.create(4096, 7168, dtype="fp8", scaling="block", grouped=True)
    assert all(t[3] <= 8 for t in sm90_rules.sm90_tiles_by_cost(grouped, 32, 132, groups=4))


@pytest.mark.parametrize("kwargs,m,n,k,pick", [
    # session 38's A/B (bench/results/*exp-split-model-ab*-s38*): four shares of the wider tile were 5-12% slower
    (dict(dtype="bf16"), 256, 2048, 7168, (128, 64, 2)),            # 128x128 x4: 22.8 -> 21.0 us
    (dict(dtype="bf16", epilogue="beta+residual"), 256, 2048, 7168, (128, 64, 2)),  # 25.3 -> 22.5
    (dict(dtype="tf32"), 64, 1536, 7168, (64, 48, 4)),             # 64x96 x8: 23.7 -> 21.7
    (dict(dtype="fp8", scaling="tensor"), 128, 4096, 28672, (64, 64, 1)),  # 128x128 x4: 46.3 -> 40.2
])
def test_sm90_split_picks_count_the_last_shares_partial_loads(kwargs, m, n, k, pick):
    """The last share loads every other share's FP32 partial on its one SM (sm90_cost._SPLIT_LOAD_K_BLOCKS)."""
    from deepgemm_jit import splitk

    spec = GemmSpec.create(n, k, **kwargs)
    cfg = config.choose_config(sm90_rules.kernel_spec(spec, "sm_90a", m), m, "sm_90a", 132)
    shares = splitk.num_splits(spec, cfg, m, 132) if cfg.split_k else 1
    assert (cfg.block_m, cfg.block_n, shares) == pick, cfg.tag


def test_sm90_cost_ties_go_to_the_64_row_tile_at_decode_sizes():
    """128x64 and 64x128 cost the same in the model; at M <= 128 the 64-row tile measured faster (H200)."""
    block = GemmSpec.create(7168, 16384, dtype="fp8", scaling="block")
    tied = [t for t in sm90_rules.sm90_tiles_by_cost(block, 128, 132) if (t[1], t[2]) in ((128, 64), (64, 128))]
    assert len(tied) == 2 and tied[0][0] == tied[1][0]
    cfg = config.choose_sm90_config(block, 128, 132)
    assert (cfg.block_m, cfg.block_n) == (64, 128)
    big = config.choose_sm90_config(block, 4096, 132)
    assert big.block_m == 128  # large M: 64-row tiles are not candidates at all


@pytest.mark.parametrize("kwargs,m,n,k,split,tile", [
    (dict(dtype="bf16"), 32, 4096, 7168, False, (64, 32)),       # unsplit 64x32 fills 128 SMs: 25.8 vs 27.8 us split
    (dict(dtype="bf16"), 64, 7168, 16384, False, (64, 56)),      # 69.4 vs 73.8 split
    (dict(dtype="fp8", scaling="tensor"), 64, 2112, 7168, False, (64, 32)),  # K lanes: 66 tiles x 2, 12.2 vs 13.8
    (dict(dtype="bf16"), 32, 2112, 7168, True, None),            # only 64x16 would fill: split-K stays (18.5 vs 19.7)
    (dict(dtype="fp8", scaling="block"), 32, 2112, 7168, False, (64, 16)),  # two sets: 132 tiles, 13.3 vs 13.8 split
    (dict(dtype="fp8", scaling="block"), 128, 2112, 7168, False, (64, 32)),  # above SPLIT_SKIP_MAX_M: the model's
    (dict(dtype="fp8", scaling="block"), 64, 7168, 16384, False, (64, 64)),  # unsplit already
    (dict(dtype="bf16"), 128, 2112, 7168, True, None),           # above SPLIT_SKIP_MAX_M
    (dict(dtype="tf32"), 64, 7168, 16384, False, (64, 56)),      # 129.3 vs 138.7 us split (session 11)
    (dict(dtype="tf32"), 64, 4096, 7168, False, (64, 32)),       # 38.5 vs 42.0 split
    (dict(dtype="tf32", promoted=True), 64, 7168, 16384, True, None),  # 3xTF32's kernel: a wait per K block
])
def test_sm90_split_k_gives_way_to_a_tile_that_fills_the_sms(kwargs, m, n, k, split, tile):
    spec = GemmSpec.create(n, k, **kwargs)
    cfg = config.choose_sm90_config(spec, m, 132)
    assert cfg.split_k == split, cfg.tag
    if tile is not None:
        assert (cfg.block_m, cfg.block_n) == tile, cfg.tag


@pytest.mark.parametrize("kwargs,m,n,k,tile", [
    (dict(dtype="bf16"), 16, 24576, 1536, (64, 64)),     # 25.6 vs 27.6 us at the model's 64x192
    (dict(dtype="bf16"), 64, 32768, 512, (64, 64)),      # 16.2 vs 17.4 at 64x256
    (dict(dtype="fp8", scaling="tensor"), 32, 32768, 512, (64, 64)),  # 11.2 vs 12.2 at 64x128
    (dict(dtype="bf16"), 128, 32768, 512, (64, 128)),    # 17.6 vs 18.7 at 128x256 s3 (session 17)
    (dict(dtype="fp16"), 100, 24576, 1536, (64, 128)),   # 27.8 vs 28.8 at 128x192 s4
    (dict(dtype="fp8", scaling="tensor"), 128, 32768, 512, None),  # M = 128 measured for 16-bit types only
    (dict(dtype="bf16"), 256, 32768, 512, None),         # above SHORT_K_DECODE_M128_MAX_M: the model's pick
    (dict(dtype="bf16"), 64, 7168, 16384, None),         # long K
    (dict(dtype="fp8", scaling="block"), 16, 32768, 512, (64, 64)),  # 11.54 vs 11.70 at 64x128 (session 19)
    (dict(dtype="bf16", epilogue="bias+gelu"), 32, 32768, 512, None),  # nor with fused epilogues
])
def test_sm90_short_k_decode_tile(kwargs, m, n, k, tile):
    """At M <= 64 and a K row of at most 3072 bytes, 64x64 at the stage cap comes first (H200, session 11); at
    M = 65..128, 64x128 for 16-bit types (session 17)."""
    spec = GemmSpec.create(n, k, **kwargs)
    rule = sm90_rules._sm90_decode_short_k(spec, m, 132)
    cfg = config.choose_sm90_config(spec, m, 132)
    if tile is None:
        assert rule is None
    else:
        assert rule is not None and (cfg.block_m, cfg.block_n) == tile and not cfg.split_k, cfg.tag
        assert cfg.num_stages == sm90_rules.sm90_stage_cap(*tile, buckets.m_bucket(m)), cfg.tag


def test_sm90_d_ring_rule_and_shared_memory(monkeypatch):
    """TF32 with FP32 D at M >= 256 (also promoted: 3xTF32) stores D through a ring of 2 slices (sessions 14-15),
    which frees the whole staged tile's shared memory for stages; everything else keeps the whole staged tile."""
    tf32 = GemmSpec.create(4096, 4096, dtype="tf32")
    assert sm90_rules.sm90_d_ring(tf32, 128, 256, m_hint=4096) == sm90_rules.SM90_D_RING == 2
    assert sm90_rules.sm90_d_ring(tf32, 128, 256) == 2  # no hint: large M
    assert sm90_rules.sm90_d_ring(tf32, 128, 256, m_hint=128) == 0  # decode sizes keep their measured tiles
    assert sm90_rules.sm90_d_ring(tf32, 128, 128, pingpong=True) == 0  # a 128-row consumer walks two m64 slices
    assert sm90_rules.sm90_d_ring(tf32, 128, 136) == 0  # 544-byte rows: 32-byte slices
    assert sm90_rules.sm90_d_ring(GemmSpec.create(4096, 4096, dtype="tf32", promoted=True), 128, 176) == 2  # 3xTF32
    for spec in (GemmSpec.create(4096, 4096, dtype="bf16", out_dtype="fp32"),
                 GemmSpec.create(4096, 4096, dtype="tf32", out_dtype="bf16"),
                 GemmSpec.create(4096, 4096, dtype="tf32", epilogue="beta")):
        assert sm90_rules.sm90_d_ring(spec, 128, 256) == 0, spec
        assert sm90_rules.sm90_d_ring(spec, 128, 256, m_hint=1024) == 0, spec
    ring = config.sm90_config(tf32, 128, 256, 4, m_hint=4096)
    whole = config.sm90_config(tf32, 128, 256, 4, d_ring=0)
    assert (ring.d_ring, ring.tag) == (2, "sm90_m128n256k32_s4_g16_r2") and whole.d_ring == 0
    assert whole.smem_bytes(tf32) - ring.smem_bytes(tf32) == 2 * 64 * (256 - 2 * 32) * 4
    ring.check_for(tf32, "sm_90a")
    with pytest.raises(ValueError, match="shared memory"):
        whole.check_for(tf32, "sm_90a")
    assert config.sm90_config(tf32, 128, 256, d_ring=0).num_stages == 2
    with pytest.raises(ValueError, match="d_ring"):
        config.sm90_config(tf32, 128, 128, pingpong=True, d_ring=2)
    with pytest.raises(ValueError, match="d_ring"):
        KernelConfig("sm90", 128, 256, 32, 4, 2, 1, 4, 4, d_ring=1)
    with pytest.raises(ValueError, match="d_ring.*block_m=256"):  # consumers of 128 rows: the static_assert's
        KernelConfig("sm90", 256, 128, 32, 3, 2, 1, 4, 4, d_ring=2)
    assert config.sm90_config(tf32, 256, 128).d_ring == 0  # the rule gives such a tile none (it asked for one)
    # 16-bit D may take a ring (session 22; legal for TF32 too, though its rule keeps the whole tile); INT32 may not.
    tf32_bf16 = GemmSpec.create(4096, 4096, dtype="tf32", out_dtype="bf16")
    config.sm90_config(tf32_bf16, 128, 256, 4, d_ring=2).check_for(tf32_bf16, "sm_90a")
    int8 = GemmSpec.create(4096, 4096, dtype="int8")
    with pytest.raises(ValueError, match="out_dtype"):
        config.sm90_config(int8, 128, 256, 3, d_ring=2).check_for(int8, "sm_90a")
    monkeypatch.setenv("DEEPGEMM_JIT_NO_D_RING", "1")
    assert sm90_rules.sm90_d_ring(tf32, 128, 256) == 0


@pytest.mark.parametrize("m,n,k,tag", [
    (4096, 4096, 4096, "sm90_m128n256k32_s4_g16_r2"), (4096, 2112, 7168, "sm90_m128n176k32_s5_g16_r2"),
    (4096, 32768, 512, "sm90_m64n192k32_s6_g16_pp_r2"), (64, 32768, 512, "sm90_m64n256k32_s4_g16"),
])
def test_sm90_tf32_tiles_with_the_d_ring(m, n, k, tag):
    config.choose_sm90_config.cache_clear()
    assert config.choose_sm90_config(GemmSpec.create(n, k, dtype="tf32"), m, 132).tag == tag


def test_sm90_16bit_d_ring_rule():
    """16-bit D through the ring (session 22) only where it adds a stage to a wide cooperative tile held to 3 stages by
    its staged D tile, at mid M (256..3968 rows), without a gated unit, C or residual, and K >= 2048 unless M <= 512."""
    bf16 = GemmSpec.create(4096, 7168, dtype="bf16")
    assert sm90_rules.sm90_d_ring(bf16, 128, 240, m_hint=896) == sm90_rules.SM90_D_RING
    assert config.sm90_config(bf16, 128, 240, m_hint=896).tag == "sm90_m128n240k64_s4_g16_r2"
    assert config.sm90_config(bf16, 128, 240, d_ring=0).num_stages == 3
    assert sm90_rules.sm90_d_ring(GemmSpec.create(4096, 7168, dtype="fp16"), 128, 256, m_hint=2048) == 2
    for m_hint in (None, 128, 4096, 8192):  # large M is power-bound (ring -2..+4%); decode keeps its measured tiles
        assert sm90_rules.sm90_d_ring(bf16, 128, 240, m_hint=m_hint) == 0, m_hint
    assert sm90_rules.sm90_d_ring(bf16, 128, 176, m_hint=1024) == 0  # 4 stages already: 4 -> 5 measured 0..-3%
    assert sm90_rules.sm90_d_ring(bf16, 128, 240, pingpong=True, m_hint=1024) == 0
    assert sm90_rules.sm90_d_ring(bf16, 128, 128, m_hint=1024) == 0  # 6 stages; and two slices only: no ring
    short_k = GemmSpec.create(24576, 1536, dtype="bf16")
    assert sm90_rules.sm90_d_ring(short_k, 128, 256, m_hint=512) == 2
    assert sm90_rules.sm90_d_ring(short_k, 128, 256, m_hint=640) == 0  # short K from 1000 rows: 0..+3% slower
    for epi in ("bias", "bias+gelu", "bias_row+silu"):
        spec = GemmSpec.create(4096, 7168, dtype="bf16", epilogue=epi)
        assert sm90_rules.sm90_d_ring(spec, 128, 240, m_hint=896) == 2
    for spec in (GemmSpec.create(4096, 7168, dtype="bf16", epilogue="swiglu"),
                 GemmSpec.create(4096, 7168, dtype="bf16", epilogue="residual"),
                 GemmSpec.create(4096, 7168, dtype="bf16", out_dtype="fp32"),
                 GemmSpec.create(4096, 7168, dtype="fp8", scaling="tensor"),
                 GemmSpec.create(4096, 7168, dtype="bf16", grouped=True)):
        assert sm90_rules.sm90_d_ring(spec, 128, 240, m_hint=896) == 0, spec
    # A 16-bit ring's slices are 32 bytes or wider, and more than the ring: 128 bf16 columns are two 128-byte slices.
    assert sm90_tiles.sm90_d_ring_problem(bf16, 240, 2) is None
    assert "not more than 2 slices" in sm90_tiles.sm90_d_ring_problem(bf16, 128, 2)
    assert "not more than" in sm90_tiles.sm90_d_ring_problem(bf16, 120, 2)  # 240-byte rows: 16-byte slices
    # The dense picks that change are exactly the 3-stage ones, each one stage deeper with the same tile.
    from bench import runner
    for m in (896, 1792, 2688, 3456):  # (the usual buckets' picks: a plain bf16 D weighs swapped tiles up to 2048 rows)
        new = config._sm90_pick_tile(bf16, m, 132)[0]
        with runner.config_constants({"SM90_D_RING_16BIT_MAX_M": 0}):
            old = config._sm90_pick_tile(bf16, m, 132)[0]
        assert (new.block_m, new.block_n, new.num_stages, new.d_ring) == (old.block_m, old.block_n, 4, 2), (m, old, new)



def test_config_constants_sets_every_binding_and_restores_them():
    """bench.runner.config_constants (the experiment scripts' rule switch) sets a constant in every heuristic module
    that binds it (sm90_tiles defines the shared-memory budget, sm90_rules and config import it), restores them all,
    and refuses a name no module defines instead of inventing one."""
    from bench import runner
    budget = sm90_tiles.SM90_SMEM_BUDGET_BYTES
    spec = GemmSpec.create(4096, 7168)
    usual = config.choose_config(spec, 4096, "sm_90a", 132)
    with runner.config_constants({"SM90_SMEM_BUDGET_BYTES": 100 * 1024}):
        assert sm90_tiles.SM90_SMEM_BUDGET_BYTES == sm90_rules.SM90_SMEM_BUDGET_BYTES == 100 * 1024
        assert config.SM90_SMEM_BUDGET_BYTES == 100 * 1024
        small = config.choose_config(spec, 4096, "sm_90a", 132)
        assert small.smem_bytes(spec) <= 100 * 1024 < usual.smem_bytes(spec)
    assert sm90_tiles.SM90_SMEM_BUDGET_BYTES == sm90_rules.SM90_SMEM_BUDGET_BYTES == config.SM90_SMEM_BUDGET_BYTES
    assert sm90_tiles.SM90_SMEM_BUDGET_BYTES == budget
    assert config.choose_config(spec, 4096, "sm_90a", 132) == usual
    with pytest.raises(AttributeError, match="SM90_NO_SUCH_RULE"):
        with runner.config_constants({"SM90_NO_SUCH_RULE": 1}):
            pass


def test_fp8_tensor_mid_m_floor_on_block_n():
    """Per-tensor FP8 at K > 2048, N >= 2048 and M >= 1024 leaves out tiles narrower than 96 (session 22: 128x64 at
    2112 x 7168 ran 75.3 us at 2000 rows where 128x144 ran 50.5); the picks it moves are exactly those."""
    from bench import runner
    spec = GemmSpec.create(2112, 7168, dtype="fp8", scaling="tensor")
    # (the usual buckets' picks: swapped tiles, weighed for per-tensor FP8 up to 2048 rows since session 51, are off)
    with runner.config_constants({"SM90_SWAP_AB_M_RANGE": (0, 0)}):
        for m in (1000, 2000):
            assert (config.choose_config(spec, m, "sm_90a", 132).block_n, m) == (144, m)
            # (SM90_THIN_MIN_M: thin tiles over several rounds are left out for every dtype since session 49)
            with runner.config_constants({"SM90_FP8_TENSOR_MIN_BLOCK_N": 8, "SM90_THIN_MIN_M": 1 << 30}):
                assert config.choose_config(spec, m, "sm_90a", 132).block_n == 64
        assert config.choose_config(spec, 3000, "sm_90a", 132).block_n == 96  # 96 stays allowed
        assert config.choose_config(spec, 512, "sm_90a", 132).block_n == 64  # below 1024 rows: unchanged
        narrow_n = GemmSpec.create(1024, 7168, dtype="fp8", scaling="tensor")  # fills the SMs with narrow tiles
        assert config.choose_config(narrow_n, 1024, "sm_90a", 132).block_n == 64


def test_mn_major_b_leaves_64_wide_tiles_out_from_512_rows():
    """sm90_rules.SM90_MN_B_MIN_M_NO_64: with an MN-major B (nn, tn) the cost model chose 128x64 where it saved a
    wave of 128x128, and ran 1.4-2.2x slower than 128 / 192 columns (H200 session 24); from 512 rows 64 is not
    preferred."""
    for layout in ("nn", "tn"):
        for m, n, k in ((1000, 4608, 3584), (4096, 1280, 8192)):
            spec = GemmSpec.create(n, k, dtype="bf16", layout=layout)
            assert config.choose_config(spec, m, "sm_90a", 132).block_n == 192, (layout, m, n, k)
    spec = GemmSpec.create(4608, 3584, dtype="bf16", layout="nn")
    assert sm90_rules.sm90_block_n_preferred(spec, 64, 256) and not sm90_rules.sm90_block_n_preferred(spec, 64, 512)
    nt = GemmSpec.create(4608, 3584, dtype="bf16")
    assert sm90_rules.sm90_block_n_preferred(nt, 64, 4096)  # K-major B: unchanged


@pytest.mark.parametrize("kwargs,m,n,k,tile", [
    (dict(dtype="bf16"), 2048, 2112, 7168, (192, 176)),       # H200 s49: 89.9 -> 86.1 us (128x144 before)
    (dict(dtype="fp16"), 2304, 2112, 7168, (192, 192)),       # 112.1 -> 92.3 (bf16; 128x96 before)
    (dict(dtype="bf16", epilogue="bias+swiglu"), 2048, 2112, 7168, (192, 176)),  # 139.0 -> 84.8 (128x64 before)
    (dict(dtype="bf16"), 4096, 4096, 7168, (128, 256)),       # 4096 rows: 21.3 blocks of 192, the 128-row tiles stay
    # equal area per CTA: 91.5 (192x192) vs 90.4, 55.4 vs 53.9 (measured plain)
    (dict(dtype="bf16", epilogue="bias"), 1050, 4096, 7168, (128, 144)),
    (dict(dtype="bf16", epilogue="bias"), 1050, 4096, 4096, (128, 144)),
    (dict(dtype="bf16", epilogue="quant_fp8_tensor"), 1050, 4096, 7168, (128, 96)),  # not measured with 192 rows
    (dict(dtype="tf32"), 2048, 2112, 7168, None),             # 16-bit inputs only
    (dict(dtype="fp8", scaling="block"), 2048, 2112, 7168, None),
    (dict(dtype="bf16"), 256, 2112, 7168, None),              # below SM90_ROWS192_MIN_M
])
def test_sm90_192_row_tiles_in_the_cost_model(kwargs, m, n, k, tile):
    """The cost model picks a 192-row tile (three consumers) only for 16-bit nt dense GEMMs of >= 384 rows with a
    16-bit / FP32 D, where its rounds hold clearly less area (SM90_ROWS192_COST); None: not a 192-row tile. (The usual
    buckets' picks: swapped tiles, which a plain or bias-only bf16 D weighs up to 2048 rows, are off.)"""
    from bench import runner
    with runner.config_constants({"SM90_SWAP_AB_M_RANGE": (0, 0)}):
        cfg = config.choose_config(GemmSpec.create(n, k, **kwargs), m, "sm_90a")
    if tile is None:
        assert cfg.block_m != 192, cfg.tag
    else:
        assert (cfg.block_m, cfg.block_n) == tile, cfg.tag
        assert cfg.num_threads == (512 if cfg.block_m == 192 else 384)


@pytest.mark.parametrize("m,epilogue,tile", [
    (512, "none", (128, 64)),            # one round: the thin tile is the fastest (27.8 us vs 128x144 43.3)
    (1024, "bias+swiglu", (128, 144)),   # two rounds of 128x64 were 57.0 us, 128x144 48.4
    (2048, "bias+swiglu", (192, 176)),   # four rounds of 128x64 139.0 us, 192x192 93.0, 192x176 84.8
    (2048, "geglu", (192, 176)),
])
def test_sm90_thin_tiles_only_in_one_round(m, epilogue, tile):
    """128-row tiles of <= 64 columns only where all their tiles fit one round of the SMs (SM90_THIN_MAX_BLOCK_N)."""
    cfg = config.choose_config(GemmSpec.create(2112, 7168, dtype="bf16", epilogue=epilogue), m, "sm_90a")
    assert (cfg.block_m, cfg.block_n) == tile, cfg.tag


@pytest.mark.parametrize("kwargs,m,n,k,tile", [
    (dict(dtype="bf16"), 1000, 4608, 3584, (128, 144)),                   # 53.5 us at 128x96 -> 50.5
    (dict(dtype="bf16"), 2048, 2112, 7168, (192, 176)),                   # 92.5 at 192x192 -> 84.8
    (dict(dtype="bf16"), 4096, 2112, 7168, (128, 176)),                   # 175.1 at 128x192 -> 168.0
    (dict(dtype="fp8", scaling="tensor"), 1536, 7168, 16384, (128, 176)),  # 305.2 at 128x96 -> 268.2
    (dict(dtype="fp8", scaling="tensor"), 2048, 2112, 7168, (128, 144)),   # 63.5 at 128x96 -> 56.0
    (dict(dtype="fp8", scaling="block"), 1050, 4096, 7168, (128, 128)),    # 128x176 80.7 vs 64.4: left out
    (dict(dtype="bf16"), 384, 7168, 2048, (128, 192)),                    # 176 lost 3%
    (dict(dtype="bf16"), 128, 37888, 3584, (128, 96)),                    # decode: 144 lost 3%
])
def test_sm90_gated_units_price_their_few_16_byte_slices(kwargs, m, n, k, tile):
    """Gated units' half-width D tiles store few 16-byte slices: the cost model prices them at
    _GATED_16B_SLICE_EFFICIENCY from 384 rows and 128 columns on, not for FP8 row / block scales (sm90_few_16b_slices);
    the picks are the measured faster ones (H200 session 49)."""
    cfg = config.choose_config(GemmSpec.create(n, k, epilogue="bias+swiglu", **kwargs), m, "sm_90a")
    assert (cfg.block_m, cfg.block_n) == tile, cfg.tag


@pytest.mark.parametrize("kwargs,m,n,k,tile", [
    # H200 session 50 (scripts/exp_ab_rows.sh, us, the usual pick -> the swapped one)
    (dict(dtype="bf16"), 1050, 2112, 7168, (88, 192)),     # 51.1 -> 46.8 (cuBLAS 43.4-44.7)
    (dict(dtype="fp16"), 1050, 2112, 7168, (88, 192)),     # midm suite: 0.958 x cuBLAS (0.870 before)
    (dict(dtype="bf16"), 1050, 7168, 16384, (152, 128)),   # 330.3 -> 310.9
    (dict(dtype="bf16"), 1050, 7168, 2048, (152, 128)),    # 48.4 -> 44.9
    (dict(dtype="bf16"), 586, 2112, 7168, (152, 64)),      # 33.6 -> 30.3
    (dict(dtype="bf16"), 586, 4096, 7168, (152, 128)),     # 52.8 -> 49.3
    (dict(dtype="bf16"), 586, 7168, 2048, (88, 128)),      # 31.1 -> 29.9
    (dict(dtype="bf16"), 300, 4096, 7168, (80, 128)),      # 34.1 -> 30.9
    (dict(dtype="bf16"), 700, 7168, 2048, (104, 128)),     # 36.2 -> 33.5
    (dict(dtype="bf16"), 900, 28672, 4096, (232, 128)),    # 296.0 -> 277.2 (three stages at K >= 4096)
    (dict(dtype="bf16"), 777, 7168, 8192, (112, 128)),     # 134.5 -> 122.9
    (dict(dtype="bf16"), 333, 4096, 14336, (88, 128)),     # 60.8 -> 58.9
    (dict(dtype="bf16"), 1666, 3584, 18944, (120, 128)),   # 304.3 -> 288.1
    (dict(dtype="bf16"), 777, 3584, 18944, None),          # 88x128 at K > 14336: 157.5 -> 173.3
    (dict(dtype="bf16"), 420, 7168, 2048, None),           # 216x128 s3 (K < 4096): 24.8 -> 25.8
    (dict(dtype="bf16"), 1500, 7168, 2048, None),          # 216x128 s3: 61.8 -> 64.7
    (dict(dtype="bf16"), 586, 7168, 16384, None),          # modelled 1.01: 199.4 -> 201.8 (152x128)
    (dict(dtype="bf16"), 2048, 2112, 7168, None),          # modelled 0.984 (< 2% gain): 86.0 -> 86.8 (176x192)
    (dict(dtype="bf16"), 1050, 24576, 1536, None),         # K < 2048: 115.9 -> 113.8 at best
    (dict(dtype="bf16"), 1050, 32768, 512, None),          # 60.8 -> 60.1 at best, 62.6 at the model's 176x128
    (dict(dtype="bf16"), 4096, 2112, 7168, None),          # above SM90_SWAP_AB_M_RANGE
    (dict(dtype="bf16"), 200, 2112, 7168, None),           # below it
    # with a bias and an activation (H200 session 51, bias+gelu): 16-bit inputs from K = 4096
    (dict(dtype="bf16", epilogue="bias+gelu"), 586, 2112, 7168, (152, 64)),     # 37.6 -> 32.1
    (dict(dtype="bf16", epilogue="bias+gelu"), 1050, 7168, 16384, (152, 128)),  # 342.0 -> 320.2
    (dict(dtype="bf16", epilogue="bias+gelu"), 1666, 7168, 16384, (240, 128)),  # 515.4 -> 503.2
    (dict(dtype="bf16", epilogue="bias+gelu"), 586, 7168, 2048, None),          # 88x128: 34.8 -> 37.1
    (dict(dtype="bf16", epilogue="bias+residual"), 1050, 2112, 7168, None),     # no C / residual tile
    (dict(dtype="bf16", out_dtype="fp32"), 1050, 2112, 7168, None),  # 16-bit D only
    (dict(dtype="bf16", layout="nn"), 1050, 2112, 7168, None),       # nt only
    # H200 session 51 (scripts/exp_ab_rows.sh, us, the usual pick -> the swapped one; 31 rows, every pick faster)
    (dict(dtype="fp8", scaling="tensor"), 1050, 2112, 7168, (152, 128)),    # 30.3 -> 29.0
    (dict(dtype="fp8", scaling="tensor"), 1050, 7168, 16384, (152, 128)),   # 184.5 -> 171.9
    (dict(dtype="fp8", scaling="tensor"), 1050, 4096, 7168, (136, 128)),    # 51.5 -> 49.3
    (dict(dtype="fp8", scaling="tensor"), 300, 7168, 16384, (152, 128)),    # 72.6 -> 57.3
    (dict(dtype="fp8", scaling="tensor"), 300, 2112, 7168, (80, 64)),       # 16.4 -> 15.1
    (dict(dtype="fp8", scaling="tensor"), 777, 7168, 16384, (112, 128)),    # 140.3 -> 126.1
    (dict(dtype="fp8", scaling="tensor"), 1666, 2112, 7168, (112, 128)),    # 43.6 -> 40.4
    (dict(dtype="fp8", scaling="row"), 777, 4096, 7168, (104, 128)),        # 57.9 -> 38.6 (128x176 before)
    (dict(dtype="fp8", scaling="row"), 777, 2112, 7168, (112, 128)),        # 30.6 -> 23.2
    (dict(dtype="fp8", scaling="row"), 1050, 4096, 7168, (136, 128)),       # 57.9 -> 50.3
    (dict(dtype="fp8", scaling="row"), 300, 4096, 7168, (80, 128)),         # 26.4 -> 20.6 (64x160: 25.4)
    # a usual 64-row pick priced x1.1 (SM90_SWAP_AB_ROWS64_USUAL_COST): 14 of 14 moved picks faster
    (dict(dtype="fp8", scaling="tensor"), 300, 4096, 7168, (80, 128)),      # 25.0 -> 20.2 at 64x160 before
    (dict(dtype="fp8", scaling="tensor"), 320, 7168, 16384, (160, 128)),    # 76.7 -> 60.0
    (dict(dtype="fp8", scaling="tensor"), 264, 3584, 18944, (136, 64)),     # 45.4 -> 38.2
    (dict(dtype="fp8", scaling="row"), 1666, 7168, 16384, (120, 128)),      # 280.8 -> 266.1
    (dict(dtype="fp8", scaling="tensor"), 333, 37888, 3584, (112, 128)),    # 77.6 -> 72.3 (models suite's shapes)
    (dict(dtype="fp8", scaling="tensor"), 333, 8192, 3584, (168, 128)),     # 22.0 -> 20.5
    (dict(dtype="fp8", scaling="tensor"), 1234, 1280, 8192, (96, 128)),     # 25.2 -> 23.6
    (dict(dtype="fp8", scaling="tensor"), 2048, 2112, 7168, None),
    (dict(dtype="fp8", scaling="tensor"), 1050, 24576, 1536, None),         # K < 2048
    (dict(dtype="fp8", scaling="block"), 1050, 2112, 7168, None),           # per-tensor / per-row scales only
    (dict(dtype="fp8", scaling="tensor", out_dtype="fp32"), 1050, 2112, 7168, None),  # 16-bit D only
    (dict(dtype="fp8", scaling="tensor", epilogue="bias+gelu"), 1050, 4096, 7168, (136, 128)),  # 54.9 -> 53.1
    (dict(dtype="fp8", scaling="row", epilogue="bias+gelu"), 1050, 4096, 7168, (136, 128)),  # 62.6 -> 52.7
    # FP8 with an epilogue: two consumers only (152x64 lost 21.6 -> 27.5 us here; 88x128 21.7 -> 21.1)
    (dict(dtype="fp8", scaling="tensor", epilogue="bias+gelu"), 586, 2112, 7168, (88, 128)),
    # FP8 swapped tiles under 80 rows are not weighed from N = 2048 (SM90_SWAP_AB_FP8_MIN_BLOCK_M; session 53: the
    # old narrow pick -> the new one, us)
    (dict(dtype="fp8", scaling="tensor"), 417, 7168, 2048, (112, 128)),     # 64x128: 18.6 -> 17.0
    (dict(dtype="fp8", scaling="tensor"), 473, 7168, 2048, None),           # 72x128: 19.0 -> 17.1 (128x112)
    (dict(dtype="fp8", scaling="tensor"), 441, 6144, 4096, None),           # 56x128: 27.2 -> 24.0 (128x96)
    (dict(dtype="fp8", scaling="row"), 297, 6144, 4096, (152, 128)),        # 64x128: 21.9 -> 19.9
    (dict(dtype="fp8", scaling="row", epilogue="bias+gelu"), 297, 2112, 7168, None),  # 48x128: 18.2 -> 17.7 (64x96)
    (dict(dtype="fp8", scaling="tensor"), 353, 1280, 8192, (64, 64)),       # N = 1280 keeps them: 15.7 (128x32: 16.7)
    (dict(dtype="int8", scaling="tensor"), 1050, 2112, 7168, None),
    (dict(dtype="tf32"), 1050, 2112, 7168, None),
])
def test_sm90_swap_ab_picks(kwargs, m, n, k, tile):
    """Swapped tiles (KernelConfig.swap_ab) where the cost model weighs them (sm90_swap_ab_costed: 16-bit or FP8
    per-tensor / per-row, nt dense, K >= 2048, 257-2048 rows; a bias and an activation for 16-bit inputs from K =
    4096, for FP8 on two-consumer tiles) and they cost 2% less than the usual bucket's pick at M rounded up to 8
    rows; None: not swapped."""
    spec = GemmSpec.create(n, k, **kwargs)
    cfg = config.choose_config(spec, m, "sm_90a", 132)
    if tile is None:
        assert not cfg.swap_ab, cfg.tag
    else:
        assert (cfg.block_m, cfg.block_n, cfg.swap_ab) == (*tile, True), cfg.tag
        assert cfg.num_stages >= (3 if k >= sm90_swap_ab.SM90_SWAP_AB_SHALLOW_MIN_K else 4), cfg.tag
        assert cfg.num_threads == (512 if cfg.block_n == 192 else 384), cfg.tag
    cfg.check_for(spec, "sm_90a")


def test_swap_ab_buckets():
    """Where swapped tiles are weighed, the tile is chosen for M rounded up to 8 rows (their block_m's step), so that
    a Gemm built for 1050 rows does not serve 1100 (13 tiles of 88 rows where 12 fit 1050); elsewhere the usual
    buckets hold. Every M of such a bucket still gets the same config."""
    plain = GemmSpec.create(2112, 7168, dtype="bf16")
    assert [config.tile_bucket(plain, m) for m in (1, 256, 257, 1050, 1056, 1057, 2048, 2049)] == \
        [64, 256, 264, 1056, 1056, 1064, 2048, 2176]
    short_k = GemmSpec.create(24576, 1536, dtype="bf16")
    assert [config.tile_bucket(short_k, m) for m in (1050, 2049)] == [1152, 2176]
    assert config.tile_bucket(GemmSpec.create(2112, 7168, dtype="bf16", epilogue="bias+residual"), 1050) == 1152
    # Hopper only: elsewhere no swapped tile exists, so the usual buckets hold (and warmup plans them alone)
    assert [config.m_bucket_for(plain, m, "sm_80") for m in (257, 1050, 2048)] == [320, 1152, 2048]
    assert config.buckets_within(plain, 1152, "sm_80") == (1152,) and len(config.buckets_within(plain, 1152)) == 16
    assert config.choose_config(plain, 1049, "sm_90a") == config.choose_config(plain, 1056, "sm_90a")
    assert config.choose_config(plain, 1050, "sm_90a") != config.choose_config(plain, 1100, "sm_90a")
    # the tuner's candidates: the swapped pick first, the usual tiles after it (an equal tile unswapped too)
    cands = config.candidate_configs(plain, 1050, "sm_90a", 132)
    assert cands[0].swap_ab and any(not c.swap_ab for c in cands), [c.tag for c in cands]
    # ... ranked at the usual bucket (config.usual_tile_bucket), where the rules for 64-row tiles name their buckets:
    # FP8 at 300 rows (bucket 304) keeps the 64-row tiles of bucket 320 as candidates and as split-K tiles
    from deepgemm_jit import api
    fp8 = GemmSpec.create(2112, 7168, dtype="fp8", scaling="tensor")
    assert (config.tile_bucket(fp8, 300), config.usual_tile_bucket(fp8, 300)) == (304, 320)
    cands = config.candidate_configs(fp8, 300, "sm_90a", 132)
    assert cands[0].swap_ab and any(c.block_m == 64 for c in cands), [c.tag for c in cands]
    split = api.build(300, 2112, 7168, dtype="fp8", scaling="tensor", arch="sm_90a", split_k=2)
    assert split.config == config.sm90_split_config(fp8, 320, 132, 2) and split.config.block_m == 64, split.config.tag


def test_portable_tf32_tiles_fit_sm86_and_sm89():
    """128-row FP32 (TF32) portable tiles need 104-108 KB with three stages, more than sm_86 / sm_89 give a block:
    every TF32 build above 64 rows (and dtype='fp32') was refused there (review, session 60). They run two stages
    there; sm_80 and 16-bit types keep three."""
    import deepgemm_jit as dg

    for arch in ("sm_86", "sm_89"):
        for layout in ("nt", "nn", "tt"):
            cfg = config.choose_config(GemmSpec.create(4096, 4096, dtype="tf32", layout=layout), 4096, arch)
            assert (cfg.family, cfg.block_m, cfg.num_stages) == ("sm80", 128, 2), (arch, layout)
        assert config.choose_config(GemmSpec.create(4096, 4096, dtype="bf16"), 4096, arch).num_stages == 3
        assert dg.build_fp32(1000, 1001, 1003, arch=arch).gemm.config.num_stages == 2
    assert config.choose_config(GemmSpec.create(4096, 4096, dtype="tf32"), 4096, "sm_80").num_stages == 3
