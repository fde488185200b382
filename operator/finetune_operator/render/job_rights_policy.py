"""The identity, the Secrets, the ConfigMaps and the NFS exports a FineTuneJob runs with, and a delete that would
leave its attempts running, as ValidatingAdmissionPolicies (api/job_rights.py says which fields count); generated
into the chart's templates/admission-policy-identity.yaml by ./hack/generate.sh.

The API server asks its own authorizer about the requesting user (CEL `authorizer`), so nothing depends on the
operator being up. An authorization check costs 350,000 of the 1,000,000 a CEL expression may spend and of the
10,000,000 one policy may spend on a request: a policy can make ~27 checks in all, 2 per expression. So each Secret
(ConfigMap) name is checked in a variable of its own, the names are made distinct first, and one check of the whole
namespace (a user who may get every Secret there) spares the rest: a job may name at most MAX_CHECKED distinct
Secrets (ConfigMaps) unless its user may read all of the namespace's.
"""

from typing import Any

import yaml

from ..api import constants as c
from ..api.job_rights import CONFIGMAP_REFERENCES, MOUNTS_NFS, SECRET_REFERENCES, watched_fields

RELEASE = "RELEASE-NAME"
IDENTITY_POLICY = f"{RELEASE}-job-identity"
SECRETS_POLICY = f"{RELEASE}-job-secrets"
CONFIGMAPS_POLICY = f"{RELEASE}-job-configmaps"
DELETION_POLICY = f"{RELEASE}-job-deletion"
MAX_CHECKED = 20
LABELS = "RELEASE-LABELS"  # the chart's labels, substituted by chart_template


def _differs(path: str) -> str:
    """CEL: the field at spec.`path` is not what it was (set or unset, or another value)."""
    parts = path.split(".")
    new = " && ".join(f"has(object.spec.{'.'.join(parts[:i + 1])})" for i in range(len(parts)))
    old = " && ".join(f"has(oldObject.spec.{'.'.join(parts[:i + 1])})" for i in range(len(parts)))
    return f"(({new}) != ({old}) || (({new}) && object.spec.{path} != oldObject.spec.{path}))"


def changed_variable() -> dict[str, str]:
    """Every watched field an update changes, by name (a create: the whole job)."""
    parts = " + ".join(f"({_differs(path)} ? ['spec.{path}'] : [])" for path in watched_fields())
    return {"name": "changed", "expression": f"request.operation == 'CREATE' ? ['spec'] : {parts}"}


def _authorizer(resource: str, verb: str, name: str | None = None) -> str:
    named = f".name({name})" if name is not None else ""
    return (f"authorizer.group('').resource('{resource}').namespace(request.namespace){named}.check('{verb}')"
            ".allowed()")


def _metadata(name: str) -> dict[str, Any]:
    return {"name": name, "labels": {LABELS: ""}}


def _policy(name: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    match = {"resourceRules": [{"apiGroups": [c.GROUP], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                                "resources": [c.PLURAL]}]}
    return [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
             "metadata": _metadata(name), "spec": {"failurePolicy": "Fail", "matchConstraints": match, **spec}},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
             "metadata": _metadata(name), "spec": {"policyName": name, "validationActions": ["Deny"]}}]


def identity_policy() -> list[dict[str, Any]]:
    """A job that runs as a ServiceAccount its user names, or mounts an NFS export: creating it, or changing what
    runs as it (with it)."""
    nfs = MOUNTS_NFS.format(o="object")
    right = ("' needs the right to create pods in ' + request.namespace + ', which ' + request.userInfo.username + "
             "' has not (a FineTuneJob does nothing you could not do directly). '")
    what = "(request.operation == 'CREATE' ? '{created}' : variables.changed.join(', ') + ': {changed}')"
    return _policy(IDENTITY_POLICY, {
        "matchConditions": [{"name": "runs-as-a-named-service-account-or-mounts-nfs",
                             "expression": f"(has(object.spec.pod) && has(object.spec.pod.serviceAccountName)) || "
                                           f"{nfs}"}],
        "variables": [changed_variable(), {"name": "mayCreatePods", "expression": _authorizer("pods", "create")}],
        "validations": [{
            "expression": "!(has(object.spec.pod) && has(object.spec.pod.serviceAccountName)) || "
                          "size(variables.changed) == 0 || variables.mayCreatePods",
            "messageExpression": (
                "(request.operation == 'CREATE' ? 'spec.pod.serviceAccountName: ' + object.spec.pod.serviceAccountName "
                "+ ': running a job as a ServiceAccount you choose' : variables.changed.join(', ') + ': changing "
                "what a job runs as ServiceAccount ' + object.spec.pod.serviceAccountName) + " + right + "+ 'Remove "
                "spec.pod.serviceAccountName to run as the trainer identity of the namespace, or ask an admin for "
                "that right'"),
            "reason": "Forbidden"}, {
            "expression": f"!{nfs} || size(variables.changed) == 0 || variables.mayCreatePods",
            "messageExpression": (
                what.format(created="spec.pod.volumes: mounting an NFS export",
                            changed="changing what a job runs with its NFS export") + " + " + right
                + "+ 'Mount the export through a PersistentVolumeClaim, or ask an admin for that right'"),
            "reason": "Forbidden"}],
    })


