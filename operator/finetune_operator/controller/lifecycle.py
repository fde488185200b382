"""The FineTuneJob state machine, pure: (validated spec or errors, observed children, now) -> Plan.

The Plan holds the whole operator-owned status (written once per pass), the actions to take on children, the
Events for transitions and when to look again. Trainer-owned fields (status.progress, status.checkpoint) are read,
never written.
"""

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..api import constants as c
from ..api import exit_codes
from ..api.errors import InvalidSpec
from ..api.status import TERMINAL_PHASES
from ..api.validation import ValidatedJob
from ..render.preflight import PREFLIGHT_ATTEMPT
from ..render.workload import attempt_spec_hash
from . import capacity, goodput, queueing
from .observed import (
    ATTEMPT_REFUSED,
    DISRUPTED,
    NAME_CONFLICT,
    WAITING_REASONS,
    attempt_nodes,
    attempt_of,
    classify_failure,
    format_time,
    has_condition,
    job_ended_failed,
    job_failed,
    job_succeeded,
    parse_time,
    ready_pods,
    succeeded_pods,
    waiting_reason,
)
from .settings import Settings

OPERATOR_STATUS_FIELDS = ("phase", "reason", "message", "conditions", "attempt", "restarts", "scheduleRetries",
                          "nodes", "gpus", "globalBatchSize", "startTime", "completionTime", "observedGeneration",
                          "goodput", "preflight", "noticePosted", "kueueDeactivated", "activeSeconds", "activeSince",
                          "disruptions")
CONDITION_TYPES = ("Created", "Waiting", "Running", "Restarting", "Suspended", "Stalled", "TopologyChangePending",
                   "Succeeded", "Failed")
# A gang not fully running this long after its Job was created is looked at (its pods, its Job's events) to say
# why; then every WAIT_RECHECK_SECONDS while it waits. No pod watch: only waiting jobs cost reads.
WAIT_GRACE_SECONDS = 10.0
WAIT_RECHECK_SECONDS = 15.0


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


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Plan:
    status: dict[str, Any]
    create_attempt: int | None = None
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


def gang_waiting(workload: dict[str, Any], now: datetime) -> bool:
    """The attempt's Job exists, is neither finished nor suspended, not every node runs, and it was created more
    than WAIT_GRACE_SECONDS ago: worth reading its pods and events to say why."""
    if _finished(workload) or (workload.get("spec") or {}).get("suspend"):
        return False
    if ready_pods(workload) + succeeded_pods(workload) >= attempt_nodes(workload, 1):
        return False
    created = parse_time((workload.get("metadata") or {}).get("creationTimestamp"))
    return created is not None and (now - created).total_seconds() >= WAIT_GRACE_SECONDS


def backoff(settings: Settings, restarts: int) -> float:
    return min(settings.restart_backoff_seconds * 2 ** max(restarts - 1, 0), settings.restart_backoff_max_seconds)


def plan(job: ValidatedJob | InvalidSpec, obs: Observed, settings: Settings = Settings()) -> Plan:
    st = {k: obs.status.get(k) for k in OPERATOR_STATUS_FIELDS if obs.status.get(k) is not None}
    st["observedGeneration"] = obs.generation
    p = Plan(status=st)
    previous_phase = obs.status.get("phase")
    live = [w for w in obs.workloads if not _finished(w)]
    if isinstance(job, InvalidSpec):
        _finish(p, obs, "Failed", "InvalidSpec", job.summary())
        p.delete_workloads = [w["metadata"]["name"] for w in live]  # never keep GPUs busy for a broken spec
    elif previous_phase in TERMINAL_PHASES:
        p.delete_workloads = [w["metadata"]["name"] for w in live if previous_phase == "Failed"]
        _ttl(p, job, obs)
    else:
        _advance(p, job, obs, settings)
    _keep_admission(p, obs, settings)
    goodput.account(p.status, obs.status, obs.now, p.status.get("gpus") or 0, p.restarted,
                    0 if isinstance(job, InvalidSpec) else _resume_step(job, obs.status))
    _set_conditions(p, obs)
    _post_notice(p, obs)
    _active_clock(p, obs)
    _stale_progress(p, obs)
    phase, reason = p.status.get("phase"), p.status.get("reason")
    waits = phase == "Pending" and reason in WAITING_REASONS
    queued = phase == "Queued"
    # A refusal is announced in any phase (Restarting too): its reason changes, not its phase.
    told = waits or queued or reason in CREATE_REFUSALS
    if phase != previous_phase or (told and reason != obs.status.get("reason")):
        warn = phase in ("Failed", "Restarting") or waits or reason in (*queueing.NEVER_ADMITTED, "Preempted")
        p.events.append(Event("Warning" if warn else "Normal", reason or p.status["phase"],
                              p.status.get("message") or f"phase {p.status['phase']}"))
    return p


