"""python -m bench: check, then time, deepgemm-jit against cuBLAS on the suites of suites.py.

Exit status: 0 when every row is ok, 1 when some row failed its check or raised, 2 when nothing could run.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from deepgemm_jit import baseline, timing

from . import report, suites
from . import dtypes as bench_dtypes


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default=",".join(suites.DEFAULT_SUITES),
                   help=f"comma list of {sorted(suites.SUITES)} or 'all' (default %(default)s)")
    p.add_argument("--dtype", default=",".join(suites.DEFAULT_DTYPES),
                   help=f"comma list of {list(bench_dtypes.DTYPES)} or 'all' (default %(default)s); fp8_* are "
                        "FP8 E4M3 scaling recipes (tensor, row, 1x128 x 128x128 block), int8 is INT8 -> INT32")
    p.add_argument("--layout", default="nt", help=f"comma list of {suites.LAYOUTS} or 'all' (default nt; "
                                                  "8-bit dtypes run nt only)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"),
                   help="directory for <date>-<suite>-<gitshort>.{json,md,png} (default bench/results)")
    p.add_argument("--reps", type=int, default=timing.MIN_PROTOCOL_REPS, help="timed repetitions per contender (≥ 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls per contender first (default 5)")
    p.add_argument("--quick", action="store_true",
                   help="each suite's quick subset, 10 reps: a smoke run, not protocol-grade numbers")
    p.add_argument("--baseline", default=",".join(baseline.DEFAULT_ORDER),
                   help="baseline kinds in order of preference, the first that computes the case binds "
                        "(default %(default)s: torch.mm, torch FP8 scaled matmuls, torch._int_mm, cupy.matmul, "
                        "and for --epilogue rows cuBLAS + separate torch ops)")
    p.add_argument("--only", default=None, help="regex on the case tag, e.g. 'bf16_nt_m4096'")
    p.add_argument("--seed", type=int, default=None, help="base seed of the random inputs (default: time)")
    p.add_argument("--flush-mb", type=int, default=timing.DEFAULT_FLUSH_BYTES >> 20, help="L2 flush buffer in MiB")
    p.add_argument("--tiles", default=None,
                   help="sweep forced sm90 tiles instead of the heuristic's: comma list of BMxBN[sS], "
                        "e.g. 128x256,128x192s4 ('auto': the heuristic's choice; 'tuned': build(tune=True))")
    p.add_argument("--epilogue", default=None,
                   help="comma list of fused epilogues, e.g. bias+gelu,bias+gelu+residual (words: bias, bias_row, "
                        "relu|gelu|gelu_tanh|silu|sigmoid, residual, beta; 'none' adds the plain rows): each "
                        "case runs once per epilogue, timed against our plain GEMM (overhead) and torch's "
                        "cuBLAS + separate ops (ratio). Default: plain GEMMs only")
    p.add_argument("--list", action="store_true", help="print the cases and exit (no GPU)")
    p.add_argument("--offline", action="store_true",
                   help="no GPU: compile every kernel the cases build on the H200 (sm_90a, 132 SMs) into the kernel "
                        "cache (DEEPGEMM_JIT_CACHE_DIR) and exit; carry that cache to the GPU run (bench/offline.py)")
    args = p.parse_args(argv)
    if args.quick and "--reps" not in " ".join(argv):
        args.reps = 10
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    try:
        suite_names = suites.parse_list(args.suite, suites.SUITES, suites.DEFAULT_SUITES, "suite")
        dtype_names = suites.parse_list(args.dtype, bench_dtypes.DTYPES, suites.DEFAULT_DTYPES, "dtype")
        layouts = suites.parse_list(args.layout, suites.LAYOUTS, ("nt",), "layout")
        baseline_order = suites.parse_list(args.baseline, baseline.KINDS, baseline.DEFAULT_ORDER, "baseline")
        epilogues = suites.parse_epilogues(args.epilogue)
        tiles = suites.parse_tiles(args.tiles) or (None,)
    except ValueError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    cases = suites.expand(suite_names, dtype_names, layouts, quick=args.quick, tiles=tiles, epilogues=epilogues)
    if args.only:
        cases = [c for c in cases if re.search(args.only, c.tag)]
    if args.list:
        for c in cases:
            print(f"{c.suite:9} {c.tag}")
        print(f"{len(cases)} cases")
        return 0
    if not cases:
        print("bench: no cases selected", file=sys.stderr)
        return 2
    if args.offline:
        from . import offline

        return offline.compile_work(*offline.dense_work(cases), "bench")
    if args.reps < timing.MIN_PROTOCOL_REPS and not args.quick:
        print(f"bench: warning: --reps {args.reps} < {timing.MIN_PROTOCOL_REPS}: not protocol-grade", file=sys.stderr)

    # ---- GPU from here on
    import cupy

    try:
        num_devices = cupy.cuda.runtime.getDeviceCount()
        cupy.cuda.Device(0).use()
        cupy.cuda.Device().synchronize()
    except Exception as exc:
        print(f"bench: no usable CUDA device: {exc!r}", file=sys.stderr)
        return 2
    try:
        import deepgemm_jit as dg
    except Exception as exc:
        print(f"bench: deepgemm_jit does not import: {exc!r}", file=sys.stderr)
        return 2
    if any(name.startswith("torch") for name in baseline_order):
        try:
            import torch  # noqa: F401  (initialize it before any timing)
            if torch.cuda.is_available():
                torch.cuda.init()
        except Exception as exc:
            print(f"bench: torch unavailable ({exc!r}); baselines fall back to {baseline_order[1:]}",
                  file=sys.stderr)

    from . import runner

    seed = args.seed if args.seed is not None else int(time.time()) & 0x7FFFFFFF
    settings = {"suites": list(suite_names), "dtypes": list(dtype_names), "layouts": list(layouts),
                "reps": args.reps, "warmup": args.warmup, "flush_bytes": args.flush_mb << 20, "seed": seed,
                "quick": args.quick, "baselines": list(baseline_order), "num_devices": num_devices}
    if epilogues != (None,):
        settings["epilogues"] = [e or "none" for e in epilogues]
    header = report.collect_env(argv, settings)
    ctx = runner.RunContext(reps=args.reps, warmup=args.warmup, baseline_order=baseline_order, seed=seed,
                            flusher=timing.L2Flusher(args.flush_mb << 20), dg=dg)
    out_dir = Path(args.out)
    # this run's own crash record (a fixed name was overwritten, then deleted, by the next run into the same folder)
    partial = out_dir / (report.result_stem(header["date"], header["suites"], header.get("git_commit"),
                                            header.get("git_dirty"), header["source_sha256"]) + ".partial.json")
    print(f"bench: {len(cases)} cases on {header['gpu']} ({header['sm_count']} SMs), reps {args.reps}, "
          f"seed {seed}", flush=True)

    rows: list[dict] = []
    t_start = time.perf_counter()
    for i, case in enumerate(cases):
        row = runner.run_case(case, ctx, i * 2)
        rows.append(row)
        detail = "" if row["status"] == "ok" else " " + str(row.get("error") or row.get("note"))[:160]
        plain = f" plain={row['plain_us'] and round(row['plain_us'], 1)}" if "plain_us" in row else ""
        print(f"[{i + 1}/{len(cases)}] {case.tag}: {row['status']} us={row['us'] and round(row['us'], 1)}{plain} "
              f"base={row['baseline_us'] and round(row['baseline_us'], 1)} err={row['err']}{detail}", flush=True)
        try:  # keep a record on disk after every row: a crash later still leaves the rows so far
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(report.to_json(header, rows))
        except OSError:
            pass
    header["wall_s"] = round(time.perf_counter() - t_start, 1)

    paths = report.write_all(out_dir, header, rows)
    partial.unlink(missing_ok=True)
    problems = report.validate({"schema": report.SCHEMA_VERSION, "header": header, "rows": rows})
    print()
    print(report.render_short_table(rows))
    for key, val in paths.items():
        print(f"{key}: {val}")
    if problems:
        print("schema problems: " + "; ".join(problems[:5]))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
