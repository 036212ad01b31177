"""Stream helpers of the GPU tests: keep a stream busy so that work queued after it there runs late, which a call
launched on the wrong stream would then not wait for."""
import numpy as np

_SPIN = r"""
extern "C" __global__ void dgjit_test_spin(long long ns) {
  long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(10000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}
"""


def spin(stream, seconds):
    """Keep `stream` (a CuPy stream) busy for `seconds` on the GPU; the host does not wait."""
    import cupy

    kernel = cupy.RawKernel(_SPIN, "dgjit_test_spin")
    with stream:
        kernel((1,), (1,), (np.int64(seconds * 1e9),))


def nan_target(x):
    """A NaN-filled array of x's shape and dtype (CuPy or torch), filled and synchronised now, before the caller's
    spin. Copying x into it on the busy stream after the spin makes the copy late: a kernel on any other stream
    reads NaN, whatever the timing. (A fresh allocation written late would not do: it may already hold the same
    values, e.g. torch's fixed default seed draws the same randn in every process, and session 37's negative control
    saw such tests pass with every kernel on a wrong stream.)"""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        target = torch.full_like(x, float("nan"))
        torch.cuda.synchronize()
        return target
    import cupy

    from deepgemm_jit import reference

    target = reference.poison(cupy.empty_like(x))
    cupy.cuda.Device().synchronize()
    return target
