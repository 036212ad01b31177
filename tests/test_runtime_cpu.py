"""Launch-argument packing (no GPU): what cuLaunchKernel reads through each kernelParams pointer."""
import ctypes

import numpy as np
import pytest

from deepgemm_jit import runtime


def test_packed_args_hold_each_value_at_its_pointer():
    tmap = np.frombuffer(bytes(range(128)), dtype=np.dtype("V128"))[0]
    args = (tmap, np.uint32(7), np.int64(-3), np.float32(1.5), np.uint64(2**63 + 5))
    packed = runtime.PackedArgs(args)
    assert packed.count == 5
    ptrs = [packed.params[i] for i in range(5)]
    assert ctypes.string_at(ptrs[0], 128) == bytes(range(128))
    assert ctypes.c_uint32.from_address(ptrs[1]).value == 7
    assert ctypes.c_int64.from_address(ptrs[2]).value == -3
    assert ctypes.c_float.from_address(ptrs[3]).value == 1.5
    assert ctypes.c_uint64.from_address(ptrs[4]).value == 2**63 + 5


def test_packed_args_refuse_untyped_python_values():
    with pytest.raises(TypeError, match="numpy scalars"):
        runtime.PackedArgs((np.uint32(1), 5))
