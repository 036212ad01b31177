"""FP32-accurate GEMMs on TF32 tensor cores (3xTF32): ``build_fp32`` -> ``Fp32Gemm``.

Each FP32 operand is split into a TF32 value and a TF32 remainder, ``x ~= hi + lo``, and

    A @ B^T ~= A_hi B_hi^T + A_hi B_lo^T + A_lo B_hi^T,
    A2 = [A_hi | A_lo] (M, 2 Kp),   B2 = [B_hi | B_lo] (N, 2 Kp),

K-concatenated, each segment Kp = ceil(K / 32) * 32 columns wide and zero past K (rows of 2 Kp floats are
16-byte multiples, so the Hopper family's TMA takes them, and no BLOCK_K of 32 straddles two segments). A call
is two launches on one stream: the split kernel (``templates/split_tf32.cu.j2``, ``dgjit/split_tf32.cuh``)
writes A2 and B2 into workspaces allocated for the call, then the library's own TF32 ``Gemm`` (layout nt,
promoted, ``GemmSpec.hi_lo``: its K loop runs over K' = 3 Kp, K block 3j + s multiplying (hi, hi), (hi, lo),
(lo, hi) of block j, built by ``api.build_spec``) multiplies them into the caller's output, through its fused
epilogue if it has one. (Until session 14 the split wrote A3 = [A_hi | A_hi | A_lo] and B3 = [B_hi | B_lo | B_hi]
for a plain K' = 3 Kp GEMM: hi stored twice, and read twice from DRAM.)

Split, per element (the device code and ``split_reference`` below agree bit for bit): ``hi`` = x rounded to
TF32 (nearest, ties away from zero: PTX ``cvt.rna.tf32.f32``); ``lo`` = x - hi, exact in FP32, then rounded to
TF32 too, so every value the tensor cores read is a TF32 value. Left out: A_lo B_lo^T and the rounding of lo,
each below 2^-22 relative per product term, under FP32 accumulation's own error (``reference.ERROR_BOUND``:
1e-5 on ||D - D64|| / ||D64||). Inputs are expected finite. NaN propagates; an infinite element does not give
the FP32 GEMM's +-inf: its row's (or column's) outputs are NaN wherever a cross term multiplies it by a lo of 0
(an element exactly representable in TF32, e.g. a weight upcast from bf16) or of the opposite sign
(inf * hi + inf * lo = inf - inf).

Decode sizes (``raw_b_applies``: M <= RAW_B_MAX_M, layouts nt / tt, K % 32 == 0) skip the split of B: the TF32 GEMM
reads the caller's B and makes its lo in registers (dgjit/gemm_sm90.cuh, raw B). There B's hi is x truncated to
TF32 and lo = x - hi (0 where that is NaN), so a product term may reach ~2^-20 relative (still well inside the
1e-5 bound), a NaN weight whose payload sits only in the 13 dropped bits reads as inf, and ``split()``'s B2 is not
what such a Gemm multiplies.

Cost: the split reads A and B once and writes twice their size (memory-bound, ~12 bytes per element), then the
TF32 GEMM does three times the FLOPs of a TF32 GEMM of the same shape.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from . import cubin, device, dtypes, env, jit, runtime, sass, sm90_tiles
from . import epilogue as epilogue_mod
from .arrays import MatrixView, array_kind, matrix_view, new_array, out_view, scalar_signature, signature
from .config import KernelConfig
from .errors import KernelNotCachedError
from .quantization import _empty as _stream_array  # a new array of the caller's library, for the call's stream
from .render import RenderedSource
from .spec import LAYOUTS, MAX_DIM, GemmSpec, OperandLayout, _check_dim

# Mirrors of dgjit/split_tf32.cuh (each cubin exports them as `<entry>_<name>` symbols; checked before launch).
K_ALIGN = 32        # Kp is a multiple of this: the TF32 GEMM's BLOCK_K (128 bytes of FP32)
TILE_ROWS = 32
TILE_COLS = 128
NUM_THREADS = 256
NUM_SEGMENTS = 2    # the split writes [hi | lo] per operand
LO_SEGMENT_A = 1
LO_SEGMENT_B = 1
NUM_PRODUCTS = 3    # the TF32 GEMM's K' = 3 Kp: per K block hi x hi, hi x lo, lo x hi (GemmSpec.hi_lo)
SYMBOLS = ("num_threads", "tile_rows", "tile_cols", "k_align", "num_segments")

_TEMPLATE = "split_tf32.cu.j2"
_MAX_M = 2**31 - 1
_MAX_GRID = 2**31 - 1


def padded_k(k: int) -> int:
    """Kp: the width of each segment (and of each product's share of K'), K rounded up to a multiple of K_ALIGN.

    >>> padded_k(1), padded_k(32), padded_k(33), padded_k(7168)
    (32, 32, 64, 7168)
    """
    return -(-k // K_ALIGN) * K_ALIGN


# Small M (decode, small prefill): the TF32 GEMM reads the caller's FP32 weight itself (GemmSpec.raw_b) and only A
# is split: the split pass of B (read the weight, write twice its bytes) and the GEMM's read of B2 were ~2.35 GB of
# DRAM traffic for a 470 MB weight at 64x7168x16384 (H200, session 15, *exp-fp32-breakdown-s15*: split 336 + GEMM
# 282 us, cuBLAS FP32 331). Up to M = 512 since session 16's one-stage raw-B kernel (*exp-fp32-raw-b-larger-m-s16*
# against the split path's *exp-fp32-breakdown-split-larger-m-s16*, us per call): M = 256 faster on all six
# DeepSeek (N, K) (7168x16384 836 -> 554, 24576x1536 274 -> 180), M = 512 on five (2112x7168 202 -> 218 slower),
# M = 1024 within -5..+24%, M = 2048 slower on four. Needs B K-major (layouts nt, tt) and K a multiple of K_ALIGN
# (the weight is then (N, Kp)), and the sm90 family. DEEPGEMM_JIT_NO_RAW_B=1 turns it off (experiments).
RAW_B_MAX_M = 512


def raw_b_applies(spec: "Fp32Spec", m_hint: int) -> bool:
    """Whether build_fp32 at M = m_hint gives the TF32 GEMM the raw weight (see RAW_B_MAX_M)."""
    return m_hint <= RAW_B_MAX_M and spec.b_k_major and spec.k % K_ALIGN == 0 and not env.no_raw_b()


def inner_k(k: int) -> int:
    """K' = 3 Kp: the K of the TF32 GEMM that computes the FP32 product (its K loop; its operands are
    ``GemmSpec.operand_k`` = 2 Kp wide)."""
    return NUM_PRODUCTS * padded_k(k)


# -- the problem ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fp32Spec(OperandLayout):
    """An FP32-accurate GEMM: float32 a and b in `layout` (as :class:`GemmSpec` spells layouts), D = op(A) op(B)
    (M, N_out) in `out_dtype`, through `epilogue`. The problem as the caller sees it (K is the caller's K); the
    TF32 GEMM that computes it is :attr:`inner`. It answers what the benchmark, the baselines and the references
    read of a :class:`GemmSpec` (dtype "fp32", shapes, out_dtype, epilogue)."""

    n: int
    k: int
    out_dtype: str = "fp32"
    layout: str = "nt"
    epilogue: str = "none"
    dtype: str = "fp32"

    def __post_init__(self):
        if self.dtype != "fp32":
            raise ValueError(f"dtype={self.dtype!r}: an Fp32Spec multiplies fp32 operands")
        object.__setattr__(self, "n", _check_dim(self.n, "N", MAX_DIM))
        object.__setattr__(self, "k", _check_dim(self.k, "K", MAX_DIM))
        if inner_k(self.k) > MAX_DIM:
            raise ValueError(f"K={self.k}: the 3xTF32 GEMM runs over K' = 3 * {padded_k(self.k)} = "
                             f"{inner_k(self.k)} columns, more than supported ({MAX_DIM})")
        if not isinstance(self.layout, str) or self.layout.lower() not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r} is not supported; choose one of {', '.join(LAYOUTS)}")
        object.__setattr__(self, "layout", self.layout.lower())
        object.__setattr__(self, "epilogue", epilogue_mod.canonical(self.epilogue))
        # The TF32 GEMM checks out_dtype and the epilogue (its layout is always nt: the split writes K-major A2 and
        # B2 whatever the caller's layout, so epilogues work with every layout here).
        # promoted: the tensor cores' truncating accumulation would cap the accuracy (error linear in K).
        inner = GemmSpec(self.n, inner_k(self.k), "tf32", self.out_dtype, "nt", epilogue=self.epilogue, promoted=True,
                         hi_lo=True)
        object.__setattr__(self, "out_dtype", inner.out_dtype)
        object.__setattr__(self, "_inner", inner)

    @classmethod
    def create(cls, n, k, out_dtype=None, layout="nt", *, epilogue=None) -> "Fp32Spec":
        """The spec with out_dtype defaulted as the TF32 GEMM defaults it (fp32; a quantize-on-store epilogue's
        8-bit type)."""
        epilogue = epilogue_mod.canonical(epilogue)
        if out_dtype is None:  # GemmSpec.create's rule for tf32
            out_dtype = epilogue_mod.Epilogue.parse(epilogue).quant_dtype or dtypes.DEFAULT_OUT["tf32"]
        return cls(n, k, out_dtype, layout, epilogue)

    @property
    def inner(self) -> GemmSpec:
        """The TF32 GEMM's spec: (N, K') with K' = 3 Kp over [hi | lo] operands of 2 Kp (hi_lo), layout nt, this
        out_dtype and epilogue."""
        return self._inner

    def inner_at(self, m_hint: int, arch: str) -> GemmSpec:
        """The TF32 GEMM build_fp32 builds at M = m_hint for `arch`: `inner`, or its raw_b form at decode sizes
        (raw_b_applies) where the Hopper family takes it."""
        if raw_b_applies(self, m_hint):
            raw = dataclasses.replace(self._inner, raw_b=True)
            if sm90_tiles.sm90_supports(raw, arch):
                return raw
        return self._inner

    @property
    def k_padded(self) -> int:
        return padded_k(self.k)

    @property
    def k_inner(self) -> int:
        return inner_k(self.k)

    def out_shape(self, m: int) -> tuple[int, int]:
        return self._inner.out_shape(m)

    def scales_out_shape(self, m: int):
        return self._inner.scales_out_shape(m)

    def scale_shapes(self, m: int) -> None:
        return None

    @property
    def n_out(self) -> int:
        return self._inner.n_out

    @property
    def epi(self) -> "epilogue_mod.Epilogue":
        return self._inner.epi

    @property
    def epilogue_operand_dtype(self) -> str:
        return self._inner.epilogue_operand_dtype

    # What a GemmSpec of 16/32-bit operands says here.
    b_dtype = b_type = property(lambda self: "fp32")
    scaling = property(lambda self: "none")
    fast_accum = is_scaled = promote = grouped = property(lambda self: False)

    @property
    def tag(self) -> str:
        epi = "" if self.epilogue == "none" else "_ep_" + self.epilogue.replace("+", "_")
        return f"gemm_fp32x3{epi}_{self.out_dtype}_{self.layout}_n{self.n}_k{self.k}"


# -- the split kernel ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SplitKernelSpec(OperandLayout):  # the layout letters only (no n, k: a_shape / b_shape do not apply)
    """What a split kernel is compiled for: which operands are K-major (from the caller's layout). Sizes,
    pointers and row strides are run-time arguments, and so is alignment (a 16-byte load where a chunk's
    address allows it, tested per chunk)."""

    layout: str = "nt"

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r} is not one of {', '.join(LAYOUTS)}")

    @property
    def entry(self) -> str:
        return "dgjit_split_tf32"

    @property
    def tag(self) -> str:
        return f"split_tf32_{self.layout}"


@dataclass(frozen=True)
class SplitArtifact(jit.BuiltKernel):
    """A compiled split kernel: the cached cubin and what it was built for."""

    spec: SplitKernelSpec
    arch: str


_family: jit.KernelFamily[SplitArtifact] = jit.KernelFamily(_TEMPLATE, SplitArtifact, "split_spec",
                                                             extra_meta={"num_threads": NUM_THREADS})


def render_kernel(spec: SplitKernelSpec) -> RenderedSource:
    return _family.render(spec)


def get_kernel(spec: SplitKernelSpec, arch: str) -> SplitArtifact:
    """The split kernel of `spec` for `arch`: from the in-process memo, the disk cache, or NVRTC (once)."""
    return _family.get(spec, arch)


def clear_memo() -> None:
    _family.clear()


def kernel_symbols(artifact: SplitArtifact) -> dict[str, int]:
    """The sizes the compiled kernel defines (read from the cubin on the host)."""
    return cubin.entry_symbols(artifact.cubin, artifact.entry, SYMBOLS)


def check_symbols(artifact: SplitArtifact) -> None:
    """This module's mirror of the tile sizes must be the kernel's (a mismatch is a bug, caught before launch)."""
    sym = kernel_symbols(artifact)
    mirror = {"num_threads": NUM_THREADS, "tile_rows": TILE_ROWS, "tile_cols": TILE_COLS, "k_align": K_ALIGN,
              "num_segments": NUM_SEGMENTS}
    if sym != mirror:
        raise RuntimeError(f"{artifact.entry} ({artifact.spec.tag}) exports {sym}, fp32x3.py mirrors {mirror}")


def num_tiles(rows: int, k: int) -> int:
    """Blocks the split kernel spends on an operand of `rows` rows (of K columns)."""
    return -(-rows // TILE_ROWS) * -(-padded_k(k) // TILE_COLS)


def split_grid(m: int, n: int, k: int) -> tuple[int, int, int]:
    """The split kernel's grid: A's tiles, then B's."""
    blocks = num_tiles(m, k) + num_tiles(n, k)
    if blocks > _MAX_GRID:
        raise ValueError(f"M={m}, N={n}, K={k}: the split needs {blocks} blocks, more than one launch takes "
                         f"({_MAX_GRID})")
    return (blocks, 1, 1)


# -- the model of the split (NumPy or CuPy arrays; the device code computes the same bits) ---------------------

_EXPONENT, _QUIET, _TF32_MASK = 0x7F800000, 0x00400000, 0xFFFFE000


def _xp(x):
    return np if isinstance(x, np.ndarray) else __import__("cupy")


def round_tf32(x):
    """float32 `x` rounded to the nearest TF32 value, ties away from zero (``cvt.rna.tf32.f32``): the 13 low
    mantissa bits become 0; non-finite values keep their bits."""
    xp = _xp(x)
    bits = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    rounded = (bits + xp.uint32(0x1000)) & xp.uint32(_TF32_MASK)
    return xp.where((bits & xp.uint32(_EXPONENT)) != _EXPONENT, rounded, bits).view(xp.float32)


def tf32_nearest(x):
    """float32 `x` as the TF32 value the kernels that round to TF32 feed the tensor cores (dgjit/common.cuh
    ``tf32_nearest``: the portable kernel, gemv_kn, and the split pre-pass's hi before its NaN fix): round_tf32's
    nearest, ties away from zero, except that a finite x within half a TF32 ulp of FLT_MAX is truncated (rna would
    give inf). inf stays inf; a NaN whose payload sits only in the dropped bits becomes inf (the tensor cores read
    raw FP32 bits the same way)."""
    xp = _xp(x)
    bits = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    magnitude = bits & xp.uint32(0x7FFFFFFF)
    r = xp.where(magnitude < xp.uint32(0x7F7FF000), bits + xp.uint32(0x1000), bits)
    return (r & xp.uint32(_TF32_MASK)).view(xp.float32)


def split_reference(x):
    """(hi, lo) of float32 `x` exactly as the split kernel makes them (see the module docstring and
    dgjit/split_tf32.cuh): both TF32 values, hi + lo within 2^-22 |x| of x."""
    xp = _xp(x)
    x = xp.ascontiguousarray(x, dtype=xp.float32)
    bits = x.view(xp.uint32)
    nonfinite = (bits & xp.uint32(_EXPONENT)) == _EXPONENT
    is_nan = (bits & xp.uint32(0x7FFFFFFF)) > xp.uint32(_EXPONENT)
    hi_bits = tf32_nearest(x).view(xp.uint32)
    hi = xp.where(is_nan, hi_bits | xp.uint32(_QUIET), hi_bits).view(xp.float32)   # a NaN stays a NaN in TF32
    zero = xp.float32(0)
    lo = round_tf32(xp.where(nonfinite, zero, x) - xp.where(nonfinite, zero, hi))
    return hi, lo


def split_operand_reference(x_rk, lo_segment: int):
    """The (R, 2 Kp) operand the kernel writes for the logical (R, K) float32 matrix `x_rk`: segments of hi (lo in
    `lo_segment`), each zero past K. A2: lo_segment LO_SEGMENT_A; B2: LO_SEGMENT_B."""
    xp = _xp(x_rk)
    rows, k = x_rk.shape
    kp = padded_k(k)
    hi, lo = split_reference(x_rk)
    out = xp.zeros((rows, NUM_SEGMENTS * kp), dtype=xp.float32)
    for seg in range(NUM_SEGMENTS):
        out[:, seg * kp:seg * kp + k] = lo if seg == lo_segment else hi
    return out


def hi_lo_product_reference(a2, b2):
    """float64 A_hi B_hi^T + A_hi B_lo^T + A_lo B_hi^T of split operands [hi | lo] (R, 2 Kp): what the TF32 GEMM
    (GemmSpec.hi_lo) sums, exactly."""
    xp = _xp(a2)
    kp = a2.shape[1] // NUM_SEGMENTS
    ah, al = a2[:, :kp].astype(xp.float64), a2[:, kp:].astype(xp.float64)
    bh, bl = b2[:, :kp].astype(xp.float64), b2[:, kp:].astype(xp.float64)
    return ah @ bh.T + ah @ bl.T + al @ bh.T


def split_operands_reference(spec: Fp32Spec, a, b):
    """(A2, B2) of stored operands a and b of `spec`'s layout: what ``Fp32Gemm.split`` returns."""
    a_mk = a if spec.a_k_major else a.T
    b_nk = b if spec.b_k_major else b.T
    return split_operand_reference(a_mk, LO_SEGMENT_A), split_operand_reference(b_nk, LO_SEGMENT_B)


# -- the GEMM --------------------------------------------------------------------------------------------------

class Fp32Gemm:
    """An FP32-accurate GEMM (3xTF32): call it on float32 device arrays of any M.

    Contract as :class:`deepgemm_jit.Gemm`'s for its layout (``nt``: a (M, K), b (N, K) -> d (M, N) = a @ b.T;
    ``nn``: b (K, N); ``tn``: a (K, M), b (K, N); ``tt``: a (K, M), b (N, K)): a and b float32 (CuPy arrays,
    torch CUDA tensors or any CUDA array interface / DLPack producer), unit stride along their last dimension,
    any row stride; d has ``spec.out_dtype`` (fp32 by default); ``out=``, ``stream=`` and the fused epilogue's
    operands (``bias=``, ``c=``, ``residual=``, ``alpha=``/``beta=``, ``quant_scale=``, ``amax_out=``,
    ``scales_out=``) as for ``Gemm``. No scales (``scale_a``/``scale_b`` must be None). Every argument is checked
    before anything is launched. The call allocates two workspaces of M x 2Kp and N x 2Kp floats (Kp = K
    rounded up to 32; only the first when ``raw_b``: the GEMM reads b itself, see RAW_B_MAX_M) from the caller's
    library's pool, for the call's stream, and returns them to it when it returns (the pools keep freed blocks
    per stream, so the stream's own order protects them).

    Example::

        g = deepgemm_jit.build_fp32(4096, 4096, 4096)
        d = g(a, b)               # a (M, 4096), b (4096, 4096) float32 -> d (M, 4096) float32, ~FP32 accurate
    """

    def __init__(self, spec: Fp32Spec, arch: str, m_hint: int, gemm, split_artifact: SplitArtifact):
        self.spec = spec
        self.arch = arch
        self.m_hint = m_hint
        self.gemm = gemm                      # the TF32 Gemm over K' = 3 Kp, operands 2 Kp (api.Gemm)
        self.raw_b = gemm.spec.raw_b          # the Gemm reads the caller's b itself; only a is split
        self.split_artifact = split_artifact
        self.config = gemm.config
        self.artifact = gemm.artifact
        self.weight_streaming_max_m = 0       # no decode kernel: M <= 16 runs the same two launches
        self._out_dtypes = ((dtypes.numpy_dtype(spec.out_dtype),) +
                            ((np.dtype(np.uint8),) if spec.out_dtype in dtypes.FP8_DTYPES else ()))
        self._ready_devices: set[int] = set()
        self._checked_symbols = False
        self._plans: dict[tuple, _CallPlan] = {}

    @property
    def family(self) -> str:
        """The family of the TF32 GEMM that does the arithmetic ("sm90" or "sm80")."""
        return self.gemm.family

    def __repr__(self) -> str:
        return (f"Fp32Gemm({self.spec.tag}, 3xTF32: {self.spec.inner.tag} {self.config.tag}, "
                f"{self.split_artifact.spec.tag}, arch={self.arch})")

    # -- validation -------------------------------------------------------------
    def _operands(self, a, b, out) -> tuple[int, MatrixView, MatrixView, MatrixView | None]:
        spec = self.spec
        va = matrix_view(a, "a")
        vb = matrix_view(b, "b")
        for view, arg in ((va, "a"), (vb, "b")):
            if view.dtype != np.float32:
                raise TypeError(f"{arg} has dtype {view.dtype}, but this FP32 GEMM (3xTF32) takes float32")
        m, a_k = (va.rows, va.cols) if spec.a_k_major else (va.cols, va.rows)
        if a_k != spec.k:
            raise ValueError(f"a has shape {(va.rows, va.cols)}; layout {spec.layout!r} wants a "
                             f"{'(M, K)' if spec.a_k_major else '(K, M)'} with K={spec.k}")
        if (vb.rows, vb.cols) != spec.b_shape():
            raise ValueError(f"b has shape {(vb.rows, vb.cols)}; layout {spec.layout!r} wants b "
                             f"{'(N, K)' if spec.b_k_major else '(K, N)'} = {spec.b_shape()}")
        if m > _MAX_M:
            raise ValueError(f"M={m} (rows of a) is larger than supported ({_MAX_M})")
        if vb.device != va.device:
            raise ValueError(f"a is on device {va.device} but b is on device {vb.device}")
        vd = out_view(out, self._out_dtypes, f"{self._out_dtypes[0]} ({spec.out_dtype})", spec.out_shape(m), va, vb)
        return m, va, vb, vd

    def _check_epilogue_operands(self, m: int, va: MatrixView, vb: MatrixView, vd: MatrixView | None,
                                 ops: dict) -> None:
        """The TF32 Gemm's own checks of the epilogue's operands, run here before the split is launched (the Gemm
        runs them again when it is called on the split operands; they are host-side and cheap), the written ones
        also against the caller's a and b (read by the split; a raw-B GEMM reads b itself)."""
        inner = self.gemm
        checked = inner._epilogue_operands(m, va, vd, ops["bias"], ops["c"], ops["residual"], ops["alpha"],
                                           ops["beta"])
        quant = (ops["quant_scale"], ops["amax_out"], ops["scales_out"])
        if self.spec.epi.quant != "none" or any(x is not None for x in quant):
            reads = {"a": va, "b": vb, "bias": checked.bias_view, "c": checked.c, "residual": checked.residual}
            inner._quant_operands(m, va, vd, checked, *quant, reads)

    # -- the split ------------------------------------------------------------------
    def _split_launch(self, m: int, va: MatrixView, vb: MatrixView, dev: int, split_b: bool) -> "_SplitLaunch | None":
        """The split kernel's launch for these operands with the workspace pointers left open (None for M = 0, where
        nothing is launched). split_b False (raw_b GEMMs): the launch covers A's tiles only."""
        if m == 0:
            return None
        spec = self.spec
        artifact = self.split_artifact
        if not self._checked_symbols:
            check_symbols(artifact)
            self._checked_symbols = True
        grid = split_grid(m, spec.n, spec.k) if split_b else (num_tiles(m, spec.k), 1, 1)
        kernel = runtime.loaded_kernel(artifact, dev, 0)
        args = runtime.ArgTemplate(
            (np.uint64(va.ptr), np.int64(va.row_stride), np.uint64(vb.ptr), np.int64(vb.row_stride), np.uint64(0),
             np.uint64(0), np.uint32(m), np.uint32(spec.n), np.uint32(spec.k), np.uint32(spec.k_padded)),
            slots=(4, 5))
        return _SplitLaunch(kernel, kernel.bind(grid, (NUM_THREADS, 1, 1)), args)

    def _split(self, m: int, launch: "_SplitLaunch | None", dev: int, cu_stream, kind: str, explicit: bool,
               split_b: bool = True):
        """(A2, B2): new (M, 2Kp) and (N, 2Kp) float32 arrays ([hi | lo]) of library `kind` (CuPy for anything but
        torch), allocated for `cu_stream`, and the split of a and b written into them on it by `launch`
        (_split_launch of the same split_b). split_b False (raw_b GEMMs): only A2 (B2 is None)."""
        spec = self.spec
        alloc_kind = "torch" if kind == "torch" else "cupy"
        a2, a2_ptr = _stream_array(alloc_kind, spec.inner.a_shape(m), "fp32", dev, cu_stream, explicit)
        b2, b2_ptr = (_stream_array(alloc_kind, spec.inner.b_shape(), "fp32", dev, cu_stream, explicit) if split_b
                      else (None, 0))
        runtime.keep_while_captured(alloc_kind, cu_stream, a2, b2)  # a captured graph replays into them
        if launch is not None:
            launch.kernel.launch(None, None, launch.args.fill(a2_ptr, b2_ptr), cu_stream, bound=launch.bound)
        if kind == "other":  # the Gemm takes a, b and out from one library: present A2 and B2 as out is presented
            return _InterfaceView(a2), None if b2 is None else _InterfaceView(b2)
        return a2, b2

    def _prepare(self, a, b, out, stream, ops: dict, key: tuple | None):
        """Everything checked, then (A2, B2, out, CuPy stream) with the split launched; `key` (operand signatures of
        a call with out=, see __call__): the plan that later calls with the same key replay."""
        kind = _common_kind(a, b, out)
        m, va, vb, vd = self._operands(a, b, out)
        self._check_epilogue_operands(m, va, vb, vd, ops)
        dev = device.device_for_call(self.arch, self._ready_devices, va.device, "Fp32Gemm")
        cu_stream = runtime.stream_for(kind, stream, dev)
        if out is None:
            out = new_array(kind, self.spec.out_shape(m), self.spec.out_dtype, dev, cu_stream, stream is not None)
        plan = _CallPlan(m, dev, kind, array_kind(out), self._split_launch(m, va, vb, dev, not self.raw_b))
        if key is not None and None not in key:
            if len(self._plans) >= _MAX_CALL_PLANS:
                self._plans.clear()
            self._plans[key] = plan
        return self._run_split(plan, b, stream, cu_stream) + (out, cu_stream)

    def _run_split(self, plan: "_CallPlan", b, stream, cu_stream) -> tuple:
        """(A2, B2) of a call: the split launched on cu_stream into new workspaces (B2 is b itself for raw_b)."""
        a2, b2 = self._split(plan.m, plan.split, plan.device_id, cu_stream, plan.out_kind, stream is not None,
                             split_b=not self.raw_b)
        if not self.raw_b:
            return a2, b2
        # The TF32 Gemm takes a, b and out from one library: b of another producer goes with an out allocated
        # here (CuPy) as a CuPy view of its memory (no copy).
        return a2, _cupy_view(b) if plan.kind == "other" and plan.out_kind == "cupy" else b

    # -- call -----------------------------------------------------------------------
    @runtime.orders_dlpack_imports
    def __call__(self, a, b, *, out=None, stream=None, scale_a=None, scale_b=None, bias=None, c=None,
                 residual=None, alpha=1.0, beta=1.0, quant_scale=None, amax_out=None, scales_out=None):
        """d = op(a) @ op(b) (through the epilogue when there is one), FP32-accurate; returns `out` if given, else
        a new array of the inputs' library (quant_fp8_g128: ``(q, scales)``, as ``Gemm``). Runs on `stream`, else
        on the current stream of the inputs' library."""
        for x, arg in ((scale_a, "scale_a"), (scale_b, "scale_b")):
            if x is not None:
                raise TypeError(f"{arg} was given, but this GEMM (fp32, 3xTF32) takes no scales")
        ops = {"bias": bias, "c": c, "residual": residual, "alpha": alpha, "beta": beta,
               "quant_scale": quant_scale, "amax_out": amax_out, "scales_out": scales_out}
        # A call with out= whose operands have the signatures of an earlier one validates as that one did: its plan
        # (M, device, the split's packed launch) is replayed, as Gemm replays its launch plans. The host time of a
        # call was 87-230 us (H200, bench session 16) against ~11 us for a Gemm, most of it in these checks and
        # in packing the split's arguments; the TF32 Gemm replays its own plan for the workspaces it is given.
        key = None
        if out is not None:
            key = (signature(a), signature(b), signature(out), signature(bias), signature(c), signature(residual),
                   scalar_signature(alpha), scalar_signature(beta), signature(quant_scale), signature(amax_out),
                   signature(scales_out))
            plan = self._plans.get(key) if None not in key else None
            if plan is not None and plan.device_id == device.current_device_id():
                cu_stream = runtime.stream_for(plan.kind, stream, plan.device_id)
                a2, b2 = self._run_split(plan, b, stream, cu_stream)
                return self.gemm(a2, b2, out=out, stream=cu_stream, **ops)
        a2, b2, out, cu_stream = self._prepare(a, b, out, stream, ops, key)
        return self.gemm(a2, b2, out=out, stream=cu_stream, **ops)

    @runtime.orders_dlpack_imports
    def split(self, a, b, *, stream=None):
        """Only the first launch: ``(A2, B2)``, the K-concatenated TF32 operands the GEMM multiplies (new arrays
        of the inputs' library, CuPy for other producers; ``split_operands_reference`` computes the same bits).
        For tests and inspection."""
        kind = _common_kind(a, b, None)
        m, va, vb, _ = self._operands(a, b, None)
        dev = device.device_for_call(self.arch, self._ready_devices, va.device, "Fp32Gemm")
        return self._split(m, self._split_launch(m, va, vb, dev, True), dev, runtime.stream_for(kind, stream, dev),
                           "torch" if kind == "torch" else "cupy", stream is not None)

    def explain(self, *, with_sass: bool = True) -> dict:
        """The TF32 GEMM's description (``Gemm.explain``: family, config, registers, SASS, ...) with this problem's
        spec on top, the split kernel's under ``"split"``, and local/spill bytes summed over both kernels."""
        from .explain import describe

        info = describe(self.gemm, with_sass=with_sass)
        split = describe_split(self.split_artifact, with_sass=with_sass)
        info.update({
            "method": "3xtf32", "spec": dataclasses.asdict(self.spec), "tag": self.spec.tag,
            "inner_spec": info["spec"], "k_padded": self.spec.k_padded, "k_inner": self.spec.k_inner,
            "k_operand": self.spec.inner.operand_k, "raw_b": self.raw_b,
            "split": split,
            "local_bytes": None if info["local_bytes"] is None or split["local_bytes"] is None
            else info["local_bytes"] + split["local_bytes"],
            "spill_bytes": (info["spill_bytes"] or 0) + (split["spill_bytes"] or 0),
        })
        return info


def describe_split(artifact: SplitArtifact, *, with_sass: bool = True) -> dict:
    """Resources of a split kernel, as ``explain.describe`` reports a GEMM's."""
    meta = artifact.meta
    info = {"tag": artifact.spec.tag, "entry": artifact.entry, "cache_key": artifact.key,
            "cubin_bytes": len(artifact.cubin), "num_threads": NUM_THREADS, "tile": [TILE_ROWS, TILE_COLS],
            "registers": meta.get("registers"), "shared_bytes": meta.get("static_smem_bytes", 0),
            "spill_bytes": (meta.get("spill_store_bytes", 0) or 0) + (meta.get("spill_load_bytes", 0) or 0),
            "local_bytes": meta.get("stack_bytes")}
    if with_sass:
        usage = sass.resource_usage(artifact.cubin).get(artifact.entry, {})
        info["registers"] = usage.get("REG", info["registers"])
        info["local_bytes"] = usage.get("LOCAL", 0) + usage.get("STACK", 0)
        info["sass"] = sass.opcode_mix(artifact.cubin)
    return info


_MAX_CALL_PLANS = 64  # kept call plans per Fp32Gemm (as api's launch plans: cleared when full)


@dataclass(frozen=True)
class _SplitLaunch:
    """The split kernel's launch for one set of operands: the loaded kernel, its bound launch arguments and the
    packed kernel arguments with the two workspace pointers open (ArgTemplate slots)."""

    kernel: object
    bound: tuple
    args: object


@dataclass(frozen=True)
class _CallPlan:
    """What a call with out= repeats for operands of the same signatures: M, the device, the arrays' library
    (`kind`, and out's, which the workspaces take), and the split's launch (None for M = 0)."""

    m: int
    device_id: int
    kind: str
    out_kind: str
    split: _SplitLaunch | None


def _cupy_view(x):
    """A CuPy array over the memory of a CUDA-array-interface or DLPack producer's array (no copy; CuPy orders it
    after the producer's stream as each protocol asks)."""
    import cupy

    if hasattr(x, "__cuda_array_interface__"):
        return cupy.asarray(x)
    return cupy.from_dlpack(x)


class _InterfaceView:
    """A CuPy array presented only through ``__cuda_array_interface__`` (no stream: nothing synchronises), so
    that it counts as the same kind of array as an `out` of another CUDA-array-interface producer."""

    def __init__(self, array):
        self.array = array
        self.shape = array.shape
        self.dtype = array.dtype

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": tuple(self.array.shape), "typestr": self.array.dtype.str,
                "data": (int(self.array.data.ptr), False), "strides": tuple(self.array.strides), "version": 3}


