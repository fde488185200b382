"""spec.training: the Hugging Face TrainingArguments users set, plus extraArgs for the rest."""

import difflib
from typing import Any, Literal

from pydantic import Field, model_validator

from .base import ApiModel, FalseIsNo
from .errors import FieldError, SpecRuleErrors
from .transformers_names import OPTIMIZER_NAMES, TRANSFORMERS_VERSION

Scheduler = Literal[
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "warmup_stable_decay",
]
Precision = Literal["bf16", "fp16", "fp32"]
Strategy = FalseIsNo[Literal["no", "steps", "epoch"]]  # unquoted YAML `no` reads as false: taken as "no"

# TrainingArguments that a spec field already sets; the same name in extraArgs would silently fight it.
MANAGED_TRAINING_ARGUMENTS: dict[str, str] = {
    "output_dir": "spec.output",
    "resume_from_checkpoint": "spec.checkpoints.resume",
    "deepspeed": "spec.distributed.deepspeed",
    "fsdp": "spec.distributed.fsdp",
    "fsdp_config": "spec.distributed.fsdp",
    "use_cpu": "spec.distributed.gpusPerNode",
    "local_rank": "torchrun (never set by hand)",
    "ddp_backend": "spec.distributed (nccl on GPU, gloo on CPU)",
    "ddp_timeout": "spec.distributed.collectiveTimeoutSeconds",
    "save_strategy": "spec.checkpoints.saveStrategy",
    "save_steps": "spec.checkpoints.saveSteps",
    "save_total_limit": "spec.checkpoints.keep",
    # A weights-only checkpoint would be resumed by the next attempt (a restart, a suspension, an elastic change) with
    # a fresh optimizer, scheduler and data order: a different run, silently.
    "save_only_model": "spec.checkpoints: a checkpoint always holds the optimizer, scheduler and RNG states that "
                       "a restart resumes from; keep fewer with spec.checkpoints.keep, or none with saveStrategy: no",
    "neftune_noise_alpha": "spec.method.neftuneNoiseAlpha",
    "report_to": "spec.tracking.reportTo (TensorBoard is always written)",
    "run_name": "spec.tracking.runName",
    "push_to_hub": "spec.output.push",
    "hub_model_id": "spec.output.push.repo",
    "hub_private_repo": "spec.output.push.private",
    "hub_strategy": "spec.output.push.strategy",
    "hub_revision": "spec.output.push.revision",
    "hub_token": "spec.output.push.tokenSecret (a token never goes in the spec)",
    "hub_always_push": "spec.output.push",
    "logging_nan_inf_filter": "the trainer's NaN watchdog (always off)",
    "include_num_input_tokens_seen": "the trainer's progress reporting (always non_padding)",
    "remove_unused_columns": "the trainer's data pipeline (always false)",
    "num_train_epochs": "spec.training.epochs",
    "max_steps": "spec.training.maxSteps",
    "learning_rate": "spec.training.learningRate",
    "lr_scheduler_type": "spec.training.lrScheduler",
    "warmup_steps": "spec.training.warmupSteps or warmupRatio",
    "per_device_train_batch_size": "spec.training.perDeviceTrainBatchSize",
    "per_device_eval_batch_size": "spec.training.perDeviceEvalBatchSize",
    "gradient_accumulation_steps": "spec.training.gradientAccumulationSteps",
    "gradient_checkpointing": "spec.training.gradientCheckpointing",
    "activation_checkpointing": "spec.training.gradientCheckpointing",
    "bf16": "spec.training.precision",
    "fp16": "spec.training.precision",
    "tf32": "spec.training.tf32",
    "optim": "spec.training.optim",
    "weight_decay": "spec.training.weightDecay",
    "max_grad_norm": "spec.training.maxGradNorm",
    "logging_steps": "spec.training.loggingSteps",
    # The divergence guard judges the logged losses: a run that logs none (or not its first step) would end
    # Succeeded however it diverged.
    "logging_strategy": "spec.training.loggingSteps (losses are always logged: the divergence guard reads them)",
    "logging_first_step": "spec.training.loggingSteps (the first step is always logged: the divergence guard reads it)",
    "eval_strategy": "spec.training.evalStrategy",
    "eval_steps": "spec.training.evalSteps",
    "seed": "spec.training.seed",
}


# Names from the seed documents and older transformers that transformers 5 renamed or removed: the fix says where
# the setting went (a unit test checks that none of them is a field of the pinned transformers).
RETIRED_TRAINING_ARGUMENTS: dict[str, str] = {
    "evaluation_strategy": "renamed eval_strategy; set spec.training.evalStrategy (and evalSteps)",
    "group_by_length": "replaced by train_sampling_strategy; set extraArgs.train_sampling_strategy: group_by_length",
    "logging_dir": "removed; TensorBoard logs are always written to runs/ in the output directory",
    "overwrite_output_dir": "removed; spec.checkpoints.resume (auto or never) decides whether a run continues",
    "save_safetensors": "removed; checkpoints and the final model are always saved as safetensors",
    "fp16_opt_level": "removed with apex AMP; mixed precision is spec.training.precision (bf16 or fp16)",
}
# Schedulers whose transformers function needs keyword arguments (extraArgs.lr_scheduler_kwargs) to run at all.
SCHEDULER_REQUIRED_KWARGS: dict[str, tuple[tuple[str, ...], str]] = {
    "cosine_with_min_lr": (("min_lr", "min_lr_rate"), "{min_lr_rate: 0.1} (or min_lr: 1.0e-5), exactly one"),
    "warmup_stable_decay": (("num_decay_steps",), "{num_decay_steps: 100}"),
}