def _keep_admission(p: Plan, obs: Observed, settings: Settings) -> None:
    """A gang restart keeps the Kueue admission of the failed attempt (queueing.py): its Workload is held before
    its Job is deleted and handed to the Job of the next attempt; a job that ends releases it, and so does a next
    attempt that is not created in time (settings.kueue_hold_grace_seconds past its backoff: a Job that cannot be
    created, refused by an admission policy, must not keep the queue's GPUs from everyone else)."""
    held = queueing.held(obs.kueue_workloads, obs.name)
    if p.status.get("phase") in TERMINAL_PHASES:
        if held is not None:
            p.kueue_active = (held["name"], False)
        return
    if held is None:
        for job in obs.workloads:
            kueue = queueing.kueue_workload(obs.kueue_workloads, job)
            if job["metadata"]["name"] in p.delete_workloads and kueue is not None and queueing.admitted(kueue):
                p.hold_kueue = (kueue["name"], (job["metadata"].get("annotations") or {}).get(
                    c.ANNOTATION_POD_SET_HASH), format_time(obs.now))
                return
        return
    current = next((w for w in obs.workloads if attempt_of(w) == p.status.get("attempt")), None)
    if current is not None and (current["metadata"].get("labels") or {}).get(c.LABEL_KUEUE_PREBUILT) == held["name"]:
        p.hand_kueue = (held["name"], current["metadata"]["name"])
        return
    since = parse_time(held.get("heldSince"))
    limit = backoff(settings, int(p.status.get("restarts") or 0)) + settings.kueue_hold_grace_seconds
    left = limit - (obs.now - since).total_seconds() if since is not None else limit
    if left <= 0:
        p.kueue_active = (held["name"], False)
        p.events.append(Event("Warning", "KueueReleased", (
            f"Kueue workload {held['name']}, held for attempt {p.status.get('attempt')} since {held['heldSince']}, "
            f"was not taken over within {limit:.0f}s (the attempt's Job was not created: see the job's events); "
            "it is released and the attempt queues anew")))
        return
    p.requeue(left)
    if p.create_attempt is not None:
        p.offer_kueue = held["name"]


# Phases in which no attempt trains: the trainer's last progress is marked as the last attempt's and has no ETA.
STOPPED_PHASES = ("Queued", "Suspended", "Restarting", "Failed")


def _stale_progress(p: Plan, obs: Observed) -> None:
    """The one trainer-owned field the operator touches: a stopped attempt's ETA would read as if it were running
    (ETA 4s on a preempted job), so it is cleared and the progress marked Stopped, once."""
    progress = obs.status.get("progress") or {}
    if p.status.get("phase") in STOPPED_PHASES and progress and progress.get("phase") != "Stopped":
        p.status["progress"] = {"phase": "Stopped", "eta": None,
                                "message": f"the last report of attempt {obs.status.get('attempt')}, which is not "
                                           "running"}


# Phases whose time counts against runPolicy.activeDeadlineSeconds: not the time a job waits in Kueue's queue or
# is suspended.
COUNTED_PHASES = ("Pending", "Running", "Restarting")


def active_seconds(status: dict[str, Any], now: datetime) -> float:
    """Seconds the job has been active (not Queued or Suspended): what activeDeadlineSeconds limits."""
    if "activeSince" not in status and "activeSeconds" not in status:  # a job an older operator started
        since = parse_time(status.get("startTime"))
    else:
        since = parse_time(status.get("activeSince"))
    return float(status.get("activeSeconds") or 0) + ((now - since).total_seconds() if since else 0.0)


def _active_clock(p: Plan, obs: Observed) -> None:
    st = p.status
    counting = st.get("phase") in COUNTED_PHASES
    if not counting and st.get("activeSince"):
        st["activeSeconds"] = int(active_seconds(st, obs.now))
        del st["activeSince"]
    elif counting and not st.get("activeSince"):
        st["activeSince"] = st.get("startTime") if "activeSeconds" not in st else format_time(obs.now)


