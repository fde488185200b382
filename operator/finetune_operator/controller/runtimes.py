"""Which runtime a job runs with, and the job as it runs (api/runtime.py merges; this reads and snapshots).

Until a job starts, its runtime is read live: spec.runtimeRef, else the namespace's default FineTuneRuntime layered
over the cluster's default ClusterFineTuneRuntime. Its first status write records the result in status.runtime
(name, generation, digest, the merged template), and from then on only that record is used: editing or deleting
the runtime never changes a job that has started. A job that started with no runtime keeps none.
"""

from typing import Any

from ..api.runtime import Resolved, RuntimeLimits, apply_layers, choose_layers, effective_job
from .kube import Kube


def resolve(kube: Kube, obj: dict[str, Any]) -> Resolved:
    status = obj.get("status") or {}
    recorded = status.get("runtime")
    if recorded:
        merged, _ = effective_job(obj, recorded["kind"], recorded["name"], recorded.get("template") or {},
                                  RuntimeLimits())
        return Resolved(merged, recorded)
    if status.get("attempt") or status.get("preflight"):
        return Resolved(obj)  # started without a runtime: stays so
    layers, missing = choose_layers(obj, kube.get_runtime, kube.default_runtimes)
    if missing is not None:
        return Resolved(obj, missing=missing)
    return apply_layers(obj, layers) if layers else Resolved(obj)
