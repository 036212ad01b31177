"""Grouped GEMMs for mixture-of-experts: ``build_grouped`` -> ``GroupedGemm``.

One launch multiplies every group's rows by its own weight, B_g = b[g] of b (G, N, K) (``nn.Linear`` weights
stacked). The kernel is the Hopper family's persistent one walking the tiles of all groups (sched_sm90.cuh's
GroupedTileScheduler): empty and short groups cost no CTA a whole wave, and the group sizes stay on the device
(no host synchronisation; a call can be captured in a CUDA graph).

Layouts (chosen per call by the keyword that describes the groups):

- contiguous (prefill, training): a (M, K) holds the rows of all groups stacked, d is (M, N_out).
  - ``offs=`` (G,) int32, cumulative ends: group g owns rows [offs[g-1], offs[g]) (offs[-1] = 0), as
    ``torch._grouped_mm``. Rows past offs[G-1] belong to no group and are left untouched in d.
  - ``m_indices=`` (M,) int32, the group of every row, -1 for padding rows (DeepGEMM's layout), left untouched in
    d. A group's rows must form one contiguous run; a group whose rows do not is skipped (its rows left
    untouched) rather than computed wrongly. Up to 2048 groups.
  No alignment is needed in either form: groups may start at any row and have any size, 0 included.
- masked (decode): a (G, max_m, K), d (G, max_m, N_out), ``masked_m=`` (G,) int32 valid rows per group
  (clamped to [0, max_m]); rows past masked_m[g] are left untouched in d.

Types: bf16 / fp16, and FP8 (E4M3/E5M2) with block scales: scale_a one per 1x128 group of A's rows ((M,
ceil(K/128)), or (G, max_m, ceil(K/128)) masked), scale_b one per 128x128 block of each B_g ((G, ceil(N/128),
ceil(K/128))). Epilogues: bias (per group, (G, N)), activations, swiglu / geglu (B_g's rows interleaved as
``interleave_gate_up`` does), quant_fp8_g128 (returns (q, scales), scales one row per row of d, M-major over all
rows like quantize's group128 scales, so they serve as the next grouped FP8 GEMM's scale_a on its fast path).
Bounds are range-checked on the device: offsets outside [0, M] are clamped, so bad group metadata cannot make
the kernel write outside d. ``offs`` must be non-decreasing (as torch._grouped_mm requires): the device cannot
refuse others without a host sync, and decreasing offsets make groups overlap, whose rows two weights then write.

Example::

    g = deepgemm_jit.build_grouped(4096, 7168, dtype="bf16", expected_m=2048, num_groups=8)
    d = g(a, w, offs=offs)          # a (M, 7168), w (8, 4096, 7168), offs (8,) int32 -> d (M, 4096)
    d = g(x, w, masked_m=counts)    # x (8, max_m, 7168) -> d (8, max_m, 4096)
"""
from __future__ import annotations

import math
import threading

import numpy as np

from . import config as config_mod
from . import device, dtypes, jit, launch, runtime, sm90_tiles, splitk
from .api import _MAX_M as _MAX_ROWS
from .api import _accepted_dtypes, _check_m, _common_kind
from .arrays import (MatrixView, ScaleView, array_fields, check_writable, has_distinct_elements, new_array,
                     new_mn_major_scales, overlaps, signature)
from .errors import KernelNotCachedError
from .render import render
from .spec import GemmSpec
from .stream_buffers import stream_key

_OFFSETS, _SEGMENTS, _MASKED = 0, 1, 2  # GroupBounds in gemm_sm90.cuh
_SEGMENTS_TEMPLATE = "group_segments.cu.j2"
_SEGMENTS_ENTRY = "dgjit_group_segments"
_SEGMENTS_MAX_GROUPS = 2048  # kMaxGroups of group_segments.cu.j2
_MAX_LAUNCH_PLANS = 64
DEFAULT_EXPECTED_M = 512
DEFAULT_NUM_GROUPS = 8


