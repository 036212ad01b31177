"""Offline (no GPU): compile the tuning candidates (config.candidate_configs, the heuristic's pick first) of random
dense specs and report the ones with local memory or a build error. Every candidate is a kernel a user gets through
tune=True or config=. Two draws:

    python3 scripts/sweep_candidate_spills.py seeds 0 450        # the fuzz draws of seeds 0..449 (tests/fuzz.py)
    python3 scripts/sweep_candidate_spills.py compositions 7 1100  # RNG seed 7: recipe x layout x composed
                                                                   # epilogue x M / N / K, for 1100 s

Session 34: seeds 0..799 are clean after 53de48e; compositions found 38 spilling kernels (8-24 bytes), 5 of them
heuristic picks (docs/NOTES.md); session 35 timed those five against their candidates (scripts/exp_spilling_picks.py):
the 8-byte stacks cost no measurable time. Set DEEPGEMM_JIT_CACHE_DIR to a scratch cache.
"""
import collections
import random
import sys
import time

sys.path.insert(0, "tests")
import fuzz  # noqa: E402

from deepgemm_jit import config as C  # noqa: E402
from deepgemm_jit import jit, sass  # noqa: E402


def _cases(mode: str, a: int, b: int):
    if mode == "seeds":
        for seed in range(a, a + b):
            yield fuzz.draw(seed)
        return
    rnd, comps, stop = random.Random(a), fuzz.epilogue_compositions(), time.time() + b
    recipes = [r for r in fuzz.RECIPES if r != "fp32"]  # dtype='fp32' refuses tune=True
    while time.time() < stop:
        recipe = rnd.choice(recipes)
        case = fuzz.FuzzCase(0, recipe, rnd.choice(fuzz.RECIPES[recipe].layouts),
                             rnd.choice([16, 64, 128, 256, 1024, 4096]), rnd.choice([1024, 2112, 2896, 4096, 7168]),
                             rnd.choice([512, 1024, 3280, 7168]), None, rnd.choice(comps), None, True, 0, 0, -1, False)
        if fuzz.accepted(case):
            yield case


def main(mode: str, a: int, b: int) -> None:
    stats, seen = collections.Counter(), set()
    for case in _cases(mode, a, b):
        if case.recipe == "fp32":
            continue
        ks = C.kernel_spec(case.spec(), "sm_90a", case.m)
        cands = C.candidate_configs(ks, case.m, "sm_90a", 132)
        for cfg in cands:
            if (ks, cfg) in seen:
                continue
            seen.add((ks, cfg))
            who = "heuristic" if cfg == cands[0] else "candidate"
            try:
                art = jit.get_kernel(ks, cfg, "sm_90a")
                use = sass.resource_usage(art.cubin).get(art.entry, {})
                local = use.get("LOCAL", 0) + use.get("STACK", 0)
            except Exception as exc:  # an offered config that does not build
                stats["error"] += 1
                print(f"ERROR {who} M={case.m} {ks.tag} {cfg.tag}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            stats["local" if local else "ok"] += 1
            if local:
                print(f"LOCAL {local} B {who} M={case.m} {ks.tag} {cfg.tag}", flush=True)
    print(dict(stats), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
