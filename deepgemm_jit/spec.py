"""The problem a kernel is compiled for: a frozen, hashable, validated value.

M is deliberately absent: it is a run-time argument of every kernel, so one
compiled kernel serves every M.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

from . import dtypes

LAYOUTS = ("nt", "nn", "tn", "tt")
# BLAS-style letters: the first says how A is stored, the second how B is.
# A: "n" -> a is (M, K) row-major (K contiguous); "t" -> a is (K, M).
# B: "t" -> b is (N, K) row-major (K contiguous, like nn.Linear weights);
#    "n" -> b is (K, N).
# D is always (M, N) row-major.

# N tiles go on grid dimension y (at most 65535 blocks), which bounds N.
MAX_N = 65535 * 64
MAX_DIM = 2**31 - 1


def _check_dim(value: object, arg: str, upper: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{arg} must be an integer, got bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{arg} must be an integer, got {type(value).__name__}") from None
    if v < 1:
        raise ValueError(f"{arg} must be >= 1, got {v}")
    if v > upper:
        raise ValueError(f"{arg}={v} is larger than supported ({upper})")
    return v


@dataclass(frozen=True)
class GemmSpec:
    n: int
    k: int
    dtype: str = "bf16"
    out_dtype: str = "bf16"
    layout: str = "nt"

    def __post_init__(self):
        object.__setattr__(self, "n", _check_dim(self.n, "N", MAX_N))
        object.__setattr__(self, "k", _check_dim(self.k, "K", MAX_DIM))
        object.__setattr__(self, "dtype", dtypes.canonical(self.dtype, arg="dtype", allowed=dtypes.INPUT_DTYPES))
        object.__setattr__(
            self, "out_dtype",
            dtypes.canonical(self.out_dtype, arg="out_dtype", allowed=dtypes.OUTPUT_DTYPES))
        if not isinstance(self.layout, str) or self.layout.lower() not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r} is not supported; choose one of {', '.join(LAYOUTS)}")
        object.__setattr__(self, "layout", self.layout.lower())

    @classmethod
    def create(cls, n, k, dtype="bf16", out_dtype=None, layout="nt") -> "GemmSpec":
        """Spec with `out_dtype` defaulted from `dtype` (fp16->fp16, bf16->bf16, tf32->fp32)."""
        in_name = dtypes.canonical(dtype, arg="dtype", allowed=dtypes.INPUT_DTYPES)
        if out_dtype is None:
            out_dtype = dtypes.DEFAULT_OUT[in_name]
        return cls(n=n, k=k, dtype=in_name, out_dtype=out_dtype, layout=layout)

    @property
    def a_k_major(self) -> bool:
        return self.layout[0] == "n"

    @property
    def b_k_major(self) -> bool:
        return self.layout[1] == "t"

    def a_shape(self, m: int) -> tuple[int, int]:
        return (m, self.k) if self.a_k_major else (self.k, m)

    def b_shape(self) -> tuple[int, int]:
        return (self.n, self.k) if self.b_k_major else (self.k, self.n)

    def out_shape(self, m: int) -> tuple[int, int]:
        return (m, self.n)

    @property
    def tag(self) -> str:
        return f"gemm_{self.dtype}_{self.out_dtype}_{self.layout}_n{self.n}_k{self.k}"
