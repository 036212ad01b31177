"""Every user error is a ValueError/TypeError naming the argument, raised before any launch.

Runs without a GPU: operands are stand-ins exposing __cuda_array_interface__, and the
device-pointer query is replaced so that they count as memory of device 0.
"""
import dataclasses

import numpy as np
import pytest

import deepgemm_jit as dg
from deepgemm_jit import arrays, dtypes
from deepgemm_jit.errors import NoGPUError
from fakes import BASE, FakeDeviceArray


@pytest.fixture
def g(shared_cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    return dg.build(64, 48, 40, dtype="fp16", arch="sm_90a")


F16 = np.float16


@pytest.mark.parametrize("make,exc,word", [
    (lambda: (np.zeros((5, 40), F16), FakeDeviceArray((48, 40), F16)), TypeError, "a is a NumPy"),
    (lambda: ([[1.0]], FakeDeviceArray((48, 40), F16)), TypeError, "a must be a GPU array"),
    (lambda: (FakeDeviceArray((5, 40), np.float32), FakeDeviceArray((48, 40), F16)), TypeError, "a has dtype"),
    (lambda: (FakeDeviceArray((5, 40), F16), FakeDeviceArray((48, 40), np.float32)), TypeError, "b has dtype"),
    (lambda: (FakeDeviceArray((5, 41), F16), FakeDeviceArray((48, 40), F16)), ValueError, "a has shape"),
    (lambda: (FakeDeviceArray((5, 40), F16), FakeDeviceArray((40, 48), F16)), ValueError, "b has shape"),
    (lambda: (FakeDeviceArray((5, 40, 1), F16), FakeDeviceArray((48, 40), F16)), ValueError, "a must be 2-D"),
    (lambda: (FakeDeviceArray((5, 40), F16, strides=(80, 2)), FakeDeviceArray((48, 40), F16)),
     ValueError, "a must have unit stride"),
    (lambda: (FakeDeviceArray((5, 40), F16), FakeDeviceArray((48, 40), F16, strides=(20, 1))),
     ValueError, "b has a row stride"),
    (lambda: (FakeDeviceArray((5, 40), F16, ptr=BASE + 1), FakeDeviceArray((48, 40), F16)),
     ValueError, "a data pointer"),
    (lambda: (FakeDeviceArray((5, 40), F16, ptr=BASE + 4 * 80, strides=(-40, 1)), FakeDeviceArray((48, 40), F16)),
     ValueError, "a has a negative row stride"),   # a reversed view: "rows overlap" was the reason given
])
def test_operand_errors(g, fake_gpu_memory, make, exc, word):
    a, b = make()
    with pytest.raises(exc, match=word):
        g(a, b)


def test_out_errors(g, fake_gpu_memory):
    a = FakeDeviceArray((5, 40), F16, ptr=BASE)
    b = FakeDeviceArray((48, 40), F16, ptr=BASE + 4096)
    with pytest.raises(ValueError, match="out has shape"):
        g(a, b, out=FakeDeviceArray((5, 47), F16, ptr=BASE + 65536))
    with pytest.raises(TypeError, match="out has dtype"):
        g(a, b, out=FakeDeviceArray((5, 48), np.float32, ptr=BASE + 65536))
    with pytest.raises(ValueError, match="out overlaps"):
        g(a, b, out=FakeDeviceArray((5, 48), F16, ptr=BASE + 4096 + 64))
    with pytest.raises(ValueError, match="out must have unit stride"):
        g(a, b, out=FakeDeviceArray((5, 48), F16, ptr=BASE + 65536, strides=(96, 2)))
    # review: a read-only array (a JAX array exports data[1] = True) was accepted and written
    with pytest.raises(ValueError, match="out is read-only"):
        g(a, b, out=FakeDeviceArray((5, 48), F16, ptr=BASE + 65536, read_only=True))
    arrays.check_writable(FakeDeviceArray((5, 48), F16, ptr=BASE + 65536), "out")  # writable: nothing raised


def test_valid_call_without_gpu_is_a_clear_error(g, fake_gpu_memory):
    a = FakeDeviceArray((5, 40), F16, ptr=BASE)
    b = FakeDeviceArray((48, 40), F16, ptr=BASE + 4096)
    from deepgemm_jit import device
    if device.gpu_count():
        pytest.skip("a GPU is present")
    with pytest.raises(NoGPUError, match="needs a GPU"):
        g(a, b)
    # Padded row strides (inner stride 1) are accepted by validation.
    a_padded = FakeDeviceArray((5, 40), F16, ptr=BASE, strides=(64, 1))
    with pytest.raises(NoGPUError):
        g(a_padded, b)


def test_build_argument_errors(cache_dir):
    with pytest.raises(ValueError, match="M must be"):
        dg.build(0, 8, 8, arch="sm_90a")
    with pytest.raises(TypeError, match="M must be an integer"):
        dg.build("8", 8, 8, arch="sm_90a")
    with pytest.raises(ValueError, match="dtype"):
        dg.build(8, 8, 8, dtype="fp64", arch="sm_90a")
    with pytest.raises(ValueError, match="layout"):
        dg.build(8, 8, 8, layout="NTT", arch="sm_90a")
    with pytest.raises(ValueError, match="arch"):
        dg.build(8, 8, 8, arch="sm_70")
    # switches that took any truthy value as on ("false" streamed weights, "no" tuned)
    with pytest.raises(TypeError, match="weight_streaming must be True, False or None"):
        dg.build(8, 8, 8, arch="sm_90a", weight_streaming="false")
    with pytest.raises(TypeError, match="tune must be True, False or None"):
        dg.build(8, 8, 8, arch="sm_90a", tune="no")
    with pytest.raises(TypeError, match="M must be an integer"):  # was a TypeError from a comparison inside
        dg.build_fp32(None, 256, 256, arch="sm_90a")


def test_grouped_builds_refuse_what_they_cannot_run(cache_dir):
    """A portable (sm80) config for a grouped GEMM compiled a plain kernel that multiplied every row by group 0's
    weight, with no error; epilogue='bias_row' compiled and then failed on every call."""
    from deepgemm_jit import config

    portable = config.KernelConfig("sm80", 64, 64, 32, 3, 2, 2, 8, 8)
    with pytest.raises(ValueError, match="grouped GEMMs run on the sm90 family only"):
        dg.build_grouped(256, 256, arch="sm_90a", config=portable)
    with pytest.raises(ValueError, match="or bias_row"):
        dg.build_grouped(256, 256, arch="sm_90a", epilogue="bias_row")


def test_build_without_gpu_needs_arch(cache_dir):
    from deepgemm_jit import device
    if device.gpu_count():
        pytest.skip("a GPU is present")
    with pytest.raises(NoGPUError, match="arch='sm_90a'"):
        dg.build(8, 8, 8)


def test_bf16_dtype_is_ml_dtypes():
    assert dtypes.numpy_dtype("bf16").name == "bfloat16"
    assert dtypes.storage_name_of(dtypes.numpy_dtype("bf16")) == "bf16"


def test_configs_out_of_range_are_refused():
    """group_m: the scheduler's band product is 32-bit (a record with 2^33 failed to compile); sm80 warps: a CTA
    holds at most 1024 threads (64 x 64 warps built and would fail at every launch)."""
    with pytest.raises(ValueError, match="group_m must be at most 256"):
        dg.KernelConfig("sm90", 128, 64, 64, 4, 2, 1, 8, 8, group_m=257)
    assert dg.KernelConfig("sm90", 128, 64, 64, 4, 2, 1, 8, 8, group_m=256).group_m == 256
    with pytest.raises(ValueError, match="at most 32"):
        dg.KernelConfig("sm80", 64 * 16, 64 * 8, 32, 2, 64, 64, vec_a=8, vec_b=8)
    assert dg.KernelConfig("sm80", 128, 256, 32, 2, 4, 8, vec_a=8, vec_b=8).num_threads == 1024


def test_portable_kernel_refuses_rows_past_32_bits(cache_dir, fake_gpu_memory):
    """gemm_sm80.cuh's row index is a 32-bit int: with 96-row blocks, M near 2^31 would run the last block's rows
    past 2^31 - 1 (negative, passing `row < m`); 64-row blocks end exactly at 2^31."""
    from deepgemm_jit import launch
    from deepgemm_jit.arrays import matrix_view
    from fakes import FakeKernel

    for block_m, m, refused in ((96, 2 ** 31 - 1, True), (96, 2 ** 31 - 96 * 2, False), (64, 2 ** 31 - 1, False)):
        cfg = dg.KernelConfig("sm80", block_m, 128, 32, 3, 2, 4, vec_a=8, vec_b=8)
        g = dg.build(1000, 8, 8, dtype="bf16", arch="sm_90a", config=cfg)
        va = matrix_view(FakeDeviceArray((m, 8), dtypes.numpy_dtype("bf16")), "a")
        vb = matrix_view(FakeDeviceArray((8, 8), dtypes.numpy_dtype("bf16")), "b")
        vd = matrix_view(FakeDeviceArray((m, 8), dtypes.numpy_dtype("bf16")), "out")
        if refused:
            with pytest.raises(ValueError, match="past 2"):
                launch.plan(FakeKernel(), g.artifact, g.spec, m, va, vb, vd, 0)
        else:
            assert launch.plan(FakeKernel(), g.artifact, g.spec, m, va, vb, vd, 0).grid[0] * block_m <= 2 ** 31


def test_cuda_array_interface_null_pointer_and_stream(fake_gpu_memory, monkeypatch):
    """A NULL data pointer is allowed for empty arrays only (it would fault in the kernel). A producer's "stream"
    (CAI v3) is synchronised before the data is used, as the protocol asks consumers; 0 is not a valid stream."""
    import cupy

    null = FakeDeviceArray((300, 64), ptr=0)
    with pytest.raises(ValueError, match="a NULL data pointer"):
        arrays.array_fields(null, "a")
    assert arrays.array_fields(FakeDeviceArray((0, 64), ptr=0), "a")[3] == 0
    synced = []
    monkeypatch.setattr(cupy.cuda.runtime, "streamSynchronize", synced.append)
    x = FakeDeviceArray((3, 64))
    x.__cuda_array_interface__["stream"] = 0x1234
    arrays.array_fields(x, "a")
    x.__cuda_array_interface__["stream"] = None
    arrays.array_fields(x, "a")
    assert synced == [0x1234]
    for bad in (0, True, "1"):
        x.__cuda_array_interface__["stream"] = bad
        with pytest.raises(ValueError, match="has stream"):
            arrays.array_fields(x, "b")


def test_cuda_array_interface_mask_is_refused(fake_gpu_memory):
    """A CAI mask marks invalid elements, which the kernels would read as data (CuPy refuses masked arrays too)."""
    x = FakeDeviceArray((64, 128), np.float16)
    x.__cuda_array_interface__["mask"] = None  # no mask
    assert arrays.array_fields(x, "a")[0] == (64, 128)
    x.__cuda_array_interface__["mask"] = FakeDeviceArray((64, 128), np.bool_).__cuda_array_interface__
    with pytest.raises(ValueError, match="a is a masked array"):
        arrays.array_fields(x, "a")


def test_cuda_array_interface_v2_with_dlpack_imports_through_dlpack(fake_gpu_memory, monkeypatch):
    """A CAI v2 export carries no stream, so it cannot say whether the producer's writes are done (jaxlib exports
    float arrays that way without waiting for them): an object that also speaks DLPack is imported through DLPack,
    which orders the import after the producer's work. A v3 export, or a v2 one without __dlpack__, stays on CAI."""
    imported = []
    monkeypatch.setattr(arrays, "_dlpack_fields", lambda x, arg: imported.append(arg) or ((3, 64), (256, 4),
                                                                                         np.dtype(np.float32), 7, 0))

    class Both(FakeDeviceArray):
        def __dlpack__(self, stream=None):
            raise AssertionError("the test replaces the DLPack import")

    v2 = Both((3, 64))
    v2.__cuda_array_interface__["version"] = 2
    assert arrays.array_fields(v2, "a")[3] == 7 and imported == ["a"]
    assert arrays.array_fields(Both((3, 64)), "b")[3] == FakeDeviceArray((3, 64)).__cuda_array_interface__["data"][0]
    plain_v2 = FakeDeviceArray((3, 64))
    plain_v2.__cuda_array_interface__["version"] = 2
    arrays.array_fields(plain_v2, "c")
    assert imported == ["a"]


def test_explicit_config(cache_dir):
    cfg = dg.KernelConfig("sm80", 64, 64, 32, 2, 2, 2, vec_a=8, vec_b=8)
    g = dg.build(100, 64, 64, dtype="bf16", arch="sm_90a", config=cfg)
    assert g.config == cfg and g.family == "sm80"
    with pytest.raises(ValueError, match="vec_a"):
        dg.build(100, 64, 64, dtype="tf32", arch="sm_90a", config=cfg)  # 8 fp32 = 32-byte loads
    sm90 = dg.KernelConfig("sm90", 128, 64, 64, 4, 2, 1, 8, 8, group_m=8)
    with pytest.raises(ValueError, match="block_k"):  # TF32 K blocks are 32 wide (128 bytes)
        dg.build(100, 64, 64, dtype="tf32", layout="nn", arch="sm_90a", config=sm90)
    # MN-major TF32 with a Hopper config: the nt twin's kernel, calls transpose the operands (sm90_rules.kernel_spec;
    # nn at small M: its own kernel, which transposes B in shared memory)
    g = dg.build(100, 64, 64, dtype="tf32", layout="tt", arch="sm_90a", config=dataclasses.replace(sm90, block_k=32))
    assert g.family == "sm90" and g.kernel_spec.layout == "nt" and g.spec.layout == "tt"
    g = dg.build(100, 64, 64, dtype="tf32", layout="nn", arch="sm_90a", config=dataclasses.replace(sm90, block_k=32))
    assert g.family == "sm90" and g.kernel_spec.layout == "nn" and g.spec.layout == "nn"
    with pytest.raises(ValueError, match="multiple of 64"):  # an MN-major B comes in 64-column boxes
        dg.build(100, 64, 64, dtype="bf16", layout="nn", arch="sm_90a",
                 config=dataclasses.replace(sm90, block_n=48))
    with pytest.raises(TypeError, match="KernelConfig"):
        dg.build(100, 64, 64, arch="sm_90a", config={"block_m": 64})


class _FakeTorch:
    """Stand-in for the torch module: enough of torch.Tensor for arrays.py (no torch needed)."""

    class Tensor:
        def __init__(self, shape, dtype="torch.float16", device=("cuda", 0), ptr=1 << 20, stride=None, neg=False,
                     conj=False):
            self._neg, self._conj = neg, conj
            self.shape = tuple(shape)
            self.dtype = dtype
            self.device = type("Device", (), {"type": device[0], "index": device[1],
                                             "__str__": lambda s: f"{device[0]}:{device[1]}"})()
            self._ptr = ptr
            self._stride = stride or (shape[1], 1)

        def data_ptr(self):
            return self._ptr

        def stride(self):
            return self._stride

        def is_neg(self):
            return self._neg

        def is_conj(self):
            return self._conj


@pytest.fixture
def fake_torch(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch)
    return _FakeTorch


def test_torch_tensors_are_read_in_place(fake_torch):
    from deepgemm_jit import arrays
    t = fake_torch.Tensor((5, 40), "torch.bfloat16", ptr=BASE + 256, stride=(48, 1))
    v = arrays.matrix_view(t, "a")
    assert (v.ptr, v.rows, v.cols, v.row_stride, v.dtype.name, v.device) == (BASE + 256, 5, 40, 48, "bfloat16", 0)
    assert arrays.array_kind(t) == "torch"
    with pytest.raises(TypeError, match="a is a torch tensor on cpu"):
        arrays.matrix_view(fake_torch.Tensor((5, 40), device=("cpu", None)), "a")
    with pytest.raises(TypeError, match="a has dtype torch.quint8"):
        arrays.matrix_view(fake_torch.Tensor((5, 40), "torch.quint8"), "a")
    # review: x.conj().imag is a float view whose memory holds the negated values; it was read as stored
    for flags in ({"neg": True}, {"conj": True}):
        with pytest.raises(TypeError, match="a is a lazily negated"):
            arrays.matrix_view(fake_torch.Tensor((5, 40), **flags), "a")


def test_mixed_array_libraries_are_refused(g, fake_torch, fake_gpu_memory):
    a = fake_torch.Tensor((5, 40), "torch.float16", ptr=BASE)
    b = FakeDeviceArray((48, 40), F16, ptr=BASE + 4096)
    with pytest.raises(TypeError, match="same array library"):
        g(a, b)


def test_dlpack_only_producer_is_tried():
    """An object speaking only DLPack is imported through cupy.from_dlpack; when that fails (here: no GPU, or a
    host array), the error names the argument instead of claiming the object is not an array."""
    class HostDLPack:
        def __init__(self):
            self._x = np.ones((4, 4), np.float16)

        def __dlpack__(self, stream=None):
            return self._x.__dlpack__()

        def __dlpack_device__(self):
            return self._x.__dlpack_device__()

    with pytest.raises(TypeError, match="b .*DLPack"):
        arrays.matrix_view(HostDLPack(), "b")


def test_written_scales_must_be_distinct_and_apart_from_inputs(shared_cache_dir, fake_gpu_memory, monkeypatch):
    """quant_fp8_g128's scales_out (and the per-tensor kinds' amax_out) are written while the kernel reads its
    inputs: over a, b, scale_a or scale_b they would be overwritten mid-launch, and interleaving strides would make
    two groups' scales one word. Both were accepted (only zero strides and overlap with out were refused)."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    g = dg.build(256, 512, 512, dtype="fp8", epilogue="quant_fp8_g128", arch="sm_90a")
    m, u1 = 256, np.uint8
    a, b = FakeDeviceArray((m, 512), u1, ptr=BASE), FakeDeviceArray((512, 512), u1, ptr=BASE + (1 << 20))
    out = FakeDeviceArray((m, 512), u1, ptr=BASE + (2 << 20))
    sa = FakeDeviceArray((m, 4), np.float32, ptr=BASE + (3 << 20))
    sb = FakeDeviceArray((4, 4), np.float32, ptr=BASE + (4 << 20))
    apart = BASE + (5 << 20)
    for ptr, strides, word in ((sa.__cuda_array_interface__["data"][0], None, "scales_out overlaps scale_a"),
                               (BASE, None, "scales_out overlaps a"), (BASE + (1 << 20) + 64, None, "overlaps b"),
                               (apart, (1, 1), "interleaving strides"), (apart, (0, 1), "interleaving strides")):
        scales_out = FakeDeviceArray((m, 4), np.float32, ptr=ptr, strides=strides)
        with pytest.raises(ValueError, match=word):
            g(a, b, scale_a=sa, scale_b=sb, out=out, scales_out=scales_out)
    from deepgemm_jit import device
    if not device.gpu_count():  # apart, row- or M-major: validation passes, the launch needs a GPU
        for strides in (None, (1, m)):
            with pytest.raises(NoGPUError):
                g(a, b, scale_a=sa, scale_b=sb, out=out, scales_out=FakeDeviceArray((m, 4), np.float32, ptr=apart,
                                                                                     strides=strides))
    q = dg.build(256, 512, 512, dtype="fp8", epilogue="quant_fp8_tensor", arch="sm_90a", scaling="tensor")
    st, sbt = FakeDeviceArray((1,), np.float32, ptr=BASE + (6 << 20)), FakeDeviceArray((1,), np.float32, ptr=apart)
    with pytest.raises(ValueError, match="amax_out overlaps scale_a"):
        q(a, b, scale_a=st, scale_b=sbt, out=out, quant_scale=FakeDeviceArray((1,), np.float32, ptr=apart + 64),
          amax_out=FakeDeviceArray((1,), np.float32, ptr=BASE + (6 << 20)))
    # read-only outputs (a JAX array's interface says so) are refused before anything is written
    with pytest.raises(ValueError, match="amax_out is read-only"):
        q(a, b, scale_a=st, scale_b=sbt, out=out, quant_scale=FakeDeviceArray((1,), np.float32, ptr=apart + 64),
          amax_out=FakeDeviceArray((1,), np.float32, ptr=apart + 128, read_only=True))
    with pytest.raises(ValueError, match="scales_out is read-only"):
        g(a, b, scale_a=sa, scale_b=sb, out=out, scales_out=FakeDeviceArray((m, 4), np.float32, ptr=apart,
                                                                             read_only=True))


def test_out_beside_a_in_one_buffer_is_not_an_overlap(g, fake_gpu_memory):
    """Column blocks of one buffer never share a byte: out written next to a (buf[:, :K] and buf[:, K:]) was refused
    as an overlap, since the check compared whole spans (review). One more column of a does overlap."""
    b = FakeDeviceArray((48, 40), F16, ptr=BASE + (1 << 20))
    a, out = FakeDeviceArray((64, 40), F16, ptr=BASE, strides=(88, 1)), FakeDeviceArray((64, 48), F16, ptr=BASE + 80,
                                                                                         strides=(88, 1))
    with pytest.raises(NoGPUError):
        g(a, b, out=out)
    wide = FakeDeviceArray((64, 40), F16, ptr=BASE + 2, strides=(88, 1))   # its last column is out's first
    with pytest.raises(ValueError, match="out overlaps a or b"):
        g(wide, b, out=out)


def test_empty_operand_with_a_null_pointer_is_on_the_current_device(monkeypatch):
    """The CUDA array interface allows data = (0, ...) for empty arrays: it is on no device, so it counts as the
    current one (it was device 0 whatever the current device, and an M = 0 call on GPU 1 was refused)."""
    monkeypatch.setattr(arrays, "_current_device", lambda: 1)
    assert arrays.matrix_view(FakeDeviceArray((0, 40), F16, ptr=0), "a").device == 1


def test_written_quant_outputs_stay_apart_from_bias(shared_cache_dir, fake_gpu_memory, monkeypatch):
    """scales_out / amax_out over the bias: CTAs still loading their bias tiles would read the overwritten values.
    The bias was kept as a bare pointer and missed the overlap checks (review)."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    a, b = FakeDeviceArray((64, 128), F16, ptr=BASE), FakeDeviceArray((256, 128), F16, ptr=BASE + (1 << 20))
    bias = FakeDeviceArray((256,), np.float32, ptr=BASE + (2 << 20))
    g = dg.build(64, 256, 128, dtype="fp16", epilogue="bias+quant_fp8_g128", arch="sm_90a")
    with pytest.raises(ValueError, match="scales_out overlaps bias"):
        g(a, b, bias=bias, scales_out=FakeDeviceArray((64, 2), np.float32, ptr=BASE + (2 << 20) + 64))
    q = dg.build(64, 256, 128, dtype="fp16", epilogue="bias+quant_fp8_tensor", arch="sm_90a")
    with pytest.raises(ValueError, match="amax_out overlaps bias"):
        q(a, b, bias=bias, quant_scale=FakeDeviceArray((1,), np.float32, ptr=BASE + (3 << 20)),
          amax_out=FakeDeviceArray((1,), np.float32, ptr=BASE + (2 << 20) + 8))


def test_plan_keys_leave_validation_to_refuse_odd_scalars(g, fake_gpu_memory):
    """alpha / beta enter the launch-plan key as floats: alpha=True (== 1.0) could find alpha=1.0's plan and skip
    the type check, and an unhashable alpha raised 'unhashable type' instead of naming the argument."""
    assert arrays.scalar_signature(True) is None and arrays.scalar_signature([1.0]) is None
    assert arrays.scalar_signature(np.float32(0.5)) == (0.5).hex() and arrays.scalar_signature(2) == (2.0).hex()
    assert arrays.scalar_signature(-0.0) != arrays.scalar_signature(0.0)   # the sign of a zero alpha reaches D
    a = FakeDeviceArray((5, 40), F16, ptr=BASE)
    b = FakeDeviceArray((48, 40), F16, ptr=BASE + 4096)
    out = FakeDeviceArray((5, 48), F16, ptr=BASE + 65536)
    for alpha in ([1.0], True):
        with pytest.raises(TypeError, match="alpha must be a number"):
            g(a, b, out=out, alpha=alpha)


def test_scalars_outside_float32_are_refused_by_name(shared_cache_dir, fake_gpu_memory, monkeypatch):
    """alpha / beta reach the kernel as float32: 1e39 became inf silently, and an int past float64 (10**400) raised
    a bare OverflowError from the plan key (review, session 60). inf and NaN pass as given (BLAS semantics)."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    assert arrays.scalar_signature(10**400) is None
    g = dg.build(64, 48, 40, dtype="fp16", epilogue="beta", arch="sm_90a")
    a, b = FakeDeviceArray((5, 40), F16, ptr=BASE), FakeDeviceArray((48, 40), F16, ptr=BASE + 4096)
    c, out = FakeDeviceArray((5, 48), F16, ptr=BASE + 65536), FakeDeviceArray((5, 48), F16, ptr=BASE + 131072)
    for arg, value in (("alpha", 1e39), ("beta", -1e300), ("alpha", 10**400), ("beta", np.float64(4e38))):
        with pytest.raises(ValueError, match=f"{arg}=.* outside the float32 range"):
            g(a, b, c=c, out=out, **{arg: value})
    from deepgemm_jit import device
    if not device.gpu_count():
        for value in (float("inf"), float("nan"), 3.4e38):  # valid: the launch is what needs the GPU
            with pytest.raises(NoGPUError):
                g(a, b, c=c, out=out, alpha=value)


def test_lazy_torch_views_never_replay_a_plan(fake_torch):
    """A launch plan is found by the operands' signatures; a lazily negated / conjugated torch view has the plain
    tensor's pointer, shape and strides, so it replayed the plain tensor's plan and was read as stored (review,
    session 60). Such views have no signature: the call validates, and validation refuses them."""
    plain = fake_torch.Tensor((5, 40), ptr=BASE)
    assert arrays.signature(plain) is not None
    for flags in ({"neg": True}, {"conj": True}):
        assert arrays.signature(fake_torch.Tensor((5, 40), ptr=BASE, **flags)) is None


def test_amax_out_call_is_checked_before_the_twin_is_built(shared_cache_dir, fake_gpu_memory, monkeypatch):
    """A call with amax_out= on a static-scale quantizing Gemm runs its amax twin, built on that first call. The
    twin was built before any argument was looked at: offline (DEEPGEMM_JIT_OFFLINE=1, twin not warmed) a wrong
    argument surfaced as KernelNotCachedError, online only after a compile (review, session 60)."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    q = dg.build(64, 512, 128, dtype="fp16", epilogue="quant_fp8_tensor", arch="sm_90a")
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    built = []
    monkeypatch.setattr(q, "_amax_gemm", lambda: built.append(1))
    a, b = FakeDeviceArray((64, 128), F16, ptr=BASE), FakeDeviceArray((512, 128), F16, ptr=BASE + (1 << 20))
    out = FakeDeviceArray((64, 512), np.uint8, ptr=BASE + (2 << 20))
    qs, amax = (FakeDeviceArray((1,), np.float32, ptr=BASE + (p << 20)) for p in (4, 5))
    cases = ((dict(a=np.zeros((64, 128), F16)), TypeError, "a is a NumPy"),
             (dict(quant_scale=None), TypeError, "quant_scale is required"),
             (dict(amax_out=FakeDeviceArray((1,), F16, ptr=BASE + (5 << 20))), TypeError, "amax_out has dtype"),
             (dict(amax_out=0.0), TypeError, "amax_out must be a GPU array"))
    for change, exc, words in cases:
        call = dict(a=a, b=b, out=out, quant_scale=qs, amax_out=amax) | change
        with pytest.raises(exc, match=words):
            q(call.pop("a"), call.pop("b"), **call)
    assert not built


def test_bias_dtype_error_says_why(shared_cache_dir, fake_gpu_memory, monkeypatch):
    """A float32-only bias (quantized outputs) with a wrong dtype was refused as 'scales are float32' (review)."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    a, b = FakeDeviceArray((64, 128), F16, ptr=BASE), FakeDeviceArray((256, 128), F16, ptr=BASE + (1 << 20))
    g = dg.build(64, 256, 128, dtype="fp16", epilogue="bias+quant_fp8_g128", arch="sm_90a")
    with pytest.raises(TypeError, match="bias has dtype float16; this epilogue adds it in float32"):
        g(a, b, bias=FakeDeviceArray((256,), F16, ptr=BASE + (2 << 20)))
    h = dg.build(64, 256, 128, dtype="fp16", epilogue="bias", arch="sm_90a")
    with pytest.raises(TypeError, match="bias has dtype float32; it must be float16 like the output"):
        h(a, b, bias=FakeDeviceArray((256,), np.float32, ptr=BASE + (2 << 20)))
