"""End-to-end GPU sweeps: random inputs, float64 references, NaN-poisoned outputs.

Skipped cleanly without a GPU (marker `gpu`).
"""
import numpy as np
import pytest

import deepgemm_jit as dg
from deepgemm_jit import reference, sm90_rules
from graphs import capture_call, replay_with_fresh_a

pytestmark = pytest.mark.gpu

DTYPES = ("fp16", "bf16", "tf32")
LAYOUTS = ("nt", "nn", "tn", "tt")
SHAPES = [(1, 1, 1), (17, 33, 65), (1000, 1001, 1003), (128, 256, 512), (257, 129, 4096), (4096, 4096, 4096),
          (3, 4000, 17), (300, 24, 1536)]


def check(g, m, out=None, a=None, b=None, **call_kwargs):
    cupy = pytest.importorskip("cupy")
    spec = g.spec
    if a is None:
        a, b = reference.random_operands(spec, m)
    if out is None:
        out = reference.poisoned(spec.out_shape(m), spec.out_dtype)
    result = g(a, b, out=out, **call_kwargs)
    assert result is out
    cupy.cuda.get_current_stream().synchronize()
    err = reference.relative_error(out, reference.reference(spec, a, b))
    bound = reference.ERROR_BOUND[spec.dtype]
    assert err <= bound, f"m={m} n={spec.n} k={spec.k} dtype={spec.dtype} layout={spec.layout} " \
                         f"out={spec.out_dtype} cfg={g.config.tag} err={err:.2e} bound={bound}"
    return err


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_sweep(m, n, k, dtype, layout):
    check(dg.build(m, n, k, dtype=dtype, layout=layout), m)


@pytest.mark.parametrize("dtype,out_dtype", [("bf16", "fp32"), ("fp16", "fp32"), ("bf16", "fp16"),
                                             ("fp16", "bf16"), ("tf32", "bf16")])
def test_out_dtypes(dtype, out_dtype):
    check(dg.build(200, 136, 264, dtype=dtype, out_dtype=out_dtype), 200)


@pytest.mark.parametrize("dtype,layout", [("tf32", "nt"), ("tf32", "nn"), ("bf16", "nt")])
def test_portable_two_stage_tiles(dtype, layout):
    """The portable kernel with a two-stage ring, what 128-row TF32 tiles run on sm_86 / sm_89 (their 99 KB per block
    hold no third stage; config.choose_sm80_config, session 60): forced here, where the H200 would pick the Hopper
    family, on odd sizes. Added without a GPU: not yet run."""
    cfg = dg.KernelConfig("sm80", 128, 128, 32, 2, 2, 4, vec_a=1, vec_b=1)  # (scalar loads: any row length)
    for m, n, k in ((300, 1001, 1003), (128, 256, 4096), (1, 33, 65)):
        g = dg.build(m, n, k, dtype=dtype, layout=layout, config=cfg)
        assert g.config.num_stages == 2 and g.family == "sm80", g.config
        check(g, m)


def test_one_kernel_serves_every_m():
    g = dg.build(4096, 520, 1032, dtype="bf16")
    for m in (1, 2, 63, 64, 65, 127, 129, 777, 5001):
        check(g, m)
    # Packed operands need no fallback variant beyond the kernel built.
    assert len(g._variants) == (0 if g.family == "sm90" else 1)


def test_sm90_is_used_and_tma_fallback_works():
    g = dg.build(512, 520, 1032, dtype="bf16")
    assert g.family == "sm90"
    check(g, 333)
    b = reference.random_matrix((520, 1032), "bf16")
    # Row strides of 2070 B (2-byte aligned) and 2072 B (8-byte aligned): not TMA-legal, so A is copied into an
    # aligned buffer for the Hopper kernel (Gemm._stages); no portable kernel is built.
    for pad in (3, 4):
        a_padded = reference.random_matrix((333, 1032 + pad), "bf16")
        check(g, 333, a=a_padded[:, :1032], b=b)
    assert not g._variants and {role for _, _, role in g._staging.held()} == {"a"}


