"""Fused epilogues: what happens to each output element between the accumulator and the store.

    D = act(alpha * acc + beta * C + bias) + residual          (then cast to out_dtype, or quantized)

in that order (cuBLASLt's order for alpha/beta, bias and activation; the residual is added after the
activation, as a transformer's skip connection is). Every part is optional. ``acc`` already carries the FP8 /
INT8 scales. Written as an :class:`Epilogue` or as a '+'-joined string::

    "bias"            bias per output column (length N), like nn.Linear
    "bias_row"        bias per output row (length M)
    "relu" | "gelu" | "gelu_tanh" | "silu" | "sigmoid"     one activation (gelu is the erf form)
    "residual"        add an (M, N) tensor after the activation
    "beta"            alpha * acc + beta * C, with C (M, N) given at call time (may be `out` itself); beta = 0
                      does not read C (BLAS: C may hold anything, NaN included)

    "swiglu" | "geglu"  gated unit: D = silu(gate) * up  |  gelu(gate) * up    (replaces the activation)
    "quant_fp8_g128"    quantize-on-store: D is FP8 E4M3 q with one float32 scale per 1x128 group of each row
    "quant_fp8_tensor"  quantize-on-store: q = E4M3(x / s) with a static scale s given at call time
    "quant_int8_tensor" quantize-on-store: q = INT8 round(x / s) with a static scale s given at call time

e.g. ``"bias+gelu"``, ``"beta+bias+relu"``, ``"residual"``, ``"bias+gelu+quant_fp8_g128"``,
``"swiglu+quant_fp8_g128"``. The order of the words does not matter; the formula fixes the order of the operations.
Call-time tensors (bias, C, residual) have the output's dtype (float32 for the bias of a quantized output).

Gated units (``swiglu``, ``geglu``): the weight B (N, K) holds the gate and the up projection interleaved in blocks of
8 rows: rows 16c..16c+7 are gate rows 8c..8c+7 and rows 16c+8..16c+15 are up rows 8c..8c+7
(:func:`interleave_gate_up` builds it, :func:`deinterleave_gate_up` undoes it). A tile's accumulators then hold
gate and up of the same output column in the same thread (wgmma's 8-column groups 2i and 2i+1), so the gating is
register-local. D has N/2 columns (N must be a multiple of 16); a bias has the weight's N entries in the same
interleaved order (added to gate and up before the gating); a residual is (M, N/2), added after the gating:
D = act(gate + bias_gate) * (up + bias_up) + residual. ``beta`` (C) does not combine with gated units.

Quantize-on-store (``quant_*``), applied to the float32 value the formula gives (after the gating or
activation), with deepgemm_jit.quantize's contract (quantization.py: one IEEE float32 division x / s,
round to nearest even, saturating; E4M3 for ``quant_fp8_*``):

- ``quant_fp8_g128``: s = amax(|x| over the group) / 448 per row and 128 output columns (an all-zero group gets
  s = 1); the call returns ``(q, scales)``: q (M, N_out) E4M3 and scales (M, ceil(N_out / 128)) float32, exactly the
  A operand (and scale_a) of a ``scaling="block"`` FP8 GEMM. Each tile covers whole groups (output tile width
  128 or 256: the amax is reduced inside the tile), so FP8 inputs with FP32 promotion cannot combine it with a gated
  unit (256 accumulator columns of two sets exceed the registers); quantize those separately or use
  fast_accum=True.
- ``quant_fp8_tensor`` / ``quant_int8_tensor``: static per-tensor scale, ``quant_scale=`` a float32 device array of
  one element, read by the kernel (no host sync); INT8 saturates to [-127, 127]. Optionally ``amax_out=`` (float32
  device scalar) receives max(|x|) over the whole (M, N_out) result by an atomic max: the caller zeroes it first
  (it accumulates over calls otherwise, which delayed-scaling recipes may want). The amax is computed by its own
  kernel, the epilogue's ``amax`` word (``"quant_fp8_tensor+amax"``): a call with ``amax_out=`` on a Gemm built
  without it runs that twin (compiled on first use; warmup plans both), since a run-time test per pair in the one
  kernel cost every call 3-30% (session 58). Built with it, amax_out= may still be left out.

Quantized outputs do not combine with ``beta`` or ``residual`` (their operands would have an 8-bit type).
"""
from __future__ import annotations

