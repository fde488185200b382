"""A job against its runtime's locks and limits, and a runtime against its own limits: the operator's check, which
`finetune validate/render/run --runtime FILE` share and the API server's admission policies restate in CEL
(render/runtime_policy.py, render/runtime_object_policy.py), so a refusal reads the same everywhere.

What a runtime lends a job it does not replace (a Secret in pod.secretEnv or a Secret volume, its ServiceAccount, the
S3 credentials, the Hub token) is the admin's grant: the job may use it, not decide where it goes. So while a
runtime lends one, every field that says where a credential is sent (ENDPOINT_FIELDS: pod.env, which can point any
client elsewhere or load other code, the S3 endpoint, the Hub server, the W&B and MLflow servers) is locked as if the
runtime listed it in limits.locked. While it lends what a tracker authenticates with (Secret variables or volumes,
its ServiceAccount), so are TRACKER_FIELDS, what the key writes into on its server (another team's W&B team or
project): the project is then the runtime's, else the job's namespace. A job that brings its own credentials (its
own pod.secretEnv, volumes, ...) borrows nothing and may send them where it likes.
"""

from collections.abc import Collection
from typing import Any

from pydantic import ValidationError

from . import constants as c
from .errors import FieldError
from .runtime import (
    ENDPOINT_FIELDS,
    LOCKABLE,
    LOCKED_LABELS,
    OWN_SECRET_ENV_NAMES,
    TEMPLATE_SECTIONS,
    TRACKER_FIELDS,
    TRACKER_LENDING,
    ClusterFineTuneRuntimeSpec,
    FineTuneRuntimeSpec,
    RuntimeLimits,
    at_path,
    merge,
    runtime_label,
    template_of,
)
from .sources import data_sources, model_sources, under
from .validation import pydantic_errors

# Template fields that lend a credential (the pod.volumes that are Secrets): spec path -> what it lends.
LENDING = {"pod.secretEnv": "Secret environment variables", "pod.volumes": "Secret volumes",
           "pod.serviceAccountName": "its ServiceAccount", "s3.credentialsSecret": "the S3 credentials",
           "output.push.tokenSecret": "the Hub token"}
VOLUME_KINDS = {"claimName": "persistentVolumeClaim", "configMap": "configMap", "secret": "secret", "nfs": "nfs"}


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


def volume_kind(volume: dict[str, Any]) -> str:
    return next((kind for key, kind in VOLUME_KINDS.items() if volume.get(key) is not None), "unknown")


def kinds_allowed(limits: RuntimeLimits) -> list[str]:
    """The kinds of spec.pod.volumes a runtime allows (allowedVolumeKinds, else all but nfs under allowedClaims)."""
    if limits.allowed_volume_kinds is not None:
        return list(limits.allowed_volume_kinds)
    return [k for k in VOLUME_KINDS.values() if not (k == "nfs" and limits.allowed_claims is not None)]


def _volume_kind_errors(volumes: list[dict[str, Any]], limits: RuntimeLimits, where: str,
                        says: str) -> list[FieldError]:
    """`says` starts the message: "ClusterFineTuneRuntime x allows" for a job, "breaks its own" for a template."""
    allowed = kinds_allowed(limits)
    if limits.allowed_volume_kinds is not None:
        rule = f"limits.allowedVolumeKinds {', '.join(allowed)}"
    else:
        rule = ("limits.allowedClaims, and so no nfs volume (storage is those claims unless "
                "limits.allowedVolumeKinds lists nfs)")
    return [FieldError(f"{where}[{i}]", volume_kind(v), f"{says} {rule}",
                       "mount an allowed kind of volume (an NFS export through a PersistentVolumeClaim)")
            for i, v in enumerate(volumes) if volume_kind(v) not in allowed]


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
    volumes = (template.get("pod") or {}).get("volumes") or []
    if limits.allowed_claims is not None:
        claims = [("output.claimName", (template.get("output") or {}).get("claimName"))] + [
            (f"pod.volumes[{i}].claimName", v.get("claimName")) for i, v in enumerate(volumes)]
        for path, claim in claims:
            if claim is not None and claim not in limits.allowed_claims:
                errors.append(FieldError(f"{where}.{path}", claim, f"breaks {who} limits.allowedClaims "
                                         f"{', '.join(limits.allowed_claims)}", "mount an allowed claim, or allow "
                                         "it"))
    errors += _volume_kind_errors(volumes, limits, f"{where}.pod.volumes", f"breaks {who}")
    return errors


