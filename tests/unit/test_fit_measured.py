"""The fit estimate against what torch actually holds, on CPU.

1. Term by term: Llama-, Qwen2-, Qwen3- and Gemma-2-shaped models and MoE layers built from configs, full and LoRA,
   fp32 and bf16 (under autocast, as the Trainer runs), sdpa and eager. Weights, gradients and optimizer states
   from the live tensors after a real AdamW step; every layer's saved activations from torch's saved-tensor hooks.
2. The whole step's peak, through transformers' Trainer itself (tests/support/memory_probe.PeakTracker counts every
   storage an op creates, as torch.cuda.max_memory_allocated does on a GPU): the loss's peak over the vocabulary,
   the phases of a step, evaluation. Predicted / measured must land in [1.00, 1.15]: a gate errs high, and close.
   The Trainer runs here in this process as on one GPU (no DDP wrapper, dropout as CUDA keeps it), so the estimate
   is asked for that job; benchmarks/memory_measured.py runs `finetune run` itself."""

import contextlib

import pytest

torch = pytest.importorskip("torch")

from finetune_operator.api.validation import validate_job  # noqa: E402
from finetune_operator.fit import ModelShape, estimate  # noqa: E402
from finetune_operator.fit.activations import dropout_kernel, layer_bytes_per_token  # noqa: E402
from tests.builders import make_job  # noqa: E402
from tests.support.memory_probe import (  # noqa: E402
    PeakTracker,
    add_lora,
    build_model,
    cuda_dropout,
    model_config,
    saved_by_layer,
    state_tensors,
)

TOLERANCE = 0.15
SEQ, BATCH = 128, 2
LOW, HIGH = 1.00, 1.15

