"""The CustomResourceDefinition, generated from the pydantic models (never edited by hand).

Kubernetes wants a structural OpenAPI v3 schema: no $ref, no anyOf-with-null for optional fields, an explicit
type everywhere, and x-kubernetes-preserve-unknown-fields where a field is free-form (extraArgs, inline rows).
"""

from collections.abc import Callable
from typing import Any

import yaml

from .base import YAML_FALSE_KEY
from .constants import (
    CLUSTER_RUNTIME_KIND,
    CLUSTER_RUNTIME_PLURAL,
    CLUSTER_RUNTIME_SHORT_NAMES,
    GROUP,
    KIND,
    MAX_JOB_NAME_LENGTH,
    PLURAL,
    RUNTIME_KIND,
    RUNTIME_PLURAL,
    RUNTIME_SHORT_NAMES,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
)
from .runtime import TEMPLATE_SECTIONS, ClusterFineTuneRuntimeSpec, FineTuneRuntimeSpec
from .spec import FineTuneJobSpec
from .status import FineTuneJobStatus

# JSON Schema keywords that Kubernetes' OpenAPI v3 subset rejects or that only add noise to `kubectl explain`.
_DROPPED_KEYS = {"title", "examples", "$defs", "additionalProperties", "const", "discriminator"}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase."},
    {"name": "Nodes", "type": "string", "jsonPath": ".status.nodes", "description": "Nodes running / requested."},
    {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpus", "description": "GPUs per attempt."},
    {"name": "Progress", "type": "integer", "jsonPath": ".status.progress.percent",
     "description": "Percent of optimizer steps done."},
    {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss",
     "description": "Latest training loss (4 significant digits)."},
    {"name": "ETA", "type": "string", "jsonPath": ".status.progress.eta", "description": "Estimated time left."},
    {"name": "Tok/s/GPU", "type": "integer", "jsonPath": ".status.progress.tokensPerSecondPerDevice", "priority": 1,
     "description": "Training tokens/s per GPU."},
    {"name": "MFU", "type": "number", "jsonPath": ".status.progress.mfu", "priority": 1,
     "description": "Model FLOPs utilization (0-1)."},
    {"name": "GPU-h", "type": "number", "jsonPath": ".status.goodput.gpuHours", "priority": 1,
     "description": "GPU-hours of ended running periods."},
    {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt", "priority": 1,
     "description": "Current attempt."},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason",
     "description": "Why the job is in its phase."},
    {"name": "Runtime", "type": "string", "jsonPath": ".status.runtime.name", "priority": 1,
     "description": "The runtime it runs with (recorded when it started)."},
    {"name": "Runtime-Gen", "type": "integer", "jsonPath": ".status.runtime.generation", "priority": 1,
     "description": "That runtime's generation then."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
RUNTIME_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Default", "type": "boolean", "jsonPath": ".spec.default", "description": "Used by jobs without "
     "spec.runtimeRef."},
    {"name": "GPUs/Node", "type": "integer", "jsonPath": ".spec.template.distributed.gpusPerNode",
     "description": "GPUs per node the template gives."},
    {"name": "Image", "type": "string", "jsonPath": ".spec.template.pod.image", "description": "Trainer image."},
    {"name": "Queue", "type": "string", "jsonPath": ".spec.template.queueName", "description": "Kueue queue."},
    {"name": "Max-GPUs", "type": "integer", "jsonPath": ".spec.limits.maxGpusPerJob",
     "description": "Most GPUs a job may ask for."},
    {"name": "Max-Nodes", "type": "integer", "jsonPath": ".spec.limits.maxNodes", "priority": 1,
     "description": "Most nodes a job may ask for."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict[str, Any]:
    """The whole CRD object, ready for `kubectl apply`."""
    spec_schema = structural_schema(FineTuneJobSpec.model_json_schema(by_alias=True, mode="validation"))
    for section in TEMPLATE_SECTIONS:
        # What the user leaves out must stay out: a default the apiserver filled in would hide the runtime's.
        _defaults_to_descriptions(spec_schema["properties"][section])
    # The field's own rule (self == oldSelf) holds only while it exists before and after: removing or adding it
    # would change the runtime a started job is judged against.
    spec_schema["x-kubernetes-validations"] = [{
        "rule": "has(self.runtimeRef) == has(oldSelf.runtimeRef)",
        "message": "spec.runtimeRef is immutable, and can be neither added nor removed: the job keeps the runtime "
                   "it was created with (status.runtime records it); create a new FineTuneJob to use another",
        "fieldPath": ".runtimeRef", "reason": "FieldValueForbidden"}]
    status_schema = structural_schema(FineTuneJobStatus.model_json_schema(by_alias=True, mode="validation"))
    status_schema["description"] = "Observed state, written by the operator and by trainer rank 0 (progress)."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": SINGULAR,
                      "shortNames": list(SHORT_NAMES), "categories": ["all", "ml"]},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "FineTuneJob fine-tunes a language model on one or more nodes with the "
                            "Hugging Face Trainer; the operator runs it as gang-restarted Indexed Jobs.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                # Pod hostnames <name>-a<attempt>-<index> must fit a DNS label: refused at apply
                                # time by the apiserver as "metadata.name: Too long" (a CEL rule at the root read
                                # "<nil>: Invalid value: "object": ...").
                                "metadata": {"type": "object", "properties": {"name": {
                                    "type": "string", "maxLength": MAX_JOB_NAME_LENGTH}}},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def runtime_crd(cluster: bool) -> dict[str, Any]:
    """The CRD of FineTuneRuntime (namespaced) or ClusterFineTuneRuntime (cluster-scoped)."""
    kind, plural, short = ((CLUSTER_RUNTIME_KIND, CLUSTER_RUNTIME_PLURAL, CLUSTER_RUNTIME_SHORT_NAMES) if cluster
                           else (RUNTIME_KIND, RUNTIME_PLURAL, RUNTIME_SHORT_NAMES))
    model = ClusterFineTuneRuntimeSpec if cluster else FineTuneRuntimeSpec
    spec_schema = structural_schema(model.model_json_schema(by_alias=True, mode="validation"))
    _partial(spec_schema["properties"]["template"])
    scope = "for the whole cluster" if cluster else "for the jobs of its namespace"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower(),
                      "shortNames": list(short), "categories": ["ml"]},
            "scope": "Cluster" if cluster else "Namespaced",
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "additionalPrinterColumns": RUNTIME_PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": f"{kind}: defaults and limits a platform admin sets {scope}, so that a "
                    "FineTuneJob needs only its model, data and method (spec.runtimeRef names one).",
                    "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                   "metadata": {"type": "object"}, "spec": spec_schema},
                }},
            }],
        },
    }


