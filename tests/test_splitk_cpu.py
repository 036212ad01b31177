"""Split-K without a GPU (splitk.py): config validation, the dispatch rule, the kernel's share partition, the
workspace sizes, build's split_k argument, explain, and real NVRTC compiles of split-K variants to sm_90a cubins
(WGMMA and TMA in the SASS, no local memory, the shared-memory mirror equal to the kernel's own)."""
import dataclasses

import numpy as np
import pytest

from deepgemm_jit import build, config, launch, sm90_cost, sm90_tiles, splitk, stream_buffers
from deepgemm_jit.config import KernelConfig
from deepgemm_jit.spec import GemmSpec
from sm90_kernels import compiled_clean


def test_config_field_and_tag():
    spec = GemmSpec.create(2112, 7168, dtype="bf16")
    cfg = config.sm90_config(spec, 64, 128, split_k=True)
    assert cfg.split_k and cfg.tag.endswith("_sk")
    assert cfg.smem_bytes(spec) == config.sm90_config(spec, 64, 128, cfg.num_stages).smem_bytes(spec) + 16
    with pytest.raises(ValueError, match="split_k must be a bool"):
        dataclasses.replace(cfg, split_k=1)
    with pytest.raises(ValueError, match="cooperative"):
        dataclasses.replace(cfg, pingpong=True)
    with pytest.raises(ValueError, match="cooperative"):
        KernelConfig("sm80", 128, 128, 32, 3, 2, 4, 8, 8, split_k=True)
    with pytest.raises(ValueError, match="at most 112 accumulators"):
        config.sm90_config(spec, 128, 256, 3, split_k=True).check_for(spec, "sm_90a")
    grouped = GemmSpec.create(2112, 7168, dtype="bf16", grouped=True)  # grouped kernels split on the device
    config.sm90_config(grouped, 64, 128, split_k=True).check_for(grouped, "sm_90a")


SHARE_K_BLOCKS = (1, 2, 5, 8, 31, 112, 256)


def share_begin(split: int, splits: int, k_blocks: int) -> int:
    """Model of Tile::set_share (sched_sm90.cuh): share s of S over n K blocks is [s * n / S, (s + 1) * n / S)."""
    return split * k_blocks // splits


@pytest.mark.parametrize("k_blocks", SHARE_K_BLOCKS)
def test_kernel_share_partition(k_blocks):
    """The model's shares cover the K blocks once, in order, nearly equal, none empty for every S the kernel allows
    (it clamps S to [1, k_blocks]); test_share_partition_matches_the_kernel ties the model to the kernel."""
    for splits in range(1, min(k_blocks, 64) + 1):
        bounds = [(share_begin(s, splits, k_blocks), share_begin(s + 1, splits, k_blocks)) for s in range(splits)]
        assert bounds[0][0] == 0 and bounds[-1][1] == k_blocks
        assert all(lo < hi for lo, hi in bounds), (k_blocks, splits)
        assert all(bounds[i][1] == bounds[i + 1][0] for i in range(splits - 1))
        sizes = [hi - lo for lo, hi in bounds]
        assert max(sizes) - min(sizes) <= 1


def _share_probe(lie: bool = False) -> str:
    """A kernel of static_asserts: the K blocks Tile::set_share gives every share of every S <= 64 over the K block
    counts above equal the model's."""
    lines = ['#include "dgjit/sched_sm90.cuh"', "using dgjit::sm90::Tile;",
             "template <unsigned int kBlocks> __device__ constexpr unsigned long long share(unsigned int s, "
             "unsigned int splits) {",
             "  Tile t{};", "  t.set_share<kBlocks>(s, splits, 0);",
             "  return (static_cast<unsigned long long>(t.k_begin) << 32) | t.k_end;", "}",
             'extern "C" __global__ void dgjit_probe(unsigned int* out) {']
    for k_blocks in SHARE_K_BLOCKS:
        for splits in range(1, min(k_blocks, 64) + 1):
            for s in range(splits):
                lo, hi = share_begin(s, splits, k_blocks), share_begin(s + 1, splits, k_blocks)
                hi += 1 if lie and (k_blocks, splits, s) == (31, 7, 3) else 0
                lines.append(f"  static_assert(share<{k_blocks}u>({s}u, {splits}u) == ({lo}ull << 32 | {hi}ull));")
    lines += ["  out[0] = 1;", "}"]
    return "\n".join(lines) + "\n"


