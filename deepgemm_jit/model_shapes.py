"""The GEMM shapes of a transformer, read from a Hugging Face style ``config.json`` (pure Python).

``gemm_shapes(config)`` lists every distinct weight GEMM of one forward pass as ``ModelGemm(name, n, k,
count)``: ``n`` is the weight's output features, ``k`` its input features (``nn.Linear(k, n)``, layout
``nt``), ``count`` how many times it runs per forward (layers x experts). M (tokens) is not a property
of the model: ``warmup`` takes it as a range.

Families, chosen by ``model_type`` (or ``architectures``):

- dense (``llama``, ``mistral``, ``qwen2``, ``qwen3``): q/k/v/o projections and the fused ``qkv`` row,
  gate/up (and the fused ``gate_up`` with N = 2 x intermediate), down, lm_head;
- Mixtral MoE (``mixtral``): the same attention, ``num_local_experts`` experts of ``intermediate_size``;
- Qwen MoE (``qwen2_moe``, ``qwen3_moe``): ``num_experts`` experts of ``moe_intermediate_size``, a shared
  expert of ``shared_expert_intermediate_size`` (when present), dense layers per ``mlp_only_layers`` /
  ``decoder_sparse_step``;
- DeepSeek MLA + MoE (``deepseek_v2``, ``deepseek_v3``): q_a/q_b (or q_proj when ``q_lora_rank`` is
  null), kv_a_proj_with_mqa, kv_b, the fused ``q_a+kv_a`` row, o_proj, dense MLP for the first
  ``first_k_dense_replace`` layers, routed and shared experts (gate_up fused, down), lm_head.

Routers (N = number of experts) and attention score GEMMs (batched, not weight GEMMs) are left out.
Identical (n, k) rows are merged: names joined with ", ", counts added.

Fused rows (``qkv_proj``, ``gate_up_proj``, ``q_a+kv_a``) are what serving stacks run when they
concatenate the weights; the unfused rows are listed too.

``weight_quantization(config)`` reads the checkpoint's ``quantization_config``: FP8 weights in 128x128
blocks (DeepSeek-V3's ``{"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}``, the
format of transformers' ``FineGrainedFP8Config``) become ``WeightQuantization("fp8_e4m3", "block", ...)``,
which covers every row but ``lm_head`` and the modules the config lists as not converted.

``expert_gemms(config)`` lists the routed experts of a MoE model as ``ExpertGemm(name, n, k, num_experts,
layers)``: the rows a grouped GEMM (``build_grouped``, weights (num_experts, n, k)) runs in one launch per
layer, the fused gate_up (N = 2 x the expert's intermediate size, K = hidden) and down (N = hidden, K = the
intermediate size). Shared experts are dense MLPs and stay out (they are rows of ``gemm_shapes``).

Example (Llama-3.1-8B): the first rows are ``ModelGemm("layers.self_attn.q_proj, layers.self_attn.o_proj",
n=4096, k=4096, count=64)`` and ``ModelGemm("layers.self_attn.k_proj, layers.self_attn.v_proj", n=1024,
k=4096, count=64)``.
"""
from __future__ import annotations

from dataclasses import dataclass

DENSE_TYPES = ("llama", "mistral", "qwen2", "qwen3")
MIXTRAL_TYPES = ("mixtral",)
QWEN_MOE_TYPES = ("qwen2_moe", "qwen3_moe")
DEEPSEEK_TYPES = ("deepseek_v2", "deepseek_v3")
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3", "MixtralForCausalLM": "mixtral", "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe", "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}
SUPPORTED_TYPES = DENSE_TYPES + MIXTRAL_TYPES + QWEN_MOE_TYPES + DEEPSEEK_TYPES


