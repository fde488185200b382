"""Which checkpoint a run resumes from, and whether it may: checkpoints.resume (auto, never, a path), the newest
complete checkpoint of the output directory, the operator's hint, and a checkpoint another model, method or data
produced refused with the fix."""

import logging
from pathlib import Path

from finetune_operator.api.sources import normalised
from finetune_trainer.config import TrainerConfig
from finetune_trainer.errors import ConfigError
from finetune_trainer.outputs import checkpoints

log = logging.getLogger("finetune_trainer")


def _in(path: str, directory: Path) -> bool:
    return normalised(path).startswith(str(directory).rstrip("/") + "/")


def resume_checkpoint(cfg: TrainerConfig) -> str | None:
    """auto: the newest complete checkpoint in the output dir (partial ones skipped), else the operator's hint
    (status.checkpoint) if it still verifies; never: start fresh; a path the user gave: that one or an error."""
    resume = cfg.spec.checkpoints.resume
    if resume == "never":
        return None
    if resume == "auto":
        found = checkpoints.newest_complete(cfg.output_dir)
        if found is not None:
            _compatible(found, cfg, data_too=True)
            return str(found)
        # A bucket's was restored above; a hint outside the job's own output is not one of its checkpoints (the
        # operator passes none such: status.checkpoint is written by the trainer identity, not trusted here either).
        if cfg.resume_from and not cfg.resume_from.startswith("s3://") and _in(cfg.resume_from, cfg.output_dir):
            try:
                checkpoints.verify(Path(cfg.resume_from))
                return cfg.resume_from
            except checkpoints.IncompleteCheckpoint as exc:
                log.warning("ignoring the operator's resume hint: %s", exc)
        return None
    try:
        checkpoints.verify(Path(resume))
    except checkpoints.IncompleteCheckpoint as exc:
        raise ConfigError(f"checkpoints.resume points at an unusable checkpoint: {exc}") from exc
    _compatible(Path(resume), cfg, data_too=False)  # a checkpoint named on purpose may continue on new data
    return resume


def _compatible(checkpoint: Path, cfg: TrainerConfig, data_too: bool) -> None:
    """A FineTuneJob deleted and created again under its name (or an edited output path) finds checkpoints another
    model or method produced: resuming would crash on shapes, or silently train the wrong thing. Permanent. Other
    data is refused too when resuming automatically (the trainer would skip batches of data it never saw); a
    checkpoint named in checkpoints.resume may continue on new data."""
    why = checkpoints.incompatibility(checkpoint, cfg.spec, keys=checkpoints.MODEL_KEYS)
    if why is not None:
        raise ConfigError(f"the checkpoint {checkpoint} was produced by another model or method ({why}); it is "
                          "not resumed. Delete the output directory's checkpoints, set checkpoints.resume: never, "
                          "or give the job another name or output.subPath")
    other_data = checkpoints.incompatibility(checkpoint, cfg.spec, keys=checkpoints.DATA_KEYS) if data_too else None
    if other_data is not None:
        raise ConfigError(f"the checkpoint {checkpoint} was trained on other data (spec.data changed: {other_data}); "
                          "resume: auto does not continue it, as it would skip batches of data it never saw. "
                          f"Name it in checkpoints.resume ({checkpoint}) to continue on the new data, set "
                          "checkpoints.resume: never, or give the job another name or output.subPath")