def _post_notice(p: Plan, obs: Observed) -> None:
    """The trainer's latest warning (status.notice: it may only write its own status) as a Warning Event, once."""
    notice = obs.status.get("notice") or {}
    if notice.get("time") and notice.get("time") != obs.status.get("noticePosted"):
        p.events.append(Event("Warning", str(notice.get("reason") or "TrainerWarning"), str(notice.get("message"))))
        p.status["noticePosted"] = notice["time"]


def _advance(p: Plan, job: ValidatedJob, obs: Observed, settings: Settings) -> None:
    spec, st, now = job.spec, p.status, obs.now
    # GPUs and the global batch of the running attempt: an edit of the topology applies from the next attempt.
    st.setdefault("gpus", spec.total_gpus)
    st.setdefault("globalBatchSize", spec.global_batch_size)
    if not st.get("attempt"):
        # The message the first look at the attempt would write anyway: one status write fewer per job.
        st.update(attempt=1, restarts=0, startTime=format_time(now), phase="Pending", reason="Created",
                  message=f"attempt 1: 0/{spec.distributed.num_nodes} node(s) running")
        if _never_fits(p, job, obs):
            return
    attempt = st["attempt"]
    deadline = spec.run_policy.active_deadline_seconds
    active = active_seconds(st, now)
    if deadline and active >= deadline:
        _finish(p, obs, "Failed", "DeadlineExceeded", f"active (not queued or suspended) for {int(active)}s, longer "
                f"than activeDeadlineSeconds={deadline}")
        p.delete_workloads = [w["metadata"]["name"] for w in obs.workloads if not _finished(w)]
        return
    if deadline and st.get("activeSince"):
        p.requeue(deadline - active)

    current = next((w for w in obs.workloads if attempt_of(w) == attempt), None)
    checking = spec.run_policy.preflight and current is None and attempt == 1 and st.get("preflight") != "Passed"
    # Earlier attempts go, but the last one that failed stays: its Job has no running pod left (the Job controller
    # ended them) and its pods, terminated, hold no GPU but keep their logs and exit codes for `kubectl logs` and
    # `kubectl describe` until the next attempt fails or the FineTuneJob is deleted. The preflight is attempt 0.
    kept = _last_failed_attempt(obs.workloads, attempt)
    p.delete_workloads = [w["metadata"]["name"] for w in obs.workloads
                          if (attempt_of(w) or 0) < attempt and w is not kept
                          and not (checking and attempt_of(w) == 0)]
    if checking:
        _preflight(p, job, obs, settings)
    elif current is None:
        _start_attempt(p, job, obs, settings)
    else:
        _observe_attempt(p, job, obs, current)


def _never_fits(p: Plan, job: ValidatedJob, obs: Observed) -> bool:
    """On the first pass, what the gang can never get says so at once instead of after scheduleTimeoutSeconds and a
    retry after each: a ResourceQuota below its GPUs fails the job (True); too few GPUs on the nodes its pods may
    use (their nodeSelector and tolerations), or no node big enough for one pod, is a Warning: a cluster
    autoscaler may add nodes, and runPolicy.scheduleRetryLimit bounds the retries."""
    st, d, resource = p.status, job.spec.distributed, job.spec.resources.gpu_resource_name
    gang = d.num_nodes * d.gpus_per_node
    quota = capacity.quota_limit(obs.quotas or [], resource) if gang else None
    if quota is not None and gang > quota[1]:
        _finish(p, obs, "Failed", "QuotaTooSmall", (
            f"the gang needs {gang} {resource} ({d.num_nodes} node(s) x {d.gpus_per_node}), but ResourceQuota "
            f"{quota[0]} of this namespace allows {quota[1]}: it can never run here; ask for at most {quota[1]} "
            f"(numNodes x gpusPerNode) or have the quota raised"))
        return True
    if obs.nodes is None or not gang:
        return False
    pod = job.spec.pod
    cap = capacity.capacity(obs.nodes, resource, dict(pod.node_selector or {}),
                            [t.model_dump(by_alias=True, exclude_none=True) for t in pod.tolerations], d.gpus_per_node)
    where = "the nodes its pods may use (nodeSelector, tolerations)" if pod.node_selector or pod.tolerations else \
        "the cluster's nodes"
    if cap.largest is not None and d.gpus_per_node > cap.largest[1]:
        node, most = cap.largest
        st.update(reason="Unschedulable", message=(
            f"spec.distributed.gpusPerNode is {d.gpus_per_node}, but the largest of {where} ({node}) has {most} "
            f"{resource} allocatable: no node can run a pod of this job; ask for at most {most} per node (e.g. "
            f"numNodes {-(-gang // most)} x gpusPerNode {most}) or add nodes with more GPUs"))
    elif cap.slots < d.num_nodes:
        st.update(reason="InsufficientCapacity", message=(
            f"the gang needs {d.num_nodes} pod(s) of {d.gpus_per_node} {resource} ({gang} in all), but {where} "
            f"hold {cap.slots} such pod(s) ({cap.total} {resource} on {cap.nodes} node(s)): it cannot run until "
            f"nodes are added; it is retried at most runPolicy.scheduleRetryLimit="
            f"{job.spec.run_policy.schedule_retry_limit} time(s)"))
    return False


