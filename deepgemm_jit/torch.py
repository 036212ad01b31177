"""PyTorch integration: the GEMM as a ``torch.library`` custom op, and a drop-in ``Linear``.

Optional: importing this module needs torch >= 2.4 (``pip install "deepgemm-jit[torch]"``); the rest of
the package never imports it.

    import deepgemm_jit.torch as dgt
    d = dgt.gemm(x, w)                        # x (..., K), w (N, K) CUDA tensors -> (..., N) tensor
    block = dgt.swap_linears(model)           # every bf16/fp16 CUDA nn.Linear -> dgt.Linear

The op ``torch.ops.deepgemm_jit.gemm`` has a fake (meta) implementation, so it traces under
``torch.compile(fullgraph=True)`` and ``torch.export`` without a graph break; it synchronises nothing
with the host and allocates only its output, so it can be captured in a CUDA graph once a call outside
the capture has compiled and loaded the kernel. It has no autograd formula: inference only.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from . import config as config_mod
from . import dtypes
from .api import Gemm, build
from .spec import LAYOUTS

if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
    raise ImportError(f"deepgemm_jit.torch needs torch >= 2.4 (torch.library.custom_op); found {torch.__version__}")

# torch input dtype -> the library's input dtype name (float32 runs on TF32 tensor cores).
_INPUT_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "tf32"}
_OUTPUT_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# Weight dtypes of a dense Linear (TF32 Linears stay with torch: their accuracy contract differs).
_LINEAR_DTYPES = (torch.bfloat16, torch.float16)
FP8_ISSUE = 4  # the FP8 block-scaled GEMM this module's weight_format="fp8_block" waits for


@dataclass(frozen=True)
class _Problem:
    """What one call computes, derived from shapes and dtypes only (real and fake impl share it)."""
    m: int
    n: int
    k: int
    dtype: str            # library input dtype name
    out_dtype: str        # library output dtype name
    layout: str
    out_shape: tuple      # shape of the returned tensor (leading dims of a kept for nt)

    @property
    def torch_out_dtype(self) -> torch.dtype:
        return _OUTPUT_DTYPES[self.out_dtype]


def _problem(a: torch.Tensor, b: torch.Tensor, layout: str, out_dtype: Optional[str]) -> _Problem:
    """Checks the operands against the layout's contract; errors name the argument."""
    if not isinstance(layout, str) or layout.lower() not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not supported; choose one of {', '.join(LAYOUTS)}")
    layout = layout.lower()
    name = _INPUT_DTYPES.get(a.dtype)
    if name is None:
        raise TypeError(f"a has dtype {a.dtype}; pass torch.float16, torch.bfloat16 or torch.float32 (TF32)")
    if b.dtype != a.dtype:
        raise TypeError(f"b has dtype {b.dtype} but a has {a.dtype}; both operands take one dtype")
    out_name = (dtypes.DEFAULT_OUT[name] if out_dtype is None
                else dtypes.canonical(out_dtype, arg="out_dtype", allowed=dtypes.OUTPUT_DTYPES))
    if b.dim() != 2:
        raise ValueError(f"b must be 2-D, got shape {tuple(b.shape)}")
    if layout == "nt":
        if a.dim() < 1:
            raise ValueError("a must have at least one dimension (..., K) for layout 'nt'")
        lead, k = tuple(a.shape[:-1]), a.shape[-1]
        m = 1
        for size in lead:
            m = m * size
    else:
        if a.dim() != 2:
            raise ValueError(f"a must be 2-D for layout {layout!r}, got shape {tuple(a.shape)}; "
                             "only 'nt' flattens leading dimensions")
        m, k = (a.shape[0], a.shape[1]) if layout[0] == "n" else (a.shape[1], a.shape[0])
        lead = (m,)
    n, b_k = (b.shape[0], b.shape[1]) if layout[1] == "t" else (b.shape[1], b.shape[0])
    if b_k != k:
        want = "(N, K)" if layout[1] == "t" else "(K, N)"
        raise ValueError(f"b has shape {tuple(b.shape)}; layout {layout!r} wants b {want} with K={k} "
                         f"(from a of shape {tuple(a.shape)})")
    return _Problem(m, n, k, name, out_name, layout, lead + (n,))


