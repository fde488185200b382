"""A ValidatingAdmissionPolicy that refuses the Jobs of one attempt in one namespace: what a cluster's policy engine
(Gatekeeper, Kyverno, a webhook) does to a Job it does not allow, on the real apiserver."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from finetune_operator.api import constants as c

MESSAGE = "refused by the cluster's policy"


@contextmanager
def refusing_attempt(kubectl: Any, namespace: str, attempt: int, timeout: float = 30.0) -> Iterator[str]:
    """While inside, the apiserver refuses to create Jobs labelled with `attempt` in `namespace`; the policy is
    in force (a dry-run Job is refused) before this yields, and gone after."""
    name = f"refuse-{namespace}"[:63]
    label = c.LABEL_ATTEMPT
    kubectl.run("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": name}, "spec": {
             "failurePolicy": "Fail",
             "matchConstraints": {"resourceRules": [{"apiGroups": ["batch"], "apiVersions": ["v1"],
                                                     "operations": ["CREATE"], "resources": ["jobs"]}]},
             "validations": [{"expression": f"!has(object.metadata.labels) || !('{label}' in object.metadata.labels)"
                                            f" || object.metadata.labels['{label}'] != '{attempt}'",
                              "message": MESSAGE, "reason": "Forbidden"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": name}, "spec": {
             "policyName": name, "validationActions": ["Deny"],
             "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}}},
    ]}))
    probe = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "probe", "namespace": namespace,
                                                                    "labels": {label: str(attempt)}},
             "spec": {"template": {"spec": {"restartPolicy": "Never",
                                            "containers": [{"name": "c", "image": "busybox"}]}}}}
    deadline = time.monotonic() + timeout
    while MESSAGE not in kubectl.run("create", "--dry-run=server", "-f", "-", input=json.dumps(probe),
                                     check=False).stderr:
        assert time.monotonic() < deadline, f"the policy {name} was never enforced"
        time.sleep(0.3)
    try:
        yield name
    finally:
        kubectl.run("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name,
                    "--ignore-not-found")
