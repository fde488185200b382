"""method.objective grpo in the spec: every bad setting named by its path with the fix, all at once; the batch
rule at and around every multiple; what rendering adds (a ConfigMap of reward functions as a read-only volume, and
where the trainer finds it); the memory fit's generation and reference terms."""

import itertools
import re

import pytest

from finetune_operator.api import constants as c
from finetune_operator.api.errors import InvalidSpec
from finetune_operator.api.validation import validate_job
from finetune_operator.fit.estimate import estimate
from finetune_operator.fit.grpo import GENERATION_TERM, kv_cache_bytes
from finetune_operator.fit.shape import ModelShape
from finetune_operator.render import RenderContext, render_all
from finetune_operator.render.trainer_config import trainer_config
from tests.builders import make_job

PROMPTS = [{"prompt": f"Question {i}?", "answer": str(i)} for i in range(8)]
REWARDS = [{"type": "exactMatch", "column": "answer"}]


def grpo_job(grpo=None, **overrides):
    return make_job({"spec.method": {"type": "lora", "objective": "grpo", "grpo": {"rewards": REWARDS, **(grpo or {})}},
                     "spec.data": {"format": "prompt", "maxLength": 512, "train": [{"inline": PROMPTS}]},
                     "spec.distributed": {"numNodes": 1, "gpusPerNode": 0},
                     "spec.training": {"perDeviceTrainBatchSize": 8}, **overrides})


def errors_of(doc) -> dict[str, str]:
    with pytest.raises(InvalidSpec) as info:
        validate_job(doc)
    return {e.path: f"{e.message}; fix: {e.fix}" for e in info.value.errors}


def test_the_example_shape_validates_and_reads_its_defaults():
    spec = validate_job(grpo_job()).spec
    g = spec.method.grpo
    assert (g.num_generations, g.loss_type, g.beta, g.scale_rewards, g.generation_backend) == (8, "dapo", 0.0,
                                                                                               "group", "transformers")
    assert g.rewards[0].default_name == "exact_match"