def _preflight(p: Plan, job: ValidatedJob, obs: Observed, settings: Settings) -> None:
    """Attempt 0: the preflight Job runs first; attempt 1 (and its GPUs) only after it succeeded."""
    st = p.status
    check = next((w for w in obs.workloads if attempt_of(w) == 0), None)
    if check is not None and job_succeeded(check):
        st["preflight"] = "Passed"
        p.delete_workloads.append(check["metadata"]["name"])
        _start_attempt(p, job, obs, settings)
    elif check is not None and job_failed(check):
        _, reason, message = classify_failure(obs.pods)  # attempt 1 does not exist yet: these are its pods
        st["preflight"] = "Failed"  # its Job and pod stay for `kubectl logs`: they hold no GPU
        _finish(p, obs, "Failed", reason, f"preflight failed, no GPU was requested: {message}")
    else:
        p.create_preflight = check is None
        st.update(preflight="Running", phase="Pending", reason="Preflight", nodes=f"0/{job.spec.distributed.num_nodes}",
                  message="checking the model, the data and the output volume before requesting GPUs")
        if p.create_preflight:
            _refused(p, obs, PREFLIGHT_ATTEMPT)


CREATE_REFUSALS = (ATTEMPT_REFUSED, NAME_CONFLICT)


def _refused(p: Plan, obs: Observed, attempt: int) -> None:
    """The attempt about to be created was refused last time: say why while it is retried (a policy or webhook
    refusing Jobs or pods' specs, or a child's name taken by an object that is not ours; nothing else shows a write
    that never happened)."""
    if obs.refused is None or obs.refused[0] != attempt:
        return
    _, reason, why = obs.refused
    what = "the preflight" if attempt == PREFLIGHT_ATTEMPT else f"attempt {attempt}"
    if reason == NAME_CONFLICT:
        message = (f"{what} was not created: {why}. The operator never adopts or changes an object it did not "
                   "create: rename or delete that object, or create the FineTuneJob under another name (looked at "
                   "again every 15 s)")
    else:
        message = (f"the apiserver refused to create {what}'s Job or its children ({why}); retried until it is "
                   "allowed: change the admission policy or webhook that refuses it, or the job's spec")
    p.status.update(reason=reason, message=message)
    if p.status.get("phase") != "Restarting":
        p.status["phase"] = "Pending"


def _start_attempt(p: Plan, job: ValidatedJob, obs: Observed, settings: Settings) -> None:
    st = p.status
    if st.get("phase") == "Restarting":
        since = _condition_time(obs.status, "Restarting") or obs.now
        retries = st.get("scheduleRetries", 0) if st.get("reason") == "ScheduleTimeout" else st.get("restarts", 0)
        wait = (since + timedelta(seconds=backoff(settings, retries)) - obs.now).total_seconds()
        if wait > 0:
            p.requeue(wait)
            return
    if obs.old_pods:
        st["message"] = f"waiting for {obs.old_pods} pod(s) of the previous attempt to stop"
        p.requeue(2)
        return
    p.create_attempt = st["attempt"]
    st["gpus"], st["globalBatchSize"] = job.spec.total_gpus, job.spec.global_batch_size
    _refused(p, obs, st["attempt"])
    checkpoint = obs.status.get("checkpoint") or {}
    p.resume_from = checkpoint.get("path") if job.spec.checkpoints.resume == "auto" else None
    if p.resume_from:  # the trainer checks it was made by the same model and method (else exit 78, explained)
        p.create_events.append(Event("Normal", "Resuming", f"attempt {st['attempt']} starts from {p.resume_from} "
                                                    f"(step {checkpoint.get('step', 0)})"))
    st["nodes"] = f"0/{job.spec.distributed.num_nodes}"
    if st.get("phase") != "Restarting":
        st["phase"] = "Pending"