from dataclasses import dataclass

ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid")
BIASES = ("none", "col", "row")
GATES = ("none", "swiglu", "geglu")
QUANTS = ("none", "fp8_g128", "fp8_tensor", "int8_tensor")
# Storage type of a quantized output, per quant kind.
QUANT_OUT_DTYPE = {"fp8_g128": "fp8_e4m3", "fp8_tensor": "fp8_e4m3", "int8_tensor": "int8"}
_WORDS = {"bias": ("bias", "col"), "bias_col": ("bias", "col"), "bias_row": ("bias", "row"),
          "residual": ("residual", True), "beta": ("beta", True), "alpha_beta": ("beta", True),
          **{a: ("activation", a) for a in ACTIVATIONS if a != "none"},
          **{g: ("gate", g) for g in GATES if g != "none"},
          **{"quant_" + q: ("quant", q) for q in QUANTS if q != "none"}, "amax": ("amax", True)}
_HINTS = {"quant_fp8": "say quant_fp8_g128 (dynamic 1x128 group scales) or quant_fp8_tensor (static scale)",
          "quant_int8": "say quant_int8_tensor (static scale)"}


@dataclass(frozen=True)
class Epilogue:
    bias: str = "none"          # "none" | "col" (length N) | "row" (length M)
    activation: str = "none"    # one of ACTIVATIONS
    residual: bool = False      # + residual (M, N) after the activation
    beta: bool = False          # alpha * acc + beta * C
    gate: str = "none"          # one of GATES: gated unit over interleaved gate/up columns (D has N/2 columns)
    quant: str = "none"         # one of QUANTS: quantize-on-store
    amax: bool = False          # static-scale quantization: the kernel also max-reduces |x| into amax_out

    def __post_init__(self):
        if self.bias not in BIASES:
            raise ValueError(f"Epilogue bias={self.bias!r}: choose one of {', '.join(BIASES)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"Epilogue activation={self.activation!r}: choose one of {', '.join(ACTIVATIONS)}")
        if self.gate not in GATES:
            raise ValueError(f"Epilogue gate={self.gate!r}: choose one of {', '.join(GATES)}")
        if self.quant not in QUANTS:
            raise ValueError(f"Epilogue quant={self.quant!r}: choose one of {', '.join(QUANTS)}")
        for name in ("residual", "beta", "amax"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Epilogue {name} must be a bool")
        if self.gate != "none" and self.activation != "none":
            raise ValueError(f"epilogue: {self.gate} applies its own activation to the gate; drop "
                             f"{self.activation!r}")
        if self.gate != "none" and self.beta:
            raise ValueError(f"epilogue: beta (C) does not combine with the gated unit {self.gate}")
        if self.amax and not self.has_static_scale:
            raise ValueError("epilogue: amax belongs to a static-scale quantization (quant_fp8_tensor or "
                             "quant_int8_tensor); quant_fp8_g128 writes its scales instead")
        if self.quant != "none" and (self.beta or self.residual):
            raise ValueError(f"epilogue: quant_{self.quant} does not combine with beta or residual (their operands "
                             "would have the quantized 8-bit type)")

    @property
    def is_gated(self) -> bool:
        return self.gate != "none"

    @property
    def quant_dtype(self) -> str | None:
        """The storage type of a quantized output (fp8_e4m3 / int8), None without quantize-on-store."""
        return QUANT_OUT_DTYPE.get(self.quant)

    @property
    def has_group_scales(self) -> bool:
        """The kernel writes (M, ceil(N_out/128)) float32 scales besides q (quant_fp8_g128)."""
        return self.quant == "fp8_g128"

    @property
    def has_static_scale(self) -> bool:
        """The call passes the quantization scale (quant_scale=) and may ask for the amax (amax_out=)."""
        return self.quant in ("fp8_tensor", "int8_tensor")

    @property
    def is_identity(self) -> bool:
        return self == Epilogue()

    @classmethod
    def parse(cls, text: str) -> "Epilogue":
        """'bias+gelu' -> Epilogue(bias='col', activation='gelu'); '' or 'none' -> the identity."""
        if not isinstance(text, str):
            raise TypeError(f"epilogue must be a string such as 'bias+gelu' or an Epilogue, got {type(text).__name__}")
        fields: dict[str, object] = {}
        for word in (w.strip().lower() for w in text.split("+")):
            if word in ("", "none"):
                continue
            if word in _HINTS:
                raise ValueError(f"epilogue {text!r}: {word!r} is ambiguous: {_HINTS[word]}")
            if word not in _WORDS:
                raise ValueError(f"epilogue {text!r}: unknown word {word!r}; known: {', '.join(sorted(_WORDS))}")
            key, value = _WORDS[word]
            if key in fields and fields[key] != value:
                raise ValueError(f"epilogue {text!r}: more than one {key} ({fields[key]!r} and {value!r})")
            fields[key] = value
        return cls(**fields)

    @property
    def text(self) -> str:
        """The canonical string form (parse(text) == self); 'none' for the identity."""
        words = []
        if self.beta:
            words.append("beta")
        if self.bias != "none":
            words.append("bias" if self.bias == "col" else "bias_row")
        if self.activation != "none":
            words.append(self.activation)
        if self.gate != "none":
            words.append(self.gate)
        if self.residual:
            words.append("residual")
        if self.quant != "none":
            words.append("quant_" + self.quant)
        if self.amax:
            words.append("amax")
        return "+".join(words) or "none"


def canonical(epilogue: object) -> str:
    """The canonical string of an Epilogue, a string shorthand or None (-> 'none')."""
    if epilogue is None:
        return "none"
    if isinstance(epilogue, Epilogue):
        return epilogue.text
    return Epilogue.parse(epilogue).text


def _concat(x, y, axis: int):
    """Concatenation in the array library of x (NumPy, CuPy or torch)."""
    root = type(x).__module__.split(".")[0]
    if root == "torch":
        import torch

        return torch.cat((x, y), dim=axis)
    if root == "cupy":
        import cupy

        return cupy.concatenate((x, y), axis=axis)
    import numpy

    return numpy.concatenate((x, y), axis=axis)


def interleave_gate_up(w_gate, w_up):
    """The weight (or bias) of a gated epilogue (swiglu / geglu) from the gate and up projections.

    w_gate, w_up: (N_out, K) weights (or (N_out,) biases) of the same array library (NumPy, CuPy, torch), dtype and
    shape, N_out a multiple of 8. Returns a new (2 * N_out, K) (or (2 * N_out,)) array whose rows 16c..16c+7 are gate
    rows 8c..8c+7 and rows 16c+8..16c+15 are up rows 8c..8c+7: the arrangement that puts a gate column and its up
    column into the same thread's accumulators (see the module docstring).

    >>> w = interleave_gate_up(w1, w3)             # Llama's gate_proj (w1) and up_proj (w3), each (N_out, K)
    >>> g = deepgemm_jit.build(M, w.shape[0], K, epilogue="swiglu")
    >>> h = g(x, w)                                # (M, N_out) = silu(x @ w1.T) * (x @ w3.T)
    """
    g_shape, u_shape = tuple(w_gate.shape), tuple(w_up.shape)
    if g_shape != u_shape:
        raise ValueError(f"w_gate has shape {g_shape} but w_up has shape {u_shape}; they must be equal")
    if len(g_shape) not in (1, 2) or g_shape[0] % 8:
        raise ValueError(f"w_gate has shape {g_shape}: expected (N_out, K) or (N_out,) with N_out a multiple of 8")
    if w_gate.dtype != w_up.dtype:
        raise TypeError(f"w_gate has dtype {w_gate.dtype} but w_up has dtype {w_up.dtype}")
    n, rest = g_shape[0], g_shape[1:]
    blocks = _concat(w_gate.reshape((n // 8, 8) + rest), w_up.reshape((n // 8, 8) + rest), 1)
    return blocks.reshape((2 * n,) + rest)


def deinterleave_gate_up(w):
    """(w_gate, w_up) from an interleaved (2 * N_out, K) weight or (2 * N_out,) bias: the inverse of
    :func:`interleave_gate_up` (views where the array library allows).

    >>> w1, w3 = deinterleave_gate_up(interleave_gate_up(w1, w3))
    """
    shape = tuple(w.shape)
    if len(shape) not in (1, 2) or shape[0] % 16:
        raise ValueError(f"w has shape {shape}: expected (2 * N_out, K) or (2 * N_out,) with 2 * N_out a multiple "
                         "of 16")
    n, rest = shape[0] // 2, shape[1:]
    blocks = w.reshape((n // 8, 2, 8) + rest)
    return blocks[:, 0].reshape((n,) + rest), blocks[:, 1].reshape((n,) + rest)
