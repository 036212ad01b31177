"""Timing on the GPU by the protocol of DESIGN.md ("Measuring").

CUDA events around the kernel alone, warm-up first, L2 flushed before every
repetition (the flush is outside the events), median of the repetitions, and
several functions timed interleaved so that clock and thermal drift hit all of
them alike.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

FLUSH_BYTES = 256 * 1024 * 1024  # > 2x the 60 MB L2 of an H200


def time_interleaved(fns: Sequence[Callable[[], object]], *, reps: int = 30, warmup: int = 5,
                     flush_bytes: int = FLUSH_BYTES) -> list[dict]:
    """Per function: {'median_us', 'min_us', 'p20_us', 'p80_us', 'reps'}."""
    import cupy

    flush = cupy.empty(flush_bytes // 4, dtype=cupy.int32)
    for fn in fns:
        for _ in range(warmup):
            fn()
    cupy.cuda.get_current_stream().synchronize()
    samples: list[list[float]] = [[] for _ in fns]
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(reps):
        for i, fn in enumerate(fns):
            flush.fill(0)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            samples[i].append(cupy.cuda.get_elapsed_time(start, stop) * 1000.0)
    out = []
    for s in samples:
        arr = np.asarray(s)
        out.append({"median_us": float(np.median(arr)), "min_us": float(arr.min()),
                    "p20_us": float(np.percentile(arr, 20)), "p80_us": float(np.percentile(arr, 80)),
                    "reps": len(s)})
    return out
