"""Split-K kernels on the GPU (splitk.py): float64 references (DESIGN.md bounds), fresh random inputs, outputs
poisoned with NaN, odd shapes, forced and chosen split counts, every dtype family with its scales, fused
epilogues run by the last share, identical bits on repeated runs, the arrival counters left zero, a workspace
that grows with M, and CUDA-graph capture and replay."""
import math

import pytest

from deepgemm_jit import build, launch, reference, splitk
from deepgemm_jit.spec import GemmSpec
from graphs import capture_call, replay_with_fresh_a
from problems import fp8_problem

pytestmark = pytest.mark.gpu



def _splits_used(g, m):
    """The shares a call of g with M = m runs (what Gemm.__call__ passes to the kernel)."""
    import cupy

    ops = g._split_operands(g.artifact, m, cupy.cuda.Device().id, cupy.cuda.get_current_stream())
    return 1 if ops is None else ops.num_splits


def _arrivals_zero(g):
    """Every arrival counter of g's workspaces is back to zero (the invariant each launch must keep)."""
    import cupy

    cupy.cuda.Device().synchronize()
    return all(not bool(arrivals.any()) for _, arrivals in g._split_workspace.pairs())


@pytest.mark.parametrize("dtype,out_dtype", [("bf16", "bf16"), ("fp16", "fp32")])
@pytest.mark.parametrize("m,n,k", [(64, 7168, 2048), (1, 520, 1000), (37, 2112, 7168), (130, 392, 4104),
                                   (300, 264, 776)])
