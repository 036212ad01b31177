"""FP32-accurate GEMMs (3xTF32, deepgemm_jit/fp32x3.py) on the GPU.

- The split kernel, bit for bit, against the model the CPU tests prove exact (``fp32x3.split_operands_reference``):
  every layout, odd sizes, padded rows and misaligned bases, special values.
- ``build_fp32`` products against the float64 product of the float32 inputs: ||D - D64||_F / ||D64||_F within
  ``reference.ERROR_BOUND["fp32"]`` (1e-5), fresh N(0, 1) inputs for every check (never zeros), outputs poisoned
  with NaN first (an unwritten element fails), awkward M, N, K (1, 7, 33, 129, 1000, 4096), every layout, views,
  torch tensors and streams, epilogues, aliasing errors.

Skipped cleanly without a GPU (marker `gpu`); torch tests also without torch.
"""
import itertools
import math

import numpy as np
import pytest

import deepgemm_jit as dg
from deepgemm_jit import fp32x3, reference
from streams import nan_target, spin

cupy = pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu

LAYOUTS = ("nt", "nn", "tn", "tt")
SIZES = (1, 7, 129, 1000, 4096)
BOUND = reference.ERROR_BOUND["fp32"]
assert BOUND == 1e-5


# -- helpers ------------------------------------------------------------------------------------------------------

def stored(shape, rng, pad=0, off=0):
    """Fresh N(0, 1) float32 values of `shape`, as a view with `pad` extra elements per row and the base `off`
    elements into its buffer (off = 1: every row start 4 bytes past 16-byte alignment)."""
    rows, cols = shape
    buf = rng.standard_normal((rows, cols + pad + off), dtype=cupy.float32)
    return buf[:, off:off + cols]


def operands(spec, m, rng, pad=0, off=0):
    return stored(spec.a_shape(m), rng, pad, off), stored(spec.b_shape(), rng, pad, off)


def case_name(g, m, **extra):
    spec = g.spec
    words = " ".join(f"{k}={v}" for k, v in extra.items())
    return f"m={m} n={spec.n} k={spec.k} layout={spec.layout} out={spec.out_dtype} cfg={g.config.tag} {words}"


def check(g, m, a=None, b=None, out=None, rng=None, **call_kwargs):
    """One call into a NaN-poisoned output, judged against the float64 product; returns the error. Inputs drawn
    here are seeded by the shape: a 1 x 1 output is one dot product, whose relative error is ill-conditioned when
    its terms cancel (an unseeded draw of m = n = 1, k = 129 once summed to -0.006 from terms of ~1 and read 1.7e-4,
    session 16); seeded, every run judges the same, checked draws."""
    spec = g.spec
    if a is None:
        a, b = operands(spec, m, rng or cupy.random.default_rng(m * 1_000_003 + spec.n * 1_009 + spec.k))
    if out is None:
        out = reference.poisoned(spec.out_shape(m), spec.out_dtype)
    assert g(a, b, out=out, **call_kwargs) is out
    cupy.cuda.get_current_stream().synchronize()
    err = judged_error(out, reference.reference(spec, a, b), a, b)
    assert reference.within_bound(err, "fp32"), f"{case_name(g, m)} err={err:.2e} bound={BOUND} " \
                                                f"nonfinite={reference.num_nonfinite(out)}"
    return err


def judged_error(out, ref, a, b) -> float:
    """||out - ref||_F over the larger of ||ref||_F and the size independent inputs of a's and b's magnitudes give
    it, sqrt(M N K) rms(a) rms(b). The two agree for outputs of many elements; for a few dot products the first
    alone is ill-conditioned where the terms cancel: the 1 x 1 x 4096 draw of test_sweep_nt sums to 3.08 from terms
    of total magnitude 2630 (condition 854, against ~41 typical) and read 1.9e-5 / 1.45e-5 (raw_b / split kernel)
    at FP32-level rounding, 2e-8 x its condition (scripts/exp_fp32_one_dot.py, session 25)."""
    if reference.num_nonfinite(out):
        return math.nan
    m, n = ref.shape
    k = a.size // m
    rms = lambda x: float(cupy.sqrt(cupy.mean(cupy.square(x.astype(cupy.float64)))))  # noqa: E731
    typical = math.sqrt(m * n * k) * rms(a) * rms(b)
    diff = float(cupy.linalg.norm(reference.to_float64(out) - ref))
    return diff / max(float(cupy.linalg.norm(ref)), typical)


