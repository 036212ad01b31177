"""Aligned copies of operands TMA cannot describe, for the Hopper kernels (``Gemm._staged_roles`` says when).

TMA needs a 16-byte aligned base and row pitches that are multiples of 16 bytes. Operands without them (an odd K in
16 bits, a sliced view, ...) are copied row by row (copies.py) into buffers with 128-byte pitches before the launch,
and D is written into one and copied out after it. The buffers belong to the ``Gemm`` (one set per device and
stream, stream_buffers.py; one buffer per operand role), are allocated on the first call that needs them and grown
when a larger call needs more; calls then only enqueue copies on their own stream, with no allocation and no
synchronisation, so a call can be captured in a CUDA graph once the Gemm has run at that size. A ``StagedPlan``
(the copies and the launch) is replayed like a plain launch plan by calls with the same operands
(``Gemm.__call__``), so the host work is three or four enqueued copies more than a plain call.

Example::

    staging = StagingBuffers()
    va2 = staging.aligned(va, "a", stream, device_id)   # va itself when TMA can read it
    plan = StagedPlan((copies.rows_plan([(va2, va)], arch, device_id),), launch.plan(... va2 ...), (),
                      staging.launch_lock)
    plan.run(stream)
"""
from __future__ import annotations

import dataclasses
import threading

from . import stream_buffers
from .arrays import MatrixView
from .launch import LaunchPlan, tma_legal, tma_store_legal

# Bytes a staged row pitch is rounded up to. TMA needs 16 (launch.tma_legal), but rows that start 16 bytes into a
# 32-byte sector (off_sector) read slowly: with 16-byte pitches 4096 x 4096 x 4100 BF16 ran 314 us staged against
# ~178 for the aligned GEMM (docs/NOTES.md session 25). 128 starts every row on a 128-byte line.
PITCH_ALIGN = 128
# TMA reads rows at the speed of aligned ones when they start on these (docs/NOTES.md session 26: BF16 pitches 32
# and 64 bytes past a 128-byte multiple ran as fast as 128-byte ones, 16 past it ~1.5x slower).
SECTOR_BYTES = 32
ROLES = ("a", "b", "d", "c", "residual")


