"""Random grouped (mixture-of-experts) calls, one per seed: tests/fuzz.py's idea for build_grouped.

A seed draws the recipe (bf16, fp16, FP8 block E4M3 or E4M3 x E5M2), how rows are grouped (offs, m_indices with
padding rows, or masked with counts past max_m), 1-12 groups of 0 to ~1100 rows (empty and 1-row groups often),
N and K (multiples of 16: grouped GEMMs read and store through TMA), a grouped epilogue (bias per group,
activations, swiglu / geglu, quant_fp8_g128), the tile hints (expected_m, num_groups), deterministic or not, FP8
A scales row-major or M-major, and for a quarter of the seeds other group sizes, which a CUDA graph captured from the
call is then replayed with (written into the device's offs / m_indices / masked_m, as a serving loop does), and for
some the call made through the torch custom ops (deepgemm_jit.torch.grouped_mm / grouped_mm_fp8) instead. `draw`
keeps what build_grouped accepts and runs the tile rules on it; `run` (GPU) checks every group against float64, the
rows that belong to no group still poisoned, the inputs unchanged.

Reproduce: `pytest tests/test_fuzz_grouped_gpu.py -k seed_12` with DEEPGEMM_JIT_FUZZ_GROUPED_CASES covering it.
"""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from deepgemm_jit import config as config_mod
from deepgemm_jit import dtypes, reference, trial
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
    replay_sizes: tuple[int, ...] = ()  # the sizes a CUDA graph of the call is replayed with (none: no graph)
    torch_op: bool = False        # the call goes through deepgemm_jit.torch.grouped_mm / grouped_mm_fp8 instead

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
                f"sizes={list(self.sizes)} max_m={self.max_m} scale_row_major={self.scale_row_major}"
                + (f" replay_sizes={list(self.replay_sizes)}" if self.replay_sizes else "")
                + (" torch_op" if self.torch_op else ""))


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
    replay_sizes = _draw_replay_sizes(seed, attempt, grouping, sizes, max_m)
    return GroupedCase(seed=seed, recipe=recipe, grouping=grouping, sizes=tuple(sizes), max_m=max_m, n=n, k=k,
                       epilogue=epilogue, out_dtype=out_dtype, expected_m=int(rng.integers(1, 2049)),
                       num_groups_hint=int(rng.integers(1, 17)), deterministic=bool(rng.random() < 0.6),
                       scale_row_major=bool(rng.random() < 0.5),
                       replay_sizes=replay_sizes,
                       torch_op=_draw_torch_op(seed, attempt, recipe, grouping, epilogue, replay_sizes))


def _draw_replay_sizes(seed: int, attempt: int, grouping: str, sizes: list[int], max_m: int) -> tuple[int, ...]:
    """Group sizes for a replay (a quarter of the cases), from a stream of their own: masked counts anywhere in [0,
    max_m + 50) (0 often); contiguous sizes cut at random from the first call's rows, so later rows may belong to no
    group."""
    rng = np.random.default_rng([seed, attempt, 8])
    if rng.random() >= 0.25:
        return ()
    if grouping == "masked":
        return tuple(0 if rng.random() < 0.15 else int(rng.integers(1, max_m + 50)) for _ in sizes)
    ends = np.sort(rng.integers(0, sum(sizes) + 1, len(sizes)))
    return tuple(int(x) for x in np.diff(ends, prepend=0))


