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
from . import goodput
from .observed import (
    attempt_nodes,
    attempt_of,
    classify_failure,
    format_time,
    has_condition,
    job_failed,
    job_succeeded,
    parse_time,
    ready_pods,
    succeeded_pods,
)
from .settings import Settings

OPERATOR_STATUS_FIELDS = ("phase", "reason", "message", "conditions", "attempt", "restarts", "nodes", "gpus",
                          "globalBatchSize", "startTime", "completionTime", "observedGeneration", "goodput",
                          "preflight")
CONDITION_TYPES = ("Created", "Running", "Restarting", "Suspended", "Stalled", "Succeeded", "Failed")


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
    delete_job: bool = False
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    restarted: bool = False  # this pass started a gang restart (for the restarts metric)
    create_preflight: bool = False  # apply the ConfigMap and the preflight Job (render/preflight.py)
    stalled: bool = False  # this pass restarts a gang for lack of a heartbeat: the Stalled condition turns True

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
    goodput.account(p.status, obs.status, obs.now, p.status.get("gpus") or 0, p.restarted,
                    0 if isinstance(job, InvalidSpec) else _resume_step(job, obs.status))
    _set_conditions(p, obs)
    if p.status.get("phase") != previous_phase:
        kind = "Warning" if p.status.get("phase") in ("Failed", "Restarting") else "Normal"
        p.events.append(Event(kind, p.status.get("reason") or p.status["phase"],
                              p.status.get("message") or f"phase {p.status['phase']}"))
    return p


def _advance(p: Plan, job: ValidatedJob, obs: Observed, settings: Settings) -> None:
    spec, st, now = job.spec, p.status, obs.now
    st["gpus"], st["globalBatchSize"] = spec.total_gpus, spec.global_batch_size
    if not st.get("attempt"):
        # The message the first look at the attempt would write anyway: one status write fewer per job.
        st.update(attempt=1, restarts=0, startTime=format_time(now), phase="Pending", reason="Created",
                  message=f"attempt 1: 0/{spec.distributed.num_nodes} node(s) running")
    attempt = st["attempt"]
    deadline = spec.run_policy.active_deadline_seconds
    started = parse_time(st.get("startTime"))
    if deadline and started and now >= started + timedelta(seconds=deadline):
        _finish(p, obs, "Failed", "DeadlineExceeded", f"ran longer than activeDeadlineSeconds={deadline}")
        p.delete_workloads = [w["metadata"]["name"] for w in obs.workloads if not _finished(w)]
        return
    if deadline and started:
        p.requeue((started + timedelta(seconds=deadline) - now).total_seconds())

    current = next((w for w in obs.workloads if attempt_of(w) == attempt), None)
    checking = spec.run_policy.preflight and current is None and attempt == 1 and st.get("preflight") != "Passed"
    # Finished ones too: a pass that wrote the restart may have died before deleting the failed attempt, and its
    # Failed pods would otherwise stay (and be waited for) forever. The preflight is attempt 0.
    p.delete_workloads = [w["metadata"]["name"] for w in obs.workloads
                          if (attempt_of(w) or 0) < attempt and not (checking and attempt_of(w) == 0)]
    if checking:
        _preflight(p, job, obs, settings)
    elif current is None:
        _start_attempt(p, job, obs, settings)
    else:
        _observe_attempt(p, job, obs, current)


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
        st["preflight"] = "Failed"
        _finish(p, obs, "Failed", reason, f"preflight failed, no GPU was requested: {message}")
        p.delete_workloads.append(check["metadata"]["name"])
    else:
        p.create_preflight = check is None
        st.update(preflight="Running", phase="Pending", reason="Preflight", nodes=f"0/{job.spec.distributed.num_nodes}",
                  message="checking the model, the data and the output volume before requesting GPUs")


def _start_attempt(p: Plan, job: ValidatedJob, obs: Observed, settings: Settings) -> None:
    st = p.status
    if st.get("phase") == "Restarting":
        since = _condition_time(obs.status, "Restarting") or obs.now
        wait = (since + timedelta(seconds=backoff(settings, st.get("restarts", 0))) - obs.now).total_seconds()
        if wait > 0:
            p.requeue(wait)
            return
    if obs.old_pods:
        st["message"] = f"waiting for {obs.old_pods} pod(s) of the previous attempt to stop"
        p.requeue(2)
        return
    p.create_attempt = st["attempt"]
    checkpoint = obs.status.get("checkpoint") or {}
    p.resume_from = checkpoint.get("path") if job.spec.checkpoints.resume == "auto" else None
    st["nodes"] = f"0/{job.spec.distributed.num_nodes}"
    if st.get("phase") != "Restarting":
        st["phase"] = "Pending"


