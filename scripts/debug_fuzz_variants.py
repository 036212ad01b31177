"""Debug (GPU): a fuzz seed's case, as drawn or with some fields changed, run alone as the fuzz runs it (build, call,
later calls, the first call again), to bisect a failure or a hang by feature (a hung call ends the process after
fuzz.HANG_SECONDS, naming itself). One variant per process:

    python3 scripts/debug_fuzz_variants.py 2844 epilogue=beta k=128 later_ms=64   # from the repo root
    (values: ints, None, or text; later_ms: M values joined by '+', or none)
"""
import ast
import dataclasses
import sys
import time

sys.path.insert(0, "tests")
import fuzz  # noqa: E402


def value(field: str, text: str):
    if field == "later_ms":
        return () if text == "none" else tuple(int(v) for v in text.split("+"))
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


if __name__ == "__main__":
    start = time.monotonic()
    case = fuzz.draw(int(sys.argv[1]))
    changes = dict(arg.split("=", 1) for arg in sys.argv[2:])
    case = dataclasses.replace(case, **{f: value(f, v) for f, v in changes.items()})
    print(case.describe(), flush=True)
    fuzz.run(case)
    print(f"ok in {time.monotonic() - start:.1f} s", flush=True)
