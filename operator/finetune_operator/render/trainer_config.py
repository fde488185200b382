"""The document mounted into every trainer pod: the validated spec plus everything derived from it."""

from typing import Any

from ..api.constants import API_VERSION
from ..api.spec import FineTuneJobSpec
from .context import RenderContext
from .training_args import training_arguments

TRAINER_CONFIG_KIND = "TrainerConfig"


def trainer_config(spec: FineTuneJobSpec, ctx: RenderContext) -> dict[str, Any]:
    """The trainer re-validates `spec` with the same models, so operator and trainer share one schema."""
    return {
        "apiVersion": API_VERSION,
        "kind": TRAINER_CONFIG_KIND,
        "job": {"name": ctx.name, "namespace": ctx.namespace},
        "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True),
        "trainingArguments": training_arguments(spec, ctx),
        "outputDir": ctx.output_dir,
        "resumeFrom": ctx.resume_from,
    }