class TrainingSpec(ApiModel):
    epochs: float = Field(default=1.0, gt=0, le=10_000, description="Passes over the training data (num_train_epochs).")
    max_steps: int | None = Field(
        default=None, ge=1, description="Stop after this many optimizer steps; overrides epochs when set."
    )
    learning_rate: float = Field(default=1e-4, gt=0, le=10, description="Peak learning rate.")
    lr_scheduler: Scheduler = Field(default="cosine", description="Learning-rate schedule (lr_scheduler_type).")
    warmup_ratio: float = Field(default=0.0, ge=0, lt=1, description="Fraction of steps spent warming up.")
    warmup_steps: int = Field(default=0, ge=0, description="Warm-up steps; wins over warmupRatio when > 0.")
    per_device_train_batch_size: int = Field(default=1, ge=1, le=65536, description="Micro-batch per process.")
    per_device_eval_batch_size: int = Field(default=1, ge=1, le=65536, description="Eval micro-batch per process.")
    gradient_accumulation_steps: int = Field(
        default=1, ge=1, le=65536, description="Micro-batches accumulated per optimizer step."
    )
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute activations in backward to save memory (slower)."
    )
    precision: Precision = Field(
        default="bf16", description="bf16 or fp16 mixed precision, or fp32. CPU jobs support bf16 and fp32."
    )
    tf32: bool | None = Field(default=None, description="Allow TF32 matmuls on Ampere+ GPUs; unset keeps torch's.")
    optim: str = Field(
        default="adamw_torch_fused",
        min_length=1,
        max_length=64,
        pattern=r"^[a-z0-9_]+$",
        description="Optimizer name as TrainingArguments spells it (adamw_torch, adamw_torch_fused, adafactor, ...).",
    )
    weight_decay: float = Field(default=0.0, ge=0, le=10, description="AdamW weight decay.")
    max_grad_norm: float = Field(default=1.0, ge=0, description="Gradient clipping norm (0 disables clipping).")
    logging_steps: int = Field(default=10, ge=1, description="Log (and report progress) every this many steps.")
    eval_strategy: Strategy = Field(
        default="no", description="When to evaluate: no, steps (every evalSteps) or epoch; needs validation data."
    )
    eval_steps: int | None = Field(default=None, ge=1, description="Steps between evaluations (evalStrategy steps).")
    seed: int = Field(default=42, ge=0, le=2**32 - 1, description="Random seed for weights init, data order, dropout.")
    extra_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Any other TrainingArguments field by its Python name (e.g. adam_beta2: 0.95). Unknown names are "
        "rejected; names the spec manages (output_dir, deepspeed, fsdp, save_*) must be set through the spec.",
    )

    @model_validator(mode="after")
    def _training_rules(self) -> "TrainingSpec":
        errors: list[FieldError] = []
        if self.eval_strategy == "steps" and self.eval_steps is None:
            errors.append(
                FieldError("evalSteps", None, "evalStrategy steps needs evalSteps", "set evalSteps, e.g. 200")
            )
        errors += self._optimizer_and_scheduler_errors()
        for key in self.extra_args:
            if key in MANAGED_TRAINING_ARGUMENTS:
                errors.append(
                    FieldError(
                        f"extraArgs.{key}",
                        self.extra_args[key],
                        "this TrainingArguments field is managed by the operator",
                        f"set it through {MANAGED_TRAINING_ARGUMENTS[key]}",
                    )
                )
        if errors:
            raise SpecRuleErrors(errors)
        return self

    def _optimizer_and_scheduler_errors(self) -> list[FieldError]:
        """Refused here, not in the pod after the GPUs were allocated (transformers raises in train())."""
        errors = []
        if self.optim not in OPTIMIZER_NAMES:
            close = difflib.get_close_matches(self.optim, sorted(OPTIMIZER_NAMES), n=3, cutoff=0.6)
            offered = " or ".join(close) if close else "adamw_torch_fused, adamw_torch, adafactor"
            errors.append(FieldError("optim", self.optim, f"not an optimizer of transformers {TRANSFORMERS_VERSION}",
                                     f"use one of {offered}"))
        if self.lr_scheduler in SCHEDULER_REQUIRED_KWARGS:
            names, example = SCHEDULER_REQUIRED_KWARGS[self.lr_scheduler]
            kwargs = self.extra_args.get("lr_scheduler_kwargs")
            given = [n for n in names if isinstance(kwargs, dict) and kwargs.get(n) is not None]
            if len(given) != 1:
                errors.append(FieldError("lrScheduler", self.lr_scheduler,
                                         f"needs {' or '.join(names)} in extraArgs.lr_scheduler_kwargs",
                                         f"set extraArgs.lr_scheduler_kwargs: {example}"))
        if self.lr_scheduler == "reduce_lr_on_plateau" and self.eval_strategy == "no":
            errors.append(FieldError("lrScheduler", self.lr_scheduler, "reduce_lr_on_plateau steps on the eval loss",
                                     "set evalStrategy (and validation data), or use another lrScheduler"))
        return errors
