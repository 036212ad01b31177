"""Experiment (GPU): operands TMA cannot read in place, the kernel build() picks against the Hopper kernel on staged
copies (staging.py) and cuBLAS, in one interleaved run.

    python3 -m scripts.exp_staging [--dtypes bf16,tf32] [--shapes 1000x1000x1004,...] [--reps 30] [--out DIR]
    python3 -m scripts.exp_staging --pitch128 --roles none/a/b/a,b ...   # one staged contender per role set

"built" is build()'s Gemm: Gemm._staged_roles stages operands TMA cannot read in place, and at large sizes
(sm90_rules.sm90_realign_roles) TMA-legal A / B whose rows start off 32-byte sectors. "staged" is the Hopper kernel
of the same spec (the cost model's tile for M's bucket) whose every call is staged (with --pitch128, A / B copied
whenever their pitch is not a 128-byte multiple), to ask where those rules' lines should be. Outputs are checked
against a float64 reference before timing (L2 flushed, medians). With --pitch128, --roles may list several role sets
separated by "/" ("none" = read in place): one contender "staged-SET" per set, in the same interleaved run.
"""
from __future__ import annotations

import argparse
import sys

from bench import report

# K in 16 bits: 1003 / 4099 element-aligned rows (staged by the rule), 1002 / 4098 4-byte, 1004 / 4100 8-byte.
SHAPES = ("17x33x1004", "128x4096x4100", "1000x1000x1002", "1000x1000x1004", "1000x1001x1003", "4096x4096x4098",
          "4096x4096x4100", "4095x4097x4099")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="bf16,tf32")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--pitch128", action="store_true",
                    help="the staged contender also copies operands whose pitch is TMA-legal but not a multiple of "
                         "128 bytes (a TMA box row then spans two 128-byte lines)")
    ap.add_argument("--roles", default="a,b",
                    help="with --pitch128: which of A / B the staged contender copies (e.g. 'b': only the operand "
                         "re-read by every M block, to ask whether copying one operand pays where both do not); "
                         "several sets separated by '/' (none/a/b/a,b) make one contender each")
    ap.add_argument("--realign-d", action="store_true",
                    help="the staged contender also stages D (copied out after the launch) whenever TMA could store "
                         "it in place but its rows start off 32-byte sectors (staging.off_sector)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import deepgemm_jit as dg
    from bench import dtypes as bench_dtypes
    from bench import runner
    from deepgemm_jit import config, device, reference
    from deepgemm_jit.spec import GemmSpec

    num_sms = device.num_sms()
    from deepgemm_jit import launch, staging

    role_sets = [frozenset() if r == "none" else frozenset(r.split(",")) for r in args.roles.split("/")]
    if not all(rs <= {"a", "b"} for rs in role_sets) or (len(role_sets) > 1 and not args.pitch128):
        ap.error(f"--roles takes a and / or b (several sets, separated by '/', with --pitch128), got {args.roles!r}")

    def forced_roles(pitch_roles):
        def roles_of_call(m, va, vb, vd, *_rest):
            """Gemm._staged_roles of a "staged" contender: every call staged; with --pitch128 also every TMA-legal
            A / B of `pitch_roles` whose pitch is not a 128-byte multiple (sm90_rules.sm90_realign_roles' rule left
            out), with --realign-d D. An empty set with every operand TMA-legal reads them in place (None)."""
            roles = set()
            if args.pitch128:
                roles |= {role for role, v in (("a", va), ("b", vb)) if role in pitch_roles
                          and launch.tma_legal(v) and v.rows > 1 and v.row_stride * v.itemsize % 128}
            if args.realign_d and launch.tma_legal(vd) and staging.off_sector(vd):
                roles.add("d")
            if not roles and len(role_sets) > 1 and all(map(launch.tma_legal, (va, vb, vd))):
                return None
            return frozenset(roles)
        return roles_of_call
    rows = []
    for dname in args.dtypes.split(","):
        info = bench_dtypes.get(dname)
        for shape in args.shapes.split(","):
            m, n, k = (int(v) for v in shape.split("x"))
            build_kw = {"scaling": info.scaling} if info.scaling else {}  # 8-bit types: the bench dtype's recipe
            spec = GemmSpec.create(n, k, dtype=info.lib, **build_kw)
            built = dg.build(m, n, k, dtype=info.lib, **build_kw)
            contenders = {"built": built}
            tile = config.choose_sm90_config(spec, config.tile_bucket(spec, m), num_sms)
            for rs in role_sets:
                name = "staged" if len(role_sets) == 1 else "staged-" + (",".join(sorted(rs)) or "none")
                contenders[name] = dg.build(m, n, k, dtype=info.lib, config=tile, **build_kw)
                contenders[name]._staged_roles = forced_roles(rs)
            staged = contenders[name]
            _, errors, us = runner.time_checked(contenders, info, spec, m, args.reps)
            row = {"dtype": dname, "m": m, "n": n, "k": k, "built": built.config.tag, "staged_tile": staged.config.tag,
                   "us": us, "max_err": max(errors.values()),
                   "correct": all(reference.within_bound(e, spec.dtype) for e in errors.values())}
            rows.append(row)
            staged_us = " ".join(f"{name} {us[name]:.1f}" for name in contenders if name != "built")
            print(f"{dname} {m}x{n}x{k} ok={row['correct']} built {us['built']:.1f} ({row['built']}) {staged_us} "
                  f"({row['staged_tile']}) cublas {us.get('cublas', float('nan')):.1f}", flush=True)
    report.write_experiment_json(args.out, "exp-staging-pitch128.json" if args.pitch128 else "exp-staging.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