def assert_same_bits(got, want, what, tiny_ok=False):
    """Bit-for-bit equality; tiny_ok=True lets values of magnitude <= FLT_MIN (zeros of either sign, subnormals,
    FLT_MIN) match each other: the lo part of a subnormal input is such a value either way."""
    got_bits, want_bits = got.view(cupy.uint32), want.view(cupy.uint32)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    mismatch = got_bits != want_bits
    if tiny_ok:
        flt_min = cupy.uint32(0x00800000)
        mismatch &= ~(((got_bits & cupy.uint32(0x7FFFFFFF)) <= flt_min) & ((want_bits & cupy.uint32(0x7FFFFFFF)) <= flt_min))
    differ = cupy.argwhere(mismatch)
    if differ.shape[0]:
        r, c = (int(v) for v in differ[0])
        raise AssertionError(f"{what}: {differ.shape[0]} elements differ from the model; first ({r}, {c}): "
                             f"0x{int(got_bits[r, c]):08x} != 0x{int(want_bits[r, c]):08x}")


# -- the split kernel against the model, bit for bit ---------------------------------------------------------------

SPLIT_SHAPES = [(1, 1, 1), (7, 129, 33), (129, 7, 1000), (33, 64, 128), (1000, 129, 129), (64, 4096, 4096)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k", SPLIT_SHAPES)
@pytest.mark.parametrize("pad,off", [(0, 0), (3, 1), (8, 2)])
def test_split_matches_the_model(layout, m, n, k, pad, off):
    """A2 and B2 as the kernel writes them equal the NumPy/CuPy model: [hi | lo] each, zero padding
    included; padded rows and misaligned bases take the scalar-load path of the same kernel."""
    g = dg.build_fp32(m, n, k, layout=layout)
    a, b = operands(g.spec, m, cupy.random.default_rng(m + n + k + pad), pad, off)
    a2, b2 = g.split(a, b)
    want_a2, want_b2 = fp32x3.split_operands_reference(g.spec, a, b)
    cupy.cuda.get_current_stream().synchronize()
    assert a2.flags.c_contiguous and b2.flags.c_contiguous and a2.dtype == b2.dtype == np.float32
    assert a2.data.ptr % 16 == 0 and b2.data.ptr % 16 == 0
    assert_same_bits(a2, want_a2, f"A2 {layout=} {m=} {n=} {k=} {pad=} {off=}")
    assert_same_bits(b2, want_b2, f"B2 {layout=} {m=} {n=} {k=} {pad=} {off=}")


def special_values():
    flt_max = np.finfo(np.float32).max
    values = np.array([np.inf, -np.inf, np.nan, flt_max, -flt_max, 0.0, -0.0, 1e-40, -3e-39, 1e-45, 1 + 2.0**-11,
                       -(1 + 2.0**-11), 1.1754942e-38, 3.4e38], np.float32)
    raw = np.array([0x7F800001, 0xFF801000, 0x7FC00000, 0x7F7FF000, 0x00001000, 0x80003000], np.uint32)
    return np.concatenate([values, raw.view(np.float32)])


@pytest.mark.parametrize("layout", ("nt", "tn"))
def test_split_special_values(layout):
    """inf, NaN (payloads in the dropped bits included), FLT_MAX and values rna would round to inf, subnormals,
    signed zeros, exact ties: the device split equals the model bit for bit."""
    special = special_values()
    m, n, k = 5, 3, 70
    g = dg.build_fp32(m, n, k, layout=layout)
    rng = cupy.random.default_rng(11)
    a_mk = rng.standard_normal((m, k), dtype=cupy.float32)
    b_nk = rng.standard_normal((n, k), dtype=cupy.float32)
    a_mk[1, :special.size] = cupy.asarray(special)
    b_nk[2, -special.size:] = cupy.asarray(special[::-1])
    a = a_mk if g.spec.a_k_major else cupy.ascontiguousarray(a_mk.T)
    b = b_nk if g.spec.b_k_major else cupy.ascontiguousarray(b_nk.T)
    a2, b2 = g.split(a, b)
    want_a2, want_b2 = fp32x3.split_operands_reference(g.spec, a, b)
    cupy.cuda.get_current_stream().synchronize()
    # For subnormal inputs the H200 gave lo = -0 where the model has +0 or -FLT_MIN (session 5: the device's FP32
    # subtraction or rounding flushes subnormals); values below FLT_MIN contribute nothing at FP32 accuracy.
    assert_same_bits(a2, want_a2, f"A2 with special values ({layout})", tiny_ok=True)
    assert_same_bits(b2, want_b2, f"B2 with special values ({layout})", tiny_ok=True)


# -- products against float64 ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("m,n,k", list(itertools.product(SIZES, SIZES, SIZES)))
def test_sweep_nt(m, n, k):
    check(dg.build_fp32(m, n, k), m)


AWKWARD = [(1, 1, 1), (7, 7, 33), (129, 1, 33), (1, 4096, 33), (1000, 129, 1), (7, 1000, 4096), (4096, 7, 129),
           (129, 1001, 1003), (1000, 4096, 1000), (4096, 4096, 4096), (333, 2112, 7168)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k", AWKWARD)
def test_sweep_layouts(layout, m, n, k):
    check(dg.build_fp32(m, n, k, layout=layout), m)


def test_one_build_serves_every_m():
    g = dg.build_fp32(4096, 264, 1000)
    for m in (1, 2, 63, 64, 65, 129, 777, 5001):
        check(g, m)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_padded_offset_operands_and_output_views(layout):
    """Row strides wider than the rows, bases off 16-byte alignment, out a view of a wider poisoned buffer whose
    other columns are never written."""
    m, n, k = 129, 136, 200
    g = dg.build_fp32(m, n, k, layout=layout)
    rng = cupy.random.default_rng(5)
    for pad, off in ((8, 0), (3, 0), (8, 1), (0, 1), (5, 3)):
        a, b = operands(g.spec, m, rng, pad, off)
        out_big = reference.poisoned((m, n + 5), "fp32")
        out = out_big[:, 2:2 + n]
        check(g, m, a=a, b=b, out=out)
        assert not bool(cupy.isfinite(out_big[:, :2]).any()) and not bool(cupy.isfinite(out_big[:, 2 + n:]).any())


def test_layouts_and_views_compute_the_same_product():
    """The same logical A and B stored in every layout, packed or as padded views: the split operands are the same
    bits (test_split_matches_the_model), so the products agree to rounding (bit for bit unless the TF32 GEMM's own
    reduction order changes between calls)."""
    m, n, k = 129, 1000, 1000
    rng = cupy.random.default_rng(9)
    a_mk = rng.standard_normal((m, k), dtype=cupy.float32)
    b_nk = rng.standard_normal((n, k), dtype=cupy.float32)
    ref = reference.to_float64(a_mk) @ reference.to_float64(b_nk).T
    results = {}
    for layout in LAYOUTS:
        g = dg.build_fp32(m, n, k, layout=layout)
        a = a_mk if g.spec.a_k_major else cupy.ascontiguousarray(a_mk.T)
        b = b_nk if g.spec.b_k_major else cupy.ascontiguousarray(b_nk.T)
        a_view = cupy.full((a.shape[0], a.shape[1] + 7), cupy.nan, dtype=cupy.float32)[:, 3:3 + a.shape[1]]
        a_view[...] = a
        for name, a_in in (("packed", a), ("view", a_view)):
            out = reference.poisoned((m, n), "fp32")
            g(a_in, b, out=out)
            cupy.cuda.get_current_stream().synchronize()
            err = reference.relative_error(out, ref)
            assert err <= BOUND, f"{layout} {name}: err={err:.2e}"
            results[(layout, name)] = out
    first = results[("nt", "packed")]
    for key, out in results.items():
        diff = float(cupy.linalg.norm(out.astype(cupy.float64) - first) / cupy.linalg.norm(first.astype(cupy.float64)))
        assert diff <= 1e-6, f"{key} differs from nt packed by {diff:.2e}"


def test_three_terms_beat_one():
    """Same inputs through the plain TF32 GEMM: ~1e-4 error; through build_fp32: FP32 level, 20x smaller at least."""
    m, n, k = 1000, 1000, 4096
    rng = cupy.random.default_rng(3)
    a, b = stored((m, k), rng), stored((n, k), rng)
    g32 = dg.build_fp32(m, n, k)
    err32 = check(g32, m, a=a, b=b)
    g_tf32 = dg.build(m, n, k, dtype="tf32")
    out = reference.poisoned((m, n), "fp32")
    g_tf32(a, b, out=out)
    err_tf32 = reference.relative_error(out, reference.reference(g32.spec, a, b))
    assert err32 * 20 < err_tf32, f"fp32x3 err {err32:.2e} vs tf32 err {err_tf32:.2e}"


def test_new_output_m_zero_and_repeat_calls():
    g = dg.build_fp32(65, 72, 80)
    rng = cupy.random.default_rng(4)
    a, b = operands(g.spec, 65, rng)
    d = g(a, b)
    assert isinstance(d, cupy.ndarray) and d.shape == (65, 72) and d.dtype == np.float32
    assert reference.relative_error(d, reference.reference(g.spec, a, b)) <= BOUND
    empty = g(cupy.empty((0, 80), dtype=cupy.float32), b)
    assert empty.shape == (0, 72)
    # The same buffers with new values (the TF32 Gemm may replay a launch plan on recycled workspaces).
    out = reference.poisoned((65, 72), "fp32")
    check(g, 65, a=a, b=b, out=out)
    a[...] = rng.standard_normal(a.shape, dtype=cupy.float32)
    out[...] = cupy.nan
    check(g, 65, a=a, b=b, out=out)


def test_out_aliasing_is_refused_before_anything_runs():
    m = n = k = 64
    g = dg.build_fp32(m, n, k)
    rng = cupy.random.default_rng(6)
    a, b = stored((m, k), rng), stored((n, k), rng)
    a_before, b_before = a.copy(), b.copy()
    with pytest.raises(ValueError, match="out overlaps a or b"):
        g(a, b, out=a)
    with pytest.raises(ValueError, match="out overlaps a or b"):
        g(a, b, out=b)
    big = rng.standard_normal((m + 1, k), dtype=cupy.float32)
    with pytest.raises(ValueError, match="out overlaps a or b"):
        g(big[:m], b, out=big[1:])                      # partial overlap
    with pytest.raises(TypeError, match="out has dtype float16"):
        g(a, b, out=cupy.empty((m, n), dtype=cupy.float16))
    with pytest.raises(TypeError, match="a has dtype float64"):
        g(a.astype(cupy.float64), b)
    cupy.cuda.get_current_stream().synchronize()
    assert bool((a == a_before).all()) and bool((b == b_before).all())


def test_stream_ordering_cupy():
    """Inputs written late on a side stream: a call on that stream (current, explicit object, raw handle) sees them;
    two calls in flight on two streams at once keep their workspaces apart."""
    m, n, k = 512, 520, 1000
    g = dg.build_fp32(m, n, k)
    rng = cupy.random.default_rng(8)
    a, b = stored((m, k), rng), stored((n, k), rng)
    ref = reference.reference(g.spec, a, b)
    side = cupy.cuda.Stream(non_blocking=True)
    for how in ("current", "object", "handle"):
        a2 = cupy.full((m, k), cupy.nan, dtype=cupy.float32)
        out = reference.poisoned((m, n), "fp32")
        cupy.cuda.Device().synchronize()
        spin(side, 0.01)
        with side:
            a2[...] = a                                   # lands after the spin
        if how == "current":
            with side:
                g(a2, b, out=out)
        else:
            g(a2, b, out=out, stream=side if how == "object" else side.ptr)
        side.synchronize()
        err = reference.relative_error(out, ref)
        assert err <= BOUND, f"stream ordering ({how}): err={err:.2e}"
    # Two streams at once, different operands: each result is its own product. Both streams wait on one gate (a spin
    # on a third stream), so their queued calls start together; with a spin on s1 alone, s2's call had finished
    # before s1's began, and workspaces shared between them gave right results (review).
    s1, s2, gate = (cupy.cuda.Stream(non_blocking=True) for _ in range(3))
    a_other = stored((m, k), rng)
    ref_other = reference.reference(g.spec, a_other, b)
    outs = [[reference.poisoned((m, n), "fp32") for _ in range(8)] for _ in range(2)]
    # A first call on a stream sizes that stream's split-K workspace (the TF32 Gemm splits K at M = 512) and
    # synchronises the stream: made behind the gate, it would wait the spin out on the host and open the gate
    # before the other calls were queued. One call per stream first, so that the gated calls allocate nothing.
    for s in (s1, s2):
        g(a, b, out=reference.poisoned((m, n), "fp32"), stream=s)
    cupy.cuda.Device().synchronize()
    from deepgemm_jit.stream_buffers import stream_key
    owners = {owner for _, owner, _ in g.gemm._split_workspace.held()}
    assert {stream_key(s1.ptr), stream_key(s2.ptr)} <= owners  # a workspace per stream: what the calls keep apart
    spin(gate, 0.05)
    opened = gate.record()
    s1.wait_event(opened)
    s2.wait_event(opened)
    for out1, out2 in zip(*outs):
        g(a, b, out=out1, stream=s1)
        g(a_other, b, out=out2, stream=s2)
    cupy.cuda.Device().synchronize()
    assert all(reference.relative_error(out, ref) <= BOUND for out in outs[0])
    assert all(reference.relative_error(out, ref_other) <= BOUND for out in outs[1])


def test_torch_tensors_current_stream_and_out():
    torch = pytest.importorskip("torch")
    m, n, k = 512, 264, 1000
    g = dg.build_fp32(m, n, k)
    a = torch.randn(m, k, device="cuda", dtype=torch.float32)
    b = torch.randn(n, k, device="cuda", dtype=torch.float32)
    ref = a.double() @ b.double().T
    a2 = nan_target(a)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)        # keep the side stream busy...
        a2.copy_(a)                           # ...so this copy lands late
        d = g(a2, b)                          # torch's current stream here is `side`
    assert isinstance(d, torch.Tensor) and d.device == a.device and d.dtype == torch.float32 and d.shape == (m, n)
    side.synchronize()
    err = float((d.double() - ref).norm() / ref.norm())
    assert err <= BOUND, f"torch side-stream ordering: err={err:.2e}"
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    assert g(a, b, out=out) is out
    torch.cuda.synchronize()
    assert float((out.double() - ref).norm() / ref.norm()) <= BOUND
    # An explicit torch stream, and a transposed layout from a torch (K, M) tensor.
    out.fill_(float("nan"))
    a_km = nan_target(a.t().contiguous())     # (K, M); nan_target synchronises: the fill is done too
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)
        a_km.copy_(a.t())                     # late on `side`
    gt = dg.build_fp32(m, n, k, layout="tt")  # a (K, M), b (N, K)
    assert gt(a_km, b, out=out, stream=side) is out
    side.synchronize()
    assert float((out.double() - ref).norm() / ref.norm()) <= BOUND
    with pytest.raises(ValueError, match="out overlaps a or b"):
        g(a, b, out=a[:, :n])
    with pytest.raises(TypeError, match="same array library"):
        g(a, cupy.asarray(b))


