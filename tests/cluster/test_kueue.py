"""A real Kueue (its manager from the Go module, its CRDs and webhooks, the batch/Job integration) beside the
operator on the test control plane: admission, queueing behind a busy quota, preemption, never fighting Kueue over
a Job's spec.suspend, Kueue's own reasons in `kubectl get ftj`, deadlines that do not count queue time.

ClusterQueue `gpus`: 16 GPUs, the two kwok GPU nodes' worth; a higher WorkloadPriorityClass preempts a lower one."""

import json
import time

import pytest

from finetune_operator.api import constants as c
from tests.cluster.test_operator import attempt_pods, status, submit, terminate, wait_for, wait_phase
from tests.support.events import wait_events
from tests.support.kueue import Kueue, cluster_queue, local_queue, priority_class, wait_quota_free
from tests.support.minio import build_components
from tests.support.policy import MESSAGE as POLICY_MESSAGE
from tests.support.policy import refusing_attempt

QUEUE = "gpu-queue"
PRIORITY = "kueue.x-k8s.io/priority-class"
HOLD_GRACE = 15  # seconds a gang restart may hold its admission past its backoff while its Job cannot be created
OPERATOR_ENV = {c.ENV_OPERATOR_KUEUE_HOLD_GRACE: str(HOLD_GRACE)}


@pytest.fixture(scope="module")
def kueue(kubectl, control_plane):
    manager = Kueue(build_components()["kueue"], control_plane, kubectl).start()
    for obj in [*cluster_queue("gpus", 16), priority_class("high", 1000), priority_class("low", 10)]:
        kubectl.run("apply", "-f", "-", input=json.dumps(obj))
    yield manager
    manager.stop()


@pytest.fixture
def queued(kueue, kubectl, namespace):
    """The test's namespace with a LocalQueue into the 16-GPU ClusterQueue, once no earlier test's job holds it."""
    wait_quota_free(kubectl, "gpus")
    kubectl.run("apply", "-f", "-", input=json.dumps(local_queue(namespace, QUEUE, "gpus")))
    return namespace


def gang(kubectl, ns, name, nodes=2, queue=QUEUE, labels=None, annotations=None, **overrides):
    """`nodes` x 8 GPUs, queued through Kueue."""
    meta = {"metadata.labels": {**({c.LABEL_KUEUE_QUEUE: queue} if queue else {}), **(labels or {})}}
    if annotations:
        meta["metadata.annotations"] = annotations
    submit(kubectl, ns, name, **{"spec.distributed.numNodes": nodes, "spec.distributed.gpusPerNode": 8,
                                 "spec.training.precision": "bf16", **meta, **overrides})


def job_of(kubectl, ns, name, attempt=1):
    return kubectl.json("get", "job", f"{name}-a{attempt}", "-n", ns)


def workload_of(kubectl, ns, name, attempt=1):
    items = kubectl.json("get", "workloads.kueue.x-k8s.io", "-n", ns)["items"]
    return next(w for w in items if any(o["name"] == f"{name}-a{attempt}" for o in w["metadata"]["ownerReferences"]))


def events(kubectl, ns, name):
    items = kubectl.json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"]
    return [(e["type"], e["reason"], e["message"]) for e in items]


def finish(kubectl, ns, name, attempt=1):
    for pod in attempt_pods(kubectl, ns, name, attempt):
        terminate(kubectl, ns, pod["metadata"]["name"], 0, reason="Completed")


def suspend_flips(kubectl, ns, name, seconds):
    """How many times the attempt's Job left spec.suspend: true in `seconds` (the operator and Kueue fighting over
    it flipped it every second or two)."""
    flips, last = 0, job_of(kubectl, ns, name)["spec"]["suspend"]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = job_of(kubectl, ns, name)["spec"]["suspend"]
        flips, last = flips + (last and not now), now
        time.sleep(0.25)
    return flips


