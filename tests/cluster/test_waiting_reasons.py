"""A cluster that says why: on the real control plane, a gang that cannot run reads its reason in `kubectl get ftj`
(REASON), in its conditions and in one Warning Event from the operator, within seconds, with no pod watch; a
partial gang is torn down after runPolicy.scheduleTimeoutSeconds and runs once capacity appears."""

import json
import re
import time

import pytest

from finetune_operator.api import constants as c
from tests.builders import make_job
from tests.support.controlplane import fake_gpu_node
from tests.support.events import wait_events
from tests.support.job_status import wait_status
from tests.support.policy import MESSAGE as POLICY_MESSAGE
from tests.support.policy import refusing_attempt

POOL = "test.finetunejob.dev/pool"


def submit(kubectl, ns, name, **overrides):
    doc = make_job({"metadata.name": name, "metadata.namespace": ns, "spec.distributed.numNodes": 2, **overrides})
    kubectl.run("apply", "-f", "-", input=json.dumps(doc))


def wait_warnings(kubectl, ns, name, reason, operator):
    return wait_events(kubectl, ns, name=name, reason=reason, kind="FineTuneJob", type_="Warning", op=operator)


def reason_column(kubectl, ns, name):
    """The REASON cell of `kubectl get ftj` (columns are aligned under their header; empty cells are blank)."""
    header, row = kubectl.run("get", "ftj", name, "-n", ns).stdout.splitlines()[:2]
    start = header.index("REASON")
    return row[start:].split()[0]


def test_more_gpus_per_node_than_any_node_has_reads_unschedulable(kubectl, operator, namespace):
    submit(kubectl, namespace, "too-big", **{"spec.distributed.numNodes": 1, "spec.distributed.gpusPerNode": 16,
                                             "spec.runPolicy.capacityShortage": "create"})  # the scheduler's words
    started = time.monotonic()
    st = wait_status(kubectl, namespace, "too-big", lambda s: s.get("reason") == "Unschedulable", operator)
    # At once, from the nodes' shape (the chart's nodeShapeCheck), before the scheduler's first try is even read.
    assert time.monotonic() - started < 8, time.monotonic() - started
    assert "gpusPerNode is 16, but the largest of the cluster's nodes" in st["message"]
    assert "has 8 nvidia.com/gpu" in st["message"]
    # Then the scheduler's own words, once the waiting gang is looked at (same reason: no second Event).
    st = wait_status(kubectl, namespace, "too-big", lambda s: "Insufficient nvidia.com/gpu" in s.get("message", ""),
                     operator)
    assert time.monotonic() - started < 40  # within seconds of the grace, not minutes
    assert st["phase"] == "Pending" and st["reason"] == "Unschedulable"
    waiting = next(cd for cd in st["conditions"] if cd["type"] == "Waiting")
    assert waiting["status"] == "True" and waiting["reason"] == "Unschedulable"
    assert reason_column(kubectl, namespace, "too-big") == "Unschedulable"
    time.sleep(20)  # later looks (every 15 s) find the same reason: no second Event
    events = wait_warnings(kubectl, namespace, "too-big", "Unschedulable", operator)
    assert len(events) == 1 and events[0].get("count") in (None, 1), events
    source = (events[0].get("source") or {}).get("component") or events[0].get("reportingComponent")
    assert source == c.MANAGED_BY, events[0]  # From: finetunejob-operator, not kopf


def test_a_resource_quota_reads_quota_exceeded(kubectl, operator, namespace):
    """A quota that could hold the gang but is used up by another job (one below the gang fails at once: below)."""
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu-quota", "namespace": namespace},
             "spec": {"hard": {"requests.nvidia.com/gpu": "16"}}}
    kubectl.run("apply", "-f", "-", input=json.dumps(quota))
    deadline = time.monotonic() + 30  # enforced once the quota controller has computed its usage
    while not kubectl.json("get", "resourcequota", "gpu-quota", "-n", namespace).get("status", {}).get("hard"):
        assert time.monotonic() < deadline, "the ResourceQuota was never processed"
        time.sleep(0.3)
    submit(kubectl, namespace, "first", **{"spec.distributed.numNodes": 1, "spec.distributed.gpusPerNode": 8})
    wait_status(kubectl, namespace, "first", lambda s: s.get("nodes") == "1/1", operator)
    submit(kubectl, namespace, "over-quota", **{"spec.distributed.gpusPerNode": 8})
    st = wait_status(kubectl, namespace, "over-quota", lambda s: s.get("reason") == "QuotaExceeded", operator)
    assert "exceeded quota: gpu-quota" in st["message"] and st["nodes"] in ("0/2", "1/2")
    assert reason_column(kubectl, namespace, "over-quota") == "QuotaExceeded"