@pytest.mark.parametrize("k", [300, 320])
def test_other_array_producers(k):
    """Operands (and out) that only speak __cuda_array_interface__: the workspaces are presented the same way. K = 320
    (a multiple of 32) at M = 129: a raw-B GEMM, whose B goes to the TF32 Gemm as it is (as a CuPy view when out is
    allocated here)."""
    class Interface:
        def __init__(self, x):
            self._x = x
            self.shape, self.dtype = x.shape, x.dtype

        @property
        def __cuda_array_interface__(self):
            return self._x.__cuda_array_interface__

    m, n = 129, 264
    g = dg.build_fp32(m, n, k)
    assert g.raw_b == (k % 32 == 0)
    rng = cupy.random.default_rng(10)
    a, b = stored((m, k), rng), stored((n, k), rng)
    out = reference.poisoned((m, n), "fp32")
    wrapped_out = Interface(out)
    assert g(Interface(a), Interface(b), out=wrapped_out) is wrapped_out
    cupy.cuda.get_current_stream().synchronize()
    assert reference.relative_error(out, reference.reference(g.spec, a, b)) <= BOUND
    d = g(Interface(a), Interface(b))                      # a new CuPy output
    assert isinstance(d, cupy.ndarray) and reference.relative_error(d, reference.reference(g.spec, a, b)) <= BOUND


