"""Outputs a call allocates (out, quant_fp8_g128's scales, a grouped call's m_indices segments) come from the pool
of the stream the kernel runs on (arrays.allocating_for). A pool hands a freed block out again to work on the
stream it belongs to, ordered only after that stream's work: a block of the current stream's pool given to a
kernel on another `stream=` could still be read by pending work there.

The probe: a block of the output's size is allocated on the current stream and freed, as a pending kernel's input
would be. A call on the current stream gets that block back (the control: the pool reuses it), a call with
`stream=` another stream must not."""
import numpy as np
import pytest

import deepgemm_jit as dg
from deepgemm_jit import reference

pytestmark = pytest.mark.gpu


def _freed_block_ptr(nbytes: int, kind: str) -> int:
    """The address of a block of `nbytes` allocated on the current stream and freed at once."""
    if kind == "torch":
        import torch

        block = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        ptr = block.data_ptr()
    else:
        import cupy

        block = cupy.empty(nbytes, dtype=cupy.uint8)
        ptr = block.data.ptr
    del block
    return ptr


def _ptr(x) -> int:
    return x.data_ptr() if hasattr(x, "data_ptr") else x.data.ptr


def _nbytes(x) -> int:
    return x.numel() * x.element_size() if hasattr(x, "numel") else x.nbytes


def _streams(kind: str):
    """(name of the case, the stream= argument, a synchronise): None (the current stream) first, the control."""
    if kind == "torch":
        import torch

        other = torch.cuda.Stream()
        return [("current", None, torch.cuda.synchronize), ("other", other, torch.cuda.synchronize)]
    import cupy

    other = cupy.cuda.Stream(non_blocking=True)
    return [("current", None, cupy.cuda.Device().synchronize), ("other", other, cupy.cuda.Device().synchronize)]


def _operands(kind: str, m: int, n: int, k: int, name: str = "bf16"):
    """Random (a, b) of the caller's library."""
    if kind == "torch":
        import torch

        gen = torch.Generator(device="cuda").manual_seed(m + n + k)
        return (torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16),
                (torch.randn(n, k, generator=gen, device="cuda") / k ** 0.5).to(torch.bfloat16))
    import cupy

    rng = cupy.random.default_rng(m + n + k)
    return reference.random_matrix((m, k), name, rng), reference.random_matrix((n, k), name, rng, scale=k ** -0.5)


def _check_placement(call, kind: str, result_of):
    """call(stream) -> result; result_of(result) -> the allocated array whose block is probed."""
    for case, stream, sync in _streams(kind):
        sync()
        first = result_of(call(stream))  # compiles, plans, sizes whatever it keeps
        nbytes = _nbytes(first)
        del first
        sync()
        freed = _freed_block_ptr(nbytes, kind)
        got = result_of(call(stream))
        sync()
        if case == "current":
            assert _ptr(got) == freed, "control: the pool did not hand the freed block back; the probe shows nothing"
        else:
            assert _ptr(got) != freed, "an output for a kernel on stream= came from the current stream's pool"


@pytest.mark.parametrize("kind", ["cupy", "torch"])
def test_dense_out(kind):
    if kind == "torch":
        pytest.importorskip("torch")
    m, n, k = 300, 520, 264
    a, b = _operands(kind, m, n, k)
    g = dg.build(m, n, k, dtype="bf16", weight_streaming=False)
    _check_placement(lambda s: g(a, b, stream=s), kind, lambda out: out)
    if kind == "cupy":  # and the result of a call on stream= is the product
        other = _streams(kind)[1][1]
        out = g(a, b, stream=other)
        other.synchronize()
        ref = reference.to_float64(a) @ reference.to_float64(b).T
        assert reference.within_bound(reference.error(out, ref), "bf16")


def test_quant_g128_out_and_scales():
    m, n, k = 300, 512, 264
    a, b = _operands("cupy", m, n, k)
    g = dg.build(m, n, k, dtype="bf16", epilogue="quant_fp8_g128", weight_streaming=False)
    _check_placement(lambda s: g(a, b, stream=s), "cupy", lambda res: res[0])
    _check_placement(lambda s: g(a, b, stream=s), "cupy", lambda res: res[1].base)  # the M-major storage


def test_fp32_out():
    m, n, k = 300, 264, 136
    a, b = _operands("cupy", m, n, k, "fp32")
    g = dg.build_fp32(m, n, k)
    _check_placement(lambda s: g(a, b, stream=s), "cupy", lambda out: out)


def test_grouped_out():
    import cupy

    n, k, sizes = 256, 128, [100, 0, 77]
    rng = cupy.random.default_rng(3)
    a = reference.random_matrix((sum(sizes), k), "bf16", rng)
    b = reference.random_matrix((len(sizes), n, k), "bf16", rng, scale=1.0 / np.sqrt(k))
    offs = cupy.asarray(np.cumsum(sizes), dtype=cupy.int32)
    g = dg.build_grouped(n, k, dtype="bf16", num_groups=len(sizes))
    _check_placement(lambda s: g(a, b, offs=offs, stream=s), "cupy", lambda out: out)
