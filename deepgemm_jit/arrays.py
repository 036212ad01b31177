"""Device-array inspection and validation, before anything is launched.

Accepts CuPy arrays, PyTorch CUDA tensors (read in place through ``data_ptr``/``stride``: no copy, bf16
included) and any object exposing ``__cuda_array_interface__``; produces
a small description (pointer, shape, row stride in elements, dtype, device) and
raises ValueError/TypeError naming the argument for everything a kernel could not
handle. Nothing below this module knows which array library the user holds.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MatrixView:
    ptr: int
    rows: int
    cols: int
    row_stride: int   # elements between the starts of consecutive rows
    dtype: np.dtype
    device: int

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def byte_span(self) -> tuple[int, int]:
        """[start, end) of the bytes this matrix can touch."""
        if self.rows == 0 or self.cols == 0:
            return self.ptr, self.ptr
        last = (self.rows - 1) * self.row_stride + self.cols
        return self.ptr, self.ptr + last * self.itemsize


def _current_device() -> int:
    """device.current_device_id, or 0 where there is no GPU (validation also runs without one)."""
    import cupy

    from .device import current_device_id

    try:
        return current_device_id()
    except cupy.cuda.runtime.CUDARuntimeError:
        return 0


def _device_of_pointer(ptr: int) -> int:
    import cupy

    attrs = cupy.cuda.runtime.pointerGetAttributes(ptr)
    if attrs.type not in (2, 3):  # cudaMemoryTypeDevice, cudaMemoryTypeManaged
        raise ValueError("pointer is not device memory")
    return int(attrs.device)


def allocation_end(ptr: int) -> int | None:
    """One past the last byte of the device allocation holding `ptr` (cuMemGetAddressRange: for a pooled array,
    the pool's whole block), or None where the driver cannot tell. For kernels that may read a few bytes past an
    array's last element (launch.bulk_a_scales): such a read is legal only inside the allocation."""
    import ctypes

    from . import driver

    try:
        lib = driver.libcuda()
    except (OSError, RuntimeError):
        return None
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    if lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)) != 0:
        return None
    return base.value + size.value


def _torch_tensor_type():
    """torch.Tensor if torch is already imported (a torch tensor implies it is), else None."""
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None)


def array_kind(x: object) -> str:
    """'cupy', 'torch' or 'other' (anything with __cuda_array_interface__): outputs are made in the
    caller's kind."""
    import cupy

    if isinstance(x, cupy.ndarray):
        return "cupy"
    tensor = _torch_tensor_type()
    if tensor is not None and isinstance(x, tensor):
        return "torch"
    return "other"


def numpy_dtype_of_torch(dtype) -> np.dtype | None:
    """The NumPy/ml_dtypes storage dtype of a torch dtype (None where there is none)."""
    name = str(dtype).removeprefix("torch.")
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    try:
        return np.dtype(name)
    except TypeError:
        return None


def _torch_fields(x, arg: str):
    if x.device.type != "cuda":
        raise TypeError(f"{arg} is a torch tensor on {x.device}; move it to the GPU first ({arg}.cuda())")
    dtype = numpy_dtype_of_torch(x.dtype)
    if dtype is None:
        raise TypeError(f"{arg} has dtype {x.dtype}, which this library does not take")
    if x.is_neg() or x.is_conj():  # a lazy view (e.g. x.conj().imag): its memory holds the negated values
        raise TypeError(f"{arg} is a lazily negated / conjugated torch view; pass {arg}.resolve_neg() (or "
                        f"{arg}.resolve_conj())")
    strides = tuple(s * dtype.itemsize for s in x.stride())
    return tuple(x.shape), strides, dtype, int(x.data_ptr()), int(x.device.index)


