"""deepgemm_jit.torch without a GPU: the ops' fake implementations on meta tensors, tracing, Linear and
swap_linears bookkeeping, errors; FP8 Linears built from weights quantized by the NumPy float64 reference.
Skipped cleanly where torch is not installed."""
import io

import numpy as np
import pytest

from deepgemm_jit import reference
from deepgemm_jit.spec import GemmSpec

pytestmark = pytest.mark.torch  # skipped in CI (no torch); the GPU machine's runs select it (-m "gpu or torch")
torch = pytest.importorskip("torch")
dgt = pytest.importorskip("deepgemm_jit.torch")

M, N, K = 37, 24, 40
A_SHAPE = {"nt": (M, K), "nn": (M, K), "tn": (K, M), "tt": (K, M)}
B_SHAPE = {"nt": (N, K), "nn": (K, N), "tn": (K, N), "tt": (N, K)}
DTYPE_OUT = [(torch.bfloat16, None, torch.bfloat16), (torch.float16, None, torch.float16),
             (torch.float32, None, torch.float32), (torch.bfloat16, "fp32", torch.float32),
             (torch.float16, "bf16", torch.bfloat16), (torch.float32, "bf16", torch.bfloat16)]


def meta(shape, dtype=torch.bfloat16):
    return torch.empty(shape, device="meta", dtype=dtype)


@pytest.mark.parametrize("dtype,out_dtype,want", DTYPE_OUT)
@pytest.mark.parametrize("layout", ["nt", "nn", "tn", "tt"])
def test_fake_shapes_and_dtypes(layout, dtype, out_dtype, want):
    a, b = meta(A_SHAPE[layout], dtype), meta(B_SHAPE[layout], dtype)
    d = torch.ops.deepgemm_jit.gemm(a, b, layout, out_dtype)
    case = f"{layout=} {dtype=} {out_dtype=}"
    assert d.device.type == "meta", case
    assert tuple(d.shape) == (M, N), f"{case} shape={tuple(d.shape)}"
    assert d.dtype == want, f"{case} got {d.dtype}"
    assert d.is_contiguous(), case
    # The public wrapper goes through the same op.
    assert tuple(dgt.gemm(a, b, layout=layout.upper(), out_dtype=out_dtype).shape) == (M, N), case


@pytest.mark.parametrize("a_shape", [(K,), (1, K), (2, 3, K), (2, 3, 5, K), (0, K), (2, 0, K)])
def test_fake_nt_keeps_leading_dims(a_shape):
    d = torch.ops.deepgemm_jit.gemm(meta(a_shape), meta((N, K)))
    assert tuple(d.shape) == a_shape[:-1] + (N,), f"{a_shape=} -> {tuple(d.shape)}"


def test_schema():
    schema = str(torch.ops.deepgemm_jit.gemm.default._schema)
    assert schema == 'deepgemm_jit::gemm(Tensor a, Tensor b, str layout="nt", str? out_dtype=None) -> Tensor'


@pytest.mark.parametrize("a,b,kwargs,error,match", [
    (meta((M, K)), meta((N, K + 1)), {}, ValueError, r"b has shape \(24, 41\); layout 'nt' wants b \(N, K\)"),
    (meta((M, K)), meta((N, K)), {"layout": "nn"}, ValueError, r"wants b \(K, N\) with K=40"),
    (meta((2, M, K)), meta((K, N)), {"layout": "nn"}, ValueError, "only 'nt' flattens"),
    (meta((M, K)), meta((1, N, K)), {}, ValueError, "b must be 2-D"),
    (meta((M, K)), meta((N, K)), {"layout": "xt"}, ValueError, "layout='xt' is not supported"),
    (meta((M, K)), meta((N, K)), {"out_dtype": "fp8"}, ValueError, "out_dtype='fp8' is not supported"),
    (meta((M, K)), meta((N, K)), {"out_dtype": "int32"}, ValueError, "out_dtype='int32' is not supported"),
    (meta((M, K)), meta((N, K), torch.float16), {}, TypeError, "b has dtype torch.float16 but a has"),
    (meta((M, K), torch.float64), meta((N, K), torch.float64), {}, TypeError, "a has dtype torch.float64"),
])
def test_fake_errors_name_the_argument(a, b, kwargs, error, match):
    with pytest.raises(error, match=match):
        dgt.gemm(a, b, **kwargs)


def test_real_impl_refuses_cpu_tensors():
    a, b = torch.zeros((M, K), dtype=torch.bfloat16), torch.zeros((N, K), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="runs on CUDA tensors; a is on cpu"):
        dgt.gemm(a, b)


