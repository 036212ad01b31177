"""Negative control of the fuzz's side_stream check (GPU): side_stream cases run with the check's setup (A's values
landing late on a busy side stream) but with the call made on the null stream, stream= dropped. A check that can fail
catches every one. Session 34's first version (a 2 ms spin, no warm-up call) caught 0 of 40: a first call loads its
kernels (which may synchronize the context) and sizes its buffers before launching, so A had landed. The version
with the warm-up call and a 20 ms spin caught 40 of 40 on the H200 (session 35).

    python3 scripts/check_fuzz_side_stream.py 40   # from the repo root
"""
import dataclasses
import sys

sys.path.insert(0, "tests")
import fuzz  # noqa: E402


def main(count: int) -> int:
    seeds = [s for s in range(20 * count) if fuzz.draw(s).side_stream][:count]
    real = fuzz._side_stream_call

    def on_the_null_stream(case, g, call, what):
        cls = type(g)
        kept = cls.__call__

        def without_stream(self, *args, stream=None, **kwargs):
            return kept(self, *args, **kwargs)

        cls.__call__ = without_stream
        try:
            return real(case, g, call, what)
        finally:
            cls.__call__ = kept

    fuzz._side_stream_call = on_the_null_stream
    caught = 0
    for seed in seeds:
        case = dataclasses.replace(fuzz.draw(seed), later_ms=(), graph=False)
        try:
            fuzz.run(case)
            print("MISSED", case.describe(), flush=True)
        except Exception as exc:  # the check's AssertionError, or anything else the NaN inputs cause
            caught += 1
            print("caught", seed, type(exc).__name__, str(exc)[:120], flush=True)
    print(f"negative control: {caught} caught of {len(seeds)} (spin {fuzz.SIDE_STREAM_SPIN_SECONDS} s)")
    return 0 if caught == len(seeds) else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 40))
