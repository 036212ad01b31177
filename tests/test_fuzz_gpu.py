"""Random whole calls across the public API on the GPU (tests/fuzz.py): DEEPGEMM_JIT_FUZZ_CASES seeds (default
fuzz.DEFAULT_CASES) from DEEPGEMM_JIT_FUZZ_FIRST, each one build + call checked against float64."""
import pytest

import fuzz

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("seed", fuzz.seeds(), ids=lambda s: f"seed_{s}")
def test_fuzz_case(seed):
    fuzz.run(fuzz.draw(seed))


@pytest.mark.parametrize("name", fuzz.FOUND)
def test_fuzz_found(name):
    """The calls the fuzz found wrong (fuzz.FOUND), pinned."""
    fuzz.run(fuzz.FOUND[name])


@pytest.mark.parametrize("index", range(fuzz.edge_count()), ids=lambda i: f"edge_{i}")
def test_fuzz_edge(index):
    """fuzz.edge_cases: small K, built at decode M, called past a wave of tiles."""
    fuzz.run(fuzz.edge_cases()[index])