def array_fields(x: object, arg: str) -> tuple[tuple[int, ...], tuple[int, ...], np.dtype, int, int]:
    """(shape, strides in bytes, dtype, data pointer, device) of a device array; errors name `arg`."""
    import cupy

    if isinstance(x, np.ndarray):
        raise TypeError(f"{arg} is a NumPy (host) array; pass a GPU array, e.g. cupy.asarray({arg})")
    tensor = _torch_tensor_type()
    if isinstance(x, cupy.ndarray):
        memptr = x.data
        return tuple(x.shape), tuple(x.strides), x.dtype, memptr.ptr, memptr.device_id
    if tensor is not None and isinstance(x, tensor):
        return _torch_fields(x, arg)
    try:
        cai = x.__cuda_array_interface__
    except AttributeError:
        if hasattr(x, "__dlpack__"):
            return _dlpack_fields(x, arg)
        raise TypeError(f"{arg} must be a GPU array (CuPy, a torch CUDA tensor, or any object with "
                        f"__cuda_array_interface__ or __dlpack__), got {type(x).__name__}") from None
    except Exception as exc:  # e.g. torch bfloat16 tensors refuse to export it
        raise TypeError(f"{arg} ({type(x).__name__}) could not export __cuda_array_interface__: {exc}") from None
    if cai.get("version", 0) < 3 and hasattr(x, "__dlpack__"):
        # Version 2 has no "stream": nothing says whether the producer's writes have finished (jaxlib exports its
        # arrays as v2 without waiting for them to be computed). A DLPack import is ordered after that work.
        return _dlpack_fields(x, arg)
    if cai.get("mask") is not None:  # v1+: elements where the mask is 0 are invalid; the kernels read them all
        raise ValueError(f"{arg} is a masked array (its __cuda_array_interface__ has a mask), which this library "
                         "does not take: pass the data without a mask (fill the masked elements first)")
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    ptr = int(cai["data"][0])
    strides = cai.get("strides")
    if strides is None:  # C-contiguous
        strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * dtype.itemsize for i in range(len(shape)))
    if not ptr and int(np.prod(shape, dtype=np.int64)):  # the protocol allows a NULL pointer for empty arrays only
        raise ValueError(f"{arg} has a NULL data pointer for shape {shape}")
    try:  # an empty array with a NULL pointer is on no device: the current one (the call's other operands decide)
        device = _device_of_pointer(ptr) if ptr else _current_device()
    except Exception as exc:
        raise ValueError(f"{arg} does not point to GPU memory ({exc})") from None
    _sync_producer_stream(cai.get("stream"), arg)
    return shape, tuple(strides), dtype, ptr, device


def check_writable(x: object, arg: str) -> None:
    """Refuse an output its library exports as read-only: the CUDA array interface's data[1] (a JAX array sets it;
    XLA may share or reuse that buffer). CuPy arrays and torch tensors are writable; DLPack-only objects are left to
    their import."""
    import cupy

    if isinstance(x, cupy.ndarray) or array_kind(x) == "torch":
        return
    try:
        data = x.__cuda_array_interface__["data"]
    except Exception:  # no interface (DLPack) or a broken one: the view's own checks report it
        return
    if len(data) > 1 and data[1]:
        raise ValueError(f"{arg} is read-only (its __cuda_array_interface__ says so, as a JAX array's does); the "
                         "call would write it: pass a writable array")


def _sync_producer_stream(stream, arg: str) -> None:
    """CUDA array interface v3: a producer may name the stream its data is being written on ("stream"; 1 and 2
    are the legacy and per-thread default streams, 0 is not allowed), and the consumer synchronises with it before
    using the data, as CuPy does. None (or no entry): the data is ready."""
    if stream is None:
        return
    if isinstance(stream, bool) or not isinstance(stream, int) or stream == 0:
        raise ValueError(f"{arg}.__cuda_array_interface__ has stream {stream!r}: an int other than 0, or None")
    import cupy

    cupy.cuda.runtime.streamSynchronize(stream)


class DLPackImportDeferred(Exception):
    """Raised by a DLPack import that runs outside runtime.orders_dlpack_imports' decision: the entry point catches
    it and runs the call again with its kernel stream current (internal; never reaches a user)."""


class _DLPackImports(threading.local):
    """Per thread: `inside` while an entry point makes its first attempt at a call (runtime.orders_dlpack_imports:
    a DLPack import defers to it then), `ready` while it runs the call again with the stream its DLPack imports must
    be ordered before made current. Outside an entry point (matrix_view called directly) imports are made on CuPy's
    current stream at once. Class defaults, so reading them costs no failed lookup on the hot path."""

    inside = False
    ready = False


