"""When a job really starts (the runtime it records then) and the deadline each attempt's Job carries of its own
(controller/lifecycle.py, controller/deadlines.py, render/workload.py)."""

import dataclasses
from datetime import timedelta

import pytest

from finetune_operator.api import constants as c
from finetune_operator.controller.deadlines import JOB_DEADLINE_GRACE_SECONDS
from finetune_operator.render import RenderContext
from finetune_operator.render.workload import render_workload
from tests.unit.test_lifecycle import T0, job, observe, plan, running_status, ts, workload

pytestmark = pytest.mark.unit
MINUTE = timedelta(seconds=60)
SECOND = timedelta(seconds=1)
SNAPSHOT = {"name": "gpu-small", "kind": "ClusterFineTuneRuntime", "generation": 1, "digest": "0" * 12,
            "layers": [{"kind": "ClusterFineTuneRuntime", "name": "gpu-small", "generation": 1,
                        "limits": {"maxGpusPerJob": 16}}], "template": {}}


def with_runtime(obs, snapshot=SNAPSHOT):
    return dataclasses.replace(obs, runtime=snapshot)


def test_a_job_created_suspended_records_no_start_and_no_runtime_until_it_is_resumed():
    """Its attempt 1 is created (suspended), but nothing of it runs: the runtimes are read as they are when it is
    resumed, and recorded then (the attack review: a default added meanwhile never bound it)."""
    first = plan(job(**{"spec.suspend": True}), with_runtime(observe()))
    assert first.create_attempt == 1 and "startTime" not in first.status and "runtime" not in first.status
    suspended = {k: v for k, v in first.status.items() if k != "conditions"}
    again = plan(job(**{"spec.suspend": True}), with_runtime(observe(suspended, [workload(1, suspend=True)])))
    assert again.status["phase"] == "Suspended" and "startTime" not in again.status and "runtime" not in again.status
    resumed = plan(job(), with_runtime(observe(again.status, [workload(1, suspend=True)])))
    assert resumed.suspend_workload == ("test-job-a1", False)
    assert resumed.status["startTime"] == ts(T0) and resumed.status["runtime"] == SNAPSHOT


def test_a_job_that_starts_at_once_records_its_runtime_with_its_first_status():
    p = plan(job(), with_runtime(observe()))
    assert p.status["startTime"] == ts(T0) and p.status["runtime"] == SNAPSHOT
    preflight = plan(job(**{"spec.suspend": True, "spec.runPolicy.preflight": True}), with_runtime(observe()))
    assert preflight.create_preflight and preflight.status["runtime"] == SNAPSHOT  # its pod runs: a start


def test_each_attempt_job_gets_what_is_left_of_the_deadline():
    first = plan(job(**{"spec.runPolicy.activeDeadlineSeconds": 600}), observe())
    assert first.attempt_deadline == 600 + JOB_DEADLINE_GRACE_SECONDS
    # Attempt 2, after 250 active seconds (the backoff counts too).
    status = {**running_status(attempt=2, restarts=1), "phase": "Restarting", "activeSeconds": 250,
              "conditions": [{"type": "Restarting", "status": "True", "lastTransitionTime": ts(T0 - MINUTE)}]}
    second = plan(job(**{"spec.runPolicy.activeDeadlineSeconds": 600}), observe(status, now=T0))
    assert second.create_attempt == 2 and second.attempt_deadline == 350 + JOB_DEADLINE_GRACE_SECONDS
    assert plan(job(), observe()).attempt_deadline is None  # no deadline, none of its own
    ctx = RenderContext(name="test-job", namespace="ns", deadline_seconds=355)
    assert render_workload(job().spec, ctx)["spec"]["activeDeadlineSeconds"] == 355
    assert "activeDeadlineSeconds" not in render_workload(job().spec, RenderContext(name="t", namespace="ns"))["spec"]


def _running_job(deadline_seconds, started=T0):
    w = workload(1)
    w["spec"]["activeDeadlineSeconds"] = deadline_seconds
    w["status"]["startTime"] = ts(started)
    return w


def _deadline_plan(deadline, attempt_job, seconds_on):
    """The pass `seconds_on` after T0 of a job running since T0 (deadline None: none set) with 2 pods running."""
    status = {**running_status(since=T0), "activeSince": ts(T0)}
    overrides = {"spec.runPolicy.activeDeadlineSeconds": deadline} if deadline else {}
    pods = [{"metadata": {"name": f"p{i}"}, "status": {"phase": "Running"}} for i in range(2)]
    return plan(job(**overrides), observe(status, [attempt_job], now=T0 + timedelta(seconds=seconds_on), pods=pods))


@pytest.mark.parametrize("deadline, patched", [(600, None), (300, 100 + 300 - 100 + JOB_DEADLINE_GRACE_SECONDS),
                                               (3600, 100 + 3600 - 100 + JOB_DEADLINE_GRACE_SECONDS),
                                               (None, "removed")])
