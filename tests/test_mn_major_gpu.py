"""MN-major operands in the Hopper family on the GPU: layouts nn (b (K, N)), tn (a (K, M), b (K, N)) and tt
(a (K, M)) for bf16 / fp16 (docs/experiments/sm90-mn-major.md).

Fresh random inputs, float64 references (reference.reference reads every layout), outputs poisoned with NaN,
DESIGN.md's bound (1e-2 relative Frobenius). M, N, K from {1, 7, 64, 129, 1000, 2112, 4096}: multiples of 8 where
TMA reads the operands in place, others through aligned copies (staging); every call runs the Hopper kernel, and
every check asserts so (expected_hopper).
"""
import itertools
import math
import os

import pytest

import deepgemm_jit as dg
from deepgemm_jit import reference, warmup
from deepgemm_jit.spec import GemmSpec

pytestmark = pytest.mark.gpu

LAYOUTS = ("nn", "tn", "tt")
DTYPES = ("bf16", "fp16")
SIZES = (1, 7, 64, 129, 1000, 2112, 4096)
# (N, K) of the sweep, each run at every M of SIZES by one Gemm (built for M = 4096): both multiples of 8 (TMA reads
# the operands in place), N not (nn / tn: B's (K, N) rows staged), K not (nn / tt: A's or B's rows staged).
NK = [(64, 64), (2112, 4096), (4096, 1000), (1000, 2112), (4096, 4096), (129, 1000), (1000, 129), (7, 7), (1, 64),
      (64, 1)]


FORCED_TILES = [(64, 64, False), (64, 256, False), (128, 192, False), (256, 128, False), (128, 128, True),
                (64, 128, True)]
EPILOGUES = ["bias+gelu", "beta+bias_row+silu+residual", "swiglu"]


@pytest.fixture(scope="module", autouse=True)
def warm_cache():
    """Compile this file's Hopper kernels in parallel processes first (the tests then load them from the disk
    cache): one process compiles one kernel at a time, and this file needs about a hundred and twenty."""
    from deepgemm_jit import config

    product = itertools.product
    lines = [f"4096:{n}:{k}:{dtype}:{layout}" for (n, k), dtype, layout in product(NK, DTYPES, LAYOUTS)]
    lines += [f"64:{n}:{k}:{dtype}:{layout}" for (n, k), dtype, layout in
              product(((2112, 7168), (4096, 1024)), DTYPES, LAYOUTS)]
    lines += [f"256:1000:2112:bf16:{layout}:{out}" for layout, out in product(LAYOUTS, ("bf16", "fp32"))]
    lines += [f"200:1024:1000:bf16:{layout}:epilogue={epi}" for layout, epi in product(LAYOUTS, EPILOGUES)]
    lines += [f"192:320:576:bf16:{layout}" for layout in LAYOUTS] + [f"520:2112:1536:bf16:{layout}" for layout in LAYOUTS]
    lines += ["77:264:512:fp16:tn:epilogue=bias+relu"]
    work = warmup.plan([warmup.parse_shape(line) for line in lines], "sm_90a")
    for layout, (block_m, block_n, pingpong) in product(LAYOUTS, FORCED_TILES):
        spec = GemmSpec.create(328, 1000, dtype="bf16", layout=layout)
        work.append((spec, config.sm90_config(spec, block_m, block_n, pingpong=pingpong)))
    warmup.run(work, "sm_90a", jobs=os.cpu_count() or 4, progress=False)


def hopper_serves(g, a, b, out) -> bool:
    """Whether the call ran g's sm90 kernel rather than a portable variant: none was ever built for g (Gemm._variants
    holds each portable kernel a call ran). Asking Gemm._staged_roles / _artifact_for again re-derived the dispatch
    decision instead of observing it: a call that fell through to a portable kernel despite them passed (review)."""
    return g.family == "sm90" and not g._variants


def expected_hopper(spec: GemmSpec, m: int) -> bool:
    """(16-bit types) Every call runs the Hopper kernel: in place when TMA can describe its operands, on aligned
    copies otherwise (sm90_tiles.sm90_supports, Gemm._staged_roles); the portable kernel only serves graph captures
    before the staging buffers were sized (tests/test_gpu.py)."""
    return True


def check(g, m, a=None, b=None, out=None):
    spec = g.spec
    if a is None:
        a, b = reference.random_operands(spec, m)
    if out is None:
        out = reference.poisoned(spec.out_shape(m), spec.out_dtype)
    result = g(a, b, out=out)
    assert result is out
    err = reference.error(out, reference.reference(spec, a, b))
    case = f"{m=} n={spec.n} k={spec.k} dtype={spec.dtype} layout={spec.layout} cfg={g.config.tag}"
    assert reference.num_nonfinite(out) == 0, case
    assert reference.within_bound(err, spec.dtype), f"{case} err={err:.2e}"
    return hopper_serves(g, a, b, out)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", NK)
def test_sweep(n, k, dtype, layout):
    g = dg.build(4096, n, k, dtype=dtype, layout=layout)
    for m in SIZES:
        served = check(g, m)
        assert served == expected_hopper(g.spec, m), (m, n, k, dtype, layout, g.config.tag)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(2112, 7168), (4096, 1024)])
def test_small_m_kernels(n, k, dtype, layout):
    """Kernels chosen for M <= 64 (split-K where the cost model takes it), called at small and larger M."""
    g = dg.build(64, n, k, dtype=dtype, layout=layout)
    assert g.family == "sm90", g.config.tag
    for m in (1, 7, 64, 129, 1000):
        assert check(g, m) == expected_hopper(g.spec, m), (m, g.config.tag)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("block_m,block_n,pingpong", FORCED_TILES)
