"""The identity and the Secrets a FineTuneJob runs with, as ValidatingAdmissionPolicies (api/job_rights.py says
which fields count); generated into the chart's templates/admission-policy-identity.yaml by ./hack/generate.sh.

The API server asks its own authorizer about the requesting user (CEL `authorizer`), so nothing depends on the
operator being up. An authorization check costs 350,000 of the 1,000,000 a CEL expression may spend and of the
10,000,000 one policy may spend on a request: a policy can make ~27 checks in all, 2 per expression. So each Secret
name is checked in a variable of its own, the names are made distinct first, and one check of the whole namespace
(a user who may get every Secret there) spares the rest: a job may name at most MAX_CHECKED_SECRETS distinct
Secrets unless its user may read all of the namespace's.
"""

from typing import Any

import yaml

from ..api import constants as c
from ..api.job_rights import SECRET_REFERENCES, watched_fields

RELEASE = "RELEASE-NAME"
IDENTITY_POLICY = f"{RELEASE}-job-identity"
SECRETS_POLICY = f"{RELEASE}-job-secrets"
MAX_CHECKED_SECRETS = 20
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
    """A job that runs as a ServiceAccount its user names: creating it, or changing what runs as it."""
    return _policy(IDENTITY_POLICY, {
        "matchConditions": [{"name": "runs-as-a-named-service-account",
                             "expression": "has(object.spec.pod) && has(object.spec.pod.serviceAccountName)"}],
        "variables": [changed_variable()],
        "validations": [{
            "expression": f"size(variables.changed) == 0 || {_authorizer('pods', 'create')}",
            "messageExpression": (
                "(request.operation == 'CREATE' ? 'spec.pod.serviceAccountName: ' + object.spec.pod.serviceAccountName "
                "+ ': running a job as a ServiceAccount you choose' : variables.changed.join(', ') + ': changing "
                "what a job runs as ServiceAccount ' + object.spec.pod.serviceAccountName) + ' needs the right to "
                "create pods in ' + request.namespace + ', which ' + request.userInfo.username + ' has not (a "
                "FineTuneJob does nothing you could not do directly). Remove spec.pod.serviceAccountName to run as "
                "the trainer identity of the namespace, or ask an admin for that right'"),
            "reason": "Forbidden"}],
    })


def secrets_policy() -> list[dict[str, Any]]:
    """A job naming Secrets: creating it, or changing what runs with them, needs `get` on each."""
    sources = list(SECRET_REFERENCES.items())
    variables: list[dict[str, str]] = [changed_variable()]
    variables += [{"name": f"source{i}", "expression": expr.format(o="object")} for i, (_, expr) in enumerate(sources)]
    every = " + ".join(f"variables.source{i}" for i in range(len(sources)))
    variables.append({"name": "names", "expression": f"size(variables.changed) == 0 ? [] : {every}"})
    # Distinct names without CEL's lists library (Kubernetes 1.34+): each step takes the first name off and every
    # repeat of it.
    variables.append({"name": "rest0", "expression": "variables.names"})
    for k in range(1, MAX_CHECKED_SECRETS + 1):
        prev = f"variables.rest{k - 1}"
        variables.append({"name": f"rest{k}", "expression": f"size({prev}) == 0 ? [] : "
                                                             f"{prev}.filter(n, n != {prev}[0])"})
    variables.append({"name": "mayGetAll", "expression": _authorizer("secrets", "get")})
    for k in range(MAX_CHECKED_SECRETS):
        rest = f"variables.rest{k}"
        variables.append({"name": f"may{k}", "expression": f"size({rest}) == 0 || variables.mayGetAll || "
                                                            f"{_authorizer('secrets', 'get', f'{rest}[0]')}"})
    update = ("(request.operation == 'CREATE' ? '' : ' (the update changes ' + variables.changed.join(', ') + ', so "
              "the job would run anew with it)')")
    # One validation per name: a messageExpression cannot read a variable that asks the authorizer (it fails, and
    # the API server says only "failed expression"), so each message names its own Secret, and every other.
    validations = []
    for k in range(MAX_CHECKED_SECRETS):
        name = f"variables.rest{k}[0]"
        fields = " + ".join(f"({name} in variables.source{i} ? ['{path}'] : [])" for i, (path, _) in enumerate(sources))
        validations.append({
            "expression": f"variables.may{k}",
            "messageExpression": (
                f"({fields}).join(', ') + ': Secret ' + {name} + ': a job may name a Secret only for a user who may "
                "get it, and ' + request.userInfo.username + ' may not get it in ' + request.namespace + "
                f"{update} + '; use Secrets you may read, or ask an admin for the right to get them'"),
            "reason": "Forbidden"})
    validations.append({
        "expression": f"size(variables.rest{MAX_CHECKED_SECRETS}) == 0 || variables.mayGetAll",
        "messageExpression": (
            f"'the job names more than {MAX_CHECKED_SECRETS} distinct Secrets (' + variables.names.join(', ') + "
            "'): the API server checks at most " + str(MAX_CHECKED_SECRETS) + " names one by one, and ' + "
            "request.userInfo.username + ' may not get every Secret in ' + request.namespace + '. Name fewer "
            "Secrets (several keys of one Secret count once)'"),
        "reason": "Forbidden"})
    return _policy(SECRETS_POLICY, {"variables": variables, "validations": validations})


def chart_template() -> str:
    """templates/admission-policy-identity.yaml of the chart."""
    docs = identity_policy() + secrets_policy()
    body = "---\n".join(yaml.safe_dump(doc, sort_keys=False, width=120) for doc in docs)
    body = body.replace(f"    {LABELS}: ''\n", '    {{- include "finetunejob.labels" . | nindent 4 }}\n')
    return ("# Generated from finetune_operator/render/job_rights_policy.py by ./hack/generate.sh; do not edit by "
            "hand.\n" + body.replace(RELEASE, "{{ .Release.Name }}"))
