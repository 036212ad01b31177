"""The CUDA driver library through ctypes: loaded once, initialised, with the prototypes of the entry points the
package calls directly (tensor-map encoding in ``tma``, kernel launches in ``runtime``, allocation extents in
``arrays``, a scale word's fill in ``quantization``). Nothing here runs at
import: a machine without a driver fails only when one of these is first needed."""
from __future__ import annotations

import ctypes
import functools


@functools.lru_cache(maxsize=None)
def libcuda() -> ctypes.CDLL:
    """libcuda.so.1 with cuInit done (idempotent; driver calls made before any other would fail without it) and
    the argument types of cuTensorMapEncodeTiled, cuLaunchKernel, cuMemGetAddressRange, cuMemsetD32Async and
    cuGetErrorName set.
    Raises OSError when the library is missing, RuntimeError when cuInit fails."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuInit.restype = ctypes.c_int
    lib.cuInit.argtypes = [ctypes.c_uint]
    lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
    lib.cuTensorMapEncodeTiled.argtypes = [
        ctypes.c_void_p,                   # CUtensorMap* tensorMap
        ctypes.c_int,                      # CUtensorMapDataType
        ctypes.c_uint32,                   # tensorRank
        ctypes.c_void_p,                   # globalAddress
        ctypes.POINTER(ctypes.c_uint64),   # globalDim
        ctypes.POINTER(ctypes.c_uint64),   # globalStrides
        ctypes.POINTER(ctypes.c_uint32),   # boxDim
        ctypes.POINTER(ctypes.c_uint32),   # elementStrides
        ctypes.c_int,                      # interleave
        ctypes.c_int,                      # swizzle
        ctypes.c_int,                      # l2Promotion
        ctypes.c_int,                      # oobFill
    ]
    lib.cuLaunchKernel.restype = ctypes.c_int
    lib.cuLaunchKernel.argtypes = [  # f, grid x/y/z, block x/y/z, shared bytes, stream, kernelParams, extra
        ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
        ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.cuMemGetAddressRange_v2.restype = ctypes.c_int
    lib.cuMemGetAddressRange_v2.argtypes = [  # base (out), size (out), any address inside the allocation
        ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
    lib.cuMemsetD32Async.restype = ctypes.c_int
    lib.cuMemsetD32Async.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
    lib.cuGetErrorName.restype = ctypes.c_int
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    code = lib.cuInit(0)
    if code != 0:
        raise RuntimeError(f"cuInit failed with {code} ({error_name(code, lib)})")
    return lib


def error_name(code: int, lib: ctypes.CDLL | None = None) -> str:
    """The CUresult's name (``CUDA_ERROR_INVALID_VALUE``), or a pointer to cuda.h when the driver has none."""
    lib = lib or libcuda()
    name = ctypes.c_char_p()
    if lib.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
        return name.value.decode()
    return "see cuda.h CUresult"