@pytest.mark.parametrize("layout", ("nt", "tn"))
@pytest.mark.parametrize("epilogue", ("bias+relu", "beta+bias_row+residual"))
def test_epilogues(layout, epilogue):
    """The TF32 GEMM's fused epilogue runs on the FP32-accurate product (any layout: the GEMM itself is nt)."""
    m, n, k = 300, 264, 777
    g = dg.build_fp32(m, n, k, layout=layout, epilogue=epilogue)
    epi = g.spec.epi
    rng = cupy.random.default_rng(12)
    a, b = operands(g.spec, m, rng)
    b *= cupy.float32(1.0 / math.sqrt(k))
    bias = rng.standard_normal((n,) if epi.bias == "col" else (m,), dtype=cupy.float32) if epi.bias != "none" else None
    c = rng.standard_normal((m, n), dtype=cupy.float32) if epi.beta else None
    residual = rng.standard_normal((m, n), dtype=cupy.float32) if epi.residual else None
    alpha, beta = (0.5, -1.25) if epi.beta else (1.0, 1.0)
    out = reference.poisoned((m, n), "fp32")
    g(a, b, bias=bias, c=c, residual=residual, alpha=alpha, beta=beta, out=out)
    ref = reference.unfused_epilogue(reference.reference(g.spec, a, b), epi, bias, c, residual, alpha, beta)
    err = reference.error(out, ref)
    assert reference.within_bound(err, "fp32"), f"{epilogue} {layout}: err={err:.2e} {g!r}"
    if epi.beta:  # C may be out itself: D = alpha * acc + beta * D
        d = rng.standard_normal((m, n), dtype=cupy.float32)
        before = d.copy()
        g(a, b, bias=bias, c=d, residual=residual, alpha=alpha, beta=beta, out=d)
        ref = reference.unfused_epilogue(reference.reference(g.spec, a, b), epi, bias, before, residual, alpha, beta)
        assert reference.within_bound(reference.error(d, ref), "fp32")