def test_kueue_labels_reach_the_job_and_an_admitted_job_runs(queued, kubectl, operator):
    gang(kubectl, queued, "admitted", labels={"kueue.x-k8s.io/priority-class": "high"},
         annotations={"kueue.x-k8s.io/max-exec-time-seconds": "86400"})
    st = wait_phase(kubectl, queued, "admitted", "Running", operator, timeout=60, nodes="2/2")
    job = job_of(kubectl, queued, "admitted")
    assert job["metadata"]["labels"][c.LABEL_KUEUE_QUEUE] == QUEUE
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    assert job["metadata"]["annotations"]["kueue.x-k8s.io/max-exec-time-seconds"] == "86400"
    assert workload_of(kubectl, queued, "admitted")["spec"]["priority"] == 1000  # the Workload got its priority
    assert st["reason"] == "Running"
    finish(kubectl, queued, "admitted")
    wait_phase(kubectl, queued, "admitted", "Succeeded", operator, timeout=60)


def test_queued_behind_a_busy_quota_says_why_and_its_deadline_waits(queued, kubectl, operator):
    gang(kubectl, queued, "first")
    wait_phase(kubectl, queued, "first", "Running", operator, timeout=60)
    gang(kubectl, queued, "second", **{"spec.runPolicy.activeDeadlineSeconds": 20})
    st = wait_for(lambda: "quota" in (s := status(kubectl, queued, "second") or {}).get("message", "") and s, 60,
                  "second Queued with Kueue's reason", operator)
    assert st["reason"] == "Queued" and "insufficient unused quota for nvidia.com/gpu" in st["message"], st
    assert "16 more needed" in st["message"]
    row = kubectl.run("get", "ftj", "second", "-n", queued, "--no-headers").stdout.split()
    assert row[1] == "Queued" and "Queued" in row
    time.sleep(25)  # longer than its activeDeadlineSeconds, all of it in the queue
    assert status(kubectl, queued, "second")["phase"] == "Queued"
    finish(kubectl, queued, "first")
    wait_phase(kubectl, queued, "second", "Running", operator, timeout=60, nodes="2/2")
    # Running now: the deadline counts from here and ends the job (Queued time never counted).
    st = wait_phase(kubectl, queued, "second", "Failed", operator, timeout=60)
    assert st["reason"] == "DeadlineExceeded" and "active (not queued or suspended)" in st["message"]


def test_a_gang_larger_than_its_queue_and_a_misspelled_queue_are_warnings_at_once(queued, kubectl, operator):
    gang(kubectl, queued, "too-big", nodes=3)  # 24 GPUs > the ClusterQueue's 16
    gang(kubectl, queued, "typo", nodes=1, queue="gpu-queu")
    # The ClusterQueue covers cpu, memory and GPUs: Kueue never admits a gang that also asks for local disk.
    gang(kubectl, queued, "disk", nodes=1, **{"spec.resources.ephemeralStorage": "20Gi"})
    big = wait_for(lambda: (s := status(kubectl, queued, "too-big") or {}).get("reason") == "QueueTooSmall" and s,
                   60, "QueueTooSmall", operator)
    assert "maximum capacity (16)" in big["message"] and "will wait forever" in big["message"]
    assert "fewer GPUs (nvidia.com/gpu: distributed.numNodes x gpusPerNode)" in big["message"]
    disk = wait_for(lambda: (s := status(kubectl, queued, "disk") or {}).get("reason") == "QueueTooSmall" and s,
                    60, "QueueTooSmall for a resource the queue does not cover", operator)
    assert "resource ephemeral-storage unavailable in ClusterQueue" in disk["message"], disk
    assert "coveredResources" in disk["message"] and "resources.ephemeralStorage unset" in disk["message"], disk
    typo = wait_for(lambda: (s := status(kubectl, queued, "typo") or {}).get("reason") == "LocalQueueMissing" and s,
                    60, "LocalQueueMissing", operator)
    assert "LocalQueue gpu-queu doesn't exist" in typo["message"]
    for name, reason in (("too-big", "QueueTooSmall"), ("typo", "LocalQueueMissing"), ("disk", "QueueTooSmall")):
        wait_events(kubectl, queued, name=name, reason=reason, type_="Warning", op=operator)


