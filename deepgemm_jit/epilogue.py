"""Fused epilogues: what happens to each output element between the accumulator and the store.

    D = act(alpha * acc + beta * C + bias) + residual          (then cast to out_dtype)

in that order (cuBLASLt's order for alpha/beta, bias and activation; the residual is added after the
activation, as a transformer's skip connection is). Every part is optional. ``acc`` already carries the FP8 /
INT8 scales. Written as an :class:`Epilogue` or as a '+'-joined string::

    "bias"            bias per output column (length N), like nn.Linear
    "bias_row"        bias per output row (length M)
    "relu" | "gelu" | "gelu_tanh" | "silu" | "sigmoid"     one activation (gelu is the erf form)
    "residual"        add an (M, N) tensor after the activation
    "beta"            alpha * acc + beta * C, with C (M, N) given at call time (may be `out` itself)

e.g. ``"bias+gelu"``, ``"beta+bias+relu"``, ``"residual"``. The order of the words does not matter; the
formula above fixes the order of the operations. Call-time tensors (bias, C, residual) have the output's dtype.
Not yet: gated units (swiglu / geglu) and quantize-on-store (issue 5).
"""
from __future__ import annotations

from dataclasses import dataclass

ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid")
BIASES = ("none", "col", "row")
_WORDS = {"bias": ("bias", "col"), "bias_col": ("bias", "col"), "bias_row": ("bias", "row"),
          "residual": ("residual", True), "beta": ("beta", True), "alpha_beta": ("beta", True),
          **{a: ("activation", a) for a in ACTIVATIONS if a != "none"}}
_LATER = ("swiglu", "geglu", "quant_fp8", "quant_fp8_g128", "quant_int8")


@dataclass(frozen=True)
class Epilogue:
    bias: str = "none"          # "none" | "col" (length N) | "row" (length M)
    activation: str = "none"    # one of ACTIVATIONS
    residual: bool = False      # + residual (M, N) after the activation
    beta: bool = False          # alpha * acc + beta * C

    def __post_init__(self):
        if self.bias not in BIASES:
            raise ValueError(f"Epilogue bias={self.bias!r}: choose one of {', '.join(BIASES)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"Epilogue activation={self.activation!r}: choose one of {', '.join(ACTIVATIONS)}")
        for name in ("residual", "beta"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Epilogue {name} must be a bool")

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
            if word in _LATER:
                raise ValueError(f"epilogue {text!r}: {word!r} is not supported yet (gated units and quantize-on-"
                                 "store come later)")
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
        if self.residual:
            words.append("residual")
        return "+".join(words) or "none"


def canonical(epilogue: object) -> str:
    """The canonical string of an Epilogue, a string shorthand or None (-> 'none')."""
    if epilogue is None:
        return "none"
    if isinstance(epilogue, Epilogue):
        return epilogue.text
    return Epilogue.parse(epilogue).text
