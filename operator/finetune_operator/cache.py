"""What the operator keeps in memory of each watched object: only the fields a reconcile pass reads.

The watch streams (kopf indexes in handlers.py) feed these projections, so a pass reads no API at all and a
thousand jobs with four pods each cost a few megabytes, not the hundreds that whole pod bodies would.

Each watch event is a freshly parsed document that nothing mutates afterwards, so the projections share its
values instead of copying them.
"""

from dataclasses import dataclass, field
from typing import Any, Mapping

from .api import constants as c


def _pick(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: obj[k] for k in keys if obj.get(k) is not None}


def slim_finetunejob(body: Mapping[str, Any]) -> dict[str, Any]:
    """The whole object minus managedFields and the last-applied annotation (kubectl's copy of the spec)."""
    meta = _pick(body.get("metadata") or {}, "name", "namespace", "uid", "resourceVersion", "generation", "labels",
                 "deletionTimestamp", "creationTimestamp")
    return {"apiVersion": body.get("apiVersion", c.API_VERSION), "kind": body.get("kind", c.KIND),
            "metadata": meta, **_pick(body, "spec", "status")}


def slim_workload(body: Mapping[str, Any]) -> dict[str, Any]:
    """A batch Job: its name and labels (attempt), spec.suspend and status.conditions."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    return {"metadata": _pick(body.get("metadata") or {}, "name", "labels", "deletionTimestamp"),
            "spec": {"suspend": spec.get("suspend")}, "status": _pick(status, "conditions")}


def slim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    """A pod: phase and the trainer container's terminated state (exit code, reason, termination message)."""
    status = body.get("status") or {}
    containers = [{"name": cs.get("name"), "state": {"terminated": cs["state"]["terminated"]}}
                  for cs in status.get("containerStatuses") or []
                  if cs.get("name") == c.CONTAINER_NAME and (cs.get("state") or {}).get("terminated")]
    return {"metadata": _pick(body.get("metadata") or {}, "name", "labels", "deletionTimestamp"),
            "status": {**_pick(status, "phase", "reason", "message"), "containerStatuses": containers}}


@dataclass(frozen=True)
class Snapshot:
    """One job's view, copied out of the caches on the event loop so the pass can run in a worker thread."""

    namespace: str
    name: str
    finetunejob: dict[str, Any] | None
    workloads: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