def test_capture_before_staging_runs_the_portable_kernel():
    """A CUDA graph captured before the staging buffers were sized cannot allocate them: the call runs the portable
    kernel (4-element loads for A's 2072-byte rows) inside the capture instead, and the replay is correct."""
    import cupy

    from deepgemm_jit import launch
    from deepgemm_jit.arrays import matrix_view

    g = dg.build(333, 520, 1032, dtype="bf16", weight_streaming=False)
    a = reference.random_matrix((333, 1032 + 4), "bf16")[:, :1032]
    b = reference.random_matrix((520, 1032), "bf16")
    out = reference.poisoned((333, 520), "bf16")
    portable = g._artifact_for(matrix_view(a, "a"), matrix_view(b, "b"), matrix_view(out, "out"))
    launch.load(portable, g.spec, cupy.cuda.Device().id)  # loaded outside the capture
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        g(a, b, out=out, stream=stream)
        graph = stream.end_capture()
        assert reference.num_nonfinite(out) == out.size  # captured, not run
        graph.launch(stream)
    stream.synchronize()
    assert [(art.config.family, art.config.vec_a) for art in g._variants.values()] == [("sm80", 4)]
    assert not g._staging.held()
    assert reference.within_bound(reference.error(out, reference.reference(g.spec, a, b)), "bf16")
    # The capture's plan is not kept: the same call after it stages A and runs the Hopper kernel (a kept plan
    # replayed the portable one for good).
    assert not g._launch_plans
    reference.poison(out)
    g(a, b, out=out)
    cupy.cuda.Device().synchronize()
    from deepgemm_jit import staging

    assert g._staging.held() and [type(plan) for plan in g._launch_plans.plans()] == [staging.StagedPlan]
    assert reference.within_bound(reference.error(out, reference.reference(g.spec, a, b)), "bf16")


def test_staged_call_is_captured_in_a_cuda_graph():
    """After a first call sized the Gemm's staging buffers (staging.py), a staged call (odd K) allocates and
    synchronises nothing: it is captured in a CUDA graph and replays with fresh A, D poisoned before each replay."""
    g = dg.build(300, 1001, 1003, dtype="bf16", weight_streaming=False)
    a, b = reference.random_operands(g.spec, 300)
    out = reference.poisoned((300, 1001), "bf16")
    graph, stream = capture_call(g, a, b, out)  # the first, uncaptured call sizes the staging buffers
    sizes = {key: buf.nbytes for key, buf in g._staging.held().items()}
    assert {role for _, _, role in sizes} == {"a", "b", "d"}
    replay_with_fresh_a(graph, stream, g.spec, a, b, out)
    assert {key: buf.nbytes for key, buf in g._staging.held().items()} == sizes


def test_odd_k_runs_the_hopper_kernel_on_staged_copies():
    """K = 1003 in 16 bits (rows of 2006 bytes): the build is the Hopper kernel and calls copy A and B into aligned
    buffers (and D, N = 1001, through one), where the portable kernel loaded them one element at a time."""
    for dtype in ("bf16", "fp16", "tf32"):
        g = dg.build(1000, 1001, 1003, dtype=dtype)
        assert g.family == "sm90"
        for m in (1000, 17, 129):
            check(g, m)
        assert not g._variants


@pytest.mark.parametrize("layout", ["nn", "tn", "tt"])
def test_tf32_mn_major_operands_are_transposed_for_the_hopper_kernel(layout):
    """TF32 with MN-major operands runs the nt Hopper kernel on K-major copies (copies.py; nn built for more than
    sm90_rules.SM90_TF32_TRANS_B_MAX_M rows): odd sizes, sliced views, a fused epilogue, and a CUDA graph captured
    after a first call, replayed on fresh inputs."""
    big = 2 * sm90_rules.SM90_TF32_TRANS_B_MAX_M
    g = dg.build(big, 1001, 1003, dtype="tf32", layout=layout, weight_streaming=False)
    assert g.family == "sm90" and g.kernel_spec.layout == "nt"
    for m in (1000, 1, 17, 129, 2049):
        check(g, m)
    (ar, ac), (br, bc) = g.spec.a_shape(77), g.spec.b_shape()
    a = reference.random_matrix((ar, ac + 3), "tf32")[:, 1:1 + ac]
    b = reference.random_matrix((br, bc + 5), "tf32")[:, :bc]
    check(g, 77, a=a, b=b)
    assert not g._variants  # the portable kernel never ran
    a, b = reference.random_operands(g.spec, 77)
    out = reference.poisoned((77, 1001), "tf32")
    graph, stream = capture_call(g, a, b, out)
    replay_with_fresh_a(graph, stream, g.spec, a, b, out, times=2, dtype="tf32")
    e = dg.build(big, 256, 512, dtype="tf32", layout=layout, epilogue="bias+gelu")
    assert e.family == "sm90" and e.kernel_spec.layout == "nt"
    a, b = reference.random_operands(e.spec, 300)
    bias = reference.random_matrix((256,), "tf32")
    out = reference.poisoned((300, 256), "tf32")
    e(a, b, bias=bias, out=out)
    ref = reference.unfused_epilogue(reference.reference(e.spec, a, b), e.spec.epi, bias)
    assert reference.within_bound(reference.relative_error(out, ref), "tf32")


