"""PyTorch on the GPU: zero-copy torch tensors, bit-for-bit agreement with the CuPy path, the custom op under
opcheck, a transformer block with its Linears swapped, CUDA-graph capture and torch.compile(fullgraph=True); the
FP8 ops and FP8 Linears (block, row, tensor) against float64 references of their dequantized operands.

Random inputs, float64 references, NaN-poisoned outputs; every message names its case. Skipped cleanly
without torch, without a GPU, or with a CPU-only torch.
"""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import deepgemm_jit as dg  # noqa: E402
from deepgemm_jit import buckets, dtypes, reference  # noqa: E402

pytestmark = pytest.mark.gpu

BOUND = 1e-2  # DESIGN.md's bound for 16-bit inputs (rel. Frobenius error vs float64); TF32 gets 5e-3
TORCH_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32, "fp32": torch.float32}
BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}
LAYOUTS = ("nt", "nn", "tn", "tt")


@pytest.fixture(autouse=True)
def torch_cuda():
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} was built without CUDA or sees no GPU")
    return pytest.importorskip("deepgemm_jit.torch")


def rand(shape, dtype, scale=1.0):
    return (torch.randn(shape, device="cuda", dtype=torch.float32) * scale).to(dtype)


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


def rel_err(d, ref):
    d, ref = d.double(), ref.double()
    return ((d - ref).norm() / ref.norm()).item()


def operand_shapes(layout, m, n, k):
    return ((m, k) if layout[0] == "n" else (k, m)), ((n, k) if layout[1] == "t" else (k, n))


def ref64(a, b, layout):
    a64, b64 = a.double(), b.double()
    return (a64 if layout[0] == "n" else a64.T) @ (b64.T if layout[1] == "t" else b64)


def to_cupy(t):
    """A CuPy view of a torch tensor (bfloat16 through an int16 view: DLPack exporters disagree on it; FP8 as
    its uint8 bit patterns, which is how deepgemm_jit.reference takes FP8)."""
    cupy = pytest.importorskip("cupy")
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return cupy.from_dlpack(t.view(torch.uint8))
    if t.dtype == torch.bfloat16:
        return cupy.from_dlpack(t.view(torch.int16)).view(dtypes.numpy_dtype("bf16"))
    return cupy.from_dlpack(t)


def bits_torch(t):
    return t.contiguous().view(BITS[t.dtype]).cpu().numpy()


def bits_cupy(x):
    cupy = pytest.importorskip("cupy")
    return cupy.asnumpy(x.view(np.int16 if x.dtype.itemsize == 2 else np.int32))


def assert_same_bits(got, want_bits, case):
    got_bits = bits_torch(got)
    assert got_bits.shape == want_bits.shape, f"{case}: shape {got_bits.shape} vs {want_bits.shape}"
    num_diff = int((got_bits != want_bits).sum())
    assert num_diff == 0, f"{case}: {num_diff} of {got_bits.size} elements differ from the CuPy path"


# -- zero copy -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "tf32"])
def test_gemm_call_torch_in_torch_out_zero_copy(dtype):
    cupy = pytest.importorskip("cupy")
    m, n, k = 200, 136, 264
    g = dg.build(m, n, k, dtype=dtype)
    t_in, t_out = TORCH_DTYPE[dtype], TORCH_DTYPE[g.spec.out_dtype]
    a, b = rand((m, k), t_in), rand((n, k), t_in)
    out = poisoned((m, n), t_out)
    g(a, b, out=out)   # warm-up: compile, load, plan
    torch.cuda.synchronize()
    case = f"Gemm({dtype}) on torch tensors"

    a.copy_(rand((m, k), t_in))          # same buffer, new values: the call must read a itself
    out.fill_(float("nan"))
    torch_before = torch.cuda.memory_allocated()
    cupy_before = cupy.get_default_memory_pool().used_bytes()
    result = g(a, b, out=out)
    torch.cuda.synchronize()
    assert isinstance(result, torch.Tensor), f"{case}: returned {type(result).__name__}, not a torch.Tensor"
    assert result.data_ptr() == out.data_ptr(), f"{case}: result does not share out's memory"
    assert result.shape == out.shape and result.dtype == t_out and result.device == out.device, case
    assert torch.cuda.memory_allocated() == torch_before, f"{case}: torch allocated during a call with out="
    assert cupy.get_default_memory_pool().used_bytes() == cupy_before, f"{case}: CuPy allocated with out="
    err = rel_err(out, ref64(a, b, "nt"))
    assert err <= BOUND, f"{case} with out=: {err=:.2e}"

    fresh = g(a, b)
    torch.cuda.synchronize()
    assert isinstance(fresh, torch.Tensor), f"{case} without out=: returned {type(fresh).__name__}"
    assert fresh.device == a.device and fresh.dtype == t_out and fresh.shape == (m, n), \
        f"{case} without out=: {fresh.device} {fresh.dtype} {tuple(fresh.shape)}"
    assert_same_bits(fresh, bits_torch(out), f"{case}: new output vs out=")


