"""spec.method.grpo: online RL with GRPO (TRL's GRPOTrainer): how completions are generated, how they are scored
(the rewards, several at once with weights) and the loss settings users tune.

Nothing here runs a user's code: a reward function is named (`module:function`) and imported by the trainer pods
only. Regular expressions are compiled to check them, never matched against anything in the operator."""

import re
from typing import Literal

from pydantic import Field, model_validator

from .base import ApiModel
from .errors import FieldError, SpecRuleErrors
from .k8s_names import DnsSubdomain
from .sources import LOCATION_SCHEMA, Location

RewardType = Literal["accuracy", "exactMatch", "regex", "format", "length", "model", "function"]
GrpoLoss = Literal["grpo", "dr_grpo", "dapo", "bnpo"]
ScaleRewards = Literal["group", "batch", "none"]
FUNCTION_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]*$"
MAX_REWARDS = 16

# The columns a built-in reward reads by default (TRL's accuracy reward reads `solution`).
DEFAULT_COLUMNS = {"accuracy": "solution", "exactMatch": "answer"}
# Which reward fields each type reads; any other field set on a reward is an error, not silently ignored.
FIELDS_OF = {"accuracy": {"column"}, "exactMatch": {"column", "extract", "caseSensitive"},
             "regex": {"column", "pattern"}, "format": {"format"}, "length": {"maxTokens", "softTokens"},
             "model": {"model"}, "function": {"function", "configMap"}}


