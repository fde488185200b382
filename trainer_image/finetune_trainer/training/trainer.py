"""The Trainer of a job: transformers' for SFT, TRL's for a preference objective, with our callbacks (progress,
checkpoint markers, divergence, graceful stop, samples) and a perplexity beside every validation loss."""

import logging
import math
import time
from typing import Any

from finetune_trainer.config import TrainerConfig
from finetune_trainer.outputs import checkpoints
from finetune_trainer.outputs.checkpoint_writer import CheckpointWriter, overlapped, save_in_background
from finetune_trainer.training import advice
from finetune_trainer.training.model import base_model

log = logging.getLogger(__name__)


def build_trainer(cfg: TrainerConfig, args, tokenizer, model, data, reporter, warnings):
    from transformers import Trainer

    from finetune_trainer.data.collators import make_collator
    from finetune_trainer.training.callbacks import (
        CheckpointMarkerCallback,
        GracefulStop,
        LearningRateOnResume,
        ProgressCallback,
    )
    from finetune_trainer.training.divergence import DivergenceWatch, FirstRows

    progress = ProgressCallback(cfg.output_dir, reporter, cfg.spec.training.precision,
                                cfg.spec.resources.peak_tflops_per_gpu, attempt=cfg.attempt)
    # A reward model's loss is a pair's -log sigmoid(margin), not a guess over the vocabulary: its uniform guess is
    # between the two answers (ln 2). Without one, a run that blew up inside the warm-up was judged by its own
    # blown-up early mean, and never stopped.
    reward = cfg.spec.method.objective == "reward"
    watchdog = DivergenceWatch(cfg.spec.run_policy.divergence, warnings, None if reward else _vocab_size(model),
                               choices=2 if reward else None)
    # The marker callback runs first so the progress record of a save already names the new checkpoint.
    stop = GracefulStop(watchdog.withholds_saves)
    producer = {**checkpoints.provenance(cfg.spec), **advice.topology(args)}
    # With output.uri, status.checkpoint names a checkpoint once it is complete in the bucket (remote_output).
    writer = CheckpointWriter() if overlapped(cfg.spec) else None
    marked = CheckpointMarkerCallback(cfg.output_dir, None if cfg.spec.output.uri else progress, producer,
                                      deferred=writer is not None)
    callbacks = [marked, progress, watchdog, stop, LearningRateOnResume(warnings)]
    early = cfg.spec.evaluation.early_stopping
    if early is not None:
        from transformers import EarlyStoppingCallback

        callbacks.append(EarlyStoppingCallback(early.patience, early.threshold))

    evaluation = cfg.spec.evaluation
    samples = None
    if evaluation.prompts:
        from finetune_trainer.training.samples import SampleCallback

        samples = SampleCallback(list(evaluation.prompts), evaluation.generation, cfg.spec.data, tokenizer,
                                 cfg.output_dir, cfg.spec.distributed.shards_parameters, stop)
        callbacks.append(samples)

    # SFT: the rows of the first step, for the guard to measure again (a loss that rose on new rows is no divergence).
    first = FirstStepRows() if cfg.spec.method.objective == "sft" else None
    base: Any = Trainer
    kwargs: dict[str, Any] = {"data_collator": make_collator(tokenizer, cfg.spec.data.packing,
                                                             cfg.spec.model.attn_implementation)}
    if cfg.spec.method.objective != "sft":
        # TRL's trainer, with our callbacks, checkpoints and exit codes, and its own collator. DPO and KTO on a LoRA
        # model need no second copy (the reference is the base with the adapter disabled, or a frozen copy of the
        # adapter); a full fine-tune gets TRL's frozen copy (or none with precomputeRefLogProbs); ORPO and SimPO
        # have no reference.
        from finetune_trainer.training.objectives import trl_classes

        base, kwargs = trl_classes(cfg.spec.method.objective)[1], {}
    grpo = cfg.spec.method.objective == "grpo"
    if grpo:  # the rewards, imported and checked here, before any step
        from finetune_trainer.training import grpo as grpo_objective

        kwargs = grpo_objective.trainer_kwargs(cfg, model, tokenizer, data)

    sft = cfg.spec.method.objective == "sft"

    class FineTuneTrainer(base):
        def log(self, logs: dict[str, float], *rest, **kwargs) -> None:
            # Perplexity next to every validation loss: in TensorBoard, progress.jsonl, the status and the summary.
            # SFT only: a preference loss is no token cross-entropy (its evaluation has the held-out accuracy).
            if "eval_loss" in logs and sft:
                logs["eval_perplexity"] = perplexity(logs["eval_loss"])
            super().log(logs, *rest, **kwargs)

        def _track_num_input_tokens(self, inputs: dict[str, Any]) -> None:
            # TRL's pair collator (ORPO, CPO) has no input_ids, so transformers counts nothing: count both answers'
            # tokens (each with its prompt), as DPO's concatenated batch does.
            if grpo:  # GRPOTrainer counts prompt and completion tokens itself, as it generates them
                return
            masks = [inputs[k] for k in ("chosen_attention_mask", "rejected_attention_mask") if k in inputs]
            if "input_ids" in inputs or not masks or self.args.include_num_input_tokens_seen == "no":
                super()._track_num_input_tokens(inputs)
                return
            import torch

            seen = torch.as_tensor(sum(int(m.sum()) for m in masks), device=self.args.device, dtype=torch.int64)
            self.state.num_input_tokens_seen += self.accelerator.gather(seen).sum().item()

        def training_step(self, model, inputs, *rest: Any, **kwargs: Any):
            if first is not None and first.collecting(self.state.global_step):
                first.keep(dict(inputs), self._loss_now(model, inputs))
            return super().training_step(model, inputs, *rest, **kwargs)

        def _loss_now(self, model, inputs):
            """The loss of `inputs` with the weights as they are, without dropout and without a gradient."""
            import torch

            was = model.training
            model.eval()
            try:
                with torch.no_grad(), self.compute_loss_context_manager():
                    loss = self.compute_loss(model, dict(self._prepare_inputs(dict(inputs))))
            finally:
                model.train(was)
            return loss.detach().float()

        def first_rows_loss(self) -> "FirstRows | None":
            """The first step's rows measured again, averaged over every process (a collective: every rank asks at
            the same logged step, the logged losses being the same on all)."""
            if first is None or not first.batches:
                return None
            import torch

            now = torch.stack([self._loss_now(self.model_wrapped, b) for b in first.batches]).mean()
            both = self.accelerator.reduce(torch.stack([now, torch.stack(first.losses).mean()]), "mean")
            return FirstRows(now=float(both[0]), then=float(both[1]))

        def _get_train_sampler(self, *args: Any, **kwargs: Any) -> Any:
            sampler = super()._get_train_sampler(*args, **kwargs)
            return grpo_objective.resumable_sampler(sampler) if grpo else sampler

        def train(self, *args: Any, **kwargs: Any) -> Any:
            """Whatever ends training waits for the checkpoint being written (overlapped saves)."""
            try:
                result = super().train(*args, **kwargs)
            except BaseException:
                if writer is not None:
                    try:
                        writer.drain()
                    except Exception as exc:  # the training's own failure is the one to report
                        log.warning("the checkpoint being written failed too: %s", exc)
                raise
            if writer is not None:
                writer.drain()
            return result

        def _finalize_training(self, *args: Any, **kwargs: Any) -> Any:
            # The end of training loads the best checkpoint (load_best_model_at_end) and, with keep 1, removes the
            # others: from the disk, so the last checkpoint must be written first.
            if writer is not None:
                writer.drain()
            return super()._finalize_training(*args, **kwargs)

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            marked.save_started = time.monotonic()
            if writer is None:
                super()._save_checkpoint(model, trial)
            else:
                save_in_background(self, writer, marked, trial)

        def _run_epoch(self, *args: Any, **kwargs: Any) -> None:
            # transformers trains one step past max_steps when it resumes a checkpoint saved at max_steps in mid-epoch
            # (its skip-ahead runs a step before any stop check): an attempt that resumes a finished run, e.g. to
            # retry its push, would train on and overwrite the model.
            if 0 < self.state.max_steps <= self.state.global_step:
                self.control.should_training_stop = True
                return
            if grpo:  # each epoch's prompt order, also in the epoch a resume starts in (resumable_sampler)
                grpo_objective.set_sampler_epoch(kwargs.get("train_dataloader"), kwargs.get("epoch", 0))
            super()._run_epoch(*args, **kwargs)

    trainer = FineTuneTrainer(model=model, args=args, train_dataset=data.train, eval_dataset=data.eval,
                              processing_class=tokenizer, callbacks=callbacks, **kwargs)
    if first is not None:
        watchdog.first_rows = trainer.first_rows_loss
    if reward:
        dropped_pairs(cfg, data, trainer, warnings)
    if not sft and not grpo:  # TRL's datasets as they will be batched (a reward model's without the pairs it left out)
        from finetune_trainer.training.last_batch import say_repeated_rows

        say_repeated_rows(args, trainer.train_dataset, "examples" if cfg.spec.method.objective == "kto" else "pairs",
                          warnings)
    if grpo:
        grpo_objective.finish_setup(trainer, cfg.spec)
    if samples is not None:
        samples.tensorboard = next((cb for cb in trainer.callback_handler.callbacks
                                    if type(cb).__name__ == "TensorBoardCallback"), None)
    return trainer, progress, watchdog, stop, samples


