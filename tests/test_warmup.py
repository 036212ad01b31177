"""warmup: model shapes from HF configs, the shapes file and --shape (8-bit types too), the plan, parallel
compiles (CPU)."""
import argparse
import json
import re
import shlex
from collections import Counter
from pathlib import Path

import pytest

from deepgemm_jit import buckets, config, model_shapes, quantization, warmup
from deepgemm_jit.quantization import QuantKernelSpec
from deepgemm_jit.spec import GemmSpec

CONFIGS = Path(__file__).resolve().parent.parent / "examples" / "configs"
# buckets.m_bucket: 64, 128, then whole 64-row blocks up to 384, whole 128-row blocks from 512 to 16384
ALL_BUCKETS = (64, 128, 192, 256, 320, 384, 512, *range(640, 16385, 128))
BUCKETS_TO_4096 = ALL_BUCKETS[:ALL_BUCKETS.index(4096) + 1]


def _config(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


def _nk(cfg: dict) -> list[tuple[int, int]]:
    return [(g.n, g.k) for g in model_shapes.gemm_shapes(cfg)]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    warmup.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["warmup", *argv])


# -- model shapes -------------------------------------------------------------------------------------
def test_deepseek_v3_shapes_cover_the_bench_suite():
    rows = {(g.n, g.k): g for g in model_shapes.gemm_shapes(_config("deepseek-v3.json"))}
    assert list(rows) == [(1536, 7168), (24576, 1536), (2112, 7168), (576, 7168), (32768, 512), (7168, 16384),
                          (36864, 7168), (7168, 18432), (4096, 7168), (7168, 2048), (129280, 7168)]
    assert rows[(2112, 7168)].name == "layers.self_attn.q_a+kv_a"
    assert rows[(1536, 7168)].count == 61 and rows[(36864, 7168)].count == 3
    # routed experts (58 MoE layers x 256) and the shared expert have the same shapes: one merged row
    assert rows[(4096, 7168)].count == 58 * 256 + 58 and "shared_experts" in rows[(4096, 7168)].name
    from bench.suites import SUITES

    assert {(n, k) for _, n, k in SUITES["deepseek"].shapes} <= set(rows)


def test_llama_8b_shapes():
    assert _nk(_config("llama-3.1-8b.json")) == [(4096, 4096), (1024, 4096), (6144, 4096), (14336, 4096),
                                                  (28672, 4096), (4096, 14336), (128256, 4096)]


def test_qwen_and_mixtral_shapes():
    assert _nk(_config("qwen2.5-7b.json")) == [(3584, 3584), (512, 3584), (4608, 3584), (18944, 3584),
                                                (37888, 3584), (3584, 18944), (152064, 3584)]
    mixtral = {(g.n, g.k): g for g in model_shapes.gemm_shapes(_config("mixtral-8x7b.json"))}
    assert mixtral[(4096, 14336)].count == 32 * 8 and (32000, 4096) in mixtral


def test_qwen_moe_and_mla_without_q_lora():
    qwen_moe = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
                "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936, "num_experts": 60,
                "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632}
    rows = {(g.n, g.k): g for g in model_shapes.gemm_shapes(qwen_moe)}
    assert rows[(2 * 1408, 2048)].count == 24 * 60 and rows[(2048, 1408)].count == 24 * 60
    assert rows[(2 * 5632, 2048)].name == "layers.mlp.shared_expert.gate_up_proj"
    lite = dict(_config("deepseek-v3.json"), model_type="deepseek_v2", q_lora_rank=None)
    assert (128 * 192, 7168) in _nk(lite) and (1536, 7168) not in _nk(lite)


def test_deepseek_v3_weight_quantization():
    quant = model_shapes.weight_quantization(_config("deepseek-v3.json"))
    assert quant == model_shapes.WeightQuantization("fp8_e4m3", "block", ("lm_head",), ())
    assert quant.has_quantized("layers.mlp.experts.down_proj") and not quant.has_unquantized("layers.mlp.down_proj")
    assert quant.has_unquantized("lm_head") and not quant.has_quantized("lm_head (tied to embed_tokens)")
    assert model_shapes.weight_quantization(_config("llama-3.1-8b.json")) is None
    gptq = {"quantization_config": {"quant_method": "gptq", "bits": 4}}
    assert model_shapes.weight_quantization(gptq) is None  # dequantized to 16-bit GEMMs: the bf16 default
    listed = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128],
                                      "modules_to_not_convert": ["model.layers.0.mlp.down_proj", "kv_b_proj"]}}
    quant = model_shapes.weight_quantization(listed)
    assert quant.not_converted == ("lm_head", "kv_b_proj") and quant.not_converted_in_some == ("layers.mlp.down_proj",)
    assert not quant.has_quantized("layers.self_attn.kv_b_proj")
    # one layer's down_proj stays 16-bit: the merged row needs both types
    assert quant.has_quantized("layers.mlp.down_proj") and quant.has_unquantized("layers.mlp.down_proj")
    for quant_config, message in [({"quant_method": "fp8", "weight_block_size": [64, 64]}, "weight_block_size=\\[64"),
                                  ({"quant_method": "fp8"}, "weight_block_size=None"),
                                  ({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}, "fmt"),
                                  ({"quant_method": "fp8", "weight_block_size": [128, 128],
                                    "modules_to_not_convert": "lm_head"}, "list of module names")]:
        with pytest.raises(ValueError, match=message):
            model_shapes.weight_quantization({"quantization_config": quant_config})


def test_model_shapes_errors_name_the_key():
    with pytest.raises(ValueError, match="unknown architecture.*'gpt2'"):
        model_shapes.gemm_shapes({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    broken = _config("deepseek-v3.json")
    del broken["kv_lora_rank"]
    with pytest.raises(ValueError, match="'kv_lora_rank'"):
        model_shapes.gemm_shapes(broken)
    # architectures alone identify the family
    by_arch = {k: v for k, v in _config("llama-3.1-8b.json").items() if k != "model_type"}
    assert _nk(by_arch) == _nk(_config("llama-3.1-8b.json"))


# -- sources ------------------------------------------------------------------------------------------
def test_m_buckets():
    assert warmup.m_buckets(1, 16384) == ALL_BUCKETS
    assert warmup.m_buckets(100, 100) == (128,)
    assert warmup.m_buckets(65, 1000) == (128, 192, 256, 320, 384, 512, 640, 768, 896, 1024)
    assert warmup.m_buckets(1, 10**6) == ALL_BUCKETS
    assert warmup.parse_m("1-16384") == ALL_BUCKETS and warmup.parse_m("4096") == (4096,)
    for bad in ("0-5", "9-3", "x", "1-2-3"):
        with pytest.raises(ValueError):
            warmup.parse_m(bad)


def test_shapes_file(tmp_path):
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps({"gemms": [
        {"n": 7168, "k": 2048},
        {"n": 4096, "k": 7168, "dtype": "fp16", "layout": "nt", "out_dtype": "fp32", "m": [65, 256],
         "scaling": None, "epilogue": None, "name": "experts"},
        {"n": 96, "k": 64, "dtype": "tf32", "layout": "tn", "m": 100},
        {"n": 96, "k": 64, "m_values": [1, 3000, 5000]},
        {"n": 7168, "k": 2048, "dtype": "fp8_e4m3", "scaling": "block", "m": [1, 4096]},
        {"n": 7168, "k": 2048, "dtype": "fp8", "m": 64},
        {"n": 4096, "k": 512, "dtype": "fp8_e4m3", "b_dtype": "fp8_e5m2", "scaling": "row", "fast_accum": True,
         "out_dtype": "fp32", "m": 64},
        {"n": 4096, "k": 512, "dtype": "int8", "m": 64},
        {"n": 4096, "k": 512, "dtype": "int8", "scaling": "tensor", "out_dtype": "fp16", "b_dtype": None,
         "fast_accum": None, "m": 64},
        {"n": 7168, "k": 2048, "epilogue": "GELU+bias", "m": 64},
        {"n": 4096, "k": 7168, "epilogue": "swiglu+quant_fp8_g128", "m": 64},
        {"n": 7168, "k": 2048, "dtype": "fp8", "epilogue": "bias+silu", "out_dtype": "fp16", "m": 64},
        {"n": 4096, "k": 7168, "epilogue": "none", "m": 64},
    ]}))
    e = warmup.parse_shapes_file(path)
    assert e[0].spec == GemmSpec(7168, 2048, "bf16", "bf16", "nt") and e[0].m_buckets == ALL_BUCKETS
    assert e[1].spec == GemmSpec(4096, 7168, "fp16", "fp32", "nt") and e[1].m_buckets == (128, 192, 256)
    assert e[1].source == "experts"
    assert e[2].spec == GemmSpec(96, 64, "tf32", "fp32", "tn") and e[2].m_buckets == (128,)
    assert e[3].m_buckets == (64, 3072, 5120)  # 3000 and 5000 rows: 128-row buckets
    block = GemmSpec(7168, 2048, "fp8_e4m3", "bf16", "nt", scaling="block")
    assert e[4].spec == block and e[4].m_buckets == BUCKETS_TO_4096
    assert e[5].spec == block  # fp8's default scaling is block
    assert e[6].spec == GemmSpec(4096, 512, "fp8_e4m3", "fp32", "nt", b_dtype="fp8_e5m2", scaling="row",
                                 fast_accum=True)
    assert e[7].spec == GemmSpec(4096, 512, "int8", "int32", "nt", scaling="none")
    assert e[8].spec == GemmSpec(4096, 512, "int8", "fp16", "nt", scaling="tensor")
    assert e[1].spec.epilogue == "none"  # null: no epilogue
    assert e[9].spec == GemmSpec.create(7168, 2048, epilogue="bias+gelu") and e[9].spec.epilogue == "bias+gelu"
    assert e[10].spec == GemmSpec(4096, 7168, "bf16", "fp8_e4m3", epilogue="swiglu+quant_fp8_g128")  # q's type
    assert e[11].spec == GemmSpec.create(7168, 2048, "fp8", "fp16", epilogue="bias+silu")
    assert e[12].spec == GemmSpec.create(4096, 7168)


@pytest.mark.parametrize("item, message", [
    ({"n": 8, "k": 8, "epilogue": "bias+gleu"}, "gemms\\[0\\]: epilogue 'bias\\+gleu': unknown word 'gleu'"),
    ({"n": 8, "k": 8, "epilogue": True}, "gemms\\[0\\]: epilogue must be a string"),
    ({"n": 8, "k": 8, "epilogue": ["bias"]}, "gemms\\[0\\]: epilogue must be a string"),
    ({"n": 24, "k": 64, "epilogue": "swiglu"}, "gemms\\[0\\]: N=24: .*multiple of 16"),
    ({"n": 64, "k": 64, "dtype": "fp8", "epilogue": "bias", "layout": "tn"},
     "gemms\\[0\\]: .*layout"),
    ({"n": 64, "k": 64, "epilogue": "quant_fp8_g128", "out_dtype": "bf16"}, "epilogue='quant_fp8_g128' writes fp8"),
    ({"n": 64, "k": 64, "epilogue": "residual", "grouped": True}, "grouped GEMMs take bias \\(per group"),
    ({"n": 64, "k": 64, "dtype": "int8", "epilogue": "bias"}, "needs a floating output"),
    ({"n": 8, "k": 8, "scaling": "block"}, "gemms\\[0\\]: scaling='block' applies to fp8/int8 operands, not bf16"),
    ({"n": 8, "k": 8, "dtype": "int8", "scaling": "block"}, "gemms\\[0\\]: .*not available for int8"),
    ({"n": 8, "k": 8, "dtype": "fp8", "scaling": "none"}, "gemms\\[0\\]: fp8 GEMMs need scaling"),
    ({"n": 8, "k": 8, "dtype": "fp8", "fast_accum": True}, "gemms\\[0\\]: fast_accum=True does not apply"),
    ({"n": 8, "k": 8, "dtype": "fp8", "scaling": "row", "fast_accum": "yes"},
     "gemms\\[0\\]: fast_accum must be a bool"),
    ({"n": 8, "k": 8, "dtype": "fp8", "layout": "tn"}, "gemms\\[0\\]: fp8_e4m3 GEMMs need layout 'nt'"),
    ({"n": 8, "k": 8, "dtype": "bf16", "b_dtype": "fp16"}, "gemms\\[0\\]: b_dtype='fp16' differs"),
    ({"n": 8, "k": 8, "dtype": "fp8/row"}, "gemms\\[0\\]: dtype='fp8/row' .*keys of their own"),
    ({"n": 8, "k": 8, "dtype": "fp4"}, "gemms\\[0\\]: dtype='fp4' is not supported"),
    ({"n": 8}, "gemms\\[0\\]: missing 'k'"),
    ({"n": 8, "k": 8, "m": [1, 2, 3]}, "m must be \\[lo, hi\\]"),
    ({"n": 8, "k": 8, "m": [100, 10]}, "empty"),
    ({"n": 8, "k": 8, "m": [1, 9], "m_values": [3]}, "not both"),
    ({"n": 8, "k": 8, "layout": "xx"}, "gemms\\[0\\]: layout='xx'"),
    ({"n": 8, "k": 8, "bias": True}, "unknown key"),
])
def test_shapes_file_errors(tmp_path, item, message):
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps({"gemms": [item]}))
    with pytest.raises(ValueError, match=message):
        warmup.parse_shapes_file(path)


