"""What one reconcile pass plans, as data: what it observed, the Events it posts, and the Plan it returns (the
whole operator-owned status, the actions on children, when to look again); shared by lifecycle.py and the modules
it delegates to."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .observed import format_time, job_ended_failed, job_succeeded, parse_time

OPERATOR_STATUS_FIELDS = ("phase", "reason", "message", "conditions", "attempt", "restarts", "scheduleRetries",
                          "nodes", "gpus", "globalBatchSize", "startTime", "completionTime", "observedGeneration",
                          "goodput", "preflight", "noticePosted", "kueueDeactivated", "activeSeconds", "activeSince",
                          "disruptions", "runtime", "memoryEstimate", "restartsInPlace", "nodesLost",
                          "recovery", "startedSpecDigest")
CONDITION_TYPES = ("Created", "Waiting", "Running", "Restarting", "Suspended", "Stalled", "TopologyChangePending",
                   "Succeeded", "Failed")


@dataclass(frozen=True)
class Observed:
    name: str
    namespace: str
    generation: int
    labels: dict[str, str]
    status: dict[str, Any]
    workloads: list[dict[str, Any]]
    # Pods of the current attempt: read only when they matter (its Job failed: which node, which exit code);
    # readiness comes from the Job's status, so the operator does not watch pods at all.
    pods: list[dict[str, Any]]
    now: datetime
    # Pods of earlier attempts still running (even terminating): a new gang must not start beside them, or two
    # attempts would write checkpoints into the same directory at once. Pods that ended do not count.
    old_pods: int = 0
    # Events of the current attempt's Job (FailedCreate: a ResourceQuota, an admission webhook), read with its
    # pods only while the gang waits past WAIT_GRACE_SECONDS.
    events: list[dict[str, Any]] = field(default_factory=list)
    looked: bool = False  # pods and events were read this pass (else an earlier pass's waiting reason stands)
    # The nodes (name, labels, taints, allocatable) and the namespace's ResourceQuotas, read for a job's first pass
    # only (None: not readable, or not read)
    nodes: list[dict[str, Any]] | None = None
    quotas: list[dict[str, Any]] | None = None
    # Kueue's Workloads of this job's Jobs (empty without Kueue)
    kueue_workloads: list[dict[str, Any]] = field(default_factory=list)
    # (attempt, the apiserver's answer) when creating that attempt's children was refused on an earlier pass
    refused: tuple[int, str, str] | None = None  # (attempt, reason, why): see Expectations.refused
    # The runtime the job runs with (status.runtime: recorded, or read live before it starts), and why it cannot be
    # read when the job names one that does not exist (controller/runtimes.py)
    runtime: dict[str, Any] | None = None
    runtime_missing: str | None = None
    runtime_reason: str = "RuntimeNotFound"  # or RuntimeNotAllowed: the reason the job waits with
    uid: str | None = None  # the FineTuneJob's: what a Workload it holds names (None only in tests of the plan)


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Plan:
    status: dict[str, Any]
    create_attempt: int | None = None
    attempt_deadline: int | None = None  # the created attempt Job's own activeDeadlineSeconds (deadlines.py)
    job_deadline: tuple[str, int | None] | None = None  # (the attempt's Job, its new activeDeadlineSeconds)
    resume_from: str | None = None
    delete_workloads: list[str] = field(default_factory=list)
    suspend_workload: tuple[str, bool] | None = None
    kueue_active: tuple[str, bool] | None = None  # (Kueue Workload, active): a suspend of a Kueue-managed attempt
    # (Kueue Workload, its pod-set hash): held by the FineTuneJob before its failed Job is deleted (queueing.py)
    hold_kueue: tuple[str, str | None, str] | None = None  # (Kueue Workload, its pod-set hash, since)
    offer_kueue: str | None = None  # the held Workload the created attempt names, if its pod set is unchanged
    hand_kueue: tuple[str, str] | None = None  # (held Workload, the attempt's Job that names it): make it the owner
    # (the attempt's queued Job, the Kueue labels the FineTuneJob has now that the Job lacks, the Job's values)
    kueue_labels: tuple[str, dict[str, str], dict[str, str | None]] | None = None
    delete_job: bool = False
    events: list[Event] = field(default_factory=list)
    # Posted only when this pass really creates the attempt (a pass before the new Job reaches the cache plans the
    # same creation again, which is skipped, and must not say it twice).
    create_events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    restarted: bool = False  # this pass started a gang restart (for the restarts metric)
    rescheduled: bool = False  # this pass gave up on a partial gang (scheduleTimeoutSeconds): retried, not failed
    create_preflight: bool = False  # apply the ConfigMap and the preflight Job (render/preflight.py)
    stalled: bool = False  # this pass restarts a gang for lack of a heartbeat: the Stalled condition turns True
    # spec.distributed was edited while an attempt runs: what the edit asks and what runs (TopologyChangePending)
    topology_change: str | None = None

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 1.0)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


COSMETIC_FIELDS = ("nodes", "message")


def only_cosmetic(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """True when a status change is nothing but a node count or its message (a gang coming up pod by pod), which
    may wait a few seconds to be written together with the next one; phases and conditions never wait."""
    def essence(st: dict[str, Any]) -> dict[str, Any]:
        conditions = [{k: v for k, v in cd.items() if k != "message"} for cd in st.get("conditions") or []]
        return {**{k: v for k, v in st.items() if k not in COSMETIC_FIELDS}, "conditions": conditions}
    return essence(before) == essence(after)


def finish(p: Plan, obs: Observed, phase: str, reason: str, message: str) -> None:
    p.status.update(phase=phase, reason=reason, message=message)
    p.status.setdefault("completionTime", format_time(obs.now))


def condition_time(status: dict[str, Any], kind: str) -> datetime | None:
    for cd in status.get("conditions") or []:
        if cd.get("type") == kind and cd.get("status") == "True":
            return parse_time(cd.get("lastTransitionTime"))
    return None


def finished(workload: dict[str, Any]) -> bool:
    """Ended for good (a queued attempt's Job with a failed pod has not: its other pods run until it is deleted)."""
    return job_succeeded(workload) or job_ended_failed(workload)