def crd_yaml(obj: dict[str, Any] | None = None) -> str:
    """A CRD as the YAML file committed under crds/ and in the chart (default: the FineTuneJob's)."""
    header = "# Generated from the pydantic models by `finetune crd`; do not edit by hand.\n"
    return header + yaml.safe_dump(obj if obj is not None else crd(), sort_keys=False, width=120)


def _namespaced_runtime_crd() -> dict[str, Any]:
    return runtime_crd(cluster=False)


def _cluster_runtime_crd() -> dict[str, Any]:
    return runtime_crd(cluster=True)


CRD_FILES: dict[str, Callable[[], dict[str, Any]]] = {
    "finetunejob.yaml": crd, "finetuneruntime.yaml": _namespaced_runtime_crd,
    "clusterfinetuneruntime.yaml": _cluster_runtime_crd}


def all_crds_yaml() -> str:
    """Every CRD we serve, one YAML stream (`finetune crd | kubectl apply -f -`)."""
    return "---\n".join(crd_yaml(make()) for make in CRD_FILES.values())


def _default_into_description(node: dict[str, Any]) -> None:
    """A node's default, if any, said in its description instead of applied by the apiserver."""
    if "default" in node:
        shown = yaml.safe_dump(node.pop("default"), default_flow_style=True, width=1000).strip()
        node["description"] = f"{node.get('description', '').rstrip()} Default: {shown.removesuffix('...').strip()}."\
            .strip()


