"""What the operator takes for its own: an attempt's pods are those the attempt's Job controls, not whatever
carries the job's labels; and every kind of object the operator owns is one the chart's children policy guards,
so nobody but the operator can make one look owned by a FineTuneJob."""

import itertools
import re

import pytest
import yaml

from finetune_operator.api import constants as c
from finetune_operator.api.validation import validate_job
from finetune_operator.controller.observed import attempt_pods
from finetune_operator.render import RenderContext, render_all
from finetune_operator.render.preflight import render_preflight
from tests.builders import make_job
from tests.conftest import ROOT

JOB_UID = "uid-of-test-job-a2"


def pod(attempt: int | None, owner: dict | None) -> dict:
    labels = {c.LABEL_JOB: "test-job", **({c.LABEL_ATTEMPT: str(attempt)} if attempt is not None else {})}
    meta = {"name": f"test-job-a{attempt}-0-x", "labels": labels, **({"ownerReferences": [owner]} if owner else {})}
    return {"metadata": meta, "status": {"phase": "Running"}}


def ref(name="test-job-a2", uid=JOB_UID, kind="Job", api="batch/v1", controller=True) -> dict:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": controller}


WORKLOADS = [{"metadata": {"name": "test-job-a2", "uid": JOB_UID}}]

# Each way a pod may claim attempt 2 of test-job, and whether it is one of its pods.
CLAIMS = {
    "its own job's pod": (2, ref(), True),
    "labels only": (2, None, False),
    "another job's pod labelled as ours": (2, ref(name="other-a2", uid="uid-other"), False),
    "owned by attempt 1's job, labelled attempt 2": (2, ref(name="test-job-a1", uid="uid-a1"), False),
    "owner named right, another uid (a forged reference)": (2, ref(uid="uid-forged"), False),
    "owner not its controller": (2, ref(controller=False), False),
    "owned by a ReplicaSet of that name": (2, ref(kind="ReplicaSet", api="apps/v1"), False),
    "owned by a Job of another group": (2, ref(api="evil.example/v1"), False),
    "no attempt label": (None, ref(), False),
}


FTJ_UID = "uid-of-test-job"


def nothing_else(job: str):
    raise AssertionError(f"{job} is among the job's own: not read")


@pytest.mark.parametrize("claim", CLAIMS)
def test_only_the_pods_an_attempts_job_controls_are_its_pods(claim):
    attempt, owner, kept = CLAIMS[claim]
    # Jobs other than the job's own attempt 2: one of someone else's (test-job-a1 is another FineTuneJob's).
    others = {"test-job-a1": ("uid-a1", "uid-of-another-finetunejob")}
    found = attempt_pods([pod(attempt, owner)], "test-job", FTJ_UID, WORKLOADS, others.get)
    assert found == ([pod(attempt, owner)] if kept else [])


# The Job a pod names, not among the job's own in the cache, as the API server has it: (Job UID, its FineTuneJob).
ELSEWHERE = {
    "gone (being deleted): its pods still count until they stop": (None, True),
    "ours, not in the cache yet": (("uid-a1", FTJ_UID), True),
    "a tenant's Job of that name": (("uid-a1", None), False),
    "another FineTuneJob's": (("uid-a1", "uid-of-another"), False),
    "ours, but another UID than the pod names": (("uid-a1-new", FTJ_UID), False),
}


@pytest.mark.parametrize("where", ELSEWHERE)
def test_a_pod_of_a_job_not_in_the_cache_counts_only_if_that_job_is_gone_or_ours(where):
    found, kept = ELSEWHERE[where]
    lingering = pod(1, ref(name="test-job-a1", uid="uid-a1"))
    asked = []
    result = attempt_pods([lingering, lingering], "test-job", FTJ_UID, WORKLOADS,
                          lambda job: asked.append(job) or found)
    assert result == ([lingering, lingering] if kept else []) and asked == ["test-job-a1"]  # read once
    assert attempt_pods([pod(2, ref())], "test-job", FTJ_UID, WORKLOADS, nothing_else) == [pod(2, ref())]


def _policy_resources() -> set[str]:
    text = (ROOT / "charts" / "finetunejob" / "templates" / "admission-policy-children.yaml").read_text()
    text = re.sub(r"\{\{-? /\*.*?\*/ -?\}\}", "", text, flags=re.S)  # the template's comment
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("{{"))
    policy = next(d for d in yaml.safe_load_all(body.replace("{{ $operator }}", "op").replace(
        "{{ .Release.Name }}", "r")) if d and d["kind"] == "ValidatingAdmissionPolicy")
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert all(set(r["operations"]) == {"CREATE", "UPDATE"} for r in rules)
    return {f"{r}.{g}" if g else r for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}


