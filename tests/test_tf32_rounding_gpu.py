"""The kernels that round FP32 operands to TF32 themselves (dgjit/common.cuh tf32_nearest): the decode kernel for
(K, N) weights (gemv_kn, layout nn, M <= 8) and the portable kernel (family sm80, here forced on the H200). Plain
cvt.rna.tf32 turned a finite value within half a TF32 ulp of FLT_MAX into inf, where the sm90 tiles (the tensor
cores' truncation) keep it finite. Each case puts FLT_MAX into the activations or the weight, scales its partners so
that every product stays finite, and checks the result against float64 (the DESIGN.md bound); outputs poisoned
with NaN first. (The split pre-pass of dtype="fp32" is checked bit for bit against the same rule in
test_fp32x3_gpu.py.)"""
import pytest

from deepgemm_jit import build, config, gemv_kn, reference
from deepgemm_jit.spec import GemmSpec

pytestmark = pytest.mark.gpu

NEAR_MAX_BITS = 0x7F7FFFFF   # FLT_MAX: rna rounds it to inf
ROW = 1234                   # the K row that holds it


def _value(bits):
    import cupy

    return cupy.asarray([bits], dtype=cupy.uint32).view(cupy.float32)[0]


def _kernels():
    """(name, m, spec, Gemm) per path: gemv_kn at M = 2 (nn: a (M, K), b (K, N)), the portable kernel at M = 200
    (nt: b (N, K))."""
    nn = GemmSpec.create(4096, 3000, dtype="tf32", out_dtype="fp32", layout="nn")
    nt = GemmSpec.create(520, 3000, dtype="tf32", out_dtype="fp32")
    portable = config.choose_sm80_config(nt, 200, "sm_90a", 4, 4)
    return [("gemv_kn", 2, nn, build(2, 4096, 3000, dtype="tf32", out_dtype="fp32", layout="nn")),
            ("portable", 200, nt, build(200, 520, 3000, dtype="tf32", out_dtype="fp32", config=portable))]


def _weight_row(spec, b, row):
    """The weight's K row `row` (its N values) as a writable view."""
    return b[row, :] if spec.layout == "nn" else b[:, row]


@pytest.mark.parametrize("where", ["activation", "weight"])
def test_near_flt_max_stays_finite(where, plan_calls):
    import cupy

    gemv_kn_launches = plan_calls(gemv_kn)

    for name, m, spec, g in _kernels():
        assert g.config.family == ("sm80" if name == "portable" else "sm90"), name
        a, b = reference.random_operands(spec, m, rng=cupy.random.default_rng(11))
        w = _weight_row(spec, b, ROW)
        if where == "activation":
            a[0, ROW] = _value(NEAR_MAX_BITS)
            w *= 1e-30                     # products ~1e8: finite in FP32
        else:
            w[...] = _value(NEAR_MAX_BITS)
            a[:, ROW] *= 1e-30
        out = reference.poisoned((m, spec.n), "fp32")
        gemv_kn_launches.clear()
        g(a, b, out=out)
        case = f"{name}: FLT_MAX in the {where}s"
        assert reference.num_nonfinite(out) == 0, f"{case}: {reference.num_nonfinite(out)} non-finite outputs"
        err = reference.error(out, reference.reference(spec, a, b))
        assert reference.within_bound(err, "tf32"), f"{case}: err={err:.2e}"
        assert gemv_kn_launches == ([m] if name == "gemv_kn" else []), f"{case}: dispatch"
