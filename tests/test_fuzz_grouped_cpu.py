"""The grouped fuzz draw (tests/fuzz_grouped.py) on the CPU: deterministic, accepted by build_grouped's validation
and tile rules, covering the grouped API; the first seeds' kernels compile offline without local memory."""
import itertools

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
    replays = [c for c in cases if c.replay_sizes]
    assert len(replays) > 60 and {c.grouping for c in replays} == set(fuzz_grouped.GROUPINGS)
    assert all(len(c.replay_sizes) == len(c.sizes) for c in replays)
    assert any(c.grouping == "masked" and max(c.replay_sizes) > c.max_m for c in replays)
    ops = [c for c in cases if c.torch_op]
    assert len(ops) > 10 and {c.grouping for c in ops} == {"offs", "masked"}
    assert all(c.epilogue is None and not c.replay_sizes and c.recipe != "fp8_block_e5m2" for c in ops)


def test_grouped_replay_layouts_fit_the_first_calls_rows():
    """A replay's groups are rewritten into the first call's device metadata: each group's rows lie inside a's rows,
    groups do not overlap, and m_indices names exactly those rows (-1 elsewhere)."""
    import numpy as np

    checked = 0
    for seed in range(400):
        case = fuzz_grouped.draw(seed)
        if not case.replay_sizes:
            continue
        rng = np.random.default_rng(seed)
        _, first, rows = fuzz_grouped._row_spans(case, case.sizes, rng)
        spans, meta, total = fuzz_grouped._row_spans(case, case.replay_sizes, rng, rows)
        assert total == rows and meta.shape == first.shape, case.describe()
        owner = np.full(rows, -1)
        for g, (s, e) in enumerate(spans):
            assert 0 <= s <= e <= rows and (owner[s:e] == -1).all(), case.describe()
            owner[s:e] = g
            if case.grouping == "masked":
                assert e - s == min(case.replay_sizes[g], case.max_m) and s == g * case.max_m
            else:
                assert e - s == case.replay_sizes[g]
        if case.grouping == "m_indices":
            assert (meta == owner).all(), case.describe()
        elif case.grouping == "offs":
            assert list(meta) == [e for _, e in spans], case.describe()
        checked += 1
    assert checked > 60


def test_grouped_rules_serve_every_epilogue_composition():
    """Every composed epilogue build_grouped accepts has a tile at decode, small and large expected M, one group or
    many, short and long K (the 16-bit device-split tile once took 128 columns for swiglu+quant_fp8_g128)."""
    served = 0
    for recipe, epilogue in itertools.product(fuzz_grouped.RECIPES, fuzz.epilogue_compositions()):
        for m, groups, (n, k) in itertools.product((1, 300, 2048), (1, 16), ((2896, 3280), (4096, 7168))):
            served += fuzz_grouped.accepted(fuzz_grouped.GroupedCase(0, recipe, "offs", (m,) * groups, 0, n, k,
                                                                     epilogue, None, m, groups, False, False))
    assert served > 500  # the loop is not vacuous


@pytest.mark.parametrize("first", [0, pytest.param(24, marks=pytest.mark.sweep)])
def test_grouped_seeds_compile_offline(first, shared_cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    for seed in range(first, first + 24):
        case = fuzz_grouped.draw(seed)
        g = dg.build_grouped(case.n, case.k, arch=fuzz.ARCH, **case.build_kwargs())
        info = g.explain()
        assert info["local_bytes"] == 0, (info["local_bytes"], case.describe())
