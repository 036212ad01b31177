"""FP8 block scaling, A scales by bulk copy (docs/experiments/sm90-fp8-bulk-a-scales.md) without a GPU: the host's
flag (launch.bulk_a_scales) on stand-in scale arrays, a model of the kernel's per-tile copy size checked against the
PTX rules and the tile walks (and tied to gemm_sm90.cuh by static_asserts), and the kernel signature the A/B script
relies on."""
import random

import numpy as np
import pytest

from deepgemm_jit import arrays, config, grouped, jit, launch, sm90_rules, sm90_tiles
from deepgemm_jit.arrays import scale_view
from deepgemm_jit.spec import GemmSpec
from fakes import BASE, FakeDeviceArray
from probes import assert_probe_ties

BLOCK = GemmSpec.create(512, 1024, dtype="fp8", scaling="block")
KB = 8  # K groups of the stand-ins (K = 1024)


def _flag(arr, m, spec=BLOCK, kb=KB):
    return launch.bulk_a_scales(spec, scale_view(arr, "scale_a", (m, kb), "x"), m)


def _m_major(m, pitch, kb=KB, ptr=BASE):
    """scale_a (m, kb) as a transposed view of (kb, pitch) storage: element (i, j) at i + j * pitch."""
    return FakeDeviceArray((m, kb), ptr=ptr, strides=(1, pitch))


# ------------------------------------------------------------------------------------------------ the host's flag
@pytest.mark.parametrize("m,pitch", [(300, 300), (301, 304), (4096, 4096), (77, 80), (5, 8), (2, 4)])
def test_flag_on_for_aligned_m_major(m, pitch, fake_gpu_memory):
    assert _flag(_m_major(m, pitch), m), (m, pitch)


@pytest.mark.parametrize("arr,m,why", [
    (FakeDeviceArray((300, KB)), 300, "row-major"),
    (_m_major(300, 300, ptr=BASE + 4), 300, "base 4 bytes past a 16-byte boundary"),
    (_m_major(300, 300, ptr=BASE + 8), 300, "base 8 bytes past a 16-byte boundary"),
    (_m_major(77, 77), 77, "column pitch 77: not a multiple of 4"),
    (_m_major(77, 78), 77, "column pitch 78: not a multiple of 4"),
    (_m_major(78, 76), 78, "column pitch 76 < round_up(78, 4) = 80 (columns overlap)"),
    (_m_major(300, 0), 300, "one column broadcast over K (pitch 0)"),
    (FakeDeviceArray((300, KB), strides=(2, 1024)), 300, "every other row (stride_m 2)"),
])
def test_flag_off(arr, m, why, fake_gpu_memory):
    assert not _flag(arr, m), why


