"""Loading cubins into the current CUDA context (CuPy driver API) and launching them on the stream a call
asks for: through cuLaunchKernel with arguments packed once per launch plan (PackedArgs), which keeps the
per-call host time low (CuPy's generic launch re-packs every argument on every call: ~9.5 us of a hot call's
~15 us for the sm90 family's 128-byte tensor maps, cProfile on the H200)."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import threading

import numpy as np

from . import driver
from .jit import BuiltKernel

_DEFAULT_SMEM_LIMIT = 48 * 1024  # above this a kernel must opt in


class LoadedKernel:
    """One cubin loaded on one device, with its shared-memory opt-in done."""

    def __init__(self, artifact: BuiltKernel, dynamic_smem_bytes: int):
        import cupy

        self.module = cupy.cuda.function.Module()
        self.module.load(artifact.cubin)
        self.function = self.module.get_function(artifact.entry)
        self.dynamic_smem_bytes = dynamic_smem_bytes
        self._programmatic: dict[tuple, ProgrammaticLaunch] = {}  # programmatic_launch's, per (grid, block)
        self._active_clusters: dict[tuple, int] = {}  # max_active_clusters', per (cluster, block)
        if dynamic_smem_bytes > _DEFAULT_SMEM_LIMIT:
            cupy.cuda.driver.funcSetAttribute(
                self.function.ptr, cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                dynamic_smem_bytes)

    def programmatic_launch(self, grid: tuple[int, ...], block: tuple[int, ...]) -> "ProgrammaticLaunch":
        """This kernel's programmatic launch configuration for `grid` and `block`, made once per shape (~2 us of
        host time that calls without out=, which make a new plan each time, would otherwise pay on every call)."""
        key = (tuple(grid), tuple(block))
        found = self._programmatic.get(key)
        if found is None:
            if len(self._programmatic) >= 256:
                self._programmatic.clear()
            found = self._programmatic[key] = ProgrammaticLaunch(self, grid, block)
        return found

    def max_active_clusters(self, cluster: int, block: tuple[int, ...]) -> int:
        """How many clusters of this kernel (compiled with __cluster_dims__(cluster, 1, 1)) the device runs at once
        (cuOccupancyMaxActiveClusters, asked once per block shape): a GPC holds only whole clusters, so a persistent
        grid of one CTA per SM may not all be resident. Raises LaunchError when the driver cannot tell."""
        key = (cluster, tuple(block))
        found = self._active_clusters.get(key)
        if found is None:
            config = _LaunchConfig((ctypes.c_uint * 3)(cluster, 1, 1), (ctypes.c_uint * 3)(*block),
                                   self.dynamic_smem_bytes, None, None, 0)
            count = ctypes.c_int(0)
            code = _cu_occupancy_max_active_clusters()(ctypes.byref(count), ctypes.c_void_p(self.function.ptr),
                                                       ctypes.byref(config))
            if code != 0:
                raise LaunchError(code, (cluster, 1, 1), block, "cuOccupancyMaxActiveClusters")
            if count.value < 1:  # e.g. a GPU partition with too few SMs per GPC for the cluster
                raise NoClusterFitsError(cluster, block)
            found = self._active_clusters[key] = count.value
        return found

    def bind(self, grid: tuple[int, ...], block: tuple[int, ...]) -> tuple:
        """The leading cuLaunchKernel arguments of a launch of this kernel as ctypes values (function, grid, block,
        shared memory): built once per launch plan, they spare the hot call ctypes' conversion of eight Python ints
        (~1 us of a ~15 us call)."""
        return (ctypes.c_void_p(self.function.ptr), *(ctypes.c_uint(v) for v in (*grid, *block)),
                ctypes.c_uint(self.dynamic_smem_bytes))

    def launch(self, grid: tuple[int, ...], block: tuple[int, ...], args: "PackedArgs", stream,
               bound: tuple | None = None, programmatic: "ProgrammaticLaunch | None" = None) -> None:
        """Launch on `stream` (a CuPy stream); every driver error raises LaunchError before returning. `bound`:
        `bind(grid, block)`, when the caller keeps it. `programmatic` (this kernel's, same grid and block): with
        programmatic stream serialization (cuLaunchKernelEx), so the launch may be processed while the previous
        kernel on the stream still runs; only for kernels that run griddep_wait (common.cuh) before touching
        global memory."""
        if programmatic is not None:
            config = programmatic.config_for(stream.ptr)
            code = _cu_launch_kernel_ex()(ctypes.byref(config), ctypes.c_void_p(self.function.ptr), args.params,
                                          None)
        else:
            code = _cu_launch_kernel()(*(bound or self.bind(grid, block)), stream.ptr, args.params, None)
        if code != 0:
            raise LaunchError(code, grid, block)


# CUlaunchAttributeID of programmatic stream serialization; its value (an int, 1 = allowed) starts the 64-byte
# CUlaunchAttributeValue union.
_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h)."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


class ProgrammaticLaunch:
    """A kernel's launch configuration (grid, block, shared memory) with one attribute, programmatic stream
    serialization, made once per launch plan. Each launch copies it and sets the stream (~0.2 us of host time,
    against ~2 to build one), so threads replaying one plan on different streams share nothing they write."""

    def __init__(self, kernel: LoadedKernel, grid: tuple[int, ...], block: tuple[int, ...]):
        self._attr = _LaunchAttribute(_PROGRAMMATIC_STREAM_SERIALIZATION, b"", 1)  # the configs point at it
        self.template = _LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block),
                                      kernel.dynamic_smem_bytes, 0, ctypes.pointer(self._attr), 1)
        self._raw = bytes(self.template)

    def config_for(self, stream_ptr: int) -> _LaunchConfig:
        config = _LaunchConfig.from_buffer_copy(self._raw)
        config.stream = stream_ptr
        return config


class LaunchError(RuntimeError):
    """cuLaunchKernel (or the driver call `call` that prepares a launch) failed (the CUresult and its name are in the
    message)."""

    def __init__(self, code: int, grid, block, call: str = "cuLaunchKernel"):
        super().__init__(f"{call} failed with {code} ({driver.error_name(code)}); grid {tuple(grid)}, "
                         f"block {tuple(block)}")
        self.code = code


class NoClusterFitsError(LaunchError):
    """cuOccupancyMaxActiveClusters said that no cluster of the kernel fits on this GPU (a cluster-tile kernel:
    sm90_tiles.sm90_quant_cluster) at once."""

    def __init__(self, cluster: int, block):
        RuntimeError.__init__(self, f"no cluster of {cluster} CTAs x {tuple(block)} threads of this kernel fits on "
                              "this GPU at once (cuOccupancyMaxActiveClusters: 0). The tile's quant_fp8_g128 groups "
                              "span such a cluster; build with config= a tile of 128 or 256 output columns "
                              "(deepgemm_jit.config.sm90_config(spec, block_m, 128)) instead")
        self.code = 0


class PackedArgs:
    """Kernel arguments as cuLaunchKernel takes them (an array of pointers to each value), built once: the
    values must already have the kernel's parameter types (numpy scalars; tensor maps as 128-byte np.void)."""

    def __init__(self, args: tuple):
        self._values = []
        for arg in args:
            if not isinstance(arg, (np.generic, np.ndarray)):
                raise TypeError(f"kernel arguments must be numpy scalars of the parameter's type, got "
                                f"{type(arg).__name__} {arg!r}")
            raw = np.asarray(arg).tobytes()
            self._values.append(ctypes.create_string_buffer(raw, len(raw)))
        self.params = (ctypes.c_void_p * max(1, len(args)))(*[ctypes.addressof(v) for v in self._values])
        self.args = args
        self.count = len(args)


class ArgTemplate:
    """Kernel arguments of at most 8 bytes each (numpy scalars) whose pointer arguments at `slots` change from
    launch to launch (new outputs per call): :meth:`fill` packs them in ~1.5 us of host time where PackedArgs
    takes ~20 (one ctypes buffer instead of one per argument: n parameter pointers, then n 8-byte value slots).
    Each fill is a new buffer, so concurrent callers never share a mutable one (cuLaunchKernel copies the values
    before it returns)."""

    def __init__(self, args: tuple, slots: tuple[int, ...]):
        values = []
        for arg in args:
            if not isinstance(arg, np.generic) or np.asarray(arg).nbytes > 8:
                raise TypeError(f"kernel arguments must be numpy scalars of at most 8 bytes, got "
                                f"{type(arg).__name__} {arg!r}")
            values.append(np.asarray(arg).tobytes().ljust(8, b"\0"))  # little-endian: the value's bytes come first
        self.count = len(args)
        if any(not 0 <= s < self.count for s in slots):
            raise ValueError(f"pointer slots {slots} out of range for {self.count} arguments")
        self._types = tuple(type(a) for a in args)
        self._buffer_type = ctypes.c_uint64 * (2 * self.count)
        self._blob = bytes(8 * self.count) + b"".join(values)
        self._value_offsets = [8 * (self.count + i) for i in range(self.count)]
        self._slots = tuple(self.count + s for s in slots)

    def fill(self, *pointers: int) -> "FilledArgs":
        """The arguments with `pointers` (ints, one per slot) in the pointer slots, ready for LoadedKernel.launch."""
        if len(pointers) != len(self._slots):
            raise ValueError(f"{len(pointers)} pointers for {len(self._slots)} pointer slots")
        buffer = self._buffer_type.from_buffer_copy(self._blob)
        base = ctypes.addressof(buffer)
        buffer[:self.count] = [base + offset for offset in self._value_offsets]
        for slot, pointer in zip(self._slots, pointers):
            buffer[slot] = pointer
        return FilledArgs(buffer, self)


class FilledArgs:
    """One launch's arguments from an ArgTemplate: `params` for cuLaunchKernel, `args` as numpy scalars (decoded on
    request, for tests and error messages)."""

    __slots__ = ("params", "_template")

    def __init__(self, buffer, template: ArgTemplate):
        self.params = buffer  # starts with the table of pointers to the values
        self._template = template

    @property
    def args(self) -> tuple:
        raw = bytes(self.params)[8 * self._template.count:]
        return tuple(np.frombuffer(raw[8 * i:8 * i + np.dtype(t).itemsize], dtype=t)[0]
                     for i, t in enumerate(self._template._types))


@functools.lru_cache(maxsize=None)
def _cu_launch_kernel():
    return driver.libcuda().cuLaunchKernel  # resolved once: this is on every call's path


@functools.lru_cache(maxsize=None)
def _cu_launch_kernel_ex():
    fn = driver.libcuda().cuLaunchKernelEx
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return fn


@functools.lru_cache(maxsize=None)
def _cu_occupancy_max_active_clusters():
    fn = driver.libcuda().cuOccupancyMaxActiveClusters
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.POINTER(_LaunchConfig)]
    return fn


