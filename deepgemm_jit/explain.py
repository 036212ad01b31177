"""What was chosen and compiled for a Gemm: spec, config, cache entry, resources, SASS."""
from __future__ import annotations

import dataclasses

from . import config as config_mod
from . import compiler, cubin, gemv, gemv_kn, gemv_rows, launch, sass, sm90_rules, sm90_tiles, splitk


def describe(gemm, *, with_sass: bool = True) -> dict:
    art = gemm.artifact
    info = {
        "spec": dataclasses.asdict(gemm.spec),
        "arch": gemm.arch,
        "m_hint": gemm.m_hint,
        # the M the heuristic chose the tile for
        "m_bucket": config_mod.tile_bucket(gemm.artifact.spec, gemm.m_hint),
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
        # ptxas's notes that the kernel's wgmmas lost their overlap (compiler.SERIALIZATION_WARNINGS); [] is right.
        "wgmma_serialized": compiler.serialization_warnings(art.meta.get("log") or ""),
        "weight_streaming": _weight_streaming(gemm),
        "split_k": _split_k(gemm),
        # Consumer warpgroups sharing each tile's K blocks (2: a 64-row FP8 tile's K lanes, sm90_tiles.sm90_wg_split_k).
        "k_lanes": (2 if gemm.config.family == "sm90" and sm90_tiles.sm90_wg_split_k(
            gemm.artifact.spec, gemm.config.block_m, gemm.config.pingpong, gemm.config.swap_ab) else 1),
        # CTAs per thread-block cluster (quant_fp8_g128 tiles narrower than a 1x128 group quantize across one:
        # sm90_tiles.sm90_quant_cluster); 1 elsewhere.
        "cluster": (sm90_tiles.sm90_quant_cluster(gemm.artifact.spec, gemm.config.block_n)
                    if gemm.config.family == "sm90" else 1),
        # Partial-sum sets of a promoted K loop (2: wgmmas run while one set is promoted: the next K block's,
        # sm90_tiles.sm90_two_partial_sets, or on wide tiles the other half of this one's, sm90_half_partial_sets);
        # 0 without promotion.
        "partial_sets": _partial_sets(gemm),
        "b_evict_first": _b_evict_first(gemm),
        "edge_maps": _edge_maps(gemm),
        "staging": _staging(gemm),
    }
    if with_sass:
        usage = sass.resource_usage(art.cubin).get(art.entry, {})
        info["registers"] = usage.get("REG", info["registers"])
        info["local_bytes"] = usage.get("LOCAL", 0) + usage.get("STACK", 0)
        info["sass"] = sass.opcode_mix(art.cubin)
    else:
        info["local_bytes"] = art.meta.get("stack_bytes")
    return info


def _staging(gemm) -> dict | None:
    """Whether packed (contiguous) operands of this spec are read in place by TMA or copied into aligned buffers on
    every call (staging.py: rows of K, an MN-major B's N or D's N_out not a multiple of 16 bytes), and which ones
    calls may copy (rows an odd multiple of 16 bytes: sm90_rules.sm90_realign_roles); an MN-major A's rows are M
    long (per call). None for the portable family."""
    if gemm.config.family != "sm90":
        return None
    kspec = gemm.artifact.spec
    if kspec.layout != gemm.spec.layout:  # sm90_rules.kernel_spec: the nt twin, or tn's nn twin at small M
        moved = list(gemm.transposed_operands)
        rows = [role for role in sm90_tiles.sm90_unaligned_rows(kspec) if role not in moved]
        info = {"packed_staged": sorted(moved + rows), "transposed": moved, "kernel_spec": kspec.tag,
                "kernel_layout": kspec.layout,
                "note": f"{' and '.join(moved)} (MN-major TF32) transposed into K-major buffers on every call "
                        "(copies.py): Hopper's TF32 WGMMA reads K-major operands only"
                        + (f"; {', '.join(rows)} copied into 128-byte-pitched buffers" if rows else "")}
    else:
        rows = sm90_tiles.sm90_unaligned_rows(kspec)
        info = {"packed_staged": rows, "note": ("copied into 128-byte-pitched buffers on every call: pad these rows "
                                                "to a multiple of 32 bytes to skip the copies")
                if rows else "read in place"}
    if sm90_tiles.sm90_trans_b(kspec):  # TF32 nn (or tn's nn twin) at small M (sm90_rules.SM90_TF32_TRANS_B_MAX_M)
        info["transposed_in_kernel"] = ["b"]
        info["transpose_note"] = ("b (TF32, stored (K, N)) read as stored and transposed in shared memory by the "
                                  "kernel's converter warps, one stage each in turn; builds for more than "
                                  f"{sm90_rules.SM90_TF32_TRANS_B_MAX_M} rows run the nt kernel on per-call copies")
    # (a twin's transposed operands land in aligned buffers; its other operand is read as stored, and realigned
    # like any: the twin returned here before, so explain hid a copy every call made; review, session 60)
    off_sector = [role for role in sm90_tiles.sm90_off_sector_rows(kspec) if role not in info.get("transposed", ())]
    if off_sector:
        info["realigned"] = off_sector
        info["realign_note"] = (
            f"{' and '.join(off_sector)}: rows an odd multiple of 16 bytes, which TMA reads ~1.5x slower; a call "
            "copies those whose copy pays into 128-byte-pitched buffers (B is re-read by every M block, A by every N "
            "block; tiles wider than 128 x 160 copy one at most: sm90_rules.sm90_realign_roles); rows padded to a "
            "multiple of 32 bytes need neither the copies nor the slow reads")
    return info