@pytest.mark.parametrize("m,pitch,kb", [(301, 304, KB), (77, 80, KB), (5, 8, KB), (301, 301 * 4, 1), (1, 4, KB)])
def test_flag_needs_the_last_columns_tail_inside_the_allocation(m, pitch, kb, fake_gpu_memory, monkeypatch):
    """The last column's copy reads rows up to round_up(M, 4): 1-3 floats past the array when M % 4 != 0. Allowed
    only when the allocation holding scale_a reaches that far (padded storage, as DeepGEMM's layout and quantize's);
    a tight storage, or a driver that cannot tell, leaves the tiles to the scale warp."""
    spec = BLOCK if kb > 1 else GemmSpec.create(512, 128, dtype="fp8", scaling="block")
    arr = _m_major(m, pitch, kb)
    last = BASE + 4 * ((kb - 1) * pitch + m)            # one past the view's last element
    tail = BASE + 4 * ((kb - 1) * pitch + -(-m // 4) * 4)
    assert tail > last
    for end, want in ((tail, True), (tail + 4096, True), (tail - 4, False), (last, False), (None, False)):
        monkeypatch.setattr(arrays, "allocation_end", lambda ptr, end=end: end)
        assert _flag(arr, m, spec, kb) == want, (end, want)


@pytest.mark.parametrize("m", [4, 300, 4096])
def test_flag_of_whole_rows_of_four_asks_no_allocation(m, fake_gpu_memory, monkeypatch):
    """M % 4 == 0: the copies end at the array's last element; the driver is not asked."""
    def ask(ptr):
        raise AssertionError("allocation_end called")
    monkeypatch.setattr(arrays, "allocation_end", ask)
    assert _flag(_m_major(m, m), m)


def test_allocation_end_without_a_driver_is_none(monkeypatch):
    """No libcuda (this CPU machine) or a pointer the driver does not know: None, so the bulk path is not taken."""
    from deepgemm_jit import driver

    def missing():
        raise OSError("libcuda.so.1: cannot open shared object file")
    monkeypatch.setattr(driver, "libcuda", missing)
    assert arrays.allocation_end(BASE) is None


def test_decode_sizes_take_the_scale_warp(fake_gpu_memory):
    """Launches of at most 128 rows leave scale_a to the scale warp even where the bulk copy may run (measured faster
    there, launch.BULK_A_SCALES_MIN_M); from 129 rows on the bulk copy is used."""
    for m, want in ((1, False), (77, False), (128, False), (129, True), (300, True), (4096, True)):
        sa = scale_view(_m_major(m, -(-m // 4) * 4), "scale_a", (m, KB), "x")
        assert launch.bulk_a_scales(BLOCK, sa, m), m
        assert launch.use_bulk_a_scales(BLOCK, sa, m) == want, m


def test_flag_single_row_and_single_group(fake_gpu_memory):
    # M = 1: the row stride means nothing (scale_view drops it); the one row is row 0 of each column.
    assert _flag(_m_major(1, 4), 1)
    assert not _flag(FakeDeviceArray((1, KB)), 1)  # row-major: column pitch 1
    assert not _flag(_m_major(1, 1), 1)
    # One K group (K <= 128): no next column to stay clear of.
    one = GemmSpec.create(512, 128, dtype="fp8", scaling="block")
    assert _flag(FakeDeviceArray((300, 1)), 300, one, kb=1)
    assert not _flag(FakeDeviceArray((300, 1), ptr=BASE + 4), 300, one, kb=1)


def test_flag_off_for_other_kernels_and_the_switch(fake_gpu_memory, monkeypatch):
    sa = scale_view(_m_major(300, 300), "scale_a", (300, KB), "x")
    assert launch.bulk_a_scales(BLOCK, sa, 300)
    for scaling in ("tensor", "row"):
        spec = GemmSpec.create(512, 1024, dtype="fp8", scaling=scaling)
        assert not launch.bulk_a_scales(spec, sa, 300), scaling
    assert not launch.bulk_a_scales(BLOCK, None, 300)
    monkeypatch.setenv("DEEPGEMM_JIT_NO_BULK_SCALES", "1")
    assert not launch.bulk_a_scales(BLOCK, sa, 300)
    monkeypatch.setenv("DEEPGEMM_JIT_NO_BULK_SCALES", "0")
    assert launch.bulk_a_scales(BLOCK, sa, 300)
    monkeypatch.setenv("DEEPGEMM_JIT_NO_BULK_SCALES", "maybe")
    with pytest.raises(ValueError, match="not a boolean"):
        launch.bulk_a_scales(BLOCK, sa, 300)


def test_flag_for_grouped_layouts(fake_gpu_memory):
    """Grouped scale rows are the global rows (grouped._scale_rows): contiguous (M, KB), masked (G, max_m, KB) whose
    groups lie one after another along the rows, i.e. (KB, G * max_m) storage for the M-major form."""
    spec = GemmSpec.create(512, 1024, dtype="fp8", scaling="block", grouped=True)
    g, max_m, m = 4, 77, 4 * 77

    def rows(arr, shape):
        return grouped._scale_rows(arr, "scale_a", shape, "x")

    contiguous = rows(FakeDeviceArray((301, KB), strides=(1, 304)), (301, KB))
    assert launch.bulk_a_scales(spec, contiguous, 301)
    assert not launch.bulk_a_scales(spec, rows(FakeDeviceArray((301, KB)), (301, KB)), 301)
    # Masked, M-major over all groups' rows: pitch G * max_m = 308 (a multiple of 4 although max_m is odd; the tiles
    # of groups starting on odd rows fall back to the scale warp inside the kernel).
    masked = rows(FakeDeviceArray((g, max_m, KB), strides=(max_m, 1, m)), (g, max_m, KB))
    assert (masked.stride_i, masked.stride_j) == (1, m) and launch.bulk_a_scales(spec, masked, m)
    padded = rows(FakeDeviceArray((g, max_m, KB), strides=(max_m, 1, m + 4)), (g, max_m, KB))
    assert launch.bulk_a_scales(spec, padded, m)
    masked_rows = rows(FakeDeviceArray((g, max_m, KB)), (g, max_m, KB))
    assert not launch.bulk_a_scales(spec, masked_rows, m)


# ------------------------------------------------------------------- the layout the library allocates (M-major)
def _stand_in(view, ptr=BASE):
    """A FakeDeviceArray at `ptr` with the shape and element strides of a NumPy / torch CPU array."""
    if hasattr(view, "stride"):  # torch: element strides
        strides = tuple(view.stride())
    else:
        strides = tuple(st // view.itemsize for st in view.strides)
    return FakeDeviceArray(tuple(view.shape), ptr=ptr, strides=strides)


def _cupy_without_memory(shape):
    """A CuPy float32 array over a made-up device address (no GPU needed: views and reshapes only read metadata)."""
    import cupy

    size = 4 * int(np.prod(shape))
    memory = cupy.cuda.memory.UnownedMemory(BASE, size, None, device_id=0)
    return cupy.ndarray(shape, np.float32, cupy.cuda.memory.MemoryPointer(memory, 0))


def _data_ptr(x) -> int:
    if hasattr(x, "data_ptr"):
        return x.data_ptr()
    return x.data.ptr if hasattr(x.data, "ptr") else x.ctypes.data


def _m_major_views(m, kb):
    """The M-major (m, kb) scales of quantize / quant_fp8_g128 (arrays.mn_major_view of mn_major_storage_shape) in
    NumPy, torch and CuPy (over no memory): (storage, view) pairs."""
    torch = pytest.importorskip("torch")
    shape = arrays.mn_major_storage_shape(m, kb)
    pairs = []
    for storage in (np.empty(shape, np.float32), torch.empty(shape, dtype=torch.float32), _cupy_without_memory(shape)):
        pairs.append((storage, arrays.mn_major_view(storage, m)))
    return pairs


@pytest.mark.torch
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 77, 300, 301, 4096])
def test_default_layout_is_bulk_for_dense(m, fake_gpu_memory):
    """Storage (kb, round_up(M, 4)) seen as its transpose cut to M rows: strides (1, round_up(M, 4)), the storage's
    memory (no copy), and launch.bulk_a_scales takes it."""
    m4 = -(-m // 4) * 4
    assert arrays.mn_major_storage_shape(m, KB) == (KB, m4)
    for storage, view in _m_major_views(m, KB):
        case = f"{m=} {type(view).__module__}"
        assert tuple(view.shape) == (m, KB), case
        assert _stand_in(view).__cuda_array_interface__["strides"] == (4, 4 * m4), case
        assert _data_ptr(view) == _data_ptr(storage), case
        assert _flag(_stand_in(view), m), case


@pytest.mark.parametrize("g,max_m", [(4, 77), (8, 128), (3, 1), (2, 2), (5, 300)])
@pytest.mark.torch
def test_default_layout_reshaped_to_masked_groups_is_bulk(g, max_m, fake_gpu_memory):
    """A masked A quantized as one (G * max_m, K) matrix: its M-major scales reshaped to (G, max_m, kb) stay a view
    (NumPy, torch and CuPy), grouped._scale_rows flattens them back to rows g * max_m + i with stride 1 and the
    column pitch round_up(G * max_m, 4), and the bulk path takes them."""
    spec = GemmSpec.create(512, 1024, dtype="fp8", scaling="block", grouped=True)
    m = g * max_m
    for _, flat in _m_major_views(m, KB):
        case = f"{g=} {max_m=} {type(flat).__module__}"
        masked = flat.reshape(g, max_m, KB)
        assert _data_ptr(masked) == _data_ptr(flat), case  # a copy would be new memory
        rows = grouped._scale_rows(_stand_in(masked), "scale_a", (g, max_m, KB), "x")
        assert (rows.shape, rows.stride_i) == ((m, KB), 1), case
        assert rows.stride_j == -(-m // 4) * 4, case
        assert launch.bulk_a_scales(spec, rows, m), case


@pytest.fixture
def host_arrays(monkeypatch):
    """arrays.new_array on the host: NumPy for "cupy", CPU torch for "torch" (same shapes, dtypes and strides)."""
    torch = pytest.importorskip("torch")

    def new_array(kind, shape, name, device_id, stream=None, explicit=False):
        assert name == "fp32"
        return torch.empty(shape, dtype=torch.float32) if kind == "torch" else np.empty(shape, np.float32)
    monkeypatch.setattr(arrays, "new_array", new_array)


@pytest.mark.torch
@pytest.mark.parametrize("kind", ["cupy", "torch"])
@pytest.mark.parametrize("m", [1, 5, 77, 256])
def test_quant_g128_default_scales_out_feed_the_bulk_path(kind, m, host_arrays, fake_gpu_memory):
    """gemm1(epilogue=quant_fp8_g128) without scales_out= allocates them M-major (arrays.new_mn_major_scales, as
    Gemm.__call__ does), so gemm2(block fp8, scale_a=them) takes the bulk path; the grouped GEMM's allocation
    likewise, masked calls as (G, max_m, groups) views of all rows."""
    first = GemmSpec.create(KB * 128, 512, dtype="bf16", epilogue="quant_fp8_g128")
    shape = first.scales_out_shape(m)
    scales = arrays.new_mn_major_scales(kind, *shape, 0)
    assert tuple(scales.shape) == shape == (m, KB)
    assert _stand_in(scales).__cuda_array_interface__["strides"] == (4, 4 * (-(-m // 4) * 4))
    assert _flag(_stand_in(scales), m)

    g = object.__new__(grouped.GroupedGemm)  # only its spec is used by the allocation and the view
    g.spec = GemmSpec.create(KB * 128, 512, dtype="bf16", epilogue="quant_fp8_g128", grouped=True)
    nxt = GemmSpec.create(512, KB * 128, dtype="fp8", scaling="block", grouped=True)
    for masked, num_groups, max_m in ((False, 3, 0), (True, 3, m), (True, 1, m)):
        rows = num_groups * max_m if masked else m
        out = g._new_scales_out(kind, masked, num_groups, max_m, rows, 0)
        case = f"{kind=} {m=} {masked=} {num_groups=}"
        assert tuple(out.shape) == ((num_groups, max_m, KB) if masked else (m, KB)), case
        view = g._scales_out_view(_stand_in(out), masked, num_groups, max_m, rows)
        assert (view.shape, view.stride_j) == ((rows, KB), -(-rows // 4) * 4), case
        # and the next grouped FP8 GEMM reads them as its scale_a on the bulk path
        sa = grouped._scale_rows(_stand_in(out), "scale_a", tuple(out.shape), "x")
        assert launch.bulk_a_scales(nxt, sa, rows), case


# ------------------------------------------------------------------- the kernel's per-tile copy, modelled and tied
def bulk_bytes(is_bulk: bool, row0: int, row_end: int, block_m: int) -> int:
    """Model of GemmSm90::a_scale_bulk_bytes (block scaling): the bytes the TMA thread copies per K block; 0: the
    scale warp copies the tile's A scales."""
    if not is_bulk or row0 % 4 or row_end <= row0:
        return 0
    rows = row_end - row0
    return 4 * (-(-rows // 4) * 4 if rows < block_m else block_m)


def _walks(rng):
    """Tile walks (group, row0, row_end, n_block) of dense, contiguous (odd group starts) and masked calls."""
    for _ in range(40):
        block_m = rng.choice([64, 128, 256])
        m = rng.randint(1, 2000)
        yield block_m, m, grouped.tile_walk([(0, m)], block_m, 1, 8, 1)[0]  # dense: one group of all rows
        cuts = sorted(rng.sample(range(1, m + 1), min(m, rng.randint(1, 6)))) if m > 1 else [m]
        cuts[-1] = m
        ranges = grouped.group_ranges(0, cuts, m)
        yield block_m, m, grouped.tile_walk(ranges, block_m, 1, 8, 1)[0]
        g, max_m = rng.randint(1, 5), rng.randint(1, 400)
        counts = [rng.randint(-3, max_m + 3) for _ in range(g)]
        ranges = grouped.group_ranges(2, counts, g * max_m, max_m=max_m)
        yield block_m, g * max_m, grouped.tile_walk(ranges, block_m, 1, 8, 1)[0]


def test_bulk_copy_rules_on_tile_walks():
    """For every tile the kernel runs: a bulk copy starts 16-byte aligned (row0 % 4 == 0, so with a 16-byte aligned
    base and a column pitch of a multiple of 4 floats), is a multiple of 16 bytes (PTX: cp.async.bulk), fits the
    slot's kBlockM A floats, covers every row the tile stores (those before row_end) and reads nothing past
    round_up(M, 4) (inside the column when the pitch is at least that); tiles it skips are the scale warp's."""
    rng = random.Random(7)
    seen_bulk = seen_fallback = 0
    for block_m, m, tiles in _walks(rng):
        for _, row0, row_end, _ in tiles:
            n = bulk_bytes(True, row0, row_end, block_m)
            if n == 0:
                assert row0 % 4 != 0, (block_m, m, row0, row_end)
                seen_fallback += 1
                continue
            seen_bulk += 1
            assert n % 16 == 0 and (row0 * 4) % 16 == 0 and n <= 4 * block_m, (block_m, row0, row_end, n)
            assert row0 + n // 4 >= min(row0 + block_m, row_end), (block_m, row0, row_end, n)
            assert row0 + n // 4 <= -(-m // 4) * 4, (block_m, m, row0, row_end, n)
            assert bulk_bytes(False, row0, row_end, block_m) == 0
    assert seen_bulk > 100 and seen_fallback > 10, (seen_bulk, seen_fallback)


_PROBE_CASES = [(0, 1), (0, 3), (0, 4), (0, 5), (0, 64), (0, 65), (0, 127), (0, 128), (0, 129), (0, 300), (4, 5),
                (8, 200), (64, 77), (128, 257), (3, 100), (5, 6), (7, 300), (10, 10), (12, 8), (256, 513)]


def _probe_source(lie: bool = False) -> str:
    lines = ['#include "dgjit/gemm_sm90.cuh"', "using namespace dgjit;", "using namespace dgjit::sm90;", ""]
    asserts = []
    for block_m in (64, 128, 256):
        t = (f"GemmSm90<float_e4m3_t, float_e4m3_t, bfloat16_t, 512, 1024, {block_m}, 64, 128, 2, 8, Scaling::kBlock, "
             "true, false>")
        lines.append(f"using G{block_m} = {t};")
        for row0, row_end in _PROBE_CASES:
            for is_bulk in (0, 1):
                want = bulk_bytes(bool(is_bulk), row0, row_end, block_m)
                if lie and (block_m, row0, row_end, is_bulk) == (128, 0, 5, 1):
                    want += 4
                asserts.append(f"static_assert(G{block_m}::a_scale_bulk_bytes({is_bulk}u, {row0}u, {row_end}u) == "
                               f"{want}u);")
    lines.append("using GT = GemmSm90<float_e4m3_t, float_e4m3_t, bfloat16_t, 512, 1024, 128, 128, 128, 4, 8, "
                 "Scaling::kTensor, true, false>;")
    asserts.append("static_assert(GT::a_scale_bulk_bytes(1u, 0u, 300u) == 0u);")  # only block scaling copies
    lines.append('extern "C" __global__ void dgjit_probe(unsigned int* out) {')
    lines += ["  " + a for a in asserts]
    lines += ["  out[0] = 1;", "}"]
    return "\n".join(lines) + "\n"


def test_model_matches_the_kernel():
    """bulk_bytes is GemmSm90::a_scale_bulk_bytes (compile-time), and one wrong value fails the compile."""
    assert_probe_ties(_probe_source(), _probe_source(lie=True))


# ------------------------------------------------------------------------------------------------- the signature
@pytest.mark.parametrize("kw,cfg_kw", [
    (dict(dtype="fp8", scaling="block"), {}),
    (dict(dtype="bf16"), {}),
    (dict(dtype="fp8", scaling="block", grouped=True), {}),
    (dict(dtype="fp8", scaling="block"), dict(split_k=True)),
    (dict(dtype="bf16", epilogue="bias+gelu+quant_fp8_g128"), {}),
    (dict(dtype="bf16", epilogue="beta+bias+gelu+residual"), {}),
])
def test_flag_is_the_last_kernel_parameter(kw, cfg_kw):
    """launch.plan appends the flag, then A's box rows (launch.a_box_rows), then (split-K kernels) the split mode,
    then (dense kernels) the edge maps (launch.edge_maps), after every other argument, in the order the templates
    added them; kernels rendered from templates without them (an A/B against an older tree) then take the same
    packed arguments, since cuLaunchKernel reads only the parameters the kernel declares."""
    spec = GemmSpec.create(512, 1024, **kw)
    cfg = config.sm90_config(spec, 128, 128, **cfg_kw)
    src = jit.render_kernel(spec, cfg).source
    entry = src[src.index('extern "C" __global__'):]
    params = entry[entry.index("(") + 1:entry.index(") {")]
    tail = [["unsigned", "int", "sa_is_bulk"], ["unsigned", "int", "a_box_rows"]]
    if cfg.split_k:
        tail.append(["unsigned", "int", "split_atomic"])
    if not spec.grouped:
        tail += [["const", "__grid_constant__", "CUtensorMap", f"tmap_{x}_edge"] for x in "ab"]
        tail.append(["unsigned", "int", "a_edge_rows"])
    assert [p.split() for p in params.split(",")[-len(tail):]] == tail, params
    assert "sa_is_bulk}" in src


def test_stage_slot_unchanged():
    """The A part of a stage's scale slot is kBlockM floats, what a bulk copy writes at most; the slot (and so the
    shared-memory mirror) is what it was, which keeps older template trees comparable through this host code."""
    for block_m, block_n, b_blocks in ((128, 128, 1), (128, 176, 3), (64, 256, 2), (256, 112, 2)):
        # fast_accum: no promotion, so 64-row tiles keep one K lane (no lane buffer, sm90_tiles.sm90_wg_split_k).
        plain = GemmSpec.create(512, 1024, dtype="fp8", scaling="tensor", fast_accum=True)
        extra = (sm90_tiles.sm90_smem_bytes(BLOCK, block_m, block_n, 4)
                 - sm90_tiles.sm90_smem_bytes(plain, block_m, block_n, 4))
        assert extra == 4 * -(-(block_m + b_blocks) // 4) * 16, (block_m, block_n, extra)
        assert bulk_bytes(True, 0, 10**6, block_m) == 4 * block_m


@pytest.mark.parametrize("n,k,m,grouped_,split,scale_warp", [
    (4096, 7168, 4096, False, None, True),    # dense 128x128
    (7168, 16384, 4096, False, None, True),   # dense 128x176 (the scales-ahead loop)
    (4096, 7168, 64, False, None, False),     # dense 64-row tile (decode sizes)
    (4096, 7168, 8192, True, None, True),     # grouped 128x128, the MoE rows: the split-K kernel
    (7168, 2048, 8192, True, None, True),     # the same at K = 2048 (the kernel never splits there)
    (4096, 7168, 8192, True, False, False),   # grouped 128x128, the plain kernel (forced)
])
def test_bulk_copy_issuer(n, k, m, grouped_, split, scale_warp, shared_cache_dir, monkeypatch):
    """Who issues the A-scale bulk copy (GemmSm90::kScaleWarpBulkA): the scale warp in dense kernels and grouped
    split-K kernels of 128-row tiles, announcing its bytes with an expect_tx that does not arrive (SASS
    SYNCS.ARRIVE.TRANS64.RED.A0TR), else the TMA thread inside its arrive.expect_tx. H200, sessions 42-43: the scale
    warp's copy made dense rows 0-6% faster (64-row tiles 1-2% slower), and grouped split-K kernels with it beat
    every other grouped choice by 3-8% on the MoE rows while plain grouped kernels with it lost 5-15%; a change that
    moved the copy would cost that. Grouped FP8 128x128 tiles get the split-K kernel from the heuristic."""
    from deepgemm_jit import sass

    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    spec = GemmSpec.create(n, k, dtype="fp8", scaling="block", grouped=grouped_)
    cfg = config.choose_config(spec, m, "sm_90a")
    if split is None:
        assert cfg.split_k == grouped_, cfg.tag  # the heuristic's grouped pick is the split-K kernel
    else:
        cfg = config.sm90_config(spec, cfg.block_m, cfg.block_n, split_k=split)
    text = sass.disassemble(jit.get_kernel(sm90_rules.kernel_spec(spec, "sm_90a", m), cfg, "sm_90a").cubin)
    # One issuer, not both; a grouped split-K kernel holds the roles twice (the walk with shares and the plain one).
    assert text.count("UBLKCP") == (2 if cfg.split_k and grouped_ else 1), cfg.tag
    assert ("ARRIVE.TRANS64.RED.A0TR" in text) == scale_warp, cfg.tag
    if scale_warp:  # announced, copied, then the B copy and the lane's deferred arrival
        order = [text.index(op) for op in ("ARRIVE.TRANS64.RED.A0TR", "UBLKCP", "ARRIVES.LDGSTSBAR")]
        assert order == sorted(order), (cfg.tag, order)
