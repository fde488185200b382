"""The FineTuneJob state machine, pure: (validated spec or errors, observed children, now) -> Plan.

The Plan holds the whole operator-owned status (written once per pass), the actions to take on children, the
Events for transitions and when to look again. Trainer-owned fields (status.progress, status.checkpoint) are read,
never written. The plan's data is in planning.py; why a gang waits or was refused in waiting.py, suspend/resume and
Kueue's labels in suspension.py, the conditions in conditions.py.
"""

import re
from datetime import timedelta
from typing import Any

from ..api import constants as c
from ..api import exit_codes
from ..api.errors import InvalidSpec
from ..api.sources import own_checkpoint
from ..api.status import TERMINAL_PHASES
from ..api.validation import ValidatedJob
from ..fit import WARN_FRACTION
from ..render.preflight import PREFLIGHT_ATTEMPT
from ..render.workload import started_spec_digest
from . import goodput, queueing
from .conditions import set_conditions
from .deadlines import active_clock, active_seconds, attempt_deadline, follow_deadline
from .in_place import announce_workers, lost_pods, nodes_text
from .observed import (
    DISRUPTED,
    RUNTIME_RETRY_SECONDS,
    WAITING_REASONS,
    attempt_nodes,
    attempt_of,
    classify_failure,
    failed_pods,
    format_time,
    job_ended_failed,
    job_failed,
    job_succeeded,
    min_nodes_of,
    parse_time,
    preflight_report,
    ready_pods,
    restarts_in_place_of,
    succeeded_pods,
)
from .planning import OPERATOR_STATUS_FIELDS, Event, Observed, Plan, condition_time, finish, finished
from .settings import Settings
from .suspension import edited, follow_kueue_labels, resume_edited, resuming, suspension
from .upkeep import post_notice, stale_progress
from .waiting import CREATE_REFUSALS, never_fits, refused, waiting


def backoff(settings: Settings, restarts: int) -> float:
    return min(settings.restart_backoff_seconds * 2 ** max(restarts - 1, 0), settings.restart_backoff_max_seconds)


def plan(job: ValidatedJob | InvalidSpec, obs: Observed, settings: Settings = Settings()) -> Plan:
    st = {k: obs.status.get(k) for k in OPERATOR_STATUS_FIELDS if obs.status.get(k) is not None}
    st["observedGeneration"] = obs.generation
    p = Plan(status=st)
    previous_phase = obs.status.get("phase")
    live = [w for w in obs.workloads if not finished(w)]
    if isinstance(job, InvalidSpec):
        finish(p, obs, "Failed", "InvalidSpec", job.summary())
        p.delete_workloads = [w["metadata"]["name"] for w in live]  # never keep GPUs busy for a broken spec
    elif obs.runtime_missing is not None:
        # Nothing is created without the defaults and limits the job asked for; the admin may be creating it.
        p.status.update(phase="Pending", reason=obs.runtime_reason,
                        message=f"{obs.runtime_missing} (looked at again every {RUNTIME_RETRY_SECONDS:.0f} s)")
        p.requeue(RUNTIME_RETRY_SECONDS)
    elif previous_phase in TERMINAL_PHASES:
        p.delete_workloads = [w["metadata"]["name"] for w in live if previous_phase == "Failed"]
        _ttl(p, job, obs)
    else:
        _advance(p, job, obs, settings)
    if obs.runtime is not None and st.get("startTime"):
        # Recorded when the job first really starts (never for an attempt created suspended): what every attempt,
        # and every later edit, is judged against (controller/runtimes.py).
        st["runtime"] = obs.runtime
    elif st.get("startTime") and obs.runtime_missing is None and isinstance(job, ValidatedJob):
        # Runs with no runtime, started so or edited while none covered it: what every later edit is compared with
        # (controller/runtimes.py).
        st["startedSpecDigest"] = started_spec_digest(job.spec, obs.labels)
    _keep_admission(p, obs, settings)
    goodput.account(p.status, obs.status, obs.now, p.status.get("gpus") or 0, p.restarted,
                    0 if isinstance(job, InvalidSpec) else _resume_step(job, obs.status))
    set_conditions(p, obs)
    post_notice(p, obs)
    active_clock(p, obs)
    stale_progress(p, obs)
    phase, reason = p.status.get("phase"), p.status.get("reason")
    waits = phase == "Pending" and reason in WAITING_REASONS
    queued = phase == "Queued"
    # A refusal is announced in any phase (Restarting too): its reason changes, not its phase.
    told = waits or queued or reason in CREATE_REFUSALS
    if phase != previous_phase or (told and reason != obs.status.get("reason")):
        warn = phase in ("Failed", "Restarting") or waits or reason in (*queueing.NEVER_ADMITTED, "Preempted")
        event = Event("Warning" if warn else "Normal", reason or p.status["phase"],
                      p.status.get("message") or f"phase {p.status['phase']}")
        # "Created" (or any good news) of a pass that creates the attempt is said once the creation happened: a
        # name clash or a refusal is told instead, by the next pass.
        creates = p.create_attempt is not None or p.create_preflight
        (p.create_events if creates and not warn else p.events).append(event)
    return p


