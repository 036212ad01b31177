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
