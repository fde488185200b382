"""The trainer's identity: one ServiceAccount per namespace whose only right is to patch FineTuneJob status, or a
user's ServiceAccount allowed to patch its own job's status only. Patch, not get: a get of the status subresource
returns the whole object, spec included, of any job in the namespace (the trainer never reads its job; the answer to
its own patch is its own job, which it was started with).

It is namespace infrastructure, shared by every FineTuneJob there and created once (not per job: three fewer
writes per submission, which matters at a thousand jobs a minute). What stops a trainer from writing another
job's status is the chart's ValidatingAdmissionPolicy (charts/finetunejob/templates/admission-policy.yaml): pod
tokens carry the pod's name, and a status write is admitted only for the FineTuneJob that pod belongs to.
"""

from typing import Any

from ..api import constants as c
from ..api.spec import FineTuneJobSpec
from .context import RenderContext
from .names import job_labels

TRAINER_IDENTITY = "finetunejob-trainer"
_STATUS_RULE = {"apiGroups": [c.GROUP], "resources": [f"{c.PLURAL}/status"], "verbs": ["patch"]}


def render_trainer_identity(namespace: str, service_account: str | None) -> list[dict[str, Any]]:
    """The namespace's shared ServiceAccount, Role and RoleBinding, for jobs that bring no ServiceAccount of their
    own (identical for every such job in `namespace`); nothing for a job that does (render_job_identity)."""
    if service_account is not None:
        return []
    labels = {c.LABEL_NAME: c.APP_NAME, c.LABEL_COMPONENT: "trainer-identity", c.LABEL_MANAGED_BY: c.MANAGED_BY,
              c.LABEL_PART_OF: c.APP_NAME}
    meta = {"name": TRAINER_IDENTITY, "namespace": namespace, "labels": labels}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": [_STATUS_RULE]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TRAINER_IDENTITY},
         "subjects": [{"kind": "ServiceAccount", "name": TRAINER_IDENTITY, "namespace": namespace}]},
    ]


def render_job_identity(spec: FineTuneJobSpec, ctx: RenderContext) -> list[dict[str, Any]]:
    """A user's ServiceAccount (spec.pod.serviceAccountName, e.g. for workload identity to object storage) may
    patch the status of this job only (resourceNames), through a Role and RoleBinding that are the job's children:
    they go with the job, instead of a namespace-wide binding that outlived every job that used it."""
    account = spec.pod.service_account_name
    if account is None:
        return []
    meta = {"name": f"{TRAINER_IDENTITY}-{ctx.name}", "namespace": ctx.namespace,
            "labels": job_labels(ctx, "trainer-identity")}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [{**_STATUS_RULE, "resourceNames": [ctx.name]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": meta["name"]},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ctx.namespace}]},
    ]