class RewardSpec(ApiModel):
    """One reward: a built-in, a reward model or the user's own function. Every reward scores every completion;
    the completion's reward is the weighted sum."""

    type: RewardType = Field(description="accuracy: the completion's final answer (the last \\boxed{...}, else the "
                             "last number) equals the row's `column` (default solution) as a number or a math "
                             "expression (TRL's accuracy reward through math-verify when the image has it); "
                             "exactMatch: the completion, or the first group of `extract`, equals the row's `column` "
                             "(default answer), whitespace trimmed; regex: the completion contains a match of "
                             "`pattern`, or of the pattern in the row's `column`; format: the completion is laid out "
                             "as `format` says; length: a penalty for completions near or past `maxTokens` (DAPO's "
                             "soft overlong punishment, 0 to -1); model: a sequence-classification model's score of "
                             "prompt and completion (e.g. one the reward objective trained); function: your own "
                             "`module:function`, from the image or from `configMap`. Each scores 1 for yes and 0 for "
                             "no unless said otherwise.")
    name: str | None = Field(default=None, min_length=1, max_length=63, pattern=NAME_PATTERN,
                             description="The name its mean and std are logged under (progress, status, TensorBoard); "
                             "default: the type (function: the function's name, model: the model's last path part).")
    weight: float = Field(default=1.0, ge=-100, le=100, description="Its weight in the sum (TRL's reward_weights); "
                          "negative weights penalise.")
    column: str | None = Field(default=None, min_length=1, max_length=256, description="accuracy, exactMatch: the "
                               "column holding the reference answer; regex: a column holding each row's pattern "
                               "(instead of `pattern`).")
    pattern: str | None = Field(default=None, min_length=1, max_length=4096, description="regex: a Python regular "
                                "expression searched for in the completion.")
    extract: str | None = Field(default=None, min_length=1, max_length=4096, description="exactMatch: a Python "
                                "regular expression with one group; its first match in the completion is the answer "
                                "compared (e.g. '<answer>(.*?)</answer>'). No match scores 0.")
    case_sensitive: bool = Field(default=True, description="exactMatch: compare case-sensitively.")
    format: Literal["think", "thinkAnswer"] | None = Field(
        default=None, description="format: think (TRL's think format reward: the completion opens with one "
        "<think>...</think> block) or thinkAnswer (<think>...</think> then <answer>...</answer>, nothing else). "
        "Default thinkAnswer.")
    max_tokens: int | None = Field(default=None, ge=1, le=1_048_576, description="length: completions longer than "
                                   "this many tokens get -1 (default method.grpo.maxCompletionLength).")
    soft_tokens: int | None = Field(default=None, ge=0, le=1_048_576, description="length: the penalty grows "
                                    "linearly from 0 to -1 over the last this many tokens before maxTokens "
                                    "(default a quarter of maxTokens; 0: only past it).")
    model: Location | None = Field(default=None, min_length=1, max_length=1024, json_schema_extra=LOCATION_SCHEMA,
                                   description="model: a Hub id, a path on a mounted volume or s3:// URI of a "
                                   "sequence-classification model with one output (its tokenizer beside it); it "
                                   "scores the prompt and completion, as TRL does. A model source: it must lie under "
                                   "a runtime's limits.allowedModelSources, and it is loaded without remote code.")
    function: str | None = Field(default=None, max_length=512, pattern=FUNCTION_PATTERN, description="function: "
                                 "`module:function`, called in the trainer pods as TRL calls reward functions: "
                                 "f(prompts, completions, completion_ids, **columns) -> one float (or None: not "
                                 "applicable) per completion. A missing function, one that raises, returns the "
                                 "wrong number of rewards or NaN stops the job with its name and the row (exit 78).")
    config_map: DnsSubdomain | None = Field(default=None, max_length=253, description="function: a ConfigMap of "
                                            "the job's namespace whose keys are Python files (e.g. my_rewards.py); "
                                            "it is mounted into the trainer pods and put on the module path. Unset: "
                                            "the module comes from the trainer image.")

    @model_validator(mode="after")
    def _rules(self) -> "RewardSpec":
        errors: list[FieldError] = []
        wanted = FIELDS_OF[self.type]
        for field, alias, default in (("column", "column", None), ("pattern", "pattern", None),
                                      ("extract", "extract", None), ("case_sensitive", "caseSensitive", True),
                                      ("format", "format", None), ("max_tokens", "maxTokens", None),
                                      ("soft_tokens", "softTokens", None), ("model", "model", None),
                                      ("function", "function", None), ("config_map", "configMap", None)):
            value = getattr(self, field)
            if value != default and alias not in wanted:
                reads = ", ".join(sorted(wanted))
                errors.append(FieldError(alias, value, f"not a setting of the {self.type} reward",
                                         f"remove {alias} (the {self.type} reward reads {reads})"))
        required = {"model": "model", "function": "function"}.get(self.type)
        if required is not None and getattr(self, required) is None:
            example = "my_rewards:score" if required == "function" else "org/reward-model or /models/rm"
            errors.append(FieldError(required, None, f"the {self.type} reward needs {required}",
                                     f"add {required}: {example}"))
        if self.type == "regex" and (self.pattern is None) == (self.column is None):
            errors.append(FieldError("pattern", self.pattern, "a regex reward needs exactly one of pattern (one "
                                     "expression) or column (each row's own)", "keep one of them" if self.pattern
                                     else "add pattern: '...' or column: <the column with each row's pattern>"))
        for alias, value in (("pattern", self.pattern), ("extract", self.extract)):
            if value is None:
                continue
            try:
                compiled = re.compile(value)
            except re.error as exc:
                errors.append(FieldError(alias, value, f"not a Python regular expression: {exc}",
                                         "fix the expression (quote it in YAML: '...')"))
                continue
            if alias == "extract" and compiled.groups < 1:
                errors.append(FieldError(alias, value, "has no group: nothing to extract",
                                         "put the answer in a group, e.g. '<answer>(.*?)</answer>'"))
        if (self.max_tokens is not None and self.soft_tokens is not None and self.soft_tokens > self.max_tokens):
            errors.append(FieldError("softTokens", self.soft_tokens, f"is more than maxTokens {self.max_tokens}",
                                     f"use at most {self.max_tokens}"))
        if errors:
            raise SpecRuleErrors(errors)
        return self

    @property
    def default_name(self) -> str:
        """The name its metrics are logged under."""
        if self.name is not None:
            return self.name
        if self.function is not None:
            return self.function.rsplit(":", 1)[1]
        if self.model is not None:
            return re.sub(r"[^A-Za-z0-9_-]", "_", self.model.rstrip("/").rsplit("/", 1)[-1]) or "model"
        return {"exactMatch": "exact_match", "format": f"format_{self.format or 'thinkAnswer'}"}.get(
            self.type, self.type)