def _suspension(p: Plan, obs: Observed, workload: dict, want_suspend: bool, is_suspended: bool) -> bool:
    """Suspend or resume the attempt the way its owner understands; True when Kueue manages it. A Kueue-managed
    Job's spec.suspend is Kueue's: the Workload is deactivated instead (Kueue evicts it, the pods get their SIGTERM
    checkpoint, the quota is released) and activated again to re-queue."""
    name = workload["metadata"]["name"]
    kueue = queueing.kueue_workload(obs.kueue_workloads, workload)
    if not queueing.managed(workload, kueue):
        if want_suspend and not is_suspended:
            p.suspend_workload = (name, True)
        elif not want_suspend and is_suspended:
            p.suspend_workload = (name, False)
        p.status.pop("kueueDeactivated", None)
        return False
    if want_suspend:
        if kueue is None:
            p.requeue(2)  # Kueue has not made the Workload yet: deactivate it once it has
        elif kueue.get("active", True):
            p.kueue_active = (kueue["name"], False)
            p.status["kueueDeactivated"] = True
    elif p.status.get("kueueDeactivated") and kueue is not None:
        if not kueue.get("active", True):
            p.kueue_active = (kueue["name"], True)
        else:
            p.status.pop("kueueDeactivated", None)
    return True


def _edited(spec: Any, workload: dict[str, Any]) -> bool:
    """The attempt's Job was rendered from another spec than the current one (runPolicy and suspend aside); an
    attempt from an operator that wrote no such digest is taken as unedited."""
    rendered = ((workload.get("metadata") or {}).get("annotations") or {}).get(c.ANNOTATION_ATTEMPT_SPEC_HASH)
    return rendered is not None and rendered != attempt_spec_hash(spec)


def _resuming(obs: Observed, workload: dict[str, Any], want_suspend: bool, is_suspended: bool) -> bool:
    """The user cleared spec.suspend of an attempt that is suspended because of it (by the operator, or through its
    deactivated Kueue Workload), not a Job merely waiting in Kueue's queue."""
    if want_suspend or _finished(workload):
        return False
    if obs.status.get("kueueDeactivated"):
        return True
    return is_suspended and queueing.suspended_by_operator(workload)


def _resume_edited(p: Plan, workload: dict[str, Any]) -> None:
    """Resumed after the spec was edited: the suspended attempt goes and the next one, rendered from the edited
    spec, resumes from the newest checkpoint (not a restart: nothing failed)."""
    st = p.status
    before = st["attempt"]
    st["attempt"] = before + 1
    st.pop("kueueDeactivated", None)
    st.update(phase="Pending", reason="SpecChanged", message=(
        f"resumed with an edited spec: attempt {before + 1} starts from the newest checkpoint with it (attempt "
        f"{before} ran the spec from before the edit)"))
    p.delete_workloads.append(workload["metadata"]["name"])