def test_share_partition_matches_the_kernel():
    """One wrong value fails the compile (a ceil-sized partition in the kernel would)."""
    from probes import assert_probe_ties

    assert_probe_ties(_share_probe(), _share_probe(lie=True))


def test_dispatch_rule_decode_and_large_m():
    """Small M of a decode shape whose tiles leave SMs idle gets a split-K kernel and several shares per call
    (7168x16384 no longer does: 64x56 tiles fill the SMs, sm90_rules._sm90_decode_filler); M = 4096 keeps the measured
    unsplit tiles; each call's count follows its own M."""
    spec = GemmSpec.create(2112, 7168, dtype="bf16")
    cfg = config.choose_config(spec, 64, "sm_90a", 132)
    assert cfg.split_k
    assert splitk.num_splits(spec, cfg, 64, 132) > 1
    assert splitk.num_splits(spec, cfg, 64, 132, forced=1000) == -(-7168 // cfg.block_k)
    big = config.choose_config(spec, 4096, "sm_90a", 132)
    assert not big.split_k and splitk.num_splits(spec, big, 4096, 132) == 1
    for n, k in ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)):
        for dtype, kw in (("bf16", {}), ("fp8", {"scaling": "block"}), ("fp8", {"scaling": "tensor"})):
            s = GemmSpec.create(n, k, dtype=dtype, **kw)
            assert not config.choose_config(s, 4096, "sm_90a", 132).split_k, (n, k, dtype)
    # A kernel chosen for the 64-row bucket, called with many rows, stops splitting (tiles fill the GPU).
    assert splitk.num_splits(spec, cfg, 16384, 132) == 1


def test_cost_model_split_terms():
    """Splitting pays when tiles are few and K is long, and not when the tiles already fill the GPU."""
    few = sm90_cost.sm90_tile_cost(64, 2112, 7168, 64, 128, 64, 2, 132, splits=1)
    assert sm90_cost.sm90_tile_cost(64, 2112, 7168, 64, 128, 64, 2, 132, splits=7) < few / 3
    many = sm90_cost.sm90_tile_cost(4096, 4096, 7168, 128, 256, 64, 2, 132, splits=1)
    assert sm90_cost.sm90_tile_cost(4096, 4096, 7168, 128, 256, 64, 2, 132, splits=2) > many
    assert list(sm90_cost.split_candidates(512, 64)) == [1, 2]
    assert list(sm90_cost.split_candidates(100, 64)) == [1]
    assert max(sm90_cost.split_candidates(16384, 64)) == sm90_cost.MAX_SPLITS


