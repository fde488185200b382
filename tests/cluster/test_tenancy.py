"""Many teams on one cluster, tested as the tenants themselves (`kubectl --as`), on the real apiserver with the
clusterrole-aggregation controller running: the chart's user roles reach the built-in admin, edit and view roles,
and a FineTuneJob never adopts, rewrites or deletes an object it did not create (a name clash is a waiting reason
and one Event, nothing is written)."""

import json
import re
import subprocess
import time

import pytest
import yaml

from finetune_operator.api import constants as c
from tests.builders import make_job
from tests.conftest import ROOT
from tests.support.job_status import wait_status

CHART = ROOT / "charts" / "finetunejob"
FTJ = f"{c.PLURAL}.{c.GROUP}"


def chart_objects(control_plane, kubectl, template: str):
    """Applies one template of the chart, exactly as `helm install` renders it; returns its objects."""
    rendered = subprocess.run([str(control_plane.bin_dir / "helm"), "template", "ftj", str(CHART),
                               "--kube-version", "1.36.0", "--show-only", f"templates/{template}"],
                              capture_output=True, text=True, check=True, timeout=120).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kubectl.run("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    return docs


def delete_all(kubectl, docs):
    for doc in docs:
        kubectl.run("delete", doc["kind"], doc["metadata"]["name"], "--ignore-not-found", check=False)


@pytest.fixture(scope="module")
def user_roles(control_plane, kubectl):
    """The chart's user ClusterRoles."""
    docs = chart_objects(control_plane, kubectl, "user-roles.yaml")
    yield [d["metadata"]["name"] for d in docs]
    delete_all(kubectl, docs)


@pytest.fixture(scope="module")
def identity_policy(control_plane, kubectl):
    """The chart's admission policy on the identity a FineTuneJob runs as."""
    docs = chart_objects(control_plane, kubectl, "admission-policy-identity.yaml")
    yield docs
    delete_all(kubectl, docs)


@pytest.fixture(scope="module")
def trainer_pods_policy(control_plane, kubectl):
    """The chart's admission policy on who may start what runs as the trainer identity."""
    docs = chart_objects(control_plane, kubectl, "admission-policy-trainer-pods.yaml")
    yield docs
    delete_all(kubectl, docs)


def bind(kubectl, namespace: str, user: str, role: str) -> None:
    kubectl.run("create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}", f"--user={user}",
                "-n", namespace)


def can(kubectl, user: str, namespace: str, *args: str) -> bool:
    return kubectl.run("auth", "can-i", *args, f"--as={user}", "-n", namespace, check=False).stdout.strip() == "yes"


def wait_can(kubectl, user: str, namespace: str, *args: str, timeout: float = 30) -> None:
    """The aggregation controller adds our rules to admin/edit/view shortly after the ClusterRoles appear."""
    deadline = time.monotonic() + timeout
    while not can(kubectl, user, namespace, *args):
        assert time.monotonic() < deadline, f"{user} never got {args} in {namespace}"
        time.sleep(0.5)


def as_tenant(kubectl, user: str, *args: str, input: str | None = None, check: bool = True):
    return kubectl.run(*args, f"--as={user}", input=input, check=check)


def events(kubectl, ns, name, reason):
    items = kubectl.json("get", "events", "-n", ns, "--field-selector",
                         f"involvedObject.kind=FineTuneJob,involvedObject.name={name},reason={reason}")["items"]
    return items


def test_admin_edit_and_view_users_get_finetunejobs_and_never_write_their_status(kubectl, user_roles, namespace):
    bind(kubectl, namespace, "ann", "admin")
    bind(kubectl, namespace, "eddie", "edit")
    bind(kubectl, namespace, "vera", "view")
    wait_can(kubectl, "eddie", namespace, "create", FTJ)
    wait_can(kubectl, "vera", namespace, "list", FTJ)
    for user in ("ann", "eddie"):
        for verb in ("create", "get", "list", "watch", "patch", "update", "delete", "deletecollection"):
            assert can(kubectl, user, namespace, verb, FTJ), (user, verb)
        assert can(kubectl, user, namespace, "get", FTJ, "--subresource=status")
        assert not can(kubectl, user, namespace, "patch", FTJ, "--subresource=status"), user
        assert not can(kubectl, user, namespace, "update", FTJ, "--subresource=status"), user
    for verb in ("get", "list", "watch"):
        assert can(kubectl, "vera", namespace, verb, FTJ)
    for verb in ("create", "patch", "delete"):
        assert not can(kubectl, "vera", namespace, verb, FTJ), verb
    assert not can(kubectl, "eddie", "default", "list", FTJ)  # only where they were given edit

    # As the users themselves: eddie creates one, vera reads it and is refused a change.
    job = make_job({"metadata.name": "mine", "metadata.namespace": namespace})
    as_tenant(kubectl, "eddie", "apply", "-f", "-", input=json.dumps(job))
    assert "mine" in as_tenant(kubectl, "vera", "get", "ftj", "-n", namespace).stdout
    refused = as_tenant(kubectl, "vera", "delete", "ftj", "mine", "-n", namespace, check=False)
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower()
    forged = as_tenant(kubectl, "eddie", "patch", "ftj", "mine", "-n", namespace, "--subresource=status",
                       "--type=merge", "-p", '{"status": {"phase": "Succeeded"}}', check=False)
    assert forged.returncode != 0 and "forbidden" in forged.stderr.lower()


def test_a_name_clash_leaves_the_tenants_objects_untouched_and_says_so_once(kubectl, operator, user_roles,
                                                                           namespace):
    """A FineTuneJob `db` where the team already has a Service `db`, `web` where a ConfigMap `web-config` exists,
    `clash` where a Job `clash-a1` exists: none is adopted, changed or (with the job) deleted; nothing of the job
    is created; each job reads NameConflict naming the object, with one Warning Event."""
    bind(kubectl, namespace, "tenant", "edit")
    wait_can(kubectl, "tenant", namespace, "create", FTJ)
    mine = [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db", "namespace": namespace},
         "spec": {"selector": {"app": "db"}, "ports": [{"name": "pg", "port": 5432}]}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web-config", "namespace": namespace},
         "data": {"settings.ini": "[web]\nport = 80\n"}},
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "clash-a1", "namespace": namespace},
         "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
             {"name": "main", "image": "busybox", "command": ["true"]}]}}}},
    ]
    for obj in mine:
        as_tenant(kubectl, "tenant", "create", "-f", "-", input=json.dumps(obj))
    before = {o["metadata"]["name"]: _essence(kubectl.json("get", o["kind"], o["metadata"]["name"], "-n",
                                                           namespace)) for o in mine}
    clashes = {"db": "Service db", "web": "ConfigMap web-config", "clash": "Job clash-a1"}
    for name in clashes:
        job = make_job({"metadata.name": name, "metadata.namespace": namespace})
        as_tenant(kubectl, "tenant", "apply", "-f", "-", input=json.dumps(job))
    for name, what in clashes.items():
        st = wait_status(kubectl, namespace, name, lambda s: s.get("reason") == "NameConflict", operator)
        assert st["phase"] == "Pending" and f"{what} exists and is not this job's" in st["message"], st
        assert "never adopts or changes an object it did not create" in st["message"]
        assert len(st["message"]) < 1000, st["message"]  # readable, not an apiserver struct dump
        waiting = next(cd for cd in st["conditions"] if cd["type"] == "Waiting")
        assert (waiting["status"], waiting["reason"]) == ("True", "NameConflict")
    time.sleep(20)  # looked at again meanwhile: still one Event per job, and nothing of theirs written
    for name in clashes:
        said = events(kubectl, namespace, name, "NameConflict")
        assert len(said) == 1 and said[0]["type"] == "Warning" and said[0].get("count", 1) == 1, said
    after = {o["metadata"]["name"]: _essence(kubectl.json("get", o["kind"], o["metadata"]["name"], "-n",
                                                          namespace)) for o in mine}
    assert after == before
    # Nothing half-created: the jobs' other children (web's Service, db's ConfigMap, any attempt) do not exist.
    assert kubectl.run("get", "service", "web", "-n", namespace, check=False).returncode != 0
    assert kubectl.run("get", "configmap", "db-config", "-n", namespace, check=False).returncode != 0
    assert [j["metadata"]["name"] for j in kubectl.json("get", "jobs", "-n", namespace)["items"]] == ["clash-a1"]

    # Deleting the job leaves the tenant's object in place (it was never the job's to garbage-collect).
    as_tenant(kubectl, "tenant", "delete", "ftj", "web", "-n", namespace, "--wait=true")
    time.sleep(3)  # the garbage collector would have acted by now
    assert kubectl.json("get", "configmap", "web-config", "-n", namespace)["data"] == {
        "settings.ini": "[web]\nport = 80\n"}
    # Resolved by the tenant (the clashing Service renamed away): the job starts on its next look.
    as_tenant(kubectl, "tenant", "delete", "service", "db", "-n", namespace)
    st = wait_status(kubectl, namespace, "db", lambda s: s.get("reason") != "NameConflict", operator, timeout=45)
    service = kubectl.json("get", "service", "db", "-n", namespace)
    assert service["metadata"]["ownerReferences"][0]["kind"] == c.KIND, st


