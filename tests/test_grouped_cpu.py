"""Grouped GEMMs without a GPU: spec rules, rendering, real sm_90a compiles (no spills), call validation on
stand-in arrays (every error names its argument, before any launch) and the host model of the tile walk."""
import numpy as np
import pytest

import deepgemm_jit as dg
from deepgemm_jit import compiler, config, grouped, jit, sass, sm90_rules
from deepgemm_jit.errors import NoGPUError
from deepgemm_jit.spec import GemmSpec
from fakes import BASE, FakeDeviceArray


@pytest.fixture
def cache(shared_cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))


@pytest.mark.parametrize("kw,word", [
    (dict(dtype="tf32"), "grouped GEMMs take dtype"),
    (dict(dtype="int8"), "grouped GEMMs take dtype"),
    (dict(dtype="fp8", scaling="tensor"), "scaling='block'"),
    (dict(dtype="bf16", epilogue="beta"), "not beta"),
    (dict(dtype="bf16", epilogue="residual"), "not beta"),
    (dict(dtype="bf16", epilogue="quant_fp8_tensor"), "not beta"),
    (dict(dtype="bf16", layout="nn"), "layout 'nt'"),
])
def test_spec_rules(kw, word):
    with pytest.raises(ValueError, match=word):
        GemmSpec.create(256, 256, grouped=True, **kw)


def test_spec_tag_and_key_differ():
    plain, grp = GemmSpec.create(256, 512), GemmSpec.create(256, 512, grouped=True)
    assert "grouped" in grp.tag and "grouped" not in plain.tag and plain != grp
    with pytest.raises(TypeError, match="grouped must be a bool"):
        GemmSpec.create(256, 512, grouped=1)


def test_config_never_pingpong():
    spec = GemmSpec.create(4096, 2048, epilogue="bias+gelu", grouped=True)
    for m in (64, 4096, 32768):
        assert not config.choose_config(spec, m, "sm_90a").pingpong
    assert not any(c.pingpong for c in config.candidate_configs(spec, 4096, "sm_90a"))
    with pytest.raises(ValueError, match="cooperative"):
        config.sm90_config(spec, 128, 128, pingpong=True).check_for(spec, "sm_90a")


def test_render_grouped_entry():
    spec = GemmSpec.create(512, 256, grouped=True)
    cfg = config.choose_config(spec, 1024, "sm_90a")
    src = jit.render_kernel(spec, cfg).source
    assert "constexpr bool kGrouped = true;" in src and "unsigned int group_kind" in src and "long long d_ld" in src
    plain = GemmSpec.create(512, 256)
    src = jit.render_kernel(plain, config.choose_config(plain, 1024, "sm_90a")).source
    assert "constexpr bool kGrouped = false;" in src and "group_kind" not in src


@pytest.mark.parametrize("kw", [
    dict(dtype="bf16"), dict(dtype="fp16", expected_m=64), dict(dtype="fp8"),
    dict(dtype="bf16", epilogue="bias+swiglu"), dict(dtype="bf16", epilogue="bias+gelu+quant_fp8_g128"),
    dict(dtype="fp8", epilogue="bias+silu"),
])
def test_compiles_without_spills(cache, kw):
    g = dg.build_grouped(4096, 7168, arch="sm_90a", num_groups=8, **kw)
    usage = sass.resource_usage(g.artifact.cubin)[g.artifact.entry]
    assert usage["LOCAL"] == 0 and usage["STACK"] == 0, (g, usage)
    assert g.spec.grouped and not g.config.pingpong
    log = g.artifact.meta["log"]
    assert not compiler.serialization_warnings(log), (g, log)
    # FP8 (block scales): the A scales' bulk copy is there (docs/experiments/sm90-fp8-bulk-a-scales.md).
    assert (sass.opcode_mix(g.artifact.cubin).get("UBLKCP", 0) > 0) == (kw["dtype"] == "fp8"), g


