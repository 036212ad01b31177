"""The row-sweep decode kernel (gemv_rows.py) on the GPU, through Gemm.__call__: float64 references (DESIGN.md
bounds), fresh random inputs, outputs poisoned with NaN, odd N and K (whole 16-byte words), strided and sliced
operands, the launch shapes at their limits (one warp per CTA, 1024 threads), two tokens, FP8 with every scaling
recipe (a partial last K group, both scale_a layouts, mixed E4M3 x E5M2, every output type), identical bits on
repeated runs, CUDA-graph capture and replay, torch tensors on a side stream, and that the dispatch really happens
(and not where the rule says no)."""
import pytest

from deepgemm_jit import build, gemv, gemv_rows, reference
from deepgemm_jit.spec import GemmSpec
from graphs import capture_call, replay_with_fresh_a
from problems import fp8_problem

pytestmark = pytest.mark.gpu

# K: one warp per CTA (1024), a part-filled last word column (1032: 129 words over 64 threads x 4), 1536, 2056,
# 7168 (224 threads), 16384 (512), 32768 (the longest row: 1024 threads x 4).
NK = [(1, 1024), (7, 1032), (4099, 1536), (1001, 2056), (129, 7168), (300, 16384), (33, 32768)]


@pytest.fixture
def row_launches(plan_calls):
    """The M values gemv_rows.plan was asked for (each call that ran the row-sweep kernel)."""
    return plan_calls(gemv_rows)


def _check(m, n, k, dtype, out_dtype):
    spec = GemmSpec.create(n, k, dtype=dtype, out_dtype=out_dtype)
    a, b = reference.random_operands(spec, m)
    g = build(m, n, k, dtype=dtype, out_dtype=out_dtype)
    out = reference.poisoned((m, n), out_dtype)
    g(a, b, out=out)
    err = reference.error(out, reference.reference(spec, a, b))
    assert reference.within_bound(err, dtype), f"{m=} {n=} {k=} {dtype=} {out_dtype=} err={err:.2e}"
    assert reference.num_nonfinite(out) == 0


@pytest.mark.parametrize("dtype,out_dtype", [("bf16", "bf16"), ("fp16", "fp16"), ("bf16", "fp32"), ("fp16", "fp32")])
@pytest.mark.parametrize("n,k", NK)
def test_one_token(n, k, dtype, out_dtype, row_launches):
    _check(1, n, k, dtype, out_dtype)
    assert row_launches == [1], (n, k)


@pytest.mark.parametrize("dtype,out_dtype", [("bf16", "bf16"), ("fp16", "fp32")])
@pytest.mark.parametrize("n,k", [(7, 1032), (1001, 2056), (129, 7168), (300, 16384)])
def test_two_tokens(n, k, dtype, out_dtype, row_launches):
    _check(2, n, k, dtype, out_dtype)
    assert row_launches == [2], (n, k)


# FP8 rows: 2048 bytes (the shortest the rule takes), 2064 (a last K group of 16 values), 7168, 16384 and 32768
# (M = 1 only: 1024 threads x 2 words).
FP8_NK = [(7, 2048), (1001, 2064), (129, 7168), (300, 16384)]


@pytest.mark.parametrize("scaling", ["tensor", "row", "block"])
@pytest.mark.parametrize("n,k", FP8_NK + [(33, 32768)])
@pytest.mark.parametrize("m", [1, 2])
def test_fp8_recipes(m, n, k, scaling, row_launches, monkeypatch):
    """M = 2 is the kernel's two-token FP8 form, which the rule does not pick (gemv_rows.FP8_MAX_M): raised here;
    block scaling past FP8_BLOCK_MAX_K is the rule's too (the kernel takes it: raised)."""
    if m == 2 and k == 32768:
        pytest.skip("rows of 2048 words take one token (gemv_rows.max_row_words)")
    monkeypatch.setattr(gemv_rows, "FP8_MAX_M", 2)
    monkeypatch.setattr(gemv_rows, "FP8_BLOCK_MAX_K", 32768)
    qa, sa, qb, sb, ref = fp8_problem(m, n, k, scaling, seed=m * 31 + n + k)
    g = build(m, n, k, dtype="fp8", scaling=scaling)
    out = reference.poisoned((m, n), "bf16")
    g(qa, qb, scale_a=sa, scale_b=sb, out=out)
    assert row_launches == [m], (m, n, k)
    err = reference.error(out, ref)
    assert err < 5e-3 and reference.num_nonfinite(out) == 0, (m, n, k, scaling, err)


@pytest.mark.parametrize("out_dtype", ["fp32", "fp16", "bf16"])
def test_fp8_mixed_types_outputs_and_scale_layouts(out_dtype, row_launches):
    """E4M3 activations x E5M2 weights, block scales with scale_a row-major and M-major (NaN in its padding rows:
    a kernel reading them shows it)."""
    import cupy

    m, n, k = 1, 392, 4000
    qa, sa, qb, sb, ref = fp8_problem(m, n, k, "block", seed=3, b_dtype="fp8_e5m2")
    g = build(m, n, k, dtype="fp8", b_dtype="fp8_e5m2", scaling="block", out_dtype=out_dtype)
    for sa_in in (cupy.ascontiguousarray(sa), reference.m_major_scales(sa)):
        out = reference.poisoned((m, n), out_dtype)
        g(qa, qb, scale_a=sa_in, scale_b=sb, out=out)
        err = reference.error(out, ref)
        assert err < (5e-4 if out_dtype == "fp32" else 5e-3), (out_dtype, err)
    assert row_launches == [m, m]