SHAPES = {
    # name: (model_type, hidden, layers, heads, kv heads, intermediate, vocab, extra config)
    "tiny-llama": ("llama", 64, 2, 4, 2, 128, 512, {}),
    "small-llama": ("llama", 256, 4, 8, 2, 688, 8000, {}),
    "small-qwen2": ("qwen2", 192, 3, 6, 2, 512, 8000, {}),
    "small-qwen3": ("qwen3", 192, 3, 6, 2, 512, 8000, {"head_dim": 32}),
    "small-gemma2": ("gemma2", 192, 3, 4, 2, 512, 8000, {"head_dim": 48, "query_pre_attn_scalar": 48,
                                                         "final_logit_softcapping": 30.0,
                                                         "attn_logit_softcapping": 50.0}),
    "small-mixtral": ("mixtral", 128, 3, 4, 2, 192, 4000, {"num_local_experts": 4, "num_experts_per_tok": 2}),
    # DeepSeek-V3's latent attention (values as wide as the keys: CPU's sdpa then runs its flash kernel, as CUDA's
    # would), a dense first layer, a shared expert; Qwen2-MoE's gated shared expert and a dense layer.
    "small-deepseek_v3": ("deepseek_v3", 128, 3, 4, 4, 256, 4000, {
        "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 48,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 96, "n_shared_experts": 1,
        "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}),
    "small-qwen2_moe": ("qwen2_moe", 128, 3, 4, 2, 256, 4000, {
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 96,
        "shared_expert_intermediate_size": 128, "mlp_only_layers": [0]}),
}


def build(kind: str, attention: str, dtype):
    model_type, hidden, layers, heads, kv, inter, vocab, extra = SHAPES[kind]
    config = model_config(model_type, hidden=hidden, layers=layers, heads=heads, kv_heads=kv, intermediate=inter,
                          vocab=vocab, attention=attention, **extra)
    model = build_model(config, dtype)
    return model, {**config.to_dict(), "torch_dtype": str(dtype).removeprefix("torch.")}


def job_spec(method: str, precision: str, attention: str, dropout: float = 0.05, gpus: int = 0, **extra):
    return validate_job(make_job({
        "spec.model.name": "/models/m", "spec.method.type": method, "spec.method.lora": {"r": 8, "dropout": dropout},
        "spec.model.attnImplementation": attention, "spec.training.precision": precision,
        "spec.training.optim": "adamw_torch", "spec.training.perDeviceTrainBatchSize": BATCH,
        "spec.data.maxLength": SEQ, "spec.distributed.gpusPerNode": gpus, **extra})).spec


def measure(model, vocab: int, autocast) -> dict[str, float]:
    """Bytes of weights, of everything the layers save in one forward, of gradients and of AdamW's states."""
    ids = torch.randint(0, vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    per_layer, _ = saved_by_layer(model, ids, autocast=autocast)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast is not None):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    optimizer.step()
    return {
        "weights": sum(p.numel() * p.element_size() for p in model.parameters()),
        "layers": sum(per_layer),
        "gradients": sum(p.grad.numel() * p.grad.element_size() for p in trainable),
        "optimizer states": sum(t.numel() * t.element_size() for state in optimizer.state.values()
                                for t in state.values() if torch.is_tensor(t) and t.dim() > 0),
    }


def within(predicted: float, measured: float, tolerance: float = TOLERANCE) -> bool:
    return abs(predicted - measured) <= tolerance * measured


CASES = [("tiny-llama", "full", "fp32", "sdpa"), ("small-llama", "full", "fp32", "sdpa"),
         ("small-llama", "full", "fp32", "eager"), ("small-qwen2", "full", "bf16", "sdpa"),
         ("small-qwen2", "full", "bf16", "eager"), ("small-llama", "lora", "fp32", "sdpa"),
         ("small-llama", "lora", "bf16", "sdpa"), ("small-qwen2", "lora-nodrop", "bf16", "sdpa"),
         ("small-llama", "lora-cuda", "bf16", "sdpa"), ("small-qwen3", "full", "bf16", "sdpa"),
         ("small-gemma2", "full", "bf16", "eager"), ("small-gemma2", "full", "fp32", "eager"),
         ("small-mixtral", "full", "bf16", "sdpa"), ("small-mixtral", "lora-nodrop", "fp32", "sdpa")]


@pytest.mark.parametrize(("kind", "method", "precision", "attention"), CASES, ids=["-".join(c) for c in CASES])
def test_each_term_is_within_15_percent_of_what_torch_allocates(kind, method, precision, attention):
    """Every term within 15%, and the layers' saved activations within 7% (the coefficients were fitted to 2-24
    bytes a token: a coefficient 10% off fails here). "lora-cuda": dropout as CUDA keeps it (a GPU job)."""
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    model, config = build(kind, attention, dtype)
    dropout = 0.0 if method.endswith("nodrop") else 0.05
    spec = job_spec("full" if method == "full" else "lora", precision, attention, dropout=dropout,
                    gpus=1 if method == "lora-cuda" else 0)
    if spec.method.type == "lora":
        model = add_lora(model, r=spec.method.lora.r, dropout=dropout)
    shape = ModelShape.from_config(config)
    predicted = estimate(spec, shape)
    with cuda_dropout() if method == "lora-cuda" else contextlib.nullcontext():
        measured = measure(model, shape.vocab, torch.bfloat16 if precision == "bf16" else None)
    compute = 4 if precision == "fp32" else 2
    adapter = dropout_kernel(dropout, method == "lora-cuda") if spec.method.type == "lora" else None
    rank = (8, shape.lora_targets(["all-linear"])) if adapter else (0, 0)
    layers = shape.layers * layer_bytes_per_token(shape, compute, attention, SEQ, lora=adapter, lora_rank=rank[0],
                                                  lora_targets=rank[1], moe=shape.is_moe) * BATCH * SEQ
    layers += predicted.terms.get("adapted expert weights", 0.0)
    compared = {"weights": (predicted.terms["weights"], measured["weights"]),
                "gradients": (predicted.terms["gradients"], measured["gradients"]),
                "optimizer states": (predicted.terms["optimizer states"], measured["optimizer states"]),
                "layers' activations": (layers, measured["layers"])}
    report = {k: f"{p / 2**20:.2f} vs {m / 2**20:.2f} MiB" for k, (p, m) in compared.items()}
    assert all(within(p, m) for p, m in compared.values()), report
    assert within(*compared["layers' activations"], tolerance=0.07), report


# (model_type, config): a dense layer first, MoE layers after; DeepSeek's latent attention with values narrower
# than the keys (CPU's sdpa falls back to its math kernel, as the estimate of a CPU job counts).
FAMILIES = {
    "deepseek_v3": ("deepseek_v3", {"q_lora_rank": 96, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
                                    "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 4,
                                    "moe_intermediate_size": 128, "n_shared_experts": 1, "first_k_dense_replace": 1,
                                    "n_group": 1, "topk_group": 1}),
    "deepseek_v2": ("deepseek_v2", {"q_lora_rank": None, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
                                    "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 4,
                                    "moe_intermediate_size": 128, "n_shared_experts": 2, "first_k_dense_replace": 1,
                                    "n_group": 1, "topk_group": 1}),
    "glm4_moe": ("glm4_moe", {"head_dim": 32, "n_routed_experts": 4, "moe_intermediate_size": 128,
                              "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}),
    "qwen2_moe": ("qwen2_moe", {"num_experts": 4, "moe_intermediate_size": 128,
                                "shared_expert_intermediate_size": 256, "mlp_only_layers": [0]}),
}


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("family", FAMILIES)
def test_each_layer_of_the_moe_and_latent_attention_families_within_7_percent(family, precision):
    """Dense and MoE layers of each family, each against what it saves: latent attention's projections, a MoE
    model's dense layers at their own (wider) MLP, shared experts, gates and routers (before: DeepSeek's layers
    were counted at 0.34-0.73 of what they keep, GLM-4-MoE's and Qwen2-MoE's dense layers at 0.63-0.70 and their
    MoE layers at 0.93-0.98)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, extra = FAMILIES[family]
    config = AutoConfig.for_model(model_type, hidden_size=256, num_hidden_layers=2, num_attention_heads=8,
                                  num_key_value_heads=8, intermediate_size=512, vocab_size=4000,
                                  num_experts_per_tok=2, tie_word_embeddings=False, use_cache=False, **extra)
    dtype, compute = (torch.bfloat16, 2) if precision == "bf16" else (torch.float32, 4)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(dtype)
    shape = ModelShape.from_config(config.to_dict())
    assert shape.dense_layers == 1 and shape.moe_layers == 1
    ids = torch.randint(0, 4000, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    per_layer, _ = saved_by_layer(model, ids, autocast=torch.bfloat16 if precision == "bf16" else None)
    for layer, moe in ((0, False), (1, True)):
        predicted = layer_bytes_per_token(shape, compute, "sdpa", SEQ, moe=moe, gpu=False) * BATCH * SEQ
        assert 0.98 <= predicted / per_layer[layer] <= 1.07, (layer, predicted / per_layer[layer])


class _Rows(torch.utils.data.Dataset):
    def __init__(self, vocab: int, seq: int, n: int = 16):
        self.vocab, self.seq, self.n = vocab, seq, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        ids = torch.randint(0, self.vocab, (self.seq,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


STEPS = [  # (id, shape, precision, attention, spec overrides)
    ("llama bf16", "small-llama", "bf16", "sdpa", {}),
    ("llama fp32 checkpointing", "small-llama", "fp32", "sdpa", {"spec.training.gradientCheckpointing": True}),
    ("llama bf16 LoRA", "small-llama", "bf16", "sdpa", {"spec.method.type": "lora"}),
    ("gemma2 bf16 softcapped", "small-gemma2", "bf16", "eager", {}),
    ("mixtral bf16", "small-mixtral", "bf16", "sdpa", {}),
    ("deepseek_v3 bf16", "small-deepseek_v3", "bf16", "sdpa", {}),
    ("qwen2_moe fp32", "small-qwen2_moe", "fp32", "sdpa", {}),
    ("llama bf16 evaluation batch 16", "small-llama", "bf16", "sdpa", {
        "spec.training.perDeviceEvalBatchSize": 16, "spec.training.evalStrategy": "steps",
        "spec.training.evalSteps": 1, "spec.data.validation": [{"path": "/data/v.jsonl"}]}),
]


@pytest.mark.parametrize(("name", "kind", "precision", "attention", "overrides"), STEPS, ids=[s[0] for s in STEPS])
def test_the_peak_of_training_steps_through_transformers_trainer(name, kind, precision, attention, overrides,
                                                                  tmp_path):
    """Two steps of transformers' Trainer (accelerate's autocast and fp32 copy of the output logits, the loss, the
    backward, AdamW, zeroing the gradients, evaluation where asked): the peak of live tensor bytes against the
    estimate's peak for the same job on one GPU (the issue: the loss's peak was 12.2 bytes per vocabulary entry and
    token against 10 predicted, Gemma-2's 14.3, and the evaluation batch was not counted)."""
    from transformers import Trainer, TrainingArguments

    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    model, config = build(kind, attention, dtype)
    spec = job_spec("full", precision, attention, gpus=1, **{"spec.training.optim": "adamw_torch_fused",
                                                             **overrides})
    if spec.method.type == "lora":
        model = add_lora(model, r=spec.method.lora.r, dropout=spec.method.lora.dropout)
    vocab = config["vocab_size"]
    evaluating = spec.training.eval_strategy != "no"
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, bf16=precision == "bf16", per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=spec.training.per_device_eval_batch_size, max_steps=2,
        optim=spec.training.optim, report_to=[], save_strategy="no", logging_steps=100, disable_tqdm=True,
        dataloader_num_workers=0, eval_strategy="steps" if evaluating else "no", eval_steps=1,
        activation_checkpointing=spec.training.gradient_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False} if spec.training.gradient_checkpointing else None)
    trainer = Trainer(model=model, args=args, train_dataset=_Rows(vocab, SEQ),
                      eval_dataset=_Rows(vocab, SEQ, 16) if evaluating else None)
    tracker = PeakTracker()
    tracker.track(state_tensors(model))
    with tracker, cuda_dropout():
        trainer.train()
    predicted = estimate(spec, ModelShape.from_config(config))
    ratio = predicted.peak / tracker.peak
    assert LOW <= ratio <= HIGH, (ratio, predicted.peak_phase, tracker.peak / 2**20, predicted.table())
    if evaluating:
        assert predicted.peak_phase == "evaluation"
