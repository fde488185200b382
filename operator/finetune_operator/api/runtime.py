"""FineTuneRuntime and ClusterFineTuneRuntime: what a platform admin sets once, so users write model, data, method.

A runtime holds defaults for the sections of a FineTuneJob's spec an admin owns (`template`) and limits every job
using it must keep (`limits`). A job names one with spec.runtimeRef; a job with none uses its namespace's default
FineTuneRuntime, else the cluster's default ClusterFineTuneRuntime, else none (a job with everything in its spec
works as it always did).

Merge (effective_spec): runtime template < job spec, field by field: maps merged key by key, lists and scalars
replaced whole by the job's. A field the runtime locks may not be set by the job at all (refused, never silently
overwritten). The same rules run in the operator, in `finetune validate/render/run --runtime FILE`, and (the
limits) in the API server's admission (render/runtime_policy.py), so a refusal reads the same everywhere. The checks
themselves: runtime_limits.py; which runtimes a job uses, and the snapshot of them it keeps: runtime_layers.py.
"""

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from . import constants as c
from .base import ApiModel
from .distributed import DistributedSpec
from .output import CheckpointSpec, OutputSpec
from .resources import PodSpec, ResourcesSpec
from .run_policy import RunPolicy
from .runtime_ref import RuntimeKind, RuntimeRef  # noqa: F401 - RuntimeRef: part of this module's API
from .selectors import LabelSelector
from .storage import S3Spec
from .tracking import TrackingSpec

# Spec sections a runtime may give defaults for (camelCase, as in the manifest).
TEMPLATE_SECTIONS = ("pod", "resources", "distributed", "s3", "output", "checkpoints", "runPolicy", "tracking")
# Fields an admin may lock: path in the job's spec (or "queueName", the Kueue queue label) -> what it is.
LOCKABLE = {
    "pod.image": "the trainer image",
    "pod.serviceAccountName": "the ServiceAccount the pods run as",
    "pod.nodeSelector": "node selection",
    "pod.tolerations": "tolerations",
    "pod.affinity": "affinity",
    "pod.priorityClassName": "the priority class",
    "pod.schedulerName": "the scheduler",
    "pod.volumes": "volumes",
    "pod.env": "environment variables",
    "pod.secretEnv": "environment variables from Secrets",
    "resources": "resource requests",
    "resources.gpuResourceName": "the GPU resource (a MIG slice, or whole GPUs)",
    "distributed.strategy": "the parallelism strategy",
    "distributed.gpusPerNode": "GPUs per node",
    "s3": "the object storage endpoint and credentials",
    "s3.endpointURL": "the object storage endpoint",
    "output.uri": "where results are uploaded",
    "output.push.repo": "the Hub repository pushed to",
    "output.push.endpoint": "the Hub server pushed to",
    "tracking.wandb.baseUrl": "the W&B server",
    "tracking.mlflow.trackingUri": "the MLflow tracking server",
    "tracking.wandb.entity": "the W&B team or user runs are written to",
    "tracking.project": "the tracker project (W&B or Comet project, MLflow experiment)",
    "queueName": "the Kueue queue",
}
OutputPrefix = Annotated[str, StringConstraints(min_length=2, max_length=1024, pattern=r"^.*/$")]
LockableField = Literal[
    "pod.image", "pod.serviceAccountName", "pod.nodeSelector", "pod.tolerations", "pod.affinity",
    "pod.priorityClassName", "pod.schedulerName", "pod.volumes", "pod.env", "pod.secretEnv", "resources",
    "resources.gpuResourceName", "distributed.strategy", "distributed.gpusPerNode", "s3", "s3.endpointURL",
    "output.uri", "output.push.repo", "output.push.endpoint", "tracking.wandb.baseUrl", "tracking.mlflow.trackingUri",
    "tracking.wandb.entity", "tracking.project", "queueName"]
# A lock on a field also locks the FineTuneJob label that says the same to Kueue (copied to the attempt's Job).
LOCKED_LABELS = {"pod.priorityClassName": c.LABEL_KUEUE_PRIORITY, "queueName": c.LABEL_KUEUE_QUEUE}
# Where a job sends the credentials it has: a runtime that lends a credential locks all of these (runtime_limits.py).
ENDPOINT_FIELDS = ("pod.env", "s3.endpointURL", "output.push.endpoint", "tracking.wandb.baseUrl",
                   "tracking.mlflow.trackingUri")
