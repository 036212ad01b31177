"""Fused epilogues on the CPU: the description (object and string), spec rules, and real sm_90a compiles of every
dtype family x epilogue with SASS checks (no local memory, no wgmma serialisation)."""
import itertools
import re
import types

import numpy as np
import pytest

from deepgemm_jit import (Epilogue, GemmSpec, build, config, deinterleave_gate_up, interleave_gate_up, jit, launch,
                          reference, sass)
from deepgemm_jit.epilogue import canonical
from sm90_kernels import compiled_clean
from deepgemm_jit import sm90_rules, sm90_tiles


def test_parse_and_canonical_text():
    assert Epilogue.parse("bias+gelu") == Epilogue(bias="col", activation="gelu")
    assert Epilogue.parse("GELU + bias") == Epilogue(bias="col", activation="gelu")  # order and case do not matter
    assert Epilogue.parse("residual+relu+bias_row+beta") == Epilogue("row", "relu", True, True)
    assert Epilogue.parse("") == Epilogue.parse("none") == Epilogue()
    for e in (Epilogue(), Epilogue("col", "silu"), Epilogue("row", "gelu_tanh", True, True), Epilogue(beta=True)):
        assert Epilogue.parse(e.text) == e
    assert canonical(None) == "none" and canonical("gelu+bias") == "bias+gelu"
    assert canonical(Epilogue(activation="sigmoid", residual=True)) == "sigmoid+residual"


@pytest.mark.parametrize("text,match", [
    ("bias+gelu+relu", "more than one activation"),
    ("bias+bias_row", "more than one bias"),
    ("tanh", "unknown word"),
    ("quant_fp8", "ambiguous"),
    ("swiglu+gelu", "drop 'gelu'"),
    ("beta+geglu", "beta"),
    ("quant_fp8_g128+residual", "does not combine"),
    ("swiglu+geglu", "more than one gate"),
])
def test_parse_errors(text, match):
    with pytest.raises(ValueError, match=match):
        Epilogue.parse(text)


def test_object_errors():
    with pytest.raises(ValueError, match="bias"):
        Epilogue(bias="column")
    with pytest.raises(ValueError, match="activation"):
        Epilogue(activation="tanh")
    with pytest.raises(TypeError, match="residual"):
        Epilogue(residual=1)
    with pytest.raises(TypeError, match="epilogue"):
        Epilogue.parse(3)


def test_spec_rules():
    s = GemmSpec.create(300, 1000, "bf16", epilogue="bias+gelu")
    assert s.epilogue == "bias+gelu" and "ep_bias_gelu" in s.tag and s.epi.activation == "gelu"
    assert GemmSpec.create(300, 1000, "bf16", epilogue=Epilogue(residual=True)).epilogue == "residual"
    with pytest.raises(ValueError, match="int32"):
        GemmSpec.create(300, 1024, "int8", epilogue="relu")
    with pytest.raises(ValueError, match="layout"):  # MN-major layouts take epilogues for bf16/fp16/tf32 only
        GemmSpec.create(300, 1024, "fp8", scaling="tensor", layout="nn", epilogue="relu")
    assert GemmSpec.create(300, 1000, "bf16", layout="nn", epilogue="relu").layout == "nn"
    assert GemmSpec.create(300, 1000, "tf32", layout="nn", epilogue="relu").layout == "nn"  # transposed copies
    # Epilogues have no portable kernel: sm90 even for unaligned K (operands are staged at call time).
    assert config.choose_config(GemmSpec.create(300, 1003, "bf16", epilogue="relu"), 4096, "sm_90a").family == "sm90"
    with pytest.raises(ValueError, match="Hopper"):
        config.choose_config(GemmSpec.create(300, 1000, "bf16", epilogue="relu"), 4096, "sm_80")


FAMILIES = [  # (dtype, scaling, out_dtype)
    ("bf16", None, "bf16"), ("fp16", None, "fp32"), ("tf32", None, "fp32"), ("fp8", "tensor", "bf16"),
    ("fp8", "row", "fp16"), ("fp8", "block", "bf16"), ("int8", "row", "bf16"),
]
EPILOGUES = ["bias+relu", "bias_row+gelu", "gelu_tanh", "silu+residual", "beta+sigmoid", "beta+bias+gelu+residual"]