def effective_job(obj: dict[str, Any], kind: str, name: str, template: dict[str, Any],
                  limits: RuntimeLimits) -> tuple[dict[str, Any], list[FieldError]]:
    """The job as it runs: its spec over the runtime's template, the runtime's Kueue queue as a label when it has
    none; and the errors for locked fields the job sets (the job itself is not changed)."""
    spec = obj.get("spec") or {}
    labels = dict((obj.get("metadata") or {}).get("labels") or {})
    errors = []
    who = runtime_label(kind, name)
    for path in limits.locked:
        given = [] if path == "queueName" else [(f"spec.{path}", at_path(spec, path))]
        if path in LOCKED_LABELS:
            given.append((f"metadata.labels.{LOCKED_LABELS[path]}", labels.get(LOCKED_LABELS[path])))
        for where, value in given:
            if value is not None:
                errors.append(FieldError(where, value, f"{LOCKABLE[path]} is locked by {who} (limits.locked)",
                                         f"remove {where}: the runtime sets it"))
    merged = merge({k: v for k, v in template.items() if k in TEMPLATE_SECTIONS}, spec)
    queue = template.get("queueName")
    if queue and c.LABEL_KUEUE_QUEUE not in labels:
        labels[c.LABEL_KUEUE_QUEUE] = queue
    metadata = {**(obj.get("metadata") or {}), "labels": labels} if labels else dict(obj.get("metadata") or {})
    return {**obj, "metadata": metadata, "spec": merged}, errors


