"""The memory fit estimate's arithmetic: parameter counts of published models, the model states by strategy, the
phases of a step (the peak is the largest of them, not their sum), and the advice (every suggestion is estimated
again, validated as a spec, and fits). Measured against torch in test_fit_measured.py (CPU) and against recorded
runs (benchmarks/results: CPU runs of our trainer, the GPU suite on an H200) below."""

import json
from pathlib import Path

import pytest

from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.api.validation import validate_job
from finetune_operator.fit import GIB, ModelShape, UnknownShape, check_fit, estimate, gpu_memory_gib
from finetune_operator.fit.activations import LOSS_VOCAB_BYTES
from finetune_operator.fit.estimate import ESTIMATE_MARGIN
from finetune_operator.fit.states import ZERO3_MAX_LIVE
from tests.builders import make_job

ROOT = Path(__file__).parents[2]
CONFIGS = ROOT / "tests" / "data" / "model_configs"
RESULTS = ROOT / "benchmarks" / "results"
LOW, HIGH = 1.00, 1.15  # a gate errs high, and close


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
    ("qwen2.5-32b", 32.76, None), ("mistral-7b-v0.3", 7.25, None), ("qwen2.5-0.5b", 0.494, None),
    ("llama-3.2-1b", 1.236, None), ("gemma-2-9b", 9.24, None), ("mixtral-8x7b", 46.70, None),
    ("deepseek-v2-lite", 15.706, None)])  # the model card's 15.7B; latent attention, shared experts, a dense layer
def test_parameter_counts_of_published_models(name, billions, lora16):
    shape = ModelShape.from_config(config(name))
    assert shape.parameters / 1e9 == pytest.approx(billions, rel=0.003)
    if lora16:
        assert shape.lora_parameters(16, ["all-linear"]) == lora16


def test_a_config_without_a_transformer_shape_is_named():
    with pytest.raises(UnknownShape, match="num_hidden_layers, hidden_size"):
        ModelShape.from_config({"model_type": "resnet", "num_attention_heads": 1, "vocab_size": 10})


ZERO = {"spec.distributed.numNodes": 2, "spec.distributed.gpusPerNode": 8, "spec.distributed.strategy": "deepspeed"}


def zero(stage: int, shape: ModelShape, precision: str = "bf16", **ds):
    return estimate(spec(**ZERO, **{"spec.distributed.deepspeed": {"zeroStage": stage, **ds},
                                    "spec.training.precision": precision}), shape)