_loaded: dict[tuple[str, int], LoadedKernel] = {}
_lock = threading.Lock()


def loaded_kernel(artifact: BuiltKernel, device_id: int, dynamic_smem_bytes: int) -> LoadedKernel:
    """The kernel of `artifact` loaded on `device_id` (loaded once per process and device)."""
    key = (artifact.key, device_id)
    kernel = _loaded.get(key)
    if kernel is None:
        with _lock:
            kernel = _loaded.get(key)
            if kernel is None:
                kernel = LoadedKernel(artifact, dynamic_smem_bytes)
                _loaded[key] = kernel
    return kernel


class _RawStream:
    """A raw cudaStream_t handle, presented through the CUDA stream protocol."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


_external_streams: dict[tuple[int, int], object] = {}


def _external(handle: int):
    """A CuPy view of a raw stream handle, made once per (current device, handle): a view holds the handle and the
    device current when it was made, which CuPy's `with stream:` insists on, and handle 0 (the legacy default stream,
    torch's default) names a stream on every device."""
    import cupy

    key = (cupy.cuda.runtime.getDevice(), handle)
    wrapped = _external_streams.get(key)
    if wrapped is None:
        if len(_external_streams) > 256:
            _external_streams.clear()
        wrapped = _external_streams[key] = cupy.cuda.Stream.from_external(_RawStream(handle))
    return wrapped