def lent_credentials(template: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    """The template fields (LENDING) whose credential the job runs with, not having set the field itself."""
    lent = []
    for path in LENDING:
        given = at_path(template, path)
        if path == "pod.volumes":
            given = [v for v in given or [] if isinstance(v, dict) and v.get("secret") is not None]
        if given and at_path(spec, path) is None:
            lent.append(path)
    return lent


def lent_errors(obj: dict[str, Any], template: dict[str, Any], who: str,
                already_locked: Collection[str]) -> list[FieldError]:
    """Every endpoint field the job sets while its runtime lends it a credential, and every tracker field while it
    lends what a tracker authenticates with (module docstring); the fields `already_locked` are said by the lock
    itself; while it lends anything, the job's own pod.secretEnv holds credentials only (OWN_SECRET_ENV_NAMES)."""
    spec = obj.get("spec") or {}
    lent = lent_credentials(template, spec)
    if not lent:
        return []
    lends = ", ".join(f"spec.template.{p} ({LENDING[p]})" for p in lent)
    errors = [FieldError(f"spec.{path}", at_path(spec, path), f"{LOCKABLE[path]} is locked: {who} lends the job "
                         f"credentials ({lends}), and a job may not say where they are sent",
                         f"remove spec.{path}, or give the job its own credentials instead of the runtime's")
              for path in ENDPOINT_FIELDS if path not in already_locked and at_path(spec, path) is not None]
    for i, var in enumerate(at_path(spec, "pod.secretEnv") or []):
        name = var.get("name") if isinstance(var, dict) else None
        if name is not None and name.upper() not in OWN_SECRET_ENV_NAMES:
            errors.append(FieldError(f"spec.pod.secretEnv[{i}].name", name, f"{who} lends the job credentials "
                                     f"({lends}), and while it does, a variable of the job's own is one of the "
                                     "credentials it may bring, not a setting (pod.env is locked: such a variable "
                                     "can send a lent token elsewhere)", "use one of "
                                     f"{', '.join(OWN_SECRET_ENV_NAMES)}, or give the job its own credentials for "
                                     "everything instead of the runtime's"))
    tracker_lent = [p for p in lent if p in TRACKER_LENDING]
    if tracker_lent:
        lends = ", ".join(f"spec.template.{p} ({LENDING[p]})" for p in tracker_lent)
        errors += [FieldError(f"spec.{path}", at_path(spec, path), f"{LOCKABLE[path]} is locked: {who} lends the "
                              f"job what a tracker logs in with ({lends}), and a job may not choose what it writes "
                              "into", f"remove spec.{path} (the runtime's is used; for the project, else the job's "
                              f"namespace), or give the job its own ({', '.join(tracker_lent)}) instead of the "
                              "runtime's")
                   for path in TRACKER_FIELDS if path not in already_locked and at_path(spec, path) is not None]
    return errors


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
    if limits.allowed_model_sources is not None:
        for path, source in model_sources(spec):
            if not under(source, limits.allowed_model_sources):
                refuse(path, source, "limits.allowedModelSources", limits.allowed_model_sources,
                       "load it from under one of those prefixes")
    if spec.model.trust_remote_code and not limits.allow_trust_remote_code:
        refuse("spec.model.trustRemoteCode", True, "limits.allowTrustRemoteCode =", "false",
               "remove trustRemoteCode (a model in transformers itself needs none), or ask the admin to allow it")
    grpo = spec.method.grpo if spec.method.objective == "grpo" else None
    for i, reward in enumerate(grpo.rewards if grpo is not None else []):
        if reward.config_map is not None and not limits.allow_trust_remote_code:
            refuse(f"spec.method.grpo.rewards[{i}].configMap", reward.config_map, "limits.allowTrustRemoteCode =",
                   "false", "a reward function from a ConfigMap is Python the job brings: use a built-in reward or a "
                   "function from the image, or ask the admin to allow it")
    if limits.allowed_outputs is not None:
        targets = [("spec.output.uri", spec.output.uri),
                   ("spec.output.push.repo", spec.output.push.repo if spec.output.push is not None else None)]
        for path, target in targets:
            if target is not None and not under(target, limits.allowed_outputs):
                refuse(path, target, "limits.allowedOutputs", limits.allowed_outputs,
                       "write under one of those prefixes (the runtime's credentials may write elsewhere too)")
    if limits.allowed_data_sources is not None:
        for path, source in data_sources(spec):
            if not under(source, limits.allowed_data_sources):
                refuse(path, source, "limits.allowedDataSources", limits.allowed_data_sources,
                       "use data under one of those prefixes")
    if limits.allowed_claims is not None:
        claims = [("spec.output.claimName", spec.output.claim_name)] + [
            (f"spec.pod.volumes[{i}].claimName", v.claim_name) for i, v in enumerate(spec.pod.volumes)]
        for path, claim in claims:
            if claim is not None and claim not in limits.allowed_claims:
                refuse(path, claim, "limits.allowedClaims", limits.allowed_claims, "mount one of those claims")
    volumes = [v.model_dump(by_alias=True, exclude_none=True) for v in spec.pod.volumes]
    errors += _volume_kind_errors(volumes, limits, "spec.pod.volumes", f"{who} allows")
    deadline = spec.run_policy.active_deadline_seconds
    if limits.max_active_deadline_seconds is not None and (deadline is None
                                                           or deadline > limits.max_active_deadline_seconds):
        refuse("spec.runPolicy.activeDeadlineSeconds", deadline, "limits.maxActiveDeadlineSeconds =",
               limits.max_active_deadline_seconds,
               f"set runPolicy.activeDeadlineSeconds to at most {limits.max_active_deadline_seconds}")
    return errors
