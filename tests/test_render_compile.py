"""Rendering of every template combination, and real NVRTC compiles to sm_90a cubins."""
import dataclasses
import itertools

import jinja2
import pytest

from deepgemm_jit import GemmSpec, build, config, jit, render, sass, sm90_rules, sm90_tiles
from sm90_kernels import compiled_clean

DTYPES = ("fp16", "bf16", "tf32")
LAYOUTS = ("nt", "nn", "tn", "tt")
OUT = {"fp16": ("fp16", "bf16", "fp32"), "bf16": ("bf16", "fp16", "fp32"), "tf32": ("fp32", "bf16")}


def all_variants():
    for dt, layout in itertools.product(DTYPES, LAYOUTS):
        for out_dtype in OUT[dt]:
            spec = GemmSpec.create(1001, 1003 if dt != "tf32" else 1000, dtype=dt, out_dtype=out_dtype,
                                   layout=layout)
            for m_hint in (16, 4096):
                yield spec, config.choose_sm80_config(spec, m_hint, "sm_90a")


def test_render_every_combination():
    seen = set()
    for spec, cfg in all_variants():
        for vec in {1, 16 // (4 if spec.dtype == "tf32" else 2)}:
            cfg_v = dataclasses.replace(cfg, vec_a=vec, vec_b=vec)
            src = jit.render_kernel(spec, cfg_v)
            assert f"constexpr int kN = {spec.n};" in src.source
            assert f"constexpr int kVecA = {vec};" in src.source
            assert ("kAKMajor = true" in src.source) == spec.a_k_major
            assert [name for name, _ in src.headers] == ["dgjit/common.cuh", "dgjit/gemm_sm80.cuh",
                                                         "dgjit/ptx_sm80.cuh"]
            assert "{{" not in src.source and "{%" not in src.source
            seen.add(src.source)
    assert len(seen) > 40


def test_render_is_strict():
    with pytest.raises(jinja2.UndefinedError):
        render.render("gemm_sm80.cu.j2", "k", spec=GemmSpec.create(8, 8), tag="x")  # no cfg


def test_headers_are_collected_transitively():
    src = jit.render_kernel(*next(all_variants()))
    names = dict(src.headers)
    assert '#include "dgjit/ptx_sm80.cuh"' in names["dgjit/gemm_sm80.cuh"]
    assert "dgjit/common.cuh" in names  # only reachable through the other two


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_compile_sm90a_no_local_memory(dt, layout, shared_cache_dir, monkeypatch):
    """Real NVRTC compile of every dtype x layout (aligned and odd shapes), SASS checked; the odd shape also with the
    portable kernel a misaligned call may fall back to (Gemm._stages)."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    odd_spec = GemmSpec.create(33, 65, dtype=dt, layout=layout)
    for m, n, k, cfg in ((4096, 4096, 4096, None), (17, 33, 65, None),
                         (17, 33, 65, config.choose_sm80_config(odd_spec, 17, "sm_90a"))):
        g = build(m, n, k, dtype=dt, layout=layout, arch="sm_90a", config=cfg)
        info = g.explain()
        case = f"{dt=} {layout=} {m=} {n=} {k=} {g.config.tag}"
        assert info["local_bytes"] == 0, case
        assert info["spill_bytes"] == 0, case
        assert "STL" not in info["sass"] and "LDL" not in info["sass"], case
        if g.family == "sm90":
            assert info["sass"].get("HGMMA", 0) > 0, case  # warpgroup MMA
            assert info["sass"].get("UTMALDG", 0) > 0 and info["sass"].get("UTMASTG", 0) > 0, case
        else:
            assert info["sass"].get("HMMA", 0) > 0, case  # tensor cores do the math
        if (m, n, k) == (4096, 4096, 4096) and g.family == "sm80":
            assert info["sass"].get("LDGSTS", 0) > 0, case  # cp.async pipeline
        # Hopper takes every problem on sm_90a (misaligned rows copied per call, Gemm._stages; TF32 MN-major
        # operands transposed for the nt kernel, sm90_rules.kernel_spec, except at small M an nn B, which the kernel
        # transposes, and tn, which runs that nn kernel on a transposed copy of A); the portable kernel only when
        # forced here.
        assert g.family == ("sm90" if cfg is None else "sm80"), case
        expected = layout
        if dt == "tf32" and cfg is None and layout != "nt":
            expected = "nn" if layout in ("nn", "tn") and m <= sm90_rules.SM90_TF32_TRANS_B_MAX_M else "nt"
        assert g.kernel_spec.layout == expected, case
        assert g.artifact.cubin[:4] == b"\x7fELF"


def test_explain_json_keys(shared_cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    info = build(64, 128, 256, dtype="bf16", arch="sm_90a").explain()
    for key in ("family", "config", "registers", "shared_bytes", "local_bytes", "sass", "cubin"):
        assert key in info
    assert info["family"] == "sm90" and info["registers"] > 0 and info["shared_bytes"] > 0
    # The evict-first rule for B, read from the kernel (gemm_sm90.cuh kStreamBMaxReaders): 64 rows are one M block.
    assert info["b_evict_first"] == {"max_m_blocks": 4, "max_rows": 4 * info["config"]["block_m"], "per": "call",
                                     "at_m_hint": True}
    big = build(4096, 4096, 7168, dtype="bf16", arch="sm_90a").explain()["b_evict_first"]
    assert big["at_m_hint"] is False
    # Edge maps (launch.edge_maps): B's box rows, and whether A's partial last M block has its own map.
    edges = build(400, 2112, 7168, dtype="bf16", arch="sm_90a").explain()
    cfg = edges["config"]
    assert edges["edge_maps"] == {"a_rows_at_m_hint": 400 % cfg["block_m"] if cfg["block_n"] <= 176 else 0,
                                  "a_max_block_n": 176, "a_wide": {"max_last_band": 3, "max_rows": 32},
                                  "b_rows": 2112 % cfg["block_n"]}


def test_sass_opcode_parser():
    fake = """
        /*0070*/                   NOP ;
        /*0080*/              @!P0 BRA 0x70 ;
        /*0090*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*00a0*/              @UP0 HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*00b0*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
    """
    import collections
    counts = collections.Counter(m.group(1) for m in sass._INSTR.finditer(fake))
    assert counts == {"NOP": 1, "BRA": 1, "HMMA": 2, "HGMMA": 1}


SM90_VARIANTS = [  # (dtype, out_dtype, block_m, block_n, d_ring)
    ("bf16", "bf16", 128, 256, 0), ("bf16", "fp32", 128, 208, 0), ("bf16", "bf16", 128, 176, 0),
    ("fp16", "fp16", 128, 144, 0), ("fp16", "bf16", 64, 112, 0), ("bf16", "fp16", 64, 56, 0),
    ("bf16", "bf16", 64, 8, 0), ("tf32", "fp32", 128, 176, 0), ("tf32", "bf16", 64, 72, 0),
    ("tf32", "fp32", 128, 256, 2), ("tf32", "fp32", 64, 96, 2), ("tf32", "fp32", 128, 160, 3),
    ("tf32", "fp32", 128, 176, 4),
    ("bf16", "fp32", 128, 128, 2),
    ("bf16", "bf16", 128, 240, 2), ("fp16", "fp16", 128, 224, 4), ("bf16", "bf16", 128, 256, 2),
    ("bf16", "bf16", 192, 192, 0), ("fp16", "fp32", 192, 128, 0), ("bf16", "bf16", 192, 192, 2),
    ("fp16", "fp16", 192, 64, 0),
]


@pytest.mark.parametrize("dtype,out_dtype,block_m,block_n,d_ring", SM90_VARIANTS)
def test_sm90_variant_matrix(dtype, out_dtype, block_m, block_n, d_ring, shared_cache_dir, monkeypatch):
    """Every sm90 variant: HGMMA and TMA in the SASS, no local memory, setmaxnreg kept; D leaves by TMA stores
    (one per 128-byte slice where D goes through a ring of slices) and no other global store; one
    griddepcontrol.wait (ACQBULK) before the roles start."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    spec = GemmSpec.create(1024, 2048, dtype=dtype, out_dtype=out_dtype)
    esize = 4 if dtype == "tf32" else 2
    stages = sm90_rules.sm90_stages(spec, block_m, block_n, d_ring=d_ring)
    cfg = config.KernelConfig("sm90", block_m, block_n, 128 // esize, min(stages, 4), 2, 1, 16 // esize,
                              16 // esize, group_m=16, d_ring=d_ring)
    art, mix, case = compiled_clean(spec, cfg)
    assert mix.get("HGMMA", 0) > 0 and mix.get("UTMALDG", 0) > 0, case
    assert mix.get("UTMASTG", 0) > 0 and mix.get("STG", 0) == 0, (case, mix)
    out_esize = 4 if out_dtype == "fp32" else 2
    if d_ring:  # the slices' stores are issued from the epilogue's column loop, one per slice
        assert mix["UTMASTG"] == block_n * out_esize // sm90_tiles.sm90_d_slice_bytes(block_n, out_esize), (case, mix)
    assert sass.tma_loads(art.cubin)[1] == 1, case  # B's box in its evict-first form (kStreamBMaxReaders)
    assert mix.get("USETMAXREG", 0) > 0 and "C7508" not in art.meta["log"], case
    assert mix.get("ACQBULK", 0) == 1, case  # griddepcontrol.wait: staged calls launch it programmatically
    # Python's view of the layout and the compiled kernel's agree (read from the cubin on the host).
    from deepgemm_jit import launch
    sym = launch.sm90_symbols(art)
    slice_bytes = sm90_tiles.sm90_d_slice_bytes(block_n, out_esize)
    assert sym["smem_bytes"] == cfg.smem_bytes(spec), case
    assert cfg.smem_bytes(spec) < sm90_tiles.sm90_smem_bytes(spec, block_m, block_n, cfg.num_stages) or not d_ring, case
    assert sym["num_threads"] == cfg.num_threads == (512 if block_m == 192 else 384), case  # 192: three consumers
    assert sym["d_box_cols"] * out_esize == slice_bytes, case
    assert sym["d_box_rows"] == (64 if block_m in (64, 192) else block_m // 2), case
    assert sym["d_swizzle_bytes"] == (slice_bytes if slice_bytes >= 32 else 0), case
    assert launch.takes(art, "programmatic_launch"), case  # the ACQBULK above: LaunchPlan.waits
    launch.check_layout(art, spec)


def test_sm90_rejections():
    spec = GemmSpec.create(1024, 2048, dtype="bf16")
    ok = config.choose_sm90_config(spec, 4096, 132)
    with pytest.raises(ValueError, match="sm_90a"):
        ok.check_for(spec, "sm_80")
    with pytest.raises(ValueError, match="layout"):
        ok.check_for(GemmSpec.create(1024, 2048, dtype="tf32", layout="tn"), "sm_90a")
    with pytest.raises(ValueError, match="block_k"):
        dataclasses.replace(ok, block_k=32).check_for(spec, "sm_90a")
    with pytest.raises(ValueError, match="shared memory"):
        dataclasses.replace(ok, num_stages=8).check_for(spec, "sm_90a")


@pytest.mark.parametrize("dtype,epilogue,block_n", [
    ("bf16", "bias+gelu", 192), ("fp16", "bias+silu+residual", 128), ("bf16", "geglu+residual", 192),
    ("fp16", "quant_fp8_tensor", 192), ("bf16", "bias+swiglu", 192), ("bf16", "bias+gelu+quant_fp8_g128", 128),
    ("fp16", "beta+bias", 128)])
def test_192_row_tiles_with_epilogues_compile(dtype, epilogue, block_n, shared_cache_dir, monkeypatch):
    """Three consumers with fused epilogues at the widest tile config allows: no local memory, stack or wgmma
    serialisation (192x192 with C or a residual kept 24-136 bytes on the stack: sm90_tiles.sm90_max_accumulators)."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    spec = GemmSpec.create(4096, 7168, dtype=dtype, epilogue=epilogue)
    _, mix, case = compiled_clean(spec, config.sm90_config(spec, 192, block_n))
    assert mix.get("HGMMA", 0) > 0, case


def test_192_row_tiles_rules():
    """192-row tiles (three consumers, 128 registers a thread): 16-bit nt dense cooperative unsplit tiles of at most
    96 accumulators (64 with C / a residual), named in the error before anything is compiled."""
    bf16 = GemmSpec.create(1024, 2048, dtype="bf16")
    ok = config.sm90_config(bf16, 192, 192)
    ok.check_for(bf16, "sm_90a")
    assert ok.num_threads == 512 and sm90_tiles.sm90_consumers(192, False) == (3, 64)
    assert sm90_tiles.sm90_accumulators(192, 192, False) == 96
    with pytest.raises(ValueError, match="accumulator"):
        config.sm90_config(bf16, 192, 208, 2).check_for(bf16, "sm_90a")
    for spec, match in ((GemmSpec.create(1024, 2048, dtype="tf32"), "dtype 'tf32'"),
                        (GemmSpec.create(1024, 2048, dtype="fp8", scaling="block"), "dtype 'fp8_e4m3'"),
                        (GemmSpec.create(1024, 2048, dtype="bf16", layout="nn"), "layout 'nn'"),
                        (GemmSpec.create(1024, 2048, dtype="bf16", grouped=True), "grouped")):
        esize = 4 if spec.dtype == "tf32" else 1 if spec.dtype.startswith("fp8") else 2
        cfg = dataclasses.replace(ok, block_k=128 // esize, vec_a=16 // esize, vec_b=16 // esize)
        with pytest.raises(ValueError, match=f"192-row tiles.*{match}"):
            cfg.check_for(spec, "sm_90a")
    for cfg in (dataclasses.replace(ok, pingpong=True), dataclasses.replace(ok, split_k=True)):
        with pytest.raises(ValueError, match="192-row tiles.*ping-pong or split-K"):
            cfg.check_for(bf16, "sm_90a")
    residual = GemmSpec.create(1024, 2048, dtype="bf16", epilogue="bias+relu+residual")
    with pytest.raises(ValueError, match="at most 64 fit"):
        config.sm90_config(residual, 192, 192, 2).check_for(residual, "sm_90a")
    config.sm90_config(residual, 192, 128).check_for(residual, "sm_90a")


SWAP_AB_VARIANTS = [  # (dtype, out_dtype, block_m, block_n): swapped tiles, block_m any multiple of 8
    ("bf16", "bf16", 88, 192), ("fp16", "fp16", 192, 192), ("bf16", "fp16", 136, 128), ("fp16", "bf16", 256, 128),
    ("bf16", "bf16", 40, 64), ("bf16", "bf16", 8, 64), ("fp16", "fp16", 152, 64)]
# FP8 (spec keywords, block_m, block_n, the wgmmas' N per issue): promoted tiles of up to 128 rows keep two partial
# sets (whole N), wider ones two uneven halves (152: 80 + 72), unpromoted ones one straight K loop; E4M3 x E5M2
# issues E5M2 x E4M3 (B's rows are the instruction's A).
SWAP_AB_FP8_VARIANTS = [
    (dict(scaling="tensor"), 88, 128, {"QGMMA.64x88x32.F32.E4M3.E4M3": 16}),
    (dict(scaling="row"), 152, 128, {"QGMMA.64x80x32.F32.E4M3.E4M3": 8, "QGMMA.64x72x32.F32.E4M3.E4M3": 8}),
    (dict(scaling="tensor", out_dtype="fp16"), 176, 64, {"QGMMA.64x88x32.F32.E4M3.E4M3": 16}),
    (dict(scaling="row", b_dtype="fp8_e5m2"), 8, 64, {"QGMMA.64x8x32.F32.E5M2.E4M3": 16}),
    (dict(scaling="tensor", fast_accum=True), 200, 128, {"QGMMA.64x200x32.F32.E4M3.E4M3": 4}),
    # with an epilogue (a bias and an activation): two sets up to 128 rows, one above (halves ran slower there)
    (dict(scaling="tensor", epilogue="bias+gelu"), 152, 128, {"QGMMA.64x152x32.F32.E4M3.E4M3": 4}),
    (dict(scaling="row", epilogue="bias_row+silu"), 88, 64, {"QGMMA.64x88x32.F32.E4M3.E4M3": 16}),
]


def _swap_ab_compiled(spec, block_m, block_n, cache_dir, monkeypatch):
    """A swapped tile's artifact, after the checks every swapped variant passes (compiled_clean's too): D staged by
    transposing stmatrix (STSM, one per two 8-row groups) and stored by one TMA box per consumer;
    the exported layout (D box of 64 columns x block_m rows, a consumer per 64 columns) as config says."""
    from deepgemm_jit import launch

    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(cache_dir))
    cfg = config.sm90_config(spec, block_m, block_n, swap_ab=True)
    art, mix, case = compiled_clean(spec, cfg)
    assert cfg.tag.endswith("_sw") and cfg.d_ring == 0, case
    assert mix.get("UTMASTG", 0) == 1 and mix.get("STG", 0) == 0, (case, mix)
    assert mix.get("STSM", 0) == -(-block_m // 16), (case, mix)
    sym = launch.sm90_symbols(art)
    assert sym["smem_bytes"] == cfg.smem_bytes(spec), case
    assert sym["num_threads"] == cfg.num_threads == (512 if block_n == 192 else 384), case
    assert (sym["d_box_cols"], sym["d_box_rows"], sym["d_swizzle_bytes"]) == (64, block_m, 128), case
    launch.check_layout(art, spec)
    return art, mix, case


@pytest.mark.parametrize("dtype,out_dtype,block_m,block_n,epilogue", [
    *(v + ("none",) for v in SWAP_AB_VARIANTS),
    ("bf16", "bf16", 88, 192, "bias+gelu"), ("fp16", "fp16", 152, 128, "bias_row+gelu_tanh"),
    ("bf16", "fp16", 256, 128, "relu"), ("bf16", "bf16", 192, 192, "bias+sigmoid"), ("fp16", "fp16", 8, 64, "silu")])
def test_swap_ab_variants_compile(dtype, out_dtype, block_m, block_n, epilogue, shared_cache_dir, monkeypatch):
    """Swapped 16-bit tiles (KernelConfig.swap_ab): HGMMA of the instruction N block_m, and _swap_ab_compiled's
    checks, also with the epilogues they take (a column or row bias, an activation)."""
    spec = GemmSpec.create(1000, 2048, dtype=dtype, out_dtype=out_dtype, epilogue=epilogue)
    art, mix, case = _swap_ab_compiled(spec, block_m, block_n, shared_cache_dir, monkeypatch)
    assert mix.get("HGMMA", 0) == 4, (case, mix)
    assert f"HGMMA.64x{block_m}x16" in sass.disassemble(art.cubin), case


@pytest.mark.parametrize("kwargs,block_m,block_n,qgmma", SWAP_AB_FP8_VARIANTS)
def test_swap_ab_fp8_variants_compile(kwargs, block_m, block_n, qgmma, shared_cache_dir, monkeypatch):
    """Swapped FP8 tiles with per-tensor / per-row scales: the QGMMA shapes and operand types of their K loop
    (SWAP_AB_FP8_VARIANTS), and _swap_ab_compiled's checks."""
    import collections
    import re

    spec = GemmSpec.create(1000, 2048, dtype="fp8", **kwargs)
    art, _, case = _swap_ab_compiled(spec, block_m, block_n, shared_cache_dir, monkeypatch)
    found = collections.Counter(re.findall(r"QGMMA\.[0-9x]+\.F32\.E[0-9M]+\.E[0-9M]+", sass.disassemble(art.cubin)))
    assert dict(found) == qgmma, (case, found)
    two = sm90_tiles.sm90_two_partial_sets(spec, block_m, block_n, False, True)
    half = sm90_tiles.sm90_half_partial_sets(spec, block_m, block_n, False, True)
    assert (two, half) == (spec.promote and block_m <= 128,
                           spec.promote and block_m > 128 and spec.epi.is_identity), case


def test_swap_ab_rules():
    """Swapped tiles: 16-bit inputs or FP8 with per-tensor / per-row scales, a 16-bit D, layout nt, dense, a bias
    and an activation at most, cooperative unsplit whole-tile D; block_n 64 / 128 / 192 (FP8: 64 / 128) and block_m a multiple of 8
    within the accumulators (96 a thread with three consumers, 176 in two sets for promoted FP8), named in the error
    before anything is compiled."""
    bf16 = GemmSpec.create(1024, 2048, dtype="bf16")
    config.sm90_config(bf16, 88, 192, swap_ab=True).check_for(bf16, "sm_90a")
    config.sm90_config(bf16, 256, 128, swap_ab=True).check_for(bf16, "sm_90a")
    for bm, bn, match in ((88, 176, "block_n 64, 128 or 192"), (200, 192, "multiple of 8 up to 192"),
                          (264, 128, "up to 256")):
        with pytest.raises(ValueError, match=match):
            config.sm90_config(bf16, bm, bn, 2, swap_ab=True).check_for(bf16, "sm_90a")
    with pytest.raises(ValueError, match="block_m=84 is not a multiple of 8"):
        config.sm90_config(bf16, 84, 128, 2, swap_ab=True)
    for spec, match in ((GemmSpec.create(1024, 2048, dtype="tf32"), "dtype 'tf32'"),
                        (GemmSpec.create(1024, 2048, dtype="bf16", out_dtype="fp32"), "out_dtype 'fp32'"),
                        (GemmSpec.create(1024, 2048, dtype="fp8", scaling="block"), "dtype 'fp8_e4m3'"),
                        (GemmSpec.create(1024, 2048, dtype="fp8", scaling="tensor", out_dtype="fp32"),
                         "out_dtype 'fp32'"),
                        (GemmSpec.create(1024, 2048, dtype="bf16", layout="tn"), "layout 'tn'"),
                        (GemmSpec.create(1024, 2048, dtype="bf16", grouped=True), "grouped"),
                        (GemmSpec.create(1024, 2048, dtype="bf16", epilogue="bias+residual"),
                         "epilogue 'bias\\+residual'"),
                        (GemmSpec.create(1024, 2048, dtype="bf16", epilogue="swiglu"), "epilogue 'swiglu'"),
                        (GemmSpec.create(1024, 2048, dtype="bf16", epilogue="beta"), "epilogue 'beta'"),
                        (GemmSpec.create(1024, 2048, dtype="fp8", scaling="tensor", epilogue="quant_fp8_tensor"),
                         "out_dtype 'fp8_e4m3'")):
        esize = 4 if spec.dtype == "tf32" else 1 if spec.dtype.startswith("fp8") else 2
        cfg = config.sm90_config(bf16, 88, 128, 2, swap_ab=True)
        cfg = dataclasses.replace(cfg, block_k=128 // esize, vec_a=16 // esize, vec_b=16 // esize)
        with pytest.raises(ValueError, match=f"swapped tiles.*{match}"):
            cfg.check_for(spec, "sm_90a")
    # FP8 (per-tensor / per-row): two consumers at most (as 192-row tiles), 176 rows promoted (two accumulator sets)
    fp8 = GemmSpec.create(1024, 2048, dtype="fp8", scaling="row")
    fast = GemmSpec.create(1024, 2048, dtype="fp8", scaling="tensor", fast_accum=True)
    config.sm90_config(fp8, 176, 128, swap_ab=True).check_for(fp8, "sm_90a")
    config.sm90_config(fast, 256, 64, swap_ab=True).check_for(fast, "sm_90a")
    for spec, bm, bn, match in ((fp8, 88, 192, "fp8_e4m3 take block_n 64 or 128"), (fp8, 184, 128, "up to 176"),
                                (fast, 264, 64, "up to 256")):
        with pytest.raises(ValueError, match=match):
            config.sm90_config(spec, bm, bn, 2, swap_ab=True).check_for(spec, "sm_90a")
    ok = config.sm90_config(bf16, 88, 128, 2, swap_ab=True)
    for kw in (dict(pingpong=True), dict(split_k=True), dict(d_ring=2)):
        with pytest.raises(ValueError, match="swap_ab tiles"):
            dataclasses.replace(ok, **kw)


def test_templates_dir_override(tmp_path, monkeypatch, cache_dir):
    import shutil
    copy = tmp_path / "tpl"
    shutil.copytree(render.templates_dir(), copy)
    (copy / "include" / "dgjit" / "common.cuh").write_text(
        (copy / "include" / "dgjit" / "common.cuh").read_text() + "\n// experiment\n")
    base_key = build(64, 64, 64, dtype="bf16", arch="sm_90a").artifact.key
    monkeypatch.setenv("DEEPGEMM_JIT_TEMPLATES_DIR", str(copy))
    render._environment.cache_clear()
    jit.clear_memo()
    assert build(64, 64, 64, dtype="bf16", arch="sm_90a").artifact.key != base_key
    monkeypatch.setenv("DEEPGEMM_JIT_TEMPLATES_DIR", str(tmp_path / "missing"))
    jit.clear_memo()
    with pytest.raises(FileNotFoundError, match="DEEPGEMM_JIT_TEMPLATES_DIR"):
        build(64, 64, 72, dtype="bf16", arch="sm_90a")
    render._environment.cache_clear()


def test_cubin_symbol_reader_rejects_what_it_cannot_read():
    from deepgemm_jit import cubin
    with pytest.raises(ValueError, match="ELF64"):
        cubin.read_u32_symbols(b"not an elf", ("x",))


def test_cubin_section_holds_the_kernels_sass(shared_cache_dir, monkeypatch):
    """cubin.section(".text.<entry>") is where the disassembly's instructions are (16 bytes each, in order)."""
    import re
    import struct

    from deepgemm_jit import cubin, sass
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    art = build(64, 64, 64, dtype="bf16", arch="sm_90a").artifact
    listing = sass.disassemble(art.cubin)
    function = re.search(r"Function : (\S+)", listing).group(1)
    words = [int(w, 16) for w in re.findall(r"/\* (0x[0-9a-f]{16}) \*/", listing)]
    offset, size = cubin.section(art.cubin, f".text.{function}")
    assert size == 8 * len(words) and size > 0
    assert list(struct.unpack_from(f"<{len(words)}Q", art.cubin, offset)) == words
    with pytest.raises(ValueError, match="no section"):
        cubin.section(art.cubin, ".text.not_a_kernel")


def test_a_box_rows_shrinks_to_m_for_single_tile_problems(shared_cache_dir, monkeypatch):
    """launch.a_box_rows: A's TMA box is M rows when a dense K-major A has fewer rows than one tile (no zero fill of
    the rows past M on every K block), else the tile's block_m; the kernel exports that it takes the argument."""
    from deepgemm_jit import cubin, launch

    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    spec = GemmSpec.create(7168, 4096, dtype="fp8", scaling="tensor")
    cfg = config.sm90_config(spec, 64, 56)
    art = jit.get_kernel(spec, cfg, "sm_90a")
    assert cubin.entry_symbols(art.cubin, art.entry, ("takes_a_box_rows",)) == {"takes_a_box_rows": 1}
    assert [launch.a_box_rows(art, spec, m) for m in (1, 24, 63, 64, 65, 4096)] == [1, 24, 63, 64, 64, 64]
    grouped = GemmSpec.create(7168, 4096, dtype="fp8", scaling="block", grouped=True)
    art_g = jit.get_kernel(grouped, config.sm90_config(grouped, 128, 128), "sm_90a")
    assert launch.a_box_rows(art_g, grouped, 24) == 128  # tiles at many row offsets: whole boxes
    mn_major = GemmSpec.create(1024, 512, dtype="bf16", layout="tn")
    art_mn = jit.get_kernel(mn_major, config.sm90_config(mn_major, 64, 64), "sm_90a")
    assert not mn_major.a_k_major and launch.a_box_rows(art_mn, mn_major, 24) == 64


def test_edge_maps_for_partial_last_blocks(shared_cache_dir, monkeypatch):
    """launch.edge_maps: dense kernels take A's and B's edge maps last; A's has M % block_m rows for a multi-tile A
    with a partial last M block on tiles up to A_EDGE_MAX_BLOCK_N wide, or wider where launch.a_edge_used allows (0
    rows otherwise; a_box_rows covers a single tile), B's N % block_n rows. Grouped kernels take none."""
    from deepgemm_jit import cubin, launch

    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    spec = GemmSpec.create(7168, 4096, dtype="fp8", scaling="tensor")
    art = jit.get_kernel(spec, config.sm90_config(spec, 64, 56), "sm_90a")
    assert cubin.entry_symbols(art.cubin, art.entry, ("takes_edge_maps",)) == {"takes_edge_maps": 1}
    assert [launch.a_edge_rows(art, spec, m) for m in (1, 63, 64, 65, 400, 4096)] == [0, 0, 0, 1, 16, 0]
    assert launch.b_edge_rows(art, spec) == 0  # 7168 = 128 x 56
    odd_n = GemmSpec.create(2112, 7168, dtype="bf16")
    assert launch.b_edge_rows(jit.get_kernel(odd_n, config.sm90_config(odd_n, 128, 128), "sm_90a"), odd_n) == 64
    wide = jit.get_kernel(odd_n, config.sm90_config(odd_n, 128, 240), "sm_90a")  # past launch.A_EDGE_MAX_BLOCK_N
    assert launch.b_edge_rows(wide, odd_n) == 2112 % 240
    # Wider tiles: only with at most 3 M blocks in the last raster band (16 M blocks a band) and at most 32 rows in
    # the edge block: 129, 160, 257 and 2049 rows (17 M blocks) yes; 200 (72 rows), 300 (44), 400 (4 M blocks),
    # 1025 (9) and 2600 rows (21: a band of 5) no.
    assert [launch.a_edge_rows(wide, odd_n, m) for m in (129, 160, 200, 257, 300, 400, 1025, 2049, 2600, 4096)] == [
        1, 32, 0, 1, 0, 0, 0, 1, 0, 0]
    grouped = GemmSpec.create(7168, 4096, dtype="fp8", scaling="block", grouped=True)
    art_g = jit.get_kernel(grouped, config.sm90_config(grouped, 128, 128), "sm_90a")
    assert cubin.optional_entry_symbol(art_g.cubin, art_g.entry, "takes_edge_maps") is None
    assert launch.a_edge_rows(art_g, grouped, 400) == 0 and launch.b_edge_rows(art_g, grouped) == 0
    mn_major = GemmSpec.create(1000, 512, dtype="bf16", layout="tt")  # A MN-major, B K-major
    art_mn = jit.get_kernel(mn_major, config.sm90_config(mn_major, 64, 64), "sm_90a")
    assert launch.a_edge_rows(art_mn, mn_major, 400) == 0 and launch.b_edge_rows(art_mn, mn_major) == 1000 % 64


def test_an_unwritable_temp_folder_does_not_hide_the_compile_error(tmp_path, monkeypatch):
    """The failing source is kept in the temp folder for inspection; where that folder cannot be written (another
    user's), the CompileError with NVRTC's log still surfaces (the OSError was reported as a cache problem and the
    kernel compiled twice: review)."""
    import tempfile

    from deepgemm_jit import compiler
    from deepgemm_jit.errors import CompileError

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(blocker))
    bad = render.RenderedSource("bad.cu", 'extern "C" __global__ void k() { this is not C++; }', (), "k")
    with pytest.raises(CompileError) as info:
        compiler.compile_cubin(bad, "sm_90a")
    assert info.value.source_path is None and info.value.log
