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


def _pick(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: obj[k] for k in keys if obj.get(k) is not None}


def slim_finetunejob(body: Mapping[str, Any]) -> dict[str, Any]:
    """The whole object minus managedFields and the last-applied annotation (kubectl's copy of the spec)."""
    meta = _pick(body.get("metadata") or {}, "name", "namespace", "uid", "resourceVersion", "generation", "labels",
                 "deletionTimestamp", "creationTimestamp")
    return {"apiVersion": body.get("apiVersion", c.API_VERSION), "kind": body.get("kind", c.KIND),
            "metadata": meta, **_pick(body, "spec", "status")}


def slim_workload(body: Mapping[str, Any]) -> dict[str, Any]:
    """A batch Job: its name, labels (attempt) and creation time, spec.suspend and parallelism (the attempt's
    nodes), status.conditions and its counts of ready and succeeded pods."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    return {"metadata": _pick(body.get("metadata") or {}, "name", "labels", "deletionTimestamp", "creationTimestamp"),
            "spec": _pick(spec, "suspend", "parallelism"), "status": _pick(status, "conditions", "ready", "succeeded")}


@dataclass(frozen=True)
class Snapshot:
    """One job's view, copied out of the caches on the event loop so the pass can run in a worker thread; `pods`
    is filled by the pass itself, when it needs them."""

    namespace: str
    name: str
    finetunejob: dict[str, Any] | None
    workloads: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] | None = None
