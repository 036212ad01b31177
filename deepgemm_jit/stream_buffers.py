"""Buffers a Gemm keeps per (device, stream): split-K workspaces (splitk.py) and staging buffers (staging.py).

A call's kernels write these buffers, so two calls of one Gemm running at the same time must not share them.
Calls on one stream run in order; calls on two streams may overlap: two micro-batches, each on its own stream,
calling the same memoized Gemm (``deepgemm_jit.gemm``, the torch ops). So each stream gets a set of its own, as
PyTorch keeps a cuBLAS workspace per (handle, stream).

Rules:

- A stream's set is made on its first call that needs one, and a buffer grows (at least doubled) when a call
  needs more. Allocation synchronises, so it never happens while the stream captures a CUDA graph. No buffer is
  freed while the Gemm lives (outgrown ones are retired): kept launch plans and captured graphs point at them.
  So the memory grows with the number of streams that call the Gemm: reuse streams (torch's pools do), do not make
  one per call; past WARN_STREAMS sets on a device a RuntimeWarning says so, once.
- The per-thread default stream (handle 2, ``cupy.cuda.Stream.ptds``) is a different stream in every thread:
  its sets are kept per thread (stream_key; a token per thread, not its id, which a new thread may reuse while the
  old one's work still runs).
- A captured graph writes the buffers it was captured with, on whatever stream it is replayed: do not replay it
  while the same Gemm runs eagerly on its capture stream, nor two graphs captured on one stream at once (capture
  each micro-batch's graph on a stream of its own, warmed up there: ``torch.cuda.graph(g, stream=s)``). Under a
  capture a call uses its stream's own buffer of a role where it is large enough, else the largest of the device
  that is, another stream's (``torch.cuda.graph`` captures on a stream of its own by default, after a warm-up on
  another): such a graph shares it with that stream too.

Example::

    sets = StreamBuffers()
    bufs = sets.buffers(0, stream, {"partials": 1 << 20}, allocate, "this split-K call")   # allocate(role, n, stream)
    bufs["partials"].data.ptr
"""
from __future__ import annotations

import itertools
import threading
import warnings
from typing import Callable

from . import runtime

WARN_STREAMS = 128  # sets per device (torch's pools hold 32 streams per priority, plus the default stream)
PER_THREAD_STREAM = 2  # cudaStreamPerThread / CU_STREAM_PER_THREAD


_thread_tokens = threading.local()
_next_token = itertools.count(1)


def stream_key(ptr: int):
    """What tells a stream apart: its handle, and for the per-thread default stream the calling thread too (a token
    made once per thread: thread ids are reused as soon as a thread exits, its queued work perhaps still running)."""
    if ptr != PER_THREAD_STREAM:
        return ptr
    token = getattr(_thread_tokens, "token", None)
    if token is None:
        token = _thread_tokens.token = next(_next_token)
    return (ptr, token)


def _fits(buffers: dict, need: dict[str, int]) -> bool:
    return all(role in buffers and buffers[role].nbytes >= nbytes for role, nbytes in need.items())


class StreamBuffers:
    """A Gemm's buffers by (device, stream_key) and role; see the module docstring."""

    def __init__(self) -> None:
        self._sets: dict[tuple, dict[str, object]] = {}
        self._retired: list = []  # outgrown buffers: kept plans and captured graphs may still point at them
        self._warned = False
        self._lock = threading.Lock()

    def held(self) -> dict[tuple, object]:
        """Every live buffer by (device, stream key, role) (tests, inspection)."""
        with self._lock:
            return {(dev, key, role): buf for (dev, key), bufs in self._sets.items() for role, buf in bufs.items()}

    @property
    def retired(self) -> list:
        return list(self._retired)

    def find(self, device_id: int, stream, need: dict[str, int]) -> dict | None:
        """The buffers (by role) a call on `stream` would use with no allocation: the stream's own when they hold
        `need` (bytes by role), else, while `stream` captures a CUDA graph, the largest of the device per role that
        do; else None."""
        with self._lock:
            return self._find(device_id, stream, need)

    def buffers(self, device_id: int, stream, need: dict[str, int],
                allocate: Callable[[str, int, object], object], what: str, hint: str = "") -> dict:
        """Buffers (by role) for a call on `stream` on `device_id` with at least `need` bytes per role (find's,
        under a capture), growing or making the stream's own with `allocate(role, nbytes, stream)` first where
        needed (not while `stream` captures a CUDA graph: RuntimeError naming `what`, ending with `hint`)."""
        with self._lock:
            found = self._find(device_id, stream, need)
            if found is not None:
                return found
            if runtime.is_capturing(stream):
                raise RuntimeError(
                    f"{what} needs a larger buffer, which is allocated (with a synchronisation) on the first call "
                    "that needs it: call it once outside the capture (with this size or a larger one) before "
                    f"capturing a CUDA graph{hint}")
            key = (device_id, stream_key(stream.ptr))
            own = self._sets.get(key)
            if own is None:
                own = self._sets[key] = {}
                self._warn_if_many(device_id)
            for role, nbytes in need.items():
                have = own.get(role)
                if have is not None and have.nbytes >= nbytes:
                    continue
                if have is not None:
                    # At least doubled: a serving loop whose M creeps up must not retire (and synchronise for) one
                    # buffer per size; the retired ones together stay smaller than the live one.
                    self._retired.append(have)
                    nbytes = max(nbytes, 2 * have.nbytes)
                own[role] = allocate(role, nbytes, stream)
            return dict(own)

    def _find(self, device_id: int, stream, need: dict[str, int]) -> dict | None:
        own = self._sets.get((device_id, stream_key(stream.ptr))) or {}
        if _fits(own, need):
            return dict(own)
        if not runtime.is_capturing(stream):
            return None
        found = {}
        for role, nbytes in need.items():
            if _fits(own, {role: nbytes}):
                found[role] = own[role]
                continue
            fitting = [bufs[role] for (dev, _), bufs in self._sets.items()
                       if dev == device_id and role in bufs and bufs[role].nbytes >= nbytes]
            if not fitting:
                return None
            found[role] = max(fitting, key=lambda buf: buf.nbytes)
        return found

    def _warn_if_many(self, device_id: int) -> None:
        count = sum(1 for dev, _ in self._sets if dev == device_id)
        if count > WARN_STREAMS and not self._warned:
            self._warned = True
            warnings.warn(f"a Gemm now keeps split-K / staging buffers for {count} streams on device {device_id}: "
                          "they are kept for the Gemm's life (captured graphs and kept plans point at them), so "
                          "reuse streams rather than making one per call", RuntimeWarning, stacklevel=4)