# Built Gemms by (device index, N, K, dtype, layout, out dtype, M bucket): one per problem and bucket.
_built: dict[tuple, Gemm] = {}
_built_lock = threading.Lock()


def _gemm_for(p: _Problem, device_index: int) -> Gemm:
    bucket = config_mod.m_bucket(p.m)
    key = (device_index, p.n, p.k, p.dtype, p.layout, p.out_dtype, bucket)
    g = _built.get(key)
    if g is None:
        with _built_lock:
            g = _built.get(key)
            if g is None:  # the bucket's representative M serves every M of the bucket
                g = build(bucket, p.n, p.k, dtype=p.dtype, out_dtype=p.out_dtype, layout=p.layout)
                _built[key] = g
    return g


@torch.library.custom_op("deepgemm_jit::gemm", mutates_args=())
def _gemm_op(a: torch.Tensor, b: torch.Tensor, layout: str = "nt", out_dtype: Optional[str] = None) -> torch.Tensor:
    p = _problem(a, b, layout, out_dtype)
    if a.device.type != "cuda":
        raise ValueError(f"deepgemm_jit::gemm runs on CUDA tensors; a is on {a.device}")
    with torch.cuda.device(a.device):
        out = torch.empty((p.m, p.n), dtype=p.torch_out_dtype, device=a.device)
        if p.m and p.n:
            a2 = a.reshape(p.m, p.k) if p.layout == "nt" else a  # a view when a's leading dims allow one
            _gemm_for(p, a.device.index)(a2, b, out=out)   # on torch's current stream: Gemm's default for torch
    return out.view(p.out_shape)


@_gemm_op.register_fake
def _gemm_fake(a, b, layout="nt", out_dtype=None):
    p = _problem(a, b, layout, out_dtype)
    return a.new_empty(p.out_shape, dtype=p.torch_out_dtype)


def gemm(a: torch.Tensor, b: torch.Tensor, layout: str = "nt", out_dtype: Optional[str] = None) -> torch.Tensor:
    """d = op(a) @ op(b) on CUDA tensors through ``torch.ops.deepgemm_jit.gemm``; returns a new tensor.

    - ``nt``: a (..., K), b (N, K) -> (..., N) = a @ b.T   (b like ``nn.Linear.weight``; leading dims of a
      are flattened into M and restored, a copy of a only if they cannot be viewed as one)
    - ``nn``: a (M, K), b (K, N) -> (M, N);  ``tn``: a (K, M), b (K, N);  ``tt``: a (K, M), b (N, K)

    a and b share one dtype: float16, bfloat16, or float32 (TF32 tensor cores, FP32 accumulation).
    ``out_dtype`` (``"fp16"``, ``"bf16"``, ``"fp32"``) defaults to a's dtype (float32 for TF32). Both need
    unit stride along their last dimension. Runs on torch's current stream; one kernel per problem and M
    bucket is compiled on first use (do that first call outside CUDA-graph capture). Example::

        y = deepgemm_jit.torch.gemm(x, linear.weight)   # x (2, 37, 256) bf16 -> (2, 37, out_features)
    """
    return torch.ops.deepgemm_jit.gemm.default(a, b, layout, out_dtype)


