"""Run by tests/test_trial_cpu.py in a subprocess: deepgemm_jit.trial's code paths on the CPU, with NumPy standing
in for CuPy (the module is replaced in this process only) and a NumPy float64 product standing in for
reference.reference (cuBLAS DGEMM on the GPU). For every recipe and quantize-on-store kind: the exact answer (as the
kernel would store it) is within the trial's bound, and another draw's answer is not."""
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


for kw in CASES:
    spec = GemmSpec.create(256, 384, **kw)
    t = trial.trial_call(spec, 37, rng=np.random.default_rng(0))
    other = trial.trial_call(spec, 37, rng=np.random.default_rng(1))
    assert t.value.shape == spec.out_shape(37), kw
    right, wrong = t.error(stored(t, t.value)), t.error(stored(t, other.value))
    assert t.within_bound(right), (kw, right, t.bound)
    assert not t.within_bound(wrong), (kw, wrong, t.bound)
    print(f"{kw}: right {right:.2e}, another draw {wrong:.2e}, bound {t.bound:.2e}")
print("ok")