def references_policy(name: str, kind: str, resource: str, references: dict[str, str]) -> list[dict[str, Any]]:
    """A job naming objects of `resource` (Secrets, ConfigMaps) at `references`: creating it, or changing what runs
    with them, needs `get` on each."""
    sources = list(references.items())
    variables: list[dict[str, str]] = [changed_variable()]
    variables += [{"name": f"source{i}", "expression": expr.format(o="object")} for i, (_, expr) in enumerate(sources)]
    every = " + ".join(f"variables.source{i}" for i in range(len(sources)))
    variables.append({"name": "names", "expression": f"size(variables.changed) == 0 ? [] : {every}"})
    # Distinct names without CEL's lists library (Kubernetes 1.34+): each step takes the first name off and every
    # repeat of it.
    variables.append({"name": "rest0", "expression": "variables.names"})
    for k in range(1, MAX_CHECKED + 1):
        prev = f"variables.rest{k - 1}"
        variables.append({"name": f"rest{k}", "expression": f"size({prev}) == 0 ? [] : "
                                                             f"{prev}.filter(n, n != {prev}[0])"})
    variables.append({"name": "mayGetAll", "expression": _authorizer(resource, "get")})
    for k in range(MAX_CHECKED):
        rest = f"variables.rest{k}"
        variables.append({"name": f"may{k}", "expression": f"size({rest}) == 0 || variables.mayGetAll || "
                                                            f"{_authorizer(resource, 'get', f'{rest}[0]')}"})
    update = ("(request.operation == 'CREATE' ? '' : ' (the update changes ' + variables.changed.join(', ') + ', so "
              "the job would run anew with it)')")
    # One validation per name: a messageExpression cannot read a variable that asks the authorizer (it fails, and
    # the API server says only "failed expression"), so each message names its own object, and every other.
    validations = []
    for k in range(MAX_CHECKED):
        ref = f"variables.rest{k}[0]"
        fields = " + ".join(f"({ref} in variables.source{i} ? ['{path}'] : [])" for i, (path, _) in enumerate(sources))
        validations.append({
            "expression": f"variables.may{k}",
            "messageExpression": (
                f"({fields}).join(', ') + ': {kind} ' + {ref} + ': a job may name a {kind} only for a user who may "
                "get it, and ' + request.userInfo.username + ' may not get it in ' + request.namespace + "
                f"{update} + '; use {kind}s you may read, or ask an admin for the right to get them'"),
            "reason": "Forbidden"})
    validations.append({
        "expression": f"size(variables.rest{MAX_CHECKED}) == 0 || variables.mayGetAll",
        "messageExpression": (
            f"'the job names more than {MAX_CHECKED} distinct {kind}s (' + variables.names.join(', ') + "
            f"'): the API server checks at most {MAX_CHECKED} names one by one, and ' + request.userInfo.username + "
            f"' may not get every {kind} in ' + request.namespace + '. Name fewer {kind}s (several keys of one "
            f"{kind} count once)'"),
        "reason": "Forbidden"})
    # Most jobs name none: the policy is then not evaluated at all.
    names_any = " || ".join(f"size({expr.format(o='object')}) > 0" for _, expr in sources)
    return _policy(name, {"matchConditions": [{"name": f"names-{resource}", "expression": names_any}],
                          "variables": variables, "validations": validations})


def secrets_policy() -> list[dict[str, Any]]:
    return references_policy(SECRETS_POLICY, "Secret", "secrets", SECRET_REFERENCES)


def configmaps_policy() -> list[dict[str, Any]]:
    return references_policy(CONFIGMAPS_POLICY, "ConfigMap", "configmaps", CONFIGMAP_REFERENCES)


ORPHANING = ("has(request.options) && ((has(request.options.propagationPolicy) && "
             "request.options.propagationPolicy == 'Orphan') || (has(request.options.orphanDependents) && "
             "request.options.orphanDependents))")


def deletion_policy() -> list[dict[str, Any]]:
    """A delete that would orphan a job's attempts (propagationPolicy Orphan, the deprecated orphanDependents, or
    the `orphan` finalizer set beforehand) is refused: the attempt would run on with nothing watching it, as the
    trainer identity and with what its runtime lent, past the job's deadline. Cluster admins (system:masters) may."""
    docs = _policy(DELETION_POLICY, {
        "matchConditions": [{"name": "not-a-cluster-admin",
                             "expression": "!('system:masters' in request.userInfo.groups)"}],
        "validations": [{
            "expression": f"request.operation != 'DELETE' || !({ORPHANING})",
            "message": "deleting a FineTuneJob with propagationPolicy Orphan would leave its attempt running, "
                       "unmanaged and past its deadline: delete it with the default (background) or foreground "
                       "propagation (`kubectl delete ftj NAME`, not --cascade=orphan)",
            "reason": "Forbidden"}, {
            "expression": "request.operation == 'DELETE' || !(has(object.metadata.finalizers) && 'orphan' in "
                          "object.metadata.finalizers) || (request.operation == 'UPDATE' && "
                          "has(oldObject.metadata.finalizers) && 'orphan' in oldObject.metadata.finalizers)",
            "message": "metadata.finalizers: the orphan finalizer would leave the job's attempt running, unmanaged "
                       "and past its deadline, when the job is deleted: remove it",
            "reason": "Forbidden"}]})
    docs[0]["spec"]["matchConstraints"]["resourceRules"][0]["operations"] = ["CREATE", "UPDATE", "DELETE"]
    return docs


def chart_template() -> str:
    """templates/admission-policy-identity.yaml of the chart."""
    docs = identity_policy() + secrets_policy() + configmaps_policy() + deletion_policy()
    body = "---\n".join(yaml.safe_dump(doc, sort_keys=False, width=120) for doc in docs)
    body = body.replace(f"    {LABELS}: ''\n", '    {{- include "finetunejob.labels" . | nindent 4 }}\n')
    return ("# Generated from finetune_operator/render/job_rights_policy.py by ./hack/generate.sh; do not edit by "
            "hand.\n" + body.replace(RELEASE, "{{ .Release.Name }}"))
