"""method.objective grpo around TRL's GRPOTrainer: its config's fields from method.grpo, the trainer's reward
arguments, TRL's logged metrics as our progress records and status, and the run's summary (the last rewards and a
few completions with their rewards)."""

import math
from typing import Any

from finetune_operator.api.grpo import GrpoSpec
from finetune_operator.api.spec import FineTuneJobSpec

# TRL's GRPO metrics -> our progress record and status.progress.
GRPO_LOGS = {"reward": "reward", "reward_std": "rewardStd", "kl": "kl", "completions/mean_length": "completionLength",
             "clip_ratio/region_mean": "clipRatio"}
REWARD_FUNCTIONS = "rewardFunctions"
SAMPLES_IN_SUMMARY = 4
SAMPLE_CHARS = 500


def grpo_arguments(spec: FineTuneJobSpec) -> dict[str, Any]:
    """GRPOConfig's own fields from spec.method.grpo."""
    g = spec.method.grpo
    assert g is not None  # spec rules: objective grpo needs method.grpo
    args: dict[str, Any] = {
        "num_generations": g.num_generations, "max_completion_length": g.max_completion_length,
        "temperature": g.temperature, "top_p": g.top_p, "top_k": g.top_k, "beta": g.beta, "epsilon": g.epsilon,
        "loss_type": g.loss_type, "scale_rewards": g.scale_rewards, "num_iterations": g.num_iterations,
        "mask_truncated_completions": g.mask_truncated_completions,
        "reward_weights": [float(r.weight) for r in g.rewards],
        # Samples go to the summary from the trainer's own buffer; TRL's table printing and parquet files are off.
        "log_completions": False,
    }
    if g.epsilon_high is not None:
        args["epsilon_high"] = g.epsilon_high
    if g.generation_backend == "vllm":
        args.update(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=g.vllm_gpu_memory_utilization,
                    vllm_max_model_length=spec.data.max_length)
    return args


def check_vllm(grpo: GrpoSpec) -> None:
    """vLLM is not in every trainer image: say so before any model is loaded."""
    import importlib.util

    from finetune_trainer.errors import ConfigError

    if grpo.generation_backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError("spec.method.grpo.generationBackend is vllm but this image has no vllm package; use "
                          "generationBackend: transformers, or build an image FROM the trainer image with vllm "
                          "installed for its torch and CUDA versions")


def trainer_kwargs(cfg: Any, model: Any, tokenizer: Any, data: Any) -> dict[str, Any]:
    """GRPOTrainer's reward arguments. Conversational prompts also stop generating at the chat template's
    end-of-turn token (data.format prompt's conversations are not marked as chat data elsewhere)."""
    from finetune_trainer.training.model import add_stop_ids, base_model
    from finetune_trainer.training.rewards import build_rewards

    grpo = cfg.spec.method.grpo
    check_vllm(grpo)
    funcs, tokenizers, _ = build_rewards(grpo, cfg.spec, cfg.reward_code)
    if len(data.train) and isinstance(data.train[0]["prompt"], list) and tokenizer.chat_template:
        from finetune_trainer.data.chat import ChatEncoder

        stops = ChatEncoder.for_tokenizer(tokenizer).stop_tokens()
        ids = [tokenizer.convert_tokens_to_ids(t) for t in stops]
        add_stop_ids(base_model(model), [i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id])
    return {"reward_funcs": funcs, "reward_processing_classes": tokenizers}


def resumable_sampler(sampler: Any) -> Any:
    """TRL's RepeatSampler, made to give each epoch's order again after a resume.

    TRL shuffles each epoch with the next permutation of one generator seeded once. A resumed run builds a new
    sampler and transformers does not iterate the epochs already trained, so an epoch after the first would be
    drawn with the first epoch's permutation: other prompts than the run it continues. Here set_epoch(n) reseeds the
    generator and draws the n permutations before it: the same order as an uninterrupted run (TRL's own, so the
    parity with TRL holds over many epochs). transformers calls set_epoch before each epoch, except where it cannot
    reach the sampler: the resumed epoch of a multi-process run, whose batches it skips through a wrapper; so
    set_sampler_epoch is called before every epoch as well."""
    from trl.trainer.utils import RepeatSampler

    class ResumableRepeatSampler(RepeatSampler):
        def set_epoch(self, epoch: int) -> None:
            import torch

            if not self.shuffle:
                return
            self.generator.manual_seed(self.seed)
            for _ in range(epoch):
                torch.randperm(self.num_samples, generator=self.generator)

    if type(sampler) is not RepeatSampler or not sampler.shuffle or sampler.seed is None:
        return sampler
    return ResumableRepeatSampler(data_source=sampler.data_source, mini_repeat_count=sampler.mini_repeat_count,
                                  batch_size=sampler.batch_size, repeat_count=sampler.repeat_count, shuffle=True,
                                  seed=sampler.seed)


