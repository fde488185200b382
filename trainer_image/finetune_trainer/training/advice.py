"""What the trainer tells the user about a run that a loss curve would not: why it stopped diverged and which
checkpoint is still good, a resume that changed the global batch, system prompts a template could not render."""

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


def folded_system(spec: Any, stats: dict[str, Any], warn: Warn) -> None:
    """Once per run, when the chat template refused a system message and it went into the first user turn."""
    folded = sum(int((part or {}).get("system_folded") or 0) for part in stats.values() if isinstance(part, dict))
    if folded:
        warn("SystemPromptFolded",
             f"the chat template of {spec.model.tokenizer or spec.model.name} cannot render a system message: in "
             f"{folded} row(s) the system prompt was put at the start of the first user turn (what such models "
             "expect); prompts at inference should do the same")


def truncated(spec: Any, stats: dict[str, Any], warn: Warn) -> None:
    """Once per run, when rows were cut at data.maxLength (truncation: truncate): a cut row loses its end, the
    reply's last tokens and its end-of-sequence, so the model learns replies that do not stop there."""
    for part, name in (("train", "training"), ("eval", "validation")):
        counts = stats.get(part) or {}
        cut = int(counts.get("truncated") or 0)
        if cut:
            longest = f" (the longest: {counts['longest']} tokens)" if counts.get("longest") else ""
            warn("RowsTruncated",
                 f"{cut} of {counts.get('rows', '?')} {name} row(s) were longer than data.maxLength="
                 f"{spec.data.max_length} tokens{longest} and were cut: their ends (and end-of-sequence tokens) "
                 "are not trained; raise data.maxLength, or set data.truncation: drop to leave such rows out")
