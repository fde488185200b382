"""The Helm chart's values, as a model: values.schema.json is generated from it (like the CRD from the API)."""

from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from .constants import DEFAULT_METRICS_PORT, DEFAULT_TRAINER_IMAGE
from .crd import structural_schema


class _Values(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Image(_Values):
    repository: str = Field(default="ghcr.io/finetunejob/operator", min_length=1, description="Operator image.")
    tag: str = Field(default="", description="Image tag; empty means the chart's appVersion.")
    digest: str = Field(default="", pattern=r"^(sha256:[a-f0-9]{64})?$",
                        description="Image digest (sha256:...); set, it pins the image and the tag is ignored.")
    pullPolicy: Literal["Always", "IfNotPresent", "Never"] = Field(default="IfNotPresent", description="Pull policy.")


class Resources(_Values):
    requests: dict[str, str] = Field(default_factory=lambda: {"cpu": "100m", "memory": "256Mi"},
                                     description="Operator container requests.")
    limits: dict[str, str] = Field(default_factory=lambda: {"memory": "512Mi"}, description="Operator limits.")


class ServiceMonitor(_Values):
    enabled: bool = Field(default=False, description="Create a Prometheus Operator ServiceMonitor for /metrics.")
    interval: str = Field(default="30s", pattern=r"^[0-9]+(ms|s|m|h)$", description="Scrape interval.")
    labels: dict[str, str] = Field(default_factory=dict,
                                   description="Extra labels, e.g. the release label your Prometheus selects.")


class Metrics(_Values):
    enabled: bool = Field(default=True, description="Serve Prometheus /metrics and create its Service.")
    port: int = Field(default=DEFAULT_METRICS_PORT, ge=1, le=65535, description="Port of /metrics.")
    serviceMonitor: ServiceMonitor = Field(default_factory=ServiceMonitor, description="ServiceMonitor toggle.")


class GrafanaDashboard(_Values):
    enabled: bool = Field(default=False, description="A ConfigMap holding a Grafana dashboard of the operator "
                          "metrics, labelled for Grafana's dashboard sidecar.")
    labels: dict[str, str] = Field(default_factory=lambda: {"grafana_dashboard": "1"},
                                   description="Labels the sidecar selects dashboards by.")


class ServiceAccount(_Values):
    annotations: dict[str, str] = Field(default_factory=dict,
                                        description="Annotations of the operator's ServiceAccount (e.g. IRSA).")


class EnvVar(_Values):
    name: str = Field(min_length=1, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", description="Variable name.")
    value: str = Field(default="", description="Value.")


class NetworkPolicy(_Values):
    enabled: bool = Field(default=True, description="The operator pod takes ingress only on its metrics port, and "
                          "each gang's pods only from the pods of their own FineTuneJob (the operator creates one "
                          "NetworkPolicy per job: the rendezvous port is not open to other namespaces). Egress is "
                          "left to your own policies. Enforced only where the cluster's network plugin does so.")


class UserRoles(_Values):
    aggregate: bool = Field(default=True, description="ClusterRoles that Kubernetes' built-in admin, edit and view "
                            "roles aggregate: a user bound to admin or edit in a namespace may create, change and "
                            "delete FineTuneJobs there and read their status; view may read them. The status is "
                            "never writable through these roles (only the operator and a job's own trainer write "
                            "it).")


class CatalogueEntry(_Values):
    enabled: bool = Field(default=False, description="Install this ClusterFineTuneRuntime.")
    default: bool = Field(default=False, description="Mark it the cluster default (jobs without spec.runtimeRef "
                          "use it); at most one entry should be.")
    image: str = Field(default="", description="Trainer image; empty: the chart's trainerImage.")
    queueName: str = Field(default="", description="Kueue LocalQueue its jobs go to; empty: none.")
    nodeSelector: dict[str, str] = Field(default_factory=dict, description="Where its pods run.")
    maxNodes: int = Field(default=1, ge=1, le=4096, description="limits.maxNodes.")


def _entry(**kw: Any) -> Any:
    return lambda: CatalogueEntry(**kw)


class Catalogue(_Values):
    cpuSmall: CatalogueEntry = Field(default_factory=_entry(maxNodes=2), description="cpu-small: CPU only, 2 "
                                     "processes per pod, up to 2 nodes, LoRA or full: tiny models, tests, demos.")
    gpu1x: CatalogueEntry = Field(default_factory=_entry(maxNodes=1), description="gpu-1x: one GPU, DDP, LoRA "
                                  "and QLoRA (7-8B models with LoRA on one 80 GB GPU).")
    gpu8x: CatalogueEntry = Field(
        default_factory=_entry(maxNodes=8, nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
        description="gpu-8x: whole 8-GPU H100/A100 nodes, DeepSpeed ZeRO-3 with bf16, up to 8 nodes; the image "
        "and node selector locked.")


class Runtimes(_Values):
    limitsAtAdmission: bool = Field(default=True, description="ValidatingAdmissionPolicies refuse at `kubectl "
                                    "apply` a FineTuneJob breaking its runtime's limits (the operator checks "
                                    "them again before anything runs, either way).")
    readableByAllUsers: bool = Field(default=True, description="Every authenticated user may read (never change) "
                                     "the ClusterFineTuneRuntimes, to choose one by name.")
    catalogue: Catalogue = Field(default_factory=Catalogue, description="ClusterFineTuneRuntimes the chart can "
                                 "install for you (each off by default).")


class LeaderElection(_Values):
    enabled: bool = Field(default=True, description="Replicas take turns through a coordination.k8s.io Lease in the "
                          "release namespace: one reconciles, the others stand by and take over when it stops "
                          "renewing (10 s lease, renewed every second; a leader writes nothing once its last "
                          "renewal is 6 s old, and steps down; a clean shutdown hands over at once). Needed "
                          "whenever replicas > 1.")


class ChartValues(_Values):
    nameOverride: str = Field(default="", max_length=40, description="Replaces 'operator' in resource names "
                              "(<release>-<nameOverride>).")
    fullnameOverride: str = Field(default="", max_length=52, description="Replaces the whole resource name.")
    replicas: int = Field(default=2, ge=1, le=5, description="Operator replicas: one leads, the others stand by (see "
                          "leaderElection), spread over nodes and kept by a PodDisruptionBudget when more than one.")
    leaderElection: LeaderElection = Field(default_factory=LeaderElection, description="One active replica.")
    stuckPassSeconds: float = Field(default=300, ge=30, le=3600, description="The liveness probe fails when a "
                                    "reconcile pass has run this long (a pass is a few API calls: a hung API "
                                    "connection, not work), so the kubelet restarts that replica.")
    runtimes: Runtimes = Field(default_factory=Runtimes, description="FineTuneRuntimes and "
                               "ClusterFineTuneRuntimes: admins' defaults and limits.")
    image: Image = Field(default_factory=Image, description="The operator image.")
    imagePullSecrets: list[str] = Field(default_factory=list, description="Pull Secret names for the operator.")
    trainerImage: str = Field(default=DEFAULT_TRAINER_IMAGE, min_length=1,
                              description="Default trainer image for FineTuneJobs that do not set spec.pod.image "
                              "(a tag or a digest: registry/trainer@sha256:...).")
    watchNamespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces the operator manages, with a Role in each; empty = all namespaces (ClusterRole).")
    restartBackoffSeconds: float = Field(default=10, ge=0.1, le=3600,
                                         description="First gang-restart backoff; doubles per restart (max 300 s).")
    kueueHoldGraceSeconds: float = Field(default=120, ge=0, le=86400,
                                         description="How long past its backoff a Kueue-queued gang restart keeps its "
                                         "admission while the next attempt's Job cannot be created.")
    workers: int = Field(default=16, ge=1, le=256, description="Reconcile passes run at once.")
    nodeShapeCheck: bool = Field(default=True, description="Let the operator list nodes (a ClusterRole with `list "
                                 "nodes` only) so a job asking for more GPUs per node than any node has gets a "
                                 "Warning at once; off: it waits and reads the scheduler's Unschedulable.")
    userRoles: UserRoles = Field(default_factory=UserRoles,
                                 description="What users get through the built-in admin, edit and view roles.")
    extraEnv: list[EnvVar] = Field(default_factory=list, description="Extra environment of the operator container.")
    networkPolicy: NetworkPolicy = Field(default_factory=lambda: NetworkPolicy(),
                                         description="NetworkPolicies (on by default).")
    metrics: Metrics = Field(default_factory=Metrics, description="Prometheus /metrics endpoint and its Service.")
    grafanaDashboard: GrafanaDashboard = Field(default_factory=GrafanaDashboard,
                                               description="Grafana dashboard of the operator metrics.")
    serviceAccount: ServiceAccount = Field(default_factory=ServiceAccount, description="The operator's identity.")
    resources: Resources = Field(default_factory=Resources, description="Operator container resources.")
    podAnnotations: dict[str, str] = Field(default_factory=dict, description="Operator pod annotations.")
    podLabels: dict[str, str] = Field(default_factory=dict, description="Operator pod labels.")
    nodeSelector: dict[str, str] = Field(default_factory=dict, description="Operator pod node selector.")
    affinity: dict[str, Any] = Field(default_factory=dict, description="Operator pod affinity.")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Operator pod tolerations.")
    priorityClassName: str = Field(default="", description="Operator pod priority class.")


def values_schema() -> dict[str, Any]:
    schema = structural_schema(ChartValues.model_json_schema(mode="validation"))
    schema["$schema"] = "https://json-schema.org/draft-07/schema#"
    return schema


def values_yaml() -> str:
    """values.yaml with each key's description as a comment (generated: edit the model, not the file)."""
    lines = ["# Generated from finetune_operator/api/chart_values.py by ./hack/generate.sh; do not edit by hand.", ""]
    defaults = ChartValues().model_dump(mode="json")
    for name, info in ChartValues.model_fields.items():
        lines.append(f"# {info.description}")
        lines.append(yaml.safe_dump({name: defaults[name]}, sort_keys=False, width=120).rstrip())
        lines.append("")
    return "\n".join(lines)

