"""The operator and an attempt that restarts in place (controller/in_place.py), pure: lost pods replaced alone and
counted, permanent errors and an exhausted budget as on a gang, the worker groups the trainer reports announced
once (Shrunk, Grew, RestartedInPlace) with goodput, and an elastic attempt running on fewer nodes than it asks."""

from datetime import UTC, datetime, timedelta

import pytest

from finetune_operator.api import constants as c
from finetune_operator.api.status import FineTuneJobStatus
from finetune_operator.api.validation import validate_job
from finetune_operator.controller import lifecycle
from finetune_operator.controller.in_place import nodes_text, pods_needed
from finetune_operator.controller.planning import Observed
from tests.builders import make_job

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def job(fewest=2, **overrides):
    manifest = make_job({"spec.distributed.numNodes": 3, "spec.distributed.gpusPerNode": 8,
                         "spec.training.gradientAccumulationSteps": 2, "spec.output.claimName": "shared", **overrides})
    if fewest is not None:
        manifest["spec"]["distributed"]["minNodes"] = fewest
    return validate_job(manifest)


def attempt(failed=0, ready=3, limit=3, fewest=2, suspend=False, complete=False):
    annotations = {c.ANNOTATION_RESTARTS_IN_PLACE: str(limit)}
    if fewest is not None:
        annotations[c.ANNOTATION_MIN_NODES] = str(fewest)
    conditions = [{"type": "SuccessCriteriaMet", "status": "True"}] if complete else []
    return {"metadata": {"name": "test-job-a1", "labels": {c.LABEL_ATTEMPT: "1"}, "annotations": annotations},
            "spec": {"suspend": suspend, "parallelism": 3, "backoffLimit": 2**31 - 1},
            "status": {"ready": ready, "failed": failed, "conditions": conditions}}