def _weight_streaming(gemm) -> dict:
    """Which calls run a decode kernel (gemv.py; gemv_kn.py for weights stored (K, N)) instead of the one above, and
    how it launches (not compiled here: it is built on the first such call, or by get_kernel / warmup)."""
    max_m = getattr(gemm, "weight_streaming_max_m", 0)
    if not max_m:
        return {"max_m": 0}
    if gemm.weight_streaming_kernel is gemv_kn:  # weights stored (K, N)
        return dict(gemv_kn.describe(gemm.spec, gemm.arch, _num_sms()), condition="16-byte aligned rows of b")
    spec, arch = gemm.artifact.spec, gemm.arch
    info = {"max_m": max_m, "kernels": sorted({gemv.kernel_for(spec, m, arch).tag for m in range(1, max_m + 1)}),
            "condition": "16-byte aligned rows of a and b"}
    rows_max_m = gemv_rows.max_m(spec, arch)
    if rows_max_m:  # the smallest M: the row sweep (gemv_rows.py), its M = 1 launch
        info["row_sweep"] = {"max_m": rows_max_m, **gemv_rows.describe(spec, 1, _num_sms())}
    if gemv.mma_max_m(spec, arch):  # the mma.sync kernel's launch at its smallest M
        m = rows_max_m + 1
        warps_k = gemv.launch_warps_k(spec, gemv.GemvSpec.for_gemm(spec, m), _num_sms())
        info.update(warps_k=warps_k, grid=gemv.grid_size(spec.n, warps_k), num_threads=32 * gemv.NUM_WARPS)
    return info


def _partial_sets(gemm) -> int:
    cfg, spec = gemm.config, gemm.artifact.spec
    if cfg.family != "sm90" or not spec.promote:
        return 0
    args = (spec, cfg.block_m, cfg.block_n, cfg.pingpong, cfg.swap_ab)
    return 2 if sm90_tiles.sm90_two_partial_sets(*args) or sm90_tiles.sm90_half_partial_sets(*args) else 1


def _b_evict_first(gemm) -> dict | None:
    """When the sm90 kernel loads B with an L2 evict-first policy (gemm_sm90.cuh, kStreamBMaxReaders): at most
    `max_m_blocks` M blocks read each B tile, i.e. M <= max_rows (grouped: each group's rows); None for kernels
    without the rule (other families, templates before it)."""
    art = gemm.artifact
    readers = cubin.optional_entry_symbol(art.cubin, art.entry, "stream_b_max_readers")
    if gemm.config.family != "sm90" or readers is None:
        return None
    rows = readers * gemm.config.block_m
    return {"max_m_blocks": readers, "max_rows": rows, "per": "group" if gemm.artifact.spec.grouped else "call",
            "at_m_hint": -(-gemm.m_hint // gemm.config.block_m) <= readers if gemm.m_hint else None}


def _edge_maps(gemm) -> dict | None:
    """How the sm90 kernel loads a partial last M / N block (launch.edge_maps): `a_rows_at_m_hint` the rows of A's
    edge map at the build's M (M % block_m; 0: whole boxes, where M is whole tiles, one tile, or launch.a_edge_used
    leaves a wide tile's edge block to TMA's fill; None without an M), the rule's constants, and `b_rows` the rows of
    B's edge box (N % block_n; 0: N is whole tiles); None for kernels without edge maps (grouped, other families,
    templates before them)."""
    art, spec = gemm.artifact, gemm.artifact.spec
    if gemm.config.family != "sm90" or not launch.takes(art, "edge_maps"):
        return None
    return {"a_rows_at_m_hint": launch.a_edge_rows(art, spec, gemm.m_hint) if gemm.m_hint else None,
            "a_max_block_n": launch.A_EDGE_MAX_BLOCK_N,
            "a_wide": {"max_last_band": launch.A_EDGE_WIDE_MAX_LAST_BAND, "max_rows": launch.A_EDGE_WIDE_MAX_ROWS},
            "b_rows": launch.b_edge_rows(art, spec)}


def _num_sms() -> int:
    """The current GPU's SM count, or 132 (the H200's) without a GPU: launch shapes depend on it."""
    from . import device

    return device.num_sms_or(sm90_tiles.DEFAULT_SM90_NUM_SMS)


# The M values explain() shows the split-K rule at (grouped: tile counts of a launch).
_SPLIT_EXAMPLE_MS = (1, 16, 32, 64, 128, 256, 512, 1024, 4096)
_GROUPED_SPLIT_EXAMPLE_TILES = (32, 64, 96, 128, 160, 200, 264, 300)


def _split_k(gemm) -> dict:
    """Whether the kernel is a split-K one and how many shares calls of a few M get (splitk.py's rule, for the
    SM count of the GPU the Gemm was built for, or 132 without one)."""
    cfg = gemm.config
    if not cfg.split_k:
        return {"kernel": False}
    num_sms = _num_sms()
    deterministic = not getattr(gemm, "split_adds_atomically", False)
    if gemm.artifact.spec.grouped:  # shares decided on the device from the realised tiles (splitk.tail_split)
        return {"kernel": True, "on_device": True, "max_splits": gemm.max_splits, "num_sms": num_sms,
                "whole_and_shares_by_tiles": {t: splitk.tail_split(t, num_sms, gemm.max_splits)
                                              for t in _GROUPED_SPLIT_EXAMPLE_TILES},
                "deterministic": deterministic}
    forced = getattr(gemm, "split_k", None)
    return {"kernel": True, "forced": forced, "num_sms": num_sms,
            "splits_by_m": {m: splitk.num_splits(gemm.artifact.spec, cfg, m, num_sms, forced)
                            for m in _SPLIT_EXAMPLE_MS},
            "deterministic": deterministic}
