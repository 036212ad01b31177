"""deepgemm-jit: GEMM kernels generated at run time for NVIDIA GPUs (Hopper first).

    import deepgemm_jit as dg
    gemm = dg.build(4096, 7168, 2048, dtype="bf16")   # M is a hint; any M works
    d = gemm(a, b)                                    # a (M, K), b (N, K) -> d (M, N)

Importing the package touches no GPU and creates no directory.
"""
__version__ = "0.1.0"

from .errors import (CacheCorruptionWarning, CacheUnavailableWarning, CompileError,  # noqa: E402
                     DeepGemmError, NoGPUError)
from .api import Gemm, build, gemm  # noqa: E402
from .spec import GemmSpec  # noqa: E402
from .config import KernelConfig  # noqa: E402

__all__ = ["build", "gemm", "Gemm", "GemmSpec", "KernelConfig", "DeepGemmError", "CompileError",
           "NoGPUError", "CacheCorruptionWarning", "CacheUnavailableWarning", "__version__"]
