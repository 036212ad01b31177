"""CPU-only tests of the bench's pure-Python parts: `pytest bench/test_bench_cpu.py` (no GPU touched)."""
from __future__ import annotations

import json
import math

import pytest

from bench import metrics, report, suites
from bench import dtypes as bench_dtypes


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


def test_write_all_files(tmp_path):
    rows = [_row(), _row(m=1, us=19.0, base_us=18.8), _row(status="error")]
    paths = report.write_all(tmp_path, _header(), rows)
    assert json.loads(paths["json"].read_text())["rows"][0]["ratio"] == pytest.approx(0.95)
    assert paths["md"].read_text().startswith("# deepgemm-jit bench: square")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib" in paths["plot_skipped"]
    else:
        assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
