"""Which runtime a job runs with, and the job as it runs (api/runtime_layers.py chooses, merges and checks; this
reads).

Until a job really starts (status.startTime: an attempt created not suspended, a resume, or its preflight; an
attempt created suspended is not a start), its runtime is read live: spec.runtimeRef, else the namespace's default
FineTuneRuntime layered over the cluster's default ClusterFineTuneRuntime, each ClusterFineTuneRuntime only where its
namespaceSelector matches the namespace's labels. The status write that starts it records the result in
status.runtime (name, generation, digest, the merged template, each layer's limits), and from then on only that
record is used, and checked on every pass: editing or deleting the runtime never changes a job that has started,
and an edit of the job that breaks the limits it started with fails it before any attempt is created from it. A job
that started with no runtime keeps none while it runs what it started with; an edit of what it runs starts it anew
under the runtimes that cover it then.
"""

from collections.abc import Sequence
from typing import Any

from ..api.errors import InvalidSpec
from ..api.runtime_layers import Resolved, apply_layers, choose_layers, recorded
from ..api.validation import validate_job
from ..render.workload import started_spec_digest
from .kube import Kube
from .observed import attempt_of
from .suspension import edited


def resolve(kube: Kube, obj: dict[str, Any], workloads: Sequence[dict[str, Any]] = ()) -> Resolved:
    """`workloads`: the job's own attempts (their Jobs), which say what a job that started without a runtime
    runs."""
    status = obj.get("status") or {}
    snapshot = status.get("runtime")
    if snapshot:
        return recorded(obj, snapshot)
    if status.get("startTime") and not edited_since_started(obj, workloads):
        return Resolved(obj)  # started without a runtime, and runs what it started with: stays so
    namespace = obj["metadata"].get("namespace", "")
    layers, missing, reason = choose_layers(obj, kube.get_runtime, kube.default_runtimes,
                                            lambda: kube.namespace_labels(namespace))
    if missing is not None:
        return Resolved(obj, missing=missing, reason=reason)
    return apply_layers(obj, layers) if layers else Resolved(obj)


def edited_since_started(obj: dict[str, Any], workloads: Sequence[dict[str, Any]]) -> bool:
    """Whether what the job runs (its spec but suspend and runPolicy, its Kueue labels) is no longer what it started
    with (status.startedSpecDigest): then a job that started without a runtime starts anew under the runtimes that
    cover it now, as admission judges such an edit (render/runtime_policy.py). A job an operator started before that
    record existed is compared with its newest attempt's Job (taken as unedited without one)."""
    try:
        spec = validate_job(obj).spec
    except InvalidSpec:
        return True  # judged (and refused) with whatever covers it now
    digest = ((obj.get("status") or {}).get("startedSpecDigest"))
    if digest is not None:
        return digest != started_spec_digest(spec, (obj.get("metadata") or {}).get("labels") or {})
    newest = max(workloads, key=lambda w: attempt_of(w) or 0, default=None)
    return newest is not None and edited(spec, newest)  # the comparison a resume after an edit makes