# (case id, overrides, path, pinned message fragment)
BAD = [
    ("no-grpo-section", {"spec.method": {"objective": "grpo"}}, "spec.method.grpo", "scores its completions"),
    ("grpo-on-sft", {"spec.method.objective": "sft", "spec.data.format": "alpaca"}, "spec.method.grpo",
     "but method.objective is sft"),
    ("prompt-data-on-sft", {"spec.method": {"objective": "sft"}}, "spec.data.format",
     "prompts without answers train only method.objective grpo"),
    ("preference-data", {"spec.data.format": "preference"}, "spec.data.format", "generates its own completions"),
    ("text-data", {"spec.data.format": "text"}, "spec.data.format", "generates its own completions"),
    ("packing", {"spec.data.packing": True}, "spec.data.packing", "completions are generated, not packed"),
    ("streaming", {"spec.data.streaming": True, "spec.training.maxSteps": 5}, "spec.data.streaming",
     "prompts are checked before training"),
    ("train-on-prompt", {"spec.data.trainOnPrompt": True}, "spec.data.trainOnPrompt", "only generated tokens"),
    ("completion-fills-max-length", {"spec.method.grpo.maxCompletionLength": 512}, "spec.method.grpo."
     "maxCompletionLength", "leaves no room for a prompt in data.maxLength 512"),
    ("one-generation", {"spec.method.grpo.numGenerations": 1}, "spec.method.grpo.numGenerations",
     "greater than or equal to 2"),
    ("temperature-zero", {"spec.method.grpo.temperature": 0}, "spec.method.grpo.temperature", "greater than 0"),
    ("top-p-above-one", {"spec.method.grpo.topP": 1.5}, "spec.method.grpo.topP", "less than or equal to 1"),
    ("negative-beta", {"spec.method.grpo.beta": -0.1}, "spec.method.grpo.beta", "greater than or equal to 0"),
    ("unknown-loss", {"spec.method.grpo.lossType": "ppo"}, "spec.method.grpo.lossType", "'grpo', 'dr_grpo'"),
    ("scale-rewards-bool", {"spec.method.grpo.scaleRewards": True}, "spec.method.grpo.scaleRewards",
     "'group', 'batch' or 'none'"),
    ("iterations-zero", {"spec.method.grpo.numIterations": 0}, "spec.method.grpo.numIterations",
     "greater than or equal to 1"),
    ("iterations-and-checkpoints", {"spec.method.grpo.numIterations": 4, "spec.checkpoints.saveSteps": 10},
     "spec.checkpoints.saveSteps", "a checkpoint between them resumes with new generations"),
    ("vllm-on-cpu", {"spec.method.grpo.generationBackend": "vllm"}, "spec.method.grpo.generationBackend",
     "vLLM generates on GPUs"),
    ("no-rewards", {"spec.method.grpo.rewards": []}, "spec.method.grpo.rewards", "at least 1 item"),
    ("preference-beta", {"spec.method.preference": {"beta": 0.3}}, "spec.method.preference.beta",
     "not with method.objective grpo"),
    ("preference-loss", {"spec.method.preference": {"lossType": "sigmoid"}}, "spec.method.preference.lossType",
     "not a loss of method.objective grpo"),
    ("reward-unknown-type", {"spec.method.grpo.rewards": [{"type": "bleu"}]}, "spec.method.grpo.rewards[0].type",
     "'accuracy', 'exactMatch'"),
    ("reward-foreign-setting", {"spec.method.grpo.rewards": [{"type": "accuracy", "pattern": "x"}]},
     "spec.method.grpo.rewards[0].pattern", "not a setting of the accuracy reward"),
    ("reward-bad-regex", {"spec.method.grpo.rewards": [{"type": "regex", "pattern": "(unclosed"}]},
     "spec.method.grpo.rewards[0].pattern", "not a Python regular expression"),
    ("regex-pattern-and-column", {"spec.method.grpo.rewards": [{"type": "regex", "pattern": "a", "column": "p"}]},
     "spec.method.grpo.rewards[0].pattern", "exactly one of pattern"),
    ("extract-without-group", {"spec.method.grpo.rewards": [{"type": "exactMatch", "extract": "<a>.*</a>"}]},
     "spec.method.grpo.rewards[0].extract", "has no group"),
    ("function-missing", {"spec.method.grpo.rewards": [{"type": "function"}]},
     "spec.method.grpo.rewards[0].function", "the function reward needs function"),
    ("function-not-module-colon-name", {"spec.method.grpo.rewards": [{"type": "function", "function": "a.b"}]},
     "spec.method.grpo.rewards[0].function", "has an invalid format"),
    ("function-shell", {"spec.method.grpo.rewards": [{"type": "function", "function": "os:system; rm -rf /"}]},
     "spec.method.grpo.rewards[0].function", "has an invalid format"),
    ("config-map-bad-name", {"spec.method.grpo.rewards": [{"type": "function", "function": "m:f",
                                                            "configMap": "My_Rewards"}]},
     "spec.method.grpo.rewards[0].configMap", "must be a DNS subdomain"),
    ("config-map-on-builtin", {"spec.method.grpo.rewards": [{"type": "format", "configMap": "rewards"}]},
     "spec.method.grpo.rewards[0].configMap", "not a setting of the format reward"),
    ("model-missing", {"spec.method.grpo.rewards": [{"type": "model"}]}, "spec.method.grpo.rewards[0].model",
     "the model reward needs model"),
    ("soft-above-max", {"spec.method.grpo.rewards": [{"type": "length", "maxTokens": 8, "softTokens": 9}]},
     "spec.method.grpo.rewards[0].softTokens", "is more than maxTokens 8"),
    ("same-name-twice", {"spec.method.grpo.rewards": [{"type": "format"}, {"type": "format", "weight": 2}]},
     "spec.method.grpo.rewards[1].name", "logged under the same name"),
    ("weight-out-of-range", {"spec.method.grpo.rewards": [{"type": "format", "weight": 1000}]},
     "spec.method.grpo.rewards[0].weight", "less than or equal to 100"),
    ("reward-volume-name", {"spec.pod.volumes": [{"name": "reward-code-0", "mountPath": "/x", "configMap": "a"}]},
     "spec.pod.volumes[0].name", "a volume of the trainer itself"),
    ("reward-mount-path", {"spec.pod.volumes": [{"name": "mine", "mountPath": "/opt/finetune/rewards/x",
                                                 "configMap": "a"}]},
     "spec.pod.volumes[0].mountPath", "overlaps the trainer's own /opt/finetune/rewards"),
]


