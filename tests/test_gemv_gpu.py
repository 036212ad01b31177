"""The weight-streaming (decode) kernel on the GPU, through Gemm.__call__: float64 references (DESIGN.md bounds),
fresh random inputs, outputs poisoned with NaN, odd shapes, every FP8 scaling recipe, identical bits on repeated
runs, CUDA-graph capture and replay, and that the dispatch really happens (and stops at M = 9, and for weights the
Hopper tiles stream faster). The kernel's second token tile (M = 9..16), which the dispatch no longer picks, is
tested by raising gemv.DISPATCH_MAX_M."""
import pytest

from deepgemm_jit import build, gemv, reference
from deepgemm_jit.spec import GemmSpec
from graphs import capture_call, replay_with_fresh_a
from problems import fp8_problem

pytestmark = pytest.mark.gpu

MS = (1, 3, 8, 13, 16)
NK = [(1, 8), (7, 520), (129, 7168), (2112, 520), (129, 8), (7, 7168)]


@pytest.fixture
def launches(plan_calls):
    """The M values gemv.plan was asked for (each call that dispatched to a decode kernel of gemv.py's: the
    weight-streaming kernel, or at M <= 2 the row sweep it defers to)."""
    return plan_calls(gemv)


@pytest.mark.parametrize("dtype,out_dtype", [("bf16", "bf16"), ("fp16", "fp16"), ("bf16", "fp32")])
@pytest.mark.parametrize("n,k", NK)
@pytest.mark.parametrize("m", MS)
def test_16bit(m, n, k, dtype, out_dtype, launches):
    spec = GemmSpec.create(n, k, dtype=dtype, out_dtype=out_dtype)
    a, b = reference.random_operands(spec, m)
    g = build(m, n, k, dtype=dtype, out_dtype=out_dtype)
    out = reference.poisoned((m, n), out_dtype)
    g(a, b, out=out)
    # 16-bit weights stream up to M = 8; from 9 rows on the Hopper tiles (split-K) run.
    assert launches == ([m] if m <= gemv.DISPATCH_MAX_M else []), f"{m=} {n=} {k=}: dispatch"
    err = reference.error(out, reference.reference(spec, a, b))
    assert reference.within_bound(err, dtype), f"{m=} {n=} {k=} {dtype=} {out_dtype=} err={err:.2e}"
    assert reference.num_nonfinite(out) == 0


@pytest.fixture
def two_token_tiles(monkeypatch):
    """These tests check the kernel at every M it takes: calls stream weights up to M = 16, through the second
    token tile from M = 9, which the dispatch no longer picks (its limit, gemv.DISPATCH_MAX_M, is tested on the CPU
    and in test_dispatch_to_tiles)."""
    monkeypatch.setattr(gemv, "DISPATCH_MAX_M", gemv.MAX_M)


@pytest.mark.parametrize("scaling", ["tensor", "row", "block"])
@pytest.mark.parametrize("n,k", [(1, 16), (7, 528), (129, 7168), (2112, 1040), (300, 1000)])
@pytest.mark.parametrize("m", MS)
def test_fp8_recipes(m, n, k, scaling, launches, two_token_tiles):
    qa, sa, qb, sb, ref = fp8_problem(m, n, k, scaling, seed=m * 31 + n + k)
    g = build(m, n, k, dtype="fp8", scaling=scaling)
    out = reference.poisoned((m, n), "bf16")
    g(qa, qb, scale_a=sa, scale_b=sb, out=out)
    # FP8 rows of K % 16 != 0 bytes are not 16-byte aligned: the Gemm's own (staged) path runs; its values are
    # checked the same way
    assert launches == ([] if k % 16 else [m])
    err = reference.error(out, ref)
    assert reference.within_bound(err, "fp8_e4m3"), f"{m=} {n=} {k=} {scaling=} err={err:.2e}"
    assert err < 5e-3, f"{m=} {n=} {k=} {scaling=} err={err:.2e}"  # BF16 output rounding is ~2e-3


@pytest.mark.parametrize("out_dtype", ["fp32", "fp16"])
def test_fp8_block_outputs_and_mixed_types(out_dtype, launches, two_token_tiles):
    m, n, k = 13, 392, 2000 - 2000 % 16
    qa, sa, qb, sb, ref = fp8_problem(m, n, k, "block", seed=3, b_dtype="fp8_e5m2")
    g = build(m, n, k, dtype="fp8", b_dtype="fp8_e5m2", scaling="block", out_dtype=out_dtype)
    out = reference.poisoned((m, n), out_dtype)
    g(qa, qb, scale_a=sa, scale_b=sb, out=out)
    assert launches == [m]
    err = reference.error(out, ref)
    assert err < (5e-4 if out_dtype == "fp32" else 2e-3), (out_dtype, err)


