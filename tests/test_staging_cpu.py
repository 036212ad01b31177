"""staging.StagingBuffers without a GPU: which views are copied, when buffers grow, and the refusal to grow while a
CUDA graph is captured (allocation and copies replaced by fakes)."""
import numpy as np
import pytest

from deepgemm_jit import sm90_rules, sm90_tiles, staging, stream_buffers
from deepgemm_jit.arrays import MatrixView


class FakeBuffer:
    def __init__(self, nbytes, ptr):
        self.nbytes = nbytes
        self.data = type("P", (), {"ptr": ptr})()


@pytest.fixture
def fakes(monkeypatch):
    grown, copies, capturing = [], [], {"now": False}

    def fake_allocate(device_id, nbytes, stream):
        buf = FakeBuffer(nbytes, 1 << 20 * (len(grown) + 1))
        grown.append((device_id, nbytes))
        return buf

    monkeypatch.setattr(staging, "_allocate", fake_allocate)
    monkeypatch.setattr(stream_buffers.runtime, "is_capturing", lambda stream: capturing["now"])
    return grown, copies, capturing


class FakeStream:
    def __init__(self, ptr=7):
        self.ptr = ptr


STREAM = FakeStream()


def view(rows, cols, stride, ptr=4096, dtype=np.float16):
    return MatrixView(ptr=ptr, rows=rows, cols=cols, row_stride=stride, dtype=np.dtype(dtype), device=0)


def test_legal_views_pass_through_and_odd_rows_get_aligned_pitches(fakes):
    grown, _, _ = fakes
    bufs = staging.StagingBuffers()
    aligned = view(100, 1024, 1024)
    assert bufs.aligned(aligned, "a", STREAM, 0) is aligned and not grown
    odd = view(100, 1003, 1003)  # 2006-byte rows: not a multiple of 16
    got = bufs.aligned(odd, "a", STREAM, 0)
    assert got.row_stride * 2 == staging.pitch_bytes(odd) == 2048 and (got.rows, got.cols) == (100, 1003)
    assert got.ptr == 1 << 20 and grown == [(0, 100 * 2048)]


def test_buffers_grow_only_for_larger_calls_and_never_while_capturing(fakes):
    grown, _, capturing = fakes
    bufs = staging.StagingBuffers()
    bufs.aligned(view(300, 1003, 1003), "a", STREAM, 0)
    bufs.aligned(view(100, 1003, 1003), "a", STREAM, 0)  # fits: no new buffer
    assert len(grown) == 1 and bufs.fits(view(300, 1003, 1003), "a", STREAM)
    assert not bufs.fits(view(301, 1003, 1003), "a", STREAM)
    capturing["now"] = True
    bufs.aligned(view(200, 1003, 1003), "a", STREAM, 0)  # fits: fine inside a capture
    with pytest.raises(RuntimeError, match="before capturing a CUDA graph"):
        bufs.aligned(view(400, 1003, 1003), "a", STREAM, 0)
    assert len(grown) == 1
    capturing["now"] = False
    first = bufs.held()[(0, STREAM.ptr, "a")]
    bufs.aligned(view(400, 1003, 1003), "a", STREAM, 0)
    assert len(grown) == 2 and first in bufs._sets.retired  # a kept plan may still point at the outgrown buffer
    assert grown[1] == (0, 2 * 300 * 2048)  # doubled, not just the 400 rows asked for
    for rows in range(401, 1300):  # slowly growing M: a few doublings, not one buffer per size
        bufs.aligned(view(rows, 1003, 1003), "a", STREAM, 0)
    assert len(grown) == 4 and sum(b.nbytes for b in bufs._sets.retired) < bufs.held()[(0, STREAM.ptr, "a")].nbytes
    with pytest.raises(ValueError, match="staging role"):
        bufs.aligned(view(1, 3, 3, ptr=4098), "x", STREAM, 0)


def test_staged_plan_copies_in_then_launches_then_copies_d_out():
    """In order, every launch after the first programmatic (its kernel waits for the previous one: griddep_wait);
    the first keeps its plan's default (None)."""
    ran = []

    def step(name):
        return type(name, (), {"device_id": 0,
                               "run": lambda self, stream, programmatic=None: ran.append((name, programmatic))})()

    lock = staging.StagingBuffers().launch_lock
    plan = staging.StagedPlan((step("copy a"), step("transpose b")), step("launch"), (step("copy d out"),), lock)
    plan.run(object())
    plan.run(object())  # replayed: the same steps again
    assert plan.device_id == 0
    assert ran == [("copy a", None), ("transpose b", True), ("launch", True), ("copy d out", True)] * 2
    ran.clear()
    staging.StagedPlan((), step("launch"), (step("copy d out"),), lock).run(object())
    assert ran == [("launch", None), ("copy d out", True)]