def _defaults_to_descriptions(node: dict[str, Any]) -> None:
    """Moves each property's default into its description (items keep theirs: a list is replaced whole)."""
    for prop in (node.get("properties") or {}).values():
        _default_into_description(prop)
        _defaults_to_descriptions(prop)


def _partial(node: dict[str, Any]) -> None:
    """Every field optional and no defaults: a template holds only what the admin wrote."""
    node.pop("required", None)
    _default_into_description(node)
    for prop in (node.get("properties") or {}).values():
        _partial(prop)


def structural_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Inlines every $ref and rewrites pydantic's JSON Schema into Kubernetes' structural subset."""
    return _convert(schema, schema.get("$defs", {}))


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").split("/")[-1]]
        node = {**target, **node}  # the referring field's description wins over the model's docstring
    if "anyOf" in node:
        # Optional[X]: keep X (an absent field is how Kubernetes says "unset"), then convert X itself.
        kept = _without_null(node.pop("anyOf"), defs)
        if node.get("default", 0) is None:
            node.pop("default")
        return _convert({**kept, **node}, defs)
    if YAML_FALSE_KEY in node:
        return _yaml_false_enum(node)
    out: dict[str, Any] = {}
    if "const" in node:
        out["enum"] = [node["const"]]
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "properties":
            out["properties"] = {k: _convert(v, defs) for k, v in value.items()}
        elif key == "items":
            out["items"] = _convert(value, defs)
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "default" and value is None:
            continue
        else:
            out[key] = value
    _type_free_form(node, out, defs)
    if "enum" in out and "type" not in out:
        out["type"] = _enum_type(out["enum"])
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in node:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _type_free_form(node: dict[str, Any], out: dict[str, Any], defs: dict[str, Any]) -> None:
    """Maps additionalProperties (dict[str, X]) and untyped values (Any) to what Kubernetes accepts."""
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and extra.get("type") in ("string", "integer", "number", "boolean"):
        out["additionalProperties"] = _convert(extra, defs)
    elif extra is not None and extra is not False:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "type" not in out and "properties" not in out and "enum" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True


def _yaml_false_enum(node: dict[str, Any]) -> dict[str, Any]:
    """An enum with `off` or `no` among its words: kubectl's YAML parser turns the unquoted word into false before
    the apiserver sees it, so a `type: string` schema would refuse what the docs show. The field is left untyped:
    the apiserver cannot check its words (a CEL rule cannot see an untyped field, not even from its parent, as
    tried on the real apiserver), so the operator's validation does (the job fails InvalidSpec naming the field
    and the words, as `finetune validate` does offline) and reads false as the word."""
    words = ", ".join(node["enum"])
    out = {k: v for k, v in node.items() if k in ("description", "default")}
    out["description"] = (f"{out.get('description', '')} One of: {words} (an unquoted {node[YAML_FALSE_KEY]}, "
                          f"which YAML reads as false, means {node[YAML_FALSE_KEY]}).").strip()
    out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _without_null(options: list[dict[str, Any]], defs: dict[str, Any]) -> dict[str, Any]:
    kept = [o for o in options if o.get("type") != "null"]
    if len(kept) != 1:
        raise ValueError(f"cannot express a union of {len(kept)} types in a structural schema: {kept}")
    return kept[0]


def _enum_type(values: list[Any]) -> str:
    if all(isinstance(v, bool) for v in values):
        return "boolean"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "integer"
    return "string"
