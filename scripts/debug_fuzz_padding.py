"""Debug (GPU): which bytes of out's row padding failing fuzz seeds change, and through which path (family, tile,
staged roles). Session 32 found TMA stores writing element N of every row this way (docs/NOTES.md).

    python3 scripts/debug_fuzz_padding.py 278,284,238   # from the repo root, DEEPGEMM_JIT_FUZZ_CASES large enough
"""
import sys
import cupy
sys.path.insert(0, "tests")
import fuzz
import deepgemm_jit as dg
from bench import runner
from deepgemm_jit import reference

def probe(seed):
    case = fuzz.draw(seed)
    g = dg.build(case.m, case.n, case.k, **case.build_kwargs())
    spec = g.spec
    shape = spec.out_shape(case.m)
    pad = max(case.out_pad, 1)
    buf = reference.poisoned((shape[0], shape[1] + pad), spec.out_dtype)
    raw = buf.view(cupy.uint8)
    raw[...] = 0x5A
    out = buf[:, :shape[1]]
    rng = cupy.random.default_rng(seed)
    b_scale = 1.0
    a, b, _, kwargs = fuzz._operands(case, spec, case.m, rng, b_scale)
    epi_ops = runner.epilogue_operands(spec.epi, case.m, spec.n, spec.epilogue_operand_dtype, rng)
    ops = epi_ops.call_kwargs(spec.epi)
    if spec.epi.has_static_scale:
        kwargs["quant_scale"] = cupy.asarray([1.0], dtype=cupy.float32)
    g(a, b, out=out, **kwargs, **ops)
    cupy.cuda.get_current_stream().synchronize()
    tail = raw[:, shape[1] * buf.itemsize:]
    changed = cupy.argwhere(tail != 0x5A)
    staged = sorted(r for _, r in g._staging._buffers) if hasattr(g, "_staging") else "-"
    print(f"seed {seed}: {case.describe()}", flush=True)
    print(f"  family {g.family} config {getattr(g.config, 'tag', None)} staged {staged} out ptr%16 "
          f"{out.data.ptr % 16} pitch {buf.strides[0]} changed bytes {int(changed.shape[0])} of {tail.size}",
          flush=True)
    if changed.shape[0]:
        rows = cupy.unique(changed[:, 0])
        cols = cupy.unique(changed[:, 1])
        print(f"  rows {rows[:10].tolist()}... ({rows.size}) byte offsets in pad {cols.tolist()[:16]}", flush=True)


for s in [int(x) for x in sys.argv[1].split(",")]:
    try:
        probe(s)
    except Exception as e:
        print(f"seed {s}: {type(e).__name__}: {e}", flush=True)
