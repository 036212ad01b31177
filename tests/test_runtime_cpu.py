"""Launch-argument packing (no GPU): what cuLaunchKernel reads through each kernelParams pointer."""
import ctypes

import numpy as np
import pytest

from deepgemm_jit import runtime


def test_packed_args_hold_each_value_at_its_pointer():
    tmap = np.frombuffer(bytes(range(128)), dtype=np.dtype("V128"))[0]
    args = (tmap, np.uint32(7), np.int64(-3), np.float32(1.5), np.uint64(2**63 + 5))
    packed = runtime.PackedArgs(args)
    assert packed.count == 5
    ptrs = [packed.params[i] for i in range(5)]
    assert ctypes.string_at(ptrs[0], 128) == bytes(range(128))
    assert ctypes.c_uint32.from_address(ptrs[1]).value == 7
    assert ctypes.c_int64.from_address(ptrs[2]).value == -3
    assert ctypes.c_float.from_address(ptrs[3]).value == 1.5
    assert ctypes.c_uint64.from_address(ptrs[4]).value == 2**63 + 5


def test_packed_args_refuse_untyped_python_values():
    with pytest.raises(TypeError, match="numpy scalars"):
        runtime.PackedArgs((np.uint32(1), 5))


def test_arg_template_fills_its_pointer_slots_per_launch():
    """ArgTemplate.fill: every value at its pointer, the slots' pointers new per fill, earlier fills untouched (each
    fill has its own buffer: concurrent callers share nothing mutable), and a params object that cuLaunchKernel's
    c_void_p argument takes."""
    args = (np.uint64(0x1000), np.int64(-3), np.uint64(0), np.uint64(0), np.float32(1.5), np.uint32(7))
    template = runtime.ArgTemplate(args, slots=(2, 3))
    first = template.fill(0xAAA0, 0xBBB0)
    second = template.fill(2**63 + 16, 0x20)
    for filled, (p, s) in ((first, (0xAAA0, 0xBBB0)), (second, (2**63 + 16, 0x20))):
        ptrs = [ctypes.c_void_p.from_buffer(filled.params, 8 * i).value for i in range(6)]
        assert ctypes.c_uint64.from_address(ptrs[0]).value == 0x1000
        assert ctypes.c_int64.from_address(ptrs[1]).value == -3
        assert ctypes.c_uint64.from_address(ptrs[2]).value == p
        assert ctypes.c_uint64.from_address(ptrs[3]).value == s
        assert ctypes.c_float.from_address(ptrs[4]).value == 1.5
        assert ctypes.c_uint32.from_address(ptrs[5]).value == 7
        want = (0x1000, -3, p, s, 1.5, 7)
        assert filled.args == want and [type(a) for a in filled.args] == [type(a) for a in args]
    assert ctypes.c_void_p.from_param(first.params) is not None  # what LoadedKernel.launch passes as kernelParams


def test_arg_template_refuses_wide_or_untyped_values_and_bad_slots():
    tmap = np.frombuffer(bytes(range(128)), dtype=np.dtype("V128"))[0]
    with pytest.raises(TypeError, match="at most 8 bytes"):
        runtime.ArgTemplate((np.uint64(1), tmap), slots=(0,))
    with pytest.raises(TypeError, match="numpy scalars"):
        runtime.ArgTemplate((np.uint64(1), 5), slots=(0,))
    with pytest.raises(ValueError, match="out of range"):
        runtime.ArgTemplate((np.uint64(1),), slots=(1,))
    with pytest.raises(ValueError, match="1 pointers for 2 pointer slots"):
        runtime.ArgTemplate((np.uint64(1), np.uint64(2)), slots=(0, 1)).fill(5)


