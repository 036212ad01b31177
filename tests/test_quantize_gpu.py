"""Quantization kernels on the GPU against the float64 references (deepgemm_jit.reference.quantize_reference /
dequantize_reference): fresh random inputs (never zeros) with per-row magnitudes spread over four decades, odd
sizes, NaN-poisoned outputs, CuPy and torch inputs, streams, and no host synchronisation inside quantize.

What "agrees" means (deepgemm_jit/quantization.py's contract): scales equal the reference's (rtol 1e-6; they are in fact the same
float32 division), q at most one FP8 ulp / one INT8 step from the reference and rarely so (the kernel rounds x / s to
float32 before the 8-bit rounding), dequantize exactly the float32 rounding of the exact product (then the output
type's rounding). Skipped cleanly without a GPU (marker `gpu`); torch tests also without torch.
"""
import itertools
import time

import numpy as np
import pytest

import deepgemm_jit.quantization as quant
from deepgemm_jit import dtypes, reference
from streams import nan_target, spin

cupy = pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu

SRC = ("fp32", "fp16", "bf16")
Q_GRAN = [(q, g) for q in quant.QUANT_DTYPES for g in quant.GRANULARITIES
          if q != "int8" or g in quant.INT8_GRANULARITIES]
MS = (1, 7, 129, 1000)
KS = (1, 100, 127, 129, 1000, 7168)
BITS = {2: np.uint16, 4: np.uint32}


# -- helpers ---------------------------------------------------------------------------------------------------

def random_input(shape, src, seed=None, decades=4.0):
    """Fresh N(0, 1) values times a per-row factor 10**U(-decades/2, decades/2): groups get different scales."""
    rng = cupy.random.default_rng(seed)
    x = rng.standard_normal(shape, dtype=cupy.float32)
    rows = shape[0] if len(shape) == 2 else 1
    row_scale = (10.0 ** (rng.random((rows, 1), dtype=cupy.float32) * decades - decades / 2)).astype(cupy.float32)
    return reference._to_storage(x * row_scale, src)


def as_bits(x):
    """An integer view of the same bytes (to write zeros, copy or compare any float storage type exactly)."""
    return x.view(BITS[x.dtype.itemsize])


# Bytes quantize never writes for finite inputs: an FP8 NaN (satfinite never makes NaN or Inf), INT8 -128 (it
# saturates at -127). An output byte still holding one after the call was not written.
Q_POISON = {"fp8_e4m3": 0xFF, "fp8_e5m2": 0xFF, "int8": 0x80}


def poisoned_q(shape, q_name):
    """Contiguous q output filled with Q_POISON[q_name]."""
    x = cupy.empty(shape, dtype=np.int8 if q_name == "int8" else np.uint8)
    cupy.cuda.runtime.memsetAsync(x.data.ptr, Q_POISON[q_name], x.nbytes, cupy.cuda.get_current_stream().ptr)
    return x


def assert_fully_written(q, q_name, case):
    if q_name == "int8":
        bad = int(cupy.count_nonzero(q == -128))
    else:
        bad = int(cupy.count_nonzero(~cupy.isfinite(reference.decode_fp8(q, q_name))))
    assert bad == 0, f"{case}: {bad} values of q are NaN/Inf/-128 (unwritten?)"


def poisoned_outputs(m, k, q_name, gran):
    return poisoned_q((m, k), q_name), reference.poisoned(quant.scale_shape(gran, m, k), "fp32")


