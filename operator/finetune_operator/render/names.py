"""Names of the children and the labels that tie them to their FineTuneJob and attempt."""

from ..api import constants as c
from .context import RenderContext


def service_name(ctx: RenderContext) -> str:
    return ctx.name


def config_map_name(ctx: RenderContext) -> str:
    return f"{ctx.name}-config"


def workload_name(ctx: RenderContext) -> str:
    """One Indexed Job per attempt, so a gang restart is a fresh Job and old pods never collide with new ones."""
    return f"{ctx.name}-a{ctx.attempt}"


def master_address(ctx: RenderContext) -> str:
    """DNS name of node 0: Indexed Job pods get hostname <job>-<index> under the headless Service's subdomain.

    The attempt comes from the pod's own label ($(FINETUNE_ATTEMPT), expanded by the kubelet), so every attempt's
    containers are the same: Kueue then lets the next attempt take over the last one's admitted Workload."""
    return pod_address(ctx, "0")


def pod_address(ctx: RenderContext, index: str) -> str:
    """DNS name of the pod of completion index `index` (a number, or $(VAR) for the kubelet to expand)."""
    return f"{ctx.name}-a$({c.ENV_ATTEMPT})-{index}.{service_name(ctx)}.{ctx.namespace}.svc"


def job_labels(ctx: RenderContext, component: str) -> dict[str, str]:
    """Labels on every child: the recommended app.kubernetes.io set plus the job selector."""
    return {
        c.LABEL_NAME: c.APP_NAME,
        c.LABEL_INSTANCE: ctx.name,
        c.LABEL_COMPONENT: component,
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        c.LABEL_PART_OF: c.APP_NAME,
        c.LABEL_JOB: ctx.name,
    }


def attempt_labels(ctx: RenderContext, component: str) -> dict[str, str]:
    return {**job_labels(ctx, component), c.LABEL_ATTEMPT: str(ctx.attempt)}
