"""The gang's NetworkPolicy (when the operator runs with networkPolicy.enabled): its pods take ingress only from
the pods of the same FineTuneJob (the rendezvous and the collectives); egress is left to the user's own policies
(model and data downloads, object storage, trackers)."""

from typing import Any

from ..api.constants import LABEL_JOB
from ..api.spec import FineTuneJobSpec
from .context import RenderContext
from .names import job_labels, service_name


def render_network_policy(spec: FineTuneJobSpec, ctx: RenderContext) -> dict[str, Any]:
    own = {"matchLabels": {LABEL_JOB: ctx.name}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": service_name(ctx), "namespace": ctx.namespace, "labels": job_labels(ctx, "network")},
        "spec": {"podSelector": own, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": own}]}]},
    }
