"""The weight-streaming kernel for weights stored (K, N) (layouts nn / tn) on the GPU, through Gemm.__call__:
float64 references (DESIGN.md bounds), fresh random inputs, outputs poisoned with NaN, odd K and N, every cluster
size, sliced and padded operands, identical bits on repeated runs, CUDA-graph capture and replay, and that the
dispatch really happens (and stops at M = 9, for unaligned rows and when turned off)."""
import pytest

from deepgemm_jit import build, gemv_kn, reference
from deepgemm_jit.spec import GemmSpec
from graphs import capture_call, replay_with_fresh_a

pytestmark = pytest.mark.gpu

# N: whole 16-byte chunks (8 16-bit / 4 FP32 columns); K odd, short (one step), long (every cluster size).
NK_16 = [(8, 1), (264, 1001), (4096, 4096), (1280, 8192), (7168, 520), (136, 40)]
NK_TF32 = [(4, 3), (132, 1001), (4096, 4096), (1280, 8192), (7168, 520), (68, 40)]


@pytest.fixture
def sixteen_bit(monkeypatch):
    """The dispatch streams TF32 only (gemv_kn.STREAM_DTYPES); these tests check the kernel's 16-bit types too."""
    monkeypatch.setattr(gemv_kn, "STREAM_DTYPES", gemv_kn.WEIGHT_DTYPES)


@pytest.fixture
def launches(monkeypatch):
    """(M, cluster) of each call that gemv_kn.plan served."""
    seen = []
    original = gemv_kn.plan

    def recording(spec, arch, m, *args, **kwargs):
        plan = original(spec, arch, m, *args, **kwargs)
        seen.append((m, plan.grid[1]))
        return plan

    monkeypatch.setattr(gemv_kn, "plan", recording)
    return seen


def _check(spec, m, g, a, b, out_dtype, case):
    out = reference.poisoned((m, spec.n), out_dtype)
    g(a, b, out=out)
    err = reference.error(out, reference.reference(spec, a, b))
    assert reference.within_bound(err, spec.dtype), f"{case} err={err:.2e}"
    assert reference.num_nonfinite(out) == 0, case
    return err


@pytest.mark.parametrize("layout", ["nn", "tn"])
@pytest.mark.parametrize("dtype,out_dtype", [("bf16", "bf16"), ("fp16", "fp16"), ("bf16", "fp32"), ("tf32", "fp32")])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_layouts_dtypes_shapes(m, dtype, out_dtype, layout, launches, sixteen_bit):
    for n, k in NK_TF32 if dtype == "tf32" else NK_16:
        spec = GemmSpec.create(n, k, dtype=dtype, out_dtype=out_dtype, layout=layout)
        a, b = reference.random_operands(spec, m)
        g = build(m, n, k, dtype=dtype, out_dtype=out_dtype, layout=layout)
        launches.clear()
        _check(spec, m, g, a, b, out_dtype, f"{m=} {n=} {k=} {dtype=} {out_dtype=} {layout=}")
        assert [x[0] for x in launches] == [m], (m, n, k, dtype, layout, "dispatch")


@pytest.mark.parametrize("cluster", gemv_kn.CLUSTERS)
@pytest.mark.parametrize("dtype", ["bf16", "tf32"])
def test_every_cluster_size(cluster, dtype, launches, monkeypatch, sixteen_bit):
    """Each cluster size on a K that gives every warp of every rank steps, and on a K that leaves ranks empty."""
    monkeypatch.setattr(gemv_kn, "choose_cluster", lambda *args: cluster)
    for n, k in ((520, 4104), (136, 24)):
        spec = GemmSpec.create(n, k, dtype=dtype, layout="nn")
        for m in (1, 8):
            a, b = reference.random_operands(spec, m)
            launches.clear()
            _check(spec, m, build(m, n, k, dtype=dtype, layout="nn"), a, b, spec.out_dtype, f"{cluster=} {n=} {k=}")
            assert launches == [(m, cluster)], (cluster, n, k, m)


def test_sliced_operands_and_padded_output(launches, sixteen_bit):
    """A sliced weight (row stride > N), a sliced A (row stride > K), a padded output row stride: nothing written
    past N."""
    m, n, k = 5, 264, 1001
    spec = GemmSpec.create(n, k, dtype="bf16", layout="nn")
    a = reference.random_matrix((m, 1010), "bf16")[:, :k]
    b = reference.random_matrix((k, 272), "bf16")[:, :n]
    d_store = reference.poisoned((m, 300), "bf16")
    build(m, n, k, dtype="bf16", layout="nn")(a, b, out=d_store[:, :n])
    assert [x[0] for x in launches] == [m]
    err = reference.error(d_store[:, :n], reference.reference(spec, a, b))
    assert reference.within_bound(err, "bf16"), err
    assert reference.num_nonfinite(d_store) == m * (300 - n)


