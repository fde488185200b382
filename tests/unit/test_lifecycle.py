"""The FineTuneJob state machine, pure: every phase, gang restart, backoff, suspend/Kueue, deadline, stall, TTL."""

import dataclasses
import json
from datetime import UTC, datetime, timedelta

import pytest

from finetune_operator.api import constants as c
from finetune_operator.api.errors import FieldError, InvalidSpec
from finetune_operator.api.status import FineTuneJobStatus
from finetune_operator.api.validation import validate_job
from finetune_operator.controller import lifecycle
from finetune_operator.controller.observed import MESSAGE_LIMIT
from finetune_operator.controller.planning import Observed, only_cosmetic
from finetune_operator.controller.settings import Settings
from tests.builders import make_job

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
SETTINGS = Settings(restart_backoff_seconds=10, restart_backoff_max_seconds=300)


def plan(*args, **kwargs) -> lifecycle.Plan:
    """lifecycle.plan, with every planned status checked against the status model (and so the CRD schema)."""
    result = lifecycle.plan(*args, **kwargs)
    FineTuneJobStatus.model_validate(result.status)
    return result


def ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def job(**overrides):
    return validate_job(make_job({"spec.distributed.numNodes": 2, "spec.distributed.gpusPerNode": 8, **overrides}))


def workload(attempt, *, complete=False, failed=False, suspend=False, suspended_by="operator", labels=None):
    # What Kubernetes >= 1.31 sets first; Complete/Failed follow once every pod has ended.
    conditions = [{"type": "SuccessCriteriaMet", "status": "True"}] if complete else []
    conditions += [{"type": "FailureTarget", "status": "True"}] if failed else []
    meta = {"name": f"test-job-a{attempt}", "labels": {c.LABEL_ATTEMPT: str(attempt), **(labels or {})}}
    if suspend and suspended_by == "operator":
        meta["annotations"] = {c.ANNOTATION_SUSPENDED: "true"}
    return {"metadata": meta, "spec": {"suspend": suspend}, "status": {"conditions": conditions}}


def pod(i, phase="Running", exit_code=None, reason=None, message=None):
    status = {"phase": phase}
    if exit_code is not None:
        status["containerStatuses"] = [{"name": c.CONTAINER_NAME, "state": {"terminated": {
            "exitCode": exit_code, "reason": reason or "Error", "message": message}}}]
    return {"metadata": {"name": f"test-job-a1-{i}-x"}, "status": status}


def observe(status=None, workloads=(), pods=(), labels=None, now=T0, old_pods=0):
    """Pods given as Running are what the Job controller counts as ready in the Job's status."""
    ready = sum(1 for p in pods if p["status"]["phase"] == "Running")
    workloads = [{**w, "status": {**w["status"], "ready": ready}} for w in workloads]
    return Observed(name="test-job", namespace="ns", generation=3, labels=labels or {}, status=status or {},
                    workloads=list(workloads), pods=list(pods), now=now, old_pods=old_pods)


def running_status(attempt=1, restarts=0, since=T0, **extra):
    return {"phase": "Running", "attempt": attempt, "restarts": restarts, "startTime": ts(since),
            "conditions": [{"type": "Running", "status": "True", "lastTransitionTime": ts(since)}], **extra}


def conditions(p):
    return {cd["type"]: cd["status"] for cd in p.status["conditions"]}


def test_new_job_creates_attempt_one():
    p = plan(job(), observe())
    assert p.create_attempt == 1 and p.status["attempt"] == 1 and p.status["restarts"] == 0
    assert (p.status["phase"], p.status["nodes"], p.status["gpus"]) == ("Pending", "0/2", 16)
    assert p.status["startTime"] == ts(T0) and p.status["observedGeneration"] == 3
    assert conditions(p) == {"Created": "True"}
    # Said once the attempt is created (reconcile.py posts create_events only then), not by the plan.
    assert not p.events and [(e.type, e.reason) for e in p.create_events] == [("Normal", "Created")]


def test_running_when_every_node_runs():
    p = plan(job(), observe({"phase": "Pending", "attempt": 1, "startTime": ts(T0)}, [workload(1)],
                            [pod(0), pod(1)]))
    assert (p.status["phase"], p.status["nodes"]) == ("Running", "2/2")
    assert p.create_attempt is None and not p.delete_workloads
    assert conditions(p)["Running"] == "True"


def test_pending_while_part_of_the_gang_waits():
    p = plan(job(), observe({"phase": "Pending", "attempt": 1}, [workload(1)], [pod(0), pod(1, "Pending")]))
    assert (p.status["phase"], p.status["nodes"]) == ("Pending", "1/2")


def test_succeeded_with_completion_time_and_event():
    p = plan(job(), observe(running_status(), [workload(1, complete=True)], []))
    assert p.status["phase"] == "Succeeded" and p.status["completionTime"] == ts(T0)
    assert conditions(p) == {"Created": "True", "Running": "False", "Succeeded": "True"}
    assert [e.reason for e in p.events] == ["Succeeded"]


def test_retryable_failure_restarts_the_whole_gang_after_backoff():
    failed = [pod(0, "Failed", 137, "OOMKilled"), pod(1)]
    p = plan(job(), observe(running_status(), [workload(1, failed=True)], failed), SETTINGS)
    assert p.status["phase"] == "Restarting" and p.status["reason"] == "OOMKilled"
    assert (p.status["attempt"], p.status["restarts"]) == (2, 1)
    # The failed attempt's Job stays (its pods ended: no GPU held), so its pods' logs and exit codes can be read.
    assert p.delete_workloads == [] and p.create_attempt is None
    assert p.events[-1].type == "Warning"
    # 5 s later: still backing off (10 s for the first restart); at 10 s attempt 2 starts, resuming.
    later = observe({**p.status, "checkpoint": {"step": 40, "path": "/output/checkpoint-40"}}, [], [],
                    now=T0 + timedelta(seconds=5))
    waiting = plan(job(), later, SETTINGS)
    assert waiting.create_attempt is None and 4 <= waiting.requeue_after <= 5
    ready = plan(job(), observe(later.status, [], [], now=T0 + timedelta(seconds=10)), SETTINGS)
    assert ready.create_attempt == 2 and ready.resume_from == "/output/checkpoint-40"
    assert ready.status["phase"] == "Restarting"
    # Said with the creation itself (reconcile posts it only when the Job is really created: once, not per pass).
    assert [(e.type, e.reason, e.message) for e in ready.create_events] == [
        ("Normal", "Resuming", "attempt 2 starts from /output/checkpoint-40 (step 40)")]
    assert ready.events == []


@pytest.mark.parametrize("path, uri, taken", [
    ("/output/checkpoint-40", None, True), ("/output/../models/secret/checkpoint-900", None, False),
    ("/models/other-team/checkpoint-900", None, False), ("s3://other-team-private/runs/secret/checkpoint-900", None,
                                                          False),
    ("s3://runs/mine/checkpoint-40", "s3://runs/mine", True), ("s3://runs/mine-evil/checkpoint-40", "s3://runs/mine",
                                                               False),
    ("s3://runs/mine/../theirs/checkpoint-40", "s3://runs/mine", False)])
