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


def _int(config: dict, key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        raise ValueError(f"config.json has no {key!r} (needed for the GEMM shapes of "
                         f"model_type={config.get('model_type')!r})")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"config.json: {key!r} must be a non-negative integer, got {value!r}")
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
    num_heads = _int(config, "num_attention_heads")
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
