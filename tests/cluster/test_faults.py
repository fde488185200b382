"""Faults on the real control plane: the operator SIGKILLed at random moments, the apiserver restarted, the
operator frozen past its watches, stale caches (409), and pod failures injected by a kwok Stage.

After each, every job converges with exactly the children it should have: one live Job of the right attempt, one
ConfigMap and one Service, each owned by the FineTuneJob that exists now; restart counts exact."""

import json
import os
import random
import signal
import threading
import time
from collections import Counter

import pytest

from finetune_operator.api import constants as c
from finetune_operator.controller.cache import Snapshot
from finetune_operator.controller.expectations import Expectations
from finetune_operator.controller.kube import Kube
from finetune_operator.controller.reconcile import reconcile
from finetune_operator.controller.settings import Settings
from tests.builders import make_job
from tests.cluster.test_operator import status, wait_for, wait_phase
from tests.support import audit
from tests.support.operator_process import OperatorProcess
from tests.support.polling import wait_until

FAIL_ATTEMPTS, FAIL_EXIT_CODE = "test.finetunejob.dev/fail-attempts", "test.finetunejob.dev/fail-exit-code"


@pytest.fixture
def operator(control_plane, tmp_path):
    op = OperatorProcess(control_plane.kubeconfig, tmp_path / "operator.log", restart_backoff=1).start()
    yield op
    op.stop()


def submit(kubectl, ns, name, fail_attempts="", exit_code=137, backoff_limit=3):
    """A 2-node CPU gang; node 0 of each attempt in `fail_attempts` ("1,2") exits with `exit_code` once Running
    (tests/support/kwok/pod-fail-on-request.yaml)."""
    annotations = {FAIL_ATTEMPTS: fail_attempts, FAIL_EXIT_CODE: str(exit_code)} if fail_attempts else {}
    doc = make_job({"metadata.name": name, "metadata.namespace": ns, "spec.distributed.numNodes": 2,
                    "spec.distributed.gpusPerNode": 0, "spec.training.precision": "fp32",
                    "spec.runPolicy.backoffLimit": backoff_limit, "spec.pod.annotations": annotations})
    kubectl.run("apply", "-f", "-", input=json.dumps(doc))


def children(kubectl, ns):
    """Live (not terminating) Jobs, ConfigMaps and Services carrying our job label, in one read."""
    items = kubectl.json("get", "jobs,configmaps,services", "-n", ns, "-l", c.LABEL_JOB)["items"]
    return [o for o in items if not o["metadata"].get("deletionTimestamp")]


def kept_failed_attempt(job: dict) -> bool:
    """The last failed attempt's Job stays for diagnosis (its pods' logs), with no pod running."""
    conditions = {cd["type"] for cd in job.get("status", {}).get("conditions") or [] if cd["status"] == "True"}
    return bool(conditions & {"Failed", "FailureTarget"}) and not job.get("status", {}).get("active")


def assert_exact_children(kubectl, ns, expected_attempt):
    """Every job has exactly its current attempt's Job (and at most the failed one before it, kept for its logs,
    with no pod running), one ConfigMap, one Service, all owned by the FineTuneJob that exists now; no object
    belongs to a job that is gone."""
    uids = {o["metadata"]["name"]: o["metadata"]["uid"] for o in kubectl.json("get", "ftj", "-n", ns)["items"]}
    assert set(uids) == set(expected_attempt)
    found = children(kubectl, ns)
    kinds = Counter((o["kind"], o["metadata"]["labels"][c.LABEL_JOB]) for o in found)
    for name, attempt in expected_attempt.items():
        assert kinds[("ConfigMap", name)] == 1 and kinds[("Service", name)] == 1, name
        jobs = {o["metadata"]["name"]: o for o in found if o["kind"] == "Job"
                and o["metadata"]["labels"][c.LABEL_JOB] == name}
        kept = jobs.pop(f"{name}-a{attempt - 1}", None)
        assert list(jobs) == [f"{name}-a{attempt}"], (name, list(jobs))
        assert kept is None or kept_failed_attempt(kept), (name, kept)
    for obj in found:
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["uid"] == uids.get(owner["name"]), f"orphan {obj['kind']}/{obj['metadata']['name']}"


