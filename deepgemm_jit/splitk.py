"""Split-K for the Hopper family: how many CTAs share each tile's K, and the memory they meet in.

A problem with fewer output tiles than SMs (decode and small prefill: M <= a few hundred rows) leaves most SMs
idle however the tiles are shaped. A split-K kernel (``KernelConfig.split_k``, ``SplitArgs`` in
``templates/include/dgjit/gemm_sm90.cuh``) divides each tile's K blocks into ``num_splits`` nearly equal shares
that run on different CTAs at the same time. Each share stores its partial tile (FP32, or INT32 for INT8) in a
workspace and counts its arrival; the share that arrives last sums the partials in split order and runs the
fused epilogue. The sum's order does not depend on which share is last, so results are the same bits on every
run (deterministic, the default). ``build(..., deterministic=False)`` makes the Gemm's split-K calls add their
partials atomically into one zeroed sum per tile instead (vector ``red.add`` at the L2), which the last share reads
once and zeroes again: FP32 results then vary in their last bits with the order the shares arrive in. INT8 kernels
keep the ordered sum (INT32 sums are exact either way, and its scalar reductions measured slower). Below 64 rows a partial holds only the rows below M (:func:`partial_threads`: at M = 1, 4
of a consumer's 128 threads store and load theirs).

Dispatch:

- ``config.choose_sm90_config`` compiles a split-K kernel when the cost model (``sm90_cost.sm90_tile_cost`` with
  ``splits``) finds a split count above 1 cheaper than every unsplit tile at the M bucket of ``build``'s M (only
  for buckets up to ``sm90_rules.SPLIT_MAX_M``, non-grouped GEMMs);
- each call then picks the count for its own M (:func:`num_splits`): 1 where splitting does not pay or M is past
  ``SPLIT_MAX_M`` (a split-K kernel with one share is the plain kernel plus a branch);
- ``build(..., split_k=S)`` forces S shares on every call (``split_k=1``: never split);
- grouped GEMMs decide on the device (:func:`tail_split`, at most ``GroupedGemm.max_splits`` shares): the
  heuristic's device-split kernels of ``sm90_rules.grouped_split_tile`` may split; the FP8 128x128 ones it compiles for
  their speed alone (``config.grouped_launch_splits`` False) get one share and no workspace.

Workspace (:class:`Workspace`): one per ``Gemm``, device and stream (``stream_buffers.py``: calls of one Gemm on
two streams may overlap), allocated on a stream's first call that needs it (zeroed on that stream, which is then
synchronised) and grown (never freed while the Gemm lives: kept launch plans hold its address) when a larger M
needs more. The arrival counters are zeroed once at allocation; every launch leaves them zero. Nothing is allocated
or synchronised on later calls, so a call can be captured in a CUDA graph once the Gemm has run at that size (on
any stream: a capture borrows another stream's workspace when its own is missing or too small).

Example::

    g = deepgemm_jit.build(64, 2112, 7168, dtype="bf16")   # a split-K kernel for the 64-row bucket
    g.config.split_k, splitk.num_splits(g.spec, g.config, 64, 132)   # (True, 4)
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from . import sm90_cost, sm90_rules, stream_buffers
from .config import KernelConfig
from .spec import GemmSpec

PARTIAL_BYTES = 4  # FP32 (or INT32) per accumulator


def num_tiles(spec: GemmSpec, cfg: KernelConfig, m: int) -> int:
    return -(-m // cfg.block_m) * -(-spec.n // cfg.block_n)


@functools.lru_cache(maxsize=4096)
def num_splits(spec: GemmSpec, cfg: KernelConfig, m: int, num_sms: int, forced: int | None = None) -> int:
    """K shares per tile for a call with M = m: `forced` when given (clamped to the K blocks), else the cheapest
    count of the cost model for this tile; 1 for kernels without split-K. Memoized: a pure function of hashable
    arguments, on the path of every call without a kept launch plan (the cost model took ~10 us on 2 cores)."""
    if not cfg.split_k:
        return 1
    k_blocks = -(-spec.loop_k // cfg.block_k)
    if forced is not None:
        return max(1, min(forced, k_blocks))
    if m > sm90_rules.SPLIT_MAX_M:  # the rule's range, as for the kernel choice
        return 1
    return sm90_cost.sm90_best_splits(spec, m, cfg.block_m, cfg.block_n, num_sms, cfg.num_stages)[1]


def adds_atomically(spec: GemmSpec, deterministic: bool) -> bool:
    """Whether a Gemm's split-K calls add their shares atomically (build(..., deterministic=False)); INT8 kernels
    keep the ordered sum whatever was asked: INT32 sums are exact in any order, and their scalar reductions
    measured slower (mirror of GemmSm90::reduce_split's kCanAdd)."""
    return not deterministic and spec.dtype != "int8"


def partial_threads(m: int) -> int:
    """Threads of a consumer warpgroup whose accumulators hold rows below M = m in a tile's first 64 rows: the first
    ones (thread t holds rows 16 (t // 32) + (t % 32) // 4 and 8 below), and only they store partials
    (GemmSm90::partial_threads): 128 from M = 64 on, 4 at M = 1."""
    if m >= 64:
        return 128
    return m // 16 * 32 + min(m % 16, 8) * 4


def workspace_bytes(spec: GemmSpec, cfg: KernelConfig, m: int, splits: int) -> tuple[int, int]:
    """(partial-tile bytes, arrival-counter bytes) a launch with `splits` shares needs (0, 0 for one share). Partials
    keep only the threads that hold rows below M (partial_threads: at M = 1, 1/32 of a tile)."""
    if splits <= 1:
        return 0, 0
    tiles = num_tiles(spec, cfg, m)
    tile_bytes = cfg.block_m * cfg.block_n * PARTIAL_BYTES * partial_threads(m) // 128
    return tiles * splits * tile_bytes, tiles * 2 * 4


def grouped_max_splits(spec: GemmSpec, cfg: KernelConfig) -> int:
    """The most K shares a grouped split-K kernel may give a tile (sm90_rules.grouped_split_tile, or a forced config,
    compiles one): the kernel picks its own count from the realised tiles (tail_split); 1 for other grouped kernels.
    (build_grouped passes 1 instead where the heuristic chose the split kernel for its speed alone:
    config.grouped_launch_splits.)"""
    if not cfg.split_k:
        return 1
    return min(sm90_rules.GROUPED_MAX_SPLITS, max(sm90_cost.split_candidates(spec.loop_k, cfg.block_k)))


GROUPED_SCAN_WAVES = 8  # GroupedTileScheduler::kScanWaves


def tail_split(tiles: int, num_ctas: int, max_splits: int) -> tuple[int, int]:
    """(whole tiles, K shares of each tile after them) of a grouped split-K launch of `num_ctas` CTAs whose groups
    make `tiles` tiles (mirror of GroupedTileScheduler, sched_sm90.cuh): the whole waves run whole tiles, and the
    tiles of the last, partial wave are split into as many shares as fit the grid (at most max_splits) when they
    would leave at least half of the CTAs idle; else every tile runs whole (shares 1). (tiles left) x shares <=
    num_ctas (grouped_workspace_bytes relies on it). Past GROUPED_SCAN_WAVES waves the kernel stops counting and
    never splits; with max_splits 1 it does not count."""
    left = tiles % num_ctas
    if max_splits <= 1 or tiles > GROUPED_SCAN_WAVES * num_ctas or left == 0 or 2 * left > num_ctas:
        return tiles, 1
    return tiles - left, min(max_splits, num_ctas // left)


def grouped_workspace_bytes(cfg: KernelConfig, num_ctas: int) -> tuple[int, int]:
    """(partial-tile bytes, arrival-counter bytes) of a grouped split-K launch of `num_ctas` CTAs, whatever the group
    sizes: its split tiles times their shares never exceed the grid (tail_split), each share one whole partial tile,
    and one counter per split tile and consumer warpgroup."""
    return num_ctas * cfg.block_m * cfg.block_n * PARTIAL_BYTES, num_ctas * 2 * 4


@dataclass(frozen=True)
class SplitOperands:
    """A split-K kernel's split arguments (gemm_sm90.cu.j2): three after the group arguments, and the mode last."""

    num_splits: int
    partials: int = 0
    arrivals: int = 0
    atomic: bool = False

    def args(self) -> tuple:
        return (np.uint32(self.num_splits), np.uint64(self.partials), np.uint64(self.arrivals))

    def mode_args(self) -> tuple:
        return (np.uint32(1 if self.atomic else 0),)


class Workspace:
    """Partial tiles and arrival counters of one Gemm, per device and stream (stream_buffers.py; see the module
    docstring)."""

    def __init__(self):
        self._sets = stream_buffers.StreamBuffers()

    def held(self) -> dict[tuple, object]:
        """Live buffers by (device, stream_buffers.stream_key, role) (tests, inspection)."""
        return self._sets.held()

    def pairs(self) -> list[tuple[object, object]]:
        """(partials, arrivals) of every stream's live workspace (tests)."""
        held = self.held()
        return [(buf, held[(dev, stream, "arrivals")]) for (dev, stream, role), buf in held.items()
                if role == "partials"]

    def operands(self, spec: GemmSpec, cfg: KernelConfig, m: int, splits: int, device_id: int, stream,
                 atomic: bool = False) -> SplitOperands:
        """The launch's split operands, allocating (or growing) the stream's workspace first when it is too small;
        `stream` (the call's CuPy stream) must not be capturing a CUDA graph then, since allocation synchronises.
        `atomic`: the shares add into zeroed partials (a Gemm keeps one mode, so its workspace is never left
        non-zero)."""
        partial_bytes, arrival_bytes = workspace_bytes(spec, cfg, m, splits)
        if partial_bytes == 0:
            return SplitOperands(1)
        return self.reserve(partial_bytes, arrival_bytes, splits, device_id, stream, atomic,
                            f"this split-K call (M={m}, {splits} shares per tile)")

    def reserve(self, partial_bytes: int, arrival_bytes: int, splits: int, device_id: int, stream,
                atomic: bool = False, what: str = "this split-K call") -> SplitOperands:
        """SplitOperands for `splits` shares over at least these many bytes of partials and counters (see
        operands; grouped kernels size theirs by grouped_workspace_bytes)."""
        bufs = self._sets.buffers(device_id, stream, {"partials": partial_bytes, "arrivals": arrival_bytes},
                                  lambda role, nbytes, for_stream: _allocate(nbytes, device_id, for_stream), what)
        return SplitOperands(splits, bufs["partials"].data.ptr, bufs["arrivals"].data.ptr, atomic)


def _allocate(nbytes: int, device_id: int, stream):
    """Zeroed bytes (counters, or partial tiles the atomic mode adds into) on `device_id`, for `stream` (the call's,
    which stream_buffers checked is not capturing). Allocated and zeroed with `stream` current, as staging._allocate
    allocates: CuPy's pool then hands out a block no other stream's pending work may still use, and the memset is
    queued on `stream`, not on CuPy's current stream (the legacy NULL stream by default, which would wait on every
    blocking stream, a capturing one included). Only `stream` is synchronised, so that the zeros are in place
    whatever stream later reads them (a capture on another stream may borrow the buffer): a device-wide
    synchronisation is invalid while any stream of the device captures a CUDA graph, and would invalidate that
    capture."""
    import cupy

    with cupy.cuda.Device(device_id), stream:
        buf = cupy.zeros(nbytes // 4, dtype=cupy.uint32)
    stream.synchronize()
    return buf
