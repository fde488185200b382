"""spec.evaluation: what evaluation does beyond the validation loss (which training.evalStrategy schedules)."""

from typing import Annotated

from pydantic import Field

from .base import ApiModel


class EarlyStopping(ApiModel):
    patience: int = Field(ge=1, le=1000, description="Evaluations in a row without an improvement of the "
                          "validation loss before training stops (transformers' EarlyStoppingCallback).")
    threshold: float = Field(default=0.0, ge=0, description="The least decrease of the validation loss that "
                             "counts as an improvement.")


class Generation(ApiModel):
    """How samples are generated (the seeds' generation parameters); unset fields keep the model's
    generation_config."""

    max_new_tokens: int = Field(default=64, ge=1, le=4096, description="Tokens generated per prompt at most.")
    do_sample: bool | None = Field(default=None, description="Sample instead of greedy/beam decoding.")
    temperature: float | None = Field(default=None, gt=0, le=100, description="Sampling temperature.")
    top_p: float | None = Field(default=None, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int | None = Field(default=None, ge=0, le=100000, description="Sample from the k likeliest tokens.")
    repetition_penalty: float | None = Field(default=None, gt=0, le=100, description="Penalty on repeated tokens.")
    num_beams: int | None = Field(default=None, ge=1, le=32, description="Beam search width.")


class EvaluationSpec(ApiModel):
    prompts: list[Annotated[str, Field(min_length=1, max_length=16384)]] = Field(
        default_factory=list, max_length=32,
        description="Prompts the model completes at every evaluation and at the end of training, rendered as the "
        "training data is (the chat template's user turn for conversation formats): written to samples.jsonl in the "
        "output directory, to TensorBoard (text) and to the final summary. Under ZeRO-3 and FSDP every rank takes "
        "part (synced_gpus).")
    generation: Generation = Field(default_factory=Generation, description="Generation parameters of the samples.")
    early_stopping: EarlyStopping | None = Field(
        default=None, description="Stop when the validation loss stops improving, and keep the best checkpoint "
        "as the final model (load_best_model_at_end on eval_loss). Needs evaluation (training.evalStrategy) and a "
        "checkpoint at every evaluation (checkpoints.saveStrategy like evalStrategy; saveSteps a multiple of "
        "evalSteps).")
