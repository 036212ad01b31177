"""The `deepgemm-jit` command: demo, explain, warmup, cache."""
from __future__ import annotations

import argparse
import os
import json
import math
import sys
import time

from . import __version__, cache, device, dtypes, warmup
from .errors import DeepGemmError

DEMO_SHAPES = [(17, 33, 65), (1000, 1001, 1003), (4096, 4096, 4096)]
DEMO_DTYPES = ["fp16", "bf16", "tf32"]


def _cmd_demo(args) -> int:
    from .api import build

    has_gpu = device.gpu_count() > 0
    arch = device.current_arch() if has_gpu else device.normalize_arch(args.arch or "sm_90a")
    if not has_gpu:
        print(f"No GPU found: compiling the demo kernels for {arch} only (nothing is run).")
        stored = True
        for dt in DEMO_DTYPES:
            for m, n, k in DEMO_SHAPES:
                start = time.perf_counter()
                g = build(m, n, k, dtype=dt, arch=arch)
                took = time.perf_counter() - start
                how = "compiled" if g.artifact.compiled_now else "cached"
                path = g.artifact.cubin_path
                stored = stored and path is not None
                print(f"  {dt:5s} {m}x{n}x{k}: {g.config.tag} {how} in {took:.2f} s -> {path or '(memory only)'}")
        print("No GPU found: kernels were compiled and " + ("cached" if stored else "NOT all saved to the disk cache "
              "(it is off or unusable: see the warning above)") + ", not run.")
        return 0

    from . import baseline, reference
    from .timing import time_interleaved

    print(f"deepgemm-jit {__version__} on {_gpu_name()} ({arch}); error vs float64, time vs cuBLAS")
    print(f"{'dtype':5s} {'M':>5s} {'N':>5s} {'K':>5s} {'rel.err':>9s} {'ok':>3s} {'us':>9s} "
          f"{'TFLOPS':>7s} {'cuBLAS us':>9s} {'ratio':>6s}")
    failures = 0
    for dt in DEMO_DTYPES:
        for m, n, k in DEMO_SHAPES:
            g = build(m, n, k, dtype=dt)
            a, b = reference.random_operands(g.spec, m)
            out = reference.poisoned(g.spec.out_shape(m), g.spec.out_dtype)
            g(a, b, out=out)
            ref = reference.reference(g.spec, a, b)
            err = reference.relative_error(out, ref)
            ok = reference.within_bound(err, dt)
            failures += not ok
            line = f"{dt:5s} {m:5d} {n:5d} {k:5d} {err:9.2e} {'yes' if ok else 'NO':>3s}"
            try:
                base, reasons = baseline.bind(g.spec, a, b)
                if base is None:
                    raise RuntimeError("no cuBLAS baseline: " + "; ".join(reasons))
                base_check = baseline.check(base, g.spec, ref)
                if not base_check.is_ok:
                    raise RuntimeError(base_check.note)
                times = time_interleaved({"ours": lambda: g(a, b, out=out), "cublas": base.fn}, reps=args.reps)
                us, bus = times["ours"].median_us, times["cublas"].median_us
                print(f"{line} {us:9.1f} {2 * m * n * k / us / 1e6:7.1f} {bus:9.1f} {bus / us:6.2f}")
            except Exception as exc:  # a missing or wrong baseline must not hide the check
                print(f"{line}  (timing: {exc})")
    print("all results within bounds" if not failures else f"{failures} result(s) OUT OF BOUNDS")
    return 0 if not failures else 1


