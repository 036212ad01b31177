"""The copies behind staged calls (Gemm._staged_plan, staging.py): rows into or out of 128-byte-pitched buffers, and
the transposing copy of TF32 GEMMs with MN-major operands.

- ``rows``: operands TMA cannot describe (row pitch or base not a multiple of 16 bytes) are copied row by row into
  the Gemm's aligned buffers, and D out of one. cudaMemcpy2DAsync ran these copies at ~0.35 TB/s (4096 x 4096 x
  4100 BF16: 363 us staged against ~178 for the GEMM, docs/NOTES.md session 25); this kernel reads with aligned
  16-byte loads and funnel shifts and stores as wide as the destination allows. One launch makes up to
  MAX_ROW_COPIES copies (a call's A, B, C, residual): at tiny sizes each launch costs ~3 us.
- ``transpose``: Hopper's TF32 WGMMA reads K-major operands only, so a TF32 GEMM in layouts nn / tn / tt builds the
  Hopper kernel of its nt twin (``sm90_rules.kernel_spec``; at small M nn's own kernel, tn's nn twin, which transpose B
  in shared memory) and every call copies the MN-major operands that kernel cannot read, (K, M) / (K, N), into
  K-major buffers with this kernel first: 32 x 32 tiles through shared memory.

Example::

    step = copies.transpose_plan(dst_view, src_view, arch, device_id)   # dst (C, R) = src (R, C) transposed
    step = copies.rows_plan([(dst_a, src_a), (dst_b, src_b)], arch, device_id)  # dst = src, any pitches
    step.run(stream)
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from . import cubin, jit, runtime
from .arrays import MatrixView
from .launch import LaunchPlan
from .render import RenderedSource

KINDS = ("transpose", "rows")
TILE = 32            # transpose: the kernel's kTile (a 32 x 32 tile per block of (TILE, 8) threads)
TRANSPOSE_THREADS = 256
CHUNK = 16           # rows: bytes per thread (the kernel's kChunk)
ROWS_THREADS = 256
MAX_ROW_COPIES = 4   # rows: copies per launch (the kernel's kMaxCopies)
SYMBOLS = ("tile", "threads", "copies")
# rows: the kernel's RowCopy (src, dst, src_pitch, dst_pitch: 8 bytes each; rows, row_bytes, chunks, block_end) and
# RowCopies (MAX_ROW_COPIES of them, then the count, padded to the struct's 8-byte alignment).
_ROW_COPY = struct.Struct("<QQqqIIII")
_ROW_COPIES_BYTES = -(-(MAX_ROW_COPIES * _ROW_COPY.size + 4) // 8) * 8
_TEMPLATE = "copies.cu.j2"
_MAX_GRID = 2**31 - 1
MAX_ROW_BYTES = 2**32 - 1  # rows: the kernel's RowCopy.row_bytes is 32 bits


@dataclass(frozen=True)
class CopySpec:
    """What a copy kernel is compiled for: its kind and element size (shapes, strides and pointers are arguments;
    the rows kernel copies bytes, itemsize 1)."""

    kind: str = "rows"
    itemsize: int = 1

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"copy kind must be one of {KINDS}, got {self.kind!r}")
        allowed = (2, 4) if self.kind == "transpose" else (1,)
        if self.itemsize not in allowed:
            raise ValueError(f"a {self.kind} copy takes itemsize {allowed}, got {self.itemsize}")

    @property
    def entry(self) -> str:
        return f"dgjit_{self.tag}"

    @property
    def tag(self) -> str:
        return f"transpose_b{8 * self.itemsize}" if self.kind == "transpose" else "copy_rows"

    @property
    def mirror(self) -> dict[str, int]:
        """The sizes the kernel exports (check_symbols)."""
        if self.kind == "transpose":
            return {"tile": TILE, "threads": TRANSPOSE_THREADS, "copies": 1}
        return {"tile": CHUNK, "threads": ROWS_THREADS, "copies": MAX_ROW_COPIES}


ROWS = CopySpec("rows", 1)


@dataclass(frozen=True)
class CopyArtifact(jit.BuiltKernel):
    """A compiled copy kernel: the cached cubin and what it was built for."""

    spec: CopySpec
    arch: str


# Each new copy kernel is checked against this module's mirror of its sizes (check_symbols, defined below).
_family: jit.KernelFamily[CopyArtifact] = jit.KernelFamily(_TEMPLATE, CopyArtifact, "copy_spec",
                                                            check=lambda artifact: check_symbols(artifact))


def render_kernel(spec: CopySpec) -> RenderedSource:
    return _family.render(spec)


def get_kernel(spec: CopySpec, arch: str) -> CopyArtifact:
    """The copy kernel of `spec` for `arch`: from the in-process memo, the disk cache, or NVRTC (once)."""
    return _family.get(spec, arch)


def clear_memo() -> None:
    _family.clear()


def check_symbols(artifact: CopyArtifact) -> None:
    """This module's mirror of the kernel's sizes must be the kernel's (a mismatch is a bug, caught before any
    launch)."""
    sym = cubin.entry_symbols(artifact.cubin, artifact.entry, SYMBOLS)
    if sym != artifact.spec.mirror:
        raise RuntimeError(f"{artifact.entry} exports {sym}, copies.py mirrors {artifact.spec.mirror}")


def _grid(blocks: int, what: str) -> tuple[int, int, int]:
    if blocks > _MAX_GRID:
        raise ValueError(f"{what} needs {blocks} blocks, more than one launch takes")
    return (max(blocks, 1), 1, 1)


def transpose_plan(dst: MatrixView, src: MatrixView, arch: str, device_id: int) -> LaunchPlan:
    """The launch that writes dst (C, R) = src (R, C) transposed (same element size; any row strides)."""
    if (dst.rows, dst.cols) != (src.cols, src.rows) or dst.itemsize != src.itemsize:
        raise ValueError(f"transpose: dst {dst.rows}x{dst.cols} ({dst.itemsize} B) is not src {src.rows}x{src.cols} "
                         f"({src.itemsize} B) transposed")
    kernel = runtime.loaded_kernel(get_kernel(CopySpec("transpose", src.itemsize), arch), device_id, 0)
    tiles_c = -(-src.cols // TILE)
    args = (np.uint64(src.ptr), np.int64(src.row_stride), np.uint64(dst.ptr), np.int64(dst.row_stride),
            np.uint32(src.rows), np.uint32(src.cols), np.uint32(tiles_c))
    grid = _grid(-(-src.rows // TILE) * tiles_c, f"a {src.rows} x {src.cols} transpose")
    return LaunchPlan(kernel, grid, (TILE, TRANSPOSE_THREADS // TILE, 1), args, device_id, waits=True)


def rows_plan(pairs: list[tuple[MatrixView, MatrixView]], arch: str, device_id: int) -> LaunchPlan:
    """The launch that copies each (dst, src) pair's rows, src into dst (same shape and element size; any pitches
    and bases): 1 to MAX_ROW_COPIES pairs, one launch."""
    if not 1 <= len(pairs) <= MAX_ROW_COPIES:
        raise ValueError(f"a row copy launch takes 1 to {MAX_ROW_COPIES} copies, got {len(pairs)}")
    packed, blocks = [], 0
    for dst, src in pairs:
        if (dst.rows, dst.cols, dst.itemsize) != (src.rows, src.cols, src.itemsize):
            raise ValueError(f"row copy: dst {dst.rows}x{dst.cols} ({dst.itemsize} B) is not src's shape "
                             f"{src.rows}x{src.cols} ({src.itemsize} B)")
        row_bytes = src.cols * src.itemsize
        if row_bytes > MAX_ROW_BYTES:
            raise ValueError(f"row copy: rows of {row_bytes} bytes, more than the copy kernel takes ({MAX_ROW_BYTES})")
        chunks = max(1, -(-row_bytes // CHUNK))
        blocks += -(-src.rows * chunks // ROWS_THREADS)
        if blocks > _MAX_GRID:
            raise ValueError(f"row copies up to {src.rows} x {row_bytes} bytes need {blocks} blocks, more than one "
                             "launch takes")
        packed.append(_ROW_COPY.pack(src.ptr, dst.ptr, src.row_stride * src.itemsize, dst.row_stride * dst.itemsize,
                                     src.rows, row_bytes, chunks, blocks))
    raw = b"".join(packed).ljust(MAX_ROW_COPIES * _ROW_COPY.size, b"\0") + struct.pack("<I", len(pairs))
    kernel = runtime.loaded_kernel(get_kernel(ROWS, arch), device_id, 0)
    return LaunchPlan(kernel, _grid(blocks, "row copies"), (ROWS_THREADS, 1, 1),
                      (np.void(raw.ljust(_ROW_COPIES_BYTES, b"\0")),), device_id, waits=True)


def unpack_row_copies(arg) -> list[dict[str, int]]:
    """The copies of a rows_plan launch's argument, decoded (tests, error messages)."""
    raw = bytes(arg)
    count = struct.unpack_from("<I", raw, MAX_ROW_COPIES * _ROW_COPY.size)[0]
    names = ("src", "dst", "src_pitch", "dst_pitch", "rows", "row_bytes", "chunks", "block_end")
    return [dict(zip(names, _ROW_COPY.unpack_from(raw, i * _ROW_COPY.size))) for i in range(count)]
