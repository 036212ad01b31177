"""FP8 and INT8 GEMMs on the GPU against float64 references of the dequantized operands (DESIGN.md bounds),
plus DeepGEMM's difference metric against a BF16-input reference. Odd shapes everywhere; outputs poisoned."""
import pytest

from deepgemm_jit import build, gemm, reference
from deepgemm_jit.quantization import recipe_granularities

pytestmark = pytest.mark.gpu

SHAPES = [(1, 136, 256), (77, 300, 1100), (129, 1000, 1000), (257, 264, 4096), (1000, 7168, 512)]


def _problem(m, n, k, dtype, b_dtype, scaling, seed):
    import cupy

    rng = cupy.random.default_rng(seed)
    x = rng.standard_normal((m, k), dtype=cupy.float32)
    w = rng.standard_normal((n, k), dtype=cupy.float32) * cupy.float32(0.05)
    ga, gb = recipe_granularities(scaling)
    qa, sa = reference.quantize_reference(x, dtype, ga)
    qb, sb = reference.quantize_reference(w, b_dtype, gb)
    ref = reference.dequantize_reference(qa, sa, dtype, ga) @ reference.dequantize_reference(qb, sb, b_dtype, gb).T
    return x, w, qa, sa, qb, sb, ref


def _bf16_reference(x, w):
    """The product of the original inputs rounded to BF16 (what DeepGEMM's tests compare FP8 with)."""
    xb = reference.to_float64(reference._to_storage(x, "bf16"))
    wb = reference.to_float64(reference._to_storage(w, "bf16"))
    return xb @ wb.T


