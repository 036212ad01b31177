"""CPU tests of the measuring helpers' pure parts (reference bounds, timing statistics, torch FP32 switch)."""
import math
import types

import pytest

from deepgemm_jit import baseline, reference, timing
from deepgemm_jit.spec import GemmSpec


def test_bounds_and_metrics_cover_the_same_dtypes_and_nan_never_passes():
    assert set(reference.ERROR_BOUND) == set(reference.ERROR_METRIC)
    assert reference.within_bound(9e-3, "bf16") and not reference.within_bound(2e-2, "bf16")
    assert not reference.within_bound(math.nan, "fp16") and not reference.within_bound(math.inf, "tf32")


def test_reference_kind_switches_to_sgemm_above_the_fp64_budget():
    spec = GemmSpec.create(8192, 8192, dtype="bf16")
    assert reference.reference_kind(spec, 8192) == "fp64"          # 1.1e12 FLOP
    assert reference.reference_kind(spec, 131072) == "fp32-sgemm"  # 1.76e13 FLOP


def test_percentiles_use_linear_interpolation():
    s = timing.percentiles([float(v) for v in range(30, 0, -1)])
    assert s == pytest.approx({"median_us": 15.5, "min_us": 1.0, "p20_us": 6.8, "p80_us": 24.2})
    with pytest.raises(ValueError):
        timing.percentiles([])


@pytest.mark.parametrize("has_new_api", [True, False])
def test_torch_fp32_mode_sets_and_restores(has_new_api):
    matmul = types.SimpleNamespace(**({"fp32_precision": "none"} if has_new_api else {"allow_tf32": False}))
    torch = types.SimpleNamespace(backends=types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=matmul)))
    attr, before = ("fp32_precision", "none") if has_new_api else ("allow_tf32", False)
    with baseline.torch_fp32_mode(torch, True):
        assert getattr(matmul, attr) == ("tf32" if has_new_api else True)
    assert getattr(matmul, attr) == before
    with pytest.raises(RuntimeError), baseline.torch_fp32_mode(torch, True):
        raise RuntimeError("the product failed")
    assert getattr(matmul, attr) == before
    with baseline.torch_fp32_mode(torch, None):
        assert getattr(matmul, attr) == before
