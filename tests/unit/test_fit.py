"""The memory fit estimate's arithmetic: parameter counts of published models, the model-state accounting by
strategy, and the advice (every suggestion is estimated again and fits). Measured against torch in
test_fit_measured.py."""

import json
from pathlib import Path

import pytest

from finetune_operator.api.validation import validate_job
from finetune_operator.fit import GIB, ModelShape, UnknownShape, check_fit, estimate, gpu_memory_gib
from tests.builders import make_job

CONFIGS = Path(__file__).parents[1] / "data" / "model_configs"


def config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def spec(**overrides):
    base = {"spec.model.name": "meta-llama/Llama-3.1-8B", "spec.method.type": "full", "spec.data.maxLength": 2048,
            "spec.distributed.gpusPerNode": 1}
    return validate_job(make_job({**base, **overrides})).spec


@pytest.mark.parametrize(("name", "billions", "lora16"), [
    # Published totals (model cards; Qwen's include the q/k/v biases we do not count: 0.04%), LoRA r=16
    # all-linear as peft's print_trainable_parameters reports it for Llama-3.1-8B.
    ("llama-3.1-8b", 8.03, 41_943_040), ("llama-3.1-70b", 70.55, None), ("qwen2.5-7b", 7.62, None),
    ("qwen2.5-32b", 32.76, None), ("mistral-7b-v0.3", 7.25, None)])
def test_parameter_counts_of_published_models(name, billions, lora16):
    shape = ModelShape.from_config(config(name))
    assert shape.parameters / 1e9 == pytest.approx(billions, rel=0.003)
    if lora16:
        assert shape.lora_parameters(16, ["all-linear"]) == lora16


def test_a_config_without_a_transformer_shape_is_named():
    with pytest.raises(UnknownShape, match="num_hidden_layers, hidden_size"):
        ModelShape.from_config({"model_type": "resnet", "num_attention_heads": 1, "vocab_size": 10})


def test_model_states_by_strategy_follow_the_zero_accounting():
    """Full fine-tune of 8B on 16 GPUs: DDP replicates weights, gradients, AdamW states (in bf16, the loaded dtype)
    and its gradient buckets; ZeRO keeps 2 + 2 + 12 bytes per parameter, stage 1 partitions the 12, stage 2 the
    gradients too, stage 3 everything (plus two gathered layers); offload moves the 12 off the GPU."""
    shape = ModelShape.from_config(config("llama-3.1-8b"))
    n = shape.parameters
    gpus = {"spec.distributed.numNodes": 2, "spec.distributed.gpusPerNode": 8}
    ddp = estimate(spec(**gpus), shape).terms
    assert ddp["weights"] == ddp["gradients"] == ddp["DDP gradient buckets"] == 2 * n
    assert ddp["optimizer states"] == 4 * n

    def zero(stage, **ds):
        return estimate(spec(**gpus, **{"spec.distributed.strategy": "deepspeed",
                                        "spec.distributed.deepspeed": {"zeroStage": stage, **ds}}), shape)

    z1, z2, z3 = (zero(s).terms for s in (1, 2, 3))
    assert z1["weights"] == z1["gradients"] == 2 * n and z1["optimizer states"] == 12 * n / 16
    assert z2["weights"] == 2 * n and z2["gradients"] == 2 * n / 16 and z2["optimizer states"] == 12 * n / 16
    gathered = 2 * shape.layer_params * 2
    assert z3["weights"] == pytest.approx(2 * n / 16 + gathered) and z3["gradients"] == 2 * n / 16
    offloaded = zero(3, offloadOptimizer="cpu")
    assert offloaded.terms["optimizer states"] == 0 and offloaded.offloaded["optimizer states"] == 12 * n / 16
    assert zero(3, offloadOptimizer="cpu", offloadParams="cpu").terms["weights"] == pytest.approx(gathered)
    fsdp = estimate(spec(**gpus, **{"spec.distributed.strategy": "fsdp"}), shape).terms
    # accelerate upcasts trainable parameters to fp32 under FSDP mixed precision: 4 + 4 + 8 bytes, sharded.
    assert fsdp["optimizer states"] == 8 * n / 16 and fsdp["gradients"] == 4 * n / 16


