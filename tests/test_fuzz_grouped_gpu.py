"""Random grouped calls on the GPU (tests/fuzz_grouped.py): DEEPGEMM_JIT_FUZZ_GROUPED_CASES seeds (default
fuzz_grouped.DEFAULT_CASES, 48) from DEEPGEMM_JIT_FUZZ_GROUPED_FIRST (default 0)."""
import pytest

import fuzz_grouped

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("seed", fuzz_grouped.seeds(), ids=lambda s: f"seed_{s}")
def test_fuzz_grouped_case(seed):
    import cupy

    try:
        fuzz_grouped.run(fuzz_grouped.draw(seed))
    finally:  # a worker's pool kept the float64 references of earlier cases from the other workers (1.8 GB each)
        cupy.get_default_memory_pool().free_all_blocks()