@pytest.mark.parametrize(("overrides", "path", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_grpo_setting_is_named_by_its_path(overrides, path, message):
    doc = grpo_job()
    for key, value in overrides.items():
        node = doc
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    found = errors_of(doc)
    assert path in found, found
    assert message in found[path], found[path]
    assert "; fix: " in found[path] and not found[path].endswith("; fix: ")


def test_every_error_comes_back_at_once():
    doc = grpo_job({"numGenerations": 3, "maxCompletionLength": 600, "generationBackend": "vllm"},
                   **{"spec.data.packing": True})
    found = errors_of(doc)
    assert {"spec.method.grpo.maxCompletionLength", "spec.training.perDeviceTrainBatchSize",
            "spec.method.grpo.generationBackend", "spec.data.packing"} <= set(found), found


CASES = [(g, p, a, w) for g, p, a, w in itertools.product((2, 3, 4, 8), range(1, 10), (1, 2), (1, 2))]


@pytest.mark.parametrize(("group", "per_device", "accumulation", "world"), CASES,
                         ids=[f"G{g}-p{p}-ga{a}-w{w}" for g, p, a, w in CASES])
def test_the_global_batch_must_hold_whole_groups_and_the_fix_works(group, per_device, accumulation, world):
    """Every batch shape around each multiple of numGenerations: accepted exactly when whole groups fit; a refusal
    says the numbers, and the per-device size it suggests validates."""
    overrides = {"spec.training": {"perDeviceTrainBatchSize": per_device, "gradientAccumulationSteps": accumulation},
                 "spec.distributed": {"numNodes": world, "gpusPerNode": 0}}
    doc = grpo_job({"numGenerations": group}, **overrides)
    batch = per_device * accumulation * world
    if batch % group == 0:
        assert validate_job(doc).spec.global_batch_size == batch
        return
    found = errors_of(doc)["spec.training.perDeviceTrainBatchSize"]
    assert (f"the global batch is {batch} completions ({per_device} per device x {accumulation} accumulation x "
            f"{world} process(es)), not a multiple of method.grpo.numGenerations {group}") in found
    suggested = int(re.search(r"set perDeviceTrainBatchSize: (\d+)", found).group(1))
    assert suggested > per_device
    overrides["spec.training"]["perDeviceTrainBatchSize"] = suggested
    assert validate_job(grpo_job({"numGenerations": group}, **overrides))


def test_an_evaluation_batch_must_hold_whole_groups_too():
    doc = grpo_job({"numGenerations": 4}, **{"spec.data.validationSplitPercentage": 25,
                                              "spec.training.evalStrategy": "steps", "spec.training.evalSteps": 5,
                                              "spec.training.perDeviceEvalBatchSize": 2})
    assert "set perDeviceEvalBatchSize: 4" in errors_of(doc)["spec.training.perDeviceEvalBatchSize"]


@pytest.mark.parametrize("data_format", ["prompt", "alpaca", "sharegpt", "messages"])
def test_each_prompt_format_is_accepted(data_format):
    assert validate_job(grpo_job(**{"spec.data.format": data_format})).spec.data.format == data_format


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_each_method_trains_grpo_on_a_gpu_gang_and_reaches_the_trainer(method):
    """Full, LoRA and QLoRA (a 4-bit base) on 2 nodes x 8 GPUs under ZeRO-2, as the other objectives."""
    quantized = {"spec.model.quantization": "4bit"} if method == "qlora" else {}
    job = validate_job(grpo_job(**{"spec.method.type": method, **quantized, "spec.distributed": {
        "numNodes": 2, "gpusPerNode": 8, "strategy": "deepspeed", "deepspeed": {"zeroStage": 2}}}))
    config = trainer_config(job.spec, RenderContext(name=job.name, namespace=job.namespace))
    assert (config["spec"]["method"]["type"], config["spec"]["method"]["objective"]) == (method, "grpo")
    assert config["spec"]["model"]["quantization"] == ("4bit" if method == "qlora" else "none")


def test_a_config_map_of_reward_functions_is_mounted_read_only_and_named_to_the_trainer():
    rewards = [{"type": "function", "function": "mine:score", "configMap": "team-rewards"},
               {"type": "function", "function": "mine:other", "configMap": "team-rewards", "name": "other"},
               {"type": "function", "function": "image_module:f"}, {"type": "format"}]
    job = validate_job(grpo_job({"rewards": rewards}))
    ctx = RenderContext(name=job.name, namespace=job.namespace)
    workload = next(o for o in render_all(job.spec, ctx) if o["kind"] == "Job")
    pod = workload["spec"]["template"]["spec"]
    assert [v for v in pod["volumes"] if v["name"].startswith(c.REWARD_CODE_VOLUME_PREFIX)] == [
        {"name": "reward-code-0", "configMap": {"name": "team-rewards"}}]  # one volume per ConfigMap
    mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "reward-code-0", "mountPath": "/opt/finetune/rewards/team-rewards", "readOnly": True} in mounts
    assert trainer_config(job.spec, ctx)["rewardCode"] == {"team-rewards": "/opt/finetune/rewards/team-rewards"}
    # Without a ConfigMap nothing is added.
    plain = validate_job(grpo_job())
    assert "rewardCode" not in trainer_config(plain.spec, ctx)


LLAMA_8B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
            "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16",
            "tie_word_embeddings": False}


