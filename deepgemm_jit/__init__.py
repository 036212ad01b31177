"""deepgemm-jit: GEMM kernels generated at run time for NVIDIA GPUs (Hopper first).

    import deepgemm_jit as dg
    gemm = dg.build(4096, 7168, 2048, dtype="bf16")   # M is a hint; any M works
    d = gemm(a, b)                                    # a (M, K), b (N, K) -> d (M, N)

    fp8 = dg.build(4096, 7168, 2048, dtype="fp8", scaling="block")
    qa, sa = dg.quantize(a, "fp8", "group128")        # 1x128 groups of the activations
    qb, sb = dg.quantize(b, "fp8", "block128")        # 128x128 blocks of the weight
    d = fp8(qa, qb, scale_a=sa, scale_b=sb)

    fp32 = dg.build_fp32(4096, 7168, 2048)            # FP32-accurate (3xTF32): float32 a, b -> float32 d

Importing the package touches no GPU and creates no directory.
"""
__version__ = "0.1.0"

import os as _os  # noqa: E402


# The package modules that shape rendered kernels (render.py says which and why): render.source_digest hashes them
# for the render index. Listed here so that their stat signatures can be taken
# before any of them is imported (render.rendering_code_is_current).
_RENDERING_MODULES = ("render.py", "spec.py", "config.py", "sm90_tiles.py", "epilogue.py", "dtypes.py", "jit.py")


def _rendering_module_stats() -> dict:
    """(device, inode, size, mtime_ns, ctime_ns) of each of _RENDERING_MODULES' files."""
    from_dir = _os.path.dirname(_os.path.abspath(__file__))
    stats = {}
    for name in _RENDERING_MODULES:
        try:
            st = _os.stat(_os.path.join(from_dir, name))
        except OSError:  # installed without its source: source_digest skips it too
            continue
        stats[name] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return stats


_IMPORTED_RENDERING_MODULE_STATS = _rendering_module_stats()

from .errors import (CacheCorruptionWarning, CacheUnavailableWarning, CompileError,  # noqa: E402
                     DeepGemmError, NoGPUError)
from .api import Gemm, build, gemm  # noqa: E402
from .fp32x3 import Fp32Gemm, build_fp32  # noqa: E402
from .grouped import GroupedGemm, build_grouped  # noqa: E402
from .spec import GemmSpec  # noqa: E402
from .config import KernelConfig  # noqa: E402
from .epilogue import Epilogue, deinterleave_gate_up, interleave_gate_up  # noqa: E402
from .quantization import dequantize, quantize  # noqa: E402

__all__ = ["build", "build_fp32", "build_grouped", "gemm", "quantize", "dequantize", "Gemm", "Fp32Gemm", "GroupedGemm", "GemmSpec", "Epilogue", "KernelConfig",
           "interleave_gate_up", "deinterleave_gate_up",
           "DeepGemmError", "CompileError", "NoGPUError", "CacheCorruptionWarning", "CacheUnavailableWarning",
           "__version__"]
