"""Do the 8-byte stacks of session 34's spilling heuristic picks cost time? (GPU.) For each of the five specs the
composition sweep (scripts/sweep_candidate_spills.py) found whose heuristic pick keeps 8 bytes on the stack, time
every tuning candidate (config.candidate_configs) on the tuner's own trial call (tuning.tune, whole call checked
against float64) and print each with its stack bytes. If the spilling pick is as fast as the best non-spilling
candidate, a ranking rule against those tiles buys nothing.

    python3 scripts/exp_spilling_picks.py [s38] > log   # from the repo root; PYTHONPATH as device_run.sh sets it

s38: session 38's split-K picks instead (helper 52: 128x128 split-K tiles with C + residual into FP16 D keep 8-24
bytes on the stack; the same tiles into BF16 D, and 128x112 / 128x144 into FP16 D, keep none).

Session 35 (`*gpu-spilling-picks-vs-candidates-e9504c1-s35*`): no. In three of the five the spilling tiles were the
fastest candidates (the pick first, its one-stage-fewer twin within 1.2%), ahead of every non-spilling one by 3.9-11%;
in the other two the tuner's duel kept a non-spilling 128x256 over the ping-pong pick (3.0% and 1.2%), whose
one-stage-fewer twin spills too and ran as fast as the pick. No ranking rule was made.
"""
import dataclasses
import json
import sys

sys.path.insert(0, "tests")
import fuzz  # noqa: E402

import deepgemm_jit  # noqa: E402
from deepgemm_jit import config as C  # noqa: E402
from deepgemm_jit import device, jit, sass, tuning, warmup  # noqa: E402

# (recipe, layout, M, N, K, epilogue): the heuristic picks of bench/results/*offline-tuning-candidate-spills-s34*
SPECS = [
    ("int8_row", "nt", 4096, 7168, 1024, "bias+swiglu+quant_int8_tensor"),
    ("int8_row", "nt", 4096, 7168, 3280, "bias+quant_fp8_tensor"),
    ("fp16", "tt", 4096, 4096, 1024, "bias_row+gelu_tanh+quant_fp8_tensor"),
    ("int8_tensor", "nt", 4096, 7168, 3280, "bias_row+relu+quant_int8_tensor"),
    ("fp16", "tt", 4096, 2896, 512, "bias_row+relu+quant_int8_tensor"),
]
SPECS_S38 = [
    ("fp16", "nt", 256, 2048, 7168, "beta+residual"),
    ("fp16", "nt", 256, 2048, 7168, "beta+gelu+residual"),
    ("bf16", "nt", 256, 2048, 7168, "beta+residual"),  # the same tiles without a stack: the control
    ("int8_row", "nt", 256, 2048, 7168, "beta+gelu+residual", "fp16"),  # 120 bytes at 128x128
]


def stack_bytes(spec, cfg) -> int:
    art = jit.get_kernel(spec, cfg, "sm_90a")
    use = sass.resource_usage(art.cubin).get(art.entry, {})
    return use.get("LOCAL", 0) + use.get("STACK", 0)


def main() -> None:
    identity = tuning.DeviceIdentity.current()
    arch, num_sms = device.current_arch(), device.num_sms()
    cases = [fuzz.FuzzCase(0, recipe, layout, m, n, k, out[0] if out else None, epilogue, None, True, 0, 0, -1, False)
             for recipe, layout, m, n, k, epilogue, *out in (SPECS_S38 if sys.argv[1:] == ["s38"] else SPECS)]
    work = [(C.kernel_spec(c.spec(), arch, c.m), cfg) for c in cases
            for cfg in C.candidate_configs(C.kernel_spec(c.spec(), arch, c.m), c.m, arch, num_sms)]
    summary = warmup.run(work, arch, jobs=14, progress=False)  # every candidate compiled in parallel first
    print(f"compiled {len(work)} candidates in {summary.seconds:.0f} s, {len(summary.failed)} failed", flush=True)
    for case in cases:
        m, n, k = case.m, case.n, case.k
        spec = C.kernel_spec(case.spec(), arch, m)
        cands = C.candidate_configs(spec, m, arch, num_sms)
        stacks = {cfg.tag: stack_bytes(spec, cfg) for cfg in cands}
        kw = case.build_kwargs()

        def make(cfg, kw=kw, m=m, n=n, k=k):
            return deepgemm_jit.build(m, n, k, config=cfg, **kw)

        result = tuning.tune(identity, spec, C.m_bucket_for(spec, m, arch), cands, make)  # (build's tuning key)
        print(f"## {case.describe()}", flush=True)
        best = min((r["median_us"] for r in result.table if r["median_us"]), default=None)
        for row in result.table:
            who = "HEURISTIC" if row["config"] == cands[0].tag else ""
            rel = f"{row['median_us'] / best:.3f}" if row["median_us"] else "-"
            print(f"  {row['config']:34s} stack {stacks[row['config']]:3d} B  median {row['median_us'] or 0:8.1f} us"
                  f"  x{rel}  duel {row.get('duel_median_us') or '-'}  {who} {row['why']}", flush=True)
        print("  tuned:", result.config.tag, json.dumps(dataclasses.asdict(result.config)), flush=True)


if __name__ == "__main__":
    main()