def test_a_new_attempt_resumes_only_from_a_checkpoint_of_the_jobs_own(path, uri, taken):
    """status.checkpoint is the trainer's to write (a trainer token, or code in its pod, can write it): a review had
    the next attempt load another team's checkpoint from it. Only the job's own output (or output.uri) is taken."""
    failed = [pod(0, "Failed", 137, "OOMKilled"), pod(1)]
    spec = job(**({"spec.output.uri": uri, "spec.s3": {"endpointURL": "http://minio:9000"}} if uri else {}))
    p = plan(spec, observe(running_status(), [workload(1, failed=True)], failed), SETTINGS)
    later = observe({**p.status, "checkpoint": {"step": 40, "path": path}}, [], [], now=T0 + timedelta(seconds=10))
    ready = plan(spec, later, SETTINGS)
    assert ready.create_attempt == 2 and ready.resume_from == (path if taken else None)
    assert [e.reason for e in ready.create_events] == (["Resuming"] if taken else [])


def test_restart_waits_until_the_old_gang_is_gone():
    status = {"phase": "Restarting", "attempt": 2, "restarts": 1,
              "conditions": [{"type": "Restarting", "status": "True", "lastTransitionTime": ts(T0)}]}
    later = T0 + timedelta(seconds=60)
    waiting = plan(job(), observe(status, [], [], now=later, old_pods=1), SETTINGS)
    assert waiting.create_attempt is None and "previous attempt to stop" in waiting.status["message"]
    assert plan(job(), observe(status, [], [], now=later, old_pods=0), SETTINGS).create_attempt == 2


@pytest.mark.parametrize(("code", "reason"), [(65, "DataError"), (78, "InvalidConfig"), (79, "LossDiverged")],
                         ids=["data", "config", "diverged"])
def test_permanent_exit_codes_fail_at_once(code, reason):
    message = json.dumps({"reason": reason, "message": "the details"})
    failed = [pod(0, "Failed", 1), pod(1, "Failed", code, message=message)]
    p = plan(job(), observe(running_status(), [workload(1, failed=True)], failed))
    assert p.status["phase"] == "Failed" and p.status["reason"] == reason
    assert "the details" in p.status["message"] and "not retried" in p.status["message"]
    assert p.status["restarts"] == 0


def test_backoff_limit_exceeded():
    failed = [pod(0, "Failed", 1)]
    status = running_status(attempt=4, restarts=3)
    p = plan(job(**{"spec.runPolicy.backoffLimit": 3}), observe(status, [workload(4, failed=True)], failed))
    assert p.status["phase"] == "Failed" and p.status["reason"] == "BackoffLimitExceeded"
    assert "backoffLimit 3 reached" in p.status["message"]


def test_backoff_doubles_and_is_capped():
    from finetune_operator.controller.lifecycle import backoff

    assert [backoff(SETTINGS, n) for n in (1, 2, 3, 10)] == [10, 20, 40, 300]


def test_suspend_stops_the_attempt_and_resume_continues_it():
    p = plan(job(**{"spec.suspend": True}), observe(running_status(), [workload(1)], [pod(0), pod(1)]))
    assert p.suspend_workload == ("test-job-a1", True) and p.status["phase"] == "Suspended"
    assert conditions(p)["Suspended"] == "True" and not p.delete_workloads
    resumed = plan(job(), observe(p.status, [workload(1, suspend=True)], []))
    assert resumed.suspend_workload == ("test-job-a1", False)


def test_kueue_queued_job_is_never_unsuspended_by_the_operator():
    labels = {c.LABEL_KUEUE_QUEUE: "gpu"}
    queued = workload(1, suspend=True, suspended_by="kueue", labels=labels)  # the label, copied to the Job
    p = plan(job(), observe({"phase": "Pending", "attempt": 1}, [queued], [], labels=labels))
    assert p.status["phase"] == "Queued" and p.suspend_workload is None
    assert "Kueue" in p.status["message"]


def test_a_queued_gang_restart_hands_its_admitted_kueue_workload_to_the_next_attempt():
    labels = {c.LABEL_KUEUE_QUEUE: "gpu"}
    admitted = [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}]
    first = workload(1, labels=labels)
    first["spec"]["backoffLimit"] = 2**31 - 1  # render/workload.py: a queued Job never fails by itself
    first["status"]["failed"] = 1
    first["metadata"]["annotations"] = {c.ANNOTATION_POD_SET_HASH: "abc"}
    kueue = {"name": "job-test-job-a1-1", "job": "test-job-a1", "holder": None, "active": True,
             "conditions": admitted}
    with_kueue = lambda obs, *kw: dataclasses.replace(obs, kueue_workloads=list(kw))  # noqa: E731
    failed = plan(job(), with_kueue(observe(running_status(), [first], [pod(0, "Failed", 1), pod(1)], labels),
                                    kueue), SETTINGS)
    assert failed.status["phase"] == "Restarting" and failed.status["attempt"] == 2
    assert not failed.delete_workloads  # its pods tell what happened first
    # The next pass deletes the failed Job, after the FineTuneJob took its Workload over (the quota stays held).
    later = T0 + timedelta(seconds=30)
    gone = plan(job(), with_kueue(observe(failed.status, [first], [], labels, now=later, old_pods=1), kueue),
                SETTINGS)
    assert gone.delete_workloads == ["test-job-a1"] and gone.hold_kueue == ("job-test-job-a1-1", "abc", ts(later))
    assert gone.create_attempt is None  # its other pods still run
    held = {**kueue, "job": None, "holder": "test-job", "podSetHash": "abc", "heldSince": ts(later)}
    start = plan(job(), with_kueue(observe(gone.status, [], [], labels, now=later), held), SETTINGS)
    assert start.create_attempt == 2 and start.offer_kueue == "job-test-job-a1-1" and start.hold_kueue is None
    assert start.requeue_after is not None and start.kueue_active is None
    second = workload(2, suspend=True, suspended_by="kueue",
                      labels={**labels, c.LABEL_KUEUE_PREBUILT: "job-test-job-a1-1"})
    hand = plan(job(), with_kueue(observe(start.status, [second], [], labels, now=later), held), SETTINGS)
    assert hand.hand_kueue == ("job-test-job-a1-1", "test-job-a2") and hand.create_attempt is None
    # A job that ends while it holds the Workload gives the quota back.
    ended = plan(job(), with_kueue(observe({**start.status, "phase": "Failed", "completionTime": ts(T0)}, [], [],
                                           labels, now=later), held), SETTINGS)
    assert ended.kueue_active == ("job-test-job-a1-1", False)
    # A next attempt whose Job is never created (a webhook refuses it) does not keep the queue's GPUs forever.
    limit = lifecycle.backoff(SETTINGS, 1) + SETTINGS.kueue_hold_grace_seconds
    waiting = plan(job(), with_kueue(observe(start.status, [], [], labels, now=later + timedelta(seconds=limit - 5)),
                                     held), SETTINGS)
    assert waiting.kueue_active is None and waiting.offer_kueue == "job-test-job-a1-1"
    assert waiting.requeue_after is not None and waiting.requeue_after <= 5  # it looks again when the time is up
    late = plan(job(), with_kueue(observe(start.status, [], [], labels, now=later + timedelta(seconds=limit + 1)),
                                  held), SETTINGS)
    assert late.kueue_active == ("job-test-job-a1-1", False) and late.offer_kueue is None
    assert [(e.type, e.reason) for e in late.events] == [("Warning", "KueueReleased")]