def test_model_states_by_strategy_follow_what_each_strategy_keeps():
    """Full fine-tune of 8B on 16 GPUs: DDP replicates weights, gradients, AdamW states (in bf16, the loaded dtype)
    and its gradient buckets; ZeRO keeps 2 (weights) + 2 (gradients) + 4 (fp32 master) + 8 (AdamW) bytes per
    parameter, stage 1 partitioning the 12, stage 2 the gradients too, stage 3 everything; its step converts the
    gradient partition to fp32; offload moves the 12 (and the fp32 gradients) off the GPU."""
    shape = ModelShape.from_config(config("llama-3.1-8b"))
    n = shape.parameters
    ddp = estimate(spec(**{"spec.distributed.numNodes": 2, "spec.distributed.gpusPerNode": 8}), shape).terms
    assert ddp["weights"] == ddp["gradients"] == ddp["DDP gradient buckets"] == 2 * n
    assert ddp["optimizer states"] == 4 * n
    z1, z2, z3 = (zero(s, shape).terms for s in (1, 2, 3))
    assert z1["weights"] == z1["gradients"] == 2 * n and z1["optimizer states"] == 12 * n / 16
    assert z2["weights"] == 2 * n and z2["gradients"] == 2 * n / 16 and z2["optimizer states"] == 12 * n / 16
    assert z1["optimizer step"] == z2["optimizer step"] == 4 * n / 16  # the fp32 gradient partition
    # Our preset keeps gathered what is reused, up to max_live, and at least the largest module and the next one.
    gathered = max(min(n, ZERO3_MAX_LIVE), 2 * shape.vocab * shape.hidden) * 2
    assert z3["weights"] == pytest.approx(2 * n / 16 + gathered) and z3["gradients"] == 2 * n / 16
    offloaded = zero(3, shape, offloadOptimizer="cpu")
    assert offloaded.terms["optimizer states"] == 0 and offloaded.offloaded["optimizer states"] == 12 * n / 16
    assert offloaded.offloaded["gradients"] == 4 * n / 16
    assert zero(3, shape, offloadOptimizer="cpu", offloadParams="cpu").terms["weights"] == pytest.approx(gathered)
    fsdp = estimate(spec(**{"spec.distributed.numNodes": 2, "spec.distributed.gpusPerNode": 8,
                            "spec.distributed.strategy": "fsdp"}), shape).terms
    # accelerate upcasts trainable parameters to fp32 under FSDP mixed precision: 4 + 4 + 8 bytes, sharded.
    assert fsdp["optimizer states"] == 8 * n / 16 and fsdp["gradients"] == 4 * n / 16


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_keeps_an_fp32_master_copy_of_an_fp32_job_too(stage):
    """DeepSpeed clones its partition to fp32 whatever the precision (the issue: counted 0 for fp32 jobs)."""
    shape = ModelShape.from_config(config("qwen2.5-0.5b"))
    n = shape.parameters
    assert zero(stage, shape, "fp32").terms["optimizer states"] == pytest.approx((4 + 8) * n / 16)


def test_zero3_gathers_the_embedding_when_it_is_the_largest_module():
    """Qwen2.5-0.5B's tied embedding (136M parameters) is nine times a layer: ZeRO-3 gathers it whole, and the
    gather counts it whatever the reuse settings allow."""
    shape = ModelShape.from_config(config("qwen2.5-0.5b"))
    small_live = zero(3, shape, config={"zero_optimization": {"stage3_max_live_parameters": 1000}})
    assert small_live.terms["weights"] >= 2 * shape.vocab * shape.hidden * 2


def test_the_peak_is_the_largest_phase_not_the_sum():
    """The Trainer frees gradients after each step: at the end of the forward (the peak of an activation-heavy
    step) there are none, unless micro-batches accumulate; a short step peaks in the optimizer step instead."""
    shape = ModelShape.from_config(config("llama-3.1-8b"))
    long = estimate(spec(**{"spec.data.maxLength": 4096, "spec.training.perDeviceTrainBatchSize": 4}), shape)
    assert long.peak_phase == "end of forward" and "gradients" not in long.phases["end of forward"]
    inside = long.phase_bytes("end of forward")
    assert long.peak == pytest.approx(inside * (1 + ESTIMATE_MARGIN))
    assert long.peak < sum(v for k, v in long.terms.items() if k not in ("fragmentation", "cuda context"))
    accumulating = estimate(spec(**{"spec.data.maxLength": 4096, "spec.training.perDeviceTrainBatchSize": 4,
                                    "spec.training.gradientAccumulationSteps": 2}), shape)
    assert "gradients" in accumulating.phases["end of forward"]
    assert accumulating.peak - long.peak == pytest.approx(long.terms["gradients"] * (1 + ESTIMATE_MARGIN))
    short = estimate(spec(**{"spec.data.maxLength": 64, "spec.training.optim": "adamw_torch"}), shape)
    assert short.peak_phase == "optimizer step"


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


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "v_proj"], ["down_proj"]])
@pytest.mark.parametrize("name", ["llama-3.1-8b", "gemma-2-9b", "qwen2.5-0.5b", "mixtral-8x7b"])
def test_dora_keeps_both_outputs_of_every_adapted_layer_and_builds_one_norm_at_a_time(name, targets, precision):
    """DoRA beside the same LoRA: per token, each adapted layer's base and adapter outputs (in the compute dtype);
    once, the widest-input adapted layer's norm (its identity, B x A, W + BA), in the forward and, with
    checkpointing, again in the recomputing backward."""
    from finetune_operator.fit.activations import DORA_OUT_BYTES, dora_norm_bytes

    shape = ModelShape.from_config(config(name))
    compute = 2 if precision == "bf16" else 4
    lora = {"spec.method.type": "lora", "spec.method.lora.targetModules": targets, "spec.training.precision": precision}
    plain, dora = estimate(spec(**lora), shape), estimate(spec(**lora, **{"spec.method.lora.useDora": True}), shape)
    per_token = DORA_OUT_BYTES[compute] * shape.lora_out_width(targets)
    assert dora.terms["activations"] - plain.terms["activations"] == pytest.approx(
        per_token * dora.tokens_per_micro_batch * shape.layers)
    a, b = shape.largest_lora_linear(targets)
    assert dora.terms["DoRA weight norm"] == dora_norm_bytes(shape, targets, compute) == 4 * a * a + a * b * (
        4 + 3 * compute)
    assert "DoRA weight norm" in dora.phases["end of forward"] and "DoRA weight norm" not in dora.phases["backward"]
    recomputed = estimate(spec(**lora, **{"spec.method.lora.useDora": True,
                                          "spec.training.gradientCheckpointing": True}), shape)
    assert "DoRA weight norm" in recomputed.phases["backward"]
    # Mixtral's down_proj is its fused experts' (peft's ParamWrapper, which refuses DoRA: fit/buildable.py): no
    # nn.Linear of that name to adapt
    assert (dora.peak > plain.peak) == (shape.lora_out_width(targets) > 0)


