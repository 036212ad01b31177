"""FP8 block scaling with the A scales bulk-copied by the TMA thread (docs/experiments/sm90-fp8-bulk-a-scales.md),
on the GPU: every output bit equal to the scale warp's path (the same kernel with DEEPGEMM_JIT_NO_BULK_SCALES=1),
and within the float64 reference's bound. M-major scale_a with NaN in the padding rows past M, so that a copied
padding row reaching a stored output would show; outputs poisoned first."""
import numpy as np
import pytest

import deepgemm_jit as dg
from deepgemm_jit import config, grouped, launch, reference
from deepgemm_jit.arrays import scale_view
from deepgemm_jit.spec import GemmSpec

pytestmark = pytest.mark.gpu


def _m_major(sa, pitch=None):
    """scale_a (M, KB) as a view of (KB, pitch) storage, pitch = M rounded up to 4 by default, NaN past M."""
    import cupy

    m, kb = sa.shape
    pitch = -(-m // 4) * 4 if pitch is None else pitch
    storage = cupy.full((kb, pitch), cupy.nan, dtype=cupy.float32)
    storage[:, :m] = sa.T
    return storage[:, :m].T


def _same_bits(x, y) -> bool:
    """Every element's bits equal; a same-width integer view, so that strided arrays (M-major scales) compare."""
    import cupy

    width = {1: cupy.uint8, 2: cupy.uint16, 4: cupy.uint32}[x.dtype.itemsize]
    return bool((x.view(width) == y.view(width)).all())


def _problem(m, n, k, seed, num_groups=None):
    import cupy

    rng = cupy.random.default_rng(seed)
    x = rng.standard_normal((m, k), dtype=cupy.float32)
    qa, sa = reference.quantize_reference(x, "fp8_e4m3", "group128")
    a64 = reference.dequantize_reference(qa, sa, "fp8_e4m3", "group128")
    if num_groups is None:
        w = rng.standard_normal((n, k), dtype=cupy.float32) * cupy.float32(0.05)
        qb, sb = reference.quantize_reference(w, "fp8_e4m3", "block128")
        return qa, sa, qb, sb, a64, reference.dequantize_reference(qb, sb, "fp8_e4m3", "block128")
    ws = [reference.quantize_reference(rng.standard_normal((n, k), dtype=cupy.float32) * cupy.float32(0.05),
                                       "fp8_e4m3", "block128") for _ in range(num_groups)]
    qb, sb = cupy.stack([q for q, _ in ws]), cupy.stack([s for _, s in ws])
    b64 = cupy.stack([reference.dequantize_reference(q, s, "fp8_e4m3", "block128") for q, s in ws])
    return qa, sa, qb, sb, a64, b64


def _both_paths(monkeypatch, call, shape, out_dtype="bf16"):
    """(bulk, scale warp) outputs of `call(out)`, each into a freshly poisoned array (separate launch plans). The bulk
    path is forced at every M (launch.BULK_A_SCALES_MIN_M keeps decode sizes on the scale warp)."""
    monkeypatch.setattr(launch, "BULK_A_SCALES_MIN_M", 1)
    outs = []
    for off in ("0", "1"):
        monkeypatch.setenv("DEEPGEMM_JIT_NO_BULK_SCALES", off)
        out = reference.poisoned(shape, out_dtype)
        call(out)
        outs.append(out)
    monkeypatch.delenv("DEEPGEMM_JIT_NO_BULK_SCALES")
    return outs


def _assert_bulk_on(spec, sa_view, m):
    assert launch.bulk_a_scales(spec, scale_view(sa_view, "scale_a", sa_view.shape, ""), m), (
        "the test means to run the bulk path: scale_a must qualify")


# M not a multiple of 4 (padded pitch), M = 1, M ending inside a 4-row group of the last tile, odd K (the last K
# group partial), per tile shape (64-row tiles: one consumer; 176 / 112: tiles straddle B scale blocks).
@pytest.mark.parametrize("block_m,block_n", [(128, 128), (128, 176), (64, 112), (256, 64)])
@pytest.mark.parametrize("m,n,k", [(301, 520, 3000), (1, 264, 1000), (77, 392, 300), (130, 256, 129), (4, 136, 4096)])
def test_dense_bitwise_equal_to_the_scale_warp(block_m, block_n, m, n, k, monkeypatch):
    qa, sa, qb, sb, a64, b64 = _problem(m, n, k, seed=m + n + k + block_n)
    spec = GemmSpec.create(n, k, dtype="fp8", scaling="block")
    cfg = config.sm90_config(spec, block_m, block_n)
    g = dg.build(m, n, k, dtype="fp8", scaling="block", config=cfg, weight_streaming=False)
    sa_mm = _m_major(sa)
    _assert_bulk_on(spec, sa_mm, m)
    bulk, warp = _both_paths(monkeypatch, lambda out: g(qa, qb, scale_a=sa_mm, scale_b=sb, out=out), (m, n))
    case = f"{m=} {n=} {k=} {g.config.tag}"
    assert _same_bits(bulk, warp), case
    err = reference.error(bulk, a64 @ b64.T)
    assert reference.within_bound(err, "fp8_e4m3") and err < 5e-3, (case, err)


@pytest.mark.parametrize("m,pitch", [(77, 80), (77, 96), (300, 300), (1, 4), (1, 16)])
def test_dense_pitches_and_split_k(m, pitch, monkeypatch):
    """Wider pitches than round_up(M, 4), M = 1 with a 4- and 16-float pitch, and a split-K kernel (each share's
    stages copy their own K blocks' scales)."""
    n, k = 392, 2000
    qa, sa, qb, sb, a64, b64 = _problem(m, n, k, seed=m * 3 + pitch)
    spec = GemmSpec.create(n, k, dtype="fp8", scaling="block")
    sa_mm = _m_major(sa, pitch)
    _assert_bulk_on(spec, sa_mm, m)
    for cfg in (config.sm90_config(spec, 64, 128), config.sm90_config(spec, 64, 64, split_k=True)):
        g = dg.build(m, n, k, dtype="fp8", scaling="block", config=cfg, weight_streaming=False,
                     **({"split_k": 3} if cfg.split_k else {}))
        bulk, warp = _both_paths(monkeypatch, lambda out: g(qa, qb, scale_a=sa_mm, scale_b=sb, out=out), (m, n))
        assert _same_bits(bulk, warp), (m, pitch, cfg.tag)
        assert reference.within_bound(reference.error(bulk, a64 @ b64.T), "fp8_e4m3"), (m, pitch, cfg.tag)


@pytest.mark.parametrize("epilogue,out_dtype", [("bias+gelu", "bf16"), ("bias_row+silu", "fp16"),
                                                ("bias+gelu+quant_fp8_g128", None)])
def test_epilogues_bitwise(epilogue, out_dtype, monkeypatch):
    """Fused epilogues read nothing of the rows past M (bias_row: its rows; quant_fp8_g128: per-row group maxima):
    both paths into poisoned outputs, bit for bit, and within the FP8 bound of the float64 unfused epilogue (the
    bits alone would pass an epilogue bug both paths share, and equal NaN bits compare equal)."""
    import cupy

    m, n, k = 211, 256, 1400
    qa, sa, qb, sb, a64, b64 = _problem(m, n, k, seed=11)
    g = dg.build(m, n, k, dtype="fp8", scaling="block", epilogue=epilogue, out_dtype=out_dtype,
                 weight_streaming=False)
    sa_mm = _m_major(sa)
    _assert_bulk_on(g.spec, sa_mm, m)
    rng = cupy.random.default_rng(5)
    bias_len = m if "bias_row" in epilogue else n
    bias = reference.random_matrix((bias_len,), g.spec.epilogue_operand_dtype, rng)
    quant = g.spec.epi.has_group_scales
    results = []
    for off in ("0", "1"):
        monkeypatch.setenv("DEEPGEMM_JIT_NO_BULK_SCALES", off)
        if quant:  # an E4M3 NaN / NaN scales: never written from finite values
            out = (cupy.full((m, n), 0xFF, dtype=cupy.uint8), cupy.full((m, -(-n // 128)), cupy.nan, cupy.float32))
            results.append(g(qa, qb, scale_a=sa_mm, scale_b=sb, bias=bias, out=out[0], scales_out=out[1]))
        else:
            results.append(g(qa, qb, scale_a=sa_mm, scale_b=sb, bias=bias,
                             out=reference.poisoned((m, n), g.spec.out_dtype)))
    monkeypatch.delenv("DEEPGEMM_JIT_NO_BULK_SCALES")
    bulk, warp = results
    value = reference.unfused_epilogue(a64 @ b64.T, g.spec.epi, bias=bias)
    if quant:  # (q, scales)
        assert _same_bits(bulk[0], warp[0]) and _same_bits(bulk[1], warp[1]), epilogue
        got = reference.dequantize_reference(bulk[0], bulk[1], "fp8_e4m3", "group128")  # NaN where unwritten
        value = reference.dequantize_reference(*reference.quantized_epilogue_reference(value, g.spec.epi),
                                               "fp8_e4m3", "group128")
    else:
        assert _same_bits(bulk, warp), epilogue
        got = bulk
    err = reference.error(got, value)
    assert reference.within_bound(err, "fp8_e4m3"), (epilogue, err)


def _offsets(sizes):
    import cupy

    return cupy.asarray(np.cumsum(sizes), dtype=cupy.int32)


@pytest.mark.parametrize("block_n", [128, 176])
@pytest.mark.parametrize("sizes", [[77, 0, 1, 130, 203], [3, 5, 129, 255, 64, 1], [256, 128, 512]])
def test_contiguous_groups_at_odd_rows(sizes, block_n, monkeypatch):
    """Groups starting at rows that are no multiple of 4 (their tiles take the scale warp's path, the others the
    bulk copy, in one launch) and at multiples of 4; every row of every group bitwise equal to the scale warp's."""
    n, k = 392, 1040  # K: the last group 16 wide (grouped GEMMs need TMA rows of 16-byte multiples)
    m = sum(sizes)
    qa, sa, qb, sb, a64, b64 = _problem(m, n, k, seed=sum(sizes) + block_n, num_groups=len(sizes))
    spec = GemmSpec.create(n, k, dtype="fp8", scaling="block", grouped=True)
    g = dg.build_grouped(n, k, dtype="fp8", num_groups=len(sizes), config=config.sm90_config(spec, 128, block_n))
    sa_mm = _m_major(sa)
    _assert_bulk_on(spec, sa_mm, m)
    offs = _offsets(sizes)
    bulk, warp = _both_paths(monkeypatch, lambda out: g(qa, qb, scale_a=sa_mm, scale_b=sb, offs=offs, out=out),
                             (m, n))
    assert _same_bits(bulk, warp), (sizes, block_n)
    for gi, (s, e) in enumerate(zip(np.cumsum(sizes) - sizes, np.cumsum(sizes))):
        if e > s:
            err = reference.error(bulk[s:e], a64[s:e] @ b64[gi].T)
            assert reference.within_bound(err, "fp8_e4m3"), (sizes, gi, err)


@pytest.mark.parametrize("max_m", [77, 256])
def test_masked_bitwise(max_m, monkeypatch):
    """Masked groups: scale_a (G, max_m, KB) M-major over all groups' rows ((KB, G * max_m) storage). max_m = 77:
    odd groups start on rows that are no multiple of 4 (scale warp), the others bulk-copy."""
    import cupy

    num_groups, n, k = 4, 256, 1104
    counts = [max_m, 0, max_m // 2 + 1, 3]
    qa, sa, qb, sb, a64, b64 = _problem(num_groups * max_m, n, k, seed=max_m, num_groups=num_groups)
    kb = sa.shape[1]
    # Element (g, i, j) of the view at j * G * max_m + g * max_m + i: the global row g * max_m + i, M-major.
    storage = cupy.empty((kb, num_groups, max_m), dtype=cupy.float32)
    storage[...] = sa.reshape(num_groups, max_m, kb).transpose(2, 0, 1)
    sa_mm = storage.transpose(1, 2, 0)
    spec = GemmSpec.create(n, k, dtype="fp8", scaling="block", grouped=True)
    g = dg.build_grouped(n, k, dtype="fp8", expected_m=128, num_groups=num_groups)
    assert launch.bulk_a_scales(spec, grouped._scale_rows(sa_mm, "scale_a", sa_mm.shape, ""), num_groups * max_m)
    masked_m = cupy.asarray(counts, dtype=cupy.int32)
    a3 = qa.reshape(num_groups, max_m, k)
    bulk, warp = _both_paths(monkeypatch, lambda out: g(a3, qb, scale_a=sa_mm, scale_b=sb, masked_m=masked_m, out=out),
                             (num_groups, max_m, n))
    assert _same_bits(bulk, warp), max_m
    for gi, c in enumerate(counts):
        if c:
            rows = slice(gi * max_m, gi * max_m + c)
            assert reference.within_bound(reference.error(bulk[gi, :c], a64[rows] @ b64[gi].T), "fp8_e4m3"), gi


def _raw_scales(sa, pitch):
    """scale_a (M, KB) M-major in a cudaMalloc of exactly (KB - 1) * pitch + M floats (no pool block around it): the
    last column ends where the allocation does."""
    import cupy

    m, kb = sa.shape
    floats = (kb - 1) * pitch + m
    memory = cupy.cuda.memory.Memory(4 * floats)
    flat = cupy.ndarray((floats,), cupy.float32, cupy.cuda.memory.MemoryPointer(memory, 0))
    for j in range(kb):
        flat[j * pitch:j * pitch + m] = sa[:, j]
    view = cupy.lib.stride_tricks.as_strided(flat, shape=(m, kb), strides=(4, 4 * pitch))
    return view, memory


@pytest.mark.parametrize("m,k", [(301, 128), (301, 1000), (130, 100), (300, 1000)])
def test_tight_scale_allocation_is_not_read_past(m, k):
    """The bulk copy reads the last column's rows up to round_up(M, 4). With scale_a's allocation ending at its last
    element (M % 4 != 0) that would read past it: the host sees the allocation's end (arrays.allocation_end, the
    driver's range of a cudaMalloc) and leaves the tiles to the scale warp; M % 4 == 0 keeps the bulk copy. Either
    way the product is right. A pooled padded array of the same scales keeps the bulk copy."""
    from deepgemm_jit import arrays

    n = 264
    qa, sa, qb, sb, a64, b64 = _problem(m, n, k, seed=m + k)
    spec = GemmSpec.create(n, k, dtype="fp8", scaling="block")
    pitch = -(-m // 4) * 4
    tight, memory = _raw_scales(sa, pitch)
    view = scale_view(tight, "scale_a", tight.shape, "")
    assert arrays.allocation_end(view.ptr) == memory.ptr + memory.size, "the driver's range of a cudaMalloc"
    assert launch.bulk_a_scales(spec, view, m) == (m % 4 == 0), m
    _assert_bulk_on(spec, _m_major(sa), m)  # the padded pooled copy
    g = dg.build(m, n, k, dtype="fp8", scaling="block", weight_streaming=False)
    for scales in (tight, _m_major(sa)):
        out = reference.poisoned((m, n), "bf16")
        g(qa, qb, scale_a=scales, scale_b=sb, out=out)
        assert reference.within_bound(reference.error(out, a64 @ b64.T), "fp8_e4m3"), (m, k)


def test_allocation_query_inside_a_capture():
    """A first launch plan made while the stream captures asks the driver for scale_a's allocation (M % 4 != 0):
    the capture must survive it, and the replayed graph must give the product."""
    import cupy

    m, n, k = 301, 264, 1000
    qa, sa, qb, sb, a64, b64 = _problem(m, n, k, seed=7)
    sa_mm = _m_major(sa)
    g = dg.build(m, n, k, dtype="fp8", scaling="block", weight_streaming=False)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        g(qa, qb, scale_a=sa_mm, scale_b=sb, out=reference.poisoned((m, n), "bf16"), stream=stream)
        out = reference.poisoned((m, n), "bf16")  # a new output: a new plan, made inside the capture
        stream.synchronize()
        stream.begin_capture()
        g(qa, qb, scale_a=sa_mm, scale_b=sb, out=out, stream=stream)
        graph = stream.end_capture()
        graph.launch(stream)
    stream.synchronize()
    assert reference.within_bound(reference.error(out, a64 @ b64.T), "fp8_e4m3")
