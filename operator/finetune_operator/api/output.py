"""spec.output and spec.checkpoints: where results go, when checkpoints are written and how runs resume."""

from typing import Literal

from pydantic import Field, field_validator

from .base import ApiModel
from .constants import OUTPUT_MOUNT_PATH
from .k8s_names import DNS_SUBDOMAIN_PATTERN


class OutputSpec(ApiModel):
    claim_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="PersistentVolumeClaim for checkpoints and the final model. Without it the output lives in an "
        "emptyDir and is lost with the pod, so gang restarts cannot resume. Multi-node jobs need ReadWriteMany.",
    )
    sub_path: str | None = Field(
        default=None, max_length=1024, pattern=r"^[^/].*$",
        description="Directory inside the claim (relative, no '..'); defaults to the job name.",
    )
    merge_adapter: bool = Field(
        default=False, description="lora/qlora: also save the base model with the adapter merged in."
    )

    @field_validator("sub_path")
    @classmethod
    def _no_parent_refs(cls, sub_path: str | None) -> str | None:
        if sub_path is not None and ".." in sub_path.split("/"):
            raise ValueError("subPath may not contain '..'; give a path inside the claim")
        return sub_path

    @property
    def mount_path(self) -> str:
        return OUTPUT_MOUNT_PATH


class CheckpointSpec(ApiModel):
    save_strategy: Literal["steps", "epoch", "no"] = Field(
        default="steps", description="When checkpoints are written; no disables resuming."
    )
    save_steps: int = Field(default=500, ge=1, description="Optimizer steps between checkpoints (saveStrategy steps).")
    keep: int = Field(default=3, ge=1, le=1000, description="Complete checkpoints kept (save_total_limit).")
    resume: str = Field(
        default="auto",
        min_length=1,
        max_length=4096,
        pattern=r"^(auto|never|/.*)$",
        description="auto: continue from the newest complete checkpoint in the output directory; never: start "
        "fresh; or an absolute path to a checkpoint directory.",
    )
