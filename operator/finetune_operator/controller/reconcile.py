"""One reconcile pass: cached view -> validate -> plan -> write status once -> act on children -> post Events.

Reads come from the watch caches (cache.Snapshot), never from the API, so a pass with nothing to do costs no
request. The status write carries the resourceVersion the plan was made from: if the cache was stale (our own
last write, or the trainer's progress, not yet seen) the apiserver answers 409 and the pass plans again from a
fresh read, so a restart is never counted twice and no update is lost.
"""

import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from ..api import constants as c
from ..api import exit_codes
from ..api.errors import InvalidSpec
from ..api.validation import validate_job
from ..render import RenderContext, render_all, render_trainer_identity
from ..render.preflight import PREFLIGHT_ATTEMPT, render_preflight
from .cache import Snapshot
from .expectations import Expectations
from .in_place import pods_needed
from .kube import Kube, NameConflict
from .lifecycle import plan
from .merge_patch import merge_patch
from .observed import (
    ATTEMPT_REFUSED,
    NAME_CONFLICT,
    attempt_of,
    attempt_pods,
    job_failed,
    job_succeeded,
    pod_ended,
)
from .planning import OPERATOR_STATUS_FIELDS, Event, Observed, Plan, only_cosmetic
from .runtimes import resolve
from .settings import Settings
from .waiting import gang_waiting

log = logging.getLogger(__name__)
EventSink = Callable[[dict[str, Any], str, str, str], None]
CONFLICT_RETRIES = 3
# The trainer identity is shared by a namespace's jobs and not watched: re-applied at most this often, and when the
# last job of its namespace is deleted (runner.py), so a namespace deleted and created again gets it back.
IDENTITY_TTL_SECONDS = 300.0
# A node count changing alone is written at most this often per job (phase changes are written at once).
COSMETIC_DELAY_SECONDS = 3.0
# The apiserver's answers to a child it will not create (admission policy or webhook, ResourceQuota, invalid):
# said in the status, and retried.
REFUSALS = (400, 403, 422)
# A name clash is someone's object under a child's name: looked at again this often (it goes away when its owner
# renames or deletes it), never forced.
NAME_CONFLICT_RETRY_SECONDS = 15.0
# The apiserver's answer in a status message: a refused Job can come back as a 10,000-character struct dump.
REFUSAL_MESSAGE_LIMIT = 600


@dataclass
class Pass:
    plan: Plan | None  # None: the FineTuneJob is gone or being deleted
    written: dict[str, Any] | None = None  # the FineTuneJob as our status write left it
    replaced: str | None = None  # the resourceVersion that write replaced
    goodput_before: dict[str, Any] | None = None  # status.goodput of the object that write replaced


def reconcile(kube: Kube, view: Snapshot, settings: Settings, post_event: EventSink,
              expectations: Expectations) -> Pass:
    obj = view.finetunejob
    written = replaced = None
    for _ in range(CONFLICT_RETRIES):
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return Pass(None)
        view = own_attempts(view, obj["metadata"]["uid"])
        job, result = _plan(kube, obj, view, settings, expectations.refused.get((view.namespace, view.name)))
        status = obj.get("status") or {}
        current = {k: status.get(k) for k in OPERATOR_STATUS_FIELDS if status.get(k) is not None}
        if result.status == current:
            break
        cosmetic = ("cosmetic-status", view.namespace, view.name)
        if only_cosmetic(current, result.status) and expectations.pending(cosmetic):
            result.requeue(COSMETIC_DELAY_SECONDS)  # written with the next change, or by this look again
            break
        try:
            # Status first: if the operator dies after it, the next pass already knows the attempt it moved to.
            replaced = obj["metadata"]["resourceVersion"]
            written = kube.patch_status(view.namespace, view.name, merge_patch(current, result.status), replaced)
            expectations.record(cosmetic, COSMETIC_DELAY_SECONDS)
            break
        except ApiException as exc:
            if exc.status != 409:
                raise
            obj = kube.get_finetunejob(view.namespace, view.name)
    else:
        raise ApiException(status=409, reason=f"status of {view.namespace}/{view.name} kept changing")
    try:
        _act(kube, obj, job, result, view, settings, expectations)
    finally:  # the status is written: its Events go out even when an action failed (and is retried)
        for event in result.events:
            post_event(obj, event.type, event.reason, event.message)
    before = (obj.get("status") or {}).get("goodput") if written is not None else None
    return Pass(result, written, replaced, before)


def own_attempts(view: Snapshot, uid: str) -> Snapshot:
    """Only the Jobs this FineTuneJob (this UID) created: a Job labelled as ours by someone else, or one left by an
    earlier FineTuneJob of the same name, is no attempt of this one (its name then clashes: NameConflict)."""
    return replace(view, workloads=[w for w in view.workloads if w["metadata"].get("owner") == uid])