def test_shapes_file_not_json(tmp_path):
    path = tmp_path / "shapes.json"
    path.write_text("{gemms: }")
    with pytest.raises(ValueError, match="not valid JSON"):
        warmup.parse_shapes_file(path)
    path.write_text("[]")
    with pytest.raises(ValueError, match='"gemms"'):
        warmup.parse_shapes_file(path)
    with pytest.raises(ValueError, match="cannot be read"):
        warmup.parse_shapes_file(path.parent / "missing.json")
    with pytest.raises(ValueError, match="cannot be read"):
        warmup.hf_config_entries(path.parent / "missing.json", ["bf16"], (64,))


ROUND_TRIP_SPECS = [
    GemmSpec.create(7168, 2048, "bf16"),
    GemmSpec.create(100, 200, "fp16", "fp32", "tn"),
    GemmSpec.create(64, 64, "tf32", layout="nn"),
    GemmSpec.create(4096, 7168, "tf32", "bf16"),
    GemmSpec.create(7168, 2048, "fp8"),                                      # block, bf16 out: the defaults
    GemmSpec.create(7168, 2048, "fp8_e5m2", "fp32"),
    GemmSpec.create(4096, 512, "fp8", scaling="row", fast_accum=True),
    GemmSpec.create(4096, 512, "fp8", scaling="tensor", fast_accum=True, out_dtype="fp16"),
    GemmSpec.create(4096, 512, "fp8_e4m3", b_dtype="fp8_e5m2", scaling="tensor"),
    GemmSpec.create(4096, 512, "fp8_e5m2", b_dtype="fp8_e4m3", scaling="block", out_dtype="fp32"),
    GemmSpec.create(4096, 512, "int8"),                                      # unscaled: int32 out
    GemmSpec.create(4096, 512, "int8", scaling="tensor"),                    # scaled: bf16 out
    GemmSpec.create(4096, 512, "int8", "fp16", scaling="row"),
    GemmSpec.create(7168, 2048, epilogue="gelu+bias"),                       # fused epilogues: the keyed field
    GemmSpec.create(7168, 2048, "fp16", "fp32", epilogue="beta+bias_row+relu+residual"),
    GemmSpec.create(4096, 7168, epilogue="swiglu+quant_fp8_g128"),           # fp8_e4m3 out: its default
    GemmSpec.create(4096, 7168, epilogue="bias+geglu+quant_fp8_tensor"),
    GemmSpec.create(7168, 2048, "fp8", epilogue="bias+silu"),
    GemmSpec.create(7168, 2048, "fp8", "fp32", epilogue="bias+silu"),
    GemmSpec.create(4096, 512, "int8", scaling="row", epilogue="quant_int8_tensor"),
    GemmSpec.create(4096, 512, "fp8", scaling="row", fast_accum=True, epilogue="swiglu+quant_fp8_g128"),
]


@pytest.mark.parametrize("spec", ROUND_TRIP_SPECS, ids=lambda spec: spec.tag)
def test_warmup_command_round_trip(spec):
    for m in (3, 4096, 20000):
        line = warmup.warmup_command_for(spec, m, "sm_90a")
        assert line.startswith("deepgemm-jit warmup --arch sm_90a --shape ")
        args = _args(*line.split()[2:])
        assert args.arch == "sm_90a"
        [back] = [warmup.parse_shape(text) for text in args.shape]
        assert back.spec == spec, f"{line=} {back.spec=}"
        assert back.m_buckets == (buckets.m_bucket(m),)
        assert warmup.parse_type(warmup.type_text(spec)).spec(spec.n, spec.k, spec.out_dtype, spec.layout,
                                                              epilogue=spec.epilogue) == spec
        assert (":epilogue=" in line) == (spec.epilogue != "none")


def test_warmup_line_plans_the_tile_of_a_gpu_with_other_sm_counts(capsys):
    """An offline miss on a GPU of 114 SMs (H100 PCIe) printed a line that planned for sm_90a's usual 132, another
    tile, so running it left the miss: the line now carries --num-sms, and warmup plans with it."""
    spec = GemmSpec.create(7168, 2048, "bf16")
    on_114 = config.choose_config(spec, 512, "sm_90a", 114)
    assert on_114 != config.choose_config(spec, 512, "sm_90a", 132)  # the case is real
    assert "--num-sms" not in warmup.warmup_command_for(spec, 512, "sm_90a", 132)
    assert "--num-sms" not in warmup.warmup_command_for(spec, 512, "sm_90a")
    line = warmup.warmup_command_for(spec, 512, "sm_90a", 114)
    assert line.startswith("deepgemm-jit warmup --arch sm_90a --num-sms 114 --shape 512:7168:2048:")
    args = _args(*line.split()[2:])
    arch, num_sms = warmup._target(args.arch, args.num_sms)
    entries = [warmup.parse_shape(text) for text in args.shape]
    # (and the swapped tiles other M of 512's bucket take: config.buckets_within)
    plan = warmup.plan_buckets(entries, arch, num_sms)
    assert (spec, on_114) in plan and all(s == spec for s, _ in plan)
    grouped = warmup.grouped_warmup_command_for(GemmSpec.create(4096, 7168, "fp8", grouped=True), 300, 32,
                                                "sm_90a", 114)
    assert grouped.startswith("deepgemm-jit warmup --arch sm_90a --num-sms 114 --grouped ")
    with pytest.raises(ValueError, match="--num-sms must be a positive integer"):
        warmup.main(_args("--arch", "sm_90a", "--num-sms", "0", "--shape", "512:7168:2048:bf16", "--dry-run"))
    assert warmup.main(_args("--arch", "sm_90a", "--num-sms", "114", "--shape", "512:7168:2048:bf16",
                             "--dry-run")) == 0
    assert on_114.tag in capsys.readouterr().out


def test_warmup_command_lines():
    line = lambda *a, **kw: warmup.warmup_command_for(GemmSpec.create(7168, 2048, *a, **kw), 4096, "sm_90a")  # noqa
    prefix = "deepgemm-jit warmup --arch sm_90a --shape 4096:7168:2048:"
    assert line() == prefix + "bf16"
    assert line("fp8") == prefix + "fp8_e4m3/block"
    assert line("fp8", scaling="row", fast_accum=True) == prefix + "fp8_e4m3/row+fast_accum"
    assert line("fp8", b_dtype="fp8_e5m2", scaling="tensor") == prefix + "fp8_e4m3xfp8_e5m2/tensor"
    assert line("int8") == prefix + "int8"
    assert line("int8", "fp16", scaling="row") == prefix + "int8/row:nt:fp16"
    assert line("tf32", "bf16") == prefix + "tf32:nt:bf16"
    assert line(epilogue="gelu+bias") == prefix + "bf16:epilogue=bias+gelu"  # canonical order
    assert line(epilogue="swiglu+quant_fp8_g128") == prefix + "bf16:epilogue=swiglu+quant_fp8_g128"
    assert line("fp8", epilogue="bias+silu") == prefix + "fp8_e4m3/block:epilogue=bias+silu"
    assert line("fp8", "fp32", epilogue="bias+silu") == prefix + "fp8_e4m3/block:nt:fp32:epilogue=bias+silu"


QUANTIZE_SPECS = [QuantKernelSpec("quantize", src, q, gran, vec)
                  for src, vecs in (("bf16", (8, 4, 1)), ("fp16", (8, 2)), ("fp32", (4, 1)))
                  for q in quantization.QUANT_DTYPES for gran in quantization.GRANULARITIES for vec in vecs
                  if q != "int8" or gran in quantization.INT8_GRANULARITIES]


def test_quantize_command_round_trip():
    for spec in QUANTIZE_SPECS:
        line = warmup.quantize_command_for(spec, "sm_90a")
        args = _args(*line.split()[2:])
        assert args.arch == "sm_90a" and args.shape == []
        [text] = args.quantize
        assert warmup.parse_quantize(text) == spec, line
        assert text.endswith(f":v{spec.vec}") == (spec.vec != quantization.full_vec(spec.src_dtype)), line
    spec = QuantKernelSpec("quantize", "bf16", "fp8_e4m3", "group128", 8)
    assert warmup.quantize_command_for(spec, "sm_90a") == \
        "deepgemm-jit warmup --arch sm_90a --quantize bf16:fp8_e4m3/group128"