def test_dispatch_limits(launches):
    """M = 9, weight_streaming=False and 16-bit types run the Gemm's own kernel; a weight whose rows are not
    16-byte aligned (sliced at an odd column) too; all correct."""
    n, k = 132, 1001
    spec = GemmSpec.create(n, k, dtype="tf32", layout="nn")
    g = build(8, n, k, dtype="tf32", layout="nn")
    for m in (8, 9):
        a, b = reference.random_operands(spec, m)
        _check(spec, m, g, a, b, "fp32", f"{m=}")
    assert [x[0] for x in launches] == [8]
    a, b = reference.random_operands(spec, 1)
    _check(spec, 1, build(1, n, k, dtype="tf32", layout="nn", weight_streaming=False), a, b, "fp32", "off")
    b_odd = reference.random_matrix((k, n + 1), "tf32")[:, 1:]  # base 4 bytes past a 16-byte boundary
    _check(spec, 1, g, a, b_odd, "fp32", "unaligned b")
    spec16 = GemmSpec.create(264, k, dtype="bf16", layout="nn")
    a, b = reference.random_operands(spec16, 1)
    _check(spec16, 1, build(1, 264, k, dtype="bf16", layout="nn"), a, b, "bf16", "bf16")
    assert [x[0] for x in launches] == [8]


def test_deterministic_bits_and_graph_replay(launches):
    import cupy

    m, n, k = 8, 4096, 7168
    spec = GemmSpec.create(n, k, dtype="tf32", layout="nn")
    a, b = reference.random_operands(spec, m)
    g = build(m, n, k, dtype="tf32", layout="nn")
    first = g(a, b)
    for _ in range(3):
        assert bool((g(a, b).view(cupy.uint32) == first.view(cupy.uint32)).all())
    out = reference.poisoned((m, n), "fp32")
    graph, stream = capture_call(g, a, b, out)
    replay_with_fresh_a(graph, stream, spec, a, b, out, times=2, dtype="tf32")
    assert launches and {x[0] for x in launches} == {m} and launches[0][1] > 1  # a cluster split K


def _boundary_rows(n: int, k: int, element_bytes: int, unroll: int) -> list[int]:
    """K rows a warp's last batch reads past its own steps (the next warp's first rows): the kernel splits
    ceil(K / step) steps over cluster * 8 warps as steps * part / parts; a warp whose share is no multiple of
    `unroll` runs its last batch on into the next share, with zeroed weights."""
    from deepgemm_jit import device

    step = gemv_kn.STEP_K[element_bytes]
    steps = -(-k // step)
    parts = gemv_kn.choose_cluster(n, k, element_bytes, device.num_sms()) * gemv_kn.NUM_WARPS
    rows = []
    for p in range(parts - 1):
        begin, end = steps * p // parts, steps * (p + 1) // parts
        if (end - begin) % unroll and end * step < k:
            rows.append(end * step)
    return rows


@pytest.mark.parametrize("dtype,n,k,unroll", [("tf32", 4096, 5000, 4), ("tf32", 4096, 3000, 4),
                                              ("bf16", 4096, 5000, 2)])
def test_an_infinite_activation_gives_inf_not_nan(dtype, n, k, unroll, launches, sixteen_bit):
    """One +inf in token 0's activations at a row that the previous warp's last batch also reads (with zeroed
    weights): D's row 0 must be +-inf by the weight's sign, as a float64 product gives, and not NaN (0 * inf);
    token 1 stays finite and within the bound. The rows probed are those of every such warp boundary."""
    import cupy

    spec = GemmSpec.create(n, k, dtype=dtype, out_dtype="fp32", layout="nn")
    g = build(2, n, k, dtype=dtype, out_dtype="fp32", layout="nn")
    rows = _boundary_rows(n, k, 2 if dtype == "bf16" else 4, unroll)
    assert rows, "no warp share of this shape runs past its end: the test would show nothing"
    for row in rows:
        a, b = reference.random_operands(spec, 2, rng=cupy.random.default_rng(row))
        a[0, row] = float("inf")
        out = reference.poisoned((2, n), "fp32")
        g(a, b, out=out)  # a later call may replay the first's plan (its out can reuse the same block)
        ref = reference.reference(spec, a, b)
        case = f"{dtype} {n}x{k} inf at K row {row}"
        assert not bool(cupy.isnan(out[0]).any()), f"{case}: {int(cupy.isnan(out[0]).sum())} NaN in row 0"
        assert bool((out[0] == ref[0]).all()), case  # +-inf everywhere (no weight rounds to 0)
        assert reference.within_bound(reference.error(out[1:], ref[1:]), dtype), case
    assert launches and all(x[0] == 2 for x in launches), "dispatch"
