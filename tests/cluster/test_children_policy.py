"""Nobody but the operator makes an object look like a FineTuneJob's child, on the real apiserver with the chart's
children policy: an ownerReference to a FineTuneJob is refused to a namespace's edit and admin users on every write
path (create, replace, merge, JSON and strategic merge patch, client- and server-side apply), and the
finetunejob.dev/ labels of a pod to anyone but the Job controller. What stays allowed is shown beside each: the
operator's own children, other owners, a tenant's annotation on a child."""

import json
import re
import time

import pytest

from finetune_operator.api import constants as c
from tests.builders import make_job
from tests.cluster.test_tenancy import (  # noqa: F401 (user_roles: a fixture)
    FTJ,
    as_tenant,
    bind,
    chart_objects,
    delete_all,
    user_roles,
    wait_can,
)

ROLES = {"edit": "eddie", "admin": "ann"}
pytestmark = pytest.mark.usefixtures("user_roles")  # the chart's roles, aggregated into edit and admin


@pytest.fixture(scope="module")
def children_policy(control_plane, kubectl):
    docs = chart_objects(control_plane, kubectl, "admission-policy-children.yaml")
    yield docs
    delete_all(kubectl, docs)


def operator_user(policy_docs) -> str:
    return re.search(r"system:serviceaccount:[^')]+", json.dumps(policy_docs))[0].rstrip("\\ ")


def victim(kubectl, namespace: str) -> dict:
    """A reference to a real FineTuneJob `victim` (no operator runs here: it just exists, so the garbage collector
    keeps what it owns)."""
    kubectl.run("create", "-f", "-", input=json.dumps(make_job({"metadata.name": "victim",
                                                                "metadata.namespace": namespace})))
    return ftj_ref(kubectl.json("get", FTJ, "victim", "-n", namespace)["metadata"]["uid"])


def ftj_ref(uid: str) -> dict:
    return {"apiVersion": c.API_VERSION, "kind": c.KIND, "name": "victim", "uid": uid, "controller": True,
            "blockOwnerDeletion": True}


def config_map(name: str, namespace: str, owners: list | None = None) -> dict:
    meta = {"name": name, "namespace": namespace, **({"ownerReferences": owners} if owners else {})}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"trainer.json": "{}"}}


def batch_job(name: str, namespace: str, owners: list | None = None, labels: dict | None = None) -> dict:
    meta = {"name": name, "namespace": namespace, **({"ownerReferences": owners} if owners else {})}
    template = {"metadata": {"labels": labels or {}}, "spec": {"restartPolicy": "Never", "containers": [
        {"name": "main", "image": "busybox", "command": ["true"]}]}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {"suspend": True,
                                                                                "template": template}}


KINDS = {"ConfigMap": config_map, "Job": batch_job}


def enforced(kubectl, user, namespace, obj) -> None:
    """Waits until the apiserver has loaded the policy: a create it refuses."""
    deadline = time.monotonic() + 30
    while as_tenant(kubectl, user, "create", "-f", "-", input=json.dumps(obj), check=False).returncode == 0:
        kubectl.run("delete", obj["kind"], obj["metadata"]["name"], "-n", obj["metadata"]["namespace"], check=False)
        assert time.monotonic() < deadline, "the children policy was never enforced"
        time.sleep(1)


def owners(kubectl, kind, name, namespace) -> list:
    return kubectl.json("get", kind, name, "-n", namespace)["metadata"].get("ownerReferences") or []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("role", ROLES)
