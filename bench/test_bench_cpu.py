"""CPU-only tests of the bench's pure-Python parts: `pytest bench/test_bench_cpu.py` (no GPU touched)."""
from __future__ import annotations

import json
import math

import pytest

from bench import metrics, report, suites
from bench import dtypes as bench_dtypes
from deepgemm_jit import sm90_tiles


def _row(dtype="bf16", m=4096, n=4096, k=4096, us=200.0, base_us=190.0, status="ok", err=3e-3):
    io = metrics.gemm_io_bytes(m, n, k, 2, 2, 2)
    ok = status == "ok"
    return {"suite": "square", "dtype": dtype, "layout": "nt", "m": m, "n": n, "k": k, "status": status,
            "us": us if ok else None, "tflops": metrics.tflops(m, n, k, us) if ok else None,
            "gbps": metrics.gbps(io, us) if ok else None, "baseline": "torch.mm",
            "baseline_us": base_us if ok else None,
            "baseline_tflops": metrics.tflops(m, n, k, base_us) if ok else None,
            "ratio": base_us / us if ok else None, "err": err, "family": "sm90", "config": "m128n256_s4",
            "intensity": metrics.gemm_flops(m, n, k) / io, "note": "", "error": None}


def _header():
    h = {k: None for k in report.HEADER_KEYS}
    h.update(date="2026-11-29T07:15:02+00:00", gpu="NVIDIA H200", sm_count=132, suites=["square"],
             git_commit="0123456789abcdef", git_dirty=False, source_sha256="f" * 64, reps=30, flush_bytes=256 << 20,
             command="python -m bench --suite square")
    return h


def test_suite_expansion_counts_and_dedup():
    cases = suites.expand(("deepseek", "square", "seed"), ("bf16", "tf32"), ("nt",))
    # 18 DeepSeek + 2 square + 3 seed per dtype, minus the seed's 4096³ already in square.
    assert len(cases) == 2 * (18 + 2 + 3 - 1)
    assert len({(c.dtype, c.layout, c.m, c.n, c.k) for c in cases}) == len(cases)
    ds = {(c.m, c.n, c.k) for c in cases if c.suite == "deepseek" and c.dtype == "bf16"}
    assert (64, 2112, 7168) in ds and (4096, 7168, 16384) in ds and (128, 32768, 512) in ds
    quick = suites.expand(("deepseek",), ("bf16",), ("nt",), quick=True)
    assert 0 < len(quick) < 18 and all(c.suite == "deepseek" for c in quick)
    # models: 12 projections of Llama-3.1-8B / 70B (TP 8) / Qwen2.5-7B x M in {1, 32, 256, 1000, 4096}
    models = {(c.m, c.n, c.k) for c in suites.expand(("models",), ("bf16",), ("nt",))}
    assert len(models) == 60 and (1000, 28672, 4096) in models and (1, 3584, 18944) in models
    with pytest.raises(ValueError, match="unknown suite"):
        suites.expand(("nope",), ("bf16",))
    with pytest.raises(ValueError, match="unknown dtype"):
        suites.parse_list("bf16,fp99", bench_dtypes.DTYPES, (), "dtype")
    assert suites.parse_list("all", suites.LAYOUTS, ("nt",), "layout") == suites.LAYOUTS


def test_layouts_compute_the_same_product_on_numpy():
    np = pytest.importorskip("numpy")
    from deepgemm_jit.baseline import math_operands
    from deepgemm_jit.spec import GemmSpec
    rng = np.random.default_rng(0)
    m, n, k = 4, 6, 5
    A, B = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    stored = {"n": (A, B), "t": (A.T.copy(), B.T.copy())}
    shapes = {"nt": ((m, k), (n, k)), "nn": ((m, k), (k, n)), "tn": ((k, m), (k, n)), "tt": ((k, m), (n, k))}
    assert set(shapes) == set(suites.LAYOUTS)
    for layout in suites.LAYOUTS:
        spec = GemmSpec.create(n, k, dtype="fp16", layout=layout)
        a = stored[layout[0]][0]
        b = stored[layout[1]][1]
        assert (a.shape, b.shape) == (spec.a_shape(m), spec.b_shape()) == shapes[layout]
        X, Y = math_operands(spec, a, b)
        np.testing.assert_allclose(X @ Y, A @ B, err_msg=layout)


def test_flop_byte_math():
    assert metrics.gemm_flops(4096, 4096, 4096) == 2 * 4096 ** 3
    # bf16 4096³: 3 matrices of 32 MiB -> 2·4096³ / (3·2·4096²) = 4096/3 FLOP/byte.
    assert metrics.intensity(4096, 4096, 4096, 2, 2, 2) == pytest.approx(4096 / 3)
    # M=1 decode is bandwidth-bound: intensity ~ 2MNK / (2NK) = 1 FLOP/byte at bf16.
    assert metrics.intensity(1, 4096, 4096, 2, 2, 2) == pytest.approx(1.0, rel=1e-3)
    assert metrics.tflops(4096, 4096, 4096, 191.4) == pytest.approx(718.1, rel=1e-3)   # anchors README
    io = metrics.gemm_io_bytes(64, 4096, 4096, 2, 2, 2)
    assert io == 64 * 4096 * 2 + 4096 * 4096 * 2 + 64 * 4096 * 2
    assert metrics.gbps(io, 18.4) == pytest.approx(io / 18.4e-6 / 1e9)
    assert metrics.tflops(1, 1, 1, None) is None and metrics.gbps(1, 0.0) is None
    assert metrics.roofline_tflops(1.0, 989.0, 4.25) == pytest.approx(4.25)
    assert metrics.roofline_tflops(1e4, 989.0, 4.25) == 989.0


def test_statistics_and_geomean():
    from deepgemm_jit.timing import percentiles
    xs = [float(v) for v in range(1, 31)]   # 30 reps, shuffled order must not matter
    s = percentiles(xs[::-1])
    assert s["median_us"] == pytest.approx(15.5) and s["min_us"] == 1.0
    assert s["p20_us"] == pytest.approx(6.8) and s["p80_us"] == pytest.approx(24.2)   # linear interpolation
    assert metrics.geomean([0.5, 2.0]) == pytest.approx(1.0)
    assert metrics.geomean([4.0, None, float("nan"), 1.0]) == pytest.approx(2.0)
    assert metrics.geomean([]) is None


def test_markdown_and_short_table_have_rows_and_geomean():
    rows = [_row(us=200.0, base_us=100.0), _row(m=64, us=20.0, base_us=40.0),
            _row(dtype="tf32", m=128, status="fail", err=float("nan"))]
    md = report.render_markdown(_header(), rows)
    assert md.count("\n| bf16 |") == 2 and "| tf32 |" in md and "**fail**" in md
    assert "geomean bf16**: ratio 1.000 over 2 rows" in md       # sqrt(0.5 · 2) = 1
    assert "geomean tf32**: ratio - over 0 rows" in md
    g = report.geomean_by_dtype(rows)
    assert g["bf16"]["n_ok"] == 2 and g["tf32"]["n_bad"] == 1
    table = report.render_short_table(rows)
    assert table.splitlines()[-1].startswith("geomean tf32") and " NaN " in table


def test_fp8_rows_against_the_faster_torch_fp8_recipe():
    """Issue 6's bar: an FP8 block row counts against the faster torch FP8 baseline of its shape in the same run
    (per-tensor is faster at small M), not only torch's block-scaled matmul."""
    rows = [_row(dtype="fp8_tensor", m=32, us=10.0, base_us=11.0), _row(dtype="fp8_block", m=32, us=10.0, base_us=15.0),
            _row(dtype="fp8_block", m=64, us=10.0, base_us=15.0)]  # M = 64: no per-tensor row, not counted
    g = report.geomean_vs_faster_fp8(rows)
    assert g["fp8_block"]["ratio"] == pytest.approx(1.1) and g["fp8_block"]["n"] == 1
    assert g["fp8_tensor"]["ratio"] == pytest.approx(1.1) and g["fp8_tensor"]["n_below_1"] == 0
    assert "fp8_block vs the faster torch FP8 recipe of the same shape: ratio 1.100 over 1 rows" in \
        report.render_short_table(rows)
    assert report.geomean_vs_faster_fp8([_row()]) == {}
    # A recipe whose row failed has no timed baseline: its shape leaves the geomean (it raised the others' ratios:
    # with tensor's 8 us baseline gone, block's 10 us against row's 12 read 1.2 instead of 0.8)
    three = [_row(dtype="fp8_tensor", m=32, us=10.0, base_us=8.0), _row(dtype="fp8_row", m=32, us=10.0, base_us=12.0),
             _row(dtype="fp8_block", m=32, us=10.0, base_us=13.0)]
    assert report.geomean_vs_faster_fp8(three)["fp8_block"]["ratio"] == pytest.approx(0.8)
    three[0].update(status="fail", us=None, baseline_us=None)
    assert report.geomean_vs_faster_fp8(three) == {}


def test_json_record_schema_round_trip(tmp_path):
    rows = [_row(), _row(status="fail", err=float("nan")), _row(status="error")]
    rows[2]["err"] = None
    record = json.loads(report.to_json(_header(), rows))
    assert report.validate(record) == []
    assert record["rows"][1]["err"] is None                     # NaN is stored as null, status says fail
    bad = json.loads(report.to_json(_header(), [dict(rows[1], us=12.0)]))
    assert any("carries a time" in p for p in report.validate(bad))
    stem = report.result_stem("2026-11-29T07:15:02+00:00", ["deepseek", "square"], "0123456789ab", True, "ab" * 32)
    assert stem == "20261129T071502Z-deepseek_square-0123456-dirty"
    assert report.result_stem("2026-11-29T07:15:02+00:00", ["seed"], None, None, "ab" * 32).endswith("-srcabababa")
    assert report.experiment_stamp({"date": "2026-11-29T07:15:02+00:00"}) == "20261129T071502"


def test_write_all_files(tmp_path):
    rows = [_row(), _row(m=1, us=19.0, base_us=18.8), _row(status="error")]
    paths = report.write_all(tmp_path, _header(), rows)
    assert json.loads(paths["json"].read_text())["rows"][0]["ratio"] == pytest.approx(0.95)
    assert paths["md"].read_text().startswith("# deepgemm-jit bench: square")
    try:
        import matplotlib
    except ImportError:
        assert "matplotlib" in paths["plot_skipped"]
    else:
        assert matplotlib.__version__ and paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_parse_tiles_shared_by_bench_and_moe():
    assert suites.parse_tiles(None) == () and suites.parse_tiles(" ") == ()
    assert suites.parse_tiles("auto, 128x256,128x192s4,tuned,128x256") == ("auto", "128x256", "128x192s4", "tuned")
    assert suites.parse_tile("64x176s6p") == (64, 176, 6, True, None, False, False)
    assert suites.parse_tile("128x176") == (128, 176, None, False, None, False, False)
    assert suites.parse_tile("128x256s4r2") == (128, 256, 4, False, 2, False, False)
    assert suites.parse_tile("128x128pr0") == (128, 128, None, True, 0, False, False)
    assert suites.parse_tile("128x128k") == (128, 128, None, False, None, True, False)
    assert suites.parse_tile("88x192s5w") == (88, 192, 5, False, None, False, True)
    for bad in ("big", "128x", "128x176s", "128x176q", "128x176r", "128x176r2p", "88x192ws5"):
        with pytest.raises(ValueError, match="BMxBN"):
            suites.parse_tiles(f"auto,{bad}")
    with pytest.raises(ValueError, match=r"one of \['auto'\]"):
        suites.parse_tiles("tuned", words=("auto",))
    from bench.__main__ import main
    assert main(["--list", "--tiles", "128x256,128y64"]) == 2


def test_tile_sweep_cases_force_configs():
    from deepgemm_jit import GemmSpec
    cases = suites.expand(["square"], ["bf16"], tiles=(None, "128x256", "128x192s4"))
    assert [c.tiles for c in cases[:3]] == [None, "128x256", "128x192s4"]
    assert cases[1].tag.endswith("_t128x256")
    spec = GemmSpec.create(4096, 4096, dtype="bf16")
    assert cases[0].forced_config(spec) is None
    cfg = cases[2].forced_config(spec)
    assert (cfg.family, cfg.block_m, cfg.block_n, cfg.num_stages) == ("sm90", 128, 192, 4)
    with pytest.raises(ValueError, match="BMxBN"):
        suites.Case("square", "bf16", "nt", 8, 8, 8, "big").forced_config(spec)
    # a width whose D rows are no 16-byte multiple: a ValueError the sweeps skip (was StopIteration; review, s60)
    with pytest.raises(ValueError, match="not a multiple of 16"):
        suites.forced_tile_config(spec, "128x100")