def test_a_job_labelled_as_an_attempt_by_someone_else_is_not_taken_for_one(kubectl, operator, user_roles,
                                                                           namespace):
    """A tenant's own Job carrying our labels (as if it were attempt 1 of `decoy`) is no attempt of decoy's: the
    operator creates decoy-a1 and runs it, and never touches the look-alike."""
    bind(kubectl, namespace, "tenant", "edit")
    wait_can(kubectl, "tenant", namespace, "create", FTJ)
    lookalike = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": "lookalike", "namespace": namespace, "labels": {c.LABEL_JOB: "decoy", c.LABEL_ATTEMPT: "1"}},
        "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "main", "image": "busybox", "command": ["true"]}]}}}}
    as_tenant(kubectl, "tenant", "create", "-f", "-", input=json.dumps(lookalike))
    before = _essence(kubectl.json("get", "job", "lookalike", "-n", namespace))
    as_tenant(kubectl, "tenant", "apply", "-f", "-",
              input=json.dumps(make_job({"metadata.name": "decoy", "metadata.namespace": namespace})))
    st = wait_status(kubectl, namespace, "decoy", lambda s: s.get("attempt") == 1 and s.get("phase") == "Running",
                     operator, timeout=60)
    attempt = kubectl.json("get", "job", "decoy-a1", "-n", namespace)
    assert attempt["metadata"]["ownerReferences"][0]["name"] == "decoy", st
    assert _essence(kubectl.json("get", "job", "lookalike", "-n", namespace)) == before