def pitch_bytes(view: MatrixView) -> int:
    """The row pitch of `view`'s aligned copy: its row bytes rounded up to PITCH_ALIGN."""
    return -(-view.cols * view.itemsize // PITCH_ALIGN) * PITCH_ALIGN


def off_sector(view: MatrixView) -> bool:
    """Whether some row of `view` starts off a SECTOR_BYTES boundary (its base, or every other row of a pitch that
    is an odd multiple of 16 bytes): TMA reads such rows (at 16-byte alignment) ~1.5x slower, so calls copy such
    operands where that pays (sm90_rules.sm90_realign_roles)."""
    return view.ptr % SECTOR_BYTES != 0 or (view.rows > 1 and view.row_stride * view.itemsize % SECTOR_BYTES != 0)


def in_place(view: MatrixView, role: str, transposed: bool, realign: bool) -> bool:
    """Whether the kernel reads (or, for D, writes) `view` itself: TMA can describe it (D: store into it,
    launch.tma_store_legal, rows of whole 16-byte chunks), and the call neither transposes it nor asks for a copy of
    it anyway (`realign`: rows that start off sectors, off_sector)."""
    legal = tma_store_legal(view) if role == "d" else tma_legal(view)
    return legal and not transposed and not realign


def _staged_shape(view: MatrixView, transposed: bool) -> tuple[int, MatrixView]:
    """(rows, view of that shape) of the staged copy: `view` itself, or its transpose's shape."""
    if not transposed:
        return view.rows, view
    return view.cols, dataclasses.replace(view, rows=view.cols, cols=view.rows)


class StagingBuffers:
    """A Gemm's staging buffers: per device and stream (stream_buffers.py), one CuPy byte buffer per operand role
    (ROLES), grown on demand."""

    def __init__(self) -> None:
        self._sets = stream_buffers.StreamBuffers()
        self.launch_lock = threading.Lock()  # held by this Gemm's StagedPlans while they launch (StagedPlan.lock)

    def held(self) -> dict[tuple, object]:
        """Live buffers by (device, stream_buffers.stream_key, role) (tests, inspection)."""
        return self._sets.held()

    def fits(self, view: MatrixView, role: str, stream, transposed: bool = False, realign: bool = False) -> bool:
        """Whether a call on `stream` finds the buffer of `role` on `view`'s device already large enough for
        `view`'s aligned copy (or it needs none), or with `transposed` its transposed copy; `realign` as for
        aligned(). Under a CUDA-graph capture the buffer may be another stream's (stream_buffers.py)."""
        if in_place(view, role, transposed, realign):
            return True
        rows, shaped = _staged_shape(view, transposed)
        return self._sets.find(view.device, stream, {role: rows * pitch_bytes(shaped)}) is not None

    def aligned(self, view: MatrixView, role: str, stream, device_id: int, transposed: bool = False,
                realign: bool = False) -> MatrixView:
        """`view` when TMA can use it in place (D: store into it) and `realign` is off (with it a TMA-legal view is
        copied too: rows off sectors, off_sector); else a view of the same shape in the buffer of `role`, with a
        PITCH_ALIGN-byte pitch (the caller copies into or out of it: StagedPlan). `transposed`: always a view of the
        transposed shape (cols, rows) in that buffer (the caller transposes into it: copies.py). Growing a buffer
        allocates (for `stream`, and synchronises it): `stream` must not be capturing a CUDA graph then
        (RuntimeError)."""
        if in_place(view, role, transposed, realign):
            return view
        if role not in ROLES:
            raise ValueError(f"staging role {role!r} not in {ROLES}")
        rows, view = _staged_shape(view, transposed)
        pitch = pitch_bytes(view)
        nbytes = rows * pitch
        bufs = self._sets.buffers(device_id, stream, {role: nbytes}, lambda _role, n, s: _allocate(device_id, n, s),
                                  f"this call's aligned copy of {role} ({nbytes} bytes)",
                                  ", or pass operands whose rows are multiples of 16 bytes")
        return dataclasses.replace(view, ptr=bufs[role].data.ptr, row_stride=pitch // view.itemsize,
                                   device=device_id)


def _allocate(device_id: int, nbytes: int, stream):
    import cupy

    # Allocated with `stream` current: CuPy's pool then hands out a block no other stream's pending work may still
    # use (its free lists are per stream; the caller's current CuPy stream may be another one, e.g. for torch
    # tensors). The synchronisation only keeps growth, which is rare, ordered with everything the stream had queued.
    with cupy.cuda.Device(device_id), stream:
        buf = cupy.empty(nbytes, dtype=cupy.uint8)
    stream.synchronize()
    return buf


@dataclasses.dataclass(frozen=True)
class StagedPlan:
    """A launch on staged operands: the copies into the staging buffers, the launch, D's copy out. Replayable
    like a LaunchPlan (the buffers it points at stay alive: StagingBuffers retires, never frees, them)."""

    copies_in: tuple[LaunchPlan, ...]  # copies.py's row copies and transposes, before the launch: C, which may be
    #                                    D itself, among them, so all of them precede D's writes
    launch: LaunchPlan
    copies_out: tuple[LaunchPlan, ...]  # D's copy out of its staging buffer, if any
    # The staging buffers' lock (StagingBuffers.launch_lock): the launches go in as one sequence. Two threads calling
    # a Gemm on one stream (every thread's default stream) interleaved them, and a GEMM read the other thread's
    # copies (each launch releases the GIL; review, session 60).
    lock: object = dataclasses.field(compare=False, repr=False)  # (required: a private lock would serialise nothing)

    @property
    def device_id(self) -> int:
        return self.launch.device_id

    def run(self, stream) -> None:
        # Every launch after the first is programmatic (its kernel waits for the previous one first: griddep_wait;
        # LaunchPlan.run): a launch on the stream cost ~3 us at tiny sizes, ~2 when programmatic (docs/NOTES.md
        # session 26). The first keeps its plan's default.
        with self.lock:
            for i, copy in enumerate(self.copies_in):
                copy.run(stream, programmatic=True if i else None)
            self.launch.run(stream, programmatic=True if self.copies_in else None)
            for copy in self.copies_out:
                copy.run(stream, programmatic=True)
