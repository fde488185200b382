"""The ConfigMap holding trainer.json and, when used, deepspeed.json or fsdp.json."""

import json
from typing import Any

from ..api.constants import CONFIG_FILE, DEEPSPEED_FILE, FSDP_FILE
from ..api.distributed import DeepSpeedSpec, FsdpSpec
from ..api.spec import FineTuneJobSpec
from .context import RenderContext
from .deepspeed import deepspeed_config
from .fsdp import fsdp_config
from .names import config_map_name, job_labels
from .trainer_config import trainer_config


def config_files(spec: FineTuneJobSpec, ctx: RenderContext) -> dict[str, str]:
    """File name -> content; json.dumps escapes every user string, so no value can break the document."""
    files = {CONFIG_FILE: _dump(trainer_config(spec, ctx))}
    d = spec.distributed
    if d.strategy == "deepspeed":
        files[DEEPSPEED_FILE] = _dump(deepspeed_config(d.deepspeed or DeepSpeedSpec()))
    elif d.strategy == "fsdp":
        files[FSDP_FILE] = _dump(fsdp_config(d.fsdp or FsdpSpec()))
    return files


def render_config_map(spec: FineTuneJobSpec, ctx: RenderContext) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": config_map_name(ctx), "namespace": ctx.namespace, "labels": job_labels(ctx, "config")},
        "data": config_files(spec, ctx),
    }


def _dump(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"