def _compile_and_check(spec, m_hint=4096):
    """Compile the heuristic's kernel for `spec` at M = `m_hint` (sm_90a) and check what every epilogue variant must
    satisfy: no local memory or stack, no wgmma serialisation warning, tensor-core MMAs of the input type. Returns
    (cfg, artifact, opcode mix, case label)."""
    cfg = config.choose_config(spec, m_hint, "sm_90a")
    art, mix, case = compiled_clean(spec, cfg)
    assert "C7508" not in art.meta["log"], (case, art.meta["log"])
    # No front-end warning either (#549-D "used before its value is set" sat in every sm90 build log for a while).
    assert re.search(r"warning #\d+-D", art.meta["log"]) is None, (case, art.meta["log"])
    mma = "IGMMA" if spec.dtype == "int8" else "QGMMA" if spec.dtype.startswith("fp8") else "HGMMA"
    assert mix.get(mma, 0) > 0, case
    assert (mix.get("UBLKCP", 0) > 0) == (spec.scaling == "block"), case  # block scaling: bulk-copied A scales
    # A 16-bit D leaves the registers by stmatrix (a warp's 16 x 16 block per instruction, kStMatrix), not pair by
    # pair: at most the few 32-bit shared stores of the bias staging remain.
    if spec.out_dtype in ("bf16", "fp16") and spec.epi.quant == "none":
        assert mix.get("STSM", 0) > 0 and mix.get("STS", 0) <= 8, (case, mix.get("STSM"), mix.get("STS"))
    return cfg, art, mix, case


@pytest.mark.parametrize("family,epilogue", list(itertools.product(FAMILIES, EPILOGUES)))
def test_every_family_and_epilogue_compiles(family, epilogue, shared_cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    dtype, scaling, out_dtype = family
    spec = GemmSpec.create(1000, 2048, dtype, out_dtype=out_dtype, scaling=scaling, epilogue=epilogue)
    _, art, mix, case = _compile_and_check(spec)
    # The bias is read from global memory, C and the residual by TMA loads beyond the main loop's two (A, B; B also
    # in its evict-first form).
    assert mix.get("LDG", 0) > 0 or "bias" not in epilogue, case
    plain, hinted = sass.tma_loads(art.cubin)
    assert hinted == 1 and (plain > 2) == ("beta" in epilogue or "residual" in epilogue), (case, plain, hinted)


@pytest.mark.parametrize("epilogue", ["none", "bias_row+gelu", "beta+bias+gelu+residual", "bias+swiglu"])
def test_fp8_block_wide_tiles_with_epilogues_compile(epilogue, shared_cache_dir, monkeypatch):
    """FP8 block scaling at DeepSeek sizes takes 128x176 tiles where they fill the waves best (N = 2112), the
    register-tightest promoted kernels (the matrix above, N = 1000, gets 128x128): session 8's scales-read-ahead loop
    spilled 8-48 bytes there with epilogues."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    spec = GemmSpec.create(2112, 7168, "fp8", scaling="block", epilogue=epilogue)
    cfg, _, _, case = _compile_and_check(spec)
    assert (cfg.block_m, cfg.block_n) == (128, 176), case


@pytest.mark.parametrize("epilogue", ["none", "residual", "swiglu", "quant_fp8_tensor", "bias_row+quant_fp8_g128",
                                      "bias+quant_fp8_tensor"])
def test_tf32_nn_split_tiles_with_epilogues_compile(epilogue, shared_cache_dir, monkeypatch):
    """TF32 nn (and tn, whose calls copy A) at small M run the kernel that transposes B in shared memory (kTransB),
    split-K: its producer and transposing warps kept a value on the stack at 40 registers (64x96; 64x64 / 64x128 /
    128x64 / 128x96 with quantize-on-store), and quant_fp8_g128 found no tile at all (IndexError in the heuristic).
    tests/fuzz.py found them."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    for layout, m, n, k, block_m in (("nn", 1, 4272, 5221, 64), ("nn", 64, 4272, 5221, 64),
                                     ("tn", 141, 1392, 2128, 128)):
        spec = sm90_rules.kernel_spec(GemmSpec.create(n, k, "tf32", layout=layout, epilogue=epilogue), "sm_90a", m)
        cfg, _, _, case = _compile_and_check(spec, m)
        assert spec.layout == "nn" and sm90_tiles.sm90_trans_b(spec) and cfg.block_m == block_m, case
        # (quant_fp8_g128 may take an unsplit tile narrower than a group, quantized across a cluster)
        assert cfg.split_k or block_m == 128 or sm90_tiles.sm90_quant_cluster(spec, cfg.block_n) > 1, case


