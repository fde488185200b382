"""A FineTuneJob's status comes from the operator and from that job's own pods only, and the trainer identity is the
operator's alone: tested on the real apiserver with the chart's admission policies, as every identity that could
reach a job's status (generated: each identity x each thing it could try), with the operator running the jobs (kwok
runs their pods, so the tokens are bound to real pods of the jobs)."""

import json
import time

import pytest

from finetune_operator.api import constants as c
from tests.builders import make_job
from tests.cluster.test_tenancy import as_tenant, bind, chart_objects, delete_all, wait_can
from tests.support.events import events_of, wait_events
from tests.support.job_status import wait_status
from tests.support.status_requests import status_request

pytestmark = pytest.mark.cluster
TRAINER = "finetunejob-trainer"


@pytest.fixture(scope="module")
def policies(control_plane, kubectl):
    """The chart's trainer-status and trainer-identity policies and its user roles, as `helm install` renders them."""
    docs = [d for template in ("admission-policy.yaml", "admission-policy-trainer-identity.yaml", "user-roles.yaml")
            for d in chart_objects(control_plane, kubectl, template)]
    yield docs
    delete_all(kubectl, docs)


def token(kubectl, namespace: str, account: str, pod: dict | None = None) -> str:
    bound = ["--bound-object-kind=Pod", f"--bound-object-name={pod['metadata']['name']}",
             f"--bound-object-uid={pod['metadata']['uid']}"] if pod else []
    return kubectl.run("create", "token", account, "-n", namespace, *bound).stdout.strip()


def running_pod(kubectl, namespace: str, job: str, op) -> dict:
    """Node 0 of the job's attempt 1, once kwok runs it (its name is <job>-a1-0-<suffix>, from the Job controller)."""
    wait_status(kubectl, namespace, job, lambda s: s.get("phase") == "Running", op)
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", f"{c.LABEL_JOB}={job},{c.LABEL_ATTEMPT}=1")["items"]
    return next(p for p in pods if p["metadata"]["name"].startswith(f"{job}-a1-0-"))


# Who may try (the token, and the job it belongs to), what they try, and the answer: (allowed, why when refused).
IDENTITIES = {
    "trainer-of-mine": ("mine", True),  # the trainer identity, token bound to a pod of job mine
    "trainer-not-in-a-pod": ("mine", False),  # the trainer identity, `kubectl create token finetunejob-trainer`
    "ci-bot-of-bot": ("bot", True),  # job bot's own ServiceAccount (spec.pod.serviceAccountName), in bot's pod
    "ci-bot-not-in-a-pod": ("bot", False),  # `kubectl create token ci-bot` (issue 41: it set phase: Succeeded)
}
ATTEMPTS = ("progress-of-its-job", "phase-of-its-job", "progress-of-another-job", "read-another-jobs-spec",
            "read-its-jobs-spec")


def expected(identity: str, attempt: str) -> tuple[bool, str]:
    _, in_pod = IDENTITIES[identity]
    if attempt.startswith("read-"):
        return False, "cannot get resource"  # RBAC: patch only (a get of status returns the spec too)
    if attempt == "progress-of-another-job" and identity.startswith("ci-bot"):
        return False, "cannot patch resource"  # RBAC: a job's own ServiceAccount may patch that job only
    if not in_pod:
        return False, "(token not bound to a pod)"
    if attempt == "phase-of-its-job":
        return False, "may write only the status fields it owns"
    if attempt == "progress-of-another-job":
        return False, "is not the job of pod"
    return True, ""


CASES = [(i, a) for i in IDENTITIES for a in ATTEMPTS]


def test_a_status_is_written_only_from_the_jobs_own_pods_and_read_by_none_of_them(kubectl, control_plane, namespace,
                                                                                  policies, operator):
    kubectl.run("create", "serviceaccount", "ci-bot", "-n", namespace)
    for name, account in (("mine", None), ("other", None), ("bot", "ci-bot")):
        overrides = {"metadata.name": name, "metadata.namespace": namespace, "spec.distributed.gpusPerNode": 0,
                     "spec.training.precision": "fp32"}
        if account:
            overrides["spec.pod.serviceAccountName"] = account
        kubectl.run("apply", "-f", "-", input=json.dumps(make_job(overrides)))
    pods = {job: running_pod(kubectl, namespace, job, operator) for job in ("mine", "bot", "other")}
    tokens = {"trainer-of-mine": token(kubectl, namespace, TRAINER, pods["mine"]),
              "trainer-not-in-a-pod": token(kubectl, namespace, TRAINER),
              "ci-bot-of-bot": token(kubectl, namespace, "ci-bot", pods["bot"]),
              "ci-bot-not-in-a-pod": token(kubectl, namespace, "ci-bot")}
    answers = {}
    for identity, attempt in CASES:
        own, _ = IDENTITIES[identity]
        another = "other" if own == "mine" else "mine"
        job = another if attempt.endswith("another-job") or attempt == "read-another-jobs-spec" else own
        if attempt.startswith("read-"):
            answers[identity, attempt] = status_request(control_plane, tokens[identity], "GET", namespace, job)
        else:
            status = {"phase": "Succeeded"} if attempt.startswith("phase") else {"progress": {"step": 3}}
            answers[identity, attempt] = status_request(control_plane, tokens[identity], "PATCH", namespace, job,
                                                        status)
    wrong = {}
    for case, (code, body) in answers.items():
        allowed, why = expected(*case)
        if (code == 200) != allowed or (not allowed and why.lower() not in body.lower()):
            wrong[case] = (code, body[:300], "expected " + ("allowed" if allowed else f"refused: {why}"))
        if not allowed and code == 200:
            assert '"spec"' not in body
    assert not wrong, json.dumps({f"{i} {a}": w for (i, a), w in wrong.items()}, indent=1)
    # The operator's phase stands: nothing but the operator wrote it.
    assert all(kubectl.json("get", "ftj", job, "-n", namespace)["status"]["phase"] == "Running"
               for job in ("mine", "bot", "other"))


