"""Stand-ins for GPU arrays and loaded kernels in CPU tests (imported by the test modules; pytest puts tests/ on
sys.path)."""
import numpy as np

# A made-up device address: validation never dereferences it (fake_gpu_memory in conftest.py maps it to device 0).
BASE = 1 << 20


class FakeDeviceArray:
    """Just enough of a GPU array for validation: shape, dtype, strides (in elements) and a pointer, through
    __cuda_array_interface__."""

    def __init__(self, shape, dtype=np.float32, ptr=BASE, strides=None, read_only=False):
        dtype = np.dtype(dtype)
        self.shape, self.dtype = tuple(shape), dtype
        self.__cuda_array_interface__ = {  # read_only: data[1], as a JAX array exports it
            "shape": tuple(shape), "typestr": dtype.str, "data": (ptr, read_only), "version": 3,
            "strides": None if strides is None else tuple(s * dtype.itemsize for s in strides)}


class FakeKernel:
    """A runtime.LoadedKernel for launch.LaunchPlan built without a GPU: bind returns its inputs, launches are
    recorded in `launched` (True where the launch was programmatic), and programmatic_launch is the real memo."""

    dynamic_smem_bytes = 0

    def __init__(self):
        self._programmatic = {}
        self.launched: list[bool] = []

    def programmatic_launch(self, grid, block):
        from deepgemm_jit import runtime

        return runtime.LoadedKernel.programmatic_launch(self, grid, block)

    def bind(self, grid, block):
        return (grid, block)

    def launch(self, grid, block, args, stream, bound, programmatic):
        self.launched.append(programmatic is not None)
