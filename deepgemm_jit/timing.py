"""Timing on the GPU by the protocol of DESIGN.md ("Measuring"): ``time_interleaved``.

For each repetition and each contender: flush L2 by writing a buffer ≥ 2× the L2 (outside the events), record a
start event, call the contender, record an end event. Contenders alternate within a repetition and the order
flips every repetition (a, b | b, a | ...), so drift in clocks or temperature hits all of them alike. Warm-up
calls come first (JIT compile, cuBLAS handles and heuristics, module load stay out of the numbers).

Every call is enqueued on the current CuPy stream; a contender that launches through torch must run on that
stream too (``baseline.py`` takes care of it). The host does not wait between repetitions, so the flush kernel
still runs while the next contender is being launched: launch overhead stays out of the events as long as it
is shorter than a flush. Each result carries both (``host_us``, ``flush_us``) so that a caller can say when not.

Uses ``cupy.cuda.Event`` only (works with or without torch). Importing this module touches no GPU.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Mapping, Sequence

import numpy as np

from . import device

DEFAULT_FLUSH_BYTES = 256 * 1024 * 1024   # > 4x the 60 MB L2 of an H200
MIN_PROTOCOL_REPS = 30


@dataclasses.dataclass(frozen=True)
class Timing:
    """Event-timed statistics of one contender, in µs."""

    median_us: float
    min_us: float
    p20_us: float
    p80_us: float
    num_reps: int
    host_us: float     # median host time to enqueue one call
    flush_us: float    # median device time of the L2 flush before each call
    times_us: tuple[float, ...] = dataclasses.field(repr=False)


def percentiles(times_us: Sequence[float]) -> dict[str, float]:
    """{'median_us', 'min_us', 'p20_us', 'p80_us'} of a list of timings (NumPy's linear rule)."""
    if len(times_us) == 0:
        raise ValueError("no timings")
    arr = np.asarray(times_us, dtype=np.float64)
    p20, median, p80 = np.percentile(arr, [20.0, 50.0, 80.0])
    return {"median_us": float(median), "min_us": float(arr.min()), "p20_us": float(p20), "p80_us": float(p80)}


class L2Flusher:
    """Writes `num_bytes` (≥ 2× the device's L2) on the current stream; allocate once, reuse for every call."""

    def __init__(self, num_bytes: int = DEFAULT_FLUSH_BYTES):
        import cupy

        l2 = device.l2_bytes()
        if num_bytes < 2 * l2:
            raise ValueError(f"flush buffer of {num_bytes} B is under 2x the {l2} B L2; raise num_bytes")
        self.num_bytes = num_bytes
        self._buf = cupy.empty(num_bytes, dtype=cupy.uint8)
        self._value = 0

    def __call__(self) -> None:
        import cupy

        # A different byte each time: rewriting what is there is still a write, but leave no doubt.
        self._value = (self._value + 1) & 0xFF
        stream = cupy.cuda.get_current_stream()
        cupy.cuda.runtime.memsetAsync(self._buf.data.ptr, self._value, self.num_bytes, stream.ptr)


def time_interleaved(fns: Mapping[str, Callable[[], object]], *, reps: int = MIN_PROTOCOL_REPS, warmup: int = 3,
                     flush: Callable[[], None] | None = None) -> dict[str, Timing]:
    """Time each zero-argument callable of `fns` with CUDA events, interleaved, L2 flushed before every call.

    Returns {name: Timing} in the order of `fns`. Raises whatever the callables or CUDA raise.

    >>> t = time_interleaved({"ours": lambda: g(a, b, out=d), "cublas": base.fn})
    >>> t["cublas"].median_us / t["ours"].median_us      # above 1: ours is faster
    """
    import cupy

    if not fns:
        raise ValueError("nothing to time")
    if reps < 1 or warmup < 0:
        raise ValueError(f"reps={reps} must be >= 1 and warmup={warmup} >= 0")
    names = list(fns)
    flush = flush or L2Flusher()
    dev = cupy.cuda.Device()

    for _ in range(warmup):
        for name in names:
            fns[name]()
    dev.synchronize()

    Event = cupy.cuda.Event
    events: dict[str, list[tuple[Event, Event, Event, Event]]] = {n: [] for n in names}
    host_s: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            flush_start, flush_end, start, end = Event(), Event(), Event(), Event()
            flush_start.record()
            flush()
            flush_end.record()
            start.record()
            t0 = time.perf_counter()
            fns[name]()
            host_s[name].append(time.perf_counter() - t0)
            end.record()
            events[name].append((flush_start, flush_end, start, end))
    dev.synchronize()

    out: dict[str, Timing] = {}
    for name in names:
        times_us = [cupy.cuda.get_elapsed_time(s, e) * 1e3 for _, _, s, e in events[name]]
        flush_us = [cupy.cuda.get_elapsed_time(f0, f1) * 1e3 for f0, f1, _, _ in events[name]]
        out[name] = Timing(**percentiles(times_us), num_reps=len(times_us),
                           host_us=float(np.median(host_s[name])) * 1e6, flush_us=float(np.median(flush_us)),
                           times_us=tuple(times_us))
    return out
