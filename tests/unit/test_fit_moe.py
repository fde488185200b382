"""Mixture-of-experts and Gemma-2 as the stack really builds them, against the memory estimate: small configs of the
same classes on CPU (transformers 5's fused experts, peft's ParamWrapper, bitsandbytes' 4-bit load), and the
refusals that must come before any GPU is held (the preflight, `finetune validate`, the trainer before it loads)."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from finetune_operator.api.validation import validate_job  # noqa: E402
from finetune_operator.fit import GIB, ModelShape, check_fit, estimate  # noqa: E402
from finetune_operator.fit.buildable import NO_SDPA, cannot_build  # noqa: E402
from finetune_operator.fit.moe import PEFT_EXPERT_TARGETS  # noqa: E402
from finetune_operator.fit.states import NF4_BYTES  # noqa: E402
from tests.builders import make_job  # noqa: E402
from tests.support.memory_probe import add_lora, build_model, model_config  # noqa: E402

CONFIGS = Path(__file__).parents[1] / "data" / "model_configs"
MOE = ["mixtral", "qwen3_moe", "olmoe", "qwen2_moe"]  # the last: a MoE peft's conversion does not reach


def small(model_type: str, **extra):
    return model_config(model_type, hidden=48, layers=2, heads=4, kv_heads=2, intermediate=80, vocab=256,
                        experts=3, top_k=2, **extra)


def spec(**overrides):
    base = {"spec.model.name": "/models/m", "spec.method.type": "lora", "spec.distributed.gpusPerNode": 1}
    return validate_job(make_job({**base, **overrides})).spec


def test_the_expert_table_is_peft_s():
    """Which model types peft's v4->v5 conversion reaches (and what their old names adapt), as installed."""
    from peft.utils.transformers_weight_conversion import _MODEL_TO_CONVERSION_PATTERN, _MOE_TARGET_MODULE_MAPPING

    theirs = {model: {old: ("router" if new == "gate.weight" else new)
                      for old, new in _MOE_TARGET_MODULE_MAPPING[pattern].items()}
              for model, pattern in _MODEL_TO_CONVERSION_PATTERN.items() if pattern in _MOE_TARGET_MODULE_MAPPING}
    assert theirs == PEFT_EXPERT_TARGETS


def _peft_refuses(build, option: str) -> bool:
    """Whether peft refuses to build (a ValueError naming `option`)."""
    try:
        build()
    except ValueError as exc:
        assert option in str(exc)
        return True
    return False


@pytest.mark.parametrize("model_type", MOE)
@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "v_proj"]], ids=["all-linear", "attention"])
def test_lora_parameters_and_the_dropout_refusal_are_what_peft_builds(model_type, targets):
    """peft's trainable parameters on fused experts (gate_up_proj's rank doubled), the router and the attention,
    exactly; with dropout, peft refuses to build exactly where we refuse (and builds where we do not)."""
    config = small(model_type)
    shape = ModelShape.from_config(config.to_dict())
    target = "all-linear" if targets == ["all-linear"] else targets
    model = add_lora(build_model(config), r=4, dropout=0.0, targets=target)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert shape.lora_parameters(4, targets) == trainable
    ours = cannot_build(spec(**{"spec.method.lora": {"r": 4, "dropout": 0.05, "targetModules": targets}}), shape)
    refused = _peft_refuses(lambda: add_lora(build_model(config), r=4, dropout=0.05, targets=target), "lora_dropout")
    assert bool(ours) == refused, ours
    if refused:
        assert "spec.method.lora.dropout: 0.05" in ours[0] and "set method.lora.dropout: 0" in ours[0]


@pytest.mark.parametrize("model_type", MOE)
@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "v_proj"]], ids=["all-linear", "attention"])
def test_dora_is_refused_exactly_where_peft_refuses_it(model_type, targets):
    """DoRA on a MoE: peft's ParamWrapper (its fused experts) refuses use_dora; the attention's nn.Linear takes it."""
    from peft import LoraConfig, get_peft_model

    config = small(model_type)
    shape = ModelShape.from_config(config.to_dict())
    ours = cannot_build(spec(**{"spec.method.lora": {"r": 4, "dropout": 0.0, "targetModules": targets,
                                                     "useDora": True}}), shape)
    refused = _peft_refuses(lambda: get_peft_model(build_model(config), LoraConfig(
        r=4, lora_dropout=0.0, use_dora=True, task_type="CAUSAL_LM",
        target_modules="all-linear" if targets == ["all-linear"] else targets)), "use_dora")
    assert bool(ours) == refused, ours
    if refused:
        assert "spec.method.lora.useDora: true" in ours[0] and "set method.lora.useDora: false" in ours[0]


