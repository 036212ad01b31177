"""cuBLAS baselines computing the same product on the same memory.

Through torch when it imports (cuBLAS/cuBLASLt as PyTorch ships it), otherwise
through CuPy's matmul (cuBLAS) for the types CuPy supports.
"""
from __future__ import annotations

from typing import Callable

from .spec import GemmSpec


def _torch_view(x):
    import cupy
    import torch

    if x.dtype.name == "bfloat16":  # DLPack bfloat16 support varies; bits are bits
        return torch.from_dlpack(x.view(cupy.int16)).view(torch.bfloat16)
    return torch.from_dlpack(x)


def cublas_fn(spec: GemmSpec, a, b, out) -> tuple[str, Callable[[], object]]:
    """(baseline name, zero-argument function writing op(a) @ op(b) into out)."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        ta, tb, td = _torch_view(a), _torch_view(b), _torch_view(out)
        a_mk = ta if spec.a_k_major else ta.t()
        b_kn = tb.t() if spec.b_k_major else tb
        allow_tf32 = spec.dtype == "tf32"
        # torch.mm writes its input dtype: another out_dtype is timed into a scratch buffer.
        target = td if td.dtype == a_mk.dtype else torch.empty(td.shape, dtype=a_mk.dtype, device=td.device)

        def run():
            prev = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = allow_tf32
            try:
                torch.mm(a_mk, b_kn, out=target)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = prev

        name = f"torch{torch.__version__.split('+')[0]}-cublas-{spec.dtype}"
        return name, run
    import cupy

    if a.dtype.name == "bfloat16":
        raise RuntimeError("no cuBLAS baseline for bf16 without torch")
    a_mk = a if spec.a_k_major else a.T
    b_kn = b.T if spec.b_k_major else b
    scratch = cupy.empty(out.shape, dtype=a.dtype)
    return f"cupy-cublas-{a.dtype.name}", lambda: cupy.matmul(a_mk, b_kn, out=scratch)
