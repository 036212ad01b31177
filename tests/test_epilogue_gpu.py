"""Fused epilogues on the GPU: each one equals the unfused reference (the same product in float64, then the
operations in float64) within the output dtype's bound. Odd shapes (staged operands included); outputs poisoned."""
import math

import pytest

from deepgemm_jit import build, reference

pytestmark = pytest.mark.gpu


CASES = [  # (m, n, k, out_dtype, epilogue)
    (129, 264, 1000, "bf16", "bias+relu"),
    (77, 300, 1003, "bf16", "bias+gelu"),          # N * 2 and K * 2 bytes not multiples of 16: staged operands
    (256, 1024, 512, "fp16", "bias_row+silu"),
    (1, 520, 2048, "bf16", "gelu_tanh+residual"),
    (300, 392, 777, "fp32", "beta+sigmoid"),
    (513, 2112, 1536, "bf16", "beta+bias+gelu+residual"),
]


@pytest.mark.parametrize("m,n,k,out_dtype,epilogue", CASES)
def test_epilogue_matches_unfused(m, n, k, out_dtype, epilogue):
    import cupy

    g = build(m, n, k, dtype="bf16", out_dtype=out_dtype, epilogue=epilogue)
    epi = g.spec.epi
    rng = cupy.random.default_rng(m + n + k)
    a = reference.random_matrix((m, k), "bf16", rng)
    b = reference.random_matrix((n, k), "bf16", rng, scale=1.0 / math.sqrt(k))
    bias = reference.random_matrix((n if epi.bias == "col" else m,), out_dtype, rng) if epi.bias != "none" else None
    c = reference.random_matrix((m, n), out_dtype, rng) if epi.beta else None
    residual = reference.random_matrix((m, n), out_dtype, rng) if epi.residual else None
    alpha, beta = (0.5, -1.25) if epi.beta else (1.0, 1.0)
    out = reference.poisoned((m, n), out_dtype)
    g(a, b, bias=bias, c=c, residual=residual, alpha=alpha, beta=beta, out=out)
    acc = reference.to_float64(a) @ reference.to_float64(b).T
    ref = reference.unfused_epilogue(acc, epi, bias, c, residual, alpha, beta)
    err = reference.error(out, ref)
    assert reference.within_bound(err, "bf16"), (epilogue, m, n, k, out_dtype, err, g.config.tag)


def test_beta_with_c_aliasing_out():
    """D = alpha * acc + beta * D in place (C is out itself)."""
    m, n, k = 200, 264, 512
    g = build(m, n, k, dtype="bf16", epilogue="beta")
    a = reference.random_matrix((m, k), "bf16")
    b = reference.random_matrix((n, k), "bf16", scale=1.0 / math.sqrt(k))
    d = reference.random_matrix((m, n), "bf16")
    before = reference.to_float64(d)
    g(a, b, c=d, alpha=2.0, beta=0.5, out=d)
    ref = 2.0 * (reference.to_float64(a) @ reference.to_float64(b).T) + 0.5 * before
    assert reference.error(d, ref) < 1e-2


@pytest.mark.parametrize("out_dtype", ["bf16", "fp32"])
def test_c_and_residual_views(out_dtype):
    """C a row-padded view (TMA reads it in place), the residual a view at an odd element offset (staged
    through an aligned copy); M, N tails inside the last tiles."""
    m, n, k = 300, 264, 512
    g = build(m, n, k, dtype="bf16", out_dtype=out_dtype, epilogue="beta+bias+residual")
    a = reference.random_matrix((m, k), "bf16")
    b = reference.random_matrix((n, k), "bf16", scale=1.0 / math.sqrt(k))
    bias = reference.random_matrix((n,), out_dtype)
    c = reference.random_matrix((m, n + 24), out_dtype)[:, 8:n + 8]
    residual = reference.random_matrix((m, n + 1), out_dtype)[:, 1:]
    out = reference.poisoned((m, n), out_dtype)
    g(a, b, bias=bias, c=c, residual=residual, alpha=0.75, beta=1.5, out=out)
    acc = reference.to_float64(a) @ reference.to_float64(b).T
    ref = reference.unfused_epilogue(acc, g.spec.epi, bias, c, residual, 0.75, 1.5)
    assert reference.within_bound(reference.error(out, ref), "bf16"), g.config.tag


def test_fp8_block_and_int8_row_with_epilogues():
    import cupy

    m, n, k = 257, 520, 1024
    rng = cupy.random.default_rng(5)
    x = rng.standard_normal((m, k), dtype=cupy.float32)
    w = rng.standard_normal((n, k), dtype=cupy.float32) * cupy.float32(1.0 / math.sqrt(k))
    bias = reference.random_matrix((n,), "bf16", rng)
    for dtype, scaling, ga, gb, epilogue in (("fp8_e4m3", "block", "group128", "block128", "bias+gelu"),
                                             ("int8", "row", "row", "row", "bias+silu")):
        qa, sa = reference.quantize_reference(x, dtype, ga)
        qb, sb = reference.quantize_reference(w, dtype, gb)
        acc = reference.dequantize_reference(qa, sa, dtype, ga) @ reference.dequantize_reference(qb, sb, dtype, gb).T
        g = build(m, n, k, dtype=dtype, scaling=scaling, epilogue=epilogue)
        out = reference.poisoned((m, n), "bf16")
        g(qa, qb, scale_a=sa, scale_b=sb, bias=bias, out=out)
        ref = reference.unfused_epilogue(acc, g.spec.epi, bias, None, None, 1.0, 1.0)
        assert reference.error(out, ref) < 1e-2, (dtype, epilogue)


def test_epilogue_argument_errors():
    import cupy

    m, n, k = 64, 128, 256
    g = build(m, n, k, dtype="bf16", epilogue="bias+residual")
    a = reference.random_matrix((m, k), "bf16")
    b = reference.random_matrix((n, k), "bf16")
    bias = reference.random_matrix((n,), "bf16")
    res = reference.random_matrix((m, n), "bf16")
    with pytest.raises(TypeError, match="bias is required"):
        g(a, b, residual=res)
    with pytest.raises(TypeError, match="c= was given"):
        g(a, b, bias=bias, residual=res, c=res)
    with pytest.raises(ValueError, match="bias has shape"):
        g(a, b, bias=bias[:10], residual=res)
    with pytest.raises(TypeError, match="like the output"):
        g(a, b, bias=bias.view(cupy.uint16).astype(cupy.float32), residual=res)
    with pytest.raises(TypeError, match="alpha"):
        g(a, b, bias=bias, residual=res, alpha=2.0)
    with pytest.raises(ValueError, match="residual has shape"):
        g(a, b, bias=bias, residual=res[:10])


def test_beta_zero_does_not_read_c():
    """BLAS semantics: with beta = 0, C is not read, so NaN in C (an unwritten out used as C) does not propagate."""
    m, n, k = 100, 264, 256
    g = build(m, n, k, dtype="bf16", epilogue="beta")
    a = reference.random_matrix((m, k), "bf16")
    b = reference.random_matrix((n, k), "bf16", scale=1.0 / math.sqrt(k))
    d = reference.poisoned((m, n), "bf16")
    g(a, b, c=d, alpha=1.5, beta=0.0, out=d)
    ref = 1.5 * (reference.to_float64(a) @ reference.to_float64(b).T)
    assert reference.error(d, ref) < 1e-2
