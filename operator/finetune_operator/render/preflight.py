"""The preflight Job (spec.runPolicy.preflight): one small CPU pod that runs finetune_trainer.preflight with the
trainer's image, config, volumes, secrets and identity, before the GPU gang of attempt 1 is requested.

It is "attempt 0" of the job: the same labels and naming, so the operator's caches and teardown treat it like any
attempt. Not queued through Kueue and never suspended: it holds no GPU."""

import dataclasses
from typing import Any

from ..api import constants as c
from ..api.spec import FineTuneJobSpec
from ..fit.host import quantity_bytes
from .configmap import render_config_map
from .context import RenderContext
from .workload import render_workload

PREFLIGHT_ATTEMPT = 0
# Tokenizer, model config and a few rows of each source: small, whatever the model's size. Every kind stated in
# limits too: a namespace ResourceQuota on limits.cpu (or .memory) refuses a pod that leaves one out (cpu's limit its
# request: a LimitRange's maxLimitRequestRatio of 1 is common for cpu).
PREFLIGHT_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "8Gi"}}
# Its local disk (the job's resources.ephemeralStorage, when that is smaller): no weights, no tokenized corpus.
PREFLIGHT_DISK = "4Gi"
PREFLIGHT_DEADLINE_SECONDS = 1800  # a hung download must not keep the job Pending forever


def preflight_command(ctx: RenderContext) -> list[str]:
    return ["python", "-m", "finetune_trainer.preflight", "--config", f"{ctx.config_dir}/{c.CONFIG_FILE}"]


def render_preflight(spec: FineTuneJobSpec, ctx: RenderContext) -> list[dict[str, Any]]:
    """The ConfigMap (the same one the attempts mount) and the preflight Job, in apply order."""
    pre = dataclasses.replace(ctx, attempt=PREFLIGHT_ATTEMPT)
    job = render_workload(spec, pre)
    job["metadata"]["labels"].pop(c.LABEL_KUEUE_QUEUE, None)
    job["metadata"]["labels"][c.LABEL_COMPONENT] = "preflight"
    job["spec"].update(completions=1, parallelism=1, suspend=False, activeDeadlineSeconds=PREFLIGHT_DEADLINE_SECONDS)
    template = job["spec"]["template"]
    template["metadata"]["labels"][c.LABEL_COMPONENT] = "preflight"
    container = template["spec"]["containers"][0]
    resources = {kind: dict(values) for kind, values in PREFLIGHT_RESOURCES.items()}
    disk = spec.resources.ephemeral_storage
    if disk is not None:  # a namespace quota on it would refuse a pod without it
        smaller = disk if quantity_bytes(disk) < quantity_bytes(PREFLIGHT_DISK) else PREFLIGHT_DISK
        for kind in ("requests", "limits"):
            resources[kind]["ephemeral-storage"] = smaller
    container.update(command=preflight_command(pre), resources=resources)
    container.pop("ports", None)
    return [render_config_map(spec, ctx), job]