def _essence(obj: dict) -> dict:
    """What a clash could have changed: spec/data, labels, annotations and owners."""
    meta = obj["metadata"]
    return {"spec": obj.get("spec"), "data": obj.get("data"), "labels": meta.get("labels"),
            "annotations": {k: v for k, v in (meta.get("annotations") or {}).items()
                            if k != "kubectl.kubernetes.io/last-applied-configuration"},
            "owners": meta.get("ownerReferences"), "uid": meta["uid"]}


def test_a_user_who_may_not_create_pods_cannot_run_a_job_as_another_service_account(kubectl, user_roles,
                                                                                    identity_policy, namespace):
    """A user allowed FineTuneJobs but not pods names a ServiceAccount bound to `edit`: refused at apply, with the
    field and the way out; the same job without it is admitted (it runs as the trainer identity); a user with
    `edit` (who may create pods, so could run as that ServiceAccount directly) may name it."""
    kubectl.run("create", "serviceaccount", "deployer", "-n", namespace)
    kubectl.run("create", "rolebinding", "deployer-edit", "--clusterrole=edit",
                f"--serviceaccount={namespace}:deployer", "-n", namespace)
    kubectl.run("create", "role", "ftj-only", "--verb=create,get,list,update,patch", f"--resource={FTJ}",
                "-n", namespace)
    kubectl.run("create", "rolebinding", "ftj-only", "--role=ftj-only", "--user=fiona", "-n", namespace)
    bind(kubectl, namespace, "eddie", "edit")
    wait_can(kubectl, "eddie", namespace, "create", FTJ)
    assert not can(kubectl, "fiona", namespace, "create", "pods")
    sneaky = make_job({"metadata.name": "sneaky", "metadata.namespace": namespace,
                       "spec.pod": {"serviceAccountName": "deployer", "image": "busybox"}})
    deadline = time.monotonic() + 30  # the policy is enforced once the apiserver has loaded it
    while (refused := as_tenant(kubectl, "fiona", "apply", "-f", "-", input=json.dumps(sneaky),
                                check=False)).returncode == 0:
        kubectl.run("delete", "ftj", "sneaky", "-n", namespace)
        assert time.monotonic() < deadline, "the identity policy was never enforced"
        time.sleep(1)
    assert "spec.pod.serviceAccountName: deployer" in refused.stderr
    assert "needs the right to create pods in " + namespace in refused.stderr
    plain = make_job({"metadata.name": "plain", "metadata.namespace": namespace, "spec.pod": {"image": "busybox"}})
    as_tenant(kubectl, "fiona", "apply", "-f", "-", input=json.dumps(plain))
    # Nor by an edit afterwards.
    edited = as_tenant(kubectl, "fiona", "patch", "ftj", "plain", "-n", namespace, "--type=merge", "-p",
                       '{"spec": {"pod": {"serviceAccountName": "deployer"}}}', check=False)
    assert edited.returncode != 0 and "needs the right to create pods" in edited.stderr
    # Someone who may create pods may name it.
    sneaky["metadata"]["name"] = "allowed"
    as_tenant(kubectl, "eddie", "apply", "-f", "-", input=json.dumps(sneaky))