def orders_dlpack_imports(call):
    """Decorator of the entry points that take arrays (Gemm, GroupedGemm and Fp32Gemm calls and split, quantize). A
    DLPack-only operand (e.g. a JAX array) is imported through cupy.from_dlpack, which orders the producer's pending
    work before CuPy's current stream. Where the call's kernels run on another stream (stream=, or torch's current
    stream for a call on torch tensors), the call must run with that stream current. Such an import therefore
    raises arrays.DLPackImportDeferred when first met (validation has launched and allocated nothing yet): the call
    runs again with the kernel stream current and the imports allowed. Other calls pay one try frame."""
    from . import arrays

    imports = arrays.dlpack_imports

    @functools.wraps(call)
    def wrapper(*args, **kwargs):
        if imports.inside or imports.ready:  # within another entry point's call (Fp32Gemm's inner Gemm): its choice
            return call(*args, **kwargs)
        imports.inside = True
        try:
            return call(*args, **kwargs)
        except arrays.DLPackImportDeferred:
            pass
        finally:
            imports.inside = False
        stream = kwargs.get("stream")
        torch_call = any(arrays.array_kind(x) == "torch" for x in args + tuple(kwargs.values()))
        context = contextlib.nullcontext()
        if stream is not None or torch_call:  # else the kernels run on CuPy's current stream: the import's already
            import cupy

            try:
                context = stream_for("torch" if torch_call else "cupy", stream, cupy.cuda.runtime.getDevice())
            except Exception:  # no GPU, or a bad stream=: the call's own checks say so, as without a DLPack operand
                pass
        imports.ready = True
        try:
            with context:
                return call(*args, **kwargs)
        finally:
            imports.ready = False

    return wrapper


