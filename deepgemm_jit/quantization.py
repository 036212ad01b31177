"""Quantization for the FP8/INT8 GEMM: ``quantize`` and ``dequantize``, as JIT kernels.

The contract (the GEMM consumes exactly these layouts):

- Scales are *dequantization* factors, float32: ``x ~= float(q) * s``, s broadcast over its group.
- ``s = amax(|x| over the group) / QUANT_MAX[dtype]`` (448 for E4M3, 57344 for E5M2, 127 for INT8), one
  IEEE float32 division; a group whose scale would be 0 (all zeros) gets ``s = 1``.
- ``q = round(x / s)``: FP8 round-to-nearest-even saturated to the finite range (``cvt.rn.satfinite``),
  INT8 round-half-to-even saturated to [-127, 127]. A true division, so that the float64 reference
  (``reference.quantize_reference``) agrees except for rare one-ulp double-rounding cases.
- Scale shapes, for x of shape (M, K) (see :func:`scale_shape`): ``tensor`` (1,); ``row`` (M,); ``group128``
  (M, ceil(K/128)), 1x128 groups along K, the last one partial when K % 128 != 0; ``block128`` (ceil(M/128),
  ceil(K/128)), 128x128 blocks. INT8 takes ``tensor`` and ``row`` only.
- Scale layouts: quantize returns ``group128`` scales M-major, DeepGEMM's TMA-aligned layout: storage
  (ceil(K/128), round_up(M, 4)) row-major seen as its transpose cut to M rows, element (i, j) at
  base + 4 (i + j round_up(M, 4)), base 16-byte aligned. The FP8 block GEMM bulk-copies A's scales in that
  layout (``launch.bulk_a_scales``; row-major scale_a works, through a slower path); torch's block-scaled
  ``F.scaled_mm`` wants A's scales M-major too (strides exactly (1, M): this layout when M % 4 == 0). The other
  granularities are returned row-major (contiguous). ``out=`` (scales addressing each element once) and
  ``dequantize`` take any non-negative strides, row-major and M-major alike: the kernels get them as arguments.
- A NaN in a group makes that group's scale NaN (and so its q); inputs are expected to be finite.

Data flow as for the GEMM: validate -> :class:`QuantKernelSpec` -> render ``templates/quantize.cu.j2``
-> disk cache or NVRTC (``jit.build_artifact``, the GEMMs' path) -> launch on the caller's stream. Device logic is in
``templates/include/dgjit/quantize.cuh``. Nothing here reads device memory back to the host: the
tensor-wide amax is reduced on the device into a zeroed device word that the quantize kernel reads.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from . import arrays, config, cubin, device, driver, dtypes, jit, runtime
from .arrays import (ScaleView, array_kind, has_distinct_elements, matrix_view, mn_major_storage_shape,
                     mn_major_view, signature)
from .errors import KernelNotCachedError, NoGPUError
from .render import RenderedSource

GRANULARITIES = ("tensor", "row", "group128", "block128")
INT8_GRANULARITIES = ("tensor", "row")
QUANT_DTYPES = ("fp8_e4m3", "fp8_e5m2", "int8")
SOURCE_DTYPES = ("fp32", "fp16", "bf16")  # what is quantized, and what dequantize writes
OPS = ("quantize", "amax", "dequantize")
GROUP = 128  # columns of a group128 group, rows and columns of a block128 block (quant::kGroupCols)

_TEMPLATE = "quantize.cu.j2"
_MAX_DIM = 2**31 - 1   # m and k are 32-bit kernel arguments
_MAX_GRID = 2**31 - 1  # gridDim.x
# Grid-stride kernels (tensor amax, dequantize) need only enough blocks to fill the GPU.
_AMAX_BLOCKS_PER_SM = 8
_DEQUANT_BLOCKS_PER_SM = 32
# C++ enumerators of dgjit::quant (quantize.cuh); the template prints them as identifiers.
_FORMAT_CPP = {"fp8_e4m3": "kE4M3", "fp8_e5m2": "kE5M2", "int8": "kInt8"}
_GRANULARITY_CPP = {"tensor": "kTensor", "row": "kRow", "group128": "kGroup128", "block128": "kBlock128"}
# Sizes each cubin exports as `<entry>_<name>` __constant__ symbols (quantize.cu.j2).
SYMBOLS = ("num_threads", "units_per_block", "group_cols")
# GemmSpec.scaling -> the granularity of A's scales (scale_a), i.e. of the activations' quantize call, and of
# B's (scale_b, the weight's): what quantize must produce for a GEMM of that recipe.
ACTIVATION_GRANULARITY = {"tensor": "tensor", "row": "row", "block": "group128"}
WEIGHT_GRANULARITY = {"tensor": "tensor", "row": "row", "block": "block128"}


def recipe_granularities(scaling: str) -> tuple[str, str]:
    """(A's, B's) quantize granularity for GemmSpec.scaling `scaling`: block -> (group128, block128)."""
    return ACTIVATION_GRANULARITY[scaling], WEIGHT_GRANULARITY[scaling]


def check_granularity(granularity: object, q_dtype: str) -> str:
    """The granularity name, or a ValueError naming the argument (INT8: tensor and row only)."""
    if not isinstance(granularity, str):
        raise TypeError(f"granularity must be a string such as 'group128', got {type(granularity).__name__}")
    value = granularity.lower()
    if value not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} is not supported; choose one of {', '.join(GRANULARITIES)}")
    if q_dtype == "int8" and value not in INT8_GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} is not supported for int8; choose "
                         f"{' or '.join(repr(g) for g in INT8_GRANULARITIES)}")
    return value


def scale_shape(granularity: str, m: int, k: int) -> tuple[int, ...]:
    """Shape of the float32 scales of an (m, k) matrix quantized with `granularity` (layouts: the module docstring).

    >>> scale_shape("group128", 7, 300), scale_shape("block128", 300, 300)
    ((7, 3), (3, 3))
    """
    num_groups = -(-k // GROUP)
    if granularity == "tensor":
        return (1,)
    if granularity == "row":
        return (m,)
    if granularity == "group128":
        return (m, num_groups)
    if granularity == "block128":
        return (-(-m // GROUP), num_groups)
    raise ValueError(f"granularity={granularity!r} is not supported; choose one of {', '.join(GRANULARITIES)}")


@dataclass(frozen=True)
class QuantKernelSpec:
    """What one quantization kernel is compiled for (m, k, pointers and strides are run-time arguments).

    op "quantize": x (src_dtype) -> q (q_dtype) and scales, one granularity; vec = elements per load of x.
    op "amax": the tensor-wide amax of x (src_dtype) into a device word (vec as for quantize).
    op "dequantize": q (q_dtype) -> out (src_dtype); the scale layout is a run-time argument.
    """

    op: str
    src_dtype: str
    q_dtype: str | None = None
    granularity: str | None = None
    vec: int = 1

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"op={self.op!r} is not one of {', '.join(OPS)}")
        if self.src_dtype not in SOURCE_DTYPES:
            raise ValueError(f"src_dtype={self.src_dtype!r} is not one of {', '.join(SOURCE_DTYPES)}")
        if (self.op == "amax") != (self.q_dtype is None):
            raise ValueError(f"op={self.op!r}: q_dtype must be {'None' if self.op == 'amax' else 'set'}")
        if self.q_dtype is not None and self.q_dtype not in QUANT_DTYPES:
            raise ValueError(f"q_dtype={self.q_dtype!r} is not one of {', '.join(QUANT_DTYPES)}")
        if self.op == "quantize":
            check_granularity(self.granularity, self.q_dtype)
        elif self.granularity is not None:
            raise ValueError(f"op={self.op!r} takes no granularity (got {self.granularity!r})")
        max_vec = full_vec(self.src_dtype) if self.op != "dequantize" else 1
        if (isinstance(self.vec, bool) or not isinstance(self.vec, int) or self.vec < 1 or self.vec > max_vec
                or self.vec & (self.vec - 1)):
            raise ValueError(f"vec={self.vec!r} must be a power of two in [1, {max_vec}] for op={self.op!r} "
                             f"and {self.src_dtype}")

    @property
    def entry(self) -> str:
        return f"dgjit_{self.op}"

    @property
    def format_cpp(self) -> str:
        return _FORMAT_CPP[self.q_dtype]

    @property
    def granularity_cpp(self) -> str:
        return _GRANULARITY_CPP[self.granularity]

    @property
    def tag(self) -> str:
        parts = [self.op, self.src_dtype, self.q_dtype, self.granularity,
                 f"v{self.vec}" if self.op != "dequantize" else None]
        return "quant_" + "_".join(p for p in parts if p is not None)

    @property
    def amax_spec(self) -> "QuantKernelSpec | None":
        """The tensor-wide amax kernel that a quantize kernel of granularity tensor runs first, else None."""
        if self.op == "quantize" and self.granularity == "tensor":
            return QuantKernelSpec("amax", self.src_dtype, vec=self.vec)
        return None


def full_vec(src_dtype: str) -> int:
    """Elements per 16-byte load of x: the vector width of rows whose start addresses are all 16-byte aligned
    (a 16-byte aligned base and a row stride that is a multiple of 8 bf16/fp16 or 4 fp32 elements)."""
    return 16 // dtypes.get(src_dtype).storage_bytes


@dataclass(frozen=True)
class QuantArtifact(jit.BuiltKernel):
    """A compiled quantization kernel: the cached cubin and what it was built for."""

    spec: QuantKernelSpec
    arch: str


_family: jit.KernelFamily[QuantArtifact] = jit.KernelFamily(_TEMPLATE, QuantArtifact, "quant_spec")


def render_kernel(spec: QuantKernelSpec) -> RenderedSource:
    return _family.render(spec)


def get_kernel(spec: QuantKernelSpec, arch: str) -> QuantArtifact:
    """The kernel of `spec` for `arch`: from the in-process memo, the disk cache, or NVRTC (once)."""
    return _family.get(spec, arch)


def clear_memo() -> None:
    _family.clear()
    _plans.clear()
    _new_output_plans.clear()


def _quantize_kernels(spec: QuantKernelSpec, arch: str) -> tuple[QuantArtifact, QuantArtifact | None]:
    """(quantize kernel, amax kernel or None) of one quantize call; offline, a missing one names the
    ``deepgemm-jit warmup`` line that compiles both."""
    amax = spec.amax_spec
    try:
        return get_kernel(spec, arch), (get_kernel(amax, arch) if amax is not None else None)
    except KernelNotCachedError as exc:
        from .warmup_sources import quantize_command_for

        raise exc.with_warmup_command(quantize_command_for(spec, arch)) from None


def kernel_symbols(artifact: QuantArtifact) -> dict[str, int]:
    """num_threads, units_per_block and group_cols as the compiled kernel defines them (read on the host)."""
    return cubin.entry_symbols(artifact.cubin, artifact.entry, tuple(SYMBOLS))


# -- devices, streams, arrays ------------------------------------------------------------------------------

_arch_of_device: dict[int, str] = {}


def _device_of(view_device: int, arg: str) -> int:
    """The current device, which must hold `arg`; NoGPUError without a GPU."""
    if not _arch_of_device and device.gpu_count() == 0:
        raise NoGPUError("no CUDA GPU found: quantize/dequantize run on the GPU")
    dev = device.current_device_id()
    if view_device != dev:
        raise ValueError(f"{arg} is on device {view_device}, but the current device is {dev} "
                         "(torch.cuda.set_device / cupy.cuda.Device(i).use() select it)")
    return dev


# The first GPU generation with FP8 conversions (cvt to e4m3 / e5m2), as device.arch_number counts: sm_89.
FP8_CONVERSIONS_MIN_ARCH = 89


def _target_arch(device_id: int, q_dtype: str) -> str:
    """The compile target of `device_id`; ValueError if that GPU cannot convert to `q_dtype`."""
    arch = _arch_of_device.get(device_id)
    if arch is None:
        major, minor = device.capability(device_id)
        if q_dtype in dtypes.FP8_DTYPES and 10 * major + minor < FP8_CONVERSIONS_MIN_ARCH:
            raise ValueError(f"dtype={q_dtype!r} needs an sm_89 or newer GPU (FP8 conversions); device "
                             f"{device_id} is sm_{major}{minor}")
        arch = device.arch_of_capability(major, minor)
        if 10 * major + minor >= FP8_CONVERSIONS_MIN_ARCH:  # remembered only where every dtype is allowed
            _arch_of_device[device_id] = arch
    return arch


@functools.lru_cache(maxsize=None)
def _num_sms(device_id: int) -> int:
    return device.num_sms(device_id)


@functools.lru_cache(maxsize=None)
def _torch_dtype(name: str):
    import torch

    return {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2, "int8": torch.int8,
            "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "word": torch.int32}[name]


def _cupy_dtype(name: str) -> np.dtype:
    # CuPy has no float8 dtype: FP8 values travel as their uint8 bit patterns.
    if name in dtypes.FP8_DTYPES:
        return np.dtype(np.uint8)
    if name == "word":
        return np.dtype(np.uint32)
    return dtypes.numpy_dtype(name)


def _out_kind(kind: str) -> str:
    """The library of the arrays quantize/dequantize return: torch for torch, else CuPy."""
    return "torch" if kind == "torch" else "cupy"


def _empty(kind: str, shape: tuple[int, ...], name: str, device_id: int, cu_stream, is_explicit_stream: bool):
    """(array, data pointer): a new contiguous array of the caller's library, allocated for the stream
    the kernels run on (arrays.allocating_for)."""
    with arrays.allocating_for(kind, device_id, cu_stream, is_explicit_stream):
        if kind == "torch":
            import torch

            t = torch.empty(shape, dtype=_torch_dtype(name), device=torch.device("cuda", device_id))
            return t, int(t.data_ptr())
        import cupy

        a = cupy.empty(shape, dtype=_cupy_dtype(name))
        return a, int(a.data.ptr)


def _as_bytes(q, q_name: str, kind: str, arg: str):
    """q viewed as uint8/int8 (torch float8 tensors and ml_dtypes float8 arrays by bit pattern); TypeError
    if its dtype cannot hold `q_name`."""
    dtype = getattr(q, "dtype", None)
    dtype_name = str(dtype).removeprefix("torch.")
    accepted = {"fp8_e4m3": ("uint8", "float8_e4m3fn"), "fp8_e5m2": ("uint8", "float8_e5m2"),
                "int8": ("int8",)}[q_name]
    if dtype_name not in accepted:
        raise TypeError(f"{arg} has dtype {dtype}; dtype={q_name!r} takes {arg} of dtype {' or '.join(accepted)}")
    if dtype_name.startswith("float8"):
        if kind == "torch":
            import torch

            return q.view(torch.uint8)
        return q.view(np.uint8)
    return q


def _check_array(a, arg: str, kind: str, shape: tuple[int, ...], dtype_ok=None, dtype_words: str = "") -> None:
    """Checks that `a` is an array of library `kind`, of a dtype dtype_ok(a) accepts (None: any; asked only once
    `a` is an array: None or a list got an AttributeError), exactly `shape`."""
    if array_kind(a) != kind or not (hasattr(a, "shape") and hasattr(a, "dtype")):
        raise TypeError(f"{arg} must be a {'torch tensor' if kind == 'torch' else 'CuPy array'} here, got "
                        f"{type(a).__module__}.{type(a).__name__}")
    if dtype_ok is not None and not dtype_ok(a):
        raise TypeError(f"{arg} has dtype {a.dtype}; {dtype_words}")
    if tuple(a.shape) != shape:
        raise ValueError(f"{arg} has shape {tuple(a.shape)}, expected {shape}")


def _contiguous(a, arg: str, kind: str, shape: tuple[int, ...], dtype_ok=None, dtype_words: str = "") -> None:
    """_check_array, and `a` contiguous (row-major)."""
    _check_array(a, arg, kind, shape, dtype_ok, dtype_words)
    if not (a.is_contiguous() if kind == "torch" else a.flags.c_contiguous):
        raise ValueError(f"{arg} must be contiguous (row-major)")


def _scale_args(view: ScaleView) -> tuple:
    """The kernels' (pointer, stride along rows, stride along 128-column groups) arguments of a scale array."""
    return np.uint64(view.ptr), np.int64(view.stride_i), np.int64(view.stride_j)


