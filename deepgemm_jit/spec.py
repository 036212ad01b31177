"""The problem a kernel is compiled for: a frozen, hashable, validated value.

M is deliberately absent: it is a run-time argument of every kernel, so one
compiled kernel serves every M.
"""
from __future__ import annotations

import functools

import operator
from dataclasses import dataclass

from . import dtypes
from . import epilogue as epilogue_mod

LAYOUTS = ("nt", "nn", "tn", "tt")
# BLAS-style letters: the first says how A is stored, the second how B is.
# A: "n" -> a is (M, K) row-major (K contiguous); "t" -> a is (K, M).
# B: "t" -> b is (N, K) row-major (K contiguous, like nn.Linear weights);
#    "n" -> b is (K, N).
# D is always (M, N) row-major.

SCALINGS = ("none", "tensor", "row", "block")
# What scale factors an 8-bit GEMM takes (x = q * s, FP32):
#   tensor: scale_a (1,), scale_b (1,);  row: scale_a (M,) per row of A, scale_b (N,) per row of B (the
#   (N, K) weight), i.e. per output column;  block (FP8 only): scale_a (M, ceil(K/128)) per 1x128 group of
#   A along K, scale_b (ceil(N/128), ceil(K/128)) per 128x128 block of B.
DEFAULT_SCALING = {"fp8_e4m3": "block", "fp8_e5m2": "block", "int8": "none"}

# hi_lo specs: K is 3 segments of whole 32-wide TF32 K blocks.
HI_LO_K_STEP = 96

# N tiles go on grid dimension y (at most 65535 blocks), which bounds N.
MAX_N = 65535 * 64
MAX_DIM = 2**31 - 1