@pytest.mark.parametrize("splits", [2, 3, 8])
def test_16bit_forced_splits(m, n, k, dtype, out_dtype, splits):
    spec = GemmSpec.create(n, k, dtype=dtype, out_dtype=out_dtype)
    a, b = reference.random_operands(spec, m)
    g = build(m, n, k, dtype=dtype, out_dtype=out_dtype, split_k=splits, weight_streaming=False)
    assert g.config.split_k
    k_blocks = -(-k // g.config.block_k)
    assert _splits_used(g, m) == min(splits, k_blocks)
    out = reference.poisoned((m, n), out_dtype)
    g(a, b, out=out)
    err = reference.error(out, reference.reference(spec, a, b))
    case = (m, n, k, dtype, out_dtype, splits, g.config.tag)
    assert reference.num_nonfinite(out) == 0, case
    assert reference.within_bound(err, dtype), (case, err)
    assert _arrivals_zero(g), case


def test_deterministic_bits_and_counters():
    """The same inputs give the same bits on every run, whichever share arrives last."""
    import cupy

    m, n, k = 96, 4096, 7168
    spec = GemmSpec.create(n, k, dtype="bf16")
    a, b = reference.random_operands(spec, m)
    g = build(m, n, k, dtype="bf16", split_k=7, weight_streaming=False)
    first = reference.poisoned((m, n), "bf16")
    g(a, b, out=first)
    err = reference.error(first, reference.reference(spec, a, b))
    assert reference.within_bound(err, "bf16"), err
    for _ in range(6):
        again = reference.poisoned((m, n), "bf16")
        g(a, b, out=again)
        assert bool(cupy.array_equal(again.view(cupy.uint16), first.view(cupy.uint16)))
    assert _arrivals_zero(g)


# Decode shapes whose heuristic kernel splits K on the H200 (132 SMs). 64x7168x16384, 128x4096x7168 and 16x7168x2048
# were listed here while the heuristic picked unsplit tiles for them: the test passed without a split-K kernel.
@pytest.mark.parametrize("m,n,k", [(64, 1536, 7168), (32, 2112, 7168), (128, 576, 7168), (16, 2112, 7168)])
def test_heuristic_splits_decode_shapes(m, n, k):
    """The chosen kernels of the decode shapes split K and are correct at their own M and at other M of any size."""
    spec = GemmSpec.create(n, k, dtype="bf16")
    g = build(m, n, k, dtype="bf16", weight_streaming=False)
    assert g.config.split_k and _splits_used(g, m) > 1, (g.config.tag, _splits_used(g, m))
    for mm in (m, 3, 200):
        a, b = reference.random_operands(spec, mm)
        out = reference.poisoned((mm, n), "bf16")
        g(a, b, out=out)
        err = reference.error(out, reference.reference(spec, a, b))
        assert reference.within_bound(err, "bf16"), (m, mm, n, k, g.config.tag, _splits_used(g, mm), err)
    assert _arrivals_zero(g)


@pytest.mark.parametrize("scaling", ["tensor", "row", "block"])
@pytest.mark.parametrize("m,n,k,splits", [(64, 2112, 7168, 5), (19, 1000, 1040, 3), (200, 392, 1000, 2)])
def test_fp8_recipes(m, n, k, scaling, splits):
    """K = 1000: FP8 rows that are not 16-byte aligned take the staged path, with the split kernel."""
    qa, sa, qb, sb, ref = fp8_problem(m, n, k, scaling, seed=m + n + k)
    g = build(m, n, k, dtype="fp8", scaling=scaling, split_k=splits, weight_streaming=False)
    out = reference.poisoned((m, n), "bf16")
    g(qa, qb, scale_a=sa, scale_b=sb, out=out)
    err = reference.error(out, ref)
    case = (m, n, k, scaling, splits, g.config.tag)
    assert reference.within_bound(err, "fp8_e4m3"), (case, err)
    assert err < 5e-3, (case, err)
    assert _arrivals_zero(g), case


def test_int8_exact_and_row_scaled():
    """INT32 partials add exactly: the split result equals the int64 product."""
    import cupy

    m, n, k = 70, 520, 4096
    rng = cupy.random.default_rng(5)
    a = rng.integers(-128, 128, (m, k), dtype=cupy.int8)
    b = rng.integers(-128, 128, (n, k), dtype=cupy.int8)
    g = build(m, n, k, dtype="int8", split_k=6, weight_streaming=False)
    out = cupy.full((m, n), -(2**31), dtype=cupy.int32)  # -1 is a product value; |sum| <= 2^14 K never reaches this
    g(a, b, out=out)
    assert bool(cupy.array_equal(out, (a.astype(cupy.int64) @ b.astype(cupy.int64).T).astype(cupy.int32)))
    sa = rng.random(m, dtype=cupy.float32) + 0.5
    sb = rng.random(n, dtype=cupy.float32) + 0.5
    g2 = build(m, n, k, dtype="int8", scaling="row", out_dtype="fp32", split_k=4, weight_streaming=False)
    out2 = reference.poisoned((m, n), "fp32")
    g2(a, b, scale_a=sa, scale_b=sb, out=out2)
    ref = (a.astype(cupy.float64) @ b.astype(cupy.float64).T) * sa[:, None].astype(cupy.float64) * sb[None, :]
    assert reference.error(out2, ref) < 1e-6


@pytest.mark.parametrize("m,n,k,out_dtype,epilogue,splits", [
    (64, 2112, 7168, "bf16", "bias+gelu", 4),
    (33, 520, 2048, "fp32", "beta+bias_row+silu+residual", 3),
    (100, 1040, 4096, "bf16", "swiglu", 5),
])
def test_epilogues_after_split(m, n, k, out_dtype, epilogue, splits):
    import cupy

    g = build(m, n, k, dtype="bf16", out_dtype=out_dtype, epilogue=epilogue, split_k=splits)
    assert g.config.split_k and _splits_used(g, m) == splits
    epi = g.spec.epi
    rng = cupy.random.default_rng(m + n + k)
    a = reference.random_matrix((m, k), "bf16", rng)
    b = reference.random_matrix((n, k), "bf16", rng, scale=1.0 / math.sqrt(k))
    n_out = g.spec.n_out
    bias = reference.random_matrix((n if epi.bias == "col" else m,), out_dtype, rng) if epi.bias != "none" else None
    c = reference.random_matrix((m, n_out), out_dtype, rng) if epi.beta else None
    residual = reference.random_matrix((m, n_out), out_dtype, rng) if epi.residual else None
    alpha, beta = (0.5, -1.25) if epi.beta else (1.0, 1.0)
    out = reference.poisoned((m, n_out), out_dtype)
    g(a, b, bias=bias, c=c, residual=residual, alpha=alpha, beta=beta, out=out)
    acc = reference.to_float64(a) @ reference.to_float64(b).T
    ref = reference.unfused_epilogue(acc, epi, bias, c, residual, alpha, beta)
    err = reference.error(out, ref)
    assert reference.within_bound(err, "bf16"), (epilogue, m, n, k, g.config.tag, err)
    assert _arrivals_zero(g)


def test_quant_group128_after_split():
    """quantize-on-store by the last share equals the unsplit kernel's (q, scales) within one FP8 ulp."""
    import cupy

    m, n, k = 64, 1024, 4096
    rng = cupy.random.default_rng(11)
    a = reference.random_matrix((m, k), "bf16", rng)
    b = reference.random_matrix((n, k), "bf16", rng, scale=1.0 / math.sqrt(k))
    bias = reference.random_matrix((n,), "fp32", rng)
    g = build(m, n, k, dtype="bf16", epilogue="bias+gelu+quant_fp8_g128", split_k=4)
    assert g.config.split_k
    q = cupy.full((m, n), 0xFF, dtype=cupy.uint8)  # an E4M3 NaN: never written from finite values
    scales = cupy.full((m, -(-n // 128)), cupy.nan, dtype=cupy.float32)
    assert g(a, b, bias=bias, out=q, scales_out=scales)[0] is q
    v = reference.unfused_epilogue(reference.to_float64(a) @ reference.to_float64(b).T, g.spec.epi, bias=bias)
    q_ref, s_ref = reference.quantized_epilogue_reference(v, g.spec.epi)
    assert bool(cupy.allclose(scales, s_ref, rtol=1e-4, atol=0))
    assert not bool((q == 0xFF).any())  # unwritten (0xFF is also only one code from -448 = 0xFE)
    assert int(reference.quant_ulp_distance(q, q_ref, "fp8").max()) <= 1
    assert _arrivals_zero(g)


def test_workspace_grows_with_m():
    import cupy

    n, k = 1040, 2048
    spec = GemmSpec.create(n, k, dtype="bf16")
    g = build(64, n, k, dtype="bf16", split_k=4, weight_streaming=False)
    dev = cupy.cuda.Device().id
    sizes = []
    for m in (64, 1000, 5, 64):
        a, b = reference.random_operands(spec, m)
        out = reference.poisoned((m, n), "bf16")
        g(a, b, out=out)
        err = reference.error(out, reference.reference(spec, a, b))
        assert reference.within_bound(err, "bf16"), (m, err)
        sizes.append(g._split_workspace.held()[(dev, cupy.cuda.get_current_stream().ptr, "partials")].nbytes)
    need = splitk.workspace_bytes(g.spec, g.config, 1000, 4)[0]
    assert sizes[0] < need <= sizes[1] == sizes[2] == sizes[3]
    assert _arrivals_zero(g)


def test_cuda_graph_capture_and_replay():
    m, n, k = 48, 2112, 7168
    spec = GemmSpec.create(n, k, dtype="bf16")
    a, b = reference.random_operands(spec, m)
    g = build(m, n, k, dtype="bf16", split_k=6, weight_streaming=False)
    out = reference.poisoned((m, n), "bf16")
    graph, stream = capture_call(g, a, b, out)  # the workspace is allocated by the first, uncaptured call
    replay_with_fresh_a(graph, stream, spec, a, b, out)
    assert _arrivals_zero(g)


def test_first_call_inside_a_capture_is_refused_clearly():
    """A split-K call whose workspace must grow (more rows than any earlier call) cannot allocate while a graph is
    being captured: a clear RuntimeError before anything is launched, and the Gemm works normally afterwards."""
    import cupy

    m, n, k = 200, 2112, 7168
    spec = GemmSpec.create(n, k, dtype="bf16")
    a, b = reference.random_operands(spec, m)
    g = build(48, n, k, dtype="bf16", split_k=6, weight_streaming=False)
    out = reference.poisoned((m, n), "bf16")
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        g(a[:48], b, out=out[:48], stream=stream)  # kernel compiled and loaded, workspace sized for 48 rows
        stream.synchronize()
        stream.begin_capture()
        try:
            with pytest.raises(RuntimeError, match="before capturing a CUDA graph"):
                g(a, b, out=out, stream=stream)
        finally:
            stream.end_capture()
        reference.poison(out, stream)  # rows 0..47 hold the warm-up's (right) values: the call must write them again
        g(a, b, out=out, stream=stream)
    stream.synchronize()
    assert reference.within_bound(reference.error(out, reference.reference(spec, a, b)), "bf16")
    assert _arrivals_zero(g)


def test_torch_tensors_on_current_stream():
    torch = pytest.importorskip("torch")
    import cupy

    from streams import nan_target, spin

    m, n, k = 40, 2112, 7168
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
    g = build(m, n, k, dtype="bf16", split_k=5, weight_streaming=False)
    g(a, b)  # compile, load and plan first: the spin below must outlast only the call itself
    a2 = nan_target(a)
    s = torch.cuda.Stream()
    spin(cupy.cuda.ExternalStream(s.cuda_stream), 0.3)  # a2 lands late on s: a kernel on another stream than
    with torch.cuda.stream(s):                          # torch's current one would read NaN
        a2.copy_(a)
        out = g(a2, b)
    s.synchronize()
    ref = a.double() @ b.double().T
    err = float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref))
    assert err < 1e-2, err


@pytest.mark.parametrize("k,deterministic", [(7168, True), (7168, False), (7170, True)])
def test_two_streams_run_one_gemm_at_once(k, deterministic):
    """Overlapped micro-batches: one Gemm (as deepgemm_jit.gemm and the torch ops share one per problem) called on
    two streams whose kernels run at the same time. Each stream has its own split-K workspace and staging buffers
    (K = 7170: A and B copied into them on every call), so every result is right; sharing them (before
    stream_buffers.py) mixed the two streams' partial sums and arrival counters. Both streams wait on a spin first,
    so their queued calls start together on the GPU (68 CTAs each: both fit on the SMs at once)."""
    import cupy

    from streams import spin

    m, n, calls = 64, 2112, 24
    g = build(m, n, k, dtype="bf16", split_k=4, weight_streaming=False, deterministic=deterministic)
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    operands = [reference.random_operands(g.spec, m) for _ in streams]
    b = operands[0][1]
    refs = [reference.reference(g.spec, a, b) for a, _ in operands]
    outs = [[reference.poisoned((m, n), "bf16") for _ in range(calls)] for _ in streams]
    for (a, _), stream, out in zip(operands, streams, outs):  # each stream's workspace sized, plans kept
        g(a, b, out=out[0], stream=stream)
    cupy.cuda.Device().synchronize()
    for out in outs:
        reference.poison(out[0])
    for stream in streams:
        spin(stream, 0.05)
    for i in range(calls):
        for (a, _), stream, out in zip(operands, streams, outs):
            g(a, b, out=out[i], stream=stream)
    cupy.cuda.Device().synchronize()
    bad = [(j, i, reference.error(out, ref)) for j, (outs_j, ref) in enumerate(zip(outs, refs))
           for i, out in enumerate(outs_j) if not reference.within_bound(reference.error(out, ref), "bf16")]
    assert not bad, bad[:6]
    assert len(g._split_workspace.pairs()) == 2 and _arrivals_zero(g)
    # The first stream's operands on the second stream: its kept plan writes the first stream's workspace, so the
    # call plans again for the second stream's, and keeps that plan next to the first.
    kept = len(g._launch_plans.plans())
    reference.poison(outs[0][0])
    g(operands[0][0], b, out=outs[0][0], stream=streams[1])
    streams[1].synchronize()
    assert reference.within_bound(reference.error(outs[0][0], refs[0]), "bf16")
    assert len(g._launch_plans.plans()) == kept + 1
    if k % 8:
        assert {stream for _, stream, _ in g._staging.held()} == {s.ptr for s in streams}


def test_two_threads_on_their_per_thread_default_streams():
    """The per-thread default stream (cupy.cuda.Stream.ptds, handle 2) is a different stream in every thread: two
    threads calling one Gemm on theirs at the same time each get their own workspace (stream_buffers.stream_key);
    keyed by the handle alone, they shared one."""
    import threading

    import cupy

    from streams import spin

    m, n, k, calls = 64, 2112, 7168, 24
    g = build(m, n, k, dtype="bf16", split_k=4, weight_streaming=False)
    b = reference.random_operands(g.spec, m)[1]
    inputs = [reference.random_operands(g.spec, m)[0] for _ in range(2)]
    refs = [reference.reference(g.spec, a, b) for a in inputs]
    outs = [[reference.poisoned((m, n), "bf16") for _ in range(calls)] for _ in inputs]
    # One gate for both threads' streams, spun after their first calls (which allocate and synchronise the
    # device): their calls start at the same moment on the GPU. A spin of each thread's own started ~1 ms apart,
    # longer than a thread's 24 calls take, and the control then saw no overlap.
    gate = cupy.cuda.Stream(non_blocking=True)
    warmed, gated, opened, failures = threading.Barrier(3), threading.Barrier(3), [], []

    def work(j):
        try:
            stream = cupy.cuda.Stream.ptds
            assert stream.ptr == 2
            g(inputs[j], b, out=outs[j][0], stream=stream)  # this thread's workspace sized, plans kept
            stream.synchronize()
            reference.poison(outs[j][0], stream)
            warmed.wait()
            gated.wait()
            stream.wait_event(opened[0])
            for i in range(calls):
                g(inputs[j], b, out=outs[j][i], stream=stream)
            stream.synchronize()
        except Exception as exc:  # reported below, in the test's thread
            failures.append(exc)
            warmed.abort()
            gated.abort()

    threads = [threading.Thread(target=work, args=(j,)) for j in range(2)]
    for thread in threads:
        thread.start()
    try:
        warmed.wait(timeout=120)
        spin(gate, 0.05)
        opened.append(gate.record())
        gated.wait(timeout=10)
    except threading.BrokenBarrierError:
        pass  # a thread failed: its exception is reported below
    for thread in threads:
        thread.join()
    assert not failures, failures
    bad = [(j, i, reference.error(out, ref)) for j, (outs_j, ref) in enumerate(zip(outs, refs))
           for i, out in enumerate(outs_j) if not reference.within_bound(reference.error(out, ref), "bf16")]
    assert not bad, bad[:6]
    assert len(g._split_workspace.pairs()) == 2 and _arrivals_zero(g)


def test_plan_grid_covers_units():
    """The grid launches tiles x splits CTAs up to the SM count."""
    import cupy

    m, n, k = 64, 520, 4096
    g = build(m, n, k, dtype="bf16", split_k=4, weight_streaming=False)
    spec = g.spec
    a, b = reference.random_operands(spec, m)
    out = reference.poisoned((m, n), "bf16")
    g(a, b, out=out)
    plan, = g._launch_plans.plans()
    tiles = splitk.num_tiles(spec, g.config, m)
    assert plan.grid[0] == min(launch.num_sms(cupy.cuda.Device().id), tiles * 4)


def _workspace_zero(g):
    """Every partial word and arrival counter of g's workspaces is zero (the atomic mode's invariant: the shares add
    into zeroed sums, which the last share zeroes again)."""
    import cupy

    cupy.cuda.Device().synchronize()
    return all(not bool(partials.any()) and not bool(arrivals.any())
               for partials, arrivals in g._split_workspace.pairs())


@pytest.mark.parametrize("dtype,out_dtype,epilogue", [("bf16", "bf16", None), ("fp16", "fp32", "bias+gelu"),
                                                      ("tf32", "fp32", None)])
@pytest.mark.parametrize("m,n,k,splits", [(1, 520, 1000, 3), (37, 2112, 7168, 4), (64, 7168, 2048, 8),
                                          (130, 392, 4104, 2)])
def test_atomic_mode_16bit(m, n, k, splits, dtype, out_dtype, epilogue):
    """deterministic=False: the shares add atomically into one sum per tile; results within the same bounds, every
    partial and counter zero after each call, over two calls with fresh inputs (the second adds into the zeros the
    first left)."""
    import cupy

    g = build(m, n, k, dtype=dtype, out_dtype=out_dtype, epilogue=epilogue, split_k=splits, weight_streaming=False,
              deterministic=False)
    assert g.config.split_k and not g.deterministic and g.explain()["split_k"]["deterministic"] is False
    store = "fp32" if dtype == "tf32" else dtype
    for seed in (1, 2):
        rng = cupy.random.default_rng(m + n + k + seed)
        a = reference.random_matrix((m, k), store, rng)
        b = reference.random_matrix((n, k), store, rng, scale=1.0 / math.sqrt(k))
        bias = reference.random_matrix((n,), out_dtype, rng) if epilogue else None
        out = reference.poisoned((m, n), out_dtype)
        g(a, b, out=out, **({"bias": bias} if epilogue else {}))
        acc = reference.to_float64(a) @ reference.to_float64(b).T
        ref = reference.unfused_epilogue(acc, g.spec.epi, bias, None, None, 1.0, 1.0) if epilogue else acc
        err = reference.error(out, ref)
        case = (m, n, k, dtype, epilogue, splits, g.config.tag, seed)
        assert reference.num_nonfinite(out) == 0, case
        assert reference.within_bound(err, dtype), (case, err)
        assert _workspace_zero(g), case


@pytest.mark.parametrize("scaling", ["tensor", "block"])
def test_atomic_mode_fp8_and_int8_exact(scaling):
    """FP8 (promoted) in the atomic mode; INT8 ignores it (its ordered INT32 sum is exact and was faster)."""
    import cupy

    m, n, k = 50, 2112, 7168
    qa, sa, qb, sb, ref = fp8_problem(m, n, k, scaling, seed=7)
    g = build(m, n, k, dtype="fp8", scaling=scaling, split_k=5, weight_streaming=False, deterministic=False)
    out = reference.poisoned((m, n), "bf16")
    g(qa, qb, scale_a=sa, scale_b=sb, out=out)
    err = reference.error(out, ref)
    assert reference.within_bound(err, "fp8_e4m3") and err < 5e-3, (g.config.tag, err)
    assert _workspace_zero(g)
    rng = cupy.random.default_rng(3)
    a = rng.integers(-128, 128, size=(m, k), dtype=cupy.int8)
    b = rng.integers(-128, 128, size=(n, k), dtype=cupy.int8)
    gi = build(m, n, k, dtype="int8", split_k=6, weight_streaming=False, deterministic=False)
    d = gi(a, b)
    assert bool(cupy.array_equal(d, a.astype(cupy.int64) @ b.astype(cupy.int64).T)), gi.config.tag
    assert _arrivals_zero(gi)  # INT8 keeps the ordered sum (its partials stay written), exact either way
    assert gi.explain()["split_k"]["deterministic"] is True


def test_atomic_mode_cuda_graph_and_growth():
    """The atomic mode under a CUDA graph (three replays with fresh inputs) and across a workspace that grows."""
    n, k = 2112, 7168
    spec = GemmSpec.create(n, k, dtype="bf16")
    g = build(48, n, k, dtype="bf16", split_k=6, weight_streaming=False, deterministic=False)
    for m in (48, 700, 3, 48):
        a, b = reference.random_operands(spec, m)
        out = reference.poisoned((m, n), "bf16")
        g(a, b, out=out)
        err = reference.error(out, reference.reference(spec, a, b))
        assert reference.within_bound(err, "bf16"), (m, err)
        assert _workspace_zero(g), m
    m = 48
    a, b = reference.random_operands(spec, m)
    out = reference.poisoned((m, n), "bf16")
    graph, stream = capture_call(g, a, b, out)
    replay_with_fresh_a(graph, stream, spec, a, b, out)
    assert _workspace_zero(g)