def gpu_job(**grpo):
    return validate_job(grpo_job(grpo, **{
        "spec.distributed": {"numNodes": 1, "gpusPerNode": 8},
        "spec.training": {"perDeviceTrainBatchSize": 1, "gradientAccumulationSteps": 32, "precision": "bf16",
                          "gradientCheckpointing": True},
        "spec.data.maxLength": 8192, "spec.model.dtype": "bfloat16"})).spec


def test_the_fit_counts_generation_as_a_phase_of_its_own_and_the_reference():
    """A generation batch of 32 completions of 8k tokens a GPU (1 per step x 32 accumulated): its KV cache (32 x
    8192 x 32 layers x 2 x 1024 x 2 bytes = 32 GiB) and a decoding step's fp32 logits (and the sampler's copy)
    outgrow a checkpointed step's phases, so generation is the peak; beta adds the reference."""
    shape = ModelShape.from_config(LLAMA_8B)
    spec = gpu_job(maxCompletionLength=4096, beta=0.0)
    est = estimate(spec, shape)
    assert kv_cache_bytes(spec, shape, 2) == 32 * 8192 * 32 * 2 * 1024 * 2
    assert est.terms[GENERATION_TERM] == pytest.approx(kv_cache_bytes(spec, shape, 2) + 32 * 128256 * 8)
    assert est.peak_phase == "generation"
    assert GENERATION_TERM in est.phases["generation"] and "activations" not in est.phases["generation"]
    assert "reference adapter" not in est.terms
    # LoRA: a new adapter's reference is the base with the adapter off (nothing held); a continued adapter's is a
    # frozen copy of the one it starts from (TRL's "ref" adapter).
    assert "reference adapter" not in estimate(gpu_job(maxCompletionLength=4096, beta=0.04), shape).terms
    continued = validate_job(grpo_job({"maxCompletionLength": 4096, "beta": 0.04}, **{
        "spec.distributed": {"numNodes": 1, "gpusPerNode": 8}, "spec.data.maxLength": 8192,
        "spec.method.lora.initFrom": "/models/adapter"})).spec
    assert estimate(continued, shape).terms["reference adapter"] > 0
    full = validate_job(grpo_job({"beta": 0.04}, **{"spec.method.type": "full",
                                                    "spec.distributed": {"numNodes": 1, "gpusPerNode": 1}})).spec
    assert estimate(full, shape).terms["reference model"] == shape.parameters * 2