@pytest.mark.parametrize("m,n,k,layout", [(1, 7168, 2048, "nt"), (37, 1000, 4096, "nt"), (64, 2112, 7168, "nt"),
                                          (100, 264, 96, "tt"), (128, 7168, 1024, "nt"), (128, 520, 32, "nt")])
def test_raw_b_weight_at_decode_sizes(m, n, k, layout, monkeypatch):
    """The raw-B TF32 GEMM (decode sizes: the weight read as it is, lo made in shared memory) within the FP32 bound,
    and within a few ulps of the path that splits both operands (hi by truncation instead of rounding: the two
    differ by terms of ~2^-21 relative); split-K, 128-row tiles and partial tiles among the cases."""
    g = dg.build_fp32(m, n, k, layout=layout)
    assert g.raw_b and g.gemm.spec.raw_b, g
    a, b = operands(g.spec, m, cupy.random.default_rng(m + n + k))
    err = check(g, m, a, b)
    monkeypatch.setenv("DEEPGEMM_JIT_NO_RAW_B", "1")
    g_split = dg.build_fp32(m, n, k, layout=layout)
    assert not g_split.raw_b
    err_split = check(g_split, m, a, b)
    assert err < 4 * err_split + 1e-6, (err, err_split)
    # A weight with infinities: the rows that meet one are inf or NaN in both paths, the others finite and equal
    # to the split path's within the bound.
    b_inf = b.copy()
    b_inf[3 % n, 0] = cupy.inf  # b is (N, K) in both layouts here
    out_raw, out_split = g(a, b_inf), g_split(a, b_inf)
    finite = cupy.isfinite(out_split)
    assert bool((cupy.isfinite(out_raw) == finite).all())
    assert float(cupy.abs(out_raw[finite] - out_split[finite]).max()) <= 1e-4 * float(cupy.abs(out_split[finite]).max())


