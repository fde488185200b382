"""Pure rendering: (validated spec, context) -> the Kubernetes objects of one attempt, as plain dicts.

No API client, no environment reads, no clock: the same inputs always give the same objects.
"""

from typing import Any

from ..api.spec import FineTuneJobSpec
from .configmap import render_config_map
from .context import RenderContext
from .network_policy import render_network_policy
from .rbac import render_job_identity, render_trainer_identity
from .service import render_service
from .workload import render_workload

__all__ = ["RenderContext", "render_all", "render_trainer_identity"]


def render_all(spec: FineTuneJobSpec, ctx: RenderContext) -> list[dict[str, Any]]:
    """The attempt's children in apply order: config, Service and a user ServiceAccount's status rights exist before
    the pods that use them.

    The shared trainer identity (no spec.pod.serviceAccountName) is namespace infrastructure:
    render_trainer_identity."""
    policy = [render_network_policy(spec, ctx)] if ctx.network_policy else []
    return [render_config_map(spec, ctx), render_service(spec, ctx), *render_job_identity(spec, ctx), *policy,
            render_workload(spec, ctx)]
