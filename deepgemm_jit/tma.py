"""Host-side encoding of TMA tensor maps (``CUtensorMap``) for 2-D row-major tiles.

A tensor map is a 128-byte opaque descriptor that the Hopper copy engine (TMA) reads to move a box of
a 2-D tensor between global and shared memory. The kernel receives it by value as a
``const __grid_constant__ CUtensorMap`` parameter; CuPy passes such a parameter when it is given as a
NumPy void scalar of dtype ``V128``, which is what :func:`encode_tiled_2d` returns.

Argument validation is pure Python and needs no GPU; encoding calls the driver's
``cuTensorMapEncodeTiled`` through ``cuda.bindings`` when it is importable, else through ctypes on
``libcuda.so.1``. Encoding does not touch device memory, but the address must be the one the kernel
will read.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from . import driver

__all__ = ["TensorMapError", "TMA_DTYPES", "SWIZZLE_BYTES", "validate_tiled_2d", "encode_tiled_2d"]

TENSOR_MAP_BYTES = 128

# CUtensorMapDataType values (cuda.h) and element sizes for the dtype names this library uses.
# "tf32" operands are FP32 in memory; the tensor cores drop the low mantissa bits themselves, so the
# copy engine moves them as plain FP32 (no rounding on the way).
TMA_DTYPES: dict[str, tuple[int, int]] = {
    "uint8": (0, 1),
    "uint16": (1, 2),
    "uint32": (2, 4),
    "int32": (3, 4),
    "fp16": (6, 2),
    "fp32": (7, 4),
    "tf32": (7, 4),
    "bf16": (9, 2),
    "fp8_e4m3": (0, 1),
    "fp8_e5m2": (0, 1),
    "int8": (0, 1),
}

# CUtensorMapSwizzle values by swizzle span in bytes (0 = no swizzle).
SWIZZLE_BYTES: dict[int, int] = {0: 0, 32: 1, 64: 2, 128: 3}

_INTERLEAVE_NONE = 0
_L2_PROMOTION_256B = 3  # fetch whole 256-byte lines into L2: operand tiles are re-read by many CTAs
_OOB_FILL_ZERO = 0      # out-of-bounds elements read as zeros (that is how M/N/K tails work)


class TensorMapError(RuntimeError):
    """The driver refused to encode a tensor map; carries the CUresult and the arguments."""

    def __init__(self, code: int, name: str, args: dict):
        self.code = code
        self.args_used = args
        super().__init__(f"cuTensorMapEncodeTiled failed with CUresult {code} ({name}) for {args}")


def validate_tiled_2d(ptr: int, dtype_name: str, rows: int, cols: int, row_stride_bytes: int,
                      box_rows: int, box_cols: int, swizzle_bytes: int) -> tuple[int, int]:
    """Check a 2-D tiled tensor map request against the TMA rules; return (CU dtype, element bytes).

    Raises ValueError naming the offending argument. Runs without a GPU.
    """
    if dtype_name not in TMA_DTYPES:
        raise ValueError(f"dtype_name={dtype_name!r} has no TMA encoding; choose one of {', '.join(TMA_DTYPES)}")
    cu_dtype, elem_bytes = TMA_DTYPES[dtype_name]
    for name, value in (("ptr", ptr), ("rows", rows), ("cols", cols), ("row_stride_bytes", row_stride_bytes),
                        ("box_rows", box_rows), ("box_cols", box_cols), ("swizzle_bytes", swizzle_bytes)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be an int, got {type(value).__name__}")
    if ptr <= 0 or ptr % 16:
        raise ValueError(f"ptr=0x{ptr:x}: the global address must be non-null and 16-byte aligned")
    if not (1 <= rows < 2**32) or not (1 <= cols < 2**32):
        raise ValueError(f"rows={rows}, cols={cols}: each extent must be in 1 .. 2**32-1")
    if row_stride_bytes % 16 or row_stride_bytes >= 2**40:
        raise ValueError(f"row_stride_bytes={row_stride_bytes} must be a multiple of 16 and < 2**40 "
                         f"(pad the leading dimension so rows start on 16-byte boundaries)")
    if rows > 1 and row_stride_bytes < cols * elem_bytes:
        raise ValueError(f"row_stride_bytes={row_stride_bytes} is smaller than one row "
                         f"({cols} x {elem_bytes} bytes): rows would overlap")
    if not (1 <= box_rows <= 256):
        raise ValueError(f"box_rows={box_rows} must be in 1..256")
    if not (1 <= box_cols <= 256):
        raise ValueError(f"box_cols={box_cols} must be in 1..256")
    inner_bytes = box_cols * elem_bytes
    if inner_bytes % 16:
        raise ValueError(f"box_cols={box_cols}: the inner box extent ({inner_bytes} bytes) must be a multiple of 16 bytes")
    if swizzle_bytes not in SWIZZLE_BYTES:
        raise ValueError(f"swizzle_bytes={swizzle_bytes} must be one of {sorted(SWIZZLE_BYTES)}")
    if swizzle_bytes and inner_bytes > swizzle_bytes:
        raise ValueError(f"box_cols={box_cols}: the inner box extent ({inner_bytes} bytes) exceeds the "
                         f"swizzle span swizzle_bytes={swizzle_bytes}")
    return cu_dtype, elem_bytes


def encode_tiled_2d(ptr: int, dtype_name: str, rows: int, cols: int, row_stride_bytes: int,
                    box_rows: int, box_cols: int, swizzle_bytes: int, *, backend: str = "auto") -> np.void:
    """Encode a tensor map for a row-major (rows x cols) tensor at `ptr`, copied in (box_rows x box_cols) boxes.

    Contract: `ptr` is a device address, 16-byte aligned; `row_stride_bytes` is the distance between row
    starts (a multiple of 16); `box_cols * element size` is a multiple of 16 and, when swizzling, at
    most `swizzle_bytes` (32, 64 or 128; 0 = none). Out-of-bounds box elements load as zeros and are not
    stored. `backend` is "auto" (cuda.bindings if importable, else ctypes), "cuda-bindings" or "ctypes".

    Returns a NumPy ``V128`` scalar to pass as a by-value ``__grid_constant__ CUtensorMap`` argument.

    Example::

        tmap_a = encode_tiled_2d(a.data.ptr, "bf16", m, k, a.strides[0], 128, 64, 128)
    """
    cu_dtype, _ = validate_tiled_2d(ptr, dtype_name, rows, cols, row_stride_bytes, box_rows, box_cols,
                                    swizzle_bytes)
    request = dict(ptr=hex(int(ptr)), dtype=dtype_name, rows=int(rows), cols=int(cols),
                   row_stride_bytes=int(row_stride_bytes), box_rows=int(box_rows), box_cols=int(box_cols),
                   swizzle_bytes=int(swizzle_bytes))
    # TMA lists extents innermost first; strides exclude the innermost (element) dimension.
    dims = (int(cols), int(rows))
    strides = (int(row_stride_bytes),)
    box = (int(box_cols), int(box_rows))
    args = (cu_dtype, int(ptr), dims, strides, box, SWIZZLE_BYTES[swizzle_bytes])
    if backend == "auto":
        backend = "cuda-bindings" if _cuda_bindings_driver() is not None else "ctypes"
    if backend == "cuda-bindings":
        raw = _encode_cuda_bindings(*args, request=request)
    elif backend == "ctypes":
        raw = _encode_ctypes(*args, request=request)
    else:
        raise ValueError(f"backend={backend!r} must be 'auto', 'cuda-bindings' or 'ctypes'")
    if len(raw) != TENSOR_MAP_BYTES:
        raise TensorMapError(-1, f"encoder returned {len(raw)} bytes instead of {TENSOR_MAP_BYTES}", request)
    return np.frombuffer(raw, dtype=np.dtype(f"V{TENSOR_MAP_BYTES}"))[0]


@functools.lru_cache(maxsize=None)
def _cuda_bindings_driver():
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    return driver


def _encode_cuda_bindings(cu_dtype, ptr, dims, strides, box, swizzle, *, request) -> bytes:
    drv = _cuda_bindings_driver()
    if drv is None:
        raise ImportError("backend='cuda-bindings' requested but cuda.bindings is not importable")
    err, tmap = drv.cuTensorMapEncodeTiled(
        drv.CUtensorMapDataType(cu_dtype), 2, ptr,
        [drv.cuuint64_t(d) for d in dims],
        [drv.cuuint64_t(s) for s in strides],
        [drv.cuuint32_t(b) for b in box],
        [drv.cuuint32_t(1), drv.cuuint32_t(1)],
        drv.CUtensorMapInterleave(_INTERLEAVE_NONE),
        drv.CUtensorMapSwizzle(swizzle),
        drv.CUtensorMapL2promotion(_L2_PROMOTION_256B),
        drv.CUtensorMapFloatOOBfill(_OOB_FILL_ZERO),
    )
    code = int(err)
    if code != 0:
        raise TensorMapError(code, getattr(err, "name", str(err)), request)
    # The binding object wraps the 128-byte struct; getPtr() is its host address.
    return ctypes.string_at(int(tmap.getPtr()), TENSOR_MAP_BYTES)


def _encode_ctypes(cu_dtype, ptr, dims, strides, box, swizzle, *, request) -> bytes:
    try:
        lib = driver.libcuda()
    except RuntimeError as exc:  # cuInit failed
        raise TensorMapError(-1, str(exc), request) from exc
    out = (ctypes.c_uint8 * TENSOR_MAP_BYTES)()
    ctypes_dims = (ctypes.c_uint64 * 2)(*dims)
    ctypes_strides = (ctypes.c_uint64 * 1)(*strides)
    ctypes_box = (ctypes.c_uint32 * 2)(*box)
    ctypes_elem_strides = (ctypes.c_uint32 * 2)(1, 1)
    # The driver requires the output to be 64-byte aligned; ctypes arrays are not, so encode into an
    # aligned spot inside a larger buffer.
    storage = (ctypes.c_uint8 * (TENSOR_MAP_BYTES + 64))()
    base = ctypes.addressof(storage)
    aligned = (base + 63) & ~63
    code = lib.cuTensorMapEncodeTiled(ctypes.c_void_p(aligned), cu_dtype, 2, ctypes.c_void_p(ptr), ctypes_dims,
                                      ctypes_strides, ctypes_box, ctypes_elem_strides, _INTERLEAVE_NONE, swizzle,
                                      _L2_PROMOTION_256B, _OOB_FILL_ZERO)
    if code != 0:
        raise TensorMapError(code, driver.error_name(code, lib), request)
    ctypes.memmove(out, aligned, TENSOR_MAP_BYTES)
    return bytes(out)
