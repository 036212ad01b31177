"""Kernel configurations and the heuristic that picks one (pure Python, no GPU).

A config is everything compile-time about *how* a spec is computed: family, tile
shape, pipeline depth, warp layout and the vector width of global loads.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import dtypes
from .spec import GemmSpec

FAMILIES = ("sm80",)
# Opt-in dynamic shared memory per block on sm_80 / sm_90 (bytes).
SMEM_LIMIT_BYTES = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024, "sm_90": 227 * 1024}


def smem_limit_bytes(arch: str) -> int:
    base = arch.rstrip("a")
    return SMEM_LIMIT_BYTES.get(base, 99 * 1024)


@dataclass(frozen=True)
class KernelConfig:
    family: str
    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    warps_m: int
    warps_n: int
    vec_a: int  # elements per global load of A (16 bytes / element size when aligned)
    vec_b: int

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family={self.family!r} is not one of {FAMILIES}")
        for name in ("block_m", "block_n", "block_k", "num_stages", "warps_m", "warps_n", "vec_a", "vec_b"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.num_stages < 2:
            raise ValueError("num_stages must be >= 2 (the pipeline keeps one stage in flight)")
        if self.block_m % (16 * self.warps_m):
            raise ValueError(f"block_m={self.block_m} is not a multiple of 16 * warps_m={self.warps_m}")
        if self.block_n % (8 * self.warps_n):
            raise ValueError(f"block_n={self.block_n} is not a multiple of 8 * warps_n={self.warps_n}")
        for name in ("vec_a", "vec_b"):
            if getattr(self, name) not in (1, 2, 4, 8):
                raise ValueError(f"{name} must be 1, 2, 4 or 8 elements")

    @property
    def num_threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def tag(self) -> str:
        return (f"{self.family}_m{self.block_m}n{self.block_n}k{self.block_k}_s{self.num_stages}"
                f"_w{self.warps_m}x{self.warps_n}_v{self.vec_a}{self.vec_b}")

    def smem_bytes(self, spec: GemmSpec) -> int:
        """Dynamic shared memory of the sm80 kernel; mirrors GemmSm80::kSmemBytes."""
        esize = dtypes.get(spec.dtype).storage_bytes
        pad = 16 // esize
        a_rows, a_cols = (self.block_m, self.block_k) if spec.a_k_major else (self.block_k, self.block_m)
        b_rows, b_cols = (self.block_n, self.block_k) if spec.b_k_major else (self.block_k, self.block_n)
        stage = a_rows * (a_cols + pad) + b_rows * (b_cols + pad)
        return self.num_stages * stage * esize

    def check_for(self, spec: GemmSpec, arch: str) -> None:
        """Raise ValueError if this config cannot compute `spec` on `arch`."""
        esize = dtypes.get(spec.dtype).storage_bytes
        mma_k = 8 if spec.dtype == "tf32" else 16
        if self.block_k % mma_k:
            raise ValueError(f"block_k={self.block_k} must be a multiple of {mma_k} for {spec.dtype}")
        for name in ("vec_a", "vec_b"):
            vec = getattr(self, name)
            if vec * esize > 16:
                raise ValueError(f"{name}={vec} elements exceeds 16 bytes for {spec.dtype}")
        a_cols = self.block_k if spec.a_k_major else self.block_m
        b_cols = self.block_k if spec.b_k_major else self.block_n
        if a_cols % self.vec_a or b_cols % self.vec_b:
            raise ValueError("tile rows must hold whole vector chunks")
        if self.smem_bytes(spec) > smem_limit_bytes(arch):
            raise ValueError(
                f"config {self.tag} needs {self.smem_bytes(spec)} B of shared memory; "
                f"{arch} allows {smem_limit_bytes(arch)} B: lower num_stages or the block shape")


def max_vector(esize: int, ptr: int, row_stride: int, rows: int) -> int:
    """Widest load (elements, <= 16 bytes) that every row start of a matrix allows.

    A matrix is described by its base pointer and its row stride in elements; a
    vector load of v elements is legal when every row starts v-element aligned.
    """
    vec = 16 // esize
    while vec > 1:
        aligned_ptr = ptr % (vec * esize) == 0
        aligned_rows = rows <= 1 or row_stride % vec == 0
        if aligned_ptr and aligned_rows:
            return vec
        vec //= 2
    return 1


def packed_vectors(spec: GemmSpec) -> tuple[int, int]:
    """Vector widths for freshly allocated, packed operands (256-byte aligned bases)."""
    esize = dtypes.get(spec.dtype).storage_bytes
    a_ld = spec.k if spec.a_k_major else None  # an MN-major A has M as its row length
    b_ld = spec.k if spec.b_k_major else spec.n
    vec_a = max_vector(esize, 0, a_ld, 2) if a_ld is not None else 16 // esize
    vec_b = max_vector(esize, 0, b_ld, 2)
    return vec_a, vec_b


def m_bucket(m: int) -> str:
    """The M buckets the heuristic distinguishes (one compiled config per bucket)."""
    return "small" if m <= 64 else "large"


def choose_config(spec: GemmSpec, m_hint: int, arch: str, vec_a: int | None = None,
                  vec_b: int | None = None) -> KernelConfig:
    """The heuristic choice for the portable family.

    - 128x128 tiles with 8 warps (64x32 per warp) for large M; 64x128 with 4 warps
      when M is small, so that a few M tiles still spread over the SMs.
    - BLOCK_K of 32 for every dtype (64 bytes of 16-bit or 128 bytes of FP32 per
      row), three stages: enough cp.async in flight to hide latency, under 100 KB
      so that two blocks fit per SM.
    - vec_a/vec_b: widest loads the operands allow (packed operands by default).
    """
    if vec_a is None or vec_b is None:
        pa, pb = packed_vectors(spec)
        vec_a = pa if vec_a is None else vec_a
        vec_b = pb if vec_b is None else vec_b
    if m_bucket(m_hint) == "small":
        block_m, warps_m = 64, 1
    else:
        block_m, warps_m = 128, 2
    cfg = KernelConfig(family="sm80", block_m=block_m, block_n=128, block_k=32, num_stages=3,
                       warps_m=warps_m, warps_n=4, vec_a=vec_a, vec_b=vec_b)
    cfg.check_for(spec, arch)
    return cfg