def _observe_attempt(p: Plan, job: ValidatedJob, obs: Observed, workload: dict) -> None:
    spec, st = job.spec, p.status
    nodes = attempt_nodes(workload, spec.distributed.num_nodes)  # the running attempt's topology, not an edit's
    want_suspend = spec.suspend
    is_suspended = bool((workload.get("spec") or {}).get("suspend"))
    # The digest is computed only when it can matter (a resume, a new generation), not on every pass.
    if _resuming(obs, workload, want_suspend, is_suspended) and _edited(spec, workload):
        _resume_edited(p, workload)
        return
    if (obs.generation != obs.status.get("observedGeneration") and not _finished(workload)
            and _edited(spec, workload)):
        how = ("it applies when the job resumes (a new attempt, from the newest checkpoint)" if want_suspend else
               "suspend and resume the job to apply it now (it saves a checkpoint and a new attempt resumes from "
               "it), or it applies at the next gang restart")
        p.events.append(Event("Normal", "SpecEdited", (
            f"the spec was edited (generation {obs.generation}); attempt {st['attempt']} keeps the spec it was "
            f"created with (only runPolicy and suspend apply at once): {how}")))
    queued = _suspension(p, obs, workload, want_suspend, is_suspended)
    if nodes != spec.distributed.num_nodes and not _finished(workload):
        p.topology_change = (f"spec.distributed.numNodes is {spec.distributed.num_nodes}, attempt {st['attempt']} "
                             f"runs on {nodes} node(s): the new topology applies from the next attempt (a gang "
                             "restart); the running one keeps its own")
    ready = ready_pods(workload)
    # Pods that finished their work still count: a gang whose first node exits a moment before the others is
    # finishing, not Pending again.
    running = ready + succeeded_pods(workload)
    st["nodes"] = f"{min(running, nodes)}/{nodes}"
    if job_succeeded(workload):
        _finish(p, obs, "Succeeded", "Succeeded", f"attempt {st['attempt']} completed on {nodes} node(s)")
    elif job_failed(workload):  # kept (see _advance): its pods tell what happened
        code, reason, message = classify_failure(obs.pods)
        _failed_attempt(p, job, obs, reason, message, code=code)
    elif want_suspend:
        st.update(phase="Suspended", reason="Suspended", message="suspended by spec.suspend; "
                  "checkpoints are kept and the job resumes from the newest one"
                  + ("; its Kueue workload is deactivated, so it holds no quota" if queued else ""))
    elif is_suspended and queued:
        reason, message = queueing.waiting(queueing.kueue_workload(obs.kueue_workloads, workload))
        st.update(phase="Queued", reason=reason, message=message)
        _follow_kueue_labels(p, obs, workload)
    elif is_suspended:  # our own unsuspend (spec.suspend cleared) is on its way
        st.update(phase="Pending", reason="Resuming", message=f"attempt {st['attempt']}: resuming from the newest "
                  "checkpoint")
    elif running >= nodes:
        if st.get("phase") != "Running" or ready == nodes:
            st.update(phase="Running", reason="Running",
                      message=f"attempt {st['attempt']}: {nodes} node(s) running")
        _stall_check(p, job, obs, workload["metadata"]["name"])
    else:
        _waiting(p, job, obs, workload, min(running, nodes), nodes)


def _follow_kueue_labels(p: Plan, obs: Observed, workload: dict[str, Any]) -> None:
    """A queued attempt follows the FineTuneJob's Kueue labels (a misspelled queue fixed with `kubectl label ftj`,
    a job moved to another queue or given a higher priority class): Kueue lets a waiting Job's queue and priority
    class change and updates its Workload. An admitted (running) attempt keeps its own; a label removed is not
    followed (Kueue still holds the Job)."""
    have = (workload.get("metadata") or {}).get("labels") or {}
    changed = {k: v for k, v in obs.labels.items()
               if k.startswith(c.KUEUE_PREFIX) and k != c.LABEL_KUEUE_PREBUILT and v and have.get(k) != v}
    if changed:
        p.kueue_labels = (workload["metadata"]["name"], changed, {k: have.get(k) for k in changed})


def _waiting(p: Plan, job: ValidatedJob, obs: Observed, workload: dict[str, Any], running: int, nodes: int) -> None:
    """Not every node runs: say why (from the pods and the Job's events, once they were read), give up on a
    partial gang after scheduleTimeoutSeconds, and look again soon: no pod watch tells us when things change."""
    st = p.status
    why = waiting_reason(obs.pods, obs.events)
    created = parse_time((workload.get("metadata") or {}).get("creationTimestamp"))
    age = (obs.now - created).total_seconds() if created is not None else 0.0
    timeout = job.spec.run_policy.schedule_timeout_seconds
    queued = queueing.managed(workload, queueing.kueue_workload(obs.kueue_workloads, workload))
    if timeout and not queued and created is not None and age >= timeout:
        _schedule_timeout(p, job, obs, workload, running, nodes, why)
        return
    p.requeue(WAIT_RECHECK_SECONDS if age >= WAIT_GRACE_SECONDS else WAIT_GRACE_SECONDS - age)
    if timeout and not queued and created is not None:
        p.requeue(timeout - age)
    if why is not None:
        st.update(phase="Pending", reason=why[0], message=f"attempt {st['attempt']}: {running}/{nodes} node(s) "
                  f"running; {why[1]}")
    elif (not obs.looked and st.get("phase") == "Pending" and st.get("reason") in WAITING_REASONS
          and st.get("reason") not in CREATE_REFUSALS):  # a refusal is over once the Job exists
        return  # not looked at this pass: the reason found last time stands until the next look
    elif st.get("phase") != "Restarting" or running:  # a restarted gang reads Restarting until its pods run
        keep = st.get("reason") if st.get("phase") == "Pending" and st.get("reason") not in WAITING_REASONS else None
        st.update(phase="Pending", reason=keep or "Pending",
                  message=f"attempt {st['attempt']}: {running}/{nodes} node(s) running")


