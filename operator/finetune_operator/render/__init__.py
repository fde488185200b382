"""Pure rendering: (validated spec, context) -> the Kubernetes objects of one attempt, as plain dicts.

No API client, no environment reads, no clock: the same inputs always give the same objects.
"""

from typing import Any

from ..api.spec import FineTuneJobSpec
from .configmap import render_config_map
from .context import RenderContext
from .rbac import render_rbac
from .service import render_service
from .workload import render_workload

__all__ = ["RenderContext", "render_all"]


def render_all(spec: FineTuneJobSpec, ctx: RenderContext) -> list[dict[str, Any]]:
    """Children in apply order: identity, config and Service exist before the pods that use them."""
    return [*render_rbac(spec, ctx), render_config_map(spec, ctx), render_service(spec, ctx),
            render_workload(spec, ctx)]