def test_sigkill_at_twenty_random_moments_converges_exactly(kubectl, namespace, operator):
    rng = random.Random(20261122)
    names = [f"chaos-{i:02d}" for i in range(24)]
    flaky, doomed = set(names[:8]), set(names[10:16])  # flaky: attempt 1 dies once; doomed: deleted mid-burst
    kills: list[float] = []
    done = threading.Event()

    def chaos() -> None:
        while not done.is_set() and len(kills) < 22:
            time.sleep(rng.uniform(0.3, 1.5))
            operator.kill()
            kills.append(time.monotonic())
            operator.start()

    thread = threading.Thread(target=chaos)
    thread.start()
    try:
        for i, name in enumerate(names):
            submit(kubectl, namespace, name, fail_attempts="1" if name in flaky else "")
            if i == 18:
                for gone in sorted(doomed):
                    kubectl.run("delete", "ftj", gone, "-n", namespace, "--wait=false")
        thread.join(timeout=120)
    finally:
        done.set()
        thread.join()
    assert len(kills) >= 20
    expected = {n: 2 if n in flaky else 1 for n in names if n not in doomed}
    for name, attempt in expected.items():
        try:
            st = wait_phase(kubectl, namespace, name, "Running", operator, timeout=240, attempt=attempt, nodes="2/2")
        except AssertionError:
            print(kubectl.run("get", "ftj,jobs,pods", "-n", namespace, "-o", "wide").stdout)
            print(json.dumps(status(kubectl, namespace, name), indent=1))
            raise
        assert st["restarts"] == attempt - 1, (name, st)
    wait_for(lambda: not any(o["metadata"]["labels"][c.LABEL_JOB] in doomed for o in children(kubectl, namespace)),
             timeout=90, what="children of deleted jobs collected", op=operator)
    wait_for(lambda: all(kept_failed_attempt(o) for o in children(kubectl, namespace)
                         if o["kind"] == "Job" and o["metadata"]["name"].endswith("-a1")
                         and o["metadata"]["labels"][c.LABEL_JOB] in flaky),
             timeout=90, what="failed first attempts stopped (kept for their logs)", op=operator)
    assert_exact_children(kubectl, namespace, expected)
    print(f"\nSIGKILLed the operator {len(kills)} times; {len(expected)} jobs converged, {len(flaky)} after a "
          f"gang restart, {len(doomed)} deleted without orphans")


def test_apiserver_restart_mid_burst(kubectl, control_plane, namespace, operator):
    names = [f"across-{i:02d}" for i in range(12)]
    for name in names[:6]:
        submit(kubectl, namespace, name)
    started = time.monotonic()
    control_plane.restart_apiserver()
    print(f"\nkube-apiserver restarted in {time.monotonic() - started:.1f}s")
    for name in names[6:]:
        submit(kubectl, namespace, name)
    for name in names:
        wait_phase(kubectl, namespace, name, "Running", operator, timeout=180, attempt=1, nodes="2/2")
    assert operator.proc.poll() is None  # reconnected, did not die
    assert_exact_children(kubectl, namespace, dict.fromkeys(names, 1))


def test_operator_frozen_past_its_watches_catches_up(kubectl, namespace, operator):
    """SIGSTOP for longer than the apiserver keeps a blocked watcher: its streams are closed (a watch that falls
    too far behind gets 410 Gone); on SIGCONT kopf lists again and every job converges."""
    names = [f"frozen-{i:02d}" for i in range(10)]
    submit(kubectl, namespace, names[0])
    wait_phase(kubectl, namespace, names[0], "Running", operator, timeout=60)
    os.kill(operator.proc.pid, signal.SIGSTOP)
    try:
        for name in names[1:]:
            submit(kubectl, namespace, name, fail_attempts="1")
        kubectl.run("delete", "ftj", names[0], "-n", namespace, "--wait=false")
        time.sleep(20)
    finally:
        os.kill(operator.proc.pid, signal.SIGCONT)
    for name in names[1:]:
        st = wait_phase(kubectl, namespace, name, "Running", operator, timeout=240, attempt=2, nodes="2/2")
        assert st["restarts"] == 1
    wait_for(lambda: all(kept_failed_attempt(o) for o in children(kubectl, namespace)
                         if o["kind"] == "Job" and o["metadata"]["name"].endswith("-a1")),
             timeout=90, what="first attempts stopped (kept for their logs)")
    assert_exact_children(kubectl, namespace, dict.fromkeys(names[1:], 2))