def test_quantize_option():
    assert warmup.parse_quantize(" BF16:fp8/Group128 ") == QuantKernelSpec("quantize", "bf16", "fp8_e4m3",
                                                                          "group128", 8)
    assert warmup.parse_quantize("fp32:s8/row:v2") == QuantKernelSpec("quantize", "fp32", "int8", "row", 2)
    assert warmup.parse_quantize("fp16:e5m2/tensor").amax_spec == QuantKernelSpec("amax", "fp16", vec=8)
    for bad, message in [
        ("bf16", "--quantize bf16: expected SRC:DTYPE/GRANULARITY"),
        ("bf16:fp8", "expected SRC:DTYPE/GRANULARITY"),
        ("bf16:fp8/row:8", "expected SRC"),
        ("bf16:fp8/row:v8:x", "expected SRC"),
        ("tf32:fp8/row", "--quantize tf32:fp8/row: SRC='tf32' is not supported"),
        ("bf16:fp16/row", "DTYPE='fp16' is not supported"),
        ("bf16:fp8/", "granularity='' is not supported"),
        ("bf16:int8/group128", "not supported for int8"),
        ("bf16:fp8/row:v16", "vec=16 must be a power of two in \\[1, 8\\]"),
        ("fp32:fp8/row:v3", "vec=3 must be a power of two in \\[1, 4\\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            warmup.parse_quantize(bad)


def test_activation_quantize_spec():
    def spec(*args, **kwargs):
        return warmup.activation_quantize_spec(GemmSpec.create(*args, **kwargs))

    assert spec(7168, 2048, "fp8") == QuantKernelSpec("quantize", "bf16", "fp8_e4m3", "group128", 8)
    assert spec(64, 512, "fp8", scaling="row", fast_accum=True) == QuantKernelSpec("quantize", "bf16", "fp8_e4m3",
                                                                                   "row", 8)
    assert spec(64, 512, "fp8_e5m2", b_dtype="fp8_e4m3", scaling="tensor") == \
        QuantKernelSpec("quantize", "bf16", "fp8_e5m2", "tensor", 8)  # A's type
    assert spec(64, 100, "int8", scaling="row") == QuantKernelSpec("quantize", "bf16", "int8", "row", 4)  # K % 8 == 4
    assert spec(64, 99, "int8", scaling="tensor").vec == 1
    # K % 8 != 0 narrows the packed rows' loads; one row (decode, M = 1) has no stride to align and loads 16 bytes:
    # warmup plans both (M = 1 missed offline; review, session 60)
    k4100 = GemmSpec.create(2048, 4100, "fp8")
    assert [q.vec for q in warmup.activation_quantize_specs(k4100)] == [4, 8]
    assert warmup.activation_quantize_specs(GemmSpec.create(2048, 4096, "fp8")) == (spec(2048, 4096, "fp8"),)
    assert warmup.activation_quantize_specs(GemmSpec.create(64, 64, "bf16")) == ()
    planned = warmup.plan_quantize([warmup.parse_shape("1-64:2048:4100:fp8/block")])
    assert {q.vec for q in planned if q.op == "quantize"} == {4, 8}
    for unscaled in (GemmSpec.create(64, 64, "bf16"), GemmSpec.create(64, 64, "tf32"), GemmSpec.create(64, 64, "int8")):
        assert warmup.activation_quantize_spec(unscaled) is None, unscaled.tag
    assert quantization.ACTIVATION_GRANULARITY.keys() == {"block", "row", "tensor"}


def test_plan_quantize_kernels_once_each():
    entries = [warmup.parse_shape(text) for text in (
        "1-16384:7168:2048:fp8/block", "64:4096:7168:fp8/block", "64:4096:512:fp8/tensor",
        "64:4096:512:fp8/tensor+fast_accum", "64:4096:512:fp8xe5m2/tensor", "64:64:64:bf16", "64:64:64:int8")]
    tensor = QuantKernelSpec("quantize", "bf16", "fp8_e4m3", "tensor", 8)
    extra = [warmup.parse_quantize("bf16:fp8/tensor"), warmup.parse_quantize("fp16:int8/row")]
    needs = warmup.plan_quantize(entries, extra)
    assert needs == {
        QuantKernelSpec("quantize", "bf16", "fp8_e4m3", "group128", 8): ("fp8_e4m3/block activations",),
        tensor: ("fp8_e4m3/tensor activations", "fp8_e4m3/tensor+fast_accum activations",
                 "fp8_e4m3xfp8_e5m2/tensor activations", "--quantize bf16:fp8_e4m3/tensor"),
        tensor.amax_spec: ("fp8_e4m3/tensor activations", "fp8_e4m3/tensor+fast_accum activations",
                           "fp8_e4m3xfp8_e5m2/tensor activations", "--quantize bf16:fp8_e4m3/tensor"),
        QuantKernelSpec("quantize", "fp16", "int8", "row", 8): ("--quantize fp16:int8/row",),
    }
    work = warmup.plan(entries, "sm_90a", quantize=extra)
    gemms = warmup.plan_buckets(entries, "sm_90a")
    decode = warmup.plan_gemv(entries, "sm_90a")
    assert work == list(gemms) + [(spec, None) for spec in needs] + [(spec, None) for spec in decode]


def test_plan_gemv_kernels_for_small_m_entries():
    """Entries reaching M <= 64 get the decode kernel of their type (N and K are run-time arguments there; it
    streams up to M = 8) unless their weight is one the Hopper tiles stream faster (N >= 7168 with K >= 2048, or
    >= 1536 for FP8: gemv.TILES_MIN_N); ones with rows of >= 2 KB also the row sweep of M <= 2 (FP8: 1; gemv_rows,
    threads by K); entries starting above 64 rows, int8 and fused epilogues (which the decode rule leaves to sm90)
    get none."""
    entries = [warmup.parse_shape(text) for text in (
        "1-16384:7168:2048:fp8/block", "64:4096:7168:fp8/block", "64:4096:512:bf16", "64:7168:2048:bf16",
        "4096:4096:512:fp16", "64:64:64:int8", "1-64:7168:1024:fp8/tensor")]
    decode = warmup.plan_gemv(entries, "sm_90a")
    assert [g.tag for g in decode] == [
        "gemv_rows_fp8_e4m3_block_bf16_m1_64x2", "gemv_rows_fp8_e4m3_block_bf16_m1_224x2", "gemv_fp8_e4m3_block_bf16_t1",
        "gemv_bf16_bf16_t1", "gemv_rows_bf16_bf16_m1_64x4", "gemv_rows_bf16_bf16_m2_64x4", "gemv_fp8_e4m3_tensor_bf16_t1"]
    assert warmup.plan_gemv(entries, "sm_80") == []
    assert warmup.kernel_type(decode[0]) == "gemv"
    fused = [warmup.parse_shape(text) for text in (
        "1-16384:7168:2048:bf16:epilogue=bias+gelu", "64:4096:7168:bf16:epilogue=swiglu+quant_fp8_g128",
        "1-4096:7168:2048:fp8:epilogue=bias+silu", "64:4096:512:fp16:epilogue=residual")]
    assert warmup.plan_gemv(fused, "sm_90a") == []
    assert warmup.plan_gemv(fused + entries, "sm_90a") == decode


def test_plan_gemv_kn_for_tf32_weights_stored_k_n():
    """TF32 nn / tn entries reaching M <= 64 get gemv_kn's kernel at the cluster size of their N, K (on the SM
    count given, else the arch's); 16-bit nn entries and TF32 nt ones get none of it."""
    entries = [warmup.parse_shape(text) for text in (
        "1-4096:4096:4096:tf32:nn", "64:28672:4096:tf32:tn", "1-64:4096:4096:bf16:nn", "64:4096:4096:tf32")]
    decode = warmup.plan_gemv(entries, "sm_90a")
    assert [g.tag for g in decode] == ["gemv_kn_tf32_fp32_c2", "gemv_kn_tf32_fp32_c1"]
    assert [g.tag for g in warmup.plan_gemv(entries[:1], "sm_90a", num_sms=40)] == ["gemv_kn_tf32_fp32_c1"]
    assert warmup.kernel_type(decode[0]) == "gemv"
    assert [g.tag for g in warmup.plan_gemv(entries[1:2], "sm_80")] == []


def test_helper_kernels_of_fp32_and_mn_major_tf32(capsys):
    """fp32 entries need their layout's split kernel and TF32 entries with MN-major operands the transpose kernel
    (their GEMM is the nt twin's, sm90_rules.kernel_spec; nn at small M transposes B in the kernel instead); the command
    compiles both (before session 25 it left the split kernels out: an offline fp32 build then found none cached)."""
    from deepgemm_jit import copies

    entries = [warmup.parse_shape(x) for x in ("64:4096:4096:tf32:tn", "64:4096:4096:fp32:tn", "64:4096:4096:tf32")]
    small_nn = [warmup.parse_shape("64:4096:4096:tf32:nn")]
    assert warmup.plan_copies(small_nn, "sm_90a") == []
    assert [spec.layout for spec, _ in warmup.plan_buckets(small_nn, "sm_90a")] == ["nn"]
    assert [s.tag for s in warmup.plan_split(entries)] == ["split_tf32_tn"]
    assert [s.tag for s in warmup.plan_copies(entries, "sm_90a")] == ["transpose_b32"]
    assert warmup.plan_copies(entries, "sm_80") == [] and warmup.plan_copies(entries[2:], "sm_90a") == []
    odd = [warmup.parse_shape(x) for x in ("64:4096:4100:bf16", "64:4098:4096:fp32")]  # K rows, fp32 D rows
    assert warmup.plan_copies(odd[:1], "sm_90a") == warmup.plan_copies(odd[1:], "sm_90a") == [copies.ROWS]
    # A 16-bit (K, M) A: calls at M = 1 (2-byte rows) or 1000 (off 32-byte sectors) stage it by the row copy, which
    # an offline process then needs (warmup left it out before session 41; bench --offline's review found it).
    for layout in ("tn", "tt"):
        assert warmup.plan_copies([warmup.parse_shape(f"1-4096:4096:4096:bf16:{layout}")], "sm_90a") == [copies.ROWS]
    assert warmup.plan_copies([warmup.parse_shape("1-4096:4096:4096:bf16:nn")], "sm_90a") == []
    assert [spec.layout for spec, _ in warmup.plan_buckets(entries[:1], "sm_90a")] == ["nn"]  # tn at 64 rows
    assert warmup.main(_args("--arch", "sm_90a", "--shape", "64:4096:4096:tf32:tn", "--shape",
                             "64:4096:4096:fp32:tn", "--dry-run")) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[:-1] if " for " in line] == ["gemv_kn_tf32_fp32_c2", "split_tf32_tn",
                                                                         "transpose_b32"]  # tn TF32 decode streams
    assert out[-1].startswith("warmup plan: 5 kernels for sm_90a")


def test_dry_run_with_quantize_only(capsys):
    assert warmup.main(_args("--arch", "sm_90a", "--quantize", "bf16:int8/tensor", "--quantize", "bf16:fp8/row",
                             "--dry-run")) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split() for line in out[:-1]] == [
        ["quant_quantize_bf16_int8_tensor_v8", "for", "--quantize", "bf16:int8/tensor"],
        ["quant_amax_bf16_v8", "for", "--quantize", "bf16:int8/tensor"],
        ["quant_quantize_bf16_fp8_e4m3_row_v8", "for", "--quantize", "bf16:fp8_e4m3/row"]]
    assert out[-1] == "warmup plan: 3 kernels for sm_90a (quantize); dry run, nothing compiled"
    with pytest.raises(ValueError, match="--quantize bf16:int8/block128: .*not supported for int8"):
        warmup.main(_args("--arch", "sm_90a", "--quantize", "bf16:int8/block128", "--dry-run"))


