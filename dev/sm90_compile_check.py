#!/usr/bin/env python3
"""Compile every sm90 GEMM variant with NVRTC (no GPU needed) and check the machine code.

    python3 dev/sm90_compile_check.py [--sass-tools DIR] [--keep DIR]

For each variant: registers and spills from the ptxas log (-v), stack/local from `cuobjdump
-res-usage`, and in the SASS: HGMMA present (tensor cores on the WGMMA path), no LDL/STL (no local
memory), USETMAXREG present (setmaxnreg kept), and no ptxas warnings (C7508 "setmaxnreg ignored", or
"wgmma ... serialized", which silently costs most of the throughput). Exit status 1 if any fails.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sm90_proto as proto  # noqa: E402  (render/compile helpers; no GPU used)
from sm90_proto import Variant  # noqa: E402


def variant_matrix() -> list[Variant]:
    out: list[Variant] = []
    for dtype in ("bf16", "fp16"):
        for out_dtype in ("bf16", "fp16", "fp32"):
            for block_m in (64, 128):
                for block_n in (8, 40, 64, 112, 128, 144, 160, 176, 192, 208, 256):
                    out.append(Variant(dtype, out_dtype, block_m, block_n))
    for block_n in (64, 96, 128):
        out.append(Variant("bf16", "bf16", 256, block_n))
        out.append(Variant("fp16", "fp32", 256, block_n))
    for block_m in (64, 128):
        for block_n in (8, 72, 128, 208, 256):
            out.append(Variant("tf32", "fp32", block_m, block_n))
    out.append(Variant("tf32", "fp32", 256, 128))
    out.append(Variant("bf16", "bf16", 128, 256, num_stages=2))
    if proto.LAYOUT_V2:  # cluster variants (B multicast) exist only in v2 templates
        for block_m, block_n in ((128, 256), (128, 192), (128, 176), (128, 128), (256, 128), (64, 128)):
            out.append(Variant("bf16", "bf16", block_m, block_n, cluster_m=2))
        out.append(Variant("bf16", "bf16", 128, 256, num_stages=3, cluster_m=2))
        out.append(Variant("bf16", "fp32", 128, 256, cluster_m=2))
        out.append(Variant("fp16", "fp16", 128, 256, cluster_m=2))
        out.append(Variant("tf32", "fp32", 128, 128, cluster_m=2))
    return out


def default_sass_tools() -> Path | None:
    for cand in (Path(sys.prefix) / "lib", Path("/work/venv/lib")):
        for hit in cand.glob("python3*/site-packages/nvidia/cu13/bin"):
            if (hit / "cuobjdump").exists():
                return hit
    found = shutil.which("cuobjdump")
    return Path(found).parent if found else None


def check(v: Variant, n: int, k: int, tools: Path | None, keep: Path | None) -> dict:
    src = proto.render(v, n, k)
    cubin, log = proto.compile_cubin(src)
    row = dict(variant=v.tag, smem=proto.smem_bytes(v, v.stages), problems=[])
    m = re.search(r"Used (\d+) registers", log)
    row["regs"] = int(m.group(1)) if m else -1
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    row["stack"], row["spill_st"], row["spill_ld"] = (int(x) for x in m.groups()) if m else (-1, -1, -1)
    warnings = [ln.strip() for ln in log.splitlines() if "warning" in ln.lower() or "C7508" in ln
                or "serializ" in ln.lower()]
    if warnings:
        row["problems"].append("ptxas: " + " | ".join(warnings))
    if row["stack"] or row["spill_st"] or row["spill_ld"]:
        row["problems"].append("stack/spill")
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{v.tag}.cu").write_text(src)
        (keep / f"{v.tag}.cubin").write_bytes(cubin)
    if tools is not None:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            sass = subprocess.run([str(tools / "cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                                  check=True).stdout
            res = subprocess.run([str(tools / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                                 check=True).stdout
        row["hgmma"] = len(re.findall(r"\bHGMMA\.", sass))
        row["ldl_stl"] = len(re.findall(r"\b(LDL|STL)\b", sass))
        row["setmaxreg"] = len(re.findall(r"USETMAXREG", sass))
        m = re.search(r"STACK:(\d+).*?LOCAL:(\d+)", res)
        row["local"] = int(m.group(2)) if m else -1
        if row["hgmma"] == 0:
            row["problems"].append("no HGMMA")
        if row["ldl_stl"]:
            row["problems"].append("local memory in SASS")
        if row["setmaxreg"] < 2:
            row["problems"].append("setmaxnreg missing")
        if row["local"]:
            row["problems"].append("LOCAL>0")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sass-tools", type=Path, default=None, help="directory with cuobjdump")
    ap.add_argument("--keep", type=Path, default=None, help="write sources and cubins here")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--templates", type=Path, default=proto.TEMPLATES, help="template directory")
    ap.add_argument("--only", default=None, help="substring filter on the variant tag")
    args = ap.parse_args()
    proto.set_templates(args.templates)
    print(f"# templates: {proto.TEMPLATES} (layout {'v2' if proto.LAYOUT_V2 else 'v1'})")
    tools = args.sass_tools or default_sass_tools()
    if tools is None:
        print("# cuobjdump not found: SASS checks skipped")
    print(f"{'variant':40s} {'regs':>4s} {'stk':>3s} {'spill':>5s} {'smem':>7s} {'hgmma':>5s} {'ldl/stl':>7s}  status")
    num_bad = 0
    for v in variant_matrix():
        if args.only and args.only not in v.tag:
            continue
        try:
            row = check(v, args.n, args.k, tools, args.keep)
        except Exception as exc:  # noqa: BLE001 - one failing variant must not hide the others
            num_bad += 1
            print(f"{v.tag:40s} COMPILE ERROR: {str(exc)[:2000]}")
            continue
        status = "ok" if not row["problems"] else "; ".join(row["problems"])
        num_bad += bool(row["problems"])
        print(f"{row['variant']:40s} {row['regs']:4d} {row['stack']:3d} {row['spill_st'] + row['spill_ld']:5d} "
              f"{row['smem']:7d} {row.get('hgmma', -1):5d} {row.get('ldl_stl', -1):7d}  {status}", flush=True)
    print(f"# {num_bad} variants with problems")
    return 1 if num_bad else 0


if __name__ == "__main__":
    sys.exit(main())
