"""Experiment (GPU): dense GEMMs at M between buckets, the heuristic's kernel against the kernel of another rule and
cuBLAS, in one interleaved run.

    python3 -m scripts.exp_m_buckets [--dtypes bf16,fp8_block] [--ms 300,479,586,...] [--nk 4096x7168,...]
                                     [--against rows|RULE] [--tiles 128x128s6,256x128,...] [--epilogue EPI]
                                     [--layout nt] [--out DIR] [--offline]

`build(M)` picks its kernel for buckets.m_bucket(M). "bucket" = that kernel; the other contender (--against):
- rows: config.choose_sm90_config at M rounded up to 128 rows (what 128-row buckets give; session 21's first sweeps,
  when buckets were powers of two: 586 x 4096 x 7168 BF16 ran the 1024-row bucket's 128x256 at 76.4 us, 128x160 at
  52.0, cuBLAS 49.3);
- previous: the config of the rule before the 320-row bucket with 64-row tiles (RULES["previous"]: 128-row buckets
  from 512 rows, 64-row tiles up to 128 rows), chosen with those constants swapped into config. (Session 21 timed
  a wider version, 64-row buckets and 64-row tiles up to 768 rows, against it: docs/NOTES.md.)
- no16ring: the config with 16-bit D tiles staged whole (RULES["no16ring"]; session 22's ring rule off);
- ring5: the 16-bit ring also where it takes a tile from 4 stages to 5 (RULES["ring5"]);
- fp8narrow: per-tensor FP8 tiles of any width at M >= 1024 (RULES["fp8narrow"]; before session 22);
- rows128at320: the 320-row bucket with 128-row tiles only (RULES["rows128at320"]);
- no384: M in (320, 384] in the 512-row bucket, as before session 24 (RULES["no384"]);
- rows64at192 / no192 / fp8t192 / fp8b192 / shortk192 / nofp8b192 / noshortk192: session 40's 192-row bucket with
  every 64-row tile costed, the rule before that bucket, FP8 per-tensor's 64-row tiles at every N, FP8 block's and
  the short-K tile's additions as measured, and the current rule without them (RULES; docs/NOTES.md session 40).
--offline (no GPU) only compiles every kernel the rows would build, for sm_90a and 132 SMs, into the kernel cache
(DEEPGEMM_JIT_CACHE_DIR): carry that cache to the GPU machine and the run spends no time compiling.
--epilogue fuses an epilogue (e.g. bias, bias+gelu) into every contender, with the bench's operands (B scaled by
1 / sqrt(K)); "cublas" is then cuBLAS + the separate torch ops.
--tiles adds forced sm90 tiles (bench --tiles syntax) as contenders of every row, to ask what a tile would give
where no rule picks it; a tile the spec cannot take is skipped with its reason. "cublas" = the first baseline that
covers the dtype. Outputs are checked against a float64 reference before timing
(L2 flushed, medians); a row whose two configs are the same kernel times it once.
"""
from __future__ import annotations

import argparse
import math
import sys

from bench import report