# What a tracker's key writes into on its server (another team's W&B team or project, MLflow experiment): locked
# while the runtime lends what a tracker authenticates with (TRACKER_LENDING), not for S3 or Hub credentials alone.
TRACKER_FIELDS = ("tracking.wandb.entity", "tracking.project")
TRACKER_LENDING = ("pod.secretEnv", "pod.volumes", "pod.serviceAccountName")
# What a job's own pod.secretEnv may name while the runtime still lends it something (its S3 credentials, the Hub
# token, its ServiceAccount): credentials only. Any other variable is an environment variable like pod.env, which
# that lending locks: HF_ENDPOINT or AWS_ENDPOINT_URL from a Secret of the tenant's would send the lent token to her.
OWN_SECRET_ENV_NAMES = tuple(sorted(c.SECRET_ENV_NAMES | {"AWS_ACCESS_KEY_ID", "MLFLOW_TRACKING_USERNAME",
                                                          "CLEARML_API_ACCESS_KEY", "DATABRICKS_TOKEN"}))
MethodName = Literal["full", "lora", "qlora", "freeze"]
StrategyName = Literal["ddp", "fsdp", "deepspeed"]
VolumeKind = Literal["persistentVolumeClaim", "configMap", "secret", "nfs"]


class RuntimeTemplate(ApiModel):
    """Defaults for the job's spec; each section as in a FineTuneJob, every field optional."""

    pod: PodSpec | None = Field(default=None, description="Image, scheduling, identity and environment of pods.")
    resources: ResourcesSpec | None = Field(default=None, description="Per-pod resource requests.")
    distributed: DistributedSpec | None = Field(default=None, description="GPUs per node, strategy and its "
                                                "configuration (ZeRO stage, offload, FSDP), rendezvous.")
    s3: S3Spec | None = Field(default=None, description="Object storage endpoint, region, credentials Secret.")
    output: OutputSpec | None = Field(default=None, description="Where checkpoints and the model go.")
    checkpoints: CheckpointSpec | None = Field(default=None, description="Checkpointing and resume.")
    run_policy: RunPolicy | None = Field(default=None, description="Restarts, deadlines, TTL, stalls, divergence.")
    tracking: TrackingSpec | None = Field(default=None, description="Experiment trackers.")
    queue_name: str | None = Field(default=None, min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9.]*"
                                   r"[a-z0-9])?$", description="Kueue LocalQueue: the job gets the label "
                                   "kueue.x-k8s.io/queue-name=<this> unless it has one.")


