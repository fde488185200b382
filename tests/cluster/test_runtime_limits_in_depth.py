"""The operator holds a job to its runtime by itself, with no admission policy installed (a chart with
runtimes.limitsAtAdmission: false, or objects written by a cluster admin): every pass judges a started job against the
limits it recorded, so an edit that breaks them fails the job before any attempt is created from it, and says why
(status and a Warning Event); a ClusterFineTuneRuntime's namespaceSelector and a runtime's own consistency are
checked again when a job starts."""

import json

import pytest

from finetune_operator.api import constants as c
from tests.cluster.test_runtimes import EVIL, SMALL, attempt_image, lean_job, runtime, runtimes
from tests.support.events import wait_events
from tests.support.job_status import wait_status

pytestmark = pytest.mark.cluster


def test_an_edit_past_the_recorded_limits_fails_the_job_before_an_attempt_is_made_from_it(kubectl, operator,
                                                                                         namespace):
    ns = namespace
    with runtimes(kubectl, SMALL):
        kubectl.run("apply", "-f", "-", input=json.dumps(lean_job("small", ns, runtimeRef={"name": "gpu-small"})))
        st = wait_status(kubectl, ns, "small", lambda s: s.get("phase") == "Running", operator, timeout=90)
        # Recorded as written, with the one limit that holds when unset said.
        assert st["runtime"]["layers"][0]["limits"] == {"allowTrustRemoteCode": False, **SMALL["spec"]["limits"]}
        assert attempt_image(kubectl, ns, "small") == ("registry.local/trainer:small", 1)
        # The CRD's own rule holds for everyone: the runtime a job is judged by cannot be taken away.
        removed = kubectl.run("patch", "ftj", "small", "-n", ns, "--type=json", "-p",
                              '[{"op": "remove", "path": "/spec/runtimeRef"}]', check=False)
        assert removed.returncode != 0 and "spec.runtimeRef is immutable" in removed.stderr
        edit = [{"op": "add", "path": "/spec/distributed", "value": {"numNodes": 3, "gpusPerNode": 8}},
                {"op": "add", "path": "/spec/pod", "value": {"image": EVIL}},
                {"op": "add", "path": "/spec/suspend", "value": True}]
        kubectl.run("patch", "ftj", "small", "-n", ns, "--type=json", "-p", json.dumps(edit))
        kubectl.run("patch", "ftj", "small", "-n", ns, "--type=merge", "-p", '{"spec": {"suspend": false}}')
        failed = wait_status(kubectl, ns, "small", lambda s: s.get("phase") == "Failed", operator, timeout=60)
    assert failed["reason"] == "InvalidSpec", failed
    for said in ("spec.distributed: ClusterFineTuneRuntime gpu-small allows limits.maxGpusPerJob = 4",
                 "spec.pod.image: the trainer image is locked by ClusterFineTuneRuntime gpu-small"):
        assert said in failed["message"], failed["message"]
    (event,) = wait_events(kubectl, ns, name="small", reason="InvalidSpec", op=operator)
    assert event["type"] == "Warning" and "limits.maxGpusPerJob = 4" in event["message"]
    # No attempt was ever made from the edit: every Job of the job is attempt 1's (1 node, the runtime's image).
    jobs = kubectl.json("get", "jobs", "-n", ns, "-l", f"{c.LABEL_JOB}=small")["items"]
    assert [j["metadata"]["name"] for j in jobs] in ([], ["small-a1"]), [j["metadata"]["name"] for j in jobs]
    for job in jobs:
        assert job["spec"]["parallelism"] == 1
        assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/trainer:small"


def test_a_namespace_outside_a_runtimes_selector_waits_until_an_admin_labels_it(kubectl, operator, namespace):
    ns = namespace
    gated = runtime("research-only", template={"distributed": {"gpusPerNode": 0}, "resources": {"cpu": "1"}},
                    limits={"maxNodes": 2})
    gated["spec"]["namespaceSelector"] = {"matchExpressions": [{"key": "team", "operator": "In",
                                                                "values": ["research"]}]}
    with runtimes(kubectl, gated):
        kubectl.run("apply", "-f", "-", input=json.dumps(lean_job("gated", ns, runtimeRef={"name": "research-only"})))
        st = wait_status(kubectl, ns, "gated", lambda s: s.get("reason") == "RuntimeNotAllowed", operator)
        assert st["phase"] == "Pending" and (f"ClusterFineTuneRuntime research-only may not be used in namespace {ns}"
                                             in st["message"]) and "team in (research)" in st["message"], st
        (event,) = wait_events(kubectl, ns, name="gated", reason="RuntimeNotAllowed", op=operator)
        assert event["type"] == "Warning"
        assert kubectl.run("get", "job", "gated-a1", "-n", ns, check=False).returncode != 0
        kubectl.run("label", "namespace", ns, "team=research")
        # The operator looks again every 30 s, and at once on any change of the job: touched, not to wait here.
        kubectl.run("annotate", "ftj", "gated", "-n", ns, "example.com/touched=1")
        st = wait_status(kubectl, ns, "gated", lambda s: s.get("phase") == "Running", operator, timeout=90)
        assert st["runtime"]["name"] == "research-only"


def test_a_runtime_whose_template_breaks_its_own_limits_runs_no_job(kubectl, operator, namespace):
    ns = namespace
    broken = runtime("broken", template={"distributed": {"numNodes": 4, "gpusPerNode": 8}},
                     limits={"maxGpusPerJob": 8})
    with runtimes(kubectl, broken):
        kubectl.run("apply", "-f", "-", input=json.dumps(lean_job("victim", ns, runtimeRef={"name": "broken"})))
        st = wait_status(kubectl, ns, "victim", lambda s: s.get("reason") == "RuntimeNotFound", operator)
    assert "ClusterFineTuneRuntime broken is invalid: spec.template.distributed: breaks its own " \
           "limits.maxGpusPerJob = 8" in st["message"], st
    assert kubectl.run("get", "job", "victim-a1", "-n", ns, check=False).returncode != 0
