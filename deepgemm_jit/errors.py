"""Every error type the library raises, in one place.

User mistakes are plain ``ValueError``/``TypeError`` (raised before anything is
launched, naming the argument). The types below are for failures of the machinery
itself, and carry what is needed to act on them.
"""
from __future__ import annotations


class DeepGemmError(Exception):
    """Base class of the library's own failures."""


class CompileError(DeepGemmError):
    """NVRTC rejected a rendered kernel.

    ``log`` is NVRTC's full log; ``source_path`` is where the rendered source (with
    its headers beside it) was kept for inspection.
    """

    def __init__(self, message: str, *, log: str, source_path: str | None):
        self.log = log
        self.source_path = source_path
        where = f"\nrendered source kept at: {source_path}" if source_path else ""
        super().__init__(f"{message}{where}\n--- NVRTC log ---\n{log}")


class NoGPUError(DeepGemmError, RuntimeError):
    """A GPU is needed (to launch, or to pick the target arch) and none is usable."""


class ToolNotFoundError(DeepGemmError):
    """An optional external tool (cuobjdump) is missing."""


class CacheCorruptionWarning(UserWarning):
    """A cache entry failed its checksum or could not be read; it is rebuilt."""


class CacheUnavailableWarning(UserWarning):
    """The cache directory cannot be written; kernels are compiled in memory only."""