def test_export_traces_the_op_without_running_it():
    """torch.export traces with fake tensors, as torch.compile does: the op must be one node, no break."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = dgt.Linear(K, N, bias=True)

        def forward(self, x):
            return torch.nn.functional.silu(self.proj(x))

    x = torch.zeros((2, 7, K), dtype=torch.bfloat16)
    program = torch.export.export(Model(), (x,))
    targets = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert torch.ops.deepgemm_jit.gemm.default in targets, targets
    out = [node for node in program.graph.nodes if node.op == "output"][0].args[0][0]
    assert tuple(out.meta["val"].shape) == (2, 7, N)


def test_meta_tensors_requiring_grad_forward_only():
    a = meta((M, K)).requires_grad_()
    d = dgt.gemm(a, meta((N, K)))
    with pytest.raises(RuntimeError, match="no autograd formula"):
        d.sum().backward()


def test_linear_from_linear_shares_storage():
    for dtype, bias in ((torch.bfloat16, True), (torch.float16, False)):
        ref = torch.nn.Linear(K, N, bias=bias, dtype=dtype)
        fast = dgt.Linear.from_linear(ref)
        assert fast.weight is ref.weight and fast.weight.data_ptr() == ref.weight.data_ptr()
        if bias:
            assert fast.bias is ref.bias
        else:
            assert fast.bias is None
        assert (fast.in_features, fast.out_features) == (K, N)
        assert list(fast.state_dict()) == list(ref.state_dict())
        with torch.no_grad():
            ref.weight[0, 0] = 3.0   # a write through nn.Linear shows through ours
        assert fast.weight[0, 0].item() == 3.0


def test_linear_constructor_matches_nn_linear():
    fast = dgt.Linear(K, N, device="meta", dtype=torch.float16)
    assert fast.weight.shape == (N, K) and fast.weight.dtype == torch.float16 and fast.bias.shape == (N,)
    no_bias = dgt.Linear(K, N, bias=False)
    assert no_bias.bias is None and no_bias.weight.dtype == torch.bfloat16
    bound = 1 / K ** 0.5   # nn.Linear's initialisation: uniform within 1/sqrt(in_features)
    assert 0 < float(no_bias.weight.detach().float().abs().max()) <= bound * 1.01
    ref = torch.nn.Linear(K, N, dtype=torch.bfloat16)
    assert dgt.Linear(K, N).load_state_dict(ref.state_dict()) is not None   # same keys and shapes


def test_linear_errors():
    with pytest.raises(TypeError, match="bfloat16 or torch.float16 weights, got torch.float32"):
        dgt.Linear(K, N, dtype=torch.float32)
    with pytest.raises(TypeError, match="got torch.float32"):
        dgt.Linear.from_linear(torch.nn.Linear(K, N))
    with pytest.raises(TypeError, match="takes a torch.nn.Linear"):
        dgt.Linear.from_linear(torch.nn.Conv1d(K, N, 1))
    with pytest.raises(ValueError, match="quantizes the weight on the GPU"):   # FP8 needs CUDA to quantize
        dgt.Linear.from_linear(torch.nn.Linear(K, N, dtype=torch.bfloat16), weight_format="fp8_block")
    with pytest.raises(ValueError, match="weight_format='int4'"):
        dgt.Linear(K, N, weight_format="int4")


def test_overlapping_rows_are_copied_not_refused():
    """An expanded vector (row stride 0) or a sliding window (unfold) is valid input nn.Linear reads; the kernels
    need rows apart, so such inputs are copied (they were refused: "rows overlap", review)."""
    from deepgemm_jit.torch import _k_contiguous

    row = torch.randn(K)
    for t in (row.expand(8, K), torch.randn(K + 7).unfold(0, K, 1), row.expand(2, 4, K).reshape(-1, K)):
        got = _k_contiguous(t)
        assert got.stride() == (K, 1) and torch.equal(got, t)
    one = torch.randn(1).expand(8, 1)   # one column, row stride 0 (Linear(1, N) on an expanded input)
    assert _k_contiguous(one).stride() == (1, 1)
    plain = torch.randn(8, K)
    assert _k_contiguous(plain) is plain


def test_bf16_linear_names_x_for_a_wrong_width():
    """A wrong input width is x's fault (it was reported against the weight, as gemm's b)."""
    lin = dgt.Linear(K, N, device="meta", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"x has shape \(2, 100\); this Linear takes \(\.\.\., {K}\)"):
        lin(meta((2, 100)))


def test_linear_compiles_fullgraph_in_grad_mode():
    """torch.compile(fullgraph=True) of a swapped Linear in grad mode: the backward-refusing hook cannot be traced,
    so under compile it is not registered (the bias is detached instead: no silent bias-only training). This holds
    for the eager backend; AOTAutograd backends trace a backward the ops do not have, so those compile under
    no_grad (the docstring says so), which is checked too."""
    lin = dgt.Linear(K, N, device="meta", dtype=torch.bfloat16)
    y = torch.compile(lin, fullgraph=True, backend="eager")(meta((3, K)))
    assert y.shape == (3, N) and y.dtype == torch.bfloat16
    with torch.no_grad():
        y = torch.compile(lin, fullgraph=True, backend="aot_eager")(meta((3, K)))
    assert y.shape == (3, N)


class _Tree(torch.nn.Module):
    def __init__(self, dtype=torch.bfloat16):
        super().__init__()
        self.q = torch.nn.Linear(8, 8, dtype=dtype)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 16, dtype=dtype), torch.nn.SiLU(),
                                       torch.nn.Linear(16, 8, bias=False, dtype=dtype))
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8, dtype=torch.float16) for _ in range(2)])
        self.head = torch.nn.Linear(8, 4)   # float32: stays with torch
        self.tied = self.q                  # the same Linear under a second name


def test_swap_linears_counts_and_shares():
    tree = _Tree()
    assert dgt.swap_linears(tree) == 0, "the default predicate takes only CUDA Linears"
    q_weight = tree.q.weight
    names = []
    n = dgt.swap_linears(tree, lambda name, lin: names.append(name) or True)
    assert n == 5, names
    assert names == ["q", "mlp.0", "mlp.2", "layers.0", "layers.1"]
    assert isinstance(tree.q, dgt.Linear) and tree.tied is tree.q and tree.q.weight is q_weight
    assert isinstance(tree.mlp[0], dgt.Linear) and isinstance(tree.mlp[1], torch.nn.SiLU)
    assert all(isinstance(layer, dgt.Linear) for layer in tree.layers)
    assert type(tree.head) is torch.nn.Linear
    assert dgt.swap_linears(tree, lambda name, lin: True) == 0, "a second pass finds nothing left to swap"


def test_swap_linears_predicate_filters():
    tree = _Tree()
    assert dgt.swap_linears(tree, lambda name, lin: name.startswith("mlp.")) == 2
    assert isinstance(tree.mlp[2], dgt.Linear) and type(tree.q) is torch.nn.Linear
    assert dgt.swap_linears(torch.nn.Linear(8, 8, dtype=torch.bfloat16), lambda name, lin: True) == 0


# -- FP8: the quantize and gemm_fp8 ops -----------------------------------------------------------------------------
FP8 = torch.float8_e4m3fn
FORMATS = ["fp8_block", "fp8_row", "fp8_tensor"]
SCALING = {"fp8_block": "block", "fp8_row": "row", "fp8_tensor": "tensor"}
# weight_format -> (granularity of the weight, of the activations) in deepgemm_jit.quantize's words
GRANULARITY = {"fp8_block": ("block128", "group128"), "fp8_row": ("row", "row"), "fp8_tensor": ("tensor", "tensor")}


def test_fp8_schemas():
    assert str(torch.ops.deepgemm_jit.quantize.default._schema) == \
        'deepgemm_jit::quantize(Tensor x, str dtype="fp8", str granularity="group128") -> (Tensor, Tensor)'
    assert str(torch.ops.deepgemm_jit.gemm_fp8.default._schema) == \
        ('deepgemm_jit::gemm_fp8(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, str scaling="block", '
         'str? out_dtype=None) -> Tensor')


# (M, K) -> scales by granularity, worked by hand: ceil(1000/128) = 8, ceil(300/128) = 3
@pytest.mark.parametrize("shape,granularity,scales", [
    ((300, 1000), "tensor", (1,)), ((300, 1000), "row", (300,)), ((300, 1000), "group128", (300, 8)),
    ((300, 1000), "block128", (3, 8)), ((1, 128), "group128", (1, 1)), ((129, 129), "block128", (2, 2)),
    ((0, 1000), "group128", (0, 8)), ((0, 7168), "block128", (0, 56)), ((0, 40), "tensor", (1,)),
])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quantize_fake_shapes(shape, granularity, scales, x_dtype):
    q, s = dgt.quantize(meta(shape, x_dtype), "fp8", granularity)
    case = f"{shape=} {granularity=} {x_dtype=}"
    assert q.device.type == "meta" and s.device.type == "meta", case
    assert (tuple(q.shape), q.dtype) == (shape, FP8), f"{case}: q {tuple(q.shape)} {q.dtype}"
    assert (tuple(s.shape), s.dtype) == (scales, torch.float32), f"{case}: scales {tuple(s.shape)} {s.dtype}"
    assert q.is_contiguous(), case
    if granularity == "group128" and shape[0] > 0:  # M-major, the real op's layout: (1, round_up(M, 4)) strides
        assert s.stride() == (1, -(-shape[0] // 4) * 4), f"{case}: scales strides {s.stride()}"
    else:
        assert s.is_contiguous(), case


@pytest.mark.parametrize("dtype,want", [("fp8", FP8), ("fp8_e4m3", FP8), ("fp8_e5m2", torch.float8_e5m2),
                                        ("int8", torch.int8)])
def test_quantize_fake_dtypes(dtype, want):
    q, s = dgt.quantize(meta((5, 300)), dtype, "row")
    assert q.dtype == want and tuple(s.shape) == (5,), f"{dtype=}: {q.dtype} {tuple(s.shape)}"


@pytest.mark.parametrize("x,kwargs,error,match", [
    (meta((5, 40), torch.float64), {}, TypeError, "x has dtype torch.float64"),
    (meta((2, 5, 40)), {}, ValueError, r"x must be 2-D \(M, K\), got shape \(2, 5, 40\)"),
    (meta((5, 0)), {}, ValueError, "K >= 1"),
    (meta((5, 40)), {"granularity": "block"}, ValueError, "granularity='block' is not supported"),
    (meta((5, 40)), {"dtype": "int8", "granularity": "group128"}, ValueError, "not supported for int8"),
    (meta((5, 40)), {"dtype": "fp4"}, ValueError, "dtype='fp4' is not supported"),
])
def test_quantize_fake_errors(x, kwargs, error, match):
    with pytest.raises(error, match=match):
        dgt.quantize(x, **kwargs)


def fp8_operands(m, n, k, scaling, device="meta", a_dtype=FP8, b_dtype=FP8):
    """FP8 a, b and scales in the shapes GemmSpec (the GEMM's own contract) gives for the scaling."""
    shape_a, shape_b = GemmSpec.create(n, k, dtype="fp8", scaling=scaling).scale_shapes(m)
    return (torch.empty((m, k), device=device, dtype=a_dtype), torch.empty((n, k), device=device, dtype=b_dtype),
            torch.empty(shape_a, device=device), torch.empty(shape_b, device=device))


@pytest.mark.parametrize("scaling", ["block", "row", "tensor"])
@pytest.mark.parametrize("m,n,k", [(37, 24, 40), (1, 2112, 7168), (300, 300, 1000), (0, 136, 256)])
@pytest.mark.parametrize("out_dtype,want", [(None, torch.bfloat16), ("bf16", torch.bfloat16),
                                            ("fp16", torch.float16), ("fp32", torch.float32)])
def test_gemm_fp8_fake_shapes_and_dtypes(scaling, m, n, k, out_dtype, want):
    d = dgt.gemm_fp8(*fp8_operands(m, n, k, scaling), scaling, out_dtype)
    case = f"{scaling=} {m=} {n=} {k=} {out_dtype=}"
    assert d.device.type == "meta", case
    assert (tuple(d.shape), d.dtype) == ((m, n), want), f"{case}: {tuple(d.shape)} {d.dtype}"
    assert d.is_contiguous(), case


def test_gemm_fp8_fake_mixed_formats():
    for a_dtype, b_dtype in ((torch.float8_e5m2, FP8), (FP8, torch.float8_e5m2)):
        d = dgt.gemm_fp8(*fp8_operands(37, 24, 40, "block", a_dtype=a_dtype, b_dtype=b_dtype))
        assert tuple(d.shape) == (37, 24) and d.dtype == torch.bfloat16, f"{a_dtype} x {b_dtype}"


def _fp8_case(m=M, n=N, k=K, scaling="block", **replace):
    a, b, sa, sb = fp8_operands(m, n, k, scaling)
    args = {"a": a, "b": b, "scale_a": sa, "scale_b": sb, "scaling": scaling}
    args.update(replace)
    return args


@pytest.mark.parametrize("args,error,match", [
    (_fp8_case(a=meta((M, K))), TypeError, "a has dtype torch.bfloat16; pass torch.float8_e4m3fn"),
    (_fp8_case(b=meta((N, K), torch.int8)), TypeError, "b has dtype torch.int8"),
    (_fp8_case(a=meta((2, M, K), FP8)), ValueError, r"a must be 2-D, got shape \(2, 37, 40\)"),
    (_fp8_case(b=meta((N, K + 1), FP8)), ValueError, r"b has shape \(24, 41\); it must be \(N, K\) with K=40"),
    (_fp8_case(k=K, scaling="block", scale_a=meta((M,), torch.float32)), ValueError,
     r"scale_a has shape \(37,\); scaling='block' wants \(37, 1\)"),
    (_fp8_case(scaling="row", scale_b=meta((1,), torch.float32)), ValueError,
     r"scale_b has shape \(1,\); scaling='row' wants \(24,\)"),
    (_fp8_case(scaling="tensor", scale_a=meta((1,), torch.float16)), TypeError, "scale_a has dtype torch.float16"),
    (dict(_fp8_case(), scaling="group"), ValueError, "scaling='group' is not supported"),
    (_fp8_case(out_dtype="int32"), ValueError, "out_dtype='int32' is not supported"),
    (_fp8_case(scale_b=torch.empty((1, 1))), ValueError, "scale_b is on cpu but a is on meta"),
])
def test_gemm_fp8_fake_errors(args, error, match):
    with pytest.raises(error, match=match):
        dgt.gemm_fp8(**args)


def test_fp8_real_impls_refuse_cpu_tensors():
    with pytest.raises(ValueError, match="deepgemm_jit::quantize runs on CUDA tensors; x is on cpu"):
        dgt.quantize(torch.zeros((M, K), dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="deepgemm_jit::gemm_fp8 runs on CUDA tensors; a is on cpu"):
        dgt.gemm_fp8(*fp8_operands(M, N, K, "row", device="cpu"), "row")


@pytest.mark.parametrize("args", [
    (meta((37, 1000)), "fp8", "group128"), (meta((300, 256), torch.float16), "fp8", "block128"),
    (meta((5, 40), torch.float32), "fp8_e5m2", "tensor"), (meta((7, 130)), "int8", "row")])
def test_quantize_op_passes_opcheck_on_meta(args):
    """Schema, fake vs meta kernel, AOT dispatch (static and dynamic); the CUDA run is in the GPU tests."""
    torch.library.opcheck(torch.ops.deepgemm_jit.quantize.default, args)


@pytest.mark.parametrize("scaling,out_dtype", [("block", None), ("row", "fp16"), ("tensor", "fp32")])
def test_gemm_fp8_op_passes_opcheck_on_meta(scaling, out_dtype):
    torch.library.opcheck(torch.ops.deepgemm_jit.gemm_fp8.default,
                          fp8_operands(37, 300, 1000, scaling) + (scaling, out_dtype))


# -- FP8 Linear -------------------------------------------------------------------------------------------------------
def quantized_weight(n, k, weight_format, seed=0):
    """(w float32, q float8_e4m3fn, scales float32) on the CPU, quantized by the NumPy float64 reference."""
    w = (np.random.default_rng(seed).standard_normal((n, k)) * 0.05).astype(np.float32)
    q, s = reference.quantize_reference(w, "fp8", GRANULARITY[weight_format][0])
    return w, torch.from_numpy(q).view(FP8), torch.from_numpy(np.ascontiguousarray(s))


def fp8_bits(t):
    return t.view(torch.uint8).numpy()


@pytest.mark.parametrize("weight_format", FORMATS)
def test_fp8_linear_constructor(weight_format):
    n, k = 300, 1000
    lin = dgt.Linear(k, n, device="meta", weight_format=weight_format)
    want_scale = {"fp8_block": (3, 8), "fp8_row": (300,), "fp8_tensor": (1,)}[weight_format]
    buffers, params = dict(lin.named_buffers()), dict(lin.named_parameters())
    assert list(buffers) == ["weight", "weight_scale"] and list(params) == ["bias"], (buffers, params)
    assert (tuple(lin.weight.shape), lin.weight.dtype) == ((n, k), FP8)
    assert (tuple(lin.weight_scale.shape), lin.weight_scale.dtype) == (want_scale, torch.float32)
    assert lin.bias.dtype == torch.bfloat16 and lin.out_dtype == "bf16"
    assert list(lin.state_dict()) == ["bias", "weight", "weight_scale"]   # parameters, then buffers
    assert f"weight_format={weight_format!r}, out_dtype='bf16'" in repr(lin)
    no_bias = dgt.Linear(k, n, bias=False, dtype=torch.float16, weight_format=weight_format.upper())
    assert no_bias.bias is None and no_bias.out_dtype == "fp16" and no_bias.weight_format == weight_format
    assert not no_bias.weight.float().any() and bool((no_bias.weight_scale == 1).all()), "zero weight, unit scales"
    assert dgt.Linear(k, n, dtype=torch.float32, weight_format=weight_format).out_dtype == "fp32"
    with pytest.raises(TypeError, match="an FP8 Linear writes torch.bfloat16, float16 or float32"):
        dgt.Linear(k, n, dtype=torch.int8, weight_format=weight_format)


@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("x_shape", [(2, 7, 1000), (1, 1000), (1000,), (3, 5, 1000), (0, 1000), (2, 0, 1000)])
def test_fp8_linear_forward_on_meta(weight_format, x_shape):
    """The whole forward (flatten, quantize, gemm_fp8, bias, reshape) through the fake impls."""
    lin = dgt.Linear(1000, 300, device="meta", weight_format=weight_format)
    for x_dtype in (torch.bfloat16, torch.float16, torch.float32):
        y = lin(meta(x_shape, x_dtype))
        case = f"{weight_format} x {x_shape} {x_dtype}"
        assert (tuple(y.shape), y.dtype) == (x_shape[:-1] + (300,), torch.bfloat16), \
            f"{case}: {tuple(y.shape)} {y.dtype}"
    with pytest.raises(ValueError, match=r"x has shape \(2, 999\); this Linear takes \(..., 1000\)"):
        lin(meta((2, 999)))


@pytest.mark.parametrize("weight_format", FORMATS)
def test_fp8_linear_forward_in_fake_tensor_mode(weight_format):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        lin = dgt.Linear(1000, 2112, dtype=torch.float16, weight_format=weight_format)
        y = lin(torch.empty((3, 5, 1000), dtype=torch.bfloat16))
    assert isinstance(y, FakeTensor) and tuple(y.shape) == (3, 5, 2112) and y.dtype == torch.float16, \
        f"{type(y).__name__} {tuple(y.shape)} {y.dtype}"


@pytest.mark.parametrize("scaling", ["block", "row", "tensor", None])
@pytest.mark.parametrize("weight_dtype,out_dtype,want_out", [
    (torch.bfloat16, None, "bf16"), (torch.float16, None, "fp16"), (torch.float32, None, "fp32"),
    (torch.float16, "bf16", "bf16"), (torch.bfloat16, "fp32", "fp32")])
def test_fp8_from_linear_on_meta(scaling, weight_dtype, out_dtype, want_out):
    """from_linear's quantization path, with the quantize op's meta (fake) kernel standing in for the GPU."""
    ref = torch.nn.Linear(1000, 300, bias=True, device="meta", dtype=weight_dtype)
    lin = dgt.Linear.from_linear(ref, dtype="fp8", scaling=scaling, out_dtype=out_dtype)
    weight_format = f"fp8_{scaling or 'block'}"
    want_scale = {"fp8_block": (3, 8), "fp8_row": (300,), "fp8_tensor": (1,)}[weight_format]
    case = f"{scaling=} {weight_dtype=} {out_dtype=}"
    assert lin.weight_format == weight_format and lin.out_dtype == want_out, case
    assert lin.weight.dtype == FP8 and tuple(lin.weight.shape) == (300, 1000) and lin.weight.device.type == "meta"
    assert tuple(lin.weight_scale.shape) == want_scale and lin.weight_scale.dtype == torch.float32, case
    assert lin.bias is ref.bias, f"{case}: the bias Parameter is shared, not copied"
    assert (lin.in_features, lin.out_features) == (1000, 300)
    y = lin(meta((2, 7, 1000)))
    want_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[want_out]
    assert tuple(y.shape) == (2, 7, 300) and y.dtype == want_dtype, case
    same = dgt.Linear.from_linear(ref, weight_format)   # the other spelling of the same choice
    assert same.weight_format == weight_format and tuple(same.weight_scale.shape) == want_scale


@pytest.mark.parametrize("kwargs,error,match", [
    ({"weight_format": "fp8_block", "dtype": "fp8"}, TypeError, "weight_format or dtype/scaling, not both"),
    ({"scaling": "block"}, ValueError, "scaling='block' applies to dtype='fp8'"),
    ({"dtype": "int8"}, ValueError, "dtype='int8' is not supported; choose 'fp8'"),
    ({"dtype": "fp8_e5m2"}, ValueError, "dtype='fp8_e5m2' is not supported"),
    ({"dtype": "fp8", "scaling": "group128"}, ValueError, "scaling='group128' is not supported for dtype='fp8'"),
    ({"out_dtype": "fp32"}, ValueError, "out_dtype='fp32' applies to FP8 Linears"),
    ({"dtype": "fp8", "out_dtype": "int32"}, ValueError, "out_dtype='int32' is not supported"),
    ({"weight_format": "fp8_group"}, ValueError, "weight_format='fp8_group' is not supported"),
])
def test_fp8_from_linear_errors(kwargs, error, match):
    ref = torch.nn.Linear(K, N, device="meta", dtype=torch.bfloat16)
    with pytest.raises(error, match=match):
        dgt.Linear.from_linear(ref, **kwargs)


def test_fp8_from_linear_refuses_cpu_and_other_dtypes():
    with pytest.raises(ValueError, match="move the Linear to a CUDA device first"):
        dgt.Linear.from_linear(torch.nn.Linear(K, N, dtype=torch.bfloat16), dtype="fp8")
    with pytest.raises(TypeError, match="quantizes torch.bfloat16, float16 or float32 weights, got torch.float64"):
        dgt.Linear.from_linear(torch.nn.Linear(K, N, device="meta", dtype=torch.float64), dtype="fp8")


@pytest.mark.parametrize("weight_format", FORMATS)
def test_fp8_state_dict_round_trip(weight_format):
    """Quantized buffers survive state_dict -> torch.save -> torch.load -> load_state_dict bit for bit, and
    decode to the weight they came from."""
    n, k = 300, 1000
    w, q, s = quantized_weight(n, k, weight_format)
    bias = torch.randn(n, dtype=torch.bfloat16)
    lin = dgt.Linear.from_quantized(q, s, bias, scaling=SCALING[weight_format])
    assert lin.weight is q and lin.weight_scale is s, "from_quantized takes the tensors as they are"
    state = lin.state_dict()
    assert {key: (v.dtype, tuple(v.shape)) for key, v in state.items()} == {
        "weight": (FP8, (n, k)), "weight_scale": (torch.float32, tuple(s.shape)), "bias": (torch.bfloat16, (n,))}
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    fresh = dgt.Linear(k, n, weight_format=weight_format)
    fresh.load_state_dict(torch.load(buf))
    assert (fp8_bits(fresh.weight) == fp8_bits(q)).all(), f"{weight_format}: weight bits changed"
    assert torch.equal(fresh.weight_scale, s) and torch.equal(fresh.bias, bias), weight_format
    decoded = reference.dequantize_reference(fp8_bits(fresh.weight), fresh.weight_scale.numpy(), "fp8",
                                             GRANULARITY[weight_format][0])
    err = np.linalg.norm(decoded - w) / np.linalg.norm(w)
    assert 1e-3 < err < 0.05, f"{weight_format}: dequantized weight vs the original, rel. error {err:.2e}"


def test_fp8_load_refuses_16_bit_weights():
    lin = dgt.Linear(K, N, weight_format="fp8_block")
    before = fp8_bits(lin.weight).copy()
    bf16_state = torch.nn.Linear(K, N, dtype=torch.bfloat16).state_dict()
    with pytest.raises(RuntimeError, match="weight has dtype torch.bfloat16, but this fp8_block Linear loads"):
        lin.load_state_dict(bf16_state, strict=False)
    assert (fp8_bits(lin.weight) == before).all(), "a refused load changed the weight"


@pytest.mark.parametrize("weight_format", FORMATS)
def test_fp8_to_moves_but_never_casts_quantized_buffers(weight_format):
    _, q, s = quantized_weight(136, 256, weight_format, seed=1)
    lin = dgt.Linear.from_quantized(q, s, torch.randn(136, dtype=torch.bfloat16), scaling=SCALING[weight_format])
    for cast in (lambda m: m.to(torch.float16), lambda m: m.float(), lambda m: m.bfloat16()):
        cast(lin)
        assert lin.weight.dtype == FP8 and (fp8_bits(lin.weight) == fp8_bits(q)).all(), weight_format
        assert lin.weight_scale.dtype == torch.float32 and torch.equal(lin.weight_scale, s), weight_format
    assert lin.bias.dtype == torch.bfloat16, "the bias is cast like any parameter"
    lin.to("meta", torch.float16)
    assert {t.device.type for t in (lin.weight, lin.weight_scale, lin.bias)} == {"meta"}
    assert (lin.weight.dtype, lin.weight_scale.dtype, lin.bias.dtype) == (FP8, torch.float32, torch.float16)


@pytest.mark.parametrize("args,kwargs,error,match", [
    ((torch.zeros((N, K), dtype=torch.bfloat16), torch.ones(1)), {"scaling": "tensor"}, TypeError,
     "weight must be a 2-D torch.float8_e4m3fn tensor"),
    ((torch.zeros((N, K), dtype=FP8), torch.ones(1)), {"scaling": "block"}, ValueError,
     r"weight_scale has shape \(1,\); scaling='block' for a \(24, 40\) weight wants \(1, 1\)"),
    ((torch.zeros((N, K), dtype=FP8), torch.ones(N)), {"scaling": "tensor"}, ValueError, r"wants \(1,\)"),
    ((torch.zeros((N, K), dtype=FP8), torch.ones(N, dtype=torch.float16)), {"scaling": "row"}, TypeError,
     "weight_scale must be a torch.float32 tensor"),
    ((torch.zeros((N, K), dtype=FP8), torch.ones(N), torch.zeros(N + 1)), {"scaling": "row"}, ValueError,
     r"bias must be a floating-point \(24,\) tensor"),
    ((torch.zeros((N, K), dtype=FP8), torch.ones(N, device="meta")), {"scaling": "row"}, ValueError,
     "weight_scale is on meta but weight is on cpu"),
    ((torch.zeros((N, K), dtype=FP8), torch.ones(N)), {"scaling": "row", "out_dtype": "fp8"}, ValueError,
     "out_dtype='fp8' is not supported"),
])
def test_fp8_from_quantized_errors(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        dgt.Linear.from_quantized(*args, **kwargs)


class _Fp8Mlp(torch.nn.Module):
    def __init__(self, weight_format, device="meta", hidden=256, ffn=688):
        super().__init__()
        self.up = dgt.Linear(hidden, ffn, device=device, weight_format=weight_format)
        self.down = dgt.Linear(ffn, hidden, bias=False, device=device, weight_format=weight_format)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


@pytest.mark.parametrize("weight_format", FORMATS)
def test_fp8_linears_trace_in_one_graph(weight_format):
    """dynamo sees both ops of both Linears in one graph (fullgraph=True), on meta tensors; aot_eager
    (functionalization, fake tensors) with a dynamic M runs them through the fake impls."""
    net = _Fp8Mlp(weight_format)
    targets = []

    def recording_backend(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        y = torch.compile(net, backend=recording_backend, fullgraph=True)(meta((2, 37, 256)))
    ours = [t for t in targets if "deepgemm_jit" in t]
    assert ours == ["deepgemm_jit.quantize.default", "deepgemm_jit.gemm_fp8.default"] * 2, targets
    assert tuple(y.shape) == (2, 37, 256) and y.dtype == torch.bfloat16

    torch._dynamo.reset()
    compiled = torch.compile(net, backend="aot_eager", fullgraph=True, dynamic=True)
    with torch.no_grad():
        for shape in ((2, 37, 256), (5, 129, 256), (1, 256)):
            y = compiled(meta(shape))
            assert tuple(y.shape) == shape and y.dtype == torch.bfloat16, f"{weight_format} {shape}: {tuple(y.shape)}"


def test_fp8_export_traces_the_ops():
    """torch.export of a model with an FP8 Linear holding real (CPU) quantized buffers: fake tensors only."""
    _, q, s = quantized_weight(N, K, "fp8_block")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = dgt.Linear.from_quantized(q, s, torch.zeros(N, dtype=torch.bfloat16), scaling="block")

        def forward(self, x):
            return torch.nn.functional.silu(self.proj(x))

    program = torch.export.export(Model(), (torch.zeros((2, 7, K), dtype=torch.bfloat16),))
    targets = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert torch.ops.deepgemm_jit.quantize.default in targets and torch.ops.deepgemm_jit.gemm_fp8.default in targets, \
        targets
    out = [node for node in program.graph.nodes if node.op == "output"][0].args[0][0]
    assert tuple(out.meta["val"].shape) == (2, 7, N) and out.meta["val"].dtype == torch.bfloat16
    assert set(program.state_dict) >= {"proj.weight", "proj.weight_scale", "proj.bias"}, list(program.state_dict)


def test_swap_linears_fp8():
    tree = _Tree().to("meta")
    q_bias = tree.q.bias
    n = dgt.swap_linears(tree, lambda name, lin: True, dtype="fp8", scaling="row")
    assert n == 5
    swapped = [tree.q, tree.mlp[0], tree.mlp[2], tree.layers[0], tree.layers[1]]
    assert all(isinstance(m, dgt.Linear) and m.weight_format == "fp8_row" and m.weight.dtype == FP8
               for m in swapped), swapped
    assert tree.tied is tree.q and tree.q.bias is q_bias and tree.mlp[2].bias is None
    assert [m.out_dtype for m in swapped] == ["bf16", "bf16", "bf16", "fp16", "fp16"], "out dtype from each weight"
    assert type(tree.head) is torch.nn.Linear
    assert tuple(tree.mlp[0].weight_scale.shape) == (16,)
    tree2 = _Tree().to("meta")
    assert dgt.swap_linears(tree2, lambda name, lin: True, weight_format="fp8_tensor", out_dtype="fp32") == 5
    assert {tree2.q.out_dtype, tree2.layers[0].out_dtype} == {"fp32"}


def test_swap_linears_fp8_error_leaves_module_unchanged():
    tree = _Tree()   # on the CPU: from_linear cannot quantize there
    with pytest.raises(ValueError, match="move the Linear to a CUDA device first"):
        dgt.swap_linears(tree, lambda name, lin: True, dtype="fp8")
    assert all(type(m) is torch.nn.Linear for m in (tree.q, tree.mlp[0], tree.mlp[2], tree.layers[0], tree.head))
    with pytest.raises(ValueError, match="scaling='row' applies to dtype='fp8'"):
        dgt.swap_linears(tree, lambda name, lin: True, scaling="row")
    assert type(tree.q) is torch.nn.Linear


# -- grouped GEMMs (mixture of experts) --------------------------------------------------------------------------
def test_grouped_fakes_shapes_and_dtypes():
    offs, cnt = meta((4,), torch.int32), meta((4,), torch.int32)
    d = dgt.grouped_mm(meta((300, K)), meta((4, N, K)), offs=offs)
    assert d.shape == (300, N) and d.dtype == torch.bfloat16 and d.device.type == "meta"
    d = dgt.grouped_mm(meta((4, 64, K), torch.float16), meta((4, N, K), torch.float16), masked_m=cnt, out_dtype="fp32")
    assert d.shape == (4, 64, N) and d.dtype == torch.float32
    d = dgt.grouped_mm(meta((300, K)), meta((4, N, K)), offs=offs, out_dtype="FP16")  # spelled as gemm takes it
    assert d.dtype == torch.float16
    f8 = torch.float8_e4m3fn
    d = dgt.grouped_mm_fp8(meta((300, K), f8), meta((4, N, K), f8), meta((300, 1), torch.float32),
                           meta((4, 1, 1), torch.float32), offs=offs)
    assert d.shape == (300, N) and d.dtype == torch.bfloat16


@pytest.mark.parametrize("a,b,kwargs,error,match", [
    (meta((300, K)), meta((4, N, K)), {}, ValueError, "exactly one of offs"),
    (meta((300, K)), meta((N, K)), {"offs": meta((4,), torch.int32)}, ValueError, "b must be 3-D"),
    (meta((4, 64, K)), meta((4, N, K)), {"offs": meta((4,), torch.int32)}, ValueError, "a must be 2-D"),
    (meta((300, K)), meta((4, N, K)), {"masked_m": meta((4,), torch.int32)}, ValueError, "a must be 3-D"),
    (meta((300, K + 8)), meta((4, N, K)), {"offs": meta((4,), torch.int32)}, ValueError, "a has K=48"),
    (meta((300, K), torch.float32), meta((4, N, K), torch.float32), {"offs": meta((4,), torch.int32)}, TypeError,
     "must share one dtype"),
    (meta((300, K)), meta((4, N, K)), {"offs": meta((4,), torch.int32), "out_dtype": "fp8"}, ValueError,
     "out_dtype='fp8'"),
    (meta((300, K)), meta((4, N, K)), {"offs": meta((4,), torch.int32), "out_dtype": ""}, ValueError,
     "out_dtype=''"),
    (meta((3, 64, K)), meta((4, N, K)), {"masked_m": meta((4,), torch.int32)}, ValueError, "a has 3 groups"),
])
def test_grouped_fake_errors_name_the_argument(a, b, kwargs, error, match):
    with pytest.raises(error, match=match):
        dgt.grouped_mm(a, b, **kwargs)


def test_grouped_ops_trace_under_export():
    class MoE(torch.nn.Module):
        def forward(self, x, w, offs):
            return dgt.grouped_mm(x, w, offs=offs)

    ep = torch.export.export(MoE(), (meta((300, K)), meta((4, N, K)), meta((4,), torch.int32)))
    nodes = [n for n in ep.graph.nodes if n.op == "call_function" and "grouped_mm" in str(n.target)]
    assert len(nodes) == 1 and tuple(nodes[0].meta["val"].shape) == (300, N)


def test_linear_after_float_is_torchs_linear(monkeypatch):
    """.float() on a 16-bit Linear: the fp32 weight would run the TF32 op (a looser contract than nn.Linear's
    FP32); forward is torch's own linear then, as swap_linears leaves fp32 Linears alone."""
    lin = dgt.Linear(K, N, device="meta", dtype=torch.float16)
    assert lin(meta((M, K), torch.float16)).shape == (M, N)  # the op's fake
    lin.float()

    def no_op(*args, **kwargs):
        raise AssertionError("the deepgemm op ran for an fp32 weight")

    monkeypatch.setattr(dgt, "gemm", no_op)
    y = lin(meta((2, M, K), torch.float32))
    assert y.shape == (2, M, N) and y.dtype == torch.float32
