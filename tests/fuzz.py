"""Random GEMM problems across the public API, one per seed (tests/test_fuzz_cpu.py, tests/test_fuzz_gpu.py).

The grid tests pin each feature on a few shapes; a user combines them. A seed draws one whole call: the input recipe
(every dtype and scaling, E4M3 x E5M2, scaled INT8), layout, awkward M / N / K (1-row decode to a few thousand,
aligned or not), output dtype, a composed fused epilogue (bias per column or row, an activation or a gated unit,
residual, alpha/beta, quantize-on-store), forced split-K (deterministic or not), operands and output as row-padded
views of wider buffers, base pointers off 16-byte alignment, block scales row-major or M-major, for a third of the
seeds later calls of the same Gemm at other M followed by the first call again, for some the first call captured in
a CUDA graph and replayed, for some every call made with torch tensors (on the same memory) instead of CuPy, for
some every call given stream= a side stream on which A's values land late, for some build(config=) one of the
tuner's other candidates (config.candidate_configs) instead of the heuristic's pick, and for some the calls made
through the torch custom ops (deepgemm_jit.torch.gemm / gemm_fp8) instead of the Gemm.
`draw` keeps only calls the library accepts at build time (GemmSpec / Fp32Spec validation, the heuristic's family
for split-K), so that every GPU case must run and be right; `run` checks one on the GPU: float64 reference, poisoned
output, the dtype's DESIGN.md bound on the whole output and a looser one on every element, and padding the call does
not own left as it was.

Reproduce a failure by its seed: `pytest tests/test_fuzz_gpu.py -k "seed_123"`, or
`python -c "import fuzz; print(fuzz.draw(123).describe())"` from tests/. More seeds: DEEPGEMM_JIT_FUZZ_CASES (count)
and DEEPGEMM_JIT_FUZZ_FIRST (first seed).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
import sys
import time

import numpy as np

from deepgemm_jit import api, sm90_rules, sm90_tiles
from deepgemm_jit import config as config_mod
from deepgemm_jit import dtypes
from deepgemm_jit import reference, trial
from deepgemm_jit.arrays import numpy_dtype_of_torch
from deepgemm_jit.epilogue import ACTIVATIONS, GATES, QUANTS, Epilogue
from deepgemm_jit.fp32x3 import Fp32Spec
from deepgemm_jit.spec import LAYOUTS, GemmSpec

DEFAULT_CASES = 96
ARCH = "sm_90a"
MAX_FLOPS = 2e10  # keeps the float64 reference (cuBLAS DGEMM) well under a second per case


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How a case's operands are made and what build() is told."""

    dtype: str                         # build(dtype=...)
    scaling: str | None = None         # build(scaling=...)
    b_dtype: str | None = None         # build(b_dtype=...): E4M3 x E5M2
    quant: tuple[str, str] | None = None  # quantize_reference granularities of A and B (8-bit inputs)
    layouts: tuple[str, ...] = LAYOUTS
    weight: float = 1.0                # relative frequency in the draw

    @property
    def a_type(self) -> str:
        return "fp8_e4m3" if self.dtype.startswith("fp8") else self.dtype

    @property
    def b_type(self) -> str:
        return self.b_dtype or self.a_type

    @property
    def exact(self) -> bool:
        """INT8 x INT8 -> INT32: every element equals the reference."""
        return self.dtype == "int8" and self.scaling is None


_NT = ("nt",)
RECIPES: dict[str, Recipe] = {
    "bf16": Recipe("bf16", weight=3.0),
    "fp16": Recipe("fp16", weight=1.5),
    "tf32": Recipe("tf32", weight=2.0),
    "fp32": Recipe("fp32", weight=1.0),
    "fp8_tensor": Recipe("fp8_e4m3", "tensor", quant=("tensor", "tensor"), layouts=_NT, weight=1.0),
    "fp8_row": Recipe("fp8_e4m3", "row", quant=("row", "row"), layouts=_NT, weight=1.0),
    "fp8_block": Recipe("fp8_e4m3", "block", quant=("group128", "block128"), layouts=_NT, weight=2.0),
    "fp8_block_e5m2": Recipe("fp8_e4m3", "block", "fp8_e5m2", ("group128", "block128"), _NT, weight=0.5),
    "fp8_row_e5m2": Recipe("fp8_e4m3", "row", "fp8_e5m2", ("row", "row"), _NT, weight=0.5),
    "int8": Recipe("int8", quant=("row", "row"), layouts=_NT, weight=1.0),
    "int8_row": Recipe("int8", "row", quant=("row", "row"), layouts=_NT, weight=0.5),
    "int8_tensor": Recipe("int8", "tensor", quant=("tensor", "tensor"), layouts=_NT, weight=0.5),
}