@pytest.mark.parametrize("tile", ["128x240s4r2", "128x176s5r2", "128x112r3"])
def test_16bit_ring_tiles_with_activations_compile(tile, shared_cache_dir, monkeypatch):
    """16-bit D through rings of 32-byte slices (two column groups each) with a batched activation epilogue: the
    epilogue's chunks of column groups must lie inside one slice. Session 31's chunks of 4 GELU groups failed that
    static_assert on the GPU only (test_d_ring_gpu forces these tiles); compiled here, with the layout mirror."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    from bench.suites import forced_tile_config
    from deepgemm_jit import launch

    for epilogue in ("bias+gelu", "bias_row+silu"):
        spec = GemmSpec.create(1000, 520, "bf16", epilogue=epilogue)
        cfg = forced_tile_config(spec, tile)
        cfg.check_for(spec, "sm_90a")
        assert cfg.d_ring >= 2, cfg.tag
        art = jit.get_kernel(spec, cfg, "sm_90a")
        usage = sass.resource_usage(art.cubin)[art.entry]
        assert usage.get("LOCAL", 0) == 0 and usage.get("STACK", 0) == 0, cfg.tag
        launch.check_layout(art, spec)


def test_pingpong_rule_on_deepseek_rows():
    """The heuristic takes the 128x128 ping-pong tile for activation/residual epilogues at K <= 4096 unless it
    needs more waves (N = 2112); plain GEMMs and long K keep the cooperative tiles (H200 bench, NOTES)."""
    picks = {}
    for n, k in ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)):
        for epilogue in ("bias+gelu", "bias+gelu+residual", "bias", "none"):
            cfg = config.choose_config(GemmSpec.create(n, k, "bf16", epilogue=epilogue), 4096, "sm_90a")
            picks[(n, k, epilogue)] = cfg.pingpong
            if cfg.pingpong:
                assert (cfg.block_m, cfg.block_n) == (128, 128) and cfg.tag.endswith("_pp")
    chosen = {key for key, pp in picks.items() if pp}
    assert chosen == {(n, k, e) for n, k in ((24576, 1536), (32768, 512), (7168, 2048))
                      for e in ("bias+gelu", "bias+gelu+residual")}
    # Small M never: one tile per consumer leaves nothing to overlap.
    assert not config.choose_config(GemmSpec.create(32768, 512, "bf16", epilogue="gelu"), 64, "sm_90a").pingpong
    # The tuner times it for such epilogues.
    spec = GemmSpec.create(4096, 7168, "bf16", epilogue="bias+gelu")
    assert any(c.pingpong for c in config.candidate_configs(spec, 4096, "sm_90a"))


@pytest.mark.parametrize("dtype,scaling,epilogue,tile", [
    ("bf16", None, "beta+bias+gelu+residual", (128, 128)), ("fp8", "block", "bias_row+silu", (64, 128)),
    ("int8", "row", "gelu_tanh+residual", (128, 128)), ("tf32", None, "none", (64, 256)),
])
def test_pingpong_variants_compile(dtype, scaling, epilogue, tile, shared_cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    out_dtype = "fp32" if dtype == "tf32" else "bf16"
    spec = GemmSpec.create(1000, 2048, dtype, out_dtype=out_dtype, scaling=scaling, epilogue=epilogue)
    cfg = config.sm90_config(spec, *tile, pingpong=True)
    art, mix, _ = compiled_clean(spec, cfg)
    assert mix.get("IGMMA" if dtype == "int8" else "QGMMA" if dtype == "fp8" else "HGMMA", 0) > 0
    assert (mix.get("UBLKCP", 0) > 0) == (scaling == "block"), cfg.tag
    # The config's shared-memory mirror is what the kernel computes (checked on the GPU before each launch;
    # here against the layout formula's pieces: two D tiles of block_m rows).
    assert cfg.smem_bytes(spec) >= 2 * tile[0] * tile[1] * (4 if out_dtype == "fp32" else 2)
    with pytest.raises(ValueError, match="block_m"):
        config.sm90_config(spec, 256, 64, pingpong=True).check_for(spec, "sm_90a")


# Where a tile's bias is read (gemm_sm90.cuh, consume's kBiasEarly): cooperative tiles under their main loop, so that
# the load's latency does not sit between the last wgmma and the epilogue (read at the epilogue's start it cost FP8
# tensor bias+gelu 4096 x 32768 x 512 12%: 207.4 -> 182.3 us, session 56); ping-pong, swapped and K-lane tiles at
# the epilogue's start. In program order: the bias's first global load before / after the K loop's last full wgmma
# drain (WARPGROUP.DEPBAR.LE gsb0, 0x0; the scales' loads are LDG.E.CONSTANT).
@pytest.mark.parametrize("dtype,scaling,epilogue,n,k,tile,kind,early", [
    ("fp8", "tensor", "bias+gelu", 32768, 512, (128, 128), "", True),
    ("fp8", "block", "bias", 7168, 2048, (128, 128), "", True),
    ("fp8", "block", "bias+gelu", 7168, 2048, (64, 64), "", True),
    ("bf16", None, "bias_row+relu", 4096, 7168, (128, 256), "", True),
    ("bf16", None, "bias+gelu", 32768, 512, (128, 128), "pingpong", False),
    ("fp8", "tensor", "bias+gelu", 4096, 7168, (136, 128), "swap_ab", False),
    ("fp8", "tensor", "bias+gelu", 7168, 2048, (64, 64), "", False),  # K lanes (kWGSplitK)
])
def test_bias_read_under_the_main_loop_on_cooperative_tiles(dtype, scaling, epilogue, n, k, tile, kind, early,
                                                            shared_cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    spec = GemmSpec.create(n, k, dtype, scaling=scaling, epilogue=epilogue)
    cfg = config.sm90_config(spec, *tile, **({kind: True} if kind else {}))
    art, _, case = compiled_clean(spec, cfg)
    lines = sass.disassemble(art.cubin).splitlines()
    loads = [i for i, line in enumerate(lines) if re.search(r"\bLDG\.E(\.U16)?\s", line) and ".CONSTANT" not in line]
    drains = [i for i, line in enumerate(lines) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in line]
    assert loads and drains, case
    assert (loads[0] < drains[-1]) == early, (case, loads[0], drains[-1])


# ---- gated units and quantize-on-store ----------------------------------------------------------------------------

def test_gated_and_quant_words():
    e = Epilogue.parse("swiglu+bias+quant_fp8_g128")
    assert (e.gate, e.bias, e.quant, e.quant_dtype, e.has_group_scales) == ("swiglu", "col", "fp8_g128", "fp8_e4m3", True)
    assert e.text == "bias+swiglu+quant_fp8_g128" and Epilogue.parse(e.text) == e
    assert Epilogue.parse("quant_int8_tensor").quant_dtype == "int8" and Epilogue.parse("quant_fp8_tensor").has_static_scale
    assert canonical("residual+geglu") == "geglu+residual"


def test_amax_word_and_its_twin():
    """amax: only with a static-scale quantization, canonical last; warmup plans a static-scale GEMM's amax twin with
    the same config; a Gemm's amax twin (what a call with amax_out= runs) keeps the tiles and differs by the word."""
    from deepgemm_jit import build, warmup

    assert Epilogue.parse("amax+bias+quant_int8_tensor").text == "bias+quant_int8_tensor+amax"
    for text in ("amax", "bias+gelu+amax", "quant_fp8_g128+amax"):
        with pytest.raises(ValueError, match="amax belongs to a static-scale"):
            Epilogue.parse(text)
    plan = warmup.plan([warmup.parse_shape("4096:7168:2048:bf16:epilogue=bias+gelu+quant_fp8_tensor")], "sm_90a", 132)
    gemms = {(spec.epilogue, cfg) for spec, cfg in plan if cfg is not None}
    assert {e for e, _ in gemms} == {"bias+gelu+quant_fp8_tensor", "bias+gelu+quant_fp8_tensor+amax"}
    assert len({cfg for _, cfg in gemms}) == len(gemms) // 2  # each config twice
    g = build(4096, 7168, 2048, dtype="bf16", epilogue="quant_fp8_tensor", arch="sm_90a")
    twin = g._amax_gemm()
    assert twin is g._amax_gemm() and twin.spec.epilogue == "quant_fp8_tensor+amax" and twin.config == g.config


