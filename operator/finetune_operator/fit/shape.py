"""A decoder-only transformer's shape, read from its config.json (a dict): what the memory estimate needs, and the
parameter counts it implies. No torch, no transformers: the arithmetic runs in the CLI and the operator as well."""

from dataclasses import dataclass
from typing import Any

from .moe import PEFT_EXPERT_TARGETS

# Architectures whose MLP is gated (SwiGLU/GeGLU: gate, up and down projections); others have up and down only.
GATED_MLP = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
    "phi3", "olmo", "olmo2", "olmoe", "granite", "granitemoe", "cohere", "cohere2", "deepseek_v2", "deepseek_v3",
    "internlm2", "yi", "baichuan", "stablelm", "starcoder2_gated", "smollm3", "glm", "glm4", "exaone", "helium",
    "ministral", "minimax",
})
# Layers with four norms (before and after attention and MLP), whose activations are counted as measured on Gemma-2.
SANDWICH_NORMS = frozenset({"gemma2", "gemma3_text", "gemma3"})
# Per-head RMSNorm on queries and keys (measured on Qwen3): more kept per token on the attention side.
QK_NORM = frozenset({"qwen3", "qwen3_moe", "olmo2", "olmoe", "gemma3_text", "gemma3"})
# Of those, the ones whose q/k norms span the whole projection (weights of q width and kv width, not head_dim each).
WIDE_QK_NORM = frozenset({"olmo2", "olmoe"})
# MoE layers whose shared expert's output passes a sigmoid gate of its own (an nn.Linear hidden -> 1).
SHARED_EXPERT_GATE = frozenset({"qwen2_moe", "qwen3_next"})
# What transformers' decoders call their input embedding and output head, where not embed_tokens and lm_head.
EMBEDDING_NAMES = {"gpt2": ("wte", "lm_head"), "gpt_bigcode": ("wte", "lm_head"), "gpt_neox": ("embed_in", "embed_out"),
                   "bloom": ("word_embeddings", "lm_head"), "falcon": ("word_embeddings", "lm_head"),
                   "internlm2": ("tok_embeddings", "output")}
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
    intermediate: int  # of one expert in a MoE layer
    vocab: int
    tied_embeddings: bool
    gated_mlp: bool
    experts: int = 1  # MoE: experts per layer (1: dense)
    experts_per_token: int = 1
    shared_expert_intermediate: int = 0  # MoE layers with an always-on shared expert (Qwen2-MoE, DeepSeek)
    dense_layers: int = 0  # MoE models whose first layers are dense (DeepSeek's first_k_dense_replace)
    dense_intermediate: int = 0  # their MLP width
    dtype_bytes: int = 4  # the checkpoint's dtype (torch_dtype), what model.dtype "auto" loads
    position_embeddings: int = 0  # learned absolute positions (GPT-2 style), else 0
    final_logit_softcapping: float | None = None  # Gemma-2: tanh over the logits, one more vocabulary-sized tensor
    attn_logit_softcapping: float | None = None  # Gemma-2: tanh over eager attention's scores
    # Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values through low-rank projections.
    kv_lora_rank: int = 0  # > 0: MLA
    q_lora_rank: int = 0  # 0: a plain q_proj
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # The tokenizer has tokens the checkpoint lacks: the trainer grows the embedding and head (vocab is the grown
    # size) and trains them (LoRA: as modules_to_save; freeze: as extra trainable modules).
    embeddings_grown: bool = False

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
        dense_intermediate = int(_first(config, "intermediate_size", "n_inner", "ffn_dim") or 4 * hidden)
        intermediate = int(moe_intermediate if experts > 1 and moe_intermediate else dense_intermediate)
        shared = int(config.get("shared_expert_intermediate_size") or 0) if experts > 1 else 0
        if experts > 1 and config.get("n_shared_experts"):
            shared = int(config["n_shared_experts"]) * intermediate
        dense_layers = _dense_layers(config, int(layers)) if experts > 1 else 0
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32").removeprefix("torch.")
        softcap = config.get("final_logit_softcapping")
        attn_softcap = config.get("attn_logit_softcapping")
        return cls(
            model_type=model_type, layers=int(layers), hidden=int(hidden), heads=int(heads),
            kv_heads=int(_first(config, "num_key_value_heads", "num_kv_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads), intermediate=intermediate, vocab=int(vocab),
            # Most causal-LM configs state it; where absent, transformers' own default (True) applies.
            tied_embeddings=bool(config.get("tie_word_embeddings", True)),
            gated_mlp=model_type in GATED_MLP or config.get("hidden_act") in ("silu", "swiglu"),
            experts=experts, experts_per_token=int(_first(config, "num_experts_per_tok", "moe_topk") or 1),
            shared_expert_intermediate=shared, dense_layers=min(dense_layers, int(layers)),
            dense_intermediate=dense_intermediate,
            dtype_bytes=DTYPE_BYTES.get(dtype, 4),
            position_embeddings=int(config.get("n_positions") or 0) if model_type in ("gpt2", "gpt_bigcode") else 0,
            final_logit_softcapping=float(softcap) if softcap else None,
            attn_logit_softcapping=float(attn_softcap) if attn_softcap else None,
            kv_lora_rank=int(config.get("kv_lora_rank") or 0), q_lora_rank=int(config.get("q_lora_rank") or 0),
            qk_nope_head_dim=int(config.get("qk_nope_head_dim") or 0),
            qk_rope_head_dim=int(config.get("qk_rope_head_dim") or 0), v_head_dim=int(config.get("v_head_dim") or 0),
        )

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def q_width(self) -> int:
        """The queries' width (MLA: every head's non-rotary and rotary parts)."""
        if self.is_mla:
            return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """The keys' and values' width, each (MLA expands both to every head: their mean)."""
        if self.is_mla:
            return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim) // 2
        return self.kv_heads * self.head_dim

    @property
    def norms_per_layer(self) -> int:
        return 4 if self.model_type in SANDWICH_NORMS else 2

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def attention_params(self) -> int:
        """q, k, v and o projections of one layer (MLA: its low-rank projections)."""
        return sum(a * b for _, a, b in self._attention_linears())

    def _attention_linears(self) -> list[tuple[str, int, int]]:
        """One layer's attention nn.Linear layers: (name, in, out)."""
        h = self.hidden
        if not self.is_mla:
            q, kv = self.q_width, self.kv_width
            return [("q_proj", h, q), ("k_proj", h, kv), ("v_proj", h, kv), ("o_proj", q, h)]
        heads, rope, v = self.heads, self.qk_rope_head_dim, self.v_head_dim
        qk = self.qk_nope_head_dim + rope
        query = ([("q_a_proj", h, self.q_lora_rank), ("q_b_proj", self.q_lora_rank, heads * qk)]
                 if self.q_lora_rank else [("q_proj", h, heads * qk)])
        return [*query, ("kv_a_proj_with_mqa", h, self.kv_lora_rank + rope),
                ("kv_b_proj", self.kv_lora_rank, heads * (self.qk_nope_head_dim + v)), ("o_proj", heads * v, h)]

    @property
    def layer_norm_params(self) -> int:
        """One layer's norm weights: around attention and MLP, and inside the attention (q/k norms, MLA's latent
        norms)."""
        inner = self.q_lora_rank + self.kv_lora_rank if self.is_mla else 0
        if self.model_type in WIDE_QK_NORM:
            inner += self.q_width + self.kv_width
        elif self.model_type in QK_NORM:
            inner += 2 * self.head_dim
        return self.norms_per_layer * self.hidden + inner

    def _mlp(self, intermediate: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * intermediate

    @property
    def expert_params(self) -> int:
        """Every layer's routed experts: in transformers 5 fused 3-D parameters (gate_up_proj, down_proj), not
        nn.Linear layers."""
        return self.moe_layers * self.experts * self._mlp(self.intermediate)

    @property
    def router_params(self) -> int:
        return self.moe_layers * self.hidden * self.experts

    @property
    def mlp_linear_params(self) -> int:
        """The MLPs' nn.Linear weights over all layers: dense layers' MLPs and MoE layers' shared experts."""
        dense = self.layers if not self.is_moe else self.dense_layers
        shared = self._mlp(self.shared_expert_intermediate) + self._shared_gate
        return dense * self._mlp(self.dense_mlp_intermediate) + self.moe_layers * shared

    @property
    def linear_params(self) -> int:
        """The decoder layers' nn.Linear weights: what bitsandbytes quantizes (fused experts and routers are not)."""
        return self.layers * self.attention_params + self.mlp_linear_params

    @property
    def _shared_gate(self) -> int:
        """Qwen-MoE's shared_expert_gate (hidden -> 1) beside its shared expert; DeepSeek's shared experts have none."""
        return self.hidden if self.shared_expert_intermediate and self.model_type in SHARED_EXPERT_GATE else 0

    @property
    def dense_mlp_intermediate(self) -> int:
        """The width of a dense layer's MLP (a MoE model's dense layers: intermediate_size, not the experts')."""
        return self.dense_intermediate if self.is_moe and self.dense_intermediate else self.intermediate

    @property
    def layer_params(self) -> int:
        """The largest decoder layer: what a sharded strategy gathers at once."""
        dense = self._mlp(self.dense_mlp_intermediate) if not self.is_moe or self.dense_layers else 0
        moe = (self._mlp(self.intermediate) * self.experts + self.hidden * self.experts
               + self._mlp(self.shared_expert_intermediate) + self._shared_gate
               if self.moe_layers else 0)
        return self.attention_params + max(dense, moe) + self.layer_norm_params

    @property
    def embedding_params(self) -> int:
        """Input embedding, the output head unless tied, learned positions."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2) + self.position_embeddings * self.hidden

    @property
    def parameters(self) -> int:
        norms = self.layers * self.layer_norm_params + self.hidden  # and the final norm
        return self.linear_params + self.expert_params + self.router_params + self.embedding_params + norms

    @property
    def peft_wraps_experts(self) -> bool:
        """peft's v4->v5 conversion reaches this architecture's fused experts and router (a ParamWrapper)."""
        return self.is_moe and self.model_type in PEFT_EXPERT_TARGETS

    def _linear_modules(self) -> list[tuple[str, int, int, int]]:
        """nn.Linear layers that LoRA targets by name: (name, in, out, how many layers have it)."""
        h = self.hidden
        out = [(name, a, b, self.layers) for name, a, b in self._attention_linears()]

        def mlp(width: int, layers: int) -> list[tuple[str, int, int, int]]:
            gate = [("gate_proj", h, width, layers)] if self.gated_mlp else []
            return [*gate, ("up_proj", h, width, layers), ("down_proj", width, h, layers)]

        dense_layers = self.dense_layers if self.is_moe else self.layers
        if dense_layers:
            out += mlp(self.dense_mlp_intermediate, dense_layers)
        if self.shared_expert_intermediate and self.moe_layers:
            # Qwen2-MoE's shared_expert.{gate,up,down}_proj and shared_expert_gate, DeepSeek's shared_experts.*
            out += mlp(self.shared_expert_intermediate, self.moe_layers)
            if self._shared_gate:
                out.append(("shared_expert_gate", h, 1, self.moe_layers))
        return out

    def _wanted(self, targets: list[str]) -> list[tuple[str, int, int, int]]:
        # Where peft wraps the fused experts, its conversion takes the old MLP names (gate_proj, up_proj, down_proj,
        # w1-w3, gate) off the target list, "all-linear"'s too, for the experts: dense layers' and shared experts'
        # nn.Linear layers of those names stay unadapted.
        converted = set(PEFT_EXPERT_TARGETS[self.model_type]) if self.peft_wraps_experts else set()
        return [m for m in self._linear_modules() if m[0] not in converted
                and (targets == ["all-linear"] or any(t.split(".")[-1] == m[0] for t in targets))]

    def lora_parameters(self, r: int, targets: list[str]) -> int:
        """Adapter parameters (A: in x r, B: r x out) on the targeted linear layers, and where peft wraps a MoE's
        fused experts, on them and the router (gate_up_proj's rank doubled for its two fused projections)."""
        total = sum(r * (a + b) * n for _, a, b, n in self._wanted(targets))
        experts = self.expert_targets(targets)
        h, i, e = self.hidden, self.intermediate, self.experts
        if "gate_up_proj" in experts:
            total += self.moe_layers * 2 * r * e * (h + (2 if self.gated_mlp else 1) * i)
        if "down_proj" in experts:
            total += self.moe_layers * r * e * (i + h)
        if "router" in experts:
            total += self.moe_layers * r * (h + e)
        return total

    def expert_targets(self, targets: list[str]) -> set[str]:
        """Which of a MoE layer's fused parameters LoRA adapts: gate_up_proj, down_proj, router."""
        if not self.peft_wraps_experts:
            return set()
        mapping = PEFT_EXPERT_TARGETS[self.model_type]
        if targets == ["all-linear"]:
            return set(mapping.values())
        return {mapping[name] for t in targets if (name := t.split(".")[-1]) in mapping}

    @property
    def embedding_names(self) -> tuple[str, str]:
        """The input embedding's and the output head's module names."""
        return EMBEDDING_NAMES.get(self.model_type, ("embed_tokens", "lm_head"))

    def module_parameters(self) -> dict[str, int]:
        """Parameters of the modules a spec may name to train whole (LoRA's modulesToSave, freeze's
        extraTrainableModules), by the names transformers' decoders give them, over all layers."""
        out = {name: self.vocab * self.hidden for name in self.embedding_names}
        out.update({name: self.hidden for name in ("norm", "ln_f", "final_layernorm", "score")})
        norms = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm")[:self.norms_per_layer]
        out.update({name: self.hidden * self.layers for name in norms})
        if self.position_embeddings:
            out["wpe"] = self.position_embeddings * self.hidden
        for name, a, b, n in self._linear_modules():
            out[name] = out.get(name, 0) + a * b * n
        return out

    def lora_out_width(self, targets: list[str]) -> float:
        """The output widths of the linear layers the targets name, summed over a layer (their mean over layers)."""
        return sum(b * n for _, _, b, n in self._wanted(targets)) / max(1, self.layers)

    def largest_lora_linear(self, targets: list[str]) -> tuple[int, int]:
        """(in, out) of the targeted linear layer with the widest input (DoRA's norm builds an in x in identity)."""
        wanted = self._wanted(targets)
        return max(((a, b) for _, a, b, _ in wanted), key=lambda ab: (ab[0] * ab[0] + ab[0] * ab[1]), default=(0, 0))

    def lora_targets(self, targets: list[str]) -> int:
        """How many of a layer's linear layers (a dense Llama layer's seven) the targets name."""
        return len({m[0] for m in self._wanted(targets)})


def _dense_layers(config: dict[str, Any], layers: int) -> int:
    """A MoE model's layers with a dense MLP: DeepSeek's first first_k_dense_replace; Qwen-MoE's mlp_only_layers and
    those decoder_sparse_step skips (transformers: a layer is sparse when (index + 1) % step == 0)."""
    first = int(config.get("first_k_dense_replace") or 0)
    only = set(config.get("mlp_only_layers") or [])
    step = int(config.get("decoder_sparse_step") or 1)
    return sum(1 for i in range(layers) if i < first or i in only or (i + 1) % step != 0)