@pytest.mark.parametrize("m,n,k,streams", [(8, 2112, 1040, True), (9, 2112, 1040, False), (16, 2112, 2064, False),
                                            (1, 7168, 1536, False), (8, 7168, 1520, True)])
def test_dispatch_to_tiles(m, n, k, streams, launches):
    """FP8 streams weights up to M = 8, and not where N >= 7168 and K >= 1536 (gemv.TILES_MIN_N): there the Hopper
    tiles run, with B loaded evict-first, and are correct."""
    qa, sa, qb, sb, ref = fp8_problem(m, n, k, "tensor", seed=m + k)
    g = build(m, n, k, dtype="fp8", scaling="tensor")
    out = reference.poisoned((m, n), "bf16")
    g(qa, qb, scale_a=sa, scale_b=sb, out=out)
    assert launches == ([m] if streams else []), (m, k)
    err = reference.error(out, ref)
    assert err < 5e-3 and reference.num_nonfinite(out) == 0, (m, k, err)


@pytest.mark.parametrize("layout", ["m_major_nan_padding", "row_major"])
def test_fp8_block_scale_a_layouts(layout, launches, two_token_tiles):
    import cupy

    m, n, k = 11, 520, 3072
    qa, sa, qb, sb, ref = fp8_problem(m, n, k, "block", seed=5)
    if layout == "row_major":
        sa_in = cupy.ascontiguousarray(sa)
    else:
        sa_in = reference.m_major_scales(sa)  # NaN in the padding rows
    g = build(m, n, k, dtype="fp8", scaling="block")
    out = reference.poisoned((m, n), "bf16")
    g(qa, qb, scale_a=sa_in, scale_b=sb, out=out)
    assert launches == [m] and reference.error(out, ref) < 5e-3, layout


def test_padded_rows_odd_k_and_slices(launches):
    """K % 8 != 0 works when rows are padded to 16 bytes (the step that holds the end of K is read with bounds
    checks); a sliced weight (row stride > K) and a padded output row stride."""
    m, n, k = 5, 129, 1001
    spec = GemmSpec.create(n, k, dtype="bf16")
    a_store = reference.random_matrix((m, 1008), "bf16")
    b_store = reference.random_matrix((n, 1016), "bf16")
    a, b = a_store[:, :k], b_store[:, :k]
    d_store = reference.poisoned((m, 160), "bf16")
    g = build(m, n, k, dtype="bf16")
    g(a, b, out=d_store[:, :n])
    assert launches == [m]
    err = reference.error(d_store[:, :n], reference.reference(spec, a, b))
    assert reference.within_bound(err, "bf16"), err
    assert reference.num_nonfinite(d_store) == m * (160 - n)  # nothing written past N


def test_unaligned_rows_fall_back(launches):
    m, n, k = 3, 64, 1001  # contiguous rows of 2002 bytes: not 16-byte aligned
    spec = GemmSpec.create(n, k, dtype="bf16")
    a, b = reference.random_operands(spec, m)
    out = build(m, n, k, dtype="bf16")(a, b)
    assert launches == []
    assert reference.within_bound(reference.error(out, reference.reference(spec, a, b)), "bf16")


def test_dispatch_stops_above_8_and_can_be_turned_off(launches):
    spec = GemmSpec.create(2112, 7168, dtype="bf16")
    g = build(16, 2112, 7168, dtype="bf16")
    for m in (8, 9, 16):
        a, b = reference.random_operands(spec, m)
        err = reference.error(g(a, b), reference.reference(spec, a, b))
        assert reference.within_bound(err, "bf16"), (m, err)
    assert launches == [8]
    off = build(1, 2112, 7168, dtype="bf16", weight_streaming=False)
    a, b = reference.random_operands(spec, 1)
    off(a, b)
    assert launches == [8]


