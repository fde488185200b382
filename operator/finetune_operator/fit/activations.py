"""Bytes the autograd graph keeps per token for backward, by layer and around the layers (embedding, logits, loss).

The coefficients were measured, not derived: transformers' Llama/Qwen2 layers run forward on CPU under
`torch.autograd.graph.saved_tensors_hooks`, every saved storage counted once, for shapes chosen so a least-squares
fit over (hidden + q width, kv width, intermediate, heads x sequence) is exact (residual 0).
tests/unit/test_fit_measured.py measures them again against the installed transformers and fails past 15%.
Sixteen-bit compute keeps fp32 copies where the model upcasts (RMSNorm's input, the softmax of eager attention,
the logits before the loss), hence the 16-bit coefficients are not half the fp32 ones."""

from dataclasses import dataclass

from .shape import ModelShape


@dataclass(frozen=True)
class LayerBytes:
    hq: float  # x (hidden + heads * head_dim)
    kv: float  # x kv_heads * head_dim
    mlp: float  # x intermediate (x experts per token for MoE)
    scores: float = 0.0  # x heads x sequence length (eager attention keeps its probabilities)
    rank: float = 0.0  # x LoRA rank x targeted modules


# (compute bytes, method kind, attention) -> per token per layer. "lora" with adapter dropout, "lora-nodrop" without.
_SDPA = {
    (4, "full"): LayerBytes(16, 8, 16),
    (2, "full"): LayerBytes(10, 4, 8),
    (4, "lora"): LayerBytes(32, 8, 20, rank=4),
    (2, "lora"): LayerBytes(30, 4, 14, rank=4),
    (4, "lora-nodrop"): LayerBytes(12, 8, 16, rank=4),
    (2, "lora-nodrop"): LayerBytes(18, 4, 10, rank=4),
}
# Eager attention repeats k and v to every head and keeps the attention probabilities (fp32 softmax at 16 bits).
_EAGER_DELTA = {4: LayerBytes(4, -8, 0, scores=4), 2: LayerBytes(2, -4, 0, scores=6)}
# Around the layers: the fp32 logits the loss keeps (4 x vocab), embeddings, rotary tables and the loss itself.
_OUTSIDE = {4: (4.0, 12.0, 8.0, 20.0), 2: (4.0, 8.0, 2.0, 20.0)}  # x vocab, x hidden, x head_dim, constant


def method_kind(method: str, lora_dropout: float) -> str:
    if method in ("lora", "qlora"):
        return "lora" if lora_dropout > 0 else "lora-nodrop"
    return "full"  # full and freeze keep what a full fine-tune keeps in the layers that train


def layer_bytes_per_token(shape: ModelShape, compute_bytes: int, kind: str, attention: str, seq: int,
                          lora_rank: int = 0, lora_targets: int = 0) -> float:
    c = _SDPA[(compute_bytes, kind)]
    eager = attention == "eager"
    d = _EAGER_DELTA[compute_bytes] if eager else LayerBytes(0, 0, 0)
    mlp_width = shape.intermediate * max(1, shape.experts_per_token if shape.experts > 1 else 1)
    return ((c.hq + d.hq) * (shape.hidden + shape.q_width) + max(0.0, c.kv + d.kv) * shape.kv_width
            + c.mlp * mlp_width + d.scores * shape.heads * seq + c.rank * lora_rank * lora_targets)


def outside_bytes_per_token(shape: ModelShape, compute_bytes: int) -> float:
    vocab, hidden, head_dim, const = _OUTSIDE[compute_bytes]
    return vocab * shape.vocab + hidden * shape.hidden + head_dim * shape.head_dim + const


def checkpointed_layer_bytes_per_token(shape: ModelShape, compute_bytes: int) -> float:
    """With gradient checkpointing a layer keeps only its input (the hidden state)."""
    return compute_bytes * shape.hidden