def test_a_job_an_admission_policy_refuses_says_so_and_starts_once_allowed(kubectl, operator, namespace):
    """Nothing watched shows a Job that was never created: the apiserver's refusal is the job's reason."""
    with refusing_attempt(kubectl, namespace, 1):
        submit(kubectl, namespace, "refused", **{"spec.distributed.numNodes": 1})
        st = wait_status(kubectl, namespace, "refused", lambda s: s.get("reason") == "AttemptRefused", operator)
        assert st["phase"] == "Pending" and POLICY_MESSAGE in st["message"], st
        assert reason_column(kubectl, namespace, "refused") == "AttemptRefused"
        waiting = next(cd for cd in st["conditions"] if cd["type"] == "Waiting")
        assert waiting["status"] == "True" and waiting["reason"] == "AttemptRefused"
        time.sleep(12)  # retried meanwhile (every few seconds): still one Warning, not one per retry
        refusals = wait_warnings(kubectl, namespace, "refused", "AttemptRefused", operator)
        assert len(refusals) == 1 and refusals[0].get("count", 1) == 1, refusals
        assert not kubectl.json("get", "jobs", "-n", namespace)["items"]
    st = wait_status(kubectl, namespace, "refused", lambda s: s.get("nodes") == "1/1", operator)
    assert st["phase"] == "Running" and st["reason"] == "Running", st


@pytest.fixture
def pool_nodes(kubectl):
    """Fake GPU nodes of a pool no other test uses (its jobs select it), removed afterwards."""
    created = []

    def add(name):
        node = fake_gpu_node(name)
        node["metadata"]["labels"][POOL] = "waiting"
        kubectl.run("apply", "-f", "-", input=json.dumps(node))
        kubectl.wait_condition("Ready", f"node/{name}")
        if kubectl.json("get", "node", name)["spec"].get("taints"):
            kubectl.run("patch", "node", name, "--type=json", "-p", '[{"op": "remove", "path": "/spec/taints"}]')
        created.append(name)

    yield add
    for name in created:
        kubectl.run("delete", "node", name, "--wait=false", check=False)


def test_a_partial_gang_frees_its_gpus_after_the_schedule_timeout_and_runs_when_capacity_appears(
        kubectl, operator, namespace, pool_nodes):
    pool_nodes("pool-gpu-0")
    submit(kubectl, namespace, "partial", **{"spec.distributed.gpusPerNode": 8,
                                             "spec.pod.nodeSelector": {POOL: "waiting"},
                                             "spec.runPolicy.scheduleTimeoutSeconds": 20,
                                             "spec.runPolicy.backoffLimit": 0,
                                             "spec.runPolicy.capacityShortage": "create"})
    try:
        st = wait_status(kubectl, namespace, "partial", lambda s: s.get("nodes") == "1/2"
                         and s.get("reason") == "Unschedulable", operator)
    except AssertionError:
        pods = kubectl.run("get", "pods", "-n", namespace, "-o", "wide").stdout
        nodes = kubectl.run("get", "nodes", "--show-labels").stdout
        raise AssertionError(pods + nodes) from None
    st = wait_status(kubectl, namespace, "partial", lambda s: s.get("reason") == "ScheduleTimeout", operator)
    assert (st["scheduleRetries"], st["restarts"]) == (1, 0) and "scheduleTimeoutSeconds=20" in st["message"]

    def attempt_one_pods():
        items = kubectl.json("get", "pods", "-n", namespace, "-l", f"{c.LABEL_JOB}=partial,{c.LABEL_ATTEMPT}=1")
        return items["items"]

    deadline = time.monotonic() + 60
    while attempt_one_pods() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert attempt_one_pods() == []  # no pod of the partial gang holds a GPU any more
    pool_nodes("pool-gpu-1")
    st = wait_status(kubectl, namespace, "partial", lambda s: s.get("phase") == "Running", operator, timeout=120)
    assert st["nodes"] == "2/2" and st["restarts"] == 0 and st["attempt"] >= 2


