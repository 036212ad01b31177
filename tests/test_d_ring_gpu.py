"""sm90 kernels whose D leaves through a ring of slices (KernelConfig.d_ring; FP32 D in 64- or 128-byte slices,
16-bit D in 32-byte or wider ones) on the GPU: forced cooperative, ping-pong and split-K tiles on shapes with partial
tiles in M and N (odd N too, through an epilogue, which keeps the sm90 family there), against float64 references
with outputs poisoned, and bit for bit against the same tile with the whole D tile staged (the same math, only the
way out differs)."""
import math
import re

import pytest

from deepgemm_jit import build, config, reference, sm90_rules
from deepgemm_jit.spec import GemmSpec
from problems import forced_gemm, forced_gemm_or_skip

pytestmark = pytest.mark.gpu

SHAPES = [(1, 136, 512), (129, 264, 1000), (300, 520, 2048), (1031, 2112, 7168), (77, 1001, 520)]
TILES = ["128x256r2", "64x96r2", "128x160r3", "64x128pr2", "128x176r4", "128x112r2"]


def _run(g, m, n, k, dtype, seed):
    cupy = pytest.importorskip("cupy")
    rng = cupy.random.default_rng(seed)
    epi = g.spec.epi
    a = reference.random_matrix((m, k), dtype, rng=rng)
    b = reference.random_matrix((n, k), dtype, rng=rng, scale=1.0 / math.sqrt(k))
    bias = {"col": (n,), "row": (m,)}.get(epi.bias)
    bias = None if bias is None else reference.random_matrix(bias, g.spec.out_dtype, rng=rng)
    out = reference.poisoned(g.spec.out_shape(m), g.spec.out_dtype)
    g(a, b, bias=bias, out=out)
    acc = reference.to_float64(a) @ reference.to_float64(b).T
    return out, (reference.unfused_epilogue(acc, epi, bias) if g.spec.epilogue != "none" else acc)


def _check_ring_against_whole_tile(m, n, k, tile, dtype, epilogue, seed):
    """The forced ring tile ('BMxBN[sS][p]rR') within the dtype's bound of float64, and bit for bit equal to the same
    tile with D staged whole (r0, as many stages as fit: the ring's stage count may not). Where the whole tile leaves
    no room for a stage (TF32 128x256 with a bias: what the ring is for), the ring is checked against float64 only."""
    ring = forced_gemm_or_skip(m, n, k, tile, dtype=dtype, epilogue=epilogue)
    whole = forced_gemm(m, n, k, re.sub(r"s\d+", "", tile.split("r")[0]) + "r0", dtype=dtype, epilogue=epilogue)
    assert ring.config.d_ring >= 2, ring.config.tag
    out_ring, ref = _run(ring, m, n, k, dtype, seed=seed)
    err = reference.error(out_ring, ref)
    assert reference.within_bound(err, dtype), (m, n, k, ring.config.tag, err)
    if isinstance(whole, str):
        return
    assert whole.config.d_ring == 0, whole.config.tag
    out_whole, _ = _run(whole, m, n, k, dtype, seed=seed)
    assert bool((out_ring == out_whole).all()), (m, n, k, tile, "ring and whole-tile D differ")


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_tf32_ring_matches_whole_tile_and_reference(m, n, k, tile):
    epilogue = "bias+gelu" if n % 4 else "none"  # odd N: plain TF32 would leave the sm90 family (D not TMA-legal)
    _check_ring_against_whole_tile(m, n, k, tile, "tf32", epilogue, seed=m * n + k)


# 16-bit D: 128- (256, 192, 64x192 ping-pong), 64- (224) and 32-byte slices (240, 176, 112), rings of 2-4.
TILES_16 = ["128x256r2", "128x240s4r2", "128x224s4r4", "128x176s5r2", "128x112r3", "64x192pr2", "128x192s4r2"]
SHAPES_16 = [(1, 136, 512), (129, 264, 1000), (300, 520, 2048), (1031, 2112, 7168), (77, 1000, 520)]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("tile", TILES_16)
@pytest.mark.parametrize("m,n,k", SHAPES_16)
def test_16bit_ring_matches_whole_tile_and_reference(m, n, k, tile, dtype):
    epilogue = ("bias+gelu", "bias_row+silu", "none")[(m + n) % 3]
    _check_ring_against_whole_tile(m, n, k, tile, dtype, epilogue, seed=m * n + k)


@pytest.mark.parametrize("tile", ["128x192r2", "64x96pr2", "128x160r3"])
@pytest.mark.parametrize("m,n,k", [(300, 1040, 2048), (1031, 2112, 520)])
def test_tf32_gated_ring(m, n, k, tile):
    """Gated units halve the D tile (96 / 48 / 80 columns of the tiles above: 128- and 64-byte slices)."""
    _check_ring_against_whole_tile(m, n, k, tile, "tf32", "swiglu", seed=m + n + k)


@pytest.mark.parametrize("m,n,k,epilogue", [(64, 2112, 7168, "none"), (33, 1001, 4096, "bias+gelu"),
                                            (200, 640, 3000, "bias")])
def test_tf32_split_k_ring(m, n, k, epilogue):
    spec = GemmSpec.create(n, k, dtype="tf32", epilogue=epilogue)
    cfg = config.sm90_config(spec, 64, 128, split_k=True, d_ring=2)
    g = build(m, n, k, dtype="tf32", epilogue=epilogue, config=cfg, split_k=3, weight_streaming=False)
    assert g.config.split_k and g.config.d_ring == 2, g.config.tag
    out, ref = _run(g, m, n, k, "tf32", seed=7)
    err = reference.error(out, ref)
    assert reference.within_bound(err, "tf32"), (g.config.tag, err)


def test_bf16_in_fp32_out_ring():
    """Not the heuristic's choice for 16-bit inputs, but a legal config: the same path with BF16 operands."""
    m, n, k = 515, 392, 1000
    g = forced_gemm_or_skip(m, n, k, "128x128r2", dtype="bf16", out_dtype="fp32")
    out, ref = _run(g, m, n, k, "bf16", seed=3)
    err = reference.error(out, ref)
    assert reference.within_bound(err, "bf16") and err < 5e-3, (g.config.tag, err)


def test_heuristic_rings_tf32():
    g = build(4096, 4096, 4096, dtype="tf32")
    assert g.config.family == "sm90" and g.config.d_ring == sm90_rules.SM90_D_RING, g.config.tag
    out, ref = _run(g, 1000, 4096, 4096, "tf32", seed=11)
    assert reference.within_bound(reference.error(out, ref), "tf32")