# -- validation helpers ------------------------------------------------------------------------------------

def _stacked(x, arg: str, ndim: int, dtypes_ok: tuple[np.dtype, ...], what: str) -> tuple[tuple[int, ...], MatrixView]:
    """An `ndim`-dimensional device array (2 or 3) whose last dimension has unit stride and whose leading
    dimensions flatten into rows of one pitch, as (shape, MatrixView of (rows, last dim))."""
    shape, strides, dtype, ptr, dev = array_fields(x, arg)
    if len(shape) != ndim:
        raise ValueError(f"{arg} must be {ndim}-D {what}, got shape {tuple(shape)}")
    if dtype not in dtypes_ok:
        raise TypeError(f"{arg} has dtype {dtype}; expected {' or '.join(str(d) for d in dtypes_ok)}")
    size = dtype.itemsize
    if ptr % size or any(s % size for s in strides):
        raise ValueError(f"{arg} is not aligned to its {size}-byte elements")
    el = [s // size for s in strides]
    cols = int(shape[-1])
    rows = math.prod(int(d) for d in shape[:-1])
    if rows == 0 or cols == 0:
        return tuple(shape), MatrixView(ptr, rows, cols, max(cols, 1), np.dtype(dtype), int(dev))
    if cols > 1 and el[-1] != 1:
        raise ValueError(f"{arg} must have unit stride along its last dimension; pass a contiguous copy")
    if shape[-2] > 1:
        pitch = el[-2]
    elif ndim == 3 and shape[0] > 1:  # matrices of one row each: the group stride is the pitch
        pitch = el[0]
    else:
        pitch = cols
    if ndim == 3 and shape[0] > 1 and el[0] != shape[1] * pitch:
        raise ValueError(f"{arg} has strides {tuple(strides)}: its {shape[0]} matrices must lie one after another "
                         "with one row pitch (pass a contiguous copy)")
    if rows > 1 and pitch < 0:
        raise ValueError(f"{arg} has a negative row stride ({pitch} elements); pass a contiguous copy")
    if rows > 1 and pitch < cols:
        raise ValueError(f"{arg} has a row stride of {pitch} elements for rows of {cols}: rows overlap")
    return tuple(shape), MatrixView(ptr, rows, cols, pitch, np.dtype(dtype), int(dev))


def _int32_vector(x, arg: str, length: int, what: str) -> MatrixView:
    """A contiguous 1-D int32 device array of `length` elements, as a one-row MatrixView."""
    shape, strides, dtype, ptr, dev = array_fields(x, arg)
    if len(shape) != 1:
        raise ValueError(f"{arg} must be 1-D {what}, got shape {tuple(shape)}")
    if dtype != np.int32:
        raise TypeError(f"{arg} has dtype {dtype}; it must be int32 ({what})")
    if shape[0] != length:
        raise ValueError(f"{arg} has {shape[0]} elements; expected {length} ({what})")
    if length > 1 and strides[0] != 4:
        raise ValueError(f"{arg} must be contiguous")
    if ptr % 4:
        raise ValueError(f"{arg} is not aligned to 4 bytes")
    return MatrixView(ptr, 1, length, max(length, 1), np.dtype(np.int32), int(dev))


def _scale_rows(x, arg: str, shape: tuple[int, ...], what: str) -> ScaleView:
    """A float32 scale array of logical `shape` (2-D or 3-D, any strides whose leading dimensions flatten)
    as the (rows, cols) ScaleView the kernel indexes."""
    fshape, fstrides, dtype, ptr, dev = array_fields(x, arg)
    if dtype != np.float32:
        raise TypeError(f"{arg} has dtype {dtype}; scales are float32")
    if tuple(fshape) != tuple(shape):
        raise ValueError(f"{arg} has shape {tuple(fshape)}; expected {tuple(shape)} ({what})")
    if ptr % 4 or any(s % 4 or s < 0 for s in fstrides):
        raise ValueError(f"{arg} must have non-negative strides of whole float32 elements")
    el = [s // 4 for s in fstrides]
    if len(shape) == 3:
        if shape[0] > 1 and shape[1] > 1 and el[0] != shape[1] * el[1]:
            raise ValueError(f"{arg} has strides {tuple(fstrides)}: its {shape[0]} matrices must lie one after "
                             "another along the rows: a contiguous (G, rows, cols) array, or the M-major one over "
                             "all groups' rows ((cols, G * rows) storage transposed and reshaped to (G, rows, cols), "
                             "as quantize returns for the (G * rows, K) matrix). Per-group transposed storage "
                             "(G, cols, rows) is not taken: pass a contiguous copy")
        rows, stride_i = shape[0] * shape[1], (el[1] if shape[1] > 1 else el[0])
    else:
        rows, stride_i = shape[0], el[0]
    return ScaleView(ptr, (rows, shape[-1]), stride_i, el[-1], int(dev), 4)


# -- the tile walk, on the host ----------------------------------------------------------------------------

def group_ranges(kind: int, bounds, m: int, max_m: int = 0) -> list[tuple[int, int]]:
    """[start, end) rows of every group as the kernel reads `bounds` (group_rows in sched_sm90.cuh): clamped to
    [0, m], empty when the end comes before the start."""
    ranges = []
    for g in range(len(bounds) // 2 if kind == _SEGMENTS else len(bounds)):
        if kind == _MASKED:
            s = g * max_m
            e = s + min(max(int(bounds[g]), 0), max_m)
        elif kind == _OFFSETS:
            s, e = (int(bounds[g - 1]) if g else 0), int(bounds[g])
        else:
            s, e = int(bounds[2 * g]), int(bounds[2 * g + 1])
        s = min(max(s, 0), m)
        e = max(min(e, m), s)
        ranges.append((s, e))
    return ranges


def tile_walk(ranges: list[tuple[int, int]], block_m: int, num_n_blocks: int, group_m: int, num_ctas: int
              ) -> list[list[tuple[int, int, int, int]]]:
    """The tiles each CTA runs, (group, row0, row_end, n_block), in order: a host model of the device walk
    (sched_sm90.cuh's raster + GroupedTileScheduler), for tests and for counting waves."""
    tiles = []
    for g, (s, e) in enumerate(ranges):
        m_blocks = -(-(e - s) // block_m)
        for t in range(m_blocks * num_n_blocks):
            band, in_band = divmod(t, group_m * num_n_blocks)
            band_m = config_mod.raster_band_m_blocks(m_blocks, group_m, band)
            tiles.append((g, s + (band * group_m + in_band % band_m) * block_m, e, in_band // band_m))
    return [tiles[c::num_ctas] for c in range(num_ctas)]


# -- the m_indices -> segments kernel ----------------------------------------------------------------------

_segments_memo: jit.Memo[jit.BuiltKernel] = jit.Memo()


def segments_kernel(arch: str) -> jit.BuiltKernel:
    """The compiled group_segments kernel for `arch` (memoized; disk-cached like every kernel)."""
    return _segments_memo.get(arch, lambda: jit.build_artifact(
        render(_SEGMENTS_TEMPLATE, _SEGMENTS_ENTRY, tag="group_segments"), arch, spec_tag="group_segments",
        meta={"kind": "group_segments"}))


# -- the GEMM ----------------------------------------------------------------------------------------------

class GroupedGemm:
    """A compiled grouped GEMM for one (N, K) and type: call it with the groups' rows (see the module)."""

    def __init__(self, spec: GemmSpec, arch: str, m_hint: int, artifact: jit.KernelArtifact,
                 deterministic: bool = True, launch_splits: bool = True):
        self.spec = spec
        self.arch = arch
        self.m_hint = m_hint
        self.artifact = artifact
        self.config = artifact.config
        self._epi = spec.epi
        self._returns_scales = self._epi.has_group_scales  # quant_fp8_g128: calls return (q, scales)
        self._a_dtypes = _accepted_dtypes(spec.dtype)
        self._b_dtypes = _accepted_dtypes(spec.b_type)
        self._out_dtypes = _accepted_dtypes(spec.out_dtype)
        self._ready_devices: set[int] = set()
        self._workspaces: dict[tuple[int, int, int], object] = {}  # group_segments outputs (see _segments)
        # Validated launches by the signatures of every operand (out= given: nothing allocated per call), as in
        # Gemm: a repeat call with the same buffers (the inference loop) only launches. m_indices calls and split-K
        # kernels serve only their stream, whose workspaces (segments, split partials) they write.
        self._plans = launch.KeptPlans(_MAX_LAUNCH_PLANS)
        self._lock = threading.Lock()
        self._launch_lock = threading.Lock()  # _run
        # Device-split kernels (sm90_rules.grouped_split_tile): the most K shares per tile, how they meet (as Gemm's
        # split-K calls: in split order unless deterministic=False) and their workspace, sized for the grid. One
        # share where the kernel was chosen for its speed alone (`launch_splits` False:
        # config.grouped_launch_splits): such launches never split and take no workspace.
        self.max_splits = splitk.grouped_max_splits(spec, self.config) if launch_splits else 1
        self.split_adds_atomically = splitk.adds_atomically(spec, deterministic)
        self._split_workspace = splitk.Workspace()

    def __repr__(self) -> str:
        return f"GroupedGemm({self.spec.tag}, {self.config.tag}, arch={self.arch})"

    def explain(self) -> dict:
        """What Gemm.explain() reports (spec, config, cache entry, resources, SASS), m_hint being the expected rows
        per group the tile was chosen for."""
        from .explain import describe

        return describe(self)

    @runtime.orders_dlpack_imports
    def __call__(self, a, b, *, offs=None, m_indices=None, masked_m=None, scale_a=None, scale_b=None, bias=None,
                 out=None, scales_out=None, stream=None):
        """d for every group (see the module for the layouts); returns `out` if given, else a new array of the
        inputs' kind ((q, scales) for quant_fp8_g128)."""
        spec = self.spec
        key = None
        if out is not None and (scales_out is not None or not self._returns_scales):
            key = tuple(map(signature, (a, b, out, offs, m_indices, masked_m, scale_a, scale_b, bias, scales_out)))
            hit = self._plans.lookup(key, stream) if None not in key else None
            if hit is not None:
                plans, cu_stream = hit
                self._run(plans, cu_stream)
                return (out, scales_out) if self._returns_scales else out
        given = [name for name, v in (("offs", offs), ("m_indices", m_indices), ("masked_m", masked_m))
                 if v is not None]
        if len(given) != 1:
            raise TypeError("say how the rows are grouped with exactly one of offs= or m_indices= (contiguous a "
                            f"(M, K)) or masked_m= (masked a (G, max_m, K)); got {given or 'none'}")
        masked = masked_m is not None
        kind = _common_kind(a, b, out)
        b_shape, vb = _stacked(b, "b", 3, self._b_dtypes, "(G, N, K): one (N, K) weight per group")
        num_groups = b_shape[0]
        if tuple(b_shape[1:]) != (spec.n, spec.k):
            raise ValueError(f"b has shape {b_shape}; expected (G, N, K) with N={spec.n}, K={spec.k}")
        if num_groups * spec.n > _MAX_ROWS:
            raise ValueError(f"b has {num_groups} groups of {spec.n} rows: at most {_MAX_ROWS} rows in all")
        a_shape, va = _stacked(a, "a", 3 if masked else 2, self._a_dtypes,
                               "(G, max_m, K)" if masked else "(M, K): the rows of all groups stacked")
        if masked and a_shape[0] != num_groups:
            raise ValueError(f"a has {a_shape[0]} groups, b has {num_groups}")
        if a_shape[-1] != spec.k:
            raise ValueError(f"a has shape {a_shape}; its last dimension must be K={spec.k}")
        m = va.rows
        if m > _MAX_ROWS:
            raise ValueError(f"a has {m} rows in all; at most {_MAX_ROWS}")
        max_m = a_shape[1] if masked else 0
        out_shape = (num_groups, max_m, spec.n_out) if masked else (m, spec.n_out)
        vd = None
        if out is not None:
            check_writable(out, "out")
            d_shape, vd = _stacked(out, "out", len(out_shape), self._out_dtypes, str(out_shape))
            if d_shape != out_shape:
                raise ValueError(f"out has shape {d_shape}, expected {out_shape}")
            if vd.device != va.device:  # the stores would land in another GPU's memory
                raise ValueError(f"out is on device {vd.device} but a is on device {va.device}")
        if masked:
            bounds = _int32_vector(masked_m, "masked_m", num_groups, "(G,) valid rows per group")
        elif offs is not None:
            bounds = _int32_vector(offs, "offs", num_groups, "(G,) cumulative row ends per group")
        else:
            bounds = _int32_vector(m_indices, "m_indices", m, "(M,) group of each row, -1 for padding")
            if num_groups > _SEGMENTS_MAX_GROUPS:
                raise ValueError(f"m_indices takes at most {_SEGMENTS_MAX_GROUPS} groups, b has {num_groups}; "
                                 "pass offs= instead")
        sa, sb = self._scales(m, masked, max_m, num_groups, scale_a, scale_b)
        vbias = self._bias(bias, num_groups)
        sv = None
        if scales_out is not None:
            if not self._returns_scales:
                raise TypeError(f"scales_out= was given, but this GroupedGemm's epilogue is {spec.epilogue!r}")
            sv = self._scales_out_view(scales_out, masked, num_groups, max_m, m)
        views = {"b": vb, given[0]: bounds, "scale_a": sa, "scale_b": sb, "bias": vbias, "scales_out": sv}
        for name, view in views.items():
            if view is None:
                continue
            if view.device != va.device:
                raise ValueError(f"{name} is on device {view.device} but a is on device {va.device}")
            if vd is not None and m and overlaps(vd, view):
                raise ValueError(f"out overlaps {name}; the kernel would read what it overwrites")
            if sv is not None and name != "scales_out" and m and overlaps(sv, view):
                raise ValueError(f"scales_out overlaps {name}; the kernel would read what it overwrites")
        if sv is not None and m and overlaps(sv, va):
            raise ValueError("scales_out overlaps a; the kernel would read what it overwrites")
        if vd is not None and m and overlaps(vd, va):
            raise ValueError("out overlaps a; the kernel would read what it overwrites")
        for view, name in ((va, "a"), (vb, "b")) + (((vd, "out"),) if vd is not None else ()):
            if not launch.tma_legal(view):
                raise ValueError(f"{name} must start on a 16-byte boundary with a row pitch of a multiple of 16 "
                                 "bytes (the grouped kernel reads and writes through TMA)")
        dev = device.device_for_call(self.arch, self._ready_devices, va.device, "GroupedGemm")
        cu_stream = runtime.stream_for(kind, stream, dev)
        if out is None:
            out = new_array(kind, out_shape, spec.out_dtype, dev, cu_stream, stream is not None)
            vd = _stacked(out, "out", len(out_shape), self._out_dtypes, str(out_shape))[1]
        result = out
        if self._returns_scales:
            if scales_out is None:
                scales_out = self._new_scales_out(kind, masked, num_groups, max_m, m, dev, cu_stream,
                                                  stream is not None)
                sv = self._scales_out_view(scales_out, masked, num_groups, max_m, m)
            result = (out, scales_out)
        if m == 0 or num_groups == 0:
            return result
        bias_ptr = vbias.ptr if vbias is not None else 0
        ops = launch.EpilogueOperands(bias=bias_ptr)
        if sv is not None:
            ops = launch.EpilogueOperands(bias=bias_ptr, quant=sv.ptr, scales_stride_m=sv.stride_i,
                                          scales_stride_g=sv.stride_j)
        plans: tuple[launch.LaunchPlan, ...] = ()
        bounds_ptr, bounds_kind = bounds.ptr, (_MASKED if masked else _OFFSETS)
        if m_indices is not None:  # per-row ids -> (start, end) per group, on the same stream
            plans = (self._segments_plan(bounds.ptr, m, num_groups, kind, dev, cu_stream, stream is not None),)
            bounds_ptr, bounds_kind = int(plans[0].args[3]), _SEGMENTS
        group = launch.GroupOperands(bounds=bounds_ptr, num_groups=num_groups, kind=bounds_kind, max_m=max_m,
                                     d=vd.ptr, d_ld=vd.row_stride)
        split = None
        if self.config.split_k and self.max_splits == 1:  # counts nothing, splits nothing: no workspace read
            split = splitk.SplitOperands(1, 0, 0, False)
        elif self.config.split_k:
            split = self._split_workspace.reserve(
                *splitk.grouped_workspace_bytes(self.config, launch.num_sms(dev)), self.max_splits, dev, cu_stream,
                self.split_adds_atomically, "this GroupedGemm (a split-K kernel)")
        plans += (launch.plan(launch.load(self.artifact, spec, dev), self.artifact, spec, m, va, vb, vd, dev, sa, sb,
                              ops, group, split),)
        self._run(plans, cu_stream)
        # Not the plans of a CUDA-graph capture (as Gemm's): it may borrow another stream's split workspace.
        if key is not None and None not in key and not runtime.is_capturing(cu_stream):
            bound = m_indices is not None or split is not None and split.partials
            self._plans.keep(key, plans, kind, dev, cu_stream.ptr if bound else None)
        return result

    def _run(self, plans: tuple, cu_stream) -> None:
        """The call's launches as one sequence: with m_indices= the segments kernel writes the stream's segments
        table, which the GEMM then reads; two threads calling on one stream (every thread's default) interleaved
        them, and a GEMM read the other call's table (each launch releases the GIL; review, session 60)."""
        if len(plans) == 1:
            plans[0].run(cu_stream)
            return
        with self._launch_lock:
            for plan in plans:
                plan.run(cu_stream)

    # -- pieces of the call ---------------------------------------------------------------------------------
    def _scales(self, m: int, masked: bool, max_m: int, num_groups: int, scale_a, scale_b):
        spec = self.spec
        if spec.scaling == "none":
            for x, arg in ((scale_a, "scale_a"), (scale_b, "scale_b")):
                if x is not None:
                    raise TypeError(f"{arg} was given, but this GroupedGemm ({spec.dtype}) takes no scales")
            return None, None
        kb, nb = -(-spec.k // 128), -(-spec.n // 128)
        if scale_a is None or scale_b is None:
            raise TypeError("scale_a and scale_b are required: FP8 grouped GEMMs take block scales (scale_a one per "
                            "1x128 group of A's rows, scale_b (G, ceil(N/128), ceil(K/128)))")
        shape_a = (num_groups, max_m, kb) if masked else (m, kb)  # (masked with max_m = 0 too: (G, 0, kb))
        sa = _scale_rows(scale_a, "scale_a", shape_a, "one per 1x128 group of each row of a")
        sb = _scale_rows(scale_b, "scale_b", (num_groups, nb, kb), "one per 128x128 block of each group's weight")
        return sa, sb

    def _segments_plan(self, ids_ptr: int, m: int, num_groups: int, kind: str, dev: int, cu_stream,
                       explicit: bool = False) -> launch.LaunchPlan:
        """The launch of group_segments (m_indices -> (start, end) per group) for `cu_stream`; its fourth argument
        is the segments' address. The workspace is kept per (device, stream, G) and reused: calls on one stream
        run in order, so a later call cannot overwrite it while an earlier one reads it (and a captured graph
        keeps its address). `explicit`: the call named its stream (arrays.allocating_for)."""
        key = (dev, stream_key(cu_stream.ptr), num_groups)  # the per-thread default stream: per thread
        with self._lock:
            workspace = self._workspaces.get(key)
            if workspace is None:
                # Kept for good (2 G int32 each): kept launch plans and captured graphs hold its address. Evicting
                # a full table and keeping the evicted alive made every call allocate anew once more than 16 keys
                # rotated (torch's pool of 32 streams), without bound.
                workspace = self._workspaces[key] = new_array(kind, (2 * num_groups,), "int32", dev, cu_stream,
                                                              explicit)
        seg_ptr = array_fields(workspace, "segments")[3]
        art = segments_kernel(self.arch)
        args = (np.uint64(ids_ptr), np.uint32(m), np.uint32(num_groups), np.uint64(seg_ptr))
        return launch.LaunchPlan(runtime.loaded_kernel(art, dev, 0), (1, 1, 1), (1024, 1, 1), args, dev)

    def _bias(self, bias, num_groups: int) -> MatrixView | None:
        epi, spec = self._epi, self.spec
        if (bias is not None) != (epi.bias != "none"):
            raise TypeError(f"bias= {'was given' if bias is not None else 'is required'}: this GroupedGemm's "
                            f"epilogue is {spec.epilogue!r}")
        if bias is None:
            return None
        if epi.bias != "col":
            raise ValueError("grouped GEMMs take a column bias per group (G, N)")
        want = dtypes.numpy_dtype(spec.epilogue_operand_dtype)
        shape, view = _stacked(bias, "bias", 2, (want,), "(G, N): one bias row per group")
        if shape != (num_groups, spec.n):
            raise ValueError(f"bias has shape {shape}, expected (G, N) = {(num_groups, spec.n)}")
        if view.row_stride != spec.n and num_groups > 1:
            raise ValueError("bias must be contiguous")
        return view

    def _new_scales_out(self, kind: str, masked: bool, num_groups: int, max_m: int, m: int, dev: int,
                        cu_stream=None, explicit: bool = False):
        """The quant_fp8_g128 scales a call allocates: M-major over all m rows (rows g * max_m + i for masked calls,
        the view split into (G, max_m, groups)) like quantize's group128 scales, so that a next grouped FP8 GEMM
        bulk-copies them as its scale_a."""
        groups = -(-self.spec.n_out // 128)
        scales_out = new_mn_major_scales(kind, m, groups, dev, cu_stream, explicit)
        return scales_out.reshape(num_groups, max_m, groups) if masked else scales_out

    def _scales_out_view(self, scales_out, masked: bool, num_groups: int, max_m: int, m: int) -> ScaleView:
        check_writable(scales_out, "scales_out")
        groups = -(-self.spec.n_out // 128)
        shape = (num_groups, max_m, groups) if masked else (m, groups)
        view = _scale_rows(scales_out, "scales_out", shape, "one per 1x128 group of each output row")
        if not has_distinct_elements(view.shape, (view.stride_i, view.stride_j)):
            raise ValueError("scales_out has zero or interleaving strides: its elements must be distinct")
        return view


def grouped_spec(N: int, K: int, dtype: str = "bf16", out_dtype: str | None = None, *, epilogue=None,
                 scaling: str | None = None, b_dtype: str | None = None) -> GemmSpec:
    """The GemmSpec :func:`build_grouped` compiles for these arguments (pure Python): what a forced ``config=``
    must suit (``config.sm90_config(grouped_spec(4096, 7168, dtype="fp8"), 128, 176)``). ValueError where TMA
    cannot read K or store N."""
    spec = GemmSpec.create(N, K, dtype=dtype, out_dtype=out_dtype, scaling=scaling, b_dtype=b_dtype,
                           epilogue=epilogue, grouped=True)
    esize, out_esize = dtypes.get(spec.dtype).storage_bytes, dtypes.get(spec.out_dtype).storage_bytes
    if (spec.k * esize) % 16:
        raise ValueError(f"K={spec.k}: grouped GEMMs read a and b through TMA, whose rows must be multiples of 16 "
                         f"bytes (K a multiple of {16 // esize} for {spec.dtype})")
    if (spec.n_out * out_esize) % 16:
        raise ValueError(f"N={spec.n}: the output rows ({spec.n_out} x {out_esize} bytes) must be multiples of 16 "
                         "bytes (TMA stores)")
    return spec


def build_grouped(N: int, K: int, dtype: str = "bf16", out_dtype: str | None = None, *, expected_m: int | None = None,
                  num_groups: int | None = None, epilogue=None, scaling: str | None = None,
                  b_dtype: str | None = None, arch: str | None = None,
                  config: config_mod.KernelConfig | None = None, deterministic: bool = True) -> GroupedGemm:
    """Compile (or load from the cache) a grouped GEMM for weights (G, N, K) and return it.

    ``dtype`` bf16 / fp16, or fp8 (block scales; ``b_dtype`` mixes E4M3 and E5M2). ``expected_m`` (rows per
    group) and ``num_groups`` are hints for the tile choice (defaults 512 and 8); any group sizes and any G
    work at call time. ``epilogue``: bias (per group), activations, swiglu / geglu, quant_fp8_g128.
    ``arch`` / ``config`` as for :func:`deepgemm_jit.build` (a forced config must suit :func:`grouped_spec`).
    Where the expected tiles make a few waves (a few groups of up to a thousand rows: FP8 up to 2 waves; 16-bit up
    to 8 waves of 128x128 tiles, which then replace the cost model's wider ones), the kernel splits the K of the
    tiles of the last, partial wave between CTAs when the realised group sizes would leave half the SMs idle there
    (decided on the device, ``splitk.tail_split``; ``sm90_rules.grouped_split_tile`` has the rule, epilogues with a bias
    keep the plain kernel; FP8 128x128 tiles without an epilogue always compile the device-split kernel, which was
    faster, and split only where that rule says; a forced device-split ``config`` splits wherever the realised
    groups leave SMs idle); ``deterministic`` as for :func:`deepgemm_jit.build` (False: the shares add atomically,
    faster, FP32 sums in arrival order)."""
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
    expected = _check_m(DEFAULT_EXPECTED_M if expected_m is None else expected_m, "expected_m")
    groups = _check_m(DEFAULT_NUM_GROUPS if num_groups is None else num_groups, "num_groups")
    spec = grouped_spec(N, K, dtype, out_dtype, epilogue=epilogue, scaling=scaling, b_dtype=b_dtype)
    target = device.target_arch(arch)
    launch_splits = True  # a forced device-split config splits where the realised groups leave SMs idle
    if config is None:  # every group rounds its rows up to whole tiles: the cost model counts them per group
        num_sms = device.num_sms() if arch is None else None
        cfg = config_mod.choose_config(spec, expected, target, num_sms, groups=groups)
        launch_splits = config_mod.grouped_launch_splits(spec, expected, num_sms or sm90_tiles.DEFAULT_SM90_NUM_SMS,
                                                         groups)
    elif isinstance(config, config_mod.KernelConfig):
        cfg = config
        cfg.check_for(spec, target)
    else:
        raise TypeError(f"config must be a deepgemm_jit.KernelConfig or None, got {type(config).__name__}")
    try:
        artifact = jit.get_kernel(spec, cfg, target)
    except KernelNotCachedError as exc:  # DEEPGEMM_JIT_OFFLINE=1: name the warmup line that would compile it
        from .warmup_sources import grouped_warmup_command_for

        local_sms = device.num_sms() if arch is None else None  # the heuristic chose for this GPU's SMs
        raise exc.with_warmup_command(grouped_warmup_command_for(spec, expected, groups, target, local_sms)) from None
    return GroupedGemm(spec, target, expected, artifact, deterministic, launch_splits)
