"""spec.output and spec.checkpoints: where results go, when checkpoints are written and how runs resume."""

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from .base import ApiModel, FalseIsNo
from .constants import OUTPUT_MOUNT_PATH
from .k8s_names import DNS_SUBDOMAIN_PATTERN
from .sources import RESUME_PATTERN, clean_resume
from .storage import S3_URI_PATTERN


class SecretKey(ApiModel):
    name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Secret in the job's namespace.")
    key: str = Field(default="token", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$",
                     description="Key in the Secret.")


class HubPush(ApiModel):
    """Where the result goes on the Hugging Face Hub (or a Hub-compatible server)."""

    repo: str = Field(
        max_length=200, pattern=r"^[A-Za-z0-9][-._A-Za-z0-9]*/[A-Za-z0-9][-._A-Za-z0-9]*$",
        description="The model repository, namespace/name; created when missing.")
    private: bool = Field(default=True, description="Create the repository private (an existing one keeps its "
                          "visibility).")
    strategy: Literal["end", "checkpoint"] = Field(
        default="end", description="end: push the final model (adapter for LoRA), tokenizer, chat template and a "
        "model card once training succeeded; checkpoint: also push every checkpoint as it is saved to "
        "last-checkpoint/ in the repository (in the background; a failed checkpoint push only warns).")
    revision: str = Field(default="main", min_length=1, max_length=255, pattern=r"^[^\s~^:?*\[\\]+$",
                          description="Branch pushed to; created from main when missing.")
    token_secret: SecretKey | None = Field(
        default=None, description="The Secret holding a write token (key `token` by default), given to the "
        "trainer as HF_TOKEN; without it HF_TOKEN must be in pod.secretEnv.")
    endpoint: str | None = Field(
        default=None, max_length=2048, pattern=r"^https?://[^\s@]+$",
        description="A Hub-compatible server (e.g. a private Hub); defaults to https://huggingface.co.")


class OutputSpec(ApiModel):
    claim_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="PersistentVolumeClaim for checkpoints and the final model. Without it (and without uri) the "
        "output lives in an emptyDir and is lost with the pod, so gang restarts cannot resume. Multi-node jobs "
        "need ReadWriteMany.",
    )
    uri: str | None = Field(
        default=None, max_length=1024, pattern=S3_URI_PATTERN,
        description="Object storage for the results, e.g. s3://bucket/runs/my-job (spec.s3 says where and with "
        "which credentials): every checkpoint is written locally, uploaded in the background by every node and "
        "marked complete (FINETUNE_COMPLETE, last) once all nodes' files are there; checkpoints.keep applies in "
        "the bucket; a new attempt (or `finetune run` in an empty directory) resumes from the newest complete one. "
        "progress.jsonl, loss.png, the run summary and final/ (merged/) land there too, and the job succeeds only "
        "once final/ is uploaded. No shared volume is needed; with claimName too, the claim holds the local copy "
        "(node 0 uploads for the nodes that share it). One run writes a prefix at a time: a lease in the bucket "
        "(.finetune-owner.json) refuses a second writer.",
        examples=["s3://training/runs/llama-lora"],
    )
    sub_path: str | None = Field(
        default=None, max_length=1024, pattern=r"^[^/].*$",
        description="Directory inside the claim (relative, no '..'); defaults to the job name.",
    )
    merge_adapter: bool = Field(
        default=False, description="lora/qlora: also save the base model with the adapter merged in (merged/; "
        "pushed to the repository's merged/ folder)."
    )
    push: HubPush | None = Field(
        default=None, description="Push the result to the Hugging Face Hub. The model is saved to the output "
        "directory first: a failed push never loses it (a refused token fails the job at once, a network error "
        "fails the attempt and the next one resumes at the last step and only pushes).")

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
    save_strategy: FalseIsNo[Literal["steps", "epoch", "no"]] = Field(
        default="steps", description="When checkpoints are written; no disables resuming."
    )
    save_steps: int = Field(default=500, ge=1, description="Optimizer steps between checkpoints (saveStrategy steps).")
    keep: int = Field(default=3, ge=1, le=1000, description="Complete checkpoints kept (save_total_limit).")
    overlap: bool = Field(
        default=True,
        description="Write checkpoints in the background: training stands still only while what a checkpoint holds "
        "is copied to host memory, and goes on while it is written, verified and marked complete (only a complete "
        "one is ever resumed from). Applies to strategy ddp without output.uri (whose uploads are in the "
        "background already), checkpoint pushes or early stopping; false: training waits for every save.",
    )
    resume: Annotated[str, AfterValidator(clean_resume)] = Field(
        default="auto",
        min_length=1,
        max_length=4096,
        json_schema_extra={"pattern": RESUME_PATTERN},
        description="auto: continue from the newest complete checkpoint in the output directory; never: start "
        f"fresh; or an absolute path to a checkpoint directory (outside {OUTPUT_MOUNT_PATH}/, a runtime's "
        "allowedModelSources apply to it: a checkpoint holds weights).",
    )
