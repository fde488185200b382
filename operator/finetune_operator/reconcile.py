"""One reconcile pass: read -> validate -> plan -> write status once -> act on children -> post Events."""

import logging
from datetime import datetime, timezone
from typing import Any, Callable

from .api.errors import InvalidSpec
from .kube import Kube
from .lifecycle import OPERATOR_STATUS_FIELDS, Observed, Plan, Settings, plan
from .observed import attempt_of
from .render import RenderContext, render_all
from .validation import validate_job

log = logging.getLogger(__name__)
EventSink = Callable[[dict[str, Any], str, str, str], None]


def reconcile(kube: Kube, namespace: str, name: str, settings: Settings, trainer_image: str,
              post_event: EventSink) -> Plan | None:
    obj = kube.get_finetunejob(namespace, name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None
    try:
        job: Any = validate_job(obj)
    except InvalidSpec as exc:
        job = exc
    status = obj.get("status") or {}
    attempt = status.get("attempt") or 0
    pods = kube.list_pods(namespace, name)
    current = [p for p in pods if attempt_of(p) == attempt]
    observed = Observed(
        name=name, namespace=namespace, generation=obj["metadata"].get("generation", 0),
        labels=obj["metadata"].get("labels") or {}, status=status,
        workloads=kube.list_workloads(namespace, name), pods=current, now=datetime.now(timezone.utc),
        old_pods=sum(1 for p in pods if (attempt_of(p) or 0) < attempt),
    )
    result = plan(job, observed, settings)
    # Status first: if the operator dies after it, the next pass already knows the attempt it moved to.
    if result.status != {k: status.get(k) for k in OPERATOR_STATUS_FIELDS if status.get(k) is not None}:
        kube.patch_status(namespace, name, result.status)
    for workload in result.delete_workloads:
        kube.delete_workload(namespace, workload)
    if result.suspend_workload is not None:
        kube.set_suspend(namespace, *result.suspend_workload)
    if result.create_attempt is not None and not isinstance(job, InvalidSpec):
        ctx = RenderContext(name=name, namespace=namespace, attempt=result.create_attempt,
                            trainer_image=trainer_image, job_labels=observed.labels, resume_from=result.resume_from)
        for child in render_all(job.spec, ctx):
            kube.apply(child, obj)
    for event in result.events:
        post_event(obj, event.type, event.reason, event.message)
    if result.delete_job:
        kube.delete_finetunejob(namespace, name)
    return result
