"""FineTuneRuntime and ClusterFineTuneRuntime: what a platform admin sets once, so users write model, data, method.

A runtime holds defaults for the sections of a FineTuneJob's spec an admin owns (`template`) and limits every job
using it must keep (`limits`). A job names one with spec.runtimeRef; a job with none uses its namespace's default
FineTuneRuntime, else the cluster's default ClusterFineTuneRuntime, else none (a job with everything in its spec
works as it always did).

Merge (effective_spec): runtime template < job spec, field by field: maps merged key by key, lists and scalars
replaced whole by the job's. A field the runtime locks may not be set by the job at all (refused, never silently
overwritten). The same rules run in the operator, in `finetune validate/render/run --runtime FILE`, and (the
limits) in the API server's admission (render/runtime_policy.py), so a refusal reads the same everywhere. Which
runtimes a job uses, the snapshot of them it keeps and the checks against that snapshot: runtime_layers.py.
"""

from typing import Any, Literal

from pydantic import Field, ValidationError

from .base import ApiModel
from .distributed import DistributedSpec
from .errors import FieldError
from .output import CheckpointSpec, OutputSpec
from .resources import PodSpec, ResourcesSpec
from .run_policy import RunPolicy
from .runtime_ref import RuntimeKind, RuntimeRef  # noqa: F401 - RuntimeRef: part of this module's API
from .selectors import LabelSelector
from .storage import S3Spec
from .tracking import TrackingSpec
from .validation import pydantic_errors

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
    "pod.volumes": "volumes",
    "pod.env": "environment variables",
    "pod.secretEnv": "environment variables from Secrets",
    "resources": "resource requests",
    "distributed.strategy": "the parallelism strategy",
    "distributed.gpusPerNode": "GPUs per node",
    "s3": "the object storage endpoint and credentials",
    "queueName": "the Kueue queue",
}
LockableField = Literal[
    "pod.image", "pod.serviceAccountName", "pod.nodeSelector", "pod.tolerations", "pod.affinity",
    "pod.priorityClassName", "pod.volumes", "pod.env", "pod.secretEnv", "resources", "distributed.strategy",
    "distributed.gpusPerNode", "s3", "queueName"]
MethodName = Literal["full", "lora", "qlora", "freeze"]
StrategyName = Literal["ddp", "fsdp", "deepspeed"]


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
        default=None, min_length=1, max_length=64, description="Prefixes spec.model.name must start with: hub "
        "organisations (`meta-llama/`), buckets (`s3://models/`), volume paths (`/models/`).")
    allowed_data_sources: list[str] | None = Field(
        default=None, min_length=1, max_length=64, description="Prefixes every data path and hub dataset "
        "(spec.data.train/validation) must start with (`s3://team-data/`, `/data/`, `tatsu-lab/`); inline rows "
        "are always allowed.")
    allowed_claims: list[str] | None = Field(
        default=None, min_length=1, max_length=64, description="PersistentVolumeClaims jobs may mount "
        "(spec.output.claimName and spec.pod.volumes[].claimName): the team's datasets and checkpoint volumes, not "
        "another team's claim that happens to be in the namespace.")
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


def parse_runtime(obj: dict[str, Any]) -> tuple[FineTuneRuntimeSpec | None, list[FieldError]]:
    """A runtime object's spec, or its errors (paths from `spec`): its schema, and a template that breaks the
    runtime's own limits (every lean job using it would be refused)."""

    model = ClusterFineTuneRuntimeSpec if obj.get("kind") == "ClusterFineTuneRuntime" else FineTuneRuntimeSpec
    try:
        spec = model.model_validate(obj.get("spec") or {}, by_alias=True, by_name=False)
    except ValidationError as exc:
        return None, pydantic_errors(exc, "spec", model)
    errors = template_errors(template_of(obj), spec.limits)
    return (None, errors) if errors else (spec, [])