def test_a_refused_attempt_says_why_in_its_status_and_clears_once_its_job_exists():
    answer = "403: admission webhook \"policy.example.com\" denied the request: GPUs need a team label"
    first = plan(job(), observe())
    refused = plan(job(), dataclasses.replace(observe(first.status), refused=(1, "AttemptRefused", answer)))
    assert refused.create_attempt == 1  # retried
    assert (refused.status["phase"], refused.status["reason"]) == ("Pending", "AttemptRefused")
    assert answer in refused.status["message"] and conditions(refused)["Waiting"] == "True"
    assert [(e.type, e.reason) for e in refused.events] == [("Warning", "AttemptRefused")]
    again = plan(job(), dataclasses.replace(observe(refused.status), refused=(1, "AttemptRefused", answer)))
    assert again.status == {**refused.status, "conditions": again.status["conditions"]} and not again.events
    # A refusal of another attempt (an older one) says nothing about this one.
    older = dataclasses.replace(observe(first.status), refused=(0, "AttemptRefused", answer))
    assert plan(job(), older).status["reason"] != "AttemptRefused"
    # Allowed now: its Job exists, and the status reads from the Job again at once (not at the next look).
    created = plan(job(), observe(refused.status, [workload(1)]))
    assert created.status["reason"] == "Pending" and created.create_attempt is None


def test_a_name_taken_by_an_object_not_ours_is_a_waiting_reason_said_once():
    from finetune_operator.controller.kube import NameConflict

    why = str(NameConflict(["ConfigMap web-config exists and is not this job's (not owned by any object, written by "
                            "kubectl-create)"]))
    first = plan(job(), observe())
    clash = plan(job(), dataclasses.replace(observe(first.status), refused=(1, "NameConflict", why)))
    assert clash.create_attempt == 1  # looked at again (the owner may rename or delete it)
    assert (clash.status["phase"], clash.status["reason"]) == ("Pending", "NameConflict")
    assert clash.status["message"].startswith("attempt 1 was not created: ConfigMap web-config exists")
    assert why in clash.status["message"] and "never adopts or changes an object it did not create" in \
        clash.status["message"] and "rename or delete that object" in clash.status["message"]
    assert conditions(clash)["Waiting"] == "True"
    # Nothing was created: the Created condition says so (issue 41: it read "attempt 1 created"), and the only Event
    # is the Warning (the first pass's Normal "Created" waited for a creation that never happened).
    created = next(cd for cd in clash.status["conditions"] if cd["type"] == "Created")
    assert (created["status"], created["reason"]) == ("False", "NameConflict")
    assert created["message"] == clash.status["message"] and "attempt 1 created" not in str(clash.status)
    assert [(e.type, e.reason) for e in clash.events] == [("Warning", "NameConflict")] and not clash.create_events
    again = plan(job(), dataclasses.replace(observe(clash.status), refused=(1, "NameConflict", why)))
    assert not again.events  # one Event, not one per look
    created = plan(job(), observe(clash.status, [workload(1)]))
    assert created.status["reason"] == "Pending"


def test_a_queued_attempt_follows_the_queue_label_of_its_finetunejob_and_a_running_one_keeps_its_queue():
    fixed = {c.LABEL_KUEUE_QUEUE: "gpu-queue"}
    queued = workload(1, suspend=True, suspended_by="kueue", labels={c.LABEL_KUEUE_QUEUE: "gpu-queu"})
    p = plan(job(), observe({"phase": "Queued", "attempt": 1, "restarts": 0}, [queued], [], fixed))
    assert p.status["phase"] == "Queued"
    assert p.kueue_labels == ("test-job-a1", {c.LABEL_KUEUE_QUEUE: "gpu-queue"}, {c.LABEL_KUEUE_QUEUE: "gpu-queu"})
    bumped = plan(job(), observe({"phase": "Queued", "attempt": 1, "restarts": 0}, [queued], [],
                                 {**fixed, "kueue.x-k8s.io/priority-class": "high", "team": "nlp"}))
    assert bumped.kueue_labels[1] == {c.LABEL_KUEUE_QUEUE: "gpu-queue", "kueue.x-k8s.io/priority-class": "high"}
    same = workload(1, suspend=True, suspended_by="kueue", labels=fixed)
    waiting = {"phase": "Queued", "attempt": 1, "restarts": 0}
    assert plan(job(), observe(waiting, [same], [], fixed)).kueue_labels is None
    admitted = workload(1, labels={c.LABEL_KUEUE_QUEUE: "gpu-queu"})  # running: Kueue keeps a running Job's queue
    assert plan(job(), observe(running_status(), [admitted], [pod(0), pod(1)], fixed)).kueue_labels is None
    # A label removed is not followed: Kueue still holds the suspended Job.
    assert plan(job(), observe({"phase": "Queued", "attempt": 1, "restarts": 0}, [queued], [], {})).kueue_labels is None


def test_an_edited_spec_is_announced_while_the_attempt_runs_and_a_resume_applies_it_in_a_new_attempt():
    from finetune_operator.render.workload import attempt_spec_hash

    before, after = job(), job(**{"spec.training.learningRate": 5e-5})

    def rendered_from(spec_job, w):
        w["metadata"]["annotations"] = {**w["metadata"].get("annotations", {}),
                                        c.ANNOTATION_ATTEMPT_SPEC_HASH: attempt_spec_hash(spec_job.spec)}
        return w

    checkpoint = {"path": "/output/checkpoint-40", "step": 40}
    running = rendered_from(before, workload(1))
    edited = dataclasses.replace(observe(running_status(checkpoint=checkpoint, observedGeneration=2), [running],
                                         [pod(0), pod(1)]), generation=3)
    p = plan(after, edited)
    assert p.status["phase"] == "Running" and p.create_attempt is None and not p.delete_workloads
    assert [e.reason for e in p.events] == ["SpecEdited"] and "suspend and resume" in p.events[0].message
    assert not plan(after, dataclasses.replace(edited, status={**edited.status, "observedGeneration": 3})).events
    assert not plan(before, edited).events  # nothing edited
    assert not plan(job(**{"spec.runPolicy.backoffLimit": 7}), edited).events  # applies at once
    # Suspended by the operator, then resumed with the edit: the next attempt takes it, from the checkpoint.
    suspended = rendered_from(before, workload(1, suspend=True))
    status = {**running_status(checkpoint=checkpoint), "phase": "Suspended", "reason": "Suspended"}
    resumed = plan(after, observe(status, [suspended]))
    assert resumed.status["attempt"] == 2 and resumed.status["reason"] == "SpecChanged"
    assert resumed.delete_workloads == ["test-job-a1"] and resumed.suspend_workload is None
    assert resumed.status["restarts"] == 0  # nothing failed
    started = plan(after, observe({**resumed.status, "checkpoint": checkpoint}))  # the trainer's field stays
    assert started.create_attempt == 2 and started.resume_from == "/output/checkpoint-40"
    # Resumed without an edit: the same attempt goes on.
    same = plan(before, observe(status, [suspended]))
    assert same.suspend_workload == ("test-job-a1", False) and same.status["attempt"] == 1


def test_active_deadline_fails_and_frees_the_gpus():
    status = running_status(since=T0 - timedelta(hours=2))
    p = plan(job(**{"spec.runPolicy.activeDeadlineSeconds": 3600}), observe(status, [workload(1)], [pod(0), pod(1)]))
    assert p.status["phase"] == "Failed" and p.status["reason"] == "DeadlineExceeded"
    assert p.delete_workloads == ["test-job-a1"]