def test_shape_option():
    entry = warmup.parse_shape("1-16384:7168:2048:bf16")
    assert entry.spec == GemmSpec.create(7168, 2048, "bf16") and entry.m_buckets == ALL_BUCKETS
    assert entry.source == "--shape 1-16384:7168:2048:bf16"
    for text, spec in [
        ("1-4096:7168:2048:fp8", GemmSpec.create(7168, 2048, "fp8_e4m3", scaling="block")),
        ("1:8:8:FP8_E4M3/Block", GemmSpec.create(8, 8, "fp8_e4m3", scaling="block")),
        ("1:8:8:fp8/tensor+fast_accum", GemmSpec.create(8, 8, "fp8", scaling="tensor", fast_accum=True)),
        ("1:8:8:e4m3xe5m2/row", GemmSpec.create(8, 8, "fp8", b_dtype="fp8_e5m2", scaling="row")),
        ("1:8:8:int8", GemmSpec.create(8, 8, "int8", "int32", scaling="none")),
        ("1:8:8:int8/none", GemmSpec.create(8, 8, "int8", "int32", scaling="none")),
        ("1:8:8:int8/row", GemmSpec.create(8, 8, "int8", "bf16", scaling="row")),
        ("1:8:8:int8/row:nt:fp32", GemmSpec.create(8, 8, "int8", "fp32", scaling="row")),
        ("1:8:8:fp8/block:nt:fp16", GemmSpec.create(8, 8, "fp8", "fp16", scaling="block")),
        ("1:64:64:bf16:epilogue=bias+gelu", GemmSpec.create(64, 64, epilogue="bias+gelu")),
        ("1:64:64:bf16:nt:epilogue=GELU+bias", GemmSpec.create(64, 64, epilogue="bias+gelu")),
        ("1:64:64:bf16:nt:fp32:Epilogue=bias+gelu", GemmSpec.create(64, 64, "bf16", "fp32", epilogue="bias+gelu")),
        ("1:64:64:bf16:epilogue=none", GemmSpec.create(64, 64)),
        ("1:64:64:bf16:epilogue=swiglu+quant_fp8_g128", GemmSpec(64, 64, "bf16", "fp8_e4m3",
                                                                 epilogue="swiglu+quant_fp8_g128")),
        ("1:64:64:fp8:epilogue=bias+silu", GemmSpec.create(64, 64, "fp8", epilogue="bias+silu")),
    ]:
        assert warmup.parse_shape(text).spec == spec, text
    assert warmup.parse_shape("1-4096:8:8:fp8").m_buckets == BUCKETS_TO_4096
    for bad, message in [
        ("7168:2048:bf16", "expected M:N:K:TYPE"), ("1:a:8:bf16", "integers"), ("0:8:8:bf16", "--shape 0:8:8:bf16: M"),
        ("1:8:8:bf16:nq", "--shape 1:8:8:bf16:nq: layout='nq'"),
        ("1:8:8:fp4", "--shape 1:8:8:fp4: dtype='fp4' is not supported"),
        ("1:8:8:fp8/", "TYPE 'fp8/': write dtype\\[xb_dtype\\]"),
        ("1:8:8:fp8x", "TYPE 'fp8x'"),
        ("1:8:8:fp8/row+fastacc", "only modifier"),
        ("1:8:8:fp8/row+", "only modifier"),
        ("1:8:8:fp8/none", "--shape 1:8:8:fp8/none: fp8 GEMMs need scaling"),
        ("1:8:8:fp8/blocky", "scaling='blocky' is not supported"),
        ("1:8:8:fp8+fast_accum", "fast_accum=True does not apply to scaling='block'"),
        ("1:8:8:int8/block", "not available for int8"),
        ("1:8:8:int8:nt:bf16", "int8 without scaling writes out_dtype='int32'"),
        ("1:8:8:int8/row:nt:int32", "with tensor/row scales"),
        ("1:8:8:bf16/row", "applies to fp8/int8 operands, not bf16"),
        ("1:8:8:bf16xfp16", "b_dtype='fp16' differs"),
        ("1:8:8:fp8xint8/row", "an fp8 A multiplies an fp8 B"),
        ("1:8:8:fp8/block:tn", "--shape 1:8:8:fp8/block:tn: fp8_e4m3 GEMMs need layout 'nt'"),
        ("1:64:64:bf16:epilogue=bias+gleu", "--shape 1:64:64:bf16:epilogue=bias\\+gleu: epilogue 'bias\\+gleu': "
                                            "unknown word 'gleu'"),
        ("1:64:64:bf16:epilogue=", "names no epilogue"),
        ("1:64:64:bf16:epi=bias", "unknown field 'epi=bias'"),
        ("1:64:64:bf16:epilogue=bias:nt", "must be the last field"),
        ("1:64:64:bf16:epilogue=bias:epilogue=gelu", "must be the last field"),
        ("1:64:64:epilogue=bias", "expected M:N:K:TYPE"),
        ("1:64:64:bf16:nt:bf16:x:epilogue=bias", "expected M:N:K:TYPE"),
        ("1:24:64:bf16:epilogue=swiglu", "N=24: .*multiple of 16"),
        ("1:64:64:fp8:tn:epilogue=bias", "layout"),
        ("1:64:64:bf16:nt:bf16:epilogue=quant_fp8_g128", "writes fp8_e4m3 \\(leave out_dtype unset\\)"),
        ("1:64:64:fp8:epilogue=swiglu+quant_fp8_g128", "fast_accum=True"),  # FP32 promotion: no room
        ("1:64:64:bf16:epilogue=beta+swiglu", "beta \\(C\\) does not combine"),
    ]:
        with pytest.raises(ValueError, match=message):
            warmup.parse_shape(bad)


def test_hf_dtype_list():
    entries = warmup.hf_config_entries(CONFIGS / "llama-3.1-8b.json", ["bf16", "fp16"], (4096,))
    assert len(entries) == 14 and {e.spec.dtype for e in entries} == {"bf16", "fp16"}
    entries = warmup.hf_config_entries(CONFIGS / "llama-3.1-8b.json", ["fp8/row+fast_accum", "int8/tensor"], (64,))
    assert {warmup.type_text(e.spec) for e in entries} == {"fp8_e4m3/row+fast_accum", "int8/tensor"}
    assert warmup.hf_config_entries(CONFIGS / "llama-3.1-8b.json", None, (64,)) == \
        warmup.hf_config_entries(CONFIGS / "llama-3.1-8b.json", ["bf16"], (64,))  # no quantization_config
    for name, message in [("block", "--dtype block: dtype='block' is not supported"),
                          ("fp8/none", "--dtype fp8/none: fp8 GEMMs need scaling"),
                          ("int8/block", "--dtype int8/block: .*not available for int8")]:
        with pytest.raises(ValueError, match=message):
            warmup.hf_config_entries(CONFIGS / "llama-3.1-8b.json", [name], (4096,))


def test_hf_fp8_block_config_gives_fp8_block_specs(tmp_path):
    everything = warmup.hf_config_entries(CONFIGS / "deepseek-v3.json", None, ALL_BUCKETS)
    entries = [e for e in everything if not e.spec.grouped]
    rows = model_shapes.gemm_shapes(_config("deepseek-v3.json"))
    assert len(entries) == len(rows) == 11
    # then the routed experts as grouped GEMMs, in the checkpoint's FP8 block type
    assert [(e.spec, e.num_groups) for e in everything[11:]] == [
        (GemmSpec.create(n, k, "fp8", grouped=True), (256, 128, 64, 32, 16, 8, 1)) for n, k in ((4096, 7168),
                                                                                             (7168, 2048))]
    for entry, row in zip(entries, rows):
        want = (GemmSpec.create(row.n, row.k, "bf16") if row.name == "lm_head"
                else GemmSpec(row.n, row.k, "fp8_e4m3", "bf16", "nt", scaling="block"))
        assert entry.spec == want, row.name
        assert entry.m_buckets == ALL_BUCKETS and entry.source == f"deepseek-v3.json: {row.name}"
    # an explicit --dtype wins over the config
    explicit = warmup.hf_config_entries(CONFIGS / "deepseek-v3.json", ["bf16"], (64,))
    assert {e.spec for e in explicit if not e.spec.grouped} == {GemmSpec.create(r.n, r.k, "bf16") for r in rows}
    # a row with a module left in 16 bits in one layer gets both kernels
    cfg = _config("deepseek-v3.json")
    cfg["quantization_config"]["modules_to_not_convert"] = ["model.layers.0.self_attn.kv_b_proj"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    kv_b = [e.spec for e in warmup.hf_config_entries(path, None, (64,)) if (e.spec.n, e.spec.k) == (32768, 512)]
    assert kv_b == [GemmSpec.create(32768, 512, "fp8"), GemmSpec.create(32768, 512, "bf16")]


def test_hf_unsupported_fp8_quantization_needs_dtype(tmp_path):
    cfg = _config("deepseek-v3.json")
    cfg["quantization_config"]["weight_block_size"] = [64, 64]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="config.json: .*weight_block_size=\\[64, 64\\].*pass --dtype"):
        warmup.hf_config_entries(path, None, (64,))
    assert len(warmup.hf_config_entries(path, ["fp8/row"], (64,))) == 11


# -- plan and run -------------------------------------------------------------------------------------
def test_plan_keeps_distinct_configs_only():
    spec = GemmSpec.create(7168, 2048, "bf16")
    entries = [warmup.parse_shape("1-16384:7168:2048:bf16"), warmup.parse_shape("4096:7168:2048:bf16")]
    work = [item for item in warmup.plan(entries, "sm_90a") if isinstance(item[0], GemmSpec)]
    # every bucket's pick, and where swapped tiles are weighed the pick of each 8-row step (config.m_bucket_for)
    expected = {config.choose_config(spec, m, "sm_90a") for b in ALL_BUCKETS for m in config.buckets_within(spec, b)}
    assert any(cfg.swap_ab for cfg in expected)
    assert len(work) == len(expected) < len(ALL_BUCKETS)
    assert set(work) == {(spec, cfg) for cfg in expected}


def test_run_in_two_processes_then_nothing_to_compile(cache_dir):
    work = warmup.plan([warmup.parse_shape("1-16384:64:64:bf16")], "sm_90a",
                       quantize=[warmup.parse_quantize("fp32:int8/row:v2")])
    assert len(work) >= 3 and (QuantKernelSpec("quantize", "fp32", "int8", "row", 2), None) in work
    first = warmup.run(work, "sm_90a", jobs=2, progress=False)
    assert (first.compiled, first.cached, first.failed) == (len(work), 0, [])
    assert len(list(cache_dir.glob("kernels/*/*.cubin"))) == len(work)
    second = warmup.run(work, "sm_90a", jobs=2, progress=False)
    assert (second.compiled, second.cached, second.failed) == (0, len(work), [])


