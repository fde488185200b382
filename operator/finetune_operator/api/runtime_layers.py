"""Which runtimes a job uses, the snapshot it keeps of them, and every check against them.

Until a job starts, its runtimes are read live: spec.runtimeRef (a ClusterFineTuneRuntime only where its
namespaceSelector matches the job's namespace), else the namespace's default FineTuneRuntime layered over the default
ClusterFineTuneRuntime (one whose selector matches). The first status write records them in status.runtime: the merged
template and each layer's limits as written. From then on the job is judged against that snapshot alone, by the
operator (every pass, so before every attempt it creates) and by the API server's admission (every update): an admin
who edits, tightens or deletes a runtime changes no job that started, and a tenant can neither get around the limits
a job started with nor be locked out of suspending or editing it within them.
"""

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import FieldError, InvalidSpec
from .runtime import ClusterFineTuneRuntimeSpec, RuntimeLimits, at_path, merge, runtime_label, template_of
from .runtime_limits import check_limits, effective_job, lent_errors, parse_runtime, template_errors
from .selectors import describe, matches

RUNTIME_NOT_FOUND = "RuntimeNotFound"
ALLOW_REMOTE_CODE = "allowTrustRemoteCode"  # the one limit that limits when unset (forbidden unless allowed)
RUNTIME_NOT_ALLOWED = "RuntimeNotAllowed"
Layer = tuple[str, str, RuntimeLimits]  # kind, name, limits


@dataclass(frozen=True)
class Resolved:
    obj: dict[str, Any]  # the job as it runs: the runtime's template under its spec
    snapshot: dict[str, Any] | None = None  # what status.runtime holds (None: no runtime)
    errors: list[FieldError] = field(default_factory=list)  # locked fields set, limits broken
    missing: str | None = None  # why the runtime cannot be used (the job waits)
    reason: str = RUNTIME_NOT_FOUND  # the job's status reason while it waits for `missing`


def digest(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:12]


def judge(obj: dict[str, Any], template: dict[str, Any], layers: list[Layer]) -> tuple[dict[str, Any],
                                                                                      list[FieldError]]:
    """The job over `template`, and every lock and limit of every layer it breaks (each said in its layer's
    name)."""
    from .validation import validate_job

    merged, _ = effective_job(obj, "", "", template, RuntimeLimits())
    errors: list[FieldError] = []
    for kind, name, limits in layers:
        errors += effective_job(obj, kind, name, template, limits)[1]
    if not layers:
        return merged, errors  # nothing to limit: the plan validates the job once, as for any job
    locked = {path for _, _, limits in layers for path in limits.locked}
    errors += lent_errors(obj, template, " over ".join(runtime_label(k, n) for k, n, _ in layers), locked)
    try:
        job = validate_job(merged)
    except InvalidSpec:
        return merged, errors  # the plan validates the same object and fails it with every error
    for kind, name, limits in layers:
        errors += check_limits(kind, name, limits, job.spec)
    return merged, errors


def apply_layers(obj: dict[str, Any], layers: list[dict[str, Any]]) -> Resolved:
    """The job over its runtime layers (the cluster default first): merged, checked against every layer's locks and
    limits, and the snapshot status.runtime records."""
    template: dict[str, Any] = {}
    checked: list[Layer] = []
    for runtime in layers:
        kind, name = runtime["kind"], runtime["metadata"]["name"]
        spec, problems = parse_runtime(runtime)
        if spec is None:
            # An invalid runtime (the CRD's schema lets through what only our rules catch) is the admin's to fix.
            return Resolved(obj, missing=f"{kind} {name} is invalid: "
                                         + "; ".join(f"{e.path}: {e.message}" for e in problems))
        template = merge(template, template_of(runtime))
        checked.append((kind, name, spec.limits))
    merged, errors = judge(obj, template, checked)
    top = layers[-1]
    snapshot = {"name": top["metadata"]["name"], "kind": top["kind"],
                "generation": top["metadata"].get("generation", 0), "digest": digest(template),
                "layers": [{"kind": r["kind"], "name": r["metadata"]["name"],
                            "generation": r["metadata"].get("generation", 0),
                            # As written: admission judges later edits of the job against these (render/); with
                            # the one limit that holds when unset said, so a record without it is an old one's.
                            "limits": {ALLOW_REMOTE_CODE: False, **dict((r.get("spec") or {}).get("limits") or {})}}
                           for r in layers],
                "template": template}
    return Resolved(merged, snapshot, errors)


