"""The runtimes' limits as ValidatingAdmissionPolicies: the API server refuses a FineTuneJob that breaks its runtime's
limits at `kubectl apply`, whether or not the operator is up. Generated into the chart (./hack/generate.sh) from the
same tables as the operator's own check (api/runtime.py), so both say the same thing.

One policy per runtime kind, its params every runtime of that kind (a binding with an empty selector; namespaced
runtimes are looked up in the job's namespace). Each validation first asks whether the runtime applies to the job:
the one spec.runtimeRef names, or (no runtimeRef) a default one. Values a job leaves out are taken from that
runtime's template, then from the built-in default, as the operator does. When a namespace default is layered over
the cluster default, each policy sees its own runtime's template only: the operator checks the layered result again
before anything runs.
"""

from typing import Any

import yaml

from ..api import constants as c
from ..api.runtime import LOCKABLE

# Names under the release's (the chart substitutes RELEASE): two releases (watchNamespaces) must not collide.
RELEASE = "RELEASE-NAME"
POLICY_NAME = {c.CLUSTER_RUNTIME_KIND: f"{RELEASE}-cluster-runtime-limits",
               c.RUNTIME_KIND: f"{RELEASE}-runtime-limits"}
QUEUE_LABEL = c.LABEL_KUEUE_QUEUE


def _has(root: str, path: str) -> str:
    parts = path.split(".")
    return " && ".join(f"has({root}.{'.'.join(parts[:i + 1])})" for i in range(len(parts)))


def _value(path: str, default: str) -> str:
    """The job's value, else the runtime template's, else the built-in default."""
    return (f"(({_has('object.spec', path)}) ? object.spec.{path} : "
            f"(({_has('params.spec.template', path)}) ? params.spec.template.{path} : {default}))")


def _limit(name: str) -> str:
    return f"(has(params.spec.limits) && has(params.spec.limits.{name}))"


def _who(kind: str) -> str:
    return f"'{kind} ' + params.metadata.name"


def validations(kind: str) -> list[dict[str, str]]:
    """The CEL validations of one kind's policy: every lock and every limit."""
    who = _who(kind)
    out = []
    for path, what in LOCKABLE.items():
        if path == "queueName":
            given, where = f"has(object.metadata.labels) && '{QUEUE_LABEL}' in object.metadata.labels", \
                f"metadata.labels.{QUEUE_LABEL}"
        else:
            given, where = _has("object.spec", path), f"spec.{path}"
        out.append({
            "expression": f"!variables.applies || !({_limit('locked')} && '{path}' in params.spec.limits.locked) "
                          f"|| !({given})",
            "messageExpression": f"'{where}: {what} is locked by ' + {who} + ' (limits.locked): remove {where}, "
                                 "the runtime sets it'",
            "reason": "Forbidden"})
    limits = [
        ("maxNodes", "variables.nodes <= params.spec.limits.maxNodes",
         f"'spec.distributed.numNodes is ' + string(variables.nodes) + ': ' + {who} + ' allows limits.maxNodes = ' "
         "+ string(params.spec.limits.maxNodes) + '; ask for fewer nodes, or use another runtime'"),
        ("maxGpusPerJob", "variables.nodes * variables.gpusPerNode <= params.spec.limits.maxGpusPerJob",
         "'spec.distributed asks for ' + string(variables.nodes) + ' nodes x ' + string(variables.gpusPerNode) + "
         f"' GPUs = ' + string(variables.nodes * variables.gpusPerNode) + ': ' + {who} + ' allows "
         "limits.maxGpusPerJob = ' + string(params.spec.limits.maxGpusPerJob) + '; ask for fewer GPUs, or use "
         "another runtime'"),
        ("allowedMethods", "variables.method in params.spec.limits.allowedMethods",
         f"'spec.method.type is ' + variables.method + ': ' + {who} + ' allows limits.allowedMethods ' + "
         "params.spec.limits.allowedMethods.join(', ')"),
        ("allowedStrategies", "variables.strategy in params.spec.limits.allowedStrategies",
         f"'spec.distributed.strategy is ' + variables.strategy + ': ' + {who} + ' allows limits.allowedStrategies "
         "' + params.spec.limits.allowedStrategies.join(', ')"),
        ("allowedModelSources", "params.spec.limits.allowedModelSources.exists(p, object.spec.model.name."
         "startsWith(p))",
         f"'spec.model.name is ' + object.spec.model.name + ': ' + {who} + ' allows limits.allowedModelSources ' "
         "+ params.spec.limits.allowedModelSources.join(', ') + '; use a model under one of those prefixes'"),
        ("allowedDataSources", "variables.dataSources.all(s, params.spec.limits.allowedDataSources.exists(p, "
         "s.startsWith(p)))",
         "'spec.data uses ' + variables.dataSources.filter(s, !params.spec.limits.allowedDataSources.exists(p, "
         f"s.startsWith(p))).join(', ') + ': ' + {who} + ' allows limits.allowedDataSources ' + "
         "params.spec.limits.allowedDataSources.join(', ') + '; use data under one of those prefixes'"),
        ("allowedClaims", "variables.claims.all(n, n in params.spec.limits.allowedClaims)",
         "'spec mounts the claim(s) ' + variables.claims.filter(n, !(n in params.spec.limits.allowedClaims))"
         f".join(', ') + ': ' + {who} + ' allows limits.allowedClaims ' + "
         "params.spec.limits.allowedClaims.join(', ') + '; mount one of those claims'"),
        ("maxActiveDeadlineSeconds", "variables.deadline > 0 && variables.deadline <= "
         "params.spec.limits.maxActiveDeadlineSeconds",
         "'spec.runPolicy.activeDeadlineSeconds is ' + (variables.deadline > 0 ? string(variables.deadline) : "
         f"'unset') + ': ' + {who} + ' allows limits.maxActiveDeadlineSeconds = ' + "
         "string(params.spec.limits.maxActiveDeadlineSeconds) + '; set it to at most that'"),
    ]
    for name, holds, message in limits:
        out.append({"expression": f"!variables.applies || !{_limit(name)} || ({holds})",
                    "messageExpression": message, "reason": "Forbidden"})
    return out