def test_the_trainer_identity_cannot_be_forged_and_a_taken_name_has_a_remedy_that_works(kubectl, namespace,
                                                                                       policies, operator):
    """A tenant (the namespace's `admin`: ServiceAccounts, Roles and RoleBindings are theirs to create) creates
    ServiceAccount finetunejob-trainer labelled as the operator's (so that every job of the namespace would run as
    it, with annotations of their choosing): refused, as is every other way to the same (the Role of that name, the
    label on another object, a label added later). A name taken before the
    policy existed (here: by a cluster admin) is a NameConflict whose remedy works: the job waits, says nothing was
    created, and starts once the ServiceAccount is deleted; a job that runs as a ServiceAccount of its own is not in
    the way of it at all."""
    bind(kubectl, namespace, "eddie", "admin")
    wait_can(kubectl, "eddie", namespace, "create", "roles.rbac.authorization.k8s.io")
    labels = {c.LABEL_MANAGED_BY: c.MANAGED_BY}
    forged = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {
        "name": TRAINER, "namespace": namespace, "labels": labels,
        "annotations": {"iam.gke.io/gcp-service-account": "eddie@example.iam.gserviceaccount.com"}}}
    deadline = time.monotonic() + 30  # the policy is enforced once the apiserver has loaded it
    while (refused := as_tenant(kubectl, "eddie", "create", "-f", "-", input=json.dumps(forged),
                                check=False)).returncode == 0:
        kubectl.run("delete", "serviceaccount", TRAINER, "-n", namespace)
        assert time.monotonic() < deadline, "the trainer-identity policy was never enforced"
        time.sleep(1)
    assert "finetunejob-trainer is the FineTuneJob trainer identity of this namespace" in refused.stderr
    assert "only the operator" in refused.stderr and "not eddie" in refused.stderr
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": TRAINER, "namespace": namespace}, "rules": []}
    own_labelled = {"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": "eddies", "namespace": namespace, "labels": labels}}
    for how, doc in {"unlabelled": {**forged, "metadata": {"name": TRAINER, "namespace": namespace}},
                     "role": role, "label-on-another-name": own_labelled}.items():
        refused = as_tenant(kubectl, "eddie", "create", "-f", "-", input=json.dumps(doc), check=False)
        assert refused.returncode != 0 and "only the operator" in refused.stderr, (how, refused.stderr)
    as_tenant(kubectl, "eddie", "create", "serviceaccount", "eddies", "-n", namespace)  # any other: theirs
    refused = as_tenant(kubectl, "eddie", "label", "serviceaccount", "eddies", "-n", namespace,
                        f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}", check=False)
    assert refused.returncode != 0 and "marks the FineTuneJob operator's own objects" in refused.stderr

    # Taken before the policy (a cluster admin here): never adopted, and the way out works.
    kubectl.run("create", "serviceaccount", TRAINER, "-n", namespace)
    kubectl.run("create", "serviceaccount", "ci-bot", "-n", namespace)
    for name, account in (("taken", None), ("own-identity", "ci-bot")):
        overrides = {"metadata.name": name, "metadata.namespace": namespace, "spec.distributed.gpusPerNode": 0,
                     "spec.training.precision": "fp32"}
        if account:
            overrides["spec.pod.serviceAccountName"] = account
        kubectl.run("apply", "-f", "-", input=json.dumps(make_job(overrides)))
    st = wait_status(kubectl, namespace, "taken", lambda s: s.get("reason") == "NameConflict", operator)
    assert f"ServiceAccount {TRAINER} exists and is not this job's" in st["message"], st["message"]
    assert "delete that object" in st["message"] and "spec.pod.serviceAccountName" in st["message"]
    assert "under another name" not in st["message"]  # another job name would meet the same ServiceAccount
    assert "attempt 1 created" not in json.dumps(st)
    created = next(cd for cd in st["conditions"] if cd["type"] == "Created")
    assert (created["status"], created["reason"]) == ("False", "NameConflict")
    assert not kubectl.json("get", "jobs", "-n", namespace, "-l", f"{c.LABEL_JOB}=taken")["items"]
    said = wait_events(kubectl, namespace, name="taken", kind=c.KIND, reason="NameConflict", op=operator)
    assert [e["type"] for e in said] == ["Warning"]
    # No Normal Created for what was not created (the pass that planned it posts it only once it has happened; it
    # would have come before the Warning).
    assert not events_of(kubectl, namespace, name="taken", kind=c.KIND, reason="Created")
    wait_status(kubectl, namespace, "own-identity", lambda s: s.get("phase") == "Running", operator)
    kubectl.run("delete", "serviceaccount", TRAINER, "-n", namespace)
    wait_status(kubectl, namespace, "taken", lambda s: s.get("phase") == "Running", operator, timeout=60)
    account = kubectl.json("get", "serviceaccount", TRAINER, "-n", namespace)
    assert account["metadata"]["labels"][c.LABEL_MANAGED_BY] == c.MANAGED_BY  # the operator's own now