def test_activations_scale_with_tokens_and_shrink_with_checkpointing():
    shape = ModelShape.from_config(config("llama-3.1-8b"))
    one = estimate(spec(), shape).terms
    two = estimate(spec(**{"spec.training.perDeviceTrainBatchSize": 2}), shape).terms
    assert two["activations"] == pytest.approx(2 * one["activations"])
    assert two["logits and loss"] == pytest.approx(2 * one["logits and loss"])
    checkpointed = estimate(spec(**{"spec.training.gradientCheckpointing": True}), shape).terms
    # 32 layers keep their input (4 KiB a token at bf16) and one layer is recomputed at a time.
    assert checkpointed["activations"] < one["activations"] / 10
    assert checkpointed["recomputed layer"] == pytest.approx(one["activations"] / 32)
    eager = estimate(spec(**{"spec.model.attnImplementation": "eager"}), shape).terms
    assert eager["activations"] > 2 * one["activations"]  # heads x 2048 probabilities a token, per layer
    packed = estimate(spec(**{"spec.data.format": "text", "spec.data.blockSize": 4096}), shape)
    assert packed.tokens_per_micro_batch == 4096


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_the_loss_peak_is_twelve_bytes_per_vocabulary_entry_and_token(precision):
    """Measured through transformers' Trainer (test_fit_measured.py): 12 bytes at either precision (the issue:
    10 and 8 were predicted), Gemma-2's final softcapping 2 or 4 more."""
    shape = ModelShape.from_config(config("llama-3.1-8b"))
    bigger = ModelShape.from_config({**config("llama-3.1-8b"), "vocab_size": shape.vocab + 1000})
    overrides = {"spec.training.precision": precision}
    a, b = estimate(spec(**overrides), shape), estimate(spec(**overrides), bigger)
    tokens = a.tokens_per_micro_batch
    assert (b.terms["logits and loss"] - a.terms["logits and loss"]) / (1000 * tokens) == LOSS_VOCAB_BYTES == 12
    capped = ModelShape.from_config({**config("llama-3.1-8b"), "final_logit_softcapping": 30.0})
    extra = (estimate(spec(**overrides), capped).terms["logits and loss"] - a.terms["logits and loss"]) / tokens
    assert extra / shape.vocab == (2 if precision == "bf16" else 4)