def test_qlora_leaves_the_fused_experts_unquantized_and_peft_upcasts_them(tmp_path):
    """bitsandbytes' 4-bit load (CPU) of a small Mixtral: only the attention's nn.Linear layers are quantized; after
    prepare_model_for_kbit_training every other parameter, experts and router included, is fp32. The estimate's
    QLoRA base weights count the same."""
    pytest.importorskip("bitsandbytes")
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from finetune_trainer.tiny_model import build_tiny_model

    directory = build_tiny_model(tmp_path / "m", architecture="mixtral",
                                 hidden=64, intermediate=128, layers=2, num_local_experts=4, num_experts_per_tok=2,
                                 dtype="bfloat16")
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
    model = prepare_model_for_kbit_training(AutoModelForCausalLM.from_pretrained(
        directory, quantization_config=quant, dtype="bfloat16", device_map="cpu"))
    shape = ModelShape.from_config(json.loads((directory / "config.json").read_text()))
    quantized = [p for p in model.parameters() if type(p).__name__ == "Params4bit"]
    others = [p for p in model.parameters() if type(p).__name__ != "Params4bit"]
    assert sum(p.numel() * 2 * 2 for p in quantized) == shape.linear_params  # 2 NF4 values a byte, bf16 storage
    assert all(p.dtype == torch.float32 for p in others)
    assert sum(p.numel() for p in others) == shape.parameters - shape.linear_params
    qlora = estimate(spec(**{"spec.method.type": "qlora", "spec.model.quantization": "4bit"}), shape)
    adapters = shape.lora_parameters(16, ["all-linear"]) * 4
    assert qlora.terms["weights"] - adapters == pytest.approx(
        shape.linear_params * NF4_BYTES + 4 * (shape.parameters - shape.linear_params))


def test_mixtral_qlora_is_priced_with_its_experts_in_fp32_and_refused_on_one_h100():
    """Mixtral-8x7B (46.7B): its 45.1B expert parameters stay unquantized and become fp32 (168 GiB); the issue's
    spec passed the preflight at 31.5 GiB."""
    shape = ModelShape.from_config(json.loads((CONFIGS / "mixtral-8x7b.json").read_text()))
    assert shape.parameters / 1e9 == pytest.approx(46.70, rel=0.002)
    assert shape.expert_params * 4 / GIB == pytest.approx(168, rel=0.01)
    qlora = spec(**{"spec.method.type": "qlora", "spec.model.quantization": "4bit",
                    "spec.method.lora": {"dropout": 0.0}, "spec.resources.gpuMemoryGiB": 80,
                    "spec.training.gradientCheckpointing": True})
    verdict = check_fit(qlora, json.loads((CONFIGS / "mixtral-8x7b.json").read_text()))
    assert verdict.estimate.terms["weights"] > 168 * GIB and not verdict.fits


def test_mixtral_lora_keeps_every_layers_adapted_experts_without_checkpointing():
    """peft's ParamWrapper keeps W + BA of each layer's experts for the backward (measured: 2.4 bytes an expert
    parameter at bf16): ~100 GiB for Mixtral without checkpointing, one layer's with it; attention-only adapters
    keep none, and the advice says so."""
    config = json.loads((CONFIGS / "mixtral-8x7b.json").read_text())
    shape = ModelShape.from_config(config)
    lora = {"spec.method.lora": {"dropout": 0.0}, "spec.data.maxLength": 1024}
    plain = estimate(spec(**lora), shape)
    assert plain.terms["adapted expert weights"] / GIB == pytest.approx(32 * 1.409e9 * 2.4 / GIB, rel=0.01)
    checkpointed = estimate(spec(**lora, **{"spec.training.gradientCheckpointing": True}), shape)
    assert checkpointed.terms["adapted expert weights"] == pytest.approx(plain.terms["adapted expert weights"] / 32)
    attention = estimate(spec(**{"spec.method.lora": {"targetModules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
                                 "spec.data.maxLength": 1024}), shape)
    assert "adapted expert weights" not in attention.terms
    verdict = check_fit(spec(**lora, **{"spec.resources.gpuMemoryGiB": 141}), config)
    assert not verdict.fits and any("targetModules" in s.change or "Checkpointing" in s.change
                                    for s in verdict.suggestions)


@pytest.mark.parametrize("model_type", sorted(NO_SDPA))
def test_an_architecture_without_sdpa_is_refused_with_eager_as_the_fix(model_type):
    from transformers import AutoModelForCausalLM

    config = model_config(model_type, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, vocab=128,
                          head_dim=16, attention="sdpa")
    with pytest.raises(ValueError, match="scaled_dot_product_attention"):
        AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    shape = ModelShape.from_config(config.to_dict())
    problems = cannot_build(spec(**{"spec.method.type": "full"}), shape)
    assert problems and "model.attnImplementation: eager" in problems[0]
    assert not cannot_build(spec(**{"spec.method.type": "full", "spec.model.attnImplementation": "eager"}), shape)
    llama = ModelShape.from_config(model_config("llama", hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64,
                                                vocab=128).to_dict())
    assert not cannot_build(spec(**{"spec.method.type": "full"}), llama)  # the architecture next to it builds


def test_gemma2_counts_its_softcapped_logits_and_four_norms():
    """Gemma-2-9B (9.24B, 256k vocabulary, head_dim 256): the loss peak has the softcapping's extra vocabulary-sized
    tensor, each layer four norms."""
    config = json.loads((CONFIGS / "gemma-2-9b.json").read_text())
    shape = ModelShape.from_config(config)
    assert shape.parameters / 1e9 == pytest.approx(9.24, rel=0.002)
    assert shape.final_logit_softcapping == 30.0 and shape.norms_per_layer == 4
    eager = {"spec.method.type": "full", "spec.model.attnImplementation": "eager"}
    gemma = estimate(spec(**eager), shape)
    plain = estimate(spec(**eager), ModelShape.from_config({**config, "final_logit_softcapping": None}))
    tokens = gemma.tokens_per_micro_batch
    assert gemma.terms["logits and loss"] - plain.terms["logits and loss"] == pytest.approx(2 * shape.vocab * tokens)