def test_an_edit_of_the_deadline_reaches_the_running_attempts_job(deadline, patched):
    """The Job was created with 605 s (a 600 s deadline). 100 s later the job's deadline is edited: a higher one or
    none must not be cut short by the Job's own; a lower one reaches the Job too (the operator fails the job itself,
    and the Job still ends if the operator is down or the job gone)."""
    p = _deadline_plan(deadline, _running_job(605), 100)
    if patched is None:
        assert p.job_deadline is None
    elif patched == "removed":
        assert p.job_deadline == ("test-job-a1", None)
    else:
        assert p.job_deadline == ("test-job-a1", patched)


@pytest.mark.parametrize("seconds_on", [0.0, 0.3, 12.7, 99.99, 424.4, 3599.9])  # 424.4: 600.0000000000001 in floats
def test_a_job_and_its_attempt_started_together_keep_the_deadline_they_were_created_with(seconds_on):
    """The Job started as the job became active: what is left on its clock is the 600 s it was created with, at any
    moment (a warm run's attempt Job went from 25 s to 26 with no edit: 12.7 + 20 - 12.7 is 20.000000000000004 in
    floats, and its ceiling 21)."""
    assert _deadline_plan(600, _running_job(605), seconds_on).job_deadline is None


@pytest.mark.parametrize("started_after, patched", [(1, None), (5, None), (6, 600 - 6 + JOB_DEADLINE_GRACE_SECONDS),
                                                    (500, 100 + JOB_DEADLINE_GRACE_SECONDS)])
def test_a_jobs_clock_started_again_gets_what_is_left_not_its_whole_deadline(started_after, patched):
    """Kubernetes resets a resumed Job's startTime (a suspend, Kueue's preemption): with the 605 s it was created
    with, a Job resumed after 500 s of the job's 600 would run 500 s past it were its FineTuneJob gone or its
    operator down. Lowered to what is left, once it is more than a few seconds off (a Job that started a second
    after the job's active clock is no reason for a write)."""
    p = _deadline_plan(600, _running_job(605, started=T0 + timedelta(seconds=started_after)), started_after + 10.4)
    assert p.job_deadline == (None if patched is None else ("test-job-a1", patched))


@pytest.mark.parametrize("suspended_for", [1, 60, 3600])
@pytest.mark.parametrize("moment", ["suspended", "unsuspended, before the Job controller's write"])
def test_a_suspended_jobs_stale_start_never_raises_its_deadline(suspended_for, moment):
    """Kubernetes before 1.36 keeps a suspended Job's old startTime until the resume. Read as a start, the time the
    Job spent suspended raised its deadline by as much (605 s became 4,205 after an hour): resumed by Kueue with the
    operator down or its FineTuneJob gone, it would run that long. A 600 s job suspended after 100 s: its Job gets
    what is left (500 s) and the grace, suspended and at the resume alike."""
    w = workload(1, suspend=moment == "suspended")
    w["spec"]["activeDeadlineSeconds"] = 605
    w["status"]["startTime"] = ts(T0)
    w["status"]["conditions"] = [{"type": "Suspended", "status": "True", "lastTransitionTime": ts(T0 + 100 * SECOND)}]
    now = T0 + (100 + suspended_for) * SECOND
    if moment == "suspended":
        status = {**running_status(since=T0), "phase": "Suspended", "activeSeconds": 100}
        status.pop("activeSince", None)
    else:
        status = {**running_status(since=T0), "activeSeconds": 100, "activeSince": ts(now)}
    p = plan(job(**{"spec.suspend": moment == "suspended", "spec.runPolicy.activeDeadlineSeconds": 600}),
             observe(status, [w], now=now))
    assert p.job_deadline == ("test-job-a1", 500 + JOB_DEADLINE_GRACE_SECONDS)


def test_only_the_queue_priority_and_time_limit_kueue_keys_reach_the_job():
    """Kueue reads more keys than these (priority-boost, admission gates, partial admission, a prebuilt Workload):
    each would be a way around a runtime's locked queue or priority, or around the gang."""
    labels = {c.LABEL_KUEUE_QUEUE: "q", c.LABEL_KUEUE_PRIORITY: "high", c.KUEUE_MAX_EXEC_TIME: "60",
              c.LABEL_KUEUE_PREBUILT: "someone-elses", "kueue.x-k8s.io/elastic-job": "true", "team": "a"}
    annotations = {"kueue.x-k8s.io/priority-boost": "1000", "kueue.x-k8s.io/job-min-parallelism": "1",
                   c.KUEUE_MAX_EXEC_TIME: "60"}
    rendered = render_workload(job().spec, RenderContext(name="t", namespace="ns", job_labels=labels,
                                                         job_annotations=annotations))
    kueue = {k for k in {**rendered["metadata"]["labels"], **rendered["metadata"]["annotations"]}
             if k.startswith(c.KUEUE_PREFIX)}
    assert kueue == {c.LABEL_KUEUE_QUEUE, c.LABEL_KUEUE_PRIORITY, c.KUEUE_MAX_EXEC_TIME}