def test_workspace_bytes():
    spec = GemmSpec.create(1000, 4096, dtype="bf16")
    cfg = config.sm90_config(spec, 64, 128, split_k=True)
    assert splitk.workspace_bytes(spec, cfg, 100, 1) == (0, 0)
    tiles = 2 * 8
    assert splitk.num_tiles(spec, cfg, 100) == tiles
    assert splitk.workspace_bytes(spec, cfg, 100, 3) == (tiles * 3 * 64 * 128 * 4, tiles * 2 * 4)
    assert splitk.SplitOperands(3, 16, 32).args() == (3, 16, 32)
    # Below 64 rows only the threads that hold valid rows keep partials: 4 of 128 at M = 1, 84 at M = 37.
    assert splitk.workspace_bytes(spec, cfg, 1, 3) == (8 * 3 * 64 * 128 * 4 * 4 // 128, 8 * 2 * 4)
    assert splitk.workspace_bytes(spec, cfg, 37, 2)[0] == 8 * 2 * 64 * 128 * 4 * 84 // 128


def test_partial_threads_are_the_valid_rows():
    """partial_threads(M) is the number of warpgroup threads whose rows (16 (t // 32) + (t % 32) // 4, and 8 below,
    the wgmma accumulator layout) include one below M: a prefix of the threads, so partials stay dense."""
    for m in range(1, 200):
        holds = [16 * (t // 32) + (t % 32) // 4 < m for t in range(128)]
        count = sum(holds)
        assert holds == [True] * count + [False] * (128 - count), m
        assert splitk.partial_threads(m) == count, m


def _partial_threads_probe(lie: bool = False) -> str:
    """A kernel of static_asserts: GemmSm90::partial_threads(M) equals splitk.partial_threads(M) for M = 0..200."""
    lines = ['#include "dgjit/gemm_sm90.cuh"', "using namespace dgjit;", "using namespace dgjit::sm90;",
             "using G = GemmSm90<bfloat16_t, bfloat16_t, bfloat16_t, 512, 1024, 64, 64, 64, 4, 8, Scaling::kNone, "
             "false, false, EpilogueNone, false, true>;",
             'extern "C" __global__ void dgjit_probe(unsigned int* out) {']
    for m in range(0, 201):
        want = splitk.partial_threads(m) + (4 if lie and m == 37 else 0)
        lines.append(f"  static_assert(G::partial_threads({m}u) == {want}u);")
    lines += ["  out[0] = 1;", "}"]
    return "\n".join(lines) + "\n"


def test_partial_threads_match_the_kernel():
    """The workspace (splitk.partial_threads) is sized by the count the kernel strides its partials with (a larger
    kernel count would write past the workspace); one wrong value fails the compile."""
    from probes import assert_probe_ties

    assert_probe_ties(_partial_threads_probe(), _partial_threads_probe(lie=True))


def test_build_split_k_argument(shared_cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    for bad, exc in ((0, ValueError), (65, ValueError), (True, TypeError), (2.0, TypeError), ("2", TypeError)):
        with pytest.raises(exc, match="split_k"):
            build(64, 1024, 4096, dtype="bf16", arch="sm_90a", split_k=bad)
    with pytest.raises(ValueError, match="sm90"):
        build(64, 1024, 4096, dtype="bf16", arch="sm_80", split_k=2)
    # Forcing shares on a tile that cannot hold them moves the heuristic to a split-K tile; 1 turns splitting off.
    g = build(4096, 4096, 4096, dtype="bf16", arch="sm_90a", split_k=2)
    assert g.config.split_k and g.split_k == 2
    assert sm90_tiles.sm90_accumulators(g.config.block_m, g.config.block_n, False) <= sm90_tiles.SPLIT_MAX_ACCUMULATORS
    # Gated quant_fp8_g128 needs 256-column tiles (128 accumulators): forced shares cannot have one.
    with pytest.raises(ValueError, match="split_k=5: no split-K tile"):
        build(64, 2000, 4592, dtype="fp16", epilogue="geglu+quant_fp8_g128", arch="sm_90a", split_k=5)
    with_bias = build(4096, 4096, 4096, dtype="bf16", epilogue="bias", arch="sm_90a", split_k=2)
    assert sm90_tiles.sm90_accumulators(with_bias.config.block_m, with_bias.config.block_n, False) <= 100
    with pytest.raises(ValueError, match="accumulators"):
        config.sm90_config(with_bias.spec, 128, 224, 3, split_k=True).check_for(with_bias.spec, "sm_90a")
    plain = build(64, 7168, 16384, dtype="bf16", arch="sm_90a", split_k=1)
    assert not plain.config.split_k
    explicit = config.sm90_config(plain.spec, 128, 256, 3)
    with pytest.raises(ValueError, match=r"split_k=2 with config sm90_m128n256k64_s3\S*: .*accumulators"):
        build(64, 7168, 16384, dtype="bf16", arch="sm_90a", config=explicit, split_k=2)
    # a cluster tile (quant_fp8_g128 narrower than a group) given with split_k: named as the caller wrote them
    # (the error named neither split_k nor the given config, only its split-K form's tag; review, session 60)
    quant = build(64, 2112, 7168, dtype="fp8", scaling="block", epilogue="quant_fp8_g128", arch="sm_90a")
    cluster_cfg = config.sm90_config(quant.spec, 64, 32)
    with pytest.raises(ValueError, match=f"split_k=2 with config {cluster_cfg.tag}: .*split-K tiles do not run"):
        build(64, 2112, 7168, dtype="fp8", scaling="block", epilogue="quant_fp8_g128", arch="sm_90a",
              config=cluster_cfg, split_k=2)
    # A swapped pick (no split-K form) gives way to the cost model's split tile; an explicit one is refused by name.
    swapped = build(1050, 2112, 7168, dtype="bf16", arch="sm_90a")
    assert swapped.config.swap_ab
    forced = build(1050, 2112, 7168, dtype="bf16", arch="sm_90a", split_k=2)
    assert forced.config.split_k and not forced.config.swap_ab and forced.split_k == 2
    with pytest.raises(ValueError, match="swapped tile.*does not split K"):
        build(1050, 2112, 7168, dtype="bf16", arch="sm_90a", config=swapped.config, split_k=2)


def test_build_deterministic_argument(shared_cache_dir, monkeypatch):
    """deterministic is a bool kept on the Gemm (its split-K calls then add atomically); explain reports it; the
    split arguments end with the mode, after the arguments older kernels take."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    for bad in (0, 1, "no", None):
        with pytest.raises(TypeError, match="deterministic"):
            build(64, 2112, 7168, dtype="bf16", arch="sm_90a", deterministic=bad)
    with pytest.raises(ValueError, match="deterministic=False"):
        build(64, 2112, 7168, dtype="fp32", arch="sm_90a", deterministic=False)
    with pytest.raises(ValueError, match="deterministic=False"):
        build(64, 2112, 7168, dtype="fp32", arch="sm_90a", deterministic=np.False_)
    assert build(64, 2112, 7168, dtype="fp32", arch="sm_90a", deterministic=np.True_).spec.k == 7168
    for bad in (0, 1, "no", None):  # as for the other dtypes (a truthy "no" must not pass as True)
        with pytest.raises(TypeError, match="deterministic"):
            build(64, 2112, 7168, dtype="fp32", arch="sm_90a", deterministic=bad)
    g = build(64, 2112, 7168, dtype="bf16", arch="sm_90a", deterministic=False)
    assert g.config.split_k and g.deterministic is False and g.explain()["split_k"]["deterministic"] is False
    assert build(64, 2112, 7168, dtype="bf16", arch="sm_90a").deterministic is True
    # INT8 keeps the ordered (exact) sum whatever was asked (splitk.adds_atomically).
    gi = build(64, 2112, 7168, dtype="int8", arch="sm_90a", deterministic=False)
    assert gi.config.split_k and not gi.split_adds_atomically and gi.explain()["split_k"]["deterministic"] is True
    assert g.split_adds_atomically
    ops = splitk.SplitOperands(3, 1 << 20, 1 << 21, atomic=True)
    assert [int(v) for v in ops.args()] == [3, 1 << 20, 1 << 21] and [int(v) for v in ops.mode_args()] == [1]
    assert [int(v) for v in splitk.SplitOperands(3).mode_args()] == [0]


def test_explain_shows_the_rule(shared_cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    g = build(64, 2112, 7168, dtype="bf16", arch="sm_90a")
    assert g.explain()["wgmma_serialized"] == []
    info = g.explain()["split_k"]
    assert info["kernel"] and info["deterministic"] and info["forced"] is None
    assert info["splits_by_m"][64] > 1 and info["splits_by_m"][4096] == 1
    assert build(4096, 4096, 4096, dtype="bf16", arch="sm_90a").explain()["split_k"] == {"kernel": False}


SPLIT_VARIANTS = [  # (dtype, scaling, out_dtype, epilogue, block_m, block_n)
    ("bf16", "none", "bf16", "none", 64, 128),
    ("bf16", "none", "bf16", "none", 128, 224),
    ("fp16", "none", "fp32", "beta+bias_row+silu+residual", 64, 64),
    ("tf32", "none", "fp32", "none", 64, 128),
    ("fp8_e4m3", "block", "bf16", "none", 64, 64),
    ("fp8_e4m3", "block", "bf16", "none", 128, 128),
    ("fp8_e4m3", "tensor", "fp16", "bias+gelu", 128, 176),
    ("fp8_e4m3", "row", "bf16", "none", 64, 112),
    ("int8", "none", "int32", "none", 64, 128),
    ("int8", "row", "bf16", "none", 128, 64),
    ("bf16", "none", "bf16", "swiglu", 64, 128),
    ("bf16", "none", "fp8_e4m3", "bias+gelu+quant_fp8_g128", 64, 128),
    # Without a bias, the group amax's bit casts made the compiler carry the accumulators through the K loop as
    # integers and ptxas wait for the wgmmas after every K block (C7517; quantize.cuh abs_bits).
    ("fp16", "none", "fp8_e4m3", "quant_fp8_g128", 64, 128),
    # A bias with a residual or C (tests/fuzz.py): the last share's partials batch spilled 8-112 bytes at 64x128 and
    # 128x128, and 128x216+ with any bias (split_max_accumulators).
    ("bf16", "none", "bf16", "bias+residual+beta", 64, 128),
    ("fp16", "none", "fp16", "bias+gelu+residual", 128, 128),
    ("bf16", "none", "bf16", "bias_row+relu+residual+beta", 128, 112),
    ("bf16", "none", "bf16", "bias", 128, 200),
]


@pytest.mark.parametrize("dtype,scaling,out_dtype,epilogue,block_m,block_n", SPLIT_VARIANTS)
def test_split_variant_matrix(dtype, scaling, out_dtype, epilogue, block_m, block_n, shared_cache_dir, monkeypatch):
    """Every split-K variant compiles to WGMMA + TMA without local memory, and its exported shared-memory size
    equals config.py's mirror."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    spec = GemmSpec.create(2112, 4096, dtype=dtype, out_dtype=None if epilogue.endswith("quant_fp8_g128") else out_dtype,
                           scaling=None if scaling == "none" else scaling, epilogue=epilogue)
    art, mix, case = compiled_clean(spec, config.sm90_config(spec, block_m, block_n, split_k=True))
    assert (mix.get("HGMMA", 0) + mix.get("QGMMA", 0) + mix.get("IGMMA", 0)) > 0 and mix.get("UTMALDG", 0) > 0, case
    assert mix.get("ATOMG", 0) + mix.get("ATOM", 0) + mix.get("RED", 0) > 0, case  # the arrival counter
    # deterministic=False: the shares' atomic adds (a run-time mode); INT8 keeps the ordered sum (exact anyway)
    assert (mix.get("REDG", 0) > 0) == (dtype != "int8"), case
    assert (mix.get("UBLKCP", 0) > 0) == (scaling == "block"), case  # bulk-copied A scales
    launch.check_layout(art, spec)


def test_promoted_tf32_spec():
    """promoted=True (the TF32 GEMM under dtype fp32) is a tf32-only flag that turns on the FP32 promotion."""
    from deepgemm_jit.spec import GemmSpec as S

    spec = S.create(1024, 3072, dtype="tf32", promoted=True)
    assert spec.promote and "_promoted" in spec.tag and not S.create(1024, 3072, dtype="tf32").promote
    with pytest.raises(ValueError, match="promoted=True applies to tf32"):
        S.create(1024, 3072, dtype="bf16", promoted=True)
    with pytest.raises(TypeError, match="promoted must be a bool"):
        S(1024, 3072, dtype="tf32", out_dtype="fp32", promoted=1)
    assert sm90_tiles.sm90_max_accumulators(spec) == 176


class _Buf:
    def __init__(self, nbytes, ptr=4096):
        self.nbytes = nbytes
        self.data = type("P", (), {"ptr": ptr})()


class _Stream:
    def __init__(self, ptr):
        self.ptr = ptr


def _recording_allocations(monkeypatch) -> list:
    """splitk's allocations replaced by fake buffers (a new address each); returns the list of their sizes."""
    made = []

    def fake_allocate(nbytes, device_id, stream):
        made.append(nbytes)
        return _Buf(nbytes, 4096 * len(made))

    monkeypatch.setattr(splitk, "_allocate", fake_allocate)
    return made


def test_workspace_refuses_to_allocate_while_capturing(monkeypatch):
    """A call that would allocate (and synchronise) inside a CUDA-graph capture gets a clear error instead of the
    driver's; a workspace that is large enough is handed out, and a capture on a stream without one of its own
    borrows the largest of the device that fits (torch.cuda.graph captures on a stream of its own)."""
    spec = GemmSpec.create(1000, 4096, dtype="bf16")
    cfg = config.sm90_config(spec, 64, 128, split_k=True)
    made = _recording_allocations(monkeypatch)
    capturing = {"now": True}
    monkeypatch.setattr(stream_buffers.runtime, "is_capturing", lambda stream: capturing["now"])
    ws = splitk.Workspace()
    s1, s2 = _Stream(11), _Stream(22)
    with pytest.raises(RuntimeError, match="before capturing a CUDA graph"):
        ws.operands(spec, cfg, 100, 3, 0, s1)
    assert made == []
    capturing["now"] = False
    first = ws.operands(spec, cfg, 100, 3, 0, s1)
    capturing["now"] = True
    assert ws.operands(spec, cfg, 64, 3, 0, s1) == first  # fits: no allocation
    assert ws.operands(spec, cfg, 64, 3, 0, s2) == first  # another stream's capture borrows it
    with pytest.raises(RuntimeError, match="before capturing a CUDA graph"):
        ws.operands(spec, cfg, 100, 3, 1, s1)  # nothing on device 1
    assert first.num_splits == 3 and made == list(splitk.workspace_bytes(spec, cfg, 100, 3))
    assert ws.operands(spec, cfg, 100, 1, 0, s1) == splitk.SplitOperands(1)


def test_each_stream_gets_its_own_workspace(monkeypatch):
    """Two streams running one Gemm at once must not meet in one workspace (overlapped micro-batches calling a
    memoized Gemm): each stream gets its own, and the per-thread default stream (handle 2) one per thread. Past
    stream_buffers.WARN_STREAMS streams on a device a RuntimeWarning says that the buffers are kept (once)."""
    import threading
    import warnings

    spec = GemmSpec.create(1000, 4096, dtype="bf16")
    cfg = config.sm90_config(spec, 64, 128, split_k=True)
    made = _recording_allocations(monkeypatch)
    monkeypatch.setattr(stream_buffers.runtime, "is_capturing", lambda stream: False)
    ws = splitk.Workspace()
    first = ws.operands(spec, cfg, 100, 3, 0, _Stream(1))
    second = ws.operands(spec, cfg, 100, 3, 0, _Stream(5))
    assert len({first.partials, first.arrivals, second.partials, second.arrivals}) == 4
    assert ws.operands(spec, cfg, 100, 3, 0, _Stream(1)) == first and len(made) == 4
    here = ws.operands(spec, cfg, 100, 3, 0, _Stream(stream_buffers.PER_THREAD_STREAM))
    there = []
    thread = threading.Thread(target=lambda: there.append(
        ws.operands(spec, cfg, 100, 3, 0, _Stream(stream_buffers.PER_THREAD_STREAM))))
    thread.start()
    thread.join()
    assert here.partials != there[0].partials and len(made) == 8
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for ptr in range(10, 10 + stream_buffers.WARN_STREAMS - 4):
            ws.operands(spec, cfg, 100, 3, 0, _Stream(ptr))
    with pytest.warns(RuntimeWarning, match="reuse streams"):
        ws.operands(spec, cfg, 100, 3, 0, _Stream(100000))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ws.operands(spec, cfg, 100, 3, 0, _Stream(100001))  # once
        ws.operands(spec, cfg, 100, 3, 1, _Stream(100001))  # another device: a set of its own
    assert len(ws.pairs()) == stream_buffers.WARN_STREAMS + 3


def test_a_capture_borrows_buffers_role_by_role(monkeypatch):
    """A capture on a stream whose own workspace is too small takes, for partials and counters each, the largest of
    the device that fits, even from two streams (each warmed up at another M)."""
    capturing = {"now": False}
    monkeypatch.setattr(splitk, "_allocate", lambda nbytes, device_id, stream: _Buf(nbytes, nbytes))
    monkeypatch.setattr(stream_buffers.runtime, "is_capturing", lambda stream: capturing["now"])
    ws = splitk.Workspace()
    ws.reserve(1000, 8, 2, 0, _Stream(1))
    ws.reserve(100, 80, 2, 0, _Stream(2))
    capturing["now"] = True
    got = ws.reserve(500, 40, 2, 0, _Stream(3))
    assert (got.partials, got.arrivals) == (1000, 80)
    # A role the capturing stream's own buffer holds stays its own (not the device's largest); only the other is
    # borrowed (fake buffers: address = size).
    capturing["now"] = False
    ws.reserve(200, 4, 2, 0, _Stream(4))
    capturing["now"] = True
    got = ws.reserve(150, 6, 2, 0, _Stream(4))
    assert (got.partials, got.arrivals) == (200, 80)  # the largest counters that fit: stream 2's
    with pytest.raises(RuntimeError, match="before capturing a CUDA graph"):
        ws.reserve(2000, 8, 2, 0, _Stream(3))


def test_allocation_zeroes_on_the_call_stream_without_a_device_sync(monkeypatch):
    """The workspace is zeroed on the call's stream and only that stream is synchronised: a device-wide
    synchronisation (or a memset on the legacy NULL stream) while another stream of the device captures a CUDA graph
    is invalid and invalidates that capture (review: the first split-K call of a Gemm on an eager stream broke a
    torch.cuda.graph capture on another)."""
    import sys
    import types

    events = []

    class FakeStream:
        def __init__(self, ptr):
            self.ptr = ptr

        def __enter__(self):
            current.append(self)

        def __exit__(self, *exc):
            current.pop()

        def synchronize(self):
            events.append(("sync", self.ptr))

    current = [FakeStream(0)]

    def zeros(n, dtype=None):
        events.append(("memset", current[-1].ptr))
        return _Buf(4 * n)

    class Device:
        def __init__(self, i):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    fake = types.SimpleNamespace(uint32="uint32", zeros=zeros, cuda=types.SimpleNamespace(
        Device=Device, runtime=types.SimpleNamespace(
            deviceSynchronize=lambda: events.append(("device sync", None)),
            streamIsCapturing=lambda ptr: 0)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    spec = GemmSpec.create(2112, 7168, dtype="bf16")
    cfg = config.sm90_config(spec, 64, 128, split_k=True)
    splitk.Workspace().operands(spec, cfg, 16, 4, 0, FakeStream(77))
    assert events == [("memset", 77), ("sync", 77)] * 2, events


def test_workspace_grows_geometrically(monkeypatch):
    """Calls whose M creeps up (a serving loop) grow the workspace at least twofold each time: it grew to each new
    size exactly, retiring (and synchronising for) one buffer per size; a review counted 32 growths and 68 MiB
    retired for 4 MiB live over M = 1..1024 at 2112x7168 bf16, 8.3 GiB retired with split_k=4 over M <= 8192."""
    spec = GemmSpec.create(2112, 7168, dtype="bf16")
    cfg = config.sm90_config(spec, 128, 64, split_k=True)
    made = []

    def fake_allocate(nbytes, device_id, stream):
        made.append(nbytes)
        return _Buf(nbytes)

    monkeypatch.setattr(splitk, "_allocate", fake_allocate)
    monkeypatch.setattr(stream_buffers.runtime, "is_capturing", lambda stream: False)
    ws = splitk.Workspace()
    stream = _Stream(5)
    for m in range(128, 8193, 128):
        needed = splitk.workspace_bytes(spec, cfg, m, 4)
        ws.operands(spec, cfg, m, 4, 0, stream)
        ((partials, arrivals),) = ws.pairs()
        assert partials.nbytes >= needed[0] and arrivals.nbytes >= needed[1]
    retired = sum(buf.nbytes for buf in ws._sets.retired)
    assert len(made) <= 16 and retired <= partials.nbytes + arrivals.nbytes, (len(made), retired)


def _scan_waves_probe(lie: bool = False) -> str:
    """A kernel of one static_assert: GroupedTileScheduler::kScanWaves equals splitk.GROUPED_SCAN_WAVES."""
    want = splitk.GROUPED_SCAN_WAVES + (1 if lie else 0)
    return "\n".join([
        '#include "dgjit/gemm_sm90.cuh"', "using namespace dgjit::sm90;",
        f"static_assert(GroupedTileScheduler<128, 32, 16, 56, true>::kScanWaves == {want}u);",
        'extern "C" __global__ void dgjit_probe(unsigned int* out) { out[0] = 1; }']) + "\n"


def test_grouped_scan_waves_match_the_kernel():
    """splitk.tail_split (explain, tests) stops splitting where the kernel's plan stops counting."""
    from probes import assert_probe_ties

    assert_probe_ties(_scan_waves_probe(), _scan_waves_probe(lie=True))


def test_persistent_grid_balanced_keeps_the_rounds():
    """FP8 block launches take the fewest CTAs that keep the walk's rounds (launch.persistent_grid); others one per
    SM, or one per unit below that."""
    from deepgemm_jit.launch import persistent_grid

    assert persistent_grid(1024, 132) == 132 and persistent_grid(1024, 132, balanced=True) == 128
    assert persistent_grid(1312, 132, balanced=True) == 132 and persistent_grid(8192, 132, balanced=True) == 131
    assert persistent_grid(100, 132, balanced=True) == 100 == persistent_grid(100, 132) and persistent_grid(0, 132) == 1
    for units in range(1, 3000, 7):
        grid = persistent_grid(units, 132, balanced=True)
        assert grid <= 132 and -(-units // grid) == -(-units // min(units, 132)), units
