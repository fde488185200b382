"""The headless Service that gives every trainer pod a stable DNS name for the rendezvous."""

from typing import Any

from ..api.constants import LABEL_JOB, RENDEZVOUS_PORT_NAME
from ..api.spec import FineTuneJobSpec
from .context import RenderContext
from .names import job_labels, service_name


def render_service(spec: FineTuneJobSpec, ctx: RenderContext) -> dict[str, Any]:
    """publishNotReadyAddresses: node 0 must resolve before it is Ready, or the other nodes wait on DNS forever."""
    port = spec.distributed.rendezvous_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service_name(ctx), "namespace": ctx.namespace, "labels": job_labels(ctx, "rendezvous")},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: ctx.name},
            "ports": [{"name": RENDEZVOUS_PORT_NAME, "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }
