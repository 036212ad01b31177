"""Grouped GEMMs (mixture of experts) on the GPU: every group's rows against a per-group loop of the plain GEMM
(same tile config: bit-for-bit) and a float64 reference (DESIGN.md bounds); rows of no group, and masked rows,
left untouched (outputs poisoned first). Random group sizes with empty groups and groups of one row; group
boundaries that cut tiles; N that is no multiple of the tile (the last tile reads the next group's weight rows)."""
import math

import numpy as np
import pytest

import deepgemm_jit as dg
from deepgemm_jit import reference

pytestmark = pytest.mark.gpu


def _untouched(out, rows) -> bool:
    """Rows `rows` (a slice or index array of the first dimension) still hold the poison bytes."""
    import cupy

    part = out[rows]
    return part.size == 0 or bool((part.view(cupy.uint8) == reference.POISON_BYTE).all())


def _offsets(sizes):
    import cupy

    return cupy.asarray(np.cumsum(sizes), dtype=cupy.int32)


def _tail_split(g, bounds) -> tuple[int, int]:
    """(whole tiles, shares of the tiles after them) the grouped kernel runs for these groups (its device rule,
    splitk.tail_split)."""
    from deepgemm_jit import launch, splitk

    cfg = g.config
    tiles = sum(-(-(e - s) // cfg.block_m) for s, e in bounds) * -(-g.spec.n // cfg.block_n)
    return splitk.tail_split(tiles, launch.num_sms(0), g.max_splits)


def _plain_loop(g, a, b, bounds, scale_a=None, scale_b=None):
    """The plain GEMM per group with the grouped kernel's tile config (and its K shares, summed in the same order):
    what each group's rows must equal. None when the kernel splits only some of the tiles (no plain GEMM does)."""
    import cupy

    whole, splits = _tail_split(g, bounds)
    if whole and splits > 1:
        return None
    plain = dg.build(max(1, max(e - s for s, e in bounds)), g.spec.n, g.spec.k, dtype=g.spec.dtype,
                     scaling=g.spec.scaling, config=g.config, weight_streaming=False, split_k=splits)
    outs = []
    for gi, (s, e) in enumerate(bounds):
        if e == s:
            outs.append(None)
            continue
        kw = {}
        if scale_a is not None:
            kw = {"scale_a": cupy.ascontiguousarray(scale_a[s:e]), "scale_b": cupy.ascontiguousarray(scale_b[gi])}
        outs.append(plain(cupy.ascontiguousarray(a[s:e]), cupy.ascontiguousarray(b[gi]), **kw))
    return outs


def _check_groups(out, a64, b64, bounds, dtype, plain_outs=None):
    for gi, (s, e) in enumerate(bounds):
        if e == s:
            continue
        ref = a64[s:e] @ b64[gi].T
        err = reference.error(out[s:e], ref)
        assert reference.within_bound(err, dtype), (gi, s, e, err)
        if plain_outs is not None:
            assert bool((out[s:e].view(np.uint16 if out.dtype.itemsize == 2 else np.uint32)
                         == plain_outs[gi].view(np.uint16 if out.dtype.itemsize == 2 else np.uint32)).all()), (gi, s, e)


@pytest.mark.parametrize("sizes,n,k", [
    ([0, 1, 130, 77, 300, 0, 129], 264, 200),   # empty groups, a 1-row group, boundaries inside tiles, N % tile
    ([512, 0, 0, 256], 4096, 7168),             # aligned groups of a real shape
    ([1000], 392, 1024),                        # one group
])
def test_contiguous_offsets_bf16(sizes, n, k):
    import cupy

    rng = cupy.random.default_rng(sum(sizes) + n + k)
    num_groups, m = len(sizes), sum(sizes) + 7  # 7 trailing rows of no group
    g = dg.build_grouped(n, k, dtype="bf16", expected_m=max(sizes), num_groups=num_groups)
    a = reference.random_matrix((m, k), "bf16", rng)
    b = reference.random_matrix((num_groups, n, k), "bf16", rng, scale=1.0 / math.sqrt(k))
    out = reference.poisoned((m, n), "bf16")
    assert g(a, b, offs=_offsets(sizes), out=out) is out
    ends = np.cumsum(sizes)
    bounds = [(int(e - s), int(e)) for s, e in zip(sizes, ends)]
    _check_groups(out, reference.to_float64(a), reference.to_float64(b), bounds, "bf16",
                  _plain_loop(g, a, b, bounds))
    assert _untouched(out, slice(int(ends[-1]), m))


def test_offsets_out_of_range_are_clamped():
    """Decreasing or out-of-range offsets never make the kernel write outside d: such groups are empty or cut."""
    import cupy

    n, k, m = 256, 128, 300
    g = dg.build_grouped(n, k, dtype="bf16")
    a = reference.random_matrix((m, k), "bf16")
    b = reference.random_matrix((4, n, k), "bf16", scale=0.1)
    big = cupy.empty((m + 64, n), dtype=a.dtype)  # d is the first m rows; the guard rows must stay poisoned
    cupy.cuda.runtime.memset(big.data.ptr, reference.POISON_BYTE, big.nbytes)
    out = big[:m]
    offs = cupy.asarray([100, 100, 10**9, -5], dtype=cupy.int32)  # group 2 runs past M, group 3 ends before 0
    g(a, b, offs=offs, out=out)
    _check_groups(out, reference.to_float64(a), reference.to_float64(b), [(0, 100), (100, 100), (100, m), (m, m)],
                  "bf16")
    assert _untouched(big, slice(m, m + 64))


def test_contiguous_m_indices_with_padding():
    import cupy

    n, k = 392, 256
    # group 0: 70 rows, 10 padding, group 2: 1 row, 5 padding, group 1: 200 rows, group 3: empty,
    # group 4: two runs (not contiguous: skipped, rows untouched)
    ids = [0] * 70 + [-1] * 10 + [2] + [-1] * 5 + [1] * 200 + [4] * 3 + [-1] * 2 + [4] * 4
    m = len(ids)
    rng = cupy.random.default_rng(5)
    g = dg.build_grouped(n, k, dtype="bf16", expected_m=100, num_groups=5)
    a = reference.random_matrix((m, k), "bf16", rng)
    b = reference.random_matrix((5, n, k), "bf16", rng, scale=1.0 / math.sqrt(k))
    out = reference.poisoned((m, n), "bf16")
    g(a, b, m_indices=cupy.asarray(ids, dtype=cupy.int32), out=out)
    a64, b64 = reference.to_float64(a), reference.to_float64(b)
    spans = {0: (0, 70), 2: (80, 81), 1: (86, 286)}
    for gi, (s, e) in spans.items():
        err = reference.error(out[s:e], a64[s:e] @ b64[gi].T)
        assert reference.within_bound(err, "bf16"), (gi, err)
    ids_np = np.asarray(ids)
    untouched_rows = cupy.asarray(np.nonzero((ids_np == -1) | (ids_np == 4))[0])
    assert _untouched(out, untouched_rows)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_masked(dtype):
    import cupy

    num_groups, max_m, n, k = 5, 200, 264, 512
    counts = [0, 1, 137, 200, 999]  # 999 is clamped to max_m
    rng = cupy.random.default_rng(11)
    g = dg.build_grouped(n, k, dtype=dtype, expected_m=128, num_groups=num_groups)
    a = reference.random_matrix((num_groups, max_m, k), dtype, rng)
    b = reference.random_matrix((num_groups, n, k), dtype, rng, scale=1.0 / math.sqrt(k))
    out = reference.poisoned((num_groups, max_m, n), dtype)
    assert g(a, b, masked_m=cupy.asarray(counts, dtype=cupy.int32), out=out) is out
    a64, b64 = reference.to_float64(a), reference.to_float64(b)
    for gi, c in enumerate(counts):
        c = min(c, max_m)
        if c:
            err = reference.error(out[gi, :c], a64[gi, :c] @ b64[gi].T)
            assert reference.within_bound(err, dtype), (gi, c, err)
        assert _untouched(out[gi], slice(c, max_m)), gi


def _fp8_problem(sizes, n, k, rng):
    """Block-quantized A rows and per-group B blocks, with the float64 product of the dequantized operands."""
    import cupy

    m, num_groups = sum(sizes), len(sizes)
    x = rng.standard_normal((m, k), dtype=cupy.float32)
    w = rng.standard_normal((num_groups, n, k), dtype=cupy.float32) * cupy.float32(0.05)
    qa, sa = reference.quantize_reference(x, "fp8_e4m3", "group128")
    qbs, sbs = zip(*(reference.quantize_reference(w[gi], "fp8_e4m3", "block128") for gi in range(num_groups)))
    qb, sb = cupy.stack(qbs), cupy.stack(sbs)
    a64 = reference.dequantize_reference(qa, sa, "fp8_e4m3", "group128")
    b64 = cupy.stack([reference.dequantize_reference(qbs[gi], sbs[gi], "fp8_e4m3", "block128")
                      for gi in range(num_groups)])
    return qa, sa, qb, sb, a64, b64


def _m_major(sa):
    """DeepGEMM's scale_a layout: K-group-major storage with M padded to 4, seen as an (M, KB) view."""
    import cupy

    m, kb = sa.shape
    storage = cupy.full((kb, -(-m // 4) * 4), cupy.nan, dtype=cupy.float32)
    storage[:, :m] = sa.T
    return storage[:, :m].T


@pytest.mark.parametrize("scale_layout", ["row_major", "m_major"])
@pytest.mark.parametrize("sizes,n,k", [([0, 1, 300, 129, 64], 392, 640), ([1024, 512], 4096, 7168)])
def test_contiguous_fp8_block(sizes, n, k, scale_layout):
    """Row-major and M-major (DeepGEMM's, NaN in the padding) scale_a, groups starting at rows 0, 1, 301 and 430."""
    import cupy

    rng = cupy.random.default_rng(len(sizes) + n)
    qa, sa, qb, sb, a64, b64 = _fp8_problem(sizes, n, k, rng)
    g = dg.build_grouped(n, k, dtype="fp8", expected_m=max(sizes), num_groups=len(sizes))
    out = reference.poisoned((sum(sizes), n), "bf16")
    layouts = {"m_major": _m_major, "row_major": cupy.ascontiguousarray}  # sa itself: M-major, padding 1.0
    g(qa, qb, scale_a=layouts[scale_layout](sa), scale_b=sb, offs=_offsets(sizes), out=out)
    ends = np.cumsum(sizes)
    bounds = [(int(e - s), int(e)) for s, e in zip(sizes, ends)]
    _check_groups(out, a64, b64, bounds, "fp8_e4m3", _plain_loop(g, qa, qb, bounds, sa, sb))


@pytest.mark.parametrize("block_n", [176, 160])
def test_contiguous_fp8_block_straddling_tiles(block_n):
    """Tiles straddling 128-column scale blocks in the grouped walk: each group's own B scales per offset."""
    import cupy

    from deepgemm_jit import config
    from deepgemm_jit.spec import GemmSpec

    sizes, n, k = [200, 0, 1, 333], 1496, 1040  # N, K: no multiples of the tile / 128 (TMA: 16-byte rows)
    rng = cupy.random.default_rng(block_n)
    qa, sa, qb, sb, a64, b64 = _fp8_problem(sizes, n, k, rng)
    spec = GemmSpec.create(n, k, dtype="fp8", scaling="block", grouped=True)
    g = dg.build_grouped(n, k, dtype="fp8", num_groups=len(sizes), config=config.sm90_config(spec, 128, block_n))
    assert g.config.block_n == block_n
    out = reference.poisoned((sum(sizes), n), "bf16")
    g(qa, qb, scale_a=sa, scale_b=sb, offs=_offsets(sizes), out=out)
    ends = np.cumsum(sizes)
    bounds = [(int(e - s), int(e)) for s, e in zip(sizes, ends)]
    _check_groups(out, a64, b64, bounds, "fp8_e4m3", _plain_loop(g, qa, qb, bounds, sa, sb))


@pytest.mark.parametrize("scale_layout", ["as_quantized", "row_major"])
def test_masked_fp8_block(scale_layout):
    """scale_a (G, max_m, kb): quantize's M-major scales of all rows reshaped (a view; the bulk path) or row-major."""
    import cupy

    num_groups, max_m, n, k = 3, 256, 512, 1024
    counts = [255, 0, 17]
    rng = cupy.random.default_rng(3)
    qa, sa, qb, sb, a64, b64 = _fp8_problem([max_m] * num_groups, n, k, rng)
    g = dg.build_grouped(n, k, dtype="fp8", expected_m=128, num_groups=num_groups)
    out = reference.poisoned((num_groups, max_m, n), "bf16")
    sa3 = (sa if scale_layout == "as_quantized" else cupy.ascontiguousarray(sa)).reshape(num_groups, max_m, -1)
    if scale_layout == "as_quantized":  # a view of the M-major storage, which the grouped kernel bulk-copies
        assert sa3.data.ptr == sa.data.ptr and sa3.strides == (4 * max_m, 4, sa.strides[1])
    g(qa.reshape(num_groups, max_m, k), qb, scale_a=sa3, scale_b=sb,
      masked_m=cupy.asarray(counts, dtype=cupy.int32), out=out)
    for gi, c in enumerate(counts):
        if c:
            rows = slice(gi * max_m, gi * max_m + c)
            err = reference.error(out[gi, :c], a64[rows] @ b64[gi].T)
            assert reference.within_bound(err, "fp8_e4m3"), (gi, err)
        assert _untouched(out[gi], slice(c, max_m)), gi


def test_bias_swiglu_per_group():
    import cupy

    sizes, n_out, k = [3, 0, 250, 129], 136, 256
    n, num_groups, m = 2 * n_out, len(sizes), sum(sizes)
    rng = cupy.random.default_rng(17)
    g = dg.build_grouped(n, k, dtype="bf16", epilogue="bias+swiglu", num_groups=num_groups)
    a = reference.random_matrix((m, k), "bf16", rng)
    gate, up = (reference.random_matrix((num_groups, n_out, k), "bf16", rng, scale=1.0 / math.sqrt(k))
                for _ in range(2))
    b_gate, b_up = (reference.random_matrix((num_groups, n_out), "bf16", rng) for _ in range(2))
    def interleave(x, y):  # on the 16-bit patterns (CuPy's concatenate need not know ml_dtypes' bfloat16)
        return dg.interleave_gate_up(x.view(cupy.uint16), y.view(cupy.uint16)).view(x.dtype)

    w = cupy.stack([interleave(gate[gi], up[gi]).view(cupy.uint16) for gi in range(num_groups)]).view(a.dtype)
    bias = cupy.stack([interleave(b_gate[gi], b_up[gi]).view(cupy.uint16) for gi in range(num_groups)]).view(a.dtype)
    out = reference.poisoned((m, n_out), "bf16")
    g(a, w, offs=_offsets(sizes), bias=cupy.ascontiguousarray(bias), out=out)
    a64 = reference.to_float64(a)
    ends = np.cumsum(sizes)
    for gi, (s, e) in enumerate(zip(ends - np.asarray(sizes), ends)):
        if e == s:
            continue
        x = a64[s:e]
        hg = x @ reference.to_float64(gate[gi]).T + reference.to_float64(b_gate[gi])
        hu = x @ reference.to_float64(up[gi]).T + reference.to_float64(b_up[gi])
        ref = reference.activation_reference("silu", hg) * hu
        err = reference.error(out[s:e], ref)
        assert reference.within_bound(err, "bf16"), (gi, err)


def test_quant_fp8_g128_per_group():
    import cupy

    sizes, n, k = [130, 1, 0, 257], 256, 384
    num_groups, m = len(sizes), sum(sizes)
    rng = cupy.random.default_rng(23)
    g = dg.build_grouped(n, k, dtype="bf16", epilogue="bias+gelu+quant_fp8_g128", num_groups=num_groups)
    a = reference.random_matrix((m, k), "bf16", rng)
    b = reference.random_matrix((num_groups, n, k), "bf16", rng, scale=1.0 / math.sqrt(k))
    bias = reference.random_matrix((num_groups, n), "fp32", rng)
    q = cupy.full((m, n), 0xFF, dtype=cupy.uint8)
    q_out, scales = g(a, b, offs=_offsets(sizes), bias=bias, out=q)
    assert q_out is q and scales.shape == (m, 2)
    a64, b64 = reference.to_float64(a), reference.to_float64(b)
    ends = np.cumsum(sizes)
    for gi, (s, e) in enumerate(zip(ends - np.asarray(sizes), ends)):
        if e == s:
            continue
        v = reference.unfused_epilogue(a64[s:e] @ b64[gi].T, g.spec.epi, bias=reference.to_float64(bias[gi]))
        q_ref, s_ref = reference.quantized_epilogue_reference(v, g.spec.epi)
        assert bool(cupy.allclose(scales[s:e], s_ref, rtol=1e-4, atol=0)), gi
        # 0xFF (the poison, an E4M3 NaN) is one ulp from 0xFE (-448), which each group's negative maximum takes:
        # the ulp check alone would pass those unwritten
        assert not bool((q[s:e] == 0xFF).any()), gi
        dist = reference.quant_ulp_distance(q[s:e], q_ref, "fp8_e4m3")
        assert int(dist.max()) <= 1, gi


def test_masked_cuda_graph_replay_follows_device_counts():
    """A captured masked call reads masked_m on the device at replay: new counts, no host synchronisation."""
    import cupy

    num_groups, max_m, n, k = 4, 128, 256, 256
    g = dg.build_grouped(n, k, dtype="bf16", expected_m=64, num_groups=num_groups)
    a = reference.random_matrix((num_groups, max_m, k), "bf16")
    b = reference.random_matrix((num_groups, n, k), "bf16", scale=0.1)
    counts = cupy.asarray([5, 0, 128, 64], dtype=cupy.int32)
    out = reference.poisoned((num_groups, max_m, n), "bf16")
    _replay_masked(g, a, b, counts, out, ([1, 2, 3, 4], [128, 0, 0, 77]))


def _replay_masked(g, a, b, counts, out, new_counts):
    """Capture one masked BF16 call (after a first call outside the capture: compile, load, workspace), then replay
    it with each of `new_counts` written into the device counts; every replay's rows against float64, the rows past
    each count untouched."""
    import cupy

    max_m = a.shape[1]
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        g(a, b, masked_m=counts, out=out, stream=stream)
        stream.synchronize()
        stream.begin_capture()
        g(a, b, masked_m=counts, out=out, stream=stream)
        graph = stream.end_capture()
    a64, b64 = reference.to_float64(a), reference.to_float64(b)
    for new in new_counts:
        reference.poison(out, stream)
        counts.set(np.asarray(new, dtype=np.int32), stream=stream)
        graph.launch(stream)
        stream.synchronize()
        for gi, c in enumerate(new):
            if c:
                err = reference.error(out[gi, :c], a64[gi, :c] @ b64[gi].T)
                assert reference.within_bound(err, "bf16"), (new, gi, err)
            assert _untouched(out[gi], slice(c, max_m)), (new, gi)


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    sizes, n, k = [40, 0, 200], 256, 128
    g = dg.build_grouped(n, k, dtype="bf16", num_groups=3)
    a = torch.randn(sum(sizes), k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3, n, k, device="cuda", dtype=torch.bfloat16) * 0.1
    offs = torch.tensor(np.cumsum(sizes), device="cuda", dtype=torch.int32)
    d = g(a, b, offs=offs)
    assert isinstance(d, torch.Tensor) and d.shape == (sum(sizes), n) and d.dtype == torch.bfloat16
    ids = torch.repeat_interleave(torch.arange(3, device="cuda", dtype=torch.int32),
                                  torch.tensor(sizes, device="cuda"))
    d2 = g(a, b, m_indices=ids)
    assert torch.equal(d, d2)
    s = 0
    for gi, size in enumerate(sizes):
        ref = a[s:s + size].double() @ b[gi].double().T
        if size:
            rel = ((d[s:s + size].double() - ref).norm() / ref.norm()).item()
            assert rel < 1e-2, (gi, rel)
        s += size


@pytest.mark.parametrize("index", ["offs", "m_indices"])
def test_repeat_call_replays_its_plan_with_new_device_values(index):
    """A second call with the same buffers launches the kept plan, which reads the group bounds anew."""
    import cupy

    n, k, m = 256, 256, 400
    g = dg.build_grouped(n, k, dtype="bf16", num_groups=3)
    a = reference.random_matrix((m, k), "bf16")
    b = reference.random_matrix((3, n, k), "bf16", scale=0.1)
    a64, b64 = reference.to_float64(a), reference.to_float64(b)
    out = reference.poisoned((m, n), "bf16")
    bounds = cupy.zeros((3,) if index == "offs" else (m,), dtype=cupy.int32)
    for sizes in ([100, 0, 300], [1, 398, 1], [0, 0, 400]):
        ends = np.cumsum(sizes)
        if index == "offs":
            bounds.set(ends.astype(np.int32))
        else:
            bounds.set(np.repeat(np.arange(3), sizes).astype(np.int32))
        cupy.cuda.runtime.memset(out.data.ptr, reference.POISON_BYTE, out.nbytes)
        g(a, b, out=out, **{index: bounds})
        assert len(g._plans) == 1
        _check_groups(out, a64, b64, [(int(e - s), int(e)) for s, e in zip(sizes, ends)], "bf16")


def test_torch_ops_match_the_library_and_compile():
    """torch.ops.deepgemm_jit.grouped_mm(_fp8): the library's bits, under torch.compile(fullgraph=True) too."""
    torch = pytest.importorskip("torch")
    import deepgemm_jit.torch as dgt

    sizes, n, k = [40, 0, 200, 1], 256, 128
    a = torch.randn(sum(sizes), k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4, n, k, device="cuda", dtype=torch.bfloat16) * 0.1
    offs = torch.tensor(np.cumsum(sizes), device="cuda", dtype=torch.int32)
    ref = dg.build_grouped(n, k, dtype="bf16", expected_m=64, num_groups=4)(a, w, offs=offs)
    d = dgt.grouped_mm(a, w, offs=offs)
    assert torch.equal(d, ref)
    compiled = torch.compile(lambda x, y, o: dgt.grouped_mm(x, y, offs=o) * 2, fullgraph=True)
    assert torch.equal(compiled(a, w, offs), ref * 2)
    xm = torch.randn(4, 64, k, device="cuda", dtype=torch.bfloat16)
    counts = torch.tensor([64, 0, 3, 17], device="cuda", dtype=torch.int32)
    dm = dgt.grouped_mm(xm, w, masked_m=counts)
    for gi, c in enumerate(counts.tolist()):
        if c:
            rel = ((dm[gi, :c].double() - xm[gi, :c].double() @ w[gi].double().T).norm()
                   / (xm[gi, :c].double() @ w[gi].double().T).norm()).item()
            assert rel < 1e-2, (gi, rel)
    # a sliced masked a (G, max_m, K) view, its groups 96 rows apart: copied, not refused (review)
    dm_view = dgt.grouped_mm(torch.cat([xm, xm[:, :32]], dim=1)[:, :64], w, masked_m=counts)
    for gi, c in enumerate(counts.tolist()):   # rows past a group's count are left unwritten
        assert torch.equal(dm_view[gi, :c], dm[gi, :c]), gi
    qa, sa = dgt.quantize(a, "fp8", "group128")
    qw, sw = zip(*(dgt.quantize(w[gi], "fp8", "block128") for gi in range(4)))
    qw, sw = torch.stack(qw), torch.stack(sw)
    d8 = dgt.grouped_mm_fp8(qa, qw, sa, sw, offs=offs)
    ref8 = dg.build_grouped(n, k, dtype="fp8", expected_m=64, num_groups=4)(qa, qw, scale_a=sa, scale_b=sw, offs=offs)
    assert torch.equal(d8[:241], ref8[:241])


def _split_workspace_is_zero(g) -> bool:
    """The device-split kernel leaves its arrival counters zero (and in the atomic mode its sums too; in split order
    the partials stay written)."""
    return all(not bool(counters.any()) and not (g.split_adds_atomically and bool(partials.any()))
               for partials, counters in g._split_workspace.pairs())


@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
@pytest.mark.parametrize("deterministic", [True, False])
def test_device_split_follows_the_realised_tiles(dtype, deterministic):
    """A device-split grouped kernel: from masked_m it splits every tile (fewer tiles than half the SMs) into 4 or 2
    shares, none, or only the tiles past the first wave (4 or 2 shares), with empty and one-row groups. Each group's
    rows equal the float64 product, and where every tile has the same shares (in split order) the plain GEMM with
    that tile and those shares bit for bit; repeated calls give the same bits; the workspace ends zero."""
    import cupy

    from deepgemm_jit import config

    num_groups, max_m, n, k = 2, 384, 4096, 2048  # 32 column tiles of 128
    spec = dg.grouped.grouped_spec(n, k, dtype=dtype)
    g = dg.build_grouped(n, k, dtype=dtype, num_groups=num_groups, deterministic=deterministic,
                         config=config.sm90_config(spec, 128, 128, split_k=True))
    assert g.max_splits == 4
    rng = cupy.random.default_rng(7)
    if dtype == "fp8":
        qa, sa, qb, sb, a64, b64 = _fp8_problem([max_m] * num_groups, n, k, rng)
        a, b, kw = qa, qb, {"scale_a": sa.reshape(num_groups, max_m, -1), "scale_b": sb}
        lib = "fp8_e4m3"
    else:
        a = reference.random_matrix((num_groups * max_m, k), "bf16", rng)
        b = reference.random_matrix((num_groups, n, k), "bf16", rng, scale=1.0 / math.sqrt(k))
        a64, b64, kw, sa, sb, lib = reference.to_float64(a), reference.to_float64(b), {}, None, None, "bf16"
    seen = set()
    # tiles: 32, 64, 64, 96, 128, 160 (132 whole + 28 in 4 shares), 192 (132 + 60 in 2 shares)
    for counts in ([100, 0], [129, 0], [1, 40], [129, 1], [256, 256], [384, 256], [384, 384]):
        bounds = [(gi * max_m, gi * max_m + c) for gi, c in enumerate(counts)]
        seen.add(_tail_split(g, bounds))
        out = reference.poisoned((num_groups, max_m, n), "bf16")
        masked = cupy.asarray(counts, dtype=cupy.int32)
        g(a.reshape(num_groups, max_m, k), b, masked_m=masked, out=out, **kw)
        flat = out.reshape(num_groups * max_m, n)
        _check_groups(flat, a64, b64, bounds, lib,
                      _plain_loop(g, a, b, bounds, sa, sb) if deterministic else None)
        for gi, c in enumerate(counts):
            assert _untouched(out[gi], slice(c, max_m)), (counts, gi)
        assert _split_workspace_is_zero(g), counts
        if deterministic:
            again = reference.poisoned((num_groups, max_m, n), "bf16")
            g(a.reshape(num_groups, max_m, k), b, masked_m=masked, out=again, **kw)
            assert bool((again.view(cupy.uint16) == out.view(cupy.uint16)).all()), counts
    assert seen == {(0, 4), (0, 2), (96, 1), (128, 1), (132, 4), (132, 2)}


def _masked_device_split():
    """(g, a, b): a BF16 GroupedGemm forced to 128x128 device-split tiles, 2 masked groups of 384 rows, 4096x1024."""
    from deepgemm_jit import config

    num_groups, max_m, n, k = 2, 384, 4096, 1024
    spec = dg.grouped.grouped_spec(n, k, dtype="bf16")
    g = dg.build_grouped(n, k, dtype="bf16", num_groups=num_groups,
                         config=config.sm90_config(spec, 128, 128, split_k=True))
    a = reference.random_matrix((num_groups, max_m, k), "bf16")
    b = reference.random_matrix((num_groups, n, k), "bf16", scale=1.0 / math.sqrt(k))
    return g, a, b


def test_device_split_cuda_graph_replay_changes_its_shares():
    """A captured device-split call: replays with new masked_m switch on the device between all tiles split, none,
    and the tiles past the first wave split."""
    import cupy

    g, a, b = _masked_device_split()
    num_groups, max_m, n = a.shape[0], a.shape[1], b.shape[1]
    counts = cupy.asarray([384, 384], dtype=cupy.int32)
    out = reference.poisoned((num_groups, max_m, n), "bf16")
    new_counts = ([100, 0], [129, 3], [384, 256], [0, 200])  # 32 tiles, 96, 160, 64
    seen = {_tail_split(g, [(gi * max_m, gi * max_m + c) for gi, c in enumerate(new)]) for new in new_counts}
    _replay_masked(g, a, b, counts, out, new_counts)
    assert seen == {(0, 4), (96, 1), (132, 4), (0, 2)}


def test_capture_on_another_stream_borrows_but_keeps_no_plan():
    """A device-split call warmed up on one stream and captured on another borrows the first stream's workspace
    (stream_buffers.py), so the capture's launch must not be kept as that stream's plan: an eager call on the
    capturing stream afterwards plans for (and allocates) a workspace of its own."""
    import cupy

    g, a, b = _masked_device_split()
    num_groups, max_m, n = a.shape[0], a.shape[1], b.shape[1]
    counts = cupy.asarray([100, 0], dtype=cupy.int32)  # 32 tiles: split
    out = reference.poisoned((num_groups, max_m, n), "bf16")
    warm, capturing = (cupy.cuda.Stream(non_blocking=True) for _ in range(2))
    g(a, b, masked_m=counts, out=out, stream=warm)
    warm.synchronize()
    kept = len(g._plans.plans())
    with capturing:
        capturing.begin_capture()
        g(a, b, masked_m=counts, out=out, stream=capturing)
        graph = capturing.end_capture()
    assert len(g._plans.plans()) == kept and len(g._split_workspace.pairs()) == 1
    reference.poison(out, capturing)
    graph.launch(capturing)
    capturing.synchronize()
    ref = reference.to_float64(a)[0, :100] @ reference.to_float64(b)[0].T
    assert reference.within_bound(reference.error(out[0, :100], ref), "bf16")
    reference.poison(out, capturing)
    g(a, b, masked_m=counts, out=out, stream=capturing)
    capturing.synchronize()
    assert reference.within_bound(reference.error(out[0, :100], ref), "bf16")
    assert len(g._split_workspace.pairs()) == 2 and len(g._plans.plans()) == kept + 1
