"""Kernel arguments and grid per family: what a launch of a compiled kernel needs (a LaunchPlan).

sm80: raw pointers and row strides, one block per output tile.
sm90: TMA tensor maps (encoded on the host, memoized per buffer) and a persistent grid of at
most one block per SM.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from . import config as config_mod
from . import cubin as cubin_mod
from . import arrays, device, env, runtime, tma
from .arrays import MatrixView, ScaleView
from .jit import KernelArtifact
from .runtime import LoadedKernel
from .sm90_tiles import sm90_cluster_tiles, sm90_quant_cluster
from .spec import GemmSpec
from .splitk import SplitOperands
from .stream_buffers import stream_key

# Whether sm90 GEMM launches are programmatic by default (LaunchPlan.programmatic: the launch is processed while
# the previous kernel on the stream runs, the kernel waiting for it before touching memory). Chains of 20 calls
# captured in a CUDA graph ran 0.5-0.7 us faster per GEMM on every row measured (BF16 64x7168x2048 7.67 -> 7.00 us,
# FP8 block 64x32768x512 7.22 -> 6.53; docs/NOTES.md session 26); the flushed bench protocol sees no difference.
# Staged calls launch their GEMM and D's copy out so either way (staging.StagedPlan). The decode kernel (gemv.plan)
# follows the same flag: 1x7168x2048 BF16 7.02 -> 6.37 us, FP8 block 5.66 -> 4.98 (session 27).
PROGRAMMATIC_GEMMS = True

# Layout facts the sm90 kernel exports as `<entry>_<name>` constants (gemm_sm90.cu.j2).
SM90_SYMBOLS = ("smem_bytes", "num_threads", "d_box_cols", "d_box_rows", "d_swizzle_bytes")


def tma_legal(view: MatrixView) -> bool:
    """TMA needs a 16-byte aligned base and row strides that are multiples of 16 bytes."""
    return view.ptr % 16 == 0 and (view.rows <= 1 or (view.row_stride * view.itemsize) % 16 == 0)


def tma_store_legal(view: MatrixView) -> bool:
    """Whether a kernel may store into `view` in place through TMA: tma_legal, and rows of whole 16-byte chunks.
    TMA stores write whole 16-byte chunks: a row that ends inside one gets the rest of the chunk overwritten (the
    next columns of a row-padded view, or what follows a single row), bytes the caller owns and did not give us
    (tests/fuzz.py saw every row's next element change; triton-lang/triton#11583 documents the same)."""
    return tma_legal(view) and (view.cols * view.itemsize) % 16 == 0


@functools.lru_cache(maxsize=4096)
def _tensor_map(ptr: int, dtype: str, rows: int, cols: int, stride_bytes: int, box_rows: int, box_cols: int,
                swizzle: int):
    # A tensor map depends only on these values: memoizing keeps the driver call off the hot path
    # when a buffer is reused (the common case in inference loops).
    return tma.encode_tiled_2d(ptr, dtype, rows, cols, stride_bytes, box_rows, box_cols, swizzle)


@functools.lru_cache(maxsize=None)
def num_sms(device_id: int) -> int:
    return device.num_sms(device_id)


def sm90_symbols(artifact: KernelArtifact) -> dict[str, int]:
    """The layout facts an sm90 kernel exports, read from its cubin on the host."""
    return cubin_mod.entry_symbols(artifact.cubin, artifact.entry, SM90_SYMBOLS)


def takes(artifact: KernelArtifact, argument: str) -> bool:
    """Whether an sm90 kernel takes a trailing argument the templates added later ("a_box_rows", "edge_maps"): it
    exports `<entry>_takes_<argument>` = 1. Kernels from older template trees (A/B runs) do not, and load whole
    boxes."""
    return cubin_mod.optional_entry_symbol(artifact.cubin, artifact.entry, f"takes_{argument}") == 1


def decode_plan(artifact, arch: str, grid: tuple[int, int, int], block: tuple[int, int, int], args: tuple,
                device_id: int) -> LaunchPlan:
    """A LaunchPlan of a decode kernel (gemv.py, gemv_rows.py, gemv_kn.py: families compiled for sm_80 too), loaded
    on `device_id`. It launches programmatically (PROGRAMMATIC_GEMMS) where it waits for the previous grid before
    touching memory (`takes` programmatic_launch) and runs on sm_90a, whose griddepcontrol.wait that needs."""
    waits = arch == "sm_90a" and takes(artifact, "programmatic_launch")
    return LaunchPlan(runtime.loaded_kernel(artifact, device_id, 0), grid, block, args, device_id, waits,
                      waits and PROGRAMMATIC_GEMMS)


def a_box_rows(artifact: KernelArtifact, spec: GemmSpec, m: int) -> int:
    """Rows of an sm90 kernel's A box: the tile's block_m, or M for a dense K-major A of fewer rows than one tile.
    TMA zero-fills the rows of a box past the tensor on every K block, at a few cycles per row: with small B tiles
    that fill, not memory, set the pace (FP8 64x56 tiles ran 26% slower at M = 24 than at M = 64, session 9). The
    kernel expects a_box_rows rows of A per stage and leaves the others unwritten: they feed only output rows past
    M, which are never stored. Grouped GEMMs have tiles at many row offsets and keep whole boxes."""
    cfg = artifact.config
    if spec.grouped or not spec.a_k_major or m >= cfg.block_m or not takes(artifact, "a_box_rows"):
        return cfg.block_m
    return m


# A's edge map pays on tiles up to this wide. TMA's fill of the last M block's rows competes with the stage's B rows
# for the TMA unit; under a wide tile's wgmmas it hides. H200 session 23, the A edge on / off in one call
# (bench/results/*exp-ab-a-edge-on-off*, BF16): 128x128 at 400 x 4096 x 7168 55.8 -> 42.4 us (128x64 / 128x96 rows
# alike), 128x176 at 1300 x 4096 x 7168 107.3 / 107.6 (even); 128x224 / 128x256 ring tiles in one wave 0.5-2% slower
# with it (400 x 7168 x 16384 147.6 -> 150.8, 900 x 4096 x 7168 75.9 -> 77.3), equal in several waves. Wider tiles
# load whole A boxes, as before the edge maps, except as below. (B's edge map, for the last N block, pays at every
# width: 2600 x 4096 x 7168 at 128x240, whose last N block is 16 columns, 223.7 -> 210.3 us.)
A_EDGE_MAX_BLOCK_N = 176
# ... except where the last M block's tiles are a large share of the last waves and fill most of their A box: the
# raster (sched_sm90.cuh) walks the M blocks in bands of group_m, the last band last, so with at most
# A_EDGE_WIDE_MAX_LAST_BAND M blocks in it and at most A_EDGE_WIDE_MAX_ROWS rows in the edge block, wider tiles take
# A's edge map too. H200 session 24, A's edge map at every width against this rule's predecessor (up to 176 only), one
# call per set, BF16 (bench/results/*exp-ab-a-edge-wide-*-s24*): 129 x 37888 x 3584 (128x192) 142.6 -> 98.8 us,
# 129 x 28672 x 4096 (128x224) 112.3 -> 85.2, 160 rows 96.4 -> 85.0, 257 x 8192 x 8192 87.1 -> 68.9, 257 x 28672 x
# 4096 135.9 -> 122.3, 2049 rows (17 M blocks: a last band of one) 1.8-4% faster on four shapes; 1-2.4% slower at 4 to
# 9 M blocks (385 x 7168 x 16384 148.3 -> 151.9, 513 x 37888 x 3584, 1025 x 8192 x 8192) and at 300 rows (44 in the
# edge block: 120.3 -> 122.9 at 28672 x 4096), which the rule leaves out; 200 rows (72), 2600 and 3100 rows even.
A_EDGE_WIDE_MAX_LAST_BAND = 3
A_EDGE_WIDE_MAX_ROWS = 32


def a_edge_used(artifact: KernelArtifact, spec: GemmSpec, m: int) -> bool:
    """Whether a call with M rows loads A's partial last M block through an edge map: a dense K-major A of more rows
    than one tile with a partial last block, on tiles up to A_EDGE_MAX_BLOCK_N wide or on wider ones whose last
    raster band and edge block are small (A_EDGE_WIDE_*); DEEPGEMM_JIT_NO_A_EDGE turns it off for A/B runs."""
    cfg = artifact.config
    edge = m % cfg.block_m
    if spec.grouped or not spec.a_k_major or m <= cfg.block_m or edge == 0 or env.no_a_edge():
        return False
    if cfg.block_n <= A_EDGE_MAX_BLOCK_N:
        return True
    m_blocks = -(-m // cfg.block_m)
    last_band = config_mod.raster_band_m_blocks(m_blocks, cfg.group_m, (m_blocks - 1) // cfg.group_m)
    return last_band <= A_EDGE_WIDE_MAX_LAST_BAND and edge <= A_EDGE_WIDE_MAX_ROWS


def a_edge_rows(artifact: KernelArtifact, spec: GemmSpec, m: int) -> int:
    """Rows of A's edge map (GemmSm90::EdgeMaps): M % block_m where a_edge_used, else 0 (no tile loads through it;
    a_box_rows shrinks the one tile of a smaller A)."""
    return m % artifact.config.block_m if a_edge_used(artifact, spec, m) else 0


def b_edge_rows(artifact: KernelArtifact, spec: GemmSpec) -> int:
    """Rows of B's edge map: N % block_n for a dense K-major B (the kernel's kBEdgeRows), else 0."""
    if spec.grouped or not spec.b_k_major:
        return 0
    return spec.n % artifact.config.block_n


def edge_maps(artifact: KernelArtifact, spec: GemmSpec, m: int, va: MatrixView, vb: MatrixView, tmap_a, tmap_b
              ) -> tuple:
    """The three trailing arguments of a dense kernel (gemm_sm90.cu.j2): A's and B's edge maps and A's edge rows, or ()
    for kernels without them. TMA zero-fills a box's rows past the tensor at a few cycles per row on every K block,
    so the tiles of a partial last M / N block load through maps whose boxes end at the tensor: a 128-row tile with 16
    rows left in its last M block paced whole waves 1.3x slower (400 x 4096 x 7168 BF16: 56.5 us, 448 rows: 42.3).
    A's map where a_edge_used.
    A map a kernel does not use is passed as the main one."""
    if spec.grouped or not takes(artifact, "edge_maps"):
        return ()
    cfg = artifact.config
    a_rows, b_rows = a_edge_rows(artifact, spec, m), b_edge_rows(artifact, spec)
    map_a = operand_map(va, spec.dtype, spec.a_k_major, a_rows, cfg.block_k) if a_rows else tmap_a
    map_b = operand_map(vb, spec.b_type, spec.b_k_major, b_rows, cfg.block_k) if b_rows else tmap_b
    return map_a, map_b, np.uint32(a_rows)


def check_layout(artifact: KernelArtifact, spec: GemmSpec) -> None:
    """For sm90: config.py's shared-memory mirror must equal what the kernel itself computed (a
    mismatch is a bug in the mirror, caught before any launch)."""
    if artifact.config.family != "sm90":
        return
    exported = sm90_symbols(artifact)["smem_bytes"]
    mirror = artifact.config.smem_bytes(spec)
    if exported != mirror:
        raise RuntimeError(f"shared-memory layout mismatch for {artifact.meta.get('name')}: the kernel "
                           f"computes {exported} B, config.py {mirror} B")


def load(artifact: KernelArtifact, spec: GemmSpec, device_id: int) -> LoadedKernel:
    """Load `artifact` on `device_id` after checking its layout against config.py."""
    check_layout(artifact, spec)
    return runtime.loaded_kernel(artifact, device_id, artifact.config.smem_bytes(spec))


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a launch needs once the operands are validated: run it on a stream. The arguments are
    packed for the driver once, here, so a hot call that replays the plan packs nothing."""

    kernel: LoadedKernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple
    device_id: int
    # The kernel runs griddep_wait (common.cuh) before touching global memory, so it may be launched
    # programmatically: processed while the previous kernel on the stream still runs.
    waits: bool = False
    programmatic: bool = False  # launched so by default (PROGRAMMATIC_GEMMS); StagedPlan asks for it per launch
    packed: runtime.PackedArgs = field(init=False, repr=False, compare=False)
    bound: tuple = field(init=False, repr=False, compare=False)
    pdl: runtime.ProgrammaticLaunch | None = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.programmatic and not self.waits:
            raise ValueError("only a kernel that waits for the previous grid (waits=True) is launched programmatically")
        object.__setattr__(self, "packed", runtime.PackedArgs(self.args))
        object.__setattr__(self, "bound", self.kernel.bind(self.grid, self.block))
        # The programmatic launch's configuration (None: this plan always launches ordinarily).
        object.__setattr__(self, "pdl", self.kernel.programmatic_launch(self.grid, self.block)
                           if self.waits and not env.no_programmatic_launch() else None)

    def run(self, stream, programmatic: bool | None = None) -> None:
        """`programmatic`: launch so that the launch is processed while the previous kernel on `stream` still runs
        (runtime.LoadedKernel.launch), where the kernel waits for it (`waits`; never under
        DEEPGEMM_JIT_NO_PROGRAMMATIC_LAUNCH); None: the plan's default."""
        use = self.programmatic if programmatic is None else programmatic
        self.kernel.launch(self.grid, self.block, self.packed, stream, self.bound, self.pdl if use else None)


class KeptPlans:
    """Validated launches by the signatures of a call's operands (calls with out=: nothing allocated per call), as
    Gemm and GroupedGemm keep them: a repeat call with the same buffers (the inference loop) only launches. A plan
    serves any stream, or only the stream (handle) whose buffers it writes: split-K workspaces and staging buffers
    are kept per stream (stream_buffers.py). `plan` is anything with run(stream)."""

    def __init__(self, limit: int = 64, per_key_streams: int = 16):
        self._entries: dict[tuple, tuple[str, int, dict]] = {}  # key -> (array kind, device, {stream or None: plan})
        self._limit = limit
        self._per_key_streams = per_key_streams

    def lookup(self, key: tuple, stream) -> tuple[object, object] | None:
        """(plan, CuPy stream) for a call with these operand signatures on `stream` (the call's stream= argument),
        or None: no plan for them, for this stream, or for the current device."""
        entry = self._entries.get(key)
        if entry is None or entry[1] != device.current_device_id():
            return None
        kind, device_id, by_stream = entry
        cu_stream = runtime.stream_for(kind, stream, device_id)
        plan = by_stream.get(None)
        if plan is None:
            plan = by_stream.get(stream_key(cu_stream.ptr))
        return None if plan is None else (plan, cu_stream)

    def keep(self, key: tuple, plan, kind: str, device_id: int, stream_ptr: int | None) -> None:
        """Keep `plan` for calls with `key` on the stream with handle `stream_ptr` (None: on any stream; the
        per-thread default stream: in this thread, stream_buffers.stream_key)."""
        entry = self._entries.get(key)
        if entry is None or entry[:2] != (kind, device_id):
            if len(self._entries) >= self._limit:
                self._entries.clear()
            entry = self._entries[key] = (kind, device_id, {})
        if len(entry[2]) >= self._per_key_streams:
            entry[2].clear()
        entry[2][None if stream_ptr is None else stream_key(stream_ptr)] = plan

    def clear(self) -> None:
        self._entries.clear()

    def plans(self) -> list:
        """Every kept plan (tests, inspection)."""
        return [plan for _, _, by_stream in list(self._entries.values()) for plan in by_stream.values()]

    def __len__(self) -> int:
        return len(self._entries)


def _tma_pitch(view: MatrixView) -> int:
    """Row pitch for a tensor map: the view's, or for a single row (whose pitch is never used to address
    anything, and may be any value for the caller) the row's bytes rounded up to TMA's 16-byte rule."""
    if view.rows > 1:
        return view.row_stride * view.itemsize
    return -(-max(view.cols, 1) * view.itemsize // 16) * 16


def operand_map(view: MatrixView, dtype: str, k_major: bool, block_mn: int, block_k: int):
    """The tensor map of an sm90 operand (gemm_sm90.cuh, load_operand). K-major: the (M or N, K) view in boxes of
    block_k columns x block_mn rows. MN-major (16-bit, layouts nn / tn / tt): the (K, M or N) view in boxes of
    128 bytes of M / N (64 columns, one swizzle row) x block_k rows; the kernel issues block_mn / 64 of them per
    stage. 128-byte swizzle either way."""
    if k_major:
        box_rows, box_cols = block_mn, block_k
    else:
        box_rows, box_cols = block_k, 128 // view.itemsize
    return _tensor_map(view.ptr, dtype, view.rows, view.cols, _tma_pitch(view), box_rows, box_cols, 128)


def scale_args(sa: ScaleView | None, sb: ScaleView | None) -> tuple:
    """The six trailing sm90 arguments: scale pointers and (row, column) element strides (zeros when the
    kernel takes no scales)."""
    if sa is None or sb is None:
        return (np.uint64(0), np.uint64(0), np.int64(0), np.int64(0), np.int64(0), np.int64(0))
    return (np.uint64(sa.ptr), np.uint64(sb.ptr), np.int64(sa.stride_i), np.int64(sa.stride_j),
            np.int64(sb.stride_i), np.int64(sb.stride_j))


# The TMA thread's bulk copy of A's block scales pays from this many rows on (`m` as bulk_a_scales takes it); at decode
# sizes the scale warp copies them faster. H200, session 18, same call, A/B/A (bench/results/*bulk-a-scales-by-m-s18*):
# the scale warp ran the decode suite's FP8 block rows 1% (M = 1..16) to 5.5% (M = 128) faster, 128x2112x7168 16.3 ->
# 13.8 us (ncu: 14.1 -> 11.7 us); from M = 256 on the bulk copy is as fast (M = 256: +-1%) or faster (M = 512: 1-3%,
# 1024-2048: 3-5%, 4096: 0.2-8.6%; *exp-ab-bulk-a-scales-m256-2048-s18*). Measured with the TMA thread issuing the
# copy; since session 42 the scale warp issues it in dense 128-row tiles (M >= 256 gained 1-7% more), not
# re-measured at M 129.
BULK_A_SCALES_MIN_M = 129


def bulk_a_scales(spec: GemmSpec, sa: ScaleView | None, m: int) -> bool:
    """Whether an sm90 block-scaling kernel may bulk-copy scale_a (ScaleArgs::is_a_bulk, gemm_sm90.cuh): the TMA thread
    then copies a tile's A scales of a K block, rows [row0, row0 + n) with n = min(block_m, rows left rounded up to
    4), as one cp.async.bulk of 4n bytes, which needs a 16-byte aligned source. That holds for every tile starting on
    a row multiple of 4 (the kernel checks that part per tile) when scale_a, element (i, j) at ptr + 4 (i stride_i +
    j stride_j), is M-major (stride_i == 1; any stride for M == 1, whose one row is row 0), starts on 16 bytes and
    has stride_j % 4 == 0; and the read of rows up to round_up(M, 4) stays inside column j when stride_j >= round_up(M,
    4) (or there is one column). The last column's read of rows up to round_up(M, 4) passes the array's end when M %
    4 != 0: it must stay inside the allocation (arrays.allocation_end), as DeepGEMM's layout ((ceil(K/128),
    round_up(M, 4)) storage, transposed and cut to M rows) and quantize's do; a tight (K/128, M) storage falls back
    to the scale warp. Row-major scales never pass (for M > 1). `m`: the rows the kernel indexes (all groups' for
    grouped GEMMs, whose scale rows are the same global rows). DEEPGEMM_JIT_NO_BULK_SCALES=1 turns it off. (Dense
    kernels of 128-row tiles have the scale warp issue that copy instead: GemmSm90::kScaleWarpBulkA.)"""
    if sa is None or spec.scaling != "block" or m < 1 or env.no_bulk_scales():
        return False
    rows_up = -(-m // 4) * 4
    if not ((sa.stride_i == 1 or m == 1) and sa.ptr % 16 == 0 and sa.stride_j % 4 == 0
            and (sa.shape[1] <= 1 or sa.stride_j >= rows_up)):
        return False
    read_end = sa.ptr + 4 * ((sa.shape[1] - 1) * sa.stride_j + rows_up)
    return read_end <= sa.byte_span()[1] or read_end <= (arrays.allocation_end(sa.ptr) or 0)


def use_bulk_a_scales(spec: GemmSpec, sa: ScaleView | None, m: int) -> bool:
    """Whether a launch of `m` rows bulk-copies scale_a: where it may (bulk_a_scales) and pays (BULK_A_SCALES_MIN_M)."""
    return m >= BULK_A_SCALES_MIN_M and bulk_a_scales(spec, sa, m)


@dataclass(frozen=True)
class EpilogueOperands:
    """Run-time operands of a fused epilogue: the bias pointer (0 when unused), C and the residual as views
    (the kernel loads them by TMA like D is stored), and the scalars. Quantize-on-store: `quant` points at the
    group scales the kernel writes (quant_fp8_g128; element (i, g) at i * scales_stride_m + g * scales_stride_g) or
    at the static scale it reads (per-tensor kinds), `amax` at the amax output (0: none). `bias_view` is the bias as
    validated (arrays.ScaleView), kept for the overlap checks of what a quantize-on-store epilogue writes."""

    bias: int = 0
    bias_view: object = None
    c: MatrixView | None = None
    residual: MatrixView | None = None
    alpha: float = 1.0
    beta: float = 1.0
    quant: int = 0
    amax: int = 0
    scales_stride_m: int = 0
    scales_stride_g: int = 0

    def scalar_args(self) -> tuple:
        return (np.uint64(self.bias), np.float32(self.alpha), np.float32(self.beta))

    def quant_args(self) -> tuple:
        """The four trailing arguments of kernels with a quantize-on-store epilogue (gemm_sm90.cu.j2)."""
        return (np.uint64(self.quant), np.uint64(self.amax), np.int64(self.scales_stride_m),
                np.int64(self.scales_stride_g))

    def views(self) -> tuple[MatrixView, ...]:
        """The (M, N) operands the kernel reads through tensor maps."""
        return tuple(v for v in (self.c, self.residual) if v is not None)


NO_EPILOGUE = EpilogueOperands()


@dataclass(frozen=True)
class GroupOperands:
    """Run-time operands of a grouped kernel (GroupArgs in gemm_sm90.cuh): where the group bounds are (`kind` 0:
    cumulative row offsets, 1: (start, end) segments, 2: masked row counts of groups of `max_m` rows), the number of
    groups (B is stacked as (num_groups * N, K)), and D's base and row pitch (elements) for tiles that end inside
    their group."""

    bounds: int
    num_groups: int
    kind: int
    max_m: int
    d: int
    d_ld: int

    def args(self) -> tuple:
        return (np.uint64(self.bounds), np.uint32(self.num_groups), np.uint32(self.kind), np.uint32(self.max_m),
                np.uint64(self.d), np.int64(self.d_ld))


# The persistent walk's CTAs: one per SM, or one per unit when there are fewer. `balanced` (FP8 block kernels): the
# fewest CTAs that keep the walk's number of rounds, ceil(units / ceil(units / SMs)), e.g. 128 for 1024 tiles
# instead of 132 of which 100 run 8 tiles and 32 run 7. Measured on the H200 (session 43,
# `*exp-cluster-placement-balanced-grid-s43*`, us): FP8 block 4096x4096x7168 179.6 -> 173.9, 4096x7168x2048
# 104.1 -> 103.1, 4096x2112x7168 102.8 -> 101.5; BF16 rows within 0.5% (not applied to them).
def persistent_grid(units: int, sms: int, balanced: bool = False) -> int:
    if units <= sms or not balanced:
        return max(1, min(sms, units))
    rounds = -(-units // sms)
    return -(-units // rounds)


def cluster_grid(kernel: LoadedKernel, spec: GemmSpec, cfg, m: int, cluster: int, num_threads: int,
                 device_id: int) -> int:
    """Clusters of a kernel whose CTAs work in clusters of `cluster` along N (sm90_quant_cluster): one per cluster
    tile (an M block by `cluster` N blocks), at most as many as the device keeps resident at once (a GPC holds whole
    clusters only: runtime.LoadedKernel.max_active_clusters) and as SMs allow."""
    resident = min(num_sms(device_id) // cluster, kernel.max_active_clusters(cluster, (num_threads, 1, 1)))
    return persistent_grid(sm90_cluster_tiles(spec, m, cfg.block_m, cfg.block_n), resident,
                           balanced=spec.scaling == "block")


def plan(kernel: LoadedKernel, artifact: KernelArtifact, spec: GemmSpec, m: int, va: MatrixView,
         vb: MatrixView, vd: MatrixView, device_id: int, sa: ScaleView | None = None,
         sb: ScaleView | None = None, epi: EpilogueOperands = NO_EPILOGUE,
         group: GroupOperands | None = None, split: SplitOperands | None = None) -> LaunchPlan:
    """Grouped kernels take `group`; `m` is then the rows of all groups and vb the stacked (G * N, K) weight.
    Split-K kernels take `split` (splitk.py: the call's K shares per tile and the Gemm's workspace)."""
    cfg = artifact.config
    if cfg.family == "sm90":
        if spec.grouped != (group is not None):
            raise ValueError("grouped kernels, and only they, take group operands")
        if cfg.split_k != (split is not None):
            raise ValueError("split-K kernels, and only they, take split operands")
        sym = sm90_symbols(artifact)
        a_rows = a_box_rows(artifact, spec, m)
        tmap_a = operand_map(va, spec.dtype, spec.a_k_major, a_rows, cfg.block_k)
        tmap_b = operand_map(vb, spec.b_type, spec.b_k_major, cfg.block_n, cfg.block_k)

        def output_map(view: MatrixView):  # D, and C / residual, which the epilogue reads in D's tiles
            return _tensor_map(view.ptr, spec.out_dtype, m, spec.n_out, _tma_pitch(view), sym["d_box_rows"],
                               sym["d_box_cols"], sym["d_swizzle_bytes"])

        tmap_d = output_map(vd)
        maps = (tmap_a, tmap_b, tmap_d)
        if spec.epi.beta or spec.epi.residual:  # only such kernels take the C and residual maps
            maps += (output_map(epi.c) if epi.c is not None else tmap_d,
                     output_map(epi.residual) if epi.residual is not None else tmap_d)
        # A grouped kernel's tile count depends on the group sizes on the device: every CTA starts and walks.
        tiles = -(-m // cfg.block_m) * -(-spec.n // cfg.block_n) if group is None else num_sms(device_id)
        units = tiles * (split.num_splits if split is not None else 1)
        cluster = sm90_quant_cluster(spec, cfg.block_n)
        if cluster > 1:  # the walk is over cluster tiles, one cluster of CTAs each (TileScheduler)
            grid = (cluster * cluster_grid(kernel, spec, cfg, m, cluster, sym["num_threads"], device_id), 1, 1)
        else:
            grid = (persistent_grid(units, num_sms(device_id), balanced=spec.scaling == "block"), 1, 1)
        args = maps + (np.uint32(m),) + scale_args(sa, sb) + epi.scalar_args()
        if spec.epi.quant != "none":  # only such kernels take the quantize-on-store arguments
            args += epi.quant_args()
        if group is not None:
            args += group.args()
        if split is not None:
            args += split.args()
        # Last, so that kernels from templates without them (A/B runs against older trees) take the same arguments.
        args += (np.uint32(use_bulk_a_scales(spec, sa, m)), np.uint32(a_rows))
        if split is not None:
            args += split.mode_args()
        args += edge_maps(artifact, spec, m, va, vb, tmap_a, tmap_b)
        waits = takes(artifact, "programmatic_launch")
        return LaunchPlan(kernel, grid, (sym["num_threads"], 1, 1), args, device_id, waits,
                          waits and PROGRAMMATIC_GEMMS)
    grid = (-(-m // cfg.block_m), -(-spec.n // cfg.block_n), 1)
    if grid[0] * cfg.block_m > 1 << 31:  # gemm_sm80.cuh indexes rows in 32-bit ints, up to the last block's end
        raise ValueError(f"M = {m} with the portable kernel's {cfg.block_m}-row blocks runs row indices past 2^31 - 1; "
                         "use a block_m dividing 2^31 (a power of two) or fewer rows per call")
    args = (np.uint64(va.ptr), np.uint64(vb.ptr), np.uint64(vd.ptr), np.int32(m),
            np.int64(va.row_stride), np.int64(vb.row_stride), np.int64(vd.row_stride))
    return LaunchPlan(kernel, grid, (cfg.num_threads, 1, 1), args, device_id)
