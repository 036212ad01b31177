"""Swapped sm90 tiles (KernelConfig.swap_ab: the wgmmas compute each tile transposed, B's rows as the instruction's M)
on the GPU: forced tiles of block_m 8..256 (multiples of 8 that are not multiples of 64 too) on shapes with partial
tiles in M and N, M below one tile (A's box shrinks to M), N not a multiple of 8 (staged D), K below one K block, and
more tiles than CTAs, against float64 references with outputs poisoned, and bit for bit against an unswapped tile
(each output element is the same dot product of an A row and a B row over the same k16 steps; only the operand each
feeds differs). FP8 with per-tensor and per-row scales likewise, promoted (two partial sets up to 128 rows, uneven
halves of the wgmmas' N above) or not (fast_accum), E4M3 x E5M2 (the instruction's operand types swap too). And the
epilogues they take: a column or row bias and an activation, against the unfused float64 reference and bit for bit
against the unswapped tile with the same epilogue."""
import math

import pytest

from deepgemm_jit import reference
from problems import forced_gemm, forced_gemm_or_skip, fp8_problem

pytestmark = pytest.mark.gpu

SHAPES = [(1, 200, 512), (77, 1001, 520), (383, 520, 2048), (1050, 2112, 7168), (450, 4096, 1536), (13, 136, 40),
          (4100, 3000, 1032)]
TILES = ["88x192w", "176x192w", "192x192w", "136x128w", "256x128w", "40x64w", "8x64w", "152x64w"]
CASES = [("bf16", "bf16"), ("fp16", "fp16"), ("bf16", "fp16")]


def _run(g, a, b):
    out = reference.poisoned(g.spec.out_shape(a.shape[0]), g.spec.out_dtype)
    assert g(a, b, out=out) is out
    return out


@pytest.mark.parametrize("dtype,out_dtype", CASES)
@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_swapped_tiles_match_reference_and_unswapped_tiles(m, n, k, tile, dtype, out_dtype):
    cupy = pytest.importorskip("cupy")
    g = forced_gemm_or_skip(m, n, k, tile, dtype=dtype, out_dtype=out_dtype)
    assert g.config.swap_ab and g.config.num_threads == (512 if g.config.block_n == 192 else 384), g.config.tag
    rng = cupy.random.default_rng(m * n + k + len(tile))
    a = reference.random_matrix((m, k), dtype, rng=rng)
    b = reference.random_matrix((n, k), dtype, rng=rng, scale=1.0 / math.sqrt(k))
    out = _run(g, a, b)
    err = reference.error(out, reference.to_float64(a) @ reference.to_float64(b).T)
    case = (m, n, k, g.config.tag, dtype, out_dtype)
    assert reference.within_bound(err, dtype), (case, err)
    plain = forced_gemm(m, n, k, "128x" + tile.split("x")[1].rstrip("w"), dtype=dtype, out_dtype=out_dtype)
    assert not isinstance(plain, str) and not plain.config.swap_ab, plain
    assert bool((_run(plain, a, b) == out).all()), (case, "swapped and unswapped tiles differ")


def test_swapped_tile_serves_calls_at_other_m():
    """One swapped Gemm called at several M (one row, a partial tile, more tiles than CTAs), out= poisoned each
    time: M is a run-time argument of the swapped kernel as of any other."""
    cupy = pytest.importorskip("cupy")
    n, k = 2112, 7168
    g = forced_gemm_or_skip(1050, n, k, "88x192w", dtype="bf16")
    rng = cupy.random.default_rng(5)
    b = reference.random_matrix((n, k), "bf16", rng=rng, scale=1.0 / math.sqrt(k))
    b64 = reference.to_float64(b)
    for m in (1050, 1, 87, 89, 4100, 1050):
        a = reference.random_matrix((m, k), "bf16", rng=rng)
        out = _run(g, a, b)
        err = reference.error(out, reference.to_float64(a) @ b64.T)
        assert reference.within_bound(err, "bf16"), (m, g.config.tag, err)


FP8_SHAPES = [(1, 200, 512), (77, 1001, 528), (383, 520, 2048), (1050, 2112, 7168), (13, 136, 48),
              (4100, 3000, 1040)]
FP8_TILES = ["88x128w", "152x128w", "176x64w", "16x64w", "136x64w", "200x128w"]
FP8_CASES = [("tensor", False, "fp8_e4m3", "bf16"), ("row", False, "fp8_e4m3", "bf16"),
             ("tensor", True, "fp8_e4m3", "fp16"), ("row", False, "fp8_e5m2", "bf16")]