def _keep_admission(p: Plan, obs: Observed, settings: Settings) -> None:
    """A gang restart keeps the Kueue admission of the failed attempt (queueing.py): its Workload is held before
    its Job is deleted and handed to the Job of the next attempt; a job that ends releases it, and so does a next
    attempt that is not created in time (settings.kueue_hold_grace_seconds past its backoff: a Job that cannot be
    created, refused by an admission policy, must not keep the queue's GPUs from everyone else)."""
    held = queueing.held(obs.kueue_workloads, obs.name, obs.uid)
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


def _advance(p: Plan, job: ValidatedJob, obs: Observed, settings: Settings) -> None:
    spec, st, now = job.spec, p.status, obs.now
    # GPUs and the global batch of the running attempt: an edit of the topology applies from the next attempt.
    st.setdefault("gpus", spec.total_gpus)
    st.setdefault("globalBatchSize", spec.global_batch_size)
    if not st.get("attempt"):
        # The message the first look at the attempt would write anyway: one status write fewer per job.
        st.update(attempt=1, restarts=0, phase="Pending", reason="Created",
                  message=f"attempt 1: {_nodes_text(spec, 0)} node(s) running")
        if never_fits(p, job, obs):
            return
    if not spec.suspend:
        # The job really starts (its first attempt is not created suspended, or it is resumed): not before.
        st.setdefault("startTime", format_time(now))
    attempt = st["attempt"]
    deadline = spec.run_policy.active_deadline_seconds
    active = active_seconds(st, now)
    if deadline and active >= deadline:
        finish(p, obs, "Failed", "DeadlineExceeded", f"active (not queued or suspended) for {int(active)}s, longer "
                f"than activeDeadlineSeconds={deadline}")
        p.delete_workloads = [w["metadata"]["name"] for w in obs.workloads if not finished(w)]
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


