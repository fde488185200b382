"""The document mounted into every trainer pod: the validated spec plus everything derived from it."""

import posixpath
from typing import Any

from ..api.constants import API_VERSION
from ..api.spec import FineTuneJobSpec
from .context import RenderContext
from .grpo import reward_code_dirs
from .training_args import training_arguments

TRAINER_CONFIG_KIND = "TrainerConfig"


def cache_dir(spec: FineTuneJobSpec, ctx: RenderContext) -> str:
    """Hub downloads (HF_HOME is its huggingface/) and tokenized data: spec.data.cacheDir, else the output's .cache."""
    return ctx.cache_dir or spec.data.cache_dir or posixpath.join(ctx.output_dir, ".cache")


def trainer_config(spec: FineTuneJobSpec, ctx: RenderContext) -> dict[str, Any]:
    """The trainer re-validates `spec` with the same models, so operator and trainer share one schema."""
    return {
        "apiVersion": API_VERSION,
        "kind": TRAINER_CONFIG_KIND,
        "job": {"name": ctx.name, "namespace": ctx.namespace, **({"uid": ctx.uid} if ctx.uid else {}),
                "attempt": ctx.attempt},
        "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True),
        "trainingArguments": training_arguments(spec, ctx),
        "outputDir": ctx.output_dir,
        "cacheDir": cache_dir(spec, ctx),
        "resumeFrom": ctx.resume_from,
        **({"rewardCode": code} if (code := reward_code_dirs(spec)) else {}),
    }
