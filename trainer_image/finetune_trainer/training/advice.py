"""What the trainer tells the user about a run that a loss curve would not: why it stopped diverged and which
checkpoint is still good, a resume that changed the global batch or starts the optimizer over, system prompts a
template could not render."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune_trainer.outputs import checkpoints

Warn = Callable[[str, str], None]


def diverged(output_dir: Path, watch: Any) -> str:
    """What diverged (DivergenceWatch's text), the checkpoint left from before it (verified, and saved while the
    loss was under the threshold: newer ones, or one saved on a hard batch, may hold diverged weights) and the way
    out."""
    good = checkpoints.newest_complete(output_dir, at_most=watch.last_good_step, accept=watch.kept_good)
    newest = checkpoints.newest_complete(output_dir)
    if good is None:
        kept = ("no checkpoint was saved" if newest is None else
                f"no checkpoint was saved before the loss began to rise at step {watch.last_good_step}: the ones "
                f"saved since (the newest: {newest}) hold the diverged weights")
    else:
        kept = f"the last checkpoint before the loss began to rise is {good} (verified, kept)"
        if newest is not None and newest != good:
            kept += (f"; later ones (the newest: {newest}) hold the diverged weights: to continue from the good "
                     f"one set checkpoints.resume: {good}")
    return (f"{watch.message}; {kept}. Not retried: the same run diverges again; lower spec.training.learningRate "
            "(or raise warmupSteps), or tune spec.runPolicy.divergence")


def topology(args: Any) -> dict[str, int]:
    """What a checkpoint records of the run that saved it, to compare on resume."""
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
    return {"worldSize": args.world_size, "globalBatchSize": per_step * args.world_size}


def batch_changed(checkpoint: Path, args: Any, warn: Warn) -> None:
    """A resume on another number of processes changes the global batch: the schedule continues by step, so every
    remaining step sees another number of samples and an epoch another number of steps."""
    try:
        marker = json.loads((checkpoint / checkpoints.COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return
    before = marker.get("producedBy") or {}
    now = topology(args)
    if not before.get("globalBatchSize") or before["globalBatchSize"] == now["globalBatchSize"]:
        return
    warn("GlobalBatchChanged",
         f"resuming {checkpoint.name}, trained with a global batch of {before['globalBatchSize']} on "
         f"{before.get('worldSize', '?')} process(es), on {now['worldSize']}: the global batch is now "
         f"{now['globalBatchSize']}. The learning-rate schedule and maxSteps continue by step, so each remaining "
         f"step takes {now['globalBatchSize'] / before['globalBatchSize']:.3g}x the samples and an epoch has "
         "fewer (or more) steps; keep numNodes x gpusPerNode x perDeviceTrainBatchSize x gradientAccumulationSteps "
         "the same to resume the run unchanged")


def weights_only(checkpoint: Path, args: Any, warn: Warn) -> None:
    """A checkpoint saved with save_only_model (by another run: a job's extraArgs may not set it) holds no
    optimizer, scheduler or RNG state: transformers resumes it with a new optimizer and the learning-rate schedule
    from its start at the checkpoint's step, without a word. Every other checkpoint has the scheduler's file
    (scheduler.pt), or DeepSpeed's folder (global_step*) where DeepSpeed keeps the states itself."""
    if (checkpoint / "scheduler.pt").exists() or any(checkpoint.glob("global_step*")):
        return
    warn("WeightsOnlyCheckpoint",
         f"resuming {checkpoint.name}, which holds the weights but no optimizer, learning-rate scheduler or random "
         "state (saved with save_only_model): training goes on from its step with a new optimizer (Adam's "
         f"moments at zero) and the {args.lr_scheduler_type} learning-rate schedule from its start (its warmup "
         "again); name a checkpoint that holds them (optimizer.pt, scheduler.pt) to resume the run unchanged")


def data_not_skipped(checkpoint: Path, args: Any, warn: Warn) -> None:
    """extraArgs.ignore_data_skip: transformers resumes without skipping the batches of the epoch the checkpoint
    had trained on, so they are trained on again and the run goes on on other data than the interrupted one would
    have; a gang restart resumes on its own, so the job says it each time."""
    if not getattr(args, "ignore_data_skip", False):
        return
    step = checkpoints.step_of(checkpoint) or 0
    warn("DataSkipIgnored",
         f"resuming {checkpoint.name} (step {step}) with extraArgs.ignore_data_skip: within its epoch the data "
         "starts over from the epoch's first batch, so the batches the run had trained on in that epoch are trained "
         "on again (not the run that was interrupted); remove ignore_data_skip to continue the data where it "
         "stopped")


def folded_system(spec: Any, stats: dict[str, Any], warn: Warn) -> None:
    """Once per run, when the chat template refused a system message and it went into the first user turn."""
    parts = [part for part in stats.values() if isinstance(part, dict)]
    folded = sum(int(part.get("system_folded") or 0) for part in parts)
    if folded:
        warn("SystemPromptFolded",
             f"the chat template of {spec.model.tokenizer or spec.model.name} cannot render a system message: in "
             f"{folded} row(s){_first(parts, 'system_folded')} the system prompt was put at the start of the first "
             "user turn (what such models expect); prompts at inference should do the same")


def _first(parts: list[dict[str, Any]], outcome: str) -> str:
    where = next(((part.get("first") or {}).get(outcome) for part in parts if (part.get("first") or {}).get(outcome)),
                 None)
    return f" (the first: {where})" if where else ""


def row_outcomes(spec: Any, stats: dict[str, Any], warn: Warn, streamed: bool = False) -> None:
    """Every row that is not trained whole, counted and said once per run, each kind with its first row: rows cut
    at data.maxLength (their ends, end-of-sequence included, are not learned) and rows left out (too long under
    truncation: drop, cut before their reply began, no reply at all)."""
    length, seen = spec.data.max_length, " streamed" if streamed else ""
    for part, name in (("train", "training"), ("eval", "validation")):
        counts = stats.get(part) or {}
        rows, kept, trainable = counts.get("rows", 0), counts.get("kept", 0), counts.get("trainable_tokens", 0)
        cut = int(counts.get("truncated") or 0)
        if cut:
            notes = [f"the first: {first}" for first in [(counts.get("first") or {}).get("truncated")] if first]
            notes += [f"the longest: {counts['longest']} tokens"] if counts.get("longest") else []
            warn("RowsTruncated",
                 f"{cut} of {rows}{seen} {name} row(s) were longer than data.maxLength={length} tokens"
                 f"{' (' + '; '.join(notes) + ')' if notes else ''} and were cut: "
                 f"{counts.get('reply_tokens_cut', 0)} reply token(s) past the cut are not trained, nor their "
                 f"end-of-sequence, so the model learns replies that do not stop there ({trainable} reply token(s) "
                 f"of {kept} row(s) are trained); raise data.maxLength, or set data.truncation: drop to leave such "
                 "rows out")
        kinds = [(int(counts.get("dropped_too_long") or 0), "dropped_too_long",
                  f"longer than data.maxLength={length} tokens under truncation: drop"),
                 (int(counts.get("dropped_cut_before_reply") or 0), "dropped_cut_before_reply",
                  f"cut at data.maxLength={length} before their reply began, the prompt alone filling it"),
                 (int(counts.get("dropped_no_target") or 0), "dropped_no_target",
                  f"with no reply to learn, none or an empty one in the columns format {spec.data.format} reads")]
        dropped = sum(n for n, _, _ in kinds)
        if dropped:
            said = "; ".join(f"{n} {why}{_first([counts], key)}" for n, key, why in kinds if n)
            warn("RowsDropped",
                 f"{dropped} of {rows}{seen} {name} row(s) were left out and are not trained: {said}. {kept} row(s) "
                 f"with {trainable} reply token(s) are; raise data.maxLength (or shorten the prompts), or check "
                 "data.format and data.columns")