def test_an_image_that_cannot_be_pulled_reads_image_pull_failed(kubectl, operator, namespace):
    """The kubelet's ErrImagePull (a kwok stage plays the kubelet: tests/support/kwok/pod-image-pull-fails.yaml)."""
    image = "registry.example.com/team/trainer:no-such-tag"
    annotations = {"test.finetunejob.dev/image-pull": "fail", "pod-ready.stage.kwok.x-k8s.io/weight": "0"}
    submit(kubectl, namespace, "bad-image", **{"spec.pod.image": image, "spec.pod.annotations": annotations})
    st = wait_status(kubectl, namespace, "bad-image", lambda s: s.get("reason") == "ImagePullFailed", operator)
    assert st["phase"] == "Pending" and "ErrImagePull" in st["message"] and image in st["message"], st
    assert reason_column(kubectl, namespace, "bad-image") == "ImagePullFailed"
    waiting = next(cd for cd in st["conditions"] if cd["type"] == "Waiting")
    assert waiting["status"] == "True" and waiting["reason"] == "ImagePullFailed"
    events = wait_warnings(kubectl, namespace, "bad-image", "ImagePullFailed", operator)
    assert len(events) == 1 and image in events[0]["message"], events


def test_a_gang_the_cluster_can_never_hold_warns_at_once_and_stops_retrying(kubectl, operator, namespace):
    """40 x 8 GPUs: more than every GPU node of this session holds together."""
    submit(kubectl, namespace, "never-fits", **{
        "spec.distributed.numNodes": 40, "spec.distributed.gpusPerNode": 8, "spec.training.precision": "bf16",
        "spec.runPolicy.scheduleTimeoutSeconds": 15, "spec.runPolicy.scheduleRetryLimit": 1,
        "spec.runPolicy.capacityShortage": "create"})  # created for an autoscaler to see, retried, then failed
    st = wait_status(kubectl, namespace, "never-fits", lambda s: s.get("reason") == "InsufficientCapacity", operator,
                     timeout=20)
    assert re.search(r"the gang needs 40 pod\(s\) of 8 nvidia.com/gpu \(320 in all\), but the cluster's nodes hold "
                     r"\d+ such pod\(s\)", st["message"]), st["message"]
    assert wait_warnings(kubectl, namespace, "never-fits", "InsufficientCapacity", operator)
    st = wait_status(kubectl, namespace, "never-fits", lambda s: s.get("phase") == "Failed", operator, timeout=120)
    assert st["reason"] == "ScheduleRetriesExhausted" and st["scheduleRetries"] == 1
    # No GPU held: the status is written first (reconcile.py), then the attempt's Job is deleted and the garbage
    # collector takes its pods, a moment later.
    deadline = time.monotonic() + 30
    while held := [p["metadata"]["name"] for p in kubectl.json(
            "get", "pods", "-n", namespace, "-l", f"{c.LABEL_JOB}=never-fits")["items"]
            if not p["metadata"].get("deletionTimestamp")]:
        assert time.monotonic() < deadline, f"pods still held 30 s after Failed: {held}"
        time.sleep(0.3)


def test_a_gang_above_the_namespaces_gpu_quota_fails_at_once(kubectl, operator, namespace):
    kubectl.run("create", "quota", "gpus", "-n", namespace, "--hard=requests.nvidia.com/gpu=12")
    submit(kubectl, namespace, "over-quota", **{"spec.distributed.numNodes": 2, "spec.distributed.gpusPerNode": 8,
                                               "spec.training.precision": "bf16"})
    st = wait_status(kubectl, namespace, "over-quota", lambda s: s.get("phase") == "Failed", operator, timeout=20)
    assert st["reason"] == "QuotaTooSmall" and "ResourceQuota gpus of this namespace allows 12" in st["message"]
    assert not kubectl.json("get", "jobs", "-n", namespace)["items"]  # nothing created, no GPU ever requested


def test_a_gang_the_nodes_cannot_hold_holds_nothing_and_starts_once_they_can(kubectl, operator, namespace,
                                                                           pool_nodes):
    """The default (runPolicy.capacityShortage: wait): 2 x 8 GPUs on a pool of one 8-GPU node creates no Job and
    holds no GPU; a second node in the pool, and the gang starts."""
    pool_nodes("pool-short-0")
    submit(kubectl, namespace, "short", **{"spec.distributed.gpusPerNode": 8,
                                           "spec.pod.nodeSelector": {POOL: "waiting"}})
    st = wait_status(kubectl, namespace, "short", lambda s: s.get("reason") == "InsufficientCapacity", operator)
    assert st["phase"] == "Pending" and not st.get("attempt"), st
    assert "nothing is created and no GPU held until they can" in st["message"]
    time.sleep(5)
    assert not kubectl.json("get", "jobs", "-n", namespace)["items"]  # no pod, so no GPU, held
    pool_nodes("pool-short-1")
    st = wait_status(kubectl, namespace, "short", lambda s: s.get("nodes") == "2/2", operator, timeout=150)
    assert (st["phase"], st["attempt"], st["scheduleRetries"]) == ("Running", 1, 0), st
    assert len(wait_warnings(kubectl, namespace, "short", "InsufficientCapacity", operator)) == 1
