"""The operator on a real control plane: what `kubectl get finetunejobs` shows through every phase.

Pods are scheduled by the real scheduler onto kwok GPU nodes; their outcomes are driven by patching pod status
the way a kubelet reports them (exit codes, OOMKilled)."""

import json
import time
import urllib.request

from finetune_operator.api import constants as c
from tests.builders import make_job
from tests.support.events import wait_events
from tests.support.pod_status import terminated


def wait_for(predicate, timeout=45.0, what="condition", op=None):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.3)
    raise AssertionError(f"{what} not reached in {timeout}s (last: {last})\n{op.log_tail() if op else ''}")


def status(kubectl, ns, name):
    obj = kubectl.json_or_none("get", "ftj", name, "-n", ns)
    return obj.get("status", {}) if obj is not None else None


def wait_phase(kubectl, ns, name, phase, op, timeout=45.0, **fields):
    def reached():
        st = status(kubectl, ns, name) or {}
        return st if st.get("phase") == phase and all(st.get(k) == v for k, v in fields.items()) else None
    return wait_for(reached, timeout, f"{name} phase {phase} {fields}", op)


def attempt_pods(kubectl, ns, name, attempt):
    items = kubectl.json("get", "pods", "-n", ns, "-l", f"{c.LABEL_JOB}={name},{c.LABEL_ATTEMPT}={attempt}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def terminate(kubectl, ns, pod, code, reason="Error", message=""):
    """What a kubelet reports when the trainer container exits."""
    kubectl.run("patch", "pod", pod, "-n", ns, "--subresource=status", "--type=merge", "-p",
                json.dumps(terminated(code, reason, message)))


def submit(kubectl, ns, name, **overrides):
    """A 2-node gang; CPU-only unless a test asks for GPUs, so tests never wait on each other's GPUs."""
    doc = make_job({"metadata.name": name, "metadata.namespace": ns, "spec.distributed.numNodes": 2,
                    "spec.distributed.gpusPerNode": 0, "spec.training.precision": "fp32", **overrides})
    kubectl.run("apply", "-f", "-", input=json.dumps(doc))


def running(kubectl, ns, name, op, attempt=1):
    wait_phase(kubectl, ns, name, "Running", op, attempt=attempt, nodes="2/2")
    return attempt_pods(kubectl, ns, name, attempt)


def test_pending_running_succeeded_with_children_owned(kubectl, operator, namespace):
    submit(kubectl, namespace, "happy", **{"spec.distributed.gpusPerNode": 4, "spec.training.precision": "bf16"})
    pods = running(kubectl, namespace, "happy", operator)
    ftj = kubectl.json("get", "ftj", "happy", "-n", namespace)
    for kind in ("job", "configmap", "service"):
        items = kubectl.json("get", kind, "-n", namespace, "-l", f"{c.LABEL_JOB}=happy")["items"]
        assert len(items) == 1, kind
        (ref,) = items[0]["metadata"]["ownerReferences"]
        assert ref["uid"] == ftj["metadata"]["uid"] and ref["controller"] is True
    # The namespace's trainer identity: shared by its jobs, so owned by none of them.
    for kind in ("serviceaccount", "role", "rolebinding"):
        identity = kubectl.json("get", kind, "finetunejob-trainer", "-n", namespace)
        assert "ownerReferences" not in identity["metadata"], kind
    assert pods[0]["spec"]["serviceAccountName"] == "finetunejob-trainer"
    row = kubectl.run("get", "finetunejobs", "happy", "-n", namespace, "--no-headers").stdout.split()
    assert row[1:4] == ["Running", "2/2", "8"]
    for pod in pods:
        terminate(kubectl, namespace, pod["metadata"]["name"], 0, reason="Completed")
    st = wait_phase(kubectl, namespace, "happy", "Succeeded", operator)
    assert st["completionTime"] and st["restarts"] == 0
    for reason in ("Created", "Running", "Succeeded"):
        wait_events(kubectl, namespace, name="happy", kind="FineTuneJob", reason=reason, op=operator)


def test_gang_restart_resumes_attempt_two_from_the_checkpoint(kubectl, operator, namespace):
    submit(kubectl, namespace, "flaky", **{"spec.runPolicy.backoffLimit": 2})
    pods = running(kubectl, namespace, "flaky", operator)
    # Rank 0 of the trainer reports its newest complete checkpoint.
    kubectl.run("patch", "ftj", "flaky", "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(
        {"status": {"checkpoint": {"step": 40, "path": "/output/checkpoint-40"}}}))
    terminate(kubectl, namespace, pods[0]["metadata"]["name"], 137, reason="OOMKilled")
    st = wait_for(lambda: (s := status(kubectl, namespace, "flaky")) and s.get("attempt") == 2 and s,
                  what="attempt 2", op=operator)
    assert st["restarts"] == 1 and st["reason"] == "OOMKilled"
    running(kubectl, namespace, "flaky", operator, attempt=2)
    config = json.loads(kubectl.json("get", "configmap", "flaky-config", "-n", namespace)["data"]["trainer.json"])
    assert config["resumeFrom"] == "/output/checkpoint-40"
    jobs = [j["metadata"]["name"] for j in kubectl.json("get", "jobs", "-n", namespace)["items"]]
    assert "flaky-a2" in jobs
    # Attempt 1 stays, stopped, for diagnosis: its failed pod keeps its exit code (and, on a node, its log).
    wait_for(lambda: not kubectl.json("get", "job", "flaky-a1", "-n", namespace)["status"].get("active"),
             what="a1 stopped", op=operator)
    kept = kubectl.json("get", "pods", "-n", namespace, "-l", f"{c.LABEL_ATTEMPT}=1,{c.LABEL_JOB}=flaky")["items"]
    assert any((cs.get("state", {}).get("terminated") or {}).get("exitCode") == 137
               for p in kept for cs in p["status"].get("containerStatuses", [])), kept
    assert status(kubectl, namespace, "flaky")["checkpoint"]["step"] == 40  # the trainer's field survived