def _preflight(p: Plan, job: ValidatedJob, obs: Observed, settings: Settings) -> None:
    """Attempt 0: the preflight Job runs first; attempt 1 (and its GPUs) only after it succeeded."""
    st = p.status
    check = next((w for w in obs.workloads if attempt_of(w) == 0), None)
    if check is not None and job_succeeded(check):
        st["preflight"] = "Passed"
        memory = preflight_report(obs.pods).get("memoryEstimate")
        if memory:
            st["memoryEstimate"] = memory
            capacity = memory.get("capacityGiB")
            if capacity and memory.get("neededGiB", 0) > WARN_FRACTION * capacity:
                p.events.append(Event("Warning", "MemoryTight", (
                    f"predicted {memory['neededGiB']} GiB per GPU of {capacity} GiB "
                    f"({100 * memory['neededGiB'] / capacity:.0f}%; largest term: {memory.get('largestTerm')}): a "
                    "longer batch than the preflight saw could run out of memory; gradient checkpointing or a "
                    "smaller micro-batch leave room")))
        p.delete_workloads.append(check["metadata"]["name"])
        _start_attempt(p, job, obs, settings)
    elif check is not None and job_failed(check):
        _, reason, message = classify_failure(obs.pods)  # attempt 1 does not exist yet: these are its pods
        st["preflight"] = "Failed"  # its Job and pod stay for `kubectl logs`: they hold no GPU
        finish(p, obs, "Failed", reason, f"preflight failed, no GPU was requested: {message}")
    else:
        p.create_preflight = check is None
        st.setdefault("startTime", format_time(obs.now))  # the preflight runs even for a job created suspended
        st.update(preflight="Running", phase="Pending", reason="Preflight", nodes=f"0/{job.spec.distributed.num_nodes}",
                  message="checking the model, the data and the output volume before requesting GPUs")
        if p.create_preflight:
            refused(p, obs, PREFLIGHT_ATTEMPT)


def _start_attempt(p: Plan, job: ValidatedJob, obs: Observed, settings: Settings) -> None:
    st = p.status
    if st.get("phase") == "Restarting":
        since = condition_time(obs.status, "Restarting") or obs.now
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
    p.attempt_deadline = attempt_deadline(job.spec.run_policy.active_deadline_seconds, st, obs.now)
    st["gpus"], st["globalBatchSize"] = job.spec.total_gpus, job.spec.global_batch_size
    refused(p, obs, st["attempt"])
    checkpoint = obs.status.get("checkpoint") or {}
    p.resume_from = checkpoint.get("path") if job.spec.checkpoints.resume == "auto" else None
    if p.resume_from and not own_checkpoint(str(p.resume_from), job.spec.output.uri):
        # status.checkpoint is the trainer's to write: a path elsewhere (a token of the trainer identity, or code in
        # the pod, can write one) is not a checkpoint of this job, and would load weights from outside its limits.
        # The trainer finds the newest checkpoint in its own output by itself.
        p.resume_from = None
    if p.resume_from:  # the trainer checks it was made by the same model and method (else exit 78, explained)
        p.create_events.append(Event("Normal", "Resuming", f"attempt {st['attempt']} starts from {p.resume_from} "
                                                    f"(step {checkpoint.get('step', 0)})"))
    st["nodes"] = _nodes_text(job.spec, 0)
    if st.get("phase") != "Restarting":
        st["phase"] = "Pending"


def _nodes_text(spec: Any, running: int) -> str:
    return nodes_text(running, spec.distributed.num_nodes, spec.distributed.fewest_nodes)


