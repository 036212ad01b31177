"""Ping-pong sm90 kernels (the two consumer warpgroups take turns on whole tiles) on the GPU: forced configs of
every operand family, with and without fused epilogues, on odd shapes whose tile counts per CTA are odd and even
(the turn hand-over at the last tile), against float64 references; outputs poisoned."""
import math

import pytest

from deepgemm_jit import build, config, reference
from deepgemm_jit.spec import GemmSpec

pytestmark = pytest.mark.gpu

SHAPES = [(1, 136, 512), (129, 264, 1000), (300, 520, 2048), (1031, 2112, 7168), (4096, 1024, 384)]
TILES = [(128, 128), (64, 256), (64, 128)]


def _forced(m, n, k, block_m, block_n, **kwargs):
    spec = GemmSpec.create(n, k, **kwargs)
    cfg = config.sm90_config(spec, block_m, block_n, pingpong=True)
    try:
        cfg.check_for(spec, "sm_90a")
    except ValueError as exc:
        pytest.skip(f"tile not legal for this spec: {exc}")
    return build(m, n, k, config=cfg, weight_streaming=False, **kwargs)


@pytest.mark.parametrize("block_m,block_n", TILES)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_bf16(m, n, k, block_m, block_n):
    g = _forced(m, n, k, block_m, block_n, dtype="bf16")
    assert g.config.pingpong
    a = reference.random_matrix((m, k), "bf16")
    b = reference.random_matrix((n, k), "bf16", scale=1.0 / math.sqrt(k))
    out = reference.poisoned((m, n), "bf16")
    g(a, b, out=out)
    err = reference.error(out, reference.to_float64(a) @ reference.to_float64(b).T)
    assert reference.within_bound(err, "bf16") and err < 5e-3, (m, n, k, g.config.tag, err)


@pytest.mark.parametrize("epilogue", ["bias+gelu", "beta+bias_row+silu+residual", "gelu_tanh+residual"])
@pytest.mark.parametrize("m,n,k", SHAPES[1:4])
def test_epilogues(m, n, k, epilogue):
    g = _forced(m, n, k, 128, 128, dtype="bf16", epilogue=epilogue)
    epi = g.spec.epi
    a = reference.random_matrix((m, k), "bf16")
    b = reference.random_matrix((n, k), "bf16", scale=1.0 / math.sqrt(k))
    bias = reference.random_matrix((n if epi.bias == "col" else m,), "bf16") if epi.bias != "none" else None
    c = reference.random_matrix((m, n), "bf16") if epi.beta else None
    residual = reference.random_matrix((m, n), "bf16") if epi.residual else None
    alpha, beta = (0.5, -1.25) if epi.beta else (1.0, 1.0)
    out = reference.poisoned((m, n), "bf16")
    g(a, b, bias=bias, c=c, residual=residual, alpha=alpha, beta=beta, out=out)
    acc = reference.to_float64(a) @ reference.to_float64(b).T
    err = reference.error(out, reference.unfused_epilogue(acc, epi, bias, c, residual, alpha, beta))
    assert reference.within_bound(err, "bf16") and err < 5e-3, (epilogue, m, n, k, g.config.tag, err)


@pytest.mark.parametrize("scaling,block_m,block_n", [("tensor", 128, 128), ("row", 128, 128), ("block", 64, 128),
                                                     ("tensor", 64, 176)])
@pytest.mark.parametrize("m,n,k", SHAPES[1:4])
def test_fp8(m, n, k, scaling, block_m, block_n):
    import cupy

    fast = block_m == 128  # promoted FP8 holds two accumulator sets: 128-row ping-pong tiles need fast_accum
    g = _forced(m, n, k, block_m, block_n, dtype="fp8", scaling=scaling, fast_accum=fast and scaling != "block")
    rng = cupy.random.default_rng(m + n + k)
    x = rng.standard_normal((m, k), dtype=cupy.float32)
    w = rng.standard_normal((n, k), dtype=cupy.float32) * cupy.float32(0.05)
    ga, gb = {"tensor": ("tensor", "tensor"), "row": ("row", "row"), "block": ("group128", "block128")}[scaling]
    qa, sa = reference.quantize_reference(x, "fp8_e4m3", ga)
    qb, sb = reference.quantize_reference(w, "fp8_e4m3", gb)
    ref = (reference.dequantize_reference(qa, sa, "fp8_e4m3", ga)
           @ reference.dequantize_reference(qb, sb, "fp8_e4m3", gb).T)
    out = reference.poisoned((m, n), "bf16")
    g(qa, qb, scale_a=sa, scale_b=sb, out=out)
    err = reference.error(out, ref)
    assert err < 5e-3, (scaling, m, n, k, g.config.tag, err)


@pytest.mark.parametrize("m,n,k", SHAPES[1:3])
def test_int8_exact(m, n, k):
    import cupy

    g = _forced(m, n, k, 128, 128, dtype="int8")
    rng = cupy.random.default_rng(n)
    a = rng.integers(-127, 128, (m, k), dtype=cupy.int8)
    b = rng.integers(-127, 128, (n, k), dtype=cupy.int8)
    out = cupy.full((m, n), -(2**31), dtype=cupy.int32)  # -1 is a product value; |sum| <= 2^14 K never reaches this
    g(a, b, out=out)
    assert cupy.array_equal(out, a.astype(cupy.int64) @ b.astype(cupy.int64).T), g.config.tag