def template_errors(template: dict[str, Any], limits: RuntimeLimits, where: str = "spec.template",
                    who: str = "its own") -> list[FieldError]:
    """The values a template sets (as written: the built-in defaults are a job's, not the template's) that break
    `limits`: a lean job would be refused by the very runtime that gave them. The same rules as check_limits."""
    errors = []
    d = template.get("distributed") or {}
    nodes, gpus = d.get("numNodes"), d.get("gpusPerNode")
    if limits.max_nodes is not None and nodes is not None and nodes > limits.max_nodes:
        errors.append(FieldError(f"{where}.distributed.numNodes", nodes, f"breaks {who} limits.maxNodes = "
                                 f"{limits.max_nodes}", "lower it, or raise the limit"))
    if limits.max_gpus_per_job is not None and (nodes is not None or gpus is not None):
        total = (nodes if nodes is not None else 1) * (gpus if gpus is not None else 1)
        if total > limits.max_gpus_per_job:
            errors.append(FieldError(f"{where}.distributed", f"{nodes or 1} nodes x {1 if gpus is None else gpus} "
                                     f"GPUs = {total}", f"breaks {who} limits.maxGpusPerJob = "
                                     f"{limits.max_gpus_per_job}", "lower numNodes or gpusPerNode, or raise the "
                                     "limit"))
    strategy = d.get("strategy")
    if limits.allowed_strategies is not None and strategy is not None and strategy not in limits.allowed_strategies:
        errors.append(FieldError(f"{where}.distributed.strategy", strategy, f"breaks {who} limits."
                                 f"allowedStrategies {', '.join(limits.allowed_strategies)}",
                                 "use an allowed strategy, or allow it"))
    deadline = (template.get("runPolicy") or {}).get("activeDeadlineSeconds")
    if limits.max_active_deadline_seconds is not None and deadline is not None and \
            deadline > limits.max_active_deadline_seconds:
        errors.append(FieldError(f"{where}.runPolicy.activeDeadlineSeconds", deadline, f"breaks {who} limits."
                                 f"maxActiveDeadlineSeconds = {limits.max_active_deadline_seconds}",
                                 "lower it, or raise the limit"))
    if limits.allowed_claims is not None:
        claims = [("output.claimName", (template.get("output") or {}).get("claimName"))] + [
            (f"pod.volumes[{i}].claimName", v.get("claimName"))
            for i, v in enumerate((template.get("pod") or {}).get("volumes") or [])]
        for path, claim in claims:
            if claim is not None and claim not in limits.allowed_claims:
                errors.append(FieldError(f"{where}.{path}", claim, f"breaks {who} limits.allowedClaims "
                                         f"{', '.join(limits.allowed_claims)}", "mount an allowed claim, or allow "
                                         "it"))
    return errors


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


