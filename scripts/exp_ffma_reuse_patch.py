"""Experiment (CPU): rewrite the promotion's FFMA control bits in cached cubins, to time on the GPU.

    python3 scripts/exp_ffma_reuse_patch.py --cache DIR --period P [--check]

Why: in FP8 block kernels ptxas clears the yield bit (bit 45 of an instruction's high 64-bit word; cleared = the
warp may be switched out after it) on every other FFMA of the promotion, and an instruction that may yield carries
no operand-reuse flag, so every other FFMA reads the per-row scale from the register file: three register reads
instead of two. Bounds (docs/experiments/sm90-fp8-block-promotion-bounds-s47.md): an FFMA by an immediate is 5-8%
faster than HEAD, one by a register scale that is fixed for the kernel 1-4%. This rewrites each run of consecutive
FFMAs that share their second source register R (no predicate, no other reuse flags, no scoreboard waits) so that
only every P-th one yields and the others keep R in the reuse cache for the next (no instruction both yields and
reuses, as ptxas emits). The math is untouched: results must stay bitwise equal to the unpatched kernel's.

Every cubin under DIR/kernels is patched in place and its cache metadata (checksum, size) is updated; compile a
copy of the templates with a distinct comment into a scratch cache with scripts/exp_ab_templates --offline first,
patch it, then merge it into the cache that travels. --check prints the per-kernel counts without writing.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import struct
import sys
from pathlib import Path

from deepgemm_jit import cubin as cubin_mod
from deepgemm_jit import sass

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s+([^;]*);"
                   r"\s*/\* (0x[0-9a-f]{16}) \*/")
_HIGH = re.compile(r"^\s*/\* (0x[0-9a-f]{16}) \*/\s*$")
YIELD_BIT = 45           # set: no yield; cleared: the scheduler may switch warps after this instruction
REUSE_BITS = (58, 59, 60)  # operand slots a, b, c
WAIT_MASK = (52, 6)      # scoreboard wait mask: bits 52..57


def instructions(listing: str):
    """(address, predicated, opcode, operands, low, high) of each instruction of the (single) function."""
    lines = listing.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = _LINE.search(line)
        if not m:
            continue
        high = _HIGH.match(lines[i + 1])
        assert high, lines[i + 1]
        ops = [o.strip() for o in m.group(4).split(",")] if m.group(4).strip() else []
        out.append((int(m.group(1), 16), bool(m.group(2)), m.group(3), ops, int(m.group(5), 16),
                    int(high.group(1), 16)))
    return out


def _reg(operand: str) -> int | None:
    m = re.fullmatch(r"R(\d+)(\.reuse)?", operand)
    return int(m.group(1)) if m else None


def patch(cubin: bytes, period: int) -> tuple[bytes, dict]:
    listing = sass.disassemble(cubin)
    function = re.search(r"Function : (\S+)", listing).group(1)
    base, _ = cubin_mod.section(cubin, f".text.{function}")
    ins = instructions(listing)
    data = bytearray(cubin)
    stats = {"runs": 0, "ffma_in_runs": 0, "yields_before": 0, "yields_after": 0}

    def eligible(k):
        addr, pred, op, ops, low, high = ins[k]
        if op != "FFMA" or pred or len(ops) != 4 or _reg(ops[2]) is None:
            return False
        if any(high >> b & 1 for b in (REUSE_BITS[0], REUSE_BITS[2])):
            return False
        return (high >> WAIT_MASK[0]) & ((1 << WAIT_MASK[1]) - 1) == 0

    k = 0
    while k < len(ins):
        if not eligible(k):
            k += 1
            continue
        reg = _reg(ins[k][3][2])
        end = k + 1
        while (end < len(ins) and eligible(end) and _reg(ins[end][3][2]) == reg
               and ins[end][0] == ins[end - 1][0] + 16):
            end += 1
        if end - k >= 4:
            stats["runs"] += 1
            stats["ffma_in_runs"] += end - k
            for j in range(k, end - 1):  # the run's last instruction keeps its bits (its successor is outside)
                addr, _, _, _, low, high = ins[j]
                off = base + addr
                assert struct.unpack_from("<QQ", data, off) == (low, high), hex(addr)
                stats["yields_before"] += not (high >> YIELD_BIT & 1)
                yields = (j - k + 1) % period == 0
                high &= ~(1 << YIELD_BIT | 1 << REUSE_BITS[1])
                high |= (0 if yields else 1 << YIELD_BIT | 1 << REUSE_BITS[1])
                stats["yields_after"] += yields
                struct.pack_into("<QQ", data, off, low, high)
        k = end
    return bytes(data), stats


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", required=True)
    ap.add_argument("--period", type=int, required=True)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    for path in sorted(Path(args.cache).glob("kernels/*/*.cubin")):
        cubin = path.read_bytes()
        new, stats = patch(cubin, args.period)
        print(path.name[:16], stats)
        if args.check:
            continue
        path.write_bytes(new)
        meta_path = path.with_suffix(".json")
        meta = json.loads(meta_path.read_text())
        meta.update(cubin_sha256=hashlib.sha256(new).hexdigest(), cubin_bytes=len(new))
        meta_path.write_text(json.dumps(meta, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