class RuntimeLimits(ApiModel):
    locked: list[LockableField] = Field(default_factory=list, max_length=len(LOCKABLE), description="Fields a job "
                                        "may not set (the runtime's value, or none, is used): "
                                        + ", ".join(LOCKABLE) + ".")
    max_nodes: int | None = Field(default=None, ge=1, le=4096, description="Most nodes a job may ask for.")
    max_gpus_per_job: int | None = Field(default=None, ge=0, le=65536, description="Most GPUs a job may ask for "
                                         "(nodes x gpusPerNode).")
    allowed_methods: list[MethodName] | None = Field(default=None, min_length=1, max_length=4,
                                                     description="Methods jobs may use (full, lora, qlora, freeze).")
    allowed_strategies: list[StrategyName] | None = Field(default=None, min_length=1, max_length=3,
                                                          description="Strategies jobs may use.")
    allowed_model_sources: list[str] | None = Field(
        default=None, min_length=1, max_length=64, description="Prefixes every model source must start with: hub "
        "organisations (`meta-llama/`), buckets (`s3://models/`), volume paths (`/models/`). The sources are "
        "spec.model.name, spec.model.tokenizer, spec.method.lora.initFrom, each spec.method.grpo.rewards[].model "
        "and spec.checkpoints.resume when it is a "
        f"path outside the job's own {c.OUTPUT_MOUNT_PATH}/ (each can bring weights or code); compared after '..' "
        "and '//' are resolved (the schema refuses them anyway). End a directory with '/'. Add "
        f"`{c.OUTPUT_MOUNT_PATH}/` to let jobs load what earlier jobs wrote to their output.")
    # Each ends with '/': s3://team-a-runs would also allow s3://team-a-runs-prod/, team-a the team-abc namespace.
    allowed_outputs: list[OutputPrefix] | None = Field(
        default=None, min_length=1, max_length=64, description="Prefixes spec.output.uri (a bucket prefix, "
        "`s3://team-a-runs/`) and spec.output.push.repo (a Hub namespace, `team-a/`) must start with: where jobs "
        "write and push, with the credentials the runtime lends them (without it a job may overwrite any prefix or "
        "repository those credentials can write, and resume from it). Compared after '..' and '//' are resolved. "
        "End each with '/'.")
    allow_trust_remote_code: bool = Field(
        default=False, description="Whether jobs may bring Python code that the trainer runs with everything the "
        "runtime lends the job (Secrets, its ServiceAccount): spec.model.trustRemoteCode (code that comes with the "
        "model or tokenizer) and GRPO reward functions from a ConfigMap (spec.method.grpo.rewards[].configMap). Off "
        "unless set: under a runtime, such code needs the admin's yes; a job with no runtime decides for itself, as "
        "before.")
    allowed_data_sources: list[str] | None = Field(
        default=None, min_length=1, max_length=64, description="Prefixes every data path and hub dataset "
        "(spec.data.train/validation) must start with (`s3://team-data/`, `/data/`, `tatsu-lab/`); inline rows "
        "are always allowed.")
    allowed_claims: list[str] | None = Field(
        default=None, min_length=1, max_length=64, description="PersistentVolumeClaims jobs may mount "
        "(spec.output.claimName and spec.pod.volumes[].claimName): the team's datasets and checkpoint volumes, not "
        "another team's claim that happens to be in the namespace. Storage is then these claims only: an nfs volume "
        "is refused unless allowedVolumeKinds lists nfs.")
    allowed_volume_kinds: list[VolumeKind] | None = Field(
        default=None, min_length=1, max_length=4, description="Kinds of spec.pod.volumes jobs may mount: "
        "persistentVolumeClaim, configMap, secret, nfs (the output claim is always allowed). Unset: every kind, "
        "but nfs where allowedClaims is set.")
    max_active_deadline_seconds: int | None = Field(
        default=None, ge=1, description="Jobs must set runPolicy.activeDeadlineSeconds (or take the runtime's) "
        "at most this long.")


class FineTuneRuntimeSpec(ApiModel):
    default: bool = Field(default=False, description="Used by jobs without spec.runtimeRef: a namespace's default "
                          "FineTuneRuntime first, else the default ClusterFineTuneRuntime. Mark one per scope.")
    template: RuntimeTemplate = Field(default_factory=RuntimeTemplate, description="Defaults for the sections of "
                                      "a job's spec an admin owns; the job's own values win field by field (maps "
                                      "merged, lists replaced), except locked fields.")
    limits: RuntimeLimits = Field(default_factory=RuntimeLimits, description="What every job using this runtime "
                                  "must keep, checked at `kubectl apply` by the API server and again by the "
                                  "operator before anything runs.")


class ClusterFineTuneRuntimeSpec(FineTuneRuntimeSpec):
    namespace_selector: LabelSelector | None = Field(
        default=None, description="The namespaces whose jobs may use this runtime (by spec.runtimeRef, or as their "
        "default), by their labels, as Kueue's ClusterQueue: e.g. matchLabels: {team: research}. Unset: every "
        "namespace. Checked at `kubectl apply` and again by the operator when a job starts; a job that started "
        "keeps running when the namespace's labels change later.")


def template_of(obj: dict[str, Any]) -> dict[str, Any]:
    """The runtime's template as written (only what the admin set: merging must not see pydantic's defaults)."""
    return dict(((obj.get("spec") or {}).get("template")) or {})


def merge(defaults: Any, ours: Any) -> Any:
    """Maps merged key by key (ours wins), anything else (lists, scalars) ours whole."""
    if isinstance(defaults, dict) and isinstance(ours, dict):
        out = dict(defaults)
        for key, value in ours.items():
            out[key] = merge(defaults.get(key), value) if key in defaults else value
        return out
    return ours


def at_path(tree: dict[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def runtime_label(kind: str, name: str) -> str:
    return f"{kind} {name}"