def test_amax_twin_missing_offline_names_the_warmup_that_plans_it(tmp_path, monkeypatch):
    """DEEPGEMM_JIT_OFFLINE and an amax twin not in the cache: the error's warmup line is the one of the Gemm's own
    shape (whose plan brings the twin), not build_spec's "warmup cannot plan a forced config" note."""
    from deepgemm_jit import build
    from deepgemm_jit.errors import KernelNotCachedError
    from deepgemm_jit.warmup_sources import warmup_command_for

    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(tmp_path))
    g = build(4096, 7168, 2048, dtype="bf16", epilogue="quant_int8_tensor", arch="sm_90a")
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    with pytest.raises(KernelNotCachedError) as info:
        g._amax_gemm()
    assert info.value.warmup_command == warmup_command_for(g.spec, 4096, "sm_90a")
    assert "cannot plan" not in str(info.value) and g._amax_twin is None
    # The line is the one build() prints for the Gemm's own kernel (review, session 60): a GPU of another SM count
    # gets --num-sms (the line above compiled the 132-SM twin and the miss stayed), dtype='fp32' the fp32 --shape of
    # the outer GEMM (it printed the inner TF32 spec with K' = 3 Kp), a forced config the note that nothing plans it.
    from deepgemm_jit import build_fp32, device, tuning

    monkeypatch.delenv("DEEPGEMM_JIT_OFFLINE")
    monkeypatch.setattr(device, "num_sms", lambda device_id=None: 114)  # a 114-SM Hopper GPU (H100 PCIe)
    monkeypatch.setattr(device, "gpu_count", lambda: 1)
    monkeypatch.setattr(device, "current_arch", lambda: "sm_90a")
    monkeypatch.setattr(tuning, "stored_config", lambda *args, **kwargs: None)
    g114 = build(4096, 7168, 2048, dtype="bf16", epilogue="quant_int8_tensor")  # built on that GPU (arch=None)
    f = build_fp32(256, 2112, 512, epilogue="quant_fp8_tensor", arch="sm_90a")
    forced = build(4096, 7168, 2048, dtype="bf16", epilogue="quant_int8_tensor", arch="sm_90a", config=g.config)
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    lines = {}
    for name, gemm in (("114", g114), ("fp32", f.gemm), ("forced", forced)):
        with pytest.raises(KernelNotCachedError) as info:
            gemm._amax_gemm()
        lines[name] = info.value
    assert "--num-sms 114" in lines["114"].warmup_command
    assert lines["fp32"].warmup_command == "deepgemm-jit warmup --arch sm_90a --shape 256:2112:512:fp32:" \
                                           "epilogue=quant_fp8_tensor"
    assert lines["forced"].warmup_command is None and "amax_out= once without" in str(lines["forced"])


