"""Rows for scripts/exp_ab_rows.sh that audit the cost model at random: each line is "DTYPE:MxNxK RUNNER_UP
[SWAPPED]" for a random problem whose pick is an unsplit cooperative tile, with the model's next usual tile of another
shape and, where swapped tiles are weighed, its cheapest swapped tile other than the pick, all with stages and D
ring, so that one device call shows whether the pick is the fastest of the three ("new" in exp_ab_rows.sh is the
pick). No GPU. Session 53's audit (seed 53, 16 rows): the pick best or within 0.2% on 13 of 15.

    python3 -m scripts.cost_model_audit [--rows 16] [--seed 53] [--dtypes bf16,fp8_tensor,fp8_block,fp8_row]
                                        [--m 257-3000] [--out ROWS_FILE]
"""
from __future__ import annotations

import argparse

from bench.suites import Case
from deepgemm_jit import config, sm90_swap_ab

from .random_rows import add_arguments, draw_rows, write_rows
from .swap_ab_rows import NUM_SMS, tile_text


def audit_row(dtype: str, m: int, n: int, k: int) -> str | None:
    """The audit line of one problem, or None where the pick is split-K or ping-pong (tiles the runner-ups do not
    compete with) or the model has no alternative."""
    spec = Case(suite="audit", dtype=dtype, layout="nt", m=m, n=n, k=k).make_spec()
    pick = config.choose_config(spec, m, "sm_90a", NUM_SMS)
    if pick.split_k or pick.pingpong:
        return None
    shape = (pick.block_m, pick.block_n, pick.swap_ab)
    alternatives = [tile_text(cfg) for cfg in config.sm90_ranked(spec, config.usual_tile_bucket(spec, m), NUM_SMS)
                    if not cfg.split_k and not cfg.pingpong and (cfg.block_m, cfg.block_n, cfg.swap_ab) != shape][:1]
    if sm90_swap_ab.sm90_swap_ab_costed(spec, m):
        bucket = config.tile_bucket(spec, m)
        swapped = [config.sm90_config(spec, block_m, block_n, stages, swap_ab=True)
                   for _, block_m, block_n, stages in sm90_swap_ab.sm90_swap_ab_tiles(spec, bucket, NUM_SMS)
                   if (block_m, block_n, True) != shape]
        alternatives += [tile_text(cfg) for cfg in swapped[:1]]
    if not alternatives:
        return None
    return f"{dtype}:{m}x{n}x{k} " + " ".join(alternatives)


def audit_rows(count: int, seed: int, dtypes: list[str], m_range: tuple[int, int]) -> list[str]:
    """`count` audit lines of random (dtype, M, (N, K)) drawn with `seed` (random_rows.draw_rows)."""
    return draw_rows(count, seed, dtypes, m_range, audit_row)


def main() -> int:
    ap = argparse.ArgumentParser()
    add_arguments(ap, rows=16, seed=53, dtypes="bf16,fp8_tensor,fp8_block,fp8_row", m="257-3000")
    return write_rows(ap.parse_args(), audit_row)


if __name__ == "__main__":
    raise SystemExit(main())