def _schedule_timeout(p: Plan, job: ValidatedJob, obs: Observed, workload: dict[str, Any], running: int,
                      nodes: int, why: tuple[str, str] | None) -> None:
    """A partial gang holds GPUs and trains nothing: tear it down, retry with backoff. Counted in scheduleRetries,
    not against backoffLimit (nothing failed); Kueue-managed jobs are left to Kueue."""
    st = p.status
    timeout = job.spec.run_policy.schedule_timeout_seconds
    limit = job.spec.run_policy.schedule_retry_limit
    if st.get("scheduleRetries", 0) >= limit:
        detail = f"; {why[1]}" if why else ""
        _finish(p, obs, "Failed", "ScheduleRetriesExhausted", (
            f"attempt {st['attempt']}: {running}/{nodes} node(s) ran within scheduleTimeoutSeconds={timeout} after "
            f"{limit} retries (runPolicy.scheduleRetryLimit){detail}; its pods were deleted"))
        p.delete_workloads.append(workload["metadata"]["name"])
        return
    st["scheduleRetries"] = st.get("scheduleRetries", 0) + 1
    st["attempt"] = st["attempt"] + 1
    p.delete_workloads.append(workload["metadata"]["name"])
    detail = f"; {why[1]}" if why else ""
    st.update(phase="Restarting", reason="ScheduleTimeout",
              message=f"attempt {st['attempt'] - 1}: {running}/{nodes} node(s) ran within scheduleTimeoutSeconds="
                      f"{timeout}{detail}; its pods were deleted to free their GPUs, retry "
                      f"{st['scheduleRetries']} starts after a backoff")
    p.rescheduled = True


def _failed_attempt(p: Plan, job: ValidatedJob, obs: Observed, reason: str, message: str, code: int | None) -> None:
    st = p.status
    limit = job.spec.run_policy.backoff_limit
    if reason == DISRUPTED:  # stopped from outside: not the job's failure, never counted against backoffLimit
        st["disruptions"] = st.get("disruptions", 0) + 1
        st["attempt"] = st["attempt"] + 1
        p.restarted = True
        st.update(phase="Restarting", reason=reason,
                  message=f"attempt {st['attempt'] - 1} was disrupted ({message}); the gang restarts from the newest "
                          f"checkpoint (disruption {st['disruptions']}, not counted against backoffLimit)")
        return
    if code is not None and exit_codes.is_permanent(code):
        _finish(p, obs, "Failed", reason, f"{message} (exit {code}: not retried)")
    elif st.get("restarts", 0) >= limit:
        _finish(p, obs, "Failed", "BackoffLimitExceeded",
                f"attempt {st['attempt']} failed ({reason}: {message}); backoffLimit {limit} reached")
    else:
        st["restarts"] = st.get("restarts", 0) + 1
        st["attempt"] = st["attempt"] + 1
        p.restarted = True  # also while already Restarting: the backoff clock starts again
        st.update(phase="Restarting", reason=reason,
                  message=f"attempt {st['attempt'] - 1} failed ({message}); gang restart "
                          f"{st['restarts']}/{limit} resumes from the newest checkpoint")


def _stall_check(p: Plan, job: ValidatedJob, obs: Observed, workload: str) -> None:
    timeout = job.spec.run_policy.stall_timeout_seconds
    if not timeout:
        return
    progress_at = parse_time((obs.status.get("progress") or {}).get("updatedAt"))
    running_since = _condition_time(obs.status, "Running") or obs.now
    heartbeat = max(t for t in (progress_at, running_since) if t is not None)
    silent = (obs.now - heartbeat).total_seconds()
    if silent <= timeout:
        p.requeue(timeout - silent + 1)
        return
    _failed_attempt(p, job, obs, "Stalled", f"no progress heartbeat for {int(silent)}s (stallTimeoutSeconds="
                    f"{timeout})", code=None)
    p.stalled = True
    p.delete_workloads.append(workload)


def _resume_step(job: ValidatedJob, status: dict[str, Any]) -> int:
    """The step the next attempt starts from (what _start_attempt and the trainer's resume rules pick)."""
    resume = job.spec.checkpoints.resume
    if resume == "auto":
        return int((status.get("checkpoint") or {}).get("step") or 0)
    found = re.search(r"checkpoint-(\d+)/*$", resume) if resume != "never" else None
    return int(found.group(1)) if found else 0


