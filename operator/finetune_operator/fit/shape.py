"""A decoder-only transformer's shape, read from its config.json (a dict): what the memory estimate needs, and the
parameter counts it implies. No torch, no transformers: the arithmetic runs in the CLI and the operator as well."""

from dataclasses import dataclass
from typing import Any

# Architectures whose MLP is gated (SwiGLU/GeGLU: gate, up and down projections); others have up and down only.
GATED_MLP = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
    "phi3", "olmo", "olmo2", "granite", "granitemoe", "cohere", "cohere2", "deepseek_v2", "deepseek_v3", "internlm2",
    "yi", "baichuan", "stablelm", "starcoder2_gated", "smollm3", "glm", "glm4", "exaone", "helium", "ministral",
})
# Checkpoint dtypes as config.json names them, in bytes per parameter.
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


class UnknownShape(ValueError):
    """The config lacks what the estimate needs (named in the message)."""


def _first(config: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return None


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    gated_mlp: bool
    experts: int = 1  # MoE: experts per layer (1: dense)
    experts_per_token: int = 1
    dtype_bytes: int = 4  # the checkpoint's dtype (torch_dtype), what model.dtype "auto" loads
    position_embeddings: int = 0  # learned absolute positions (GPT-2 style), else 0

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "ModelShape":
        """From a transformers config.json (or AutoConfig.to_dict()); multimodal configs use their text_config."""
        if isinstance(config.get("text_config"), dict) and _first(config, "num_hidden_layers", "n_layer") is None:
            config = {**config["text_config"], "torch_dtype": config.get("torch_dtype") or config.get("dtype")}
        layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
        hidden = _first(config, "hidden_size", "n_embd", "d_model")
        heads = _first(config, "num_attention_heads", "n_head")
        vocab: Any = config.get("vocab_size")
        missing = [k for k, v in (("num_hidden_layers", layers), ("hidden_size", hidden),
                                  ("num_attention_heads", heads), ("vocab_size", vocab)) if v is None]
        if missing:
            raise UnknownShape(f"the model config has no {', '.join(missing)}: not a decoder-only transformer "
                               "whose memory can be estimated")
        model_type = str(config.get("model_type") or "")
        experts = int(_first(config, "num_local_experts", "num_experts", "n_routed_experts") or 1)
        moe_intermediate = _first(config, "moe_intermediate_size")
        intermediate = int(moe_intermediate if experts > 1 and moe_intermediate else
                           (_first(config, "intermediate_size", "n_inner", "ffn_dim") or 4 * hidden))
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32").removeprefix("torch.")
        return cls(
            model_type=model_type, layers=int(layers), hidden=int(hidden), heads=int(heads),
            kv_heads=int(_first(config, "num_key_value_heads", "num_kv_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads), intermediate=intermediate, vocab=int(vocab),
            # Most causal-LM configs state it; where absent, transformers' own default (True) applies.
            tied_embeddings=bool(config.get("tie_word_embeddings", True)),
            gated_mlp=model_type in GATED_MLP or config.get("hidden_act") in ("silu", "swiglu"),
            experts=experts, experts_per_token=int(_first(config, "num_experts_per_tok", "moe_topk") or 1),
            dtype_bytes=DTYPE_BYTES.get(dtype, 4),
            position_embeddings=int(config.get("n_positions") or 0) if model_type in ("gpt2", "gpt_bigcode") else 0,
        )

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def attention_params(self) -> int:
        """q, k, v and o projections of one layer."""
        return self.hidden * (2 * self.q_width + 2 * self.kv_width)

    @property
    def mlp_params(self) -> int:
        """One layer's MLP, every expert (and the router) of a MoE layer."""
        per_expert = (3 if self.gated_mlp else 2) * self.hidden * self.intermediate
        return per_expert * self.experts + (self.hidden * self.experts if self.experts > 1 else 0)

    @property
    def layer_params(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.hidden  # two norms

    @property
    def linear_params(self) -> int:
        """The decoder layers' linear weights: what 4-bit/8-bit quantization and all-linear LoRA apply to."""
        return self.layers * (self.attention_params + self.mlp_params)

    @property
    def embedding_params(self) -> int:
        """Input embedding, the output head unless tied, learned positions."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2) + self.position_embeddings * self.hidden

    @property
    def parameters(self) -> int:
        return self.layers * self.layer_params + self.embedding_params + self.hidden  # final norm

    def lora_parameters(self, r: int, targets: list[str]) -> int:
        """Adapter parameters (A: in x r, B: r x out) on the targeted linear layers of every decoder layer."""
        h, q, kv, i = self.hidden, self.q_width, self.kv_width, self.intermediate
        modules = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                   "gate_proj": (h, i) if self.gated_mlp else None, "up_proj": (h, i), "down_proj": (i, h)}
        wanted = [m for m in modules if targets == ["all-linear"] or any(t.split(".")[-1] == m for t in targets)]
        per_layer = sum(r * (a + b) * (self.experts if m in ("gate_proj", "up_proj", "down_proj") else 1)
                        for m in wanted if (shape := modules[m]) is not None for a, b in [shape])
        return self.layers * per_layer

    def lora_targets(self, targets: list[str]) -> int:
        """How many of a layer's seven (six without a gate) linear layers the targets name."""
        names = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"] + (["gate_proj"] if self.gated_mlp
                                                                                    else [])
        return len(names) if targets == ["all-linear"] else sum(any(t.split(".")[-1] == n for t in targets)
                                                               for n in names)