@dataclasses.dataclass(frozen=True)
class FuzzCase:
    seed: int
    recipe: str
    layout: str
    m: int
    n: int
    k: int
    out_dtype: str | None       # None: build's default
    epilogue: str | None        # None: no fused epilogue
    split_k: int | None         # forced shares (None: build decides)
    deterministic: bool
    a_pad: int                  # a is a view of rows this many elements longer (0: contiguous)
    b_pad: int
    out_pad: int                # -1: no out=, the call allocates; else out is a view as a
    block_scales_row_major: bool  # block scaling: scale_a row-major (as a user has it) instead of M-major
    later_ms: tuple[int, ...] = ()  # the Gemm is then called at these M, and at case.m again (run)
    lead: int = 0               # a, b, out= and bias / C / residual start this many elements into their buffers
    graph: bool = False         # the first call is then captured in a CUDA graph (after a warm-up call) and replayed
    torch_io: bool = False      # the calls take torch tensors (zero-copy views of the CuPy arrays) and return torch
    side_stream: bool = False   # the calls (CuPy) get stream= a busy side stream, where A's values land late
    candidate: int = 0          # > 0: build(config=) the tuner's candidate of this rank (capped at the last one)
    torch_op: bool = False      # the calls go through deepgemm_jit.torch.gemm / gemm_fp8 (torch tensors) instead

    @property
    def info(self) -> Recipe:
        return RECIPES[self.recipe]

    @property
    def epi(self) -> Epilogue:
        return Epilogue.parse(self.epilogue or "")

    def build_kwargs(self) -> dict:
        kw = self._spec_kwargs()
        cfg = self.forced_config()
        if cfg is not None:
            kw["config"] = cfg
        return kw

    def _spec_kwargs(self) -> dict:
        r = self.info
        kw: dict = {"dtype": r.dtype, "layout": self.layout}
        if self.out_dtype is not None:
            kw["out_dtype"] = self.out_dtype
        if self.epilogue is not None:
            kw["epilogue"] = self.epilogue
        if r.dtype != "fp32":
            if r.scaling is not None:
                kw["scaling"] = r.scaling
            if r.b_dtype is not None:
                kw["b_dtype"] = r.b_dtype
            if self.split_k is not None:
                kw["split_k"] = self.split_k
                kw["deterministic"] = self.deterministic
        return kw

    def forced_config(self) -> config_mod.KernelConfig | None:
        """The config build(config=) gets: the tuner's candidate of rank `candidate` for this call (what tune=True
        times and a user may pick), None for the heuristic's."""
        if not self.candidate:
            return None
        kspec = sm90_rules.kernel_spec(self.spec(), ARCH, self.m)
        found = config_mod.candidate_configs(kspec, self.m, ARCH, sm90_tiles.DEFAULT_SM90_NUM_SMS)
        return found[min(self.candidate, len(found) - 1)]

    def spec(self) -> GemmSpec | Fp32Spec:
        """The spec build() makes of this call (raises ValueError where build would)."""
        kw = self._spec_kwargs()
        if self.info.dtype == "fp32":
            return Fp32Spec.create(self.n, self.k, out_dtype=kw.get("out_dtype"), layout=self.layout,
                                   epilogue=self.epilogue)
        return GemmSpec.create(self.n, self.k, dtype=kw["dtype"], out_dtype=kw.get("out_dtype"), layout=self.layout,
                               b_dtype=kw.get("b_dtype"), scaling=kw.get("scaling"), epilogue=self.epilogue)

    def describe(self) -> str:
        kw = ", ".join(f"{k}={v.tag if k == 'config' else v!r}" for k, v in self.build_kwargs().items())
        return (f"seed {self.seed}: {self.recipe} M={self.m} build({self.m}, {self.n}, {self.k}, {kw}); "
                f"a_pad={self.a_pad} b_pad={self.b_pad} out_pad={self.out_pad} "
                f"block_scales_row_major={self.block_scales_row_major}"
                + (f" later_ms={list(self.later_ms)}" if self.later_ms else "")
                + (f" lead={self.lead}" if self.lead else "") + (" graph" if self.graph else "")
                + (" torch_io" if self.torch_io else "") + (" torch_op" if self.torch_op else "")
                + (" side_stream" if self.side_stream else ""))


# Calls the fuzz found wrong, pinned (tests/test_fuzz_gpu.py runs them, the CPU tests compile them): a seed's draw
# changes whenever the draw does.
FOUND = {
    # 64-row FP8 tiles split K between two consumer warpgroups; a one-K-block tile whose block was the other lane's
    # never loaded C (or the residual), and its epilogue waited for it forever (every CTA's second tile).
    "fp8_tensor_k_lanes_beta_one_k_block": FuzzCase(2844, "fp8_tensor", "nt", 3, 2240, 112, None, "sigmoid+beta",
                                                    None, False, 64, 0, 8, True, (71, 128)),
    "fp8_row_k_lanes_residual_one_k_block": FuzzCase(2844, "fp8_row", "nt", 40, 2240, 100, None, "residual",
                                                     None, False, 0, 0, -1, False, (200,)),
    # No tile of the kernel that transposes B in shared memory serves a gated unit with quant_fp8_g128.
    "tf32_tn_geglu_quant_g128": FuzzCase(11424, "tf32", "tn", 2, 2896, 3280, None, "bias+geglu+quant_fp8_g128",
                                         None, True, 0, 0, 0, False, (547, 7)),
}


def seeds() -> list[int]:
    """The seeds the GPU test runs: DEEPGEMM_JIT_FUZZ_CASES of them from DEEPGEMM_JIT_FUZZ_FIRST."""
    count = int(os.environ.get("DEEPGEMM_JIT_FUZZ_CASES", DEFAULT_CASES))
    first = int(os.environ.get("DEEPGEMM_JIT_FUZZ_FIRST", 0))
    return list(range(first, first + count))


def epilogue_compositions() -> list[str | None]:
    """Every composed epilogue string: a bias (per column, per row, none) x an activation, a gated unit or none x a
    quantize-on-store, residual, beta, both or none (the spec refuses some combinations; walks skip those)."""
    units = [a for a in ACTIVATIONS if a != "none"] + [g for g in GATES if g != "none"] + [None]
    tails = [f"quant_{q}" for q in QUANTS if q != "none"] + ["residual", "beta", "residual+beta", None]
    return ["+".join(w for w in words if w) or None
            for words in itertools.product(("bias", "bias_row", None), units, tails)]


