"""Random grouped (mixture-of-experts) calls, one per seed: tests/fuzz.py's idea for build_grouped.

A seed draws the recipe (bf16, fp16, FP8 block E4M3 or E4M3 x E5M2), how rows are grouped (offs, m_indices with
padding rows, or masked with counts past max_m), 1-12 groups of 0 to ~1100 rows (empty and 1-row groups often),
N and K (multiples of 16: grouped GEMMs read and store through TMA), a grouped epilogue (bias per group,
activations, swiglu / geglu, quant_fp8_g128), the tile hints (expected_m, num_groups), deterministic or not, and FP8
A scales row-major or M-major. `draw` keeps what build_grouped accepts and runs the tile rules on it; `run` (GPU)
checks every group against float64, the rows that belong to no group still poisoned, the inputs unchanged.

Reproduce: `pytest tests/test_fuzz_grouped_gpu.py -k seed_12` with DEEPGEMM_JIT_FUZZ_GROUPED_CASES covering it.
"""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from deepgemm_jit import config as config_mod
from deepgemm_jit import reference
from deepgemm_jit.epilogue import Epilogue
from deepgemm_jit.grouped import grouped_spec

import fuzz

# GPU cases by default (session 33: seeds 0..1499 passed on the H200); more with DEEPGEMM_JIT_FUZZ_GROUPED_CASES.
DEFAULT_CASES = 48
RECIPES = {"bf16": ("bf16", None), "fp16": ("fp16", None), "fp8_block": ("fp8", None),
           "fp8_block_e5m2": ("fp8", "fp8_e5m2")}
EPILOGUES = ("bias", "bias+relu", "bias+gelu", "silu", "bias+silu", "gelu_tanh", "sigmoid", "swiglu", "geglu",
             "bias+swiglu", "quant_fp8_g128", "bias+gelu+quant_fp8_g128", "swiglu+quant_fp8_g128")
GROUPINGS = ("offs", "m_indices", "masked")
MAX_FLOPS = 3e10


@dataclasses.dataclass(frozen=True)
class GroupedCase:
    seed: int
    recipe: str
    grouping: str                 # offs | m_indices | masked
    sizes: tuple[int, ...]        # rows per group (masked: the counts passed, possibly past max_m)
    max_m: int                    # masked: rows per group of a; else 0
    n: int
    k: int
    epilogue: str | None
    out_dtype: str | None
    expected_m: int
    num_groups_hint: int
    deterministic: bool
    scale_row_major: bool         # FP8: scale_a row-major instead of quantize's M-major

    @property
    def epi(self) -> Epilogue:
        return Epilogue.parse(self.epilogue or "")

    def build_kwargs(self) -> dict:
        dtype, b_dtype = RECIPES[self.recipe]
        kw = {"dtype": dtype, "expected_m": self.expected_m, "num_groups": self.num_groups_hint,
              "deterministic": self.deterministic}
        for name, value in (("b_dtype", b_dtype), ("epilogue", self.epilogue), ("out_dtype", self.out_dtype)):
            if value is not None:
                kw[name] = value
        return kw

    def spec(self):
        kw = self.build_kwargs()
        return grouped_spec(self.n, self.k, kw["dtype"], kw.get("out_dtype"), epilogue=self.epilogue,
                            b_dtype=kw.get("b_dtype"))

    def describe(self) -> str:
        kw = ", ".join(f"{k}={v!r}" for k, v in self.build_kwargs().items())
        return (f"seed {self.seed}: {self.recipe} build_grouped({self.n}, {self.k}, {kw}); {self.grouping} "
                f"sizes={list(self.sizes)} max_m={self.max_m} scale_row_major={self.scale_row_major}")


def seeds() -> list[int]:
    count = int(os.environ.get("DEEPGEMM_JIT_FUZZ_GROUPED_CASES", DEFAULT_CASES))
    first = int(os.environ.get("DEEPGEMM_JIT_FUZZ_GROUPED_FIRST", 0))
    return list(range(first, first + count))


