"""spec.evaluation: what evaluation does beyond the validation loss (which training.evalStrategy schedules)."""

from pydantic import Field

from .base import ApiModel


class EarlyStopping(ApiModel):
    patience: int = Field(ge=1, le=1000, description="Evaluations in a row without an improvement of the "
                          "validation loss before training stops (transformers' EarlyStoppingCallback).")
    threshold: float = Field(default=0.0, ge=0, description="The least decrease of the validation loss that "
                             "counts as an improvement.")


class EvaluationSpec(ApiModel):
    early_stopping: EarlyStopping | None = Field(
        default=None, description="Stop when the validation loss stops improving, and keep the best checkpoint "
        "as the final model (load_best_model_at_end on eval_loss). Needs evaluation (training.evalStrategy) and a "
        "checkpoint at every evaluation (checkpoints.saveStrategy like evalStrategy; saveSteps a multiple of "
        "evalSteps).")