@pytest.mark.parametrize("scaling,fast_accum,b_dtype,out_dtype", FP8_CASES)
@pytest.mark.parametrize("tile", FP8_TILES)
@pytest.mark.parametrize("m,n,k", FP8_SHAPES)
def test_swapped_fp8_tiles_match_reference_and_unswapped_tiles(m, n, k, tile, scaling, fast_accum, b_dtype,
                                                                out_dtype):
    qa, sa, qb, sb, ref = fp8_problem(m, n, k, scaling, seed=m * n + k + len(tile), b_dtype=b_dtype)
    kwargs = dict(dtype="fp8_e4m3", b_dtype=b_dtype, scaling=scaling, fast_accum=fast_accum, out_dtype=out_dtype)
    g = forced_gemm_or_skip(m, n, k, tile, **kwargs)
    assert g.config.swap_ab, g.config.tag

    def run(gemm):
        out = reference.poisoned((m, n), out_dtype)
        assert gemm(qa, qb, scale_a=sa, scale_b=sb, out=out) is out
        return out

    out = run(g)
    err = reference.error(out, ref)
    case = (m, n, k, g.config.tag, scaling, fast_accum, b_dtype, out_dtype)
    assert (err < 3e-2 if fast_accum else reference.within_bound(err, "fp8_e4m3")), (case, err)
    plain = forced_gemm(m, n, k, "128x" + tile.split("x")[1].rstrip("w"), **kwargs)
    assert not isinstance(plain, str) and not plain.config.swap_ab, plain
    assert bool((run(plain) == out).all()), (case, "swapped and unswapped tiles differ")


EPI_SHAPES = [(77, 1001, 528), (1050, 2112, 7168), (4100, 3000, 1040), (13, 136, 48)]
EPI_CASES = [  # (build keywords, tile)
    (dict(dtype="bf16", epilogue="bias+gelu"), "88x192w"),
    (dict(dtype="fp16", epilogue="bias_row+silu"), "152x128w"),
    (dict(dtype="bf16", out_dtype="fp16", epilogue="relu"), "256x128w"),
    (dict(dtype="bf16", epilogue="bias+sigmoid"), "40x64w"),
    (dict(dtype="fp8_e4m3", scaling="tensor", epilogue="bias+gelu"), "152x128w"),
    (dict(dtype="fp8_e4m3", scaling="row", epilogue="bias_row+gelu_tanh"), "88x128w"),
    (dict(dtype="fp8_e4m3", scaling="tensor", fast_accum=True, epilogue="bias"), "200x128w"),
]


@pytest.mark.parametrize("kwargs,tile", EPI_CASES)
@pytest.mark.parametrize("m,n,k", EPI_SHAPES)
def test_swapped_tiles_with_epilogues(m, n, k, kwargs, tile):
    import cupy

    g = forced_gemm_or_skip(m, n, k, tile, **kwargs)
    assert g.config.swap_ab, g.config.tag
    epi, out_dtype = g.spec.epi, g.spec.out_dtype
    rng = cupy.random.default_rng(m + n + k + len(tile))
    fp8 = kwargs["dtype"].startswith("fp8")
    if fp8:
        qa, sa, qb, sb, acc = fp8_problem(m, n, k, kwargs["scaling"], seed=m + n + k)
        operands, bound = dict(a=qa, b=qb, scale_a=sa, scale_b=sb), "fp8_e4m3"
    else:
        a = reference.random_matrix((m, k), kwargs["dtype"], rng)
        b = reference.random_matrix((n, k), kwargs["dtype"], rng, scale=1.0 / math.sqrt(k))
        acc = reference.to_float64(a) @ reference.to_float64(b).T
        operands, bound = dict(a=a, b=b), kwargs["dtype"]
    bias = reference.random_matrix((n if epi.bias == "col" else m,), out_dtype, rng) if epi.bias != "none" else None

    def run(gemm):
        out = reference.poisoned((m, n), out_dtype)
        assert gemm(**operands, bias=bias, out=out) is out
        return out

    out = run(g)
    err = reference.error(out, reference.unfused_epilogue(acc, epi, bias, None, None, 1.0, 1.0))
    case = (m, n, k, g.config.tag, kwargs)
    assert (err < 3e-2 if kwargs.get("fast_accum") else reference.within_bound(err, bound)), (case, err)
    plain = forced_gemm(m, n, k, "128x" + tile.split("x")[1].rstrip("w"), **kwargs)
    assert not isinstance(plain, str) and not plain.config.swap_ab, plain
    assert bool((run(plain) == out).all()), (case, "swapped and unswapped tiles differ")