# ------------------------------------------------------------------------------------------ 8-bit recipes
def test_recipe_table_builds_the_right_library_gemms():
    from deepgemm_jit import reference
    expected = {  # bench dtype: (library dtype, scaling, A granularity, B granularity)
        "fp8_tensor": ("fp8_e4m3", "tensor", "tensor", "tensor"),
        "fp8_row": ("fp8_e4m3", "row", "row", "row"),
        "fp8_block": ("fp8_e4m3", "block", "group128", "block128"),
        "int8": ("int8", None, "row", "row"),
    }
    for name, (lib, scaling, qa, qb) in expected.items():
        d = bench_dtypes.get(name)
        assert (d.lib, d.scaling, d.quant_a, d.quant_b, d.layouts) == (lib, scaling, qa, qb, ("nt",)), name
        assert d.is_quantized and d.peak_tflops == 1979.0 and d.cublas_tflops < d.peak_tflops
        assert reference.ERROR_BOUND[d.lib] == (3e-2 if lib == "fp8_e4m3" else 1e-2)
    assert bench_dtypes.get("int8").unit == "TOPS" and bench_dtypes.get("fp8_row").unit == "TFLOPS"
    bf16 = bench_dtypes.get("bf16")   # the 16-bit rows are what they were
    assert (bf16.lib, bf16.scaling, bf16.is_quantized, bf16.layouts) == ("bf16", None, False, suites.LAYOUTS)
    with pytest.raises(ValueError, match="needs quantized operands"):
        bench_dtypes.BenchDtype("fp8_x", library_dtype="fp8_e4m3", scaling="row")
    with pytest.raises(ValueError, match="granularity"):
        bench_dtypes.BenchDtype("fp8_x", library_dtype="fp8_e4m3", scaling="row", quant_a="row", quant_b="col")
    with pytest.raises(ValueError, match="no error bound"):
        bench_dtypes.BenchDtype("fp4")


def test_recipe_cases_specs_and_build_arguments():
    cases = suites.expand(("deepseek",), ("fp8_block", "int8"), suites.LAYOUTS)   # 8-bit: nt only
    assert len(cases) == 2 * 18 and {c.layout for c in cases} == {"nt"}
    assert cases[0].tag == "fp8_block_nt_m64n2112k7168"
    with pytest.raises(ValueError, match="layouts"):
        suites.Case("deepseek", "fp8_row", "nn", 64, 2112, 7168)
    fp8 = suites.Case("square", "fp8_row", "nt", 4096, 4096, 4096)
    assert fp8.build_kwargs() == {"dtype": "fp8_e4m3", "layout": "nt", "tune": False, "scaling": "row"}
    assert suites.Case("square", "int8", "nt", 64, 64, 64).build_kwargs() == {"dtype": "int8", "layout": "nt",
                                                                              "tune": False}
    assert suites.Case("square", "bf16", "tn", 8, 8, 8, "tuned").build_kwargs() == {
        "dtype": "bf16", "layout": "tn", "tune": True}
    spec = fp8.make_spec()
    assert (spec.dtype, spec.out_dtype, spec.n, spec.k) == ("fp8_e4m3", "bf16", 4096, 4096)
    if hasattr(spec, "scaling"):   # the library's spec carries the scaling once FP8 lands
        assert spec.scaling == "row"