def test_permanent_exit_code_fails_without_restart(kubectl, operator, namespace):
    submit(kubectl, namespace, "baddata")
    pods = running(kubectl, namespace, "baddata", operator)
    message = json.dumps({"reason": "DataError", "message": "row has no 'instruction' column"})
    terminate(kubectl, namespace, pods[1]["metadata"]["name"], 65, message=message)
    st = wait_phase(kubectl, namespace, "baddata", "Failed", operator, reason="DataError")
    assert "no 'instruction' column" in st["message"] and st["attempt"] == 1


def test_backoff_limit_exceeded(kubectl, operator, namespace):
    submit(kubectl, namespace, "doomed", **{"spec.runPolicy.backoffLimit": 1})
    for attempt in (1, 2):
        pods = running(kubectl, namespace, "doomed", operator, attempt=attempt)
        terminate(kubectl, namespace, pods[0]["metadata"]["name"], 1)
    st = wait_phase(kubectl, namespace, "doomed", "Failed", operator, reason="BackoffLimitExceeded")
    assert st["restarts"] == 1 and "backoffLimit 1 reached" in st["message"]


def test_invalid_spec_is_failed_with_an_event_listing_the_errors(kubectl, operator, namespace):
    # Passes the CRD schema, fails the operator's rules (qlora needs 4bit; evaluation without data).
    submit(kubectl, namespace, "broken", **{"spec.method.type": "qlora", "spec.training.evalStrategy": "epoch"})
    st = wait_phase(kubectl, namespace, "broken", "Failed", operator, reason="InvalidSpec")
    assert "spec.method.type" in st["message"] and "spec.training.evalStrategy" in st["message"]
    (event,) = wait_events(kubectl, namespace, reason="InvalidSpec", op=operator)
    assert event["type"] == "Warning" and "spec.method.type" in event["message"]
    assert kubectl.json("get", "jobs", "-n", namespace)["items"] == []