def _plan(kube: Kube, obj: dict[str, Any], view: Snapshot, settings: Settings,
          refused: tuple[int, str, str] | None = None) -> tuple[Any, Plan]:
    runtime = resolve(kube, obj, view.workloads)
    try:
        job: Any = validate_job(runtime.obj)
        if runtime.errors:
            job = InvalidSpec(runtime.errors)
    except InvalidSpec as exc:
        job = InvalidSpec(runtime.errors + exc.errors)
    status = obj.get("status") or {}
    attempt = status.get("attempt") or 0
    # The preflight (attempt 0) is looked at like the current attempt as long as it decides what happens next.
    looked_at = (attempt, 0) if status.get("preflight") in (None, "Running") else (attempt,)
    now = datetime.now(UTC)
    current = next((w for w in view.workloads if attempt_of(w) == attempt), None)
    waiting = current is not None and gang_waiting(current, now)
    pods = view.pods
    if pods is None:
        # Pods matter only when an attempt failed (which node, which exit code), a restart waits for the old gang
        # to stop, or a gang waits (why); everything else is in the Job's status. One list then, instead of a
        # watch on every pod of the cluster.
        current_failed = any(job_failed(w) for w in view.workloads if attempt_of(w) in looked_at)
        # A preflight that just passed: its pod's termination message carries the memory estimate for the status.
        preflight_passed = status.get("preflight") == "Running" and any(
            job_succeeded(w) for w in view.workloads if attempt_of(w) == 0)
        lost = current is not None and pods_needed(current, status)  # a pod of an attempt in place failed
        pods = kube.list_pods(view.namespace, view.name) if current_failed or waiting or preflight_passed or lost \
            or status.get("phase") == "Restarting" else []
    pods = attempt_pods(pods, view.name, obj["metadata"]["uid"], view.workloads,
                        lambda job: kube.job_controllers(view.namespace, job))
    events = kube.list_job_events(view.namespace, current["metadata"]["name"]) if waiting and current else []
    # A new job asking for GPUs: does any node have that many? (A Warning at once instead of a wait.)
    gpus = job.spec.distributed.gpus_per_node if not isinstance(job, InvalidSpec) else 0
    first = bool(gpus) and not attempt  # what the cluster can ever give this gang: read once, for a new job
    nodes = kube.node_shapes() if first else None
    quotas = kube.resource_quotas(view.namespace) if first else None
    observed = Observed(
        name=view.name, namespace=view.namespace, generation=obj["metadata"].get("generation", 0),
        labels=runtime.obj["metadata"].get("labels") or {}, status=status, workloads=view.workloads,
        pods=[p for p in pods if attempt_of(p) in looked_at], now=now,
        old_pods=sum(1 for p in pods if (attempt_of(p) or 0) < attempt and not pod_ended(p)),
        events=events, looked=waiting, nodes=nodes, quotas=quotas, kueue_workloads=view.kueue_workloads,
        refused=refused, runtime=runtime.snapshot, runtime_missing=runtime.missing,
        runtime_reason=runtime.reason, uid=obj["metadata"].get("uid"),
    )
    return job, plan(job, observed, settings)


def _create_attempt(kube: Kube, owner: dict[str, Any], spec: Any, ctx: RenderContext, result: Plan,
                    view: Snapshot) -> None:
    """Apply the attempt's children, naming the held Kueue Workload when Kueue would find its pods unchanged
    (queueing.py); else the held Workload is released and the attempt queues anew."""
    held = next((w for w in view.kueue_workloads if w["name"] == result.offer_kueue), None)
    if held is None:
        kube.apply_all(render_all(spec, ctx), owner=owner)
        return
    children = render_all(spec, replace(ctx, kueue_workload=held["name"]))
    job = next(child for child in children if child["kind"] == "Job")
    if held.get("podSetHash") == job["metadata"]["annotations"][c.ANNOTATION_POD_SET_HASH]:
        result.create_events.append(Event("Normal", "KueueAdmissionKept", (
            f"attempt {ctx.attempt} runs under Kueue workload {held['name']}, admitted for the attempt before it: "
            "its quota and its place in the queue are kept")))
    else:
        kube.set_kueue_active(ctx.namespace, held["name"], False)
        children = render_all(spec, ctx)
        result.create_events.append(Event("Normal", "KueueRequeued", (
            f"attempt {ctx.attempt} asks Kueue for other pods than the attempt before it (its spec or the image "
            f"changed): workload {held['name']} is released and the attempt queues anew")))
    kube.apply_all(children, owner=owner)