class GrpoSpec(ApiModel):
    """GRPO: for each prompt, numGenerations completions are sampled from the model being trained, scored by the
    rewards, and the model learns from each completion's advantage over its group's mean (no value model)."""

    rewards: list[RewardSpec] = Field(min_length=1, max_length=MAX_REWARDS, description="How completions are scored: "
                                      "several rewards add up with their weights.")
    num_generations: int = Field(default=8, ge=2, le=1024, description="Completions sampled per prompt (G, the "
                                 "group). The global batch (perDeviceTrainBatchSize x gradientAccumulationSteps x "
                                 "processes) counts completions and must be a multiple of it.")
    max_completion_length: int = Field(default=256, ge=1, le=131072, description="Tokens generated per completion "
                                       "at most; prompt plus completion must fit data.maxLength.")
    temperature: float = Field(default=1.0, gt=0, le=10, description="Sampling temperature (the log-probabilities "
                               "of the loss are taken at it, as TRL does).")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling: the smallest set of tokens whose "
                         "probabilities add up to this (1: all).")
    top_k: int = Field(default=0, ge=0, le=1_000_000, description="Sample among the k most likely tokens only "
                       "(0: no limit).")
    generation_backend: Literal["transformers", "vllm"] = Field(
        default="transformers", description="transformers: generate() in the trainer processes; vllm: vLLM's "
        "colocate mode in the trainer processes (needs GPUs and an image with vllm; the weights are synced to it "
        "each step). TRL's separate vLLM server mode is not offered (docs/concepts/grpo.md).")
    vllm_gpu_memory_utilization: float = Field(default=0.3, gt=0, lt=1, description="vllm: the share of each GPU "
                                               "vLLM reserves for its weights and KV cache, beside training.")
    beta: float = Field(default=0.0, ge=0, le=10, description="The KL penalty's weight towards the reference model "
                        "(0: none, and no reference model is held; DeepSeek-R1 used 0.001). With full fine-tunes a "
                        "reference copy of the model is kept; with LoRA it is the base with the adapter off.")
    epsilon: float = Field(default=0.2, gt=0, le=10, description="Clipping of the probability ratio: 1 - epsilon "
                           "to 1 + epsilon (PPO's).")
    epsilon_high: float | None = Field(default=None, gt=0, le=10, description="The upper clip, when it differs "
                                       "from epsilon (DAPO's clip-higher, 0.28 in the paper).")
    loss_type: GrpoLoss = Field(default="dapo", description="How token losses are averaged, as TRL names it: "
                                "dapo (default: over every completion token of the global batch), grpo (each "
                                "completion's own mean; biased to short right answers), dr_grpo (a constant, "
                                "maxCompletionLength: no length bias), bnpo (over the tokens of the local batch).")
    scale_rewards: ScaleRewards = Field(default="group", description="Advantages divided by the std of the "
                                        "rewards of each prompt's group (group), of the batch (batch), or not at all "
                                        "(none: Dr. GRPO's recommendation).")
    num_iterations: int = Field(default=1, ge=1, le=64, description="Optimizer steps on each batch of generations "
                                "(mu in the GRPO paper); above 1 the clipping matters. Resume is exact when "
                                "checkpoints fall on a multiple of it.")
    mask_truncated_completions: bool = Field(default=False, description="Leave completions cut at "
                                             "maxCompletionLength out of the loss (DAPO).")

    @model_validator(mode="after")
    def _names_unique(self) -> "GrpoSpec":
        errors = []
        seen: dict[str, int] = {}
        for i, reward in enumerate(self.rewards):
            name = reward.default_name
            if name in seen:
                errors.append(FieldError(f"rewards[{i}].name", name, f"rewards[{seen[name]}] is logged under the "
                                         "same name", "give one of them a name of its own"))
            seen.setdefault(name, i)
        if errors:
            raise SpecRuleErrors(errors)
        return self

    @property
    def config_maps(self) -> list[str]:
        """The ConfigMaps holding reward functions, each once, in order."""
        return list(dict.fromkeys(r.config_map for r in self.rewards if r.config_map is not None))