def test_interleave_gate_up_roundtrip():
    rng = np.random.default_rng(0)
    w_gate, w_up = rng.standard_normal((24, 5)), rng.standard_normal((24, 5))
    w = interleave_gate_up(w_gate, w_up)
    assert w.shape == (48, 5)
    assert (w[0:8] == w_gate[0:8]).all() and (w[8:16] == w_up[0:8]).all() and (w[40:48] == w_up[16:24]).all()
    g, u = deinterleave_gate_up(w)
    assert (g == w_gate).all() and (u == w_up).all()
    b = interleave_gate_up(np.arange(8.0), -np.arange(8.0))
    assert list(b) == list(range(8)) + [-i for i in range(8)]
    with pytest.raises(ValueError, match="multiple of 8"):
        interleave_gate_up(w_gate[:12], w_up[:12])
    with pytest.raises(ValueError, match="must be equal"):
        interleave_gate_up(w_gate, w_up[:16])


def test_gated_and_quant_references_on_numpy():
    """The float64 references: gating on the interleaved product equals act(x Wg^T + bg) * (x Wu^T + bu); the
    quantized references follow quantize_reference's contract."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 9))
    wg, wu, bg, bu = (rng.standard_normal(s) for s in ((16, 9), (16, 9), 16, 16))
    v = reference.unfused_epilogue(x @ interleave_gate_up(wg, wu).T, "bias+swiglu", bias=interleave_gate_up(bg, bu))
    g, u = x @ wg.T + bg, x @ wu.T + bu
    assert np.allclose(v, g / (1 + np.exp(-g)) * u, rtol=1e-14, atol=1e-14)
    q, s = reference.quantized_epilogue_reference(v, "swiglu+quant_fp8_g128")
    assert q.shape == (6, 16) and s.shape == (6, 1) and np.allclose(s[:, 0], (np.abs(v).max(axis=1) / 448).astype(np.float32))
    q8, amax = reference.quantized_epilogue_reference(v, "quant_int8_tensor", np.float32(0.01))
    assert q8.dtype == np.int8 and np.abs(q8).max() <= 127 and amax == np.abs(v.astype(np.float32)).max()
    # q's values, computed independently: one float32 division, then round to nearest even and saturate (INT8), or
    # ml_dtypes' round to nearest E4M3 (FP8; no value here reaches 448) (only shapes and scales were checked)
    import ml_dtypes

    v32 = v.astype(np.float32)
    assert np.array_equal(q8, np.clip(np.rint(v32 / np.float32(0.01)), -127, 127).astype(np.int8))
    want_fp8 = (v32 / s.astype(np.float32)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(np.asarray(q).view(np.uint8), want_fp8)


def test_gated_and_quant_spec_rules():
    s = GemmSpec.create(1024, 512, "bf16", epilogue="swiglu")
    assert s.n_out == 512 and s.out_shape(3) == (3, 512) and s.out_dtype == "bf16"
    q = GemmSpec.create(1000, 512, "bf16", epilogue="bias+gelu+quant_fp8_g128")
    assert q.out_dtype == "fp8_e4m3" and q.scales_out_shape(5) == (5, 8) and q.epilogue_operand_dtype == "fp32"
    assert GemmSpec.create(1008, 512, "int8", scaling="row", epilogue="quant_int8_tensor").out_dtype == "int8"
    with pytest.raises(ValueError, match="N=1000"):
        GemmSpec.create(1000, 512, "bf16", epilogue="swiglu")
    with pytest.raises(ValueError, match="out_dtype"):
        GemmSpec.create(1024, 512, "bf16", out_dtype="bf16", epilogue="quant_fp8_tensor")
    with pytest.raises(ValueError, match="out_dtype"):
        GemmSpec.create(1024, 512, "bf16", out_dtype="fp8_e4m3")  # only quantize-on-store writes FP8
    with pytest.raises(ValueError, match="epilogue='swiglu\\+quant_fp8_g128'.*fast_accum"):
        GemmSpec.create(1024, 512, "fp8", scaling="block", epilogue="swiglu+quant_fp8_g128")
    with pytest.raises(ValueError, match="than tf32 with FP32 promotion can hold; use promoted=False") as info:
        GemmSpec.create(1024, 512, "tf32", promoted=True, epilogue="swiglu+quant_fp8_g128")
    assert "fast_accum" not in str(info.value)  # FP8's remedy, not tf32's
    with pytest.raises(ValueError, match="int32"):
        GemmSpec.create(1024, 512, "int8", epilogue="quant_int8_tensor")


def test_gated_and_quant_tile_legality():
    g128 = GemmSpec.create(1000, 512, "bf16", epilogue="quant_fp8_g128")
    gated = GemmSpec.create(1024, 512, "bf16", epilogue="swiglu+quant_fp8_g128")
    tensor8 = GemmSpec.create(1000, 512, "bf16", epilogue="quant_fp8_tensor")
    for spec, tile, ok in ((g128, (128, 128), True), (g128, (128, 256), True), (g128, (64, 256), True),
                           (g128, (128, 192), False), (g128, (128, 48), False), (g128, (128, 64), True),
                           (gated, (128, 256), True), (gated, (128, 128), True), (gated, (128, 96), False),
                           (tensor8, (128, 112), True), (tensor8, (128, 120), False)):
        cfg = config.sm90_config(spec, *tile, num_stages=3)
        if ok:
            cfg.check_for(spec, "sm_90a")
        else:
            with pytest.raises(ValueError, match="cannot run epilogue"):
                cfg.check_for(spec, "sm_90a")
    # The heuristic only picks legal tiles, also where the preferred tile is not (FP8 row scaling prefers 176; its
    # promoted sums leave no registers for 256 columns), and never the ping-pong tile for group scales. 16-bit
    # GEMMs take two groups per tile row where the plain GEMM's 128x256 pays (as for the plain GEMM).
    fp8_row = GemmSpec.create(4096, 1536, "fp8", scaling="row", epilogue="bias+gelu+quant_fp8_g128")
    wide = GemmSpec.create(4096, 7168, "bf16", epilogue="bias+gelu+quant_fp8_g128")
    for spec, block_n in ((g128, 256), (gated, 256), (fp8_row, 128), (wide, 256)):
        cfg = config.choose_config(spec, 4096, "sm_90a")
        cfg.check_for(spec, "sm_90a")
        assert not cfg.pingpong and cfg.block_n == block_n, cfg.tag
    # N = 2112 (16.5 groups): three consumers of 128-column tiles fill the waves (measured 11-21% faster).
    for m in (1024, 4096):
        spec = GemmSpec.create(2112, 7168, "bf16", epilogue="bias+gelu+quant_fp8_g128")
        cfg = config.choose_config(spec, m, "sm_90a")
        assert (cfg.block_m, cfg.block_n) == (192, 128), cfg.tag
    # D staging is half as wide for gated units and one byte per element for quantized outputs.
    plain = GemmSpec.create(1024, 512, "bf16")
    assert (sm90_tiles.sm90_smem_bytes(plain, 128, 256, 3) - sm90_tiles.sm90_smem_bytes(gated, 128, 256, 3)
            == 128 * 256 * 2 - 128 * 128 * 1)


def test_quant_cluster_rules(shared_cache_dir, monkeypatch):
    """quant_fp8_g128 tiles narrower than a 1x128 group run in clusters of 128 / D columns (gated: block_n / 2),
    dense, unsplit and cooperative only; the cost model weighs them for 8-bit GEMMs whose clusters are all resident
    at once (H200: clusters of 4 or 8 fill 120 SMs), and then no split-K tile."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    bf16 = GemmSpec.create(1000, 512, "bf16", epilogue="quant_fp8_g128")
    gated = GemmSpec.create(1024, 512, "bf16", epilogue="swiglu+quant_fp8_g128")
    static = GemmSpec.create(1000, 512, "bf16", epilogue="quant_fp8_tensor")
    assert [sm90_tiles.sm90_quant_cluster(bf16, bn) for bn in (16, 32, 64, 128, 256)] == [8, 4, 2, 1, 1]
    assert sm90_tiles.sm90_quant_cluster(gated, 64) == 4 and sm90_tiles.sm90_quant_cluster(static, 32) == 1
    assert [sm90_tiles.sm90_cluster_sms(c, 132) for c in (1, 2, 4, 8)] == [132, 132, 120, 120]
    for kwargs, what in (({"pingpong": True}, "ping-pong"), ({"split_k": True}, "split-K")):
        with pytest.raises(ValueError, match=f"cluster, which {what} tiles do not run"):
            config.sm90_config(bf16, 64, 32, num_stages=4, **kwargs).check_for(bf16, "sm_90a")
    grouped = GemmSpec.create(1024, 512, "bf16", epilogue="quant_fp8_g128", grouped=True)
    with pytest.raises(ValueError, match="cannot run epilogue"):
        config.sm90_config(grouped, 128, 64, num_stages=4).check_for(grouped, "sm_90a")
    fp8 = GemmSpec.create(2112, 7168, "fp8", scaling="block", epilogue="quant_fp8_g128")
    picks = {m: config.choose_config(fp8, m, "sm_90a") for m in (64, 128)}
    assert [(c.block_m, c.block_n, c.split_k) for c in picks.values()] == [(64, 32, False), (64, 64, False)]
    g = build(64, 2112, 7168, dtype="fp8", scaling="block", epilogue="quant_fp8_g128", arch="sm_90a")
    assert g.explain()["cluster"] == 4 and build(64, 2112, 7168, dtype="fp8", arch="sm_90a").explain()["cluster"] == 1
    # BF16 (tied or lost on the H200) and clusters past one round (24576 columns) keep 128-column tiles.
    for spec in (GemmSpec.create(2112, 7168, "bf16", epilogue="quant_fp8_g128"),
                 GemmSpec.create(24576, 1536, "fp8", scaling="block", epilogue="quant_fp8_g128")):
        assert config.choose_config(spec, 64, "sm_90a").block_n >= 128, spec.tag