def _act(kube: Kube, obj: dict[str, Any], job: Any, result: Plan, view: Snapshot, settings: Settings,
         expectations: Expectations) -> None:
    """Each action is skipped while the same write is still on its way back through the watch; what the cache
    already shows is no longer expected, so a Job deleted by hand is re-created at once, not after the TTL."""
    ns, name = view.namespace, view.name
    for seen in view.workloads:
        expectations.forget(("attempt", ns, name, obj["metadata"]["uid"], attempt_of(seen)))
        expectations.forget(("suspend", ns, seen["metadata"]["name"], bool((seen.get("spec") or {}).get("suspend"))))

    def once(key: tuple[Any, ...], action: Callable[[], Any], ttl: float | None = None) -> bool:
        """True when the action ran now (False: the same write is still on its way)."""
        if expectations.pending(key):
            if ttl is None:
                result.requeue(expectations.ttl)
            return False
        expectations.record(key, ttl)  # before the write: passes of other jobs run concurrently
        try:
            action()
        except BaseException:
            expectations.forget(key)
            raise
        return True

    holding = ("kueue-hold", ns, name)
    if result.hold_kueue is not None:  # before its Job is deleted (queueing.py)
        held, pod_set, since = result.hold_kueue
        once(holding, lambda: kube.hold_kueue_workload(ns, held, obj, pod_set, since), ttl=10.0)
    if result.hand_kueue is not None:
        held, to = result.hand_kueue
        once(("kueue-hand", ns, held, to), lambda: kube.hand_kueue_workload(ns, held, to), ttl=10.0)
    for workload in result.delete_workloads:
        once(("delete", ns, workload), functools.partial(kube.delete_workload, ns, workload))
    if result.suspend_workload is not None:
        target, suspend = result.suspend_workload
        once(("suspend", ns, target, suspend), lambda: kube.set_suspend(ns, target, suspend))
    if result.kueue_labels is not None:
        queued_job, labels, was = result.kueue_labels
        key = ("kueue-labels", ns, queued_job, tuple(sorted(labels.items())))
        if once(key, lambda: kube.set_labels(ns, queued_job, labels), ttl=10.0):
            changes = ", ".join(f"{k}={v} (was {was[k] or 'unset'})" for k, v in sorted(labels.items()))
            result.events.append(Event("Normal", "KueueLabelsChanged", (
                f"queued Job {queued_job} takes the FineTuneJob's Kueue labels: {changes}")))
    if result.job_deadline is not None:
        target, seconds = result.job_deadline
        once(("deadline", ns, target, seconds), lambda: kube.set_deadline(ns, target, seconds))
    if result.kueue_active is not None:
        queued, active = result.kueue_active
        once(("kueue-active", ns, queued, active), lambda: kube.set_kueue_active(ns, queued, active), ttl=10.0)
    creates = result.create_attempt if result.create_attempt is not None else (
        PREFLIGHT_ATTEMPT if result.create_preflight else None)
    if creates is not None and not isinstance(job, InvalidSpec):
        account = job.spec.pod.service_account_name
        # The job's labels as it runs (a runtime's queue among them), not only those written on it.
        ctx = RenderContext(name=name, namespace=ns, attempt=creates, trainer_image=settings.trainer_image,
                            network_policy=settings.network_policy, job_labels=job.labels,
                            job_annotations=obj["metadata"].get("annotations") or {}, resume_from=result.resume_from,
                            uid=obj["metadata"].get("uid"), deadline_seconds=result.attempt_deadline)
        if creates == PREFLIGHT_ATTEMPT:
            create = lambda: kube.apply_all(render_preflight(job.spec, ctx), owner=obj)  # noqa: E731
        elif result.offer_kueue is None and expectations.pending(holding):
            result.requeue(1)  # the held Workload is not in the cache yet: the attempt must name it
            return
        else:
            create = functools.partial(_create_attempt, kube, obj, job.spec, ctx, result, view)
        try:
            once(("identity", ns, account), lambda: kube.apply_all(render_trainer_identity(ns, account)),
                 ttl=IDENTITY_TTL_SECONDS)
            if once(("attempt", ns, name, obj["metadata"]["uid"], creates), create):
                result.events.extend(result.create_events)
                expectations.refused.pop((ns, name), None)
        except NameConflict as exc:
            # Nothing was written; the next pass says so (reason NameConflict, one Event) at once, then looks again
            # every NAME_CONFLICT_RETRY_SECONDS: the status this pass wrote planned a creation that did not happen.
            expectations.refused[(ns, name)] = (creates, NAME_CONFLICT, str(exc))
            told = result.status.get("reason") == NAME_CONFLICT
            result.requeue(NAME_CONFLICT_RETRY_SECONDS if told else 0)
        except ApiException as exc:
            if exc.status == 403 and "NamespaceTerminating" in str(exc.body):
                # The namespace is being deleted, and this job with it: nothing can be created there, nor need be,
                # and no retry can change that. Nothing can take the held Workload over either: its quota goes
                # back now, not when the namespace's FineTuneJobs are finally deleted.
                if result.offer_kueue is not None:
                    kube.set_kueue_active(ns, result.offer_kueue, False)
                log.info("%s/%s: not creating its attempt: namespace %s is being deleted", ns, name, ns)
                return
            if exc.status in REFUSALS:
                # An admission policy, a webhook or a quota refused a child: the next pass says so in the status
                # (and a Warning Event) and tries again.
                expectations.refused[(ns, name)] = (creates, ATTEMPT_REFUSED, f"{exc.status}: {_api_message(exc)}")
            raise
    if result.delete_job:
        once(("delete-job", ns, name), lambda: kube.delete_finetunejob(ns, name))


def _api_message(exc: ApiException) -> str:
    """The apiserver's own sentence from an error response (its JSON body), else the HTTP reason."""
    try:
        message = str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        message = str(exc.reason)
    return exit_codes.short(message, REFUSAL_MESSAGE_LIMIT)
