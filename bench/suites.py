"""Benchmark suites as data, and their expansion into cases (pure Python, no GPU).

A suite is a list of (M, N, K); a case is one (suite, dtype, layout, M, N, K) row of a run, ``dtype`` being a
bench dtype of ``dtypes.py`` (bf16, ..., or an 8-bit recipe such as fp8_block).
Layouts name the storage of A and B, first letter A, second B (BLAS/DeepGEMM convention, math is D = A·B with
A (M, K) and B (K, N)): 'n' = stored as in the math, 't' = stored transposed, as ``deepgemm_jit.spec.LAYOUTS``
(``GemmSpec.a_shape`` / ``b_shape`` give the stored shapes).
"""
from __future__ import annotations

import dataclasses
import itertools
import re

from deepgemm_jit import epilogue as epilogue_mod
from deepgemm_jit.spec import LAYOUTS

from . import dtypes as bench_dtypes

Shape = tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    shapes: tuple[Shape, ...]
    quick_shapes: tuple[Shape, ...]   # the subset run under --quick
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Case:
    suite: str
    dtype: str
    layout: str
    m: int
    n: int
    k: int
    # forced sm90 tile "BMxBN"/"BMxBNsS"; "auto": the heuristic's choice; "tuned": build(tune=True);
    # None: whatever build() picks (a stored tuning result, else the heuristic)
    tiles: str | None = None
    # fused epilogue ("bias+gelu", ...; deepgemm_jit/epilogue.py), stored canonical; None: the plain GEMM
    epilogue: str | None = None

    def __post_init__(self) -> None:
        if self.epilogue is not None:
            text = epilogue_mod.canonical(self.epilogue)   # ValueError on an unknown word
            object.__setattr__(self, "epilogue", None if text == "none" else text)
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r} not in {LAYOUTS}")
        info = bench_dtypes.get(self.dtype)
        if self.layout not in info.layouts:
            raise ValueError(f"{self.dtype} is built for layouts {info.layouts}, not {self.layout!r}")
        for dim, v in (("m", self.m), ("n", self.n), ("k", self.k)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{dim}={v!r} must be a positive int")

    @property
    def tag(self) -> str:
        tiles = f"_t{self.tiles}" if self.tiles else ""
        epi = f"_ep_{self.epilogue.replace('+', '_')}" if self.epilogue else ""
        return f"{self.dtype}_{self.layout}_m{self.m}n{self.n}k{self.k}{tiles}{epi}"

    def make_spec(self):
        """The library's GemmSpec of this case (pure Python); for fp32 (3xTF32) rows, that of the TF32 GEMM that
        computes them on the Hopper family at this M (N, K' = 3 * ceil(K / 32) * 32, layout nt, raw_b at decode
        sizes: what a forced tile and an epilogue apply to)."""
        from deepgemm_jit import GemmSpec

        info = bench_dtypes.get(self.dtype)
        if info.lib == "fp32":
            from deepgemm_jit.fp32x3 import Fp32Spec

            spec = Fp32Spec.create(self.n, self.k, layout=self.layout, epilogue=self.epilogue)
            return spec.inner_at(self.m, "sm_90a")
        extra = {"scaling": info.scaling} if info.scaling else {}
        if self.epilogue:
            extra["epilogue"] = self.epilogue
        return GemmSpec.create(self.n, self.k, dtype=info.lib, layout=self.layout, **extra)

    def build_kwargs(self) -> dict:
        """What ``dg.build(M, N, K, **kwargs)`` takes for this case, forced tile aside (``forced_config``)."""
        info = bench_dtypes.get(self.dtype)
        kwargs = {"dtype": info.lib, "layout": self.layout, "tune": self.tiles == "tuned"}
        if info.scaling:
            kwargs["scaling"] = info.scaling
        if self.epilogue:
            kwargs["epilogue"] = self.epilogue
        return kwargs

    def forced_config(self, spec):
        """The KernelConfig `tiles` asks for, or None for the heuristic's choice."""
        if not self.tiles or self.tiles == "tuned":
            return None
        from deepgemm_jit import config, device

        if self.tiles == "auto":  # the heuristic's own choice, even where a tuning result is stored
            return config.choose_config(spec, self.m, device.current_arch(), device.num_sms())
        return forced_tile_config(spec, self.tiles)


# --tiles: forced sm90 tiles "BMxBN[sS][p][rR][k][w]" (s: pipeline stages, else as many as fit; p: ping-pong consumers;
# r: D through a ring of R slices, r0 the whole tile, else the library's rule; k: split-K; w: swapped wgmma operands,
# KernelConfig.swap_ab), shared
# by python -m bench (one row per tile) and python -m bench.moe (every tile of a row timed in one interleaved call).
TILE_WORDS = ("auto", "tuned")
_TILE_RE = re.compile(r"(\d+)x(\d+)(?:s(\d+))?(p?)(?:r(\d+))?(k?)(w?)")


def parse_tile(text: str) -> tuple[int, int, int | None, bool, int | None, bool, bool]:
    """'128x192s4' -> (block_m 128, block_n 192, stages 4, pingpong False, d_ring None, split_k False, swap_ab
    False); stages None when not given; 'rR' sets KernelConfig.d_ring (D through a ring of R slices; r0: the whole
    tile staged), None the library's rule; 'k' makes it a split-K kernel (grouped: the device-split one), a final 'w'
    a swapped tile (KernelConfig.swap_ab: 88x192w). ValueError on anything but BMxBN[sS][p][rR][k][w]."""
    match = _TILE_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"tiles={text!r}: write BMxBN[sS][p][rR][k][w], e.g. 128x256, 128x192s4, 128x128p "
                         "(p: ping-pong consumers), 128x256s4r2 (r2: D through a ring of 2 slices, r0: whole tile), "
                         "128x128k (a split-K kernel) or 88x192w (swapped wgmma operands)")
    stages = int(match.group(3)) if match.group(3) else None
    d_ring = int(match.group(5)) if match.group(5) else None
    return (int(match.group(1)), int(match.group(2)), stages, bool(match.group(4)), d_ring, bool(match.group(6)),
            bool(match.group(7)))


