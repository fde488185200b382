"""spec.resources and spec.pod: what each node (pod) requests and how it is scheduled and configured."""

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StringConstraints, field_validator, model_validator

from .base import ApiModel
from .constants import (
    DEFAULT_GPU_RESOURCE,
    DEFAULT_TERMINATION_GRACE_SECONDS,
    HF_CACHE_ENV_NAMES,
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    SECRET_ENV_NAMES,
)
from .errors import SpecRuleErrors
from .k8s_names import (
    DNS_SUBDOMAIN_PATTERN,
    Annotations,
    DnsSubdomain,
    Labels,
    LabelValue,
    QualifiedName,
    qualified_name,
)
from .volumes import Volume, volume_list_errors

# The apiserver's own quantity grammar (k8s.io/apimachinery/pkg/api/resource), so bad values fail here first.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


def positive_quantity(value: str) -> str:
    """A size or CPU count above zero: the pattern alone takes -5Gi (the apiserver refuses the pod) and 0 (a limit
    of nothing, which the kubelet enforces). Runs after the pattern (PositiveQuantity): `value` is a quantity."""
    mantissa = re.match(r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", value)
    if value.startswith("-") or mantissa is None or float(mantissa.group(0)) == 0:
        raise ValueError(f"{value} is not above zero; give a positive quantity such as 500m, 16 or 200Gi, or leave "
                         "the field out")
    return value


# The pattern inside the type, not on the Field: on an optional field pydantic enforces a Field pattern but leaves it
# out of the JSON schema, and the CRD would take any string.
PositiveQuantity = Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN), AfterValidator(positive_quantity)]
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# An extended resource: the apiserver refuses any other container resource name that is not cpu/memory/storage.
EXTENDED_RESOURCE_PATTERN = (r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
                             r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def extended_resource_name(name: str) -> str:
    """core/v1's rule for a container resource that is not cpu, memory or storage (IsExtendedResourceName)."""
    domain, slash, _ = name.partition("/")
    if not slash or not re.match(EXTENDED_RESOURCE_PATTERN, name):
        raise ValueError("must be an extended resource name: <vendor-domain>/<name>, "
                         "e.g. nvidia.com/gpu or amd.com/gpu")
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        raise ValueError("kubernetes.io/ names are Kubernetes' own resources; use the device plugin's name, e.g. "
                         "nvidia.com/gpu")
    qualified_name(f"requests.{name}")  # the apiserver also checks the quota name requests.<name>
    return name


def reject_reserved_env_name(name: str) -> str:
    """Raises when `name` belongs to torchrun's rendezvous contract or to our trainer."""
    if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
        instead = ("set spec.data.cacheDir to a writable volume of pod.volumes to keep Hub downloads there"
                   if name in HF_CACHE_ENV_NAMES else
                   "use the spec field instead (e.g. distributed.rendezvousPort)")
        raise ValueError(f"{name} is set by the operator for torchrun/the trainer and may not be overridden; {instead}")
    return name


class ResourcesSpec(ApiModel):
    gpu_resource_name: Annotated[str, AfterValidator(extended_resource_name)] = Field(
        default=DEFAULT_GPU_RESOURCE,
        max_length=253,
        json_schema_extra={"pattern": EXTENDED_RESOURCE_PATTERN},
        description="Extended resource that counts GPUs (nvidia.com/gpu, amd.com/gpu, ...).",
    )
    cpu: PositiveQuantity | None = Field(default=None, description="CPU per pod, e.g. 16 or 500m.")
    memory: PositiveQuantity | None = Field(default=None, description="Memory per pod, e.g. 128Gi.")
    ephemeral_storage: PositiveQuantity | None = Field(
        default=None,
        description="Local disk per pod (its ephemeral-storage request and limit), e.g. 200Gi: every volume of the "
        "pod on the node's disk, /cache (models from object storage staged there, tokenized data unless "
        "data.cacheDir names a volume), /tmp, and the output directory when output.claimName is unset (checkpoints, "
        "their upload snapshots, final/). The scheduler places the pod on a node with that much free; the kubelet "
        "evicts a pod that writes more (EphemeralStorageExceeded, counted against runPolicy.backoffLimit). Unset: "
        "no bound, as for any pod.",
    )
    peak_tflops_per_gpu: float | None = Field(
        default=None, gt=0, le=1e6,
        description="Dense peak TFLOP/s of one GPU at the training precision, for status.progress.mfu; only needed "
        "for a GPU the trainer's datasheet table does not list (H100, H200, A100, L40S, ... are known).",
    )
    gpu_memory_gib: float | None = Field(
        default=None, gt=0, le=4096, alias="gpuMemoryGiB",
        description="Memory of one GPU in GiB, for the memory fit check (preflight); unset: read from the "
        "nvidia.com/gpu.product node selector when it names a known GPU, else the check only reports its estimate.",
    )
    shm_size: PositiveQuantity = Field(
        default="8Gi",
        description="Size of /dev/shm (a memory-backed emptyDir); dataloader workers and NCCL need more than 64Mi.",
    )


class EnvVar(ApiModel):
    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN, description="Variable name.")
    value: str = Field(default="", max_length=32768, description="Literal value (never a secret: use secretEnv).")

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name.upper() in SECRET_ENV_NAMES:  # aws_secret_access_key is the same credential to a reader
            raise ValueError(f"{name} holds a credential; a plain value would be readable in the job and every pod "
                             f"spec: give it in pod.secretEnv (a Secret's key) instead")
        return reject_reserved_env_name(name)