def failed_pod(i, code=137, reason="Error", disrupted=False, finished="2026-01-01T11:59:00Z"):
    status = {"phase": "Failed", "containerStatuses": [{"name": c.CONTAINER_NAME, "state": {"terminated": {
        "exitCode": code, "reason": reason, "message": "", "finishedAt": finished}}}]}
    if disrupted:
        status["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                                 "message": "Eviction API: evicting"}]
    return {"metadata": {"name": f"test-job-a1-{i}-x", "labels": {c.LABEL_ATTEMPT: "1"}}, "status": status}


def running(**extra):
    return {"phase": "Running", "attempt": 1, "restarts": 0, "startTime": ts(T0 - timedelta(minutes=5)),
            "gpus": 24, "conditions": [{"type": "Running", "status": "True", "lastTransitionTime": ts(T0)}],
            "goodput": {"gpuHours": 0.0, "restartDowntimeSeconds": 0, "stepsRedone": 0,
                        "runningSince": ts(T0 - timedelta(hours=1))}, **extra}


def plan(spec, status, workload, pods=(), now=T0):
    obs = Observed(name="test-job", namespace="ns", generation=1, labels={}, status=status, workloads=[workload],
                   pods=list(pods), now=now)
    result = lifecycle.plan(spec, obs)
    FineTuneJobStatus.model_validate(result.status)
    return result


def events(p):
    return [(e.type, e.reason) for e in p.events]


@pytest.mark.parametrize(("pod", "counted"), [
    (failed_pod(2, disrupted=True), False), (failed_pod(2, code=143), False), (None, False),
    (failed_pod(2, code=137), True), (failed_pod(2, code=1), True)],
    ids=["evicted", "sigterm-from-outside", "deleted", "killed", "crashed"])
def test_a_lost_pod_is_replaced_alone_and_the_others_keep_running(pod, counted):
    p = plan(job(), running(), attempt(failed=1, ready=2), [pod] if pod else [])
    assert (p.status["phase"], p.status["attempt"], p.status["restarts"]) == ("Running", 1, 0)
    assert p.delete_workloads == [] and p.create_attempt is None
    assert events(p) == [("Warning", "NodeLost")] and p.status["nodesLost"] == 1
    assert p.status["recovery"] == {"attempt": 1, "podsFailed": 1, "podFailures": int(counted)}
    assert p.status["nodes"] == "2/3 (min 2)"
    assert ("pod failure 1/3" in p.events[0].message) == counted
    # Looked at once: the next pass posts nothing again, and needs no pods.
    again = plan(job(), p.status, attempt(failed=1, ready=2))
    assert events(again) == [] and not pods_needed(attempt(failed=1), p.status)
    assert pods_needed(attempt(failed=2), p.status)


@pytest.mark.parametrize("code", [65, 78, 79], ids=["data", "config", "diverged"])
def test_a_permanent_error_fails_the_job_as_ever(code):
    p = plan(job(), running(), attempt(failed=1, ready=2), [failed_pod(1, code=code)])
    assert p.status["phase"] == "Failed" and "not retried" in p.status["message"]
    assert p.delete_workloads == ["test-job-a1"]


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_pods_failing_by_themselves_past_the_limit_restart_the_gang(limit):
    spec = job(fewest=None, **{"spec.runPolicy.inPlaceRestarts": limit})
    status, pods = running(), []
    for i in range(limit + 1):
        pods.append(failed_pod(i % 3, finished=f"2026-01-01T11:59:{10 + i:02d}Z"))
        p = plan(spec, status, attempt(failed=i + 1, ready=2, limit=limit, fewest=None), pods)
        status = p.status
        if i < limit:  # the fixed gang waits for its replaced pod: nothing restarts
            assert (p.status["attempt"], p.delete_workloads) == (1, [])
            assert p.status["recovery"]["podFailures"] == i + 1
    assert (p.status["phase"], p.status["attempt"], p.status["restarts"]) == ("Restarting", 2, 1), p.status
    assert f"runPolicy.inPlaceRestarts allows {limit}" in p.status["message"]
    assert p.delete_workloads == ["test-job-a1"]


def test_pods_stopped_by_a_suspend_are_no_lost_nodes():
    p = plan(job(**{"spec.suspend": True}), running(), attempt(failed=3, ready=0, suspend=True))
    assert "NodeLost" not in [e.reason for e in p.events] and p.status["recovery"]["podsFailed"] == 3


def group(nodes, generation, cause="a peer went away", lost=3, recovery=12.5, accumulation=None, attempt_=1):
    return {"attempt": attempt_, "generation": generation, "nodes": nodes, "worldSize": nodes * 8,
            "gradientAccumulationSteps": accumulation or 6 // nodes, "globalBatchSize": 48, "restartCount": 1,
            "resumedStep": 40, "cause": cause, "lostSteps": lost, "recoverySeconds": recovery}


def test_worker_groups_are_announced_once_each_with_goodput():
    first = plan(job(), running(workers=group(3, "g1", cause=None, lost=None, recovery=None)), attempt())
    assert events(first) == [] and first.status["recovery"]["generation"] == "g1"
    assert first.status["nodes"] == "3/3 (min 2)" and first.status["gpus"] == 24

    crashed = plan(job(), {**first.status, "workers": group(3, "g2", cause="Error (exit 1): boom")}, attempt())
    assert events(crashed) == [("Warning", "RestartedInPlace")] and crashed.status["restartsInPlace"] == 1
    assert "boom" in crashed.events[0].message and "3 step(s) redone" in crashed.events[0].message

    later = T0 + timedelta(minutes=30)
    shrunk = plan(job(), {**crashed.status, "workers": group(2, "g3")}, attempt(failed=1, ready=2), now=later)
    assert [e for e in events(shrunk) if e[1] == "Shrunk"] == [("Warning", "Shrunk")]
    assert shrunk.status["restartsInPlace"] == 2 and shrunk.status["gpus"] == 16
    assert "2 surviving node(s) (was 3; at least 2)" in next(e.message for e in shrunk.events if e.reason == "Shrunk")
    goodput = shrunk.status["goodput"]
    # The hour at 24 GPUs closed when the group shrank; the stall of a save counted once.
    assert goodput["gpuHours"] == pytest.approx(1.5 * 24) and goodput["runningSince"] == ts(later)
    assert (goodput["inPlaceRecoverySeconds"], goodput["stepsRedone"]) == (25.0, 6)

    grew = plan(job(), {**shrunk.status, "workers": group(3, "g4", lost=0, recovery=20.0)}, attempt())
    assert events(grew) == [("Normal", "Grew")] and grew.status["restartsInPlace"] == 2
    assert plan(job(), grew.status, attempt()).events == []  # the same report: nothing new


def test_groups_re_formed_before_the_first_step_are_the_start():
    p = plan(job(), running(workers=group(3, "g1", cause="Interrupted (exit 143): stopped before training")),
             attempt())
    assert events(p) == [] and "restartsInPlace" not in p.status and p.status["recovery"]["nodes"] == 3


def test_a_report_of_another_attempt_is_not_announced():
    p = plan(job(), running(workers=group(2, "old", attempt_=0)), attempt())
    assert events(p) == [] and "generation" not in p.status.get("recovery", {})


@pytest.mark.parametrize(("ready", "phase"), [(3, "Running"), (2, "Running"), (1, "Pending"), (0, "Pending")])
def test_an_elastic_attempt_runs_from_min_nodes(ready, phase):
    p = plan(job(), {"phase": "Pending", "attempt": 1, "startTime": ts(T0)}, attempt(ready=ready))
    assert (p.status["phase"], p.status["nodes"]) == (phase, nodes_text(ready, 3, 2))


def test_checkpoint_stalls_add_up_once_per_checkpoint():
    status = running(checkpoint={"step": 10, "path": "/output/checkpoint-10", "stallSeconds": 0.25})
    p = plan(job(), status, attempt())
    assert p.status["goodput"]["checkpointStallSeconds"] == 0.25
    same = plan(job(), {**p.status, "checkpoint": status["checkpoint"]}, attempt())
    assert same.status["goodput"]["checkpointStallSeconds"] == 0.25
    new = plan(job(), {**p.status, "checkpoint": {**status["checkpoint"], "step": 20, "stallSeconds": 0.5}},
               attempt())
    assert new.status["goodput"]["checkpointStallSeconds"] == 0.75


def test_a_fixed_gang_in_place_waits_for_its_replaced_pod_past_the_schedule_timeout():
    spec = job(fewest=None, **{"spec.runPolicy.inPlaceRestarts": 2, "spec.runPolicy.scheduleTimeoutSeconds": 60})
    formed = running(recovery={"attempt": 1, "podsFailed": 1, "podFailures": 1, "generation": "g1", "nodes": 3})
    old = attempt(failed=1, ready=2, limit=2, fewest=None)
    old["metadata"]["creationTimestamp"] = ts(T0 - timedelta(hours=2))
    p = plan(spec, formed, old)
    assert p.status["phase"] == "Pending" and p.status["attempt"] == 1 and p.delete_workloads == []
    assert p.status["nodes"] == "2/3"


@pytest.mark.parametrize(("nodes", "starts"), [(1, False), (2, True), (3, True)])
def test_an_elastic_job_needs_room_for_min_nodes_only(nodes, starts):
    free = [{"name": f"gpu-node-{i}", "labels": {}, "taints": [], "unschedulable": False,
             "allocatable": {"nvidia.com/gpu": "8"}} for i in range(nodes)]
    obs = Observed(name="test-job", namespace="ns", generation=1, labels={}, status={}, workloads=[], pods=[],
                   now=T0, nodes=free)
    p = lifecycle.plan(job(), obs)
    assert (p.create_attempt == 1) == starts and (p.status.get("reason") == "InsufficientCapacity") != starts


@pytest.mark.parametrize("lost", [(0,), (1,), (2,), (0, 1), (1, 2), (0, 1, 2)],
                         ids=lambda lost: "+".join(map(str, lost)))
def test_pods_lost_together_are_each_replaced_alone_and_below_min_nodes_the_job_waits(lost):
    """Node 0 (the rendezvous' host) is a lost node as any other to the operator; two or three lost in one pass are
    each counted and announced; below minNodes the attempt waits for its replacements (Pending), never restarted."""
    ready = 3 - len(lost)
    p = plan(job(), running(), attempt(failed=len(lost), ready=ready), [failed_pod(i) for i in lost])
    assert (p.status["attempt"], p.status["restarts"], p.delete_workloads, p.create_attempt) == (1, 0, [], None)
    lost_events = [e for e in p.events if e.reason == "NodeLost"]
    assert [e.type for e in lost_events] == ["Warning"] * len(lost) and p.status["nodesLost"] == len(lost)
    assert [f"test-job-a1-{i}-x" in e.message for i, e in zip(lost, lost_events, strict=True)] == [True] * len(lost)
    assert p.status["recovery"]["podFailures"] == len(lost)
    assert p.status["phase"] == ("Running" if ready >= 2 else "Pending"), p.status
    assert p.status["nodes"] == f"{ready}/3 (min 2)"