def test_a_misspelled_queue_fixed_on_the_finetunejob_is_admitted_and_runs(queued, kubectl, operator):
    """What the LocalQueueMissing message tells users to do (fix the label) works: the queued Job follows."""
    gang(kubectl, queued, "relabelled", nodes=1, queue="gpu-queu", labels={PRIORITY: "low"})
    wait_for(lambda: (status(kubectl, queued, "relabelled") or {}).get("reason") == "LocalQueueMissing", 60,
             "LocalQueueMissing", operator)
    # The queue fixed and the priority raised while it waits.
    kubectl.run("label", "ftj", "relabelled", "-n", queued, f"{c.LABEL_KUEUE_QUEUE}={QUEUE}", f"{PRIORITY}=high",
                "--overwrite")
    wait_phase(kubectl, queued, "relabelled", "Running", operator, timeout=60, nodes="1/1")
    labels = job_of(kubectl, queued, "relabelled")["metadata"]["labels"]
    assert (labels[c.LABEL_KUEUE_QUEUE], labels[PRIORITY]) == (QUEUE, "high")
    workload = workload_of(kubectl, queued, "relabelled")
    assert workload["spec"]["queueName"] == QUEUE and workload["spec"]["priority"] == 1000, workload["spec"]
    wait_events(kubectl, queued, name="relabelled", reason="KueueLabelsChanged", op=operator)
    finish(kubectl, queued, "relabelled")
    wait_phase(kubectl, queued, "relabelled", "Succeeded", operator, timeout=60)


def test_suspending_an_admitted_job_deactivates_its_workload_without_a_loop(queued, kubectl, operator):
    gang(kubectl, queued, "paused")
    wait_phase(kubectl, queued, "paused", "Running", operator, timeout=60)
    kubectl.run("patch", "ftj", "paused", "-n", queued, "--type=merge", "-p",
                json.dumps({"spec": {"suspend": True}}))
    st = wait_phase(kubectl, queued, "paused", "Suspended", operator, timeout=60)
    assert "deactivated" in st["message"]
    wait_for(lambda: workload_of(kubectl, queued, "paused")["spec"]["active"] is False, 30, "deactivated", operator)
    wait_for(lambda: job_of(kubectl, queued, "paused")["spec"]["suspend"], 30, "Kueue suspends the Job", operator)
    assert suspend_flips(kubectl, queued, "paused", 15) == 0  # was ~14 per 15 s: operator and Kueue fighting
    assert c.ANNOTATION_SUSPENDED not in job_of(kubectl, queued, "paused")["metadata"].get("annotations", {})
    # The quota is free: another 16-GPU gang is admitted while this one is suspended.
    gang(kubectl, queued, "meanwhile")
    wait_phase(kubectl, queued, "meanwhile", "Running", operator, timeout=60)
    finish(kubectl, queued, "meanwhile")
    # Raised in priority while suspended: the resumed gang queues (and runs) with it, not with the old one.
    kubectl.run("label", "ftj", "paused", "-n", queued, f"{PRIORITY}=high", "--overwrite")
    kubectl.run("patch", "ftj", "paused", "-n", queued, "--type=merge", "-p",
                json.dumps({"spec": {"suspend": False}}))
    st = wait_phase(kubectl, queued, "paused", "Running", operator, timeout=90, nodes="2/2")
    assert job_of(kubectl, queued, "paused", st["attempt"])["metadata"]["labels"][PRIORITY] == "high"
    workload = workload_of(kubectl, queued, "paused", st["attempt"])
    assert workload["spec"]["active"] is True and workload["spec"]["priority"] == 1000, workload["spec"]
    finish(kubectl, queued, "paused", attempt=st["attempt"])
    wait_phase(kubectl, queued, "paused", "Succeeded", operator, timeout=60)