@dataclass(frozen=True)
class ModelGemm:
    name: str   # e.g. "layers.self_attn.q_proj"; merged rows join their names with ", "
    n: int      # output features (weight rows)
    k: int      # input features (reduction)
    count: int  # executions per forward pass (layers x experts)

    def __post_init__(self):
        for field in ("n", "k", "count"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelGemm {self.name!r}: {field} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class WeightQuantization:
    """How a checkpoint stores its linear-layer weights, in deepgemm-jit's terms.

    ``dtype`` and ``scaling`` are a ``GemmSpec``'s (``"fp8_e4m3"``, ``"block"``: activations quantized
    per 1x128 group at run time, weights per 128x128 block). ``not_converted``: module names kept in the
    checkpoint's 16-bit type in every layer (``lm_head`` always, as transformers does, and the config's
    ``modules_to_not_convert`` / ``ignored_layers`` written without a layer index); ``not_converted_in_some``:
    those listed with a layer index (``model.layers.0.mlp.down_proj``), which the merged rows of
    ``gemm_shapes`` cannot tell apart, so such rows need both types.
    """
    dtype: str
    scaling: str
    not_converted: tuple[str, ...] = ("lm_head",)
    not_converted_in_some: tuple[str, ...] = ()

    def has_quantized(self, module: str) -> bool:
        """Whether some weights of `module` (one name of a ``ModelGemm`` row, e.g. ``"layers.mlp.down_proj"``)
        are quantized: no whole-model exclusion is a substring of it (transformers' rule)."""
        return not any(skip in module for skip in self.not_converted)

    def has_unquantized(self, module: str) -> bool:
        """Whether some weights of `module` stay 16-bit: an exclusion, for any layer, is a substring of it."""
        return any(skip in module for skip in self.not_converted + self.not_converted_in_some)


@dataclass(frozen=True)
class ExpertGemm:
    """The routed experts of one MoE projection: `num_experts` weights (n, k) stacked, as a grouped GEMM takes
    them (``build_grouped(n, k, num_groups=...)``), in `layers` layers."""
    name: str         # e.g. "layers.mlp.experts.gate_up_proj"
    n: int            # output features of one expert's weight
    k: int            # input features
    num_experts: int  # routed experts per layer (all of them; expert parallelism shards them)
    layers: int       # MoE layers that run it

    def __post_init__(self):
        for field in ("n", "k", "num_experts", "layers"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ExpertGemm {self.name!r}: {field} must be a positive integer, got {value!r}")


# The block that the kernels' FP8 "block" scaling is built around (scale_b per 128x128 block of B).
FP8_WEIGHT_BLOCK = [128, 128]


def _module_pattern(name: str) -> tuple[str, bool]:
    """A listed module name as a pattern for ``gemm_shapes``'s row names, and whether it named one layer:
    ``"model.layers.3.mlp.gate"`` -> ``("layers.mlp.gate", True)``."""
    parts = name.split(".")
    if parts[0] == "model":
        parts = parts[1:]
    kept = [p for p in parts if not p.isdigit()]
    return ".".join(kept), len(kept) < len(parts)


def weight_quantization(config: dict) -> WeightQuantization | None:
    """The FP8 block quantization `config` declares, or None (no ``quantization_config``, or a method
    deepgemm-jit has no kernels for: AWQ, GPTQ, bitsandbytes... run 16-bit GEMMs after dequantization).

    A ``quant_method: "fp8"`` that does not map onto the block-scaled kernels (not E4M3, no 128x128
    ``weight_block_size``) raises ``ValueError``: choose the type yourself (``warmup --dtype fp8/row``...).

    Example: the DeepSeek-V3 config (``{"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128,
    128]}``) gives ``WeightQuantization("fp8_e4m3", "block", ("lm_head",), ())``.
    """
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict (a parsed config.json), got {type(config).__name__}")
    quant = config.get("quantization_config")
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise ValueError(f"config.json: 'quantization_config' must be an object, got {quant!r}")
    if quant.get("quant_method") != "fp8":
        return None
    choose = "pass --dtype to choose the GEMM type (e.g. fp8/row, fp8/tensor, bf16)"
    fmt = quant.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"config.json: quantization_config fmt={fmt!r}: FP8 block weights are read as E4M3 "
                         f"only; {choose}")
    block = quant.get("weight_block_size")
    if block != FP8_WEIGHT_BLOCK:
        raise ValueError(f"config.json: quantization_config weight_block_size={block!r}: the block-scaled "
                         f"kernels take {FP8_WEIGHT_BLOCK} blocks; {choose}")
    everywhere, some = ["lm_head"], []
    for key in ("modules_to_not_convert", "ignored_layers"):
        names = quant.get(key) or []
        if not isinstance(names, list) or not all(isinstance(n, str) and n.strip(".") for n in names):
            raise ValueError(f"config.json: quantization_config {key} must be a list of module names, got "
                             f"{names!r}")
        for name in names:
            pattern, one_layer = _module_pattern(name)
            target = some if one_layer else everywhere
            if pattern and pattern not in target:
                target.append(pattern)
    return WeightQuantization(dtype="fp8_e4m3", scaling="block", not_converted=tuple(everywhere),
                              not_converted_in_some=tuple(some))


def _int(config: dict, key: str, default: int | None = None, least: int = 0) -> int:
    value = config.get(key, default)
    if value is None:
        raise ValueError(f"config.json has no {key!r} (needed for the GEMM shapes of "
                         f"model_type={config.get('model_type')!r})")
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        what = "a positive" if least == 1 else "a non-negative"
        raise ValueError(f"config.json: {key!r} must be {what} integer, got {value!r}")
    return value


def model_type(config: dict) -> str:
    """The family key of `config`: its model_type, else the first known entry of architectures."""
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict (a parsed config.json), got {type(config).__name__}")
    kind = config.get("model_type")
    if kind in SUPPORTED_TYPES:
        return kind
    for arch in config.get("architectures") or ():
        if arch in _ARCHITECTURES:
            return _ARCHITECTURES[arch]
    raise ValueError(f"unknown architecture (model_type={kind!r}, architectures={config.get('architectures')!r}); "
                     f"supported model_type values: {', '.join(SUPPORTED_TYPES)}")


class _Rows:
    """Collects rows in order; identical (n, k) merge (names joined, counts added)."""

    def __init__(self):
        self._rows: dict[tuple[int, int], ModelGemm] = {}

    def add(self, name: str, n: int, k: int, count: int) -> None:
        if count == 0:
            return
        old = self._rows.get((n, k))
        if old is not None:
            name, count = f"{old.name}, {name}", old.count + count
        self._rows[(n, k)] = ModelGemm(name=name, n=n, k=k, count=count)

    def list(self) -> list[ModelGemm]:
        return list(self._rows.values())


def _attention(rows: _Rows, config: dict, hidden: int, num_layers: int) -> None:
    num_heads = _int(config, "num_attention_heads", least=1)  # hidden // num_heads below
    num_kv_heads = _int(config, "num_key_value_heads", num_heads)
    head_dim = config.get("head_dim") or hidden // num_heads
    q, kv = num_heads * head_dim, num_kv_heads * head_dim
    rows.add("layers.self_attn.q_proj", q, hidden, num_layers)
    rows.add("layers.self_attn.k_proj", kv, hidden, num_layers)
    rows.add("layers.self_attn.v_proj", kv, hidden, num_layers)
    rows.add("layers.self_attn.qkv_proj", q + 2 * kv, hidden, num_layers)
    rows.add("layers.self_attn.o_proj", hidden, q, num_layers)


def _mlp(rows: _Rows, prefix: str, hidden: int, intermediate: int, count: int, separate_gate_up: bool) -> None:
    if separate_gate_up:
        rows.add(f"{prefix}.gate_proj", intermediate, hidden, count)
        rows.add(f"{prefix}.up_proj", intermediate, hidden, count)
    rows.add(f"{prefix}.gate_up_proj", 2 * intermediate, hidden, count)
    rows.add(f"{prefix}.down_proj", hidden, intermediate, count)


def _mla(rows: _Rows, config: dict, hidden: int, num_layers: int) -> None:
    num_heads = _int(config, "num_attention_heads")
    nope, rope = _int(config, "qk_nope_head_dim"), _int(config, "qk_rope_head_dim")
    v_dim, kv_rank = _int(config, "v_head_dim"), _int(config, "kv_lora_rank")
    q_rank = config.get("q_lora_rank")
    kv_a = kv_rank + rope
    if q_rank:
        q_rank = _int(config, "q_lora_rank")
        rows.add("layers.self_attn.q_a_proj", q_rank, hidden, num_layers)
        rows.add("layers.self_attn.q_b_proj", num_heads * (nope + rope), q_rank, num_layers)
        rows.add("layers.self_attn.q_a+kv_a", q_rank + kv_a, hidden, num_layers)
    else:  # DeepSeek-V2-Lite: no query compression
        rows.add("layers.self_attn.q_proj", num_heads * (nope + rope), hidden, num_layers)
    rows.add("layers.self_attn.kv_a_proj_with_mqa", kv_a, hidden, num_layers)
    rows.add("layers.self_attn.kv_b_proj", num_heads * (nope + v_dim), kv_rank, num_layers)
    rows.add("layers.self_attn.o_proj", hidden, num_heads * v_dim, num_layers)


def _qwen_moe_layers(config: dict, num_layers: int) -> int:
    """How many layers are MoE: Qwen's rule (not in mlp_only_layers, (i + 1) % decoder_sparse_step == 0)."""
    if _int(config, "num_experts") == 0:
        return 0
    step = config.get("decoder_sparse_step") or 1
    dense = set(config.get("mlp_only_layers") or ())
    return sum(1 for i in range(num_layers) if i not in dense and (i + 1) % step == 0)


def gemm_shapes(config: dict) -> list[ModelGemm]:
    """Distinct weight GEMMs of one forward pass of the model `config` describes.

    `config` is a parsed Hugging Face ``config.json`` of a Llama, Mistral, Qwen2/3, Mixtral, Qwen-MoE or
    DeepSeek-V2/V3 model. Unknown model types and missing keys raise ``ValueError`` naming the key.

    Example: ``gemm_shapes(json.load(open("examples/configs/deepseek-v3.json")))`` has
    ``ModelGemm("layers.self_attn.q_a_proj", n=1536, k=7168, count=61)`` among its rows.
    """
    kind = model_type(config)
    hidden = _int(config, "hidden_size")
    num_layers = _int(config, "num_hidden_layers")
    vocab = _int(config, "vocab_size")
    rows = _Rows()
    if kind in DEEPSEEK_TYPES:
        _mla(rows, config, hidden, num_layers)
        num_dense = min(_int(config, "first_k_dense_replace", 0), num_layers)
        num_moe = num_layers - num_dense
        moe_inter = _int(config, "moe_intermediate_size")
        if num_dense:
            _mlp(rows, "layers.mlp", hidden, _int(config, "intermediate_size"), num_dense, separate_gate_up=False)
        _mlp(rows, "layers.mlp.experts", hidden, moe_inter, num_moe * _int(config, "n_routed_experts"),
             separate_gate_up=False)
        num_shared = _int(config, "n_shared_experts", 0)
        if num_shared:
            # DeepSeek's shared experts are one MLP of num_shared x moe_intermediate_size.
            _mlp(rows, "layers.mlp.shared_experts", hidden, num_shared * moe_inter, num_moe,
                 separate_gate_up=False)
    else:
        _attention(rows, config, hidden, num_layers)
        if kind in DENSE_TYPES:
            _mlp(rows, "layers.mlp", hidden, _int(config, "intermediate_size"), num_layers, separate_gate_up=True)
        elif kind in MIXTRAL_TYPES:
            _mlp(rows, "layers.block_sparse_moe.experts", hidden, _int(config, "intermediate_size"),
                 num_layers * _int(config, "num_local_experts"), separate_gate_up=True)
        else:  # Qwen MoE
            num_moe = _qwen_moe_layers(config, num_layers)
            if num_moe < num_layers:
                _mlp(rows, "layers.mlp", hidden, _int(config, "intermediate_size"), num_layers - num_moe,
                     separate_gate_up=True)
            _mlp(rows, "layers.mlp.experts", hidden, _int(config, "moe_intermediate_size"),
                 num_moe * _int(config, "num_experts"), separate_gate_up=True)
            shared = config.get("shared_expert_intermediate_size") or 0
            if shared:
                _mlp(rows, "layers.mlp.shared_expert", hidden, shared, num_moe, separate_gate_up=True)
    tied = " (tied to embed_tokens)" if config.get("tie_word_embeddings") else ""
    rows.add(f"lm_head{tied}", vocab, hidden, 1)
    return rows.list()


def expert_gemms(config: dict) -> list[ExpertGemm]:
    """The routed-expert projections of the MoE model `config` describes, as grouped GEMMs: gate_up (fused, N = 2 x
    the expert's intermediate size) and down of DeepSeek-V2/V3 (``n_routed_experts`` of ``moe_intermediate_size``),
    Mixtral (``num_local_experts`` of ``intermediate_size``) and Qwen MoE (``num_experts`` of
    ``moe_intermediate_size``); [] for dense models and MoE configs without MoE layers. Errors as ``gemm_shapes``.

    Example: DeepSeek-V3 gives ``ExpertGemm("layers.mlp.experts.gate_up_proj", n=4096, k=7168, num_experts=256,
    layers=58)`` and ``ExpertGemm("layers.mlp.experts.down_proj", n=7168, k=2048, num_experts=256, layers=58)``.
    """
    kind = model_type(config)
    hidden = _int(config, "hidden_size")
    num_layers = _int(config, "num_hidden_layers")
    if kind in DEEPSEEK_TYPES:
        prefix = "layers.mlp.experts"
        layers = num_layers - min(_int(config, "first_k_dense_replace", 0), num_layers)
        experts, inter = _int(config, "n_routed_experts"), _int(config, "moe_intermediate_size")
    elif kind in MIXTRAL_TYPES:
        prefix = "layers.block_sparse_moe.experts"
        layers, experts, inter = num_layers, _int(config, "num_local_experts"), _int(config, "intermediate_size")
    elif kind in QWEN_MOE_TYPES:
        prefix = "layers.mlp.experts"
        layers = _qwen_moe_layers(config, num_layers)
        experts = _int(config, "num_experts")
        inter = _int(config, "moe_intermediate_size") if layers else 0
    else:
        return []
    if not (layers and experts and inter and hidden):
        return []
    return [ExpertGemm(f"{prefix}.gate_up_proj", 2 * inter, hidden, experts, layers),
            ExpertGemm(f"{prefix}.down_proj", hidden, inter, experts, layers)]
