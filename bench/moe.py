"""Grouped GEMMs for mixture-of-experts (issue 8): ``dg.build_grouped`` against torch's grouped matmuls.

    python -m bench.moe [--layout contiguous,masked] [--dtype bf16,fp8] [--quick] [--only REGEX]
                        [--tiles BMxBN[sS],...] [--reps 30] [--out bench/results] [--list]

Rows (``cases``), each for (N, K) in ``MOE_NK`` = {(4096, 7168), (7168, 2048)} and dtype bf16 / fp8 (E4M3, 1x128
activation groups x 128x128 weight blocks, BF16 out):

- contiguous: the rows of all groups stacked in one a (M, K), b (G, N, K); G x rows in {4 x 8192, 8 x 4096}, as
  - ``offs`` ``even``: every group has `rows` rows, ``g(a, b, offs=ends)`` (torch._grouped_mm's convention);
  - ``offs`` ``uneven``: the same total, split by random weights (log-normal, sigma 0.5: the largest group is
    typically 2-4x the smallest), as a router hands them out (``uneven_sizes``);
  - ``m_indices`` ``uneven``: the same sizes, each group padded to a multiple of 128 rows with -1 rows
    (DeepGEMM's contiguous layout), ``g(a, b, m_indices=ids)``; the padding rows must stay untouched.
- masked: a (G, max_m, K), G in {1, 2, 4, 8, 16}, expected rows per group in {256, 512, 1024}; the valid
  counts are drawn uniformly in [expected/2, 3*expected/2] (``masked_counts``), max_m = that upper end rounded up
  to 128 rows; ``g(a, b, masked_m=counts)``; rows past a group's count must stay untouched.

Group sizes come from ``--sizes-seed`` (default 0) and the row's layout, G and rows only: every run, both
dtypes and both (N, K) see the same sizes (stored per row as ``group_sizes``). Operand values are fresh N(0, 1)
(rounded to BF16; FP8 rows quantize them with ``deepgemm_jit.quantize``), seeded by ``--seed`` + row.

Each row is checked before it is timed: the output is filled with NaN bytes and passed as ``out=``; the valid
rows are compared with a float64 per-group product (``reference.error``, rel. Frobenius, against the product of
the dequantized operands for FP8, bound ``reference.within_bound``); every padding / masked row must still hold
its NaN bytes. FP8 rows also record DeepGEMM's cos difference against the BF16-input product (``err_cos``, not
judged). A row that fails is not timed. The baselines are checked the same way; one that fails is not timed.

Contenders, timed with ``timing.time_interleaved`` (L2 flushed before every call, interleaved, medians):

- ``ours``: the grouped call above, into the same ``out=``.
- ``grouped`` (bf16): ``torch._grouped_mm(a_valid, b.transpose(-2, -1), offs=ends)`` on the valid rows; for the
  masked and m_indices rows the valid rows are packed into one (sum(rows), K) tensor once, outside the timing
  (which favours torch).
- ``loop``: one cuBLAS call per group on the group's valid rows, timed as one unit: ``torch.mm(a_g, b_g.T,
  out=)`` (bf16) or ``F.scaled_mm(a_g, b_g.T, 1x128, 128x128)`` (fp8, the same recipe as ours; the scale layouts
  of ``deepgemm_jit.baseline.torch_scaled_mm_calls``, made once outside the timing).
- ``rowwise`` (fp8, information only, ``--no-rowwise`` drops it): ``torch._scaled_grouped_mm`` with ROW-WISE
  scales, the only FP8 grouped GEMM torch has on sm90 (its grouped dispatch knows rowwise, MXFP8, MXFP4 and
  NVFP4, no 1x128 / 128x128 block recipe). A cheaper recipe: it runs on its own row-wise quantization of the
  same BF16 values, is checked against its own dequantized product, and never enters the ratio.

The baseline of a row is the faster of the same-recipe torch contenders that passed their check (bf16: grouped
or loop; fp8: loop); ``ratio`` = baseline µs / our µs (> 1: we are faster). TFLOPS count the valid rows only:
2 * sum(rows) * N * K / t. Issue 8's bar: geomean ratio >= 1.2 for bf16 and for fp8; fp8 contiguous 4 x 8192
with N = 4096, K = 7168 at >= 1350 TFLOPS (``summarize``).

Tile sweeps (``--tiles 128x128,128x176,64x128s6``, the syntax of ``python -m bench --tiles``, parsed by
``suites.parse_tiles``): every row also builds ours once per forced tile, ``config.sm90_config`` on the GemmSpec
``build_grouped`` compiles for the row (``forced_config``); a tile the spec cannot take (sm90_config / check_for or
the build raise ValueError) is a ``skipped`` tile row with ``illegal`` = the reason, also named in the row's note,
and does not change the exit status. Each built tile is checked exactly as ours (its own poisoned out=, the same
float64 reference, untouched padding) and, if it passes, timed in the same interleaved call as ours and the
contenders. The row of the heuristic's tile keeps its format (plus ``tile``: ``auto``); each forced tile adds a row
after it, tagged ``<tag>_t<tile>`` as ``python -m bench``'s tile rows, with its own µs, err, config and
``ratio`` against the same baseline, and ``vs_auto`` = the row's µs / the tile's. Summaries, bars and the main
table are made of the auto rows only; the markdown adds a table of tile -> µs per row with the fastest in bold.

Results: ``<out>/<UTC date>-moe-<gitshort>[-dirty].{json,md}`` (``src<hash>`` without git; the commit passed as
DEEPGEMM_JIT_GIT_COMMIT wins, see ``report.git_info``); ``<stem>.partial.json`` is rewritten after every row.
Exit status: 0 every row ok, 1 some row failed or raised, 2 nothing could run.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import random
import re
import sys
import time
from pathlib import Path

from . import metrics, report, suites

MOE_NK = ((4096, 7168), (7168, 2048))
DTYPES = ("bf16", "fp8")
LAYOUTS = ("contiguous", "masked")
# (G, rows per group) of the contiguous rows, and their (index, sizes) variants.
CONTIGUOUS_GROUPS = ((4, 8192), (8, 4096))
CONTIGUOUS_VARIANTS = (("offs", "even"), ("offs", "uneven"), ("m_indices", "uneven"))
# Masked rows: G x expected rows per group.
MASKED_GROUPS = (1, 2, 4, 8, 16)
MASKED_EXPECTED = (256, 512, 1024)
# --quick: (layout, index, sizes, G, rows) of the smoke subset (each for both (N, K) and both dtypes).
QUICK = (("contiguous", "offs", "even", 4, 8192), ("contiguous", "offs", "uneven", 8, 4096),
         ("contiguous", "m_indices", "uneven", 8, 4096), ("masked", "masked_m", "random", 1, 1024),
         ("masked", "masked_m", "random", 4, 256), ("masked", "masked_m", "random", 16, 512))
M_ALIGN = 128          # rows per group segment of the m_indices layout, and granularity of max_m
UNEVEN_SIGMA = 0.5     # log-normal spread of the uneven group sizes
LIB_DTYPE = {"bf16": "bf16", "fp8": "fp8_e4m3"}   # the key of reference.ERROR_BOUND
OUT_DTYPE = "bf16"
POISON_BITS = 0xFFFF   # reference.POISON_BYTE twice: a bf16 NaN
BAR_RATIO = 1.2
BAR_FP8_TFLOPS = 1350.0
BAR_FP8_ROW = ("contiguous", "offs", "even", "fp8", 4, 8192, 4096, 7168)  # layout index sizes dtype G rows N K


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@dataclasses.dataclass(frozen=True)
class MoeCase:
    layout: str    # "contiguous" | "masked"
    index: str     # "offs" | "m_indices" (contiguous), "masked_m" (masked)
    sizes: str     # "even" | "uneven" (contiguous), "random" (masked)
    dtype: str     # "bf16" | "fp8"
    groups: int
    rows: int      # contiguous: rows per group (total groups * rows); masked: expected rows per group
    n: int
    k: int

    def __post_init__(self) -> None:
        allowed = {"contiguous": ({"offs", "m_indices"}, {"even", "uneven"}), "masked": ({"masked_m"}, {"random"})}
        if self.layout not in allowed:
            raise ValueError(f"layout {self.layout!r} not in {LAYOUTS}")
        indices, sizes = allowed[self.layout]
        if self.index not in indices or self.sizes not in sizes:
            raise ValueError(f"{self.layout} rows take index in {sorted(indices)} and sizes in {sorted(sizes)}, "
                             f"not {self.index!r} / {self.sizes!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} not in {DTYPES}")
        for name in ("groups", "rows", "n", "k"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive int")

    @property
    def tag(self) -> str:
        shape = f"n{self.n}k{self.k}"
        if self.layout == "masked":
            return f"{self.dtype}_masked_g{self.groups}e{self.rows}_{shape}"
        index = "midx" if self.index == "m_indices" else "offs"
        return f"{self.dtype}_contig_{index}_{self.sizes}_g{self.groups}x{self.rows}_{shape}"

    @property
    def max_m(self) -> int | None:
        """Rows per group of the masked a (G, max_m, K): the largest count that can be drawn, rounded up to 128."""
        if self.layout != "masked":
            return None
        return _round_up(self.rows * 3 // 2, M_ALIGN)

    @property
    def sizes_key(self) -> str:
        """What the group sizes depend on (besides the seed): not dtype, N or K, nor offs vs m_indices."""
        return f"{self.layout}:{self.sizes}:{self.groups}:{self.rows}"


def cases(layouts=LAYOUTS, dtypes=DTYPES, quick: bool = False) -> list[MoeCase]:
    """Every row of the run, dtype-major, then layout, then the variants, then (N, K)."""
    for name, values, allowed in (("layout", layouts, LAYOUTS), ("dtype", dtypes, DTYPES)):
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ValueError(f"unknown {name} {bad}; choose from {list(allowed)}")
    specs = []
    for layout in layouts:
        if layout == "contiguous":
            specs += [("contiguous", index, sizes, g, rows) for index, sizes in CONTIGUOUS_VARIANTS
                      for g, rows in CONTIGUOUS_GROUPS]
        else:
            specs += [("masked", "masked_m", "random", g, e) for g in MASKED_GROUPS for e in MASKED_EXPECTED]
    if quick:
        specs = [s for s in specs if s in QUICK]
    return [MoeCase(layout, index, sizes, dtype, g, rows, n, k)
            for dtype in dtypes for layout, index, sizes, g, rows in specs for n, k in MOE_NK]


# ------------------------------------------------------------------------------------ group sizes (pure Python)
def uneven_sizes(total: int, groups: int, rng: random.Random, sigma: float = UNEVEN_SIGMA) -> list[int]:
    """`groups` non-negative sizes summing exactly to `total`, proportional to log-normal weights (largest
    remainder rounding)."""
    if groups < 1 or total < 0:
        raise ValueError(f"groups={groups} must be >= 1 and total={total} >= 0")
    weights = [rng.lognormvariate(0.0, sigma) for _ in range(groups)]
    scale = total / sum(weights)
    exact = [w * scale for w in weights]
    sizes = [int(math.floor(x)) for x in exact]
    by_remainder = sorted(range(groups), key=lambda i: exact[i] - sizes[i], reverse=True)
    for i in by_remainder[:total - sum(sizes)]:
        sizes[i] += 1
    return sizes


def masked_counts(groups: int, expected: int, max_m: int, rng: random.Random) -> list[int]:
    """Valid rows per group, uniform in [expected // 2, 3 * expected // 2], clipped to [0, max_m]."""
    lo, hi = expected // 2, expected * 3 // 2
    return [min(max(rng.randint(lo, hi), 0), max_m) for _ in range(groups)]


def group_sizes(case: MoeCase, sizes_seed: int = 0) -> list[int]:
    """The valid rows of each group of `case` (deterministic in `sizes_seed` and ``case.sizes_key``)."""
    rng = random.Random(f"{sizes_seed}:{case.sizes_key}")
    if case.layout == "masked":
        return masked_counts(case.groups, case.rows, case.max_m, rng)
    if case.sizes == "even":
        return [case.rows] * case.groups
    return uneven_sizes(case.groups * case.rows, case.groups, rng)


def offsets_end(sizes) -> list[int]:
    """Cumulative END offsets (torch._grouped_mm's ``offs``): [s0, s0 + s1, ...]."""
    out, acc = [], 0
    for s in sizes:
        acc += s
        out.append(acc)
    return out


def segment_starts(case: MoeCase, sizes) -> tuple[list[int], int]:
    """(first row of each group in a, rows of a): contiguous offs: packed; m_indices: each group padded to a
    multiple of M_ALIGN rows; masked: group g starts at row g * max_m of the flattened (G * max_m, K)."""
    if case.layout == "masked":
        return [g * case.max_m for g in range(len(sizes))], len(sizes) * case.max_m
    step = [(_round_up(s, M_ALIGN) if case.index == "m_indices" else s) for s in sizes]
    starts = [e - s for e, s in zip(offsets_end(step), step)]
    return starts, sum(step)


def m_indices(sizes, align: int = M_ALIGN) -> list[int]:
    """Per-row group ids of the m_indices layout: group g's rows, then -1 rows up to a multiple of `align`."""
    ids: list[int] = []
    for g, s in enumerate(sizes):
        ids += [g] * s + [-1] * (_round_up(s, align) - s)
    return ids


def group_index(case: MoeCase, sizes) -> list[tuple]:
    """Per group, the index into a / d / scale_a of its valid rows: (slice,) for contiguous, (g, slice) masked."""
    if case.layout == "masked":
        return [(g, slice(0, s)) for g, s in enumerate(sizes)]
    starts, _ = segment_starts(case, sizes)
    return [(slice(st, st + s),) for st, s in zip(starts, sizes)]


def pad_index(case: MoeCase, sizes) -> list[tuple]:
    """Indexes into d of the rows that must stay untouched (padding of m_indices, rows past masked_m)."""
    if case.layout == "masked":
        return [(g, slice(s, case.max_m)) for g, s in enumerate(sizes) if s < case.max_m]
    if case.index != "m_indices":
        return []
    starts, _ = segment_starts(case, sizes)
    return [(slice(st + s, st + _round_up(s, M_ALIGN)),) for st, s in zip(starts, sizes) if s % M_ALIGN]


def a_shape(case: MoeCase, sizes) -> tuple[int, ...]:
    if case.layout == "masked":
        return (case.groups, case.max_m, case.k)
    return (segment_starts(case, sizes)[1], case.k)


def fp8_scale_shapes(case: MoeCase, sizes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(scale_a, scale_b) shapes of an FP8 row: group128 scales of a's rows, block128 scales per expert."""
    kb, nb = -(-case.k // 128), -(-case.n // 128)
    return a_shape(case, sizes)[:-1] + (kb,), (case.groups, nb, kb)


def valid_flops(case: MoeCase, sizes) -> int:
    return 2 * sum(sizes) * case.n * case.k


def result_stem(date_iso: str, commit: str | None, dirty: bool | None, source_sha: str) -> str:
    """'<UTC date>-moe-<gitshort>[-dirty]' (src<hash> without a commit)."""
    return report.result_stem(date_iso, ["moe"], commit, dirty, source_sha)


def torch_apis(torch) -> dict[str, bool]:
    """Which grouped / scaled matmul APIs this torch has (names only; what runs is decided per row)."""
    F = torch.nn.functional
    scaling = getattr(F, "ScalingType", None)
    return {"torch._grouped_mm": hasattr(torch, "_grouped_mm"),
            "torch._scaled_grouped_mm": hasattr(torch, "_scaled_grouped_mm"),
            "F.grouped_mm": hasattr(F, "grouped_mm"),
            "F.scaled_grouped_mm": hasattr(F, "scaled_grouped_mm"),
            "F.scaled_mm": hasattr(F, "scaled_mm"),
            "ScalingType.BlockWise1x128": scaling is not None and hasattr(scaling, "BlockWise1x128"),
            "torch._scaled_mm": hasattr(torch, "_scaled_mm")}


# --------------------------------------------------------------------------------------------------- summaries
def auto_rows(rows: list[dict]) -> list[dict]:
    """The rows of the heuristic's tiles (every row without --tiles): what summaries and bars are made of."""
    return [r for r in rows if r.get("tile", "auto") == "auto"]


def is_run_ok(rows: list[dict]) -> bool:
    """Exit status 0: every row ok, forced tiles the row's spec cannot take (``illegal``, skipped) aside."""
    return all(r["status"] == "ok" or r.get("illegal") for r in rows)


def summarize(rows: list[dict]) -> dict:
    """Geomean ratio per dtype and per (dtype, layout) over the ok rows with a ratio, and issue 8's bar (the
    heuristic's tiles only: forced --tiles rows are left out)."""
    rows = auto_rows(rows)
    out: dict = {"geomean_ratio": {}, "geomean_by_layout": {}, "bar": {}}
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        rs = [r for r in rows if r["dtype"] == dtype]
        paired = [r for r in rs if r["status"] == "ok" and r.get("ratio")]
        out["geomean_ratio"][dtype] = {
            "ratio": metrics.geomean(r["ratio"] for r in paired), "n": len(paired),
            "tflops": metrics.geomean(r.get("tflops") for r in paired),
            "n_ok": sum(r["status"] == "ok" for r in rs), "n_bad": sum(r["status"] != "ok" for r in rs)}
        for layout in dict.fromkeys(r["layout"] for r in rs):
            sub = [r for r in paired if r["layout"] == layout]
            out["geomean_by_layout"][f"{dtype}/{layout}"] = {
                "ratio": metrics.geomean(r["ratio"] for r in sub), "n": len(sub)}
    for dtype in ("bf16", "fp8"):
        g = out["geomean_ratio"].get(dtype)
        out["bar"][f"{dtype}_geomean_ratio>={BAR_RATIO}"] = (None if not g or g["ratio"] is None
                                                             else g["ratio"] >= BAR_RATIO)
    key = ("layout", "index", "sizes", "dtype", "groups", "rows", "n", "k")
    bar_rows = [r for r in rows if tuple(r.get(k) for k in key) == BAR_FP8_ROW and r["status"] == "ok"]
    tflops = bar_rows[0].get("tflops") if bar_rows else None
    out["bar"]["fp8_contig_4x8192_n4096k7168_tflops"] = tflops
    out["bar"][f"fp8_contig_4x8192_n4096k7168>={BAR_FP8_TFLOPS:g}"] = (None if tflops is None
                                                                       else tflops >= BAR_FP8_TFLOPS)
    return out


def _f(x, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def _rows_text(r: dict) -> str:
    if r["layout"] == "masked":
        return f"~{r['rows']}/group, max_m {r.get('max_m')} (valid {_f(r.get('valid_rows'), 'd')})"
    if r["sizes"] == "even":
        return f"{r['rows']}/group ({_f(r.get('valid_rows'), 'd')})"
    lo_hi = ""
    if r.get("group_sizes"):
        lo_hi = f", {min(r['group_sizes'])}..{max(r['group_sizes'])}"
    return f"{r['rows']}/group avg ({_f(r.get('valid_rows'), 'd')}{lo_hi})"


def _layout_text(r: dict) -> str:
    return "masked" if r["layout"] == "masked" else f"contiguous {r['index']} {r['sizes']}"


def summary_lines(summary: dict) -> list[str]:
    lines = []
    for dtype, g in summary["geomean_ratio"].items():
        lines.append(f"geomean {dtype}: ratio {_f(g['ratio'], '.3f')} over {g['n']} rows with a baseline "
                     f"(ours {_f(g['tflops'], '.1f')} TFLOPS geomean); {g['n_ok']} ok, {g['n_bad']} not")
    for key, g in summary["geomean_by_layout"].items():
        lines.append(f"  {key}: ratio {_f(g['ratio'], '.3f')} over {g['n']} rows")
    bar = summary["bar"]
    verdict = ", ".join(f"{k}: {'-' if v is None else (v if isinstance(v, bool) else _f(v, '.1f'))}"
                        for k, v in bar.items())
    lines.append(f"issue 8 bar: {verdict}")
    return lines


_CONFIG_TILE_RE = re.compile(r"m(\d+)n(\d+)k\d+_s(\d+)")


def _config_tile(config: str | None) -> str:
    """'sm90_m128n176k128_s4_g16' -> '128x176s4' (the --tiles spelling), else the config as it is."""
    match = _CONFIG_TILE_RE.search(config or "")
    return f"{match[1]}x{match[2]}s{match[3]}" if match else str(config or "-")


def _by_case(rows: list[dict]) -> list[dict[str, dict]]:
    """The rows grouped per case, in order, each {tile: row} ('auto' for the heuristic's)."""
    key = ("layout", "index", "sizes", "dtype", "groups", "rows", "n", "k")
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in key), {})[r.get("tile", "auto")] = r
    return list(groups.values())


def _fastest(group: dict[str, dict]) -> str | None:
    """The tile of the lowest median among a case's timed rows (None if none was timed); ties: the first."""
    timed = [(r["us"], i, tile) for i, (tile, r) in enumerate(group.items())
             if r["status"] == "ok" and r.get("us") is not None]
    return min(timed)[2] if timed else None


def _fastest_text(group: dict[str, dict]) -> str:
    best, auto = _fastest(group), group.get("auto")
    if best is None or best == "auto":
        return best or "-"
    if auto is None or auto.get("us") is None:
        return best
    return f"{best} ({auto['us'] / group[best]['us']:.3f}x auto)"


def _tile_cell(r: dict | None, is_best: bool) -> str:
    if r is None:
        return "-"
    if r["status"] == "ok" and r.get("us") is not None:
        us = _f(r["us"], ".1f")
        return f"**{us}**" if is_best else us
    return "illegal" if r.get("illegal") else r["status"]


def tile_table(rows: list[dict]) -> list[str]:
    """Markdown lines of the --tiles sweep (none without forced tiles): per case, the median µs of the heuristic's
    tile (auto, its tile in parentheses) and of every forced tile, the fastest in bold and named last with its gain
    over auto; 'illegal': the row's spec cannot take the tile (reason in the JSON's note)."""
    tiles = list(dict.fromkeys(r["tile"] for r in rows if r.get("tile", "auto") != "auto"))
    if not tiles:
        return []
    lines = ["| row | auto | " + " | ".join(tiles) + " | fastest |", "|---|--:|" + "--:|" * len(tiles) + "---|"]
    for group in _by_case(rows):
        best, auto = _fastest(group), group.get("auto")
        label = auto["tag"] if auto else next(iter(group.values()))["tag"].rsplit("_t", 1)[0]
        auto_cell = _tile_cell(auto, best == "auto") + (f" ({_config_tile(auto.get('config'))})" if auto else "")
        cells = [_tile_cell(group.get(tile), best == tile) for tile in tiles]
        lines.append(f"| {label} | {auto_cell} | " + " | ".join(cells) + f" | {_fastest_text(group)} |")
    return lines


def tile_line(case_rows: list[dict]) -> str:
    """One printed line of a case's forced tiles: '  tiles: 128x128 812.3, 128x256 illegal, ... fastest: ...'."""
    group = _by_case(case_rows)[0]
    cells = [f"{tile} {_tile_cell(r, False)}" for tile, r in group.items() if tile != "auto"]
    return f"    tiles: {', '.join(cells)}; fastest: {_fastest_text(group)}"


def markdown(header: dict, rows: list[dict], summary: dict) -> str:
    all_rows, rows = rows, auto_rows(rows)
    has_rowwise = any(r.get("rowwise_us") is not None for r in rows)
    rw_head, rw_rule = (" torch rowwise µs |", "--:|") if has_rowwise else ("", "")
    lines = [
        "# deepgemm-jit bench: moe (grouped GEMMs)", "",
        f"{header.get('date')} · {header.get('gpu')} · torch {header.get('torch')} · CuPy {header.get('cupy')} · "
        f"commit {header.get('git_commit') or '-'}{' (dirty)' if header.get('git_dirty') else ''} · src "
        f"{str(header.get('source_sha256'))[:12]}", "",
        f"`{header.get('command')}` · median of {header.get('reps')} reps, L2 flushed before each call, "
        "contenders interleaved. ratio = baseline µs / our µs (> 1: we are faster); TFLOPS from the valid rows "
        "only (2·Σrows·N·K). fp8 = E4M3 with 1x128 x 128x128 block scales; its baseline is a per-group loop of "
        "F.scaled_mm (same recipe); torch rowwise = torch._scaled_grouped_mm with row-wise scales, a cheaper "
        "recipe, shown for information only.", "",
        f"| layout | dtype | G | rows | N | K | ours µs | baseline µs | baseline | ratio | our TFLOPS |{rw_head} "
        "err | status |",
        f"|---|---|--:|---|--:|--:|--:|--:|---|--:|--:|{rw_rule}--:|---|",
    ]
    for r in rows:
        status = report.status_cell(r, 240)
        rw_cell = f" {_f(r.get('rowwise_us'), '.1f')} |" if has_rowwise else ""
        lines.append(f"| {_layout_text(r)} | {r['dtype']} | {r['groups']} | {_rows_text(r)} | {r['n']} | {r['k']} "
                     f"| {_f(r.get('us'), '.1f')} | {_f(r.get('baseline_us'), '.1f')} | {r.get('baseline') or '-'} "
                     f"| {_f(r.get('ratio'), '.3f')} | {_f(r.get('tflops'), '.1f')} |{rw_cell} "
                     f"{_f(r.get('err'), '.1e')} | {status} |")
    lines.append("")
    lines += [f"- {line.strip()}" for line in summary_lines(summary)]
    tiles = tile_table(all_rows)
    if tiles:
        lines += ["", "## Tiles (--tiles)", "",
                  "Median µs of each tile, timed in the same interleaved call as the row's contenders after passing "
                  "the same check; auto = the heuristic's tile (the main table's row; its tile in parentheses); "
                  "**bold**: the fastest; illegal: the row's spec cannot take the tile (skipped, reason in the "
                  "JSON's note).", ""]
        lines += tiles
    return "\n".join(lines) + "\n"


def short_table(rows: list[dict]) -> str:
    lines = [f"{'tag':44} {'us':>9} {'base_us':>9} {'ratio':>6} {'TFLOPS':>7} status"]
    for r in auto_rows(rows):
        status = r["status"] if r["status"] == "ok" else f"{r['status']} {(r.get('error') or r.get('note') or '')[:70]}"
        lines.append(f"{r['tag']:44} {_f(r.get('us'), '9.1f'):>9} {_f(r.get('baseline_us'), '9.1f'):>9} "
                     f"{_f(r.get('ratio'), '6.3f'):>6} {_f(r.get('tflops'), '7.1f'):>7} {status}")
    return "\n".join(lines)


def to_json(header: dict, rows: list[dict], summary: dict | None) -> str:
    import json

    record = {"schema": report.SCHEMA_VERSION, "bench": "moe", "header": header, "summary": summary, "rows": rows}
    return json.dumps(report._json_safe(record), indent=1, allow_nan=False)


# ------------------------------------------------------------------------------------------------ one row (GPU)
def empty_row(case: MoeCase) -> dict:
    return {"tag": case.tag, "layout": case.layout, "index": case.index, "sizes": case.sizes, "dtype": case.dtype,
            "groups": case.groups, "rows": case.rows, "n": case.n, "k": case.k, "max_m": case.max_m,
            "status": "error", "error": None, "note": "", "group_sizes": None, "valid_rows": None, "m_total": None,
            "us": None, "us_min": None, "us_p20": None, "us_p80": None, "host_us": None, "flush_us": None,
            "tflops": None, "baseline": None, "baseline_us": None, "baseline_tflops": None, "ratio": None,
            "rowwise": None, "rowwise_us": None, "rowwise_ratio": None, "contenders": {}, "unavailable": None,
            "err": None, "tol": None, "err_cos": None, "untouched_bad": None, "pad_rows": None,
            "family": None, "config": None, "build_s": None, "first_call_s": None, "reps": None}


def tile_row(case: MoeCase, tile: str) -> dict:
    """The row of one forced tile of `case` (--tiles), tagged like python -m bench's tile rows
    (``<tag>_t<tile>``): empty_row's keys and ``tile``, ``illegal`` (why the row's spec cannot take the tile, then
    status skipped), ``vs_auto`` (the row's own µs / this tile's, > 1: the tile is faster), ``config_fields``.
    Its ``baseline_us`` is the row's, timed in the same interleaved call; ``ratio`` = that / this tile's µs."""
    row = empty_row(case)
    row.update(tag=f"{case.tag}_t{tile}", tile=tile, illegal=None, vs_auto=None, config_fields=None)
    return row


@dataclasses.dataclass
class Context:
    reps: int
    warmup: int
    seed: int
    sizes_seed: int
    rowwise: bool
    flusher: object = None
    is_context_lost: bool = False
    tiles: tuple[str, ...] = ()   # forced tiles 'BMxBN[sS]' built, checked and timed with every row (--tiles)


def _int_view(x):
    """A same-width integer view of a CuPy array (copies of bf16 / fp8 bits need no float support)."""
    import cupy

    return x.view({1: cupy.uint8, 2: cupy.uint16, 4: cupy.uint32}[x.dtype.itemsize])


def _pack(x, index):
    """The valid rows of `x` (per group `index`) stacked into one contiguous (sum(rows), ...) array."""
    import cupy

    parts = [_int_view(x)[ix] for ix in index]
    return cupy.ascontiguousarray(cupy.concatenate(parts, axis=0)).view(x.dtype)


def _data_ptr(x) -> int:
    return x.data.ptr if hasattr(x.data, "ptr") else x.ctypes.data  # CuPy; NumPy in the CPU tests


def _quantize_rows(dg, x, granularity: str):
    """dg.quantize over the last axis of a 2-D or 3-D array; scales keep the leading axes. The scales are passed on
    exactly as dg.quantize returns them, reshaped without a copy: group128's M-major (rows, kb) view splits into
    (G, max_m, kb) with the rows still one run per K column, which the grouped kernel bulk-copies."""
    flat = x.reshape(-1, x.shape[-1])
    q, s = dg.quantize(flat, "fp8", granularity)
    shaped = s.reshape(x.shape[:-1] + s.shape[1:])
    if _data_ptr(shaped) != _data_ptr(s):
        raise RuntimeError(f"reshaping scales of strides {s.strides} to {shaped.shape} copied them")
    return q.reshape(x.shape), shaped


def _quantize_weights(dg, b):
    """(q (G, N, K), scales (G, ceil(N/128), ceil(K/128))) of per-expert 128x128 blocks."""
    import cupy

    g, n, k = b.shape
    if n % 128 == 0:
        q, s = dg.quantize(b.reshape(g * n, k), "fp8", "block128")
        return q.reshape(g, n, k), s.reshape(g, n // 128, s.shape[-1])
    pairs = [dg.quantize(b[i], "fp8", "block128") for i in range(g)]
    return cupy.stack([q for q, _ in pairs]), cupy.stack([s for _, s in pairs])


@dataclasses.dataclass
class Contender:
    key: str            # "grouped" | "loop" | "rowwise"
    name: str           # what the report shows
    fn: object
    result_f64: object  # -> float64 CuPy (sum(rows), N), the groups' valid rows in order
    same_recipe: bool   # may be the row's baseline


def _on_stream(c: Contender, on_stream) -> Contender:
    """`c` with its calls on the current CuPy stream (the one the timing events are recorded on)."""
    fn, result_f64 = c.fn, c.result_f64

    def run():
        with on_stream():
            fn()

    def result():
        with on_stream():
            return result_f64()

    return dataclasses.replace(c, fn=run, result_f64=result)


def _bind_torch(case: MoeCase, sizes, index, ops: dict, dg, want_rowwise: bool):
    """The torch contenders of a row, and why others are missing: ([Contender], [reason])."""
    import cupy

    from deepgemm_jit import baseline

    contenders: list[Contender] = []
    reasons: list[str] = []
    try:
        torch = baseline._torch()
    except baseline.BaselineUnavailable as exc:
        return [], [str(exc)]
    why = baseline._torch_cuda_missing()
    if why:
        return [], [why]
    on_stream = baseline._on_cupy_stream(torch)
    live = [(g, ix, s) for g, (ix, s) in enumerate(zip(index, sizes)) if s > 0]
    # ends of every group in the packed valid rows (an empty group repeats the previous end)
    offs_valid = cupy.asarray(offsets_end(sizes), dtype=cupy.int32)
    num_valid, n = sum(sizes), case.n

    def run_once(label, call):
        return baseline.first_that_runs([(label, call)], f"{case.tag}")

    def concat_f64(results):
        return cupy.concatenate([baseline._to_cupy_f64(torch, t) for t in results], axis=0)

    with on_stream():
        toffs = baseline.cupy_to_torch(offs_valid)
        if case.dtype == "bf16":
            ta, tb = baseline.cupy_to_torch(ops["a"]), baseline.cupy_to_torch(ops["b"])
            # torch._grouped_mm on the valid rows (packed once, outside the timing, where a has other rows)
            if hasattr(torch, "_grouped_mm"):
                a_valid = ops["a_valid"]
                ta_valid = baseline.cupy_to_torch(a_valid)
                last_grouped = [None]

                def grouped():
                    last_grouped[0] = torch._grouped_mm(ta_valid, tb.transpose(-2, -1), offs=toffs)
                    return last_grouped[0]
                try:
                    label = "torch._grouped_mm" + ("" if a_valid is ops["a"] else " (valid rows packed)")
                    run_once(label, grouped)
                    contenders.append(Contender("grouped", label, grouped, lambda: concat_f64(last_grouped),
                                                True))
                except baseline.BaselineUnavailable as exc:
                    reasons.append(str(exc))
            else:
                reasons.append("torch has no _grouped_mm")
            out = torch.empty((num_valid, n), dtype=torch.bfloat16, device=ta.device)
            parts, row0 = [], 0
            for g, ix, s in live:
                parts.append((ta[ix], tb[g].t(), out[row0:row0 + s]))
                row0 += s

            def loop():
                for a_g, b_g, o in parts:
                    torch.mm(a_g, b_g, out=o)
            loop()
            contenders.append(Contender("loop", f"torch.mm loop x{len(parts)}", loop,
                                        lambda: concat_f64([out]), True))
            return [_on_stream(c, on_stream) for c in contenders], reasons

        # ---- fp8: per-group F.scaled_mm with 1x128 / 128x128 block scales (the same recipe as ours)
        tqa = baseline._torch_operand(ops["qa"], torch.float8_e4m3fn)
        tqb = baseline._torch_operand(ops["qb"], torch.float8_e4m3fn)
        tsa, tsb = baseline.cupy_to_torch(ops["sa"]), baseline.cupy_to_torch(ops["sb"])
        calls, labels = [], set()
        try:
            for g, ix, s in live:
                out_g = torch.empty((s, n), dtype=torch.bfloat16, device=tqa.device)
                label, call = baseline.first_that_runs(
                    baseline.torch_scaled_mm_calls(torch, tqa[ix], tqb[g], "block", tsa[ix], tsb[g], out_g),
                    f"block-scaled fp8 group {g} ({s} rows) of {case.tag}")
                calls.append(call)
                labels.add(label)
            results = [None] * len(calls)

            def loop_fp8():
                for i, call in enumerate(calls):
                    results[i] = call()
            loop_fp8()
            contenders.append(Contender("loop", f"{'/'.join(sorted(labels))} loop x{len(calls)}", loop_fp8,
                                        lambda: concat_f64(results), True))
        except baseline.BaselineUnavailable as exc:
            reasons.append(str(exc))

        # ---- information: torch's grouped FP8 GEMM, row-wise scales (its own quantization of the same values)
        if want_rowwise:
            if not hasattr(torch, "_scaled_grouped_mm"):
                reasons.append("torch has no _scaled_grouped_mm (row-wise grouped FP8)")
            else:
                q_rw, s_rw = _quantize_rows(dg, ops["a_valid"], "row")
                qb_rw, sb_rw = _quantize_rows(dg, ops["b"], "row")
                ops["rowwise_operands"] = (q_rw, s_rw, qb_rw, sb_rw)
                tq = baseline._torch_operand(q_rw, torch.float8_e4m3fn)
                tqb_rw = baseline._torch_operand(qb_rw, torch.float8_e4m3fn)
                ts, tsb_rw = baseline.cupy_to_torch(s_rw), baseline.cupy_to_torch(sb_rw)
                last_rowwise = [None]

                def rowwise():
                    last_rowwise[0] = torch._scaled_grouped_mm(tq, tqb_rw.transpose(-2, -1), ts, tsb_rw,
                                                               offs=toffs, out_dtype=torch.bfloat16,
                                                               use_fast_accum=False)
                    return last_rowwise[0]
                try:
                    run_once("torch._scaled_grouped_mm(rowwise)", rowwise)
                    contenders.append(Contender("rowwise", "torch._scaled_grouped_mm(rowwise)", rowwise,
                                                lambda: concat_f64(last_rowwise), False))
                except baseline.BaselineUnavailable as exc:
                    reasons.append(str(exc))
    return [_on_stream(c, on_stream) for c in contenders], reasons


def _rowwise_reference(ops: dict, sizes, live_groups):
    """float64 product of the row-wise dequantized operands (the rowwise contender's own reference)."""
    import cupy

    from deepgemm_jit import reference

    q_rw, s_rw, qb_rw, sb_rw = ops["rowwise_operands"]
    parts, row0 = [], 0
    for g in live_groups:
        s = sizes[g]
        a64 = reference.dequantize_reference(q_rw[row0:row0 + s], s_rw[row0:row0 + s], "fp8_e4m3", "row")
        b64 = reference.dequantize_reference(qb_rw[g], sb_rw[g], "fp8_e4m3", "row")
        parts.append(a64 @ b64.T)
        row0 += s
    return cupy.concatenate(parts, axis=0)


def forced_config(case: MoeCase, tile: str, arch: str = "sm_90a"):
    """The KernelConfig of the forced tile 'BMxBN[sS]' (``--tiles``) for `case`: ``config.sm90_config`` on the
    GemmSpec that ``build_grouped`` compiles for the row (``grouped.grouped_spec``), checked against it (pure
    Python). ValueError where the row cannot take the tile (accumulators, shared memory, ping-pong, ...)."""
    from deepgemm_jit.grouped import grouped_spec

    spec = grouped_spec(case.n, case.k, dtype=case.dtype)
    cfg = suites.forced_tile_config(spec, tile)
    cfg.check_for(spec, arch)
    return cfg


def _first_call(gemm, a_in, b_in, kwargs: dict, out_shape: tuple[int, ...]) -> tuple[object, float, list[str]]:
    """One call of ours into a NaN-poisoned out=, synchronized: (out, seconds, notes)."""
    import cupy

    from deepgemm_jit import reference

    d = reference.poisoned(out_shape, OUT_DTYPE)
    t0 = time.perf_counter()
    res = gemm(a_in, b_in, out=d, **kwargs)
    cupy.cuda.Device().synchronize()
    seconds = time.perf_counter() - t0
    notes = []
    if res is not d and getattr(getattr(res, "data", None), "ptr", None) != d.data.ptr:
        notes.append("the call returned another array than out=")
    return d, seconds, notes


def _judge(case: MoeCase, d, sizes, ref, ref_cos, lib: str) -> tuple[dict, list[str], str | None]:
    """One output of ours against the float64 per-group reference: (fields err, err_cos, pad_rows, untouched_bad;
    notes; the verdict that keeps it from being timed, None when it passed)."""
    import cupy

    from deepgemm_jit import reference

    index, pads = group_index(case, sizes), pad_index(case, sizes)
    fields: dict = {}
    notes = []
    ours64 = cupy.concatenate([reference.to_float64(d[index[g]]) for g, s in enumerate(sizes) if s > 0], axis=0)
    fields["err"] = reference.error(ours64, ref)
    if math.isnan(fields["err"]):
        notes.append(f"{int(cupy.count_nonzero(~cupy.isfinite(ours64)))} non-finite values in the valid rows")
    if ref_cos is not None:
        fields["err_cos"] = reference.error(ours64, ref_cos, "cos")
        if not fields["err_cos"] <= reference.FP8_COS_BOUND:
            notes.append(f"cos diff {fields['err_cos']:.2e} > {reference.FP8_COS_BOUND:g} vs the BF16-input product "
                         "(recorded, not judged)")
    del ours64
    bits = d.view(cupy.uint16)
    fields["pad_rows"] = sum((ix[-1].stop - ix[-1].start) for ix in pads)
    fields["untouched_bad"] = sum(int(cupy.count_nonzero(bits[ix] != POISON_BITS)) for ix in pads)
    if fields["untouched_bad"]:
        notes.append(f"{fields['untouched_bad']} elements of the {fields['pad_rows']} padding/masked rows were written")
    verdict = None
    if not reference.within_bound(fields["err"], lib):
        verdict = f"err {fields['err']:.3e} > tol {reference.ERROR_BOUND[lib]:g}"
    elif fields["untouched_bad"]:
        verdict = "padding written"
    return fields, notes, verdict


def _build_tiles(case: MoeCase, dg, tile_rows: list[dict]) -> tuple[dict, list[str]]:
    """Build ours once per forced tile: ({tile: GroupedGemm}, notes for the row). A tile the row cannot take
    (forced_config or the build raises ValueError) is marked skipped with the reason (``illegal``); another
    exception of its build is that tile row's error, and the others go on."""
    from .runner import _config_strings

    gemms, notes = {}, []
    for tr in tile_rows:
        tile = tr["tile"]
        t0 = time.perf_counter()
        try:
            gemms[tile] = dg.build_grouped(case.n, case.k, dtype=case.dtype, expected_m=case.rows,
                                           num_groups=case.groups, config=forced_config(case, tile))
        except ValueError as exc:
            tr.update(status="skipped", illegal=str(exc), note=f"skipped: tile {tile}: {exc}")
            notes.append(f"tile {tile} skipped: {exc}")
            continue
        except Exception as exc:
            tr["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            notes.append(f"tile {tile}: its build raised {type(exc).__name__}")
            continue
        tr["build_s"] = time.perf_counter() - t0
        tr["family"], tr["config"], tr["config_fields"] = _config_strings(gemms[tile])
    return gemms, notes


def _run_case(case: MoeCase, ctx: Context, index_no: int, row: dict, tile_rows: list[dict]) -> None:
    import cupy

    import deepgemm_jit as dg
    from deepgemm_jit import reference, timing

    from .runner import _config_strings

    lib = LIB_DTYPE[case.dtype]
    row["tol"] = reference.ERROR_BOUND[lib]
    sizes = group_sizes(case, ctx.sizes_seed)
    index = group_index(case, sizes)
    live = [g for g, s in enumerate(sizes) if s > 0]
    row["group_sizes"], row["valid_rows"] = sizes, sum(sizes)
    row["m_total"] = segment_starts(case, sizes)[1]
    for tr in tile_rows:
        tr.update(tol=row["tol"], group_sizes=sizes, valid_rows=row["valid_rows"], m_total=row["m_total"])
    flops = valid_flops(case, sizes)

    if not hasattr(dg, "build_grouped"):
        raise RuntimeError("deepgemm_jit has no build_grouped (deepgemm_jit/grouped.py not there yet)")
    t0 = time.perf_counter()
    gemm = dg.build_grouped(case.n, case.k, dtype=case.dtype, expected_m=case.rows, num_groups=case.groups)
    row["build_s"] = time.perf_counter() - t0
    row["family"], row["config"], _ = _config_strings(gemm)
    tile_gemms, tile_notes = _build_tiles(case, dg, tile_rows)

    # ---- operands: fresh N(0, 1) BF16 values (padding rows too: never zeros), index arrays on the device
    rng = cupy.random.default_rng(ctx.seed + index_no)
    a = reference.random_matrix(a_shape(case, sizes), "bf16", rng)
    b = reference.random_matrix((case.groups, case.n, case.k), "bf16", rng)
    if case.index == "offs":
        kwargs = {"offs": cupy.asarray(offsets_end(sizes), dtype=cupy.int32)}
    elif case.index == "m_indices":
        kwargs = {"m_indices": cupy.asarray(m_indices(sizes), dtype=cupy.int32)}
    else:
        kwargs = {"masked_m": cupy.asarray(sizes, dtype=cupy.int32)}
    ops = {"a": a, "b": b}
    if case.dtype == "fp8":
        qa, sa = _quantize_rows(dg, a, "group128")
        qb, sb = _quantize_weights(dg, b)
        want_a, want_b = fp8_scale_shapes(case, sizes)
        if (tuple(sa.shape), tuple(sb.shape)) != (want_a, want_b):
            raise RuntimeError(f"scales {sa.shape} / {sb.shape}, expected {want_a} / {want_b}")
        ops.update(qa=qa, sa=sa, qb=qb, sb=sb)
        a_in, b_in = qa, qb
        kwargs.update(scale_a=sa, scale_b=sb)
    else:
        a_in, b_in = a, b
    is_packed = case.layout == "contiguous" and case.index == "offs"
    ops["a_valid"] = a if is_packed else _pack(a, [index[g] for g in live])

    # ---- correctness first, ours and every forced tile: poisoned out=, float64 per-group reference, untouched
    # padding
    out_shape = a_shape(case, sizes)[:-1] + (case.n,)
    d, row["first_call_s"], notes = _first_call(gemm, a_in, b_in, kwargs, out_shape)
    ref_parts, ref_cos_parts = [], []
    for g in live:
        ix = index[g]
        if case.dtype == "fp8":
            a64 = reference.dequantize_reference(qa[ix], sa[ix], lib, "group128")
            b64 = reference.dequantize_reference(qb[g], sb[g], lib, "block128")
            ref_cos_parts.append(reference.to_float64(a[ix]) @ reference.to_float64(b[g]).T)
        else:
            a64, b64 = reference.to_float64(a[ix]), reference.to_float64(b[g])
        ref_parts.append(a64 @ b64.T)
        del a64, b64
    ref = cupy.concatenate(ref_parts, axis=0)
    del ref_parts
    ref_cos = cupy.concatenate(ref_cos_parts, axis=0) if ref_cos_parts else None
    del ref_cos_parts
    fields, more, verdict = _judge(case, d, sizes, ref, ref_cos, lib)
    row.update(fields)
    notes += more
    checked = {}   # tile -> (GroupedGemm, its out=): the forced tiles that passed their check
    for tr in tile_rows:
        tile = tr["tile"]
        if tile not in tile_gemms:
            continue
        d_tile, tr["first_call_s"], tile_row_notes = _first_call(tile_gemms[tile], a_in, b_in, kwargs, out_shape)
        tile_fields, more, tile_verdict = _judge(case, d_tile, sizes, ref, ref_cos, lib)
        tr.update(tile_fields)
        tile_row_notes += more
        if tile_verdict is None:
            checked[tile] = (tile_gemms[tile], d_tile)
            tr["note"] = "; ".join(tile_row_notes)
        else:
            tr.update(status="fail", note="; ".join(tile_row_notes + [f"{tile_verdict}: not timed"]))
            tile_notes.append(f"tile {tile} failed its check ({tile_verdict})")
        del d_tile
    if verdict is not None:
        row["status"] = "fail"
        row["note"] = "; ".join(notes + [f"{verdict}: not timed"] + tile_notes)
        for tr in tile_rows:
            if tr["tile"] in checked:
                tr.update(status="skipped", note="; ".join(x for x in (tr["note"], "passed its check, not timed: the "
                                                                       "row's own (auto) tile failed its check") if x))
        return

    # ---- baselines, each checked like ours before it may be timed
    contenders, reasons = _bind_torch(case, sizes, index, ops, dg, ctx.rowwise and case.dtype == "fp8")
    timed = {}
    for c in contenders:
        want = _rowwise_reference(ops, sizes, live) if c.key == "rowwise" else ref
        c.fn()
        cupy.cuda.get_current_stream().synchronize()
        got = c.result_f64()
        err = reference.error(got, want)
        info = {"name": c.name, "err": err, "same_recipe": c.same_recipe}
        if ref_cos is not None:
            info["err_cos"] = reference.error(got, ref_cos, "cos")
        del got, want
        if reference.within_bound(err, lib):
            timed[c.key] = c
        else:
            info["note"] = f"failed its check (err {err:.3e}): not timed"
            notes.append(f"{c.name} {info['note']}")
        row["contenders"][c.key] = info
    if reasons:
        row["unavailable"] = reasons
        if not any(c.same_recipe for c in timed.values()):
            notes.append("no baseline: " + "; ".join(reasons))
    del ref_cos

    # ---- timing: ours, every checked forced tile and every checked contender, interleaved, L2 flushed before
    # each call. Our outputs are poisoned first and judged again after (as the first calls were): a kernel right on
    # its first call only (a replayed plan that writes nothing, state left dirty) is not reported ok.
    fns = {"ours": lambda: gemm(a_in, b_in, out=d, **kwargs)}
    reference.poison(d)
    for tile, (g, d_tile) in checked.items():
        fns[f"t{tile}"] = lambda g=g, d_tile=d_tile: g(a_in, b_in, out=d_tile, **kwargs)
        reference.poison(d_tile)
    fns.update({key: c.fn for key, c in timed.items()})
    t = timing.time_interleaved(fns, reps=ctx.reps, warmup=ctx.warmup, flush=ctx.flusher)
    cupy.cuda.Device().synchronize()
    wrong_after_timing = {}   # "ours" or a tile -> the verdict on its timed calls' output
    for who, out in [("ours", d)] + [(tile, d_tile) for tile, (_, d_tile) in checked.items()]:
        verdict_timed = _judge(case, out, sizes, ref, None, lib)[2]
        if verdict_timed is not None:
            wrong_after_timing[who] = f"the timed calls' output is wrong ({verdict_timed}; the first call's passed)"
    del ref
    ours = t["ours"]
    row.update(us=ours.median_us, us_min=ours.min_us, us_p20=ours.p20_us, us_p80=ours.p80_us,
               host_us=ours.host_us, flush_us=ours.flush_us, reps=ours.num_reps,
               tflops=flops / ours.median_us / 1e6)
    for key, c in timed.items():
        tk = t[key]
        row["contenders"][key].update(us=tk.median_us, us_min=tk.min_us, us_p20=tk.p20_us, us_p80=tk.p80_us,
                                      host_us=tk.host_us, tflops=flops / tk.median_us / 1e6)
        if tk.host_us > tk.flush_us:
            notes.append(f"{key}: host {tk.host_us:.0f} us > flush {tk.flush_us:.0f} us (launches partly timed)")
    same = [(t[key].median_us, key) for key, c in timed.items() if c.same_recipe]
    if same:
        base_us, key = min(same)
        row.update(baseline=timed[key].name, baseline_us=base_us, baseline_tflops=flops / base_us / 1e6,
                   ratio=base_us / ours.median_us)
    if "rowwise" in timed:
        row.update(rowwise=timed["rowwise"].name, rowwise_us=t["rowwise"].median_us,
                   rowwise_ratio=t["rowwise"].median_us / ours.median_us)
    if ours.host_us > ours.flush_us:
        notes.append(f"ours: host {ours.host_us:.0f} us > flush {ours.flush_us:.0f} us")
    row["note"] = "; ".join(([wrong_after_timing["ours"]] if "ours" in wrong_after_timing else []) + notes + tile_notes)
    row["status"] = "fail" if "ours" in wrong_after_timing else "ok"
    for tr in tile_rows:
        if tr["tile"] not in checked:
            continue
        tk = t[f"t{tr['tile']}"]
        tr.update(us=tk.median_us, us_min=tk.min_us, us_p20=tk.p20_us, us_p80=tk.p80_us, host_us=tk.host_us,
                  flush_us=tk.flush_us, reps=tk.num_reps, tflops=flops / tk.median_us / 1e6,
                  vs_auto=ours.median_us / tk.median_us)
        if same:
            tr.update(baseline=row["baseline"], baseline_us=base_us, baseline_tflops=row["baseline_tflops"],
                      ratio=base_us / tk.median_us)
        if tk.host_us > tk.flush_us:
            tr["note"] = "; ".join(x for x in (tr["note"], f"host {tk.host_us:.0f} us > flush "
                                               f"{tk.flush_us:.0f} us") if x)
        tr["status"] = "ok"
        if tr["tile"] in wrong_after_timing:
            tr.update(status="fail", note="; ".join(x for x in (wrong_after_timing[tr["tile"]], tr["note"]) if x))


def run_case(case: MoeCase, ctx: Context, index_no: int) -> list[dict]:
    """The row of `case`, then one row per forced tile of ``ctx.tiles`` (``tile_row``), all built, checked and
    timed together; an exception becomes the row's error (the tile rows not finished take it), a lost CUDA
    context skips the rows after it."""
    from .runner import guarded_row

    row = empty_row(case)
    tile_rows = [tile_row(case, tile) for tile in ctx.tiles]
    if tile_rows:
        row["tile"] = "auto"
    guarded_row(row, ctx, lambda: _run_case(case, ctx, index_no, row, tile_rows))
    for tr in tile_rows:
        if tr["status"] == "error" and tr["error"] is None:
            tr.update(status=row["status"], error=f"the row did not finish: {row['error'] or row['status']}")
    return [row, *tile_rows]


# -------------------------------------------------------------------------------------------------------- main
def parse_args(argv):
    from deepgemm_jit import timing

    p = argparse.ArgumentParser(prog="python -m bench.moe", description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", default=",".join(LAYOUTS), help="comma list of %(default)s")
    p.add_argument("--dtype", default=",".join(DTYPES), help="comma list of %(default)s")
    p.add_argument("--quick", action="store_true", help="a smoke subset (%d rows per dtype)" % (2 * len(QUICK)))
    p.add_argument("--only", default=None, help="regex on the row tag, e.g. 'fp8_contig_offs_even'")
    p.add_argument("--reps", type=int, default=timing.MIN_PROTOCOL_REPS)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=None, help="base seed of the operand values (default: time)")
    p.add_argument("--sizes-seed", type=int, default=0, help="seed of the group sizes (default 0: fixed)")
    p.add_argument("--flush-mb", type=int, default=timing.DEFAULT_FLUSH_BYTES >> 20)
    p.add_argument("--no-rowwise", action="store_true", help="skip torch's row-wise grouped FP8 (information only)")
    p.add_argument("--tiles", default=None,
                   help="also sweep forced sm90 tiles: comma list of BMxBN[sS] as python -m bench --tiles, e.g. "
                        "128x128,128x176,64x128s6 ('auto', the heuristic's choice, is always the row itself). Each "
                        "is built for every row, checked like it and timed in the same interleaved call; one the "
                        "row cannot take is reported skipped (illegal)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--list", action="store_true", help="print the rows and exit (no GPU)")
    p.add_argument("--offline", action="store_true",
                   help="no GPU: compile every kernel the rows build on the H200 (sm_90a, 132 SMs) into the kernel "
                        "cache (DEEPGEMM_JIT_CACHE_DIR) and exit; carry that cache to the GPU run (bench/offline.py)")
    return p.parse_args(argv)


def select(args) -> list[MoeCase]:
    rows = cases(tuple(x.strip() for x in args.layout.split(",") if x.strip()),
                 tuple(x.strip() for x in args.dtype.split(",") if x.strip()), quick=args.quick)
    if args.only:
        rows = [c for c in rows if re.search(args.only, c.tag)]
    return rows


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    try:
        rows_spec = select(args)
        tiles = tuple(t for t in suites.parse_tiles(args.tiles, words=("auto",)) if t != "auto")
    except ValueError as exc:
        print(f"bench.moe: {exc}", file=sys.stderr)
        return 2
    if args.list:
        num_illegal = 0
        for c in rows_spec:
            sizes = group_sizes(c, args.sizes_seed)
            extra = f" max_m {c.max_m}" if c.max_m else ""
            print(f"{c.tag:46} valid {sum(sizes):6d}{extra} sizes {sizes if c.sizes != 'even' else 'even'}")
            if tiles:
                cells = []
                for tile in tiles:
                    try:
                        cells.append(f"{tile} (s{forced_config(c, tile).num_stages})")
                    except ValueError as exc:
                        cells.append(f"{tile} (illegal, skipped: {exc})")
                        num_illegal += 1
                print(f"    tiles: auto, {', '.join(cells)}")
        if tiles:
            print(f"tiles: auto + {len(tiles)} forced per row; {num_illegal} of {len(rows_spec) * len(tiles)} "
                  "forced tiles illegal for their row (reported skipped)")
        print(f"{len(rows_spec)} rows")
        return 0
    if not rows_spec:
        print("bench.moe: no rows selected", file=sys.stderr)
        return 2
    if args.offline:
        from . import offline

        return offline.compile_work(*offline.grouped_work(rows_spec, tiles), "bench.moe")

    # ---- GPU from here on
    try:
        import cupy

        num_devices = cupy.cuda.runtime.getDeviceCount()
        cupy.cuda.Device(0).use()
        cupy.cuda.Device().synchronize()
        from deepgemm_jit import timing
    except Exception as exc:
        print(f"bench.moe: no usable CUDA device or library: {exc!r}", file=sys.stderr)
        return 2
    apis = None
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.init()
        apis = torch_apis(torch)
    except Exception as exc:
        print(f"bench.moe: torch unavailable ({exc!r}): ours timed alone", file=sys.stderr)

    seed = args.seed if args.seed is not None else int(time.time()) & 0x7FFFFFFF
    settings = {"suites": ["moe"], "dtypes": sorted({c.dtype for c in rows_spec}),
                "layouts": sorted({c.layout for c in rows_spec}), "reps": args.reps, "warmup": args.warmup,
                "flush_bytes": args.flush_mb << 20, "seed": seed, "sizes_seed": args.sizes_seed,
                "quick": args.quick, "only": args.only, "baselines": ["torch_grouped", "torch_loop"] +
                ([] if args.no_rowwise else ["torch_rowwise(info)"]), "torch_apis": apis,
                "num_devices": num_devices}
    if tiles:
        settings["tiles"] = ["auto", *tiles]
    header = report.collect_env(argv, settings)
    header["command"] = " ".join(["python", "-m", "bench.moe", *argv])
    stem = result_stem(header["date"], header.get("git_commit"), header.get("git_dirty"), header["source_sha256"])
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / f"{stem}.partial.json"
    ctx = Context(reps=args.reps, warmup=args.warmup, seed=seed, sizes_seed=args.sizes_seed,
                  rowwise=not args.no_rowwise, flusher=timing.L2Flusher(args.flush_mb << 20), tiles=tiles)
    print(f"bench.moe: {len(rows_spec)} rows on {header['gpu']}, reps {args.reps}, seed {seed}, torch "
          f"{header.get('torch')} {apis}" + (f", tiles auto,{','.join(tiles)}" if tiles else ""), flush=True)

    rows: list[dict] = []
    t_start = time.perf_counter()
    for i, case in enumerate(rows_spec):
        case_rows = run_case(case, ctx, i)
        rows += case_rows
        r = case_rows[0]
        detail = "" if r["status"] == "ok" else " " + str(r.get("error") or r.get("note"))[:200]
        print(f"[{i + 1}/{len(rows_spec)}] {case.tag}: {r['status']} us={_f(r['us'], '.1f')} "
              f"base={_f(r['baseline_us'], '.1f')} ({r.get('baseline') or '-'}) ratio={_f(r['ratio'], '.3f')} "
              f"TFLOPS={_f(r['tflops'], '.1f')} err={_f(r['err'], '.1e')}{detail}", flush=True)
        if tiles:
            print(tile_line(case_rows), flush=True)
        try:
            partial.write_text(to_json(header, rows, None))
        except OSError:
            pass
    header["wall_s"] = round(time.perf_counter() - t_start, 1)
    summary = summarize(rows)
    (out_dir / f"{stem}.json").write_text(to_json(header, rows, summary))
    (out_dir / f"{stem}.md").write_text(markdown(header, rows, summary))
    partial.unlink(missing_ok=True)
    print()
    print(short_table(rows))
    for line in summary_lines(summary):
        print(line)
    for line in tile_table(rows):
        print(line)
    print(f"json: {out_dir / f'{stem}.json'}\nmd: {out_dir / f'{stem}.md'}")
    return 0 if is_run_ok(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
