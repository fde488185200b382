"""The trainer's identity: a ServiceAccount whose only right is to patch its own FineTuneJob's status.

The Role names the one FineTuneJob in resourceNames and grants only the status subresource, so a trainer can
report progress but cannot touch its spec, another job, or anything else in the namespace.
"""

from typing import Any

from ..api.constants import GROUP, PLURAL
from ..api.spec import FineTuneJobSpec
from .context import RenderContext
from .names import job_labels, trainer_role_name, trainer_service_account


def render_rbac(spec: FineTuneJobSpec, ctx: RenderContext) -> list[dict[str, Any]]:
    labels = job_labels(ctx, "trainer-identity")
    meta = {"name": trainer_role_name(ctx), "namespace": ctx.namespace, "labels": labels}
    subject = spec.pod.service_account_name or trainer_service_account(ctx)
    objects: list[dict[str, Any]] = []
    if not spec.pod.service_account_name:
        objects.append({"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": subject, "namespace": ctx.namespace, "labels": labels}})
    objects += [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [{"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "resourceNames": [ctx.name],
                    "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": trainer_role_name(ctx)},
         "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": ctx.namespace}]},
    ]
    return objects