def _draw_torch_op(seed: int, attempt: int, recipe: str, grouping: str, epilogue: str | None,
                   replay_sizes: tuple[int, ...]) -> bool:
    """Whether the call goes through the torch custom op (40% of those the ops serve: offs or masked_m, no epilogue,
    one dtype for a and b, no replay), from a stream of its own."""
    if recipe == "fp8_block_e5m2" or grouping == "m_indices" or epilogue is not None or replay_sizes:
        return False
    return bool(np.random.default_rng([seed, attempt, 9]).random() < 0.4)


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
def _row_spans(case: GroupedCase, sizes, rng, rows: int | None = None
               ) -> tuple[list[tuple[int, int]], np.ndarray, int]:
    """(each group's (start, end) rows in a / out, the grouping's device metadata (masked_m, offs or m_indices),
    total rows) for groups of `sizes`. masked: group g's rows are g * max_m + [0, min(count, max_m)). `rows`: the
    total the call's a already has (a replay), which contiguous sizes may leave rows of no group in."""
    if case.grouping == "masked":
        return ([(g * case.max_m, g * case.max_m + min(s, case.max_m)) for g, s in enumerate(sizes)],
                np.asarray(sizes, dtype=np.int32), len(sizes) * case.max_m)
    if case.grouping == "offs":
        ends = np.cumsum(sizes)
        return ([(int(e - s), int(e)) for s, e in zip(sizes, ends)], ends.astype(np.int32),
                int(ends[-1]) if rows is None else rows)
    room = None if rows is None else rows - sum(sizes)  # padding rows a replay's layout may still place
    ids, spans = [], [(0, 0)] * len(sizes)
    for g in rng.permutation(len(sizes)):  # groups in any order, padding rows (-1) between runs
        gap = int(rng.integers(0, 5) if rng.random() < 0.5 else 0)
        if room is not None:
            gap = min(gap, room)
            room -= gap
        ids += [-1] * gap
        spans[g] = (len(ids), len(ids) + sizes[g])
        ids += [int(g)] * sizes[g]
    if rows is not None:
        ids += [-1] * (rows - len(ids))
    return spans, np.asarray(ids, dtype=np.int32), len(ids)


_METADATA = {"masked": "masked_m", "offs": "offs", "m_indices": "m_indices"}


def run(case: GroupedCase) -> None:
    """Build the case's grouped Gemm, call it on the GPU and check every group; with replay_sizes, then capture the
    call in a CUDA graph, write the new sizes' metadata into the same device array and check the replay."""
    import cupy

    import deepgemm_jit as dg

    g = dg.build_grouped(case.n, case.k, **case.build_kwargs())
    spec, epi = g.spec, case.epi
    rng = cupy.random.default_rng(case.seed)
    nrng = np.random.default_rng(case.seed)
    spans, meta, rows = _row_spans(case, case.sizes, nrng)
    groups = len(case.sizes)
    b_scale = 1.0 / math.sqrt(case.k) if case.epilogue else 1.0
    x = rng.standard_normal((max(rows, 1), case.k), dtype=cupy.float32)[:rows]
    w = rng.standard_normal((groups, case.n, case.k), dtype=cupy.float32) * cupy.float32(b_scale)
    kwargs: dict = {}
    if spec.dtype.startswith("fp8"):
        qa, sa = reference.quantize_reference(x, "fp8_e4m3", "group128")
        qbs, sbs = zip(*(reference.quantize_reference(w[i], spec.b_type, "block128") for i in range(groups)))
        a64 = reference.dequantize_reference(qa, sa, "fp8_e4m3", "group128")
        # one group at a time into the float64 stack (a list of them beside the stack held twice the 1.8 GB of
        # seed 5321's 11 x 3680 x 5696 weights, and ran out of memory beside 13 other workers)
        b64 = cupy.empty((groups, case.n, case.k), dtype=cupy.float64)
        for i in range(groups):
            b64[i] = reference.dequantize_reference(qbs[i], sbs[i], spec.b_type, "block128")
        del w
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
    kwargs[_METADATA[case.grouping]] = cupy.asarray(meta)
    bias = None
    if epi.bias != "none":
        bias = reference.random_matrix((groups, case.n), spec.epilogue_operand_dtype, rng)
        kwargs["bias"] = bias
    shape = (groups, case.max_m, spec.n_out) if case.grouping == "masked" else (rows, spec.n_out)
    out = reference.poisoned(shape, spec.out_dtype)
    watched = [fuzz.snapshot(v) for v in (a, b, *kwargs.values()) if isinstance(v, cupy.ndarray)]
    reference_of = _Reference(case, spec, a64, b64, bias)
    if case.torch_op:
        d = _torch_op_call(case, spec, a, b, kwargs, shape)
        fuzz.wait_for_call(case.describe())
        reference_of.check(d, d, spans, "through the torch op: ", rows_of_no_group=False)
        _check_unchanged(case, watched)
        return
    result = g(a, b, out=out, **kwargs)
    fuzz.wait_for_call(case.describe())
    reference_of.check(out, result, spans, "")
    _check_unchanged(case, watched)
    if case.replay_sizes:
        if epi.has_group_scales:  # the call allocated them; a capture cannot
            kwargs["scales_out"] = result[1]
        watched = [fuzz.snapshot(v) for name, v in kwargs.items()
                   if isinstance(v, cupy.ndarray) and name not in ("scales_out", _METADATA[case.grouping])]
        stream = cupy.cuda.Stream(non_blocking=True)
        cupy.cuda.Device().synchronize()
        with stream:
            g(a, b, out=out, **kwargs)  # the warm-up a serving loop makes before capturing
            stream.synchronize()
            stream.begin_capture()
            try:
                result = g(a, b, out=out, **kwargs)
            finally:
                graph = stream.end_capture()
            spans, meta, _ = _row_spans(case, case.replay_sizes, nrng, rows)
            kwargs[_METADATA[case.grouping]][...] = cupy.asarray(meta)
            reference.poison(out, stream)
            if epi.has_group_scales:
                kwargs["scales_out"].fill(cupy.nan)
            graph.launch(stream)
            fuzz.wait_for_call(f"replay -- {case.describe()}")
        reference_of.check(out, result, spans, "replayed from a CUDA graph with replay_sizes: ")
        _check_unchanged(case, watched)