def _get(tree: dict[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def runtime_label(kind: str, name: str) -> str:
    return f"{kind} {name}"


def effective_job(obj: dict[str, Any], kind: str, name: str, template: dict[str, Any],
                  limits: RuntimeLimits) -> tuple[dict[str, Any], list[FieldError]]:
    """The job as it runs: its spec over the runtime's template, the runtime's Kueue queue as a label when it has
    none; and the errors for locked fields the job sets (the job itself is not changed)."""
    spec = obj.get("spec") or {}
    labels = dict((obj.get("metadata") or {}).get("labels") or {})
    errors = []
    who = runtime_label(kind, name)
    for path in limits.locked:
        given = labels.get("kueue.x-k8s.io/queue-name") if path == "queueName" else _get(spec, path)
        if given is not None:
            where = "metadata.labels.kueue.x-k8s.io/queue-name" if path == "queueName" else f"spec.{path}"
            errors.append(FieldError(where, given, f"{LOCKABLE[path]} is locked by {who} (limits.locked)",
                                     f"remove {where}: the runtime sets it"))
    merged = merge({k: v for k, v in template.items() if k in TEMPLATE_SECTIONS}, spec)
    queue = template.get("queueName")
    if queue and "kueue.x-k8s.io/queue-name" not in labels:
        labels["kueue.x-k8s.io/queue-name"] = queue
    metadata = {**(obj.get("metadata") or {}), "labels": labels} if labels else dict(obj.get("metadata") or {})
    return {**obj, "metadata": metadata, "spec": merged}, errors


def check_limits(kind: str, name: str, limits: RuntimeLimits, spec: Any) -> list[FieldError]:
    """Every limit of the runtime the effective spec (a validated FineTuneJobSpec) breaks, each naming the
    runtime, the limit and the value."""
    who = runtime_label(kind, name)
    errors = []

    def refuse(path: str, value: Any, limit: str, allowed: Any, fix: str) -> None:
        shown = ", ".join(allowed) if isinstance(allowed, list) else allowed
        errors.append(FieldError(path, value, f"{who} allows {limit} {shown}", fix))

    d = spec.distributed
    if limits.max_nodes is not None and d.num_nodes > limits.max_nodes:
        refuse("spec.distributed.numNodes", d.num_nodes, "limits.maxNodes =", limits.max_nodes,
               f"ask for at most {limits.max_nodes} nodes, or use another runtime")
    gpus = d.num_nodes * d.gpus_per_node
    if limits.max_gpus_per_job is not None and gpus > limits.max_gpus_per_job:
        refuse("spec.distributed", f"{d.num_nodes} nodes x {d.gpus_per_node} GPUs = {gpus}",
               "limits.maxGpusPerJob =", limits.max_gpus_per_job,
               f"ask for at most {limits.max_gpus_per_job} GPUs in all, or use another runtime")
    if limits.allowed_methods is not None and spec.method.type not in limits.allowed_methods:
        refuse("spec.method.type", spec.method.type, "limits.allowedMethods", limits.allowed_methods,
               f"use one of {', '.join(limits.allowed_methods)}")
    if limits.allowed_strategies is not None and d.strategy not in limits.allowed_strategies:
        refuse("spec.distributed.strategy", d.strategy, "limits.allowedStrategies", limits.allowed_strategies,
               f"use one of {', '.join(limits.allowed_strategies)}")
    if limits.allowed_model_sources is not None and not spec.model.name.startswith(
            tuple(limits.allowed_model_sources)):
        refuse("spec.model.name", spec.model.name, "limits.allowedModelSources", limits.allowed_model_sources,
               "use a model under one of those prefixes")
    if limits.allowed_data_sources is not None:
        for path, source in data_sources(spec):
            if not source.startswith(tuple(limits.allowed_data_sources)):
                refuse(path, source, "limits.allowedDataSources", limits.allowed_data_sources,
                       "use data under one of those prefixes")
    if limits.allowed_claims is not None:
        claims = [("spec.output.claimName", spec.output.claim_name)] + [
            (f"spec.pod.volumes[{i}].claimName", v.claim_name) for i, v in enumerate(spec.pod.volumes)]
        for path, claim in claims:
            if claim is not None and claim not in limits.allowed_claims:
                refuse(path, claim, "limits.allowedClaims", limits.allowed_claims, "mount one of those claims")
    deadline = spec.run_policy.active_deadline_seconds
    if limits.max_active_deadline_seconds is not None and (deadline is None
                                                           or deadline > limits.max_active_deadline_seconds):
        refuse("spec.runPolicy.activeDeadlineSeconds", deadline, "limits.maxActiveDeadlineSeconds =",
               limits.max_active_deadline_seconds,
               f"set runPolicy.activeDeadlineSeconds to at most {limits.max_active_deadline_seconds}")
    return errors


def data_sources(spec: Any) -> list[tuple[str, str]]:
    """(path in the manifest, path or hub dataset id) of every training and validation source but inline ones."""
    found = []
    for section in ("train", "validation"):
        for i, source in enumerate(getattr(spec.data, section) or []):
            where = f"spec.data.{section}[{i}]"
            if source.path is not None:
                found.append((f"{where}.path", source.path))
            elif source.hub is not None:
                found.append((f"{where}.hub.name", source.hub.name))
    return found
