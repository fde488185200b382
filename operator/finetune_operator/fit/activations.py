"""Bytes the autograd graph keeps per token for backward, by layer, and the loss's peak around the layers.

The coefficients were measured, not derived (benchmarks/activation_coefficients.py prints them again): decoder layers
of each family built from small configs run forward on CPU under torch's saved-tensor hooks, every saved storage
counted once, at shapes that vary each width independently, and a least-squares fit per family (largest residual
2 bytes a token for full fine-tunes, 24 for LoRA). Sixteen-bit rows ran under torch.autocast as accelerate runs the
Trainer. tests/unit/test_fit_measured.py measures them again against the installed transformers.
The loss's peak was measured through transformers' Trainer itself (its forward wrapped by accelerate, which copies
the logits to fp32): the slope of the whole step's peak over vocabulary x tokens."""

from dataclasses import dataclass, fields

from .shape import QK_NORM, SANDWICH_NORMS, SHARED_EXPERT_GATE, ModelShape


@dataclass(frozen=True)
class Coef:
    """Bytes per token per layer, per unit of each width."""

    h: float = 0.0  # x hidden
    q: float = 0.0  # x heads * head_dim
    kv: float = 0.0  # x kv heads * head_dim
    i: float = 0.0  # x intermediate (dense MLP, shared expert)
    heads: float = 0.0  # x heads (attention's log-sum-exp)
    scores: float = 0.0  # x heads x sequence (eager attention keeps its probabilities)
    rank: float = 0.0  # x LoRA rank x adapted linear layers

    def __add__(self, other: "Coef") -> "Coef":
        return Coef(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


# Llama's layer (Mistral, Qwen2 and Mixtral's attention measure the same), sdpa, a full fine-tune, by compute bytes.
_FULL = {2: Coef(h=16.1, q=4.0, kv=4.0, i=8.0, heads=3.4), 4: Coef(h=24.1, q=8.0, kv=8.0, i=16.0, heads=3.4)}
# Eager attention repeats k and v to every head and keeps the softmax (fp32 at 16 bits, and its cast).
_EAGER = {2: Coef(q=4.0, kv=-4.0, heads=-3.3, scores=6.0), 4: Coef(q=8.0, kv=-8.0, heads=-3.3, scores=4.0)}
_SOFTCAPPED_SCORES = {2: 2.0, 4: 4.0}  # Gemma-2's tanh over the scores keeps its output
# Family differences, measured the same way: Qwen3's per-head q/k norms, Gemma-2's four norms a layer.
_QK_NORM = {2: Coef(q=5.9, kv=6.2, heads=5.9), 4: Coef(q=7.9, kv=8.2, heads=5.9)}
_SANDWICH = {2: Coef(h=20.2), 4: Coef(h=16.2)}
# LoRA on every linear layer (all-linear), against a full fine-tune of the same layer: the frozen base keeps less,
# each adapter keeps its input (cast to fp32 by peft, to 16 bits again by autocast) and, with dropout, the mask:
# CPU's dropout keeps it in the input's dtype, CUDA's (native_dropout) as bools.
_LORA = {
    (2, "cpu"): Coef(h=22.3, q=5.9, kv=0.2, i=4.0, heads=5.7, rank=3.7),
    (2, "cuda"): Coef(h=7.3, q=2.9, kv=0.2, i=1.0, heads=5.7, rank=3.7),
    (2, "none"): Coef(h=2.3, q=1.9, kv=0.2, i=0.0, heads=5.7, rank=3.7),
    (4, "cpu"): Coef(h=23.9, q=8.0, kv=0.0, i=4.0, heads=1.1, rank=4.0),
    (4, "cuda"): Coef(h=8.9, q=5.0, kv=0.0, i=1.0, heads=1.1, rank=4.0),
    (4, "none"): Coef(h=-8.1, q=0.0, kv=0.0, i=0.0, heads=1.1, rank=4.0),
}
# A MoE layer's experts (transformers 5's grouped_mm over the fused experts; Mixtral and Qwen3-MoE measure alike), in
# place of the dense MLP's intermediate term: x intermediate x top-k, x hidden x top-k, x experts (the router).
_MOE = {2: (8.3, 4.3, 11.0), 4: (16.3, 8.3, 12.4)}
# Multi-head latent attention (DeepSeek-V2/V3) beyond what its q and kv widths count as a Llama layer's: the latent
# projections and their norms, the rotary and non-rotary parts put together per head, values of their own width. x
# q_lora_rank, x kv_lora_rank, x heads * (qk_nope + qk_rope), x heads * v_head_dim; measured like the others (nine
# shapes, largest residual 25 bytes a token at 16 bits, 97 at fp32). On CPU, sdpa with values of another head width
# than the keys falls back to its math kernel, which keeps the probabilities (4 bytes a score at either precision);
# CUDA's memory-efficient kernel takes unequal widths and keeps none.
_MLA = {2: (8.0, 8.2, 2.1, 4.0), 4: (12.0, 13.1, -3.8, 4.1)}
MLA_MATH_SDPA_SCORE_BYTES = 4.0
# Family extras, measured the same way (five to eight shapes each, x hidden or x q width, per token): Qwen2-MoE's
# sigmoid gate over its shared expert; the MoE layers of DeepSeek-V2/V3 and GLM-4-MoE at 16 bits (their routers'
# fp32 scores and the shared experts' sum); GLM-4-MoE's attention, which keeps one more copy of its queries.
_SHARED_GATE_H = {2: 1.8, 4: 4.3}
_SIGMOID_ROUTER_H = {2: 1.5, 4: 0.0}
SIGMOID_ROUTER = frozenset({"deepseek_v2", "deepseek_v3", "glm4_moe", "glm4v_moe"})
_QUERY_COPY = {2: 2.1, 4: 4.3}
QUERY_COPY = frozenset({"glm4_moe", "glm4v_moe"})
# peft's ParamWrapper builds W + BA for a layer's experts in the forward and keeps it: bytes per expert parameter.
EXPERT_ADAPTED_BYTES = {2: 2.4, 4: 4.05}
# DoRA (peft's DoraLinearLayer) scales the base output and the adapter's by the magnitude over the weight's norm, and
# keeps both outputs for the backward: bytes per token per unit of a layer's adapted output width, two outputs in the
# compute dtype. Checked on CPU runs of our trainer (benchmarks/memory_measured.py's DoRA cases: 1.04-1.09 of the
# measured peak with the margin, bf16 and fp32, with and without dropout and checkpointing).
DORA_OUT_BYTES = {2: 4.0, 4: 8.0}
# Beside them, one adapted layer at a time builds its weight's norm: an identity of its input width (fp32) pushed
# through the adapter, B @ A in fp32 and in the compute dtype, and W + scale x BA.


def dora_norm_bytes(shape: ModelShape, targets: list[str], compute: int) -> float:
    a, b = shape.largest_lora_linear(targets)
    return 4.0 * a * a + a * b * (4.0 + 3.0 * compute)


# Liger's kernels keep less than eager PyTorch: its RMSNorm keeps the input instead of an fp32 copy and the
# normalised output (4 bytes x hidden less per norm), its SwiGLU/GeGLU recomputes the activation (compute bytes x
# intermediate less). Derived from the kernels' saved tensors (Triton: no CPU run), checked on one H200 run.
_LIGER_NORM_BYTES = 4.0

# torch.compile's partitioner recomputes cheap pointwise work in the backward instead of keeping it: a compiled layer
# keeps at most this share of eager's (the largest over the measured shapes; aot_autograd with the min-cut partitioner
# inductor uses, on CPU: 0.69-0.79 at 16 bits, 0.77-0.88 at fp32). The compiled loss is not modelled.
COMPILED_LAYER_SHARE = {2: 0.79, 4: 0.88}

# Around the layers, measured with the whole model: the final norm, the embedding's output, rotary tables (x hidden,
# x head_dim, constant); and the loss's peak per vocabulary entry per token (fp32 logits, log-softmax, its gradient,
# accelerate's fp32 copy of the output logits): 12 bytes at either precision, Gemma-2's final softcapping 2 (16-bit)
# or 4 (fp32) more. Evaluation (no gradients): 10 at 16 bits, 8 at fp32.
_OUTSIDE = {2: (8.0, 2.0, 20.0), 4: (12.0, 8.0, 20.0)}
LOSS_VOCAB_BYTES = 12.0
_SOFTCAPPED_LOSS = {2: 2.0, 4: 4.0}
EVAL_VOCAB_BYTES = {2: 10.0, 4: 8.0}


def dropout_kernel(lora_dropout: float, gpu: bool) -> str:
    return "none" if lora_dropout <= 0 else ("cuda" if gpu else "cpu")


def _layer(shape: ModelShape, compute: int, attention: str, lora: str | None, liger: bool) -> Coef:
    c = _FULL[compute]
    if shape.model_type in QK_NORM:
        c += _QK_NORM[compute]
    if shape.model_type in SANDWICH_NORMS:
        c += _SANDWICH[compute]
    if attention == "eager":
        c += _EAGER[compute]
        if shape.attn_logit_softcapping:
            c += Coef(scores=_SOFTCAPPED_SCORES[compute])
    if lora is not None:
        c += _LORA[(compute, lora)]
    if liger and lora is None:  # under LoRA the frozen norms keep less to begin with: left as eager's
        c += Coef(h=-_LIGER_NORM_BYTES * shape.norms_per_layer, i=-float(compute))
    return c


def _mla(shape: ModelShape, compute: int, attention: str, seq: int, gpu: bool) -> float:
    q_lora, kv_lora, qk, v = _MLA[compute]
    qk_dim = shape.qk_nope_head_dim + shape.qk_rope_head_dim
    extra = (q_lora * shape.q_lora_rank + kv_lora * shape.kv_lora_rank + qk * shape.heads * qk_dim
             + v * shape.heads * shape.v_head_dim)
    if attention == "sdpa" and not gpu and shape.v_head_dim != qk_dim:
        extra += MLA_MATH_SDPA_SCORE_BYTES * shape.heads * seq
    return extra


def layer_bytes_per_token(shape: ModelShape, compute: int, attention: str, seq: int, *, lora: str | None = None,
                          lora_rank: int = 0, lora_targets: int = 0, moe: bool = False, liger: bool = False,
                          gpu: bool = True) -> float:
    """One decoder layer's saved bytes per token. `lora`: None for a full fine-tune, else the dropout kernel
    (dropout_kernel()); `moe`: a MoE layer (its experts instead of a dense MLP); `gpu`: CUDA's kernels (else
    CPU's)."""
    c = _layer(shape, compute, attention, lora, liger)
    attn = (c.h * shape.hidden + c.q * shape.q_width + max(0.0, c.kv) * shape.kv_width + max(0.0, c.heads)
            * shape.heads + c.scores * shape.heads * seq + c.rank * lora_rank * lora_targets)
    if shape.is_mla:
        attn += _mla(shape, compute, attention, seq, gpu)
    if shape.model_type in QUERY_COPY:
        attn += _QUERY_COPY[compute] * shape.q_width
    if not moe:  # a dense layer (a MoE model's dense layers have their own, wider MLP)
        return attn + c.i * shape.dense_mlp_intermediate
    ik, hk, e = _MOE[compute]
    k = shape.experts_per_token
    experts = ik * shape.intermediate * k + hk * shape.hidden * k + e * shape.experts
    if shape.model_type in SHARED_EXPERT_GATE and shape.shared_expert_intermediate:
        experts += _SHARED_GATE_H[compute] * shape.hidden
    if shape.model_type in SIGMOID_ROUTER:
        experts += _SIGMOID_ROUTER_H[compute] * shape.hidden
    return attn + experts + c.i * shape.shared_expert_intermediate


def checkpointed_layer_bytes_per_token(shape: ModelShape, compute: int) -> float:
    """With gradient checkpointing a layer keeps only its input (the hidden state)."""
    return compute * shape.hidden


def outside_bytes_per_token(shape: ModelShape, compute: int) -> float:
    hidden, head_dim, const = _OUTSIDE[compute]
    return hidden * shape.hidden + head_dim * shape.head_dim + const


def loss_bytes_per_token(shape: ModelShape, compute: int) -> float:
    """The loss's peak per token: logits, their fp32 copies, log-softmax and its gradient, over the vocabulary."""
    vocab = LOSS_VOCAB_BYTES + (_SOFTCAPPED_LOSS[compute] if shape.final_logit_softcapping else 0.0)
    return vocab * shape.vocab + outside_bytes_per_token(shape, compute)


def liger_loss_bytes_per_token(shape: ModelShape, compute: int) -> float:
    """Liger's fused linear cross-entropy never holds the logits: it runs the head in chunks of about hidden /
    vocabulary of the tokens (rounded up to a power of two: up to twice that), computing each chunk's gradient in the
    forward, so it holds a chunk of logits (~2 x hidden a token at most), the input's gradient (hidden) and an fp32
    loss a token."""
    return 3 * compute * shape.hidden + 4 + outside_bytes_per_token(shape, compute)


def eval_bytes_per_token(shape: ModelShape, compute: int) -> float:
    """Evaluation's forward without gradients: the logits and the loss over the vocabulary."""
    return EVAL_VOCAB_BYTES[compute] * shape.vocab + outside_bytes_per_token(shape, compute)