def test_stalled_heartbeat_restarts_the_attempt():
    status = running_status(since=T0 - timedelta(hours=1),
                            progress={"step": 10, "updatedAt": ts(T0 - timedelta(minutes=40))})
    p = plan(job(**{"spec.runPolicy.stallTimeoutSeconds": 1800}), observe(status, [workload(1)], [pod(0), pod(1)]))
    assert p.status["phase"] == "Restarting" and p.status["reason"] == "Stalled"
    assert conditions(p)["Stalled"] == "True" and p.delete_workloads == ["test-job-a1"]
    assert p.status["restarts"] == 1


def test_fresh_heartbeat_schedules_the_next_look():
    status = running_status(since=T0 - timedelta(hours=1), progress={"updatedAt": ts(T0 - timedelta(minutes=5))})
    p = plan(job(**{"spec.runPolicy.stallTimeoutSeconds": 1800}), observe(status, [workload(1)], [pod(0), pod(1)]))
    assert p.status["phase"] == "Running" and 1500 <= p.requeue_after <= 1501


def test_invalid_spec_fails_permanently_and_stops_running_work():
    errors = InvalidSpec([FieldError("spec.distributed.numNodes", 0, "too small", "use >= 1")])
    p = plan(errors, observe(running_status(), [workload(1)], [pod(0)]))
    assert p.status["phase"] == "Failed" and p.status["reason"] == "InvalidSpec"
    assert "spec.distributed.numNodes" in p.status["message"]
    assert p.delete_workloads == ["test-job-a1"] and p.create_attempt is None


@pytest.mark.parametrize(("age", "deleted"), [(100, False), (3600, True)], ids=["before-ttl", "after-ttl"])
def test_ttl_after_finished(age, deleted):
    status = {"phase": "Succeeded", "attempt": 1, "completionTime": ts(T0 - timedelta(seconds=age))}
    p = plan(job(**{"spec.runPolicy.ttlSecondsAfterFinished": 600}), observe(status, [workload(1, complete=True)]))
    assert p.delete_job is deleted
    if not deleted:
        assert p.requeue_after == 500


def test_old_attempts_are_torn_down():
    p = plan(job(), observe({"phase": "Restarting", "attempt": 2, "restarts": 1}, [workload(1), workload(2)], []))
    assert p.delete_workloads == ["test-job-a1"]


def test_only_the_last_failed_attempt_is_kept_for_diagnosis():
    status = {"phase": "Restarting", "attempt": 3, "restarts": 2}
    failed = [workload(1, failed=True), workload(2, failed=True)]
    p = plan(job(), observe(status, failed, [], old_pods=0))
    assert p.delete_workloads == ["test-job-a1"] and p.status["restarts"] == 2
    attempts = [workload(1, failed=True), workload(2, failed=True), workload(3)]
    running = plan(job(), observe({**running_status(), "attempt": 3}, attempts, [pod(0), pod(1)]))
    assert running.delete_workloads == ["test-job-a1"]  # attempt 2 stays while attempt 3 runs


def test_operator_never_writes_trainer_fields():
    status = running_status(progress={"step": 5}, checkpoint={"step": 5, "path": "/o/c"})
    p = plan(job(), observe(status, [workload(1)], [pod(0), pod(1)]))
    assert "progress" not in p.status and "checkpoint" not in p.status


def test_a_stopped_attempts_progress_loses_its_eta_once():
    """Suspended, queued, restarting or failed: the ETA of the last attempt would read as current."""
    progress = {"phase": "Training", "step": 830, "maxSteps": 1000, "percent": 83, "eta": "0m04s"}
    status = running_status(progress=progress)
    p = plan(job(**{"spec.suspend": True}), observe(status, [workload(1)], [pod(0), pod(1)]))
    assert p.status["phase"] == "Suspended"
    assert p.status["progress"] == {"phase": "Stopped", "eta": None,
                                    "message": "the last report of attempt 1, which is not running"}
    stopped = {**status, **p.status, "progress": {**progress, "phase": "Stopped", "eta": None}}
    again = plan(job(**{"spec.suspend": True}), observe(stopped, [workload(1, suspend=True)], []))
    assert "progress" not in again.status  # said once
    running = plan(job(), observe(status, [workload(1)], [pod(0), pod(1)]))
    assert "progress" not in running.status


def test_a_succeeded_jobs_progress_loses_its_eta_in_the_write_that_says_succeeded():
    """The trainer reports at most every 10 s: its last report may be steps before the end, with time left."""
    progress = {"phase": "Training", "step": 25, "maxSteps": 30, "percent": 83, "eta": "0m03s"}
    status = running_status(progress=progress)
    done = [pod(0, "Succeeded", 0, "Completed"), pod(1, "Succeeded", 0, "Completed")]
    p = plan(job(), observe(status, [workload(1, complete=True)], done))
    assert p.status["phase"] == "Succeeded" and p.status["progress"] == {"eta": None}
    after = {**status, **p.status, "progress": {**progress, "eta": None}}
    again = plan(job(), observe(after, [workload(1, complete=True)], done))
    assert "progress" not in again.status  # said once


def test_steady_state_is_a_fixed_point():
    """A second pass over the same observation yields the same status: no write, no event."""
    first = plan(job(), observe({"phase": "Pending", "attempt": 1, "startTime": ts(T0)}, [workload(1)],
                                [pod(0), pod(1)]))
    second = plan(job(), observe(first.status, [workload(1)], [pod(0), pod(1)], now=T0 + timedelta(seconds=30)))
    assert second.status == first.status and second.events == []


def test_first_look_at_a_new_attempt_writes_nothing_more():
    """The status written when the attempt is created is what the pass that sees its Job computes: one write."""
    created = plan(job(), observe(now=T0))
    seen = plan(job(), observe(status=created.status, workloads=[workload(1)], pods=[pod(0, "Pending")],
                               now=T0 + timedelta(seconds=1)))
    assert seen.status == created.status and not seen.events and seen.create_attempt is None


def test_node_count_changes_alone_are_cosmetic_phase_changes_are_not():
    created = plan(job(), observe(now=T0)).status
    one_up = plan(job(), observe(status=created, workloads=[workload(1)], pods=[pod(0), pod(1, "Pending")])).status
    assert one_up["nodes"] == "1/2" and only_cosmetic(created, one_up)
    running = plan(job(), observe(status=one_up, workloads=[workload(1)], pods=[pod(0), pod(1)])).status
    assert running["phase"] == "Running" and not only_cosmetic(one_up, running)


def test_readiness_comes_from_the_job_status_without_reading_pods():
    created = plan(job(), observe(now=T0)).status
    ready = {**workload(1), "status": {"conditions": [], "ready": 2}}
    p = plan(job(), Observed(name="test-job", namespace="ns", generation=3, labels={}, status=created,
                             workloads=[ready], pods=[], now=T0))
    assert (p.status["phase"], p.status["nodes"]) == ("Running", "2/2")


