"""Parts of the run's summary (the pod's termination message, summary.json): rewards, early stopping, memory,
sharding, and the loss plot."""

import logging
from typing import Any

from finetune_operator.api import constants as c
from finetune_trainer.config import TrainerConfig

log = logging.getLogger("finetune_trainer")


def preference_summary(log_history: list[dict[str, Any]]) -> dict[str, Any]:
    """The last logged value of each reward a preference objective logs, as the summary names them; {} for sft.
    Each its own last: KTO logs a margin only for batches that held both kinds of example."""
    from finetune_trainer.training.callbacks import REWARD_LOGS

    out = {}
    for key, name in REWARD_LOGS.items():
        value = next((h[key] for h in reversed(log_history) if key in h), None)
        if value is not None:
            out[name] = value
    return out


def grpo_summary(cfg: TrainerConfig, trainer) -> dict[str, Any]:
    """GRPO: the last rewards, KL and completion length, and a few completions with their rewards; {} otherwise."""
    if cfg.spec.method.objective != "grpo":
        return {}
    from finetune_trainer.training.grpo import grpo_summary as summary

    return summary(trainer)


def loss_plot(cfg: TrainerConfig) -> dict[str, str]:
    """loss.png in the output directory, from progress.jsonl; a plot that cannot be drawn never fails a run."""
    from finetune_trainer.outputs.plot import model_label, read_progress, write_loss_plot

    try:
        title = f"{cfg.job_name}: {model_label(cfg.spec.model.name)} ({cfg.spec.method.type})"
        path = write_loss_plot(read_progress(cfg.output_dir / c.PROGRESS_FILE), cfg.output_dir / "loss.png", title)
    except (OSError, ValueError, ImportError) as exc:  # ImportError: an image without matplotlib
        log.warning("loss.png not written: %s", exc)
        return {}
    return {"lossPlot": str(path)} if path is not None else {}


def early_stopping(cfg: TrainerConfig, trainer) -> dict[str, Any]:
    """Whether early stopping ended the run and which checkpoint became the final model."""
    if cfg.spec.evaluation.early_stopping is None:
        return {}
    state = trainer.state
    return {"stoppedEarly": state.global_step < state.max_steps, "bestCheckpoint": state.best_model_checkpoint,
            "bestEvalLoss": state.best_metric}


def peak_memory() -> dict[str, float]:
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"peakMemoryGiB": torch.cuda.max_memory_allocated() / 2**30}


def sharding(trainer) -> dict[str, Any]:
    """What really ran: the ZeRO stage and, under ZeRO-3, the fraction of parameters this rank holds."""
    engine = trainer.model_wrapped
    if not hasattr(engine, "zero_optimization_stage"):
        return {}
    out: dict[str, Any] = {"zeroStage": engine.zero_optimization_stage()}
    params = [p for p in trainer.model.parameters() if hasattr(p, "ds_numel")]
    if params:
        out["localParameterFraction"] = sum(p.ds_tensor.numel() for p in params) / sum(p.ds_numel for p in params)
    return out