# A grid the draw reaches rarely (seed 2844's hang needed all of it): K of one K block or just past one for every
# type's block_k (16-bit 64, TF32 32, 8-bit 128), a Gemm built at decode M and then called with more tiles than CTAs,
# with C and a residual, a bias and an activation, or nothing.
EDGE_KS = (16, 100, 129, 264)
EDGE_EPILOGUES = (None, "residual+beta", "bias+silu")


def edge_cases() -> list[FuzzCase]:
    """Every recipe and layout x EDGE_KS x EDGE_EPILOGUES that build() accepts: built at M = 3 (the decode kernel
    serves that call), then called at 71 and 300 rows (140 / 350 64x32 tiles) and at 3 again, out= given."""
    cases = []
    for recipe, info in RECIPES.items():
        for layout in info.layouts:
            for k in EDGE_KS:
                for epilogue in EDGE_EPILOGUES:
                    case = FuzzCase(len(cases), recipe, layout, 3, 2240, k, None, epilogue, None, True, 0, 0, 0,
                                    False, (71, 300))
                    if accepted(case):
                        cases.append(case)
    return cases


def edge_count() -> int:
    """How many edge_cases the GPU test runs: all of them (280 in ~15 s on the H200), none with
    DEEPGEMM_JIT_FUZZ_EDGES=0."""
    return 0 if os.environ.get("DEEPGEMM_JIT_FUZZ_EDGES") == "0" else len(edge_cases())


# ------------------------------------------------------------------------------------------------------- draw
def _dim(rng, small: int, large: int, p_small: float) -> int:
    return int(rng.integers(1, small + 1) if rng.random() < p_small else rng.integers(small + 1, large + 1))


def _draw_m(rng) -> int:
    u = rng.random()
    if u < 0.25:
        return int(rng.integers(1, 9))       # decode: the weight-streaming kernels
    if u < 0.6:
        return int(rng.integers(9, 161))     # small M: split-K, 64-row tiles
    return int(rng.integers(161, 2101))