def test_group_quant_split_gain():
    """Group quantization splits K only where the model expects the split far cheaper (SPLIT_MIN_GAIN_GROUP_QUANT):
    BF16 at M = 64 splits N = 2112 (17 tiles of 64x128) but not 7168x2048 (56 tiles; 2 shares measured 1.22x
    slower), and 128 x 4096x7168 runs 64x128 unsplit."""
    def pick(n, k, m):
        cfg = config.choose_config(GemmSpec.create(n, k, "bf16", epilogue="bias+gelu+quant_fp8_g128"), m, "sm_90a")
        return cfg.block_m, cfg.block_n, cfg.split_k

    assert pick(2112, 7168, 64) == (64, 128, True)
    assert pick(7168, 2048, 64) == (64, 128, False) and pick(7168, 16384, 64) == (64, 128, False)
    assert pick(4096, 7168, 128) == (64, 128, False)
    assert sm90_rules.SPLIT_MIN_GAIN_GROUP_QUANT < sm90_rules.SPLIT_MIN_GAIN


class _FakeClusterKernel:
    def __init__(self, resident):
        self.resident = resident

    def max_active_clusters(self, cluster, block):
        return self.resident


def test_cluster_grid_counts_resident_clusters(monkeypatch):
    """A cluster kernel's persistent grid: one cluster per cluster tile, at most as many as the driver says are
    resident at once (whole clusters per GPC) and as the SMs allow, block scaling's balanced rounds in clusters."""
    monkeypatch.setattr(launch, "num_sms", lambda device_id: 132)
    spec = GemmSpec.create(4096, 7168, "bf16", epilogue="quant_fp8_g128")
    cfg = config.sm90_config(spec, 64, 32, num_stages=4)
    assert launch.cluster_grid(_FakeClusterKernel(30), spec, cfg, 64, 4, 384, 0) == 30  # 32 cluster tiles
    assert launch.cluster_grid(_FakeClusterKernel(40), spec, cfg, 64, 4, 384, 0) == 32
    assert launch.cluster_grid(_FakeClusterKernel(99), spec, cfg, 640, 4, 384, 0) == 33  # 132 SMs / 4
    narrow = GemmSpec.create(600, 640, "fp8", scaling="block", epilogue="quant_fp8_g128")  # 19 N blocks: 5 clusters
    cfg = config.sm90_config(narrow, 64, 32, num_stages=4)
    assert launch.cluster_grid(_FakeClusterKernel(30), narrow, cfg, 70, 4, 384, 0) == 10
    assert launch.cluster_grid(_FakeClusterKernel(30), narrow, cfg, 64 * 13, 4, 384, 0) == 22  # 65: 3 rounds of 22