def test_goodput_accounts_gpu_hours_restart_downtime_and_redone_steps():
    """2 nodes x 8 GPUs: runs 1 h, fails at step 500 (checkpoint 400), back after 10 min, fails again before its
    first progress report, back after 5 min, runs 30 min more and succeeds."""
    def at(minutes):
        return T0 + timedelta(minutes=minutes)

    def step(status, minutes, workloads=(), pods=(), **extra):
        p = plan(job(), observe({**status, **extra}, list(workloads), list(pods), now=at(minutes)), SETTINGS)
        return p.status

    st = step({"phase": "Pending", "attempt": 1, "startTime": ts(T0)}, 0, [workload(1)], [pod(0), pod(1)])
    assert st["goodput"] == {"gpuHours": 0.0, "restartDowntimeSeconds": 0, "stepsRedone": 0,
                             "runningSince": ts(at(0))}
    assert step(st, 30, [workload(1)], [pod(0), pod(1)]) == {**st, "observedGeneration": 3}  # no change while it runs

    report = {"progress": {"step": 500, "updatedAt": ts(at(59))}, "checkpoint": {"step": 400, "path": "/o/c-400"}}
    st = step(st, 60, [workload(1, failed=True)], [pod(0, "Failed", 137, "OOMKilled"), pod(1)], **report)
    assert st["phase"] == "Restarting"
    assert st["goodput"] == {"gpuHours": 16.0, "restartDowntimeSeconds": 0, "stepsRedone": 100,
                             "failedAt": ts(at(60)), "attemptSince": ts(at(60))}

    st = step(st, 70, [workload(2)], [pod(0), pod(1)], **report)
    assert st["phase"] == "Running" and st["goodput"]["restartDowntimeSeconds"] == 600
    assert "failedAt" not in st["goodput"] and st["goodput"]["runningSince"] == ts(at(70))

    # Attempt 2 dies 2 min in, before reporting: the stale step-500 report must not count 100 steps again.
    st = step(st, 72, [workload(2, failed=True)], [pod(0, "Failed", 1), pod(1)], **report)
    assert st["goodput"]["stepsRedone"] == 100
    assert st["goodput"]["gpuHours"] == pytest.approx(16 + 16 * 2 / 60, abs=1e-3)

    st = step(st, 77, [workload(3)], [pod(0), pod(1)], **report)
    assert st["goodput"]["restartDowntimeSeconds"] == 600 + 300
    st = step(st, 107, [workload(3, complete=True)], [pod(0, "Succeeded", 0), pod(1, "Succeeded", 0)], **report)
    assert st["phase"] == "Succeeded" and "runningSince" not in st["goodput"]
    assert st["goodput"]["gpuHours"] == pytest.approx(16 + 16 * 2 / 60 + 16 * 30 / 60, abs=1e-3)


def test_a_job_that_never_ran_has_no_goodput_to_write():
    p = plan(job(), observe())
    assert "goodput" not in p.status  # the creation write stays as small as before


def preflight_workload(**kw):
    w = workload(0, **kw)
    w["metadata"]["name"] = "test-job-a0"
    return w


def test_preflight_runs_before_any_gpu_is_requested_then_attempt_one_starts():
    spec = job(**{"spec.runPolicy.preflight": True})
    first = plan(spec, observe())
    assert first.create_preflight and first.create_attempt is None
    assert (first.status["phase"], first.status["reason"], first.status["preflight"]) == ("Pending", "Preflight",
                                                                                         "Running")
    checking = plan(spec, observe(first.status, [preflight_workload()], [pod(0)]))
    assert not checking.create_preflight and checking.create_attempt is None and not checking.delete_workloads
    passed = plan(spec, observe(checking.status, [preflight_workload(complete=True)]))
    assert passed.status["preflight"] == "Passed" and passed.create_attempt == 1
    assert passed.delete_workloads == ["test-job-a0"]
    # Later passes never look at the preflight again, even if its Job is still being deleted.
    running = plan(spec, observe(passed.status, [workload(1), preflight_workload(complete=True)], [pod(0), pod(1)]))
    assert running.status["phase"] == "Running" and running.delete_workloads == ["test-job-a0"]


