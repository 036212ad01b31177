"""deepgemm_jit.torch without a GPU: the op's fake implementation on meta tensors, tracing, Linear and
swap_linears bookkeeping, errors. Skipped cleanly where torch is not installed."""
import pytest

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
    with pytest.raises(NotImplementedError, match="issue 4"):
        dgt.Linear(K, N, weight_format="fp8_block")
    with pytest.raises(NotImplementedError, match="issue 4"):
        dgt.Linear.from_linear(torch.nn.Linear(K, N, dtype=torch.bfloat16), weight_format="fp8_block")
    with pytest.raises(ValueError, match="weight_format='int4'"):
        dgt.Linear(K, N, weight_format="int4")


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