def test_no_resident_cluster_is_a_clear_error(monkeypatch):
    """cuOccupancyMaxActiveClusters answering 0 clusters (a GPU partition too small for the cluster) raised
    'cuOccupancyMaxActiveClusters failed with 0 (CUDA_SUCCESS)' (review, session 60); a driver error still names its
    code. Both are asked once per block shape."""
    from deepgemm_jit import runtime

    answers = {"count": 0, "code": 0, "asked": 0}

    def occupancy(count_ptr, function, cfg):
        answers["asked"] += 1
        count_ptr._obj.value = answers["count"]
        return answers["code"]

    monkeypatch.setattr(runtime, "_cu_occupancy_max_active_clusters", lambda: occupancy)
    kernel = runtime.LoadedKernel.__new__(runtime.LoadedKernel)
    kernel.function, kernel.dynamic_smem_bytes, kernel._active_clusters = types.SimpleNamespace(ptr=1), 1024, {}
    with pytest.raises(runtime.NoClusterFitsError, match="no cluster of 4 CTAs .* fits on this GPU"):
        kernel.max_active_clusters(4, (384, 1, 1))
    answers.update(count=3, code=1)
    monkeypatch.setattr(runtime.driver, "error_name", lambda code: "CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(runtime.LaunchError, match="failed with 1 .CUDA_ERROR_INVALID_VALUE"):
        kernel.max_active_clusters(4, (384, 1, 1))
    answers.update(code=0, asked=0)
    assert kernel.max_active_clusters(4, (384, 1, 1)) == 3 and kernel.max_active_clusters(4, (384, 1, 1)) == 3
    assert answers["asked"] == 1  # remembered per (cluster, block) once answered
    assert kernel.max_active_clusters(2, (384, 1, 1)) == 3 and answers["asked"] == 2


@pytest.mark.parametrize("dtype,scaling,epilogue,tile", [
    ("bf16", None, "quant_fp8_g128", (64, 16)),
    ("bf16", None, "bias+gelu+quant_fp8_g128", (64, 32)),
    ("fp8", "block", "bias+gelu+quant_fp8_g128", (64, 32)),
    ("fp8", "block", "quant_fp8_g128", (64, 64)),
    ("fp8", "tensor", "bias+sigmoid+quant_fp8_g128", (64, 16)),   # K lanes: the second warpgroup only sums
    ("bf16", None, "swiglu+quant_fp8_g128", (128, 64)),           # gated: 32 D columns, two consumers
    ("int8", "row", "quant_fp8_g128", (64, 32)),
])
def test_quant_cluster_tiles_compile(dtype, scaling, epilogue, tile, shared_cache_dir, monkeypatch):
    """Each cluster size and consumer layout compiles clean (no local memory, no wgmma serialisation), declares its
    cluster, exchanges the partial amaxes by st.async (no per-tile MEMBAR.ALL.GPU: only the start's and the end's
    cluster barriers fence), and exports the shared memory the host's mirror computes."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    spec = GemmSpec.create(2112, 1024, dtype, scaling=scaling, epilogue=epilogue)
    cfg = config.sm90_config(spec, *tile, num_stages=4)
    cluster = sm90_tiles.sm90_quant_cluster(spec, cfg.block_n)
    assert cluster == 128 // (tile[1] // (2 if spec.epi.is_gated else 1))
    source = jit.render_kernel(spec, cfg).source
    assert f"__cluster_dims__({cluster}, 1, 1)" in source
    art, mix, case = compiled_clean(spec, cfg)
    assert launch.sm90_symbols(art)["smem_bytes"] == cfg.smem_bytes(spec), case
    assert mix.get("STAS", 0) > 0, case
    assert sass.disassemble(art.cubin).count("MEMBAR.ALL.GPU") == 2, case


NEW_EPILOGUES = ["bias+swiglu+quant_fp8_g128", "geglu+residual", "bias+gelu+quant_fp8_g128",
                 "bias_row+swiglu+quant_fp8_tensor", "sigmoid+quant_int8_tensor+amax"]


@pytest.mark.parametrize("family,epilogue", list(itertools.product(FAMILIES, NEW_EPILOGUES)))
def test_every_family_and_new_epilogue_compiles(family, epilogue, shared_cache_dir, monkeypatch):
    """Gated units and quantize-on-store on every dtype family: real sm_90a compiles without local memory, stack
    or wgmma serialisation; the one invalid pair (FP8 with promotion x gated + group scales) fails at the spec,
    naming the epilogue."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    dtype, scaling, out_dtype = family
    quantized = "quant_" in epilogue
    make = lambda: GemmSpec.create(1024, 2048, dtype, out_dtype=None if quantized else out_dtype,  # noqa: E731
                                   scaling=scaling, epilogue=epilogue)
    if dtype == "fp8" and epilogue == "bias+swiglu+quant_fp8_g128":
        with pytest.raises(ValueError, match="epilogue="):
            make()
        return
    spec = make()
    cfg, art, mix, case = _compile_and_check(spec)
    # The shared-memory mirror and D's box (half-width tiles when gated, 1-byte quantized elements) are what the
    # kernel exports: the host encodes D's tensor map from these.
    sym = launch.sm90_symbols(art)
    out_cols = cfg.block_n // (2 if spec.epi.is_gated else 1)
    assert sym["smem_bytes"] == cfg.smem_bytes(spec), case
    assert sym["d_box_cols"] * (out_cols // sym["d_box_cols"]) == out_cols, case
    # Group scales leave by plain global stores, the per-tensor amax (its own kernel: the amax word) by one atomic
    # per warp. Without it no branch region per stored pair (a run-time amax test made 36, session 58).
    assert (mix.get("STG", 0) > 0) == ("g128" in epilogue), case
    assert (mix.get("ATOMG", 0) + mix.get("REDG", 0) > 0) == spec.epi.amax, case
    if spec.epi.has_static_scale and not spec.epi.amax:
        assert mix.get("BSSY", 0) <= 12, (case, mix.get("BSSY"))
    # Quantize-on-store divides by quant::divide, not div.rn: div.rn's range check (FCHK) and slow-path call sat
    # around every element's division and kept them from overlapping. What remains is per group or per tile (the
    # scale's own division and the reciprocal), a few, not one per stored pair.
    if quantized:
        assert mix.get("FCHK", 0) <= 4 and mix.get("CALL", 0) <= 8, (case, mix.get("FCHK"), mix.get("CALL"))


def test_reference_beta_zero_does_not_read_c():
    """The kernels never read C when beta = 0 (BLAS; tests/test_epilogue_gpu.py passes a NaN-poisoned out as C), and
    the float64 reference agrees: a NaN in C does not reach D; any other beta multiplies it."""
    acc = np.arange(8, dtype=np.float64).reshape(2, 4)
    c = np.full((2, 4), np.nan)
    assert np.array_equal(reference.unfused_epilogue(acc, "beta", c=c, alpha=1.5, beta=0.0), 1.5 * acc)
    assert np.isnan(reference.unfused_epilogue(acc, "beta", c=c, alpha=1.5, beta=-0.5)).all()
