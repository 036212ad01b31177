"""The fuzz draw (tests/fuzz.py) on the CPU: deterministic, accepted by build's validation, and wide enough that
the GPU run covers every recipe, layout and epilogue word; the default seeds' kernels compile offline."""
import collections
import itertools

import pytest

import deepgemm_jit as dg
import fuzz
from deepgemm_jit.epilogue import ACTIVATIONS, GATES, QUANTS
from deepgemm_jit.spec import LAYOUTS


def test_draw_is_deterministic():
    assert [fuzz.draw(s) for s in range(20)] == [fuzz.draw(s) for s in range(20)]
    assert len({fuzz.draw(s) for s in range(20)}) == 20


def test_draws_cover_the_api():
    cases = [fuzz.draw(s) for s in range(600)]
    for case in cases:
        case.spec()  # accepted: validation passes
        assert case.m >= 1 and 2.0 * case.m * case.n * case.k <= fuzz.MAX_FLOPS
    assert set(c.recipe for c in cases) == set(fuzz.RECIPES)
    assert set(c.layout for c in cases) == set(LAYOUTS)
    for recipe in ("bf16", "tf32", "fp32"):
        assert {c.layout for c in cases if c.recipe == recipe} == set(LAYOUTS), recipe
    epis = [c.epi for c in cases if c.epilogue]
    assert {e.activation for e in epis} == set(ACTIVATIONS)
    assert {e.gate for e in epis} == set(GATES)
    assert {e.quant for e in epis} == set(QUANTS)
    assert {e.bias for e in epis} == {"none", "col", "row"}
    assert any(e.residual for e in epis) and any(e.beta for e in epis)
    by_m = collections.Counter("decode" if c.m <= 8 else "small" if c.m <= 160 else "large" for c in cases)
    assert min(by_m.values()) >= 60, by_m
    assert any(c.k % 8 for c in cases) and any(c.n % 8 for c in cases)  # rows TMA cannot address as they are
    assert {(c.split_k is not None, c.deterministic) for c in cases} == {(a, b) for a in (0, 1) for b in (0, 1)}
    assert {c.a_pad for c in cases} >= {0, 1, 8, 64} and {c.out_pad for c in cases} >= {-1, 0, 1, 64}
    assert any(c.block_scales_row_major and c.info.scaling == "block" for c in cases)
    assert {c.lead for c in cases} == {0, 1, 2, 3, 5, 8} and any(c.lead and c.out_pad >= 0 for c in cases)
    assert 60 < sum(c.torch_io for c in cases) < 150 and 50 < sum(c.side_stream for c in cases) < 130
    assert not any(c.torch_io and c.side_stream for c in cases)
    forced = [c for c in cases if c.candidate]
    assert 50 < len(forced) < 140 and not any(c.recipe == "fp32" or c.split_k for c in forced)
    assert all(c.build_kwargs()["config"] == c.forced_config() for c in forced)
    ops = [c for c in cases if c.torch_op]
    assert 8 <= len(ops) and all(c.epilogue is None and c.out_pad < 0 and not c.side_stream for c in ops)
    assert {c.info.dtype for c in ops} >= {"bf16", "tf32", "fp8_e4m3"}
    graphs = [c for c in cases if c.graph]
    assert len(graphs) > 40 and all(c.out_pad >= 0 for c in graphs) and any(c.later_ms for c in graphs)
    later = [c for c in cases if c.later_ms]
    assert len(later) > 120 and {len(c.later_ms) for c in later} == {1, 2}
    assert any(c.out_pad >= 0 for c in later) and any(min(c.later_ms) > c.m for c in later)


def test_the_rules_serve_every_draw():
    """draw() runs the heuristic (and its check) on every candidate: 4000 seeds without an exception. It caught
    3xTF32's raw-B tiles picking 56 INT8 columns of D (illegal for a quantize-on-store epilogue) at small M."""
    for seed in range(4000):
        fuzz.draw(seed)


def test_the_rules_serve_every_epilogue_composition():
    """Every recipe, layout and composed epilogue the spec accepts has a tile at decode, small and large M (draws
    reach a composition rarely: seed 11424's TF32 nn bias+geglu+quant_fp8_g128 found none at 64 rows)."""
    served = 0
    for recipe, info in fuzz.RECIPES.items():
        for layout, epilogue in itertools.product(info.layouts, fuzz.epilogue_compositions()):
            for m in (64, 256, 4096):
                served += fuzz.accepted(fuzz.FuzzCase(0, recipe, layout, m, 2896, 3280, None, epilogue, None,
                                                      False, 0, 0, -1, False))
    assert served > 5000  # the spec accepts most compositions: the loop is not vacuous


def test_default_seeds_cover_every_recipe():
    cases = [fuzz.draw(s) for s in range(fuzz.DEFAULT_CASES)]
    assert set(c.recipe for c in cases) == set(fuzz.RECIPES)
    assert sum(1 for c in cases if c.epilogue) >= fuzz.DEFAULT_CASES // 3


def test_edge_cases_cover_every_recipe_and_layout():
    cases = fuzz.edge_cases()
    assert cases == fuzz.edge_cases()  # the GPU test indexes them
    every = {(recipe, layout) for recipe, info in fuzz.RECIPES.items() for layout in info.layouts}
    assert {(c.recipe, c.layout) for c in cases} == every
    assert {c.k for c in cases} == set(fuzz.EDGE_KS) and {c.epilogue for c in cases} == set(fuzz.EDGE_EPILOGUES)
    assert len(cases) > 200


def test_found_cases_compile_offline(shared_cache_dir, monkeypatch):
    """The pinned cases (fuzz.FOUND): accepted, and their kernels compile with no local memory."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    for name, case in fuzz.FOUND.items():
        assert fuzz.accepted(case), name
        g = dg.build(case.m, case.n, case.k, arch=fuzz.ARCH, **case.build_kwargs())
        assert g.explain()["local_bytes"] == 0, name


@pytest.mark.parametrize("first", [pytest.param(first, marks=[pytest.mark.sweep] if first else [])
                                   for first in range(0, fuzz.DEFAULT_CASES, 24)])
def test_default_seeds_compile_offline(first, shared_cache_dir, monkeypatch):
    """build() of each default seed for sm_90a with no GPU (what the GPU run first does), no local memory."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    for seed in range(first, first + 24):
        case = fuzz.draw(seed)
        g = dg.build(case.m, case.n, case.k, arch=fuzz.ARCH, **case.build_kwargs())
        info = g.explain()
        assert info["local_bytes"] == 0, (info["local_bytes"], case.describe())