def test_forced_tiles(layout, block_m, block_n, pingpong):
    """Every tile shape of the NumPy model (tests/test_mn_major_cpu.py), with tails in M, N and K and whole TMA boxes
    past M / N (M = 200 with 128/256-row tiles, N = 328 with 192/256 columns)."""
    from deepgemm_jit import config

    spec = GemmSpec.create(328, 1000, dtype="bf16", layout=layout)
    cfg = config.sm90_config(spec, block_m, block_n, pingpong=pingpong)
    g = dg.build(200, 328, 1000, dtype="bf16", layout=layout, config=cfg)
    for m in (200, 8, 520):
        assert check(g, m), (m, cfg.tag)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("split_k", [2, 5])
def test_forced_split_k(layout, split_k):
    g = dg.build(64, 1000, 4096, dtype="fp16", layout=layout, split_k=split_k)
    assert g.config.split_k, g.config.tag
    for m in (1, 64, 200):
        assert check(g, m) == expected_hopper(g.spec, m)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("out_dtype", ["bf16", "fp32"])
def test_out_dtypes(layout, out_dtype):
    g = dg.build(256, 1000, 2112, dtype="bf16", out_dtype=out_dtype, layout=layout)
    assert check(g, 256)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_epilogues(layout, epilogue):
    """Fused epilogues do not depend on the operand layout: the same float64 reference as for nt."""
    import cupy

    m, n, k = 200, 1024, 1000
    g = dg.build(m, n, k, dtype="bf16", layout=layout, epilogue=epilogue)
    assert g.family == "sm90"
    epi = g.spec.epi
    rng = cupy.random.default_rng(n + k)
    a = reference.random_matrix(g.spec.a_shape(m), "bf16", rng)
    b = reference.random_matrix(g.spec.b_shape(), "bf16", rng, scale=1.0 / math.sqrt(k))
    n_out = g.spec.n_out
    bias = reference.random_matrix((n if epi.bias == "col" else m,), "bf16", rng) if epi.bias != "none" else None
    c = reference.random_matrix((m, n_out), "bf16", rng) if epi.beta else None
    residual = reference.random_matrix((m, n_out), "bf16", rng) if epi.residual else None
    alpha, beta = (0.5, -1.25) if epi.beta else (1.0, 1.0)
    out = reference.poisoned((m, n_out), "bf16")
    g(a, b, bias=bias, c=c, residual=residual, alpha=alpha, beta=beta, out=out)
    ref = reference.unfused_epilogue(reference.reference(g.spec, a, b), epi, bias, c, residual, alpha, beta)
    err = reference.error(out, ref)
    assert reference.within_bound(err, "bf16"), (layout, epilogue, err, g.config.tag)


def test_epilogue_with_unaligned_m_is_staged():
    """tn with M % 8 != 0 and an epilogue (no portable kernel): A is staged into an aligned copy."""
    m, n, k = 77, 264, 512
    g = dg.build(m, n, k, dtype="fp16", layout="tn", epilogue="bias+relu")
    a = reference.random_matrix((k, m), "fp16")
    b = reference.random_matrix((k, n), "fp16", scale=1.0 / math.sqrt(k))
    bias = reference.random_matrix((n,), "fp16")
    out = reference.poisoned((m, n), "fp16")
    g(a, b, bias=bias, out=out)
    ref = reference.unfused_epilogue(reference.reference(g.spec, a, b), g.spec.epi, bias)
    assert reference.within_bound(reference.error(out, ref), "fp16"), g.config.tag


@pytest.mark.parametrize("layout", LAYOUTS)
def test_padded_views(layout):
    """Row strides wider than the rows: TMA reads them in place when 16-byte multiples; other strides and odd
    offsets run the Hopper kernel on staged copies (Gemm._staged_roles)."""
    m, n, k = 192, 320, 576
    g = dg.build(m, n, k, dtype="bf16", layout=layout)
    (ar, ac), (br, bc) = g.spec.a_shape(m), g.spec.b_shape()
    for pad, off in ((8, 0), (2, 0), (3, 0), (0, 1)):
        a = reference.random_matrix((ar, ac + pad + off), "bf16")[:, off:off + ac]
        b = reference.random_matrix((br, bc + pad + off), "bf16")[:, off:off + bc]
        assert check(g, m, a=a, b=b), (layout, pad, off)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_torch_tensors(layout):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    m, n, k = 520, 2112, 1536
    g = dg.build(m, n, k, dtype="bf16", layout=layout)
    a_shape, b_shape = g.spec.a_shape(m), g.spec.b_shape()
    a = torch.randn(a_shape, device="cuda", dtype=torch.float32).to(torch.bfloat16)
    b = (torch.randn(b_shape, device="cuda", dtype=torch.float32) / math.sqrt(k)).to(torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert g(a, b, out=out) is out
    a64 = a.double() if g.spec.a_k_major else a.double().T
    b64 = b.double().T if g.spec.b_k_major else b.double()
    ref = a64 @ b64
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert math.isfinite(err) and err <= 1e-2, (layout, err, g.config.tag)
    d = g(a, b)  # a new torch tensor
    assert isinstance(d, torch.Tensor) and d.shape == (m, n)
    assert torch.equal(d.view(torch.int16), out.view(torch.int16))  # deterministic: the same bits