def test_run_reports_a_failing_kernel_and_keeps_going(cache_dir, capsys):
    good = warmup.plan([warmup.parse_shape("64:64:64:bf16")], "sm_90a")[:1]  # the GEMM (not the decode kernels)
    bad_spec = GemmSpec.create(64, 64, "tf32", layout="tn")  # the sm90 family reads a tf32 A K-major only
    work = [(bad_spec, good[0][1]), *good]
    summary = warmup.run(work, "sm_90a", jobs=2, progress=True)
    assert summary.compiled == 1 and len(summary.failed) == 1
    spec, cfg, error = summary.failed[0]
    assert spec == bad_spec and "bf16/fp16 only" in error
    progress = capsys.readouterr().err
    assert progress.startswith("\r[0/2] compiled 0 cached 0 failed 0") and "[2/2] compiled 1 cached 0 failed 1" in progress


def test_dry_run_lists_the_decode_kernels(cache_dir, capsys):
    """A shape reaching decode M lists its weight-streaming kernels: the row sweep per M (it crashed the dry run:
    GemvRowsSpec has no max_m), the token-tile kernel up to its M."""
    assert warmup.main(_args("--arch", "sm_90a", "--shape", "1-64:7168:2048:bf16", "--dry-run")) == 0
    out = capsys.readouterr().out
    assert "gemv_rows_bf16" in out and "for M = 1 (decode)" in out and "for M = 2 (decode)" in out
    assert "dry run" in out and not cache_dir.exists()


def test_model_options_without_a_model_are_refused(cache_dir):
    for extra in (("--m", "1-64"), ("--dtype", "int8"), ("--num-groups", "3")):
        with pytest.raises(ValueError, match=f"{extra[0]} apply to --from-hf-config"):
            warmup.main(_args("--arch", "sm_90a", "--shape", "4096:7168:2048:bf16", *extra, "--dry-run"))