def test_the_preflights_memory_estimate_reaches_the_status():
    spec = job(**{"spec.runPolicy.preflight": True})
    status = plan(spec, observe()).status
    estimate = {"peakGiB": 31.1, "neededGiB": 33.4, "largestTerm": "activations", "terms": {"activations": 12.0},
                "capacityGiB": 79.6, "fits": True}
    done = pod(0, "Succeeded", 0, message=json.dumps({"exitCode": 0, "reason": "Succeeded",
                                                      "memoryEstimate": estimate}))
    done["metadata"]["labels"] = {c.LABEL_ATTEMPT: "0"}
    passed = plan(spec, observe(status, [preflight_workload(complete=True)], [done]))
    assert passed.status["preflight"] == "Passed" and passed.status["memoryEstimate"] == estimate
    assert not [e for e in passed.events if e.reason == "MemoryTight"]  # 42% of the GPU
    tight = {**estimate, "neededGiB": 75.2}
    done["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = json.dumps({"memoryEstimate": tight})
    warned = plan(spec, observe(status, [preflight_workload(complete=True)], [done]))
    [event] = [e for e in warned.events if e.reason == "MemoryTight"]
    assert event.type == "Warning" and "75.2 GiB per GPU of 79.6 GiB (94%" in event.message
    # An older trainer image's preflight says nothing of memory: nothing is written.
    done["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = '{"exitCode": 0}'
    assert "memoryEstimate" not in plan(spec, observe(status, [preflight_workload(complete=True)], [done])).status


def test_a_failed_preflight_fails_the_job_with_the_trainers_reason_and_no_attempt():
    spec = job(**{"spec.runPolicy.preflight": True})
    status = plan(spec, observe()).status
    message = json.dumps({"reason": "DataError", "message": "preflight: no data file at /data/x.jsonl"})
    failed_pod = pod(0, "Failed", 65, message=message)
    p = plan(spec, observe(status, [preflight_workload(failed=True)], [failed_pod]))
    assert (p.status["phase"], p.status["reason"], p.status["preflight"]) == ("Failed", "DataError", "Failed")
    assert "no GPU was requested" in p.status["message"] and "/data/x.jsonl" in p.status["message"]
    # The preflight's Job and pod stay for `kubectl logs` (a pod that ended holds nothing).
    assert p.create_attempt is None and p.delete_workloads == [] and p.status["restarts"] == 0


def test_without_preflight_nothing_changes():
    p = plan(job(), observe())
    assert p.create_attempt == 1 and not p.create_preflight and "preflight" not in p.status


# --- the phase keeps its word ----------------------------------------------------------------------------------
def test_a_gang_finishing_node_by_node_stays_running():
    finishing = {**workload(1), "status": {"conditions": [], "ready": 1, "succeeded": 1}}
    p = plan(job(), Observed(name="test-job", namespace="ns", generation=3, labels={}, status=running_status(),
                             workloads=[finishing], pods=[], now=T0))
    assert (p.status["phase"], p.status["nodes"]) == ("Running", "2/2") and p.events == []


def test_resuming_without_kueue_reads_resuming_not_queued():
    suspended = {**running_status(), "phase": "Suspended", "reason": "Suspended"}
    p = plan(job(), observe(suspended, [workload(1, suspend=True)], []))
    assert p.suspend_workload == ("test-job-a1", False)
    assert (p.status["phase"], p.status["reason"]) == ("Pending", "Resuming")


def test_gpus_and_global_batch_are_the_running_attempts_until_the_next_one():
    st = running_status(gpus=16, globalBatchSize=16)
    edited = job(**{"spec.distributed.numNodes": 4})  # 32 GPUs and twice the global batch, from the next attempt
    p = plan(edited, observe(st, [workload(1)], [pod(0), pod(1)]))
    assert (p.status["gpus"], p.status["globalBatchSize"]) == (16, 16)
    failed = [pod(0, "Failed", 1), pod(1)]
    restart = plan(edited, observe(p.status, [workload(1, failed=True)], failed), SETTINGS)
    later = plan(edited, observe(restart.status, [], [], now=T0 + timedelta(seconds=30)), SETTINGS)
    assert later.create_attempt == 2 and (later.status["gpus"], later.status["globalBatchSize"]) == (
        32, edited.spec.global_batch_size) and edited.spec.global_batch_size == 32


def test_nodes_come_from_the_running_attempt_not_from_an_edited_spec():
    two_node_attempt = {**workload(1), "spec": {"suspend": False, "parallelism": 2}}
    p = plan(job(**{"spec.distributed.numNodes": 3}), observe(running_status(), [two_node_attempt], [pod(0), pod(1)]))
    assert (p.status["phase"], p.status["nodes"]) == ("Running", "2/2")
    # ... and a condition of its own says the edit waits for the next attempt, without touching the phase.
    pending = next(cd for cd in p.status["conditions"] if cd["type"] == "TopologyChangePending")
    assert pending["status"] == "True" and "numNodes is 3, attempt 1 runs on 2 node(s)" in pending["message"]
    again = plan(job(), observe(p.status, [two_node_attempt], [pod(0), pod(1)]))  # the edit is undone
    cleared = next(cd for cd in again.status["conditions"] if cd["type"] == "TopologyChangePending")
    # A False condition says why (the job's reason) and what the job does now, not its own type and ''.
    assert (cleared["status"], cleared["reason"]) == ("False", "Running")
    assert cleared["message"].startswith("TopologyChangePending no longer holds: the job is Running")
    untouched = plan(job(), observe(running_status(), [two_node_attempt], [pod(0), pod(1)]))
    assert all(cd["type"] != "TopologyChangePending" for cd in untouched.status["conditions"])


def test_conditions_keep_their_own_reason():
    failed = [pod(0, "Failed", 137, "OOMKilled"), pod(1)]
    p = plan(job(), observe(running_status(), [workload(1, failed=True)], failed), SETTINGS)
    by_type = {cd["type"]: cd for cd in p.status["conditions"]}
    assert by_type["Created"]["reason"] == "Created" and "attempt 2 created" in by_type["Created"]["message"]
    assert by_type["Restarting"]["reason"] == "OOMKilled"


@pytest.mark.parametrize(("kubelet_reason", "expected"), [("OOMKilled", "OOMKilled"), ("Error", "Killed")],
                         ids=["kubelet-oom", "sigkill"])
def test_exit_137_is_oomkilled_only_when_the_kubelet_says_so(kubelet_reason, expected):
    failed = [pod(0, "Failed", 137, kubelet_reason), pod(1)]
    p = plan(job(), observe(running_status(), [workload(1, failed=True)], failed), SETTINGS)
    assert p.status["reason"] == expected


def test_a_long_trainer_message_reaches_the_status_readable():
    from finetune_trainer.launch import termination_message

    summary = {"exitCode": 1, "reason": "Error", "message": "RuntimeError: " + "the gradients exploded " * 400,
               "data": {"train": {"rows": 1}}, "steps": 3}
    text = termination_message(summary)
    assert len(text) <= 4000 and json.loads(text)["message"].endswith("…")
    failed = [pod(0, "Failed", 1, "Error", message=text), pod(1)]
    p = plan(job(), observe(running_status(), [workload(1, failed=True)], failed), SETTINGS)
    assert "RuntimeError: the gradients exploded" in p.status["message"] and "\\" not in p.status["message"]
    assert len(p.status["message"]) < MESSAGE_LIMIT + 200  # whole up to the trainer's own cut, never a blob


def test_a_trainers_remedy_reaches_the_status_whole():
    """The resume refusal's remedy comes last in a message of ~450 characters: status and describe show it."""
    message = ("the checkpoint /output/checkpoint-2140 was produced by another model or method (model: checkpoint "
               '"meta-llama/Llama-3.1-8B", this job "Qwen/Qwen2.5-7B"); it is not resumed. Delete the output '
               "directory's checkpoints, set checkpoints.resume: never, or give the job another name or "
               "output.subPath")
    text = json.dumps({"exitCode": 78, "reason": "InvalidConfig", "message": message})
    failed = [pod(0, "Failed", 78, "Error", message=text), pod(1)]
    p = plan(job(), observe(running_status(), [workload(1, failed=True)], failed), SETTINGS)
    assert p.status["message"].endswith("or give the job another name or output.subPath (exit 78: not retried)")


def test_a_crash_without_a_result_is_explained_by_the_workers_last_error_line():
    from finetune_trainer.launch import aggregate

    tail = ["Traceback (most recent call last):\n", '  File "x.py", line 3, in <module>\n',
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n", "\n",
            "[rank0]: some torchrun epilogue\n"]
    code, summary = aggregate([], 1, tail)
    assert code == 1 and summary["message"] == ("torchrun exited with 1: torch.OutOfMemoryError: CUDA out of memory. "
                                                "Tried to allocate 2.00 GiB")


# --- a cluster that says why ------------------------------------------------------------------------------------
def unschedulable(i, message="0/500 nodes are available: 500 Insufficient nvidia.com/gpu."):
    return {"metadata": {"name": f"test-job-a1-{i}-x"}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}}


def image_pull_failing(i):
    return {"metadata": {"name": f"test-job-a1-{i}-x"}, "status": {"phase": "Pending", "containerStatuses": [
        {"name": "trainer", "image": "registry.invalid/trainer:1", "state": {"waiting": {
            "reason": "ImagePullBackOff", "message": "Back-off pulling image \"registry.invalid/trainer:1\""}}}]}}


QUOTA_EVENT = {"reason": "FailedCreate", "type": "Warning", "lastTimestamp": "2026-01-01T11:59:55Z",
               "message": "Error creating: pods \"test-job-a1-0-abc\" is forbidden: exceeded quota: gpu-quota, "
                          "requested: requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=0, limited: "
                          "requests.nvidia.com/gpu=4"}


def waiting_look(pods, events=(), age=20, status=None, spec=None, **kw):
    created = {**workload(1), "metadata": {**workload(1)["metadata"], "creationTimestamp": ts(T0 - timedelta(
        seconds=age))}, "spec": {"suspend": False, "parallelism": 2}}
    ready = sum(1 for p in pods if p["status"]["phase"] == "Running")
    created["status"] = {"conditions": [], "ready": ready}
    status = status or {"phase": "Pending", "reason": "Created", "attempt": 1, "restarts": 0, "startTime": ts(T0)}
    obs = Observed(name="test-job", namespace="ns", generation=3, labels={}, status=status, workloads=[created],
                   pods=list(pods), now=T0, events=list(events), looked=True)
    return plan(spec or job(), obs, SETTINGS)


@pytest.mark.parametrize(("pods", "events", "reason", "says"), [
    ([unschedulable(0), unschedulable(1)], [], "Unschedulable", "500 Insufficient nvidia.com/gpu"),
    ([], [QUOTA_EVENT], "QuotaExceeded", "exceeded quota: gpu-quota"),
    ([image_pull_failing(0), pod(1)], [], "ImagePullFailed", "registry.invalid/trainer:1"),
    ([], [{**QUOTA_EVENT, "message": "Error creating: admission webhook denied the request"}], "PodFailedToStart",
     "admission webhook denied"),
], ids=["unschedulable", "quota", "image-pull", "failed-create"])
def test_a_waiting_gang_says_why_with_one_event(pods, events, reason, says):
    p = waiting_look(pods, events)
    assert (p.status["phase"], p.status["reason"]) == ("Pending", reason) and says in p.status["message"]
    waiting = next(cd for cd in p.status["conditions"] if cd["type"] == "Waiting")
    assert waiting["status"] == "True" and waiting["reason"] == reason and says in waiting["message"]
    assert [(e.type, e.reason) for e in p.events] == [("Warning", reason)]
    assert p.requeue_after == 15.0  # no pod watch: look again soon
    again = waiting_look(pods, events, status=p.status)
    assert again.events == [] and again.status == p.status  # one Event per change, not per look


def test_the_reason_clears_when_the_gang_runs():
    p = waiting_look([unschedulable(0), unschedulable(1)])
    running = plan(job(), observe(p.status, [workload(1)], [pod(0), pod(1)]))
    assert (running.status["phase"], running.status["reason"]) == ("Running", "Running")
    assert {cd["type"]: cd["status"] for cd in running.status["conditions"]}["Waiting"] == "False"


def test_within_the_grace_nothing_is_read_and_the_next_look_is_scheduled():
    p = waiting_look([], age=4)
    assert p.status["reason"] == "Created" and p.requeue_after == pytest.approx(6.0)


def test_a_partial_gang_is_torn_down_after_the_schedule_timeout_and_retried_apart_from_failures():
    spec = job(**{"spec.runPolicy.scheduleTimeoutSeconds": 60, "spec.runPolicy.backoffLimit": 0})
    p = waiting_look([pod(0), unschedulable(1)], age=61, spec=spec)
    assert p.delete_workloads == ["test-job-a1"]
    st = p.status
    assert (st["phase"], st["reason"], st["attempt"], st["restarts"], st["scheduleRetries"]) == (
        "Restarting", "ScheduleTimeout", 2, 0, 1)
    assert "1/2 node(s) ran within scheduleTimeoutSeconds=60" in st["message"] and "Insufficient" in st["message"]
    assert not p.restarted  # not a failure: backoffLimit 0 did not fail the job
    later = plan(spec, observe(st, [], [], now=T0 + timedelta(seconds=11)), SETTINGS)
    assert later.create_attempt == 2


def test_kueue_jobs_are_never_torn_down_for_scheduling():
    spec = job(**{"spec.runPolicy.scheduleTimeoutSeconds": 60, "metadata.labels": {c.LABEL_KUEUE_QUEUE: "q"}})
    labelled = workload(1, labels={c.LABEL_KUEUE_QUEUE: "q"})
    created = {**labelled, "metadata": {**labelled["metadata"], "creationTimestamp": ts(T0 - timedelta(
        seconds=600))}, "spec": {"suspend": False, "parallelism": 2}, "status": {"conditions": [], "ready": 1}}
    obs = Observed(name="test-job", namespace="ns", generation=3, labels={c.LABEL_KUEUE_QUEUE: "q"},
                   status={"phase": "Pending", "attempt": 1, "restarts": 0}, workloads=[created], pods=[], now=T0,
                   looked=True)
    assert plan(spec, obs, SETTINGS).delete_workloads == []


def gpu_node(name, gpus=8, **extra):
    return {"name": name, "labels": {}, "taints": [], "unschedulable": False,
            "allocatable": {"nvidia.com/gpu": str(gpus)}, **extra}


def test_more_gpus_per_node_than_the_largest_node_has_is_a_warning_at_once():
    sixteen = job(**{"spec.distributed.gpusPerNode": 16})
    obs = Observed(name="test-job", namespace="ns", generation=1, labels={}, status={}, workloads=[], pods=[], now=T0,
                   nodes=[gpu_node(f"gpu-node-{i}") for i in range(4)])
    p = plan(sixteen, obs, SETTINGS)
    assert p.create_attempt is None and "attempt" not in p.status  # nothing held until a node can take a pod
    assert p.requeue_after == 30.0
    assert (p.status["phase"], p.status["reason"]) == ("Pending", "Unschedulable")
    assert "gpusPerNode is 16, but the largest of the cluster's nodes (gpu-node-0) has 8 nvidia.com/gpu" in \
        p.status["message"]
    assert "numNodes 4 x gpusPerNode 8" in p.status["message"]
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "Unschedulable")]
    assert {cd["type"]: cd["status"] for cd in p.status["conditions"]}["Waiting"] == "True"
    for_autoscaler = job(**{"spec.distributed.gpusPerNode": 16, "spec.runPolicy.capacityShortage": "create"})
    created = plan(for_autoscaler, obs, SETTINGS)
    assert created.create_attempt == 1 and created.status["reason"] == "Unschedulable"  # an autoscaler sees it
    assert "created for a cluster autoscaler to see" in created.status["message"]
    fits = plan(job(), obs, SETTINGS)
    assert fits.status["reason"] == "Created" and fits.create_events[0].type == "Normal"
    unknown = plan(sixteen, Observed(**{**obs.__dict__, "nodes": None}), SETTINGS)
    assert unknown.status["reason"] == "Created"  # nodes not readable: the scheduler will say it


