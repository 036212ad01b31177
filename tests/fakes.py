"""Stand-ins for GPU arrays in CPU tests (imported by the test modules; pytest puts tests/ on sys.path)."""
import numpy as np

# A made-up device address: validation never dereferences it (fake_gpu_memory in conftest.py maps it to device 0).
BASE = 1 << 20


class FakeDeviceArray:
    """Just enough of a GPU array for validation: shape, dtype, strides (in elements) and a pointer, through
    __cuda_array_interface__."""

    def __init__(self, shape, dtype=np.float32, ptr=BASE, strides=None):
        dtype = np.dtype(dtype)
        self.shape, self.dtype = tuple(shape), dtype
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": dtype.str, "data": (ptr, False), "version": 3,
            "strides": None if strides is None else tuple(s * dtype.itemsize for s in strides)}