def test_warmup_refuses_a_cache_it_cannot_fill(tmp_path, monkeypatch):
    """Without a writable disk cache, every kernel would compile into memory and be lost while the summary said
    'compiled' with exit code 0."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DEEPGEMM_JIT_DISABLE_DISK_CACHE", "1")
    with pytest.raises(ValueError, match="DEEPGEMM_JIT_DISABLE_DISK_CACHE"):
        warmup.main(_args("--arch", "sm_90a", "--shape", "100:64:64:bf16", "--no-progress"))
    monkeypatch.delenv("DEEPGEMM_JIT_DISABLE_DISK_CACHE")
    blocker = tmp_path / "a-file"  # a path under a regular file: unwritable even for root
    blocker.write_text("x")
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(ValueError, match="not writable"):
        warmup.main(_args("--arch", "sm_90a", "--shape", "100:64:64:bf16", "--no-progress"))
    assert warmup.main(_args("--arch", "sm_90a", "--shape", "100:64:64:bf16", "--dry-run")) == 0  # plans only


def test_main_exit_codes_and_dry_run(cache_dir, capsys, monkeypatch):
    assert warmup.main(_args("--arch", "sm_90a", "--shape", "1-256:64:64:bf16", "--dry-run")) == 0
    out = capsys.readouterr().out
    assert "gemm_bf16_bf16_nt_n64_k64" in out and "dry run" in out and not cache_dir.exists()

    assert warmup.main(_args("--arch", "sm_90a", "--shape", "100:64:64:bf16", "--no-progress")) == 0
    assert "compiled 1, already cached 0, failed 0" in capsys.readouterr().out

    from deepgemm_jit import jit

    def broken(spec, cfg, arch):
        raise RuntimeError("NVRTC said no")

    monkeypatch.setattr(jit, "get_kernel", broken)
    assert warmup.main(_args("--arch", "sm_90a", "--shape", "100:64:64:bf16", "--no-progress")) == 1
    captured = capsys.readouterr()
    assert "failed 1" in captured.out and "NVRTC said no" in captured.err

    def broken_quant(spec, arch):
        raise RuntimeError("no FP8 here")

    monkeypatch.setattr(quantization, "get_kernel", broken_quant)
    assert warmup.main(_args("--arch", "sm_90a", "--quantize", "bf16:fp8/row", "--no-progress")) == 1
    captured = capsys.readouterr()
    assert "warmup: 1 kernels for sm_90a (quantize): compiled 0, already cached 0, failed 1" in captured.out
    assert "FAILED quant_quantize_bf16_fp8_e4m3_row_v8: RuntimeError: no FP8 here" in captured.err


def test_kernels_the_cache_did_not_keep_are_failures(cache_dir, capsys):
    """The cache only warns when it cannot store a kernel (a full disk, an unwritable kernels/ folder) and keeps it
    in memory: warmup reported such kernels as compiled and exited 0 with nothing on disk (review)."""
    import warnings

    cache_dir.mkdir(parents=True, exist_ok=True)
    (cache_dir / "kernels").write_text("not a folder")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert warmup.main(_args("--arch", "sm_90a", "--shape", "100:64:64:bf16", "--no-progress")) == 1
    captured = capsys.readouterr()
    assert "compiled 0, already cached 0, failed 1" in captured.out and "not saved to the disk cache" in captured.err


def test_warmup_compiles_even_in_offline_mode(cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    work = warmup.plan([warmup.parse_shape("100:64:64:bf16")], "sm_90a")
    summary = warmup.run(work, "sm_90a", jobs=1, progress=False)
    assert (summary.compiled, summary.failed) == (1, [])
    import os

    assert os.environ["DEEPGEMM_JIT_OFFLINE"] == "1"  # restored for the rest of the process


def test_main_argument_errors(monkeypatch):
    with pytest.raises(ValueError, match="nothing to warm up"):
        warmup.main(_args("--arch", "sm_90a"))
    with pytest.raises(ValueError, match="--dtype fp8/none: fp8 GEMMs need scaling"):
        warmup.main(_args("--arch", "sm_90a", "--from-hf-config", str(CONFIGS / "llama-3.1-8b.json"),
                          "--dtype", "bf16,fp8/none"))
    with pytest.raises(ValueError, match="names no type"):
        warmup.main(_args("--arch", "sm_90a", "--from-hf-config", str(CONFIGS / "llama-3.1-8b.json"),
                          "--dtype", " , "))
    from deepgemm_jit import device

    monkeypatch.setattr(device, "gpu_count", lambda: 0)
    with pytest.raises(ValueError, match="pass --arch"):
        warmup.main(_args("--shape", "1:8:8:bf16"))


def test_hf_config_dry_run_counts(capsys):
    assert warmup.main(_args("--arch", "sm_90a", "--from-hf-config", str(CONFIGS / "deepseek-v3.json"),
                             "--m", "4096", "--dry-run")) == 0
    out = capsys.readouterr().out
    # one per distinct (n, k) at one bucket: the FP8 checkpoint's layers in fp8 block, lm_head in bf16, and the
    # one kernel quantizing every FP8 layer's bf16 activations (all K % 8 == 0)
    assert "gemm_fp8_e4m3_block_bf16_nt_n7168_k2048" in out and "gemm_bf16_bf16_nt_n129280_k7168" in out
    assert [line.split() for line in out.splitlines() if line.startswith("quant_")] == [
        ["quant_quantize_bf16_fp8_e4m3_group128_v8", "for", "fp8_e4m3/block", "activations"]]
    # and the routed experts as grouped GEMMs (at one bucket every num_groups hint picks the same tile here), with
    # the segments kernel of m_indices= calls
    assert ("warmup plan: 15 kernels for sm_90a (10 fp8_e4m3/block, 2 grouped fp8_e4m3/block, 1 bf16, 1 quantize, "
            "1 group_segments); dry run") in out
    assert [line.split()[0] for line in out.splitlines() if "_grouped_" in line] == [
        "gemm_grouped_fp8_e4m3_block_bf16_nt_n4096_k7168", "gemm_grouped_fp8_e4m3_block_bf16_nt_n7168_k2048"]
    assert "G 256,128,64,32,16,8,1 at M 4096" in out
    assert warmup.main(_args("--arch", "sm_90a", "--from-hf-config", str(CONFIGS / "deepseek-v3.json"),
                             "--m", "4096", "--dtype", "bf16", "--num-groups", "none", "--dry-run")) == 0
    assert "warmup plan: 11 kernels for sm_90a (bf16); dry run" in capsys.readouterr().out
    assert warmup.main(_args("--arch", "sm_90a", "--from-hf-config", str(CONFIGS / "deepseek-v3.json"),
                             "--m", "4096", "--dtype", "bf16", "--dry-run")) == 0
    out = capsys.readouterr().out
    # BF16 experts: one group of 4096 rows x 4096 x 7168 makes under 8 waves of 128x128 tiles, so it takes the
    # device-split 128x128 kernel (sm90_rules.grouped_split_tile); more groups keep the cost model's 128x256
    assert "warmup plan: 15 kernels for sm_90a (11 bf16, 3 grouped bf16, 1 group_segments); dry run" in out
    assert "sm90_m128n128k64_s6_g16_sk       G 1 at M 4096" in out


def test_fp8_block_offline_miss_then_warmup_then_nothing_to_compile(cache_dir, monkeypatch, capsys):
    """The serving loop: an offline build misses, its error names the warmup line, that line compiles the
    FP8 block kernel and the kernel quantizing its bf16 activations (the only real compiles here), and a second
    run, the build and the quantize kernel compile nothing."""
    import deepgemm_jit as dg
    from deepgemm_jit.errors import KernelNotCachedError

    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    with pytest.raises(KernelNotCachedError) as info:
        dg.build(3000, 7168, 2048, dtype="fp8", arch="sm_90a")
    line = info.value.warmup_command
    assert line == "deepgemm-jit warmup --arch sm_90a --shape 3000:7168:2048:fp8_e4m3/block"
    args = _args(*line.split()[2:], "--progress")
    assert warmup.main(args) == 0
    captured = capsys.readouterr()
    assert ("warmup: 2 kernels for sm_90a (1 fp8_e4m3/block, 1 quantize): compiled 2, already cached 0, failed 0"
            in captured.out)
    assert "[2/2] compiled 2 cached 0 failed 0" in captured.err and "fp8_e4m3/block n7168 k2048" in captured.err
    assert "quant_quantize_bf16_fp8_e4m3_group128_v8" in captured.err
    cubins = list(cache_dir.glob("kernels/*/*.cubin"))
    assert len(cubins) == 2 and all(c.read_bytes()[:4] == b"\x7fELF" for c in cubins)
    assert warmup.main(_args(*line.split()[2:], "--no-progress")) == 0
    assert "compiled 0, already cached 2, failed 0" in capsys.readouterr().out
    from deepgemm_jit import jit

    jit.clear_memo()
    quantization.clear_memo()
    g = dg.build(3000, 7168, 2048, dtype="fp8", arch="sm_90a")  # still offline: served from the cache
    assert not g.artifact.compiled_now and g.spec.scaling == "block"
    activations = QuantKernelSpec("quantize", "bf16", "fp8_e4m3", "group128", 8)
    assert not quantization.get_kernel(activations, "sm_90a").compiled_now
    quantization.clear_memo()


# -- grouped GEMMs (mixture-of-experts) ---------------------------------------------------------------------
DEEPSEEK_EXPERTS = ((4096, 7168), (7168, 2048))  # routed experts' gate_up and down, as build_grouped takes them
DEEPSEEK_GROUPS = (256, 128, 64, 32, 16, 8, 1)


def test_expert_gemms_and_group_counts():
    experts = model_shapes.expert_gemms(_config("deepseek-v3.json"))
    assert experts == [model_shapes.ExpertGemm("layers.mlp.experts.gate_up_proj", 4096, 7168, 256, 58),
                       model_shapes.ExpertGemm("layers.mlp.experts.down_proj", 7168, 2048, 256, 58)]
    assert [(e.n, e.k, e.num_experts, e.layers) for e in model_shapes.expert_gemms(_config("mixtral-8x7b.json"))] == [
        (28672, 4096, 8, 32), (4096, 14336, 8, 32)]
    qwen_moe = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
                "num_attention_heads": 16, "vocab_size": 151936, "num_experts": 60, "moe_intermediate_size": 1408}
    assert [(e.n, e.k, e.num_experts) for e in model_shapes.expert_gemms(qwen_moe)] == [(2816, 2048, 60),
                                                                                         (2048, 1408, 60)]
    assert model_shapes.expert_gemms(_config("llama-3.1-8b.json")) == []
    assert model_shapes.expert_gemms(dict(qwen_moe, num_experts=0)) == []
    assert warmup.expert_group_counts(256) == DEEPSEEK_GROUPS
    assert warmup.expert_group_counts(8) == (8, 4, 2, 1)
    assert warmup.expert_group_counts(60) == (60, 30, 15, 8, 1)  # 8: build_grouped's default hint


def test_hf_config_grouped_entries_follow_the_types():
    path = CONFIGS / "deepseek-v3.json"
    grouped = [e for e in warmup.hf_config_entries(path, ["bf16", "fp8/block", "fp8/row", "tf32"], ALL_BUCKETS)
               if e.spec.grouped]
    # bf16 and fp8 block for both expert projections; fp8 row and tf32 are no grouped types (their plain rows stay)
    assert [(e.spec.n, e.spec.k, warmup.type_text(e.spec)) for e in grouped] == [
        (4096, 7168, "bf16"), (4096, 7168, "fp8_e4m3/block"), (7168, 2048, "bf16"), (7168, 2048, "fp8_e4m3/block")]
    assert all(e.num_groups == DEEPSEEK_GROUPS and e.m_buckets == ALL_BUCKETS for e in grouped)
    assert grouped[0].source == "deepseek-v3.json: layers.mlp.experts.gate_up_proj (grouped, 256 experts)"
    assert not [e for e in warmup.hf_config_entries(path, ["fp8/row"], ALL_BUCKETS) if e.spec.grouped]
    assert not [e for e in warmup.hf_config_entries(path, None, ALL_BUCKETS, ()) if e.spec.grouped]
    given = [e for e in warmup.hf_config_entries(path, None, (64,), (32, 4)) if e.spec.grouped]
    assert [e.num_groups for e in given] == [(32, 4), (32, 4)]
    mixtral = [e for e in warmup.hf_config_entries(CONFIGS / "mixtral-8x7b.json", None, ALL_BUCKETS) if e.spec.grouped]
    assert [(e.spec, e.num_groups) for e in mixtral] == [
        (GemmSpec.create(28672, 4096, "bf16", grouped=True), (8, 4, 2, 1)),
        (GemmSpec.create(4096, 14336, "bf16", grouped=True), (8, 4, 2, 1))]
    assert not [e for e in warmup.hf_config_entries(CONFIGS / "llama-3.1-8b.json", None, ALL_BUCKETS) if e.spec.grouped]


def test_deepseek_plan_has_grouped_kernels_each_distinct_config_once():
    entries = warmup.hf_config_entries(CONFIGS / "deepseek-v3.json", ["bf16", "fp8/block"], ALL_BUCKETS)
    work = warmup.plan(entries, "sm_90a")
    grouped = [(spec, cfg) for spec, cfg in work if isinstance(spec, GemmSpec) and spec.grouped]
    assert {spec for spec, _ in grouped} == {GemmSpec.create(n, k, t, grouped=True) for n, k in DEEPSEEK_EXPERTS
                                             for t in ("bf16", "fp8")}
    assert len(set(grouped)) == len(grouped)
    # every hint's config is in the plan, and the plan holds nothing else
    hints = {(GemmSpec.create(n, k, t, grouped=True), bucket, groups) for n, k in DEEPSEEK_EXPERTS
             for t in ("bf16", "fp8") for bucket in ALL_BUCKETS for groups in DEEPSEEK_GROUPS}
    chosen = {(spec, config.choose_config(spec, bucket, "sm_90a", groups=groups)) for spec, bucket, groups in hints}
    assert set(grouped) == chosen
    assert len(grouped) < len(hints) / 10  # 252 hints, 22 kernels when written (most hints share a config)
    served = warmup.plan_grouped(entries, "sm_90a")
    assert sum(len(h) for h in served.values()) == len(hints)
    # the plain per-expert GEMMs stay, no decode kernels come from grouped entries, one segments kernel
    assert (GemmSpec.create(4096, 7168, "bf16"), config.choose_config(GemmSpec.create(4096, 7168, "bf16"), 4096,
                                                                      "sm_90a")) in work
    assert [item for item in work if isinstance(item[0], warmup.SegmentsKernel)] == [(warmup.SegmentsKernel(), None)]
    assert warmup.plan_gemv(entries, "sm_90a") == warmup.plan_gemv([e for e in entries if not e.spec.grouped],
                                                                    "sm_90a")
    # the same problem twice (two configs of one model, overlapping hints): nothing new
    again = warmup.plan(entries + [warmup.parse_grouped("256,8:1-4096:4096:7168:bf16")], "sm_90a")
    assert again == work


def test_grouped_option_and_command_round_trip():
    entry = warmup.parse_grouped("256,32,32:1-4096:4096:7168:fp8/block")
    assert entry.spec == GemmSpec.create(4096, 7168, "fp8", grouped=True)
    assert entry.num_groups == (256, 32) and entry.m_buckets == BUCKETS_TO_4096
    assert warmup.parse_grouped("8:100:4096:7168:bf16:fp32").spec.out_dtype == "fp32"
    for spec, m, groups in [(GemmSpec.create(4096, 7168, "fp8", grouped=True), 300, 32),
                            (GemmSpec.create(7168, 2048, "bf16", grouped=True), 1, 256),
                            (GemmSpec.create(7168, 2048, "fp16", "fp32", grouped=True), 5000, 8),
                            (GemmSpec.create(512, 256, "fp8_e4m3", b_dtype="fp8_e5m2", grouped=True), 64, 1),
                            (GemmSpec.create(4096, 7168, epilogue="swiglu+bias", grouped=True), 64, 16),
                            (GemmSpec.create(4096, 7168, "fp16", "fp32", epilogue="gelu", grouped=True), 100, 8),
                            (GemmSpec.create(4096, 7168, epilogue="swiglu+quant_fp8_g128", grouped=True), 512, 8),
                            (GemmSpec.create(4096, 7168, "fp8", epilogue="bias+silu", grouped=True), 300, 256)]:
        line = warmup.grouped_warmup_command_for(spec, m, groups, "sm_90a")
        assert line.startswith("deepgemm-jit warmup --arch sm_90a --grouped ")
        back = warmup.parse_grouped(line.split("--grouped ")[1])
        assert (back.spec, back.m_buckets, back.num_groups) == (spec, (buckets.m_bucket(m),), (groups,))
        assert (":epilogue=" in line) == (spec.epilogue != "none")
    assert (warmup.grouped_warmup_command_for(GemmSpec.create(4096, 7168, "fp8", grouped=True), 300, 32, "sm_90a")
            == "deepgemm-jit warmup --arch sm_90a --grouped 32:300:4096:7168:fp8_e4m3/block")
    assert (warmup.grouped_warmup_command_for(GemmSpec.create(4096, 7168, epilogue="swiglu+bias", grouped=True), 64,
                                              16, "sm_90a")
            == "deepgemm-jit warmup --arch sm_90a --grouped 16:64:4096:7168:bf16:epilogue=bias+swiglu")
    assert (warmup.grouped_warmup_command_for(GemmSpec.create(4096, 7168, epilogue="swiglu+quant_fp8_g128",
                                                              grouped=True), 64, 8, "sm_90a")
            == "deepgemm-jit warmup --arch sm_90a --grouped 8:64:4096:7168:bf16:epilogue=swiglu+quant_fp8_g128")
    entry = warmup.parse_grouped("256,8:1-4096:4096:7168:fp8/block:bf16:epilogue=bias+swiglu")
    assert entry.spec == GemmSpec.create(4096, 7168, "fp8", epilogue="bias+swiglu", grouped=True)
    assert entry.num_groups == (256, 8) and entry.m_buckets == BUCKETS_TO_4096
    with pytest.raises(ValueError, match="not a grouped spec"):
        warmup.grouped_warmup_command_for(GemmSpec.create(4096, 7168), 64, 8, "sm_90a")
    for text, message in [("8:64:4096:7168", "expected G:M:N:K:TYPE"),
                          ("0:64:4096:7168:bf16", "positive integers"),
                          ("8:64:4096:7168:fp8/row", "--grouped 8:64:4096:7168:fp8/row: grouped FP8 GEMMs take "
                                                     "scaling='block'"),
                          ("8:64:4096:7168:tf32", "grouped GEMMs take dtype"),
                          ("8:64:x:7168:bf16", "N and K must be integers"),
                          ("8:64:4096:7168:bf16:epilogue=residual", "--grouped 8:64:4096:7168:bf16:epilogue=residual: "
                                                                    "epilogue='residual': grouped GEMMs take bias"),
                          ("8:64:4096:7168:bf16:epilogue=quant_fp8_tensor", "not beta \\(C\\), a residual, "
                                                                           "per-tensor quantization"),
                          ("8:64:4104:7168:bf16:epilogue=swiglu", "N=4104: .*multiple of 16"),
                          ("8:64:4096:7168:bf16:epilogue=bias+gleu", "unknown word 'gleu'"),
                          ("8:64:4096:7168:epilogue=bias", "expected G:M:N:K:TYPE"),
                          ("8:64:4096:7168:bf16:epilogue=bias:bf16", "must be the last field")]:
        with pytest.raises(ValueError, match=message):
            warmup.parse_grouped(text)
    with pytest.raises(ValueError, match="--num-groups: .*or auto, none"):
        warmup.main(_args("--arch", "sm_90a", "--from-hf-config", str(CONFIGS / "deepseek-v3.json"),
                          "--num-groups", "8,x", "--dry-run"))


def test_shapes_file_grouped_entries(tmp_path):
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps({"gemms": [
        {"n": 4096, "k": 7168, "dtype": "fp8", "grouped": True, "num_groups": [256, 32], "m": [1, 4096]},
        {"n": 7168, "k": 2048, "grouped": True, "m_values": [1, 5000]},
        {"n": 7168, "k": 2048, "grouped": False, "num_groups": None},
        {"n": 4096, "k": 7168, "grouped": True, "num_groups": 16, "m": 64, "epilogue": "swiglu+bias"},
    ]}))
    first, second, plain, fused = warmup.parse_shapes_file(path)
    assert fused.spec == GemmSpec.create(4096, 7168, epilogue="bias+swiglu", grouped=True)
    assert (fused.num_groups, fused.m_buckets) == ((16,), (64,))
    assert (first.spec, first.num_groups, first.m_buckets) == (GemmSpec.create(4096, 7168, "fp8", grouped=True),
                                                               (256, 32), BUCKETS_TO_4096)
    assert (second.spec, second.num_groups, second.m_buckets) == (GemmSpec.create(7168, 2048, grouped=True), (8,),
                                                                  (64, 5120))
    assert plain.spec == GemmSpec.create(7168, 2048) and plain.num_groups == ()
    for item, message in [({"n": 64, "k": 64, "num_groups": 8}, "num_groups is a hint of grouped GEMMs"),
                          ({"n": 64, "k": 64, "grouped": "yes"}, "grouped must be true or false"),
                          ({"n": 64, "k": 64, "grouped": True, "num_groups": []}, "num_groups must be"),
                          ({"n": 64, "k": 64, "grouped": True, "num_groups": [8, 0]}, "num_groups must be"),
                          ({"n": 64, "k": 64, "grouped": True, "dtype": "fp8", "scaling": "row"},
                           r"gemms\[0\]: grouped FP8 GEMMs take scaling='block'"),
                          ({"n": 64, "k": 64, "grouped": True, "layout": "nn"}, "grouped GEMMs take layout 'nt'")]:
        path.write_text(json.dumps({"gemms": [item]}))
        with pytest.raises(ValueError, match=message):
            warmup.parse_shapes_file(path)


def test_deepseek_grouped_warmup_then_offline_build_grouped_compiles_nothing(cache_dir, monkeypatch, capsys):
    """A deployment's build_grouped for the routed experts, with every hint warmup covers (all expected_m buckets,
    the num_groups of expert_group_counts(256)) and without hints, finds its kernel in the cache offline, as do
    the segments kernel and the FP8 activations' quantize kernel; NVRTC is never called."""
    import deepgemm_jit as dg
    from deepgemm_jit import compiler, grouped, jit

    entries = [e for e in warmup.hf_config_entries(CONFIGS / "deepseek-v3.json", ["bf16", "fp8/block"], ALL_BUCKETS)
               if e.spec.grouped]
    work = warmup.plan(entries, "sm_90a")
    summary = warmup.run(work, "sm_90a", jobs=2, progress=False)
    assert (summary.compiled, summary.failed) == (len(work), [])
    assert summary.types["group_segments"] == summary.types["quantize"] == 1

    jit.clear_memo()
    grouped._segments_memo.clear()
    quantization.clear_memo()
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")

    def no_compiling(*args, **kwargs):
        raise AssertionError("warmup missed a kernel: NVRTC was called")

    monkeypatch.setattr(compiler, "compile_cubin", no_compiling)
    covered = 0
    for n, k in DEEPSEEK_EXPERTS:
        for dtype in ("bf16", "fp8"):
            for groups in warmup.expert_group_counts(256):
                for m in ALL_BUCKETS + (1, 100, 3000, 20000):  # buckets, and M values inside / beyond them
                    g = dg.build_grouped(n, k, dtype=dtype, expected_m=m, num_groups=groups, arch="sm_90a")
                    assert not g.artifact.compiled_now and g.spec.grouped
                    assert g.config == config.choose_config(g.spec, m, "sm_90a", groups=groups)
                    covered += 1
            assert not dg.build_grouped(n, k, dtype=dtype, arch="sm_90a").artifact.compiled_now  # default hints
    assert covered == 2 * 2 * 7 * (len(ALL_BUCKETS) + 4)
    assert not grouped.segments_kernel("sm_90a").compiled_now
    activations = QuantKernelSpec("quantize", "bf16", "fp8_e4m3", "group128", 8)
    assert not quantization.get_kernel(activations, "sm_90a").compiled_now
    # and a hint outside the covered set misses, as it should (the warmup line would fill it)
    from deepgemm_jit.errors import KernelNotCachedError

    missed = 0
    for groups in range(2, 257):
        try:
            dg.build_grouped(4096, 7168, dtype="bf16", expected_m=64, num_groups=groups, arch="sm_90a")
        except KernelNotCachedError:
            missed += 1
    assert missed > 0
    grouped._segments_memo.clear()
    quantization.clear_memo()