dlpack_imports = _DLPackImports()


def _on_cuda(x: object) -> bool:
    try:
        return int(x.__dlpack_device__()[0]) in (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
    except Exception:
        return False


def _dlpack_fields(x: object, arg: str):
    """Fields of a DLPack producer without a usable CUDA array interface (e.g. a JAX array), through a zero-copy CuPy
    view of its memory. The view is made on CuPy's current stream, which DLPack orders after the producer's pending
    work: inside an entry point (runtime.orders_dlpack_imports) that is the call's kernel stream."""
    import cupy

    if dlpack_imports.inside and not dlpack_imports.ready and _on_cuda(x):
        raise DLPackImportDeferred()
    try:
        view = cupy.from_dlpack(x)
    except Exception as exc:
        raise TypeError(f"{arg} ({type(x).__name__}) could not be imported through DLPack as a GPU array: {exc}"
                        ) from None
    return array_fields(view, arg)


def matrix_view(x: object, arg: str) -> MatrixView:
    """Describe the 2-D device matrix `x`; errors name `arg`."""
    shape, strides, dtype, ptr, device = array_fields(x, arg)
    if len(shape) != 2:
        raise ValueError(f"{arg} must be 2-D, got shape {tuple(shape)}")
    rows, cols = int(shape[0]), int(shape[1])
    itemsize = dtype.itemsize
    s0, s1 = int(strides[0]), int(strides[1])
    if rows == 0 or cols == 0:  # nothing is read or written; strides are meaningless (CuPy gives 0)
        s0, s1 = max(cols, 1) * itemsize, itemsize
    if s0 % itemsize or s1 % itemsize:
        raise ValueError(f"{arg} has strides {tuple(strides)} that are not whole elements")
    if cols > 1 and s1 != itemsize:
        raise ValueError(f"{arg} must have unit stride along its last dimension (got {s1 // itemsize} "
                         f"elements); pass a row-major view or a copy (e.g. {arg}.copy())")
    row_stride = s0 // itemsize if rows > 1 else max(cols, 1)
    if row_stride < 0:
        raise ValueError(f"{arg} has a negative row stride ({row_stride} elements, e.g. a reversed view); pass a "
                         f"copy ({arg}.copy())")
    if rows > 1 and row_stride < cols:
        raise ValueError(f"{arg} has a row stride of {row_stride} elements for rows of {cols}: rows overlap")
    if ptr % itemsize:
        raise ValueError(f"{arg} data pointer 0x{ptr:x} is not aligned to its {itemsize}-byte elements")
    return MatrixView(ptr=ptr, rows=rows, cols=cols, row_stride=row_stride, dtype=np.dtype(dtype),
                      device=int(device))


@dataclass(frozen=True)
class ScaleView:
    """An FP32 scale array read by a kernel as element (i, j) at ptr + 4 * (i * stride_i + j * stride_j)."""

    ptr: int
    shape: tuple[int, int]      # logical (rows, cols); (n, 1) for per-row vectors, (1, 1) for per-tensor
    stride_i: int               # elements
    stride_j: int
    device: int
    itemsize: int = 4

    def byte_span(self) -> tuple[int, int]:
        last = (self.shape[0] - 1) * self.stride_i + (self.shape[1] - 1) * self.stride_j
        return self.ptr, self.ptr + self.itemsize * (last + 1)


def scale_view(x: object, arg: str, shape: tuple[int, ...], what: str,
               dtype_wanted: np.dtype = np.dtype(np.float32), dtype_why: str = "scales are float32") -> ScaleView:
    """Validate a scale array (or another small operand, of `dtype_wanted`, which `dtype_why` explains in the
    error) against its logical `shape` ((1,), (n,) or (r, c)): any strides (row- or column-major), extra unit
    dimensions allowed for vectors ((n, 1) or (1, n)); `what` says in the error what the shape means."""
    fshape, fstrides, dtype, ptr, device = array_fields(x, arg)
    if dtype != dtype_wanted:
        raise TypeError(f"{arg} has dtype {dtype}; {dtype_why}")
    if any(s < 0 for s in fstrides):
        raise ValueError(f"{arg} has negative strides {fstrides}; pass a copy")
    size = np.dtype(dtype_wanted).itemsize
    if any(s % size for s in fstrides) or ptr % size:
        raise ValueError(f"{arg} is not aligned to its {size}-byte elements")
    # Drop unit dimensions (their strides mean nothing) and compare what is left.
    dims = [(n, st // size) for n, st in zip(fshape, fstrides) if n != 1]
    want = [n for n in shape if n != 1]
    if [n for n, _ in dims] != want:
        raise ValueError(f"{arg} has shape {tuple(fshape)}; expected {tuple(shape)} ({what})")
    if len(shape) == 2:
        strides = []
        it = iter(dims)
        for n in shape:
            strides.append(next(it)[1] if n != 1 else 0)
        return ScaleView(ptr, (shape[0], shape[1]), strides[0], strides[1], int(device), size)
    stride = dims[0][1] if dims else 0
    return ScaleView(ptr, (shape[0], 1), stride, 0, int(device), size)


def overlaps(x, y) -> bool:
    """Whether two operands may share a byte. Matrices with one row pitch (e.g. column blocks of one buffer: `a` and
    `out` side by side) are tested row against row; anything else by the byte span each can touch (conservative)."""
    x0, x1 = x.byte_span()
    y0, y1 = y.byte_span()
    if not (x0 < y1 and y0 < x1):
        return False
    if not (isinstance(x, MatrixView) and isinstance(y, MatrixView) and x.rows > 1 and y.rows > 1):
        return True
    pitch = x.row_stride * x.itemsize
    wx, wy = x.cols * x.itemsize, y.cols * y.itemsize
    if pitch != y.row_stride * y.itemsize or wx > pitch or wy > pitch:
        return True
    # Row i of x, [i P, i P + wx), meets row j of y, [d + j P, d + j P + wy), iff -wy - d < (j - i) P < wx - d.
    d = y.ptr - x.ptr
    t_lo = max(-(x.rows - 1), (-wy - d) // pitch + 1)
    t_hi = min(y.rows - 1, -((d - wx) // pitch) - 1)
    return t_lo <= t_hi


def scalar_signature(value) -> str | None:
    """alpha / beta as a launch plan's key holds them: the float's exact value (float.hex, so -0.0 is not 0.0, which
    would compare equal and replay the other sign), or None (no plan) for anything validation would refuse: a bool
    equals 1.0 and would find the plan of alpha=1.0, an unhashable value broke the key."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        return None
    try:
        return float(value).hex()
    except OverflowError:  # an int beyond float64: validation names it
        return None


def signature(x: object):
    """A hashable key that determines everything `matrix_view` checks and returns, for CuPy arrays
    and torch tensors (None for other kinds): equal signatures validate and launch identically."""
    if x is None:  # absent optional operands (scales, bias, ...): checked first, it is the common case
        return ()
    import cupy

    if type(x) is cupy.ndarray:
        return (x.data.ptr, x.shape, x.strides, x.dtype)
    tensor = _torch_tensor_type()
    if tensor is not None and isinstance(x, tensor):
        if x.is_neg() or x.is_conj():  # lazy views that matrix_view refuses: their memory holds other values
            return None
        return (x.data_ptr(), x.shape, x.stride(), x.dtype, x.device)
    return None


@contextlib.contextmanager
def allocating_for(kind: str, device_id: int, stream=None, explicit: bool = False):
    """Allocations of the caller's library inside come from the pool of `stream` (a CuPy stream, the one the kernel
    runs on) on `device_id`. Both libraries' pools hand a freed block out again to later work on the stream it was
    allocated for, ordered after the work that freed it: memory allocated for another stream than the kernel's could
    still be in use there. torch's current stream is already the kernel's unless the call named one (`explicit`)."""
    if kind == "torch":
        if not (explicit and stream is not None):
            yield
            return
        import torch

        with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr, device=torch.device("cuda", device_id))):
            yield
        return
    import cupy

    with cupy.cuda.Device(device_id), (stream if stream is not None else contextlib.nullcontext()):
        yield


def new_array(kind: str, shape: tuple[int, ...], name: str, device_id: int, stream=None, explicit: bool = False):
    """A new contiguous array of the caller's library (`kind` as array_kind names it) and library dtype `name`
    ("bf16", "fp32", "int32", "fp8_e4m3", ...) on `device_id`, for the kernel's `stream` (allocating_for): torch's
    dtype for torch, the storage dtype for CuPy, FP8 as uint8 bits (CuPy has no float8 dtype)."""
    from . import dtypes

    with allocating_for(kind, device_id, stream, explicit):
        if kind == "torch":
            import torch

            return torch.empty(shape, dtype=getattr(torch, dtypes.get(name).numpy_name), device=f"cuda:{device_id}")
        import cupy

        return cupy.empty(shape, dtype=np.uint8 if name in dtypes.FP8_DTYPES else dtypes.numpy_dtype(name))


# M-major float32 scales (DeepGEMM's TMA-aligned layout, the one FP8 block GEMMs bulk-copy: launch.bulk_a_scales):
# rows padded to a multiple of this so that every column starts on 16 bytes.
SCALE_ROWS_ALIGN = 4


def mn_major_storage_shape(rows: int, cols: int) -> tuple[int, int]:
    """(cols, round_up(rows, 4)): the row-major storage whose transpose cut to `rows` rows is the M-major (rows, cols)
    scale layout, element (i, j) at i + j * round_up(rows, 4) (16-byte aligned columns from an aligned base).

    >>> mn_major_storage_shape(301, 3)
    (3, 304)
    """
    return cols, -(-rows // SCALE_ROWS_ALIGN) * SCALE_ROWS_ALIGN


def mn_major_view(storage, rows: int):
    """The (rows, cols) M-major view of (cols, padded rows) `storage` (NumPy, CuPy or torch): a transpose and a
    slice, no copy."""
    return storage.T[:rows]


def new_mn_major_scales(kind: str, rows: int, cols: int, device_id: int, stream=None, explicit: bool = False):
    """New float32 (rows, cols) scales of the caller's library in the M-major layout (see mn_major_storage_shape),
    for the kernel's `stream` (allocating_for); the padding rows are left uninitialised (nothing reads them)."""
    storage = new_array(kind, mn_major_storage_shape(rows, cols), "fp32", device_id, stream, explicit)
    return mn_major_view(storage, rows)


def has_distinct_elements(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether an array of `shape` and element `strides` (non-negative) addresses each element once: sorted by
    stride, every dimension of more than one element must step past the whole extent of the ones below it. This
    accepts row-major, column-major, padded and M-major layouts (and any permutation of nested dimensions) and
    refuses zero (broadcast) and interleaving strides.

    >>> [has_distinct_elements((5, 3), strides) for strides in ((1, 8), (3, 1), (1, 2), (0, 1))]
    [True, True, False, False]
    """
    if 0 in shape:  # no elements (CuPy and NumPy give zero-size arrays all-zero strides): none is addressed twice
        return True
    extent = 1  # elements spanned by the dimensions seen so far, from offset 0
    for n, stride in sorted(((n, st) for n, st in zip(shape, strides) if n > 1), key=lambda d: d[1]):
        if stride < extent:
            return False
        extent = stride * (n - 1) + extent
    return True


def out_view(out: object, accepted: tuple, writes: str, shape: tuple[int, int], va: MatrixView,
             vb: MatrixView) -> MatrixView | None:
    """The view of a GEMM's `out=` (None when not given) after the checks every GEMM makes before launching: one of
    the `accepted` dtypes (`writes` names what the GEMM writes), `shape`, a's device, no overlap with a or b."""
    if out is None:
        return None
    check_writable(out, "out")
    vd = matrix_view(out, "out")
    if vd.dtype not in accepted:
        raise TypeError(f"out has dtype {vd.dtype}, but this GEMM writes {writes}")
    if (vd.rows, vd.cols) != shape:
        raise ValueError(f"out has shape {(vd.rows, vd.cols)}, expected (M, N) = {shape}")
    if vd.device != va.device:
        raise ValueError(f"out is on device {vd.device} but a is on device {va.device}")
    if overlaps(vd, va) or overlaps(vd, vb):
        raise ValueError("out overlaps a or b; the kernel would read what it overwrites")
    return vd

