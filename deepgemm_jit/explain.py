"""What was chosen and compiled for a Gemm: spec, config, cache entry, resources, SASS."""
from __future__ import annotations

import dataclasses

from . import sass


def describe(gemm, *, with_sass: bool = True) -> dict:
    art = gemm.artifact
    info = {
        "spec": dataclasses.asdict(gemm.spec),
        "arch": gemm.arch,
        "m_hint": gemm.m_hint,
        "family": gemm.config.family,
        "config": dataclasses.asdict(gemm.config),
        "config_tag": gemm.config.tag,
        "cache_key": art.key,
        "cubin": art.cubin_path,
        "cubin_bytes": len(art.cubin),
        "entry": art.entry,
        "num_threads": gemm.config.num_threads,
        "registers": art.meta.get("registers"),
        "shared_bytes": art.meta.get("dynamic_smem_bytes", 0) + art.meta.get("static_smem_bytes", 0),
        "local_bytes": None,
        "spill_bytes": (art.meta.get("spill_store_bytes", 0) or 0) + (art.meta.get("spill_load_bytes", 0) or 0),
        "compile_seconds": art.meta.get("compile_seconds"),
    }
    if with_sass:
        usage = sass.resource_usage(art.cubin).get(art.entry, {})
        info["registers"] = usage.get("REG", info["registers"])
        info["local_bytes"] = usage.get("LOCAL", 0) + usage.get("STACK", 0)
        info["sass"] = sass.opcode_mix(art.cubin)
    else:
        info["local_bytes"] = art.meta.get("stack_bytes")
    return info