def set_sampler_epoch(dataloader: Any, epoch: int) -> None:
    """set_epoch on every sampler with one under `dataloader` (accelerate nests them: a DataLoaderShard's batch
    sampler, a BatchSamplerShard's batch sampler, its sampler)."""
    todo, seen = [dataloader], set()
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node is not dataloader and hasattr(node, "set_epoch") and hasattr(node, "mini_repeat_count"):
            node.set_epoch(epoch)
        todo += [getattr(node, name, None) for name in ("batch_sampler", "sampler", "base_dataloader")]


def finish_setup(trainer: Any, spec: FineTuneJobSpec) -> None:
    """After GRPOTrainer's own set-up: each reward logged under its spec name (TRL names a reward model after its
    path), and a new adapter's reference is the base model with the adapter off, as with TRL's peft_config.

    TRL sees our model arrive wrapped by peft already, so with beta > 0 it copies the adapter as a frozen "ref"
    adapter: right for an adapter we continue (method.lora.initFrom: the reference is where it started), but for a
    new one (B = 0) it equals the base and costs a second adapter in every reference forward and checkpoint."""
    trainer.reward_func_names = [r.default_name for r in spec.method.grpo.rewards]
    model = trainer.model
    if spec.method.lora.init_from is None and "ref" in (getattr(model, "peft_config", None) or {}):
        model.delete_adapter("ref")
        model.set_adapter("default")


def grpo_record(logs: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """The GRPO part of a progress record; an evaluation's record keeps the last training values."""
    out: dict[str, Any] = {}
    for key, name in GRPO_LOGS.items():
        value = logs.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            out[name] = value
        elif last.get(name) is not None:
            out[name] = last[name]
    functions = reward_functions(logs)
    if functions:
        out[REWARD_FUNCTIONS] = functions
    elif last.get(REWARD_FUNCTIONS):
        out[REWARD_FUNCTIONS] = last[REWARD_FUNCTIONS]
    return out


def reward_functions(logs: dict[str, Any]) -> list[dict[str, Any]]:
    """[{name, mean, std}] from TRL's rewards/<name>/mean and /std, in the order logged."""
    out = []
    for key, value in logs.items():
        if key.startswith("rewards/") and key.endswith("/mean"):
            name = key[len("rewards/"):-len("/mean")]
            std = logs.get(f"rewards/{name}/std")
            out.append({"name": name, "mean": _finite(value), "std": _finite(std)})
    return out


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def status_fields(record: dict[str, Any], significant: Any) -> dict[str, Any]:
    """status.progress's GRPO fields from a record, rounded as the other columns are."""
    out: dict[str, Any] = {name: significant(record.get(name)) for name in GRPO_LOGS.values()}
    if record.get(REWARD_FUNCTIONS):
        out[REWARD_FUNCTIONS] = [{k: v for k, v in {"name": f["name"], "mean": significant(f.get("mean")),
                                                    "std": significant(f.get("std"))}.items() if v is not None}
                                 for f in record[REWARD_FUNCTIONS]]
    return out


def grpo_summary(trainer: Any) -> dict[str, Any]:
    """The last logged value of each GRPO metric, and a few of the last completions with their rewards (rank 0
    holds the whole gathered batch)."""
    history = [h for h in trainer.state.log_history if "reward" in h]
    out: dict[str, Any] = {}
    if history:
        last = history[-1]
        out.update({name: last[key] for key, name in GRPO_LOGS.items() if _finite(last.get(key)) is not None})
        functions = reward_functions(last)
        if functions:
            out[REWARD_FUNCTIONS] = functions
    samples = completion_samples(getattr(trainer, "_logs", None), trainer.reward_weights.tolist()
                                 if hasattr(trainer, "reward_weights") else None)
    if samples:
        out["completionSamples"] = samples
    return out


def completion_samples(logs: dict[str, Any] | None, weights: list[float] | None) -> list[dict[str, Any]]:
    """One completion for each of the first prompts of the last generated batch: its text and rewards."""
    if not logs or not logs.get("prompt"):
        return []
    from finetune_trainer.training.builtin_rewards import text_of

    prompts, completions = list(logs["prompt"]), list(logs["completion"])
    rewards = {name: list(values) for name, values in logs["rewards"].items()}
    out, seen = [], set()
    for i, prompt in enumerate(prompts):
        text = text_of(prompt)
        if text in seen:
            continue
        seen.add(text)
        each = {name: (None if math.isnan(values[i]) else values[i]) for name, values in rewards.items()
                if i < len(values)}
        total = sum((w * v) for w, v in zip(weights or [1.0] * len(each), each.values(), strict=False)
                    if v is not None)
        out.append({"prompt": text[-SAMPLE_CHARS:], "completion": text_of(completions[i])[:SAMPLE_CHARS],
                    "rewards": each, "reward": total})
        if len(out) == SAMPLES_IN_SUMMARY:
            break
    return out
