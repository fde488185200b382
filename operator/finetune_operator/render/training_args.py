"""Spec -> the keyword arguments of transformers.TrainingArguments, exactly as the trainer will pass them."""

import posixpath
from typing import Any

from ..api.constants import DEEPSPEED_FILE, FSDP_FILE
from ..api.spec import FineTuneJobSpec
from .context import RenderContext


def training_arguments(spec: FineTuneJobSpec, ctx: RenderContext) -> dict[str, Any]:
    """TrainingArguments kwargs: spec fields first, then extraArgs (names already checked against transformers)."""
    t, d, ck = spec.training, spec.distributed, spec.checkpoints
    args: dict[str, Any] = {
        "output_dir": ctx.output_dir,
        "num_train_epochs": t.epochs,
        "max_steps": t.max_steps if t.max_steps is not None else -1,
        "learning_rate": t.learning_rate,
        "lr_scheduler_type": t.lr_scheduler,
        # transformers 5 merged warmup_ratio into warmup_steps: a float below 1 is a ratio of total steps.
        "warmup_steps": t.warmup_steps if t.warmup_steps > 0 else t.warmup_ratio,
        "per_device_train_batch_size": t.per_device_train_batch_size,
        "per_device_eval_batch_size": t.per_device_eval_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        # transformers 5 renamed gradient_checkpointing to activation_checkpointing.
        "activation_checkpointing": t.gradient_checkpointing,
        "bf16": t.precision == "bf16",
        "fp16": t.precision == "fp16",
        "optim": t.optim,
        "weight_decay": t.weight_decay,
        "max_grad_norm": t.max_grad_norm,
        "logging_steps": t.logging_steps,
        "logging_first_step": True,
        "eval_strategy": t.eval_strategy,
        "save_strategy": ck.save_strategy,
        "save_steps": ck.save_steps,
        "save_total_limit": ck.keep,
        "seed": t.seed,
        "ddp_timeout": d.collective_timeout_seconds,
        "report_to": spec.tracking.trackers,
        "run_name": spec.tracking.run_name or ctx.name,
        # The trainer hands over already-tokenized columns; the default would drop them by the model's signature.
        "remove_unused_columns": False,
        "include_num_input_tokens_seen": "non_padding",
        # The NaN watchdog must see a NaN loss; the default filter would average it away.
        "logging_nan_inf_filter": False,
    }
    if t.eval_steps is not None:
        args["eval_steps"] = t.eval_steps
    if spec.evaluation.early_stopping is not None:
        # The final model is the best checkpoint by validation loss; the trainer adds EarlyStoppingCallback.
        args.update(load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=False)
    if t.tf32 is not None:
        args["tf32"] = t.tf32
    if t.gradient_checkpointing:
        # Reentrant checkpointing breaks with frozen base weights (LoRA) and with DDP's unused-parameter logic.
        args["activation_checkpointing_kwargs"] = {"use_reentrant": False}
    if spec.data.streaming:
        # Each process reads its own shards (or its share of the stream) instead of rank 0 dispatching batches,
        # which breaks on padded batches of different lengths and on packed ones (finetune_trainer/streaming.py).
        args["accelerator_config"] = {"dispatch_batches": False}
    if spec.method.neftune_noise_alpha is not None:
        args["neftune_noise_alpha"] = spec.method.neftune_noise_alpha
    if d.gpus_per_node == 0:
        # Without use_cpu, a CPU DDP run silently trains every rank alone (world size 1) and still exits 0.
        args["use_cpu"] = True
    if d.strategy == "deepspeed":
        args["deepspeed"] = posixpath.join(ctx.config_dir, DEEPSPEED_FILE)
    elif d.strategy == "fsdp":
        args["fsdp"] = True
        args["fsdp_config"] = posixpath.join(ctx.config_dir, FSDP_FILE)
    elif d.world_size > 1 and spec.method.type in ("lora", "qlora", "freeze"):
        # Frozen parameters never get gradients; telling DDP up front avoids a scan (and an error) every step.
        args["ddp_find_unused_parameters"] = False
    return {**args, **spec.training.extra_args}
