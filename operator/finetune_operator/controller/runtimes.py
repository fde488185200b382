"""Which runtime a job runs with, and the job as it runs (api/runtime_layers.py chooses, merges and checks; this
reads).

Until a job really starts (status.startTime: an attempt created not suspended, a resume, or its preflight; an
attempt created suspended is not a start), its runtime is read live: spec.runtimeRef, else the namespace's default
FineTuneRuntime layered over the cluster's default ClusterFineTuneRuntime, each ClusterFineTuneRuntime only where its
namespaceSelector matches the namespace's labels. The status write that starts it records the result in
status.runtime (name, generation, digest, the merged template, each layer's limits), and from then on only that
record is used, and checked on every
pass: editing or deleting the runtime never changes a job that has started, and an edit of the job that breaks the
limits it started with fails it before any attempt is created from it. A job that started with no runtime keeps none.
"""

from typing import Any

from ..api.runtime_layers import Resolved, apply_layers, choose_layers, recorded
from .kube import Kube


def resolve(kube: Kube, obj: dict[str, Any]) -> Resolved:
    status = obj.get("status") or {}
    snapshot = status.get("runtime")
    if snapshot:
        return recorded(obj, snapshot)
    if status.get("startTime"):
        return Resolved(obj)  # started without a runtime: stays so
    namespace = obj["metadata"].get("namespace", "")
    layers, missing, reason = choose_layers(obj, kube.get_runtime, kube.default_runtimes,
                                            lambda: kube.namespace_labels(namespace))
    if missing is not None:
        return Resolved(obj, missing=missing, reason=reason)
    return apply_layers(obj, layers) if layers else Resolved(obj)