def test_cli_lists_recipe_cases_and_keeps_bf16(capsys):
    from bench.__main__ import main, parse_args
    assert main(["--suite", "deepseek", "--dtype", "fp8_block", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "18 cases" and all("fp8_block_nt_m" in line for line in out[:-1])
    assert main(["--suite", "seed", "--dtype", "fp8_tensor,fp8_row,int8", "--layout", "all", "--list"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "9 cases"
    assert main(["--suite", "square", "--dtype", "bf16", "--layout", "all", "--list"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "8 cases"
    assert main(["--dtype", "fp8", "--list"]) == 2              # not a recipe: refused before any GPU work
    assert "unknown dtype" in capsys.readouterr().err
    args = parse_args(["--dtype", "fp8_block"])
    assert args.dtype == "fp8_block" and args.baseline.split(",") == list(baseline_mod().DEFAULT_ORDER)


def baseline_mod():
    from deepgemm_jit import baseline
    return baseline


def test_scaling_shapes_and_bytes():
    np = pytest.importorskip("numpy")
    bl = baseline_mod()
    assert bl.Scaling.shapes("tensor", 64, 7168, 2048) == ((1,), (1,))
    assert bl.Scaling.shapes("row", 64, 7168, 2048) == ((64,), (7168,))
    assert bl.Scaling.shapes("block", 65, 2112, 7200) == ((65, 57), (17, 57))   # ceil: partial blocks count
    s = bl.Scaling("block", np.ones((65, 57), np.float32), np.ones((17, 57), np.float32))
    s.check(65, 2112, 7200)
    assert s.num_bytes == (65 * 57 + 17 * 57) * 4
    with pytest.raises(ValueError, match="scales for M=64"):
        s.check(64, 2112, 7200)
    with pytest.raises(ValueError, match="recipe"):
        bl.Scaling("group", s.scale_a, s.scale_b)


def test_torch_size_rules():
    bl = baseline_mod()
    assert bl.int_mm_refusal(64, 7168, 2048) is None and bl.int_mm_refusal(17, 8, 8) is None
    assert "M > 16" in bl.int_mm_refusal(16, 7168, 2048) and "M > 16" in bl.int_mm_refusal(1, 4096, 4096)
    assert "multiples of 8" in bl.int_mm_refusal(64, 4097, 4096)
    assert bl.scaled_mm_refusal(1, 4096, 4096) is None
    assert "multiples of 16" in bl.scaled_mm_refusal(64, 4096, 4104)


# Scale layouts on CPU torch: values, strides, and torch's own shape/stride checks (meta tensors).
def _fp8_case(torch, m, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, generator=g).to(torch.float8_e4m3fn)
    return a, b, g


def _dequant_product(np, a, b, recipe, sa, sb):
    """float64 (a · sa) @ (b · sb).T from our scales, written out element-block by element-block."""
    A, B = a.float().double().numpy(), b.float().double().numpy()
    sa, sb = sa.double().numpy(), sb.double().numpy()
    if recipe == "tensor":
        A, B = A * sa[0], B * sb[0]
    elif recipe == "row":
        A, B = A * sa[:, None], B * sb[:, None]
    else:
        A = A * np.repeat(sa, 128, axis=1)[:, :A.shape[1]]
        B = B * np.repeat(np.repeat(sb, 128, axis=0), 128, axis=1)[:B.shape[0], :B.shape[1]]
    return A @ B.T


@pytest.mark.torch
def test_torch_scale_layouts_hold_our_values():
    torch = pytest.importorskip("torch")
    bl = baseline_mod()
    m, n, k = 65, 384, 384     # ceil(K/128) = 3: padded to 4 for torch's 128x128 scales
    nb, kb = -(-n // 128), -(-k // 128)
    g = torch.Generator().manual_seed(1)
    sa = torch.rand(m, kb, generator=g) + 0.5
    sb = torch.rand(nb, kb, generator=g) + 0.5
    ta = bl.torch_scales_1x128(sa)
    assert ta.shape == (m, 3) and ta.stride() == (1, m) and torch.equal(ta, sa)
    one_row = bl.torch_scales_1x128(sa[:1])
    assert one_row.stride() == (1, 1) and torch.equal(one_row, sa[:1])    # M = 1: stride(0) must still be 1
    tb = bl.torch_scales_128x128(sb)
    assert tb.shape == (4, 3) and tb.stride() == (1, 4)
    assert torch.equal(tb[:3, :], sb.t()) and torch.equal(tb[3, :], torch.ones(3))   # padding scales nothing
    tb1 = bl.torch_scales_128x128(sb, 1)
    assert tb1.shape == (3, 3) and tb1.stride() == (1, 3) and torch.equal(tb1, sb.t())
    t_a, t_b = bl.torch_tensorwise_scales(torch.tensor([2.0]), torch.tensor([0.5]))
    assert t_a.shape == () and t_a.item() == 2.0 and t_b.item() == 0.5
    r_a, r_b = bl.torch_rowwise_scales(torch.ones(m), torch.ones(n))
    assert r_a.shape == (m, 1) and r_b.shape == (1, n) and r_a.is_contiguous() and r_b.is_contiguous()


@pytest.mark.torch
@pytest.mark.parametrize("m,n,k", [(64, 256, 512), (1, 128, 384), (130, 2048, 7168)])
def test_block_scale_layout_passes_torchs_own_checks(m, n, k):
    """torch's meta kernel of scaled_mm (the checks torch.compile relies on) accepts our conversion.

    N and K stay multiples of 128 here: the meta kernel (torch 2.13) checks N // 128 and K // 128 scale blocks
    where the CUDA kernel checks ceil(N/128), ceil(K/128) (docs/fp8-baselines.md); we follow the CUDA kernel.
    """
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    if not hasattr(F, "scaled_mm"):
        pytest.skip(f"torch {torch.__version__} has no torch.nn.functional.scaled_mm")
    from deepgemm_jit.arrays import mn_major_storage_shape, mn_major_view
    bl = baseline_mod()
    kb, nb = -(-k // 128), -(-n // 128)
    a = torch.empty(m, k, dtype=torch.float8_e4m3fn, device="meta")
    b = torch.empty(n, k, dtype=torch.float8_e4m3fn, device="meta")
    sa = bl.torch_scales_1x128(torch.ones(m, kb)).to("meta")
    sb = bl.torch_scales_128x128(torch.ones(nb, kb)).to("meta")
    assert sa.stride() == (1, m)
    d = F.scaled_mm(a, b.t(), sa, F.ScalingType.BlockWise1x128, sb, F.ScalingType.BlockWise128x128,
                    output_dtype=torch.bfloat16)
    assert d.shape == (m, n) and d.dtype == torch.bfloat16
    # quantize's own M-major scale_a (strides (1, round_up(M, 4))) is that layout when M % 4 == 0 (torch takes it
    # as is); for other M, torch's CUDA kernel refuses block scaling anyway (the baseline pads M, see baseline.py).
    ours = mn_major_view(torch.ones(mn_major_storage_shape(m, kb), device="meta"), m)
    if m % 4 == 0:
        assert ours.stride() == (1, m)
        F.scaled_mm(a, b.t(), ours, F.ScalingType.BlockWise1x128, sb, F.ScalingType.BlockWise128x128,
                    output_dtype=torch.bfloat16)
    with pytest.raises(RuntimeError):   # and refuses the row-major layout, so the check has teeth
        F.scaled_mm(a, b.t(), torch.ones(m, kb, device="meta"), F.ScalingType.BlockWise1x128,
                    torch.ones(nb, kb, device="meta"), F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)


@pytest.mark.torch
@pytest.mark.parametrize("m", [1, 47, 64])
def test_block_calls_pad_m_to_what_cublas_takes(m):
    """cuBLASLt refuses block-wise FP8 for M % 4 != 0: those M also get candidates on A padded to a multiple of 4
    rows, which torch's meta checks accept and which return D's M rows."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    if not hasattr(F, "scaled_mm"):
        pytest.skip(f"torch {torch.__version__} has no torch.nn.functional.scaled_mm")
    bl = baseline_mod()
    n, k = 256, 512
    a = torch.empty(m, k, dtype=torch.float8_e4m3fn, device="meta")
    b = torch.empty(n, k, dtype=torch.float8_e4m3fn, device="meta")
    sa, sb = torch.ones(m, k // 128, device="meta"), torch.ones(n // 128, k // 128, device="meta")
    out = torch.empty(m, n, dtype=torch.bfloat16, device="meta")
    calls = bl.torch_scaled_mm_calls(torch, a, b, "block", sa, sb, out)
    padded = [(label, call) for label, call in calls if "M padded to 4" in label]
    assert bool(padded) == (m % 4 != 0)
    for _, call in padded:
        assert call().shape == (m, n)


@pytest.mark.torch
@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])
def test_torch_scaled_calls_compute_our_dequantized_product_on_cpu(recipe):
    """The very calls the baseline times, on CPU tensors: torch multiplies by our scales the way we mean them."""
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    bl = baseline_mod()
    m, n, k = 48, 256, 512
    a, b, g = _fp8_case(torch, m, n, k)
    shape_a, shape_b = bl.Scaling.shapes(recipe, m, n, k)
    sa = torch.rand(shape_a, generator=g) * 2 + 0.25
    sb = torch.rand(shape_b, generator=g) * 2 + 0.25
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    calls = bl.torch_scaled_mm_calls(torch, a, b, recipe, sa, sb, out)
    assert calls and all(label.startswith(("torch._scaled_mm", "F.scaled_mm")) for label, _ in calls)
    try:
        label, call = bl.first_that_runs(calls, recipe)
    except bl.BaselineUnavailable as exc:
        # CPU torch has no block-scaled kernel (the GPU path is cuBLASLt), and torch 2.11's CPU _scaled_mm takes only
        # single-element scales (the GPU machine's torch, session 15: "scale_a.numel() == 1 && scale_b.numel() == 1").
        assert recipe in ("row", "block") and "refuses" in str(exc), exc
        return
    d = call().double().numpy()
    ref = _dequant_product(np, a, b, recipe, sa, sb)
    err = np.linalg.norm(d - ref) / np.linalg.norm(ref)
    assert err < 1e-2, f"{recipe=} {label=} err={err:.2e}"                        # bf16 output rounding
    wrong = _dequant_product(np, a, b, recipe, 1 / sa, 1 / sb)                     # scales used as divisors
    assert np.linalg.norm(d - wrong) / np.linalg.norm(wrong) > 0.1


def test_first_that_runs_reports_every_refusal():
    bl = baseline_mod()

    def refuse():
        raise RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul\nmore")

    label, call = bl.first_that_runs([("bad", refuse), ("good", lambda: 7)], "x")
    assert (label, call()) == ("good", 7)
    with pytest.raises(bl.BaselineUnavailable, match="bad: RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED"):
        bl.first_that_runs([("bad", refuse)], "block-scaled fp8 at M=1")
    with pytest.raises(bl.BaselineUnavailable, match="no API"):
        bl.first_that_runs([], "block-scaled fp8")


def test_bind_passes_over_kinds_that_do_not_cover_the_dtype():
    from deepgemm_jit.spec import GemmSpec
    bl = baseline_mod()
    spec = GemmSpec.create(256, 512, dtype="int8")
    assert [k for k in bl.DEFAULT_ORDER if bl.KINDS[k].covers(spec)] == ["torch_int"]
    fp8 = GemmSpec.create(256, 512, dtype="fp8_e4m3", **({"scaling": "row"} if hasattr(spec, "scaling") else {}))
    assert [k for k in bl.DEFAULT_ORDER if bl.KINDS[k].covers(fp8)] == ["torch_scaled"]
    base, reasons = bl.bind(fp8, None, None, ("torch", "cupy"))
    assert base is None and reasons == ["no baseline kind in ['torch', 'cupy'] computes fp8_e4m3"]
    bf16 = GemmSpec.create(256, 512, dtype="bf16")
    assert [k for k in bl.DEFAULT_ORDER if bl.KINDS[k].covers(bf16)] == ["torch", "cupy"]


def test_recipe_rows_and_report(tmp_path):
    from bench import runner
    row = runner.empty_row(suites.Case("deepseek", "fp8_block", "nt", 64, 2112, 7168))
    assert (row["dtype"], row["library_dtype"], row["scaling"]) == ("fp8_block", "fp8_e4m3", "block")
    assert (row["tol"], row["err_metric"], row["cos_tol"]) == (3e-2, "rel_fro", 1e-3)
    i8 = runner.empty_row(suites.Case("deepseek", "int8", "nt", 64, 2112, 7168))
    assert (i8["library_dtype"], i8["scaling"], i8["tol"], i8["cos_tol"]) == ("int8", None, 1e-2, None)

    def fp8_row(dtype, m, us, base_us, cos=4e-4):
        r = dict(_row(dtype=dtype, m=m, n=7168, k=16384, us=us, base_us=base_us, err=2e-3), err_cos=cos,
                 baseline_err_cos=5e-4, tol=3e-2, baseline="F.scaled_mm(1x128,128x128)")
        return r
    rows = [fp8_row("fp8_block", 4096, 800.0, 900.0), fp8_row("fp8_block", 64, 40.0, 50.0),
            dict(_row(dtype="int8", m=4096, n=7168, k=16384, us=1000.0, base_us=1101.2, err=0.0), tol=1e-2),
            _row(dtype="bf16")]
    md = report.render_markdown(_header(), rows)
    assert "| cos |" in md and "| 4.0e-04 / 5.0e-04 |" in md and "(tol 0.03)" in md
    assert md.count("\n| fp8_block |") == 2 and "\n| int8 |" in md
    assert "geomean fp8_block**: ratio 1.186 over 2 rows" in md          # sqrt(1.125 · 1.25)
    bf16_line = next(line for line in md.splitlines() if line.startswith("| bf16 |"))
    head = next(line for line in md.splitlines() if line.startswith("| dtype |"))
    assert bf16_line.count("|") == head.count("|")                       # a '-' cell, not a missing one
    assert " - |" in bf16_line
    assert "| cos |" not in report.render_markdown(_header(), [_row()])    # 16-bit runs keep today's table
    table = report.render_short_table(rows)
    assert table.splitlines()[1].startswith("fp8_block  nt ") and "geomean int8: ratio 1.101" in table
    record = json.loads(report.to_json(_header(), rows))
    assert report.validate(record) == [] and record["rows"][0]["err_cos"] == 4e-4
    paths = report.write_all(tmp_path, _header(), rows)
    assert paths["md"].exists() and paths["json"].exists()


def test_operands_call_kwargs_and_scale_bytes():
    np = pytest.importorskip("numpy")
    from bench import runner
    bl = baseline_mod()
    sa, sb = np.ones((64, 56), np.float32), np.ones((17, 56), np.float32)
    ops = runner.Operands("a", "b", None, "fp64-dequant", bl.Scaling("block", sa, sb), None)
    assert ops.call_kwargs() == {"scale_a": sa, "scale_b": sb} and ops.scale_bytes == (64 + 17) * 56 * 4
    plain = runner.Operands("a", "b", None, "fp64")
    assert plain.call_kwargs() == {} and plain.scale_bytes == 0 and not plain.is_exact


# ------------------------------------------- run_case end to end on the CPU: NumPy standing in for CuPy
# CuPy is replaced by NumPy, and the GPU-only pieces by small NumPy stand-ins (our kernel, the torch baseline,
# the event timer, the poisoning memset). The library's quantization references run as they are (they take
# NumPy arrays), and everything between — operand preparation, scales, references, checks, notes, metrics,
# the row — is the real runner code.
def _dequantize(q, scales, granularity):
    from deepgemm_jit import reference
    return reference.dequantize_reference(q, scales, "fp8_e4m3", granularity)


class _FakeGemm:
    """Our kernel's call contract, computed in NumPy; `damage` spoils the output the way a bug would."""

    def __init__(self, np, spec, recipe, damage=None):
        self.np, self.spec, self.recipe, self.damage = np, spec, recipe, damage
        self.family, self.config = "sm90", "m128n128_s4"
        self.calls = 0

    def __call__(self, a, b, *, out, scale_a=None, scale_b=None, **epilogue_kwargs):
        np = self.np
        self.calls += 1
        if self.damage == "first_call_only" and self.calls > 1:   # e.g. split-K counters left dirty
            return out
        import ml_dtypes
        if a.dtype.kind == "V" or a.dtype.name in ("bfloat16", "float16", "float32"):   # 16/32-bit operands
            from deepgemm_jit import reference as epilogue_ref
            from deepgemm_jit import reference
            prod = reference.to_float64(a) @ reference.to_float64(b).T
            if self.spec.epilogue != "none" and self.damage != "epilogue_dropped":
                prod = epilogue_ref.unfused_epilogue(prod, self.spec.epi, **epilogue_kwargs)
            out[...] = prod.astype(out.dtype)
            return out
        if self.recipe is None:
            prod = a.astype(np.int64) @ b.astype(np.int64).T
        else:
            assert scale_a is not None and scale_b is not None, "an fp8 call without scales"
            qa, qb = self.recipe
            prod = _dequantize(a, scale_a, qa) @ _dequantize(b, scale_b, qb).T
        if self.damage == "scales_ignored":
            prod = a.view(ml_dtypes.float8_e4m3fn).astype(np.float64) @ b.view(ml_dtypes.float8_e4m3fn).astype(
                np.float64).T
        out[...] = prod.astype(out.dtype)
        if self.damage == "one_element":
            out[0, 0] += 1
        return out


@pytest.fixture
def cpu_runner(monkeypatch):
    """bench.runner with CuPy replaced by NumPy and the GPU-only pieces by stand-ins."""
    import types
    np = pytest.importorskip("numpy")
    pytest.importorskip("ml_dtypes")
    from bench import runner
    from deepgemm_jit import baseline, dtypes, reference, timing
    from deepgemm_jit.quantization import recipe_granularities
    if not hasattr(reference, "quantize_reference"):
        pytest.skip("deepgemm_jit.reference has no quantize_reference yet")

    _cupy_on_numpy(monkeypatch, runner)

    def poison(x, stream=None):   # the same NaN (0xFF) bytes, without cudaMemsetAsync
        x.view(np.uint8)[...] = reference.POISON_BYTE
        return x

    def poisoned(shape, name):
        return poison(np.empty(shape, dtype=dtypes.numpy_dtype(name)))
    monkeypatch.setattr(reference, "poison", poison)
    monkeypatch.setattr(reference, "poisoned", poisoned)

    seen = {}

    def bind(spec, a, b, order, *, scaling=None, **epilogue):   # a torch-like baseline on the very arrays ours reads
        seen["scaling"] = scaling
        seen["epilogue"] = epilogue.get("epilogue")
        if spec.epilogue != "none":
            gemm = _FakeGemm(np, spec, None)
            out = poisoned((a.shape[0], spec.n), spec.out_dtype)
            kw = epilogue["epilogue"].call_kwargs(spec.epi)
            kw.setdefault("alpha", 1.0)
            kw.setdefault("beta", 1.0)
            return baseline.Bound("fake_torch_unfused", lambda: gemm(a, b, out=out, **kw),
                                  lambda: reference.to_float64(out)), []
        gemm = _FakeGemm(np, spec, None if scaling is None else recipe_granularities(scaling.recipe))
        out = poisoned((a.shape[0], spec.n), spec.out_dtype)
        kw = {} if scaling is None else {"scale_a": scaling.scale_a, "scale_b": scaling.scale_b}
        return baseline.Bound("fake_torch", lambda: gemm(a, b, out=out, **kw),
                              lambda: reference.to_float64(out)), []
    monkeypatch.setattr(baseline, "bind", bind)

    def time_interleaved(fns, *, reps, warmup, flush):
        us = {"ours": 80.0, "plain": 78.0, "base": 100.0}
        for fn in fns.values():
            fn()
        return {name: timing.Timing(us[name], us[name], us[name], us[name], reps, 5.0, 50.0, ())
                for name in fns}
    monkeypatch.setattr(timing, "time_interleaved", time_interleaved)

    def run(dtype, m, n, k, damage=None, epilogue=None):
        from deepgemm_jit.spec import GemmSpec
        info = bench_dtypes.get(dtype)
        recipe = None if info.scaling is None else (info.quant_a, info.quant_b)

        def build(m_, n_, k_, **kwargs):
            assert kwargs.get("scaling") == info.scaling and kwargs["dtype"] == info.lib
            spec = GemmSpec.create(n_, k_, dtype=info.lib, layout=kwargs["layout"], epilogue=kwargs.get("epilogue"),
                                   **({"scaling": info.scaling} if info.scaling else {}))
            return _FakeGemm(np, spec, recipe, damage if spec.epilogue != "none" or not epilogue else None)

        def build_fp32(m_, n_, k_, **kwargs):   # fp32 rows: the 3xTF32 GEMM, its dtype implied
            from deepgemm_jit.fp32x3 import Fp32Spec
            assert info.lib == "fp32" and "dtype" not in kwargs and "scaling" not in kwargs
            spec = Fp32Spec.create(n_, k_, layout=kwargs["layout"], epilogue=kwargs.get("epilogue"))
            return _FakeGemm(np, spec, None, damage if spec.epilogue != "none" or not epilogue else None)
        ctx = runner.RunContext(reps=30, warmup=1, baseline_order=baseline.DEFAULT_ORDER, seed=7,
                                flusher=object(), dg=types.SimpleNamespace(build=build, build_fp32=build_fp32))
        return runner.run_case(suites.Case("deepseek", dtype, "nt", m, n, k, epilogue=epilogue), ctx, 0), seen

    return run


@pytest.mark.parametrize("dtype", ["fp8_tensor", "fp8_row", "fp8_block"])
def test_run_case_fp8_rows_on_cpu(cpu_runner, dtype):
    m, n, k = 96, 384, 656                        # partial 128-blocks along M and K
    row, seen = cpu_runner(dtype, m, n, k)
    assert row["status"] == "ok", row.get("traceback") or row["note"]
    assert seen["scaling"].recipe == dtype.split("_")[1]
    assert row["err"] < 5e-3 and row["baseline_err"] < 5e-3          # bf16 rounding of the output only
    assert 0 < row["err_cos"] < 1e-2 and 0 < row["baseline_err_cos"] < 1e-2   # quantization error, vs BF16 inputs
    assert row["ref"] == "fp64-dequant" and row["scaling"] == dtype.split("_")[1]
    assert row["ratio"] == pytest.approx(1.25) and row["baseline"] == "fake_torch"
    kb, nb = -(-k // 128), -(-n // 128)
    if dtype == "fp8_block":  # scale_a reaches ours as quantize returns it: M-major (the bulk-copied layout)
        assert seen["scaling"].scale_a.strides == (4, 4 * m), seen["scaling"].scale_a.strides
    scale_elems = {"fp8_tensor": 2, "fp8_row": m + n, "fp8_block": m * kb + nb * kb}[dtype]
    assert row["io_bytes"] == m * k + n * k + m * n * 2 + 4 * scale_elems


def test_run_case_fails_an_fp8_kernel_that_ignores_scales(cpu_runner):
    row, _ = cpu_runner("fp8_block", 64, 256, 512, damage="scales_ignored")
    assert row["status"] == "fail" and row["us"] is None and "not timed" in row["note"]


def test_run_case_int8_is_exact_or_fails(cpu_runner):
    row, seen = cpu_runner("int8", 64, 256, 512)
    assert row["status"] == "ok", row.get("traceback") or row["note"]
    assert row["err"] == 0.0 and row["err_cos"] is None and seen["scaling"] is None
    assert row["io_bytes"] == 64 * 512 + 256 * 512 + 64 * 256 * 4
    row, _ = cpu_runner("int8", 64, 256, 512, damage="one_element")
    assert row["err"] < 1e-2                                   # within the bound, yet wrong:
    assert row["status"] == "fail" and "1 of 16384 elements differ" in row["note"]


def test_tile_sweeps_summarize_the_heuristics_rows():
    """--tiles auto,128x256,...: the geomean is the auto rows' (pooling every forced tile of a shape averaged the
    sweep); a run of forced tiles only summarizes its first option; rows without the key (older files) all count."""
    from bench import report

    def row(tiles, us):
        return {"dtype": "bf16", "m": 4096, "n": 4096, "k": 4096, "tiles": tiles, "status": "ok", "us": us,
                "ratio": 190.0 / us, "tflops": 1.0, "baseline_tflops": 1.0}
    sweep = [row("auto", 200.0), row("128x256", 260.0), row("128x192s4", 320.0)]
    got = report.geomean_by_dtype(sweep)["bf16"]
    assert got["ratio"] == pytest.approx(0.95) and got["n"] == 1
    assert report.geomean_by_dtype(sweep[1:])["bf16"]["ratio"] == pytest.approx(190.0 / 260.0)
    old = [{k: v for k, v in r.items() if k != "tiles"} for r in sweep[:2]]
    assert report.geomean_by_dtype(old)["bf16"]["n"] == 2


def test_run_case_judges_the_timed_calls_outputs(cpu_runner):
    """A kernel right on its first (checked) call only: the timed calls' outputs are poisoned first and judged after,
    so the row fails instead of reporting its times as ok."""
    row, _ = cpu_runner("bf16", 64, 256, 512, damage="first_call_only")
    assert row["status"] == "fail" and "timed calls' output is wrong" in row["note"], row["note"]
    assert row["err"] < 1e-2   # the first call passed its check
    row, _ = cpu_runner("bf16", 64, 256, 512)
    assert row["status"] == "ok", row.get("traceback") or row["note"]


def test_run_case_fp32_rows_build_the_3xtf32_gemm_on_cpu(cpu_runner):
    """fp32 rows go through dg.build_fp32 (fp32 is no GemmSpec dtype), are judged with fp32's bound (1e-5) and bind
    the IEEE FP32 baseline; their forced tiles and epilogues apply to the TF32 GEMM over K' = 3 * ceil(K/32) * 32."""
    row, seen = cpu_runner("fp32", 64, 256, 100)
    assert row["status"] == "ok", row.get("traceback") or row["note"]
    assert row["library_dtype"] == "fp32" and row["tol"] == 1e-5 and row["out_dtype"] == "float32"
    assert row["err"] < 1e-6 and row["baseline_err"] < 1e-6 and row["baseline"] == "fake_torch"
    assert seen["scaling"] is None and row["io_bytes"] == 4 * (64 * 100 + 256 * 100 + 64 * 256)
    row, seen = cpu_runner("fp32", 64, 256, 100, epilogue="bias+relu")
    assert row["status"] == "ok" and row["plain_err"] < 1e-6, row.get("traceback") or row["note"]
    assert seen["epilogue"].bias.shape == (256,) and seen["epilogue"].bias.dtype.name == "float32"
    row, _ = cpu_runner("fp32", 64, 256, 100, damage="epilogue_dropped", epilogue="bias+relu")
    assert row["status"] == "fail"
    case = suites.Case("square", "fp32", "tn", 64, 256, 100, "128x128")
    assert case.build_kwargs() == {"dtype": "fp32", "layout": "tn", "tune": False}
    spec = case.make_spec()
    assert (spec.dtype, spec.n, spec.k, spec.layout, spec.out_dtype) == ("tf32", 256, 384, "nt", "fp32")
    cfg = case.forced_config(spec)
    assert (cfg.family, cfg.block_m, cfg.block_n, cfg.block_k) == ("sm90", 128, 128, 32)
    # At decode sizes the forced tile is sized for the raw-B GEMM that build_fp32 then compiles (two A and two B
    # tiles per stage): its stages fit that kernel's shared memory.
    decode = suites.Case("deepseek", "fp32", "nt", 64, 7168, 2048, "64x112")
    spec = decode.make_spec()
    cfg = decode.forced_config(spec)
    assert spec.raw_b and cfg.smem_bytes(spec) <= sm90_tiles.SM90_SMEM_BUDGET_BYTES
    cfg.check_for(spec, "sm_90a")
    cases = suites.expand(("seed",), ("fp32",), suites.LAYOUTS, epilogues=("bias+gelu",))
    assert len(cases) == 3 * 4   # every layout takes epilogues here: the TF32 GEMM behind them is nt


def test_git_info_prefers_the_commit_passed_to_the_gpu_machine(tmp_path, monkeypatch):
    """The GPU machine's copy may hold a stale .git: the commit written by prepare_device.sh wins."""
    from bench import report

    monkeypatch.delenv("DEEPGEMM_JIT_GIT_COMMIT", raising=False)
    monkeypatch.delenv("DEEPGEMM_JIT_GIT_DIRTY", raising=False)
    (tmp_path / ".carry").mkdir()
    (tmp_path / ".carry" / "commit").write_text("0123abcd 1\n")
    assert report.git_info(tmp_path) == ("0123abcd", True)
    monkeypatch.setenv("DEEPGEMM_JIT_GIT_COMMIT", "feedbeef")
    monkeypatch.setenv("DEEPGEMM_JIT_GIT_DIRTY", "0")
    assert report.git_info(tmp_path) == ("feedbeef", False)


def test_git_info_counts_untracked_sources_as_dirty(tmp_path, monkeypatch):
    """A new, untracked template or module can change what a run does: the run is dirty. New result files are not
    code (review: --untracked-files=no called such runs clean)."""
    import subprocess

    from bench import report

    monkeypatch.delenv("DEEPGEMM_JIT_GIT_COMMIT", raising=False)
    monkeypatch.delenv("DEEPGEMM_JIT_GIT_DIRTY", raising=False)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q", str(tmp_path)], check=True)
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "a.cuh").write_text("//\n")
    subprocess.run(git + ["-C", str(tmp_path), "add", "."], check=True)
    subprocess.run(git + ["-C", str(tmp_path), "commit", "-qm", "x"], check=True)
    assert report.git_info(tmp_path)[1] is False
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "r.json").write_text("{}")
    assert report.git_info(tmp_path)[1] is False
    (tmp_path / "templates" / "new_kernel.cuh").write_text("//\n")
    assert report.git_info(tmp_path)[1] is True


def test_git_info_ignores_a_carried_commit_of_other_code(tmp_path, monkeypatch):
    """prepare_device.sh also writes the source hash: a `.carry/commit` left behind in a tree whose code changed
    since (a local checkout 19 commits later) no longer names the run's commit."""
    from bench import report

    monkeypatch.delenv("DEEPGEMM_JIT_GIT_COMMIT", raising=False)
    monkeypatch.delenv("DEEPGEMM_JIT_GIT_DIRTY", raising=False)
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "x.py").write_text("x = 1\n")
    (tmp_path / ".carry").mkdir()
    (tmp_path / ".carry" / "commit").write_text(f"0123abcd 0 {report.source_sha256(tmp_path)}\n")
    assert report.git_info(tmp_path) == ("0123abcd", False)
    (tmp_path / "bench" / "x.py").write_text("x = 2\n")
    assert report.git_info(tmp_path) == (None, None)  # no git here either


# ------------------------------------------------------------------------------------------ fused epilogues
def test_epilogue_arguments_cases_and_default_unchanged(capsys):
    from bench.__main__ import main, parse_args
    assert parse_args([]).epilogue is None
    assert suites.parse_epilogues(None) == (None,) and suites.parse_epilogues("") == (None,)
    assert suites.parse_epilogues("gelu+bias, bias+gelu+residual,none") == ("bias+gelu", "bias+gelu+residual", None)
    for quantized in ("quant_fp8_tensor", "bias+gelu+quant_fp8_g128", "quant_int8_tensor"):
        with pytest.raises(ValueError, match="bench.quant_epilogue"):
            suites.parse_epilogues(quantized)
    with pytest.raises(ValueError, match="unknown word"):
        suites.parse_epilogues("bias+swish")
    plain = suites.expand(("deepseek",), ("bf16",))
    assert plain == suites.expand(("deepseek",), ("bf16",), epilogues=(None,))
    assert all(c.epilogue is None and "_ep_" not in c.tag for c in plain)
    assert main(["--suite", "deepseek", "--dtype", "bf16", "--epilogue", "bias+gelu,bias+gelu+residual",
                 "--only", "m4096", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "12 cases" and out[0].split()[1] == "bf16_nt_m4096n2112k7168_ep_bias_gelu"
    assert out[1].split()[1] == "bf16_nt_m4096n2112k7168_ep_bias_gelu_residual"
    case = suites.Case("deepseek", "bf16", "nt", 4096, 7168, 2048, epilogue="gelu+bias")
    assert case.epilogue == "bias+gelu" and case.build_kwargs() == {"dtype": "bf16", "layout": "nt", "tune": False,
                                                                   "epilogue": "bias+gelu"}
    assert case.make_spec().epilogue == "bias+gelu"
    assert suites.Case("deepseek", "bf16", "nt", 1, 8, 8, epilogue="none").epilogue is None
    # what the library's spec refuses is not expanded: int8 -> int32 output (bf16 and tf32 take epilogues in every
    # layout: MN-major operands read by the Hopper kernel, or transposed for it, sm90_rules.kernel_spec)
    both = suites.expand(("seed",), ("bf16", "tf32", "int8"), suites.LAYOUTS, epilogues=(None, "bias+relu"))
    with_epi = [c for c in both if c.epilogue]
    assert {(c.dtype, c.layout) for c in with_epi} == {(d, x) for d in ("bf16", "tf32") for x in suites.LAYOUTS}
    assert len(with_epi) == 3 * 4 * 2  # 3 shapes x 4 layouts x (bf16, tf32)
    assert len(both) - len(with_epi) == 3 * 4 * 2 + 3
    assert main(["--epilogue", "bias+swish", "--list"]) == 2 and "unknown word" in capsys.readouterr().err


def test_unfused_reference_on_numpy():
    np = pytest.importorskip("numpy")
    from deepgemm_jit import reference as epilogue_ref
    v = np.array([[-2.0, -0.5, 0.0, 0.5, 3.0]])
    gelu = epilogue_ref.activation_reference("gelu", v)
    # gelu(x) = x·Φ(x): Φ(0.5) = 0.6914624612740131, Φ(3) = 0.9986501019683699 (normal table)
    np.testing.assert_allclose(gelu[0, [3, 4]], [0.5 * 0.6914624612740131, 3 * 0.9986501019683699], rtol=1e-14)
    np.testing.assert_allclose(gelu[0, [0, 1, 2]], [-2 * (1 - 0.9772498680518208), -0.5 * (1 - 0.6914624612740131),
                                                    0.0], rtol=1e-12)
    assert epilogue_ref.activation_reference("gelu", np.array([1.0]))[0] == pytest.approx(0.8413447460685429, rel=1e-14)
    np.testing.assert_allclose(epilogue_ref.activation_reference("gelu_tanh", v), gelu, atol=1e-3)   # close, not equal
    assert not np.allclose(epilogue_ref.activation_reference("gelu_tanh", v), gelu, atol=1e-6, rtol=0)
    np.testing.assert_allclose(epilogue_ref.activation_reference("relu", v), [[0, 0, 0, 0.5, 3.0]])
    np.testing.assert_allclose(epilogue_ref.activation_reference("sigmoid", v), 1 / (1 + np.exp(-v)))
    np.testing.assert_allclose(epilogue_ref.activation_reference("silu", v), v / (1 + np.exp(-v)))
    rng = np.random.default_rng(1)
    m, n = 3, 4
    acc, c, res = rng.standard_normal((m, n)), rng.standard_normal((m, n)), rng.standard_normal((m, n))
    bias_n, bias_m = rng.standard_normal(n), rng.standard_normal(m)
    got = epilogue_ref.unfused_epilogue(acc, "beta+bias+relu+residual", bias=bias_n.astype(np.float32), c=c, residual=res,
                               alpha=0.75, beta=0.5)
    want = np.maximum(0.75 * acc + 0.5 * c + bias_n.astype(np.float32)[None, :], 0) + res   # residual after act
    np.testing.assert_allclose(got, want, rtol=1e-15)
    got = epilogue_ref.unfused_epilogue(acc, "bias_row+sigmoid", bias=bias_m)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-(acc + bias_m[:, None]))), rtol=1e-15)
    # alpha/beta apply only with 'beta'; the identity is the product itself
    np.testing.assert_array_equal(epilogue_ref.unfused_epilogue(acc, "bias", bias=bias_n, alpha=9.0), acc + bias_n)
    np.testing.assert_array_equal(epilogue_ref.unfused_epilogue(acc, "none"), acc)


@pytest.mark.parametrize("epilogue", ["bias+gelu", "bias+gelu+residual", "bias+gelu_tanh", "bias_row+silu",
                                      "relu+residual", "beta+bias+sigmoid", "beta", "bias+relu", "bias+swiglu",
                                      "geglu+residual"])
@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.torch
def test_torch_unfused_computes_the_reference_on_cpu(epilogue, scaled):
    """torch_unfused_call against the float64 unfused reference; `scaled`: with a given product (FP8's scaled matmul,
    here a plain mm standing in for it), after which C and the bias are separate ops."""
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    from deepgemm_jit import reference as epilogue_ref
    from deepgemm_jit.epilogue import Epilogue
    bl = baseline_mod()
    epi = Epilogue.parse(epilogue)
    m, n, k = 33, 48, 24  # N: three blocks of 16 for the gated units
    gen = torch.Generator().manual_seed(3)

    def draw(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)
    a, b = draw(m, k), draw(n, k) / k ** 0.5           # layout nt: a (M, K), b (N, K)
    ops = bl.EpilogueOperands(bias=None if epi.bias == "none" else draw(n if epi.bias == "col" else m),
                              c=draw(m, n) if epi.beta else None,
                              residual=draw(m, n // 2 if epi.is_gated else n) if epi.residual else None,
                              alpha=0.75 if epi.beta else 1.0, beta=0.5 if epi.beta else 1.0)
    out = torch.full((m, n), float("nan"))
    product = ("scaled_mm", lambda: torch.mm(a, b.t(), out=out)) if scaled else None
    label, call = bl.torch_unfused_call(torch, epi, None if scaled else a, None if scaled else b.t(), ops, out,
                                        scaled_product=product)
    got = call().double().numpy()
    acc = a.double().numpy() @ b.double().numpy().T
    as_np = {name: None if getattr(ops, name) is None else getattr(ops, name).numpy() for name in ("bias", "c",
                                                                                                    "residual")}
    want = epilogue_ref.unfused_epilogue(acc, epi, alpha=ops.alpha, beta=ops.beta, **as_np)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{epilogue}: {label}")
    assert ("F.linear(bias)" in label) == (epi.bias == "col" and not epi.beta and not scaled)
    assert label.startswith("scaled_mm") == scaled
    assert ("F.gelu" in label) == (epi.activation.startswith("gelu") or epi.gate == "geglu")
    assert ("add(residual)" in label) == epi.residual and ("(gate) * up" in label) == epi.is_gated
    assert label.startswith("addmm(C") == (epi.beta and not scaled)
    # twice in a row (the timed loop): same result, no state carried over
    np.testing.assert_allclose(call().double().numpy(), got, rtol=0, atol=0)
    assert set(bl.EpilogueOperands(**{kk: getattr(ops, kk) for kk in ("bias", "c", "residual")},
                                   alpha=ops.alpha, beta=ops.beta).call_kwargs(epi)) == (
        ({"bias"} if epi.bias != "none" else set()) | ({"c", "alpha", "beta"} if epi.beta else set())
        | ({"residual"} if epi.residual else set()))


def test_epilogue_specs_bind_only_the_unfused_kind():
    from deepgemm_jit.spec import GemmSpec
    bl = baseline_mod()
    assert "torch_unfused" in bl.DEFAULT_ORDER and bl.KINDS["torch_unfused"].name == "torch_unfused"
    plain = GemmSpec.create(256, 512, dtype="bf16")
    epi = GemmSpec.create(256, 512, dtype="bf16", epilogue="bias+gelu")
    assert [k for k in bl.DEFAULT_ORDER if bl.KINDS[k].covers(plain)] == ["torch", "cupy"]
    assert [k for k in bl.DEFAULT_ORDER if bl.KINDS[k].covers(epi)] == ["torch_unfused"]
    base, reasons = bl.bind(epi, None, None, ("torch", "cupy"))
    assert base is None and reasons == ["no baseline kind in ['torch', 'cupy'] computes bf16 with epilogue "
                                        "'bias+gelu'"]
    fp8 = GemmSpec.create(256, 512, dtype="fp8_e4m3", scaling="block", epilogue="bias+gelu")
    assert [k for k in bl.DEFAULT_ORDER if bl.KINDS[k].covers(fp8)] == ["torch_scaled_unfused"]
    quant = GemmSpec.create(256, 512, dtype="fp8_e4m3", scaling="block", epilogue="bias+gelu+quant_fp8_tensor")
    assert not [k for k in bl.DEFAULT_ORDER if bl.KINDS[k].covers(quant)]  # torch writes no FP8 D after ops
    with pytest.raises(bl.BaselineUnavailable, match="needs its operands"):
        bl.TorchScaledUnfused().bind(fp8, None, None)
    with pytest.raises(bl.BaselineUnavailable, match="needs its operands"):
        bl.TorchUnfused().bind(epi, None, None)


def test_run_case_epilogue_row_on_cpu(cpu_runner):
    row, seen = cpu_runner("bf16", 64, 256, 512, epilogue="bias+gelu+residual")
    assert row["status"] == "ok", row.get("traceback") or row["note"]
    assert row["epilogue"] == "bias+gelu+residual" and row["ref"] == "fp64+unfused-epilogue"
    assert row["err"] < 1e-2 and row["plain_err"] < 1e-2 and row["baseline_err"] < 1e-2
    assert row["baseline"] == "fake_torch_unfused" and seen["epilogue"].bias.shape == (256,)
    assert seen["epilogue"].residual.shape == (64, 256) and seen["epilogue"].c is None
    assert row["ratio"] == pytest.approx(1.25) and row["plain_us"] == 78.0
    assert row["overhead"] == pytest.approx(80.0 / 78.0)
    assert row["epilogue_bytes"] == 2 * (256 + 64 * 256)
    assert row["io_bytes"] == 2 * (64 * 512 + 256 * 512 + 64 * 256) + row["epilogue_bytes"]
    row, _ = cpu_runner("bf16", 64, 256, 512, epilogue="beta+bias_row+silu")
    assert row["status"] == "ok" and (row["alpha"], row["beta"]) == (0.75, 0.5), row.get("traceback")
    # a kernel that drops the epilogue fails its check and is not timed
    row, _ = cpu_runner("bf16", 64, 256, 512, damage="epilogue_dropped", epilogue="bias+gelu")
    assert row["status"] == "fail" and row["us"] is None and row["overhead"] is None
    # plain rows keep exactly their keys
    from bench import runner
    assert not {"epilogue", "overhead", "plain_us"} & set(runner.empty_row(suites.Case("seed", "bf16", "nt", 1, 8, 8)))


def test_epilogue_report_columns_and_geomean(tmp_path):
    def epi_row(epilogue, m, us, plain_us, base_us):
        return dict(_row(m=m, n=7168, k=2048, us=us, base_us=base_us), epilogue=epilogue, plain_us=plain_us,
                    overhead=us / plain_us, baseline="torch: F.linear(bias) + F.gelu")
    rows = [epi_row("bias+gelu", 4096, 102.0, 100.0, 130.0), epi_row("bias+gelu", 64, 21.0, 20.0, 30.0),
            epi_row("bias+gelu+residual", 4096, 103.0, 100.0, 150.0), _row()]
    md = report.render_markdown(_header(), rows)
    head = next(line for line in md.splitlines() if line.startswith("| dtype |"))
    assert "| epilogue |" in head and "| overhead |" in head and "| plain µs |" in head
    line = next(line for line in md.splitlines() if "| bias+gelu+residual |" in line)
    assert line.count("|") == head.count("|") and "| 100.0 | 1.030 |" in line
    plain_line = next(line for line in md.splitlines() if line.startswith("| bf16 |") and "| - |" in line)
    assert plain_line.count("|") == head.count("|")
    assert "geomean bf16**: ratio 0.950 over 1 rows" in md          # the plain row alone
    assert ("geomean bf16 bias+gelu**: ratio vs cuBLAS + separate ops 1.349 over 2 rows; overhead vs our plain "
            "GEMM 1.035 geomean, max 1.050 at M=64 N=7168 K=2048 over 2 rows") in md   # sqrt(130/102 · 30/21)
    g = report.geomean_by_epilogue(rows)
    assert g[("bf16", "bias+gelu+residual")]["max_overhead"] == pytest.approx(1.03)
    assert set(g) == {("bf16", "bias+gelu"), ("bf16", "bias+gelu+residual")}
    table = report.render_short_table(rows)
    assert "overhd" in table.splitlines()[0] and "epilogue" in table.splitlines()[0]
    assert any(t.startswith("geomean bf16 bias+gelu+residual:") and "max 1.030" in t for t in table.splitlines())
    assert "epilogue" not in report.render_markdown(_header(), [_row()])           # plain runs keep today's table
    assert "overhd" not in report.render_short_table([_row()])
    record = json.loads(report.to_json(_header(), rows))
    assert report.validate(record) == [] and record["rows"][0]["overhead"] == pytest.approx(1.02)
    paths = report.write_all(tmp_path, _header(), rows)
    assert paths["md"].exists()


def test_decode_suite():
    cases = suites.expand(("decode",), ("bf16", "fp8_tensor", "fp8_block"), ("nt",))
    assert len(cases) == 3 * 6 * 6
    assert {c.m for c in cases} == {1, 8, 16, 32, 64, 128}
    assert (1, 7168, 16384) in {(c.m, c.n, c.k) for c in cases}
    assert {c.dtype for c in cases} == {"bf16", "fp8_tensor", "fp8_block"}
    quick = suites.expand(("decode",), ("bf16",), ("nt",), quick=True)
    assert {(c.m, c.n, c.k) for c in quick} == {(1, 2112, 7168), (1, 7168, 16384), (16, 2112, 7168),
                                                (16, 7168, 16384)}
    # GB/s of a decode row counts the weight: 235 MB at M = 1, N = 7168, K = 16384 in 65 us is 3.6 TB/s.
    io = metrics.gemm_io_bytes(1, 7168, 16384, 2, 2, 2)
    assert 3.6e3 < metrics.gbps(io, 65.0) < 3.7e3


def test_quant_epilogue_rows_and_unfused_pair(capsys):
    from bench import quant_epilogue as qe

    rows = qe.cases((64, 4096), ("quant_fp8_g128", "bias+gelu+quant_fp8_g128"))
    assert len(rows) == 2 * 2 * 6 and rows[0] == (64, 2112, 7168, "quant_fp8_g128", "bf16")
    both = qe.cases((64,), ("quant_fp8_g128",), ("bf16", "fp8_block"))
    assert [r[-1] for r in both] == ["bf16"] * 6 + ["fp8_block"] * 6
    with pytest.raises(ValueError, match="--dtype"):
        qe.cases((64,), ("quant_fp8_g128",), ("int4",))
    assert qe.unfused_epilogue("bias+gelu+quant_fp8_g128") == "bias+gelu"
    assert qe.unfused_epilogue("quant_fp8_g128") == "none"
    with pytest.raises(ValueError, match="quant_fp8_g128"):
        qe.cases((64,), ("bias+gelu",))
    assert qe.main(["--list", "--m", "128"]) == 0
    assert capsys.readouterr().out.strip().endswith("12 rows")
    # Static-scale quantizations have rows too (no unfused pair of ours: the library has no static quantize).
    static = qe.cases((4096,), ("quant_fp8_tensor", "bias+gelu+quant_int8_tensor"), ("fp8_tensor",))
    assert len(static) == 12 and static[6] == (4096, 2112, 7168, "bias+gelu+quant_int8_tensor", "fp8_tensor")
    assert qe.unfused_epilogue("bias+silu+quant_int8_tensor") == "bias+silu"
    assert qe.unfused_epilogue("quant_fp8_tensor+amax") == "none"  # amax belongs to the quantization
    assert qe.quant_word("bias+quant_fp8_tensor") == "quant_fp8_tensor" and qe.quant_word("bias+gelu") is None
    # --offline plans the fused GEMM, the GEMM without the quantization and the quantize kernels of every row
    from bench import offline
    work, _ = offline.quant_epilogue_work([(128, 2112, 7168, "bias+gelu+quant_fp8_g128", "fp8_block")])
    epilogues = {getattr(spec, "epilogue", None) for spec, cfg in work if cfg is not None}
    assert {"bias+gelu+quant_fp8_g128", "bias+gelu"} <= epilogues
    assert any(cfg is None and getattr(spec, "granularity", "") == "group128" for spec, cfg in work)


def test_quant_epilogue_bitwise_equal_takes_every_checked_width(monkeypatch):
    """The post-timing checks compare q (1 byte), the scales (4) and the plain GEMM's BF16 D (2): a width missing
    from _bitwise_equal's table was a KeyError that turned every checked row into an error after its timing."""
    import cupy
    import ml_dtypes
    import numpy as np

    from bench import quant_epilogue as qe

    monkeypatch.setattr(cupy, "array_equal", np.array_equal)  # NumPy stand-ins: no GPU here
    for dtype in (np.uint8, ml_dtypes.bfloat16, np.float32):
        x = np.arange(6).astype(dtype).reshape(2, 3)
        assert qe._bitwise_equal(x, x.copy()) and not qe._bitwise_equal(x, x[::-1].copy()), dtype


def test_quant_epilogue_markdown_and_geomeans():
    from bench import quant_epilogue as qe

    def row(m, n, fused, gemm, torch_us, unfused=None, epilogue="quant_fp8_g128"):
        r = {"m": m, "n": n, "k": 512, "epilogue": epilogue, "dtype": "bf16", "status": "ok", "fused_us": fused,
             "gemm_us": gemm, "torch_us": torch_us, "overhead": fused / gemm, "vs_torch": torch_us / fused,
             "torch": "torch: mm + div(s) + clamp + to(e4m3)"}
        if unfused is not None:
            r.update(unfused_us=unfused, ratio=unfused / fused, ceiling=unfused / gemm)
        return r

    rows = [row(64, 2112, 10.0, 9.0, 20.0, 12.0), row(64, 4096, 10.0, 9.0, 40.0, 13.0),
            row(64, 2112, 5.0, 4.0, 10.0, epilogue="quant_fp8_tensor"),
            {"m": 64, "n": 7168, "k": 512, "epilogue": "quant_fp8_tensor", "dtype": "bf16", "status": "wrong",
             "error": "torch_err 1.00e+00"}]
    text = qe.markdown(rows)
    assert text.count("\n| bf16 |") == 4 and "torch contenders: `torch: mm + div(s)" in text
    # geomean of 1.2 and 1.3; the static group has no ratio, and the wrong row is in no geomean
    assert f"ratio {math.sqrt(1.2 * 1.3):.3f}, overhead 1.111, vs_torch {math.sqrt(2 * 4):.3f}" in text
    assert "**bf16 quant_fp8_tensor M=64** (1 rows): geomean overhead 1.250, vs_torch 2.000" in text
    assert "| - | - |" in text.splitlines()[4]  # the static row: no GEMM + quantize, no ratio


# ------------------------------------------------------------------------------ bench.moe (issue 8: grouped GEMMs)
def test_moe_cases_and_list(capsys):
    from bench import moe
    rows = moe.cases()
    assert len(rows) == 2 * (2 * 3 * 2 + 5 * 3 * 2) == 84
    assert len({c.tag for c in rows}) == len(rows)
    assert {(c.n, c.k) for c in rows} == {(4096, 7168), (7168, 2048)}
    contig = [c for c in rows if c.layout == "contiguous"]
    assert {(c.groups, c.rows) for c in contig} == {(4, 8192), (8, 4096)}
    assert {(c.index, c.sizes) for c in contig} == {("offs", "even"), ("offs", "uneven"), ("m_indices", "uneven")}
    masked = [c for c in rows if c.layout == "masked"]
    assert {c.groups for c in masked} == {1, 2, 4, 8, 16} and {c.rows for c in masked} == {256, 512, 1024}
    assert {c.max_m for c in masked} == {384, 768, 1536}
    bar = moe.MoeCase("contiguous", "offs", "even", "fp8", 4, 8192, 4096, 7168)
    assert bar in rows and bar.tag == "fp8_contig_offs_even_g4x8192_n4096k7168"
    assert bar in moe.cases(quick=True) and len(moe.cases(quick=True)) == 2 * 2 * len(moe.QUICK)
    assert all(c.dtype == "bf16" and c.layout == "masked" for c in moe.cases(("masked",), ("bf16",)))
    with pytest.raises(ValueError, match="unknown layout"):
        moe.cases(("ragged",))
    with pytest.raises(ValueError, match="take index"):
        moe.MoeCase("masked", "offs", "random", "bf16", 2, 256, 4096, 7168)
    assert moe.main(["--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "84 rows" and out[0].startswith("bf16_contig_offs_even_g4x8192_n4096k7168")
    assert moe.main(["--list", "--only", "fp8_masked_g16", "--dtype", "fp8"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "6 rows"
    assert moe.main(["--list", "--dtype", "fp16"]) == 2


def test_moe_group_sizes():
    import random

    from bench import moe
    for total, groups in ((32768, 4), (32768, 8), (7, 3), (0, 2), (100, 1)):
        sizes = moe.uneven_sizes(total, groups, random.Random(total * 31 + groups))
        assert len(sizes) == groups and sum(sizes) == total and min(sizes) >= 0
    sizes = moe.uneven_sizes(32768, 8, random.Random(0))
    assert max(sizes) > 1.3 * min(sizes)                       # uneven indeed
    c = moe.MoeCase("contiguous", "offs", "uneven", "bf16", 8, 4096, 4096, 7168)
    same = [moe.MoeCase("contiguous", "m_indices", "uneven", "fp8", 8, 4096, 7168, 2048)]
    assert all(moe.group_sizes(c) == moe.group_sizes(s) for s in same)    # not dtype, (N, K) or index
    assert moe.group_sizes(c, 1) != moe.group_sizes(c, 0) and sum(moe.group_sizes(c, 1)) == 32768
    even = moe.MoeCase("contiguous", "offs", "even", "bf16", 4, 8192, 4096, 7168)
    assert moe.group_sizes(even) == [8192] * 4
    for c in (c for c in moe.cases() if c.layout == "masked"):
        counts = moe.group_sizes(c)
        assert len(counts) == c.groups
        assert all(0 <= x <= c.max_m and c.rows // 2 <= x <= c.rows * 3 // 2 for x in counts), (c.tag, counts)
        assert c.max_m % 128 == 0 and c.max_m >= c.rows * 3 // 2
    capped = moe.masked_counts(50, 1024, 600, random.Random(3))
    assert max(capped) == 600 and min(capped) >= 512


def test_moe_layout_indexes_cover_every_row_once():
    from bench import moe
    sizes = [5, 130, 0, 128]
    assert moe.offsets_end(sizes) == [5, 135, 135, 263]
    ids = moe.m_indices(sizes)
    assert len(ids) == 128 + 256 + 0 + 128
    assert ids[:5] == [0] * 5 and ids[5:128] == [-1] * 123 and ids[128:258] == [1] * 130 and ids[-1] == 3
    assert ids.count(-1) == 123 + 126
    for case in (moe.MoeCase("contiguous", "m_indices", "uneven", "bf16", 4, 66, 64, 256),
                 moe.MoeCase("contiguous", "offs", "uneven", "bf16", 4, 66, 64, 256),
                 moe.MoeCase("masked", "masked_m", "random", "bf16", 4, 256, 64, 256)):
        shape = moe.a_shape(case, sizes)
        flat_rows = shape[0] * (shape[1] if case.layout == "masked" else 1)
        assert moe.segment_starts(case, sizes)[1] == flat_rows
        seen = [0] * flat_rows

        def mark(ix):
            if case.layout == "masked":
                g, sl = ix
                rows = range(g * case.max_m + sl.start, g * case.max_m + sl.stop)
            else:
                rows = range(ix[0].start, ix[0].stop)
            for r in rows:
                seen[r] += 1
        for ix in moe.group_index(case, sizes) + moe.pad_index(case, sizes):
            mark(ix)
        assert set(seen) == {1}, case.tag                          # valid + untouched rows tile a exactly
        if case.index == "m_indices":
            valid = [r for ix in moe.group_index(case, sizes) for r in range(ix[0].start, ix[0].stop)]
            assert sorted(valid) == [r for r, g in enumerate(ids) if g >= 0]
    fp8 = moe.MoeCase("masked", "masked_m", "random", "fp8", 4, 256, 4096, 7168)
    assert moe.fp8_scale_shapes(fp8, sizes) == ((4, 384, 56), (4, 32, 56))
    contig = moe.MoeCase("contiguous", "offs", "even", "fp8", 4, 8192, 7168, 2048)
    assert moe.fp8_scale_shapes(contig, [8192] * 4) == ((32768, 16), (4, 56, 16))
    assert moe.valid_flops(contig, [8192] * 4) == 2 * 32768 * 7168 * 2048


def test_moe_file_names_summary_and_markdown(tmp_path):
    from bench import moe
    date = "2026-11-29T07:15:02+00:00"
    assert moe.result_stem(date, "0123456789abcdef", False, "f" * 64) == "20261129T071502Z-moe-0123456"
    assert moe.result_stem(date, "0123456789abcdef", True, "f" * 64) == "20261129T071502Z-moe-0123456-dirty"
    assert moe.result_stem(date, None, None, "abcdef0123" * 6) == "20261129T071502Z-moe-srcabcdef0"

    def row(case, us, base_us, status="ok"):
        r = moe.empty_row(case)
        sizes = moe.group_sizes(case)
        r.update(status=status, group_sizes=sizes, valid_rows=sum(sizes), err=3e-3)
        if status == "ok":
            flops = moe.valid_flops(case, sizes)
            r.update(us=us, tflops=flops / us / 1e6, baseline="torch._grouped_mm", baseline_us=base_us,
                     ratio=base_us / us)
        return r
    c = moe.cases()
    bar = moe.MoeCase("contiguous", "offs", "even", "fp8", 4, 8192, 4096, 7168)
    rows = [row(c[0], 100.0, 150.0), row(c[20], 10.0, 10.0), row(c[30], 1.0, 1.0, status="fail"),
            row(bar, 1400.0, 2000.0)]
    rows[-1]["rowwise_us"] = 1300.0
    s = moe.summarize(rows)
    assert s["geomean_ratio"]["bf16"]["ratio"] == pytest.approx(math.sqrt(1.5))
    assert s["geomean_ratio"]["bf16"]["n"] == 2 and s["geomean_ratio"]["bf16"]["n_bad"] == 1
    assert s["bar"]["bf16_geomean_ratio>=1.2"] is True and s["bar"]["fp8_geomean_ratio>=1.2"] is True
    fp8_tflops = 2 * 32768 * 4096 * 7168 / 1400.0 / 1e6
    assert s["bar"]["fp8_contig_4x8192_n4096k7168_tflops"] == pytest.approx(fp8_tflops)
    assert s["bar"]["fp8_contig_4x8192_n4096k7168>=1350"] is (fp8_tflops >= 1350)
    assert set(s["geomean_by_layout"]) == {"bf16/contiguous", "bf16/masked", "fp8/contiguous"}
    header = {"date": date, "gpu": "NVIDIA H200", "torch": "2.11", "reps": 30, "command": "python -m bench.moe"}
    md = moe.markdown(header, rows, s)
    head = next(line for line in md.splitlines() if line.startswith("| layout |"))
    for col in ("| dtype |", "| G |", "| rows |", "| ours µs |", "| baseline µs |", "| baseline |", "| ratio |",
                "| our TFLOPS |", "| status |", "| torch rowwise µs |"):
        assert col in head
    body = [line for line in md.splitlines() if line.startswith("| contiguous") or line.startswith("| masked")]
    assert len(body) == 4 and all(line.count("|") == head.count("|") for line in body)
    assert "geomean bf16: ratio 1.225" in md and "**fail**" in md
    record = json.loads(moe.to_json(header, rows, s))
    assert record["bench"] == "moe" and record["summary"]["geomean_ratio"]["fp8"]["n"] == 1
    assert "fp8_contig_offs_even_g4x8192_n4096k7168" in moe.short_table(rows)


@pytest.mark.torch
def test_moe_torch_apis_of_the_local_torch():
    torch = pytest.importorskip("torch")
    from bench import moe
    apis = moe.torch_apis(torch)
    assert set(apis) >= {"torch._grouped_mm", "torch._scaled_grouped_mm", "F.scaled_mm"}
    assert all(isinstance(v, bool) for v in apis.values())


# bench.moe's row end to end on the CPU: NumPy stands in for CuPy, a NumPy grouped GEMM for ours, the library's
# quantization reference for dg.quantize; the torch baselines are the real code on CPU torch (its
# torch._grouped_mm runs on the CPU; its block-scaled F.scaled_mm and _scaled_grouped_mm do not, so fp8 rows
# get a NumPy-backed F.scaled_mm stand-in or report them unavailable).
class _FakeGrouped:
    def __init__(self, np, damage=None):
        self.np, self.damage, self.calls = np, damage, []
        self.family, self.config = "sm90_grouped", "m128n128_s4"
        self.scale_a = None

    def __call__(self, a, b, *, out, offs=None, m_indices=None, masked_m=None, scale_a=None, scale_b=None):
        from deepgemm_jit import reference
        np = self.np
        self.scale_a = scale_a
        self.calls.append(sorted(k for k, v in (("offs", offs), ("m_indices", m_indices), ("masked_m", masked_m),
                                                ("scale_a", scale_a)) if v is not None))

        def deq_a(ix):
            if scale_a is None:
                return reference.to_float64(a[ix])
            return reference.dequantize_reference(a[ix], scale_a[ix], "fp8_e4m3", "group128")

        def deq_b(g):
            if scale_b is None:
                return reference.to_float64(b[g])
            return reference.dequantize_reference(b[g], scale_b[g], "fp8_e4m3", "block128")
        groups = b.shape[0]
        if masked_m is not None:
            index = [(g, slice(0, int(masked_m[g]))) for g in range(groups)]
        elif offs is not None:
            ends = [0] + [int(x) for x in offs]
            index = [(slice(ends[g], ends[g + 1]),) for g in range(groups)]
        else:
            ids = np.asarray(m_indices)
            index = [(np.flatnonzero(ids == g),) for g in range(groups)]
        for g, ix in enumerate(index):
            out[ix] = (deq_a(ix) @ deq_b(g).T).astype(out.dtype)
        if self.damage == "pad_written":
            out[(0, -1) if masked_m is not None else (-1,)] = 0
        if self.damage == "wrong":
            out[(0, 0) if masked_m is not None else (0,)] += 100
        return out


@pytest.fixture
def moe_cpu(monkeypatch):
    import contextlib
    np = pytest.importorskip("numpy")
    pytest.importorskip("ml_dtypes")
    torch = pytest.importorskip("torch")
    import deepgemm_jit
    from bench import moe, runner
    from deepgemm_jit import baseline, dtypes, reference, timing

    _cupy_on_numpy(monkeypatch, runner)

    def poisoned(shape, name):
        x = np.empty(shape, dtype=dtypes.numpy_dtype(name))
        x.view(np.uint8)[...] = reference.POISON_BYTE
        return x
    monkeypatch.setattr(reference, "poisoned", poisoned)

    def poison(x, stream=None):     # the timed calls' outputs are poisoned again (moe._run_case)
        x.view(np.uint8)[...] = reference.POISON_BYTE
        return x
    monkeypatch.setattr(reference, "poison", poison)
    monkeypatch.setattr(deepgemm_jit, "quantize", lambda x, dtype, gran: reference.quantize_reference(x, dtype, gran))

    def to_torch(x):
        if x.dtype.itemsize == 2 and x.dtype.kind not in "iu":     # bf16 (ml_dtypes)
            return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(x)
    monkeypatch.setattr(baseline, "_torch_cuda_missing", lambda: None)
    monkeypatch.setattr(baseline, "_on_cupy_stream", lambda torch: contextlib.nullcontext)
    monkeypatch.setattr(baseline, "cupy_to_torch", to_torch)
    monkeypatch.setattr(baseline, "_to_cupy_f64", lambda torch, t: t.to(torch.float64).numpy())

    def fake_block_calls(torch, a, b, recipe, sa, sb, out, **kw):     # F.scaled_mm(1x128, 128x128) in torch on CPU
        assert recipe == "block" and sa.shape == (a.shape[0], -(-a.shape[1] // 128)) and sb.shape[0] == -(
            -b.shape[0] // 128)

        def call():
            ea = sa.repeat_interleave(128, 1)[:, :a.shape[1]]
            eb = sb.repeat_interleave(128, 0).repeat_interleave(128, 1)[:b.shape[0], :b.shape[1]]
            return ((a.double() * ea.double()) @ (b.double() * eb.double()).t()).to(torch.bfloat16)
        return [("fake F.scaled_mm(1x128,128x128)", call)]

    us = {"ours": 80.0, "grouped": 100.0, "loop": 120.0, "rowwise": 70.0}
    timed_calls = []   # the keys of every time_interleaved call

    def time_interleaved(fns, *, reps, warmup, flush):
        timed_calls.append(list(fns))
        for fn in fns.values():
            fn()
        return {name: timing.Timing(us[name], us[name], us[name], us[name], reps, 5.0, 50.0, ()) for name in fns}
    monkeypatch.setattr(timing, "time_interleaved", time_interleaved)

    real_block_calls = baseline.torch_scaled_mm_calls

    def run(case, damage=None, fp8_loop=True, tiles=(), tile_us=None, tile_damage=None):
        """(the row, build_grouped's arguments, ours' calls); with `tiles` (--tiles) every row of the case is in
        run.rows, the forced configs built in run.forced, the timing calls' keys in run.timed."""
        monkeypatch.setattr(baseline, "torch_scaled_mm_calls", fake_block_calls if fp8_loop else real_block_calls)
        us.update(tile_us or {})
        gemm = _FakeGrouped(np, damage)
        built, run.forced, run.timed = {}, [], timed_calls
        timed_calls.clear()

        def build_grouped(n, k, *, dtype, expected_m, num_groups, config=None):
            if config is not None:     # a forced tile: its own fake, damaged as tile_damage says
                tile = f"{config.block_m}x{config.block_n}"
                run.forced.append((tile, config, expected_m, num_groups))
                fake = _FakeGrouped(np, (tile_damage or {}).get(tile))
                fake.config = config
                return fake
            built.update(n=n, k=k, dtype=dtype, expected_m=expected_m, num_groups=num_groups)
            return gemm
        monkeypatch.setattr(deepgemm_jit, "build_grouped", build_grouped, raising=False)
        ctx = moe.Context(reps=30, warmup=1, seed=5, sizes_seed=0, rowwise=True, flusher=object(), tiles=tiles)
        run.rows = moe.run_case(case, ctx, 0)
        if gemm.scale_a is not None:  # fp8 rows
            built["scale_a"] = gemm.scale_a
        return run.rows[0], built, gemm.calls

    return run


@pytest.mark.torch
@pytest.mark.parametrize("index,sizes", [("offs", "even"), ("offs", "uneven"), ("m_indices", "uneven")])
def test_moe_row_contiguous_bf16_on_cpu(moe_cpu, index, sizes):
    from bench import moe
    case = moe.MoeCase("contiguous", index, sizes, "bf16", 3, 40, 64, 256)
    row, built, calls = moe_cpu(case)
    assert row["status"] == "ok", row.get("traceback") or row["note"]
    assert built == {"n": 64, "k": 256, "dtype": "bf16", "expected_m": 40, "num_groups": 3}
    assert calls[0] == [index]
    assert row["err"] < 1e-2 and sum(row["group_sizes"]) == row["valid_rows"] == 120
    assert set(row["contenders"]) == {"grouped", "loop"}
    assert all(c["err"] < 1e-2 for c in row["contenders"].values())
    assert row["baseline"].startswith("torch._grouped_mm") and row["ratio"] == pytest.approx(100 / 80)
    assert row["tflops"] == pytest.approx(2 * 120 * 64 * 256 / 80.0 / 1e6)
    assert row["contenders"]["loop"]["name"] == "torch.mm loop x3"
    if index == "m_indices":
        assert row["m_total"] == 3 * 128 and row["pad_rows"] == 3 * 128 - 120 and row["untouched_bad"] == 0
        assert "packed" in row["baseline"]
    else:
        assert row["m_total"] == 120 and row["pad_rows"] == 0


@pytest.mark.torch
def test_moe_row_masked_bf16_and_damage_on_cpu(moe_cpu):
    from bench import moe
    case = moe.MoeCase("masked", "masked_m", "random", "bf16", 3, 64, 64, 256)
    row, built, calls = moe_cpu(case)
    assert row["status"] == "ok", row.get("traceback") or row["note"]
    assert calls[0] == ["masked_m"] and row["max_m"] == 128 and row["m_total"] == 3 * 128
    assert row["pad_rows"] == 3 * 128 - row["valid_rows"] and row["untouched_bad"] == 0
    assert row["ratio"] == pytest.approx(100 / 80)
    row, _, _ = moe_cpu(case, damage="pad_written")
    assert row["status"] == "fail" and row["us"] is None and "padding" in row["note"] and row["untouched_bad"] == 64
    row, _, _ = moe_cpu(moe.MoeCase("contiguous", "m_indices", "uneven", "bf16", 3, 40, 64, 256), damage="pad_written")
    assert row["status"] == "fail" and row["untouched_bad"] == 64
    row, _, _ = moe_cpu(case, damage="wrong")
    assert row["status"] == "fail" and row["us"] is None and "not timed" in row["note"]


@pytest.mark.torch
@pytest.mark.parametrize("layout,index,sizes", [("masked", "masked_m", "random"), ("contiguous", "offs", "uneven")])
def test_moe_row_fp8_on_cpu(moe_cpu, layout, index, sizes):
    from bench import moe
    case = moe.MoeCase(layout, index, sizes, "fp8", 3, 64, 256, 384)
    row, built, calls = moe_cpu(case)
    assert row["status"] == "ok", row.get("traceback") or row["note"]
    assert built["dtype"] == "fp8" and calls[0] == sorted([index, "scale_a"])
    # scale_a as quantize returns it for all rows (M-major, columns padded to 4 rows), reshaped to (G, max_m, kb)
    # for masked calls without a copy: rows g * max_m + i still one run per K column (the bulk-copied layout).
    sa = built["scale_a"]
    rows = sa.shape[0] * (sa.shape[1] if sa.ndim == 3 else 1)
    assert sa.strides[-2:] == (4, 4 * (-(-rows // 4) * 4)), sa.strides
    if sa.ndim == 3:
        assert sa.strides[0] == 4 * sa.shape[1]
    assert row["err"] < 1e-2 and 0 < row["err_cos"] < 1e-2
    assert row["contenders"]["loop"]["err"] < 1e-2 and row["contenders"]["loop"]["same_recipe"]
    assert row["baseline"] == "fake F.scaled_mm(1x128,128x128) loop x3" and row["ratio"] == pytest.approx(1.5)
    # CPU torch has no _scaled_grouped_mm kernel: the row-wise contender is reported unavailable, never the baseline
    assert row["rowwise_us"] is None and any("_scaled_grouped_mm" in r for r in row["unavailable"])
    row, _, _ = moe_cpu(case, fp8_loop=False)                  # CPU torch refuses block scales: ours alone
    assert row["status"] == "ok" and row["ratio"] is None and "no baseline" in row["note"]


@pytest.mark.torch
def test_moe_row_tiles_on_cpu(moe_cpu):
    """--tiles: every forced tile built from the row's grouped spec, checked like ours, timed in the same call as
    ours and the baselines; one the spec cannot take is skipped with the reason; the row itself keeps its format."""
    from bench import moe
    case = moe.MoeCase("masked", "masked_m", "random", "fp8", 3, 64, 256, 384)
    plain, _, _ = moe_cpu(case)
    assert len(moe_cpu.rows) == 1 and "tile" not in plain                 # without --tiles: today's row
    tiles = ("128x64", "64x176", "128x256")
    row, built, calls = moe_cpu(case, tiles=tiles, tile_us={"t128x64": 96.0, "t64x176": 64.0})
    rows = moe_cpu.rows
    assert row["status"] == "ok", row.get("traceback") or row["note"]
    assert [r.get("tile") for r in rows] == ["auto", *tiles]
    assert set(row) == set(plain) | {"tile"} and row["tag"] == plain["tag"]
    assert row["us"] == 80.0 and row["ratio"] == pytest.approx(1.5) and row["err"] == plain["err"]
    assert "tile 128x256 skipped: sm90 tile 128x256 needs 256 accumulator registers" in row["note"]
    # forced configs: sm90_config on the row's grouped spec, the row's hints; the illegal one is never built
    assert [(t, c.block_k, e, g) for t, c, e, g in moe_cpu.forced] == [("128x64", 128, 64, 3), ("64x176", 128, 64, 3)]
    assert moe_cpu.forced[1][1] == moe.forced_config(case, "64x176")
    assert moe_cpu.timed == [["ours", "t128x64", "t64x176", "loop"]]     # one interleaved call for all
    t64, t176, t256 = rows[1:]
    assert t64["tag"] == case.tag + "_t128x64" and t64["config_fields"]["block_n"] == 64
    for r, us in ((t64, 96.0), (t176, 64.0)):
        assert r["status"] == "ok" and r["us"] == us and r["err"] < 1e-2 and 0 < r["err_cos"] < 1e-2
        assert r["untouched_bad"] == 0 and r["pad_rows"] == row["pad_rows"] and r["first_call_s"] is not None
        assert r["baseline_us"] == 120.0 and r["ratio"] == pytest.approx(120.0 / us)
        assert r["vs_auto"] == pytest.approx(80.0 / us) and r["contenders"] == {}
    assert t256["status"] == "skipped" and "accumulator" in t256["illegal"] and t256["us"] is None
    assert moe.is_run_ok(rows) and not moe.is_run_ok(rows + [dict(t256, illegal=None)])
    assert "fastest: 64x176 (1.250x auto)" in moe.tile_line(rows) and "128x256 illegal" in moe.tile_line(rows)

    # a tile that fails its check is not timed, the others are; the row stays ok and says so
    row, _, _ = moe_cpu(case, tiles=tiles, tile_damage={"128x64": "pad_written"})
    rows = moe_cpu.rows
    assert row["status"] == "ok" and "tile 128x64 failed its check (padding written)" in row["note"]
    assert rows[1]["status"] == "fail" and rows[1]["us"] is None and rows[1]["untouched_bad"] == case.n
    assert moe_cpu.timed == [["ours", "t64x176", "loop"]] and rows[2]["status"] == "ok"
    assert not moe.is_run_ok(rows)

    # the row's own tile fails: nothing is timed, the tiles that passed say why they were not
    row, _, _ = moe_cpu(case, damage="wrong", tiles=tiles)
    rows = moe_cpu.rows
    assert row["status"] == "fail" and moe_cpu.timed == [] and "not timed" in row["note"]
    assert [r["status"] for r in rows[1:]] == ["skipped", "skipped", "skipped"]
    assert "auto) tile failed its check" in rows[1]["note"] and rows[1]["err"] < 1e-2 and not rows[1]["illegal"]
    assert not moe.is_run_ok(rows)


def test_moe_tiles_option_list_and_forced_configs(capsys):
    import dataclasses

    from bench import moe
    from deepgemm_jit import config
    from deepgemm_jit.grouped import grouped_spec
    fp8 = moe.MoeCase("contiguous", "offs", "even", "fp8", 4, 8192, 4096, 7168)
    bf16 = dataclasses.replace(fp8, dtype="bf16")
    assert moe.forced_config(fp8, "128x176") == config.sm90_config(grouped_spec(4096, 7168, dtype="fp8"), 128, 176)
    assert moe.forced_config(fp8, "64x176s5").num_stages == 5 and moe.forced_config(bf16, "128x256").block_k == 64
    for tile, word in (("128x256", "accumulator"), ("128x128p", "cooperative"), ("128x128x", "BMxBN")):
        with pytest.raises(ValueError, match=word):
            moe.forced_config(fp8, tile)
    assert moe.main(["--list", "--only", "fp8_contig_offs_even_g4", "--tiles", "auto,128x176,128x256,64x128"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("fp8_contig_offs_even_g4x8192_n4096k7168")
    assert out[1].startswith("    tiles: auto, 128x176 (s4), 128x256 (illegal, skipped: sm90 tile 128x256 needs")
    assert out[1].endswith(", 64x128 (s8)")
    assert out[-2:] == ["tiles: auto + 3 forced per row; 2 of 6 forced tiles illegal for their row (reported "
                        "skipped)", "2 rows"]
    assert moe.main(["--list", "--tiles", "128x176,tuned"]) == 2       # build_grouped has no tune=
    assert "one of ['auto']" in capsys.readouterr().err
    assert moe.main(["--list", "--tiles", "128by176"]) == 2


def test_moe_summary_and_markdown_with_tiles():
    """Tile rows enter neither the summary, the bar, the main table nor the short table: the tile table only."""
    from bench import moe
    bar = moe.MoeCase("contiguous", "offs", "even", "fp8", 4, 8192, 4096, 7168)
    masked = moe.MoeCase("masked", "masked_m", "random", "bf16", 2, 256, 7168, 2048)

    def row(case, us, tile=None, status="ok", **extra):
        r = moe.empty_row(case) if tile in (None, "auto") else moe.tile_row(case, tile)
        sizes = moe.group_sizes(case)
        r.update(status=status, group_sizes=sizes, valid_rows=sum(sizes), err=3e-3, config="sm90_m128n176k128_s4_g16",
                 **extra)
        if tile == "auto":
            r["tile"] = "auto"
        if status == "ok":
            r.update(us=us, tflops=moe.valid_flops(case, sizes) / us / 1e6, baseline="loop", baseline_us=1500.0,
                     ratio=1500.0 / us)
        return r
    plain = [row(bar, 1400.0), row(masked, 50.0)]
    swept = [row(bar, 1400.0, "auto"), row(bar, 1700.0, "128x64"), row(bar, 1225.0, "128x160"),
             row(bar, None, "128x256", status="skipped", illegal="too many accumulators"),
             row(masked, 50.0, "auto"), row(masked, 40.0, "128x64", status="fail"), row(masked, 55.0, "128x160")]
    assert moe.summarize(swept) == moe.summarize(plain)
    assert moe.summarize(swept)["bar"]["fp8_contig_4x8192_n4096k7168_tflops"] == pytest.approx(
        2 * 32768 * 4096 * 7168 / 1400.0 / 1e6)
    assert moe.auto_rows(swept) == [swept[0], swept[4]] and moe.tile_table(plain) == []
    short = moe.short_table(swept)
    assert len(short.splitlines()) == 3 and "_t128x" not in short
    header = {"date": "2026-11-29T07:15:02+00:00", "gpu": "NVIDIA H200", "reps": 30, "command": "python -m bench.moe"}
    md = moe.markdown(header, swept, moe.summarize(swept))
    assert "## Tiles" not in moe.markdown(header, plain, moe.summarize(plain))
    main_body = [line for line in md.splitlines() if line.startswith(("| contiguous", "| masked"))]
    assert len(main_body) == 2
    table = md.split("## Tiles (--tiles)")[1].strip().splitlines()[2:]
    assert table[0] == "| row | auto | 128x64 | 128x160 | 128x256 | fastest |"
    assert table[2] == (f"| {bar.tag} | 1400.0 (128x176s4) | 1700.0 | **1225.0** | illegal | 128x160 (1.143x auto) |")
    assert table[3] == f"| {masked.tag} | **50.0** (128x176s4) | fail | 55.0 | - | auto |"
    assert all(line.count("|") == table[0].count("|") for line in table[:4])


def _cupy_on_numpy(monkeypatch, runner):
    """Stand-in `cupy` module backed by NumPy (streams and devices that do nothing), installed for the bench
    runner: lets a whole bench row run on the CPU."""
    import sys
    import types

    import numpy as np

    class CupyOnNumpy(types.ModuleType):
        def __getattr__(self, name):
            return getattr(np, name)

    shim = CupyOnNumpy("cupy")
    stream = types.SimpleNamespace(ptr=0, synchronize=lambda: None)
    shim.cuda = types.SimpleNamespace(Device=lambda *a: types.SimpleNamespace(synchronize=lambda: None),
                                      get_current_stream=lambda: stream)
    shim.random = types.SimpleNamespace(default_rng=np.random.default_rng)
    shim.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
    monkeypatch.setitem(sys.modules, "cupy", shim)
    monkeypatch.setattr(runner, "cupy", shim)
    return shim


def test_write_experiment_json(tmp_path):
    """The experiment scripts' --out: the folder is made, the rows land as JSON; without --out nothing is written."""
    report.write_experiment_json(str(tmp_path / "a" / "b"), "x.json", [{"us": 1.5}])
    assert json.loads((tmp_path / "a" / "b" / "x.json").read_text()) == [{"us": 1.5}]
    report.write_experiment_json(None, "y.json", [1])
    assert not list(tmp_path.glob("**/y.json"))


def test_experiment_helpers_time_checked_and_templates_tree(monkeypatch, tmp_path):
    """runner.time_checked: operands seeded by the problem's size, every contender checked, then timed interleaved,
    medians returned by name; runner.templates_tree points DEEPGEMM_JIT_TEMPLATES_DIR at a copy inside the block only
    (None: untouched). GPU parts replaced by recorders."""
    import os
    from types import SimpleNamespace

    from bench import runner

    seen = {}
    monkeypatch.setattr(runner.cupy.random, "default_rng", lambda seed: ("rng", seed))
    monkeypatch.setattr(runner, "operands", lambda info, spec, m, rng, b_scale: seen.update(rng=rng) or "inputs")
    monkeypatch.setattr(runner, "checked_contenders",
                        lambda gemms, inputs, m: ({**gemms, "cublas": "base"}, {name: 0.0 for name in gemms}))
    monkeypatch.setattr(runner.cupy.cuda, "Device", lambda: SimpleNamespace(synchronize=lambda: None))
    monkeypatch.setattr(runner.timing, "time_interleaved", lambda fns, reps, warmup: {
        name: SimpleNamespace(median_us=float(i + reps)) for i, name in enumerate(fns)})
    spec = SimpleNamespace(n=20, k=30)
    fns, errors, us = runner.time_checked({"a": "ga", "b": "gb"}, None, spec, 10, reps=5)
    assert seen["rng"] == ("rng", 60) and set(fns) == {"a", "b", "cublas"} and errors == {"a": 0.0, "b": 0.0}
    assert us == {"a": 5.0, "b": 6.0, "cublas": 7.0}
    monkeypatch.delenv("DEEPGEMM_JIT_TEMPLATES_DIR", raising=False)
    with runner.templates_tree(str(tmp_path)):
        assert os.environ["DEEPGEMM_JIT_TEMPLATES_DIR"] == str(tmp_path)
    assert "DEEPGEMM_JIT_TEMPLATES_DIR" not in os.environ
    with runner.templates_tree(None):
        assert "DEEPGEMM_JIT_TEMPLATES_DIR" not in os.environ


def test_host_header_needs_no_gpu_and_names_the_module():
    """bench.latency's JSON header (and the host part of every run's header): versions, commit and source hash,
    with the command of the module that ran, on a machine without a GPU."""
    h = report.collect_host_env(["--no-gpu"], module="bench.latency")
    assert h["command"].endswith("-m bench.latency --no-gpu"), h["command"]
    assert len(h["source_sha256"]) == 64 and h["python"] and h["deepgemm_jit"] and h["numpy"]
    assert set(h) <= set(report.HEADER_KEYS), set(h) - set(report.HEADER_KEYS)


def test_offline_compiles_every_kernel_the_rows_build(tmp_path, monkeypatch, capsys):
    """`python -m bench --offline` / `bench.moe --offline` (real NVRTC compiles, no GPU) leave in the kernel cache
    every kernel the rows build on the H200: afterwards, with DEEPGEMM_JIT_OFFLINE=1 (a missing kernel raises
    KernelNotCachedError), the builds the GPU run makes, heuristic and forced tiles, an epilogue row's plain GEMM,
    the grouped rows', all find theirs. A second --offline compiles nothing."""
    import dataclasses

    import deepgemm_jit as dg
    from bench import __main__ as bench_main
    from bench import moe
    from deepgemm_jit import jit

    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DEEPGEMM_JIT_OFFLINE", raising=False)
    jit._memo.clear()  # a kernel built earlier in this process would be served from memory, not the new cache
    dense = ["--suite", "deepseek", "--dtype", "fp8_block,bf16", "--only", "m4096n2112", "--tiles", "auto,128x128"]
    grouped = ["--dtype", "fp8", "--only", "masked_g1e256_n4096", "--tiles", "128x64"]
    assert bench_main.main(dense + ["--epilogue", "bias+gelu", "--offline"]) == 0  # plain rows only as baselines
    assert moe.main(grouped + ["--offline"]) == 0
    # A (K, M) A of M = 1 rows is staged by the row copy on every call (its rows are 2 bytes: TMA cannot read them).
    assert bench_main.main(["--suite", "seed", "--dtype", "bf16", "--layout", "tn", "--only", "m1n", "--offline"]) == 0
    out = capsys.readouterr().out
    assert "0 failed" in out and " compiled," in out, out

    jit._memo.clear()
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    cases = suites.expand(["deepseek"], ["fp8_block", "bf16"], tiles=("auto", "128x128"), epilogues=("bias+gelu",))
    cases = [c for c in cases if "m4096n2112" in c.tag]
    assert len(cases) == 4
    for case in cases:
        for c in dict.fromkeys((case, dataclasses.replace(case, epilogue=None))):
            spec = c.make_spec()
            cfg = (dg.config.choose_config(spec, c.m, "sm_90a", 132) if c.tiles == "auto"
                   else suites.forced_tile_config(spec, c.tiles))
            dg.build(c.m, c.n, c.k, arch="sm_90a", config=cfg, **{k: v for k, v in c.build_kwargs().items()
                                                                   if k != "tune"})
            dg.build(c.m, c.n, c.k, arch="sm_90a", **c.build_kwargs())
    row = next(r for r in moe.select(moe.parse_args(grouped)))
    dg.build_grouped(row.n, row.k, dtype=row.dtype, expected_m=row.rows, num_groups=row.groups, arch="sm_90a")
    dg.build_grouped(row.n, row.k, dtype=row.dtype, expected_m=row.rows, num_groups=row.groups, arch="sm_90a",
                     config=moe.forced_config(row, "128x64"))
    from deepgemm_jit import copies, quantization, warmup
    copies.get_kernel(copies.ROWS, "sm_90a")
    for granularity in ("group128", "block128", "row"):  # bench.moe's quantize calls on BF16 operands
        quantization.get_kernel(warmup.parse_quantize(f"bf16:fp8_e4m3/{granularity}"), "sm_90a")

    monkeypatch.delenv("DEEPGEMM_JIT_OFFLINE")
    assert bench_main.main(dense + ["--epilogue", "bias+gelu", "--offline"]) == 0
    assert " 0 compiled," in capsys.readouterr().out


def test_decode_rows_name_the_decode_kernel_that_ran(tmp_path, monkeypatch):
    """A call at M <= weight_streaming_max_m runs a decode kernel (gemv / gemv_kn), not the Gemm's tile: the row's
    config and, for epilogue rows, plain_config name it. plain_config named the plain GEMM's unused sm90 tile
    (review, session 60), so its overhead compared a decode kernel against a tile kernel under the tile's name."""
    import deepgemm_jit as dg
    from bench import runner

    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(tmp_path))
    plain = dg.build(1, 2112, 7168, dtype="bf16", arch="sm_90a")
    assert plain.weight_streaming_max_m >= 1
    assert runner._decode_kernel_tag(plain, 1).startswith("gemv")
    assert runner._decode_kernel_tag(plain, plain.weight_streaming_max_m + 1) is None
    fused = dg.build(1, 2112, 7168, dtype="bf16", epilogue="bias+gelu", arch="sm_90a")
    assert runner._decode_kernel_tag(fused, 1) is None   # fused epilogues run the tile kernel at every M
