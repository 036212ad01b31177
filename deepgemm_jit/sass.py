"""Reading compiled cubins: SASS opcode mix and resource usage (via cuobjdump).

cuobjdump comes from the ``nvidia-cuda-cuobjdump`` wheel (a dependency) or the
CUDA toolkit on PATH; no GPU is needed.
"""
from __future__ import annotations

import collections
import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .errors import ToolNotFoundError

_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?")
_RES = re.compile(r"Function ([^:\s]+):\s*\n\s*(.*)")


def find_cuobjdump() -> str:
    candidates = []
    try:
        import nvidia

        for base in getattr(nvidia, "__path__", []):
            candidates += [Path(base) / sub / "bin" / "cuobjdump" for sub in ("cu13", "cuda_cuobjdump")]
    except ImportError:
        pass
    found = shutil.which("cuobjdump")
    if found:
        candidates.append(Path(found))
    candidates.append(Path("/usr/local/cuda/bin/cuobjdump"))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    raise ToolNotFoundError("cuobjdump not found: pip install 'nvidia-cuda-cuobjdump>=13.2' "
                            "'nvidia-cuda-nvdisasm>=13.2' or put the "
                            "CUDA toolkit's bin directory on PATH")


def _run(args: list[str], cubin: bytes) -> str:
    with tempfile.TemporaryDirectory(prefix="dgjit-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        tool = find_cuobjdump()
        # cuobjdump -sass runs nvdisasm, which the wheels install beside it.
        env = dict(os.environ, PATH=os.pathsep.join([str(Path(tool).parent), os.environ.get("PATH", "")]))
        proc = subprocess.run([tool, *args, str(path)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"cuobjdump {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


@functools.lru_cache(maxsize=8)  # the checks of one kernel each read its listing
def disassemble(cubin: bytes) -> str:
    return _run(["-sass"], cubin)


def opcode_mix(cubin: bytes) -> dict[str, int]:
    """Opcode (without modifiers, e.g. 'HMMA', 'HGMMA', 'LDGSTS') -> count."""
    counts = collections.Counter(m.group(1) for m in _INSTR.finditer(disassemble(cubin)))
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


# An instruction line of `cuobjdump -sass` (its first 64-bit word in the trailing comment) and the next line (the
# second word, which holds the scheduling control bits).
_WORDS = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)[^\n]*/\*\s*0x[0-9a-f]{16}\s*\*/\s*\n"
                    r"\s*/\*\s*(0x[0-9a-f]{16})\s*\*/")
_YIELD_BIT = 45  # of the second word: cleared = the scheduler may switch warps after the instruction


def yield_mix(cubin: bytes, opcodes: tuple[str, ...] = ("FFMA", "FADD")) -> tuple[int, int]:
    """(instructions with the yield bit cleared, with it set) among `opcodes` (exact opcode, modifiers allowed).

    ptxas interleaves cleared yield bits into a promoted K loop's FFMA/FADD run, which lets the other consumer
    warpgroup's wgmmas issue between the promotion's adds; a K loop reshaped so that ptxas stopped doing it ran
    14-17% slower on the H200 (docs/NOTES.md, session 9). DeepGEMM sets the same bits by patching its cubins."""
    cleared = set_ = 0
    for match in _WORDS.finditer(disassemble(cubin)):
        if match.group(1).split(".")[0] not in opcodes:
            continue
        if (int(match.group(2), 16) >> _YIELD_BIT) & 1:
            set_ += 1
        else:
            cleared += 1
    return cleared, set_


_INSTR_TEXT = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_UR = re.compile(r"\bUR(\d+)\b")


def wgmma_vector_descriptors(cubin: bytes) -> int:
    """wgmma instructions (HGMMA, QGMMA, ...) with a descriptor register last written by R2UR: the descriptors
    were computed in vector registers and moved over before the issue. ptxas did that for a whole main loop when a
    global load was in flight across it (the bias read ahead of the loop): an R2UR chain before every wgmma, FP8
    bias+gelu 6-15% slower on the H200 (docs/NOTES.md, session 52). Kernels keep them in uniform registers."""
    writer: dict[int, str] = {}
    count = 0
    for match in _INSTR_TEXT.finditer(disassemble(cubin)):
        opcode, operands = match.group(1).split(".")[0], match.group(2)
        registers = [int(r) for r in _UR.findall(operands)]
        if opcode.endswith("GMMA") and "gdesc[" in operands:
            base = int(_UR.search(operands[operands.index("gdesc["):]).group(1))
            count += any(writer.get(base + i) == "R2UR" for i in range(4))
        elif registers and operands.lstrip().startswith("UR"):
            writer[registers[0]] = opcode  # the destination (uniform 64-bit writes name their first register)
            if ".64" in match.group(1):
                writer[registers[0] + 1] = opcode
    return count


def tma_loads(cubin: bytes) -> tuple[int, int]:
    """(UTMALDG without an L2 cache policy, with one): a load given a policy (PTX ``.L2::cache_hint``) carries it
    as a ``desc[URx]`` operand. The sm90 kernels load B evict-first when few tiles share it (gemm_sm90.cuh,
    kStreamBMaxReaders), so each B box is issued in both forms and each A box in the plain one."""
    lines = [line for line in disassemble(cubin).splitlines() if "UTMALDG" in line]
    hinted = sum("desc[" in line for line in lines)
    return len(lines) - hinted, hinted


def resource_usage(cubin: bytes) -> dict[str, dict[str, int]]:
    """Per function: REG, STACK, SHARED, LOCAL, ... as reported by cuobjdump -res-usage."""
    out: dict[str, dict[str, int]] = {}
    for match in _RES.finditer(_run(["-res-usage"], cubin)):
        fields = dict(re.findall(r"([A-Z_\[\]0-9]+):(\d+)", match.group(2)))
        out[match.group(1)] = {k: int(v) for k, v in fields.items()}
    return out