MS = (300, 479, 586, 700, 800, 900, 1100, 1300, 1800, 2600, 3500)
NK = {"bf16": ((4096, 7168), (7168, 2048), (2112, 7168)), "fp8_block": ((4096, 7168), (7168, 2048))}
# Other rules, as the config constants that give them (--against NAME): earlier rules, or variants of the current one.
RULES = {
    "previous": {"M_BUCKET_STEPS": ((512, 4096, 128),), "SM90_ROWS64_MAX_M": 128, "SM90_ROWS64_BUCKETS": ()},
    "no16ring": {"SM90_D_RING_16BIT_MAX_M": 0},  # 16-bit tiles stage their whole D tile (before session 22)
    "ring5": {"SM90_D_RING_16BIT_MAX_STAGES": 4},  # ... and tiles at 4 stages take the ring for a fifth
    "fp8narrow": {"SM90_FP8_TENSOR_MIN_BLOCK_N": 8},  # per-tensor FP8 at M >= 1024 may pick any width (session 21)
    "rows128at320": {"SM90_ROWS64_BUCKETS": ()},  # the 320-row bucket kept, 128-row tiles only (session 23)
    "no384": {"M_BUCKET_STEPS": ((128, 320, 64), (512, 4096, 128))},  # 321-384 rows in the 512 bucket (sessions 21-23)
    # 129-192 rows in a bucket of their own with every 64-row tile costed there (three M blocks, none wasted at 192
    # rows, where 128-row tiles compute 256): session 39's sweep ran 192 x 4096 x 28672 bf16 at 85.4 us on 64x192 x 2
    # against the 256-row bucket's 108.2 (cuBLAS 82.5). Session 40 measured it (sm90_rules.SM90_ROWS64_UNSPLIT_BUCKETS).
    # (and the constants that later moved under it, so that it builds what that run measured)
    "rows64at192": {"M_BUCKET_STEPS": ((128, 384, 64), (512, 4096, 128)), "SM90_ROWS64_MAX_M": 192,
                    "SM90_ROWS64_UNSPLIT_BUCKETS": (), "SM90_D_RING_MIN_M": 256, "SM90_SMALL_M_BUCKET_MAX": 255,
                    "SHORT_K_DECODE_M192_MAX_BYTES": 0, "SM90_ROWS64_FP8_BLOCK_MAX_N": 0},
    # before session 40: 129-256 rows in one bucket, 128-row tiles only
    "no192": {"M_BUCKET_STEPS": ((256, 384, 64), (512, 4096, 128)), "SM90_ROWS64_UNSPLIT_BUCKETS": ()},
    # the 192-row bucket's unsplit 64-row tiles of any width for FP8 per-tensor scaling at every N (session 40's first
    # run: 64x48 / 64x96 faster at N <= 4096, 64x112 / 64x176 slower at N >= 7168; its third run measured this rule
    # when per-tensor FP8 was left out of the bucket's 64-row tiles)
    "fp8t192": {"SM90_ROWS64_UNSPLIT_FP8_TENSOR_MAX_N": 1 << 30},
    # session 40's fifth run measured these two against the rule of that time (which had neither): FP8 block
    # scaling's 64-row tiles (split ones too) at the 192-row bucket up to N = 2112, and the short-K decode tile (64x128,
    # 16-bit) there for every K x 2 <= 3072 bytes. Both are merged where they won (narrower), so against the current
    # rule they time the same kernels on most rows; nofp8b192 / noshortk192 take the merged parts out again.
    "fp8b192": {"SM90_ROWS64_FP8_BLOCK_MAX_N": 2112, "SM90_ROWS64_FP8_BLOCK_MIN_N": 0},
    "shortk192": {"SHORT_K_DECODE_M128_MAX_M": 192},
    "nofp8b192": {"SM90_ROWS64_FP8_BLOCK_MAX_N": 0},
    "noshortk192": {"SHORT_K_DECODE_M192_MAX_BYTES": 0},
    # session 60: 8-bit inputs weigh 64-row tiles at the 256-row bucket too, as at 320 (the session's forced-tile
    # sweep ran FP8 block 256 x 4096 x 7168 with quant_fp8_g128 at 64x128 in 21.8 us against the 128x128 pick's 25.8)
    "rows64at256": {"SM90_ROWS64_BUCKETS": (256, 320)},
}