def test_grouped_spec_takes_forced_configs(cache):
    """grouped_spec is the spec build_grouped compiles: a tile forced on it (bench.moe --tiles) builds as given, 64-row
    tiles included; one the spec cannot take is a ValueError before any compile."""
    spec = grouped.grouped_spec(4096, 7168, dtype="fp8")
    assert spec == GemmSpec.create(4096, 7168, dtype="fp8", grouped=True) and spec.scaling == "block"
    for block_m, block_n in ((64, 176), (128, 144)):
        cfg = config.sm90_config(spec, block_m, block_n)
        g = dg.build_grouped(4096, 7168, dtype="fp8", arch="sm_90a", config=cfg)
        assert g.spec == spec and g.config == cfg
        usage = sass.resource_usage(g.artifact.cubin)[g.artifact.entry]
        assert usage["LOCAL"] == 0 and usage["STACK"] == 0, (cfg.tag, usage)
    with pytest.raises(ValueError, match="accumulator"):
        dg.build_grouped(4096, 7168, dtype="fp8", arch="sm_90a", config=config.sm90_config(spec, 128, 256))
    with pytest.raises(ValueError, match="multiples of 16 bytes"):
        grouped.grouped_spec(4096, 7164, dtype="fp8")


def test_segments_kernel_compiles(cache):
    art = grouped.segments_kernel("sm_90a")
    usage = sass.resource_usage(art.cubin)[art.entry]
    assert usage["LOCAL"] == 0 and usage["SHARED"] >= 3 * 4 * grouped._SEGMENTS_MAX_GROUPS
    from deepgemm_jit import cubin

    # grouped.py launches it with 1024 threads and refuses more groups than it holds
    assert cubin.entry_symbols(art.cubin, art.entry, ("num_threads", "max_groups")) == {
        "num_threads": 1024, "max_groups": grouped._SEGMENTS_MAX_GROUPS}


@pytest.mark.parametrize("n,k,dtype,word", [
    (256, 100, "bf16", "K=100"), (256, 72, "fp8", "K=72"), (260, 256, "bf16", "N=260"),
])
def test_build_needs_tma_rows(cache, n, k, dtype, word):
    with pytest.raises(ValueError, match=word):
        dg.build_grouped(n, k, dtype=dtype, arch="sm_90a")


# -- call validation on stand-ins ----------------------------------------------------------------------------

N, K, G = 256, 128, 4


@pytest.fixture
def g(cache):
    return dg.build_grouped(N, K, dtype="fp16", arch="sm_90a", num_groups=G)  # fakes cannot carry bfloat16


def _arr(shape, dtype=None, ptr=BASE, strides=None):
    return FakeDeviceArray(shape, np.float16 if dtype is None else dtype, ptr=ptr, strides=strides)


def _valid():
    return dict(a=_arr((300, K)), b=_arr((G, N, K), ptr=BASE + 10**7), offs=_arr((G,), np.int32, ptr=BASE + 2 * 10**7))


@pytest.mark.parametrize("change,exc,word", [
    (lambda d: d.pop("offs"), TypeError, "exactly one of offs= or m_indices="),
    (lambda d: d.update(masked_m=_arr((G,), np.int32, ptr=BASE + 3 * 10**7)), TypeError, "exactly one"),
    (lambda d: d.update(b=_arr((N, K), ptr=BASE + 10**7)), ValueError, "b must be 3-D"),
    (lambda d: d.update(b=_arr((G, N + 8, K), ptr=BASE + 10**7)), ValueError, "b has shape"),
    (lambda d: d.update(b=_arr((G, N, K), np.float32, ptr=BASE + 10**7)), TypeError, "b has dtype"),
    (lambda d: d.update(a=_arr((300, K + 8))), ValueError, "last dimension must be K"),
    (lambda d: d.update(a=_arr((3, 100, K))), ValueError, "a must be 2-D"),
    (lambda d: d.update(offs=_arr((G,), np.int64, ptr=BASE + 2 * 10**7)), TypeError, "offs has dtype"),
    (lambda d: d.update(offs=_arr((G + 1,), np.int32, ptr=BASE + 2 * 10**7)), ValueError, "offs has 5 elements"),
    (lambda d: (d.pop("offs"), d.update(m_indices=_arr((299,), np.int32, ptr=BASE + 2 * 10**7))), ValueError,
     "m_indices has 299"),
    (lambda d: d.update(scale_a=_arr((300, 1), np.float32, ptr=BASE + 4 * 10**7)), TypeError, "takes no scales"),
    (lambda d: d.update(bias=_arr((G, N), ptr=BASE + 4 * 10**7)), TypeError, "bias= was given"),
    (lambda d: d.update(out=_arr((300, N + 8), ptr=BASE + 5 * 10**7)), ValueError, "out has shape"),
    (lambda d: d.update(out=_arr((300, N), ptr=BASE + 10**7)), ValueError, "out overlaps b"),
    (lambda d: d.update(out=FakeDeviceArray((300, N), np.float16, ptr=BASE + 5 * 10**7, read_only=True)), ValueError,
     "out is read-only"),
    (lambda d: d.update(a=_arr((300, K), ptr=BASE + 2)), ValueError, "a must start on a 16-byte boundary"),
    (lambda d: d.update(b=_arr((G, N, K), ptr=BASE + 10**7, strides=(N * K + 8, K, 1))), ValueError,
     "one after another"),
])
def test_call_errors(g, fake_gpu_memory, change, exc, word):
    kw = _valid()
    change(kw)
    a, b = kw.pop("a"), kw.pop("b")
    with pytest.raises(exc, match=word):
        g(a, b, **kw)