# Forced tiles of the raw-B kernel, whatever the heuristic picks: 64- and 128-row tiles, split-K shares of odd and
# single raw K blocks (K = 96 is three of them), partial M and N tiles, stage counts from 2 up.
@pytest.mark.parametrize("m,n,k,tile,splits", [
    (64, 7168, 2048, (64, 56, None), 1), (37, 1000, 1024, (64, 168, None), 3), (1, 520, 96, (64, 112, 2), 2),
    (128, 2112, 1024, (128, 112, None), 1), (100, 264, 1024, (128, 56, None), 3), (128, 7168, 2048, (128, 128, 2), 2),
    (70, 4096, 7168, (64, 112, None), 5)])
def test_raw_b_forced_tiles(m, n, k, tile, splits):
    """Each tile / split count of the raw-B TF32 GEMM within the FP32 bound, and equal to itself on a second call
    (deterministic split-K)."""
    from deepgemm_jit import api, config

    g_auto = dg.build_fp32(m, n, k)
    spec = g_auto.gemm.spec
    assert spec.raw_b
    block_m, block_n, stages = tile
    cfg = config.sm90_config(spec, block_m, block_n, stages, split_k=splits > 1)
    inner = api.build_spec(spec, m, config=cfg, split_k=splits if splits > 1 else None, weight_streaming=False)
    g = fp32x3.Fp32Gemm(g_auto.spec, inner.arch, inner.m_hint, inner, g_auto.split_artifact)
    a, b = operands(g.spec, m, cupy.random.default_rng(m * 3 + n + k))
    check(g, m, a, b)
    first = g(a, b)
    assert bool((g(a, b) == first).all())


