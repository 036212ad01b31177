"""The element types the library knows: names users write, storage, C++ spelling.

One table, so that validation, rendering and array checks agree on what
``"bf16"`` means.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str             # canonical name, as in the spec and the cache key
    storage_bytes: int    # bytes per element in memory
    cpp_storage: str      # C++ storage type inside namespace dgjit
    numpy_name: str       # numpy / ml_dtypes name of the storage type
    is_input: bool        # may be a GEMM operand type
    is_output: bool       # may be a GEMM output type

    @property
    def numpy(self) -> np.dtype:
        return numpy_dtype(self.name)


_TABLE = {
    "fp16": DType("fp16", 2, "half_t", "float16", True, True),
    "bf16": DType("bf16", 2, "bfloat16_t", "bfloat16", True, True),
    # TF32 operands are stored as FP32 and rounded to TF32 by the kernel.
    "tf32": DType("tf32", 4, "float32_t", "float32", True, False),
    "fp32": DType("fp32", 4, "float32_t", "float32", False, True),
    # 8-bit operands (Hopper WGMMA k32): FP8 in the OCP formats (E4M3 "fn": no infinities, max 448;
    # E5M2: max 57344), and signed INT8 with INT32 accumulation.
    "fp8_e4m3": DType("fp8_e4m3", 1, "float_e4m3_t", "float8_e4m3fn", True, False),
    "fp8_e5m2": DType("fp8_e5m2", 1, "float_e5m2_t", "float8_e5m2", True, False),
    "int8": DType("int8", 1, "int8_t", "int8", True, False),
    "int32": DType("int32", 4, "int32_t", "int32", False, True),
}

_ALIASES = {
    "float16": "fp16", "half": "fp16", "f16": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32", "float": "fp32", "f32": "fp32",
    "fp8": "fp8_e4m3", "e4m3": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3", "float8_e4m3": "fp8_e4m3",
    "e5m2": "fp8_e5m2", "float8_e5m2": "fp8_e5m2",
    "s8": "int8", "s32": "int32",
}

INPUT_DTYPES = tuple(n for n, d in _TABLE.items() if d.is_input)
# What build(), gemm(), warmup --shape and explain take as dtype: the GemmSpec input types, and fp32, which is not one
# (FP32-accurate GEMMs run a split kernel and a TF32 GEMM: deepgemm_jit/fp32x3.py).
GEMM_DTYPES = INPUT_DTYPES + ("fp32",)
OUTPUT_DTYPES = tuple(n for n, d in _TABLE.items() if d.is_output)
# What an unspecified out_dtype becomes: the input's own type, FP32 for TF32.
DEFAULT_OUT = {"fp16": "fp16", "bf16": "bf16", "tf32": "fp32", "fp8_e4m3": "bf16", "fp8_e5m2": "bf16",
               "int8": "int32"}
FP8_DTYPES = ("fp8_e4m3", "fp8_e5m2")
# Largest finite magnitude of each quantized format (what a scale maps a group's amax to).
QUANT_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0, "int8": 127.0}


# What the decode kernels (gemv.py, gemv_rows.py) multiply: weights and activations of one 16-bit type, or FP8 of
# either format with tensor / row / block scales; and what they write.
DECODE_WEIGHT_DTYPES = ("bf16", "fp16", "fp8_e4m3", "fp8_e5m2")
DECODE_OUT_DTYPES = ("bf16", "fp16", "fp32")
DECODE_SCALINGS = ("none", "tensor", "row", "block")


def check_decode_types(w_dtype: str, x_dtype: str, out_dtype: str, scaling: str) -> None:
    """ValueError naming the argument unless a decode kernel takes these types (see DECODE_WEIGHT_DTYPES)."""
    for arg, value in (("w_dtype", w_dtype), ("x_dtype", x_dtype)):
        if value not in DECODE_WEIGHT_DTYPES:
            raise ValueError(f"{arg}={value!r} is not one of {', '.join(DECODE_WEIGHT_DTYPES)}")
    fp8 = w_dtype in FP8_DTYPES
    if fp8 != (x_dtype in FP8_DTYPES) or (not fp8 and w_dtype != x_dtype):
        raise ValueError(f"w_dtype={w_dtype!r} and x_dtype={x_dtype!r}: both 16-bit of one type, or both FP8")
    if out_dtype not in DECODE_OUT_DTYPES:
        raise ValueError(f"out_dtype={out_dtype!r} is not one of {', '.join(DECODE_OUT_DTYPES)}")
    if scaling not in DECODE_SCALINGS or fp8 == (scaling == "none"):
        raise ValueError(f"scaling={scaling!r}: FP8 takes tensor, row or block scales, 16-bit none")


def is_quantized(name: str) -> bool:
    """8-bit operand types, which carry scales (FP8) or integer accumulation (INT8)."""
    return name in FP8_DTYPES or name == "int8"


def canonical(name: object, *, arg: str, allowed: tuple[str, ...]) -> str:
    """The canonical name of a dtype the user wrote, or a ValueError naming `arg`."""
    if not isinstance(name, str):
        raise TypeError(f"{arg} must be a string such as {allowed[0]!r}, got {type(name).__name__}")
    key = name.lower()
    key = _ALIASES.get(key, key)
    if key not in allowed:
        raise ValueError(f"{arg}={name!r} is not supported; choose one of {', '.join(allowed)}")
    return key


def get(name: str) -> DType:
    return _TABLE[name]


def numpy_dtype(name: str) -> np.dtype:
    """NumPy dtype of the storage of `name` (bf16 needs the ml_dtypes package)."""
    npname = _TABLE[name].numpy_name
    if npname in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes  # CuPy's bfloat16 arrays are ml_dtypes.bfloat16 arrays

        return np.dtype(getattr(ml_dtypes, npname))
    return np.dtype(npname)


def storage_name_of(dtype: np.dtype) -> str | None:
    """Which storage names (fp16/bf16/fp32) a NumPy dtype is, or None."""
    dt = np.dtype(dtype)
    if dt == np.float16:
        return "fp16"
    if dt == np.float32:
        return "fp32"
    if dt.name == "bfloat16":
        return "bf16"
    if dt.name == "float8_e4m3fn":
        return "fp8_e4m3"
    if dt.name == "float8_e5m2":
        return "fp8_e5m2"
    if dt == np.int8:
        return "int8"
    if dt == np.int32:
        return "int32"
    return None