def test_grouped_offline_miss_then_its_warmup_line_then_nothing_to_compile(cache_dir, monkeypatch, capsys):
    """What build_grouped's offline miss should name (grouped_warmup_command_for): that line compiles the GEMM
    and the segments kernel, after which the same build_grouped loads offline."""
    import deepgemm_jit as dg
    from deepgemm_jit import grouped, jit
    from deepgemm_jit.errors import KernelNotCachedError

    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    with pytest.raises(KernelNotCachedError):
        dg.build_grouped(256, 512, dtype="bf16", expected_m=300, num_groups=16, arch="sm_90a")
    line = warmup.grouped_warmup_command_for(GemmSpec.create(256, 512, "bf16", grouped=True), 300, 16, "sm_90a")
    assert line == "deepgemm-jit warmup --arch sm_90a --grouped 16:300:256:512:bf16"
    assert warmup.main(_args(*line.split()[2:], "--no-progress")) == 0
    assert ("warmup: 2 kernels for sm_90a (1 grouped bf16, 1 group_segments): compiled 2, already cached 0, failed 0"
            in capsys.readouterr().out)
    jit.clear_memo()
    grouped._segments_memo.clear()
    g = dg.build_grouped(256, 512, dtype="bf16", expected_m=300, num_groups=16, arch="sm_90a")
    assert not g.artifact.compiled_now and not grouped.segments_kernel("sm_90a").compiled_now
    grouped._segments_memo.clear()


# -- fused epilogues ----------------------------------------------------------------------------------------
def test_plan_of_fused_epilogues_follows_the_epilogue_spec(capsys):
    """An epilogue is part of the spec: its entries plan the configs choose_config picks for that spec (which
    differ from the plain GEMM's where the epilogue's registers or tile width matter), count as TYPE + epilogue,
    bring the activations' quantize kernel for FP8 and no decode kernels."""
    texts = ("1-16384:7168:2048:bf16:epilogue=bias+gelu", "1-16384:4096:7168:bf16:epilogue=swiglu+quant_fp8_g128",
             "1-4096:7168:2048:fp8:epilogue=bias+silu")
    entries = [warmup.parse_shape(text) for text in texts]
    served = warmup.plan_buckets(entries, "sm_90a")
    for entry in entries:
        assert entry.spec.epilogue != "none"
        expected = {(entry.spec, config.choose_config(entry.spec, m, "sm_90a")) for m in entry.m_buckets}
        assert {key for key in served if key[0] == entry.spec} == expected
    plain = GemmSpec.create(4096, 7168)
    gated = entries[1].spec
    assert {config.choose_config(gated, m, "sm_90a") for m in ALL_BUCKETS} != {
        config.choose_config(plain, m, "sm_90a") for m in ALL_BUCKETS}  # the plain line would compile others
    work = warmup.plan(entries, "sm_90a")
    assert [item for item in work if item[1] is None] == [
        (QuantKernelSpec("quantize", "bf16", "fp8_e4m3", "group128", 8), None)]  # fp8 A; no gemv
    assert warmup.kernel_type(gated) == "bf16 swiglu+quant_fp8_g128"
    assert warmup.kernel_type(GemmSpec.create(64, 64, "fp8", epilogue="silu+bias", grouped=True)) == \
        "grouped fp8_e4m3/block bias+silu"
    args = ["--arch", "sm_90a", "--dry-run"] + [arg for text in texts for arg in ("--shape", text)]
    assert warmup.main(_args(*args, "--grouped", "16:1-4096:4096:7168:bf16:epilogue=bias+swiglu")) == 0
    out = capsys.readouterr().out
    assert "gemm_bf16_ep_bias_gelu_bf16_nt_n7168_k2048" in out
    assert "gemm_bf16_ep_swiglu_quant_fp8_g128_fp8_e4m3_nt_n4096_k7168" in out
    assert "gemm_grouped_bf16_ep_bias_swiglu_bf16_nt_n4096_k7168" in out and "gemv" not in out
    work = warmup.plan(entries + [warmup.parse_grouped("16:1-4096:4096:7168:bf16:epilogue=bias+swiglu")], "sm_90a")
    counts = Counter(warmup.kernel_type(spec) for spec, _ in work)
    assert set(counts) == {"bf16 bias+gelu", "bf16 swiglu+quant_fp8_g128", "fp8_e4m3/block bias+silu",
                           "grouped bf16 bias+swiglu", "quantize", "group_segments"}
    assert out.splitlines()[-1].startswith(f"warmup plan: {len(work)} kernels for sm_90a (")
    for kind, num in counts.items():
        assert f"{num} {kind}" in out.splitlines()[-1], kind


FUSED_MISSES = [  # (build kwargs, the line its offline miss names, the kernels that line compiles)
    (dict(M=3000, N=7168, K=2048, dtype="bf16", epilogue="gelu+bias"),
     "--shape 3000:7168:2048:bf16:epilogue=bias+gelu", "1 kernels for sm_90a (bf16 bias+gelu)"),
    (dict(M=256, N=4096, K=7168, dtype="bf16", epilogue="swiglu+quant_fp8_g128"),
     "--shape 256:4096:7168:bf16:epilogue=swiglu+quant_fp8_g128", "1 kernels for sm_90a (bf16 swiglu+quant_fp8_g128)"),
    (dict(M=3000, N=7168, K=2048, dtype="fp8", epilogue="bias+silu"),
     "--shape 3000:7168:2048:fp8_e4m3/block:epilogue=bias+silu",
     "2 kernels for sm_90a (1 fp8_e4m3/block bias+silu, 1 quantize)"),
    (dict(N=4096, K=7168, dtype="bf16", epilogue="bias+swiglu", expected_m=64, num_groups=16),
     "--grouped 16:64:4096:7168:bf16:epilogue=bias+swiglu",
     "2 kernels for sm_90a (1 grouped bf16 bias+swiglu, 1 group_segments)"),
]


