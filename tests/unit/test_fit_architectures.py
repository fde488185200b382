"""The counts the fit check rests on, against the models transformers builds, architecture by architecture (dense,
tied embeddings, Mixtral-, Qwen-MoE- and DeepSeek-shaped MoE with shared experts and dense layers, multi-head latent
attention), and the fit line itself: for every method x strategy x checkpointing x model, a GPU a hair larger than
the estimate fits and one a hair smaller is refused, with changes that fit, through the check and `finetune
validate`'s exit code."""

import json
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")

from finetune_operator.api.validation import validate_job  # noqa: E402
from finetune_operator.cli.main import EXIT_DOES_NOT_FIT, EXIT_OK, main  # noqa: E402
from finetune_operator.fit import GIB, ModelShape, check_fit  # noqa: E402
from tests.builders import make_job  # noqa: E402

CONFIGS = Path(__file__).parents[1] / "data" / "model_configs"
SMALL = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             vocab_size=1000, tie_word_embeddings=False, use_cache=False)
MLA = dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_group=1, topk_group=1,
           moe_intermediate_size=48, n_routed_experts=4, num_experts_per_tok=2)
ARCHITECTURES = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama-big-vocabulary": ("llama", {"vocab_size": 64_000}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3": ("qwen3", {"head_dim": 24}),
    "gemma2": ("gemma2", {"head_dim": 16, "tie_word_embeddings": True}),
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2_moe-shared-expert": ("qwen2_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
                                              "shared_expert_intermediate_size": 80}),
    "qwen2_moe-mlp-only-layer": ("qwen2_moe", {"num_experts": 4, "num_experts_per_tok": 2,
                                               "moe_intermediate_size": 48, "shared_expert_intermediate_size": 80,
                                               "mlp_only_layers": [1]}),
    "qwen2_moe-sparse-step-2": ("qwen2_moe", {"num_experts": 4, "num_experts_per_tok": 2,
                                              "moe_intermediate_size": 48, "shared_expert_intermediate_size": 80,
                                              "decoder_sparse_step": 2}),
    "qwen3_moe": ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
                                "head_dim": 16}),
    "olmoe": ("olmoe", {"num_experts": 4, "num_experts_per_tok": 2}),
    "granitemoe": ("granitemoe", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "glm4_moe": ("glm4_moe", {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
                              "n_shared_experts": 1, "first_k_dense_replace": 1, "head_dim": 16}),
    "deepseek_v2-mla": ("deepseek_v2", {**MLA, "n_shared_experts": 2, "first_k_dense_replace": 1,
                                        "q_lora_rank": None}),
    "deepseek_v3-mla-q-lora": ("deepseek_v3", {**MLA, "n_shared_experts": 1, "first_k_dense_replace": 1,
                                               "q_lora_rank": 32}),
}