def test_programmatic_launch_config_has_the_driver_layout():
    """CUlaunchConfig / CUlaunchAttribute as cuLaunchKernelEx reads them (cuda.h, CUDA 12+): 56 and 72 bytes, the
    stream at 32, the attribute's value union at 8; programmatic stream serialization is attribute 6, value 1. Each
    launch gets its own copy of the plan's configuration, with its stream."""
    import ctypes

    from deepgemm_jit import runtime

    kernel = type("K", (), {"dynamic_smem_bytes": 1234})()
    pdl = runtime.ProgrammaticLaunch(kernel, (5, 1, 1), (256, 1, 1))
    assert ctypes.sizeof(runtime._LaunchConfig) == 56 and ctypes.sizeof(runtime._LaunchAttribute) == 72
    assert runtime._LaunchConfig.stream.offset == 32 and runtime._LaunchConfig.attrs.offset == 40
    assert runtime._LaunchAttribute.value.offset == 8
    config, other = pdl.config_for(0xABCD), pdl.config_for(0x1234)
    assert list(config.grid) == [5, 1, 1] and list(config.block) == [256, 1, 1] and config.shared_bytes == 1234
    assert (config.stream, other.stream, pdl.template.stream) == (0xABCD, 0x1234, None) and config.num_attrs == 1
    assert (config.attrs[0].id, config.attrs[0].value) == (runtime._PROGRAMMATIC_STREAM_SERIALIZATION, 1) == (6, 1)


def test_launch_plans_launch_programmatically_only_kernels_that_wait(monkeypatch):
    """LaunchPlan: `waits` kernels carry a programmatic configuration (pdl) and use it by default when made
    programmatic, or when a caller asks (StagedPlan); other kernels and DEEPGEMM_JIT_NO_PROGRAMMATIC_LAUNCH launch
    ordinarily; a plan that is programmatic but does not wait is refused."""
    import numpy as np
    import pytest

    from deepgemm_jit import launch

    from fakes import FakeKernel

    args = (np.uint32(1),)
    plain = launch.LaunchPlan(FakeKernel(), (1, 1, 1), (32, 1, 1), args, 0)
    waits = launch.LaunchPlan(FakeKernel(), (1, 1, 1), (32, 1, 1), args, 0, waits=True)
    default_on = launch.LaunchPlan(FakeKernel(), (1, 1, 1), (32, 1, 1), args, 0, waits=True, programmatic=True)
    for plan in (plain, waits, default_on):
        plan.run(None)
        plan.run(None, programmatic=True)
    assert [p.kernel.launched for p in (plain, waits, default_on)] == [[False, False], [False, True], [True, True]]
    monkeypatch.setenv("DEEPGEMM_JIT_NO_PROGRAMMATIC_LAUNCH", "1")
    off = launch.LaunchPlan(FakeKernel(), (1, 1, 1), (32, 1, 1), args, 0, waits=True, programmatic=True)
    off.run(None)
    off.run(None, programmatic=True)
    assert off.kernel.launched == [False, False] and off.pdl is None
    with pytest.raises(ValueError, match="waits"):
        launch.LaunchPlan(FakeKernel(), (1, 1, 1), (32, 1, 1), args, 0, programmatic=True)
    # Plans of one kernel and launch shape share one configuration (made once: calls without out= plan every time).
    monkeypatch.delenv("DEEPGEMM_JIT_NO_PROGRAMMATIC_LAUNCH")
    kernel = FakeKernel()
    first, again = (launch.LaunchPlan(kernel, (2, 1, 1), (32, 1, 1), args, 0, waits=True) for _ in range(2))
    other = launch.LaunchPlan(kernel, (3, 1, 1), (32, 1, 1), args, 0, waits=True)
    assert first.pdl is again.pdl is not other.pdl and len(kernel._programmatic) == 2