@pytest.mark.parametrize("m_build,n,k,epilogue", [(64, 4096, 7168, None), (17, 32, 65, None), (200, 1001, 1003, None),
                                                   (256, 7168, 2048, "bias+gelu"), (1, 2112, 7168, None),
                                                   (128, 4096, 7168, None)])
def test_tf32_nn_b_transposed_in_the_kernel(m_build, n, k, epilogue, config=None):
    """TF32 nn at small M: the Hopper kernel reads B as stored (K, N) and its converter warps transpose every stage
    in shared memory (sm90_tiles.sm90_trans_b): awkward sizes (N and K tails, N = 1001 whose rows are copied to 16-byte
    pitches, split-K at M = 1 / 128), every M from 1 to past the build's, a fused epilogue, sliced views, and a
    CUDA graph captured after a first call, replayed on fresh inputs. (128x96 over 4 stages, where a converter that
    skipped stages once waited a phase behind and hung, is no longer the heuristic's pick at M = 128: forced in
    test_tf32_nn_128x96_split_k_four_stages.)"""
    g = dg.build(m_build, n, k, dtype="tf32", layout="nn", epilogue=epilogue, config=config)
    assert g.family == "sm90" and g.kernel_spec.layout == "nn" and g.config.block_n % 32 == 0, g.config.tag
    bias = reference.random_matrix((n,), "tf32") if epilogue else None
    kwargs = {"bias": bias} if epilogue else {}

    def run(m, a=None, b=None):
        if a is None:
            a, b = reference.random_operands(g.spec, m)
        out = reference.poisoned((m, n), "tf32")
        assert g(a, b, out=out, **kwargs) is out
        ref = reference.reference(g.spec, a, b)
        if epilogue:
            ref = reference.unfused_epilogue(ref, g.spec.epi, bias)
        err = reference.relative_error(out, ref)
        assert reference.within_bound(err, "tf32"), (m, n, k, epilogue, g.config.tag, err)

    for m in sorted({1, 17, 64, 129, m_build, 2 * m_build + 3}):
        run(m)
    (ar, ac), (br, bc) = g.spec.a_shape(77), g.spec.b_shape()
    run(77, reference.random_matrix((ar, ac + 3), "tf32")[:, 1:1 + ac],
        reference.random_matrix((br, bc + 5), "tf32")[:, :bc])
    assert not g._variants  # the portable kernel never ran
    if epilogue is None:
        a, b = reference.random_operands(g.spec, 77)
        out = reference.poisoned((77, n), "tf32")
        graph, stream = capture_call(g, a, b, out)
        replay_with_fresh_a(graph, stream, g.spec, a, b, out, times=2, dtype="tf32")


@pytest.mark.parametrize("m_build", [1, 128])
def test_tf32_nn_128x96_split_k_four_stages(m_build):
    """The converter-warp configuration that once hung (128x96, split-K, 4 stages), forced: the heuristic's picks for
    this shape moved to 64x64 / 128x64 tiles, so the test above no longer ran it."""
    from deepgemm_jit import config, sm90_rules
    from deepgemm_jit.spec import GemmSpec

    kspec = sm90_rules.kernel_spec(GemmSpec.create(4096, 7168, dtype="tf32", layout="nn"), "sm_90a", m_build)
    cfg = config.sm90_config(kspec, 128, 96, 4, split_k=True)
    test_tf32_nn_b_transposed_in_the_kernel(m_build, 4096, 7168, None, config=cfg)