def test_a_gang_larger_than_the_nodes_it_may_use_says_so_at_once():
    """4 x 8 GPUs on 3 nodes of 8 (and a fourth node it may not use: tainted, not tolerated)."""
    big = job(**{"spec.distributed.numNodes": 4, "spec.distributed.gpusPerNode": 8})
    nodes = [gpu_node(f"gpu-node-{i}") for i in range(3)] + [
        gpu_node("tainted", taints=[{"key": "team", "value": "b", "effect": "NoSchedule"}])]
    obs = Observed(name="test-job", namespace="ns", generation=1, labels={}, status={}, workloads=[], pods=[], now=T0,
                   nodes=nodes)
    p = plan(big, obs, SETTINGS)
    assert p.create_attempt is None and (p.status["phase"], p.status["reason"]) == ("Pending", "InsufficientCapacity")
    assert "the gang needs 4 pod(s) of 8 nvidia.com/gpu (32 in all), but the cluster's nodes hold 3 such pod(s) " \
        "(24 nvidia.com/gpu on 3 node(s))" in p.status["message"]
    assert "nothing is created and no GPU held until they can" in p.status["message"]
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "InsufficientCapacity")]
    # Looked at again: still short, the same reason and no second Event; a fourth usable node, and it starts.
    again = plan(big, Observed(**{**obs.__dict__, "status": p.status}), SETTINGS)
    assert again.create_attempt is None and again.status["reason"] == "InsufficientCapacity" and not again.events
    grown = Observed(**{**obs.__dict__, "status": p.status, "nodes": [*nodes, gpu_node("new")]})
    started = plan(big, grown, SETTINGS)
    assert started.create_attempt == 1 and started.status["attempt"] == 1 and started.status["reason"] == "Created"
    retried = job(**{"spec.distributed.numNodes": 4, "spec.distributed.gpusPerNode": 8,
                     "spec.runPolicy.capacityShortage": "create"})
    assert plan(retried, obs, SETTINGS).create_attempt == 1
    assert "scheduleRetryLimit=5" in plan(retried, obs, SETTINGS).status["message"]
    tolerant = job(**{"spec.distributed.numNodes": 4, "spec.distributed.gpusPerNode": 8,
                      "spec.pod.tolerations": [{"key": "team", "operator": "Exists"}]})
    assert plan(tolerant, obs, SETTINGS).status["reason"] == "Created"