@pytest.mark.parametrize("m", [64, 1000])   # raw B (only A split) and both operands split
def test_repeated_calls_replay_the_kept_plan(m):
    """Calls with out= whose operands keep their signatures replay the kept plan: new values in the same arrays
    give the new product, and another out= (a new signature) takes the full path and keeps a second plan."""
    n, k = 1000, 2048
    g = dg.build_fp32(m, n, k)
    rng = cupy.random.default_rng(m)
    a, b = operands(g.spec, m, rng)
    out = reference.poisoned((m, n), "fp32")
    check(g, m, a, b, out=out)
    assert len(g._plans) == 1
    a[...] = rng.standard_normal(a.shape, dtype=cupy.float32)
    b[...] = rng.standard_normal(b.shape, dtype=cupy.float32)
    out.fill(cupy.nan)
    check(g, m, a, b, out=out)
    assert len(g._plans) == 1
    check(g, m, a, b, out=reference.poisoned((m, n), "fp32"))
    assert len(g._plans) == 2


@pytest.mark.parametrize("m", [64, 300])  # 64: the raw-B GEMM (A2 only); 300: A2 and B2
def test_captured_call_keeps_its_split_workspaces(m):
    """A CuPy graph capture of a call records the addresses of its A2 / B2 split operands, which went back to the
    stream's pool when the call returned: a later allocation on that stream could take them, and every replay wrote
    the split into it (review, session 38; the fix is runtime.keep_while_captured). Arrays allocated after the
    capture keep their values through replays, and each replay computes a's current values."""
    n, k = 264, 1000
    g = dg.build_fp32(m, n, k)
    rng = cupy.random.default_rng(11)
    a, b = operands(g.spec, m, rng)
    out = reference.poisoned((m, n), "fp32")
    shapes = [g.spec.inner.a_shape(m)] + ([] if g.raw_b else [g.spec.inner.b_shape()])
    stream = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    with stream:
        g(a, b, out=out)  # the warm-up a serving loop makes before capturing (kernels, workspaces)
        stream.synchronize()
        stream.begin_capture()
        try:
            g(a, b, out=out)
        finally:
            graph = stream.end_capture()
        later = [cupy.full(shape, 12345.0, dtype=cupy.float32) for shape in shapes for _ in range(4)]
        stream.synchronize()
        a[...] = rng.standard_normal(a.shape, dtype=cupy.float32)  # new values: the replay splits them
        out.fill(cupy.nan)
        graph.launch(stream)
        stream.synchronize()
    assert all(bool((v == 12345.0).all()) for v in later), "a replay wrote into memory allocated after the capture"
    err = reference.relative_error(out, reference.reference(g.spec, a, b))
    assert err <= BOUND, (case_name(g, m), err)
