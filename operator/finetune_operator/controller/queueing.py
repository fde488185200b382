"""Kueue, as the operator sees it (pure): whether Kueue manages an attempt's Job, and why a queued job waits.

Kueue manages a Job when it has a Workload for it, when the Job carries a queue name, or when the Job was
suspended by someone other than the operator (Kueue's manageJobsWithoutQueueName suspends unlabelled Jobs). The
operator then never writes the Job's spec.suspend: Kueue owns it. A user's suspend deactivates the Workload
instead (Kueue evicts it and releases the quota), and clearing it activates the Workload again (re-queued).

A gang restart keeps the quota and the place in the queue: a queued attempt's Job never fails by itself
(render/workload.py), so its Workload stays admitted when a pod fails. Before the failed Job is deleted its
Workload is held by the FineTuneJob (its controller owner: Kueue neither finishes it as orphaned nor stops anything
else), and the next attempt's Job names it (kueue.x-k8s.io/prebuilt-workload-name) and is made its controller
owner: Kueue starts that Job at once under the admission it already has. Kueue compares a Job's containers and
pod count with its Workload's, so the hand-over happens only when they are unchanged (pod-set hash); otherwise, and
when the job ends, the held Workload is deactivated and the quota released."""

import re
from typing import Any

from ..api import constants as c

# Queued reasons that will not go away by waiting: a Warning at once.
NEVER_ADMITTED = ("QueueTooSmall", "LocalQueueMissing")
# Kueue's flavor assigner (pkg/scheduler/flavorassigner, v0.17): a resource no resource group of the ClusterQueue
# covers, and one the gang needs more of than the queue can ever lend.
_UNCOVERED = re.compile(r"resource (\S+) unavailable in ClusterQueue")
_OVER_CAPACITY = re.compile(r"insufficient quota for (\S+) in flavor ([^,]+), [^;]*?> maximum capacity")
# A flavor that could hold the gang once its quota is free: Kueue lists the flavors it tried, each with the first
# resource that did not fit (in map order), so the gang is too small for the queue only if no flavor is merely busy.
_BUSY = re.compile(r"insufficient unused quota for \S+ in flavor ([^,]+),")
# The field of a FineTuneJob that asks for each resource Kueue counts, per pod (x the nodes of the gang).
_ASKED_BY = {"cpu": "resources.cpu", "memory": "resources.memory", "ephemeral-storage": "resources.ephemeralStorage"}


def _ask_for_less(resource: str) -> str:
    if resource in _ASKED_BY:
        return f"less {resource} ({_ASKED_BY[resource]} per pod x distributed.numNodes)"
    if resource == "pods":
        return "fewer pods (distributed.numNodes)"
    if "gpu" in resource.lower() or "/mig-" in resource:  # nvidia.com/gpu, amd.com/gpu, MIG slices
        return f"fewer GPUs ({resource}: distributed.numNodes x gpusPerNode)"
    return f"less {resource}"


def kueue_workload(kueue_workloads: list[dict[str, Any]], job: dict[str, Any]) -> dict[str, Any] | None:
    """Kueue's Workload of the attempt's Job, if Kueue made one: the Workload that Job (by name and UID) controls."""
    name, uid = job["metadata"]["name"], job["metadata"].get("uid")
    return next((w for w in kueue_workloads if w.get("job") == name and (uid is None or w.get("jobUid") == uid)),
                None)


def finished(kueue: dict[str, Any]) -> bool:
    return (_condition(kueue, "Finished") or {}).get("status") == "True"


def admitted(kueue: dict[str, Any]) -> bool:
    """Holds quota: reserved, not finished, not deactivated."""
    return ((_condition(kueue, "QuotaReserved") or {}).get("status") == "True" and not finished(kueue)
            and bool(kueue.get("active", True)))


def held(kueue_workloads: list[dict[str, Any]], name: str, uid: str | None) -> dict[str, Any] | None:
    """The Workload the FineTuneJob `name` (this one: its UID) holds between a failed attempt and the next, if any
    (one released, inactive or finished, holds nothing)."""
    return next((w for w in kueue_workloads if w.get("holder") == name and not w.get("job")
                 and (uid is None or w.get("holderUid") == uid) and w.get("active", True) and not finished(w)),
                None)


def suspended_by_operator(job: dict[str, Any]) -> bool:
    return ((job.get("metadata") or {}).get("annotations") or {}).get(c.ANNOTATION_SUSPENDED) == "true"


def managed(job: dict[str, Any], kueue: dict[str, Any] | None) -> bool:
    suspended = bool((job.get("spec") or {}).get("suspend"))
    labelled = bool(((job.get("metadata") or {}).get("labels") or {}).get(c.LABEL_KUEUE_QUEUE))
    return kueue is not None or labelled or (suspended and not suspended_by_operator(job))


def _condition(kueue: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((cd for cd in kueue.get("conditions") or [] if cd.get("type") == kind), None)


def waiting(kueue: dict[str, Any] | None) -> tuple[str, str]:
    """(reason, message) of a Kueue-managed Job that is not running, from its Workload's conditions."""
    if kueue is None:
        return "Queued", "suspended by Kueue; waiting for Kueue to create the workload"
    if not kueue.get("active", True):
        return "Deactivated", (f"Kueue workload {kueue['name']} is deactivated (spec.active: false): it holds no quota "
                               "and is not queued")
    preempted = _condition(kueue, "Preempted") or _condition(kueue, "Evicted")
    reserved = _condition(kueue, "QuotaReserved") or {}
    text = reserved.get("message") or ""
    if preempted is not None and preempted.get("status") == "True" and reserved.get("status") != "True":
        return "Preempted", (f"preempted by Kueue ({preempted.get('message') or preempted.get('reason')}); queued "
                             f"again, the next attempt resumes from the newest checkpoint: {text}").rstrip(": ")
    if "doesn't exist" in text or "does not exist" in text:
        return "LocalQueueMissing", (f"Kueue: {text}; it will wait until that queue exists: fix the label "
                                     f"{c.LABEL_KUEUE_QUEUE} or create the LocalQueue")
    uncovered = list(dict.fromkeys(_UNCOVERED.findall(text)))
    if uncovered:
        fields = [_ASKED_BY[r] for r in uncovered if r in _ASKED_BY]
        return "QueueTooSmall", (f"Kueue: {text}; the gang asks for {', '.join(uncovered)}, which its ClusterQueue "
                                 "does not cover, and will wait forever: add it to the ClusterQueue's "
                                 "coveredResources with a quota" + (f", or leave {' and '.join(fields)} unset"
                                                                    if fields else ""))
    over = _OVER_CAPACITY.findall(text)
    busy = set(_BUSY.findall(text)) - {flavor for _, flavor in over}
    short = list(dict.fromkeys(resource for resource, _ in over))
    if short and not busy:
        asks = ", ".join(_ask_for_less(r) for r in short)
        return "QueueTooSmall", (f"Kueue: {text}; the gang asks for more than its ClusterQueue can ever hold and "
                                 f"will wait forever: ask for {asks}, or raise the queue's quota")
    if reserved.get("status") == "True":
        return "Admitting", f"Kueue reserved quota; waiting for its admission checks ({text})"
    return "Queued", f"Kueue: {text}" if text else "waiting for Kueue to admit the workload"