@pytest.mark.parametrize("dtype,layout", [("bf16", "nt"), ("fp16", "nn"), ("tf32", "nt")])
def test_large_calls_realign_rows_off_sectors(dtype, layout):
    """K = 2056 in 16 bits or 2052 in TF32 (rows an odd multiple of 16 bytes: TMA-legal, every other row off a
    32-byte sector): a call of 4096 rows copies B (re-read by every M block) into a 128-byte-pitched buffer
    (sm90_rules.sm90_realign_roles), one of 64 rows reads A and B in place; 256 x 7168 copies A (re-read by every N
    block). fp16 nn: B's rows are N = 2056 long."""
    n, k = (2056, 2048) if layout == "nn" else (2048, 2056 if dtype != "tf32" else 2052)
    g = dg.build(4096, n, k, dtype=dtype, layout=layout)
    check(g, 64)
    assert not g._staging.held()
    check(g, 4096)
    assert {role for _, _, role in g._staging.held()} == {"b"}
    if layout == "nt":
        g = dg.build(256, 7168, k, dtype=dtype, layout=layout)
        check(g, 256)
        assert {role for _, _, role in g._staging.held()} == {"a"}


def test_tf32_tn_small_m_copies_a_and_transposes_b_in_the_kernel():
    """TF32 tn at small M runs the nn twin's kernel (sm90_rules.kernel_spec): each call copies only A (M x K, small)
    transposed, the kernel transposes B as stored (K, N) in shared memory; awkward M, a sliced A, a graph replay."""
    g = dg.build(64, 4096, 7168, dtype="tf32", layout="tn")
    assert g.kernel_spec.layout == "nn" and g.transposed_operands == ("a",)
    for m in (1, 17, 64, 129, 300):
        check(g, m)
    (ar, ac), (br, bc) = g.spec.a_shape(77), g.spec.b_shape()
    a = reference.random_matrix((ar, ac + 3), "tf32")[:, 1:1 + ac]
    check(g, 77, a=a, b=reference.random_matrix((br, bc), "tf32"))
    assert not g._variants
    a, b = reference.random_operands(g.spec, 33)
    out = reference.poisoned((33, 4096), "tf32")
    graph, stream = capture_call(g, a, b, out)
    replay_with_fresh_a(graph, stream, g.spec, a, b, out, times=2, dtype="tf32")


def test_sliced_a_off_sectors_is_realigned():
    """A sliced at column 8 of a BF16 matrix: a base 16 bytes into a 32-byte sector on every row (aligned pitch)."""
    g = dg.build(4096, 2048, 2048, dtype="bf16")
    a = reference.random_matrix((4096, 2048 + 64), "bf16")[:, 8:8 + 2048]
    b = reference.random_matrix((2048, 2048), "bf16")
    assert a.data.ptr % 32 == 16 and a.strides[0] % 32 == 0
    check(g, 4096, a=a, b=b)
    assert {role for _, _, role in g._staging.held()} == {"a"}


def test_staged_plans_replay_after_the_buffers_grew():
    """A kept staged plan (same operands, out= given) replays on the buffers it was made with, even after a larger
    call grew them (the outgrown ones are retired, not freed)."""
    g = dg.build(64, 1001, 1003, dtype="bf16", weight_streaming=False)
    a, b = reference.random_operands(g.spec, 64)
    out = reference.poisoned((64, 1001), "bf16")
    g(a, b, out=out)
    ref = reference.reference(g.spec, a, b)
    assert reference.within_bound(reference.error(out, ref), "bf16")
    check(g, 900)  # grows the staging buffers of a, d
    assert g._staging._sets.retired
    reference.poison(out)
    # Same buffer, new values: the retired A buffer the kept plan was made with still holds the old A's copy, so with
    # the old values a replay whose kernel read it without the copy-in (or the copy went to the grown buffer) passed.
    a[...] = reference.random_matrix(a.shape, "bf16")
    ref = reference.reference(g.spec, a, b)
    assert g(a, b, out=out) is out  # the kept plan
    assert reference.within_bound(reference.error(out, ref), "bf16")


def test_new_output_array():
    cupy = pytest.importorskip("cupy")
    g = dg.build(65, 72, 80, dtype="fp16")
    a, b = reference.random_operands(g.spec, 65)
    d = g(a, b)
    assert isinstance(d, cupy.ndarray) and d.shape == (65, 72) and d.dtype == np.float16
    assert reference.relative_error(d, reference.reference(g.spec, a, b)) <= 1e-2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ("nt", "nn"))