def test_lora_and_qlora_weights():
    """LoRA keeps the base in bf16 and the adapters (upcast to fp32) with their gradients and AdamW states; QLoRA's
    base is 4-bit NF4 with double quantization, and its other parameters are upcast to fp32 by
    prepare_model_for_kbit_training (for Llama-3's 128k vocabulary, 4 GiB of embeddings)."""
    shape = ModelShape.from_config(config("llama-3.1-8b"))
    adapters = shape.lora_parameters(16, ["all-linear"])
    lora = estimate(spec(**{"spec.method.type": "lora"}), shape).terms
    assert lora["weights"] == 2 * shape.parameters + 4 * adapters
    assert lora["gradients"] == 4 * adapters and lora["optimizer states"] == 8 * adapters
    qlora = estimate(spec(**{"spec.method.type": "qlora", "spec.model.quantization": "4bit"}), shape).terms
    others = shape.parameters - shape.linear_params
    assert qlora["weights"] == pytest.approx(shape.linear_params * 0.5159 + 4 * others + 4 * adapters, rel=1e-3)
    assert 7 < qlora["weights"] / GIB < 8  # not the 3.7 GiB a "4 bits per parameter" rule gives


def test_activations_scale_with_tokens_and_shrink_with_checkpointing():
    shape = ModelShape.from_config(config("llama-3.1-8b"))
    one = estimate(spec(), shape).terms
    two = estimate(spec(**{"spec.training.perDeviceTrainBatchSize": 2}), shape).terms
    assert two["activations"] == pytest.approx(2 * one["activations"])
    assert two["logits and loss"] == pytest.approx(2 * one["logits and loss"])
    checkpointed = estimate(spec(**{"spec.training.gradientCheckpointing": True}), shape).terms
    # 32 layers keep their input (8 KiB a token) and one layer is recomputed at a time.
    assert checkpointed["activations"] < one["activations"] / 10
    eager = estimate(spec(**{"spec.model.attnImplementation": "eager"}), shape).terms
    assert eager["activations"] > 2 * one["activations"]  # heads x 2048 probabilities a token, per layer
    packed = estimate(spec(**{"spec.data.format": "text", "spec.data.blockSize": 4096}), shape)
    assert packed.tokens_per_micro_batch == 4096


def test_the_logits_are_the_largest_term_for_a_large_vocabulary_and_a_small_model():
    small = {**config("llama-3.1-8b"), "num_hidden_layers": 4, "hidden_size": 1024, "intermediate_size": 4096,
             "num_attention_heads": 16}
    est = estimate(spec(**{"spec.training.gradientCheckpointing": True}), ModelShape.from_config(small))
    assert est.largest == "logits and loss"