def _sources(section: str) -> str:
    paths = f"object.spec.data.{section}.filter(s, has(s.path)).map(s, s.path)"
    hubs = f"object.spec.data.{section}.filter(s, has(s.hub)).map(s, s.hub.name)"
    return f"{paths} + {hubs}"


def variables(kind: str) -> list[dict[str, str]]:
    applies = (f"has(object.spec.runtimeRef) ? (object.spec.runtimeRef.name == params.metadata.name && "
               f"(has(object.spec.runtimeRef.kind) ? object.spec.runtimeRef.kind : "
               f"'{c.CLUSTER_RUNTIME_KIND}') == '{kind}') : (has(params.spec.default) && params.spec.default)")
    return [
        {"name": "applies", "expression": applies},
        {"name": "nodes", "expression": _value("distributed.numNodes", "1")},
        {"name": "gpusPerNode", "expression": _value("distributed.gpusPerNode", "1")},
        {"name": "strategy", "expression": _value("distributed.strategy", "'ddp'")},
        {"name": "method", "expression": "(has(object.spec.method) && has(object.spec.method.type)) ? "
                                         "object.spec.method.type : 'lora'"},
        {"name": "deadline", "expression": _value("runPolicy.activeDeadlineSeconds", "0")},
        {"name": "claims", "expression": f"({_has('object.spec', 'output.claimName')} ? [object.spec.output.claimName] "
                                         f": ({_has('params.spec.template', 'output.claimName')} ? "
                                         "[params.spec.template.output.claimName] : [])) + "
                                         f"{_value('pod.volumes', '[]')}.filter(v, has(v.claimName))"
                                         ".map(v, v.claimName)"},
        {"name": "dataSources", "expression": f"{_sources('train')} + (has(object.spec.data.validation) ? "
                                              f"{_sources('validation')} : [])"},
    ]


def policies() -> list[dict[str, Any]]:
    """Both policies and their bindings, as the chart installs them."""
    docs: list[dict[str, Any]] = []
    for kind, name in POLICY_NAME.items():
        docs.append({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "paramKind": {"apiVersion": c.API_VERSION, "kind": kind},
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [c.GROUP], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                    "resources": [c.PLURAL]}]},
                "variables": variables(kind),
                "validations": validations(kind),
            }})
        docs.append({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"],
                     # Every runtime of the kind is a param; each validation picks the one(s) that apply. No
                     # runtime at all: nothing to check.
                     "paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"}}})
    return docs


def chart_template() -> str:
    """templates/admission-policy-runtimes.yaml of the chart (on unless runtimes.limitsAtAdmission is false)."""
    body = "---\n".join(yaml.safe_dump(doc, sort_keys=False, width=120) for doc in policies())
    return ("# Generated from finetune_operator/render/runtime_policy.py by ./hack/generate.sh; do not edit by hand.\n"
            "{{- if .Values.runtimes.limitsAtAdmission }}\n" + body.replace(RELEASE, "{{ .Release.Name }}")
            + "{{- end }}\n")