def _pod(name: str, namespace: str, **spec) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}], **spec}}


def _job(name: str, namespace: str, **spec) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}],
                                           **spec}}}}


def test_a_tenant_who_may_create_pods_cannot_start_one_as_another_jobs_trainer(kubectl, user_roles,
                                                                               trainer_pods_policy, namespace):
    """The trainer-status policy reads which job a trainer token belongs to from its pod's name. A user with `edit`
    (who may create pods and Jobs) starts a pod named like job victim's pod under the trainer identity, to forge
    victim's progress: refused, as is every other way to run as that identity (the deprecated serviceAccount field,
    an ownerReference to victim's attempt, a Job or CronJob of their own). The operator's Jobs still get their pods,
    created by the Job controller."""
    kubectl.run("create", "serviceaccount", "finetunejob-trainer", "-n", namespace)
    bind(kubectl, namespace, "eddie", "edit")
    wait_can(kubectl, "eddie", namespace, "create", "pods")
    trainer = {"serviceAccountName": "finetunejob-trainer"}
    forged = _pod("victim-a1-0-x7k2p", namespace, **trainer)
    deadline = time.monotonic() + 30  # the policy is enforced once the apiserver has loaded it
    while (refused := as_tenant(kubectl, "eddie", "create", "-f", "-", input=json.dumps(forged),
                                check=False)).returncode == 0:
        kubectl.run("delete", "pod", forged["metadata"]["name"], "-n", namespace, "--grace-period=0", "--force")
        assert time.monotonic() < deadline, "the trainer-pods policy was never enforced"
        time.sleep(1)
    assert "only the pods of a FineTuneJob run as the trainer identity" in refused.stderr, refused.stderr
    assert "eddie may not start one" in refused.stderr

    # The operator (impersonated here, with a Role of its own) creates victim's attempt; the Job controller its pod.
    creators = trainer_pods_policy[0]["spec"]["validations"][1]["expression"]
    operator = re.search(r"system:serviceaccount:[^']+", creators)[0]
    kubectl.run("create", "rolebinding", "operator-edit", "--clusterrole=edit", f"--user={operator}", "-n", namespace)
    wait_can(kubectl, operator, namespace, "create", "jobs.batch")
    attempt = _job("victim-a1", namespace, **trainer)
    as_tenant(kubectl, operator, "create", "-f", "-", input=json.dumps(attempt))
    deadline = time.monotonic() + 30
    while not (pods := kubectl.json("get", "pods", "-n", namespace, "-l", "job-name=victim-a1")["items"]):
        assert time.monotonic() < deadline, kubectl.run("describe", "job", "victim-a1", "-n", namespace).stdout
        time.sleep(0.5)
    assert pods[0]["spec"]["serviceAccountName"] == "finetunejob-trainer"
    job_uid = kubectl.json("get", "job", "victim-a1", "-n", namespace)["metadata"]["uid"]

    owned = {"apiVersion": "batch/v1", "kind": "Job", "name": "victim-a1", "uid": job_uid, "controller": True}
    attempts = {
        "deprecated-field": _pod("victim-a1-0-aaaaa", namespace, serviceAccount="finetunejob-trainer"),
        "owner-reference": {**_pod("victim-a1-0-bbbbb", namespace, **trainer),
                            "metadata": {"name": "victim-a1-0-bbbbb", "namespace": namespace,
                                         "ownerReferences": [owned]}},
        "job": _job("victim-a2", namespace, **trainer),
        "cronjob": {"apiVersion": "batch/v1", "kind": "CronJob",
                    "metadata": {"name": "victim", "namespace": namespace},
                    "spec": {"schedule": "* * * * *",
                             "jobTemplate": {"spec": _job("x", namespace, **trainer)["spec"]}}},
    }
    for how, obj in attempts.items():
        refused = as_tenant(kubectl, "eddie", "create", "-f", "-", input=json.dumps(obj), check=False)
        assert refused.returncode != 0, how
        assert "trainer identity" in refused.stderr and "eddie" in refused.stderr, (how, refused.stderr)
    # Nothing else is in the way: eddie's own pods and Jobs under any other identity.
    as_tenant(kubectl, "eddie", "create", "-f", "-", input=json.dumps(_pod("victim-a1-0-ccccc", namespace)))
    as_tenant(kubectl, "eddie", "create", "-f", "-", input=json.dumps(_job("mine", namespace)))


