"""Reading compiled cubins: SASS opcode mix and resource usage (via cuobjdump).

cuobjdump comes from the ``nvidia-cuda-cuobjdump`` wheel (a dependency) or the
CUDA toolkit on PATH; no GPU is needed.
"""
from __future__ import annotations

import collections
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


def disassemble(cubin: bytes) -> str:
    return _run(["-sass"], cubin)


def opcode_mix(cubin: bytes) -> dict[str, int]:
    """Opcode (without modifiers, e.g. 'HMMA', 'HGMMA', 'LDGSTS') -> count."""
    counts = collections.Counter(m.group(1) for m in _INSTR.finditer(disassemble(cubin)))
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def resource_usage(cubin: bytes) -> dict[str, dict[str, int]]:
    """Per function: REG, STACK, SHARED, LOCAL, ... as reported by cuobjdump -res-usage."""
    out: dict[str, dict[str, int]] = {}
    for match in _RES.finditer(_run(["-res-usage"], cubin)):
        fields = dict(re.findall(r"([A-Z_\[\]0-9]+):(\d+)", match.group(2)))
        out[match.group(1)] = {k: int(v) for k, v in fields.items()}
    return out
