"""Edge maps on the GPU (GemmSm90::EdgeMaps, launch.edge_maps): the tiles of a partial last M block (M larger than
one tile) and of a partial last N block load A / B through maps whose boxes end at the tensor, leaving the stage's
rows past it unwritten. Forced tiles of every dtype family at M and N with partial last blocks: within the dtype's
bound of the float64 reference (INT8: exact), the rows below M bit for bit what the same kernel writes for them when
A has whole tiles of rows (so A's edge map changes nothing but the load), and the output rows past M untouched."""
import numpy as np
import pytest

from bench import dtypes as bench_dtypes
from bench import runner
from bench.suites import forced_tile_config, parse_tile
from deepgemm_jit import build, reference
from deepgemm_jit.baseline import EpilogueOperands, Scaling
from deepgemm_jit.spec import GemmSpec

pytestmark = pytest.mark.gpu

K = 1536
# (bench dtype, tile in bench --tiles spelling, epilogue)
CASES = [
    ("bf16", "128x128", None),
    ("bf16", "64x128", None),
    ("bf16", "128x240s4r2", None),  # wider than launch.A_EDGE_MAX_BLOCK_N: whole A boxes, B's edge map
    ("bf16", "128x128p", "bias+gelu"),
    ("bf16", "64x56k", None),
    ("fp16", "128x176", None),
    ("tf32", "128x128", None),
    ("fp8_tensor", "128x176", None),
    ("fp8_row", "128x176", None),
    ("fp8_block", "128x176", None),
    ("fp8_block", "128x128", "quant_fp8_g128"),
    ("int8", "128x128", None),
    # The last M block's second consumer has no rows below M at these M (extra <= 64 rows past whole tiles) and
    # passes its stages back without wgmmas (GemmSm90::rows_idle), in every cooperative case above and with a
    # split-K tile, 256-row tiles (two m64 slices per consumer) and C and residual tiles loaded during the main loop.
    ("bf16", "128x128k", None),
    ("bf16", "256x128", None),
    ("bf16", "128x176", "beta+bias+residual"),
]


def _rows_of(scaling: Scaling | None, m: int) -> dict:
    """The call's scale arguments for the first m rows of A (per-tensor scales are shared)."""
    if scaling is None:
        return {}
    sa = scaling.scale_a if scaling.recipe == "tensor" else scaling.scale_a[:m]
    return {"scale_a": sa, "scale_b": scaling.scale_b}


def _bits(x):
    cupy = pytest.importorskip("cupy")
    return cupy.asnumpy(cupy.ascontiguousarray(x).view(cupy.uint8))


@pytest.mark.parametrize("extra", [1, 16, 63])
@pytest.mark.parametrize("name,tile,epilogue", CASES)
def test_edge_tiles_match_reference_and_whole_rows(name, tile, epilogue, extra):
    cupy = pytest.importorskip("cupy")
    info = bench_dtypes.get(name)
    block_m, block_n, *_ = parse_tile(tile)
    quant = epilogue == "quant_fp8_g128"
    n = 3 * (128 if quant else block_n) + 40  # a partial last N block
    m = 2 * block_m + extra  # a partial last M block after two whole ones
    m_whole = 3 * block_m
    spec = GemmSpec.create(n, K, dtype=info.lib, scaling=info.scaling, epilogue=epilogue)
    cfg = forced_tile_config(spec, tile)
    cfg.check_for(spec, "sm_90a")
    g = build(m, n, K, dtype=info.lib, scaling=info.scaling, epilogue=epilogue, config=cfg, weight_streaming=False)
    rng = cupy.random.default_rng(1000 * extra + block_n)
    inputs = runner.operands(info, spec, m_whole, rng, b_scale=1.0 / K ** 0.5)
    ops = runner.epilogue_operands(spec, m_whole, rng)
    rows = EpilogueOperands(bias=ops.bias, c=None if ops.c is None else ops.c[:m],
                            residual=None if ops.residual is None else ops.residual[:m], alpha=ops.alpha, beta=ops.beta)
    if quant:  # (q, scales): poisoned, against float64 within the FP8 bound, and bit for bit the whole-rows call's
        q_whole, s_whole = g(inputs.a, inputs.b, **_rows_of(inputs.scaling, m_whole))
        q = cupy.full((m, spec.n_out), 0xFF, dtype=cupy.uint8)  # an E4M3 NaN: never written from finite values
        s = cupy.full((m, -(-spec.n_out // 128)), cupy.nan, dtype=cupy.float32)
        g(inputs.a[:m], inputs.b, out=q, scales_out=s, **_rows_of(inputs.scaling, m))
        cupy.cuda.get_current_stream().synchronize()
        assert not bool((q == 0xFF).any()) and not bool(cupy.isnan(s).any()), (tile, m, "unwritten")
        deq = reference.dequantize_reference(q, s, "fp8_e4m3", "group128")
        err = reference.error(deq, runner.apply_epilogue(inputs.ref[:m], spec.epi, rows))
        assert reference.within_bound(err, "fp8_e4m3"), (tile, m, n, err)
        assert np.array_equal(_bits(q), _bits(q_whole[:m])) and np.array_equal(_bits(s), _bits(s_whole[:m])), (tile, m)
        return
    out_whole = reference.poisoned(spec.out_shape(m_whole), spec.out_dtype)
    g(inputs.a, inputs.b, out=out_whole, **ops.call_kwargs(spec.epi), **_rows_of(inputs.scaling, m_whole))
    # The call under test writes the first m rows of a larger poisoned buffer; the rows past m must stay as they were.
    big = reference.poisoned((m + 8, spec.n_out), spec.out_dtype)
    before = _bits(big[m:])
    out = big[:m]
    g(inputs.a[:m], inputs.b, out=out, **rows.call_kwargs(spec.epi), **_rows_of(inputs.scaling, m))
    cupy.cuda.get_current_stream().synchronize()
    assert np.array_equal(_bits(big[m:]), before), (tile, m, "rows past M were written")
    ref = runner.apply_epilogue(inputs.ref[:m], spec.epi, rows)
    if inputs.is_exact:
        assert bool((out == ref.astype(out.dtype)).all()), (tile, m, n)
    else:
        err = reference.error(out, ref)
        assert reference.within_bound(err, spec.dtype), (tile, m, n, err)
    if not cfg.split_k:  # (a split-K call's share count may differ between m and m_whole rows)
        assert np.array_equal(_bits(out), _bits(out_whole[:m])), (tile, m, n, "rows below M differ from whole rows")