@pytest.mark.parametrize("dtype", ["bf16", "fp8_block"])
def test_deterministic_bits(dtype, launches, two_token_tiles):
    import cupy

    m, n, k = 16, 2112, 7168
    if dtype == "bf16":
        spec = GemmSpec.create(n, k, dtype="bf16")
        a, b = reference.random_operands(spec, m)
        g, kwargs = build(m, n, k, dtype="bf16"), {}
        ref = reference.reference(spec, a, b)
    else:
        qa, sa, qb, sb, ref = fp8_problem(m, n, k, "block", seed=11)
        a, b, kwargs = qa, qb, {"scale_a": sa, "scale_b": sb}
        g = build(m, n, k, dtype="fp8", scaling="block")
    # The only call of the 16-bit second token tile (M = 9..16, no longer dispatched): its values too, not only
    # their repeatability (the bits of a wrong kernel repeat as well)
    first = reference.poisoned((m, n), g.spec.out_dtype)
    g(a, b, out=first, **kwargs)
    err = reference.error(first, ref)
    assert reference.within_bound(err, "bf16" if dtype == "bf16" else "fp8_e4m3") and err < 5e-3, (dtype, err)
    for _ in range(3):
        again = g(a, b, **kwargs)
        assert bool((again.view(cupy.uint16) == first.view(cupy.uint16)).all()), dtype
    assert launches == [m] * 4, dtype  # the weight-streaming kernel's second token tile (M = 16)


def test_cuda_graph_capture_and_replay(launches):
    m, n, k = 8, 4096, 7168
    spec = GemmSpec.create(n, k, dtype="bf16")
    a, b = reference.random_operands(spec, m)
    g = build(m, n, k, dtype="bf16")
    out = reference.poisoned((m, n), "bf16")
    graph, stream = capture_call(g, a, b, out)  # compiled, loaded and planned by the first, uncaptured call
    replay_with_fresh_a(graph, stream, spec, a, b, out, times=2)
    assert launches and set(launches) == {m}


def test_torch_tensors_and_streams():
    torch = pytest.importorskip("torch")
    import cupy

    from streams import nan_target, spin

    m, n, k = 4, 2112, 7168
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    g = build(m, n, k, dtype="bf16")
    g(a, b)  # compile, load and plan first: the spin below must outlast only the call itself
    a2 = nan_target(a)
    side = torch.cuda.Stream()
    spin(cupy.cuda.ExternalStream(side.cuda_stream), 0.3)  # a2 lands late on side: a kernel on another stream
    with torch.cuda.stream(side):                          # than torch's current one would read NaN
        a2.copy_(a)
        d = g(a2, b)
    side.synchronize()
    assert isinstance(d, torch.Tensor) and d.dtype == torch.bfloat16 and d.shape == (m, n)
    ref = a.double() @ b.double().T
    err = float((d.double() - ref).norm() / ref.norm())
    assert err < reference.ERROR_BOUND["bf16"], err


def test_offline_decode_miss_serves_the_gemm_kernel_unkept(monkeypatch):
    """DEEPGEMM_JIT_OFFLINE with the decode kernel not warmed: the Gemm's own kernel serves (right values), its plan
    is not kept (a kept one would serve after warmup filled the cache, for good), and the cache is not looked up
    again for OFFLINE_DECODE_RETRY_S (a miss costs a render and a disk lookup); then the decode kernel serves."""
    import cupy

    from deepgemm_jit import api
    from deepgemm_jit.errors import KernelNotCachedError

    m, n, k = 1, 2112, 7168
    spec = GemmSpec.create(n, k, dtype="bf16")
    a, b = reference.random_operands(spec, m)
    g = build(m, n, k, dtype="bf16")
    assert g.weight_streaming_kernel is gemv and m <= g.weight_streaming_max_m
    looked, real_plan = [], gemv.plan

    def missing(*args, **kwargs):
        looked.append(1)
        raise KernelNotCachedError("not cached", spec_tag="s", config_tag="c", arch="sm_90a", cache_dir=None)

    monkeypatch.setattr(gemv, "plan", missing)
    ref = reference.reference(spec, a, b)
    for _ in range(3):
        out = reference.poisoned((m, n), "bf16")
        g(a, b, out=out)
        cupy.cuda.Device().synchronize()
        assert reference.within_bound(reference.error(out, ref), "bf16")
    assert looked == [1] and not g._launch_plans
    served = []

    def counting(*args, **kwargs):
        served.append(real_plan(*args, **kwargs))
        return served[-1]

    monkeypatch.setattr(gemv, "plan", counting)
    g._decode_retry_at = 0.0  # the window over (api.OFFLINE_DECODE_RETRY_S)
    assert api.OFFLINE_DECODE_RETRY_S > 0
    out = reference.poisoned((m, n), "bf16")
    g(a, b, out=out)
    cupy.cuda.Device().synchronize()
    assert reference.within_bound(reference.error(out, ref), "bf16")
    (plan,) = g._launch_plans.plans()
    assert len(served) == 1 and plan is served[0]   # the decode kernel's plan, kept