def test_dlpack_operands_are_imported_with_the_kernel_stream_current(monkeypatch):
    """A DLPack-only operand is ordered on CuPy's current stream when imported: the first import defers, and the
    decorated entry point runs the call again with the kernel's stream current (stream=, or torch's for a torch
    call) and imports allowed; other calls run once, with no stream lookup."""
    import contextlib

    pytest.importorskip("cupy")
    from deepgemm_jit import arrays

    entered, runs = [], []

    @contextlib.contextmanager
    def fake_stream(kind, stream, device_id):
        entered.append((kind, stream))
        yield

    monkeypatch.setattr(runtime, "stream_for", fake_stream)
    monkeypatch.setattr("cupy.cuda.runtime.getDevice", lambda: 0)
    monkeypatch.setattr(arrays, "array_fields", lambda x, arg: arrays._dlpack_fields(x, arg)
                        if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray) else None)
    monkeypatch.setattr("cupy.from_dlpack", lambda x: None)

    class OnGpu:
        def __dlpack__(self, stream=None):
            raise AssertionError("cupy.from_dlpack is replaced in this test")

        def __dlpack_device__(self):
            return (2, 0)

    @runtime.orders_dlpack_imports
    def call(a, b, *, bias=None, stream=None):
        runs.append(arrays.dlpack_imports.ready)
        for x in (a, b, bias):
            arrays.array_fields(x, "x")
        return len(entered)

    plain = np.zeros(1)
    assert call(plain, plain, stream=7) == 0 and runs == [False]            # no DLPack operand: one run
    runs.clear()
    assert call(OnGpu(), plain) == 0 and runs == [False, True]              # CuPy's current stream serves
    assert call(OnGpu(), plain, stream=7) == 1 and entered[-1] == ("cupy", 7)
    assert call(plain, plain, bias=OnGpu(), stream=9) == 2 and entered[-1] == ("cupy", 9)
    assert not arrays.dlpack_imports.ready and not arrays.dlpack_imports.inside   # reset after the call
    # Outside any entry point (arrays.matrix_view called directly) the import is made at once, as before.
    assert arrays._dlpack_fields(OnGpu(), "x") is None


def test_kept_plans_serve_only_the_stream_whose_buffers_they_write(monkeypatch):
    """launch.KeptPlans: a plan kept for any stream serves every stream; one kept for a stream (it writes that
    stream's split-K workspace or staging buffers, stream_buffers.py) serves only it, and the same key keeps one
    plan per stream (two streams alternating do not evict each other's); nothing serves another device."""
    from deepgemm_jit import device, launch

    class Stream:
        def __init__(self, ptr):
            self.ptr = ptr

    current = {"device": 0}
    monkeypatch.setattr(device, "current_device_id", lambda: current["device"])
    monkeypatch.setattr(runtime, "stream_for", lambda kind, stream, device_id: Stream(stream))
    kept = launch.KeptPlans(limit=2, per_key_streams=3)
    kept.keep(("any",), "plan-any", "cupy", 0, None)
    kept.keep(("bound",), "plan-on-1", "cupy", 0, 1)
    kept.keep(("bound",), "plan-on-2", "cupy", 0, 2)
    assert kept.lookup(("any",), 5)[0] == "plan-any" and kept.lookup(("any",), 5)[1].ptr == 5
    assert kept.lookup(("bound",), 1)[0] == "plan-on-1" and kept.lookup(("bound",), 2)[0] == "plan-on-2"
    assert kept.lookup(("bound",), 3) is None and kept.lookup(("missing",), 1) is None
    current["device"] = 1
    assert kept.lookup(("any",), 5) is None
    current["device"] = 0
    for ptr in (3, 4):  # past per_key_streams the key's plans start over
        kept.keep(("bound",), f"plan-on-{ptr}", "cupy", 0, ptr)
    assert kept.lookup(("bound",), 1) is None and kept.lookup(("bound",), 4)[0] == "plan-on-4"
    kept.keep(("third",), "plan-3", "cupy", 0, None)  # past limit keys: all start over
    assert len(kept) == 1 and kept.plans() == ["plan-3"]
    # The per-thread default stream (handle 2) is another stream in every thread: a plan kept for it in one thread
    # (it writes that thread's buffers) serves no other thread, even one that reuses a finished thread's id.
    import threading

    kept.keep(("ptds",), "plan-of-this-thread", "cupy", 0, 2)
    seen = []
    for _ in range(2):
        thread = threading.Thread(target=lambda: seen.append(kept.lookup(("ptds",), 2)))
        thread.start()
        thread.join()
    assert seen == [None, None] and kept.lookup(("ptds",), 2)[0] == "plan-of-this-thread"
    for _ in range(3):  # a thread that exits, then a new one (often with the same thread id)
        done = threading.Thread(target=lambda: kept.keep(("ptds",), "plan-of-a-finished-thread", "cupy", 0, 2))
        done.start()
        done.join()
        thread = threading.Thread(target=lambda: seen.append(kept.lookup(("ptds",), 2)))
        thread.start()
        thread.join()
    assert seen == [None] * 5
    kept.clear()
    assert len(kept) == 0