def recorded(obj: dict[str, Any], snapshot: dict[str, Any]) -> Resolved:
    """A started job judged against the runtime it recorded (status.runtime), whatever the runtime is now. A layer
    recorded without limits (by an operator from before they were recorded) limits nothing here, and one recorded
    without allowTrustRemoteCode (before that limit existed) does not limit remote code."""
    layers = [(layer.get("kind", ""), layer.get("name", ""), RuntimeLimits.model_validate(
        {ALLOW_REMOTE_CODE: True, **layer["limits"]}, by_alias=True, by_name=False))
        for layer in snapshot.get("layers") or [] if "limits" in layer]
    merged, errors = judge(obj, snapshot.get("template") or {}, layers)
    return Resolved(merged, snapshot, errors)


NamespaceLabels = Callable[[], dict[str, str]]  # read only when a selector needs them


def allowed_in(runtime: dict[str, Any], namespace: str, labels: NamespaceLabels | None) -> str | None:
    """Why a ClusterFineTuneRuntime may not be used in `namespace` (its namespaceSelector), or None. Labels unknown
    (`finetune validate` offline): not checked."""
    selector = ((runtime.get("spec") or {}).get("namespaceSelector"))
    if labels is None or runtime.get("kind") != "ClusterFineTuneRuntime" or selector is None:
        return None
    parsed = ClusterFineTuneRuntimeSpec.model_validate({"namespaceSelector": selector}, by_alias=True,
                                                       by_name=False).namespace_selector
    if parsed is None or matches(parsed, labels()):
        return None
    return (f"ClusterFineTuneRuntime {runtime['metadata']['name']} may not be used in namespace {namespace}: its "
            f"spec.namespaceSelector ({describe(parsed)}) does not match the namespace's labels; name a runtime "
            "this namespace may use, or ask a cluster admin to label the namespace")


def choose_layers(obj: dict[str, Any], get: Callable[[str, str, str], dict[str, Any] | None],
                  defaults: Callable[[str], tuple[list[dict[str, Any]], list[dict[str, Any]]]],
                  namespace_labels: NamespaceLabels | None = None
                  ) -> tuple[list[dict[str, Any]], str | None, str]:
    """The runtimes a job that has not started uses (the cluster default first), or why it cannot tell and the
    reason it waits with: `get` reads one runtime (kind, namespace, name), `defaults` the namespace's and the
    cluster's default ones; `namespace_labels` decide which ClusterFineTuneRuntimes the namespace may use."""
    namespace = (obj.get("metadata") or {}).get("namespace", "")
    ref = (obj.get("spec") or {}).get("runtimeRef")
    if isinstance(ref, dict) and ref.get("name"):
        kind = ref.get("kind") or "ClusterFineTuneRuntime"
        runtime = get(kind, namespace, ref["name"])
        if runtime is None:
            where = f" in namespace {namespace}" if kind == "FineTuneRuntime" else ""
            return [], (f"spec.runtimeRef names {kind} {ref['name']}, which does not exist{where}: create it, or "
                        f"name another (`kubectl get {kind.lower()}s`)"), RUNTIME_NOT_FOUND
        refused = allowed_in(runtime, namespace, namespace_labels)
        if refused is not None:
            return [], f"spec.runtimeRef: {refused}", RUNTIME_NOT_ALLOWED
        return [runtime], None, RUNTIME_NOT_FOUND
    ours, cluster = defaults(namespace)
    cluster = [r for r in cluster if allowed_in(r, namespace, namespace_labels) is None]
    for found, scope in ((ours, f"FineTuneRuntimes in namespace {namespace}"), (cluster, "ClusterFineTuneRuntimes")):
        if len(found) > 1:
            names = ", ".join(sorted(r["metadata"]["name"] for r in found))
            return [], (f"{len(found)} {scope} are marked default ({names}): a job without spec.runtimeRef cannot "
                        "tell which to use; unmark all but one, or set spec.runtimeRef"), RUNTIME_NOT_FOUND
    return cluster + ours, None, RUNTIME_NOT_FOUND  # the namespace's default over the cluster's


