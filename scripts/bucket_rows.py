"""Rows for scripts/exp_ab_rows.sh where the 128-row M buckets above OLD_TOP rows change the pick: each line is
"DTYPE:MxNxK OLD NEW" for a random problem with M in the range, OLD the pick with buckets.M_BUCKET_STEPS' last
range ending at OLD_TOP (powers of two above it: before session 54, every M of (4096, 8192] took the tile chosen for
8192 rows) and NEW the pick under M_BUCKET_STEPS as it stands, both with stages and D ring, so that one device call
shows which bucket's pick runs faster at the problem's own M. Problems whose picks agree, or where either pick is
split-K or ping-pong, are skipped. No GPU. Session 54's run: --rows 24 --seed 54 --m 4097-8192, then --rows 14
--seed 55 --m 8193-16384 (before the FP8 block straddle price, sm90_rules.SM90_BLOCK_STRADDLE_MAIN_LOOP_COST, which
changed the new picks of some FP8 block rows: the same seeds now draw other rows there).

    python3 -m scripts.bucket_rows [--rows 24] [--seed 54] [--dtypes bf16,fp16,fp8_tensor,fp8_block,fp8_row]
                                   [--m 4097-16384] [--old-top 4096] [--out ROWS_FILE]
"""
from __future__ import annotations

import argparse

from bench import runner
from bench.suites import Case
from deepgemm_jit import buckets, config

from .random_rows import add_arguments, draw_rows, write_rows
from .swap_ab_rows import NUM_SMS, tile_text


def pick_with_steps(spec, m: int, steps: tuple) -> config.KernelConfig:
    """choose_config's pick at M = m with buckets.M_BUCKET_STEPS set to `steps` for the call (the experiments' rule
    switch, bench.runner.config_constants)."""
    with runner.config_constants({"M_BUCKET_STEPS": steps}):
        return config.choose_config(spec, m, "sm_90a", NUM_SMS)


def bucket_row(dtype: str, m: int, n: int, k: int, old_top: int) -> str | None:
    """The A/B line of one problem, or None where the two picks agree or either is split-K or ping-pong."""
    spec = Case(suite="buckets", dtype=dtype, layout="nt", m=m, n=n, k=k).make_spec()
    lo, _, step = buckets.M_BUCKET_STEPS[-1]
    old = pick_with_steps(spec, m, buckets.M_BUCKET_STEPS[:-1] + ((lo, old_top, step),))
    new = pick_with_steps(spec, m, buckets.M_BUCKET_STEPS)
    if old == new or any(cfg.split_k or cfg.pingpong for cfg in (old, new)):
        return None
    return f"{dtype}:{m}x{n}x{k} {tile_text(old)} {tile_text(new)}"


def bucket_rows(count: int, seed: int, dtypes: list[str], m_range: tuple[int, int], old_top: int) -> list[str]:
    """`count` lines of random (dtype, M, (N, K)) drawn with `seed` (random_rows.draw_rows)."""
    return draw_rows(count, seed, dtypes, m_range, lambda dtype, m, n, k: bucket_row(dtype, m, n, k, old_top))


def main() -> int:
    ap = argparse.ArgumentParser()
    add_arguments(ap, rows=24, seed=54, dtypes="bf16,fp16,fp8_tensor,fp8_block,fp8_row", m="4097-16384")
    ap.add_argument("--old-top", type=int, default=4096, help="where the old 128-row buckets ended")
    args = ap.parse_args()
    return write_rows(args, lambda dtype, m, n, k: bucket_row(dtype, m, n, k, args.old_top))


if __name__ == "__main__":
    raise SystemExit(main())
