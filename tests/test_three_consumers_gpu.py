"""192-row sm90 tiles (three consumer warpgroups of 64 rows, 512 threads) on the GPU: forced tiles on shapes with
partial tiles in M and N (a last M block whose third or second and third consumer hold no rows of M; M below one
tile, where A's box shrinks to M), with and without fused epilogues, against float64 references with outputs
poisoned, and bit for bit against the 128-row tile of the same width (each output element goes through the same
wgmma K steps and the same epilogue code; only the tile around it differs)."""
import math

import pytest

from deepgemm_jit import build, reference
from problems import forced_gemm, forced_gemm_or_skip

pytestmark = pytest.mark.gpu

SHAPES = [(1, 200, 512), (193, 264, 1000), (383, 520, 2048), (1050, 2112, 7168), (77, 1001, 520), (450, 4096, 1536)]
TILES = ["192x192", "192x176", "192x128", "192x96", "192x64", "192x192r2"]
CASES = [("bf16", "bf16", "none"), ("fp16", "fp16", "none"), ("bf16", "fp32", "none"), ("bf16", "bf16", "bias+gelu"),
         ("fp16", "bf16", "bias+silu+residual"), ("bf16", "bf16", "bias+swiglu")]


def _run(g, a, b, bias, residual):
    out = reference.poisoned(g.spec.out_shape(a.shape[0]), g.spec.out_dtype)
    assert g(a, b, bias=bias, residual=residual, out=out) is out
    return out


@pytest.mark.parametrize("dtype,out_dtype,epilogue", CASES)
@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_192_row_tiles_match_reference_and_128_row_tiles(m, n, k, tile, dtype, out_dtype, epilogue):
    cupy = pytest.importorskip("cupy")
    if n % 8 and epilogue == "none":
        epilogue = "bias+gelu"  # odd N: a plain 16-bit D is not TMA-legal (staged), the epilogue keeps it in place
    if "swiglu" in epilogue and n % 16:
        pytest.skip("gated units take N a multiple of 16")
    kwargs = dict(dtype=dtype, out_dtype=out_dtype, epilogue=epilogue)
    g = forced_gemm_or_skip(m, n, k, tile, **kwargs)
    assert g.config.block_m == 192 and g.config.num_threads == 512, g.config.tag
    rng = cupy.random.default_rng(m * n + k)
    epi = g.spec.epi
    a = reference.random_matrix((m, k), dtype, rng=rng)
    b = reference.random_matrix((n, k), dtype, rng=rng, scale=1.0 / math.sqrt(k))
    bias = reference.random_matrix((n,), out_dtype, rng=rng) if epi.bias == "col" else None
    residual = reference.random_matrix(g.spec.out_shape(m), out_dtype, rng=rng) if epi.residual else None
    out = _run(g, a, b, bias, residual)
    acc = reference.to_float64(a) @ reference.to_float64(b).T
    ref = reference.unfused_epilogue(acc, epi, bias, None, residual) if g.spec.epilogue != "none" else acc
    err = reference.error(out, ref)
    case = (m, n, k, g.config.tag, dtype, out_dtype, epilogue)
    assert reference.within_bound(err, dtype), (case, err)
    narrow = forced_gemm(m, n, k, "128x" + tile.split("x")[1], **kwargs)
    if isinstance(narrow, str):
        return  # e.g. a ring the 128-row tile cannot take: checked against float64 only
    assert narrow.config.block_m == 128, narrow.config.tag
    assert bool((_run(narrow, a, b, bias, residual) == out).all()), (case, "192- and 128-row tiles differ")


def test_192_row_tile_runs_many_tiles_per_cta():
    """A problem with more 192-row tiles than SMs (each CTA walks several, the ring's phases carry across tiles)."""
    cupy = pytest.importorskip("cupy")
    m, n, k = 4100, 3000, 1032
    g = forced_gemm_or_skip(m, n, k, "192x192", dtype="bf16", epilogue="bias")
    rng = cupy.random.default_rng(7)
    a = reference.random_matrix((m, k), "bf16", rng=rng)
    b = reference.random_matrix((n, k), "bf16", rng=rng, scale=1.0 / math.sqrt(k))
    bias = reference.random_matrix((n,), "bf16", rng=rng)
    out = _run(g, a, b, bias, None)
    ref = reference.unfused_epilogue(reference.to_float64(a) @ reference.to_float64(b).T, g.spec.epi, bias)
    err = reference.error(out, ref)
    assert reference.within_bound(err, "bf16"), (g.config.tag, err)


def test_heuristic_192_row_pick_serves_calls_at_other_m():
    """The cost model's 192-row pick (bf16 2048x2112x7168: 192x176) through build() without config=, called at the
    M it was built for and at others (one row, a partial M block, more tiles than CTAs), out= poisoned each time."""
    cupy = pytest.importorskip("cupy")
    n, k = 2112, 7168
    g = build(2048, n, k, dtype="bf16")
    assert g.config.block_m == 192 and g.config.num_threads == 512, g.config.tag
    rng = cupy.random.default_rng(11)
    b = reference.random_matrix((n, k), "bf16", rng=rng, scale=1.0 / math.sqrt(k))
    b64 = reference.to_float64(b)
    for m in (2048, 1, 191, 4100, 2048):
        a = reference.random_matrix((m, k), "bf16", rng=rng)
        out = _run(g, a, b, None, None)
        err = reference.error(out, reference.to_float64(a) @ b64.T)
        assert reference.within_bound(err, "bf16"), (m, g.config.tag, err)
