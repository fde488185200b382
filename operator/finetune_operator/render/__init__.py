"""Pure rendering: (validated spec, context) -> the Kubernetes objects of one attempt, as plain dicts.

No API client, no environment reads, no clock: the same inputs always give the same objects.
"""

from typing import Any

from ..api.spec import FineTuneJobSpec
from .configmap import render_config_map
from .context import RenderContext
from .service import render_service
from .workload import render_workload

__all__ = ["RenderContext", "render_all"]


def render_all(spec: FineTuneJobSpec, ctx: RenderContext) -> list[dict[str, Any]]:
    """Children in apply order: the ConfigMap and Service exist before pods that mount and resolve them."""
    return [render_config_map(spec, ctx), render_service(spec, ctx), render_workload(spec, ctx)]