def test_a_short_generation_costs_nothing_beyond_the_training_step():
    """Generation holds no training activation: a short one is smaller than the step and never sets the peak."""
    shape = ModelShape.from_config(LLAMA_8B)
    spec = validate_job(grpo_job({"maxCompletionLength": 64}, **{
        "spec.distributed": {"numNodes": 1, "gpusPerNode": 1}, "spec.data.maxLength": 512})).spec
    est = estimate(spec, shape)
    assert 0 < est.terms[GENERATION_TERM] < est.terms["activations"] + est.terms["logits and loss"]
    assert est.peak_phase != "generation"


@pytest.mark.parametrize("share", [0.1, 0.3, 0.5, 0.7, 0.9])
@pytest.mark.parametrize("method", ["full", "lora"])
def test_with_vllm_training_is_checked_against_what_its_share_leaves(share, method):
    """vLLM's colocate mode takes its share of each GPU: a job that fits the whole GPU and not the rest does not fit,
    at every share around the training's own need; and the share must hold vLLM's copy of the weights."""
    from finetune_operator.fit import check_fit
    from finetune_operator.fit.estimate import GIB
    from finetune_operator.fit.vllm import VLLM_WEIGHT_BYTES

    overrides = {"spec.distributed": {"numNodes": 1, "gpusPerNode": 8}, "spec.resources.gpuMemoryGiB": 141,
                 "spec.method.type": method, "spec.data.maxLength": 2048, "spec.model.dtype": "bfloat16",
                 "spec.training": {"perDeviceTrainBatchSize": 1, "gradientAccumulationSteps": 8,
                                   "gradientCheckpointing": True, "precision": "bf16"}}
    plain = check_fit(validate_job(grpo_job({"maxCompletionLength": 512}, **overrides)).spec, LLAMA_8B)
    vllm = check_fit(validate_job(grpo_job({"maxCompletionLength": 512, "generationBackend": "vllm",
                                            "vllmGpuMemoryUtilization": share}, **overrides)).spec, LLAMA_8B)
    assert vllm.capacity_gib == pytest.approx(141 * (1 - share), abs=0.01)
    assert "less vLLM's" in vllm.capacity_source and "vllmGpuMemoryUtilization" in vllm.message()
    assert vllm.gpu_fits == (vllm.estimate.needed <= 141 * (1 - share) * GIB)
    weights = ModelShape.from_config(LLAMA_8B).parameters * VLLM_WEIGHT_BYTES
    short = [p for p in vllm.problems if "vLLM's share" in p]
    assert bool(short) == (weights > 141 * share * GIB), vllm.problems
    assert not vllm.fits or (vllm.gpu_fits and not short)
    assert plain.fits  # the whole GPU holds it: what changes is vLLM's share only
    # 8B: vLLM's 15 GiB copy needs more than a tenth of 141 GiB; a full fine-tune (~86 GiB) fits only beside 0.3,
    # LoRA (~22 GiB) beside up to 0.7.
    fitting = {"full": (0.3,), "lora": (0.3, 0.5, 0.7)}[method]
    assert vllm.fits == (share in fitting), vllm.message()
