"""Negative control of the fuzzers' torch_op checks (GPU): torch_op cases run with the custom ops replaced by ones
that return an unwritten tensor of the right shape and dtype (torch.empty_like of the real result). Two faults:
`every` (every call) and `repeat` (only a call whose operands were seen before: the dense cases' first call made
again after later calls, whose output torch's allocator could take from a freed block holding the right values).
A check that can fail catches every `every` case and every `repeat` case that makes a call again. Grouped cases
whose groups own no row (masked counts all 0) have nothing to check and are left out: session 35's first run missed
only such a case (seed 211), caught the other 23 grouped and 30 of 30 dense `every` cases, and ran out of its 100 s
before `repeat` (the grouped cases compile a kernel each: allow ~300 s).

    python3 scripts/check_fuzz_torch_op.py 30   # from the repo root; PYTHONPATH as scripts/device_run.sh sets it
"""
import sys

sys.path.insert(0, "tests")
import fuzz  # noqa: E402
import fuzz_grouped  # noqa: E402

import deepgemm_jit.torch as dgt  # noqa: E402

OPS = ("gemm", "gemm_fp8", "grouped_mm", "grouped_mm_fp8")


def _faulty(real, fault: str, seen: set):
    import torch

    def op(*args, **kwargs):
        d = real(*args, **kwargs)
        key = tuple((t.data_ptr(), tuple(t.shape)) for t in args if isinstance(t, torch.Tensor))
        again = key in seen
        seen.add(key)
        return torch.empty_like(d) if fault == "every" or again else d

    return op


def _control(name: str, cases, run, fault: str) -> tuple[int, int]:
    caught = 0
    for case in cases:
        seen: set = set()
        real = {op: getattr(dgt, op) for op in OPS}
        for op in OPS:
            setattr(dgt, op, _faulty(real[op], fault, seen))
        try:
            run(case)
            print(f"MISSED {name} {fault}", case.describe(), flush=True)
        except AssertionError as exc:
            caught += 1
            print(f"caught {name} {fault} {case.seed}", str(exc)[:100], flush=True)
        finally:
            for op in OPS:
                setattr(dgt, op, real[op])
    return caught, len(cases)


def main(count: int) -> int:
    dense = [c for c in map(fuzz.draw, range(40 * count)) if c.torch_op][:count]
    grouped = [c for c in map(fuzz_grouped.draw, range(20 * count))
               if c.torch_op and sum(min(s, c.max_m) if c.max_m else s for s in c.sizes)][:count]
    results = {
        "dense every": _control("dense", dense, fuzz.run, "every"),
        "grouped every": _control("grouped", grouped, fuzz_grouped.run, "every"),
        "dense repeat": _control("dense", [c for c in dense if c.later_ms], fuzz.run, "repeat"),
    }
    for what, (caught, total) in results.items():
        print(f"negative control {what}: {caught} caught of {total}")
    return 0 if all(caught == total for caught, total in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 30))