def test_a_spec_that_does_not_fit_names_the_numbers_and_the_cheapest_change_that_fits():
    big = spec(**{"spec.training.perDeviceTrainBatchSize": 4, "spec.data.maxLength": 4096,
                  "spec.pod.nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}})
    verdict = check_fit(big, config("llama-3.1-8b"))
    assert not verdict.fits and verdict.capacity_gib == 79.6
    message = verdict.message()
    assert message.startswith("does not fit: needs ") and "of 79.6 GiB (spec.pod.nodeSelector" in message
    assert verdict.suggestion is not None
    assert verdict.suggestion.estimate.needed <= 79.6 * GIB  # computed, and it fits
    assert f"{verdict.suggestion.estimate.needed / GIB:.1f} GiB of 79.6" in message
    status = verdict.to_status()
    assert status["fits"] is False and status["suggestion"] == verdict.suggestion.change
    assert status["largestTerm"] == verdict.estimate.largest and status["neededGiB"] > 79.6


def test_seventy_billion_full_fine_tune_on_one_node_needs_zero3_and_offload():
    verdict = check_fit(spec(**{"spec.distributed.gpusPerNode": 8, "spec.resources.gpuMemoryGiB": 80,
                                "spec.training.gradientCheckpointing": True}), config("llama-3.1-70b"))
    assert not verdict.fits and verdict.suggestion is not None
    assert "zeroStage: 3" in verdict.suggestion.change or "offloadOptimizer" in verdict.suggestion.change


def test_nothing_fits_says_so():
    verdict = check_fit(spec(**{"spec.resources.gpuMemoryGiB": 4, "spec.training.gradientCheckpointing": True}),
                        config("llama-3.1-70b"))
    assert verdict.suggestion is None and "nothing we know of fits" in verdict.message()


def test_a_tight_fit_warns_and_no_capacity_only_reports():
    shape_cfg = config("llama-3.1-8b")
    needed = check_fit(spec(**{"spec.method.type": "lora", "spec.training.gradientCheckpointing": True}),
                       shape_cfg).estimate.needed / GIB
    tight = check_fit(spec(**{"spec.method.type": "lora", "spec.training.gradientCheckpointing": True,
                              "spec.resources.gpuMemoryGiB": round(needed / 0.95, 1)}), shape_cfg)
    assert tight.fits and tight.tight and "above 90%" in tight.message()
    unknown = check_fit(spec(), shape_cfg)
    assert unknown.fits and unknown.capacity_gib is None and "gpuMemoryGiB" in unknown.message()


@pytest.mark.parametrize(("label", "gib"), [("NVIDIA-H100-80GB-HBM3", 79.6), ("NVIDIA-H200", 140.4),
                                            ("NVIDIA-A100-SXM4-40GB", 40.0), ("NVIDIA-A100-SXM4-80GB", 80.0),
                                            ("NVIDIA-L4", 22.5), ("NVIDIA-L40S", 45.0), ("Tesla-T4", 15.0),
                                            ("NVIDIA-H100-NVL", 93.6), ("Unknown-GPU", None)])
def test_gpu_memory_from_the_product_label(label, gib):
    assert gpu_memory_gib(label) == gib


def test_the_comparison_benchmark_runs_and_the_other_estimators_ignore_what_we_count(tmp_path):
    """benchmarks/memory_estimates.py, whole (it is small): accelerate's figure is one per model whatever the
    configuration, DeepSpeed's appears for the ZeRO rows only; ours changes with what changes memory."""
    from benchmarks.memory_estimates import main

    out = tmp_path / "rows.json"
    assert main(["--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    llama8 = [r for r in rows if r["model"] == "llama-3.1-8b"]
    assert len({round(r["accelerate_gb"], 3) for r in llama8}) == 1
    assert len({round(r["ours_needed_gb"], 1) for r in llama8}) == len(llama8)
    assert all((r["deepspeed_states_gb"] is not None) == ("ZeRO" in r["configuration"]) for r in rows)


def test_dpo_counts_both_answers_and_the_reference_model_of_a_full_fine_tune():
    shape = ModelShape.from_config(config("llama-3.1-8b"))
    pairs = {"spec.method.objective": "dpo", "spec.data.format": "preference"}
    sft, dpo = estimate(spec(), shape), estimate(spec(**pairs), shape)
    assert dpo.tokens_per_micro_batch == 2 * sft.tokens_per_micro_batch
    assert dpo.terms["activations"] == pytest.approx(2 * sft.terms["activations"])
    assert dpo.terms["reference model"] == 2 * shape.parameters
    precomputed = estimate(spec(**pairs, **{"spec.method.preference": {"precomputeRefLogProbs": True}}), shape)
    assert "reference model" not in precomputed.terms
    assert "reference model" not in estimate(spec(**pairs, **{"spec.method.type": "lora"}), shape).terms


def test_orpo_simpo_and_cpo_count_both_answers_and_no_reference_kto_one_answer_and_a_reference():
    shape = ModelShape.from_config(config("llama-3.1-8b"))
    sft = estimate(spec(**{"spec.training.perDeviceTrainBatchSize": 2}), shape)
    for objective in ("orpo", "simpo", "cpo"):
        free = estimate(spec(**{"spec.method.objective": objective, "spec.data.format": "preference",
                                "spec.training.perDeviceTrainBatchSize": 2}), shape)
        assert free.tokens_per_micro_batch == 2 * sft.tokens_per_micro_batch and "reference model" not in free.terms
    kto = estimate(spec(**{"spec.method.objective": "kto", "spec.data.format": "unpaired",
                           "spec.training.perDeviceTrainBatchSize": 2}), shape)  # KTO's KL term needs a neighbour
    assert kto.tokens_per_micro_batch == sft.tokens_per_micro_batch  # its KL completion runs without gradients
    assert kto.terms["reference model"] == 2 * shape.parameters


def test_a_reward_model_counts_both_answers_no_reference_and_no_vocabulary_logits():
    """A reward model scores chosen and rejected in one batch, with no reference model; its head has one output,
    so neither the LM head's weights nor vocabulary-sized logits are counted (Llama-3.1-8B: 128k vocabulary)."""
    shape = ModelShape.from_config(config("llama-3.1-8b"))
    pairs = {"spec.data.format": "preference", "spec.method.type": "full"}
    dpo = estimate(spec(**pairs, **{"spec.method.objective": "dpo"}), shape)
    reward = estimate(spec(**pairs, **{"spec.method.objective": "reward"}), shape)
    assert reward.tokens_per_micro_batch == dpo.tokens_per_micro_batch and "reference model" not in reward.terms
    assert reward.terms["activations"] == pytest.approx(dpo.terms["activations"])
    head = shape.vocab * shape.hidden
    assert reward.terms["logits and loss"] < dpo.terms["logits and loss"] - 4 * shape.vocab * dpo.tokens_per_micro_batch
    assert dpo.terms["weights"] - reward.terms["weights"] == pytest.approx(head * (dpo.terms["weights"] /
                                                                                   shape.parameters))