def forced_tile_config(spec, tile: str):
    """The sm90 KernelConfig of the tile 'BMxBN[sS][p][rR][k][w]' for `spec` (``config.sm90_config``; not checked
    against the spec: ``KernelConfig.check_for`` or the build does that)."""
    from deepgemm_jit import config

    block_m, block_n, stages, pingpong, d_ring, split_k, swap_ab = parse_tile(tile)
    return config.sm90_config(spec, block_m, block_n, stages, pingpong=pingpong, d_ring=d_ring, split_k=split_k,
                              swap_ab=swap_ab)


def parse_tiles(text: str | None, words=TILE_WORDS) -> tuple[str, ...]:
    """--tiles 'auto,128x256,128x192s4' -> ('auto', '128x256', '128x192s4'), duplicates dropped, each a word of
    `words` or a tile that ``parse_tile`` reads (checked here, before any GPU work); None or '' -> (). ValueError
    on anything else."""
    if not text:
        return ()
    items = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    for item in items:
        if item not in words:
            try:
                parse_tile(item)
            except ValueError as exc:
                raise ValueError(f"{exc}; or one of {list(words)}") from None
    return items


def _product(ms, nks) -> tuple[Shape, ...]:
    return tuple((m, n, k) for m, (n, k) in itertools.product(ms, nks))


# DeepSeek-V3 dense projections (DeepGEMM's own benchmark shapes): decode (64), small prefill (128), prefill (4096).
_DEEPSEEK_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))

# Dense projections of other model families, (N, K) = (output features, input features) of the weight: the
# cost model and its M buckets were tuned on DeepSeek's shapes, so these rows check that the choices carry over.
# Llama-3.1-8B: qkv (32 + 2 x 8 heads of 128), o, gate_up (2 x 14336), down; Llama-3.1-70B sharded over 8 GPUs
# (tensor parallel: qkv / gate_up split by columns, o / down by rows); Qwen2.5-7B (28 + 2 x 4 heads, 18944).
_MODELS_NK = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
              (1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584),
              (4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944))

SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        Suite("deepseek", _product((64, 128, 4096), _DEEPSEEK_NK),
              _product((64, 4096), ((2112, 7168), (7168, 2048))),
              "DeepSeek-V3 projections, M in {64, 128, 4096}"),
        # Decode: M <= 8 runs the decode kernels where their rules take the shape (row sweep gemv_rows.py at M = 1-2,
        # weight streaming gemv.py), the rest the sm90 family (split-K tiles); the rows are bound by reading B once:
        # read their GB/s against the 4.25 TB/s copy ceiling.
        Suite("decode", _product((1, 8, 16, 32, 64, 128), _DEEPSEEK_NK),
              _product((1, 16), ((2112, 7168), (7168, 16384))),
              "DeepSeek-V3 projections at decode sizes, M in {1, 8, 16, 32, 64, 128}"),
        # M = 1000: a partial last M block at prefill size (DESIGN.md: odd sizes in every sweep).
        Suite("models", _product((1, 32, 256, 1000, 4096), _MODELS_NK),
              _product((32, 4096), ((6144, 4096), (8192, 1024))),
              "Llama-3.1-8B, Llama-3.1-70B at tensor parallel 8 and Qwen2.5-7B projections, M in {1, 32, 256, 1000, "
              "4096}"),
        # Prefill chunks and MoE groups of a few hundred to two thousand tokens: one or two waves of 128-row tiles,
        # partial last M blocks (586 and 1050 are the masked-MoE group sizes where cuBLAS runs clustered tiles).
        Suite("midm", _product((256, 586, 1050, 2048), _DEEPSEEK_NK),
              _product((586, 1050), ((4096, 7168),)),
              "DeepSeek-V3 projections at prefill-chunk sizes, M in {256, 586, 1050, 2048}"),
        Suite("square", ((4096, 4096, 4096), (8192, 8192, 8192)), ((4096, 4096, 4096),),
              "large square, compute-bound"),
        Suite("seed", ((64, 4096, 4096), (1, 4096, 4096), (4096, 4096, 4096)),
              ((64, 4096, 4096), (1, 4096, 4096), (4096, 4096, 4096)),
              "the first issue's acceptance shapes"),
        # DESIGN.md: odd and small sizes belong to every sweep. K*itemsize not a multiple of 16 may be refused
        # by a TMA path (then the row reports the library's ValueError, which is also worth seeing).
        Suite("odd", ((1, 1, 8), (7, 13, 24), (129, 257, 136), (1000, 1000, 1000), (4095, 4097, 4104),
                      (333, 7168, 2048)),
              ((7, 13, 24), (1000, 1000, 1000)),
              "odd and small sizes (correctness-minded)"),
        # K (and, for nn / tn, N) whose 16-bit rows are aligned to the element only: TMA cannot read them in place,
        # so they run staged copies (staging.py) or the portable kernel; these rows time that path against cuBLAS.
        Suite("oddk", ((17, 33, 65), (100, 100, 99), (129, 257, 135), (1000, 1001, 1003), (333, 7168, 2047),
                       (4095, 4097, 4099)),
              ((17, 33, 65), (1000, 1001, 1003)),
              "odd K: operands TMA cannot describe in place"),
    )
}

DEFAULT_SUITES = ("deepseek", "square", "seed")
DEFAULT_DTYPES = ("bf16", "fp16", "tf32")


def parse_list(text: str | None, allowed, default, what: str) -> tuple[str, ...]:
    """'a,b' -> ('a', 'b'), checked against `allowed`; None or '' -> default; 'all' -> every allowed value."""
    if not text:
        return tuple(default)
    if text.strip() == "all":
        return tuple(allowed)
    items = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [x for x in items if x not in allowed]
    if bad:
        raise ValueError(f"unknown {what} {bad}; choose from {sorted(allowed)}")
    return items


def parse_epilogues(text: str | None) -> tuple[str | None, ...]:
    """'bias+gelu,bias+gelu+residual' -> canonical epilogue strings; None or '' -> (None,): the plain GEMM
    only. 'none' in the list adds plain rows. ValueError on an unknown word, and on quantize-on-store epilogues
    (their 8-bit D would fail this bench's check: bench.quant_epilogue times them)."""
    if not text or not text.strip():
        return (None,)
    items = []
    for word in (x.strip() for x in text.split(",") if x.strip()):
        epi = epilogue_mod.Epilogue.parse(word)
        if epi.quant != "none":  # an 8-bit D with its own scales: neither this bench's check nor its baselines
            raise ValueError(f"epilogue {word!r}: quantize-on-store rows are not timed here; python -m "
                             "bench.quant_epilogue times them")
        items.append(None if epi.text == "none" else epi.text)
    return tuple(dict.fromkeys(items))


def expand(suites, dtypes, layouts=("nt",), quick: bool = False, tiles=(None,), epilogues=(None,)) -> list[Case]:
    """Every case of the run, suite-major then dtype then layout then shape (then forced tile, for
    sweeps, then epilogue); a shape met twice runs once, a layout the dtype is not built for (8-bit: nt only)
    not at all, nor an epilogue the library's spec refuses for the dtype or layout (int8 -> int32 output)."""
    cases: list[Case] = []
    seen: set[tuple] = set()
    for suite_name in suites:
        if suite_name not in SUITES:
            raise ValueError(f"unknown suite {suite_name!r}; choose from {sorted(SUITES)}")
        suite = SUITES[suite_name]
        shapes = suite.quick_shapes if quick else suite.shapes
        for dtype in dtypes:
            for layout in (x for x in layouts if x in bench_dtypes.get(dtype).layouts):
                for (m, n, k), tile, epi in itertools.product(shapes, tiles, epilogues):
                    key = (dtype, layout, m, n, k, tile, epi)
                    if key in seen:
                        continue
                    seen.add(key)
                    case = Case(suite_name, dtype, layout, m, n, k, tile, epi)
                    if epi is not None and not _spec_accepts(case):
                        continue
                    cases.append(case)
    return cases



def _spec_accepts(case: Case) -> bool:
    """Does the library's GemmSpec accept the case (its epilogue with its dtype and layout)?"""
    try:
        case.make_spec()
    except ValueError:
        return False
    return True
