"""The document mounted into every trainer pod: the validated spec plus everything derived from it."""

from typing import Any

from ..api.constants import API_VERSION, CACHE_MOUNT_PATH
from ..api.spec import FineTuneJobSpec
from .context import RenderContext
from .grpo import reward_code_dirs
from .training_args import training_arguments

TRAINER_CONFIG_KIND = "TrainerConfig"


def cache_dir(spec: FineTuneJobSpec, ctx: RenderContext) -> str:
    """Hub downloads (HF_HOME is its huggingface/), staged s3:// models and tokenized data: spec.data.cacheDir, else
    the pod's own emptyDir. Not the output volume: whoever can write that (a tenant's pod, another job on the claim)
    would choose the weights, and with trustRemoteCode the code, that the next attempt loads."""
    return ctx.cache_dir or spec.data.cache_dir or CACHE_MOUNT_PATH


def pod_cache_dir(ctx: RenderContext) -> str:
    """The pod's own cache (an emptyDir): what a model that brings code is downloaded into, whatever cacheDir says."""
    return ctx.cache_dir or CACHE_MOUNT_PATH


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
        "podCacheDir": pod_cache_dir(ctx),
        # Each pod has a cache of its own (`finetune run`'s nodes share the run's): each pod tokenizes the data.
        "cacheNodeLocal": ctx.cache_dir is None and spec.data.cache_dir is None,
        "resumeFrom": ctx.resume_from,
        **({"rewardCode": code} if (code := reward_code_dirs(spec)) else {}),
    }