def test_out_on_another_device_is_refused(g, fake_gpu_memory, monkeypatch):
    """The kernel's stores go through out's tensor map: out on another GPU than a must not reach a launch (review)."""
    from deepgemm_jit import arrays

    other = BASE + (1 << 40)
    monkeypatch.setattr(arrays, "_device_of_pointer", lambda ptr: 1 if ptr >= other else 0)
    kw = _valid()
    with pytest.raises(ValueError, match="out is on device 1 but a is on device 0"):
        g(kw["a"], kw["b"], offs=kw["offs"], out=_arr((300, N), ptr=other))


def test_valid_calls_reach_the_gpu_check(g, fake_gpu_memory):
    kw = _valid()
    with pytest.raises(NoGPUError):
        g(kw["a"], kw["b"], offs=kw["offs"])
    with pytest.raises(NoGPUError):
        g(kw["a"], kw["b"], m_indices=_arr((300,), np.int32, ptr=BASE + 2 * 10**7))
    with pytest.raises(NoGPUError):
        g(_arr((G, 64, K)), kw["b"], masked_m=kw["offs"])


def test_masked_group_count_must_match(g, fake_gpu_memory):
    kw = _valid()
    with pytest.raises(ValueError, match="a has 3 groups"):
        g(_arr((3, 64, K)), kw["b"], masked_m=kw["offs"])


def test_fp8_needs_block_scales(cache, fake_gpu_memory):
    g8 = dg.build_grouped(N, K, dtype="fp8", arch="sm_90a", num_groups=G)
    a, b = _arr((300, K), np.uint8), _arr((G, N, K), np.uint8, ptr=BASE + 10**7)
    offs = _arr((G,), np.int32, ptr=BASE + 2 * 10**7)
    with pytest.raises(TypeError, match="scale_a and scale_b are required"):
        g8(a, b, offs=offs)
    sa = _arr((300, 1), np.float32, ptr=BASE + 3 * 10**7)
    with pytest.raises(ValueError, match="scale_b has shape"):
        g8(a, b, offs=offs, scale_a=sa, scale_b=_arr((G, 1), np.float32, ptr=BASE + 4 * 10**7))
    with pytest.raises(NoGPUError):
        g8(a, b, offs=offs, scale_a=sa, scale_b=_arr((G, 2, 1), np.float32, ptr=BASE + 4 * 10**7))
    # masked with max_m = 0 (an empty decode step): scale_a is (G, 0, kb) as for any max_m; the 2-D contiguous shape
    # was demanded instead (review, session 60)
    a0, mm = _arr((G, 0, K), np.uint8), _arr((G,), np.int32, ptr=BASE + 2 * 10**7)
    sb = _arr((G, 2, 1), np.float32, ptr=BASE + 4 * 10**7)
    with pytest.raises(NoGPUError):
        g8(a0, b, masked_m=mm, scale_a=_arr((G, 0, 1), np.float32, ptr=BASE + 3 * 10**7), scale_b=sb)
    with pytest.raises(ValueError, match=r"scale_a has shape \(0, 1\); expected \(\d+, 0, 1\)"):
        g8(a0, b, masked_m=mm, scale_a=_arr((0, 1), np.float32, ptr=BASE + 3 * 10**7), scale_b=sb)