def _capped_m(m: int, n: int, k: int) -> int:
    """m halved until the call's flops are within MAX_FLOPS."""
    while 2.0 * m * n * k > MAX_FLOPS:
        m = max(1, m // 2)
    return m


def _draw_later_ms(seed: int, attempt: int, n: int, k: int) -> tuple[int, ...]:
    """M of later calls on the same Gemm (a third of the cases), from a stream of their own: the rest of a seed's
    draw is what it was before they existed."""
    rng = np.random.default_rng([seed, attempt, 5])
    if rng.random() >= 0.35:
        return ()
    return tuple(_capped_m(_draw_m(rng), n, k) for _ in range(int(rng.integers(1, 3))))


def _draw_lead(seed: int, attempt: int) -> int:
    """Elements before each operand's first in its buffer (a quarter of the cases), from a stream of their own like
    later_ms: 1-5 put the base off 16-byte alignment for every element size, 8 keeps it for 2- and 4-byte types."""
    rng = np.random.default_rng([seed, attempt, 6])
    return int(rng.choice([1, 2, 3, 5, 8])) if rng.random() < 0.25 else 0


def _draw_graph(seed: int, attempt: int, out_pad: int) -> bool:
    """Whether the case replays its first call from a CUDA graph: a fifth of those with out= (a call that allocates
    its output cannot be captured), from a stream of their own."""
    return out_pad >= 0 and bool(np.random.default_rng([seed, attempt, 7]).random() < 0.2)


def _draw_torch_io(seed: int, attempt: int) -> bool:
    """Whether the case's calls take torch tensors (a sixth of the cases), from a stream of their own."""
    return bool(np.random.default_rng([seed, attempt, 9]).random() < 1 / 6)


def _draw_side_stream(seed: int, attempt: int, torch_io: bool) -> bool:
    """Whether the case's (CuPy) calls run on a side stream given as stream= (a sixth of the others), from a stream
    of their own."""
    return not torch_io and bool(np.random.default_rng([seed, attempt, 10]).random() < 1 / 6)


def _draw_candidate(seed: int, attempt: int, recipe: str, split_k: int | None) -> int:
    """The rank of the tuner's candidate the case forces with config= (a fifth of the 16-bit / 8-bit cases without
    a forced split_k; 0: the heuristic's pick), from a stream of its own."""
    rng = np.random.default_rng([seed, attempt, 11])
    if recipe == "fp32" or split_k is not None or rng.random() >= 0.2:
        return 0
    return int(rng.integers(1, 8))


def _draw_torch_op(seed: int, attempt: int, recipe: str, epilogue: str | None, split_k: int | None, candidate: int,
                   out_pad: int, side_stream: bool) -> bool:
    """Whether the case's calls go through the torch custom ops (deepgemm_jit.torch.gemm, .gemm_fp8) rather than
    its Gemm: 40% of those the ops serve (16-bit / TF32 or scaled FP8, no epilogue, split_k or config, a new output,
    torch's current stream), from a stream of their own."""
    info = RECIPES[recipe]
    served = info.dtype in ("bf16", "fp16", "tf32") or (info.dtype.startswith("fp8") and info.scaling is not None)
    if not served or epilogue is not None or split_k is not None or candidate or out_pad >= 0 or side_stream:
        return False
    return bool(np.random.default_rng([seed, attempt, 12]).random() < 0.4)


def _draw_epilogue(rng, n: int) -> str | None:
    if rng.random() < 0.4:
        return None
    words = []
    u = rng.random()
    if u < 0.35:
        words.append("bias")
    elif u < 0.5:
        words.append("bias_row")
    gated = n % 2 == 0 and rng.random() < 0.15
    if gated:
        words.append(str(rng.choice(["swiglu", "geglu"])))
    elif rng.random() < 0.6:
        words.append(str(rng.choice(["relu", "gelu", "gelu_tanh", "silu", "sigmoid"])))
    u = rng.random()
    if u < 0.15:
        words.append(str(rng.choice(["quant_fp8_g128", "quant_fp8_tensor", "quant_int8_tensor"])))
    else:
        if rng.random() < 0.25:
            words.append("residual")
        if not gated and rng.random() < 0.2:
            words.append("beta")
    return "+".join(words) if words else None


def _candidate(seed: int, attempt: int) -> FuzzCase:
    rng = np.random.default_rng([seed, attempt])
    names = list(RECIPES)
    weights = np.array([RECIPES[n].weight for n in names])
    recipe = str(rng.choice(names, p=weights / weights.sum()))
    info = RECIPES[recipe]
    layout = str(rng.choice(info.layouts))
    m = _draw_m(rng)
    n = _dim(rng, 300, 4500, 0.3)
    k = _dim(rng, 300, 6000, 0.3)
    if rng.random() < 0.6:  # most real problems have 16-element multiples: the TMA paths
        n, k = max(16, n // 16 * 16), max(16, k // 16 * 16)
    m = _capped_m(m, n, k)
    epilogue = _draw_epilogue(rng, n)
    out_dtype = None
    if rng.random() < 0.3:
        out_dtype = str(rng.choice(["bf16", "fp16", "fp32"]))
    split_k = None
    if rng.random() < 0.2:
        split_k = int(rng.integers(2, 9))
    pad = lambda: int(rng.choice([0, 0, 0, 1, 8, 64]))  # noqa: E731
    torch_io = _draw_torch_io(seed, attempt)
    deterministic, a_pad, b_pad = bool(rng.random() < 0.6), pad(), pad()
    out_pad = -1 if rng.random() < 0.3 else pad()
    candidate = _draw_candidate(seed, attempt, recipe, split_k)
    side_stream = _draw_side_stream(seed, attempt, torch_io)
    return FuzzCase(seed=seed, recipe=recipe, layout=layout, m=m, n=n, k=k, out_dtype=out_dtype, epilogue=epilogue,
                    split_k=split_k, deterministic=deterministic, a_pad=a_pad, b_pad=b_pad, out_pad=out_pad,
                    block_scales_row_major=bool(rng.random() < 0.4), later_ms=_draw_later_ms(seed, attempt, n, k),
                    lead=_draw_lead(seed, attempt), graph=_draw_graph(seed, attempt, out_pad),
                    torch_io=torch_io, side_stream=side_stream, candidate=candidate,
                    torch_op=_draw_torch_op(seed, attempt, recipe, epilogue, split_k, candidate, out_pad, side_stream))


def accepted(case: FuzzCase) -> bool:
    """Whether build() takes the call: its spec validates and forced split-K has a tile (build refuses the others
    with a ValueError naming split_k). The heuristic runs for every case: a rule that finds no tile raises here,
    on the CPU (it once raised IndexError inside build)."""
    try:
        spec = case.spec()
    except ValueError:
        return False
    inner = spec.inner_at(case.m, ARCH) if isinstance(spec, Fp32Spec) else spec
    kspec = sm90_rules.kernel_spec(inner, ARCH, case.m)
    cfg = config_mod.choose_config(kspec, case.m, ARCH)
    cfg.check_for(kspec, ARCH)
    forced = case.forced_config()
    if forced is not None:  # build checks a forced config as it compiles it: a portable one for the caller's layout
        forced.check_for(kspec if forced.family == "sm90" else spec, ARCH)
    if case.split_k is not None:
        k_blocks = math.ceil(spec.k * dtypes.get(spec.dtype).storage_bytes / 128)
        if isinstance(spec, Fp32Spec) or cfg.family != "sm90" or case.split_k > k_blocks:
            return False
        try:
            api._with_split_k(cfg, kspec, ARCH, case.split_k, case.m, True, False)
        except ValueError:
            return False
    return True


def first_accepted(seed: int, candidate, takes):
    """The first of the seeded candidates candidate(seed, 0), candidate(seed, 1), ... that takes()."""
    for attempt in range(200):
        case = candidate(seed, attempt)
        if takes(case):
            return case
    raise RuntimeError(f"seed {seed}: no accepted candidate in 200 draws")


def draw(seed: int) -> FuzzCase:
    """The case of `seed` (deterministic)."""
    return first_accepted(seed, _candidate, accepted)


# -------------------------------------------------------------------------------------------------------- run
# What rounding D adds to a whole output's and to one element's relative error (trial.out_rounding), and what
# quantize-on-store to E4M3 adds (half an ulp: 2^-4): the tuner's trial calls judge with the same.
FP8_REL = trial.FP8_STORE_REL
ELEMENT_FACTOR = 10.0  # an element may miss by this many times the dtype's relative bound times the output's rms
INT8_POISON = -128  # 0xFF (the NaN poison) is -1 in INT8, a value the quantizer writes


def _padded(values, pad: int, rng, lead: int = 0):
    """`values` (1-D or 2-D CuPy) as columns lead .. lead + cols of a buffer lead + pad elements wider, the rest of
    it random bits."""
    import cupy

    if pad == 0 and lead == 0:
        return values
    cols = values.shape[-1]
    buf = cupy.empty((*values.shape[:-1], lead + cols + pad), dtype=values.dtype)
    raw = buf.view(cupy.uint8)
    raw[...] = rng.integers(0, 256, raw.shape, dtype=cupy.uint8)
    view = buf[..., lead:lead + cols]
    view[...] = values
    return view


def _operands(case: FuzzCase, spec, m: int, rng, b_scale: float):
    """(a, b, float64 product, scale kwargs) of a call at M = m for the case's recipe and layout."""
    import cupy

    info = case.info
    if info.quant is None:
        storage = "fp32" if info.dtype in ("fp32", "tf32") else info.dtype
        a = reference.random_matrix(spec.a_shape(m), storage, rng)
        b = reference.random_matrix(spec.b_shape(), storage, rng, scale=b_scale)
        product = reference.reference(spec, a, b)
        return _padded(a, case.a_pad, rng, case.lead), _padded(b, case.b_pad, rng, case.lead), product, {}
    ga, gb = info.quant
    x_a = rng.standard_normal(spec.a_shape(m), dtype=cupy.float32)
    x_b = rng.standard_normal(spec.b_shape(), dtype=cupy.float32) * cupy.float32(b_scale)
    qa, sa = reference.quantize_reference(x_a, info.a_type, ga)
    qb, sb = reference.quantize_reference(x_b, info.b_type, gb)
    if info.scaling is None:  # INT8 -> INT32: the integers' product, exactly
        product = reference.reference(spec, qa, qb)
        kwargs = {}
    else:
        product = reference.reference(spec, reference.dequantize_reference(qa, sa, info.a_type, ga),
                                      reference.dequantize_reference(qb, sb, info.b_type, gb))
        if ga == "group128" and case.block_scales_row_major:
            sa = cupy.ascontiguousarray(sa)
        kwargs = {"scale_a": sa, "scale_b": sb}
    return _padded(qa, case.a_pad, rng, case.lead), _padded(qb, case.b_pad, rng, case.lead), product, kwargs


def _rms(x) -> float:
    import cupy

    return float(cupy.sqrt(cupy.mean(x * x))) if x.size else 0.0


def check_close(case: FuzzCase, got, ref, bound: float, eps_elem: float, what: str) -> None:
    """rel_fro(got, ref) <= bound; every element within ELEMENT_FACTOR * bound * rms(ref) + eps_elem * |ref|."""
    import cupy

    g = reference.to_float64(got)
    assert not bool(cupy.isnan(g).any()), f"{what}: NaN in the output (unwritten?) -- {case.describe()}"
    err = reference.error(got, ref)
    assert err <= bound, f"{what}: rel error {err:.3e} > {bound:.3e} -- {case.describe()}"
    excess = cupy.abs(g - ref) - (ELEMENT_FACTOR * bound * _rms(ref) + eps_elem * cupy.abs(ref))
    worst = int(cupy.argmax(excess)) if excess.size else 0
    if excess.size and float(excess.ravel()[worst]) > 0:
        i, j = divmod(worst, ref.shape[1])
        raise AssertionError(f"{what}: element ({i}, {j}) = {float(g[i, j])!r}, reference {float(ref[i, j])!r} "
                             f"(rel_fro {err:.2e}) -- {case.describe()}")


def check_group_scales(case, scales, value, bound: float, what: str) -> None:
    """Each group's scale (amax / 448 of its 128 values) within `bound` of the float64 value's, relative to itself:
    a group's amax is its best-conditioned element (as for amax_out). The dequantized check alone cannot see a
    wrong scale when q was divided by that same scale (a 1 x 256 or whole-row amax, scales x 1.25: review)."""
    import cupy

    _, ref_scales = reference.quantize_reference(value.astype(cupy.float32), "fp8_e4m3", "group128")
    s, s_ref = scales.astype(cupy.float64), ref_scales.astype(cupy.float64)
    # The amax element may miss by what check_close lets any element miss (bound x the output's rms), which is no
    # small part of a tiny amax: a last group of one or two columns, whose values may all be near zero.
    tol = bound * s_ref + bound * _rms(value) / dtypes.QUANT_MAX["fp8_e4m3"]
    over = cupy.abs(s - s_ref) - tol
    if over.size and float(over.max()) > 0:
        worst = float((cupy.abs(s - s_ref) / s_ref).max())
        raise AssertionError(what.format(f"group scales off by {worst:.2e} (relative) -- {case.describe()}"))


def as_bytes(x):
    """A contiguous array's bytes, (rows, row bytes) for 2-D (NaN-free comparisons)."""
    import cupy

    return x.view(cupy.uint8)


def snapshot(x):
    """A copy of the whole buffer behind view `x` (its padding included)."""
    base = x if x.base is None else x.base
    return base, base.copy()


def run(case: FuzzCase) -> None:
    """Build `case`'s Gemm and call it on the GPU; assert every call is right. With later_ms, the Gemm is then called
    at those M (fresh operands) and the first call is made again on its own buffers (a kept launch plan replayed
    after calls that may have grown the Gemm's staging buffers and split-K workspace). With graph, the first call is
    last captured in a CUDA graph and replayed."""
    import cupy

    import deepgemm_jit as dg

    g = dg.build(case.m, case.n, case.k, **case.build_kwargs())
    if case.candidate:
        assert g.config == case.forced_config(), (g.config.tag, case.describe())
    rng = cupy.random.default_rng(case.seed)
    first = _prepare(case, g.spec, case.m, rng)
    _call_and_check(case, g, first, f"call at M = {case.m}")
    for m in case.later_ms:
        _call_and_check(case, g, _prepare(case, g.spec, m, rng), f"later call at M = {m}")
    if case.later_ms:
        _fill_out(first, g.spec)
        if "amax_out" in first.kwargs:
            first.kwargs["amax_out"].fill(0)
        _negate_a(case, first)  # new values in the same buffers: the kept plan must read them
        _call_and_check(case, g, first, f"the call at M = {case.m} again")
    if case.graph:
        _replay_and_check(case, g, first, f"the call at M = {case.m} replayed from a CUDA graph")


@dataclasses.dataclass
class _Call:
    """One call of a case's Gemm: its arguments, the float64 value it must produce, and what it must leave as it
    found it (snapshots of the inputs' whole buffers, out's row padding)."""

    m: int
    a: object
    b: object
    kwargs: dict                # scales, quant_scale, amax_out
    ops: dict                   # the epilogue's operands (c may be out itself)
    value: object               # float64, what D must hold before any quantize-on-store
    out: object | None          # None: the call allocates
    c_init: object | None       # C's values where C is out itself (written into out before each call)
    watched: list
    pad_before: object | None   # out's whole buffer as bytes, compared outside out's columns
    kept: object = None         # the last result, alive until the call is made again (see _call_and_check)
    product: object = None      # float64 product of the operands, before the epilogue (_negate_a)
    epi_ops: object = None      # the epilogue's operands as runner.apply_epilogue takes them (_negate_a)


def _negate_a(case: FuzzCase, call: _Call) -> None:
    """New values in the call's own A buffer, for a replay (a kept plan, a captured graph) that must read A anew: A
    negated in place (exact in every input type: the sign bit of float / FP8 codes, -q for INT8), and the value, the
    static quant scale (in place: replays read it by address) and the inputs' snapshots made again. Replayed with
    A's old values, a plan or graph that read a stale staging copy of A (or none) gave the right answer (review)."""
    import cupy

    from bench import runner

    a = call.a
    if a.dtype == np.int8:
        a[...] = -a
    else:
        bits = a.view({1: cupy.uint8, 2: cupy.uint16, 4: cupy.uint32}[a.itemsize])
        bits ^= bits.dtype.type(1 << (8 * a.itemsize - 1))
    call.product = -call.product
    call.value = runner.apply_epilogue(call.product, case.epi, call.epi_ops)
    changed = [a if a.base is None else a.base]
    if "quant_scale" in call.kwargs:
        q_max = dtypes.QUANT_MAX[case.epi.quant_dtype]
        scale = call.kwargs["quant_scale"]
        scale[...] = float(cupy.abs(call.value).max()) * 1.25 / q_max or 1.0
        changed.append(scale if scale.base is None else scale.base)
    call.watched = [(base, base.copy() if any(base is c for c in changed) else before)
                    for base, before in call.watched]


def _out_bytes(call: _Call, spec) -> tuple[int, int]:
    """The byte columns of out's buffer that out covers."""
    base = call.out.base
    lo = call.out.data.ptr - base.data.ptr
    return lo, lo + spec.out_shape(call.m)[1] * base.itemsize


def _fill_out(call: _Call, spec) -> None:
    """out's elements poisoned (INT8: INT8_POISON) or, where C is out itself, set to C; the rest of its buffer
    untouched."""
    if call.out is None:
        return
    lo, hi = _out_bytes(call, spec)
    call.out.base.view(np.uint8)[:, lo:hi] = reference.POISON_BYTE
    if spec.out_dtype == "int8":  # quant_int8_tensor saturates to [-127, 127]: -128 marks unwritten elements
        call.out[...] = INT8_POISON
    if call.c_init is not None:
        call.out[...] = call.c_init


def _prepare(case: FuzzCase, spec, m: int, rng) -> _Call:
    """Fresh operands for a call at M = m, its expected value, and out= (poisoned) as the case asks."""
    import cupy

    from bench import runner

    epi = case.epi
    b_scale = 1.0 / math.sqrt(case.k) if case.epilogue else 1.0  # activations then see O(1) values
    a, b, product, kwargs = _operands(case, spec, m, rng, b_scale)
    # The bench's epilogue operands (N(0, 1) bias / C / residual, alpha / beta), in the epilogue's operand type
    # (float32 beside a quantized D).
    epi_ops = runner.epilogue_operands(spec, m, rng)
    value = runner.apply_epilogue(product, epi, epi_ops)
    ops = {name: _padded(x, 0, rng, case.lead) if isinstance(x, cupy.ndarray) else x
           for name, x in epi_ops.call_kwargs(epi).items()}
    if epi.has_static_scale:
        q_max = dtypes.QUANT_MAX[epi.quant_dtype]
        scale = float(cupy.abs(value).max()) * 1.25 / q_max or 1.0
        kwargs["quant_scale"] = cupy.asarray([scale], dtype=cupy.float32)
        if rng.random() < 0.5:
            kwargs["amax_out"] = cupy.zeros(1, dtype=cupy.float32)
    out = c_init = pad_before = None
    if case.out_pad >= 0:
        rows, cols = spec.out_shape(m)
        buf = reference.poisoned((rows, case.lead + cols + case.out_pad), spec.out_dtype)
        if case.out_pad or case.lead:
            raw = buf.view(cupy.uint8)
            raw[...] = rng.integers(0, 256, raw.shape, dtype=cupy.uint8)
            pad_before = raw.copy()  # compared as bytes: the padding's random bits include NaNs
        out = buf[:, case.lead:case.lead + cols]
        if epi.beta and rng.random() < 0.3:  # C is out itself (D = alpha acc + beta D)
            c_init = ops["c"]
            ops["c"] = out
    call = _Call(m, a, b, kwargs, ops, value, out, c_init, [], pad_before, product=product, epi_ops=epi_ops)
    _fill_out(call, spec)
    read_only = [x for name, x in (*kwargs.items(), *ops.items()) if name != "amax_out"]  # amax_out is written
    call.watched = [snapshot(x) for x in (a, b, *read_only) if isinstance(x, cupy.ndarray)
                    and x is not out and (x.base is None or x.base is not getattr(out, "base", None))]
    return call


# A call that has not finished after this many seconds hangs (the slowest fuzz call takes well under one).
HANG_SECONDS = float(os.environ.get("DEEPGEMM_JIT_FUZZ_HANG_SECONDS", 60))


def wait_for_call(what: str) -> None:
    """Wait for the current stream's work like synchronize(), but end the process when it takes HANG_SECONDS: a hung
    kernel never returns and would stall the run; pytest-xdist then reports the crashed worker with the test it ran
    (and starts another), and `what` (the case) is on stderr."""
    import cupy

    done = cupy.cuda.Event(disable_timing=True)
    done.record()
    deadline = time.monotonic() + HANG_SECONDS
    while not done.done:
        if time.monotonic() > deadline:
            sys.stderr.write(f"\nHUNG: not finished after {HANG_SECONDS:.0f} s: {what}\n")
            sys.stderr.flush()
            os._exit(3)
        time.sleep(0.0005)


def _call_and_check(case: FuzzCase, g, call: _Call, what: str) -> None:
    """Make `call` and assert its result: within the bounds, out= returned, nothing else written."""
    if case.torch_op:
        result = _torch_op_call(case, g.spec, call, what)
    elif case.torch_io:
        result = _torch_call(case, g, call, what)
    elif case.side_stream:
        result = _side_stream_call(case, g, call, what)
    else:
        result = g(call.a, call.b, out=call.out, **call.kwargs, **call.ops)
    wait_for_call(f"{what} -- {case.describe()}")
    _check(case, g.spec, call, result, what)
    # A call without out= gets a new output from CuPy's or torch's pool, which is not poisoned: the result stays
    # alive until the call is made again, so that its block (holding the right values) cannot be that call's output.
    call.kept = result


# How long the side stream is kept busy before A's values land on it: far longer than a warm call's host work (tens
# of us). A negative control on the H200 (2 ms, no warm-up call, the call made on the null stream instead) was caught
# 0 times in 40: a first call loads its kernels, which may synchronize the context (CUDA's lazy loading), and sizes
# buffers with a synchronize, so A had landed before its launches. With the warm-up call and 20 ms, the same control
# (scripts/check_fuzz_side_stream.py) caught 40 of 40 (session 35).
SIDE_STREAM_SPIN_SECONDS = 0.02


def _side_stream_call(case: FuzzCase, g, call: _Call, what: str):
    """The call with stream= a non-blocking side stream that is busy (a spin kernel) and then writes A's values
    over NaN bytes: a call that launched anything on another stream would read NaN (or -1 for INT8). A warm-up call
    first (current stream) loads the kernels and sizes the buffers, whose synchronizations would otherwise let A land
    before any launch. Waits for the side stream; A's buffer ends as it began."""
    import cupy

    from streams import spin

    call.kept = g(call.a, call.b, out=call.out, **call.kwargs, **call.ops)  # alive: see _call_and_check
    cupy.cuda.Device().synchronize()
    _fill_out(call, g.spec)
    if "amax_out" in call.kwargs:
        call.kwargs["amax_out"].fill(0)
    base = call.a if call.a.base is None else call.a.base
    assert base.flags.c_contiguous, what
    held = base.copy()
    base.view(cupy.uint8)[...] = reference.POISON_BYTE
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    spin(stream, SIDE_STREAM_SPIN_SECONDS)
    cupy.cuda.runtime.memcpyAsync(base.data.ptr, held.data.ptr, held.nbytes,
                                  cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr)
    result = g(call.a, call.b, out=call.out, stream=stream, **call.kwargs, **call.ops)
    with stream:
        wait_for_call(f"{what} -- {case.describe()}")
    return result


# Integer types of each element size: CuPy has no FP8 type, and bfloat16 does not cross DLPack everywhere, so
# arrays cross between CuPy and torch as these and are then viewed as their real type.
_BITS = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def torch_view(x, fp8_name: str | None = None):
    """CuPy array `x` as a torch tensor on the same memory (shape, strides, offset), of x's type; uint8 arrays hold
    FP8 bits and become `fp8_name` tensors where it is given. Anything else is returned as it is."""
    import cupy
    import torch

    if not isinstance(x, cupy.ndarray):
        return x
    t = torch.from_dlpack(x.view(_BITS[x.itemsize]))
    if x.dtype == np.uint8 and fp8_name is not None:
        return t.view(getattr(torch, dtypes.get(fp8_name).numpy_name))
    return t.view(getattr(torch, x.dtype.name))  # float16, bfloat16, float32, int8, int32, uint8: torch's names too


def cupy_view(t):
    """torch tensor `t` as a CuPy array on the same memory, FP8 as uint8 bits (the library's CuPy convention)."""
    import cupy
    import torch

    x = cupy.from_dlpack(t.view(getattr(torch, _BITS[t.element_size()])))
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return x.view(cupy.uint8)
    return x.view(numpy_dtype_of_torch(t.dtype))


def _torch_call(case: FuzzCase, g, call: _Call, what: str):
    """The call with every array as a torch tensor on the same memory; asserts torch in, torch out (out= itself
    where given), and returns the result as CuPy views for _check."""
    import torch

    spec, info = g.spec, case.info
    out = None if call.out is None else torch_view(call.out, spec.out_dtype)
    args = {name: torch_view(x) for name, x in (*call.kwargs.items(), *call.ops.items())}
    if "c" in call.ops and call.ops["c"] is call.out:
        args["c"] = out  # C is out itself
    result = g(torch_view(call.a, info.a_type), torch_view(call.b, info.b_type), out=out, **args)
    parts = result if isinstance(result, tuple) else (result,)
    assert all(isinstance(p, torch.Tensor) for p in parts), f"{what}: torch in, not torch out -- {case.describe()}"
    if out is not None:
        assert parts[0] is out, f"{what}: the call did not return out= -- {case.describe()}"
    d = call.out if out is not None else cupy_view(parts[0])
    return (d, cupy_view(parts[1])) if isinstance(result, tuple) else d


def _torch_op_call(case: FuzzCase, spec, call: _Call, what: str):
    """The call through the torch custom op a torch user calls instead of build (it builds and keeps its own Gemm
    per M bucket): torch tensors on the call's memory in, a new tensor of spec's out dtype out, as CuPy."""
    import torch

    import deepgemm_jit.torch as dgt

    info = case.info
    a, b = torch_view(call.a, info.a_type), torch_view(call.b, info.b_type)
    if info.scaling is None:
        d = dgt.gemm(a, b, case.layout, case.out_dtype)
    else:
        scale_a, scale_b = (torch_view(call.kwargs[name]) for name in ("scale_a", "scale_b"))
        d = dgt.gemm_fp8(a, b, scale_a, scale_b, info.scaling, case.out_dtype)
    want = getattr(torch, dtypes.get(spec.out_dtype).numpy_name)
    assert isinstance(d, torch.Tensor) and d.dtype == want, f"{what}: {type(d)} {d.dtype} -- {case.describe()}"
    return cupy_view(d)


def _replay_and_check(case: FuzzCase, g, call: _Call, what: str) -> None:
    """As a serving loop does: on a side stream, one warm-up call, the same call captured in a CUDA graph, then out
    poisoned (amax_out zeroed) and the graph replayed; assert the replay's result as _call_and_check does.
    quant_fp8_g128 is given scales_out (the call would allocate it, which a capture cannot)."""
    import cupy

    kwargs = dict(call.kwargs)
    if case.epi.quant == "fp8_g128":
        kwargs["scales_out"] = cupy.empty(g.spec.scales_out_shape(call.m), dtype=cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    with stream:
        g(call.a, call.b, out=call.out, **kwargs, **call.ops)
        stream.synchronize()
        stream.begin_capture()
        try:
            result = g(call.a, call.b, out=call.out, **kwargs, **call.ops)
        finally:
            graph = stream.end_capture()
        _negate_a(case, call)  # the replay must read A's values at replay time, not the warm-up's staged copy
        _fill_out(call, g.spec)
        if "amax_out" in kwargs:
            kwargs["amax_out"].fill(0)
        if "scales_out" in kwargs:
            kwargs["scales_out"].fill(cupy.nan)
        graph.launch(stream)
        wait_for_call(f"{what} -- {case.describe()}")
    _check(case, g.spec, call, result, what)


def _check(case: FuzzCase, spec, call: _Call, result, what: str) -> None:
    """Assert what a call of `call` returned and left: within the bounds, out= returned, nothing else written."""
    import cupy

    epi, m, value = case.epi, call.m, call.value
    what = f"{what}: " + "{}"
    bound = reference.ERROR_BOUND[spec.dtype]
    if epi.quant == "fp8_g128":
        q, scales = result
        assert q.shape == spec.out_shape(m) and tuple(scales.shape) == spec.scales_out_shape(m), case.describe()
        got = reference.dequantize_reference(q, scales, "fp8_e4m3", "group128")
        check_close(case, got, value, bound + FP8_REL, FP8_REL, what.format("quant_fp8_g128 dequantized"))
        check_group_scales(case, scales, value, bound, what)
        d = q
    elif epi.has_static_scale:
        d = result
        scale = float(call.kwargs["quant_scale"][0])
        if epi.quant_dtype == "int8":
            unwritten = int(cupy.count_nonzero(d == INT8_POISON))
            assert unwritten == 0, what.format(f"{unwritten} INT8 elements unwritten (-128) -- {case.describe()}")
            got = d.astype(cupy.float64) * scale
            rel = 0.5 * scale / max(_rms(value), 1e-30)
        else:
            got = reference.decode_fp8(d, "fp8_e4m3") * scale
            rel = FP8_REL
        check_close(case, got, value, bound + rel, FP8_REL, what.format(f"quant_{epi.quant} dequantized"))
        if "amax_out" in call.kwargs:
            amax, amax_ref = float(call.kwargs["amax_out"][0]), float(cupy.abs(value).max())
            # (the largest |x| is the best-conditioned element: within the Frobenius bound, not ELEMENT_FACTOR times
            # it, which let a max over one tile or half the rows pass; review, session 60)
            assert abs(amax - amax_ref) <= bound * amax_ref, \
                what.format(f"amax_out {amax!r} vs {amax_ref!r} -- {case.describe()}")
    else:
        d = result
        assert tuple(d.shape) == spec.out_shape(m), case.describe()
        if case.info.exact and spec.out_dtype == "int32":
            bad = int(cupy.count_nonzero(d.astype(cupy.float64) != value))
            assert bad == 0, what.format(f"{bad} INT32 elements differ from the exact product -- {case.describe()}")
        else:
            rms_round, elem_round = trial.out_rounding(spec.out_dtype, d.size)
            check_close(case, d, value, bound + rms_round, elem_round, what.format("D"))
    if call.out is not None:
        assert d is call.out, what.format(f"the call did not return out= -- {case.describe()}")
    if call.pad_before is not None:
        lo, hi = _out_bytes(call, spec)
        raw = as_bytes(call.out.base)
        for cols in (slice(0, lo), slice(hi, None)):
            assert bool((raw[:, cols] == call.pad_before[:, cols]).all()), \
                what.format(f"the call wrote into out's buffer outside out -- {case.describe()}")
    for base, before in call.watched:
        assert bool((as_bytes(base) == as_bytes(before)).all()), \
            what.format(f"an input buffer changed -- {case.describe()}")
