"""Experiment (GPU): the same FP8 problems with two template trees, interleaved in one run (L2 flushed, medians).

    python3 scripts/exp_ab_templates.py --tree NAME=DIR[@BMxBN] [--tree ...] [--tile BMxBN] [--nobulk] [--offline]
                                        [--row-major-scales] [--problems DTYPE[+EPI]:MxNxK,...] [--out DIR]

Each DIR is a copy of a templates/ tree (e.g. `git archive <commit> templates | tar -x -C DIR`); "new" is the
checkout's. Rows: dense FP8 block 4096 x {4096x7168, 7168x16384} and the grouped FP8 4 x 8192 x 4096 x 7168
(contiguous, even groups). scale_a is passed as dg.quantize returns it: M-major with 16-byte aligned columns, the
layout that lets block kernels bulk-copy A scales (launch.bulk_a_scales); --row-major-scales passes a row-major copy
instead (the scale warp's path). --nobulk adds "nobulk": the checkout's templates with DEEPGEMM_JIT_NO_BULK_SCALES=1
(A scales by the scale warp). Results are checked against each other (same kernel math: bitwise equal) before
timing. --tile forces one sm90 tile everywhere (default: the heuristic's); DIR@TILE forces one for that tree only,
TILE in bench --tiles syntax (BMxBN[sS][p], p: ping-pong), and DIR "." is the checkout's templates (to compare
tiles). --problems rows are DTYPE[+EPILOGUE]:MxNxK (e.g. bf16+bias+gelu:4096x24576x1536, with the bench's
epilogue operands); there DIR@wkW / DIR@wkold force the weight-streaming kernel's warps_k, DIR@cpsC its CTAs per
SM (launch bounds and grid rule), DIR@nows builds without weight streaming (the tile kernels at small M), DIR@noaedge
loads A's partial last M block through the whole-box map (launch.edge_maps' A edge off), DIR@aedge through A's edge
map at every tile width (launch.A_EDGE_MAX_BLOCK_N lifted), DIR@aedge176 on tiles up to 176 columns only (session 23's
rule, without launch.A_EDGE_WIDE_*), DIR@nobulk
copies FP8 block A scales with the scale warp (DEEPGEMM_JIT_NO_BULK_SCALES=1 for that tree's launch plan).
L2 -> SM bounds (wrong results; with --time-wrong): DIR@halfa loads A boxes of block_m / 2 rows (the kernel's
a_box_rows; the stage's other rows stay stale), DIR@halfb B boxes of block_n / 2 rows (DIR must be a tree whose
producer expects half of kSmemBBoxBytes per stage), DIR@halfab both. Read them with care: the unwritten rows feed
the tensor cores stale values, which at the power cap is worth more than the bytes
(docs/experiments/sm90-b-multicast-cluster.md: 4-12% there, 2-3% with real values in those rows). DIR@mcb: a tree
whose 128-row kernels run in clusters of two CTAs along M, each loading half of B's rows into both (TMA multicast):
B boxes of block_n / 2 rows and an even grid (the problem needs an even number of M blocks); DIR@mcbG caps that grid
at G CTAs.
--time-wrong times rows whose results are off (trees that drop work on purpose, to bound a cost).
--offline (no GPU) compiles every tree's kernels for the --problems rows into DEEPGEMM_JIT_CACHE_DIR: carry that
folder and copy it into the device's cache dir, and the device run only times.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench import report


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR of a templates/ copy")
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--tile", default=None, help="BMxBN forced for every case (default: the heuristic's)")
    ap.add_argument("--nobulk", action="store_true", help="also time the checkout's templates without bulk A scales")
    ap.add_argument("--problems", default=None,
                    help="DTYPE[+EPILOGUE]:MxNxK,... dense calls instead of the FP8 block rows")
    ap.add_argument("--row-major-scales", action="store_true",
                    help="pass a row-major copy of scale_a (dg.quantize returns it M-major)")
    ap.add_argument("--time-wrong", action="store_true",
                    help="time trees even when a result is beyond the dtype's bound (diagnostic trees that drop "
                         "work on purpose, e.g. constant scales); the row is marked checked=False")
    ap.add_argument("--offline", action="store_true",
                    help="--problems rows: compile each tree's kernels for sm_90a into DEEPGEMM_JIT_CACHE_DIR, no GPU "
                         "(the heuristic's or the forced tile at the row's M; carry the cache to the device run)")
    args = ap.parse_args()
    if args.offline:
        if not args.problems:
            ap.error("--offline compiles --problems rows only")
        return _compile_offline(args)
    import cupy

    import deepgemm_jit as dg
    from bench import runner
    from bench.suites import forced_tile_config
    from deepgemm_jit import launch, reference, timing
    from deepgemm_jit.arrays import scale_view
    from deepgemm_jit.spec import GemmSpec

    def forced(n, k, grouped, tile):
        if tile is None:
            return None
        return forced_tile_config(GemmSpec.create(n, k, dtype="fp8", scaling="block", grouped=grouped), tile)

    trees = []  # (name, templates dir or None for the checkout's, forced tile, bulk A scales allowed)
    for name, spec in (t.split("=", 1) for t in args.tree):
        d, _, tile = spec.partition("@")
        problem_only = ("nows", "nobulk", "noaedge", "aedge", "aedge176", "halfa", "halfb", "halfab")
        if not args.problems and (tile in problem_only or tile.startswith(("wk", "cps", "mcb"))):
            ap.error(f"--tree {name}={spec}: @nows, @nobulk, @noaedge, @aedge[176], @wkW / @wkold, @cpsC, @half* and "
                     "@mcb[G] apply to --problems rows only")
        trees.append((name, None if d == "." else str(Path(d).resolve()), tile or args.tile, True))
    if args.nobulk:
        trees.append(("nobulk", None, args.tile, False))
    trees.append(("new", None, args.tile, True))
    rows = []
    if args.problems:
        for problem in args.problems.split(","):
            rows.append(_time_problem(problem, trees, args.reps, args.time_wrong))
        _write(args, trees, rows)
        return 0
    cases = [("dense", 4096, 4096, 7168, 1), ("dense", 4096, 7168, 16384, 1), ("grouped", 8192, 4096, 7168, 4)]
    for kind, m, n, k, groups in cases:
        total = m * groups
        p = runner.grouped_fp8_inputs(groups, m, n, k, seed=m + n + k)
        qa, sa, ws, offs = p.qa, p.sa, p.weights, p.offs
        if args.row_major_scales:
            sa = cupy.ascontiguousarray(sa)
        qb, sb = ws[0] if kind == "dense" else (p.qb, p.sb)
        outs, fns = {}, {}
        for name, tdir, tile, bulk in trees:
            if tdir is None:
                os.environ.pop("DEEPGEMM_JIT_TEMPLATES_DIR", None)
            else:
                os.environ["DEEPGEMM_JIT_TEMPLATES_DIR"] = tdir
            # Read when the first call makes the launch plan, which the timed calls replay.
            os.environ["DEEPGEMM_JIT_NO_BULK_SCALES"] = "0" if bulk else "1"
            out = reference.poisoned((total, n), "bf16")
            if kind == "dense":
                g = dg.build(m, n, k, dtype="fp8", weight_streaming=False, config=forced(n, k, False, tile))
                fns[name] = (lambda g=g, out=out: g(qa, qb, scale_a=sa, scale_b=sb, out=out))
            else:
                g = dg.build_grouped(n, k, dtype="fp8", expected_m=m, num_groups=groups, config=forced(n, k, True, tile))
                fns[name] = (lambda g=g, out=out: g(qa, qb, scale_a=sa, scale_b=sb, offs=offs, out=out))
            fns[name]()
            outs[name] = out
        os.environ.pop("DEEPGEMM_JIT_TEMPLATES_DIR", None)
        os.environ.pop("DEEPGEMM_JIT_NO_BULK_SCALES", None)
        cupy.cuda.Device().synchronize()
        same = all(bool((o.view(cupy.uint16) == outs["new"].view(cupy.uint16)).all()) for o in outs.values())
        # Each tree against the float64 product of the dequantized operands (group by group), before any timing.
        a64 = reference.dequantize_reference(qa, sa, "fp8_e4m3", "group128")
        ref = cupy.concatenate([a64[g * m:(g + 1) * m] @ reference.dequantize_reference(
            ws[g][0], ws[g][1], "fp8_e4m3", "block128").T for g in range(groups)])
        errors = {name: reference.error(o, ref) for name, o in outs.items()}
        del a64, ref
        checked = all(reference.within_bound(e, "fp8_e4m3") for e in errors.values())
        if not checked:
            print(f"{kind} {groups}x{m}x{n}x{k}: beyond the fp8 bound: {errors}"
                  + ("" if args.time_wrong else " NOT TIMED (--time-wrong times it anyway)"), flush=True)
            if not args.time_wrong:
                rows.append({"kind": kind, "m": m, "n": n, "k": k, "groups": groups, "err": errors,
                             "checked": False})
                continue
        t = timing.time_interleaved(fns, reps=args.reps, warmup=5)
        flops = 2.0 * total * n * k
        row = {"kind": kind, "m": m, "n": n, "k": k, "groups": groups, "bitwise_equal": same, "err": errors,
               "checked": checked,
               "scale_a": "row-major" if args.row_major_scales else "m-major",
               "bulk_a_scales": bool(launch.bulk_a_scales(GemmSpec.create(n, k, dtype="fp8", scaling="block"),
                                                          scale_view(sa, "scale_a", sa.shape, ""), total)),
               **{name: {"us": r.median_us, "tflops": flops / r.median_us / 1e6} for name, r in t.items()}}
        rows.append(row)
        print(f"{kind} {groups}x{m}x{n}x{k}: equal={same} bulk_a_scales={row['bulk_a_scales']} " + "  ".join(
            f"{name} {r.median_us:.1f} us {flops / r.median_us / 1e6:.0f} TF" for name, r in t.items()), flush=True)
    _write(args, trees, rows)
    return 0


def _write(args, trees, rows) -> None:
    """The rows under the run's header (GPU, commit, command) and what each tree name stood for, in a file of its
    own (the fixed name was overwritten by the next run into the same folder)."""
    header = report.collect_env(sys.argv[1:], {"trees": {name: {"templates": tdir or "checkout", "tile": tile,
                                                                 "bulk_a_scales": bulk}
                                                          for name, tdir, tile, bulk in trees}},
                                module="scripts.exp_ab_templates")
    stamp = report.experiment_stamp(header)
    commit = (header.get("git_commit") or "nogit")[:7]
    report.write_experiment_json(args.out, f"{stamp}-exp-ab-templates-{commit}.json", {"header": header, "rows": rows})


def _compile_offline(args) -> int:
    """--offline: every tree's kernel for each --problems row (tree tiles as the timed run forces them; @-options
    other than a tile build the heuristic's), compiled for sm_90a without a GPU. The cache keys hash the rendered
    source, so each tree's kernels land under their own keys."""
    from bench import offline
    from bench.runner import parse_problem

    work, notes = [], []
    for problem in args.problems.split(","):
        m, n, k, _info, spec, _epilogue, _layout = parse_problem(problem)
        trees = [t.split("=", 1)[1] for t in args.tree] + ["."]
        for tree in dict.fromkeys(trees):
            d, _, tile = tree.partition("@")
            picked = offline._forced(spec, m, n, k, tile if tile and tile[0].isdigit() else "auto", notes)
            if picked is not None:
                work.append((None if d == "." else str(Path(d).resolve()), picked))
    failed = 0
    for tdir in dict.fromkeys(t for t, _ in work):
        _use_tree(tdir)
        failed |= offline.compile_work([w for t, w in work if t == tdir], notes, f"tree {tdir or 'checkout'}")
    _use_tree(None)
    return failed


