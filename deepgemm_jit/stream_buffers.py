"""Buffers a Gemm keeps per (device, stream): split-K workspaces (splitk.py) and staging buffers (staging.py).

A call's kernels write these buffers, so two calls of one Gemm running at the same time must not share them.
Calls on one stream run in order; calls on two streams may overlap: two micro-batches, each on its own stream,
calling the same memoized Gemm (``deepgemm_jit.gemm``, the torch ops). So each stream gets a set of its own, as
PyTorch keeps a cuBLAS workspace per (handle, stream).

Rules:

- A stream's set is made on its first call that needs one, and a buffer grows (at least doubled) when a call
  needs more. Allocation synchronises, so it never happens while the stream captures a CUDA graph. Outgrown
  buffers are retired, never freed: kept launch plans and captured graphs may still point at them.
- Under a capture a call uses its stream's set when it is large enough, else the largest set of the device that
  is (``torch.cuda.graph`` captures on a stream of its own, after a warm-up on another). A graph then shares that
  set with the eager calls of its stream: do not replay it while the same Gemm runs on that stream.
- At most MAX_STREAMS sets per device. A stream past that takes over the oldest set once the device is
  synchronised (nothing is in flight then), and the owner's kept launch plans are dropped (``on_evict``):
  the old stream's plans point at the set.

Example::

    sets = StreamBuffers()
    bufs = sets.buffers(0, stream, {"partials": 1 << 20}, allocate, "this split-K call")   # allocate(role, nbytes)
    bufs["partials"].data.ptr
"""
from __future__ import annotations

import threading
from typing import Callable

from . import runtime

MAX_STREAMS = 64  # sets per device (torch's stream pools hold 32 per priority, plus the default stream)


def _fits(buffers: dict, need: dict[str, int]) -> bool:
    return all(role in buffers and buffers[role].nbytes >= nbytes for role, nbytes in need.items())


class StreamBuffers:
    """A Gemm's buffers by (device, stream handle) and role; see the module docstring."""

    def __init__(self, on_evict: Callable[[], None] | None = None, max_streams: int = MAX_STREAMS) -> None:
        self._sets: dict[tuple[int, int], dict[str, object]] = {}
        self._retired: list = []  # outgrown buffers: kept plans and captured graphs may still point at them
        self._on_evict = on_evict
        self._max_streams = max_streams
        self._lock = threading.Lock()

    def held(self) -> dict[tuple[int, int, str], object]:
        """Every live buffer by (device, stream handle, role) (explain, tests)."""
        with self._lock:
            return {(dev, ptr, role): buf for (dev, ptr), bufs in self._sets.items() for role, buf in bufs.items()}

    @property
    def retired(self) -> list:
        return list(self._retired)

    def find(self, device_id: int, stream, need: dict[str, int]) -> dict | None:
        """The set a call on `stream` would use with no allocation: the stream's own when it holds `need` (bytes by
        role), else, while `stream` captures a CUDA graph, the largest set of the device that does; else None."""
        with self._lock:
            return self._find(device_id, stream, need)

    def buffers(self, device_id: int, stream, need: dict[str, int],
                allocate: Callable[[str, int, object], object], what: str, hint: str = "") -> dict:
        """The set of `stream` on `device_id` with at least `need` bytes per role (find's, under a capture),
        growing or making the stream's own with `allocate(role, nbytes, stream)` first where needed (not while
        `stream` captures a CUDA graph: RuntimeError naming `what`, ending with `hint`)."""
        with self._lock:
            found = self._find(device_id, stream, need)
            if found is not None:
                return found
            if runtime.is_capturing(stream):
                raise RuntimeError(
                    f"{what} needs a larger buffer, which is allocated (with a synchronisation) on the first call "
                    "that needs it: call it once outside the capture (with this size or a larger one) before "
                    f"capturing a CUDA graph{hint}")
            key = (device_id, stream.ptr)
            own = self._sets.get(key)
            if own is None:
                own = self._sets[key] = self._new_set(device_id)
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
            return own

    def _find(self, device_id: int, stream, need: dict[str, int]) -> dict | None:
        own = self._sets.get((device_id, stream.ptr))
        if own is not None and _fits(own, need):
            return own
        if not runtime.is_capturing(stream):
            return None
        fitting = [s for (dev, _), s in self._sets.items() if dev == device_id and _fits(s, need)]
        return max(fitting, key=lambda s: sum(buf.nbytes for buf in s.values()), default=None)

    def _new_set(self, device_id: int) -> dict:
        """An empty set, or past max_streams on the device the oldest one's, taken over once the device is idle."""
        mine = [key for key in self._sets if key[0] == device_id]
        if len(mine) < self._max_streams:
            return {}
        runtime.synchronize_device(device_id)
        taken = self._sets.pop(mine[0])
        if self._on_evict is not None:
            self._on_evict()
        return taken
