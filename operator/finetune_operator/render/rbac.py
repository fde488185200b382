"""The trainer's identity: one ServiceAccount per namespace whose only right is to patch FineTuneJob status.

It is namespace infrastructure, shared by every FineTuneJob there and created once (not per job: three fewer
writes per submission, which matters at a thousand jobs a minute). What stops a trainer from writing another
job's status is the chart's ValidatingAdmissionPolicy (charts/finetunejob/templates/admission-policy.yaml): pod
tokens carry the pod's name, and a status write is admitted only for the FineTuneJob that pod belongs to.
"""

import hashlib
from typing import Any

from ..api import constants as c

TRAINER_IDENTITY = "finetunejob-trainer"


def trainer_binding_name(service_account: str) -> str:
    """One RoleBinding per ServiceAccount that runs trainers (ours, or a user's for workload identity)."""
    if service_account == TRAINER_IDENTITY:
        return TRAINER_IDENTITY
    name = f"{TRAINER_IDENTITY}-{service_account}"
    return name if len(name) <= 253 else f"{name[:240]}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


def render_trainer_identity(namespace: str, service_account: str | None) -> list[dict[str, Any]]:
    """ServiceAccount (unless the user brings one), Role and RoleBinding; identical for every job in `namespace`."""
    subject = service_account or TRAINER_IDENTITY
    labels = {c.LABEL_NAME: c.APP_NAME, c.LABEL_COMPONENT: "trainer-identity", c.LABEL_MANAGED_BY: c.MANAGED_BY,
              c.LABEL_PART_OF: c.APP_NAME}
    objects: list[dict[str, Any]] = []
    if service_account is None:
        objects.append({"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": subject, "namespace": namespace, "labels": labels}})
    objects += [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": TRAINER_IDENTITY, "namespace": namespace, "labels": labels},
         "rules": [{"apiGroups": [c.GROUP], "resources": [f"{c.PLURAL}/status"], "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": trainer_binding_name(subject), "namespace": namespace, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TRAINER_IDENTITY},
         "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": namespace}]},
    ]
    return objects
