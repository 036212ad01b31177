"""Problems shared by the GPU tests: quantized operands with their float64 references."""
from deepgemm_jit import reference
from deepgemm_jit.quantization import recipe_granularities


def fp8_problem(m, n, k, scaling, seed, b_dtype="fp8_e4m3"):
    """(qa, sa, qb, sb, ref): N(0, 1) activations (m, k) and N(0, 0.05^2) weights (n, k) quantized to E4M3 / `b_dtype`
    by the FP8 recipe `scaling` (tensor, row or block; scales in the layouts quantize returns), and the float64
    product of the dequantized operands."""
    import cupy

    rng = cupy.random.default_rng(seed)
    x = rng.standard_normal((m, k), dtype=cupy.float32)
    w = rng.standard_normal((n, k), dtype=cupy.float32) * cupy.float32(0.05)
    ga, gb = recipe_granularities(scaling)
    qa, sa = reference.quantize_reference(x, "fp8_e4m3", ga)
    qb, sb = reference.quantize_reference(w, b_dtype, gb)
    ref = (reference.dequantize_reference(qa, sa, "fp8_e4m3", ga)
           @ reference.dequantize_reference(qb, sb, b_dtype, gb).T)
    return qa, sa, qb, sb, ref


def forced_gemm(m, n, k, tile, **kwargs):
    """build(m, n, k, **kwargs) with the sm90 tile 'BMxBN[sS][p][rR][k]' (bench --tiles spelling) forced, or why the
    tile is not legal for the spec (a string: the caller skips, or checks less)."""
    from bench.suites import forced_tile_config
    from deepgemm_jit import build
    from deepgemm_jit.spec import GemmSpec

    spec = GemmSpec.create(n, k, **kwargs)
    try:
        cfg = forced_tile_config(spec, tile)
        cfg.check_for(spec, "sm_90a")
    except ValueError as exc:
        return f"tile not legal for this spec: {exc}"
    return build(m, n, k, config=cfg, weight_streaming=False, **kwargs)


def forced_gemm_or_skip(m, n, k, tile, **kwargs):
    """forced_gemm's Gemm, or a pytest skip naming why the tile is not legal for the spec."""
    import pytest

    g = forced_gemm(m, n, k, tile, **kwargs)
    if isinstance(g, str):
        pytest.skip(g)
    return g
