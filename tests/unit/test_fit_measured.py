"""The fit estimate against what torch actually allocates, on CPU, term by term: Llama- and Qwen2-shaped models
built from configs (up to ~40M parameters), full and LoRA, fp32 and bf16, sdpa and eager. Weights, gradients and
optimizer states are counted from the live tensors after a real AdamW step; activations are every storage autograd
saves for backward (saved-tensor hooks), which is what the activation terms predict. Each within 15%."""

import pytest

torch = pytest.importorskip("torch")

from finetune_operator.api.validation import validate_job  # noqa: E402
from finetune_operator.fit import ModelShape, estimate  # noqa: E402
from finetune_operator.fit.activations import outside_bytes_per_token  # noqa: E402
from tests.builders import make_job  # noqa: E402

TOLERANCE = 0.15
SEQ, BATCH = 128, 2

SHAPES = {
    # name: (model_type, hidden, layers, heads, kv heads, intermediate, vocab)
    "tiny-llama": ("llama", 64, 2, 4, 2, 128, 512),
    "small-llama": ("llama", 512, 8, 8, 2, 1376, 16000),
    "small-qwen2": ("qwen2", 384, 6, 6, 2, 1024, 20000),
}


def build(kind: str, attention: str, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    model_type, hidden, layers, heads, kv, inter, vocab = SHAPES[kind]
    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[
        model_type]
    config = config_cls(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab, tie_word_embeddings=False,
                        attn_implementation=attention, use_cache=False)
    torch.manual_seed(0)
    model = model_cls(config).to(dtype)
    config_dict = {**config.to_dict(), "torch_dtype": str(dtype).removeprefix("torch.")}
    return model, config_dict


def job_spec(method: str, precision: str, attention: str, dropout: float = 0.05):
    return validate_job(make_job({
        "spec.model.name": "/models/m", "spec.method.type": method, "spec.method.lora": {"r": 8, "dropout": dropout},
        "spec.model.attnImplementation": attention, "spec.training.precision": precision,
        "spec.training.optim": "adamw_torch", "spec.training.perDeviceTrainBatchSize": BATCH,
        "spec.data.maxLength": SEQ, "spec.distributed.gpusPerNode": 0})).spec


def measure(model, vocab: int) -> dict[str, float]:
    """Bytes of weights, of everything autograd saves in one forward, of gradients and of AdamW's states."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = max(saved.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    model.train()
    ids = torch.randint(0, vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    optimizer.step()
    return {
        "weights": sum(p.numel() * p.element_size() for p in model.parameters()),
        "saved": sum(v for k, v in saved.items() if k not in params),
        "gradients": sum(p.grad.numel() * p.grad.element_size() for p in trainable),
        "optimizer states": sum(t.numel() * t.element_size() for state in optimizer.state.values()
                                for t in state.values() if torch.is_tensor(t) and t.dim() > 0),
    }


def within(predicted: float, measured: float, tolerance: float = TOLERANCE) -> bool:
    return abs(predicted - measured) <= tolerance * measured


CASES = [("tiny-llama", "full", "fp32", "sdpa"), ("small-llama", "full", "fp32", "sdpa"),
         ("small-llama", "full", "fp32", "eager"), ("small-qwen2", "full", "bf16", "sdpa"),
         ("small-qwen2", "full", "bf16", "eager"), ("small-llama", "lora", "fp32", "sdpa"),
         ("small-llama", "lora", "bf16", "sdpa"), ("small-qwen2", "lora-nodrop", "bf16", "sdpa")]


@pytest.mark.parametrize(("kind", "method", "precision", "attention"), CASES,
                         ids=["-".join(c) for c in CASES])
def test_each_term_is_within_15_percent_of_what_torch_allocates(kind, method, precision, attention):
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    model, config = build(kind, attention, dtype)
    spec = job_spec(method.removesuffix("-nodrop"), precision, attention,
                    dropout=0.0 if method.endswith("nodrop") else 0.05)
    if spec.method.type == "lora":
        from peft import LoraConfig, get_peft_model

        lora = spec.method.lora
        model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    shape = ModelShape.from_config(config)
    predicted = estimate(spec, shape)
    measured = measure(model, shape.vocab)
    tokens = BATCH * SEQ
    # The estimate's logits term adds the backward's transient gradient to what the forward saves.
    outside = outside_bytes_per_token(shape, 4 if precision == "fp32" else 2) * tokens
    saved = predicted.terms["activations"] + outside
    compared = {"weights": (predicted.terms["weights"], measured["weights"]),
                "gradients": (predicted.terms["gradients"], measured["gradients"]),
                "optimizer states": (predicted.terms["optimizer states"], measured["optimizer states"]),
                "saved for backward": (saved, measured["saved"])}
    # The layers' share alone (the logits dominate small models' total), held tighter than the 15%: the
    # coefficients were fitted exactly, so a 10% error in one of them fails here.
    layers = (predicted.terms["activations"], measured["saved"] - outside)
    total_predicted = sum(p for p, _ in compared.values())
    total_measured = sum(m for _, m in compared.values())
    report = {k: f"{p / 2**20:.2f} vs {m / 2**20:.2f} MiB" for k, (p, m) in compared.items()}
    assert all(within(p, m) for p, m in compared.values()), report
    assert within(*layers, tolerance=0.07), (layers, report)
    assert within(total_predicted, total_measured), report