def _gpu_name() -> str:
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(device.current_device_id())["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _cmd_explain(args) -> int:
    from .api import build

    g = build(args.M, args.N, args.K, dtype=args.dtype, out_dtype=args.out_dtype, layout=args.layout,
              arch=args.arch, scaling=args.scaling, b_dtype=args.b_dtype, fast_accum=args.fast_accum,
              epilogue=args.epilogue)
    info = g.explain()
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"spec      {g.spec.tag}  (M hint {g.m_hint}, tile chosen for M bucket {info['m_bucket']})")
    print(f"arch      {info['arch']}")
    print(f"family    {info['family']}   config {info['config_tag']}")
    print(f"threads   {info['num_threads']}   registers {info['registers']}   shared {info['shared_bytes']} B"
          f"   local {info['local_bytes']} B")
    print(f"cache key {info['cache_key']}")
    print(f"cubin     {info['cubin']}")
    tensor_ops = ", ".join(f"{op} {n}" for op, n in info["sass"].items() if "MMA" in op) or "none"
    mix = ", ".join(f"{op} {n}" for op, n in list(info["sass"].items())[:16])
    print(f"MMA       {tensor_ops}")
    print(f"SASS      {mix}")
    if info["family"] == "sm90":  # ptxas's wgmma serialisation notes (a silent ~2x slowdown; README lists them)
        print(f"wgmma     serialized by ptxas: {', '.join(info.get('wgmma_serialized') or []) or 'no'}")
    decode = info.get("weight_streaming", {})
    if decode.get("max_m"):
        launches = []
        if "row_sweep" in decode:
            rows = decode["row_sweep"]
            launches.append(f"M <= {rows['max_m']}: {rows['num_threads']} threads x {rows['chunks']} words a row, "
                            f"grid {rows['grid']}")
        if "cluster" in decode or "warps_k" in decode:
            launch = f"cluster {decode['cluster']}" if "cluster" in decode else f"warps_k {decode['warps_k']}"
            launches.append(f"{launch}, grid {decode['grid']}")
        print(f"decode    M <= {decode['max_m']}: {', '.join(decode['kernels'])} ({'; '.join(launches)}; "
              f"needs {decode['condition']})")
    split = info.get("split_k", {})
    if split.get("kernel"):
        shares = ", ".join(f"M={m}: {s}" for m, s in split["splits_by_m"].items())
        print(f"split-K   shares per tile by M ({split['num_sms']} SMs): {shares}")
    staging = info.get("staging")
    if staging and staging["packed_staged"]:
        print(f"staging   {', '.join(staging['packed_staged'])}: {staging['note']}")
    if staging and staging.get("realigned"):
        print(f"realign   {staging['realign_note']}")
    if staging and staging.get("transposed_in_kernel"):
        print(f"transpose {staging['transpose_note']}")
    if staging and "kernel_spec" in staging:
        print(f"kernel    {staging['kernel_spec']} (the {staging['kernel_layout']} twin of the spec above)")
    if "split" in info:  # fp32 (3xTF32): the split kernel before the TF32 GEMM
        operands = (f"A as [hi | lo] of {info.get('k_operand')} columns and the raw weight (its lo made in shared "
                    f"memory, one stage per K block of 32)" if info.get("raw_b")
                    else f"[hi | lo] operands of {info.get('k_operand')} columns")
        print(f"3xTF32    split kernel {info['split'].get('entry', '')} (local {info['split']['local_bytes']} B), "
              f"TF32 GEMM over K' = {info.get('k_inner')} from {operands}")
    return 0


def _report_kept(kept: int, store) -> int:
    """Exit status of a removal: 1, said on stderr, when entries stayed (a read-only or another user's cache)."""
    if kept:
        print(f"could not remove {kept} kernels from {store.root} (permissions?)", file=sys.stderr)
        return 1
    return 0