class Linear(torch.nn.Module):
    """Inference drop-in for ``torch.nn.Linear``: y = x @ weight.T + bias through the deepgemm-jit op.

    x (..., in_features) -> (..., out_features); weight (out_features, in_features) in bfloat16 or float16
    on a CUDA device when called, x of the weight's dtype. Parameters and ``state_dict`` keys are those of
    ``nn.Linear`` (same initialisation). The bias is a separate torch add after the GEMM for now; a
    bias fused into the kernel's epilogue is a later issue. No backward (inference only: run under
    ``torch.inference_mode()`` or ``torch.no_grad()``).

    ``weight_format="bf16"`` (the only one available) uses the 16-bit weight as stored, bf16 or fp16;
    ``"fp8_block"`` (weights quantised once at load) waits for the FP8 GEMM of issue 4.

    Example::

        fast = deepgemm_jit.torch.Linear.from_linear(model.proj)   # shares model.proj.weight
        y = fast(x)                                                # x (batch, seq, in) bf16, CUDA
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype: torch.dtype = torch.bfloat16, weight_format: str = "bf16"):
        super().__init__()
        _check_weight_format(weight_format)
        _check_weight_dtype(dtype)
        self.in_features = in_features
        self.out_features = out_features
        self.weight_format = weight_format
        self.weight = torch.nn.Parameter(torch.empty((out_features, in_features), device=device, dtype=dtype))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        torch.nn.Linear.reset_parameters(self)  # nn.Linear's initialisation, on the same attributes

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, weight_format: str = "bf16") -> "Linear":
        """A Linear holding ``linear``'s own weight and bias Parameters (no copy: same storage)."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"from_linear takes a torch.nn.Linear, got {type(linear).__name__}")
        _check_weight_format(weight_format)
        _check_weight_dtype(linear.weight.dtype)
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features = linear.in_features
        new.out_features = linear.out_features
        new.weight_format = weight_format
        new.weight = linear.weight
        new.bias = linear.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = gemm(x, self.weight, "nt")
        if self.bias is not None:
            y = y.add_(self.bias)
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, weight_format={self.weight_format!r}")


def _check_weight_format(weight_format: str) -> None:
    if weight_format == "fp8_block":
        raise NotImplementedError(f"weight_format='fp8_block' needs the FP8 block-scaled GEMM of issue "
                                  f"{FP8_ISSUE}, not implemented yet; use weight_format='bf16'")
    if weight_format != "bf16":
        raise ValueError(f"weight_format={weight_format!r} is not supported; use 'bf16' (16-bit weights "
                         f"as stored, bf16 or fp16)")


def _check_weight_dtype(dtype: torch.dtype) -> None:
    if dtype not in _LINEAR_DTYPES:
        raise TypeError(f"deepgemm_jit.torch.Linear takes torch.bfloat16 or torch.float16 weights, got {dtype}")


def _on_cuda(name: str, linear: torch.nn.Linear) -> bool:
    return linear.weight.is_cuda


def swap_linears(module: torch.nn.Module,
                 predicate: Optional[Callable[[str, torch.nn.Linear], bool]] = None) -> int:
    """Replace, in place, every ``torch.nn.Linear`` below ``module`` by a :class:`Linear` sharing its weights.

    Only modules of exactly the type ``nn.Linear`` with bfloat16 or float16 weights are candidates
    (subclasses may override ``forward``; other dtypes stay with torch). ``predicate(qualified_name, linear)``
    picks among them; the default takes those whose weight is on a CUDA device. ``module`` itself is
    never replaced (use :meth:`Linear.from_linear`). A Linear reachable under two names is replaced by one
    shared Linear. Returns the number of Linears replaced. Example::

        n = deepgemm_jit.torch.swap_linears(model)                    # model on CUDA, bf16
        n = deepgemm_jit.torch.swap_linears(model, lambda name, m: "mlp" in name)
    """
    choose = predicate or _on_cuda
    # id of a replaced nn.Linear -> (that Linear, kept alive so its id is not reused; its replacement)
    swapped: dict[int, tuple[torch.nn.Linear, Linear]] = {}

    def walk(parent: torch.nn.Module, prefix: str) -> None:
        # _modules, not named_children(): that one hides a module's second name, which must be swapped too.
        for child_name, child in list(parent._modules.items()):
            name = f"{prefix}{child_name}"
            if child is None:
                continue
            if id(child) in swapped:
                setattr(parent, child_name, swapped[id(child)][1])
            elif (type(child) is torch.nn.Linear and child.weight.dtype in _LINEAR_DTYPES
                  and choose(name, child)):
                swapped[id(child)] = (child, Linear.from_linear(child))
                setattr(parent, child_name, swapped[id(child)][1])
            else:
                walk(child, name + ".")

    walk(module, "")
    return len(swapped)


__all__ = ["gemm", "Linear", "swap_linears"]
