"""What the operator keeps in memory of each watched object: only the fields a reconcile pass reads.

The watch streams (kopf indexes in handlers.py) feed these projections, so a pass reads no API at all. Pods are
not watched: the Job's status counts the ready ones, and they are listed only when an attempt fails.

Each watch event is a freshly parsed document that nothing mutates afterwards, so the projections share its
values instead of copying them.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..api import constants as c
from .observed import controller_reference, finetunejob_controller


def _pick(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: obj[k] for k in keys if obj.get(k) is not None}


def slim_finetunejob(body: Mapping[str, Any]) -> dict[str, Any]:
    """The whole object minus managedFields and the last-applied annotation (kubectl's copy of the spec)."""
    meta = _pick(body.get("metadata") or {}, "name", "namespace", "uid", "resourceVersion", "generation", "labels",
                 "deletionTimestamp", "creationTimestamp")
    kueue = {k: v for k, v in ((body.get("metadata") or {}).get("annotations") or {}).items()
             if k.startswith(c.KUEUE_PREFIX)}
    if kueue:  # copied to the attempt's Job (render/workload.py); the rest of the annotations are not needed
        meta["annotations"] = kueue
    return {"apiVersion": body.get("apiVersion", c.API_VERSION), "kind": body.get("kind", c.KIND),
            "metadata": meta, **_pick(body, "spec", "status")}


def slim_workload(body: Mapping[str, Any]) -> dict[str, Any]:
    """A batch Job: its name, UID (its pods' controller), labels (attempt) and creation time, spec.suspend and
    parallelism (the attempt's nodes), its own deadline and start (controller/deadlines.py), status.conditions and
    its counts of ready and succeeded pods."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    meta = body.get("metadata") or {}
    slim = {"metadata": _pick(meta, "name", "uid", "labels", "deletionTimestamp", "creationTimestamp"),
            "spec": _pick(spec, "suspend", "parallelism", "backoffLimit", "activeDeadlineSeconds"),
            "status": _pick(status, "conditions", "ready", "succeeded", "failed", "startTime")}
    # Who suspended it (controller/queueing.py), and what Kueue compares when the next attempt takes its Workload.
    # Which FineTuneJob created it: a Job that merely carries our labels (someone else's) is never an attempt.
    slim["metadata"]["owner"] = finetunejob_controller(dict(body))
    kept = {k: v for k, v in (meta.get("annotations") or {}).items()
            if k in (c.ANNOTATION_SUSPENDED, c.ANNOTATION_POD_SET_HASH, c.ANNOTATION_ATTEMPT_SPEC_HASH,
                     c.ANNOTATION_RESTARTS_IN_PLACE, c.ANNOTATION_MIN_NODES)}
    if kept:
        slim["metadata"]["annotations"] = kept
    return slim


def slim_workload_kueue(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Kueue Workload of one of our Jobs (or held by a FineTuneJob between two attempts): its name, the Job or
    the holder, whether it is active, its priority and conditions."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    meta = body.get("metadata") or {}
    # Kueue's Workload of a Job is controlled by that Job (batch/v1, by UID); one held between attempts by its
    # FineTuneJob (our group and kind, by UID). A reference of another group or kind is nobody's of ours.
    ref = controller_reference(body) or {}
    job = ref if ref.get("kind") == "Job" and ref.get("apiVersion") == "batch/v1" else {}
    holder_uid = finetunejob_controller(body)
    return {"name": meta.get("name"), "job": job.get("name"), "jobUid": job.get("uid"),
            "holder": ref.get("name") if holder_uid else None, "holderUid": holder_uid,
            "active": spec.get("active", True),
            "priority": spec.get("priority"), "priorityClassName": (spec.get("priorityClassRef") or {}).get("name")
            or spec.get("priorityClassName"),
            "podSetHash": (meta.get("annotations") or {}).get(c.ANNOTATION_POD_SET_HASH),
            "heldSince": (meta.get("annotations") or {}).get(c.ANNOTATION_HELD_SINCE),
            "conditions": [_pick(cd, "type", "status", "reason", "message", "lastTransitionTime")
                           for cd in status.get("conditions") or []]}


def finetunejob_of_job(job_name: str | None) -> str | None:
    """The FineTuneJob an attempt's Job belongs to (render/names.py: <job>-a<attempt>), or None."""
    if not job_name or "-a" not in job_name:
        return None
    name, _, attempt = job_name.rpartition("-a")
    return name if attempt.isdigit() and name else None


@dataclass(frozen=True)
class Snapshot:
    """One job's view, copied out of the caches on the event loop so the pass can run in a worker thread; `pods`
    is filled by the pass itself, when it needs them."""

    namespace: str
    name: str
    finetunejob: dict[str, Any] | None
    workloads: list[dict[str, Any]] = field(default_factory=list)
    kueue_workloads: list[dict[str, Any]] = field(default_factory=list)  # Kueue's Workloads of those Jobs
    pods: list[dict[str, Any]] | None = None