def test_op_allocates_only_its_output():
    dgt = pytest.importorskip("deepgemm_jit.torch")
    cupy = pytest.importorskip("cupy")
    a, w = rand((2, 37, 256), torch.bfloat16), rand((512, 256), torch.bfloat16)
    dgt.gemm(a, w)   # warm-up
    torch.cuda.synchronize()
    torch_before = torch.cuda.memory_allocated()
    cupy_before = cupy.get_default_memory_pool().used_bytes()
    d = dgt.gemm(a, w)
    torch.cuda.synchronize()
    out_bytes = d.numel() * d.element_size()
    grown = torch.cuda.memory_allocated() - torch_before
    assert out_bytes <= grown <= -(-out_bytes // 512) * 512, f"op grew torch memory by {grown} B, output is {out_bytes} B"
    assert cupy.get_default_memory_pool().used_bytes() == cupy_before, "the op allocated through CuPy"


# -- the same bits as the CuPy path ------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype,out_dtype", [("bf16", None), ("fp16", None), ("tf32", None), ("bf16", "fp32")])
def test_bitwise_equal_to_cupy_path(dtype, out_dtype, layout):
    dgt = pytest.importorskip("deepgemm_jit.torch")
    m, n, k = 300, 136, 264
    case = f"{dtype=} {out_dtype=} {layout=} {m=} {n=} {k=}"
    a_shape, b_shape = operand_shapes(layout, m, n, k)
    a, b = rand(a_shape, TORCH_DTYPE[dtype]), rand(b_shape, TORCH_DTYPE[dtype])
    ca, cb = to_cupy(a), to_cupy(b)
    assert ca.data.ptr == a.data_ptr() and cb.data.ptr == b.data_ptr(), f"{case}: CuPy views copied"

    want = dg.gemm(ca, cb, dtype=dtype, out_dtype=out_dtype, layout=layout)   # CuPy in, CuPy out
    torch.cuda.synchronize()
    want_bits = bits_cupy(want)
    d_op = dgt.gemm(a, b, layout=layout, out_dtype=out_dtype)                 # the custom op
    g = dg.build(m, n, k, dtype=dtype, out_dtype=out_dtype, layout=layout)
    d_call = g(a, b)                                                           # Gemm on torch tensors
    d_call_cupy = g(ca, cb)
    torch.cuda.synchronize()
    assert isinstance(d_op, torch.Tensor) and isinstance(d_call, torch.Tensor), case
    err = rel_err(d_op, ref64(a, b, layout))
    assert err <= (5e-3 if dtype == "tf32" else BOUND), f"{case} op vs float64: {err=:.2e}"
    assert_same_bits(d_op, want_bits, f"{case} torch op vs dg.gemm on CuPy views")
    # g was built for M=300, dg.gemm for M's bucket: the configs may differ, so compare g with itself.
    assert_same_bits(d_call, bits_cupy(d_call_cupy), f"{case} Gemm(torch) vs Gemm(CuPy), {g.config.tag}")


@pytest.mark.parametrize("a_shape,slicer", [((2, 37, 256), None), ((37, 256), None), ((256,), None),
                                            ((4, 37, 256), slice(None, None, 2)), ((0, 5, 256), None)])
def test_nt_leading_dims_match_flat_cupy(a_shape, slicer):
    dgt = pytest.importorskip("deepgemm_jit.torch")
    w = rand((520, 256), torch.bfloat16)
    a = rand(a_shape, torch.bfloat16)
    if slicer is not None:
        a = a[slicer]   # leading dims that cannot be viewed as one: the op reshapes with a copy
    case = f"a {tuple(a.shape)} stride {a.stride()}"
    d = dgt.gemm(a, w)
    assert tuple(d.shape) == tuple(a.shape[:-1]) + (520,), f"{case}: shape {tuple(d.shape)}"
    if a.numel() == 0:
        return
    flat = a.reshape(-1, 256).contiguous()
    want = dg.gemm(to_cupy(flat), to_cupy(w), dtype="bf16")
    torch.cuda.synchronize()
    assert_same_bits(d.reshape(-1, 520), bits_cupy(want), case)


@pytest.mark.parametrize("which", ["a.t()", "a[:, ::2]", "w.t()"])
def test_operands_strided_along_k_are_copied(which):
    """Operands without unit stride along their last dimension are copied by the op (nn.Linear takes them; the
    op raised the Gemm's unit-stride error, with CuPy's advice). Same bits as the contiguous call."""
    dgt = pytest.importorskip("deepgemm_jit.torch")
    a, w = rand((37, 256), torch.bfloat16), rand((520, 256), torch.bfloat16)
    if which == "a.t()":
        a = rand((256, 37), torch.bfloat16).t()
    elif which == "a[:, ::2]":
        a = rand((37, 512), torch.bfloat16)[:, ::2]
    else:
        w = rand((256, 520), torch.bfloat16).t()
    d = dgt.gemm(a, w)
    assert_same_bits(d, bits_torch(dgt.gemm(a.contiguous(), w.contiguous())), which)


def test_linear_in_grad_mode_and_after_float():
    """A swapped Linear with a bias runs in grad mode (the op returns a base tensor, which the bias is added to in
    place), and after .float() it is torch's linear (fp32 weights would otherwise run TF32)."""
    dgt = pytest.importorskip("deepgemm_jit.torch")
    ref = torch.nn.Linear(256, 520, dtype=torch.bfloat16, device="cuda")
    lin = dgt.Linear.from_linear(ref)
    x = rand((3, 37, 256), torch.bfloat16)
    y = lin(x)
    assert y.requires_grad and tuple(y.shape) == (3, 37, 520)
    with torch.no_grad():
        want = lin(x)
    assert_same_bits(y.detach(), bits_torch(want), "grad mode")
    with pytest.raises(RuntimeError, match="no backward"):  # the bias alone would be trained, silently
        y.float().sum().backward()
    assert ref.weight.grad is None and ref.bias.grad is None
    fp8 = dgt.Linear.from_linear(ref, dtype="fp8")
    with pytest.raises(RuntimeError, match="no backward"):
        fp8(x).float().sum().backward()
    assert ref.bias.grad is None
    lin.float()
    y32 = lin(x.float())
    assert y32.dtype == torch.float32
    want32 = torch.nn.functional.linear(x.float(), lin.weight, lin.bias).detach()
    assert_same_bits(y32.detach(), bits_torch(want32), ".float()")


def test_k_zero_is_an_empty_sum():
    """K = 0: zeros of the output shape, as torch.mm and nn.Linear(0, N) give (the fake already said that shape;
    the real op raised, building a Gemm of K = 0)."""
    dgt = pytest.importorskip("deepgemm_jit.torch")
    a, b = torch.empty((2, 37, 0), dtype=torch.bfloat16, device="cuda"), torch.empty((24, 0), dtype=torch.bfloat16,
                                                                                      device="cuda")
    y = dgt.gemm(a, b)
    assert tuple(y.shape) == (2, 37, 24) and bool((y == 0).all())
    lin = dgt.Linear.from_linear(torch.nn.Linear(0, 24, dtype=torch.bfloat16, device="cuda"))
    with torch.no_grad():
        lin.bias.copy_(rand((24,), torch.bfloat16))  # nn.Linear(0, N) initialises its bias to zeros
        assert bool((lin(a) == lin.bias).all())


def test_op_passes_opcheck():
    """torch's own checks of a custom op: schema (no aliasing, no mutation), fake vs real, AOT dispatch."""
    pytest.importorskip("deepgemm_jit.torch")
    for args in [(rand((74, 256), torch.bfloat16), rand((512, 256), torch.bfloat16), "nt", None),
                 (rand((2, 37, 256), torch.float16), rand((136, 256), torch.float16), "nt", "fp32"),
                 (rand((256, 74), torch.float16), rand((256, 136), torch.float16), "tn", None)]:
        case = f"a {tuple(args[0].shape)} {args[0].dtype} b {tuple(args[1].shape)} {args[2:]}"
        try:
            torch.library.opcheck(torch.ops.deepgemm_jit.gemm.default, args)
        except Exception as exc:  # report which case failed, with torch's message
            pytest.fail(f"opcheck {case}: {type(exc).__name__}: {exc}")


def test_op_runs_on_torch_current_stream():
    dgt = pytest.importorskip("deepgemm_jit.torch")
    w = rand((512, 256), torch.bfloat16)
    dgt.gemm(rand((1024, 256), torch.bfloat16), w)   # warm-up
    from streams import nan_target

    a = rand((1024, 256), torch.bfloat16)
    a_late = nan_target(a)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)              # keep the side stream busy (~tens of ms)
        a_late.copy_(a)                            # queued behind the sleep
        d = dgt.gemm(a_late, w)                    # must run after it, on `side`
    side.synchronize()
    err = rel_err(d, ref64(a, w, "nt"))
    assert err <= BOUND, f"op on a side stream read a before it was written: {err=:.2e}"