def resolve_stream(stream: object):
    """A CuPy stream for `stream`: None (current), a CuPy stream, a raw handle, an object
    speaking the CUDA stream protocol, or one with a ``cuda_stream`` handle (torch)."""
    import cupy

    if stream is None:
        return cupy.cuda.get_current_stream()
    if isinstance(stream, (cupy.cuda.Stream, cupy.cuda.ExternalStream)):
        return stream
    if isinstance(stream, bool):
        raise TypeError("stream must be a CUDA stream, a raw handle or None, got bool")
    if isinstance(stream, int):
        return _external(stream)
    if hasattr(stream, "__cuda_stream__"):
        return cupy.cuda.Stream.from_external(stream)
    handle = getattr(stream, "cuda_stream", None)
    if isinstance(handle, int):
        return _external(handle)
    raise TypeError(f"stream must be a CuPy stream, an object with .cuda_stream, a raw handle or None; "
                    f"got {type(stream).__name__}")


def is_capturing(stream) -> bool:
    """Whether the CuPy stream `stream` is capturing a CUDA graph (no allocation or synchronisation then)."""
    import cupy

    return bool(cupy.cuda.runtime.streamIsCapturing(stream.ptr))


_kept_for_graphs: list = []  # see keep_while_captured


def keep_while_captured(kind: str, cu_stream, *arrays) -> None:
    """Temporaries a call allocated for itself (quantize's amax word, Fp32Gemm's split operands) go back to the
    stream's pool when it returns. Under a CUDA-graph capture on `cu_stream` the graph replays into their addresses,
    where a later allocation would own them: CuPy ones are kept for the process (library `kind` "cupy"); torch's
    capture keeps its own in the graph's private pool."""
    if kind == "cupy" and is_capturing(cu_stream):
        _kept_for_graphs.append(arrays)


def stream_for(kind: str, stream: object, device_id: int):
    """The CuPy stream a call runs on: `stream` when given (anything ``resolve_stream`` takes), else the
    current stream of the caller's array library on `device_id`: torch's for torch tensors (kind
    ``"torch"``, as ``arrays.array_kind`` names it), CuPy's for everything else.

    Example::

        cu_stream = stream_for(array_kind(x), None, device.current_device_id())   # torch.cuda.current_stream()
    """
    if stream is None and kind == "torch":
        import torch

        stream = torch.cuda.current_stream(device_id).cuda_stream
    return resolve_stream(stream)