def test_the_evaluation_batch_counts():
    """perDeviceEvalBatchSize 16 at 4096 tokens and a 128k vocabulary: the evaluation's logits alone are ~80 GB
    (the issue: an eval batch of 16 was priced as 1). Without evaluation there is no such phase."""
    shape = ModelShape.from_config(config("llama-3.1-8b"))
    evaluating = {"spec.data.maxLength": 4096, "spec.training.evalStrategy": "steps", "spec.training.evalSteps": 10,
                  "spec.data.validation": [{"path": "/data/val.jsonl"}], "spec.method.type": "lora",
                  "spec.training.gradientCheckpointing": True, "spec.resources.gpuMemoryGiB": 80}
    one = check_fit(spec(**evaluating), config("llama-3.1-8b"))
    sixteen = check_fit(spec(**evaluating, **{"spec.training.perDeviceEvalBatchSize": 16}), config("llama-3.1-8b"))
    assert one.fits and not sixteen.fits and sixteen.estimate.peak_phase == "evaluation"
    assert sixteen.estimate.terms["evaluation"] / 1e9 > 80
    assert sixteen.estimate.terms["evaluation"] == pytest.approx(16 * one.estimate.terms["evaluation"])
    assert "evaluation" not in estimate(spec(**{"spec.data.maxLength": 4096}), shape).terms


def test_the_logits_are_the_largest_term_for_a_large_vocabulary_and_a_small_model():
    small = {**config("llama-3.1-8b"), "num_hidden_layers": 4, "hidden_size": 1024, "intermediate_size": 4096,
             "num_attention_heads": 16}
    est = estimate(spec(**{"spec.training.gradientCheckpointing": True}), ModelShape.from_config(small))
    assert est.largest == "logits and loss"