def test_staged_launches_of_one_gemm_go_in_as_one_sequence():
    """Two threads calling one Gemm on one stream (every thread's default) interleaved copies and launches, and a
    GEMM read the other thread's staged rows (each launch releases the GIL; review, session 60). A StagedPlan
    launches under its Gemm's StagingBuffers.launch_lock: a second thread's sequence waits for the first."""
    import threading
    import time

    buffers = staging.StagingBuffers()
    order = []

    def step(name):
        def run(self, stream, programmatic=None):
            order.append((threading.current_thread().name, name))
            time.sleep(0.002)  # a launch releasing the GIL
        return type(name, (), {"device_id": 0, "run": run})()

    plan = staging.StagedPlan((step("copy a"),), step("launch"), (step("copy d out"),), buffers.launch_lock)
    other = staging.StagedPlan((step("copy a"),), step("launch"), (), buffers.launch_lock)
    threads = [threading.Thread(target=p.run, args=(object(),), name=f"t{i}") for i, p in enumerate((plan, other) * 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runs = [order[i][0] for i in range(len(order))]
    # each thread's steps are consecutive
    groups = [runs[0]] + [b for a, b in zip(runs, runs[1:]) if a != b]
    assert len(groups) == len(threads), order


def test_row_copy_and_transpose_launches():
    """copies.py's launch geometry: one thread per 16-byte chunk of a row (pitches in bytes), one block per 32 x 32
    tile of a transpose; shapes checked (no GPU: the launch plans are built with a fake kernel)."""
    from fakes import FakeKernel

    from deepgemm_jit import copies

    src, dst = view(10, 1003, 1005, ptr=4098), view(10, 1003, 1008, ptr=1 << 20)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(copies, "get_kernel", lambda spec, arch: spec)
        mp.setattr(copies.runtime, "loaded_kernel", lambda art, dev, smem: FakeKernel())
        rows = copies.rows_plan([(dst, src)], "sm_90a", 0)
        chunks = -(-2006 // 16)
        blocks = -(-10 * chunks // 256)
        assert rows.grid == (blocks, 1, 1) and rows.block == (256, 1, 1) and len(rows.args) == 1
        one = {"src": 4098, "dst": 1 << 20, "src_pitch": 2010, "dst_pitch": 2016, "rows": 10, "row_bytes": 2006,
               "chunks": chunks, "block_end": blocks}
        assert copies.unpack_row_copies(rows.args[0]) == [one]
        # Several copies in one launch: each takes the blocks after the previous one's.
        b_src, b_dst = view(300, 65, 65, ptr=8194), view(300, 65, 128, ptr=1 << 21)
        both = copies.rows_plan([(dst, src), (b_dst, b_src)], "sm_90a", 0)
        b_blocks = -(-300 * 9 // 256)
        assert both.grid == (blocks + b_blocks, 1, 1)
        assert copies.unpack_row_copies(both.args[0]) == [one, {
            "src": 8194, "dst": 1 << 21, "src_pitch": 130, "dst_pitch": 256, "rows": 300, "row_bytes": 130,
            "chunks": 9, "block_end": blocks + b_blocks}]
        assert len(bytes(both.args[0])) == 200  # the kernel's RowCopies: 4 x 48 + the count, 8-byte aligned
        with pytest.raises(ValueError, match="1 to 4 copies"):
            copies.rows_plan([(dst, src)] * 5, "sm_90a", 0)
        t = copies.transpose_plan(view(1003, 10, 16, dtype=np.float32), view(10, 1003, 1003, dtype=np.float32),
                                  "sm_90a", 0)
        assert t.grid == (1 * 32, 1, 1) and t.block == (32, 8, 1) and int(t.args[-1]) == 32
        with pytest.raises(ValueError, match="not src"):
            copies.rows_plan([(view(10, 1002, 1008), src)], "sm_90a", 0)
        # RowCopy.row_bytes is 32 bits: a row of 4 GiB (TF32, K = 2^30 + 1) was a struct.error (review)
        k = 2**30 + 1
        with pytest.raises(ValueError, match="rows of 4294967300 bytes, more than the copy kernel takes"):
            copies.rows_plan([(view(1, k, k + 3, dtype=np.float32), view(1, k, k, dtype=np.float32))], "sm_90a", 0)
        with pytest.raises(ValueError, match="transposed"):
            copies.transpose_plan(dst, src, "sm_90a", 0)
    with pytest.raises(ValueError, match="itemsize"):
        copies.CopySpec("transpose", 1)


def test_realign_copies_legal_views_off_sectors(fakes):
    """Rows TMA can read but that start 16 bytes into a 32-byte sector (staging.off_sector) are copied only when
    the caller asks (realign=True: calls where sm90_rules.sm90_realign_roles picks it)."""
    grown, _, _ = fakes
    bufs = staging.StagingBuffers()
    legal = view(100, 4104, 4104)  # 8208-byte rows: 16-byte multiples, every other row off a 32-byte sector
    assert staging.off_sector(legal) and staging.off_sector(view(100, 1024, 2048, ptr=4096 + 16))  # base off
    assert not staging.off_sector(view(100, 4112, 4112)) and not staging.off_sector(view(1, 4104, 4104))
    assert bufs.aligned(legal, "a", STREAM, 0) is legal and bufs.fits(legal, "a", STREAM) and not grown
    assert not bufs.fits(legal, "a", STREAM, realign=True)
    got = bufs.aligned(legal, "a", STREAM, 0, realign=True)
    assert got.row_stride * 2 == 8320 and grown == [(0, 100 * 8320)] and bufs.fits(legal, "a", STREAM, realign=True)


def test_transposed_copies_take_the_transposed_shape(fakes):
    """MN-major TF32 operands (sm90_rules.sm90_transposes) are staged transposed, even when TMA could read them."""
    grown, _, _ = fakes
    bufs = staging.StagingBuffers()
    b = view(1003, 1024, 1024, dtype=np.float32)  # (K, N), TMA-legal rows
    got = bufs.aligned(b, "b", STREAM, 0, transposed=True)
    assert (got.rows, got.cols, got.row_stride) == (1024, 1003, 1024) and grown == [(0, 1024 * 4096)]
    assert bufs.fits(b, "b", STREAM, transposed=True)
    assert not bufs.fits(view(1003, 1025, 1025, dtype=np.float32), "b", STREAM, True)


def test_realign_roles_copy_what_pays():
    """sm90_rules.sm90_realign_roles against session 27's interleaved runs (in place / A / B / both copied): on wide
    tiles the best single copy, on narrow ones every copy that pays, nothing where no copy can pay."""
    def pick(m, n, k, bm, bn, esize=2, roles="ab"):
        return "".join(sorted(sm90_rules.sm90_realign_roles(m, n, bm, bn, {r: (m if r == "a" else n) * k * esize
                                                                          for r in roles})))

    assert pick(8192, 1024, 4104, 128, 256) == "b"  # in place 147.3 us, A 161.7, B 102.3, both 132.9
    assert pick(1024, 4096, 4104, 128, 256) == "a"  # 73.2, A 61.1, B 68.0, both 71.6
    assert pick(256, 7168, 2056, 128, 112) == "a"  # 29.4, A 22.5, B 39.9, both 34.2
    assert pick(2048, 4096, 4104, 128, 256) == "b"  # equal re-reads: the larger operand; A 127.2, B 112.0
    assert pick(4096, 7168, 2052, 128, 256, esize=4) == "b"  # TF32 496.8, A 425.9, B 358.3, both 368.8
    assert pick(4096, 4096, 4112, 128, 128, esize=1) == "ab"  # FP8 190.2, A 155.4, B 146.9, both 122.0
    assert pick(2000, 2112, 7176, 128, 144) == "ab"  # 176.7, A 152.3, B 137.9, both 122.3
    assert pick(4096, 4096, 4104, 128, 176, roles="ab") == "b"  # wider than 128 x 160: one copy
    assert pick(8192, 1024, 4104, 128, 256, roles="a") == ""  # A alone: 161.7 against 147.3 in place
    assert pick(64, 64, 4104, 64, 64) == ""  # read once: no copy pays
    assert pick(4096, 4096, 4104, 128, 256, roles="") == ""


def test_which_calls_realign_and_what_a_capture_does(fakes, cache_dir):
    """Gemm._staged_roles: of A and B off sectors, a large call copies the one whose copy saves most
    (sm90_rules.sm90_realign_roles), a small call reads them in place; inside a CUDA graph capture, realigned only when
    the buffer was sized before, else in place."""
    import deepgemm_jit as dg
    from deepgemm_jit import launch

    g = dg.build(4096, 2048, 2056, dtype="bf16", arch="sm_90a")
    assert sm90_tiles.sm90_off_sector_rows(g.artifact.spec) == ["a", "b"]
    _, _, capturing = fakes
    a, b = view(4096, 2056, 2056), view(2048, 2056, 2056)
    d = view(4096, 2048, 2048)
    none = launch.EpilogueOperands()
    assert g._staged_roles(4096, a, b, d, none, STREAM) == {"b"}  # re-read by every M block
    assert g._staged_roles(256, view(256, 2056, 2056), b, view(256, 2048, 2048), none, STREAM) is None
    assert g._staged_roles(4096, view(4096, 2064, 2064), view(2048, 2064, 2064), d, none, STREAM) is None  # 32 B
    capturing["now"] = True
    assert g._staged_roles(4096, a, b, d, none, STREAM) is None  # buffer not sized: TMA reads them in place
    capturing["now"] = False
    g._staging.aligned(b, "b", FakeStream(99), 0, realign=True)  # sized on another stream
    capturing["now"] = True
    assert g._staged_roles(4096, a, b, d, none, STREAM) == {"b"}  # the capture borrows it


def test_rows_past_the_copy_kernel_are_refused_by_name(fakes, cache_dir, monkeypatch):
    """An operand the call must copy (base off 16 bytes) whose rows are 4 GiB or more (TF32, K = 2^30 + 1): a
    ValueError naming it, before any staging buffer is allocated (was a struct.error from the row copy's 32-bit
    row_bytes; review)."""
    import contextlib

    import cupy

    import deepgemm_jit as dg
    from deepgemm_jit import launch

    monkeypatch.setattr(cupy.cuda, "Device", lambda device_id: contextlib.nullcontext())
    grown, _, _ = fakes
    k = 2**30 + 1
    g = dg.build(1, 8, k, dtype="tf32", arch="sm_90a")
    a, b = view(1, k, k, ptr=4096 + 4, dtype=np.float32), view(8, k, k + 3, ptr=1 << 40, dtype=np.float32)
    with pytest.raises(ValueError, match=r"a has rows of 4294967300 bytes whose base \(0x1004\)"):
        g._staged_plan(1, a, b, view(1, 8, 8, ptr=1 << 44, dtype=np.float32), None, None, launch.EpilogueOperands(),
                       0, STREAM)
    assert not grown


def test_row_copy_kernel_compiles_for_sm90a_without_local_memory(cache_dir):
    """The rows kernel (up to copies.MAX_ROW_COPIES copies per launch, one by-value parameter): real NVRTC compile
    to sm_90a, its exported sizes equal copies.py's mirror (get_kernel checks), no local memory or stack (the copy
    is chosen with constant indices), 16-byte global loads, and a griddepcontrol.wait first (StagedPlan launches
    it programmatically after another kernel)."""
    from deepgemm_jit import copies, sass

    art = copies.get_kernel(copies.ROWS, "sm_90a")
    usage = sass.resource_usage(art.cubin)[art.entry]
    assert usage.get("LOCAL", 0) == 0 and usage.get("STACK", 0) == 0
    assert "LDG.E.128.CONSTANT" in sass.disassemble(art.cubin) or "LDG.E.128" in sass.disassemble(art.cubin)
    assert sass.opcode_mix(art.cubin).get("ACQBULK", 0) == 1  # griddepcontrol.wait: launched programmatically


def test_d_rows_ending_inside_a_16_byte_chunk_are_staged(fakes, cache_dir):
    """TMA stores whole 16-byte chunks, so a D whose rows end inside one (odd N in 16 bits, a row-padded out= of
    N + 1 columns or a single row) goes through the staging buffer and is copied out row by row
    (launch.tma_store_legal); tests/fuzz.py caught the kernels writing every row's element N of such an out=."""
    import deepgemm_jit as dg
    from deepgemm_jit import launch

    assert launch.tma_store_legal(view(8, 1480, 1480)) and launch.tma_legal(view(8, 1479, 1480))
    assert not launch.tma_store_legal(view(8, 1479, 1480)) and not launch.tma_store_legal(view(1, 135, 135))
    assert launch.tma_store_legal(view(8, 111, 112, dtype=np.uint8)) is False
    g = dg.build(64, 1479, 1024, dtype="bf16", arch="sm_90a")
    a, b = view(64, 1024, 1024), view(1479, 1024, 1024)
    none = launch.EpilogueOperands()
    assert g._staged_roles(64, a, b, view(64, 1479, 1480), none, STREAM) == frozenset()  # must stage: D
    assert g._staged_roles(64, a, view(1480, 1024, 1024), view(64, 1480, 1488), none, STREAM) is None
    # The staging buffers apply the same rule to D (and only to D: an input is read, never written past).
    d2 = g._staging.aligned(view(64, 1479, 1480), "d", STREAM, 0)
    assert d2.ptr != 4096 and d2.row_stride * d2.itemsize % 128 == 0
    assert g._staging.aligned(view(64, 1480, 1488), "d", STREAM, 0).ptr == 4096
    assert g._staging.aligned(view(64, 1479, 1480), "c", STREAM, 0).ptr == 4096
    assert not g._staging.fits(view(4096, 1479, 1480), "d", STREAM)
    assert g._staging.fits(view(4096, 1479, 1480), "residual", STREAM)