def test_strided_operands_and_output(row_launches):
    """A weight and an activation sliced from wider (16-byte aligned) storage, and an output row inside a wider
    poisoned buffer: results right, nothing written past N or to other rows."""
    m, n, k = 1, 515, 2048
    spec = GemmSpec.create(n, k, dtype="bf16")
    a_store = reference.random_matrix((3, 2056), "bf16")
    b_store = reference.random_matrix((n, 2080), "bf16")
    a, b = a_store[1:2, :k], b_store[:, :k]
    d_store = reference.poisoned((3, 600), "bf16")
    build(m, n, k, dtype="bf16")(a, b, out=d_store[1:2, :n])
    assert row_launches == [1]
    err = reference.error(d_store[1:2, :n], reference.reference(spec, a, b))
    assert reference.within_bound(err, "bf16"), err
    assert reference.num_nonfinite(d_store) == 3 * 600 - n


def test_where_the_rule_says_no(row_launches):
    """K = 512 (rows under 2 KB), K = 1028 (rows not whole 16-byte words, padded storage), M = 3, two tokens on a
    row longer than 512 threads x 4 words, and weight_streaming=False: other kernels run, and right."""
    for m, n, k, kwargs in [(1, 300, 512, {}), (3, 300, 2048, {}), (2, 64, 16392, {}),
                            (1, 300, 2048, {"weight_streaming": False})]:
        spec = GemmSpec.create(n, k, dtype="bf16")
        a, b = reference.random_operands(spec, m)
        out = build(m, n, k, dtype="bf16", **kwargs)(a, b)
        assert reference.within_bound(reference.error(out, reference.reference(spec, a, b)), "bf16"), (m, k)
    spec = GemmSpec.create(64, 1028, dtype="bf16")
    a = reference.random_matrix((1, 1032), "bf16")[:, :1028]
    b = reference.random_matrix((64, 1032), "bf16")[:, :1028]
    out = build(1, 64, 1028, dtype="bf16")(a, b)
    assert reference.within_bound(reference.error(out, reference.reference(spec, a, b)), "bf16")
    assert row_launches == []


def test_deterministic_bits(row_launches):
    import cupy

    m, n, k = 1, 7168, 16384
    spec = GemmSpec.create(n, k, dtype="bf16")
    a, b = reference.random_operands(spec, m)
    g = build(m, n, k, dtype="bf16")
    first = g(a, b)
    for _ in range(3):
        assert bool((g(a, b).view(cupy.uint16) == first.view(cupy.uint16)).all())
    assert reference.within_bound(reference.error(first, reference.reference(spec, a, b)), "bf16")
    qa, sa, qb, sb, ref = fp8_problem(1, n, k, "block", seed=11)
    g8 = build(1, n, k, dtype="fp8", scaling="block")
    first = g8(qa, qb, scale_a=sa, scale_b=sb)
    for _ in range(3):
        again = g8(qa, qb, scale_a=sa, scale_b=sb)
        assert bool((again.view(cupy.uint16) == first.view(cupy.uint16)).all())
    assert reference.error(first, ref) < 5e-3
    assert row_launches == [1] * 8


def test_cuda_graph_capture_and_replay(row_launches):
    m, n, k = 1, 4096, 7168
    spec = GemmSpec.create(n, k, dtype="bf16")
    a, b = reference.random_operands(spec, m)
    g = build(m, n, k, dtype="bf16")
    out = reference.poisoned((m, n), "bf16")
    graph, stream = capture_call(g, a, b, out)
    replay_with_fresh_a(graph, stream, spec, a, b, out, times=2)
    assert row_launches and set(row_launches) == {1}


def test_torch_tensors_and_streams(row_launches):
    torch = pytest.importorskip("torch")
    import cupy

    from streams import nan_target, spin

    n, k = 2112, 7168
    a = torch.randn(1, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16)
    g = build(1, n, k, dtype="fp16")
    g(a, b)  # compile, load and plan first: the spin below must outlast only the call itself
    a2 = nan_target(a)
    side = torch.cuda.Stream()
    spin(cupy.cuda.ExternalStream(side.cuda_stream), 0.3)  # a2 lands late on side: a kernel on another stream
    with torch.cuda.stream(side):                          # than torch's current one would read NaN
        a2.copy_(a)
        d = g(a2, b)
    side.synchronize()
    assert isinstance(d, torch.Tensor) and d.dtype == torch.float16 and d.shape == (1, n)
    ref = a.double() @ b.double().T
    assert float((d.double() - ref).norm() / ref.norm()) < reference.ERROR_BOUND["fp16"]
    assert row_launches == [1, 1]  # the warm-up call and the one on `side`
    assert gemv.kernel_for(GemmSpec.create(n, k, dtype="fp16"), 1).tag == "gemv_rows_fp16_fp16_m1_224x4"