def test_an_owner_reference_to_a_finetunejob_is_the_operators_alone_on_every_write_path(
        kubectl, children_policy, namespace, role, kind):
    user, build = ROLES[role], KINDS[kind]
    bind(kubectl, namespace, user, role)
    wait_can(kubectl, user, namespace, "create", "jobs.batch")
    ref = victim(kubectl, namespace)
    enforced(kubectl, user, namespace, build("probe", namespace, [ref]))
    creates = {
        "create": ("create", "-f", "-"),
        "server-side apply": ("apply", "--server-side", "-f", "-"),
        "client-side apply": ("apply", "-f", "-"),
    }
    for how, args in creates.items():
        refused = as_tenant(kubectl, user, *args, input=json.dumps(build(f"made-{len(how)}", namespace, [ref])),
                            check=False)
        assert refused.returncode != 0 and "only the FineTuneJob operator" in refused.stderr, (how, refused.stderr)
        assert user in refused.stderr and "metadata.ownerReferences" in refused.stderr
    # The tenant's own object, then each way of adding the reference to it.
    as_tenant(kubectl, user, "create", "-f", "-", input=json.dumps(build("mine", namespace)))
    stored = kubectl.json("get", kind, "mine", "-n", namespace)
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "holder", "uid": "5d3c0e1a-1111-4222-8333-944455556666"}
    updates = {
        # No resourceVersion: an unconditional update, so a controller's write to the object meanwhile (the Job
        # controller's, under load) is no 409 Conflict before the policy is asked.
        "replace": (("replace", "-f", "-"), stored | {"metadata": {
            **{k: v for k, v in stored["metadata"].items() if k != "resourceVersion"}, "ownerReferences": [ref]}}),
        "merge patch": (("patch", kind, "mine", "--type=merge", "-p",
                         json.dumps({"metadata": {"ownerReferences": [ref]}})), None),
        "JSON patch": (("patch", kind, "mine", "--type=json", "-p",
                        json.dumps([{"op": "add", "path": "/metadata/ownerReferences", "value": [ref]}])), None),
        "strategic merge patch": (("patch", kind, "mine", "--type=strategic", "-p",
                                   json.dumps({"metadata": {"ownerReferences": [ref]}})), None),
        "server-side apply": (("apply", "--server-side", "--force-conflicts", "-f", "-"),
                              build("mine", namespace, [ref])),
        "client-side apply": (("apply", "-f", "-"), build("mine", namespace, [ref])),
        "beside another owner": (("patch", kind, "mine", "--type=merge", "-p",
                                  json.dumps({"metadata": {"ownerReferences": [other, ref]}})), None),
        "another version of the API": (("patch", kind, "mine", "--type=merge", "-p", json.dumps(
            {"metadata": {"ownerReferences": [{**ref, "apiVersion": f"{c.GROUP}/v1"}]}})), None),
        "the kind under another group": (("patch", kind, "mine", "--type=merge", "-p", json.dumps(
            {"metadata": {"ownerReferences": [{**ref, "apiVersion": "evil.example/v1"}]}})), None),
    }
    for how, (args, body) in updates.items():
        n = "-n", namespace
        refused = as_tenant(kubectl, user, *args, *n, input=json.dumps(body) if body else None, check=False)
        assert refused.returncode != 0 and "only the FineTuneJob operator" in refused.stderr, (how, refused.stderr)
    assert all(r["kind"] != c.KIND for r in owners(kubectl, kind, "mine", namespace))
    # The job's UID under another kind first (not a FineTuneJob's, admitted), then that reference rewritten.
    disguised = {**ref, "apiVersion": "example.invalid/v1", "kind": "Disguise"}
    as_tenant(kubectl, user, "create", "-f", "-", input=json.dumps(build("disguised", namespace, [disguised])))
    for field, value in (("kind", c.KIND), ("apiVersion", c.API_VERSION)):
        refused = as_tenant(kubectl, user, "patch", kind, "disguised", "-n", namespace, "--type=json", "-p",
                            json.dumps([{"op": "replace", "path": f"/metadata/ownerReferences/0/{field}",
                                         "value": value}]), check=False)
        assert refused.returncode != 0 and "only the FineTuneJob operator" in refused.stderr, (field, refused.stderr)
    if kind == "Job":  # a Job of her own whose pods the Job controller would label as the job's
        for name, labelled in (("pods-labelled", batch_job("pods-labelled", namespace, labels={c.LABEL_JOB: "victim"})),
                               ("cron", {"apiVersion": "batch/v1", "kind": "CronJob",
                                         "metadata": {"name": "cron", "namespace": namespace},
                                         "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": batch_job(
                                             "x", namespace, labels={c.LABEL_ATTEMPT: "1"})["spec"]}}})):
            refused = as_tenant(kubectl, user, "create", "-f", "-", input=json.dumps(labelled), check=False)
            assert refused.returncode != 0 and "finetunejob.dev/ labels" in refused.stderr, (name, refused.stderr)

    # Allowed beside it: another owner, the operator's own child, and the tenant annotating that child.
    as_tenant(kubectl, user, "patch", kind, "mine", "-n", namespace, "--type=merge", "-p",
              json.dumps({"metadata": {"ownerReferences": [other]}}))
    operator = operator_user(children_policy)
    kubectl.run("create", "rolebinding", "operator-edit", "--clusterrole=edit", f"--user={operator}", "-n", namespace)
    wait_can(kubectl, operator, namespace, "create", "jobs.batch")
    child = build("victim-child", namespace, [ref], **({"labels": {c.LABEL_JOB: "victim"}} if kind == "Job" else {}))
    as_tenant(kubectl, operator, "create", "-f", "-", input=json.dumps(child))
    as_tenant(kubectl, user, "annotate", kind, "victim-child", "-n", namespace, "team=a")
    assert owners(kubectl, kind, "victim-child", namespace)[0]["uid"] == ref["uid"]
    if kind == "Job":  # another controller (Kueue) edits the operator's suspended Job's pod template: admitted
        as_tenant(kubectl, user, "patch", "job", "victim-child", "-n", namespace, "--type=merge", "-p", json.dumps(
            {"spec": {"template": {"spec": {"nodeSelector": {"pool": "a"}}}}}))