def test_linear_under_autocast_is_nn_linear():
    """Under torch.autocast, nn.Linear computes in the autocast dtype: float32 activations into a bf16 Linear were
    refused ("b has dtype torch.bfloat16 but a has torch.float32"), and a bf16 Linear under fp16 autocast returned
    bf16 (review)."""
    dgt = pytest.importorskip("deepgemm_jit.torch")
    lin = torch.nn.Linear(256, 512, dtype=torch.bfloat16, device="cuda")
    swapped = dgt.Linear.from_linear(lin)
    x = torch.randn(5, 256, device="cuda")   # float32
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cuda", dtype=dtype):
            want, got = lin(x), swapped(x)
        assert got.dtype == want.dtype == dtype, (got.dtype, want.dtype)
        assert rel_err(got, want) <= BOUND, dtype

# -- a transformer block with its Linears swapped -------------------------------------------------------------
class Block(torch.nn.Module):
    """Pre-norm attention (q/k/v/o projections, causal SDPA) + gated MLP (gate/up/down), no nn.MultiheadAttention."""

    def __init__(self, hidden=256, num_heads=4, ffn=688, dtype=torch.bfloat16, device="cuda"):
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        self.num_heads = num_heads
        self.norm1 = torch.nn.LayerNorm(hidden, **kw)
        self.norm2 = torch.nn.LayerNorm(hidden, **kw)
        self.q = torch.nn.Linear(hidden, hidden, bias=True, **kw)
        self.k = torch.nn.Linear(hidden, hidden, bias=True, **kw)
        self.v = torch.nn.Linear(hidden, hidden, bias=True, **kw)
        self.o = torch.nn.Linear(hidden, hidden, bias=False, **kw)
        self.gate = torch.nn.Linear(hidden, ffn, bias=False, **kw)
        self.up = torch.nn.Linear(hidden, ffn, bias=False, **kw)
        self.down = torch.nn.Linear(ffn, hidden, bias=True, **kw)

    def forward(self, x):
        batch, seq, hidden = x.shape

        def heads(t):
            return t.view(batch, seq, self.num_heads, hidden // self.num_heads).transpose(1, 2)

        y = self.norm1(x)
        att = torch.nn.functional.scaled_dot_product_attention(heads(self.q(y)), heads(self.k(y)),
                                                               heads(self.v(y)), is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(batch, seq, hidden))
        y = self.norm2(x)
        return x + self.down(torch.nn.functional.silu(self.gate(y)) * self.up(y))


def test_transformer_block_with_swapped_linears():
    dgt = pytest.importorskip("deepgemm_jit.torch")
    torch.manual_seed(0)
    block = Block()
    block64 = copy.deepcopy(block).double()
    x = rand((2, 37, 256), torch.bfloat16)
    with torch.inference_mode():
        want = block64(x.double())
        original = block(x)
        num_swapped = dgt.swap_linears(block)
        assert num_swapped == 7, f"swap_linears replaced {num_swapped} Linears, the block has 7"
        assert all(isinstance(getattr(block, name), dgt.Linear) for name in "qkvo") and \
            all(isinstance(getattr(block, name), dgt.Linear) for name in ("gate", "up", "down"))
        seen = []   # every swapped Linear, checked on the activations it really received
        hooks = [module.register_forward_hook(lambda mod, inp, out, name=name: seen.append((name, mod, inp[0], out)))
                 for name, module in block.named_modules() if isinstance(module, dgt.Linear)]
        swapped = block(x)
        for hook in hooks:
            hook.remove()
    torch.cuda.synchronize()
    assert sorted(name for name, *_ in seen) == sorted(["q", "k", "v", "o", "gate", "up", "down"]), seen
    for name, mod, inp, out in seen:
        ref = inp.double() @ mod.weight.double().T + (0 if mod.bias is None else mod.bias.double())
        err = rel_err(out, ref)
        assert out.dtype == torch.bfloat16 and out.shape == (2, 37, mod.out_features), f"Linear {name}"
        assert err <= BOUND, f"swapped Linear {name} ({tuple(inp.shape)} x {tuple(mod.weight.shape)}): {err=:.2e}"
    err_original, err_swapped = rel_err(original, want), rel_err(swapped, want)
    err_between = rel_err(swapped, original)
    msg = f"block 2x37x256 bf16: original {err_original:.2e}, swapped {err_swapped:.2e}, between {err_between:.2e}"
    assert torch.isfinite(swapped).all(), msg
    assert err_original <= BOUND and err_swapped <= BOUND and err_between <= BOUND, msg


# -- CUDA graphs ---------------------------------------------------------------------------------------------------
def _graph_cases(dgt):
    linear = dgt.Linear(256, 520, bias=True, device="cuda", dtype=torch.bfloat16)
    w_nn = rand((264, 136), torch.float16)
    w_tf32 = rand((136, 264), torch.float32)
    w_split = rand((2112, 7168), torch.bfloat16) / 7168 ** 0.5  # decode shape: a split-K kernel at M = 40

    def linear_ref(x):
        return x.double() @ linear.weight.double().T + linear.bias.double()

    return {
        "Linear bf16 nt, bias, x (2, 37, 256)": ((2, 37, 256), torch.bfloat16, linear, linear_ref, BOUND),
        "op fp16 nn, a (300, 264)": ((300, 264), torch.float16, lambda a: dgt.gemm(a, w_nn, "nn"),
                                     lambda a: ref64(a, w_nn, "nn"), BOUND),
        "op tf32 nt, a (77, 264)": ((77, 264), torch.float32, lambda a: dgt.gemm(a, w_tf32),
                                    lambda a: ref64(a, w_tf32, "nt"), 5e-3),
        # Warmed up on a side stream, captured on torch.cuda.graph's own: the capture borrows the side stream's
        # split-K workspace (stream_buffers.py).
        "op bf16 nt split-K, a (40, 7168)": ((40, 7168), torch.bfloat16, lambda a: dgt.gemm(a, w_split),
                                             lambda a: ref64(a, w_split, "nt"), BOUND),
    }


def capture_graph(fn, static_in, label):
    """(graph, static_out): fn warmed up twice on a side stream (compile, load, plan happen outside the capture),
    then captured once. no_grad, not inference_mode: the callers write the static tensors between replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(2):
            fn(static_in)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad():
        try:
            with torch.cuda.graph(graph):
                static_out = fn(static_in)
        except Exception as exc:
            pytest.fail(f"{label}: capture failed: {type(exc).__name__}: {exc}")
    return graph, static_out


@pytest.mark.parametrize("case", ["Linear bf16 nt, bias, x (2, 37, 256)", "op fp16 nn, a (300, 264)",
                                  "op tf32 nt, a (77, 264)", "op bf16 nt split-K, a (40, 7168)"])
def test_cuda_graph_capture_and_replay(case):
    dgt = pytest.importorskip("deepgemm_jit.torch")
    shape, dtype, fn, ref_fn, bound = _graph_cases(dgt)[case]
    static_in = rand(shape, dtype)
    graph, static_out = capture_graph(fn, static_in, case)
    for trial in range(3):
        static_in.copy_(rand(shape, dtype))
        static_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        err = rel_err(static_out, ref_fn(static_in))
        assert err <= bound, f"{case}: replay {trial} with new input: {err=:.2e}"


# -- torch.compile -----------------------------------------------------------------------------------------------------
class _Net(torch.nn.Module):
    def __init__(self, dgt):
        super().__init__()
        self.gemm = dgt.gemm
        self.up = dgt.Linear(256, 688, bias=True, device="cuda", dtype=torch.bfloat16)
        self.w_down = torch.nn.Parameter(rand((688, 256), torch.bfloat16) * 0.05)   # (K, N): layout nn

    def forward(self, x):
        h = torch.nn.functional.gelu(self.up(x))
        return self.gemm(h, self.w_down, layout="nn")   # a must be 2-D for nn

    def reference(self, x):
        h = torch.nn.functional.gelu(x.double() @ self.up.weight.double().T + self.up.bias.double())
        return h @ self.w_down.double()


def test_torch_compile_fullgraph():
    dgt = pytest.importorskip("deepgemm_jit.torch")
    torch.manual_seed(0)
    net = _Net(dgt)
    graph_targets = []

    def recording_backend(gm, example_inputs):
        graph_targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        try:
            torch.compile(net, backend=recording_backend, fullgraph=True)(rand((74, 256), torch.bfloat16))
        except Exception as exc:
            pytest.fail(f"dynamo could not trace the op in one graph: {type(exc).__name__}: {exc}")
    assert sum("deepgemm_jit" in t for t in graph_targets) == 2, f"graph calls: {graph_targets}"

    torch._dynamo.reset()
    compiled = torch.compile(net, fullgraph=True)   # inductor
    with torch.no_grad():
        for m in (74, 37, 129):   # new M: recompiles with a dynamic M, through the fake impl's SymInts
            x = rand((m, 256), torch.bfloat16)
            try:
                got = compiled(x)
            except Exception as exc:
                pytest.fail(f"torch.compile(fullgraph=True) at M={m}: {type(exc).__name__}: {exc}")
            eager = net(x)
            torch.cuda.synchronize()
            want = net.reference(x)
            err_compiled, err_eager = rel_err(got, want), rel_err(eager, want)
            assert got.shape == (m, 256) and got.dtype == torch.bfloat16, f"M={m}: {got.shape} {got.dtype}"
            assert err_compiled <= BOUND and err_eager <= BOUND, \
                f"M={m}: compiled {err_compiled:.2e}, eager {err_eager:.2e} vs float64"


# -- FP8: the quantize and gemm_fp8 ops, FP8 Linears -------------------------------------------------------------
FP8_FORMATS = ("fp8_block", "fp8_row", "fp8_tensor")
FP8_SCALING = {"fp8_block": "block", "fp8_row": "row", "fp8_tensor": "tensor"}
# weight_format -> (granularity of the weight, of the activations) in deepgemm_jit.quantize's words
FP8_GRANULARITY = {"fp8_block": ("block128", "group128"), "fp8_row": ("row", "row"),
                   "fp8_tensor": ("tensor", "tensor")}
# rel. Frobenius error vs the float64 product of the dequantized operands (+ bias): FP32 accumulation, bf16 output
# rounding (~2e-3) and the bf16 bias add; the quantization itself is not in it.
FP8_BOUND = 5e-3


def fp8_linear_reference(dgt, lin, x):
    """float64 (M, N) CuPy array: x quantized as forward quantizes it, dequantized, times the dequantized weight
    buffers, plus the bias."""
    w_gran, x_gran = FP8_GRANULARITY[lin.weight_format]
    qx, sx = dgt.quantize(x.reshape(-1, lin.in_features), "fp8", x_gran)   # deterministic: forward's own bits
    bias64 = None if lin.bias is None else lin.bias.detach().double()
    torch.cuda.synchronize()   # torch's stream wrote them; CuPy reads them on its own
    xd = reference.dequantize_reference(to_cupy(qx), to_cupy(sx), "fp8", x_gran)
    wd = reference.dequantize_reference(to_cupy(lin.weight), to_cupy(lin.weight_scale), "fp8", w_gran)
    ref = xd @ wd.T
    if bias64 is not None:
        ref += to_cupy(bias64)
    return ref


def linear64(linear, x):
    """The float64 product of the 16-bit nn.Linear's own parameters, (M, N) CuPy."""
    y = x.double() @ linear.weight.detach().double().T
    if linear.bias is not None:
        y = y + linear.bias.detach().double()
    y = y.reshape(-1, linear.out_features).contiguous()
    torch.cuda.synchronize()
    return to_cupy(y)


@pytest.mark.parametrize("weight_format", FP8_FORMATS)
@pytest.mark.parametrize("in_features", [1000, 7168])
@pytest.mark.parametrize("out_features,bias", [(300, True), (2112, False)])
@pytest.mark.parametrize("lead", [(3, 5), (1,)])
def test_fp8_linear_accuracy(weight_format, in_features, out_features, bias, lead):
    """in_features 1000 and out_features 300 take the staged (unaligned) path, 7168 x 2112 the TMA path."""
    dgt = pytest.importorskip("deepgemm_jit.torch")
    torch.manual_seed(in_features + out_features)
    linear = torch.nn.Linear(in_features, out_features, bias=bias, device="cuda", dtype=torch.bfloat16)
    fp8 = dgt.Linear.from_linear(linear, dtype="fp8", scaling=FP8_SCALING[weight_format])
    assert fp8.weight_format == weight_format
    x = rand(lead + (in_features,), torch.bfloat16)
    case = f"{weight_format} x {tuple(x.shape)} -> {out_features} {bias=}"
    with torch.no_grad():
        y = fp8(x)
    torch.cuda.synchronize()
    assert y.shape == lead + (out_features,) and y.dtype == torch.bfloat16 and y.device == x.device, \
        f"{case}: {tuple(y.shape)} {y.dtype} {y.device}"
    out = to_cupy(y.reshape(-1, out_features))
    err = reference.error(out, fp8_linear_reference(dgt, fp8, x))
    assert err <= FP8_BOUND, f"{case}: vs float64 of the dequantized operands {err=:.2e}"
    cos = reference.error(out, linear64(linear, x), "cos")
    assert cos < reference.FP8_COS_BOUND, f"{case}: DeepGEMM's cos difference vs the bf16 nn.Linear {cos=:.2e}"


@pytest.mark.parametrize("weight_format", FP8_FORMATS)
def test_fp8_linear_quantizes_the_weight_once(weight_format):
    cupy = pytest.importorskip("cupy")
    dgt = pytest.importorskip("deepgemm_jit.torch")
    linear = torch.nn.Linear(1000, 2112, device="cuda", dtype=torch.bfloat16)
    fp8 = dgt.Linear.from_linear(linear, weight_format)
    case = f"from_linear {weight_format}"
    assert fp8.bias is linear.bias, f"{case}: the bias Parameter is shared"
    assert fp8.weight.dtype == torch.float8_e4m3fn and fp8.weight.data_ptr() != linear.weight.data_ptr(), case
    torch.cuda.synchronize()
    w_gran = FP8_GRANULARITY[weight_format][0]
    q_ref, s_ref = reference.quantize_reference(to_cupy(linear.weight.detach()), "fp8", w_gran)
    np.testing.assert_allclose(cupy.asnumpy(to_cupy(fp8.weight_scale)), cupy.asnumpy(s_ref), rtol=1e-6, atol=0,
                               err_msg=f"{case}: weight scales vs the reference")
    dist = reference.quant_ulp_distance(to_cupy(fp8.weight), q_ref)
    worst, num_off = int(dist.max()), int(cupy.count_nonzero(dist))
    assert worst <= 1 and num_off <= max(2, dist.size // 1000), f"{case}: worst={worst} ulp, {num_off} values off"

    x = rand((4, 1000), torch.bfloat16)
    with torch.no_grad():
        before = fp8(x)
        linear.weight.mul_(2.0)   # the FP8 Linear holds its own quantized copy, made once
        after = fp8(x)
    torch.cuda.synchronize()
    assert_same_bits(after, bits_torch(before), f"{case}: output moved with the 16-bit weight")


@pytest.mark.parametrize("weight_format", FP8_FORMATS)
@pytest.mark.parametrize("x_dtype,out_dtype,bound", [
    (torch.float16, None, FP8_BOUND), (torch.float32, None, FP8_BOUND), (torch.bfloat16, "fp32", 1e-3),
    (torch.bfloat16, "fp16", FP8_BOUND)])
def test_fp8_linear_input_and_output_dtypes(weight_format, x_dtype, out_dtype, bound):
    """Activations of any float type (strided leading dims: reshape copies them), out_dtype chosen."""
    dgt = pytest.importorskip("deepgemm_jit.torch")
    linear = torch.nn.Linear(1024, 520, device="cuda", dtype=torch.bfloat16)
    fp8 = dgt.Linear.from_linear(linear, weight_format, out_dtype=out_dtype)
    x = rand((6, 37, 1024), x_dtype)[::2]
    with torch.no_grad():
        y = fp8(x)
    torch.cuda.synchronize()
    want = {None: torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[out_dtype]
    case = f"{weight_format} x {x_dtype} {tuple(x.shape)} stride {x.stride()} {out_dtype=}"
    assert y.shape == (3, 37, 520) and y.dtype == want, f"{case}: {tuple(y.shape)} {y.dtype}"
    out = to_cupy(y.reshape(-1, 520))
    err = reference.error(out, fp8_linear_reference(dgt, fp8, x))
    assert err <= bound, f"{case}: {err=:.2e}"


def test_fp8_ops_match_the_library_bitwise():
    """The ops run exactly what deepgemm_jit.quantize and a Gemm built as the op builds it run on the same tensors."""
    cupy = pytest.importorskip("cupy")
    dgt = pytest.importorskip("deepgemm_jit.torch")
    x, w = rand((300, 1024), torch.bfloat16), rand((520, 1024), torch.bfloat16, 0.05)
    for scaling, (w_gran, x_gran) in (("block", ("block128", "group128")), ("row", ("row", "row")),
                                      ("tensor", ("tensor", "tensor"))):
        case = f"{scaling=}"
        qx, sx = dgt.quantize(x, "fp8", x_gran)
        qw, sw = dgt.quantize(w, "fp8", w_gran)
        lib_qx, lib_sx = dg.quantize(x, "fp8", x_gran)
        d = dgt.gemm_fp8(qx, qw, sx, sw, scaling)
        g = dg.build(buckets.m_bucket(300), 520, 1024, dtype="fp8", scaling=scaling)   # as the op builds it
        lib_d = g(lib_qx, qw, scale_a=lib_sx, scale_b=sw)
        torch.cuda.synchronize()
        assert cupy.array_equal(to_cupy(qx), to_cupy(lib_qx)) and cupy.array_equal(to_cupy(sx), to_cupy(lib_sx)), case
        assert isinstance(lib_d, torch.Tensor) and d.shape == (300, 520) and d.dtype == torch.bfloat16, case
        assert_same_bits(d, bits_torch(lib_d), f"{case}: gemm_fp8 op vs Gemm {g.config.tag}")


def test_fp8_ops_pass_opcheck():
    """torch's checks of both ops on CUDA tensors: schema, fake vs real, AOT dispatch (static and dynamic)."""
    dgt = pytest.importorskip("deepgemm_jit.torch")
    x, w = rand((74, 1024), torch.bfloat16), rand((520, 1024), torch.bfloat16, 0.05)
    cases = [(torch.ops.deepgemm_jit.quantize.default, (x, "fp8", gran))
             for gran in ("group128", "block128", "row", "tensor")]
    for scaling, w_gran, x_gran, out_dtype in (("block", "block128", "group128", None), ("row", "row", "row", "fp32"),
                                               ("tensor", "tensor", "tensor", "fp16")):
        qx, sx = dgt.quantize(x, "fp8", x_gran)
        qw, sw = dgt.quantize(w, "fp8", w_gran)
        cases.append((torch.ops.deepgemm_jit.gemm_fp8.default, (qx, qw, sx, sw, scaling, out_dtype)))
    for op, args in cases:
        case = f"{op} {[tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args]}"
        # opcheck's test_schema compares inputs before and after with arithmetic that torch 2.11 does not
        # implement for float8 tensors ("mul_cuda" not implemented for 'Float8_e4m3fn', H200 run): the FP8 GEMM
        # op gets the other checks; the quantize op (bf16 in) gets all of them.
        utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
        if op is torch.ops.deepgemm_jit.gemm_fp8.default:
            utils = tuple(u for u in utils if u != "test_schema")
        try:
            torch.library.opcheck(op, args, test_utils=utils)
        except Exception as exc:
            pytest.fail(f"opcheck {case}: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("weight_format", FP8_FORMATS)
def test_fp8_empty_batches(weight_format):
    dgt = pytest.importorskip("deepgemm_jit.torch")
    fp8 = dgt.Linear.from_linear(torch.nn.Linear(1024, 520, device="cuda", dtype=torch.bfloat16), weight_format)
    with torch.no_grad():
        for shape in ((0, 1024), (2, 0, 1024)):
            y = fp8(rand(shape, torch.bfloat16))
            assert y.shape == shape[:-1] + (520,) and y.dtype == torch.bfloat16, f"{weight_format} {shape}"
    torch.cuda.synchronize()


class _Fp8Mlp(torch.nn.Module):
    """Two FP8 Linears around a ReLU (exact in eager and compiled code, so both feed layer 2 the same bits)."""

    def __init__(self, dgt, weight_format, hidden=512, ffn=1408):
        super().__init__()
        self.up16 = torch.nn.Linear(hidden, ffn, device="cuda", dtype=torch.bfloat16)
        self.down16 = torch.nn.Linear(ffn, hidden, device="cuda", dtype=torch.bfloat16)
        self.up = dgt.Linear.from_linear(self.up16, weight_format)
        self.down = dgt.Linear.from_linear(self.down16, weight_format)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))

    def reference(self, x):
        h = torch.relu(x.double() @ self.up16.weight.double().T + self.up16.bias.double())
        return h @ self.down16.weight.double().T + self.down16.bias.double()


@pytest.mark.parametrize("weight_format", FP8_FORMATS)
def test_fp8_mlp_torch_compile_fullgraph(weight_format):
    dgt = pytest.importorskip("deepgemm_jit.torch")
    torch.manual_seed(1)
    net = _Fp8Mlp(dgt, weight_format)
    graph_targets = []

    def recording_backend(gm, example_inputs):
        graph_targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        try:
            torch.compile(net, backend=recording_backend, fullgraph=True)(rand((4, 37, 512), torch.bfloat16))
        except Exception as exc:
            pytest.fail(f"{weight_format}: dynamo could not trace the FP8 MLP in one graph: "
                        f"{type(exc).__name__}: {exc}")
    ours = [t for t in graph_targets if "deepgemm_jit" in t]
    assert ours.count("deepgemm_jit.quantize.default") == 2 and ours.count("deepgemm_jit.gemm_fp8.default") == 2, \
        f"graph calls: {graph_targets}"

    torch._dynamo.reset()
    compiled = torch.compile(net, fullgraph=True)   # inductor
    with torch.no_grad():
        for shape in ((4, 37, 512), (2, 129, 512), (1, 512)):   # new M: recompiles with a dynamic M
            x = rand(shape, torch.bfloat16)
            try:
                got = compiled(x)
            except Exception as exc:
                pytest.fail(f"{weight_format} torch.compile(fullgraph=True) at {shape}: {type(exc).__name__}: {exc}")
            eager = net(x)
            torch.cuda.synchronize()
            case = f"{weight_format} x {shape}"
            assert got.shape == eager.shape == shape and got.dtype == torch.bfloat16, f"{case}: {got.shape} {got.dtype}"
            num_diff = int((bits_torch(got) != bits_torch(eager)).sum())
            between = rel_err(got, eager)
            assert between <= 1e-3, f"{case}: compiled vs eager {between:.2e}, {num_diff} of {got.numel()} differ"
            # Two FP8 layers vs the float64 16-bit MLP: ~5e-2 of quantization noise; garbage is ~1.
            err = rel_err(eager, net.reference(x))
            assert err <= 0.1, f"{case}: eager FP8 MLP vs the float64 bf16 MLP {err=:.2e}"


@pytest.mark.parametrize("weight_format", FP8_FORMATS)
def test_fp8_linear_cuda_graph_capture_and_replay(weight_format):
    """quantize + gemm_fp8 + bias in one graph (aligned sizes: the staged path synchronises and cannot be
    captured); replay allocates nothing, reads the new input, writes the same output buffer."""
    cupy = pytest.importorskip("cupy")
    dgt = pytest.importorskip("deepgemm_jit.torch")
    linear = torch.nn.Linear(512, 520, bias=True, device="cuda", dtype=torch.bfloat16)
    fp8 = dgt.Linear.from_linear(linear, weight_format)
    shape = (2, 37, 512)
    static_in = rand(shape, torch.bfloat16)
    graph, static_out = capture_graph(fp8, static_in, weight_format)
    for trial in range(3):
        static_in.copy_(rand(shape, torch.bfloat16))
        static_out.fill_(float("nan"))
        torch.cuda.synchronize()
        torch_before = torch.cuda.memory_allocated()
        cupy_before = cupy.get_default_memory_pool().used_bytes()
        graph.replay()
        torch.cuda.synchronize()
        case = f"{weight_format}: replay {trial}"
        assert torch.cuda.memory_allocated() == torch_before, f"{case}: torch memory changed"
        assert cupy.get_default_memory_pool().used_bytes() == cupy_before, f"{case}: CuPy memory changed"
        err = reference.error(to_cupy(static_out.reshape(-1, 520)), fp8_linear_reference(dgt, fp8, static_in))
        assert err <= FP8_BOUND, f"{case} with new input: {err=:.2e}"


def test_swap_linears_fp8_transformer_block():
    """Every Linear of the block swapped to block-scaled FP8: each checked on the activations it received."""
    dgt = pytest.importorskip("deepgemm_jit.torch")
    torch.manual_seed(0)
    block = Block()
    x = rand((2, 37, 256), torch.bfloat16)
    with torch.inference_mode():
        num_swapped = dgt.swap_linears(block, dtype="fp8", scaling="block")
        assert num_swapped == 7, f"swap_linears replaced {num_swapped} Linears, the block has 7"
        seen = []
        hooks = [module.register_forward_hook(lambda mod, inp, out, name=name: seen.append((name, mod, inp[0], out)))
                 for name, module in block.named_modules() if isinstance(module, dgt.Linear)]
        swapped = block(x)
        for hook in hooks:
            hook.remove()
    torch.cuda.synchronize()
    assert sorted(name for name, *_ in seen) == sorted(["q", "k", "v", "o", "gate", "up", "down"]), seen
    assert torch.isfinite(swapped).all() and swapped.shape == x.shape
    for name, mod, inp, out in seen:
        assert mod.weight_format == "fp8_block" and out.dtype == torch.bfloat16, f"Linear {name}"
        with torch.inference_mode():
            ref = fp8_linear_reference(dgt, mod, inp)
        err = reference.error(to_cupy(out.reshape(-1, mod.out_features).contiguous()), ref)
        assert err <= FP8_BOUND, f"FP8 Linear {name} ({tuple(inp.shape)} x {tuple(mod.weight.shape)}): {err=:.2e}"
