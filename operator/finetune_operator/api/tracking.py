"""spec.tracking: experiment trackers besides TensorBoard (always written), and where their runs go."""

from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from .base import ApiModel
from .transformers_names import REPORTING_INTEGRATIONS

# report_to values transformers takes that say "which" rather than name a tracker.
_NOT_TRACKERS = {"all": "lists every tracker installed in the image, which changes with the image",
                 "none": "would also turn TensorBoard off, which status and loss.png read"}


def _no_credentials(uri: str | None) -> str | None:
    if uri is not None and (urlsplit(uri).username or urlsplit(uri).password):
        raise ValueError("the URI holds credentials, which would sit in the spec and every pod; remove them and give "
                         "them in pod.secretEnv (MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN, "
                         "WANDB_API_KEY)")
    return uri


class MlflowSettings(ApiModel):
    tracking_uri: str = Field(
        min_length=1, max_length=2048, pattern=r"^(https?|file|databricks)(://\S+|$)",
        description="MLFLOW_TRACKING_URI: the tracking server (http(s)://...), databricks, or a file store "
        "(file:///path, e.g. on the output claim).")

    _plain = field_validator("tracking_uri")(_no_credentials)


class WandbSettings(ApiModel):
    entity: str | None = Field(default=None, min_length=1, max_length=128,
                               description="WANDB_ENTITY: the team or user the run belongs to. Locked, like "
                               "tracking.project, while a runtime lends the job what a tracker logs in with.")
    base_url: str | None = Field(default=None, max_length=2048, pattern=r"^https?://\S+$",
                                 description="WANDB_BASE_URL: a self-hosted W&B server; default wandb's cloud.")
    offline: bool = Field(
        default=False, description="Write the run under the output directory (wandb/) instead of sending it; "
        "`wandb sync` uploads it later. Needs no API key.")

    _plain = field_validator("base_url")(_no_credentials)


class TrackingSpec(ApiModel):
    report_to: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=16,
        description="Trackers that receive the run's metrics besides TensorBoard (always written): any integration "
        "name transformers accepts, e.g. wandb, mlflow, comet_ml. Only rank 0 reports. Credentials come from "
        "pod.secretEnv (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, ...), never from the spec; other settings from pod.env "
        "(e.g. WANDB_ENTITY). Every attempt of a job that resumes a checkpoint continues the same tracker run.")
    project: str | None = Field(
        default=None, min_length=1, max_length=128,
        description="The wandb project / MLflow experiment / Comet project; defaults to the job's namespace. A job "
        "whose runtime lends it what a tracker logs in with (Secret variables or volumes, a ServiceAccount) may not "
        "set it (the runtime's, else the namespace, is used): with the runtime's key it could write into another "
        "team's project.")
    run_name: str | None = Field(default=None, min_length=1, max_length=128,
                                 description="The run's display name; defaults to the job's name.")
    mlflow: MlflowSettings | None = Field(default=None, description="Where mlflow logs (needed with mlflow).")
    wandb: WandbSettings | None = Field(default=None, description="wandb's team, server and mode.")

    @field_validator("report_to")
    @classmethod
    def _known_trackers(cls, names: list[str]) -> list[str]:
        problems = []
        for name in names:
            if name in _NOT_TRACKERS:
                problems.append(f"{name!r} {_NOT_TRACKERS[name]}; name the trackers, e.g. [wandb]")
            elif name not in REPORTING_INTEGRATIONS:
                known = ", ".join(sorted(REPORTING_INTEGRATIONS - {"tensorboard"}))
                problems.append(f"{name!r} is not a tracker transformers knows; use one of {known}")
        if len(set(names)) != len(names):
            problems.append("a tracker is listed twice; list each once")
        if problems:
            raise ValueError("; ".join(problems))
        return names

    @property
    def trackers(self) -> list[str]:
        """The report_to of TrainingArguments: TensorBoard first (status and loss.png read it), then the user's."""
        return ["tensorboard", *(name for name in self.report_to if name != "tensorboard")]