def test_padded_and_offset_operands(dtype, layout):
    """Row strides wider than the row, and base pointers off 16-byte alignment."""
    g = dg.build(96, 136, 200, dtype=dtype, layout=layout)
    m = 96
    spec = g.spec
    (ar, ac), (br, bc) = spec.a_shape(m), spec.b_shape()
    for pad, off in ((8, 0), (3, 0), (8, 1), (0, 1)):
        a_big = reference.random_matrix((ar, ac + pad + off), dtype)
        b_big = reference.random_matrix((br, bc + pad + off), dtype)
        a, b = a_big[:, off:off + ac], b_big[:, off:off + bc]
        out_big = reference.poisoned((m, spec.n + 5), spec.out_dtype)
        out = out_big[:, 2:2 + spec.n]
        check(g, m, out=out, a=a, b=b)
        # The padding of out, left and right of its columns, was never written.
        assert not bool(np.isfinite(reference.to_float64(out_big[:, :2])).any())
        assert not bool(np.isfinite(reference.to_float64(out_big[:, 2 + spec.n:])).any())


def test_streams_and_ordering():
    cupy = pytest.importorskip("cupy")
    g = dg.build(512, 512, 512, dtype="bf16")
    a, b = reference.random_operands(g.spec, 512)
    ref = reference.reference(g.spec, a, b)
    from streams import spin

    from streams import nan_target

    side = cupy.cuda.Stream(non_blocking=True)
    a2 = nan_target(a)
    out = reference.poisoned((512, 512), "bf16")
    spin(side, 0.2)  # the copy below lands late on `side`: a kernel on another stream would read NaN
    with side:
        a2[...] = a
        g(a2, b, out=out)  # current stream is `side`
    side.synchronize()
    assert reference.relative_error(out, ref) <= 1e-2
    for stream_arg in (side, side.ptr):  # stream= while the current stream is the (non-ordering) default one
        a3 = nan_target(a)
        out2 = reference.poisoned((512, 512), "bf16")
        spin(side, 0.2)
        with side:
            a3[...] = a
        g(a3, b, out=out2, stream=stream_arg)
        side.synchronize()
        assert reference.relative_error(out2, ref) <= 1e-2, type(stream_arg)


def test_functional_gemm_memoizes():
    cupy = pytest.importorskip("cupy")
    a = reference.random_matrix((70, 96), "bf16")
    b = reference.random_matrix((40, 96), "bf16")
    d1 = dg.gemm(a, b)
    d2 = dg.gemm(a, b)
    spec = dg.GemmSpec.create(40, 96, dtype="bf16")
    assert reference.relative_error(d1, reference.reference(spec, a, b)) <= 1e-2
    assert bool(cupy.all(d1.view(cupy.uint16) == d2.view(cupy.uint16)))
    from deepgemm_jit import api as gemm_mod
    assert len([k for k in gemm_mod._functional if k[0] == spec]) == 1


def test_zero_m_returns_empty():
    cupy = pytest.importorskip("cupy")
    g = dg.build(8, 16, 16, dtype="fp16")
    a = cupy.empty((0, 16), dtype=cupy.float16)
    b = reference.random_matrix((16, 16), "fp16")
    assert g(a, b).shape == (0, 16)


def test_wrong_device_arch_is_refused():
    g = dg.build(8, 16, 16, dtype="fp16", arch="sm_80")
    a, b = reference.random_operands(g.spec, 8)
    from deepgemm_jit import device
    if device.runs_on("sm_80", *device.capability()):
        pytest.skip("this GPU runs sm_80 cubins")
    with pytest.raises(ValueError, match="compiled for sm_80"):
        g(a, b)


def test_demo_on_gpu(capsys):
    from deepgemm_jit import cli
    assert cli.main(["demo", "--reps", "5"]) == 0
    assert "all results within bounds" in capsys.readouterr().out


def test_tuning_persists_and_is_reused(tmp_path, monkeypatch):
    from deepgemm_jit import jit, timing
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(tmp_path / "cache"))
    jit.clear_memo()
    g = dg.build(4096, 2112, 1024, dtype="bf16", tune=True)
    assert list((tmp_path / "cache" / "tuning").glob("*.json"))
    check(g, 4096)

    def no_timing(*args, **kwargs):
        raise AssertionError("a stored tuning result must be reused without timing")
    monkeypatch.setattr(timing, "time_interleaved", no_timing)
    jit.clear_memo()
    again = dg.build(4000, 2112, 1024, dtype="bf16", tune=True)   # same M bucket (4096: 128-row buckets)
    assert again.config == g.config


