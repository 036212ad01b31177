"""Snapshot of the heuristic's decisions, for refactors that must not change them: build()'s pick (choose_config),
the tuner's candidates (candidate_configs), the sm90 model's ranked list and two-share split-K tile and the M
buckets, over a grid of specs (every input type and scaling, layouts, epilogues, grouped GEMMs) and M values, as
JSON (~7400 entries, ~20 s on 2 cores). Diff two snapshots (before / after) to see every decision a change moved.
No GPU.

    python3 -m scripts.heuristic_snapshot OUT.json
    python3 -m scripts.heuristic_snapshot --diff BEFORE.json AFTER.json    (exit 1 when they differ)
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys

from bench.suites import _DEEPSEEK_NK, _MODELS_NK
from deepgemm_jit import buckets, config
from deepgemm_jit.spec import GemmSpec

NUM_SMS = 132  # the H200's
M_VALUES = (1, 2, 8, 16, 32, 64, 100, 128, 160, 192, 256, 300, 384, 586, 1050, 2048, 4096, 6537, 16384, 20000)
ODD_NK = ((1000, 1000), (4097, 4104), (257, 136))
# (dtype, scaling, layout, epilogue, grouped, groups)
KINDS = (
    ("bf16", "none", "nt", "none", False, 1), ("fp16", "none", "nt", "none", False, 1),
    ("bf16", "none", "nn", "none", False, 1), ("tf32", "none", "nt", "none", False, 1),
    ("tf32", "none", "nn", "none", False, 1), ("int8", "none", "nt", "none", False, 1),
    ("fp8", "tensor", "nt", "none", False, 1), ("fp8", "row", "nt", "none", False, 1),
    ("fp8", "block", "nt", "none", False, 1),
    ("bf16", "none", "nt", "bias+gelu", False, 1), ("bf16", "none", "nt", "swiglu", False, 1),
    ("bf16", "none", "nt", "quant_fp8_g128", False, 1), ("fp8", "tensor", "nt", "bias+gelu", False, 1),
    ("fp8", "block", "nt", "bias+gelu+quant_fp8_g128", False, 1),
    ("fp8", "block", "nt", "none", True, 4), ("fp8", "block", "nt", "none", True, 32),
    ("bf16", "none", "nt", "none", True, 8), ("bf16", "none", "nt", "swiglu", True, 8),
)


def _text(fn):
    try:
        return fn()
    except (ValueError, NotImplementedError) as exc:
        return f"error: {type(exc).__name__}: {exc}"


def snapshot() -> dict[str, object]:
    out: dict[str, object] = {"buckets": {str(m): buckets.m_bucket(m) for m in range(1, 20001, 37)}}
    for (dtype, scaling, layout, epilogue, grouped, groups), (n, k) in itertools.product(
            KINDS, _DEEPSEEK_NK + _MODELS_NK + ODD_NK):
        spec = _text(lambda: GemmSpec.create(n, k, dtype=dtype, scaling=scaling, layout=layout, epilogue=epilogue,
                                             grouped=grouped))
        key = f"{dtype}/{scaling}/{layout}/{epilogue}/{'g%d' % groups if grouped else 'dense'}:{n}x{k}"
        if isinstance(spec, str):
            out[key] = spec
            continue
        for m in M_VALUES:
            row = {"pick": _text(lambda: repr(config.choose_config(spec, m, "sm_90a", NUM_SMS, groups=groups)))}
            if not grouped:
                row["candidates"] = _text(lambda: [repr(c) for c in config.candidate_configs(spec, m, "sm_90a",
                                                                                           NUM_SMS)])
                row["bucket"] = _text(lambda: config.m_bucket_for(spec, m))
            if config.sm90_supports(spec, "sm_90a"):
                row["ranked"] = _text(lambda: [repr(c) for c in config.sm90_ranked(
                    spec, config.usual_tile_bucket(spec, m), NUM_SMS)][:6])
                row["split2"] = _text(lambda: repr(config.sm90_split_config(spec, m, NUM_SMS, 2)))
            out[f"{key}@{m}"] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+", help="OUT.json, or BEFORE.json AFTER.json with --diff")
    ap.add_argument("--diff", action="store_true")
    args = ap.parse_args()
    if not args.diff:
        with open(args.paths[0], "w") as f:
            json.dump(snapshot(), f, indent=0, sort_keys=True)
        return 0
    before, after = (json.load(open(p)) for p in args.paths)
    moved = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    for key in moved[:50]:
        print(key, "\n  before:", before.get(key), "\n  after: ", after.get(key))
    print(f"{len(moved)} of {len(before.keys() | after.keys())} entries differ", file=sys.stderr)
    return 1 if moved else 0


if __name__ == "__main__":
    raise SystemExit(main())