def test_a_preempted_job_says_so_and_shows_no_eta(queued, kubectl, operator):
    gang(kubectl, queued, "low", labels={"kueue.x-k8s.io/priority-class": "low"})
    wait_phase(kubectl, queued, "low", "Running", operator, timeout=60)
    # What its trainer last reported while it ran.
    kubectl.run("patch", "ftj", "low", "-n", queued, "--subresource=status", "--type=merge", "-p", json.dumps(
        {"status": {"progress": {"phase": "Training", "step": 830, "maxSteps": 1000, "percent": 83, "loss": 1.2,
                                 "eta": "0m04s"}}}))
    gang(kubectl, queued, "high", labels={"kueue.x-k8s.io/priority-class": "high"})
    st = wait_for(lambda: (s := status(kubectl, queued, "low") or {}).get("reason") == "Preempted" and s, 90,
                  "low preempted", operator)
    assert st["phase"] == "Queued" and "preempted by Kueue" in st["message"]
    assert "eta" not in st["progress"] and st["progress"]["phase"] == "Stopped", st["progress"]
    assert st["progress"]["step"] == 830  # the last attempt's, marked as such
    wait_phase(kubectl, queued, "high", "Running", operator, timeout=60)
    wait_events(kubectl, queued, name="low", reason="Preempted", type_="Warning", op=operator)
    finish(kubectl, queued, "high")
    wait_phase(kubectl, queued, "high", "Succeeded", operator, timeout=60)
    # The preempted job is admitted again once the quota is free, and runs to its end (the next tests need the
    # quota back before this namespace is gone).
    st = wait_phase(kubectl, queued, "low", "Running", operator, timeout=60, nodes="2/2")
    finish(kubectl, queued, "low", attempt=st["attempt"])
    wait_phase(kubectl, queued, "low", "Succeeded", operator, timeout=60)


def test_a_gang_restart_keeps_its_admission_and_its_place_in_the_queue(queued, kubectl, operator):
    """A node of the first job fails while a second job waits for the same 16 GPUs: the restarted gang runs under
    the Workload its first attempt was admitted with, and the second job, submitted later, does not overtake it."""
    gang(kubectl, queued, "holder")
    wait_phase(kubectl, queued, "holder", "Running", operator, timeout=60, nodes="2/2")
    admitted = workload_of(kubectl, queued, "holder")["metadata"]["name"]
    gang(kubectl, queued, "later")
    wait_for(lambda: (status(kubectl, queued, "later") or {}).get("phase") == "Queued", 60, "later Queued", operator)
    pod = attempt_pods(kubectl, queued, "holder", 1)[0]["metadata"]["name"]
    terminate(kubectl, queued, pod, 1)  # a retryable failure: a gang restart
    st = wait_phase(kubectl, queued, "holder", "Running", operator, attempt=2, timeout=90, nodes="2/2")
    assert st["restarts"] == 1, st
    job = job_of(kubectl, queued, "holder", attempt=2)
    assert job["metadata"]["labels"][c.LABEL_KUEUE_PREBUILT] == admitted
    kept = kubectl.json("get", "workloads.kueue.x-k8s.io", admitted, "-n", queued)
    assert [(o["kind"], o["name"]) for o in kept["metadata"]["ownerReferences"]] == [("Job", "holder-a2")]
    assert {cd["type"]: cd["status"] for cd in kept["status"]["conditions"]}["Admitted"] == "True"
    wait_events(kubectl, queued, name="holder", reason="KueueAdmissionKept", op=operator)
    # The later job still waits (it would have been admitted had the restart queued a new Workload behind it).
    time.sleep(5)
    assert status(kubectl, queued, "later")["phase"] == "Queued"
    assert job_of(kubectl, queued, "later")["spec"]["suspend"] is True
    finish(kubectl, queued, "holder", attempt=2)
    wait_phase(kubectl, queued, "holder", "Succeeded", operator, timeout=60)
    wait_phase(kubectl, queued, "later", "Running", operator, timeout=60, nodes="2/2")
    finish(kubectl, queued, "later")
    wait_phase(kubectl, queued, "later", "Succeeded", operator, timeout=60)