def test_a_gang_above_its_namespaces_quota_fails_at_once():
    quota = {"metadata": {"name": "team-gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "12"}}}
    obs = Observed(name="test-job", namespace="ns", generation=1, labels={}, status={}, workloads=[], pods=[], now=T0,
                   nodes=[gpu_node("a"), gpu_node("b")], quotas=[quota])
    p = plan(job(), obs, SETTINGS)  # 2 x 8 = 16 GPUs
    assert p.create_attempt is None and (p.status["phase"], p.status["reason"]) == ("Failed", "QuotaTooSmall")
    assert "the gang needs 16 nvidia.com/gpu (2 node(s) x 8), but ResourceQuota team-gpus of this namespace " \
        "allows 12" in p.status["message"]
    assert plan(job(**{"spec.distributed.gpusPerNode": 4}), obs, SETTINGS).create_attempt == 1


def test_schedule_retries_are_bounded():
    spec = job(**{"spec.runPolicy.scheduleTimeoutSeconds": 60, "spec.runPolicy.scheduleRetryLimit": 2})
    created = {**workload(1), "metadata": {**workload(1)["metadata"], "creationTimestamp": ts(T0 - timedelta(
        seconds=600))}, "spec": {"suspend": False, "parallelism": 2}, "status": {"conditions": [], "ready": 1}}
    status = {"phase": "Pending", "attempt": 1, "restarts": 0, "scheduleRetries": 2}
    obs = Observed(name="test-job", namespace="ns", generation=3, labels={}, status=status, workloads=[created],
                   pods=[], now=T0, looked=True)
    p = plan(spec, obs, SETTINGS)
    assert (p.status["phase"], p.status["reason"]) == ("Failed", "ScheduleRetriesExhausted")
    assert p.delete_workloads == ["test-job-a1"] and "after 2 retries" in p.status["message"]


# The kubelet's three evictions for a pod's own local disk (pkg/kubelet/eviction/helpers.go), with no
# DisruptionTarget condition; the trainer exits 143 in the second it is given, or is killed.
STORAGE_EVICTIONS = [
    'Container trainer exceeded its local ephemeral storage limit "200Gi". ',
    "Pod ephemeral local storage usage exceeds the total limit of containers 200Gi. ",
    'Usage of EmptyDir volume "cache" exceeds the limit "200Gi". ',
]


def storage_evicted(message, exit_code):
    evicted = pod(0, "Failed", exit_code)
    return {**evicted, "status": {**evicted["status"], "reason": "Evicted", "message": message}}


@pytest.mark.parametrize("exit_code", [143, 137])
@pytest.mark.parametrize("message", STORAGE_EVICTIONS, ids=["container", "pod", "emptydir"])
@pytest.mark.parametrize("restarts", [0, 3])
def test_a_pod_evicted_for_its_own_disk_use_is_a_counted_failure_that_says_how_to_fix_it(message, exit_code,
                                                                                         restarts):
    """Never a disruption (uncounted, so retried for ever, downloading the model again each time)."""
    st = running_status(attempt=restarts + 1, restarts=restarts)
    p = plan(job(**{"spec.runPolicy.backoffLimit": 3}),
             observe(st, [workload(restarts + 1, failed=True)], [storage_evicted(message, exit_code), pod(1)]),
             SETTINGS)
    if restarts == 3:
        assert (p.status["phase"], p.status["reason"]) == ("Failed", "BackoffLimitExceeded"), p.status
    else:
        assert (p.status["phase"], p.status["reason"]) == ("Restarting", "EphemeralStorageExceeded"), p.status
        assert p.status["restarts"] == 1 and not p.status.get("disruptions")
    fix = "sizeLimit in spec.pod.volumes" if "EmptyDir" in message else "spec.resources.ephemeralStorage"
    assert message.strip() in p.status["message"] and fix in p.status["message"]


@pytest.mark.parametrize("first", ["evicted", "peer"])
def test_the_disk_eviction_explains_the_attempt_whichever_pod_is_listed_first(first):
    """The Job controller stops the gang's other pods (143, a disruption by itself) once one is evicted."""
    evicted = storage_evicted(STORAGE_EVICTIONS[1], 137)
    peer = pod(1, "Failed", 143)
    pods = [evicted, peer] if first == "evicted" else [peer, evicted]
    p = plan(job(), observe(running_status(), [workload(1, failed=True)], pods), SETTINGS)
    assert (p.status["phase"], p.status["reason"]) == ("Restarting", "EphemeralStorageExceeded"), p.status


def test_a_node_short_of_disk_is_still_a_disruption():
    """Node pressure is the node's doing: the kubelet marks it with DisruptionTarget (TerminationByKubelet)."""
    evicted = storage_evicted("The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, "
                              "available: 9Gi. ", 143)
    evicted["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True",
                                        "reason": "TerminationByKubelet", "message": "The node was low on resource"}]
    p = plan(job(), observe(running_status(), [workload(1, failed=True)], [evicted, pod(1)]), SETTINGS)
    assert (p.status["phase"], p.status["reason"]) == ("Restarting", "Disrupted"), p.status


def test_a_trainer_notice_becomes_one_warning_event():
    notice = {"time": ts(T0), "reason": "LossSpike", "message": "the loss spiked to 40 at step 20"}
    status = running_status(notice=notice)
    first = plan(job(), observe(status, [workload(1)], [pod(0), pod(1)]), SETTINGS)
    assert [(e.type, e.reason, e.message) for e in first.events] == [
        ("Warning", "LossSpike", "the loss spiked to 40 at step 20")]
    assert first.status["noticePosted"] == ts(T0) and "notice" not in first.status  # the trainer's field
    again = plan(job(), observe({**status, **first.status}, [workload(1)], [pod(0), pod(1)]), SETTINGS)
    assert again.events == []
    newer = {**status, **first.status, "notice": {**notice, "time": ts(T0 + timedelta(seconds=5))}}
    assert len(plan(job(), observe(newer, [workload(1)], [pod(0), pod(1)]), SETTINGS).events) == 1


@pytest.mark.parametrize("pods", [
    [],  # kubectl delete pod: gone before the operator looked
    [pod(0, "Failed", 143), pod(1)],  # the trainer stopped on a SIGTERM nobody asked the job for
    [{**pod(0, "Failed", 137), "status": {**pod(0, "Failed", 137)["status"], "conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI", "message": "Eviction API: "
         "evicting"}]}}, pod(1)],
], ids=["deleted", "sigterm-from-outside", "evicted"])
def test_a_pod_stopped_from_outside_is_a_disruption_not_a_failure(pods):
    st = running_status(restarts=3)
    p = plan(job(**{"spec.runPolicy.backoffLimit": 3}), observe(st, [workload(1, failed=True)], pods), SETTINGS)
    assert (p.status["phase"], p.status["reason"]) == ("Restarting", "Disrupted"), p.status
    assert p.status["restarts"] == 3 and p.status["disruptions"] == 1  # backoffLimit 3 is not exceeded by it
    assert "not counted against backoffLimit" in p.status["message"]