def _span(view: ScaleView) -> tuple[int, int]:
    """(start, bytes) of the scales, for the overlap checks."""
    start, end = view.byte_span()
    return start, end - start


def _scales_layout(a, arg: str, kind: str, shape: tuple[int, ...], is_output: bool) -> ScaleView:
    """Checks float32 scales `a` of library `kind` and exactly `shape` ((1,), (M,) or 2-D) with any non-negative
    strides (row-major, M-major, padded); outputs' elements must be distinct (no zero or interleaved strides): the
    kernel writes each once. Returns where the kernels find them (arrays.ScaleView: element (i, j), j the 128-column
    group, at ptr + 4 (i stride_i + j stride_j)). Host-side checks only: :func:`_placed` sets ptr (0 until then)
    and device (-1)."""
    _check_array(a, arg, kind, shape, lambda x: str(x.dtype).removeprefix("torch.") == "float32",
                 "scales are float32")
    if kind == "torch":
        strides = tuple(int(st) for st in a.stride())
    else:
        strides = tuple(int(st) // 4 for st in a.strides)
        if any(int(st) % 4 for st in a.strides):
            raise ValueError(f"{arg} has strides {tuple(a.strides)} bytes: not whole float32 elements")
    if any(st < 0 for st in strides):
        raise ValueError(f"{arg} has negative strides {strides}; pass a copy (e.g. {arg}.copy())")
    if is_output and not has_distinct_elements(shape, strides):
        raise ValueError(f"{arg} has strides {strides} (elements) for shape {shape}: some of its elements overlap "
                         "(a zero or interleaved stride); pass a contiguous or M-major array")
    stride_m, stride_g = (strides + (0, 0))[:2]  # (M,) row scales: no group stride
    return ScaleView(0, (shape + (1,))[:2], stride_m, stride_g, -1)


def _placed(layout: ScaleView, a, arg: str, kind: str, device_id: int) -> ScaleView:
    """`layout` with the data pointer of `a`, which must be on `device_id` and 4-byte aligned."""
    ptr, _ = _pointer(a, arg, kind, device_id)
    if ptr % 4:
        raise ValueError(f"{arg} data pointer 0x{ptr:x} is not aligned to its 4-byte elements")
    return dataclasses.replace(layout, ptr=ptr, device=device_id)


def _new_scales(kind: str, granularity: str, m: int, k: int, device_id: int, cu_stream, is_explicit_stream: bool):
    """(scales, ScaleView): new scales in the layout quantize returns. group128: M-major, storage (ceil(K/128),
    round_up(M, 4)) seen as its transpose cut to M rows (what FP8 block GEMMs bulk-copy); the others row-major."""
    storage_shape, _ = _new_scales_storage(granularity, m, k)
    storage, ptr = _empty(kind, storage_shape, "fp32", device_id, cu_stream, is_explicit_stream)
    shape = scale_shape(granularity, m, k)
    if granularity == "group128":  # (M = 0 too: the view of no rows, not the storage)
        return mn_major_view(storage, m), ScaleView(ptr, shape, 1, storage_shape[1], device_id)
    if len(shape) == 2:
        return storage, ScaleView(ptr, shape, shape[1], 1, device_id)
    return storage, ScaleView(ptr, (shape[0], 1), 1, 0, device_id)


def _new_scales_storage(granularity: str, m: int, k: int) -> tuple[tuple[int, ...], int]:
    """(shape of the storage _new_scales allocates, rows of its M-major view or 0 where the storage is the scales)."""
    shape = scale_shape(granularity, m, k)
    if granularity == "group128":
        return mn_major_storage_shape(m, shape[1]), m
    return shape, 0


def _pointer(a, arg: str, kind: str, device_id: int) -> tuple[int, int]:
    """(data pointer, bytes) of a contiguous CuPy array or torch tensor on `device_id`."""
    if kind == "torch":
        if not a.is_cuda or a.device.index != device_id:
            raise ValueError(f"{arg} is on {a.device}, expected cuda:{device_id}")
        return int(a.data_ptr()), a.numel() * a.element_size()
    if a.data.device_id != device_id:
        raise ValueError(f"{arg} is on device {a.data.device_id}, expected device {device_id}")
    return int(a.data.ptr), int(a.nbytes)


def _check_disjoint(spans: dict[str, tuple[int, int]], inputs: tuple[str, ...] = ("x",)) -> None:
    """An output that overlaps another array would be read or written while it is written (two of the `inputs`,
    only read, may share bytes)."""
    names = list(spans)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if a in inputs and b in inputs:
                continue
            (pa, na), (pb, nb) = spans[a], spans[b]
            if pa < pb + nb and pb < pa + na:
                raise ValueError(f"{a} overlaps {b}")


def _grid(num_blocks: int, what: str) -> tuple[int, int, int]:
    if num_blocks > _MAX_GRID:
        raise ValueError(f"{what} is too large for one launch ({num_blocks} blocks > {_MAX_GRID})")
    return (max(1, num_blocks), 1, 1)


@dataclass(frozen=True)
class _LaunchPlan:
    """One kernel launch with its arguments packed (runtime.PackedArgs), replayable on any stream of its device."""

    kind: str  # the array library of the call (its current stream is the default one)
    device_id: int
    kernel: runtime.LoadedKernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    bound: tuple
    args: runtime.PackedArgs

    def run(self, cu_stream) -> None:
        self.kernel.launch(self.grid, self.block, self.args, cu_stream, bound=self.bound)


def _launch(artifact: QuantArtifact, device_id: int, grid: tuple[int, int, int], args: tuple, cu_stream,
            kind: str = "cupy") -> _LaunchPlan:
    block = (kernel_symbols(artifact)["num_threads"], 1, 1)
    kernel = runtime.loaded_kernel(artifact, device_id, 0)
    plan = _LaunchPlan(kind, device_id, kernel, grid, block, kernel.bind(grid, block), runtime.PackedArgs(args))
    plan.run(cu_stream)
    return plan


# Kept launches of quantize calls with out= given, by the signatures of x and out (arrays.signature: everything the
# checks read) and the dtype and granularity strings: a repeated call (the same buffers, as in an inference loop or a
# CUDA graph capture) skips validation, planning and argument packing, like Gemm's kept launch plans. Not for
# "tensor" granularity (an amax pass and a temporary word per call).
_plans: dict[tuple, _LaunchPlan] = {}
_MAX_PLANS = 256


def _plan_key(x, out, dtype, granularity) -> tuple | None:
    if out is None or not isinstance(out, tuple) or len(out) != 2:
        return None
    if not (isinstance(dtype, str) and isinstance(granularity, str)):
        return None
    key = (signature(x), signature(out[0]), signature(out[1]), dtype, granularity)
    return None if None in key or () in key[:3] else key


@dataclass(frozen=True)
class _NewOutputsPlan:
    """The launch of a quantize call without out=, less its two output pointers: each call allocates q and the
    scales exactly as the checked path does (_empty, _new_scales: the caller's library, device and stream) and
    launches the kept kernel with their pointers in the argument slots of q and scales."""

    kind: str  # the array library of x (its current stream is the default one); outputs are of _out_kind(kind)
    device_id: int
    kernel: runtime.LoadedKernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    bound: tuple
    args: runtime.ArgTemplate  # the checked call's arguments, q's and the scales' pointers as its two slots
    q_shape: tuple[int, int]
    q_name: str
    scales_storage_shape: tuple[int, ...]  # what is allocated: group128 (ceil(K/128), round_up(M, 4)), else the shape
    mn_major_rows: int  # group128: M, the rows of the M-major view of the storage; 0: the storage is the scales

    def run(self, stream):
        cu_stream = runtime.stream_for(self.kind, stream, self.device_id)
        out_kind, explicit = _out_kind(self.kind), stream is not None
        q, q_ptr = _empty(out_kind, self.q_shape, self.q_name, self.device_id, cu_stream, explicit)
        storage, scales_ptr = _empty(out_kind, self.scales_storage_shape, "fp32", self.device_id, cu_stream, explicit)
        if q_ptr % 16:  # as _quantize_outputs checks it
            raise ValueError(f"out[0] data pointer 0x{q_ptr:x} is not 16-byte aligned")
        scales = mn_major_view(storage, self.mn_major_rows) if self.mn_major_rows else storage
        self.kernel.launch(self.grid, self.block, self.args.fill(q_ptr, scales_ptr), cu_stream, bound=self.bound)
        return q, scales


# Kept launches of quantize calls without out=, by x's signature, the dtype and granularity strings and x's type (its
# library), used only where the current device is the plan's (checked after the lookup, as for _plans: the key itself
# makes no CUDA call, so that a refused x, e.g. a CPU tensor, still gets the checked path's error): a repeated call
# skips validation and planning and only allocates, fills the two output pointers and launches. Not for "tensor"
# granularity (as _plans).
_new_output_plans: dict[tuple, _NewOutputsPlan] = {}


def _new_outputs_key(x, dtype, granularity) -> tuple | None:
    if not (isinstance(dtype, str) and isinstance(granularity, str)):
        return None
    sig = signature(x)
    if sig is None or sig == ():
        return None
    return (sig, dtype, granularity, type(x))


def _check_size(rows: int, cols: int, arg: str) -> tuple[int, int]:
    if rows < 0 or cols < 1:
        raise ValueError(f"{arg} has shape ({rows}, {cols}); quantization needs K >= 1")
    if rows > _MAX_DIM or cols > _MAX_DIM:
        raise ValueError(f"{arg} has shape ({rows}, {cols}); M and K must each be below 2**31")
    return rows, cols


# -- quantize ---------------------------------------------------------------------------------------------

def _quantize_outputs(out, kind: str, q_name: str, granularity: str, shape: tuple[int, int], device_id: int,
                      cu_stream, is_explicit_stream: bool):
    """(q, scales, q_ptr, ScaleView of scales, their byte spans): `out` checked, or new arrays."""
    m, k = shape
    if out is None:
        q, q_ptr = _empty(kind, shape, q_name, device_id, cu_stream, is_explicit_stream)
        scales, layout = _new_scales(kind, granularity, m, k, device_id, cu_stream, is_explicit_stream)
        spans = {}
    else:
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError(f"out must be a (q, scales) tuple, got {type(out).__name__}")
        q, scales = out
        arrays.check_writable(q, "out[0]")
        arrays.check_writable(scales, "out[1]")
        _contiguous(q, "out[0]", kind, shape)  # its dtype: _as_bytes below
        _as_bytes(q, q_name, kind, "out[0]")
        layout = _scales_layout(scales, "out[1]", kind, scale_shape(granularity, m, k), is_output=True)
        layout = _placed(layout, scales, "out[1]", kind, device_id)
        q_ptr, q_bytes = _pointer(q, "out[0]", kind, device_id)
        spans = {"out[0]": (q_ptr, q_bytes), "out[1]": _span(layout)}
    if q_ptr % 16 and m:  # the kernel stores whole 4- or 8-byte chunks of q where K allows (quantize.cuh, store_chunk)
        raise ValueError(f"out[0] data pointer 0x{q_ptr:x} is not 16-byte aligned")
    return q, scales, q_ptr, layout, spans


@runtime.orders_dlpack_imports
def quantize(x, dtype: str = "fp8", granularity: str = "group128", *, out=None, stream=None):
    """Quantize a 2-D (M, K) device matrix to FP8 or INT8; returns ``(q, scales)``.

    - x: CuPy array or torch CUDA tensor of float32, float16 or bfloat16 (CuPy: ml_dtypes.bfloat16),
      unit stride along K, any row stride.
    - dtype: ``"fp8"`` (= ``"fp8_e4m3"``), ``"fp8_e4m3"``, ``"fp8_e5m2"`` or ``"int8"``.
    - granularity: ``"tensor"`` -> scales (1,); ``"row"`` -> (M,); ``"group128"`` -> (M, ceil(K/128));
      ``"block128"`` -> (ceil(M/128), ceil(K/128)). INT8: tensor or row.
    - q: contiguous (M, K). torch in: torch.float8_e4m3fn / float8_e5m2 / int8 tensor; CuPy in: uint8
      (the FP8 bit patterns) or int8. scales: float32 of the same library and device, dequantization
      factors: ``x ~= float(q) * s`` (see the module docstring for the exact rule). group128 scales are
      M-major: a (M, ceil(K/128)) view with strides (1, round_up(M, 4)) elements of storage (ceil(K/128),
      round_up(M, 4)) (CuPy: a transposed slice; torch: ``torch.empty((kb, m4)).t()[:M]``), the layout the
      FP8 block GEMM reads fastest; reshaping its rows (e.g. to (G, max_m, kb)) keeps it a view. The other
      granularities' scales are contiguous.
    - M may be 0 (the Gemms take it too): q (0, K), scales of that shape, the tensor granularity's one scale 1
      (an all-zero group's); nothing is launched but that word's fill.
    - out: optional ``(q, scales)`` to write into instead (q contiguous and 16-byte aligned; scales of
      the shape above with any non-negative strides that address each element once: row-major and
      M-major alike); they are returned.

    Runs on `stream` (CuPy stream, raw handle, torch stream), else on the current stream of x's
    library; it never waits for the GPU. Errors about the arguments are raised before any launch.

    Example::

        q, s = deepgemm_jit.quantize(a, "fp8", "group128")   # a (M, K) bf16 -> q (M, K), s (M, ceil(K/128))
    """
    if out is None:
        key = _new_outputs_key(x, dtype, granularity)
        if key is not None:
            new_outputs_plan = _new_output_plans.get(key)
            if new_outputs_plan is not None and new_outputs_plan.device_id == device.current_device_id():
                return new_outputs_plan.run(stream)
    else:
        key = _plan_key(x, out, dtype, granularity)
        if key is not None:
            plan = _plans.get(key)
            if plan is not None and plan.device_id == device.current_device_id():
                plan.run(runtime.stream_for(plan.kind, stream, plan.device_id))
                return out
    q_name = dtypes.canonical(dtype, arg="dtype", allowed=QUANT_DTYPES)
    gran = check_granularity(granularity, q_name)
    kind = array_kind(x)
    view = matrix_view(x, "x")
    src = dtypes.storage_name_of(view.dtype)
    if src not in SOURCE_DTYPES:
        raise TypeError(f"x has dtype {view.dtype}; quantize takes float32, float16 or bfloat16")
    m, k = _check_size(view.rows, view.cols, "x")
    dev = _device_of(view.device, "x")
    arch = _target_arch(dev, q_name)
    cu_stream = runtime.stream_for(kind, stream, dev)
    if m == 0:  # no rows (an expert no token chose, as the Gemms take): empty q, and scales by the contract
        q, scales, _, scales_layout, _ = _quantize_outputs(out, _out_kind(kind), q_name, gran, (m, k), dev, cu_stream,
                                                          stream is not None)
        if gran == "tensor":  # the one scale of an empty tensor: that of an all-zero group, 1
            _fill_unit_scale(scales_layout.ptr, dev, cu_stream)
        return q, scales

    # Loads as wide as x's base and row stride allow (16 bytes for packed rows of 8/4-element multiples).
    vec = config.max_vector(view.itemsize, view.ptr, view.row_stride, view.rows)
    art, amax_art = _quantize_kernels(QuantKernelSpec("quantize", src, q_name, gran, vec), arch)
    sym = kernel_symbols(art)
    if sym["group_cols"] != GROUP:
        raise RuntimeError(f"{art.entry} groups {sym['group_cols']} columns, quantization.py {GROUP}")
    num_groups = -(-k // GROUP)
    if gran in ("tensor", "group128"):
        grid = _grid(-(-m * num_groups // sym["units_per_block"]), "x")
    elif gran == "row":
        grid = _grid(m, "x")
    else:
        grid = _grid(-(-m // GROUP) * num_groups, "x")

    explicit = stream is not None
    q, scales, q_ptr, scales_layout, spans = _quantize_outputs(out, _out_kind(kind), q_name, gran, (m, k), dev,
                                                               cu_stream, explicit)
    x_start, x_end = view.byte_span()
    _check_disjoint(dict(spans, x=(x_start, x_end - x_start)))
    x_args = (np.uint64(view.ptr), np.int64(view.row_stride))
    amax_ptr = 0
    if amax_art is not None:
        import cupy

        # One zeroed device word receives the amax bits; it is freed (back to this stream's pool)
        # when this function returns, after both launches are enqueued on the stream (kept under a capture).
        amax_word, amax_ptr = _empty(_out_kind(kind), (1,), "word", dev, cu_stream, explicit)
        runtime.keep_while_captured(_out_kind(kind), cu_stream, amax_word)
        cupy.cuda.runtime.memsetAsync(amax_ptr, 0, 4, cu_stream.ptr)
        units_per_block = kernel_symbols(amax_art)["units_per_block"]
        amax_grid = _grid(min(-(-m * num_groups // units_per_block), _AMAX_BLOCKS_PER_SM * _num_sms(dev)), "x")
        _launch(amax_art, dev, amax_grid, x_args + (np.uint64(amax_ptr), np.uint32(m), np.uint32(k)), cu_stream)
    plan = _launch(art, dev, grid, x_args + (np.uint64(q_ptr),) + _scale_args(scales_layout) + (np.uint64(amax_ptr),
                                             np.uint32(m), np.uint32(k)), cu_stream, kind)
    if key is not None and amax_art is None:
        if out is not None:
            _keep(_plans, key, plan)
        else:
            pointer_slots = (len(x_args), len(x_args) + 1)  # q's and the scales' pointers follow x's arguments
            _keep(_new_output_plans, key, _NewOutputsPlan(
                kind, dev, plan.kernel, plan.grid, plan.block, plan.bound,
                runtime.ArgTemplate(plan.args.args, pointer_slots), (m, k), q_name, *_new_scales_storage(gran, m, k)))
    return q, scales


def _fill_unit_scale(ptr: int, device_id: int, cu_stream) -> None:
    """Writes float32 1.0 to the word at `ptr` on `cu_stream` (a memset node under a CUDA-graph capture)."""
    import cupy

    with cupy.cuda.Device(device_id):
        code = driver.libcuda().cuMemsetD32Async(ptr, _ONE_F32_BITS, 1, cu_stream.ptr)
    if code != 0:
        raise RuntimeError(f"cuMemsetD32Async of the tensor scale failed with {code} ({driver.error_name(code)})")


_ONE_F32_BITS = 0x3F800000


def _keep(plans: dict, key: tuple, plan) -> None:
    if len(plans) >= _MAX_PLANS:
        plans.clear()
    plans[key] = plan


# -- dequantize -------------------------------------------------------------------------------------------

def dequantize(q, scales, dtype: str = "fp8", granularity: str = "group128", out_dtype: str = "fp32", *,
               out=None, stream=None):
    """x = float(q) * s as a contiguous (M, K) array of `out_dtype` ("fp32", "bf16" or "fp16").

    q and scales as :func:`quantize` returns them (CuPy uint8/int8, or torch float8/int8 tensors, q with
    unit stride along K and any row stride; scales float32 of :func:`scale_shape`, any non-negative strides:
    row-major or M-major). The
    product is rounded once to float32, then to `out_dtype`. `out`: an optional contiguous (M, K) array
    of `out_dtype` (same library) to write into and return. A simple kernel for references and tests,
    not a fast path. Runs on `stream`, else the current stream of q's library.

    Example::

        x_hat = deepgemm_jit.dequantize(q, s, "fp8", "group128")   # float32 (M, K)
    """
    q_name = dtypes.canonical(dtype, arg="dtype", allowed=QUANT_DTYPES)
    gran = check_granularity(granularity, q_name)
    out_name = dtypes.canonical(out_dtype, arg="out_dtype", allowed=SOURCE_DTYPES)
    if isinstance(q, np.ndarray):
        raise TypeError("q is a NumPy (host) array; pass a GPU array, e.g. cupy.asarray(q)")
    kind = array_kind(q)
    if kind == "other":
        raise TypeError(f"q must be a CuPy array or a torch CUDA tensor, got {type(q).__name__}")
    q_bytes = _as_bytes(q, q_name, kind, "q")
    if len(q.shape) != 2:
        raise ValueError(f"q must be 2-D, got shape {tuple(q.shape)}")
    m, k = _check_size(int(q.shape[0]), int(q.shape[1]), "q")
    shape = scale_shape(gran, m, k)
    # dtype, shape and layout of scales (and out) before any GPU call
    scales_layout = _scales_layout(scales, "scales", kind, shape, is_output=False)
    if out is not None:
        want = _torch_dtype(out_name) if kind == "torch" else _cupy_dtype(out_name)
        _contiguous(out, "out", kind, (m, k), lambda x: x.dtype == want, f"out_dtype={out_name!r} writes {want}")
    view = matrix_view(q_bytes, "q")
    dev = _device_of(view.device, "q")
    scales_layout = _placed(scales_layout, scales, "scales", kind, dev)
    arch = _target_arch(dev, q_name)
    cu_stream = runtime.stream_for(kind, stream, dev)
    if m == 0:  # no rows: nothing to launch (nor to compile)
        if out is None:
            out, _ = _empty(kind, (m, k), out_name, dev, cu_stream, stream is not None)
        else:
            _pointer(out, "out", kind, dev)  # on q's device
        return out

    art = get_kernel(QuantKernelSpec("dequantize", out_name, q_name), arch)
    rows_per_scale, cols_per_scale = {"tensor": (m, k), "row": (1, k), "group128": (1, GROUP),
                                      "block128": (GROUP, GROUP)}[gran]
    blocks = min(-(-m * k // kernel_symbols(art)["units_per_block"]), _DEQUANT_BLOCKS_PER_SM * _num_sms(dev))
    if out is None:
        out, out_ptr = _empty(kind, (m, k), out_name, dev, cu_stream, stream is not None)
    else:
        out_ptr, out_bytes = _pointer(out, "out", kind, dev)
        q_start, q_end = view.byte_span()
        _check_disjoint({"out": (out_ptr, out_bytes), "q": (q_start, q_end - q_start),
                         "scales": _span(scales_layout)}, inputs=("q", "scales"))
    _launch(art, dev, _grid(blocks, "q"),
            (np.uint64(view.ptr), np.int64(view.row_stride)) + _scale_args(scales_layout)
            + (np.uint64(out_ptr), np.uint32(m), np.uint32(k), np.uint32(rows_per_scale), np.uint32(cols_per_scale)),
            cu_stream)
    return out