class FirstStepRows:
    """The micro-batches of this process's first optimizer step, with their loss before it (on this rank)."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.batches: list[dict[str, Any]] = []
        self.losses: list[Any] = []

    def collecting(self, global_step: int) -> bool:
        if self.step is None:
            self.step = global_step
        return global_step == self.step

    def keep(self, batch: dict[str, Any], loss: Any) -> None:
        self.batches.append(batch)
        self.losses.append(loss)


def dropped_pairs(cfg: TrainerConfig, data, trainer, warn) -> None:
    """TRL's RewardTrainer leaves out a pair whose chosen or rejected text (with its prompt) is longer than
    data.maxLength, where the other objectives truncate: said once, and no pair left is a data error (65)."""
    from finetune_trainer.errors import DataError

    for part, before, after in (("training", data.train, trainer.train_dataset),
                                ("validation", data.eval, trainer.eval_dataset)):
        if before is None or after is None or len(after) == len(before):
            continue
        text = (f"{len(before) - len(after)} of {len(before)} {part} pair(s) are longer than data.maxLength="
                f"{cfg.spec.data.max_length} tokens (prompt and answer) and were left out")
        if len(after) == 0:
            raise DataError(f"{text}: no {part} pair is left; raise data.maxLength")
        warn("PairsDropped", f"{text}; raise data.maxLength to train on them")


def _vocab_size(model) -> int | None:
    """The output vocabulary, whose uniform guess (ln V) bounds the divergence guard's early loss."""
    config = base_model(model).config
    # A multimodal model (Gemma-3 loads as Gemma3ForConditionalGeneration) keeps it in its text config only.
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None)
    return size if isinstance(size, int) else None


def perplexity(loss: float) -> float:
    """exp(mean token cross-entropy); inf rather than an overflow for a diverged loss."""
    return math.exp(loss) if loss < 700 else math.inf