def _candidate(seed: int, attempt: int) -> GroupedCase:
    rng = np.random.default_rng([seed, attempt, 7])
    recipe = str(rng.choice(list(RECIPES), p=[0.35, 0.15, 0.35, 0.15]))
    grouping = str(rng.choice(GROUPINGS))
    groups = int(rng.integers(1, 13))
    sizes = []
    for _ in range(groups):
        u = rng.random()
        sizes.append(0 if u < 0.15 else 1 if u < 0.25 else int(rng.integers(2, 1101)))
    n, k = 16 * int(rng.integers(1, 261)), 16 * int(rng.integers(1, 381))
    max_m = 0
    if grouping == "masked":
        max_m = max(1, int(rng.integers(1, 1025)))
        sizes = [s if rng.random() < 0.9 else max_m + int(rng.integers(1, 100)) for s in sizes]  # counts past max_m
    if grouping != "masked" and sum(sizes) == 0:
        sizes[0] = 1
    while 2.0 * sum(min(s, max_m) if max_m else s for s in sizes) * n * k > MAX_FLOPS:
        sizes = [s // 2 for s in sizes]
        max_m = max(1, max_m // 2) if max_m else 0
    epilogue = None if rng.random() < 0.45 else str(rng.choice(EPILOGUES))
    out_dtype = None if rng.random() < 0.8 else str(rng.choice(["bf16", "fp16", "fp32"]))
    return GroupedCase(seed=seed, recipe=recipe, grouping=grouping, sizes=tuple(sizes), max_m=max_m, n=n, k=k,
                       epilogue=epilogue, out_dtype=out_dtype, expected_m=int(rng.integers(1, 2049)),
                       num_groups_hint=int(rng.integers(1, 17)), deterministic=bool(rng.random() < 0.6),
                       scale_row_major=bool(rng.random() < 0.5))


def accepted(case: GroupedCase) -> bool:
    """build_grouped takes it (its spec validates); the tile rules then must find a legal tile (raising here)."""
    try:
        spec = case.spec()
    except ValueError:
        return False
    cfg = config_mod.choose_config(spec, case.expected_m, fuzz.ARCH, groups=case.num_groups_hint)
    cfg.check_for(spec, fuzz.ARCH)
    return True


def draw(seed: int) -> GroupedCase:
    """The case of `seed` (deterministic)."""
    return fuzz.first_accepted(seed, _candidate, accepted)


# -------------------------------------------------------------------------------------------------------- run
def _row_spans(case: GroupedCase, rng) -> tuple[list[tuple[int, int]], np.ndarray | None, int]:
    """(each group's (start, end) rows in a / out, the m_indices array or None, total rows). masked: group g's
    rows are g * max_m + [0, min(count, max_m))."""
    if case.grouping == "masked":
        return ([(g * case.max_m, g * case.max_m + min(s, case.max_m)) for g, s in enumerate(case.sizes)], None,
                len(case.sizes) * case.max_m)
    if case.grouping == "offs":
        ends = np.cumsum(case.sizes)
        return [(int(e - s), int(e)) for s, e in zip(case.sizes, ends)], None, int(ends[-1])
    ids, spans = [], [(0, 0)] * len(case.sizes)
    for g in rng.permutation(len(case.sizes)):  # groups in any order, padding rows (-1) between runs
        ids += [-1] * int(rng.integers(0, 5) if rng.random() < 0.5 else 0)
        spans[g] = (len(ids), len(ids) + case.sizes[g])
        ids += [int(g)] * case.sizes[g]
    return spans, np.asarray(ids, dtype=np.int32), len(ids)


def run(case: GroupedCase) -> None:
    import cupy

    import deepgemm_jit as dg

    g = dg.build_grouped(case.n, case.k, **case.build_kwargs())
    spec, epi = g.spec, case.epi
    rng = cupy.random.default_rng(case.seed)
    nrng = np.random.default_rng(case.seed)
    spans, ids, rows = _row_spans(case, nrng)
    groups = len(case.sizes)
    b_scale = 1.0 / math.sqrt(case.k) if case.epilogue else 1.0
    x = rng.standard_normal((max(rows, 1), case.k), dtype=cupy.float32)[:rows]
    w = rng.standard_normal((groups, case.n, case.k), dtype=cupy.float32) * cupy.float32(b_scale)
    kwargs: dict = {}
    if spec.dtype.startswith("fp8"):
        qa, sa = reference.quantize_reference(x, "fp8_e4m3", "group128")
        qbs, sbs = zip(*(reference.quantize_reference(w[i], spec.b_type, "block128") for i in range(groups)))
        a64 = reference.dequantize_reference(qa, sa, "fp8_e4m3", "group128")
        b64 = cupy.stack([reference.dequantize_reference(qbs[i], sbs[i], spec.b_type, "block128")
                          for i in range(groups)])
        a, b = qa, cupy.stack(qbs)
        sa = cupy.ascontiguousarray(sa) if case.scale_row_major else sa
        if case.grouping == "masked":
            sa = sa.reshape(groups, case.max_m, -1)
        kwargs.update(scale_a=sa, scale_b=cupy.stack(sbs))
    else:
        a, b = reference._to_storage(x, spec.dtype), reference._to_storage(w, spec.dtype)
        a64, b64 = reference.to_float64(a), reference.to_float64(b)
    if case.grouping == "masked":
        a = a.reshape(groups, case.max_m, case.k)
        kwargs["masked_m"] = cupy.asarray(case.sizes, dtype=cupy.int32)
    elif case.grouping == "offs":
        kwargs["offs"] = cupy.asarray(np.cumsum(case.sizes), dtype=cupy.int32)
    else:
        kwargs["m_indices"] = cupy.asarray(ids)
    bias = None
    if epi.bias != "none":
        bias = reference.random_matrix((groups, case.n), spec.epilogue_operand_dtype, rng)
        kwargs["bias"] = bias
    shape = (groups, case.max_m, spec.n_out) if case.grouping == "masked" else (rows, spec.n_out)
    out = reference.poisoned(shape, spec.out_dtype)
    watched = [fuzz.snapshot(v) for v in (a, b, *kwargs.values()) if isinstance(v, cupy.ndarray)]
    result = g(a, b, out=out, **kwargs)
    fuzz.wait_for_call(case.describe())
    d2 = out.reshape(-1, spec.n_out)
    scales = result[1].reshape(-1, result[1].shape[-1]) if epi.has_group_scales else None
    bound = reference.ERROR_BOUND[spec.dtype]
    owned = np.zeros(d2.shape[0], dtype=bool)
    for i, (s, e) in enumerate(spans):
        owned[s:e] = True
        if e == s:
            continue
        value = reference.unfused_epilogue(a64.reshape(-1, case.k)[s:e] @ b64[i].T, epi,
                                           None if bias is None else bias[i])
        what = f"group {i} rows [{s}, {e})"
        if epi.has_group_scales:
            got = reference.dequantize_reference(d2[s:e], scales[s:e], "fp8_e4m3", "group128")
            fuzz.check_close(case, got, value, bound + fuzz.FP8_REL, fuzz.FP8_REL, what)
        else:
            rms_round, elem_round = fuzz.OUT_ROUNDING.get(spec.out_dtype, (0.0, 2.0 ** -23))
            fuzz.check_close(case, d2[s:e], value, bound + rms_round, elem_round, what)
    free = cupy.asarray(np.nonzero(~owned)[0])
    if free.size:
        assert bool((fuzz.as_bytes(d2[free]) == reference.POISON_BYTE).all()), \
            f"rows of no group were written -- {case.describe()}"
    for base, before in watched:
        assert bool((fuzz.as_bytes(base) == fuzz.as_bytes(before)).all()), \
            f"an input buffer changed -- {case.describe()}"