# -- the tile walk ---------------------------------------------------------------------------------------------

def test_group_ranges_clamp_like_the_kernel():
    assert grouped.group_ranges(0, [100, 100, 10**9, -5], 300) == [(0, 100), (100, 100), (100, 300), (300, 300)]
    assert grouped.group_ranges(2, [5, -1, 999], 3 * 64, max_m=64) == [(0, 5), (64, 64), (128, 192)]
    assert grouped.group_ranges(1, [10, 20, 0, 0, 30, 25], 100) == [(10, 20), (0, 0), (30, 30)]


@pytest.mark.parametrize("seed", range(5))
def test_tile_walk_covers_every_row_once(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 400, size=rng.integers(1, 12))
    sizes[rng.integers(0, len(sizes))] = 0
    ends = np.cumsum(sizes)
    m = int(ends[-1]) + 3
    block_m, n_blocks = int(rng.choice([64, 128, 256])), int(rng.integers(1, 6))
    ranges = grouped.group_ranges(0, ends.tolist(), m)
    walk = grouped.tile_walk(ranges, block_m, n_blocks, group_m=int(rng.choice([1, 8, 16])), num_ctas=132)
    covered = np.zeros((m, n_blocks), dtype=int)
    for cta in walk:
        for gi, row0, row_end, nb in cta:
            s, e = ranges[gi]
            assert s <= row0 < e and row_end == e  # no empty tile, never past its group
            covered[row0:min(row0 + block_m, row_end), nb] += 1
    in_group = np.zeros(m, dtype=bool)
    for s, e in ranges:
        in_group[s:e] = True
    assert (covered[in_group] == 1).all() and (covered[~in_group] == 0).all()
    assert sum(map(len, walk)) == sum(-(-(e - s) // block_m) * n_blocks for s, e in ranges)


def test_explain(cache):
    g = dg.build_grouped(512, 256, dtype="bf16", arch="sm_90a", expected_m=300, num_groups=4)
    info = g.explain()
    assert info["spec"]["grouped"] and info["config_tag"] == g.config.tag and info["m_hint"] == 300
    assert info["local_bytes"] == 0 and info["weight_streaming"] == {"max_m": 0}


def test_offline_miss_names_the_warmup_line(tmp_path, monkeypatch):
    from deepgemm_jit.errors import KernelNotCachedError

    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    jit.clear_memo()
    with pytest.raises(KernelNotCachedError, match="--grouped"):
        dg.build_grouped(512, 256, dtype="bf16", arch="sm_90a", expected_m=300, num_groups=4)


def test_tail_split_rule_and_its_workspace_bound():
    """splitk.tail_split (the GroupedTileScheduler's choice): whole waves run whole tiles; the last wave's tiles are
    split only when they would leave half the CTAs idle, never into more than max_splits shares, and the split
    tiles x their shares fit the grid (the grouped workspace's size)."""
    from deepgemm_jit import splitk

    assert splitk.tail_split(64, 132, 4) == (0, 2) and splitk.tail_split(32, 132, 4) == (0, 4)
    assert splitk.tail_split(44, 132, 4) == (0, 3) and splitk.tail_split(67, 132, 4) == (67, 1)
    assert splitk.tail_split(160, 132, 4) == (132, 4) and splitk.tail_split(192, 132, 4) == (132, 2)
    assert splitk.tail_split(264, 132, 4) == (264, 1) and splitk.tail_split(128, 132, 4) == (128, 1)
    assert splitk.tail_split(0, 132, 4) == (0, 1) and splitk.tail_split(1, 132, 1) == (1, 1)
    assert splitk.tail_split(8 * 132 + 1, 132, 4) == (8 * 132 + 1, 1)  # past the kernel's count: never split
    for tiles in range(0, 1200):
        for max_splits in (1, 2, 4, 8):
            whole, s = splitk.tail_split(tiles, 132, max_splits)
            assert 1 <= s <= max_splits and whole <= tiles and whole % 132 == 0 or (whole == tiles and s == 1)
            assert s == 1 or (tiles - whole) * s <= 132, (tiles, max_splits, whole, s)


@pytest.mark.parametrize("n,k,epilogue,split_kernel", [
    (4096, 7168, None, True),        # the MoE rows measured (session 43)
    (7168, 2048, None, True),
    (4096, 1024, None, False),       # K below GROUPED_FP8_SPLIT_KERNEL_MIN_K: not measured, the plain kernel
    (4096, 7168, "swiglu", False),   # epilogues: not measured, the plain kernel
    (4096, 7168, "bias", False),     # the split kernel spilled with a bias read
])
def test_grouped_fp8_split_kernel_for_speed(cache, n, k, epilogue, split_kernel):
    """Past the split rule's waves, FP8 128x128 grouped tiles take the device-split kernel (one share per launch)
    only where it was measured faster; a forced copy of that config may split (build_grouped's docstring)."""
    g = dg.build_grouped(n, k, dtype="fp8", arch="sm_90a", expected_m=8192, num_groups=4, epilogue=epilogue)
    assert (g.config.block_m, g.config.block_n) == (128, 128) or not split_kernel, g
    assert g.config.split_k == split_kernel and g.max_splits == 1, g
    if split_kernel:
        forced = dg.build_grouped(n, k, dtype="fp8", arch="sm_90a", expected_m=8192, num_groups=4, config=g.config)
        assert forced.max_splits > 1, forced


@pytest.mark.parametrize("n,k,dtype,expected_m,groups,split", [
    (4096, 7168, "fp8", 256, 1, True),    # 2 x 32 tiles of 128x128: half the SMs idle
    (4096, 7168, "fp8", 1024, 1, True),   # 256 tiles: under two waves
    (4096, 7168, "fp8", 512, 2, True),
    (4096, 7168, "fp8", 512, 4, False),   # 512 tiles
    (7168, 2048, "fp8", 256, 1, False),   # 16 K blocks: a split tail lost at K = 2048
    (4096, 7168, "fp8", 8192, 4, False),  # prefill
    (4096, 7168, "bf16", 256, 1, False),  # 16-bit: the model's 128x64 stays plain (faster than 128x128 split)
    (4096, 7168, "bf16", 1024, 1, True),  # 16-bit: its 128x256 pick becomes 128x128 split
    (7168, 2048, "fp16", 256, 8, True),   # 32 K blocks of 64
    (4096, 7168, "bf16", 1024, 8, False),  # 2048 tiles of 128x128: past the kernel's count
])
def test_grouped_split_kernel_rule(cache, n, k, dtype, expected_m, groups, split):
    """`split`: whether launches may split. FP8 128x128 tiles compile the split-K kernel everywhere (its scale warp's
    A-scale copy made it the fastest grouped kernel, sm90_rules.grouped_fp8_split_kernel); only where the split rule
    chose it do launches count and split (max_splits > 1), elsewhere they pass one share and no workspace."""
    g = dg.build_grouped(n, k, dtype=dtype, arch="sm_90a", expected_m=expected_m, num_groups=groups)
    assert g.config.split_k == (split or dtype == "fp8") and (g.max_splits > 1) == split, g
    assert config.grouped_launch_splits(g.spec, expected_m, 132, groups) == split, g
    if split and dtype != "fp8":
        assert (g.config.block_m, g.config.block_n) == sm90_rules.GROUPED_SPLIT_TILE_16BIT, g
    if split:
        usage = sass.resource_usage(g.artifact.cubin)[g.artifact.entry]
        assert usage["LOCAL"] == 0 and usage["STACK"] == 0, usage
        log = g.artifact.meta["log"]
        assert not compiler.serialization_warnings(log), log
        # the split arguments reach the kernel (a grouped entry once dropped them: no reduction was compiled)
        assert sass.opcode_mix(g.artifact.cubin).get("ATOMG", 0) > 0, g
        info = g.explain()["split_k"]
        assert info["on_device"] and info["max_splits"] == 4 and info["deterministic"], info
        assert info["whole_and_shares_by_tiles"][64] == (0, 2) and info["whole_and_shares_by_tiles"][160] == (132, 4)
    elif dtype == "fp8":  # the split-K kernel, launched with one share: nothing counted or split
        info = g.explain()["split_k"]
        assert info["kernel"] and info["max_splits"] == 1, info
        assert all(shares == 1 for _, shares in info["whole_and_shares_by_tiles"].values()), info
    else:
        assert g.explain()["split_k"] == {"kernel": False}
    with pytest.raises(TypeError, match="deterministic"):
        dg.build_grouped(n, k, dtype=dtype, arch="sm_90a", deterministic=1)


@pytest.mark.parametrize("dtype,epilogue,split", [
    ("fp8", "bias+silu", False), ("bf16", "bias", False), ("bf16", "swiglu", True),
    ("bf16", "bias+gelu+quant_fp8_g128", False), ("bf16", "gelu+quant_fp8_g128", True),
])
def test_grouped_split_kernel_epilogues(cache, dtype, epilogue, split):
    """Where the split rule holds, epilogues without a bias keep the split kernel; with a bias (whose read cost the
    split kernel a stack frame) the plain one. Either compiles without local memory or stack."""
    g = dg.build_grouped(4096, 7168, dtype=dtype, epilogue=epilogue, arch="sm_90a", expected_m=1024, num_groups=1)
    assert g.config.split_k == split, g
    usage = sass.resource_usage(g.artifact.cubin)[g.artifact.entry]
    assert usage["LOCAL"] == 0 and usage["STACK"] == 0, (g, usage)


def test_scales_out_must_be_distinct_and_apart_from_inputs(cache, fake_gpu_memory):
    """quant_fp8_g128's scales_out is written while the kernel reads its inputs: over a, b, the group bounds or the
    scales it would be overwritten mid-launch; interleaving strides would make two groups' scales one word. Only
    zero strides and overlap with out were refused."""
    gq = dg.build_grouped(N, K, dtype="fp8", arch="sm_90a", num_groups=G, epilogue="quant_fp8_g128")
    rows, u1 = 300, np.uint8
    kw = dict(offs=_arr((G,), np.int32, ptr=BASE + 2 * 10**7),
              scale_a=_arr((rows, 1), np.float32, ptr=BASE + 3 * 10**7),
              scale_b=_arr((G, 2, 1), np.float32, ptr=BASE + 4 * 10**7),
              out=_arr((rows, N), u1, ptr=BASE + 5 * 10**7))
    a, b = _arr((rows, K), u1), _arr((G, N, K), u1, ptr=BASE + 10**7)
    groups = N // 128
    for ptr, strides, word in ((BASE + 64, None, "scales_out overlaps a"), (BASE + 10**7, None, "overlaps b"),
                               (BASE + 2 * 10**7, None, "overlaps offs"), (BASE + 3 * 10**7, None, "overlaps scale_a"),
                               (BASE + 6 * 10**7, (1, 1), "interleaving strides")):
        with pytest.raises(ValueError, match=word):
            gq(a, b, **kw, scales_out=_arr((rows, groups), np.float32, ptr=ptr, strides=strides))
    with pytest.raises(NoGPUError):  # apart and distinct: validation passes
        gq(a, b, **kw, scales_out=_arr((rows, groups), np.float32, ptr=BASE + 6 * 10**7))


def test_segments_and_gemm_launch_as_one_sequence(g):
    """m_indices= calls launch the segments kernel (writing the stream's segments table) and then the GEMM reading
    it; two threads on one stream interleaved the four launches (review, session 60): both run under the
    GroupedGemm's launch lock, a single launch without it."""
    held = []
    plan = type("Plan", (), {"run": lambda self, stream: held.append(g._launch_lock.locked())})()
    g._run((plan, plan), object())
    g._run((plan,), object())
    assert held == [True, True, False]



def test_replayed_plans_launch_as_one_sequence(g, monkeypatch):
    """A call that replays kept plans (out= given: the hot path, which skips every check) runs them through the
    same lock as a planned call: the segments kernel and the GEMM of an m_indices= call stay together."""
    held = []
    plan = type("Plan", (), {"run": lambda self, stream: held.append((g._launch_lock.locked(), stream))})()
    stream = object()
    monkeypatch.setattr(grouped, "signature", lambda x: ("signature of", id(x)))
    monkeypatch.setattr(g._plans, "lookup", lambda key, s: ((plan, plan), stream))
    out = _arr((300, N), ptr=BASE + 5 * 10**7)
    assert g(_arr((300, K)), _arr((G, N, K), ptr=BASE + 10**7), m_indices=_arr((300,), np.int32,
             ptr=BASE + 2 * 10**7), out=out) is out
    assert held == [(True, stream), (True, stream)]
