"""Reading the observed children (batch Jobs and pods as plain dicts): conditions, readiness, exit codes."""

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from ..api import constants as c
from ..api import exit_codes, runtime_layers


def parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def format_time(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def has_condition(obj: dict[str, Any], kind: str) -> bool:
    return any(cd.get("type") == kind and cd.get("status") == "True"
               for cd in (obj.get("status") or {}).get("conditions") or [])


def job_ended_failed(job: dict[str, Any]) -> bool:
    """FailureTarget (Kubernetes >= 1.31) comes as soon as the Job is doomed; Failed only after every pod ended."""
    return has_condition(job, "FailureTarget") or has_condition(job, "Failed")


def job_failed(job: dict[str, Any]) -> bool:
    """The attempt failed: its Job failed, or a pod failed in a Job queued in Kueue (which never fails by itself:
    render/workload.py), whose other pods still run until the operator deletes it. A pod of an attempt that restarts
    in place is replaced alone: the operator counts those (controller/in_place.py)."""
    spec, status = job.get("spec") or {}, job.get("status") or {}
    if restarts_in_place_of(job) is not None:
        return job_ended_failed(job)
    return job_ended_failed(job) or (int(spec.get("backoffLimit") or 0) > 0 and int(status.get("failed") or 0) > 0)


def _annotation_int(job: dict[str, Any], key: str) -> int | None:
    value = ((job.get("metadata") or {}).get("annotations") or {}).get(key)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def restarts_in_place_of(job: dict[str, Any]) -> int | None:
    """How many of its pods an attempt may lose by their own failure and replace alone (runPolicy.inPlaceRestarts
    as it was rendered), or None: a fixed gang, which any failure restarts."""
    return _annotation_int(job, c.ANNOTATION_RESTARTS_IN_PLACE)


def min_nodes_of(job: dict[str, Any], default: int) -> int:
    """The fewest nodes an attempt trains on: an elastic one's minNodes, else all of them."""
    value = _annotation_int(job, c.ANNOTATION_MIN_NODES)
    return value if value is not None else default


def failed_pods(job: dict[str, Any]) -> int:
    """The Job controller's count of its pods that failed (or were deleted before they succeeded)."""
    return int((job.get("status") or {}).get("failed") or 0)


def job_succeeded(job: dict[str, Any]) -> bool:
    return has_condition(job, "SuccessCriteriaMet") or has_condition(job, "Complete")


def attempt_of(obj: dict[str, Any]) -> int | None:
    value = ((obj.get("metadata") or {}).get("labels") or {}).get(c.LABEL_ATTEMPT)
    return int(value) if value and value.isdigit() else None


def controller_reference(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """`obj`'s controller ownerReference (the API server allows one at most), or None."""
    return next((r for r in (obj.get("metadata") or {}).get("ownerReferences") or [] if r.get("controller")), None)


def finetunejob_controller(obj: Mapping[str, Any]) -> str | None:
    """The UID of the FineTuneJob that controls `obj` (its controller ownerReference of our group and kind), or
    None. The group counts: a reference of kind FineTuneJob under another apiVersion is nobody's of ours (and the
    chart's children policy refuses it to anyone but the operator as well)."""
    ref = controller_reference(obj) or {}
    ours = ref.get("kind") == c.KIND and (ref.get("apiVersion") or "").partition("/")[0] == c.GROUP
    return ref.get("uid") if ours else None


def attempt_pods(pods: list[dict[str, Any]], name: str, uid: str, workloads: list[dict[str, Any]],
                 job_controllers: Callable[[str], tuple[str, str | None] | None]) -> list[dict[str, Any]]:
    """The pods of this job's attempts among those labelled as its: each one's controller is the Job of its own
    attempt (<name>-a<attempt>) with that Job's UID. A Job not among the job's own in the cache is read
    (`job_controllers`: its UID and controlling FineTuneJob, or None when it is gone): the pods of a Job being
    deleted outlive it and still count; those of a Job of that name someone else made do not. A pod that only
    carries the labels (anyone who may create pods can set them) neither holds back a restart nor says why an
    attempt failed."""
    uids = {w["metadata"]["name"]: w["metadata"].get("uid") for w in workloads}
    looked: dict[str, tuple[str, str | None] | None] = {}
    kept = []
    for pod in pods:
        attempt = attempt_of(pod)
        job = f"{name}-a{attempt}" if attempt is not None else None
        owner = controller_reference(pod) or {}
        if job is None or (owner.get("apiVersion"), owner.get("kind"), owner.get("name")) != ("batch/v1", "Job", job):
            continue
        if job in uids:
            ours = uids[job] == owner.get("uid")
        else:
            if job not in looked:
                looked[job] = job_controllers(job)
            found = looked[job]
            ours = found is None or found == (owner.get("uid"), uid)
        if ours:
            kept.append(pod)
    return kept


def pod_ended(pod: dict[str, Any]) -> bool:
    """Succeeded or Failed: its containers have stopped and will not write anything again."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def ready_pods(job: dict[str, Any]) -> int:
    """The Job controller's count of its pods that are Ready (and not terminating)."""
    return int((job.get("status") or {}).get("ready") or 0)


def succeeded_pods(job: dict[str, Any]) -> int:
    """Pods of the Job that finished with exit 0 (a gang finishing node by node)."""
    return int((job.get("status") or {}).get("succeeded") or 0)


def attempt_nodes(job: dict[str, Any], default: int) -> int:
    """The nodes an attempt runs (its Job's parallelism): an edited spec.distributed applies from the next one."""
    value = (job.get("spec") or {}).get("parallelism")
    return int(value) if isinstance(value, int) and value > 0 else default


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == c.CONTAINER_NAME:
            return (cs.get("state") or {}).get("terminated")
    return None


def preflight_report(pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The passed preflight pod's summary (its termination message, JSON); {} when there is none to read."""
    for pod in pods:
        term = _terminated(pod) if attempt_of(pod) == 0 else None
        if term is not None and term.get("exitCode") == 0:
            try:
                report = json.loads(term.get("message") or "{}")
            except json.JSONDecodeError:
                return {}
            return report if isinstance(report, dict) else {}
    return {}


MESSAGE_LIMIT = 3000  # a trainer's termination message is at most 4 KiB of JSON
# A pod stopped from outside (deleted, evicted, preempted by the scheduler, its node drained): the gang restarts
# from the newest checkpoint, counted in status.disruptions, not against backoffLimit.
DISRUPTED = "Disrupted"


def _disruption(pod: dict[str, Any]) -> str | None:
    """Why a pod was stopped from outside, or None: the API's DisruptionTarget condition (eviction, preemption,
    taint manager, pod GC), or the trainer's own 143 (it stopped on a SIGTERM nobody asked the job for)."""
    for cd in (pod.get("status") or {}).get("conditions") or []:
        if cd.get("type") == "DisruptionTarget" and cd.get("status") == "True":
            return f"{cd.get('reason') or 'disrupted'}: {cd.get('message') or 'the pod was stopped from outside'}"
    term = _terminated(pod)
    if term is not None and term.get("exitCode") == exit_codes.INTERRUPTED:
        return "stopped by a SIGTERM from outside the job (kubectl delete pod, a drain); it saved a checkpoint"
    return None


# The kubelet evicts a pod that writes more local disk than its ephemeral-storage limit (or an emptyDir more than
# its sizeLimit) with no DisruptionTarget condition: a cause of the job's own, counted against backoffLimit, never a
# disruption (the trainer may exit 143 in the second it is given, which alone would read as one).
STORAGE_EXCEEDED = "EphemeralStorageExceeded"
_RAISE_STORAGE = ("raise spec.resources.ephemeralStorage, or move what fills it to a volume: output.claimName for "
                  "checkpoints, data.cacheDir for models and tokenized data")
# The kubelet's 3 messages (pkg/kubelet/eviction/helpers.go), each with what the user raises.
STORAGE_EVICTION_WORDS = {"local ephemeral storage": _RAISE_STORAGE, "ephemeral local storage": _RAISE_STORAGE,
                          "emptydir volume": "raise that volume's sizeLimit in spec.pod.volumes"}


def _over_its_disk(pod: dict[str, Any]) -> str | None:
    """The kubelet's message and the fix when it evicted the pod for its own local disk use, else None."""
    status = pod.get("status") or {}
    message = str(status.get("message") or "").strip()
    if status.get("reason") == "Evicted":
        fix = next((f for words, f in STORAGE_EVICTION_WORDS.items() if words in message.lower()), None)
        if fix is not None:
            return f"{message}; {fix}"
    return None


def classify_failure(pods: list[dict[str, Any]]) -> tuple[int | None, str, str]:
    """(exit code, reason, message) that best explains a failed attempt; permanent causes win over retryable ones.

    The trainer's termination message (JSON) carries the reason and message when it got that far."""
    failures: list[tuple[int | None, str, str]] = []
    for pod in pods:
        status = pod.get("status") or {}
        term = _terminated(pod)
        over = _over_its_disk(pod)
        if over is not None:
            failures.append((None, STORAGE_EXCEEDED, f"{pod['metadata']['name']}: {over}"))
            continue
        disruption = _disruption(pod)
        if disruption is not None:
            failures.append((None, DISRUPTED, f"{pod['metadata']['name']}: {disruption}"))
            continue
        if term is not None and term.get("exitCode", 0) != 0:
            code = int(term["exitCode"])
            reason, message = exit_codes.reason(code), term.get("message") or ""
            try:
                detail = json.loads(message)
                reason, message = detail.get("reason", reason), detail.get("message", message)
            except (json.JSONDecodeError, AttributeError, TypeError):
                pass
            if term.get("reason") == "OOMKilled":  # the kubelet's word, over anything the trainer could say
                reason = "OOMKilled"
            # The whole of the trainer's message (its remedy comes last): the status holds 32 KiB, describe shows it.
            failures.append((code, reason, f"{pod['metadata']['name']}: "
                                           f"{exit_codes.short(message or reason, MESSAGE_LIMIT)}"))
        elif status.get("phase") == "Failed":
            failures.append((None, status.get("reason") or "PodFailed",
                             f"{pod['metadata']['name']}: {status.get('message') or status.get('reason') or 'failed'}"))
    if not failures:  # its pod is gone: deleted by someone (kubectl delete pod, a drain, the pod GC)
        return None, DISRUPTED, ("a pod of the attempt was deleted (kubectl delete pod, a drain, an eviction) before "
                                 "it could say why; nothing in the job failed")
    # A disruption explains a failed attempt last: a gang's other pods stopped with 143 while one was evicted for its
    # own disk use (the pods are listed by name, whichever came first).
    failures.sort(key=lambda f: (not exit_codes.is_permanent(f[0] or 0), f[0] is None, f[1] == DISRUPTED))
    return failures[0]


# Why a gang waits, from its pods and its Job's events, most specific first.
IMAGE_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
CREATE_CONTAINER_REASONS = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")
# The apiserver refused to create the attempt's children (an admission policy or webhook): nothing runs yet.
ATTEMPT_REFUSED = "AttemptRefused"
RUNTIME_NOT_FOUND = runtime_layers.RUNTIME_NOT_FOUND
RUNTIME_NOT_ALLOWED = runtime_layers.RUNTIME_NOT_ALLOWED  # a ClusterFineTuneRuntime's namespaceSelector
# Waiting for a runtime to appear (or for two default runtimes to become one) is looked at again this often.
RUNTIME_RETRY_SECONDS = 30.0
# A child's name is taken by an object this job did not create: the operator never adopts or changes it.
NAME_CONFLICT = "NameConflict"
WAITING_REASONS = ("ImagePullFailed", "CreateContainerError", "Unschedulable", "QuotaExceeded", "PodFailedToStart",
                   "InsufficientCapacity", ATTEMPT_REFUSED, NAME_CONFLICT, RUNTIME_NOT_FOUND,
                   RUNTIME_NOT_ALLOWED)


def waiting_reason(pods: list[dict[str, Any]], events: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) that explains why an attempt's pods do not all run, or None when nothing says why yet:
    an image that cannot be pulled, a container that cannot be created, a pod the scheduler cannot place (with its
    message, e.g. "0/500 nodes are available: 500 Insufficient nvidia.com/gpu"), or a pod the Job controller could
    not create (a ResourceQuota: QuotaExceeded)."""
    for pod in pods:
        status = pod.get("status") or {}
        name = (pod.get("metadata") or {}).get("name", "a pod")
        for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in IMAGE_PULL_REASONS:
                return "ImagePullFailed", exit_codes.short(
                    f"{name}: {waiting['reason']}: {waiting.get('message') or cs.get('image', '')}")
            if waiting.get("reason") in CREATE_CONTAINER_REASONS:
                return "CreateContainerError", exit_codes.short(
                    f"{name}: {waiting['reason']}: {waiting.get('message') or ''}")
    for pod in pods:
        for cd in (pod.get("status") or {}).get("conditions") or []:
            if cd.get("type") == "PodScheduled" and cd.get("status") == "False" and cd.get("reason") == "Unschedulable":
                return "Unschedulable", exit_codes.short(cd.get("message") or "the scheduler cannot place a pod")
    failed = [e for e in events if e.get("reason") == "FailedCreate"]
    if failed:
        newest = max(failed, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        message = newest.get("message") or ""
        reason = "QuotaExceeded" if "exceeded quota" in message else "PodFailedToStart"
        return reason, exit_codes.short(message)
    return None