def test_repeat_calls_reuse_plans_and_see_new_data():
    pytest.importorskip("cupy")
    for dtype, layout in (("bf16", "nt"), ("fp16", "nn")):
        g = dg.build(256, 136, 200, dtype=dtype, layout=layout)
        a, b = reference.random_operands(g.spec, 256)
        out = reference.poisoned((256, 136), g.spec.out_dtype)
        check(g, 256, out=out, a=a, b=b)
        assert len(g._launch_plans) == 1
        a[...] = reference.random_matrix(a.shape, dtype)   # same buffers, new values
        out[...] = reference.poisoned(out.shape, g.spec.out_dtype)
        check(g, 256, out=out, a=a, b=b)                   # the stored plan, fresh data
        assert len(g._launch_plans) == 1
        other = reference.poisoned((256, 136), g.spec.out_dtype)
        check(g, 256, out=other, a=a, b=b)                  # a new output buffer: a new plan
        assert len(g._launch_plans) == 2
        with pytest.raises(ValueError, match="out has shape"):   # validation still guards new buffers
            g(a, b, out=reference.poisoned((256, 135), g.spec.out_dtype))


def test_torch_side_stream_ordering():
    torch = pytest.importorskip("torch")
    g = dg.build(512, 512, 512, dtype="bf16")
    a = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    ref = (a.double() @ b.double().T)
    from streams import nan_target

    a2 = nan_target(a)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)        # keep the side stream busy...
        a2.copy_(a)                           # ...so this copy lands late
        d = g(a2, b)                          # torch's current stream here is `side`
    assert isinstance(d, torch.Tensor) and d.device == a.device and d.dtype == torch.bfloat16
    side.synchronize()
    err = float((d.double() - ref).norm() / ref.norm())
    assert err <= 1e-2, f"torch side-stream ordering: err={err:.2e}"
    out = torch.full((512, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert g(a, b, out=out) is out
    torch.cuda.synchronize()
    assert float((out.double() - ref).norm() / ref.norm()) <= 1e-2


def test_dlpack_only_producer_zero_copy():
    """A producer that speaks only DLPack (JAX-style) is read in place, and gives the same bits as CuPy inputs."""
    import cupy

    from deepgemm_jit import arrays

    class DLPackOnly:
        def __init__(self, x):
            self._x = x

        def __dlpack__(self, stream=None):
            return self._x.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return self._x.__dlpack_device__()

    m, n, k = 129, 264, 1000
    a = reference.random_matrix((m, k), "fp16")
    b = reference.random_matrix((n, k), "fp16")
    assert arrays.matrix_view(DLPackOnly(a), "a").ptr == a.data.ptr  # zero-copy
    g = dg.build(m, n, k, dtype="fp16")
    want = g(a, b)
    got = g(DLPackOnly(a), DLPackOnly(b))
    assert isinstance(got, cupy.ndarray) and bool((got.view(cupy.uint16) == want.view(cupy.uint16)).all())


class _DLPackProducerOn:
    """JAX-style DLPack producer over a CuPy array: knows the stream its data is written on (whatever CuPy's current
    stream is) and orders it before the stream the consumer names."""

    def __init__(self, x, stream):
        self._x, self._stream = x, stream

    def __dlpack__(self, stream=None):
        import cupy

        if stream is not None and stream != self._stream.ptr:
            cupy.cuda.ExternalStream(stream).wait_event(self._stream.record())
        with self._stream:
            return self._x.__dlpack__(stream=self._stream.ptr)

    def __dlpack_device__(self):
        return self._x.__dlpack_device__()


class _JaxLikeProducerOn(_DLPackProducerOn):
    """As a JAX float array: also exports CUDA array interface v2 (read-only, no stream), handed out while the
    producer's write may still be pending; only its DLPack export orders that write."""

    @property
    def __cuda_array_interface__(self):
        return {"shape": self._x.shape, "typestr": self._x.dtype.str, "data": (self._x.data.ptr, True), "version": 2}


@pytest.mark.parametrize("producer", [_DLPackProducerOn, _JaxLikeProducerOn], ids=["dlpack", "cai_v2_and_dlpack"])
def test_dlpack_producer_ordered_before_an_explicit_stream(producer):
    """A DLPack producer orders its pending work before the stream the consumer names, and cupy.from_dlpack names
    CuPy's current stream. With stream= the call runs with the kernel's stream current, so a write still pending on
    the producer's stream (here `side`, also CuPy's current stream at the call) lands before the kernel reads it.
    A producer that also exports CUDA array interface v2 (no stream: JAX) must be imported through DLPack too."""
    import cupy

    from streams import nan_target, spin

    m, n, k = 129, 264, 1000
    a = reference.random_matrix((m, k), "fp16")
    b = reference.random_matrix((n, k), "fp16")
    g = dg.build(m, n, k, dtype="fp16", weight_streaming=False)
    ref = reference.reference(g.spec, a, b)
    g(a, b)  # compile and load first: the spin must outlast only the call
    side, kernel_stream = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    a_late = nan_target(a)
    spin(side, 0.3)
    with side:
        a_late[...] = a  # the producer's pending write
        # (no out=: it would mix libraries)
        out = g(producer(a_late, side), producer(b, side), stream=kernel_stream)
    kernel_stream.synchronize()
    err = reference.relative_error(out, ref)
    assert err <= 1e-2, f"the kernel read the DLPack operand before its producer's write: {err=}"
    side.synchronize()


class _Producer:
    """A CUDA-array-interface producer (Numba-style) over a CuPy array, naming `stream` as the stream its data is
    written on (None: ready)."""

    def __init__(self, x, stream):
        self._x, self._stream = x, stream
        self.shape, self.dtype = x.shape, x.dtype

    @property
    def __cuda_array_interface__(self):
        return {"shape": self._x.shape, "typestr": self._x.dtype.str, "data": (self._x.data.ptr, False),
                "strides": self._x.strides, "version": 3, "stream": self._stream}


def _fp16_problem(seed: int):
    """(a, b, Gemm) of a 256x264x512 fp16 problem (fp16: bf16 has no CUDA-array-interface typestr)."""
    import cupy

    m, n, k = 256, 264, 512
    rng = cupy.random.default_rng(seed)
    a = reference.random_matrix((m, k), "fp16", rng)
    b = reference.random_matrix((n, k), "fp16", rng)
    return a, b, dg.build(m, n, k, dtype="fp16", weight_streaming=False)


def test_cuda_array_interface_stream_is_synchronised():
    """A producer whose A is still being written on its own (non-blocking) stream when the call is made: the call
    synchronises with that stream first (CAI v3), so the product is of the written values, not of the NaN before."""
    import cupy

    from streams import spin

    want_a, b, g = _fp16_problem(21)
    side = cupy.cuda.Stream(non_blocking=True)
    a = reference.poisoned(want_a.shape, "fp16")
    cupy.cuda.Device().synchronize()
    spin(side, 0.2)
    with side:
        a[...] = want_a  # lands after the spin
    out = g(_Producer(a, side.ptr), _Producer(b, None))
    cupy.cuda.Device().synchronize()
    err = reference.error(out, reference.to_float64(want_a) @ reference.to_float64(b).T)
    assert reference.within_bound(err, "fp16"), err


def test_cuda_array_interface_stream_inside_a_capture():
    """A producer naming an idle stream of its own, called while another stream captures: the synchronisation must
    not break the capture, and the replayed graph gives the product."""
    import cupy

    a, b, g = _fp16_problem(22)
    producer_stream = cupy.cuda.Stream(non_blocking=True)
    out = reference.poisoned((a.shape[0], b.shape[0]), "fp16")
    capturing = cupy.cuda.Stream(non_blocking=True)
    wrapped = (_Producer(a, producer_stream.ptr), _Producer(b, producer_stream.ptr), _Producer(out, None))
    with capturing:
        g(*wrapped[:2], out=wrapped[2], stream=capturing)
        reference.poison(out, capturing)
        capturing.synchronize()
        capturing.begin_capture()
        g(*wrapped[:2], out=wrapped[2], stream=capturing)
        graph = capturing.end_capture()
        graph.launch(capturing)
    capturing.synchronize()
    err = reference.error(out, reference.to_float64(a) @ reference.to_float64(b).T)
    assert reference.within_bound(err, "fp16"), err