@pytest.mark.parametrize("scaling", ["tensor", "row", "block"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_fp8_recipes(scaling, m, n, k):
    x, w, qa, sa, qb, sb, ref = _problem(m, n, k, "fp8_e4m3", "fp8_e4m3", scaling, seed=m * 7 + n + k)
    g = build(m, n, k, dtype="fp8", scaling=scaling)
    out = reference.poisoned((m, n), "bf16")
    g(qa, qb, scale_a=sa, scale_b=sb, out=out)
    err = reference.error(out, ref)
    assert reference.within_bound(err, "fp8_e4m3"), (scaling, m, n, k, err, g.config.tag)
    assert err < 5e-3, (scaling, m, n, k, err)  # BF16 output rounding is ~2e-3: anything near 3e-2 is a bug
    if k >= 256:
        cos = reference.error(out, _bf16_reference(x, w), "cos")
        assert cos < reference.FP8_COS_BOUND, (scaling, m, n, k, cos)


@pytest.mark.parametrize("out_dtype", ["fp32", "fp16"])
def test_fp8_block_output_types(out_dtype):
    m, n, k = 200, 392, 2000
    _, _, qa, sa, qb, sb, ref = _problem(m, n, k, "fp8_e4m3", "fp8_e4m3", "block", seed=3)
    g = build(m, n, k, dtype="fp8", scaling="block", out_dtype=out_dtype)
    out = reference.poisoned((m, n), out_dtype)
    g(qa, qb, scale_a=sa, scale_b=sb, out=out)
    err = reference.error(out, ref)
    # FP32 output shows the tensor cores' own FP8 accumulation inside each 128-K block (measured 1.3e-4 on the
    # H200 at K = 2000); BF16/FP16 output rounding dominates otherwise.
    assert err < (5e-4 if out_dtype == "fp32" else 2e-3), (out_dtype, err)


@pytest.mark.parametrize("layout", ["m_major_nan_padding", "row_major"])
def test_fp8_block_scale_a_layouts(layout):
    """DeepGEMM's layout (scale_a stored K-group-major with M padded to 4, a transposed view; NaN in the padding
    rows) and a row-major copy (the scale warp's path) give the same output bits."""
    import cupy

    m, n, k = 301, 520, 3000
    _, _, qa, sa, qb, sb, ref = _problem(m, n, k, "fp8_e4m3", "fp8_e4m3", "block", seed=5)
    if layout == "row_major":
        sa_in = cupy.ascontiguousarray(sa)
    else:
        sa_in = reference.m_major_scales(sa)  # NaN in the padding rows
    g = build(m, n, k, dtype="fp8", scaling="block")
    out, same = reference.poisoned((m, n), "bf16"), reference.poisoned((m, n), "bf16")
    g(qa, qb, scale_a=sa_in, scale_b=sb, out=out)
    g(qa, qb, scale_a=sa, scale_b=sb, out=same)  # as quantize_reference returns it (M-major, padding 1.0)
    assert reference.error(out, ref) < 5e-3, layout
    assert bool((out.view(cupy.uint16) == same.view(cupy.uint16)).all()), layout


# Block-scaled tiles whose columns straddle 128-column scale blocks: each offset a tile can start at inside a
# block (the kernel resolves it at compile time, one promotion per offset) must pick the right B scales. N spans
# every offset of these widths and ends mid-tile; K ends mid-group; B's scales differ strongly per block.
@pytest.mark.parametrize("block_m,block_n", [(128, 176), (128, 160), (128, 144), (64, 112), (128, 96), (64, 80)])
@pytest.mark.parametrize("m,n,k", [(130, 1500, 1000), (257, 2112, 640)])
def test_fp8_block_straddling_tiles(block_m, block_n, m, n, k):
    import cupy

    from deepgemm_jit import config
    from deepgemm_jit.spec import GemmSpec

    x, w, qa, sa, qb, sb, _ = _problem(m, n, k, "fp8_e4m3", "fp8_e4m3", "block", seed=m + block_n)
    sb = sb * cupy.asarray(cupy.random.default_rng(block_n).uniform(0.25, 4.0, sb.shape), dtype=cupy.float32)
    ref = reference.dequantize_reference(qa, sa, "fp8_e4m3", "group128") @ \
        reference.dequantize_reference(qb, sb, "fp8_e4m3", "block128").T
    spec = GemmSpec.create(n, k, dtype="fp8", scaling="block")
    cfg = config.sm90_config(spec, block_m, block_n)
    g = build(m, n, k, dtype="fp8", scaling="block", config=cfg, weight_streaming=False)
    assert g.config.block_n == block_n
    out = reference.poisoned((m, n), "bf16")
    g(qa, qb, scale_a=sa, scale_b=sb, out=out)
    err = reference.error(out, ref)
    assert err < 5e-3, (block_m, block_n, m, n, k, err)


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_fp8_fast_accum(scaling):
    m, n, k = 130, 520, 4096
    _, _, qa, sa, qb, sb, ref = _problem(m, n, k, "fp8_e4m3", "fp8_e4m3", scaling, seed=11)
    g = build(m, n, k, dtype="fp8", scaling=scaling, fast_accum=True)
    out = reference.poisoned((m, n), "bf16")
    g(qa, qb, scale_a=sa, scale_b=sb, out=out)
    assert reference.error(out, ref) < 3e-2


@pytest.mark.parametrize("a_dtype,b_dtype", [("fp8_e5m2", "fp8_e5m2"), ("fp8_e4m3", "fp8_e5m2"),
                                             ("fp8_e5m2", "fp8_e4m3")])
def test_fp8_formats(a_dtype, b_dtype):
    m, n, k = 99, 264, 1024
    _, _, qa, sa, qb, sb, ref = _problem(m, n, k, a_dtype, b_dtype, "row", seed=13)
    g = build(m, n, k, dtype=a_dtype, b_dtype=b_dtype, scaling="row")
    out = reference.poisoned((m, n), "bf16")
    g(qa, qb, scale_a=sa, scale_b=sb, out=out)
    assert reference.error(out, ref) < 5e-3


@pytest.mark.parametrize("m,n,k", [(1, 40, 32), (129, 1000, 1000), (517, 2112, 7168)])
def test_int8_exact(m, n, k):
    import cupy

    rng = cupy.random.default_rng(m + n + k)
    a = rng.integers(-127, 128, size=(m, k), dtype=cupy.int8)
    b = rng.integers(-127, 128, size=(n, k), dtype=cupy.int8)
    g = build(m, n, k, dtype="int8")
    out = cupy.full((m, n), -(2**31), dtype=cupy.int32)
    g(a, b, out=out)
    ref = a.astype(cupy.int64) @ b.astype(cupy.int64).T
    assert bool((out.astype(cupy.int64) == ref).all()), g.config.tag


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_int8_scaled(scaling):
    m, n, k = 300, 1000, 2048
    _, _, qa, sa, qb, sb, ref = _problem(m, n, k, "int8", "int8", scaling, seed=17)
    g = build(m, n, k, dtype="int8", scaling=scaling)
    out = reference.poisoned((m, n), "bf16")
    g(qa, qb, scale_a=sa, scale_b=sb, out=out)
    assert reference.error(out, ref) < 5e-3


def test_fp8_torch_tensors_and_functional():
    torch = pytest.importorskip("torch")
    m, n, k = 96, 256, 512
    _, _, qa, sa, qb, sb, ref = _problem(m, n, k, "fp8_e4m3", "fp8_e4m3", "block", seed=19)
    ta = torch.from_dlpack(qa).view(torch.float8_e4m3fn)
    tb = torch.from_dlpack(qb).view(torch.float8_e4m3fn)
    tsa, tsb = torch.from_dlpack(sa), torch.from_dlpack(sb)
    d = gemm(ta, tb, scale_a=tsa, scale_b=tsb, scaling="block")
    assert isinstance(d, torch.Tensor) and d.dtype == torch.bfloat16 and d.shape == (m, n)
    import cupy

    got = cupy.from_dlpack(d.view(torch.int16)).view(cupy.uint16).view(reference.dtypes.numpy_dtype("bf16"))
    assert reference.error(got, ref) < 5e-3


def test_scale_errors_before_launch():
    import cupy

    m, n, k = 64, 128, 256
    _, _, qa, sa, qb, sb, _ = _problem(m, n, k, "fp8_e4m3", "fp8_e4m3", "block", seed=23)
    g = build(m, n, k, dtype="fp8", scaling="block")
    with pytest.raises(TypeError, match="scale_b is required"):
        g(qa, qb, scale_a=sa)
    with pytest.raises(ValueError, match="scale_a has shape"):
        g(qa, qb, scale_a=sa[:, :1], scale_b=sb)
    with pytest.raises(TypeError, match="float32"):
        g(qa, qb, scale_a=sa.astype(cupy.float16), scale_b=sb)
    with pytest.raises(TypeError, match="a has dtype"):
        g(qa.view(cupy.int8), qb, scale_a=sa, scale_b=sb)
    with pytest.raises(TypeError, match="takes no scales"):
        build(m, n, k, dtype="int8")(qa.view(cupy.int8), qb.view(cupy.int8), scale_a=sa)


def test_quantize_then_gemm():
    """The user's path: deepgemm_jit.quantize's outputs go straight into the block-scaled GEMM."""
    import cupy

    import deepgemm_jit as dg

    m, n, k = 333, 1000, 1500
    rng = cupy.random.default_rng(29)
    x = rng.standard_normal((m, k), dtype=cupy.float32)
    w = rng.standard_normal((n, k), dtype=cupy.float32) * cupy.float32(0.05)
    qa, sa = dg.quantize(x, "fp8", "group128")
    qb, sb = dg.quantize(w, "fp8", "block128")
    d = build(m, n, k, dtype="fp8", scaling="block")(qa, qb, scale_a=sa, scale_b=sb)
    ref = (reference.dequantize_reference(qa, sa, "fp8", "group128")
           @ reference.dequantize_reference(qb, sb, "fp8", "block128").T)
    assert reference.error(d, ref) < 5e-3
    assert reference.error(d, _bf16_reference(x, w), "cos") < reference.FP8_COS_BOUND


@pytest.mark.parametrize("n,k", [(300, 1000), (300, 7168), (2112, 1000)])
def test_fp8_single_row_unaligned(n, k):
    """M = 1 with a row pitch (K bytes, or N * 2 bytes of output) that is not a multiple of 16: the tensor map of a
    single row must not inherit the illegal pitch (the torch FP8 Linear hit this with a (1, K) batch)."""
    _, _, qa, sa, qb, sb, ref = _problem(1, n, k, "fp8_e4m3", "fp8_e4m3", "tensor", seed=31)
    out = reference.poisoned((1, n), "bf16")
    build(1, n, k, dtype="fp8", scaling="tensor")(qa, qb, scale_a=sa, scale_b=sb, out=out)
    assert reference.error(out, ref) < 5e-3