def _common_kind(a, b, out) -> str:
    """The array library of the call: a, b (and out) must all come from the same one."""
    kinds = {"a": array_kind(a), "b": array_kind(b)}
    if out is not None:
        kinds["out"] = array_kind(out)
    if len(set(kinds.values())) > 1:
        listed = ", ".join(f"{arg} is {type(x).__module__}.{type(x).__name__}" for arg, x in zip(kinds, (a, b, out)))
        raise TypeError(f"a, b and out must come from the same array library; {listed}")
    return kinds["a"]


def warmup_command_for(spec: Fp32Spec, m_hint: int, arch: str, num_sms: int | None = None) -> str:
    """The ``deepgemm-jit warmup`` line that compiles both kernels of ``build_fp32(m_hint, spec...)`` for `arch`
    (and a GPU of `num_sms` SMs) into the cache (what an offline miss prints):
    ``--shape M:N:K:fp32[:layout[:out_dtype]][:epilogue=EPI]``."""
    from .warmup_sources import target_flags  # (warmup_sources imports this module)

    fields = [str(m_hint), str(spec.n), str(spec.k), "fp32"]
    if spec.out_dtype != Fp32Spec.create(spec.n, spec.k, epilogue=spec.epilogue).out_dtype:
        fields += [spec.layout, spec.out_dtype]
    elif spec.layout != "nt":
        fields.append(spec.layout)
    if spec.epilogue != "none":
        fields.append(f"epilogue={spec.epilogue}")
    return f"deepgemm-jit warmup {target_flags(arch, num_sms)} --shape {':'.join(fields)}"