def built(name: str):
    """The model transformers builds (on the meta device: shapes only) and its config as config.json has it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, extra = ARCHITECTURES[name]
    config = AutoConfig.for_model(model_type, **{**SMALL, **extra})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return model, config.to_dict()


def decoder_linears(model) -> list[torch.nn.Linear]:
    return [m for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)]


def numel(params) -> int:
    return sum(p.numel() for p in params)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_the_counts_are_the_built_models(name):
    """Every weight (biases aside: Qwen's q/k/v biases, at most 0.3% here and 0.04% at real sizes), the nn.Linear
    weights bitsandbytes quantizes (fused experts and routers are not nn.Linear: they stay 16-bit, fp32 under
    QLoRA), and the largest layer a sharded strategy gathers: exactly the built model's. The issue's MoE QLoRA was
    priced as if every parameter were quantized; DeepSeek's latent attention was counted as a plain one (0.9% low
    for DeepSeek-V2-Lite, 16% low in what bitsandbytes quantizes)."""
    model, config = built(name)
    shape = ModelShape.from_config(config)
    weights = [p for n, p in model.named_parameters() if not n.endswith(".bias")]
    biases = numel(p for n, p in model.named_parameters() if n.endswith(".bias"))
    assert shape.parameters == numel(weights)
    assert biases <= 0.003 * numel(weights)
    assert shape.linear_params == numel(m.weight for m in decoder_linears(model))
    assert shape.layer_params == max(numel(p for n, p in layer.named_parameters() if not n.endswith(".bias"))
                                     for layer in model.model.layers)
    assert shape.is_moe == (shape.expert_params > 0)
    if shape.is_moe:
        fused = numel(p for n, p in model.named_parameters() if ".experts." in n and p.dim() == 3)
        assert shape.expert_params == fused


@pytest.mark.parametrize("name", ARCHITECTURES)
@pytest.mark.parametrize("targets", [["all-linear"], ["o_proj", "down_proj"]], ids=["all-linear", "o-down"])
def test_lora_parameters_are_what_peft_builds_on_each_architecture(name, targets):
    """peft's trainable parameters on every architecture: latent attention's own projections, shared experts of
    their own width beside dense layers of another, the fused experts and router where peft wraps them."""
    from peft import LoraConfig, get_peft_model

    model, config = built(name)
    shape = ModelShape.from_config(config)
    target = "all-linear" if targets == ["all-linear"] else targets
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=target,
                                                  task_type="CAUSAL_LM"))
    assert shape.lora_parameters(4, targets) == numel(p for p in peft_model.parameters() if p.requires_grad)


def spec(**overrides):
    base = {"spec.model.name": "/models/m", "spec.method.type": "full", "spec.data.maxLength": 2048,
            "spec.distributed.gpusPerNode": 1, "spec.method.lora": {"dropout": 0.0}}
    return validate_job(make_job({**base, **overrides})).spec


EIGHT = {"spec.distributed.gpusPerNode": 8}
CONFIGURATIONS = {
    "full": {},
    "full-checkpointing": {"spec.training.gradientCheckpointing": True},
    "lora": {"spec.method.type": "lora"},
    "lora-checkpointing": {"spec.method.type": "lora", "spec.training.gradientCheckpointing": True},
    "qlora-checkpointing": {"spec.method.type": "qlora", "spec.model.quantization": "4bit",
                            "spec.training.gradientCheckpointing": True},
    "ddp-8": {**EIGHT, "spec.training.gradientCheckpointing": True},
    "zero2-8": {**EIGHT, "spec.distributed.strategy": "deepspeed", "spec.distributed.deepspeed": {"zeroStage": 2}},
    "zero3-8-checkpointing": {**EIGHT, "spec.distributed.strategy": "deepspeed",
                              "spec.distributed.deepspeed": {"zeroStage": 3},
                              "spec.training.gradientCheckpointing": True},
    "fsdp-8": {**EIGHT, "spec.distributed.strategy": "fsdp"},
    "fsdp-8-activation-checkpointing": {**EIGHT, "spec.distributed.strategy": "fsdp",
                                        "spec.distributed.fsdp": {"activationCheckpointing": True}},
}
MODELS = {"llama-3.1-8b": {}, "qwen2.5-0.5b": {}, "mixtral-8x7b": {}, "deepseek-v2-lite": {},
          "gemma-2-9b": {"spec.model.attnImplementation": "eager"}}
HAIR = 0.02  # GiB either side of the estimate


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_a_hair_below_the_estimate_is_refused_with_changes_that_fit_and_a_hair_above_fits(model, configuration):
    """The same spec on a GPU just larger than its estimate fits; just smaller it is refused, and every change
    offered is a spec the API takes that fits that GPU (the issue: an FSDP spec's advice did not validate), none
    offered twice."""
    config = json.loads((CONFIGS / f"{model}.json").read_text())
    overrides = {**MODELS[model], **CONFIGURATIONS[configuration]}
    needed = check_fit(spec(**overrides), config).estimate.needed / GIB
    above = check_fit(spec(**overrides, **{"spec.resources.gpuMemoryGiB": round(needed + HAIR, 2)}), config)
    assert above.fits and above.checked, above.message()
    below = check_fit(spec(**overrides, **{"spec.resources.gpuMemoryGiB": round(needed - HAIR, 2)}), config)
    assert not below.fits and below.message().startswith("does not fit: needs "), below.message()
    for suggestion in below.suggestions:
        assert suggestion.estimate.needed <= (needed - HAIR) * GIB, suggestion.change
    assert len({s.change for s in below.suggestions}) == len(below.suggestions), [s.change for s in below.suggestions]


@pytest.mark.parametrize("configuration", ["lora-checkpointing", "zero3-8-checkpointing",
                                           "fsdp-8-activation-checkpointing"])
def test_validate_exits_0_a_hair_above_the_line_and_3_a_hair_below(tmp_path, configuration, capsys):
    """What a CI gate sees: `finetune validate` exits 3 for a valid spec a hair over its GPU, 0 a hair under."""
    model = str(CONFIGS / "mixtral-8x7b.json")
    overrides = CONFIGURATIONS[configuration]
    needed = check_fit(spec(**overrides), json.loads(Path(model).read_text())).estimate.needed / GIB
    for gib, code in ((round(needed + HAIR, 2), EXIT_OK), (round(needed - HAIR, 2), EXIT_DOES_NOT_FIT)):
        doc = make_job({"spec.model.name": "/models/m", "spec.method.type": "full", "spec.data.maxLength": 2048,
                        "spec.distributed.gpusPerNode": 1, "spec.method.lora": {"dropout": 0.0}, **overrides,
                        "spec.resources.gpuMemoryGiB": gib})
        path = tmp_path / f"job-{gib}.yaml"
        path.write_text(yaml.safe_dump(doc))
        assert main(["validate", str(path), "--model-config", model]) == code, capsys.readouterr().out
        assert ("DOES NOT FIT" in capsys.readouterr().out) == (code == EXIT_DOES_NOT_FIT)