def _cmd_cache(args) -> int:
    unused = [flag for flag, given, takes in (("KEY", args.key is not None, ("info",)),
                                                ("--yes", args.yes, ("clear",)),
                                                ("--older-than", args.older_than is not None, ("prune",)))
              if given and args.action not in takes]
    if unused:
        print(f"cache {args.action} takes no {', '.join(unused)}", file=sys.stderr)
        return 2
    if args.action == "info" and args.key is None:
        print("cache info needs a KEY (a prefix of one from `cache list`)", file=sys.stderr)
        return 2
    store = cache.default_cache()
    if store is None:
        print("the disk cache is disabled (DEEPGEMM_JIT_DISABLE_DISK_CACHE): nothing to "
              + ("list" if args.action == "list" else args.action))
        return 0 if args.action == "list" else 2
    if args.action == "list":
        entries = store.entries()
        total = sum(e["disk_bytes"] for e in entries)
        print(f"{store.root}: {len(entries)} kernels, {total / 1e6:.1f} MB")
        for e in entries:
            print(f"  {e['key'][:16]}  {e.get('arch', '?'):7s} {e['disk_bytes'] / 1e3:8.1f} kB  {e.get('name', '?')}")
        return 0
    if args.action == "info":
        matches = [k for k in store.keys() if k.startswith(args.key)]
        if len(matches) != 1:
            print(f"{len(matches)} entries match {args.key!r}", file=sys.stderr)
            return 2
        entry = store.load(matches[0])
        if entry is None:
            print("entry was corrupt and has been removed", file=sys.stderr)
            return 2
        meta = {k: v for k, v in entry.meta.items() if k != "log"}
        print(json.dumps(meta, indent=1, sort_keys=True))
        return 0
    if args.action == "prune":
        least = cache.TOUCH_INTERVAL_S / 86400.0  # use is recorded at most this often: younger ages are not known
        if args.older_than is None or not math.isfinite(args.older_than) or args.older_than < least:
            print(f"prune needs --older-than DAYS (>= {least:g}: a kernel's use is recorded at most once a day, so "
                  "one used today may look older; `cache clear --yes` removes everything)", file=sys.stderr)
            return 2
        removed, kept = store.prune(args.older_than * 86400.0)
        print(f"removed {removed} kernels unused for {args.older_than:g} days from {store.root}")
        return _report_kept(kept, store)
    if args.action == "clear":
        if not args.yes:
            print(f"this removes every kernel under {store.root}; run again with --yes", file=sys.stderr)
            return 2
        removed, kept = store.clear()
        print(f"removed {removed} kernels from {store.root}")
        return _report_kept(kept, store)
    return 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deepgemm-jit", description="JIT-generated GEMM kernels")
    p.add_argument("--version", action="version", version=__version__)
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="build, check and time a few GEMMs (compile only without a GPU)")
    d.add_argument("--arch", default=None, help="target when no GPU is present (default sm_90a)")
    d.add_argument("--reps", type=int, default=30)
    d.set_defaults(fn=_cmd_demo)

    e = sub.add_parser("explain", help="show the chosen config, resources and SASS mix of a GEMM")
    e.add_argument("M", type=int)
    e.add_argument("N", type=int)
    e.add_argument("K", type=int)
    e.add_argument("--dtype", default="bf16",  # build() checks it, with its aliases (fp8 = fp8_e4m3)
                   help=f"input type ({', '.join(dtypes.GEMM_DTYPES)}, or fp8); fp32 = FP32-accurate 3xTF32")
    e.add_argument("--out-dtype", default=None, choices=dtypes.OUTPUT_DTYPES)
    e.add_argument("--layout", default="nt", choices=("nt", "nn", "tn", "tt"))
    e.add_argument("--scaling", default=None, choices=("none", "tensor", "row", "block"),
                   help="fp8/int8 scale recipe (fp8 default block, int8 none)")
    e.add_argument("--b-dtype", default=None, choices=dtypes.INPUT_DTYPES, help="B's type when it differs (fp8)")
    e.add_argument("--fast-accum", action="store_true", help="fp8 tensor/row: no FP32 promotion")
    e.add_argument("--epilogue", default=None, help="fused epilogue, e.g. bias+gelu (see deepgemm_jit/epilogue.py)")
    e.add_argument("--arch", default=None, help="e.g. sm_90a (needed without a GPU)")
    e.add_argument("--json", action="store_true", help="one JSON object")
    e.set_defaults(fn=_cmd_explain)

    warmup.add_parser(sub)

    c = sub.add_parser("cache", help="list, inspect, prune or clear the kernel cache")
    c.add_argument("action", choices=("list", "info", "prune", "clear"))
    c.add_argument("key", nargs="?", help="key prefix (for info)")
    c.add_argument("--yes", action="store_true", help="confirm clear")
    c.add_argument("--older-than", type=float, default=None, metavar="DAYS",
                   help="prune: remove kernels not loaded or written for this many days")
    c.set_defaults(fn=_cmd_cache)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.fn(args)
    except BrokenPipeError:  # `deepgemm-jit cache list | head`: the reader left, not an error
        sys.stdout = open(os.devnull, "w")
        return 0
    except (DeepGemmError, ValueError, TypeError) as exc:
        print(f"deepgemm-jit: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
