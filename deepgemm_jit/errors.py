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


class KernelNotCachedError(DeepGemmError):
    """DEEPGEMM_JIT_OFFLINE=1 forbids compiling and the kernel is not in the cache.

    ``warmup_command`` (set by ``build``) is the line that would put it there; None where no warmup line can
    (``note`` then says how to pre-generate it).
    """

    def __init__(self, message: str, *, spec_tag: str, config_tag: str, arch: str, cache_dir: str | None,
                 warmup_command: str | None = None, note: str | None = None):
        self.spec_tag, self.config_tag, self.arch = spec_tag, config_tag, arch
        self.cache_dir, self.warmup_command, self.note = cache_dir, warmup_command, note
        self.base_message = message
        hint = f"\n  pre-generate it with: {warmup_command}" if warmup_command else ""
        hint += f"\n  {note}" if note else ""
        super().__init__(f"{message}{hint}")

    def with_warmup_command(self, command: str | None, note: str | None = None) -> "KernelNotCachedError":
        """This error with `command` as its warmup line (and `note`, else the note it has)."""
        return KernelNotCachedError(self.base_message, spec_tag=self.spec_tag, config_tag=self.config_tag,
                                    arch=self.arch, cache_dir=self.cache_dir, warmup_command=command,
                                    note=self.note if note is None else note)


class ToolNotFoundError(DeepGemmError):
    """An optional external tool (cuobjdump) is missing."""


class CacheCorruptionWarning(UserWarning):
    """A cache entry failed its checksum or could not be read; it is rebuilt."""


class CacheUnavailableWarning(UserWarning):
    """The cache directory cannot be written; kernels are compiled in memory only."""