def build_fp32(M: int, N: int, K: int, *, out_dtype: str | None = None, layout: str = "nt", arch: str | None = None,
               config=None, tune: bool | None = None, epilogue=None) -> Fp32Gemm:
    """Compile (or load from the cache) an FP32-accurate GEMM (3xTF32 on tensor cores) and return it.

    M is a tuning hint (any M works at call time). ``layout`` as in :func:`deepgemm_jit.build` (nt, nn, tn, tt:
    all of them run the same TF32 kernel, the split reads either majorness). ``out_dtype`` (default fp32),
    ``epilogue``, ``config`` (a :class:`KernelConfig` for the TF32 GEMM over K' = 3 * ceil(K/32) * 32) and ``arch``
    (None: the current GPU; ``"sm_90a"`` compiles without one) go to the TF32 GEMM's :func:`deepgemm_jit.build`.
    ``tune=True`` is refused: the tuner judges candidates against a float64 product of their operands, which the
    TF32 GEMM's hi / lo splits are not (DEEPGEMM_JIT_TUNE=1 leaves these builds untuned). Accuracy:
    ||D - D64|| / ||D64|| <= 1e-5 against the float64 product of the float32 inputs (``reference.ERROR_BOUND["fp32"]``).

    Example::

        g = deepgemm_jit.build_fp32(4096, 7168, 2048)
        d = g(a, b)   # a (M, 2048), b (7168, 2048) float32 -> d (M, 7168) float32
    """
    from . import api

    if tune:
        raise ValueError("tune=True is not available for dtype='fp32' (3xTF32): its TF32 GEMM multiplies hi / lo "
                         "splits, which the tuner has no float64 value for; build without tune= (or pass config=)")
    M = api._check_m(M)  # inner_at reads it before build_spec would check it
    if config is not None and not isinstance(config, KernelConfig):  # read below before build_spec would check it
        raise TypeError(f"config must be a deepgemm_jit.KernelConfig or None, got {type(config).__name__}")
    spec = Fp32Spec.create(N, K, out_dtype=out_dtype, layout=layout, epilogue=epilogue)
    try:
        target = device.target_arch(arch)
        inner = spec.inner_at(M, target)
        if config is not None and inner.raw_b and not config.fits(inner, target):
            inner = spec.inner  # a config for the split-B GEMM (e.g. sm80) keeps it at decode sizes too
        gemm = api.build_spec(inner, M, arch=arch, config=config, tune=False, weight_streaming=False)
        split = get_kernel(SplitKernelSpec(spec.layout), gemm.arch)
    except KernelNotCachedError as exc:
        if exc.note is not None:  # build's note (a forced config): no warmup line can plan that kernel
            raise
        target = device.normalize_arch(arch) if arch is not None else exc.arch
        local_sms = device.num_sms() if arch is None else None  # the heuristic chose for this GPU's SMs
        raise exc.with_warmup_command(warmup_command_for(spec, M, target, local_sms)) from None
    if config is None:  # the inner Gemm's later kernels (an amax twin) are planned by this shape's warmup line
        on_gpu = arch is None
        gemm._warmup_command = lambda: warmup_command_for(spec, M, gemm.arch, device.num_sms() if on_gpu else None)
    return Fp32Gemm(spec, gemm.arch, gemm.m_hint, gemm, split)