def _observe_attempt(p: Plan, job: ValidatedJob, obs: Observed, workload: dict) -> None:
    spec, st = job.spec, p.status
    nodes = attempt_nodes(workload, spec.distributed.num_nodes)  # the running attempt's topology, not an edit's
    fewest = min_nodes_of(workload, nodes)  # an elastic attempt trains on fewer (and Kueue may admit fewer)
    in_place = restarts_in_place_of(workload) is not None
    want_suspend = spec.suspend
    is_suspended = bool((workload.get("spec") or {}).get("suspend"))
    # The digest is computed only when it can matter (a resume, a new generation), not on every pass.
    if resuming(obs, workload, want_suspend, is_suspended) and edited(spec, workload):
        resume_edited(p, workload)
        return
    if (obs.generation != obs.status.get("observedGeneration") and not finished(workload)
            and edited(spec, workload)):
        how = ("it applies when the job resumes (a new attempt, from the newest checkpoint)" if want_suspend else
               "suspend and resume the job to apply it now (it saves a checkpoint and a new attempt resumes from "
               "it), or it applies at the next gang restart")
        p.events.append(Event("Normal", "SpecEdited", (
            f"the spec was edited (generation {obs.generation}); attempt {st['attempt']} keeps the spec it was "
            f"created with (only runPolicy and suspend apply at once): {how}")))
    queued = suspension(p, obs, workload, want_suspend, is_suspended)
    if not finished(workload):
        follow_deadline(p, obs, spec.run_policy.active_deadline_seconds, workload)
    # Kueue may admit an elastic attempt with fewer pods (partial admission): that is no edit of the topology.
    resized = min_nodes_of(workload, 0) > 0 and fewest <= nodes <= spec.distributed.num_nodes
    if nodes != spec.distributed.num_nodes and not finished(workload) and not resized:
        p.topology_change = (f"spec.distributed.numNodes is {spec.distributed.num_nodes}, attempt {st['attempt']} "
                             f"runs on {nodes} node(s): the new topology applies from the next attempt (a gang "
                             "restart); the running one keeps its own")
    ready = ready_pods(workload)
    # Pods that finished their work still count: a gang whose first node exits a moment before the others is
    # finishing, not Pending again.
    running = ready + succeeded_pods(workload)
    st["nodes"] = nodes_text(min(running, nodes), nodes, fewest)
    ended = None
    if in_place and (want_suspend or is_suspended):  # pods stopped by a suspend are no lost nodes
        st["recovery"] = {**(st.get("recovery") or {}), "attempt": st["attempt"], "podsFailed": failed_pods(workload)}
    elif in_place and not finished(workload):
        ended = lost_pods(p, job, obs, workload)
    if job_succeeded(workload):
        finish(p, obs, "Succeeded", "Succeeded", f"attempt {st['attempt']} completed on "
               f"{(obs.status.get('workers') or {}).get('nodes') or nodes} node(s)")
    elif job_failed(workload) or ended is not None:  # kept (see _advance): its pods tell what happened
        code, reason, message = ended or classify_failure(obs.pods)
        _failed_attempt(p, job, obs, reason, message, code=code)
        if ended is not None:  # its Job would replace the pods: the operator ends it
            p.delete_workloads.append(workload["metadata"]["name"])
    elif want_suspend:
        st.update(phase="Suspended", reason="Suspended", message="suspended by spec.suspend; "
                  "checkpoints are kept and the job resumes from the newest one"
                  + ("; its Kueue workload is deactivated, so it holds no quota" if queued else ""))
    elif is_suspended and queued:
        reason, message = queueing.waiting(queueing.kueue_workload(obs.kueue_workloads, workload))
        st.update(phase="Queued", reason=reason, message=message)
        follow_kueue_labels(p, obs, workload)
    elif is_suspended:  # our own unsuspend (spec.suspend cleared) is on its way
        st.update(phase="Pending", reason="Resuming", message=f"attempt {st['attempt']}: resuming from the newest "
                  "checkpoint")
    elif running >= fewest:
        if st.get("phase") != "Running" or ready >= fewest:
            text = f"{nodes}" if fewest == nodes else nodes_text(min(running, nodes), nodes, fewest)
            st.update(phase="Running", reason="Running", message=f"attempt {st['attempt']}: {text} node(s) running")
        if in_place:
            announce_workers(p, job, obs)
        _stall_check(p, job, obs, workload["metadata"]["name"])
    else:
        # A gang that restarts in place waits for its replaced pod as long as torchrun's rendezvous does, once it
        # has trained (its Job is old: the schedule timeout counts from its creation).
        formed = (st.get("recovery") or {}).get("attempt") == st["attempt"] and st["recovery"].get("generation")
        waiting(p, job, obs, workload, min(running, nodes), nodes, fewest, timeout_applies=not formed)


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
        finish(p, obs, "Failed", reason, f"{message} (exit {code}: not retried)")
    elif st.get("restarts", 0) >= limit:
        finish(p, obs, "Failed", "BackoffLimitExceeded",
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
    running_since = condition_time(obs.status, "Running") or obs.now
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