def _finish(p: Plan, obs: Observed, phase: str, reason: str, message: str) -> None:
    p.status.update(phase=phase, reason=reason, message=message)
    p.status.setdefault("completionTime", format_time(obs.now))


def _ttl(p: Plan, job: ValidatedJob, obs: Observed) -> None:
    ttl = job.spec.run_policy.ttl_seconds_after_finished
    finished = parse_time(obs.status.get("completionTime"))
    if ttl is None or finished is None:
        return
    left = (finished + timedelta(seconds=ttl) - obs.now).total_seconds()
    if left <= 0:
        p.delete_job = True
    else:
        p.requeue(left)


def _last_failed_attempt(workloads: list[dict[str, Any]], attempt: int) -> dict[str, Any] | None:
    failed = [w for w in workloads if 0 < (attempt_of(w) or 0) < attempt and job_ended_failed(w)]
    return max(failed, key=lambda w: attempt_of(w) or 0, default=None)


def _finished(workload: dict[str, Any]) -> bool:
    """Ended for good (a queued attempt's Job with a failed pod has not: its other pods run until it is deleted)."""
    return job_succeeded(workload) or job_ended_failed(workload)


def _condition_time(status: dict[str, Any], kind: str) -> datetime | None:
    for cd in status.get("conditions") or []:
        if cd.get("type") == kind and cd.get("status") == "True":
            return parse_time(cd.get("lastTransitionTime"))
    return None


def _set_conditions(p: Plan, obs: Observed) -> None:
    st = p.status
    phase = st.get("phase")
    wanted = {
        "Created": bool(st.get("attempt")),
        "Waiting": phase == "Pending" and st.get("reason") in WAITING_REASONS,
        "Running": phase == "Running",
        "Restarting": phase == "Restarting",
        "Suspended": phase in ("Suspended", "Queued"),
        "Stalled": p.stalled or (phase == "Restarting" and has_condition({"status": obs.status}, "Stalled")),
        "TopologyChangePending": p.topology_change is not None,
        "Succeeded": phase == "Succeeded",
        "Failed": phase == "Failed",
    }
    old = {cd["type"]: cd for cd in obs.status.get("conditions") or []}
    conditions = []
    for kind in CONDITION_TYPES:
        value = "True" if wanted[kind] else "False"
        before = old.get(kind)
        if before is None and value == "False":
            continue
        # A new failure while already Restarting restarts the backoff clock, though the condition stays True.
        renewed = kind == "Restarting" and (p.restarted or p.rescheduled)
        if before is None or before.get("status") != value or renewed:
            since = format_time(obs.now)
        else:
            since = before.get("lastTransitionTime")
        reason, message = _condition_text(kind, st, p)
        if value == "False":  # why it no longer holds: what the job is doing instead
            reason, message = _condition_false(kind, st, before)
        conditions.append({
            "type": kind, "status": value, "reason": reason, "message": message,
            "lastTransitionTime": since,
            "observedGeneration": obs.generation,
        })
    st["conditions"] = conditions


def _condition_false(kind: str, st: dict[str, Any], before: dict[str, Any] | None) -> tuple[str, str]:
    """A condition that stopped holding: the phase's reason and a short word on what the job does now."""
    phase = st.get("phase") or "Pending"
    if before is not None and before.get("status") == "False" and before.get("message"):
        return before.get("reason") or phase, before["message"]  # unchanged since it became False
    return st.get("reason") or phase, f"{kind} no longer holds: the job is {phase}" + (
        f" ({exit_codes.short(st['message'], 200)})" if st.get("message") else "")


def _condition_text(kind: str, st: dict[str, Any], p: Plan) -> tuple[str, str]:
    """A condition keeps its own reason: Created says the attempt was created, not why the job now waits; the
    conditions that describe the current phase carry the phase's reason and message."""
    if kind == "Created":
        return "Created", f"attempt {st.get('attempt')} created"
    if kind == "Stalled":
        return "Stalled", "no progress heartbeat within spec.runPolicy.stallTimeoutSeconds"
    if kind == "TopologyChangePending":
        return kind, p.topology_change or ""
    if kind in ("Running", "Succeeded"):
        return kind, st.get("message") or ""
    return st.get("reason") or kind, st.get("message") or ""
