"""NVRTC: rendered source -> sm_XX cubin, with the compile log and ptxas resources.

Uses CuPy's low-level NVRTC binding, which needs no GPU: the same path compiles
on a CPU-only machine (pre-generation, CI) and on the GPU machine.
"""
from __future__ import annotations

import functools
import hashlib
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import CompileError
from .render import RenderedSource

BASE_OPTIONS = ("-std=c++17", "--ptxas-options=-v", "-default-device")

_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


@dataclass(frozen=True)
class CompileResult:
    cubin: bytes
    log: str
    registers: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    static_smem_bytes: int


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    from cupy_backends.cuda.libs import nvrtc

    major, minor = nvrtc.getVersion()
    return int(major), int(minor)


def compile_options(arch: str) -> tuple[str, ...]:
    return (f"--gpu-architecture={arch}",) + BASE_OPTIONS


def parse_ptxas(log: str) -> dict[str, int]:
    regs = _PTXAS_REGS.search(log)
    spill = _PTXAS_SPILL.search(log)
    smem = _PTXAS_SMEM.search(log)
    return {
        "registers": int(regs.group(1)) if regs else -1,
        "stack_bytes": int(spill.group(1)) if spill else -1,
        "spill_store_bytes": int(spill.group(2)) if spill else -1,
        "spill_load_bytes": int(spill.group(3)) if spill else -1,
        "static_smem_bytes": int(smem.group(1)) if smem else 0,
    }


def _keep_failed_source(rendered: RenderedSource) -> str | None:
    """Write the failing source and its headers to a temp folder for inspection; its path, or None where it could
    not be written (a debugging aid: an unwritable temp folder, e.g. another user's, must not hide the compile
    error)."""
    digest = hashlib.sha256(rendered.source.encode()).hexdigest()[:12]
    root = Path(tempfile.gettempdir()) / "deepgemm-jit-failed" / digest
    try:
        for name, text in rendered.headers:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text, encoding="utf-8")
        root.mkdir(parents=True, exist_ok=True)
        path = root / rendered.name
        path.write_text(rendered.source, encoding="utf-8")
    except OSError:
        return None
    return str(path)


# ptxas notes that a kernel's wgmmas lost their overlap (each one a silent slowdown of the whole main loop):
# C7514 / C7518 serialised wgmmas, C7517 a warpgroup.wait injected where registers a wgmma defines are used.
# (C7508, setmaxnreg ignored, is another matter: the variant tests check it on its own.)
SERIALIZATION_WARNINGS = ("C7514", "C7517", "C7518")


def serialization_warnings(log: str) -> list[str]:
    """The SERIALIZATION_WARNINGS codes in a ptxas log (an empty list for a kernel whose wgmmas overlap)."""
    return [code for code in SERIALIZATION_WARNINGS if code in log]


def compile_cubin(rendered: RenderedSource, arch: str) -> CompileResult:
    """Compile `rendered` for `arch` (e.g. "sm_90a"); CompileError with the log on failure."""
    from cupy_backends.cuda.libs import nvrtc

    names = [name.encode() for name, _ in rendered.headers]
    contents = [text.encode() for _, text in rendered.headers]
    prog = nvrtc.createProgram(rendered.source, rendered.name, contents, names)
    try:
        try:
            nvrtc.compileProgram(prog, list(compile_options(arch)))
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog)
            raise CompileError(f"NVRTC failed to compile {rendered.name} for {arch}: {exc}",
                               log=log, source_path=_keep_failed_source(rendered)) from None
        log = nvrtc.getProgramLog(prog)
        # CuPy's getCUBIN drops the final byte of the ELF image (always a zero);
        # put it back so that external tools (cuobjdump) read the file too.
        cubin = bytes(nvrtc.getCUBIN(prog)) + b"\0"
    finally:
        nvrtc.destroyProgram(prog)
    return CompileResult(cubin=cubin, log=log, **parse_ptxas(log))
