"""The unfused float64 reference of a fused epilogue (the formula of ``deepgemm_jit/epilogue.py``):

    D = act(alpha * acc + beta * C + bias) + residual

computed step by step in float64 on whatever array module holds `acc` (CuPy on the GPU, NumPy in the CPU tests).
tests/test_epilogue_gpu.py judges the kernels against the same formula; this copy lets the bench import it
without importing the tests.
"""
from __future__ import annotations

import math

from deepgemm_jit.epilogue import Epilogue


def _array_module(x):
    """(xp, erf) of the module that holds `x`: CuPy (cupyx erf) or NumPy (math.erf, vectorized: no SciPy)."""
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy
        from cupyx.scipy import special

        return cupy, special.erf
    import numpy

    return numpy, numpy.vectorize(math.erf, otypes=[numpy.float64])


def _f64(x):
    from deepgemm_jit import reference

    return reference.to_float64(x)


def activation(name: str, v):
    """float64 `v` through activation `name` (one of ``deepgemm_jit.epilogue.ACTIVATIONS``); gelu is the erf form."""
    xp, erf = _array_module(v)
    if name == "none":
        return v
    if name == "relu":
        return xp.maximum(v, 0.0)
    if name == "gelu":
        return 0.5 * v * (1.0 + erf(v / math.sqrt(2.0)))
    if name == "gelu_tanh":
        return 0.5 * v * (1.0 + xp.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))
    if name == "silu":
        return v / (1.0 + xp.exp(-v))
    if name == "sigmoid":
        return 1.0 / (1.0 + xp.exp(-v))
    raise ValueError(f"activation {name!r} unknown")


def unfused(acc, epi: Epilogue | str, bias=None, c=None, residual=None, alpha: float = 1.0, beta: float = 1.0):
    """act(alpha * acc + beta * C + bias) + residual in float64, from the float64 (M, N) product `acc`.

    bias is (N,) for ``bias`` / (M,) for ``bias_row``; c and residual are (M, N); any storage dtype (upcast
    exactly). alpha and beta apply only with the ``beta`` word (as the kernel's call requires).

    >>> ref = unfused(reference.reference(g.spec, a, b), g.spec.epi, bias=bias, residual=res)
    """
    epi = Epilogue.parse(epi) if isinstance(epi, str) else epi
    v = acc
    if epi.beta:
        v = alpha * v + beta * _f64(c)
    if epi.bias == "col":
        v = v + _f64(bias)[None, :]
    elif epi.bias == "row":
        v = v + _f64(bias)[:, None]
    v = activation(epi.activation, v)
    if epi.residual:
        v = v + _f64(residual)
    return v