def _use_tree(tdir) -> None:
    if tdir is None:
        os.environ.pop("DEEPGEMM_JIT_TEMPLATES_DIR", None)
    else:
        os.environ["DEEPGEMM_JIT_TEMPLATES_DIR"] = tdir


def _time_problem(problem: str, trees, reps: int, time_wrong: bool = False) -> dict:
    """One dense nt problem "DTYPE[+EPILOGUE]:MxNxK" (DTYPE a bench dtype: bf16, fp8_block, ...; EPILOGUE e.g.
    bias+gelu, with the bench's epilogue operands) with every tree's kernels
    (build's dispatch), each checked against the float64 reference, all against the first tree's result (bitwise
    equal, or the relative difference), then timed interleaved."""
    import cupy

    import deepgemm_jit as dg
    from bench import runner
    from bench.suites import forced_tile_config
    from deepgemm_jit import gemv, launch, reference, timing

    p = runner.problem_inputs(problem)
    m, n, k, info, spec, ops, kwargs = p.m, p.n, p.k, p.info, p.spec, p.inputs, p.kwargs
    a, b, build = ops.a, ops.b, p.build_kwargs()
    outs, fns = {}, {}
    choose_warps_k, ctas_per_sm = gemv.choose_warps_k, gemv.GemvSpec.ctas_per_sm
    for name, tdir, tile, _bulk in trees:
        _use_tree(tdir)
        if tile == "wkold":  # DIR@wkold: warps_k by K alone (the rule before the one-wave grid, session 8)
            gemv.choose_warps_k = lambda k, element_bytes, *_: choose_warps_k(k, element_bytes)
        elif tile and tile.startswith("wk"):  # DIR@wkW: the weight-streaming kernel's warps_k forced to W
            gemv.choose_warps_k = (lambda w: lambda *_: w)(int(tile[2:]))
        elif tile and tile.startswith("cps"):  # DIR@cpsC: its CTAs per SM (launch bounds + one-wave grid rule)
            gemv.GemvSpec.ctas_per_sm = property((lambda c: lambda _spec: c)(int(tile[3:])))
            gemv.clear_memo()  # the memo keys on the spec, which does not hold ctas_per_sm
        # DIR@nows: the tile kernels where build would stream weights (small M), to place the dispatch's crossover.
        forced = {}
        if tile == "nows":
            forced = {"weight_streaming": False}
        elif tile and tile[0].isdigit():  # DIR@BMxBN[sS][p]: that sm90 tile (bench --tiles syntax)
            forced = {"config": forced_tile_config(spec, tile)}
        g = dg.build(m, n, k, **build, **forced)
        out = reference.poisoned(spec.out_shape(m), spec.out_dtype)
        fns[name] = (lambda g=g, out=out: g(a, b, out=out, **kwargs))
        if tile == "nobulk":  # DIR@nobulk: FP8 block A scales by the scale warp (read when the plan is made)
            os.environ["DEEPGEMM_JIT_NO_BULK_SCALES"] = "1"
        if tile == "noaedge":  # DIR@noaedge: A's partial last M block through the whole-box map (launch.edge_maps)
            os.environ["DEEPGEMM_JIT_NO_A_EDGE"] = "1"
        a_edge_rule = launch.A_EDGE_MAX_BLOCK_N, launch.A_EDGE_WIDE_MAX_LAST_BAND
        box_rules = launch.a_box_rows, launch.operand_map, launch.persistent_grid
        if tile in ("halfa", "halfab"):  # DIR@halfa: half of A's rows per stage (bound)
            launch.a_box_rows = lambda artifact, spec, m: artifact.config.block_m // 2
        mcb = bool(tile) and tile.startswith("mcb")
        if mcb:  # DIR@mcb[G]: clusters of two CTAs: an even grid (of at most G CTAs)
            cap = int(tile[3:] or 1 << 30)
            launch.persistent_grid = (lambda cap: lambda units, sms, balanced=False: min(
                min(sms, cap) // 2 * 2, units + units % 2))(cap)
        if tile in ("halfb", "halfab") or mcb:  # DIR@halfb: half of B's rows per stage (bound; the tree expects half)
            launch.operand_map = (lambda view, dtype, k_major, block_mn, block_k, b_ptr=b.data.ptr: box_rules[1](
                view, dtype, k_major, block_mn // 2 if view.ptr == b_ptr else block_mn, block_k))  # edge map too
        if tile == "aedge":  # DIR@aedge: A's edge map at every tile width (launch.A_EDGE_MAX_BLOCK_N lifted)
            launch.A_EDGE_MAX_BLOCK_N = 256
        if tile == "aedge176":  # DIR@aedge176: A's edge map up to 176 columns only (session 23's rule)
            launch.A_EDGE_WIDE_MAX_LAST_BAND = 0
        fns[name]()  # makes the call's launch plan (grid and warps_k), which the timed calls replay
        launch.A_EDGE_MAX_BLOCK_N, launch.A_EDGE_WIDE_MAX_LAST_BAND = a_edge_rule
        launch.a_box_rows, launch.operand_map, launch.persistent_grid = box_rules
        os.environ.pop("DEEPGEMM_JIT_NO_BULK_SCALES", None)
        os.environ.pop("DEEPGEMM_JIT_NO_A_EDGE", None)
        gemv.choose_warps_k = choose_warps_k
        if gemv.GemvSpec.ctas_per_sm is not ctas_per_sm:
            gemv.GemvSpec.ctas_per_sm = ctas_per_sm
            gemv.clear_memo()
        outs[name] = out
    _use_tree(None)
    cupy.cuda.Device().synchronize()
    first = next(iter(outs.values()))
    same = all(bool((o.view(cupy.uint8) == first.view(cupy.uint8)).all()) for o in outs.values())
    f64 = reference.to_float64(first)
    diff = max(reference.error(reference.to_float64(o), f64) for o in outs.values())
    errors = {tree: reference.error(reference.to_float64(o), ops.ref) for tree, o in outs.items()}
    checked = all(reference.within_bound(e, info.lib) for e in errors.values())
    row = {"problem": problem, "bitwise_equal": same, "max_rel_diff": diff, "err": errors, "checked": checked}
    if not checked:
        print(f"{problem}: error against the float64 reference beyond the {info.lib} bound: {errors}", flush=True)
        if not time_wrong:
            print(f"{problem}: NOT TIMED (--time-wrong times it anyway)", flush=True)
            return row
    t = timing.time_interleaved(fns, reps=reps, warmup=5)
    gbytes = p.io_bytes
    row.update({
        name: {"us": r.median_us, "tb_s": gbytes / r.median_us / 1e6} for name, r in t.items()})
    print(f"{problem}: equal={same} diff={diff:.1e} " + "  ".join(
        f"{name} {r.median_us:.2f} us {gbytes / r.median_us / 1e6:.2f} TB/s" for name, r in t.items()), flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