class SecretEnvVar(ApiModel):
    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN,
                      description="Variable name, e.g. HF_TOKEN.")
    secret_name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
                             description="Secret in the job's namespace.")
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$", description="Key in the Secret.")
    optional: bool = Field(default=False, description="Start even if the Secret or key is missing.")

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        return reject_reserved_env_name(name)


class Toleration(ApiModel):
    key: QualifiedName | None = Field(default=None, max_length=316,
                                      description="Taint key; empty with Exists matches all.")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal.")
    value: LabelValue | None = Field(default=None, max_length=63, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; empty matches all."
    )
    toleration_seconds: int | None = Field(default=None, ge=0, description="NoExecute: how long to stay bound.")

    @model_validator(mode="after")
    def _as_kubernetes_requires(self) -> "Toleration":
        # core/v1 validation of a toleration, so the Job is not refused after the FineTuneJob was accepted.
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key matches every taint and needs operator: Exists")
        if self.operator == "Exists" and self.value:
            raise ValueError("operator: Exists matches any value; remove value (or use operator: Equal)")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds applies to effect: NoExecute only; set that effect or remove it")
        return self


class PodSpec(ApiModel):
    image: str | None = Field(
        default=None, min_length=1, max_length=1024, pattern=r"^\S+$",
        description="Trainer image; defaults to the operator's configured trainer image.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Image pull policy."
    )
    image_pull_secrets: list[DnsSubdomain] = Field(default_factory=list, max_length=16,
                                                   description="Pull Secret names.")
    service_account_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="ServiceAccount the trainer pods run as (e.g. for workload identity to object storage).",
    )
    node_selector: Labels = Field(default_factory=dict, description="Node labels the pods require.")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64, description="Taints tolerated.")
    affinity: dict[str, Any] | None = Field(
        default=None, description="A core/v1 Affinity, passed through as written (validated by the apiserver)."
    )
    priority_class_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="PriorityClass of the pods."
    )
    scheduler_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="Scheduler, e.g. a gang scheduler such as volcano.",
    )
    env: list[EnvVar] = Field(default_factory=list, max_length=256, description="Extra environment variables.")
    secret_env: list[SecretEnvVar] = Field(
        default_factory=list, max_length=64,
        description="Variables from Secrets (secretKeyRef), e.g. HF_TOKEN; their values never enter the spec.",
    )
    labels: Labels = Field(default_factory=dict, description="Extra labels on the trainer pods.")
    annotations: Annotations = Field(default_factory=dict, description="Extra annotations on the trainer pods.")
    volumes: list[Volume] = Field(
        default_factory=list, max_length=32,
        description="Your volumes in the trainer pods, e.g. a claim with models and datasets mounted at /models.",
    )
    termination_grace_period_seconds: int = Field(
        default=DEFAULT_TERMINATION_GRACE_SECONDS, ge=0, le=86400,
        description="Seconds between SIGTERM (suspend, delete, preemption) and SIGKILL: the trainer saves a "
        "checkpoint in that window, so give it the time a checkpoint of your model takes.",
    )

    @model_validator(mode="after")
    def _volumes_apart(self) -> "PodSpec":
        errors = volume_list_errors(self.volumes)
        if errors:
            raise SpecRuleErrors(errors)
        return self
