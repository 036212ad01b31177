"""The random draw and command line that scripts/cost_model_audit.py and scripts/bucket_rows.py share: rows for
scripts/exp_ab_rows.sh, one per random (dtype, M, (N, K)) from the DeepSeek and models suites' shapes that the
script's row function keeps. No GPU."""
from __future__ import annotations

import argparse
import random
from typing import Callable

from bench.suites import _DEEPSEEK_NK, _MODELS_NK

Row = Callable[[str, int, int, int], "str | None"]  # (dtype, m, n, k) -> a rows-file line, or None to skip


def draw_rows(count: int, seed: int, dtypes: list[str], m_range: tuple[int, int], row: Row) -> list[str]:
    """`count` lines of `row` over random (dtype, M in m_range, (N, K)) drawn with `seed`, problems it skips left out
    (fewer lines if 200 x count draws do not find them)."""
    rng = random.Random(seed)
    rows: list[str] = []
    for _ in range(200 * count):
        if len(rows) == count:
            break
        dtype = rng.choice(dtypes)
        n, k = rng.choice(_DEEPSEEK_NK + _MODELS_NK)
        line = row(dtype, rng.randint(*m_range), n, k)
        if line is not None:
            rows.append(line)
    return rows


def add_arguments(ap: argparse.ArgumentParser, rows: int, seed: int, dtypes: str, m: str) -> None:
    """--rows, --seed, --dtypes, --m (lo-hi) with these defaults, and --out."""
    ap.add_argument("--rows", type=int, default=rows)
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument("--dtypes", default=dtypes)
    ap.add_argument("--m", default=m, help="M range lo-hi")
    ap.add_argument("--out", default=None, help="rows file for scripts/exp_ab_rows.sh (default: print)")


def write_rows(args: argparse.Namespace, row: Row) -> int:
    """Draw the rows add_arguments' options ask for, print them, and write them to --out if given."""
    lo, hi = (int(x) for x in args.m.split("-"))
    text = "\n".join(draw_rows(args.rows, args.seed, args.dtypes.split(","), (lo, hi), row)) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text, end="")
    return 0
