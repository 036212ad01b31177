"""Run by tests/test_trial_cpu.py in a subprocess: deepgemm_jit.trial's code paths on the CPU, with NumPy standing
in for CuPy (the module is replaced in this process only) and a NumPy float64 product standing in for
reference.reference (cuBLAS DGEMM on the GPU). For every recipe and quantize-on-store kind: the trial's value is the
one its own operands give (computed here from them: the dequantized float64 product, then the unfused epilogue),
the exact answer (as the kernel would store it) is within the trial's bound, and another draw's answer is not."""
import sys
import types

import numpy as np

shim = types.ModuleType("cupy")
for _name in dir(np):
    try:
        setattr(shim, _name, getattr(np, _name))
    except (AttributeError, TypeError):
        pass
shim.random = types.SimpleNamespace(default_rng=np.random.default_rng)
sys.modules["cupy"] = shim

from deepgemm_jit import reference, trial  # noqa: E402
from deepgemm_jit.spec import GemmSpec  # noqa: E402

reference._array_module = lambda x: np


def _product(spec, a, b):
    a64, b64 = reference.to_float64(a), reference.to_float64(b)
    return (a64 if spec.a_k_major else a64.T) @ (b64.T if spec.b_k_major else b64)


reference.reference = _product

CASES = [dict(dtype="fp8_e4m3", scaling="block"), dict(dtype="fp8_e4m3", scaling="tensor", epilogue="bias+gelu"),
         dict(dtype="fp8_e4m3", scaling="row", b_dtype="fp8_e5m2", epilogue="residual"), dict(dtype="int8"),
         dict(dtype="int8", scaling="row", epilogue="bias_row+silu"), dict(dtype="bf16", epilogue="bias+gelu+residual"),
         dict(dtype="fp16", epilogue="beta"), dict(dtype="bf16", epilogue="swiglu"),
         dict(dtype="tf32", layout="nn", epilogue="silu"), dict(dtype="tf32", layout="tt"),
         dict(dtype="fp8_e4m3", scaling="block", epilogue="quant_fp8_g128"),
         dict(dtype="bf16", epilogue="bias+quant_fp8_tensor"), dict(dtype="bf16", epilogue="relu+quant_int8_tensor")]


def stored(t, value):
    """What a right kernel returns for `value` under t's spec (quantize-on-store with t's static scale)."""
    epi = t.spec.epi
    if epi.has_group_scales:
        return reference.quantized_epilogue_reference(value, epi)
    if epi.has_static_scale:
        return reference.quantized_epilogue_reference(value, epi, t.kwargs["quant_scale"])[0]
    return value.astype(np.float32)


GRANULARITIES = {"tensor": ("tensor", "tensor"), "row": ("row", "row"), "block": ("group128", "block128")}


def expected_value(t):
    """The value t's own operands give, computed without trial's composition (a review replaced trial's value by
    -2 x itself and this script still passed: it took its right answer from trial_call)."""
    spec, kw = t.spec, t.kwargs
    a, b = t.a, t.b
    if spec.scaling not in ("none", None) and "scale_a" in kw:
        ga, gb = GRANULARITIES[spec.scaling]
        a = reference.dequantize_reference(a, kw["scale_a"], spec.dtype, ga)
        b = reference.dequantize_reference(b, kw["scale_b"], spec.b_type, gb)
    acc = _product(spec, a, b)
    return reference.unfused_epilogue(acc, spec.epi, kw.get("bias"), kw.get("c"), kw.get("residual"),
                                      kw.get("alpha", 1.0), kw.get("beta", 1.0))


for kw in CASES:
    spec = GemmSpec.create(256, 384, **kw)
    t = trial.trial_call(spec, 37, rng=np.random.default_rng(0))
    other = trial.trial_call(spec, 37, rng=np.random.default_rng(1))
    assert t.value.shape == spec.out_shape(37), kw
    want = expected_value(t)
    assert np.allclose(t.value, want, rtol=1e-12, atol=1e-12 * float(np.abs(want).max())), kw
    right, wrong = t.error(stored(t, t.value)), t.error(stored(t, other.value))
    assert t.within_bound(right), (kw, right, t.bound)
    assert not t.within_bound(wrong), (kw, wrong, t.bound)
    if spec.epi.quant_dtype == "int8":  # an element left as poisoned_outputs filled it counts as unwritten
        hole = stored(t, t.value).copy()
        hole.flat[5] = trial.INT8_POISON
        assert np.isnan(t.error(hole)), kw
    if spec.out_dtype == "int32":  # the exact product: one element off (e.g. left as poisoned) fails, even in a wide D
        hole = stored(t, t.value).copy()
        hole.flat[5] += 1
        assert t.bound == 0 and not t.within_bound(t.error(hole)), kw
    print(f"{kw}: right {right:.2e}, another draw {wrong:.2e}, bound {t.bound:.2e}")
print("ok")