@pytest.mark.parametrize("kwargs, shape, kernels", FUSED_MISSES, ids=[s for _, s, _ in FUSED_MISSES])
def test_fused_epilogue_offline_miss_then_its_warmup_line_then_nothing_to_compile(cache_dir, monkeypatch, capsys,
                                                                                  kwargs, shape, kernels):
    """The serving loop with a fused epilogue: the offline miss names a line with the epilogue, the CLI run of
    that line compiles exactly the missing kernel (and the FP8 activations' quantize kernel / the segments
    kernel), and the same build then loads offline with NVRTC unavailable."""
    import deepgemm_jit as dg
    from deepgemm_jit import cli, compiler, grouped, jit
    from deepgemm_jit.errors import KernelNotCachedError

    build = dg.build_grouped if "expected_m" in kwargs else dg.build
    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    with pytest.raises(KernelNotCachedError) as info:
        build(**kwargs, arch="sm_90a")
    line = info.value.warmup_command
    assert line == f"deepgemm-jit warmup --arch sm_90a {shape}"
    argv = shlex.split(line)
    assert argv[:2] == ["deepgemm-jit", "warmup"]
    assert cli.main(argv[1:] + ["--no-progress"]) == 0
    count = int(kernels.split()[0])
    assert f"warmup: {kernels}: compiled {count}, already cached 0, failed 0" in capsys.readouterr().out

    jit.clear_memo()
    grouped._segments_memo.clear()
    quantization.clear_memo()

    def no_compiling(*args, **kw):
        raise AssertionError("the warmup line missed the kernel: NVRTC was called")

    monkeypatch.setattr(compiler, "compile_cubin", no_compiling)
    g = build(**kwargs, arch="sm_90a")  # still offline: served from the cache
    assert not g.artifact.compiled_now and g.spec.epilogue == line.rsplit("epilogue=", 1)[1]
    if "expected_m" in kwargs:
        assert g.config == config.choose_config(g.spec, kwargs["expected_m"], "sm_90a", groups=kwargs["num_groups"])
        assert not grouped.segments_kernel("sm_90a").compiled_now
    else:
        assert g.config == config.choose_config(g.spec, kwargs["M"], "sm_90a")
        assert g.weight_streaming_max_m == 0  # epilogue GEMMs run their own kernel at every M: no gemv needed
    if g.spec.scaling == "block":
        activations = QuantKernelSpec("quantize", "bf16", "fp8_e4m3", "group128", 8)
        assert not quantization.get_kernel(activations, "sm_90a").compiled_now
    assert cli.main(argv[1:] + ["--no-progress"]) == 0  # and a second run compiles nothing
    assert f"compiled 0, already cached {count}, failed 0" in capsys.readouterr().out
    grouped._segments_memo.clear()
    quantization.clear_memo()


def test_fp32_shapes_plan_the_tf32_gemm_and_the_split_kernel():
    """--shape ...:fp32[:layout] (3xTF32, build_fp32): the TF32 GEMM over K' (promoted, layout nt) that build_fp32
    compiles, and one split kernel per caller layout; other TYPE fields are refused for fp32."""
    from deepgemm_jit import fp32x3

    entry = warmup.parse_shape("1-4096:7168:2048:fp32:nn")
    assert entry.spec == fp32x3.Fp32Spec.create(7168, 2048, layout="nn").inner and entry.split_layout == "nn"
    assert entry.spec.promoted and entry.spec.layout == "nt" and entry.spec.k == 3 * 2048
    work = warmup.plan([entry, warmup.parse_shape("64:7168:2048:fp32:tt")], "sm_90a")
    splits = [spec for spec, cfg in work if cfg is None]
    assert splits == [fp32x3.SplitKernelSpec("nn"), fp32x3.SplitKernelSpec("tt")]
    gemms = {(spec, cfg) for spec, cfg in work if cfg is not None}
    assert (entry.spec, config.choose_config(entry.spec, 64, "sm_90a")) in gemms
    for bad in ("64:8:8:fp32/tensor", "64:8:8:fp32xbf16", "64:8:8:fp32+fast_accum"):
        with pytest.raises(ValueError):
            warmup.parse_shape(bad)
    assert fp32x3.warmup_command_for(fp32x3.Fp32Spec.create(8, 40, out_dtype="bf16"), 64, "sm_90a") == (
        "deepgemm-jit warmup --arch sm_90a --shape 64:8:40:fp32:nt:bf16")



def test_offline_miss_of_a_build_warmup_cannot_plan_names_no_warmup_line(cache_dir, monkeypatch):
    """A miss of build(promoted=True / split_k= / config=) named a --shape line that compiles the heuristic's kernel,
    so running it left the miss (review): such a miss now says how to pre-generate the kernel instead."""
    import deepgemm_jit as dg
    from deepgemm_jit import config
    from deepgemm_jit.errors import KernelNotCachedError

    monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
    forced = config.sm90_config(GemmSpec.create(4096, 4096, "bf16"), 128, 128)
    for kwargs, word in ((dict(dtype="tf32", promoted=True), "promoted=True"), (dict(split_k=4), "split_k="),
                         (dict(config=forced), "config=")):
        with pytest.raises(KernelNotCachedError, match=f"warmup cannot plan a build with {word}") as info:
            dg.build(64, 4096, 4096, arch="sm_90a", **kwargs)
        assert info.value.warmup_command is None
    portable = dg.KernelConfig("sm80", 64, 64, 32, 3, 1, 2, vec_a=4, vec_b=4)
    with pytest.raises(KernelNotCachedError, match="warmup cannot plan a build with config=") as info:
        dg.build_fp32(64, 264, 1024, config=portable, arch="sm_90a")
    assert info.value.warmup_command is None
    with pytest.raises(KernelNotCachedError) as info:  # the heuristic's build keeps its line
        dg.build(64, 4096, 4096, arch="sm_90a")
    assert info.value.warmup_command == "deepgemm-jit warmup --arch sm_90a --shape 64:4096:4096:bf16"


def test_warmup_argument_errors_name_the_argument(tmp_path, capsys):
    from deepgemm_jit import cli

    assert cli.main(["warmup", "--arch", "sm_90a", "--dry-run", "--from-hf-config",
                     "examples/configs/deepseek-v3.json", "--m", "0-5"]) == 2
    assert "--m 0-5:" in capsys.readouterr().err
    heads0 = tmp_path / "zero_heads.json"
    heads0.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 2,
                                  "vocab_size": 32000, "intermediate_size": 11008, "num_attention_heads": 0}))
    assert cli.main(["warmup", "--arch", "sm_90a", "--dry-run", "--from-hf-config", str(heads0)]) == 2
    assert "'num_attention_heads' must be a positive integer, got 0" in capsys.readouterr().err
    # targets the plan cannot serve, named with the way out (review, session 60): FP8 quantize kernels below sm_89
    # (NVRTC failed on them), a model's grouped experts below Hopper (the error did not say --num-groups none)
    assert cli.main(["warmup", "--arch", "sm_86", "--dry-run", "--quantize", "bf16:fp8/group128"]) == 2
    assert "quantization needs sm_89 or newer" in capsys.readouterr().err
    assert cli.main(["warmup", "--arch", "sm_89", "--dry-run", "--quantize", "bf16:fp8/group128"]) == 0
    capsys.readouterr()
    assert cli.main(["warmup", "--arch", "sm_86", "--dry-run", "--from-hf-config",
                     "examples/configs/mixtral-8x7b.json"]) == 2
    assert "pass --num-groups none" in capsys.readouterr().err
    assert cli.main(["warmup", "--arch", "sm_86", "--dry-run", "--num-groups", "none", "--from-hf-config",
                     "examples/configs/mixtral-8x7b.json"]) == 0


def test_offline_miss_notes_survive_and_the_fp32_split_kernel_keeps_its_line(monkeypatch):
    """review: a note was not kept on the error (a later with_warmup_command dropped it), and build_fp32(config=)
    re-raised a miss of its split kernel (which any fp32 --shape line compiles) without a line."""
    import deepgemm_jit as dg
    from deepgemm_jit import api, fp32x3
    from deepgemm_jit.errors import KernelNotCachedError

    e = KernelNotCachedError("miss", spec_tag="s", config_tag="c", arch="sm_90a", cache_dir=None)
    noted = e.with_warmup_command(None, note="how to")
    assert noted.note == "how to" and "how to" in str(noted.with_warmup_command("deepgemm-jit warmup x"))

    class Built:
        arch = "sm_90a"

    def split_missing(*args, **kwargs):
        raise KernelNotCachedError("split_tf32 not cached", spec_tag="split", config_tag="-", arch="sm_90a",
                                   cache_dir=None)

    monkeypatch.setattr(api, "build_spec", lambda *args, **kwargs: Built())
    monkeypatch.setattr(fp32x3, "get_kernel", split_missing)
    portable = dg.KernelConfig("sm80", 64, 64, 32, 3, 1, 2, vec_a=4, vec_b=4)
    with pytest.raises(KernelNotCachedError) as info:
        fp32x3.build_fp32(64, 264, 1024, config=portable, arch="sm_90a")
    assert info.value.warmup_command == "deepgemm-jit warmup --arch sm_90a --shape 64:264:1024:fp32"


def test_warmup_does_not_count_a_memo_only_kernel_as_cached(tmp_path, monkeypatch):
    """A kernel this process built while the disk cache was off sits in the memo only: warmup into a cache that
    lacks it counted it "already cached" (review, session 60); it is reported as a failure that says why."""
    from deepgemm_jit import build, cache

    monkeypatch.setenv("DEEPGEMM_JIT_DISABLE_DISK_CACHE", "1")
    build(4096, 512, 512, arch="sm_90a")
    monkeypatch.delenv("DEEPGEMM_JIT_DISABLE_DISK_CACHE")
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(tmp_path))
    summary = warmup.run(list(warmup.plan_buckets([warmup.parse_shape("4096:512:512:bf16")], "sm_90a")), "sm_90a",
                         progress=False)
    assert not cache.default_cache().keys()
    assert "already cached 0" in summary.line("sm_90a") and "failed 1" in summary.line("sm_90a")



@pytest.mark.parametrize("text,word", [
    ("8:1-4096:4096:24:fp8/block", "K=24: grouped GEMMs read a and b through TMA"),
    ("8:1-4096:24:4096:bf16:epilogue=quant_fp8_g128", "N=24: the output rows"),
    ("8:64:16:4096:bf16:epilogue=swiglu+quant_fp8_g128", "N=16: the output rows"),
])
def test_grouped_entries_build_grouped_refuses_are_refused(text, word):
    """Warmup planned (and compiled) grouped kernels for problems build_grouped refuses (TMA rows of K or of D not
    whole 16-byte chunks): no call could ever use them (review, session 61)."""
    with pytest.raises(ValueError, match=f"--grouped {re.escape(text)}: {word}"):
        warmup.parse_grouped(text)