def test_suspend_stops_pods_and_resume_continues_the_same_attempt(kubectl, operator, namespace):
    submit(kubectl, namespace, "pausable")
    running(kubectl, namespace, "pausable", operator)
    kubectl.run("patch", "ftj", "pausable", "-n", namespace, "--type=merge", "-p",
                '{"spec": {"suspend": true}}')
    wait_phase(kubectl, namespace, "pausable", "Suspended", operator)
    # The status is written first (reconcile.py), the attempt's Job suspended right after it in the same pass.
    wait_for(lambda: kubectl.json("get", "job", "pausable-a1", "-n", namespace)["spec"]["suspend"] is True,
             what="the Job suspended", op=operator)
    wait_for(lambda: attempt_pods(kubectl, namespace, "pausable", 1) == [], what="pods gone", op=operator)
    kubectl.run("patch", "ftj", "pausable", "-n", namespace, "--type=merge", "-p",
                '{"spec": {"suspend": false}}')
    st = wait_phase(kubectl, namespace, "pausable", "Running", operator, attempt=1)
    assert st["restarts"] == 0


def test_an_edit_is_announced_and_applied_by_a_suspend_and_resume_in_a_new_attempt(kubectl, operator, namespace):
    """Day two: the learning rate changed under a running attempt. It keeps its spec (an Event says how to apply
    the edit); a suspend and resume starts attempt 2 with it, from the newest checkpoint, and nothing counts as a
    restart."""
    submit(kubectl, namespace, "tuned")
    running(kubectl, namespace, "tuned", operator)
    kubectl.run("patch", "ftj", "tuned", "-n", namespace, "--type=merge", "-p",
                json.dumps({"spec": {"training": {"learningRate": 5e-5}}}))
    said = wait_events(kubectl, namespace, reason="SpecEdited", op=operator)
    assert "suspend and resume" in said[0]["message"], said
    assert status(kubectl, namespace, "tuned")["attempt"] == 1
    for suspend in (True, False):
        kubectl.run("patch", "ftj", "tuned", "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"suspend": suspend}}))
        if suspend:
            wait_phase(kubectl, namespace, "tuned", "Suspended", operator)
    st = wait_phase(kubectl, namespace, "tuned", "Running", operator, attempt=2)
    assert st["restarts"] == 0, st
    config = json.loads(kubectl.json("get", "configmap", "tuned-config", "-n", namespace)["data"]["trainer.json"])
    assert config["trainingArguments"]["learning_rate"] == 5e-5, config["trainingArguments"]
    assert wait_events(kubectl, namespace, reason="SpecChanged", op=operator)


def test_kueue_labelled_job_waits_for_admission(kubectl, operator, namespace):
    submit(kubectl, namespace, "queued", **{"metadata.labels": {c.LABEL_KUEUE_QUEUE: "gpu-queue"}})
    wait_phase(kubectl, namespace, "queued", "Queued", operator)
    job = kubectl.json("get", "job", "queued-a1", "-n", namespace)
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"][c.LABEL_KUEUE_QUEUE] == "gpu-queue"
    time.sleep(2)
    assert kubectl.json("get", "job", "queued-a1", "-n", namespace)["spec"]["suspend"] is True  # not unsuspended
    kubectl.run("patch", "job", "queued-a1", "-n", namespace, "--type=merge", "-p", '{"spec": {"suspend": false}}')
    running(kubectl, namespace, "queued", operator)  # Kueue's admission is respected, not fought


def test_deleting_the_finetunejob_removes_every_child(kubectl, operator, namespace):
    submit(kubectl, namespace, "doomed-by-gc")
    running(kubectl, namespace, "doomed-by-gc", operator)
    kubectl.run("delete", "ftj", "doomed-by-gc", "-n", namespace, "--wait=false")

    def all_gone():
        selector = f"{c.LABEL_JOB}=doomed-by-gc"
        return all(not kubectl.json("get", kind, "-n", namespace, "-l", selector)["items"]
                   for kind in ("job", "configmap", "service", "pods"))
    wait_for(all_gone, timeout=60, what="garbage collection of every child", op=operator)


def test_a_namespace_deleted_and_created_again_gets_its_trainer_identity_back(kubectl, operator, namespace):
    # A short grace period: the namespace controller checks again for the pods it deleted only after their grace
    # period (the default gives the trainer minutes to save a checkpoint), which is not what this test is about.
    submit(kubectl, namespace, "first-life", **{"spec.pod.terminationGracePeriodSeconds": 2})
    running(kubectl, namespace, "first-life", operator)
    kubectl.run("delete", "namespace", namespace, "--wait=true", "--timeout=240s", timeout=260)  # slow on 2 busy cores
    kubectl.run("create", "namespace", namespace)
    # Within the identity's re-apply interval (5 min): without forgetting it, the pods would be refused for a
    # missing ServiceAccount and the job would stay Pending.
    submit(kubectl, namespace, "second-life")
    running(kubectl, namespace, "second-life", operator)
    assert kubectl.json("get", "serviceaccount", "finetunejob-trainer", "-n", namespace)


def test_preflight_passes_then_the_gang_starts(kubectl, operator, namespace):
    submit(kubectl, namespace, "checked", **{"spec.runPolicy.preflight": True, "spec.distributed.gpusPerNode": 4,
                                             "spec.training.precision": "bf16"})
    wait_phase(kubectl, namespace, "checked", "Pending", operator, reason="Preflight", preflight="Running")
    (check,) = wait_for(lambda: attempt_pods(kubectl, namespace, "checked", 0), what="preflight pod", op=operator)
    assert "nvidia.com/gpu" not in json.dumps(check["spec"]["containers"][0]["resources"])
    assert not kubectl.json("get", "jobs", "-n", namespace, "-l", f"{c.LABEL_ATTEMPT}=1")["items"]
    terminate(kubectl, namespace, check["metadata"]["name"], 0, reason="Completed")
    running(kubectl, namespace, "checked", operator)
    assert status(kubectl, namespace, "checked")["preflight"] == "Passed"
    wait_for(lambda: not kubectl.json("get", "jobs", "-n", namespace, "-l", f"{c.LABEL_ATTEMPT}=0")["items"],
             what="preflight Job deleted", op=operator)


def test_failed_preflight_fails_the_job_before_any_gpu_is_requested(kubectl, operator, namespace):
    submit(kubectl, namespace, "unchecked", **{"spec.runPolicy.preflight": True})
    (check,) = wait_for(lambda: attempt_pods(kubectl, namespace, "unchecked", 0), what="preflight pod", op=operator)
    message = json.dumps({"exitCode": 65, "reason": "DataError", "message": "preflight: no data file at /data/x"})
    terminate(kubectl, namespace, check["metadata"]["name"], 65, message=message)
    st = wait_phase(kubectl, namespace, "unchecked", "Failed", operator, reason="DataError", preflight="Failed")
    assert "no GPU was requested" in st["message"] and "/data/x" in st["message"] and st["restarts"] == 0
    assert not kubectl.json("get", "jobs", "-n", namespace, "-l", f"{c.LABEL_ATTEMPT}=1")["items"]


def test_ttl_deletes_the_finished_job(kubectl, operator, namespace):
    submit(kubectl, namespace, "shortlived", **{"spec.runPolicy.ttlSecondsAfterFinished": 2})
    for pod in running(kubectl, namespace, "shortlived", operator):
        terminate(kubectl, namespace, pod["metadata"]["name"], 0, reason="Completed")
    wait_phase(kubectl, namespace, "shortlived", "Succeeded", operator)
    wait_for(lambda: status(kubectl, namespace, "shortlived") is None, timeout=30, what="TTL deletion", op=operator)


def test_operator_killed_mid_burst_converges_without_duplicates(kubectl, control_plane, operator, namespace):
    names = [f"burst-{i}" for i in range(6)]
    for name in names:
        submit(kubectl, namespace, name)
    time.sleep(0.5)
    operator.kill()
    operator.start()
    for name in names:
        wait_phase(kubectl, namespace, name, "Running", operator, timeout=60, attempt=1)
    jobs = [j["metadata"]["name"] for j in kubectl.json("get", "jobs", "-n", namespace)["items"]]
    assert sorted(jobs) == sorted(f"{n}-a1" for n in names)
    for kind in ("configmap", "service"):
        items = kubectl.json("get", kind, "-n", namespace, "-l", f"{c.LABEL_NAME}={c.APP_NAME}")["items"]
        assert len(items) == len(names), kind
    assert len(kubectl.json("get", "serviceaccount", "-n", namespace, "-l", f"{c.LABEL_NAME}={c.APP_NAME}")
               ["items"]) == 1  # the namespace's trainer identity, once


def test_active_deadline_fails_the_job_and_stops_its_pods(kubectl, operator, namespace):
    submit(kubectl, namespace, "slow", **{"spec.runPolicy.activeDeadlineSeconds": 5})
    wait_for(lambda: kubectl.json("get", "jobs", "-n", namespace)["items"], what="attempt 1 created", op=operator)
    st = wait_phase(kubectl, namespace, "slow", "Failed", operator, reason="DeadlineExceeded")
    assert "activeDeadlineSeconds=5" in st["message"]
    wait_for(lambda: not kubectl.json("get", "jobs", "-n", namespace)["items"], what="attempt torn down", op=operator)


def test_metrics_endpoint(kubectl, operator, namespace):
    submit(kubectl, namespace, "measured", **{"spec.runPolicy.backoffLimit": 2})
    pods = running(kubectl, namespace, "measured", operator)
    terminate(kubectl, namespace, pods[0]["metadata"]["name"], 137, reason="OOMKilled")
    running(kubectl, namespace, "measured", operator, attempt=2)
    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
               if line and not line.startswith("#")}
    assert samples.get('finetunejob_jobs{phase="Running"}', 0) >= 1, sorted(samples)
    assert samples["finetunejob_reconcile_duration_seconds_count"] > 0
    assert samples.get('finetunejob_gang_restarts_total{reason="OOMKilled"}', 0) >= 1, sorted(samples)
    # Attempt 1 ran (0 GPUs: a CPU gang, so 0 GPU-hours) and the restart's downtime was counted.
    assert samples["finetunejob_restart_downtime_seconds_total"] >= 1, sorted(samples)
    assert "finetunejob_gpu_hours_total" in samples and "finetunejob_steps_redone_total" in samples
    st = status(kubectl, namespace, "measured")
    assert st["goodput"]["restartDowntimeSeconds"] >= 1 and st["goodput"]["runningSince"]


def test_editing_the_topology_of_a_running_job_keeps_nodes_true_and_says_when_it_applies(kubectl, operator,
                                                                                       namespace):
    submit(kubectl, namespace, "regrow")
    running(kubectl, namespace, "regrow", operator)
    kubectl.run("patch", "ftj", "regrow", "-n", namespace, "--type=merge", "-p",
                json.dumps({"spec": {"distributed": {"numNodes": 3}}}))

    def pending():
        st = status(kubectl, namespace, "regrow") or {}
        cd = next((x for x in st.get("conditions", []) if x["type"] == "TopologyChangePending"), {})
        return st if cd.get("status") == "True" else None

    st = wait_for(pending, what="TopologyChangePending", op=operator)
    assert (st["phase"], st["nodes"]) == ("Running", "2/2")  # the running attempt's, not the edit's 2/3
    cd = next(x for x in st["conditions"] if x["type"] == "TopologyChangePending")
    assert "numNodes is 3, attempt 1 runs on 2 node(s)" in cd["message"]
    row = kubectl.run("get", "ftj", "regrow", "-n", namespace, "--no-headers").stdout.split()
    assert row[1:3] == ["Running", "2/2"]