def test_a_held_admission_goes_back_when_the_next_attempt_cannot_be_created(queued, kubectl, operator):
    """A policy refuses the restarted gang's Job: the quota the failed attempt held goes back after its backoff and
    the grace (the later job runs), and the attempt queues anew once the policy lets it be created."""
    with refusing_attempt(kubectl, queued, 2):
        gang(kubectl, queued, "refused")
        wait_phase(kubectl, queued, "refused", "Running", operator, timeout=60, nodes="2/2")
        gang(kubectl, queued, "waiting")
        wait_for(lambda: (status(kubectl, queued, "waiting") or {}).get("phase") == "Queued", 60, "waiting Queued",
                 operator)
        terminate(kubectl, queued, attempt_pods(kubectl, queued, "refused", 1)[0]["metadata"]["name"], 1)
        held = wait_for(lambda: next((w for w in kubectl.json("get", "workloads.kueue.x-k8s.io", "-n", queued)["items"]
                                      if any(o["kind"] == c.KIND for o in w["metadata"]["ownerReferences"])), None),
                        60, "the failed attempt's Workload held by the FineTuneJob", operator)
        assert c.ANNOTATION_HELD_SINCE in held["metadata"]["annotations"]
        st = wait_for(lambda: (s := status(kubectl, queued, "refused") or {}).get("reason") == "AttemptRefused" and s,
                      30, "refused says why", operator)
        assert st["phase"] == "Restarting" and POLICY_MESSAGE in st["message"], st
        # While held (backoff and grace) the later job still waits; then the quota goes back and it runs.
        assert status(kubectl, queued, "waiting")["phase"] == "Queued"
        wait_phase(kubectl, queued, "waiting", "Running", operator, timeout=HOLD_GRACE + 60, nodes="2/2")
        wait_events(kubectl, queued, name="refused", reason="KueueReleased", type_="Warning", op=operator)
        said = events(kubectl, queued, "refused")
        assert any(t == "Warning" and r == "AttemptRefused" and POLICY_MESSAGE in m for t, r, m in said), said
        kept = kubectl.json("get", "workloads.kueue.x-k8s.io", held["metadata"]["name"], "-n", queued)
        assert kept["spec"]["active"] is False
    # Now its Job can be created: attempt 2 queues behind the job that took the quota, and runs after it.
    wait_for(lambda: (status(kubectl, queued, "refused") or {}).get("phase") == "Queued", 90, "refused Queued anew",
             operator)
    finish(kubectl, queued, "waiting")
    wait_phase(kubectl, queued, "waiting", "Succeeded", operator, timeout=60)
    wait_phase(kubectl, queued, "refused", "Running", operator, attempt=2, timeout=60, nodes="2/2")
    finish(kubectl, queued, "refused", attempt=2)
    wait_phase(kubectl, queued, "refused", "Succeeded", operator, timeout=60)


def test_an_elastic_gang_larger_than_its_quota_is_admitted_with_min_nodes(queued, kubectl, operator, tmp_path):
    """Kueue's partial admission: 3 nodes x 8 GPUs, at least 2, into 16 GPUs of quota: admitted with 2 pods (the
    Job's parallelism and completions lowered by Kueue), and running on them."""
    from tests.e2e.cluster_training import shared_volume

    shared_volume(kubectl, queued, tmp_path / "shared")
    gang(kubectl, queued, "stretch", nodes=3, **{"spec.distributed.minNodes": 2, "spec.output.claimName": "shared",
                                                 "spec.training.gradientAccumulationSteps": 2})
    wait_phase(kubectl, queued, "stretch", "Running", operator, timeout=60, nodes="2/2")
    job = job_of(kubectl, queued, "stretch")
    assert (job["spec"]["parallelism"], job["spec"]["completions"]) == (2, 2)
    assert job["metadata"]["annotations"][c.ANNOTATION_KUEUE_MIN_PARALLELISM] == "2"
    admission = workload_of(kubectl, queued, "stretch")["status"]["admission"]["podSetAssignments"][0]
    assert admission["count"] == 2 and len(attempt_pods(kubectl, queued, "stretch", 1)) == 2
    finish(kubectl, queued, "stretch")
    wait_phase(kubectl, queued, "stretch", "Succeeded", operator, timeout=60)
