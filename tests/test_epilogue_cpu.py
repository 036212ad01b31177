"""Fused epilogues on the CPU: the description (object and string), spec rules, and real sm_90a compiles of every
dtype family x epilogue with SASS checks (no local memory, no wgmma serialisation)."""
import itertools

import pytest

from deepgemm_jit import Epilogue, GemmSpec, config, jit, sass
from deepgemm_jit.epilogue import canonical


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
    ("bias+swiglu", "not supported yet"),
    ("bias+gelu+quant_fp8_g128", "not supported yet"),
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
    with pytest.raises(ValueError, match="layout"):
        GemmSpec.create(300, 1000, "bf16", layout="nn", epilogue="relu")
    # Epilogues have no portable kernel: sm90 even for unaligned K (operands are staged at call time).
    assert config.choose_config(GemmSpec.create(300, 1003, "bf16", epilogue="relu"), 4096, "sm_90a").family == "sm90"
    with pytest.raises(ValueError, match="Hopper"):
        config.choose_config(GemmSpec.create(300, 1000, "bf16", epilogue="relu"), 4096, "sm_80")


FAMILIES = [  # (dtype, scaling, out_dtype)
    ("bf16", None, "bf16"), ("fp16", None, "fp32"), ("tf32", None, "fp32"), ("fp8", "tensor", "bf16"),
    ("fp8", "row", "fp16"), ("fp8", "block", "bf16"), ("int8", "row", "bf16"),
]
EPILOGUES = ["bias+relu", "bias_row+gelu", "gelu_tanh", "silu+residual", "beta+sigmoid", "beta+bias+gelu+residual"]


@pytest.mark.parametrize("family,epilogue", list(itertools.product(FAMILIES, EPILOGUES)))
def test_every_family_and_epilogue_compiles(family, epilogue, shared_cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    dtype, scaling, out_dtype = family
    spec = GemmSpec.create(1000, 2048, dtype, out_dtype=out_dtype, scaling=scaling, epilogue=epilogue)
    cfg = config.choose_config(spec, 4096, "sm_90a")
    art = jit.get_kernel(spec, cfg, "sm_90a")
    usage = sass.resource_usage(art.cubin)[art.entry]
    mix = sass.opcode_mix(art.cubin)
    case = f"{spec.tag} {cfg.tag}"
    assert usage.get("LOCAL", 0) == 0 and usage.get("STACK", 0) == 0, case
    assert "C7514" not in art.meta["log"] and "C7508" not in art.meta["log"], (case, art.meta["log"])
    assert mix.get("IGMMA" if dtype == "int8" else "QGMMA" if dtype == "fp8" else "HGMMA", 0) > 0, case
    # The bias is read from global memory, C and the residual by TMA loads beyond the main loop's two (A, B).
    assert mix.get("LDG", 0) > 0 or "bias" not in epilogue, case
    assert (mix.get("UTMALDG", 0) > 2) == ("beta" in epilogue or "residual" in epilogue), case


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
    cfg.check_for(spec, "sm_90a")
    art = jit.get_kernel(spec, cfg, "sm_90a")
    usage = sass.resource_usage(art.cubin)[art.entry]
    assert usage.get("LOCAL", 0) == 0 and usage.get("STACK", 0) == 0, cfg.tag
    assert "C7514" not in art.meta["log"], art.meta["log"]
    mix = sass.opcode_mix(art.cubin)
    assert mix.get("IGMMA" if dtype == "int8" else "QGMMA" if dtype == "fp8" else "HGMMA", 0) > 0
    # The config's shared-memory mirror is what the kernel computes (checked on the GPU before each launch;
    # here against the layout formula's pieces: two D tiles of block_m rows).
    assert cfg.smem_bytes(spec) >= 2 * tile[0] * tile[1] * (4 if out_dtype == "fp32" else 2)
    with pytest.raises(ValueError, match="block_m"):
        config.sm90_config(spec, 256, 64, pingpong=True).check_for(spec, "sm_90a")