def _torch_op_call(case: GroupedCase, spec, a, b, kwargs: dict, shape: tuple):
    """The call through the torch custom op (it builds its own grouped Gemm from the shapes): torch tensors on the
    arrays' memory in, a new tensor of the spec's output shape and dtype out, returned as CuPy."""
    import torch

    import deepgemm_jit.torch as dgt

    at, bt = fuzz.torch_view(a, spec.dtype), fuzz.torch_view(b, spec.b_type)
    meta = {name: fuzz.torch_view(kwargs[name]) for name in ("offs", "masked_m") if name in kwargs}
    if spec.dtype.startswith("fp8"):
        d = dgt.grouped_mm_fp8(at, bt, fuzz.torch_view(kwargs["scale_a"]), fuzz.torch_view(kwargs["scale_b"]),
                               out_dtype=case.out_dtype, **meta)
    else:
        d = dgt.grouped_mm(at, bt, out_dtype=case.out_dtype, **meta)
    want = getattr(torch, dtypes.get(spec.out_dtype).numpy_name)
    assert tuple(d.shape) == shape and d.dtype == want, f"{tuple(d.shape)} {d.dtype} -- {case.describe()}"
    return fuzz.cupy_view(d)


def _check_unchanged(case: GroupedCase, watched) -> None:
    for base, before in watched:
        assert bool((fuzz.as_bytes(base) == fuzz.as_bytes(before)).all()), \
            f"an input buffer changed -- {case.describe()}"


@dataclasses.dataclass
class _Reference:
    """What a call's groups must hold: float64 products of the dequantized operands, then the unfused epilogue."""

    case: GroupedCase
    spec: object
    a64: object
    b64: object
    bias: object

    def check(self, out, result, spans, what: str, rows_of_no_group: bool = True) -> None:
        """Every group of `spans` against float64 (quant_fp8_g128: dequantized by the returned scales), and every
        row of no group still poisoned (rows_of_no_group: out was poisoned before the call)."""
        import cupy

        case, spec, epi = self.case, self.spec, self.case.epi
        d2 = out.reshape(-1, spec.n_out)
        scales = result[1].reshape(-1, result[1].shape[-1]) if epi.has_group_scales else None
        bound = reference.ERROR_BOUND[spec.dtype]
        owned = np.zeros(d2.shape[0], dtype=bool)
        for i, (s, e) in enumerate(spans):
            owned[s:e] = True
            if e == s:
                continue
            value = reference.unfused_epilogue(self.a64.reshape(-1, case.k)[s:e] @ self.b64[i].T, epi,
                                               None if self.bias is None else self.bias[i])
            where = f"{what}group {i} rows [{s}, {e})"
            if epi.has_group_scales:
                got = reference.dequantize_reference(d2[s:e], scales[s:e], "fp8_e4m3", "group128")
                fuzz.check_close(case, got, value, bound + fuzz.FP8_REL, fuzz.FP8_REL, where)
                fuzz.check_group_scales(case, scales[s:e], value, bound, where + ": {}")
            else:
                rms_round, elem_round = trial.out_rounding(spec.out_dtype, (e - s) * d2.shape[1])
                fuzz.check_close(case, d2[s:e], value, bound + rms_round, elem_round, where)
        free = cupy.asarray(np.nonzero(~owned)[0])
        if free.size and rows_of_no_group:
            assert bool((fuzz.as_bytes(d2[free]) == reference.POISON_BYTE).all()), \
                f"{what}rows of no group were written -- {case.describe()}"
