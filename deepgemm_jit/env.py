"""Environment switches, declared once, typed, read lazily (never at import).

| variable                         | type | meaning                                                  |
|----------------------------------|------|----------------------------------------------------------|
| DEEPGEMM_JIT_CACHE_DIR           | path | kernel cache location (default: the user cache dir)      |
| DEEPGEMM_JIT_DISABLE_DISK_CACHE  | bool | compile in memory only; never read or write the disk     |
| DEEPGEMM_JIT_VERBOSE             | bool | print one line per compile / disk load to stderr          |
| DEEPGEMM_JIT_OFFLINE             | bool | never compile: a kernel missing from the cache is an error|
|                                  |      | naming the `deepgemm-jit warmup` line that would make it  |
| DEEPGEMM_JIT_TUNE                | bool | `build()` tunes (times candidates on the GPU) when no     |
|                                  |      | tuning result is stored for the problem (as tune=True);   |
|                                  |      | offline builds (arch=, explain, warmup) stay untuned      |
| DEEPGEMM_JIT_TEMPLATES_DIR       | path | render kernels from another copy of `templates/` (kernel  |
|                                  |      | experiments; the cache key hashes what is rendered)       |
| DEEPGEMM_JIT_NO_BULK_SCALES      | bool | experiments: FP8 block kernels copy A scales with the     |
|                                  |      | scale warp even where scale_a allows the bulk copy        |
| DEEPGEMM_JIT_NO_D_RING           | bool | experiments: the heuristic stages whole D tiles where it  |
|                                  |      | would store them through a slice ring (sm90_d_ring)       |
| DEEPGEMM_JIT_NO_RAW_B            | bool | experiments: fp32 (3xTF32) splits the weight too at small |
|                                  |      | M instead of reading it raw (fp32x3.raw_b_applies)        |
| DEEPGEMM_JIT_NO_PROGRAMMATIC_LAUNCH | bool | launch every kernel ordinarily (no programmatic    |
|                                  |      | dependent launch: launch.LaunchPlan.pdl), e.g. to profile |
"""
from __future__ import annotations

import os
from pathlib import Path

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"environment variable {name}={raw!r} is not a boolean (use 1/0, true/false)")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def cache_dir() -> Path:
    raw = os.environ.get("DEEPGEMM_JIT_CACHE_DIR")
    if raw:
        return Path(raw).expanduser()
    import platformdirs  # only needed when no directory is given

    return Path(platformdirs.user_cache_dir("deepgemm-jit"))


def disk_cache_disabled() -> bool:
    return env_bool("DEEPGEMM_JIT_DISABLE_DISK_CACHE")


def verbose() -> bool:
    return env_bool("DEEPGEMM_JIT_VERBOSE")


def cupy_tf32() -> bool:
    """CuPy's own switch (read as CuPy reads it): with CUPY_TF32=1 its float32 matmuls run on TF32."""
    return os.environ.get("CUPY_TF32", "0") == "1"


def templates_dir_override() -> Path | None:
    raw = os.environ.get("DEEPGEMM_JIT_TEMPLATES_DIR")
    return Path(raw).expanduser() if raw else None


def offline() -> bool:
    return env_bool("DEEPGEMM_JIT_OFFLINE")


def tune() -> bool:
    return env_bool("DEEPGEMM_JIT_TUNE")


def no_bulk_scales() -> bool:
    """Experiments (A/B, bitwise comparisons): never set the sm90 block kernels' bulk A-scale flag
    (launch.bulk_a_scales); read per launch plan, so a kept plan keeps the value it was made with."""
    return env_bool("DEEPGEMM_JIT_NO_BULK_SCALES")


def no_a_edge() -> bool:
    """Experiments (same-run A/B of launch.edge_maps): load A's partial last M block through the whole-box map, as
    before the edge maps; read per launch plan, so a kept plan keeps the value it was made with."""
    return env_bool("DEEPGEMM_JIT_NO_A_EDGE")


def no_d_ring() -> bool:
    """Experiments (same-run A/B of sm90_rules.sm90_d_ring's rule); read when a config is chosen, and choices are
    memoized per process, so set it before the first build."""
    return env_bool("DEEPGEMM_JIT_NO_D_RING")


def no_raw_b() -> bool:
    """Experiments (same-run A/B of fp32x3.raw_b_applies); read when build_fp32 chooses its TF32 GEMM."""
    return env_bool("DEEPGEMM_JIT_NO_RAW_B")


def no_programmatic_launch() -> bool:
    """Launch every kernel ordinarily, never with programmatic stream serialization (launch.LaunchPlan.pdl): for
    profilers or tools that do not follow it, and A/B runs; read per launch plan, so a kept plan keeps the value
    it was made with."""
    return env_bool("DEEPGEMM_JIT_NO_PROGRAMMATIC_LAUNCH")
