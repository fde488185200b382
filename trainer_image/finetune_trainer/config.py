"""The mounted trainer.json -> a typed TrainerConfig and real TrainingArguments (via HfArgumentParser)."""

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from finetune_operator.api import constants as c
from finetune_operator.api.elastic import accumulation_steps
from finetune_operator.api.spec import FineTuneJobSpec
from finetune_trainer.errors import ConfigError


@dataclass(frozen=True)
class TrainerConfig:
    job_name: str
    namespace: str
    spec: FineTuneJobSpec
    training_arguments: dict[str, Any]
    output_dir: Path
    resume_from: str | None
    cache_dir: Path | None = None  # render.trainer_config.cache_dir; None (a config from before it): <output>/.cache
    pod_cache_dir: Path | None = None  # the pod's own emptyDir (render.trainer_config.pod_cache_dir)
    cache_node_local: bool = False  # `cache` is each node's own: each node's first process tokenizes the data
    job_uid: str | None = None  # the FineTuneJob (UID) and attempt this trainer reports to (status.reporter)
    attempt: int | None = None
    # method.grpo's reward functions from ConfigMaps: ConfigMap name -> where it is mounted (render/grpo.py).
    reward_code: dict[str, str] = field(default_factory=dict)

    @property
    def cache(self) -> Path:
        return self.cache_dir or self.output_dir / ".cache"

    @property
    def model_cache(self) -> Path:
        """Where s3:// models are staged: a model that brings code (trustRemoteCode) always into the pod's own cache,
        which nobody else writes, so its modules cannot be swapped between the check and the import."""
        if self.spec.model.trust_remote_code and self.pod_cache_dir is not None:
            return self.pod_cache_dir
        return self.cache


def load_config(path: str | Path) -> TrainerConfig:
    """Reads and re-validates the config with the operator's own models (one schema for both sides)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read trainer config {path}: {exc}") from exc
    try:
        spec = FineTuneJobSpec.model_validate(doc["spec"])
        return TrainerConfig(
            job_name=doc["job"]["name"],
            namespace=doc["job"]["namespace"],
            spec=spec,
            training_arguments=dict(doc["trainingArguments"]),
            output_dir=Path(doc["outputDir"]),
            resume_from=doc.get("resumeFrom"),
            cache_dir=Path(doc["cacheDir"]) if doc.get("cacheDir") else None,
            pod_cache_dir=Path(doc["podCacheDir"]) if doc.get("podCacheDir") else None,
            cache_node_local=bool(doc.get("cacheNodeLocal", False)),
            job_uid=doc["job"].get("uid"),
            attempt=doc["job"].get("attempt"),
            reward_code=dict(doc.get("rewardCode") or {}),
        )
    except (KeyError, TypeError, ValidationError) as exc:
        raise ConfigError(f"invalid trainer config {path}: {exc}") from exc


def training_arguments(cfg: TrainerConfig):
    """transformers.TrainingArguments (TRL's config of a preference objective: DPOConfig, KTOConfig...) from the
    rendered kwargs; unknown keys are an error, not ignored."""
    from transformers import HfArgumentParser, TrainingArguments

    kind: Any = TrainingArguments
    kwargs = dict(cfg.training_arguments)
    if cfg.spec.distributed.elastic:
        kwargs["gradient_accumulation_steps"] = elastic_accumulation(cfg.spec, int(os.environ.get(c.ENV_WORLD_SIZE,
                                                                                                   "1")))
    if cfg.spec.method.objective != "sft":
        from finetune_trainer.training.objectives import objective_arguments, trl_classes

        kind = trl_classes(cfg.spec.method.objective)[0]
        kwargs.update(objective_arguments(cfg.spec))
    try:
        (args,) = HfArgumentParser(kind).parse_dict(kwargs, allow_extra_keys=False)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"TrainingArguments rejected the config: {exc}") from exc
    return args


def elastic_accumulation(spec: FineTuneJobSpec, world_size: int) -> int:
    """An elastic group's gradient accumulation: the global batch the spec gives at numNodes, on the processes
    torchrun gathered (validation made sure every size of the range has a whole one)."""
    steps = accumulation_steps(spec, world_size)
    if steps is None:
        raise ConfigError(f"the global batch {spec.global_batch_size} cannot be kept on {world_size} processes "
                          "(no whole gradient accumulation); the elastic range of spec.distributed should not allow "
                          "this size")
    return steps