PLURALS = {"ConfigMap": "configmaps", "Service": "services", "Job": "jobs.batch",
           "NetworkPolicy": "networkpolicies.networking.k8s.io"}


@pytest.mark.parametrize(("network_policy", "preflight"), list(itertools.product([False, True], repeat=2)))
def test_every_kind_the_operator_owns_is_guarded_by_the_children_policy(network_policy, preflight):
    spec = validate_job(make_job({"spec.runPolicy.preflight": preflight})).spec
    ctx = RenderContext(name="test-job", namespace="ml", network_policy=network_policy)
    kinds = {o["kind"] for o in render_all(spec, ctx)} | (
        {o["kind"] for o in render_preflight(spec, ctx)} if preflight else set())
    guarded = _policy_resources()
    assert {PLURALS[k] for k in kinds} <= guarded, kinds
    # The pods the Job controller makes from them, and the Kueue Workload the operator holds between attempts.
    assert {"pods", "workloads.kueue.x-k8s.io"} <= guarded


@pytest.mark.parametrize(("api", "kind", "ours"), [
    (c.API_VERSION, c.KIND, True), (f"{c.GROUP}/v1", c.KIND, True), ("evil.example/v1", c.KIND, False),
    (c.API_VERSION, "Job", False), (f"{c.GROUP}x/v1alpha1", c.KIND, False)])
def test_a_finetunejob_controls_what_its_group_and_kind_name_with_its_uid(api, kind, ours):
    from finetune_operator.controller.kube import owner_conflict
    from finetune_operator.controller.observed import finetunejob_controller

    child = {"kind": "ConfigMap", "metadata": {"name": "victim-config", "ownerReferences": [
        {"apiVersion": api, "kind": kind, "name": "victim", "uid": "u-1", "controller": True}]}}
    owner = {"metadata": {"name": "victim", "uid": "u-1"}}
    assert (finetunejob_controller(child) == "u-1") is ours
    assert (owner_conflict(child, child, owner) is None) is ours


FTJ_UID = "uid-of-test-job"
WORKLOAD_OWNERS = {  # an ownerReference of a Kueue Workload -> (the Job it is Kueue's Workload of, held by us)
    "the attempt's Job": (ref(), ("test-job-a2", JOB_UID), False),
    "a Job of another group": (ref(api="jobset.x-k8s.io/v1alpha2"), (None, None), False),
    "the Job, not as controller": (ref(controller=False), (None, None), False),
    "the Job, another UID": (ref(uid="uid-of-someone-elses"), ("test-job-a2", "uid-of-someone-elses"), False),
    "held by this FineTuneJob": (ref("test-job", FTJ_UID, c.KIND, c.API_VERSION), (None, None), True),
    "held by one of the same name before": (ref("test-job", "uid-of-a-deleted-one", c.KIND, c.API_VERSION),
                                            (None, None), False),
    "the kind under another group": (ref("test-job", FTJ_UID, c.KIND, "evil.example/v1"), (None, None), False),
    "held, not as controller": (ref("test-job", FTJ_UID, c.KIND, c.API_VERSION, controller=False), (None, None),
                                False),
}


@pytest.mark.parametrize("owner", WORKLOAD_OWNERS)
def test_a_kueue_workload_is_an_attempts_or_held_only_by_group_kind_and_uid(owner):
    """Kueue's Workload of an attempt is the one that attempt's Job (by UID) controls; one held between attempts is
    this FineTuneJob's only under its UID (not a deleted job's of the same name, nor the kind of another group)."""
    from finetune_operator.controller import queueing
    from finetune_operator.controller.cache import slim_workload_kueue

    reference, (job, job_uid), held = WORKLOAD_OWNERS[owner]
    slim = slim_workload_kueue({"metadata": {"name": "wl", "ownerReferences": [reference]},
                                "spec": {"active": True}, "status": {}})
    assert (slim["job"], slim["jobUid"]) == (job, job_uid)
    attempt_job = {"metadata": {"name": "test-job-a2", "uid": JOB_UID}}
    assert (queueing.kueue_workload([slim], attempt_job) is slim) is (owner == "the attempt's Job")
    assert (queueing.held([slim], "test-job", FTJ_UID) is slim) is held