def _check_dim(value: object, arg: str, upper: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{arg} must be an integer, got bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{arg} must be an integer, got {type(value).__name__}") from None
    if v < 1:
        raise ValueError(f"{arg} must be >= 1, got {v}")
    if v > upper:
        raise ValueError(f"{arg}={v} is larger than supported ({upper})")
    return v


class OperandLayout:
    """What the layout letters say about the operands (``nt``: A (M, K), B (N, K); see ``Gemm``), for every spec
    with a ``layout`` (and ``n``, ``k`` for the shapes)."""

    layout: str
    n: int
    k: int

    @property
    def a_k_major(self) -> bool:
        return self.layout[0] == "n"

    @property
    def b_k_major(self) -> bool:
        return self.layout[1] == "t"

    @property
    def operand_k(self) -> int:
        """The K extent of the stored operands: K (GemmSpec.hi_lo operands hold fewer columns than the K loop)."""
        return self.k

    def a_shape(self, m: int) -> tuple[int, int]:
        return (m, self.operand_k) if self.a_k_major else (self.operand_k, m)

    def b_shape(self) -> tuple[int, int]:
        return (self.n, self.operand_k) if self.b_k_major else (self.operand_k, self.n)


@dataclass(frozen=True)
class GemmSpec(OperandLayout):
    n: int
    k: int
    dtype: str = "bf16"
    out_dtype: str = "bf16"
    layout: str = "nt"
    b_dtype: str | None = None   # B's type when it differs from A's (FP8 E4M3 x E5M2); None = dtype
    scaling: str = "none"        # see SCALINGS; "none" for 16/32-bit types and unscaled INT8
    fast_accum: bool = False     # FP8 tensor/row: accumulate through K without FP32 promotion
    epilogue: str = "none"       # canonical text of the fused epilogue (see epilogue.py); "none" = plain store
    grouped: bool = False        # grouped GEMM (mixture of experts, grouped.py): B is (G, N, K), A the groups' rows
    # TF32: add each K block's partial sums into FP32 registers on the CUDA cores instead of accumulating through K
    # in the tensor cores, whose additions truncate (3xTF32's error grew linearly with K without it: 1.7e-4 at
    # K = 16384 on the H200). FP8 is always promoted unless fast_accum.
    promoted: bool = False
    # 3xTF32's inner GEMM (fp32x3.py): A and B are stored as [hi | lo], 2/3 of K columns each (K = 3 Kp); the kernel
    # multiplies K block 3j + s as (hi, hi), (hi, lo), (lo, hi) of block j, so hi is stored once and its second read
    # follows the first by a K block or two (from L2) instead of a third copy read from DRAM.
    hi_lo: bool = False
    # hi_lo with B the caller's raw FP32 weight, (N, K / 3): the kernel reads block j of it as B_hi (the tensor cores
    # truncate FP32 to TF32), its converter warps write B_lo beside it in shared memory, and one stage serves all
    # three products of block j (gemm_sm90.cuh, kRawB), so the weight is read once and never split into a
    # workspace. sm90 only.
    raw_b: bool = False

    def __post_init__(self):
        object.__setattr__(self, "n", _check_dim(self.n, "N", MAX_N))
        object.__setattr__(self, "k", _check_dim(self.k, "K", MAX_DIM))
        object.__setattr__(self, "dtype", dtypes.canonical(self.dtype, arg="dtype", allowed=dtypes.INPUT_DTYPES))
        object.__setattr__(self, "epilogue", epilogue_mod.canonical(self.epilogue))
        # Quantize-on-store writes its 8-bit type (and only it); no other GEMM writes FP8 or INT8.
        quant_out = self.epi.quant_dtype
        object.__setattr__(
            self, "out_dtype",
            dtypes.canonical(self.out_dtype, arg="out_dtype",
                             allowed=dtypes.OUTPUT_DTYPES + ((quant_out,) if quant_out else ())))
        if quant_out is not None and self.out_dtype != quant_out:
            raise ValueError(f"out_dtype={self.out_dtype!r}: epilogue={self.epilogue!r} writes {quant_out} "
                             "(leave out_dtype unset)")
        if not isinstance(self.layout, str) or self.layout.lower() not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r} is not supported; choose one of {', '.join(LAYOUTS)}")
        object.__setattr__(self, "layout", self.layout.lower())
        b_dtype = self.dtype if self.b_dtype is None else dtypes.canonical(
            self.b_dtype, arg="b_dtype", allowed=dtypes.INPUT_DTYPES)
        object.__setattr__(self, "b_dtype", b_dtype)
        if not isinstance(self.scaling, str) or self.scaling.lower() not in SCALINGS:
            raise ValueError(f"scaling={self.scaling!r} is not supported; choose one of {', '.join(SCALINGS)}")
        object.__setattr__(self, "scaling", self.scaling.lower())
        if not isinstance(self.fast_accum, bool):
            raise TypeError(f"fast_accum must be a bool, got {type(self.fast_accum).__name__}")
        if self.epilogue != "none":
            if self.dtype == "int8" and self.scaling == "none":
                raise ValueError(f"epilogue={self.epilogue!r} needs a floating output; unscaled int8 writes int32 "
                                 "(use scaling='row' or 'tensor' with out_dtype bf16/fp16/fp32)")
            if self.out_dtype == "int32":  # unscaled int8's output only: the type rules below say what fits
                self._check_quantized()
                raise ValueError(f"epilogue={self.epilogue!r} needs a floating output, not out_dtype='int32'")
            if self.layout != "nt" and self.dtype not in ("bf16", "fp16", "tf32"):  # tf32: transposed copies
                raise ValueError(f"epilogue={self.epilogue!r} runs on the Hopper family, which reads {self.dtype} "
                                 f"operands K-major only: layout 'nt' (a (M, K), b (N, K)), got {self.layout!r} "
                                 "(MN-major layouts nn/tn/tt with epilogues are bf16/fp16/tf32 only)")
            self._check_fused()
        self._check_quantized()
        if not isinstance(self.grouped, bool):
            raise TypeError(f"grouped must be a bool, got {type(self.grouped).__name__}")
        if not isinstance(self.promoted, bool):
            raise TypeError(f"promoted must be a bool, got {type(self.promoted).__name__}")
        if self.promoted and self.dtype != "tf32":
            raise ValueError(f"promoted=True applies to tf32 (FP8 is promoted unless fast_accum); got dtype {self.dtype!r}")
        if self.grouped:
            self._check_grouped()
        if not isinstance(self.hi_lo, bool):
            raise TypeError(f"hi_lo must be a bool, got {type(self.hi_lo).__name__}")
        if self.hi_lo and not (self.dtype == "tf32" and self.promoted and self.layout == "nt" and not self.grouped
                               and self.k % HI_LO_K_STEP == 0):
            raise ValueError(f"hi_lo=True is the inner GEMM of fp32 (3xTF32): dtype tf32, promoted, layout nt, not "
                             f"grouped, K a multiple of {HI_LO_K_STEP}; got dtype {self.dtype!r}, promoted "
                             f"{self.promoted}, layout {self.layout!r}, K={self.k}")
        if not isinstance(self.raw_b, bool):
            raise TypeError(f"raw_b must be a bool, got {type(self.raw_b).__name__}")
        if self.raw_b and not self.hi_lo:
            raise ValueError("raw_b=True is a mode of the hi_lo GEMM (3xTF32's inner GEMM): set hi_lo=True")

    @property
    def operand_k(self) -> int:
        """The K extent of the stored operands: 2/3 of K for hi_lo ([hi | lo] of each K segment), else K."""
        return 2 * self.k // 3 if self.hi_lo else self.k

    @property
    def loop_k(self) -> int:
        """The K the kernel's loop walks in block_k steps (split-K shares divide it): K / 3 for raw_b, whose
        stages each hold a raw K block's three products, else K."""
        return self.k // 3 if self.raw_b else self.k

    def b_shape(self) -> tuple[int, int]:
        """B as stored: raw_b takes the FP32 weight itself, (N, K / 3); otherwise (N, operand_k) / (operand_k, N)."""
        return (self.n, self.k // 3) if self.raw_b else super().b_shape()

    def _check_grouped(self) -> None:
        """What the grouped kernel takes: layout nt, BF16/FP16 or FP8 with block scales, no C / residual."""
        if self.layout != "nt":
            raise ValueError(f"grouped GEMMs take layout 'nt' (a (M, K), b (G, N, K)), got {self.layout!r}")
        if self.dtype not in ("bf16", "fp16") + dtypes.FP8_DTYPES:
            raise ValueError(f"grouped GEMMs take dtype bf16, fp16 or fp8 (block scales), got {self.dtype!r}")
        if self.dtype in dtypes.FP8_DTYPES and self.scaling != "block":
            raise ValueError(f"grouped FP8 GEMMs take scaling='block' (per-group 128x128 scales of B), got "
                             f"{self.scaling!r}")
        epi = self.epi
        if epi.beta or epi.residual or epi.has_static_scale or epi.bias == "row":
            raise ValueError(f"epilogue={self.epilogue!r}: grouped GEMMs take bias (per group and column), "
                             "activations, swiglu/geglu and quant_fp8_g128, not beta (C), a residual, per-tensor "
                             "quantization or bias_row")

    def _check_fused(self) -> None:
        """Gated units and quantize-on-store: the shapes and type pairs their tiles can compute."""
        epi = self.epi
        if epi.is_gated and self.n % 16:
            raise ValueError(f"N={self.n}: epilogue={self.epilogue!r} needs N (the rows of the interleaved gate/up "
                             "weight, twice the output columns) to be a multiple of 16 (see interleave_gate_up)")
        if epi.is_gated and epi.has_group_scales and self.promote:
            if self.hi_lo:  # dtype='fp32' (3xTF32) needs its promotion: the caller cannot turn it off
                fix = "dtype='tf32' (no FP32 promotion) or a 16-bit input type"
            elif self.dtype == "tf32":
                fix = "promoted=False, a 16-bit input type"
            else:
                fix = "fast_accum=True (scaling tensor/row), a 16-bit input type"
            raise ValueError(f"epilogue={self.epilogue!r} needs tiles of 256 weight rows (128 output columns per "
                             f"1x128 group), more accumulators than {self.dtype} with FP32 promotion can hold; use "
                             f"{fix}, or quantize separately")

    @property
    def epi(self) -> "epilogue_mod.Epilogue":
        return _parsed_epilogue(self.epilogue)

    def _check_quantized(self) -> None:
        """The 8-bit rules: which scalings, output types, layouts and type pairs go together."""
        a, b, out, scaling = self.dtype, self.b_dtype, self.out_dtype, self.scaling
        if not dtypes.is_quantized(a):
            if b != a:
                raise ValueError(f"b_dtype={b!r} differs from dtype={a!r}; only FP8 mixes E4M3 and E5M2")
            if scaling != "none":
                raise ValueError(f"scaling={scaling!r} applies to fp8/int8 operands, not {a}")
            if out == "int32":
                raise ValueError(f"out_dtype='int32' is the output of unscaled int8 GEMMs, not {a}")
            if self.fast_accum:
                raise ValueError("fast_accum applies to fp8 operands only")
            return
        if self.layout != "nt":
            raise ValueError(f"{a} GEMMs need layout 'nt' (a (M, K) and b (N, K), both K-contiguous: Hopper's "
                             f"8-bit tensor-core operands are K-major), got {self.layout!r}")
        if a == "int8":
            if b != "int8":
                raise ValueError(f"b_dtype={b!r}: int8 multiplies int8 by int8")
            if scaling not in ("none", "tensor", "row"):
                raise ValueError(f"scaling={scaling!r} is not available for int8; choose none, tensor or row")
            if (scaling == "none") != (out == "int32"):
                raise ValueError("int8 without scaling writes out_dtype='int32'; with tensor/row scales it writes "
                                 f"fp32/bf16/fp16 (got scaling={scaling!r}, out_dtype={out!r})")
            if self.fast_accum:
                raise ValueError("fast_accum applies to fp8 only (int8 accumulates exactly in int32)")
            return
        if b not in dtypes.FP8_DTYPES:
            raise ValueError(f"b_dtype={b!r}: an fp8 A multiplies an fp8 B (fp8_e4m3 or fp8_e5m2)")
        if scaling == "none":
            raise ValueError("fp8 GEMMs need scaling='tensor', 'row' or 'block'")
        if out == "int32":
            raise ValueError("fp8 GEMMs write out_dtype bf16, fp16 or fp32")
        if self.fast_accum and scaling == "block":
            raise ValueError("fast_accum=True does not apply to scaling='block': block scales are applied "
                             "when partial sums are promoted every 128 K")

    @property
    def b_type(self) -> str:
        return self.b_dtype

    @property
    def promote(self) -> bool:
        """Partial sums are added into FP32 accumulators every K block: FP8 (every 128 K, not with fast_accum) and
        TF32 with promoted=True (every 32 K)."""
        return (self.dtype in dtypes.FP8_DTYPES and not self.fast_accum) or (self.dtype == "tf32" and self.promoted)

    @property
    def is_scaled(self) -> bool:
        return self.scaling != "none"

    def scale_shapes(self, m: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The logical shapes of scale_a and scale_b for M rows (None when the GEMM takes no scales)."""
        kb, nb = -(-self.k // 128), -(-self.n // 128)
        return {"none": None, "tensor": ((1,), (1,)), "row": ((m,), (self.n,)),
                "block": ((m, kb), (nb, kb))}[self.scaling]

    @classmethod
    def create(cls, n, k, dtype="bf16", out_dtype=None, layout="nt", *, b_dtype=None, scaling=None,
               fast_accum=False, epilogue=None, grouped=False, promoted=False) -> "GemmSpec":
        """Spec with defaults filled in: `out_dtype` from `dtype` (fp16->fp16, bf16->bf16, tf32->fp32,
        fp8->bf16, int8->int32 unscaled or bf16 scaled) and `scaling` (fp8: block, int8: none)."""
        in_name = dtypes.canonical(dtype, arg="dtype", allowed=dtypes.INPUT_DTYPES)
        if scaling is None:
            scaling = DEFAULT_SCALING.get(in_name, "none")
        epilogue = epilogue_mod.canonical(epilogue)
        if out_dtype is None:
            out_dtype = dtypes.DEFAULT_OUT[in_name]
            if in_name == "int8" and isinstance(scaling, str) and scaling.lower() != "none":
                out_dtype = "bf16"
            quant_out = epilogue_mod.Epilogue.parse(epilogue).quant_dtype
            if quant_out is not None:  # quantize-on-store writes its own 8-bit type
                out_dtype = quant_out
        return cls(n=n, k=k, dtype=in_name, out_dtype=out_dtype, layout=layout, b_dtype=b_dtype, scaling=scaling,
                   fast_accum=fast_accum, epilogue=epilogue, grouped=grouped, promoted=promoted)

    @property
    def n_out(self) -> int:
        """Columns of D: N, or N / 2 for gated units (gate and up columns are combined)."""
        return self.n // 2 if self.epi.is_gated else self.n

    @property
    def epilogue_operand_dtype(self) -> str:
        """The type of the epilogue's call-time tensors (bias, C, residual): the output's, float32 for the bias
        of a quantized output."""
        return "fp32" if self.epi.quant != "none" else self.out_dtype

    def scales_out_shape(self, m: int) -> tuple[int, int] | None:
        """(M, ceil(N_out / 128)): the group scales quant_fp8_g128 writes (None for other epilogues)."""
        return (m, -(-self.n_out // 128)) if self.epi.has_group_scales else None

    def out_shape(self, m: int) -> tuple[int, int]:
        return (m, self.n_out)

    @property
    def tag(self) -> str:
        types = self.dtype if self.b_dtype == self.dtype else f"{self.dtype}x{self.b_dtype}"
        scaled = "" if self.scaling == "none" else f"_{self.scaling}" + ("_fastacc" if self.fast_accum else "")
        epi = "" if self.epilogue == "none" else "_ep_" + self.epilogue.replace("+", "_")
        grouped = "_grouped" if self.grouped else ""
        promoted = ("_promoted" if self.promoted else "") + ("_hilo" if self.hi_lo else "") + (
            "_rawb" if self.raw_b else "")
        return f"gemm{grouped}_{types}{promoted}{scaled}{epi}_{self.out_dtype}_{self.layout}_n{self.n}_k{self.k}"


@functools.lru_cache(maxsize=1024)
def _parsed_epilogue(text: str) -> "epilogue_mod.Epilogue":
    # The heuristics read spec.epi a few hundred times per build(): parse each canonical string once
    # (Epilogue is frozen, so sharing one instance is safe).
    return epilogue_mod.Epilogue.parse(text)
