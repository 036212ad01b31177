"""staging.StagingBuffers without a GPU: which views are copied, when buffers grow, and the refusal to grow while a
CUDA graph is captured (allocation and copies replaced by fakes)."""
import numpy as np
import pytest

from deepgemm_jit import staging
from deepgemm_jit.arrays import MatrixView


class FakeBuffer:
    def __init__(self, nbytes, ptr):
        self.nbytes = nbytes
        self.data = type("P", (), {"ptr": ptr})()


@pytest.fixture
def fakes(monkeypatch):
    grown, copies, capturing = [], [], {"now": False}

    def fake_grow(self, device_id, role, nbytes, stream):
        buf = FakeBuffer(nbytes, 1 << 20 * (len(grown) + 1))
        grown.append((device_id, role, nbytes))
        self._buffers[(device_id, role)] = buf
        return buf

    monkeypatch.setattr(staging.StagingBuffers, "_grow", fake_grow)
    monkeypatch.setattr(staging.RowCopy, "run", lambda self, stream: copies.append(self))
    monkeypatch.setattr(staging.runtime, "is_capturing", lambda stream: capturing["now"])
    return grown, copies, capturing


def view(rows, cols, stride, ptr=4096, dtype=np.float16):
    return MatrixView(ptr=ptr, rows=rows, cols=cols, row_stride=stride, dtype=np.dtype(dtype), device=0)


def test_legal_views_pass_through_and_odd_rows_get_aligned_pitches(fakes):
    grown, _, _ = fakes
    bufs = staging.StagingBuffers()
    aligned = view(100, 1024, 1024)
    assert bufs.aligned(aligned, "a", object(), 0) is aligned and not grown
    odd = view(100, 1003, 1003)  # 2006-byte rows: not a multiple of 16
    got = bufs.aligned(odd, "a", object(), 0)
    assert got.row_stride * 2 == staging.pitch_bytes(odd) == 2016 and (got.rows, got.cols) == (100, 1003)
    assert got.ptr == 1 << 20 and grown == [(0, "a", 100 * 2016)]


def test_buffers_grow_only_for_larger_calls_and_never_while_capturing(fakes):
    grown, _, capturing = fakes
    bufs = staging.StagingBuffers()
    bufs.aligned(view(300, 1003, 1003), "a", object(), 0)
    bufs.aligned(view(100, 1003, 1003), "a", object(), 0)  # fits: no new buffer
    assert len(grown) == 1 and bufs.fits(view(300, 1003, 1003), "a") and not bufs.fits(view(301, 1003, 1003), "a")
    capturing["now"] = True
    bufs.aligned(view(200, 1003, 1003), "a", object(), 0)  # fits: fine inside a capture
    with pytest.raises(RuntimeError, match="before capturing a CUDA graph"):
        bufs.aligned(view(400, 1003, 1003), "a", object(), 0)
    assert len(grown) == 1
    capturing["now"] = False
    first = bufs._buffers[(0, "a")]
    bufs.aligned(view(400, 1003, 1003), "a", object(), 0)
    assert len(grown) == 2 and first in bufs._retired  # a kept plan may still point at the outgrown buffer
    assert grown[1] == (0, "a", 2 * 300 * 2016)  # doubled, not just the 400 rows asked for
    for rows in range(401, 1300):  # slowly growing M: a few doublings, not one buffer per size
        bufs.aligned(view(rows, 1003, 1003), "a", object(), 0)
    assert len(grown) == 4 and sum(b.nbytes for b in bufs._retired) < bufs._buffers[(0, "a")].nbytes
    with pytest.raises(ValueError, match="staging role"):
        bufs.aligned(view(1, 3, 3, ptr=4098), "x", object(), 0)


def test_staged_plan_copies_in_then_launches_then_copies_d_out(fakes):
    _, copies, _ = fakes
    launch_plan = type("L", (), {"device_id": 0, "run": lambda self, stream: copies.append("launch")})()
    a, a2 = view(10, 1003, 1003, ptr=4098), view(10, 1003, 1008, ptr=1 << 20)
    d, d2 = view(10, 33, 33, ptr=8194), view(10, 33, 40, ptr=1 << 21)
    plan = staging.StagedPlan((staging.RowCopy.of(a2, a),), launch_plan, (staging.RowCopy.of(d, d2),))
    plan.run(object())
    plan.run(object())  # replayed: the same copies again
    copy_in, copy_out = copies[0], copies[2]
    assert plan.device_id == 0 and copies == [copy_in, "launch", copy_out] * 2
    assert (copy_in.dst, copy_in.dst_pitch, copy_in.src, copy_in.src_pitch) == (1 << 20, 2016, 4098, 2006)
    assert (copy_out.dst, copy_out.dst_pitch, copy_out.src, copy_out.src_pitch) == (8194, 66, 1 << 21, 80)
    assert copy_in.row_bytes == 2006 and copy_out.row_bytes == 66 and copy_in.rows == copy_out.rows == 10


def test_transposed_copies_take_the_transposed_shape(fakes):
    """MN-major TF32 operands (config.sm90_transposes) are staged transposed, even when TMA could read them."""
    grown, _, _ = fakes
    bufs = staging.StagingBuffers()
    b = view(1003, 1024, 1024, dtype=np.float32)  # (K, N), TMA-legal rows
    got = bufs.aligned(b, "b", object(), 0, transposed=True)
    assert (got.rows, got.cols, got.row_stride) == (1024, 1003, 1004) and grown == [(0, "b", 1024 * 4016)]
    assert bufs.fits(b, "b", transposed=True) and not bufs.fits(view(1003, 1025, 1025, dtype=np.float32), "b", True)
