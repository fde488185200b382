"""FineTuneRuntime and ClusterFineTuneRuntime: what a platform admin sets once, so users write model, data, method.

A runtime holds defaults for the sections of a FineTuneJob's spec an admin owns (`template`) and limits every job
using it must keep (`limits`). A job names one with spec.runtimeRef; a job with none uses its namespace's default
FineTuneRuntime, else the cluster's default ClusterFineTuneRuntime, else none (a job with everything in its spec
works as it always did).

Merge (effective_spec): runtime template < job spec, field by field: maps merged key by key, lists and scalars
replaced whole by the job's. A field the runtime locks may not be set by the job at all (refused, never silently
overwritten). The same rules run in the operator, in `finetune validate/render/run --runtime FILE`, and (the
limits) in the API server's admission (render/runtime_policy.py), so a refusal reads the same everywhere.
"""

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, ValidationError

from .base import ApiModel
from .distributed import DistributedSpec
from .errors import FieldError, InvalidSpec
from .k8s_names import DnsSubdomain
from .output import CheckpointSpec, OutputSpec
from .resources import PodSpec, ResourcesSpec
from .run_policy import RunPolicy
from .storage import S3Spec
from .tracking import TrackingSpec

RuntimeKind = Literal["FineTuneRuntime", "ClusterFineTuneRuntime"]
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


class RuntimeRef(ApiModel):
    kind: RuntimeKind = Field(default="ClusterFineTuneRuntime", description="ClusterFineTuneRuntime (cluster-wide, "
                              "set by the platform team) or FineTuneRuntime (in the job's namespace).")
    name: DnsSubdomain = Field(description="The runtime's name.")


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


def parse_runtime(obj: dict[str, Any]) -> tuple[FineTuneRuntimeSpec | None, list[FieldError]]:
    """A runtime object's spec, or its errors (paths from `spec`)."""
    from .validation import pydantic_errors

    try:
        return FineTuneRuntimeSpec.model_validate(obj.get("spec") or {}, by_alias=True, by_name=False), []
    except ValidationError as exc:
        return None, pydantic_errors(exc, "spec", FineTuneRuntimeSpec)


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


@dataclass(frozen=True)
class Resolved:
    obj: dict[str, Any]  # the job as it runs: the runtime's template under its spec
    snapshot: dict[str, Any] | None = None  # what status.runtime holds (None: no runtime)
    errors: list[FieldError] = field(default_factory=list)  # locked fields set, limits broken
    missing: str | None = None  # why the runtime cannot be read (the job waits: RuntimeNotFound)


def digest(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:12]


def apply_layers(obj: dict[str, Any], layers: list[dict[str, Any]]) -> Resolved:
    """The job over its runtime layers (the cluster default first): merged, checked against every layer's locks and
    limits, and the snapshot status.runtime records."""
    from .validation import validate_job

    errors: list[FieldError] = []
    template: dict[str, Any] = {}
    limits = []
    for runtime in layers:
        kind, name = runtime["kind"], runtime["metadata"]["name"]
        spec, problems = parse_runtime(runtime)
        if spec is None:
            # An invalid runtime (the CRD's schema lets through what only our rules catch) is the admin's to fix.
            return Resolved(obj, missing=f"{kind} {name} is invalid: "
                                         + "; ".join(f"{e.path}: {e.message}" for e in problems))
        template = merge(template, template_of(runtime))
        limits.append((kind, name, spec.limits))
    top = layers[-1]
    merged, _ = effective_job(obj, top["kind"], top["metadata"]["name"], template, RuntimeLimits())
    for kind, name, rule in limits:  # each layer's locks, said in its own name
        errors += effective_job(obj, kind, name, template, rule)[1]
    try:
        job = validate_job(merged)
    except InvalidSpec:
        job = None  # the plan validates the same object and fails it with every error
    if job is not None:
        for kind, name, rule in limits:
            errors += check_limits(kind, name, rule, job.spec)
    snapshot = {"name": top["metadata"]["name"], "kind": top["kind"],
                "generation": top["metadata"].get("generation", 0), "digest": digest(template),
                "layers": [{"kind": r["kind"], "name": r["metadata"]["name"],
                            "generation": r["metadata"].get("generation", 0)} for r in layers],
                "template": template}
    return Resolved(merged, snapshot, errors)


def choose_layers(obj: dict[str, Any], get: Callable[[str, str, str], dict[str, Any] | None],
                  defaults: Callable[[str], tuple[list[dict[str, Any]], list[dict[str, Any]]]]
                  ) -> tuple[list[dict[str, Any]], str | None]:
    """The runtimes a job that has not started uses (the cluster default first), or why it cannot tell: `get`
    reads one runtime (kind, namespace, name), `defaults` the namespace's and the cluster's default ones."""
    namespace = (obj.get("metadata") or {}).get("namespace", "")
    ref = (obj.get("spec") or {}).get("runtimeRef")
    if isinstance(ref, dict) and ref.get("name"):
        kind = ref.get("kind") or "ClusterFineTuneRuntime"
        runtime = get(kind, namespace, ref["name"])
        if runtime is None:
            where = f" in namespace {namespace}" if kind == "FineTuneRuntime" else ""
            return [], (f"spec.runtimeRef names {kind} {ref['name']}, which does not exist{where}: create it, or "
                        f"name another (`kubectl get {kind.lower()}s`)")
        return [runtime], None
    ours, cluster = defaults(namespace)
    for found, scope in ((ours, f"FineTuneRuntimes in namespace {namespace}"), (cluster, "ClusterFineTuneRuntimes")):
        if len(found) > 1:
            names = ", ".join(sorted(r["metadata"]["name"] for r in found))
            return [], (f"{len(found)} {scope} are marked default ({names}): a job without spec.runtimeRef cannot "
                        "tell which to use; unmark all but one, or set spec.runtimeRef")
    return cluster + ours, None  # the namespace's default over the cluster's


def resolve_offline(obj: dict[str, Any], runtimes: list[dict[str, Any]]) -> Resolved:
    """`finetune validate/render/run --runtime FILE`: the same choice and merge as the operator, from files (a
    FineTuneRuntime without a namespace counts as the job's)."""
    def in_scope(r: dict[str, Any], kind: str, namespace: str) -> bool:
        return r.get("kind") == kind and (kind != "FineTuneRuntime" or (r.get("metadata") or {}).get(
            "namespace", namespace) == namespace)

    def get(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return next((r for r in runtimes if in_scope(r, kind, namespace)
                     and (r.get("metadata") or {}).get("name") == name), None)

    def defaults(namespace: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        chosen = [r for r in runtimes if (r.get("spec") or {}).get("default") is True]
        return ([r for r in chosen if in_scope(r, "FineTuneRuntime", namespace)],
                [r for r in chosen if r.get("kind") == "ClusterFineTuneRuntime"])

    layers, missing = choose_layers(obj, get, defaults)
    if missing is not None:
        return Resolved(obj, missing=missing)
    return apply_layers(obj, layers) if layers else Resolved(obj)