def resolve_offline(obj: dict[str, Any], runtimes: list[dict[str, Any]],
                    namespace_labels: NamespaceLabels | None = None) -> Resolved:
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

    layers, missing, reason = choose_layers(obj, get, defaults, namespace_labels)
    if missing is not None:
        return Resolved(obj, missing=missing, reason=reason)
    return apply_layers(obj, layers) if layers else Resolved(obj)


# The fields each limit reads of a job: the API server checks a job against each runtime's own template, so where a
# namespace default is layered over a cluster default, these must not come from the other layer's template.
GPU_SHAPE = ("numNodes", "gpusPerNode")


def layering_errors(cluster: dict[str, Any], namespaced: dict[str, Any]) -> list[FieldError]:
    """Why a namespace's default FineTuneRuntime may not be layered over the cluster's default: its template, over the
    cluster's, breaks either runtime's limits, or sets a field the cluster default locks; or the GPUs of a job under
    both could not be checked exactly at `kubectl apply` (the API server checks a job against each runtime's own
    template: a GPU shape split between the two templates is seen whole by neither)."""
    c_spec, _ = parse_runtime(cluster)
    n_spec, _ = parse_runtime(namespaced)
    if c_spec is None or n_spec is None:
        return []  # each runtime's own errors are said on it
    c_name = f"ClusterFineTuneRuntime {cluster['metadata']['name']}"
    c_template, n_template = template_of(cluster), template_of(namespaced)
    layered = merge(c_template, n_template)
    errors = template_errors(layered, c_spec.limits, who=f"the default {c_name}'s")
    errors += template_errors(layered, n_spec.limits, who="its own")
    for path in c_spec.limits.locked:
        if path != "queueName" and at_path(n_template, path) is not None:
            errors.append(FieldError(f"spec.template.{path}", at_path(n_template, path), f"is locked by the default "
                                     f"{c_name} (limits.locked)", "remove it: the cluster default sets it"))
        if path == "queueName" and n_template.get("queueName") is not None:
            errors.append(FieldError("spec.template.queueName", n_template["queueName"], f"is locked by the default "
                                     f"{c_name} (limits.locked)", "remove it: the cluster default sets it"))
    n_shape = {k for k in GPU_SHAPE if (n_template.get("distributed") or {}).get(k) is not None}
    c_shape = {k for k in GPU_SHAPE if (c_template.get("distributed") or {}).get(k) is not None}
    if c_spec.limits.max_gpus_per_job is not None and n_shape:
        errors.append(FieldError("spec.template.distributed", ", ".join(sorted(n_shape)), f"the default {c_name} "
                                 f"limits maxGpusPerJob = {c_spec.limits.max_gpus_per_job}, which the API server "
                                 "checks with the GPU shape of its own template", "leave numNodes and gpusPerNode "
                                 "to the cluster default (or to each job), or give jobs a runtimeRef"))
    if n_spec.limits.max_gpus_per_job is not None and c_shape - n_shape:
        errors.append(FieldError("spec.template.distributed", ", ".join(sorted(c_shape - n_shape)), "its "
                                 f"limits.maxGpusPerJob is checked with the GPU shape of its own template, and the "
                                 f"default {c_name}'s template sets these", "set them in this template too"))
    return errors