def _pod(name: str, namespace: str, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                            "labels": labels or {}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}


@pytest.mark.parametrize("role", ROLES)
def test_a_pods_finetunejob_labels_are_set_by_the_job_controller_alone(kubectl, children_policy,
                                                                     namespace, role):
    """A pod labelled as attempt 1 of `victim` would hold back its restarts or fail it with a forged reason (the
    operator also checks each pod's controller, test_children_ownership.py). The pods the Job controller makes
    from the operator's Job carry the labels, and a tenant may neither change nor remove them."""
    user = ROLES[role]
    bind(kubectl, namespace, user, role)
    wait_can(kubectl, user, namespace, "create", "pods")
    ours = {c.LABEL_JOB: "victim", c.LABEL_ATTEMPT: "1"}
    enforced(kubectl, user, namespace, _pod("probe", namespace, ours))
    refused = as_tenant(kubectl, user, "create", "-f", "-", input=json.dumps(_pod("lookalike", namespace, ours)),
                        check=False)
    assert refused.returncode != 0 and "may not set, change or remove them" in refused.stderr, refused.stderr
    as_tenant(kubectl, user, "create", "-f", "-", input=json.dumps(_pod("mine", namespace, {"team": "a"})))
    for args in (("label", "pod", "mine", f"{c.LABEL_JOB}=victim"),
                 ("patch", "pod", "mine", "--type=merge", "-p",
                  json.dumps({"metadata": {"labels": {c.LABEL_ATTEMPT: "1"}}})),
                 ("patch", "pod", "mine", "--type=json", "-p", json.dumps(
                     [{"op": "add", "path": f"/metadata/labels/{c.LABEL_JOB.replace('/', '~1')}", "value": "v"}]))):
        refused = as_tenant(kubectl, user, *args, "-n", namespace, check=False)
        assert refused.returncode != 0 and "finetunejob.dev/ labels" in refused.stderr, (args, refused.stderr)

    # The operator's Job (impersonated): the Job controller creates its pod with the labels.
    operator = operator_user(children_policy)
    kubectl.run("create", "rolebinding", "operator-edit", "--clusterrole=edit", f"--user={operator}", "-n", namespace)
    wait_can(kubectl, operator, namespace, "create", "jobs.batch")
    attempt = batch_job("victim-a1", namespace, [victim(kubectl, namespace)], labels=ours)
    attempt["spec"]["suspend"] = False
    as_tenant(kubectl, operator, "create", "-f", "-", input=json.dumps(attempt))
    deadline = time.monotonic() + 60
    while not (pods := kubectl.json("get", "pods", "-n", namespace, "-l", "job-name=victim-a1")["items"]):
        assert time.monotonic() < deadline, kubectl.run("describe", "job", "victim-a1", "-n", namespace).stdout
        time.sleep(0.5)
    name = pods[0]["metadata"]["name"]
    assert pods[0]["metadata"]["labels"][c.LABEL_JOB] == "victim"
    for args in (("label", "pod", name, f"{c.LABEL_ATTEMPT}-"),
                 ("label", "pod", name, "--overwrite", f"{c.LABEL_ATTEMPT}=2")):
        refused = as_tenant(kubectl, user, *args, "-n", namespace, check=False)
        assert refused.returncode != 0 and "finetunejob.dev/ labels" in refused.stderr, (args, refused.stderr)
    as_tenant(kubectl, user, "label", "pod", name, "team=a", "-n", namespace)  # a label of their own: allowed
    assert kubectl.json("get", "pod", name, "-n", namespace)["metadata"]["labels"][c.LABEL_ATTEMPT] == "1"