def test_a_spec_that_does_not_fit_names_the_numbers_and_several_changes_that_fit():
    """The issue: only one remedy was ever offered. Now up to three of different kinds, cheapest first, each
    estimated again and fitting, the first in the status as the suggestion and the rest as alternatives."""
    big = spec(**{"spec.training.perDeviceTrainBatchSize": 4, "spec.data.maxLength": 4096,
                  "spec.pod.nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}})
    verdict = check_fit(big, config("llama-3.1-8b"))
    assert not verdict.fits and verdict.capacity_gib == 79.6
    message = verdict.message()
    assert message.startswith("does not fit: needs ") and "of 79.6 GiB (spec.pod.nodeSelector" in message
    assert len(verdict.suggestions) >= 2 and len({s.kind for s in verdict.suggestions}) == len(verdict.suggestions)
    for suggestion in verdict.suggestions:
        assert suggestion.estimate.needed <= 79.6 * GIB  # computed, and it fits
        assert f"{suggestion.estimate.needed / GIB:.1f} GiB of 79.6" in message
    status = verdict.to_status()
    assert status["fits"] is False and status["suggestion"] == verdict.suggestions[0].change
    assert status["alternatives"] == [s.change for s in verdict.suggestions[1:]]
    assert status["largestTerm"] == verdict.estimate.largest and status["neededGiB"] > 79.6


def test_the_ddp_offload_advice_says_it_switches_to_deepspeed():
    """The issue: "offloadOptimizer: cpu" was offered to a DDP job, silently meaning ZeRO-3."""
    verdict = check_fit(spec(**{"spec.distributed.gpusPerNode": 8, "spec.resources.gpuMemoryGiB": 80,
                                "spec.training.gradientCheckpointing": True}), config("llama-3.1-70b"))
    assert not verdict.fits and verdict.suggestions
    for s in verdict.suggestions:
        assert "offloadOptimizer" not in s.change or "distributed.strategy: deepspeed with" in s.change, s.change


def test_offload_advice_and_offloading_specs_respect_the_pods_memory():
    """70B full fine-tune on 8 H100s: offloading its states needs ~1 TiB of CPU memory per node by our own
    numbers; with the pod's 512Gi no offload is advised, and a spec that offloads anyway does not fit the pod."""
    base = {"spec.distributed.gpusPerNode": 8, "spec.resources.gpuMemoryGiB": 80,
            "spec.training.gradientCheckpointing": True, "spec.resources.memory": "512Gi"}
    verdict = check_fit(spec(**base), config("llama-3.1-70b"))
    assert not any(s.estimate.offloaded for s in verdict.suggestions), [s.change for s in verdict.suggestions]
    offloading = check_fit(spec(**base, **{"spec.distributed.strategy": "deepspeed", "spec.distributed.deepspeed": {
        "zeroStage": 3, "offloadOptimizer": "cpu", "offloadParams": "cpu"}}), config("llama-3.1-70b"))
    assert offloading.gpu_fits and not offloading.fits and offloading.host is not None
    assert "spec.resources.memory is 512Gi" in offloading.message()
    roomy = check_fit(spec(**{**base, "spec.resources.memory": "2Ti"}, **{
        "spec.distributed.strategy": "deepspeed", "spec.distributed.deepspeed": {
            "zeroStage": 3, "offloadOptimizer": "cpu", "offloadParams": "cpu"}}), config("llama-3.1-70b"))
    assert roomy.fits


def test_nothing_fits_says_so():
    verdict = check_fit(spec(**{"spec.resources.gpuMemoryGiB": 4, "spec.training.gradientCheckpointing": True}),
                        config("llama-3.1-70b"))
    assert not verdict.suggestions and "nothing we know of fits" in verdict.message()


def test_a_tight_fit_warns_and_no_capacity_only_reports():
    shape_cfg = config("llama-3.1-8b")
    needed = check_fit(spec(**{"spec.method.type": "lora", "spec.training.gradientCheckpointing": True}),
                       shape_cfg).estimate.needed / GIB
    tight = check_fit(spec(**{"spec.method.type": "lora", "spec.training.gradientCheckpointing": True,
                              "spec.resources.gpuMemoryGiB": round(needed / 0.95, 1)}), shape_cfg)
    assert tight.fits and tight.tight and "above 90%" in tight.message()
    unknown = check_fit(spec(), shape_cfg)
    assert unknown.fits and not unknown.checked and "gpuMemoryGiB" in unknown.message()


def test_an_unknown_gpu_is_said_not_skipped():
    """The issue: B300, A40, RTX 5090 (then unknown) skipped the check silently. A product we do not know says so,
    with the field to set."""
    verdict = check_fit(spec(**{"spec.pod.nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-Future-X9"}}),
                        config("llama-3.1-8b"))
    assert not verdict.checked and verdict.capacity_gib is None
    assert "NVIDIA-Future-X9 is a GPU whose memory we do not know: set spec.resources.gpuMemoryGiB" in \
        verdict.message()


@pytest.mark.parametrize(("label", "gib"), [
    ("NVIDIA-H100-80GB-HBM3", 79.6), ("NVIDIA-H200", 140.4), ("NVIDIA-A100-SXM4-40GB", 40.0),
    ("NVIDIA-A100-SXM4-80GB", 80.0), ("NVIDIA-L4", 22.5), ("NVIDIA-L40S", 45.0), ("Tesla-T4", 15.0),
    ("NVIDIA-H100-NVL", 93.6), ("Unknown-GPU", None),
    # The issue's: GH200 is not an H200, a MIG slice is not the card, a 32 GB V100 PCIe is not 16 GB, and the
    # products that were unknown.
    ("NVIDIA-GH200-480GB", 95.6), ("NVIDIA-GH200-144G-HBM3e", 140.4), ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", 9.5),
    ("NVIDIA-H100-80GB-HBM3-MIG-3g.40gb", 38.0), ("Tesla-V100-PCIE-32GB", 32.0), ("Tesla-V100-SXM2-16GB", 16.0),
    ("NVIDIA-B300-SXM6-AC", 268.0), ("NVIDIA-A40", 45.0), ("NVIDIA-GeForce-RTX-5090", 31.8),
    ("NVIDIA-GeForce-RTX-4090", 24.0), ("NVIDIA-A10G", 22.5), ("NVIDIA-H20", 95.6)])
def test_gpu_memory_from_the_product_label(label, gib):
    assert gpu_memory_gib(label) == gib


FSDP_EXAMPLE = ROOT / "examples" / "cpt-fsdp.yaml"


def fsdp_example(**changes) -> FineTuneJobSpec:
    import yaml

    doc = yaml.safe_load(FSDP_EXAMPLE.read_text())
    for key, value in changes.items():
        node = doc["spec"]
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return validate_job(doc).spec


def test_fsdps_own_activation_checkpointing_is_counted():
    """examples/cpt-fsdp.yaml (Llama-3.2-1B, FSDP with fsdp.activationCheckpointing) on an A100-40GB: counted as
    checkpointing, it fits (the issue: refused at 52.0 GiB with the advice to turn on what was on)."""
    on = check_fit(fsdp_example(**{"resources.gpuMemoryGiB": 40}), config("llama-3.2-1b"))
    assert on.fits, on.message()
    off = check_fit(fsdp_example(**{"resources.gpuMemoryGiB": 40, "distributed.fsdp.activationCheckpointing": False}),
                    config("llama-3.2-1b"))
    assert not off.fits and off.estimate.needed > on.estimate.needed + 20 * GIB
    same = check_fit(fsdp_example(**{"resources.gpuMemoryGiB": 40, "distributed.fsdp.activationCheckpointing": False,
                                     "training.gradientCheckpointing": True}), config("llama-3.2-1b"))
    assert same.estimate.terms == pytest.approx(on.estimate.terms)
    assert off.suggestions[0].change.startswith("distributed.fsdp.activationCheckpointing: true")


@pytest.mark.parametrize("gib", [4, 10, 24, 40])
def test_an_fsdp_spec_with_an_fsdp_block_gets_advice_that_validates(gib):
    """The issue: an FSDP spec with an fsdp: block that did not fit crashed validate/render (the advice switched the
    strategy with the block still there). Every suggestion is a spec the API takes, and none turns on what is on."""
    examples = fsdp_example(**{"resources.gpuMemoryGiB": gib, "distributed.fsdp.activationCheckpointing": False})
    verdict = check_fit(examples, config("llama-3.2-1b"))
    assert not verdict.fits
    for s in verdict.suggestions:
        assert s.estimate.needed <= gib * GIB
    on = check_fit(fsdp_example(**{"resources.gpuMemoryGiB": gib}), config("llama-3.2-1b"))
    assert all("activationCheckpointing" not in s.change and "gradientCheckpointing" not in s.change
               for s in on.suggestions)


def test_liger_and_compile_are_named_and_liger_counted():
    """use_liger_kernel: the fused linear cross-entropy holds no vocabulary-sized logits and its kernels keep less
    a layer; torch_compile's layers keep a measured share of eager's, its loss is said to be counted as eager's."""
    shape = ModelShape.from_config(config("llama-3.1-8b"))
    long = {"spec.data.maxLength": 4096, "spec.training.perDeviceTrainBatchSize": 4}
    plain = estimate(spec(**long), shape)
    liger = estimate(spec(**long, **{"spec.training.extraArgs": {"use_liger_kernel": True}}), shape)
    assert liger.terms["logits and loss"] < plain.terms["logits and loss"] / 10
    wider = ModelShape.from_config({**config("llama-3.1-8b"), "vocab_size": shape.vocab + 1000})
    grown = estimate(spec(**long, **{"spec.training.extraArgs": {"use_liger_kernel": True}}), wider)
    # A larger vocabulary costs the head's gradient (computed in the forward), nothing per token.
    assert grown.terms["logits and loss"] - liger.terms["logits and loss"] == 1000 * shape.hidden * 2
    assert liger.terms["activations"] < plain.terms["activations"]
    compiled = estimate(spec(**{"spec.training.extraArgs": {"torch_compile": True}}), shape)
    assert not compiled.complete and any("torch_compile" in n for n in compiled.notes) and plain.complete
    assert compiled.terms["activations"] == pytest.approx(0.79 * estimate(spec(), shape).terms["activations"])


def gpu_suite_cases():
    results = json.loads((RESULTS / "gpu-suite-h200.json").read_text())["results"]
    return [r for r in results if (r.get("figures") or {}).get("peakMemoryGiB")]


@pytest.mark.parametrize("case", gpu_suite_cases(), ids=lambda r: r["case"])
def test_the_estimate_errs_high_and_close_on_the_recorded_gpu_runs(case):
    """One H200 (benchmarks/results/gpu-suite-h200.json, docs/results.md): the suite's own job specs, estimated
    again, against torch.cuda.max_memory_allocated (the issue's calibration: 1.06 dense, 0.99 ZeRO-3, 1.21 with
    checkpointing, 1.36 compiled, 1.56 with Liger, 1.44 LoRA). torch.compile's loss is not modelled (its layers
    are): high, and the one case past 15% (1.17), which the estimate's note says."""
    from benchmarks.gpu_cases import GPU_1B, GPU_CASE_SIZES, SWITCHES, job_spec

    extra = {} if case["case"] == "ours" else SWITCHES[case["case"]]  # an unknown case fails, not estimated as ours
    size = GPU_CASE_SIZES.get(case["case"], GPU_1B)
    doc = job_spec(Path("/models/m"), Path("/data/d.jsonl"), size, True, **extra)
    shape = ModelShape(model_type="llama", layers=size.layers, hidden=size.hidden, heads=size.heads,
                       kv_heads=size.kv_heads, head_dim=size.hidden // size.heads, intermediate=size.intermediate,
                       vocab=size.vocab, tied_embeddings=False, gated_mlp=True, dtype_bytes=2)
    ratio = estimate(validate_job(doc).spec, shape).peak / GIB / case["figures"]["peakMemoryGiB"]
    assert ratio >= LOW, ratio
    assert ratio <= (1.20 if case["case"] == "compile" else HIGH), ratio


def cpu_rows():
    path = RESULTS / "memory-measured-cpu.json"
    return json.loads(path.read_text())["rows"] if path.exists() else []


@pytest.mark.parametrize("row", cpu_rows(), ids=lambda r: r["case"])
def test_the_estimate_errs_high_and_close_on_the_recorded_cpu_runs(row):
    """benchmarks/memory_measured.py's runs of our trainer on CPU (every architecture x method x strategy it has),
    estimated again from each run's job and config: every one within [1.00, 1.15] (the issue: 3 of 10 were low)."""
    from benchmarks.memory_measured import predict

    ratio = predict(row)["ratio"]
    assert LOW <= ratio <= HIGH, ratio


def test_the_comparison_benchmark_runs_and_the_other_estimators_ignore_what_we_count(tmp_path):
    """benchmarks/memory_estimates.py, whole (it is small): accelerate's figure is one per model whatever the
    configuration, and its CLI's (fp32 build: 60.0 GB for Llama-3.1-8B; the issue: 32.1); DeepSpeed's appears for
    the ZeRO rows only; ours changes with what changes memory."""
    from benchmarks.memory_estimates import main

    out = tmp_path / "rows.json"
    assert main(["--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    llama8 = [r for r in rows if r["model"] == "llama-3.1-8b"]
    assert {round(r["accelerate_gb"], 1) for r in llama8} == {60.0}
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