def _observe_attempt(p: Plan, job: ValidatedJob, obs: Observed, workload: dict) -> None:
    spec, st = job.spec, p.status
    name = workload["metadata"]["name"]
    nodes = attempt_nodes(workload, spec.distributed.num_nodes)  # the running attempt's topology, not an edit's
    queued = bool(obs.labels.get(c.LABEL_KUEUE_QUEUE))
    want_suspend = spec.run_policy.suspend
    is_suspended = bool((workload.get("spec") or {}).get("suspend"))
    if want_suspend and not is_suspended:
        p.suspend_workload = (name, True)
    elif not want_suspend and is_suspended and not queued:
        p.suspend_workload = (name, False)  # Kueue-managed workloads are unsuspended by Kueue, never by us
    ready = ready_pods(workload)
    # Pods that finished their work still count: a gang whose first node exits a moment before the others is
    # finishing, not Pending again.
    running = ready + succeeded_pods(workload)
    st["nodes"] = f"{min(running, nodes)}/{nodes}"
    if job_succeeded(workload):
        _finish(p, obs, "Succeeded", "Succeeded", f"attempt {st['attempt']} completed on {nodes} node(s)")
    elif job_failed(workload):
        code, reason, message = classify_failure(obs.pods)
        _failed_attempt(p, job, obs, reason, message, code=code)
        p.delete_workloads.append(name)
    elif want_suspend:
        st.update(phase="Suspended", reason="Suspended", message="suspended by spec.runPolicy.suspend; "
                  "checkpoints are kept and the job resumes from the newest one")
    elif is_suspended and queued:
        st.update(phase="Queued", reason="Queued", message="waiting for Kueue to admit the workload")
    elif is_suspended:  # our own unsuspend (spec.runPolicy.suspend cleared) is on its way
        st.update(phase="Pending", reason="Resuming", message=f"attempt {st['attempt']}: resuming from the newest "
                  "checkpoint")
    elif running >= nodes:
        if st.get("phase") != "Running" or ready == nodes:
            st.update(phase="Running", reason="Running",
                      message=f"attempt {st['attempt']}: {nodes} node(s) running")
        _stall_check(p, job, obs, name)
    elif st.get("phase") != "Restarting" or ready:  # a restarted gang reads Restarting until its pods run
        pending = st.get("reason") if st.get("phase") == "Pending" else "Pending"  # Created stays until Running
        st.update(phase="Pending", reason=pending,
                  message=f"attempt {st['attempt']}: {min(running, nodes)}/{nodes} node(s) running")


def _failed_attempt(p: Plan, job: ValidatedJob, obs: Observed, reason: str, message: str, code: int | None) -> None:
    st = p.status
    limit = job.spec.run_policy.backoff_limit
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


def _finished(workload: dict[str, Any]) -> bool:
    return job_succeeded(workload) or job_failed(workload)


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
        "Running": phase == "Running",
        "Restarting": phase == "Restarting",
        "Suspended": phase in ("Suspended", "Queued"),
        "Stalled": p.stalled or (phase == "Restarting" and has_condition({"status": obs.status}, "Stalled")),
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
        renewed = kind == "Restarting" and p.restarted
        if before is None or before.get("status") != value or renewed:
            since = format_time(obs.now)
        else:
            since = before.get("lastTransitionTime")
        reason, message = _condition_text(kind, st)
        conditions.append({
            "type": kind, "status": value,
            "reason": reason if value == "True" else (before or {}).get("reason", kind),
            "message": message if value == "True" else "",
            "lastTransitionTime": since,
            "observedGeneration": obs.generation,
        })
    st["conditions"] = conditions


def _condition_text(kind: str, st: dict[str, Any]) -> tuple[str, str]:
    """A condition keeps its own reason: Created says the attempt was created, not why the job now waits; the
    conditions that describe the current phase carry the phase's reason and message."""
    if kind == "Created":
        return "Created", f"attempt {st.get('attempt')} created"
    if kind == "Stalled":
        return "Stalled", "no progress heartbeat within spec.runPolicy.stallTimeoutSeconds"
    if kind in ("Running", "Succeeded"):
        return kind, st.get("message") or ""
    return st.get("reason") or kind, st.get("message") or ""
