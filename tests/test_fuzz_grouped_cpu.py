"""The grouped fuzz draw (tests/fuzz_grouped.py) on the CPU: deterministic, accepted by build_grouped's validation
and tile rules, covering the grouped API; the first seeds' kernels compile offline without local memory."""
import pytest

import deepgemm_jit as dg
import fuzz
import fuzz_grouped


def test_grouped_draws_cover_the_api():
    cases = [fuzz_grouped.draw(s) for s in range(400)]
    assert cases[:20] == [fuzz_grouped.draw(s) for s in range(20)]
    assert {c.recipe for c in cases} == set(fuzz_grouped.RECIPES)
    assert {c.grouping for c in cases} == set(fuzz_grouped.GROUPINGS)
    assert {c.epilogue for c in cases} == set(fuzz_grouped.EPILOGUES) | {None}
    sizes = [s for c in cases for s in c.sizes]
    assert 0 in sizes and 1 in sizes and max(sizes) > 512
    assert any(c.grouping == "masked" and max(c.sizes) > c.max_m for c in cases)  # counts past max_m
    assert {c.deterministic for c in cases} == {True, False}
    assert all(c.max_m or sum(c.sizes) > 0 for c in cases)


@pytest.mark.parametrize("first", [0, 24])
def test_grouped_seeds_compile_offline(first, shared_cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    for seed in range(first, first + 24):
        case = fuzz_grouped.draw(seed)
        g = dg.build_grouped(case.n, case.k, arch=fuzz.ARCH, **case.build_kwargs())
        info = g.explain()
        assert info["local_bytes"] == 0, (info["local_bytes"], case.describe())