@pytest.mark.parametrize("field", [
    {"spec.pod.imagePullSecrets": ["team-b/registry"]},
    {"spec.pod.volumes": [{"name": "data", "mountPath": "/data", "claimName": "team-b/datasets"}]},
    {"spec.pod.volumes": [{"name": "cfg", "mountPath": "/cfg", "configMap": "../team-b"}]},
    {"spec.pod.volumes": [{"name": "key", "mountPath": "/key", "secret": "team-b/token"}]},
], ids=["pull-secret", "claim", "config-map", "secret"])
def test_another_namespaces_object_is_refused_at_apply_as_the_operator_would(kubectl, user_roles, namespace, field):
    """The same rule at `kubectl apply` as in the operator: a reference into another namespace never gets as far as
    a job that sits in the cluster failing validation."""
    from finetune_operator.api.errors import InvalidSpec
    from finetune_operator.api.validation import validate_job

    bind(kubectl, namespace, "tenant", "edit")
    wait_can(kubectl, "tenant", namespace, "create", FTJ)
    job = make_job({"metadata.name": "reach", "metadata.namespace": namespace, **field})
    with pytest.raises(InvalidSpec):
        validate_job(job)
    refused = as_tenant(kubectl, "tenant", "apply", "-f", "-", input=json.dumps(job), check=False)
    assert refused.returncode != 0 and "should match" in refused.stderr, refused.stderr


def test_a_pod_that_only_carries_a_jobs_labels_neither_holds_its_restart_nor_says_why_it_failed(
        kubectl, operator, user_roles, namespace):
    """Without the chart's children policy a tenant may label a pod of hers as a job's. The operator takes only the
    pods their attempt's Job controls: `held` restarts although a look-alike labelled as its pod never stops, and
    `forged` retries its attempt's failure although a look-alike labelled attempt 1 "exits" 65 with a DataError
    message of her choosing (permanent, not retried, were it believed)."""
    from tests.cluster.test_operator import running, status, submit, terminate, wait_for

    bind(kubectl, namespace, "tenant", "edit")
    wait_can(kubectl, "tenant", namespace, "create", "pods")
    for name in ("held", "forged"):
        submit(kubectl, namespace, name, **{"spec.runPolicy.backoffLimit": 3})
    for name, labels in (("held", {c.LABEL_JOB: "held"}), ("forged", {c.LABEL_JOB: "forged", c.LABEL_ATTEMPT: "1"})):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"decoy-{name}", "namespace": namespace,
                                                              "labels": labels},
               "spec": {"restartPolicy": "Never", "containers": [{"name": c.CONTAINER_NAME, "image": "busybox",
                                                                   "command": ["sleep", "infinity"]}]}}
        as_tenant(kubectl, "tenant", "create", "-f", "-", input=json.dumps(pod))
    held = running(kubectl, namespace, "held", operator)
    forged = running(kubectl, namespace, "forged", operator)
    terminate(kubectl, namespace, "decoy-forged", 65,
              message=json.dumps({"reason": "DataError", "message": "FORGED by tenant"}))
    for gang, name in ((held, "held"), (forged, "forged")):  # a pod of each job's own (labels select decoys too)
        terminate(kubectl, namespace, next(p["metadata"]["name"] for p in gang
                                           if p["metadata"]["name"].startswith(f"{name}-a1-")), 1)
    for name in ("held", "forged"):  # each restarts: attempt 2's Job exists, whatever the look-alikes do
        wait_for(lambda n=name: kubectl.json_or_none("get", "job", f"{n}-a2", "-n", namespace), 90,
                 f"{name}-a2 (status {status(kubectl, namespace, name)})", operator)
    st = status(kubectl, namespace, "forged")
    assert st.get("phase") != "Failed" and "FORGED" not in json.dumps(st), st
    assert kubectl.json("get", "pod", "decoy-held", "-n", namespace)["status"].get("phase") != "Succeeded"
