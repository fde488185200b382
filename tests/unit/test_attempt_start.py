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


def _running_job(deadline_seconds):
    w = workload(1)
    w["spec"]["activeDeadlineSeconds"] = deadline_seconds
    w["status"]["startTime"] = ts(T0)
    return w


@pytest.mark.parametrize("deadline, patched", [(600, None), (300, None),
                                               (3600, 100 + 3600 - 100 + JOB_DEADLINE_GRACE_SECONDS),
                                               (None, "removed")])
def test_an_edit_of_the_deadline_reaches_the_running_attempts_job_only_when_it_would_end_it_early(deadline,
                                                                                                  patched):
    """The Job was created with 605 s (a 600 s deadline). 100 s later the job's deadline is edited: a lower one is
    the operator's to keep (it fails the job itself), a higher one or none must not be cut short by the Job's own."""
    status = {**running_status(since=T0), "activeSince": ts(T0)}
    overrides = {"spec.runPolicy.activeDeadlineSeconds": deadline} if deadline else {}
    p = plan(job(**overrides), observe(status, [_running_job(605)], now=T0 + timedelta(seconds=100),
                                       pods=[{"metadata": {"name": f"p{i}"}, "status": {"phase": "Running"}}
                                             for i in range(2)]))
    if patched is None:
        assert p.job_deadline is None
    elif patched == "removed":
        assert p.job_deadline == ("test-job-a1", None)
    else:
        assert p.job_deadline == ("test-job-a1", patched)


@pytest.mark.parametrize("since_after_start, patched", [(0, None), (1, None), (2, 600 + 2 + JOB_DEADLINE_GRACE_SECONDS),
                                                       (30, 600 + 30 + JOB_DEADLINE_GRACE_SECONDS)])
def test_the_jobs_deadline_is_raised_for_a_later_active_clock_not_for_the_rounding_of_two_whole_seconds(
        since_after_start, patched):
    """Created with 605 s. The Job's startTime and the job's activeSince are whole seconds: a Job that started at
    10.9 s and a job active from 11.1 s read 10 and 11, one second apart with no edit (a warm run's attempt Job went
    from 605 to 606 this way). A clock that really started later (the Job ran before the job counted as active) is
    followed, so the Job's own deadline never fires before the operator's."""
    status = {**running_status(since=T0), "activeSince": ts(T0 + timedelta(seconds=since_after_start))}
    pods = [{"metadata": {"name": f"p{i}"}, "status": {"phase": "Running"}} for i in range(2)]
    p = plan(job(**{"spec.runPolicy.activeDeadlineSeconds": 600}),
             observe(status, [_running_job(605)], now=T0 + timedelta(seconds=100), pods=pods))
    assert p.job_deadline == (None if patched is None else ("test-job-a1", patched))


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