def _other_config(spec, m: int, num_sms: int, against: str):
    from bench import runner
    from deepgemm_jit import config

    if against == "rows":
        return config.choose_sm90_config(spec, -(-m // 128) * 128, num_sms)
    with runner.config_constants(RULES[against]):
        return config.choose_config(spec, m, "sm_90a", num_sms)


def _rows(args):
    """(bench dtype info, build kwargs, spec, m) of every row the arguments ask for, in the order they run."""
    from bench import dtypes as bench_dtypes
    from deepgemm_jit.spec import GemmSpec

    for dname in args.dtypes.split(","):
        info = bench_dtypes.get(dname)
        shapes = NK[dname] if args.nk is None else [tuple(int(v) for v in t.split("x")) for t in args.nk.split(",")]
        for n, k in shapes:
            kw = {"dtype": info.lib, "scaling": info.scaling, "epilogue": args.epilogue, "layout": args.layout}
            spec = GemmSpec.create(n, k, **kw)
            for m in (int(x) for x in args.ms.split(",")):
                yield dname, info, kw, spec, m


def _compile_offline(args) -> int:
    """--offline: every kernel a row would build (the bucket's, the other rule's, the forced tiles'), for sm_90a."""
    import deepgemm_jit as dg
    from bench import suites

    tiles = suites.parse_tiles(args.tiles, words=())
    kernels = set()
    for _, _, kw, spec, m in _rows(args):
        n, k = spec.n, spec.k
        configs = [dg.build(m, n, k, arch="sm_90a", **kw).config, _other_config(spec, m, 132, args.against)]
        dg.build(m, n, k, config=configs[1], arch="sm_90a", **kw)
        for tile in tiles:
            try:  # as the GPU run: a tile the spec or build refuses is skipped
                cfg = suites.forced_tile_config(spec, tile)
                dg.build(m, n, k, config=cfg, arch="sm_90a", **kw)
                configs.append(cfg)
            except ValueError:
                pass
        kernels.update((spec, cfg) for cfg in configs)
        print(f"m={m} n={n} k={k} {spec.dtype}: {' '.join(sorted({c.tag for c in configs}))}", flush=True)
    print(f"{len(kernels)} kernels compiled or found in the cache")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="bf16,fp8_block")
    ap.add_argument("--ms", default=",".join(str(m) for m in MS))
    ap.add_argument("--nk", default=None, help="comma list of NxK for every dtype (default: NK per dtype)")
    ap.add_argument("--against", default="rows", choices=("rows", *RULES))
    ap.add_argument("--epilogue", default=None, help="fused epilogue of every contender, e.g. bias+gelu")
    ap.add_argument("--layout", default="nt", help="operand layout of every row (16-bit and TF32 dtypes)")
    ap.add_argument("--tiles", default="", help="comma list of forced tiles timed beside the rows (BMxBN[sS][p][rR])")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=None)
    ap.add_argument("--offline", action="store_true",
                    help="no GPU: only compile every row's kernels for sm_90a (132 SMs) into the kernel cache, so that "
                         "a device run carrying that cache spends no time compiling")
    args = ap.parse_args()
    if args.offline:
        return _compile_offline(args)
    import cupy

    import deepgemm_jit as dg
    from bench import runner, suites
    from deepgemm_jit import device, reference, timing

    tiles = suites.parse_tiles(args.tiles, words=())
    num_sms = device.num_sms()
    rows = []
    other = args.against
    for dname, info, kw, spec, m in _rows(args):
        n, k = spec.n, spec.k
        rng = cupy.random.default_rng(m * 7 + n + k)
        inputs = runner.operands(info, spec, m, rng, 1.0 / k ** 0.5 if args.epilogue else 1.0)
        epi_ops = runner.epilogue_operands(spec, m, rng) if args.epilogue else None
        bucket = dg.build(m, n, k, **kw)
        other_cfg = _other_config(spec, m, num_sms, other)
        gemms = {"bucket": bucket}
        if other_cfg != bucket.config:
            gemms[other] = dg.build(m, n, k, config=other_cfg, **kw)
        skipped = {}
        for tile in tiles:
            try:
                gemms[tile] = dg.build(m, n, k, config=suites.forced_tile_config(spec, tile), **kw)
            except ValueError as exc:
                skipped[tile] = str(exc)
        after = {}
        fns, errors = runner.checked_contenders(gemms, inputs, m, epi_ops, after_timing=after)
        cupy.cuda.Device().synchronize()
        t = timing.time_interleaved(fns, reps=args.reps, warmup=3)
        cupy.cuda.Device().synchronize()
        errors_after = {name: judge() for name, judge in after.items()}  # what the timed calls wrote
        us = {name: r.median_us for name, r in t.items()}
        us.setdefault(other, us["bucket"])
        every_err = [*errors.values(), *errors_after.values()]
        row = {"dtype": dname, "layout": args.layout, "epilogue": spec.epilogue, "m": m, "n": n, "k": k,
               "bucket_tile": bucket.config.tag, f"{other}_tile": gemms.get(other, bucket).config.tag, "us": us,
               "max_err": math.nan if any(math.isnan(e) for e in every_err) else max(every_err),
               "correct": all(reference.within_bound(e, spec.dtype) for e in every_err),
               "tiles": {t: gemms[t].config.tag for t in gemms if t not in ("bucket", other)},
               "skipped_tiles": skipped}
        rows.append(row)
        cub = us.get("cublas")
        print(f"{dname} m={m} n={n} k={k} ok={row['correct']} bucket {us['bucket']:.1f} ({row['bucket_tile']}) "
              f"{other} {us[other]:.1f} ({other_cfg.tag})" + (f" cublas {cub:.1f}" if cub else "")
              + "".join(f" {t} {us[t]:.1f}" for t in row["tiles"]) + "".join(f" {t} skipped" for t in skipped),
              flush=True)
    report.write_experiment_json(args.out, f"exp-m-buckets-vs-{other}.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