def check_quantized(x, q, s, q_name, gran, case):
    """q, scales (CuPy) against the float64 reference of x (CuPy)."""
    m, k = x.shape
    q_ref, s_ref = reference.quantize_reference(x, q_name, gran)
    assert q.shape == (m, k) and q.dtype == q_ref.dtype, f"{case} q {q.shape} {q.dtype}"
    assert s.shape == s_ref.shape == quant.scale_shape(gran, m, k) and s.dtype == np.float32, f"{case} s {s.shape}"
    assert bool(cupy.isfinite(s).all()), f"{case}: scales not all written"
    np.testing.assert_allclose(cupy.asnumpy(s), cupy.asnumpy(s_ref), rtol=1e-6, atol=0, err_msg=case)
    assert_fully_written(q, q_name, case)
    dist = reference.quant_ulp_distance(q, q_ref, q_name)
    worst, num_off = int(dist.max()), int(cupy.count_nonzero(dist))
    # One ulp only where float32(x / s) rounds onto an 8-bit rounding boundary: about 2**-20 of the values.
    assert worst <= 1 and num_off <= max(2, q.size // 1000), f"{case} worst={worst} ulp, {num_off} values off"
    return q_ref, s_ref


def expected_dequantized(q, s, q_name, gran, out_name):
    """What dequantize must write exactly: the float32 rounding of the exact product, then out_dtype's rounding."""
    return reference._to_storage(reference.dequantize_reference(q, s, q_name, gran).astype(cupy.float32), out_name)


def sync():
    cupy.cuda.get_current_stream().synchronize()


def round4(m):
    return -(-m // 4) * 4


def assert_default_layout(s, gran, m, case):
    """quantize's own scales: group128 M-major ((1, round_up(M, 4)) strides, 16-byte aligned base: what the FP8 block
    GEMM bulk-copies), the other granularities C-contiguous."""
    if gran == "group128":  # (the row stride of a single row addresses nothing)
        assert s.strides[1] == 4 * round4(m) and (m == 1 or s.strides[0] == 4), f"{case}: scales strides {s.strides}"
        assert s.data.ptr % 16 == 0, f"{case}: scales at 0x{s.data.ptr:x}"
    else:
        assert s.flags.c_contiguous, f"{case}: scales strides {s.strides}"


def poisoned_m_major(shape):
    """(M, G) float32 NaN in the M-major layout quantize allocates for group128, and its (G, round_up(M, 4))
    storage (NaN in the padding rows too: a write there shows)."""
    m, groups = shape
    storage = cupy.full((groups, round4(m)), cupy.nan, dtype=cupy.float32)
    return storage[:, :m].T, storage


# -- CuPy sweeps -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("m,k", list(itertools.product(MS, KS)))
@pytest.mark.parametrize("q_name,gran", Q_GRAN)
@pytest.mark.parametrize("src", SRC)
def test_quantize_matches_reference(src, q_name, gran, m, k):
    x = random_input((m, k), src)
    out = poisoned_outputs(m, k, q_name, gran)
    q, s = quant.quantize(x, q_name, gran, out=out)
    assert q is out[0] and s is out[1]
    sync()
    check_quantized(x, q, s, q_name, gran, f"{src=} {q_name=} {gran=} {m=} {k=}")


@pytest.mark.parametrize("q_name,gran", Q_GRAN)
@pytest.mark.parametrize("src", SRC)
def test_new_outputs_and_dequantize(src, q_name, gran):
    m, k = 257, 1000
    x = random_input((m, k), src)
    q, s = quant.quantize(x, q_name, gran)
    assert isinstance(q, cupy.ndarray) and q.flags.c_contiguous and isinstance(s, cupy.ndarray)
    assert q.dtype == (np.int8 if q_name == "int8" else np.uint8)
    assert_default_layout(s, gran, m, f"{src=} {q_name=} {gran=}")
    sync()
    check_quantized(x, q, s, q_name, gran, f"{src=} {q_name=} {gran=}")
    for out_name in SRC:
        case = f"{src=} {q_name=} {gran=} {out_name=}"
        out = reference.poisoned((m, k), out_name)
        assert quant.dequantize(q, s, q_name, gran, out_dtype=out_name, out=out) is out
        fresh = quant.dequantize(q, s, q_name, gran, out_dtype=out_name)
        sync()
        want = expected_dequantized(q, s, q_name, gran, out_name)
        assert cupy.array_equal(as_bits(out), as_bits(want)), case
        assert cupy.array_equal(as_bits(fresh), as_bits(want)) and fresh.dtype == dtypes.numpy_dtype(out_name), case
        # and the round trip is as close to x as the 8-bit format allows
        # (INT8 per tensor: rows 100x below the largest one keep only a few levels)
        bound = {"fp8_e4m3": 0.04, "fp8_e5m2": 0.08, "int8": 0.1 if gran == "tensor" else 0.02}[q_name]
        err = reference.relative_error(out, reference.to_float64(x))
        assert err <= bound, f"{case} {err=:.3e}"


@pytest.mark.parametrize("m,k", [(1, 300), (3, 129), (7, 1000), (129, 1000), (1000, 7168)])
@pytest.mark.parametrize("q_name,gran", Q_GRAN)
def test_scale_layouts_give_identical_values(q_name, gran, m, k):
    """The default scales (group128 M-major), out= row-major and out= M-major (for block128 column-major, for row
    every other element) hold identical q bits and scales; each out= layout is written at its elements only (the
    M-major storage's padding and the skipped elements keep their NaN); dequantize of each layout is identical."""
    x = random_input((m, k), "bf16")
    case = f"{q_name=} {gran=} {m=} {k=}"
    q, s = quant.quantize(x, q_name, gran)
    assert_default_layout(s, gran, m, case)
    shape = quant.scale_shape(gran, m, k)
    row_major = poisoned_outputs(m, k, q_name, gran)
    if gran == "row":
        storage = cupy.full((2 * m,), cupy.nan, dtype=cupy.float32)
        strided = storage[::2]
    elif gran == "tensor":
        storage = cupy.full((4,), cupy.nan, dtype=cupy.float32)
        strided = storage[2:3]
    else:  # group128: quantize's M-major; block128: its column-major analogue
        strided, storage = poisoned_m_major(shape)
    other = (poisoned_q((m, k), q_name), strided)
    for out in (row_major, other):
        got = quant.quantize(x, q_name, gran, out=out)
        assert got[0] is out[0] and got[1] is out[1], case
    sync()
    check_quantized(x, q, s, q_name, gran, case)
    for q_out, s_out in (row_major, other):
        assert cupy.array_equal(q_out, q) and cupy.array_equal(s_out, s), case
    written = cupy.zeros(storage.shape, dtype=bool)
    if gran == "row":
        written[::2] = True
    elif gran == "tensor":
        written[2] = True
    else:
        written[:, :shape[0]] = True
    assert bool(cupy.isnan(storage[~written]).all()), f"{case}: written outside the out= scales' elements"
    for scales in (s, row_major[1], other[1]):
        d = quant.dequantize(q, scales, q_name, gran)
        sync()
        assert cupy.array_equal(as_bits(d), as_bits(expected_dequantized(q, s, q_name, gran, "fp32"))), case


@pytest.mark.parametrize("m,n,k", [(301, 520, 3000), (1, 264, 1000), (128, 392, 1024), (77, 256, 129)])
def test_default_scales_take_the_bulk_path_bitwise(m, n, k):
    """The user's path: quantize's group128 scales straight into the FP8 block GEMM take the bulk A-scale path
    (launch.bulk_a_scales on that very view) and give the bits of the same GEMM on a row-major copy of them (the
    scale warp's path), within the float64 reference's bound."""
    import deepgemm_jit as dg
    from deepgemm_jit import launch
    from deepgemm_jit.arrays import scale_view
    from deepgemm_jit.spec import GemmSpec

    rng = cupy.random.default_rng(m + n + k)
    x = rng.standard_normal((m, k), dtype=cupy.float32)
    w = rng.standard_normal((n, k), dtype=cupy.float32) * cupy.float32(0.05)
    qa, sa = quant.quantize(x, "fp8", "group128")
    qb, sb = quant.quantize(w, "fp8", "block128")
    spec = GemmSpec.create(n, k, dtype="fp8", scaling="block")
    assert launch.bulk_a_scales(spec, scale_view(sa, "scale_a", sa.shape, ""), m), sa.strides
    sa_rows = cupy.ascontiguousarray(sa)
    assert not launch.bulk_a_scales(spec, scale_view(sa_rows, "scale_a", sa.shape, ""), m) or m == 1
    g = dg.build(m, n, k, dtype="fp8", scaling="block", weight_streaming=False)
    bulk, rows = reference.poisoned((m, n), "bf16"), reference.poisoned((m, n), "bf16")
    g(qa, qb, scale_a=sa, scale_b=sb, out=bulk)
    g(qa, qb, scale_a=sa_rows, scale_b=sb, out=rows)
    sync()
    case = f"{m=} {n=} {k=} {g.config.tag}"
    assert bool((bulk.view(cupy.uint16) == rows.view(cupy.uint16)).all()), case
    ref = (reference.dequantize_reference(qa, sa, "fp8", "group128")
           @ reference.dequantize_reference(qb, sb, "fp8", "block128").T)
    err = reference.error(bulk, ref)
    assert reference.within_bound(err, "fp8_e4m3") and err < 5e-3, f"{case} {err=:.2e}"


def test_masked_rows_reshaped_from_quantize_take_the_bulk_path():
    """A masked A quantized as one (G * max_m, K) matrix: its scales reshaped to (G, max_m, kb) stay a view (no
    copy), the grouped GEMM bulk-copies them, and the output equals that of a row-major copy bit for bit."""
    import deepgemm_jit as dg
    from deepgemm_jit import grouped, launch
    from deepgemm_jit.spec import GemmSpec

    num_groups, max_m, n, k = 4, 77, 256, 1024
    counts = cupy.asarray([77, 0, 40, 3], dtype=cupy.int32)
    rng = cupy.random.default_rng(41)
    x = rng.standard_normal((num_groups * max_m, k), dtype=cupy.float32)
    qa, sa = quant.quantize(x, "fp8", "group128")
    pairs = [quant.quantize(rng.standard_normal((n, k), dtype=cupy.float32) * cupy.float32(0.05), "fp8",
                            "block128") for _ in range(num_groups)]
    qb, sb = cupy.stack([q for q, _ in pairs]), cupy.stack([s for _, s in pairs])
    sa3 = sa.reshape(num_groups, max_m, sa.shape[1])
    assert sa3.data.ptr == sa.data.ptr and sa3.strides == (4 * max_m, 4, sa.strides[1]), sa3.strides
    spec = GemmSpec.create(n, k, dtype="fp8", scaling="block", grouped=True)
    rows = grouped._scale_rows(sa3, "scale_a", sa3.shape, "")
    assert launch.bulk_a_scales(spec, rows, num_groups * max_m)
    g = dg.build_grouped(n, k, dtype="fp8", expected_m=max_m, num_groups=num_groups)
    a3 = qa.reshape(num_groups, max_m, k)
    outs = []
    for scale_a in (sa3, cupy.ascontiguousarray(sa3)):
        out = reference.poisoned((num_groups, max_m, n), "bf16")
        g(a3, qb, scale_a=scale_a, scale_b=sb, masked_m=counts, out=out)
        outs.append(out)
    sync()
    a64 = reference.dequantize_reference(qa, sa, "fp8_e4m3", "group128")
    for gi, c in enumerate(counts.tolist()):
        assert bool((outs[0][gi, :c].view(cupy.uint16) == outs[1][gi, :c].view(cupy.uint16)).all()), gi
        if c:  # and the product itself (both outputs unwritten would be equal too)
            b64 = reference.dequantize_reference(qb[gi], sb[gi], "fp8_e4m3", "block128")
            err = reference.error(outs[0][gi, :c], a64[gi * max_m:gi * max_m + c] @ b64.T)
            assert reference.within_bound(err, "fp8_e4m3"), (gi, err)


@pytest.mark.parametrize("m,k", [(1, 1), (7, 127), (129, 129), (300, 7168)])
@pytest.mark.parametrize("q_name", quant.QUANT_DTYPES)
def test_dequantize_odd_sizes_and_padded_q(q_name, m, k):
    gran = "row"
    x = random_input((m, k), "bf16")
    q, s = quant.quantize(x, q_name, gran)
    wide = poisoned_q((m, k + 5), q_name)  # q with padded rows (row stride k + 5)
    wide[:, :k] = q
    out = reference.poisoned((m, k), "fp32")
    quant.dequantize(wide[:, :k], s, q_name, gran, out=out)
    sync()
    assert cupy.array_equal(out, expected_dequantized(q, s, q_name, gran, "fp32")), f"{q_name=} {m=} {k=}"
    np.testing.assert_array_equal(
        cupy.asnumpy(reference.dequantize_reference(wide, s, q_name, gran, k=k)),
        cupy.asnumpy(reference.dequantize_reference(q, s, q_name, gran)))


@pytest.mark.parametrize("layout", ["offset", "odd_stride", "padded"])
@pytest.mark.parametrize("q_name,gran", [("fp8_e4m3", "group128"), ("fp8_e5m2", "block128"), ("int8", "row"),
                                         ("fp8_e4m3", "tensor")])
@pytest.mark.parametrize("src", SRC)
def test_strided_and_misaligned_inputs(src, q_name, gran, layout):
    """Views that need narrower loads (or allow full ones) give exactly what their contiguous copy gives."""
    m, k = 131, 1000
    base = random_input((m, k + 9), src)
    x = {"offset": base[:, 1:k + 1], "odd_stride": base[:, :k], "padded": None}[layout]
    if x is None:
        base = random_input((m, k + 24), src)  # a 16-byte multiple of row stride: full-width loads
        x = base[:, 8:k + 8]
    dense = cupy.ascontiguousarray(as_bits(x)).view(x.dtype)
    q, s = quant.quantize(x, q_name, gran, out=poisoned_outputs(m, k, q_name, gran))
    q_dense, s_dense = quant.quantize(dense, q_name, gran)
    sync()
    case = f"{src=} {q_name=} {gran=} {layout=}"
    assert cupy.array_equal(q, q_dense) and cupy.array_equal(s, s_dense), case
    check_quantized(dense, q, s, q_name, gran, case)


@pytest.mark.parametrize("q_name,gran", Q_GRAN)
@pytest.mark.parametrize("src", SRC)
def test_all_zero_group_gets_scale_one(src, q_name, gran):
    m, k = 300, 400
    x = random_input((m, k), src)
    region = {"tensor": (slice(None), slice(None)), "row": (5, slice(None)), "group128": (5, slice(128, 256)),
              "block128": (slice(128, 256), slice(256, 384))}[gran]
    as_bits(x)[region] = 0
    q, s = quant.quantize(x, q_name, gran, out=poisoned_outputs(m, k, q_name, gran))
    sync()
    case = f"{src=} {q_name=} {gran=}"
    check_quantized(x, q, s, q_name, gran, case)
    index = {"tensor": (0,), "row": (5,), "group128": (5, 1), "block128": (1, 2)}[gran]
    assert float(s[index]) == 1.0, case
    assert int(cupy.count_nonzero(q[region])) == 0, case
    # The other groups keep their own scales: check_quantized compared every scale with the reference (a group
    # whose amax is exactly QUANT_MAX also has scale 1.0, so counting ones would be flaky).


_DIVIDE_SRC = r"""
#include "dgjit/quantize.cuh"
using namespace dgjit;
// Per pair i: div.rn's quotient, quant::divide's and quant::divide_bounded's, the first two also rounded to E4M3,
// E5M2 and INT8 as the quantizers do.
extern "C" __global__ void dgjit_test_divide(const float* x, const float* s, unsigned long long n, float* quotients,
                                            unsigned int* codes) {
  const unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float want = quant::div_rn(x[i], s[i]);
  const quant::Divisor d = quant::make_divisor(s[i]);
  const float got = quant::divide(x[i], d);
  quotients[3 * i] = want;
  quotients[3 * i + 1] = got;
  quotients[3 * i + 2] = quant::divide_bounded(x[i], d);
  const unsigned int e4m3 = quant::cvt_fp8x2_satfinite<quant::Format::kE4M3>(got, want);
  const unsigned int e5m2 = quant::cvt_fp8x2_satfinite<quant::Format::kE5M2>(got, want);
  int r[2] = {quant::cvt_rni_s32(want), quant::cvt_rni_s32(got)};
  for (int j = 0; j < 2; ++j) r[j] = r[j] < -quant::kInt8Max ? -quant::kInt8Max : (r[j] > quant::kInt8Max ? quant::kInt8Max : r[j]);
  const unsigned int int8 = (unsigned(r[0]) & 0xFFu) | ((unsigned(r[1]) & 0xFFu) << 8);
  codes[3 * i] = e4m3;
  codes[3 * i + 1] = e5m2;
  codes[3 * i + 2] = int8;
}
"""


def test_divisor_matches_div_rn():
    """quant::divide (Markstein's correction from one reciprocal per divisor, what the quantizers and the
    quantize-on-store epilogues divide with) against div.rn.f32: the same E4M3, E5M2 and INT8 codes for every pair,
    and the same float32 quotient bit for bit where it decides a code (2^-10 <= |x / s| <= 2^16; below, every code is
    0, above, saturated). quant::divide_bounded (the group quantize-on-store's) equals divide wherever the quotient
    does not overflow and s is not 0. Pairs: random bit patterns (subnormals, huge values, inf, NaN),
    quantizer-like pairs (|x| <= 448 s, s over 2^-149..2^127) and a grid of special values."""
    from deepgemm_jit import render

    module = cupy.RawModule(code=_DIVIDE_SRC, options=("-std=c++17", f"-I{render.templates_dir() / 'include'}"))
    kernel = module.get_function("dgjit_test_divide")
    rng = np.random.default_rng(12)
    n = 1 << 22
    random_bits = rng.integers(0, 1 << 32, size=(2, n), dtype=np.uint64).astype(np.uint32).view(np.float32)
    s_like = (np.abs(rng.standard_normal(n)) * np.exp2(rng.uniform(-149, 127, n))).astype(np.float32)
    x_like = (rng.uniform(-448, 448, n) * s_like).astype(np.float32)
    special = np.array([0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 1.17549435e-38, 2.0 ** -100, 2.0 ** -60,
                        2.0 ** -60 * 0.99999994, 2.0 ** 60, 2.0 ** 60 * 1.0000001, 1e19, 0.5, 1.0, 3.0, -7.0, 448.0, 57344.0, 1e30, 3.4028235e38, -3.4028235e38,
                        np.inf, -np.inf, np.nan], dtype=np.float32)
    gx, gs = (v.ravel() for v in np.meshgrid(special, special))
    x = np.concatenate([random_bits[0], x_like, gx, random_bits[0][: n // 4]])
    s = np.concatenate([random_bits[1], s_like, gs, s_like[: n // 4]])
    total = x.size
    quotients = cupy.empty(3 * total, dtype=cupy.float32)
    codes = cupy.empty(3 * total, dtype=cupy.uint32)
    threads = 256
    kernel(((total + threads - 1) // threads,), (threads,),
           (cupy.asarray(x), cupy.asarray(s), np.uint64(total), quotients, codes))
    q = quotients.get().reshape(total, 3)
    c = codes.get().reshape(total, 3)
    want, got, bounded = q[:, 0], q[:, 1], q[:, 2]
    # divide_bounded: divide's float bit for bit wherever x / s does not overflow and s is not 0 (NaN as NaN).
    in_bounds = (s != 0) & (np.isnan(want) | (np.abs(want) <= 2.0 ** 100))
    same = (bounded.view(np.uint32) == got.view(np.uint32)) | (np.isnan(bounded) & np.isnan(got))
    assert in_bounds.sum() > total // 2 and np.isinf(s[in_bounds]).any() and np.isnan(want[in_bounds]).any()
    off = np.flatnonzero(in_bounds & ~same)
    assert off.size == 0, [(x[i], s[i], got[i], bounded[i]) for i in off[:5]]
    both_nan = np.isnan(want) & np.isnan(got)
    deciding = (np.abs(want) >= 2.0 ** -10) & (np.abs(want) <= 2.0 ** 16)
    differs = deciding & ~both_nan & (want.view(np.uint32) != got.view(np.uint32))
    assert deciding.sum() > total // 4, "the pairs must mostly land where the quotient decides a code"
    assert not differs.any(), [(x[i], s[i], want[i], got[i]) for i in np.flatnonzero(differs)[:5]]
    for column, name, bits in ((0, "e4m3", 8), (1, "e5m2", 8), (2, "int8", 8)):
        low, high = c[:, column] & ((1 << bits) - 1), c[:, column] >> bits
        bad = np.flatnonzero(low != high)
        assert bad.size == 0, (name, [(x[i], s[i], want[i], got[i]) for i in bad[:5]])


@pytest.mark.parametrize("q_name", quant.QUANT_DTYPES)
def test_extremes_saturate_and_keep_signs(q_name):
    """Each group's largest magnitude maps exactly to -QUANT_MAX when it is negative; values far below it land in
    the 8-bit format's subnormal range or round to zero, as in the reference."""
    m, k = 64, 384
    x = random_input((m, k), "fp32")
    x[:, 7] = cupy.float32(-3.0e4)  # one dominant negative value per row
    gran = "row"
    q, s = quant.quantize(x, q_name, gran)
    sync()
    check_quantized(x, q, s, q_name, gran, f"{q_name=}")
    top = reference.decode_fp8(q[:, 7], q_name) if q_name != "int8" else q[:, 7].astype(cupy.float64)
    assert bool((top == -dtypes.QUANT_MAX[q_name]).all())


# -- streams and synchronisation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("explicit", [True, False])
@pytest.mark.parametrize("gran", quant.GRANULARITIES)
def test_runs_on_the_stream_without_waiting(gran, explicit):
    """quantize enqueues on the given (or current) stream and returns while that stream is still busy: no host
    synchronisation, the tensor amax included. Its output is still untouched while the stream spins."""
    m, k = 1000, 1000
    x = random_input((m, k), "bf16")
    busy = cupy.cuda.Stream(non_blocking=True)
    observer = cupy.cuda.Stream(non_blocking=True)
    with busy:
        quant.quantize(x, "fp8", gran)  # compile, load and warm the pool outside the measurement
    out = poisoned_outputs(m, k, "fp8_e4m3", gran)
    # Allocated now: a device allocation between the spin and the snapshot could serialise the two streams.
    snapshot = cupy.empty_like(out[0])
    x_late = nan_target(x)  # x copied in after the spin: a kernel on another stream than `busy` reads NaN
    spin(busy, 1.0)
    with busy:
        x_late[...] = x
    start = time.perf_counter()
    if explicit:
        quant.quantize(x_late, "fp8", gran, out=out, stream=busy)
    else:
        with busy:
            quant.quantize(x_late, "fp8", gran, out=out)
    elapsed = time.perf_counter() - start
    assert not busy.done and elapsed < 0.5, f"{gran=} returned after {elapsed:.3f} s"
    with observer:
        cupy.copyto(snapshot, out[0])
    observer.synchronize()
    assert not busy.done, "the spin ended before the snapshot: the test proves nothing"
    assert bool((snapshot == Q_POISON["fp8_e4m3"]).all()), f"{gran=}: q written before its stream got there"
    busy.synchronize()
    check_quantized(x, out[0], out[1], "fp8_e4m3", gran, f"{gran=} {explicit=}")


def test_raw_stream_handle():
    x = random_input((33, 300), "fp16")
    s = cupy.cuda.Stream(non_blocking=True)
    # x was written on the current stream, which a non-blocking stream does not wait for: order them, as a
    # user must (the first H200 run read x half-written here).
    cupy.cuda.get_current_stream().synchronize()
    q, scales = quant.quantize(x, "fp8_e5m2", "group128", stream=s.ptr)
    s.synchronize()
    check_quantized(x, q, scales, "fp8_e5m2", "group128", "raw handle")


@pytest.mark.parametrize("gran", ["row", "group128", "block128", "tensor"])
def test_kept_plan_replays_with_out(gran):
    """A call with out= keeps its launch (quantization._plans); the replays read x's current values, follow the
    stream argument, and a call whose arrays differ takes the checked path again (errors included). "tensor" keeps
    no plan (its amax pass needs a temporary word per call)."""
    m, k = 129, 1000
    x = random_input((m, k), "bf16", seed=3)
    q0, s0 = quant.quantize(x, "fp8", gran)
    q, scales = reference.poison(cupy.empty_like(q0)), cupy.full(s0.shape, cupy.nan, dtype=cupy.float32)
    quant.clear_memo()
    for _ in range(2):
        got_q, got_scales = quant.quantize(x, "fp8", gran, out=(q, scales))
        assert got_q is q and got_scales is scales
    kept = quant._plan_key(x, (q, scales), "fp8", gran) in quant._plans
    assert kept == (gran != "tensor")
    assert bool(cupy.array_equal(q, q0)) and bool(cupy.array_equal(scales, s0))
    x[...] = random_input((m, k), "bf16", seed=4)  # same buffer, new values: the replay reads them
    s = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.get_current_stream().synchronize()
    quant.quantize(x, "fp8", gran, out=(q, scales), stream=s)
    s.synchronize()
    q1, s1 = quant.quantize(x, "fp8", gran)
    assert bool(cupy.array_equal(q, q1)) and bool(cupy.array_equal(scales, s1))
    with pytest.raises(ValueError, match="out\\[0\\]"):
        quant.quantize(x, "fp8", gran, out=(q[:-1], scales))


def test_captured_tensor_quantize_keeps_its_amax_word():
    """A CuPy graph capture of quantize(..., "tensor") records the address of the call's temporary amax word, which
    went back to the stream's pool when the call returned: a later allocation could take it, and every replay
    zeroed and max-ed it (review). The word now outlives the graph: arrays allocated after the capture keep their
    values through replays, and each replay quantizes x's current values."""
    m, k = 129, 1000
    x = random_input((m, k), "bf16", seed=5)
    q0, s0 = quant.quantize(x, "fp8", "tensor")
    q, scales = cupy.empty_like(q0), cupy.empty_like(s0)
    stream = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    with stream:
        quant.quantize(x, "fp8", "tensor", out=(q, scales))  # warm-up (kernels loaded) before the capture
        stream.synchronize()
        stream.begin_capture()
        try:
            quant.quantize(x, "fp8", "tensor", out=(q, scales))
        finally:
            graph = stream.end_capture()
        later = [cupy.full((1,), 12345.0, dtype=cupy.float32) for _ in range(64)]  # small blocks of this pool
        stream.synchronize()
        x[...] = random_input((m, k), "bf16", seed=6) * 3  # new values: a new amax
        q.fill(0)
        scales.fill(cupy.nan)
        graph.launch(stream)
        stream.synchronize()
    assert all(float(v[0]) == 12345.0 for v in later), "a replay wrote into memory allocated after the capture"
    q1, s1 = quant.quantize(x, "fp8", "tensor")
    assert bool(cupy.array_equal(q, q1)) and bool(cupy.array_equal(scales, s1))


@pytest.mark.parametrize("gran", ["row", "group128", "block128", "tensor"])
def test_kept_plan_without_out_returns_new_arrays(gran):
    """Repeated calls without out= replay a kept launch (quantization._new_output_plans) into new arrays: distinct
    objects and pointers, the first call's layout and values; after x changes in place they follow x, on the stream
    given too. "tensor" keeps no plan."""
    m, k = 129, 1000
    case = f"{gran=}"
    x = random_input((m, k), "bf16", seed=5)
    quant.clear_memo()
    results = [quant.quantize(x, "fp8", gran) for _ in range(3)]
    assert (quant._new_outputs_key(x, "fp8", gran) in quant._new_output_plans) == (gran != "tensor"), case
    q0, s0 = results[0]
    assert len({a.data.ptr for r in results for a in r}) == 6, case
    for q, scales in results[1:]:
        assert q is not q0 and scales is not s0, case
        assert (q.shape, q.dtype, q.strides) == (q0.shape, q0.dtype, q0.strides), case
        assert (scales.shape, scales.dtype, scales.strides) == (s0.shape, s0.dtype, s0.strides), case
        assert bool(cupy.array_equal(q, q0)) and bool(cupy.array_equal(scales, s0)), case
    assert_default_layout(s0, gran, m, case)
    check_quantized(x, q0, s0, "fp8_e4m3", gran, case)
    x[...] = random_input((m, k), "bf16", seed=6)  # same buffer, new values: the replay reads them
    stream = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.get_current_stream().synchronize()
    q1, s1 = quant.quantize(x, "fp8", gran, stream=stream)
    stream.synchronize()
    assert not bool(cupy.array_equal(s1, s0)), case
    check_quantized(x, q1, s1, "fp8_e4m3", gran, f"{case} after x changed")


# -- argument errors that need real device arrays ------------------------------------------------------------------

def test_out_errors():
    m, k = 10, 300
    x = random_input((m, k), "bf16")
    q, s = poisoned_outputs(m, k, "fp8_e4m3", "group128")
    flat = cupy.empty(m * k + 4096, np.uint8)
    cases = [
        ((q,), TypeError, "out must be a"),
        ((q[:, :299], s), ValueError, r"out\[0\] has shape"),
        ((q.view(np.int8), s), TypeError, r"out\[0\] has dtype int8"),
        ((q, s[:, :2]), ValueError, r"out\[1\] has shape"),
        ((q, s.astype(cupy.float64)), TypeError, "scales are float32"),
        ((cupy.empty((k, m), np.uint8).T, s), ValueError, "must be contiguous"),
        ((cupy.ndarray((m, k), np.uint8, x.data), s), ValueError, r"out\[0\] overlaps x"),
        ((flat[16:16 + m * k].reshape(m, k), flat[:3 * m * 4].view(np.float32).reshape(m, 3)), ValueError,
         r"out\[0\] overlaps out\[1\]"),
        ((flat[8:8 + m * k].reshape(m, k), s), ValueError, "not 16-byte aligned"),
    ]
    for out, exc, words in cases:
        with pytest.raises(exc, match=words):
            quant.quantize(x, "fp8", "group128", out=out)
    with pytest.raises(ValueError, match="scales has shape"):
        quant.dequantize(q, s[:, :2], "fp8", "group128")
    with pytest.raises(TypeError, match="out has dtype"):
        quant.dequantize(q, s, "fp8", "group128", out_dtype="bf16", out=cupy.empty((m, k), np.float32))
    big = cupy.empty(m * k + 64, np.float32)
    with pytest.raises(ValueError, match="out overlaps scales"):
        quant.dequantize(q, big[:3 * m].reshape(m, 3), "fp8", "group128", out=big[:m * k].reshape(m, k))


# -- torch --------------------------------------------------------------------------------------------------------

@pytest.fixture
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} sees no GPU")
    return torch


TORCH_SRC = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
TORCH_Q = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "int8": "int8"}


def to_cupy(t):
    """A CuPy view of a torch tensor's bytes (float8 as uint8, bfloat16 as ml_dtypes.bfloat16)."""
    import torch

    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return cupy.from_dlpack(t.view(torch.uint8))
    if t.dtype == torch.bfloat16:
        return cupy.from_dlpack(t.view(torch.int16)).view(dtypes.numpy_dtype("bf16"))
    return cupy.from_dlpack(t)


def torch_input(torch, shape, src):
    scale = 10.0 ** (torch.rand((shape[0], 1), device="cuda") * 4 - 2)
    return (torch.randn(shape, device="cuda") * scale).to(getattr(torch, TORCH_SRC[src]))


@pytest.mark.parametrize("m,k", [(1, 1), (7, 129), (129, 1000), (1000, 7168)])
@pytest.mark.parametrize("q_name,gran", Q_GRAN)
@pytest.mark.parametrize("src", SRC)
def test_torch_matches_cupy_and_reference(torch, src, q_name, gran, m, k):
    case = f"torch {src=} {q_name=} {gran=} {m=} {k=}"
    x = torch_input(torch, (m, k), src)
    poison_q = (torch.full((m, k), float("nan"), device="cuda").to(getattr(torch, TORCH_Q[q_name]))
                if q_name != "int8" else torch.full((m, k), -128, dtype=torch.int8, device="cuda"))
    out = (poison_q, torch.full(quant.scale_shape(gran, m, k), float("nan"), device="cuda"))
    q, s = quant.quantize(x, q_name, gran, out=out)
    assert q is out[0] and s is out[1]
    q_new, s_new = quant.quantize(x, q_name, gran)
    assert q_new.dtype == getattr(torch, TORCH_Q[q_name]) and q_new.shape == (m, k) and q_new.is_contiguous()
    assert s_new.dtype == torch.float32 and s_new.device == x.device and tuple(s_new.shape) == quant.scale_shape(
        gran, m, k)
    torch.cuda.synchronize()
    x_cp = to_cupy(x)
    q_cp, s_cp = quant.quantize(x_cp, q_name, gran)
    sync()
    for qq, ss in ((q, s), (q_new, s_new)):
        assert cupy.array_equal(to_cupy(qq), q_cp) and cupy.array_equal(to_cupy(ss), s_cp), case
    check_quantized(x_cp, to_cupy(q), to_cupy(s), q_name, gran, case)
    for out_name in SRC:
        d = quant.dequantize(q, s, q_name, gran, out_dtype=out_name)
        assert d.dtype == getattr(torch, TORCH_SRC[out_name]) and d.shape == (m, k), case
        torch.cuda.synchronize()
        want = expected_dequantized(q_cp, s_cp, q_name, gran, out_name)
        assert cupy.array_equal(as_bits(to_cupy(d)), as_bits(want)), f"{case} {out_name=}"


@pytest.mark.parametrize("m,k", [(1, 300), (7, 129), (1000, 7168)])
def test_torch_scale_layouts(torch, m, k):
    """torch: group128 scales M-major ((1, round_up(M, 4)) strides, 16-byte aligned); out= row-major and out=
    M-major (``torch.empty((kb, m4)).t()[:M]``) hold the same q and scales."""
    case = f"torch {m=} {k=}"
    x = torch_input(torch, (m, k), "bf16")
    q, s = quant.quantize(x, "fp8", "group128")
    kb, m4 = -(-k // 128), round4(m)
    assert s.stride()[1] == m4 and (m == 1 or s.stride()[0] == 1) and s.data_ptr() % 16 == 0, (case, s.stride())
    outs = []
    for scales in (torch.full((m, kb), float("nan"), device="cuda"),
                   torch.full((kb, m4), float("nan"), device="cuda").t()[:m]):
        out = (torch.empty((m, k), dtype=torch.float8_e4m3fn, device="cuda"), scales)
        assert quant.quantize(x, "fp8", "group128", out=out)[1] is scales
        outs.append(out)
    torch.cuda.synchronize()
    for q_out, s_out in outs:
        assert torch.equal(q_out.view(torch.uint8), q.view(torch.uint8)) and torch.equal(s_out, s), case
    check_quantized(to_cupy(x), to_cupy(q), to_cupy(s), "fp8_e4m3", "group128", case)


@pytest.mark.parametrize("gran", quant.GRANULARITIES)
def test_torch_current_stream_and_no_sync(torch, gran):
    """torch tensors run on torch's current stream (or the one given), and quantize never synchronises. The input
    is written on the busy stream after a 1 s spin, so a kernel on any other stream would quantize it unwritten."""
    m, k = 500, 1000
    x = torch_input(torch, (m, k), "bf16")
    busy = torch.cuda.Stream()
    with torch.cuda.stream(busy):  # compile, load, and leave enough blocks in the caching allocator
        warm = [quant.quantize(x, "fp8", gran) for _ in range(2)] + [quant.quantize(x, "fp8", gran, stream=busy)]
    del warm
    x2 = nan_target(x)
    spin(cupy.cuda.ExternalStream(busy.cuda_stream), 1.0)
    start = time.perf_counter()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(busy):
            x2.copy_(x)  # lands after the spin: a kernel on another stream than `busy` would read NaN
            q, s = quant.quantize(x2, "fp8", gran)
        q2, s2 = quant.quantize(x2, "fp8", gran, stream=busy)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    elapsed = time.perf_counter() - start
    assert not busy.query() and elapsed < 0.5, f"{gran=} returned after {elapsed:.3f} s"
    busy.synchronize()
    q_cp, s_cp = quant.quantize(to_cupy(x), "fp8", gran)
    sync()
    for qq, ss in ((q, s), (q2, s2)):
        assert cupy.array_equal(to_cupy(qq), q_cp) and cupy.array_equal(to_cupy(ss), s_cp), f"{gran=}"


def test_torch_errors(torch):
    x = torch_input(torch, (8, 256), "fp16")
    with pytest.raises(TypeError, match="x has dtype"):
        quant.quantize(x.double())
    with pytest.raises(TypeError, match="must be a torch tensor"):
        quant.quantize(x, out=(cupy.empty((8, 256), np.uint8), cupy.empty((8, 2), np.float32)))
    q, s = quant.quantize(x, "fp8_e5m2")
    with pytest.raises(TypeError, match="q has dtype torch.float8_e5m2"):
        quant.dequantize(q, s, "fp8_e4m3")
    with pytest.raises(TypeError, match="scales must be a torch tensor"):
        quant.dequantize(q, to_cupy(s), "fp8_e5m2")


@pytest.mark.parametrize("gran", ["row", "group128", "block128"])
def test_torch_kept_plan_without_out_returns_new_tensors(torch, gran):
    """torch: repeated calls without out= return new tensors (distinct pointers, same dtype, strides and values);
    after x changes in place they follow x, on an explicit stream and on torch's current stream."""
    m, k = 129, 1000
    case = f"torch {gran=}"
    x = torch_input(torch, (m, k), "bf16")
    quant.clear_memo()
    results = [quant.quantize(x, "fp8", gran) for _ in range(3)]
    assert quant._new_outputs_key(x, "fp8", gran) in quant._new_output_plans, case
    q0, s0 = results[0]
    assert len({t.data_ptr() for r in results for t in r}) == 6, case
    for q, scales in results[1:]:
        assert q is not q0 and scales is not s0, case
        assert q.dtype == torch.float8_e4m3fn and q.stride() == q0.stride() and q.device == x.device, case
        assert scales.dtype == torch.float32 and scales.stride() == s0.stride() and scales.shape == s0.shape, case
        assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(scales, s0), case
    x.copy_(torch_input(torch, (m, k), "bf16"))  # same buffer, new values
    busy = torch.cuda.Stream()
    busy.wait_stream(torch.cuda.current_stream())
    q1, s1 = quant.quantize(x, "fp8", gran, stream=busy)
    with torch.cuda.stream(busy):
        q2, s2 = quant.quantize(x, "fp8", gran)
    torch.cuda.synchronize()
    q_cp, s_cp = quant.quantize(to_cupy(x), "fp8", gran)
    sync()
    assert not torch.equal(s1, s0), case
    for qq, ss in ((q1, s1), (q2, s2)):
        assert cupy.array_equal(to_cupy(qq), q_cp) and cupy.array_equal(to_cupy(ss), s_cp), case
    check_quantized(to_cupy(x), q_cp, s_cp, "fp8_e4m3", gran, case)


@pytest.mark.parametrize("q_name,gran", Q_GRAN)
def test_no_rows(q_name, gran):
    """M = 0: empty q and scales, nothing launched but the tensor scale's fill with 1 (an all-zero group's): on the
    stream given, into a NaN-poisoned out= word as into a new one; dequantize of no rows gives (0, K)."""
    k = 300
    x = cupy.empty((0, k), dtype=cupy.float16)
    stream = cupy.cuda.Stream(non_blocking=True)
    q, s = quant.quantize(x, q_name, gran, stream=stream)
    assert q.shape == (0, k) and s.shape == quant.scale_shape(gran, 0, k)
    out = (poisoned_q((0, k), q_name), cupy.full(quant.scale_shape(gran, 0, k), cupy.nan, dtype=cupy.float32))
    cupy.cuda.Device().synchronize()  # the poison (current stream) before the non-blocking stream's fill
    got = quant.quantize(x, q_name, gran, out=out, stream=stream)
    assert got[0] is out[0] and got[1] is out[1]
    stream.synchronize()
    if gran == "tensor":
        assert float(s[0]) == 1.0 and float(out[1][0]) == 1.0
    back = quant.dequantize(q, s, q_name, gran)
    assert back.shape == (0, k) and back.dtype == cupy.float32
