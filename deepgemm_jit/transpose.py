"""The transposing copy behind TF32 GEMMs with MN-major operands (layouts nn, tn, tt) on Hopper.

Hopper's TF32 WGMMA reads K-major operands only, so such a GEMM builds the Hopper kernel of its ``nt`` twin
(``config.kernel_spec``) and every call copies its MN-major operands, (K, M) / (K, N), into K-major buffers of the
Gemm (staging.py) with this kernel first: one launch per operand, 32 x 32 tiles through shared memory. The copy
reads and writes each operand once (4096 x 4096 FP32: 64 MB each way), far less than the portable kernel loses on
such layouts (docs/NOTES.md, session 25).

Example::

    step = transpose.plan(dst_view, src_view, device_id)   # dst (C, R) = src (R, C) transposed
    step.run(stream)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from . import cubin, jit, runtime
from .arrays import MatrixView
from .launch import LaunchPlan
from .render import RenderedSource, render

TILE = 32           # mirror of the kernel's kTile (checked against its exported symbol)
ROWS_PER_PASS = 8   # ... and kRowsPerPass: the block is (TILE, ROWS_PER_PASS) threads
SYMBOLS = ("tile", "rows_per_pass")
_TEMPLATE = "transpose.cu.j2"
_MAX_GRID = 2**31 - 1


@dataclass(frozen=True)
class TransposeSpec:
    """What a transpose kernel is compiled for: the element size (shapes, strides and pointers are arguments)."""

    itemsize: int = 4

    def __post_init__(self):
        if self.itemsize not in (2, 4):
            raise ValueError(f"transpose itemsize must be 2 or 4 bytes, got {self.itemsize}")

    @property
    def entry(self) -> str:
        return f"dgjit_transpose_b{8 * self.itemsize}"

    @property
    def tag(self) -> str:
        return f"transpose_b{8 * self.itemsize}"


@dataclass(frozen=True)
class TransposeArtifact(jit.BuiltKernel):
    """A compiled transpose kernel: the cached cubin and what it was built for."""

    spec: TransposeSpec
    arch: str


_memo: jit.Memo[TransposeArtifact] = jit.Memo()


def render_kernel(spec: TransposeSpec) -> RenderedSource:
    return render(_TEMPLATE, spec.entry, spec=spec, tag=spec.tag)


def get_kernel(spec: TransposeSpec, arch: str) -> TransposeArtifact:
    """The transpose kernel of `spec` for `arch`: from the in-process memo, the disk cache, or NVRTC (once)."""
    return _memo.get((spec, arch), lambda: _build(spec, arch))


def clear_memo() -> None:
    _memo.clear()


def _build(spec: TransposeSpec, arch: str) -> TransposeArtifact:
    built = jit.build_artifact(render_kernel(spec), arch, spec_tag=spec.tag,
                               meta={"transpose_spec": dataclasses.asdict(spec)})
    artifact = TransposeArtifact(**vars(built), spec=spec, arch=arch)
    check_symbols(artifact)
    return artifact


def check_symbols(artifact: TransposeArtifact) -> None:
    """This module's mirror of the tile must be the kernel's (a mismatch is a bug, caught before any launch)."""
    sym = cubin.entry_symbols(artifact.cubin, artifact.entry, SYMBOLS)
    if sym != {"tile": TILE, "rows_per_pass": ROWS_PER_PASS}:
        raise RuntimeError(f"{artifact.entry} exports {sym}, transpose.py mirrors tile {TILE}, rows {ROWS_PER_PASS}")


def grid(rows: int, cols: int) -> tuple[int, int, int]:
    """One block per 32 x 32 tile of the source."""
    blocks = -(-rows // TILE) * -(-cols // TILE)
    if blocks > _MAX_GRID:
        raise ValueError(f"a {rows} x {cols} transpose needs {blocks} blocks, more than one launch takes")
    return (max(blocks, 1), 1, 1)


def plan(dst: MatrixView, src: MatrixView, arch: str, device_id: int) -> LaunchPlan:
    """The launch that writes dst (C, R) = src (R, C) transposed (same element size; any row strides)."""
    if (dst.rows, dst.cols) != (src.cols, src.rows) or dst.itemsize != src.itemsize:
        raise ValueError(f"transpose: dst {dst.rows}x{dst.cols} ({dst.itemsize} B) is not src {src.rows}x{src.cols} "
                         f"({src.itemsize} B) transposed")
    artifact = get_kernel(TransposeSpec(src.itemsize), arch)
    kernel = runtime.loaded_kernel(artifact, device_id, 0)
    args = (np.uint64(src.ptr), np.int64(src.row_stride), np.uint64(dst.ptr), np.int64(dst.row_stride),
            np.uint32(src.rows), np.uint32(src.cols), np.uint32(-(-src.cols // TILE)))
    return LaunchPlan(kernel, grid(src.rows, src.cols), (TILE, ROWS_PER_PASS, 1), args, device_id)