def test_pod_failures_from_a_kwok_stage_give_exact_counts(kubectl, namespace, operator):
    submit(kubectl, namespace, "twice", fail_attempts="1,2", backoff_limit=3)
    submit(kubectl, namespace, "always", fail_attempts="1,2,3", backoff_limit=2)
    submit(kubectl, namespace, "bad-data", fail_attempts="1", exit_code=65)
    st = wait_phase(kubectl, namespace, "bad-data", "Failed", operator, timeout=120)
    assert (st["reason"], st["restarts"], st["attempt"]) == ("DataError", 0, 1)
    st = wait_phase(kubectl, namespace, "twice", "Running", operator, timeout=300, attempt=3, nodes="2/2")
    assert st["restarts"] == 2
    st = wait_phase(kubectl, namespace, "always", "Failed", operator, timeout=300)
    assert (st["reason"], st["restarts"], st["attempt"]) == ("BackoffLimitExceeded", 2, 3)
    assert "backoffLimit 2 reached" in st["message"]
    # Stays exact: nothing restarts a finished job, nothing counts twice.
    time.sleep(3)
    assert status(kubectl, namespace, "always")["restarts"] == 2
    assert status(kubectl, namespace, "twice")["restarts"] == 2


def test_stale_cache_gets_409_and_replans_without_lost_updates(kubectl, control_plane, namespace):
    """No operator process: one pass from a stale snapshot, against the real apiserver, under the audited user."""
    kube = Kube.from_kubeconfig(str(control_plane.audited_kubeconfig))
    kubectl.run("apply", "-f", "-", input=json.dumps(make_job({"metadata.name": "racy",
                                                                "metadata.namespace": namespace})))
    stale = kube.get_finetunejob(namespace, "racy")
    # The trainer reports progress after the snapshot was taken.
    kubectl.run("patch", "ftj", "racy", "-n", namespace, "--subresource=status", "--type=merge", "-p",
                json.dumps({"status": {"progress": {"step": 7}}}))
    since = time.time()
    done = reconcile(kube, Snapshot(namespace, "racy", stale), Settings(trainer_image="trainer:test"), lambda *a: None,
                     Expectations())
    assert done.plan.create_attempt == 1
    st = status(kubectl, namespace, "racy")
    assert st["attempt"] == 1 and st["progress"] == {"step": 7}  # ours written, the trainer's kept
    # The audit log is written asynchronously: read until both requests are there, then count exactly.
    expected = {("patch", "finetunejobs/status"): 2, ("get", "finetunejobs"): 1}  # the 409, then the re-read

    def all_there() -> Counter | None:
        asked = audit.requests(control_plane.audit_log, start=since, namespace=namespace)
        return asked if all(asked[k] >= n for k, n in expected.items()) else None

    asked = wait_until("the audit log holds the pass's requests", all_there, timeout=60)
    assert {k: asked[k] for k in expected} == expected, asked

    # A pass that saw attempt 1 fail, from a cache that has not seen the restart already written: no second one.
    running = kube.get_finetunejob(namespace, "racy")
    kubectl.run("patch", "ftj", "racy", "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(
        {"status": {"attempt": 2, "restarts": 1, "phase": "Restarting", "reason": "OOMKilled"}}))
    job_uid = kubectl.json("get", "job", "racy-a1", "-n", namespace)["metadata"]["uid"]
    failed = {"metadata": {"name": "racy-a1", "uid": job_uid, "labels": {c.LABEL_ATTEMPT: "1"},
                           "owner": running["metadata"]["uid"]},
              "spec": {},
              "status": {"conditions": [{"type": "FailureTarget", "status": "True"}]}}
    done = reconcile(kube, Snapshot(namespace, "racy", running, workloads=[failed]),
                     Settings(restart_backoff_seconds=0, trainer_image="trainer:test"), lambda *a: None,
                     Expectations())
    st = status(kubectl, namespace, "racy")
    assert (st["attempt"], st["restarts"]) == (2, 1)
    # The re-plan saw the real attempt-1 pod (read because a restart is under way): keep that failed attempt (its
    # pods' logs) and wait for its pods to stop.
    assert done.plan.delete_workloads == [] and done.plan.create_attempt is None
    assert "waiting for 1 pod(s) of the previous attempt to stop" in st["message"]
